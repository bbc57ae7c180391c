//! The simulated device: a CUDA driver in software, for tests, benchmarks of
//! bookkeeping, and machines without a GPU.
//!
//! What it models (one file per concept):
//! - `config`: [`SimConfig`], devices and features.
//! - `address_space`: fake, non-overlapping, 256-byte-aligned device addresses,
//!   O(log n) per allocation, no host memory touched.
//! - `memory`: allocations, capacity accounting, backing and address
//!   translation. Address-only mode (default) moves no bytes for device
//!   memory; backed mode ([`SimConfig::backed`]) keeps real host memory behind
//!   every device byte. Pinned and managed memory are always real host memory.
//! - `streams`: per-stream queues, events, waits and the ordering oracle.
//!   Work runs the moment it is enqueued unless a test holds the stream.
//! - `pools`: stream-ordered memory pools. `vmm`: virtual memory management.
//! - `capture`: stream capture and the calls it forbids (the rules are listed
//!   there). `graphs`: captured graphs, their launches and their allocations.
//! - `peer`: peer access between devices and the grants each kind of memory
//!   needs before another device may touch it.
//! - `faults`: call counting and fault injection. `ipc`: in-process export.
//! - `driver_impl`: the `Driver` trait, method by method, over the above.
//!
//! Device addresses start at 2^47 (each device its own range, VMM
//! reservations another), so they never look like null nor like host memory.
//!
//! All state sits behind one mutex: every driver call is one lock plus
//! O(log n) work (plus the work it unblocks).
//!
//! # Call names
//!
//! Calls are counted (and faults injected) under these CUDA names:
//!
//! | trait method | name |
//! |---|---|
//! | `device_count` | `cuDeviceGetCount` |
//! | `current_device` | `cuCtxGetDevice` |
//! | `set_current_device` | `cuCtxSetCurrent` |
//! | `device_info` | `cuDeviceGetAttribute` |
//! | `mem_info` | `cuMemGetInfo` |
//! | `vmm_granularity` | `cuMemGetAllocationGranularity` |
//! | `can_access_peer` | `cuDeviceCanAccessPeer` |
//! | `enable_peer_access` | `cuCtxEnablePeerAccess` |
//! | `stream_create` / `stream_destroy` | `cuStreamCreate` / `cuStreamDestroy` |
//! | `stream_synchronize` / `stream_query` | `cuStreamSynchronize` / `cuStreamQuery` |
//! | `event_create` / `event_destroy` | `cuEventCreate` / `cuEventDestroy` |
//! | `event_record` / `event_query` | `cuEventRecord` / `cuEventQuery` |
//! | `event_synchronize` | `cuEventSynchronize` |
//! | `stream_wait_event` | `cuStreamWaitEvent` |
//! | `device_synchronize` | `cuCtxSynchronize` |
//! | `stream_begin_capture` / `stream_end_capture` | `cuStreamBeginCapture` / `cuStreamEndCapture` |
//! | `stream_capture_info` / `stream_capture_dependencies` | `cuStreamGetCaptureInfo` |
//! | `graph_node_dependencies` | `cuGraphNodeGetDependencies` |
//! | `thread_exchange_capture_mode` | `cuThreadExchangeStreamCaptureMode` |
//! | `graph_instantiate` / `graph_launch` | `cuGraphInstantiate` / `cuGraphLaunch` |
//! | `graph_destroy` / `graph_exec_destroy` | `cuGraphDestroy` / `cuGraphExecDestroy` |
//! | `mem_alloc` / `mem_free` | `cuMemAlloc` / `cuMemFree` |
//! | `mem_alloc_managed` | `cuMemAllocManaged` |
//! | `mem_alloc_host` / `mem_free_host` | `cuMemHostAlloc` / `cuMemFreeHost` |
//! | `mem_prefetch` | `cuMemPrefetchAsync` |
//! | `memset_async` | `cuMemsetD8Async` |
//! | `memcpy_dtod_async` / `memcpy_htod_async` / `memcpy_dtoh_async` | `cuMemcpyDtoDAsync` / `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync` |
//! | `memcpy_peer_async` | `cuMemcpyPeerAsync` |
//! | `mem_address_range` | `cuMemGetAddressRange` |
//! | `mempool_default` / `mempool_current` | `cuDeviceGetDefaultMemPool` / `cuDeviceGetMemPool` |
//! | `mempool_create` / `mempool_destroy` | `cuMemPoolCreate` / `cuMemPoolDestroy` |
//! | `mempool_set_attr` / `mempool_get_attr` | `cuMemPoolSetAttribute` / `cuMemPoolGetAttribute` |
//! | `mempool_trim_to` | `cuMemPoolTrimTo` |
//! | `mempool_set_access` / `mempool_get_access` | `cuMemPoolSetAccess` / `cuMemPoolGetAccess` |
//! | `mem_alloc_from_pool_async` / `mem_alloc_async` / `mem_free_async` | `cuMemAllocFromPoolAsync` / `cuMemAllocAsync` / `cuMemFreeAsync` |
//! | `mempool_export_fd` / `mempool_import_fd` | `cuMemPoolExportToShareableHandle` / `cuMemPoolImportFromShareableHandle` |
//! | `mempool_export_pointer` / `mempool_import_pointer` | `cuMemPoolExportPointer` / `cuMemPoolImportPointer` |
//! | `vmm_reserve` / `vmm_free_address` | `cuMemAddressReserve` / `cuMemAddressFree` |
//! | `vmm_create` / `vmm_release` | `cuMemCreate` / `cuMemRelease` |
//! | `vmm_retain_handle` | `cuMemRetainAllocationHandle` |
//! | `vmm_map` / `vmm_unmap` / `vmm_set_access` | `cuMemMap` / `cuMemUnmap` / `cuMemSetAccess` |
//! | `vmm_export_fd` / `vmm_import_fd` | `cuMemExportToShareableHandle` / `cuMemImportFromShareableHandle` |
//!
//! # Differences from CUDA worth knowing
//! - Unknown stream, event, pool and physical handles are
//!   `CUDA_ERROR_INVALID_HANDLE`; `cuMemFree(0)` succeeds (like `cudaFree`).
//! - The legacy stream does not synchronize with other streams (all streams
//!   behave as non-blocking).
//! - Pool blocks freed on a stream become reusable when the free runs (so with
//!   immediately-running work, at once); same-stream reuse before then is not
//!   modelled. Pool memory is reserved per allocation in granules.
//! - `mempool_trim_to(keep)` keeps at most `keep` cached bytes (the trait's
//!   contract), not CUDA's "at least `keep` reserved".
//! - IPC works only inside the same `SimDriver` (see `ipc`).
//! - `cuMemSetAccess` and `cuMemUnmap` ranges must consist of whole mappings.
//! - A copy that touches another device's memory without access is refused
//!   (see `peer`), where CUDA's copy engines may stage it; `cuMemcpyPeerAsync`
//!   too.

mod address_space;
mod capture;
mod config;
mod driver_impl;
mod faults;
mod gates;
mod graphs;
mod ipc;
mod memory;
mod peer;
mod pools;
mod streams;
mod vmm;

#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::ThreadId;

pub use capture::{CaptureViolation, UNSAFE_DURING_CAPTURE};
pub use config::SimConfig;
pub use faults::cu_result_name;
pub use gates::CallGate;
pub use memory::DataStats;
pub use peer::PeerViolation;

use crate::driver::*;
use crate::Result;
use address_space::AddressSpace;
use capture::{Capture, CaptureId};
use faults::{drv, Faults, INVALID_DEVICE};
use graphs::{GraphAlloc, GraphBody};
use memory::{HostAlloc, Region};
use pools::{PoolHandle, PoolState};
use streams::{EventState, Queue, QueueId};
use vmm::Phys;

/// Internal pool identity (never reused).
type PoolId = u64;
/// Internal physical-allocation identity (never reused).
type PhysId = u64;

const TAG_STREAM: u64 = 0x51;
const TAG_EVENT: u64 = 0x52;
const TAG_POOL: u64 = 0x53;
const TAG_PHYS: u64 = 0x54;
const TAG_GRAPH: u64 = 0x55;
const TAG_GRAPH_EXEC: u64 = 0x56;

/// Where device address ranges start (2^47).
const DEVICE_BASE: u64 = 1 << 47;
/// Address space shared by all devices' ranges.
const DEVICE_SPAN: u64 = 1 << 46;
/// Where VMM reservations come from, after the devices' ranges.
const VMM_BASE: u64 = DEVICE_BASE + DEVICE_SPAN;
const VMM_SPAN: u64 = 1 << 46;

static NEXT_UID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's view of each driver instance.
    static CURRENT: RefCell<HashMap<u64, ThreadView>> = RefCell::new(HashMap::new());
}

/// What a thread keeps per driver instance, as CUDA keeps it per OS thread:
/// its current device and its stream-capture mode.
#[derive(Debug, Clone, Copy, Default)]
struct ThreadView {
    device: u32,
    mode: CaptureMode,
}

/// The calling thread's view: its current device, capture mode and identity.
#[derive(Debug, Clone, Copy)]
struct Ctx {
    device: u32,
    mode: CaptureMode,
    thread: ThreadId,
}

/// One device's state.
struct DeviceState {
    space: AddressSpace,
    /// Bytes charged against capacity.
    used: u64,
    /// Live allocations charged to the device.
    allocs: usize,
    legacy: QueueId,
    default_pool: RawPool,
}

/// Everything the simulator knows; behind one mutex.
struct State {
    cfg: SimConfig,
    uid: u64,
    capacity: u64,
    gran: u64,
    devices: Vec<DeviceState>,
    /// Device-address translation table.
    regions: BTreeMap<u64, Region>,
    /// Pinned and managed host allocations by host address.
    host: BTreeMap<u64, HostAlloc>,
    pinned_bytes: u64,
    queues: HashMap<QueueId, Queue>,
    streams: HashMap<RawStream, QueueId>,
    /// Destroyed stream handles, for the test oracle.
    retired: HashMap<RawStream, QueueId>,
    /// Final positions of drained queues of destroyed streams.
    gone: HashMap<QueueId, u64>,
    per_thread: HashMap<(u32, ThreadId), QueueId>,
    events: HashMap<RawEvent, EventState>,
    /// Queues with pending work.
    busy: BTreeSet<QueueId>,
    pumping: bool,
    pools: HashMap<PoolId, PoolState>,
    /// Preferred-location advice given, in order (address, bytes, location).
    advice: Vec<(u64, usize, Location)>,
    pool_handles: HashMap<RawPool, PoolHandle>,
    vmm_space: AddressSpace,
    reservations: BTreeMap<u64, u64>,
    reserved_va: u64,
    phys: HashMap<PhysId, Phys>,
    /// Live handles: the memory and how many releases each still takes.
    phys_handles: HashMap<RawPhys, (PhysId, usize)>,
    physical_bytes: u64,
    mapped_bytes: u64,
    faults: Faults,
    stats: DataStats,
    /// Captures begun and not yet ended.
    captures: HashMap<CaptureId, Capture>,
    /// Live graph and executable-graph handles; both share the body.
    graphs: HashMap<RawGraph, Arc<GraphBody>>,
    graph_execs: HashMap<RawGraphExec, Arc<GraphBody>>,
    /// Allocations made during captures, by address, while their graph lives.
    graph_allocs: HashMap<u64, GraphAlloc>,
    /// Calls refused because of a capture, in order.
    violations: Vec<CaptureViolation>,
    /// Peer access enabled: (device, peer) pairs.
    peers_enabled: HashSet<(u32, u32)>,
    /// Touches of another device's memory refused, in order.
    peer_violations: Vec<PeerViolation>,
    next_id: u64,
}

impl State {
    fn new(cfg: SimConfig, uid: u64) -> State {
        let n = cfg.effective_devices();
        let span = DEVICE_SPAN / u64::from(n.max(1)).next_power_of_two();
        let gran = cfg.effective_granularity() as u64;
        let mut st = State {
            capacity: cfg.capacity as u64,
            cfg,
            uid,
            gran,
            devices: Vec::new(),
            regions: BTreeMap::new(),
            host: BTreeMap::new(),
            pinned_bytes: 0,
            queues: HashMap::new(),
            streams: HashMap::new(),
            retired: HashMap::new(),
            gone: HashMap::new(),
            per_thread: HashMap::new(),
            events: HashMap::new(),
            busy: BTreeSet::new(),
            pumping: false,
            pools: HashMap::new(),
            advice: Vec::new(),
            pool_handles: HashMap::new(),
            vmm_space: AddressSpace::new(VMM_BASE, VMM_SPAN),
            reservations: BTreeMap::new(),
            reserved_va: 0,
            phys: HashMap::new(),
            phys_handles: HashMap::new(),
            physical_bytes: 0,
            mapped_bytes: 0,
            faults: Faults::default(),
            stats: DataStats::default(),
            captures: HashMap::new(),
            graphs: HashMap::new(),
            graph_execs: HashMap::new(),
            graph_allocs: HashMap::new(),
            violations: Vec::new(),
            peers_enabled: HashSet::new(),
            peer_violations: Vec::new(),
            next_id: 0,
        };
        for d in 0..n {
            let legacy = st.new_queue(d, true);
            st.devices.push(DeviceState {
                space: AddressSpace::new(DEVICE_BASE + u64::from(d) * span, span),
                used: 0,
                allocs: 0,
                legacy,
                default_pool: 0,
            });
        }
        for d in 0..n {
            let h = st.make_default_pool(d);
            st.devices[d as usize].default_pool = h;
        }
        st
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn fresh_handle(&mut self, tag: u64) -> u64 {
        (tag << 40) | self.fresh_id()
    }

    fn check_device(&self, device: u32, call: &'static str) -> Result<()> {
        if (device as usize) < self.devices.len() {
            Ok(())
        } else {
            Err(drv(call, INVALID_DEVICE))
        }
    }

    /// The queue of a live or destroyed stream handle (test controls).
    fn queue_for_test(&mut self, stream: RawStream, ctx: Ctx) -> Option<QueueId> {
        if let Some(&q) = self.retired.get(&stream) {
            return Some(q);
        }
        self.queue_of(stream, ctx, "test").ok()
    }
}

/// The simulated driver. See the module documentation.
pub struct SimDriver {
    uid: u64,
    devices: u32,
    state: Mutex<State>,
    gates: gates::Gates,
}

impl std::fmt::Debug for SimDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDriver")
            .field("uid", &self.uid)
            .field("devices", &self.devices)
            .finish()
    }
}

impl Default for SimDriver {
    fn default() -> Self {
        Self::new(SimConfig::default())
    }
}

impl SimDriver {
    /// A new simulated driver.
    pub fn new(config: SimConfig) -> Self {
        let uid = NEXT_UID.fetch_add(1, Ordering::Relaxed);
        let devices = config.effective_devices();
        Self {
            uid,
            devices,
            state: Mutex::new(State::new(config, uid)),
            gates: gates::Gates::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn ctx(&self) -> Ctx {
        let view = CURRENT.with(|c| c.borrow().get(&self.uid).copied().unwrap_or_default());
        Ctx {
            device: view.device,
            mode: view.mode,
            thread: std::thread::current().id(),
        }
    }

    /// Sets this thread's capture mode for this driver; returns the old one.
    fn exchange_thread_mode(&self, mode: CaptureMode) -> CaptureMode {
        CURRENT.with(|c| {
            let mut map = c.borrow_mut();
            let view = map.entry(self.uid).or_default();
            std::mem::replace(&mut view.mode, mode)
        })
    }

    /// Runs a call: counts it (maybe failing it), applies the capture rule for
    /// potentially unsafe calls (see `capture`), then `f`.
    fn call<T>(
        &self,
        name: &'static str,
        f: impl FnOnce(&mut State, Ctx) -> Result<T>,
    ) -> Result<T> {
        self.call_raw(name, |st, ctx| {
            st.check_unsafe(name, ctx)?;
            f(st, ctx)
        })
    }

    /// Runs a call that applies the capture rules itself: counts it (maybe
    /// failing it), then `f`.
    fn call_raw<T>(
        &self,
        name: &'static str,
        f: impl FnOnce(&mut State, Ctx) -> Result<T>,
    ) -> Result<T> {
        self.gates.pass(name);
        let ctx = self.ctx();
        let mut st = self.lock();
        st.faults.on_call(name)?;
        f(&mut st, ctx)
    }

    /// Runs a call that takes a device: checks it and runs it on that device.
    fn call_dev<T>(
        &self,
        name: &'static str,
        device: u32,
        f: impl FnOnce(&mut State, Ctx) -> Result<T>,
    ) -> Result<T> {
        self.call(name, |st, ctx| {
            st.check_device(device, name)?;
            f(st, Ctx { device, ..ctx })
        })
    }

    /// Makes `device` this thread's current device (`cuCtxSetCurrent`);
    /// the other calls that take a device act on it without changing the
    /// thread's current one, as the CUDA backend does.
    pub(super) fn make_current(&self, device: u32) -> Result<()> {
        self.call_dev("cuCtxSetCurrent", device, |_, _| {
            CURRENT.with(|c| c.borrow_mut().entry(self.uid).or_default().device = device);
            Ok(())
        })
    }

    /// Makes the `nth` call named `call` from now on (a CUDA name, as
    /// [`SimDriver::call_count`] counts them) stop before it runs until the
    /// returned gate opens (see [`CallGate`]). For tests that must put one
    /// thread's call in flight while another acts.
    pub fn gate_call(&self, call: &'static str, nth: u64) -> CallGate {
        self.gates.arm(call, nth)
    }

    /// The configuration this driver was made with.
    pub fn config(&self) -> SimConfig {
        self.lock().cfg.clone()
    }

    // ----- test controls: streams -----

    /// Holds `stream`: work enqueued on it from now on stays pending until
    /// [`SimDriver::release`], [`SimDriver::complete`] or a synchronize.
    /// Unknown handles are ignored.
    pub fn hold(&self, stream: RawStream) {
        let ctx = self.ctx();
        let mut st = self.lock();
        if let Some(q) = st.queue_for_test(stream, ctx) {
            if let Some(queue) = st.queues.get_mut(&q) {
                queue.held = true;
            }
        }
    }

    /// Unholds `stream` and runs whatever can run.
    pub fn release(&self, stream: RawStream) {
        let ctx = self.ctx();
        let mut st = self.lock();
        if let Some(q) = st.queue_for_test(stream, ctx) {
            if let Some(queue) = st.queues.get_mut(&q) {
                queue.held = false;
            }
            st.pump();
        }
    }

    /// Runs all work pending on `stream` now (held or not), first running the
    /// work of other streams that its waits need. The stream stays held.
    pub fn complete(&self, stream: RawStream) {
        let ctx = self.ctx();
        let mut st = self.lock();
        if let Some(q) = st.queue_for_test(stream, ctx) {
            st.force_all(q);
        }
    }

    /// Runs all pending work of every stream.
    pub fn complete_all(&self) {
        let mut st = self.lock();
        let qs: Vec<QueueId> = st.queues.keys().copied().collect();
        for q in qs {
            st.force_all(q);
        }
    }

    /// Operations enqueued on `stream` and not yet run (0 for unknown handles).
    pub fn pending_ops(&self, stream: RawStream) -> usize {
        let ctx = self.ctx();
        let mut st = self.lock();
        st.queue_for_test(stream, ctx)
            .and_then(|q| st.queues.get(&q))
            .map_or(0, |q| q.pending_len())
    }

    /// Operations enqueued on `stream` so far: its enqueue position. Every
    /// memset, copy, event record, wait on a recorded event, asynchronous
    /// allocation, asynchronous free and prefetch counts one. Work a capture
    /// records does not count; a launch of its graph counts each node.
    pub fn stream_position(&self, stream: RawStream) -> u64 {
        let ctx = self.ctx();
        let mut st = self.lock();
        let Some(q) = st.queue_for_test(stream, ctx) else {
            return 0;
        };
        st.queues
            .get(&q)
            .map(|x| x.enqueued)
            .or_else(|| st.gone.get(&q).copied())
            .unwrap_or(0)
    }

    /// The ordering oracle: true iff work enqueued on `later_stream` from now
    /// on is guaranteed to run after the first `earlier_pos` operations of
    /// `earlier_stream`, because they already ran, or the streams are the same,
    /// or `later_stream` has (pending) waits on event records of
    /// `earlier_stream` at position `earlier_pos` or later, directly or through
    /// other streams' waits. Destroyed streams' handles still work here.
    pub fn is_ordered_after(
        &self,
        earlier_stream: RawStream,
        earlier_pos: u64,
        later_stream: RawStream,
    ) -> bool {
        let ctx = self.ctx();
        let mut st = self.lock();
        let (Some(e), Some(l)) = (
            st.queue_for_test(earlier_stream, ctx),
            st.queue_for_test(later_stream, ctx),
        ) else {
            return false;
        };
        st.ordered_after(e, earlier_pos, l)
    }

    // ----- test controls: faults -----

    /// The `n`-th device allocation call from now (counting `mem_alloc`,
    /// `mem_alloc_async`, `mem_alloc_from_pool_async` and `vmm_create`;
    /// 1-based) fails with out-of-memory and changes nothing.
    pub fn fail_nth_alloc(&self, n: u64) {
        self.lock().faults.fail_nth_alloc(n);
    }

    /// The `nth` call (1-based, from now) of the driver function `call` (a CUDA
    /// name from the module documentation's table) fails with
    /// [`crate::Error::Driver`] of `code` and changes nothing.
    pub fn fail_call(&self, call: &str, nth: u64, code: i32) {
        self.lock().faults.fail_call(call, nth, code);
    }

    /// Calls of the driver function `call` so far (failed ones included).
    pub fn call_count(&self, call: &str) -> u64 {
        self.lock().faults.count(call)
    }

    /// Every driver function called so far (failed calls included) with its
    /// number of calls, sorted by name: what a fault sweep iterates over.
    pub fn call_counts(&self) -> Vec<(&'static str, u64)> {
        self.lock().faults.counts()
    }

    /// Driver calls of any kind so far.
    pub fn total_calls(&self) -> u64 {
        self.lock().faults.counts().iter().map(|&(_, n)| n).sum()
    }

    /// Disarms every injected fault.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    // ----- accounting -----

    /// Bytes charged to `device`: `cuMemAlloc` (rounded to 256), managed,
    /// pool-reserved and VMM physical memory. 0 for a bad ordinal.
    pub fn device_bytes(&self, device: u32) -> usize {
        self.lock()
            .devices
            .get(device as usize)
            .map_or(0, |d| d.used as usize)
    }

    /// Live allocations charged to `device` (each `cuMemAlloc`, managed
    /// allocation, pool granule block and physical allocation counts one).
    pub fn device_allocations(&self, device: u32) -> usize {
        self.lock()
            .devices
            .get(device as usize)
            .map_or(0, |d| d.allocs)
    }

    /// Bytes of live pinned host allocations.
    pub fn pinned_host_bytes(&self) -> usize {
        self.lock().pinned_bytes as usize
    }

    /// Live pinned and managed host allocations.
    pub fn host_allocations(&self) -> usize {
        self.lock().host.len()
    }

    /// Bytes mapped by `cuMemMap` and not unmapped.
    pub fn mapped_bytes(&self) -> usize {
        self.lock().mapped_bytes as usize
    }

    /// Bytes of VMM physical memory not yet freed.
    pub fn physical_bytes(&self) -> usize {
        self.lock().physical_bytes as usize
    }

    /// Bytes of reserved VMM address space.
    pub fn reserved_va_bytes(&self) -> usize {
        self.lock().reserved_va as usize
    }

    /// Pools created or imported and not yet gone (default pools excluded; a
    /// destroyed pool with live allocations still counts).
    pub fn live_pools(&self) -> usize {
        self.lock().live_pools()
    }

    /// Streams created and not destroyed.
    pub fn live_streams(&self) -> usize {
        self.lock().live_streams()
    }

    /// Events created and not destroyed.
    pub fn live_events(&self) -> usize {
        self.lock().events.len()
    }

    /// Preferred-location advice given so far: (address, bytes, location).
    pub fn advice(&self) -> Vec<(u64, usize, Location)> {
        self.lock().advice.clone()
    }

    /// Counters of memsets and copies.
    pub fn data_stats(&self) -> DataStats {
        self.lock().stats
    }

    // ----- peer access -----

    /// Every memset or copy refused so far because it would have touched
    /// another device's memory without access, in order: what a test
    /// asserts empty to show that code crossed devices only where allowed.
    pub fn peer_violations(&self) -> Vec<PeerViolation> {
        self.lock().peer_violations.clone()
    }

    /// Whether peer access from `device` to `peer` was enabled.
    pub fn peer_access_enabled(&self, device: u32, peer: u32) -> bool {
        self.lock().peers_enabled.contains(&(device, peer))
    }

    /// The properties physical memory was created with, by any live handle
    /// to it (`None` for an unknown handle).
    pub fn phys_props(&self, handle: RawPhys) -> Option<PhysProps> {
        let st = self.lock();
        let &(id, _) = st.phys_handles.get(&handle)?;
        st.phys.get(&id).map(|p| p.props)
    }

    // ----- stream capture -----

    /// Every call refused because of a stream capture so far, in order: what a
    /// test asserts empty to show that code made no call a capture forbids.
    pub fn capture_violations(&self) -> Vec<CaptureViolation> {
        self.lock().violations.clone()
    }

    /// Forgets the recorded capture violations.
    pub fn clear_capture_violations(&self) {
        self.lock().violations.clear();
    }

    /// Captures begun and not yet ended (invalidated ones included).
    pub fn active_captures(&self) -> usize {
        self.lock().captures.len()
    }

    /// Graphs made by captures and not yet destroyed.
    pub fn live_graphs(&self) -> usize {
        self.lock().graphs.len()
    }

    /// Executable graphs instantiated and not yet destroyed.
    pub fn live_graph_execs(&self) -> usize {
        self.lock().graph_execs.len()
    }
}
