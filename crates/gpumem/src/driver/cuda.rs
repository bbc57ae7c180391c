//! The CUDA backend (placeholder: being implemented).

use std::sync::Arc;

use crate::driver::*;
use crate::{Error, Result};

/// The CUDA driver backend.
pub struct CudaDriver {}

impl CudaDriver {
    /// The process-wide CUDA driver.
    pub fn get() -> Result<Arc<CudaDriver>> {
        Err(Error::NoDriver {
            reason: "not implemented".into(),
        })
    }
}

impl Driver for CudaDriver {
    fn backend(&self) -> Backend {
        Backend::Cuda
    }
    fn device_count(&self) -> Result<u32> {
        Err(Error::unsupported("device_count (placeholder)"))
    }
    fn current_device(&self) -> Result<u32> {
        Err(Error::unsupported("current_device (placeholder)"))
    }
    fn set_current_device(&self, _device: u32) -> Result<()> {
        Err(Error::unsupported("set_current_device (placeholder)"))
    }
    fn device_info(&self, _device: u32) -> Result<DeviceInfo> {
        Err(Error::unsupported("device_info (placeholder)"))
    }
    fn mem_info(&self, _device: u32) -> Result<MemInfo> {
        Err(Error::unsupported("mem_info (placeholder)"))
    }
    fn vmm_granularity(&self, _device: u32, _recommended: bool) -> Result<usize> {
        Err(Error::unsupported("vmm_granularity (placeholder)"))
    }
    fn can_access_peer(&self, _device: u32, _peer: u32) -> Result<bool> {
        Err(Error::unsupported("can_access_peer (placeholder)"))
    }
    fn stream_create(&self, _device: u32, _non_blocking: bool) -> Result<RawStream> {
        Err(Error::unsupported("stream_create (placeholder)"))
    }
    fn stream_destroy(&self, _stream: RawStream) -> Result<()> {
        Err(Error::unsupported("stream_destroy (placeholder)"))
    }
    fn stream_synchronize(&self, _stream: RawStream) -> Result<()> {
        Err(Error::unsupported("stream_synchronize (placeholder)"))
    }
    fn stream_query(&self, _stream: RawStream) -> Result<bool> {
        Err(Error::unsupported("stream_query (placeholder)"))
    }
    fn event_create(&self, _device: u32) -> Result<RawEvent> {
        Err(Error::unsupported("event_create (placeholder)"))
    }
    fn event_destroy(&self, _event: RawEvent) -> Result<()> {
        Err(Error::unsupported("event_destroy (placeholder)"))
    }
    fn event_record(&self, _event: RawEvent, _stream: RawStream) -> Result<()> {
        Err(Error::unsupported("event_record (placeholder)"))
    }
    fn event_query(&self, _event: RawEvent) -> Result<bool> {
        Err(Error::unsupported("event_query (placeholder)"))
    }
    fn event_synchronize(&self, _event: RawEvent) -> Result<()> {
        Err(Error::unsupported("event_synchronize (placeholder)"))
    }
    fn stream_wait_event(&self, _stream: RawStream, _event: RawEvent) -> Result<()> {
        Err(Error::unsupported("stream_wait_event (placeholder)"))
    }
    fn device_synchronize(&self, _device: u32) -> Result<()> {
        Err(Error::unsupported("device_synchronize (placeholder)"))
    }
    fn mem_alloc(&self, _device: u32, _bytes: usize) -> Result<DevicePtr> {
        Err(Error::unsupported("mem_alloc (placeholder)"))
    }
    fn mem_free(&self, _device: u32, _ptr: DevicePtr) -> Result<()> {
        Err(Error::unsupported("mem_free (placeholder)"))
    }
    fn mem_alloc_managed(&self, _device: u32, _bytes: usize) -> Result<DevicePtr> {
        Err(Error::unsupported("mem_alloc_managed (placeholder)"))
    }
    fn mem_alloc_host(
        &self,
        _device: u32,
        _bytes: usize,
        _flags: HostAllocFlags,
    ) -> Result<DevicePtr> {
        Err(Error::unsupported("mem_alloc_host (placeholder)"))
    }
    fn mem_free_host(&self, _ptr: DevicePtr) -> Result<()> {
        Err(Error::unsupported("mem_free_host (placeholder)"))
    }
    fn mem_prefetch(
        &self,
        _ptr: DevicePtr,
        _bytes: usize,
        _device: u32,
        _stream: RawStream,
    ) -> Result<()> {
        Err(Error::unsupported("mem_prefetch (placeholder)"))
    }
    fn mem_advise_preferred_location(
        &self,
        _ptr: DevicePtr,
        _bytes: usize,
        _location: Location,
    ) -> Result<()> {
        Err(Error::unsupported("cuMemAdvise (placeholder)"))
    }
    fn memset_async(
        &self,
        _dst: DevicePtr,
        _value: u8,
        _bytes: usize,
        _stream: RawStream,
    ) -> Result<()> {
        Err(Error::unsupported("memset_async (placeholder)"))
    }
    fn memcpy_dtod_async(
        &self,
        _dst: DevicePtr,
        _src: DevicePtr,
        _bytes: usize,
        _stream: RawStream,
    ) -> Result<()> {
        Err(Error::unsupported("memcpy_dtod_async (placeholder)"))
    }
    unsafe fn memcpy_htod_async(
        &self,
        _dst: DevicePtr,
        _src: *const u8,
        _bytes: usize,
        _stream: RawStream,
    ) -> Result<()> {
        Err(Error::unsupported("memcpy_htod_async (placeholder)"))
    }
    unsafe fn memcpy_dtoh_async(
        &self,
        _dst: *mut u8,
        _src: DevicePtr,
        _bytes: usize,
        _stream: RawStream,
    ) -> Result<()> {
        Err(Error::unsupported("memcpy_dtoh_async (placeholder)"))
    }
    fn mempool_default(&self, _device: u32) -> Result<RawPool> {
        Err(Error::unsupported("mempool_default (placeholder)"))
    }
    fn mempool_current(&self, _device: u32) -> Result<RawPool> {
        Err(Error::unsupported("mempool_current (placeholder)"))
    }
    fn mempool_create(&self, _props: &PoolProps) -> Result<RawPool> {
        Err(Error::unsupported("mempool_create (placeholder)"))
    }
    fn mempool_destroy(&self, _pool: RawPool) -> Result<()> {
        Err(Error::unsupported("mempool_destroy (placeholder)"))
    }
    fn mempool_set_attr(&self, _pool: RawPool, _attr: PoolAttr, _value: u64) -> Result<()> {
        Err(Error::unsupported("mempool_set_attr (placeholder)"))
    }
    fn mempool_get_attr(&self, _pool: RawPool, _attr: PoolAttr) -> Result<u64> {
        Err(Error::unsupported("mempool_get_attr (placeholder)"))
    }
    fn mempool_trim_to(&self, _pool: RawPool, _keep: usize) -> Result<()> {
        Err(Error::unsupported("mempool_trim_to (placeholder)"))
    }
    fn mempool_set_access(&self, _pool: RawPool, _device: u32, _access: AccessFlags) -> Result<()> {
        Err(Error::unsupported("mempool_set_access (placeholder)"))
    }
    fn mempool_get_access(&self, _pool: RawPool, _device: u32) -> Result<AccessFlags> {
        Err(Error::unsupported("mempool_get_access (placeholder)"))
    }
    fn mem_alloc_from_pool_async(
        &self,
        _bytes: usize,
        _pool: RawPool,
        _stream: RawStream,
    ) -> Result<DevicePtr> {
        Err(Error::unsupported(
            "mem_alloc_from_pool_async (placeholder)",
        ))
    }
    fn mem_alloc_async(&self, _bytes: usize, _stream: RawStream) -> Result<DevicePtr> {
        Err(Error::unsupported("mem_alloc_async (placeholder)"))
    }
    fn mem_free_async(&self, _ptr: DevicePtr, _stream: RawStream) -> Result<()> {
        Err(Error::unsupported("mem_free_async (placeholder)"))
    }
    fn mempool_export_fd(&self, _pool: RawPool) -> Result<i32> {
        Err(Error::unsupported("mempool_export_fd (placeholder)"))
    }
    fn mempool_import_fd(&self, _fd: i32) -> Result<RawPool> {
        Err(Error::unsupported("mempool_import_fd (placeholder)"))
    }
    fn mempool_export_pointer(&self, _ptr: DevicePtr) -> Result<PoolPtrExport> {
        Err(Error::unsupported("mempool_export_pointer (placeholder)"))
    }
    fn mempool_import_pointer(&self, _pool: RawPool, _data: &PoolPtrExport) -> Result<DevicePtr> {
        Err(Error::unsupported("mempool_import_pointer (placeholder)"))
    }
    fn vmm_reserve(&self, _bytes: usize, _alignment: usize) -> Result<DevicePtr> {
        Err(Error::unsupported("vmm_reserve (placeholder)"))
    }
    fn vmm_free_address(&self, _ptr: DevicePtr, _bytes: usize) -> Result<()> {
        Err(Error::unsupported("vmm_free_address (placeholder)"))
    }
    fn vmm_create(&self, _device: u32, _bytes: usize, _handle_type: HandleType) -> Result<RawPhys> {
        Err(Error::unsupported("vmm_create (placeholder)"))
    }
    fn vmm_release(&self, _handle: RawPhys) -> Result<()> {
        Err(Error::unsupported("vmm_release (placeholder)"))
    }
    fn vmm_map(
        &self,
        _ptr: DevicePtr,
        _bytes: usize,
        _offset: usize,
        _handle: RawPhys,
    ) -> Result<()> {
        Err(Error::unsupported("vmm_map (placeholder)"))
    }
    fn vmm_unmap(&self, _ptr: DevicePtr, _bytes: usize) -> Result<()> {
        Err(Error::unsupported("vmm_unmap (placeholder)"))
    }
    fn vmm_set_access(
        &self,
        _ptr: DevicePtr,
        _bytes: usize,
        _device: u32,
        _access: AccessFlags,
    ) -> Result<()> {
        Err(Error::unsupported("vmm_set_access (placeholder)"))
    }
    fn vmm_export_fd(&self, _handle: RawPhys) -> Result<i32> {
        Err(Error::unsupported("vmm_export_fd (placeholder)"))
    }
    fn vmm_import_fd(&self, _fd: i32) -> Result<RawPhys> {
        Err(Error::unsupported("vmm_import_fd (placeholder)"))
    }
}
