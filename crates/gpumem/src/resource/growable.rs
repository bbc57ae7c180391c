//! Allocations that grow and shrink in place at their end ([`GrowInPlace`]),
//! and the ranges behind [`DeviceResource`](super::DeviceResource)'s.
//!
//! Why: a pool that takes separate regions from its upstream strands the
//! free space at the end of each region (a block cannot span two), and
//! gives memory back only in whole regions. A pool whose heap is one
//! address range, grown at its end as it needs more, coalesces across what
//! would have been region boundaries (PyTorch's expandable segments do the
//! same), which on the shared resnet50 log brings the pool's reserve down
//! to its live peak (`docs/decisions.md`).
//!
//! How (CUDA's virtual memory management): an address range of the whole
//! capacity is reserved up front (`cuMemAddressReserve`, address space
//! only); each growth creates physical memory for the new bytes
//! (`cuMemCreate`), maps it at the end (`cuMemMap`) and makes it accessible
//! (`cuMemSetAccess`), about one `cuMemAlloc`'s cost on an H100; a shrink
//! unmaps and releases the physical pieces past the new end.
//!
//! A range allocated by [`allocate_growable_in_pieces`] maps each growth in
//! pieces of at most the size asked for (a pool takes [`PIECE_GRANULES`]
//! granules), cut from the growth's start, so that a
//! free stretch in the middle of the range holds whole pieces. A caller can
//! then [`split`] the range at a piece's edges and [`recycle`] the piece: unmap it there and map the same
//! memory at the end of a range that must grow, instead of creating more
//! (`docs/decisions.md`, "Expandable heaps: recycling pieces"). The
//! ranges cut from one reservation share it; its addresses go back with
//! the last of them.
//!
//! [`allocate_growable_in_pieces`]: GrowInPlace::allocate_growable_in_pieces
//! [`split`]: GrowInPlace::split
//! [`recycle`]: GrowInPlace::recycle

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::device::Device;
use crate::driver::{AccessFlags, DevicePtr, Driver, HandleType, RawPhys};
use crate::pool::stream_order::sync::lock;
use crate::{Error, Result};

/// Granules a piece of a pool's growable range spans at most when the pool
/// recycles pieces: the unit a free stretch can be recycled in. Smaller
/// pieces recycle a little more but cost a `cuMemCreate`, a `cuMemMap` and
/// access for each, so the reserve barely drops while the driver calls
/// grow (`docs/decisions.md`).
pub const PIECE_GRANULES: usize = 32;

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

    /// [`allocate_growable`](Self::allocate_growable), mapping this growth
    /// and every later one in pieces of at most `max_piece` bytes (rounded
    /// up to the granularity), the units [`recycle`](Self::recycle) moves.
    /// A resource that cannot cut growths maps whole ones.
    fn allocate_growable_in_pieces(
        &self,
        bytes: usize,
        capacity: usize,
        max_piece: usize,
    ) -> Result<DevicePtr> {
        let _ = max_piece;
        self.allocate_growable(bytes, capacity)
    }

    /// Grows the growable allocation at `ptr` from `bytes` (its current
    /// size) to `new_bytes`, in place. Fails with [`Error::OutOfMemory`]
    /// when the memory or the range's capacity runs out, and then nothing
    /// changes.
    fn grow(&self, ptr: DevicePtr, bytes: usize, new_bytes: usize) -> Result<()>;

    /// Shrinks the growable allocation at `ptr` from `bytes` towards
    /// `new_bytes` (more than 0), giving back the physical memory past the
    /// new end, which the caller must know no work still uses. Returns the size kept: at least `new_bytes`, more where a
    /// piece of physical memory straddles `new_bytes` (see
    /// [`pieces`](Self::pieces)), `bytes` when nothing could go.
    fn shrink(&self, ptr: DevicePtr, bytes: usize, new_bytes: usize) -> Result<usize>;

    /// The pieces of physical memory of the growable allocation at `ptr` of
    /// `bytes`, as `(offset, bytes)` from its start, in address order: the
    /// cuts at which it can be [`split`](Self::split), and the units a
    /// [`recycle`](Self::recycle) moves. [`Error::Unsupported`] from a
    /// resource that cannot split.
    fn pieces(&self, ptr: DevicePtr, bytes: usize) -> Result<Vec<(usize, usize)>> {
        let _ = (ptr, bytes);
        Err(Error::unsupported("splitting growable allocations"))
    }

    /// Splits the growable allocation at `ptr` of `bytes` at `at`, a cut
    /// between two of its [`pieces`](Self::pieces): it keeps its first `at`
    /// bytes (and can no longer grow), and the rest becomes an allocation
    /// of `bytes - at` at `ptr + at`, returned, which grows as the whole
    /// did. No memory moves; nothing changes on an error.
    fn split(&self, ptr: DevicePtr, bytes: usize, at: usize) -> Result<DevicePtr> {
        let _ = (ptr, bytes, at);
        Err(Error::unsupported("splitting growable allocations"))
    }

    /// Moves the memory of `src`, a growable allocation of `src_bytes` that
    /// is one piece, to the end of `dst`, a growable allocation of
    /// `dst_bytes` (its whole pieces): `src` is unmapped and ends, and `dst`
    /// grows by `src_bytes` with the same physical memory. What `src` held
    /// is lost; the caller must know no work still uses it. On an error
    /// `dst` is unchanged and `src` is still an allocation, to be freed
    /// (its memory may be gone when even the undo failed).
    fn recycle(
        &self,
        src: DevicePtr,
        src_bytes: usize,
        dst: DevicePtr,
        dst_bytes: usize,
    ) -> Result<()> {
        let _ = (src, src_bytes, dst, dst_bytes);
        Err(Error::unsupported("recycling growable allocations"))
    }
}

/// The error of a growth call on an adaptor whose upstream cannot grow.
pub(crate) fn not_growable() -> Error {
    Error::unsupported("growing allocations in place (the upstream cannot)")
}

/// A piece of physical memory mapped in a range.
#[derive(Debug, Clone, Copy)]
struct Piece {
    /// Offset from the range's start.
    at: usize,
    bytes: usize,
    handle: RawPhys,
    /// False once unmapped by a recycle whose undo failed: nothing to unmap
    /// or release any more.
    mapped: bool,
}

/// One growable allocation: where it lies in its reservation and the
/// physical pieces mapped from its start, in address order.
#[derive(Debug)]
struct Range {
    /// Base of the reservation the range lies in.
    reservation: u64,
    /// Bytes the range may span: up to its reservation's end for the last
    /// range cut from it, its own length for the others.
    capacity: usize,
    /// Most bytes a piece mapped by a growth spans.
    max_piece: usize,
    /// The pieces tile `[0, mapped)`.
    pieces: Vec<Piece>,
}

impl Range {
    fn mapped(&self) -> usize {
        self.pieces.last().map_or(0, |p| p.at + p.bytes)
    }
}

/// An address range reserved for growable allocations, and how many of
/// them lie in it.
#[derive(Debug)]
struct Reservation {
    bytes: usize,
    ranges: usize,
}

#[derive(Debug, Default)]
struct Tables {
    /// Growable allocations by base address.
    ranges: HashMap<u64, Range>,
    /// Reservations by base address.
    reservations: HashMap<u64, Reservation>,
}

/// The growable allocations of a [`DeviceResource`](super::DeviceResource),
/// by base address.
#[derive(Debug, Default)]
pub(super) struct GrowableRanges {
    tables: Mutex<Tables>,
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
        lock(&self.tables).ranges.contains_key(&ptr.0)
    }

    /// Reserves a range of `capacity` bytes and maps `bytes` at its start
    /// (both multiples of the granularity, `bytes` ≤ `capacity`), in pieces
    /// of at most `max_piece` bytes (a multiple of the granularity).
    pub(super) fn allocate(
        &self,
        device: &Device,
        bytes: usize,
        capacity: usize,
        max_piece: usize,
    ) -> Result<u64> {
        let (gran, _) = self.setup(device)?;
        let _relaxed = crate::graph::relaxed(device);
        let base = device.driver().vmm_reserve(capacity, gran)?;
        let mut range = Range {
            reservation: base.0,
            capacity,
            max_piece,
            pieces: Vec::new(),
        };
        if let Err(e) = self.map_pieces(device, base.0, &mut range, bytes) {
            undo(|| Vmm::of(device).free_address(base, capacity));
            return Err(e);
        }
        let mut t = lock(&self.tables);
        t.ranges.insert(base.0, range);
        t.reservations.insert(
            base.0,
            Reservation {
                bytes: capacity,
                ranges: 1,
            },
        );
        Ok(base.0)
    }

    /// Maps `bytes` more at the end of `range` (at `base`), in pieces of at
    /// most the range's `max_piece` from its current end (a growth smaller
    /// than that stays one piece): all or nothing. Access is set once over
    /// the whole span.
    fn map_pieces(
        &self,
        device: &Device,
        base: u64,
        range: &mut Range,
        bytes: usize,
    ) -> Result<()> {
        let (_, peers) = self.setup(device)?;
        let driver = device.driver();
        let vmm = Vmm::of(device);
        let start = range.mapped();
        if start
            .checked_add(bytes)
            .is_none_or(|end| end > range.capacity)
        {
            return Err(Error::oom(bytes));
        }
        let cap = range.max_piece as u64;
        let made = range.pieces.len();
        let undo_made = |range: &mut Range| {
            for p in range.pieces.drain(made..) {
                undo(|| vmm.unmap(DevicePtr(base + p.at as u64), p.bytes));
                undo(|| vmm.release(p.handle));
            }
        };
        let end = base + (start + bytes) as u64;
        let mut at = base + start as u64;
        while at < end {
            let cut = at.saturating_add(cap).min(end);
            let len = (cut - at) as usize;
            let h = match driver.vmm_create(device.ordinal(), len, HandleType::None.into()) {
                Ok(h) => h,
                Err(e) => {
                    undo_made(range);
                    return Err(e);
                }
            };
            if let Err(e) = vmm.map(DevicePtr(at), len, h) {
                undo(|| vmm.release(h));
                undo_made(range);
                return Err(e);
            }
            range.pieces.push(Piece {
                at: (at - base) as usize,
                bytes: len,
                handle: h,
                mapped: true,
            });
            at = cut;
        }
        if let Err(e) = set_access(device, peers, DevicePtr(base + start as u64), bytes) {
            undo_made(range);
            return Err(e);
        }
        Ok(())
    }

    /// Grows the range at `base` so that `bytes` are mapped (a multiple of
    /// the granularity); nothing to do when they already are.
    pub(super) fn grow(&self, device: &Device, base: u64, bytes: usize) -> Result<()> {
        let mut t = lock(&self.tables);
        let range = range_mut(&mut t, base)?;
        let mapped = range.mapped();
        if bytes <= mapped {
            return Ok(());
        }
        let _relaxed = crate::graph::relaxed(device);
        self.map_pieces(device, base, range, bytes - mapped)
    }

    /// Unmaps and releases the pieces of the range at `base` that lie at or
    /// past `keep` bytes; returns the bytes still mapped.
    pub(super) fn shrink(&self, device: &Device, base: u64, keep: usize) -> Result<usize> {
        let mut t = lock(&self.tables);
        let range = range_mut(&mut t, base)?;
        let _relaxed = crate::graph::relaxed(device);
        let vmm = Vmm::of(device);
        let before = range.mapped();
        while let Some(&p) = range.pieces.last() {
            if p.at < keep {
                break;
            }
            if p.mapped {
                let ptr = DevicePtr(base + p.at as u64);
                if let Err(e) = retried(|| vmm.unmap(ptr, p.bytes)) {
                    // What was given back stays given back.
                    return if range.mapped() < before {
                        Ok(range.mapped())
                    } else {
                        Err(e)
                    };
                }
            }
            range.pieces.pop();
            // Unmapped, the piece is no longer reachable: whatever its
            // release says, it is not the allocation's any more.
            if p.mapped {
                undo(|| vmm.release(p.handle));
            }
        }
        Ok(range.mapped())
    }

    /// The pieces of the range at `base` as `(offset, bytes)`.
    pub(super) fn pieces(&self, base: u64) -> Result<Vec<(usize, usize)>> {
        let mut t = lock(&self.tables);
        let range = range_mut(&mut t, base)?;
        Ok(range.pieces.iter().map(|p| (p.at, p.bytes)).collect())
    }

    /// Splits the range at `base` at `at`, an edge between two of its
    /// pieces; returns the base of the second part.
    pub(super) fn split(&self, base: u64, at: usize) -> Result<u64> {
        let mut t = lock(&self.tables);
        let range = range_mut(&mut t, base)?;
        let Some(cut) = range
            .pieces
            .iter()
            .position(|p| p.at == at)
            .filter(|&i| i > 0)
        else {
            return Err(Error::InvalidArgument(format!(
                "{at} bytes into {base:#x} is not an edge between two of its pieces"
            )));
        };
        let mut pieces = range.pieces.split_off(cut);
        for p in &mut pieces {
            p.at -= at;
        }
        let tail = Range {
            reservation: range.reservation,
            capacity: range.capacity - at,
            max_piece: range.max_piece,
            pieces,
        };
        range.capacity = at;
        let reservation = range.reservation;
        t.ranges.insert(base + at as u64, tail);
        if let Some(r) = t.reservations.get_mut(&reservation) {
            r.ranges += 1;
        }
        Ok(base + at as u64)
    }

    /// Moves the one piece (of `src_bytes`) of the range at `src` to the end
    /// of the range at `dst` (`dst_bytes` mapped); `src` ends (see
    /// [`GrowInPlace::recycle`]).
    pub(super) fn recycle(
        &self,
        device: &Device,
        (src, src_bytes): (u64, usize),
        (dst, dst_bytes): (u64, usize),
    ) -> Result<()> {
        let (_, peers) = self.setup(device)?;
        let mut t = lock(&self.tables);
        let piece = match t.ranges.get(&src).map(|r| r.pieces.as_slice()) {
            Some(&[p]) if p.mapped && p.bytes == src_bytes => p,
            Some(_) => {
                return Err(Error::InvalidArgument(format!(
                    "{src:#x} is not one mapped piece of {src_bytes} bytes"
                )))
            }
            None => return Err(not_a_range(src)),
        };
        if src == dst {
            return Err(Error::InvalidArgument(format!(
                "{src:#x} cannot be recycled into itself"
            )));
        }
        let to = {
            let d = range_mut(&mut t, dst)?;
            let at = d.mapped();
            if at != dst_bytes {
                return Err(Error::InvalidArgument(format!(
                    "{dst:#x} has {at} bytes mapped, not {dst_bytes}"
                )));
            }
            if at
                .checked_add(piece.bytes)
                .is_none_or(|end| end > d.capacity)
            {
                return Err(Error::oom(piece.bytes));
            }
            at
        };
        let _relaxed = crate::graph::relaxed(device);
        let vmm = Vmm::of(device);
        let (from, into) = (DevicePtr(src), DevicePtr(dst + to as u64));
        retried(|| vmm.unmap(from, piece.bytes))?;
        let moved = vmm.map(into, piece.bytes, piece.handle).and_then(|()| {
            set_access(device, peers, into, piece.bytes).inspect_err(|_| {
                undo(|| vmm.unmap(into, piece.bytes));
            })
        });
        if let Err(e) = moved {
            // Back where it was; if even that fails, the memory is gone and
            // `src` is an allocation with nothing mapped, for its free.
            let back = vmm
                .map(from, piece.bytes, piece.handle)
                .and_then(|()| set_access(device, peers, from, piece.bytes));
            if let Err(e2) = back {
                log::error!("growable device memory: a piece could not be mapped back: {e2}");
                undo(|| vmm.unmap(from, piece.bytes));
                undo(|| vmm.release(piece.handle));
                if let Some(r) = t.ranges.get_mut(&src) {
                    r.pieces[0].mapped = false;
                }
            }
            return Err(e);
        }
        let d = range_mut(&mut t, dst)?;
        d.pieces.push(Piece { at: to, ..piece });
        let gone = t.ranges.remove(&src).map(|r| r.reservation);
        let freed = gone.and_then(|res| leave_reservation(&mut t, res));
        drop(t);
        if let Some((res, bytes)) = freed {
            undo(|| vmm.free_address(DevicePtr(res), bytes));
        }
        Ok(())
    }

    /// Unmaps and releases the whole range at `base`, and frees its
    /// reservation's addresses when it was the last range in it.
    pub(super) fn free(&self, device: &Device, base: u64) -> Result<()> {
        let mut t = lock(&self.tables);
        let Some(range) = t.ranges.remove(&base) else {
            return Err(not_a_range(base));
        };
        let _relaxed = crate::graph::relaxed(device);
        let vmm = Vmm::of(device);
        // Unmapped piece by piece: each piece is a mapping of its own, and
        // CUDA unmaps whole mappings.
        let mut unmapped_any = false;
        for p in range.pieces.iter().filter(|p| p.mapped) {
            let ptr = DevicePtr(base + p.at as u64);
            if let Err(e) = retried(|| vmm.unmap(ptr, p.bytes)) {
                if !unmapped_any {
                    // Still mapped, still usable: the allocation stays.
                    t.ranges.insert(base, range);
                    return Err(e);
                }
                // Part of it is gone already: the rest leaks in the driver
                // (and says so), nothing the caller could use.
                log::error!("growable device memory: could not unmap: {e}");
            }
            unmapped_any = true;
        }
        // Unmapped, the allocation is gone whatever follows: a release or
        // an address free that fails twice leaks in the driver (and says
        // so), nothing the caller could use.
        for p in range.pieces.iter().filter(|p| p.mapped) {
            undo(|| vmm.release(p.handle));
        }
        if let Some((res, bytes)) = leave_reservation(&mut t, range.reservation) {
            drop(t);
            undo(|| vmm.free_address(DevicePtr(res), bytes));
        }
        Ok(())
    }
}

/// The range at `base`, or the error naming it.
fn range_mut(t: &mut Tables, base: u64) -> Result<&mut Range> {
    t.ranges.get_mut(&base).ok_or_else(|| not_a_range(base))
}

fn not_a_range(base: u64) -> Error {
    Error::InvalidArgument(format!("{base:#x} is not growable"))
}

/// One range of reservation `res` ended: when it was the last, the
/// reservation is forgotten and returned for its addresses to be freed.
fn leave_reservation(t: &mut Tables, res: u64) -> Option<(u64, usize)> {
    let r = t.reservations.get_mut(&res)?;
    r.ranges -= 1;
    if r.ranges > 0 {
        return None;
    }
    t.reservations.remove(&res).map(|r| (res, r.bytes))
}

/// The driver's VMM calls on this module's own memory, which carry the one
/// argument for their `unsafe` here: every range and handle passed comes from
/// [`GrowableRanges`]' tables, or from the reservation and pieces just made
/// for a range not yet in them. A reservation is one `vmm_reserve` of this
/// module, its addresses freed once, when its last range goes; a piece is one
/// `vmm_create` of this module, mapped only at its place in its range (in
/// that range's reservation), unmapped and released once; each call is made
/// with the tables' lock held or on a range just taken out of them, so no
/// two calls race on one piece. The memory is the resource's until given
/// back, and what is given back no work uses any more: a free follows the
/// work ordered before it (`DeviceResource::deallocate` waits for it), and
/// [`GrowInPlace::shrink`] and [`GrowInPlace::recycle`] take only memory
/// their caller knows unused. (A call that failed is taken to have changed
/// nothing, and is tried once more: see [`crate::driver`].)
#[derive(Clone, Copy)]
struct Vmm<'a>(&'a dyn Driver);

impl<'a> Vmm<'a> {
    fn of(device: &'a Device) -> Self {
        Vmm(&**device.driver())
    }

    /// Maps all of piece `handle` at `ptr`.
    fn map(self, ptr: DevicePtr, bytes: usize, handle: RawPhys) -> Result<()> {
        // SAFETY: a piece of this module at its place in its range (see `Vmm`).
        unsafe { self.0.vmm_map(ptr, bytes, 0, handle) }
    }

    fn unmap(self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: a piece of this module, mapped and given back (see `Vmm`).
        unsafe { self.0.vmm_unmap(ptr, bytes) }
    }

    fn release(self, handle: RawPhys) -> Result<()> {
        // SAFETY: a piece of this module, released once (see `Vmm`).
        unsafe { self.0.vmm_release(handle) }
    }

    fn free_address(self, base: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: a reservation of this module with no range left in it,
        // freed once (see `Vmm`).
        unsafe { self.0.vmm_free_address(base, bytes) }
    }

    /// Read-write access for `device`.
    fn set_access(self, ptr: DevicePtr, bytes: usize, device: u32) -> Result<()> {
        // SAFETY: pieces of this module, just mapped (see `Vmm`).
        unsafe {
            self.0
                .vmm_set_access(ptr, bytes, device, AccessFlags::ReadWrite)
        }
    }
}

/// Makes `bytes` at `ptr` (mapped) readable and writable by `device` and
/// its peers, in one call per device (the span may cover several pieces).
fn set_access(device: &Device, peers: &[u32], ptr: DevicePtr, bytes: usize) -> Result<()> {
    let vmm = Vmm::of(device);
    for d in std::iter::once(device.ordinal()).chain(peers.iter().copied()) {
        vmm.set_access(ptr, bytes, d)?;
    }
    Ok(())
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
