//! A pool of our own: primed, bounded, keeping its memory, with its attributes
//! read and changed.
//!
//! Runs on the simulated device by default; `GPUMEM_DEVICE=cuda` runs it on
//! the GPU.
//!
//! ```sh
//! cargo run -p gpumem --example async_custom_pool
//! ```

use gpumem::async_pool::{AsyncResource, AsyncResourceConfig, ReusePolicy};
use gpumem::driver::sim::SimConfig;
use gpumem::resource::MemoryResource;
use gpumem::{Device, DeviceBuffer};

const MIB: usize = 1 << 20;

fn main() -> gpumem::Result<()> {
    let (device, _) = Device::from_env(SimConfig::backed(256 << 20))?;
    println!("device: {} {}", device.backend(), device.info()?.name);

    let mut config = AsyncResourceConfig::default();
    // Allocated and freed once: reserved from the start.
    config.initial_size = 32 * MIB;
    // Keep everything across synchronizes (the default here).
    config.release_threshold = u64::MAX;
    // Never more than this from the device.
    config.max_reserved = Some(128 * MIB);
    let mr = AsyncResource::new(device.clone(), config)?;
    println!("pool {:#x}: {:?}", mr.raw(), mr.usage()?);

    for policy in ReusePolicy::ALL {
        println!("{policy:?}: {}", mr.reuse_policy(policy)?);
    }
    // Stricter reuse: only memory whose free has completed in stream order or
    // through an event the allocating stream waited for.
    mr.set_reuse_policy(ReusePolicy::AllowInternalDependencies, false)?;

    let stream = device.create_stream()?;
    let bufs: Vec<DeviceBuffer<u8, &AsyncResource>> = (0..4)
        .map(|_| DeviceBuffer::zeroed(16 * MIB, &mr, &stream))
        .collect::<gpumem::Result<_>>()?;
    println!("4 x 16 MiB live: {:?}", mr.usage()?);
    drop(bufs);
    stream.synchronize()?;
    println!("all freed:      {:?}", mr.usage()?);

    // The limit is an error with the numbers, not a crash.
    match mr.allocate(256 * MIB, 256, &stream) {
        Err(e) => println!("256 MiB from a 128 MiB pool: {e}"),
        Ok(p) => {
            mr.deallocate(p, 256 * MIB, 256, &stream)?;
            println!("unexpected: the limit did not hold");
        }
    }

    mr.reset_used_high()?;
    mr.reset_reserved_high()?;
    println!("highs reset:    {:?}", mr.usage()?);
    Ok(())
}
