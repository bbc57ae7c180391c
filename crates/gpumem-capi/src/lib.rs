//! gpumem's C ABI: the functions PyTorch's `CUDAPluggableAllocator` and
//! CuPy's `CFunctionAllocator` call, and statistics, exported from
//! `libgpumem.so` (built by the `gpumem-cdylib` package next to this one)
//! and declared in `include/gpumem.h`.
//!
//! ```c
//! void*  gpumem_malloc(ssize_t size, int device, gpumem_stream_t stream);   // PyTorch
//! void   gpumem_free(void* ptr, ssize_t size, int device, gpumem_stream_t stream);
//! void*  gpumem_cupy_malloc(void* param, size_t size, int device);          // CuPy
//! void   gpumem_cupy_free(void* param, void* ptr, int device);
//! size_t gpumem_allocated_bytes(int device);        // and _peak_allocated_, _reserved_, _peak_reserved_
//! void   gpumem_reset_peak(int device);
//! void   gpumem_empty_cache(int device);
//! size_t gpumem_pool_empty_cache(int device, uint64_t id0, uint64_t id1);  // of one pool
//! uint64_t gpumem_bad_free_count(int device);       // frees refused (-1: all devices)
//! int    gpumem_configure(const char *conf);        // GPUMEM_CONF's syntax, before the first allocation
//! const char *gpumem_config_error(void);            // NULL when the configuration is valid
//! const char *gpumem_last_error(void);              // why this thread's last gpumem_malloc failed
//! int    gpumem_get_device_stats(int device, gpumem_device_stats_t *out);  // PyTorch's memory_stats
//! void   gpumem_reset_peak_stats(int device);
//! void   gpumem_reset_accumulated_stats(int device);
//! int    gpumem_set_memory_fraction(int device, double fraction);
//! double gpumem_get_memory_fraction(int device);
//! void   gpumem_record_stream(void *ptr, int device, gpumem_stream_t stream);
//! int    gpumem_snapshot(int device, gpumem_segment_t *segments, size_t max_segments, size_t *n_segments,
//!                        gpumem_block_t *blocks, size_t max_blocks, size_t *n_blocks);
//! int    gpumem_pool_snapshot(int device, uint64_t id0, uint64_t id1, ...);  // the same, of one pool
//! // CUDA graphs' private pools (PyTorch's MempoolId_t is the pair id0, id1):
//! int    gpumem_graph_pool_begin(int device, uint64_t id0, uint64_t id1);   // and _end, _retain, _release
//! void  *gpumem_graph_pool_malloc(size_t size, int device, uint64_t id0, uint64_t id1, gpumem_stream_t stream);
//! void   gpumem_graph_pool_free(void *ptr, size_t size, int device, uint64_t id0, uint64_t id1, gpumem_stream_t stream);
//! void   gpumem_graph_pool_hold(void *ptr, size_t size, int device, uint64_t id0, uint64_t id1, gpumem_stream_t stream);
//! int    gpumem_set_graph_capture_reuse(int enabled);  // graph_capture_record_stream_reuse
//! int    gpumem_graph_pool_use_count(int device, uint64_t id0, uint64_t id1);
//! int    gpumem_graph_pool_set_no_split(int device, uint64_t id0, uint64_t id1);  // MemPool options
//! int    gpumem_graph_pool_set_use_on_oom(int device, uint64_t id0, uint64_t id1, int on);
//! int    gpumem_graph_pool_retain_foreign(int device, uint64_t id0, uint64_t id1,
//!                                         const gpumem_segment_source_t *source);  // MemPool(allocator)
//! int    gpumem_graph_pool_live_blocks(int device, uint64_t id0, uint64_t id1, void **out, size_t max, size_t *n);
//! int    gpumem_graph_pool_block(void *ptr, int *device, uint64_t *id0, uint64_t *id1, size_t *requested, gpumem_stream_t *stream);
//! gpumem_checkpoint_t *gpumem_graph_pool_checkpoint(int device, uint64_t id0, uint64_t id1);  // graph trees
//! gpumem_restored_t *gpumem_graph_pool_restore(const gpumem_checkpoint_t *cp);  // and gpumem_restored_*
//! // Regions of a VirtualPool (resource=vpool): sleep and wake (see regions):
//! int    gpumem_region_begin(int device, uint32_t tag);  // and gpumem_region_end(device)
//! int    gpumem_sleep(int device, uint32_t tag, int backup);
//! int    gpumem_wake(int device, uint32_t tag);
//! size_t gpumem_sleeping_bytes(int device, uint32_t tag);
//! ```
//!
//! `gpumem_stream_t` is `void*`: pass a `cudaStream_t`/`CUstream` as it is
//! (0 is the legacy default stream).
//!
//! Behaviour:
//! - Configuration comes from `GPUMEM_CONF`, read once at the first call (see
//!   [`conf`]), or from [`gpumem_configure`] until the first allocation; the
//!   backend from `GPUMEM_DEVICE` (`cuda`, the default; `sim` for the
//!   simulated device, used by the tests; `auto`). An invalid configuration
//!   is reported and serves nothing (every allocation returns NULL);
//!   [`gpumem_config_error`] returns the reason.
//! - Out of memory is PyTorch's: the device's cached memory goes back and
//!   the allocation is retried once; then NULL, with the reason for
//!   [`gpumem_last_error`].
//! - Rust code linked into the same library shares the per-device stacks
//!   through [`device_resource`]: one pool per device for PyTorch, CuPy and
//!   Rust.
//! - Each device ordinal gets its own stack, built at its first allocation.
//! - Zero-byte requests return NULL, as `cudaMalloc` does; PyTorch and CuPy
//!   never dereference the pointer of an empty tensor or array, and freeing
//!   NULL does nothing.
//! - A failed allocation returns NULL and is reported on stderr; a negative
//!   size is a failed allocation. A bad free (a pointer gpumem did not hand
//!   out, a second free, a size other than the allocation's as precisely as
//!   the resource records it (to 256 bytes in the pools), a block of [`gpumem_cupy_malloc`] passed to
//!   [`gpumem_free`]) frees nothing,
//!   is counted ([`gpumem_bad_free_count`]) and reported (the first ten,
//!   then one line saying the rest are only counted).
//!   Nothing unwinds across the C boundary: every function catches panics.
//! - CuPy passes no stream: its memory is allocated and freed on the legacy
//!   default stream, which CuPy's default stream is (the Python helper
//!   `gpumem.cupy.enable(stream_aware=True)` passes CuPy's current stream
//!   through `gpumem_malloc`/`gpumem_free` instead).
//! - After the process has started to exit, frees are ignored (the memory
//!   goes with the process) and allocations return NULL.

#![warn(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

// The `extern "C"` functions below are the crate's `unsafe` (the FFI
// boundary), with one module behind them: `foreign_streams` wraps the stream
// handles C passes in, on the C contract that they stay valid.
#[deny(unsafe_code)]
pub mod allocator;
#[deny(unsafe_code)]
pub mod capture_reuse;
#[deny(unsafe_code)]
pub mod conf;
/// Graph pools whose segments come from the caller's allocator.
pub mod foreign_segments;
pub mod foreign_streams;
/// Saving and restoring a graph pool's layout (the C functions).
pub mod graph_checkpoints;
/// CUDA graphs' private pools.
pub mod graph_pools;
#[deny(unsafe_code)]
pub mod last_error;
// Its `extern "C"` functions carry `#[no_mangle]`, which `unsafe_code`
// counts; it has no `unsafe` block.
pub mod mempool_options;
// Its `extern "C"` functions carry `#[no_mangle]`, which `unsafe_code`
// counts; it has no `unsafe` block.
pub mod regions;
#[deny(unsafe_code)]
pub mod served;
#[deny(unsafe_code)]
pub mod stack;
#[deny(unsafe_code)]
pub mod stream_uses;
#[deny(unsafe_code)]
pub mod types;

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use gpumem::pool::SizeClass;
use gpumem::resource::SharedResource;
use gpumem::DevicePtr;

pub use allocator::{Allocator, Backend, Snapshot};
pub use foreign_segments::{gpumem_graph_pool_retain_foreign, gpumem_segment_source_t};
pub use graph_checkpoints::{
    gpumem_checkpoint_free, gpumem_checkpoint_live_count, gpumem_checkpoint_t,
    gpumem_graph_pool_block, gpumem_graph_pool_checkpoint, gpumem_graph_pool_live_blocks,
    gpumem_graph_pool_restore, gpumem_restored_free, gpumem_restored_freed, gpumem_restored_made,
    gpumem_restored_t,
};
pub use mempool_options::{gpumem_graph_pool_set_no_split, gpumem_graph_pool_set_use_on_oom};
pub use regions::{
    gpumem_region_begin, gpumem_region_end, gpumem_sleep, gpumem_sleeping_bytes, gpumem_wake,
};
pub use types::{gpumem_block_t, gpumem_device_stats_t, gpumem_segment_t, gpumem_stat_t};

/// A CUDA stream handle (`cudaStream_t`, `CUstream`), passed as `void*`.
#[allow(non_camel_case_types)]
pub type gpumem_stream_t = *mut c_void;

static GLOBAL: OnceLock<Allocator> = OnceLock::new();

/// The process's allocator, made from the environment at the first call.
pub fn global() -> &'static Allocator {
    GLOBAL.get_or_init(Allocator::from_env)
}

/// The stack the C ABI serves `device` with, as a resource for Rust code in
/// the same process (built on first use): memory freed through the C ABI is
/// reused by allocations through it and the other way round. `None` when the
/// device cannot be served. See [`Allocator::device_resource`].
pub fn device_resource(device: i32) -> Option<SharedResource> {
    global().device_resource(device)
}

/// The simulated driver behind the global allocator when `GPUMEM_DEVICE=sim`
/// (for tests that create streams or inspect the driver); `None` on CUDA.
pub fn global_sim_driver() -> Option<std::sync::Arc<gpumem::driver::sim::SimDriver>> {
    match global().backend() {
        Backend::Sim(s) => Some(s.clone()),
        Backend::Cuda | Backend::Invalid(_) => None,
    }
}

/// Runs `f`, turning a panic into `fallback` with a report: nothing unwinds
/// into C.
#[inline(always)]
fn guard<T>(name: &'static str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            panicked(name, payload);
            fallback
        }
    }
}

/// Reports a panic [`guard`] caught in `name`. Out of line, so that the
/// exported functions' own paths carry nothing of it.
#[cold]
#[inline(never)]
fn panicked(name: &'static str, payload: Box<dyn std::any::Any + Send>) {
    // Neither the report nor dropping the payload may unwind into C.
    let _ = catch_unwind(AssertUnwindSafe(move || {
        drop(payload);
        allocator::install_logger();
        log::error!("{name}: internal error (panic caught); failing the call")
    }));
}

fn to_ptr(p: DevicePtr) -> *mut c_void {
    p.as_mut_ptr()
}

fn from_ptr(p: *mut c_void) -> DevicePtr {
    DevicePtr(p as usize as u64)
}

/// Allocates `size` bytes on `device`, usable by work on `stream` at once
/// (PyTorch's `CUDAPluggableAllocator` allocation function). Returns NULL for
/// zero or negative sizes and when the request cannot be met (reported on
/// stderr; [`gpumem_last_error`] says why). Out of memory first gives the
/// device's cached memory back (as [`gpumem_empty_cache`]) and retries once
/// (counted in `num_alloc_retries`); a second failure counts in `num_ooms`.
#[no_mangle]
pub extern "C" fn gpumem_malloc(
    size: libc::ssize_t,
    device: c_int,
    stream: gpumem_stream_t,
) -> *mut c_void {
    guard("gpumem_malloc", std::ptr::null_mut(), || {
        let Ok(size) = usize::try_from(size) else {
            return negative_size(size);
        };
        to_ptr(global().malloc(size, device, stream as usize as u64))
    })
}

/// [`gpumem_malloc`] of a negative size: reported, NULL.
#[cold]
#[inline(never)]
fn negative_size(size: libc::ssize_t) -> *mut c_void {
    let msg = format!("gpumem_malloc: negative size {size}");
    log::error!("{msg}; returning NULL");
    allocator::set_last_error(&msg);
    std::ptr::null_mut()
}

/// Frees `ptr`, allocated by [`gpumem_malloc`] with this `size`, `device` and
/// `stream`, once the work enqueued on `stream` so far has run (PyTorch's
/// free function). NULL does nothing, whatever the size; a bad free frees
/// nothing and is counted ([`gpumem_bad_free_count`]) and reported. Sizes
/// are compared as precisely as the resource records them (to 256 bytes in
/// the pools). A block of [`gpumem_cupy_malloc`] is a bad free here:
/// [`gpumem_cupy_free`] frees it.
#[no_mangle]
pub extern "C" fn gpumem_free(
    ptr: *mut c_void,
    size: libc::ssize_t,
    device: c_int,
    stream: gpumem_stream_t,
) {
    guard("gpumem_free", (), || {
        if ptr.is_null() {
            return;
        }
        let size = usize::try_from(size).unwrap_or(0);
        global().free(from_ptr(ptr), size, device, stream as usize as u64)
    })
}

/// Allocates a block of `block_size` bytes on `device` for a request of
/// `size` bytes that the caller rounded up, usable by work on `stream` at
/// once: [`gpumem_malloc`] of `block_size` bytes, except that the
/// statistics count `size` in `requested_bytes` (and the block in
/// `allocated_bytes` and `active_bytes`). PyTorch's native allocator rounds
/// requests as PyTorch's own allocator does (512-byte blocks, its
/// `roundup_power2_divisions` setting) and allocates through this. NULL for
/// a zero `block_size`, a `size` larger than `block_size`, and when the
/// request cannot be met. Freed by [`gpumem_free_rounded`].
#[no_mangle]
pub extern "C" fn gpumem_malloc_rounded(
    size: usize,
    block_size: usize,
    device: c_int,
    stream: gpumem_stream_t,
) -> *mut c_void {
    guard("gpumem_malloc_rounded", std::ptr::null_mut(), || {
        to_ptr(global().malloc_rounded(size, block_size, device, stream as usize as u64))
    })
}

/// Frees a block of [`gpumem_malloc_rounded`], named with the two sizes it
/// was allocated with, as [`gpumem_free`] frees.
#[no_mangle]
pub extern "C" fn gpumem_free_rounded(
    ptr: *mut c_void,
    size: usize,
    block_size: usize,
    device: c_int,
    stream: gpumem_stream_t,
) {
    guard("gpumem_free_rounded", (), || {
        global().free_rounded(
            from_ptr(ptr),
            size,
            block_size,
            device,
            stream as usize as u64,
        )
    })
}

/// Allocates `size` bytes on `device` on the legacy default stream (CuPy's
/// `CFunctionAllocator` malloc). `param` is ignored. NULL for zero bytes and
/// on failure.
#[no_mangle]
pub extern "C" fn gpumem_cupy_malloc(
    param: *mut c_void,
    size: usize,
    device: c_int,
) -> *mut c_void {
    let _ = param;
    guard("gpumem_cupy_malloc", std::ptr::null_mut(), || {
        to_ptr(global().cupy_malloc(size, device))
    })
}

/// Frees `ptr` from [`gpumem_cupy_malloc`] on `device` (CuPy's free). `param`
/// is ignored; NULL does nothing; a bad free is counted and reported.
#[no_mangle]
pub extern "C" fn gpumem_cupy_free(param: *mut c_void, ptr: *mut c_void, device: c_int) {
    let _ = param;
    guard("gpumem_cupy_free", (), || {
        if !ptr.is_null() {
            global().cupy_free(from_ptr(ptr), device)
        }
    })
}

/// Bytes allocated on `device` and not freed, each allocation rounded up to
/// 256 bytes (0 before the first allocation).
#[no_mangle]
pub extern "C" fn gpumem_allocated_bytes(device: c_int) -> usize {
    guard("gpumem_allocated_bytes", 0, || {
        global().allocated_bytes(device)
    })
}

/// Highest [`gpumem_allocated_bytes`] since the start or the last
/// [`gpumem_reset_peak`]. Exact while the pool's threads share one lock
/// shard (always under PyTorch); once threads that allocate at the same
/// moment spread over the shards, each shard counts apart and this is the
/// sum of their peaks, an upper bound (`StatisticsAdaptor`).
#[no_mangle]
pub extern "C" fn gpumem_peak_allocated_bytes(device: c_int) -> usize {
    guard("gpumem_peak_allocated_bytes", 0, || {
        global().peak_allocated_bytes(device)
    })
}

/// Bytes the resource serving `device` holds from the driver (allocated plus
/// cached).
#[no_mangle]
pub extern "C" fn gpumem_reserved_bytes(device: c_int) -> usize {
    guard("gpumem_reserved_bytes", 0, || {
        global().reserved_bytes(device)
    })
}

/// Highest [`gpumem_reserved_bytes`] since the start or the last
/// [`gpumem_reset_peak`].
#[no_mangle]
pub extern "C" fn gpumem_peak_reserved_bytes(device: c_int) -> usize {
    guard("gpumem_peak_reserved_bytes", 0, || {
        global().peak_reserved_bytes(device)
    })
}

/// Resets the allocated and reserved peaks of `device` to the current values.
#[no_mangle]
pub extern "C" fn gpumem_reset_peak(device: c_int) {
    guard("gpumem_reset_peak", (), || global().reset_peak(device))
}

/// Gives the memory cached on `device` back to the driver, after the streams
/// that freed it have finished their work (like `torch.cuda.empty_cache`).
#[no_mangle]
pub extern "C" fn gpumem_empty_cache(device: c_int) {
    guard("gpumem_empty_cache", (), || {
        global().empty_cache(device);
    })
}

/// [`gpumem_empty_cache`] of one pool (PyTorch's `emptyCache(mempool_id)`,
/// which a `MemPool` calls as it is deleted): with `(id0, id1)` = `(0, 0)`
/// the device's cache as [`gpumem_empty_cache`] gives it back; with another
/// id the segments without a live block of that graph pool only, when
/// nothing uses it any more (no graph, no `MemPool`, no capture into it),
/// and nothing else. Nothing while a capture into a graph pool is under
/// way. Returns the bytes given back (0 for a pool that does not exist).
#[no_mangle]
pub extern "C" fn gpumem_pool_empty_cache(device: c_int, id0: u64, id1: u64) -> usize {
    guard("gpumem_pool_empty_cache", 0, || {
        global().pool_empty_cache(device, (id0, id1))
    })
}

/// Mappings that the `vpool` serving `device` has made and unmapped since
/// it was built: one per extent mapped at one place (a `cuMemMap`), aliases
/// included (mapping memory already held at a further address allocates
/// nothing, so `num_device_alloc` does not count it), and one per extent
/// unmapped. Each costs the host tens of µs inside an allocation or a
/// trim. -1 when `device` is served by another resource or not used yet.
#[no_mangle]
pub extern "C" fn gpumem_mapping_changes(device: c_int) -> i64 {
    guard("gpumem_mapping_changes", -1, || {
        global()
            .mapping_changes(device)
            .map_or(-1, |n| i64::try_from(n).unwrap_or(i64::MAX))
    })
}

/// Frees refused on `device` since the start: pointers gpumem did not hand
/// out, second frees, sizes other than the allocation's (to 256 bytes in
/// the pools), CuPy's blocks passed to `gpumem_free`. Each freed nothing.
/// A negative `device` gives the total over all devices (frees naming no
/// valid device included).
#[no_mangle]
pub extern "C" fn gpumem_bad_free_count(device: c_int) -> u64 {
    guard("gpumem_bad_free_count", 0, || {
        global().bad_free_count(device)
    })
}

/// Why the configuration in force (`GPUMEM_CONF`'s, until a
/// [`gpumem_configure`] replaces it) is invalid, as one line of text; NULL
/// when it is valid. While it is invalid, every allocation returns NULL. The string lives as long as the process.
/// Reading it reads `GPUMEM_CONF` (at the first call into the library), so
/// call it after setting the variable.
#[no_mangle]
pub extern "C" fn gpumem_config_error() -> *const c_char {
    guard("gpumem_config_error", std::ptr::null(), || {
        global()
            .conf_error()
            .map_or(std::ptr::null(), |e| e.as_ptr())
    })
}

/// Sets the configuration (`GPUMEM_CONF`'s syntax, e.g.
/// `"resource=vpool,max_size=40GiB"`) in place of `GPUMEM_CONF`'s, until the
/// first allocation; afterwards only the configuration already in force is
/// accepted (calling again with it is harmless). 0 on success; -1 when the
/// text is invalid, NULL, or a different configuration after the first
/// allocation: nothing changes then, and [`gpumem_last_error`] says why.
///
/// # Safety
/// `conf` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpumem_configure(conf: *const c_char) -> c_int {
    guard("gpumem_configure", -1, || {
        if conf.is_null() {
            allocator::set_last_error(
                "gpumem_configure: the configuration is NULL; the configuration in force is unchanged",
            );
            return -1;
        }
        // SAFETY: the caller passes a NUL-terminated string (checked non-NULL).
        let text = unsafe { CStr::from_ptr(conf) }.to_string_lossy();
        match global().configure(&text) {
            Ok(()) => 0,
            Err(_) => -1,
        }
    })
}

/// Why the calling thread's last [`gpumem_malloc`] (or
/// [`gpumem_cupy_malloc`]) failed: out of memory with the requested,
/// reserved and live bytes, the largest free block and the limit, or any
/// other reason. NULL when that call did not fail. Valid until the thread's
/// next allocation. After a refused [`gpumem_configure`], why it was
/// refused.
#[no_mangle]
pub extern "C" fn gpumem_last_error() -> *const c_char {
    guard(
        "gpumem_last_error",
        std::ptr::null(),
        allocator::last_error_ptr,
    )
}

/// Fills `*out` with the statistics of `device` in PyTorch's terms
/// (`torch.cuda.memory_stats`). 0 on success (all zeros for a device not
/// used yet); -1 for a device out of range (0..64) or a NULL `out`.
///
/// # Safety
/// `out` is NULL or points to a writable `gpumem_device_stats_t`.
#[no_mangle]
pub unsafe extern "C" fn gpumem_get_device_stats(
    device: c_int,
    out: *mut gpumem_device_stats_t,
) -> c_int {
    guard("gpumem_get_device_stats", -1, || {
        if out.is_null() {
            return -1;
        }
        match global().device_stats(device) {
            Some(stats) => {
                // SAFETY: the caller passes a writable struct (checked non-NULL).
                unsafe { out.write(stats) };
                0
            }
            None => -1,
        }
    })
}

/// Fills `*small` and `*large` with the statistics of `device`'s blocks of
/// at most 1 MiB and of the larger ones (`torch.cuda.memory_stats`'
/// `small_pool` and `large_pool`), as [`gpumem_get_device_stats`] counts
/// all blocks. The device's resource keeps both in one reserve, which
/// counts in `*large`; graph pools keep them apart as PyTorch's pools do.
/// Driver calls, retries and out-of-memory failures are zero here (PyTorch
/// counts them for all blocks only). 0 on success; -1 for a device out of
/// range (0..64) or a NULL pointer.
///
/// # Safety
/// `small` and `large` are NULL or point to writable
/// `gpumem_device_stats_t`s.
#[no_mangle]
pub unsafe extern "C" fn gpumem_get_class_stats(
    device: c_int,
    small: *mut gpumem_device_stats_t,
    large: *mut gpumem_device_stats_t,
) -> c_int {
    guard("gpumem_get_class_stats", -1, || {
        if small.is_null() || large.is_null() {
            return -1;
        }
        match global().class_stats(device) {
            Some([s, l]) => {
                // SAFETY: the caller passes writable structs (checked
                // non-NULL).
                unsafe {
                    small.write(s);
                    large.write(l);
                }
                0
            }
            None => -1,
        }
    })
}

/// Sets every peak of `device` to its current value
/// (`torch.cuda.reset_peak_memory_stats`).
#[no_mangle]
pub extern "C" fn gpumem_reset_peak_stats(device: c_int) {
    guard("gpumem_reset_peak_stats", (), || {
        global().reset_peak(device)
    })
}

/// Sets every accumulated statistic of `device` to zero: the `allocated` and
/// `freed` totals, `num_alloc_retries`, `num_ooms`, `num_device_alloc` and
/// `num_device_free` (`torch.cuda.reset_accumulated_memory_stats`).
#[no_mangle]
pub extern "C" fn gpumem_reset_accumulated_stats(device: c_int) {
    guard("gpumem_reset_accumulated_stats", (), || {
        global().reset_accumulated(device)
    })
}

/// Caps what the process holds from the driver on `device` at `fraction` of
/// the device's memory (`torch.cuda.set_per_process_memory_fraction`), its
/// graph pools included: allocations that would need more fail (after the
/// retry) as out of memory, with the limit in the message. 0 on success; -1 for a fraction
/// outside [0, 1] or a device out of range.
#[no_mangle]
pub extern "C" fn gpumem_set_memory_fraction(device: c_int, fraction: f64) -> c_int {
    guard("gpumem_set_memory_fraction", -1, || {
        match global().set_memory_fraction(device, fraction) {
            Ok(()) => 0,
            Err(e) => {
                log::warn!("gpumem_set_memory_fraction: {e}");
                -1
            }
        }
    })
}

/// The memory fraction in force on `device` (1.0 when never set).
#[no_mangle]
pub extern "C" fn gpumem_get_memory_fraction(device: c_int) -> f64 {
    guard("gpumem_get_memory_fraction", 1.0, || {
        global().memory_fraction(device)
    })
}

/// Notes that the live block at `ptr` (from [`gpumem_malloc`] on `device`)
/// is also used by work on `stream` (`Tensor.record_stream`). When it is
/// freed, its memory is not reused before the work enqueued on `stream` up
/// to the free has run: one event is recorded on each such stream at the
/// free, and the block goes back to the pool once they completed (checked on
/// later allocations and frees, waited for by [`gpumem_empty_cache`]).
/// While a stream capture is under way nothing is recorded or queried (it
/// would break the capture): the events are recorded after it. A second free
/// of a block waiting so is a double free. Its free's size is checked at
/// once only against what the block could be rounded from (more than half
/// of it, up to the block): the resource checks it exactly when the
/// deferred free is made, and a wrong size then counts as a bad free and
/// leaves the block live. Blocks of graph pools
/// ([`gpumem_graph_pool_malloc`]) wait the same way. Unknown pointers are
/// reported and ignored.
#[no_mangle]
pub extern "C" fn gpumem_record_stream(ptr: *mut c_void, device: c_int, stream: gpumem_stream_t) {
    guard("gpumem_record_stream", (), || {
        global().record_stream(from_ptr(ptr), device, stream as usize as u64)
    })
}

/// Copies up to `max_segments` of `device`'s segments (what it holds from the
/// driver, in address order) to `segments` and up to `max_blocks` of its live
/// blocks (in address order; size as the resource rounds it, requested as
/// asked, the stream allocated on) to `blocks`, its graph pools' included,
/// and sets `*n_segments` and `*n_blocks` to the totals, so a caller can
/// retry with larger arrays.
/// Every live block lies inside one segment (but the blocks of a region
/// asleep, whose memory is given back); a stream is 0 where unknown.
/// 0 on success (nothing for a device not used yet); -1 for a device out of
/// range. A NULL array is allowed with a maximum of 0; a NULL count is not
/// written.
///
/// # Safety
/// `segments` holds `max_segments` writable entries and `blocks` holds
/// `max_blocks` (either may be NULL when its maximum is 0); `n_segments` and
/// `n_blocks` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn gpumem_snapshot(
    device: c_int,
    segments: *mut gpumem_segment_t,
    max_segments: usize,
    n_segments: *mut usize,
    blocks: *mut gpumem_block_t,
    max_blocks: usize,
    n_blocks: *mut usize,
) -> c_int {
    // SAFETY: the caller's promise, passed on (the device's pool id is
    // everything `device` holds).
    unsafe {
        gpumem_pool_snapshot(
            device,
            0,
            0,
            segments,
            max_segments,
            n_segments,
            blocks,
            max_blocks,
            n_blocks,
        )
    }
}

/// [`gpumem_snapshot`] of one pool (PyTorch's `memory_snapshot(mempool_id)`,
/// `MemPool.snapshot()`): with `(id0, id1)` = `(0, 0)` everything `device`
/// holds, as [`gpumem_snapshot`]; with another id the segments and live
/// blocks of that graph pool only (none when it does not exist on
/// `device`). Returns and counts as [`gpumem_snapshot`] does.
///
/// # Safety
/// As for [`gpumem_snapshot`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gpumem_pool_snapshot(
    device: c_int,
    id0: u64,
    id1: u64,
    segments: *mut gpumem_segment_t,
    max_segments: usize,
    n_segments: *mut usize,
    blocks: *mut gpumem_block_t,
    max_blocks: usize,
    n_blocks: *mut usize,
) -> c_int {
    guard("gpumem_pool_snapshot", -1, || {
        let Some(snapshot) = global().pool_snapshot(device, (id0, id1)) else {
            return -1;
        };
        // SAFETY: the caller's promise, passed on.
        unsafe {
            snapshot_out(
                &snapshot,
                segments,
                max_segments,
                n_segments,
                blocks,
                max_blocks,
                n_blocks,
            )
        };
        0
    })
}

/// Writes `snapshot` out as [`gpumem_snapshot`] describes.
///
/// # Safety
/// As for [`gpumem_snapshot`]'s arguments.
unsafe fn snapshot_out(
    snapshot: &Snapshot,
    segments: *mut gpumem_segment_t,
    max_segments: usize,
    n_segments: *mut usize,
    blocks: *mut gpumem_block_t,
    max_blocks: usize,
    n_blocks: *mut usize,
) {
    let segs: Vec<gpumem_segment_t> = snapshot
        .segments
        .iter()
        .map(|s| {
            let graph = snapshot
                .graph_segments
                .binary_search_by_key(&s.address, |g| g.segment.address)
                .ok()
                .map(|i| &snapshot.graph_segments[i]);
            match graph {
                Some(g) => gpumem_segment_t {
                    address: s.address.0,
                    size: s.size as u64,
                    stream: g.segment.raw_stream,
                    pool_id0: g.pool.0,
                    pool_id1: g.pool.1,
                    is_large: i32::from(g.segment.class == SizeClass::Large),
                    is_expandable: 0,
                },
                None => gpumem_segment_t {
                    address: s.address.0,
                    size: s.size as u64,
                    stream: 0,
                    pool_id0: 0,
                    pool_id1: 0,
                    // As the statistics count them (`Allocator::class_stats`).
                    is_large: i32::from(s.size > gpumem::adaptor::SMALL_SEGMENT_MAX),
                    is_expandable: i32::from(snapshot.expandable.binary_search(&s.address).is_ok()),
                },
            }
        })
        .collect();
    let live: Vec<gpumem_block_t> = snapshot
        .blocks
        .iter()
        .map(|(b, stream)| gpumem_block_t::of(b, *stream))
        .collect();
    // SAFETY: the caller passes arrays of the given lengths and writable
    // counts (each checked non-NULL before use).
    unsafe {
        copy_out(&segs, segments, max_segments, n_segments);
        copy_out(&live, blocks, max_blocks, n_blocks);
    }
}

/// Copies up to `max` items to `dst` and writes the total to `*n`.
///
/// # Safety
/// `dst` holds `max` writable items (or is NULL), `n` is NULL or writable.
pub(crate) unsafe fn copy_out<T: Copy>(items: &[T], dst: *mut T, max: usize, n: *mut usize) {
    if !dst.is_null() {
        let k = items.len().min(max);
        // SAFETY: `dst` has room for `max` >= `k` items (the caller's
        // promise); `items` is a distinct Rust allocation.
        unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), dst, k) };
    }
    if !n.is_null() {
        // SAFETY: `n` is writable (the caller's promise).
        unsafe { n.write(items.len()) };
    }
}

/// 0 on success; -1 with the reason as the thread's [`gpumem_last_error`].
fn status(r: Result<(), String>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            allocator::set_last_error(&e);
            -1
        }
    }
}

/// Routes allocations to the graph-private pool `(id0, id1)` of `device`
/// from now on (PyTorch's `beginAllocateToPool`): creates it, or counts one
/// more use of it, which [`gpumem_graph_pool_release`] drops. The caller
/// decides which allocations go there ([`gpumem_graph_pool_malloc`]). The
/// pool's blocks keep their addresses for the life of the pool and are never
/// handed to allocations outside it. 0 on success, -1 with the reason in
/// [`gpumem_last_error`].
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_begin(device: c_int, id0: u64, id1: u64) -> c_int {
    guard("gpumem_graph_pool_begin", -1, || {
        status(global().graph_pool_begin(device, (id0, id1)))
    })
}

/// Ends one capture into the graph pool `(id0, id1)` (PyTorch's
/// `endAllocateToPool`). 0 on success, -1 when none was under way.
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_end(device: c_int, id0: u64, id1: u64) -> c_int {
    guard("gpumem_graph_pool_end", -1, || {
        status(global().graph_pool_end(device, (id0, id1)))
    })
}

/// Counts one more use of the graph pool `(id0, id1)`, creating it if needed
/// (PyTorch's `createOrIncrefPool`). 0 on success, -1 on failure.
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_retain(device: c_int, id0: u64, id1: u64) -> c_int {
    guard("gpumem_graph_pool_retain", -1, || {
        status(global().graph_pool_retain(device, (id0, id1)))
    })
}

/// Counts one use of the graph pool `(id0, id1)` less (PyTorch's
/// `releasePool`). With no use and no capture left, the pool goes once its
/// last block is freed, and its memory goes back to the driver after the
/// device's work is done. 0 on success, -1 when the pool does not exist or
/// was released more often than used.
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_release(device: c_int, id0: u64, id1: u64) -> c_int {
    guard("gpumem_graph_pool_release", -1, || {
        status(global().graph_pool_release(device, (id0, id1)))
    })
}

/// The uses counted for the graph pool `(id0, id1)`; 0 when it does not
/// exist.
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_use_count(device: c_int, id0: u64, id1: u64) -> c_int {
    guard("gpumem_graph_pool_use_count", 0, || {
        global().graph_pool_use_count(device, (id0, id1)) as c_int
    })
}

/// Allocates `size` bytes from the graph pool `(id0, id1)` on `stream`.
/// NULL for zero bytes and on failure (the reason in [`gpumem_last_error`]);
/// out of memory empties the device's cache and retries once first.
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_malloc(
    size: usize,
    device: c_int,
    id0: u64,
    id1: u64,
    stream: gpumem_stream_t,
) -> *mut c_void {
    guard("gpumem_graph_pool_malloc", std::ptr::null_mut(), || {
        to_ptr(global().graph_pool_malloc(size, device, (id0, id1), stream as usize as u64))
    })
}

/// PyTorch's `graph_capture_record_stream_reuse` allocator setting, for
/// every device: with `enabled` non-zero, a graph-pool block freed during a
/// capture while work on other streams was recorded on it
/// ([`gpumem_record_stream`]) is reused by the capture before it ends, once
/// every such stream has joined the stream it was freed on in the captured
/// graph; with 0 (the default) it waits for the capture to end. Applies to
/// the frees and allocations made from now on. Returns the previous setting
/// (0 or 1).
#[no_mangle]
pub extern "C" fn gpumem_set_graph_capture_reuse(enabled: c_int) -> c_int {
    guard("gpumem_set_graph_capture_reuse", 0, || {
        c_int::from(global().set_graph_capture_reuse(enabled != 0))
    })
}

/// Frees a block of the graph pool `(id0, id1)` with the size and stream it
/// was allocated with. A bad free frees nothing and is counted and reported.
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_free(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    id0: u64,
    id1: u64,
    stream: gpumem_stream_t,
) {
    guard("gpumem_graph_pool_free", (), || {
        global().graph_pool_free(
            from_ptr(ptr),
            size,
            device,
            (id0, id1),
            stream as usize as u64,
        )
    })
}

/// Frees a block that was freed on `stream` while `stream` captures into
/// the graph pool `(id0, id1)`. A block from [`gpumem_malloc`] or of another
/// graph pool may be used by the graph in every replay, so it is held until
/// the graph pool goes, then freed as [`gpumem_free`] would. A block of
/// `(id0, id1)` itself is freed as [`gpumem_graph_pool_free`] frees it: the
/// capture reuses it, but not before the capture is over when work on other
/// streams was recorded on it ([`gpumem_record_stream`]). With no capture
/// into that pool under way, a block is freed as outside a capture. A block
/// held already, one whose free waits for recorded streams, one of
/// [`gpumem_cupy_malloc`] or a pointer not handed out is a bad free, refused
/// and reported as [`gpumem_free`] refuses it, and so is a [`gpumem_free`]
/// of a block held.
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_hold(
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    id0: u64,
    id1: u64,
    stream: gpumem_stream_t,
) {
    guard("gpumem_graph_pool_hold", (), || {
        global().graph_pool_hold(
            from_ptr(ptr),
            size,
            device,
            (id0, id1),
            stream as usize as u64,
        )
    })
}

/// [`gpumem_graph_pool_hold`] of a block of [`gpumem_malloc_rounded`],
/// named with the two sizes it was allocated with.
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_hold_rounded(
    ptr: *mut c_void,
    size: usize,
    block_size: usize,
    device: c_int,
    id0: u64,
    id1: u64,
    stream: gpumem_stream_t,
) {
    guard("gpumem_graph_pool_hold_rounded", (), || {
        global().graph_pool_hold_rounded(
            from_ptr(ptr),
            size,
            block_size,
            device,
            (id0, id1),
            stream as usize as u64,
        )
    })
}
