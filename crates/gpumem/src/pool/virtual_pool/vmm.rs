//! The pool's calls to the driver's `unsafe` VMM methods, in one place with
//! the argument that makes them sound.
//!
//! Everything passed is the shard's own, read from its tables under its lock
//! (or, at the drop, with the pool no longer shared):
//! - addresses are pages of a reservation in the page table, one
//!   `vmm_reserve` of this pool; a reservation's addresses are freed once:
//!   by the drop, or at once by the call that made it when it cannot be
//!   used (before any page of it is in a table);
//! - physical handles are extents of the extent table, one `vmm_create` of
//!   this pool each, released once: when taken out of the table (the cache's
//!   releasable extents, or the drop);
//! - a map puts a whole extent under pages the page table has unmapped;
//!   an unmap covers whole mappings the page table records, and only when no
//!   work still uses them: their pages hold no live block and the streams
//!   that freed blocks there are known done (the stream-ordering rules of
//!   [`crate::pool`]; `docs/virtual_pool.md` for the invariants), or a
//!   sleeping region's pages after its stream was waited for, or mappings
//!   the same call just made and undoes, or every mapping at the drop, after
//!   the streams were synchronized;
//! - access is set only over pages just mapped.
//!
//! A call that fails is taken to have changed nothing (see [`crate::driver`]).

use std::os::fd::OwnedFd;

use super::page_table::PageRef;
use super::phys_cache::ExtentId;
use super::State;
use crate::device::Device;
use crate::driver::{AccessFlags, DevicePtr, RawPhys};
use crate::Result;

impl super::VirtualPool {
    /// The pool's VMM calls.
    pub(super) fn vmm(&self) -> Vmm<'_> {
        Vmm {
            device: &self.device,
            gran: self.gran,
        }
    }
}

/// A shard's VMM calls: the pool's device and page size.
#[derive(Clone, Copy)]
pub(super) struct Vmm<'a> {
    pub(super) device: &'a Device,
    pub(super) gran: usize,
}

impl Vmm<'_> {
    /// Maps extent `x` whole at page `at` (one `cuMemMap`).
    pub(super) fn map(self, st: &State, at: PageRef, x: ExtentId) -> Result<()> {
        let addr = DevicePtr(st.pages.addr(at));
        let bytes = st.phys.pages(x) * self.gran;
        // SAFETY: an extent of the table under unmapped pages of a
        // reservation of the table (module documentation).
        unsafe {
            self.device
                .driver()
                .vmm_map(addr, bytes, 0, st.phys.handle(x))
        }
    }

    /// Unmaps the whole mappings over `pages` pages from page `at` (one
    /// `cuMemUnmap`).
    pub(super) fn unmap(self, st: &State, at: PageRef, pages: usize) -> Result<()> {
        let addr = DevicePtr(st.pages.addr(at));
        // SAFETY: whole mappings of the page table that no work uses any
        // more (module documentation).
        unsafe { self.device.driver().vmm_unmap(addr, pages * self.gran) }
    }

    /// Gives `device` read-write access to `pages` pages from page `at`,
    /// just mapped.
    pub(super) fn grant(self, st: &State, at: PageRef, pages: usize, device: u32) -> Result<()> {
        let addr = DevicePtr(st.pages.addr(at));
        // SAFETY: pages of the page table, just mapped (module documentation).
        unsafe {
            self.device.driver().vmm_set_access(
                addr,
                pages * self.gran,
                device,
                AccessFlags::ReadWrite,
            )
        }
    }

    /// Releases an extent taken out of the table (`cuMemRelease`).
    pub(super) fn release(self, handle: RawPhys) -> Result<()> {
        // SAFETY: an extent of the table, released once, as it leaves the
        // table (module documentation).
        unsafe { self.device.driver().vmm_release(handle) }
    }

    /// Frees the addresses of a reservation (`cuMemAddressFree`).
    pub(super) fn free_reservation(self, base: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: a reservation of this pool, nothing mapped in it, freed
        // once (module documentation).
        unsafe { self.device.driver().vmm_free_address(base, bytes) }
    }

    /// Exports an extent of the table as a descriptor.
    pub(super) fn export(self, handle: RawPhys) -> Result<OwnedFd> {
        // SAFETY: an extent of the table, live while it is in it.
        unsafe { self.device.driver().vmm_export_fd(handle) }
    }
}
