//! Events: the pool of recycled events, the sealed batches of a stream's
//! frees ([`Batches`]) and the single re-recorded fence of a batch of memory
//! ([`Fence`]).
//!
//! Every event record and event query of the pools is made here (the waits
//! on events are in `handoff.rs`).

use std::collections::VecDeque;
use std::sync::Mutex;

use super::sync::lock;
use crate::device::Device;
use crate::stream::{Event, Stream};
use crate::Result;

/// Recycled events: creating one is a driver call, dearer than a pool's
/// whole operation (`docs/decisions.md`).
pub(crate) struct EventPool {
    free: Mutex<Vec<Event>>,
    /// Most events kept for reuse.
    keep: usize,
}

impl EventPool {
    /// A pool that keeps at most `keep` spare events.
    pub(crate) fn new(keep: usize) -> Self {
        Self {
            free: Mutex::new(Vec::new()),
            keep,
        }
    }

    /// A spare event, or a new one on `device`.
    pub(crate) fn get(&self, device: &Device) -> Result<Event> {
        if let Some(ev) = lock(&self.free).pop() {
            return Ok(ev);
        }
        Event::new(device)
    }

    /// Takes back an event whose last record is complete (or was waited on).
    pub(crate) fn put(&self, ev: Event) {
        let mut free = lock(&self.free);
        if free.len() < self.keep {
            free.push(ev);
        }
    }

    /// Drops every spare event.
    pub(crate) fn clear(&self) {
        lock(&self.free).clear();
    }
}

/// An event from `events`, recorded at the current end of `stream`.
/// Refused on a capturing stream: the record would belong to the capture,
/// and querying it would break the capture.
pub(crate) fn record_new(stream: &Stream, events: &EventPool) -> Result<Event> {
    refuse_capturing(stream)?;
    let ev = events.get(stream.device())?;
    match ev.record(stream) {
        Ok(()) => Ok(ev),
        Err(e) => {
            events.put(ev);
            Err(e)
        }
    }
}

fn refuse_capturing(stream: &Stream) -> Result<()> {
    if super::streams::capturing(stream) {
        return Err(crate::Error::InvalidArgument(
            "no event is recorded on a stream that is capturing a CUDA graph".into(),
        ));
    }
    Ok(())
}

/// A stream's sealed batches: one event recorded per batch, each with the
/// number of the latest free (or copy) it covers, oldest first.
#[derive(Default)]
pub(crate) struct Batches {
    queue: VecDeque<(Event, u64)>,
}

impl Batches {
    /// Batches not yet seen complete.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Seals a batch covering everything up to `upto`: one event recorded on
    /// `stream`.
    pub(crate) fn seal(&mut self, stream: &Stream, upto: u64, events: &EventPool) -> Result<()> {
        let ev = record_new(stream, events)?;
        self.queue.push_back((ev, upto));
        Ok(())
    }

    /// Drops the completed batches from the front (an event query each, up
    /// to the first busy one), calling `done` with the number each covers.
    /// A failed query stops there, after the batches found complete.
    pub(crate) fn poll(&mut self, events: &EventPool, mut done: impl FnMut(u64)) -> Result<()> {
        let Some((first, _)) = self.queue.front() else {
            return Ok(());
        };
        let _relaxed = crate::captures::relaxed_if_underway(first.device());
        while let Some((ev, upto)) = self.queue.front() {
            if !ev.is_complete()? {
                break;
            }
            done(*upto);
            let (ev, _) = self.queue.pop_front().expect("front exists");
            events.put(ev);
        }
        Ok(())
    }

    /// Blocks until the latest batch is complete; returns the number it
    /// covers (`None` when none was sealed).
    pub(crate) fn wait_all(&mut self, events: &EventPool) -> Result<Option<u64>> {
        let Some((ev, upto)) = self.queue.back() else {
            return Ok(None);
        };
        {
            let _relaxed = crate::captures::relaxed_if_underway(ev.device());
            ev.synchronize()?;
        }
        let upto = *upto;
        self.forget(events);
        Ok(Some(upto))
    }

    /// Blocks until the batches covering everything up to `upto` are
    /// complete (the first batch covering `upto`, and so those before it).
    pub(crate) fn wait_for(&mut self, upto: u64, events: &EventPool) -> Result<()> {
        let Some(i) = self.queue.iter().position(|&(_, u)| u >= upto) else {
            return Ok(());
        };
        {
            let ev = &self.queue[i].0;
            let _relaxed = crate::captures::relaxed_if_underway(ev.device());
            ev.synchronize()?;
        }
        for (ev, _) in self.queue.drain(..=i) {
            events.put(ev);
        }
        Ok(())
    }

    /// Forgets every batch (the stream was found idle or synchronized).
    pub(crate) fn forget(&mut self, events: &EventPool) {
        for (ev, _) in self.queue.drain(..) {
            events.put(ev);
        }
    }
}

/// One event fencing a batch of memory freed on a stream, re-recorded as the
/// batch grows (one event per batch, never one per free).
pub(crate) struct Fence {
    pub(super) event: Event,
}

impl Fence {
    /// A fence after the work enqueued on `stream` so far.
    pub(crate) fn new(stream: &Stream, events: &EventPool) -> Result<Self> {
        record_new(stream, events).map(|event| Self { event })
    }

    /// Moves the fence after the work enqueued on `stream` so far.
    pub(crate) fn extend(&self, stream: &Stream) -> Result<()> {
        refuse_capturing(stream)?;
        self.event.record(stream)
    }

    /// True when the fenced work is known done (an event query; a failed
    /// query counts as not done).
    pub(crate) fn has_passed(&self) -> bool {
        let _relaxed = crate::captures::relaxed_if_underway(self.event.device());
        matches!(self.event.is_complete(), Ok(true))
    }

    /// Gives the event back to `events` (the fence has passed, or the device
    /// was synchronized).
    pub(crate) fn recycle(self, events: &EventPool) {
        events.put(self.event);
    }
}
