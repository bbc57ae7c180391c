//! The free blocks of one size class of a slab pool, kept per stream.
//!
//! A free on stream S is pushed onto S's lane as `(ptr, seq)`, `seq` being
//! the free's number on S (see [`BatchedStream`]); S pops from the back
//! (hottest block, no event: stream order protects it). Lanes stay sorted by
//! `seq` (pushes and pops happen at the back under the class lock), so the
//! front holds the oldest block, and any stream may take it once S's
//! completion mark has reached its `seq`. A stream that finds nothing may
//! instead wait for the stream holding most blocks (one event, one
//! `cuStreamWaitEvent`) and take its whole lane, renumbered as its own frees.

use std::collections::VecDeque;
use std::sync::Arc;

use super::batched::{BatchedStream, BatchedStreams};
use crate::stream::{Stream, StreamId};
use crate::Result;

/// One stream's free blocks of one size class, sorted by `seq`.
pub(crate) struct Lane {
    pub(crate) id: StreamId,
    pub(crate) owner: Arc<BatchedStream>,
    pub(crate) free: VecDeque<(u64, u64)>,
}

/// The free blocks of one size class: per-stream lanes plus blocks known free
/// for every stream (`ready`).
#[derive(Default)]
pub(crate) struct FreeBlocks {
    pub(crate) lanes: Vec<Lane>,
    pub(crate) ready: Vec<u64>,
    /// Blocks in lanes and `ready` together.
    pub(crate) count: usize,
}

impl FreeBlocks {
    /// The fast path: a block of `id`'s own lane, else one free for everyone,
    /// else the oldest completed block of another stream. No driver call.
    #[inline]
    pub(crate) fn take(&mut self, id: StreamId) -> Option<u64> {
        for lane in &mut self.lanes {
            if lane.id == id {
                if let Some((p, _)) = lane.free.pop_back() {
                    self.count -= 1;
                    return Some(p);
                }
                break;
            }
        }
        if let Some(p) = self.ready.pop() {
            self.count -= 1;
            return Some(p);
        }
        self.take_completed(id)
    }

    /// A block from `ready` or another stream's completed front.
    pub(crate) fn take_settled(&mut self) -> Option<u64> {
        if let Some(p) = self.ready.pop() {
            self.count -= 1;
            return Some(p);
        }
        self.take_completed(StreamId(u64::MAX))
    }

    fn take_completed(&mut self, id: StreamId) -> Option<u64> {
        for lane in &mut self.lanes {
            if lane.id == id {
                continue;
            }
            if let Some(&(p, seq)) = lane.free.front() {
                if lane.owner.is_complete(seq) {
                    lane.free.pop_front();
                    self.count -= 1;
                    return Some(p);
                }
            }
        }
        None
    }

    /// Pushes a block freed on `stream` (its state looked up in `table` if it
    /// has no lane yet). Returns the stream's state when its open batch has
    /// reached `batch_size` frees and should be sealed.
    #[inline]
    pub(crate) fn push(
        &mut self,
        stream: &Stream,
        ptr: u64,
        table: &BatchedStreams,
        batch_size: u64,
    ) -> Option<Arc<BatchedStream>> {
        let idx = self.lane_index(stream, table);
        let lane = &mut self.lanes[idx];
        let seq = lane.owner.take_seqs(1);
        lane.free.push_back((ptr, seq));
        self.count += 1;
        lane.owner
            .batch_full(seq, batch_size)
            .then(|| lane.owner.clone())
    }

    /// Pushes freshly carved blocks onto `stream`'s lane (as if freed on it
    /// now), in reverse so the lowest address is handed out first.
    pub(crate) fn push_fresh(
        &mut self,
        stream: &Stream,
        ptrs: impl DoubleEndedIterator<Item = u64>,
        n: usize,
        table: &BatchedStreams,
    ) {
        let idx = self.lane_index(stream, table);
        let lane = &mut self.lanes[idx];
        let seq = lane.owner.take_seqs(1);
        lane.free.reserve(n);
        for p in ptrs.rev() {
            lane.free.push_back((p, seq));
        }
        self.count += n;
    }

    /// The index of `stream`'s lane, made on first use.
    #[inline]
    fn lane_index(&mut self, stream: &Stream, table: &BatchedStreams) -> usize {
        let id = stream.id();
        match self.lanes.iter().position(|l| l.id == id) {
            Some(i) => i,
            None => self.new_lane(stream, table),
        }
    }

    fn new_lane(&mut self, stream: &Stream, table: &BatchedStreams) -> usize {
        let owner = table.get(stream);
        self.lanes.push(Lane {
            id: owner.id(),
            owner,
            free: VecDeque::new(),
        });
        self.lanes.len() - 1
    }

    /// Pushes a block no stream uses any more.
    #[inline]
    pub(crate) fn push_ready(&mut self, ptr: u64) {
        self.ready.push(ptr);
        self.count += 1;
    }

    /// Owners of other streams' non-empty lanes whose fronts are not complete.
    pub(crate) fn blocked_owners(&self, id: StreamId) -> Vec<Arc<BatchedStream>> {
        self.lanes
            .iter()
            .filter(|l| l.id != id)
            .filter(|l| {
                l.free
                    .front()
                    .is_some_and(|&(_, seq)| !l.owner.is_complete(seq))
            })
            .map(|l| l.owner.clone())
            .collect()
    }

    /// Moves every completed block to `ready` and drops empty lanes.
    pub(crate) fn settle(&mut self) {
        for lane in &mut self.lanes {
            while let Some(&(p, seq)) = lane.free.front() {
                if !lane.owner.is_complete(seq) {
                    break;
                }
                lane.free.pop_front();
                self.ready.push(p);
            }
        }
        self.lanes.retain(|l| !l.free.is_empty());
    }

    /// Cross-stream reuse by waiting: makes `stream` wait for the stream with
    /// the most blocks of this class and moves that lane to `stream`'s lane.
    /// Returns a block, or `None` when no other stream holds any (or the
    /// holder cannot be waited for from this thread).
    pub(crate) fn steal_by_wait(
        &mut self,
        stream: &Stream,
        table: &BatchedStreams,
    ) -> Result<Option<u64>> {
        let id = stream.id();
        let Some(victim) = self
            .lanes
            .iter()
            .enumerate()
            .filter(|(_, l)| l.id != id && !l.free.is_empty())
            .max_by_key(|(_, l)| l.free.len())
            .map(|(i, _)| i)
        else {
            return Ok(None);
        };
        if !self.lanes[victim].owner.hand_over(stream, &table.events)? {
            return Ok(None);
        }
        let moved: Vec<u64> = self.lanes[victim].free.drain(..).map(|(p, _)| p).collect();
        let n = moved.len();
        self.count -= n;
        self.push_fresh(stream, moved.into_iter().rev(), n, table);
        self.lanes.retain(|l| !l.free.is_empty() || l.id == id);
        Ok(self.take(id))
    }

    /// True when the class has no free block.
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }
}
