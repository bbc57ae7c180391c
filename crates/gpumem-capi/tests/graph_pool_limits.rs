//! `max_size` and the memory fraction cap what a device holds from the
//! driver, its graph pools included: the graph pools get what the device's
//! own pool leaves (after emptying its cache, outside captures), and the
//! device's pool what the graph pools leave, until they go.

mod support;

use gpumem::driver::Driver;
use gpumem_capi::conf::ResourceKind;
use gpumem_capi::Allocator;
use support::{allocator, kinds, sim, MIB};

const POOL: (u64, u64) = (1, 0);

fn stream(a: &Allocator) -> u64 {
    let sim = sim(a);
    let driver: &dyn Driver = &*sim;
    driver.stream_create(0, true).unwrap()
}

/// Allocates `n` blocks of 32 MiB from the graph pool while it can.
fn fill_graph_pool(a: &Allocator, s: u64, n: usize) -> Vec<gpumem::DevicePtr> {
    (0..n)
        .map(|_| a.graph_pool_malloc(32 * MIB, 0, POOL, s))
        .take_while(|p| !p.is_null())
        .collect()
}

#[test]
fn max_size_covers_the_graph_pools() {
    for kind in kinds() {
        let a = allocator(&format!("resource={kind},max_size=64MiB"));
        let s = stream(&a);
        let cached = a.malloc(16 * MIB, 0, s);
        a.free(cached, 16 * MIB, 0, s);
        a.graph_pool_begin(0, POOL).unwrap();
        let got = fill_graph_pool(&a, s, 8);
        // The arena keeps what it took up front (its whole limit here); the
        // others' caches stay during the capture (emptying them would wait
        // for the device), and the graph gets what they leave.
        if kind != ResourceKind::Arena {
            assert!(!got.is_empty(), "{kind}: the graph got what was left");
        }
        assert!(
            a.reserved_bytes(0) <= 64 * MIB,
            "{kind}: {} held",
            a.reserved_bytes(0)
        );
        a.graph_pool_end(0, POOL).unwrap();
        // The device's pool may grow only into what the graph pool left
        // (its cache emptied on out of memory, now that no capture is
        // under way).
        let mut mine = Vec::new();
        loop {
            let d = a.malloc(8 * MIB, 0, s);
            if d.is_null() {
                break;
            }
            mine.push(d);
            // CUDA's pool caps the bytes live in it, not its cache (see
            // `served`): what it holds beyond goes at its next trim.
            let held = match kind {
                ResourceKind::Async => a.allocated_bytes(0),
                _ => a.reserved_bytes(0),
            };
            assert!(
                held <= 64 * MIB,
                "{kind}: the device's pool passed the limit beside the graph's: {held} held"
            );
        }
        for d in mine {
            a.free(d, 8 * MIB, 0, s);
        }
        for p in got {
            a.graph_pool_free(p, 32 * MIB, 0, POOL, s);
        }
        a.graph_pool_release(0, POOL).unwrap();
        assert_eq!(a.graph_pool_count(0), 0, "{kind}");
        let d = a.malloc(32 * MIB, 0, s);
        assert!(!d.is_null(), "{kind}: the graph's share came back");
        a.free(d, 32 * MIB, 0, s);
    }
}

#[test]
fn the_memory_fraction_covers_the_graph_pools() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    a.graph_pool_begin(0, POOL).unwrap();
    // 0.001 of the simulated 80 GiB: about 82 MiB.
    a.set_memory_fraction(0, 0.001).unwrap();
    let got = fill_graph_pool(&a, s, 8);
    assert!(got.len() >= 2 && got.len() < 8, "{} blocks", got.len());
    let limit = (80u64 << 30) as f64 * 0.001;
    assert!(
        a.reserved_bytes(0) as f64 <= limit,
        "{} held",
        a.reserved_bytes(0)
    );
    assert!(a.malloc(32 * MIB, 0, s).is_null());
    for p in got {
        a.graph_pool_free(p, 32 * MIB, 0, POOL, s);
    }
    a.graph_pool_end(0, POOL).unwrap();
    a.graph_pool_release(0, POOL).unwrap();
    let d = a.malloc(32 * MIB, 0, s);
    assert!(!d.is_null());
    a.free(d, 32 * MIB, 0, s);
}

/// The race `Allocator::apply_limit` documents, made to happen: a graph
/// pool's growth in flight (its `cuMemAlloc` stopped at a gate) while the
/// device's pool grows. Each took its share of the limit before the other
/// grew, so together they pass it, by at most the growth in flight; once
/// that growth lands, the device's pool gets only what is left and cannot
/// grow further. A design choice: closing the window would put one lock
/// (or one shared budget) on every growth of every pool of the device.
#[test]
fn a_growth_racing_a_graph_pool_growth_passes_the_limit_by_one_growth_at_most() {
    let a = allocator("resource=pool,max_size=64MiB");
    let sim = sim(&a);
    let s = stream(&a);
    // The device's pool grows by mapping (expandable heaps), the graph
    // pools by cuMemAlloc: the gate stops only the graph pool's growth.
    let d = a.malloc(MIB, 0, s);
    a.free(d, MIB, 0, s);
    a.empty_cache(0);
    assert_eq!(sim.call_count("cuMemAlloc"), 0, "the device's pool maps");
    let gate = sim.gate_call("cuMemAlloc", 1);
    std::thread::scope(|scope| {
        let graph = scope.spawn(|| {
            a.graph_pool_begin(0, POOL).unwrap();
            let p = a.graph_pool_malloc(32 * MIB, 0, POOL, s);
            a.graph_pool_end(0, POOL).unwrap();
            p
        });
        assert!(
            gate.wait_arrival(std::time::Duration::from_secs(60)),
            "the graph pool's growth reached the driver"
        );
        // Meanwhile: the device's pool still sees the whole limit.
        let mine = a.malloc(48 * MIB, 0, s);
        assert!(
            !mine.is_null(),
            "the device's share did not count the growth in flight"
        );
        gate.open();
        let g = graph.join().unwrap();
        assert!(
            !g.is_null(),
            "the graph pool's share did not count the device's growth"
        );
        let held = a.reserved_bytes(0);
        assert!(held > 64 * MIB, "the race passed the limit: {held}");
        assert!(held <= 64 * MIB + 32 * MIB, "by one growth at most: {held}");
        // From now on each gets only what the other leaves.
        let more = a.malloc(16 * MIB, 0, s);
        assert!(more.is_null(), "the device's pool grew past its share");
        a.free(mine, 48 * MIB, 0, s);
        a.graph_pool_free(g, 32 * MIB, 0, POOL, s);
    });
    a.graph_pool_release(0, POOL).unwrap();
    a.empty_cache(0);
    assert_eq!(a.reserved_bytes(0), 0);
}
