//! `DeviceResource`: device memory straight from the driver (`cuMemAlloc` /
//! `cuMemFree`). Every call costs the driver's 50–75 µs on an H100; this is the
//! baseline and the usual upstream of the pools.

use super::{validate_request, MemoryResource, Properties, DEFAULT_ALIGNMENT};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::stream::Stream;
use crate::Result;

/// Device memory from `cuMemAlloc`. Not stream-ordered: allocation and free are
/// synchronous in the driver, so the stream arguments are ignored.
#[derive(Debug, Clone)]
pub struct DeviceResource {
    device: Device,
}

impl DeviceResource {
    /// A resource allocating on `device`.
    pub fn new(device: Device) -> Self {
        Self { device }
    }
}

impl MemoryResource for DeviceResource {
    fn allocate(&self, bytes: usize, alignment: usize, _stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        self.device.driver().mem_alloc(self.device.ordinal(), bytes)
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
        Properties::DEVICE
    }

    fn allocate_sync(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
        // cuMemAlloc is already synchronous: no stream to wait for.
        self.allocate(bytes, alignment, &self.device.default_stream())
    }
}
