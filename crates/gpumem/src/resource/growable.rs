//! Allocations that grow and shrink in place at their end ([`GrowInPlace`]),
//! and the ranges behind [`DeviceResource`](super::DeviceResource)'s.
//!
//! Why: a pool that takes separate regions from its upstream strands the
//! free space at the end of each region (a block cannot span two), and
//! gives memory back only in whole regions. A pool whose heap is one
//! address range, grown at its end as it needs more, coalesces across what
//! would have been region boundaries (PyTorch's expandable segments do the
//! same). On the shared resnet50 log the pool's reserve over the live peak
//! goes from 1.17 to 1.00 that way (`bench/results/NOTES.md`).
//!
//! How (CUDA's virtual memory management): an address range of the whole
//! capacity is reserved up front (`cuMemAddressReserve`, address space
//! only); each growth creates physical memory for the new bytes
//! (`cuMemCreate`), maps it at the end (`cuMemMap`) and makes it accessible
//! (`cuMemSetAccess`), about one `cuMemAlloc`'s cost on an H100; a shrink
//! unmaps and releases the physical pieces past the new end. Pieces are
//! whole growths, so a shrink keeps any piece that straddles the new end.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::device::Device;
use crate::driver::{AccessFlags, DevicePtr, HandleType, RawPhys};
use crate::pool::stream_order::sync::lock;
use crate::{Error, Result};

/// A resource whose allocations can grow and shrink in place at their end,
/// keeping their address. A resource offers it through
/// [`MemoryResource::grow_in_place`](super::MemoryResource::grow_in_place).
///
/// An allocation made by [`allocate_growable`](Self::allocate_growable) is
/// an ordinary allocation of the resource for every other call: it is freed
/// with `deallocate`/`deallocate_sync` naming its current size, and counted
/// at its current size by the adaptors that pass this on (limiting,
/// statistics).
pub trait GrowInPlace: Send + Sync {
    /// The unit the physical memory comes in (the driver's VMM allocation
    /// granularity: 2 MiB on an H100); sizes are rounded up to it.
    fn growth_granularity(&self) -> usize;

    /// Allocates `bytes` (more than 0) at the start of an address range that
    /// can grow in place up to `capacity` bytes, usable by every stream when
    /// this returns.
    fn allocate_growable(&self, bytes: usize, capacity: usize) -> Result<DevicePtr>;

    /// Grows the growable allocation at `ptr` from `bytes` (its current
    /// size) to `new_bytes`, in place. Fails with [`Error::OutOfMemory`]
    /// when the memory or the range's capacity runs out, and then nothing
    /// changes.
    fn grow(&self, ptr: DevicePtr, bytes: usize, new_bytes: usize) -> Result<()>;

    /// Shrinks the growable allocation at `ptr` from `bytes` towards
    /// `new_bytes` (more than 0), giving back the physical memory past the
    /// new end. Returns the size kept: at least `new_bytes`, more where a
    /// piece of physical memory straddles `new_bytes` (see
    /// [`growth_granularity`](Self::growth_granularity)), `bytes` when
    /// nothing could go.
    fn shrink(&self, ptr: DevicePtr, bytes: usize, new_bytes: usize) -> Result<usize>;
}

/// The error of a growth call on an adaptor whose upstream cannot grow.
pub(crate) fn not_growable() -> Error {
    Error::unsupported("growing allocations in place (the upstream cannot)")
}

/// One growable allocation: its reserved range and the physical pieces
/// mapped from its start, in address order.
#[derive(Debug)]
struct Range {
    capacity: usize,
    /// (offset, bytes, handle) of each piece; the pieces tile `[0, mapped)`.
    pieces: Vec<(usize, usize, RawPhys)>,
}

impl Range {
    fn mapped(&self) -> usize {
        self.pieces.last().map_or(0, |&(o, b, _)| o + b)
    }
}

/// The growable allocations of a [`DeviceResource`](super::DeviceResource),
/// by base address.
#[derive(Debug, Default)]
pub(super) struct GrowableRanges {
    ranges: Mutex<HashMap<u64, Range>>,
    /// The VMM granularity and the peers that get access, read once.
    setup: OnceLock<std::result::Result<(usize, Vec<u32>), String>>,
}

impl GrowableRanges {
    /// The VMM granularity of `device` and the devices that can access its
    /// memory, asked of the driver once.
    pub(super) fn setup(&self, device: &Device) -> Result<(usize, &[u32])> {
        let s = self.setup.get_or_init(|| {
            let driver = device.driver();
            let me = device.ordinal();
            let gran = driver
                .vmm_granularity(me, false)
                .map_err(|e| e.to_string())?;
            if !gran.is_power_of_two() {
                return Err(format!("VMM granularity {gran} is not a power of two"));
            }
            let mut peers = Vec::new();
            for d in (0..driver.device_count().map_err(|e| e.to_string())?).filter(|&d| d != me) {
                if driver.can_access_peer(d, me).unwrap_or(false) {
                    peers.push(d);
                }
            }
            Ok((gran, peers))
        });
        match s {
            Ok((gran, peers)) => Ok((*gran, peers)),
            Err(e) => Err(Error::unsupported(format!(
                "growable device memory (CUDA's virtual memory management: {e})"
            ))),
        }
    }

    /// True when `ptr` starts a growable allocation.
    pub(super) fn contains(&self, ptr: DevicePtr) -> bool {
        lock(&self.ranges).contains_key(&ptr.0)
    }

    /// Reserves a range of `capacity` bytes and maps `bytes` at its start
    /// (both multiples of the granularity, `bytes` ≤ `capacity`).
    pub(super) fn allocate(&self, device: &Device, bytes: usize, capacity: usize) -> Result<u64> {
        let (gran, _) = self.setup(device)?;
        let _relaxed = crate::graph::relaxed(device);
        let base = device.driver().vmm_reserve(capacity, gran)?;
        let mut range = Range {
            capacity,
            pieces: Vec::new(),
        };
        if let Err(e) = self.map_piece(device, base.0, &mut range, bytes) {
            undo(|| device.driver().vmm_free_address(base, capacity));
            return Err(e);
        }
        lock(&self.ranges).insert(base.0, range);
        Ok(base.0)
    }

    /// Maps `bytes` more at the end of `range` (at `base`): one piece,
    /// all or nothing.
    fn map_piece(&self, device: &Device, base: u64, range: &mut Range, bytes: usize) -> Result<()> {
        let (_, peers) = self.setup(device)?;
        let driver = device.driver();
        let at = range.mapped();
        if at.checked_add(bytes).is_none_or(|end| end > range.capacity) {
            return Err(Error::oom(bytes));
        }
        let h = driver.vmm_create(device.ordinal(), bytes, HandleType::None.into())?;
        let ptr = DevicePtr(base + at as u64);
        if let Err(e) = driver.vmm_map(ptr, bytes, 0, h) {
            undo(|| driver.vmm_release(h));
            return Err(e);
        }
        let devices = std::iter::once(device.ordinal()).chain(peers.iter().copied());
        for d in devices {
            if let Err(e) = driver.vmm_set_access(ptr, bytes, d, AccessFlags::ReadWrite) {
                undo(|| driver.vmm_unmap(ptr, bytes));
                undo(|| driver.vmm_release(h));
                return Err(e);
            }
        }
        range.pieces.push((at, bytes, h));
        Ok(())
    }

    /// Grows the range at `base` so that `bytes` are mapped (a multiple of
    /// the granularity); nothing to do when they already are.
    pub(super) fn grow(&self, device: &Device, base: u64, bytes: usize) -> Result<()> {
        let mut ranges = lock(&self.ranges);
        let range = ranges
            .get_mut(&base)
            .ok_or_else(|| Error::InvalidArgument(format!("{base:#x} is not growable")))?;
        let mapped = range.mapped();
        if bytes <= mapped {
            return Ok(());
        }
        let _relaxed = crate::graph::relaxed(device);
        self.map_piece(device, base, range, bytes - mapped)
    }

    /// Unmaps and releases the pieces of the range at `base` that lie at or
    /// past `keep` bytes; returns the bytes still mapped.
    pub(super) fn shrink(&self, device: &Device, base: u64, keep: usize) -> Result<usize> {
        let mut ranges = lock(&self.ranges);
        let range = ranges
            .get_mut(&base)
            .ok_or_else(|| Error::InvalidArgument(format!("{base:#x} is not growable")))?;
        let _relaxed = crate::graph::relaxed(device);
        let driver = device.driver();
        let before = range.mapped();
        while let Some(&(at, bytes, h)) = range.pieces.last() {
            if at < keep {
                break;
            }
            let ptr = DevicePtr(base + at as u64);
            if let Err(e) = retried(|| driver.vmm_unmap(ptr, bytes)) {
                // What was given back stays given back.
                return if range.mapped() < before {
                    Ok(range.mapped())
                } else {
                    Err(e)
                };
            }
            range.pieces.pop();
            // Unmapped, the piece is no longer reachable: whatever its
            // release says, it is not the allocation's any more.
            undo(|| driver.vmm_release(h));
        }
        Ok(range.mapped())
    }

    /// Unmaps and releases the whole range at `base`, and frees its
    /// addresses.
    pub(super) fn free(&self, device: &Device, base: u64) -> Result<()> {
        let mut ranges = lock(&self.ranges);
        let Some(range) = ranges.remove(&base) else {
            return Err(Error::InvalidArgument(format!("{base:#x} is not growable")));
        };
        let _relaxed = crate::graph::relaxed(device);
        let driver = device.driver();
        let mapped = range.mapped();
        if mapped > 0 {
            if let Err(e) = retried(|| driver.vmm_unmap(DevicePtr(base), mapped)) {
                // Still mapped, still usable: the allocation stays.
                ranges.insert(base, range);
                return Err(e);
            }
        }
        // Unmapped, the allocation is gone whatever follows: a release or
        // an address free that fails twice leaks in the driver (and says
        // so), nothing the caller could use.
        for &(_, _, h) in &range.pieces {
            undo(|| driver.vmm_release(h));
        }
        undo(|| driver.vmm_free_address(DevicePtr(base), range.capacity));
        Ok(())
    }
}

/// `call`, tried once more if it fails (a driver call that failed once may
/// not fail again, and what it gives back matters).
fn retried(mut call: impl FnMut() -> Result<()>) -> Result<()> {
    call().or_else(|_| call())
}

/// A driver call that undoes or ends something that can no longer be
/// used: tried twice, and a failure is logged, not returned.
fn undo(call: impl FnMut() -> Result<()>) {
    if let Err(e) = retried(call) {
        log::error!("growable device memory: could not give back: {e}");
    }
}
