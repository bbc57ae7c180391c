//! Bookkeeping cost of the stream-ordered pools on the simulated device (or
//! the real GPU with `GPUMEM_DEVICE=cuda`): ns per operation (an allocation
//! or a free) for 1 MiB alloc/free pairs on one stream, 256 B pairs, and
//! random log-uniform sizes of 256 B–64 MiB with at most 1000 live.
//!
//! `cargo run --release -p gpumem --example pools_speed`

use std::time::Instant;

use gpumem::driver::sim::SimConfig;
use gpumem::pool::{
    BinningConfig, BinningResource, CachingPool, CachingPoolConfig, FixedSizeConfig,
    FixedSizeResource,
};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, DevicePtr, Stream};
use rand::{Rng, SeedableRng};

fn pairs<R: MemoryResource>(mr: &R, stream: &Stream, bytes: usize, n: usize) -> f64 {
    // Warm the cache first.
    let p = mr.allocate(bytes, 256, stream).unwrap();
    mr.deallocate(p, bytes, 256, stream).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        let p = mr.allocate(bytes, 256, stream).unwrap();
        mr.deallocate(p, bytes, 256, stream).unwrap();
    }
    t.elapsed().as_nanos() as f64 / (2 * n) as f64
}

fn random<R: MemoryResource>(mr: &R, stream: &Stream, n: usize) -> f64 {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let sizes: Vec<usize> = (0..n)
        .map(|_| {
            let log = rng.random_range(8.0f64..26.0);
            2f64.powf(log) as usize
        })
        .collect();
    let picks: Vec<usize> = (0..n).map(|_| rng.random_range(0..1000)).collect();
    let run = |ops: usize| {
        let mut live: Vec<(DevicePtr, usize)> = Vec::with_capacity(1000);
        let mut count = 0usize;
        for i in 0..ops {
            if live.len() < 1000 && (live.len() < 500 || picks[i].is_multiple_of(2)) {
                let b = sizes[i];
                live.push((mr.allocate(b, 256, stream).unwrap(), b));
            } else {
                let (p, b) = live.swap_remove(picks[i] % live.len());
                mr.deallocate(p, b, 256, stream).unwrap();
            }
            count += 1;
        }
        for (p, b) in live {
            mr.deallocate(p, b, 256, stream).unwrap();
            count += 1;
        }
        count
    };
    run(n); // warm-up: fills the caches
    let t = Instant::now();
    let ops = run(n);
    t.elapsed().as_nanos() as f64 / ops as f64
}

fn report<R: MemoryResource>(name: &str, mr: &R, stream: &Stream, random_too: bool) {
    let one_mib = pairs(mr, stream, 1 << 20, 200_000);
    let small = pairs(mr, stream, 256, 200_000);
    let rand = if random_too {
        format!("{:>10.1}", random(mr, stream, 200_000))
    } else {
        format!("{:>10}", "-")
    };
    println!("{name:<28} {one_mib:>10.1} {small:>10.1} {rand}");
}

fn main() {
    let (device, sim) = Device::from_env(SimConfig::default()).expect("a device");
    println!(
        "device: {} ({}); ns per operation (an allocation or a free)",
        device.backend(),
        if sim.is_some() {
            "bookkeeping only"
        } else {
            "real GPU"
        }
    );
    println!(
        "{:<28} {:>10} {:>10} {:>10}",
        "pool", "1 MiB", "256 B", "random"
    );
    let stream = device.create_stream().unwrap();
    let caching = CachingPool::new(
        DeviceResource::new(device.clone()),
        CachingPoolConfig::default(),
    )
    .unwrap();
    report("CachingPool", &caching, &stream, true);
    let binning = BinningResource::new(
        DeviceResource::new(device.clone()),
        BinningConfig::fixed_bins(8, 26),
    )
    .unwrap();
    report("BinningResource 2^8..2^26", &binning, &stream, true);
    let fixed = FixedSizeResource::new(
        DeviceResource::new(device.clone()),
        FixedSizeConfig::with_block_size(1 << 20),
    )
    .unwrap();
    report("FixedSizeResource 1 MiB", &fixed, &stream, false);
    report(
        "DeviceResource (driver)",
        &DeviceResource::new(device.clone()),
        &stream,
        true,
    );
}
