//! Times the arena allocator on the simulated device (bookkeeping only, no
//! data): 256 B and 1 MiB alloc/free pairs, random log-uniform 256 B–64 MiB
//! with at most 1000 live, and 8 threads each with its own stream
//! (256 B–4 MiB). Prints ns per operation (an allocation or a free).
//!
//! `cargo run --release -p gpumem --example arena_speed`

use std::sync::Arc;
use std::time::Instant;

use gpumem::driver::sim::SimConfig;
use gpumem::pool::{ArenaConfig, ArenaResource, Pool};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, DevicePtr};
use rand::{Rng, SeedableRng};

fn pairs(mr: &ArenaResource<DeviceResource>, device: &Device, bytes: usize, n: usize) -> f64 {
    let s = device.create_stream().unwrap();
    for _ in 0..1000 {
        let p = mr.allocate(bytes, 256, &s).unwrap();
        mr.deallocate(p, bytes, 256, &s).unwrap();
    }
    let t = Instant::now();
    for _ in 0..n {
        let p = mr.allocate(bytes, 256, &s).unwrap();
        mr.deallocate(p, bytes, 256, &s).unwrap();
    }
    t.elapsed().as_nanos() as f64 / (2 * n) as f64
}

fn log_uniform(rng: &mut impl Rng, lo: f64, hi: f64) -> usize {
    (lo.ln() + rng.random::<f64>() * (hi.ln() - lo.ln())).exp() as usize
}

fn random(mr: &ArenaResource<DeviceResource>, device: &Device, n: usize) -> f64 {
    let s = device.create_stream().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut live: Vec<(DevicePtr, usize)> = Vec::new();
    let t = Instant::now();
    let mut ops = 0usize;
    while ops < n {
        if live.len() < 1000 && (live.is_empty() || rng.random_bool(0.5)) {
            let bytes = log_uniform(&mut rng, 256.0, (64 << 20) as f64);
            live.push((mr.allocate(bytes, 256, &s).unwrap(), bytes));
        } else {
            let (p, b) = live.swap_remove(rng.random_range(0..live.len()));
            mr.deallocate(p, b, 256, &s).unwrap();
        }
        ops += 1;
    }
    let ns = t.elapsed().as_nanos() as f64 / ops as f64;
    for (p, b) in live {
        mr.deallocate(p, b, 256, &s).unwrap();
    }
    ns
}

fn threads(mr: Arc<ArenaResource<DeviceResource>>, device: &Device, per_thread: usize) -> f64 {
    let start = Arc::new(std::sync::Barrier::new(9));
    let handles: Vec<_> = (0..8u64)
        .map(|t| {
            let (mr, device, start) = (mr.clone(), device.clone(), start.clone());
            std::thread::spawn(move || {
                let s = device.create_stream().unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut live: Vec<(DevicePtr, usize)> = Vec::new();
                start.wait();
                for _ in 0..per_thread {
                    if live.len() < 64 && (live.is_empty() || rng.random_bool(0.5)) {
                        let bytes = log_uniform(&mut rng, 256.0, (4 << 20) as f64);
                        live.push((mr.allocate(bytes, 256, &s).unwrap(), bytes));
                    } else {
                        let (p, b) = live.swap_remove(rng.random_range(0..live.len()));
                        mr.deallocate(p, b, 256, &s).unwrap();
                    }
                }
                for (p, b) in live {
                    mr.deallocate(p, b, 256, &s).unwrap();
                }
            })
        })
        .collect();
    start.wait();
    let t = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    t.elapsed().as_nanos() as f64 / (8 * per_thread) as f64
}

fn main() {
    let device = Device::sim(SimConfig::default());
    let mr = Arc::new(
        ArenaResource::new(DeviceResource::new(device.clone()), ArenaConfig::default())
            .expect("arena"),
    );
    println!(
        "arena over the simulated device: {} GiB region, {} KiB superblocks",
        mr.reserved_bytes() >> 30,
        mr.superblock_size() >> 10
    );
    println!(
        "256 B alloc/free, one stream: {:.1} ns/op",
        pairs(&mr, &device, 256, 2_000_000)
    );
    println!(
        "1 MiB alloc/free, one stream: {:.1} ns/op",
        pairs(&mr, &device, 1 << 20, 2_000_000)
    );
    println!(
        "random log-uniform 256 B-64 MiB, <=1000 live: {:.1} ns/op",
        random(&mr, &device, 2_000_000)
    );
    println!(
        "8 threads x own stream, 256 B-4 MiB: {:.1} wall ns/op",
        threads(mr.clone(), &device, 500_000)
    );
    let st = mr.stats();
    println!("after: live {} bytes, {} stream arenas", st.live, st.arenas);
}
