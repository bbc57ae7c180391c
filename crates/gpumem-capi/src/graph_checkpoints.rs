//! Saving and restoring a graph pool's layout through the C ABI: PyTorch's
//! `getCheckpointState` and `setCheckpointPoolState`, which its CUDA graph
//! trees (`torch.compile(mode="reduce-overhead")`) call whenever they record
//! a new branch of graphs.
//!
//! ```c
//! gpumem_checkpoint_t *cp = gpumem_graph_pool_checkpoint(device, id0, id1);
//! gpumem_restored_t *r = gpumem_graph_pool_restore(cp);   // NULL: refused, see gpumem_last_error
//! size_t n_freed = gpumem_restored_freed(r, ptrs, max);   // blocks freed
//! size_t n_made = gpumem_restored_made(r, blocks, max);   // blocks live again
//! gpumem_restored_free(r);
//! gpumem_checkpoint_free(cp);
//! ```

use std::ffi::{c_int, c_void};

use gpumem::pool::Checkpoint;

use crate::allocator::set_last_error;
use crate::graph_pools::PoolId;
use crate::types::gpumem_block_t;
use crate::{copy_out, global, guard};

/// A graph pool's saved layout (opaque): its segments and blocks, live or
/// not, and the pool it belongs to.
#[allow(non_camel_case_types)]
pub struct gpumem_checkpoint_t {
    device: i32,
    pool: PoolId,
    saved: Checkpoint,
}

/// What a restore changed (opaque): the blocks it freed and those it made
/// live again.
#[allow(non_camel_case_types)]
pub struct gpumem_restored_t {
    freed: Vec<*mut c_void>,
    made: Vec<gpumem_block_t>,
}

/// Saves the layout of the graph pool `(id0, id1)` of `device`. NULL when
/// the pool does not exist (the reason in [`crate::gpumem_last_error`]).
/// Free it with [`gpumem_checkpoint_free`].
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_checkpoint(
    device: c_int,
    id0: u64,
    id1: u64,
) -> *mut gpumem_checkpoint_t {
    guard(
        "gpumem_graph_pool_checkpoint",
        std::ptr::null_mut(),
        || match global().graph_pool_checkpoint(device, (id0, id1)) {
            Ok(saved) => Box::into_raw(Box::new(gpumem_checkpoint_t {
                device,
                pool: (id0, id1),
                saved,
            })),
            Err(e) => {
                set_last_error(&e);
                std::ptr::null_mut()
            }
        },
    )
}

/// Frees a checkpoint; NULL is ignored.
///
/// # Safety
/// `cp` is NULL or a checkpoint of [`gpumem_graph_pool_checkpoint`] not
/// freed yet.
#[no_mangle]
pub unsafe extern "C" fn gpumem_checkpoint_free(cp: *mut gpumem_checkpoint_t) {
    if !cp.is_null() {
        // SAFETY: `cp` came from `Box::into_raw` and is freed once (the
        // caller's promise).
        drop(unsafe { Box::from_raw(cp) });
    }
}

/// The number of live blocks `cp` saved.
///
/// # Safety
/// `cp` is a live checkpoint of [`gpumem_graph_pool_checkpoint`].
#[no_mangle]
pub unsafe extern "C" fn gpumem_checkpoint_live_count(cp: *const gpumem_checkpoint_t) -> usize {
    // SAFETY: a live checkpoint (the caller's promise).
    let cp = unsafe { &*cp };
    guard("gpumem_checkpoint_live_count", 0, || {
        cp.saved.live_blocks().count()
    })
}

/// Puts the layout `cp` saved back into its graph pool: frees the pool's
/// live blocks it does not have and makes its live blocks live again at
/// their addresses (a block live in both, same address and size, is kept).
/// Returns what changed (free it with [`gpumem_restored_free`]), or NULL
/// when refused, with nothing changed (a segment it names went back to the
/// driver, or it would free a block another graph still uses; the reason in
/// [`crate::gpumem_last_error`]).
///
/// # Safety
/// `cp` is a live checkpoint of [`gpumem_graph_pool_checkpoint`].
#[no_mangle]
pub unsafe extern "C" fn gpumem_graph_pool_restore(
    cp: *const gpumem_checkpoint_t,
) -> *mut gpumem_restored_t {
    // SAFETY: a live checkpoint (the caller's promise).
    let cp = unsafe { &*cp };
    guard(
        "gpumem_graph_pool_restore",
        std::ptr::null_mut(),
        || match global().graph_pool_restore(cp.device, cp.pool, &cp.saved) {
            Ok(r) => Box::into_raw(Box::new(gpumem_restored_t {
                freed: r.freed.iter().map(|p| p.as_mut_ptr()).collect(),
                made: r
                    .made
                    .iter()
                    .map(|(b, stream)| gpumem_block_t::of(b, *stream))
                    .collect(),
            })),
            Err(e) => {
                set_last_error(&e);
                std::ptr::null_mut()
            }
        },
    )
}

/// Copies up to `max` of the pointers `r`'s restore freed to `out` (NULL
/// with a `max` of 0 to count them); returns how many it freed.
///
/// # Safety
/// `r` is a live result of [`gpumem_graph_pool_restore`]; `out` holds `max`
/// writable pointers or is NULL.
#[no_mangle]
pub unsafe extern "C" fn gpumem_restored_freed(
    r: *const gpumem_restored_t,
    out: *mut *mut c_void,
    max: usize,
) -> usize {
    // SAFETY: a live result (the caller's promise).
    let r = unsafe { &*r };
    // SAFETY: `out` holds `max` entries or is NULL (the caller's promise).
    unsafe { copy_to(&r.freed, out, max) }
}

/// Copies up to `max` of the blocks `r`'s restore made live again to `out`
/// (address, size, size asked for, raw stream of its segment); returns how
/// many it made.
///
/// # Safety
/// `r` is a live result of [`gpumem_graph_pool_restore`]; `out` holds `max`
/// writable entries or is NULL.
#[no_mangle]
pub unsafe extern "C" fn gpumem_restored_made(
    r: *const gpumem_restored_t,
    out: *mut gpumem_block_t,
    max: usize,
) -> usize {
    // SAFETY: a live result (the caller's promise).
    let r = unsafe { &*r };
    // SAFETY: `out` holds `max` entries or is NULL (the caller's promise).
    unsafe { copy_to(&r.made, out, max) }
}

/// Frees a restore's result; NULL is ignored.
///
/// # Safety
/// `r` is NULL or a result of [`gpumem_graph_pool_restore`] not freed yet.
#[no_mangle]
pub unsafe extern "C" fn gpumem_restored_free(r: *mut gpumem_restored_t) {
    if !r.is_null() {
        // SAFETY: from `Box::into_raw`, freed once (the caller's promise).
        drop(unsafe { Box::from_raw(r) });
    }
}

/// Copies up to `max` of the live blocks of the graph pool `(id0, id1)` of
/// `device` (their addresses, in address order) to `out` and writes their
/// number to `*n`. 0 on success, -1 when the pool does not exist.
///
/// # Safety
/// `out` holds `max` writable pointers or is NULL; `n` is writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn gpumem_graph_pool_live_blocks(
    device: c_int,
    id0: u64,
    id1: u64,
    out: *mut *mut c_void,
    max: usize,
    n: *mut usize,
) -> c_int {
    guard("gpumem_graph_pool_live_blocks", -1, || {
        let Some(live) = global().graph_pool_live_blocks(device, (id0, id1)) else {
            set_last_error(&format!(
                "device {device}: graph pool {:?} does not exist",
                (id0, id1)
            ));
            return -1;
        };
        let ptrs: Vec<*mut c_void> = live.iter().map(|p| p.as_mut_ptr()).collect();
        // SAFETY: as the caller promised of `out` and `n`.
        unsafe { copy_out(&ptrs, out, max, n) };
        0
    })
}

/// Finds the live graph-pool block at `ptr` (its first byte) on any device:
/// writes its device, pool, the size it was asked with and the raw stream of
/// its segment (each output may be NULL). 0 when found, -1 when `ptr` is no
/// live graph-pool block. What a caller holding only the pointer needs to
/// free the block (`gpumem_graph_pool_free`, `gpumem_graph_pool_hold`):
/// PyTorch's graph trees hand such pointers around.
///
/// # Safety
/// Each output is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn gpumem_graph_pool_block(
    ptr: *mut c_void,
    device: *mut c_int,
    id0: *mut u64,
    id1: *mut u64,
    requested: *mut usize,
    stream: *mut crate::gpumem_stream_t,
) -> c_int {
    guard("gpumem_graph_pool_block", -1, || {
        let Some((d, pool, block, raw)) =
            global().graph_pool_block(gpumem::DevicePtr(ptr as usize as u64))
        else {
            return -1;
        };
        let size = block.requested.unwrap_or(block.size);
        // SAFETY: each output is NULL or writable (the caller's promise).
        unsafe {
            write_opt(device, d);
            write_opt(id0, pool.0);
            write_opt(id1, pool.1);
            write_opt(requested, size);
            write_opt(stream, raw as usize as crate::gpumem_stream_t);
        }
        0
    })
}

/// Writes `v` to `out` unless it is NULL.
///
/// # Safety
/// `out` is NULL or writable.
unsafe fn write_opt<T>(out: *mut T, v: T) {
    if !out.is_null() {
        // SAFETY: writable (the caller's promise).
        unsafe { out.write(v) };
    }
}

/// Copies up to `max` of `items` to `out` (if not NULL); returns their
/// number.
///
/// # Safety
/// `out` holds `max` writable items or is NULL.
unsafe fn copy_to<T: Copy>(items: &[T], out: *mut T, max: usize) -> usize {
    // SAFETY: as the caller promised of `out`; no count is written.
    unsafe { copy_out(items, out, max, std::ptr::null_mut()) };
    items.len()
}
