//! Suballocation: carving upstream regions into blocks, in pure arithmetic.
//!
//! This layer knows nothing of CUDA. It works on addresses and lengths only, so
//! it is exhaustively testable and the same code serves device, pinned and
//! managed memory. Every size and address is a multiple of 256 bytes.
//!
//! - [`size_class`]: the TLSF two-level size classes (≤ 6.25% rounding).
//! - [`block_arena`]: block metadata in a slab outside the managed memory
//!   (device memory cannot hold headers), indexed by `u32`.
//! - [`tlsf`]: a per-lane free-block index with two-level bitmaps: O(1) insert,
//!   remove and good-fit find.
//! - [`addr_table`]: the address → used block map (open addressing).
//! - [`heap`]: [`LaneHeap`], the engine of the stream-ordered pool. Regions are
//!   upstream allocations; free blocks belong to a *lane*: the global lane
//!   ([`LaneId::GLOBAL`]) holds blocks anyone may use, other lanes hold blocks
//!   freed on one stream and not yet safe for the others. Blocks merge only
//!   with neighbours free in the same lane; [`LaneHeap::move_lane`] hands a
//!   lane's blocks to another (the global lane once an event has completed, or
//!   a stream that waited on them) and merges them there.
//!
//! Costs: allocate and free are O(1) (a bitmap search, a split or two, one
//! hash-map operation); moving a lane costs O(blocks moved). Single-threaded:
//! the pool wraps a heap in its lock.

pub mod addr_table;
pub mod block_arena;
pub mod heap;
pub mod size_class;
pub mod tlsf;

#[cfg(test)]
mod heap_tests;
#[cfg(test)]
mod proptests;

pub use block_arena::{Block, BlockId, BlockState, LaneId};
pub use heap::{Allocation, HeapError, HeapStats, LaneHeap, RegionId};
pub(crate) use size_class::span_with_padding;
pub use size_class::GRANULE;
pub use tlsf::Tlsf;
