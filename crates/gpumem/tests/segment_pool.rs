//! SegmentPool: PyTorch's layout rules, one stream per segment, checked
//! frees, checkpoints put back exactly, and a model check of it all.

mod common;

use std::collections::BTreeMap;

use gpumem::driver::sim::SimConfig;
use gpumem::pool::{SegmentInfo, SegmentPool, SegmentPoolStats, SizeClass};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, DevicePtr, Error, FreeError, Stream};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

fn pool() -> (SegmentPool<DeviceResource>, Stream, Stream) {
    let (device, _) = common::device(false);
    let pool = SegmentPool::new(DeviceResource::new(device.clone())).unwrap();
    (
        pool,
        device.create_stream().unwrap(),
        device.create_stream().unwrap(),
    )
}

/// (segment bytes, [(block bytes, live)]) of each segment, in address order.
fn layout(pool: &SegmentPool<DeviceResource>) -> Vec<(usize, Vec<(usize, bool)>)> {
    pool.segments()
        .iter()
        .map(|s| (s.size, s.blocks.iter().map(|b| (b.size, b.live)).collect()))
        .collect()
}

/// Whether every segment of `saved` is in `now` (same address, size and
/// stream) with the same blocks (address, size, live or not; a block kept
/// live may have been asked for with another size that rounds the same).
fn has_segments_of(now: &[SegmentInfo], saved: &[SegmentInfo]) -> bool {
    let shape = |s: &SegmentInfo| {
        let blocks: Vec<_> = s
            .blocks
            .iter()
            .map(|b| (b.address, b.size, b.live))
            .collect();
        (s.address, s.size, s.stream, s.class, blocks)
    };
    saved
        .iter()
        .all(|s| now.iter().any(|n| shape(n) == shape(s)))
}

/// Every segment tiled by its blocks, no two free blocks side by side, and
/// the statistics what the segments hold.
fn check_segments(segments: &[SegmentInfo], stats: &SegmentPoolStats) {
    let mut want = SegmentPoolStats::default();
    for s in segments {
        let mut at = s.address.0;
        let mut prev_free = false;
        for b in &s.blocks {
            assert_eq!(b.address.0, at, "blocks tile the segment");
            assert!(b.size > 0 && b.size % 512 == 0);
            assert!(!prev_free || b.live, "free neighbours merge");
            prev_free = !b.live;
            at += b.size as u64;
            let c = match s.class {
                SizeClass::Small => &mut want.small,
                SizeClass::Large => &mut want.large,
            };
            if b.live {
                c.allocation.current += 1;
                c.allocated_bytes.current += b.size as i64;
                c.requested_bytes.current += b.requested as i64;
            }
        }
        assert_eq!(
            at,
            s.address.0 + s.size as u64,
            "the blocks end the segment"
        );
        let c = match s.class {
            SizeClass::Small => &mut want.small,
            SizeClass::Large => &mut want.large,
        };
        c.segment.current += 1;
        c.reserved_bytes.current += s.size as i64;
    }
    for (got, want) in [(&stats.small, &want.small), (&stats.large, &want.large)] {
        assert_eq!(got.allocation.current, want.allocation.current);
        assert_eq!(got.allocated_bytes.current, want.allocated_bytes.current);
        assert_eq!(got.requested_bytes.current, want.requested_bytes.current);
        assert_eq!(got.segment.current, want.segment.current);
        assert_eq!(got.reserved_bytes.current, want.reserved_bytes.current);
    }
}

#[test]
fn segments_and_blocks_are_sized_as_pytorch_sizes_them() {
    let (pool, s, _) = pool();
    let a = pool.allocate(4, 256, &s).unwrap();
    assert_eq!(
        layout(&pool),
        vec![(2 * MIB, vec![(512, true), (2 * MIB - 512, false)])]
    );
    // A second small block splits the rest of the small segment.
    let b = pool.allocate(MIB, 256, &s).unwrap();
    assert_eq!(b.0, a.0 + 512);
    // A large request under 10 MiB gets a 20 MiB segment; its remainder is
    // split off (more than 1 MiB).
    let c = pool.allocate(MIB + 1, 256, &s).unwrap();
    // A large block is taken best fit from the large segments first ...
    let e = pool.allocate(10 * MIB, 256, &s).unwrap();
    assert_eq!(e.0, c.0 + (MIB + 512) as u64);
    // ... then from a new one: of the request rounded up to 2 MiB (10 MiB
    // and more), a remainder of at most 1 MiB staying in the block.
    let d = pool.allocate(21 * MIB + 512, 256, &s).unwrap();
    let segs = layout(&pool);
    assert!(segs.contains(&(
        20 * MIB,
        vec![(MIB + 512, true), (10 * MIB, true), (9 * MIB - 512, false)]
    )));
    assert!(segs.contains(&(22 * MIB, vec![(22 * MIB, true)])));
    let st = pool.stats();
    assert_eq!(st.small.segment.current, 1);
    assert_eq!(st.large.segment.current, 2);
    assert_eq!(
        st.large.allocated_bytes.current as usize,
        MIB + 512 + 10 * MIB + 22 * MIB
    );
    assert_eq!(
        st.large.requested_bytes.current as usize,
        MIB + 1 + 10 * MIB + 21 * MIB + 512
    );
    for (p, n) in [
        (a, 4),
        (b, MIB),
        (c, MIB + 1),
        (e, 10 * MIB),
        (d, 21 * MIB + 512),
    ] {
        pool.deallocate(p, n, 256, &s).unwrap();
    }
    check_segments(&pool.segments(), &pool.stats());
    assert_eq!(pool.release_free_segments().unwrap(), 44 * MIB);
    assert!(pool.segments().is_empty());
    assert_eq!(pool.stats().large.reserved_bytes.freed as usize, 42 * MIB);
}

#[test]
fn a_pool_that_does_not_split_hands_out_whole_blocks() {
    let (pool, s, _) = pool();
    assert!(!pool.no_split());
    pool.set_no_split(true);
    assert!(pool.no_split());
    // PyTorch's test_mempool_no_split: two 4 MiB requests, a 20 MiB
    // segment each, one block each.
    let a = pool.allocate(4 * MIB, 256, &s).unwrap();
    let b = pool.allocate(4 * MIB, 256, &s).unwrap();
    let c = pool.allocate(1000, 256, &s).unwrap();
    let mut segs = layout(&pool);
    segs.sort();
    assert_eq!(
        segs,
        vec![
            (2 * MIB, vec![(2 * MIB, true)]),
            (20 * MIB, vec![(20 * MIB, true)]),
            (20 * MIB, vec![(20 * MIB, true)]),
        ]
    );
    let st = pool.stats();
    assert_eq!(st.large.allocated_bytes.current as usize, 40 * MIB);
    assert_eq!(st.large.requested_bytes.current as usize, 8 * MIB);
    check_segments(&pool.segments(), &st);
    // Freed with the size asked for; a free segment serves a smaller
    // request of its class whole.
    pool.deallocate(a, 4 * MIB, 256, &s).unwrap();
    let d = pool.allocate(2 * MIB, 256, &s).unwrap();
    assert_eq!(d, a);
    assert_eq!(pool.live_block_size(d), Some(20 * MIB));
    // Splitting again: the next block takes a piece only.
    pool.set_no_split(false);
    pool.deallocate(d, 2 * MIB, 256, &s).unwrap();
    let e = pool.allocate(2 * MIB, 256, &s).unwrap();
    assert_eq!((e, pool.live_block_size(e)), (a, Some(2 * MIB)));
    for (p, n) in [(b, 4 * MIB), (c, 1000), (e, 2 * MIB)] {
        pool.deallocate(p, n, 256, &s).unwrap();
    }
    check_segments(&pool.segments(), &pool.stats());
}

#[test]
fn allocate_cached_takes_free_blocks_and_never_grows() {
    let (pool, s1, s2) = pool();
    assert_eq!(pool.allocate_cached(MIB, 256, &s1).unwrap(), None);
    assert!(pool.segments().is_empty(), "nothing made");
    let a = pool.allocate(40 * MIB, 256, &s1).unwrap();
    pool.deallocate(a, 40 * MIB, 256, &s1).unwrap();
    // Best fit, split as an allocation splits.
    let b = pool.allocate_cached(30 * MIB, 256, &s1).unwrap();
    assert_eq!(b, Some(a));
    assert_eq!(
        layout(&pool),
        vec![(40 * MIB, vec![(30 * MIB, true), (10 * MIB, false)])]
    );
    assert_eq!(pool.allocate_cached(20 * MIB, 256, &s1).unwrap(), None);
    assert_eq!(
        pool.allocate_cached(MIB, 256, &s1).unwrap(),
        None,
        "a small request takes no large block"
    );
    assert_eq!(
        pool.allocate_cached(5 * MIB, 256, &s2).unwrap(),
        None,
        "another stream's segment"
    );
    assert_eq!(pool.allocate_cached(0, 256, &s1).unwrap(), None);
    assert_eq!(pool.segments().len(), 1);
    pool.deallocate(b.unwrap(), 30 * MIB, 256, &s1).unwrap();
    check_segments(&pool.segments(), &pool.stats());
}

#[test]
fn a_segment_serves_only_the_stream_it_was_made_for() {
    let (pool, s1, s2) = pool();
    let a = pool.allocate(1000, 256, &s1).unwrap();
    pool.deallocate(a, 1000, 256, &s1).unwrap();
    let b = pool.allocate(1000, 256, &s2).unwrap();
    assert_ne!(a, b, "s2 does not take s1's memory");
    assert_eq!(pool.segments().len(), 2);
    let c = pool.allocate(1000, 256, &s1).unwrap();
    assert_eq!(a, c, "s1 reuses its own");
    // A free naming another stream leaves the block in its segment's stream.
    pool.deallocate(c, 1000, 256, &s2).unwrap();
    assert_eq!(pool.allocate(1000, 256, &s1).unwrap(), a);
}

#[test]
fn bad_frees_are_refused_and_change_nothing() {
    let (pool, s, _) = pool();
    let a = pool.allocate(3000, 256, &s).unwrap();
    let before = (pool.segments(), pool.stats());
    let refused = |p: DevicePtr, n: usize| match pool.deallocate(p, n, 256, &s) {
        Err(Error::InvalidFree { reason, .. }) => reason,
        other => panic!("free of {p:?} ({n} bytes) not refused: {other:?}"),
    };
    assert_eq!(
        refused(DevicePtr(a.0 + 512), 512),
        FreeError::Unknown,
        "interior"
    );
    assert_eq!(refused(DevicePtr(0x10), 8), FreeError::Unknown, "foreign");
    assert!(matches!(
        refused(a, 5000),
        FreeError::SizeMismatch {
            allocated: 3000,
            freed: 5000
        }
    ));
    assert_eq!((pool.segments(), pool.stats()), before);
    // A size rounding as the request did is the same size.
    pool.deallocate(a, 3071, 256, &s).unwrap();
    assert_eq!(refused(a, 3000), FreeError::DoubleFree);
    assert!(matches!(
        pool.allocate(8, 512, &s),
        Err(Error::AlignmentTooLarge { .. })
    ));
    assert_eq!(pool.allocate(0, 256, &s).unwrap(), DevicePtr::NULL);
}

#[test]
fn a_checkpoint_puts_the_layout_back_exactly() {
    let (pool, s, _) = pool();
    let a = pool.allocate(1024, 256, &s).unwrap();
    let b = pool.allocate(2048, 256, &s).unwrap();
    let big = pool.allocate(4 * MIB, 256, &s).unwrap();
    let saved = pool.checkpoint();
    let saved_layout = layout(&pool);
    // Since the checkpoint: `a` and `big` freed, new blocks in their places
    // and a new segment.
    pool.deallocate(a, 1024, 256, &s).unwrap();
    pool.deallocate(big, 4 * MIB, 256, &s).unwrap();
    let c = pool.allocate(512, 256, &s).unwrap();
    let d = pool.allocate(6 * MIB, 256, &s).unwrap();
    let e = pool.allocate(30 * MIB, 256, &s).unwrap();
    let r = pool.restore(&saved).unwrap();
    let mut freed = r.freed.clone();
    freed.sort();
    let mut want = vec![c, d, e];
    want.sort();
    assert_eq!(freed, want);
    // In no particular order: the driver decides which segment lies lower.
    let mut made: Vec<_> = r
        .made
        .iter()
        .map(|(blk, id)| (blk.address, blk.size, *id))
        .collect();
    made.sort();
    let mut want = vec![(a, 1024, s.raw()), (big, 4 * MIB, s.raw())];
    want.sort();
    assert_eq!(made, want);
    assert_eq!(pool.live_block_size(b), Some(2048), "kept as it was");
    // The checkpoint's segments exactly as saved; the new one stays, empty.
    assert!(has_segments_of(&pool.segments(), saved.segments()));
    let now = layout(&pool);
    assert_eq!(now.len(), saved_layout.len() + 1);
    assert_eq!(
        now.iter()
            .filter(|(_, b)| b.iter().any(|&(_, live)| live))
            .count(),
        2
    );
    check_segments(&pool.segments(), &pool.stats());
    // The blocks made again are ordinary live blocks.
    pool.deallocate(a, 1024, 256, &s).unwrap();
    pool.deallocate(big, 4 * MIB, 256, &s).unwrap();
    pool.deallocate(b, 2048, 256, &s).unwrap();
    assert_eq!(pool.live_count(), 0);
}

#[test]
fn a_checkpoint_of_another_pool_or_a_gone_segment_is_refused() {
    let (other, t, _) = pool();
    let (pool, s, _) = pool();
    let a = pool.allocate(100, 256, &s).unwrap();
    let x = other.allocate(100, 256, &t).unwrap();
    let foreign = other.checkpoint();
    assert!(pool.restore(&foreign).is_err());
    let saved = pool.checkpoint();
    pool.deallocate(a, 100, 256, &s).unwrap();
    pool.release_free_segments().unwrap();
    let before = pool.stats();
    assert!(pool.restore(&saved).is_err(), "its segment went back");
    assert_eq!(pool.stats(), before, "nothing changed");
    other.deallocate(x, 100, 256, &t).unwrap();
}

#[test]
fn the_drop_gives_every_segment_back() {
    let (device, sim) = Device::from_env(SimConfig::default()).unwrap();
    let Some(sim) = common::sim_only(sim, "the_drop_gives_every_segment_back") else {
        return;
    };
    let base = sim.device_bytes(0);
    let s = device.create_stream().unwrap();
    let pool = SegmentPool::new(DeviceResource::new(device.clone())).unwrap();
    pool.allocate(100, 256, &s).unwrap();
    pool.allocate(50 * MIB, 256, &s).unwrap();
    assert!(sim.device_bytes(0) > base);
    drop(pool);
    assert_eq!(sim.device_bytes(0), base);
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: usize, stream: usize },
    Free { pick: usize },
    BadFree { pick: usize, delta: usize },
    Checkpoint,
    Restore { pick: usize },
    ReleaseFree,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![
        1usize..4096,
        4096usize..(2 * MIB),
        (2 * MIB)..(12 * MIB),
        (12 * MIB)..(40 * MIB),
    ];
    prop_oneof![
        6 => (size, 0usize..2).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => (any::<usize>(), 1usize..1024).prop_map(|(pick, delta)| Op::BadFree { pick, delta }),
        1 => Just(Op::Checkpoint),
        1 => any::<usize>().prop_map(|pick| Op::Restore { pick }),
        1 => Just(Op::ReleaseFree),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The shared pool model: streams held and released, frees across
    /// streams, trims; no block overlaps another, no memory freed on a
    /// stream leaves before that stream's work ran, everything goes back.
    #[test]
    fn the_pool_keeps_stream_order(ops in proptest::collection::vec(common::model::op(24), 1..120)) {
        let (device, sim, streams, base) = common::model::model_setup();
        let pool = SegmentPool::new(DeviceResource::new(device.clone())).unwrap();
        common::model::run_model(pool, &sim, &streams, &ops)?;
        sim.complete_all();
        prop_assert_eq!(sim.device_bytes(0), base, "all memory back");
    }

    /// Any sequence of allocations, frees (good and bad), checkpoints,
    /// restores and releases against a model of the live blocks: the
    /// blocks tile their segments, the statistics match, the live blocks
    /// are the model's, and a restore makes them the checkpoint's.
    #[test]
    fn the_pool_follows_a_model(ops in proptest::collection::vec(op(), 1..80)) {
        let (pool, s0, s1) = pool();
        let streams = [s0, s1];
        // address -> (requested, stream index)
        let mut model: BTreeMap<u64, (usize, usize)> = BTreeMap::new();
        let mut saved = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { size, stream } => {
                    let p = pool.allocate(size, 256, &streams[stream]).unwrap();
                    prop_assert!(!model.contains_key(&p.0), "handed out twice");
                    model.insert(p.0, (size, stream));
                }
                Op::Free { pick } => {
                    if let Some((&p, &(size, stream))) = model.iter().nth(pick % model.len().max(1)) {
                        pool.deallocate(DevicePtr(p), size, 256, &streams[stream]).unwrap();
                        model.remove(&p);
                    }
                }
                Op::BadFree { pick, delta } => {
                    if let Some((&p, &(size, stream))) = model.iter().nth(pick % model.len().max(1)) {
                        let before = pool.stats();
                        let inside = p + 512 * delta as u64;
                        if !model.contains_key(&inside) {
                            prop_assert!(pool.deallocate(DevicePtr(inside), 512, 256, &streams[stream]).is_err());
                        }
                        prop_assert!(pool.deallocate(DevicePtr(p), size + 512 * delta, 256, &streams[stream]).is_err());
                        prop_assert_eq!(pool.stats().small.allocation.current + pool.stats().large.allocation.current,
                            before.small.allocation.current + before.large.allocation.current);
                    }
                }
                Op::Checkpoint => saved.push((pool.checkpoint(), model.clone())),
                Op::Restore { pick } => {
                    if saved.is_empty() {
                        continue;
                    }
                    let (cp, then) = &saved[pick % saved.len()];
                    match pool.restore(cp) {
                        Ok(r) => {
                            for p in &r.freed {
                                prop_assert!(model.remove(&p.0).is_some(), "freed a live block");
                                // A block of the checkpoint's is freed only
                                // to be made again (it had another size).
                                prop_assert!(!then.contains_key(&p.0) || r.made.iter().any(|(b, _)| b.address == *p));
                            }
                            for (b, _) in &r.made {
                                prop_assert!(then.contains_key(&b.address.0), "made a block of the checkpoint");
                                model.insert(b.address.0, then[&b.address.0]);
                            }
                            let live: Vec<u64> = model.keys().copied().collect();
                            let want: Vec<u64> = then.keys().copied().collect();
                            prop_assert_eq!(live, want, "the checkpoint's live blocks");
                            prop_assert!(has_segments_of(&pool.segments(), cp.segments()), "the checkpoint's layout");
                        }
                        Err(_) => {
                            // Only when a segment of it went back (or another
                            // took its place).
                            let now: Vec<_> = pool.segments().iter().map(|s| (s.address, s.size, s.stream)).collect();
                            prop_assert!(cp.segments().iter().any(|s| !now.contains(&(s.address, s.size, s.stream))));
                        }
                    }
                }
                Op::ReleaseFree => {
                    pool.release_free_segments().unwrap();
                }
            }
            check_segments(&pool.segments(), &pool.stats());
            let live: Vec<u64> = pool.live_blocks().iter().map(|(b, _)| b.address.0).collect();
            let want: Vec<u64> = model.keys().copied().collect();
            prop_assert_eq!(live, want);
        }
    }
}
