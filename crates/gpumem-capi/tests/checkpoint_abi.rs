//! The C functions of graph-pool checkpoints and the snapshot's pool ids,
//! called as PyTorch's native allocator calls them, over the simulated
//! device (the global allocator, so a binary of its own).

use std::ffi::c_void;
use std::ptr::null_mut;

use gpumem_capi::*;

const MIB: usize = 1 << 20;

fn setup() {
    // Set before the first call into the library, which reads it.
    std::env::set_var("GPUMEM_DEVICE", "sim");
    std::env::remove_var("GPUMEM_CONF");
}

fn live(device: i32, id: (u64, u64)) -> Vec<*mut c_void> {
    let mut n = 0usize;
    // SAFETY: a NULL array with a maximum of 0 and a writable count.
    assert_eq!(
        unsafe { gpumem_graph_pool_live_blocks(device, id.0, id.1, null_mut(), 0, &mut n) },
        0
    );
    let mut out = vec![null_mut(); n];
    // SAFETY: `out` holds `n` entries.
    unsafe { gpumem_graph_pool_live_blocks(device, id.0, id.1, out.as_mut_ptr(), n, &mut n) };
    out
}

#[test]
fn checkpoints_through_the_c_functions() {
    setup();
    let (d, id, s) = (0, (7u64, 0u64), null_mut());
    assert_eq!(gpumem_graph_pool_begin(d, id.0, id.1), 0);
    let a = gpumem_graph_pool_malloc(1000, d, id.0, id.1, s);
    let b = gpumem_graph_pool_malloc(3 * MIB, d, id.0, id.1, s);
    assert_eq!(gpumem_graph_pool_end(d, id.0, id.1), 0);
    let cp = gpumem_graph_pool_checkpoint(d, id.0, id.1);
    assert!(!cp.is_null());
    // SAFETY: a live checkpoint.
    assert_eq!(unsafe { gpumem_checkpoint_live_count(cp) }, 2);
    gpumem_graph_pool_free(a, 1000, d, id.0, id.1, s);
    let c = gpumem_graph_pool_malloc(6 * MIB, d, id.0, id.1, s);
    assert_eq!(live(d, id), vec![b, c]);

    // SAFETY: a live checkpoint; the result is read and freed below.
    let r = unsafe { gpumem_graph_pool_restore(cp) };
    assert!(!r.is_null());
    // SAFETY: a live result; arrays of the sizes given.
    unsafe {
        let mut freed = [null_mut(); 4];
        assert_eq!(gpumem_restored_freed(r, freed.as_mut_ptr(), 4), 1);
        assert_eq!(freed[0], c);
        let mut made = [gpumem_block_t::default(); 4];
        assert_eq!(gpumem_restored_made(r, made.as_mut_ptr(), 4), 1);
        assert_eq!(made[0].address, a as u64);
        assert_eq!((made[0].size, made[0].requested), (1024, 1000));
        assert_eq!(gpumem_restored_made(r, null_mut(), 0), 1, "counted");
        gpumem_restored_free(r);
    }
    assert_eq!(live(d, id), vec![a, b]);
    // A block found by its pointer alone.
    let (mut dev, mut i0, mut i1, mut req, mut st) = (-1, 0u64, 0u64, 0usize, null_mut());
    // SAFETY: writable outputs.
    let found =
        unsafe { gpumem_graph_pool_block(b, &mut dev, &mut i0, &mut i1, &mut req, &mut st) };
    assert_eq!((found, dev, (i0, i1), req, st), (0, d, id, 3 * MIB, s));
    // SAFETY: NULL outputs are allowed.
    let inside = unsafe {
        gpumem_graph_pool_block(
            b.wrapping_byte_add(512),
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
            null_mut(),
        )
    };
    assert_eq!(inside, -1, "an interior pointer is no block");

    // The snapshot names the pool of each of its segments.
    let mut n_seg = 0usize;
    let mut n_blk = 0usize;
    let mut segs = vec![gpumem_segment_t::default(); 8];
    let mut blks = vec![gpumem_block_t::default(); 8];
    // SAFETY: arrays of 8 entries and writable counts.
    let rc = unsafe {
        gpumem_snapshot(
            d,
            segs.as_mut_ptr(),
            8,
            &mut n_seg,
            blks.as_mut_ptr(),
            8,
            &mut n_blk,
        )
    };
    assert_eq!(rc, 0);
    let mine: Vec<_> = segs[..n_seg]
        .iter()
        .filter(|g| (g.pool_id0, g.pool_id1) == id)
        .map(|g| (g.size as usize, g.is_large))
        .collect();
    assert!(
        mine.contains(&(2 * MIB, 0)) && mine.contains(&(20 * MIB, 1)),
        "{mine:?}"
    );

    gpumem_graph_pool_free(a, 1000, d, id.0, id.1, s);
    gpumem_graph_pool_free(b, 3 * MIB, d, id.0, id.1, s);
    assert_eq!(gpumem_graph_pool_release(d, id.0, id.1), 0);
    // The pool is gone: a restore of its checkpoint is refused.
    // SAFETY: a live checkpoint, freed after.
    unsafe {
        assert!(gpumem_graph_pool_restore(cp).is_null());
        assert!(!gpumem_last_error().is_null());
        gpumem_checkpoint_free(cp);
    }
    assert_eq!(gpumem_bad_free_count(d), 0);
    assert!(gpumem_graph_pool_checkpoint(d, id.0, id.1).is_null());
}
