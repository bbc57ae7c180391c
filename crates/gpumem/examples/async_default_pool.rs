//! The device's default memory pool as a gpumem resource: what
//! `cudaMallocAsync` uses, shared with everyone in the process.
//!
//! Runs on the simulated device by default; `GPUMEM_DEVICE=cuda` runs it on
//! the GPU.
//!
//! ```sh
//! cargo run -p gpumem --example async_default_pool
//! ```

use gpumem::async_pool::AsyncResource;
use gpumem::driver::sim::SimConfig;
use gpumem::resource::MemoryResource;
use gpumem::{Device, DeviceBuffer};

fn main() -> gpumem::Result<()> {
    let (device, _) = Device::from_env(SimConfig::backed(256 << 20))?;
    println!("device: {} {}", device.backend(), device.info()?.name);

    let mr = AsyncResource::default_pool(device.clone())?;
    // The default pool gives unused memory back at every synchronize
    // (threshold 0) unless someone raised it; raising it affects every user
    // of the pool in the process.
    println!("release threshold: {}", mr.release_threshold()?);
    mr.set_release_threshold(u64::MAX)?;

    let stream = device.create_stream()?;
    let data: Vec<f32> = (0..1 << 20).map(|i| i as f32).collect();
    let buf = DeviceBuffer::from_slice(&data, &mr, &stream)?;
    assert_eq!(buf.to_vec()?, data);
    println!(
        "allocated {} bytes; pool reserves {} and hands out {}",
        buf.size_bytes(),
        mr.reserved_current()?,
        mr.used_current()?
    );
    drop(buf);

    // The raw interface: bytes, alignment, stream; freed in stream order.
    let p = mr.allocate(4 << 20, 256, &stream)?;
    mr.deallocate(p, 4 << 20, 256, &stream)?;
    stream.synchronize()?;
    println!(
        "after free: used {} bytes, reserved {}",
        mr.used_current()?,
        mr.reserved_current()?
    );

    // Put the shared pool back the way the driver sets it.
    mr.set_release_threshold(0)?;
    Ok(())
}
