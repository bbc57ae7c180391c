//! Dropping a [`VirtualPool`]: every mapping, extent and reservation goes
//! back to the driver, and the pinned memory of host backups with them.

use super::page_table::PageRef;
use super::vmm::Vmm;
use super::{State, VirtualPool};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::pool::stream_order::streams::synchronize_device;

impl Drop for VirtualPool {
    fn drop(&mut self) {
        if crate::exit::process_is_exiting() {
            // The driver may already be gone: leak rather than call into it.
            return;
        }
        let (device, gran) = (self.device.clone(), self.gran);
        let (shards, _) = self.shards.get_mut();
        for st in shards {
            Self::drop_shard(&device, gran, st);
        }
    }
}

impl VirtualPool {
    /// Gives back one shard's mappings, extents and reservations.
    fn drop_shard(device: &Device, gran: usize, st: &mut State) {
        // Work still using pool memory must finish before pages go.
        for a in &st.areas {
            a.lanes.synchronize_all(device);
        }
        if st.streams.synchronize_all(device).is_err() {
            let _ = synchronize_device(device);
        }
        let vmm = Vmm { device, gran };
        let mapped: Vec<PageRef> = st.pages.mapped().map(|(p, _)| p).collect();
        let mut runs: Vec<(PageRef, usize)> = Vec::new();
        for p in mapped {
            match runs.last_mut() {
                Some((r, n)) if r.res == p.res && r.idx + *n == p.idx => *n += 1,
                _ => runs.push((p, 1)),
            }
        }
        for (r, n) in runs {
            let addr = st.pages.addr(r);
            crate::exit::give_back(
                || format!("VirtualPool mapping at {addr:#x}"),
                || vmm.unmap(st, r, n),
            );
        }
        for (_, ext) in st.phys.extents() {
            crate::exit::give_back(
                || "VirtualPool physical memory".into(),
                || vmm.release(ext.handle),
            );
        }
        for r in &st.pages.reservations {
            crate::exit::give_back(
                || format!("VirtualPool address range {:#x}", r.base),
                || vmm.free_reservation(DevicePtr(r.base), r.bytes as usize),
            );
        }
        // The backups of regions asleep go before their pinned pool does.
        for a in st.regions.asleep.drain(..) {
            if let Some(b) = a.backup {
                Self::free_backup(&st.regions.host, b);
            }
        }
    }
}
