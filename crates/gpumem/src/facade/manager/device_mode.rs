//! Device allocator modes of the [`MemoryManager`](super::MemoryManager) and
//! the device pool behind each.
//!
//! The two gpumem modes build the pool `GPUMEM_CONF=resource=pool` names
//! (its heaps grow in place where the device has CUDA's virtual memory
//! management, [`PoolConfig::expandable`]); they differ in how frees are
//! ordered. The names they display say so, and `async` is `GPUMEM_CONF`'s
//! name for CUDA's pool of its own.
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
//!   ([`AsyncResource`]: `cuMemPoolCreate` + `cuMemAllocFromPoolAsync`), a
//!   pool of the manager's own that keeps its memory across synchronizations
//!   (release threshold `u64::MAX`); a pool size primes it with that many
//!   bytes and caps it there. Needs
//!   `DeviceInfo::memory_pools`; without them the effective mode is `Pool`
//!   and the manager says why.

use crate::async_pool::{AsyncResource, AsyncResourceConfig};
use crate::device::Device;
use crate::pool::{Pool, PoolConfig, PoolResource};
use crate::resource::DeviceResource;
use crate::Result;

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
            DeviceAllocatorMode::Pool => "pool (synchronous frees)",
            DeviceAllocatorMode::AsyncStreamOrdered => "pool (stream-ordered frees)",
            DeviceAllocatorMode::CudaAsyncPool => "async",
        })
    }
}

/// The device allocator the manager built for its effective mode.
pub(super) enum DeviceBackend {
    /// `Pool` or `AsyncStreamOrdered`.
    Gpumem(Box<PoolResource<DeviceResource>>),
    /// `CudaAsyncPool`.
    Cuda(AsyncResource),
}

impl DeviceBackend {
    pub(super) fn build(
        device: &Device,
        mode: DeviceAllocatorMode,
        size: Option<usize>,
    ) -> Result<Self> {
        match mode {
            DeviceAllocatorMode::CudaAsyncPool => {
                let mut config = AsyncResourceConfig::default();
                if let Some(bytes) = size {
                    config.initial_size = bytes;
                    config.max_reserved = Some(bytes);
                }
                Ok(Self::Cuda(AsyncResource::new(device.clone(), config)?))
            }
            _ => {
                let mut config = PoolConfig::default().with_expandable(true);
                if let Some(bytes) = size {
                    config.initial_size = bytes;
                    config.max_reserved = Some(bytes);
                }
                Ok(Self::Gpumem(Box::new(PoolResource::new(
                    DeviceResource::new(device.clone()),
                    config,
                )?)))
            }
        }
    }

    pub(super) fn resource(&self) -> &dyn Pool {
        match self {
            Self::Gpumem(p) => &**p,
            Self::Cuda(c) => c,
        }
    }

    /// Bytes held from the device.
    pub(super) fn reserved(&self) -> usize {
        self.resource().reserved_bytes()
    }
}
