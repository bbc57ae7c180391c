//! The `Driver` trait over the simulator: each method counts its call under
//! its CUDA name (maybe failing it, see `faults`), applies the stream-capture
//! rules (see `capture`), makes a passed device current on the calling
//! thread, and hands over to the `State` method that models it. Costs: one mutex lock per call plus the modelled work.
//!
//! The `unsafe` methods are `unsafe` for the trait's sake only: here a
//! handle is a key of the simulator's tables, and one it does not hold is
//! refused with CUDA's error, never followed (see `tests.rs`,
//! `stale_handles_are_refused`).

use super::faults::{self, drv, INVALID_HANDLE, NOT_SUPPORTED};
use super::memory::Addr;
use super::streams::{EventState, Op, Record};
use super::{SimDriver, TAG_EVENT};
use crate::driver::*;
use crate::Result;
use std::os::fd::{BorrowedFd, OwnedFd};

impl Driver for SimDriver {
    fn backend(&self) -> Backend {
        Backend::Sim
    }

    fn device_count(&self) -> Result<u32> {
        self.call("cuDeviceGetCount", |st, _| Ok(st.devices.len() as u32))
    }

    fn current_device(&self) -> Result<u32> {
        self.call("cuCtxGetDevice", |_, ctx| Ok(ctx.device))
    }

    fn set_current_device(&self, device: u32) -> Result<()> {
        self.make_current(device)
    }

    fn device_info(&self, device: u32) -> Result<DeviceInfo> {
        self.call_dev("cuDeviceGetAttribute", device, |st, _| {
            let c = &st.cfg;
            Ok(DeviceInfo {
                ordinal: device,
                name: c.name.clone(),
                total_memory: c.capacity,
                compute_capability: c.compute_capability,
                memory_pools: c.memory_pools,
                vmm: c.vmm,
                posix_fd_ipc: c.posix_fd_ipc,
                managed_memory: c.managed_memory,
                pageable_memory_access: st.cfg.pageable_memory_access,
                gpu_direct_rdma_vmm: c.vmm && c.gpu_direct_rdma,
            })
        })
    }

    fn mem_info(&self, device: u32) -> Result<MemInfo> {
        self.call_dev("cuMemGetInfo", device, |st, _| {
            let used = st.devices[device as usize].used;
            Ok(MemInfo {
                free: st.capacity.saturating_sub(used) as usize,
                total: st.capacity as usize,
            })
        })
    }

    fn vmm_granularity(&self, device: u32, _recommended: bool) -> Result<usize> {
        const CALL: &str = "cuMemGetAllocationGranularity";
        self.call_dev(CALL, device, |st, _| {
            if !st.cfg.vmm {
                return Err(drv(CALL, NOT_SUPPORTED));
            }
            Ok(st.gran as usize)
        })
    }

    fn can_access_peer(&self, device: u32, peer: u32) -> Result<bool> {
        const CALL: &str = "cuDeviceCanAccessPeer";
        self.call(CALL, |st, _| {
            st.check_device(device, CALL)?;
            st.check_device(peer, CALL)?;
            Ok(st.can_access_peer(device, peer))
        })
    }

    fn enable_peer_access(&self, device: u32, peer: u32) -> Result<bool> {
        self.call("cuCtxEnablePeerAccess", |st, _| {
            st.enable_peer_access(device, peer)
        })
    }

    fn stream_create(&self, device: u32, non_blocking: bool) -> Result<RawStream> {
        self.call_dev("cuStreamCreate", device, |st, _| {
            Ok(st.stream_create(device, non_blocking))
        })
    }

    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()> {
        self.call("cuStreamDestroy", |st, _| {
            let q = st.streams.get(&stream).copied();
            st.stream_destroy(stream)?;
            if let Some(q) = q {
                st.retired.insert(stream, q);
            }
            Ok(())
        })
    }

    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<()> {
        const CALL: &str = "cuStreamSynchronize";
        self.call_raw(CALL, |st, ctx| {
            let q = st.queue_of(stream, ctx, CALL)?;
            st.check_stream_sync(q, CALL, ctx)?;
            let device = st.queue_device(q);
            st.force_all(q);
            st.release_at_sync(device);
            Ok(())
        })
    }

    unsafe fn stream_query(&self, stream: RawStream) -> Result<bool> {
        const CALL: &str = "cuStreamQuery";
        self.call_raw(CALL, |st, ctx| {
            let q = st.queue_of(stream, ctx, CALL)?;
            st.check_stream_sync(q, CALL, ctx)?;
            Ok(st.queues.get(&q).is_none_or(|q| q.pending_len() == 0))
        })
    }

    fn event_create(&self, device: u32) -> Result<RawEvent> {
        self.call_dev("cuEventCreate", device, |st, _| {
            let h = st.fresh_handle(TAG_EVENT);
            st.events.insert(
                h,
                EventState {
                    device,
                    record: Record::Never,
                },
            );
            Ok(h)
        })
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()> {
        const CALL: &str = "cuEventDestroy";
        self.call(CALL, |st, _| {
            st.events
                .remove(&event)
                .map(|_| ())
                .ok_or_else(|| drv(CALL, INVALID_HANDLE))
        })
    }

    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        const CALL: &str = "cuEventRecord";
        self.call(CALL, |st, ctx| {
            if !st.events.contains_key(&event) {
                return Err(drv(CALL, INVALID_HANDLE));
            }
            let q = st.queue_of(stream, ctx, CALL)?;
            match st.stream_gate(q, CALL)? {
                Some(id) => {
                    st.capture_event_record(event, q, id);
                    Ok(())
                }
                None => st.event_record(event, q),
            }
        })
    }

    unsafe fn event_query(&self, event: RawEvent) -> Result<bool> {
        const CALL: &str = "cuEventQuery";
        self.call_raw(CALL, |st, ctx| {
            if !st.events.contains_key(&event) {
                return Err(drv(CALL, INVALID_HANDLE));
            }
            st.check_event_use(event, CALL, ctx)?;
            Ok(match st.events[&event].record {
                Record::At(q, p) => st.reached(q, p),
                Record::Never | Record::Captured(..) => true,
            })
        })
    }

    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<()> {
        const CALL: &str = "cuEventSynchronize";
        self.call_raw(CALL, |st, ctx| {
            if !st.events.contains_key(&event) {
                return Err(drv(CALL, INVALID_HANDLE));
            }
            st.check_event_use(event, CALL, ctx)?;
            let e = &st.events[&event];
            let device = e.device;
            if let Record::At(q, p) = e.record {
                st.force(q, p);
            }
            st.release_at_sync(device);
            Ok(())
        })
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        const CALL: &str = "cuStreamWaitEvent";
        self.call(CALL, |st, ctx| {
            if !st.events.contains_key(&event) {
                return Err(drv(CALL, INVALID_HANDLE));
            }
            let q = st.queue_of(stream, ctx, CALL)?;
            let gate = st.stream_gate(q, CALL)?;
            st.wait_event(q, gate, event)
        })
    }

    fn device_synchronize(&self, device: u32) -> Result<()> {
        const CALL: &str = "cuCtxSynchronize";
        self.call_dev(CALL, device, |st, _| {
            st.check_device_sync(device, CALL)?;
            for q in st.queues_of_device(device) {
                st.force_all(q);
            }
            st.release_at_sync(device);
            Ok(())
        })
    }

    unsafe fn stream_begin_capture(&self, stream: RawStream, mode: CaptureMode) -> Result<()> {
        const CALL: &str = "cuStreamBeginCapture";
        self.call(CALL, |st, ctx| {
            let q = st.queue_of(stream, ctx, CALL)?;
            st.begin_capture(q, mode, ctx)
        })
    }

    unsafe fn stream_end_capture(&self, stream: RawStream) -> Result<RawGraph> {
        const CALL: &str = "cuStreamEndCapture";
        self.call(CALL, |st, ctx| {
            let q = st.queue_of(stream, ctx, CALL)?;
            st.end_capture(q, ctx)
        })
    }

    unsafe fn stream_capture_info(&self, stream: RawStream) -> Result<CaptureInfo> {
        const CALL: &str = "cuStreamGetCaptureInfo";
        self.call(CALL, |st, ctx| {
            let q = st.queue_of(stream, ctx, CALL)?;
            Ok(st.capture_info(q))
        })
    }

    unsafe fn stream_capture_dependencies(
        &self,
        stream: RawStream,
    ) -> Result<(CaptureInfo, Vec<RawGraphNode>)> {
        const CALL: &str = "cuStreamGetCaptureInfo";
        self.call(CALL, |st, ctx| {
            let q = st.queue_of(stream, ctx, CALL)?;
            st.capture_dependencies(q)
        })
    }

    unsafe fn graph_node_dependencies(&self, node: RawGraphNode) -> Result<Vec<RawGraphNode>> {
        self.call("cuGraphNodeGetDependencies", |st, _| {
            st.node_dependencies(node)
        })
    }

    fn thread_exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode> {
        self.call("cuThreadExchangeStreamCaptureMode", |_, _| Ok(()))?;
        Ok(self.exchange_thread_mode(mode))
    }

    unsafe fn graph_instantiate(&self, graph: RawGraph) -> Result<RawGraphExec> {
        self.call("cuGraphInstantiate", |st, _| st.graph_instantiate(graph))
    }

    unsafe fn graph_launch(&self, exec: RawGraphExec, stream: RawStream) -> Result<()> {
        const CALL: &str = "cuGraphLaunch";
        self.call(CALL, |st, ctx| {
            let q = st.queue_of(stream, ctx, CALL)?;
            let gate = st.stream_gate(q, CALL)?;
            st.graph_launch(exec, q, gate)
        })
    }

    unsafe fn graph_destroy(&self, graph: RawGraph) -> Result<()> {
        self.call("cuGraphDestroy", |st, _| st.graph_destroy(graph))
    }

    unsafe fn graph_exec_destroy(&self, exec: RawGraphExec) -> Result<()> {
        self.call("cuGraphExecDestroy", |st, _| st.graph_exec_destroy(exec))
    }

    fn mem_alloc(&self, device: u32, bytes: usize) -> Result<DevicePtr> {
        self.call_dev("cuMemAlloc", device, |st, _| st.mem_alloc(device, bytes))
    }

    unsafe fn mem_free(&self, device: u32, ptr: DevicePtr) -> Result<()> {
        self.call_dev("cuMemFree", device, |st, _| st.mem_free(ptr))
    }

    fn mem_alloc_managed(&self, device: u32, bytes: usize) -> Result<DevicePtr> {
        self.call_dev("cuMemAllocManaged", device, |st, _| {
            st.mem_alloc_managed(device, bytes)
        })
    }

    fn mem_alloc_host(
        &self,
        device: u32,
        bytes: usize,
        flags: HostAllocFlags,
    ) -> Result<DevicePtr> {
        self.call_dev("cuMemHostAlloc", device, |st, _| {
            st.mem_alloc_host(device, bytes, flags)
        })
    }

    unsafe fn mem_free_host(&self, ptr: DevicePtr) -> Result<()> {
        self.call("cuMemFreeHost", |st, _| st.mem_free_host(ptr))
    }

    unsafe fn mem_prefetch(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        device: u32,
        stream: RawStream,
    ) -> Result<()> {
        const CALL: &str = "cuMemPrefetchAsync";
        self.call_dev(CALL, device, |st, ctx| {
            if !st.cfg.managed_memory {
                return Err(drv(CALL, NOT_SUPPORTED));
            }
            if !st.is_managed_range(ptr.0, bytes as u64) {
                return Err(drv(CALL, faults::INVALID_VALUE));
            }
            let q = st.queue_of(stream, ctx, CALL)?;
            st.stream_gate(q, CALL)?;
            st.enqueue(q, Op::Marker);
            Ok(())
        })
    }

    fn mem_advise_preferred_location(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        location: Location,
    ) -> Result<()> {
        const CALL: &str = "cuMemAdvise";
        self.call(CALL, |st, _| {
            if bytes == 0 {
                return Ok(());
            }
            let managed = st.cfg.managed_memory && st.is_managed_range(ptr.0, bytes as u64);
            if !managed && !st.cfg.pageable_memory_access {
                return Err(drv(CALL, faults::INVALID_VALUE));
            }
            if let Location::Device(d) = location {
                st.check_device(d, CALL)?;
            }
            st.advice.push((ptr.0, bytes, location));
            Ok(())
        })
    }

    unsafe fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        const CALL: &str = "cuMemsetD8Async";
        self.call(CALL, |st, ctx| {
            let q = st.queue_of(stream, ctx, CALL)?;
            st.stream_gate(q, CALL)?;
            let dev = st.queue_device(q);
            st.touch(dst.0, bytes as u64, dev, true, CALL)?;
            st.enqueue(
                q,
                Op::Memset {
                    dst: dst.0,
                    value,
                    len: bytes as u64,
                },
            );
            Ok(())
        })
    }

    unsafe fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        const CALL: &str = "cuMemcpyDtoDAsync";
        self.call(CALL, |st, ctx| {
            let q = st.queue_of(stream, ctx, CALL)?;
            st.stream_gate(q, CALL)?;
            st.enqueue_dtod(q, dst, src, bytes, CALL)
        })
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        const CALL: &str = "cuMemcpyHtoDAsync";
        self.call(CALL, |st, ctx| {
            if src.is_null() && bytes > 0 {
                return Err(drv(CALL, faults::INVALID_VALUE));
            }
            let q = st.queue_of(stream, ctx, CALL)?;
            st.stream_gate(q, CALL)?;
            let dev = st.queue_device(q);
            st.touch(dst.0, bytes as u64, dev, true, CALL)?;
            st.enqueue(
                q,
                Op::Copy {
                    dst: Addr::Dev(dst.0),
                    src: Addr::Raw(src as usize),
                    len: bytes as u64,
                },
            );
            Ok(())
        })
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()> {
        const CALL: &str = "cuMemcpyDtoHAsync";
        self.call(CALL, |st, ctx| {
            if dst.is_null() && bytes > 0 {
                return Err(drv(CALL, faults::INVALID_VALUE));
            }
            let q = st.queue_of(stream, ctx, CALL)?;
            st.stream_gate(q, CALL)?;
            let dev = st.queue_device(q);
            st.touch(src.0, bytes as u64, dev, false, CALL)?;
            st.enqueue(
                q,
                Op::Copy {
                    dst: Addr::Raw(dst as usize),
                    src: Addr::Dev(src.0),
                    len: bytes as u64,
                },
            );
            Ok(())
        })
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
        const CALL: &str = "cuMemcpyPeerAsync";
        self.call(CALL, |st, ctx| {
            st.check_device(dst_device, CALL)?;
            st.check_device(src_device, CALL)?;
            let q = st.queue_of(stream, ctx, CALL)?;
            st.stream_gate(q, CALL)?;
            if bytes == 0 {
                return Ok(());
            }
            if st.owner_of(dst.0) != Some(dst_device) || st.owner_of(src.0) != Some(src_device) {
                return Err(drv(CALL, faults::INVALID_VALUE));
            }
            st.enqueue_dtod(q, dst, src, bytes, CALL)
        })
    }

    fn mem_address_range(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)> {
        self.call("cuMemGetAddressRange", |st, _| st.address_range(ptr.0))
    }

    fn is_pinned_host(&self, ptr: DevicePtr) -> Result<bool> {
        self.call(
            "cuPointerGetAttribute",
            |st, _| Ok(st.is_pinned_host(ptr.0)),
        )
    }

    fn mempool_default(&self, device: u32) -> Result<RawPool> {
        const CALL: &str = "cuDeviceGetDefaultMemPool";
        self.call_dev(CALL, device, |st, _| st.mempool_default(device, CALL))
    }

    fn mempool_current(&self, device: u32) -> Result<RawPool> {
        const CALL: &str = "cuDeviceGetMemPool";
        self.call_dev(CALL, device, |st, _| st.mempool_default(device, CALL))
    }

    fn mempool_create(&self, props: &PoolProps) -> Result<RawPool> {
        self.call("cuMemPoolCreate", |st, _| st.mempool_create(props))
    }

    unsafe fn mempool_destroy(&self, pool: RawPool) -> Result<()> {
        self.call("cuMemPoolDestroy", |st, _| st.mempool_destroy(pool))
    }

    unsafe fn mempool_set_attr(&self, pool: RawPool, attr: PoolAttr, value: u64) -> Result<()> {
        self.call("cuMemPoolSetAttribute", |st, _| {
            st.mempool_set_attr(pool, attr, value)
        })
    }

    unsafe fn mempool_get_attr(&self, pool: RawPool, attr: PoolAttr) -> Result<u64> {
        self.call("cuMemPoolGetAttribute", |st, _| {
            st.mempool_get_attr(pool, attr)
        })
    }

    unsafe fn mempool_trim_to(&self, pool: RawPool, keep: usize) -> Result<()> {
        self.call("cuMemPoolTrimTo", |st, _| st.mempool_trim_to(pool, keep))
    }

    unsafe fn mempool_set_access(
        &self,
        pool: RawPool,
        device: u32,
        access: AccessFlags,
    ) -> Result<()> {
        self.call("cuMemPoolSetAccess", |st, _| {
            st.mempool_set_access(pool, device, access)
        })
    }

    unsafe fn mempool_get_access(&self, pool: RawPool, device: u32) -> Result<AccessFlags> {
        self.call("cuMemPoolGetAccess", |st, _| {
            st.mempool_get_access(pool, device)
        })
    }

    unsafe fn mem_alloc_from_pool_async(
        &self,
        bytes: usize,
        pool: RawPool,
        stream: RawStream,
    ) -> Result<DevicePtr> {
        const CALL: &str = "cuMemAllocFromPoolAsync";
        self.call(CALL, |st, ctx| {
            let id = st.pool_of(pool, CALL)?;
            let q = st.queue_of(stream, ctx, CALL)?;
            let gate = st.stream_gate(q, CALL)?;
            let ptr = st.pool_alloc(id, bytes, q, CALL)?;
            if let Some(c) = gate {
                st.capture_alloc(c, ptr);
            }
            Ok(ptr)
        })
    }

    unsafe fn mem_alloc_async(&self, bytes: usize, stream: RawStream) -> Result<DevicePtr> {
        const CALL: &str = "cuMemAllocAsync";
        self.call(CALL, |st, ctx| {
            let q = st.queue_of(stream, ctx, CALL)?;
            let gate = st.stream_gate(q, CALL)?;
            let device = st.queue_device(q);
            let h = st.mempool_default(device, CALL)?;
            let id = st.pool_of(h, CALL)?;
            let ptr = st.pool_alloc(id, bytes, q, CALL)?;
            if let Some(c) = gate {
                st.capture_alloc(c, ptr);
            }
            Ok(ptr)
        })
    }

    unsafe fn mem_free_async(&self, ptr: DevicePtr, stream: RawStream) -> Result<()> {
        const CALL: &str = "cuMemFreeAsync";
        self.call(CALL, |st, ctx| {
            if !st.cfg.memory_pools {
                return Err(drv(CALL, NOT_SUPPORTED));
            }
            let q = st.queue_of(stream, ctx, CALL)?;
            match st.stream_gate(q, CALL)? {
                Some(c) => st.capture_free(c, q, ptr),
                None => st
                    .free_graph_alloc(ptr, q)
                    .unwrap_or_else(|| st.mem_free_async(ptr, q)),
            }
        })
    }

    unsafe fn mempool_export_fd(&self, pool: RawPool) -> Result<OwnedFd> {
        self.call("cuMemPoolExportToShareableHandle", |st, _| {
            st.mempool_export_fd(pool)
        })
    }

    fn mempool_import_fd(&self, fd: BorrowedFd<'_>) -> Result<RawPool> {
        self.call("cuMemPoolImportFromShareableHandle", |st, _| {
            st.mempool_import_fd(fd)
        })
    }

    fn mempool_export_pointer(&self, ptr: DevicePtr) -> Result<PoolPtrExport> {
        self.call("cuMemPoolExportPointer", |st, _| {
            st.mempool_export_pointer(ptr)
        })
    }

    unsafe fn mempool_import_pointer(
        &self,
        pool: RawPool,
        data: &PoolPtrExport,
    ) -> Result<DevicePtr> {
        self.call("cuMemPoolImportPointer", |st, _| {
            st.mempool_import_pointer(pool, data)
        })
    }

    fn vmm_reserve(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
        self.call("cuMemAddressReserve", |st, _| {
            st.vmm_reserve(bytes, alignment)
        })
    }

    unsafe fn vmm_free_address(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.call("cuMemAddressFree", |st, _| st.vmm_free_address(ptr, bytes))
    }

    fn vmm_create(&self, device: u32, bytes: usize, props: PhysProps) -> Result<RawPhys> {
        self.call_dev("cuMemCreate", device, |st, _| {
            st.vmm_create(device, bytes, props)
        })
    }

    unsafe fn vmm_release(&self, handle: RawPhys) -> Result<()> {
        self.call("cuMemRelease", |st, _| st.vmm_release(handle))
    }

    fn vmm_retain_handle(&self, ptr: DevicePtr) -> Result<RawPhys> {
        self.call("cuMemRetainAllocationHandle", |st, _| {
            st.vmm_retain_handle(ptr)
        })
    }

    unsafe fn vmm_map(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        offset: usize,
        handle: RawPhys,
    ) -> Result<()> {
        self.call("cuMemMap", |st, _| st.vmm_map(ptr, bytes, offset, handle))
    }

    unsafe fn vmm_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.call("cuMemUnmap", |st, _| st.vmm_unmap(ptr, bytes))
    }

    unsafe fn vmm_set_access(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        device: u32,
        access: AccessFlags,
    ) -> Result<()> {
        self.call("cuMemSetAccess", |st, _| {
            st.vmm_set_access(ptr, bytes, device, access)
        })
    }

    unsafe fn vmm_export_fd(&self, handle: RawPhys) -> Result<OwnedFd> {
        self.call("cuMemExportToShareableHandle", |st, _| {
            st.vmm_export_fd(handle)
        })
    }

    fn vmm_import_fd(&self, fd: BorrowedFd<'_>) -> Result<RawPhys> {
        self.call("cuMemImportFromShareableHandle", |st, _| {
            st.vmm_import_fd(fd)
        })
    }
}
