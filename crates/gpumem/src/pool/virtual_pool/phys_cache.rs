//! The physical memory of a [`VirtualPool`](super::VirtualPool): extents made
//! by `cuMemCreate` (one or more pages each) and the cache of extents that
//! are not mapped anywhere.
//!
//! CUDA maps a physical allocation only from offset 0, so an extent is
//! mapped whole, with one `cuMemMap`, under a run of consecutive pages, and
//! moves or goes back whole: a partly idle extent stays where it is until all
//! its pages are idle. A cached extent is re-mapped under a run at least as
//! long as it. Costs: put and [`PhysCache::take_fitting`] are O(cached
//! extents), which stay few (beyond `release_threshold` they are released
//! after every mapping call).

use crate::driver::RawPhys;

/// One `cuMemCreate` allocation (an extent).
pub(super) struct Chunk {
    pub(super) handle: RawPhys,
    pub(super) pages: u32,
}

/// Extents and the cache of unmapped ones.
#[derive(Default)]
pub(super) struct PhysCache {
    chunks: Vec<Option<Chunk>>,
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

    /// Records a new extent of `pages` pages, not cached (about to be
    /// mapped); returns its index.
    pub(super) fn add_chunk(&mut self, handle: RawPhys, pages: u32) -> u32 {
        let chunk = Chunk { handle, pages };
        self.total_pages += pages as usize;
        match self.vacant.pop() {
            Some(c) => {
                self.chunks[c as usize] = Some(chunk);
                c
            }
            None => {
                self.chunks.push(Some(chunk));
                (self.chunks.len() - 1) as u32
            }
        }
    }

    /// Pages of extent `c`.
    pub(super) fn pages(&self, c: u32) -> usize {
        self.chunks[c as usize]
            .as_ref()
            .map_or(0, |c| c.pages as usize)
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

    /// Puts an unmapped extent in the cache.
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
            self.cached_pages -= chunk.pages as usize;
            self.total_pages -= chunk.pages as usize;
            self.vacant.push(c);
            out.push((chunk.handle, chunk.pages));
        }
        self.free = kept;
        out
    }
}
