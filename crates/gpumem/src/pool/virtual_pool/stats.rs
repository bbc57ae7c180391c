//! The statistics of a [`VirtualPool`] and its other introspection methods.

use std::sync::atomic::Ordering::Relaxed;

use super::VirtualPool;
use crate::driver::DevicePtr;
use crate::pool::live_blocks;
use crate::resource::{merge_adjacent, LiveBlock, Segment};

/// The extents of one size class ([`VirtualPoolStats::chunk_classes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChunkClass {
    /// Extents of the class held.
    pub current: usize,
    /// Highest `current` so far.
    pub peak: usize,
    /// Extents of the class created so far.
    pub created: u64,
    /// Extents of the class released so far.
    pub released: u64,
    /// Bytes of the extents held.
    pub bytes: usize,
    /// Highest `bytes` so far.
    pub peak_bytes: usize,
    /// Bytes of the extents created so far.
    pub bytes_created: u64,
    /// Bytes of the extents released so far.
    pub bytes_released: u64,
}

impl ChunkClass {
    pub(super) fn created(&mut self, bytes: usize) {
        self.current += 1;
        self.peak = self.peak.max(self.current);
        self.created += 1;
        self.bytes += bytes;
        self.peak_bytes = self.peak_bytes.max(self.bytes);
        self.bytes_created += bytes as u64;
    }

    pub(super) fn released(&mut self, bytes: usize) {
        self.current -= 1;
        self.released += 1;
        self.bytes -= bytes;
        self.bytes_released += bytes as u64;
    }

    pub(super) fn reset_peak(&mut self) {
        self.peak = self.current;
        self.peak_bytes = self.bytes;
    }

    /// Adds another shard's counts (peaks summed: an upper bound).
    fn add(&mut self, o: &ChunkClass) {
        self.current += o.current;
        self.peak += o.peak;
        self.created += o.created;
        self.released += o.released;
        self.bytes += o.bytes;
        self.peak_bytes += o.peak_bytes;
        self.bytes_created += o.bytes_created;
        self.bytes_released += o.bytes_released;
    }
}

/// Numbers describing a [`VirtualPool`] at one moment. Names follow the
/// statistics adaptor: *reserved* is memory taken from the driver (here
/// physical memory), *live* is what blocks handed out hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VirtualPoolStats {
    /// Physical bytes held from the driver (mapped plus cached).
    pub reserved: usize,
    /// Highest `reserved` so far.
    pub peak_reserved: usize,
    /// Virtual bytes with physical memory mapped under them (a physical
    /// page mapped at two places counts twice; see `aliased`).
    pub mapped: usize,
    /// Mapped virtual bytes under no live block (kept mapped for re-use).
    pub idle_mapped: usize,
    /// Of `mapped`, the bytes that are second (or later) mappings of
    /// physical memory mapped elsewhere too: *aliases*, kept so memory that
    /// changes place in a repeating workload needs no driver call.
    pub aliased: usize,
    /// Physical pages unmapped and cached for re-mapping.
    pub cached_pages: usize,
    /// Bytes of those pages.
    pub cached: usize,
    /// Extents (`cuMemCreate` allocations) held.
    pub chunks: usize,
    /// Bytes in blocks handed out (rounded to 256): virtual bytes in use.
    pub live: usize,
    /// Highest `live` so far.
    pub peak_live: usize,
    /// Blocks handed out.
    pub live_blocks: usize,
    /// Virtual address space reserved.
    pub virtual_reserved: usize,
    /// Bytes of one page (the VMM granularity).
    pub page_size: usize,
    /// Streams the pool tracks.
    pub streams: usize,
    /// Physical pages created so far (`cuMemCreate`), all calls together.
    pub pages_created: u64,
    /// Physical pages released so far (`cuMemRelease`).
    pub pages_released: u64,
    /// Extents created so far (`cuMemCreate` calls).
    pub chunks_created: u64,
    /// Extents released so far (`cuMemRelease` calls).
    pub chunks_released: u64,
    /// Highest `chunks` (extents held) so far.
    pub peak_chunks: usize,
    /// The extents split by size: of at most
    /// [`SMALL_SEGMENT_MAX`](crate::adaptor::SMALL_SEGMENT_MAX) bytes, then
    /// larger (the segments of PyTorch's small and large pools).
    pub chunk_classes: [ChunkClass; 2],
    /// Large blocks placed elsewhere than the heap's first choice because
    /// fewer new pages were needed there.
    pub relocations: u64,
    /// Mappings made so far (`cuMemMap` calls: one per extent mapped).
    pub mappings_made: u64,
    /// Mappings unmapped so far (extents covered by `cuMemUnmap` calls).
    pub mappings_unmapped: u64,
    /// Pages mapped so far, all mappings together.
    pub pages_mapped: u64,
    /// Of `mappings_made`, the aliases: extents mapped at a further place
    /// while staying mapped where they were.
    pub aliases_made: u64,
    /// Idle aliases unmapped to bound the aliases kept (see
    /// [`VirtualPoolConfig::max_alias_ratio`](super::VirtualPoolConfig::max_alias_ratio))
    /// or the address space.
    pub aliases_collected: u64,
    /// Blocks placed in fresh address space because every free place with
    /// mapped pages conflicted.
    pub fresh_ranges: u64,
    /// Lock shards the threads use: 1 until they spread (see
    /// [`VirtualPoolConfig::spread`](super::VirtualPoolConfig::spread)),
    /// then all of them.
    pub shards_in_use: usize,
    /// Allocations and frees that found shard 0's lock held, counted until
    /// the threads spread.
    pub contended: u64,
}

impl VirtualPool {
    /// The size class of an extent of `pages` pages: 0 up to
    /// [`SMALL_SEGMENT_MAX`](crate::adaptor::SMALL_SEGMENT_MAX) bytes, else 1.
    pub(super) fn class_of_extent(&self, pages: usize) -> usize {
        usize::from(pages.saturating_mul(self.gran) > crate::adaptor::SMALL_SEGMENT_MAX)
    }

    /// The current numbers, all shards together (each shard's peaks summed
    /// for `peak_live` and `peak_chunks`: exact while one shard is in use,
    /// an upper bound with several).
    pub fn stats(&self) -> VirtualPoolStats {
        let g = self.gran;
        let mut out = VirtualPoolStats {
            reserved: self.held_bytes(),
            peak_reserved: self.peak_pages.load(Relaxed) * g,
            page_size: g,
            shards_in_use: if self.shards.spread_out() {
                self.shards.len()
            } else {
                1
            },
            contended: self.shards.contended(),
            ..VirtualPoolStats::default()
        };
        self.each_shard(|st| {
            out.mapped += st.pages.mapped_pages() * g;
            out.idle_mapped += st.pages.idle_pages() * g;
            out.aliased += Self::alias_pages(st) * g;
            out.cached_pages += st.phys.cached_pages();
            out.cached += st.phys.cached_pages() * g;
            out.chunks += st.phys.extent_count();
            out.live += st.live_bytes();
            out.peak_live += st.peak_live;
            out.live_blocks +=
                st.areas.iter().map(|a| a.heap.used_blocks()).sum::<usize>() - st.parked.len();
            out.virtual_reserved += st.pages.reserved_bytes();
            out.streams += st.streams.len();
            out.pages_created += st.pages_created;
            out.pages_released += st.pages_released;
            out.chunks_created += st.extents_created;
            out.chunks_released += st.extents_released;
            out.peak_chunks += st.peak_extents;
            for (o, c) in out.chunk_classes.iter_mut().zip(&st.extent_classes) {
                o.add(c);
            }
            out.relocations += st.relocations;
            out.mappings_made += st.mappings_made;
            out.mappings_unmapped += st.mappings_unmapped;
            out.pages_mapped += st.pages_mapped;
            out.aliases_made += st.aliases_made;
            out.aliases_collected += st.aliases_collected;
            out.fresh_ranges += st.fresh_ranges;
        });
        out
    }

    /// The driver calls behind the pool's memory so far, all shards:
    /// extents created (`cuMemCreate` calls) and mappings made (`cuMemMap`
    /// calls), as [`VirtualPool::stats`] counts them in `chunks_created` and
    /// `mappings_made`, without its scan of the pages: O(shards), cheap
    /// enough to read after every allocation (`gpumem view` does, to say
    /// which allocations made the pool map memory).
    pub fn driver_calls(&self) -> (u64, u64) {
        let (mut created, mut mapped) = (0, 0);
        self.each_shard(|st| {
            created += st.extents_created;
            mapped += st.mappings_made;
        });
        (created, mapped)
    }

    /// Physical bytes held and not under any live block: what the pool can
    /// map under new blocks without creating memory (cached extents, and
    /// idle mapped pages it can alias elsewhere), all shards. O(pages).
    pub fn free_physical_bytes(&self) -> usize {
        let mut free = 0;
        self.each_shard(|st| {
            let busy = st
                .pages
                .mapped_pages()
                .saturating_sub(st.pages.idle_pages());
            free += st.phys.total_pages().saturating_sub(busy) * self.gran;
        });
        free
    }

    /// The virtual ranges with physical memory mapped under them, in address
    /// order, adjacent mapped pages merged into one range (a block spanning
    /// several extents lies in one range). An extent mapped at two places
    /// (an alias) appears at both. O(pages).
    pub fn mapped_ranges(&self) -> Vec<Segment> {
        let mut pages = Vec::new();
        self.each_shard(|st| {
            pages.extend(st.pages.mapped().map(|(p, _)| Segment {
                address: DevicePtr(st.pages.addr(p)),
                size: self.gran,
            }));
        });
        pages.sort_unstable_by_key(|s| s.address.0);
        merge_adjacent(pages)
    }

    /// The blocks handed out, in address order, with their sizes as the pool
    /// rounded them (the requested sizes are not recorded). O(blocks).
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        let mut out = Vec::new();
        self.each_shard(|st| {
            out.extend(live_blocks::live_blocks(
                st.areas.iter().map(|a| &a.heap),
                &st.parked,
            ));
        });
        out.sort_unstable_by_key(|b| b.address.0);
        out
    }

    /// The size of the live block starting at `ptr`, if there is one.
    pub fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        let st = self.lock_owner(ptr.0);
        live_blocks::live_block_size(st.areas.iter().map(|a| &a.heap), &st.parked, ptr)
    }

    /// Bytes in blocks handed out, all shards.
    pub fn live_bytes(&self) -> usize {
        let mut live = 0;
        self.each_shard(|st| live += st.live_bytes());
        live
    }
}
