//! Block metadata kept outside the managed memory.
//!
//! Algorithm: a slab — a `Vec<Block>` addressed by `u32` indices, with vacant
//! slots chained through a free-slot list so that splitting and merging reuse
//! slots instead of allocating. Device memory cannot hold headers, so every
//! block's address, size, physical neighbours, free-list links, region and
//! state live here. Cost: O(1) per block created or released; no allocation
//! once the slab has grown to the peak number of blocks.

/// Index of "no block" in every link field.
pub(crate) const NIL: u32 = u32::MAX;

/// Lane value stored in a used block.
const USED: u32 = u32::MAX;
/// Lane value stored in a vacant slab slot.
const VACANT: u32 = u32::MAX - 1;

/// Identifies a lane: a set of free blocks with its own size-class index.
///
/// Lane 0 ([`LaneId::GLOBAL`]) holds free blocks anyone may use; other lanes
/// hold blocks freed on one stream and not yet safe for others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LaneId(pub(crate) u32);

impl LaneId {
    /// The global lane: free blocks any stream may use.
    pub const GLOBAL: LaneId = LaneId(0);
}

/// Identifies a block slot in the arena. Valid until the block is merged into a
/// neighbour or its region is removed; after that the slot may be reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BlockId(pub u32);

/// Whether a block is handed out or free (and in which lane).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockState {
    /// Handed out by an allocation and not yet freed.
    Used,
    /// Free, filed in the given lane's index.
    Free {
        /// The lane whose index holds the block.
        lane: LaneId,
    },
    /// An empty slab slot, holding no block.
    Vacant,
}

/// Metadata of one block: a contiguous range `[addr, addr + size)` of a region.
///
/// 40 bytes: two `u64` and six `u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    /// Previous block by address within the region, or [`NIL`].
    pub(crate) prev_phys: u32,
    /// Next block by address within the region, or [`NIL`].
    pub(crate) next_phys: u32,
    /// Previous block in the same free list, or [`NIL`]. For vacant slots,
    /// unused. For a used block, which is in no list: its tag (0 unless the
    /// heap's owner set one, see [`LaneHeap::set_tag`](super::LaneHeap::set_tag)).
    pub(crate) prev_free: u32,
    /// Next block in the same free list, or [`NIL`]. For vacant slots, the next
    /// vacant slot.
    pub(crate) next_free: u32,
    /// Index of the region holding the block.
    pub(crate) region: u32,
    /// Lane of a free block, or `USED`, or `VACANT`.
    pub(crate) lane: u32,
}

impl Block {
    /// First byte of the block.
    #[inline]
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes (a multiple of 256).
    #[inline]
    pub fn size(&self) -> u64 {
        self.size
    }
    /// One past the last byte.
    #[inline]
    pub fn end(&self) -> u64 {
        self.addr + self.size
    }
    /// Index of the region slot holding the block.
    #[inline]
    pub fn region_index(&self) -> u32 {
        self.region
    }
    /// Previous block by address in the same region.
    #[inline]
    pub fn prev_phys(&self) -> Option<BlockId> {
        (self.prev_phys != NIL).then_some(BlockId(self.prev_phys))
    }
    /// Next block by address in the same region.
    #[inline]
    pub fn next_phys(&self) -> Option<BlockId> {
        (self.next_phys != NIL).then_some(BlockId(self.next_phys))
    }
    /// Used, free in a lane, or vacant.
    #[inline]
    pub fn state(&self) -> BlockState {
        match self.lane {
            USED => BlockState::Used,
            VACANT => BlockState::Vacant,
            l => BlockState::Free { lane: LaneId(l) },
        }
    }
    /// True when the block is free in `lane`.
    #[inline]
    pub fn is_free_in(&self, lane: u32) -> bool {
        self.lane == lane
    }
    /// True when the block is handed out.
    #[inline]
    pub fn is_used(&self) -> bool {
        self.lane == USED
    }
    /// The tag of a used block (0 unless set; meaningless for other blocks).
    #[inline]
    pub fn tag(&self) -> u32 {
        self.prev_free
    }
    /// Marks the block handed out, with tag 0.
    #[inline]
    pub(crate) fn set_used(&mut self) {
        self.lane = USED;
        self.prev_free = 0;
    }
    #[inline]
    pub(crate) fn is_vacant(&self) -> bool {
        self.lane == VACANT
    }
}

/// The largest lane number a lane may have (the two top values encode states).
pub(crate) const MAX_LANE: u32 = u32::MAX - 2;

/// A slab of [`Block`]s with `u32` indices and a free-slot list.
#[derive(Debug, Default, Clone)]
pub struct BlockArena {
    blocks: Vec<Block>,
    vacant_head: u32,
    live: usize,
}

impl BlockArena {
    /// An empty arena.
    pub fn new() -> Self {
        Self {
            blocks: Vec::new(),
            vacant_head: NIL,
            live: 0,
        }
    }

    /// Creates a used block and returns its index. Reuses a vacant slot when
    /// there is one; otherwise grows the slab (amortised O(1)).
    ///
    /// Returns `None` when the slab already holds 2^32 − 2 slots.
    #[inline(always)]
    pub fn create(&mut self, addr: u64, size: u64, region: u32) -> Option<u32> {
        let b = Block {
            addr,
            size,
            prev_phys: NIL,
            next_phys: NIL,
            prev_free: NIL,
            next_free: NIL,
            region,
            lane: USED,
        };
        self.live += 1;
        if self.vacant_head != NIL {
            let i = self.vacant_head;
            self.vacant_head = self.blocks[i as usize].next_free;
            self.blocks[i as usize] = b;
            Some(i)
        } else {
            let i = self.blocks.len();
            if i >= NIL as usize - 1 {
                self.live -= 1;
                return None;
            }
            self.blocks.push(b);
            Some(i as u32)
        }
    }

    /// Returns the slot `i` to the free-slot list.
    #[inline]
    pub fn release(&mut self, i: u32) {
        let b = &mut self.blocks[i as usize];
        debug_assert!(!b.is_vacant());
        b.lane = VACANT;
        b.next_free = self.vacant_head;
        self.vacant_head = i;
        self.live -= 1;
    }

    /// The block in slot `i`, if the slot exists (it may be vacant).
    #[inline]
    pub fn get(&self, i: u32) -> Option<&Block> {
        self.blocks.get(i as usize)
    }

    /// Number of blocks (not vacant slots).
    #[inline]
    pub fn len(&self) -> usize {
        self.live
    }

    /// True when no block exists.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Number of slots, vacant ones included.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.blocks.len()
    }
}

impl std::ops::Index<u32> for BlockArena {
    type Output = Block;
    #[inline]
    fn index(&self, i: u32) -> &Block {
        &self.blocks[i as usize]
    }
}

impl std::ops::IndexMut<u32> for BlockArena {
    #[inline]
    fn index_mut(&mut self, i: u32) -> &mut Block {
        &mut self.blocks[i as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_is_small() {
        assert!(std::mem::size_of::<Block>() <= 48);
        assert_eq!(std::mem::size_of::<Block>(), 40);
    }

    #[test]
    fn slots_are_reused() {
        let mut a = BlockArena::new();
        let x = a.create(0, 256, 0).unwrap();
        let y = a.create(256, 256, 0).unwrap();
        assert_eq!(a.len(), 2);
        a.release(x);
        assert_eq!(a[x].state(), BlockState::Vacant);
        let z = a.create(512, 256, 0).unwrap();
        assert_eq!(z, x);
        assert_eq!(a.capacity(), 2);
        assert_eq!(a[z].state(), BlockState::Used);
        assert_eq!(a[y].addr(), 256);
        assert_eq!(a[z].end(), 768);
    }
}
