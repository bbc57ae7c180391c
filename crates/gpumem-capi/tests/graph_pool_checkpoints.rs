//! Graph pools as PyTorch's graphs and graph trees use them: a block of one
//! graph pool freed during a capture into another stays until that graph
//! goes (PyTorch's `test_graph_capture_reset_recapture`, an illegal memory
//! access before), checkpoints put a pool's layout back, and snapshots name
//! each segment's pool and size class.

mod support;

use gpumem::driver::Driver;
use gpumem::DevicePtr;
use gpumem_capi::{Allocator, Snapshot};
use support::{allocator, kinds, sim, MIB};

const A: (u64, u64) = (1, 0);
const B: (u64, u64) = (2, 0);

fn stream(a: &Allocator) -> u64 {
    let sim = sim(a);
    let driver: &dyn Driver = &*sim;
    driver.stream_create(0, true).unwrap()
}

/// The segments of `pool` in a snapshot, with their size class.
fn pool_segments(snap: &Snapshot, pool: (u64, u64)) -> Vec<(usize, bool)> {
    snap.graph_segments
        .iter()
        .filter(|g| g.pool == pool)
        .map(|g| {
            (
                g.segment.size,
                g.segment.class == gpumem::pool::SizeClass::Large,
            )
        })
        .collect()
}

/// A tensor allocated in a first capture, the graph reset, a second capture
/// that writes the tensor and frees it: the second graph writes that memory
/// on every replay, so it must stay the first pool's, and not go back to
/// the driver nor to anyone else, until the second graph goes.
#[test]
fn a_block_freed_in_another_graphs_capture_stays_until_that_graph_goes() {
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        let s = stream(&a);
        a.graph_pool_begin(0, A).unwrap();
        let x = a.graph_pool_malloc(3 * MIB, 0, A, s);
        assert!(!x.is_null());
        a.graph_pool_end(0, A).unwrap();
        a.graph_pool_release(0, A).unwrap(); // the first graph is reset
        a.graph_pool_begin(0, B).unwrap();
        a.graph_pool_hold(x, 3 * MIB, 0, B, s); // the second capture frees x
        a.graph_pool_end(0, B).unwrap();
        assert_eq!(a.bad_free_count(0), 0, "{kind}");
        assert_eq!(
            a.graph_pool_count(0),
            2,
            "{kind}: A stays while B may use x"
        );
        assert_eq!(
            a.graph_pool_live_blocks(0, A),
            Some(vec![x]),
            "{kind}: x stays live in A"
        );
        // A second free of x is refused, and a new capture into another
        // pool does not get its memory.
        a.graph_pool_free(x, 3 * MIB, 0, A, s);
        assert_eq!(a.bad_free_count(0), 1, "{kind}: the second free");
        a.graph_pool_begin(0, (3, 0)).unwrap();
        let y = a.graph_pool_malloc(3 * MIB, 0, (3, 0), s);
        assert!(y.0 + 3 * MIB as u64 <= x.0 || x.0 + 3 * MIB as u64 <= y.0);
        a.graph_pool_free(y, 3 * MIB, 0, (3, 0), s);
        a.graph_pool_end(0, (3, 0)).unwrap();
        a.graph_pool_release(0, (3, 0)).unwrap();
        // The second graph goes: x is freed in A, and A (unused) goes too.
        a.graph_pool_release(0, B).unwrap();
        assert_eq!(a.graph_pool_count(0), 0, "{kind}");
        assert_eq!(a.allocated_bytes(0), 0, "{kind}");
        assert_eq!(a.bad_free_count(0), 1, "{kind}");
    }
}

/// A free during a capture is checked before anything is held: an
/// interior pointer or a wrong size of another pool's block is a bad free
/// and the block stays as it was.
#[test]
fn a_bad_free_during_a_capture_holds_nothing() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    a.graph_pool_begin(0, A).unwrap();
    let x = a.graph_pool_malloc(3 * MIB, 0, A, s);
    a.graph_pool_end(0, A).unwrap();
    a.graph_pool_begin(0, B).unwrap();
    a.graph_pool_hold(x, 5 * MIB, 0, B, s);
    a.graph_pool_hold(DevicePtr(x.0 + 512), 512, 0, B, s);
    assert_eq!(a.bad_free_count(0), 2);
    a.graph_pool_end(0, B).unwrap();
    a.graph_pool_release(0, B).unwrap();
    assert_eq!(a.graph_pool_count(0), 1, "B went, holding nothing");
    a.graph_pool_free(x, 3 * MIB, 0, A, s);
    a.graph_pool_release(0, A).unwrap();
    assert_eq!(a.graph_pool_count(0), 0);
    assert_eq!(a.bad_free_count(0), 2);
}

/// A block of the capture's own pool freed during the capture is freed
/// there: the capture reuses it, in its stream's order.
#[test]
fn a_block_of_the_capture_pool_is_reused_by_the_capture() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    a.graph_pool_begin(0, A).unwrap();
    let x = a.graph_pool_malloc(MIB, 0, A, s);
    a.graph_pool_hold(x, MIB, 0, A, s);
    let y = a.graph_pool_malloc(MIB, 0, A, s);
    assert_eq!(x, y);
    a.graph_pool_free(y, MIB, 0, A, s);
    a.graph_pool_end(0, A).unwrap();
    a.graph_pool_release(0, A).unwrap();
    assert_eq!((a.graph_pool_count(0), a.bad_free_count(0)), (0, 0));
}

/// Graph trees: a checkpoint after recording, tensors freed and other
/// blocks made since, then the checkpoint restored: the layout is the
/// checkpoint's, the blocks it had are live again at their addresses, the
/// ones made since are freed, and the statistics follow.
#[test]
fn a_checkpoint_restores_the_pool_and_its_statistics() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    a.graph_pool_begin(0, A).unwrap();
    let out1 = a.graph_pool_malloc(2048, 0, A, s);
    let out2 = a.graph_pool_malloc(3 * MIB, 0, A, s);
    a.graph_pool_end(0, A).unwrap();
    let saved = a.graph_pool_checkpoint(0, A).unwrap();
    let before = a.snapshot(0).unwrap();
    let allocated = a.allocated_bytes(0);
    // The outputs die; a new branch allocates elsewhere in the pool.
    a.graph_pool_free(out1, 2048, 0, A, s);
    a.graph_pool_free(out2, 3 * MIB, 0, A, s);
    a.graph_pool_begin(0, A).unwrap();
    let other = a.graph_pool_malloc(5 * MIB, 0, A, s);
    a.graph_pool_end(0, A).unwrap();
    let r = a.graph_pool_restore(0, A, &saved).unwrap();
    assert_eq!(r.freed, vec![other]);
    let made: Vec<DevicePtr> = r.made.iter().map(|(b, _)| b.address).collect();
    assert_eq!(made, vec![out1, out2]);
    assert!(r.made.iter().all(|&(_, st)| st == s), "their stream");
    let after = a.snapshot(0).unwrap();
    for g in &before.graph_segments {
        assert!(after.graph_segments.contains(g), "segment {g:?} as saved");
    }
    assert_eq!(a.allocated_bytes(0), allocated);
    // The blocks made again free as any other.
    a.graph_pool_free(out1, 2048, 0, A, s);
    a.graph_pool_free(out2, 3 * MIB, 0, A, s);
    // Two graphs were captured into it: each releases it when deleted.
    a.graph_pool_release(0, A).unwrap();
    a.graph_pool_release(0, A).unwrap();
    assert_eq!((a.graph_pool_count(0), a.bad_free_count(0)), (0, 0));
    assert!(
        a.graph_pool_restore(0, A, &saved).is_err(),
        "its pool is gone"
    );
}

/// A checkpoint that would free a block another graph still uses (held for
/// it) is refused, and changes nothing.
#[test]
fn a_restore_never_frees_a_block_another_graph_holds() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    a.graph_pool_begin(0, A).unwrap();
    a.graph_pool_end(0, A).unwrap();
    let empty = a.graph_pool_checkpoint(0, A).unwrap();
    a.graph_pool_begin(0, A).unwrap();
    let x = a.graph_pool_malloc(MIB, 0, A, s);
    a.graph_pool_end(0, A).unwrap();
    a.graph_pool_begin(0, B).unwrap();
    a.graph_pool_hold(x, MIB, 0, B, s);
    a.graph_pool_end(0, B).unwrap();
    assert!(a.graph_pool_restore(0, A, &empty).is_err());
    assert_eq!(a.graph_pool_live_blocks(0, A), Some(vec![x]));
    a.graph_pool_release(0, B).unwrap();
    let r = a.graph_pool_restore(0, A, &empty).unwrap();
    assert!(r.freed.is_empty(), "x was freed when B went");
    a.graph_pool_release(0, A).unwrap();
    a.graph_pool_release(0, A).unwrap();
    assert_eq!(a.graph_pool_count(0), 0);
}

/// Snapshots name each graph segment's pool and size class, laid out as
/// PyTorch lays out its private pools; `empty_cache` gives back the free
/// segments of pools no graph uses, nothing while a capture is under way.
#[test]
fn snapshots_name_pools_and_empty_cache_frees_unused_pools_segments() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    a.graph_pool_begin(0, A).unwrap();
    let small = a.graph_pool_malloc(4, 0, A, s);
    let large = a.graph_pool_malloc(20 * MIB, 0, A, s);
    let keep = a.graph_pool_malloc(12 * MIB, 0, A, s);
    a.graph_pool_end(0, A).unwrap();
    let mut segs = pool_segments(&a.snapshot(0).unwrap(), A);
    segs.sort();
    assert_eq!(
        segs,
        vec![(2 * MIB, false), (12 * MIB, true), (20 * MIB, true)]
    );
    a.graph_pool_free(small, 4, 0, A, s);
    a.graph_pool_free(large, 20 * MIB, 0, A, s);
    a.graph_pool_release(0, A).unwrap(); // keep is still live
    a.graph_pool_begin(0, B).unwrap();
    assert_eq!(a.empty_cache(0), 0, "nothing during a capture");
    a.graph_pool_end(0, B).unwrap();
    a.graph_pool_release(0, B).unwrap();
    let given = a.empty_cache(0);
    assert!(given >= 22 * MIB, "{given} bytes given back");
    assert_eq!(
        pool_segments(&a.snapshot(0).unwrap(), A),
        vec![(12 * MIB, true)]
    );
    a.graph_pool_free(keep, 12 * MIB, 0, A, s);
    assert_eq!(a.graph_pool_count(0), 0);
}
