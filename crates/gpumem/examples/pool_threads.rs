//! Threads allocating from one PoolResource at once, pass by pass: wall ns
//! per operation (an allocation or a free, all threads together), the lock
//! shards in use, the contended acquisitions counted before the threads
//! spread, and the pool's reserve over the live peak. Shows when a pool of
//! the default configuration spreads its threads over its shards
//! (`PoolConfig::spread`) and what it costs on the way.
//!
//! `cargo run --release -p gpumem --example pool_threads -- [THREADS] [OPS] [PASSES] [SPREAD]`
//! with SPREAD `contended` (the default), `always` or `one` (one shard);
//! `GPUMEM_DEVICE=cuda` for the real GPU.

use std::sync::Barrier;
use std::time::Instant;

use gpumem::driver::sim::SimConfig;
use gpumem::pool::{PoolConfig, PoolResource, Spread};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, DevicePtr};
use rand::{Rng, SeedableRng};

fn arg<T: std::str::FromStr>(i: usize, default: T) -> T {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() -> gpumem::Result<()> {
    let threads: usize = arg(1, 8);
    let ops: usize = arg(2, 10_000);
    let passes: usize = arg(3, 5);
    let spread: String = arg(4, "contended".to_string());
    let device = Device::from_env(SimConfig::default())?.0;
    let mut config = PoolConfig::default();
    match spread.as_str() {
        "always" => config.spread = Spread::Always,
        "one" => config.shards = 1,
        _ => {}
    }
    let pool = PoolResource::new(DeviceResource::new(device.clone()), config)?;
    let streams: Vec<_> = (0..threads)
        .map(|_| device.create_stream())
        .collect::<gpumem::Result<_>>()?;
    println!("{threads} threads, {ops} operations each per pass, spread {spread}");
    println!("pass  ns/op  shards  contended  reserved/live-peak");
    for pass in 0..passes {
        let start = Barrier::new(threads);
        // Each thread's first and last moment: the pass is the span of all.
        let spans: Vec<(Instant, Instant)> = std::thread::scope(|scope| {
            let handles: Vec<_> = streams
                .iter()
                .enumerate()
                .map(|(t, stream)| {
                    let (pool, start) = (&pool, &start);
                    scope.spawn(move || {
                        let seed = (pass * threads + t) as u64;
                        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                        let mut live: Vec<(DevicePtr, usize)> = Vec::with_capacity(128);
                        start.wait();
                        let t0 = Instant::now();
                        for _ in 0..ops {
                            if live.len() < 128 && (live.len() < 64 || rng.random_bool(0.5)) {
                                let bytes = 2f64.powf(rng.random_range(8.0f64..22.0)) as usize;
                                live.push((pool.allocate(bytes, 256, stream).unwrap(), bytes));
                            } else {
                                let (p, b) = live.swap_remove(rng.random_range(0..live.len()));
                                pool.deallocate(p, b, 256, stream).unwrap();
                            }
                        }
                        for (p, b) in live {
                            pool.deallocate(p, b, 256, stream).unwrap();
                        }
                        (t0, Instant::now())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let first = spans.iter().map(|s| s.0).min().unwrap();
        let last = spans.iter().map(|s| s.1).max().unwrap();
        let ns = (last - first).as_nanos() as f64 / (threads * ops) as f64;
        let st = pool.stats();
        println!(
            "{pass:>4}  {ns:>5.0}  {:>6}  {:>9}  {:.2}",
            st.shards_in_use,
            st.contended,
            st.peak_reserved as f64 / st.peak_live.max(1) as f64
        );
    }
    device.synchronize()
}
