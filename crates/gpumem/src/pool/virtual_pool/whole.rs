//! The NCCL-ready mode
//! ([`VirtualPoolConfig::nccl_ready`](super::VirtualPoolConfig::nccl_ready)):
//! every block is exactly one physical allocation, mapped once, at the
//! block's address.
//!
//! NCCL's user-buffer registration and symmetric memory accept only memory
//! laid out as `ncclMemAlloc` lays it out: `cuMemGetAddressRange` of a
//! buffer gives the buffer's own mapping and `cuMemRetainAllocationHandle`
//! one handle for all of it. So in this mode:
//! - a request is rounded up to whole pages and placed at a page boundary,
//!   in the large area: no two blocks share a page;
//! - a freed block is kept whole for the next request of its size on its
//!   stream (`kept`); only a request that finds none goes to the heap;
//! - a block is handed out only over pages that are either all unmapped, or
//!   all mapped by one extent whose size is the block's, mapped there (the
//!   fast path: a block freed and asked for again at the same place and
//!   size costs no driver call). Otherwise another free place that is, or a
//!   fresh reservation; the idle extents left where blocks no longer fit go
//!   back under the pool's usual rules (the slack over the live peak,
//!   [`Pool::trim`](crate::pool::Pool::trim), out of memory);
//! - unmapped pages get one new extent of the block's size (or a cached one
//!   of exactly that size), then read-write access for the device and every
//!   peer; extents are never aliased and never split.
//!
//! Costs: a kept block is two hash-map lookups; the heap's path is the
//! usual one plus one page-table lookup; a
//! block that needs memory costs one `cuMemCreate`, one `cuMemMap` and one
//! `cuMemSetAccess` per device.

use super::page_table::{PageRef, PageSpan};
use super::placement::places_in;
use super::{State, VirtualPool, LARGE, NO_REGION};
use crate::driver::DevicePtr;
use crate::pool::stream_order::streams::may_wait;
use crate::stream::Stream;
use crate::suballoc::{Allocation, BlockId, LaneId};
use crate::{Error, Result};

/// What the pages under a place hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// One extent of exactly the block's size, mapped there.
    Exact,
    /// Nothing mapped.
    Empty,
    /// Anything else: the block cannot go there.
    Mixed,
}

impl VirtualPool {
    /// The block size of a request in this mode: whole pages.
    #[inline]
    pub(super) fn whole_size(&self, bytes: usize) -> Option<usize> {
        bytes.checked_next_multiple_of(self.gran)
    }

    /// [`MemoryResource::allocate`](crate::resource::MemoryResource::allocate)
    /// in the NCCL-ready mode (see the module documentation). Out of line:
    /// inlined, it made the usual mode's fast path 5% longer.
    #[cold]
    #[inline(never)]
    pub(super) fn allocate_whole(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<DevicePtr> {
        let mut guard = self.lock();
        let st = &mut *guard;
        let size = match self.whole_size(bytes) {
            Some(s) if s <= self.capacity => s,
            _ => return Err(self.oom(st, bytes)),
        };
        let align = alignment.max(self.gran);
        if st.regions.current != NO_REGION {
            Self::check_awake(st, bytes)?;
        }
        if let Some(addr) = st.kept.take(size, stream) {
            if addr.is_multiple_of(align as u64) {
                return Ok(Self::hand_out_kept(st, addr, bytes));
            }
            // Aligned more strictly than the block is: it goes to the heap.
            self.free_kept(st, addr, size, &stream.clone())?;
        }
        let (lane, mut blk) = self.take_block(st, LARGE, stream, size, align)?;
        let mut span = Self::span_of(st, &blk)?;
        let mut fit = Self::fit(st, span);
        if fit == Fit::Mixed {
            (blk, fit) = self.place_whole(st, lane, blk, size, align)?;
            span = Self::span_of(st, &blk)?;
        }
        let got = Self::acquire(st, span, stream);
        debug_assert!(!got.conflict, "no aliases in the NCCL-ready mode");
        if fit == Fit::Empty {
            if let Err(e) = self.back_whole(st, span, bytes) {
                st.pages.unacquire(span);
                let _ = st.areas[LARGE].heap.free(blk.addr, lane);
                return Err(e);
            }
        }
        let granular = crate::adaptor::granular_size(bytes).unwrap_or(size) as u64;
        st.whole_sizes.insert(blk.addr, granular);
        Ok(Self::hand_out(st, LARGE, &blk))
    }

    /// A kept block at `addr` handed out again for a request of `bytes`
    /// (its size in whole pages).
    fn hand_out_kept(st: &mut State, addr: u64, bytes: usize) -> DevicePtr {
        st.parked.remove(DevicePtr(addr));
        let granular = crate::adaptor::granular_size(bytes).unwrap_or(bytes) as u64;
        st.whole_sizes.insert(addr, granular);
        Self::note_peak(st);
        DevicePtr(addr)
    }

    /// True when a checked free of the block at `ptr` in `area` may keep it
    /// (see `kept`): no region is begun or asleep and the block has none.
    #[inline]
    pub(super) fn may_keep(st: &State, area: usize, ptr: DevicePtr) -> bool {
        st.regions.current == NO_REGION
            && !st.regions.has_sleeping_blocks()
            && st.areas[area].heap.used_tag(ptr.0) == Some(NO_REGION)
    }

    /// Keeps the block at `ptr`, freed as `bytes` (whole pages, the asked
    /// size checked) on `stream`, once the heap finds it a live block of
    /// that size.
    pub(super) fn keep_whole(
        st: &mut State,
        area: usize,
        ptr: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        let size = Self::park(st, area, ptr, bytes)?;
        st.whole_sizes.remove(&ptr.0);
        st.kept.keep(ptr.0, size, stream);
        Ok(())
    }

    /// Frees the kept block at `addr` (`bytes`, freed on `stream`) into the
    /// heap, as its free would have.
    fn free_kept(&self, st: &mut State, addr: u64, bytes: usize, stream: &Stream) -> Result<()> {
        st.parked.remove(DevicePtr(addr));
        self.free_checked(st, LARGE, DevicePtr(addr), bytes, stream)
    }

    /// Frees kept blocks into the heap, oldest first, until at least `want`
    /// pages are freed (`usize::MAX`: all): the pool is about to look for
    /// idle memory to unmap, and kept blocks are the first it may take.
    pub(super) fn flush_kept(&self, st: &mut State, want: usize) -> Result<()> {
        let mut got = 0;
        while got < want {
            let Some((addr, bytes, stream)) = st.kept.take_oldest() else {
                break;
            };
            self.free_kept(st, addr, bytes, &stream)?;
            got = got.saturating_add(bytes / self.gran);
        }
        Ok(())
    }

    fn span_of(st: &State, blk: &Allocation) -> Result<PageSpan> {
        st.pages.span(blk.addr, blk.size).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "virtual pool: block {:#x} outside its reservations",
                blk.addr
            ))
        })
    }

    /// What the pages of `span` (no live block on them) hold.
    fn fit(st: &State, span: PageSpan) -> Fit {
        let n = span.last - span.first + 1;
        let first = PageRef {
            res: span.res,
            idx: span.first,
        };
        match st.pages.phys_at(first) {
            Some(pp) if pp.index == 0 && st.phys.pages(pp.extent) == n => Fit::Exact,
            Some(_) => Fit::Mixed,
            None if st.pages.count_unmapped(span) == n => Fit::Empty,
            None => Fit::Mixed,
        }
    }

    /// `blk` (from `lane`, pages not acquired) cannot hold one extent: gives
    /// it back and takes a place that can, among up to 64 free places of the
    /// lane and the global lane (one already backed first), else at the
    /// start of a fresh reservation (after unmapping idle extents whose
    /// frees are done, when address space is scarce).
    #[cold]
    fn place_whole(
        &self,
        st: &mut State,
        lane: LaneId,
        blk: Allocation,
        size: usize,
        align: usize,
    ) -> Result<(Allocation, Fit)> {
        let _ = st.areas[LARGE].heap.free(blk.addr, lane);
        if let Some(found) = self.find_whole_place(st, lane, size, align) {
            return Ok(found);
        }
        if self.va_is_scarce(st) {
            self.flush_kept(st, usize::MAX)?;
            self.uncover_idle(st, usize::MAX)?;
            if let Some(found) = self.find_whole_place(st, lane, size, align) {
                return Ok(found);
            }
        }
        st.relocations += 1;
        let fresh = self.fresh_block(st, LARGE, size, align)?;
        Ok((fresh, Fit::Empty))
    }

    /// A free place of `size` bytes at `align` whose pages fit one extent:
    /// taken out of the heap, with what its pages hold.
    fn find_whole_place(
        &self,
        st: &mut State,
        lane: LaneId,
        size: usize,
        align: usize,
    ) -> Option<(Allocation, Fit)> {
        const CANDIDATES: usize = 64;
        let (size, align) = (size as u64, align as u64);
        let mut best: Option<(BlockId, u64, Fit)> = None;
        for l in [lane, LaneId::GLOBAL] {
            let mut seen = 0;
            st.areas[LARGE]
                .heap
                .for_each_free_at_least(l, size, |id, addr, bsize| {
                    seen += 1;
                    for at in places_in(addr, bsize, size, align) {
                        let Some(span) = st.pages.span(at, size) else {
                            continue;
                        };
                        match Self::fit(st, span) {
                            Fit::Mixed => {}
                            Fit::Exact => {
                                best = Some((id, at, Fit::Exact));
                                return false;
                            }
                            Fit::Empty if best.is_none() => best = Some((id, at, Fit::Empty)),
                            Fit::Empty => {}
                        }
                    }
                    seen < CANDIDATES
                });
            if matches!(best, Some((_, _, Fit::Exact))) {
                break;
            }
        }
        let (id, at, fit) = best?;
        let moved = st.areas[LARGE].heap.allocate_from(id, at, size)?;
        st.relocations += 1;
        Some((moved, fit))
    }

    /// Backs the unmapped pages of `span` (a block's, acquired) with one
    /// extent of exactly their size, mapped there and made accessible to
    /// the device and its peers; all or nothing. A cached extent of that
    /// size first; a new one within the slack over the live peak, beyond it
    /// after unmapping idle extents; on out of memory, after waiting for
    /// the freeing streams and giving back every idle extent.
    #[cold]
    fn back_whole(&self, st: &mut State, span: PageSpan, requested: usize) -> Result<()> {
        let _relaxed = crate::graph::relaxed(&self.device);
        let n = span.last - span.first + 1;
        let x = match st.phys.take_exact(n) {
            Some(x) => x,
            None => {
                if n > self.create_room(st) {
                    self.uncover_idle(st, n)?;
                    self.release_cached(st, self.config.release_threshold);
                }
                match self.create_whole(st, n) {
                    Ok(x) => x,
                    Err(e) if e.is_oom() => {
                        // Kept blocks first, so that the wait covers them.
                        self.flush_kept(st, usize::MAX)?;
                        if may_wait() {
                            st.streams.synchronize_all(&self.device)?;
                        }
                        self.reclaim(st, usize::MAX)?;
                        self.release_cached(st, 0);
                        self.create_whole(st, n).map_err(|e| {
                            if e.is_oom() {
                                self.oom(st, requested)
                            } else {
                                e
                            }
                        })?
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let mut done = Vec::new();
        self.map_extent(st, span.res, span.first, x, &mut done)?;
        if let Err(e) = self.grant_access(st, span.res, span.first, n) {
            self.unmap_made(st, &[(span.res, span.first, x)]);
            return Err(e);
        }
        self.release_cached(st, self.config.release_threshold);
        Ok(())
    }

    /// One new extent of exactly `n` pages (out of memory where
    /// `max_reserved` leaves less room).
    fn create_whole(&self, st: &mut State, n: usize) -> Result<super::phys_cache::ExtentId> {
        if let Some(max) = st.max_physical {
            let room = (max / self.gran).saturating_sub(st.phys.pool_pages());
            if room < n {
                return Err(Error::oom(n * self.gran));
            }
        }
        self.create(st, n)
    }
}
