//! Loading the driver, primary contexts, and device queries.
//!
//! Loading: `libcuda` is looked for with cudarc's own list of names (cudarc
//! panics when it is absent, so we ask first), every symbol gpumem calls is
//! resolved once (cudarc panics on a missing symbol at first call, so a driver
//! too old for one is refused here as [`Error::NoDriver`]), then `cuInit(0)`.
//!
//! Contexts: each device's primary context is retained on first use and kept
//! for the life of the process (never released: the process may be exiting
//! when the last user goes away, and the driver tears it down itself). A
//! call that needs a device's context makes it current for the call only
//! ([`CudaDriver::bind`]): the application's current context (PyTorch's
//! current device) is current again afterwards, and nothing is cached, since
//! the application changes it behind gpumem's back.

use std::ffi::{c_char, c_int, CStr};
use std::sync::OnceLock;

use cudarc::driver::sys::{self, CUdevice_attribute, CUresult};

use super::error::{check, error_name, mark_library_ready};
use super::CudaDriver;
use crate::driver::{DeviceInfo, MemInfo};
use crate::{Error, Result};

/// Every driver symbol the backend calls. Resolved once at load so that no
/// call can panic on a missing symbol later.
const SYMBOLS: &[&str] = &[
    "cuGetErrorName",
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceTotalMem_v2",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuCtxEnablePeerAccess",
    "cuDevicePrimaryCtxRetain",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxGetDevice",
    "cuCtxSynchronize",
    "cuMemGetInfo_v2",
    "cuMemGetAllocationGranularity",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocManaged",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemsetD8Async",
    "cuMemcpyDtoDAsync_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyPeerAsync",
    "cuMemGetAddressRange_v2",
    "cuDeviceGetDefaultMemPool",
    "cuDeviceGetMemPool",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolSetAttribute",
    "cuMemPoolGetAttribute",
    "cuMemPoolTrimTo",
    "cuMemPoolSetAccess",
    "cuMemPoolGetAccess",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemPoolExportToShareableHandle",
    "cuMemPoolImportFromShareableHandle",
    "cuMemPoolExportPointer",
    "cuMemPoolImportPointer",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemRetainAllocationHandle",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
];

/// Symbols used only where a fallback exists (newer than CUDA 12.0).
pub(super) const SYM_STREAM_GET_DEVICE: &str = "cuStreamGetDevice"; // 12.8
pub(super) const SYM_PREFETCH_V2: &str = "cuMemPrefetchAsync_v2"; // 12.2
pub(super) const SYM_ADVISE_V2: &str = "cuMemAdvise_v2"; // 12.2

/// Stream capture and graphs (CUDA 12.3 and later): checked as a group, so
/// that a driver lacking one still serves everything else and only capture
/// calls report [`Error::Unsupported`].
pub(super) const SYMS_GRAPHS: &[&str] = &[
    "cuStreamBeginCapture_v2",
    "cuStreamEndCapture",
    "cuStreamGetCaptureInfo_v3",
    "cuGraphNodeGetDependencies_v2",
    "cuThreadExchangeStreamCaptureMode",
    "cuGraphInstantiateWithFlags",
    "cuGraphLaunch",
    "cuGraphDestroy",
    "cuGraphExecDestroy",
];

/// Whether cudarc can find `libcuda` under one of its names.
pub(super) fn library_present() -> bool {
    // SAFETY: is_culib_present only dlopens the candidate names and drops what
    // it opened; the CUDA driver's initializers have no preconditions, and
    // failure to open is reported as `false`, not a panic.
    unsafe { sys::is_culib_present() }
}

/// Whether the already-present library exports `name`.
fn has_symbol(name: &str) -> bool {
    // SAFETY: only called after `library_present()` returned true, so culib()
    // finds the same library and does not panic; looking a symbol up runs no
    // code, and the function-pointer type is never called through here.
    unsafe { sys::culib().get::<unsafe extern "C" fn()>(name).is_ok() }
}

/// What `load` learned about the driver.
pub(super) struct Loaded {
    pub devices: Vec<sys::CUdevice>,
    pub has_stream_get_device: bool,
    pub has_prefetch_v2: bool,
    /// Whether `cuMemAdvise_v2` (location-based advice) exists.
    pub has_advise_v2: bool,
    /// The first stream-capture symbol missing, if any ([`SYMS_GRAPHS`]).
    pub missing_graph_symbol: Option<&'static str>,
}

/// Finds the library, checks its symbols, runs `cuInit(0)`, lists devices.
pub(super) fn load() -> Result<Loaded> {
    if !library_present() {
        return Err(Error::NoDriver {
            reason: "the CUDA driver library (libcuda) was not found".into(),
        });
    }
    let missing: Vec<&str> = SYMBOLS.iter().copied().filter(|s| !has_symbol(s)).collect();
    if !missing.is_empty() {
        return Err(Error::NoDriver {
            reason: format!(
                "the CUDA driver library lacks {} (driver too old?)",
                missing.join(", ")
            ),
        });
    }
    mark_library_ready();
    // SAFETY: symbol present (checked above); cuInit takes no pointers.
    let res = unsafe { sys::cuInit(0) };
    if res != CUresult::CUDA_SUCCESS {
        return Err(Error::NoDriver {
            reason: format!("cuInit failed: {} ({})", error_name(res), res as i32),
        });
    }
    let mut count: c_int = 0;
    check(
        // SAFETY: `count` is a valid out-pointer; the driver is initialized.
        unsafe { sys::cuDeviceGetCount(&mut count) },
        "cuDeviceGetCount",
    )?;
    if count <= 0 {
        return Err(Error::NoDriver {
            reason: "the CUDA driver reports no device".into(),
        });
    }
    let mut devices = Vec::with_capacity(count as usize);
    for ordinal in 0..count {
        let mut dev: sys::CUdevice = 0;
        check(
            // SAFETY: `dev` is a valid out-pointer and `ordinal < count`.
            unsafe { sys::cuDeviceGet(&mut dev, ordinal) },
            "cuDeviceGet",
        )?;
        devices.push(dev);
    }
    Ok(Loaded {
        devices,
        has_stream_get_device: has_symbol(SYM_STREAM_GET_DEVICE),
        has_prefetch_v2: has_symbol(SYM_PREFETCH_V2),
        has_advise_v2: has_symbol(SYM_ADVISE_V2),
        missing_graph_symbol: SYMS_GRAPHS.iter().copied().find(|s| !has_symbol(s)),
    })
}

/// A context pointer kept as an integer so that the driver struct is
/// `Send + Sync` (the driver's contexts are usable from any thread).
pub(super) type CtxAddr = usize;

/// The context current on this thread (0: none).
fn current_ctx() -> Result<CtxAddr> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer.
    check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
    Ok(ctx as CtxAddr)
}

/// Makes `ctx` current on this thread.
fn set_current(ctx: CtxAddr) -> Result<()> {
    check(
        // SAFETY: `ctx` is one of our primary contexts, retained and never
        // released, or a context that was current on this thread when a
        // `Bound` took it (its owner keeps it alive), or null (none).
        unsafe { sys::cuCtxSetCurrent(ctx as sys::CUcontext) },
        "cuCtxSetCurrent",
    )
}

/// The context current before a [`CudaDriver::bind`], made current again on
/// drop (nothing when the bind changed nothing).
#[must_use = "the context is put back when the guard drops: keep it for the call"]
pub(super) struct Bound {
    prev: Option<CtxAddr>,
}

impl Drop for Bound {
    fn drop(&mut self) {
        if let Some(prev) = self.prev {
            // A failure leaves our context current: nothing better to do in
            // a drop, and the driver call itself was made.
            let _ = set_current(prev);
        }
    }
}

/// Per-device primary contexts, retained on first use, never released.
pub(super) struct Contexts {
    primary: Vec<OnceLock<CtxAddr>>,
}

impl Contexts {
    pub(super) fn new(count: usize) -> Self {
        Self {
            primary: (0..count).map(|_| OnceLock::new()).collect(),
        }
    }
}

impl CudaDriver {
    /// `NoSuchDevice` unless `device` exists.
    #[inline]
    pub(super) fn cu_device(&self, device: u32) -> Result<sys::CUdevice> {
        match self.devices.get(device as usize) {
            Some(d) => Ok(*d),
            None => Err(Error::NoSuchDevice {
                device,
                count: self.devices.len() as u32,
            }),
        }
    }

    /// The primary context of `device`, retained on first use.
    pub(super) fn primary_ctx(&self, device: u32) -> Result<CtxAddr> {
        let dev = self.cu_device(device)?;
        let cell = &self.contexts.primary[device as usize];
        if let Some(c) = cell.get() {
            return Ok(*c);
        }
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        check(
            // SAFETY: `ctx` is a valid out-pointer and `dev` a device from
            // cuDeviceGet. Two threads racing here both retain the same primary
            // context; the extra reference is harmless since we never release.
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let addr = ctx as CtxAddr;
        let _ = cell.set(addr);
        Ok(cell.get().copied().unwrap_or(addr))
    }

    /// Makes `device`'s primary context current on this thread for one
    /// driver call: the context current before (another device's, the
    /// application's own, or none) is current again when the returned guard
    /// drops. gpumem runs inside applications that keep their own current
    /// device (PyTorch's `cudaSetDevice`): a context left switched would
    /// send their next work to another GPU. Binding the context already
    /// current costs one `cuCtxGetCurrent`.
    #[inline]
    pub(super) fn bind(&self, device: u32) -> Result<Bound> {
        let target = self.primary_ctx(device)?;
        let now = current_ctx()?;
        if now == target {
            return Ok(Bound { prev: None });
        }
        set_current(target)?;
        Ok(Bound { prev: Some(now) })
    }

    /// Makes `device`'s primary context current on this thread and leaves
    /// it there (`Driver::set_current_device`).
    pub(super) fn make_current(&self, device: u32) -> Result<()> {
        let target = self.primary_ctx(device)?;
        if current_ctx()? != target {
            set_current(target)?;
        }
        Ok(())
    }

    /// Makes sure *some* context is current for one call that acts on a
    /// stream, event, pool or address: the one already current, else device
    /// 0's until the guard drops.
    #[inline]
    pub(super) fn ensure_context(&self) -> Result<Bound> {
        if current_ctx()? != 0 {
            return Ok(Bound { prev: None });
        }
        self.bind(0)
    }

    /// Ordinal of the device of the context current on this thread.
    fn current_device_of_current_ctx(&self) -> Result<u32> {
        let mut dev: sys::CUdevice = 0;
        // SAFETY: `dev` is a valid out-pointer; a context is current.
        check(unsafe { sys::cuCtxGetDevice(&mut dev) }, "cuCtxGetDevice")?;
        self.ordinal_of(dev)
    }

    /// The ordinal of a `CUdevice`.
    pub(super) fn ordinal_of(&self, dev: sys::CUdevice) -> Result<u32> {
        self.devices
            .iter()
            .position(|d| *d == dev)
            .map(|i| i as u32)
            .ok_or_else(|| Error::InvalidArgument(format!("unknown CUdevice {dev}")))
    }

    /// The device of the context current on this thread, if any.
    pub(super) fn thread_device(&self) -> Option<u32> {
        match current_ctx() {
            Ok(c) if c != 0 => self.current_device_of_current_ctx().ok(),
            _ => None,
        }
    }

    pub(super) fn current_device_impl(&self) -> Result<u32> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer.
        check(unsafe { sys::cuCtxGetCurrent(&mut ctx) }, "cuCtxGetCurrent")?;
        if ctx.is_null() {
            return Ok(0);
        }
        self.current_device_of_current_ctx()
    }

    fn attribute(&self, dev: sys::CUdevice, attr: CUdevice_attribute) -> Result<i32> {
        let mut v: c_int = 0;
        check(
            // SAFETY: `v` is a valid out-pointer, `dev` a device from cuDeviceGet.
            unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) },
            "cuDeviceGetAttribute",
        )?;
        Ok(v)
    }

    pub(super) fn device_info_impl(&self, device: u32) -> Result<DeviceInfo> {
        let dev = self.cu_device(device)?;
        let _bound = self.bind(device)?;
        let mut name = [0u8; 256];
        check(
            // SAFETY: the buffer is 256 writable bytes and we pass its length; the
            // driver writes a NUL-terminated string of at most that length.
            unsafe { sys::cuDeviceGetName(name.as_mut_ptr() as *mut c_char, 256, dev) },
            "cuDeviceGetName",
        )?;
        let name = CStr::from_bytes_until_nul(&name)
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|_| String::from_utf8_lossy(&name).into_owned());
        let mut total: usize = 0;
        check(
            // SAFETY: `total` is a valid out-pointer.
            unsafe { sys::cuDeviceTotalMem_v2(&mut total, dev) },
            "cuDeviceTotalMem",
        )?;
        use CUdevice_attribute as A;
        let major = self.attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = self.attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let pools = self.attribute(dev, A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)?;
        // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED is the C alias
        // of this one (102); the bindings only carry the older name.
        let vmm = self.attribute(
            dev,
            A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
        )?;
        let vmm_fd = self.attribute(
            dev,
            A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        )?;
        let pool_handles =
            self.attribute(dev, A::CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES)?;
        let managed = self.attribute(dev, A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY)?;
        let pageable = self.attribute(dev, A::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS)?;
        let rdma_vmm = self.attribute(
            dev,
            A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
        )?;
        // Bit 0x1 of the pool handle-type mask is CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.
        let pool_fd = pool_handles & 0x1 != 0;
        Ok(DeviceInfo {
            ordinal: device,
            name,
            total_memory: total,
            compute_capability: (major, minor),
            memory_pools: pools != 0,
            vmm: vmm != 0,
            posix_fd_ipc: vmm_fd != 0 && pool_fd,
            managed_memory: managed != 0,
            pageable_memory_access: pageable != 0,
            gpu_direct_rdma_vmm: vmm != 0 && rdma_vmm != 0,
        })
    }

    pub(super) fn mem_info_impl(&self, device: u32) -> Result<MemInfo> {
        let _bound = self.bind(device)?;
        let (mut free, mut total) = (0usize, 0usize);
        check(
            // SAFETY: both are valid out-pointers; `device`'s context is current.
            unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
            "cuMemGetInfo",
        )?;
        Ok(MemInfo { free, total })
    }

    pub(super) fn can_access_peer_impl(&self, device: u32, peer: u32) -> Result<bool> {
        let dev = self.cu_device(device)?;
        let peer_dev = self.cu_device(peer)?;
        let _bound = self.bind(device)?;
        if device == peer {
            // A device reaches its own memory; the driver answers 0 here.
            return Ok(true);
        }
        let mut can: c_int = 0;
        check(
            // SAFETY: `can` is a valid out-pointer, both devices come from cuDeviceGet.
            unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer_dev) },
            "cuDeviceCanAccessPeer",
        )?;
        Ok(can != 0)
    }

    pub(super) fn enable_peer_access_impl(&self, device: u32, peer: u32) -> Result<bool> {
        if device == peer {
            return Err(crate::driver::peer_access_to_itself(device));
        }
        let peer_ctx = self.primary_ctx(peer)?;
        let _bound = self.bind(device)?;
        // SAFETY: `peer_ctx` is a primary context we retained and never
        // release; `device`'s own primary context is current; flags must be 0.
        let res = unsafe { sys::cuCtxEnablePeerAccess(peer_ctx as sys::CUcontext, 0) };
        match res {
            CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(false),
            res => check(res, "cuCtxEnablePeerAccess").map(|()| true),
        }
    }

    pub(super) fn device_synchronize_impl(&self, device: u32) -> Result<()> {
        let _bound = self.bind(device)?;
        // SAFETY: no arguments; `device`'s context is current.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    /// The CUDA driver version, such as 13000 for 13.0 (`cuDriverGetVersion`).
    pub fn driver_version(&self) -> Result<i32> {
        let mut v: c_int = 0;
        check(
            // SAFETY: `v` is a valid out-pointer; the library is loaded.
            unsafe { sys::cuDriverGetVersion(&mut v) },
            "cuDriverGetVersion",
        )?;
        Ok(v)
    }
}
