//! Blocks of `gpumem_malloc_rounded`: a request the caller rounded up
//! (PyTorch's native allocator rounds as PyTorch's own allocator does). The
//! block counts in `allocated_bytes` and `active_bytes`, the request in
//! `requested_bytes`, through a plain free and a free deferred by a
//! recorded stream (a block held for a graph: `graph_pool_holds.rs`, with
//! the other tests that capture).

mod support;

use gpumem::driver::Driver;
use support::{allocator, kinds, sim, stats, MIB};

/// PyTorch's block for 84 MiB with `roundup_power2_divisions:4`.
const REQUESTED: usize = 84 * MIB;
const BLOCK: usize = 96 * MIB;

#[test]
fn a_rounded_block_counts_its_block_and_its_request() {
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        let small = a.malloc_rounded(8, 512, 0, 0);
        let big = a.malloc_rounded(REQUESTED, BLOCK, 0, 0);
        assert!(!small.is_null() && !big.is_null(), "{kind}");
        let s = stats(&a, 0);
        assert_eq!(s.requested_bytes.current, (REQUESTED + 8) as i64, "{kind}");
        assert_eq!(s.allocated_bytes.current, (BLOCK + 512) as i64, "{kind}");
        assert_eq!(s.active_bytes.current, (BLOCK + 512) as i64, "{kind}");
        assert_eq!(s.allocation.current, 2, "{kind}");
        a.free_rounded(big, REQUESTED, BLOCK, 0, 0);
        a.free_rounded(small, 8, 512, 0, 0);
        let s = stats(&a, 0);
        assert_eq!(s.requested_bytes.current, 0, "{kind}");
        assert_eq!(
            s.requested_bytes.allocated,
            (REQUESTED + 8) as i64,
            "{kind}"
        );
        assert_eq!(s.allocated_bytes.current, 0, "{kind}");
        assert_eq!(s.active_bytes.freed, (BLOCK + 512) as i64, "{kind}");
        assert_eq!(a.bad_free_count(0), 0, "{kind}");
    }
}

#[test]
fn a_request_larger_than_its_block_is_refused() {
    let a = allocator("resource=pool");
    assert!(a.malloc_rounded(1025, 1024, 0, 0).is_null());
    let why = gpumem_capi::last_error::last_error().unwrap_or_default();
    assert!(why.contains("1025") && why.contains("1024"), "{why}");
    assert_eq!(stats(&a, 0).allocation.allocated, 0);
}

#[test]
fn a_deferred_rounded_free_counts_the_request_once() {
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        let sim = sim(&a);
        let driver: &dyn Driver = &*sim;
        let (s1, s2) = (
            driver.stream_create(0, true).unwrap(),
            driver.stream_create(0, true).unwrap(),
        );
        let p = a.malloc_rounded(REQUESTED, BLOCK, 0, s1);
        a.record_stream(p, 0, s2);
        sim.hold(s2);
        a.free_rounded(p, REQUESTED, BLOCK, 0, s1);
        assert_eq!(a.pending_frees(0), 1, "{kind}");
        let s = stats(&a, 0);
        assert_eq!(s.requested_bytes.current, 0, "{kind}: freed for the caller");
        assert_eq!(s.active_bytes.current, BLOCK as i64, "{kind}: still active");
        sim.release(s2);
        a.empty_cache(0);
        let s = stats(&a, 0);
        assert_eq!(a.pending_frees(0), 0, "{kind}");
        assert_eq!(s.active_bytes.current, 0, "{kind}");
        assert_eq!(s.requested_bytes.freed, REQUESTED as i64, "{kind}");
        assert_eq!(a.bad_free_count(0), 0, "{kind}");
    }
}
