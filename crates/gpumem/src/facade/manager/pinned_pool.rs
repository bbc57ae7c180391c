//! `PinnedPool`: a caching pool of pinned (page-locked) host memory whose
//! blocks are reused only once the copies that used them are done.
//!
//! Why: `cuMemHostAlloc` is slow, while copies from pinned memory run
//! several times faster than from pageable memory
//! (`docs/decisions.md`), so pinned memory is taken from the driver in
//! regions and cached.
//!
//! Algorithm: regions from [`PinnedHostResource`] are carved by a
//! [`LaneHeap`] (TLSF good fit, split and coalesce, O(1)); only its global lane
//! is used. Copies go through the pool ([`PinnedPool::copy_to_device_async`],
//! [`PinnedPool::copy_to_host_async`]), which files each copy in its stream's
//! open *batch* and notes (stream, batch) on the block. A batch is sealed by
//! recording one event on its stream: when one of its blocks is freed, when it
//! holds [`COPY_BATCH`] copies, or by [`PinnedPool::process_pending`]. So there
//! is one event per batch per stream, never one per free or per copy. A freed
//! block whose copies are all known complete goes back to the free index at
//! once; otherwise it waits in a pending list until its batches' events have
//! completed ([`PinnedPool::process_pending`], run by every allocation that
//! finds pending blocks). When nothing fits, the pool first waits for the
//! pending copies, then grows (within its maximum size), then gives entirely
//! free regions back and retries, then fails with [`Error::OutOfMemory`].
//!
//! Costs: allocate and free are O(1) plus a map operation (the live map is
//! ordered, so copies can check that a host range lies inside one block);
//! processing pending blocks costs an event query per stream with sealed
//! batches plus O(pending blocks).
//!
//! Soundness: safe code never reaches freed or concurrently written pinned
//! memory. [`PinnedPool::release_all`] refuses while any allocation is live
//! ([`Error::InUse`] names them; the forcing form is `unsafe`), and never
//! frees memory a copy may still use. Copies check both sides: the host range
//! must lie in one live block, a device-to-host copy may not write a block
//! that safe code can reach (a collection's, a planned pool's layout), and
//! the device side may not lie in the pool's own pinned memory (the driver
//! would take it, since pinned memory is mapped for the device). A copy,
//! once enqueued, is always noted on its block, even when its batch's event
//! cannot be recorded.
//!
//! The pool is a [`MemoryResource`] (host- and device-accessible memory) and
//! an [`allocator_api2::alloc::Allocator`], so collections can live in pinned
//! memory:
//!
//! ```
//! use allocator_api2::vec::Vec;
//! use gpumem::driver::sim::SimConfig;
//! use gpumem::manager::PinnedPool;
//! use gpumem::resource::PinnedHostResource;
//! use gpumem::Device;
//!
//! let device = Device::sim(SimConfig::default());
//! let pool = PinnedPool::with_defaults(PinnedHostResource::new(device)).unwrap();
//! let mut v: Vec<f32, &PinnedPool> = Vec::new_in(&pool);
//! v.extend((0..1000).map(|i| i as f32));
//! assert_eq!(v[999], 999.0);
//! ```

use std::alloc::Layout;
use std::collections::{BTreeMap, HashMap};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use allocator_api2::alloc::{AllocError, Allocator};

use crate::device::Device;
use crate::driver::DevicePtr;
use crate::pool::stream_order::events::{Batches, EventPool};
use crate::pool::stream_order::streams::{query, HeldStream, Progress};
use crate::pool::stream_order::sync::lock;
use crate::pool::Pool;
use crate::resource::{validate_request, MemoryResource, PinnedHostResource, Properties};
use crate::stream::{Stream, StreamId};
use crate::suballoc::{span_with_padding, LaneHeap, LaneId};
use crate::{Error, FreeError, LiveAllocations, OomInfo, Result};

/// Copies a stream's batch may hold before the copy path seals it with an event.
pub const COPY_BATCH: u32 = 32;

/// Spare events the pool keeps for its copy batches.
const SPARE_EVENTS: usize = 64;

/// Largest alignment the pinned pool serves.
pub const PINNED_MAX_ALIGNMENT: usize = 1 << 21;

/// Configuration of a [`PinnedPool`]. `Default`: nothing pinned up front, no
/// limit, regions of at least 32 MiB.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PinnedPoolConfig {
    /// Bytes pinned when the pool is made (0: nothing up front).
    pub initial_size: usize,
    /// Most bytes the pool may pin: its regions (at least `initial_size`).
    /// A request that would need more is out of memory. `None`: no limit.
    pub max_reserved: Option<usize>,
    /// Smallest region pinned when the pool grows (requests larger than this
    /// get a region of their own size).
    pub growth: usize,
}

impl Default for PinnedPoolConfig {
    fn default() -> Self {
        Self {
            initial_size: 0,
            max_reserved: None,
            growth: 32 << 20,
        }
    }
}

impl PinnedPoolConfig {
    /// A fixed-size pool: `bytes` pinned up front and never more.
    pub fn fixed(bytes: usize) -> Self {
        Self {
            initial_size: bytes,
            max_reserved: Some(bytes),
            ..Self::default()
        }
    }
}

/// Numbers describing a [`PinnedPool`] at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PinnedPoolStats {
    /// Bytes pinned from the driver.
    pub reserved: usize,
    /// Highest `reserved` since the pool was made or its peak was reset.
    pub peak_reserved: usize,
    /// Bytes in blocks handed out (rounded block sizes).
    pub live: usize,
    /// Blocks handed out.
    pub live_blocks: usize,
    /// Freed blocks waiting for their copies to complete.
    pub pending_blocks: usize,
    /// Bytes of the pending blocks.
    pub pending_bytes: usize,
    /// Bytes free for reuse now.
    pub free: usize,
    /// Regions pinned from the driver.
    pub regions: usize,
    /// Events recorded so far (one per sealed copy batch).
    pub events_recorded: u64,
    /// Copies enqueued through the pool so far.
    pub copies: u64,
}

/// What [`PinnedPool::release_all`] gave back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PinnedRelease {
    /// Bytes given back to the driver.
    pub released_bytes: usize,
    /// Allocations still live when the pool was released, as (pointer,
    /// requested bytes); their memory is gone. Always empty from
    /// [`PinnedPool::release_all`], which refuses while any is live; filled
    /// by [`PinnedPool::release_all_unchecked`].
    pub outstanding: Vec<(DevicePtr, usize)>,
}

/// How a copy uses the pool's host range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HostSide {
    /// The device reads it (host to device).
    Read,
    /// The device writes it; refused where safe code can reach the range.
    Written,
    /// The device writes it; the caller excludes host access (`unsafe`).
    WrittenUnchecked,
}

/// Live allocations an [`Error::InUse`] lists.
const SHOWN_LIVE: usize = 4;

/// A (stream, batch) pair: the block was used by a copy of that batch.
type Use = (StreamId, u64);

struct LiveBlock {
    /// Block size in the heap.
    size: u64,
    /// Bytes requested.
    bytes: usize,
    /// Latest batch per stream whose copies used the block.
    uses: Vec<Use>,
    /// Safe code may hold references into it (a collection owns it through
    /// the `Allocator` interface, or a [`PlannedPool`](super::PlannedPool)
    /// hands out slices of it), so safe copies into it are refused.
    reachable: bool,
}

struct Pending {
    addr: u64,
    size: u64,
    uses: Vec<Use>,
}

/// The copy batches of one stream.
struct Track {
    held: HeldStream,
    /// The batch that new copies join; batches are numbered from 1.
    open_seq: u64,
    open_copies: u32,
    /// Sealed batches, oldest first.
    sealed: Batches,
    /// Every batch up to this one is complete.
    done_seq: u64,
}

struct State {
    heap: LaneHeap,
    /// Region base → bytes.
    regions: BTreeMap<u64, usize>,
    live: BTreeMap<u64, LiveBlock>,
    pending: Vec<Pending>,
    tracks: HashMap<StreamId, Track>,
    /// Spare events for the tracks' batches.
    events: EventPool,
    events_recorded: u64,
    copies: u64,
    /// Highest bytes pinned since creation or the last reset.
    peak_reserved: usize,
    shut: bool,
}

/// A pool of pinned host memory gated by copy events; see the module
/// documentation.
///
/// ```
/// use gpumem::driver::sim::SimConfig;
/// use gpumem::manager::{PinnedPool, PinnedPoolConfig};
/// use gpumem::pool::Pool;
/// use gpumem::resource::{DeviceResource, MemoryResource, PinnedHostResource};
/// use gpumem::Device;
///
/// fn main() -> gpumem::Result<()> {
///     let device = Device::sim(SimConfig::backed(64 << 20));
///     let config = PinnedPoolConfig::fixed(8 << 20); // pinned once, never more
///     let pool = PinnedPool::new(PinnedHostResource::new(device.clone()), config)?;
///     let dev = DeviceResource::new(device.clone());
///     let stream = device.create_stream()?;
///
///     let host = pool.allocate_sync(4096, 256)?;
///     let gpu = dev.allocate(4096, 256, &stream)?;
///     pool.copy_to_device_async(gpu, host, 4096, &stream)?;
///     pool.free(host)?; // reused only once the copy has run
///     stream.synchronize()?;
///     dev.deallocate(gpu, 4096, 256, &stream)?;
///     assert_eq!(pool.reserved_bytes(), 8 << 20);
///     assert_eq!(pool.release()?, 8 << 20); // every region is free again
///     Ok(())
/// }
/// ```
pub struct PinnedPool {
    upstream: PinnedHostResource,
    config: PinnedPoolConfig,
    state: Mutex<State>,
}

impl std::fmt::Debug for PinnedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedPool")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

fn done(tracks: &HashMap<StreamId, Track>, uses: &[Use]) -> bool {
    uses.iter()
        .all(|(sid, seq)| tracks.get(sid).is_none_or(|t| *seq <= t.done_seq))
}

impl Track {
    fn new(stream: &Stream) -> Self {
        Self {
            held: HeldStream::new(stream),
            open_seq: 1,
            open_copies: 0,
            sealed: Batches::default(),
            done_seq: 0,
        }
    }

    /// Records the open batch's event; returns whether one was recorded.
    fn seal(&mut self, events: &EventPool) -> Result<bool> {
        if self.open_copies == 0 {
            return Ok(false);
        }
        self.sealed
            .seal(self.held.stream(), self.open_seq, events)?;
        self.open_seq += 1;
        self.open_copies = 0;
        Ok(true)
    }

    /// Moves the completion watermark over every completed sealed batch.
    fn poll(&mut self, events: &EventPool) -> Result<()> {
        let done_seq = &mut self.done_seq;
        self.sealed.poll(events, |seq| *done_seq = seq)
    }

    /// Seals and waits for every batch of this stream.
    fn wait(&mut self, events: &EventPool) -> Result<bool> {
        let recorded = self.seal(events)?;
        if let Some(seq) = self.sealed.wait_all(events)? {
            self.done_seq = seq;
        }
        Ok(recorded)
    }
}

impl PinnedPool {
    /// A pool over `upstream`, pinning `config.initial_size` bytes at once.
    /// `PinnedHostResource::new(device)` pins portable, device-mapped memory
    /// of `device`'s driver; other `cuMemHostAlloc` flags make other
    /// upstreams.
    ///
    /// The pool pins its regions with `upstream`'s device and flags but a
    /// table of its own: clones of `upstream` the caller kept neither see
    /// them ([`PinnedHostResource::live_allocations`]) nor can free them
    /// (refused as [`FreeError::Unknown`]), so no one but the pool unpins
    /// memory under its blocks while safe code holds references into them.
    pub fn new(upstream: PinnedHostResource, config: PinnedPoolConfig) -> Result<Self> {
        let upstream = upstream.with_own_table();
        if let Some(max) = config.max_reserved {
            if config.initial_size > max {
                return Err(Error::InvalidArgument(format!(
                    "pinned pool initial size {} exceeds its max_reserved {max}",
                    config.initial_size
                )));
            }
        }
        let pool = Self {
            upstream,
            config,
            state: Mutex::new(State {
                heap: LaneHeap::new(),
                regions: BTreeMap::new(),
                live: BTreeMap::new(),
                pending: Vec::new(),
                tracks: HashMap::new(),
                events: EventPool::new(SPARE_EVENTS),
                events_recorded: 0,
                copies: 0,
                peak_reserved: 0,
                shut: false,
            }),
        };
        if pool.config.initial_size > 0 {
            // A size no allocation can have is out of memory, as for requests.
            let bytes = pool
                .config
                .initial_size
                .checked_next_multiple_of(256)
                .ok_or_else(|| Error::oom(pool.config.initial_size))?;
            let mut st = pool.lock();
            pool.add_region(&mut st, bytes)?;
        }
        Ok(pool)
    }

    /// A pool over `upstream` with the default configuration.
    pub fn with_defaults(upstream: PinnedHostResource) -> Result<Self> {
        Self::new(upstream, PinnedPoolConfig::default())
    }

    /// The configuration.
    pub fn config(&self) -> &PinnedPoolConfig {
        &self.config
    }

    /// The device whose driver pins the memory.
    pub fn device(&self) -> &Device {
        self.upstream.device()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// The current numbers.
    pub fn stats(&self) -> PinnedPoolStats {
        let st = self.lock();
        PinnedPoolStats {
            reserved: st.heap.region_bytes() as usize,
            peak_reserved: st.peak_reserved,
            live: st.live.values().map(|b| b.size as usize).sum(),
            live_blocks: st.live.len(),
            pending_blocks: st.pending.len(),
            pending_bytes: st.pending.iter().map(|p| p.size as usize).sum(),
            free: st.heap.free_bytes() as usize,
            regions: st.regions.len(),
            events_recorded: st.events_recorded,
            copies: st.copies,
        }
    }

    fn add_region(&self, st: &mut State, bytes: usize) -> Result<()> {
        let base = self.upstream.allocate_sync(bytes, 256)?;
        if let Err(e) = st.heap.add_region(base.0, bytes as u64) {
            let _ = self.upstream.deallocate_sync(base, bytes, 256);
            return Err(Error::InvalidArgument(format!(
                "pinned region {base:#x} of {bytes} bytes rejected: {e}"
            )));
        }
        st.regions.insert(base.0, bytes);
        st.peak_reserved = st.peak_reserved.max(st.heap.region_bytes() as usize);
        Ok(())
    }

    /// Gives entirely free regions back to the driver, largest first, until
    /// the pool pins at most `to` bytes (0: every free region). A region the
    /// driver refuses to unpin stays the pool's, free. Returns the bytes
    /// given back and the first error.
    fn trim_locked(&self, st: &mut State, to: usize) -> (usize, Option<Error>) {
        let mut excess = (st.heap.region_bytes() as usize).saturating_sub(to);
        let mut free: Vec<_> = st
            .heap
            .free_regions()
            .map(|(id, _, size)| (id, size))
            .collect();
        free.sort_by_key(|&(_, size)| std::cmp::Reverse(size));
        let mut bytes = 0;
        let mut first_err = None;
        for (id, _) in free {
            if excess == 0 {
                break;
            }
            let Ok((base, size)) = st.heap.remove_region(id) else {
                continue;
            };
            match self
                .upstream
                .deallocate_sync(DevicePtr(base), size as usize, 256)
            {
                Ok(()) => {
                    st.regions.remove(&base);
                    bytes += size as usize;
                    excess = excess.saturating_sub(size as usize);
                }
                Err(e) => {
                    // Removed a moment ago: it fits back, free.
                    let _ = st.heap.add_region(base, size);
                    first_err.get_or_insert(e);
                }
            }
        }
        (bytes, first_err)
    }

    /// Seals and polls every stream's batches, then frees the pending
    /// blocks whose copies are done. A stream whose event fails keeps its
    /// blocks pending; the others go on; the first error is returned after.
    /// Streams their users dropped are forgotten once nothing of theirs is
    /// open or sealed, pending blocks or not.
    fn process_locked(st: &mut State) -> Result<usize> {
        if st.pending.is_empty() && st.tracks.values().all(|t| t.sealed.is_empty()) {
            Self::forget_dropped_streams(st);
            return Ok(0);
        }
        let mut first_err = None;
        for t in st.tracks.values_mut() {
            if !st.pending.is_empty() {
                // A pending block may wait for the open batch: seal it.
                match t.seal(&st.events) {
                    Ok(sealed) => st.events_recorded += u64::from(sealed),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            if let Err(e) = t.poll(&st.events) {
                first_err.get_or_insert(e);
            }
        }
        let mut released = 0;
        let mut i = 0;
        while i < st.pending.len() {
            if done(&st.tracks, &st.pending[i].uses) {
                let p = st.pending.swap_remove(i);
                let _ = st.heap.free(p.addr, LaneId::GLOBAL);
                released += 1;
            } else {
                i += 1;
            }
        }
        Self::forget_dropped_streams(st);
        first_err.map_or(Ok(released), Err)
    }

    /// Forgets the tracks of streams their users dropped whose copies are
    /// all known done (a block's use of a forgotten stream counts as done).
    fn forget_dropped_streams(st: &mut State) {
        st.tracks
            .retain(|_, t| !(t.held.is_dropped() && t.sealed.is_empty() && t.open_copies == 0));
    }

    /// Unpins free regions down to `to` bytes (see [`PinnedPool::trim_locked`])
    /// after `processed`, the pending blocks' processing: the bytes given
    /// back, or the first error of the two.
    fn give_back(&self, st: &mut State, processed: Result<()>, to: usize) -> Result<usize> {
        let (bytes, err) = self.trim_locked(st, to);
        match (err, processed) {
            (Some(e), _) | (None, Err(e)) => Err(e),
            (None, Ok(())) => Ok(bytes),
        }
    }

    /// Moves freed blocks whose copies have completed back to the free index;
    /// returns how many. Allocations call it when blocks are pending.
    pub fn process_pending(&self) -> Result<usize> {
        Self::process_locked(&mut self.lock())
    }

    fn wait_locked(st: &mut State) -> Result<()> {
        let mut recorded = 0;
        for t in st.tracks.values_mut() {
            recorded += u64::from(t.wait(&st.events)?);
        }
        st.events_recorded += recorded;
        Self::process_locked(st).map(|_| ())
    }

    /// Waits for every copy enqueued through the pool, then processes the
    /// pending blocks.
    pub fn wait_pending(&self) -> Result<()> {
        Self::wait_locked(&mut self.lock())
    }

    fn oom(&self, st: &State, bytes: usize) -> Error {
        Error::oom_with(OomInfo {
            requested: bytes,
            device: None,
            reserved: Some(st.heap.region_bytes() as usize),
            live: Some(st.heap.used_bytes() as usize),
            largest_free: Some(st.heap.largest_free(LaneId::GLOBAL) as usize),
            limit: self.config.max_reserved,
        })
    }

    fn allocate_block(&self, bytes: usize, alignment: usize, reachable: bool) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, PINNED_MAX_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        let mut st = self.lock();
        if st.shut {
            return Err(Error::ShutDown("PinnedPool"));
        }
        if !st.pending.is_empty() {
            // Best effort: blocks whose copies cannot be checked stay pending.
            let _ = Self::process_locked(&mut st);
        }
        let a = match self.find(&mut st, bytes, alignment)? {
            Some(a) => a,
            None => return Err(self.oom(&st, bytes)),
        };
        st.live.insert(
            a.addr,
            LiveBlock {
                size: a.size,
                bytes,
                uses: Vec::new(),
                reachable,
            },
        );
        Ok(DevicePtr(a.addr))
    }

    fn find(
        &self,
        st: &mut State,
        bytes: usize,
        alignment: usize,
    ) -> Result<Option<crate::suballoc::Allocation>> {
        let (size, align) = (bytes as u64, alignment as u64);
        if let Some(a) = st.heap.allocate(LaneId::GLOBAL, size, align) {
            return Ok(Some(a));
        }
        // 1. Wait for the copies that hold freed blocks back (if that
        // fails, they stay pending and the pool grows instead).
        if !st.pending.is_empty() && Self::wait_locked(st).is_ok() {
            if let Some(a) = st.heap.allocate(LaneId::GLOBAL, size, align) {
                return Ok(Some(a));
            }
        }
        // 2. Grow, within the maximum.
        let Some(needed) = span_with_padding(bytes, alignment) else {
            return Ok(None);
        };
        let reserved = st.heap.region_bytes() as usize;
        let room = self
            .config
            .max_reserved
            .map_or(usize::MAX, |m| m.saturating_sub(reserved));
        // A growth step too large to round is as large as any.
        let step = self
            .config
            .growth
            .checked_next_multiple_of(256)
            .unwrap_or(usize::MAX - 255);
        let want = needed.max(step).min(room);
        if want < needed {
            return Ok(None);
        }
        match self.add_region(st, want) {
            Ok(()) => {}
            Err(e) if e.is_oom() => {
                // 3. The growth step may be what does not fit: pin what the
                // request needs; failing that, unpin entirely free regions
                // and try once more.
                if want == needed || self.add_region(st, needed).is_err() {
                    if self.trim_locked(st, 0).0 == 0 {
                        return Err(e);
                    }
                    self.add_region(st, needed)?;
                }
            }
            Err(e) => return Err(e),
        }
        Ok(st.heap.allocate(LaneId::GLOBAL, size, align))
    }

    /// Frees a block, gating it on its copies and, when `stream` is given and
    /// busy, on the work enqueued on it so far. A block that safe code
    /// reaches through references is freed only by its owner (`by_owner`).
    fn free_block(
        &self,
        ptr: DevicePtr,
        bytes: Option<usize>,
        stream: Option<&Stream>,
        by_owner: bool,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        if let Some(s) = stream {
            self.check_stream(s)?;
        }
        let mut st = self.lock();
        let st = &mut *st;
        if st.shut {
            return Err(Error::ShutDown("PinnedPool"));
        }
        let Some(mut blk) = st.live.remove(&ptr.0) else {
            return Err(Error::InvalidFree {
                ptr: ptr.0,
                reason: Self::bad_free_reason(st, ptr.0),
            });
        };
        let refused = if blk.reachable && !by_owner {
            Some(FreeError::Owned)
        } else {
            bytes
                .filter(|&b| b != blk.bytes)
                .map(|freed| FreeError::SizeMismatch {
                    allocated: blk.bytes,
                    freed,
                })
        };
        if let Some(reason) = refused {
            st.live.insert(ptr.0, blk);
            return Err(Error::InvalidFree { ptr: ptr.0, reason });
        }
        if let Some(s) = stream {
            // The legacy default stream too: device work on it may still use
            // the block, and a block reused at once could be handed to a safe
            // collection while that work writes it.
            if query(s) != Progress::Idle {
                let t = st.tracks.entry(s.id()).or_insert_with(|| Track::new(s));
                t.open_copies += 1;
                add_use(&mut blk.uses, (s.id(), t.open_seq));
            }
        }
        let mut recorded = 0;
        for (sid, seq) in &blk.uses {
            if let Some(t) = st.tracks.get_mut(sid) {
                if *seq == t.open_seq {
                    // The free has happened either way: if the event cannot
                    // be recorded, the batch stays open and the block waits
                    // in the pending list until a later seal succeeds.
                    recorded += u64::from(t.seal(&st.events).unwrap_or(false));
                }
            }
        }
        st.events_recorded += recorded;
        if done(&st.tracks, &blk.uses) {
            let _ = st.heap.free(ptr.0, LaneId::GLOBAL);
        } else {
            st.pending.push(Pending {
                addr: ptr.0,
                size: blk.size,
                uses: blk.uses,
            });
        }
        Ok(())
    }

    /// Why `addr`, not a live block, cannot be freed.
    #[cold]
    fn bad_free_reason(st: &State, addr: u64) -> FreeError {
        if st.pending.iter().any(|p| p.addr == addr) {
            return FreeError::DoubleFree;
        }
        // Pending blocks are the heap's only used blocks that are not live,
        // so the heap can tell a freed block from an address it never had.
        st.heap
            .diagnose_bad_free(addr)
            .free_reason()
            .unwrap_or(FreeError::Unknown)
    }

    /// Frees a block knowing only its address (no stream uses it any more);
    /// it is reused once the copies that used it are done. The
    /// [`MemoryResource`] interface checks the size too. A block that a
    /// collection or a [`PlannedPool`](super::PlannedPool) owns is refused
    /// ([`FreeError::Owned`]): safe code still holds references into it.
    pub fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.free_block(ptr, None, None, false)
    }

    /// Frees a block of [`PinnedPool::allocate_reachable`] (its owner, a
    /// planned pool, no longer hands out references into it).
    pub(super) fn free_reachable(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.free_block(ptr, Some(bytes), None, true)
    }

    /// Finds the live block holding `[ptr, ptr + bytes)`.
    fn block_of(st: &mut State, ptr: DevicePtr, bytes: usize) -> Result<&mut LiveBlock> {
        let end = ptr.0.checked_add(bytes as u64);
        match st.live.range_mut(..=ptr.0).next_back() {
            Some((&base, b)) if end.is_some_and(|e| e <= base + b.bytes as u64) => Ok(b),
            _ => Err(Error::InvalidArgument(format!(
                "host range {:#x}+{bytes} is not inside a live allocation of this pinned pool",
                ptr.0
            ))),
        }
    }

    /// Refuses a stream of another driver instance: its copies would
    /// address memory where this pool's driver does not know it (the checks
    /// of the device side ask this pool's driver), and this pool's events
    /// cannot be recorded on it.
    fn check_stream(&self, stream: &Stream) -> Result<()> {
        if Arc::ptr_eq(stream.device().driver(), self.device().driver()) {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "a stream of device {} of another driver instance for a pinned pool of device {}",
            stream.device().ordinal(),
            self.device().ordinal()
        )))
    }

    /// Refuses a device-side copy range that overlaps pinned host memory,
    /// this pool's or any other's: the driver would accept it (pinned memory
    /// is mapped for the device), and the copy would then read or write host
    /// memory that a pool hands out, possibly under live references (another
    /// pool's collection, say).
    fn check_device_side(
        &self,
        st: &State,
        ptr: DevicePtr,
        bytes: usize,
        role: &str,
    ) -> Result<()> {
        let end = ptr.0.saturating_add(bytes as u64);
        let ours = st
            .regions
            .range(..end)
            .next_back()
            .is_some_and(|(&base, &len)| base + len as u64 > ptr.0);
        let driver = self.upstream.device().driver();
        // Its first and last bytes: a range could start in device memory and
        // run on into pinned memory.
        let pinned = ours
            || driver.is_pinned_host(ptr)?
            || driver.is_pinned_host(DevicePtr(end.saturating_sub(1)))?;
        if pinned {
            return Err(Error::InvalidArgument(format!(
                "copy {role} {:#x}+{bytes} is pinned host memory{}, not device memory",
                ptr.0,
                if ours { " of this pool" } else { "" }
            )));
        }
        Ok(())
    }

    /// Checks both sides of a copy between the pool block holding
    /// `host..host+bytes` and device memory at `device`, enqueues it with
    /// `enqueue` and notes it on the block, all under the pool's lock.
    fn tracked_copy(
        &self,
        host: DevicePtr,
        device: DevicePtr,
        bytes: usize,
        stream: &Stream,
        side: HostSide,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.check_stream(stream)?;
        let mut st = self.lock();
        let role = match side {
            HostSide::Read => "destination",
            HostSide::Written | HostSide::WrittenUnchecked => "source",
        };
        self.check_device_side(&st, device, bytes, role)?;
        if Self::block_of(&mut st, host, bytes)?.reachable && side == HostSide::Written {
            return Err(Error::InvalidArgument(format!(
                "host range {:#x}+{bytes} is reachable from safe code (a collection in pinned \
                 memory or a planned pool's slices own it): a copy into it is refused; \
                 use copy_to_host_async_unchecked",
                host.0
            )));
        }
        enqueue()?;
        Self::note_copy(&mut st, host, stream);
        Ok(())
    }

    /// Notes a copy enqueued on `stream` on the live block holding `host`, so
    /// the block is not reused before the copy has run. Cannot fail: the copy
    /// is already enqueued.
    fn note_copy(st: &mut State, host: DevicePtr, stream: &Stream) {
        let t = st
            .tracks
            .entry(stream.id())
            .or_insert_with(|| Track::new(stream));
        t.open_copies += 1;
        let u = (stream.id(), t.open_seq);
        if t.open_copies >= COPY_BATCH {
            // If the event cannot be recorded, the batch stays open; a later
            // copy, free or `process_pending` seals it.
            st.events_recorded += u64::from(t.seal(&st.events).unwrap_or(false));
        }
        st.copies += 1;
        if let Some((_, b)) = st.live.range_mut(..=host.0).next_back() {
            add_use(&mut b.uses, u);
        }
    }

    /// Enqueues a copy of `bytes` from pinned memory of this pool at `src` to
    /// device memory at `dst` on `stream`. `src..src+bytes` must lie inside one
    /// live allocation of the pool; the block is not reused before the copy
    /// has run, even if it is freed at once. Host writes to the range before
    /// the stream has run the copy change what is copied (the caller orders
    /// them). `dst` is device memory the caller owns; a `dst` inside this
    /// pool's pinned memory is refused.
    pub fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.tracked_copy(src, dst, bytes, stream, HostSide::Read, || {
            // SAFETY: `src..src+bytes` lies inside a live block of this pool
            // and `dst` outside its memory (both checked under the lock held
            // around this call); the block is not given back to the driver or
            // reused until the event of this copy's batch has completed (noted
            // under the same lock), so the host range stays valid until the
            // copy runs. `stream` is live while borrowed, on its own driver.
            unsafe {
                stream.device().driver().memcpy_htod_async(
                    dst,
                    src.as_mut_ptr::<u8>(),
                    bytes,
                    stream.raw(),
                )
            }
        })
    }

    /// Enqueues a copy of `bytes` from device memory at `src` into pinned memory
    /// of this pool at `dst` on `stream`. `dst..dst+bytes` must lie inside one
    /// live allocation of the pool made through [`MemoryResource::allocate`]
    /// (host code reaches it only through `unsafe`
    /// [`PinnedPool::host_slice_mut`], whose contract orders it after the
    /// copy). Memory that safe code can reach (a collection's, through the
    /// `Allocator` interface, or a [`PlannedPool`](super::PlannedPool)'s
    /// layout) is refused, since safe code could read it while the copy
    /// writes it: use [`PinnedPool::copy_to_host_async_unchecked`] there. A
    /// `src` inside this pool's pinned memory is refused.
    pub fn copy_to_host_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: `HostSide::Written` refuses a range safe code can reach, so
        // no safe reference to it exists; unsafe readers order their reads
        // after the copy (host_slice_mut's contract).
        unsafe { self.copy_into(dst, src, bytes, stream, HostSide::Written) }
    }

    /// [`PinnedPool::copy_to_host_async`] into any live allocation of the pool,
    /// those safe code can reach included (the device side is checked the
    /// same way).
    ///
    /// # Safety
    /// Nothing may read or write `dst..dst+bytes` on the host (no reference to
    /// it may be used) until the stream has run the copy.
    pub unsafe fn copy_to_host_async_unchecked(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { self.copy_into(dst, src, bytes, stream, HostSide::WrittenUnchecked) }
    }

    /// The device-to-host copy (`side` is `Written` or `WrittenUnchecked`).
    ///
    /// # Safety
    /// With `WrittenUnchecked`, the caller excludes host access to the range
    /// until the copy has run.
    unsafe fn copy_into(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
        side: HostSide,
    ) -> Result<()> {
        self.tracked_copy(dst, src, bytes, stream, side, || {
            // SAFETY: the range lies in a live block (checked under the lock
            // held around this call) that is not reused until this copy's
            // batch has completed; host access is excluded by the caller or,
            // for memory safe code can reach, the copy was refused. `stream`
            // is live while borrowed, on its own driver.
            unsafe {
                stream.device().driver().memcpy_dtoh_async(
                    dst.as_mut_ptr::<u8>(),
                    src,
                    bytes,
                    stream.raw(),
                )
            }
        })
    }

    /// The host bytes `ptr..ptr+len` of a live allocation of this pool.
    ///
    /// # Safety
    /// No copy into or out of the range may be pending (synchronize the
    /// stream first), and no other reference to the range may be alive while
    /// the returned one is; the allocation must outlive it (do not free it
    /// meanwhile).
    // The pool hands out memory it does not own a Rust borrow of: exclusivity
    // is the caller's obligation (the `# Safety` section), as for raw pointers.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn host_slice_mut(&self, ptr: DevicePtr, len: usize) -> Result<&mut [u8]> {
        if len == 0 {
            return Ok(&mut []);
        }
        let mut st = self.lock();
        Self::block_of(&mut st, ptr, len)?;
        // SAFETY: the range lies inside a live pinned block (real host memory
        // of at least `len` bytes); exclusivity and lifetime are the caller's.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.as_mut_ptr::<u8>(), len) })
    }

    /// A block that safe code will reach through references (a
    /// [`PlannedPool`](super::PlannedPool)'s layout): safe copies into it are
    /// refused, as for collections.
    pub(super) fn allocate_reachable(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
        self.allocate_block(bytes, alignment, true)
    }

    /// Waits for every pending copy, gives all memory back to the driver and
    /// refuses further allocations and frees ([`Error::ShutDown`]).
    ///
    /// While allocations are live (a collection in the pool, a planned pool's
    /// layout, a block from [`MemoryResource::allocate`]) it is refused with
    /// [`Error::InUse`], which lists them, and nothing changes: their owners
    /// would otherwise use freed memory. Free them first, or see
    /// [`PinnedPool::release_all_unchecked`]. If waiting for the copies fails,
    /// that error is returned and nothing is freed (a copy may still use the
    /// memory); the call can be repeated.
    pub fn release_all(&self) -> Result<PinnedRelease> {
        let mut st = self.lock();
        if !st.live.is_empty() {
            return Err(Self::in_use(&st));
        }
        self.release_locked(&mut st)
    }

    /// [`PinnedPool::release_all`] even while allocations are live: their
    /// memory is given back too; they are listed in
    /// [`PinnedRelease::outstanding`], and freeing one later is refused
    /// ([`Error::ShutDown`]).
    ///
    /// # Safety
    /// No outstanding allocation may be used after the call: no reference into
    /// one may be used, no copy may name one, and a collection that owns one
    /// must not be touched again, its drop included (leak it with
    /// [`std::mem::forget`]).
    pub unsafe fn release_all_unchecked(&self) -> Result<PinnedRelease> {
        self.release_locked(&mut self.lock())
    }

    #[cold]
    fn in_use(st: &State) -> Error {
        Error::InUse(Box::new(LiveAllocations {
            what: "PinnedPool",
            count: st.live.len(),
            bytes: st.live.values().map(|b| b.bytes).sum(),
            first: st
                .live
                .iter()
                .take(SHOWN_LIVE)
                .map(|(&a, b)| (a, b.bytes))
                .collect(),
        }))
    }

    /// Waits for the copies, then gives every region back, live blocks
    /// included (the callers decide whether that is allowed).
    fn release_locked(&self, st: &mut State) -> Result<PinnedRelease> {
        // A copy not known complete may still read or write the regions.
        Self::wait_locked(st)?;
        st.shut = true;
        let outstanding = std::mem::take(&mut st.live)
            .into_iter()
            .map(|(a, b)| (DevicePtr(a), b.bytes))
            .collect();
        st.pending.clear();
        st.tracks.clear();
        let mut released = 0;
        for (base, bytes) in std::mem::take(&mut st.regions) {
            let unpinned = crate::exit::give_back(
                || format!("PinnedPool region {base:#x}"),
                || self.upstream.deallocate_sync(DevicePtr(base), bytes, 256),
            );
            if unpinned {
                released += bytes;
            }
        }
        st.heap = LaneHeap::new();
        Ok(PinnedRelease {
            released_bytes: released,
            outstanding,
        })
    }
}

fn add_use(uses: &mut Vec<Use>, u: Use) {
    match uses.iter_mut().find(|(s, _)| *s == u.0) {
        Some(x) => x.1 = x.1.max(u.1),
        None => uses.push(u),
    }
}

/// The pool's reserve is its pinned regions. [`Pool::trim`] processes the
/// pending blocks (their copies' events polled, never waited for) and unpins
/// entirely free regions, largest first; [`Pool::release`] first waits for
/// every copy enqueued through the pool. Both return the first error after
/// giving back what could go. Unlike [`PinnedPool::release_all`], neither
/// touches live allocations nor shuts the pool.
impl Pool for PinnedPool {
    fn reserved_bytes(&self) -> usize {
        self.lock().heap.region_bytes() as usize
    }

    fn peak_reserved_bytes(&self) -> usize {
        self.lock().peak_reserved
    }

    fn reset_peak(&self) {
        let mut st = self.lock();
        st.peak_reserved = st.heap.region_bytes() as usize;
    }

    fn trim(&self, to: usize) -> Result<usize> {
        let mut st = self.lock();
        let processed = Self::process_locked(&mut st).map(|_| ());
        self.give_back(&mut st, processed, to)
    }

    fn release(&self) -> Result<usize> {
        let mut st = self.lock();
        let waited = Self::wait_locked(&mut st);
        self.give_back(&mut st, waited, 0)
    }
}

impl MemoryResource for PinnedPool {
    fn allocate(&self, bytes: usize, alignment: usize, _stream: &Stream) -> Result<DevicePtr> {
        self.allocate_block(bytes, alignment, false)
    }

    /// Frees once the copies that used the block and the work enqueued on
    /// `stream` so far have run (an idle stream adds nothing; the legacy
    /// default stream is waited for like any other).
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        if !ptr.is_null() {
            crate::error::check_alignment(alignment)?;
        }
        self.free_block(ptr, Some(bytes), Some(stream), false)
    }

    fn device(&self) -> &Device {
        self.upstream.device()
    }

    fn properties(&self) -> Properties {
        Properties::HOST_AND_DEVICE
    }

    fn allocate_sync(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
        // Host memory: usable at once, nothing to synchronize.
        self.allocate_block(bytes, alignment, false)
    }

    fn deallocate_sync(&self, ptr: DevicePtr, bytes: usize, _alignment: usize) -> Result<()> {
        self.free_block(ptr, Some(bytes), None, false)
    }
}

// SAFETY: blocks are real host memory, aligned to at least the layout's
// alignment (the heap aligns addresses; regions are 256-byte aligned), valid
// until deallocated, and never handed out twice while live (the heap and the
// pending gate guarantee it). The pool is Sync (all state under a mutex), so
// clones of `&PinnedPool` share it soundly.
unsafe impl Allocator for PinnedPool {
    fn allocate(&self, layout: Layout) -> std::result::Result<NonNull<[u8]>, AllocError> {
        if layout.size() == 0 {
            // A dangling, well-aligned pointer: what zero-sized requests get.
            let p = NonNull::new(layout.align() as *mut u8).ok_or(AllocError)?;
            return Ok(NonNull::slice_from_raw_parts(p, 0));
        }
        let p = self
            .allocate_block(layout.size(), layout.align(), true)
            .map_err(|_| AllocError)?;
        let p = NonNull::new(p.as_mut_ptr::<u8>()).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(p, layout.size()))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() == 0 {
            return;
        }
        let p = DevicePtr(ptr.as_ptr() as usize as u64);
        if let Err(e) = self.free_block(p, Some(layout.size()), None, true) {
            log::error!("PinnedPool Allocator free failed: {e}");
        }
    }
}

impl Drop for PinnedPool {
    /// Gives everything back. Live blocks cannot be reached from safe code
    /// any more (collections borrow or own the pool; plans and buffers hold
    /// it), so they go too, with a warning in the log. If the pending copies
    /// cannot be waited for, the memory is leaked rather than freed under
    /// them.
    fn drop(&mut self) {
        if crate::exit::process_is_exiting() {
            return;
        }
        let mut st = self.lock();
        match self.release_locked(&mut st) {
            Ok(r) if !r.outstanding.is_empty() => {
                let bytes: usize = r.outstanding.iter().map(|o| o.1).sum();
                log::warn!(
                    "PinnedPool dropped with {} allocations ({bytes} bytes) never freed",
                    r.outstanding.len()
                );
            }
            Ok(_) => {}
            Err(e) => log::error!(
                "PinnedPool could not wait for its copies ({e}); \
                 its {} pinned bytes are leaked rather than freed under them",
                st.heap.region_bytes()
            ),
        }
    }
}
