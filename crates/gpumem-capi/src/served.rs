//! The resource that serves one device, and what the C ABI asks of it besides
//! allocating: its reserve, the peak of that reserve, and giving cached memory
//! back.
//!
//! [`Served`] is that small interface. Each resource reports its reserve
//! honestly, from the numbers it keeps itself:
//!
//! | resource | reserved | peak reserved | empty_cache |
//! |---|---|---|---|
//! | `pool` (`PoolResource`) | the pool's `reserved_bytes` | counted at its upstream | `release` |
//! | `caching` (`CachingPool`) | the pool's `reserved_bytes` | counted at its upstream | `release` |
//! | `binning` (`BinningResource` over `PoolResource`) | the inner pool's `reserved_bytes` | counted at the pool's upstream | bins' `release`, then the pool's |
//! | `arena` (`ArenaResource`) | the arena's size, taken whole up front | counted at its upstream | stream arenas' cached superblocks go back to the global arena; the device gets nothing back |
//! | `async` (`AsyncResource`, CUDA's pool) | the pool's `ReservedMemCurrent` | the pool's `ReservedMemHigh` (reset by `reset_peak`) | synchronize the device, then `cuMemPoolTrimTo(0)` |
//! | `vpool` (`VirtualPool`) | physical bytes held (mapped or cached) | the pool's `peak_reserved` (reset by `reset_peak`) | `release`: every page not under a live block goes back |
//! | `cuda` (`cuMemAlloc`) | live bytes (nothing is cached) | counted at the driver | nothing to give back |
//!
//! "Counted at the upstream" means a [`StatisticsAdaptor`] sits between the
//! pool and `cuMemAlloc`: it sees every byte the pool takes and gives back,
//! costs one short mutex per upstream call (growth and release only, never
//! the pool's fast path) and its peak can be reset, which the pools' own
//! high-water marks cannot.

use gpumem::adaptor::{LimitingAdaptor, StatisticsAdaptor};
use gpumem::async_pool::AsyncResource;
use gpumem::pool::{
    ArenaConfig, ArenaResource, BinningResource, CachingPool, CachingPoolConfig, PoolConfig,
    PoolResource, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, Result};

use crate::conf::{Conf, ResourceKind};

/// `cuMemAlloc` with its bytes counted: the upstream of every pool here.
pub type Upstream = StatisticsAdaptor<DeviceResource>;

/// What the C ABI needs from the resource serving a device, besides
/// allocating and freeing.
pub trait Served: MemoryResource {
    /// The resource's name in `GPUMEM_CONF`.
    fn kind(&self) -> ResourceKind;
    /// Bytes held from the driver now.
    fn reserved_bytes(&self) -> usize;
    /// Highest [`Served::reserved_bytes`] since creation or the last
    /// [`Served::reset_peak_reserved`].
    fn peak_reserved_bytes(&self) -> usize;
    /// Sets the peak to the current reserve.
    fn reset_peak_reserved(&self);
    /// Gives cached memory back to the driver (waiting for the streams that
    /// freed it where needed); returns the bytes given back.
    fn empty_cache(&self) -> Result<usize>;
}

fn counted_now(u: &Upstream) -> usize {
    u.stats().allocated_bytes.current.max(0) as usize
}

fn counted_peak(u: &Upstream) -> usize {
    u.stats().allocated_bytes.peak.max(0) as usize
}

impl Served for PoolResource<Upstream> {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Pool
    }
    fn reserved_bytes(&self) -> usize {
        PoolResource::reserved_bytes(self)
    }
    fn peak_reserved_bytes(&self) -> usize {
        counted_peak(self.upstream())
    }
    fn reset_peak_reserved(&self) {
        self.upstream().reset_peak();
    }
    fn empty_cache(&self) -> Result<usize> {
        self.release()
    }
}

impl Served for CachingPool<Upstream> {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Caching
    }
    fn reserved_bytes(&self) -> usize {
        CachingPool::reserved_bytes(self)
    }
    fn peak_reserved_bytes(&self) -> usize {
        counted_peak(self.upstream())
    }
    fn reset_peak_reserved(&self) {
        self.upstream().reset_peak();
    }
    fn empty_cache(&self) -> Result<usize> {
        self.release()
    }
}

impl Served for BinningResource<PoolResource<Upstream>> {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Binning
    }
    fn reserved_bytes(&self) -> usize {
        // The bins hold their chunks from the inner pool; what the driver has
        // given is the pool's reserve.
        PoolResource::reserved_bytes(self.upstream())
    }
    fn peak_reserved_bytes(&self) -> usize {
        counted_peak(self.upstream().upstream())
    }
    fn reset_peak_reserved(&self) {
        self.upstream().upstream().reset_peak();
    }
    fn empty_cache(&self) -> Result<usize> {
        // Bins give their free chunks to the pool, the pool its free regions
        // to the driver: only the second is memory the device gets back.
        let bins = self.release();
        let pool = self.upstream().release();
        bins.and(pool)
    }
}

impl Served for ArenaResource<Upstream> {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Arena
    }
    fn reserved_bytes(&self) -> usize {
        self.reserved()
    }
    fn peak_reserved_bytes(&self) -> usize {
        counted_peak(self.upstream())
    }
    fn reset_peak_reserved(&self) {
        self.upstream().reset_peak();
    }
    fn empty_cache(&self) -> Result<usize> {
        // The arena holds its one region for life: cached superblocks go back
        // to the global arena (so every stream can use them), not the device.
        self.release_cached();
        Ok(0)
    }
}

impl Served for AsyncResource {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Async
    }
    fn reserved_bytes(&self) -> usize {
        self.reserved_current().unwrap_or(0)
    }
    fn peak_reserved_bytes(&self) -> usize {
        self.reserved_high().unwrap_or(0)
    }
    fn reset_peak_reserved(&self) {
        let _ = self.reset_reserved_high();
    }
    fn empty_cache(&self) -> Result<usize> {
        // Frees not yet complete keep their memory in the pool: wait for them
        // (as PyTorch's cudaMallocAsync backend does), then trim.
        let before = self.reserved_current()?;
        self.pool().device().synchronize()?;
        self.trim_to(0)?;
        Ok(before.saturating_sub(self.reserved_current()?))
    }
}

impl Served for VirtualPool {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Virtual
    }
    fn reserved_bytes(&self) -> usize {
        VirtualPool::reserved_bytes(self)
    }
    fn peak_reserved_bytes(&self) -> usize {
        self.peak_reserved_bytes()
    }
    fn reset_peak_reserved(&self) {
        self.reset_peaks();
    }
    fn empty_cache(&self) -> Result<usize> {
        self.release()
    }
}

impl Served for LimitingAdaptor<Upstream> {
    fn kind(&self) -> ResourceKind {
        ResourceKind::Cuda
    }
    fn reserved_bytes(&self) -> usize {
        counted_now(self.upstream())
    }
    fn peak_reserved_bytes(&self) -> usize {
        counted_peak(self.upstream())
    }
    fn reset_peak_reserved(&self) {
        self.upstream().reset_peak();
    }
    fn empty_cache(&self) -> Result<usize> {
        Ok(0)
    }
}

/// Builds the resource `conf` asks for on `device`. Kinds this build does not
/// have are [`gpumem::Error::Unsupported`].
pub fn build(conf: &Conf, device: &Device) -> Result<Box<dyn Served>> {
    let upstream = || StatisticsAdaptor::new(DeviceResource::new(device.clone()));
    let pool_config = || PoolConfig {
        initial_size: conf.initial_size,
        maximum_size: conf.max_size,
        ..PoolConfig::default()
    };
    Ok(match conf.resource {
        ResourceKind::Pool => Box::new(PoolResource::new(upstream(), pool_config())?),
        ResourceKind::Caching => Box::new(CachingPool::with_upstream(
            upstream(),
            CachingPoolConfig {
                max_pool_size: conf.max_size.unwrap_or(usize::MAX),
                ..CachingPoolConfig::default()
            },
        )?),
        ResourceKind::Binning => {
            let pool = PoolResource::new(upstream(), pool_config())?;
            Box::new(BinningResource::with_fixed_bins(
                pool,
                conf.min_bin.trailing_zeros(),
                conf.max_bin.trailing_zeros(),
            )?)
        }
        ResourceKind::Cuda => Box::new(LimitingAdaptor::new(
            upstream(),
            conf.max_size.unwrap_or(usize::MAX),
        )),
        ResourceKind::Arena => {
            // The arena takes its whole size up front: initial_size if given,
            // else max_size, else half the device's free memory (RMM's default).
            let size = Some(conf.initial_size).filter(|&s| s > 0).or(conf.max_size);
            let config = ArenaConfig {
                arena_size: size,
                ..ArenaConfig::default()
            };
            Box::new(ArenaResource::with_config(upstream(), config)?)
        }
        ResourceKind::Virtual => Box::new(VirtualPool::new(
            device.clone(),
            VirtualPoolConfig {
                maximum_physical: conf.max_size,
                ..VirtualPoolConfig::default()
            },
        )?),
        ResourceKind::Async => Box::new(
            AsyncResource::builder(device.clone())
                .initial_size(conf.initial_size)
                .release_threshold(conf.release_threshold)
                .max_size(conf.max_size.unwrap_or(0))
                .build()?,
        ),
    })
}
