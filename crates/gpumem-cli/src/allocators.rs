//! The allocators the command can measure, by name.
//!
//! [`ALLOCATORS`] is a table of name → constructor. Each constructor builds a
//! fresh allocator over a device together with a [`ReserveProbe`] that reports
//! the bytes the allocator holds from the driver: pools are built over a
//! [`CountingResource`] wrapping the device resource (so the probe counts what
//! they took from `cuMemAlloc`), the plain `cuda` resource is counted the same
//! way (its reserve is its live bytes), and `cuda-async` reads its pool's
//! `ReservedMemHigh` attribute. Adding an allocator is one entry in the table.
//!
//! The struct order of [`Allocator`] matters: the resource drops before its
//! probe, so a probe that trims a pool does so once the resource is gone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{bail, Result};
use gpumem::async_pool::AsyncResource;
use gpumem::driver::{PoolAttr, RawPool};
use gpumem::pool::{
    ArenaResource, BinningResource, CachingPool, PoolResource, VirtualPool, VirtualPoolConfig,
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
        build: |d| counted(d, |up| Ok(up)),
    },
    AllocatorSpec {
        name: "cuda-async",
        about: "AsyncResource: cuMemAllocAsync on the device's default pool, release threshold max",
        reserve_note: None,
        build: |d| {
            let r = AsyncResource::default_pool(d.clone())?;
            r.set_release_threshold(u64::MAX)?;
            let probe = ReserveProbe::Pool {
                device: d.clone(),
                pool: r.raw(),
            };
            Ok(Allocator::new(Arc::new(r), probe))
        },
    },
    AllocatorSpec {
        name: "pool",
        about: "PoolResource: coalescing best fit over TLSF lanes, per-stream lanes",
        reserve_note: None,
        build: |d| counted(d, |up| Ok(Arc::new(PoolResource::with_defaults(up)?))),
    },
    AllocatorSpec {
        name: "arena",
        about: "ArenaResource: per-stream arenas of 1 MiB superblocks over half the device's free memory, taken up front",
        reserve_note: Some(
            "arena takes half the device's free memory up front, as RMM's arena does: its reserve does not follow the live bytes",
        ),
        build: |d| counted(d, |up| Ok(Arc::new(ArenaResource::new(up)?))),
    },
    AllocatorSpec {
        name: "caching",
        about: "CachingPool: power-of-two classes 512 B..2 GiB from 2 MiB chunks, per-stream reuse",
        reserve_note: None,
        build: |d| {
            counted(d, |up| {
                Ok(Arc::new(CachingPool::with_upstream(
                    up,
                    Default::default(),
                )?))
            })
        },
    },
    AllocatorSpec {
        name: "vpool",
        about: "VirtualPool: VMM pages mapped only under live blocks and moved where needed (reserve = physical)",
        reserve_note: None,
        build: |d| {
            let pool = Arc::new(VirtualPool::new(d.clone(), VirtualPoolConfig::default())?);
            Ok(Allocator::new(pool.clone(), ReserveProbe::Virtual(pool)))
        },
    },
    AllocatorSpec {
        name: "binning",
        about: "BinningResource: fixed-size bins 256 B..1 MiB over a PoolResource, which also serves larger requests (RMM's binning-over-pool)",
        reserve_note: None,
        build: |d| {
            counted(d, |up| {
                let pool = PoolResource::with_defaults(up)?;
                Ok(Arc::new(BinningResource::with_fixed_bins(pool, 8, 20)?))
            })
        },
    },
];

/// An allocator ready to measure: the resource and its reserve probe.
pub struct Allocator {
    /// The allocator.
    pub resource: SharedResource,
    /// Reports the bytes it holds from the driver.
    pub reserve: ReserveProbe,
}

impl Allocator {
    /// An allocator from its parts.
    pub fn new(resource: SharedResource, reserve: ReserveProbe) -> Self {
        Self { resource, reserve }
    }
}

/// Builds an allocator over a counted device resource: `wrap` gets the counted
/// upstream and returns the allocator built on it (the upstream itself for the
/// plain device resource).
pub fn counted(
    device: &Device,
    wrap: impl FnOnce(Arc<CountingResource>) -> gpumem::Result<SharedResource>,
) -> gpumem::Result<Allocator> {
    let upstream = Arc::new(CountingResource::new(DeviceResource::new(device.clone())));
    let resource = wrap(upstream.clone())?;
    Ok(Allocator::new(resource, ReserveProbe::Counter(upstream)))
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

/// Reports the bytes an allocator holds from the driver.
pub enum ReserveProbe {
    /// A counting upstream.
    Counter(Arc<CountingResource>),
    /// A CUDA memory pool's `ReservedMem*` attributes. The pool is the device's
    /// default pool, which outlives the allocator: dropping the probe
    /// synchronizes the device and trims the pool to nothing, so the next
    /// allocator measured in this process starts from an empty device.
    Pool {
        /// The pool's device.
        device: Device,
        /// The pool.
        pool: RawPool,
    },
    /// A [`VirtualPool`]'s physical memory.
    Virtual(Arc<VirtualPool>),
}

impl ReserveProbe {
    /// Bytes held now.
    pub fn current(&self) -> gpumem::Result<usize> {
        match self {
            ReserveProbe::Counter(c) => Ok(c.current()),
            ReserveProbe::Virtual(v) => Ok(v.reserved_bytes()),
            ReserveProbe::Pool { device, pool } => Ok(device
                .driver()
                .mempool_get_attr(*pool, PoolAttr::ReservedMemCurrent)?
                as usize),
        }
    }

    /// For a [`VirtualPool`], the `cuMemMap` calls it has made so far (a
    /// steady state makes none); `None` for the others.
    pub fn mappings_made(&self) -> Option<u64> {
        match self {
            ReserveProbe::Virtual(v) => Some(v.stats().mappings_made),
            _ => None,
        }
    }

    /// Highest bytes held since the last [`ReserveProbe::reset_peak`].
    pub fn peak(&self) -> gpumem::Result<usize> {
        match self {
            ReserveProbe::Counter(c) => Ok(c.peak()),
            ReserveProbe::Virtual(v) => Ok(v.peak_reserved_bytes()),
            ReserveProbe::Pool { device, pool } => Ok(device
                .driver()
                .mempool_get_attr(*pool, PoolAttr::ReservedMemHigh)?
                as usize),
        }
    }

    /// Restarts the peak from the current value.
    pub fn reset_peak(&self) -> gpumem::Result<()> {
        match self {
            ReserveProbe::Counter(c) => {
                c.reset_peak();
                Ok(())
            }
            ReserveProbe::Virtual(v) => {
                v.reset_peaks();
                Ok(())
            }
            ReserveProbe::Pool { device, pool } => {
                device
                    .driver()
                    .mempool_set_attr(*pool, PoolAttr::ReservedMemHigh, 0)
            }
        }
    }
}

impl Drop for ReserveProbe {
    fn drop(&mut self) {
        if let ReserveProbe::Pool { device, pool } = self {
            let _ = device.synchronize();
            let _ = device.driver().mempool_trim_to(*pool, 0);
        }
    }
}

/// An upstream wrapper that counts the bytes currently allocated through it and
/// their peak. Two relaxed atomics per call: it sits under pools, where calls
/// are rare, and under the plain `cuda` resource, where the driver call costs
/// thousands of times more.
pub struct CountingResource<R = DeviceResource> {
    inner: R,
    current: AtomicUsize,
    peak: AtomicUsize,
}

impl<R: MemoryResource> CountingResource<R> {
    /// Counts what goes through `inner`.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            current: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    /// Bytes allocated through this resource and not yet freed.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// Highest [`CountingResource::current`] since creation or the last reset.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Restarts the peak from the current value.
    pub fn reset_peak(&self) {
        self.peak.store(self.current(), Ordering::Relaxed);
    }
}

impl<R: MemoryResource> MemoryResource for CountingResource<R> {
    fn allocate(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> gpumem::Result<DevicePtr> {
        let p = self.inner.allocate(bytes, alignment, stream)?;
        let now = self.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(p)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> gpumem::Result<()> {
        self.inner.deallocate(ptr, bytes, alignment, stream)?;
        self.current.fetch_sub(bytes, Ordering::Relaxed);
        Ok(())
    }

    fn device(&self) -> &Device {
        self.inner.device()
    }

    fn properties(&self) -> Properties {
        self.inner.properties()
    }
}
