//! The physical memory of a [`VirtualPool`](super::VirtualPool): extents made
//! by `cuMemCreate` (one or more pages each), where each is mapped, who owns
//! each of its pages, and the cache of extents mapped nowhere.
//!
//! CUDA maps a physical allocation only from offset 0, so an extent is
//! mapped whole, with one `cuMemMap`, under a run of consecutive pages. It
//! may be mapped at several runs at once (*aliases*: CUDA allows one
//! allocation under several virtual ranges, and makes writes through one
//! visible through the others once the writing operation completes). Each
//! physical page has one *owner*, the virtual page through which blocks may
//! use it; the pool hands out a block only over pages it owns, so no two
//! live blocks ever share a physical byte. A page passes to another alias
//! only when its owner has no live block and every stream that freed a
//! block on the extent (other than the taker's) is known to be done
//! ([`Frees`]: recorded by the page table per 64 pages under each mapping,
//! kept by the extent when a mapping goes). Costs: put and
//! [`PhysCache::take_fitting`] are O(cached extents), which stay few.

use super::free_streams::Frees;
use crate::driver::RawPhys;

/// No owner (a packed page reference never takes this value).
pub(super) const NO_OWNER: u64 = u64::MAX;

/// One `cuMemCreate` allocation (an extent): its handle and mappings.
pub(super) struct Chunk {
    pub(super) handle: RawPhys,
    /// Where it is mapped: the first virtual page (packed) of each mapping.
    pub(super) at: Vec<u64>,
    /// Per page: the virtual page (packed: segment << 40 | page) that owns
    /// it, or [`NO_OWNER`].
    pub(super) owner: Vec<u64>,
}

/// The small, dense part of an extent: its size and the frees made through
/// mappings it no longer has (frees through its current mappings are kept
/// by the page table, per 64 pages; see `PageTable::extent_frees`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Extent {
    pub(super) frees: Frees,
    /// Its pages (0 for a vacant index).
    pub(super) pages: u32,
}

/// Extents and the cache of unmapped ones.
#[derive(Default)]
pub(super) struct PhysCache {
    chunks: Vec<Option<Chunk>>,
    /// Per chunk index: its [`Extent`] record.
    extents: Vec<Extent>,
    vacant: Vec<u32>,
    /// Extents not mapped anywhere.
    free: Vec<u32>,
    /// Pages of all extents.
    total_pages: usize,
    /// Pages of the cached extents.
    cached_pages: usize,
}

impl PhysCache {
    /// Pages of every extent held.
    pub(super) fn total_pages(&self) -> usize {
        self.total_pages
    }

    /// Pages in the cache.
    pub(super) fn cached_pages(&self) -> usize {
        self.cached_pages
    }

    /// Extents held.
    pub(super) fn chunk_count(&self) -> usize {
        self.chunks.len() - self.vacant.len()
    }

    /// Records a new extent of `pages` pages, mapped nowhere and not cached
    /// (about to be mapped); returns its index.
    pub(super) fn add_chunk(&mut self, handle: RawPhys, pages: u32) -> u32 {
        let chunk = Chunk {
            handle,
            at: Vec::new(),
            owner: vec![NO_OWNER; pages as usize],
        };
        let extent = Extent {
            pages,
            ..Extent::default()
        };
        self.total_pages += pages as usize;
        match self.vacant.pop() {
            Some(c) => {
                self.chunks[c as usize] = Some(chunk);
                self.extents[c as usize] = extent;
                c
            }
            None => {
                self.chunks.push(Some(chunk));
                self.extents.push(extent);
                (self.chunks.len() - 1) as u32
            }
        }
    }

    /// Pages of extent `c` (0 when there is none).
    pub(super) fn pages(&self, c: u32) -> usize {
        self.extent(c).pages as usize
    }

    /// The record of extent `c` (empty when there is none).
    #[inline]
    pub(super) fn extent(&self, c: u32) -> Extent {
        self.extents.get(c as usize).copied().unwrap_or_default()
    }

    /// Extent `c`.
    pub(super) fn chunk(&self, c: u32) -> Option<&Chunk> {
        self.chunks.get(c as usize).and_then(Option::as_ref)
    }

    /// Extent `c`, which must exist.
    #[inline]
    pub(super) fn chunk_mut(&mut self, c: u32) -> &mut Chunk {
        self.chunks[c as usize]
            .as_mut()
            .expect("mapped extent exists")
    }

    /// The owner of page `i` of extent `c`.
    #[inline]
    pub(super) fn owner(&self, c: u32, i: u32) -> u64 {
        self.chunks[c as usize]
            .as_ref()
            .expect("mapped extent exists")
            .owner[i as usize]
    }

    /// Takes the largest cached extent of at most `max` pages.
    pub(super) fn take_fitting(&mut self, max: usize) -> Option<u32> {
        let (i, _) = self
            .free
            .iter()
            .enumerate()
            .map(|(i, &c)| (i, self.pages(c)))
            .filter(|&(_, n)| n <= max)
            .max_by_key(|&(_, n)| n)?;
        let c = self.free.swap_remove(i);
        self.cached_pages -= self.pages(c);
        Some(c)
    }

    /// Records a new mapping of extent `c` starting at virtual page `at`
    /// (packed). The extent must not be in the cache.
    pub(super) fn mapped_at(&mut self, c: u32, at: u64) {
        if let Some(ch) = self.chunks[c as usize].as_mut() {
            ch.at.push(at);
        }
    }

    /// Records that the mapping of extent `c` at `at` is gone, with
    /// `frees`, those recorded where it was mapped, kept by the extent; an
    /// extent mapped nowhere any more goes to the cache. Owners at that
    /// mapping (`at` is its packed first page) are cleared.
    pub(super) fn unmapped_at(&mut self, c: u32, at: u64, frees: Frees) {
        let Some(ch) = self.chunks[c as usize].as_mut() else {
            return;
        };
        // The paths that unmap wait for these frees first; kept all the same
        // in case the memory is mapped again elsewhere.
        let e = &mut self.extents[c as usize];
        e.frees = e.frees.union(frees);
        if let Some(i) = ch.at.iter().position(|&a| a == at) {
            ch.at.swap_remove(i);
        }
        for (i, o) in ch.owner.iter_mut().enumerate() {
            if *o == at + i as u64 {
                *o = NO_OWNER;
            }
        }
        if ch.at.is_empty() {
            self.cached_pages += self.extents[c as usize].pages as usize;
            self.free.push(c);
        }
    }

    /// Puts an extent that was taken from the cache (or just made) and never
    /// mapped back in the cache.
    pub(super) fn put(&mut self, c: u32) {
        self.cached_pages += self.pages(c);
        self.free.push(c);
    }

    /// The handle of extent `c`.
    pub(super) fn handle(&self, c: u32) -> RawPhys {
        self.chunks[c as usize].as_ref().map_or(0, |c| c.handle)
    }

    /// Every extent: index and extent.
    pub(super) fn chunks(&self) -> impl Iterator<Item = (u32, &Chunk)> + '_ {
        self.chunks
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i as u32, c)))
    }

    /// True when extent `c` is in the cache.
    pub(super) fn is_cached(&self, c: u32) -> bool {
        self.free.contains(&c)
    }

    /// Takes cached extents out, largest first, until at most `keep_pages`
    /// pages stay cached; returns their handles and page counts for the
    /// caller to release.
    pub(super) fn take_releasable(&mut self, keep_pages: usize) -> Vec<(RawPhys, u32)> {
        let mut out = Vec::new();
        if self.cached_pages <= keep_pages {
            return out;
        }
        let mut free = std::mem::take(&mut self.free);
        free.sort_by_key(|&c| std::cmp::Reverse(self.pages(c)));
        let mut kept = Vec::new();
        for c in free {
            if self.cached_pages <= keep_pages {
                kept.push(c);
                continue;
            }
            let chunk = self.chunks[c as usize].take().expect("cached extent");
            let pages = std::mem::take(&mut self.extents[c as usize]).pages;
            self.cached_pages -= pages as usize;
            self.total_pages -= pages as usize;
            self.vacant.push(c);
            out.push((chunk.handle, pages));
        }
        self.free = kept;
        out
    }
}
