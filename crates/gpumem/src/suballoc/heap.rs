//! `LaneHeap`: regions carved into blocks, free blocks filed by lane.
//!
//! Algorithm: every region (an upstream allocation) starts as one free block in
//! the global lane. Blocks live in a [`BlockArena`] and are chained by address
//! within their region; each lane files its free blocks in its own [`Tlsf`].
//! `allocate` finds a block in O(1) (TLSF good fit), splits off any alignment
//! padding at the front and any remainder at the back (both stay free in the
//! lane) and records the block in an address → block hash map. `free` takes the
//! block out of the map (one hash), and merges it with its physical neighbours
//! that are free *in the same lane*, O(1). `move_lane` refiles every free block
//! of one lane in another, merging as it goes: O(blocks moved). Bad frees are
//! diagnosed on a cold path that walks the region's blocks.

use std::collections::BTreeMap;

use super::addr_table::AddrTable;
use super::block_arena::{Block, BlockArena, BlockId, BlockState, LaneId, MAX_LANE, NIL};
use super::size_class::{round_to_granule, GRANULE};
use super::tlsf::Tlsf;

/// Identifies a region. Ids are not confused after removal: a removed region's
/// slot is reused with a new generation, so a stale id is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RegionId {
    index: u32,
    generation: u32,
}

impl RegionId {
    /// The slot number of the region (what [`Block::region_index`] reports).
    pub fn index(self) -> u32 {
        self.index
    }
}

/// A block handed out by [`LaneHeap::allocate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// First byte; a multiple of the requested alignment (and of 256).
    pub addr: u64,
    /// Bytes the block holds: the request rounded up to 256, plus any
    /// remainder too small to split off (below the heap's minimum split).
    pub size: u64,
    /// The block's slot, valid until it is freed.
    pub block: BlockId,
}

/// Counters of a [`LaneHeap`], all lanes together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Bytes of all regions.
    pub region_bytes: u64,
    /// Number of regions.
    pub regions: usize,
    /// Bytes in used blocks.
    pub used_bytes: u64,
    /// Number of used blocks.
    pub used_blocks: usize,
    /// Bytes in free blocks, all lanes.
    pub free_bytes: u64,
    /// Number of free blocks, all lanes.
    pub free_blocks: u64,
    /// Largest free block in any lane.
    pub largest_free: u64,
    /// Number of lanes, the global one included.
    pub lanes: usize,
}

/// Why a [`LaneHeap`] call was refused. Nothing changes when one is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HeapError {
    /// The address is not the start of any block.
    #[error("address {0:#x} was not handed out by this heap")]
    UnknownAddress(u64),
    /// The address is the start of a block that is already free.
    #[error("address {0:#x} is already free (double free)")]
    DoubleFree(u64),
    /// The lane does not exist (never created, or dropped).
    #[error("lane {} does not exist", .0 .0)]
    NoSuchLane(LaneId),
    /// The lane still holds free blocks.
    #[error("lane {} still holds free blocks", .0 .0)]
    LaneNotEmpty(LaneId),
    /// The global lane cannot be dropped.
    #[error("the global lane cannot be dropped")]
    GlobalLane,
    /// No more lane numbers are available.
    #[error("too many lanes")]
    TooManyLanes,
    /// The region does not exist (never added, or removed).
    #[error("no such region")]
    NoSuchRegion(RegionId),
    /// The region is not one free block in the global lane.
    #[error("region is not entirely free in the global lane")]
    RegionNotFree(RegionId),
    /// The region is empty, misaligned, or ends past the address space.
    #[error(
        "bad region base {base:#x} size {size}: must be non-empty multiples of 256 within u64"
    )]
    BadRegion {
        /// Base asked for.
        base: u64,
        /// Size asked for.
        size: u64,
    },
    /// The region overlaps one already added.
    #[error("region base {base:#x} size {size} overlaps an existing region")]
    RegionOverlap {
        /// Base asked for.
        base: u64,
        /// Size asked for.
        size: u64,
    },
    /// The block id names no block, or a used block.
    #[error("block {} is not a free block", .0 .0)]
    BlockNotFree(BlockId),
    /// The block arena is full (2^32 − 2 blocks).
    #[error("too many blocks")]
    TooManyBlocks,
    /// The address starts a used block of another size than the one freed.
    #[error("address {addr:#x} is a block of {block} bytes, freed as {freed}")]
    SizeMismatch {
        /// Address freed.
        addr: u64,
        /// Bytes the block holds.
        block: u64,
        /// Bytes the free named.
        freed: u64,
    },
}

impl HeapError {
    /// The crate-level reason for a rejected free, when this is one.
    pub fn free_reason(self) -> Option<crate::FreeError> {
        match self {
            HeapError::UnknownAddress(_) => Some(crate::FreeError::Unknown),
            HeapError::DoubleFree(_) => Some(crate::FreeError::DoubleFree),
            HeapError::SizeMismatch { block, freed, .. } => Some(crate::FreeError::SizeMismatch {
                allocated: block as usize,
                freed: freed as usize,
            }),
            _ => None,
        }
    }

    /// The error of a rejected free of `ptr`: [`crate::Error::InvalidFree`]
    /// with [`HeapError::free_reason`] (an unknown pointer otherwise).
    #[cold]
    #[inline(never)]
    pub(crate) fn into_invalid_free(self, ptr: u64) -> crate::Error {
        crate::Error::InvalidFree {
            ptr,
            reason: self.free_reason().unwrap_or(crate::FreeError::Unknown),
        }
    }
}

#[derive(Debug, Clone)]
struct RegionSlot {
    base: u64,
    size: u64,
    /// The lowest block of the region. Never changes: splits keep the front
    /// part in the original slot and merges keep the lower block.
    first: u32,
    /// A block of the region from which the walk to its last block starts
    /// (see [`LaneHeap::tail_of`]): the last block when it was set, and
    /// still one of the region's blocks unless its slot went vacant.
    last_hint: u32,
    generation: u32,
    live: bool,
}

/// The suballocation engine: regions, lanes of free blocks, O(1) allocate and
/// free. Single-threaded; wrap it in a lock to share it.
///
/// ```
/// use gpumem::suballoc::{LaneHeap, LaneId};
/// let mut h = LaneHeap::new();
/// let r = h.add_region(1 << 20, 1 << 20).unwrap();
/// let a = h.allocate(LaneId::GLOBAL, 1000, 256).unwrap();
/// assert_eq!((a.addr, a.size), (1 << 20, 1024));
/// let s = h.create_lane().unwrap();
/// h.free(a.addr, s).unwrap(); // free but owned by lane `s`
/// assert!(!h.region_is_free(r));
/// h.move_lane(s, LaneId::GLOBAL).unwrap(); // now safe for everyone: merged
/// assert_eq!(h.remove_region(r), Ok((1 << 20, 1 << 20)));
/// ```
#[derive(Debug, Clone)]
pub struct LaneHeap {
    arena: BlockArena,
    lanes: Vec<Option<Tlsf>>,
    vacant_lanes: Vec<u32>,
    regions: Vec<RegionSlot>,
    vacant_regions: Vec<u32>,
    by_base: BTreeMap<u64, u32>,
    used: AddrTable,
    used_bytes: u64,
    region_bytes: u64,
    min_split: u64,
}

impl Default for LaneHeap {
    fn default() -> Self {
        Self::new()
    }
}

/// Splits block `i` at `at` bytes: `i` keeps the front, the returned new block
/// (state Used, no free links) the back. `None` when the arena is full.
#[inline(always)]
fn split(arena: &mut BlockArena, i: u32, at: u64) -> Option<u32> {
    let b = arena[i];
    debug_assert!(at > 0 && at < b.size);
    let j = arena.create(b.addr + at, b.size - at, b.region)?;
    arena[j].prev_phys = i;
    arena[j].next_phys = b.next_phys;
    if b.next_phys != NIL {
        arena[b.next_phys].prev_phys = j;
    }
    arena[i].next_phys = j;
    arena[i].size = at;
    Some(j)
}

/// True when a used block of `block` bytes is what a request of `bytes`
/// gets: the request rounded up to the granule, plus a remainder below
/// `min_split` that was not split off. (A split fails only when the block
/// arena is full, at 2^32 blocks.)
#[inline(always)]
fn block_holds(block: u64, bytes: u64, min_split: u64) -> bool {
    bytes != 0
        && round_to_granule(bytes).is_some_and(|need| need <= block && block - need < min_split)
}

/// After `addr` (block `i`, of `block` bytes) was taken out of `used` for a
/// free of `bytes`: when that is not the block's size, puts it back (the
/// block stays used) and says so.
#[inline(always)]
fn keep_if_wrong_size(
    used: &mut AddrTable,
    addr: u64,
    i: u32,
    block: u64,
    bytes: Option<u64>,
    min_split: u64,
) -> Result<(), HeapError> {
    match bytes {
        Some(freed) if !block_holds(block, freed, min_split) => {
            Err(put_back(used, addr, i, block, freed))
        }
        _ => Ok(()),
    }
}

/// The wrong-size branch of [`keep_if_wrong_size`], out of the free path.
#[cold]
#[inline(never)]
fn put_back(used: &mut AddrTable, addr: u64, i: u32, block: u64, freed: u64) -> HeapError {
    used.insert(addr, i);
    HeapError::SizeMismatch { addr, block, freed }
}

/// Merges `b` (the next block by address) into `a` and releases `b`'s slot.
#[inline(always)]
fn merge(arena: &mut BlockArena, a: u32, b: u32) {
    let (bsize, bnext) = (arena[b].size, arena[b].next_phys);
    arena[a].size += bsize;
    arena[a].next_phys = bnext;
    if bnext != NIL {
        arena[bnext].prev_phys = a;
    }
    arena.release(b);
}

/// Files block `i` (in no index) as free in `lane` of index `t`, merging it with
/// neighbours free in that lane. Returns the index of the resulting block.
#[inline(always)]
fn file_free(arena: &mut BlockArena, t: &mut Tlsf, mut i: u32, lane: u32) -> u32 {
    let prev = arena[i].prev_phys;
    if prev != NIL && arena[prev].is_free_in(lane) {
        t.remove(arena, prev);
        merge(arena, prev, i);
        i = prev;
    }
    let next = arena[i].next_phys;
    if next != NIL && arena[next].is_free_in(lane) {
        t.remove(arena, next);
        merge(arena, i, next);
    }
    arena[i].lane = lane;
    t.insert(arena, i);
    i
}

impl LaneHeap {
    /// An empty heap with the global lane and a minimum split of 256 bytes.
    pub fn new() -> Self {
        Self::with_min_split(GRANULE)
    }

    /// An empty heap that leaves a remainder inside the allocated block rather
    /// than splitting it off when the remainder is below `min_split` bytes
    /// (rounded up to a multiple of 256, at least 256).
    pub fn with_min_split(min_split: u64) -> Self {
        let min_split = round_to_granule(min_split.max(GRANULE)).unwrap_or(u64::MAX);
        Self {
            arena: BlockArena::new(),
            lanes: vec![Some(Tlsf::new())],
            vacant_lanes: Vec::new(),
            regions: Vec::new(),
            vacant_regions: Vec::new(),
            by_base: BTreeMap::new(),
            used: AddrTable::new(),
            used_bytes: 0,
            region_bytes: 0,
            min_split: min_split.max(GRANULE),
        }
    }

    /// The minimum remainder split off an allocated block.
    pub fn min_split(&self) -> u64 {
        self.min_split
    }

    // ----- regions -----

    /// Adds an upstream allocation `[base, base + size)` as one free block in
    /// the global lane. `base` and `size` must be multiples of 256, `size`
    /// non-zero, the end within u64, and the range must not overlap another
    /// region. O(log regions).
    pub fn add_region(&mut self, base: u64, size: u64) -> Result<RegionId, HeapError> {
        let end = base.checked_add(size);
        if size == 0
            || !base.is_multiple_of(GRANULE)
            || !size.is_multiple_of(GRANULE)
            || end.is_none()
        {
            return Err(HeapError::BadRegion { base, size });
        }
        let end = end.unwrap_or(u64::MAX);
        if let Some((_, &r)) = self.by_base.range(..end).next_back() {
            let r = &self.regions[r as usize];
            if r.base + r.size > base {
                return Err(HeapError::RegionOverlap { base, size });
            }
        }
        let index = self.next_region_index()?;
        let first = self
            .arena
            .create(base, size, index)
            .ok_or(HeapError::TooManyBlocks)?;
        let id = self.fill_region_slot(index, base, size, first, first);
        self.region_bytes += size;
        if let Some(g) = self.lanes[0].as_mut() {
            file_free(&mut self.arena, g, first, 0);
        }
        Ok(id)
    }

    /// The slot the next region takes.
    fn next_region_index(&self) -> Result<u32, HeapError> {
        match self.vacant_regions.last() {
            Some(&i) => Ok(i),
            None if self.regions.len() < u32::MAX as usize => Ok(self.regions.len() as u32),
            None => Err(HeapError::TooManyBlocks),
        }
    }

    /// Fills slot `index` (from [`next_region_index`](Self::next_region_index))
    /// with a live region and files its base.
    fn fill_region_slot(
        &mut self,
        index: u32,
        base: u64,
        size: u64,
        first: u32,
        last: u32,
    ) -> RegionId {
        let generation = if (index as usize) < self.regions.len() {
            self.vacant_regions.pop();
            let slot = &mut self.regions[index as usize];
            *slot = RegionSlot {
                base,
                size,
                first,
                last_hint: last,
                generation: slot.generation,
                live: true,
            };
            slot.generation
        } else {
            self.regions.push(RegionSlot {
                base,
                size,
                first,
                last_hint: last,
                generation: 0,
                live: true,
            });
            0
        };
        self.by_base.insert(base, index);
        RegionId { index, generation }
    }

    fn region_slot(&self, id: RegionId) -> Option<&RegionSlot> {
        self.regions
            .get(id.index as usize)
            .filter(|r| r.live && r.generation == id.generation)
    }

    /// True when the region is one free block in the global lane (and so may be
    /// removed). False for an unknown region. O(1).
    pub fn region_is_free(&self, id: RegionId) -> bool {
        self.region_slot(id).is_some_and(|r| {
            let b = &self.arena[r.first];
            b.size == r.size && b.is_free_in(LaneId::GLOBAL.0)
        })
    }

    /// Removes a region that is one free block in the global lane and returns
    /// its `(base, size)` for the caller to give back upstream. O(log regions).
    pub fn remove_region(&mut self, id: RegionId) -> Result<(u64, u64), HeapError> {
        if self.region_slot(id).is_none() {
            return Err(HeapError::NoSuchRegion(id));
        }
        if !self.region_is_free(id) {
            return Err(HeapError::RegionNotFree(id));
        }
        let slot = &mut self.regions[id.index as usize];
        let (base, size, first) = (slot.base, slot.size, slot.first);
        slot.live = false;
        slot.generation = slot.generation.wrapping_add(1);
        self.vacant_regions.push(id.index);
        if let Some(g) = self.lanes[0].as_mut() {
            g.remove(&mut self.arena, first);
        }
        self.arena.release(first);
        self.by_base.remove(&base);
        self.region_bytes -= size;
        Ok((base, size))
    }

    /// The last block of region slot `index`: the address chain walked from
    /// the region's hint, which merges and splits do not keep (they would
    /// cost the hot path a branch), so the walk is O(blocks after it).
    fn tail_of(&self, index: u32) -> u32 {
        let r = &self.regions[index as usize];
        let hint = self
            .arena
            .get(r.last_hint)
            .filter(|b| b.region == index && !matches!(b.state(), BlockState::Vacant))
            .map_or(r.first, |_| r.last_hint);
        let mut i = hint;
        while self.arena[i].next_phys != NIL {
            i = self.arena[i].next_phys;
        }
        i
    }

    /// The last block of a region (the one ending at its end), or `None`
    /// for an unknown region. O(blocks after the last one found).
    pub fn region_tail(&self, id: RegionId) -> Option<(BlockId, Block)> {
        self.region_slot(id)?;
        let i = self.tail_of(id.index);
        Some((BlockId(i), self.arena[i]))
    }

    /// Grows a region in place by `extra` bytes at its end: the memory
    /// `[end, end + extra)` (which the caller has made usable, an upstream
    /// allocation grown where it lies) becomes a free block in the global
    /// lane, merged with the region's last block when that is free there.
    /// `extra` must be a non-zero multiple of 256 and the grown region must
    /// not reach another region. O(log regions) plus the walk of
    /// [`region_tail`](Self::region_tail).
    pub fn extend_region(&mut self, id: RegionId, extra: u64) -> Result<(), HeapError> {
        let (base, size) = self
            .region_slot(id)
            .map(|r| (r.base, r.size))
            .ok_or(HeapError::NoSuchRegion(id))?;
        let end = base + size;
        let bad = HeapError::BadRegion {
            base: end,
            size: extra,
        };
        let new_end = end.checked_add(extra).ok_or(bad)?;
        if extra == 0 || !extra.is_multiple_of(GRANULE) {
            return Err(bad);
        }
        if self.by_base.range(end..new_end).next().is_some() {
            return Err(HeapError::RegionOverlap {
                base: end,
                size: extra,
            });
        }
        let tail = self.tail_of(id.index);
        let j = self
            .arena
            .create(end, extra, id.index)
            .ok_or(HeapError::TooManyBlocks)?;
        self.arena[j].prev_phys = tail;
        self.arena[tail].next_phys = j;
        let slot = &mut self.regions[id.index as usize];
        slot.size += extra;
        self.region_bytes += extra;
        if let Some(g) = self.lanes[0].as_mut() {
            let merged = file_free(&mut self.arena, g, j, 0);
            self.regions[id.index as usize].last_hint = merged;
        }
        Ok(())
    }

    /// Shrinks a region in place to its first `size` bytes, for the caller
    /// to give `[base + size, end)` back upstream. That range must lie in
    /// the region's last block, free in the global lane
    /// ([`HeapError::RegionNotFree`] otherwise); `size` must be a non-zero
    /// multiple of 256 below the region's size (to drop a whole region, use
    /// [`remove_region`](Self::remove_region)). Returns the bytes cut off.
    pub fn shrink_region(&mut self, id: RegionId, size: u64) -> Result<u64, HeapError> {
        let (base, old) = self
            .region_slot(id)
            .map(|r| (r.base, r.size))
            .ok_or(HeapError::NoSuchRegion(id))?;
        if size == 0 || !size.is_multiple_of(GRANULE) || size >= old {
            return Err(HeapError::BadRegion { base, size });
        }
        let cut = base + size;
        let tail = self.tail_of(id.index);
        let t = self.arena[tail];
        if !t.is_free_in(LaneId::GLOBAL.0) || t.addr > cut {
            return Err(HeapError::RegionNotFree(id));
        }
        let Some(g) = self.lanes[0].as_mut() else {
            return Err(HeapError::RegionNotFree(id));
        };
        g.remove(&mut self.arena, tail);
        let last = if t.addr == cut {
            let prev = t.prev_phys;
            self.arena[prev].next_phys = NIL;
            self.arena.release(tail);
            prev
        } else {
            let j = split(&mut self.arena, tail, cut - t.addr);
            if let Some(j) = j {
                self.arena[tail].next_phys = NIL;
                self.arena.release(j);
            }
            g.insert(&mut self.arena, tail);
            if j.is_none() {
                return Err(HeapError::TooManyBlocks);
            }
            tail
        };
        let slot = &mut self.regions[id.index as usize];
        slot.size = size;
        slot.last_hint = last;
        self.region_bytes -= old - size;
        Ok(old - size)
    }

    /// Splits a region in two at address `at` (inside it, a multiple of
    /// 256): the region keeps `[base, at)` and `[at, end)` becomes a new
    /// region, returned, with the blocks there. `at` must fall between two
    /// blocks or inside a free block, which splits into two free blocks of
    /// its lane ([`HeapError::RegionNotFree`] when a used block spans it).
    /// For a caller whose upstream split the memory the same way (a range
    /// cut in two). Nothing changes on an error. O(blocks in the region).
    pub fn split_region(&mut self, id: RegionId, at: u64) -> Result<RegionId, HeapError> {
        let (base, size, first) = self
            .region_slot(id)
            .map(|r| (r.base, r.size, r.first))
            .ok_or(HeapError::NoSuchRegion(id))?;
        if at <= base || at - base >= size || !at.is_multiple_of(GRANULE) {
            return Err(HeapError::BadRegion { base: at, size: 0 });
        }
        let index = self.next_region_index()?;
        let mut i = first;
        while self.arena[i].end() <= at {
            i = self.arena[i].next_phys;
        }
        let b = self.arena[i];
        let start = if b.addr == at {
            i
        } else {
            let BlockState::Free { lane } = b.state() else {
                return Err(HeapError::RegionNotFree(id));
            };
            let Some(t) = self.lanes[lane.0 as usize].as_mut() else {
                return Err(HeapError::NoSuchLane(lane));
            };
            t.remove(&mut self.arena, i);
            let Some(j) = split(&mut self.arena, i, at - b.addr) else {
                t.insert(&mut self.arena, i);
                return Err(HeapError::TooManyBlocks);
            };
            t.insert(&mut self.arena, i);
            self.arena[j].lane = lane.0;
            t.insert(&mut self.arena, j);
            j
        };
        let prev = self.arena[start].prev_phys;
        self.arena[prev].next_phys = NIL;
        self.arena[start].prev_phys = NIL;
        let mut last = start;
        loop {
            self.arena[last].region = index;
            match self.arena[last].next_phys {
                NIL => break,
                next => last = next,
            }
        }
        let slot = &mut self.regions[id.index as usize];
        slot.size = at - base;
        slot.last_hint = prev;
        Ok(self.fill_region_slot(index, at, base + size - at, start, last))
    }

    /// Every region as `(id, base, size)`, in slot order. O(region slots).
    pub fn regions(&self) -> impl Iterator<Item = (RegionId, u64, u64)> + '_ {
        self.regions
            .iter()
            .enumerate()
            .filter(|(_, r)| r.live)
            .map(|(i, r)| {
                let id = RegionId {
                    index: i as u32,
                    generation: r.generation,
                };
                (id, r.base, r.size)
            })
    }

    /// The regions that [`region_is_free`](Self::region_is_free), as
    /// `(id, base, size)`: those a trim may remove. O(region slots).
    pub fn free_regions(&self) -> impl Iterator<Item = (RegionId, u64, u64)> + '_ {
        self.regions().filter(|&(id, _, _)| self.region_is_free(id))
    }

    /// The region containing `addr`, if any. O(log regions).
    pub fn region_of(&self, addr: u64) -> Option<RegionId> {
        let (_, &i) = self.by_base.range(..=addr).next_back()?;
        let r = &self.regions[i as usize];
        (addr - r.base < r.size).then_some(RegionId {
            index: i,
            generation: r.generation,
        })
    }

    /// The blocks of a region in address order (empty for an unknown region).
    /// O(blocks in the region).
    pub fn region_blocks(&self, id: RegionId) -> impl Iterator<Item = (BlockId, Block)> + '_ {
        let mut i = self.region_slot(id).map_or(NIL, |r| r.first);
        std::iter::from_fn(move || {
            if i == NIL {
                return None;
            }
            let b = self.arena[i];
            let out = (BlockId(i), b);
            i = b.next_phys;
            Some(out)
        })
    }

    /// Every used block as `(addr, size)`, region by region in slot order,
    /// each region's blocks in address order. O(blocks).
    pub fn used_ranges(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.regions().flat_map(move |(id, _, _)| {
            self.region_blocks(id)
                .filter(|(_, b)| matches!(b.state(), BlockState::Used))
                .map(|(_, b)| (b.addr, b.size))
        })
    }

    /// Every used block carrying `tag` as `(addr, size)`, in the order of
    /// [`LaneHeap::used_ranges`]. O(blocks).
    pub fn tagged_ranges(&self, tag: u32) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.regions().flat_map(move |(id, _, _)| {
            self.region_blocks(id)
                .filter(move |(_, b)| b.is_used() && b.tag() == tag)
                .map(|(_, b)| (b.addr, b.size))
        })
    }

    /// Gives the used block `block` the tag `tag`, a number the heap keeps
    /// for its owner (every used block starts with 0). Nothing happens for a
    /// block that is not used. O(1): one store in the block's entry.
    #[inline]
    pub fn set_tag(&mut self, block: BlockId, tag: u32) {
        if let Some(b) = self.arena.get(block.0) {
            if b.is_used() {
                self.arena[block.0].prev_free = tag;
            }
        }
    }

    /// The tag of the used block starting at `addr`, if there is one. O(1).
    pub fn used_tag(&self, addr: u64) -> Option<u32> {
        self.used_block(addr)
            .and_then(|id| self.block(id))
            .map(|b| b.tag())
    }

    /// The size of the used block starting at `addr`, if there is one. O(1).
    pub fn used_size(&self, addr: u64) -> Option<u64> {
        self.used_block(addr)
            .and_then(|id| self.block(id))
            .map(|b| b.size)
    }

    // ----- lanes -----

    /// Creates an empty lane (reusing a dropped lane's number). O(1) amortised.
    pub fn create_lane(&mut self) -> Result<LaneId, HeapError> {
        if let Some(l) = self.vacant_lanes.pop() {
            self.lanes[l as usize] = Some(Tlsf::new());
            return Ok(LaneId(l));
        }
        let l = self.lanes.len();
        if l > MAX_LANE as usize {
            return Err(HeapError::TooManyLanes);
        }
        self.lanes.push(Some(Tlsf::new()));
        Ok(LaneId(l as u32))
    }

    /// Drops an empty lane other than the global one. O(1).
    pub fn drop_lane(&mut self, lane: LaneId) -> Result<(), HeapError> {
        if lane == LaneId::GLOBAL {
            return Err(HeapError::GlobalLane);
        }
        let t = self.lane(lane)?;
        if !t.is_empty() {
            return Err(HeapError::LaneNotEmpty(lane));
        }
        self.lanes[lane.0 as usize] = None;
        self.vacant_lanes.push(lane.0);
        Ok(())
    }

    /// True when the lane exists.
    pub fn has_lane(&self, lane: LaneId) -> bool {
        self.lane(lane).is_ok()
    }

    fn lane(&self, lane: LaneId) -> Result<&Tlsf, HeapError> {
        match self.lanes.get(lane.0 as usize) {
            Some(Some(t)) => Ok(t),
            _ => Err(HeapError::NoSuchLane(lane)),
        }
    }

    /// Bytes of the free blocks in `lane` (0 for no such lane). O(1).
    pub fn lane_free_bytes(&self, lane: LaneId) -> u64 {
        self.lane(lane).map_or(0, |t| t.free_bytes())
    }

    /// Number of free blocks in `lane` (0 for no such lane). O(1).
    pub fn lane_block_count(&self, lane: LaneId) -> u64 {
        self.lane(lane).map_or(0, |t| t.block_count())
    }

    /// Size of the largest free block in `lane` (0 when empty or no such lane).
    /// Scans the lane's top non-empty size class.
    pub fn largest_free(&self, lane: LaneId) -> u64 {
        self.lane(lane).map_or(0, |t| t.largest(&self.arena))
    }

    /// The existing lanes, global first. O(lane slots).
    pub fn lanes(&self) -> impl Iterator<Item = LaneId> + '_ {
        self.lanes
            .iter()
            .enumerate()
            .filter(|(_, t)| t.is_some())
            .map(|(i, _)| LaneId(i as u32))
    }

    // ----- allocate and free -----

    /// Takes a block of at least `size` bytes (rounded up to 256; 0 counts as
    /// 256) aligned to `align` (a power of two; below 256 counts as 256) from
    /// the free blocks of `lane`. `None` when the lane has no block that fits,
    /// the lane does not exist, `align` is not a power of two, or the numbers
    /// overflow. O(1), plus one split for alignment padding.
    #[inline]
    pub fn allocate(&mut self, lane: LaneId, size: u64, align: u64) -> Option<Allocation> {
        self.allocate_with(lane, size, align, false, NIL)
    }

    /// Like [`allocate`](Self::allocate), but first tries the free blocks of
    /// the request's own size class (see [`Tlsf::take_best`]): a block freed
    /// by a request of the same size is reused before a larger one is split.
    /// O(1), with a bounded scan of one class.
    #[inline]
    pub fn allocate_best(&mut self, lane: LaneId, size: u64, align: u64) -> Option<Allocation> {
        self.allocate_with(lane, size, align, true, NIL)
    }

    /// Like [`allocate_best`](Self::allocate_best), but the last block of
    /// region `growing` is split only when the search finds no other free
    /// block of the lane that fits (see [`Tlsf::take_best_instead`]). For a region that grows in
    /// place at its end: its free end then serves only the requests that no
    /// hole fits, as it did while the region grew. Once every block is free
    /// again and the region is one block, the same requests in the same
    /// order land where they did before, and the region need not grow.
    #[inline]
    pub fn allocate_best_sparing_end(
        &mut self,
        lane: LaneId,
        size: u64,
        align: u64,
        growing: RegionId,
    ) -> Option<Allocation> {
        self.allocate_with(lane, size, align, true, growing.index)
    }

    #[inline(always)]
    fn allocate_with(
        &mut self,
        lane: LaneId,
        size: u64,
        align: u64,
        best: bool,
        spared_region: u32,
    ) -> Option<Allocation> {
        let size = round_to_granule(size)?.max(GRANULE);
        if !align.is_power_of_two() {
            return None;
        }
        let align = align.max(GRANULE);
        let needed = size.checked_add(align - GRANULE)?;
        let t = match self.lanes.get_mut(lane.0 as usize) {
            Some(Some(t)) => t,
            _ => return None,
        };
        let arena = &mut self.arena;
        let mut i = if best {
            t.take_best(arena, needed)?
        } else {
            t.take(arena, needed)?
        };
        if spared_region != NIL && arena[i].region == spared_region && arena[i].next_phys == NIL {
            i = t.take_best_instead(arena, i, needed);
        }
        let addr = arena[i].addr;
        // Cannot overflow: align - 1 < needed <= block size, and the block ends
        // within u64.
        let aligned = (addr + (align - 1)) & !(align - 1);
        self.carve(lane, i, aligned, size)
    }

    /// Hands out `[at, at + size)` of free block `i`, already taken out of
    /// lane `lane`'s index (`at` and `size` granule multiples, the range
    /// inside the block): the space before and after goes back to that
    /// lane. `None` (the block back in the index) when the front cannot be
    /// split off.
    #[inline(always)]
    fn carve(&mut self, lane: LaneId, mut i: u32, at: u64, size: u64) -> Option<Allocation> {
        let t = self.lanes[lane.0 as usize]
            .as_mut()
            .expect("the block's lane");
        let arena = &mut self.arena;
        let addr = arena[i].addr;
        if at != addr {
            match split(arena, i, at - addr) {
                Some(j) => {
                    // The front keeps its lane; its neighbours are not free
                    // in this lane (they would have been merged with it).
                    t.insert(arena, i);
                    i = j;
                }
                None => {
                    t.insert(arena, i);
                    return None;
                }
            }
        }
        if arena[i].size - size >= self.min_split {
            if let Some(k) = split(arena, i, size) {
                arena[k].lane = lane.0;
                t.insert(arena, k);
            }
        }
        arena[i].set_used();
        let bsize = arena[i].size;
        self.used.insert(at, i);
        self.used_bytes += bsize;
        Some(Allocation {
            addr: at,
            size: bsize,
            block: BlockId(i),
        })
    }

    /// Frees the used block starting at `addr` into `lane`, merging it with
    /// neighbours free in that lane; returns the block's size. O(1): one hash
    /// table lookup. A bad address is diagnosed (unknown, or double free) on a slow
    /// path that walks its region; nothing changes on error.
    #[inline]
    pub fn free(&mut self, addr: u64, lane: LaneId) -> Result<u64, HeapError> {
        self.free_checked(addr, lane, None)
    }

    /// Like [`free`](Self::free), for a block that was allocated with `bytes`
    /// bytes: a block of another size is [`HeapError::SizeMismatch`] and
    /// stays used. Sizes compare as blocks do: `bytes` rounded up to 256 must
    /// be the block's size, less any remainder below the minimum split. O(1),
    /// the same lookup as `free`.
    #[inline]
    pub fn free_sized(&mut self, addr: u64, lane: LaneId, bytes: u64) -> Result<u64, HeapError> {
        self.free_checked(addr, lane, Some(bytes))
    }

    /// The checks of [`free_sized`](Self::free_sized) without the free: the
    /// size of the used block at `addr` when a free of `bytes` there would
    /// be accepted, else the error that free would give. Nothing changes.
    /// O(1).
    pub fn check_free_sized(&self, addr: u64, bytes: u64) -> Result<u64, HeapError> {
        let Some(block) = self.used_size(addr) else {
            return Err(self.diagnose_bad_free(addr));
        };
        if !block_holds(block, bytes, self.min_split) {
            return Err(HeapError::SizeMismatch {
                addr,
                block,
                freed: bytes,
            });
        }
        Ok(block)
    }

    #[inline(always)]
    fn free_checked(
        &mut self,
        addr: u64,
        lane: LaneId,
        bytes: Option<u64>,
    ) -> Result<u64, HeapError> {
        let t = match self.lanes.get_mut(lane.0 as usize) {
            Some(Some(t)) => t,
            _ => return Err(HeapError::NoSuchLane(lane)),
        };
        let Some(i) = self.used.remove(addr) else {
            return Err(self.diagnose_bad_free(addr));
        };
        let size = self.arena[i].size;
        keep_if_wrong_size(&mut self.used, addr, i, size, bytes, self.min_split)?;
        self.used_bytes -= size;
        file_free(&mut self.arena, t, i, lane.0);
        Ok(size)
    }

    /// Like [`free`](Self::free), but a neighbour free in the global lane is
    /// first taken into `lane` and merged too (handing global blocks to one
    /// lane is always safe: it only narrows who may use them). Keeps a
    /// stream's free space in one piece with the untouched space beside it,
    /// so a one-stream workload does not spread over fresh addresses. O(1).
    #[inline]
    pub fn free_absorbing(&mut self, addr: u64, lane: LaneId) -> Result<u64, HeapError> {
        self.free_absorbing_checked(addr, lane, None)
    }

    /// [`free_absorbing`](Self::free_absorbing) with the size check of
    /// [`free_sized`](Self::free_sized).
    #[inline]
    pub fn free_absorbing_sized(
        &mut self,
        addr: u64,
        lane: LaneId,
        bytes: u64,
    ) -> Result<u64, HeapError> {
        self.free_absorbing_checked(addr, lane, Some(bytes))
    }

    #[inline(always)]
    fn free_absorbing_checked(
        &mut self,
        addr: u64,
        lane: LaneId,
        bytes: Option<u64>,
    ) -> Result<u64, HeapError> {
        if lane == LaneId::GLOBAL || lane.0 as usize >= self.lanes.len() {
            return self.free_checked(addr, lane, bytes);
        }
        let (global, rest) = self.lanes.split_at_mut(1);
        let (Some(g), Some(Some(t))) = (global[0].as_mut(), rest.get_mut(lane.0 as usize - 1))
        else {
            return Err(HeapError::NoSuchLane(lane));
        };
        let Some(mut i) = self.used.remove(addr) else {
            return Err(self.diagnose_bad_free(addr));
        };
        let arena = &mut self.arena;
        let size = arena[i].size;
        keep_if_wrong_size(&mut self.used, addr, i, size, bytes, self.min_split)?;
        self.used_bytes -= size;
        let prev = arena[i].prev_phys;
        if prev != NIL && arena[prev].is_free_in(LaneId::GLOBAL.0) {
            g.remove(arena, prev);
            merge(arena, prev, i);
            i = prev;
        }
        let next = arena[i].next_phys;
        if next != NIL && arena[next].is_free_in(LaneId::GLOBAL.0) {
            g.remove(arena, next);
            merge(arena, i, next);
        }
        file_free(arena, t, i, lane.0);
        Ok(size)
    }

    /// Why `addr` is not a used block: [`HeapError::DoubleFree`] when it
    /// starts a free block, else [`HeapError::UnknownAddress`]. Meaningless
    /// for a used block; for owners that check their own live records first.
    #[cold]
    pub fn diagnose_bad_free(&self, addr: u64) -> HeapError {
        if let Some(r) = self.region_of(addr) {
            for (_, b) in self.region_blocks(r) {
                if b.addr == addr && matches!(b.state(), BlockState::Free { .. }) {
                    return HeapError::DoubleFree(addr);
                }
                if b.addr >= addr {
                    break;
                }
            }
        }
        HeapError::UnknownAddress(addr)
    }

    /// Up to `max` free blocks of `lane` of at least `size` bytes (rounded
    /// up to 256), smallest size classes first: (block, address, size).
    pub fn free_blocks_at_least(
        &self,
        lane: LaneId,
        size: u64,
        max: usize,
    ) -> Vec<(BlockId, u64, u64)> {
        let mut out = Vec::new();
        self.for_each_free_at_least(lane, size, |id, addr, bsize| {
            out.push((id, addr, bsize));
            out.len() < max
        });
        out
    }

    /// Calls `f(block, address, size)` on the free blocks of `lane` of at
    /// least `size` bytes (rounded up to 256), smallest size classes first,
    /// until it returns false. O(non-empty classes + blocks visited).
    pub fn for_each_free_at_least(
        &self,
        lane: LaneId,
        size: u64,
        mut f: impl FnMut(BlockId, u64, u64) -> bool,
    ) {
        let Some(size) = round_to_granule(size) else {
            return;
        };
        if let Ok(t) = self.lane(lane) {
            t.for_each_at_least(&self.arena, size.max(GRANULE), |i| {
                let b = &self.arena[i];
                f(BlockId(i), b.addr, b.size)
            });
        }
    }

    /// Takes `[at, at + size)` (size rounded up to 256; `at` a multiple of
    /// 256) out of the free block `block`, whose lane keeps the space before
    /// and after it. `None` (nothing changed) when the block is not free or
    /// the range does not lie inside it. O(1).
    pub fn allocate_from(&mut self, block: BlockId, at: u64, size: u64) -> Option<Allocation> {
        let size = round_to_granule(size)?.max(GRANULE);
        let b = *self.block(block)?;
        let BlockState::Free { lane } = b.state() else {
            return None;
        };
        let end = at.checked_add(size)?;
        if !at.is_multiple_of(GRANULE) || at < b.addr || end > b.addr + b.size {
            return None;
        }
        let t = self.lanes.get_mut(lane.0 as usize)?.as_mut()?;
        t.remove(&mut self.arena, block.0);
        self.carve(lane, block.0, at, size)
    }

    /// The used block starting at `addr`. O(1).
    pub fn used_block(&self, addr: u64) -> Option<BlockId> {
        self.used.get(addr).map(BlockId)
    }

    /// The block in slot `id`, unless the slot is vacant.
    pub fn block(&self, id: BlockId) -> Option<&Block> {
        self.arena.get(id.0).filter(|b| !b.is_vacant())
    }

    /// Refiles every free block of lane `from` in lane `to`, merging blocks that
    /// become neighbours free in `to`. O(blocks moved).
    pub fn move_lane(&mut self, from: LaneId, to: LaneId) -> Result<(), HeapError> {
        self.lane(from)?;
        self.lane(to)?;
        if from == to {
            return Ok(());
        }
        let mut src = self.lanes[from.0 as usize].take().unwrap_or_default();
        if let Some(Some(dst)) = self.lanes.get_mut(to.0 as usize) {
            while let Some(i) = src.any_block() {
                src.remove(&mut self.arena, i);
                file_free(&mut self.arena, dst, i, to.0);
            }
        }
        self.lanes[from.0 as usize] = Some(src);
        Ok(())
    }

    /// Refiles every free block of the global lane in `lane`, merging each
    /// with `lane`'s free blocks beside it; false (nothing changed) when
    /// `lane` is the global lane, has no index, or the global lane is empty.
    /// For stream-ordered owners this is always safe (global blocks may go
    /// to any stream; refiled, they go to one) and keeps a stream's freed
    /// blocks in one piece with the untouched space around them. O(blocks
    /// moved).
    pub fn absorb_global(&mut self, lane: LaneId) -> bool {
        if lane == LaneId::GLOBAL
            || !self.has_lane(lane)
            || self.lane_block_count(LaneId::GLOBAL) == 0
        {
            return false;
        }
        self.move_lane(LaneId::GLOBAL, lane).is_ok()
    }

    /// Refiles one free block in lane `to`, merging it with neighbours free in
    /// `to`; returns the block it ends up in. O(1).
    pub fn move_block(&mut self, block: BlockId, to: LaneId) -> Result<BlockId, HeapError> {
        self.lane(to)?;
        let from = match self.block(block).map(|b| b.state()) {
            Some(BlockState::Free { lane }) => lane,
            _ => return Err(HeapError::BlockNotFree(block)),
        };
        if from == to {
            return Ok(block);
        }
        if let Some(Some(src)) = self.lanes.get_mut(from.0 as usize) {
            src.remove(&mut self.arena, block.0);
        }
        match self.lanes.get_mut(to.0 as usize) {
            Some(Some(dst)) => Ok(BlockId(file_free(&mut self.arena, dst, block.0, to.0))),
            _ => Err(HeapError::NoSuchLane(to)),
        }
    }

    // ----- statistics -----

    /// Bytes in used blocks. O(1).
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Number of used blocks. O(1).
    pub fn used_blocks(&self) -> usize {
        self.used.len()
    }

    /// Bytes of all regions. O(1).
    pub fn region_bytes(&self) -> u64 {
        self.region_bytes
    }

    /// Bytes in free blocks of all lanes. O(lanes).
    pub fn free_bytes(&self) -> u64 {
        self.lanes.iter().flatten().map(Tlsf::free_bytes).sum()
    }

    /// Number of free blocks in all lanes. O(lanes).
    pub fn free_blocks(&self) -> u64 {
        self.lanes.iter().flatten().map(Tlsf::block_count).sum()
    }

    /// Largest free block in any lane. O(lanes) top-class scans.
    pub fn largest_free_any(&self) -> u64 {
        let a = &self.arena;
        self.lanes
            .iter()
            .flatten()
            .map(|t| t.largest(a))
            .max()
            .unwrap_or(0)
    }

    /// All counters at once. O(lanes) plus the largest-block scans.
    pub fn stats(&self) -> HeapStats {
        HeapStats {
            region_bytes: self.region_bytes,
            regions: self.by_base.len(),
            used_bytes: self.used_bytes,
            used_blocks: self.used.len(),
            free_bytes: self.free_bytes(),
            free_blocks: self.free_blocks(),
            largest_free: self.largest_free_any(),
            lanes: self.lanes.iter().flatten().count(),
        }
    }

    /// Checks every structural invariant (address chains tile each region,
    /// no two neighbours free in one lane, indexes and counters agree, the
    /// address map names exactly the used blocks); describes the first
    /// violation. O(blocks + classes × lanes): for tests and debugging.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut blocks = 0usize;
        let mut used = 0usize;
        let mut used_bytes = 0u64;
        let mut lane_counts = vec![(0u64, 0u64); self.lanes.len()];
        let mut region_bytes = 0u64;
        for (id, base, size) in self.regions() {
            region_bytes += size;
            let mut expect = base;
            let mut prev = NIL;
            let mut prev_lane = None;
            for (bid, b) in self.region_blocks(id) {
                blocks += 1;
                if blocks > self.arena.capacity() {
                    return Err("cycle in address chain".into());
                }
                if b.addr != expect || b.size == 0 || !b.size.is_multiple_of(GRANULE) {
                    return Err(format!("block {bid:?} {b:?}: expected addr {expect:#x}"));
                }
                if b.prev_phys != prev || b.region != id.index {
                    return Err(format!("block {bid:?} {b:?}: bad prev/region"));
                }
                match b.state() {
                    BlockState::Used => {
                        used += 1;
                        used_bytes += b.size;
                        if self.used.get(b.addr) != Some(bid.0) {
                            return Err(format!("used block {bid:?} not in address map"));
                        }
                        prev_lane = None;
                    }
                    BlockState::Free { lane } => {
                        if prev_lane == Some(lane) {
                            return Err(format!("block {bid:?}: unmerged neighbours in {lane:?}"));
                        }
                        let c = lane_counts
                            .get_mut(lane.0 as usize)
                            .filter(|_| self.has_lane(lane))
                            .ok_or_else(|| format!("block {bid:?} in missing {lane:?}"))?;
                        c.0 += b.size;
                        c.1 += 1;
                        prev_lane = Some(lane);
                    }
                    BlockState::Vacant => return Err(format!("vacant block {bid:?} in chain")),
                }
                expect = b.end();
                prev = bid.0;
            }
            if expect != base + size {
                return Err(format!("region {id:?} blocks end at {expect:#x}"));
            }
        }
        if blocks != self.arena.len() {
            return Err(format!(
                "{} blocks in arena, {blocks} in regions",
                self.arena.len()
            ));
        }
        if used != self.used.len() || used_bytes != self.used_bytes {
            return Err(format!(
                "used: {used} blocks / {used_bytes} B in chains, map {} / counter {}",
                self.used.len(),
                self.used_bytes
            ));
        }
        if region_bytes != self.region_bytes {
            return Err("region byte counter".into());
        }
        for (l, t) in self.lanes.iter().enumerate() {
            if let Some(t) = t {
                t.check(&self.arena).map_err(|e| format!("lane {l}: {e}"))?;
                if (t.free_bytes(), t.block_count()) != lane_counts[l] {
                    return Err(format!("lane {l}: index and chains disagree"));
                }
                let mut bad = None;
                t.for_each(&self.arena, |i| {
                    if !self.arena[i].is_free_in(l as u32) {
                        bad = Some(i);
                    }
                });
                if let Some(i) = bad {
                    return Err(format!("lane {l}: index holds block {i} of another state"));
                }
            }
        }
        Ok(())
    }
}
