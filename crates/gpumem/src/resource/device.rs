//! `DeviceResource`: device memory straight from the driver (`cuMemAlloc` /
//! `cuMemFree`). Every call is a trip through the driver, orders of
//! magnitude dearer than a pool's (`docs/decisions.md`); this is the
//! baseline and the usual upstream of the pools.
//!
//! The resource knows what it handed out (a sharded table, see
//! [`HandedOut`](super::HandedOut)): a free of another allocator's pointer,
//! a second free or a free with another size is [`Error::InvalidFree`] and
//! never reaches `cuMemFree`. That costs one table insert and one remove
//! per allocation, small next to the driver's call.
//!
//! Growable allocations ([`GrowInPlace`], through CUDA's virtual memory
//! management where the device has it) are its allocations too: freed,
//! checked and listed the same way, at their current size.
//!
//! [`Error::InvalidFree`]: crate::Error::InvalidFree

use std::sync::Arc;

use super::growable::{GrowInPlace, GrowableRanges};
use super::handed_out::HandedOut;
use super::{
    each_a_segment, on_no_stream, validate_request, Introspect, LiveBlock, MemoryResource,
    Properties, Segment, DEFAULT_ALIGNMENT,
};
use crate::device::Device;
use crate::driver::{DevicePtr, RawStream};
use crate::pool::stream_order::{self, streams::Progress};
use crate::stream::Stream;
use crate::{Error, Result};

/// Device memory from `cuMemAlloc`. Not stream-ordered: allocation and free are
/// synchronous in the driver, so the stream arguments are ignored. Clones
/// share what was handed out: memory allocated through one may be freed
/// through another.
///
/// So a pool built on a clone allocates its segments where the other clones
/// see them ([`live_blocks`](Self::live_blocks)), as an upstream is shared in
/// RMM. What keeps a clone from freeing a segment under the pool's blocks is
/// the table's rule: only the segment's base with its exact size frees it,
/// and no block the pool hands out is that pair unless it is the whole
/// segment. Unlike pinned host memory ([`PinnedPool`](crate::manager::PinnedPool)
/// takes a table of its own), device memory is never read or written by
/// safe host code here, so a segment freed that way is a fault on the
/// device, not undefined behaviour in the program: the design keeps the
/// sharing, and the test `a_pools_upstream_clone_sees_its_segments_and_
/// refuses_inexact_frees` pins it.
#[derive(Debug, Clone)]
pub struct DeviceResource {
    device: Device,
    /// What was handed out; `true` marks a growable allocation.
    handed_out: Arc<HandedOut<bool>>,
    growable: Arc<GrowableRanges>,
}

impl DeviceResource {
    /// A resource allocating on `device`.
    pub fn new(device: Device) -> Self {
        Self {
            device,
            handed_out: Arc::default(),
            growable: Arc::default(),
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

    /// Whether the live allocation at `ptr` is a growable one
    /// ([`GrowInPlace`]: a range of CUDA virtual memory mapped in pieces,
    /// PyTorch's expandable segments); `false` for a `cuMemAlloc` one and
    /// for a pointer that is no allocation's.
    pub fn is_growable(&self, ptr: DevicePtr) -> bool {
        self.growable.contains(ptr)
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
        self.handed_out.insert(p, bytes, false);
        Ok(p)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        crate::error::check_alignment(alignment)?;
        self.handed_out.free_with(ptr, bytes, |&growable| {
            // The memory goes back to the driver at once, and CUDA says its
            // free *may* wait for the device, not that it does: the work
            // the free is ordered after runs first. (A capturing stream's
            // work is a graph's, whose launches the caller orders.)
            use stream_order::streams;
            if !streams::capturing(stream) {
                match streams::query(stream) {
                    Progress::Idle => {}
                    Progress::Busy => streams::synchronize(stream)?,
                    Progress::NotHere | Progress::Unknown => {
                        streams::synchronize_device(&self.device)?
                    }
                }
            }
            if growable {
                return self.growable.free(&self.device, ptr.0);
            }
            let _relaxed = crate::graph::relaxed(&self.device);
            // SAFETY: `ptr` was just taken out of `handed_out`: a live
            // `cuMemAlloc` allocation of this resource, freed once, here, by
            // its owner's free; the work ordered before that free has run
            // (synchronized above) or is a graph's, whose launches the caller
            // orders.
            unsafe { self.device.driver().mem_free(self.device.ordinal(), ptr) }
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

    /// Offered where the device has CUDA's virtual memory management.
    fn grow_in_place(&self) -> Option<&dyn GrowInPlace> {
        self.growable
            .setup(&self.device)
            .is_ok()
            .then_some(self as &dyn GrowInPlace)
    }

    /// Every allocation, growable ones at their current size.
    fn driver_segments(&self) -> Option<Vec<Segment>> {
        Some(each_a_segment(self.live_blocks()))
    }
}

/// Each allocation is a segment of its own, and its live block; nothing is
/// cached, so nothing is free.
impl Introspect for DeviceResource {
    fn segments(&self) -> Vec<Segment> {
        each_a_segment(self.live_blocks())
    }
    fn live_blocks(&self) -> Vec<(LiveBlock, RawStream)> {
        on_no_stream(DeviceResource::live_blocks(self))
    }
    fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        self.allocation_size(ptr)
            .map(|bytes| bytes.next_multiple_of(DEFAULT_ALIGNMENT))
    }
    fn largest_free_block(&self) -> usize {
        0
    }
}

impl DeviceResource {
    /// `bytes` rounded up to the VMM granularity (out of memory on
    /// overflow).
    fn rounded(&self, bytes: usize) -> Result<usize> {
        let (gran, _) = self.growable.setup(&self.device)?;
        bytes
            .checked_next_multiple_of(gran)
            .ok_or_else(|| Error::oom(bytes))
    }

    /// Checks that `ptr` is a live growable allocation of `bytes`.
    fn check_growable(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        if self.handed_out.bytes_of(ptr) == Some(bytes) && self.growable.contains(ptr) {
            Ok(())
        } else {
            Err(Error::InvalidArgument(format!(
                "{:#x} is not a growable allocation of {bytes} bytes",
                ptr.0
            )))
        }
    }
}

impl GrowInPlace for DeviceResource {
    fn growth_granularity(&self) -> usize {
        self.growable
            .setup(&self.device)
            .map_or(DEFAULT_ALIGNMENT, |(g, _)| g)
    }

    fn allocate_growable(&self, bytes: usize, capacity: usize) -> Result<DevicePtr> {
        self.allocate_growable_in_pieces(bytes, capacity, usize::MAX)
    }

    fn allocate_growable_in_pieces(
        &self,
        bytes: usize,
        capacity: usize,
        max_piece: usize,
    ) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(Error::InvalidArgument(
                "a growable allocation needs more than 0 bytes".into(),
            ));
        }
        let mapped = self.rounded(bytes)?;
        let capacity = self.rounded(capacity.max(mapped))?;
        let (gran, _) = self.growable.setup(&self.device)?;
        let max_piece = max_piece.max(gran).checked_next_multiple_of(gran);
        let max_piece = max_piece.unwrap_or(usize::MAX - gran + 1);
        let base = self
            .growable
            .allocate(&self.device, mapped, capacity, max_piece)?;
        self.handed_out.insert(DevicePtr(base), bytes, true);
        Ok(DevicePtr(base))
    }

    fn grow(&self, ptr: DevicePtr, bytes: usize, new_bytes: usize) -> Result<()> {
        self.check_growable(ptr, bytes)?;
        if new_bytes <= bytes {
            return Ok(());
        }
        let mapped = self.rounded(new_bytes)?;
        self.growable.grow(&self.device, ptr.0, mapped)?;
        self.handed_out.resize(ptr, bytes, new_bytes)
    }

    fn shrink(&self, ptr: DevicePtr, bytes: usize, new_bytes: usize) -> Result<usize> {
        self.check_growable(ptr, bytes)?;
        if new_bytes == 0 || new_bytes >= bytes {
            return Ok(bytes);
        }
        let mapped = self.growable.shrink(&self.device, ptr.0, new_bytes)?;
        let kept = mapped.min(bytes);
        if kept < bytes {
            self.handed_out.resize(ptr, bytes, kept)?;
        }
        Ok(kept)
    }

    fn pieces(&self, ptr: DevicePtr, bytes: usize) -> Result<Vec<(usize, usize)>> {
        self.check_growable(ptr, bytes)?;
        self.growable.pieces(ptr.0)
    }

    fn split(&self, ptr: DevicePtr, bytes: usize, at: usize) -> Result<DevicePtr> {
        self.check_growable(ptr, bytes)?;
        if at == 0 || at >= bytes {
            return Err(Error::InvalidArgument(format!(
                "cannot split {:#x} of {bytes} bytes at {at}",
                ptr.0
            )));
        }
        let tail = self.growable.split(ptr.0, at)?;
        // Cannot fail: `ptr` was checked live with `bytes` under no other
        // call that changes it (the pool holds its lock).
        self.handed_out.resize(ptr, bytes, at)?;
        self.handed_out.insert(DevicePtr(tail), bytes - at, true);
        Ok(DevicePtr(tail))
    }

    fn recycle(
        &self,
        src: DevicePtr,
        src_bytes: usize,
        dst: DevicePtr,
        dst_bytes: usize,
    ) -> Result<()> {
        self.check_growable(src, src_bytes)?;
        self.check_growable(dst, dst_bytes)?;
        self.growable
            .recycle(&self.device, (src.0, src_bytes), (dst.0, dst_bytes))?;
        self.handed_out.take(src, src_bytes)?;
        self.handed_out
            .resize(dst, dst_bytes, dst_bytes + src_bytes)
    }
}
