//! `VirtualPool`: a stream-ordered pool on CUDA virtual memory management
//! that maps physical pages only under live blocks and moves them to where
//! they are needed, so the physical memory it holds follows the live bytes.
//!
//! Algorithm:
//! - *Addresses*: one virtual range of `va_multiple` × the device's memory is
//!   reserved up front (`cuMemAddressReserve`, ~22 µs), split in a small area
//!   (requests up to `small_limit`, packed together on few pages) and a large
//!   area (blocks that mostly cover whole pages). Each area is a
//!   [`LaneHeap`] with per-stream lanes (the stream-ordering policy of
//!   [`crate::pool`], shared with [`PoolResource`](super::PoolResource)):
//!   O(1) TLSF good fit, same-stream reuse at once, other streams after a
//!   query finds the freeing stream idle or after waiting on one event. A
//!   further range is reserved if an area ever runs out.
//! - *Pages* (`page_table`): every granularity page counts its live blocks.
//!   Allocating a block whose pages are all mapped, and own their physical
//!   pages (below), touches no driver call; otherwise each unmapped run gets
//!   physical *extents* mapped under it, then is made accessible with one
//!   `cuMemSetAccess` per run and device, all or nothing.
//! - *Extents* (`phys_cache`): CUDA maps a physical allocation only from
//!   offset 0, so a `cuMemCreate` allocation is mapped whole (one `cuMemMap`)
//!   under consecutive pages. A run that needs new memory gets one extent of
//!   up to `max_extent_pages` pages (default 6) per that many pages, so a
//!   k-page block costs one create, one map and one set-access for k up to 6.
//! - *Aliases*: CUDA lets one physical allocation be mapped under several
//!   virtual ranges at once, and a write through one is seen through the
//!   others once the writing operation has completed. So memory never has to
//!   be unmapped to go where it is needed: an idle extent is mapped under the
//!   new run as well, and its old mapping stays. Every physical page has one
//!   *owner*, the virtual page through which blocks may use it; a block is
//!   handed out only over pages that own their memory, so no two live blocks
//!   share a physical byte. A page takes its memory back from another alias
//!   when the owner there has no live block and every stream that freed a
//!   block on it (other than the taker, whose order protects it) is known
//!   done. A repeating workload thus soon finds every alias it needs already
//!   mapped: its steady state makes no driver call while physical memory
//!   keeps following the live bytes.
//! - *Placement*: the heap's choice is best fit within the size class first
//!   (a freed block is re-used by the next request of its size), and with
//!   one stream a free also takes in the untouched space beside it, so a
//!   repeating workload re-uses the same addresses. A block whose pages are
//!   held through another alias (a *conflict*), or a large block that would
//!   need [`RELOCATE_MIN_PAGES`] or more new pages, looks among up to 64 free
//!   places for one without conflicts needing the fewest new pages; if every
//!   place conflicts, it goes to a newly reserved range. Small requests and
//!   large ones keep their own memory (small blocks share pages, so aliases
//!   between the two would conflict at every turn).
//! - *Physical memory* for a run, in order: cached (unmapped) extents that
//!   fit; idle extents mapped elsewhere that fit, as aliases; new extents,
//!   while the pool holds no more than `slack_permille` over the live peak;
//!   beyond it, idle extents that fit nowhere are unmapped everywhere (every
//!   stream that freed a block at any of their mappings seen complete: a
//!   query, or an event recorded by an earlier attempt) and released, then
//!   new extents are created. On a busy GPU, pages freed by work still in
//!   flight cannot pass to another stream yet: the reserve can exceed the
//!   live bytes by what is in flight.
//! - *Giving back*: [`Pool::trim`](crate::pool::Pool::trim) unmaps every idle mapping whose
//!   freeing streams are done and releases extents mapped nowhere; cached
//!   extents above `release_threshold` bytes are released after each
//!   mapping call.
//! - *Out of memory*: when `cuMemCreate` fails, the pool waits for every
//!   stream that freed blocks, unmaps every idle mapping, releases what is
//!   then mapped nowhere and retries with one-page extents; then it undoes
//!   the call's mappings and fails with [`Error::OutOfMemory`] (requested,
//!   reserved physical, live, largest free block).
//!
//! Bad frees: a free is checked against the block the heap finds for it (its
//! 256-byte granules, as in [`PoolResource`](super::PoolResource)); a pointer
//! that starts no used block, a second free or another size is
//! [`Error::InvalidFree`] and frees nothing.
//!
//! Costs: the fast path is one lock, one lane lookup, the TLSF operation,
//! the block's two boundary page entries and a few words of their groups of
//! 64 pages (bitmaps, and on free the frees record); pages that take their
//! memory over from another alias move a whole extent mapping at a time
//! (tens of ns in all). Driver costs on an H100
//! (driver 580, `examples/vmm_costs.rs`): `cuMemCreate` 12 µs, `cuMemMap`
//! 1.6 µs and `cuMemRelease` 11 µs per 2 MiB page (measured at one page);
//! `cuMemSetAccess` about 18 µs per call plus 25 µs per mapping in its
//! range, `cuMemUnmap` about 9 µs per call plus 17 µs per mapping. An alias
//! costs one map and its share of one set-access, once; after that, memory
//! changes place between the same addresses for nothing. Measured on the
//! H100 (`bench/results/2026-11-21-h100-run14-vpool-place-elsewhere`, 20
//! processes per trace): the two shared training traces replayed after five
//! untimed replays cost 70 to 126 ns (resnet50) and 85 to 141 ns (gpt2) per
//! operation, PoolResource 58 to 106 (the host's CPU runs in a fast and a
//! slow state, see run 13), with no driver call, at 1.013 and 1.042 of the
//! live peak; the first replays pay for the aliases they create (about
//! 27 µs each).

mod page_table;
mod phys_cache;
mod pool_api;

use std::sync::{Mutex, MutexGuard};

use self::page_table::{Acquired, FreeStreams, PageRef, PageTable, PhysPage};
use self::phys_cache::PhysCache;
use super::heap_lanes::{self, HeapLanes};
use crate::device::Device;
use crate::driver::{AccessFlags, DevicePtr, HandleType};
use crate::resource::{
    merge_adjacent, validate_request, LiveBlock, MemoryResource, Properties, Segment,
};
use crate::stream::Stream;
use crate::suballoc::{HeapError, LaneHeap, LaneId};
use crate::{Error, FreeError, OomInfo, Result};

/// Largest alignment a [`VirtualPool`] serves.
pub const VIRTUAL_POOL_MAX_ALIGNMENT: usize = 1 << 30;

/// Configuration of a [`VirtualPool`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VirtualPoolConfig {
    /// Virtual address space reserved up front, in multiples of the device's
    /// memory (1 to 16; default 2). More is reserved if it runs out.
    pub va_multiple: usize,
    /// Requests up to this many bytes go to the small area (default 1 MiB).
    pub small_limit: usize,
    /// Physical memory the pool may create beyond its live peak, in
    /// thousandths of that peak (default 30: up to 3% over the live peak),
    /// when no cached or idle extent fits a run. Beyond it, idle extents
    /// that fit nowhere are released before new ones are made, so the pool
    /// stays near its live peak; 0 makes new memory only in their place.
    pub slack_permille: usize,
    /// Most pages of one extent (one `cuMemCreate`, mapped whole with one
    /// `cuMemMap`); 1 gives every page its own allocation (default 6).
    /// Larger extents mean fewer mappings (a mapping costs about 25 µs of
    /// `cuMemSetAccess` on an H100), but an extent can serve elsewhere only
    /// when all its pages are idle and only under a run at least as long.
    /// Chosen on the simulator's replays of the two shared traces
    /// (`examples/vpool_replay.rs --extent N`): 6 pages kept both within 5%
    /// of the live peak and reached a steady state with no driver call by
    /// the fourth pass; 8 left GPT-2 at 1.052, 4 and 5 never settled.
    pub max_extent_pages: usize,
    /// Bytes of unmapped physical pages kept cached for re-mapping; beyond
    /// it, whole cached chunks go back to the driver (default 0).
    pub release_threshold: usize,
    /// Most alias pages kept mapped, in multiples of the physical pages
    /// (default 8); beyond it, idle aliases are unmapped. A training step's
    /// memory may change place several times, each a mapping kept for the
    /// next step (GPT-2's steady state keeps about 3.5 alias pages per
    /// physical page).
    pub max_alias_ratio: usize,
    /// Most physical bytes the pool may hold (mapped plus cached, whole
    /// pages); `None` for no limit. A request needing new physical memory
    /// beyond it is out of memory (after reclaiming idle pages). The
    /// starting value: [`VirtualPool::set_max_reserved`] changes it.
    pub max_reserved: Option<usize>,
    /// Other devices granted read-write access to every mapped page.
    pub peers: Vec<u32>,
    /// Create physical memory exportable as POSIX file descriptors (see
    /// [`VirtualPool::export_page_fds`]).
    pub ipc: bool,
}

impl Default for VirtualPoolConfig {
    fn default() -> Self {
        Self {
            va_multiple: 2,
            small_limit: 1 << 20,
            slack_permille: 30,
            max_extent_pages: 6,
            release_threshold: 0,
            max_alias_ratio: 8,
            max_reserved: None,
            peers: Vec::new(),
            ipc: false,
        }
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
    /// Physical allocations (`cuMemCreate` chunks) held.
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
    /// Physical allocations made so far (`cuMemCreate` calls).
    pub chunks_created: u64,
    /// Physical allocations released so far (`cuMemRelease` calls).
    pub chunks_released: u64,
    /// Highest `chunks` so far.
    pub peak_chunks: usize,
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
    /// [`VirtualPoolConfig::max_alias_ratio`]) or the address space.
    pub aliases_collected: u64,
    /// Blocks placed in fresh address space because every free place with
    /// mapped pages conflicted.
    pub fresh_ranges: u64,
}

/// A physical chunk exported for another process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhysExport {
    /// A POSIX file descriptor the caller owns (import it with
    /// `cuMemImportFromShareableHandle`).
    pub fd: i32,
    /// Bytes of the chunk.
    pub bytes: usize,
    /// Where its pages are mapped now: (address, offset into the chunk).
    pub mappings: Vec<(DevicePtr, usize)>,
}

/// Address space reserved, in multiples of the device's memory, beyond which
/// conflicts are resolved by collecting idle aliases before reserving more.
const VA_SCARCE_MULTIPLE: usize = 16;

/// A large block that would need at least this many new pages (128 MiB on
/// 2 MiB pages) looks for a free place with fewer. Smaller ones stay where
/// the heap puts them: on the simulator's replays of the shared traces,
/// relocating from 4 pages up made the steady state relocate every pass
/// (resnet50 877 instructions per event, gpt2 862, against 674 and 800 at
/// 64) and gpt2 settle only in its fourth pass (third at 64); resnet50
/// maps 67 extents in its second pass at 4, 302 at 64, none after.
const RELOCATE_MIN_PAGES: usize = 64;

const SMALL: usize = 0;
const LARGE: usize = 1;
const ARENAS: usize = 2;

struct Arena {
    heap: LaneHeap,
    lanes: HeapLanes,
}

struct State {
    arenas: [Arena; ARENAS],
    /// Virtual ranges given to the arenas: (start, end, arena).
    ranges: Vec<(u64, u64, usize)>,
    pages: PageTable,
    phys: PhysCache,
    streams: FreeStreams,
    peak_reserved: usize,
    peak_live: usize,
    pages_created: u64,
    pages_released: u64,
    chunks_created: u64,
    chunks_released: u64,
    peak_chunks: usize,
    /// Most physical bytes the pool may hold now (`max_reserved`, which
    /// [`VirtualPool::set_max_reserved`] changes).
    max_physical: Option<usize>,
    relocations: u64,
    mappings_made: u64,
    mappings_unmapped: u64,
    pages_mapped: u64,
    aliases_made: u64,
    aliases_collected: u64,
    fresh_ranges: u64,
}

impl State {
    fn live_bytes(&self) -> usize {
        self.arenas.iter().map(|a| a.heap.used_bytes()).sum::<u64>() as usize
    }

    #[inline]
    fn arena_of(&self, addr: u64) -> Option<usize> {
        ranges_arena(&self.ranges, addr)
    }

    /// The extents mapped somewhere with no page in use through any mapping
    /// that `fits(pages, arena of its first mapping)` accepts and whose
    /// frees (asked last: they may query streams) `quiet(streams, mask,
    /// tick)` finds done: (pages, extent), largest first.
    fn idle_extents(
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

/// The arena whose range holds `addr`.
#[inline]
fn ranges_arena(ranges: &[(u64, u64, usize)], addr: u64) -> Option<usize> {
    ranges
        .iter()
        .find(|&&(s, e, _)| addr >= s && addr < e)
        .map(|&(_, _, a)| a)
}

/// A stream-ordered pool on CUDA virtual memory management: physical pages
/// are mapped only under live blocks and moved to where they are needed.
///
/// Addresses come from TLSF lanes over one reserved virtual range (small
/// requests packed in their own area); a block whose pages are mapped costs
/// no driver call; idle pages stay mapped until a mapping elsewhere needs
/// them (and their freeing stream's work is done) or [`Pool::trim`](crate::pool::Pool::trim).
///
/// ```
/// use gpumem::driver::sim::SimConfig;
/// use gpumem::pool::{Pool, VirtualPool, VirtualPoolConfig};
/// use gpumem::resource::MemoryResource;
/// use gpumem::Device;
///
/// let device = Device::sim(SimConfig::default());
/// let pool = VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap();
/// let s = device.create_stream().unwrap();
/// let p = pool.allocate(10 << 20, 256, &s).unwrap();
/// assert_eq!(pool.stats().mapped, 10 << 20); // five 2 MiB pages
/// pool.deallocate(p, 10 << 20, 256, &s).unwrap();
/// assert_eq!(pool.stats().idle_mapped, 10 << 20); // kept for re-use
/// s.synchronize().unwrap();
/// assert_eq!(pool.trim(0).unwrap(), 10 << 20); // given back
/// assert_eq!(pool.stats().reserved, 0);
/// ```
pub struct VirtualPool {
    device: Device,
    config: VirtualPoolConfig,
    gran: usize,
    capacity: usize,
    handle_type: HandleType,
    state: Mutex<State>,
}

impl std::fmt::Debug for VirtualPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualPool")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

#[cold]
#[inline(never)]
fn heap_error(ptr: DevicePtr, e: HeapError) -> Error {
    Error::InvalidFree {
        ptr: ptr.0,
        reason: e.free_reason().unwrap_or(FreeError::Unknown),
    }
}

impl VirtualPool {
    /// A pool on `device`: checks VMM support, the peers and IPC, and
    /// reserves the virtual range. No physical memory is taken yet.
    pub fn new(device: Device, config: VirtualPoolConfig) -> Result<Self> {
        let info = device.info()?;
        if !info.vmm {
            return Err(Error::unsupported(
                "virtual memory management on this device",
            ));
        }
        if config.ipc && !info.posix_fd_ipc {
            return Err(Error::unsupported(
                "POSIX file descriptor export of VMM memory",
            ));
        }
        if !(1..=16).contains(&config.va_multiple) {
            return Err(Error::InvalidArgument(
                "virtual pool: va_multiple must be 1..=16".into(),
            ));
        }
        let driver = device.driver();
        let count = driver.device_count()?;
        for &peer in &config.peers {
            if peer >= count {
                return Err(Error::NoSuchDevice {
                    device: peer,
                    count,
                });
            }
            if peer == device.ordinal() || !driver.can_access_peer(peer, device.ordinal())? {
                return Err(Error::InvalidArgument(format!(
                    "virtual pool: device {peer} cannot be a peer of device {}",
                    device.ordinal()
                )));
            }
        }
        let gran = driver.vmm_granularity(device.ordinal(), true)?.max(256);
        if !gran.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "virtual pool: granularity {gran} is not a power of two"
            )));
        }
        let capacity = info.total_memory.next_multiple_of(gran).max(gran);
        let total = capacity
            .checked_mul(config.va_multiple)
            .ok_or_else(|| Error::InvalidArgument("virtual pool: va_multiple too large".into()))?;
        // A quarter of the range (at least a page) for small blocks.
        let small = (total / 4).next_multiple_of(gran).max(gran);
        let total = total.max(small + gran);
        let base = driver.vmm_reserve(total, gran)?;
        let mut st = State {
            arenas: std::array::from_fn(|_| Arena {
                heap: LaneHeap::new(),
                lanes: HeapLanes::new(),
            }),
            ranges: Vec::new(),
            pages: PageTable::new(gran as u64),
            phys: PhysCache::default(),
            streams: FreeStreams::new(),
            peak_reserved: 0,
            peak_live: 0,
            pages_created: 0,
            pages_released: 0,
            chunks_created: 0,
            chunks_released: 0,
            peak_chunks: 0,
            max_physical: config.max_reserved,
            relocations: 0,
            mappings_made: 0,
            mappings_unmapped: 0,
            pages_mapped: 0,
            aliases_made: 0,
            aliases_collected: 0,
            fresh_ranges: 0,
        };
        st.pages.add_segment(base.0, total as u64);
        let parts = [
            (base.0, small as u64, SMALL),
            (base.0 + small as u64, (total - small) as u64, LARGE),
        ];
        for (start, bytes, arena) in parts {
            if let Err(e) = st.arenas[arena].heap.add_region(start, bytes) {
                let _ = driver.vmm_free_address(base, total);
                return Err(Error::InvalidArgument(format!(
                    "virtual pool: unusable range at {start:#x}: {e}"
                )));
            }
            st.ranges.push((start, start + bytes, arena));
        }
        let handle_type = if config.ipc {
            HandleType::PosixFd
        } else {
            HandleType::None
        };
        Ok(Self {
            device,
            config,
            gran,
            capacity,
            handle_type,
            state: Mutex::new(st),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &VirtualPoolConfig {
        &self.config
    }

    /// Bytes of one page (the device's VMM granularity).
    pub fn page_size(&self) -> usize {
        self.gran
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, State> {
        super::stream_lanes::lock(&self.state)
    }

    /// The current numbers.
    pub fn stats(&self) -> VirtualPoolStats {
        let st = self.lock();
        let g = self.gran;
        VirtualPoolStats {
            reserved: st.phys.total_pages() * g,
            peak_reserved: st.peak_reserved,
            mapped: st.pages.mapped_pages() * g,
            idle_mapped: st.pages.idle_pages() * g,
            aliased: Self::alias_pages(&st) * g,
            cached_pages: st.phys.cached_pages(),
            cached: st.phys.cached_pages() * g,
            chunks: st.phys.chunk_count(),
            live: st.live_bytes(),
            peak_live: st.peak_live,
            live_blocks: st.arenas.iter().map(|a| a.heap.used_blocks()).sum(),
            virtual_reserved: st.pages.reserved_bytes(),
            page_size: g,
            streams: st.streams.len(),
            pages_created: st.pages_created,
            pages_released: st.pages_released,
            chunks_created: st.chunks_created,
            chunks_released: st.chunks_released,
            peak_chunks: st.peak_chunks,
            relocations: st.relocations,
            mappings_made: st.mappings_made,
            mappings_unmapped: st.mappings_unmapped,
            pages_mapped: st.pages_mapped,
            aliases_made: st.aliases_made,
            aliases_collected: st.aliases_collected,
            fresh_ranges: st.fresh_ranges,
        }
    }

    /// Most physical bytes the pool may hold now; `None` for no limit.
    pub fn max_reserved(&self) -> Option<usize> {
        self.lock().max_physical
    }

    /// Changes the most physical bytes the pool may hold (`None`: no limit).
    /// Memory held above a lowered limit stays until it is freed and given
    /// back; meanwhile requests needing new physical memory fail as out of
    /// memory with the limit.
    pub fn set_max_reserved(&self, bytes: Option<usize>) {
        self.lock().max_physical = bytes;
    }

    /// Physical bytes held and not under any live block: what the pool can
    /// map under new blocks without creating memory (cached extents, and
    /// idle mapped pages it can alias elsewhere). O(pages).
    pub fn free_physical_bytes(&self) -> usize {
        let st = self.lock();
        let busy = st
            .pages
            .mapped_pages()
            .saturating_sub(st.pages.idle_pages());
        (st.phys.total_pages().saturating_sub(busy)) * self.gran
    }

    /// The virtual ranges with physical memory mapped under them, in address
    /// order, adjacent mapped pages merged into one range (a block spanning
    /// several extents lies in one range). An extent mapped at two places
    /// (an alias) appears at both. O(pages).
    pub fn mapped_ranges(&self) -> Vec<Segment> {
        let st = self.lock();
        let pages: Vec<Segment> = st
            .pages
            .mapped()
            .map(|(p, _)| Segment {
                address: DevicePtr(st.pages.addr(p)),
                size: self.gran,
            })
            .collect();
        drop(st);
        merge_adjacent(pages)
    }

    /// The blocks handed out, in address order, with their sizes as the pool
    /// rounded them (the requested sizes are not recorded). O(blocks).
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        heap_lanes::live_blocks(self.lock().arenas.iter().map(|a| &a.heap))
    }

    /// The size of the live block starting at `ptr`, if there is one.
    pub fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        heap_lanes::live_block_size(self.lock().arenas.iter().map(|a| &a.heap), ptr)
    }

    /// Bytes in blocks handed out.
    pub fn live_bytes(&self) -> usize {
        self.lock().live_bytes()
    }

    /// Exports every physical chunk as a POSIX file descriptor (the pool must
    /// have been made with `ipc`), with where its pages are mapped now.
    pub fn export_page_fds(&self) -> Result<Vec<PhysExport>> {
        if !self.config.ipc {
            return Err(Error::InvalidArgument(
                "virtual pool was not made with ipc: its memory cannot be exported".into(),
            ));
        }
        let st = self.lock();
        let mut out: Vec<PhysExport> = Vec::new();
        let mut index = vec![
            usize::MAX;
            st.phys
                .chunks()
                .map(|(c, _)| c as usize + 1)
                .max()
                .unwrap_or(0)
        ];
        for (c, chunk) in st.phys.chunks() {
            // On failure, descriptors already exported stay open (this layer
            // has no `unsafe` to close them).
            let fd = self.device.driver().vmm_export_fd(chunk.handle)?;
            index[c as usize] = out.len();
            out.push(PhysExport {
                fd,
                bytes: st.phys.pages(c) * self.gran,
                mappings: Vec::new(),
            });
        }
        for (p, phys) in st.pages.mapped() {
            if let Some(&i) = index.get(phys.chunk as usize) {
                if let Some(x) = out.get_mut(i) {
                    x.mappings
                        .push((DevicePtr(st.pages.addr(p)), phys.index as usize * self.gran));
                }
            }
        }
        Ok(out)
    }

    /// Checks the pool's invariants: the heaps' structure, and that every page
    /// under a live block is mapped and counts exactly the live blocks on it.
    /// For tests; O(pages + blocks).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let st = self.lock();
        let mut live = Vec::new();
        for a in &st.arenas {
            a.heap.check_invariants()?;
            live.extend(a.heap.used_ranges());
        }
        st.pages.check(&live, &st.phys)?;
        // Every extent is mapped whole, in order, or not at all.
        for (p, pp) in st.pages.mapped() {
            let n = st.phys.pages(pp.chunk);
            let start = p.idx.checked_sub(pp.index as usize);
            let whole = start.is_some_and(|s0| {
                (0..n).all(|i| {
                    st.pages
                        .phys_at(PageRef {
                            seg: p.seg,
                            idx: s0 + i,
                        })
                        .is_some_and(|q| q.chunk == pp.chunk && q.index as usize == i)
                })
            });
            if !whole {
                return Err(format!(
                    "page {:#x}: extent {} is not mapped whole",
                    st.pages.addr(p),
                    pp.chunk
                ));
            }
        }
        // Each extent's list of mappings matches the table; an extent is
        // cached exactly when it is mapped nowhere.
        let mut mapped = 0;
        for (c, ch) in st.phys.chunks() {
            for &at in &ch.at {
                let p = PageTable::unpack(at);
                if st.pages.phys_at(p) != Some(PhysPage { chunk: c, index: 0 }) {
                    return Err(format!("extent {c}: no mapping at {:#x}", st.pages.addr(p)));
                }
            }
            if ch.at.is_empty() != st.phys.is_cached(c) {
                return Err(format!(
                    "extent {c}: {} mappings but cached {}",
                    ch.at.len(),
                    st.phys.is_cached(c)
                ));
            }
            mapped += ch.at.len() * st.phys.pages(c);
        }
        if mapped != st.pages.mapped_pages() {
            return Err(format!(
                "{mapped} pages mapped by extents, {} in the table",
                st.pages.mapped_pages()
            ));
        }
        Ok(())
    }

    /// Gives `blk` (taken from lane `lane`, its pages not acquired) back to
    /// the heap and makes `new` the block; returns `new`'s pages.
    fn swap_block(
        st: &mut State,
        which: usize,
        lane: LaneId,
        blk: &mut crate::suballoc::Allocation,
        new: crate::suballoc::Allocation,
    ) -> (usize, usize, usize) {
        let _ = st.arenas[which].heap.free(blk.addr, lane);
        *blk = new;
        st.pages.range(blk.addr, blk.size).expect("inside a range")
    }

    /// [`PageTable::acquire`] with the stream-safety answer of `stream`.
    #[inline]
    fn acquire(
        st: &mut State,
        (seg, first, last): (usize, usize, usize),
        stream: &Stream,
    ) -> Acquired {
        let State {
            pages,
            phys,
            streams,
            ..
        } = st;
        let mut own = None;
        pages.acquire(seg, first, last, phys, |frees| {
            let own = *own.get_or_insert_with(|| streams.own_bit(stream));
            // With no other stream's frees anywhere, the record is moot.
            !streams.others_freed(own) || frees().quiet(|m, t| streams.safe_for(own, m, t))
        })
    }

    /// The block at `blk` (its pages acquired) conflicts with another alias
    /// (`conflict`) or needs many new pages: gives its pages up and places it
    /// better (another free place, after collecting idle aliases when
    /// address space is scarce, or fresh address space); returns the new
    /// acquisition and pages. Off the fast path.
    #[cold]
    fn place_elsewhere(
        &self,
        st: &mut State,
        (which, lane): (usize, LaneId),
        blk: &mut crate::suballoc::Allocation,
        (bytes, alignment): (usize, usize),
        stream: &Stream,
        conflict: bool,
    ) -> Result<(Acquired, (usize, usize, usize))> {
        let (mut seg, mut first, mut last) =
            st.pages.range(blk.addr, blk.size).expect("inside a range");
        st.pages.unacquire(seg, first, last);
        if let Some(better) = self.better_placement(st, which, lane, blk, alignment, conflict) {
            (seg, first, last) = Self::swap_block(st, which, lane, blk, better);
        }
        let mut got = Self::acquire(st, (seg, first, last), stream);
        if got.conflict && self.va_is_scarce(st) {
            // Idle aliases unmapped conflict with nothing: try again.
            st.pages.unacquire(seg, first, last);
            if let Err(e) = self.collect_aliases(st) {
                let _ = st.arenas[which].heap.free(blk.addr, lane);
                return Err(e);
            }
            if let Some(better) = self.better_placement(st, which, lane, blk, alignment, true) {
                (seg, first, last) = Self::swap_block(st, which, lane, blk, better);
            }
            got = Self::acquire(st, (seg, first, last), stream);
        }
        if got.conflict {
            // Every free place conflicts: fresh address space.
            st.pages.unacquire(seg, first, last);
            let _ = st.arenas[which].heap.free(blk.addr, lane);
            *blk = self.fresh_block(st, which, bytes, alignment)?;
            (seg, first, last) = st.pages.range(blk.addr, blk.size).expect("inside a range");
            got = Self::acquire(st, (seg, first, last), stream);
            debug_assert!(!got.conflict);
        }
        Ok((got, (seg, first, last)))
    }

    fn oom(&self, st: &State, requested: usize) -> Error {
        let largest = st
            .arenas
            .iter()
            .map(|a| a.heap.largest_free_any())
            .max()
            .unwrap_or(0);
        Error::oom_with(OomInfo {
            requested,
            device: Some(self.device.ordinal()),
            reserved: Some(st.phys.total_pages() * self.gran),
            live: Some(st.live_bytes()),
            largest_free: Some(largest as usize),
            limit: st.max_physical,
        })
    }

    /// Finds addresses for a request both lanes of `arena` missed: settle,
    /// steal, then reserve another virtual range.
    #[cold]
    fn take_slow(
        &self,
        st: &mut State,
        which: usize,
        lane: LaneId,
        stream: &Stream,
        bytes: usize,
        alignment: usize,
    ) -> Result<crate::suballoc::Allocation> {
        let needed = bytes
            .checked_next_multiple_of(256)
            .and_then(|b| b.checked_add(alignment.max(256) - 256))
            .ok_or_else(|| self.oom(st, bytes))?;
        let a = &mut st.arenas[which];
        a.lanes.settle(&mut a.heap, Some(lane));
        if let Some(x) = a
            .heap
            .allocate_best(LaneId::GLOBAL, bytes as u64, alignment as u64)
        {
            return Ok(x);
        }
        if a.lanes.steal(&mut a.heap, 0, lane, stream, needed as u64) {
            if let Some(x) = a.heap.allocate_best(lane, bytes as u64, alignment as u64) {
                return Ok(x);
            }
        }
        // Out of addresses that are safe now: reserve another range (address
        // space is cheap; waiting for other streams is not).
        self.reserve_range(st, which, needed, bytes)?;
        st.arenas[which]
            .heap
            .allocate(LaneId::GLOBAL, bytes as u64, alignment as u64)
            .ok_or_else(|| self.oom(st, bytes))
    }

    /// Reserves another virtual range of at least `needed` bytes for arena
    /// `which` and adds it to its heap (in the global lane).
    #[cold]
    fn reserve_range(
        &self,
        st: &mut State,
        which: usize,
        needed: usize,
        bytes: usize,
    ) -> Result<crate::suballoc::RegionId> {
        let base_size = if which == SMALL {
            self.capacity / 2
        } else {
            self.capacity
        };
        let size = needed
            .max(base_size)
            .checked_next_multiple_of(self.gran)
            .ok_or_else(|| self.oom(st, bytes))?;
        let base = match self.device.driver().vmm_reserve(size, self.gran) {
            Ok(b) => b,
            Err(e) if e.is_oom() => return Err(self.oom(st, bytes)),
            Err(e) => return Err(e),
        };
        let id = match st.arenas[which].heap.add_region(base.0, size as u64) {
            Ok(id) => id,
            Err(e) => {
                let _ = self.device.driver().vmm_free_address(base, size);
                return Err(Error::InvalidArgument(format!(
                    "virtual pool: unusable range at {:#x}: {e}",
                    base.0
                )));
            }
        };
        st.ranges.push((base.0, base.0 + size as u64, which));
        st.pages.add_segment(base.0, size as u64);
        Ok(id)
    }

    /// Unmaps idle aliases: mappings of extents mapped elsewhere too whose
    /// pages have no live block, own no physical page (the memory is in use
    /// or kept through another mapping) and were freed by streams known
    /// done. Unmapped pages conflict with nothing, so this bounds both the
    /// aliases kept and the address space conflicts would otherwise take.
    /// Returns the mappings unmapped.
    #[cold]
    fn collect_aliases(&self, st: &mut State) -> Result<u64> {
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

    /// True when the address space reserved has reached
    /// [`VA_SCARCE_MULTIPLE`] times the device's memory.
    fn va_is_scarce(&self, st: &State) -> bool {
        st.pages.reserved_bytes() >= self.capacity.saturating_mul(VA_SCARCE_MULTIPLE)
    }

    /// Unmaps the mapping of extent `c` (of `len` pages) at packed page `at`
    /// (one `cuMemUnmap`); an extent left mapped nowhere goes to the cache.
    fn unmap_mapping(&self, st: &mut State, c: u32, at: u64, len: usize) -> Result<()> {
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
    fn alias_pages(st: &State) -> usize {
        let mapped_phys = st.phys.total_pages() - st.phys.cached_pages();
        st.pages.mapped_pages().saturating_sub(mapped_phys)
    }

    /// A block at the start of a newly reserved range: nothing is mapped
    /// there, so nothing conflicts.
    #[cold]
    fn fresh_block(
        &self,
        st: &mut State,
        which: usize,
        bytes: usize,
        alignment: usize,
    ) -> Result<crate::suballoc::Allocation> {
        let needed = bytes
            .checked_next_multiple_of(self.gran)
            .and_then(|b| b.checked_add(alignment.max(256)))
            .ok_or_else(|| self.oom(st, bytes))?;
        let id = self.reserve_range(st, which, needed, bytes)?;
        st.fresh_ranges += 1;
        let first = st.arenas[which].heap.region_blocks(id).next();
        let (block, b) = first.ok_or_else(|| self.oom(st, bytes))?;
        let at = b.addr.next_multiple_of(alignment.max(256) as u64);
        st.arenas[which]
            .heap
            .allocate_from(block, at, bytes as u64)
            .ok_or_else(|| self.oom(st, bytes))
    }

    /// A better place than `blk` (its pages not acquired):
    /// when `blk` conflicts (see [`PageTable::acquire`]), any place without
    /// conflicts; else, for a large block needing at least
    /// [`RELOCATE_MIN_PAGES`] new pages, a place that needs fewer. The free
    /// blocks of the stream's lane and of the global lane that fit are tried
    /// at their start and their end; places with conflicts are skipped and
    /// the fewest unmapped pages wins. Taken out of the heap when better than
    /// `blk` (which the caller gives back). Slow path only: bounded by
    /// `PLACEMENT_CANDIDATES` blocks.
    #[cold]
    fn better_placement(
        &self,
        st: &mut State,
        which: usize,
        lane: LaneId,
        blk: &crate::suballoc::Allocation,
        alignment: usize,
        conflict: bool,
    ) -> Option<crate::suballoc::Allocation> {
        const PLACEMENT_CANDIDATES: usize = 64;
        let (seg, first, last) = st.pages.range(blk.addr, blk.size)?;
        let mut best_n = if conflict {
            usize::MAX
        } else {
            st.pages.count_unmapped(seg, first, last)
        };
        if !conflict && (which != LARGE || best_n < RELOCATE_MIN_PAGES) {
            return None;
        }
        let size = blk.size;
        let align = alignment.max(256) as u64;
        let mut best: Option<(crate::suballoc::BlockId, u64)> = None;
        let State {
            arenas,
            pages,
            phys,
            ..
        } = &*st;
        let heap = &arenas[which].heap;
        let mut seen = 0;
        for l in [lane, LaneId::GLOBAL] {
            heap.for_each_free_at_least(l, size, |id, addr, bsize| {
                seen += 1;
                let end = addr + bsize;
                let start = addr.next_multiple_of(align);
                let tail = (end - size) & !(align - 1);
                for at in [start, tail] {
                    if at < addr || at + size > end {
                        continue;
                    }
                    let Some((s2, f2, l2)) = pages.range(at, size) else {
                        continue;
                    };
                    let n = pages.count_unmapped(s2, f2, l2);
                    if n < best_n && !pages.has_conflict(s2, f2, l2, phys) {
                        best_n = n;
                        best = Some((id, at));
                        if n == 0 {
                            return false;
                        }
                    }
                }
                seen < PLACEMENT_CANDIDATES
            });
            if best_n == 0 {
                break;
            }
            seen = 0;
        }
        let (id, at) = best?;
        let moved = st.arenas[which].heap.allocate_from(id, at, size)?;
        st.relocations += 1;
        Some(moved)
    }

    /// Unmaps whole idle extents whose freeing streams are complete into the
    /// cache until at least `want` pages are cached by it (all of them for
    /// `usize::MAX`): largest that fit in what is still wanted first, then the
    /// smallest that cover the rest. Adjacent extents go with one
    /// `cuMemUnmap`. Returns the pages unmapped.
    fn reclaim(&self, st: &mut State, want: usize) -> Result<usize> {
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

    /// Releases whole cached extents until at most `keep` bytes stay cached.
    /// An extent the driver refuses to release stays cached (a later trim,
    /// release or the drop tries again). Returns the bytes released, and the
    /// first error.
    fn release_cached(&self, st: &mut State, keep: usize) -> (usize, Option<Error>) {
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

    /// Creates one extent of up to `n` pages (fewer where `max_reserved`
    /// leaves less room), not cached. Returns its index, or the driver's
    /// error.
    fn create(&self, st: &mut State, n: usize) -> Result<u32> {
        let mut n = n.max(1);
        if let Some(max) = st.max_physical {
            let room = (max / self.gran).saturating_sub(st.phys.total_pages());
            if room == 0 {
                return Err(Error::oom(self.gran));
            }
            n = n.min(room);
        }
        let h = self.device.driver().vmm_create(
            self.device.ordinal(),
            n * self.gran,
            self.handle_type,
        )?;
        let c = st.phys.add_chunk(h, n as u32);
        st.pages_created += n as u64;
        st.chunks_created += 1;
        st.peak_chunks = st.peak_chunks.max(st.phys.chunk_count());
        let reserved = st.phys.total_pages() * self.gran;
        st.peak_reserved = st.peak_reserved.max(reserved);
        Ok(c)
    }

    /// Maps extent `c` whole at page `idx` of `seg` (one `cuMemMap`); on
    /// failure it goes to the cache.
    fn map_extent(
        &self,
        st: &mut State,
        seg: usize,
        idx: usize,
        c: u32,
        done: &mut Vec<(usize, u32)>,
    ) -> Result<usize> {
        let n = st.phys.pages(c);
        let addr = st.pages.addr(PageRef { seg, idx });
        if let Err(e) =
            self.device
                .driver()
                .vmm_map(DevicePtr(addr), n * self.gran, 0, st.phys.handle(c))
        {
            if st.phys.chunk(c).is_some_and(|ch| ch.at.is_empty()) {
                st.phys.put(c);
            }
            return Err(e);
        }
        st.phys.mapped_at(c, PageTable::pack(seg, idx));
        for i in 0..n {
            let p = PageRef { seg, idx: idx + i };
            let pp = PhysPage {
                chunk: c,
                index: i as u32,
            };
            st.pages.set_mapped(p, pp);
            if st.pages.busy(p) {
                st.pages.own_new(p, &mut st.phys);
            }
        }
        st.mappings_made += 1;
        st.pages_mapped += n as u64;
        done.push((idx, c));
        Ok(n)
    }

    /// Fills the fronts of `pieces` (first page, pages still unbacked) with
    /// cached extents that fit.
    fn fill_from_cache(
        &self,
        st: &mut State,
        seg: usize,
        pieces: &mut [(usize, usize)],
        done: &mut Vec<(usize, u32)>,
    ) -> Result<()> {
        for piece in pieces.iter_mut() {
            while piece.1 > 0 {
                let Some(c) = st.phys.take_fitting(piece.1) else {
                    break;
                };
                let n = self.map_extent(st, seg, piece.0, c, done)?;
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
    /// mapping and its frees are safe for the stream of `own`.
    fn alias_idle(
        &self,
        st: &mut State,
        seg: usize,
        pieces: &mut [(usize, usize)],
        own: u64,
        done: &mut Vec<(usize, u32)>,
    ) -> Result<()> {
        let longest = pieces.iter().map(|p| p.1).max().unwrap_or(0);
        if longest == 0 {
            return Ok(());
        }
        // Small and large areas keep their own memory: small blocks share
        // pages, so memory passing between them would conflict at every turn.
        let small = st.arena_of(st.pages.addr(PageRef {
            seg,
            idx: pieces[0].0,
        })) == Some(SMALL);
        let mut cands = st.idle_extents(
            |n, arena| n <= longest && (arena == Some(SMALL)) == small,
            |streams, m, t| streams.safe_for(own, m, t),
        );
        for piece in pieces.iter_mut() {
            while piece.1 > 0 {
                let Some(k) = cands.iter().position(|&(n, _)| n <= piece.1) else {
                    break;
                };
                let (_, c) = cands.remove(k);
                let n = self.map_extent(st, seg, piece.0, c, done)?;
                st.aliases_made += 1;
                piece.0 += n;
                piece.1 -= n;
            }
        }
        Ok(())
    }

    /// Unmaps every mapping of whole idle extents (no page in use through
    /// any mapping, every stream that freed a block at any of them known
    /// done) into the cache, largest first, until at least `want` pages are
    /// cached by it. Returns the pages cached.
    fn uncover_idle(&self, st: &mut State, want: usize) -> Result<usize> {
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

    /// Backs the rest of every piece with new extents of at most `max`
    /// pages (one extent per piece when memory allows).
    fn create_into(
        &self,
        st: &mut State,
        seg: usize,
        pieces: &mut [(usize, usize)],
        max: usize,
        done: &mut Vec<(usize, u32)>,
    ) -> Result<()> {
        for piece in pieces.iter_mut() {
            while piece.1 > 0 {
                let c = self.create(st, piece.1.min(max).min(self.config.max_extent_pages))?;
                let n = self.map_extent(st, seg, piece.0, c, done)?;
                piece.0 += n;
                piece.1 -= n;
            }
        }
        Ok(())
    }

    /// Backs the unmapped `runs` of `seg`: cached extents that fit, idle
    /// extents mapped elsewhere that fit (aliased), then new extents (one per
    /// run) within the slack over the live peak; beyond it, idle extents that
    /// fit nowhere here are unmapped everywhere and released first; on
    /// out-of-memory it waits for every freeing stream, takes every idle
    /// extent and retries page by page. Extents mapped are listed in `done`.
    fn back_runs(
        &self,
        st: &mut State,
        seg: usize,
        runs: &[(usize, usize)],
        requested: usize,
        own: u64,
        done: &mut Vec<(usize, u32)>,
    ) -> Result<()> {
        let mut pieces = runs.to_vec();
        let short = |p: &[(usize, usize)]| p.iter().map(|x| x.1).sum::<usize>();
        self.fill_from_cache(st, seg, &mut pieces, done)?;
        self.alias_idle(st, seg, &mut pieces, own, done)?;
        // Within the slack over the live peak, new memory is made rather than
        // idle extents moved: fewer driver calls for the same leanness target.
        let budget = (st.peak_live.max(st.live_bytes()) / 1000)
            .saturating_mul(1000 + self.config.slack_permille);
        let room = (budget / self.gran).saturating_sub(st.phys.total_pages());
        let mut oom = false;
        if short(&pieces) > 0 && short(&pieces) <= room {
            match self.create_into(st, seg, &mut pieces, usize::MAX, done) {
                Ok(()) => {}
                Err(e) if e.is_oom() => oom = true,
                Err(e) => return Err(e),
            }
        }
        if short(&pieces) > 0 && !oom {
            self.uncover_idle(st, short(&pieces))?;
            self.fill_from_cache(st, seg, &mut pieces, done)?;
            // What fits nowhere here goes back before new memory is made.
            self.release_cached(st, self.config.release_threshold);
            match self.create_into(st, seg, &mut pieces, usize::MAX, done) {
                Ok(()) => {}
                Err(e) if e.is_oom() => oom = true,
                Err(e) => return Err(e),
            }
        }
        if oom {
            // Wait for pending unmaps, take every idle extent, retry page by page.
            st.streams.synchronize_all(&self.device)?;
            self.reclaim(st, usize::MAX)?;
            self.fill_from_cache(st, seg, &mut pieces, done)?;
            self.release_cached(st, 0);
            match self.create_into(st, seg, &mut pieces, 1, done) {
                Ok(()) => {}
                Err(e) if e.is_oom() => return Err(self.oom(st, requested)),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Maps physical memory under the unmapped pages `first..=last` of
    /// `seg`, all or nothing.
    #[cold]
    fn map_missing(
        &self,
        st: &mut State,
        seg: usize,
        first: usize,
        last: usize,
        requested: usize,
        own: u64,
    ) -> Result<()> {
        let runs = st.pages.unmapped_runs(seg, first, last);
        let driver = self.device.driver();
        let g = self.gran;
        let mut done: Vec<(usize, u32)> = Vec::new();
        let mut result = self.back_runs(st, seg, &runs, requested, own, &mut done);
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
            'access: for &(start, count) in &runs {
                let addr = DevicePtr(st.pages.addr(PageRef { seg, idx: start }));
                let devices =
                    std::iter::once(self.device.ordinal()).chain(self.config.peers.iter().copied());
                for d in devices {
                    if let Err(e) =
                        driver.vmm_set_access(addr, count * g, d, AccessFlags::ReadWrite)
                    {
                        result = Err(e);
                        break 'access;
                    }
                }
            }
        }
        if let Err(e) = result {
            for (start, c) in done {
                let n = st.phys.pages(c);
                let addr = DevicePtr(st.pages.addr(PageRef { seg, idx: start }));
                if driver.vmm_unmap(addr, n * g).is_ok() {
                    for i in 0..n {
                        st.pages.set_unmapped(PageRef {
                            seg,
                            idx: start + i,
                        });
                    }
                    st.mappings_unmapped += 1;
                    st.pages
                        .unmapped_at(c, PageTable::pack(seg, start), &mut st.phys);
                }
            }
            self.release_cached(st, self.config.release_threshold);
            return Err(e);
        }
        self.release_cached(st, self.config.release_threshold);
        Ok(())
    }
}

impl MemoryResource for VirtualPool {
    #[inline]
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, VIRTUAL_POOL_MAX_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        let mut guard = self.lock();
        let st = &mut *guard;
        if bytes > self.capacity {
            return Err(self.oom(st, bytes));
        }
        let which = if bytes <= self.config.small_limit {
            SMALL
        } else {
            LARGE
        };
        let a = &mut st.arenas[which];
        let lane = a.lanes.lane_of(&mut a.heap, stream)?;
        let (b, align) = (bytes as u64, alignment as u64);
        let mut blk = match a
            .heap
            .allocate_best(lane, b, align)
            .or_else(|| a.heap.allocate_best(LaneId::GLOBAL, b, align))
        {
            Some(x) => x,
            None => self.take_slow(st, which, lane, stream, bytes, alignment)?,
        };
        let Some((mut seg, mut first, mut last)) = st.pages.range(blk.addr, blk.size) else {
            let _ = st.arenas[which].heap.free(blk.addr, lane);
            return Err(Error::InvalidArgument(format!(
                "virtual pool: block {:#x} outside its ranges",
                blk.addr
            )));
        };
        let mut got = Self::acquire(st, (seg, first, last), stream);
        let relocate = got.conflict
            || (!got.all_mapped
                && which == LARGE
                && st.pages.count_unmapped(seg, first, last) >= RELOCATE_MIN_PAGES);
        if relocate {
            (got, (seg, first, last)) = self.place_elsewhere(
                st,
                (which, lane),
                &mut blk,
                (bytes, alignment),
                stream,
                got.conflict,
            )?;
        }
        if !got.all_mapped {
            let own = st.streams.own_bit(stream);
            if let Err(e) = self.map_missing(st, seg, first, last, bytes, own) {
                st.pages.unacquire(seg, first, last);
                let _ = st.arenas[which].heap.free(blk.addr, lane);
                if e.is_oom() {
                    // The numbers without the block that could not be backed.
                    return Err(self.oom(st, bytes));
                }
                return Err(e);
            }
        }
        let live = st.live_bytes();
        if live > st.peak_live {
            st.peak_live = live;
        }
        Ok(DevicePtr(blk.addr))
    }

    #[inline]
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let mut guard = self.lock();
        let st = &mut *guard;
        let Some(which) = st.arena_of(ptr.0) else {
            return Err(Error::InvalidFree {
                ptr: ptr.0,
                reason: FreeError::Unknown,
            });
        };
        let a = &mut st.arenas[which];
        let lane = a.lanes.lane_of(&mut a.heap, stream)?;
        // With one stream, its free space also takes in the untouched space
        // beside it, so the pool stays compact; with several, that would make
        // the others wait for this one (steal) to get addresses. The heap
        // checks the size against the block (its 256-byte granules).
        let size = if a.lanes.len() <= 1 {
            a.heap.free_absorbing_sized(ptr.0, lane, bytes as u64)
        } else {
            a.heap.free_sized(ptr.0, lane, bytes as u64)
        }
        .map_err(|e| heap_error(ptr, e))?;
        let (bit, tick) = st.streams.on_free(stream);
        if let Some((seg, first, last)) = st.pages.range(ptr.0, size) {
            st.pages.release(seg, first, last, bit, tick);
        }
        Ok(())
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn properties(&self) -> Properties {
        Properties::DEVICE
    }
}

impl Drop for VirtualPool {
    fn drop(&mut self) {
        if crate::exit::process_is_exiting() {
            // The driver may already be gone: leak rather than call into it.
            return;
        }
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        // Work still using pool memory must finish before pages go.
        for a in &st.arenas {
            a.lanes.synchronize_all(&self.device);
        }
        if st.streams.synchronize_all(&self.device).is_err() {
            let _ = self.device.synchronize();
        }
        let driver = self.device.driver();
        let g = self.gran;
        let mapped: Vec<PageRef> = st.pages.mapped().map(|(p, _)| p).collect();
        let mut runs: Vec<(PageRef, usize)> = Vec::new();
        for p in mapped {
            match runs.last_mut() {
                Some((r, n)) if r.seg == p.seg && r.idx + *n == p.idx => *n += 1,
                _ => runs.push((p, 1)),
            }
        }
        for (r, n) in runs {
            let addr = st.pages.addr(r);
            crate::exit::give_back(
                || format!("VirtualPool mapping at {addr:#x}"),
                || driver.vmm_unmap(DevicePtr(addr), n * g),
            );
        }
        for (_, c) in st.phys.chunks() {
            crate::exit::give_back(
                || "VirtualPool physical memory".into(),
                || driver.vmm_release(c.handle),
            );
        }
        for seg in &st.pages.segs {
            crate::exit::give_back(
                || format!("VirtualPool address range {:#x}", seg.base),
                || driver.vmm_free_address(DevicePtr(seg.base), seg.bytes as usize),
            );
        }
    }
}
