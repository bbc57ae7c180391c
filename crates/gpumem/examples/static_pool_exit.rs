//! A resource kept in a `static` for the life of the process, with memory still
//! allocated when `main` returns: the situation that crashes C++ programs whose
//! pool's destructor runs after the CUDA driver has shut down.
//!
//! In Rust a `static` is never dropped, so nothing here calls the driver at
//! exit; gpumem's exit hook ([`gpumem::exit`]) runs instead, marking the
//! process as exiting (any `Drop` that would call the driver from then on leaks)
//! and flushing the buffered log of the `static` logging adaptor.
//!
//! Runs on the backend `GPUMEM_DEVICE` names (the simulated device by default).
//! With `GPUMEM_LOG_FILE` set, the allocations are also logged there in RMM's
//! CSV format. Must exit with status 0 and print nothing to stderr.
//!
//! ```sh
//! GPUMEM_LOG_FILE=/tmp/exit.csv cargo run -p gpumem --example static_pool_exit
//! ```

use std::sync::OnceLock;

use gpumem::adaptor::{LoggingAdaptor, StatisticsAdaptor};
use gpumem::driver::sim::SimConfig;
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, DevicePtr};

/// The process-wide resource: statistics over the device's memory.
static RESOURCE: OnceLock<StatisticsAdaptor<DeviceResource>> = OnceLock::new();
/// When `GPUMEM_LOG_FILE` is set: a logging adaptor over `RESOURCE`.
static LOGGED: OnceLock<LoggingAdaptor<&'static StatisticsAdaptor<DeviceResource>>> =
    OnceLock::new();
/// Allocations deliberately still live at exit.
static KEPT: OnceLock<Vec<(DevicePtr, usize)>> = OnceLock::new();

/// Sets up the statics, allocates, frees part, and returns with the rest live.
pub fn run() -> gpumem::Result<()> {
    let (device, _sim) = Device::from_env(SimConfig::default())?;
    let stats: &'static StatisticsAdaptor<DeviceResource> =
        RESOURCE.get_or_init(|| StatisticsAdaptor::new(DeviceResource::new(device.clone())));
    let mr: &dyn MemoryResource = if std::env::var_os(gpumem::adaptor::LOG_FILE_ENV).is_some() {
        let logged = LoggingAdaptor::from_env(stats)?;
        LOGGED.get_or_init(|| logged)
    } else {
        stats
    };
    let stream = device.create_stream()?;
    let mut kept = Vec::new();
    for i in 1..=16usize {
        let bytes = i << 16;
        let p = mr.allocate(bytes, 256, &stream)?;
        if i % 2 == 0 {
            mr.deallocate(p, bytes, 256, &stream)?;
        } else {
            kept.push((p, bytes));
        }
    }
    stream.synchronize()?;
    let s = stats.stats();
    println!(
        "{} allocations live at exit, {} bytes; peak {} bytes",
        s.active.current, s.allocated_bytes.current, s.allocated_bytes.peak
    );
    let _ = KEPT.set(kept);
    Ok(())
}

#[allow(dead_code)]
fn main() -> gpumem::Result<()> {
    run()
}
