//! `PinnedHostResource`: page-locked host memory (`cuMemHostAlloc`), which the
//! device reads and writes directly and copies from several times faster
//! than pageable memory. Allocating it is slow, far slower per byte than
//! device memory (the measurements: `docs/decisions.md`): pool it.
//!
//! Like [`DeviceResource`](super::DeviceResource), it knows what it handed
//! out: foreign, double and wrong-size frees are errors and never reach
//! `cuMemFreeHost` (one table insert and remove per allocation).

use std::sync::Arc;

use super::handed_out::HandedOut;
use super::{validate_request, MemoryResource, Properties, DEFAULT_ALIGNMENT};
use crate::device::Device;
use crate::driver::{DevicePtr, HostAllocFlags};
use crate::stream::Stream;
use crate::Result;

/// Pinned host memory. Portable and device-mapped, not write-combined, unless
/// other flags are given. Clones share what was handed out (a
/// [`PinnedPool`](crate::manager::PinnedPool) made with one does not: see
/// [`PinnedPool::new`](crate::manager::PinnedPool::new)).
#[derive(Debug, Clone)]
pub struct PinnedHostResource {
    device: Device,
    flags: HostAllocFlags,
    handed_out: Arc<HandedOut>,
}

impl PinnedHostResource {
    /// Default flags: portable and mapped, not write-combined (write-combined
    /// memory is very slow for the host to read).
    pub fn new(device: Device) -> Self {
        Self::with_flags(
            device,
            HostAllocFlags {
                portable: true,
                device_map: true,
                write_combined: false,
            },
        )
    }

    /// Explicit `cuMemHostAlloc` flags.
    pub fn with_flags(device: Device, flags: HostAllocFlags) -> Self {
        Self {
            device,
            flags,
            handed_out: Arc::default(),
        }
    }

    /// The same memory (device and flags) with a table of its own of what
    /// was handed out: this resource and its clones cannot free what the
    /// copy hands out, nor the copy theirs. A pool that carves the memory
    /// into blocks pins through one, so no one else can unpin a region
    /// under its blocks.
    pub(crate) fn with_own_table(&self) -> Self {
        Self::with_flags(self.device.clone(), self.flags)
    }

    /// Allocations handed out and not yet freed.
    pub fn live_allocations(&self) -> usize {
        self.handed_out.len()
    }

    /// The flags used for allocation.
    pub fn flags(&self) -> HostAllocFlags {
        self.flags
    }
}

impl MemoryResource for PinnedHostResource {
    fn allocate(&self, bytes: usize, alignment: usize, _stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        let p = self
            .device
            .driver()
            .mem_alloc_host(self.device.ordinal(), bytes, self.flags)?;
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
            // `cuMemHostAlloc` allocation of this resource, freed once, here,
            // by its owner's free. The resource hands out addresses, never
            // references, and work still queued on the memory was enqueued
            // under its own contract (memsets and copies of host memory keep
            // it valid until they have run).
            unsafe { self.device.driver().mem_free_host(ptr) }
        })
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn properties(&self) -> Properties {
        Properties::HOST_AND_DEVICE
    }
}
