//! `AsyncResource`: a memory resource over a CUDA stream-ordered memory pool
//! (`cuMemAllocFromPoolAsync` / `cuMemFreeAsync`), RMM's
//! `cuda_async_memory_resource`.
//!
//! Algorithm: none of our own. The driver's pool caches freed memory per pool
//! and hands it out again in stream order, a driver call each for allocation
//! and free even once the pool holds the memory (`docs/decisions.md`),
//! plus a table insert and remove that makes a free of a pointer this resource did not hand out, a second
//! free or a wrong size an error that never reaches `cuMemFreeAsync`. Two
//! things make it fast or slow:
//! - the release threshold: the driver's default of 0 returns all unused
//!   memory to the device at every synchronization, so the next allocation pays
//!   for the driver's `cuMemCreate`/`cuMemMap` again. Pools built here keep
//!   everything (`u64::MAX`), as RMM does, unless told otherwise;
//! - priming: an initial size is allocated and freed once at construction, so
//!   the first allocations find memory already reserved.
//!
//! The resource either creates its own pool from properties (destroyed on drop)
//! or uses the device's default pool (shared with every other user of
//! `cudaMallocAsync` in the process, never destroyed, its attributes left as
//! they are unless changed through this resource).

use std::ops::Deref;

use super::attributes::MemPool;
use super::{map_not_supported, require_pools};
use crate::device::Device;
use crate::driver::{AccessFlags, AllocationType, HandleType, Location, PoolProps};
use crate::resource::Properties;
use crate::{Error, Result};

/// A memory resource over a CUDA memory pool: the device's default pool or one
/// created from properties. Dereferences to its [`MemPool`] for attributes
/// and peer access; gives memory back through [`Pool`](crate::pool::Pool).
///
/// ```
/// use gpumem::async_pool::{AsyncResource, AsyncResourceConfig};
/// use gpumem::pool::Pool;
/// use gpumem::{Device, DeviceBuffer};
///
/// fn main() -> gpumem::Result<()> {
///     let device = Device::sim(Default::default());
///     let mut config = AsyncResourceConfig::default();
///     config.initial_size = 32 << 20; // primed: reserved from the start
///     config.max_reserved = Some(256 << 20);
///     let pool = AsyncResource::new(device.clone(), config)?;
///     assert!(pool.reserved_bytes() >= 32 << 20);
///
///     let stream = device.create_stream()?;
///     let buf = DeviceBuffer::<f32, _>::zeroed(1 << 20, &pool, &stream)?;
///     drop(buf); // freed on `stream`, back in the pool once that has run
///     assert!(pool.release()? >= 32 << 20); // synchronizes, then trims
///     assert_eq!(pool.reserved_bytes(), 0);
///     Ok(())
/// }
/// ```
#[derive(Debug)]
pub struct AsyncResource {
    pool: MemPool,
}

/// Configuration of an [`AsyncResource`] over a new memory pool. `Default`:
/// device memory, no IPC, no limit, release threshold `u64::MAX`, no
/// priming.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct AsyncResourceConfig {
    /// Primes the pool: `initial_size` bytes are allocated and freed on the
    /// device's default stream, which is then synchronized, so the pool holds
    /// that much from the start (kept if the release threshold allows).
    /// Default 0: no priming.
    pub initial_size: usize,
    /// Unused bytes the pool keeps across synchronizations. Default
    /// `u64::MAX` (keep everything), as RMM does; the driver's own default
    /// is 0.
    pub release_threshold: u64,
    /// Most bytes the pool may reserve from the device (its `maxSize`):
    /// allocations beyond it fail with [`Error::OutOfMemory`]. `None`
    /// (default): no limit; `Some(0)` is refused.
    pub max_reserved: Option<usize>,
    /// The IPC handle type the pool can be exported as (default
    /// [`HandleType::None`]). [`HandleType::PosixFd`] makes
    /// [`MemPool::export_fd`] and [`MemPool::export_pointer`] work.
    pub handle_type: HandleType,
    /// Pinned (device or pinned host, the default) or managed memory (CUDA
    /// 13 drivers only).
    pub alloc_type: AllocationType,
    /// Where the memory lives: `None` (default) for the resource's device,
    /// or host memory ([`Location::Host`], [`Location::HostNuma`]), which
    /// devices reach over the bus. A [`Location::Device`] other than the
    /// resource's device is an error: build on that device instead.
    pub location: Option<Location>,
    /// Other devices given read-write access to all of the pool's memory
    /// when it is made ([`MemPool::grant_access`]; peer access to the
    /// devices' own memory does not open a pool's). Default none.
    pub peers: Vec<u32>,
}

impl Default for AsyncResourceConfig {
    fn default() -> Self {
        Self {
            initial_size: 0,
            release_threshold: u64::MAX,
            max_reserved: None,
            handle_type: HandleType::None,
            alloc_type: AllocationType::Pinned,
            location: None,
            peers: Vec::new(),
        }
    }
}

impl AsyncResourceConfig {
    /// The pool properties this configuration asks the driver for on `device`.
    fn props(&self, device: &Device) -> PoolProps {
        PoolProps {
            alloc_type: self.alloc_type,
            location: self.location.unwrap_or(Location::Device(device.ordinal())),
            handle_type: self.handle_type,
            max_size: self.max_reserved.unwrap_or(0),
        }
    }
}

impl AsyncResource {
    /// A resource over a new pool on `device` made as `config` says: creates
    /// the pool, sets its release threshold, grants its peers access and
    /// primes it.
    ///
    /// [`Error::Unsupported`] names the missing feature when the device has no
    /// memory pools, no POSIX fd IPC (for [`HandleType::PosixFd`]), no managed
    /// memory (for [`AllocationType::Managed`]), or the driver refuses the
    /// combination as not supported; a peer that cannot reach the device is
    /// [`Error::Unsupported`] too.
    pub fn new(device: Device, config: AsyncResourceConfig) -> Result<Self> {
        let props = config.props(&device);
        let ordinal = device.ordinal();
        if let Location::Device(d) = props.location {
            if d != ordinal {
                return Err(Error::InvalidArgument(format!(
                    "pool location is device {d} but the resource's device is {ordinal}; \
                     build on device {d} instead"
                )));
            }
        }
        if matches!(props.location, Location::Host | Location::HostNuma(_))
            && props.handle_type != HandleType::None
        {
            return Err(Error::InvalidArgument(format!(
                "host-located pools cannot be exported (CUDA requires no handle type), \
                 asked for {:?}",
                props.handle_type
            )));
        }
        if let Some(max) = config.max_reserved {
            if max == 0 {
                return Err(Error::InvalidArgument(
                    "max_reserved must be non-zero (use None for no limit)".into(),
                ));
            }
            if config.initial_size > max {
                return Err(Error::InvalidArgument(format!(
                    "initial size {} exceeds the pool's max_reserved {max}",
                    config.initial_size
                )));
            }
        }
        let info = require_pools(&device)?;
        match config.handle_type {
            HandleType::PosixFd if !info.posix_fd_ipc => {
                return Err(Error::unsupported(format!(
                    "POSIX file descriptor IPC handles for memory pools on device {ordinal}"
                )))
            }
            _ => {}
        }
        if config.alloc_type == AllocationType::Managed && !info.managed_memory {
            return Err(Error::unsupported(format!(
                "managed memory pools on device {ordinal} (no managed memory)"
            )));
        }
        let feature = || match (config.alloc_type, config.handle_type, props.location) {
            (AllocationType::Managed, _, _) => {
                format!("managed memory pools on device {ordinal} (needs a CUDA 13 driver)")
            }
            (_, HandleType::Fabric, _) => {
                format!("fabric IPC handles for memory pools on device {ordinal}")
            }
            (_, HandleType::PosixFd, _) => {
                format!("POSIX file descriptor IPC handles for memory pools on device {ordinal}")
            }
            (_, _, Location::Host | Location::HostNuma(_)) => {
                "host-located memory pools".to_string()
            }
            _ => format!("memory pools with properties {props:?}"),
        };
        let driver = device.driver();
        driver.set_current_device(ordinal)?;
        let raw = driver
            .mempool_create(&props)
            .map_err(|e| map_not_supported(e, feature))?;
        let properties = match (props.alloc_type, props.location) {
            (AllocationType::Pinned, Location::Device(_)) => Properties::DEVICE,
            _ => Properties::HOST_AND_DEVICE,
        };
        let pool = MemPool::new(
            device.clone(),
            raw,
            true,
            props.location,
            props.handle_type,
            properties,
            props.max_size,
        );
        // From here on `pool` destroys the handle if anything fails.
        pool.set_release_threshold(config.release_threshold)?;
        for &peer in &config.peers {
            pool.grant_access(peer, AccessFlags::ReadWrite)?;
        }
        let mr = AsyncResource { pool };
        if config.initial_size > 0 {
            mr.prime(config.initial_size)?;
        }
        Ok(mr)
    }

    /// A new device-memory pool on `device` with the default configuration.
    pub fn with_defaults(device: Device) -> Result<Self> {
        Self::new(device, AsyncResourceConfig::default())
    }

    /// The device's default pool (`cuDeviceGetDefaultMemPool`), the one
    /// `cudaMallocAsync` uses. It is shared with every other user in the
    /// process and never destroyed; its attributes (release threshold 0 unless
    /// someone changed it) are left as they are. Set
    /// [`MemPool::set_release_threshold`] for speed, knowing that it changes
    /// the pool for everyone.
    pub fn default_pool(device: Device) -> Result<Self> {
        require_pools(&device)?;
        let driver = device.driver();
        let raw = driver.mempool_default(device.ordinal())?;
        let ordinal = device.ordinal();
        Ok(Self {
            pool: MemPool::new(
                device,
                raw,
                false,
                Location::Device(ordinal),
                HandleType::None,
                Properties::DEVICE,
                0,
            ),
        })
    }

    /// Allocates and frees `bytes` on the default stream, then synchronizes.
    fn prime(&self, bytes: usize) -> Result<()> {
        let stream = self.pool.device().default_stream();
        let p = self.pool.allocate(bytes, 256, &stream)?;
        self.pool.deallocate(p, bytes, &stream)?;
        stream.synchronize()
    }

    /// The pool behind this resource.
    pub fn pool(&self) -> &MemPool {
        &self.pool
    }
}

impl Deref for AsyncResource {
    type Target = MemPool;

    fn deref(&self) -> &MemPool {
        &self.pool
    }
}

super::forward_to_pool!(AsyncResource);
