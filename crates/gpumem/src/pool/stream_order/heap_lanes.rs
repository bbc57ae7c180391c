//! `HeapLanes`: the per-stream lanes of a [`LaneHeap`] (or of several heaps
//! kept in step) and the stream-ordering moves over them (settle, steal,
//! settle-blocking), for the pools built on a `LaneHeap`
//! ([`PoolResource`](crate::pool::PoolResource), whose small and large heaps
//! share one lane number per stream, and
//! [`VirtualPool`](crate::pool::VirtualPool), one `HeapLanes` per address
//! area).
//!
//! Each stream that allocates or frees gets a lane of the heap, numbered as
//! its slot in a [`StreamSlots`]; blocks freed on stream S go to S's lane,
//! reusable at once by S. They move to the global lane (safe for every
//! stream) when S is found idle by a query (`settle`, never blocking) or
//! synchronized (`settle_blocking`); another stream T takes them after one
//! event recorded on S and one `cuStreamWaitEvent` on T (`steal`, through
//! [`hand_over`]). No event on the fast path.

use super::events::EventPool;
use super::handoff::hand_over;
use super::slots::StreamSlots;
use super::streams::{synchronize_device, synchronize_each, Progress};
use crate::device::Device;
use crate::stream::Stream;
use crate::suballoc::{LaneHeap, LaneId};
use crate::{Error, Result};

/// Spare events kept for steals.
const SPARE_EVENTS: usize = 4;

/// The heaps one [`HeapLanes`] serves: a single [`LaneHeap`], or an array of
/// heaps whose lane numbers are kept in step (a stream has the same lane in
/// each, and its lane moves, is stolen and is dropped in all of them at once).
pub(crate) trait Heaps {
    fn heaps(&self) -> &[LaneHeap];
    fn heaps_mut(&mut self) -> &mut [LaneHeap];

    /// Free bytes of `lane` summed over the heaps.
    #[inline]
    fn lane_free_total(&self, lane: LaneId) -> u64 {
        self.heaps().iter().map(|h| h.lane_free_bytes(lane)).sum()
    }

    /// Moves the free blocks of `from` to `to` in every heap.
    #[inline]
    fn move_lane_all(&mut self, from: LaneId, to: LaneId) {
        for h in self.heaps_mut() {
            h.move_lane(from, to).expect("both lanes exist");
        }
    }
}

impl Heaps for LaneHeap {
    #[inline]
    fn heaps(&self) -> &[LaneHeap] {
        std::slice::from_ref(self)
    }
    #[inline]
    fn heaps_mut(&mut self) -> &mut [LaneHeap] {
        std::slice::from_mut(self)
    }
}

impl<const N: usize> Heaps for [LaneHeap; N] {
    #[inline]
    fn heaps(&self) -> &[LaneHeap] {
        self
    }
    #[inline]
    fn heaps_mut(&mut self) -> &mut [LaneHeap] {
        self
    }
}

/// Creates one lane with the same number in every heap; on failure (or if
/// the numbers were out of step) every heap is left as it was.
#[cold]
fn create_lane(heaps: &mut [LaneHeap]) -> Result<LaneId> {
    let mut made = Vec::with_capacity(heaps.len());
    let mut failure = None;
    for h in heaps.iter_mut() {
        match h.create_lane() {
            Ok(l) => made.push(l),
            Err(e) => {
                failure = Some(e.to_string());
                break;
            }
        }
    }
    if failure.is_none() && made.iter().all(|&l| l == made[0]) {
        return Ok(made[0]);
    }
    for (h, &l) in heaps.iter_mut().zip(&made) {
        let _ = h.drop_lane(l);
    }
    Err(Error::InvalidArgument(format!(
        "pool cannot track another stream: {}",
        failure.unwrap_or_else(|| "lane numbers out of step".into())
    )))
}

/// The streams of one [`LaneHeap`] or of heaps kept in step ([`Heaps`]):
/// a stream's slot is its lane number (the global lane, 0, has none).
pub(crate) struct HeapLanes {
    streams: StreamSlots<()>,
    /// Recorded on a victim's stream when another stream takes its blocks.
    events: EventPool,
}

impl Default for HeapLanes {
    fn default() -> Self {
        Self {
            streams: StreamSlots::default(),
            events: EventPool::new(SPARE_EVENTS),
        }
    }
}

impl HeapLanes {
    /// No lanes yet (the heap's global lane needs no entry).
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Streams with a lane.
    pub(crate) fn len(&self) -> usize {
        self.streams.len()
    }

    /// The lane of `stream`, created on first use (in every heap).
    #[inline]
    pub(crate) fn lane_of(&mut self, heaps: &mut impl Heaps, stream: &Stream) -> Result<LaneId> {
        match self.streams.find(stream) {
            Some(lane) => Ok(LaneId(lane)),
            None => self.add_lane(heaps, stream),
        }
    }

    /// A lane for a stream seen for the first time. Streams their users
    /// dropped go first where a query finds them idle (their free blocks
    /// to the global lane), so a program that makes and drops streams
    /// keeps as many lanes (and streams) as it uses.
    #[cold]
    fn add_lane(&mut self, heaps: &mut impl Heaps, stream: &Stream) -> Result<LaneId> {
        self.settle_dropped(heaps);
        self.forget_dropped_streams(heaps);
        let lane = create_lane(heaps.heaps_mut())?;
        self.streams.insert_at(lane.0, stream, ());
        Ok(lane)
    }

    /// Moves the free blocks of every lane whose stream is known idle to the
    /// global lane (except `keep`), in every heap. Never blocks, never fails:
    /// a stream that cannot be queried keeps its blocks, unless a device
    /// synchronize proves it done.
    pub(crate) fn settle(&self, heap: &mut impl Heaps, keep: Option<LaneId>) {
        for (i, s) in self.streams.iter() {
            let lane = LaneId(i);
            if Some(lane) == keep || heap.lane_free_total(lane) == 0 {
                continue;
            }
            if s.held.idle_or_synced() {
                heap.move_lane_all(lane, LaneId::GLOBAL);
            }
        }
    }

    /// Waits for every stream with free blocks and moves all of them to the
    /// global lane (every heap); then forgets streams only the pool still
    /// references. A stream that cannot be waited for, nor the device in its
    /// place, keeps its blocks (its work may still use them); the others
    /// move, and the first error is returned.
    pub(crate) fn settle_blocking(&mut self, heap: &mut impl Heaps) -> Result<()> {
        let mut device_synced = false;
        let mut first_err = None;
        for (i, s) in self.streams.iter() {
            let lane = LaneId(i);
            if heap.lane_free_total(lane) == 0 {
                continue;
            }
            if !device_synced && !s.held.synchronize() {
                match synchronize_device(s.held.device()) {
                    Ok(()) => device_synced = true,
                    Err(e) => {
                        first_err.get_or_insert(e);
                        continue;
                    }
                }
            }
            heap.move_lane_all(lane, LaneId::GLOBAL);
        }
        self.forget_dropped_streams(heap);
        first_err.map_or(Ok(()), Err)
    }

    /// Moves the free blocks of each stream its users dropped that a query
    /// finds idle to the global lane: [`HeapLanes::settle`] of those
    /// streams only, with no device synchronization.
    fn settle_dropped(&self, heap: &mut impl Heaps) {
        for (i, s) in self.streams.iter() {
            let lane = LaneId(i);
            if s.held.is_dropped()
                && heap.lane_free_total(lane) != 0
                && s.held.query() == Progress::Idle
            {
                heap.move_lane_all(lane, LaneId::GLOBAL);
            }
        }
    }

    /// [`HeapLanes::settle`] of every lane, then
    /// [`HeapLanes::forget_dropped_streams`]: what a trim does, never
    /// blocking (but for a stream the driver cannot tell of, as `settle`).
    pub(crate) fn settle_and_forget(&mut self, heap: &mut impl Heaps) {
        self.settle(heap, None);
        self.forget_dropped_streams(heap);
    }

    /// Drops lanes that hold nothing and whose stream only the pool still
    /// references, so user-dropped streams are finally destroyed.
    pub(crate) fn forget_dropped_streams(&mut self, heap: &mut impl Heaps) {
        self.streams.prune(|i, _| {
            let lane = LaneId(i);
            if heap.lane_free_total(lane) != 0 {
                return false;
            }
            // Empty in every heap, so every drop succeeds and the heaps'
            // lane numbers stay in step.
            let mut dropped = true;
            for h in heap.heaps_mut() {
                dropped &= h.drop_lane(lane).is_ok();
            }
            dropped
        });
    }

    /// Hands the blocks of another stream's lane that has a block of `needed`
    /// bytes in heap number `which` (0 for a single heap) to `lane`, after
    /// making `stream` wait for that stream's work. The wait covers every
    /// block the victim freed, so its lane moves in every heap. Returns
    /// whether blocks moved. A driver error on the way (creating or recording
    /// the event, or the wait) moves nothing and is not an error: stealing is
    /// an optimisation, and the caller goes on to grow instead.
    pub(crate) fn steal(
        &mut self,
        heap: &mut impl Heaps,
        which: usize,
        lane: LaneId,
        stream: &Stream,
        needed: u64,
    ) -> bool {
        let target = &heap.heaps()[which];
        let victim = self.streams.iter().find(|(i, s)| {
            LaneId(*i) != lane && s.held.is_here() && target.largest_free(LaneId(*i)) >= needed
        });
        let Some((victim, s)) = victim else {
            return false;
        };
        // A record without the wait is harmless: the blocks stay the victim's.
        if !matches!(hand_over(&s.held, stream, &self.events), Ok(true)) {
            return false;
        }
        heap.move_lane_all(LaneId(victim), lane);
        true
    }

    /// Waits for the work of every stream with a lane (used before memory
    /// goes back to the driver on drop); falls back to synchronizing `device`.
    pub(crate) fn synchronize_all(&self, device: &Device) {
        let _ = synchronize_each(self.streams.iter().map(|(_, s)| &s.held), device);
    }
}
