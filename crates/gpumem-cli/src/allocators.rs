//! The allocators the command can measure, by name.
//!
//! [`ALLOCATORS`] is a table of name → constructor. Each constructor builds a
//! fresh allocator over a device together with the [`Pool`] whose reserve is
//! what the allocator holds from the driver: the allocator itself for the
//! pools, the pool under the bins for `binning`, and for the plain `cuda`
//! resource, which caches nothing, its live bytes. Adding an allocator is one
//! entry in the table.

use std::sync::Arc;

use anyhow::{bail, Result};
use gpumem::adaptor::StatisticsAdaptor;
use gpumem::async_pool::AsyncResource;
use gpumem::pool::{
    ArenaResource, BinningConfig, BinningResource, CachingPool, Pool, PoolConfig, PoolResource,
    Spread, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::{DeviceResource, MemoryResource, Properties, SharedResource};
use gpumem::{Device, DevicePtr, Stream};

/// A named way to build an allocator over a device.
pub struct AllocatorSpec {
    /// The name used with `--alloc`.
    pub name: &'static str,
    /// One line on what it is.
    pub about: &'static str,
    /// Why its reserve does not follow the live bytes, when by design: printed
    /// under tables, whose res/live it marks with `*`.
    pub reserve_note: Option<&'static str>,
    /// Builds a fresh instance over the device.
    pub build: fn(&Device) -> gpumem::Result<Allocator>,
}

/// Every allocator the command knows, in the order tables list them.
pub const ALLOCATORS: &[AllocatorSpec] = &[
    AllocatorSpec {
        name: "cuda",
        about: "cuMemAlloc/cuMemFree for every request (DeviceResource)",
        reserve_note: None,
        build: |d| Ok(Allocator::pool(Arc::new(Uncached::new(d)))),
    },
    AllocatorSpec {
        name: "cuda-async",
        about: "AsyncResource: cuMemAllocAsync on the device's default pool, release threshold max",
        reserve_note: None,
        build: |d| {
            let r = AsyncResource::default_pool(d.clone())?;
            r.set_release_threshold(u64::MAX)?;
            Ok(Allocator::pool(Arc::new(r)))
        },
    },
    AllocatorSpec {
        name: "pool",
        about: "PoolResource: coalescing best fit over TLSF lanes, per-stream lanes; threads spread over one lock shard per CPU once they contend",
        reserve_note: None,
        build: |d| {
            let pool = PoolResource::with_defaults(DeviceResource::new(d.clone()))?;
            Ok(Allocator::pool(Arc::new(pool)))
        },
    },
    AllocatorSpec {
        name: "pool-sharded",
        about: "PoolResource with threads on their own lock shards from the start (PoolConfig::spread = Always)",
        reserve_note: None,
        build: |d| {
            let mut config = PoolConfig::default();
            config.spread = Spread::Always;
            let pool = PoolResource::new(DeviceResource::new(d.clone()), config)?;
            Ok(Allocator::pool(Arc::new(pool)))
        },
    },
    AllocatorSpec {
        name: "pool-expandable",
        about: "PoolResource whose heaps each grow one VMM range in place (PoolConfig::expandable)",
        reserve_note: None,
        build: |d| {
            let mut config = PoolConfig::default();
            config.expandable = true;
            let pool = PoolResource::new(DeviceResource::new(d.clone()), config)?;
            Ok(Allocator::pool(Arc::new(pool)))
        },
    },
    AllocatorSpec {
        name: "pool-recycling",
        about: "pool-expandable that moves free 64 MiB pieces to a growing range's end (PoolConfig::recycle_pieces)",
        reserve_note: None,
        build: |d| {
            let mut config = PoolConfig::default();
            config.expandable = true;
            config.recycle_pieces = true;
            let pool = PoolResource::new(DeviceResource::new(d.clone()), config)?;
            Ok(Allocator::pool(Arc::new(pool)))
        },
    },
    AllocatorSpec {
        name: "arena",
        about: "ArenaResource: per-stream arenas of 1 MiB superblocks over half the device's free memory, taken up front",
        reserve_note: Some(
            "arena takes half the device's free memory up front, as RMM's arena does: its reserve does not follow the live bytes",
        ),
        build: |d| {
            let arena = ArenaResource::with_defaults(DeviceResource::new(d.clone()))?;
            Ok(Allocator::pool(Arc::new(arena)))
        },
    },
    AllocatorSpec {
        name: "caching",
        about: "CachingPool: power-of-two classes 512 B..2 GiB from 2 MiB chunks, eighths above, per-stream reuse",
        reserve_note: None,
        build: |d| {
            let pool = CachingPool::with_defaults(DeviceResource::new(d.clone()))?;
            Ok(Allocator::pool(Arc::new(pool)))
        },
    },
    AllocatorSpec {
        name: "vpool",
        about: "VirtualPool: VMM pages mapped only under live blocks and moved where needed (reserve = physical)",
        reserve_note: None,
        build: |d| {
            let pool = Arc::new(VirtualPool::with_defaults(d.clone())?);
            let mut a = Allocator::pool(pool.clone());
            a.virtual_pool = Some(pool);
            Ok(a)
        },
    },
    AllocatorSpec {
        name: "vpool-sharded",
        about: "VirtualPool with threads on their own lock shards from the start (VirtualPoolConfig::spread = Always)",
        reserve_note: None,
        build: |d| {
            let mut config = VirtualPoolConfig::default();
            config.spread = Spread::Always;
            let pool = Arc::new(VirtualPool::new(d.clone(), config)?);
            let mut a = Allocator::pool(pool.clone());
            a.virtual_pool = Some(pool);
            Ok(a)
        },
    },
    AllocatorSpec {
        name: "binning",
        about: "BinningResource: fixed-size bins 256 B..1 MiB over a PoolResource, which also serves larger requests (RMM's binning-over-pool)",
        reserve_note: None,
        build: |d| {
            let pool = Arc::new(PoolResource::with_defaults(DeviceResource::new(d.clone()))?);
            let bins = BinningResource::new(pool.clone(), BinningConfig::fixed_bins(8, 20))?;
            Ok(Allocator::new(Arc::new(bins), pool))
        },
    },
];

/// An allocator ready to measure. Dropping it releases what its pool holds
/// (CUDA's default pool outlives the allocator: the next one measured in
/// this process starts from an empty device).
pub struct Allocator {
    /// The allocator.
    pub resource: SharedResource,
    /// The pool whose reserve is what the allocator holds from the driver.
    pub pool: Arc<dyn Pool>,
    /// The allocator when it is a [`VirtualPool`], for its mapping counts.
    pub virtual_pool: Option<Arc<VirtualPool>>,
}

impl Allocator {
    /// An allocator and the pool that holds its memory from the driver.
    pub fn new(resource: SharedResource, pool: Arc<dyn Pool>) -> Self {
        Self {
            resource,
            pool,
            virtual_pool: None,
        }
    }

    /// A pool that is the allocator itself.
    pub fn pool(pool: Arc<dyn Pool>) -> Self {
        Self::new(pool.clone(), pool)
    }

    /// For a [`VirtualPool`], the `cuMemMap` calls it has made so far (a
    /// steady state makes none); `None` for the others.
    pub fn mappings_made(&self) -> Option<u64> {
        self.virtual_pool.as_ref().map(|v| v.stats().mappings_made)
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        let _ = self.pool.release();
    }
}

/// The names of every allocator, in table order.
pub fn names() -> Vec<&'static str> {
    ALLOCATORS.iter().map(|a| a.name).collect()
}

/// Resolves a `--alloc` list (`all` or empty: every allocator) to specs,
/// failing on an unknown name with the list of known ones.
pub fn select(list: &[String]) -> Result<Vec<&'static AllocatorSpec>> {
    if list.is_empty() || list.iter().any(|n| n == "all") {
        return Ok(ALLOCATORS.iter().collect());
    }
    let mut out = Vec::new();
    for name in list {
        match ALLOCATORS.iter().find(|a| a.name == name) {
            Some(a) => out.push(a),
            None => bail!(
                "unknown allocator {name:?}; known: {} (see `gpumem bench --list-allocators`)",
                names().join(", ")
            ),
        }
    }
    Ok(out)
}

/// The plain device resource seen as a pool: it caches nothing, so what it
/// holds from the driver is exactly what it hands out, counted as asked.
pub struct Uncached(StatisticsAdaptor<DeviceResource>);

impl Uncached {
    /// `cuMemAlloc` on `device`, counted.
    pub fn new(device: &Device) -> Self {
        Self(StatisticsAdaptor::new(DeviceResource::new(device.clone())))
    }
}

impl MemoryResource for Uncached {
    fn allocate(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> gpumem::Result<DevicePtr> {
        self.0.allocate(bytes, alignment, stream)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> gpumem::Result<()> {
        self.0.deallocate(ptr, bytes, alignment, stream)
    }

    fn device(&self) -> &Device {
        self.0.device()
    }

    fn properties(&self) -> Properties {
        self.0.properties()
    }
}

impl Pool for Uncached {
    fn reserved_bytes(&self) -> usize {
        self.0.stats().requested_bytes.current.max(0) as usize
    }

    fn peak_reserved_bytes(&self) -> usize {
        self.0.stats().requested_bytes.peak.max(0) as usize
    }

    fn reset_peak(&self) {
        self.0.reset_peak()
    }

    fn trim(&self, _to: usize) -> gpumem::Result<usize> {
        Ok(0)
    }

    fn release(&self) -> gpumem::Result<usize> {
        Ok(0)
    }
}
