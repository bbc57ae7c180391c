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

/// `Driver` methods that are `unsafe` for their raw handles or memory, each
/// handed over to its helper, an `unsafe fn` whose contract is the method's.
macro_rules! unsafe_to_helpers {
    ($($name:ident => $helper:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            unsafe fn $name(&self, $($arg: $ty),*) -> Result<$ret> {
                // SAFETY: the caller upholds this method's contract, which is
                // the helper's.
                unsafe { self.$helper($($arg),*) }
            }
        )*
    };
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
    unsafe_to_helpers! {
        stream_destroy => stream_destroy_impl(stream: RawStream) -> ();
        stream_synchronize => stream_synchronize_impl(stream: RawStream) -> ();
        stream_query => stream_query_impl(stream: RawStream) -> bool;
    }
    fn event_create(&self, device: u32) -> Result<RawEvent> {
        self.event_create_impl(device)
    }
    unsafe_to_helpers! {
        event_destroy => event_destroy_impl(event: RawEvent) -> ();
        event_record => event_record_impl(event: RawEvent, stream: RawStream) -> ();
        event_query => event_query_impl(event: RawEvent) -> bool;
        event_synchronize => event_synchronize_impl(event: RawEvent) -> ();
        stream_wait_event => stream_wait_event_impl(stream: RawStream, event: RawEvent) -> ();
    }
    fn device_synchronize(&self, device: u32) -> Result<()> {
        self.device_synchronize_impl(device)
    }

    unsafe_to_helpers! {
        stream_begin_capture => stream_begin_capture_impl(
            stream: RawStream, mode: CaptureMode
        ) -> ();
        stream_end_capture => stream_end_capture_impl(stream: RawStream) -> RawGraph;
        stream_capture_info => stream_capture_info_impl(stream: RawStream) -> CaptureInfo;
        stream_capture_dependencies => stream_capture_dependencies_impl(
            stream: RawStream
        ) -> (CaptureInfo, Vec<RawGraphNode>);
        graph_node_dependencies => graph_node_dependencies_impl(
            node: RawGraphNode
        ) -> Vec<RawGraphNode>;
    }
    fn thread_exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode> {
        self.thread_exchange_capture_mode_impl(mode)
    }
    unsafe_to_helpers! {
        graph_instantiate => graph_instantiate_impl(graph: RawGraph) -> RawGraphExec;
        graph_launch => graph_launch_impl(exec: RawGraphExec, stream: RawStream) -> ();
        graph_destroy => graph_destroy_impl(graph: RawGraph) -> ();
        graph_exec_destroy => graph_exec_destroy_impl(exec: RawGraphExec) -> ();
    }

    fn mem_alloc(&self, device: u32, bytes: usize) -> Result<DevicePtr> {
        self.mem_alloc_impl(device, bytes)
    }
    unsafe_to_helpers! {
        mem_free => mem_free_impl(device: u32, ptr: DevicePtr) -> ();
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
    unsafe_to_helpers! {
        mem_free_host => mem_free_host_impl(ptr: DevicePtr) -> ();
        mem_prefetch => mem_prefetch_impl(
            ptr: DevicePtr, bytes: usize, device: u32, stream: RawStream
        ) -> ();
    }

    fn mem_advise_preferred_location(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        location: Location,
    ) -> Result<()> {
        self.mem_advise_preferred_location_impl(ptr, bytes, location)
    }

    unsafe_to_helpers! {
        memset_async => memset_async_impl(
            dst: DevicePtr, value: u8, bytes: usize, stream: RawStream
        ) -> ();
        memcpy_dtod_async => memcpy_dtod_async_impl(
            dst: DevicePtr, src: DevicePtr, bytes: usize, stream: RawStream
        ) -> ();
        memcpy_htod_async => memcpy_htod_async_impl(
            dst: DevicePtr, src: *const u8, bytes: usize, stream: RawStream
        ) -> ();
        memcpy_dtoh_async => memcpy_dtoh_async_impl(
            dst: *mut u8, src: DevicePtr, bytes: usize, stream: RawStream
        ) -> ();
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
        // SAFETY: the caller upholds this method's contract, which is the
        // helper's.
        unsafe { self.memcpy_peer_async_impl((dst, dst_device), (src, src_device), bytes, stream) }
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
    unsafe_to_helpers! {
        mempool_destroy => mempool_destroy_impl(pool: RawPool) -> ();
        mempool_set_attr => mempool_set_attr_impl(pool: RawPool, attr: PoolAttr, value: u64) -> ();
        mempool_get_attr => mempool_get_attr_impl(pool: RawPool, attr: PoolAttr) -> u64;
        mempool_trim_to => mempool_trim_to_impl(pool: RawPool, keep: usize) -> ();
        mempool_set_access => mempool_set_access_impl(
            pool: RawPool, device: u32, access: AccessFlags
        ) -> ();
        mempool_get_access => mempool_get_access_impl(pool: RawPool, device: u32) -> AccessFlags;
        mem_alloc_from_pool_async => mem_alloc_from_pool_async_impl(
            bytes: usize, pool: RawPool, stream: RawStream
        ) -> DevicePtr;
        mem_alloc_async => mem_alloc_async_impl(bytes: usize, stream: RawStream) -> DevicePtr;
        mem_free_async => mem_free_async_impl(ptr: DevicePtr, stream: RawStream) -> ();
        mempool_export_fd => mempool_export_fd_impl(pool: RawPool) -> OwnedFd;
    }
    fn mempool_import_fd(&self, fd: BorrowedFd<'_>) -> Result<RawPool> {
        self.mempool_import_fd_impl(fd)
    }
    fn mempool_export_pointer(&self, ptr: DevicePtr) -> Result<PoolPtrExport> {
        self.mempool_export_pointer_impl(ptr)
    }
    unsafe_to_helpers! {
        mempool_import_pointer => mempool_import_pointer_impl(
            pool: RawPool, data: &PoolPtrExport
        ) -> DevicePtr;
    }

    fn vmm_reserve(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
        self.vmm_reserve_impl(bytes, alignment)
    }
    unsafe_to_helpers! {
        vmm_free_address => vmm_free_address_impl(ptr: DevicePtr, bytes: usize) -> ();
    }
    fn vmm_create(&self, device: u32, bytes: usize, props: PhysProps) -> Result<RawPhys> {
        self.vmm_create_impl(device, bytes, props)
    }
    unsafe_to_helpers! {
        vmm_release => vmm_release_impl(handle: RawPhys) -> ();
    }
    fn vmm_retain_handle(&self, ptr: DevicePtr) -> Result<RawPhys> {
        self.vmm_retain_handle_impl(ptr)
    }
    unsafe_to_helpers! {
        vmm_map => vmm_map_impl(ptr: DevicePtr, bytes: usize, offset: usize, handle: RawPhys) -> ();
        vmm_unmap => vmm_unmap_impl(ptr: DevicePtr, bytes: usize) -> ();
        vmm_set_access => vmm_set_access_impl(
            ptr: DevicePtr, bytes: usize, device: u32, access: AccessFlags
        ) -> ();
        vmm_export_fd => vmm_export_fd_impl(handle: RawPhys) -> OwnedFd;
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
