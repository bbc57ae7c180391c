//! Stream-ordered memory pools (`cuMemPool*`, `cuMemAllocAsync`).
//!
//! The mapping from gpumem's types to the driver's lives here as plain
//! functions ([`pool_props_to_cu`], [`pool_attr_to_cu`]) so that it is tested
//! without a GPU. Attribute widths follow the driver: the release threshold
//! and the four memory counters are `cuuint64_t`, the three reuse policies are
//! `int`; reading a reuse policy gives 0 or 1.

use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use cudarc::driver::sys::{
    self, CUmemAccess_flags, CUmemAllocationHandleType, CUmemAllocationType, CUmemLocationType,
    CUmemPool_attribute, CUresult,
};

use super::error::{check, check_alloc};
use super::memory::device_location;
use super::stream::cu_stream;
use super::CudaDriver;
use crate::driver::{
    AccessFlags, AllocationType, DevicePtr, HandleType, Location, PoolAttr, PoolProps,
    PoolPtrExport, RawPool, RawStream,
};
use crate::{Error, Result};

/// How a pool attribute's value is passed to the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AttrWidth {
    /// `cuuint64_t`.
    U64,
    /// `int`, a boolean.
    I32,
}

/// The driver attribute and value width for a [`PoolAttr`].
pub(super) fn pool_attr_to_cu(attr: PoolAttr) -> (CUmemPool_attribute, AttrWidth) {
    use CUmemPool_attribute as A;
    match attr {
        PoolAttr::ReleaseThreshold => (A::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, AttrWidth::U64),
        PoolAttr::ReuseFollowEventDependencies => (
            A::CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES,
            AttrWidth::I32,
        ),
        PoolAttr::ReuseAllowOpportunistic => {
            (A::CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC, AttrWidth::I32)
        }
        PoolAttr::ReuseAllowInternalDependencies => (
            A::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
            AttrWidth::I32,
        ),
        PoolAttr::ReservedMemCurrent => (A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, AttrWidth::U64),
        PoolAttr::ReservedMemHigh => (A::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, AttrWidth::U64),
        PoolAttr::UsedMemCurrent => (A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT, AttrWidth::U64),
        PoolAttr::UsedMemHigh => (A::CU_MEMPOOL_ATTR_USED_MEM_HIGH, AttrWidth::U64),
    }
}

/// The driver's handle type for a [`HandleType`].
pub(super) fn handle_type_to_cu(h: HandleType) -> CUmemAllocationHandleType {
    match h {
        HandleType::None => CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        HandleType::PosixFd => CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        HandleType::Fabric => CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC,
    }
}

/// The driver's location for a [`Location`] (`id` is the device ordinal or
/// the NUMA node; ignored for plain host memory).
pub(super) fn location_to_cu(l: Location) -> sys::CUmemLocation {
    match l {
        Location::Device(d) => device_location(d),
        Location::Host => sys::CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
        Location::HostNuma(node) => sys::CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA,
            id: node,
        },
    }
}

/// The driver's access flags for [`AccessFlags`].
pub(super) fn access_to_cu(a: AccessFlags) -> CUmemAccess_flags {
    match a {
        AccessFlags::None => CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE,
        AccessFlags::Read => CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
        AccessFlags::ReadWrite => CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// [`AccessFlags`] for the raw value the driver wrote.
pub(super) fn access_from_cu(raw: u32) -> Option<AccessFlags> {
    match raw {
        x if x == CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_NONE as u32 => {
            Some(AccessFlags::None)
        }
        x if x == CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ as u32 => {
            Some(AccessFlags::Read)
        }
        x if x == CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE as u32 => {
            Some(AccessFlags::ReadWrite)
        }
        _ => None,
    }
}

/// `CUmemPoolProps` for [`PoolProps`]; every field not set here is zero.
pub(super) fn pool_props_to_cu(p: &PoolProps) -> sys::CUmemPoolProps {
    sys::CUmemPoolProps {
        allocType: match p.alloc_type {
            AllocationType::Pinned => CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            AllocationType::Managed => CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED,
        },
        handleTypes: handle_type_to_cu(p.handle_type),
        location: location_to_cu(p.location),
        win32SecurityAttributes: std::ptr::null_mut(),
        maxSize: p.max_size,
        usage: 0,
        reserved: [0; 54],
    }
}

/// A one-entry access descriptor for device `ordinal`.
pub(super) fn access_desc(ordinal: u32, access: AccessFlags) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: device_location(ordinal),
        flags: access_to_cu(access),
    }
}

#[inline]
fn cu_pool(p: RawPool) -> sys::CUmemoryPool {
    p as usize as sys::CUmemoryPool
}

fn null_pool(call: &str) -> Error {
    Error::InvalidArgument(format!("{call}: null pool handle"))
}

/// Runs an export call that writes a POSIX file descriptor through the
/// pointer it is given, and takes ownership of the descriptor.
pub(super) fn export_posix_fd(
    call: &'static str,
    export: impl FnOnce(*mut c_void) -> CUresult,
) -> Result<OwnedFd> {
    let mut fd: c_int = -1;
    check(export(&mut fd as *mut c_int as *mut c_void), call)?;
    if fd < 0 {
        return Err(Error::InvalidArgument(format!(
            "{call} returned descriptor {fd}"
        )));
    }
    // SAFETY: a successful export creates `fd` for the caller: an open
    // descriptor that nothing else owns or closes, non-negative (checked
    // above), so `OwnedFd` may take it over.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl CudaDriver {
    pub(super) fn mempool_default_impl(&self, device: u32) -> Result<RawPool> {
        let dev = self.cu_device(device)?;
        let _bound = self.bind(device)?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        check(
            // SAFETY: `pool` is a valid out-pointer, `dev` from cuDeviceGet.
            unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, dev) },
            "cuDeviceGetDefaultMemPool",
        )?;
        Ok(pool as usize as RawPool)
    }

    pub(super) fn mempool_current_impl(&self, device: u32) -> Result<RawPool> {
        let dev = self.cu_device(device)?;
        let _bound = self.bind(device)?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        check(
            // SAFETY: `pool` is a valid out-pointer, `dev` from cuDeviceGet.
            unsafe { sys::cuDeviceGetMemPool(&mut pool, dev) },
            "cuDeviceGetMemPool",
        )?;
        Ok(pool as usize as RawPool)
    }

    pub(super) fn mempool_create_impl(&self, props: &PoolProps) -> Result<RawPool> {
        let _bound = match props.location {
            Location::Device(d) => self.bind(d)?,
            Location::Host | Location::HostNuma(_) => self.ensure_context()?,
        };
        let cu = pool_props_to_cu(props);
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        check(
            // SAFETY: `pool` is a valid out-pointer and `cu` a fully initialized
            // props struct that outlives the call (the driver copies it).
            unsafe { sys::cuMemPoolCreate(&mut pool, &cu) },
            "cuMemPoolCreate",
        )?;
        Ok(pool as usize as RawPool)
    }

    /// # Safety
    /// As [`crate::driver::Driver::mempool_destroy`].
    pub(super) unsafe fn mempool_destroy_impl(&self, pool: RawPool) -> Result<()> {
        if pool == 0 {
            return Err(null_pool("cuMemPoolDestroy"));
        }
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: a live pool, not a default one, that the caller owns and
            // destroys once (this function's contract).
            unsafe { sys::cuMemPoolDestroy(cu_pool(pool)) },
            "cuMemPoolDestroy",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::mempool_set_attr`].
    pub(super) unsafe fn mempool_set_attr_impl(
        &self,
        pool: RawPool,
        attr: PoolAttr,
        value: u64,
    ) -> Result<()> {
        if pool == 0 {
            return Err(null_pool("cuMemPoolSetAttribute"));
        }
        if matches!(
            attr,
            PoolAttr::ReservedMemCurrent | PoolAttr::UsedMemCurrent
        ) {
            return Err(Error::InvalidArgument(format!(
                "cuMemPoolSetAttribute: {attr:?} is read-only"
            )));
        }
        let (cu_attr, width) = pool_attr_to_cu(attr);
        let _bound = self.ensure_context()?;
        let res = match width {
            AttrWidth::U64 => {
                let mut v: u64 = value;
                // SAFETY: a live pool (this function's contract); the driver
                // reads a cuuint64_t for this attribute from `v`, which lives
                // through the call.
                unsafe {
                    sys::cuMemPoolSetAttribute(
                        cu_pool(pool),
                        cu_attr,
                        &mut v as *mut u64 as *mut c_void,
                    )
                }
            }
            AttrWidth::I32 => {
                if value > 1 {
                    return Err(Error::InvalidArgument(format!(
                        "cuMemPoolSetAttribute: {attr:?} is a boolean (0 or 1), got {value}"
                    )));
                }
                let mut v: c_int = value as c_int;
                // SAFETY: a live pool (this function's contract); the driver
                // reads an int for this attribute from `v`, which lives through
                // the call.
                unsafe {
                    sys::cuMemPoolSetAttribute(
                        cu_pool(pool),
                        cu_attr,
                        &mut v as *mut c_int as *mut c_void,
                    )
                }
            }
        };
        check(res, "cuMemPoolSetAttribute")
    }

    /// # Safety
    /// As [`crate::driver::Driver::mempool_get_attr`].
    pub(super) unsafe fn mempool_get_attr_impl(
        &self,
        pool: RawPool,
        attr: PoolAttr,
    ) -> Result<u64> {
        if pool == 0 {
            return Err(null_pool("cuMemPoolGetAttribute"));
        }
        let (cu_attr, width) = pool_attr_to_cu(attr);
        let _bound = self.ensure_context()?;
        match width {
            AttrWidth::U64 => {
                let mut v: u64 = 0;
                check(
                    // SAFETY: a live pool (this function's contract); the
                    // driver writes a cuuint64_t for this attribute into `v`.
                    unsafe {
                        sys::cuMemPoolGetAttribute(
                            cu_pool(pool),
                            cu_attr,
                            &mut v as *mut u64 as *mut c_void,
                        )
                    },
                    "cuMemPoolGetAttribute",
                )?;
                Ok(v)
            }
            AttrWidth::I32 => {
                let mut v: c_int = 0;
                check(
                    // SAFETY: a live pool (this function's contract); the
                    // driver writes an int for this attribute into `v`.
                    unsafe {
                        sys::cuMemPoolGetAttribute(
                            cu_pool(pool),
                            cu_attr,
                            &mut v as *mut c_int as *mut c_void,
                        )
                    },
                    "cuMemPoolGetAttribute",
                )?;
                Ok(u64::from(v != 0))
            }
        }
    }

    /// # Safety
    /// As [`crate::driver::Driver::mempool_trim_to`].
    pub(super) unsafe fn mempool_trim_to_impl(&self, pool: RawPool, keep: usize) -> Result<()> {
        if pool == 0 {
            return Err(null_pool("cuMemPoolTrimTo"));
        }
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: a live pool (this function's contract).
            unsafe { sys::cuMemPoolTrimTo(cu_pool(pool), keep) },
            "cuMemPoolTrimTo",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::mempool_set_access`].
    pub(super) unsafe fn mempool_set_access_impl(
        &self,
        pool: RawPool,
        device: u32,
        access: AccessFlags,
    ) -> Result<()> {
        if pool == 0 {
            return Err(null_pool("cuMemPoolSetAccess"));
        }
        let _bound = self.bind(device)?;
        let desc = access_desc(device, access);
        check(
            // SAFETY: a live pool the caller decides for (this function's
            // contract); `desc` is one initialized descriptor, count 1, alive
            // through the call.
            unsafe { sys::cuMemPoolSetAccess(cu_pool(pool), &desc, 1) },
            "cuMemPoolSetAccess",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::mempool_get_access`].
    pub(super) unsafe fn mempool_get_access_impl(
        &self,
        pool: RawPool,
        device: u32,
    ) -> Result<AccessFlags> {
        if pool == 0 {
            return Err(null_pool("cuMemPoolGetAccess"));
        }
        let _bound = self.bind(device)?;
        let mut loc = device_location(device);
        // Read into a plain u32, not the Rust enum, so an unexpected value
        // from the driver is an error instead of an invalid enum.
        let mut raw: u32 = u32::MAX;
        check(
            // SAFETY: a live pool (this function's contract);
            // CUmemAccess_flags is repr(u32), so `raw` has its size and
            // alignment; `loc` is initialized and both live through the call.
            unsafe {
                sys::cuMemPoolGetAccess(
                    &mut raw as *mut u32 as *mut CUmemAccess_flags,
                    cu_pool(pool),
                    &mut loc,
                )
            },
            "cuMemPoolGetAccess",
        )?;
        access_from_cu(raw).ok_or_else(|| {
            Error::unsupported(format!("cuMemPoolGetAccess: unknown access flags {raw}"))
        })
    }

    /// # Safety
    /// As [`crate::driver::Driver::mem_alloc_from_pool_async`].
    pub(super) unsafe fn mem_alloc_from_pool_async_impl(
        &self,
        bytes: usize,
        pool: RawPool,
        stream: RawStream,
    ) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        if pool == 0 {
            return Err(null_pool("cuMemAllocFromPoolAsync"));
        }
        let _bound = self.ensure_context()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: `p` is a valid out-pointer; a live pool and stream (this
        // function's contract).
        let res = unsafe {
            sys::cuMemAllocFromPoolAsync(&mut p, bytes, cu_pool(pool), cu_stream(stream))
        };
        check_alloc(res, "cuMemAllocFromPoolAsync", bytes, || {
            // SAFETY: the stream is live (this function's contract).
            unsafe { self.oom_device(stream) }
        })?;
        Ok(DevicePtr(p))
    }

    /// # Safety
    /// As [`crate::driver::Driver::mem_alloc_async`].
    pub(super) unsafe fn mem_alloc_async_impl(
        &self,
        bytes: usize,
        stream: RawStream,
    ) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let _bound = self.ensure_context()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: `p` is a valid out-pointer; a live stream (this function's
        // contract).
        let res = unsafe { sys::cuMemAllocAsync(&mut p, bytes, cu_stream(stream)) };
        check_alloc(res, "cuMemAllocAsync", bytes, || {
            // SAFETY: the stream is live (this function's contract).
            unsafe { self.oom_device(stream) }
        })?;
        Ok(DevicePtr(p))
    }

    /// # Safety
    /// As [`crate::driver::Driver::mem_free_async`].
    pub(super) unsafe fn mem_free_async_impl(
        &self,
        ptr: DevicePtr,
        stream: RawStream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: a live stream, and a pool allocation the caller owns and
            // frees once (this function's contract).
            unsafe { sys::cuMemFreeAsync(ptr.0, cu_stream(stream)) },
            "cuMemFreeAsync",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::mempool_export_fd`].
    pub(super) unsafe fn mempool_export_fd_impl(&self, pool: RawPool) -> Result<OwnedFd> {
        if pool == 0 {
            return Err(null_pool("cuMemPoolExportToShareableHandle"));
        }
        let _bound = self.ensure_context()?;
        export_posix_fd("cuMemPoolExportToShareableHandle", |fd| {
            // SAFETY: a live pool (this function's contract); for
            // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR the driver writes an int
            // through the handle pointer; `fd` points at one that lives
            // through the call.
            unsafe {
                sys::cuMemPoolExportToShareableHandle(
                    fd,
                    cu_pool(pool),
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            }
        })
    }

    pub(super) fn mempool_import_fd_impl(&self, fd: BorrowedFd<'_>) -> Result<RawPool> {
        let fd = fd.as_raw_fd();
        let _bound = self.ensure_context()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        check(
            // SAFETY: for POSIX file descriptors the handle argument is the fd
            // value itself cast to a pointer (never dereferenced); `pool` is a
            // valid out-pointer.
            unsafe {
                sys::cuMemPoolImportFromShareableHandle(
                    &mut pool,
                    std::ptr::without_provenance_mut(fd as usize),
                    CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                    0,
                )
            },
            "cuMemPoolImportFromShareableHandle",
        )?;
        Ok(pool as usize as RawPool)
    }

    pub(super) fn mempool_export_pointer_impl(&self, ptr: DevicePtr) -> Result<PoolPtrExport> {
        let _bound = self.ensure_context()?;
        let mut data = sys::CUmemPoolPtrExportData { reserved: [0; 64] };
        check(
            // SAFETY: `data` is a valid 64-byte out-struct; the pointer by value.
            unsafe { sys::cuMemPoolExportPointer(&mut data, ptr.0) },
            "cuMemPoolExportPointer",
        )?;
        Ok(PoolPtrExport(data.reserved))
    }

    /// # Safety
    /// As [`crate::driver::Driver::mempool_import_pointer`].
    pub(super) unsafe fn mempool_import_pointer_impl(
        &self,
        pool: RawPool,
        data: &PoolPtrExport,
    ) -> Result<DevicePtr> {
        if pool == 0 {
            return Err(null_pool("cuMemPoolImportPointer"));
        }
        let _bound = self.ensure_context()?;
        let mut share = sys::CUmemPoolPtrExportData { reserved: data.0 };
        let mut p: sys::CUdeviceptr = 0;
        check(
            // SAFETY: a live pool (this function's contract); `p` is a valid
            // out-pointer and `share` an initialized copy of the export data
            // (the driver only reads it).
            unsafe { sys::cuMemPoolImportPointer(&mut p, cu_pool(pool), &mut share) },
            "cuMemPoolImportPointer",
        )?;
        Ok(DevicePtr(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_pool_props() {
        let p = PoolProps {
            max_size: 1 << 30,
            ..PoolProps::device(2)
        };
        let cu = pool_props_to_cu(&p);
        assert_eq!(
            cu.allocType,
            CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED
        );
        assert_eq!(
            cu.handleTypes,
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        );
        assert_eq!(
            cu.location.type_,
            CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE
        );
        assert_eq!(cu.location.id, 2);
        assert_eq!(cu.maxSize, 1 << 30);
        assert!(cu.win32SecurityAttributes.is_null());
        assert_eq!(cu.usage, 0);
        assert!(cu.reserved.iter().all(|b| *b == 0));
    }

    #[test]
    fn host_managed_and_ipc_pool_props() {
        let p = PoolProps {
            alloc_type: AllocationType::Managed,
            location: Location::HostNuma(1),
            handle_type: HandleType::PosixFd,
            max_size: 0,
        };
        let cu = pool_props_to_cu(&p);
        assert_eq!(
            cu.allocType,
            CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_MANAGED
        );
        assert_eq!(
            cu.handleTypes,
            CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        );
        assert_eq!(
            cu.location.type_,
            CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA
        );
        assert_eq!(cu.location.id, 1);
        assert_eq!(cu.maxSize, 0);

        let host = location_to_cu(Location::Host);
        assert_eq!(host.type_, CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST);
        assert_eq!(handle_type_to_cu(HandleType::Fabric).0, 8);
        assert_eq!(handle_type_to_cu(HandleType::PosixFd).0, 1);
        assert_eq!(handle_type_to_cu(HandleType::None).0, 0);
    }

    #[test]
    fn pool_attrs_map_to_driver_values_and_widths() {
        let cases = [
            (PoolAttr::ReuseFollowEventDependencies, 1, AttrWidth::I32),
            (PoolAttr::ReuseAllowOpportunistic, 2, AttrWidth::I32),
            (PoolAttr::ReuseAllowInternalDependencies, 3, AttrWidth::I32),
            (PoolAttr::ReleaseThreshold, 4, AttrWidth::U64),
            (PoolAttr::ReservedMemCurrent, 5, AttrWidth::U64),
            (PoolAttr::ReservedMemHigh, 6, AttrWidth::U64),
            (PoolAttr::UsedMemCurrent, 7, AttrWidth::U64),
            (PoolAttr::UsedMemHigh, 8, AttrWidth::U64),
        ];
        for (attr, code, width) in cases {
            let (a, w) = pool_attr_to_cu(attr);
            assert_eq!(a as u32, code, "{attr:?}");
            assert_eq!(w, width, "{attr:?}");
        }
    }

    #[test]
    fn access_flags_round_trip() {
        for a in [AccessFlags::None, AccessFlags::Read, AccessFlags::ReadWrite] {
            assert_eq!(access_from_cu(access_to_cu(a) as u32), Some(a));
        }
        assert_eq!(access_to_cu(AccessFlags::ReadWrite) as u32, 3);
        assert_eq!(access_from_cu(2), None);
        let d = access_desc(1, AccessFlags::Read);
        assert_eq!(d.location.id, 1);
        assert_eq!(d.flags, CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ);
    }
}
