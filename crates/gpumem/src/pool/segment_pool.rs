//! [`SegmentPool`]: whole segments, one stream each, carved into blocks whose
//! layout can be saved and put back.
//!
//! The pool behind CUDA graphs' private memory in PyTorch's terms. A graph
//! replays its kernels at the addresses it was captured with, and PyTorch's
//! CUDA graph trees (`torch.compile(mode="reduce-overhead")`) go further:
//! after recording a graph they save the pool's state, and before recording
//! another branch from that point they put the state back, blocks freed
//! since then live again at the same addresses and blocks made since then
//! gone. A pool that can do that must know every block of every segment and
//! be able to carve a block at a given address; this one keeps them in
//! address order, per segment, which is cheap at the rate graphs allocate
//! (during captures and their warm-up runs only).
//!
//! The rules, as PyTorch's caching allocator lays memory out (so that its
//! tests and tools, which read segment and block sizes, see what they
//! expect):
//! - a request is rounded up to [`SegmentPoolConfig::round`] bytes (512);
//! - small requests (up to `small_limit`, 1 MiB) come from small segments of
//!   `small_segment` bytes (2 MiB), larger ones from large segments: of
//!   `large_segment` bytes (20 MiB) for requests under `large_segment_limit`
//!   (10 MiB), else of the request rounded up to `large_round` (2 MiB);
//! - a segment belongs to the stream it was made for, and its blocks serve
//!   allocations on that stream only; a block freed on another stream goes
//!   back to its segment once the segment's stream was made to wait for the
//!   freeing stream (one event), or, when that cannot be (a capture under
//!   way on either), stays out of use until the pool drops;
//! - a free block is taken best fit (smallest, then lowest address) and
//!   split when what remains is at least `round` bytes (small) or more than
//!   `small_limit` (large); a freed block merges with its free neighbours.
//!   A pool set not to split ([`SegmentPool::set_no_split`], PyTorch's
//!   `MemPool(no_split=True)`) hands every free block out whole: each
//!   segment then holds one block;
//! - [`SegmentPool::allocate_cached`] serves a request from the free blocks
//!   alone and never grows (PyTorch's use of a MemPool's free memory when
//!   the device runs out);
//! - segments go back to the upstream only when asked
//!   ([`SegmentPool::release_free_segments`]) or when the pool drops.
//!
//! [`SegmentPool::checkpoint`] saves the layout (every segment, every block,
//! live or not); [`SegmentPool::restore`] frees the live blocks the
//! checkpoint does not have and makes its live blocks live again at their
//! addresses, and says which pointers it freed and which blocks it made.
//!
//! Frees are checked: a pointer the pool never handed out, an interior
//! pointer, a second free and a size that is not the block's are refused and
//! change nothing. The pool keeps PyTorch's statistics per size class
//! ([`SegmentPool::stats`]), blocks made or freed by a restore included.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::adaptor::Stat;
use crate::device::Device;
use crate::driver::{DevicePtr, RawStream};
use crate::error::FreeError;
use crate::pool::stream_order::events::EventPool;
use crate::pool::stream_order::handoff;
use crate::pool::stream_order::streams::{self, HeldStream, Progress};
use crate::pool::Pool;
use crate::resource::{
    validate_request, LiveBlock, MemoryResource, Properties, Segment, DEFAULT_ALIGNMENT,
};
use crate::stream::{Stream, StreamId};
use crate::{Error, Result};

/// How a [`SegmentPool`] sizes blocks and segments; the defaults are
/// PyTorch's caching allocator's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentPoolConfig {
    /// Every block is a multiple of this many bytes (a power of two, at least
    /// 256). Default 512.
    pub round: usize,
    /// Requests up to this many bytes are small. Default 1 MiB.
    pub small_limit: usize,
    /// Bytes of a small segment. Default 2 MiB.
    pub small_segment: usize,
    /// Bytes of a large segment made for a request under
    /// `large_segment_limit`. Default 20 MiB.
    pub large_segment: usize,
    /// Requests of at least this many bytes get a segment of their own
    /// size, rounded up to `large_round`. Default 10 MiB.
    pub large_segment_limit: usize,
    /// Rounding of such segments. Default 2 MiB.
    pub large_round: usize,
}

impl Default for SegmentPoolConfig {
    fn default() -> Self {
        Self {
            round: 512,
            small_limit: crate::adaptor::SMALL_BLOCK_MAX,
            small_segment: 2 << 20,
            large_segment: 20 << 20,
            large_segment_limit: 10 << 20,
            large_round: 2 << 20,
        }
    }
}

impl SegmentPoolConfig {
    fn check(&self) -> Result<()> {
        let pow2 = |n: usize| n.is_power_of_two();
        if !pow2(self.round)
            || self.round < DEFAULT_ALIGNMENT
            || !pow2(self.large_round)
            || !self.large_round.is_multiple_of(self.round)
            || self.small_segment < self.small_limit
            || !self.small_segment.is_multiple_of(self.round)
            || self.large_segment < self.large_segment_limit
            || !self.large_segment.is_multiple_of(self.round)
        {
            return Err(Error::InvalidArgument(format!(
                "segment pool: inconsistent configuration {self:?}"
            )));
        }
        Ok(())
    }
}

/// The two size classes, as PyTorch's statistics name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SizeClass {
    /// Requests up to [`SegmentPoolConfig::small_limit`] (PyTorch's
    /// `small_pool`).
    Small,
    /// Larger requests (`large_pool`).
    Large,
}

/// The counters of one size class, with PyTorch's meanings: `allocation`
/// and `allocated_bytes` count live blocks (bytes as the pool rounds them),
/// `requested_bytes` what was asked for, `segment` and `reserved_bytes` the
/// segments held from the upstream.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassCounters {
    /// Live blocks.
    pub allocation: Stat,
    /// Bytes of the live blocks.
    pub allocated_bytes: Stat,
    /// Bytes asked for by the live blocks.
    pub requested_bytes: Stat,
    /// Segments held.
    pub segment: Stat,
    /// Bytes of the segments held.
    pub reserved_bytes: Stat,
}

/// [`SegmentPool::stats`]: the counters of each size class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentPoolStats {
    /// Small requests and small segments.
    pub small: ClassCounters,
    /// Large requests and large segments.
    pub large: ClassCounters,
}

impl SegmentPoolStats {
    /// The counters of `class`.
    pub fn class(&self, class: SizeClass) -> &ClassCounters {
        match class {
            SizeClass::Small => &self.small,
            SizeClass::Large => &self.large,
        }
    }
}

/// One block of a segment, as [`SegmentPool::segments`] and checkpoints
/// describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockInfo {
    /// First byte.
    pub address: DevicePtr,
    /// Bytes (a multiple of [`SegmentPoolConfig::round`]).
    pub size: usize,
    /// Bytes asked for (0 for a free block).
    pub requested: usize,
    /// Handed out and not freed.
    pub live: bool,
}

/// One segment and its blocks, which tile it in address order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    /// First byte.
    pub address: DevicePtr,
    /// Bytes.
    pub size: usize,
    /// The stream whose allocations it serves.
    pub stream: StreamId,
    /// That stream's raw handle.
    pub raw_stream: RawStream,
    /// Its size class.
    pub class: SizeClass,
    /// Its blocks, in address order, together exactly the segment.
    pub blocks: Vec<BlockInfo>,
}

/// The saved layout of a [`SegmentPool`] ([`SegmentPool::checkpoint`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The pool it was taken from ([`SegmentPool`]'s number): restoring it
    /// into another pool is refused.
    owner: u64,
    segments: Vec<SegmentInfo>,
}

impl Checkpoint {
    /// The segments saved, with their blocks.
    pub fn segments(&self) -> &[SegmentInfo] {
        &self.segments
    }

    /// The live blocks saved.
    pub fn live_blocks(&self) -> impl Iterator<Item = &BlockInfo> {
        self.segments
            .iter()
            .flat_map(|s| s.blocks.iter().filter(|b| b.live))
    }
}

/// What [`SegmentPool::restore`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    /// Blocks that were live and are not in the checkpoint: freed.
    pub freed: Vec<DevicePtr>,
    /// Blocks of the checkpoint that were not live: live again, with the
    /// stream of their segment (its raw handle).
    pub made: Vec<(LiveBlock, RawStream)>,
}

#[derive(Debug, Clone, Copy)]
struct Block {
    size: u64,
    requested: u64,
    live: bool,
}

#[derive(Debug)]
struct Seg {
    size: u64,
    class: SizeClass,
    stream: Stream,
    /// Its blocks by address; together they tile the segment.
    blocks: BTreeMap<u64, Block>,
}

impl Seg {
    fn info(&self, address: u64) -> SegmentInfo {
        SegmentInfo {
            address: DevicePtr(address),
            size: self.size as usize,
            stream: self.stream.id(),
            raw_stream: self.stream.raw(),
            class: self.class,
            blocks: self
                .blocks
                .iter()
                .map(|(&a, b)| BlockInfo {
                    address: DevicePtr(a),
                    size: b.size as usize,
                    requested: b.requested as usize,
                    live: b.live,
                })
                .collect(),
        }
    }

    fn is_free(&self) -> bool {
        self.blocks.values().all(|b| !b.live)
    }
}

/// A free block in the best-fit index: stream, class, then size and address.
type FreeKey = (StreamId, SizeClass, u64, u64);

#[derive(Debug, Default)]
struct State {
    segs: BTreeMap<u64, Seg>,
    free: BTreeSet<FreeKey>,
    stats: SegmentPoolStats,
    /// Highest bytes of segments held, both classes together.
    peak_reserved: u64,
    /// Blocks freed on a stream their segment's stream could not wait for:
    /// live for good.
    parked: BTreeSet<u64>,
}

fn add(s: &mut Stat, n: u64) {
    s.current = s.current.saturating_add_unsigned(n);
    s.peak = s.peak.max(s.current);
    s.total = s.total.saturating_add(n);
}

fn sub(s: &mut Stat, n: u64) {
    s.current = s.current.saturating_sub_unsigned(n);
    s.freed = s.freed.saturating_add(n);
}

impl State {
    fn counters(&mut self, class: SizeClass) -> &mut ClassCounters {
        match class {
            SizeClass::Small => &mut self.stats.small,
            SizeClass::Large => &mut self.stats.large,
        }
    }

    fn count_live(&mut self, class: SizeClass, b: &Block, live: bool) {
        let c = self.counters(class);
        if live {
            add(&mut c.allocation, 1);
            add(&mut c.allocated_bytes, b.size);
            add(&mut c.requested_bytes, b.requested);
        } else {
            sub(&mut c.allocation, 1);
            sub(&mut c.allocated_bytes, b.size);
            sub(&mut c.requested_bytes, b.requested);
        }
    }

    /// The segment holding `addr`, by its first byte.
    fn seg_of(&self, addr: u64) -> Option<u64> {
        let (&start, seg) = self.segs.range(..=addr).next_back()?;
        (addr < start + seg.size).then_some(start)
    }

    fn free_key(seg: &Seg, addr: u64, size: u64) -> FreeKey {
        (seg.stream.id(), seg.class, size, addr)
    }

    /// Marks the free block at `addr` of segment `start` live, `size` bytes
    /// of it (splitting off the rest at its end when `split`).
    fn take(&mut self, start: u64, addr: u64, size: u64, requested: u64, split: bool) {
        let seg = self.segs.get_mut(&start).expect("segment of a free block");
        let whole = seg.blocks[&addr].size;
        self.free.remove(&Self::free_key(seg, addr, whole));
        let size = if split && whole > size {
            let rest = whole - size;
            seg.blocks.insert(
                addr + size,
                Block {
                    size: rest,
                    requested: 0,
                    live: false,
                },
            );
            self.free.insert(Self::free_key(seg, addr + size, rest));
            size
        } else {
            whole
        };
        let block = Block {
            size,
            requested,
            live: true,
        };
        seg.blocks.insert(addr, block);
        let class = seg.class;
        self.count_live(class, &block, true);
    }

    /// Frees the live block at `addr` of segment `start` and merges it with
    /// its free neighbours.
    fn release(&mut self, start: u64, addr: u64) {
        let seg = self.segs.get_mut(&start).expect("segment of a live block");
        let block = seg.blocks[&addr];
        let class = seg.class;
        let (mut first, mut size) = (addr, block.size);
        if let Some((&prev, p)) = seg.blocks.range(..addr).next_back() {
            if !p.live {
                self.free.remove(&Self::free_key(seg, prev, p.size));
                first = prev;
                size += p.size;
            }
        }
        if let Some(n) = seg.blocks.get(&(addr + block.size)).copied() {
            if !n.live {
                self.free
                    .remove(&Self::free_key(seg, addr + block.size, n.size));
                seg.blocks.remove(&(addr + block.size));
                size += n.size;
            }
        }
        if first != addr {
            seg.blocks.remove(&addr);
        }
        seg.blocks.insert(
            first,
            Block {
                size,
                requested: 0,
                live: false,
            },
        );
        self.free.insert(Self::free_key(seg, first, size));
        self.count_live(class, &block, false);
    }

    /// Carves the block `b` at `addr` out of the free block that holds it
    /// in segment `start`; `false` (nothing changed) when no free block
    /// holds it whole.
    fn carve(&mut self, start: u64, addr: u64, b: &BlockInfo) -> bool {
        let seg = self.segs.get_mut(&start).expect("segment exists");
        let Some((&at, &hole)) = seg.blocks.range(..=addr).next_back() else {
            return false;
        };
        let (size, end) = (b.size as u64, addr + b.size as u64);
        if hole.live || end > at + hole.size {
            return false;
        }
        self.free.remove(&Self::free_key(seg, at, hole.size));
        if at < addr {
            let before = addr - at;
            seg.blocks.insert(
                at,
                Block {
                    size: before,
                    requested: 0,
                    live: false,
                },
            );
            self.free.insert(Self::free_key(seg, at, before));
        }
        if end < at + hole.size {
            let after = at + hole.size - end;
            seg.blocks.insert(
                end,
                Block {
                    size: after,
                    requested: 0,
                    live: false,
                },
            );
            self.free.insert(Self::free_key(seg, end, after));
        }
        let block = Block {
            size,
            requested: b.requested as u64,
            live: true,
        };
        seg.blocks.insert(addr, block);
        let class = seg.class;
        self.count_live(class, &block, true);
        true
    }
}

/// Whole segments from an upstream resource, one stream each, carved into
/// blocks with PyTorch's caching allocator's rules, whose layout can be saved
/// and restored; see the module documentation.
///
/// ```
/// use gpumem::driver::sim::SimConfig;
/// use gpumem::pool::SegmentPool;
/// use gpumem::resource::{DeviceResource, MemoryResource};
/// use gpumem::Device;
///
/// fn main() -> gpumem::Result<()> {
///     let device = Device::sim(SimConfig::default());
///     let stream = device.create_stream()?;
///     let pool = SegmentPool::new(DeviceResource::new(device.clone()))?;
///     let a = pool.allocate(1000, 256, &stream)?;
///     let saved = pool.checkpoint();
///     pool.deallocate(a, 1000, 256, &stream)?;
///     let b = pool.allocate(4000, 256, &stream)?; // takes a's place
///     let restored = pool.restore(&saved)?;
///     assert_eq!(restored.freed, vec![b]);
///     assert_eq!(restored.made[0].0.address, a); // live again, same address
///     Ok(())
/// }
/// ```
pub struct SegmentPool<U: MemoryResource> {
    upstream: U,
    config: SegmentPoolConfig,
    /// A number of its own, which its checkpoints carry.
    id: u64,
    state: Mutex<State>,
    /// Events for frees on another stream than the block's.
    events: EventPool,
    /// Free blocks are handed out whole ([`SegmentPool::set_no_split`]).
    no_split: AtomicBool,
}

impl<U: MemoryResource> std::fmt::Debug for SegmentPool<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("SegmentPool")
            .field("id", &self.id)
            .field("config", &self.config)
            .field("segments", &st.segs.len())
            .field("stats", &st.stats)
            .finish()
    }
}

/// The numbers given to pools so far.
static POOLS: AtomicU64 = AtomicU64::new(0);

impl<U: MemoryResource> SegmentPool<U> {
    /// A pool over `upstream` with PyTorch's sizes.
    pub fn new(upstream: U) -> Result<Self> {
        Self::with_config(upstream, SegmentPoolConfig::default())
    }

    /// A pool over `upstream` with `config`'s sizes.
    pub fn with_config(upstream: U, config: SegmentPoolConfig) -> Result<Self> {
        config.check()?;
        Ok(Self {
            upstream,
            config,
            id: POOLS.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State::default()),
            events: EventPool::new(4),
            no_split: AtomicBool::new(false),
        })
    }

    /// Stops splitting free blocks (`true`) or starts again (`false`, the
    /// default): a pool that does not split hands every free block out
    /// whole, so a new segment holds the one block it was made for, and a
    /// free segment serves one request of its class whatever its size
    /// (PyTorch's `MemPool(no_split=True)`). Blocks already split stay as
    /// they are.
    pub fn set_no_split(&self, no_split: bool) {
        self.no_split.store(no_split, Ordering::Relaxed);
    }

    /// Whether free blocks are handed out whole
    /// ([`SegmentPool::set_no_split`]).
    pub fn no_split(&self) -> bool {
        self.no_split.load(Ordering::Relaxed)
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// The sizes in force.
    pub fn config(&self) -> &SegmentPoolConfig {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn rounded(&self, bytes: usize) -> Option<u64> {
        let r = self.config.round;
        bytes.checked_add(r - 1).map(|b| (b & !(r - 1)) as u64)
    }

    fn class_of(&self, size: u64) -> SizeClass {
        if size <= self.config.small_limit as u64 {
            SizeClass::Small
        } else {
            SizeClass::Large
        }
    }

    /// Bytes of a new segment for a block of `size` bytes of `class`.
    fn segment_size(&self, size: u64, class: SizeClass) -> Option<u64> {
        let c = &self.config;
        Some(match class {
            SizeClass::Small => c.small_segment as u64,
            SizeClass::Large if size < c.large_segment_limit as u64 => c.large_segment as u64,
            SizeClass::Large => {
                let r = c.large_round as u64;
                size.checked_add(r - 1)? & !(r - 1)
            }
        })
    }

    /// Whether a free block of `whole` bytes given `size` is split.
    fn splits(&self, class: SizeClass, whole: u64, size: u64) -> bool {
        if self.no_split() {
            return false;
        }
        let rest = whole - size;
        match class {
            SizeClass::Small => rest >= self.config.round as u64,
            SizeClass::Large => rest > self.config.small_limit as u64,
        }
    }

    /// A copy of every segment and its blocks, in address order.
    pub fn segments(&self) -> Vec<SegmentInfo> {
        let st = self.lock();
        st.segs.iter().map(|(&a, s)| s.info(a)).collect()
    }

    /// The live blocks, in address order, with their segment's stream (its
    /// raw handle).
    pub fn live_blocks(&self) -> Vec<(LiveBlock, RawStream)> {
        let st = self.lock();
        st.segs
            .values()
            .flat_map(|s| {
                let id = s.stream.raw();
                s.blocks.iter().filter(|(_, b)| b.live).map(move |(&a, b)| {
                    (
                        LiveBlock {
                            address: DevicePtr(a),
                            size: b.size as usize,
                            requested: Some(b.requested as usize),
                        },
                        id,
                    )
                })
            })
            .collect()
    }

    /// The segments as plain address ranges.
    pub fn segment_ranges(&self) -> Vec<Segment> {
        let st = self.lock();
        st.segs
            .iter()
            .map(|(&a, s)| Segment {
                address: DevicePtr(a),
                size: s.size as usize,
            })
            .collect()
    }

    /// The live block at `ptr` (its first byte), with its segment's raw
    /// stream, if there is one.
    pub fn live_block(&self, ptr: DevicePtr) -> Option<(LiveBlock, RawStream)> {
        let st = self.lock();
        let seg = &st.segs[&st.seg_of(ptr.0)?];
        let b = seg.blocks.get(&ptr.0).filter(|b| b.live)?;
        let block = LiveBlock {
            address: ptr,
            size: b.size as usize,
            requested: Some(b.requested as usize),
        };
        Some((block, seg.stream.raw()))
    }

    /// The size of the live block at `ptr`, if there is one.
    pub fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        let st = self.lock();
        let start = st.seg_of(ptr.0)?;
        let b = st.segs[&start].blocks.get(&ptr.0)?;
        b.live.then_some(b.size as usize)
    }

    /// Live blocks now.
    pub fn live_count(&self) -> usize {
        let s = self.stats();
        (s.small.allocation.current + s.large.allocation.current).max(0) as usize
    }

    /// The counters of both size classes.
    pub fn stats(&self) -> SegmentPoolStats {
        self.lock().stats
    }

    /// Resets every peak to the value now.
    pub fn reset_peak(&self) {
        let mut st = self.lock();
        st.peak_reserved = (st.stats.small.reserved_bytes.current
            + st.stats.large.reserved_bytes.current)
            .max(0) as u64;
        let stats = &mut st.stats;
        for c in [&mut stats.small, &mut stats.large] {
            for s in [
                &mut c.allocation,
                &mut c.allocated_bytes,
                &mut c.requested_bytes,
                &mut c.segment,
                &mut c.reserved_bytes,
            ] {
                s.peak = s.current;
            }
        }
    }

    /// Bytes of the segments held.
    pub fn reserved_bytes(&self) -> usize {
        let s = self.stats();
        (s.small.reserved_bytes.current + s.large.reserved_bytes.current).max(0) as usize
    }

    /// The largest free block, in bytes.
    pub fn largest_free_block(&self) -> usize {
        let st = self.lock();
        st.free.iter().map(|k| k.2).max().unwrap_or(0) as usize
    }

    /// Saves the layout: every segment with its blocks.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            owner: self.id,
            segments: self.segments(),
        }
    }

    /// Puts the layout of `saved` back: frees every live block that is not
    /// live in it, then makes each of its live blocks that is not live now
    /// live again at its address. A block live in both (same address, same
    /// size) is kept as it is. Segments made since stay (with no live
    /// block). Refused, with nothing changed, when `saved` comes from
    /// another pool or when one of its segments is gone or differs.
    pub fn restore(&self, saved: &Checkpoint) -> Result<Restored> {
        if saved.owner != self.id {
            return Err(Error::InvalidArgument(
                "segment pool: a checkpoint of another pool".into(),
            ));
        }
        let mut st = self.lock();
        // Check everything first: a refusal changes nothing.
        let mut keep = BTreeSet::new();
        for s in &saved.segments {
            let Some(seg) = st.segs.get(&s.address.0) else {
                return Err(Error::InvalidArgument(format!(
                    "segment pool: the checkpoint's segment at {:#x} is gone",
                    s.address.0
                )));
            };
            if seg.size as usize != s.size || seg.stream.id() != s.stream {
                return Err(Error::InvalidArgument(format!(
                    "segment pool: the segment at {:#x} changed since the checkpoint",
                    s.address.0
                )));
            }
            for b in s.blocks.iter().filter(|b| b.live) {
                // A block live at the same place with the same size is the
                // same allocation, kept as it is; anything else live there
                // is freed below and the checkpoint's block made again.
                if let Some(now) = seg.blocks.get(&b.address.0) {
                    if now.live && now.size as usize == b.size {
                        keep.insert(b.address.0);
                    }
                }
            }
        }
        if st.parked.iter().any(|p| !keep.contains(p)) {
            return Err(Error::InvalidArgument(
                "segment pool: the checkpoint would free a block that work on another stream may still use".into(),
            ));
        }
        let mut out = Restored::default();
        let live: Vec<(u64, u64)> = st
            .segs
            .iter()
            .flat_map(|(&start, s)| {
                s.blocks
                    .iter()
                    .filter(|(_, b)| b.live)
                    .map(move |(&a, _)| (start, a))
            })
            .collect();
        for (start, addr) in live {
            if !keep.contains(&addr) {
                st.release(start, addr);
                out.freed.push(DevicePtr(addr));
            }
        }
        for s in &saved.segments {
            for b in s.blocks.iter().filter(|b| b.live) {
                if keep.contains(&b.address.0) {
                    continue;
                }
                // Every block now live in this segment is live in the
                // checkpoint too, and the checkpoint's blocks do not
                // overlap: the place is free.
                let carved = st.carve(s.address.0, b.address.0, b);
                debug_assert!(carved, "a checkpoint's block over free memory");
                if !carved {
                    return Err(Error::InvalidArgument(format!(
                        "segment pool: cannot make the block at {:#x} again",
                        b.address.0
                    )));
                }
                out.made.push((
                    LiveBlock {
                        address: b.address,
                        size: b.size,
                        requested: Some(b.requested),
                    },
                    s.raw_stream,
                ));
            }
        }
        Ok(out)
    }

    /// Gives every segment without a live block back to the upstream (freed
    /// on the stream it belongs to); returns the bytes given back. The
    /// caller makes sure no work (a graph replay) still uses them.
    pub fn release_free_segments(&self) -> Result<usize> {
        self.give_back(0, |_| true)
    }

    /// Gives segments without a live block back, those `ready` accepts, in
    /// address order, until at most `to` bytes are held.
    fn give_back(&self, to: usize, mut ready: impl FnMut(&Stream) -> bool) -> Result<usize> {
        let mut st = self.lock();
        let free: Vec<u64> = st
            .segs
            .iter()
            .filter(|(_, s)| s.is_free())
            .map(|(&a, _)| a)
            .collect();
        let mut given = 0;
        for start in free {
            let held = (st.stats.small.reserved_bytes.current
                + st.stats.large.reserved_bytes.current)
                .max(0) as usize;
            if held <= to {
                break;
            }
            if !ready(&st.segs[&start].stream) {
                continue;
            }
            let seg = st.segs.remove(&start).expect("listed above");
            let _relaxed = crate::captures::relaxed_if_underway(self.upstream.device());
            if let Err(e) = self.upstream.deallocate(
                DevicePtr(start),
                seg.size as usize,
                DEFAULT_ALIGNMENT,
                &seg.stream,
            ) {
                st.segs.insert(start, seg);
                return Err(e);
            }
            for (&a, b) in &seg.blocks {
                st.free.remove(&State::free_key(&seg, a, b.size));
            }
            let c = st.counters(seg.class);
            sub(&mut c.segment, 1);
            sub(&mut c.reserved_bytes, seg.size);
            given += seg.size as usize;
        }
        Ok(given)
    }

    /// Checks that a free of `ptr` with `bytes` would be accepted, without
    /// freeing anything: a live block's first byte, with a size that rounds
    /// as the request did.
    pub fn check_free(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.checked(&self.lock(), ptr, bytes).map(drop)
    }

    /// [`SegmentPool::check_free`] under the lock; the segment's first byte.
    fn checked(&self, st: &State, ptr: DevicePtr, bytes: usize) -> Result<u64> {
        let refused = |reason| Error::InvalidFree { ptr: ptr.0, reason };
        let start = st
            .seg_of(ptr.0)
            .ok_or_else(|| refused(FreeError::Unknown))?;
        let Some(b) = st.segs[&start].blocks.get(&ptr.0).copied() else {
            return Err(refused(FreeError::Unknown));
        };
        if !b.live || st.parked.contains(&ptr.0) {
            return Err(refused(FreeError::DoubleFree));
        }
        if self.rounded(bytes) != self.rounded(b.requested as usize) {
            return Err(refused(FreeError::SizeMismatch {
                allocated: b.requested as usize,
                freed: bytes,
            }));
        }
        Ok(start)
    }

    /// [`MemoryResource::allocate`] from the free blocks alone: best fit
    /// among the free blocks of `stream`'s segments of the request's class,
    /// split as an allocation splits it, but never a new segment. `None`
    /// when no free block fits (and for zero bytes).
    pub fn allocate_cached(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<Option<DevicePtr>> {
        self.allocate_in(bytes, alignment, stream, false)
    }

    /// Best fit among the free blocks, else a new segment when `grow`;
    /// `None` for zero bytes and when nothing fits without growing.
    fn allocate_in(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        grow: bool,
    ) -> Result<Option<DevicePtr>> {
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(None);
        }
        let size = self.rounded(bytes).ok_or_else(|| Error::oom(bytes))?;
        let class = self.class_of(size);
        let mut st = self.lock();
        let id = stream.id();
        let found = st
            .free
            .range((id, class, size, 0)..=(id, class, u64::MAX, u64::MAX))
            .next()
            .copied();
        let (whole, addr) = match found {
            Some((_, _, whole, addr)) => (whole, addr),
            None if grow => {
                let addr = self.grow(&mut st, size, class, stream)?;
                (st.segs[&addr].size, addr)
            }
            None => return Ok(None),
        };
        let start = st.seg_of(addr).expect("a free block lies in a segment");
        let split = self.splits(class, whole, size);
        st.take(start, addr, size, bytes as u64, split);
        Ok(Some(DevicePtr(addr)))
    }

    /// A new segment for a block of `size` bytes of `class` on `stream`.
    fn grow(&self, st: &mut State, size: u64, class: SizeClass, stream: &Stream) -> Result<u64> {
        let too_large = || Error::oom(size as usize);
        let bytes = self.segment_size(size, class).ok_or_else(too_large)?;
        let bytes = usize::try_from(bytes).map_err(|_| too_large())?;
        let p = {
            let _relaxed = crate::captures::relaxed_if_underway(self.upstream.device());
            self.upstream.allocate(bytes, DEFAULT_ALIGNMENT, stream)?
        };
        let seg = Seg {
            size: bytes as u64,
            class,
            stream: stream.clone(),
            blocks: BTreeMap::from([(
                p.0,
                Block {
                    size: bytes as u64,
                    requested: 0,
                    live: false,
                },
            )]),
        };
        st.free.insert(State::free_key(&seg, p.0, bytes as u64));
        st.segs.insert(p.0, seg);
        let c = st.counters(class);
        add(&mut c.segment, 1);
        add(&mut c.reserved_bytes, bytes as u64);
        let held = (st.stats.small.reserved_bytes.current + st.stats.large.reserved_bytes.current)
            .max(0) as u64;
        st.peak_reserved = st.peak_reserved.max(held);
        Ok(p.0)
    }
}

impl<U: MemoryResource> MemoryResource for SegmentPool<U> {
    /// Best fit among the free blocks of `stream`'s segments of the
    /// request's class; a new segment when none fits. Alignment up to 256
    /// bytes (the upstream's segments are aligned so, and blocks lie at
    /// multiples of [`SegmentPoolConfig::round`] into them).
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        self.allocate_in(bytes, alignment, stream, true)
            .map(|p| p.unwrap_or(DevicePtr::NULL))
    }

    /// Checks the free (a live block's first byte, with a size that rounds
    /// as the request did), then merges the block with its free neighbours.
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        crate::error::check_alignment(alignment)?;
        let mut st = self.lock();
        let start = self.checked(&st, ptr, bytes)?;
        let owner = &st.segs[&start].stream;
        if owner.id() != stream.id()
            && !handoff::hand_over(&HeldStream::new(stream), owner, &self.events)?
        {
            // The block's stream cannot be made to wait for this one: the
            // block stays out of use (live) for good; a second free of it
            // is still refused.
            st.parked.insert(ptr.0);
            return Ok(());
        }
        st.release(start, ptr.0);
        Ok(())
    }

    fn device(&self) -> &Device {
        self.upstream.device()
    }

    fn properties(&self) -> Properties {
        self.upstream.properties()
    }
}

/// The reserve is the segments held. [`Pool::trim`] gives back segments
/// without a live block whose stream is known idle (a query; none during a
/// capture on it); [`Pool::release`] first waits for the streams of the
/// segments without a live block (refused while one of them captures),
/// then gives them all back. A segment whose stream cannot be waited for
/// (nor found idle) stays, its stream's work may still use it; the others
/// go, and the first error is returned.
impl<U: MemoryResource> Pool for SegmentPool<U> {
    fn reserved_bytes(&self) -> usize {
        SegmentPool::reserved_bytes(self)
    }

    fn peak_reserved_bytes(&self) -> usize {
        self.lock().peak_reserved as usize
    }

    fn reset_peak(&self) {
        SegmentPool::reset_peak(self)
    }

    fn trim(&self, to: usize) -> Result<usize> {
        self.give_back(to, |s| streams::query(s) == Progress::Idle)
    }

    fn release(&self) -> Result<usize> {
        let waits: Vec<Stream> = {
            let st = self.lock();
            let mut seen = BTreeSet::new();
            st.segs
                .values()
                .filter(|s| s.is_free() && seen.insert(s.stream.id()))
                .map(|s| s.stream.clone())
                .collect()
        };
        let mut done = BTreeSet::new();
        let mut first_err = None;
        for s in &waits {
            match streams::synchronize(s) {
                Ok(()) => {
                    done.insert(s.id());
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        let given = self.give_back(0, |s| {
            done.contains(&s.id()) || streams::query(s) == Progress::Idle
        });
        first_err.map_or(given, Err)
    }
}

impl<U: MemoryResource> Drop for SegmentPool<U> {
    /// Gives every segment back to the upstream, live blocks or not (a
    /// pool dropped with live blocks: their owners must not use them).
    fn drop(&mut self) {
        let st = std::mem::take(&mut *self.lock());
        for (start, seg) in st.segs {
            let upstream = &self.upstream;
            crate::exit::give_back(
                || format!("segment {start:#x} of a segment pool"),
                || {
                    upstream.deallocate(
                        DevicePtr(start),
                        seg.size as usize,
                        DEFAULT_ALIGNMENT,
                        &seg.stream,
                    )
                },
            );
        }
    }
}
