//! The `iterations` workload: a synthetic training loop whose sizes change
//! by `--vary`, timed pass by pass (`--passes`) on the simulated device.

use gpumem::driver::sim::SimConfig;
use gpumem::Device;
use gpumem_cli::allocators;
use gpumem_cli::bench::{self, BenchConfig, RunContext, Workload};
use gpumem_cli::iterations::{generate, IterationsConfig};
use indicatif::ProgressBar;

fn loop_config(vary: f64) -> IterationsConfig {
    IterationsConfig {
        iterations: 5,
        vary,
        seed: 11,
        batch: 2,
    }
}

/// The sizes, kinds and streams of iteration `i`'s operations.
fn shape(pass: &gpumem_cli::iterations::Pass, i: usize) -> Vec<(usize, bool, u16)> {
    pass.iteration(i)
        .iter()
        .map(|o| (o.size, o.alloc, o.stream))
        .collect()
}

#[test]
fn vary_zero_repeats_one_iteration_and_vary_changes_them() {
    let fixed = generate(&loop_config(0.0), 0);
    assert_eq!(fixed.iteration_starts.len(), 5);
    // The first iteration also allocates the parameters and the optimizer
    // state; the others are the same operations, size for size.
    for i in 2..5 {
        assert_eq!(shape(&fixed, 1), shape(&fixed, i), "iteration {i}");
    }
    assert!(fixed.iteration(0).len() > fixed.iteration(1).len());
    // Another pass of a fixed loop is the same loop.
    assert_eq!(fixed.prep.ops, generate(&loop_config(0.0), 1).prep.ops);

    let varying = generate(&loop_config(0.3), 0);
    for i in 2..5 {
        assert_ne!(shape(&varying, 1), shape(&varying, i), "iteration {i}");
        // The same operations in the same order, only sizes differ.
        assert_eq!(varying.iteration(1).len(), varying.iteration(i).len());
    }
    assert_ne!(varying.prep.ops, generate(&loop_config(0.3), 1).prep.ops);
    // Larger vary, wider spread of per-iteration sizes.
    let spread = |v: f64| {
        let f = &generate(
            &IterationsConfig {
                iterations: 200,
                ..loop_config(v)
            },
            0,
        )
        .factors;
        f.iter().cloned().fold(f64::MIN, f64::max) / f.iter().cloned().fold(f64::MAX, f64::min)
    };
    assert_eq!(spread(0.0), 1.0);
    assert!(
        spread(0.3) < 2.0 && spread(1.0) > 10.0,
        "{} {}",
        spread(0.3),
        spread(1.0)
    );
}

#[test]
fn every_pass_is_reported_and_no_allocator_holds_less_than_is_live() {
    let ctx = RunContext::new(Device::sim(SimConfig::default())).unwrap();
    let cfg = BenchConfig {
        workloads: vec![Workload::Iterations],
        repeats: 2,
        passes: 4,
        iterations: 3,
        vary: 1.0,
        batch: 1,
        ..BenchConfig::default()
    };
    let specs = allocators::select(&[]).unwrap();
    let records = bench::run(&ctx, &cfg, &specs, &ProgressBar::hidden(), |_| Ok(())).unwrap();
    assert_eq!(records.len(), specs.len());
    assert!(records.iter().any(|r| r.alloc == "async"));
    for r in &records {
        assert!(r.error.is_none(), "{}: {:?}", r.alloc, r.error);
        assert_eq!(r.passes, 4);
        assert_eq!(r.pass_ns_per_op.len(), 4, "{}", r.alloc);
        assert!(r.pass_ns_per_op.iter().all(|&ns| ns > 0.0));
        assert_eq!(r.first_ns_per_op, Some(r.pass_ns_per_op[0]));
        assert_eq!(r.second_ns_per_op, Some(r.pass_ns_per_op[1]));
        assert_eq!(r.steady_ns_per_op, bench::steady(&r.pass_ns_per_op));
        let ratio = r.reserved_over_live.unwrap();
        assert!(ratio >= 1.0, "{}: reserved/live {ratio}", r.alloc);
        let v: serde_json::Value = serde_json::to_value(r).unwrap();
        for k in [
            "passes",
            "pass_ns_per_op",
            "first_ns_per_op",
            "second_ns_per_op",
            "steady_ns_per_op",
            "vary",
            "iterations",
            "reserved_over_live",
        ] {
            assert!(!v[k].is_null(), "{k} missing: {v}");
        }
        assert!(r.params.contains("vary=1"), "{}", r.params);
    }
}

#[test]
fn steady_is_the_median_after_the_second_pass_or_the_last() {
    assert_eq!(bench::steady(&[]), None);
    assert_eq!(bench::steady(&[5.0]), Some(5.0));
    assert_eq!(bench::steady(&[5.0, 3.0]), Some(3.0));
    assert_eq!(bench::steady(&[9.0, 5.0, 1.0, 3.0, 2.0]), Some(2.0));
    assert_eq!(bench::steady(&[9.0, 5.0, 1.0, 3.0]), Some(2.0));
}

#[test]
fn the_default_pool_stays_near_the_live_peak_when_sizes_vary() {
    // Sizes that change every iteration (variable sequence lengths) must not
    // spread a stream's memory over new regions while free space that fits
    // sits beside it, as PyTorch's allocator lets it on these loops
    // (`docs/decisions.md`).
    // The default pool grows ranges in place; with `expandable=false` it
    // takes separate regions, and must stay as lean.
    let ctx = RunContext::new(Device::sim(SimConfig::default())).unwrap();
    let specs = allocators::select(&["pool".into(), "pool+expandable=false".into()]).unwrap();
    for vary in [0.3, 1.0] {
        let cfg = BenchConfig {
            workloads: vec![Workload::Iterations],
            repeats: 1,
            passes: 4,
            vary,
            ..BenchConfig::default()
        };
        let records = bench::run(&ctx, &cfg, &specs, &ProgressBar::hidden(), |_| Ok(())).unwrap();
        assert_eq!(records.len(), 2);
        for r in &records {
            let ratio = r.reserved_over_live.unwrap();
            assert!(
                ratio <= 1.27,
                "{} vary {vary}: reserved/live {ratio:.3}",
                r.alloc
            );
        }
    }
}

#[test]
fn a_warm_virtual_pool_stops_mapping_when_sizes_vary() {
    // Once the pool has seen a few passes of varying sizes, a block of a
    // new size fits in free addresses already backed: a further pass maps
    // (almost) nothing: each mapping is a slow driver call.
    use gpumem::pool::{VirtualPool, VirtualPoolConfig};
    use gpumem_cli::workload::{replay_streams, run_replay};
    let device = Device::sim(SimConfig::default());
    let pool = VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap();
    let cfg = IterationsConfig {
        iterations: 20,
        vary: 0.3,
        seed: 42,
        batch: 4,
    };
    let streams = replay_streams(&device, &generate(&cfg, 0).prep).unwrap();
    let mut made = Vec::new();
    for pass in 0..8 {
        let p = generate(&cfg, pass);
        run_replay(&pool, &device, &p.prep, Some(&streams), None).unwrap();
        made.push(pool.stats().mappings_made);
    }
    let last = made[7] - made[6];
    assert!(last <= 20, "mappings per pass: {made:?}");
}
