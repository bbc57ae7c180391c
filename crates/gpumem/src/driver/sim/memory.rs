//! Device memory, host memory and address translation.
//!
//! Every device address the simulator hands out lives in one translation
//! table (a `BTreeMap` from start address to [`Region`]): plain `cuMemAlloc`
//! allocations, memory-pool blocks and VMM mappings. Pinned host and managed
//! allocations are real host memory kept in a second table keyed by their host
//! address; fake device addresses start at 2^47, above every user-space host
//! address on x86-64 and AArch64, so the two tables never overlap.
//!
//! In address-only mode (the default) device regions have no backing: data
//! operations on them are checked (the range must be allocated, mapped and
//! accessible) and counted, but move no bytes; a copy from such memory to host
//! memory leaves the host bytes untouched. In backed mode each region has
//! host memory behind it and data operations really happen.
//!
//! Costs: translating a range is O(log n) per region it touches; allocating is
//! O(log n) in the number of free address ranges (see `address_space`).

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use super::address_space::{round_up, BASE_ALIGN};
use super::faults::{drv, INVALID_VALUE, NOT_FOUND, NOT_SUPPORTED, PEER_ACCESS_NOT_ENABLED};
use super::peer::{Denied, Grant, PeerDenial};
use super::streams::{Op, QueueId};
use super::{PhysId, PoolId, State};
use crate::driver::{AccessFlags, DevicePtr, HostAllocFlags, RawPhys};
use crate::{Error, OomInfo, Result};

/// Real host memory, 256-byte aligned and zeroed, freed on drop.
pub(super) struct HostBuf {
    base: NonNull<u8>,
    layout: Layout,
    addr: usize,
    len: usize,
}

// SAFETY: a HostBuf owns its allocation exclusively (like a Box<[u8]>); all
// access goes through the simulator's state mutex or through raw pointers whose
// validity the caller of the unsafe copy functions guarantees.
unsafe impl Send for HostBuf {}
// SAFETY: as above; shared references never write through the buffer.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    /// `len` zeroed bytes at a 256-byte-aligned address; `None` if the host
    /// cannot provide them (or `len` is 0 or absurd).
    pub(super) fn new(len: usize) -> Option<HostBuf> {
        if len == 0 {
            return None;
        }
        // Over-allocate with a small alignment so large buffers come from
        // calloc/mmap (lazily zeroed pages) and align by hand.
        let layout = Layout::from_size_align(len.checked_add(BASE_ALIGN as usize)?, 16).ok()?;
        // SAFETY: the layout has a non-zero size.
        let base = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        let start = base.as_ptr() as usize;
        let addr = round_up(start as u64, BASE_ALIGN)? as usize;
        Some(HostBuf {
            base,
            layout,
            addr,
            len,
        })
    }

    /// The 256-byte-aligned start address.
    pub(super) fn addr(&self) -> usize {
        self.addr
    }

    /// Length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Pointer to byte `off` (`off <= len`).
    pub(super) fn ptr_at(&self, off: u64) -> usize {
        self.addr + off as usize
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: `base` came from `alloc_zeroed` with exactly `layout`.
        unsafe { std::alloc::dealloc(self.base.as_ptr(), self.layout) }
    }
}

/// A block of a memory pool (or an imported alias of one).
pub(super) struct PoolBlock {
    pub(super) pool: PoolId,
    pub(super) device: u32,
    /// Reserved bytes (a multiple of the granularity), or the alias length.
    pub(super) len: u64,
    /// Bytes in use (the request rounded to 256); 0 while cached.
    pub(super) size: u64,
    /// Handed out and not yet freed (in stream order).
    pub(super) live: bool,
    /// A `cuMemFreeAsync` is enqueued and has not run yet.
    pub(super) free_enqueued: bool,
    /// For an imported pointer, the exporting block's address.
    pub(super) alias_of: Option<u64>,
    pub(super) buf: Option<Arc<HostBuf>>,
}

/// A VMM mapping of (part of) a physical allocation.
pub(super) struct Mapping {
    pub(super) len: u64,
    pub(super) phys: PhysId,
    /// The handle `cuMemMap` was given (what `cuMemRetainAllocationHandle`
    /// answers).
    pub(super) handle: RawPhys,
    pub(super) offset: u64,
    /// Access per device, set by `cuMemSetAccess`.
    pub(super) access: Vec<AccessFlags>,
}

/// Something at a device address.
pub(super) enum Region {
    /// A `cuMemAlloc` allocation.
    Plain {
        device: u32,
        len: u64,
        buf: Option<HostBuf>,
    },
    /// A memory-pool block.
    Pool(PoolBlock),
    /// A VMM mapping.
    Map(Mapping),
}

impl Region {
    pub(super) fn len(&self) -> u64 {
        match self {
            Region::Plain { len, .. } => *len,
            Region::Pool(b) => b.len,
            Region::Map(m) => m.len,
        }
    }
}

/// What a host allocation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HostKind {
    /// `cuMemHostAlloc`.
    Pinned,
    /// `cuMemAllocManaged` on a device (charged to that device).
    Managed { device: u32, charged: u64 },
}

/// A pinned or managed allocation: real host memory.
pub(super) struct HostAlloc {
    pub(super) kind: HostKind,
    pub(super) buf: HostBuf,
}

/// One piece of a translated range: its length and the host bytes behind it
/// (`None` for unbacked device memory).
pub(super) type Seg = (u64, Option<usize>);

/// An operand of a copy.
#[derive(Debug, Clone, Copy)]
pub(super) enum Addr {
    /// A device-accessible address (device, pinned or managed memory).
    Dev(u64),
    /// Caller-owned host memory (pageable), passed to `cuMemcpy[HD]to[DH]Async`.
    Raw(usize),
}

/// Counters of data operations.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DataStats {
    /// Memsets and copies that ran.
    pub ops: u64,
    /// Bytes those operations covered.
    pub bytes: u64,
    /// Bytes really written (backed or host memory).
    pub bytes_moved: u64,
    /// Operations that found their memory gone when they ran (a use after
    /// free in stream order; a real GPU would raise an illegal-address error).
    pub faults: u64,
}

impl State {
    /// Capacity check and charge of `bytes` on `device` for a request of `requested`.
    pub(super) fn charge(&mut self, device: u32, bytes: u64, requested: usize) -> Result<()> {
        let cap = self.capacity;
        let d = &mut self.devices[device as usize];
        match d.used.checked_add(bytes) {
            Some(n) if n <= cap => {
                d.used = n;
                d.allocs += 1;
                Ok(())
            }
            _ => Err(Error::oom_with(OomInfo {
                requested,
                device: Some(device),
                live: Some(d.used as usize),
                limit: Some(cap as usize),
                ..OomInfo::default()
            })),
        }
    }

    /// Undoes [`State::charge`].
    pub(super) fn uncharge(&mut self, device: u32, bytes: u64) {
        let d = &mut self.devices[device as usize];
        d.used -= bytes;
        d.allocs -= 1;
    }

    /// Charges `bytes` (a multiple of 256) on `device` and takes an address
    /// range for them; with backing in backed mode.
    pub(super) fn take_device_range(
        &mut self,
        device: u32,
        bytes: u64,
        requested: usize,
    ) -> Result<(u64, Option<HostBuf>)> {
        self.charge(device, bytes, requested)?;
        let Some(addr) = self.devices[device as usize].space.alloc(bytes, BASE_ALIGN) else {
            self.uncharge(device, bytes);
            return Err(super::faults::oom(requested, Some(device)));
        };
        let buf = if self.cfg.backed {
            match HostBuf::new(bytes as usize) {
                Some(b) => Some(b),
                None => {
                    self.devices[device as usize].space.free(addr, bytes);
                    self.uncharge(device, bytes);
                    return Err(super::faults::oom(requested, Some(device)));
                }
            }
        } else {
            None
        };
        Ok((addr, buf))
    }

    /// Returns what [`State::take_device_range`] took.
    pub(super) fn give_device_range(&mut self, device: u32, addr: u64, bytes: u64) {
        self.devices[device as usize].space.free(addr, bytes);
        self.uncharge(device, bytes);
    }

    /// `cuMemAlloc`.
    pub(super) fn mem_alloc(&mut self, device: u32, bytes: usize) -> Result<DevicePtr> {
        const CALL: &str = "cuMemAlloc";
        if bytes == 0 {
            return Err(drv(CALL, INVALID_VALUE));
        }
        self.faults.on_alloc(bytes, device)?;
        let size = round_up(bytes as u64, BASE_ALIGN)
            .ok_or_else(|| super::faults::oom(bytes, Some(device)))?;
        let (addr, buf) = self.take_device_range(device, size, bytes)?;
        self.regions.insert(
            addr,
            Region::Plain {
                device,
                len: size,
                buf,
            },
        );
        Ok(DevicePtr(addr))
    }

    /// `cuMemFree` of a `cuMemAlloc` or `cuMemAllocManaged` allocation.
    pub(super) fn mem_free(&mut self, ptr: DevicePtr) -> Result<()> {
        const CALL: &str = "cuMemFree";
        if ptr.is_null() {
            return Ok(());
        }
        if let Some(Region::Plain { device, len, .. }) = self.regions.get(&ptr.0) {
            let (device, len) = (*device, *len);
            self.regions.remove(&ptr.0);
            self.give_device_range(device, ptr.0, len);
            return Ok(());
        }
        if let Some(HostAlloc {
            kind: HostKind::Managed { device, charged },
            ..
        }) = self.host.get(&ptr.0)
        {
            let (device, charged) = (*device, *charged);
            self.host.remove(&ptr.0);
            self.uncharge(device, charged);
            return Ok(());
        }
        Err(drv(CALL, INVALID_VALUE))
    }

    /// `cuMemAllocManaged`: real host memory, charged to `device`.
    pub(super) fn mem_alloc_managed(&mut self, device: u32, bytes: usize) -> Result<DevicePtr> {
        const CALL: &str = "cuMemAllocManaged";
        if !self.cfg.managed_memory {
            return Err(drv(CALL, NOT_SUPPORTED));
        }
        if bytes == 0 {
            return Err(drv(CALL, INVALID_VALUE));
        }
        let size = round_up(bytes as u64, BASE_ALIGN)
            .ok_or_else(|| super::faults::oom(bytes, Some(device)))?;
        self.charge(device, size, bytes)?;
        let Some(buf) = usize::try_from(size).ok().and_then(HostBuf::new) else {
            self.uncharge(device, size);
            return Err(super::faults::oom(bytes, Some(device)));
        };
        let addr = buf.addr() as u64;
        self.host.insert(
            addr,
            HostAlloc {
                kind: HostKind::Managed {
                    device,
                    charged: size,
                },
                buf,
            },
        );
        Ok(DevicePtr(addr))
    }

    /// `cuMemHostAlloc`: real, zeroed host memory.
    pub(super) fn mem_alloc_host(
        &mut self,
        device: u32,
        bytes: usize,
        _flags: HostAllocFlags,
    ) -> Result<DevicePtr> {
        const CALL: &str = "cuMemHostAlloc";
        if bytes == 0 {
            return Err(drv(CALL, INVALID_VALUE));
        }
        let Some(buf) = HostBuf::new(bytes) else {
            return Err(super::faults::oom(bytes, Some(device)));
        };
        let addr = buf.addr() as u64;
        self.pinned_bytes += bytes as u64;
        self.host.insert(
            addr,
            HostAlloc {
                kind: HostKind::Pinned,
                buf,
            },
        );
        Ok(DevicePtr(addr))
    }

    /// `cuMemFreeHost`.
    pub(super) fn mem_free_host(&mut self, ptr: DevicePtr) -> Result<()> {
        match self.host.get(&ptr.0) {
            Some(HostAlloc {
                kind: HostKind::Pinned,
                buf,
            }) => {
                self.pinned_bytes -= buf.len() as u64;
                self.host.remove(&ptr.0);
                Ok(())
            }
            _ => Err(drv("cuMemFreeHost", INVALID_VALUE)),
        }
    }

    /// Whether `[addr, addr+len)` lies inside one managed allocation.
    pub(super) fn is_managed_range(&self, addr: u64, len: u64) -> bool {
        match self.host.range(..=addr).next_back() {
            Some((&a, h)) => {
                matches!(h.kind, HostKind::Managed { .. })
                    && addr
                        .checked_add(len)
                        .is_some_and(|e| e <= a + h.buf.len() as u64)
            }
            None => false,
        }
    }

    /// Translates `[addr, addr+len)` as seen by `device` into pieces of host
    /// memory. Fails (`CUDA_ERROR_INVALID_VALUE` of `call`) when any byte is
    /// not allocated, not live, not mapped, or not accessible for the access
    /// asked for; `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED` when the byte is
    /// another device's memory that `device` was given no access to.
    pub(super) fn resolve(
        &self,
        addr: u64,
        len: u64,
        device: u32,
        write: bool,
        call: &'static str,
    ) -> Result<Vec<Seg>> {
        self.translate(addr, len, device, write)
            .map_err(|d| match d {
                Denied::Invalid => drv(call, INVALID_VALUE),
                Denied::Peer(_) => drv(call, PEER_ACCESS_NOT_ENABLED),
            })
    }

    /// [`State::resolve`], telling why a range is refused.
    pub(super) fn translate(
        &self,
        addr: u64,
        len: u64,
        device: u32,
        write: bool,
    ) -> std::result::Result<Vec<Seg>, Denied> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let end = addr.checked_add(len).ok_or(Denied::Invalid)?;
        if let Some((&a, h)) = self.host.range(..=addr).next_back() {
            let hend = a + h.buf.len() as u64;
            if addr < hend {
                if end > hend {
                    return Err(Denied::Invalid);
                }
                return Ok(vec![(len, Some(h.buf.ptr_at(addr - a)))]);
            }
        }
        let mut segs = Vec::new();
        let mut cur = addr;
        while cur < end {
            let (&a, r) = self
                .regions
                .range(..=cur)
                .next_back()
                .ok_or(Denied::Invalid)?;
            let rend = a + r.len();
            if cur >= rend {
                return Err(Denied::Invalid);
            }
            let take = end.min(rend) - cur;
            let off = cur - a;
            let denied = |owner: u32, grant: Grant| {
                if owner == device {
                    Denied::Invalid
                } else {
                    Denied::Peer(PeerDenial {
                        addr: cur,
                        owner,
                        grant,
                    })
                }
            };
            let ptr = match r {
                Region::Plain {
                    buf, device: owner, ..
                } => {
                    if !self.peer_reaches(device, *owner) {
                        return Err(denied(*owner, Grant::PeerAccess));
                    }
                    buf.as_ref().map(|b| b.ptr_at(off))
                }
                Region::Pool(b) => {
                    if !b.live {
                        return Err(Denied::Invalid);
                    }
                    if b.device != device {
                        let acc = self
                            .pools
                            .get(&b.pool)
                            .map_or(AccessFlags::ReadWrite, |p| p.access_of(device));
                        if !allows(acc, write) {
                            return Err(denied(b.device, Grant::Pool));
                        }
                    }
                    b.buf.as_ref().map(|x| x.ptr_at(off))
                }
                Region::Map(m) => {
                    let acc = m
                        .access
                        .get(device as usize)
                        .copied()
                        .unwrap_or(AccessFlags::None);
                    let phys = self.phys.get(&m.phys);
                    if !allows(acc, write) {
                        return Err(denied(phys.map_or(device, |p| p.device), Grant::Mapping));
                    }
                    phys.and_then(|p| p.buf.as_ref())
                        .map(|x| x.ptr_at(m.offset + off))
                }
            };
            segs.push((take, ptr));
            cur += take;
        }
        Ok(segs)
    }

    /// Whether `addr` lies in a pinned host allocation.
    pub(super) fn is_pinned_host(&self, addr: u64) -> bool {
        self.host.range(..=addr).next_back().is_some_and(|(&a, h)| {
            matches!(h.kind, HostKind::Pinned) && addr < a + h.buf.len() as u64
        })
    }

    /// `cuMemGetAddressRange`: the allocation (or VMM mapping) holding `addr`.
    pub(super) fn address_range(&self, addr: u64) -> Result<(DevicePtr, usize)> {
        const CALL: &str = "cuMemGetAddressRange";
        if let Some((&a, h)) = self.host.range(..=addr).next_back() {
            if addr < a + h.buf.len() as u64 {
                return Ok((DevicePtr(a), h.buf.len()));
            }
        }
        match self.regions.range(..=addr).next_back() {
            Some((&a, r)) if addr < a + r.len() => {
                let len = match r {
                    Region::Pool(b) if !b.live => return Err(drv(CALL, NOT_FOUND)),
                    Region::Pool(b) if b.alias_of.is_none() => b.size,
                    r => r.len(),
                };
                Ok((DevicePtr(a), len as usize))
            }
            _ => Err(drv(CALL, NOT_FOUND)),
        }
    }

    /// Enqueues a copy between device-accessible addresses on queue `q`,
    /// both ranges checked as seen by the queue's device.
    pub(super) fn enqueue_dtod(
        &mut self,
        q: QueueId,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        call: &'static str,
    ) -> Result<()> {
        let dev = self.queue_device(q);
        self.touch(dst.0, bytes as u64, dev, true, call)?;
        self.touch(src.0, bytes as u64, dev, false, call)?;
        self.enqueue(
            q,
            Op::Copy {
                dst: Addr::Dev(dst.0),
                src: Addr::Dev(src.0),
                len: bytes as u64,
            },
        );
        Ok(())
    }

    /// Runs a memset; a translation failure counts as an asynchronous fault.
    pub(super) fn exec_memset(&mut self, dst: u64, value: u8, len: u64, device: u32) {
        self.stats.ops += 1;
        self.stats.bytes += len;
        let Ok(segs) = self.resolve(dst, len, device, true, "cuMemsetD8Async") else {
            self.stats.faults += 1;
            return;
        };
        for (n, p) in segs {
            if let Some(p) = p {
                // SAFETY: `p..p+n` lies inside a live HostBuf (translation
                // checked it) and the state lock is held.
                unsafe { std::ptr::write_bytes(p as *mut u8, value, n as usize) };
                self.stats.bytes_moved += n;
            }
        }
    }

    /// Runs a copy; a translation failure counts as an asynchronous fault.
    pub(super) fn exec_copy(&mut self, dst: Addr, src: Addr, len: u64, device: u32) {
        self.stats.ops += 1;
        self.stats.bytes += len;
        let d = self.operand(dst, len, device, true);
        let s = self.operand(src, len, device, false);
        let (Ok(d), Ok(s)) = (d, s) else {
            self.stats.faults += 1;
            return;
        };
        let (mut i, mut j) = (0, 0);
        let (mut di, mut sj) = (0u64, 0u64); // bytes used of d[i], s[j]
        while i < d.len() && j < s.len() {
            let n = (d[i].0 - di).min(s[j].0 - sj);
            if let (Some(dp), Some(sp)) = (d[i].1, s[j].1) {
                // SAFETY: both ranges were translated into live host buffers
                // (or caller-guaranteed host memory) of at least `n` bytes;
                // `copy` allows overlap.
                unsafe {
                    std::ptr::copy(
                        (sp + sj as usize) as *const u8,
                        (dp + di as usize) as *mut u8,
                        n as usize,
                    )
                };
                self.stats.bytes_moved += n;
            }
            di += n;
            sj += n;
            if di == d[i].0 {
                i += 1;
                di = 0;
            }
            if sj == s[j].0 {
                j += 1;
                sj = 0;
            }
        }
    }

    /// Translates a copy operand.
    pub(super) fn operand(&self, a: Addr, len: u64, device: u32, write: bool) -> Result<Vec<Seg>> {
        match a {
            Addr::Raw(p) => Ok(vec![(len, Some(p))]),
            Addr::Dev(p) => self.resolve(p, len, device, write, "cuMemcpyAsync"),
        }
    }
}

/// Whether `acc` permits a read (or a write).
fn allows(acc: AccessFlags, write: bool) -> bool {
    match acc {
        AccessFlags::None => false,
        AccessFlags::Read => !write,
        AccessFlags::ReadWrite => true,
    }
}
