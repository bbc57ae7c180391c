//! `DeviceResource`: device memory straight from the driver (`cuMemAlloc` /
//! `cuMemFree`). Every call costs the driver tens of µs on an H100
//! (`bench/results/NOTES.md`); this is the baseline and the usual upstream of
//! the pools.
//!
//! The resource knows what it handed out (a sharded table, see
//! [`HandedOut`](super::HandedOut)): a free of another allocator's pointer,
//! a second free or a free with another size is [`Error::InvalidFree`] and
//! never reaches `cuMemFree`. That costs one table insert and one remove
//! (tens of ns) per allocation, next to the driver's tens of µs.
//!
//! [`Error::InvalidFree`]: crate::Error::InvalidFree

use std::sync::Arc;

use super::handed_out::HandedOut;
use super::{validate_request, LiveBlock, MemoryResource, Properties, DEFAULT_ALIGNMENT};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::stream::Stream;
use crate::Result;

/// Device memory from `cuMemAlloc`. Not stream-ordered: allocation and free are
/// synchronous in the driver, so the stream arguments are ignored. Clones
/// share what was handed out: memory allocated through one may be freed
/// through another.
#[derive(Debug, Clone)]
pub struct DeviceResource {
    device: Device,
    handed_out: Arc<HandedOut>,
}

impl DeviceResource {
    /// A resource allocating on `device`.
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

    /// Bytes handed out and not yet freed, as asked for.
    pub fn live_bytes(&self) -> usize {
        self.handed_out.bytes()
    }

    /// Every allocation handed out and not yet freed, in address order: each
    /// is one `cuMemAlloc` (a segment the driver holds for this resource),
    /// with the bytes asked for and those rounded up to 256 bytes (the
    /// alignment `cuMemAlloc` guarantees). O(allocations), for snapshots.
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        self.handed_out.live_blocks()
    }

    /// The bytes asked for by the live allocation at `ptr`, if it is one.
    pub fn allocation_size(&self, ptr: DevicePtr) -> Option<usize> {
        self.handed_out.bytes_of(ptr)
    }
}

impl MemoryResource for DeviceResource {
    fn allocate(&self, bytes: usize, alignment: usize, _stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        let _relaxed = crate::graph::relaxed(&self.device);
        let p = self
            .device
            .driver()
            .mem_alloc(self.device.ordinal(), bytes)?;
        self.handed_out.insert(p, bytes, ());
        Ok(p)
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
        self.handed_out.free_with(ptr, bytes, |_| {
            let _relaxed = crate::graph::relaxed(&self.device);
            self.device.driver().mem_free(self.device.ordinal(), ptr)
        })
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
