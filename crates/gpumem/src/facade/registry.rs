//! The per-device resource registry: which resource code uses when it is not
//! handed one (RMM's `get_current_device_resource` / `set_per_device_resource`).
//!
//! A [`Registry`] belongs to one driver backend and holds one
//! [`SharedResource`] per device of that driver. Until set, a device's resource
//! is a plain [`DeviceResource`] of that device, created on first use. Setting
//! returns the previous resource, so callers can restore it; the registry keeps
//! a resource alive for as long as it is registered.
//!
//! Backends: the CUDA driver is one per process, so its registry is too:
//! [`Registry::cuda`] creates it on first use, and the free functions of this
//! module ([`current_device_resource`] and the others) use it. They return
//! [`Error::NoDriver`] where no CUDA driver is present. A simulated device is one
//! per [`SimDriver`](crate::driver::sim::SimDriver) instance, so tests build
//! their own registry with [`Registry::new`] or [`Registry::for_device`].
//!
//! The current device is the one whose context is current on the calling thread
//! ([`Driver::current_device`]).
//!
//! Thread safety: one `RwLock` over the table; reading takes the read lock and
//! clones an `Arc` (tens of ns), setting takes the write lock. Resources must be
//! of the registry's driver and of the device they are set for
//! ([`Error::InvalidArgument`] otherwise).

use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::device::Device;
use crate::driver::cuda::CudaDriver;
use crate::driver::Driver;
use crate::resource::{DeviceResource, SharedResource};
use crate::{Error, Result};

/// Per-device resources of one driver backend.
pub struct Registry {
    driver: Arc<dyn Driver>,
    slots: RwLock<Vec<Option<SharedResource>>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("backend", &self.driver.backend())
            .field("devices", &self.device_count())
            .finish()
    }
}

impl Registry {
    /// A registry for the devices of `driver`.
    pub fn new(driver: Arc<dyn Driver>) -> Result<Self> {
        let count = driver.device_count()?;
        crate::exit::install_hook();
        Ok(Self {
            driver,
            slots: RwLock::new(vec![None; count as usize]),
        })
    }

    /// A registry for the devices of `device`'s driver.
    pub fn for_device(device: &Device) -> Result<Self> {
        Self::new(device.driver().clone())
    }

    /// The process-wide registry of the CUDA driver, created on first use.
    /// [`Error::NoDriver`] (remembered) when there is no CUDA driver or GPU.
    pub fn cuda() -> Result<&'static Registry> {
        static CUDA: OnceLock<Result<Registry>> = OnceLock::new();
        CUDA.get_or_init(|| {
            let driver: Arc<dyn Driver> = CudaDriver::get()?;
            Registry::new(driver)
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// The driver this registry serves.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// Number of devices.
    pub fn device_count(&self) -> u32 {
        self.read().len() as u32
    }

    fn read(&self) -> RwLockReadGuard<'_, Vec<Option<SharedResource>>> {
        // Every write is a single slot assignment: a poisoned table is intact.
        self.slots.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Vec<Option<SharedResource>>> {
        self.slots.write().unwrap_or_else(|p| p.into_inner())
    }

    fn check_ordinal(&self, ordinal: u32) -> Result<()> {
        let count = self.device_count();
        if ordinal >= count {
            return Err(Error::NoSuchDevice {
                device: ordinal,
                count,
            });
        }
        Ok(())
    }

    fn initial(&self, ordinal: u32) -> Result<SharedResource> {
        let device = Device::new(self.driver.clone(), ordinal)?;
        Ok(Arc::new(DeviceResource::new(device)))
    }

    /// The resource of device `ordinal`.
    pub fn device_resource(&self, ordinal: u32) -> Result<SharedResource> {
        self.check_ordinal(ordinal)?;
        if let Some(Some(r)) = self.read().get(ordinal as usize) {
            return Ok(r.clone());
        }
        let fresh = self.initial(ordinal)?;
        let mut slots = self.write();
        let slot = &mut slots[ordinal as usize];
        // Another thread may have set or initialised it meanwhile: keep theirs.
        Ok(slot.get_or_insert(fresh).clone())
    }

    /// Makes `resource` the resource of device `ordinal`; returns the previous
    /// one. The resource must be of this registry's driver and of that device.
    pub fn set_device_resource(
        &self,
        ordinal: u32,
        resource: SharedResource,
    ) -> Result<SharedResource> {
        self.check_ordinal(ordinal)?;
        let d = resource.device();
        if !Arc::ptr_eq(d.driver(), &self.driver) || d.ordinal() != ordinal {
            return Err(Error::InvalidArgument(format!(
                "resource of {} device {} cannot serve {} device {ordinal} of this registry",
                d.backend(),
                d.ordinal(),
                self.driver.backend()
            )));
        }
        let previous = self.write()[ordinal as usize].replace(resource);
        match previous {
            Some(p) => Ok(p),
            None => self.initial(ordinal),
        }
    }

    /// Puts device `ordinal` back to a plain [`DeviceResource`]; returns the
    /// previous resource.
    pub fn reset_device_resource(&self, ordinal: u32) -> Result<SharedResource> {
        self.check_ordinal(ordinal)?;
        let fresh = self.initial(ordinal)?;
        let previous = self.write()[ordinal as usize].replace(fresh.clone());
        Ok(previous.unwrap_or(fresh))
    }

    /// The device current on this thread.
    pub fn current_device(&self) -> Result<u32> {
        self.driver.current_device()
    }

    /// The resource of the device current on this thread.
    pub fn current_device_resource(&self) -> Result<SharedResource> {
        self.device_resource(self.current_device()?)
    }

    /// Sets the resource of the device current on this thread; returns the
    /// previous one.
    pub fn set_current_device_resource(&self, resource: SharedResource) -> Result<SharedResource> {
        self.set_device_resource(self.current_device()?, resource)
    }

    /// Puts the current device back to a plain [`DeviceResource`]; returns the
    /// previous resource.
    pub fn reset_current_device_resource(&self) -> Result<SharedResource> {
        self.reset_device_resource(self.current_device()?)
    }
}

/// The CUDA registry's resource for the device current on this thread.
pub fn current_device_resource() -> Result<SharedResource> {
    Registry::cuda()?.current_device_resource()
}

/// Sets the CUDA registry's resource for the current device; returns the
/// previous one.
pub fn set_current_device_resource(resource: SharedResource) -> Result<SharedResource> {
    Registry::cuda()?.set_current_device_resource(resource)
}

/// The CUDA registry's resource for device `ordinal`.
pub fn device_resource(ordinal: u32) -> Result<SharedResource> {
    Registry::cuda()?.device_resource(ordinal)
}

/// Sets the CUDA registry's resource for device `ordinal`; returns the previous
/// one.
pub fn set_device_resource(ordinal: u32, resource: SharedResource) -> Result<SharedResource> {
    Registry::cuda()?.set_device_resource(ordinal, resource)
}

/// Puts the CUDA registry's device `ordinal` back to a plain
/// [`DeviceResource`]; returns the previous resource.
pub fn reset_device_resource(ordinal: u32) -> Result<SharedResource> {
    Registry::cuda()?.reset_device_resource(ordinal)
}

/// Puts the CUDA registry's current device back to a plain
/// [`DeviceResource`]; returns the previous resource.
pub fn reset_current_device_resource() -> Result<SharedResource> {
    Registry::cuda()?.reset_current_device_resource()
}
