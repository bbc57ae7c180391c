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
//! - `requested_bytes`: the same, in the bytes callers asked for.
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
//! Fast path: one short, uncontended mutex around a few integer updates of the
//! top frame after the upstream call; no timers. Zero-byte requests and failed
//! frees are not counted.
//!
//! A free counts the size the caller names, once the upstream has accepted
//! it. Every gpumem resource refuses a free whose size is not the
//! allocation's (see [`crate::resource`]), so `allocated_bytes` stays exact;
//! a pool that compares sizes at the 256-byte granule accepts a size within
//! the allocation's granule, which moves `requested_bytes` by less than 256
//! bytes per such (wrong) free. Counters saturate rather than wrap.
//!
//! [`FailureCallbackAdaptor`]: super::FailureCallbackAdaptor

use std::sync::{Mutex, MutexGuard};

use super::{granular_size, RetryCounter};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{MemoryResource, Properties};
use crate::stream::Stream;
use crate::{check_alignment, Result};

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
    #[inline]
    fn add(&mut self, n: u64) {
        self.current = self.current.saturating_add_unsigned(n);
        self.total = self.total.saturating_add(n);
        self.peak = self.peak.max(self.current);
    }

    #[inline]
    fn sub(&mut self, n: u64) {
        self.current = self.current.saturating_sub_unsigned(n);
        self.freed = self.freed.saturating_add(n);
    }

    /// Undoes a [`Stat::sub`] (the peak is not touched: the value only comes
    /// back to where it was).
    fn unsub(&mut self, n: u64) {
        self.current = self.current.saturating_add_unsigned(n);
        self.freed = self.freed.saturating_sub(n);
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
        self.num_ooms += child.num_ooms;
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Frame {
    stats: MemoryStats,
    /// The retry counter's value when the frame was pushed.
    retry_base: u64,
}

/// A resource that counts what goes through it.
#[derive(Debug)]
pub struct StatisticsAdaptor<U> {
    upstream: U,
    frames: Mutex<Vec<Frame>>,
    retries: Option<RetryCounter>,
}

impl<U: MemoryResource> StatisticsAdaptor<U> {
    /// Wraps `upstream` with one (root) frame of zero counters.
    pub fn new(upstream: U) -> Self {
        Self {
            upstream,
            frames: Mutex::new(vec![Frame::default()]),
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
        Self {
            upstream,
            frames: Mutex::new(vec![Frame {
                retry_base: base,
                ..Frame::default()
            }]),
            retries: Some(retries),
        }
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Frame>> {
        // Each update leaves the counters consistent, so a poisoned lock holds
        // valid data.
        self.frames.lock().unwrap_or_else(|p| p.into_inner())
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
        let frames = self.lock();
        let top = frames.last().copied().unwrap_or_default();
        drop(frames);
        self.snapshot(&top)
    }

    /// The counters of all frames merged, as if every pushed frame were popped
    /// now: the whole history of the adaptor.
    pub fn total_stats(&self) -> MemoryStats {
        let frames = self.lock();
        let mut iter = frames.iter().rev();
        let mut acc = iter.next().copied().unwrap_or_default();
        for parent in iter {
            let mut merged = *parent;
            merged.stats.merge_child(&acc.stats);
            acc = merged;
        }
        drop(frames);
        self.snapshot(&acc)
    }

    /// Starts a fresh frame of zero counters on top of the stack; returns the
    /// new depth (the root frame is depth 1).
    pub fn push_frame(&self) -> usize {
        let base = self.retries_now();
        let mut frames = self.lock();
        frames.push(Frame {
            retry_base: base,
            ..Frame::default()
        });
        frames.len()
    }

    /// Removes the top frame, merges it into its parent and returns its
    /// counters. `None` when only the root frame is left (it cannot be popped).
    pub fn pop_frame(&self) -> Option<MemoryStats> {
        let mut frames = self.lock();
        if frames.len() < 2 {
            return None;
        }
        let top = frames.pop()?;
        if let Some(parent) = frames.last_mut() {
            parent.stats.merge_child(&top.stats);
        }
        drop(frames);
        Some(self.snapshot(&top))
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
        self.lock().len()
    }

    /// Resets the peaks of the top frame to the current values (PyTorch's
    /// `reset_peak_memory_stats`).
    pub fn reset_peak(&self) {
        let mut frames = self.lock();
        if let Some(top) = frames.last_mut() {
            let s = &mut top.stats;
            for stat in [
                &mut s.allocated_bytes,
                &mut s.requested_bytes,
                &mut s.allocation,
                &mut s.active_bytes,
                &mut s.active,
            ] {
                stat.peak = stat.current;
            }
        }
    }

    /// Counts a caller's free of `bytes` now (`allocated_bytes`,
    /// `requested_bytes`, `allocation`) while the block stays with the
    /// caller, still `active`, until [`StatisticsAdaptor::finish_deferred_free`]
    /// hands it to the upstream (or [`StatisticsAdaptor::cancel_deferred_free`]
    /// takes the free back). The caller checks that the block is live.
    pub fn begin_deferred_free(&self, bytes: usize) {
        self.count_free(bytes, Side::Caller);
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
        self.free_through(ptr, bytes, alignment, stream, Side::Upstream)
    }

    /// Takes back a free counted by [`StatisticsAdaptor::begin_deferred_free`]
    /// whose block stays live after all (its free was refused): the counters
    /// are as if the free had not been made.
    pub fn cancel_deferred_free(&self, bytes: usize) {
        let counted = granular_size(bytes).unwrap_or(usize::MAX) as u64;
        if let Some(top) = self.lock().last_mut() {
            top.stats.allocated_bytes.unsub(counted);
            top.stats.requested_bytes.unsub(bytes as u64);
            top.stats.allocation.unsub(1);
        }
    }

    /// Frees `ptr` through the upstream and, once accepted, counts it on
    /// `side`.
    #[inline(always)]
    fn free_through(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
        side: Side,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        self.upstream.deallocate(ptr, bytes, alignment, stream)?;
        self.count_free(bytes, side);
        Ok(())
    }

    /// Counts a free of `bytes` on the caller's side, the upstream's or both.
    #[inline(always)]
    fn count_free(&self, bytes: usize, side: Side) {
        let counted = granular_size(bytes).unwrap_or(usize::MAX) as u64;
        if let Some(top) = self.lock().last_mut() {
            let s = &mut top.stats;
            if side != Side::Upstream {
                s.allocated_bytes.sub(counted);
                s.requested_bytes.sub(bytes as u64);
                s.allocation.sub(1);
            }
            if side != Side::Caller {
                s.active_bytes.sub(counted);
                s.active.sub(1);
            }
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
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        check_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        match self.upstream.allocate(bytes, alignment, stream) {
            Ok(p) => {
                let counted = granular_size(bytes).unwrap_or(usize::MAX) as u64;
                let mut frames = self.lock();
                if let Some(top) = frames.last_mut() {
                    let s = &mut top.stats;
                    s.allocated_bytes.add(counted);
                    s.requested_bytes.add(bytes as u64);
                    s.allocation.add(1);
                    s.active_bytes.add(counted);
                    s.active.add(1);
                }
                Ok(p)
            }
            Err(e) => {
                if e.is_oom() {
                    if let Some(top) = self.lock().last_mut() {
                        top.stats.num_ooms += 1;
                    }
                }
                Err(e)
            }
        }
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.free_through(ptr, bytes, alignment, stream, Side::Both)
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_tracks_current_peak_and_totals() {
        let mut s = Stat::default();
        s.add(100);
        s.add(50);
        s.sub(100);
        s.add(20);
        assert_eq!(
            s,
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
        let mut s = Stat::default();
        s.add(1024);
        s.sub(u64::MAX);
        s.sub(u64::MAX);
        assert_eq!(s.current, i64::MIN);
        assert_eq!(s.freed, u64::MAX);
        s.add(u64::MAX);
        s.add(u64::MAX);
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
    fn child_peak_merges_on_top_of_the_parent_value() {
        // Parent at 1000 (peak 1200); the child allocates 500, frees 700.
        let mut parent = Stat {
            current: 1000,
            peak: 1200,
            total: 1500,
            freed: 500,
        };
        let mut child = Stat::default();
        child.add(500); // 1500 overall: new peak
        child.sub(700);
        parent.merge_child(&child);
        assert_eq!(parent.current, 800);
        assert_eq!(parent.peak, 1500);
        assert_eq!(parent.total, 2000);
        assert_eq!(parent.freed, 1200);

        // A child whose peak stays under the parent's old peak leaves it.
        let mut child = Stat::default();
        child.add(100);
        parent.merge_child(&child);
        assert_eq!(parent.peak, 1500);
        assert_eq!(parent.current, 900);
    }
}
