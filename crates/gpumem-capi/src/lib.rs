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
//! uint64_t gpumem_bad_free_count(int device);       // frees refused (-1: all devices)
//! const char *gpumem_config_error(void);            // NULL when GPUMEM_CONF is valid
//! ```
//!
//! `gpumem_stream_t` is `void*`: pass a `cudaStream_t`/`CUstream` as it is
//! (0 is the legacy default stream).
//!
//! Behaviour:
//! - Configuration comes from `GPUMEM_CONF`, read once at the first call (see
//!   [`conf`]); the backend from `GPUMEM_DEVICE` (`cuda`, the default; `sim`
//!   for the simulated device, used by the tests; `auto`). An invalid
//!   `GPUMEM_CONF` is reported and serves nothing (every allocation returns
//!   NULL); [`gpumem_config_error`] returns the reason.
//! - Each device ordinal gets its own stack, built at its first allocation.
//! - Zero-byte requests return NULL, as `cudaMalloc` does; PyTorch and CuPy
//!   never dereference the pointer of an empty tensor or array, and freeing
//!   NULL does nothing.
//! - A failed allocation returns NULL and is reported on stderr; a negative
//!   size is a failed allocation. A bad free (a pointer gpumem did not hand
//!   out, a second free, a size other than the allocation's) frees nothing,
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

pub mod allocator;
pub mod conf;
pub mod served;

use std::ffi::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use gpumem::DevicePtr;

pub use allocator::{Allocator, Backend};

/// A CUDA stream handle (`cudaStream_t`, `CUstream`), passed as `void*`.
#[allow(non_camel_case_types)]
pub type gpumem_stream_t = *mut c_void;

static GLOBAL: OnceLock<Allocator> = OnceLock::new();

/// The process's allocator, made from the environment at the first call.
pub fn global() -> &'static Allocator {
    GLOBAL.get_or_init(Allocator::from_env)
}

/// The simulated driver behind the global allocator when `GPUMEM_DEVICE=sim`
/// (for tests that create streams or inspect the driver); `None` on CUDA.
pub fn global_sim_driver() -> Option<std::sync::Arc<gpumem::driver::sim::SimDriver>> {
    match global().backend() {
        Backend::Sim(s) => Some(s.clone()),
        Backend::Cuda => None,
    }
}

/// Runs `f`, turning a panic into `fallback` with a report: nothing unwinds
/// into C.
fn guard<T>(name: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            // The report itself must not unwind either.
            let _ = catch_unwind(|| {
                allocator::report(&format!(
                    "{name}: internal error (panic caught); failing the call"
                ))
            });
            fallback
        }
    }
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
/// stderr).
#[no_mangle]
pub extern "C" fn gpumem_malloc(
    size: libc::ssize_t,
    device: c_int,
    stream: gpumem_stream_t,
) -> *mut c_void {
    guard("gpumem_malloc", std::ptr::null_mut(), || {
        let Ok(size) = usize::try_from(size) else {
            allocator::report(&format!(
                "gpumem_malloc: negative size {size}; returning NULL"
            ));
            return std::ptr::null_mut();
        };
        to_ptr(global().malloc(size, device, stream as usize as u64))
    })
}

/// Frees `ptr`, allocated by [`gpumem_malloc`] with this `size`, `device` and
/// `stream`, once the work enqueued on `stream` so far has run (PyTorch's
/// free function). NULL does nothing, whatever the size; a bad free frees
/// nothing and is counted ([`gpumem_bad_free_count`]) and reported.
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
/// [`gpumem_reset_peak`].
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

/// Frees refused on `device` since the start: pointers gpumem did not hand
/// out, second frees, sizes other than the allocation's. Each freed nothing.
/// A negative `device` gives the total over all devices (frees naming no
/// valid device included).
#[no_mangle]
pub extern "C" fn gpumem_bad_free_count(device: c_int) -> u64 {
    guard("gpumem_bad_free_count", 0, || {
        global().bad_free_count(device)
    })
}

/// Why `GPUMEM_CONF` is invalid, as one line of text; NULL when it is valid.
/// While it is invalid, every allocation returns NULL. The string lives as
/// long as the process. Reading it reads the configuration (at the first call
/// into the library), so call it after setting `GPUMEM_CONF`.
#[no_mangle]
pub extern "C" fn gpumem_config_error() -> *const c_char {
    guard("gpumem_config_error", std::ptr::null(), || {
        global()
            .conf_error()
            .map_or(std::ptr::null(), |e| e.as_ptr())
    })
}
