//! CUDA's stream-ordered allocator (`cudaMallocAsync`, memory pools) as gpumem
//! resources.
//!
//! - [`AsyncResource`]: a resource over a pool gpumem creates from properties
//!   (device, pinned host or managed memory; IPC handle type; size limit;
//!   priming; release threshold, `u64::MAX` by default as in RMM), or over the
//!   device's default pool ([`AsyncResource::default_pool`]).
//! - [`AsyncViewResource`]: a resource over a pool handle gpumem does not own
//!   (another library's pool, the device's current pool); never destroyed here.
//! - [`AsyncManagedResource`]: a managed-memory pool (CUDA 13 drivers).
//! - [`MemPool`]: the pool behind each of them, with typed attributes (release
//!   threshold, reuse policies, reserved and used memory and their highs),
//!   and peer access (`grant_access`, `access`). Every resource
//!   dereferences to its `MemPool` and is a [`Pool`](crate::pool::Pool).
//! - IPC ([`ipc`]): export a pool as a POSIX file descriptor and its
//!   allocations as 64-byte records, import both in another process
//!   ([`AsyncResource::import_fd`], [`ImportedPool`]), and pass descriptors over
//!   Unix sockets ([`ipc::send_fd`], [`ipc::recv_fd`]).
//!
//! Out of memory: memory freed on a stream goes back to the pool only when
//! the free has run, so a failed allocation synchronizes the device and is
//! tried once more (as PyTorch's `cudaMallocAsync` backend does) before it
//! is [`Error::OutOfMemory`]. While a stream capture is under way
//! ([`crate::captures`]) the device is not synchronized (CUDA would refuse,
//! and the refusal breaks the capture): the allocation is out of memory at
//! once.
//!
//! Devices or drivers without memory pools, and pools asking for a handle
//! type or allocation type the device lacks, give [`Error::Unsupported`] naming
//! the feature, never a panic.
//!
//! ```
//! use gpumem::async_pool::{AsyncResource, AsyncResourceConfig, ReusePolicy};
//! use gpumem::driver::sim::SimConfig;
//! use gpumem::pool::Pool;
//! use gpumem::resource::MemoryResource;
//! use gpumem::Device;
//!
//! # fn main() -> gpumem::Result<()> {
//! let device = Device::sim(SimConfig::default());
//! let mut config = AsyncResourceConfig::default();
//! config.initial_size = 64 << 20;
//! let mr = AsyncResource::new(device.clone(), config)?;
//! assert_eq!(mr.release_threshold()?, u64::MAX);
//! assert!(mr.reserved_current()? >= 64 << 20);
//! assert!(mr.reuse_policy(ReusePolicy::AllowOpportunistic)?);
//!
//! let stream = device.create_stream()?;
//! let p = mr.allocate(1 << 20, 256, &stream)?;
//! mr.deallocate(p, 1 << 20, 256, &stream)?;
//! stream.synchronize()?;
//! assert!(mr.trim(0)? >= 64 << 20);
//! assert_eq!(mr.reserved_current()?, 0);
//! # Ok(())
//! # }
//! ```

/// Implements `MemoryResource` for a type that derefs to a [`MemPool`] by
/// forwarding to the pool (the resources differ only in who owns the pool).
macro_rules! forward_to_pool {
    ($t:ty) => {
        impl $crate::resource::MemoryResource for $t {
            #[inline]
            fn allocate(
                &self,
                bytes: usize,
                alignment: usize,
                stream: &$crate::Stream,
            ) -> $crate::Result<$crate::DevicePtr> {
                self.pool().allocate(bytes, alignment, stream)
            }

            #[inline]
            fn deallocate(
                &self,
                ptr: $crate::DevicePtr,
                bytes: usize,
                alignment: usize,
                stream: &$crate::Stream,
            ) -> $crate::Result<()> {
                if !ptr.is_null() {
                    $crate::error::check_alignment(alignment)?;
                }
                self.pool().deallocate(ptr, bytes, stream)
            }

            fn device(&self) -> &$crate::Device {
                self.pool().device()
            }

            fn properties(&self) -> $crate::resource::Properties {
                self.pool().properties()
            }
        }

        $crate::async_pool::pool_of_mempool!($t);
    };
}
use forward_to_pool;

/// Implements [`Pool`](crate::pool::Pool) for a resource over a [`MemPool`].
/// A failed attribute read counts as 0 and a failed reset is ignored (the
/// [`MemPool`] getters and setters return the driver's error).
macro_rules! pool_of_mempool {
    ($t:ty) => {
        /// The pool's `ReservedMemCurrent` and `ReservedMemHigh`.
        /// [`Pool::trim`](crate::pool::Pool::trim) is `cuMemPoolTrimTo`
        /// (unused memory whose frees have run); [`Pool::release`](crate::pool::Pool::release)
        /// synchronizes the device first (and trims all the same, returning
        /// the error, when it cannot).
        impl $crate::pool::Pool for $t {
            fn reserved_bytes(&self) -> usize {
                self.pool().reserved_current().unwrap_or(0)
            }
            fn peak_reserved_bytes(&self) -> usize {
                self.pool().reserved_high().unwrap_or(0)
            }
            fn reset_peak(&self) {
                let _ = self.pool().reset_reserved_high();
            }
            fn trim(&self, to: usize) -> $crate::Result<usize> {
                self.pool().give_back(to)
            }
            fn release(&self) -> $crate::Result<usize> {
                self.pool().give_back_all()
            }
        }
    };
}
use pool_of_mempool;

// The owner of a pool handle (`MemPool`, with its peer access and IPC in
// their own files) passes it to the driver's `unsafe` methods.
#[allow(unsafe_code)]
mod access;
mod async_resource;
#[allow(unsafe_code)]
mod attributes;
#[cfg(unix)]
#[allow(unsafe_code)]
pub mod ipc;
mod managed;
#[allow(unsafe_code)]
mod view;

pub use async_resource::{AsyncResource, AsyncResourceConfig};
pub use attributes::{MemPool, PoolUsage, ReusePolicy};
#[cfg(unix)]
pub use ipc::ImportedPool;
pub use managed::AsyncManagedResource;
pub use view::AsyncViewResource;

use crate::device::Device;
use crate::driver::DeviceInfo;
use crate::{Error, Result};

/// `CUDA_ERROR_NOT_SUPPORTED`.
const CUDA_ERROR_NOT_SUPPORTED: i32 = 801;

/// The device's info, or [`Error::Unsupported`] when it has no memory pools.
fn require_pools(device: &Device) -> Result<DeviceInfo> {
    let info = device.info()?;
    if !info.memory_pools {
        return Err(Error::unsupported(format!(
            "stream-ordered memory pools (cudaMallocAsync) on device {}",
            device.ordinal()
        )));
    }
    Ok(info)
}

/// Turns the driver's `CUDA_ERROR_NOT_SUPPORTED` (a driver error or the
/// backend's own [`Error::Unsupported`]) into [`Error::Unsupported`] naming
/// `feature`; other errors pass through.
fn map_not_supported(err: Error, feature: impl FnOnce() -> String) -> Error {
    match err {
        Error::Driver { code, call, .. } if code == CUDA_ERROR_NOT_SUPPORTED => {
            Error::unsupported(format!("{} ({call} says not supported)", feature()))
        }
        Error::Unsupported { feature: what } => {
            Error::unsupported(format!("{} ({what})", feature()))
        }
        e => e,
    }
}
