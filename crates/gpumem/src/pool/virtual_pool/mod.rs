//! `VirtualPool`: a stream-ordered pool on CUDA virtual memory management
//! that maps physical pages only under live blocks and moves them to where
//! they are needed, so the physical memory it holds follows the live bytes.
//!
//! The design page, `docs/virtual_pool.md`, holds the glossary (the words
//! below and in this module's code mean what it says), the life-cycle of a
//! page and of an extent, the numbered invariants that
//! [`VirtualPool::check_invariants`] checks, and the fast-path contract.
//! Measurements behind the constants and the costs quoted here are in
//! `docs/decisions-virtual-pool.md`.
//!
//! Algorithm:
//! - *Addresses*: one reservation of `va_multiple` × the device's memory is
//!   made up front, split between a small area (requests up to
//!   `small_limit`, packed together on few pages) and a large area (blocks
//!   that mostly cover whole pages). Each area is a [`LaneHeap`] with
//!   per-stream lanes (the stream-ordering policy of [`crate::pool`], shared
//!   with [`PoolResource`](super::PoolResource)): O(1) TLSF good fit,
//!   same-stream reuse at once, other streams after a query finds the
//!   freeing stream idle or after waiting on one event. An area that runs
//!   out gets another reservation.
//! - *Pages* (`page_table`): every page counts its live blocks. Allocating a
//!   block whose pages are all mapped, and own their physical pages (below),
//!   makes no driver call; otherwise each unmapped run gets extents mapped
//!   under it, then is made accessible with one `cuMemSetAccess` per run and
//!   device, all or nothing.
//! - *Extents* (`phys_cache`): CUDA maps a physical allocation only from
//!   offset 0, so an extent (one `cuMemCreate`) is mapped whole (one
//!   `cuMemMap`) under consecutive pages. A run that needs new memory gets
//!   one extent of up to `max_extent_pages` pages per that many pages, so a
//!   block of up to that many pages costs one create, one map and one
//!   set-access.
//! - *Aliases*: CUDA lets one physical allocation be mapped at several
//!   places at once, and a write through one mapping is seen through the
//!   others once the writing operation has completed. So memory never has to
//!   be unmapped to go where it is needed: an idle extent is mapped under the
//!   new run as well, and its old mapping stays. Every physical page has one
//!   *owner*, the page through which blocks may use it; a block is handed out
//!   only over pages that own their memory, so no two live blocks share a
//!   physical byte. A page takes its memory back from another alias when the
//!   owner there has no live block and every stream that freed a block on it
//!   (other than the taker, whose order protects it) is known done. A
//!   repeating workload thus soon finds every alias it needs already mapped:
//!   its steady state makes no driver call while physical memory keeps
//!   following the live bytes.
//! - *Placement* (`placement`): the heap's choice is best fit within the
//!   size class first (a freed block is re-used by the next request of its
//!   size), and with one stream a free also takes in the untouched space
//!   beside it, so a repeating workload re-uses the same addresses. A block
//!   whose pages are held through another alias (a *conflict*), or a large
//!   block that would need `RELOCATE_MIN_PAGES` or more new pages, looks
//!   among up to 64 free places for one without conflicts needing the
//!   fewest new pages; if every place conflicts, it goes to a new
//!   reservation. A place is judged as acquiring it judges it (a physical
//!   page that two mappings of one extent put twice under the block is a
//!   conflict too): a place picked and then refused would send the block
//!   to a new reservation in every pass of a repeating workload, until
//!   address space runs short and each such block unmaps every idle
//!   alias. Small requests and large ones keep their own memory (small
//!   blocks share pages, so aliases between the two would conflict at every
//!   turn).
//! - *Physical memory* for a run (`backing`), in order: cached extents that
//!   fit; idle extents mapped elsewhere that fit, as aliases; new extents,
//!   while the pool holds no more than the slack over the live peak
//!   (`slack_permille` of the peak, at least `slack_min_bytes`); beyond
//!   it, idle extents that fit nowhere are unmapped everywhere (every stream
//!   that freed a block at any of their mappings seen complete: a query, or
//!   an event recorded by an earlier attempt) and released, then new
//!   extents are created. On a busy GPU, pages freed by work still in
//!   flight cannot pass to another stream yet: the reserve can exceed the
//!   live bytes by what is in flight.
//! - *Giving back* (`reclaim`): [`Pool::trim`](crate::pool::Pool::trim) unmaps every idle
//!   mapping whose freeing streams are done and releases extents mapped
//!   nowhere; cached extents above `release_threshold` bytes are released
//!   after each mapping call; aliases beyond `max_alias_ratio` are unmapped.
//! - *Out of memory*: when `cuMemCreate` fails, the pool waits for every
//!   stream that freed blocks, unmaps every idle mapping, releases what is
//!   then mapped nowhere and retries with one-page extents; then it undoes
//!   the call's mappings and fails with [`Error::OutOfMemory`] (requested,
//!   reserved physical, live, largest free block). During a capture it
//!   waits for no stream: only the idle mappings whose streams a query
//!   finds done are taken.
//! - *Regions* (`regions`, `sleep`, `backup`): blocks allocated while a
//!   region is begun carry its tag; [`VirtualPool::sleep`] copies a region's
//!   blocks to pinned host memory (or not) and releases the extents mapped
//!   only under pages of sleeping blocks, keeping the addresses;
//!   [`VirtualPool::wake`] maps memory there again and copies back. Both
//!   are all or nothing.
//!
//! - *Threads* (`VirtualPoolConfig::shards`, `pool/shards.rs`): the pool is
//!   split into lock shards, one per CPU by default, each a whole pool as
//!   above with its own reservations and physical memory. Every thread uses
//!   shard 0 until its lock is contended often; then each thread allocates
//!   from its own shard, and a free goes to the shard owning its
//!   reservation. `max_reserved` counts every shard's memory; a shard out
//!   of memory has the others give back what no live block uses, then
//!   tries again. Regions keep the pool on shard 0 (a sleep covers a whole
//!   region at once).
//!
//! Bad frees: a free is checked against the block the heap finds for it (its
//! 256-byte granules, as in [`PoolResource`](super::PoolResource)); a pointer
//! that starts no used block, a second free or another size is
//! [`Error::InvalidFree`] and frees nothing.
//!
//! Costs: the fast path is one lock, one lane lookup, the TLSF operation,
//! the block's two boundary page entries and a few words of their groups of
//! 64 pages (bitmaps, and on free the frees record); pages that take their
//! memory over from another alias move a whole mapping at a time. The
//! driver calls cost tens of µs each, `cuMemSetAccess` and `cuMemUnmap` by
//! the mappings they cover: an alias costs one map and its share of one
//! set-access, once; after that, memory changes place between the same
//! addresses for nothing. On the H100, the shared training traces' steady
//! state costs tens of ns per operation, somewhat more than
//! [`PoolResource`](super::PoolResource), with no driver call and within 5%
//! of the live peak (figures and runs in the notes above).

mod backing;
mod backup;
mod bits;
mod check;
mod config;
mod drop;
mod ipc;
mod kept;
mod lent;
mod page_table;
mod phys_cache;
mod placement;
mod pool_api;
mod reclaim;
mod regions;
mod sleep;
mod stats;
// The one place the pool passes its memory to the driver's `unsafe` VMM
// methods.
#[allow(unsafe_code)]
mod vmm;
mod whole;

use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;

use self::page_table::PageTable;
use self::phys_cache::PhysCache;
use self::placement::RELOCATE_MIN_PAGES;
use self::regions::Regions;
use super::shards::{shard_count, Guard, RegionOwners, Shards};
use super::stream_order::free_streams::FreeStreams;
use super::stream_order::heap_lanes::HeapLanes;
use super::stream_order::parked::{capturing, ParkedBlocks};
use super::stream_order::streams::may_wait;
use crate::adaptor::CallCount;
use crate::device::Device;
use crate::driver::{DevicePtr, HandleType, PhysProps};
use crate::resource::{validate_request, MemoryResource, Properties};
use crate::stream::Stream;
use crate::suballoc::{Allocation, LaneHeap, LaneId};
use crate::{Error, FreeError, OomInfo, Result};

pub use self::config::{VirtualPoolConfig, VIRTUAL_POOL_MAX_ALIGNMENT};
pub use self::ipc::PhysExport;
pub use self::regions::{Backup, NO_REGION};
pub use self::stats::{ChunkClass, VirtualPoolStats};

/// The area of requests up to `small_limit` bytes.
const SMALL: usize = 0;
/// The area of larger requests.
const LARGE: usize = 1;
const AREAS: usize = 2;

/// One area of the address space: its heap and the heap's stream lanes.
struct Area {
    heap: LaneHeap,
    lanes: HeapLanes,
}

/// Everything behind one shard's lock: a whole pool over its own
/// reservations and physical memory.
struct State {
    /// This shard's index.
    shard: usize,
    areas: [Area; AREAS],
    /// The addresses each area was given, `(start, end, area)`: a
    /// reservation, or for the first one, its two parts.
    area_ranges: Vec<(u64, u64, usize)>,
    pages: PageTable,
    phys: PhysCache,
    streams: FreeStreams,
    peak_live: usize,
    pages_created: u64,
    pages_released: u64,
    extents_created: u64,
    extents_released: u64,
    peak_extents: usize,
    /// Extents by size class ([`VirtualPoolStats::chunk_classes`]).
    extent_classes: [stats::ChunkClass; 2],
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
    /// The region new blocks get, and the regions asleep.
    regions: Regions,
    /// Blocks freed on capturing streams: used in their heap (their pages
    /// stay mapped), freed for the caller (see `stream_order::parked`).
    parked: ParkedBlocks,
    /// The NCCL-ready mode's live blocks and the size each was asked with
    /// (to 256 bytes): its heap holds whole pages, so a free naming another
    /// size within the same pages is caught here.
    whole_sizes: std::collections::HashMap<u64, u64>,
    /// The NCCL-ready mode's freed blocks kept whole for the next request
    /// of their size on their stream (also parked; see `kept`).
    kept: kept::KeptBlocks,
}

impl State {
    /// Shard `shard`, with no reservation yet (its first allocation makes
    /// one), its physical pages counted in `pool_pages` too.
    fn empty(
        shard: usize,
        gran: usize,
        max_physical: Option<usize>,
        pool_pages: &Arc<AtomicUsize>,
    ) -> Self {
        State {
            shard,
            areas: std::array::from_fn(|_| Area {
                heap: LaneHeap::new(),
                lanes: HeapLanes::new(),
            }),
            area_ranges: Vec::new(),
            pages: PageTable::new(gran as u64),
            phys: PhysCache::sharing(pool_pages.clone()),
            streams: FreeStreams::default(),
            peak_live: 0,
            pages_created: 0,
            pages_released: 0,
            extents_created: 0,
            extents_released: 0,
            peak_extents: 0,
            extent_classes: Default::default(),
            max_physical,
            relocations: 0,
            mappings_made: 0,
            mappings_unmapped: 0,
            pages_mapped: 0,
            aliases_made: 0,
            aliases_collected: 0,
            fresh_ranges: 0,
            regions: Regions::default(),
            parked: ParkedBlocks::default(),
            whole_sizes: std::collections::HashMap::new(),
            kept: kept::KeptBlocks::default(),
        }
    }

    /// Bytes in blocks handed out (parked blocks are used in their heap, but
    /// freed).
    fn live_bytes(&self) -> usize {
        self.areas.iter().map(|a| a.heap.used_bytes()).sum::<u64>() as usize - self.parked.bytes()
    }

    #[inline]
    fn area_of(&self, addr: u64) -> Option<usize> {
        area_at(&self.area_ranges, addr)
    }
}

/// The area given `addr` in `area_ranges`.
#[inline]
fn area_at(area_ranges: &[(u64, u64, usize)], addr: u64) -> Option<usize> {
    area_ranges
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
    /// The least size of a later reservation of each area: a power of two
    /// above what the first reservation gave the area (see
    /// `VirtualPool::reserve_more`).
    later_reservation: [usize; AREAS],
    /// What every `cuMemCreate` asks for.
    phys_props: PhysProps,
    /// The pool's shards (see [`VirtualPoolConfig::shards`]), and which
    /// shard owns each reservation.
    shards: Shards<State, RegionOwners>,
    /// Physical pages held, all shards (shared with their caches).
    pool_pages: Arc<AtomicUsize>,
    /// Most physical pages held at once, all shards.
    peak_pages: AtomicUsize,
    /// Some region sleeps (read without the lock, so memory operations go
    /// through at once while none does).
    any_asleep: AtomicBool,
}

impl std::fmt::Debug for VirtualPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VirtualPool")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
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
        if (config.ipc || config.nccl_ready) && !info.posix_fd_ipc {
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
        // A quarter of the first reservation (at least a page) for small blocks.
        let small = (total / 4).next_multiple_of(gran).max(gran);
        let total = total.max(small + gran);
        let base = driver.vmm_reserve(total, gran)?;
        let pool_pages = Arc::new(AtomicUsize::new(0));
        // One shard where memory must stay in one place: an IPC export and
        // the NCCL-ready mode cover the whole pool.
        let count = match config.ipc || config.nccl_ready {
            true => 1,
            false => shard_count(config.shards),
        };
        let mut shards = Shards::spreading(
            count,
            config.spread,
            {
                let (mut next, max, shared) = (0, config.max_reserved, pool_pages.clone());
                move || {
                    next += 1;
                    State::empty(next - 1, gran, max, &shared)
                }
            },
            RegionOwners::default(),
        );
        {
            let (mut all, owners) = shards.get_mut();
            let st = all.next().expect("shard 0");
            owners.insert(base.0, total, 0);
            st.pages.add_reservation(base.0, total as u64);
            let parts = [
                (base.0, small as u64, SMALL),
                (base.0 + small as u64, (total - small) as u64, LARGE),
            ];
            for (start, bytes, area) in parts {
                if let Err(e) = st.areas[area].heap.add_region(start, bytes) {
                    let _ = vmm::Vmm {
                        device: &device,
                        gran,
                    }
                    .free_reservation(base, total);
                    return Err(Error::InvalidArgument(format!(
                        "virtual pool: unusable range at {start:#x}: {e}"
                    )));
                }
                st.area_ranges.push((start, start + bytes, area));
            }
        }
        let handle_type = if config.ipc || config.nccl_ready {
            HandleType::PosixFd
        } else {
            HandleType::None
        };
        let phys_props = PhysProps {
            handle_type,
            rdma_capable: config.nccl_ready && info.gpu_direct_rdma_vmm,
        };
        // Above what the first reservation gave each area (see
        // `reserve_more`); `total` is at most 16 times the device's memory.
        let later_reservation = [small, total - small].map(|b| (b + 1).next_power_of_two());
        Ok(Self {
            device,
            config,
            gran,
            capacity,
            later_reservation,
            phys_props,
            shards,
            pool_pages,
            peak_pages: AtomicUsize::new(0),
            any_asleep: AtomicBool::new(false),
        })
    }

    /// Locks shard 0: the whole pool until its threads spread, and the
    /// shard that holds regions (a pool with regions never spreads).
    #[inline]
    fn lock(&self) -> Guard<'_, State> {
        self.shards.lock(0)
    }

    /// Locks the shard whose reservations hold `addr` (shard 0 when none
    /// does).
    fn lock_owner(&self, addr: u64) -> Guard<'_, State> {
        let owner = self.shards.owner_other_than(addr, 0).unwrap_or(0);
        self.shards.lock(owner)
    }

    /// Runs `f` on every shard in turn, one lock at a time.
    fn each_shard(&self, mut f: impl FnMut(&mut State)) {
        for i in 0..self.shards.len() {
            f(&mut self.shards.lock(i));
        }
    }

    /// Addresses for a block of `bytes` at `alignment` in `area`, from the
    /// stream's lane, the global lane or the slow path; with the lane.
    #[inline(always)]
    fn take_block(
        &self,
        st: &mut State,
        area: usize,
        stream: &Stream,
        bytes: usize,
        alignment: usize,
    ) -> Result<(LaneId, Allocation)> {
        let a = &mut st.areas[area];
        let lane = a.lanes.lane_of(&mut a.heap, stream)?;
        let (b, align) = (bytes as u64, alignment as u64);
        // On a miss in the stream's lane, the global lane's blocks join it
        // (see `PoolResource`): freed blocks merge with the free space beside
        // them instead of each block of a varying size finding new pages.
        if let Some(x) = a.heap.allocate_best(lane, b, align) {
            return Ok((lane, x));
        }
        let from = if a.heap.absorb_global(lane) {
            lane
        } else {
            LaneId::GLOBAL
        };
        let blk = match a.heap.allocate_best(from, b, align) {
            Some(x) => x,
            None => self.take_slow(st, area, lane, stream, bytes, alignment)?,
        };
        Ok((lane, blk))
    }

    /// The last step of an allocation, its block backed: the region's tag
    /// and the live peak.
    #[inline(always)]
    fn hand_out(st: &mut State, area: usize, blk: &Allocation) -> DevicePtr {
        // Read again rather than kept in a register across the backing.
        let tag = st.regions.current;
        if tag != NO_REGION {
            st.areas[area].heap.set_tag(blk.block, tag);
        }
        Self::note_peak(st);
        DevicePtr(blk.addr)
    }

    /// Raises the live peak to the live bytes now.
    #[inline(always)]
    fn note_peak(st: &mut State) {
        let live = st.live_bytes();
        if live > st.peak_live {
            st.peak_live = live;
        }
    }

    fn oom(&self, st: &State, requested: usize) -> Error {
        let largest = st
            .areas
            .iter()
            .map(|a| a.heap.largest_free_any())
            .max()
            .unwrap_or(0);
        Error::oom_with(OomInfo {
            requested,
            device: Some(self.device.ordinal()),
            reserved: Some(st.phys.pool_pages() * self.gran),
            live: Some(st.live_bytes()),
            largest_free: Some(largest as usize),
            limit: st.max_physical,
        })
    }
}

impl MemoryResource for VirtualPool {
    #[inline]
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, VIRTUAL_POOL_MAX_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        if self.config.nccl_ready {
            return self.allocate_whole(bytes, alignment, stream);
        }
        let (_, mut guard) = self.shards.lock_home();
        match self.allocate_in(&mut guard, bytes, alignment, stream) {
            Err(e) if e.is_oom() => {
                drop(guard);
                self.allocate_after_reclaim(bytes, alignment, stream, e)
            }
            r => r,
        }
    }

    #[inline]
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        crate::error::check_alignment(alignment)?;
        let (_, mut guard) = self.shards.lock_home();
        let st = &mut *guard;
        match st.area_of(ptr.0) {
            Some(area) => self.free_in(st, area, ptr, bytes, stream),
            None => {
                drop(guard);
                self.free_elsewhere(self.shards.home(), ptr, bytes, stream, None)
            }
        }
    }

    fn check_access(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.check_access_of(ptr, bytes)
    }

    /// Every shard's lock (see `lent.rs`).
    #[inline]
    fn lent_lock(&self) -> Option<&dyn crate::resource::LentLock> {
        Some(self)
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn properties(&self) -> Properties {
        Properties::DEVICE
    }
}

impl VirtualPool {
    /// An allocation (not in the NCCL-ready mode) served by shard `st`.
    #[inline(always)]
    fn allocate_in(
        &self,
        st: &mut State,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<DevicePtr> {
        if bytes > self.capacity {
            return Err(self.oom(st, bytes));
        }
        if st.regions.current != NO_REGION {
            Self::check_awake(st, bytes)?;
        }
        let area = if bytes <= self.config.small_limit {
            SMALL
        } else {
            LARGE
        };
        let (lane, mut blk) = self.take_block(st, area, stream, bytes, alignment)?;
        let Some(mut span) = st.pages.span(blk.addr, blk.size) else {
            let _ = st.areas[area].heap.free(blk.addr, lane);
            return Err(Error::InvalidArgument(format!(
                "virtual pool: block {:#x} outside its reservations",
                blk.addr
            )));
        };
        let mut got = Self::acquire(st, span, stream);
        let relocate = got.conflict
            || (!got.all_mapped
                && area == LARGE
                && st.pages.count_unmapped(span) >= RELOCATE_MIN_PAGES);
        if relocate {
            (got, span) = self.place_elsewhere(
                st,
                (area, lane),
                &mut blk,
                (bytes, alignment),
                stream,
                got.conflict,
            )?;
        }
        if !got.all_mapped {
            let taker = st.streams.taker_bit(stream);
            if let Err(e) = self.map_missing(st, span, bytes, taker) {
                st.pages.unacquire(span);
                let _ = st.areas[area].heap.free(blk.addr, lane);
                if e.is_oom() {
                    // The numbers without the block that could not be backed.
                    return Err(self.oom(st, bytes));
                }
                return Err(e);
            }
        }
        Ok(Self::hand_out(st, area, &blk))
    }

    /// A free of `ptr`, found in `area` of shard `st`.
    #[inline(always)]
    fn free_in(
        &self,
        st: &mut State,
        area: usize,
        ptr: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        // A parked block is used in its heap: it is refused first.
        st.parked.refuse(ptr)?;
        // Blocks of the NCCL-ready mode are whole pages (a size past the
        // largest is left to the heap to refuse), whose asked size is
        // checked first.
        let bytes = match self.config.nccl_ready {
            true => {
                Self::check_whole_size(st, ptr, bytes)?;
                self.whole_size(bytes).unwrap_or(bytes)
            }
            false => bytes,
        };
        if capturing(stream) {
            return Self::park(st, area, ptr, bytes).map(drop);
        }
        if self.config.nccl_ready && Self::may_keep(st, area, ptr) {
            return Self::keep_whole(st, area, ptr, bytes, stream);
        }
        self.free_checked(st, area, ptr, bytes, stream)
    }

    /// The heap's part of a free of `ptr` as `bytes` on `stream` (the NCCL-
    /// ready mode's asked size already checked): the heap checks the block
    /// and frees it, and its pages record the free.
    #[inline(always)]
    fn free_checked(
        &self,
        st: &mut State,
        area: usize,
        ptr: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        let a = &mut st.areas[area];
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
        .map_err(|e| e.into_invalid_free(ptr.0))?;
        let (bit, tick) = st.streams.on_free(stream);
        if let Some(span) = st.pages.span(ptr.0, size) {
            st.pages.release(span, bit, tick);
        }
        if st.regions.has_sleeping_blocks() {
            st.regions.forget(ptr.0);
        }
        if self.config.nccl_ready {
            st.whole_sizes.remove(&ptr.0);
        }
        Ok(())
    }

    /// The NCCL-ready mode: refuses a free of `ptr` naming another size than
    /// it was allocated with (compared at 256 bytes, as the other blocks'
    /// sizes are).
    #[cold]
    fn check_whole_size(st: &State, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let Some(&asked) = st.whole_sizes.get(&ptr.0) else {
            return Ok(()); // not a live block: the heap says why
        };
        if crate::adaptor::granular_size(bytes).map(|g| g as u64) != Some(asked) {
            return Err(Error::InvalidFree {
                ptr: ptr.0,
                reason: FreeError::SizeMismatch {
                    allocated: asked as usize,
                    freed: bytes,
                },
            });
        }
        Ok(())
    }

    /// A free of `ptr` as `bytes` found in `area` of shard `st`, checked as
    /// any free is, then parked (its pages stay mapped and counted under a
    /// live block): on a capturing stream, or kept by the NCCL-ready mode.
    /// Returns the block's size.
    #[cold]
    #[inline(never)]
    fn park(st: &mut State, area: usize, ptr: DevicePtr, bytes: usize) -> Result<usize> {
        let size = st.areas[area]
            .heap
            .check_free_sized(ptr.0, bytes as u64)
            .map_err(|e| e.into_invalid_free(ptr.0))? as usize;
        st.parked.insert(ptr, size);
        Ok(size)
    }

    /// A free of a block of another shard than `home` (the calling
    /// thread's, whose reservations do not hold it); `count`, if any, is
    /// applied in the owner's cell, where the allocation counted.
    #[cold]
    #[inline(never)]
    pub(super) fn free_elsewhere(
        &self,
        home: usize,
        ptr: DevicePtr,
        bytes: usize,
        stream: &Stream,
        count: Option<CallCount<'_>>,
    ) -> Result<()> {
        let unknown = Error::InvalidFree {
            ptr: ptr.0,
            reason: FreeError::Unknown,
        };
        let Some(owner) = self.shards.owner_other_than(ptr.0, home) else {
            return Err(unknown);
        };
        let mut guard = self.shards.lock(owner);
        let st = &mut *guard;
        let Some(area) = st.area_of(ptr.0) else {
            return Err(unknown);
        };
        self.free_in(st, area, ptr, bytes, stream)?;
        if let Some(count) = count {
            count.apply(owner);
        }
        Ok(())
    }

    /// The calling thread's shard is out of memory: the other shards give
    /// back every physical page not under a live block (waiting for the
    /// streams that freed them), then its shard tries again; `first` when
    /// the others had nothing to give.
    #[cold]
    #[inline(never)]
    fn allocate_after_reclaim(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        first: Error,
    ) -> Result<DevicePtr> {
        if self.shards.len() == 1 {
            return Err(first);
        }
        let home = self.shards.home();
        let mut freed = 0;
        for j in (0..self.shards.len()).filter(|&j| j != home) {
            let mut st = self.shards.lock(j);
            if st.phys.total_pages() == 0 {
                continue;
            }
            if may_wait() {
                st.streams.synchronize_all(&self.device)?;
            }
            self.reclaim(&mut st, usize::MAX)?;
            freed += self.release_cached(&mut st, 0).0;
        }
        if freed == 0 {
            return Err(first);
        }
        self.allocate_in(&mut self.shards.lock(home), bytes, alignment, stream)
    }
}
