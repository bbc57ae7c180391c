//! `PoolResource`: a coalescing, best-fit pool over an upstream resource (RMM's
//! pool_memory_resource), built on the TLSF lanes of [`crate::suballoc`].
//!
//! Algorithm: the pool takes *regions* from its upstream and sub-allocates them
//! with a two-level segregated-fit index: O(1) allocate and free whatever the
//! number of free blocks, blocks split on allocation and coalesce with free
//! neighbours on free.
//!
//! Size segregation (PyTorch's small and large pools): requests up to
//! `small_limit` (1 MiB) are served only by the *small* heap, whose regions are
//! `small_region` (2 MiB); larger ones only by the *large* heap, whose regions
//! are `medium_region` (20 MiB) for requests up to `medium_limit` (10 MiB) and
//! of the request's own size (rounded to 2 MiB) above. Why: when both share
//! one heap, small requests split the large free blocks that the next large
//! request needs, and that request grows a new region. The large heap first
//! looks in the request's own size class ([`LaneHeap::allocate_best`]: the
//! first fitting block among the first 32 of that class; TLSF's good fit
//! alone skips that class and splits a block of a larger one), so a freed
//! tensor's block is reused by the next tensor of that size; of the two
//! changes, this look lowers the reserve most (the measurements:
//! `docs/decisions.md`). The small heap keeps TLSF's plain good fit. A free finds its block in the heap its
//! size names, else in the other one.
//!
//! Each stream that frees blocks has its own lane, the same lane number in
//! both heaps (kept in step by the lane logic of `pool/stream_order/heap_lanes.rs`, shared
//! with [`VirtualPool`](super::VirtualPool); see the stream-ordering policy
//! in [`crate::pool`]): an
//! allocation on stream S tries S's lane, then the global lane (blocks safe
//! for everyone), whose blocks are first refiled in S's lane so that they
//! merge with S's free blocks beside them: a stream whose work never stops
//! (its lane never settles) would otherwise keep its freed blocks apart
//! from the untouched rest of their regions, and sizes that vary from one
//! iteration to the next would grow regions beside free space that fits
//! (1.62 of the live peak instead of 1.25 on `gpumem bench --workload
//! iterations --vary 0.3`). Only when both miss does the slow path run, in
//! this order:
//!
//! 1. *settle*: lanes whose stream is idle (`cuStreamQuery`) move to the global
//!    lane, coalescing as they go;
//! 2. *steal*: a lane with a block big enough is handed to S after one event
//!    recorded on its stream and one `cuStreamWaitEvent` on S;
//! 3. *grow*: a new region from the upstream, sized by the [`GrowthPolicy`];
//! 4. *reclaim*: on upstream out-of-memory (or the pool's maximum), wait for
//!    every stream with free blocks (during a capture, only query them:
//!    nothing is waited for then), take a free block of either heap (the
//!    segregation yields to memory pressure), else give entirely free regions
//!    back and retry; then fail with
//!    [`Error::OutOfMemory`] carrying requested, reserved, live and
//!    largest-free bytes.
//!
//! Costs: the fast path is one uncontended lock, one stream-to-lane lookup and
//! the TLSF operation (tens of ns); no driver call, no event. A free is
//! checked against the block the same lookup finds: a pointer that starts no
//! used block, or a size that does not round up to the block's 256-byte
//! granules, is [`Error::InvalidFree`] and frees nothing. A block freed on a
//! capturing stream is checked the same way and parked for the graph (see
//! [`crate::pool`]): it stays used in its heap, kept apart in its shard, and
//! is subtracted from the live numbers; a free first looks there, which
//! costs nothing but a length read while nothing is parked. Growth costs one
//! upstream allocation (`cuMemAlloc`, a driver call).
//!
//! Threads: the pool is split into lock shards, one per CPU by default
//! ([`PoolConfig::shards`]; `pool/shards.rs` says why shards and why per
//! thread), each a whole pool as described above with its own lock, lanes
//! and regions. Every thread uses shard 0 until its lock is contended often
//! ([`Spread::OnContention`], the default; a program whose threads seldom
//! meet keeps one pool's memory); from then on a thread allocates from its
//! own shard, so threads do not contend. A free is tried in the calling
//! thread's shard first and otherwise goes to the shard owning the block's
//! region. Before growing, a shard adopts an entirely free region (in the
//! global lane, after settling) from another shard; reclaim on
//! out-of-memory settles every shard and takes a free block of any shard
//! before regions go back. Memory kept apart by the shards is the free
//! space inside partly used regions: whole free regions go to whichever
//! shard needs to grow. `reserved` counts every shard's regions;
//! `peak_live` is each shard's peak summed, exact while one thread
//! allocates and an upper bound with several.
//!
//! Growth does not double: RMM's doubling reserves well above the live peak on
//! real traces. Regions are tiered (2 MiB, 20 MiB, exact) so the reserve
//! follows the live peak. Free regions are not given back before growing (on
//! the shared traces the sizes given back were needed again, and the reserve
//! grew); they go back only on `trim`, `release` and out-of-memory.
//!
//! Expandable heaps ([`PoolConfig::expandable`], the C ABI's default): where
//! the upstream can grow an allocation in place
//! ([`MemoryResource::grow_in_place`]), each heap grows one range at its end
//! instead of taking regions (`pool_resource/expandable.rs`), so free space
//! at what would have been a region's end joins the next growth, and a trim
//! also gives back the free end of a range and the free pieces inside it
//! (`pool_resource/release_pieces.rs`). Separate regions strand that space,
//! most where sizes change every iteration (`docs/decisions.md`).

mod expandable;
mod free_pieces;
mod recycle;
mod release_pieces;

/// A way of giving back shard `i`'s memory, up to `excess` bytes: returns
/// the bytes given back.
type ReleaseStep<U> = fn(&PoolResource<U>, usize, usize) -> Result<usize>;

use self::expandable::Frontier;
use super::live_blocks;
use super::shards::{shard_count, Guard, RegionOwners, Shards, Spread};
use super::stream_order::heap_lanes::HeapLanes;
use super::stream_order::parked::{capturing, ParkedBlocks};
use super::stream_order::streams::may_wait;
use super::Pool;
use crate::adaptor::CallCount;
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{validate_request, LentLock, LiveBlock, MemoryResource, Properties};
use crate::stream::Stream;
use crate::suballoc::{span_with_padding, HeapError, LaneHeap, LaneId};
use crate::{Error, OomInfo, Result};

/// Largest alignment the pool serves (padding is split off inside a block).
pub const POOL_MAX_ALIGNMENT: usize = 1 << 30;

/// How big a region the pool takes from its upstream when it must grow.
///
/// Requests up to `small_limit` get regions of `small_region` bytes, requests
/// up to `medium_limit` get `medium_region`, larger ones a region of their own
/// size rounded up to `granularity`. `small_limit` also splits the pool into
/// its small and large heaps (see the module documentation). (PyTorch's
/// caching allocator uses 2 MiB and 20 MiB segments the same way.)
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GrowthPolicy {
    /// Largest request served from a small region.
    pub small_limit: usize,
    /// Size of a region grown for a small request.
    pub small_region: usize,
    /// Largest request served from a medium region.
    pub medium_limit: usize,
    /// Size of a region grown for a medium request.
    pub medium_region: usize,
    /// Every region is a multiple of this.
    pub granularity: usize,
}

impl Default for GrowthPolicy {
    fn default() -> Self {
        Self {
            small_limit: 1 << 20,
            small_region: 2 << 20,
            medium_limit: 10 << 20,
            medium_region: 20 << 20,
            granularity: 2 << 20,
        }
    }
}

impl GrowthPolicy {
    /// The region size for a request needing `bytes` (padding included), or
    /// `None` when the numbers overflow.
    pub fn region_for(&self, bytes: usize) -> Option<usize> {
        let base = if bytes <= self.small_limit {
            self.small_region.max(bytes)
        } else if bytes <= self.medium_limit {
            self.medium_region.max(bytes)
        } else {
            bytes
        };
        let g = self.granularity.max(256);
        base.checked_next_multiple_of(g)
    }
}

/// Configuration of a [`PoolResource`]. `Default`: nothing taken up front,
/// no limit, the default [`GrowthPolicy`], one lock shard per CPU that
/// threads spread over once they contend ([`Spread::OnContention`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Bytes taken from the upstream when the pool is made (0 allowed); the
    /// region serves the heap its size names (large above `small_limit`).
    pub initial_size: usize,
    /// Most bytes the pool may hold from its upstream: its regions, growths
    /// in flight included (at least `initial_size`). A growth that would
    /// pass it is out of memory (after reclaiming). `None`: no limit.
    pub max_reserved: Option<usize>,
    /// How regions are sized when the pool grows.
    pub growth: GrowthPolicy,
    /// Lock shards (rounded up to a power of two): 0 (the default) is one
    /// per CPU (at most 64), 1 one lock for all threads. Shards let threads
    /// allocate without contending, but each keeps the free space of its
    /// partly used regions to itself: where one thread frees what another
    /// allocates again, as PyTorch's autograd thread does with the main
    /// thread's activations, one shard per CPU in use from the start
    /// reserved markedly more (`docs/decisions.md`). Hence `spread`.
    pub shards: usize,
    /// When threads spread over the shards: once shard 0's lock is
    /// contended often (the default), or from the start.
    pub spread: Spread,
    /// Each heap grows one address range in place, where the upstream can
    /// ([`MemoryResource::grow_in_place`]: a [`DeviceResource`] on a device
    /// with CUDA's virtual memory management, through the limiting and
    /// statistics adaptors), instead of taking separate regions: blocks
    /// coalesce across what would have been region boundaries, growth
    /// follows the live peak to within one 2 MiB granule per heap, and a
    /// trim gives back the free end of a range and the free pieces of
    /// physical memory inside it (PyTorch's expandable segments). Where the
    /// upstream cannot, regions as without it.
    ///
    /// [`DeviceResource`]: crate::resource::DeviceResource
    pub expandable: bool,
    /// With [`expandable`](Self::expandable) heaps: map each range in pieces
    /// of at most [`PIECE_GRANULES`](crate::resource::PIECE_GRANULES) granules and, before a range grows, move the
    /// memory of pieces lying wholly in free blocks to its end instead of
    /// creating more (waiting for the streams that freed them first; never
    /// during a graph capture). Off by default: it holds less memory where
    /// a workload's holes keep their place (PyTorch's GPT-2 training
    /// reserves less with it, at the same speed) but moves pieces again and
    /// again where the layout changes from one pass to the next, which
    /// makes a replayed log's steady state several times slower
    /// (`docs/decisions.md`).
    pub recycle_pieces: bool,
}

impl Default for PoolConfig {
    fn default() -> Self {
        Self {
            initial_size: 0,
            max_reserved: None,
            growth: GrowthPolicy::default(),
            shards: 0,
            spread: Spread::OnContention,
            expandable: false,
            recycle_pieces: false,
        }
    }
}

/// Numbers describing a pool at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Bytes held from the upstream.
    pub reserved: usize,
    /// Highest `reserved` so far.
    pub peak_reserved: usize,
    /// Bytes in blocks handed out (rounded sizes).
    pub live: usize,
    /// Highest `live` so far.
    pub peak_live: usize,
    /// Number of blocks handed out.
    pub live_blocks: usize,
    /// Bytes in free blocks, all lanes.
    pub free: usize,
    /// Number of free blocks, all lanes.
    pub free_blocks: usize,
    /// Largest free block in any lane.
    pub largest_free: usize,
    /// Regions held from the upstream.
    pub regions: usize,
    /// Stream lanes, all shards (a stream used on several threads has a
    /// lane in each of their shards).
    pub lanes: usize,
    /// Lock shards the threads use: 1 until they spread (see
    /// [`PoolConfig::spread`]), then all of them.
    pub shards_in_use: usize,
    /// Allocations and frees that found shard 0's lock held, counted until
    /// the threads spread.
    pub contended: u64,
}

/// Heap of requests up to `small_limit`, carved from small regions.
const SMALL: usize = 0;
/// Heap of larger requests, carved from medium and exact-size regions.
const LARGE: usize = 1;
/// Number of size classes, each served by its own [`LaneHeap`].
const CLASSES: usize = 2;

/// One lock shard: a whole pool over the regions it owns.
struct Shard {
    /// One heap per size class ([`SMALL`], [`LARGE`]); both have the same
    /// lanes, so one [`LaneId`] per stream serves both.
    heaps: [LaneHeap; CLASSES],
    /// The streams' lanes of `heaps`, kept in step across both heaps.
    lanes: HeapLanes,
    peak_live: usize,
    /// The range each heap grows, with [`PoolConfig::expandable`].
    frontier: [Option<Frontier>; CLASSES],
    /// Blocks of `heaps` freed on capturing streams: used in their heap,
    /// freed for the caller (see `stream_order::parked`).
    parked: ParkedBlocks,
}

impl Shard {
    fn new() -> Self {
        Self {
            heaps: std::array::from_fn(|_| LaneHeap::new()),
            lanes: HeapLanes::new(),
            peak_live: 0,
            frontier: [None; CLASSES],
            parked: ParkedBlocks::default(),
        }
    }

    /// Bytes in blocks handed out (parked blocks are used in their heap, but
    /// freed).
    #[inline]
    fn live(&self) -> usize {
        self.heaps.iter().map(|h| h.used_bytes()).sum::<u64>() as usize - self.parked.bytes()
    }

    fn largest_free_any(&self) -> usize {
        self.heaps
            .iter()
            .map(|h| h.largest_free_any())
            .max()
            .unwrap_or(0) as usize
    }

    /// The lane of `stream`, created on first use (the same number in both
    /// heaps).
    #[inline]
    fn lane_of(&mut self, stream: &Stream) -> Result<LaneId> {
        self.lanes.lane_of(&mut self.heaps, stream)
    }
}

/// What the shards share, under the owners' lock.
#[derive(Default)]
struct Shared {
    /// Upstream allocation of each region and the shard holding it.
    regions: RegionOwners,
    /// Bytes asked of the upstream by growths in flight: no lock is held
    /// across upstream calls, and these count against `max_reserved`.
    growing: usize,
    peak_reserved: usize,
}

impl AsRef<RegionOwners> for Shared {
    fn as_ref(&self) -> &RegionOwners {
        &self.regions
    }
}

/// A coalescing best-fit pool; see the module documentation.
///
/// ```
/// use gpumem::pool::{Pool, PoolConfig, PoolResource};
/// use gpumem::resource::{DeviceResource, MemoryResource};
/// use gpumem::Device;
///
/// fn main() -> gpumem::Result<()> {
///     let device = Device::sim(Default::default());
///     let mut config = PoolConfig::default();
///     config.max_reserved = Some(64 << 20); // never more than 64 MiB from the device
///     let pool = PoolResource::new(DeviceResource::new(device.clone()), config)?;
///     let stream = device.create_stream()?;
///
///     let p = pool.allocate(1 << 20, 256, &stream)?; // grows one 2 MiB region
///     pool.deallocate(p, 1 << 20, 256, &stream)?;
///     let q = pool.allocate(1 << 20, 256, &stream)?; // same stream: reused at once
///     assert_eq!(q, p);
///     assert_eq!(pool.reserved_bytes(), 2 << 20);
///
///     // Past the limit: an error with the numbers, not a panic.
///     let err = pool.allocate(128 << 20, 256, &stream).unwrap_err();
///     assert_eq!(err.oom_info().unwrap().limit, Some(64 << 20));
///
///     pool.deallocate(q, 1 << 20, 256, &stream)?;
///     assert_eq!(pool.release()?, 2 << 20); // waits for `stream`, gives back
///     Ok(())
/// }
/// ```
pub struct PoolResource<U: MemoryResource> {
    upstream: U,
    config: PoolConfig,
    shards: Shards<Shard, Shared>,
    /// Whether blocks freed on capturing streams are parked (see
    /// `stream_order::parked`); not in a graph pool, whose captures reuse
    /// what they free.
    parks: bool,
}

impl<U: MemoryResource> std::fmt::Debug for PoolResource<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolResource")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<U: MemoryResource> PoolResource<U> {
    /// A pool over `upstream`, taking `config.initial_size` bytes at once.
    pub fn new(upstream: U, config: PoolConfig) -> Result<Self> {
        if let Some(max) = config.max_reserved {
            if config.initial_size > max {
                return Err(Error::InvalidArgument(format!(
                    "pool initial size {} exceeds its max_reserved {max}",
                    config.initial_size
                )));
            }
        }
        if config.growth.granularity == 0 || !config.growth.granularity.is_multiple_of(256) {
            return Err(Error::InvalidArgument(format!(
                "pool growth granularity {} is not a positive multiple of 256",
                config.growth.granularity
            )));
        }
        let g = &config.growth;
        for (name, size) in [("small", g.small_region), ("medium", g.medium_region)] {
            if size.checked_next_multiple_of(g.granularity).is_none() {
                return Err(Error::InvalidArgument(format!(
                    "pool {name} region size {size} cannot be rounded up to its granularity {}",
                    g.granularity
                )));
            }
        }
        let shards = Shards::spreading(
            shard_count(config.shards),
            config.spread,
            Shard::new,
            Shared::default(),
        );
        let pool = Self {
            upstream,
            config,
            shards,
            parks: true,
        };
        if pool.config.initial_size > 0 {
            // A size no allocation can have is out of memory, as for requests.
            let bytes = pool
                .config
                .initial_size
                .checked_next_multiple_of(256)
                .ok_or_else(|| Error::oom(pool.config.initial_size))?;
            let class = pool.class_of(bytes);
            let home = pool.shards.home();
            pool.grow(pool.shards.lock(home), home, class, bytes).1?;
        }
        Ok(pool)
    }

    /// A pool with the default configuration: nothing taken up front, no limit.
    pub fn with_defaults(upstream: U) -> Result<Self> {
        Self::new(upstream, PoolConfig::default())
    }

    /// Makes this a graph-private pool, as in a
    /// [`GraphPool`](crate::graph_pool::GraphPool): a block freed on a
    /// capturing stream goes back to the pool, for the same capture and
    /// later captures into it, instead of being parked for the graph (see
    /// [`crate::captures`]). Only for a pool that nothing but graph
    /// captures allocate from.
    pub fn reusing_captured_frees(mut self) -> Self {
        self.parks = false;
        self
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// The configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    /// Runs `f` on every shard in turn (one lock held at a time).
    fn each_shard(&self, mut f: impl FnMut(usize, &mut Shard)) {
        for i in 0..self.shards.len() {
            f(i, &mut self.shards.lock(i));
        }
    }

    /// The size class (heap) serving a request of `bytes`.
    #[inline]
    fn class_of(&self, bytes: usize) -> usize {
        if bytes <= self.config.growth.small_limit {
            SMALL
        } else {
            LARGE
        }
    }

    /// The region size grown in heap `class` for a request needing `needed`
    /// bytes (padding included), or `None` when the numbers overflow. Same
    /// tiers as [`GrowthPolicy::region_for`], but the heap is chosen by the
    /// request, not by its padded size.
    fn region_in(&self, class: usize, needed: usize) -> Option<usize> {
        let g = &self.config.growth;
        let base = if class == SMALL {
            g.small_region.max(needed)
        } else if needed <= g.medium_limit {
            g.medium_region.max(needed)
        } else {
            needed
        };
        base.checked_next_multiple_of(g.granularity.max(256))
    }

    /// The current numbers (each shard read under its own lock: exact when
    /// no other thread is using the pool).
    pub fn stats(&self) -> PoolStats {
        let mut out = PoolStats::default();
        self.each_shard(|_, sh| {
            out.peak_live += sh.peak_live;
            out.lanes += sh.lanes.len();
            out.live += sh.live();
            for h in &sh.heaps {
                let s = h.stats();
                out.live_blocks += s.used_blocks;
                out.free += s.free_bytes as usize;
                out.free_blocks += s.free_blocks as usize;
                out.largest_free = out.largest_free.max(s.largest_free as usize);
            }
            // Used in their heaps, freed for the caller.
            out.live_blocks -= sh.parked.len();
        });
        let g = self.shards.global();
        out.reserved = g.regions.bytes();
        out.peak_reserved = g.peak_reserved;
        out.regions = g.regions.len();
        out.shards_in_use = if self.shards.spread_out() {
            self.shards.len()
        } else {
            1
        };
        out.contended = self.shards.contended();
        out
    }

    /// Bytes handed out.
    pub fn live_bytes(&self) -> usize {
        let mut live = 0;
        self.each_shard(|_, sh| live += sh.live());
        live
    }

    /// The blocks handed out, in address order, with their sizes as the pool
    /// rounded them (the requested sizes are not recorded). O(blocks).
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        let mut out = Vec::new();
        self.each_shard(|_, sh| out.extend(live_blocks::live_blocks(&sh.heaps, &sh.parked)));
        out.sort_unstable();
        out
    }

    /// The size of the live block starting at `ptr`, if there is one.
    pub fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        let mut found = None;
        self.each_shard(|_, sh| {
            found = found.or_else(|| live_blocks::live_block_size(&sh.heaps, &sh.parked, ptr));
        });
        found
    }

    /// Checks the pool's structure and describes the first fault found:
    /// every heap's own invariants, the regions recorded for the shards
    /// against those their heaps hold (bases, sizes, owners), and each
    /// expandable range against its region. Every shard's lock is held.
    /// O(blocks): for tests and debugging.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let shards = self.shards.lock_all();
        let g = self.shards.global();
        let mut held = std::collections::BTreeMap::new();
        for (i, sh) in shards.iter().enumerate() {
            for (class, heap) in sh.heaps.iter().enumerate() {
                heap.check_invariants()
                    .map_err(|e| format!("shard {i} heap {class}: {e}"))?;
                for (_, base, size) in heap.regions() {
                    held.insert(base, (size as usize, i));
                }
                if let Some(f) = sh.frontier[class] {
                    let region = heap.regions().find(|r| r.0 == f.region);
                    if region.map(|r| (r.1, r.2 as usize)) != Some((f.base, f.bytes)) {
                        return Err(format!(
                            "shard {i} heap {class}: frontier {f:?} against region {region:?}"
                        ));
                    }
                }
            }
        }
        let recorded: std::collections::BTreeMap<_, _> = g
            .regions
            .iter()
            .map(|(base, bytes)| {
                (
                    base,
                    (bytes, g.regions.owner_of(base).unwrap_or(usize::MAX)),
                )
            })
            .collect();
        if recorded != held {
            return Err(format!(
                "regions recorded {recorded:?}, held by the heaps {held:?}"
            ));
        }
        Ok(())
    }

    /// The largest free block in any lane of either heap: the largest request
    /// the pool can serve without growing (after waiting for the stream that
    /// freed it, when that is another stream).
    pub fn largest_free_block(&self) -> usize {
        let mut largest = 0;
        self.each_shard(|_, sh| largest = largest.max(sh.largest_free_any()));
        largest
    }

    fn settle(sh: &mut Shard, keep: Option<LaneId>) {
        sh.lanes.settle(&mut sh.heaps, keep)
    }

    fn settle_blocking(sh: &mut Shard) -> Result<()> {
        sh.lanes.settle_blocking(&mut sh.heaps)
    }

    /// Steals a lane with a block of `needed` bytes in heap `class`; the
    /// victim's blocks move in both heaps (one wait covers them all).
    fn steal(sh: &mut Shard, class: usize, lane: LaneId, stream: &Stream, needed: u64) -> bool {
        sh.lanes.steal(&mut sh.heaps, class, lane, stream, needed)
    }

    /// Counts `bytes` of a growth in flight against `max_reserved`, holding
    /// shard `home`'s lock `st`; when they do not fit, the out-of-memory
    /// error (made with no lock held: it reads every shard) and the guard
    /// re-taken.
    fn start_growth<'a>(
        &'a self,
        st: Guard<'a, Shard>,
        home: usize,
        bytes: usize,
    ) -> std::result::Result<Guard<'a, Shard>, (Guard<'a, Shard>, Error)> {
        let mut g = self.shards.global();
        if let Some(max) = self.config.max_reserved {
            if g.regions
                .bytes()
                .saturating_add(g.growing)
                .saturating_add(bytes)
                > max
            {
                drop((g, st));
                let e = self.oom(bytes);
                return Err((self.shards.lock(home), e));
            }
        }
        g.growing += bytes;
        Ok(st)
    }

    /// Takes a region of `bytes` from the upstream into the global lane of
    /// heap `class` of shard `home`. No lock is held across the upstream
    /// call, so an upstream that calls back into this pool (a failure
    /// callback that releases it, say) cannot deadlock; the guard comes back
    /// re-taken.
    fn grow<'a>(
        &'a self,
        st: Guard<'a, Shard>,
        home: usize,
        class: usize,
        bytes: usize,
    ) -> (Guard<'a, Shard>, Result<()>) {
        let st = match self.start_growth(st, home, bytes) {
            Ok(st) => st,
            Err((st, e)) => return (st, Err(e)),
        };
        drop(st);
        let got = self.upstream.allocate_sync(bytes, 256);
        let mut st = self.shards.lock(home);
        let mut g = self.shards.global();
        g.growing -= bytes;
        let base = match got {
            Ok(base) => base,
            Err(e) => {
                drop(g);
                return (st, Err(e));
            }
        };
        if let Err(e) = st.heaps[class].add_region(base.0, bytes as u64) {
            drop((g, st));
            let _ = self.upstream.deallocate_sync(base, bytes, 256);
            let e = Error::InvalidArgument(format!(
                "upstream returned an unusable region at {:#x}: {e}",
                base.0
            ));
            return (self.shards.lock(home), Err(e));
        }
        g.regions.insert(base.0, bytes, home);
        g.peak_reserved = g.peak_reserved.max(g.regions.bytes());
        drop(g);
        (st, Ok(()))
    }

    /// Moves an entirely free region of heap `class` of at least `needed`
    /// bytes from another shard to shard `home` (the smallest such region of
    /// the first shard that has one; that shard's idle lanes are settled
    /// first). Returns the guard of `home` re-taken, and whether a region
    /// came.
    fn adopt<'a>(
        &'a self,
        st: Guard<'a, Shard>,
        home: usize,
        class: usize,
        needed: u64,
    ) -> (Guard<'a, Shard>, bool) {
        drop(st);
        for j in (0..self.shards.len()).filter(|&j| j != home) {
            let mut other = self.shards.lock(j);
            if other.heaps[class].region_bytes() == 0 {
                continue;
            }
            Self::settle(&mut other, None);
            // A shard's expandable range stays its own.
            let frontier = other.frontier[class].map(|f| f.region);
            let pick = other.heaps[class]
                .free_regions()
                .filter(|&(id, _, size)| size >= needed && Some(id) != frontier)
                .min_by_key(|&(_, _, size)| size);
            let Some((id, _, _)) = pick else { continue };
            let Ok((base, size)) = other.heaps[class].remove_region(id) else {
                continue;
            };
            self.shards.global().regions.set_owner(base, home);
            drop(other);
            let mut st = self.shards.lock(home);
            if st.heaps[class].add_region(base, size).is_ok() {
                return (st, true);
            }
            // Not expected (regions never overlap): the region goes back.
            drop(st);
            let mut other = self.shards.lock(j);
            if other.heaps[class].add_region(base, size).is_ok() {
                self.shards.global().regions.set_owner(base, j);
            }
            drop(other);
            return (self.shards.lock(home), false);
        }
        (self.shards.lock(home), false)
    }

    /// Gives entirely free regions of shard `i` back to the upstream, largest
    /// first, up to `excess` bytes (at least), without holding a lock across
    /// the upstream calls. A region the upstream refuses stays the pool's,
    /// free in its heap, so nothing is lost; the first such error is
    /// returned once every region was tried. Returns the bytes given back.
    fn release_free_regions(
        &self,
        mut st: Guard<'_, Shard>,
        i: usize,
        mut excess: usize,
    ) -> Result<usize> {
        let s = &mut *st;
        let frontier = s.frontier;
        let mut free: Vec<_> = s
            .heaps
            .iter()
            .enumerate()
            .flat_map(|(class, heap)| {
                heap.free_regions()
                    .map(move |(id, _, size)| (class, id, size))
            })
            // A range being grown or shrunk stays.
            .filter(|&(class, id, _)| frontier[class].is_none_or(|f| !(f.busy && f.region == id)))
            .collect();
        free.sort_by_key(|&(_, _, size)| std::cmp::Reverse(size));
        let mut taken = Vec::new();
        {
            // Forgotten before the upstream call: once given back, the
            // upstream may hand the same base to another thread's growth.
            let mut g = self.shards.global();
            for (class, id, _) in free {
                if excess == 0 {
                    break;
                }
                if let Ok((base, size)) = s.heaps[class].remove_region(id) {
                    if s.frontier[class].is_some_and(|f| f.region == id) {
                        s.frontier[class] = None;
                    }
                    g.regions.remove(base);
                    excess = excess.saturating_sub(size as usize);
                    taken.push((class, base, size as usize));
                }
            }
        }
        drop(st);
        if taken.is_empty() {
            return Ok(0);
        }
        let mut released = 0;
        let mut first_err = None;
        taken.retain(|&(_, base, bytes)| {
            match self.upstream.deallocate_sync(DevicePtr(base), bytes, 256) {
                Ok(()) => {
                    released += bytes;
                    false
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                    true
                }
            }
        });
        let mut st = self.shards.lock(i);
        for (class, base, bytes) in taken {
            // Removed a moment ago and still the pool's: it fits back.
            if st.heaps[class].add_region(base, bytes as u64).is_ok() {
                self.shards.global().regions.insert(base, bytes, i);
            }
        }
        first_err.map_or(Ok(released), Err)
    }

    /// Gives entirely free regions of every shard back until the pool holds
    /// at most `to` bytes, after settling each shard (without waiting).
    /// Returns the bytes given back.
    fn release_to(&self, to: usize) -> Result<usize> {
        let mut released = 0;
        let mut first_err = None;
        for i in 0..self.shards.len() {
            let excess = self.shards.global().regions.bytes().saturating_sub(to);
            if excess == 0 {
                break;
            }
            let mut st = self.shards.lock(i);
            // Lanes of streams their users dropped go once empty.
            let sh = &mut *st;
            sh.lanes.settle_and_forget(&mut sh.heaps);
            match self.release_free_regions(st, i, excess) {
                Ok(b) => released += b,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
            // Then the expandable heaps' free ends, then the free pieces
            // inside their ranges.
            let steps: [ReleaseStep<U>; 2] = [Self::shrink_frontiers, Self::release_free_pieces];
            for step in steps {
                let excess = self.shards.global().regions.bytes().saturating_sub(to);
                if excess == 0 {
                    break;
                }
                match step(self, i, excess) {
                    Ok(b) => released += b,
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        first_err.map_or(Ok(released), Err)
    }

    /// The out-of-memory error for a request of `requested` bytes; called
    /// with no lock held.
    fn oom(&self, requested: usize) -> Error {
        let (mut live, mut largest) = (0, 0);
        self.each_shard(|_, sh| {
            live += sh.live();
            largest = largest.max(sh.largest_free_any());
        });
        Error::oom_with(OomInfo {
            requested,
            device: Some(self.upstream.device().ordinal()),
            reserved: Some(self.shards.global().regions.bytes()),
            live: Some(live),
            largest_free: Some(largest),
            limit: self.config.max_reserved,
        })
    }

    #[inline]
    fn take(
        st: &mut Shard,
        class: usize,
        lane: LaneId,
        bytes: usize,
        alignment: usize,
    ) -> Option<DevicePtr> {
        let growing = st.frontier[class].map(|f| f.region);
        let heap = &mut st.heaps[class];
        let (size, align) = (bytes as u64, alignment as u64);
        let a = match growing {
            _ if class == SMALL => heap.allocate(lane, size, align),
            // The range's free end is the last resort (see `expandable`).
            Some(r) => heap.allocate_best_sparing_end(lane, size, align, r),
            None => heap.allocate_best(lane, size, align),
        }?;
        let live = st.live();
        if live > st.peak_live {
            st.peak_live = live;
        }
        Some(DevicePtr(a.addr))
    }

    /// Allocation when both of the stream's lanes in its thread's shard
    /// missed: settle, steal, adopt, grow, then reclaim (see the module
    /// documentation). Takes the guard: the slow path releases the lock.
    #[cold]
    fn allocate_slow<'a>(
        &'a self,
        mut st: Guard<'a, Shard>,
        home: usize,
        class: usize,
        stream: &Stream,
        bytes: usize,
        alignment: usize,
    ) -> Result<DevicePtr> {
        let Some(needed) = span_with_padding(bytes, alignment) else {
            drop(st);
            return Err(self.oom(bytes));
        };
        let lane = st.lane_of(stream)?;
        Self::settle(&mut st, Some(lane));
        if let Some(p) = Self::take(&mut st, class, LaneId::GLOBAL, bytes, alignment) {
            return Ok(p);
        }
        if Self::steal(&mut st, class, lane, stream, needed as u64) {
            if let Some(p) = Self::take(&mut st, class, lane, bytes, alignment) {
                return Ok(p);
            }
        }
        let Some(region) = self.region_in(class, needed) else {
            drop(st);
            return Err(self.oom(bytes));
        };
        if self.shards.len() > 1 {
            let (g, adopted) = self.adopt(st, home, class, needed as u64);
            st = g;
            if adopted {
                if let Some(p) = self.take_any(&mut st, class, stream, bytes, alignment)? {
                    return Ok(p);
                }
            }
        }
        let (g, grown) = self.grow_for(st, home, class, stream, needed, region)?;
        st = g;
        match grown {
            // Another thread may have taken the new region meanwhile: any
            // block that fits will do, else go on to reclaim.
            Ok(()) => {
                if let Some(p) = self.take_any(&mut st, class, stream, bytes, alignment)? {
                    return Ok(p);
                }
            }
            Err(e) if e.is_oom() => {}
            Err(e) => return Err(e),
        }
        drop(st);
        if let Some(p) = self.reclaim(home, class, bytes, alignment)? {
            return Ok(p);
        }
        // A region the upstream refuses to take back stays free in the pool;
        // growing may still succeed, so its error is not the answer here.
        let _ = self.release_to(0);
        st = self.shards.lock(home);
        // Retry with the exact size first when the tiered region was larger.
        for size in [region, needed.next_multiple_of(256)] {
            let (g, grown) = self.grow_for(st, home, class, stream, needed, size)?;
            st = g;
            match grown {
                Ok(()) => {
                    if let Some(p) = self.take_any(&mut st, class, stream, bytes, alignment)? {
                        return Ok(p);
                    }
                }
                Err(e) if e.is_oom() => continue,
                Err(e) => return Err(e),
            }
        }
        drop(st);
        Err(self.oom(bytes))
    }

    /// Grows heap `class` of shard `home` for a request of `needed` bytes
    /// (padding included) on `stream`: its expandable range where there is
    /// one to grow ([`PoolConfig::expandable`]), else a region of `region`
    /// bytes. The guard comes back re-taken.
    fn grow_for<'a>(
        &'a self,
        mut st: Guard<'a, Shard>,
        home: usize,
        class: usize,
        stream: &Stream,
        needed: usize,
        region: usize,
    ) -> Result<(Guard<'a, Shard>, Result<()>)> {
        if self.config.expandable {
            let lane = st.lane_of(stream)?;
            let (g, grown) = self.grow_expanding(st, home, class, lane, needed);
            st = g;
            if let Some(grown) = grown {
                return Ok((st, grown));
            }
        }
        Ok(self.grow(st, home, class, region))
    }

    /// Reclaim: waits for every stream's frees in every shard (while a
    /// capture is counted, takes only those a query finds done: see
    /// `stream_order::streams::may_wait`), then takes a free block of heap
    /// `class`, else of the other heap (segregation
    /// yields to memory pressure: a pool of fixed size, initial = maximum,
    /// serves every size from its one region), from shard `home` first. A
    /// block of another shard stays that shard's.
    fn reclaim(
        &self,
        home: usize,
        class: usize,
        bytes: usize,
        alignment: usize,
    ) -> Result<Option<DevicePtr>> {
        let n = self.shards.len();
        for i in 0..n {
            let mut st = self.shards.lock(i);
            if may_wait() {
                Self::settle_blocking(&mut st)?;
            } else {
                Self::settle(&mut st, None);
            }
        }
        for c in [class, 1 - class] {
            for i in (0..n).map(|k| (home + k) % n) {
                let mut st = self.shards.lock(i);
                if let Some(p) = Self::take(&mut st, c, LaneId::GLOBAL, bytes, alignment) {
                    return Ok(Some(p));
                }
            }
        }
        Ok(None)
    }

    /// After a growth or adoption: a block from the global lane of `class`,
    /// or from the stream's own lane (the lock was released, so the lane is
    /// looked up again).
    fn take_any(
        &self,
        st: &mut Shard,
        class: usize,
        stream: &Stream,
        bytes: usize,
        alignment: usize,
    ) -> Result<Option<DevicePtr>> {
        if self.config.expandable {
            // A range grown past the end of a block free in the stream's
            // lane: the growth (global) and that block merge once refiled
            // in the lane, and the block is taken there.
            let lane = st.lane_of(stream)?;
            if let Some(p) = Self::take_absorbing(st, class, lane, bytes, alignment) {
                return Ok(Some(p));
            }
        }
        if let Some(p) = Self::take(st, class, LaneId::GLOBAL, bytes, alignment) {
            return Ok(Some(p));
        }
        let lane = st.lane_of(stream)?;
        Ok(Self::take(st, class, lane, bytes, alignment))
    }

    /// A block from the global lane of `class` for the stream of `lane`, its
    /// own lane having missed: the global lane's blocks are first refiled in
    /// `lane`, merging with the stream's free blocks beside them, and the
    /// block is taken there. Global blocks are safe for every stream, so
    /// handing them to one only narrows who may use them (another stream
    /// gets them back by settling or stealing). Without this, a stream's
    /// freed blocks and the untouched rest of their regions stay apart
    /// (one in the stream's lane, one in the global lane), and sizes that
    /// change from one iteration to the next grow new regions beside free
    /// space that would have fitted (see the module documentation).
    #[inline]
    fn take_absorbing(
        st: &mut Shard,
        class: usize,
        lane: LaneId,
        bytes: usize,
        alignment: usize,
    ) -> Option<DevicePtr> {
        if st.heaps[class].absorb_global(lane) {
            Self::take(st, class, lane, bytes, alignment)
        } else {
            Self::take(st, class, LaneId::GLOBAL, bytes, alignment)
        }
    }
}

/// A count given to [`LentLock`]'s calls, applied in the cell of the shard
/// whose lock is held (see [`PoolResource::apply_count`]).
type Count<'a> = Option<CallCount<'a>>;

impl<U: MemoryResource> PoolResource<U> {
    /// Applies `count` in shard `home`'s cell, holding `st` (its lock).
    #[inline(always)]
    fn count_holding(&self, home: usize, st: Guard<'_, Shard>, count: Count<'_>) {
        if let Some(count) = count {
            count.apply(home);
        }
        drop(st);
    }

    /// Applies `count` in shard `home`'s cell, taking its lock (the call
    /// holds no lock of the pool).
    fn apply_count(&self, home: usize, count: Count<'_>) {
        if let Some(count) = count {
            let _g = self.shards.lock(home);
            count.apply(home);
        }
    }

    /// An allocation, counted (`count`, see [`LentLock`]) or not. Inlined
    /// into both entry points, so that each is one function: the counted
    /// one is the C ABI's path.
    #[inline(always)]
    fn serve(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        count: Count<'_>,
    ) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, POOL_MAX_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        let class = self.class_of(bytes);
        let (home, mut st) = self.shards.lock_home();
        let lane = st.lane_of(stream)?;
        if let Some(p) = Self::take(&mut st, class, lane, bytes, alignment) {
            self.count_holding(home, st, count);
            return Ok(p);
        }
        if let Some(p) = Self::take_absorbing(&mut st, class, lane, bytes, alignment) {
            self.count_holding(home, st, count);
            return Ok(p);
        }
        let p = self.allocate_slow(st, home, class, stream, bytes, alignment)?;
        self.apply_count(home, count);
        Ok(p)
    }

    /// A free, counted (`count`) or not (inlined as [`Self::serve`] is).
    #[inline(always)]
    fn free(&self, ptr: DevicePtr, bytes: usize, stream: &Stream, count: Count<'_>) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        if self.parks && capturing(stream) {
            return self.park(ptr, bytes, count);
        }
        // The size names the heap; a wrong size costs one more lookup (the
        // heaps' regions are disjoint, so the other heap's miss is cheap).
        // The heap checks the size against the block it finds (its 256-byte
        // granules): a wrong size is refused and frees nothing. A parked
        // block is used in its heap: it is refused first.
        let class = self.class_of(bytes);
        let (home, mut st) = self.shards.lock_home();
        st.parked.refuse(ptr)?;
        let lane = st.lane_of(stream)?;
        match st.heaps[class].free_sized(ptr.0, lane, bytes as u64) {
            Ok(_) => {}
            Err(HeapError::UnknownAddress(_)) => {
                match Self::free_elsewhere(&mut st, class, ptr, bytes, lane) {
                    Err(HeapError::UnknownAddress(_)) => {
                        drop(st);
                        return self.free_in_owner(home, class, ptr, bytes, stream, count);
                    }
                    r => r.map_err(|e| e.into_invalid_free(ptr.0))?,
                }
            }
            Err(e) => return Err(e.into_invalid_free(ptr.0)),
        }
        self.count_holding(home, st, count);
        Ok(())
    }
}

/// Every shard's lock: a count is applied in the cell of the shard whose
/// lock the call holds (shard 0's until the threads spread), so threads on
/// different shards count apart; reading the counts takes every shard.
/// The counted calls inline into a caller that knows the pool's type (the C
/// ABI's stack over `pool`): one function from `gpumem_malloc` to the heap.
impl<U: MemoryResource> LentLock for PoolResource<U> {
    #[inline]
    fn allocate_counted(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        count: CallCount<'_>,
    ) -> Result<DevicePtr> {
        self.serve(bytes, alignment, stream, Some(count))
    }

    #[inline]
    fn deallocate_counted(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        count: CallCount<'_>,
    ) -> Result<()> {
        crate::error::check_alignment(alignment)?;
        self.free(ptr, bytes, stream, Some(count))
    }

    fn cells(&self) -> usize {
        self.shards.len()
    }

    fn locked(&self, f: &mut dyn FnMut()) {
        let _all = self.shards.lock_all();
        f();
    }
}

impl<U: MemoryResource> MemoryResource for PoolResource<U> {
    #[inline]
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        self.serve(bytes, alignment, stream, None)
    }

    #[inline]
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        crate::error::check_alignment(alignment)?;
        self.free(ptr, bytes, stream, None)
    }

    /// Every shard's lock (see [`LentLock`]'s implementation).
    #[inline]
    fn lent_lock(&self) -> Option<&dyn LentLock> {
        Some(self)
    }

    fn device(&self) -> &Device {
        self.upstream.device()
    }

    fn properties(&self) -> Properties {
        self.upstream.properties()
    }
}

/// The pool's reserve is its regions. [`Pool::trim`] gives back entirely
/// free regions whose blocks are known safe (streams found idle), largest
/// first; [`Pool::release`] waits for every stream with free blocks first.
/// [`Pool::reset_peak`] restarts the peaks of reserved and live bytes.
impl<U: MemoryResource> Pool for PoolResource<U> {
    fn reserved_bytes(&self) -> usize {
        self.shards.global().regions.bytes()
    }

    fn peak_reserved_bytes(&self) -> usize {
        self.shards.global().peak_reserved
    }

    fn reset_peak(&self) {
        self.each_shard(|_, sh| sh.peak_live = sh.live());
        let mut g = self.shards.global();
        g.peak_reserved = g.regions.bytes();
    }

    fn trim(&self, to: usize) -> Result<usize> {
        self.release_to(to)
    }

    /// A stream that cannot be waited for (a failed synchronize, and the
    /// device's in its place) keeps the blocks it freed, which its work may
    /// still use, and so the regions under them; everything else goes back
    /// as a trim would give it (streams waited for, or found idle), in
    /// every shard, and the first error is returned.
    fn release(&self) -> Result<usize> {
        let mut first_err = None;
        for i in 0..self.shards.len() {
            if let Err(e) = Self::settle_blocking(&mut self.shards.lock(i)) {
                first_err.get_or_insert(e);
            }
        }
        let released = self.release_to(0);
        match first_err {
            Some(e) => Err(e),
            None => released,
        }
    }
}

impl<U: MemoryResource> PoolResource<U> {
    /// Frees `ptr` in whichever heap other than `tried` knows it (a block of
    /// that heap freed with a size of the other is refused there).
    #[cold]
    fn free_elsewhere(
        st: &mut Shard,
        tried: usize,
        ptr: DevicePtr,
        bytes: usize,
        lane: LaneId,
    ) -> std::result::Result<(), HeapError> {
        let mut err = HeapError::UnknownAddress(ptr.0);
        for (c, h) in st.heaps.iter_mut().enumerate() {
            if c == tried {
                continue;
            }
            match h.free_sized(ptr.0, lane, bytes as u64) {
                Ok(_) => return Ok(()),
                Err(HeapError::UnknownAddress(_)) => {}
                Err(e) => err = e,
            }
        }
        Err(err)
    }

    /// Frees `ptr`, unknown to the calling thread's shard `home`, in the
    /// shard owning its region, into `stream`'s lane there.
    #[cold]
    #[inline(never)]
    fn free_in_owner(
        &self,
        home: usize,
        class: usize,
        ptr: DevicePtr,
        bytes: usize,
        stream: &Stream,
        count: Count<'_>,
    ) -> Result<()> {
        let Some(owner) = self.shards.owner_other_than(ptr.0, home) else {
            return Err(HeapError::UnknownAddress(ptr.0).into_invalid_free(ptr.0));
        };
        let mut st = self.shards.lock(owner);
        st.parked.refuse(ptr)?;
        let lane = st.lane_of(stream)?;
        match st.heaps[class].free_sized(ptr.0, lane, bytes as u64) {
            Ok(_) => {}
            Err(HeapError::UnknownAddress(_)) => {
                Self::free_elsewhere(&mut st, class, ptr, bytes, lane)
                    .map_err(|e| e.into_invalid_free(ptr.0))?;
            }
            Err(e) => return Err(e.into_invalid_free(ptr.0)),
        }
        // In the owner's cell, where the allocation counted: each cell's
        // live count stays its shard's, so the peaks summed stay close.
        self.count_holding(owner, st, count);
        Ok(())
    }
}

impl<U: MemoryResource> PoolResource<U> {
    /// A free of `ptr` as `bytes` on a capturing stream: checked as any free
    /// is (in the calling thread's shard `home`, else in the shard owning
    /// its region), then parked there instead of freed.
    #[cold]
    #[inline(never)]
    fn park(&self, ptr: DevicePtr, bytes: usize, count: Count<'_>) -> Result<()> {
        let class = self.class_of(bytes);
        let (home, mut st) = self.shards.lock_home();
        let mut at = home;
        let mut parked = Self::park_in(&mut st, class, ptr, bytes);
        if let Err(HeapError::UnknownAddress(_)) = parked {
            if let Some(owner) = self.shards.owner_other_than(ptr.0, home) {
                drop(st);
                st = self.shards.lock(owner);
                at = owner;
                parked = Self::park_in(&mut st, class, ptr, bytes);
            }
        }
        parked.map_err(|e| e.into_invalid_free(ptr.0))?;
        self.count_holding(at, st, count);
        Ok(())
    }

    /// Parks `ptr` in shard `st` when a free of `bytes` would free it there:
    /// the heap `class` names first, then the other, as [`Self::free`]
    /// looks.
    fn park_in(
        st: &mut Shard,
        class: usize,
        ptr: DevicePtr,
        bytes: usize,
    ) -> std::result::Result<(), HeapError> {
        if st.parked.contains(ptr) {
            return Err(HeapError::DoubleFree(ptr.0));
        }
        for c in [class, 1 - class] {
            match st.heaps[c].check_free_sized(ptr.0, bytes as u64) {
                Ok(size) => {
                    st.parked.insert(ptr, size as usize);
                    return Ok(());
                }
                Err(HeapError::UnknownAddress(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Err(HeapError::UnknownAddress(ptr.0))
    }
}

impl<U: MemoryResource> Drop for PoolResource<U> {
    fn drop(&mut self) {
        if crate::exit::process_is_exiting() {
            // The driver may already be gone: leak rather than call into it.
            return;
        }
        let device = self.upstream.device().clone();
        let (shards, g) = self.shards.get_mut();
        // Work still using pool memory must finish before the regions go back.
        for sh in shards {
            sh.lanes.synchronize_all(&device);
        }
        for (base, bytes) in g.regions.iter() {
            crate::exit::give_back(
                || format!("PoolResource region {base:#x}"),
                || self.upstream.deallocate_sync(DevicePtr(base), bytes, 256),
            );
        }
        g.regions = RegionOwners::default();
    }
}
