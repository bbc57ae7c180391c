//! The streams a pool keeps: its clone of each [`Stream`] that freed memory,
//! the known-idle check and the synchronizations, and what is known of each
//! stream's frees (a [`Watermark`]).
//!
//! Every stream query and stream or device synchronization of the pools is
//! made here.

use std::sync::atomic::{AtomicU64, Ordering};

use super::per_thread::HomeThread;
use crate::device::Device;
use crate::driver::CaptureStatus;
use crate::stream::{Stream, StreamId};
use crate::Result;

/// What one query tells of a stream's work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Everything enqueued so far has run.
    Idle,
    /// Work is still pending.
    Busy,
    /// Another thread's per-thread default stream: it cannot be asked from here.
    NotHere,
    /// The driver could not tell (a foreign stream destroyed under the pool):
    /// only a device synchronize proves its work done.
    Unknown,
}

/// Whether `stream` is capturing a CUDA graph (its work is recorded, not
/// run: querying or synchronizing it would break the capture). Asks the
/// driver only while [`crate::captures`] counts a capture; a stream whose
/// status cannot be read counts as not capturing.
#[inline]
pub(crate) fn capturing(stream: &Stream) -> bool {
    crate::captures::underway()
        && matches!(
            stream.capture_status(),
            Ok(CaptureStatus::Active | CaptureStatus::Invalidated)
        )
}

/// Asks the driver once whether `stream` (a handle of the calling thread) is
/// idle. A capturing stream is busy: what it freed is used by the graph's
/// launches, whose time is not known.
#[inline]
pub(crate) fn query(stream: &Stream) -> Progress {
    if capturing(stream) {
        return Progress::Busy;
    }
    let _relaxed = crate::captures::relaxed_if_underway(stream.device());
    match stream.is_idle() {
        Ok(true) => Progress::Idle,
        Ok(false) => Progress::Busy,
        Err(_) => Progress::Unknown,
    }
}

/// Blocks until all work of `stream` (a handle of the calling thread) is
/// done. A capturing stream cannot be waited for: an error says so.
pub(crate) fn synchronize(stream: &Stream) -> Result<()> {
    if capturing(stream) {
        return Err(crate::Error::InvalidArgument(
            "a stream that is capturing a CUDA graph cannot be waited for (the memory it freed serves the graph's launches)".into(),
        ));
    }
    let _relaxed = crate::captures::relaxed_if_underway(stream.device());
    stream.synchronize()
}

/// Whether the pools' out-of-memory paths may wait for streams or the device
/// now: not while a capture is counted ([`crate::captures`]). CUDA refuses a
/// device synchronization during a capture, and the synchronization of a
/// capturing stream or of one joined to a capture, and each refusal breaks
/// the capture; a wait for other work would stall the capture behind it. So
/// a pool out of memory during a capture takes only what needs no wait
/// (blocks whose streams a query finds idle, memory free already) and
/// otherwise answers out of memory.
#[inline]
pub(crate) fn may_wait() -> bool {
    !crate::captures::underway()
}

/// Blocks until all work on `device` is done: the fallback for streams that
/// cannot be queried or synchronized. Refused while a capture is counted
/// (CUDA refuses it, in any mode, when a stream of the device captures, and
/// the refusal breaks the capture).
pub(crate) fn synchronize_device(device: &Device) -> Result<()> {
    if crate::captures::underway() {
        return Err(crate::Error::InvalidArgument(
            "the device cannot be synchronized while a stream captures a CUDA graph".into(),
        ));
    }
    device.synchronize()
}

/// A pool's clone of a stream that freed memory into it: the stream is not
/// destroyed while its blocks sit free (a user may drop theirs), and its
/// handle stays valid for queries and records. The clone is a
/// [`Stream::pool_handle`], so a stream that several tables or pools hold
/// still counts as dropped once its users' handles are gone.
pub(crate) struct HeldStream {
    stream: Stream,
    /// The id as the handing thread saw it (see [`HomeThread`]).
    id: StreamId,
    home: HomeThread,
}

impl HeldStream {
    pub(crate) fn new(stream: &Stream) -> Self {
        Self {
            stream: stream.pool_handle(),
            id: stream.id(),
            home: HomeThread::of(stream),
        }
    }

    /// The stream-ordering key of the kept stream.
    #[inline]
    pub(crate) fn id(&self) -> StreamId {
        self.id
    }

    /// The kept handle.
    #[inline]
    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }

    pub(crate) fn device(&self) -> &Device {
        self.stream.device()
    }

    /// True when the stream may be queried, recorded on or synchronized from
    /// the calling thread.
    #[inline]
    pub(crate) fn is_here(&self) -> bool {
        self.home.is_current()
    }

    /// The known-idle check: one stream query.
    pub(crate) fn query(&self) -> Progress {
        if !self.is_here() {
            return Progress::NotHere;
        }
        query(&self.stream)
    }

    /// Known idle, or proven done by synchronizing the device when the
    /// driver cannot tell (a stream of another thread is never idle here).
    pub(crate) fn idle_or_synced(&self) -> bool {
        match self.query() {
            Progress::Idle => true,
            Progress::Busy | Progress::NotHere => false,
            Progress::Unknown => synchronize_device(self.device()).is_ok(),
        }
    }

    /// Blocks until the stream's work is done; false when it cannot be
    /// synchronized from here (the caller synchronizes the device).
    pub(crate) fn synchronize(&self) -> bool {
        self.is_here() && synchronize(&self.stream).is_ok()
    }

    /// True when only pools still have the stream (its users dropped every
    /// handle): the pool may forget it once nothing of it is pending.
    pub(crate) fn is_dropped(&self) -> bool {
        self.stream.users_gone()
    }
}

/// Synchronizes each stream, and the device once if any of them cannot be.
pub(crate) fn synchronize_each<'a>(
    streams: impl IntoIterator<Item = &'a HeldStream>,
    device: &Device,
) -> Result<()> {
    let mut device_sync = false;
    for s in streams {
        device_sync |= !s.synchronize();
    }
    if device_sync {
        synchronize_device(device)?;
    }
    Ok(())
}

/// What is known of one stream's frees, on a clock the owner chooses (the
/// stream's own free sequence, or a tick shared by all its streams): the
/// number of the latest free, and the highest known to have run.
#[derive(Debug, Default)]
pub(crate) struct Watermark {
    latest: AtomicU64,
    completed: AtomicU64,
}

impl Watermark {
    /// Nothing freed, everything up to `done` complete.
    pub(crate) fn complete_upto(done: u64) -> Self {
        Self {
            latest: AtomicU64::new(0),
            completed: AtomicU64::new(done),
        }
    }

    /// Numbers `n` new frees on the stream's own sequence; returns the first.
    #[inline]
    pub(crate) fn issue(&self, n: u64) -> u64 {
        self.latest.fetch_add(n, Ordering::AcqRel) + 1
    }

    /// Notes a free numbered `tick` on a shared clock (ticks only grow).
    #[inline]
    pub(crate) fn note(&mut self, tick: u64) {
        *self.latest.get_mut() = tick;
    }

    /// The number of the latest free.
    #[inline]
    pub(crate) fn latest(&self) -> u64 {
        self.latest.load(Ordering::Acquire)
    }

    /// Every free numbered at or below this has run.
    #[inline]
    pub(crate) fn completed(&self) -> u64 {
        self.completed.load(Ordering::Acquire)
    }

    /// True when the free numbered `seq` is known to have run.
    #[inline]
    pub(crate) fn is_complete(&self, seq: u64) -> bool {
        seq <= self.completed()
    }

    /// True when every free so far is known to have run.
    #[inline]
    pub(crate) fn all_complete(&self) -> bool {
        self.latest() <= self.completed()
    }

    /// Raises the completion mark to `seq`.
    pub(crate) fn mark_complete_upto(&self, seq: u64) {
        self.completed.fetch_max(seq, Ordering::AcqRel);
    }

    /// [`Watermark::mark_complete_upto`] for an owner with exclusive access.
    #[inline]
    pub(crate) fn set_complete_upto(&mut self, seq: u64) {
        let c = self.completed.get_mut();
        *c = (*c).max(seq);
    }
}
