//! Lending a graph pool's free memory to the device's own allocations when
//! the device runs out (PyTorch's `MemPool(use_on_oom=True)`).
//!
//! When an allocation from the device's pool cannot be met even after the
//! device's cache went back to the driver, PyTorch's allocator looks, as a
//! last resort, at the free blocks of the MemPools made with
//! `use_on_oom=True`, takes the first that fits (split as any block is),
//! and never makes such a pool grow. Here the pools are tried in the order
//! they were made, and a pool nothing uses any more (its MemPool deleted)
//! lends nothing.
//!
//! A lent block stays its pool's: it counts in the pool's statistics and
//! snapshot, and the pool lives until it is freed. Its free comes through
//! the device's free path, which names no pool: one atomic count says
//! whether any block is lent, and only then is the pointer looked up among
//! the pools' lent blocks. Every free of a pool's block, whichever path
//! makes it, takes it off the pool's list.

use std::sync::atomic::{AtomicUsize, Ordering};

use gpumem::{DevicePtr, Stream};

use super::{lock, no_pool, GraphPool, GraphPools, PoolId};

impl GraphPools {
    /// Lets `id` lend its free blocks to the device's allocations that ran
    /// out of memory (`on`), or stops it. Setting it on a pool that does
    /// not exist is an error; clearing it is not (a deleted MemPool clears
    /// it after its pool may have gone).
    pub(crate) fn set_use_on_oom(&self, id: PoolId, on: bool) -> gpumem::Result<()> {
        let mut pools = lock(&self.pools);
        match pools.get_mut(&id) {
            Some(p) => {
                p.use_on_oom = on;
                Ok(())
            }
            None if on => Err(no_pool(id)),
            None => Ok(()),
        }
    }

    /// A block of `size` bytes on `stream` from the free blocks of the
    /// first pool, in the order they were made, that lends
    /// ([`GraphPools::set_use_on_oom`]), is still used and has one that
    /// fits; no pool grows. `None` when none has.
    pub(crate) fn lend(
        &self,
        size: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Option<(PoolId, DevicePtr)> {
        let mut pools = lock(&self.pools);
        let mut lenders: Vec<(u64, PoolId)> = pools
            .iter()
            .filter(|(_, p)| p.use_on_oom && p.uses > 0)
            .map(|(id, p)| (p.made, *id))
            .collect();
        lenders.sort_unstable();
        for (_, id) in lenders {
            let p = pools.get_mut(&id).expect("listed above");
            match p.resource.allocate_cached(size, alignment, stream) {
                Ok(Some(ptr)) => {
                    p.lent.insert(ptr.0);
                    self.lending.fetch_add(1, Ordering::Relaxed);
                    return Some((id, ptr));
                }
                Ok(None) => {}
                Err(e) => log::debug!("graph pool {id:?} cannot lend {size} bytes: {e}"),
            }
        }
        None
    }

    /// The pool that lent the live block at `ptr` to the device's
    /// allocations, if one did: one atomic load while none is lent.
    #[inline]
    pub(crate) fn lender_of(&self, ptr: DevicePtr) -> Option<PoolId> {
        if self.lending.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.find_lender(ptr)
    }

    #[cold]
    #[inline(never)]
    fn find_lender(&self, ptr: DevicePtr) -> Option<PoolId> {
        lock(&self.pools)
            .iter()
            .find(|(_, p)| p.lent.contains(&ptr.0))
            .map(|(id, _)| *id)
    }
}

impl GraphPool {
    /// Takes the block at `ptr`, just freed, off the pool's lent blocks if
    /// it was lent.
    pub(super) fn forget_lent(&mut self, ptr: DevicePtr, lending: &AtomicUsize) {
        if self.lent.remove(&ptr.0) {
            lending.fetch_sub(1, Ordering::Relaxed);
        }
    }
}
