//! Export of a [`VirtualPool`]'s physical memory to other processes.

use std::os::fd::OwnedFd;

use super::regions::asleep_error;
use super::VirtualPool;
use crate::driver::DevicePtr;
use crate::{Error, Result};

/// An extent exported for another process.
#[derive(Debug)]
pub struct PhysExport {
    /// A POSIX file descriptor the caller owns (import it with
    /// `cuMemImportFromShareableHandle`); closed on drop.
    pub fd: OwnedFd,
    /// Bytes of the extent.
    pub bytes: usize,
    /// Where its pages are mapped now: (address, offset into the extent).
    pub mappings: Vec<(DevicePtr, usize)>,
}

impl VirtualPool {
    /// Exports every extent as a POSIX file descriptor (the pool must
    /// have been made with `ipc`), with where its pages are mapped now.
    /// [`Error::Asleep`] while a region with live blocks sleeps.
    pub fn export_page_fds(&self) -> Result<Vec<PhysExport>> {
        if !self.config.ipc {
            return Err(Error::InvalidArgument(
                "virtual pool was not made with ipc: its memory cannot be exported".into(),
            ));
        }
        let st = self.lock();
        if let Some(a) = st.regions.asleep.iter().find(|a| a.blocks > 0) {
            return Err(asleep_error(
                a.tag,
                "cannot export the pool's memory while some of it is given back".into(),
            ));
        }
        let mut out: Vec<PhysExport> = Vec::new();
        let mut index = vec![
            usize::MAX;
            st.phys
                .extents()
                .map(|(x, _)| x as usize + 1)
                .max()
                .unwrap_or(0)
        ];
        for (x, ext) in st.phys.extents() {
            // On failure, the descriptors already exported close with `out`.
            let fd = self.vmm().export(ext.handle)?;
            index[x as usize] = out.len();
            out.push(PhysExport {
                fd,
                bytes: st.phys.pages(x) * self.gran,
                mappings: Vec::new(),
            });
        }
        for (p, phys) in st.pages.mapped() {
            if let Some(&i) = index.get(phys.extent as usize) {
                if let Some(export) = out.get_mut(i) {
                    export
                        .mappings
                        .push((DevicePtr(st.pages.addr(p)), phys.index as usize * self.gran));
                }
            }
        }
        Ok(out)
    }
}
