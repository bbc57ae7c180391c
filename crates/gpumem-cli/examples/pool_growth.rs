//! Where a PoolResource's reserve goes on the `iterations` workload: replays
//! `--passes` passes (vary `--vary`) on the simulated device and prints the
//! pool's numbers each time its reserve grows after the first pass
//! (`ALL_PASSES=1`: in the first pass too).
//!
//! ```text
//! cargo run --release -p gpumem-cli --example pool_growth -- --vary 0.3 --passes 6
//! ```

use gpumem::driver::sim::SimConfig;
use gpumem::pool::{PoolConfig, PoolResource};
use gpumem::resource::DeviceResource;
use gpumem::Device;
use gpumem_cli::iterations::{generate, IterationsConfig, BATCH};
use gpumem_cli::workload::{replay_streams, run_replay};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |flag: &str, default: f64| -> f64 {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let cfg = IterationsConfig {
        vary: arg("--vary", 0.3),
        iterations: arg("--iterations", 20.0) as usize,
        batch: BATCH,
        seed: 42,
    };
    let passes = arg("--passes", 6.0) as usize;
    let (device, _) = Device::sim_with_driver(SimConfig::default());
    let pool = PoolResource::new(DeviceResource::new(device.clone()), PoolConfig::default())?;
    let mut peak_live = 0;
    // The same streams for every pass, as `gpumem bench` keeps them.
    let streams = replay_streams(&device, &generate(&cfg, 0).prep)?;
    for pass in 0..passes {
        let p = generate(&cfg, pass);
        peak_live = peak_live.max(p.prep.peak_live);
        let mut last = pool.stats().reserved;
        let mut step = |i: usize, _| {
            let s = pool.stats();
            if s.reserved > last && (pass > 0 || std::env::var_os("ALL_PASSES").is_some()) {
                let op = &p.prep.ops[i];
                println!(
                    "pass {pass} op {i}: +{:.1} MiB for {:.1} MiB; reserved {:.2} GiB live {:.2} GiB free {:.2} GiB in {} blocks (largest {:.1} MiB), {} regions",
                    (s.reserved - last) as f64 / 1048576.0,
                    op.size as f64 / 1048576.0,
                    s.reserved as f64 / 1073741824.0,
                    s.live as f64 / 1073741824.0,
                    s.free as f64 / 1073741824.0,
                    s.free_blocks,
                    s.largest_free as f64 / 1048576.0,
                    s.regions
                );
                last = s.reserved;
            }
        };
        run_replay(&pool, &device, &p.prep, Some(&streams), Some(&mut step))?;
        let s = pool.stats();
        println!(
            "end of pass {pass}: reserved {:.2} GiB, peak reserved / peak live {:.3}",
            s.reserved as f64 / 1073741824.0,
            s.peak_reserved as f64 / peak_live as f64
        );
    }
    Ok(())
}
