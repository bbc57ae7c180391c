//! The physical memory of a [`VirtualPool`](super::VirtualPool): its
//! extents (one `cuMemCreate` allocation of one or more physical pages
//! each), where each is mapped, which page owns each of its physical pages,
//! and the cache of extents mapped nowhere. See the glossary in
//! `docs/virtual_pool.md`.
//!
//! CUDA maps a physical allocation only from offset 0, so an extent is
//! mapped whole, with one `cuMemMap`, under a run of consecutive pages. It
//! may have several mappings at once (*aliases*: CUDA allows one allocation
//! under several virtual addresses, and makes writes through one visible
//! through the others once the writing operation completes). Each physical
//! page has one *owner*, the page through which blocks may use it; the pool
//! hands out a block only over pages that own their memory, so no two live
//! blocks ever share a physical byte. A physical page passes to another
//! alias only when its owner has no live block and every stream that freed
//! a block on the extent (other than the taker's) is known to be done
//! ([`Frees`]: recorded by the page table per 64 pages under each mapping,
//! kept by the extent when a mapping goes). Costs: put and
//! [`PhysCache::take_fitting`] are O(cached extents), which stay few.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use super::page_table::PackedPage;
use crate::driver::RawPhys;
use crate::pool::stream_order::free_streams::Frees;

/// The index of an extent in the [`PhysCache`] (reused once the extent is
/// released).
pub(super) type ExtentId = u32;

/// No owner (a packed page never takes this value).
pub(super) const NO_OWNER: PackedPage = u64::MAX;

/// One extent: its handle, its mappings and the owners of its pages.
pub(super) struct Extent {
    pub(super) handle: RawPhys,
    /// Its mappings: the first page (packed) of each.
    pub(super) mappings: Vec<PackedPage>,
    /// Per physical page: the page that owns it, or [`NO_OWNER`].
    pub(super) owners: Vec<PackedPage>,
}

/// The small, dense part of an extent, read on hot paths: its size and the
/// frees made through mappings it no longer has (frees through its current
/// mappings are kept by the page table, per 64 pages; see
/// `PageTable::extent_frees`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct ExtentSummary {
    pub(super) frees: Frees,
    /// Its pages (0 for a vacant index).
    pub(super) pages: u32,
}

/// Every extent held, and the cache of those mapped nowhere.
#[derive(Default)]
pub(super) struct PhysCache {
    extents: Vec<Option<Extent>>,
    /// Per extent index: its [`ExtentSummary`].
    summaries: Vec<ExtentSummary>,
    /// Indexes of released extents, for reuse.
    vacant: Vec<ExtentId>,
    /// The cache: extents mapped nowhere.
    cached: Vec<ExtentId>,
    /// Pages of all extents.
    total_pages: usize,
    /// Pages of the cached extents.
    cached_pages: usize,
    /// Pages of all extents of every shard of the pool (each shard has its
    /// own cache; they share this count, for the pool's limit).
    pool_pages: Arc<AtomicUsize>,
}

impl PhysCache {
    /// An empty cache whose pages count in `pool_pages` too.
    pub(super) fn sharing(pool_pages: Arc<AtomicUsize>) -> Self {
        Self {
            pool_pages,
            ..Self::default()
        }
    }

    /// Pages of every extent held by every shard of the pool.
    pub(super) fn pool_pages(&self) -> usize {
        self.pool_pages.load(Relaxed)
    }

    /// Pages of every extent held.
    pub(super) fn total_pages(&self) -> usize {
        self.total_pages
    }

    /// Pages in the cache.
    pub(super) fn cached_pages(&self) -> usize {
        self.cached_pages
    }

    /// Extents held.
    pub(super) fn extent_count(&self) -> usize {
        self.extents.len() - self.vacant.len()
    }

    /// Records a new extent of `pages` pages, mapped nowhere and not cached
    /// (about to be mapped); returns its index.
    pub(super) fn add_extent(&mut self, handle: RawPhys, pages: u32) -> ExtentId {
        let extent = Extent {
            handle,
            mappings: Vec::new(),
            owners: vec![NO_OWNER; pages as usize],
        };
        let summary = ExtentSummary {
            pages,
            ..ExtentSummary::default()
        };
        self.total_pages += pages as usize;
        self.pool_pages.fetch_add(pages as usize, Relaxed);
        match self.vacant.pop() {
            Some(x) => {
                self.extents[x as usize] = Some(extent);
                self.summaries[x as usize] = summary;
                x
            }
            None => {
                self.extents.push(Some(extent));
                self.summaries.push(summary);
                (self.extents.len() - 1) as ExtentId
            }
        }
    }

    /// Pages of extent `x` (0 when there is none).
    pub(super) fn pages(&self, x: ExtentId) -> usize {
        self.summary(x).pages as usize
    }

    /// The summary of extent `x` (empty when there is none).
    #[inline]
    pub(super) fn summary(&self, x: ExtentId) -> ExtentSummary {
        self.summaries.get(x as usize).copied().unwrap_or_default()
    }

    /// Extent `x`.
    pub(super) fn extent(&self, x: ExtentId) -> Option<&Extent> {
        self.extents.get(x as usize).and_then(Option::as_ref)
    }

    /// Extent `x`, which must exist.
    #[inline]
    pub(super) fn extent_mut(&mut self, x: ExtentId) -> &mut Extent {
        self.extents[x as usize]
            .as_mut()
            .expect("mapped extent exists")
    }

    /// The owner of physical page `i` of extent `x`.
    #[inline]
    pub(super) fn owner(&self, x: ExtentId, i: u32) -> PackedPage {
        self.extents[x as usize]
            .as_ref()
            .expect("mapped extent exists")
            .owners[i as usize]
    }

    /// Takes the largest cached extent of at most `max` pages.
    pub(super) fn take_fitting(&mut self, max: usize) -> Option<ExtentId> {
        let (i, _) = self
            .cached
            .iter()
            .enumerate()
            .map(|(i, &x)| (i, self.pages(x)))
            .filter(|&(_, n)| n <= max)
            .max_by_key(|&(_, n)| n)?;
        let x = self.cached.swap_remove(i);
        self.cached_pages -= self.pages(x);
        Some(x)
    }

    /// Takes a cached extent of exactly `pages` pages.
    pub(super) fn take_exact(&mut self, pages: usize) -> Option<ExtentId> {
        let i = self.cached.iter().position(|&x| self.pages(x) == pages)?;
        let x = self.cached.swap_remove(i);
        self.cached_pages -= pages;
        Some(x)
    }

    /// Records a new mapping of extent `x` whose first page is `at`. The
    /// extent must not be in the cache.
    pub(super) fn mapped_at(&mut self, x: ExtentId, at: PackedPage) {
        if let Some(ext) = self.extents[x as usize].as_mut() {
            ext.mappings.push(at);
        }
    }

    /// Records that the mapping of extent `x` at `at` (its first page) is
    /// gone, with `frees`, those recorded where it was mapped, kept by the
    /// extent; an extent mapped nowhere any more goes to the cache. Owners
    /// in that mapping are cleared.
    pub(super) fn unmapped_at(&mut self, x: ExtentId, at: PackedPage, frees: Frees) {
        let Some(ext) = self.extents[x as usize].as_mut() else {
            return;
        };
        // The paths that unmap wait for these frees first; kept all the same
        // in case the memory is mapped again elsewhere.
        let sum = &mut self.summaries[x as usize];
        sum.frees = sum.frees.union(frees);
        if let Some(i) = ext.mappings.iter().position(|&a| a == at) {
            ext.mappings.swap_remove(i);
        }
        for (i, o) in ext.owners.iter_mut().enumerate() {
            if *o == at + i as u64 {
                *o = NO_OWNER;
            }
        }
        if ext.mappings.is_empty() {
            self.cached_pages += self.summaries[x as usize].pages as usize;
            self.cached.push(x);
        }
    }

    /// Puts an extent that was taken from the cache (or just made) and never
    /// mapped back in the cache.
    pub(super) fn put(&mut self, x: ExtentId) {
        self.cached_pages += self.pages(x);
        self.cached.push(x);
    }

    /// The handle of extent `x`.
    pub(super) fn handle(&self, x: ExtentId) -> RawPhys {
        self.extents[x as usize]
            .as_ref()
            .map_or(0, |ext| ext.handle)
    }

    /// Every extent held, with its index.
    pub(super) fn extents(&self) -> impl Iterator<Item = (ExtentId, &Extent)> + '_ {
        self.extents
            .iter()
            .enumerate()
            .filter_map(|(i, ext)| ext.as_ref().map(|ext| (i as ExtentId, ext)))
    }

    /// True when extent `x` is in the cache.
    pub(super) fn is_cached(&self, x: ExtentId) -> bool {
        self.cached.contains(&x)
    }

    /// Checks invariant 9's counts (`docs/virtual_pool.md`): the cache lists
    /// held extents once each, and the page counts are the sums over the
    /// extents held and over those cached.
    pub(super) fn check(&self) -> Result<(), String> {
        let mut total = 0;
        for (x, ext) in self.extents() {
            let pages = self.pages(x);
            if pages == 0 || ext.owners.len() != pages {
                return Err(format!(
                    "invariant 9: extent {x}: {pages} pages, {} owner entries",
                    ext.owners.len()
                ));
            }
            total += pages;
        }
        let mut cached = 0;
        for (i, &x) in self.cached.iter().enumerate() {
            if self.extent(x).is_none() || self.cached[..i].contains(&x) {
                return Err(format!(
                    "invariant 9: extent {x} is cached twice or not held"
                ));
            }
            cached += self.pages(x);
        }
        if (total, cached) != (self.total_pages, self.cached_pages) {
            return Err(format!(
                "invariant 9: {total} pages held and {cached} cached, counted {} and {}",
                self.total_pages, self.cached_pages
            ));
        }
        Ok(())
    }

    /// Takes cached extents out, largest first, until at most `keep_pages`
    /// pages stay cached; returns their handles and page counts for the
    /// caller to release.
    pub(super) fn take_releasable(&mut self, keep_pages: usize) -> Vec<(RawPhys, u32)> {
        let mut out = Vec::new();
        if self.cached_pages <= keep_pages {
            return out;
        }
        let mut cached = std::mem::take(&mut self.cached);
        cached.sort_by_key(|&x| std::cmp::Reverse(self.pages(x)));
        let mut kept = Vec::new();
        for x in cached {
            if self.cached_pages <= keep_pages {
                kept.push(x);
                continue;
            }
            out.push(self.forget(x));
        }
        self.cached = kept;
        out
    }

    /// Takes the cached extents `xs` out, for the caller to release: their
    /// handles and page counts. Extents not cached are skipped.
    pub(super) fn take_cached(&mut self, xs: &[ExtentId]) -> Vec<(RawPhys, u32)> {
        let mut out = Vec::new();
        for &x in xs {
            if let Some(i) = self.cached.iter().position(|&c| c == x) {
                self.cached.swap_remove(i);
                out.push(self.forget(x));
            }
        }
        out
    }

    /// Takes cached extent `x` out of the cache, to be mapped again; false
    /// when it is not cached.
    pub(super) fn uncache(&mut self, x: ExtentId) -> bool {
        let Some(i) = self.cached.iter().position(|&c| c == x) else {
            return false;
        };
        self.cached.swap_remove(i);
        self.cached_pages -= self.pages(x);
        true
    }

    /// Forgets extent `x`, already out of the cache list (its pages still
    /// counted as cached): its index becomes vacant. Returns its handle and
    /// pages.
    fn forget(&mut self, x: ExtentId) -> (RawPhys, u32) {
        let ext = self.extents[x as usize].take().expect("cached extent");
        let pages = std::mem::take(&mut self.summaries[x as usize]).pages;
        self.cached_pages -= pages as usize;
        self.total_pages -= pages as usize;
        self.pool_pages.fetch_sub(pages as usize, Relaxed);
        self.vacant.push(x);
        (ext.handle, pages)
    }
}

#[cfg(test)]
mod tests {
    use super::super::page_table::PageTable;
    use super::*;

    /// Extents of 1, 3 and 2 pages (handles 10, 30 and 20), none cached.
    fn three() -> (PhysCache, [ExtentId; 3]) {
        let mut phys = PhysCache::default();
        let ids = [
            phys.add_extent(10, 1),
            phys.add_extent(30, 3),
            phys.add_extent(20, 2),
        ];
        (phys, ids)
    }

    /// The same three extents, all in the cache.
    fn three_cached() -> (PhysCache, [ExtentId; 3]) {
        let (mut phys, ids) = three();
        for x in ids {
            phys.put(x);
        }
        (phys, ids)
    }

    #[test]
    fn new_extents_are_held_and_not_cached() {
        let (phys, [a, b, c]) = three();
        assert_eq!((phys.total_pages(), phys.cached_pages()), (6, 0));
        assert_eq!(phys.extent_count(), 3);
        assert_eq!((phys.pages(a), phys.pages(b), phys.pages(c)), (1, 3, 2));
        assert_eq!(phys.handle(b), 30);
        assert!(!phys.is_cached(b));
        assert_eq!(phys.extent(b).unwrap().owners, vec![NO_OWNER; 3]);
        assert_eq!(phys.pages(99), 0, "no extent has no pages");
        phys.check().unwrap();
    }

    #[test]
    fn take_fitting_takes_the_largest_that_fits() {
        let (mut phys, [a, b, c]) = three_cached();
        assert_eq!(phys.cached_pages(), 6);
        assert_eq!(phys.take_fitting(2), Some(c));
        assert_eq!(phys.take_fitting(5), Some(b));
        assert_eq!(phys.take_fitting(0), None);
        assert_eq!(phys.cached_pages(), 1);
        assert_eq!(phys.take_fitting(1), Some(a));
        assert_eq!(phys.take_fitting(usize::MAX), None);
        phys.check().unwrap();
    }

    #[test]
    fn the_last_mapping_gone_caches_the_extent_and_keeps_its_frees() {
        let (mut phys, [_, b, _]) = three();
        let (here, there) = (PageTable::pack(0, 10), PageTable::pack(1, 4));
        phys.mapped_at(b, here);
        phys.mapped_at(b, there);
        phys.extent_mut(b).owners = vec![there, there + 1, here + 2];
        let freed = Frees {
            mask: 0b10,
            tick: 7,
        };
        phys.unmapped_at(b, there, freed);
        let ext = phys.extent(b).unwrap();
        assert_eq!(ext.mappings, vec![here]);
        assert_eq!(
            ext.owners,
            vec![NO_OWNER, NO_OWNER, here + 2],
            "owners there cleared"
        );
        assert!(!phys.is_cached(b), "still mapped here");
        assert_eq!(phys.summary(b).frees, freed);
        phys.unmapped_at(b, here, Frees { mask: 0b1, tick: 9 });
        assert!(phys.is_cached(b));
        assert_eq!(phys.cached_pages(), 3);
        assert_eq!(
            phys.summary(b).frees,
            Frees {
                mask: 0b11,
                tick: 9
            }
        );
        phys.check().unwrap();
    }

    #[test]
    fn releasable_extents_go_largest_first_and_their_index_is_reused() {
        let (mut phys, [_, b, c]) = three_cached();
        // Keep at most 2 pages: the 3-page extent, then the 2-page one go.
        assert_eq!(phys.take_releasable(2), vec![(30, 3), (20, 2)]);
        assert_eq!((phys.total_pages(), phys.cached_pages()), (1, 1));
        assert_eq!(phys.extent_count(), 1);
        assert!(phys.extent(b).is_none() && phys.extent(c).is_none());
        assert_eq!(
            phys.take_releasable(1),
            vec![],
            "already within what is kept"
        );
        let d = phys.add_extent(40, 4);
        assert!(d == b || d == c, "a released index is reused");
        assert_eq!(
            phys.summary(d).frees,
            Frees::default(),
            "with a fresh summary"
        );
        phys.check().unwrap();
    }

    #[test]
    fn check_finds_wrong_counts_and_a_doubly_cached_extent() {
        let (mut phys, [a, _, _]) = three();
        phys.put(a);
        phys.check().unwrap();
        phys.cached_pages += 1;
        assert!(phys.check().unwrap_err().starts_with("invariant 9:"));
        phys.cached_pages -= 1;
        phys.total_pages -= 1;
        assert!(phys.check().unwrap_err().starts_with("invariant 9:"));
        phys.total_pages += 1;
        phys.cached.push(a);
        assert!(phys.check().unwrap_err().starts_with("invariant 9:"));
    }
}
