//! Stream capture: a capturing stream records its work into a graph instead
//! of running it, and the calls CUDA forbids during a capture fail and
//! invalidate it, as on a GPU.
//!
//! A capture begins on one stream (its origin) and is owned by the thread
//! that began it. Work enqueued on a capturing stream becomes a node that
//! depends on the stream's dependency set (its previous node, plus what its
//! waits joined); an event recorded on it keeps that set, and another stream
//! that waits on the event joins the capture with it (a fork). Ending the
//! capture on the origin needs every joined stream joined back: its
//! dependency set must be among the origin's ancestors. The graph's nodes
//! run in capture order on every launch (see `graphs`).
//!
//! # The rules
//!
//! From CUDA's documentation of `cuThreadExchangeStreamCaptureMode` and of
//! stream capture in the programming guide ("prohibited and unhandled
//! operations"). Every refusal is recorded as a [`CaptureViolation`]; an
//! invalidated capture stays capturing until its origin ends it, and ending
//! it fails.
//!
//! | call | when | error | invalidates |
//! |---|---|---|---|
//! | one in [`UNSAFE_DURING_CAPTURE`] | thread mode Global, and the thread began a capture that is not Relaxed, or any thread has a Global capture | `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` | those captures |
//! | one in [`UNSAFE_DURING_CAPTURE`] | thread mode ThreadLocal, and the thread began a capture that is not Relaxed | `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` | those captures |
//! | one in [`UNSAFE_DURING_CAPTURE`] | thread mode Relaxed | allowed | |
//! | `cuStreamSynchronize`, `cuStreamQuery` | of a capturing stream, any mode | `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` | its capture |
//! | `cuEventQuery`, `cuEventSynchronize` | of an event last recorded in a capture, any mode | `CUDA_ERROR_CAPTURED_EVENT` | that capture |
//! | `cuCtxSynchronize` | of a device one of whose streams is capturing, any mode | `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` | those captures |
//! | any use of the legacy stream | while a blocking stream of its device is capturing | `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` | those captures |
//! | `cuStreamWaitEvent` | capturing stream, event recorded outside any capture | `CUDA_ERROR_STREAM_CAPTURE_ISOLATION` | the capture |
//! | `cuStreamWaitEvent` | stream of one capture, event recorded in another | `CUDA_ERROR_STREAM_CAPTURE_MERGE` | both |
//! | `cuMemFreeAsync` | on a capturing stream, of memory not allocated in that capture | `CUDA_ERROR_INVALID_VALUE` | no: the capture goes on |
//! | any use of a stream or an event of an invalidated capture | | `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` | |
//! | `cuStreamBeginCapture` | on the legacy stream | `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` | |
//! | `cuStreamEndCapture` | on a stream that joined but is not the origin | `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED` | |
//! | `cuStreamEndCapture` | from another thread, capture not Relaxed (the capture goes on) | `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` | |
//! | `cuStreamEndCapture` | a joined stream not joined back (the capture ends) | `CUDA_ERROR_STREAM_CAPTURE_UNJOINED` | |
//!
//! Not violations, plain errors: beginning a capture on a capturing stream or
//! ending one on a stream that is not capturing (`CUDA_ERROR_ILLEGAL_STATE`),
//! ending an invalidated capture (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`, the
//! capture ends), and querying, synchronizing or waiting on an event whose
//! last record was in a capture that has ended (`CUDA_ERROR_INVALID_VALUE`).
//!
//! Which calls CUDA counts as potentially unsafe it does not list; it names
//! `cudaMalloc` as the example. The simulator's list is what
//! `examples/capture_rules.rs` found on an H100 with driver 580: `cuMemAlloc`
//! and `cuMemFree`, pinned host allocation and free, pool trimming, and
//! every event and stream query or synchronize, even of an event or stream
//! with nothing to do with the capture. The virtual memory calls (create,
//! map, set access, unmap, release, address reserve and free) are allowed
//! in every mode, and so are copies of pageable host memory on a capturing
//! stream (they become graph nodes like any other copy).
//!
//! Not modelled: other errors of calls on a capturing stream (an invalid
//! pointer, say) do not invalidate the capture; captures of several devices
//! are not told apart by the potentially-unsafe rule.
//!
//! Costs: nothing when no capture exists (one emptiness check per call);
//! otherwise a scan of the captures per potentially unsafe call and O(nodes)
//! to end a capture.

use std::collections::HashMap;
use std::thread::ThreadId;

use super::faults::{
    cu_result_name, drv, CAPTURED_EVENT, CAPTURE_IMPLICIT, CAPTURE_INVALIDATED, CAPTURE_ISOLATION,
    CAPTURE_MERGE, CAPTURE_UNJOINED, CAPTURE_UNMATCHED, CAPTURE_UNSUPPORTED, CAPTURE_WRONG_THREAD,
    ILLEGAL_STATE, INVALID_VALUE,
};
use super::streams::{Op, QueueId, Record};
use super::{Ctx, State};
use crate::driver::{
    CaptureInfo, CaptureMode, CaptureStatus, DevicePtr, RawEvent, RawGraph, RawGraphNode,
};
use crate::{Error, Result};

/// A capture's id: unique for the driver's life, as `cuStreamGetCaptureInfo`
/// reports it.
pub(super) type CaptureId = u64;

/// The low bits of a node's handle: its index in its capture's nodes plus
/// one (no handle is 0); its capture's id sits above them.
const NODE_INDEX_BITS: u32 = 24;

/// The handle of node `index` of capture `id`.
fn node_handle(id: CaptureId, index: usize) -> Result<RawGraphNode> {
    let low = index as u64 + 1;
    if low >> NODE_INDEX_BITS != 0 || id >> (64 - NODE_INDEX_BITS) != 0 {
        return Err(Error::unsupported(format!(
            "graph node handles of the simulator for node {index} of capture {id} \
             (it names at most 2^{NODE_INDEX_BITS} - 1 nodes per capture)"
        )));
    }
    Ok((id << NODE_INDEX_BITS) | low)
}

/// The capture and node index a handle names (`None` for no node).
fn node_of(node: RawGraphNode) -> Option<(CaptureId, usize)> {
    let low = node & ((1 << NODE_INDEX_BITS) - 1);
    let index = usize::try_from(low.checked_sub(1)?).ok()?;
    Some((node >> NODE_INDEX_BITS, index))
}

/// The handles of nodes `indices` of capture `id`.
fn node_handles(id: CaptureId, indices: &[usize]) -> Result<Vec<RawGraphNode>> {
    indices.iter().map(|&i| node_handle(id, i)).collect()
}

/// The calls the simulator treats as potentially unsafe during a capture (by
/// their CUDA names; see the module documentation).
pub const UNSAFE_DURING_CAPTURE: &[&str] = &[
    "cuMemAlloc",
    "cuMemFree",
    "cuMemAllocManaged",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemPoolTrimTo",
    "cuMemPoolDestroy",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuStreamQuery",
    "cuStreamSynchronize",
];

/// A call refused because of a stream capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureViolation {
    /// The CUDA name of the call, such as `cuMemAlloc`.
    pub call: &'static str,
    /// The `CUresult` name it failed with.
    pub error: String,
    /// Which rule refused it, in words.
    pub reason: String,
    /// Ids of the captures it invalidated (none when they already were).
    pub invalidated: Vec<u64>,
}

impl std::fmt::Display for CaptureViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} failed with {}: {}",
            self.call, self.error, self.reason
        )
    }
}

/// One capture sequence.
#[derive(Debug)]
pub(super) struct Capture {
    /// The stream it began on: only it may end the capture.
    pub(super) origin: QueueId,
    pub(super) mode: CaptureMode,
    /// The thread that began it.
    pub(super) thread: ThreadId,
    pub(super) invalidated: bool,
    /// Captured work in capture order (a topological order), each with the
    /// nodes it depends on.
    pub(super) nodes: Vec<(Op, Vec<usize>)>,
    /// Each member stream's dependency set: what its next node depends on.
    members: HashMap<QueueId, Vec<usize>>,
    /// Allocations made in the capture: (address, freed in the capture).
    pub(super) allocs: Vec<(u64, bool)>,
}

impl Capture {
    /// Members whose dependency sets are not among the origin's ancestors.
    fn unjoined(&self) -> usize {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack = self.members.get(&self.origin).cloned().unwrap_or_default();
        while let Some(n) = stack.pop() {
            if !std::mem::replace(&mut seen[n], true) {
                stack.extend(&self.nodes[n].1);
            }
        }
        self.members
            .iter()
            .filter(|&(&q, deps)| q != self.origin && deps.iter().any(|&n| !seen[n]))
            .count()
    }
}

fn plural(ids: &[CaptureId]) -> String {
    let list: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
    let s = if ids.len() == 1 { "" } else { "s" };
    format!("capture{s} {}", list.join(", "))
}

impl State {
    /// Refuses `call` with `code`: invalidates those of `captures` still
    /// active and records the violation. Returns the call's error.
    pub(super) fn refuse(
        &mut self,
        call: &'static str,
        code: i32,
        reason: String,
        captures: &[CaptureId],
    ) -> Error {
        let mut invalidated = Vec::new();
        for id in captures {
            if let Some(c) = self.captures.get_mut(id) {
                if !std::mem::replace(&mut c.invalidated, true) {
                    invalidated.push(*id);
                }
            }
        }
        self.violations.push(CaptureViolation {
            call,
            error: cu_result_name(code),
            reason,
            invalidated,
        });
        drv(call, code)
    }

    /// The potentially-unsafe rule for `call` made by `ctx`'s thread.
    pub(super) fn check_unsafe(&mut self, call: &'static str, ctx: Ctx) -> Result<()> {
        if self.captures.is_empty()
            || ctx.mode == CaptureMode::Relaxed
            || !UNSAFE_DURING_CAPTURE.contains(&call)
        {
            return Ok(());
        }
        let mut causing: Vec<CaptureId> = self
            .captures
            .iter()
            .filter(|(_, c)| {
                c.mode != CaptureMode::Relaxed
                    && (c.thread == ctx.thread
                        || (ctx.mode == CaptureMode::Global && c.mode == CaptureMode::Global))
            })
            .map(|(&id, _)| id)
            .collect();
        if causing.is_empty() {
            return Ok(());
        }
        causing.sort_unstable();
        let reason = format!(
            "potentially unsafe while {} is under way (this thread's capture mode is {})",
            plural(&causing),
            ctx.mode
        );
        Err(self.refuse(call, CAPTURE_UNSUPPORTED, reason, &causing))
    }

    fn is_invalidated(&self, id: CaptureId) -> bool {
        self.captures.get(&id).is_some_and(|c| c.invalidated)
    }

    fn refuse_invalidated(&mut self, call: &'static str, id: CaptureId) -> Error {
        let reason = format!("capture {id} was invalidated by an earlier call");
        self.refuse(call, CAPTURE_INVALIDATED, reason, &[])
    }

    /// Captures with a blocking stream on `device` (they forbid the legacy stream).
    fn blocking_captures(&self, device: u32) -> Vec<CaptureId> {
        let mut ids: Vec<CaptureId> = self
            .captures
            .iter()
            .filter(|(_, c)| {
                c.members.keys().any(|q| {
                    self.queues
                        .get(q)
                        .is_some_and(|x| x.blocking && x.device == device)
                })
            })
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }

    /// Admits a stream-ordered call on `q`: the capture its work goes into,
    /// if `q` is capturing. Refuses it when that capture was invalidated, or
    /// when `q` is the legacy stream and a blocking stream of its device is
    /// capturing.
    pub(super) fn stream_gate(
        &mut self,
        q: QueueId,
        call: &'static str,
    ) -> Result<Option<CaptureId>> {
        if self.captures.is_empty() {
            return Ok(None);
        }
        if let Some(id) = self.queues.get(&q).and_then(|x| x.capture) {
            if self.is_invalidated(id) {
                return Err(self.refuse_invalidated(call, id));
            }
            return Ok(Some(id));
        }
        if self.is_legacy(q) {
            let ids = self.blocking_captures(self.queue_device(q));
            if !ids.is_empty() {
                let reason = format!(
                    "the legacy stream would depend on a blocking stream of {}",
                    plural(&ids)
                );
                return Err(self.refuse(call, CAPTURE_IMPLICIT, reason, &ids));
            }
        }
        Ok(None)
    }

    /// The rules for synchronizing or querying `q`.
    pub(super) fn check_stream_sync(
        &mut self,
        q: QueueId,
        call: &'static str,
        ctx: Ctx,
    ) -> Result<()> {
        if let Some(id) = self.queues.get(&q).and_then(|x| x.capture) {
            if self.is_invalidated(id) {
                return Err(self.refuse_invalidated(call, id));
            }
            let reason = format!("the stream is capturing (capture {id})");
            return Err(self.refuse(call, CAPTURE_UNSUPPORTED, reason, &[id]));
        }
        self.stream_gate(q, call)?;
        self.check_unsafe(call, ctx)
    }

    /// The rules for querying or synchronizing `event`.
    pub(super) fn check_event_use(
        &mut self,
        event: RawEvent,
        call: &'static str,
        ctx: Ctx,
    ) -> Result<()> {
        if let Some(Record::Captured(id, _)) = self.events.get(&event).map(|e| &e.record) {
            let id = *id;
            return Err(match self.captures.get(&id) {
                None => drv(call, INVALID_VALUE),
                Some(c) if c.invalidated => self.refuse_invalidated(call, id),
                Some(_) => {
                    let reason = format!("the event was last recorded in capture {id}");
                    self.refuse(call, CAPTURED_EVENT, reason, &[id])
                }
            });
        }
        self.check_unsafe(call, ctx)
    }

    /// The rule for synchronizing `device`.
    pub(super) fn check_device_sync(&mut self, device: u32, call: &'static str) -> Result<()> {
        let mut ids: Vec<CaptureId> = self
            .captures
            .iter()
            .filter(|(_, c)| c.members.keys().any(|&q| self.queue_device(q) == device))
            .map(|(&id, _)| id)
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        ids.sort_unstable();
        let reason = format!("a stream of the device is capturing ({})", plural(&ids));
        let code = if ids.iter().all(|&id| self.is_invalidated(id)) {
            CAPTURE_INVALIDATED
        } else {
            CAPTURE_UNSUPPORTED
        };
        Err(self.refuse(call, code, reason, &ids))
    }

    /// `cuStreamBeginCapture`.
    pub(super) fn begin_capture(&mut self, q: QueueId, mode: CaptureMode, ctx: Ctx) -> Result<()> {
        const CALL: &str = "cuStreamBeginCapture";
        if self.is_legacy(q) {
            let reason = "the legacy stream cannot capture".to_string();
            return Err(self.refuse(CALL, CAPTURE_UNSUPPORTED, reason, &[]));
        }
        if self.queues.get(&q).is_some_and(|x| x.capture.is_some()) {
            return Err(drv(CALL, ILLEGAL_STATE));
        }
        let id = self.fresh_id();
        self.captures.insert(
            id,
            Capture {
                origin: q,
                mode,
                thread: ctx.thread,
                invalidated: false,
                nodes: Vec::new(),
                members: HashMap::from([(q, Vec::new())]),
                allocs: Vec::new(),
            },
        );
        if let Some(queue) = self.queues.get_mut(&q) {
            queue.capture = Some(id);
        }
        Ok(())
    }

    /// `cuStreamGetCaptureInfo`.
    pub(super) fn capture_info(&self, q: QueueId) -> CaptureInfo {
        match self.queues.get(&q).and_then(|x| x.capture) {
            None => CaptureInfo {
                status: CaptureStatus::None,
                id: 0,
            },
            Some(id) => CaptureInfo {
                status: if self.is_invalidated(id) {
                    CaptureStatus::Invalidated
                } else {
                    CaptureStatus::Active
                },
                id,
            },
        }
    }

    /// `cuStreamGetCaptureInfo` with the dependency set of `q` (empty unless
    /// its capture is active).
    pub(super) fn capture_dependencies(
        &self,
        q: QueueId,
    ) -> Result<(CaptureInfo, Vec<RawGraphNode>)> {
        let info = self.capture_info(q);
        if info.status != CaptureStatus::Active {
            return Ok((info, Vec::new()));
        }
        let deps = self
            .captures
            .get(&info.id)
            .and_then(|c| c.members.get(&q))
            .map_or(Ok(Vec::new()), |d| node_handles(info.id, d))?;
        Ok((info, deps))
    }

    /// `cuGraphNodeGetDependencies` of a node of a capture under way.
    pub(super) fn node_dependencies(&self, node: RawGraphNode) -> Result<Vec<RawGraphNode>> {
        const CALL: &str = "cuGraphNodeGetDependencies";
        let found = node_of(node).and_then(|(id, index)| {
            let c = self.captures.get(&id)?;
            Some((id, &c.nodes.get(index)?.1))
        });
        match found {
            Some((id, deps)) => node_handles(id, deps),
            None => Err(drv(CALL, INVALID_VALUE)),
        }
    }

    /// Records `op`, enqueued on capturing stream `q`, as a node of capture `id`.
    pub(super) fn capture_node(&mut self, id: CaptureId, q: QueueId, op: Op) {
        let Some(c) = self.captures.get_mut(&id) else {
            return;
        };
        let n = c.nodes.len();
        let deps = c.members.insert(q, vec![n]).unwrap_or_default();
        c.nodes.push((op, deps));
    }

    /// `cuEventRecord` on capturing stream `q`: the event keeps the stream's
    /// dependency set.
    pub(super) fn capture_event_record(&mut self, event: RawEvent, q: QueueId, id: CaptureId) {
        let deps = self
            .captures
            .get(&id)
            .and_then(|c| c.members.get(&q).cloned())
            .unwrap_or_default();
        if let Some(e) = self.events.get_mut(&event) {
            e.record = Record::Captured(id, deps);
        }
    }

    /// `cuStreamWaitEvent` of `q` (in capture `gate`, if capturing) on `event`.
    pub(super) fn wait_event(
        &mut self,
        q: QueueId,
        gate: Option<CaptureId>,
        event: RawEvent,
    ) -> Result<()> {
        const CALL: &str = "cuStreamWaitEvent";
        let record = self
            .events
            .get(&event)
            .map(|e| e.record.clone())
            .unwrap_or(Record::Never);
        match (record, gate) {
            (Record::Never, _) => Ok(()),
            (Record::At(..), None) => self.stream_wait_event(q, event),
            (Record::At(..), Some(id)) => {
                let reason = format!(
                    "a stream of capture {id} waited on an event recorded outside any capture"
                );
                Err(self.refuse(CALL, CAPTURE_ISOLATION, reason, &[id]))
            }
            (Record::Captured(from, deps), gate) => {
                match self.captures.get(&from) {
                    None => return Err(drv(CALL, INVALID_VALUE)),
                    Some(c) if c.invalidated => return Err(self.refuse_invalidated(CALL, from)),
                    Some(_) => {}
                }
                match gate {
                    None if self.is_legacy(q) => {
                        let reason = format!("the legacy stream cannot join capture {from}");
                        Err(self.refuse(CALL, CAPTURE_IMPLICIT, reason, &[from]))
                    }
                    None => {
                        // A fork: `q` joins the capture with the event's dependencies.
                        if let Some(c) = self.captures.get_mut(&from) {
                            c.members.insert(q, deps);
                        }
                        if let Some(queue) = self.queues.get_mut(&q) {
                            queue.capture = Some(from);
                        }
                        Ok(())
                    }
                    Some(id) if id == from => {
                        if let Some(set) = self
                            .captures
                            .get_mut(&id)
                            .and_then(|c| c.members.get_mut(&q))
                        {
                            set.extend(deps);
                            set.sort_unstable();
                            set.dedup();
                        }
                        Ok(())
                    }
                    Some(id) => {
                        let reason = format!("would merge capture {id} with capture {from}");
                        Err(self.refuse(CALL, CAPTURE_MERGE, reason, &[id, from]))
                    }
                }
            }
        }
    }

    /// Notes an allocation made on a stream of capture `id`.
    pub(super) fn capture_alloc(&mut self, id: CaptureId, ptr: DevicePtr) {
        if let Some(c) = self.captures.get_mut(&id) {
            c.allocs.push((ptr.0, false));
        }
    }

    /// `cuMemFreeAsync` on stream `q` of capture `id`: only memory allocated
    /// in the same capture can be freed there.
    pub(super) fn capture_free(&mut self, id: CaptureId, q: QueueId, ptr: DevicePtr) -> Result<()> {
        const CALL: &str = "cuMemFreeAsync";
        let slot = self
            .captures
            .get_mut(&id)
            .and_then(|c| c.allocs.iter_mut().find(|(a, _)| *a == ptr.0));
        match slot {
            Some((_, freed)) if !*freed => {
                *freed = true;
                self.enqueue(q, Op::Marker);
                Ok(())
            }
            _ => {
                let reason = format!(
                    "{ptr:#x} was not allocated in capture {id}, or was freed there already"
                );
                // A plain error on the GPU: the capture goes on.
                Err(self.refuse(CALL, INVALID_VALUE, reason, &[]))
            }
        }
    }

    /// Takes capture `id` out of the driver and its streams out of capture mode.
    fn finish_capture(&mut self, id: CaptureId) -> Option<Capture> {
        let c = self.captures.remove(&id)?;
        for q in c.members.keys() {
            if let Some(queue) = self.queues.get_mut(q) {
                queue.capture = None;
            }
        }
        Some(c)
    }

    /// `cuStreamEndCapture` on `q`.
    pub(super) fn end_capture(&mut self, q: QueueId, ctx: Ctx) -> Result<RawGraph> {
        const CALL: &str = "cuStreamEndCapture";
        let id = self
            .queues
            .get(&q)
            .and_then(|x| x.capture)
            .ok_or_else(|| drv(CALL, ILLEGAL_STATE))?;
        let c = &self.captures[&id];
        if c.origin != q {
            let reason = format!("capture {id} began on another stream");
            return Err(self.refuse(CALL, CAPTURE_UNMATCHED, reason, &[]));
        }
        if c.mode != CaptureMode::Relaxed && c.thread != ctx.thread {
            let reason = format!("capture {id} ({} mode) began on another thread", c.mode);
            return Err(self.refuse(CALL, CAPTURE_WRONG_THREAD, reason, &[]));
        }
        let c = self.finish_capture(id).expect("looked up above");
        if c.invalidated {
            self.release_graph_allocs(&c.allocs);
            return Err(drv(CALL, CAPTURE_INVALIDATED));
        }
        let unjoined = c.unjoined();
        if unjoined > 0 {
            self.release_graph_allocs(&c.allocs);
            let reason = format!(
                "{unjoined} stream(s) that joined capture {id} have work the origin did not wait for"
            );
            return Err(self.refuse(CALL, CAPTURE_UNJOINED, reason, &[]));
        }
        Ok(self.make_graph(c))
    }

    /// A stream of a capture was destroyed: the origin's capture ends (its
    /// graph is lost); a joined stream's capture is invalidated.
    pub(super) fn capture_stream_gone(&mut self, q: QueueId) {
        let Some(id) = self.queues.get(&q).and_then(|x| x.capture) else {
            return;
        };
        if self.captures.get(&id).is_some_and(|c| c.origin == q) {
            if let Some(c) = self.finish_capture(id) {
                self.release_graph_allocs(&c.allocs);
            }
        } else if let Some(c) = self.captures.get_mut(&id) {
            c.members.remove(&q);
            c.invalidated = true;
            if let Some(queue) = self.queues.get_mut(&q) {
                queue.capture = None;
            }
        }
    }
}
