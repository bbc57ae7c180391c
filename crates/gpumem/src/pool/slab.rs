//! The engine under [`FixedSizeResource`](super::FixedSizeResource) and
//! [`CachingPool`](super::CachingPool): size classes of equal blocks carved
//! from upstream chunks, each class behind its own lock, free blocks kept per
//! stream (see `stream_order::free_lists`).
//!
//! Allocation of class `c` on stream T, cheapest first:
//! 1. under `c`'s lock, no driver call: T's own lane (back), the blocks free
//!    for every stream, another stream's oldest block already known complete;
//! 2. poll the streams holding `c`'s blocks (event and stream queries), retry 1;
//! 3. classes from [`SlabConfig::borrow_from`] on only: steps 1 and 2 in
//!    the next [`SlabConfig::borrow`] classes, smallest first (the block
//!    stays its class's: a free finds it with [`Slab::locate`]);
//! 4. make T wait for the stream holding most of `c`'s blocks (one event
//!    record and one wait) and take its lane;
//! 5. take a chunk from the upstream (a configured number of blocks), then a
//!    single block; a borrowing class first gives back the free blocks of
//!    the borrowing classes below it that are known complete (the streams
//!    polled, not waited for): they cannot serve this request, and keeping
//!    them would let a size that changes every iteration leave one cached
//!    block in each class it passes through;
//! 6. out of memory: synchronize the streams holding free blocks, give
//!    entirely free chunks back to the upstream, the largest first, just
//!    enough to make room for one block, retry 1 and a single block; then
//!    the same giving back every free chunk; then [`Error::OutOfMemory`]
//!    with requested, reserved, live and largest free block. During a
//!    capture the streams are not waited for, only polled. Giving back no
//!    more than needed keeps the rest of the cache: a loop whose sizes
//!    change every iteration, at its memory limit, would otherwise refill
//!    the whole cache from the upstream each time it meets a new size.
//!
//! Free blocks never move to the upstream except whole chunks whose blocks
//! are all free and complete (`release`, steps 5 and 6, drop). Live blocks
//! are kept in a map per class (pointer → requested bytes), so bad frees are
//! errors.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};

use super::ptr_map::PtrMap;
use super::stream_order::batched::BatchedStreams;
use super::stream_order::free_lists::FreeBlocks;
use super::stream_order::parked::capturing;
use super::stream_order::streams::may_wait;
use super::stream_order::sync::{lock, read_lock, write_lock};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{LiveBlock, MemoryResource, DEFAULT_ALIGNMENT};
use crate::stream::{Stream, StreamId};
use crate::{Error, FreeError, OomInfo, Result};

/// Shape of one size class.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClassSpec {
    /// Block size in bytes (a multiple of 256).
    pub block: usize,
    /// Blocks per chunk taken from the upstream.
    pub chunk_blocks: usize,
}

/// Policy knobs of the engine.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlabConfig {
    /// Frees are ordered on their stream (else: complete when called).
    pub stream_ordered: bool,
    /// Streams may be made to wait for each other to reuse blocks.
    pub cross_stream_wait: bool,
    /// Frees per stream after which a batch event is recorded.
    pub batch_size: u64,
    /// Most bytes to hold from the upstream (`usize::MAX`: no limit).
    pub max_reserved: usize,
    /// The first of the classes whose requests may borrow (`usize::MAX`:
    /// none): a request of such a class that finds no free block of its
    /// own may take one of the next `borrow` classes, and growing such a
    /// class first gives back the free, complete blocks of the borrowing
    /// classes below it (see [`Slab::allocate`]).
    pub borrow_from: usize,
    /// How many larger classes a borrowing class may take a block from.
    pub borrow: usize,
}

/// Numbers of one size class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Block size of the class in bytes.
    pub block_size: usize,
    /// Bytes of upstream chunks carved into this class.
    pub reserved: usize,
    /// Chunks taken from the upstream.
    pub chunks: usize,
    /// Blocks handed out and not yet freed.
    pub live_blocks: usize,
    /// Bytes callers asked for, over the live blocks.
    pub live: usize,
    /// Free blocks (in any stream's list or free for all).
    pub free_blocks: usize,
    /// Blocks freed on a stream while it captured a CUDA graph: kept for
    /// the graph, neither live nor free, until the pool goes.
    pub parked_blocks: usize,
}

struct ClassState {
    free: FreeBlocks,
    live: PtrMap<usize>,
    live_bytes: usize,
    chunks: BTreeMap<u64, usize>,
    reserved: usize,
    parked: usize,
}

#[repr(align(128))]
struct Class {
    spec: ClassSpec,
    state: Mutex<ClassState>,
}

/// Implements [`Pool`](super::Pool) for a resource over a [`Slab`] in its
/// field `slab`: the reserve is the slab's; a trim polls the batch events
/// and a release waits for the streams that freed blocks, then both give back
/// the chunks whose blocks are all free.
macro_rules! pool_over_slab {
    ($(#[$doc:meta])* $t:ty) => {
        $(#[$doc])*
        impl<U: MemoryResource> super::Pool for $t {
            fn reserved_bytes(&self) -> usize {
                self.slab.reserved()
            }

            fn peak_reserved_bytes(&self) -> usize {
                self.slab.peak_reserved()
            }

            fn reset_peak(&self) {
                self.slab.reset_peak()
            }

            fn trim(&self, to: usize) -> Result<usize> {
                self.slab.release(false, to)
            }

            fn release(&self) -> Result<usize> {
                self.slab.release(true, 0)
            }
        }
    };
}
pub(crate) use pool_over_slab;

/// The order in which [`Slab::release`] looks at the classes.
#[derive(Debug, Clone, Copy)]
enum Order {
    /// A trim: small chunks first.
    SmallestFirst,
    /// Making room under memory pressure: the fewest chunks.
    LargestFirst,
}

/// Size classes over one upstream.
pub(crate) struct Slab<U: MemoryResource> {
    upstream: U,
    device: Device,
    streams: BatchedStreams,
    classes: Box<[Class]>,
    reserved: AtomicUsize,
    /// Highest `reserved` after a successful upstream allocation.
    peak_reserved: AtomicUsize,
    cfg: SlabConfig,
    /// Every chunk: base → (length, class). Touched when growing and
    /// releasing, read to find the class of a pointer freed without its size.
    index: RwLock<BTreeMap<u64, (usize, usize)>>,
}

/// What becomes of a block freed into a [`Slab`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Freed<'a> {
    /// Reusable once the work enqueued on the stream so far has run.
    On(&'a Stream),
    /// Reusable at once: no stream uses it any more.
    Done,
    /// Parked for the graph capturing the freeing stream (see
    /// `stream_order::parked`): neither live nor free from then on, so a
    /// second free is a double free and no allocation gets it; its chunk
    /// stays until the slab goes.
    Parked,
}

impl<'a> Freed<'a> {
    /// A free on `stream`: parked when the stream captures a graph.
    #[inline]
    pub(crate) fn on(stream: &'a Stream) -> Self {
        if capturing(stream) {
            Freed::Parked
        } else {
            Freed::On(stream)
        }
    }
}

impl<U: MemoryResource> Slab<U> {
    pub(crate) fn new(upstream: U, specs: &[ClassSpec], cfg: SlabConfig) -> Self {
        let device = upstream.device().clone();
        let classes = specs
            .iter()
            .map(|&spec| Class {
                spec,
                state: Mutex::new(ClassState {
                    free: FreeBlocks::default(),
                    live: PtrMap::default(),
                    live_bytes: 0,
                    chunks: BTreeMap::new(),
                    reserved: 0,
                    parked: 0,
                }),
            })
            .collect();
        Self {
            upstream,
            streams: BatchedStreams::default(),
            device,
            classes,
            reserved: AtomicUsize::new(0),
            peak_reserved: AtomicUsize::new(0),
            cfg,
            index: RwLock::new(BTreeMap::new()),
        }
    }

    pub(crate) fn upstream(&self) -> &U {
        &self.upstream
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn block_size(&self, class: usize) -> usize {
        self.classes[class].spec.block
    }

    /// Allocates a block of `class` for a request of `bytes` on `stream`.
    #[inline]
    pub(crate) fn allocate(
        &self,
        class: usize,
        bytes: usize,
        stream: &Stream,
    ) -> Result<DevicePtr> {
        let c = &self.classes[class];
        {
            let mut st = lock(&c.state);
            let got = if self.cfg.stream_ordered {
                st.free.take(stream.id())
            } else {
                st.free.take_settled()
            };
            if let Some(p) = got {
                st.note_alloc(p, bytes);
                return Ok(DevicePtr(p));
            }
        }
        self.allocate_slow(class, bytes, stream)
    }

    /// Takes a block free for every stream right now, or `None`.
    pub(crate) fn take_settled(&self, class: usize, bytes: usize) -> Option<DevicePtr> {
        let mut st = lock(&self.classes[class].state);
        let p = st.free.take_settled()?;
        st.note_alloc(p, bytes);
        Some(DevicePtr(p))
    }

    #[cold]
    fn allocate_slow(&self, class: usize, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let c = &self.classes[class];
        let id = stream.id();
        if let Some(p) = self.take_polled(class, bytes, id) {
            return Ok(p);
        }
        let borrowing = class >= self.cfg.borrow_from;
        if borrowing {
            let last = (class + self.cfg.borrow).min(self.classes.len() - 1);
            for b in class + 1..=last {
                let got = self
                    .take_here(b, bytes, id)
                    .or_else(|| self.take_polled(b, bytes, id));
                if let Some(p) = got {
                    return Ok(p);
                }
            }
        }
        if self.cfg.stream_ordered && self.cfg.cross_stream_wait {
            let mut st = lock(&c.state);
            if let Ok(Some(p)) = st.free.steal_by_wait(stream, &self.streams) {
                st.note_alloc(p, bytes);
                return Ok(DevicePtr(p));
            }
        }
        if borrowing && class > self.cfg.borrow_from {
            // Best effort: a block the upstream refuses stays cached.
            let _ = self.release_classes(false, 0, self.cfg.borrow_from..class);
        }
        let chunk_blocks = c.spec.chunk_blocks;
        match self.grow_and_take(class, bytes, stream, chunk_blocks) {
            Err(e) if e.is_oom() => {}
            other => return other,
        }
        if chunk_blocks > 1 {
            match self.grow_and_take(class, bytes, stream, 1) {
                Err(e) if e.is_oom() => {}
                other => return other,
            }
        }
        // Out of memory: wait for the streams and give back whole free
        // chunks, the largest first, just enough for one block; if that is
        // not enough, all of them. Emptying the whole cache at once would
        // send a loop whose sizes change back to the upstream for every
        // block it frees. During a capture nothing is waited for (see
        // `stream_order::streams::may_wait`).
        let enough = self.reserved().saturating_sub(c.spec.block);
        let wait = may_wait();
        for (round, to) in [enough, 0].into_iter().enumerate() {
            let given = self.release_from(wait, to, Order::LargestFirst);
            if round > 0 && given.unwrap_or(0) == 0 {
                break; // nothing more to give back: the retry would fail again
            }
            if let Some(p) = self.take_here(class, bytes, id) {
                return Ok(p);
            }
            match self.grow_and_take(class, bytes, stream, 1) {
                Err(e) if e.is_oom() => {}
                other => return other,
            }
        }
        Err(Error::oom_with(self.oom_info(bytes)))
    }

    /// A free block of `class` for stream `id` without a driver call (the
    /// fast path's look), handed out for a request of `bytes`.
    fn take_here(&self, class: usize, bytes: usize, id: StreamId) -> Option<DevicePtr> {
        let mut st = lock(&self.classes[class].state);
        let p = if self.cfg.stream_ordered {
            st.free.take(id)
        } else {
            st.free.take_settled()
        }?;
        st.note_alloc(p, bytes);
        Some(DevicePtr(p))
    }

    /// Polls the streams whose free blocks of `class` are not known
    /// complete yet, then looks again ([`Slab::take_here`]); `None` at once
    /// when there are none (or frees are not stream-ordered).
    fn take_polled(&self, class: usize, bytes: usize, id: StreamId) -> Option<DevicePtr> {
        if !self.cfg.stream_ordered {
            return None;
        }
        let owners = lock(&self.classes[class].state).free.blocked_owners(id);
        if owners.is_empty() {
            return None;
        }
        for o in &owners {
            // A failed query only means we cannot reuse those blocks yet.
            let _ = o.poll(&self.streams.events, true);
        }
        drop(owners);
        self.take_here(class, bytes, id)
    }

    /// Reserves `len` bytes of the upstream budget.
    pub(crate) fn reserve_budget(&self, len: usize) -> bool {
        let max = self.cfg.max_reserved;
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                r.checked_add(len).filter(|&t| t <= max)
            })
            .is_ok()
    }

    pub(crate) fn unreserve_budget(&self, len: usize) {
        self.reserved.fetch_sub(len, Ordering::AcqRel);
    }

    /// Raises the peak to the bytes reserved now, after the upstream served
    /// a reservation (so a refused one never counts).
    pub(crate) fn note_reserved(&self) {
        self.peak_reserved
            .fetch_max(self.reserved(), Ordering::AcqRel);
    }

    /// Highest [`Slab::reserved`] since creation or [`Slab::reset_peak`].
    pub(crate) fn peak_reserved(&self) -> usize {
        self.peak_reserved.load(Ordering::Acquire)
    }

    /// Restarts the peak from the bytes reserved now.
    pub(crate) fn reset_peak(&self) {
        self.peak_reserved.store(self.reserved(), Ordering::Release);
    }

    /// Takes a chunk of `blocks` blocks from the upstream, hands out its first
    /// block and frees the others onto `stream`'s lane.
    fn grow_and_take(
        &self,
        class: usize,
        bytes: usize,
        stream: &Stream,
        blocks: usize,
    ) -> Result<DevicePtr> {
        let c = &self.classes[class];
        let block = c.spec.block;
        let len = block * blocks;
        if !self.reserve_budget(len) {
            return Err(Error::oom(bytes));
        }
        let base = match self.upstream.allocate(len, DEFAULT_ALIGNMENT, stream) {
            Ok(p) => p.0,
            Err(e) => {
                self.unreserve_budget(len);
                return Err(e);
            }
        };
        self.note_reserved();
        write_lock(&self.index).insert(base, (len, class));
        let mut st = lock(&c.state);
        st.chunks.insert(base, len);
        st.reserved += len;
        if blocks > 1 {
            let rest = (1..blocks as u64).map(|i| base + i * block as u64);
            if self.cfg.stream_ordered {
                st.free.push_fresh(stream, rest, blocks - 1, &self.streams);
            } else {
                for p in rest {
                    st.free.push_ready(p);
                }
            }
        }
        st.note_alloc(base, bytes);
        Ok(DevicePtr(base))
    }

    /// Frees a block of `class`, to become what `freed` says. `bytes` (when
    /// known) must be the requested size.
    #[inline]
    pub(crate) fn deallocate(
        &self,
        class: usize,
        ptr: DevicePtr,
        bytes: Option<usize>,
        freed: Freed<'_>,
    ) -> Result<()> {
        let c = &self.classes[class];
        let seal = {
            let mut st = lock(&c.state);
            let Some(req) = st.live.remove(&ptr.0) else {
                drop(st);
                return Err(self.bad_free(class, ptr, bytes));
            };
            if let Some(b) = bytes {
                if b != req {
                    st.live.insert(ptr.0, req);
                    return Err(Error::InvalidFree {
                        ptr: ptr.0,
                        reason: FreeError::SizeMismatch {
                            allocated: req,
                            freed: b,
                        },
                    });
                }
            }
            st.live_bytes -= req;
            match freed {
                Freed::On(s) if self.cfg.stream_ordered => {
                    st.free.push(s, ptr.0, &self.streams, self.cfg.batch_size)
                }
                Freed::Parked => {
                    st.parked += 1;
                    None
                }
                _ => {
                    st.free.push_ready(ptr.0);
                    None
                }
            }
        };
        if let Some(owner) = seal {
            // Best effort: a failed record only delays cross-stream reuse.
            let _ = owner.seal(&self.streams.events, false);
        }
        Ok(())
    }

    /// The class whose chunk holds `ptr` at a block boundary.
    pub(crate) fn locate(&self, ptr: DevicePtr) -> Option<usize> {
        let index = read_lock(&self.index);
        let (&base, &(len, class)) = index.range(..=ptr.0).next_back()?;
        let off = ptr.0 - base;
        (off < len as u64 && off.is_multiple_of(self.classes[class].spec.block as u64))
            .then_some(class)
    }

    /// What `ptr` is to this slab: `None` when it starts no block of it,
    /// `Some(None)` for a free block, `Some(Some(bytes))` for a live block
    /// allocated with `bytes`. For diagnosing frees routed elsewhere.
    #[cold]
    pub(crate) fn lookup(&self, ptr: DevicePtr) -> Option<Option<usize>> {
        let class = self.locate(ptr)?;
        Some(lock(&self.classes[class].state).live.get(&ptr.0).copied())
    }

    #[cold]
    fn bad_free(&self, class: usize, ptr: DevicePtr, bytes: Option<usize>) -> Error {
        let reason = match self.locate(ptr) {
            Some(c) if c == class => FreeError::DoubleFree,
            Some(c) => match lock(&self.classes[c].state).live.get(&ptr.0) {
                Some(&allocated) => FreeError::SizeMismatch {
                    allocated,
                    freed: bytes.unwrap_or(0),
                },
                None => FreeError::DoubleFree,
            },
            None => FreeError::Unknown,
        };
        Error::InvalidFree { ptr: ptr.0, reason }
    }

    /// Seals and polls every stream's batch, then moves completed blocks to
    /// the lists free for every stream. Non-blocking.
    pub(crate) fn process_deferred(&self) -> Result<()> {
        let res = if self.cfg.stream_ordered {
            self.streams.poll_all(true)
        } else {
            Ok(())
        };
        for c in self.classes.iter() {
            lock(&c.state).free.settle();
        }
        self.streams.prune();
        res
    }

    /// Gives chunks whose blocks are all free and complete back to the
    /// upstream, smallest classes first, until the slab holds at most `to`
    /// bytes (0: every such chunk); with `blocking`, first waits for the
    /// streams that freed blocks. Returns the bytes given back.
    pub(crate) fn release(&self, blocking: bool, to: usize) -> Result<usize> {
        self.release_from(blocking, to, Order::SmallestFirst)
    }

    /// [`Slab::release`], taking the classes in `order`.
    fn release_from(&self, blocking: bool, to: usize, order: Order) -> Result<usize> {
        let n = self.classes.len();
        self.release_classes(
            blocking,
            to,
            (0..n).map(|i| match order {
                Order::SmallestFirst => i,
                Order::LargestFirst => n - 1 - i,
            }),
        )
    }

    /// [`Slab::release`] over `classes`, in that order.
    fn release_classes(
        &self,
        blocking: bool,
        to: usize,
        classes: impl Iterator<Item = usize>,
    ) -> Result<usize> {
        let mut first_err = None;
        if self.cfg.stream_ordered {
            let r = if blocking {
                // A stream that cannot be waited for may still be found
                // done by a query, and its blocks then go back.
                self.streams
                    .synchronize_all()
                    .inspect_err(|_| drop(self.streams.poll_all(false)))
            } else {
                self.streams.poll_all(true)
            };
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        let mut excess = self.reserved().saturating_sub(to);
        let mut to_free: Vec<(u64, usize, usize)> = Vec::new();
        for ci in classes {
            let c = &self.classes[ci];
            if excess == 0 {
                break;
            }
            let block = c.spec.block as u64;
            let mut st = lock(&c.state);
            st.free.settle();
            if st.free.ready.is_empty() {
                continue;
            }
            let mut ready = std::mem::take(&mut st.free.ready);
            ready.sort_unstable();
            let mut keep = Vec::with_capacity(ready.len());
            let mut freed = Vec::new();
            let mut i = 0;
            for (&base, &len) in &st.chunks {
                let end = base + len as u64;
                while i < ready.len() && ready[i] < base {
                    keep.push(ready[i]);
                    i += 1;
                }
                let start = i;
                while i < ready.len() && ready[i] < end {
                    i += 1;
                }
                if excess > 0 && (i - start) as u64 * block == len as u64 {
                    excess = excess.saturating_sub(len);
                    freed.push((base, len));
                } else {
                    keep.extend_from_slice(&ready[start..i]);
                }
            }
            keep.extend_from_slice(&ready[i..]);
            st.free.count -= ready.len() - keep.len();
            st.free.ready = keep;
            for &(base, len) in &freed {
                st.chunks.remove(&base);
                st.reserved -= len;
            }
            to_free.extend(freed.into_iter().map(|(base, len)| (base, len, ci)));
        }
        if !to_free.is_empty() {
            let mut index = write_lock(&self.index);
            for (base, _, _) in &to_free {
                index.remove(base);
            }
        }
        let mut bytes = 0;
        for (base, len, class) in to_free {
            match self
                .upstream
                .deallocate_sync(DevicePtr(base), len, DEFAULT_ALIGNMENT)
            {
                Ok(()) => {
                    self.unreserve_budget(len);
                    bytes += len;
                }
                Err(e) => {
                    // Still ours: its blocks go back to the free list.
                    self.restore_chunk(class, base, len);
                    first_err.get_or_insert(e);
                }
            }
        }
        self.streams.prune();
        first_err.map_or(Ok(bytes), Err)
    }

    /// Puts back a chunk of entirely free blocks that [`Slab::release`] took
    /// off the books and the upstream refused to take back.
    #[cold]
    fn restore_chunk(&self, class: usize, base: u64, len: usize) {
        write_lock(&self.index).insert(base, (len, class));
        let c = &self.classes[class];
        let block = c.spec.block as u64;
        let mut st = lock(&c.state);
        st.chunks.insert(base, len);
        st.reserved += len;
        for p in (base..base + len as u64).step_by(block as usize) {
            st.free.push_ready(p);
        }
    }

    /// Bytes held from the upstream by the classes (and whatever else
    /// reserved budget through [`Slab::reserve_budget`]).
    pub(crate) fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }

    pub(crate) fn class_stats(&self, class: usize) -> ClassStats {
        let c = &self.classes[class];
        let st = lock(&c.state);
        ClassStats {
            block_size: c.spec.block,
            reserved: st.reserved,
            chunks: st.chunks.len(),
            live_blocks: st.live.len(),
            live: st.live_bytes,
            free_blocks: st.free.count,
            parked_blocks: st.parked,
        }
    }

    pub(crate) fn class_count(&self) -> usize {
        self.classes.len()
    }

    /// Sum over classes of (live requested bytes, live block bytes, free block bytes).
    pub(crate) fn totals(&self) -> (usize, usize, usize) {
        let mut t = (0, 0, 0);
        for c in self.classes.iter() {
            let st = lock(&c.state);
            t.0 += st.live_bytes;
            t.1 += st.live.len() * c.spec.block;
            t.2 += st.free.count * c.spec.block;
        }
        t
    }

    /// Every block handed out, with its class's block size and the bytes
    /// asked for (unsorted).
    pub(crate) fn live_blocks(&self) -> Vec<LiveBlock> {
        let mut out = Vec::new();
        for c in self.classes.iter() {
            let st = lock(&c.state);
            out.extend(st.live.iter().map(|(&p, &req)| LiveBlock {
                address: DevicePtr(p),
                size: c.spec.block,
                requested: Some(req),
            }));
        }
        out
    }

    /// The block size of the live block starting at `ptr`, if there is one.
    pub(crate) fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        let class = self.locate(ptr)?;
        let c = &self.classes[class];
        lock(&c.state)
            .live
            .contains_key(&ptr.0)
            .then_some(c.spec.block)
    }

    /// Largest block size with a free block.
    pub(crate) fn largest_free(&self) -> usize {
        self.classes
            .iter()
            .rev()
            .find(|c| !lock(&c.state).free.is_empty())
            .map_or(0, |c| c.spec.block)
    }

    pub(crate) fn oom_info(&self, requested: usize) -> OomInfo {
        let (live, _, _) = self.totals();
        OomInfo {
            requested,
            device: Some(self.device.ordinal()),
            reserved: Some(self.reserved()),
            live: Some(live),
            largest_free: Some(self.largest_free()),
            limit: (self.cfg.max_reserved != usize::MAX).then_some(self.cfg.max_reserved),
        }
    }
}

impl ClassState {
    #[inline]
    fn note_alloc(&mut self, p: u64, bytes: usize) {
        self.live.insert(p, bytes);
        self.live_bytes += bytes;
    }
}

impl<U: MemoryResource> Drop for Slab<U> {
    fn drop(&mut self) {
        if crate::exit::process_is_exiting() {
            return; // the driver may be gone: leak (see `crate::exit`)
        }
        if self.cfg.stream_ordered {
            // Blocks freed on streams may still be in use by their work.
            let _ = self.streams.synchronize_all();
        }
        for c in self.classes.iter() {
            let mut st = lock(&c.state);
            let chunks = std::mem::take(&mut st.chunks);
            st.free = FreeBlocks::default();
            for (base, len) in chunks {
                crate::exit::give_back(
                    || format!("chunk {base:#x}"),
                    || {
                        self.upstream
                            .deallocate_sync(DevicePtr(base), len, DEFAULT_ALIGNMENT)
                    },
                );
                self.reserved.fetch_sub(len, Ordering::AcqRel);
            }
        }
    }
}
