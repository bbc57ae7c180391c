//! The options of PyTorch's `torch.cuda.MemPool` through the C ABI, for a
//! pool made with `gpumem_graph_pool_retain` (`createOrIncrefPool`).
//!
//! ```c
//! int gpumem_graph_pool_set_no_split(int device, uint64_t id0, uint64_t id1);  // MemPool(no_split=True)
//! int gpumem_graph_pool_set_use_on_oom(int device, uint64_t id0, uint64_t id1, int on);  // use_on_oom
//! ```
//!
//! Each returns 0 on success and -1 with the reason in `gpumem_last_error`.

use std::ffi::c_int;

use crate::{global, guard, status};

/// Makes the graph pool `(id0, id1)` of `device` hand out its free blocks
/// whole from now on (PyTorch's `MemPool(no_split=True)`, `setNoSplit`):
/// each of its segments then holds one block, the segment PyTorch's
/// allocator makes for the request. 0 on success, -1 when the pool does
/// not exist.
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_set_no_split(device: c_int, id0: u64, id1: u64) -> c_int {
    guard("gpumem_graph_pool_set_no_split", -1, || {
        status(global().graph_pool_set_no_split(device, (id0, id1)))
    })
}

/// Lets the graph pool `(id0, id1)` of `device` lend its free blocks to the
/// device's own allocations when they run out of memory (`on` not 0;
/// PyTorch's `MemPool(use_on_oom=True)`, `setUseOnOOM`), or stops it (0).
/// An allocation from the device's pool ([`crate::gpumem_malloc`] and the
/// others) that fails even after the cache went back then takes a free
/// block of the first pool, in the order the pools were made, that lends,
/// is still used, and has one that fits (split as usual; no pool grows for
/// it). The block stays the pool's (statistics, snapshots) and goes back
/// there when freed with the device's free functions. 0 on success; -1 when
/// setting it on a pool that does not exist (clearing it always succeeds).
#[no_mangle]
pub extern "C" fn gpumem_graph_pool_set_use_on_oom(
    device: c_int,
    id0: u64,
    id1: u64,
    on: c_int,
) -> c_int {
    guard("gpumem_graph_pool_set_use_on_oom", -1, || {
        status(global().graph_pool_set_use_on_oom(device, (id0, id1), on != 0))
    })
}
