//! `SystemResource`: ordinary host memory from the global allocator (RMM's
//! system_memory_resource). On systems where the GPU can access pageable memory
//! (HMM or ATS, "system allocated memory"), kernels can use it directly; the
//! properties say whether this device can.
//!
//! Each allocation is a zeroed heap buffer kept in a table, so a free of a
//! pointer this resource never handed out, a double free or a size mismatch is an
//! error value rather than undefined behaviour.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{validate_request, MemoryResource, Properties};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::stream::Stream;
use crate::{Error, FreeError, Result};

/// Largest alignment the system resource serves.
pub const SYSTEM_MAX_ALIGNMENT: usize = 1 << 20;

struct HostBlock {
    /// Owns the memory; the pointer handed out lies inside it, aligned.
    _storage: Vec<u8>,
    bytes: usize,
}

/// Host memory from the global allocator.
pub struct SystemResource {
    device: Device,
    device_accessible: bool,
    live: Mutex<HashMap<u64, HostBlock>>,
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
            live: Mutex::new(HashMap::new()),
        })
    }

    /// Number of allocations not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, HostBlock>> {
        // A panic while holding the lock cannot leave the table inconsistent
        // (each operation is one insert or remove), so poisoning is ignored.
        self.live.lock().unwrap_or_else(|p| p.into_inner())
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
        let addr = base.next_multiple_of(alignment) as u64;
        self.lock().insert(
            addr,
            HostBlock {
                _storage: storage,
                bytes,
            },
        );
        Ok(DevicePtr(addr))
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
        _stream: &Stream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let mut live = self.lock();
        match live.get(&ptr.0) {
            None => Err(Error::InvalidFree {
                ptr: ptr.0,
                reason: FreeError::Unknown,
            }),
            Some(b) if b.bytes != bytes => Err(Error::InvalidFree {
                ptr: ptr.0,
                reason: FreeError::SizeMismatch {
                    allocated: b.bytes,
                    freed: bytes,
                },
            }),
            Some(_) => {
                live.remove(&ptr.0);
                Ok(())
            }
        }
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
