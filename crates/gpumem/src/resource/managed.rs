//! `ManagedResource`: unified memory (`cuMemAllocManaged`), migrated between host
//! and device on demand by the driver.
//!
//! Like [`DeviceResource`](super::DeviceResource), it knows what it handed
//! out: foreign, double and wrong-size frees are errors and never reach
//! `cuMemFree` (one table insert and remove per allocation).

use std::sync::Arc;

use super::handed_out::HandedOut;
use super::{validate_request, MemoryResource, Properties, DEFAULT_ALIGNMENT};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::stream::Stream;
use crate::Result;

/// Managed memory, attached globally. Clones share what was handed out.
#[derive(Debug, Clone)]
pub struct ManagedResource {
    device: Device,
    handed_out: Arc<HandedOut>,
}

impl ManagedResource {
    /// Managed memory allocated with `device` current.
    pub fn new(device: Device) -> Self {
        Self {
            device,
            handed_out: Arc::default(),
        }
    }

    /// Allocations handed out and not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.handed_out.len()
    }
}

impl MemoryResource for ManagedResource {
    fn allocate(&self, bytes: usize, alignment: usize, _stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        let p = self
            .device
            .driver()
            .mem_alloc_managed(self.device.ordinal(), bytes)?;
        self.handed_out.insert(p, bytes, ());
        Ok(p)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        _stream: &Stream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        crate::error::check_alignment(alignment)?;
        self.handed_out.free_with(ptr, bytes, |_| {
            // SAFETY: `ptr` was just taken out of `handed_out`: a live
            // `cuMemAllocManaged` allocation of this resource, freed once,
            // here, by its owner's free. Work still queued on it was enqueued
            // under its own contract (memsets and copies of host-accessible
            // memory keep it valid until they have run).
            unsafe { self.device.driver().mem_free(self.device.ordinal(), ptr) }
        })
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn properties(&self) -> Properties {
        Properties::HOST_AND_DEVICE
    }
}
