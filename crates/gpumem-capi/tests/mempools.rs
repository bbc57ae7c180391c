//! PyTorch's `torch.cuda.MemPool` over gpumem's graph pools, as the native
//! allocator drives them: a MemPool is a pool retained once for its life
//! (`createOrIncrefPool`, `releasePool`), and `use_mem_pool` begins and
//! ends routing a thread's allocations to it (`beginAllocateToPool`, which
//! counts a use, `endAllocateToPool` and `releasePool`: a capture to
//! gpumem).

mod support;

use gpumem::driver::Driver;
use gpumem::DevicePtr;
use gpumem_capi::allocator::last_error;
use gpumem_capi::graph_pools::DEVICE_POOL;
use gpumem_capi::Allocator;
use support::{allocator, one_at_a_time, sim, stats, MIB};

const POOL1: (u64, u64) = (0, 1);
const POOL2: (u64, u64) = (0, 2);
const POOL3: (u64, u64) = (0, 3);

/// Allocates `size` bytes in `pool` as `use_mem_pool` does.
fn alloc_in(a: &Allocator, pool: (u64, u64), size: usize) -> DevicePtr {
    let p = a.graph_pool_malloc(size, 0, pool, 0);
    assert!(!p.is_null(), "{:?}", last_error());
    p
}

/// The simulated device's memory over this many bytes is the fraction
/// that leaves `bytes` (the device holds 80 GiB).
fn fraction_for(bytes: usize) -> f64 {
    bytes as f64 / (80u64 << 30) as f64
}

/// A stream of `a`'s device, by its raw handle.
fn stream(a: &Allocator) -> u64 {
    let sim = sim(a);
    let driver: &dyn Driver = &*sim;
    driver.stream_create(0, true).unwrap()
}

/// Enters `use_mem_pool(pool)` as PyTorch does.
fn enter(a: &Allocator, pool: (u64, u64)) {
    a.graph_pool_begin(0, pool).unwrap();
}

/// Leaves `use_mem_pool(pool)` as PyTorch does.
fn leave(a: &Allocator, pool: (u64, u64)) {
    a.graph_pool_end(0, pool).unwrap();
    a.graph_pool_release(0, pool).unwrap();
}

/// The segments of `pool`'s snapshot, by size, and its live blocks.
fn pool_view(a: &Allocator, pool: (u64, u64)) -> (Vec<usize>, Vec<DevicePtr>) {
    let snap = a.pool_snapshot(0, pool).expect("device in range");
    let sizes = snap.segments.iter().map(|s| s.size).collect();
    let blocks = snap.blocks.iter().map(|(b, _)| b.address).collect();
    (sizes, blocks)
}

#[test]
fn a_pool_s_snapshot_holds_its_own_segments_only() {
    let _one = one_at_a_time();
    let a = allocator("resource=pool");
    let outside = a.malloc(3 * MIB, 0, 0);
    for pool in [POOL1, POOL2, POOL3] {
        a.graph_pool_retain(0, pool).unwrap();
    }
    // test_nested_mempool's pattern: nested contexts, 20 MiB in pool 1, in
    // pool 2, in pool 3, in pool 2 again, in pool 1 again.
    let mut live = Vec::new();
    for pool in [POOL1, POOL2, POOL3] {
        enter(&a, pool);
        live.push((pool, alloc_in(&a, pool, 20 * MIB)));
    }
    for (pool, inner) in [(POOL2, POOL3), (POOL1, POOL2)] {
        leave(&a, inner);
        live.push((pool, alloc_in(&a, pool, 20 * MIB)));
    }
    leave(&a, POOL1);
    for (pool, n) in [(POOL1, 2), (POOL2, 2), (POOL3, 1)] {
        let (sizes, blocks) = pool_view(&a, pool);
        assert_eq!(sizes, vec![20 * MIB; n], "{pool:?}");
        let mine: Vec<DevicePtr> = live
            .iter()
            .filter(|(p, _)| *p == pool)
            .map(|(_, b)| *b)
            .collect();
        let mut mine_sorted = mine.clone();
        mine_sorted.sort();
        assert_eq!(blocks, mine_sorted, "{pool:?}: its live blocks only");
        let snap = a.pool_snapshot(0, pool).unwrap();
        assert!(snap.graph_segments.iter().all(|g| g.pool == pool));
    }
    // The device's id: everything, the device's own segment included.
    let all = a.pool_snapshot(0, DEVICE_POOL).unwrap();
    assert_eq!(all, a.snapshot(0).unwrap());
    assert_eq!(all.graph_segments.len(), 5);
    assert!(all.blocks.iter().any(|(b, _)| b.address == outside));
    assert_eq!(all.blocks.len(), 6);
    // A pool that does not exist has nothing; a device out of range is None.
    assert_eq!(pool_view(&a, (0, 99)), (vec![], vec![]));
    assert!(a.pool_snapshot(64, POOL1).is_none());

    for (pool, p) in live {
        a.graph_pool_free(p, 20 * MIB, 0, pool, 0);
    }
    for pool in [POOL1, POOL2, POOL3] {
        a.graph_pool_release(0, pool).unwrap();
    }
    a.free(outside, 3 * MIB, 0, 0);
    assert_eq!(a.bad_free_count(0), 0);
}

#[test]
fn the_device_s_pool_id_is_no_graph_pool() {
    let _one = one_at_a_time();
    let a = allocator("resource=pool");
    let e = a.graph_pool_retain(0, DEVICE_POOL).unwrap_err();
    assert!(e.contains("device's own pool"), "{e}");
    let e = a.graph_pool_begin(0, DEVICE_POOL).unwrap_err();
    assert!(e.contains("device's own pool"), "{e}");
    assert_eq!(a.graph_pool_count(0), 0);
}

#[test]
fn deleting_a_pool_empties_its_cache_only() {
    let _one = one_at_a_time();
    // test_mempool_empty_cache: a block of the device's pool and one of a
    // MemPool, both freed, then the MemPool deleted (releasePool, then
    // emptyCache with its id): the device's cached segment stays.
    let a = allocator("resource=pool");
    a.graph_pool_retain(0, POOL1).unwrap();
    let x = a.malloc(4 * MIB, 0, 0);
    enter(&a, POOL1);
    let y = alloc_in(&a, POOL1, 4 * MIB);
    leave(&a, POOL1);
    a.graph_pool_free(y, 4 * MIB, 0, POOL1, 0);
    a.free(x, 4 * MIB, 0, 0);
    let device_cache = a.reserved_bytes(0) - 20 * MIB;
    assert!(device_cache > 0, "the device's pool caches x's memory");
    a.graph_pool_release(0, POOL1).unwrap();
    a.pool_empty_cache(0, POOL1);
    assert_eq!(a.graph_pool_count(0), 0, "the pool went");
    assert_eq!(
        a.reserved_bytes(0),
        device_cache,
        "the device's cache stays"
    );
    assert!(!a.snapshot(0).unwrap().segments.is_empty());
    assert_eq!(a.pool_empty_cache(0, DEVICE_POOL), device_cache);
    assert_eq!(a.reserved_bytes(0), 0);
}

#[test]
fn a_pool_s_cache_goes_only_once_nothing_uses_it() {
    let _one = one_at_a_time();
    // test_mempool_empty_cache_inactive: a MemPool deleted while a tensor
    // of it lives on.
    let a = allocator("resource=pool");
    let cached = a.malloc(MIB, 0, 0);
    a.free(cached, MIB, 0, 0);
    let device_cache = a.reserved_bytes(0);
    a.graph_pool_retain(0, POOL1).unwrap();
    a.graph_pool_retain(0, POOL2).unwrap();
    enter(&a, POOL1);
    let kept = alloc_in(&a, POOL1, 4 * MIB);
    let gone = alloc_in(&a, POOL1, 40 * MIB);
    leave(&a, POOL1);
    enter(&a, POOL2);
    let other = alloc_in(&a, POOL2, 40 * MIB);
    leave(&a, POOL2);
    a.graph_pool_free(gone, 40 * MIB, 0, POOL1, 0);
    a.graph_pool_free(other, 40 * MIB, 0, POOL2, 0);
    let segments = |pool| pool_view(&a, pool).0;
    // Used by its MemPool: its cache stays.
    assert_eq!(a.pool_empty_cache(0, POOL1), 0);
    assert_eq!(segments(POOL1), vec![20 * MIB, 40 * MIB]);
    // Deleted with a live tensor: its free segment goes, the live one and
    // everything else stays.
    a.graph_pool_release(0, POOL1).unwrap();
    assert_eq!(a.pool_empty_cache(0, POOL1), 40 * MIB);
    assert_eq!(segments(POOL1), vec![20 * MIB]);
    assert_eq!(
        segments(POOL2),
        vec![40 * MIB],
        "another pool's cache stays"
    );
    assert_eq!(a.reserved_bytes(0), device_cache + 60 * MIB);
    // Its last tensor freed: the pool goes, with its memory.
    a.graph_pool_free(kept, 4 * MIB, 0, POOL1, 0);
    assert_eq!(a.graph_pool_count(0), 1);
    assert_eq!(a.reserved_bytes(0), device_cache + 40 * MIB);
    // A pool that does not exist, a device never used: nothing.
    assert_eq!(a.pool_empty_cache(0, POOL1), 0);
    assert_eq!(a.pool_empty_cache(5, POOL1), 0);
    a.graph_pool_release(0, POOL2).unwrap();
    assert_eq!(a.reserved_bytes(0), device_cache);
}

#[test]
fn empty_cache_inside_a_pool_context_leaves_every_pool_its_segment() {
    let _one = one_at_a_time();
    // test_mempool_emptycache_multithread: four threads, each in a
    // use_mem_pool context of its own pool, allocate, free and empty the
    // cache.
    let a = allocator("resource=pool");
    let pools: Vec<(u64, u64)> = (10..14).map(|i| (0, i)).collect();
    for &pool in &pools {
        a.graph_pool_retain(0, pool).unwrap();
    }
    let cached = a.malloc(MIB, 0, 0);
    a.free(cached, MIB, 0, 0);
    let device_cache = a.reserved_bytes(0);
    let barrier = std::sync::Barrier::new(pools.len());
    std::thread::scope(|scope| {
        for &pool in &pools {
            let (a, barrier) = (&a, &barrier);
            scope.spawn(move || {
                enter(a, pool);
                let x = alloc_in(a, pool, 16);
                a.graph_pool_free(x, 16, 0, pool, 0);
                barrier.wait();
                a.empty_cache(0);
                a.pool_empty_cache(0, DEVICE_POOL);
                barrier.wait();
                leave(a, pool);
            });
        }
    });
    for &pool in &pools {
        assert_eq!(pool_view(&a, pool).0, vec![2 * MIB], "{pool:?}");
    }
    assert_eq!(a.reserved_bytes(0), device_cache + 8 * MIB);
    // No context left: the device's cache goes, the pools' (still used)
    // stay.
    assert_eq!(a.empty_cache(0), device_cache);
    for &pool in &pools {
        assert_eq!(pool_view(&a, pool).0, vec![2 * MIB], "{pool:?}");
        a.graph_pool_release(0, pool).unwrap();
    }
    assert_eq!(a.reserved_bytes(0), 0);
}

#[test]
fn a_no_split_pool_gives_each_block_a_segment() {
    let _one = one_at_a_time();
    // test_mempool_no_split: 4 MiB twice in a pool that splits and in one
    // that does not.
    let a = allocator("resource=pool");
    let (split, whole) = (POOL1, POOL2);
    a.graph_pool_retain(0, split).unwrap();
    a.graph_pool_retain(0, whole).unwrap();
    a.graph_pool_set_no_split(0, whole).unwrap();
    let mut live = Vec::new();
    for _ in 0..2 {
        for pool in [split, whole] {
            enter(&a, pool);
            live.push((pool, alloc_in(&a, pool, 4 * MIB)));
            leave(&a, pool);
        }
    }
    let blocks_of = |pool| -> Vec<Vec<(usize, bool)>> {
        let snap = a.pool_snapshot(0, pool).unwrap();
        snap.graph_segments
            .iter()
            .map(|g| g.segment.blocks.iter().map(|b| (b.size, b.live)).collect())
            .collect()
    };
    assert_eq!(
        blocks_of(whole),
        vec![vec![(20 * MIB, true)], vec![(20 * MIB, true)]],
        "one whole block per segment"
    );
    assert_eq!(
        blocks_of(split),
        vec![vec![(4 * MIB, true), (4 * MIB, true), (12 * MIB, false)]]
    );
    // The whole blocks count as allocated; each is freed with its request,
    // a block used on another stream too.
    assert_eq!(a.allocated_bytes(0), 48 * MIB);
    a.record_stream(live[1].1, 0, stream(&a));
    for (pool, p) in live {
        a.graph_pool_free(p, 4 * MIB, 0, pool, 0);
    }
    assert_eq!(a.pending_frees(0), 0);
    assert_eq!(a.allocated_bytes(0), 0);
    assert_eq!(a.bad_free_count(0), 0);
    let e = a.graph_pool_set_no_split(0, (0, 99)).unwrap_err();
    assert!(e.contains("does not exist"), "{e}");
    let e = a.graph_pool_set_no_split(7, whole).unwrap_err();
    assert!(e.contains("never used"), "{e}");
    a.graph_pool_release(0, split).unwrap();
    a.graph_pool_release(0, whole).unwrap();
    assert_eq!(a.reserved_bytes(0), 0);
}

#[test]
fn a_use_on_oom_pool_serves_the_device_when_memory_runs_out() {
    let _one = one_at_a_time();
    // test_mempool_limited_memory_with_allocator, with pools over the
    // driver: 80 MiB allowed, 40 MiB in a pool that lends and 40 MiB in
    // one that does not.
    let a = allocator("resource=pool");
    a.set_memory_fraction(0, fraction_for(80 * MIB)).unwrap();
    let (keeps, lends) = (POOL1, POOL2);
    a.graph_pool_retain(0, keeps).unwrap();
    a.graph_pool_retain(0, lends).unwrap();
    a.graph_pool_set_use_on_oom(0, lends, true).unwrap();
    enter(&a, keeps);
    let x = alloc_in(&a, keeps, 40 * MIB);
    leave(&a, keeps);
    enter(&a, lends);
    let y = alloc_in(&a, lends, 40 * MIB);
    leave(&a, lends);
    // Nothing free anywhere: out of memory.
    assert!(a.malloc(40 * MIB, 0, 0).is_null());
    assert!(last_error().unwrap().contains("out of memory"));
    a.graph_pool_free(x, 40 * MIB, 0, keeps, 0);
    a.graph_pool_free(y, 40 * MIB, 0, lends, 0);
    // The device's allocation takes the free block of the pool that lends,
    // at its start, split.
    let c = a.malloc(30 * MIB, 0, 0);
    assert_eq!(c, y, "{:?}", last_error());
    assert_eq!(a.allocated_bytes(0), 30 * MIB);
    let (sizes, blocks) = pool_view(&a, lends);
    assert_eq!(
        (sizes, blocks),
        (vec![40 * MIB], vec![c]),
        "the pool's block"
    );
    let s = stats(&a, 0);
    assert_eq!(s.allocation.current, 1);
    assert_eq!(s.num_ooms, 1, "the lent allocation is no failure");
    // The rest of it is too small and the other pool does not lend.
    assert!(a.malloc(30 * MIB, 0, 0).is_null());
    assert_eq!(stats(&a, 0).num_ooms, 2);
    // Freed through the device's free path (used on another stream too):
    // back in the pool, which serves its own allocations from it again.
    a.record_stream(c, 0, stream(&a));
    a.free(c, 30 * MIB, 0, 0);
    assert_eq!((a.allocated_bytes(0), a.pending_frees(0)), (0, 0));
    assert_eq!(pool_view(&a, lends).1, vec![]);
    enter(&a, lends);
    let e = alloc_in(&a, lends, 20 * MIB);
    leave(&a, lends);
    assert_eq!(e, c);
    a.graph_pool_free(e, 20 * MIB, 0, lends, 0);
    // A second free of a lent block is refused as any double free.
    let f = a.malloc(30 * MIB, 0, 0);
    assert_eq!(f, y);
    a.free(f, 30 * MIB, 0, 0);
    a.free(f, 30 * MIB, 0, 0);
    assert_eq!(a.bad_free_count(0), 1);
    // Deleting the MemPools: setUseOnOOM(false), releasePool, emptyCache.
    for pool in [lends, keeps] {
        a.graph_pool_set_use_on_oom(0, pool, false).unwrap();
        a.graph_pool_release(0, pool).unwrap();
        a.pool_empty_cache(0, pool);
    }
    assert_eq!(a.graph_pool_count(0), 0);
    assert_eq!(a.reserved_bytes(0), 0);
    // Clearing it on a pool gone is no error; setting it is.
    a.graph_pool_set_use_on_oom(0, lends, false).unwrap();
    let e = a.graph_pool_set_use_on_oom(0, lends, true).unwrap_err();
    assert!(e.contains("does not exist"), "{e}");
}

#[test]
fn pools_lend_in_the_order_they_were_made_and_a_deleted_one_never() {
    let _one = one_at_a_time();
    // test_deleted_mempool_not_used_on_oom: pools that lend, deleted one
    // after the other, then one kept: only the one kept lends.
    let a = allocator("resource=pool");
    a.set_memory_fraction(0, fraction_for(40 * MIB)).unwrap();
    for i in 0..10 {
        let pool = (0, 100 + i);
        a.graph_pool_retain(0, pool).unwrap();
        a.graph_pool_set_use_on_oom(0, pool, true).unwrap();
        enter(&a, pool);
        let x = alloc_in(&a, pool, 40 * MIB);
        leave(&a, pool);
        a.graph_pool_free(x, 40 * MIB, 0, pool, 0);
        a.graph_pool_set_use_on_oom(0, pool, false).unwrap();
        a.graph_pool_release(0, pool).unwrap();
        a.pool_empty_cache(0, pool);
    }
    assert_eq!(a.graph_pool_count(0), 0);
    let kept = (0, 200);
    a.graph_pool_retain(0, kept).unwrap();
    a.graph_pool_set_use_on_oom(0, kept, true).unwrap();
    enter(&a, kept);
    let x = alloc_in(&a, kept, 40 * MIB);
    leave(&a, kept);
    a.graph_pool_free(x, 40 * MIB, 0, kept, 0);
    let b = a.malloc(20 * MIB, 0, 0);
    let c = a.malloc(20 * MIB, 0, 0);
    assert_eq!((b, c), (x, DevicePtr(x.0 + (20 * MIB) as u64)));
    assert_eq!(pool_view(&a, kept).1, vec![b, c]);
    a.free(b, 20 * MIB, 0, 0);
    a.free(c, 20 * MIB, 0, 0);
    a.graph_pool_release(0, kept).unwrap();
    assert_eq!(a.reserved_bytes(0), 0);

    // Two pools that lend: the one made first serves first; a pool its
    // MemPool released (alive for a live block) no longer lends.
    a.set_memory_fraction(0, fraction_for(60 * MIB)).unwrap();
    let (first, second) = ((0, 301), (0, 302));
    for pool in [second, first] {
        a.graph_pool_retain(0, pool).unwrap();
        a.graph_pool_set_use_on_oom(0, pool, true).unwrap();
    }
    enter(&a, second);
    let (a20, a10) = (
        alloc_in(&a, second, 20 * MIB),
        alloc_in(&a, second, 10 * MIB),
    );
    leave(&a, second);
    enter(&a, first);
    let b30 = alloc_in(&a, first, 30 * MIB);
    leave(&a, first);
    a.graph_pool_free(a20, 20 * MIB, 0, second, 0);
    a.graph_pool_free(b30, 30 * MIB, 0, first, 0);
    let d = a.malloc(20 * MIB, 0, 0);
    assert_eq!(d, a20, "made first: `second`");
    a.free(d, 20 * MIB, 0, 0);
    a.graph_pool_release(0, second).unwrap();
    assert_eq!(a.graph_pool_count(0), 2, "a10 keeps `second`");
    // A context under way elsewhere: the cache stays through the retry,
    // `second`'s free block included.
    let other = (0, 303);
    enter(&a, other);
    let d = a.malloc(20 * MIB, 0, 0);
    assert_eq!(d, b30, "`second` lends no more");
    assert_eq!(pool_view(&a, second).0, vec![20 * MIB, 10 * MIB]);
    a.free(d, 20 * MIB, 0, 0);
    leave(&a, other);
    a.graph_pool_free(a10, 10 * MIB, 0, second, 0);
    a.graph_pool_release(0, first).unwrap();
    assert_eq!((a.graph_pool_count(0), a.bad_free_count(0)), (0, 0));
}
