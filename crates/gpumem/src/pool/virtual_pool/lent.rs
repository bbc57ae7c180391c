//! [`LentLock`] for [`VirtualPool`]: every shard's lock, as a
//! [`PoolResource`](crate::pool::PoolResource) lends its own, so a
//! statistics wrapper (the C ABI's) counts each call in the cell of the
//! shard that served it and threads on different shards count apart.
//!
//! The counted calls may be inlined into a caller that knows the pool's
//! type (the C ABI's stack over `vpool`), which spares the C ABI two calls
//! through vtables. A second inlined copy of the allocation path changes
//! what the compiler inlines into the plain one
//! (`docs/decisions-virtual-pool.md`): the page
//! table's `mark` and `unmark` are forced inline so that it stays as it
//! was.

use super::VirtualPool;
use crate::adaptor::CallCount;
use crate::driver::DevicePtr;
use crate::resource::{validate_request, LentLock};
use crate::stream::Stream;
use crate::Result;

use super::config::VIRTUAL_POOL_MAX_ALIGNMENT;

impl LentLock for VirtualPool {
    #[inline]
    fn allocate_counted(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        count: CallCount<'_>,
    ) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, VIRTUAL_POOL_MAX_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        if self.config.nccl_ready {
            // One shard in this mode.
            let p = self.allocate_whole(bytes, alignment, stream)?;
            count.apply(0);
            return Ok(p);
        }
        let (home, mut guard) = self.shards.lock_home();
        match self.allocate_in(&mut guard, bytes, alignment, stream) {
            Ok(p) => {
                count.apply(home);
                Ok(p)
            }
            Err(e) if e.is_oom() => {
                drop(guard);
                let p = self.allocate_after_reclaim(bytes, alignment, stream, e)?;
                let home = self.shards.home();
                let _g = self.shards.lock(home);
                count.apply(home);
                Ok(p)
            }
            Err(e) => Err(e),
        }
    }

    #[inline]
    fn deallocate_counted(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
        stream: &Stream,
        count: CallCount<'_>,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let (home, mut guard) = self.shards.lock_home();
        let st = &mut *guard;
        if let Some(area) = st.area_of(ptr.0) {
            self.free_in(st, area, ptr, bytes, stream)?;
            count.apply(home);
            return Ok(());
        }
        drop(guard);
        self.free_elsewhere(home, ptr, bytes, stream, Some(count))
    }

    fn cells(&self) -> usize {
        self.shards.len()
    }

    fn locked(&self, f: &mut dyn FnMut()) {
        let _all = self.shards.lock_all();
        f();
    }
}
