//! Virtual memory management: address reservation, physical handles, mapping,
//! access, and POSIX-fd export of physical handles.
//!
//! Physical memory is always pinned device memory (`cuMemCreate` with a
//! device location); the granularity query uses the same properties, so the
//! sizes it returns are the ones `cuMemCreate` and `cuMemMap` accept.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use cudarc::driver::sys::{
    self, CUmemAllocationGranularity_flags, CUmemAllocationHandleType, CUmemAllocationType,
};

use super::error::{check, check_alloc, check_range};
use super::memory::device_location;
use super::pool::{access_desc, export_posix_fd, handle_type_to_cu};
use super::CudaDriver;
use crate::driver::{AccessFlags, DevicePtr, PhysProps, RawPhys};
use crate::{check_alignment, Error, Result};

/// `CUmemAllocationProp` for pinned memory on device `ordinal`.
pub(super) fn device_alloc_prop(ordinal: u32, props: PhysProps) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: handle_type_to_cu(props.handle_type),
        location: device_location(ordinal),
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: u8::from(props.rdma_capable),
            usage: 0,
            reserved: [0; 4],
        },
    }
}

fn zero_bytes(call: &str) -> Error {
    Error::InvalidArgument(format!("{call}: zero bytes"))
}

impl CudaDriver {
    pub(super) fn vmm_granularity_impl(&self, device: u32, recommended: bool) -> Result<usize> {
        let _bound = self.bind(device)?;
        let prop = device_alloc_prop(device, PhysProps::default());
        let option = if recommended {
            CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
        } else {
            CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM
        };
        let mut g: usize = 0;
        check(
            // SAFETY: `g` is a valid out-pointer, `prop` fully initialized and
            // alive through the call.
            unsafe { sys::cuMemGetAllocationGranularity(&mut g, &prop, option) },
            "cuMemGetAllocationGranularity",
        )?;
        Ok(g)
    }

    pub(super) fn vmm_reserve_impl(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(zero_bytes("cuMemAddressReserve"));
        }
        if alignment != 0 {
            check_alignment(alignment)?;
        }
        let _bound = self.ensure_context()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: `p` is a valid out-pointer; no fixed address, no flags.
        let res = unsafe { sys::cuMemAddressReserve(&mut p, bytes, alignment, 0, 0) };
        // Address space, not memory, but equally "too big, try smaller".
        check_alloc(res, "cuMemAddressReserve", bytes, || None)?;
        Ok(DevicePtr(p))
    }

    /// # Safety
    /// As [`crate::driver::Driver::vmm_free_address`].
    pub(super) unsafe fn vmm_free_address_impl(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        check_range(ptr.0, bytes, "cuMemAddressFree")?;
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: the caller frees a range it reserved and owns (this
            // function's contract).
            unsafe { sys::cuMemAddressFree(ptr.0, bytes) },
            "cuMemAddressFree",
        )
    }

    pub(super) fn vmm_create_impl(
        &self,
        device: u32,
        bytes: usize,
        props: PhysProps,
    ) -> Result<RawPhys> {
        if bytes == 0 {
            return Err(zero_bytes("cuMemCreate"));
        }
        let _bound = self.bind(device)?;
        let prop = device_alloc_prop(device, props);
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `h` is a valid out-pointer, `prop` fully initialized and
        // alive through the call; flags must be 0.
        let res = unsafe { sys::cuMemCreate(&mut h, bytes, &prop, 0) };
        check_alloc(res, "cuMemCreate", bytes, || Some(device))?;
        Ok(h)
    }

    /// # Safety
    /// As [`crate::driver::Driver::vmm_release`].
    pub(super) unsafe fn vmm_release_impl(&self, handle: RawPhys) -> Result<()> {
        let _bound = self.ensure_context()?;
        // SAFETY: a live handle that the caller owns and releases once (this
        // function's contract); mappings keep the memory alive until
        // unmapped.
        check(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease")
    }

    pub(super) fn vmm_retain_handle_impl(&self, ptr: DevicePtr) -> Result<RawPhys> {
        let _bound = self.ensure_context()?;
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        check(
            // SAFETY: `h` is a valid out-pointer; the address is passed as a
            // pointer value the driver looks up, never dereferenced here.
            unsafe {
                sys::cuMemRetainAllocationHandle(
                    &mut h,
                    std::ptr::without_provenance_mut(ptr.0 as usize),
                )
            },
            "cuMemRetainAllocationHandle",
        )?;
        Ok(h)
    }

    /// # Safety
    /// As [`crate::driver::Driver::vmm_map`].
    pub(super) unsafe fn vmm_map_impl(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        offset: usize,
        handle: RawPhys,
    ) -> Result<()> {
        check_range(ptr.0, bytes, "cuMemMap")?;
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: a live handle, mapped into address space the caller
            // reserved and owns (this function's contract); the driver checks
            // that the range is unmapped and that offset+bytes fits the
            // handle. Flags must be 0.
            unsafe { sys::cuMemMap(ptr.0, bytes, offset, handle, 0) },
            "cuMemMap",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::vmm_unmap`].
    pub(super) unsafe fn vmm_unmap_impl(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        check_range(ptr.0, bytes, "cuMemUnmap")?;
        let _bound = self.ensure_context()?;
        // SAFETY: the caller unmaps a range it mapped and no longer uses (this
        // function's contract).
        check(unsafe { sys::cuMemUnmap(ptr.0, bytes) }, "cuMemUnmap")
    }

    /// # Safety
    /// As [`crate::driver::Driver::vmm_set_access`].
    pub(super) unsafe fn vmm_set_access_impl(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        device: u32,
        access: AccessFlags,
    ) -> Result<()> {
        check_range(ptr.0, bytes, "cuMemSetAccess")?;
        let _bound = self.bind(device)?;
        let desc = access_desc(device, access);
        check(
            // SAFETY: a range the caller mapped (this function's contract);
            // `desc` is one initialized descriptor, count 1, alive through the
            // call.
            unsafe { sys::cuMemSetAccess(ptr.0, bytes, &desc, 1) },
            "cuMemSetAccess",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::vmm_export_fd`].
    pub(super) unsafe fn vmm_export_fd_impl(&self, handle: RawPhys) -> Result<OwnedFd> {
        let _bound = self.ensure_context()?;
        export_posix_fd("cuMemExportToShareableHandle", |fd| {
            // SAFETY: a live handle (this function's contract); for
            // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR the driver writes an int
            // through the pointer; `fd` points at one that lives through the
            // call.
            unsafe {
                sys::cuMemExportToShareableHandle(
                    fd,
                    handle,
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            }
        })
    }

    pub(super) fn vmm_import_fd_impl(&self, fd: BorrowedFd<'_>) -> Result<RawPhys> {
        let fd = fd.as_raw_fd();
        let _bound = self.ensure_context()?;
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        check(
            // SAFETY: for POSIX file descriptors the handle argument is the fd
            // value cast to a pointer (never dereferenced); `h` is a valid
            // out-pointer.
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut h,
                    std::ptr::without_provenance_mut(fd as usize),
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            },
            "cuMemImportFromShareableHandle",
        )?;
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::HandleType;
    use cudarc::driver::sys::CUmemLocationType;

    #[test]
    fn device_alloc_prop_is_pinned_on_the_device() {
        let p = device_alloc_prop(
            1,
            PhysProps {
                handle_type: HandleType::PosixFd,
                rdma_capable: true,
            },
        );
        assert_eq!(p.type_, CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED);
        assert_eq!(
            p.location.type_,
            CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        );
        assert_eq!(p.location.id, 1);
        assert_eq!(
            p.requestedHandleTypes,
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        );
        assert!(p.win32HandleMetaData.is_null());
        assert_eq!(p.allocFlags.compressionType, 0);
        assert_eq!(p.allocFlags.gpuDirectRDMACapable, 1);
        let plain = device_alloc_prop(0, PhysProps::default());
        assert_eq!(plain.allocFlags.gpuDirectRDMACapable, 0);
    }
}
