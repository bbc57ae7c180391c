//! Replays RMM allocation logs through a [`PoolResource`] with expandable
//! heaps on the simulated device, several passes through one pool, and
//! prints per pass the driver calls it made (events of frees across
//! streams included), how often the pool grew, and the reserve over the
//! live peak so far. `--recycle` turns on `PoolConfig::recycle_pieces`;
//! without traces named, the two shared ones. A pass after the first that
//! grows placed its blocks otherwise than the first did
//! (`docs/decisions.md`).
//!
//! ```text
//! cargo run --release -p gpumem --example pool_passes -- [--passes N] [--recycle] [trace.rmm.csv ...]
//! ```

use std::collections::HashMap;

use gpumem::driver::sim::SimConfig;
use gpumem::pool::{PoolConfig, PoolResource};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::trace::{self, Action};
use gpumem::{Device, DevicePtr, Stream};

fn main() {
    let mut passes = 6;
    let mut recycle = false;
    let mut paths = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--passes" => {
                passes = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .expect("--passes N")
            }
            "--recycle" => recycle = true,
            _ => paths.push(a),
        }
    }
    if paths.is_empty() {
        paths = ["resnet50_train", "gpt2_train"]
            .map(|t| format!("{}/../../traces/{t}.rmm.csv", env!("CARGO_MANIFEST_DIR")))
            .to_vec();
    }
    for path in &paths {
        let events = trace::read_file(path).expect("trace");
        let (device, sim) = Device::sim_with_driver(SimConfig::default());
        let mut config = PoolConfig::default();
        config.expandable = true;
        config.recycle_pieces = recycle;
        let pool = PoolResource::new(DeviceResource::new(device.clone()), config).expect("pool");
        let mut streams: HashMap<u64, Stream> = HashMap::new();
        println!("{path}");
        for pass in 1..=passes {
            let before = sim.total_calls();
            let mut growths = 0;
            let mut live: HashMap<u64, (DevicePtr, usize, u64)> = HashMap::new();
            for e in events.iter() {
                let s = streams
                    .entry(e.stream)
                    .or_insert_with(|| device.create_stream().expect("stream"));
                match e.action {
                    Action::Allocate => {
                        let reserved = pool.stats().reserved;
                        let p = pool.allocate(e.size, 256, s).expect("allocate");
                        growths += usize::from(pool.stats().reserved > reserved);
                        live.insert(e.ptr, (p, e.size, e.stream));
                    }
                    Action::Free => {
                        if let Some((p, size, _)) = live.remove(&e.ptr) {
                            pool.deallocate(p, size, 256, s).expect("free");
                        }
                    }
                    _ => {}
                }
            }
            for (_, (p, size, st)) in live.drain() {
                pool.deallocate(p, size, 256, &streams[&st]).expect("free");
            }
            let st = pool.stats();
            println!(
                "  pass {pass}: driver calls {:5}  growths {:4}  reserved/live {:.4}  reserved {:.0} MiB",
                sim.total_calls() - before,
                growths,
                st.peak_reserved as f64 / st.peak_live as f64,
                st.peak_reserved as f64 / 1048576.0
            );
        }
    }
}
