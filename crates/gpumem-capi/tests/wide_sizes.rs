//! The C ABI's caching resource (`resource=caching`) on a loop whose sizes
//! vary widely and change every iteration, blocks above 2 GiB included
//! (issue 47): once warm, it serves every iteration without a driver
//! allocation or free, and it holds no more blocks of 2 GiB and more than
//! the loop has live at once.

mod support;

use std::collections::HashMap;

use gpumem::DevicePtr;
use support::wide_sizes::{iterations, Step, ITERATIONS};

/// Passes over the same iterations, as a replay of one log does.
const PASSES: usize = 4;

/// Driver calls of any kind so far, by name.
fn calls(sim: &gpumem::driver::sim::SimDriver) -> HashMap<&'static str, u64> {
    sim.call_counts().into_iter().collect()
}

#[test]
fn caching_makes_no_driver_allocation_once_warm_and_keeps_its_reserve_low() {
    for seed in [47, 1, 2, 3] {
        replay(seed);
    }
}

fn replay(seed: u64) {
    let a = support::allocator("resource=caching");
    let sim = support::sim(&a);
    let iters = iterations(seed, ITERATIONS);
    let frees = iters
        .iter()
        .flatten()
        .filter(|s| matches!(s, Step::Free { .. }))
        .count();
    let mut live: HashMap<usize, (DevicePtr, usize)> = HashMap::new();
    let mut reserve_after_first = 0;
    for pass in 1..=PASSES {
        let before = calls(&sim);
        for step in iters.iter().flatten() {
            match *step {
                Step::Alloc { id, size } => {
                    let p = a.malloc(size, 0, 0);
                    assert!(!p.is_null(), "seed {seed}, pass {pass}: {size} bytes");
                    live.insert(id, (p, size));
                }
                Step::Free { id } => {
                    let (p, size) = live.remove(&id).expect("allocated");
                    a.free(p, size, 0, 0);
                }
            }
        }
        assert!(live.is_empty());
        let after = calls(&sim);
        let made = |name: &str| {
            after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0)
        };
        if pass == 1 {
            reserve_after_first = a.peak_reserved_bytes(0);
            continue;
        }
        // Warm: every block comes from the cache, and no free waits for the
        // stream. The only driver calls left are the batch events of the
        // stream-ordered frees: a record and a query per 256 frees.
        for name in [
            "cuMemAlloc",
            "cuMemFree",
            "cuStreamQuery",
            "cuStreamSynchronize",
            "cuCtxSynchronize",
        ] {
            assert_eq!(made(name), 0, "seed {seed}, pass {pass}: {name}");
        }
        let total: u64 = after.values().sum::<u64>() - before.values().sum::<u64>();
        let batches = frees.div_ceil(256) as u64 + 1;
        assert!(
            total <= 2 * batches,
            "seed {seed}, pass {pass}: {total} driver calls for {frees} frees"
        );
        assert_eq!(a.peak_reserved_bytes(0), reserve_after_first, "seed {seed}");
    }
    // The loop has two blocks above 2 GiB live at once: the pool keeps two
    // blocks of 2 GiB and more, not one per class its sizes passed through.
    let snapshot = a.snapshot(0).expect("device 0");
    let huge = snapshot
        .segments
        .iter()
        .filter(|s| s.size >= 2 << 30)
        .count();
    assert!(huge <= 2, "seed {seed}: {huge} segments of 2 GiB or more");
    // The power-of-two classes round these sizes up by about 1.45 on
    // average (1/ln 2 for sizes log-uniform over a class); one block above
    // 2 GiB held beyond what the loop needs would add about 0.4.
    let ratio = a.peak_reserved_bytes(0) as f64 / a.peak_allocated_bytes(0) as f64;
    assert!(ratio <= 1.6, "seed {seed}: reserved/live {ratio:.3}");
}
