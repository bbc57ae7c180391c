//! Graphs made by stream capture, their executables and launches, and the
//! memory allocated while capturing.
//!
//! A graph is its captured work in capture order; a launch enqueues that work
//! on the launch stream, so it runs in stream order like any other work (and
//! on a backed device really writes memory). A graph and the executables
//! instantiated from it share one body, which goes when the last of them is
//! destroyed.
//!
//! Memory allocated on a capturing stream (`cuMemAllocAsync`) belongs to the
//! graph, as in CUDA: its address is fixed at capture and is the same on
//! every launch. The simulator takes the block from the device's pool at
//! capture time and keeps it until the graph's body goes; then it returns to
//! the pool. An allocation the graph also frees is scratch memory of the
//! graph. One it does not free is handed to the caller by each launch and
//! must be freed with `cuMemFreeAsync` before the graph runs again (else the
//! launch fails with `CUDA_ERROR_INVALID_VALUE`); if it is still live when
//! the body goes, it stays the caller's, an ordinary pool allocation.
//! A graph with allocations has at most one executable at a time
//! (`CUDA_ERROR_NOT_SUPPORTED` otherwise), and cannot be launched into a
//! capture.
//!
//! Costs: a launch is one enqueue per node; the rest is O(1) or O(allocations).

use std::sync::Arc;

use super::capture::{Capture, CaptureId};
use super::faults::{drv, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED};
use super::streams::{Op, QueueId};
use super::{State, TAG_GRAPH, TAG_GRAPH_EXEC};
use crate::driver::{DevicePtr, RawGraph, RawGraphExec};
use crate::Result;

/// What a graph and its executables share.
#[derive(Debug)]
pub(super) struct GraphBody {
    /// The captured work, in capture order.
    ops: Vec<Op>,
    /// Allocations made in the capture: (address, freed in the graph).
    allocs: Vec<(u64, bool)>,
}

/// An allocation made during a capture, while its graph's body lives.
#[derive(Debug)]
pub(super) struct GraphAlloc {
    /// Freed in the graph: the graph's scratch memory, never the caller's.
    freed_in_graph: bool,
    /// A launch handed it to the caller and it was not freed since.
    outstanding: bool,
}

impl State {
    /// The graph of a capture that ended well.
    pub(super) fn make_graph(&mut self, c: Capture) -> RawGraph {
        for &(addr, freed_in_graph) in &c.allocs {
            self.graph_allocs.insert(
                addr,
                GraphAlloc {
                    freed_in_graph,
                    outstanding: false,
                },
            );
        }
        let body = GraphBody {
            ops: c.nodes.into_iter().map(|(op, _)| op).collect(),
            allocs: c.allocs,
        };
        let h = self.fresh_handle(TAG_GRAPH);
        self.graphs.insert(h, Arc::new(body));
        h
    }

    /// Returns allocations made in a capture or a graph to their pools.
    pub(super) fn release_graph_allocs(&mut self, allocs: &[(u64, bool)]) {
        for &(addr, _) in allocs {
            self.exec_pool_free(addr);
        }
    }

    /// `cuGraphInstantiate`.
    pub(super) fn graph_instantiate(&mut self, g: RawGraph) -> Result<RawGraphExec> {
        const CALL: &str = "cuGraphInstantiate";
        let body = self
            .graphs
            .get(&g)
            .cloned()
            .ok_or_else(|| drv(CALL, INVALID_HANDLE))?;
        if !body.allocs.is_empty() && self.graph_execs.values().any(|b| Arc::ptr_eq(b, &body)) {
            return Err(drv(CALL, NOT_SUPPORTED));
        }
        let h = self.fresh_handle(TAG_GRAPH_EXEC);
        self.graph_execs.insert(h, body);
        Ok(h)
    }

    /// `cuGraphLaunch` on `q`, which is capturing into `gate` if it is some.
    pub(super) fn graph_launch(
        &mut self,
        exec: RawGraphExec,
        q: QueueId,
        gate: Option<CaptureId>,
    ) -> Result<()> {
        const CALL: &str = "cuGraphLaunch";
        let body = self
            .graph_execs
            .get(&exec)
            .cloned()
            .ok_or_else(|| drv(CALL, INVALID_HANDLE))?;
        if gate.is_some() && !body.allocs.is_empty() {
            return Err(drv(CALL, NOT_SUPPORTED));
        }
        let outstanding = body
            .allocs
            .iter()
            .any(|(a, _)| self.graph_allocs.get(a).is_some_and(|x| x.outstanding));
        if outstanding {
            return Err(drv(CALL, INVALID_VALUE));
        }
        for op in &body.ops {
            self.enqueue(q, op.clone());
        }
        for (a, _) in &body.allocs {
            if let Some(x) = self.graph_allocs.get_mut(a) {
                x.outstanding = !x.freed_in_graph;
            }
        }
        Ok(())
    }

    /// `cuMemFreeAsync` of graph memory outside a capture: `None` when `ptr`
    /// is not graph memory.
    pub(super) fn free_graph_alloc(&mut self, ptr: DevicePtr, q: QueueId) -> Option<Result<()>> {
        let a = self.graph_allocs.get_mut(&ptr.0)?;
        if !a.outstanding {
            return Some(Err(drv("cuMemFreeAsync", INVALID_VALUE)));
        }
        a.outstanding = false;
        self.enqueue(q, Op::Marker);
        Some(Ok(()))
    }

    /// `cuGraphDestroy`.
    pub(super) fn graph_destroy(&mut self, g: RawGraph) -> Result<()> {
        let body = self
            .graphs
            .remove(&g)
            .ok_or_else(|| drv("cuGraphDestroy", INVALID_HANDLE))?;
        self.drop_body(body);
        Ok(())
    }

    /// `cuGraphExecDestroy`.
    pub(super) fn graph_exec_destroy(&mut self, e: RawGraphExec) -> Result<()> {
        let body = self
            .graph_execs
            .remove(&e)
            .ok_or_else(|| drv("cuGraphExecDestroy", INVALID_HANDLE))?;
        self.drop_body(body);
        Ok(())
    }

    /// Drops one holder of a body; the last one gives its memory back.
    fn drop_body(&mut self, body: Arc<GraphBody>) {
        let Some(body) = Arc::into_inner(body) else {
            return;
        };
        for (addr, _) in body.allocs {
            let caller_owns = self
                .graph_allocs
                .remove(&addr)
                .is_some_and(|a| a.outstanding);
            if !caller_owns {
                self.exec_pool_free(addr);
            }
        }
    }
}
