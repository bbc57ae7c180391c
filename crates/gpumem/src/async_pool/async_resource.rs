//! `AsyncResource`: a memory resource over a CUDA stream-ordered memory pool
//! (`cuMemAllocFromPoolAsync` / `cuMemFreeAsync`), RMM's
//! `cuda_async_memory_resource`.
//!
//! Algorithm: none of our own. The driver's pool caches freed memory per pool
//! and hands it out again in stream order; allocation and free cost about 1 µs
//! per pair on an H100 once the pool holds the memory
//! (`bench/results/NOTES.md`), plus a table insert and remove, tens of ns,
//! that makes a free of a pointer this resource did not hand out, a second
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
use crate::driver::{AllocationType, HandleType, Location, PoolProps};
use crate::resource::Properties;
use crate::{Error, Result};

/// A memory resource over a CUDA memory pool: the device's default pool or one
/// created from properties. Dereferences to its [`MemPool`] for attributes,
/// trimming and peer access.
#[derive(Debug)]
pub struct AsyncResource {
    pool: MemPool,
}

/// Builds an [`AsyncResource`] over a new memory pool; see
/// [`AsyncResource::builder`].
#[derive(Debug, Clone)]
pub struct AsyncResourceBuilder {
    device: Device,
    initial_size: usize,
    release_threshold: u64,
    max_size: usize,
    handle_type: HandleType,
    alloc_type: AllocationType,
    location: Option<Location>,
}

impl AsyncResourceBuilder {
    /// Primes the pool: allocates and frees `bytes` on the device's default
    /// stream and synchronizes, so the pool holds that much from the start
    /// (kept if the release threshold allows). Default 0: no priming.
    pub fn initial_size(mut self, bytes: usize) -> Self {
        self.initial_size = bytes;
        self
    }

    /// Unused bytes the pool keeps across synchronizations. Default `u64::MAX`
    /// (keep everything), as RMM does; the driver's own default is 0.
    pub fn release_threshold(mut self, bytes: u64) -> Self {
        self.release_threshold = bytes;
        self
    }

    /// The most the pool may reserve from the device; 0 (the default) means no
    /// limit. Allocations beyond it fail with [`Error::OutOfMemory`].
    pub fn max_size(mut self, bytes: usize) -> Self {
        self.max_size = bytes;
        self
    }

    /// The IPC handle type the pool can be exported as (default
    /// [`HandleType::None`]). [`HandleType::PosixFd`] makes
    /// [`MemPool::export_fd`] and [`MemPool::export_pointer`] work.
    pub fn handle_type(mut self, handle_type: HandleType) -> Self {
        self.handle_type = handle_type;
        self
    }

    /// Pinned (device or pinned host, the default) or managed memory (CUDA 13
    /// drivers only).
    pub fn alloc_type(mut self, alloc_type: AllocationType) -> Self {
        self.alloc_type = alloc_type;
        self
    }

    /// Where the memory lives: the builder's device (the default) or host
    /// memory ([`Location::Host`], [`Location::HostNuma`]), which devices reach
    /// over the bus. A [`Location::Device`] other than the builder's device is
    /// an error: build from that device instead.
    pub fn location(mut self, location: Location) -> Self {
        self.location = Some(location);
        self
    }

    /// The pool properties this builder asks the driver for.
    pub fn props(&self) -> PoolProps {
        PoolProps {
            alloc_type: self.alloc_type,
            location: self
                .location
                .unwrap_or(Location::Device(self.device.ordinal())),
            handle_type: self.handle_type,
            max_size: self.max_size,
        }
    }

    /// Creates the pool, sets its release threshold and primes it.
    ///
    /// [`Error::Unsupported`] names the missing feature when the device has no
    /// memory pools, no POSIX fd IPC (for [`HandleType::PosixFd`]), no managed
    /// memory (for [`AllocationType::Managed`]), or the driver refuses the
    /// combination as not supported.
    pub fn build(self) -> Result<AsyncResource> {
        let props = self.props();
        let ordinal = self.device.ordinal();
        if let Location::Device(d) = props.location {
            if d != ordinal {
                return Err(Error::InvalidArgument(format!(
                    "pool location is device {d} but the builder's device is {ordinal}; \
                     build from device {d} instead"
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
        if self.max_size > 0 && self.initial_size > self.max_size {
            return Err(Error::InvalidArgument(format!(
                "initial size {} exceeds the pool's maximum size {}",
                self.initial_size, self.max_size
            )));
        }
        let info = require_pools(&self.device)?;
        match self.handle_type {
            HandleType::PosixFd if !info.posix_fd_ipc => {
                return Err(Error::unsupported(format!(
                    "POSIX file descriptor IPC handles for memory pools on device {ordinal}"
                )))
            }
            _ => {}
        }
        if self.alloc_type == AllocationType::Managed && !info.managed_memory {
            return Err(Error::unsupported(format!(
                "managed memory pools on device {ordinal} (no managed memory)"
            )));
        }
        let feature = || match (self.alloc_type, self.handle_type, props.location) {
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
        let driver = self.device.driver();
        driver.set_current_device(ordinal)?;
        let raw = driver
            .mempool_create(&props)
            .map_err(|e| map_not_supported(e, feature))?;
        let properties = match (props.alloc_type, props.location) {
            (AllocationType::Pinned, Location::Device(_)) => Properties::DEVICE,
            _ => Properties::HOST_AND_DEVICE,
        };
        let pool = MemPool::new(
            self.device.clone(),
            raw,
            true,
            props.location,
            props.handle_type,
            properties,
            props.max_size,
        );
        // From here on `pool` destroys the handle if anything fails.
        pool.set_release_threshold(self.release_threshold)?;
        let mr = AsyncResource { pool };
        if self.initial_size > 0 {
            mr.prime(self.initial_size)?;
        }
        Ok(mr)
    }
}

impl AsyncResource {
    /// A builder for a new pool on `device`: device memory, no IPC, no size
    /// limit, release threshold `u64::MAX`, no priming.
    pub fn builder(device: Device) -> AsyncResourceBuilder {
        AsyncResourceBuilder {
            device,
            initial_size: 0,
            release_threshold: u64::MAX,
            max_size: 0,
            handle_type: HandleType::None,
            alloc_type: AllocationType::Pinned,
            location: None,
        }
    }

    /// A new device-memory pool on `device` with the builder's defaults.
    pub fn new(device: Device) -> Result<Self> {
        Self::builder(device).build()
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
