//! Stream-ordered pools: memory resources that cache blocks taken from an
//! upstream resource and hand them out again without a driver call.
//!
//! - [`PoolResource`]: coalescing best fit over TLSF lanes, O(1) whatever the
//!   number of free blocks, small and large requests in separate heaps, sized
//!   growth (no doubling), trim and release.
//! - [`FixedSizeResource`]: one block size, chunks of N blocks, O(1).
//! - [`BinningResource`]: routes each size to a bin (fixed-size bins or any
//!   resource), larger sizes to the upstream.
//! - [`CachingPool`]: power-of-two size classes from 512 B to 2 GiB, a lock
//!   per class, batched events for cross-stream reuse.
//! - [`ArenaResource`]: RMM's arena: per-stream arenas of superblocks over one
//!   global arena, address-ordered first fit, large requests in whole superblocks.
//! - [`VirtualPool`]: on CUDA virtual memory management; TLSF lanes over one
//!   reserved address range, physical pages mapped only under live blocks and
//!   moved (unmapped, cached, re-mapped) to where they are needed, so the
//!   physical memory held follows the live bytes.
//!
//! # Stream-ordering policy (every pool of this module follows it)
//!
//! A block freed on stream S is reusable at once by allocations on S: stream
//! order protects it, no event is needed. Another stream T gets it only
//! - once S's work up to the free is known complete: S found idle by a
//!   stream query, or an event recorded on S after the free has completed; or
//! - after T is made to wait for it (`cuStreamWaitEvent(T, event recorded on
//!   S after the free)`); the blocks then belong to T.
//!
//! There is no event per free: `cuEventRecord` (~290 ns) and
//! `cuStreamWaitEvent` (~220 ns) on an H100 (`bench/results/NOTES.md`)
//! exceed the whole budget of an operation. Events are recorded only on slow paths or once per stream per
//! batch of frees (sealed when a batch grows past its size, or by
//! `process_deferred`). A pool keeps a clone of the [`Stream`] of every
//! stream that has free blocks, so a stream the user drops is not destroyed
//! while its blocks sit free (its handle stays valid for queries and
//! records); a foreign stream whose query fails is handled by
//! synchronizing the device before its blocks are reused.
//!
//! Out of memory: every pool first waits for the streams that freed its
//! cached blocks, gives entirely free chunks back to its upstream and retries;
//! then it fails with [`Error::OutOfMemory`](crate::Error::OutOfMemory)
//! carrying the requested, reserved and live bytes and the largest free block.
//! Dropping a pool gives all its upstream memory back.
//!
//! [`Stream`]: crate::Stream

mod arena;
mod binning;
mod caching_pool;
mod fixed_size;
mod heap_lanes;
mod pool_resource;
mod pool_trait;
mod slab;
pub(crate) mod stream_lanes;
mod virtual_pool;

pub use arena::{ArenaConfig, ArenaResource, ArenaStats};
/// The arena's superblock directory, public only to the `loom` model check
/// (`tests/loom_arena.rs`, built with `--cfg loom`).
#[cfg(loom)]
pub use arena::{OwnerWord, SuperblockDirectory};
pub use binning::{BinningConfig, BinningResource};
pub use caching_pool::{CachingPool, CachingPoolConfig, CachingPoolStats};
pub use fixed_size::{FixedSizeConfig, FixedSizeResource, DEFAULT_BATCH_SIZE, DEFAULT_CHUNK_BYTES};
pub use pool_resource::{GrowthPolicy, PoolConfig, PoolResource, PoolStats, POOL_MAX_ALIGNMENT};
pub use pool_trait::Pool;
pub use slab::ClassStats;
pub use virtual_pool::{
    PhysExport, VirtualPool, VirtualPoolConfig, VirtualPoolStats, VIRTUAL_POOL_MAX_ALIGNMENT,
};
