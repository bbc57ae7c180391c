//! The `gpumem` command's machinery, as a library so it can be tested in
//! process: the allocator names, the benchmark workloads, trace replay,
//! timeline plots, the offline packing bound, the PyTorch snapshot
//! converter and the interactive memory viewer.
#![warn(missing_docs)]

pub mod allocators;
pub mod bench;
pub mod bound;
pub mod capi_cost;
pub mod demo;
pub mod iterations;
pub mod output;
pub mod pickle_bounds;
pub mod pickle_values;
pub mod plot;
pub mod progress;
pub mod replay;
pub mod snapshot;
pub mod target;
pub mod thread_crew;
pub mod units;
pub mod view;
pub mod workload;
