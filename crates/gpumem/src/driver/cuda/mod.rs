//! The CUDA backend: [`Driver`] over the CUDA driver API, loaded at run time
//! through `cudarc`'s raw bindings (`cudarc::driver::sys`, CUDA 13.0).
//!
//! [`CudaDriver::get`] returns the one process-wide instance, or
//! [`Error::NoDriver`] when `libcuda` is missing, lacks a symbol gpumem calls,
//! or `cuInit` fails (no device); the failure is kept and returned on every
//! call. Every method is one driver call (plus, the first time on a thread,
//! making a context current), with the errors mapped as the module
//! documentation of [`crate::driver`] says.
//!
//! Files, one concept each: `context` (loading, primary contexts, device
//! queries), `stream` (streams and events), `memory` (plain allocation and
//! copies), `pool` (stream-ordered pools), `vmm` (virtual memory), `graph`
//! (stream capture and graphs), `error` (`CUresult` to [`Error`]).

mod context;
mod error;
mod graph;
mod memory;
mod pool;
mod stream;
mod vmm;

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys;

pub use error::error_name;

use crate::driver::*;
use crate::{Error, Result};

/// The CUDA driver backend. Obtain it with [`CudaDriver::get`].
pub struct CudaDriver {
    /// `CUdevice` of each ordinal.
    devices: Vec<sys::CUdevice>,
    contexts: context::Contexts,
    has_stream_get_device: bool,
    has_prefetch_v2: bool,
    has_advise_v2: bool,
    /// The first stream-capture symbol the driver lacks, if any.
    missing_graph_symbol: Option<&'static str>,
}

impl std::fmt::Debug for CudaDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDriver")
            .field("devices", &self.devices.len())
            .finish_non_exhaustive()
    }
}

impl CudaDriver {
    /// The process-wide CUDA driver: loads `libcuda`, checks it has every
    /// symbol gpumem uses, and runs `cuInit(0)` on the first call.
    ///
    /// [`Error::NoDriver`] when the library is missing or too old, or `cuInit`
    /// fails (for instance `CUDA_ERROR_NO_DEVICE`); the same error comes back
    /// on every later call. Never panics.
    pub fn get() -> Result<Arc<CudaDriver>> {
        static INSTANCE: OnceLock<Result<Arc<CudaDriver>>> = OnceLock::new();
        INSTANCE
            .get_or_init(|| {
                let loaded = context::load()?;
                // Registered after cuInit, so it runs before the driver's own
                // exit-time teardown (atexit handlers run in reverse order).
                crate::exit::install_hook();
                Ok(Arc::new(CudaDriver {
                    contexts: context::Contexts::new(loaded.devices.len()),
                    devices: loaded.devices,
                    has_stream_get_device: loaded.has_stream_get_device,
                    has_prefetch_v2: loaded.has_prefetch_v2,
                    has_advise_v2: loaded.has_advise_v2,
                    missing_graph_symbol: loaded.missing_graph_symbol,
                }))
            })
            .clone()
    }

    /// Whether the CUDA driver library can be found under one of the names
    /// cudarc looks for (`libcuda.so`, `libcuda.so.1`, ...). When false,
    /// [`CudaDriver::get`] returns [`Error::NoDriver`].
    pub fn library_present() -> bool {
        context::library_present()
    }

    /// Checks that `path` names a loadable CUDA driver library: opens it and
    /// looks up `cuInit` and `cuGetErrorName`, then closes it. The backend
    /// itself always loads the library cudarc finds; this is a diagnostic.
    ///
    /// [`Error::NoDriver`] with the loader's message when the file cannot be
    /// opened or lacks the symbols.
    ///
    /// # Safety
    /// Opening a shared library runs its initialization routines: `path` must
    /// name a library for which that is sound (the CUDA driver's is), or
    /// nothing at all.
    pub unsafe fn probe_library(path: &str) -> Result<()> {
        // SAFETY: the caller vouches for the library's initializers (this
        // function's contract); a missing file runs nothing.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| Error::NoDriver {
            reason: format!("cannot load {path}: {e}"),
        })?;
        for sym in ["cuInit", "cuGetErrorName"] {
            // SAFETY: looking a symbol up runs no code; the pointer type is
            // never called through.
            if let Err(e) = unsafe { lib.get::<unsafe extern "C" fn()>(sym) } {
                return Err(Error::NoDriver {
                    reason: format!("{path} is not a CUDA driver library: {e}"),
                });
            }
        }
        Ok(())
    }
}

impl Driver for CudaDriver {
    fn backend(&self) -> Backend {
        Backend::Cuda
    }
    fn device_count(&self) -> Result<u32> {
        Ok(self.devices.len() as u32)
    }
    fn current_device(&self) -> Result<u32> {
        self.current_device_impl()
    }
    fn set_current_device(&self, device: u32) -> Result<()> {
        self.make_current(device)
    }
    fn device_info(&self, device: u32) -> Result<DeviceInfo> {
        self.device_info_impl(device)
    }
    fn mem_info(&self, device: u32) -> Result<MemInfo> {
        self.mem_info_impl(device)
    }
    fn vmm_granularity(&self, device: u32, recommended: bool) -> Result<usize> {
        self.vmm_granularity_impl(device, recommended)
    }
    fn can_access_peer(&self, device: u32, peer: u32) -> Result<bool> {
        self.can_access_peer_impl(device, peer)
    }
    fn enable_peer_access(&self, device: u32, peer: u32) -> Result<bool> {
        self.enable_peer_access_impl(device, peer)
    }

    fn stream_create(&self, device: u32, non_blocking: bool) -> Result<RawStream> {
        self.stream_create_impl(device, non_blocking)
    }
    fn stream_destroy(&self, stream: RawStream) -> Result<()> {
        self.stream_destroy_impl(stream)
    }
    fn stream_synchronize(&self, stream: RawStream) -> Result<()> {
        self.stream_synchronize_impl(stream)
    }
    fn stream_query(&self, stream: RawStream) -> Result<bool> {
        self.stream_query_impl(stream)
    }
    fn event_create(&self, device: u32) -> Result<RawEvent> {
        self.event_create_impl(device)
    }
    fn event_destroy(&self, event: RawEvent) -> Result<()> {
        self.event_destroy_impl(event)
    }
    fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        self.event_record_impl(event, stream)
    }
    fn event_query(&self, event: RawEvent) -> Result<bool> {
        self.event_query_impl(event)
    }
    fn event_synchronize(&self, event: RawEvent) -> Result<()> {
        self.event_synchronize_impl(event)
    }
    fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        self.stream_wait_event_impl(stream, event)
    }
    fn device_synchronize(&self, device: u32) -> Result<()> {
        self.device_synchronize_impl(device)
    }

    fn stream_begin_capture(&self, stream: RawStream, mode: CaptureMode) -> Result<()> {
        self.stream_begin_capture_impl(stream, mode)
    }
    fn stream_end_capture(&self, stream: RawStream) -> Result<RawGraph> {
        self.stream_end_capture_impl(stream)
    }
    fn stream_capture_info(&self, stream: RawStream) -> Result<CaptureInfo> {
        self.stream_capture_info_impl(stream)
    }
    fn stream_capture_dependencies(
        &self,
        stream: RawStream,
    ) -> Result<(CaptureInfo, Vec<RawGraphNode>)> {
        self.stream_capture_dependencies_impl(stream)
    }
    fn graph_node_dependencies(&self, node: RawGraphNode) -> Result<Vec<RawGraphNode>> {
        self.graph_node_dependencies_impl(node)
    }
    fn thread_exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode> {
        self.thread_exchange_capture_mode_impl(mode)
    }
    fn graph_instantiate(&self, graph: RawGraph) -> Result<RawGraphExec> {
        self.graph_instantiate_impl(graph)
    }
    fn graph_launch(&self, exec: RawGraphExec, stream: RawStream) -> Result<()> {
        self.graph_launch_impl(exec, stream)
    }
    fn graph_destroy(&self, graph: RawGraph) -> Result<()> {
        self.graph_destroy_impl(graph)
    }
    fn graph_exec_destroy(&self, exec: RawGraphExec) -> Result<()> {
        self.graph_exec_destroy_impl(exec)
    }

    fn mem_alloc(&self, device: u32, bytes: usize) -> Result<DevicePtr> {
        self.mem_alloc_impl(device, bytes)
    }
    fn mem_free(&self, device: u32, ptr: DevicePtr) -> Result<()> {
        self.mem_free_impl(device, ptr)
    }
    fn mem_alloc_managed(&self, device: u32, bytes: usize) -> Result<DevicePtr> {
        self.mem_alloc_managed_impl(device, bytes)
    }
    fn mem_alloc_host(
        &self,
        device: u32,
        bytes: usize,
        flags: HostAllocFlags,
    ) -> Result<DevicePtr> {
        self.mem_alloc_host_impl(device, bytes, flags)
    }
    fn mem_free_host(&self, ptr: DevicePtr) -> Result<()> {
        self.mem_free_host_impl(ptr)
    }
    fn mem_prefetch(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        device: u32,
        stream: RawStream,
    ) -> Result<()> {
        self.mem_prefetch_impl(ptr, bytes, device, stream)
    }

    fn mem_advise_preferred_location(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        location: Location,
    ) -> Result<()> {
        self.mem_advise_preferred_location_impl(ptr, bytes, location)
    }

    unsafe fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.memset_async_impl(dst, value, bytes, stream)
    }
    unsafe fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.memcpy_dtod_async_impl(dst, src, bytes, stream)
    }
    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: the caller upholds this method's contract, which is the
        // helper's.
        unsafe { self.memcpy_htod_async_impl(dst, src, bytes, stream) }
    }
    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: the caller upholds this method's contract, which is the
        // helper's.
        unsafe { self.memcpy_dtoh_async_impl(dst, src, bytes, stream) }
    }

    unsafe fn memcpy_peer_async(
        &self,
        dst: DevicePtr,
        dst_device: u32,
        src: DevicePtr,
        src_device: u32,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        self.memcpy_peer_async_impl((dst, dst_device), (src, src_device), bytes, stream)
    }
    fn mem_address_range(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)> {
        self.mem_address_range_impl(ptr)
    }
    fn is_pinned_host(&self, ptr: DevicePtr) -> Result<bool> {
        self.is_pinned_host_impl(ptr)
    }

    fn mempool_default(&self, device: u32) -> Result<RawPool> {
        self.mempool_default_impl(device)
    }
    fn mempool_current(&self, device: u32) -> Result<RawPool> {
        self.mempool_current_impl(device)
    }
    fn mempool_create(&self, props: &PoolProps) -> Result<RawPool> {
        self.mempool_create_impl(props)
    }
    fn mempool_destroy(&self, pool: RawPool) -> Result<()> {
        self.mempool_destroy_impl(pool)
    }
    fn mempool_set_attr(&self, pool: RawPool, attr: PoolAttr, value: u64) -> Result<()> {
        self.mempool_set_attr_impl(pool, attr, value)
    }
    fn mempool_get_attr(&self, pool: RawPool, attr: PoolAttr) -> Result<u64> {
        self.mempool_get_attr_impl(pool, attr)
    }
    fn mempool_trim_to(&self, pool: RawPool, keep: usize) -> Result<()> {
        self.mempool_trim_to_impl(pool, keep)
    }
    fn mempool_set_access(&self, pool: RawPool, device: u32, access: AccessFlags) -> Result<()> {
        self.mempool_set_access_impl(pool, device, access)
    }
    fn mempool_get_access(&self, pool: RawPool, device: u32) -> Result<AccessFlags> {
        self.mempool_get_access_impl(pool, device)
    }
    fn mem_alloc_from_pool_async(
        &self,
        bytes: usize,
        pool: RawPool,
        stream: RawStream,
    ) -> Result<DevicePtr> {
        self.mem_alloc_from_pool_async_impl(bytes, pool, stream)
    }
    fn mem_alloc_async(&self, bytes: usize, stream: RawStream) -> Result<DevicePtr> {
        self.mem_alloc_async_impl(bytes, stream)
    }
    fn mem_free_async(&self, ptr: DevicePtr, stream: RawStream) -> Result<()> {
        self.mem_free_async_impl(ptr, stream)
    }
    fn mempool_export_fd(&self, pool: RawPool) -> Result<OwnedFd> {
        self.mempool_export_fd_impl(pool)
    }
    fn mempool_import_fd(&self, fd: BorrowedFd<'_>) -> Result<RawPool> {
        self.mempool_import_fd_impl(fd)
    }
    fn mempool_export_pointer(&self, ptr: DevicePtr) -> Result<PoolPtrExport> {
        self.mempool_export_pointer_impl(ptr)
    }
    fn mempool_import_pointer(&self, pool: RawPool, data: &PoolPtrExport) -> Result<DevicePtr> {
        self.mempool_import_pointer_impl(pool, data)
    }

    fn vmm_reserve(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
        self.vmm_reserve_impl(bytes, alignment)
    }
    fn vmm_free_address(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.vmm_free_address_impl(ptr, bytes)
    }
    fn vmm_create(&self, device: u32, bytes: usize, props: PhysProps) -> Result<RawPhys> {
        self.vmm_create_impl(device, bytes, props)
    }
    fn vmm_release(&self, handle: RawPhys) -> Result<()> {
        self.vmm_release_impl(handle)
    }
    fn vmm_retain_handle(&self, ptr: DevicePtr) -> Result<RawPhys> {
        self.vmm_retain_handle_impl(ptr)
    }
    fn vmm_map(&self, ptr: DevicePtr, bytes: usize, offset: usize, handle: RawPhys) -> Result<()> {
        self.vmm_map_impl(ptr, bytes, offset, handle)
    }
    fn vmm_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.vmm_unmap_impl(ptr, bytes)
    }
    fn vmm_set_access(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        device: u32,
        access: AccessFlags,
    ) -> Result<()> {
        self.vmm_set_access_impl(ptr, bytes, device, access)
    }
    fn vmm_export_fd(&self, handle: RawPhys) -> Result<OwnedFd> {
        self.vmm_export_fd_impl(handle)
    }
    fn vmm_import_fd(&self, fd: BorrowedFd<'_>) -> Result<RawPhys> {
        self.vmm_import_fd_impl(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_is_no_driver_without_a_library_and_ok_with_one() {
        let first = CudaDriver::get();
        if CudaDriver::library_present() {
            // A machine with libcuda but no GPU still yields NoDriver (cuInit
            // fails); with a GPU it is Ok. Either way: no panic, a value.
            match &first {
                Ok(d) => assert!(d.device_count().unwrap() >= 1),
                Err(e) => assert!(matches!(e, Error::NoDriver { .. }), "{e:?}"),
            }
        } else {
            match &first {
                Err(Error::NoDriver { reason }) => {
                    assert!(reason.contains("libcuda"), "{reason}")
                }
                other => panic!("expected NoDriver, got {other:?}"),
            }
        }
        // The outcome is kept: a second call reports the same thing.
        let second = CudaDriver::get();
        match (&first, &second) {
            (Ok(a), Ok(b)) => assert!(Arc::ptr_eq(a, b)),
            (Err(a), Err(b)) => assert_eq!(a, b),
            _ => panic!("get() changed its answer"),
        }
    }

    #[test]
    fn probing_a_missing_library_is_no_driver() {
        // SAFETY: the path does not exist, so no library code runs.
        let r = unsafe { CudaDriver::probe_library("/nonexistent/gpumem/libcuda.so.1") };
        match r {
            Err(Error::NoDriver { reason }) => {
                assert!(
                    reason.contains("/nonexistent/gpumem/libcuda.so.1"),
                    "{reason}"
                )
            }
            other => panic!("expected NoDriver, got {other:?}"),
        }
    }

    #[test]
    fn probing_a_library_that_is_not_cuda_is_no_driver() {
        // libc is on every Linux machine and has no cuInit.
        if cfg!(target_os = "linux") {
            // SAFETY: libc is already loaded in this process; opening it again
            // runs no new initializers.
            let r = unsafe { CudaDriver::probe_library("libc.so.6") };
            assert!(matches!(r, Err(Error::NoDriver { .. })), "{r:?}");
        }
    }
}
