//! `SamHeadroomResource`: system-allocated memory (SAM) for GPUs that access
//! pageable host memory (Grace Hopper and HMM systems), keeping a headroom of
//! device memory free.
//!
//! System memory migrates to the GPU on access but never back, so a program
//! that over-subscribes can starve other CUDA calls of device memory. This
//! resource allocates host memory and advises the driver where each allocation
//! should live: the part that fits in the device's free memory minus the
//! headroom prefers the GPU, the rest prefers the CPU. One `cuMemGetInfo` and
//! up to two `cuMemAdvise` calls per allocation.

use super::system::SystemResource;
use super::{MemoryResource, Properties, DEFAULT_ALIGNMENT};
use crate::device::Device;
use crate::driver::{DevicePtr, Location};
use crate::stream::Stream;
use crate::Result;

/// System memory with a device-memory headroom.
#[derive(Debug)]
pub struct SamHeadroomResource {
    system: SystemResource,
    headroom: usize,
}

impl SamHeadroomResource {
    /// Allocates host memory for `device`, leaving `headroom` bytes of device
    /// memory free for others.
    pub fn new(device: Device, headroom: usize) -> Result<Self> {
        Ok(Self {
            system: SystemResource::new(device)?,
            headroom,
        })
    }

    /// The headroom in bytes.
    pub fn headroom(&self) -> usize {
        self.headroom
    }

    /// Splits `bytes` into the part that should prefer the GPU and the part that
    /// should prefer the CPU, given the device's free memory.
    pub fn split(&self, bytes: usize, device_free: usize) -> (usize, usize) {
        let allowed = device_free.saturating_sub(self.headroom);
        let gpu = bytes.min(allowed) / DEFAULT_ALIGNMENT * DEFAULT_ALIGNMENT;
        (gpu, bytes - gpu)
    }
}

impl MemoryResource for SamHeadroomResource {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        let ptr = self.system.allocate(bytes, alignment, stream)?;
        if ptr.is_null() {
            return Ok(ptr);
        }
        let device = self.system.device();
        let advise = || -> Result<()> {
            let free = device.mem_info()?.free;
            let (gpu, cpu) = self.split(bytes, free);
            let driver = device.driver();
            if gpu > 0 {
                driver.mem_advise_preferred_location(
                    ptr,
                    gpu,
                    Location::Device(device.ordinal()),
                )?;
            }
            if cpu > 0 {
                driver.mem_advise_preferred_location(ptr.offset(gpu), cpu, Location::Host)?;
            }
            Ok(())
        };
        if let Err(e) = advise() {
            let _ = self.system.deallocate(ptr, bytes, alignment, stream);
            return Err(e);
        }
        Ok(ptr)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.system.deallocate(ptr, bytes, alignment, stream)
    }

    fn device(&self) -> &Device {
        self.system.device()
    }

    fn properties(&self) -> Properties {
        self.system.properties()
    }
}
