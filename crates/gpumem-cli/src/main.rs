//! The `gpumem` command: device information, an allocation demo and (as they
//! land) benchmarks and trace replay. Runs on the real GPU when there is one and
//! on the simulated device otherwise, and always says which.

mod demo;
mod target;
mod transfer;

use clap::{Parser, Subcommand};

use target::DeviceChoice;

/// gpumem: a GPU memory manager. With no subcommand, runs the main job: device
/// information and a short allocation demo.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Which device to run on: the real GPU, the simulated device, or auto
    /// (the GPU when present).
    #[arg(long, global = true, value_enum, default_value_t = DeviceChoice::Auto)]
    device: DeviceChoice,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the device, its memory and the features gpumem uses.
    Info,
    /// Allocate, copy and free through the device resource, checking contents.
    Demo,
    /// Host<->device copy bandwidth: pinned-pool memory versus pageable memory.
    Transfer(transfer::TransferArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = (|| -> gpumem::Result<()> {
        let target = target::open(cli.device)?;
        match cli.command {
            Some(Command::Info) => target::print_info(&target),
            Some(Command::Demo) => demo::run(&target),
            Some(Command::Transfer(args)) => transfer::run(&target, &args),
            None => {
                target::print_info(&target)?;
                demo::run(&target)
            }
        }
    })();
    if let Err(e) = result {
        eprintln!("gpumem: error: {e}");
        std::process::exit(1);
    }
}
