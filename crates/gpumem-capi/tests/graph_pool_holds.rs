//! Blocks of the device's pool held for a CUDA graph (freed during a
//! capture), and what a graph pool leaves behind when it goes: a held block
//! is never freed twice or handed out while held, a CuPy block is never
//! held, and the device's statistics and snapshot count the graph pools,
//! before and after they go.

mod support;

use gpumem::driver::Driver;
use gpumem::DevicePtr;
use gpumem_capi::Allocator;
use support::{allocator, kinds, sim, stats, MIB};

const POOL: (u64, u64) = (1, 0);

fn stream(a: &Allocator) -> u64 {
    let sim = sim(a);
    let driver: &dyn Driver = &*sim;
    driver.stream_create(0, true).unwrap()
}

fn overlaps(a: DevicePtr, b: DevicePtr, bytes: usize) -> bool {
    a.0 < b.0 + bytes as u64 && b.0 < a.0 + bytes as u64
}

/// A second free of a held block is refused: the pool would hand the block
/// out while the graph holds it, and the graph pool's retirement would then
/// free the new owner's block.
#[test]
fn a_held_block_freed_again_is_a_double_free() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    let x = a.malloc(4 * MIB, 0, s);
    a.graph_pool_begin(0, POOL).unwrap();
    a.graph_pool_hold(x, 4 * MIB, 0, POOL, s);
    a.free(x, 4 * MIB, 0, s);
    assert_eq!(a.bad_free_count(0), 1, "the second free is refused");
    let y = a.malloc(4 * MIB, 0, s);
    assert!(!overlaps(x, y, 4 * MIB), "the held block was handed out");
    a.graph_pool_hold(x, 4 * MIB, 0, POOL, s);
    assert_eq!(a.bad_free_count(0), 2, "a second hold is refused too");
    a.graph_pool_end(0, POOL).unwrap();
    a.graph_pool_release(0, POOL).unwrap();
    assert_eq!(a.allocated_bytes(0), 4 * MIB, "y is live, x given back");
    let z = a.malloc(4 * MIB, 0, s);
    assert!(!overlaps(y, z, 4 * MIB), "two live blocks overlap");
    a.free(y, 4 * MIB, 0, s);
    a.free(z, 4 * MIB, 0, s);
    assert_eq!(a.bad_free_count(0), 2);
    assert_eq!(a.allocated_bytes(0), 0);
}

/// A CuPy block is freed by CuPy only: a hold of one is refused as
/// `gpumem_free` refuses it, and CuPy's free later frees it, not another
/// block at its address.
#[test]
fn a_cupy_block_is_not_held() {
    let a = allocator("resource=pool");
    let x = a.cupy_malloc(4 * MIB, 0);
    a.graph_pool_begin(0, POOL).unwrap();
    a.graph_pool_hold(x, 4 * MIB, 0, POOL, 0);
    assert_eq!(a.bad_free_count(0), 1);
    a.graph_pool_end(0, POOL).unwrap();
    a.graph_pool_release(0, POOL).unwrap();
    let y = a.malloc(4 * MIB, 0, 0);
    assert!(!overlaps(x, y, 4 * MIB), "CuPy's block was handed out");
    a.cupy_free(x, 0);
    assert_eq!(a.allocated_bytes(0), 4 * MIB, "y is still live");
    a.free(y, 4 * MIB, 0, 0);
    assert_eq!(a.bad_free_count(0), 1);
}

/// A pointer that is no live block is refused at the hold, not held and
/// freed later.
#[test]
fn a_pointer_not_handed_out_is_not_held() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    let x = a.malloc(MIB, 0, s);
    a.graph_pool_begin(0, POOL).unwrap();
    a.graph_pool_hold(DevicePtr(x.0 + 4096), 256, 0, POOL, s);
    assert_eq!(a.bad_free_count(0), 1);
    a.graph_pool_end(0, POOL).unwrap();
    a.graph_pool_release(0, POOL).unwrap();
    assert_eq!(a.allocated_bytes(0), MIB);
    a.free(x, MIB, 0, s);
    assert_eq!(a.bad_free_count(0), 1);
}

/// A graph pool that goes takes none of the device's totals or peaks with
/// it: they never go backwards without a reset.
#[test]
fn statistics_survive_the_graph_pool() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    let w = a.malloc(MIB, 0, s);
    a.free(w, MIB, 0, s);
    a.graph_pool_begin(0, POOL).unwrap();
    let p = a.graph_pool_malloc(64 * MIB, 0, POOL, s);
    assert!(!p.is_null());
    a.graph_pool_free(p, 64 * MIB, 0, POOL, s);
    a.graph_pool_end(0, POOL).unwrap();
    let before = stats(&a, 0);
    let (peak, peak_reserved) = (a.peak_allocated_bytes(0), a.peak_reserved_bytes(0));
    a.graph_pool_release(0, POOL).unwrap();
    assert_eq!(a.graph_pool_count(0), 0);
    let after = stats(&a, 0);
    assert_eq!(
        after.allocated_bytes.allocated,
        before.allocated_bytes.allocated
    );
    assert_eq!(after.allocation.allocated, before.allocation.allocated);
    assert_eq!(after.allocated_bytes.peak, before.allocated_bytes.peak);
    assert_eq!(after.num_device_alloc, before.num_device_alloc);
    assert_eq!(
        after.reserved_bytes.freed,
        before.reserved_bytes.freed + before.reserved_bytes.current - after.reserved_bytes.current,
        "what the pool gave back is counted as freed"
    );
    assert!(after.num_device_free > before.num_device_free);
    assert_eq!(a.peak_allocated_bytes(0), peak);
    assert_eq!(a.peak_reserved_bytes(0), peak_reserved);
    a.reset_peak(0);
    assert!(
        a.peak_allocated_bytes(0) < peak,
        "a reset forgets the gone pool's peak"
    );
}

/// Accumulated counts reset while a graph pool lives keep counting from the
/// reset after it goes.
#[test]
fn a_reset_before_the_graph_pool_goes_keeps_counting() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    a.graph_pool_begin(0, POOL).unwrap();
    for _ in 0..10 {
        let p = a.graph_pool_malloc(MIB, 0, POOL, s);
        a.graph_pool_free(p, MIB, 0, POOL, s);
    }
    a.graph_pool_end(0, POOL).unwrap();
    a.reset_accumulated(0);
    a.graph_pool_release(0, POOL).unwrap();
    for _ in 0..3 {
        let p = a.malloc(MIB, 0, s);
        a.free(p, MIB, 0, s);
    }
    let st = stats(&a, 0);
    assert_eq!(st.allocation.allocated, 3);
    assert_eq!(st.allocated_bytes.allocated, 3 * MIB as i64);
}

/// The snapshot lists the graph pools' memory and blocks, as the allocated
/// and reserved counts do.
#[test]
fn the_snapshot_includes_the_graph_pools() {
    let a = allocator("resource=pool");
    let s = stream(&a);
    let d = a.malloc(MIB, 0, s);
    a.graph_pool_begin(0, POOL).unwrap();
    let g = a.graph_pool_malloc(32 * MIB, 0, POOL, s);
    let snap = a.snapshot(0).unwrap();
    let blocks: usize = snap.blocks.iter().map(|(b, _)| b.size).sum();
    let segments: usize = snap.segments.iter().map(|s| s.size).sum();
    assert_eq!(blocks, a.allocated_bytes(0));
    assert_eq!(segments, a.reserved_bytes(0));
    assert!(snap.blocks.iter().any(|(b, _)| b.address == g));
    assert!(snap
        .blocks
        .windows(2)
        .all(|w| w[0].0.address < w[1].0.address));
    a.graph_pool_free(g, 32 * MIB, 0, POOL, s);
    a.graph_pool_end(0, POOL).unwrap();
    a.graph_pool_release(0, POOL).unwrap();
    a.free(d, MIB, 0, s);
}

#[test]
fn a_rounded_block_held_for_a_graph_is_freed_with_its_request() {
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        let sim = sim(&a);
        let driver: &dyn Driver = &*sim;
        let s = driver.stream_create(0, true).unwrap();
        let x = a.malloc_rounded(3 * MIB + 5, 4 * MIB, 0, s);
        a.graph_pool_begin(0, POOL).unwrap();
        a.graph_pool_hold_rounded(x, 3 * MIB + 5, 4 * MIB, 0, POOL, s);
        a.graph_pool_end(0, POOL).unwrap();
        assert_eq!(
            stats(&a, 0).requested_bytes.current,
            (3 * MIB + 5) as i64,
            "{kind}"
        );
        a.graph_pool_release(0, POOL).unwrap();
        let st = stats(&a, 0);
        assert_eq!(
            st.requested_bytes.current, 0,
            "{kind}: freed when the graph went"
        );
        assert_eq!(st.allocated_bytes.current, 0, "{kind}");
        assert_eq!(a.bad_free_count(0), 0, "{kind}");
    }
}
