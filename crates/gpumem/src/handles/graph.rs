//! CUDA graphs made by stream capture, their executables, and the guard that
//! lets a thread make calls a capture would otherwise forbid.
//!
//! Capture work with [`Stream::begin_capture`] and [`Stream::end_capture`],
//! which returns a [`Graph`]; [`Graph::instantiate`] makes a [`GraphExec`]
//! that [`GraphExec::launch`] runs on any stream, as often as wanted. Both
//! own their driver handles and destroy them on drop, in any order (an
//! executable does not need its graph, and launches already enqueued still
//! run).
//!
//! Both also keep alive the memory of the [`GraphPool`]s the capture
//! allocated or freed through: a graph pool gives that memory back only
//! once no graph or executable captured from it is left (and the device is
//! idle), so no launch can write memory handed out again. See
//! [`GraphPool`] for what that covers.
//!
//! [`GraphPool`]: crate::graph_pool::GraphPool
//!
//! While a capture is under way, calls that act at once instead of in stream
//! order (`cuMemAlloc`, `cuMemCreate`, event queries...) fail and break the
//! capture, unless the calling thread is in relaxed mode: [`RelaxedCapture`]
//! puts it there for a scope, as PyTorch's allocator does around its own
//! `cudaMalloc`. See [`CaptureMode`] for the rules.

use std::marker::PhantomData;
use std::sync::Arc;

use crate::captures::KeepAlive;
use crate::device::Device;
use crate::driver::{CaptureMode, Driver, RawGraph, RawGraphExec};
use crate::stream::Stream;
use crate::Result;

/// A graph of captured work, destroyed on drop. It keeps alive the memory
/// of the graph pools its capture used (see the module documentation).
///
/// Its handle is live (see [`crate::driver`]) as long as it is: it came
/// from the capture's end and only this drop destroys it.
pub struct Graph {
    device: Device,
    raw: RawGraph,
    /// Memory the captured work uses, kept until the graph goes (dropped
    /// after the handle is destroyed).
    keep: Vec<KeepAlive>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Graph({:#x})", self.raw)
    }
}

impl Graph {
    /// Takes ownership of a graph handle of `device`'s driver, whose work
    /// uses the memory `keep` holds.
    pub(crate) fn from_raw(device: Device, raw: RawGraph, keep: Vec<KeepAlive>) -> Self {
        Self { device, raw, keep }
    }

    /// Makes an executable of the graph (`cuGraphInstantiate`). The graph may
    /// be dropped afterwards: the executable keeps the graph's memory alive
    /// too.
    pub fn instantiate(&self) -> Result<GraphExec> {
        // SAFETY: the handle is live while `self` is (see `Graph`).
        let raw = unsafe { self.device.driver().graph_instantiate(self.raw) }?;
        Ok(GraphExec {
            device: self.device.clone(),
            raw,
            _keep: self.keep.clone(),
        })
    }

    /// The raw handle.
    pub fn raw(&self) -> RawGraph {
        self.raw
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let (driver, raw) = (self.device.driver(), self.raw);
        crate::exit::give_back(
            || format!("graph {raw:#x}"),
            // SAFETY: the graph is this value's alone, and nothing uses it
            // after its drop (an executable does not need it).
            || unsafe { driver.graph_destroy(raw) },
        );
    }
}

/// An executable graph, destroyed on drop. It keeps alive the memory of
/// the graph pools its capture used (see the module documentation).
///
/// Its handle is live (see [`crate::driver`]) as long as it is: only this
/// drop destroys it.
pub struct GraphExec {
    device: Device,
    raw: RawGraphExec,
    /// Memory the launches use, kept until the executable goes (dropped
    /// after the handle is destroyed).
    _keep: Vec<KeepAlive>,
}

impl std::fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GraphExec({:#x})", self.raw)
    }
}

impl GraphExec {
    /// Enqueues one run of the graph's work on `stream` (`cuGraphLaunch`): it
    /// runs in stream order, after the work enqueued before it.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        let s = stream.raw_on(&self.device)?;
        // SAFETY: both handles are live while their owners, borrowed here,
        // are, and of this driver (`raw_on` checked). The captured work's
        // memory: the graph pools' memory is kept by `_keep` as long as
        // `self`, and the other captured calls (memsets and copies, all
        // `unsafe`) promised theirs valid for as long as the graph can be
        // launched.
        unsafe { self.device.driver().graph_launch(self.raw, s) }
    }

    /// The raw handle.
    pub fn raw(&self) -> RawGraphExec {
        self.raw
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        let (driver, raw) = (self.device.driver(), self.raw);
        crate::exit::give_back(
            || format!("executable graph {raw:#x}"),
            // SAFETY: the executable is this value's alone, and nothing uses
            // it after its drop (launches already enqueued still run).
            || unsafe { driver.graph_exec_destroy(raw) },
        );
    }
}

/// Puts the calling thread in relaxed capture mode until dropped, then
/// restores the mode it had: calls made meanwhile on this thread (such as a
/// pool growing through `cuMemAlloc` or `cuMemMap`) do not break a stream
/// capture that is under way. Calls that conflict with a capture whatever
/// the mode (synchronizing a capturing stream, querying an event recorded in
/// a capture) still fail.
///
/// The mode is per thread, so the guard cannot leave its thread. Nest guards
/// in scope order.
pub struct RelaxedCapture {
    driver: Arc<dyn Driver>,
    previous: CaptureMode,
    /// Not `Send`: the mode belongs to the thread that set it.
    _thread: PhantomData<*const ()>,
}

impl std::fmt::Debug for RelaxedCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelaxedCapture")
            .field("previous", &self.previous)
            .finish()
    }
}

/// Relaxed capture mode for this scope where the driver has it: `None`
/// where it cannot be set (a driver without stream capture), then the calls
/// go ahead as they would have. What pools wrap their driver allocations and
/// frees in, so a capture under way on any thread is not broken by them.
pub(crate) fn relaxed(device: &Device) -> Option<RelaxedCapture> {
    RelaxedCapture::new(device).ok()
}

impl RelaxedCapture {
    /// Sets this thread's capture mode to relaxed for `device`'s driver
    /// (`cuThreadExchangeStreamCaptureMode`).
    pub fn new(device: &Device) -> Result<Self> {
        let driver = device.driver().clone();
        let previous = driver.thread_exchange_capture_mode(CaptureMode::Relaxed)?;
        Ok(Self {
            driver,
            previous,
            _thread: PhantomData,
        })
    }

    /// The mode the thread had before, which drop restores.
    pub fn previous(&self) -> CaptureMode {
        self.previous
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        let previous = self.previous;
        crate::exit::give_back(
            || format!("this thread's capture mode ({previous})"),
            || self.driver.thread_exchange_capture_mode(previous).map(drop),
        );
    }
}
