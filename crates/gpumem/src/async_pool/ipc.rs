//! Sharing a pool between processes: POSIX file descriptors for pools,
//! 64-byte records for allocations, and descriptor passing over Unix sockets.
//!
//! The exporting process builds its pool with [`HandleType::PosixFd`], exports
//! it once with [`MemPool::export_fd`] and each allocation to share with
//! [`MemPool::export_pointer`]. It sends the descriptor over a Unix socket
//! ([`send_fd`], `SCM_RIGHTS`; a descriptor is only meaningful inside its
//! process) and the records by any means. The importing process opens the
//! pool with [`AsyncResource::import_fd`], maps allocations with
//! [`ImportedPool::import_pointer`] and frees each mapping with
//! [`ImportedPool::free_pointer`]. An imported pool cannot allocate.
//!
//! Ordering (CUDA's rules): the importer must not touch the memory before the
//! exporter's allocation has completed on its stream (the exporter
//! synchronizes before sending), and must free its mapping, completed, before
//! the exporter frees the allocation.
//!
//! On the simulated device, export and import work within one process only
//! (the simulator lives in the process); across processes they need CUDA.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use super::async_resource::AsyncResource;
use super::attributes::MemPool;
use super::{map_not_supported, require_pools};
use crate::device::Device;
use crate::driver::{AccessFlags, DevicePtr, HandleType, Location, PoolPtrExport};
use crate::resource::Properties;
use crate::stream::Stream;
use crate::{Error, Result};

impl MemPool {
    fn require_exportable(&self, what: &str) -> Result<()> {
        if self.handle_type() == HandleType::PosixFd {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{what}: the pool was not created with HandleType::PosixFd (it has {:?})",
                self.handle_type()
            )))
        }
    }

    /// Exports the pool as a POSIX file descriptor
    /// (`cuMemPoolExportToShareableHandle`) for another process to import.
    /// Only pools built with [`HandleType::PosixFd`] can be exported.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        self.require_exportable("export_fd")?;
        let fd = self.device().driver().mempool_export_fd(self.raw())?;
        if fd < 0 {
            return Err(Error::InvalidArgument(format!(
                "cuMemPoolExportToShareableHandle returned descriptor {fd}"
            )));
        }
        // SAFETY: the driver contract (`Driver::mempool_export_fd`) hands the
        // caller a fresh, open descriptor that nothing else owns or closes; it
        // is non-negative (checked above), so `OwnedFd` may take it over.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The record that lets an importer of this pool map allocation `ptr`
    /// (`cuMemPoolExportPointer`). `ptr` must be a live allocation of this pool
    /// (the start of it, as allocate returned it).
    pub fn export_pointer(&self, ptr: DevicePtr) -> Result<PoolPtrExport> {
        self.require_exportable("export_pointer")?;
        if ptr.is_null() {
            return Err(Error::InvalidArgument(
                "export_pointer: null pointer (zero-byte allocations cannot be shared)".into(),
            ));
        }
        self.device().driver().mempool_export_pointer(ptr)
    }
}

impl AsyncResource {
    /// Opens a pool another process exported as a descriptor
    /// (`cuMemPoolImportFromShareableHandle`), on `device`. The descriptor is
    /// only read; the caller still owns it and may close it afterwards.
    pub fn import_fd(device: Device, fd: impl AsFd) -> Result<ImportedPool> {
        let info = require_pools(&device)?;
        let ordinal = device.ordinal();
        if !info.posix_fd_ipc {
            return Err(Error::unsupported(format!(
                "POSIX file descriptor IPC handles for memory pools on device {ordinal}"
            )));
        }
        let driver = device.driver();
        driver.set_current_device(ordinal)?;
        let raw = driver
            .mempool_import_fd(fd.as_fd().as_raw_fd())
            .map_err(|e| {
                map_not_supported(e, || {
                    format!("importing memory pools from descriptors on device {ordinal}")
                })
            })?;
        let pool = MemPool::new(
            device,
            raw,
            true,
            Location::Device(ordinal),
            HandleType::PosixFd,
            Properties::DEVICE,
            0,
        )
        .mark_imported();
        // The importing device needs read-write access to map allocations (as
        // CUDA's IPC sample does): grant it where the driver says it lacks it.
        if pool.access(ordinal)? != AccessFlags::ReadWrite {
            pool.grant_access(ordinal, AccessFlags::ReadWrite)?;
        }
        Ok(ImportedPool { pool })
    }
}

/// A pool opened from another process's descriptor. It maps that process's
/// exported allocations and cannot allocate itself. Its handle is released on
/// drop (the exporter's pool lives on).
#[derive(Debug)]
pub struct ImportedPool {
    pool: MemPool,
}

impl ImportedPool {
    /// Maps an allocation the exporter shared (`cuMemPoolImportPointer`). The
    /// returned address is this process's mapping; free it with
    /// [`ImportedPool::free_pointer`] before the exporter frees the allocation.
    pub fn import_pointer(&self, export: &PoolPtrExport) -> Result<DevicePtr> {
        self.pool
            .device()
            .driver()
            .mempool_import_pointer(self.pool.raw(), export)
    }

    /// Unmaps an imported allocation once the work enqueued on `stream` so far
    /// has run (`cuMemFreeAsync`; CUDA also allows `cuMemFree`). Synchronize
    /// `stream` before telling the exporter it may free the allocation.
    pub fn free_pointer(&self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        self.pool
            .device()
            .driver()
            .mem_free_async(ptr, stream.raw())
    }

    /// The imported pool (its attributes, as far as the driver reports them
    /// for imported pools).
    pub fn pool(&self) -> &MemPool {
        &self.pool
    }

    /// The device the pool was imported on.
    pub fn device(&self) -> &Device {
        self.pool.device()
    }
}

// ----- descriptor passing over Unix sockets -----

/// Room for one descriptor's control message, 8-byte aligned for `cmsghdr`.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

/// Sends `payload` (at least one byte) and one file descriptor over a
/// connected Unix stream socket (`sendmsg` with `SCM_RIGHTS`). The receiver
/// gets its own descriptor for the same open file; `fd` stays open here.
pub fn send_fd(socket: &UnixStream, fd: BorrowedFd<'_>, payload: &[u8]) -> io::Result<()> {
    if payload.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "send_fd needs at least one payload byte",
        ));
    }
    let fd_len = std::mem::size_of::<libc::c_int>() as libc::c_uint;
    // SAFETY: CMSG_SPACE and CMSG_LEN are pure arithmetic on their argument.
    let (space, len) = unsafe { (libc::CMSG_SPACE(fd_len), libc::CMSG_LEN(fd_len)) };
    let mut control = CmsgBuf([0; 64]);
    if space as usize > control.0.len() {
        return Err(io::Error::other("control message larger than its buffer"));
    }
    let mut iov = libc::iovec {
        iov_base: payload.as_ptr() as *mut libc::c_void,
        iov_len: payload.len(),
    };
    // SAFETY: msghdr is a plain C struct for which all-zero bytes are a valid
    // (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `control`, which is 8-byte aligned, zeroed and at
    // least CMSG_SPACE(sizeof(int)) bytes long (checked above), so
    // CMSG_FIRSTHDR returns a non-null header inside it and CMSG_DATA points
    // at room for one int within the same buffer.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return Err(io::Error::other("no room for the control message"));
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = len as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>(), fd.as_raw_fd());
    }
    // SAFETY: `msg`, `iov`, `payload` and `control` are valid for the call;
    // sendmsg only reads them. MSG_NOSIGNAL turns a closed peer into EPIPE
    // instead of a signal.
    let sent = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != payload.len() {
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
    if buf.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "recv_fd needs room for at least one payload byte",
        ));
    }
    let mut control = CmsgBuf([0; 64]);
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is a plain C struct for which all-zero bytes are valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.0.as_mut_ptr().cast();
    msg.msg_controllen = control.0.len() as _;
    // SAFETY: `msg` describes `buf` and `control`, both writable and alive for
    // the call; recvmsg writes at most their lengths.
    let got = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    // Take ownership of every descriptor that arrived before anything can
    // return, so none leaks.
    let mut fds: Vec<OwnedFd> = Vec::new();
    // SAFETY: recvmsg filled `control` and set msg_controllen; the CMSG_*
    // macros walk headers inside `control` only. Each SCM_RIGHTS payload is an
    // array of ints the kernel just installed in this process's descriptor
    // table, owned by nobody else, so `OwnedFd` may take each over.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg);
                let header = data.offset_from(cmsg.cast::<u8>()) as usize;
                let n = ((*cmsg).cmsg_len as usize).saturating_sub(header)
                    / std::mem::size_of::<libc::c_int>();
                for i in 0..n {
                    let fd = std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                    if fd >= 0 {
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other("control message truncated"));
    }
    if got == 0 && fds.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "peer closed the socket",
        ));
    }
    let mut fds = fds.into_iter();
    let fd = fds.next().ok_or_else(|| {
        io::Error::new(io::ErrorKind::InvalidData, "message carried no descriptor")
    })?;
    Ok((fd, got as usize))
}
