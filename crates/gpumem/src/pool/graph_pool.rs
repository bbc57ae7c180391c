//! [`GraphPool`]: memory for CUDA graphs captured on gpumem streams.
//!
//! A captured graph replays its kernels at the addresses they were captured
//! with, so memory allocated during a capture must stay where it is, and out
//! of reach of other work, for as long as the graph may be launched. A graph
//! pool holds two pools over the driver:
//! - the captures' memory, a [`PoolResource`] of its own over a
//!   [`HoldingAdaptor`], serves every allocation made on a stream that is
//!   capturing (a capture into the pool); the driver calls a growth makes
//!   run in relaxed capture mode ([`RelaxedCapture`]), so a global-mode
//!   capture is not broken by them;
//! - other memory, a [`PoolResource`] over the driver, serves the
//!   allocations made on a stream that is not capturing; its blocks freed
//!   during a capture are parked for the graph as in any pool (see
//!   [`crate::pool`]).
//!
//! A stream counts as capturing when gpumem knows of its capture
//! ([`crate::captures`]): begun with [`Stream::begin_capture`] or
//! [`GraphPool::begin`], or announced with a
//! [`CaptureNotice`](crate::captures::CaptureNotice) (a capture begun by
//! cudarc or PyTorch). The pool cannot tell a capture it does not know of
//! from any other work.
//!
//! The rules:
//! - a block freed during a capture into the pool is reused by later
//!   allocations of the same capture (the graph orders them as the stream
//!   did) and by later captures into the pool, and never by an allocation
//!   made while no capture into the pool is under way: the graph frees it
//!   again on every launch, and work outside the graph would overlap it;
//! - a block of the captures' memory freed outside a capture (the output
//!   of a graph, once its last launch has been read) goes back to the
//!   captures' memory too, for later captures;
//! - the pool's memory is kept alive by every [`Graph`] and [`GraphExec`]
//!   whose capture allocated or freed through the pool (captures begun with
//!   [`Stream::begin_capture`] or [`GraphPool::begin`], ended with
//!   [`Stream::end_capture`] or [`GraphPool::end`]): [`GraphPool::release`]
//!   gives the captures' memory back only while none is left (the other
//!   memory's parked blocks never), and after a drop of the pool all of it
//!   goes back once the last of them is dropped and the device is idle. A
//!   launch therefore never writes memory handed out again. Graphs made
//!   outside gpumem (a capture announced with a
//!   [`CaptureNotice`](crate::captures::CaptureNotice), raw driver handles)
//!   are not known to the pool: drop their executables before releasing it.
//!
//! One pool can serve several graphs captured one after another (they then
//! share memory, as PyTorch's `pool=` argument does: replay them in capture
//! order). Graphs that may run concurrently need pools of their own.

use std::sync::{Arc, Mutex};

use crate::adaptor::HoldingAdaptor;
use crate::captures::KeepAlive;
use crate::device::Device;
use crate::driver::{CaptureMode, DevicePtr};
use crate::error::FreeError;
use crate::graph::{Graph, RelaxedCapture};
use crate::pool::stream_order::parked::capturing;
use crate::pool::stream_order::streams::synchronize_device;
use crate::pool::stream_order::sync::lock;
use crate::pool::{Pool, PoolResource};
use crate::resource::{DeviceResource, MemoryResource, Properties};
use crate::stream::Stream;
use crate::{Error, Result};

#[cfg(doc)]
use crate::graph::GraphExec;

/// The captures' pool: regions it gives back are held until the pool is
/// released (see [`HoldingAdaptor`]).
type Captured = PoolResource<HoldingAdaptor<DeviceResource>>;

/// The pool's two pools.
struct Pools {
    captured: Captured,
    /// Memory for allocations made while no capture into the pool is under
    /// way.
    other: PoolResource<DeviceResource>,
}

/// The pool's memory, shared by the pool and by the graphs captured from
/// it.
struct Memory {
    /// `None` once dropped or kept for good (see the `Drop`).
    pools: Option<Pools>,
    device: Device,
}

impl Memory {
    fn pools(&self) -> &Pools {
        self.pools.as_ref().expect("taken only on drop")
    }
}

impl Drop for Memory {
    /// The last graph or executable (or the pool) is gone, but launches may
    /// still run: the memory goes back once the device is idle. While it
    /// cannot be waited for (a capture is under way), the memory is kept
    /// for good: a leak is safe, freeing it under a running graph is not.
    fn drop(&mut self) {
        let Some(pools) = self.pools.take() else {
            return;
        };
        if crate::exit::process_is_exiting() {
            std::mem::forget(pools); // the driver may be gone (see `crate::exit`)
            return;
        }
        match synchronize_device(&self.device) {
            Ok(()) => drop(pools),
            Err(e) => {
                log::warn!("graph pool: its memory is kept for good, the device cannot be waited for ({e})");
                std::mem::forget(pools);
            }
        }
    }
}

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
///     assert_eq!(pool.release()?, 0); // the executable keeps its memory
///     drop(graph);
///     assert!(pool.release()? >= 4096);
///     Ok(())
/// }
/// ```
pub struct GraphPool {
    memory: Arc<Memory>,
    /// Held while the memory is registered with a capture and while
    /// [`GraphPool::release`] looks whether any graph still holds it.
    registering: Mutex<()>,
}

impl std::fmt::Debug for GraphPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pools = self.pools();
        f.debug_struct("GraphPool")
            .field("captured", &pools.captured)
            .field("other", &pools.other)
            .field("graphs", &self.graphs())
            .finish()
    }
}

impl GraphPool {
    /// An empty graph pool on `device` (nothing is taken from the driver
    /// until the first allocation).
    pub fn new(device: &Device) -> Result<Self> {
        let upstream = HoldingAdaptor::new(DeviceResource::new(device.clone()));
        let captured = PoolResource::with_defaults(upstream)?.reusing_captured_frees();
        let other = PoolResource::with_defaults(DeviceResource::new(device.clone()))?;
        Ok(Self {
            memory: Arc::new(Memory {
                pools: Some(Pools { captured, other }),
                device: device.clone(),
            }),
            registering: Mutex::new(()),
        })
    }

    fn pools(&self) -> &Pools {
        self.memory.pools()
    }

    /// Begins capturing `stream` in `mode`: work enqueued on it is recorded
    /// into a graph instead of run. Allocate the capture's memory from this
    /// pool.
    pub fn begin(&self, stream: &Stream, mode: CaptureMode) -> Result<()> {
        stream.begin_capture(mode)
    }

    /// Ends the capture of `stream` and returns its graph
    /// ([`Stream::end_capture`]).
    pub fn end(&self, stream: &Stream) -> Result<Graph> {
        stream.end_capture()
    }

    /// Gives back to the driver every byte not in a live block that no
    /// graph may use: always the memory of allocations made outside
    /// captures (after waiting for the streams that freed it); the captures'
    /// memory only when no [`Graph`] or [`GraphExec`] captured from the pool
    /// is left, after waiting for the device (launches of dropped
    /// executables may still run). Returns the bytes given back.
    pub fn release(&self) -> Result<usize> {
        let pools = self.pools();
        let mut given = pools.other.release()?;
        let _registering = lock(&self.registering);
        if self.graphs() == 0 {
            synchronize_device(self.device())?;
            pools.captured.release()?; // regions go to the holding adaptor ...
            given += pools.captured.upstream().give_back()?; // ... and from it to the driver
        }
        Ok(given)
    }

    /// Bytes in blocks handed out.
    pub fn live_bytes(&self) -> usize {
        let pools = self.pools();
        pools.captured.live_bytes() + pools.other.live_bytes()
    }

    /// Graphs and executables (and captures under way) that keep the pool's
    /// memory alive.
    pub fn graphs(&self) -> usize {
        Arc::strong_count(&self.memory) - 1
    }

    /// What the captures' memory holds from the driver.
    fn captured_reserve(captured: &Captured) -> usize {
        captured.reserved_bytes() + captured.upstream().held_bytes()
    }

    /// Whether `stream` is in a capture (a capture into the pool, when it
    /// allocates or frees through it); if so, its graph is made to keep the
    /// captures' memory alive.
    fn capture_into(&self, stream: &Stream) -> bool {
        if !capturing(stream) {
            return false;
        }
        let _registering = lock(&self.registering);
        let keep: KeepAlive = self.memory.clone();
        crate::captures::keep_alive(stream, &keep);
        true
    }
}

impl MemoryResource for GraphPool {
    /// Allocates from the captures' memory on a capturing stream (a
    /// growth's driver calls then run in relaxed capture mode), from the
    /// other memory otherwise.
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        if !self.capture_into(stream) {
            return self.pools().other.allocate(bytes, alignment, stream);
        }
        let _relaxed = RelaxedCapture::new(self.device())?;
        self.pools().captured.allocate(bytes, alignment, stream)
    }

    /// Frees into the pool that handed the block out (looked for first
    /// where the stream's capture state points).
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        let Pools { captured, other } = self.pools();
        let (first, then): (&dyn MemoryResource, &dyn MemoryResource) =
            match self.capture_into(stream) {
                true => (captured, other),
                false => (other, captured),
            };
        match first.deallocate(ptr, bytes, alignment, stream) {
            Err(Error::InvalidFree {
                reason: FreeError::Unknown,
                ..
            }) => then.deallocate(ptr, bytes, alignment, stream),
            r => r,
        }
    }

    fn device(&self) -> &Device {
        &self.memory.device
    }

    fn properties(&self) -> Properties {
        self.pools().other.properties()
    }
}

/// The reserve is what both pools took from the driver, given-back regions
/// still held included; the peak is the two pools' peaks summed.
/// [`Pool::trim`] gives back only the other memory (a graph may use any of
/// the captures'); [`Pool::release`] is [`GraphPool::release`].
impl Pool for GraphPool {
    fn reserved_bytes(&self) -> usize {
        let Pools { captured, other } = self.pools();
        Self::captured_reserve(captured) + other.reserved_bytes()
    }

    fn peak_reserved_bytes(&self) -> usize {
        let Pools { captured, other } = self.pools();
        captured.peak_reserved_bytes() + other.peak_reserved_bytes()
    }

    fn reset_peak(&self) {
        let Pools { captured, other } = self.pools();
        captured.reset_peak();
        other.reset_peak();
    }

    fn trim(&self, to: usize) -> Result<usize> {
        let Pools { captured, other } = self.pools();
        other.trim(to.saturating_sub(Self::captured_reserve(captured)))
    }

    fn release(&self) -> Result<usize> {
        GraphPool::release(self)
    }
}
