//! Copies between the memory of two devices of one driver, for
//! [`DeviceBuffer::copy_from_device`](super::DeviceBuffer::copy_from_device).
//!
//! Where the destination's device can reach the source's
//! (`cuDeviceCanAccessPeer`), peer access from it is enabled on first use
//! (as PyTorch does; enabling again costs one driver call that answers
//! "already enabled") and one `cuMemcpyPeerAsync` runs on the destination's
//! stream, asynchronous like a copy on one device. Memory of a pool or of
//! VMM mappings must also grant the destination's device access (the pool's
//! peers): peer access does not open it.
//!
//! Otherwise the bytes go through pinned host memory, one bounce buffer of up
//! to [`STAGE_CHUNK`] bytes: a stream of the source's device copies a chunk
//! out, the destination's stream copies it in, each waiting for the other
//! through events. The source side first waits for everything enqueued on the
//! destination's stream (what the caller ordered the copy after). The call
//! returns once both streams have run the copies, so that the bounce buffer
//! can go back; if a wait fails, the buffer is kept (leaked) rather than
//! freed under a copy.

use crate::device::Device;
use crate::driver::{DevicePtr, HostAllocFlags};
use crate::stream::Stream;
use crate::{Error, Result};

/// Most bytes staged through host memory at a time.
pub const STAGE_CHUNK: usize = 32 << 20;

/// Copies `bytes` from `src` (memory of `src_device`) to `dst` (memory of
/// `stream`'s device), ordered on `stream`.
pub(super) fn copy(
    dst: DevicePtr,
    src: DevicePtr,
    src_device: &Device,
    bytes: usize,
    stream: &Stream,
) -> Result<()> {
    let dst_device = stream.device();
    if !std::sync::Arc::ptr_eq(dst_device.driver(), src_device.driver()) {
        return Err(Error::InvalidArgument(
            "a copy between buffers of two different drivers".into(),
        ));
    }
    let driver = dst_device.driver();
    let (d, s) = (dst_device.ordinal(), src_device.ordinal());
    if driver.can_access_peer(d, s)? {
        driver.enable_peer_access(d, s)?;
        // SAFETY: `stream` is live while borrowed and this driver's (the
        // drivers are one, checked above); both ranges are device memory
        // owned by live buffers, which hand out no host references; each free
        // is ordered on its stream.
        return unsafe { driver.memcpy_peer_async(dst, d, src, s, bytes, stream.raw()) };
    }
    staged(dst, src, src_device, bytes, stream)
}

/// The copy through a pinned bounce buffer; returns once it has run.
#[cold]
fn staged(
    dst: DevicePtr,
    src: DevicePtr,
    src_device: &Device,
    bytes: usize,
    stream: &Stream,
) -> Result<()> {
    let driver = stream.device().driver();
    let side = src_device.create_stream()?;
    let chunk = bytes.min(STAGE_CHUNK);
    let flags = HostAllocFlags {
        portable: true,
        ..HostAllocFlags::default()
    };
    let host = driver.mem_alloc_host(src_device.ordinal(), chunk, flags)?;
    let copied = stage_through(host, chunk, (dst, stream), (src, &side), bytes);
    let waited = side.synchronize().and(stream.synchronize());
    match waited {
        Ok(()) => {
            // SAFETY: `host` was allocated above for this copy alone and is
            // freed once, here; the copies, the only users of it, ran on the
            // two streams just synchronized, and no reference into it exists.
            unsafe { driver.mem_free_host(host) }?;
            copied
        }
        Err(e) => {
            log::error!(
                "staged copy between devices: cannot wait for its copies ({e}); \
                 its {chunk}-byte pinned bounce buffer is kept rather than freed under them"
            );
            copied.and(Err(e))
        }
    }
}

/// Enqueues the chunks: out on `side`, in on `stream`, the buffer reused
/// only once the previous chunk is in.
fn stage_through(
    host: DevicePtr,
    chunk: usize,
    (dst, stream): (DevicePtr, &Stream),
    (src, side): (DevicePtr, &Stream),
    bytes: usize,
) -> Result<()> {
    let driver = stream.device().driver();
    side.wait_for(stream)?;
    let mut done = 0;
    while done < bytes {
        let n = chunk.min(bytes - done);
        // SAFETY: `side` and `stream` are live streams of this driver (one
        // driver, checked in `copy`); `host` is pinned memory of `chunk >= n`
        // bytes that this copy owns and frees only after both streams have
        // run (`staged`); the previous chunk's copy in ran before this one
        // (the wait below).
        unsafe { driver.memcpy_dtoh_async(host.as_mut_ptr(), src.offset(done), n, side.raw())? };
        stream.wait_for(side)?;
        // SAFETY: as above; the chunk's copy out ran before (the wait above).
        unsafe { driver.memcpy_htod_async(dst.offset(done), host.as_mut_ptr(), n, stream.raw())? };
        done += n;
        if done < bytes {
            side.wait_for(stream)?;
        }
    }
    Ok(())
}
