//! Plain allocation (device, managed, pinned host), prefetch, memset and copies.
//!
//! Zero-byte allocations return [`DevicePtr::NULL`] without a driver call (the
//! driver rejects them), and freeing null is a no-op. Zero-byte memsets,
//! copies and prefetches do nothing. Ranges that would wrap the address space
//! are refused before the driver sees them.

use std::ffi::c_void;

use cudarc::driver::sys::{self, CUmemAttach_flags, CUmemLocationType};

use super::error::{check, check_alloc, check_range};
use super::stream::cu_stream;
use super::CudaDriver;
use crate::driver::{DevicePtr, HostAllocFlags, RawStream};
use crate::{Error, Result};

/// `cuMemHostAlloc` flags for [`HostAllocFlags`].
pub(super) fn host_alloc_flags(flags: HostAllocFlags) -> u32 {
    let mut f = 0;
    if flags.portable {
        f |= sys::CU_MEMHOSTALLOC_PORTABLE;
    }
    if flags.device_map {
        f |= sys::CU_MEMHOSTALLOC_DEVICEMAP;
    }
    if flags.write_combined {
        f |= sys::CU_MEMHOSTALLOC_WRITECOMBINED;
    }
    f
}

/// A `CUmemLocation` for device `ordinal`.
pub(super) fn device_location(ordinal: u32) -> sys::CUmemLocation {
    sys::CUmemLocation {
        type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: ordinal as i32,
    }
}

fn null_host(call: &str) -> Error {
    Error::InvalidArgument(format!("{call}: null host pointer"))
}

impl CudaDriver {
    pub(super) fn mem_alloc_impl(&self, device: u32, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let _bound = self.bind(device)?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: `p` is a valid out-pointer; `device`'s context is current.
        let res = unsafe { sys::cuMemAlloc_v2(&mut p, bytes) };
        check_alloc(res, "cuMemAlloc", bytes, || Some(device))?;
        Ok(DevicePtr(p))
    }

    /// # Safety
    /// As [`crate::driver::Driver::mem_free`].
    pub(super) unsafe fn mem_free_impl(&self, device: u32, ptr: DevicePtr) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let _bound = self.bind(device)?;
        // SAFETY: the caller frees a live allocation of mem_alloc or
        // mem_alloc_managed that it owns and nothing uses after (this
        // function's contract).
        check(unsafe { sys::cuMemFree_v2(ptr.0) }, "cuMemFree")
    }

    pub(super) fn mem_alloc_managed_impl(&self, device: u32, bytes: usize) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let _bound = self.bind(device)?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: `p` is a valid out-pointer; `device`'s context is current.
        let res = unsafe {
            sys::cuMemAllocManaged(
                &mut p,
                bytes,
                CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32,
            )
        };
        check_alloc(res, "cuMemAllocManaged", bytes, || Some(device))?;
        Ok(DevicePtr(p))
    }

    pub(super) fn mem_alloc_host_impl(
        &self,
        device: u32,
        bytes: usize,
        flags: HostAllocFlags,
    ) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let _bound = self.bind(device)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; `device`'s context is current and
        // the flags are the documented CU_MEMHOSTALLOC_* bits.
        let res = unsafe { sys::cuMemHostAlloc(&mut p, bytes, host_alloc_flags(flags)) };
        check_alloc(res, "cuMemHostAlloc", bytes, || Some(device))?;
        Ok(DevicePtr(p as usize as u64))
    }

    /// # Safety
    /// As [`crate::driver::Driver::mem_free_host`].
    pub(super) unsafe fn mem_free_host_impl(&self, ptr: DevicePtr) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: the caller frees a live allocation of mem_alloc_host
            // that it owns, with no reference into it left (this function's
            // contract).
            unsafe { sys::cuMemFreeHost(ptr.as_mut_ptr::<c_void>()) },
            "cuMemFreeHost",
        )
    }

    pub(super) fn mem_advise_preferred_location_impl(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        location: crate::driver::Location,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        check_range(ptr.0, bytes, "cuMemAdvise")?;
        if !self.has_advise_v2 {
            return Err(Error::unsupported(
                "cuMemAdvise_v2: needs a CUDA 12.2 or newer driver",
            ));
        }
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: the symbol was found at load; advice changes only where the
            // driver places pages, it never reads or writes through `ptr`, and the
            // driver validates that the range is managed or system memory.
            unsafe {
                sys::cuMemAdvise_v2(
                    ptr.0,
                    bytes,
                    sys::CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                    super::pool::location_to_cu(location),
                )
            },
            "cuMemAdvise",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::mem_prefetch`].
    pub(super) unsafe fn mem_prefetch_impl(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        device: u32,
        stream: RawStream,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        check_range(ptr.0, bytes, "cuMemPrefetchAsync")?;
        let _bound = self.bind(device)?;
        if !self.has_prefetch_v2 {
            return Err(Error::unsupported(
                "cuMemPrefetchAsync_v2: needs a CUDA 12.2 or newer driver",
            ));
        }
        check(
            // SAFETY: the symbol was found at load; the location is a device of
            // this driver and the stream is live (this function's contract);
            // prefetch only migrates pages, it never writes through `ptr`, and
            // the driver validates that the range is managed memory.
            unsafe {
                sys::cuMemPrefetchAsync_v2(
                    ptr.0,
                    bytes,
                    device_location(device),
                    0,
                    cu_stream(stream),
                )
            },
            "cuMemPrefetchAsync",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::memset_async`].
    pub(super) unsafe fn memset_async_impl(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        check_range(dst.0, bytes, "cuMemsetD8Async")?;
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: addresses by value, range checked not to wrap. The device,
            // not this thread, does the write; the stream is live and the
            // caller names memory it owns (this function's contract).
            unsafe { sys::cuMemsetD8Async(dst.0, value, bytes, cu_stream(stream)) },
            "cuMemsetD8Async",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::memcpy_dtod_async`].
    pub(super) unsafe fn memcpy_dtod_async_impl(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        check_range(dst.0, bytes, "cuMemcpyDtoDAsync")?;
        check_range(src.0, bytes, "cuMemcpyDtoDAsync")?;
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: addresses by value, ranges checked not to wrap; as for
            // memset, the stream is live and the caller names memory it owns
            // (this function's contract).
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst.0, src.0, bytes, cu_stream(stream)) },
            "cuMemcpyDtoDAsync",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::memcpy_peer_async`].
    pub(super) unsafe fn memcpy_peer_async_impl(
        &self,
        (dst, dst_device): (DevicePtr, u32),
        (src, src_device): (DevicePtr, u32),
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        const CALL: &str = "cuMemcpyPeerAsync";
        if bytes == 0 {
            return Ok(());
        }
        check_range(dst.0, bytes, CALL)?;
        check_range(src.0, bytes, CALL)?;
        let dst_ctx = self.primary_ctx(dst_device)?;
        let src_ctx = self.primary_ctx(src_device)?;
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: addresses by value, ranges checked not to wrap; both
            // contexts are primary contexts we retained and never release; as
            // for the other copies, the stream is live and the caller names
            // memory it owns (this function's contract).
            unsafe {
                sys::cuMemcpyPeerAsync(
                    dst.0,
                    dst_ctx as sys::CUcontext,
                    src.0,
                    src_ctx as sys::CUcontext,
                    bytes,
                    cu_stream(stream),
                )
            },
            CALL,
        )
    }

    pub(super) fn mem_address_range_impl(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)> {
        let _bound = self.ensure_context()?;
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        check(
            // SAFETY: both are valid out-pointers; the address is a value the
            // driver looks up.
            unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr.0) },
            "cuMemGetAddressRange",
        )?;
        Ok((DevicePtr(base), size))
    }

    pub(super) fn is_pinned_host_impl(&self, ptr: DevicePtr) -> Result<bool> {
        let _bound = self.ensure_context()?;
        let mut kind: u32 = 0;
        // SAFETY: `kind` is a valid out-pointer of the attribute's type (a
        // `CUmemorytype`, 32 bits); the address is a value the driver looks up.
        let res = unsafe {
            sys::cuPointerGetAttribute(
                (&mut kind as *mut u32).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                ptr.0,
            )
        };
        if res == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
            // Memory the driver does not know (pageable host memory).
            return Ok(false);
        }
        check(res, "cuPointerGetAttribute")?;
        Ok(kind == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32)
    }

    /// # Safety
    /// As [`crate::driver::Driver::memcpy_htod_async`].
    pub(super) unsafe fn memcpy_htod_async_impl(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        if src.is_null() {
            return Err(null_host("cuMemcpyHtoDAsync"));
        }
        check_range(dst.0, bytes, "cuMemcpyHtoDAsync")?;
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: the caller guarantees `src..src+bytes` is readable and stays
            // valid until the copy has run, on a live stream (this function's
            // contract).
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(dst.0, src as *const c_void, bytes, cu_stream(stream))
            },
            "cuMemcpyHtoDAsync",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::memcpy_dtoh_async`].
    pub(super) unsafe fn memcpy_dtoh_async_impl(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        if dst.is_null() {
            return Err(null_host("cuMemcpyDtoHAsync"));
        }
        check_range(src.0, bytes, "cuMemcpyDtoHAsync")?;
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: the caller guarantees `dst..dst+bytes` is writable and
            // untouched until the copy has run, on a live stream (this
            // function's contract).
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src.0, bytes, cu_stream(stream))
            },
            "cuMemcpyDtoHAsync",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_alloc_flags_map_to_cu_bits() {
        assert_eq!(host_alloc_flags(HostAllocFlags::default()), 0);
        let all = HostAllocFlags {
            portable: true,
            device_map: true,
            write_combined: true,
        };
        assert_eq!(host_alloc_flags(all), 1 | 2 | 4);
        let wc = HostAllocFlags {
            write_combined: true,
            ..Default::default()
        };
        assert_eq!(host_alloc_flags(wc), sys::CU_MEMHOSTALLOC_WRITECOMBINED);
    }

    #[test]
    fn device_location_names_the_ordinal() {
        let l = device_location(3);
        assert_eq!(l.type_, CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE);
        assert_eq!(l.id, 3);
    }
}
