//! The upstream's pieces of an expandable heap's ranges that lie wholly in
//! one free block: what a recycle moves (`recycle.rs`) and what a trim gives
//! back (`release_pieces.rs`). One scan serves both, so the two agree on
//! which memory no block uses.

use crate::driver::DevicePtr;
use crate::resource::GrowInPlace;
use crate::suballoc::{BlockState, LaneHeap, LaneId, RegionId};

/// A piece of a heap's range that lies wholly in a free block.
#[derive(Debug, Clone, Copy)]
pub(super) struct FreePiece {
    /// The region holding it: `(id, base, bytes)`.
    pub(super) region: (RegionId, u64, usize),
    pub(super) addr: u64,
    pub(super) bytes: usize,
    /// The lane of the free block holding it.
    pub(super) lane: LaneId,
    /// Where that free block starts: pieces with the same start lie in the
    /// same block.
    pub(super) block: u64,
}

/// Every piece of `heap`'s ranges, in region and address order, that lies
/// wholly in a free block, other than in the block that ends at
/// `frontier_end` (the range's free end: a growth or a shrink takes it
/// there) and in region `skip`.
pub(super) fn free_pieces<'a>(
    heap: &'a LaneHeap,
    up: &'a dyn GrowInPlace,
    skip: Option<RegionId>,
    frontier_end: Option<u64>,
) -> impl Iterator<Item = FreePiece> + 'a {
    heap.regions()
        .filter(move |&(id, _, _)| Some(id) != skip)
        .flat_map(move |(id, base, size)| {
            let pieces = up
                .pieces(DevicePtr(base), size as usize)
                .unwrap_or_default();
            let mut blocks = heap.region_blocks(id).peekable();
            pieces.into_iter().filter_map(move |(at, bytes)| {
                let start = base + at as u64;
                let end = start + bytes as u64;
                while blocks.next_if(|(_, b)| b.end() <= start).is_some() {}
                let &(_, b) = blocks.peek()?;
                let BlockState::Free { lane } = b.state() else {
                    return None;
                };
                (b.addr() <= start && end <= b.end() && Some(b.end()) != frontier_end).then_some(
                    FreePiece {
                        region: (id, base, size as usize),
                        addr: start,
                        bytes,
                        lane,
                        block: b.addr(),
                    },
                )
            })
        })
}
