//! [`LentLock`]: a resource's own lock, lent to the wrapper that counts its
//! calls.
//!
//! A pool already takes a lock for every allocation and free. A statistics
//! wrapper over it ([`StatisticsAdaptor`]) needs its counters updated under
//! a lock too, so that peaks are exact; with a lock of its own that is a
//! second atomic read-modify-write per call, about half of what the C ABI
//! adds to a pool's allocation. A resource that lends its lock runs the
//! wrapper's update inside its own critical section instead, as PyTorch's
//! allocator keeps its statistics under its one mutex.
//!
//! A resource with several locks (a pool's lock shards) lends them all: a
//! count is applied in the wrapper's cell of the lock held
//! ([`CallCount::apply`]), so threads that use different locks update
//! different counters, and the wrapper reads the sum holding every lock.
//!
//! [`StatisticsAdaptor`]: crate::adaptor::StatisticsAdaptor

use crate::adaptor::CallCount;
use crate::driver::DevicePtr;
use crate::stream::Stream;
use crate::Result;

/// Allocation and free with a caller's update run under the resource's lock,
/// and that lock on its own ([`MemoryResource::lent_lock`]).
///
/// Every `count` is applied holding one of the [`LentLock::cells`] locks
/// the resource lends (those its allocations and frees take: a
/// [`PoolResource`](crate::pool::PoolResource)'s or a
/// [`VirtualPool`](crate::pool::VirtualPool)'s shards), in the cell of
/// that lock, and every `f` is run holding all of them, so updates of one
/// cell never interleave. `f` must be short and must not call the resource
/// (the locks are held). A count adds without overflow checks
/// ([`CallCount`]): apply it only for a block the resource handed out, or
/// took back, at its real size.
///
/// [`MemoryResource::lent_lock`]: super::MemoryResource::lent_lock
pub trait LentLock {
    /// [`MemoryResource::allocate`](super::MemoryResource::allocate),
    /// applying `count` under the lock once a block is handed out (not for
    /// zero bytes, not on failure).
    fn allocate_counted(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        count: CallCount<'_>,
    ) -> Result<DevicePtr>;

    /// [`MemoryResource::deallocate`](super::MemoryResource::deallocate),
    /// applying `count` under the lock once the free is accepted (not for
    /// NULL, not for a refused free).
    fn deallocate_counted(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        count: CallCount<'_>,
    ) -> Result<()>;

    /// The number of locks lent (1 or more): counts are applied in cells
    /// 0 up to this.
    fn cells(&self) -> usize;

    /// Runs `f` holding every lock lent.
    fn locked(&self, f: &mut dyn FnMut());
}
