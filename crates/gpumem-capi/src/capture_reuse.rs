//! PyTorch's `graph_capture_record_stream_reuse`: reuse, before a capture
//! ends, of a graph-pool block freed during it while work on other streams
//! was recorded on it ([`crate::stream_uses`]).
//!
//! Such a block may not be handed out again as long as captured work on a
//! recorded stream could run at the same time as the block's next owner in
//! a replay. By default it waits for the capture to end. With the setting
//! on, the capture's own topology decides, as PyTorch's allocator does:
//!
//! - At the free, each stream that used the block (the one it is freed on
//!   and the recorded ones) gives its dependency set, the nodes its next
//!   captured work will depend on. Together they are the block's markers:
//!   every use of the block in the graph is one of them or comes before one.
//!   When one of those streams is not capturing, or captures into another
//!   graph, there are no markers and the block waits for the capture to end.
//! - At a later allocation on the stream the block was freed on, in the same
//!   capture, the block is reusable once every marker is behind that
//!   stream: among its dependency set and their ancestors (walking each
//!   node's dependencies back). Work captured on it from then on comes after
//!   every use of the block, in every replay. A stream with nothing captured
//!   yet has nothing behind it.
//!
//! The nodes behind a stream are kept per stream and extended at each
//! allocation: a walk stops at nodes already known, so a capture costs
//! about one visit per node and stream. That holds while a stream's
//! dependency set only moves forward (new work and waits do that); a walk
//! that does not reach the set seen before (a set replaced through
//! `cuStreamUpdateCaptureDependencies`) starts over from nothing. Any
//! driver error leaves the block waiting: reuse is never decided on a
//! guess. Nothing here runs unless the setting is on and a block waits.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};

use gpumem::driver::{CaptureStatus, RawGraphNode};
use gpumem::stream::StreamId;
use gpumem::Stream;

/// The value of a read of the capture's graph, or `None` when the driver
/// refused it: the block waits for the capture to end, and the first such
/// refusal in the process is reported (the setting asked for more).
fn unreadable<T>(r: gpumem::Result<T>) -> Option<T> {
    static REPORTED: AtomicBool = AtomicBool::new(false);
    r.inspect_err(|e| {
        if !REPORTED.swap(true, Ordering::Relaxed) {
            log::warn!(
                "graph_capture_record_stream_reuse: cannot read the capture's graph ({e}); blocks freed with recorded streams wait for the capture to end"
            );
        }
    })
    .ok()
}

/// Where the uses of a block freed during a capture end in its graph: the
/// dependency sets of the streams that used it, at the free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Markers {
    /// The capture's id.
    capture: u64,
    nodes: Vec<RawGraphNode>,
}

/// The markers of a block freed on `stream` and used on `others` too;
/// `None` when one of them is not capturing, captures into another graph,
/// or the driver cannot say.
pub(crate) fn markers(stream: &Stream, others: &[Stream]) -> Option<Markers> {
    let mut capture = None;
    let mut nodes = Vec::new();
    for s in std::iter::once(stream).chain(others) {
        let (info, deps) = unreadable(s.capture_dependencies())?;
        if info.status != CaptureStatus::Active || *capture.get_or_insert(info.id) != info.id {
            return None;
        }
        nodes.extend(deps);
    }
    nodes.sort_unstable();
    nodes.dedup();
    Some(Markers {
        capture: capture?,
        nodes,
    })
}

/// What work captured next on one stream comes after.
#[derive(Debug, Default)]
pub(crate) struct Behind {
    capture: u64,
    /// The stream's dependency set when last asked (sorted).
    last: Vec<RawGraphNode>,
    /// `last` and every ancestor of it.
    nodes: HashSet<RawGraphNode>,
}

impl Behind {
    /// Whether every use of a block with `markers` comes before the work
    /// captured next on the stream.
    pub(crate) fn covers(&self, markers: &Markers) -> bool {
        self.capture == markers.capture
            && !self.last.is_empty()
            && markers.nodes.iter().all(|n| self.nodes.contains(n))
    }
}

/// The nodes behind each capturing stream asked about, per device.
#[derive(Debug, Default)]
pub(crate) struct Reach {
    streams: HashMap<StreamId, Behind>,
}

impl Reach {
    /// Forgets everything (no capture is under way any more).
    pub(crate) fn clear(&mut self) {
        self.streams = HashMap::new();
    }

    /// The nodes work captured next on `stream` comes after, brought up to
    /// date; `None` when it is not capturing or the driver fails (nothing
    /// is kept for it then).
    pub(crate) fn behind(&mut self, stream: &Stream) -> Option<&Behind> {
        let id = stream.id();
        let found = Self::update(self.streams.remove(&id), stream)?;
        Some(self.streams.entry(id).or_insert(found))
    }

    fn update(known: Option<Behind>, stream: &Stream) -> Option<Behind> {
        let frontier = unreadable(stream.capture_frontier())?;
        let info = frontier.info();
        if info.status != CaptureStatus::Active {
            return None;
        }
        let mut now = frontier.nodes().to_vec();
        now.sort_unstable();
        now.dedup();
        let mut b = known
            .filter(|b| b.capture == info.id)
            .unwrap_or_else(|| Behind {
                capture: info.id,
                ..Behind::default()
            });
        if b.last == now {
            return Some(b);
        }
        let (fresh, met) = unreadable(frontier.ancestors(&b.nodes))?;
        if b.last.iter().all(|n| met.contains(n)) {
            b.nodes.extend(fresh);
        } else {
            b.nodes = unreadable(frontier.ancestors(&HashSet::new()))?.0;
        }
        b.last = now;
        Some(b)
    }
}
