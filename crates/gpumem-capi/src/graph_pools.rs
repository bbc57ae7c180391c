//! Graph-private pools: PyTorch's private memory pools for CUDA graphs,
//! served by gpumem.
//!
//! While a stream captures a graph, the memory allocated on it must keep its
//! address for every replay of the graph and must not be handed to work
//! outside the graph. PyTorch names a pool per graph (or one shared by
//! several graphs, `MempoolId_t`), routes the capturing stream's allocations
//! to it (`beginAllocateToPool` / `endAllocateToPool`, with a filter on the
//! stream's capture id that the native allocator applies), and releases it
//! when the graphs are deleted (`releasePool`).
//!
//! Here each pool id on a device gets its own [`PoolResource`](gpumem::pool::PoolResource) over the
//! driver, whatever the device's resource: its blocks never mix with the
//! device's pool, and only later captures into the same id reuse them. A
//! block freed during a capture is reused by later allocations of that
//! capture's stream (the graph orders them as the stream did). Its regions
//! sit over a [`HoldingAdaptor`](gpumem::adaptor::HoldingAdaptor): if the pool trims on out of memory, a
//! region it gives back is held, not freed, so no address a captured graph
//! uses is handed out again while the graph lives. (A VirtualPool would move
//! physical pages away from addresses freed during a capture, which the
//! graph's replays still write.) The pool holds what it was given until it is released and its last
//! block is freed; then, once the device's work is done, everything it held
//! goes back to the driver, along with the blocks of the device's pool that
//! were freed while a capture into it was under way (captured work may still
//! use those in replays, so they are held, not reused).
//!
//! Allocations into a graph pool are rare (during captures only) and take a
//! lock per device; the device's own allocation path checks one atomic.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use gpumem::adaptor::{HoldingAdaptor, LimitingAdaptor, StatisticsAdaptor};
use gpumem::captures::CaptureNotice;
use gpumem::pool::PoolResource;
use gpumem::resource::{DeviceResource, LiveBlock, MemoryResource, Segment, DEFAULT_ALIGNMENT};
use gpumem::{Device, DevicePtr, Stream};

use crate::types::{gpumem_device_stats_t, gpumem_stat_t};

/// A graph pool's stack: statistics of what it hands out, the pool, the
/// holding adaptor, statistics of what it takes from the driver, and its
/// share of the device's limit (set before each allocation: what the
/// device's own pool and the other graph pools leave).
type Stack = StatisticsAdaptor<
    PoolResource<HoldingAdaptor<StatisticsAdaptor<LimitingAdaptor<DeviceResource>>>>,
>;

/// PyTorch's `MempoolId_t`: two numbers, one of them zero.
pub type PoolId = (u64, u64);

/// A block of the device's pool freed while a capture into a graph pool was
/// under way: given back to the device's pool when the graph pool goes.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) ptr: DevicePtr,
    pub(crate) size: usize,
    pub(crate) stream: Stream,
}

struct GraphPool {
    resource: Stack,
    /// `retain` minus `release` calls: the graphs (or handles) using it.
    uses: u32,
    /// Captures into it under way (`begin` minus `end`).
    capturing: u32,
    /// Tells gpumem's pools that the capture is under way.
    notice: Option<CaptureNotice>,
    held: Vec<Held>,
}

impl GraphPool {
    fn live(&self) -> bool {
        self.resource.stats().allocated_bytes.current > 0
    }

    /// The statistics of what the pool takes from the driver.
    fn driver(&self) -> &StatisticsAdaptor<LimitingAdaptor<DeviceResource>> {
        self.resource.upstream().upstream().upstream()
    }

    /// Its share of the device's limit.
    fn limiting(&self) -> &LimitingAdaptor<DeviceResource> {
        self.driver().upstream()
    }
}

/// The graph pools of one device.
#[derive(Default)]
pub(crate) struct GraphPools {
    pools: Mutex<HashMap<PoolId, GraphPool>>,
    /// Captures into any of them under way: the device's free path holds
    /// the blocks freed on a capturing stream while this is not zero.
    capturing: AtomicUsize,
    /// Blocks of the device's pool held for graphs: while not zero, the
    /// device's free path refuses a second free of one of them.
    held: AtomicUsize,
    /// What the pools that are gone counted: their totals (and peaks, until
    /// the next reset), so the device's statistics never go backwards when
    /// a graph is deleted. Current values are zero: a pool goes empty.
    gone: Mutex<gpumem_device_stats_t>,
}

/// What a device must do once a graph pool is gone: give these blocks back
/// to its pool (after its work is done).
pub(crate) type Retired = Vec<Held>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl GraphPools {
    /// Creates the pool `id` with the device's configuration, or counts one
    /// more use of it.
    pub(crate) fn retain(&self, id: PoolId, device: &Device) -> gpumem::Result<()> {
        let mut pools = lock(&self.pools);
        if let Some(p) = pools.get_mut(&id) {
            p.uses += 1;
            return Ok(());
        }
        let driver = HoldingAdaptor::new(StatisticsAdaptor::new(LimitingAdaptor::new(
            DeviceResource::new(device.clone()),
            usize::MAX,
        )));
        let resource =
            StatisticsAdaptor::new(PoolResource::with_defaults(driver)?.reusing_captured_frees());
        pools.insert(
            id,
            GraphPool {
                resource,
                uses: 1,
                capturing: 0,
                notice: None,
                held: Vec::new(),
            },
        );
        Ok(())
    }

    /// Routes allocations to `id` from now on (creating it if needed, and
    /// counting a use, as PyTorch's `beginAllocateToPool` does: the graph
    /// releases it when it is deleted); the caller decides which streams'
    /// allocations come here.
    pub(crate) fn begin(&self, id: PoolId, device: &Device) -> gpumem::Result<()> {
        self.retain(id, device)?;
        let mut pools = lock(&self.pools);
        let p = pools.get_mut(&id).expect("retained above");
        if p.capturing > 0 {
            p.uses -= 1;
            return Err(gpumem::Error::InvalidArgument(format!(
                "allocations already go to graph pool {id:?}"
            )));
        }
        p.capturing += 1;
        p.notice = Some(CaptureNotice::new());
        self.capturing.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Ends one capture into `id`. Returns what must go back to the device
    /// when the pool is no longer used by anything. `Err` when no capture
    /// into `id` was under way.
    pub(crate) fn end(&self, id: PoolId) -> Result<Option<Retired>, String> {
        let mut pools = lock(&self.pools);
        let Some(p) = pools.get_mut(&id) else {
            return Err(format!("no capture into graph pool {id:?} is under way"));
        };
        if p.capturing == 0 {
            return Err(format!("no capture into graph pool {id:?} is under way"));
        }
        p.capturing -= 1;
        p.notice = None;
        self.capturing.fetch_sub(1, Ordering::AcqRel);
        Ok(self.sweep(&mut pools))
    }

    /// Counts one use of `id` less; when none is left, the pool goes once its
    /// last block is freed (returned: what the device gets back then).
    pub(crate) fn release(&self, id: PoolId) -> Result<Option<Retired>, String> {
        let mut pools = lock(&self.pools);
        let Some(p) = pools.get_mut(&id) else {
            return Err(format!("graph pool {id:?} does not exist"));
        };
        if p.uses == 0 {
            return Err(format!(
                "graph pool {id:?} was released more often than retained"
            ));
        }
        p.uses -= 1;
        Ok(self.sweep(&mut pools))
    }

    /// Drops every pool that nothing uses, with no capture into it and no
    /// live block, and returns the blocks they held for the device. Nothing
    /// while any capture is under way: waiting for the device would break it.
    fn sweep(&self, pools: &mut HashMap<PoolId, GraphPool>) -> Option<Retired> {
        if self.capturing() {
            return None;
        }
        let done: Vec<PoolId> = pools
            .iter()
            .filter(|(_, p)| p.uses == 0 && p.capturing == 0 && !p.live())
            .map(|(id, _)| *id)
            .collect();
        let first = pools.get(done.first()?)?;
        // Captured work may still run (a replay in flight): wait for the
        // device before memory goes back. If the wait fails, the memory goes
        // back anyway (the device is then unusable for work in any case).
        if let Err(e) = first.resource.device().synchronize() {
            log::warn!("graph pools: waiting for the device failed: {e}");
        }
        let mut held = Vec::new();
        for id in done {
            let Some(p) = pools.remove(&id) else { continue };
            // Its counts live on in `gone`; the reserve it gives back below
            // is counted as freed there.
            let mut stats = gpumem_device_stats_t::default();
            add_pool_stats(&mut stats, &p);
            stats.reserved_bytes.freed += stats.reserved_bytes.current;
            stats.segment.freed += stats.segment.current;
            stats.num_device_free += stats.segment.current;
            add_totals(&mut lock(&self.gone), &stats);
            // Dropping the pool gives its regions to the holding adaptor,
            // which gives everything back to the driver as it drops.
            held.extend(p.held);
            drop(p.resource);
        }
        self.held.fetch_sub(held.len(), Ordering::Relaxed);
        Some(held)
    }

    /// Whether `ptr`, a block of the device's pool, is held for a graph
    /// (freed during a capture): one atomic load while none is.
    #[inline]
    pub(crate) fn is_held(&self, ptr: DevicePtr) -> bool {
        self.held.load(Ordering::Relaxed) != 0 && self.find_held(ptr)
    }

    #[cold]
    #[inline(never)]
    fn find_held(&self, ptr: DevicePtr) -> bool {
        lock(&self.pools)
            .values()
            .any(|p| p.held.iter().any(|h| h.ptr == ptr))
    }

    /// The memory the graph pools hold from the driver (each driver
    /// allocation a segment, those of regions given back but held for a
    /// graph included) and their live blocks (stream unknown: 0).
    pub(crate) fn snapshot(&self) -> (Vec<Segment>, Vec<(LiveBlock, u64)>) {
        let (mut segments, mut blocks) = (Vec::new(), Vec::new());
        for p in lock(&self.pools).values() {
            segments.extend(
                p.limiting()
                    .upstream()
                    .live_blocks()
                    .into_iter()
                    .map(|b| Segment {
                        address: b.address,
                        size: b.size,
                    }),
            );
            blocks.extend(
                p.resource
                    .upstream()
                    .live_blocks()
                    .into_iter()
                    .map(|b| (b, 0)),
            );
        }
        (segments, blocks)
    }

    /// The graph pool with a live block at `ptr`, and the block's size.
    pub(crate) fn block_size(&self, ptr: DevicePtr) -> Option<(PoolId, usize)> {
        lock(&self.pools).iter().find_map(|(id, p)| {
            p.resource
                .upstream()
                .live_block_size(ptr)
                .map(|size| (*id, size))
        })
    }

    /// Uses of `id` counted (0 when it does not exist).
    pub(crate) fn use_count(&self, id: PoolId) -> u32 {
        lock(&self.pools).get(&id).map_or(0, |p| p.uses)
    }

    /// The live blocks of `id` (addresses), `None` when it does not exist.
    pub(crate) fn live_blocks(&self, id: PoolId) -> Option<Vec<DevicePtr>> {
        lock(&self.pools).get(&id).map(|p| {
            p.resource
                .upstream()
                .live_blocks()
                .into_iter()
                .map(|b| b.address)
                .collect()
        })
    }

    /// Allocates `size` bytes in `id` on `stream`; the graph pools together
    /// may hold at most `room` bytes from the driver (`None`: no limit).
    pub(crate) fn allocate(
        &self,
        id: PoolId,
        size: usize,
        stream: &Stream,
        room: Option<usize>,
    ) -> gpumem::Result<DevicePtr> {
        let pools = lock(&self.pools);
        let Some(p) = pools.get(&id) else {
            return Err(gpumem::Error::InvalidArgument(format!(
                "graph pool {id:?} does not exist (beginAllocateToPool was not called)"
            )));
        };
        let share = room.map_or(usize::MAX, |room| {
            let held: usize = pools.values().map(|q| q.limiting().allocated_bytes()).sum();
            p.limiting().allocated_bytes() + room.saturating_sub(held)
        });
        p.limiting().set_limit(share);
        p.resource.allocate(size, DEFAULT_ALIGNMENT, stream)
    }

    /// Frees a block of `id`; returns what the device gets back if that was
    /// the last block of a released pool.
    pub(crate) fn free(
        &self,
        id: PoolId,
        ptr: DevicePtr,
        size: usize,
        stream: &Stream,
    ) -> gpumem::Result<Option<Retired>> {
        let mut pools = lock(&self.pools);
        let Some(p) = pools.get(&id) else {
            return Err(gpumem::Error::InvalidArgument(format!(
                "graph pool {id:?} does not exist"
            )));
        };
        p.resource
            .deallocate(ptr, size, DEFAULT_ALIGNMENT, stream)?;
        Ok(self.sweep(&mut pools))
    }

    /// Whether a capture into any pool is under way (one atomic load).
    #[inline]
    pub(crate) fn capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire) > 0
    }

    /// Keeps a block of the device's pool, freed on `stream` while it
    /// captures into `id`, until `id` goes. `Err(held)` when `id` has no
    /// capture under way (the caller frees it as usual).
    pub(crate) fn hold(&self, id: PoolId, held: Held) -> Result<(), Held> {
        let mut pools = lock(&self.pools);
        match pools.get_mut(&id) {
            Some(p) if p.capturing > 0 => {
                p.held.push(held);
                self.held.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            _ => Err(held),
        }
    }

    /// The graph pools' statistics added to `stats` (current values and
    /// totals add up exactly; peaks are the sum of each pool's peak), those
    /// of the pools that are gone included.
    pub(crate) fn add_stats(&self, stats: &mut gpumem_device_stats_t) {
        for p in lock(&self.pools).values() {
            add_pool_stats(stats, p);
        }
        add_totals(stats, &lock(&self.gone));
    }

    /// Bytes the graph pools hold from the driver: now, and the sum of
    /// their peaks (at least the peak of their sum).
    pub(crate) fn reserved_bytes(&self) -> (usize, usize) {
        self.sum(
            |p| p.driver().stats().allocated_bytes,
            |g| g.reserved_bytes.peak,
        )
    }

    /// Bytes in the graph pools' live blocks: now, and the sum of their
    /// peaks.
    pub(crate) fn allocated_bytes(&self) -> (usize, usize) {
        self.sum(
            |p| p.resource.stats().allocated_bytes,
            |g| g.allocated_bytes.peak,
        )
    }

    fn sum(
        &self,
        stat: impl Fn(&GraphPool) -> gpumem::adaptor::Stat,
        gone: impl Fn(&gpumem_device_stats_t) -> i64,
    ) -> (usize, usize) {
        let gone_peak = gone(&lock(&self.gone)).max(0) as usize;
        lock(&self.pools)
            .values()
            .fold((0, gone_peak), |(now, peak), p| {
                let s = stat(p);
                (
                    now + s.current.max(0) as usize,
                    peak + s.peak.max(0) as usize,
                )
            })
    }

    /// Resets the graph pools' peaks to their current values (those of the
    /// pools that are gone to zero).
    pub(crate) fn reset_peak(&self) {
        for p in lock(&self.pools).values() {
            p.resource.reset_peak();
            p.driver().reset_peak();
        }
        let mut guard = lock(&self.gone);
        let gone = &mut *guard;
        for s in [
            &mut gone.allocation,
            &mut gone.segment,
            &mut gone.active,
            &mut gone.allocated_bytes,
            &mut gone.requested_bytes,
            &mut gone.reserved_bytes,
            &mut gone.active_bytes,
        ] {
            s.peak = 0;
        }
    }

    /// Number of graph pools that exist.
    pub(crate) fn len(&self) -> usize {
        lock(&self.pools).len()
    }
}

/// Adds pool `p`'s statistics to `stats`.
fn add_pool_stats(stats: &mut gpumem_device_stats_t, p: &GraphPool) {
    let add = |to: &mut gpumem_stat_t, from: gpumem_stat_t| {
        to.current += from.current;
        to.peak += from.peak;
        to.allocated += from.allocated;
        to.freed += from.freed;
    };
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let s = p.resource.stats();
    let d = p.driver().stats();
    add(&mut stats.allocation, s.allocation.into());
    add(&mut stats.segment, d.allocation.into());
    add(&mut stats.active, s.active.into());
    add(&mut stats.allocated_bytes, s.allocated_bytes.into());
    add(&mut stats.requested_bytes, s.requested_bytes.into());
    add(&mut stats.reserved_bytes, d.allocated_bytes.into());
    add(&mut stats.active_bytes, s.active_bytes.into());
    stats.num_device_alloc += count(d.allocation.total);
    stats.num_device_free += count(d.allocation.freed);
}

/// Adds the totals and peaks of `from` (a gone pool's, current values
/// zero) to `to`.
fn add_totals(to: &mut gpumem_device_stats_t, from: &gpumem_device_stats_t) {
    let pairs = [
        (&mut to.allocation, &from.allocation),
        (&mut to.segment, &from.segment),
        (&mut to.active, &from.active),
        (&mut to.allocated_bytes, &from.allocated_bytes),
        (&mut to.requested_bytes, &from.requested_bytes),
        (&mut to.reserved_bytes, &from.reserved_bytes),
        (&mut to.active_bytes, &from.active_bytes),
    ];
    for (t, f) in pairs {
        t.peak += f.peak;
        t.allocated += f.allocated;
        t.freed += f.freed;
    }
    to.num_device_alloc += from.num_device_alloc;
    to.num_device_free += from.num_device_free;
}
