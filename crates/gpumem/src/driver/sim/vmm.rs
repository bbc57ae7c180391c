//! Virtual memory management (`cuMemAddressReserve`, `cuMemCreate`,
//! `cuMemMap`, `cuMemSetAccess`, ...).
//!
//! Reservations take address space from a region of their own (above all
//! devices' regions) and no capacity. Physical allocations take capacity (and
//! real host memory in backed mode) but no address; they are freed once
//! released by every handle AND unmapped everywhere, as CUDA does. Mappings
//! live in the common translation table, so a copy across pages mapped from
//! different physical allocations resolves piece by piece. A mapping starts
//! with no access for any device; data operations on it fail until
//! `cuMemSetAccess` grants access, as a real GPU would fault.
//!
//! Rules checked (each failure is `CUDA_ERROR_INVALID_VALUE`): sizes, offsets
//! and addresses are multiples of the granularity; a mapping lies inside one
//! reservation, overlaps no other mapping and fits its physical allocation;
//! unmap and set-access ranges consist of whole mappings without gaps; an
//! address range is freed exactly as reserved and only with nothing mapped.
//!
//! Costs: O(log n + mappings touched) per call.

use std::os::fd::{BorrowedFd, OwnedFd};

use super::faults::{drv, INVALID_DEVICE, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED};
use super::ipc;
use super::memory::{HostBuf, Mapping, Region};
use super::{PhysId, State};
use crate::driver::{AccessFlags, DevicePtr, HandleType, PhysProps, RawPhys};
use crate::{Error, Result};

/// A physical allocation.
pub(super) struct Phys {
    pub(super) device: u32,
    pub(super) size: u64,
    pub(super) props: PhysProps,
    pub(super) buf: Option<HostBuf>,
    /// Releases still owed: by every handle, each once per creation,
    /// import or retain.
    pub(super) handles: usize,
    /// Mappings of it.
    pub(super) maps: usize,
}

impl State {
    fn vmm_on(&self, call: &'static str) -> Result<()> {
        if self.cfg.vmm {
            Ok(())
        } else {
            Err(drv(call, NOT_SUPPORTED))
        }
    }

    fn phys_of(&self, h: RawPhys, call: &'static str) -> Result<PhysId> {
        self.phys_handles
            .get(&h)
            .map(|&(id, _)| id)
            .ok_or_else(|| drv(call, INVALID_HANDLE))
    }

    fn gran_ok(&self, x: u64) -> bool {
        x.is_multiple_of(self.gran)
    }

    /// `cuMemAddressReserve`; `alignment` 0 means the granularity.
    pub(super) fn vmm_reserve(&mut self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
        const CALL: &str = "cuMemAddressReserve";
        self.vmm_on(CALL)?;
        let bytes64 = bytes as u64;
        if bytes == 0 || !self.gran_ok(bytes64) {
            return Err(drv(CALL, INVALID_VALUE));
        }
        let align = match alignment {
            0 => self.gran,
            a if a.is_power_of_two() => (a as u64).max(self.gran),
            _ => return Err(drv(CALL, INVALID_VALUE)),
        };
        let addr = self
            .vmm_space
            .alloc(bytes64, align)
            .ok_or_else(|| super::faults::oom(bytes, None))?;
        self.reservations.insert(addr, bytes64);
        self.reserved_va += bytes64;
        Ok(DevicePtr(addr))
    }

    /// `cuMemAddressFree`.
    pub(super) fn vmm_free_address(&mut self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        const CALL: &str = "cuMemAddressFree";
        self.vmm_on(CALL)?;
        if self.reservations.get(&ptr.0) != Some(&(bytes as u64)) {
            return Err(drv(CALL, INVALID_VALUE));
        }
        let end = ptr.0 + bytes as u64;
        if self.regions.range(ptr.0..end).next().is_some() {
            return Err(drv(CALL, INVALID_VALUE));
        }
        self.reservations.remove(&ptr.0);
        self.vmm_space.free(ptr.0, bytes as u64);
        self.reserved_va -= bytes as u64;
        Ok(())
    }

    /// `cuMemCreate`.
    pub(super) fn vmm_create(
        &mut self,
        device: u32,
        bytes: usize,
        props: PhysProps,
    ) -> Result<RawPhys> {
        const CALL: &str = "cuMemCreate";
        self.vmm_on(CALL)?;
        if props.rdma_capable && !self.cfg.gpu_direct_rdma {
            return Err(drv(CALL, NOT_SUPPORTED));
        }
        match props.handle_type {
            HandleType::None => {}
            HandleType::PosixFd if self.cfg.posix_fd_ipc => {}
            HandleType::PosixFd => return Err(drv(CALL, NOT_SUPPORTED)),
            HandleType::Fabric => {
                return Err(Error::unsupported("fabric handles on the simulated device"))
            }
        }
        let size = bytes as u64;
        if bytes == 0 || !self.gran_ok(size) {
            return Err(drv(CALL, INVALID_VALUE));
        }
        self.faults.on_alloc(bytes, device)?;
        self.charge(device, size, bytes)?;
        let buf = if self.cfg.backed {
            match HostBuf::new(bytes) {
                Some(b) => Some(b),
                None => {
                    self.uncharge(device, size);
                    return Err(super::faults::oom(bytes, Some(device)));
                }
            }
        } else {
            None
        };
        let id = self.fresh_id();
        self.phys.insert(
            id,
            Phys {
                device,
                size,
                props,
                buf,
                handles: 1,
                maps: 0,
            },
        );
        self.physical_bytes += size;
        let h = self.fresh_handle(super::TAG_PHYS);
        self.phys_handles.insert(h, (id, 1));
        Ok(h)
    }

    /// Frees a physical allocation nobody holds or maps any more.
    fn maybe_free_phys(&mut self, id: PhysId) {
        if let Some(p) = self.phys.get(&id) {
            if p.handles == 0 && p.maps == 0 {
                let (device, size) = (p.device, p.size);
                self.phys.remove(&id);
                self.physical_bytes -= size;
                self.uncharge(device, size);
            }
        }
    }

    /// `cuMemRelease`.
    pub(super) fn vmm_release(&mut self, h: RawPhys) -> Result<()> {
        const CALL: &str = "cuMemRelease";
        self.vmm_on(CALL)?;
        let id = self.phys_of(h, CALL)?;
        if let Some(owed) = self.phys_handles.get_mut(&h) {
            owed.1 -= 1;
            if owed.1 == 0 {
                self.phys_handles.remove(&h);
            }
        }
        if let Some(p) = self.phys.get_mut(&id) {
            p.handles -= 1;
        }
        self.maybe_free_phys(id);
        Ok(())
    }

    /// `cuMemMap`.
    pub(super) fn vmm_map(
        &mut self,
        ptr: DevicePtr,
        bytes: usize,
        offset: usize,
        h: RawPhys,
    ) -> Result<()> {
        const CALL: &str = "cuMemMap";
        self.vmm_on(CALL)?;
        let bad = || drv(CALL, INVALID_VALUE);
        let id = self.phys_of(h, CALL)?;
        let (start, len, off) = (ptr.0, bytes as u64, offset as u64);
        if len == 0 || !self.gran_ok(start) || !self.gran_ok(len) || !self.gran_ok(off) {
            return Err(bad());
        }
        if off != 0 {
            // CUDA: "offset ... must currently be zero"; the driver answers
            // CUDA_ERROR_NOT_SUPPORTED (seen on an H100 with driver 580).
            return Err(drv(CALL, NOT_SUPPORTED));
        }
        let end = start.checked_add(len).ok_or_else(bad)?;
        if off.checked_add(len).is_none_or(|e| e > self.phys[&id].size) {
            return Err(bad());
        }
        match self.reservations.range(..=start).next_back() {
            Some((&a, &l)) if end <= a + l => {}
            _ => return Err(bad()),
        }
        if let Some((&a, r)) = self.regions.range(..end).next_back() {
            if a + r.len() > start {
                return Err(bad());
            }
        }
        let n = self.devices.len();
        self.regions.insert(
            start,
            Region::Map(Mapping {
                len,
                phys: id,
                handle: h,
                offset: off,
                access: vec![AccessFlags::None; n],
            }),
        );
        if let Some(p) = self.phys.get_mut(&id) {
            p.maps += 1;
        }
        self.mapped_bytes += len;
        Ok(())
    }

    /// The starts of the whole mappings that exactly tile `[start, start+len)`.
    fn whole_mappings(&self, start: u64, len: u64, call: &'static str) -> Result<Vec<u64>> {
        let bad = || drv(call, INVALID_VALUE);
        let end = start.checked_add(len).ok_or_else(bad)?;
        if len == 0 {
            return Err(bad());
        }
        let mut out = Vec::new();
        let mut cur = start;
        for (&a, r) in self.regions.range(start..end) {
            if a != cur || !matches!(r, Region::Map(_)) {
                return Err(bad());
            }
            out.push(a);
            cur = a + r.len();
        }
        if cur != end {
            return Err(bad());
        }
        Ok(out)
    }

    /// `cuMemUnmap`.
    pub(super) fn vmm_unmap(&mut self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        const CALL: &str = "cuMemUnmap";
        self.vmm_on(CALL)?;
        let starts = self.whole_mappings(ptr.0, bytes as u64, CALL)?;
        for a in starts {
            if let Some(Region::Map(m)) = self.regions.remove(&a) {
                self.mapped_bytes -= m.len;
                if let Some(p) = self.phys.get_mut(&m.phys) {
                    p.maps -= 1;
                }
                self.maybe_free_phys(m.phys);
            }
        }
        Ok(())
    }

    /// `cuMemSetAccess`.
    pub(super) fn vmm_set_access(
        &mut self,
        ptr: DevicePtr,
        bytes: usize,
        device: u32,
        access: AccessFlags,
    ) -> Result<()> {
        const CALL: &str = "cuMemSetAccess";
        self.vmm_on(CALL)?;
        if device as usize >= self.devices.len() {
            return Err(drv(CALL, INVALID_DEVICE));
        }
        let starts = self.whole_mappings(ptr.0, bytes as u64, CALL)?;
        for a in starts {
            if let Some(Region::Map(m)) = self.regions.get_mut(&a) {
                m.access[device as usize] = access;
            }
        }
        Ok(())
    }

    /// `cuMemExportToShareableHandle`.
    pub(super) fn vmm_export_fd(&self, h: RawPhys) -> Result<OwnedFd> {
        const CALL: &str = "cuMemExportToShareableHandle";
        self.vmm_on(CALL)?;
        let id = self.phys_of(h, CALL)?;
        if self.phys[&id].props.handle_type != HandleType::PosixFd {
            return Err(drv(CALL, INVALID_VALUE));
        }
        ipc::export_token(CALL, "phys", self.uid, id)
    }

    /// `cuMemImportFromShareableHandle`: a new handle to the same memory.
    pub(super) fn vmm_import_fd(&mut self, fd: BorrowedFd<'_>) -> Result<RawPhys> {
        const CALL: &str = "cuMemImportFromShareableHandle";
        self.vmm_on(CALL)?;
        let (kind, uid, id) = ipc::import_token(CALL, fd)?;
        if kind != "phys" || uid != self.uid {
            return Err(drv(CALL, INVALID_VALUE));
        }
        let p = self
            .phys
            .get_mut(&id)
            .filter(|p| p.handles > 0)
            .ok_or_else(|| drv(CALL, INVALID_VALUE))?;
        p.handles += 1;
        let h = self.fresh_handle(super::TAG_PHYS);
        self.phys_handles.insert(h, (id, 1));
        Ok(h)
    }

    /// `cuMemRetainAllocationHandle`: the handle the mapping at `ptr` was
    /// made with, owing one more release.
    pub(super) fn vmm_retain_handle(&mut self, ptr: DevicePtr) -> Result<RawPhys> {
        const CALL: &str = "cuMemRetainAllocationHandle";
        self.vmm_on(CALL)?;
        let bad = || drv(CALL, INVALID_VALUE);
        let (&a, r) = self.regions.range(..=ptr.0).next_back().ok_or_else(bad)?;
        let Region::Map(m) = r else {
            return Err(bad());
        };
        if ptr.0 >= a + m.len {
            return Err(bad());
        }
        let (id, h) = (m.phys, m.handle);
        self.phys_handles.entry(h).or_insert((id, 0)).1 += 1;
        if let Some(p) = self.phys.get_mut(&id) {
            p.handles += 1;
        }
        Ok(h)
    }
}
