//! A short allocation demo: a typed buffer round trip with a content check,
//! and the cost of the driver's own allocator for comparison.

use std::time::Instant;

use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::DeviceBuffer;

use crate::outln;
use crate::target::Target;

/// Runs the demo on the target device.
pub fn run(target: &Target) -> anyhow::Result<()> {
    let device = &target.device;
    let stream = device.create_stream()?;
    let resource = DeviceResource::new(device.clone());

    let n = 1 << 20;
    let input: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let buf = DeviceBuffer::from_slice(&input, &resource, &stream)?;
    let back = buf.to_vec()?;
    let ok = back == input;
    outln!(
        "demo: DeviceBuffer<u32> of {} MiB host->device->host: {}",
        buf.size_bytes() >> 20,
        if ok { "contents match" } else { "MISMATCH" }
    )?;
    drop(buf);
    if !ok {
        anyhow::bail!("the round trip returned different data");
    }

    let iters = 200;
    let start = Instant::now();
    for _ in 0..iters {
        let p = resource.allocate(1 << 20, 256, &stream)?;
        resource.deallocate(p, 1 << 20, 256, &stream)?;
    }
    let ns = start.elapsed().as_nanos() as f64 / (2 * iters) as f64;
    outln!("demo: driver allocator (cuMemAlloc/cuMemFree, 1 MiB): {ns:.0} ns per operation")?;
    Ok(())
}
