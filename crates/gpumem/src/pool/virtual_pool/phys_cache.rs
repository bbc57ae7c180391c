//! The physical memory of a [`VirtualPool`](super::VirtualPool): chunks made
//! by `cuMemCreate` (one or more pages each) and the cache of their pages that
//! are not mapped anywhere.
//!
//! A chunk's pages are mapped one page per `cuMemMap`, so they can be
//! unmapped and re-mapped under other addresses one by one (CUDA maps only
//! from offset 0, so chunks are one page each: `PAGES_PER_HANDLE`). A chunk
//! goes back to the driver (`cuMemRelease`) only when all its pages sit in
//! the cache. Costs: take and put are O(1); releasing chunks is
//! O(cached pages).

use super::page_table::PhysPage;
use crate::driver::RawPhys;

/// One `cuMemCreate` allocation.
pub(super) struct Chunk {
    pub(super) handle: RawPhys,
    pub(super) pages: u32,
    /// Its pages in the cache.
    cached: u32,
}

/// Chunks and cached pages.
#[derive(Default)]
pub(super) struct PhysCache {
    chunks: Vec<Option<Chunk>>,
    vacant: Vec<u32>,
    free: Vec<PhysPage>,
    /// Pages of all chunks.
    total_pages: usize,
}

impl PhysCache {
    /// Pages of every chunk held.
    pub(super) fn total_pages(&self) -> usize {
        self.total_pages
    }

    /// Pages in the cache.
    pub(super) fn cached_pages(&self) -> usize {
        self.free.len()
    }

    /// Chunks held.
    pub(super) fn chunk_count(&self) -> usize {
        self.chunks.len() - self.vacant.len()
    }

    /// Records a new chunk of `pages` pages, all of them cached.
    pub(super) fn add_chunk(&mut self, handle: RawPhys, pages: u32) {
        let chunk = Chunk {
            handle,
            pages,
            cached: pages,
        };
        let c = match self.vacant.pop() {
            Some(c) => {
                self.chunks[c as usize] = Some(chunk);
                c
            }
            None => {
                self.chunks.push(Some(chunk));
                (self.chunks.len() - 1) as u32
            }
        };
        // Reverse, so the chunk's pages come out in order.
        self.free
            .extend((0..pages).rev().map(|index| PhysPage { chunk: c, index }));
        self.total_pages += pages as usize;
    }

    /// Takes a cached page.
    #[inline]
    pub(super) fn take(&mut self) -> Option<PhysPage> {
        let p = self.free.pop()?;
        if let Some(c) = self.chunks[p.chunk as usize].as_mut() {
            c.cached -= 1;
        }
        Some(p)
    }

    /// Puts an unmapped page back in the cache.
    #[inline]
    pub(super) fn put(&mut self, p: PhysPage) {
        if let Some(c) = self.chunks[p.chunk as usize].as_mut() {
            c.cached += 1;
        }
        self.free.push(p);
    }

    /// The handle of a page's chunk.
    pub(super) fn handle(&self, p: PhysPage) -> RawPhys {
        self.chunks[p.chunk as usize]
            .as_ref()
            .map_or(0, |c| c.handle)
    }

    /// Every chunk: index and chunk.
    pub(super) fn chunks(&self) -> impl Iterator<Item = (u32, &Chunk)> + '_ {
        self.chunks
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i as u32, c)))
    }

    /// Takes out of the cache whole chunks whose pages are all cached, until
    /// at most `keep_pages` pages stay cached; returns their handles and page
    /// counts for the caller to release.
    pub(super) fn take_releasable(&mut self, keep_pages: usize) -> Vec<(RawPhys, u32)> {
        let mut out = Vec::new();
        if self.free.len() <= keep_pages {
            return out;
        }
        let mut excess = self.free.len() - keep_pages;
        let mut gone = vec![false; self.chunks.len()];
        for (i, slot) in self.chunks.iter_mut().enumerate() {
            if excess == 0 {
                break;
            }
            if slot.as_ref().is_some_and(|c| c.cached == c.pages) {
                let c = slot.take().expect("checked");
                gone[i] = true;
                excess = excess.saturating_sub(c.pages as usize);
                self.total_pages -= c.pages as usize;
                self.vacant.push(i as u32);
                out.push((c.handle, c.pages));
            }
        }
        if !out.is_empty() {
            self.free.retain(|p| !gone[p.chunk as usize]);
        }
        out
    }
}
