//! The driver layer: the only place gpumem talks to CUDA.
//!
//! [`Driver`] is the interface; [`cuda::CudaDriver`] implements it over the CUDA
//! driver API through `cudarc` (loaded at run time, so the crate builds and runs
//! without a CUDA toolkit), and [`sim::SimDriver`] implements it over a simulated
//! device for tests and CPU-only machines. Everything above this layer is written
//! against the trait and runs the same on both.
//!
//! Conventions every backend follows:
//! - Calls return `Err`, never panic, for anything the driver can report.
//!   Out-of-memory from an allocation call is [`Error::OutOfMemory`] carrying the
//!   requested bytes and the device; other failures are [`Error::Driver`] with the
//!   call name and the `CUresult` code and name.
//! - Methods that take a device ordinal make that device's primary context current
//!   on the calling thread first; methods that take only a stream or event work
//!   on whatever context owns that handle.
//! - Handles are raw integers; callers own what they create and must destroy it
//!   once. File descriptors are `OwnedFd` (exported: the caller's, closed on
//!   drop) and `BorrowedFd` (imported: only read).
//! - A method that takes a handle or a range of memory the caller could have
//!   forged or already ended is `unsafe` (see below).
//! - A call that returns an error is taken to have done nothing: a destroy,
//!   free, unmap or release that fails leaves its handle or memory live,
//!   and the owners above try such a call once more before giving up
//!   ([`crate::exit`], the pools' undo paths). The CUDA driver can also
//!   return, from any call, an error left by earlier asynchronous work; that
//!   error is sticky (the context is lost, and every later call fails with
//!   it).
//!
//! # Raw handles and `unsafe`
//!
//! A CUDA handle is the driver's own pointer as an integer (a `CUstream`
//! points at a driver structure), and a device address names memory someone
//! owns. The CUDA driver does not detect a destroyed handle: the call
//! follows the pointer into memory that may already be freed or reused (even
//! a query whose answer for a bad handle is an error code), and a free, unmap
//! or launch on memory the caller does not own lets the device write memory
//! the program has given to someone else. So every method that takes such a
//! handle or range is an `unsafe fn` whose `# Safety` section says what the
//! caller promises. The promises use one word: a handle is **live** when this
//! driver created or imported it and it has not been destroyed or released
//! since, and no other thread destroys it during the call. The default
//! streams (`0`, [`STREAM_LEGACY`], [`STREAM_PER_THREAD`]) are always live.
//!
//! Code above this layer does not call these methods itself: the types that
//! own the handles do, each holding its handle until it drops and carrying
//! the argument once: [`Stream`](crate::Stream) and
//! [`Event`](crate::stream::Event), [`Graph`](crate::graph::Graph) and
//! [`GraphExec`](crate::graph::GraphExec), the CUDA pools'
//! [`MemPool`](crate::async_pool::MemPool) and
//! [`ImportedPool`](crate::async_pool::ImportedPool), the upstream
//! resources (their tables of what they handed out) and `VirtualPool`'s
//! physical memory.
//!
//! On the simulated device a handle is a key of the simulator's own tables:
//! one it does not hold (destroyed, forged, another driver's) is refused
//! with the error CUDA gives where it reports one (`CUDA_ERROR_INVALID_HANDLE`,
//! `CUDA_ERROR_INVALID_VALUE`, ...), never followed. That is how a broken
//! promise shows in tests; the CUDA driver does not promise it.
//!
//! Which methods are `unsafe`, and why:
//!
//! | methods | `unsafe` | reason |
//! |---|---|---|
//! | `stream_destroy`, `stream_synchronize`, `stream_query`, `event_destroy`, `event_record`, `event_query`, `event_synchronize`, `stream_wait_event` | yes | a stream or event handle, which the driver follows |
//! | `stream_begin_capture`, `stream_end_capture`, `stream_capture_info`, `stream_capture_dependencies`, `graph_node_dependencies`, `graph_instantiate`, `graph_launch`, `graph_destroy`, `graph_exec_destroy` | yes | a stream, graph, node or executable handle; a launch also runs the captured work again |
//! | `mem_free`, `mem_free_host`, `mem_free_async` | yes | memory that may be someone else's, or already freed |
//! | `mem_prefetch`, `mem_alloc_async` | yes | a stream handle |
//! | `mempool_destroy`, `mempool_set_attr`, `mempool_get_attr`, `mempool_trim_to`, `mempool_set_access`, `mempool_get_access`, `mempool_export_fd`, `mempool_import_pointer`, `mem_alloc_from_pool_async` | yes | a pool handle (and a stream) |
//! | `vmm_release`, `vmm_map`, `vmm_export_fd` | yes | a physical memory handle (and, for a map, address space) |
//! | `vmm_free_address`, `vmm_unmap`, `vmm_set_access` | yes | address space or a mapping that may be someone else's |
//! | `memset_async`, `memcpy_dtod_async`, `memcpy_htod_async`, `memcpy_dtoh_async`, `memcpy_peer_async` | yes | host memory the device reads or writes, and a stream |
//! | `stream_create`, `event_create`, `mem_alloc`, `mem_alloc_managed`, `mem_alloc_host`, `mempool_default`, `mempool_current`, `mempool_create`, `mempool_import_fd`, `vmm_reserve`, `vmm_create`, `vmm_import_fd` | no | they make a handle and take none: a device ordinal, properties, or a descriptor Rust keeps open ([`BorrowedFd`]) whose contents the driver checks |
//! | `backend`, `device_count`, `current_device`, `set_current_device`, `device_info`, `mem_info`, `vmm_granularity`, `can_access_peer`, `enable_peer_access`, `device_synchronize`, `thread_exchange_capture_mode` | no | device ordinals and plain values |
//! | `mem_address_range`, `is_pinned_host`, `mempool_export_pointer`, `vmm_retain_handle` | no | an address is a value the driver looks up in its own allocation tables, not a pointer it follows: an address of no allocation is an error value, and a reused one answers for the allocation there now. None changes what the address's owner relies on; a retained physical handle keeps the memory until it is released, a leak at worst |
//! | `mem_advise_preferred_location` | no | advice over an address range: it changes where pages are placed, never their bytes, and the driver refuses a range that is neither managed nor (with pageable memory access) system memory |
//!
//! [`Error::OutOfMemory`]: crate::Error::OutOfMemory
//! [`Error::Driver`]: crate::Error::Driver

pub mod cuda;
pub mod sim;
mod types;

pub use types::{
    AccessFlags, AllocationType, Backend, CaptureInfo, CaptureMode, CaptureStatus, DeviceInfo,
    DevicePtr, HandleType, HostAllocFlags, Location, MemInfo, PhysProps, PoolAttr, PoolProps,
    PoolPtrExport, RawEvent, RawGraph, RawGraphExec, RawGraphNode, RawPhys, RawPool, RawStream,
    STREAM_LEGACY, STREAM_PER_THREAD,
};

use std::os::fd::{BorrowedFd, OwnedFd};

use crate::{Error, Result};

/// Peer access from a device to itself, refused by both backends: a device
/// always reaches its own memory.
pub(crate) fn peer_access_to_itself(device: u32) -> Error {
    Error::InvalidArgument(format!(
        "peer access from device {device} to itself: a device always reaches its own memory"
    ))
}

/// A CUDA driver: the real one or the simulated device.
///
/// All methods are thread-safe. See the module documentation for the
/// conventions on errors, contexts and handle ownership, and for what the
/// `unsafe` methods ask: handles that are *live*, and memory the caller owns.
pub trait Driver: Send + Sync + 'static {
    /// Which backend this is.
    fn backend(&self) -> Backend;

    // ----- devices -----

    /// Number of devices.
    fn device_count(&self) -> Result<u32>;
    /// The device whose primary context is current on this thread (0 if none is).
    fn current_device(&self) -> Result<u32>;
    /// Makes `device`'s primary context current on this thread.
    fn set_current_device(&self, device: u32) -> Result<()>;
    /// Name, memory and feature support of a device.
    fn device_info(&self, device: u32) -> Result<DeviceInfo>;
    /// Free and total memory of a device.
    fn mem_info(&self, device: u32) -> Result<MemInfo>;
    /// VMM allocation granularity of a device: the minimum if `recommended` is
    /// false, else the recommended one.
    fn vmm_granularity(&self, device: u32, recommended: bool) -> Result<usize>;
    /// Whether `device` can access memory on `peer` directly (true for a
    /// device and itself).
    fn can_access_peer(&self, device: u32, peer: u32) -> Result<bool>;
    /// `cuCtxEnablePeerAccess` from `device`'s primary context to `peer`'s:
    /// work of `device` may then use `peer`'s `cuMemAlloc` memory (memory of
    /// a pool needs the pool's grant, [`Driver::mempool_set_access`], and VMM
    /// memory a [`Driver::vmm_set_access`] for `device`). True when this call
    /// enabled it, false when it already was
    /// (`CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`, taken as success). A pair
    /// that cannot access each other ([`Driver::can_access_peer`] false) is
    /// refused with `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`, a device and
    /// itself with [`Error::InvalidArgument`].
    fn enable_peer_access(&self, device: u32, peer: u32) -> Result<bool>;

    // ----- streams and events -----

    /// Creates a stream on `device`. A non-blocking stream does not synchronize
    /// with the legacy default stream.
    fn stream_create(&self, device: u32, non_blocking: bool) -> Result<RawStream>;
    /// Destroys a stream created by [`Driver::stream_create`]. Work already
    /// enqueued still runs to completion.
    ///
    /// # Safety
    /// `stream` is live (see the [module documentation](self)) and the caller
    /// owns it: nothing uses it after this call. (A default stream is
    /// refused with an error.)
    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()>;
    /// Blocks until all work enqueued on `stream` is complete.
    ///
    /// # Safety
    /// `stream` is live.
    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<()>;
    /// True when all work enqueued on `stream` is complete.
    ///
    /// # Safety
    /// `stream` is live.
    unsafe fn stream_query(&self, stream: RawStream) -> Result<bool>;
    /// Creates an event (timing disabled) on `device`.
    fn event_create(&self, device: u32) -> Result<RawEvent>;
    /// Destroys an event.
    ///
    /// # Safety
    /// `event` is live and the caller owns it: nothing uses it after this
    /// call.
    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()>;
    /// Records `event` at the current end of `stream`.
    ///
    /// # Safety
    /// `event` and `stream` are live.
    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()>;
    /// True when the work before the event's last record is complete (or it was
    /// never recorded).
    ///
    /// # Safety
    /// `event` is live.
    unsafe fn event_query(&self, event: RawEvent) -> Result<bool>;
    /// Blocks until the event's last record is complete.
    ///
    /// # Safety
    /// `event` is live.
    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<()>;
    /// Makes future work on `stream` wait for the event's last record.
    ///
    /// # Safety
    /// `stream` and `event` are live.
    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()>;
    /// Blocks until all work on `device` is complete.
    fn device_synchronize(&self, device: u32) -> Result<()>;

    // ----- stream capture and graphs -----

    /// `cuStreamBeginCapture`: from now on, work enqueued on `stream` (and on
    /// streams that wait on events recorded in the capture, which join it) is
    /// recorded into a graph instead of run. `mode` says which calls the
    /// capture forbids (see [`CaptureMode`]). The legacy default stream cannot
    /// capture.
    ///
    /// # Safety
    /// `stream` is live.
    unsafe fn stream_begin_capture(&self, stream: RawStream, mode: CaptureMode) -> Result<()>;
    /// `cuStreamEndCapture`: ends the capture that began on `stream` and
    /// returns its graph, which the caller owns. Fails, still ending the
    /// capture, when a forbidden call invalidated it or when a stream that
    /// joined it has work the origin stream did not wait for.
    ///
    /// # Safety
    /// `stream` is live.
    unsafe fn stream_end_capture(&self, stream: RawStream) -> Result<RawGraph>;
    /// `cuStreamGetCaptureInfo`: whether `stream` is capturing, and the
    /// capture's id.
    ///
    /// # Safety
    /// `stream` is live.
    unsafe fn stream_capture_info(&self, stream: RawStream) -> Result<CaptureInfo>;
    /// `cuStreamGetCaptureInfo` with the capture's dependency set: what
    /// [`Driver::stream_capture_info`] says, and the nodes the next work
    /// captured on `stream` will depend on (none when the stream is not
    /// capturing, its capture was invalidated, or nothing captured comes
    /// before its next work). The nodes stay valid while the capture is
    /// under way.
    ///
    /// # Safety
    /// `stream` is live.
    unsafe fn stream_capture_dependencies(
        &self,
        stream: RawStream,
    ) -> Result<(CaptureInfo, Vec<RawGraphNode>)>;
    /// `cuGraphNodeGetDependencies`: the nodes that `node`, a node of a
    /// capture under way, depends on.
    ///
    /// # Safety
    /// `node` is a node this driver named (through
    /// [`Driver::stream_capture_dependencies`] or this method) for a capture
    /// that is still under way, or whose graph is not destroyed yet (a
    /// capture's nodes become its graph's when it ends).
    unsafe fn graph_node_dependencies(&self, node: RawGraphNode) -> Result<Vec<RawGraphNode>>;
    /// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's capture
    /// mode and returns the one it had. Meant to be used in pairs: set, call,
    /// restore.
    fn thread_exchange_capture_mode(&self, mode: CaptureMode) -> Result<CaptureMode>;
    /// `cuGraphInstantiate`: an executable graph of `graph`, which the caller
    /// owns. The graph itself may be destroyed afterwards.
    ///
    /// # Safety
    /// `graph` is live (from [`Driver::stream_end_capture`], not destroyed).
    unsafe fn graph_instantiate(&self, graph: RawGraph) -> Result<RawGraphExec>;
    /// `cuGraphLaunch`: enqueues one run of the graph's work on `stream`.
    ///
    /// # Safety
    /// `exec` and `stream` are live, and what the captured calls promised
    /// about their memory holds for this run too: the ranges of the copies
    /// and memsets in the graph stay valid until it has run (see
    /// [`Driver::memcpy_htod_async`]).
    unsafe fn graph_launch(&self, exec: RawGraphExec, stream: RawStream) -> Result<()>;
    /// `cuGraphDestroy`.
    ///
    /// # Safety
    /// `graph` is live and the caller owns it: nothing uses it, or a node of
    /// it, after this call.
    unsafe fn graph_destroy(&self, graph: RawGraph) -> Result<()>;
    /// `cuGraphExecDestroy`: launches already enqueued still run.
    ///
    /// # Safety
    /// `exec` is live and the caller owns it: nothing uses it after this
    /// call.
    unsafe fn graph_exec_destroy(&self, exec: RawGraphExec) -> Result<()>;

    // ----- plain allocation -----

    /// `cuMemAlloc`: device memory, 256-byte aligned at least.
    fn mem_alloc(&self, device: u32, bytes: usize) -> Result<DevicePtr>;
    /// `cuMemFree`.
    ///
    /// # Safety
    /// `ptr` is null or an allocation that [`Driver::mem_alloc`] or
    /// [`Driver::mem_alloc_managed`] of this driver returned and that was not
    /// freed since, and the caller owns it: nothing else frees it, and nothing
    /// uses it after this call. Work already enqueued that uses it must have
    /// run or be covered by its own contract (the memset and the copies keep
    /// host-accessible memory valid until they have run): `cuMemFree` does not
    /// promise to wait for it.
    unsafe fn mem_free(&self, device: u32, ptr: DevicePtr) -> Result<()>;
    /// `cuMemAllocManaged` with `CU_MEM_ATTACH_GLOBAL`.
    fn mem_alloc_managed(&self, device: u32, bytes: usize) -> Result<DevicePtr>;
    /// `cuMemHostAlloc`: pinned host memory. Freed with [`Driver::mem_free_host`].
    fn mem_alloc_host(&self, device: u32, bytes: usize, flags: HostAllocFlags)
        -> Result<DevicePtr>;
    /// `cuMemFreeHost`.
    ///
    /// # Safety
    /// `ptr` is null or an allocation that [`Driver::mem_alloc_host`] of this
    /// driver returned and that was not freed since, and the caller owns it:
    /// nothing else frees it, no reference into it is left, and no work still
    /// to run uses it.
    unsafe fn mem_free_host(&self, ptr: DevicePtr) -> Result<()>;
    /// `cuMemPrefetchAsync` of managed memory to `device` on `stream`.
    ///
    /// # Safety
    /// `stream` is live. The range needs no promise: the driver refuses one
    /// it cannot migrate, and migrating pages keeps their bytes.
    unsafe fn mem_prefetch(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        device: u32,
        stream: RawStream,
    ) -> Result<()>;

    /// `cuMemAdvise(CU_MEM_ADVISE_SET_PREFERRED_LOCATION)` over managed or
    /// system-allocated memory (HMM/ATS).
    fn mem_advise_preferred_location(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        location: Location,
    ) -> Result<()>;

    // ----- data movement -----

    /// `cuMemsetD8Async`.
    ///
    /// # Safety
    /// `stream` is live. If `dst` is host-accessible memory (pinned, managed,
    /// system), the range must be valid and nothing on the host may use it
    /// until the memset has run.
    unsafe fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// `cuMemcpyDtoDAsync` (any two device-accessible addresses).
    ///
    /// # Safety
    /// `stream` is live. If `dst` or `src` is host-accessible memory, the
    /// ranges must stay valid, and the host must not write `src` or touch
    /// `dst`, until the copy has run.
    unsafe fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// `cuMemcpyHtoDAsync`.
    ///
    /// # Safety
    /// `stream` is live. `src..src+bytes` must be readable host memory and stay valid and unchanged
    /// until the copy has run on `stream`.
    /// If `stream` is capturing and the driver accepts the copy into the graph,
    /// it runs at every launch of the graph: the range must then stay valid
    /// for as long as the graph can be launched.
    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// `cuMemcpyDtoHAsync`.
    ///
    /// # Safety
    /// `stream` is live. `dst..dst+bytes` must be writable host memory that nothing else touches
    /// until the copy has run on `stream`.
    /// If `stream` is capturing and the driver accepts the copy into the graph,
    /// it runs at every launch of the graph: the range must then stay valid
    /// for as long as the graph can be launched.
    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;

    /// `cuMemcpyPeerAsync`: copies `bytes` from `src`, memory of device
    /// `src_device`, to `dst`, memory of device `dst_device`, on `stream`.
    /// The stream's device runs the copy and must be able to reach both
    /// ranges: its own memory, and the other device's through peer access
    /// ([`Driver::enable_peer_access`]) or the pool's or the mapping's grant.
    ///
    /// # Safety
    /// As [`Driver::memcpy_dtod_async`].
    unsafe fn memcpy_peer_async(
        &self,
        dst: DevicePtr,
        dst_device: u32,
        src: DevicePtr,
        src_device: u32,
        bytes: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// `cuMemGetAddressRange`: the start and size of the allocation that
    /// holds `ptr` (for VMM memory, of the mapping that holds it).
    fn mem_address_range(&self, ptr: DevicePtr) -> Result<(DevicePtr, usize)>;
    /// Whether `ptr` lies in page-locked host memory of the driver
    /// (`cuPointerGetAttribute`, `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`). Such
    /// memory is mapped for the device, so the driver accepts it where a
    /// copy wants device memory; an address the driver does not know is not
    /// pinned host memory.
    fn is_pinned_host(&self, ptr: DevicePtr) -> Result<bool>;

    // ----- stream-ordered memory pools -----

    /// The device's default memory pool (`cuDeviceGetDefaultMemPool`).
    fn mempool_default(&self, device: u32) -> Result<RawPool>;
    /// The device's current pool for `cuMemAllocAsync` (`cuDeviceGetMemPool`).
    fn mempool_current(&self, device: u32) -> Result<RawPool>;
    /// Creates a pool (`cuMemPoolCreate`).
    fn mempool_create(&self, props: &PoolProps) -> Result<RawPool>;
    /// Destroys a pool created by [`Driver::mempool_create`] or imported.
    ///
    /// # Safety
    /// `pool` is live, not a device's default pool, and the caller owns it:
    /// nothing uses it after this call.
    unsafe fn mempool_destroy(&self, pool: RawPool) -> Result<()>;
    /// Sets a pool attribute.
    ///
    /// # Safety
    /// `pool` is live.
    unsafe fn mempool_set_attr(&self, pool: RawPool, attr: PoolAttr, value: u64) -> Result<()>;
    /// Reads a pool attribute.
    ///
    /// # Safety
    /// `pool` is live.
    unsafe fn mempool_get_attr(&self, pool: RawPool, attr: PoolAttr) -> Result<u64>;
    /// `cuMemPoolTrimTo`: releases unused memory until the pool reserves fewer
    /// than `keep` bytes (used memory included) or nothing more can be released.
    ///
    /// # Safety
    /// `pool` is live.
    unsafe fn mempool_trim_to(&self, pool: RawPool, keep: usize) -> Result<()>;
    /// Grants `device` the given access to the pool's memory.
    ///
    /// # Safety
    /// `pool` is live, and the caller decides for all of its memory (it owns
    /// the pool, or the pool's owner lets it): taking access away makes the
    /// device's work on that memory fault.
    unsafe fn mempool_set_access(
        &self,
        pool: RawPool,
        device: u32,
        access: AccessFlags,
    ) -> Result<()>;
    /// The access `device` has to the pool's memory.
    ///
    /// # Safety
    /// `pool` is live.
    unsafe fn mempool_get_access(&self, pool: RawPool, device: u32) -> Result<AccessFlags>;
    /// `cuMemAllocFromPoolAsync`.
    ///
    /// # Safety
    /// `pool` and `stream` are live.
    unsafe fn mem_alloc_from_pool_async(
        &self,
        bytes: usize,
        pool: RawPool,
        stream: RawStream,
    ) -> Result<DevicePtr>;
    /// `cuMemAllocAsync` from the current pool of the stream's device.
    ///
    /// # Safety
    /// `stream` is live.
    unsafe fn mem_alloc_async(&self, bytes: usize, stream: RawStream) -> Result<DevicePtr>;
    /// `cuMemFreeAsync`.
    ///
    /// # Safety
    /// `stream` is live; `ptr` is null or an allocation of a pool of this
    /// driver ([`Driver::mem_alloc_async`],
    /// [`Driver::mem_alloc_from_pool_async`],
    /// [`Driver::mempool_import_pointer`]) not freed since, and the caller owns
    /// it: nothing else frees it, and no work ordered after the free on
    /// `stream` uses it.
    unsafe fn mem_free_async(&self, ptr: DevicePtr, stream: RawStream) -> Result<()>;
    /// Exports a pool created with [`HandleType::PosixFd`] as a file descriptor
    /// the caller owns.
    ///
    /// # Safety
    /// `pool` is live.
    unsafe fn mempool_export_fd(&self, pool: RawPool) -> Result<OwnedFd>;
    /// Imports a pool from a file descriptor exported by another process. The
    /// descriptor is only read; the caller keeps it.
    fn mempool_import_fd(&self, fd: BorrowedFd<'_>) -> Result<RawPool>;
    /// Export data for one allocation of an exportable pool.
    fn mempool_export_pointer(&self, ptr: DevicePtr) -> Result<PoolPtrExport>;
    /// Imports an allocation of an imported pool.
    ///
    /// # Safety
    /// `pool` is live (from [`Driver::mempool_import_fd`]).
    unsafe fn mempool_import_pointer(
        &self,
        pool: RawPool,
        data: &PoolPtrExport,
    ) -> Result<DevicePtr>;

    // ----- virtual memory management -----

    /// Reserves a virtual address range (`cuMemAddressReserve`).
    fn vmm_reserve(&self, bytes: usize, alignment: usize) -> Result<DevicePtr>;
    /// Frees a virtual address range (`cuMemAddressFree`); nothing may be mapped in it.
    ///
    /// # Safety
    /// `ptr` and `bytes` are a range that [`Driver::vmm_reserve`] of this
    /// driver returned and that was not freed since, and the caller owns it:
    /// nothing else frees it or maps in it after this call.
    unsafe fn vmm_free_address(&self, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// Creates physical memory on `device` (`cuMemCreate`); `bytes` must be a
    /// multiple of the granularity.
    fn vmm_create(&self, device: u32, bytes: usize, props: PhysProps) -> Result<RawPhys>;
    /// Releases physical memory (`cuMemRelease`); it is freed once unmapped everywhere.
    ///
    /// # Safety
    /// `handle` is live ([`Driver::vmm_create`], [`Driver::vmm_import_fd`] or
    /// [`Driver::vmm_retain_handle`]), and the caller owns this reference to
    /// it: each of those calls is released once, and the caller does not use
    /// the handle after this call.
    unsafe fn vmm_release(&self, handle: RawPhys) -> Result<()>;
    /// `cuMemRetainAllocationHandle`: the handle `ptr`'s mapping was made
    /// with (the same value `cuMemMap` was given), retained once more:
    /// release it with [`Driver::vmm_release`]. Fails for memory that VMM
    /// did not map.
    fn vmm_retain_handle(&self, ptr: DevicePtr) -> Result<RawPhys>;
    /// Maps `bytes` of `handle` starting at `offset` at `ptr` (`cuMemMap`).
    ///
    /// # Safety
    /// `handle` is live, and the range lies in address space the caller
    /// reserved ([`Driver::vmm_reserve`]) and still owns, with nothing mapped
    /// in it.
    unsafe fn vmm_map(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        offset: usize,
        handle: RawPhys,
    ) -> Result<()>;
    /// Unmaps a range (`cuMemUnmap`).
    ///
    /// # Safety
    /// The range is one the caller mapped ([`Driver::vmm_map`]) and has not
    /// unmapped since, and nothing uses it after this call: work still to run
    /// that uses it must be covered by its own contract, as for
    /// [`Driver::mem_free`].
    unsafe fn vmm_unmap(&self, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// Sets access to a mapped range for `device` (`cuMemSetAccess`).
    ///
    /// # Safety
    /// The range is mapped by the caller (its [`Driver::vmm_map`], not
    /// unmapped since): taking access away makes the device's work on it
    /// fault.
    unsafe fn vmm_set_access(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        device: u32,
        access: AccessFlags,
    ) -> Result<()>;
    /// Exports physical memory created with [`HandleType::PosixFd`] as a file
    /// descriptor the caller owns.
    ///
    /// # Safety
    /// `handle` is live.
    unsafe fn vmm_export_fd(&self, handle: RawPhys) -> Result<OwnedFd>;
    /// Imports physical memory from a file descriptor. The descriptor is only
    /// read; the caller keeps it.
    fn vmm_import_fd(&self, fd: BorrowedFd<'_>) -> Result<RawPhys>;
}
