//! CUDA graphs' private pools through the C ABI (PyTorch's
//! `beginAllocateToPool`, `endAllocateToPool`, `releasePool`), over every
//! resource the device may be served by: a graph pool's blocks never go to
//! the device's pool, keep their addresses until the pool goes, count in the
//! statistics, and go back to the driver when the graphs are released.

mod support;

use gpumem::driver::Driver;
use gpumem::DevicePtr;
use gpumem_capi::allocator::last_error;
use gpumem_capi::{gpumem_device_stats_t, Allocator};
use support::{allocator, kinds, named, sim, stats, MIB};

const POOL: (u64, u64) = (1, 0);
const OTHER: (u64, u64) = (0, 7);

fn stream(a: &Allocator) -> u64 {
    let sim = sim(a);
    let driver: &dyn Driver = &*sim;
    driver.stream_create(0, true).unwrap()
}

/// Allocates and frees on the device's pool once, so it is built.
fn warm(a: &Allocator, s: u64) {
    let p = a.malloc(MIB, 0, s);
    assert!(!p.is_null());
    a.free(p, MIB, 0, s);
}

/// Allocates 1, 2, ... `n` MiB in `pool`.
fn fill(a: &Allocator, pool: (u64, u64), n: usize, s: u64) -> Vec<(DevicePtr, usize)> {
    (1..=n)
        .map(|i| {
            let p = a.graph_pool_malloc(i * MIB, 0, pool, s);
            assert!(!p.is_null(), "{:?}", last_error());
            (p, i * MIB)
        })
        .collect()
}

#[test]
fn graph_pool_blocks_never_reach_the_device_pool_and_go_back_when_released() {
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        let s = stream(&a);
        warm(&a, s);
        let reserved_before = a.reserved_bytes(0);

        a.graph_pool_begin(0, POOL).unwrap();
        let blocks = fill(&a, POOL, 8, s);
        assert_eq!(
            a.graph_pool_live_blocks(0, POOL).unwrap().len(),
            8,
            "{kind}"
        );
        // A temporary of the capture: freed and reused within the pool.
        let t = a.graph_pool_malloc(3 * MIB, 0, POOL, s);
        a.graph_pool_free(t, 3 * MIB, 0, POOL, s);
        let t2 = a.graph_pool_malloc(3 * MIB, 0, POOL, s);
        assert_eq!(
            t, t2,
            "{kind}: the capture's stream reuses its own temporary"
        );
        a.graph_pool_free(t2, 3 * MIB, 0, POOL, s);
        a.graph_pool_end(0, POOL).unwrap();
        assert!(
            a.reserved_bytes(0) >= reserved_before + 36 * MIB,
            "{kind}: the graph pool counts in the reserve"
        );
        assert_eq!(
            a.allocated_bytes(0),
            36 * MIB,
            "{kind}: 1 + ... + 8 MiB live"
        );
        let st = stats(&a, 0);
        assert_eq!(st.allocated_bytes.current, 36 * MIB as i64, "{kind}");
        assert_eq!(st.allocation.current, 8, "{kind}");
        // The peaks count the graph pools too: never below the current values.
        assert!(a.peak_allocated_bytes(0) >= a.allocated_bytes(0), "{kind}");
        assert!(a.peak_reserved_bytes(0) >= a.reserved_bytes(0), "{kind}");
        a.reset_peak(0);
        assert_eq!(a.peak_allocated_bytes(0), a.allocated_bytes(0), "{kind}");
        assert!(a.peak_reserved_bytes(0) >= a.reserved_bytes(0), "{kind}");

        // The device's pool never hands out the graph's memory, the freed
        // temporary included.
        let mut outside = Vec::new();
        for i in 1..=8 {
            let p = a.malloc(i * MIB, 0, s);
            assert!(!p.is_null());
            assert!(
                !blocks
                    .iter()
                    .any(|&(b, n)| p.0 < b.0 + n as u64 && b.0 < p.0 + (i * MIB) as u64),
                "{kind}: {p:#x} overlaps the graph's memory"
            );
            assert!(
                p.0 + (i * MIB) as u64 <= t.0 || p.0 >= t.0 + 3 * MIB as u64,
                "{kind}"
            );
            outside.push((p, i * MIB));
        }
        for (p, n) in outside {
            a.free(p, n, 0, s);
        }

        // Released with live blocks (the graph's outputs): the pool stays
        // until the last one is freed.
        assert_eq!(a.graph_pool_use_count(0, POOL), 1, "{kind}");
        a.graph_pool_release(0, POOL).unwrap();
        assert_eq!(
            a.graph_pool_count(0),
            1,
            "{kind}: live blocks keep the pool"
        );
        for &(p, n) in &blocks {
            a.graph_pool_free(p, n, 0, POOL, s);
        }
        assert_eq!(
            a.graph_pool_count(0),
            0,
            "{kind}: the last free retires the pool"
        );
        a.empty_cache(0);
        assert!(
            a.reserved_bytes(0) <= reserved_before,
            "{kind}: reserve back to {reserved_before}, is {}",
            a.reserved_bytes(0)
        );
        assert_eq!(a.bad_free_count(0), 0, "{kind}");
    }
}

#[test]
fn later_captures_into_the_same_pool_reuse_its_memory_and_other_pools_do_not() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    a.graph_pool_begin(0, POOL).unwrap();
    let p = a.graph_pool_malloc(8 * MIB, 0, POOL, s);
    a.graph_pool_free(p, 8 * MIB, 0, POOL, s);
    a.graph_pool_end(0, POOL).unwrap();
    // A second graph shares the pool (PyTorch's `pool=graph.pool()`).
    a.graph_pool_begin(0, POOL).unwrap();
    assert_eq!(a.graph_pool_malloc(8 * MIB, 0, POOL, s), p);
    a.graph_pool_free(p, 8 * MIB, 0, POOL, s);
    a.graph_pool_end(0, POOL).unwrap();
    // Another pool gets other memory.
    a.graph_pool_begin(0, OTHER).unwrap();
    let q = a.graph_pool_malloc(8 * MIB, 0, OTHER, s);
    assert_ne!(q, p);
    a.graph_pool_free(q, 8 * MIB, 0, OTHER, s);
    a.graph_pool_end(0, OTHER).unwrap();
    assert_eq!(a.graph_pool_use_count(0, POOL), 2);
    assert_eq!(a.graph_pool_count(0), 2);
    a.graph_pool_release(0, POOL).unwrap();
    a.graph_pool_release(0, OTHER).unwrap();
    assert_eq!(a.graph_pool_count(0), 1, "POOL has one use left");
    a.graph_pool_release(0, POOL).unwrap();
    assert_eq!(a.graph_pool_count(0), 0);
    assert_eq!(a.reserved_bytes(0), 0);
}

#[test]
fn a_block_freed_during_a_capture_is_held_until_the_graph_goes() {
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        let s = stream(&a);
        let x = a.malloc(4 * MIB, 0, s); // allocated before the capture
        a.graph_pool_begin(0, POOL).unwrap();
        a.graph_pool_hold(x, 4 * MIB, 0, POOL, s); // freed inside it
        a.graph_pool_end(0, POOL).unwrap();
        assert_eq!(
            a.allocated_bytes(0),
            4 * MIB,
            "{kind}: held, still counted live"
        );
        let y = a.malloc(4 * MIB, 0, s);
        assert!(
            y.0 + 4 * MIB as u64 <= x.0 || y.0 >= x.0 + 4 * MIB as u64,
            "{kind}: the graph's block was handed out again"
        );
        a.free(y, 4 * MIB, 0, s);
        a.graph_pool_release(0, POOL).unwrap();
        assert_eq!(a.allocated_bytes(0), 0, "{kind}: freed when the graph went");
        assert_eq!(a.bad_free_count(0), 0, "{kind}");
    }
}

#[test]
fn a_hold_with_no_capture_under_way_frees_at_once() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    let x = a.malloc(MIB, 0, s);
    a.graph_pool_hold(x, MIB, 0, POOL, s);
    assert_eq!(a.allocated_bytes(0), 0);
    assert_eq!(a.bad_free_count(0), 0);
}

#[test]
fn pools_are_not_freed_while_another_capture_is_under_way() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    a.graph_pool_begin(0, POOL).unwrap();
    let p = a.graph_pool_malloc(MIB, 0, POOL, s);
    a.graph_pool_free(p, MIB, 0, POOL, s);
    a.graph_pool_end(0, POOL).unwrap();
    a.graph_pool_begin(0, OTHER).unwrap();
    // Waiting for the device now would break the capture into OTHER.
    a.graph_pool_release(0, POOL).unwrap();
    assert_eq!(
        a.graph_pool_count(0),
        2,
        "POOL waits for the capture to end"
    );
    a.graph_pool_end(0, OTHER).unwrap();
    assert_eq!(a.graph_pool_count(0), 1, "POOL went when the capture ended");
    a.graph_pool_release(0, OTHER).unwrap();
    assert_eq!(a.graph_pool_count(0), 0);
}

#[test]
fn misuse_is_an_error_that_says_what() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    warm(&a, s);
    let e = a.graph_pool_end(0, POOL).unwrap_err();
    assert!(e.contains("no capture"), "{e}");
    let e = a.graph_pool_release(0, POOL).unwrap_err();
    assert!(e.contains("does not exist"), "{e}");
    let p = a.graph_pool_malloc(MIB, 0, POOL, s);
    assert!(p.is_null());
    assert!(
        last_error().unwrap().contains("does not exist"),
        "{:?}",
        last_error()
    );
    a.graph_pool_begin(0, POOL).unwrap();
    let e = a.graph_pool_begin(0, POOL).unwrap_err();
    assert!(e.contains("already"), "{e}");
    let q = a.graph_pool_malloc(MIB, 0, POOL, s);
    a.graph_pool_free(q, 2 * MIB, 0, POOL, s); // wrong size
    assert_eq!(a.bad_free_count(0), 1);
    a.graph_pool_free(q, MIB, 0, POOL, s);
    a.graph_pool_end(0, POOL).unwrap();
    a.graph_pool_release(0, POOL).unwrap();
    let e = a.graph_pool_release(0, POOL).unwrap_err();
    assert!(e.contains("does not exist"), "{e}");
}

/// The named counters of `s`, current values and totals.
fn counts(s: &gpumem_device_stats_t) -> Vec<(&'static str, i64, i64, i64)> {
    named(s)
        .into_iter()
        .map(|(n, x)| (n, x.current, x.allocated, x.freed))
        .collect()
}

#[test]
fn size_classes_split_every_count_as_pytorch_s_pools_do() {
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        let small = [a.malloc(1000, 0, 0), a.malloc(MIB, 0, 0)];
        let large = a.malloc(MIB + 1, 0, 0);
        a.free(small[0], 1000, 0, 0);
        // A graph pool's blocks, in segments of their own class.
        a.graph_pool_begin(0, POOL).unwrap();
        let g_small = a.graph_pool_malloc(512, 0, POOL, 0);
        let g_large = a.graph_pool_malloc(3 * MIB, 0, POOL, 0);
        a.graph_pool_end(0, POOL).unwrap();
        let [s, l] = a.class_stats(0).unwrap();
        let all = stats(&a, 0);
        assert_eq!(
            (s.allocation.current, s.allocation.allocated),
            (2, 3),
            "{kind}"
        );
        assert_eq!(
            (l.allocation.current, l.allocation.allocated),
            (2, 2),
            "{kind}"
        );
        assert_eq!(s.requested_bytes.current, (MIB + 512) as i64, "{kind}");
        assert_eq!(l.requested_bytes.current, (4 * MIB + 1) as i64, "{kind}");
        for ((name, a_now, a_in, a_out), ((_, s_now, s_in, s_out), (_, l_now, l_in, l_out))) in
            counts(&all)
                .into_iter()
                .zip(counts(&s).into_iter().zip(counts(&l)))
        {
            assert_eq!(a_now, s_now + l_now, "{kind}: {name}.current");
            assert_eq!(
                (a_in, a_out),
                (s_in + l_in, s_out + l_out),
                "{kind}: {name} totals"
            );
        }
        // The graph pool's small segment is PyTorch's 2 MiB one.
        let g_segments = [s.segment.current, l.segment.current];
        assert!(
            g_segments[0] >= 1 && s.reserved_bytes.current >= 2 * MIB as i64,
            "{kind}: {g_segments:?}"
        );
        a.reset_accumulated(0);
        let [s, l] = a.class_stats(0).unwrap();
        assert_eq!(
            (s.allocation.allocated, l.allocation.allocated),
            (0, 0),
            "{kind}"
        );
        assert_eq!(
            (s.allocation.current, l.allocation.current),
            (2, 2),
            "{kind}"
        );
        for (p, n) in [(g_small, 512), (g_large, 3 * MIB)] {
            a.graph_pool_free(p, n, 0, POOL, 0);
        }
        a.graph_pool_release(0, POOL).unwrap();
        a.free(small[1], MIB, 0, 0);
        a.free(large, MIB + 1, 0, 0);
        let [s, l] = a.class_stats(0).unwrap();
        assert_eq!(
            (s.allocation.current, l.allocation.current),
            (0, 0),
            "{kind}"
        );
        assert_eq!((s.allocation.freed, l.allocation.freed), (2, 2), "{kind}");
        assert!(a.class_stats(64).is_none());
    }
}
