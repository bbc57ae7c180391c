//! The facade: [`MemoryManager`], one object per device (and one process-wide
//! instance, [`MemoryManager::global`]) owning a [`PinnedPool`] of host memory
//! and a device pool, plus the [`PlannedPool`] for want/satisfy/commit
//! layouts.
//!
//! - [`memory_manager`]: the manager, its settings and shutdown.
//! - [`device_mode`]: [`DeviceAllocatorMode`] and the device pool behind each
//!   mode (CUDA's pool is [`crate::async_pool::AsyncResource`]).
//! - [`pinned_pool`]: [`PinnedPool`], pinned host memory reused only once the
//!   copies that used it are done; a `MemoryResource` and an
//!   `allocator_api2` allocator.
//! - [`planned_pool`]: [`PlannedPool`] with typed [`HostSlot`] /
//!   [`DeviceSlot`] tokens.

pub mod device_mode;
#[allow(unsafe_code)] // `shutdown_unchecked`
pub mod memory_manager;
#[allow(unsafe_code)] // pinned host memory as Rust slices; `allocator_api2::Allocator`
pub mod pinned_pool;
#[allow(unsafe_code)] // host slots of pinned memory
pub mod planned_pool;

pub use device_mode::DeviceAllocatorMode;
pub use memory_manager::{MemoryManager, ShutdownReport};
pub use pinned_pool::{
    PinnedPool, PinnedPoolConfig, PinnedPoolStats, PinnedRelease, COPY_BATCH, PINNED_MAX_ALIGNMENT,
};
pub use planned_pool::{DeviceSlot, HostSlot, PlanPhase, PlannedPool};
