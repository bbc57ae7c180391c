//! `SystemResource`: ordinary host memory from the global allocator (RMM's
//! system_memory_resource). On systems where the GPU can access pageable memory
//! (HMM or ATS, "system allocated memory"), kernels can use it directly; the
//! properties say whether this device can.
//!
//! Each allocation is a zeroed heap buffer kept in the table of what was
//! handed out ([`HandedOut`](super::HandedOut)), so a free of a pointer this
//! resource never handed out, a double free or a size mismatch is an error
//! value rather than undefined behaviour.

use super::handed_out::HandedOut;
use super::{validate_request, MemoryResource, Properties};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::stream::Stream;
use crate::{Error, Result};

/// Largest alignment the system resource serves.
pub const SYSTEM_MAX_ALIGNMENT: usize = 1 << 20;

/// Host memory from the global allocator.
pub struct SystemResource {
    device: Device,
    device_accessible: bool,
    /// Each block owns its storage; the pointer handed out lies inside it,
    /// aligned.
    live: HandedOut<Vec<u8>>,
}

impl std::fmt::Debug for SystemResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SystemResource")
            .field("device", &self.device)
            .field("device_accessible", &self.device_accessible)
            .finish()
    }
}

impl SystemResource {
    /// Host memory for use with `device`; device-accessible when the device
    /// reports pageable memory access.
    pub fn new(device: Device) -> Result<Self> {
        let device_accessible = device.info()?.pageable_memory_access;
        Ok(Self {
            device,
            device_accessible,
            live: HandedOut::default(),
        })
    }

    /// Number of allocations not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.live.len()
    }
}

impl MemoryResource for SystemResource {
    fn allocate(&self, bytes: usize, alignment: usize, _stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, SYSTEM_MAX_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        let total = bytes
            .checked_add(alignment - 1)
            .filter(|t| *t <= isize::MAX as usize)
            .ok_or_else(|| Error::oom(bytes))?;
        let mut storage = Vec::new();
        storage
            .try_reserve_exact(total)
            .map_err(|_| Error::oom(bytes))?;
        storage.resize(total, 0);
        let base = storage.as_mut_ptr() as usize;
        let addr = DevicePtr(base.next_multiple_of(alignment) as u64);
        self.live.insert(addr, bytes, storage);
        Ok(addr)
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
        // Dropping the storage frees the memory.
        self.live.take(ptr, bytes).map(drop)
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn properties(&self) -> Properties {
        Properties {
            device_accessible: self.device_accessible,
            host_accessible: true,
        }
    }
}
