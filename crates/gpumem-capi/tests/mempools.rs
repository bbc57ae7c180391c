//! PyTorch's `torch.cuda.MemPool` over gpumem's graph pools, as the native
//! allocator drives them: a MemPool is a pool retained once for its life
//! (`createOrIncrefPool`, `releasePool`), and `use_mem_pool` begins and
//! ends routing a thread's allocations to it (`beginAllocateToPool`, which
//! counts a use, `endAllocateToPool` and `releasePool`: a capture to
//! gpumem).

mod support;

use gpumem::DevicePtr;
use gpumem_capi::allocator::last_error;
use gpumem_capi::graph_pools::DEVICE_POOL;
use gpumem_capi::Allocator;
use support::{allocator, MIB};

const POOL1: (u64, u64) = (0, 1);
const POOL2: (u64, u64) = (0, 2);
const POOL3: (u64, u64) = (0, 3);

/// Allocates `size` bytes in `pool` as `use_mem_pool` does.
fn alloc_in(a: &Allocator, pool: (u64, u64), size: usize) -> DevicePtr {
    let p = a.graph_pool_malloc(size, 0, pool, 0);
    assert!(!p.is_null(), "{:?}", last_error());
    p
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
    let a = allocator("resource=pool");
    let e = a.graph_pool_retain(0, DEVICE_POOL).unwrap_err();
    assert!(e.contains("device's own pool"), "{e}");
    let e = a.graph_pool_begin(0, DEVICE_POOL).unwrap_err();
    assert!(e.contains("device's own pool"), "{e}");
    assert_eq!(a.graph_pool_count(0), 0);
}

#[test]
fn deleting_a_pool_empties_its_cache_only() {
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
    // The whole blocks count as allocated; each is freed with its request.
    assert_eq!(a.allocated_bytes(0), 48 * MIB);
    for (pool, p) in live {
        a.graph_pool_free(p, 4 * MIB, 0, pool, 0);
    }
    assert_eq!(a.bad_free_count(0), 0);
    let e = a.graph_pool_set_no_split(0, (0, 99)).unwrap_err();
    assert!(e.contains("does not exist"), "{e}");
    let e = a.graph_pool_set_no_split(7, whole).unwrap_err();
    assert!(e.contains("never used"), "{e}");
    a.graph_pool_release(0, split).unwrap();
    a.graph_pool_release(0, whole).unwrap();
    assert_eq!(a.reserved_bytes(0), 0);
}
