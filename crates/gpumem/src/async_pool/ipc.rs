//! Sharing a pool between processes: POSIX file descriptors for pools,
//! 64-byte records for allocations, and descriptor passing over Unix sockets.
//!
//! The exporting process builds its pool with [`HandleType::PosixFd`], exports
//! it once with [`MemPool::export_fd`] and each allocation to share with
//! [`MemPool::export_pointer`]. It sends the descriptor over a Unix socket
//! ([`send_fd`], `SCM_RIGHTS`; a descriptor is only meaningful inside its
//! process) and the records by any means. The importing process opens the
//! pool with [`AsyncResource::import_fd`], maps allocations with
//! [`ImportedPool::import_pointer`] and frees each mapping with
//! [`ImportedPool::free_pointer`]. An imported pool cannot allocate.
//!
//! Ordering (CUDA's rules): the importer must not touch the memory before the
//! exporter's allocation has completed on its stream (the exporter
//! synchronizes before sending), and must free its mapping, completed, before
//! the exporter frees the allocation.
//!
//! On the simulated device, export and import work within one process only
//! (the simulator lives in the process); across processes they need CUDA.

use std::os::fd::{AsFd, OwnedFd};

use super::async_resource::AsyncResource;
use super::attributes::MemPool;
use super::{map_not_supported, require_pools};
use crate::device::Device;
use crate::driver::{AccessFlags, DevicePtr, HandleType, Location, PoolPtrExport};
use crate::resource::{HandedOut, Properties};
use crate::stream::Stream;
use crate::{Error, Result};

pub use crate::os::{recv_fd, send_fd};

impl MemPool {
    fn require_exportable(&self, what: &str) -> Result<()> {
        if self.handle_type() == HandleType::PosixFd {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{what}: the pool was not created with HandleType::PosixFd (it has {:?})",
                self.handle_type()
            )))
        }
    }

    /// Exports the pool as a POSIX file descriptor
    /// (`cuMemPoolExportToShareableHandle`) for another process to import.
    /// Only pools built with [`HandleType::PosixFd`] can be exported.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        self.require_exportable("export_fd")?;
        // SAFETY: the pool is live while `self` is (see `MemPool`).
        unsafe { self.device().driver().mempool_export_fd(self.raw()) }
    }

    /// The record that lets an importer of this pool map allocation `ptr`
    /// (`cuMemPoolExportPointer`). `ptr` must be a live allocation of this pool
    /// (the start of it, as allocate returned it).
    pub fn export_pointer(&self, ptr: DevicePtr) -> Result<PoolPtrExport> {
        self.require_exportable("export_pointer")?;
        if ptr.is_null() {
            return Err(Error::InvalidArgument(
                "export_pointer: null pointer (zero-byte allocations cannot be shared)".into(),
            ));
        }
        self.device().driver().mempool_export_pointer(ptr)
    }
}

impl AsyncResource {
    /// Opens a pool another process exported as a descriptor
    /// (`cuMemPoolImportFromShareableHandle`), on `device`. The descriptor is
    /// only read; the caller still owns it and may close it afterwards.
    pub fn import_fd(device: Device, fd: impl AsFd) -> Result<ImportedPool> {
        let info = require_pools(&device)?;
        let ordinal = device.ordinal();
        if !info.posix_fd_ipc {
            return Err(Error::unsupported(format!(
                "POSIX file descriptor IPC handles for memory pools on device {ordinal}"
            )));
        }
        let driver = device.driver();
        driver.set_current_device(ordinal)?;
        let raw = driver.mempool_import_fd(fd.as_fd()).map_err(|e| {
            map_not_supported(e, || {
                format!("importing memory pools from descriptors on device {ordinal}")
            })
        })?;
        let pool = MemPool::new(
            device,
            raw,
            true,
            Location::Device(ordinal),
            HandleType::PosixFd,
            Properties::DEVICE,
            0,
        )
        .mark_imported();
        // The importing device needs read-write access to map allocations (as
        // CUDA's IPC sample does): grant it where the driver says it lacks it.
        if pool.access(ordinal)? != AccessFlags::ReadWrite {
            pool.grant_access(ordinal, AccessFlags::ReadWrite)?;
        }
        Ok(ImportedPool {
            pool,
            mappings: HandedOut::default(),
        })
    }
}

/// A pool opened from another process's descriptor. It maps that process's
/// exported allocations and cannot allocate itself. Its handle is released on
/// drop (the exporter's pool lives on).
#[derive(Debug)]
pub struct ImportedPool {
    pool: MemPool,
    /// The mappings [`ImportedPool::import_pointer`] made and
    /// [`ImportedPool::free_pointer`] has not freed: only those are freed.
    mappings: HandedOut,
}

impl ImportedPool {
    /// Maps an allocation the exporter shared (`cuMemPoolImportPointer`). The
    /// returned address is this process's mapping; free it with
    /// [`ImportedPool::free_pointer`] before the exporter frees the allocation.
    pub fn import_pointer(&self, export: &PoolPtrExport) -> Result<DevicePtr> {
        // SAFETY: the pool is live while `self` is (see `MemPool`), and it was
        // imported from a descriptor.
        let ptr = unsafe {
            self.pool
                .device()
                .driver()
                .mempool_import_pointer(self.pool.raw(), export)
        }?;
        self.mappings.insert(ptr, 0, ());
        Ok(ptr)
    }

    /// Unmaps an imported allocation once the work enqueued on `stream` so far
    /// has run (`cuMemFreeAsync`; CUDA also allows `cuMemFree`). Synchronize
    /// `stream` before telling the exporter it may free the allocation. A
    /// pointer this pool did not import, or freed already, is refused with
    /// [`Error::InvalidFree`] and the driver is not called.
    pub fn free_pointer(&self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let s = stream.raw_on(self.pool.device())?;
        self.mappings.take_any(ptr)?;
        // SAFETY: `ptr` was just taken out of `mappings`: a mapping this pool
        // imported and that is freed once, here, in `stream`'s order (the
        // caller's work on it is enqueued before). The stream is live while
        // borrowed and this driver's (`raw_on` checked).
        unsafe { self.pool.device().driver().mem_free_async(ptr, s) }
            .inspect_err(|_| self.mappings.restore(ptr, 0, ()))
    }

    /// The imported pool (its attributes, as far as the driver reports them
    /// for imported pools).
    pub fn pool(&self) -> &MemPool {
        &self.pool
    }

    /// The device the pool was imported on.
    pub fn device(&self) -> &Device {
        self.pool.device()
    }
}
