//! Giving memory back: collecting idle aliases, unmapping idle extents into
//! the cache, and releasing cached extents to the driver.

use super::free_streams::FreeStreams;
use super::page_table::{PageRef, PageTable};
use super::{ranges_arena, State, VirtualPool};
use crate::driver::DevicePtr;
use crate::{Error, Result};

impl VirtualPool {
    /// Unmaps every idle page whose freeing streams are known complete
    /// (without waiting for any) and releases every physical chunk that is
    /// then entirely unmapped. Returns the physical bytes given back.
    pub fn trim(&self) -> Result<usize> {
        let mut st = self.lock();
        self.reclaim(&mut st, usize::MAX)?;
        match self.release_cached(&mut st, 0) {
            (_, Some(e)) => Err(e),
            (bytes, None) => Ok(bytes),
        }
    }

    /// Waits for every stream that freed blocks, then trims: all physical
    /// memory not under a live block goes back. Returns the bytes given back.
    pub fn release(&self) -> Result<usize> {
        let mut st = self.lock();
        st.streams.synchronize_all(&self.device)?;
        for a in st.arenas.iter_mut() {
            a.lanes.settle_blocking(&mut a.heap)?;
        }
        st.streams.prune();
        self.reclaim(&mut st, usize::MAX)?;
        match self.release_cached(&mut st, 0) {
            (_, Some(e)) => Err(e),
            (bytes, None) => Ok(bytes),
        }
    }

    /// Unmaps idle aliases: mappings of extents mapped elsewhere too whose
    /// pages have no live block, own no physical page (the memory is in use
    /// or kept through another mapping) and were freed by streams known
    /// done. Unmapped pages conflict with nothing, so this bounds both the
    /// aliases kept and the address space conflicts would otherwise take.
    /// Returns the mappings unmapped.
    #[cold]
    pub(super) fn collect_aliases(&self, st: &mut State) -> Result<u64> {
        st.streams.begin_pass();
        let mut victims: Vec<(u32, u64, usize)> = Vec::new();
        {
            let State {
                pages,
                phys,
                streams,
                ..
            } = &mut *st;
            for (c, ch) in phys.chunks() {
                // The extent's frees cover all its mappings.
                let e = phys.extent(c);
                let frees = pages.extent_frees(c, phys);
                if ch.at.len() < 2 || !frees.quiet(|m, t| streams.complete(m, t)) {
                    continue;
                }
                let mut left = ch.at.len();
                for &at in &ch.at {
                    if left < 2 {
                        break; // the last mapping stays
                    }
                    let unused = (0..u64::from(e.pages)).all(|i| {
                        let p = PageTable::unpack(at + i);
                        !pages.busy(p) && !pages.owns(p)
                    });
                    if unused {
                        victims.push((c, at, e.pages as usize));
                        left -= 1;
                    }
                }
            }
        }
        let mut n = 0;
        for (c, at, len) in victims {
            self.unmap_mapping(st, c, at, len)?;
            n += 1;
        }
        st.aliases_collected += n;
        Ok(n)
    }

    /// Unmaps the mapping of extent `c` (of `len` pages) at packed page `at`
    /// (one `cuMemUnmap`); an extent left mapped nowhere goes to the cache.
    pub(super) fn unmap_mapping(&self, st: &mut State, c: u32, at: u64, len: usize) -> Result<()> {
        let p = PageTable::unpack(at);
        self.device
            .driver()
            .vmm_unmap(DevicePtr(st.pages.addr(p)), len * self.gran)?;
        for i in 0..len {
            let q = PageRef {
                seg: p.seg,
                idx: p.idx + i,
            };
            st.pages.set_unmapped(q);
        }
        st.pages.unmapped_at(c, at, &mut st.phys);
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
        if want == 0 || st.pages.idle_pages() == 0 {
            return Ok(0);
        }
        st.streams.begin_pass();
        let State {
            pages,
            streams,
            phys,
            ..
        } = st;
        // Longest runs of reclaimable idle pages first (fewest calls, and
        // the pages least likely to be wanted back where they are); the
        // extents lying wholly within them.
        let mut runs = pages.reclaimable_runs(streams, phys);
        runs.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        let mut chosen: Vec<(PageRef, usize)> = Vec::new();
        // Extents larger than what was still wanted when met.
        let mut larger: Vec<(PageRef, usize)> = Vec::new();
        let mut got = 0;
        'runs: for (r, n) in runs {
            let end = r.idx + n;
            let mut idx = r.idx;
            while idx < end {
                if got >= want {
                    break 'runs;
                }
                let Some(pp) = pages.phys_at(PageRef { seg: r.seg, idx }) else {
                    idx += 1;
                    continue;
                };
                let start = idx - pp.index as usize;
                let len = phys.pages(pp.chunk).max(1);
                if start >= r.idx && start + len <= end {
                    let e = (
                        PageRef {
                            seg: r.seg,
                            idx: start,
                        },
                        len,
                    );
                    if want == usize::MAX || got + len <= want {
                        got += len;
                        chosen.push(e);
                    } else {
                        larger.push(e);
                    }
                }
                idx = start + len;
            }
        }
        // The smallest of the larger ones cover the rest.
        larger.sort_by_key(|&(_, n)| n);
        for e in larger {
            if got >= want {
                break;
            }
            got += e.1;
            chosen.push(e);
        }
        chosen.sort_by_key(|&(p, _)| (p.seg, p.idx));
        // Adjacent extents: one call; (first page, pages, extents).
        let mut runs: Vec<(PageRef, usize, u64)> = Vec::new();
        for (p, n) in chosen {
            match runs.last_mut() {
                Some((r, m, k)) if r.seg == p.seg && r.idx + *m == p.idx => {
                    *m += n;
                    *k += 1;
                }
                _ => runs.push((p, n, 1)),
            }
        }
        let driver = self.device.driver();
        let g = self.gran;
        let mut got = 0;
        let mut first_err = None;
        for (r, n, k) in runs {
            let addr = st.pages.addr(r);
            match driver.vmm_unmap(DevicePtr(addr), n * g) {
                Ok(()) => {
                    for i in 0..n {
                        let p = PageRef {
                            seg: r.seg,
                            idx: r.idx + i,
                        };
                        if let Some(pp) = st.pages.set_unmapped(p) {
                            if pp.index == 0 {
                                let at = PageTable::pack(p.seg, p.idx);
                                st.pages.unmapped_at(pp.chunk, at, &mut st.phys);
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
        for (n, c) in cands {
            if got >= want {
                break;
            }
            let at = st.phys.chunk(c).map_or_else(Vec::new, |ch| ch.at.clone());
            for a in at {
                self.unmap_mapping(st, c, a, n)?;
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
        let driver = self.device.driver();
        let mut released = 0;
        let mut first_err = None;
        for (h, pages) in st.phys.take_releasable(keep / self.gran) {
            if let Err(e) = driver.vmm_release(h) {
                let c = st.phys.add_chunk(h, pages);
                st.phys.put(c);
                first_err.get_or_insert(e);
                continue;
            }
            released += pages as usize * self.gran;
            st.pages_released += u64::from(pages);
            st.chunks_released += 1;
        }
        (released, first_err)
    }
}

impl State {
    /// The extents mapped somewhere with no page in use through any mapping
    /// that `fits(pages, arena of its first mapping)` accepts and whose
    /// frees (asked last: they may query streams) `quiet(streams, mask,
    /// tick)` finds done: (pages, extent), largest first.
    pub(super) fn idle_extents(
        &mut self,
        mut fits: impl FnMut(usize, Option<usize>) -> bool,
        mut quiet: impl FnMut(&mut FreeStreams, u64, u64) -> bool,
    ) -> Vec<(usize, u32)> {
        let State {
            pages,
            phys,
            streams,
            ranges,
            ..
        } = self;
        let mut out = Vec::new();
        for (c, ch) in phys.chunks() {
            let Some(&first) = ch.at.first() else {
                continue;
            };
            let n = phys.pages(c);
            let home = ranges_arena(ranges, pages.addr(PageTable::unpack(first)));
            if !fits(n, home) || pages.extent_busy(c, phys) {
                continue;
            }
            if pages
                .extent_frees(c, phys)
                .quiet(|m, t| quiet(streams, m, t))
            {
                out.push((n, c));
            }
        }
        out.sort_by_key(|&(n, c)| (std::cmp::Reverse(n), c));
        out
    }
}
