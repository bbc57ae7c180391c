//! Placement: where a block goes in the virtual address space (the heap's
//! choice, a better free place, or a fresh reservation).

use super::page_table::{Acquired, PageSpan};
use super::{State, VirtualPool, LARGE};
use crate::stream::Stream;
use crate::suballoc::{span_with_padding, Allocation, BlockId, LaneId, RegionId};
use crate::{Error, Result};

/// Address space reserved, in multiples of the device's memory, beyond which
/// conflicts are resolved by collecting idle aliases before reserving more.
pub(super) const VA_SCARCE_MULTIPLE: usize = 16;

/// A large block that would need at least this many new pages (128 MiB on
/// 2 MiB pages) looks for a free place with fewer. Smaller ones stay where
/// the heap puts them: relocating them makes a repeating workload relocate
/// blocks in every pass of its steady state (more work per operation) and
/// settle later (`docs/decisions-virtual-pool.md`).
pub(super) const RELOCATE_MIN_PAGES: usize = 64;

/// The places tried for a block of `size` bytes at `align` in the free
/// block `[addr, addr + bsize)`: its start and its end, aligned.
pub(super) fn places_in(addr: u64, bsize: u64, size: u64, align: u64) -> impl Iterator<Item = u64> {
    let end = addr + bsize;
    let start = addr.next_multiple_of(align);
    let tail = (end - size) & !(align - 1);
    [start, tail]
        .into_iter()
        .filter(move |&at| at >= addr && at + size <= end)
}

impl VirtualPool {
    /// [`PageTable::acquire`](super::page_table::PageTable::acquire) with
    /// the stream-safety answer of `stream`.
    #[inline(always)]
    pub(super) fn acquire(st: &mut State, span: PageSpan, stream: &Stream) -> Acquired {
        let State {
            pages,
            phys,
            streams,
            ..
        } = st;
        let mut taker = None;
        pages.acquire(span, phys, |frees| {
            let taker = *taker.get_or_insert_with(|| streams.taker_bit(stream));
            // With no other stream's frees anywhere, the record is moot.
            !streams.others_freed(taker) || frees().quiet(|m, t| streams.safe_for(taker, m, t))
        })
    }

    /// Finds addresses for a request both lanes of `area` missed: settle,
    /// steal, then another reservation.
    #[cold]
    pub(super) fn take_slow(
        &self,
        st: &mut State,
        area: usize,
        lane: LaneId,
        stream: &Stream,
        bytes: usize,
        alignment: usize,
    ) -> Result<Allocation> {
        let needed = span_with_padding(bytes, alignment).ok_or_else(|| self.oom(st, bytes))?;
        let a = &mut st.areas[area];
        a.lanes.settle(&mut a.heap, Some(lane));
        if let Some(x) = a
            .heap
            .allocate_best(LaneId::GLOBAL, bytes as u64, alignment as u64)
        {
            return Ok(x);
        }
        if a.lanes.steal(&mut a.heap, 0, lane, stream, needed as u64) {
            if let Some(x) = a.heap.allocate_best(lane, bytes as u64, alignment as u64) {
                return Ok(x);
            }
        }
        // Out of addresses that are safe now: another reservation (address
        // space is cheap; waiting for other streams is not).
        self.reserve_more(st, area, needed, bytes)?;
        st.areas[area]
            .heap
            .allocate(LaneId::GLOBAL, bytes as u64, alignment as u64)
            .ok_or_else(|| self.oom(st, bytes))
    }

    /// Makes another reservation of at least `needed` bytes for area `area`
    /// and adds it to the area's heap (in the global lane).
    ///
    /// It is at least the power of two above what the first reservation
    /// gave the area, so that its free space is never a better fit than
    /// the first reservation's: once a pass of a repeating workload has
    /// freed everything, the next pass then finds its blocks where the
    /// first one put them, over pages mapped then, instead of starting in
    /// the later reservation and mapping everything again
    /// (`docs/decisions-virtual-pool.md`).
    #[cold]
    pub(super) fn reserve_more(
        &self,
        st: &mut State,
        area: usize,
        needed: usize,
        bytes: usize,
    ) -> Result<RegionId> {
        let size = needed
            .max(self.later_reservation[area])
            .checked_next_multiple_of(self.gran)
            .ok_or_else(|| self.oom(st, bytes))?;
        let base = match self.device.driver().vmm_reserve(size, self.gran) {
            Ok(b) => b,
            Err(e) if e.is_oom() => return Err(self.oom(st, bytes)),
            Err(e) => return Err(e),
        };
        let id = match st.areas[area].heap.add_region(base.0, size as u64) {
            Ok(id) => id,
            Err(e) => {
                let _ = self.vmm().free_reservation(base, size);
                return Err(Error::InvalidArgument(format!(
                    "virtual pool: unusable range at {:#x}: {e}",
                    base.0
                )));
            }
        };
        st.area_ranges.push((base.0, base.0 + size as u64, area));
        st.pages.add_reservation(base.0, size as u64);
        self.shards.global().insert(base.0, size, st.shard);
        Ok(id)
    }

    /// A block at the start of a new reservation: nothing is mapped there, so
    /// nothing conflicts.
    #[cold]
    pub(super) fn fresh_block(
        &self,
        st: &mut State,
        area: usize,
        bytes: usize,
        alignment: usize,
    ) -> Result<Allocation> {
        let needed = bytes
            .checked_next_multiple_of(self.gran)
            .and_then(|b| b.checked_add(alignment.max(256)))
            .ok_or_else(|| self.oom(st, bytes))?;
        let id = self.reserve_more(st, area, needed, bytes)?;
        st.fresh_ranges += 1;
        let first = st.areas[area].heap.region_blocks(id).next();
        let (block, b) = first.ok_or_else(|| self.oom(st, bytes))?;
        let at = b.addr.next_multiple_of(alignment.max(256) as u64);
        st.areas[area]
            .heap
            .allocate_from(block, at, bytes as u64)
            .ok_or_else(|| self.oom(st, bytes))
    }

    /// A better place than `blk` (its pages not acquired):
    /// when `blk` conflicts (see `PageTable::acquire`), any place without
    /// conflicts; else, for a large block needing at least
    /// [`RELOCATE_MIN_PAGES`] new pages, a place that needs fewer. The free
    /// blocks of the stream's lane and of the global lane that fit are tried
    /// at their start and their end; places with conflicts (as `acquire`
    /// would find them for `stream`) are skipped and the fewest unmapped
    /// pages wins. Taken out of the heap when better than
    /// `blk` (which the caller gives back). Slow path only: bounded by
    /// `PLACEMENT_CANDIDATES` blocks.
    #[cold]
    pub(super) fn better_placement(
        &self,
        st: &mut State,
        area: usize,
        lane: LaneId,
        blk: &Allocation,
        (alignment, stream): (usize, &Stream),
        conflict: bool,
    ) -> Option<Allocation> {
        const PLACEMENT_CANDIDATES: usize = 64;
        let span = st.pages.span(blk.addr, blk.size)?;
        let mut best_n = if conflict {
            usize::MAX
        } else {
            st.pages.count_unmapped(span)
        };
        if !conflict && (area != LARGE || best_n < RELOCATE_MIN_PAGES) {
            return None;
        }
        let size = blk.size;
        let align = alignment.max(256) as u64;
        let mut best: Option<(BlockId, u64)> = None;
        let State {
            areas,
            pages,
            phys,
            streams,
            ..
        } = &mut *st;
        let heap = &areas[area].heap;
        // The places are checked as `acquire` will check the one chosen, for
        // the stream that takes the block; each stream is asked at most once.
        let taker = streams.taker_bit(stream);
        let others = streams.others_freed(taker);
        streams.begin_pass();
        let mut seen = 0;
        for l in [lane, LaneId::GLOBAL] {
            heap.for_each_free_at_least(l, size, |id, addr, bsize| {
                seen += 1;
                for at in places_in(addr, bsize, size, align) {
                    let Some(there) = pages.span(at, size) else {
                        continue;
                    };
                    let n = pages.count_unmapped(there);
                    if n < best_n
                        && !pages.has_conflict(there, phys, |frees| {
                            !others || frees().quiet(|m, t| streams.safe_in_pass(taker, m, t))
                        })
                    {
                        best_n = n;
                        best = Some((id, at));
                        if n == 0 {
                            return false;
                        }
                    }
                }
                seen < PLACEMENT_CANDIDATES
            });
            if best_n == 0 {
                break;
            }
            seen = 0;
        }
        let (id, at) = best?;
        let moved = st.areas[area].heap.allocate_from(id, at, size)?;
        st.relocations += 1;
        Some(moved)
    }

    /// The block at `blk` (its pages acquired) conflicts with another alias
    /// (`conflict`) or needs many new pages: gives its pages up and places it
    /// better (another free place, after collecting idle aliases when
    /// address space is scarce, or a fresh reservation); returns the new
    /// acquisition and pages. Off the fast path.
    #[cold]
    pub(super) fn place_elsewhere(
        &self,
        st: &mut State,
        (area, lane): (usize, LaneId),
        blk: &mut Allocation,
        (bytes, alignment): (usize, usize),
        stream: &Stream,
        conflict: bool,
    ) -> Result<(Acquired, PageSpan)> {
        let mut span = st
            .pages
            .span(blk.addr, blk.size)
            .expect("inside a reservation");
        st.pages.unacquire(span);
        if let Some(better) =
            self.better_placement(st, area, lane, blk, (alignment, stream), conflict)
        {
            span = Self::swap_block(st, area, lane, blk, better);
        }
        let mut got = Self::acquire(st, span, stream);
        if got.conflict && self.va_is_scarce(st) {
            // Idle aliases unmapped conflict with nothing: try again.
            st.pages.unacquire(span);
            if let Err(e) = self.collect_aliases(st) {
                let _ = st.areas[area].heap.free(blk.addr, lane);
                return Err(e);
            }
            if let Some(better) =
                self.better_placement(st, area, lane, blk, (alignment, stream), true)
            {
                span = Self::swap_block(st, area, lane, blk, better);
            }
            got = Self::acquire(st, span, stream);
        }
        if got.conflict {
            // Every free place conflicts: a fresh reservation.
            st.pages.unacquire(span);
            let _ = st.areas[area].heap.free(blk.addr, lane);
            *blk = self.fresh_block(st, area, bytes, alignment)?;
            span = st
                .pages
                .span(blk.addr, blk.size)
                .expect("inside a reservation");
            got = Self::acquire(st, span, stream);
            debug_assert!(!got.conflict);
        }
        Ok((got, span))
    }

    /// Gives `blk` (taken from lane `lane`, its pages not acquired) back to
    /// the heap and makes `new` the block; returns `new`'s pages.
    pub(super) fn swap_block(
        st: &mut State,
        area: usize,
        lane: LaneId,
        blk: &mut Allocation,
        new: Allocation,
    ) -> PageSpan {
        let _ = st.areas[area].heap.free(blk.addr, lane);
        *blk = new;
        st.pages
            .span(blk.addr, blk.size)
            .expect("inside a reservation")
    }

    /// True when the address space reserved has reached
    /// [`VA_SCARCE_MULTIPLE`] times the device's memory.
    pub(super) fn va_is_scarce(&self, st: &State) -> bool {
        st.pages.reserved_bytes() >= self.capacity.saturating_mul(VA_SCARCE_MULTIPLE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sim::SimConfig;
    use crate::pool::VirtualPoolConfig;
    use crate::Device;

    /// With the first reservation's large area and a later reservation both
    /// wholly free, a block goes to the first: a later reservation is never
    /// the better fit (a repeating workload's next pass then starts where its
    /// first pass did).
    #[test]
    fn a_later_reservation_is_never_the_better_fit() {
        let device = Device::sim(SimConfig::default());
        let pool = VirtualPool::new(device, VirtualPoolConfig::default()).unwrap();
        let mut st = pool.lock();
        let (first_start, first_end, area) = st.area_ranges[1];
        assert_eq!(area, LARGE);
        pool.reserve_more(&mut st, LARGE, pool.gran, pool.gran)
            .unwrap();
        let (start, end, area) = *st.area_ranges.last().unwrap();
        assert_eq!(area, LARGE);
        let (first, later) = (first_end - first_start, end - start);
        assert!(
            later.is_power_of_two() && later > first,
            "{later} after {first}"
        );
        let b = st.areas[LARGE]
            .heap
            .allocate(LaneId::GLOBAL, 4 << 20, 256)
            .unwrap();
        assert!((first_start..first_end).contains(&b.addr), "{:#x}", b.addr);
    }
}
