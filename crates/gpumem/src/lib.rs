//! GPU memory management: memory resources, stream-ordered pools and
//! adaptors in the manner of RAPIDS RMM, over the CUDA driver or a simulated
//! device. Pools serve requests from memory they already hold, keep
//! stream-ordered work safe, and report what memory does.
//!
//! Where to start:
//! - [`Device`]: a GPU ([`Device::cuda`]) or the simulated device
//!   ([`Device::sim`]), and its [`Stream`]s;
//! - [`resource::MemoryResource`]: `allocate(bytes, alignment, stream)` and
//!   `deallocate`, what every resource and pool answers; the upstream
//!   resources in [`resource`] ([`resource::DeviceResource`] is
//!   `cuMemAlloc`);
//! - the pools in [`pool`]: [`pool::PoolResource`] (the default of the C
//!   ABI), [`pool::VirtualPool`] (physical pages only under live blocks;
//!   sleep and wake), [`pool::CachingPool`], [`pool::ArenaResource`],
//!   [`pool::BinningResource`]; each answers [`pool::Pool`] (what it holds,
//!   trim, release); CUDA's own pools are in [`async_pool`];
//! - [`adaptor`]: statistics, limits, leak tracking, RMM's log format;
//! - [`DeviceBuffer`]: a typed buffer freed on its stream when dropped;
//!   [`manager::MemoryManager`]: pinned and device pools behind one facade;
//! - [`graph_pool::GraphPool`]: memory for CUDA graphs;
//! - errors are values: [`Error`], with [`OomInfo`] for out of memory.
//!
//! ```
//! use gpumem::driver::sim::SimConfig;
//! use gpumem::pool::{Pool, PoolResource};
//! use gpumem::resource::{DeviceResource, MemoryResource};
//! use gpumem::Device;
//!
//! # fn main() -> gpumem::Result<()> {
//! let device = Device::sim(SimConfig::default()); // or Device::cuda(0)?
//! let stream = device.create_stream()?;
//! let pool = PoolResource::with_defaults(DeviceResource::new(device.clone()))?;
//! let p = pool.allocate(1 << 20, 256, &stream)?;
//! pool.deallocate(p, 1 << 20, 256, &stream)?;
//! assert!(pool.reserved_bytes() >= 1 << 20); // kept for the next request
//! # Ok(()) }
//! ```
//!
//! The repository's README and `docs/` hold the guides (PyTorch and CuPy,
//! configuration, several GPUs, sleep and wake, the architecture) and
//! `BENCHMARKS.md` the measurements.
#![warn(missing_docs)]
// `unsafe` lives at the bottom: the driver backends and the OS calls, and
// the owners of driver handles and memory that pass them to the driver's
// `unsafe` methods (streams and events, graphs, CUDA's pools, the upstream
// resources' allocations, `VirtualPool`'s physical memory: each module says
// why its handles are live). Above them it is allowed only where the public
// API itself hands out host memory the compiler cannot track (the `unsafe fn`
// copies and host slices of `buffer` and `manager`, cudarc's kernel-argument
// trait in `interop`) or takes a driver handle from elsewhere
// (`Stream::from_raw`, `AsyncViewResource::new`).
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

/// The README's and the guides' Rust examples, compiled and run with the
/// doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;

/// See [`ReadmeExamples`].
#[cfg(doctest)]
#[doc = include_str!("../../../docs/sleep-wake.md")]
pub struct SleepWakeGuide;

// The folders group the modules by layer (docs/ARCHITECTURE.md): `sys/`
// (the OS), `driver/`, `handles/` (device, stream, error, graphs),
// `resource/` and `async_pool/` (upstreams), `suballoc/`, `pool/`,
// `adaptor/`, `facade/` (buffers, the manager, the registry, interop,
// logs). A module's path stays what it was: `gpumem::device`, not the
// folder's.
pub mod adaptor;
pub mod async_pool;
#[allow(unsafe_code)]
#[path = "facade/buffer/mod.rs"]
pub mod buffer;
#[path = "handles/captures.rs"]
pub mod captures;
#[path = "handles/device.rs"]
pub mod device;
#[allow(unsafe_code)]
pub mod driver;
#[path = "handles/error.rs"]
mod error;
#[path = "sys/exit.rs"]
pub mod exit;
#[path = "sys/fork.rs"]
pub mod fork;
#[allow(unsafe_code)] // owns graph handles
#[path = "handles/graph.rs"]
pub mod graph;
#[allow(unsafe_code)]
#[path = "facade/interop.rs"]
pub mod interop;
#[path = "sys/logger.rs"]
pub mod logger;
#[path = "facade/manager/mod.rs"]
pub mod manager;
#[allow(unsafe_code)]
#[path = "sys/os.rs"]
mod os;
pub mod pool;
#[path = "facade/registry.rs"]
pub mod registry;
pub mod resource;
#[allow(unsafe_code)]
#[path = "handles/stream.rs"]
pub mod stream;
pub mod suballoc;
#[path = "facade/trace.rs"]
pub mod trace;
#[path = "handles/units.rs"]
pub mod units;

pub use buffer::DeviceBuffer;
pub use device::Device;
pub use driver::{Backend, DevicePtr};
pub use error::{check_alignment, Error, FreeError, LiveAllocations, OomInfo, Result};
pub use graph::{Graph, GraphExec, RelaxedCapture};
/// Memory for CUDA graphs; the pool's home is [`pool::graph_pool`].
pub use pool::graph_pool;
pub use stream::{Event, Stream, StreamId};
