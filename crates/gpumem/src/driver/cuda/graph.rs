//! Stream capture and graphs: `cuStreamBeginCapture`, `cuStreamEndCapture`,
//! `cuStreamGetCaptureInfo`, `cuThreadExchangeStreamCaptureMode` and the
//! graph calls capture needs (instantiate, launch, destroy, a node's
//! dependencies). Each is one driver call once a context is current (two
//! for a node's dependencies: their count, then them).
//!
//! The symbols are checked as a group at load; without them these calls are
//! [`Error::Unsupported`] and the rest of the backend works.

use cudarc::driver::sys::{self, CUstreamCaptureMode, CUstreamCaptureStatus};

use super::error::check;
use super::stream::cu_stream;
use super::CudaDriver;
use crate::driver::{
    CaptureInfo, CaptureMode, CaptureStatus, RawGraph, RawGraphExec, RawGraphNode, RawStream,
};
use crate::{Error, Result};

fn cu_mode(mode: CaptureMode) -> CUstreamCaptureMode {
    match mode {
        CaptureMode::Global => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        CaptureMode::ThreadLocal => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        CaptureMode::Relaxed => CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    }
}

fn from_cu_mode(mode: CUstreamCaptureMode) -> CaptureMode {
    match mode {
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL => CaptureMode::Global,
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL => CaptureMode::ThreadLocal,
        CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED => CaptureMode::Relaxed,
    }
}

fn from_cu_status(status: CUstreamCaptureStatus) -> CaptureStatus {
    match status {
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => CaptureStatus::None,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureStatus::Active,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => CaptureStatus::Invalidated,
    }
}

#[inline]
fn cu_graph(g: RawGraph) -> sys::CUgraph {
    g as usize as sys::CUgraph
}

#[inline]
fn cu_exec(e: RawGraphExec) -> sys::CUgraphExec {
    e as usize as sys::CUgraphExec
}

#[inline]
fn cu_node(n: RawGraphNode) -> sys::CUgraphNode {
    n as usize as sys::CUgraphNode
}

/// Edge data for `n` edges, for the driver to fill (the queries fail with
/// `CUDA_ERROR_LOSSY_QUERY` without it when an edge is not a plain one).
fn edge_slots(n: usize) -> Vec<sys::CUgraphEdgeData> {
    let plain = sys::CUgraphEdgeData {
        from_port: 0,
        to_port: 0,
        type_: 0,
        reserved: [0; 5],
    };
    vec![plain; n]
}

fn null_handle(call: &str, what: &str) -> Error {
    Error::InvalidArgument(format!("{call}: null {what} handle"))
}

impl CudaDriver {
    /// Fails unless the driver has every stream-capture symbol (so that no
    /// call below can reach a missing one), then makes a context current for
    /// the call (see [`CudaDriver::ensure_context`]).
    fn graphs_ready(&self, call: &str) -> Result<super::context::Bound> {
        if let Some(sym) = self.missing_graph_symbol {
            return Err(Error::unsupported(format!(
                "{call}: the CUDA driver lacks {sym} (stream capture needs CUDA 12.3 or newer)"
            )));
        }
        self.ensure_context()
    }

    /// # Safety
    /// As [`crate::driver::Driver::stream_begin_capture`].
    pub(super) unsafe fn stream_begin_capture_impl(
        &self,
        stream: RawStream,
        mode: CaptureMode,
    ) -> Result<()> {
        const CALL: &str = "cuStreamBeginCapture";
        let _bound = self.graphs_ready(CALL)?;
        check(
            // SAFETY: the symbol was found at load; a live stream (this
            // function's contract) and a mode by value.
            unsafe { sys::cuStreamBeginCapture_v2(cu_stream(stream), cu_mode(mode)) },
            CALL,
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::stream_end_capture`].
    pub(super) unsafe fn stream_end_capture_impl(&self, stream: RawStream) -> Result<RawGraph> {
        const CALL: &str = "cuStreamEndCapture";
        let _bound = self.graphs_ready(CALL)?;
        let mut g: sys::CUgraph = std::ptr::null_mut();
        check(
            // SAFETY: the symbol was found at load; `g` is a valid out-pointer
            // and the stream is live (this function's contract).
            unsafe { sys::cuStreamEndCapture(cu_stream(stream), &mut g) },
            CALL,
        )?;
        Ok(g as usize as RawGraph)
    }

    /// # Safety
    /// As [`crate::driver::Driver::stream_capture_info`].
    pub(super) unsafe fn stream_capture_info_impl(&self, stream: RawStream) -> Result<CaptureInfo> {
        const CALL: &str = "cuStreamGetCaptureInfo";
        let _bound = self.graphs_ready(CALL)?;
        let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id: sys::cuuint64_t = 0;
        check(
            // SAFETY: the symbol was found at load; the stream is live (this
            // function's contract); `status` and `id` are valid out-pointers,
            // and the graph, dependency and edge outputs are optional (null:
            // not wanted).
            unsafe {
                sys::cuStreamGetCaptureInfo_v3(
                    cu_stream(stream),
                    &mut status,
                    &mut id,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            },
            CALL,
        )?;
        let status = from_cu_status(status);
        let id = if status == CaptureStatus::None { 0 } else { id };
        Ok(CaptureInfo { status, id })
    }

    /// # Safety
    /// As [`crate::driver::Driver::stream_capture_dependencies`].
    pub(super) unsafe fn stream_capture_dependencies_impl(
        &self,
        stream: RawStream,
    ) -> Result<(CaptureInfo, Vec<RawGraphNode>)> {
        const CALL: &str = "cuStreamGetCaptureInfo";
        let _bound = self.graphs_ready(CALL)?;
        let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id: sys::cuuint64_t = 0;
        let mut deps: *const sys::CUgraphNode = std::ptr::null();
        let mut edges: *const sys::CUgraphEdgeData = std::ptr::null();
        let mut n: usize = 0;
        check(
            // SAFETY: the symbol was found at load; the stream is live (this
            // function's contract); every output is a valid out-pointer (the
            // graph output is optional: null, not wanted).
            unsafe {
                sys::cuStreamGetCaptureInfo_v3(
                    cu_stream(stream),
                    &mut status,
                    &mut id,
                    std::ptr::null_mut(),
                    &mut deps,
                    &mut edges,
                    &mut n,
                )
            },
            CALL,
        )?;
        let status = from_cu_status(status);
        let info = CaptureInfo {
            status,
            id: if status == CaptureStatus::None { 0 } else { id },
        };
        if status != CaptureStatus::Active || n == 0 || deps.is_null() {
            return Ok((info, Vec::new()));
        }
        // SAFETY: on success with an active capture the driver points `deps`
        // at `n` node handles it owns, valid until the stream's next capture
        // call; they are copied out here, before any other call.
        let nodes = unsafe { std::slice::from_raw_parts(deps, n) };
        Ok((
            info,
            nodes.iter().map(|&p| p as usize as RawGraphNode).collect(),
        ))
    }

    /// # Safety
    /// As [`crate::driver::Driver::graph_node_dependencies`].
    pub(super) unsafe fn graph_node_dependencies_impl(
        &self,
        node: RawGraphNode,
    ) -> Result<Vec<RawGraphNode>> {
        const CALL: &str = "cuGraphNodeGetDependencies";
        if node == 0 {
            return Err(null_handle(CALL, "graph node"));
        }
        let _bound = self.graphs_ready(CALL)?;
        let mut n: usize = 0;
        check(
            // SAFETY: the symbol was found at load; the node is one of a
            // capture under way or of a live graph (this function's
            // contract); with null arrays the driver only writes the count to
            // `n`, a valid out-pointer.
            unsafe {
                sys::cuGraphNodeGetDependencies_v2(
                    cu_node(node),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    &mut n,
                )
            },
            CALL,
        )?;
        // A node's dependencies are set when it is captured: read again
        // only if their count grew between the two calls. None: no second
        // call (the driver refuses one with arrays of no entries).
        if n == 0 {
            return Ok(Vec::new());
        }
        for _ in 0..4 {
            let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
            let mut edges = edge_slots(n);
            let mut got = n;
            check(
                // SAFETY: the node is still valid (this function's contract);
                // `nodes` and `edges` hold `got` entries each, the most the
                // driver writes; `got` is a valid in/out pointer.
                unsafe {
                    sys::cuGraphNodeGetDependencies_v2(
                        cu_node(node),
                        nodes.as_mut_ptr(),
                        edges.as_mut_ptr(),
                        &mut got,
                    )
                },
                CALL,
            )?;
            if got <= n {
                nodes.truncate(got);
                return Ok(nodes
                    .into_iter()
                    .map(|p| p as usize as RawGraphNode)
                    .collect());
            }
            n = got;
        }
        Err(Error::InvalidArgument(format!(
            "{CALL}: the dependencies of node {node:#x} kept changing while read"
        )))
    }

    pub(super) fn thread_exchange_capture_mode_impl(
        &self,
        mode: CaptureMode,
    ) -> Result<CaptureMode> {
        const CALL: &str = "cuThreadExchangeStreamCaptureMode";
        let _bound = self.graphs_ready(CALL)?;
        let mut m = cu_mode(mode);
        check(
            // SAFETY: the symbol was found at load; `m` is a valid in/out pointer.
            unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut m) },
            CALL,
        )?;
        Ok(from_cu_mode(m))
    }

    /// # Safety
    /// As [`crate::driver::Driver::graph_instantiate`].
    pub(super) unsafe fn graph_instantiate_impl(&self, graph: RawGraph) -> Result<RawGraphExec> {
        const CALL: &str = "cuGraphInstantiate";
        if graph == 0 {
            return Err(null_handle(CALL, "graph"));
        }
        let _bound = self.graphs_ready(CALL)?;
        let mut e: sys::CUgraphExec = std::ptr::null_mut();
        check(
            // SAFETY: the symbol was found at load; `e` is a valid out-pointer,
            // the graph live (this function's contract); flags 0.
            unsafe { sys::cuGraphInstantiateWithFlags(&mut e, cu_graph(graph), 0) },
            CALL,
        )?;
        Ok(e as usize as RawGraphExec)
    }

    /// # Safety
    /// As [`crate::driver::Driver::graph_launch`].
    pub(super) unsafe fn graph_launch_impl(
        &self,
        exec: RawGraphExec,
        stream: RawStream,
    ) -> Result<()> {
        const CALL: &str = "cuGraphLaunch";
        if exec == 0 {
            return Err(null_handle(CALL, "executable graph"));
        }
        let _bound = self.graphs_ready(CALL)?;
        check(
            // SAFETY: the symbol was found at load; a live executable and
            // stream, and the captured work's memory valid for this run (this
            // function's contract).
            unsafe { sys::cuGraphLaunch(cu_exec(exec), cu_stream(stream)) },
            CALL,
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::graph_destroy`].
    pub(super) unsafe fn graph_destroy_impl(&self, graph: RawGraph) -> Result<()> {
        const CALL: &str = "cuGraphDestroy";
        if graph == 0 {
            return Err(null_handle(CALL, "graph"));
        }
        let _bound = self.graphs_ready(CALL)?;
        check(
            // SAFETY: the symbol was found at load; a live graph the caller
            // owns and destroys once (this function's contract).
            unsafe { sys::cuGraphDestroy(cu_graph(graph)) },
            CALL,
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::graph_exec_destroy`].
    pub(super) unsafe fn graph_exec_destroy_impl(&self, exec: RawGraphExec) -> Result<()> {
        const CALL: &str = "cuGraphExecDestroy";
        if exec == 0 {
            return Err(null_handle(CALL, "executable graph"));
        }
        let _bound = self.graphs_ready(CALL)?;
        check(
            // SAFETY: the symbol was found at load; a live executable the
            // caller owns and destroys once (this function's contract).
            unsafe { sys::cuGraphExecDestroy(cu_exec(exec)) },
            CALL,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_round_trip_through_the_driver_enum() {
        for m in [
            CaptureMode::Global,
            CaptureMode::ThreadLocal,
            CaptureMode::Relaxed,
        ] {
            assert_eq!(from_cu_mode(cu_mode(m)), m);
        }
        assert_eq!(
            from_cu_status(CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED),
            CaptureStatus::Invalidated
        );
    }
}
