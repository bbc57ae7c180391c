//! Streams and events: safe owners over the driver's raw handles.
//!
//! Every [`Stream`] has a [`StreamId`], the key pools use for stream-ordered
//! reuse. Ids are unique for the life of the process and never reused, so a
//! block freed on a stream that has since been destroyed can never be mistaken
//! for a block of a newer stream that happens to get the same raw handle. The
//! two legacy default handles (0 and `CU_STREAM_LEGACY`) share one id; the
//! per-thread default stream resolves to a different id on each thread.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::device::Device;
use crate::driver::{
    CaptureInfo, CaptureMode, CaptureStatus, DevicePtr, Driver, RawEvent, RawGraphNode, RawStream,
    STREAM_LEGACY, STREAM_PER_THREAD,
};
use crate::graph::Graph;
use crate::Result;

/// Process-unique identity of a stream, used as the stream-ordering key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The legacy default stream of any device.
    pub const LEGACY: StreamId = StreamId(1);
}

static NEXT_ID: AtomicU64 = AtomicU64::new(16);

fn fresh_id() -> StreamId {
    StreamId(NEXT_ID.fetch_add(1, Ordering::Relaxed))
}

thread_local! {
    static PER_THREAD_ID: StreamId = fresh_id();
}

/// The stream's handle and who answers for it. `raw` is live (see
/// [`crate::driver`]) as long as this is: a default stream always is; one
/// made by [`Stream::create`] is destroyed only when this drops; a foreign
/// one is kept alive by `_keep` or by the promise of [`Stream::from_raw`].
/// Every driver call below that passes `raw` rests on that.
struct StreamInner {
    device: Device,
    raw: RawStream,
    id: StreamId,
    owned: bool,
    /// What keeps a foreign stream alive while the wrapper is (cudarc's
    /// stream, for [`crate::interop::stream_from_cudarc`]).
    _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// Handles of the stream other than the pools' own
    /// ([`Stream::pool_handle`]): while one is left, someone may still
    /// enqueue work on the stream.
    users: AtomicUsize,
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        drop(crate::captures::ended(self.device.driver(), self.raw));
        // Work already enqueued still completes.
        if self.owned {
            let (driver, raw) = (self.device.driver(), self.raw);
            crate::exit::give_back(
                || format!("stream {raw:#x}"),
                // SAFETY: `Stream::create` made this stream and only this,
                // the last owner, destroys it; nothing uses it afterwards.
                || unsafe { driver.stream_destroy(raw) },
            );
        }
    }
}

/// A CUDA stream of one device. Clones share the stream; a stream made by
/// [`Stream::create`] is destroyed when the last clone drops.
pub struct Stream {
    inner: Arc<StreamInner>,
    /// Counted in the stream's users: every handle but a pool's own.
    user: bool,
}

impl Clone for Stream {
    fn clone(&self) -> Self {
        self.inner.users.fetch_add(1, Ordering::Relaxed);
        Self {
            inner: self.inner.clone(),
            user: true,
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.user {
            self.inner.users.fetch_sub(1, Ordering::Release);
        }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("raw", &format_args!("{:#x}", self.inner.raw))
            .field("id", &self.id().0)
            .field("device", &self.inner.device.ordinal())
            .finish()
    }
}

impl Stream {
    fn make(device: Device, raw: RawStream, id: StreamId, owned: bool) -> Self {
        Self::new_inner(StreamInner {
            device,
            raw,
            id,
            owned,
            _keep: None,
            users: AtomicUsize::new(1),
        })
    }

    /// The first handle of a stream.
    fn new_inner(inner: StreamInner) -> Self {
        Self {
            inner: Arc::new(inner),
            user: true,
        }
    }

    /// The legacy default stream of `device`.
    pub fn legacy(device: Device) -> Self {
        Self::make(device, 0, StreamId::LEGACY, false)
    }

    /// The per-thread default stream of `device` (its id depends on the calling thread).
    pub fn per_thread(device: Device) -> Self {
        Self::make(device, STREAM_PER_THREAD, StreamId(0), false)
    }

    /// Creates a new non-blocking stream on `device`.
    pub fn create(device: Device) -> Result<Self> {
        let raw = device.driver().stream_create(device.ordinal(), true)?;
        Ok(Self::make(device, raw, fresh_id(), true))
    }

    /// Wraps a stream handle gpumem does not own (for interop with other
    /// libraries). It is never destroyed by gpumem. Each wrap gets a fresh id, so
    /// keep one wrapper per foreign stream to get same-stream reuse in pools.
    ///
    /// # Safety
    /// `raw` is 0, `CU_STREAM_LEGACY`, `CU_STREAM_PER_THREAD` or a stream of
    /// `device`'s driver and context that stays alive while the wrapper or a
    /// clone of it is used, and while memory freed on it may sit in a pool:
    /// the driver takes a handle for a pointer to its own structures, and a
    /// destroyed one can corrupt the process.
    pub unsafe fn from_raw(device: Device, raw: RawStream) -> Self {
        Self::wrap(device, raw, None)
    }

    /// Wraps `raw`, keeping `keep` (the stream's owner) alive as long as the
    /// wrapper. Callers in the crate uphold [`Stream::from_raw`]'s contract,
    /// where `keep` alive keeps the stream alive.
    pub(crate) fn wrap(
        device: Device,
        raw: RawStream,
        keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
    ) -> Self {
        if let Some(keep) = keep {
            return Self::new_inner(StreamInner {
                device,
                raw,
                id: fresh_id(),
                owned: false,
                _keep: Some(keep),
                users: AtomicUsize::new(1),
            });
        }
        match raw {
            0 | STREAM_LEGACY => Self::legacy(device),
            STREAM_PER_THREAD => Self::per_thread(device),
            _ => Self::make(device, raw, fresh_id(), false),
        }
    }

    /// The stream-ordering key of this stream (see the module documentation).
    #[inline]
    pub fn id(&self) -> StreamId {
        if self.inner.raw == STREAM_PER_THREAD {
            PER_THREAD_ID.with(|id| *id)
        } else {
            self.inner.id
        }
    }

    /// The raw handle, for passing to the driver or other libraries.
    #[inline]
    pub fn raw(&self) -> RawStream {
        self.inner.raw
    }

    /// The raw handle, for a call on `device`'s driver, which must be this
    /// stream's: another driver's handle means nothing there (the simulator
    /// refuses it; to the CUDA driver it would be a pointer to follow).
    /// [`crate::Error::InvalidArgument`] when the drivers differ.
    pub(crate) fn raw_on(&self, device: &Device) -> Result<RawStream> {
        if self.inner.device.same_driver(device) {
            Ok(self.inner.raw)
        } else {
            Err(other_driver("stream", self.inner.raw))
        }
    }

    /// True when no other clone of this handle exists.
    pub fn is_sole_handle(&self) -> bool {
        Arc::strong_count(&self.inner) == 1
    }

    /// A handle for a pool's own tables: it keeps the stream alive (its
    /// handle valid for queries, records and waits) without counting as a
    /// user, so that a pool, or several, or several tables of one pool, can
    /// tell when every user handle is gone ([`Stream::users_gone`]). A clone
    /// of it is a user handle.
    pub(crate) fn pool_handle(&self) -> Stream {
        Self {
            inner: self.inner.clone(),
            user: false,
        }
    }

    /// True when only pools' handles ([`Stream::pool_handle`]) are left:
    /// no one can enqueue work on the stream any more, so a pool may let go
    /// of it once the work already enqueued is known done. Exact, not a
    /// guess from a reference count that the pools' own clones blur: every
    /// user handle counts until it drops.
    pub(crate) fn users_gone(&self) -> bool {
        self.inner.users.load(Ordering::Acquire) == 0
    }

    /// The device this stream belongs to.
    #[inline]
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Blocks until all work on the stream is complete.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live while `self` is (see `StreamInner`).
        unsafe { self.driver().stream_synchronize(self.inner.raw) }
    }

    /// True when all work enqueued so far is complete.
    pub fn is_idle(&self) -> Result<bool> {
        // SAFETY: the handle is live while `self` is (see `StreamInner`).
        unsafe { self.driver().stream_query(self.inner.raw) }
    }

    /// Makes later work on this stream wait for `event`'s last record.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        if !event.device.same_driver(self.device()) {
            return Err(other_driver("event", event.raw));
        }
        // SAFETY: both handles are live while their owners, borrowed here,
        // are (see `StreamInner` and `Event`), and of this driver (checked).
        unsafe { self.driver().stream_wait_event(self.inner.raw, event.raw) }
    }

    /// Prefetches managed memory to `device` in this stream's order
    /// (`cuMemPrefetchAsync`, see [`Driver::mem_prefetch`]); the device's
    /// driver must be the stream's.
    pub(crate) fn prefetch(&self, ptr: DevicePtr, bytes: usize, device: &Device) -> Result<()> {
        let s = self.raw_on(device)?;
        // SAFETY: the handle is live while `self` is (see `StreamInner`) and
        // of this driver (`raw_on` checked); the range needs no promise (the
        // driver checks it, and a prefetch keeps the bytes).
        unsafe {
            device
                .driver()
                .mem_prefetch(ptr, bytes, device.ordinal(), s)
        }
    }

    /// The driver of the stream's device.
    fn driver(&self) -> &dyn Driver {
        &**self.inner.device.driver()
    }

    /// Begins a capture (`cuStreamBeginCapture`): from now on, work enqueued
    /// on this stream, and on streams that wait on events recorded on it, is
    /// recorded into a graph instead of run, until [`Stream::end_capture`].
    /// `mode` says which calls the capture forbids meanwhile (see
    /// [`CaptureMode`]); [`CaptureMode::Global`] is CUDA's and PyTorch's
    /// default. The legacy default stream cannot capture.
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        // SAFETY: the handle is live while `self` is (see `StreamInner`).
        unsafe { self.driver().stream_begin_capture(self.inner.raw, mode) }?;
        crate::captures::began(self);
        Ok(())
    }

    /// Ends the capture begun on this stream and returns its graph
    /// (`cuStreamEndCapture`), which keeps alive the memory of the graph
    /// pools the capture used (see [`crate::graph`]). Fails with
    /// [`crate::Error::StreamCapture`], ending the capture all the same, when
    /// a forbidden call invalidated it or a stream that joined it was not
    /// joined back.
    pub fn end_capture(&self) -> Result<Graph> {
        let driver = self.inner.device.driver();
        // SAFETY: the handle is live while `self` is (see `StreamInner`).
        let res = unsafe { driver.stream_end_capture(self.inner.raw) };
        // Some failures end the capture too, some do not.
        let mut keep = Vec::new();
        if !matches!(
            self.capture_status(),
            Ok(CaptureStatus::Active | CaptureStatus::Invalidated)
        ) {
            keep = crate::captures::ended(driver, self.inner.raw);
        }
        Ok(Graph::from_raw(self.inner.device.clone(), res?, keep))
    }

    /// Whether the stream is capturing, and the capture's id
    /// (`cuStreamGetCaptureInfo`).
    pub fn capture_info(&self) -> Result<CaptureInfo> {
        // SAFETY: the handle is live while `self` is (see `StreamInner`).
        unsafe { self.driver().stream_capture_info(self.inner.raw) }
    }

    /// [`Stream::capture_info`] and the nodes the next work captured on the
    /// stream will depend on (`cuStreamGetCaptureInfo`; see
    /// [`Driver::stream_capture_dependencies`]).
    pub fn capture_dependencies(&self) -> Result<(CaptureInfo, Vec<RawGraphNode>)> {
        // SAFETY: the handle is live while `self` is (see `StreamInner`).
        unsafe { self.driver().stream_capture_dependencies(self.inner.raw) }
    }

    /// [`Stream::capture_dependencies`], kept with the stream so that the
    /// capture's graph can be walked back from them
    /// ([`CaptureFrontier::ancestors`]): the graph nodes a capture names
    /// are handles, valid only while it is under way (or its graph lives),
    /// so they are walked only from a set the driver just named.
    pub fn capture_frontier(&self) -> Result<CaptureFrontier<'_>> {
        let (info, nodes) = self.capture_dependencies()?;
        Ok(CaptureFrontier {
            stream: self,
            info,
            nodes,
        })
    }

    /// Whether the stream is capturing: [`Stream::capture_info`]'s status.
    pub fn capture_status(&self) -> Result<CaptureStatus> {
        Ok(self.capture_info()?.status)
    }

    /// Makes later work on this stream wait for all work enqueued on `other` so far.
    /// Creates one event for the purpose.
    pub fn wait_for(&self, other: &Stream) -> Result<()> {
        let ev = Event::new(other.device())?;
        ev.record(other)?;
        self.wait_event(&ev)
    }
}

/// The error of a handle passed to a driver it is not of.
fn other_driver(what: &str, raw: u64) -> crate::Error {
    crate::Error::InvalidArgument(format!(
        "{what} {raw:#x} is another driver's: a handle is only meaningful to its own driver"
    ))
}

/// A stream's capture dependency set, read by [`Stream::capture_frontier`]:
/// the nodes the next work captured on the stream will depend on.
#[derive(Debug)]
pub struct CaptureFrontier<'s> {
    stream: &'s Stream,
    info: CaptureInfo,
    nodes: Vec<RawGraphNode>,
}

impl CaptureFrontier<'_> {
    /// Whether the stream was capturing, and the capture's id.
    pub fn info(&self) -> CaptureInfo {
        self.info
    }

    /// The nodes (none when the stream was not capturing, its capture was
    /// invalidated, or nothing captured came before its next work).
    pub fn nodes(&self) -> &[RawGraphNode] {
        &self.nodes
    }

    /// Walks the capture's graph back from the nodes
    /// (`cuGraphNodeGetDependencies` on each node visited): the nodes
    /// reachable from them, themselves included, without passing through a
    /// node of `known`, and the nodes of `known` met on the way.
    pub fn ancestors(
        &self,
        known: &HashSet<RawGraphNode>,
    ) -> Result<(HashSet<RawGraphNode>, HashSet<RawGraphNode>)> {
        let driver = self.stream.driver();
        let (mut fresh, mut met) = (HashSet::new(), HashSet::new());
        let mut todo = self.nodes.clone();
        while let Some(n) = todo.pop() {
            if known.contains(&n) {
                met.insert(n);
            } else if fresh.insert(n) {
                // SAFETY: `n` is a node the driver named for the stream's
                // capture: in `self.nodes`, read when the capture was under
                // way, or a dependency of such a node read by this walk. A
                // capture's nodes stay valid while it is under way and then
                // while its graph lives. The stream is borrowed, so it lives;
                // ending the capture and destroying its graph during this walk
                // would take another thread racing the capture it is still
                // capturing into, which no program that reads a capture's
                // dependencies does.
                todo.extend(unsafe { driver.graph_node_dependencies(n) }?);
            }
        }
        Ok((fresh, met))
    }
}

/// A CUDA event (timing disabled), destroyed on drop. Its handle is live (see
/// [`crate::driver`]) as long as the `Event` is: only its drop destroys it.
pub struct Event {
    device: Device,
    raw: RawEvent,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({:#x})", self.raw)
    }
}

impl Event {
    /// Creates an event on `device`.
    pub fn new(device: &Device) -> Result<Self> {
        let raw = device.driver().event_create(device.ordinal())?;
        Ok(Self {
            device: device.clone(),
            raw,
        })
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        let s = stream.raw_on(&self.device)?;
        // SAFETY: both handles are live while their owners, borrowed here,
        // are (see `Event` and `StreamInner`), and of this driver (`raw_on`
        // checked).
        unsafe { self.device.driver().event_record(self.raw, s) }
    }

    /// True when the work before the last record is complete.
    pub fn is_complete(&self) -> Result<bool> {
        // SAFETY: the handle is live while `self` is (see `Event`).
        unsafe { self.device.driver().event_query(self.raw) }
    }

    /// Blocks until the work before the last record is complete.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live while `self` is (see `Event`).
        unsafe { self.device.driver().event_synchronize(self.raw) }
    }

    /// The raw handle.
    pub fn raw(&self) -> RawEvent {
        self.raw
    }

    /// The device the event belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let (driver, raw) = (self.device.driver(), self.raw);
        crate::exit::give_back(
            || format!("event {raw:#x}"),
            // SAFETY: `Event::new` made the event and only this drop destroys
            // it; nothing uses it afterwards.
            || unsafe { driver.event_destroy(raw) },
        );
    }
}
