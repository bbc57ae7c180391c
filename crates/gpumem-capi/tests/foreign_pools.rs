//! Graph pools whose segments come from an allocator of the caller's
//! (PyTorch's `torch.cuda.MemPool(allocator)`): segments made and given
//! back through its functions, the allocator kept until the pool's last
//! segment went, its memory counted and limited as the device's, its
//! snapshot, and a NULL as out of memory.

mod support;

use gpumem_capi::allocator::last_error;
use gpumem_capi::Allocator;
use support::foreign::source;
use support::{allocator, one_at_a_time, sim, stats, MIB};

const POOL: (u64, u64) = (0, 1);

/// Enters `use_mem_pool(pool)` as PyTorch does.
fn enter(a: &Allocator, pool: (u64, u64)) {
    a.graph_pool_begin(0, pool).unwrap();
}

/// Leaves `use_mem_pool(pool)` as PyTorch does.
fn leave(a: &Allocator, pool: (u64, u64)) {
    a.graph_pool_end(0, pool).unwrap();
    a.graph_pool_release(0, pool).unwrap();
}

/// The simulated device's memory over this many bytes is the fraction
/// that leaves `bytes` (the device holds 80 GiB).
fn fraction_for(bytes: usize) -> f64 {
    bytes as f64 / (80u64 << 30) as f64
}

#[test]
fn segments_come_from_the_pool_s_allocator_and_go_back_to_it() {
    let _one = one_at_a_time();
    let a = allocator("resource=pool");
    let (src, calls) = source(sim(&a));
    a.graph_pool_retain_foreign(0, POOL, src).unwrap();
    assert_eq!(a.graph_pool_use_count(0, POOL), 1);
    assert_eq!(calls.allocs(), 0, "nothing made before the first block");
    enter(&a, POOL);
    assert_eq!(a.graph_pool_use_count(0, POOL), 2);
    let small = a.graph_pool_malloc(MIB, 0, POOL, 0);
    let small2 = a.graph_pool_malloc(MIB / 2, 0, POOL, 0);
    let large = a.graph_pool_malloc(30 * MIB, 0, POOL, 0);
    leave(&a, POOL);
    assert!(!small.is_null() && !small2.is_null() && !large.is_null());
    // PyTorch's layout: a 2 MiB segment for the small blocks, one of the
    // request rounded to 2 MiB for the large one.
    assert_eq!(calls.allocs(), 2);
    assert_eq!(calls.live_bytes(), 32 * MIB);
    let snap = a.pool_snapshot(0, POOL).unwrap();
    let mut sizes: Vec<usize> = snap.segments.iter().map(|s| s.size).collect();
    sizes.sort();
    assert_eq!(sizes, vec![2 * MIB, 30 * MIB]);
    assert!(snap.expandable.is_empty(), "allocated whole");
    let live_segments: Vec<u64> = calls.live.lock().unwrap().keys().copied().collect();
    let seen: Vec<u64> = snap.segments.iter().map(|s| s.address.0).collect();
    assert_eq!(seen, live_segments, "the allocator's segments");
    // Counted as the device's memory: reserve, segments, driver calls.
    let s = stats(&a, 0);
    assert_eq!(s.reserved_bytes.current, 32 * MIB as i64);
    assert_eq!(s.segment.current, 2);
    assert_eq!(s.num_device_alloc, 2);
    assert_eq!(a.allocated_bytes(0), MIB + MIB / 2 + 30 * MIB);

    // Its cache goes back through the allocator once nothing uses it.
    a.graph_pool_free(large, 30 * MIB, 0, POOL, 0);
    assert_eq!(a.pool_empty_cache(0, POOL), 0, "its MemPool still uses it");
    a.graph_pool_release(0, POOL).unwrap();
    assert_eq!(a.pool_empty_cache(0, POOL), 30 * MIB);
    assert_eq!((calls.frees(), calls.releases()), (1, 0));
    // The last block freed: the pool goes, its last segment back through
    // the allocator, and then the allocator is let go.
    a.graph_pool_free(small, MIB, 0, POOL, 0);
    assert_eq!(calls.releases(), 0);
    a.graph_pool_free(small2, MIB / 2, 0, POOL, 0);
    assert_eq!((calls.frees(), calls.releases()), (2, 1));
    assert!(calls.live.lock().unwrap().is_empty());
    let s = stats(&a, 0);
    assert_eq!((s.reserved_bytes.current, s.num_device_free), (0, 2));
    assert_eq!(a.bad_free_count(0), 0);
}

#[test]
fn the_allocator_outlives_the_pool_s_tensors() {
    let _one = one_at_a_time();
    // test_tensor_delete_after_allocator_delete and
    // test_mempool_empty_cache_inactive: the MemPool (and its allocator)
    // deleted while a tensor of it lives on.
    let a = allocator("resource=pool");
    let (src, calls) = source(sim(&a));
    a.graph_pool_retain_foreign(0, POOL, src).unwrap();
    enter(&a, POOL);
    let data = a.graph_pool_malloc(16, 0, POOL, 0);
    leave(&a, POOL);
    a.graph_pool_release(0, POOL).unwrap();
    a.pool_empty_cache(0, POOL);
    assert_eq!((calls.allocs(), calls.frees(), calls.releases()), (1, 0, 0));
    a.graph_pool_free(data, 16, 0, POOL, 0);
    a.empty_cache(0);
    assert_eq!((calls.frees(), calls.releases()), (1, 1));
    assert_eq!(a.graph_pool_count(0), 0);
}

#[test]
fn a_null_from_the_allocator_is_out_of_memory() {
    let _one = one_at_a_time();
    let a = allocator("resource=pool");
    let (src, calls) = source(sim(&a));
    a.graph_pool_retain_foreign(0, POOL, src).unwrap();
    calls
        .refuse
        .store(true, std::sync::atomic::Ordering::SeqCst);
    enter(&a, POOL);
    let p = a.graph_pool_malloc(4 * MIB, 0, POOL, 0);
    assert!(p.is_null());
    let why = last_error().unwrap();
    assert!(why.contains("out of memory"), "{why}");
    assert!(why.contains("graph pool"), "{why}");
    assert_eq!(stats(&a, 0).num_ooms, 1);
    // A pointer not aligned to 256 bytes is refused, and given back.
    calls
        .refuse
        .store(false, std::sync::atomic::Ordering::SeqCst);
    calls
        .misalign
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(a.graph_pool_malloc(4 * MIB, 0, POOL, 0).is_null());
    let why = last_error().unwrap();
    assert!(why.contains("not aligned"), "{why}");
    assert!(calls.live.lock().unwrap().is_empty(), "given back");
    calls
        .misalign
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let p = a.graph_pool_malloc(4 * MIB, 0, POOL, 0);
    assert!(!p.is_null());
    leave(&a, POOL);
    a.graph_pool_free(p, 4 * MIB, 0, POOL, 0);
    a.graph_pool_release(0, POOL).unwrap();
    assert_eq!(calls.releases(), 1);
}

#[test]
fn a_source_not_taken_is_released_at_once() {
    let _one = one_at_a_time();
    let a = allocator("resource=pool");
    a.graph_pool_retain(0, POOL).unwrap();
    let (src, calls) = source(sim(&a));
    let e = a.graph_pool_retain_foreign(0, POOL, src).unwrap_err();
    assert!(e.contains("exists already"), "{e}");
    assert_eq!(calls.releases(), 1);
    let (src, calls) = source(sim(&a));
    let e = a.graph_pool_retain_foreign(0, (0, 0), src).unwrap_err();
    assert!(e.contains("device's own pool"), "{e}");
    assert_eq!(calls.releases(), 1);
    let (src, calls) = source(sim(&a));
    assert!(a.graph_pool_retain_foreign(64, POOL, src).is_err());
    assert_eq!(calls.releases(), 1);
    // Missing functions: refused, the context released.
    let (mut c, calls) = support::foreign::source_t(sim(&a));
    c.free = None;
    // SAFETY: as `support::foreign::source`'s.
    let e = unsafe { gpumem_capi::foreign_segments::ForeignSource::new(&c) }.unwrap_err();
    assert!(e.contains("alloc and free"), "{e}");
    assert_eq!(calls.releases(), 1);
    a.graph_pool_release(0, POOL).unwrap();
}

#[test]
fn the_memory_fraction_counts_the_allocator_s_memory() {
    let _one = one_at_a_time();
    // test_mempool_limited_memory_with_allocator: 80 MiB allowed, 40 MiB
    // in a pool of an allocator that lends on out of memory, 40 in one
    // that does not.
    let a = allocator("resource=pool");
    a.set_memory_fraction(0, fraction_for(80 * MIB)).unwrap();
    let (keeps, lends) = ((0, 2), (0, 3));
    let (src, keeps_calls) = source(sim(&a));
    a.graph_pool_retain_foreign(0, keeps, src).unwrap();
    let (src, lends_calls) = source(sim(&a));
    a.graph_pool_retain_foreign(0, lends, src).unwrap();
    a.graph_pool_set_use_on_oom(0, lends, true).unwrap();
    enter(&a, keeps);
    let x = a.graph_pool_malloc(40 * MIB, 0, keeps, 0);
    leave(&a, keeps);
    enter(&a, lends);
    let y = a.graph_pool_malloc(40 * MIB, 0, lends, 0);
    // Past the limit: the allocator is not even asked.
    assert!(a.graph_pool_malloc(4 * MIB, 0, lends, 0).is_null());
    leave(&a, lends);
    assert_eq!((keeps_calls.allocs(), lends_calls.allocs()), (1, 1));
    assert!(a.malloc(40 * MIB, 0, 0).is_null(), "out of memory");
    a.graph_pool_free(x, 40 * MIB, 0, keeps, 0);
    a.graph_pool_free(y, 40 * MIB, 0, lends, 0);
    let c = a.malloc(30 * MIB, 0, 0);
    assert_eq!(c, y, "the lending pool's block");
    assert!(
        a.malloc(30 * MIB, 0, 0).is_null(),
        "the other one never lends"
    );
    a.free(c, 30 * MIB, 0, 0);
    enter(&a, lends);
    let e = a.graph_pool_malloc(20 * MIB, 0, lends, 0);
    leave(&a, lends);
    assert_eq!(e, c);
    a.graph_pool_free(e, 20 * MIB, 0, lends, 0);
    for pool in [lends, keeps] {
        a.graph_pool_set_use_on_oom(0, pool, false).unwrap();
        a.graph_pool_release(0, pool).unwrap();
        a.pool_empty_cache(0, pool);
    }
    for calls in [keeps_calls, lends_calls] {
        assert_eq!((calls.frees(), calls.releases()), (1, 1));
    }
    assert_eq!((a.reserved_bytes(0), a.bad_free_count(0)), (0, 0));
}
