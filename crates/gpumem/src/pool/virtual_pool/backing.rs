//! Physical backing: mapping memory under the unmapped pages of a new block
//! (cached extents, idle extents as aliases, new extents), all or nothing.

use super::page_table::{PageRef, PageSpan, PageTable, PhysPage};
use super::phys_cache::ExtentId;
use super::{State, VirtualPool, SMALL};
use crate::pool::stream_order::streams::may_wait;
use crate::{Error, Result};

/// Mappings made: (reservation, first page, extent).
pub(super) type Mapped = Vec<(usize, usize, ExtentId)>;

impl VirtualPool {
    /// Maps physical memory under the unmapped pages of `span`, all or
    /// nothing, for the stream of bit `taker`.
    #[cold]
    pub(super) fn map_missing(
        &self,
        st: &mut State,
        span: PageSpan,
        requested: usize,
        taker: u64,
    ) -> Result<()> {
        let runs = st.pages.unmapped_runs(span);
        self.map_runs(st, &[(span.res, runs)], requested, taker)
            .map(drop)
    }

    /// Maps physical memory under `runs` (unmapped pages, per reservation:
    /// (first page, pages)) and makes them accessible, all or nothing, for
    /// the stream of bit `taker`; returns the mappings made.
    pub(super) fn map_runs(
        &self,
        st: &mut State,
        runs: &[(usize, Vec<(usize, usize)>)],
        requested: usize,
        taker: u64,
    ) -> Result<Mapped> {
        let _relaxed = crate::graph::relaxed(&self.device);
        let mut made: Mapped = Vec::new();
        let mut result = Ok(());
        for (res, r) in runs {
            let mut done = Vec::new();
            result = self.back_runs(st, *res, r, requested, taker, &mut done);
            made.extend(done.into_iter().map(|(start, x)| (*res, start, x)));
            if result.is_err() {
                break;
            }
        }
        if result.is_ok()
            && Self::alias_pages(st)
                > self
                    .config
                    .max_alias_ratio
                    .saturating_mul(st.phys.total_pages())
        {
            // Collected after the new mappings (which own their pages).
            result = self.collect_aliases(st).map(|_| ());
        }
        if result.is_ok() {
            result = runs.iter().try_for_each(|(res, r)| {
                r.iter()
                    .try_for_each(|&(start, count)| self.grant_access(st, *res, start, count))
            });
        }
        if let Err(e) = result {
            self.unmap_made(st, &made);
            return Err(e);
        }
        self.release_cached(st, self.config.release_threshold);
        Ok(made)
    }

    /// Gives the device and its peers read-write access to the `count`
    /// mapped pages from page `start` of reservation `res` (whole mappings):
    /// one `cuMemSetAccess` per device.
    pub(super) fn grant_access(
        &self,
        st: &State,
        res: usize,
        start: usize,
        count: usize,
    ) -> Result<()> {
        let at = PageRef { res, idx: start };
        let devices =
            std::iter::once(self.device.ordinal()).chain(self.config.peers.iter().copied());
        for d in devices {
            self.vmm().grant(st, at, count, d)?;
        }
        Ok(())
    }

    /// Undoes the mappings `made` (their extents go to the cache, and back
    /// to the driver beyond `release_threshold`).
    pub(super) fn unmap_made(&self, st: &mut State, made: &[(usize, usize, ExtentId)]) {
        for &(res, start, x) in made {
            let n = st.phys.pages(x);
            // A mapping the driver keeps stays recorded (the drop unmaps it).
            let _ = self.unmap_mapping(st, x, PageTable::pack(res, start), n);
        }
        self.release_cached(st, self.config.release_threshold);
    }

    /// Backs the unmapped `runs` of reservation `res`: cached extents that fit, idle
    /// extents mapped elsewhere that fit (aliased), then new extents (one per
    /// run) within the slack over the live peak; beyond it, idle extents that
    /// fit nowhere here are unmapped everywhere and released first; on
    /// out-of-memory it waits for every freeing stream, takes every idle
    /// extent and retries page by page. Extents mapped are listed in `done`.
    pub(super) fn back_runs(
        &self,
        st: &mut State,
        res: usize,
        runs: &[(usize, usize)],
        requested: usize,
        taker: u64,
        done: &mut Vec<(usize, ExtentId)>,
    ) -> Result<()> {
        let mut pieces = runs.to_vec();
        let short = |p: &[(usize, usize)]| p.iter().map(|x| x.1).sum::<usize>();
        self.fill_from_cache(st, res, &mut pieces, done)?;
        self.alias_idle(st, res, &mut pieces, taker, done)?;
        // Within the slack over the live peak, new memory is made rather than
        // idle extents moved: fewer driver calls for the same leanness target.
        let room = self.create_room(st);
        let mut oom = false;
        if short(&pieces) > 0 && short(&pieces) <= room {
            match self.create_into(st, res, &mut pieces, usize::MAX, done) {
                Ok(()) => {}
                Err(e) if e.is_oom() => oom = true,
                Err(e) => return Err(e),
            }
        }
        if short(&pieces) > 0 && !oom {
            self.uncover_idle(st, short(&pieces))?;
            self.fill_from_cache(st, res, &mut pieces, done)?;
            // What fits nowhere here goes back before new memory is made.
            self.release_cached(st, self.config.release_threshold);
            match self.create_into(st, res, &mut pieces, usize::MAX, done) {
                Ok(()) => {}
                Err(e) if e.is_oom() => oom = true,
                Err(e) => return Err(e),
            }
        }
        if oom {
            // Wait for pending unmaps (not during a capture: see
            // `stream_order::streams::may_wait`), take every idle extent,
            // retry page by page.
            if may_wait() {
                st.streams.synchronize_all(&self.device)?;
            }
            self.reclaim(st, usize::MAX)?;
            self.fill_from_cache(st, res, &mut pieces, done)?;
            self.release_cached(st, 0);
            match self.create_into(st, res, &mut pieces, 1, done) {
                Ok(()) => {}
                Err(e) if e.is_oom() => return Err(self.oom(st, requested)),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Pages shard `st` may create before idle memory is given back ahead
    /// of making new: up to its live peak plus the slack (the larger of
    /// `slack_permille` of the peak and `slack_min_bytes`), and within the
    /// pool's `max_reserved`, so that a pool at its limit gives back idle
    /// memory rather than failing a create and waiting for every stream.
    pub(super) fn create_room(&self, st: &State) -> usize {
        let peak = st.peak_live.max(st.live_bytes());
        let slack = (peak / 1000)
            .saturating_mul(self.config.slack_permille)
            .max(self.config.slack_min_bytes);
        let room = (peak.saturating_add(slack) / self.gran).saturating_sub(st.phys.total_pages());
        match st.max_physical {
            Some(max) => room.min((max / self.gran).saturating_sub(st.phys.pool_pages())),
            None => room,
        }
    }

    /// Backs the rest of every piece with new extents of at most `max`
    /// pages (one extent per piece when memory allows).
    pub(super) fn create_into(
        &self,
        st: &mut State,
        res: usize,
        pieces: &mut [(usize, usize)],
        max: usize,
        done: &mut Vec<(usize, ExtentId)>,
    ) -> Result<()> {
        for piece in pieces.iter_mut() {
            while piece.1 > 0 {
                let x = self.create(st, piece.1.min(max).min(self.config.max_extent_pages))?;
                let n = self.map_extent(st, res, piece.0, x, done)?;
                piece.0 += n;
                piece.1 -= n;
            }
        }
        Ok(())
    }

    /// Creates one extent of up to `n` pages (fewer where `max_reserved`
    /// leaves less room), not cached. Returns its index, or the driver's
    /// error.
    pub(super) fn create(&self, st: &mut State, n: usize) -> Result<ExtentId> {
        let mut n = n.max(1);
        if let Some(max) = st.max_physical {
            let room = (max / self.gran).saturating_sub(st.phys.pool_pages());
            if room == 0 {
                return Err(Error::oom(self.gran));
            }
            n = n.min(room);
        }
        let h = self.device.driver().vmm_create(
            self.device.ordinal(),
            n * self.gran,
            self.phys_props,
        )?;
        let x = st.phys.add_extent(h, n as u32);
        st.pages_created += n as u64;
        st.extents_created += 1;
        st.peak_extents = st.peak_extents.max(st.phys.extent_count());
        st.extent_classes[self.class_of_extent(n)].created(n * self.gran);
        self.peak_pages
            .fetch_max(st.phys.pool_pages(), std::sync::atomic::Ordering::Relaxed);
        Ok(x)
    }

    /// Maps extent `x` whole at page `idx` of reservation `res` (one
    /// `cuMemMap`); on failure it goes to the cache.
    pub(super) fn map_extent(
        &self,
        st: &mut State,
        res: usize,
        idx: usize,
        x: ExtentId,
        done: &mut Vec<(usize, ExtentId)>,
    ) -> Result<usize> {
        let n = st.phys.pages(x);
        if let Err(e) = self.vmm().map(st, PageRef { res, idx }, x) {
            if st.phys.extent(x).is_some_and(|ext| ext.mappings.is_empty()) {
                st.phys.put(x);
            }
            return Err(e);
        }
        st.phys.mapped_at(x, PageTable::pack(res, idx));
        for i in 0..n {
            let p = PageRef { res, idx: idx + i };
            let pp = PhysPage {
                extent: x,
                index: i as u32,
            };
            st.pages.set_mapped(p, pp);
            if st.pages.busy(p) {
                st.pages.own_new(p, &mut st.phys);
            }
        }
        st.mappings_made += 1;
        st.pages_mapped += n as u64;
        done.push((idx, x));
        Ok(n)
    }

    /// Fills the fronts of `pieces` (first page, pages still unbacked) with
    /// cached extents that fit.
    pub(super) fn fill_from_cache(
        &self,
        st: &mut State,
        res: usize,
        pieces: &mut [(usize, usize)],
        done: &mut Vec<(usize, ExtentId)>,
    ) -> Result<()> {
        for piece in pieces.iter_mut() {
            while piece.1 > 0 {
                let Some(x) = st.phys.take_fitting(piece.1) else {
                    break;
                };
                let n = self.map_extent(st, res, piece.0, x, done)?;
                piece.0 += n;
                piece.1 -= n;
            }
        }
        Ok(())
    }

    /// Maps idle extents that stay mapped elsewhere (aliases) under the
    /// fronts of `pieces`, largest that fit first: no new memory and no
    /// unmap, and the old mappings stay for when the memory is wanted back
    /// there. An extent qualifies when no page of it is in use through any
    /// mapping and its frees are safe for the stream of bit `taker`.
    pub(super) fn alias_idle(
        &self,
        st: &mut State,
        res: usize,
        pieces: &mut [(usize, usize)],
        taker: u64,
        done: &mut Vec<(usize, ExtentId)>,
    ) -> Result<()> {
        let longest = pieces.iter().map(|p| p.1).max().unwrap_or(0);
        if longest == 0 {
            return Ok(());
        }
        // Small and large areas keep their own memory: small blocks share
        // pages, so memory passing between them would conflict at every turn.
        let small = st.area_of(st.pages.addr(PageRef {
            res,
            idx: pieces[0].0,
        })) == Some(SMALL);
        let mut cands = st.idle_extents(
            |n, area| n <= longest && (area == Some(SMALL)) == small,
            |streams, m, t| streams.safe_for(taker, m, t),
        );
        for piece in pieces.iter_mut() {
            while piece.1 > 0 {
                let Some(k) = cands.iter().position(|&(n, _)| n <= piece.1) else {
                    break;
                };
                let (_, x) = cands.remove(k);
                let n = self.map_extent(st, res, piece.0, x, done)?;
                st.aliases_made += 1;
                piece.0 += n;
                piece.1 -= n;
            }
        }
        Ok(())
    }
}
