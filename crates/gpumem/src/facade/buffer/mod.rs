//! `DeviceBuffer<T>`: a typed, owned allocation from any memory resource,
//! returned to that resource on its stream when dropped (RAII).
//!
//! Element types are [`bytemuck::Pod`], so any bytes the device holds are a valid
//! `T` on the host. Copies that involve host memory come in two forms: safe ones
//! that enqueue on the buffer's stream and wait for it, and `unsafe` asynchronous
//! ones whose caller keeps the host memory alive until the stream reaches the
//! copy. A safe copy never returns, not even with an error, while its copy may
//! still use the caller's memory: a failed wait is retried, and if the stream
//! cannot be waited for at all the process aborts
//! ([`DeviceBuffer::copy_to_host`] says why). Device-to-device copies are
//! asynchronous and safe: they are ordered on the destination's stream like
//! any kernel. Between two devices they are peer copies where the devices
//! reach each other, else staged through pinned host memory, which waits for
//! the copy ([`across_devices`]).

pub mod across_devices;

use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use bytemuck::Pod;
use cudarc::driver::CudaStream;

use crate::driver::DevicePtr;
use crate::resource::{MemoryResource, SharedResource, DEFAULT_ALIGNMENT};
use crate::stream::Stream;
use crate::{Error, OomInfo, Result};

/// An owned array of `len` values of `T` in memory from resource `R`.
pub struct DeviceBuffer<T: Pod, R: MemoryResource = SharedResource> {
    /// `pub(crate)` for the cudarc kernel-argument impl, which pushes its address.
    pub(crate) ptr: DevicePtr,
    len: usize,
    resource: R,
    stream: Stream,
    /// The cudarc wrapper of `stream`, once cudarc asked for it
    /// ([`DeviceSlice::stream`](cudarc::driver::DeviceSlice::stream) lends
    /// it for as long as the buffer is borrowed).
    pub(crate) cudarc_stream: OnceLock<Arc<CudaStream>>,
    _marker: PhantomData<T>,
}

impl<T: Pod, R: MemoryResource> std::fmt::Debug for DeviceBuffer<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &format_args!("{:#x}", self.ptr.0))
            .field("len", &self.len)
            .field("stream", &self.stream)
            .finish()
    }
}

/// Waits tried before a copy of caller memory that cannot be waited for
/// aborts the process.
const WAIT_TRIES: u32 = 3;

/// The caller's memory would be returned while a copy may still use it, which
/// safe code must never see: end the process instead. The reason goes to the
/// log, or to stderr when no logger takes errors: the process is ending, so
/// it must not be lost.
#[cold]
fn abort_under_copy(e: &Error) -> ! {
    let why = format!(
        "cannot wait for a copy into or out of caller memory ({e}); the CUDA \
         context is broken and the copy may still run, so the process aborts rather \
         than hand the memory back"
    );
    if log::log_enabled!(log::Level::Error) {
        log::error!("{why}");
        log::logger().flush();
    } else {
        eprintln!("gpumem: {why}");
    }
    std::process::abort()
}

/// The buffer's copies and its free run on its stream, against memory of the
/// resource's device: a stream of another device, or of another driver
/// instance, would address that memory where it is not.
fn check_stream(resource: &impl MemoryResource, stream: &Stream) -> Result<()> {
    let (ours, theirs) = (resource.device(), stream.device());
    if theirs.same_as(ours) {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!(
        "a stream of device {}{} for memory of device {}: a buffer's stream must \
         belong to its resource's device",
        theirs.ordinal(),
        if Arc::ptr_eq(theirs.driver(), ours.driver()) {
            ""
        } else {
            " of another driver instance"
        },
        ours.ordinal()
    )))
}

fn alignment_of<T>() -> usize {
    DEFAULT_ALIGNMENT.max(std::mem::align_of::<T>())
}

fn bytes_for<T>(len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or_else(|| Error::oom_with(OomInfo::requested(usize::MAX)))
}

impl<T: Pod, R: MemoryResource> DeviceBuffer<T, R> {
    /// Allocates room for `len` values on `stream`; the contents are whatever the
    /// memory held (any bytes are a valid `T`). `stream` must be a stream of
    /// the resource's device ([`Error::InvalidArgument`] otherwise).
    pub fn new(len: usize, resource: R, stream: &Stream) -> Result<Self> {
        check_stream(&resource, stream)?;
        let bytes = bytes_for::<T>(len)?;
        let ptr = resource.allocate(bytes, alignment_of::<T>(), stream)?;
        Ok(Self {
            ptr,
            len,
            resource,
            stream: stream.clone(),
            cudarc_stream: OnceLock::new(),
            _marker: PhantomData,
        })
    }

    /// Allocates `len` values set to zero bytes (the memset is enqueued on `stream`).
    pub fn zeroed(len: usize, resource: R, stream: &Stream) -> Result<Self> {
        let buf = Self::new(len, resource, stream)?;
        buf.memset_async(0)?;
        Ok(buf)
    }

    /// Allocates a copy of `data`; waits for the copy.
    pub fn from_slice(data: &[T], resource: R, stream: &Stream) -> Result<Self> {
        let mut buf = Self::new(data.len(), resource, stream)?;
        buf.copy_from_host(data)?;
        Ok(buf)
    }

    /// Number of elements.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no elements.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    #[inline]
    pub fn size_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }

    /// The device address of the first element (null when empty), for interop.
    #[inline]
    pub fn as_device_ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The stream the buffer's work and its free are ordered on.
    #[inline]
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Orders the buffer's later work and its eventual free on `stream`
    /// instead. `stream` first waits for the work enqueued on the old stream
    /// so far (one event), so the free cannot overtake work that still uses
    /// the buffer there. A stream of another device, or a failed wait, is an
    /// error ([`Error::InvalidArgument`] or the driver's) and the buffer keeps
    /// its stream.
    pub fn set_stream(&mut self, stream: &Stream) -> Result<()> {
        check_stream(&self.resource, stream)?;
        if stream.id() != self.stream.id() {
            stream.wait_for(&self.stream)?;
        }
        self.stream = stream.clone();
        self.cudarc_stream = OnceLock::new();
        Ok(())
    }

    /// The resource the memory came from.
    #[inline]
    pub fn resource(&self) -> &R {
        &self.resource
    }

    fn check_len(&self, other: usize) -> Result<()> {
        if other == self.len {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "host slice has {other} elements, device buffer has {}",
                self.len
            )))
        }
    }

    /// Whether the resource lets its memory be used now (see
    /// [`MemoryResource::check_access`]).
    fn check_access(&self) -> Result<()> {
        self.resource.check_access(self.ptr, self.size_bytes())
    }

    /// Fills every byte with `value`, asynchronously on the buffer's stream.
    pub fn memset_async(&self, value: u8) -> Result<()> {
        if self.size_bytes() == 0 {
            return Ok(());
        }
        self.check_access()?;
        // SAFETY: the buffer's stream is live while the buffer holds it, and
        // passed to its own driver; the buffer owns this range while it lives;
        // no host code gets a reference to it, and its free is ordered after
        // this work.
        unsafe {
            self.stream.device().driver().memset_async(
                self.ptr,
                value,
                self.size_bytes(),
                self.stream.raw(),
            )
        }
    }

    /// Copies `src` to the device and waits for the copy. It never returns
    /// while the copy may still read `src`; see [`DeviceBuffer::copy_to_host`].
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        // SAFETY: `src` is borrowed until the copy has run: `wait_for_copy`
        // returns only then (or aborts the process).
        unsafe { self.copy_from_host_async(src)? };
        self.wait_for_copy()
    }

    /// Copies the buffer into `dst` and waits for the copy.
    ///
    /// It never returns while the copy may still write `dst`. If waiting
    /// fails, it waits again (the error may be an earlier failure reported
    /// late) and returns that first error once a wait succeeds. If every wait
    /// fails, the CUDA context is broken and nothing can say whether the copy
    /// will still run, so the process is aborted (with the reason logged, or on stderr)
    /// rather than give `dst` back to the caller under a copy.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        // SAFETY: `dst` is borrowed mutably until the copy has run:
        // `wait_for_copy` returns only then (or aborts the process).
        unsafe { self.copy_to_host_async(dst)? };
        self.wait_for_copy()
    }

    /// Waits for the copy into or out of caller memory just enqueued on the
    /// buffer's stream (see [`DeviceBuffer::copy_to_host`]).
    fn wait_for_copy(&self) -> Result<()> {
        let Err(first) = self.stream.synchronize() else {
            return Ok(());
        };
        for _ in 1..WAIT_TRIES {
            if self.stream.synchronize().is_ok() {
                return Err(first);
            }
        }
        abort_under_copy(&first)
    }

    /// Copies the buffer into a new vector.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); self.len];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    /// Enqueues a copy of `src` to the device on the buffer's stream.
    ///
    /// # Safety
    /// `src` must stay alive and unchanged until the stream has run the copy
    /// (synchronize the stream or an event recorded after it).
    pub unsafe fn copy_from_host_async(&mut self, src: &[T]) -> Result<()> {
        self.check_len(src.len())?;
        if self.size_bytes() == 0 {
            return Ok(());
        }
        self.check_access()?;
        let bytes: &[u8] = bytemuck::cast_slice(src);
        // SAFETY: forwarded to the caller (see above); the range is `bytes`.
        // The buffer's stream is live and passed to its own driver.
        unsafe {
            self.stream.device().driver().memcpy_htod_async(
                self.ptr,
                bytes.as_ptr(),
                bytes.len(),
                self.stream.raw(),
            )
        }
    }

    /// Enqueues a copy of the buffer into `dst` on the buffer's stream.
    ///
    /// # Safety
    /// `dst` must stay alive, and must be neither read nor written, until the
    /// stream has run the copy.
    pub unsafe fn copy_to_host_async(&self, dst: &mut [T]) -> Result<()> {
        self.check_len(dst.len())?;
        if self.size_bytes() == 0 {
            return Ok(());
        }
        self.check_access()?;
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
        // SAFETY: forwarded to the caller (see above); the range is `bytes`.
        // The buffer's stream is live and passed to its own driver.
        unsafe {
            self.stream.device().driver().memcpy_dtoh_async(
                bytes.as_mut_ptr(),
                self.ptr,
                bytes.len(),
                self.stream.raw(),
            )
        }
    }

    /// Enqueues a device-to-device copy from `src` on this buffer's stream. If
    /// `src` is written on another stream, order that work first (for example with
    /// [`Stream::wait_for`]).
    ///
    /// `src` may be memory of another device of the same driver: a peer copy
    /// where this buffer's device can reach it (peer access is enabled on
    /// first use; memory of a pool or of VMM mappings must grant this device
    /// access too), else staged through pinned host memory, which returns
    /// only once the copy has run (see [`across_devices`]).
    pub fn copy_from_device<R2: MemoryResource>(
        &mut self,
        src: &DeviceBuffer<T, R2>,
    ) -> Result<()> {
        self.check_len(src.len())?;
        if self.size_bytes() == 0 {
            return Ok(());
        }
        self.check_access()?;
        src.check_access()?;
        let src_device = src.resource.device();
        if !src_device.same_as(self.resource.device()) {
            return across_devices::copy(
                self.ptr,
                src.ptr,
                src_device,
                self.size_bytes(),
                &self.stream,
            );
        }
        // SAFETY: this buffer's stream is live and passed to its own driver;
        // both buffers own their ranges while they live and hand no host
        // references out; `src` is borrowed for the enqueue, and each free is
        // stream-ordered (ordering across streams is the caller's, as for any
        // kernel).
        unsafe {
            self.stream.device().driver().memcpy_dtod_async(
                self.ptr,
                src.ptr,
                self.size_bytes(),
                self.stream.raw(),
            )
        }
    }
}

impl<T: Pod, R: MemoryResource> Drop for DeviceBuffer<T, R> {
    fn drop(&mut self) {
        if crate::exit::process_is_exiting() {
            return; // the driver may be gone; the process is ending anyway
        }
        if let Err(e) = self.resource.deallocate(
            self.ptr,
            self.size_bytes(),
            alignment_of::<T>(),
            &self.stream,
        ) {
            // Drop cannot return the error; log it rather than lose it silently.
            log::error!("DeviceBuffer free of {:#x} failed: {e}", self.ptr.0);
        }
    }
}
