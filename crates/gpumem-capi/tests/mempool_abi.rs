//! The C functions behind PyTorch's `torch.cuda.MemPool` in the native
//! allocator, called as it calls them, over the simulated device (the
//! global allocator, so a binary of its own). Each test has a device of its
//! own, so that parallel tests see only their own numbers.

mod support;

use std::ptr::null_mut;

use gpumem_capi::*;
use support::foreign::source_t;
use support::one_at_a_time;

const MIB: usize = 1 << 20;

fn setup() {
    // Set before the first call into the library, which reads it.
    std::env::set_var("GPUMEM_DEVICE", "sim");
    std::env::remove_var("GPUMEM_CONF");
}

mod dev {
    pub const SNAPSHOT: i32 = 0;
    pub const EMPTY: i32 = 1;
    pub const NO_SPLIT: i32 = 2;
    pub const USE_ON_OOM: i32 = 3;
    pub const FOREIGN: i32 = 4;
    pub const EXPANDABLE: i32 = 5;
}

/// `gpumem_pool_snapshot` of `(device, id)`: its segments and live blocks.
fn pool_snapshot(device: i32, id: (u64, u64)) -> (Vec<gpumem_segment_t>, Vec<gpumem_block_t>) {
    let (mut n_seg, mut n_blk) = (0usize, 0usize);
    // SAFETY: NULL arrays with maxima of 0 and writable counts.
    let rc = unsafe {
        gpumem_pool_snapshot(
            device,
            id.0,
            id.1,
            null_mut(),
            0,
            &mut n_seg,
            null_mut(),
            0,
            &mut n_blk,
        )
    };
    assert_eq!(rc, 0);
    let mut segs = vec![gpumem_segment_t::default(); n_seg];
    let mut blks = vec![gpumem_block_t::default(); n_blk];
    // SAFETY: arrays of the sizes given and writable counts.
    let rc = unsafe {
        gpumem_pool_snapshot(
            device,
            id.0,
            id.1,
            segs.as_mut_ptr(),
            n_seg,
            &mut n_seg,
            blks.as_mut_ptr(),
            n_blk,
            &mut n_blk,
        )
    };
    assert_eq!(rc, 0);
    segs.truncate(n_seg);
    blks.truncate(n_blk);
    (segs, blks)
}

#[test]
fn a_pool_s_snapshot_through_the_c_function() {
    let _one = one_at_a_time();
    setup();
    let (d, id, s) = (dev::SNAPSHOT, (0u64, 11u64), null_mut());
    let outside = gpumem_malloc(MIB as isize, d, s);
    assert_eq!(gpumem_graph_pool_retain(d, id.0, id.1), 0);
    assert_eq!(gpumem_graph_pool_begin(d, id.0, id.1), 0);
    let small = gpumem_graph_pool_malloc(1000, d, id.0, id.1, s);
    let large = gpumem_graph_pool_malloc(4 * MIB, d, id.0, id.1, s);
    assert_eq!(gpumem_graph_pool_end(d, id.0, id.1), 0);

    let (segs, blks) = pool_snapshot(d, id);
    let sizes: Vec<(u64, i32)> = segs.iter().map(|g| (g.size, g.is_large)).collect();
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    assert!(sizes.contains(&(2 * MIB as u64, 0)) && sizes.contains(&(20 * MIB as u64, 1)));
    assert!(segs.iter().all(|g| (g.pool_id0, g.pool_id1) == id));
    let mut mine = vec![small as u64, large as u64];
    mine.sort();
    let got: Vec<u64> = blks.iter().map(|b| b.address).collect();
    assert_eq!(got, mine, "the pool's live blocks only");

    // (0, 0): everything, as gpumem_snapshot.
    let (all_segs, all_blks) = pool_snapshot(d, (0, 0));
    assert_eq!(all_segs.len(), 3);
    assert!(all_blks.iter().any(|b| b.address == outside as u64));
    // A pool that does not exist: nothing.
    assert_eq!(pool_snapshot(d, (0, 12345)).0.len(), 0);
    // A device out of range.
    // SAFETY: NULL arrays with maxima of 0; NULL counts are not written.
    let rc = unsafe {
        gpumem_pool_snapshot(
            64,
            id.0,
            id.1,
            null_mut(),
            0,
            null_mut(),
            null_mut(),
            0,
            null_mut(),
        )
    };
    assert_eq!(rc, -1);

    gpumem_graph_pool_free(small, 1000, d, id.0, id.1, s);
    gpumem_graph_pool_free(large, 4 * MIB, d, id.0, id.1, s);
    assert_eq!(gpumem_graph_pool_release(d, id.0, id.1), 0);
    gpumem_free(outside, MIB as isize, d, s);
    assert_eq!(gpumem_bad_free_count(d), 0);
}

#[test]
fn a_pool_s_cache_through_the_c_function() {
    let _one = one_at_a_time();
    setup();
    let (d, id, s) = (dev::EMPTY, (0u64, 21u64), null_mut());
    let cached = gpumem_malloc(MIB as isize, d, s);
    gpumem_free(cached, MIB as isize, d, s);
    let device_cache = gpumem_reserved_bytes(d);
    assert!(device_cache > 0);
    // MemPool(), then `with use_mem_pool(pool)`: two blocks.
    assert_eq!(gpumem_graph_pool_retain(d, id.0, id.1), 0);
    assert_eq!(gpumem_graph_pool_begin(d, id.0, id.1), 0);
    let live = gpumem_graph_pool_malloc(4 * MIB, d, id.0, id.1, s);
    let freed = gpumem_graph_pool_malloc(30 * MIB, d, id.0, id.1, s);
    assert_eq!(gpumem_graph_pool_end(d, id.0, id.1), 0);
    assert_eq!(gpumem_graph_pool_release(d, id.0, id.1), 0);
    gpumem_graph_pool_free(freed, 30 * MIB, d, id.0, id.1, s);
    assert_eq!(
        gpumem_pool_empty_cache(d, id.0, id.1),
        0,
        "the MemPool uses it"
    );
    // del pool: releasePool, then emptyCache(id).
    assert_eq!(gpumem_graph_pool_release(d, id.0, id.1), 0);
    assert_eq!(gpumem_pool_empty_cache(d, id.0, id.1), 30 * MIB);
    assert_eq!(gpumem_reserved_bytes(d), device_cache + 20 * MIB);
    gpumem_graph_pool_free(live, 4 * MIB, d, id.0, id.1, s);
    assert_eq!(gpumem_reserved_bytes(d), device_cache, "the pool went");
    assert_eq!(gpumem_pool_empty_cache(d, id.0, id.1), 0, "no such pool");
    assert_eq!(gpumem_pool_empty_cache(d, 0, 0), device_cache);
    assert_eq!(gpumem_reserved_bytes(d), 0);
    assert_eq!(gpumem_bad_free_count(d), 0);
}

#[test]
fn no_split_through_the_c_function() {
    let _one = one_at_a_time();
    setup();
    let (d, id, s) = (dev::NO_SPLIT, (0u64, 31u64), null_mut());
    assert_eq!(gpumem_graph_pool_retain(d, id.0, id.1), 0);
    assert_eq!(gpumem_graph_pool_set_no_split(d, id.0, id.1), 0);
    assert_eq!(gpumem_graph_pool_begin(d, id.0, id.1), 0);
    let a = gpumem_graph_pool_malloc(4 * MIB, d, id.0, id.1, s);
    let b = gpumem_graph_pool_malloc(4 * MIB, d, id.0, id.1, s);
    assert_eq!(gpumem_graph_pool_end(d, id.0, id.1), 0);
    assert_eq!(gpumem_graph_pool_release(d, id.0, id.1), 0);
    let (segs, blks) = pool_snapshot(d, id);
    assert_eq!(segs.len(), 2);
    assert!(blks.iter().all(|b| b.size == 20 * MIB as u64));
    gpumem_graph_pool_free(a, 4 * MIB, d, id.0, id.1, s);
    gpumem_graph_pool_free(b, 4 * MIB, d, id.0, id.1, s);
    assert_eq!(gpumem_graph_pool_release(d, id.0, id.1), 0);
    // The pool is gone: nothing to set.
    assert_eq!(gpumem_graph_pool_set_no_split(d, id.0, id.1), -1);
    // SAFETY: the thread's last error, read at once.
    let why = unsafe { std::ffi::CStr::from_ptr(gpumem_last_error()) };
    assert!(why.to_string_lossy().contains("does not exist"), "{why:?}");
    assert_eq!(gpumem_bad_free_count(d), 0);
}

#[test]
fn use_on_oom_through_the_c_functions() {
    let _one = one_at_a_time();
    setup();
    let (d, id, s) = (dev::USE_ON_OOM, (0u64, 41u64), null_mut());
    // 40 MiB of the simulated device's 80 GiB.
    assert_eq!(gpumem_set_memory_fraction(d, 1.0 / 2048.0), 0);
    assert_eq!(gpumem_graph_pool_retain(d, id.0, id.1), 0);
    assert_eq!(gpumem_graph_pool_set_use_on_oom(d, id.0, id.1, 1), 0);
    assert_eq!(gpumem_graph_pool_begin(d, id.0, id.1), 0);
    let x = gpumem_graph_pool_malloc(40 * MIB, d, id.0, id.1, s);
    assert!(!x.is_null());
    assert_eq!(gpumem_graph_pool_end(d, id.0, id.1), 0);
    assert_eq!(gpumem_graph_pool_release(d, id.0, id.1), 0);
    gpumem_graph_pool_free(x, 40 * MIB, d, id.0, id.1, s);
    // The device's allocations are lent the pool's free memory, and their
    // frees (plain and rounded) give it back.
    let b = gpumem_malloc(20 * MIB as isize, d, s);
    let c = gpumem_malloc_rounded(20 * MIB - 100, 20 * MIB, d, s);
    assert_eq!((b, c), (x, x.wrapping_byte_add(20 * MIB)));
    assert_eq!(pool_snapshot(d, id).1.len(), 2);
    gpumem_free(b, 20 * MIB as isize, d, s);
    gpumem_free_rounded(c, 20 * MIB - 100, 20 * MIB, d, s);
    assert_eq!(pool_snapshot(d, id).1.len(), 0);
    // Cleared: the pool lends no more.
    assert_eq!(gpumem_graph_pool_set_use_on_oom(d, id.0, id.1, 0), 0);
    assert!(gpumem_malloc(20 * MIB as isize, d, s).is_null());
    assert_eq!(gpumem_graph_pool_release(d, id.0, id.1), 0);
    assert_eq!(gpumem_graph_pool_set_use_on_oom(d, id.0, id.1, 0), 0);
    assert_eq!(gpumem_graph_pool_set_use_on_oom(d, id.0, id.1, 1), -1);
    assert_eq!(gpumem_bad_free_count(d), 0);
}

#[test]
fn a_pool_of_the_caller_s_allocator_through_the_c_function() {
    let _one = one_at_a_time();
    setup();
    let (d, id, s) = (dev::FOREIGN, (0u64, 51u64), null_mut());
    let driver = global_sim_driver().expect("the simulated device");
    let (c, calls) = source_t(driver.clone());
    // SAFETY: a readable source whose functions keep the promises.
    assert_eq!(
        unsafe { gpumem_graph_pool_retain_foreign(d, id.0, id.1, &c) },
        0
    );
    assert_eq!(gpumem_graph_pool_begin(d, id.0, id.1), 0);
    let p = gpumem_graph_pool_malloc(4 * MIB, d, id.0, id.1, s);
    assert!(!p.is_null());
    assert_eq!(gpumem_graph_pool_end(d, id.0, id.1), 0);
    assert_eq!(gpumem_graph_pool_release(d, id.0, id.1), 0);
    assert_eq!(calls.allocs(), 1);
    let (segs, _) = pool_snapshot(d, id);
    assert_eq!(segs.len(), 1);
    assert_eq!((segs[0].size, segs[0].is_expandable), (20 * MIB as u64, 0));
    // A second pool with the id: refused, its context released at once.
    let (c2, calls2) = source_t(driver);
    // SAFETY: as above.
    assert_eq!(
        unsafe { gpumem_graph_pool_retain_foreign(d, id.0, id.1, &c2) },
        -1
    );
    assert_eq!(calls2.releases(), 1);
    // SAFETY: NULL is allowed.
    assert_eq!(
        unsafe { gpumem_graph_pool_retain_foreign(d, 0, 52, std::ptr::null()) },
        -1
    );
    // Deleted, then its tensor: the segment goes back, then the context.
    assert_eq!(gpumem_graph_pool_release(d, id.0, id.1), 0);
    assert_eq!(gpumem_pool_empty_cache(d, id.0, id.1), 0);
    assert_eq!((calls.frees(), calls.releases()), (0, 0));
    gpumem_graph_pool_free(p, 4 * MIB, d, id.0, id.1, s);
    assert_eq!((calls.frees(), calls.releases()), (1, 1));
    assert_eq!(gpumem_reserved_bytes(d), 0);
    assert_eq!(gpumem_bad_free_count(d), 0);
}

#[test]
fn a_snapshot_says_which_segments_are_expandable() {
    let _one = one_at_a_time();
    // test_mempool_expandable: a MemPool of the caller's allocator with a
    // block, and one block of the device's pool (expandable heaps, the
    // default): two segments, only the device's expandable.
    setup();
    let (d, id, s) = (dev::EXPANDABLE, (0u64, 61u64), null_mut());
    let (c, calls) = source_t(global_sim_driver().expect("the simulated device"));
    // SAFETY: a readable source whose functions keep the promises.
    assert_eq!(
        unsafe { gpumem_graph_pool_retain_foreign(d, id.0, id.1, &c) },
        0
    );
    assert_eq!(gpumem_graph_pool_begin(d, id.0, id.1), 0);
    let p = gpumem_graph_pool_malloc(MIB, d, id.0, id.1, s);
    assert_eq!(gpumem_graph_pool_end(d, id.0, id.1), 0);
    assert_eq!(gpumem_graph_pool_release(d, id.0, id.1), 0);
    let q = gpumem_malloc_rounded(MIB, MIB, d, s);
    let (segs, blks) = pool_snapshot(d, (0, 0));
    assert_eq!((segs.len(), blks.len()), (2, 2));
    let expandable: Vec<(u64, i32)> = segs.iter().map(|g| (g.pool_id1, g.is_expandable)).collect();
    assert!(
        expandable.contains(&(0, 1)) && expandable.contains(&(id.1, 0)),
        "{expandable:?}"
    );
    gpumem_free_rounded(q, MIB, MIB, d, s);
    gpumem_graph_pool_free(p, MIB, d, id.0, id.1, s);
    assert_eq!(gpumem_graph_pool_release(d, id.0, id.1), 0);
    assert_eq!((calls.frees(), calls.releases()), (1, 1));
}
