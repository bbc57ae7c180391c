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
//! Here each pool id on a device gets its own
//! [`SegmentPool`](gpumem::pool::SegmentPool) over the driver, whatever the
//! device's resource (or over the allocator a PyTorch `MemPool` was made
//! with, see [`crate::foreign_segments`]): its blocks never mix with the device's pool, only
//! allocations routed to the same id reuse them, and its memory is laid out
//! as PyTorch's own private pools lay it out (so PyTorch's tools and tests
//! read the segments they expect). A block freed during a capture is reused
//! by later allocations of that capture's stream (the graph orders them as
//! the stream did), unless work on other streams used it
//! (`Tensor.record_stream`): nothing in the graph need order that work
//! before the block's next owner, so it waits for the capture to end (see
//! [`crate::stream_uses`]), or, with PyTorch's
//! `graph_capture_record_stream_reuse`, until those streams have joined its
//! stream in the graph (see [`crate::capture_reuse`]). Its layout can be saved and put back
//! ([`crate::gpumem_graph_pool_checkpoint`],
//! [`crate::gpumem_graph_pool_restore`]): PyTorch's CUDA
//! graph trees (`torch.compile(mode="reduce-overhead")`) do that whenever
//! they record a new branch.
//!
//! A block that a capture frees but does not own stays live, untouched,
//! until the graph pool of that capture goes: the captured graph may use it
//! in every replay. That covers blocks of the device's pool and blocks of
//! other graph pools (whose pool then stays, whatever its own uses). A
//! graph pool goes once nothing uses it (no graph, no capture) and its last
//! block is freed; then, once the device's work is done, its memory goes
//! back to the driver and the blocks it held are freed where they belong.
//!
//! PyTorch's `torch.cuda.MemPool` is a graph pool too: made with
//! `createOrIncrefPool` and filled while a thread is in `use_mem_pool` (a
//! capture to gpumem). Its options: a pool that does not split (see
//! [`SegmentPool::set_no_split`](gpumem::pool::SegmentPool::set_no_split)) and one whose free blocks serve the
//! device's allocations when the device runs out of memory (lending, in
//! `graph_pools/lending.rs`).
//!
//! Allocations into a graph pool are rare (during captures only) and take a
//! lock per device; the device's own allocation path checks one atomic, and
//! its free path one more while a graph pool's block is lent to it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use gpumem::adaptor::{LimitingAdaptor, StatisticsAdaptor};
use gpumem::captures::CaptureNotice;
use gpumem::pool::{Checkpoint, Restored, SegmentInfo, SegmentPool, SizeClass};
use gpumem::resource::{DeviceResource, LiveBlock, MemoryResource, Properties, DEFAULT_ALIGNMENT};
use gpumem::{Device, DevicePtr, Stream};

use crate::foreign_segments::{ForeignSegments, ForeignSource};
use crate::types::{gpumem_device_stats_t, gpumem_stat_t};

mod lending;

/// What a graph pool takes its segments from: statistics of the segments
/// made, and its share of the device's limit (set before each allocation:
/// what the device's own pool and the other graph pools leave), over the
/// driver or the pool's own allocator.
type Upstream = StatisticsAdaptor<LimitingAdaptor<Source>>;

/// Where a graph pool's segments come from.
#[derive(Debug)]
enum Source {
    /// `cuMemAlloc`.
    Driver(DeviceResource),
    /// The allocator a PyTorch `MemPool` was made with.
    Foreign(ForeignSegments),
}

impl Source {
    fn resource(&self) -> &dyn MemoryResource {
        match self {
            Source::Driver(r) => r,
            Source::Foreign(r) => r,
        }
    }
}

impl MemoryResource for Source {
    fn allocate(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> gpumem::Result<DevicePtr> {
        self.resource().allocate(bytes, alignment, stream)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> gpumem::Result<()> {
        self.resource().deallocate(ptr, bytes, alignment, stream)
    }

    fn device(&self) -> &Device {
        self.resource().device()
    }

    fn properties(&self) -> Properties {
        self.resource().properties()
    }
}

/// PyTorch's `MempoolId_t`: two numbers, one of them zero.
pub type PoolId = (u64, u64);

/// The id PyTorch gives the device's own pool (`{0, 0}`), never a graph
/// pool's: where a call takes a pool id, it names everything the device
/// holds.
pub const DEVICE_POOL: PoolId = (0, 0);

/// A block freed during a capture that the capture's pool does not own
/// (a block of the device's pool, or of another graph pool): held, live and
/// untouched, until the capture's pool goes.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) ptr: DevicePtr,
    pub(crate) size: usize,
    /// The bytes its allocation asked for (`size` unless rounded up).
    pub(crate) requested: usize,
    pub(crate) stream: Stream,
}

struct GraphPool {
    resource: SegmentPool<Upstream>,
    /// `retain` minus `release` calls: the graphs (or handles) using it.
    uses: u32,
    /// Captures into it under way (`begin` minus `end`).
    capturing: u32,
    /// Tells gpumem's pools that the capture is under way.
    notice: Option<CaptureNotice>,
    /// Blocks of the device's pool held for it.
    held: Vec<Held>,
    /// Blocks of other graph pools held for it, with their pool.
    held_elsewhere: Vec<(PoolId, Held)>,
    /// When it was made, among the device's graph pools (the order they
    /// lend in).
    made: u64,
    /// Its free blocks serve the device's allocations that ran out of
    /// memory (PyTorch's `MemPool(use_on_oom=True)`, see [`lending`]).
    use_on_oom: bool,
    /// Its live blocks lent to the device's allocations, by address.
    lent: HashSet<u64>,
}

impl GraphPool {
    fn live(&self) -> bool {
        self.resource.live_count() > 0
    }

    /// The statistics of the segments the pool makes (from the driver or
    /// from its own allocator).
    fn driver(&self) -> &Upstream {
        self.resource.upstream()
    }

    /// Its share of the device's limit.
    fn limiting(&self) -> &LimitingAdaptor<Source> {
        self.driver().upstream()
    }

    fn holds(&self, ptr: DevicePtr) -> bool {
        self.held.iter().any(|h| h.ptr == ptr)
            || self.held_elsewhere.iter().any(|(_, h)| h.ptr == ptr)
    }

    /// Frees a live block of the pool (checked by the pool); a block lent
    /// to the device's allocations is lent no longer.
    fn free_block(
        &mut self,
        ptr: DevicePtr,
        size: usize,
        stream: &Stream,
        lending: &AtomicUsize,
    ) -> gpumem::Result<()> {
        self.resource
            .deallocate(ptr, size, DEFAULT_ALIGNMENT, stream)?;
        self.forget_lent(ptr, lending);
        Ok(())
    }
}

/// A graph pool's segments, with the pool's id, for snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphSegment {
    /// The pool.
    pub pool: PoolId,
    /// The segment and its blocks.
    pub segment: SegmentInfo,
}

/// The graph pools of one device.
#[derive(Default)]
pub(crate) struct GraphPools {
    pools: Mutex<HashMap<PoolId, GraphPool>>,
    /// Captures into any of them under way: the device's free path holds
    /// the blocks freed on a capturing stream while this is not zero.
    capturing: AtomicUsize,
    /// Blocks held for graphs (of the device's pool or of graph pools):
    /// while not zero, the free paths refuse a second free of one of them.
    held: AtomicUsize,
    /// What the pools that are gone counted: their totals (and peaks, until
    /// the next reset), so the device's statistics never go backwards when
    /// a graph is deleted. Current values are zero: a pool goes empty.
    /// One record per [`StatsOf`]: all blocks, then each size class.
    gone: Mutex<[gpumem_device_stats_t; 3]>,
    /// Pools made so far (each pool's [`GraphPool::made`]).
    made: AtomicU64,
    /// Blocks of graph pools lent to the device's allocations (see
    /// [`lending`]): while not zero, the device's free path looks for them.
    lending: AtomicUsize,
}

/// Which blocks statistics count: all, or one size class (PyTorch's
/// `small_pool` and `large_pool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StatsOf {
    All,
    Class(SizeClass),
}

impl StatsOf {
    /// Every choice, in the order of the records kept per choice.
    pub(crate) const EACH: [StatsOf; 3] = [
        StatsOf::All,
        StatsOf::Class(SizeClass::Small),
        StatsOf::Class(SizeClass::Large),
    ];

    /// Its record among those kept per choice.
    pub(crate) fn index(self) -> usize {
        match self {
            StatsOf::All => 0,
            StatsOf::Class(SizeClass::Small) => 1,
            StatsOf::Class(SizeClass::Large) => 2,
        }
    }

    /// Whether it counts the blocks of `class`.
    fn takes(self, class: SizeClass) -> bool {
        self == StatsOf::All || self == StatsOf::Class(class)
    }
}

/// What a device must do once a graph pool is gone: give these blocks back
/// to its pool (after its work is done).
pub(crate) type Retired = Vec<Held>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn no_pool(id: PoolId) -> gpumem::Error {
    gpumem::Error::InvalidArgument(format!("graph pool {id:?} does not exist"))
}

impl GraphPools {
    /// Creates the pool `id`, or counts one more use of it.
    pub(crate) fn retain(&self, id: PoolId, device: &Device) -> gpumem::Result<()> {
        let mut pools = lock(&self.pools);
        if let Some(p) = pools.get_mut(&id) {
            p.uses += 1;
            return Ok(());
        }
        self.make(
            &mut pools,
            id,
            Source::Driver(DeviceResource::new(device.clone())),
        )
    }

    /// Creates the pool `id`, with one use, whose segments come from
    /// `source`; `Err` when it exists already (`source` is dropped then).
    pub(crate) fn retain_foreign(
        &self,
        id: PoolId,
        device: &Device,
        source: ForeignSource,
    ) -> gpumem::Result<()> {
        let mut pools = lock(&self.pools);
        if pools.contains_key(&id) {
            return Err(gpumem::Error::InvalidArgument(format!(
                "graph pool {id:?} exists already (a pool's allocator is given when it is made)"
            )));
        }
        let foreign = ForeignSegments::new(device.clone(), source);
        self.make(&mut pools, id, Source::Foreign(foreign))
    }

    /// Adds the pool `id`, with one use, over `source`.
    fn make(
        &self,
        pools: &mut HashMap<PoolId, GraphPool>,
        id: PoolId,
        source: Source,
    ) -> gpumem::Result<()> {
        let upstream = StatisticsAdaptor::new(LimitingAdaptor::new(source, usize::MAX));
        pools.insert(
            id,
            GraphPool {
                resource: SegmentPool::new(upstream)?,
                uses: 1,
                capturing: 0,
                notice: None,
                held: Vec::new(),
                held_elsewhere: Vec::new(),
                made: self.made.fetch_add(1, Ordering::Relaxed),
                use_on_oom: false,
                lent: HashSet::new(),
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
    /// live block, and returns the blocks of the device's pool they held;
    /// the blocks of other graph pools they held are freed there (which
    /// may let those go too). Nothing while any capture is under way:
    /// waiting for the device would break it.
    fn sweep(&self, pools: &mut HashMap<PoolId, GraphPool>) -> Option<Retired> {
        if self.capturing() {
            return None;
        }
        let mut retired: Option<Retired> = None;
        loop {
            let done: Vec<PoolId> = pools
                .iter()
                .filter(|(_, p)| p.uses == 0 && p.capturing == 0 && !p.live())
                .map(|(id, _)| *id)
                .collect();
            if done.is_empty() {
                return retired;
            }
            if retired.is_none() {
                // Captured work may still run (a replay in flight): wait for
                // the device before memory goes back. If the wait fails, the
                // memory goes back anyway (the device is then unusable for
                // work in any case).
                let first = &pools[&done[0]];
                if let Err(e) = first.resource.device().synchronize() {
                    log::warn!("graph pools: waiting for the device failed: {e}");
                }
            }
            let out = retired.get_or_insert_with(Vec::new);
            for id in done {
                let Some(p) = pools.remove(&id) else { continue };
                // Its counts live on in `gone`; the reserve it gives back
                // below is counted as freed there.
                let mut gone = lock(&self.gone);
                for of in StatsOf::EACH {
                    let mut stats = gpumem_device_stats_t::default();
                    add_pool_stats(&mut stats, &p, of);
                    stats.reserved_bytes.freed += stats.reserved_bytes.current;
                    stats.segment.freed += stats.segment.current;
                    stats.num_device_free += stats.segment.current;
                    add_totals(&mut gone[of.index()], &stats);
                }
                drop(gone);
                let released = p.held.len() + p.held_elsewhere.len();
                self.held.fetch_sub(released, Ordering::Relaxed);
                // None is live: none is lent.
                self.lending.fetch_sub(p.lent.len(), Ordering::Relaxed);
                out.extend(p.held);
                for (owner, h) in p.held_elsewhere {
                    let freed = pools
                        .get_mut(&owner)
                        .map(|o| o.free_block(h.ptr, h.size, &h.stream, &self.lending));
                    if let Some(Err(e)) = freed {
                        log::warn!(
                            "graph pool {owner:?}: freeing {:#x} held for graph pool {id:?}: {e}",
                            h.ptr
                        );
                    }
                }
                // Dropping the pool gives its segments back to the driver.
                drop(p.resource);
            }
        }
    }

    /// Whether `ptr` is held for a graph (a block of the device's pool or
    /// of a graph pool freed during a capture): one atomic load while none
    /// is.
    #[inline]
    pub(crate) fn is_held(&self, ptr: DevicePtr) -> bool {
        self.held.load(Ordering::Relaxed) != 0 && self.find_held(ptr)
    }

    #[cold]
    #[inline(never)]
    fn find_held(&self, ptr: DevicePtr) -> bool {
        lock(&self.pools).values().any(|p| p.holds(ptr))
    }

    /// The segments of every graph pool (`only`: of that one, none when it
    /// does not exist), with their blocks, and their live blocks (with the
    /// raw stream of their segment).
    pub(crate) fn snapshot(
        &self,
        only: Option<PoolId>,
    ) -> (Vec<GraphSegment>, Vec<(LiveBlock, u64)>) {
        let (mut segments, mut blocks) = (Vec::new(), Vec::new());
        let pools = lock(&self.pools);
        let chosen = pools
            .iter()
            .filter(|(id, _)| only.is_none_or(|o| o == **id));
        for (&pool, p) in chosen {
            segments.extend(
                p.resource
                    .segments()
                    .into_iter()
                    .map(|segment| GraphSegment { pool, segment }),
            );
            blocks.extend(p.resource.live_blocks());
        }
        (segments, blocks)
    }

    /// The graph pool with a live block at `ptr`, and the block's size.
    pub(crate) fn block_size(&self, ptr: DevicePtr) -> Option<(PoolId, usize)> {
        lock(&self.pools)
            .iter()
            .find_map(|(id, p)| p.resource.live_block_size(ptr).map(|size| (*id, size)))
    }

    /// The graph pool with a live block at `ptr`, the block and its
    /// segment's raw stream.
    pub(crate) fn block(&self, ptr: DevicePtr) -> Option<(PoolId, LiveBlock, u64)> {
        lock(&self.pools).iter().find_map(|(id, p)| {
            p.resource
                .live_block(ptr)
                .map(|(b, stream)| (*id, b, stream))
        })
    }

    /// Makes `id` hand out its free blocks whole from now on (PyTorch's
    /// `MemPool(no_split=True)`): see [`SegmentPool::set_no_split`].
    pub(crate) fn set_no_split(&self, id: PoolId) -> gpumem::Result<()> {
        let pools = lock(&self.pools);
        let p = pools.get(&id).ok_or_else(|| no_pool(id))?;
        p.resource.set_no_split(true);
        Ok(())
    }

    /// Uses of `id` counted (0 when it does not exist).
    pub(crate) fn use_count(&self, id: PoolId) -> u32 {
        lock(&self.pools).get(&id).map_or(0, |p| p.uses)
    }

    /// The live blocks of `id` (addresses), `None` when it does not exist.
    pub(crate) fn live_blocks(&self, id: PoolId) -> Option<Vec<DevicePtr>> {
        lock(&self.pools).get(&id).map(|p| {
            p.resource
                .live_blocks()
                .into_iter()
                .map(|(b, _)| b.address)
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
        let p = pools.get(&id).ok_or_else(|| {
            gpumem::Error::InvalidArgument(format!(
                "graph pool {id:?} does not exist (beginAllocateToPool was not called)"
            ))
        })?;
        let share = room.map_or(usize::MAX, |room| {
            let held: usize = pools.values().map(|q| q.limiting().allocated_bytes()).sum();
            p.limiting().allocated_bytes() + room.saturating_sub(held)
        });
        p.limiting().set_limit(share);
        p.resource.allocate(size, DEFAULT_ALIGNMENT, stream)
    }

    /// Frees a block of `id`; returns what the device gets back if that was
    /// the last block of a released pool. A block held for a graph is
    /// refused (a second free).
    pub(crate) fn free(
        &self,
        id: PoolId,
        ptr: DevicePtr,
        size: usize,
        stream: &Stream,
    ) -> gpumem::Result<Option<Retired>> {
        if self.is_held(ptr) {
            return Err(gpumem::Error::InvalidFree {
                ptr: ptr.0,
                reason: gpumem::FreeError::DoubleFree,
            });
        }
        let mut pools = lock(&self.pools);
        let p = pools.get_mut(&id).ok_or_else(|| no_pool(id))?;
        p.free_block(ptr, size, stream, &self.lending)?;
        Ok(self.sweep(&mut pools))
    }

    /// Checks a free of `ptr` with `size` in `id` as [`GraphPools::free`]
    /// would, freeing nothing.
    pub(crate) fn check_free(&self, id: PoolId, ptr: DevicePtr, size: usize) -> gpumem::Result<()> {
        let pools = lock(&self.pools);
        let p = pools.get(&id).ok_or_else(|| no_pool(id))?;
        p.resource.check_free(ptr, size)
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

    /// A block of graph pool `owner`, freed while a capture into `id` is
    /// under way: checked as a free would be and kept live in `owner` until
    /// `id` goes (`Ok(None)`), when `owner` is another pool and a capture
    /// into `id` is under way. Otherwise `Ok(Some(held))`: the caller frees
    /// it into `owner` as any free of its blocks (a block of the capture's
    /// own pool is reused by the capture, in the graph's order, unless other
    /// streams used it). `Err` is a bad free (a block held already, a
    /// pointer or size `owner` refuses).
    pub(crate) fn hold_elsewhere(
        &self,
        id: PoolId,
        owner: PoolId,
        held: Held,
    ) -> gpumem::Result<Option<Held>> {
        if self.is_held(held.ptr) {
            return Err(gpumem::Error::InvalidFree {
                ptr: held.ptr.0,
                reason: gpumem::FreeError::DoubleFree,
            });
        }
        if owner == id {
            return Ok(Some(held));
        }
        let mut pools = lock(&self.pools);
        let o = pools.get(&owner).ok_or_else(|| no_pool(owner))?;
        o.resource.check_free(held.ptr, held.size)?;
        match pools.get_mut(&id) {
            Some(p) if p.capturing > 0 => {
                p.held_elsewhere.push((owner, held));
                self.held.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            _ => Ok(Some(held)),
        }
    }

    /// Saves the layout of `id` (PyTorch's `getCheckpointState`).
    pub(crate) fn checkpoint(&self, id: PoolId) -> gpumem::Result<Checkpoint> {
        let pools = lock(&self.pools);
        Ok(pools
            .get(&id)
            .ok_or_else(|| no_pool(id))?
            .resource
            .checkpoint())
    }

    /// Puts a saved layout of `id` back (PyTorch's
    /// `setCheckpointPoolState`): see [`SegmentPool::restore`]. A block
    /// held for a graph is never freed by it: a checkpoint that would free
    /// one is refused.
    pub(crate) fn restore(&self, id: PoolId, saved: &Checkpoint) -> gpumem::Result<Restored> {
        let mut pools = lock(&self.pools);
        if !pools.contains_key(&id) {
            return Err(no_pool(id));
        }
        if self.held.load(Ordering::Relaxed) != 0 {
            let keep: Vec<DevicePtr> = saved.live_blocks().map(|b| b.address).collect();
            let held_here = pools
                .values()
                .flat_map(|q| q.held_elsewhere.iter())
                .filter(|(owner, h)| *owner == id && !keep.contains(&h.ptr))
                .count();
            if held_here > 0 {
                return Err(gpumem::Error::InvalidArgument(format!(
                    "graph pool {id:?}: the checkpoint would free a block another graph still uses"
                )));
            }
        }
        let p = pools.get_mut(&id).ok_or_else(|| no_pool(id))?;
        let restored = p.resource.restore(saved)?;
        for &ptr in &restored.freed {
            p.forget_lent(ptr, &self.lending);
        }
        Ok(restored)
    }

    /// Gives back the segments without a live block of every pool that no
    /// graph uses and no capture fills (PyTorch's `empty_cache` frees
    /// those), or of `only` if nothing uses it (a MemPool's `emptyCache`
    /// as it is deleted), once the device's work is done; nothing while a
    /// capture is under way. Returns the bytes given back.
    pub(crate) fn empty_cache(&self, only: Option<PoolId>) -> usize {
        if self.capturing() {
            return 0;
        }
        let pools = lock(&self.pools);
        let idle: Vec<&GraphPool> = pools
            .iter()
            .filter(|(id, p)| p.uses == 0 && only.is_none_or(|o| o == **id))
            .map(|(_, p)| p)
            .collect();
        let Some(first) = idle.first() else { return 0 };
        if let Err(e) = first.resource.device().synchronize() {
            log::warn!("graph pools: waiting for the device failed: {e}");
            return 0;
        }
        idle.iter()
            .map(|p| {
                p.resource.release_free_segments().unwrap_or_else(|e| {
                    log::warn!("graph pools: giving segments back failed: {e}");
                    0
                })
            })
            .sum()
    }

    /// The graph pools' statistics added to `stats` (current values and
    /// totals add up exactly; peaks are the sum of each pool's peak), those
    /// of the pools that are gone included.
    pub(crate) fn add_stats(&self, stats: &mut gpumem_device_stats_t, of: StatsOf) {
        for p in lock(&self.pools).values() {
            add_pool_stats(stats, p, of);
        }
        add_totals(stats, &lock(&self.gone)[of.index()]);
    }

    /// Bytes the graph pools hold from the driver: now, and the sum of
    /// their peaks (at least the peak of their sum).
    pub(crate) fn reserved_bytes(&self) -> (usize, usize) {
        self.sum(|s| s.reserved_bytes, |g| g.reserved_bytes.peak)
    }

    /// Bytes in the graph pools' live blocks: now, and the sum of their
    /// peaks.
    pub(crate) fn allocated_bytes(&self) -> (usize, usize) {
        self.sum(|s| s.allocated_bytes, |g| g.allocated_bytes.peak)
    }

    fn sum(
        &self,
        stat: impl Fn(&gpumem_device_stats_t) -> gpumem_stat_t,
        gone: impl Fn(&gpumem_device_stats_t) -> i64,
    ) -> (usize, usize) {
        let gone_peak = gone(&lock(&self.gone)[StatsOf::All.index()]).max(0) as usize;
        lock(&self.pools)
            .values()
            .fold((0, gone_peak), |(now, peak), p| {
                let mut s = gpumem_device_stats_t::default();
                add_pool_stats(&mut s, p, StatsOf::All);
                let s = stat(&s);
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
        for gone in lock(&self.gone).iter_mut() {
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
    }

    /// Number of graph pools that exist.
    pub(crate) fn len(&self) -> usize {
        lock(&self.pools).len()
    }
}

/// Adds pool `p`'s statistics of the blocks `of` counts to `stats` (its
/// driver calls with all blocks only); a graph pool's live blocks are all
/// active (none waits for a stream).
fn add_pool_stats(stats: &mut gpumem_device_stats_t, p: &GraphPool, of: StatsOf) {
    let add = |to: &mut gpumem_stat_t, from: gpumem_stat_t| {
        to.current += from.current;
        to.peak += from.peak;
        to.allocated += from.allocated;
        to.freed += from.freed;
    };
    let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    let s = p.resource.stats();
    let classes = [(SizeClass::Small, &s.small), (SizeClass::Large, &s.large)];
    for (_, c) in classes.into_iter().filter(|(class, _)| of.takes(*class)) {
        add(&mut stats.allocation, c.allocation.into());
        add(&mut stats.active, c.allocation.into());
        add(&mut stats.allocated_bytes, c.allocated_bytes.into());
        add(&mut stats.active_bytes, c.allocated_bytes.into());
        add(&mut stats.requested_bytes, c.requested_bytes.into());
        add(&mut stats.segment, c.segment.into());
        add(&mut stats.reserved_bytes, c.reserved_bytes.into());
    }
    if of == StatsOf::All {
        let d = p.driver().stats();
        stats.num_device_alloc += count(d.allocation.total);
        stats.num_device_free += count(d.allocation.freed);
    }
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
