//! `AsyncViewResource`: a memory resource over a pool handle gpumem does not
//! own, RMM's `cuda_async_view_memory_resource`.
//!
//! Allocation and free go to the pool exactly as in [`AsyncResource`]; the
//! pool's attributes are left as they are, and the pool is never destroyed
//! here. Use it for a pool another library made, or for the device's current
//! pool (`cuDeviceGetMemPool`, what `cudaMallocAsync` uses).
//!
//! [`AsyncResource`]: super::AsyncResource

use std::ops::Deref;

use super::attributes::MemPool;
use super::require_pools;
use crate::device::Device;
use crate::driver::{HandleType, Location, RawPool};
use crate::resource::Properties;
use crate::Result;

/// A resource over a pool it does not own. Dereferences to its [`MemPool`].
///
/// ```
/// use gpumem::async_pool::{AsyncResource, AsyncViewResource};
/// use gpumem::resource::{MemoryResource, Properties};
/// use gpumem::Device;
///
/// fn main() -> gpumem::Result<()> {
///     let device = Device::sim(Default::default());
///     // A pool made elsewhere (here by gpumem; say, by another library).
///     let owner = AsyncResource::with_defaults(device.clone())?;
///     // SAFETY: `owner` outlives the view and its allocations.
///     let view = unsafe { AsyncViewResource::new(device.clone(), owner.raw(), Properties::DEVICE)? };
///     let stream = device.create_stream()?;
///     let p = view.allocate(1 << 20, 256, &stream)?;
///     view.deallocate(p, 1 << 20, 256, &stream)?;
///     drop(view); // the pool lives on
///     assert!(owner.is_owned() && owner.release_threshold()? == u64::MAX);
///     Ok(())
/// }
/// ```
#[derive(Debug)]
pub struct AsyncViewResource {
    pool: MemPool,
}

impl AsyncViewResource {
    /// A view of pool `raw`, whose memory lives on `device` and is accessible
    /// as `properties` says; gpumem never destroys it. The handle is checked
    /// by reading one attribute.
    ///
    /// # Safety
    /// `raw` is a memory pool of `device`'s driver that outlives the view and
    /// every allocation made through it: the driver takes the handle for a
    /// pointer to its own structures, and a destroyed one can corrupt the
    /// process.
    pub unsafe fn new(device: Device, raw: RawPool, properties: Properties) -> Result<Self> {
        Self::view(device, raw, properties)
    }

    /// A view of `raw`, a pool that outlives it (the callers' word).
    fn view(device: Device, raw: RawPool, properties: Properties) -> Result<Self> {
        require_pools(&device)?;
        let ordinal = device.ordinal();
        let pool = MemPool::new(
            device,
            raw,
            false,
            Location::Device(ordinal),
            HandleType::None,
            properties,
            0,
        );
        pool.release_threshold()?;
        Ok(Self { pool })
    }

    /// A view of the device's current pool (`cuDeviceGetMemPool`): the pool
    /// `cudaMallocAsync` allocates from now.
    pub fn current(device: Device) -> Result<Self> {
        require_pools(&device)?;
        let raw = device.driver().mempool_current(device.ordinal())?;
        // The device's pools live as long as its context.
        Self::view(device, raw, Properties::DEVICE)
    }

    /// A view of the device's default pool (`cuDeviceGetDefaultMemPool`).
    pub fn default_pool(device: Device) -> Result<Self> {
        require_pools(&device)?;
        let raw = device.driver().mempool_default(device.ordinal())?;
        Self::view(device, raw, Properties::DEVICE)
    }

    /// The pool behind this view.
    pub fn pool(&self) -> &MemPool {
        &self.pool
    }
}

impl Deref for AsyncViewResource {
    type Target = MemPool;

    fn deref(&self) -> &MemPool {
        &self.pool
    }
}

super::forward_to_pool!(AsyncViewResource);
