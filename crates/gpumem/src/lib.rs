#![doc = include_str!("../../../README.md")]
#![warn(missing_docs)]

pub mod adaptor;
pub mod async_pool;
pub mod buffer;
pub mod device;
pub mod driver;
mod error;
pub mod exit;
pub mod fork;
pub mod interop;
pub mod manager;
pub mod pool;
pub mod registry;
pub mod resource;
pub mod stream;
pub mod suballoc;
pub mod trace;

pub use buffer::DeviceBuffer;
pub use device::Device;
pub use driver::{Backend, DevicePtr};
pub use error::{check_alignment, Error, FreeError, LiveAllocations, OomInfo, Result};
pub use stream::{Event, Stream, StreamId};
