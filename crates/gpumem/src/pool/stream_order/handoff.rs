//! Handing memory freed on one stream to another after one event wait, so
//! that the taker need not wait for the freeing stream to go idle.
//!
//! Every stream wait (`cuStreamWaitEvent`) of the pools is made here.

use super::events::{record_new, EventPool, Fence};
use super::streams::HeldStream;
use crate::stream::Stream;
use crate::Result;

/// Makes later work on `taker` wait for all work enqueued on `from` so far:
/// one event recorded on `from`, one wait on `taker`; memory `from` freed
/// until now is then `taker`'s. Returns false (and does nothing) when `from`
/// cannot be recorded on from this thread.
pub(crate) fn hand_over(from: &HeldStream, taker: &Stream, events: &EventPool) -> Result<bool> {
    if !from.is_here()
        || super::streams::capturing(from.stream())
        || super::streams::capturing(taker)
    {
        return Ok(false);
    }
    let ev = record_new(from.stream(), events)?;
    let res = taker.wait_event(&ev);
    // The wait captured the record: the event can be reused at once.
    events.put(ev);
    res.map(|_| true)
}

impl Fence {
    /// Makes later work on `taker` wait for the fenced work, then moves the
    /// fence after `taker`'s work so far: the batch is `taker`'s from now on.
    /// Refused when `taker` captures: a captured wait on an event recorded
    /// outside the capture breaks it.
    pub(crate) fn hand_to(&self, taker: &Stream) -> Result<()> {
        if super::streams::capturing(taker) {
            return Err(crate::Error::InvalidArgument(
                "a capturing stream cannot wait for work outside its capture".into(),
            ));
        }
        taker.wait_event(&self.event)?;
        self.extend(taker)
    }
}
