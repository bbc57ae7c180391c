//! `StatisticsAdaptor`: current, peak and total bytes and counts of the
//! allocations made through it (RMM's statistics_resource_adaptor, with the
//! names of PyTorch's `torch.cuda.memory_stats` where they mean the same).
//!
//! Counters live in a stack of *frames*: [`StatisticsAdaptor::push_frame`]
//! starts a fresh frame (all zero) that receives every allocation and free from
//! then on; [`StatisticsAdaptor::pop_frame`] returns it and merges it into the
//! frame below, the parent's peak becoming the larger of its own peak and its
//! current value at the push plus the child's peak. Frames are shared by all
//! threads, as in RMM.
//!
//! What each counter means at this layer:
//! - `allocated_bytes`: bytes handed out and not yet freed by their callers,
//!   each allocation rounded up to the 256-byte granularity (what it takes
//!   from a driver allocator or a pool at least).
//! - `requested_bytes`: the same, in the bytes callers asked for. A caller
//!   that rounds requests up itself (as PyTorch's allocator rounds them)
//!   allocates the block with [`StatisticsAdaptor::allocate_rounded`],
//!   naming the request too: the block counts in `allocated_bytes`, the
//!   request here.
//! - `allocation`: the same, counting allocations.
//! - `active_bytes` and `active`: bytes and allocations the upstream still
//!   holds for callers: `allocated_bytes` and `allocation` plus the *deferred
//!   frees* not finished yet. A caller that must keep a freed block from the
//!   upstream for a while (PyTorch's `record_stream`: until other streams'
//!   work is done) counts the free with
//!   [`StatisticsAdaptor::begin_deferred_free`] and hands the block down
//!   later with [`StatisticsAdaptor::finish_deferred_free`]. Without deferred
//!   frees, `active` equals `allocation` and `active_bytes` equals
//!   `allocated_bytes`; `active.total` and `active.freed` are the allocation
//!   and free counts of the upstream.
//! - `reserved_bytes`: what the upstream holds for these allocations. The
//!   adaptor cannot see inside its upstream, so it reports `active_bytes`;
//!   that is exact over a driver resource, which holds exactly what it hands
//!   out. Over a pool, ask the pool for its own reserve.
//! - `num_ooms`: allocations the upstream refused with out-of-memory.
//! - `num_alloc_retries`: retries made by a [`FailureCallbackAdaptor`] whose
//!   [`RetryCounter`] was given to [`StatisticsAdaptor::with_retry_counter`];
//!   0 otherwise.
//!
//! Fast path: a few integer updates of the top frame, no timers. Where the
//! upstream lends its locks ([`MemoryResource::lent_lock`]: a
//! [`PoolResource`] and a [`VirtualPool`] lend every shard's), they run
//! inside the critical section its allocation takes anyway, in the
//! counters' *cell* of the lock held, so threads on different shards never
//! write the same counters; reads sum the cells holding every lock. Otherwise they run after the
//! upstream call, under a lock of one flag (one atomic read-modify-write,
//! see `flag_lock`), in one cell. Zero-byte requests and failed frees are
//! not counted.
//!
//! With several cells in use (a pool whose threads spread over its
//! shards), every current value and total is exact and a peak is the sum
//! of the cells' peaks: an upper bound of the true peak, as a sharded
//! pool's own `peak_live` is. While one cell counts (one shard, or threads
//! that have not spread, as under PyTorch), peaks are exact.
//!
//! A free counts the size the caller names, once the upstream has accepted
//! it. Every gpumem resource refuses a free whose size is not the
//! allocation's (see [`crate::resource`]), so `allocated_bytes` stays exact;
//! a pool that compares sizes at the 256-byte granule accepts a size within
//! the allocation's granule, which moves `requested_bytes` by less than 256
//! bytes per such (wrong) free. Counters saturate rather than wrap, except
//! those a lending resource applies ([`CallCount`]).
//!
//! [`FailureCallbackAdaptor`]: super::FailureCallbackAdaptor
//! [`PoolResource`]: crate::pool::PoolResource
//! [`VirtualPool`]: crate::pool::VirtualPool

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use super::flag_lock::FlagLock;
use super::{granular_size, RetryCounter};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::growable::not_growable;
use crate::resource::{GrowInPlace, MemoryResource, Properties, Segment};
use crate::stream::Stream;
use crate::{check_alignment, Error, Result};

/// One statistic, as PyTorch keeps it: current and peak values and the totals
/// added and removed. In a frame other than the root, `current` can be negative
/// (memory allocated before the frame was pushed and freed inside it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    /// Value now.
    pub current: i64,
    /// Highest value since the frame started or the last peak reset.
    pub peak: i64,
    /// Total ever added (PyTorch's `allocated`).
    pub total: u64,
    /// Total ever removed (PyTorch's `freed`).
    pub freed: u64,
}

// Every update saturates: a size no allocation can have (a caller's bad
// free accepted by a lenient upstream) must not wrap a counter or panic.
impl Stat {
    /// Undoes a [`SharedStat::sub`] (the peak is not touched: the value only
    /// comes back to where it was). The free comes off the total removed as
    /// far as this frame counted it; the rest (a free counted in the frame
    /// below) counts as added in this one, so that `total` stays `current +
    /// freed`.
    fn unsub(&mut self, n: u64) {
        let back = n.min(self.freed);
        self.current = self.current.saturating_add_unsigned(n);
        self.freed -= back;
        self.total = self.total.saturating_add(n - back);
    }

    /// Merges a popped child frame into this one: the child's changes apply on
    /// top of this frame's value at the push.
    fn merge_child(&mut self, child: &Stat) {
        self.peak = self.peak.max(self.current.saturating_add(child.peak));
        self.current = self.current.saturating_add(child.current);
        self.total = self.total.saturating_add(child.total);
        self.freed = self.freed.saturating_add(child.freed);
    }
}

/// A snapshot of the counters of one frame (or of all frames merged). See the
/// module documentation for what each means at this layer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes allocated and not freed by their callers, each allocation
    /// rounded up to 256 bytes.
    pub allocated_bytes: Stat,
    /// Bytes requested by callers.
    pub requested_bytes: Stat,
    /// Bytes the upstream holds for these allocations (equal to
    /// `active_bytes` at this layer).
    pub reserved_bytes: Stat,
    /// Allocations not freed by their callers (counts).
    pub allocation: Stat,
    /// Bytes the upstream holds for callers: `allocated_bytes` plus deferred
    /// frees not finished (rounded as `allocated_bytes`).
    pub active_bytes: Stat,
    /// Allocations the upstream holds for callers (counts): `allocation`
    /// plus deferred frees not finished.
    pub active: Stat,
    /// Allocation retries after out-of-memory (see the module documentation).
    pub num_alloc_retries: u64,
    /// Allocations refused with out-of-memory by the upstream.
    pub num_ooms: u64,
    /// The counters of blocks of at most [`SMALL_BLOCK_MAX`] bytes
    /// (PyTorch's `small_pool`; another bound with
    /// [`StatisticsAdaptor::with_small_class_max`]).
    pub small: ClassStats,
    /// The counters of larger blocks (PyTorch's `large_pool`).
    pub large: ClassStats,
}

/// The counters of one size class of blocks (see [`MemoryStats`], whose
/// fields of the same names count all blocks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// As [`MemoryStats::allocated_bytes`].
    pub allocated_bytes: Stat,
    /// As [`MemoryStats::requested_bytes`].
    pub requested_bytes: Stat,
    /// As [`MemoryStats::allocation`].
    pub allocation: Stat,
    /// As [`MemoryStats::active_bytes`].
    pub active_bytes: Stat,
    /// As [`MemoryStats::active`].
    pub active: Stat,
}

impl ClassStats {
    fn stats_mut(&mut self) -> [&mut Stat; 5] {
        [
            &mut self.allocated_bytes,
            &mut self.requested_bytes,
            &mut self.allocation,
            &mut self.active_bytes,
            &mut self.active,
        ]
    }

    fn stats(&self) -> [&Stat; 5] {
        [
            &self.allocated_bytes,
            &self.requested_bytes,
            &self.allocation,
            &self.active_bytes,
            &self.active,
        ]
    }

    fn merge_child(&mut self, child: &ClassStats) {
        for (s, c) in self.stats_mut().into_iter().zip(child.stats()) {
            s.merge_child(c);
        }
    }

    fn add_cell(&mut self, other: &ClassStats) {
        for (s, o) in self.stats_mut().into_iter().zip(other.stats()) {
            s.add_cell(o);
        }
    }
}

impl MemoryStats {
    /// Successful allocations.
    pub fn num_allocs(&self) -> u64 {
        self.active.total
    }

    /// Successful frees.
    pub fn num_frees(&self) -> u64 {
        self.active.freed
    }

    fn merge_child(&mut self, child: &MemoryStats) {
        self.allocated_bytes.merge_child(&child.allocated_bytes);
        self.requested_bytes.merge_child(&child.requested_bytes);
        self.allocation.merge_child(&child.allocation);
        self.active_bytes.merge_child(&child.active_bytes);
        self.active.merge_child(&child.active);
        self.small.merge_child(&child.small);
        self.large.merge_child(&child.large);
        self.num_ooms += child.num_ooms;
    }

    /// The counters of all blocks, as one class's.
    fn all(&self) -> ClassStats {
        ClassStats {
            allocated_bytes: self.allocated_bytes,
            requested_bytes: self.requested_bytes,
            allocation: self.allocation,
            active_bytes: self.active_bytes,
            active: self.active,
        }
    }
}

/// Adds what another cell counted (see [`TopFrame`]): the peaks add up too,
/// so the sum's peak is an upper bound of the true one.
impl Stat {
    fn add_cell(&mut self, other: &Stat) {
        self.current = self.current.saturating_add(other.current);
        self.peak = self.peak.saturating_add(other.peak);
        self.total = self.total.saturating_add(other.total);
        self.freed = self.freed.saturating_add(other.freed);
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Frame {
    stats: MemoryStats,
    /// The retry counter's value when the frame was pushed.
    retry_base: u64,
}

/// One [`Stat`] in atomics, so that the top frame can be shared without a
/// `Mutex` or `unsafe`: every access holds the counters' lock (the
/// adaptor's [`FlagLock`] or the lock its upstream lends), so relaxed loads
/// and stores (plain moves) suffice.
///
/// The total added is not kept: it is always `current + freed` (every
/// update moves `current` and one of the totals by the same amount), which
/// spares an allocation one update per statistic. Only a counter that
/// saturates breaks that sum, and then the total read saturates too.
#[derive(Debug, Default)]
struct SharedStat {
    current: AtomicI64,
    peak: AtomicI64,
    freed: AtomicU64,
}

impl SharedStat {
    #[inline(always)]
    fn get(&self) -> Stat {
        let current = self.current.load(Relaxed);
        let freed = self.freed.load(Relaxed);
        Stat {
            current,
            peak: self.peak.load(Relaxed),
            total: freed.saturating_add_signed(current),
            freed,
        }
    }

    /// Makes the counters read as `s` (whose `total` is its `current` plus
    /// its `freed`, as every [`Stat`] made by this module).
    #[inline(always)]
    fn set(&self, s: Stat) {
        self.current.store(s.current, Relaxed);
        self.peak.store(s.peak, Relaxed);
        self.freed.store(s.freed, Relaxed);
    }

    /// Adds `n`: the current value (and with it the total) grows, the peak
    /// follows. Saturating, or wrapping where `SERVED` (see [`CallCount`]).
    #[inline(always)]
    fn add<const SERVED: bool>(&self, n: u64) {
        let current = self.current.load(Relaxed);
        let current = match SERVED {
            true => current.wrapping_add_unsigned(n),
            false => current.saturating_add_unsigned(n),
        };
        self.current.store(current, Relaxed);
        if current > self.peak.load(Relaxed) {
            self.peak.store(current, Relaxed);
        }
    }

    /// Removes `n`: the current value falls, the total removed grows.
    /// Saturating, or wrapping where `SERVED` (see [`CallCount`]).
    #[inline(always)]
    fn sub<const SERVED: bool>(&self, n: u64) {
        let (current, freed) = (self.current.load(Relaxed), self.freed.load(Relaxed));
        let (current, freed) = match SERVED {
            true => (current.wrapping_sub_unsigned(n), freed.wrapping_add(n)),
            false => (current.saturating_sub_unsigned(n), freed.saturating_add(n)),
        };
        self.current.store(current, Relaxed);
        self.freed.store(freed, Relaxed);
    }

    fn unsub(&self, n: u64) {
        let mut s = self.get();
        s.unsub(n);
        self.set(s);
    }
}

/// The five counters of allocations of one kind (all of them, or those of
/// one size class) in the top frame (see [`SharedStat`]).
///
/// Until a deferred free, `active` and `active_bytes` move exactly as
/// `allocation` and `allocated_bytes` do (every allocation and free counts
/// in both): while `deferred` is false they are not updated and read as
/// those, which spares two of the five updates of every allocation and free.
/// The first deferred free copies them and sets `deferred`; from then on
/// the counters keep all five.
#[derive(Debug, Default)]
struct Counters {
    allocated_bytes: SharedStat,
    requested_bytes: SharedStat,
    allocation: SharedStat,
    active_bytes: SharedStat,
    active: SharedStat,
    deferred: AtomicBool,
}

/// The counters of the top frame: all allocations, and each size class.
/// `all` is kept, not summed from the classes when read: its peak is not
/// the sum of theirs.
#[derive(Debug)]
struct TopFrame {
    all: Counters,
    small: Counters,
    large: Counters,
    num_ooms: AtomicU64,
    retry_base: AtomicU64,
    /// The largest allocation of the small class
    /// ([`StatisticsAdaptor::with_small_class_max`]).
    small_max: usize,
}

impl Default for TopFrame {
    fn default() -> Self {
        Self {
            all: Counters::default(),
            small: Counters::default(),
            large: Counters::default(),
            num_ooms: AtomicU64::default(),
            retry_base: AtomicU64::default(),
            small_max: SMALL_BLOCK_MAX,
        }
    }
}

/// One [`TopFrame`] per lock the upstream lends, each on its own cache
/// lines: a count is applied in the cell of the lock held, so threads that
/// hold different locks never write the same counters.
#[repr(align(128))]
#[derive(Debug, Default)]
struct Cell(TopFrame);

/// The cells of the top frame, read as one.
#[derive(Debug)]
struct Cells(Box<[Cell]>);

impl Cells {
    fn new(n: usize) -> Self {
        Self((0..n.max(1)).map(|_| Cell::default()).collect())
    }

    /// The cell a count made under lent lock `i` goes to.
    #[inline(always)]
    fn at(&self, i: usize) -> &TopFrame {
        match self.0.get(i) {
            Some(c) => &c.0,
            None => self.wrapped(i),
        }
    }

    /// [`Cells::at`] for a lock past the cells (a lender that changed its
    /// count): wrapped onto them, out of the counting path.
    #[cold]
    #[inline(never)]
    fn wrapped(&self, i: usize) -> &TopFrame {
        &self.0[i % self.0.len()].0
    }

    /// The frame all cells make together (the counters' locks held): sums,
    /// the peaks summed too (exact while one cell counts, an upper bound
    /// once several do).
    fn get(&self) -> Frame {
        let mut f = self.0[0].0.get();
        for c in &self.0[1..] {
            let g = c.0.get();
            let (s, t) = (&mut f.stats, &g.stats);
            s.allocated_bytes.add_cell(&t.allocated_bytes);
            s.requested_bytes.add_cell(&t.requested_bytes);
            s.allocation.add_cell(&t.allocation);
            s.active_bytes.add_cell(&t.active_bytes);
            s.active.add_cell(&t.active);
            s.small.add_cell(&t.small);
            s.large.add_cell(&t.large);
            s.num_ooms = s.num_ooms.saturating_add(t.num_ooms);
        }
        f
    }

    /// Makes the cells read as `f`: cell 0 takes it, the others start over
    /// (the counters' locks held).
    fn set(&self, f: &Frame) {
        self.0[0].0.set(f);
        for c in &self.0[1..] {
            c.0.set(&Frame::default());
        }
    }

    /// Every counter of every cell.
    fn stats(&self) -> impl Iterator<Item = &SharedStat> {
        self.0.iter().flat_map(|c| c.0.stats())
    }
}

impl Counters {
    fn get(&self) -> ClassStats {
        let (allocated_bytes, allocation) = (self.allocated_bytes.get(), self.allocation.get());
        let (active_bytes, active) = if self.deferred.load(Relaxed) {
            (self.active_bytes.get(), self.active.get())
        } else {
            (allocated_bytes, allocation)
        };
        ClassStats {
            allocated_bytes,
            requested_bytes: self.requested_bytes.get(),
            allocation,
            active_bytes,
            active,
        }
    }

    fn set(&self, s: &ClassStats) {
        self.allocated_bytes.set(s.allocated_bytes);
        self.requested_bytes.set(s.requested_bytes);
        self.allocation.set(s.allocation);
        self.active_bytes.set(s.active_bytes);
        self.active.set(s.active);
        let same = s.active_bytes == s.allocated_bytes && s.active == s.allocation;
        self.deferred.store(!same, Relaxed);
    }

    /// Takes back a free counted on the caller's side (see
    /// [`StatisticsAdaptor::cancel_deferred_free`]).
    fn uncount_free(&self, counted: u64, requested: u64) {
        self.defer();
        self.allocated_bytes.unsub(counted);
        self.requested_bytes.unsub(requested);
        self.allocation.unsub(1);
    }

    /// Starts keeping `active` and `active_bytes` apart (a deferred free is
    /// about to make them differ).
    fn defer(&self) {
        if !self.deferred.load(Relaxed) {
            self.active_bytes.set(self.allocated_bytes.get());
            self.active.set(self.allocation.get());
            self.deferred.store(true, Relaxed);
        }
    }

    /// Counts an allocation of `bytes` for a request of `requested` bytes
    /// (the counters' lock held).
    #[inline(always)]
    fn count_allocation<const SERVED: bool>(&self, bytes: usize, requested: usize) {
        let counted = granular_size(bytes).unwrap_or(usize::MAX) as u64;
        self.allocated_bytes.add::<SERVED>(counted);
        self.requested_bytes.add::<SERVED>(requested as u64);
        self.allocation.add::<SERVED>(1);
        if let Some([active_bytes, active]) = self.active() {
            active_bytes.add::<SERVED>(counted);
            active.add::<SERVED>(1);
        }
    }

    /// Counts a free of `bytes` (allocated for `requested`) on the caller's
    /// side, the upstream's or both (the counters' lock held).
    #[inline(always)]
    fn count_free<const SERVED: bool>(&self, bytes: usize, requested: usize, side: Side) {
        let counted = granular_size(bytes).unwrap_or(usize::MAX) as u64;
        if side != Side::Both {
            self.defer();
        }
        if side != Side::Upstream {
            self.allocated_bytes.sub::<SERVED>(counted);
            self.requested_bytes.sub::<SERVED>(requested as u64);
            self.allocation.sub::<SERVED>(1);
        }
        if side != Side::Caller {
            if let Some([active_bytes, active]) = self.active() {
                active_bytes.sub::<SERVED>(counted);
                active.sub::<SERVED>(1);
            }
        }
    }

    /// Counts an allocation resized in place from `old` to `new` bytes: the
    /// bytes move, the count of allocations does not (the counters' lock
    /// held).
    fn count_resize(&self, old: usize, new: usize) {
        let granular = |b: usize| granular_size(b).unwrap_or(usize::MAX) as u64;
        let (g_old, g_new) = (granular(old), granular(new));
        let resize = |stat: &SharedStat, from: u64, to: u64| match to.checked_sub(from) {
            Some(more) => stat.add::<false>(more),
            None => stat.sub::<false>(from - to),
        };
        resize(&self.allocated_bytes, g_old, g_new);
        resize(&self.requested_bytes, old as u64, new as u64);
        if let Some([active_bytes, _]) = self.active() {
            resize(active_bytes, g_old, g_new);
        }
    }

    /// `active_bytes` and `active`, when they are kept apart.
    #[inline(always)]
    fn active(&self) -> Option<[&SharedStat; 2]> {
        self.deferred
            .load(Relaxed)
            .then_some([&self.active_bytes, &self.active])
    }

    fn stats(&self) -> [&SharedStat; 5] {
        [
            &self.allocated_bytes,
            &self.requested_bytes,
            &self.allocation,
            &self.active_bytes,
            &self.active,
        ]
    }
}

/// PyTorch's size classes: a block of at most this many bytes belongs to
/// its small pool, a larger one to its large pool.
pub const SMALL_BLOCK_MAX: usize = 1 << 20;

/// The size of PyTorch's small pool's segments: what a resource takes from
/// the driver counts in the small class up to this size (a segment of
/// PyTorch's large pool is always larger), see
/// [`StatisticsAdaptor::with_small_class_max`].
pub const SMALL_SEGMENT_MAX: usize = 2 << 20;

impl TopFrame {
    /// The counters of the size class of a block of `bytes`.
    #[inline(always)]
    fn class(&self, bytes: usize) -> &Counters {
        if bytes <= self.small_max {
            &self.small
        } else {
            &self.large
        }
    }

    fn get(&self) -> Frame {
        let all = self.all.get();
        Frame {
            stats: MemoryStats {
                allocated_bytes: all.allocated_bytes,
                requested_bytes: all.requested_bytes,
                allocation: all.allocation,
                active_bytes: all.active_bytes,
                active: all.active,
                num_ooms: self.num_ooms.load(Relaxed),
                small: self.small.get(),
                large: self.large.get(),
                ..MemoryStats::default()
            },
            retry_base: self.retry_base.load(Relaxed),
        }
    }

    fn set(&self, f: &Frame) {
        let s = &f.stats;
        self.all.set(&s.all());
        self.small.set(&s.small);
        self.large.set(&s.large);
        self.num_ooms.store(s.num_ooms, Relaxed);
        self.retry_base.store(f.retry_base, Relaxed);
    }

    #[inline(always)]
    fn count_allocation<const SERVED: bool>(&self, bytes: usize, requested: usize) {
        self.all.count_allocation::<SERVED>(bytes, requested);
        self.class(bytes)
            .count_allocation::<SERVED>(bytes, requested);
    }

    #[inline(always)]
    fn count_free<const SERVED: bool>(&self, bytes: usize, requested: usize, side: Side) {
        self.all.count_free::<SERVED>(bytes, requested, side);
        self.class(bytes)
            .count_free::<SERVED>(bytes, requested, side);
    }

    /// A resize within a size class moves its bytes; one across classes
    /// moves the allocation from one class to the other.
    fn count_resize(&self, old: usize, new: usize) {
        self.all.count_resize(old, new);
        let (from, to) = (self.class(old), self.class(new));
        if std::ptr::eq(from, to) {
            from.count_resize(old, new);
        } else {
            from.count_free::<false>(old, old, Side::Both);
            to.count_allocation::<false>(new, new);
        }
    }

    fn uncount_free(&self, bytes: usize, requested: usize) {
        let counted = granular_size(bytes).unwrap_or(usize::MAX) as u64;
        self.all.uncount_free(counted, requested as u64);
        self.class(bytes).uncount_free(counted, requested as u64);
    }

    fn stats(&self) -> impl Iterator<Item = &SharedStat> {
        [&self.all, &self.small, &self.large]
            .into_iter()
            .flat_map(Counters::stats)
    }
}

/// A resource that counts what goes through it.
#[derive(Debug)]
pub struct StatisticsAdaptor<U> {
    upstream: U,
    /// Held for every access to `top` and `below`, unless the upstream
    /// lends its own lock (see [`StatisticsAdaptor::counting`]).
    busy: FlagLock,
    /// The counters of the top frame, the one allocations and frees update:
    /// one cell per lock the upstream lends (one without).
    top: Cells,
    /// The frames under the top one, the root first (changed only when
    /// frames are pushed and popped, holding `busy` too).
    below: Mutex<Vec<Frame>>,
    retries: Option<RetryCounter>,
}

impl<U: MemoryResource> StatisticsAdaptor<U> {
    /// Wraps `upstream` with one (root) frame of zero counters.
    pub fn new(upstream: U) -> Self {
        let cells = upstream.lent_lock().map_or(1, |l| l.cells());
        Self {
            upstream,
            busy: FlagLock::default(),
            top: Cells::new(cells),
            below: Mutex::new(Vec::new()),
            retries: None,
        }
    }

    /// Like [`StatisticsAdaptor::new`], also reporting the retries counted by
    /// `retries` (from [`FailureCallbackAdaptor::retry_counter`]) as
    /// `num_alloc_retries`.
    ///
    /// [`FailureCallbackAdaptor::retry_counter`]: super::FailureCallbackAdaptor::retry_counter
    pub fn with_retry_counter(upstream: U, retries: RetryCounter) -> Self {
        let base = retries.get();
        let adaptor = Self {
            retries: Some(retries),
            ..Self::new(upstream)
        };
        adaptor.top.at(0).retry_base.store(base, Relaxed);
        adaptor
    }

    /// Counts allocations of at most `bytes` in the small class
    /// ([`MemoryStats::small`]) instead of [`SMALL_BLOCK_MAX`]: for an
    /// adaptor that counts a pool's segments (whose small class is
    /// [`SMALL_SEGMENT_MAX`]) rather than the blocks handed out. Set before
    /// the first allocation: what was counted stays in its class.
    #[must_use]
    pub fn with_small_class_max(mut self, bytes: usize) -> Self {
        for c in self.top.0.iter_mut() {
            c.0.small_max = bytes;
        }
        self
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Runs `f` holding the counters' locks: every lock the upstream lends
    /// ([`MemoryResource::lent_lock`]: the counters then cost no lock of
    /// their own), else `busy`. Every update leaves the counters
    /// consistent, so a panic while holding it leaves valid data.
    #[inline]
    fn counting(&self, f: &mut dyn FnMut()) {
        match self.upstream.lent_lock() {
            Some(lent) => lent.locked(f),
            None => {
                let _guard = self.busy.lock();
                f();
            }
        }
    }

    /// The frames under the top one; the caller holds the counters' lock
    /// (see [`Self::counting`]).
    fn below(&self) -> std::sync::MutexGuard<'_, Vec<Frame>> {
        self.below.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn retries_now(&self) -> u64 {
        self.retries.as_ref().map_or(0, RetryCounter::get)
    }

    fn snapshot(&self, frame: &Frame) -> MemoryStats {
        let mut s = frame.stats;
        s.reserved_bytes = s.active_bytes;
        s.num_alloc_retries = self.retries_now().saturating_sub(frame.retry_base);
        s
    }

    /// The counters of the current (top) frame.
    pub fn stats(&self) -> MemoryStats {
        let mut top = Frame::default();
        self.counting(&mut || top = self.top.get());
        self.snapshot(&top)
    }

    /// The counters of all frames merged, as if every pushed frame were popped
    /// now: the whole history of the adaptor.
    pub fn total_stats(&self) -> MemoryStats {
        let mut acc = Frame::default();
        self.counting(&mut || {
            acc = self.top.get();
            for parent in self.below().iter().rev() {
                let mut merged = *parent;
                merged.stats.merge_child(&acc.stats);
                acc = merged;
            }
        });
        self.snapshot(&acc)
    }

    /// Starts a fresh frame of zero counters on top of the stack; returns the
    /// new depth (the root frame is depth 1).
    pub fn push_frame(&self) -> usize {
        let base = self.retries_now();
        let mut depth = 0;
        self.counting(&mut || {
            let mut below = self.below();
            below.push(self.top.get());
            self.top.set(&Frame {
                retry_base: base,
                ..Frame::default()
            });
            depth = below.len() + 1;
        });
        depth
    }

    /// Removes the top frame, merges it into its parent and returns its
    /// counters. `None` when only the root frame is left (it cannot be popped).
    pub fn pop_frame(&self) -> Option<MemoryStats> {
        let mut popped = None;
        self.counting(&mut || {
            if let Some(mut parent) = self.below().pop() {
                let top = self.top.get();
                parent.stats.merge_child(&top.stats);
                self.top.set(&parent);
                popped = Some(top);
            }
        });
        popped.map(|top| self.snapshot(&top))
    }

    /// Runs `f` inside a fresh frame and returns its result with the frame's
    /// counters. Frames are shared by all threads: allocations other threads
    /// make meanwhile count in this frame too.
    pub fn scoped<R>(&self, f: impl FnOnce() -> R) -> (R, MemoryStats) {
        self.push_frame();
        let r = f();
        let stats = self.pop_frame().unwrap_or_default();
        (r, stats)
    }

    /// Number of frames (1 when none is pushed).
    pub fn frame_depth(&self) -> usize {
        let mut depth = 0;
        self.counting(&mut || depth = self.below().len() + 1);
        depth
    }

    /// Resets the peaks of the top frame to the current values (PyTorch's
    /// `reset_peak_memory_stats`).
    pub fn reset_peak(&self) {
        self.counting(&mut || {
            for stat in self.top.stats() {
                stat.peak.store(stat.current.load(Relaxed), Relaxed);
            }
        });
    }

    /// Counts a caller's free of `bytes` now (`allocated_bytes`,
    /// `requested_bytes`, `allocation`) while the block stays with the
    /// caller, still `active`, until [`StatisticsAdaptor::finish_deferred_free`]
    /// hands it to the upstream (or [`StatisticsAdaptor::cancel_deferred_free`]
    /// takes the free back). The caller checks that the block is live.
    pub fn begin_deferred_free(&self, bytes: usize) {
        self.count_free(bytes, bytes, Side::Caller);
    }

    /// [`StatisticsAdaptor::begin_deferred_free`] of a block allocated with
    /// [`StatisticsAdaptor::allocate_rounded`].
    pub fn begin_deferred_free_rounded(&self, requested: usize, block: usize) {
        self.count_free(block, requested, Side::Caller);
    }

    /// Frees a block whose free [`StatisticsAdaptor::begin_deferred_free`]
    /// counted: hands it to the upstream and, once accepted, counts it out
    /// of `active` and `active_bytes`. A free the upstream refuses counts
    /// nothing (the caller may [`StatisticsAdaptor::cancel_deferred_free`]).
    pub fn finish_deferred_free(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.free_through(ptr, bytes, bytes, alignment, stream, Side::Upstream)
    }

    /// Takes back a free counted by [`StatisticsAdaptor::begin_deferred_free`]
    /// whose block stays live after all (its free was refused): the counters
    /// are as if the free had not been made.
    pub fn cancel_deferred_free(&self, bytes: usize) {
        self.cancel_deferred_free_rounded(bytes, bytes)
    }

    /// [`StatisticsAdaptor::cancel_deferred_free`] of a block allocated with
    /// [`StatisticsAdaptor::allocate_rounded`].
    pub fn cancel_deferred_free_rounded(&self, requested: usize, block: usize) {
        let top = self.top.at(0);
        self.counting(&mut || top.uncount_free(block, requested));
    }

    /// Allocates a block of `block` bytes for a request of `requested`
    /// bytes, rounded up by the caller (PyTorch's `roundup_power2_divisions`
    /// and 512-byte blocks, for one): `allocated_bytes` and `active_bytes`
    /// count the block, `requested_bytes` the request. The block is freed
    /// with [`StatisticsAdaptor::deallocate_rounded`] and the same two
    /// sizes. `InvalidArgument` when `requested` exceeds `block`.
    #[inline]
    pub fn allocate_rounded(
        &self,
        requested: usize,
        block: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<DevicePtr> {
        if requested > block {
            return Err(Error::InvalidArgument(format!(
                "a request of {requested} bytes does not fit the block of {block} bytes meant for it"
            )));
        }
        self.allocate_counting(requested, block, alignment, stream)
    }

    /// Frees a block of [`StatisticsAdaptor::allocate_rounded`]: the
    /// upstream gets `block` bytes back, `requested_bytes` loses
    /// `requested`.
    #[inline]
    pub fn deallocate_rounded(
        &self,
        ptr: DevicePtr,
        requested: usize,
        block: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.free_through(ptr, block, requested, alignment, stream, Side::Both)
    }

    /// Allocates `bytes` from the upstream, counted as a request of
    /// `requested` bytes.
    #[inline(always)]
    fn allocate_counting(
        &self,
        requested: usize,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<DevicePtr> {
        check_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let top = &self.top;
        let r = match self.upstream.lent_lock() {
            Some(lent) => {
                let count = CallCount {
                    top,
                    bytes,
                    requested,
                    call: Call::Allocate,
                };
                lent.allocate_counted(bytes, alignment, stream, count)
            }
            None => self
                .upstream
                .allocate(bytes, alignment, stream)
                .inspect(|_| {
                    let _guard = self.busy.lock();
                    top.at(0).count_allocation::<false>(bytes, requested);
                }),
        };
        match r {
            Ok(p) => Ok(p),
            Err(e) => Err(self.allocation_failed(e)),
        }
    }

    /// Frees `ptr` (`bytes` allocated for `requested`) through the upstream
    /// and, once accepted, counts it on `side`.
    #[inline(always)]
    fn free_through(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        requested: usize,
        alignment: usize,
        stream: &Stream,
        side: Side,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        match self.upstream.lent_lock() {
            Some(lent) => {
                let count = CallCount {
                    top: &self.top,
                    bytes,
                    requested,
                    call: Call::Free(side),
                };
                lent.deallocate_counted(ptr, bytes, alignment, stream, count)
            }
            None => {
                self.upstream.deallocate(ptr, bytes, alignment, stream)?;
                let _guard = self.busy.lock();
                self.top.at(0).count_free::<false>(bytes, requested, side);
                Ok(())
            }
        }
    }

    /// An allocation the upstream refused: counted where it ran out of
    /// memory. Out of line, so that the allocation path tests its result
    /// once.
    #[cold]
    #[inline(never)]
    fn allocation_failed(&self, e: Error) -> Error {
        if e.is_oom() {
            self.count_oom();
        }
        e
    }

    /// Counts an allocation the upstream refused with out-of-memory.
    fn count_oom(&self) {
        let n = &self.top.at(0).num_ooms;
        self.counting(&mut || n.store(n.load(Relaxed).saturating_add(1), Relaxed));
    }

    /// Counts a free of `bytes` (allocated for `requested`) on the caller's
    /// side, the upstream's or both.
    fn count_free(&self, bytes: usize, requested: usize, side: Side) {
        self.counting(&mut || self.top.at(0).count_free::<false>(bytes, requested, side));
    }
}

/// One call to count, handed to a resource that lends its lock
/// ([`LentLock`]): it [`CallCount::apply`]s it holding that lock, once the
/// call succeeded.
///
/// Such a count uses plain (wrapping) arithmetic, not the saturating kind
/// of the adaptor's other counts: its sizes are those of blocks the pool
/// handed out or accepted back (at most the device's memory), so no sum
/// comes near `i64::MAX` in any run, while overflow checks lengthen the
/// C ABI's path on every call (`docs/decisions.md`).
///
/// [`LentLock`]: crate::resource::LentLock
#[derive(Debug)]
#[must_use = "a count does nothing until applied"]
pub struct CallCount<'a> {
    top: &'a Cells,
    bytes: usize,
    /// The bytes asked for (`bytes` unless the caller rounded the request).
    requested: usize,
    call: Call,
}

#[derive(Debug, Clone, Copy)]
enum Call {
    Allocate,
    Free(Side),
}

impl CallCount<'_> {
    /// Counts the call in cell `lock`, holding lock `lock` of those the
    /// caller lends (0 up to [`LentLock::cells`]).
    ///
    /// [`LentLock::cells`]: crate::resource::LentLock::cells
    #[inline(always)]
    pub fn apply(self, lock: usize) {
        let top = self.top.at(lock);
        match self.call {
            Call::Allocate => top.count_allocation::<true>(self.bytes, self.requested),
            Call::Free(side) => top.count_free::<true>(self.bytes, self.requested, side),
        }
    }
}

/// Which counters a free moves: the caller's (`allocation`,
/// `allocated_bytes`, `requested_bytes`), the upstream's (`active`,
/// `active_bytes`), or both at once (a free that is not deferred).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Caller,
    Upstream,
    Both,
}

impl<U: MemoryResource> MemoryResource for StatisticsAdaptor<U> {
    #[inline]
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        self.allocate_counting(bytes, bytes, alignment, stream)
    }

    #[inline]
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.free_through(ptr, bytes, bytes, alignment, stream, Side::Both)
    }

    fn device(&self) -> &Device {
        self.upstream.device()
    }

    fn properties(&self) -> Properties {
        self.upstream.properties()
    }

    fn check_access(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.upstream.check_access(ptr, bytes)
    }

    fn grow_in_place(&self) -> Option<&dyn GrowInPlace> {
        self.upstream
            .grow_in_place()
            .map(|_| self as &dyn GrowInPlace)
    }

    fn driver_segments(&self) -> Option<Vec<Segment>> {
        self.upstream.driver_segments()
    }
}

/// A growable allocation counts as one allocation of its current size: a
/// growth or shrink moves its bytes (`allocated_bytes`, `requested_bytes`,
/// `active_bytes`, the total allocated or freed included), not the count.
impl<U: MemoryResource> GrowInPlace for StatisticsAdaptor<U> {
    fn growth_granularity(&self) -> usize {
        self.upstream
            .grow_in_place()
            .map_or(super::ALLOCATION_GRANULARITY, |g| g.growth_granularity())
    }

    fn allocate_growable(&self, bytes: usize, capacity: usize) -> Result<DevicePtr> {
        // Pieces of any size: whole growths, as the upstream's own call.
        self.allocate_growable_in_pieces(bytes, capacity, usize::MAX)
    }

    fn allocate_growable_in_pieces(
        &self,
        bytes: usize,
        capacity: usize,
        max_piece: usize,
    ) -> Result<DevicePtr> {
        let g = self.upstream.grow_in_place().ok_or_else(not_growable)?;
        let r = g.allocate_growable_in_pieces(bytes, capacity, max_piece);
        match &r {
            Ok(_) => self.counting(&mut || self.top.at(0).count_allocation::<false>(bytes, bytes)),
            Err(e) if e.is_oom() => self.count_oom(),
            Err(_) => {}
        }
        r
    }

    fn grow(&self, ptr: DevicePtr, bytes: usize, new_bytes: usize) -> Result<()> {
        let g = self.upstream.grow_in_place().ok_or_else(not_growable)?;
        let r = g.grow(ptr, bytes, new_bytes);
        match &r {
            Ok(()) => self.counting(&mut || self.top.at(0).count_resize(bytes, new_bytes)),
            Err(e) if e.is_oom() => self.count_oom(),
            Err(_) => {}
        }
        r
    }

    fn shrink(&self, ptr: DevicePtr, bytes: usize, new_bytes: usize) -> Result<usize> {
        let g = self.upstream.grow_in_place().ok_or_else(not_growable)?;
        let kept = g.shrink(ptr, bytes, new_bytes)?;
        self.counting(&mut || self.top.at(0).count_resize(bytes, kept));
        Ok(kept)
    }

    fn pieces(&self, ptr: DevicePtr, bytes: usize) -> Result<Vec<(usize, usize)>> {
        let g = self.upstream.grow_in_place().ok_or_else(not_growable)?;
        g.pieces(ptr, bytes)
    }

    /// Counted as the allocation shrunk to `at` and a new one of the rest.
    fn split(&self, ptr: DevicePtr, bytes: usize, at: usize) -> Result<DevicePtr> {
        let g = self.upstream.grow_in_place().ok_or_else(not_growable)?;
        let tail = g.split(ptr, bytes, at)?;
        self.counting(&mut || {
            let top = self.top.at(0);
            top.count_resize(bytes, at);
            top.count_allocation::<false>(bytes - at, bytes - at);
        });
        Ok(tail)
    }

    /// Counted as a free of `src` and a growth of `dst`.
    fn recycle(
        &self,
        src: DevicePtr,
        src_bytes: usize,
        dst: DevicePtr,
        dst_bytes: usize,
    ) -> Result<()> {
        let g = self.upstream.grow_in_place().ok_or_else(not_growable)?;
        g.recycle(src, src_bytes, dst, dst_bytes)?;
        self.counting(&mut || {
            let top = self.top.at(0);
            top.count_free::<false>(src_bytes, src_bytes, Side::Both);
            top.count_resize(dst_bytes, dst_bytes + src_bytes);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_tracks_current_peak_and_totals() {
        let s = SharedStat::default();
        s.add::<false>(100);
        s.add::<false>(50);
        s.sub::<false>(100);
        s.add::<false>(20);
        assert_eq!(
            s.get(),
            Stat {
                current: 70,
                peak: 150,
                total: 170,
                freed: 100
            }
        );
    }

    #[test]
    fn counters_saturate_instead_of_wrapping() {
        let shared = SharedStat::default();
        shared.add::<false>(1024);
        shared.sub::<false>(u64::MAX);
        shared.sub::<false>(u64::MAX);
        assert_eq!(shared.get().current, i64::MIN);
        assert_eq!(shared.get().freed, u64::MAX);
        shared.add::<false>(u64::MAX);
        shared.add::<false>(u64::MAX);
        let s = shared.get();
        assert_eq!(s.total, u64::MAX);
        assert!(s.current > 0);
        let mut parent = Stat {
            current: i64::MAX,
            peak: i64::MAX,
            ..Stat::default()
        };
        parent.merge_child(&s);
        assert_eq!(parent.peak, i64::MAX);
    }

    #[test]
    fn the_total_added_is_the_current_value_plus_the_total_removed() {
        let s = SharedStat::default();
        s.add::<false>(300);
        s.sub::<false>(100);
        let mut got = s.get();
        assert_eq!((got.current, got.total, got.freed), (200, 300, 100));
        // Taking back a free this frame counted: the total removed falls.
        got.unsub(100);
        s.set(got);
        assert_eq!(
            s.get(),
            Stat {
                current: 300,
                peak: 300,
                total: 300,
                freed: 0
            }
        );
        // Taking back a free the frame below counted (this frame counted no
        // free): the value comes back as an addition.
        let child = SharedStat::default();
        let mut c = child.get();
        c.unsub(256);
        child.set(c);
        assert_eq!(
            child.get(),
            Stat {
                current: 256,
                peak: 0,
                total: 256,
                freed: 0
            }
        );
    }

    #[test]
    fn child_peak_merges_on_top_of_the_parent_value() {
        // Parent at 1000 (peak 1200); the child allocates 500, frees 700.
        let mut parent = Stat {
            current: 1000,
            peak: 1200,
            total: 1500,
            freed: 500,
        };
        let child = SharedStat::default();
        child.add::<false>(500); // 1500 overall: new peak
        child.sub::<false>(700);
        parent.merge_child(&child.get());
        assert_eq!(parent.current, 800);
        assert_eq!(parent.peak, 1500);
        assert_eq!(parent.total, 2000);
        assert_eq!(parent.freed, 1200);

        // A child whose peak stays under the parent's old peak leaves it.
        let child = SharedStat::default();
        child.add::<false>(100);
        parent.merge_child(&child.get());
        assert_eq!(parent.peak, 1500);
        assert_eq!(parent.current, 900);
    }
}

/// The adaptor against a model that updates all five statistics of every
/// frame on every call, as PyTorch's allocator does: the shortcut that keeps
/// `active` and `active_bytes` on `allocation` and `allocated_bytes` until a
/// deferred free must never show.
#[cfg(test)]
mod model_tests {
    use super::*;
    use crate::driver::sim::SimConfig;
    use crate::resource::DeviceResource;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(usize),
        Free(usize),
        Begin(usize),
        Finish(usize),
        Cancel(usize),
        Push,
        Pop,
        ResetPeak,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // Both size classes, and blocks on either side of the line.
            4 => prop_oneof![1usize..5000, SMALL_BLOCK_MAX - 600..SMALL_BLOCK_MAX + 600]
                .prop_map(Op::Alloc),
            2 => any::<usize>().prop_map(Op::Free),
            1 => any::<usize>().prop_map(Op::Begin),
            1 => any::<usize>().prop_map(Op::Finish),
            1 => any::<usize>().prop_map(Op::Cancel),
            1 => Just(Op::Push),
            1 => Just(Op::Pop),
            1 => Just(Op::ResetPeak),
        ]
    }

    /// One statistic of the model, plain arithmetic (the values stay small).
    fn add(s: &mut Stat, n: u64) {
        s.current += n as i64;
        s.total += n;
        s.peak = s.peak.max(s.current);
    }

    fn sub(s: &mut Stat, n: u64) {
        s.current -= n as i64;
        s.freed += n;
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn every_statistic_matches_the_model(ops in prop::collection::vec(op(), 1..120)) {
            let device = crate::Device::sim(SimConfig::default());
            let stream = device.default_stream();
            let mr = StatisticsAdaptor::new(DeviceResource::new(device));
            let mut model = vec![MemoryStats::default()];
            let mut live: Vec<(DevicePtr, usize)> = Vec::new();
            let mut deferred: Vec<(DevicePtr, usize)> = Vec::new();
            let mut pushed = false;
            for op in ops {
                let depth = model.len();
                let top = model.last_mut().unwrap();
                let g = |b: usize| granular_size(b).unwrap() as u64;
                match op {
                    Op::Alloc(b) => {
                        live.push((mr.allocate(b, 256, &stream).unwrap(), b));
                        add(&mut top.allocated_bytes, g(b));
                        add(&mut top.requested_bytes, b as u64);
                        add(&mut top.allocation, 1);
                        add(&mut top.active_bytes, g(b));
                        add(&mut top.active, 1);
                    }
                    Op::Free(i) | Op::Begin(i) if !live.is_empty() => {
                        let (p, b) = live.swap_remove(i % live.len());
                        sub(&mut top.allocated_bytes, g(b));
                        sub(&mut top.requested_bytes, b as u64);
                        sub(&mut top.allocation, 1);
                        if matches!(op, Op::Free(_)) {
                            mr.deallocate(p, b, 256, &stream).unwrap();
                            sub(&mut top.active_bytes, g(b));
                            sub(&mut top.active, 1);
                        } else {
                            mr.begin_deferred_free(b);
                            deferred.push((p, b));
                        }
                    }
                    Op::Finish(i) if !deferred.is_empty() => {
                        let (p, b) = deferred.swap_remove(i % deferred.len());
                        mr.finish_deferred_free(p, b, 256, &stream).unwrap();
                        sub(&mut top.active_bytes, g(b));
                        sub(&mut top.active, 1);
                    }
                    Op::Cancel(i) if !deferred.is_empty() => {
                        let (p, b) = deferred.swap_remove(i % deferred.len());
                        mr.cancel_deferred_free(b);
                        top.allocated_bytes.unsub(g(b));
                        top.requested_bytes.unsub(b as u64);
                        top.allocation.unsub(1);
                        live.push((p, b));
                    }
                    Op::Push => {
                        pushed = true;
                        mr.push_frame();
                        model.push(MemoryStats::default());
                    }
                    Op::Pop if depth > 1 => {
                        let child = model.pop().unwrap();
                        model.last_mut().unwrap().merge_child(&child);
                        let popped = mr.pop_frame().unwrap();
                        prop_assert_eq!(popped.active, child.active);
                        prop_assert_eq!(popped.active_bytes, child.active_bytes);
                    }
                    Op::ResetPeak => {
                        mr.reset_peak();
                        for s in [
                            &mut top.allocated_bytes,
                            &mut top.requested_bytes,
                            &mut top.allocation,
                            &mut top.active_bytes,
                            &mut top.active,
                        ] {
                            s.peak = s.current;
                        }
                    }
                    _ => {}
                }
                let want = *model.last().unwrap();
                let got = mr.stats();
                prop_assert_eq!(got.allocated_bytes, want.allocated_bytes);
                prop_assert_eq!(got.requested_bytes, want.requested_bytes);
                prop_assert_eq!(got.allocation, want.allocation);
                prop_assert_eq!(got.active_bytes, want.active_bytes);
                prop_assert_eq!(got.active, want.active);
                prop_assert_eq!(mr.frame_depth(), model.len());
                // The size classes split every count; in the root frame
                // (never negative) a class's peak is at most the whole's.
                for ((a, s), l) in got.all().stats().into_iter().zip(got.small.stats()).zip(got.large.stats()) {
                    prop_assert_eq!(a.current, s.current + l.current);
                    // A cancelled free comes off the frees its frame
                    // counted: those of all blocks or of the block's class,
                    // which differ once frames were pushed.
                    if !pushed {
                        prop_assert_eq!(a.total, s.total + l.total);
                        prop_assert_eq!(a.freed, s.freed + l.freed);
                    }
                    if model.len() == 1 {
                        prop_assert!(s.peak <= a.peak && l.peak <= a.peak);
                    }
                }
                let small: usize = live.iter().filter(|(_, b)| *b <= SMALL_BLOCK_MAX).count();
                if model.len() == 1 {
                    prop_assert_eq!(got.small.allocation.current, small as i64);
                }
            }
            for (p, b) in live {
                mr.deallocate(p, b, 256, &stream).unwrap();
            }
            for (p, b) in deferred {
                mr.finish_deferred_free(p, b, 256, &stream).unwrap();
            }
        }
    }
}
