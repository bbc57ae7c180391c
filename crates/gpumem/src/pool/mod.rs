//! Stream-ordered pools: memory resources that cache blocks taken from an
//! upstream resource and hand them out again without a driver call.
//!
//! - [`PoolResource`]: coalescing best fit over TLSF lanes, O(1) whatever the
//!   number of free blocks, small and large requests in separate heaps, sized
//!   growth (no doubling), trim and release.
//! - [`FixedSizeResource`]: one block size, chunks of N blocks, O(1).
//! - [`BinningResource`]: routes each size to a bin (fixed-size bins or any
//!   resource), larger sizes to the upstream.
//! - [`CachingPool`]: power-of-two size classes from 512 B to 2 GiB and
//!   eighths of a doubling above, a lock per class, batched events for
//!   cross-stream reuse.
//! - [`ArenaResource`]: RMM's arena: per-stream arenas of superblocks over one
//!   global arena, address-ordered first fit, large requests in whole superblocks.
//! - [`SegmentPool`]: whole segments, one stream each, carved with PyTorch's
//!   caching allocator's rules; its layout can be saved and put back (CUDA
//!   graphs' private memory, PyTorch's graph trees).
//! - [`VirtualPool`]: on CUDA virtual memory management; TLSF lanes over one
//!   reserved address range, physical pages mapped only under live blocks and
//!   moved (unmapped, cached, re-mapped) to where they are needed, so the
//!   physical memory held follows the live bytes.
//!
//! # Stream ordering
//!
//! A block freed on stream S is reused on S at once; another stream gets it
//! once S's work up to the free is known done, or after it was made to wait
//! for S; no event per free. The policy and every stream decision of the
//! pools are in one component, `pool/stream_order/`.
//!
//! # Graph capture
//!
//! A block freed on a stream that is capturing a CUDA graph belongs to the
//! graph from then on: every pool checks the free as any other (the same
//! [`Error::InvalidFree`](crate::Error::InvalidFree) for a foreign or
//! interior pointer or a wrong size), then parks the block: it counts as
//! freed in the pool's live numbers, stays in its reserve, is never handed
//! out again while the pool lives, and a second free of it, during the
//! capture or after, is a double free. Graphs that should reuse their
//! temporaries belong in a [`GraphPool`](graph_pool::GraphPool).

mod arena;
mod binning;
mod caching_pool;
mod fixed_size;
pub mod graph_pool;
mod introspect;
mod live_blocks;
mod pool_resource;
mod pool_trait;
pub(crate) mod ptr_map;
mod segment_pool;
mod shards;
mod slab;
pub(crate) mod stream_order;
mod virtual_pool;
mod with_setters;

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
pub use segment_pool::{
    BlockInfo, Checkpoint, ClassCounters, Restored, SegmentInfo, SegmentPool, SegmentPoolConfig,
    SegmentPoolStats, SizeClass,
};
/// The lock shards, public only to the `loom` model check
/// (`tests/loom_shards.rs`, built with `--cfg loom`).
#[cfg(loom)]
pub use shards::{RegionOwners, Shards, SlotRegistry};
pub use shards::{Spread, BURST_WINDOW, CONTENDED_BURST};
pub use slab::ClassStats;
pub use virtual_pool::{
    Backup, ChunkClass, PhysExport, VirtualPool, VirtualPoolConfig, VirtualPoolStats, NO_REGION,
    VIRTUAL_POOL_MAX_ALIGNMENT,
};
