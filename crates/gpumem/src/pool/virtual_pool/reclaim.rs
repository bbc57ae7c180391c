//! Giving memory back: collecting idle aliases, unmapping idle extents into
//! the cache, and releasing cached extents to the driver.

use super::page_table::{PackedPage, PageRef, PageTable};
use super::phys_cache::ExtentId;
use super::{area_at, State, VirtualPool};
use crate::driver::RawPhys;
use crate::pool::stream_order::free_streams::FreeStreams;
use crate::{Error, Result};

impl VirtualPool {
    /// Unmaps idle aliases: mappings of extents mapped elsewhere too whose
    /// pages have no live block, own no physical page (the memory is in use
    /// or kept through another mapping) and were freed by streams known
    /// done. Unmapped pages conflict with nothing, so this bounds both the
    /// aliases kept and the address space conflicts would otherwise take.
    /// Returns the mappings unmapped.
    #[cold]
    pub(super) fn collect_aliases(&self, st: &mut State) -> Result<u64> {
        st.streams.begin_pass();
        let mut victims: Vec<(ExtentId, PackedPage, usize)> = Vec::new();
        {
            let State {
                pages,
                phys,
                streams,
                ..
            } = &mut *st;
            for (x, ext) in phys.extents() {
                // The extent's frees cover all its mappings.
                let len = phys.pages(x);
                let frees = pages.extent_frees(x, phys);
                if ext.mappings.len() < 2 || !frees.quiet(|m, t| streams.complete(m, t)) {
                    continue;
                }
                let mut left = ext.mappings.len();
                for &at in &ext.mappings {
                    if left < 2 {
                        break; // the last mapping stays
                    }
                    let unused = (0..len as u64).all(|i| {
                        let p = PageTable::unpack(at + i);
                        !pages.busy(p) && !pages.owns(p)
                    });
                    if unused {
                        victims.push((x, at, len));
                        left -= 1;
                    }
                }
            }
        }
        let mut n = 0;
        for (x, at, len) in victims {
            self.unmap_mapping(st, x, at, len)?;
            n += 1;
        }
        st.aliases_collected += n;
        Ok(n)
    }

    /// Unmaps the mapping of extent `x` (of `len` pages) whose first page is
    /// `at` (one `cuMemUnmap`); an extent left mapped nowhere goes to the
    /// cache.
    pub(super) fn unmap_mapping(
        &self,
        st: &mut State,
        x: ExtentId,
        at: PackedPage,
        len: usize,
    ) -> Result<()> {
        let p = PageTable::unpack(at);
        self.vmm().unmap(st, p, len)?;
        for i in 0..len {
            let q = PageRef {
                res: p.res,
                idx: p.idx + i,
            };
            st.pages.set_unmapped(q);
        }
        st.pages.unmapped_at(x, at, &mut st.phys);
        st.mappings_unmapped += 1;
        Ok(())
    }

    /// Pages mapped as aliases (beyond one mapping per mapped extent).
    pub(super) fn alias_pages(st: &State) -> usize {
        let mapped_phys = st.phys.total_pages() - st.phys.cached_pages();
        st.pages.mapped_pages().saturating_sub(mapped_phys)
    }

    /// Unmaps whole idle extents whose freeing streams are complete into the
    /// cache until at least `want` pages are cached by it (all of them for
    /// `usize::MAX`): largest that fit in what is still wanted first, then the
    /// smallest that cover the rest. Adjacent extents go with one
    /// `cuMemUnmap`. Returns the pages unmapped.
    pub(super) fn reclaim(&self, st: &mut State, want: usize) -> Result<usize> {
        if want != 0 && !st.kept.is_empty() {
            self.flush_kept(st, want)?;
        }
        if want == 0 || st.pages.idle_pages() == 0 {
            return Ok(0);
        }
        let _relaxed = crate::graph::relaxed(&self.device);
        st.streams.begin_pass();
        let State {
            pages,
            streams,
            phys,
            ..
        } = st;
        // Longest runs of reclaimable idle pages first (fewest calls, and
        // the pages least likely to be wanted back where they are); the
        // mappings lying wholly within them.
        let mut runs = pages.reclaimable_runs(streams, phys);
        runs.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        let mut chosen: Vec<(PageRef, usize)> = Vec::new();
        // Mappings larger than what was still wanted when met.
        let mut larger: Vec<(PageRef, usize)> = Vec::new();
        let mut got = 0;
        'runs: for (r, n) in runs {
            let end = r.idx + n;
            let mut idx = r.idx;
            while idx < end {
                if got >= want {
                    break 'runs;
                }
                let Some(pp) = pages.phys_at(PageRef { res: r.res, idx }) else {
                    idx += 1;
                    continue;
                };
                let start = idx - pp.index as usize;
                let len = phys.pages(pp.extent).max(1);
                if start >= r.idx && start + len <= end {
                    let mapping = (
                        PageRef {
                            res: r.res,
                            idx: start,
                        },
                        len,
                    );
                    if want == usize::MAX || got + len <= want {
                        got += len;
                        chosen.push(mapping);
                    } else {
                        larger.push(mapping);
                    }
                }
                idx = start + len;
            }
        }
        // The smallest of the larger ones cover the rest.
        larger.sort_by_key(|&(_, n)| n);
        for mapping in larger {
            if got >= want {
                break;
            }
            got += mapping.1;
            chosen.push(mapping);
        }
        chosen.sort_by_key(|&(p, _)| (p.res, p.idx));
        // Adjacent mappings: one call; (first page, pages, mappings).
        let mut runs: Vec<(PageRef, usize, u64)> = Vec::new();
        for (p, n) in chosen {
            match runs.last_mut() {
                Some((r, m, k)) if r.res == p.res && r.idx + *m == p.idx => {
                    *m += n;
                    *k += 1;
                }
                _ => runs.push((p, n, 1)),
            }
        }
        let vmm = self.vmm();
        let mut got = 0;
        let mut first_err = None;
        for (r, n, k) in runs {
            match vmm.unmap(st, r, n) {
                Ok(()) => {
                    for i in 0..n {
                        let p = PageRef {
                            res: r.res,
                            idx: r.idx + i,
                        };
                        if let Some(pp) = st.pages.set_unmapped(p) {
                            if pp.index == 0 {
                                let at = PageTable::pack(p.res, p.idx);
                                st.pages.unmapped_at(pp.extent, at, &mut st.phys);
                            }
                        }
                    }
                    st.mappings_unmapped += k;
                    got += n;
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) if got == 0 => Err(e),
            _ => Ok(got),
        }
    }

    /// Unmaps every mapping of whole idle extents (no page in use through
    /// any mapping, every stream that freed a block at any of them known
    /// done) into the cache, largest first, until at least `want` pages are
    /// cached by it. Returns the pages cached.
    pub(super) fn uncover_idle(&self, st: &mut State, want: usize) -> Result<usize> {
        st.streams.begin_pass();
        let cands = st.idle_extents(|_, _| true, |streams, m, t| streams.complete(m, t));
        let mut got = 0;
        for (n, x) in cands {
            if got >= want {
                break;
            }
            let at = st
                .phys
                .extent(x)
                .map_or_else(Vec::new, |ext| ext.mappings.clone());
            for a in at {
                self.unmap_mapping(st, x, a, n)?;
            }
            got += n;
        }
        Ok(got)
    }

    /// Releases whole cached extents until at most `keep` bytes stay cached.
    /// An extent the driver refuses to release stays cached (a later trim,
    /// release or the drop tries again). Returns the bytes released, and the
    /// first error.
    pub(super) fn release_cached(&self, st: &mut State, keep: usize) -> (usize, Option<Error>) {
        let taken = st.phys.take_releasable(keep / self.gran);
        self.release_taken(st, taken)
    }

    /// Releases extents taken out of the cache (handles and pages); one the
    /// driver refuses goes back to the cache. Returns the bytes released,
    /// and the first error.
    pub(super) fn release_taken(
        &self,
        st: &mut State,
        taken: Vec<(RawPhys, u32)>,
    ) -> (usize, Option<Error>) {
        let _relaxed = crate::graph::relaxed(&self.device);
        let vmm = self.vmm();
        let mut released = 0;
        let mut first_err = None;
        for (h, pages) in taken {
            if let Err(e) = vmm.release(h) {
                let x = st.phys.add_extent(h, pages);
                st.phys.put(x);
                first_err.get_or_insert(e);
                continue;
            }
            released += pages as usize * self.gran;
            st.pages_released += u64::from(pages);
            st.extents_released += 1;
            let n = pages as usize;
            st.extent_classes[self.class_of_extent(n)].released(n * self.gran);
        }
        (released, first_err)
    }
}

impl State {
    /// The extents mapped somewhere with no page in use through any mapping
    /// that `fits(pages, area of its first mapping)` accepts and whose
    /// frees (asked last: they may query streams) `quiet(streams, mask,
    /// tick)` finds done: (pages, extent), largest first.
    pub(super) fn idle_extents(
        &mut self,
        mut fits: impl FnMut(usize, Option<usize>) -> bool,
        mut quiet: impl FnMut(&mut FreeStreams, u64, u64) -> bool,
    ) -> Vec<(usize, ExtentId)> {
        let State {
            pages,
            phys,
            streams,
            area_ranges,
            ..
        } = self;
        let mut out = Vec::new();
        for (x, ext) in phys.extents() {
            let Some(&first) = ext.mappings.first() else {
                continue;
            };
            let n = phys.pages(x);
            let home = area_at(area_ranges, pages.addr(PageTable::unpack(first)));
            if !fits(n, home) || pages.extent_busy(x, phys) {
                continue;
            }
            if pages
                .extent_frees(x, phys)
                .quiet(|m, t| quiet(streams, m, t))
            {
                out.push((n, x));
            }
        }
        out.sort_by_key(|&(n, x)| (std::cmp::Reverse(n), x));
        out
    }
}
