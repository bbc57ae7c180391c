//! `ManagedResource`: unified memory (`cuMemAllocManaged`), migrated between host
//! and device on demand by the driver.

use super::{validate_request, MemoryResource, Properties, DEFAULT_ALIGNMENT};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::stream::Stream;
use crate::Result;

/// Managed memory, attached globally.
#[derive(Debug, Clone)]
pub struct ManagedResource {
    device: Device,
}

impl ManagedResource {
    /// Managed memory allocated with `device` current.
    pub fn new(device: Device) -> Self {
        Self { device }
    }
}

impl MemoryResource for ManagedResource {
    fn allocate(&self, bytes: usize, alignment: usize, _stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        self.device
            .driver()
            .mem_alloc_managed(self.device.ordinal(), bytes)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        _bytes: usize,
        _alignment: usize,
        _stream: &Stream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        self.device.driver().mem_free(self.device.ordinal(), ptr)
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn properties(&self) -> Properties {
        Properties::HOST_AND_DEVICE
    }
}
