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

pub mod adaptor;
pub mod async_pool;
#[allow(unsafe_code)]
pub mod buffer;
pub mod captures;
pub mod device;
#[allow(unsafe_code)]
pub mod driver;
mod error;
pub mod exit;
pub mod fork;
#[allow(unsafe_code)] // owns graph handles
pub mod graph;
pub mod graph_pool;
#[allow(unsafe_code)]
pub mod interop;
pub mod logger;
pub mod manager;
#[allow(unsafe_code)]
mod os;
pub mod pool;
pub mod registry;
pub mod resource;
#[allow(unsafe_code)]
pub mod stream;
pub mod suballoc;
pub mod trace;
pub mod units;

pub use buffer::DeviceBuffer;
pub use device::Device;
pub use driver::{Backend, DevicePtr};
pub use error::{check_alignment, Error, FreeError, LiveAllocations, OomInfo, Result};
pub use graph::{Graph, GraphExec, RelaxedCapture};
pub use stream::{Event, Stream, StreamId};
