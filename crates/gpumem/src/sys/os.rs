//! Operating-system calls: the bottom layer beside [`crate::driver`], and
//! with it the only place the library calls the C library or the kernel.
//!
//! - Process hooks: [`at_exit`] (`atexit`, for [`crate::exit`]) and
//!   [`at_fork_child`] (`pthread_atfork`, for [`crate::fork`]). These two
//!   are the module's only `unsafe`.
//! - Descriptor passing over Unix sockets ([`send_fd`], [`recv_fd`]:
//!   `sendmsg`/`recvmsg` with `SCM_RIGHTS`, through `rustix`, which owns the
//!   control-message arithmetic), re-exported by
//!   [`crate::async_pool::ipc`].
//!
//! Descriptors are `std::os::fd` types throughout: a received descriptor is
//! an [`OwnedFd`] from the moment it exists, so no error path leaks one.
//! gpumem targets Linux (the simulated driver's IPC reads `/proc/self/fd`),
//! so these are Unix calls without fallbacks.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Runs `hook` when the process exits normally (`atexit`). False where the
/// C runtime refused it.
pub(crate) fn at_exit(hook: extern "C" fn()) -> bool {
    // SAFETY: `atexit` only stores the function pointer; `hook` is a plain
    // `extern "C" fn()` with no captured state, valid for the whole process.
    // Callers pass handlers that do not unwind.
    unsafe { libc::atexit(hook) == 0 }
}

/// Runs `hook` in the child after every `fork()` (`pthread_atfork`'s child
/// handler). The hook must be async-signal-safe. False where
/// `pthread_atfork` refused it.
pub(crate) fn at_fork_child(hook: extern "C" fn()) -> bool {
    // SAFETY: `pthread_atfork` only stores the function pointers; `hook` is a
    // plain `extern "C" fn()` without captured state, valid for the whole
    // process. Callers pass handlers that do not unwind.
    unsafe { libc::pthread_atfork(None, None, Some(hook)) == 0 }
}

/// Room for the control message of [`recv_fd`]: one descriptor needs 24
/// bytes; a sender that passes a few more is still read whole (the extra
/// descriptors are closed).
const RECV_CONTROL_BYTES: usize = 64;

/// Sends `payload` (at least one byte) and one file descriptor over a
/// connected Unix stream socket (`sendmsg` with `SCM_RIGHTS`). The receiver
/// gets its own descriptor for the same open file; `fd` stays open here.
pub fn send_fd(socket: &UnixStream, fd: BorrowedFd<'_>, payload: &[u8]) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::mem::MaybeUninit;

    if payload.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "send_fd needs at least one payload byte",
        ));
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("control message larger than its buffer"));
    }
    // MSG_NOSIGNAL turns a closed peer into EPIPE instead of a signal.
    let sent = rustix::net::sendmsg(
        socket,
        &[io::IoSlice::new(payload)],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    if sent != payload.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("sent {sent} of {} payload bytes", payload.len()),
        ));
    }
    Ok(())
}

/// Receives a message sent by [`send_fd`]: fills `buf` with up to
/// `buf.len()` payload bytes and returns the descriptor (owned by the caller,
/// close-on-exec) and the number of payload bytes.
pub fn recv_fd(socket: &UnixStream, buf: &mut [u8]) -> io::Result<(OwnedFd, usize)> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags};
    use std::mem::MaybeUninit;

    if buf.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "recv_fd needs room for at least one payload byte",
        ));
    }
    let mut space = [MaybeUninit::uninit(); RECV_CONTROL_BYTES];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = rustix::net::recvmsg(
        socket,
        &mut [io::IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    // Every descriptor that arrived is an `OwnedFd` here: the ones not
    // returned close when dropped.
    let mut fds: Vec<OwnedFd> = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = message {
            fds.extend(received);
        }
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) {
        return Err(io::Error::other("control message truncated"));
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "peer closed the socket",
        ));
    }
    let fd = fds.into_iter().next().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidData, "message carried no descriptor")
    })?;
    Ok((fd, msg.bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn extra_descriptors_are_read_and_closed() {
        use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
        use std::mem::MaybeUninit;

        let (a, b) = UnixStream::pair().unwrap();
        let (c, d) = UnixStream::pair().unwrap();
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        let fds = [c.as_fd(), d.as_fd()];
        assert!(control.push(SendAncillaryMessage::ScmRights(&fds)));
        rustix::net::sendmsg(
            &a,
            &[io::IoSlice::new(b"x")],
            &mut control,
            SendFlags::empty(),
        )
        .unwrap();
        let mut buf = [0u8; 4];
        let (fd, n) = recv_fd(&b, &mut buf).unwrap();
        assert_eq!((n, buf[0]), (1, b'x'));
        // The first descriptor is `c`'s socket: writing to it reaches `d`.
        let c2 = UnixStream::from(fd);
        send_fd(&c2, a.as_fd(), b"y").unwrap();
        let (_, n) = recv_fd(&d, &mut buf).unwrap();
        assert_eq!((n, buf[0]), (1, b'y'));
    }

    #[test]
    fn a_message_without_a_descriptor_is_refused() {
        use std::io::Write;
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(b"plain").unwrap();
        let mut buf = [0u8; 8];
        let err = recv_fd(&b, &mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }
}
