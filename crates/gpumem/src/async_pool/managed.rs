//! `AsyncManagedResource`: stream-ordered managed memory from a pool of
//! `CU_MEM_ALLOCATION_TYPE_MANAGED` (CUDA 13 drivers).
//!
//! It creates its own managed pool located on the device (destroyed on drop)
//! with the release threshold at `u64::MAX`, and allocates from it like
//! [`AsyncResource`]. The memory is host- and device-accessible, migrated by
//! the driver. Where the driver or device has no managed pools (drivers before
//! CUDA 13, devices without managed memory or memory pools) construction is
//! [`Error::Unsupported`](crate::Error::Unsupported).

use std::ops::Deref;

use super::async_resource::{AsyncResource, AsyncResourceConfig};
use super::attributes::MemPool;
use crate::device::Device;
use crate::driver::{AllocationType, DevicePtr};
use crate::resource::{MemoryResource, Properties};
use crate::stream::Stream;
use crate::Result;

/// Managed memory from a stream-ordered pool. Dereferences to its [`MemPool`].
///
/// ```
/// use gpumem::async_pool::AsyncManagedResource;
/// use gpumem::pool::Pool;
/// use gpumem::resource::MemoryResource;
/// use gpumem::Device;
///
/// fn main() -> gpumem::Result<()> {
///     let device = Device::sim(Default::default());
///     let managed = AsyncManagedResource::with_defaults(device.clone())?;
///     assert!(managed.properties().host_accessible);
///     let stream = device.create_stream()?;
///     let p = managed.allocate(1 << 20, 256, &stream)?;
///     managed.deallocate(p, 1 << 20, 256, &stream)?;
///     assert!(managed.release()? >= 1 << 20);
///     Ok(())
/// }
/// ```
#[derive(Debug)]
pub struct AsyncManagedResource {
    inner: AsyncResource,
}

impl AsyncManagedResource {
    /// A new managed-memory pool on `device`, made as `config` says for an
    /// [`AsyncResource`]; its `alloc_type` is always
    /// [`AllocationType::Managed`].
    pub fn new(device: Device, config: AsyncResourceConfig) -> Result<Self> {
        let config = AsyncResourceConfig {
            alloc_type: AllocationType::Managed,
            ..config
        };
        let inner = AsyncResource::new(device, config)?;
        Ok(Self { inner })
    }

    /// A new managed-memory pool on `device` with the default configuration.
    pub fn with_defaults(device: Device) -> Result<Self> {
        Self::new(device, AsyncResourceConfig::default())
    }

    /// The pool behind this resource.
    pub fn pool(&self) -> &MemPool {
        self.inner.pool()
    }
}

impl Deref for AsyncManagedResource {
    type Target = MemPool;

    fn deref(&self) -> &MemPool {
        self.inner.pool()
    }
}

impl MemoryResource for AsyncManagedResource {
    #[inline]
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        self.inner.allocate(bytes, alignment, stream)
    }

    #[inline]
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.inner.deallocate(ptr, bytes, alignment, stream)
    }

    fn device(&self) -> &Device {
        self.inner.device()
    }

    fn properties(&self) -> Properties {
        Properties::HOST_AND_DEVICE
    }
}

super::pool_of_mempool!(AsyncManagedResource);
