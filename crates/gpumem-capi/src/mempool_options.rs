//! The options of PyTorch's `torch.cuda.MemPool` through the C ABI, for a
//! pool made with `gpumem_graph_pool_retain` (`createOrIncrefPool`).
//!
//! ```c
//! int gpumem_graph_pool_set_no_split(int device, uint64_t id0, uint64_t id1);  // MemPool(no_split=True)
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
