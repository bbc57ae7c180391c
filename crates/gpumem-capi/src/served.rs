//! The resource that serves one device, and what the C ABI asks of it besides
//! allocating: its reserve and giving cached memory back (the [`Pool`]
//! trait), what it holds now (segments, live blocks, the largest free block:
//! the library's [`Introspect`], for snapshots), and what is the C ABI's own:
//! the driver calls behind the reserve and a limit on what it holds from the
//! driver.
//!
//! [`Served`] is that interface. Each resource answers from the numbers it
//! keeps itself:
//!
//! | resource | reserved (peak) | segments | live blocks | largest free block | limit (memory fraction) | empty_cache |
//! |---|---|---|---|---|---|---|
//! | `pool` | the pool's regions | its `cuMemAlloc` regions | the pool's used blocks (rounded sizes) | largest free block, any lane | at the upstream | `release` |
//! | `caching` | its chunks and large blocks | its `cuMemAlloc` chunks and large blocks | class blocks with the bytes asked for | largest class with a free block | at the upstream | `release` |
//! | `binning` | the inner pool's regions | the inner pool's regions | the bins' blocks and the direct allocations | the larger of the bins' and the pool's | at the pool's upstream | bins' `release`, then the pool's |
//! | `arena` | its one region, taken whole up front | that region | tracked here (the arena cannot list them) | the arena's largest free run | at the upstream (the region is sized within it) | stream arenas' cached superblocks go back to the global arena, the device synchronized; the device gets nothing back |
//! | `async` | the pool's `ReservedMemCurrent` (`ReservedMemHigh`) | unknown: one per live block | the pool's allocations, as asked for | reserved minus used (an upper bound: the pool does not say in what pieces) | on the bytes live in the pool, and the release threshold lowered to it | synchronize the device, then `cuMemPoolTrimTo(0)` |
//! | `vpool` | physical bytes held, mapped or cached (the pool's peak) | runs of mapped pages | the pool's used blocks (rounded sizes) | physical bytes under no live block | the pool's maximum physical | `release`: every page not under a live block goes back |
//! | `cuda` | live `cuMemAlloc` bytes (at 256-byte granularity) | one per allocation | the same | 0 (nothing cached) | at the upstream | nothing to give back |
//!
//! "At the upstream" means the resource takes memory through [`Upstream`]: a
//! [`LimitingAdaptor`] whose limit can change at run time (the memory
//! fraction) over `cuMemAlloc`, under a [`StatisticsAdaptor`] that counts
//! what the resource holds (segments, bytes, driver calls; resettable
//! peaks) for [`Served::driver_stats`]. Both touch only growth and release,
//! never a pool's fast path.
//!
//! CUDA's pool (`async`) cannot list its memory nor say how often it asked
//! the driver for more: its segments are reported one per live block (the
//! stack's own count), its reserve totals and driver calls as 0, and its
//! limit applies to the bytes live in it (what PyTorch's `cudaMallocAsync`
//! backend enforces too) with the release threshold lowered to the limit so
//! the pool keeps no more than that at a synchronization. Counting the live
//! bytes costs one atomic update per allocation and free, next to the
//! driver's microsecond.

use gpumem::adaptor::{
    ClassStats, LimitingAdaptor, LoggingAdaptor, Stat, StatisticsAdaptor, SMALL_SEGMENT_MAX,
};
use gpumem::async_pool::{AsyncResource, AsyncResourceConfig};
use gpumem::driver::RawStream;
use gpumem::pool::{
    ArenaConfig, ArenaResource, BinningConfig, BinningResource, CachingPool, CachingPoolConfig,
    Pool, PoolConfig, PoolResource, VirtualPool, VirtualPoolConfig,
};
pub use gpumem::resource::Introspect;
use gpumem::resource::{DeviceResource, HandedOut, LiveBlock, MemoryResource, Properties, Segment};
use gpumem::{Device, DevicePtr, Result, Stream};

use crate::conf::{Conf, ResourceKind};
use crate::stack::Resource;

/// `cuMemAlloc` under a limit that can change at run time, with what passes
/// counted: the upstream of every resource here but `vpool` and `async`.
pub type Upstream = StatisticsAdaptor<LimitingAdaptor<DeviceResource>>;

/// What a resource holds from the driver, as PyTorch's statistics count it.
/// Totals (`allocated`, `freed`, calls) only grow; the C ABI subtracts what
/// they were at its last reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Segments held (regions, chunks, physical allocations); `None` when
    /// the resource cannot tell: count one per live block.
    pub segments: Option<Stat>,
    /// Bytes held from the driver.
    pub reserved: Stat,
    /// Driver allocation calls (`cuMemAlloc`, `cuMemCreate`).
    pub device_allocs: u64,
    /// Driver free calls (`cuMemFree`, `cuMemRelease`).
    pub device_frees: u64,
    /// `segments` and `reserved` split by size class, small then large
    /// (PyTorch's `small_pool` and `large_pool`): a segment of at most
    /// [`SMALL_SEGMENT_MAX`] bytes is small, as PyTorch's small pool's
    /// segments are. `None` when the resource cannot tell: all count as
    /// large.
    pub classes: Option<[ClassDriverStats; 2]>,
}

/// The segments and reserve of one size class ([`DriverStats::classes`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassDriverStats {
    /// Segments of the class held.
    pub segments: Stat,
    /// Their bytes.
    pub reserved: Stat,
}

/// What the C ABI needs from the resource serving a device, besides
/// allocating and freeing and its [`Pool`] answers: its reserve is what it
/// holds from the driver, and [`Pool::release`] is `empty_cache`.
pub trait Served: Pool + Introspect {
    /// The resource's name in `GPUMEM_CONF`.
    fn kind(&self) -> ResourceKind;
    /// Segments, reserve and driver calls (see the module documentation).
    fn driver_stats(&self) -> DriverStats;
    /// Sets the peaks of [`Served::driver_stats`] to their current values
    /// ([`Pool::reset_peak`] restarts the reserve's own peak).
    fn reset_driver_peaks(&self);
    /// Whether the segment at `address` (one of [`Introspect::segments`]) is a
    /// range of virtual memory mapped in pieces that grows and shrinks in
    /// place (PyTorch's expandable segments, which CUDA IPC cannot share).
    fn is_expandable(&self, address: DevicePtr) -> bool {
        let _ = address;
        false
    }
    /// Caps what the resource may hold from the driver (`None`: no cap);
    /// requests that need more fail as out of memory. `conf` is the
    /// configuration it serves (`async` lowers the release threshold it
    /// asks for to the cap).
    fn set_limit(&self, limit: Option<usize>, conf: &Conf);
    /// The [`VirtualPool`] the resource is, for its regions (sleep and
    /// wake); `None` for the other resources.
    fn virtual_pool(&self) -> Option<&VirtualPool> {
        None
    }
}

/// The other devices of `device`'s driver that can reach its memory.
fn peers_of(device: &Device) -> Result<Vec<u32>> {
    let driver = device.driver();
    let me = device.ordinal();
    let mut peers = Vec::new();
    for d in (0..driver.device_count()?).filter(|&d| d != me) {
        if driver.can_access_peer(d, me)? {
            peers.push(d);
        }
    }
    Ok(peers)
}

fn upstream_stats(u: &Upstream) -> DriverStats {
    let s = u.stats();
    let class = |c: ClassStats| ClassDriverStats {
        segments: c.active,
        reserved: c.allocated_bytes,
    };
    DriverStats {
        segments: Some(s.active),
        reserved: s.allocated_bytes,
        device_allocs: s.active.total,
        device_frees: s.active.freed,
        classes: Some([class(s.small), class(s.large)]),
    }
}

fn set_upstream_limit(u: &Upstream, limit: Option<usize>) {
    u.upstream().set_limit(limit.unwrap_or(usize::MAX));
}

/// A resource that takes its memory through an [`Upstream`].
trait OverUpstream {
    fn up(&self) -> &Upstream;
}

impl OverUpstream for PoolResource<Upstream> {
    fn up(&self) -> &Upstream {
        self.upstream()
    }
}

impl OverUpstream for CachingPool<Upstream> {
    fn up(&self) -> &Upstream {
        self.upstream()
    }
}

impl OverUpstream for Tracked<ArenaResource<Upstream>> {
    fn up(&self) -> &Upstream {
        self.inner.upstream()
    }
}

/// The [`Served`] methods every resource over an [`Upstream`] answers from
/// it: driver numbers and their peaks, expandable segments and the limit.
macro_rules! over_upstream {
    () => {
        fn reset_driver_peaks(&self) {
            self.up().reset_peak();
        }
        fn driver_stats(&self) -> DriverStats {
            upstream_stats(self.up())
        }
        fn is_expandable(&self, address: DevicePtr) -> bool {
            self.up().upstream().upstream().is_growable(address)
        }
        fn set_limit(&self, limit: Option<usize>, _: &Conf) {
            set_upstream_limit(self.up(), limit)
        }
    };
}

impl Served for PoolResource<Upstream> {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Pool
    }
    over_upstream!();
}

impl Served for CachingPool<Upstream> {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Caching
    }
    over_upstream!();
}

/// `MemoryResource` for a wrapper, answered by the resource in its field 0.
macro_rules! forward_resource {
    ($t:ty) => {
        impl MemoryResource for $t {
            #[inline]
            fn allocate(
                &self,
                bytes: usize,
                alignment: usize,
                stream: &Stream,
            ) -> Result<DevicePtr> {
                self.0.allocate(bytes, alignment, stream)
            }
            #[inline]
            fn deallocate(
                &self,
                ptr: DevicePtr,
                bytes: usize,
                alignment: usize,
                stream: &Stream,
            ) -> Result<()> {
                self.0.deallocate(ptr, bytes, alignment, stream)
            }
            fn device(&self) -> &Device {
                self.0.device()
            }
            fn properties(&self) -> Properties {
                self.0.properties()
            }
            fn allocate_sync(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
                self.0.allocate_sync(bytes, alignment)
            }
            fn deallocate_sync(
                &self,
                ptr: DevicePtr,
                bytes: usize,
                alignment: usize,
            ) -> Result<()> {
                self.0.deallocate_sync(ptr, bytes, alignment)
            }
        }
    };
}

/// Bins over a pool: the bins hold their chunks from the inner pool, so what
/// the driver has given is the pool's reserve.
pub struct Binned(BinningResource<PoolResource<Upstream>>);

forward_resource!(Binned);

impl Pool for Binned {
    fn reserved_bytes(&self) -> usize {
        self.0.upstream().reserved_bytes()
    }
    fn peak_reserved_bytes(&self) -> usize {
        self.0.upstream().peak_reserved_bytes()
    }
    fn reset_peak(&self) {
        self.0.upstream().reset_peak()
    }
    fn trim(&self, to: usize) -> Result<usize> {
        // Bins give their free chunks to the pool, the pool its free regions
        // to the driver: only the second is memory the device gets back.
        let bins = self.0.trim(0);
        let pool = self.0.upstream().trim(to);
        bins.and(pool)
    }
    fn release(&self) -> Result<usize> {
        let bins = self.0.release();
        let pool = self.0.upstream().release();
        bins.and(pool)
    }
}

impl OverUpstream for Binned {
    fn up(&self) -> &Upstream {
        self.0.upstream().upstream()
    }
}

impl Served for Binned {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Binning
    }
    over_upstream!();
}

/// The library's answers for bins over a pool.
impl Introspect for Binned {
    fn segments(&self) -> Vec<Segment> {
        self.0.segments()
    }
    fn live_blocks(&self) -> Vec<(LiveBlock, RawStream)> {
        Introspect::live_blocks(&self.0)
    }
    fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        Introspect::live_block_size(&self.0, ptr)
    }
    fn largest_free_block(&self) -> usize {
        Introspect::largest_free_block(&self.0)
    }
}

/// A resource whose live blocks are recorded here because it cannot list
/// them itself (the arena): pointer → (bytes asked for, raw stream). One
/// sharded-table insert and remove per allocation and free.
pub struct Tracked<R> {
    inner: R,
    live: HandedOut<u64>,
}

impl<R: MemoryResource> Tracked<R> {
    /// Tracks what `inner` hands out from now on.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            live: HandedOut::default(),
        }
    }

    /// The tracked resource.
    pub fn inner(&self) -> &R {
        &self.inner
    }
}

impl<R: MemoryResource> MemoryResource for Tracked<R> {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        let p = self.inner.allocate(bytes, alignment, stream)?;
        if !p.is_null() {
            self.live.insert(p, bytes, stream.raw());
        }
        Ok(p)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        // The inner resource judges the free (the arena accepts any size in
        // the block's granules); the record goes only once it is accepted.
        self.inner.deallocate(ptr, bytes, alignment, stream)?;
        let _ = self.live.take_any(ptr);
        Ok(())
    }

    fn device(&self) -> &Device {
        self.inner.device()
    }

    fn properties(&self) -> Properties {
        self.inner.properties()
    }
}

impl<R: Pool> Pool for Tracked<R> {
    fn reserved_bytes(&self) -> usize {
        self.inner.reserved_bytes()
    }
    fn peak_reserved_bytes(&self) -> usize {
        self.inner.peak_reserved_bytes()
    }
    fn reset_peak(&self) {
        self.inner.reset_peak()
    }
    fn trim(&self, to: usize) -> Result<usize> {
        self.inner.trim(to)
    }
    fn release(&self) -> Result<usize> {
        self.inner.release()
    }
}

impl Served for Tracked<ArenaResource<Upstream>> {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Arena
    }
    over_upstream!();
}

/// The arena lists no blocks: they are tracked here, with their streams;
/// its segment is the one region its upstream holds.
impl Introspect for Tracked<ArenaResource<Upstream>> {
    fn segments(&self) -> Vec<Segment> {
        self.up().segments()
    }
    fn largest_free_block(&self) -> usize {
        self.inner.stats().largest_free
    }
    fn live_blocks(&self) -> Vec<(LiveBlock, u64)> {
        self.live
            .entries()
            .into_iter()
            .map(|(address, bytes, stream)| {
                let size = self.inner.block_size_for(bytes).unwrap_or(bytes);
                let block = LiveBlock {
                    address,
                    size,
                    requested: Some(bytes),
                };
                (block, stream)
            })
            .collect()
    }
    fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        let bytes = self.live.bytes_of(ptr)?;
        Some(self.inner.block_size_for(bytes).unwrap_or(bytes))
    }
}

/// CUDA's pool with a cap on the bytes live in it.
impl Served for LimitingAdaptor<AsyncResource> {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Async
    }
    fn reset_driver_peaks(&self) {
        // The reserve is all the driver says: `Pool::reset_peak` restarts it.
    }
    fn driver_stats(&self) -> DriverStats {
        DriverStats {
            segments: None,
            reserved: Stat {
                current: self.reserved_bytes() as i64,
                peak: self.peak_reserved_bytes() as i64,
                total: 0,
                freed: 0,
            },
            device_allocs: 0,
            device_frees: 0,
            classes: None,
        }
    }
    fn set_limit(&self, limit: Option<usize>, conf: &Conf) {
        LimitingAdaptor::set_limit(self, limit.unwrap_or(usize::MAX));
        let wanted = conf.release_threshold;
        let threshold = limit.map_or(wanted, |l| wanted.min(l as u64));
        if let Err(e) = self.upstream().set_release_threshold(threshold) {
            log::error!("async: cannot set the release threshold to {threshold}: {e}");
        }
    }
}

impl Served for VirtualPool {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Virtual
    }
    fn reset_driver_peaks(&self) {
        // The pool's own counters: `Pool::reset_peak` restarts them all.
    }
    fn driver_stats(&self) -> DriverStats {
        let s = self.stats();
        let page = s.page_size as u64;
        DriverStats {
            segments: Some(Stat {
                current: s.chunks as i64,
                peak: s.peak_chunks as i64,
                total: s.chunks_created,
                freed: s.chunks_released,
            }),
            reserved: Stat {
                current: s.reserved as i64,
                peak: s.peak_reserved as i64,
                total: s.pages_created * page,
                freed: s.pages_released * page,
            },
            device_allocs: s.chunks_created,
            device_frees: s.chunks_released,
            classes: Some(s.chunk_classes.map(|c| ClassDriverStats {
                segments: Stat {
                    current: c.current as i64,
                    peak: c.peak as i64,
                    total: c.created,
                    freed: c.released,
                },
                reserved: Stat {
                    current: c.bytes as i64,
                    peak: c.peak_bytes as i64,
                    total: c.bytes_created,
                    freed: c.bytes_released,
                },
            })),
        }
    }
    /// Its segments are runs of pages mapped into its virtual ranges.
    fn is_expandable(&self, _: DevicePtr) -> bool {
        true
    }
    fn set_limit(&self, limit: Option<usize>, _: &Conf) {
        self.set_max_reserved(limit);
    }
    fn virtual_pool(&self) -> Option<&VirtualPool> {
        Some(self)
    }
}

/// `cuMemAlloc` for every request: it caches nothing, so what it holds from
/// the driver is what it hands out (at 256-byte granularity).
pub struct Uncached(Upstream);

forward_resource!(Uncached);

impl Pool for Uncached {
    fn reserved_bytes(&self) -> usize {
        self.0.stats().allocated_bytes.current.max(0) as usize
    }
    fn peak_reserved_bytes(&self) -> usize {
        self.0.stats().allocated_bytes.peak.max(0) as usize
    }
    fn reset_peak(&self) {
        self.0.reset_peak();
    }
    fn trim(&self, _to: usize) -> Result<usize> {
        Ok(0)
    }
    fn release(&self) -> Result<usize> {
        Ok(0)
    }
}

impl OverUpstream for Uncached {
    fn up(&self) -> &Upstream {
        &self.0
    }
}

impl Served for Uncached {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Cuda
    }
    over_upstream!();
}

/// `cuMemAlloc` through the adaptors: the driver resource's answers.
impl Introspect for Uncached {
    fn segments(&self) -> Vec<Segment> {
        self.0.segments()
    }
    fn live_blocks(&self) -> Vec<(LiveBlock, RawStream)> {
        self.0.live_blocks()
    }
    fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        self.0.live_block_size(ptr)
    }
    fn largest_free_block(&self) -> usize {
        self.0.largest_free_block()
    }
}

/// The log writes what the resource below it is asked; everything else is
/// the resource's.
impl Served for LoggingAdaptor<Box<dyn Served>> {
    fn kind(&self) -> ResourceKind {
        self.upstream().kind()
    }
    fn reset_driver_peaks(&self) {
        self.upstream().reset_driver_peaks()
    }
    fn driver_stats(&self) -> DriverStats {
        self.upstream().driver_stats()
    }
    fn is_expandable(&self, address: DevicePtr) -> bool {
        self.upstream().is_expandable(address)
    }
    fn set_limit(&self, limit: Option<usize>, conf: &Conf) {
        self.upstream().set_limit(limit, conf)
    }
    fn virtual_pool(&self) -> Option<&VirtualPool> {
        self.upstream().virtual_pool()
    }
}

/// The most a device may hold from the driver under `conf` when its memory
/// fraction caps it at `cap` bytes (`None`: fraction 1, no cap): `max_size`
/// and the cap, whichever is smaller; `None` for no limit. The `limit` the C
/// ABI passes to [`build`], and the one the `gpumem` command passes with no
/// cap, so that a `GPUMEM_CONF` builds the same resource in both.
pub fn limit(conf: &Conf, cap: Option<usize>) -> Option<usize> {
    match (conf.max_size, cap) {
        (Some(m), Some(c)) => Some(m.min(c)),
        (m, c) => m.or(c),
    }
}

/// Builds the resource `conf` asks for on `device`, holding at most `limit`
/// bytes from the driver (`None`: no cap; see [`Served::set_limit`]). Kinds
/// this build does not have are [`gpumem::Error::Unsupported`]. The log, if
/// any, is the caller's to add. `pool` and `vpool` come back by their types
/// (the C ABI's fast path, see [`crate::stack`]), the others behind `dyn`.
pub fn build(conf: &Conf, device: &Device, limit: Option<usize>) -> Result<Resource> {
    let upstream = || {
        StatisticsAdaptor::new(LimitingAdaptor::new(
            DeviceResource::new(device.clone()),
            limit.unwrap_or(usize::MAX),
        ))
        .with_small_class_max(SMALL_SEGMENT_MAX)
    };
    let mut config = PoolConfig::default();
    config.initial_size = conf.initial_size;
    config.max_reserved = conf.max_size;
    config.shards = conf.shards;
    config.spread = conf.spread;
    config.expandable = conf.expandable;
    config.recycle_pieces = conf.recycle;
    let pool_config = || config;
    let served: Box<dyn Served> = match conf.resource {
        ResourceKind::Pool => {
            return Ok(Resource::Pool(PoolResource::new(
                upstream(),
                pool_config(),
            )?));
        }
        ResourceKind::Caching => {
            let mut config = CachingPoolConfig::default();
            config.max_reserved = conf.max_size;
            Box::new(CachingPool::new(upstream(), config)?)
        }
        ResourceKind::Binning => {
            let pool = PoolResource::new(upstream(), pool_config())?;
            let bins = BinningConfig::fixed_bins(
                conf.min_bin.trailing_zeros(),
                conf.max_bin.trailing_zeros(),
            );
            Box::new(Binned(BinningResource::new(pool, bins)?))
        }
        ResourceKind::Cuda => Box::new(Uncached(upstream())),
        ResourceKind::Arena => {
            // The arena takes its whole size up front: initial_size if given,
            // else max_size, else half the device's free memory (RMM's
            // default); never more than the limit.
            let mut size = Some(conf.initial_size).filter(|&s| s > 0).or(conf.max_size);
            if let Some(limit) = limit {
                let wanted = match size {
                    Some(s) => s,
                    None => device.mem_info()?.free / 2,
                };
                size = Some(wanted.min(limit));
            }
            let mut config = ArenaConfig::default();
            config.max_reserved = size;
            Box::new(Tracked::new(ArenaResource::new(upstream(), config)?))
        }
        ResourceKind::Virtual => {
            let mut config = if conf.nccl_ready {
                VirtualPoolConfig::nccl_ready(peers_of(device)?)
            } else {
                VirtualPoolConfig::default()
            };
            config.max_reserved = limit;
            config.shards = conf.shards;
            config.spread = conf.spread;
            return Ok(Resource::Virtual(VirtualPool::new(device.clone(), config)?));
        }
        ResourceKind::Async => {
            let mut config = AsyncResourceConfig::default();
            config.initial_size = conf.initial_size;
            config.release_threshold = conf.release_threshold;
            // CUDA's maxSize 0 is no limit.
            config.max_reserved = conf.max_size.filter(|&m| m > 0);
            let cuda = AsyncResource::new(device.clone(), config)?;
            let served = LimitingAdaptor::new(cuda, usize::MAX);
            Served::set_limit(&served, limit, conf);
            Box::new(served)
        }
    };
    Ok(Resource::Other(served))
}
