//! Choosing and describing the device the command runs on.

use gpumem::driver::sim::SimConfig;
use gpumem::{Backend, Device};

use crate::outln;

/// The `--device` choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DeviceChoice {
    /// The GPU when one is present, else the simulated device.
    Auto,
    /// The real GPU through the CUDA driver.
    Cuda,
    /// The simulated device (measures bookkeeping only).
    Sim,
}

/// The device the command runs on and why.
pub struct Target {
    /// The device.
    pub device: Device,
    /// Why this backend was chosen, for the first line of output.
    pub reason: String,
}

/// The simulated device every subcommand uses: 80 GiB, like an H100.
/// `backed` puts host memory behind its device memory, allocated as it is
/// used, for the demo's and transfer's content checks; without it the device
/// is address-only, so traces with 14 GB peaks replay on a small machine.
pub fn sim_config(backed: bool) -> SimConfig {
    let mut config = SimConfig::default();
    config.backed = backed;
    config
}

/// Opens the device `choice` asks for; `backed` as in [`sim_config`].
pub fn open(choice: DeviceChoice, backed: bool) -> gpumem::Result<Target> {
    match choice {
        DeviceChoice::Cuda => Ok(Target {
            device: Device::cuda(0)?,
            reason: "asked for with --device cuda".into(),
        }),
        DeviceChoice::Sim => Ok(Target {
            device: Device::sim(sim_config(backed)),
            reason: "asked for with --device sim".into(),
        }),
        DeviceChoice::Auto => match Device::cuda(0) {
            Ok(device) => Ok(Target {
                device,
                reason: "a GPU is present".into(),
            }),
            Err(e) => Ok(Target {
                device: Device::sim(sim_config(backed)),
                reason: format!("no GPU ({e})"),
            }),
        },
    }
}

fn gib(bytes: usize) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Prints the one line that says which device runs and why, with its name.
pub fn print_device_line(target: &Target) -> anyhow::Result<()> {
    let d = &target.device;
    let kind = match d.backend() {
        Backend::Cuda => "cuda (real GPU)",
        Backend::Sim => "sim (simulated device: timings measure bookkeeping only)",
    };
    outln!("device: {kind}: {}", target.reason)?;
    let info = d.info()?;
    outln!("  [{}] {}", info.ordinal, info.name)?;
    Ok(())
}

/// Prints the device line and its features.
pub fn print_info(target: &Target) -> anyhow::Result<()> {
    let d = &target.device;
    let info = d.info()?;
    let mem = d.mem_info()?;
    let kind = match d.backend() {
        Backend::Cuda => "cuda (real GPU)",
        Backend::Sim => "sim (simulated device: timings measure bookkeeping only)",
    };
    outln!("device: {kind}: {}", target.reason)?;
    outln!(
        "  [{}] {}  compute {}.{}  memory {} total, {} free",
        info.ordinal,
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        gib(mem.total),
        gib(mem.free)
    )?;
    let yes = |b: bool| if b { "yes" } else { "no" };
    outln!(
        "  memory pools: {}  virtual memory: {} (granularity {} KiB)  posix-fd IPC: {}  managed: {}  pageable access: {}",
        yes(info.memory_pools),
        yes(info.vmm),
        d.driver()
            .vmm_granularity(d.ordinal(), false)
            .map(|g| (g >> 10).to_string())
            .unwrap_or_else(|_| "-".into()),
        yes(info.posix_fd_ipc),
        yes(info.managed_memory),
        yes(info.pageable_memory_access)
    )?;
    Ok(())
}
