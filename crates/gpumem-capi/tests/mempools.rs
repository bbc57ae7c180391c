//! PyTorch's `torch.cuda.MemPool` over gpumem's graph pools, as the native
//! allocator drives them: a MemPool is a pool retained once for its life
//! (`createOrIncrefPool`, `releasePool`), and `use_mem_pool` begins and
//! ends routing a thread's allocations to it (`beginAllocateToPool`,
//! `endAllocateToPool`: a capture to gpumem). Its snapshot is its own
//! segments.

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
        a.graph_pool_begin(0, pool).unwrap();
        live.push((pool, alloc_in(&a, pool, 20 * MIB)));
    }
    for (pool, inner) in [(POOL2, POOL3), (POOL1, POOL2)] {
        a.graph_pool_end(0, inner).unwrap();
        live.push((pool, alloc_in(&a, pool, 20 * MIB)));
    }
    a.graph_pool_end(0, POOL1).unwrap();
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
