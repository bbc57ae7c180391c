#![doc = include_str!("../../../README.md")]
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

/// The guides' Rust examples, compiled and run with the doctests.
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
