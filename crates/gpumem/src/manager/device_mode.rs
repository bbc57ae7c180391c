//! Device allocator modes of the [`MemoryManager`](super::MemoryManager) and
//! the device pool behind each.
//!
//! - [`DeviceAllocatorMode::Pool`]: gpumem's [`PoolResource`] with
//!   *synchronous* semantics. `free_device_async(ptr, stream)` first waits for
//!   `stream` and then returns the block to the pool's global free index, so
//!   any stream may reuse it at once; allocations are usable by any stream.
//!   The behaviour of `cudaMalloc`/`cudaFree`, at pool speed.
//! - [`DeviceAllocatorMode::AsyncStreamOrdered`]: the same [`PoolResource`]
//!   used *stream-ordered*: `allocate_device_async`/`free_device_async` never
//!   block; a block freed on a stream is reused at once by that stream and by
//!   others only once the free is known complete (the pools' stream-ordering
//!   policy). The behaviour of `cudaMallocAsync`, without needing the
//!   driver's pools, so it never falls back.
//! - [`DeviceAllocatorMode::CudaAsyncPool`]: CUDA's own stream-ordered pool
//!   (`cuMemPoolCreate` + `cuMemAllocFromPoolAsync`), a pool of the manager's
//!   own with its release threshold at its size (or unlimited). Needs
//!   `DeviceInfo::memory_pools`; without them the effective mode is `Pool`
//!   and the manager says why.

use crate::device::Device;
use crate::driver::{DevicePtr, PoolAttr, PoolProps, RawPool};
use crate::pool::{PoolConfig, PoolResource};
use crate::resource::{validate_request, DeviceResource, MemoryResource, Properties};
use crate::stream::Stream;
use crate::{Error, Result};

/// Which allocator serves the manager's device memory; see the module
/// documentation for what each means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeviceAllocatorMode {
    /// gpumem's pool, synchronous frees (the default).
    #[default]
    Pool,
    /// gpumem's pool, stream-ordered frees.
    AsyncStreamOrdered,
    /// CUDA's stream-ordered memory pool.
    CudaAsyncPool,
}

impl std::fmt::Display for DeviceAllocatorMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceAllocatorMode::Pool => "pool",
            DeviceAllocatorMode::AsyncStreamOrdered => "async-stream-ordered",
            DeviceAllocatorMode::CudaAsyncPool => "cuda-async-pool",
        })
    }
}

/// CUDA's stream-ordered allocator over a pool of its own: `cuMemPoolCreate`,
/// `cuMemAllocFromPoolAsync`, `cuMemFreeAsync`. The release threshold is set so
/// the pool keeps its memory across synchronizations (CUDA's default of 0 gives
/// it back at every synchronize). Destroying it waits for the device.
#[derive(Debug)]
pub struct CudaPoolResource {
    device: Device,
    pool: RawPool,
}

impl CudaPoolResource {
    /// A new CUDA pool on `device` keeping up to `release_threshold` bytes
    /// cached (`None`: everything). [`Error::Unsupported`] without driver pools.
    pub fn new(device: Device, release_threshold: Option<usize>) -> Result<Self> {
        if !device.info()?.memory_pools {
            return Err(Error::unsupported("stream-ordered memory pools"));
        }
        let driver = device.driver();
        let pool = driver.mempool_create(&PoolProps::device(device.ordinal()))?;
        let threshold = release_threshold.map_or(u64::MAX, |b| b as u64);
        if let Err(e) = driver.mempool_set_attr(pool, PoolAttr::ReleaseThreshold, threshold) {
            let _ = driver.mempool_destroy(pool);
            return Err(e);
        }
        Ok(Self { device, pool })
    }

    /// Bytes the pool holds from the device now.
    pub fn reserved_bytes(&self) -> Result<usize> {
        self.device
            .driver()
            .mempool_get_attr(self.pool, PoolAttr::ReservedMemCurrent)
            .map(|b| b as usize)
    }
}

impl MemoryResource for CudaPoolResource {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, crate::resource::DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        self.device
            .driver()
            .mem_alloc_from_pool_async(bytes, self.pool, stream.raw())
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        _bytes: usize,
        _alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        self.device.driver().mem_free_async(ptr, stream.raw())
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn properties(&self) -> Properties {
        Properties::DEVICE
    }
}

impl Drop for CudaPoolResource {
    fn drop(&mut self) {
        if crate::exit::process_is_exiting() {
            return;
        }
        let _ = self.device.synchronize();
        let driver = self.device.driver();
        // Destroying a pool with outstanding allocations fails; trim first so
        // what can go back does.
        let _ = driver.mempool_trim_to(self.pool, 0);
        if let Err(e) = driver.mempool_destroy(self.pool) {
            eprintln!("gpumem: CUDA pool could not be destroyed: {e}");
        }
    }
}

/// The device allocator the manager built for its effective mode.
pub(super) enum DeviceBackend {
    /// `Pool` or `AsyncStreamOrdered`.
    Gpumem(PoolResource<DeviceResource>),
    /// `CudaAsyncPool`.
    Cuda(CudaPoolResource),
}

impl DeviceBackend {
    pub(super) fn build(
        device: &Device,
        mode: DeviceAllocatorMode,
        size: Option<usize>,
    ) -> Result<Self> {
        match mode {
            DeviceAllocatorMode::CudaAsyncPool => {
                Ok(Self::Cuda(CudaPoolResource::new(device.clone(), size)?))
            }
            _ => {
                let config = match size {
                    Some(bytes) => PoolConfig {
                        initial_size: bytes,
                        maximum_size: Some(bytes),
                        ..PoolConfig::default()
                    },
                    None => PoolConfig::default(),
                };
                Ok(Self::Gpumem(PoolResource::new(
                    DeviceResource::new(device.clone()),
                    config,
                )?))
            }
        }
    }

    pub(super) fn resource(&self) -> &dyn MemoryResource {
        match self {
            Self::Gpumem(p) => p,
            Self::Cuda(c) => c,
        }
    }

    /// Bytes held from the device.
    pub(super) fn reserved(&self) -> usize {
        match self {
            Self::Gpumem(p) => p.reserved_bytes(),
            Self::Cuda(c) => c.reserved_bytes().unwrap_or(0),
        }
    }
}
