//! `HeapLanes`: the per-stream lanes of a [`LaneHeap`] (or of several heaps
//! kept in step) and the stream-ordering moves over them (settle, steal,
//! settle-blocking), shared by the pools built on a `LaneHeap`
//! ([`PoolResource`](super::PoolResource), whose small and large heaps share
//! one lane number per stream, and [`VirtualPool`](super::VirtualPool), one
//! `HeapLanes` per address area).
//!
//! Each stream that allocates or frees gets a lane of the heap; blocks freed
//! on stream S go to S's lane, reusable at once by S. They move to the global
//! lane (safe for every stream) when S is found idle by a query (`settle`,
//! never blocking) or synchronized (`settle_blocking`); another stream T takes
//! them after one event recorded on S and one `cuStreamWaitEvent` on T
//! (`steal`). No event on the fast path.

use super::ptr_map::PtrMap;
use crate::device::Device;
use crate::driver::{DevicePtr, STREAM_PER_THREAD};
use crate::resource::LiveBlock;
use crate::stream::{Event, Stream};
use crate::suballoc::{LaneHeap, LaneId};
use crate::{Error, Result};

/// The used blocks of `heaps` as live blocks, in address order, with their
/// sizes as the heaps rounded them (the requested sizes are not recorded).
/// O(blocks).
pub(crate) fn live_blocks<'a>(heaps: impl IntoIterator<Item = &'a LaneHeap>) -> Vec<LiveBlock> {
    let mut out: Vec<LiveBlock> = heaps
        .into_iter()
        .flat_map(|h| h.used_ranges())
        .map(|(addr, size)| LiveBlock {
            address: DevicePtr(addr),
            size: size as usize,
            requested: None,
        })
        .collect();
    out.sort_unstable();
    out
}

/// The size of the used block starting at `ptr` in any of `heaps`.
pub(crate) fn live_block_size<'a>(
    heaps: impl IntoIterator<Item = &'a LaneHeap>,
    ptr: DevicePtr,
) -> Option<usize> {
    heaps
        .into_iter()
        .find_map(|h| h.used_size(ptr.0))
        .map(|s| s as usize)
}

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

struct Lane {
    stream: Stream,
    /// For the per-thread default stream: only its own thread may query it.
    thread: Option<std::thread::ThreadId>,
    /// Recorded on this lane's stream when another stream takes its blocks.
    event: Option<Event>,
}

impl Lane {
    fn queryable_here(&self) -> bool {
        self.thread.is_none_or(|t| t == std::thread::current().id())
    }
}

/// The streams of one [`LaneHeap`] or of heaps kept in step ([`Heaps`]):
/// stream id → lane, lane → stream.
#[derive(Default)]
pub(crate) struct HeapLanes {
    by_stream: PtrMap<LaneId>,
    /// The last stream looked up and its lane (stream ids are never reused).
    last: Option<(u64, LaneId)>,
    /// Lane index → its stream (index 0, the global lane, has none).
    lanes: Vec<Option<Lane>>,
}

impl HeapLanes {
    /// No lanes yet (the heap's global lane needs no entry).
    pub(crate) fn new() -> Self {
        Self {
            by_stream: PtrMap::default(),
            last: None,
            lanes: vec![None],
        }
    }

    /// Streams with a lane.
    pub(crate) fn len(&self) -> usize {
        self.by_stream.len()
    }

    /// The lane of `stream`, created on first use (in every heap).
    #[inline]
    pub(crate) fn lane_of(&mut self, heaps: &mut impl Heaps, stream: &Stream) -> Result<LaneId> {
        match self.last {
            Some((last, lane)) if last == stream.id().0 => Ok(lane),
            _ => self.lane_of_slow(heaps, stream),
        }
    }

    /// [`HeapLanes::lane_of`] for a stream other than the last one seen.
    #[cold]
    fn lane_of_slow(&mut self, heaps: &mut impl Heaps, stream: &Stream) -> Result<LaneId> {
        let id = stream.id().0;
        if let Some(&lane) = self.by_stream.get(&id) {
            self.last = Some((id, lane));
            return Ok(lane);
        }
        let lane = create_lane(heaps.heaps_mut())?;
        let idx = lane.0 as usize;
        if self.lanes.len() <= idx {
            self.lanes.resize_with(idx + 1, || None);
        }
        self.lanes[idx] = Some(Lane {
            stream: stream.clone(),
            thread: (stream.raw() == STREAM_PER_THREAD).then(|| std::thread::current().id()),
            event: None,
        });
        self.by_stream.insert(id, lane);
        Ok(lane)
    }

    /// Moves the free blocks of every lane whose stream is known idle to the
    /// global lane (except `keep`), in every heap. Never blocks, never fails:
    /// a stream that cannot be queried keeps its blocks, unless a device
    /// synchronize proves it done.
    pub(crate) fn settle(&self, heap: &mut impl Heaps, keep: Option<LaneId>) {
        for idx in 1..self.lanes.len() {
            let lane = LaneId(idx as u32);
            if Some(lane) == keep || heap.lane_free_total(lane) == 0 {
                continue;
            }
            let Some(l) = &self.lanes[idx] else { continue };
            if !l.queryable_here() {
                continue;
            }
            let idle = match l.stream.is_idle() {
                Ok(idle) => idle,
                // A foreign stream that can no longer be queried: make sure.
                Err(_) => l.stream.device().synchronize().is_ok(),
            };
            if idle {
                heap.move_lane_all(lane, LaneId::GLOBAL);
            }
        }
    }

    /// Waits for every stream with free blocks and moves all of them to the
    /// global lane (every heap); then forgets streams only the pool still
    /// references.
    pub(crate) fn settle_blocking(&mut self, heap: &mut impl Heaps) -> Result<()> {
        let mut device_synced = false;
        for idx in 1..self.lanes.len() {
            let lane = LaneId(idx as u32);
            if heap.lane_free_total(lane) == 0 {
                continue;
            }
            let Some(l) = &self.lanes[idx] else { continue };
            if !device_synced {
                let waited = if l.queryable_here() {
                    l.stream.synchronize()
                } else {
                    Err(Error::unsupported("per-thread stream of another thread"))
                };
                if waited.is_err() {
                    l.stream.device().synchronize()?;
                    device_synced = true;
                }
            }
            heap.move_lane_all(lane, LaneId::GLOBAL);
        }
        self.forget_dropped_streams(heap);
        Ok(())
    }

    /// Drops lanes that hold nothing and whose stream only the pool still
    /// references, so user-dropped streams are finally destroyed.
    pub(crate) fn forget_dropped_streams(&mut self, heap: &mut impl Heaps) {
        for idx in 1..self.lanes.len() {
            let lane = LaneId(idx as u32);
            let unused = matches!(&self.lanes[idx], Some(l) if l.stream.is_sole_handle());
            if !unused || heap.lane_free_total(lane) != 0 {
                continue;
            }
            // Empty in every heap, so every drop succeeds and the heaps'
            // lane numbers stay in step.
            let mut dropped = true;
            for h in heap.heaps_mut() {
                dropped &= h.drop_lane(lane).is_ok();
            }
            if !dropped {
                continue;
            }
            if let Some(l) = self.lanes[idx].take() {
                self.by_stream.retain(|_, v| *v != lane);
                if self.last.is_some_and(|(_, l)| l == lane) {
                    self.last = None;
                }
                drop(l);
            }
        }
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
        let victim = (1..self.lanes.len()).map(|i| LaneId(i as u32)).find(|&l| {
            l != lane
                && self.lanes[l.0 as usize]
                    .as_ref()
                    .is_some_and(|x| x.queryable_here())
                && target.largest_free(l) >= needed
        });
        let Some(victim) = victim else {
            return false;
        };
        let l = self.lanes[victim.0 as usize]
            .as_mut()
            .expect("victim has a lane");
        if l.event.is_none() {
            match Event::new(l.stream.device()) {
                Ok(ev) => l.event = Some(ev),
                Err(_) => return false,
            }
        }
        let ev = l.event.as_ref().expect("just made");
        // A record without the wait is harmless: the blocks stay the victim's.
        if ev.record(&l.stream).is_err() || stream.wait_event(ev).is_err() {
            return false;
        }
        heap.move_lane_all(victim, lane);
        true
    }

    /// Waits for the work of every stream with a lane (used before memory
    /// goes back to the driver on drop); falls back to synchronizing `device`.
    pub(crate) fn synchronize_all(&self, device: &Device) {
        let mut device_sync = false;
        for l in self.lanes.iter().flatten() {
            if !l.queryable_here() || l.stream.synchronize().is_err() {
                device_sync = true;
            }
        }
        if device_sync {
            let _ = device.synchronize();
        }
    }
}
