//! Streams whose frees are numbered and fenced in batches: the slab pools'
//! streams ([`FixedSizeResource`](crate::pool::FixedSizeResource),
//! [`CachingPool`](crate::pool::CachingPool) and the bins of
//! [`BinningResource`](crate::pool::BinningResource)), shared by the size
//! classes, each behind its own lock.
//!
//! Every stream that frees blocks gets one [`BatchedStream`]: the pool's
//! clone of it, its free sequence and completion mark (a [`Watermark`]) and
//! its sealed batches. The mark advances in three ways, none of them per
//! free:
//! - a query finds the stream idle: everything freed before the query is
//!   complete;
//! - a batch event completes: a batch is the frees since the last seal;
//!   sealing records one event (on `process_deferred`, when a batch grows
//!   past its size, or on a slow path) covering the sequence so far;
//! - a blocking path synchronizes the stream (out of memory, `release`,
//!   drop); a foreign stream whose query fails falls back to synchronizing
//!   the device.
//!
//! Another thread's per-thread default stream is neither queried nor
//! recorded on: its frees complete through the events its own thread sealed,
//! or a device synchronize.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::events::{Batches, EventPool};
use super::handoff::hand_over;
use super::streams::{synchronize_device, HeldStream, Progress, Watermark};
use super::sync::lock;
use crate::stream::{Stream, StreamId};
use crate::Result;

/// Most sealed batches a stream keeps waiting; past it, sealing from the free
/// path is skipped until some complete (a slow path or `process_deferred`
/// seals again).
const MAX_PENDING_BATCHES: usize = 16;

/// Spare events a table keeps.
const SPARE_EVENTS: usize = 64;

/// One stream that has (or had) free blocks in a pool.
pub(crate) struct BatchedStream {
    pub(crate) held: HeldStream,
    /// Its frees, numbered from 1 on the stream's own sequence.
    frees: Watermark,
    /// Highest number covered by a recorded batch event.
    sealed: AtomicU64,
    batches: Mutex<Batches>,
}

impl BatchedStream {
    fn new(stream: &Stream) -> Self {
        Self {
            held: HeldStream::new(stream),
            frees: Watermark::default(),
            sealed: AtomicU64::new(0),
            batches: Mutex::new(Batches::default()),
        }
    }

    /// The stream's id.
    #[inline]
    pub(crate) fn id(&self) -> StreamId {
        self.held.id()
    }

    /// Numbers `n` consecutive frees and returns the first number.
    #[inline]
    pub(crate) fn take_seqs(&self, n: u64) -> u64 {
        self.frees.issue(n)
    }

    /// True when the free numbered `seq` is known to have run.
    #[inline]
    pub(crate) fn is_complete(&self, seq: u64) -> bool {
        self.frees.is_complete(seq)
    }

    /// True when the batch of the free numbered `seq` is due for sealing.
    #[inline]
    pub(crate) fn batch_full(&self, seq: u64, batch_size: u64) -> bool {
        seq.saturating_sub(self.sealed.load(Ordering::Relaxed)) >= batch_size
    }

    /// Marks complete what the completed batches cover.
    fn poll_batches(&self, batches: &mut Batches, events: &EventPool) -> Result<()> {
        batches.poll(events, |upto| self.frees.mark_complete_upto(upto))
    }

    /// Advances the completion mark without blocking: checks the sealed
    /// batches, then (if frees remain unsettled) whether the stream is idle;
    /// with `seal`, seals the open batch if frees remain unsettled.
    pub(crate) fn poll(&self, events: &EventPool, seal: bool) -> Result<()> {
        self.poll_batches(&mut lock(&self.batches), events)?;
        if self.frees.all_complete() {
            return Ok(());
        }
        let upto = self.frees.latest();
        match self.held.query() {
            Progress::NotHere => return Ok(()),
            Progress::Idle => {
                self.frees.mark_complete_upto(upto);
                lock(&self.batches).forget(events);
                return Ok(());
            }
            Progress::Busy => {}
            Progress::Unknown => {
                synchronize_device(self.held.device())?;
                self.frees.mark_complete_upto(upto);
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
        // A capturing stream records no event that runs now: its frees from
        // before the capture settle by a query once the capture has ended.
        if !self.held.is_here() || super::streams::capturing(self.held.stream()) {
            return Ok(());
        }
        let mut batches = lock(&self.batches);
        self.poll_batches(&mut batches, events)?;
        let upto = self.frees.latest();
        if upto <= self.sealed.load(Ordering::Acquire) || upto <= self.frees.completed() {
            return Ok(());
        }
        if !force && batches.len() >= MAX_PENDING_BATCHES {
            // Push the next attempt one batch further on.
            self.sealed.store(upto, Ordering::Release);
            return Ok(());
        }
        batches.seal(self.held.stream(), upto, events)?;
        self.sealed.store(upto, Ordering::Release);
        Ok(())
    }

    /// Blocks until every free so far has run.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let upto = self.frees.latest();
        if self.frees.is_complete(upto) {
            return Ok(());
        }
        if !self.held.synchronize() {
            synchronize_device(self.held.device())?;
        }
        self.frees.mark_complete_upto(upto);
        Ok(())
    }

    /// Makes later work on `taker` wait for every free on this stream so far
    /// (see [`hand_over`]).
    pub(crate) fn hand_over(&self, taker: &Stream, events: &EventPool) -> Result<bool> {
        hand_over(&self.held, taker, events)
    }
}

/// The streams a pool knows, and its event pool.
pub(crate) struct BatchedStreams {
    states: Mutex<Vec<Arc<BatchedStream>>>,
    pub(crate) events: EventPool,
}

impl Default for BatchedStreams {
    fn default() -> Self {
        Self {
            states: Mutex::new(Vec::new()),
            events: EventPool::new(SPARE_EVENTS),
        }
    }
}

impl BatchedStreams {
    /// The state of `stream`, created on first use.
    pub(crate) fn get(&self, stream: &Stream) -> Arc<BatchedStream> {
        let id = stream.id();
        let mut states = lock(&self.states);
        if let Some(s) = states.iter().find(|s| s.id() == id) {
            return s.clone();
        }
        let s = Arc::new(BatchedStream::new(stream));
        states.push(s.clone());
        s
    }

    /// A snapshot of the known streams.
    fn all(&self) -> Vec<Arc<BatchedStream>> {
        lock(&self.states).clone()
    }

    /// Forgets streams no free list refers to any more (dropping the pool's
    /// clone of their `Stream`).
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
