//! [`GraphPool`]: memory for CUDA graphs captured on gpumem streams.
//!
//! A captured graph replays its kernels at the addresses they were captured
//! with, so memory allocated during a capture must stay where it is, and out
//! of reach of other work, for as long as the graph may be launched. A graph
//! pool is a [`PoolResource`] of its own over a [`HoldingAdaptor`]:
//! - allocations made while its stream captures come from it; the driver
//!   calls a growth makes run in relaxed capture mode ([`RelaxedCapture`]),
//!   so a global-mode capture is not broken by them;
//! - a block freed during the capture is reused by later allocations of the
//!   same capture (the graph orders them as the stream did), by later
//!   captures into the same pool, and by nothing else;
//! - no region goes back to the driver before [`GraphPool::release`], which
//!   waits for the device first (the graphs' launches must be done).
//!
//! One pool can serve several graphs captured one after another (they then
//! share memory, as PyTorch's `pool=` argument does: replay them in capture
//! order). Graphs that may run concurrently need pools of their own.

use crate::adaptor::HoldingAdaptor;
use crate::device::Device;
use crate::driver::{CaptureMode, DevicePtr};
use crate::graph::{Graph, RelaxedCapture};
use crate::pool::{Pool, PoolResource};
use crate::resource::{DeviceResource, MemoryResource, Properties};
use crate::stream::Stream;
use crate::Result;

/// A pool for the memory of captured CUDA graphs; see the module
/// documentation.
///
/// ```
/// use gpumem::driver::sim::SimConfig;
/// use gpumem::driver::CaptureMode;
/// use gpumem::graph_pool::GraphPool;
/// use gpumem::{Device, DeviceBuffer};
///
/// fn main() -> gpumem::Result<()> {
///     let device = Device::sim(SimConfig::backed(64 << 20));
///     let stream = device.create_stream()?;
///     let pool = GraphPool::new(&device)?;
///     pool.begin(&stream, CaptureMode::Global)?;
///     let out = DeviceBuffer::<u32, _>::zeroed(1024, &pool, &stream)?; // captured memset
///     let graph = pool.end(&stream)?.instantiate()?;
///     graph.launch(&stream)?; // runs the memset
///     assert_eq!(out.to_vec()?, vec![0; 1024]);
///     drop(out);
///     assert!(pool.release()? >= 4096);
///     Ok(())
/// }
/// ```
#[derive(Debug)]
pub struct GraphPool {
    pool: PoolResource<HoldingAdaptor<DeviceResource>>,
}

impl GraphPool {
    /// An empty graph pool on `device` (nothing is taken from the driver
    /// until the first allocation).
    pub fn new(device: &Device) -> Result<Self> {
        let upstream = HoldingAdaptor::new(DeviceResource::new(device.clone()));
        Ok(Self {
            pool: PoolResource::with_defaults(upstream)?.reusing_captured_frees(),
        })
    }

    /// Begins capturing `stream` in `mode`: work enqueued on it is recorded
    /// into a graph instead of run. Allocate the capture's memory from this
    /// pool.
    pub fn begin(&self, stream: &Stream, mode: CaptureMode) -> Result<()> {
        stream.begin_capture(mode)
    }

    /// Ends the capture of `stream` and returns its graph.
    pub fn end(&self, stream: &Stream) -> Result<Graph> {
        stream.end_capture()
    }

    /// Waits for the device (the graphs' launches) and gives every byte not
    /// in a live block back to the driver. Returns the bytes given back.
    /// Drop the graphs' executables first if they will not be launched
    /// again: a launch after this may write memory handed out elsewhere.
    pub fn release(&self) -> Result<usize> {
        self.device().synchronize()?;
        self.pool.release()?; // regions go to the holding adaptor ...
        self.pool.upstream().give_back() // ... and from it to the driver
    }

    /// Bytes in blocks handed out.
    pub fn live_bytes(&self) -> usize {
        self.pool.stats().live
    }
}

impl MemoryResource for GraphPool {
    /// Allocates as the pool does; a growth's driver calls run in relaxed
    /// capture mode.
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        let _relaxed = RelaxedCapture::new(self.device())?;
        self.pool.allocate(bytes, alignment, stream)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.pool.deallocate(ptr, bytes, alignment, stream)
    }

    fn device(&self) -> &Device {
        self.pool.device()
    }

    fn properties(&self) -> Properties {
        self.pool.properties()
    }
}

/// The reserve is what the pool took from the driver, given-back regions
/// still held included. [`Pool::trim`] gives nothing back (a graph may use
/// any of it); [`Pool::release`] is [`GraphPool::release`].
impl Pool for GraphPool {
    fn reserved_bytes(&self) -> usize {
        self.pool.reserved_bytes() + self.pool.upstream().held_bytes()
    }

    fn peak_reserved_bytes(&self) -> usize {
        self.pool.peak_reserved_bytes()
    }

    fn reset_peak(&self) {
        self.pool.reset_peak()
    }

    fn trim(&self, _to: usize) -> Result<usize> {
        Ok(0)
    }

    fn release(&self) -> Result<usize> {
        GraphPool::release(self)
    }
}
