//! Stream-ordering machinery shared by the pools: per-stream free lanes, the
//! per-stream free sequence and its completion watermark, batched events, and
//! the pointer hasher of the live maps.
//!
//! Every stream that frees blocks into a pool gets one [`StreamState`]: a clone
//! of its [`Stream`] (so a stream the user drops stays valid while its blocks
//! sit free), a counter that numbers its frees (`seq`), and `completed`, the
//! highest `seq` known to have run. A free on stream S is pushed onto S's lane
//! of its size class as `(ptr, seq)`; S pops from the back (hottest block, no
//! event: stream order protects it). Lanes stay sorted by `seq` (pushes and
//! pops happen at the back under the class lock), so the front holds the
//! oldest block, and any stream may take it once `front.seq <= completed`.
//!
//! `completed` advances in three ways, none of them per free:
//! - a query finds S idle (`cuStreamQuery`): everything freed before the query
//!   is complete;
//! - a batch event completes: frees are numbered, a batch is the frees since
//!   the last seal, sealing records one event on S (on `process_deferred`, when
//!   a batch grows past `batch_size`, or on a slow path) and remembers the
//!   `seq` it covers;
//! - a blocking path synchronizes S (out of memory, `release`, drop); a
//!   foreign stream whose query fails falls back to `device_synchronize`.
//!
//! A stream T that needs blocks S holds can also wait for them: one event
//! recorded on S, `cuStreamWaitEvent(T, event)`, and S's whole lane moves to
//! T's lane (renumbered as T's frees).
//!
//! The per-thread default stream's handle means a different stream on each
//! thread; its state remembers the thread, and other threads only read events
//! it recorded itself (or synchronize the device).

use std::collections::VecDeque;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::ThreadId;

use crate::device::Device;
use crate::driver::STREAM_PER_THREAD;
use crate::stream::{Event, Stream, StreamId};
use crate::Result;

/// Locks a mutex, recovering the data if a thread panicked while holding it
/// (the pools keep their invariants between statements that can panic only
/// through bugs; failing every later call would leak all memory).
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read-locks, recovering from poisoning (see [`lock`]).
#[inline]
pub(crate) fn read_lock<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-locks, recovering from poisoning (see [`lock`]).
#[inline]
pub(crate) fn write_lock<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}

/// Hasher for device addresses: a folded 64×64→128 multiply (addresses are
/// multiples of 256, so their low bits carry nothing).
#[derive(Default, Clone, Copy)]
pub(crate) struct PtrHasher(u64);

impl Hasher for PtrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let p = ((x ^ self.0) as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_u128);
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
}

/// `HashMap` keyed by device address.
pub(crate) type PtrMap<V> = std::collections::HashMap<u64, V, BuildHasherDefault<PtrHasher>>;

/// Most sealed batches a stream keeps waiting; past it, sealing from the free
/// path is skipped until some complete (a slow path or `process_deferred`
/// seals again).
const MAX_PENDING_BATCHES: usize = 16;

/// One stream that has (or had) free blocks in a pool.
pub(crate) struct StreamState {
    pub(crate) id: StreamId,
    /// Kept so the stream outlives its free blocks.
    pub(crate) stream: Stream,
    /// For the per-thread default stream: the thread whose stream it is.
    thread: Option<ThreadId>,
    /// The `seq` the next free gets (starts at 1).
    next_seq: AtomicU64,
    /// Frees with `seq <= completed` have run.
    completed: AtomicU64,
    /// Highest `seq` covered by a recorded batch event.
    sealed: AtomicU64,
    /// Recorded batch events not yet seen complete, oldest first, with the
    /// `seq` each covers.
    pending: Mutex<VecDeque<(Event, u64)>>,
}

impl StreamState {
    fn new(stream: &Stream) -> Self {
        let thread = (stream.raw() == STREAM_PER_THREAD).then(|| std::thread::current().id());
        Self {
            id: stream.id(),
            stream: stream.clone(),
            thread,
            next_seq: AtomicU64::new(1),
            completed: AtomicU64::new(0),
            sealed: AtomicU64::new(0),
            pending: Mutex::new(VecDeque::new()),
        }
    }

    /// Reserves `n` consecutive sequence numbers and returns the first.
    #[inline]
    pub(crate) fn take_seqs(&self, n: u64) -> u64 {
        self.next_seq.fetch_add(n, Ordering::AcqRel)
    }

    /// True when the free numbered `seq` is known to have run.
    #[inline]
    pub(crate) fn is_complete(&self, seq: u64) -> bool {
        seq <= self.completed.load(Ordering::Acquire)
    }

    /// True when this free's batch is due for sealing.
    #[inline]
    pub(crate) fn batch_full(&self, seq: u64, batch_size: u64) -> bool {
        seq.saturating_sub(self.sealed.load(Ordering::Relaxed)) >= batch_size
    }

    /// True when frees exist that are not known complete.
    pub(crate) fn unsettled(&self) -> bool {
        self.completed.load(Ordering::Acquire) + 1 < self.next_seq.load(Ordering::Acquire)
    }

    /// True when the driver may be asked about this stream from this thread.
    fn queryable_here(&self) -> bool {
        self.thread.is_none_or(|t| t == std::thread::current().id())
    }

    fn mark_complete_upto(&self, seq: u64) {
        self.completed.fetch_max(seq, Ordering::AcqRel);
    }

    /// Advances `completed` without blocking: checks sealed batch events, then
    /// (if frees remain unsettled) whether the stream is idle; with `seal`,
    /// seals the open batch if frees remain unsettled.
    pub(crate) fn poll(&self, events: &EventPool, seal: bool) -> Result<()> {
        {
            let mut pending = lock(&self.pending);
            while let Some((ev, seq)) = pending.front() {
                if !ev.is_complete()? {
                    break;
                }
                self.mark_complete_upto(*seq);
                let (ev, _) = pending.pop_front().expect("front exists");
                events.put(ev);
            }
        }
        if !self.unsettled() || !self.queryable_here() {
            return Ok(());
        }
        let upto = self.next_seq.load(Ordering::Acquire) - 1;
        match self.stream.is_idle() {
            Ok(true) => {
                self.mark_complete_upto(upto);
                let mut pending = lock(&self.pending);
                for (ev, _) in pending.drain(..) {
                    events.put(ev);
                }
                return Ok(());
            }
            Ok(false) => {}
            Err(_) => {
                // A foreign stream that cannot be queried: make sure by
                // synchronizing the whole device.
                self.stream.device().synchronize()?;
                self.mark_complete_upto(upto);
                return Ok(());
            }
        }
        if seal {
            self.seal(events, true)?;
        }
        Ok(())
    }

    /// Records one event covering every free so far (when some are not yet
    /// covered). With `force` false (the free path), skips when too many
    /// batches are already pending and none of them has completed.
    pub(crate) fn seal(&self, events: &EventPool, force: bool) -> Result<()> {
        if !self.queryable_here() {
            return Ok(());
        }
        let mut pending = lock(&self.pending);
        while let Some((ev, seq)) = pending.front() {
            if !ev.is_complete()? {
                break;
            }
            self.mark_complete_upto(*seq);
            let (ev, _) = pending.pop_front().expect("front exists");
            events.put(ev);
        }
        let upto = self.next_seq.load(Ordering::Acquire) - 1;
        if upto <= self.sealed.load(Ordering::Acquire)
            || upto <= self.completed.load(Ordering::Acquire)
        {
            return Ok(());
        }
        if !force && pending.len() >= MAX_PENDING_BATCHES {
            // Push the next attempt one batch further on.
            self.sealed.store(upto, Ordering::Release);
            return Ok(());
        }
        let ev = events.get()?;
        if let Err(e) = ev.record(&self.stream) {
            events.put(ev);
            return Err(e);
        }
        pending.push_back((ev, upto));
        self.sealed.store(upto, Ordering::Release);
        Ok(())
    }

    /// Blocks until every free so far has run.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let upto = self.next_seq.load(Ordering::Acquire) - 1;
        if upto <= self.completed.load(Ordering::Acquire) {
            return Ok(());
        }
        let synced = if self.queryable_here() {
            self.stream.synchronize()
        } else {
            self.stream.device().synchronize()
        };
        if synced.is_err() {
            self.stream.device().synchronize()?;
        }
        self.mark_complete_upto(upto);
        Ok(())
    }

    /// Makes later work on `waiter` wait for every free on this stream so far.
    /// Returns false (and does nothing) when this stream cannot be recorded on
    /// from this thread.
    pub(crate) fn make_wait(&self, waiter: &Stream, events: &EventPool) -> Result<bool> {
        if !self.queryable_here() {
            return Ok(false);
        }
        let ev = events.get()?;
        let res = ev.record(&self.stream).and_then(|_| waiter.wait_event(&ev));
        // The wait captured the record; the event can be reused at once.
        events.put(ev);
        res.map(|_| true)
    }
}

/// Recycled events: creating one costs ~350 ns on an H100
/// (`bench/results/NOTES.md`).
pub(crate) struct EventPool {
    device: Device,
    free: Mutex<Vec<Event>>,
}

impl EventPool {
    fn get(&self) -> Result<Event> {
        if let Some(ev) = lock(&self.free).pop() {
            return Ok(ev);
        }
        Event::new(&self.device)
    }

    fn put(&self, ev: Event) {
        let mut free = lock(&self.free);
        if free.len() < 64 {
            free.push(ev);
        }
    }
}

/// The streams a pool knows, and its event pool.
pub(crate) struct StreamTable {
    states: Mutex<Vec<Arc<StreamState>>>,
    pub(crate) events: EventPool,
}

impl StreamTable {
    pub(crate) fn new(device: Device) -> Self {
        Self {
            states: Mutex::new(Vec::new()),
            events: EventPool {
                device,
                free: Mutex::new(Vec::new()),
            },
        }
    }

    /// The state of `stream`, created on first use.
    pub(crate) fn get(&self, stream: &Stream) -> Arc<StreamState> {
        let id = stream.id();
        let mut states = lock(&self.states);
        if let Some(s) = states.iter().find(|s| s.id == id) {
            return s.clone();
        }
        let s = Arc::new(StreamState::new(stream));
        states.push(s.clone());
        s
    }

    /// A snapshot of the known streams.
    pub(crate) fn all(&self) -> Vec<Arc<StreamState>> {
        lock(&self.states).clone()
    }

    /// Forgets streams no lane refers to any more (dropping the pool's clone
    /// of their `Stream`).
    pub(crate) fn prune(&self) {
        lock(&self.states).retain(|s| Arc::strong_count(s) > 1);
    }

    /// Polls every stream (sealing open batches when `seal`).
    pub(crate) fn poll_all(&self, seal: bool) -> Result<()> {
        let mut first_err = None;
        for s in self.all() {
            if let Err(e) = s.poll(&self.events, seal) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Blocks until every free on every known stream has run.
    pub(crate) fn synchronize_all(&self) -> Result<()> {
        let mut first_err = None;
        for s in self.all() {
            if let Err(e) = s.synchronize() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// One stream's free blocks of one size class, sorted by `seq`.
pub(crate) struct Lane {
    pub(crate) id: StreamId,
    pub(crate) owner: Arc<StreamState>,
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
        table: &StreamTable,
        batch_size: u64,
    ) -> Option<Arc<StreamState>> {
        let id = stream.id();
        let idx = match self.lanes.iter().position(|l| l.id == id) {
            Some(i) => i,
            None => self.new_lane(stream, table),
        };
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
        table: &StreamTable,
    ) {
        let id = stream.id();
        let idx = match self.lanes.iter().position(|l| l.id == id) {
            Some(i) => i,
            None => self.new_lane(stream, table),
        };
        let lane = &mut self.lanes[idx];
        let seq = lane.owner.take_seqs(1);
        lane.free.reserve(n);
        for p in ptrs.rev() {
            lane.free.push_back((p, seq));
        }
        self.count += n;
    }

    fn new_lane(&mut self, stream: &Stream, table: &StreamTable) -> usize {
        let owner = table.get(stream);
        self.lanes.push(Lane {
            id: owner.id,
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
    pub(crate) fn blocked_owners(&self, id: StreamId) -> Vec<Arc<StreamState>> {
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
        table: &StreamTable,
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
        if !self.lanes[victim].owner.make_wait(stream, &table.events)? {
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
