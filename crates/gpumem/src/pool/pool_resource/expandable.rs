//! [`PoolResource`]'s expandable heaps ([`PoolConfig::expandable`]): each
//! heap of a shard grows one address range of its upstream in place
//! ([`GrowInPlace`]) instead of taking a new region, so a block may span
//! what would have been two regions, and a trim gives back the free end of
//! the range (and the free pieces inside it, `release_pieces.rs`).
//!
//! The range a heap grows is its *frontier*. A growth extends it by what
//! the request needs beyond the free block at its end (when that block is
//! free for everyone or for the requesting stream), rounded up to the
//! growth granularity (the upstream's, 2 MiB on an H100), and by at least
//! a growth step (20 MiB for the large heap; for the small one a quarter of
//! its range, 2 to 20 MiB): the reserve follows the live peak to within one
//! step per heap. A new frontier is taken when there is none, when the
//! range is full (its capacity is the device's memory, or `max_reserved`
//! unless pieces are recycled), and after a trim gave the whole range back.
//! While one thread's growth is under way (no lock is held across the
//! upstream call), another thread that must grow the same heap takes a
//! region as a pool without expandable heaps does.
//!
//! The range's free end is the large heap's last resort: a request takes
//! it only when no other free block fits
//! ([`LaneHeap::allocate_best_sparing_end`]). While the range grows, its
//! end is what growths leave over, so that is how the first pass of a job
//! uses it anyway; keeping to it afterwards makes a pass that starts from
//! an empty pool (the whole range one free block) place every block where
//! the first pass did, so it never grows the range again. Splitting the end
//! whenever it was the best fit placed the second pass otherwise: the
//! simulator's replays of gpt2_train and resnet50_train then grew their
//! ranges once more in their second pass (`docs/decisions.md`).
//!
//! [`LaneHeap::allocate_best_sparing_end`]: crate::suballoc::LaneHeap::allocate_best_sparing_end
//! [`PoolConfig::expandable`]: super::PoolConfig::expandable

use super::{PoolResource, Shard};
use crate::driver::DevicePtr;
use crate::pool::shards::Guard;
use crate::resource::{GrowInPlace, MemoryResource};
use crate::suballoc::{Block, LaneId, RegionId};
use crate::{Error, Result};

/// The range a heap grows (see the module documentation).
#[derive(Debug, Clone, Copy)]
pub(super) struct Frontier {
    pub(super) region: RegionId,
    pub(super) base: u64,
    /// Bytes of the range now (the region's size).
    pub(super) bytes: usize,
    /// Most bytes the range can grow to.
    pub(super) capacity: usize,
    /// A growth or shrink of the range is under way (no lock held).
    pub(super) busy: bool,
}

impl Frontier {
    /// The frontier once `[.., end)` of `region` (which ended at
    /// `region_end`) was cut out and `tail` is what followed: when the
    /// range cut was this one, its last part grows from now on.
    pub(super) fn after_cut(
        self,
        region: RegionId,
        tail: Option<RegionId>,
        end: u64,
        region_end: u64,
    ) -> Frontier {
        match tail {
            Some(t) if region == self.region => Frontier {
                region: t,
                base: end,
                bytes: (region_end - end) as usize,
                capacity: self.capacity - (end - self.base) as usize,
                busy: false,
            },
            _ => self,
        }
    }
}

impl<U: MemoryResource> PoolResource<U> {
    /// The upstream's growth, when the heaps are to be expandable and the
    /// upstream can grow in place.
    pub(super) fn expander(&self) -> Option<&dyn GrowInPlace> {
        self.config
            .expandable
            .then(|| self.upstream.grow_in_place())
            .flatten()
    }

    /// The granularity growths are rounded to.
    fn growth_unit(up: &dyn GrowInPlace, granularity: usize) -> usize {
        up.growth_granularity().max(granularity).max(256)
    }

    /// Grows heap `class` of shard `home` for a request needing `needed`
    /// bytes (padding included) on the stream of `lane`: extends the heap's
    /// frontier, or takes a new one, by at least a growth step
    /// ([`growth_step`](Self::growth_step)), and by only what the request
    /// lacks when the step does not fit (a limit, or the device's memory).
    /// `None` when the heap does not expand (not configured, an upstream
    /// that cannot, or a growth of the frontier under way): the caller
    /// grows a region instead. The guard comes back re-taken.
    pub(super) fn grow_expanding<'a>(
        &'a self,
        st: Guard<'a, Shard>,
        home: usize,
        class: usize,
        lane: LaneId,
        needed: usize,
    ) -> (Guard<'a, Shard>, Option<Result<()>>) {
        let Some(up) = self.expander() else {
            return (st, None);
        };
        let unit = Self::growth_unit(up, self.config.growth.granularity);
        let range = st.frontier[class].map_or(0, |f| f.bytes);
        let step = self.growth_step(class, range);
        let (st, grown) = self.grow_by(st, home, class, lane, needed, step, up, unit);
        match grown {
            Some(Err(e)) if e.is_oom() && step > unit => {
                self.grow_by(st, home, class, lane, needed, unit, up, unit)
            }
            grown => (st, grown),
        }
    }

    /// [`grow_expanding`](Self::grow_expanding) by at least `step` bytes.
    #[allow(clippy::too_many_arguments)]
    fn grow_by<'a>(
        &'a self,
        st: Guard<'a, Shard>,
        home: usize,
        class: usize,
        lane: LaneId,
        needed: usize,
        step: usize,
        up: &dyn GrowInPlace,
        unit: usize,
    ) -> (Guard<'a, Shard>, Option<Result<()>>) {
        // The free end of the range the stream can take: its last blocks
        // free for everyone or for the stream (which merge when taken, see
        // `take_absorbing`).
        let tail_free = |st: &Shard, f: Frontier| {
            let heap = &st.heaps[class];
            let usable = |b: &Block| b.is_free_in(LaneId::GLOBAL.0) || b.is_free_in(lane.0);
            let mut free = 0;
            let mut at = heap.region_tail(f.region).map(|(_, b)| b);
            while let Some(b) = at.filter(usable) {
                free += b.size() as usize;
                at = b.prev_phys().and_then(|p| heap.block(p)).copied();
            }
            free
        };
        let mut st = st;
        let mut recycled = 0;
        let frontier = st.frontier[class].filter(|f| !f.busy);
        if let Some(f) = frontier.filter(|_| self.config.recycle_pieces) {
            let lacking = needed.saturating_sub(tail_free(&st, f));
            if lacking > 0 {
                (st, recycled) = self.recycle_pieces(st, home, class, up, lacking);
            }
        }
        match st.frontier[class] {
            Some(f) if f.busy => (st, None),
            Some(f) => {
                let lacking = needed.saturating_sub(tail_free(&st, f));
                if recycled > 0 && lacking == 0 {
                    return (st, Some(Ok(())));
                }
                // After recycling, only what is still lacking: a step more
                // would hold memory that recycling just avoided creating.
                let step = if recycled > 0 { unit } else { step };
                let extra = lacking.max(step).checked_next_multiple_of(unit);
                match extra {
                    Some(extra) if f.bytes.checked_add(extra).is_some_and(|n| n <= f.capacity) => {
                        self.extend_frontier(st, home, class, up, f, extra)
                    }
                    // Full: a new range becomes the frontier.
                    _ => self.new_frontier(st, home, class, up, needed.max(step), unit),
                }
            }
            None => self.new_frontier(st, home, class, up, needed.max(step), unit),
        }
    }

    /// The least a growth of heap `class` whose range holds `range` bytes
    /// adds. The large heap: the medium region size a pool without
    /// expandable heaps would take (20 MiB). The small heap: a quarter of
    /// its range, from the small region size (2 MiB) up to the medium one:
    /// small blocks come in many growths otherwise (resnet50_train's first
    /// pass: fewer growths than with one-page steps), and the small
    /// heap is small beside the large one. Each growth costs more than a
    /// `cuMemAlloc` (create, map, set access); growing by what each request
    /// lacks alone took more still. The reserve ends at most one step per heap
    /// above what it needs (`docs/decisions.md`).
    fn growth_step(&self, class: usize, range: usize) -> usize {
        let g = &self.config.growth;
        if class == super::SMALL {
            (range / 4).clamp(g.small_region, g.medium_region.max(g.small_region))
        } else {
            g.medium_region
        }
    }

    /// Grows frontier `f` of heap `class` by `extra` bytes.
    fn extend_frontier<'a>(
        &'a self,
        st: Guard<'a, Shard>,
        home: usize,
        class: usize,
        up: &dyn GrowInPlace,
        f: Frontier,
        extra: usize,
    ) -> (Guard<'a, Shard>, Option<Result<()>>) {
        let mut st = match self.start_growth(st, home, extra) {
            Ok(st) => st,
            Err((st, e)) => return (st, Some(Err(e))),
        };
        if let Some(f) = st.frontier[class].as_mut() {
            f.busy = true;
        }
        drop(st);
        let grown = up.grow(DevicePtr(f.base), f.bytes, f.bytes + extra);
        let mut st = self.shards.lock(home);
        let mut g = self.shards.global();
        g.growing -= extra;
        // A busy frontier stays (trims and adoptions leave it), so `f`
        // still names it.
        if let Some(fr) = st.frontier[class].as_mut() {
            fr.busy = false;
        }
        if let Err(e) = grown {
            return (st, Some(Err(e)));
        }
        let bytes = f.bytes + extra;
        if let Err(e) = st.heaps[class].extend_region(f.region, extra as u64) {
            // Not expected (the range is the region's and nothing follows
            // it): the growth goes back.
            drop((g, st));
            let _ = up.shrink(DevicePtr(f.base), f.bytes + extra, f.bytes);
            let e = Error::InvalidArgument(format!("pool could not grow its heap: {e}"));
            return (self.shards.lock(home), Some(Err(e)));
        }
        if let Some(fr) = st.frontier[class].as_mut() {
            fr.bytes = bytes;
        }
        g.regions.insert(f.base, bytes, home);
        g.peak_reserved = g.peak_reserved.max(g.regions.bytes());
        drop(g);
        (st, Some(Ok(())))
    }

    /// Takes a new range for heap `class`, of `needed` bytes rounded up to
    /// `unit`, and makes it the heap's frontier (unless another thread made
    /// one meanwhile: the range then is a region of the heap like any
    /// other). An upstream that turns out unable to grow (`Unsupported`)
    /// gives `None`: the caller grows a region.
    fn new_frontier<'a>(
        &'a self,
        st: Guard<'a, Shard>,
        home: usize,
        class: usize,
        up: &dyn GrowInPlace,
        needed: usize,
        unit: usize,
    ) -> (Guard<'a, Shard>, Option<Result<()>>) {
        let Some(bytes) = needed.checked_next_multiple_of(unit) else {
            drop(st);
            let e = self.oom(needed);
            return (self.shards.lock(home), Some(Err(e)));
        };
        let st = match self.start_growth(st, home, bytes) {
            Ok(st) => st,
            Err((st, e)) => return (st, Some(Err(e))),
        };
        drop(st);
        let capacity = self.frontier_capacity().max(bytes);
        let got = if self.config.recycle_pieces {
            let piece = unit.saturating_mul(crate::resource::PIECE_GRANULES);
            up.allocate_growable_in_pieces(bytes, capacity, piece)
        } else {
            up.allocate_growable(bytes, capacity)
        };
        let mut st = self.shards.lock(home);
        let mut g = self.shards.global();
        g.growing -= bytes;
        let base = match got {
            Ok(base) => base,
            Err(Error::Unsupported { .. }) => return (st, None),
            Err(e) => return (st, Some(Err(e))),
        };
        let region = match st.heaps[class].add_region(base.0, bytes as u64) {
            Ok(r) => r,
            Err(e) => {
                drop((g, st));
                let _ = self.upstream.deallocate_sync(base, bytes, 256);
                let e = Error::InvalidArgument(format!(
                    "upstream returned an unusable range at {:#x}: {e}",
                    base.0
                ));
                return (self.shards.lock(home), Some(Err(e)));
            }
        };
        g.regions.insert(base.0, bytes, home);
        g.peak_reserved = g.peak_reserved.max(g.regions.bytes());
        drop(g);
        let replace = st.frontier[class].is_none_or(|f| !f.busy);
        if replace {
            st.frontier[class] = Some(Frontier {
                region,
                base: base.0,
                bytes,
                capacity,
                busy: false,
            });
        }
        (st, Some(Ok(())))
    }

    /// How far a frontier may grow: the device's memory (address space
    /// only; physical memory comes with each growth), at most the pool's
    /// `max_reserved`, except when pieces are recycled: each move leaves
    /// its old addresses behind, so the range outgrows the reserve, and at
    /// the limit moving is the only way left to grow.
    fn frontier_capacity(&self) -> usize {
        let total = self
            .upstream
            .device()
            .info()
            .map_or(usize::MAX / 4, |i| i.total_memory);
        match self.config.max_reserved {
            Some(m) if !self.config.recycle_pieces => m.min(total),
            _ => total,
        }
    }

    /// Gives back the free end of every frontier of shard `i` (its last
    /// block, free in the global lane), down to the granule holding that
    /// block's start, up to `excess` bytes or more. No lock is held across
    /// the upstream calls. Returns the bytes given back.
    pub(super) fn shrink_frontiers(&self, i: usize, excess: usize) -> Result<usize> {
        let Some(up) = self.expander() else {
            return Ok(0);
        };
        let unit = Self::growth_unit(up, self.config.growth.granularity);
        let mut released = 0;
        let mut first_err = None;
        for class in 0..super::CLASSES {
            if released >= excess {
                break;
            }
            let mut st = self.shards.lock(i);
            let Some(f) = st.frontier[class].filter(|f| !f.busy) else {
                continue;
            };
            let Some((_, tail)) = st.heaps[class].region_tail(f.region) else {
                continue;
            };
            if !tail.is_free_in(LaneId::GLOBAL.0) {
                continue;
            }
            let keep = ((tail.addr() - f.base) as usize).next_multiple_of(unit);
            if keep == 0 || keep >= f.bytes {
                // Entirely free (a region to give back whole) or less than
                // a granule free.
                continue;
            }
            // Out of the heap before the upstream call, so nothing is
            // handed out of it meanwhile.
            if st.heaps[class]
                .shrink_region(f.region, keep as u64)
                .is_err()
            {
                continue;
            }
            if let Some(fr) = st.frontier[class].as_mut() {
                fr.busy = true;
            }
            drop(st);
            let kept = up.shrink(DevicePtr(f.base), f.bytes, keep);
            let mut st = self.shards.lock(i);
            let mut g = self.shards.global();
            let kept = match kept {
                Ok(k) => k.clamp(keep, f.bytes),
                Err(e) => {
                    first_err.get_or_insert(e);
                    f.bytes
                }
            };
            if kept > keep {
                // What the upstream kept (a piece across the cut, or all of
                // it on an error) is the heap's again.
                let _ = st.heaps[class].extend_region(f.region, (kept - keep) as u64);
            }
            if let Some(fr) = st.frontier[class].as_mut() {
                fr.busy = false;
                fr.bytes = kept;
            }
            g.regions.insert(f.base, kept, i);
            released += f.bytes - kept;
        }
        first_err.map_or(Ok(released), Err)
    }
}
