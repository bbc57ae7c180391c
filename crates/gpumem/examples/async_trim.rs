//! Giving memory back: the release threshold at synchronize, and `Pool::trim`.
//!
//! Runs on the simulated device by default; `GPUMEM_DEVICE=cuda` runs it on
//! the GPU.
//!
//! ```sh
//! cargo run -p gpumem --example async_trim
//! ```

use gpumem::async_pool::{AsyncResource, AsyncResourceConfig};
use gpumem::driver::sim::SimConfig;
use gpumem::pool::Pool;
use gpumem::resource::MemoryResource;
use gpumem::Device;

const MIB: usize = 1 << 20;

fn main() -> gpumem::Result<()> {
    let (device, _) = Device::from_env(SimConfig::default())?;
    println!("device: {} {}", device.backend(), device.info()?.name);
    let stream = device.create_stream()?;

    let mut config = AsyncResourceConfig::default();
    config.initial_size = 256 * MIB;
    let mr = AsyncResource::new(device.clone(), config)?;
    println!(
        "primed:              reserved {:>10} bytes",
        mr.reserved_current()?
    );

    let ptrs: Vec<_> = (0..8)
        .map(|_| mr.allocate(32 * MIB, 256, &stream))
        .collect::<gpumem::Result<_>>()?;
    for p in ptrs {
        mr.deallocate(p, 32 * MIB, 256, &stream)?;
    }
    stream.synchronize()?;
    println!(
        "freed, synchronized: reserved {:>10} bytes (threshold u64::MAX keeps it)",
        mr.reserved_current()?
    );

    let back = mr.trim(64 * MIB)?;
    println!(
        "trim(64 MiB):        reserved {:>10} bytes ({back} given back)",
        mr.reserved_bytes()
    );
    let back = mr.trim(0)?;
    println!(
        "trim(0):             reserved {:>10} bytes ({back} given back)",
        mr.reserved_bytes()
    );

    // A threshold instead of explicit trims: synchronize keeps at most 16 MiB.
    mr.set_release_threshold(16 * MIB as u64)?;
    let p = mr.allocate(128 * MIB, 256, &stream)?;
    mr.deallocate(p, 128 * MIB, 256, &stream)?;
    println!(
        "128 MiB freed:       reserved {:>10} bytes",
        mr.reserved_current()?
    );
    stream.synchronize()?;
    device.synchronize()?;
    println!(
        "after synchronize:   reserved {:>10} bytes (threshold 16 MiB)",
        mr.reserved_current()?
    );
    println!("peak reserved:       {:>10} bytes", mr.reserved_high()?);
    Ok(())
}
