//! The stream captures gpumem knows to be under way in the process.
//!
//! While any stream captures a graph in global mode, CUDA refuses event and
//! stream queries and synchronizations on every thread, and the refusal
//! breaks the capture. The pools query events on their slow paths, and a
//! free on a capturing stream must not be handed to work outside the graph.
//! Asking the driver about every stream on every call would cost a driver
//! call per free, so the pools read one counter instead: captures begun with
//! [`Stream::begin_capture`] count until they end, and a capture begun
//! outside gpumem (by PyTorch, or with a raw `cuStreamBeginCapture`) counts
//! while a [`CaptureNotice`] for it is alive.
//!
//! A capture begun with [`Stream::begin_capture`] also gathers what its
//! graph must keep alive: the memory of every
//! [`GraphPool`](crate::graph_pool::GraphPool) the capture allocates or
//! frees through, handed to the [`Graph`](crate::Graph) that
//! [`Stream::end_capture`] returns.
//!
//! With no capture counted, the pools run as before at the cost of one
//! atomic load on their slow paths; with one counted, they ask the driver
//! whether the stream at hand is capturing, park what is freed on a
//! capturing stream, make their queries in relaxed capture mode, and wait
//! for nothing when they run out of memory: no stream, event or device is
//! synchronized, and what a wait could have freed stays where it is, so the
//! allocation fails with [`Error::OutOfMemory`](crate::Error::OutOfMemory)
//! and its numbers.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::device::Device;
use crate::driver::{Driver, RawStream};
use crate::graph::RelaxedCapture;
use crate::pool::stream_order::sync::lock;
use crate::stream::Stream;

/// Captures counted: streams in [`CAPTURING`] plus live notices.
static UNDERWAY: AtomicUsize = AtomicUsize::new(0);

/// What a capture's graph keeps alive: memory its work uses, which must
/// outlive every launch (see [`keep_alive`]).
pub(crate) type KeepAlive = Arc<dyn Any + Send + Sync>;

/// A capture begun through [`Stream::begin_capture`].
struct Capturing {
    /// Its stream, by driver and handle.
    key: (usize, RawStream),
    /// The driver's id of the capture (streams that joined it share it).
    id: u64,
    /// What its graph will keep alive.
    keep: Vec<KeepAlive>,
}

/// Captures begun through [`Stream::begin_capture`] and not yet ended.
static CAPTURING: Mutex<Vec<Capturing>> = Mutex::new(Vec::new());

/// Whether gpumem knows of a capture under way anywhere in the process: one
/// begun with [`Stream::begin_capture`] or announced by a live
/// [`CaptureNotice`]. While one is, event queries and synchronizations would
/// break it (in global mode), and events recorded on a capturing stream
/// become part of the graph.
#[inline]
pub fn underway() -> bool {
    UNDERWAY.load(Ordering::Acquire) != 0
}

fn key(driver: &Arc<dyn Driver>, raw: RawStream) -> (usize, RawStream) {
    (Arc::as_ptr(driver) as *const () as usize, raw)
}

/// Counts the capture just begun on `stream`.
pub(crate) fn began(stream: &Stream) {
    let id = stream.capture_info().map_or(0, |i| i.id);
    let mut list = lock(&CAPTURING);
    let k = key(stream.device().driver(), stream.raw());
    if !list.iter().any(|c| c.key == k) {
        list.push(Capturing {
            key: k,
            id,
            keep: Vec::new(),
        });
        UNDERWAY.fetch_add(1, Ordering::AcqRel);
    }
}

/// Stops counting a capture on stream `raw` of `driver` (it ended, or the
/// stream is gone); returns what its graph must keep alive.
pub(crate) fn ended(driver: &Arc<dyn Driver>, raw: RawStream) -> Vec<KeepAlive> {
    if !underway() {
        return Vec::new();
    }
    let mut list = lock(&CAPTURING);
    let k = key(driver, raw);
    let Some(i) = list.iter().position(|c| c.key == k) else {
        return Vec::new();
    };
    UNDERWAY.fetch_sub(1, Ordering::AcqRel);
    list.swap_remove(i).keep
}

/// Makes the graph of the capture `stream` takes part in (begun with
/// [`Stream::begin_capture`] on it or on a stream it joined) keep `what`
/// alive, with its executables: memory the captured work uses then outlives
/// every launch. Nothing happens when the stream is not capturing or when
/// its capture was begun outside gpumem (its graph is not a [`Graph`]).
///
/// [`Graph`]: crate::graph::Graph
pub(crate) fn keep_alive(stream: &Stream, what: &KeepAlive) {
    if !underway() {
        return;
    }
    let Ok(info) = stream.capture_info() else {
        return;
    };
    if info.status == crate::driver::CaptureStatus::None {
        return;
    }
    let driver = key(stream.device().driver(), stream.raw()).0;
    let mut list = lock(&CAPTURING);
    if let Some(c) = list
        .iter_mut()
        .find(|c| c.key.0 == driver && c.id == info.id)
    {
        if !c.keep.iter().any(|k| Arc::ptr_eq(k, what)) {
            c.keep.push(what.clone());
        }
    }
}

/// Tells gpumem's pools that a capture they did not begin is under way, for
/// as long as it lives: create one when a capture begins outside gpumem
/// (PyTorch's `torch.cuda.graph`, a raw `cuStreamBeginCapture` on a cudarc
/// stream) and drop it when the capture ends. Captures begun with
/// [`Stream::begin_capture`] need none.
///
/// Without it, a pool serving another stream meanwhile may query an event,
/// which a global-mode capture forbids on every thread.
///
/// ```
/// use gpumem::captures::CaptureNotice;
///
/// let notice = CaptureNotice::new(); // the capture begins elsewhere
/// // ... allocations and frees through gpumem's pools ...
/// drop(notice); // the capture has ended
/// ```
#[derive(Debug)]
#[must_use = "the notice counts only while it is alive"]
pub struct CaptureNotice {
    _private: (),
}

impl CaptureNotice {
    /// Counts one capture under way until the notice is dropped.
    pub fn new() -> Self {
        UNDERWAY.fetch_add(1, Ordering::AcqRel);
        Self { _private: () }
    }
}

impl Default for CaptureNotice {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for CaptureNotice {
    fn drop(&mut self) {
        UNDERWAY.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Relaxed capture mode for this scope when a capture is counted (queries
/// of streams and events outside the capture are then allowed); nothing
/// otherwise.
#[inline]
pub(crate) fn relaxed_if_underway(device: &Device) -> Option<RelaxedCapture> {
    if underway() {
        crate::graph::relaxed(device)
    } else {
        None
    }
}
