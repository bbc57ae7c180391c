//! `HeapLanes`: the per-stream lanes of a [`LaneHeap`] and the stream-ordering
//! moves over them (settle, steal, settle-blocking), shared by the pools built
//! on a `LaneHeap` ([`PoolResource`](super::PoolResource) and
//! [`VirtualPool`](super::VirtualPool)).
//!
//! Each stream that allocates or frees gets a lane of the heap; blocks freed
//! on stream S go to S's lane, reusable at once by S. They move to the global
//! lane (safe for every stream) when S is found idle by a query (`settle`,
//! never blocking) or synchronized (`settle_blocking`); another stream T takes
//! them after one event recorded on S and one `cuStreamWaitEvent` on T
//! (`steal`). No event on the fast path.

use super::stream_lanes::PtrMap;
use crate::device::Device;
use crate::driver::STREAM_PER_THREAD;
use crate::stream::{Event, Stream};
use crate::suballoc::{LaneHeap, LaneId};
use crate::{Error, Result};

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

/// The streams of one [`LaneHeap`]: stream id → lane, lane → stream.
#[derive(Default)]
pub(crate) struct HeapLanes {
    by_stream: PtrMap<LaneId>,
    /// Lane index → its stream (index 0, the global lane, has none).
    lanes: Vec<Option<Lane>>,
}

impl HeapLanes {
    /// No lanes yet (the heap's global lane needs no entry).
    pub(crate) fn new() -> Self {
        Self {
            by_stream: PtrMap::default(),
            lanes: vec![None],
        }
    }

    /// Streams with a lane.
    pub(crate) fn len(&self) -> usize {
        self.by_stream.len()
    }

    /// The lane of `stream`, created on first use.
    #[inline]
    pub(crate) fn lane_of(&mut self, heap: &mut LaneHeap, stream: &Stream) -> Result<LaneId> {
        let id = stream.id().0;
        if let Some(&lane) = self.by_stream.get(&id) {
            return Ok(lane);
        }
        let lane = heap.create_lane().map_err(|e| {
            Error::InvalidArgument(format!("pool cannot track another stream: {e}"))
        })?;
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
    /// global lane (except `keep`). Never blocks.
    pub(crate) fn settle(&self, heap: &mut LaneHeap, keep: Option<LaneId>) -> Result<()> {
        for idx in 1..self.lanes.len() {
            let lane = LaneId(idx as u32);
            if Some(lane) == keep || heap.lane_free_bytes(lane) == 0 {
                continue;
            }
            let Some(l) = &self.lanes[idx] else { continue };
            if !l.queryable_here() {
                continue;
            }
            let idle = match l.stream.is_idle() {
                Ok(idle) => idle,
                // A foreign stream that can no longer be queried: make sure.
                Err(_) => {
                    l.stream.device().synchronize()?;
                    true
                }
            };
            if idle {
                heap.move_lane(lane, LaneId::GLOBAL)
                    .expect("both lanes exist");
            }
        }
        Ok(())
    }

    /// Waits for every stream with free blocks and moves all of them to the
    /// global lane; then forgets streams only the pool still references.
    pub(crate) fn settle_blocking(&mut self, heap: &mut LaneHeap) -> Result<()> {
        let mut device_synced = false;
        for idx in 1..self.lanes.len() {
            let lane = LaneId(idx as u32);
            if heap.lane_free_bytes(lane) == 0 {
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
            heap.move_lane(lane, LaneId::GLOBAL)
                .expect("both lanes exist");
        }
        self.forget_dropped_streams(heap);
        Ok(())
    }

    /// Drops lanes that hold nothing and whose stream only the pool still
    /// references, so user-dropped streams are finally destroyed.
    pub(crate) fn forget_dropped_streams(&mut self, heap: &mut LaneHeap) {
        for idx in 1..self.lanes.len() {
            let lane = LaneId(idx as u32);
            let unused = matches!(&self.lanes[idx], Some(l) if l.stream.is_sole_handle());
            if unused && heap.lane_free_bytes(lane) == 0 && heap.drop_lane(lane).is_ok() {
                if let Some(l) = self.lanes[idx].take() {
                    self.by_stream.retain(|_, v| *v != lane);
                    drop(l);
                }
            }
        }
    }

    /// Hands the blocks of another stream's lane that has a block of `needed`
    /// bytes to `lane`, after making `stream` wait for that stream's work.
    pub(crate) fn steal(
        &mut self,
        heap: &mut LaneHeap,
        lane: LaneId,
        stream: &Stream,
        needed: u64,
    ) -> Result<bool> {
        let victim = (1..self.lanes.len()).map(|i| LaneId(i as u32)).find(|&l| {
            l != lane
                && self.lanes[l.0 as usize]
                    .as_ref()
                    .is_some_and(|x| x.queryable_here())
                && heap.largest_free(l) >= needed
        });
        let Some(victim) = victim else {
            return Ok(false);
        };
        let l = self.lanes[victim.0 as usize]
            .as_mut()
            .expect("victim has a lane");
        if l.event.is_none() {
            l.event = Some(Event::new(l.stream.device())?);
        }
        let ev = l.event.as_ref().expect("just made");
        ev.record(&l.stream)?;
        stream.wait_event(ev)?;
        heap.move_lane(victim, lane).expect("both lanes exist");
        Ok(true)
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
