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
//! | `cuda` (`cuMemAlloc`) | live bytes (nothing is cached) | counted at the driver | nothing to give back |
//!
//! "Counted at the upstream" means a [`StatisticsAdaptor`] sits between the
//! pool and `cuMemAlloc`: it sees every byte the pool takes and gives back,
//! costs one short mutex per upstream call (growth and release only, never
//! the pool's fast path) and its peak can be reset, which the pools' own
//! high-water marks cannot.

use gpumem::adaptor::{LimitingAdaptor, StatisticsAdaptor};
use gpumem::pool::{
    BinningResource, CachingPool, CachingPoolConfig, PoolConfig, PoolResource,
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
        ResourceKind::Arena | ResourceKind::Async => {
            return Err(gpumem::Error::unsupported(format!(
                "resource={} (not in this build of gpumem yet)",
                conf.resource
            )))
        }
    })
}
