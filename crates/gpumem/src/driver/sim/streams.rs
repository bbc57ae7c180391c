//! Streams, events and stream order.
//!
//! Every stream is a FIFO queue of operations with a position counter: the
//! n-th operation enqueued has position n, and a queue has completed the first
//! `completed` of them. By default an operation runs the moment it is
//! enqueued (an infinitely fast GPU); a held queue keeps new work pending
//! until released or completed, and a queue whose head waits on an event
//! record of an unfinished queue stays pending until that record completes.
//! An event record is just (queue, position): complete once the queue has run
//! that far. A destroyed stream's queue lives on until it drains (a held one
//! stays held: the test controls still accept its handle).
//!
//! The legacy default stream (handles 0 and `CU_STREAM_LEGACY`) is one queue
//! per device; `CU_STREAM_PER_THREAD` is one queue per device and OS thread.
//! The legacy stream's implicit synchronization with blocking streams is not
//! modelled: all streams behave as non-blocking (a queue remembers whether it
//! is blocking only for the stream-capture rules, see `capture`).
//!
//! A capturing queue (see `capture`) runs nothing: `enqueue` hands its work to
//! the capture, and event records on it capture the stream's dependencies
//! instead of a position.
//!
//! Costs: enqueueing on an idle, unheld queue runs the operation at once, O(1)
//! plus the operation; when some queue has pending work, every enqueue also
//! tries to advance the pending queues (O(pending queues)). The ordering oracle
//! walks pending waits, O(waits) per query.

use std::collections::{HashMap, VecDeque};

use super::capture::CaptureId;
use super::faults::{drv, INVALID_CONTEXT, INVALID_HANDLE};
use super::memory::Addr;
use super::{Ctx, State};
use crate::driver::{RawEvent, RawStream, STREAM_LEGACY, STREAM_PER_THREAD};
use crate::Result;

/// Internal queue identity (never reused).
pub(super) type QueueId = u64;

/// An operation on a queue (or a node of a captured graph).
#[derive(Debug, Clone)]
pub(super) enum Op {
    /// `cuMemsetD8Async`.
    Memset { dst: u64, value: u8, len: u64 },
    /// Any copy.
    Copy { dst: Addr, src: Addr, len: u64 },
    /// An event record or the completion of an asynchronous allocation or a
    /// prefetch: nothing to do but mark a position.
    Marker,
    /// Waits until `queue` has completed `pos` operations.
    Wait { queue: QueueId, pos: u64 },
    /// `cuMemFreeAsync` of the pool block at this address.
    PoolFree { addr: u64 },
}

/// One stream's queue.
#[derive(Debug)]
pub(super) struct Queue {
    pub(super) device: u32,
    pending: VecDeque<(u64, Op)>,
    /// Operations enqueued so far.
    pub(super) enqueued: u64,
    /// Operations run so far (a prefix of the enqueued ones).
    pub(super) completed: u64,
    pub(super) held: bool,
    pub(super) destroyed: bool,
    /// Whether the stream synchronizes with the legacy stream (only the
    /// capture rules look at it).
    pub(super) blocking: bool,
    /// The capture this queue records into, if it is capturing.
    pub(super) capture: Option<CaptureId>,
    /// Pending waits as (own position, source queue, source position), in
    /// position order; a wait leaves the list when it runs.
    waits: VecDeque<(u64, QueueId, u64)>,
}

impl Queue {
    pub(super) fn new(device: u32, blocking: bool) -> Self {
        Queue {
            device,
            pending: VecDeque::new(),
            enqueued: 0,
            completed: 0,
            held: false,
            destroyed: false,
            blocking,
            capture: None,
            waits: VecDeque::new(),
        }
    }

    /// Operations enqueued and not yet run.
    pub(super) fn pending_len(&self) -> usize {
        self.pending.len()
    }
}

/// An event's latest record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Record {
    /// Never recorded: queries say complete, waits do nothing.
    Never,
    /// Recorded on a running queue: complete once it has run this far.
    At(QueueId, u64),
    /// Recorded on a capturing stream: the nodes the stream's next work would
    /// have depended on (what a wait on it joins).
    Captured(CaptureId, Vec<usize>),
}

/// An event: its latest record.
#[derive(Debug)]
pub(super) struct EventState {
    pub(super) device: u32,
    pub(super) record: Record,
}

impl State {
    /// The queue a stream handle names, from the calling thread's point of view.
    pub(super) fn queue_of(
        &mut self,
        stream: RawStream,
        ctx: Ctx,
        call: &'static str,
    ) -> Result<QueueId> {
        match stream {
            0 | STREAM_LEGACY => self
                .devices
                .get(ctx.device as usize)
                .map(|d| d.legacy)
                .ok_or_else(|| drv(call, INVALID_CONTEXT)),
            STREAM_PER_THREAD => {
                if ctx.device as usize >= self.devices.len() {
                    return Err(drv(call, INVALID_CONTEXT));
                }
                if let Some(&q) = self.per_thread.get(&(ctx.device, ctx.thread)) {
                    return Ok(q);
                }
                let q = self.new_queue(ctx.device, true);
                self.per_thread.insert((ctx.device, ctx.thread), q);
                Ok(q)
            }
            h => self
                .streams
                .get(&h)
                .copied()
                .ok_or_else(|| drv(call, INVALID_HANDLE)),
        }
    }

    /// A new empty queue on `device`.
    pub(super) fn new_queue(&mut self, device: u32, blocking: bool) -> QueueId {
        let id = self.fresh_id();
        self.queues.insert(id, Queue::new(device, blocking));
        id
    }

    /// Whether `q` is a device's legacy default stream.
    pub(super) fn is_legacy(&self, q: QueueId) -> bool {
        self.queues
            .get(&q)
            .and_then(|x| self.devices.get(x.device as usize))
            .is_some_and(|d| d.legacy == q)
    }

    /// The device of a queue.
    pub(super) fn queue_device(&self, q: QueueId) -> u32 {
        self.queues.get(&q).map_or(0, |q| q.device)
    }

    /// Whether `queue` has completed its first `pos` operations (a queue that
    /// is gone has completed everything).
    pub(super) fn reached(&self, queue: QueueId, pos: u64) -> bool {
        self.queues.get(&queue).is_none_or(|q| q.completed >= pos)
    }

    fn ready(&self, op: &Op) -> bool {
        match op {
            Op::Wait { queue, pos } => self.reached(*queue, *pos),
            _ => true,
        }
    }

    /// Enqueues `op` on `q` and returns its position; runs it (and whatever it
    /// unblocks) at once unless the queue is held or busy. On a capturing
    /// queue the capture records it instead (position 0).
    pub(super) fn enqueue(&mut self, q: QueueId, op: Op) -> u64 {
        let ready = self.ready(&op);
        let Some(queue) = self.queues.get_mut(&q) else {
            return 0;
        };
        if let Some(c) = queue.capture {
            self.capture_node(c, q, op);
            return 0;
        }
        queue.enqueued += 1;
        let pos = queue.enqueued;
        if let Op::Wait { queue: src, pos: p } = op {
            if !ready {
                queue.waits.push_back((pos, src, p));
            }
        }
        if !queue.held && queue.pending.is_empty() && ready {
            queue.completed = pos;
            let device = queue.device;
            self.exec(q, device, pos, op);
        } else {
            queue.pending.push_back((pos, op));
            self.busy.insert(q);
        }
        self.pump();
        pos
    }

    /// Runs one operation whose turn has come.
    fn exec(&mut self, q: QueueId, device: u32, pos: u64, op: Op) {
        match op {
            Op::Memset { dst, value, len } => self.exec_memset(dst, value, len, device),
            Op::Copy { dst, src, len } => self.exec_copy(dst, src, len, device),
            Op::Marker => {}
            Op::Wait { .. } => {
                if let Some(queue) = self.queues.get_mut(&q) {
                    if queue.waits.front().is_some_and(|w| w.0 == pos) {
                        queue.waits.pop_front();
                    }
                }
            }
            Op::PoolFree { addr } => self.exec_pool_free(addr),
        }
    }

    /// Runs the head of `q` if it may run (ignoring holds when `force`).
    /// Returns whether it ran.
    fn step(&mut self, q: QueueId, force: bool) -> bool {
        let Some(queue) = self.queues.get(&q) else {
            return false;
        };
        if queue.held && !force {
            return false;
        }
        let Some((_, op)) = queue.pending.front() else {
            return false;
        };
        if !self.ready(op) {
            return false;
        }
        let queue = self.queues.get_mut(&q).expect("checked above");
        let (pos, op) = queue.pending.pop_front().expect("checked above");
        queue.completed = pos;
        let device = queue.device;
        self.exec(q, device, pos, op);
        self.tidy(q);
        true
    }

    /// Forgets a queue that is drained; drops a destroyed one.
    fn tidy(&mut self, q: QueueId) {
        if let Some(queue) = self.queues.get(&q) {
            if queue.pending.is_empty() {
                self.busy.remove(&q);
                if queue.destroyed {
                    self.gone.insert(q, queue.enqueued);
                    self.queues.remove(&q);
                }
            }
        }
    }

    /// Advances every unheld queue as far as it can go.
    pub(super) fn pump(&mut self) {
        if self.busy.is_empty() || self.pumping {
            return;
        }
        self.pumping = true;
        loop {
            let mut progress = false;
            let busy: Vec<QueueId> = self.busy.iter().copied().collect();
            for q in busy {
                while self.step(q, false) {
                    progress = true;
                }
            }
            if !progress {
                break;
            }
        }
        self.pumping = false;
    }

    /// Runs `q` up to position `upto`, held or not, first running whatever
    /// other queues' work its waits need (as a GPU eventually would).
    pub(super) fn force(&mut self, q: QueueId, upto: u64) {
        // An explicit stack instead of recursion: (queue, position) goals.
        let mut goals = vec![(q, upto)];
        while let Some(&(g, p)) = goals.last() {
            if self.reached(g, p) {
                goals.pop();
                continue;
            }
            let head = self.queues.get(&g).and_then(|x| x.pending.front());
            match head {
                Some((_, Op::Wait { queue, pos })) if !self.reached(*queue, *pos) => {
                    // Waits only name records made before them, so this
                    // cannot cycle.
                    goals.push((*queue, *pos));
                }
                Some(_) => {
                    if !self.step(g, true) {
                        goals.pop();
                    }
                }
                None => {
                    goals.pop();
                }
            }
        }
        self.pump();
    }

    /// Runs all pending work of `q` (and what it depends on).
    pub(super) fn force_all(&mut self, q: QueueId) {
        let upto = self.queues.get(&q).map_or(0, |x| x.enqueued);
        self.force(q, upto);
    }

    /// `cuStreamCreate`.
    pub(super) fn stream_create(&mut self, device: u32, non_blocking: bool) -> RawStream {
        let q = self.new_queue(device, !non_blocking);
        let h = self.fresh_handle(super::TAG_STREAM);
        self.streams.insert(h, q);
        h
    }

    /// `cuStreamDestroy`: the queue lives on until its work has run. A held
    /// stream stays held (tests can still complete or release it by handle).
    pub(super) fn stream_destroy(&mut self, stream: RawStream) -> Result<()> {
        let q = self
            .streams
            .remove(&stream)
            .ok_or_else(|| drv("cuStreamDestroy", INVALID_HANDLE))?;
        if let Some(queue) = self.queues.get_mut(&q) {
            queue.destroyed = true;
        }
        self.capture_stream_gone(q);
        self.tidy(q);
        self.pump();
        Ok(())
    }

    /// `cuEventRecord` on a running queue.
    pub(super) fn event_record(&mut self, event: RawEvent, q: QueueId) -> Result<()> {
        if !self.events.contains_key(&event) {
            return Err(drv("cuEventRecord", INVALID_HANDLE));
        }
        let pos = self.enqueue(q, Op::Marker);
        if let Some(e) = self.events.get_mut(&event) {
            e.record = Record::At(q, pos);
        }
        Ok(())
    }

    /// `cuStreamWaitEvent` of a running queue on an event recorded on a
    /// running queue; waiting on a never-recorded event enqueues nothing.
    pub(super) fn stream_wait_event(&mut self, q: QueueId, event: RawEvent) -> Result<()> {
        let e = self
            .events
            .get(&event)
            .ok_or_else(|| drv("cuStreamWaitEvent", INVALID_HANDLE))?;
        if let Record::At(queue, pos) = e.record {
            if queue != q {
                self.enqueue(q, Op::Wait { queue, pos });
            }
        }
        Ok(())
    }

    /// Whether work enqueued on `later` from now on must run after the first
    /// `pos` operations of `earlier` (see [`super::SimDriver::is_ordered_after`]).
    pub(super) fn ordered_after(&self, earlier: QueueId, pos: u64, later: QueueId) -> bool {
        if earlier == later || self.reached(earlier, pos) {
            return true;
        }
        // Best position of each queue known to complete before `later`'s future work.
        let mut seen: HashMap<QueueId, u64> = HashMap::new();
        let mut stack = vec![(later, u64::MAX)];
        while let Some((q, limit)) = stack.pop() {
            let Some(queue) = self.queues.get(&q) else {
                continue;
            };
            for &(own, src, p) in &queue.waits {
                if own > limit {
                    break;
                }
                if src == earlier {
                    if p >= pos {
                        return true;
                    }
                    continue;
                }
                if seen.get(&src).is_none_or(|&s| s < p) {
                    seen.insert(src, p);
                    stack.push((src, p));
                }
            }
        }
        false
    }

    /// Number of live streams created by `cuStreamCreate`.
    pub(super) fn live_streams(&self) -> usize {
        self.streams.len()
    }

    /// Every queue of `device`, for a device-wide synchronize.
    pub(super) fn queues_of_device(&self, device: u32) -> Vec<QueueId> {
        self.queues
            .iter()
            .filter(|(_, q)| q.device == device)
            .map(|(&id, _)| id)
            .collect()
    }
}
