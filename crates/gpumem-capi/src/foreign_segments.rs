//! Segments from an allocator of the caller's: the upstream of a graph pool
//! made with [`crate::gpumem_graph_pool_retain_foreign`] (PyTorch's
//! `torch.cuda.MemPool(allocator)`, whose segments come from that
//! allocator's `raw_alloc` and go back through its `raw_delete`, for
//! memory such as `ncclMemAlloc`'s).
//!
//! The caller passes two C functions and a context pointer
//! ([`gpumem_segment_source_t`]); gpumem calls them for each segment the
//! pool makes and gives back, and calls `release` once with the context
//! when it needs neither any more: after the pool's last segment went
//! back. The native PyTorch allocator keeps the MemPool's allocator alive
//! with it (test_tensor_delete_after_allocator_delete deletes the
//! allocator before the tensor).
//!
//! A NULL from `alloc` is out of memory. Everything else about the pool
//! is a graph pool's: its blocks, statistics (the segments count as
//! reserved memory and driver calls), its share of the device's memory
//! limit, snapshots (its segments are allocated whole: not expandable).

use std::ffi::{c_int, c_void};

use gpumem::resource::{validate_request, MemoryResource, Properties, DEFAULT_ALIGNMENT};
use gpumem::{Device, DevicePtr, Error, OomInfo, Result, Stream};

use crate::{global, gpumem_stream_t, guard, status};

/// Allocates `size` bytes on device `device` for work ordered on `stream`
/// (`ctx` as given); NULL when it cannot. A NULL function is none.
#[allow(non_camel_case_types)]
pub type gpumem_segment_alloc_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        size: usize,
        device: c_int,
        stream: gpumem_stream_t,
    ) -> *mut c_void,
>;

/// Gives back `ptr`, a block of `size` bytes that `alloc` made on `device`,
/// freed on `stream`. A NULL function is none.
#[allow(non_camel_case_types)]
pub type gpumem_segment_free_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        ptr: *mut c_void,
        size: usize,
        device: c_int,
        stream: gpumem_stream_t,
    ),
>;

/// Lets go of `ctx`: gpumem calls neither function with it again. A NULL
/// function is none.
#[allow(non_camel_case_types)]
pub type gpumem_segment_release_fn = Option<unsafe extern "C" fn(ctx: *mut c_void)>;

/// Where a graph pool's segments come from, in C: the allocator of a
/// PyTorch `MemPool` made with one. `alloc` and `free` are required,
/// `release` may be NULL.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_camel_case_types)]
pub struct gpumem_segment_source_t {
    /// Makes a segment; NULL is out of memory. Its pointer must be aligned
    /// to 256 bytes (`cudaMalloc`'s are).
    pub alloc: gpumem_segment_alloc_fn,
    /// Gives a segment back.
    pub free: gpumem_segment_free_fn,
    /// Called once, with `ctx`, when gpumem needs neither function any
    /// more.
    pub release: gpumem_segment_release_fn,
    /// Passed to the three as it is.
    pub ctx: *mut c_void,
}

/// A [`gpumem_segment_source_t`] gpumem has taken over: `release(ctx)` runs
/// when it is dropped.
pub struct ForeignSource {
    alloc: AllocFn,
    free: FreeFn,
    release: gpumem_segment_release_fn,
    ctx: *mut c_void,
}

/// [`gpumem_segment_alloc_fn`], present.
type AllocFn = unsafe extern "C" fn(*mut c_void, usize, c_int, gpumem_stream_t) -> *mut c_void;
/// [`gpumem_segment_free_fn`], present.
type FreeFn = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int, gpumem_stream_t);

impl std::fmt::Debug for ForeignSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForeignSource")
            .field("ctx", &self.ctx)
            .finish()
    }
}

// SAFETY: `ForeignSource::new`'s contract: the functions may be called with
// `ctx` from any thread, at the same time, until `release` has run.
unsafe impl Send for ForeignSource {}
// SAFETY: as for `Send`: shared use only calls the functions.
unsafe impl Sync for ForeignSource {}

impl ForeignSource {
    /// Takes `source` over: from now on `release(ctx)` runs exactly once,
    /// when the value is dropped, or at once when `alloc` or `free` is
    /// missing (`Err` then says so).
    ///
    /// # Safety
    /// `alloc` and `free` must be callable with `ctx` from any thread, also
    /// at the same time, until `release` has run, and `release` once; none
    /// may unwind or call back into gpumem (they run under gpumem's locks).
    pub unsafe fn new(source: &gpumem_segment_source_t) -> std::result::Result<Self, String> {
        match (source.alloc, source.free) {
            (Some(alloc), Some(free)) => Ok(Self {
                alloc,
                free,
                release: source.release,
                ctx: source.ctx,
            }),
            _ => {
                if let Some(release) = source.release {
                    // SAFETY: the caller's promise; `ctx` is released once,
                    // here, and never used again.
                    unsafe { release(source.ctx) };
                }
                Err("a segment source needs both alloc and free".into())
            }
        }
    }
}

impl Drop for ForeignSource {
    fn drop(&mut self) {
        // At exit the caller's allocator may be gone before gpumem.
        if gpumem::exit::process_is_exiting() {
            return;
        }
        if let Some(release) = self.release.take() {
            // SAFETY: `new`'s contract; this is its one call.
            unsafe { release(self.ctx) };
        }
    }
}

/// The segments of one graph pool on `device`, from a [`ForeignSource`].
#[derive(Debug)]
pub struct ForeignSegments {
    device: Device,
    source: ForeignSource,
}

impl ForeignSegments {
    /// Segments on `device` from `source`.
    pub fn new(device: Device, source: ForeignSource) -> Self {
        Self { device, source }
    }

    fn ordinal(&self) -> c_int {
        self.device.ordinal() as c_int
    }
}

fn raw_stream(stream: &Stream) -> gpumem_stream_t {
    stream.raw() as usize as gpumem_stream_t
}

impl MemoryResource for ForeignSegments {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        let s = &self.source;
        // SAFETY: `ForeignSource::new`'s contract.
        let p = unsafe { (s.alloc)(s.ctx, bytes, self.ordinal(), raw_stream(stream)) };
        if p.is_null() {
            return Err(Error::oom_with(OomInfo {
                device: Some(self.device.ordinal()),
                ..OomInfo::requested(bytes)
            }));
        }
        if !(p as usize).is_multiple_of(alignment.max(DEFAULT_ALIGNMENT)) {
            // SAFETY: as above; `p` is the segment just made, given back.
            unsafe { (s.free)(s.ctx, p, bytes, self.ordinal(), raw_stream(stream)) };
            return Err(Error::InvalidArgument(format!(
                "the pool's allocator returned {p:?}, not aligned to {DEFAULT_ALIGNMENT} bytes"
            )));
        }
        Ok(DevicePtr(p as usize as u64))
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        gpumem::check_alignment(alignment)?;
        let s = &self.source;
        // SAFETY: `ForeignSource::new`'s contract; the pool gives back only
        // segments `alloc` made, each once.
        unsafe {
            (s.free)(
                s.ctx,
                ptr.as_mut_ptr(),
                bytes,
                self.ordinal(),
                raw_stream(stream),
            )
        };
        Ok(())
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn properties(&self) -> Properties {
        Properties::DEVICE
    }
}

/// Creates the graph pool `(id0, id1)` of `device` (PyTorch's
/// `createOrIncrefPool` with an allocator: `torch.cuda.MemPool(allocator)`)
/// with one use, as [`crate::gpumem_graph_pool_retain`] does, but its
/// segments come from `source`: `alloc(ctx, size, device, stream)` for each
/// new segment (a NULL is out of memory) and `free(ctx, ptr, size, device,
/// stream)` as each goes back (when the pool's cache is emptied, or the
/// pool goes). Everything else is a graph pool's as usual: its blocks,
/// statistics, share of the device's memory limit, snapshots.
///
/// From the call on, `source->ctx` is gpumem's until it calls
/// `source->release(ctx)` (if not NULL), exactly once: once the pool went
/// and its last segment with it, or at once when the call fails. The
/// functions may be called from any thread, under gpumem's locks: they must
/// not call gpumem. 0 on success; -1 (the reason in
/// [`crate::gpumem_last_error`]) when `source` is NULL or lacks `alloc` or
/// `free`, the pool exists already (its source is given when it is made),
/// or the device cannot be used.
///
/// # Safety
/// `source` is NULL or points to a readable [`gpumem_segment_source_t`]
/// whose functions keep the promises above.
#[no_mangle]
pub unsafe extern "C" fn gpumem_graph_pool_retain_foreign(
    device: c_int,
    id0: u64,
    id1: u64,
    source: *const gpumem_segment_source_t,
) -> c_int {
    guard("gpumem_graph_pool_retain_foreign", -1, || {
        // SAFETY: NULL or readable (the caller's promise).
        let Some(source) = (unsafe { source.as_ref() }) else {
            return status(Err("no segment source (NULL)".into()));
        };
        // SAFETY: the caller's promise, passed on.
        let source = match unsafe { ForeignSource::new(source) } {
            Ok(s) => s,
            Err(e) => return status(Err(e)),
        };
        status(global().graph_pool_retain_foreign(device, (id0, id1), source))
    })
}
