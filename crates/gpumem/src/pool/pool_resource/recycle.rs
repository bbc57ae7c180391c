//! Recycling free pieces into a growth of an expandable heap
//! ([`PoolConfig::expandable`]).
//!
//! Why: a heap that grows one range at its end keeps every hole the
//! workload leaves inside the range. On gpt2_train the holes at the last
//! growths were large in all but none large enough for the requests that
//! made the range grow, and the reserve ended well above the live peak
//! (`docs/decisions.md`, "Expandable heaps: recycling pieces").
//!
//! How: the upstream maps each range in pieces of at most 64 MiB on an H100
//! ([`PIECE_GRANULES`]). Before a frontier grows, every piece of the heap's
//! ranges that lies wholly in one free block is a candidate. The range is
//! split around the piece (the heap's region and the upstream's allocation
//! alike, so each region stays one allocation), the piece leaves the heap,
//! and the upstream maps its memory at the frontier's end ([`recycle`])
//! instead of creating more. The heap's reserve stays what it was; the
//! piece's old addresses stay unused.
//!
//! Stream order: a block free in a stream's lane may still be used by work
//! queued on that stream, and the unmap is immediate, so the lanes' streams
//! are waited for before a piece free in one of them moves (one wait covers
//! every stream, in a growth, which already costs the driver's mapping
//! calls). Nothing moves while a graph capture is under way: waiting for a
//! capturing stream would break its capture.
//!
//! [`PoolConfig::expandable`]: super::PoolConfig::expandable
//! [`PIECE_GRANULES`]: crate::resource::PIECE_GRANULES
//! [`recycle`]: GrowInPlace::recycle

use super::expandable::Frontier;
use super::free_pieces::{free_pieces, FreePiece};
use super::{PoolResource, Shard};
use crate::driver::DevicePtr;
use crate::pool::shards::Guard;
use crate::resource::{GrowInPlace, MemoryResource};
use crate::suballoc::{LaneHeap, LaneId, RegionId};

impl<U: MemoryResource> PoolResource<U> {
    /// Moves free pieces of heap `class` of shard `home` to the end of its
    /// frontier until `lacking` bytes came or none is left (see the module
    /// documentation). Returns the guard, re-taken, and the bytes moved.
    pub(super) fn recycle_pieces<'a>(
        &'a self,
        mut st: Guard<'a, Shard>,
        home: usize,
        class: usize,
        up: &dyn GrowInPlace,
        lacking: usize,
    ) -> (Guard<'a, Shard>, usize) {
        let mut moved = 0;
        let mut waited = false;
        while moved < lacking && !crate::captures::underway() {
            let Some(f) = st.frontier[class].filter(|f| !f.busy) else {
                break;
            };
            let Some(piece) = free_piece(&st.heaps[class], up, f) else {
                break;
            };
            if piece.lane != LaneId::GLOBAL {
                // Its stream's work may still use it: wait for every
                // stream once, then look again (the blocks merged).
                if waited || Self::settle_blocking(&mut st).is_err() {
                    break;
                }
                waited = true;
                continue;
            }
            let (g, done) = self.move_piece(st, home, class, up, f, piece);
            st = g;
            match done {
                Some(bytes) => moved += bytes,
                None => break,
            }
        }
        (st, moved)
    }

    /// Cuts `[start, end)`, whole pieces of a free block, out of `region`
    /// `(id, base, bytes)` of heap `class` of shard `home`: the heap's region
    /// and the upstream's allocation alike, so each region stays one
    /// allocation, with the parts recorded in the pool's regions. Returns
    /// the region of `[start, end)` and the one after it, if any; `None`
    /// when a cut failed, which happens only on a pool whose tables
    /// disagree with its upstream's (or at 2^32 blocks): what was cut by
    /// then stays usable.
    pub(super) fn cut_out(
        &self,
        st: &mut Shard,
        home: usize,
        class: usize,
        up: &dyn GrowInPlace,
        (region, base, bytes): (RegionId, u64, usize),
        (start, end): (u64, u64),
    ) -> Option<(RegionId, Option<RegionId>)> {
        let region_end = base + bytes as u64;
        let cut = |st: &mut Shard, id, from: u64, at: u64| {
            let heap_cut = st.heaps[class]
                .split_region(id, at)
                .inspect_err(|e| log::error!("pool: cannot cut a region: {e}"))
                .ok()?;
            let len = (region_end - from) as usize;
            if let Err(e) = up.split(DevicePtr(from), len, (at - from) as usize) {
                log::error!("pool: the upstream cannot cut a range: {e}");
                return None;
            }
            let mut g = self.shards.global();
            g.regions.insert(from, (at - from) as usize, home);
            g.regions.insert(at, (region_end - at) as usize, home);
            Some(heap_cut)
        };
        let middle = if start > base {
            cut(st, region, base, start)?
        } else {
            region
        };
        let tail = if end < region_end {
            Some(cut(st, middle, start, end)?)
        } else {
            None
        };
        Some((middle, tail))
    }

    /// Cuts `piece` out of its region (heap and upstream alike), moves its
    /// memory to the end of frontier `f` and grows the heap's region there.
    /// Returns the bytes moved, `None` when it could not be done: a piece
    /// cut out whose move failed goes back to the upstream (nothing is
    /// lost; the pool holds less).
    fn move_piece<'a>(
        &'a self,
        mut st: Guard<'a, Shard>,
        home: usize,
        class: usize,
        up: &dyn GrowInPlace,
        f: Frontier,
        piece: FreePiece,
    ) -> (Guard<'a, Shard>, Option<usize>) {
        let (region, base, bytes) = piece.region;
        let (start, end) = (piece.addr, piece.addr + piece.bytes as u64);
        let region_end = base + bytes as u64;
        let Some((middle, tail)) =
            self.cut_out(&mut st, home, class, up, piece.region, (start, end))
        else {
            return (st, None);
        };
        // One free block in the global lane: it leaves the heap, so nothing
        // is handed out of it while it moves.
        if let Err(e) = st.heaps[class].remove_region(middle) {
            log::error!("pool: a piece to recycle is not free: {e}");
            return (st, None);
        }
        let f = f.after_cut(region, tail, end, region_end);
        {
            let mut g = self.shards.global();
            g.regions.remove(start);
            // Counted against `max_reserved` while out of the regions.
            g.growing += piece.bytes;
        }
        st.frontier[class] = Some(Frontier { busy: true, ..f });
        drop(st);
        let moved = up.recycle(DevicePtr(start), piece.bytes, DevicePtr(f.base), f.bytes);
        if let Err(e) = &moved {
            log::debug!("pool: a piece could not be recycled, it goes back: {e}");
            if let Err(e) = self
                .upstream
                .deallocate_sync(DevicePtr(start), piece.bytes, 256)
            {
                log::error!("pool: a piece that could not be recycled leaks: {e}");
            }
        }
        let mut st = self.shards.lock(home);
        let mut g = self.shards.global();
        g.growing -= piece.bytes;
        if let Some(fr) = st.frontier[class].as_mut() {
            fr.busy = false;
        }
        if moved.is_err() {
            return (st, None);
        }
        if let Err(e) = st.heaps[class].extend_region(f.region, piece.bytes as u64) {
            // Not expected (nothing follows a frontier's range): the piece
            // goes back.
            drop((g, st));
            log::error!("pool: could not take a recycled piece: {e}");
            let _ = up.shrink(DevicePtr(f.base), f.bytes + piece.bytes, f.bytes);
            return (self.shards.lock(home), None);
        }
        let grown = f.bytes + piece.bytes;
        if let Some(fr) = st.frontier[class].as_mut() {
            fr.bytes = grown;
        }
        g.regions.insert(f.base, grown, home);
        drop(g);
        (st, Some(piece.bytes))
    }
}

/// The first piece of `heap`'s ranges, in region order, that lies wholly in
/// a free block and fits in frontier `f`'s capacity; pieces in the free
/// block at the frontier's end are there already.
fn free_piece(heap: &LaneHeap, up: &dyn GrowInPlace, f: Frontier) -> Option<FreePiece> {
    let room = f.capacity - f.bytes;
    let frontier_end = f.base + f.bytes as u64;
    free_pieces(heap, up, None, Some(frontier_end)).find(|p| p.bytes <= room)
}
