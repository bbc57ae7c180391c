//! Unit tests of `LaneHeap`: splitting, merging, alignment, lanes, regions, errors.

use super::*;

const G: LaneId = LaneId::GLOBAL;
const MIB: u64 = 1 << 20;

fn heap_with(base: u64, size: u64) -> (LaneHeap, RegionId) {
    let mut h = LaneHeap::new();
    let r = h.add_region(base, size).unwrap();
    (h, r)
}

fn layout(h: &LaneHeap, r: RegionId) -> Vec<(u64, u64, BlockState)> {
    h.region_blocks(r)
        .map(|(_, b)| (b.addr(), b.size(), b.state()))
        .collect()
}

const FREE_G: BlockState = BlockState::Free { lane: G };

#[test]
fn allocate_splits_and_free_merges_back() {
    let (mut h, r) = heap_with(0x10000, MIB);
    let a = h.allocate(G, 1000, 1).unwrap();
    assert_eq!((a.addr, a.size), (0x10000, 1024));
    assert_eq!(
        layout(&h, r),
        vec![
            (0x10000, 1024, BlockState::Used),
            (0x10400, MIB - 1024, FREE_G)
        ]
    );
    assert_eq!(h.used_bytes(), 1024);
    assert_eq!(h.lane_free_bytes(G), MIB - 1024);
    h.check_invariants().unwrap();
    assert_eq!(h.free(a.addr, G), Ok(1024));
    assert_eq!(layout(&h, r), vec![(0x10000, MIB, FREE_G)]);
    assert!(h.region_is_free(r));
    h.check_invariants().unwrap();
}

#[test]
fn zero_and_tiny_requests_take_one_granule() {
    let (mut h, _) = heap_with(0, MIB);
    assert_eq!(
        h.allocate(G, 0, 0).map(|a| a.size),
        None,
        "align 0 is not a power of two"
    );
    assert_eq!(h.allocate(G, 0, 1).unwrap().size, 256);
    assert_eq!(h.allocate(G, 1, 8).unwrap().size, 256);
    h.check_invariants().unwrap();
}

#[test]
fn exact_fit_takes_the_whole_block() {
    let (mut h, r) = heap_with(0, MIB);
    let a = h.allocate(G, MIB, 256).unwrap();
    assert_eq!((a.addr, a.size), (0, MIB));
    assert_eq!(h.lane_block_count(G), 0);
    assert!(h.allocate(G, 256, 256).is_none());
    h.free(0, G).unwrap();
    assert!(h.region_is_free(r));
}

#[test]
fn min_split_leaves_small_remainders_inside() {
    let mut h = LaneHeap::with_min_split(4096);
    h.add_region(0, 8192).unwrap();
    let a = h.allocate(G, 5000, 256).unwrap();
    assert_eq!(a.size, 8192, "remainder of 3072 < 4096 stays in the block");
    h.free(a.addr, G).unwrap();
    let a = h.allocate(G, 4096, 256).unwrap();
    assert_eq!(a.size, 4096);
    h.check_invariants().unwrap();
}

/// Four blocks A B C D; frees of B and C under every free/used neighbour setup.
#[test]
fn coalesce_in_all_four_neighbour_configurations() {
    for (free_prev, free_next) in [(false, false), (true, false), (false, true), (true, true)] {
        let (mut h, r) = heap_with(0, 4 * 4096);
        let blocks: Vec<_> = (0..4)
            .map(|_| h.allocate(G, 4096, 256).unwrap().addr)
            .collect();
        assert_eq!(blocks, vec![0, 4096, 8192, 12288]);
        // Target is block 1 (prev = 0, next = 2).
        if free_prev {
            h.free(blocks[0], G).unwrap();
        }
        if free_next {
            h.free(blocks[2], G).unwrap();
        }
        h.free(blocks[1], G).unwrap();
        h.check_invariants().unwrap();
        let start = if free_prev { 0 } else { 4096 };
        let end = if free_next { 12288 } else { 8192 };
        let l = layout(&h, r);
        assert!(
            l.contains(&(start, end - start, FREE_G)),
            "{free_prev} {free_next}: {l:?}"
        );
        assert_eq!(h.lane_block_count(G), 1);
    }
}

#[test]
fn alignment_padding_is_split_off_and_stays_free() {
    let (mut h, r) = heap_with(0x100, MIB);
    let a = h.allocate(G, 256, 4096).unwrap();
    assert_eq!(a.addr, 0x1000);
    assert_eq!(a.size, 256);
    assert_eq!(
        layout(&h, r),
        vec![
            (0x100, 0xF00, FREE_G),
            (0x1000, 256, BlockState::Used),
            (0x1100, MIB - 0x1000, FREE_G)
        ]
    );
    // The padding serves a later small request.
    let b = h.allocate(G, 0xF00, 256).unwrap();
    assert_eq!(b.addr, 0x100);
    // Large alignments.
    let c = h.allocate(G, 300, 1 << 16).unwrap();
    assert_eq!(c.addr % (1 << 16), 0);
    h.check_invariants().unwrap();
    for x in [a.addr, b.addr, c.addr] {
        h.free(x, G).unwrap();
    }
    assert!(h.region_is_free(r));
    assert!(h.allocate(G, 256, 3 << 8).is_none(), "not a power of two");
    assert!(h.allocate(G, 256, 1 << 40).is_none(), "cannot fit");
}

#[test]
fn huge_requests_fail_cleanly() {
    let (mut h, _) = heap_with(0, MIB);
    assert!(h.allocate(G, 1 << 63, 256).is_none());
    assert!(h.allocate(G, u64::MAX, 256).is_none());
    assert!(h.allocate(G, 1 << 50, 256).is_none());
    assert!(h.allocate(G, 256, 1 << 63).is_none());
    assert!(h.allocate(G, 1 << 62, 1 << 62).is_none());
    h.check_invariants().unwrap();
    assert_eq!(h.used_blocks(), 0);
}

#[test]
fn region_at_the_top_of_the_address_space() {
    let mut h = LaneHeap::new();
    let base = u64::MAX - 255 - MIB; // ends at 2^64 - 256, the highest end allowed
    assert_eq!(base % 256, 0);
    let r = h.add_region(base, MIB).unwrap();
    let a = h.allocate(G, 256, 1 << 19).unwrap();
    assert_eq!(a.addr % (1 << 19), 0);
    let b = h.allocate(G, MIB / 4, 256).unwrap();
    h.free(a.addr, G).unwrap();
    h.free(b.addr, G).unwrap();
    assert!(h.region_is_free(r));
    // An end of 2^64 is not representable: refused.
    assert!(matches!(
        h.add_region(u64::MAX - 255, 256),
        Err(HeapError::BadRegion { .. })
    ));
}

#[test]
fn lanes_do_not_merge_across_and_move_lane_merges() {
    let (mut h, r) = heap_with(0, 3 * 4096);
    let s = h.create_lane().unwrap();
    let t = h.create_lane().unwrap();
    let a: Vec<_> = (0..3)
        .map(|_| h.allocate(G, 4096, 256).unwrap().addr)
        .collect();
    h.free(a[0], s).unwrap();
    h.free(a[1], t).unwrap();
    h.free(a[2], s).unwrap();
    h.check_invariants().unwrap();
    assert_eq!(h.lane_block_count(s), 2, "not merged across lane t");
    assert_eq!(h.lane_free_bytes(s), 8192);
    assert_eq!(h.lane_free_bytes(t), 4096);
    assert_eq!(h.largest_free(t), 4096);
    // Allocation from a lane only sees that lane.
    assert!(h.allocate(G, 256, 256).is_none());
    assert!(h.allocate(t, 8192, 256).is_none());
    assert!(!h.region_is_free(r));
    assert_eq!(h.drop_lane(s), Err(HeapError::LaneNotEmpty(s)));
    h.move_lane(t, s).unwrap();
    assert_eq!(h.lane_block_count(s), 1);
    assert_eq!(h.largest_free(s), 3 * 4096);
    assert_eq!(
        h.remove_region(r),
        Err(HeapError::RegionNotFree(r)),
        "free, but not global"
    );
    h.move_lane(s, G).unwrap();
    h.check_invariants().unwrap();
    assert!(h.region_is_free(r));
    h.drop_lane(s).unwrap();
    h.drop_lane(t).unwrap();
    assert_eq!(h.drop_lane(G), Err(HeapError::GlobalLane));
    assert_eq!(h.drop_lane(s), Err(HeapError::NoSuchLane(s)));
    assert_eq!(h.create_lane(), Ok(t), "dropped lane numbers are reused");
}

#[test]
fn move_block_moves_one_block() {
    let (mut h, r) = heap_with(0, 3 * 4096);
    let s = h.create_lane().unwrap();
    let a: Vec<_> = (0..3).map(|_| h.allocate(G, 4096, 256).unwrap()).collect();
    h.free(a[0].addr, s).unwrap();
    h.free(a[1].addr, G).unwrap();
    assert_eq!(
        h.move_block(a[2].block, G),
        Err(HeapError::BlockNotFree(a[2].block))
    );
    let b = h.used_block(0).is_none();
    assert!(b);
    let blk = h.region_blocks(r).next().unwrap().0;
    let merged = h.move_block(blk, G).unwrap();
    assert_eq!(h.block(merged).unwrap().size(), 8192);
    assert_eq!(h.lane_block_count(s), 0);
    h.check_invariants().unwrap();
}

#[test]
fn bad_frees_are_errors_and_change_nothing() {
    let (mut h, _) = heap_with(0x10000, MIB);
    let a = h.allocate(G, 4096, 256).unwrap();
    let _b = h.allocate(G, 4096, 256).unwrap();
    let before = h.stats();
    assert_eq!(
        h.free(a.addr + 256, G),
        Err(HeapError::UnknownAddress(a.addr + 256))
    );
    assert_eq!(h.free(0, G), Err(HeapError::UnknownAddress(0)));
    assert_eq!(
        h.free(a.addr, LaneId(77)),
        Err(HeapError::NoSuchLane(LaneId(77)))
    );
    assert_eq!(h.stats(), before);
    h.free(a.addr, G).unwrap();
    let before = h.stats();
    assert_eq!(h.free(a.addr, G), Err(HeapError::DoubleFree(a.addr)));
    assert_eq!(
        HeapError::DoubleFree(1).free_reason(),
        Some(crate::FreeError::DoubleFree)
    );
    assert_eq!(
        HeapError::UnknownAddress(1).free_reason(),
        Some(crate::FreeError::Unknown)
    );
    // Start of the merged free tail: also a free block start.
    let tail = a.addr + 8192;
    assert_eq!(h.free(tail, G), Err(HeapError::DoubleFree(tail)));
    assert_eq!(h.stats(), before);
    h.check_invariants().unwrap();
}

#[test]
fn check_free_sized_answers_as_free_sized_and_changes_nothing() {
    let (mut h, _) = heap_with(0x10000, MIB);
    let a = h.allocate(G, 1000, 256).unwrap();
    let b = h.allocate(G, 4096, 256).unwrap();
    h.free(b.addr, G).unwrap();
    let cases = [
        (a.addr, 1000),
        (a.addr, 1001),
        (a.addr, 40_000),
        (a.addr, 0),
        (a.addr + 256, 256),
        (b.addr, 4096),
        (0, 4096),
    ];
    for (addr, bytes) in cases {
        let before = h.stats();
        let checked = h.check_free_sized(addr, bytes);
        assert_eq!(
            h.stats(),
            before,
            "{addr:#x} as {bytes}: the check changed the heap"
        );
        let mut copy = h.clone();
        assert_eq!(
            checked,
            copy.free_sized(addr, G, bytes),
            "{addr:#x} as {bytes}"
        );
    }
    assert_eq!(h.check_free_sized(a.addr, 1000), Ok(1024));
    h.check_invariants().unwrap();
}

#[test]
fn region_rules() {
    let mut h = LaneHeap::new();
    assert!(matches!(
        h.add_region(100, 4096),
        Err(HeapError::BadRegion { .. })
    ));
    assert!(matches!(
        h.add_region(0, 100),
        Err(HeapError::BadRegion { .. })
    ));
    assert!(matches!(
        h.add_region(0, 0),
        Err(HeapError::BadRegion { .. })
    ));
    assert!(matches!(
        h.add_region(u64::MAX - 255, 512),
        Err(HeapError::BadRegion { .. })
    ));
    let r1 = h.add_region(MIB, MIB).unwrap();
    assert!(matches!(
        h.add_region(MIB + 4096, 256),
        Err(HeapError::RegionOverlap { .. })
    ));
    assert!(matches!(
        h.add_region(0, MIB + 256),
        Err(HeapError::RegionOverlap { .. })
    ));
    let r0 = h.add_region(0, MIB).unwrap();
    let r2 = h.add_region(2 * MIB, MIB).unwrap();
    assert_eq!(h.region_bytes(), 3 * MIB);
    assert_eq!(h.region_of(MIB + 5), Some(r1));
    assert_eq!(h.region_of(3 * MIB), None);
    let a = h.allocate(G, MIB, 256).unwrap();
    let owner = h.region_of(a.addr).unwrap();
    assert_eq!(h.remove_region(owner), Err(HeapError::RegionNotFree(owner)));
    assert_eq!(h.free_regions().count(), 2);
    h.free(a.addr, G).unwrap();
    assert_eq!(h.free_regions().count(), 3);
    assert_eq!(h.remove_region(r1), Ok((MIB, MIB)));
    assert_eq!(h.remove_region(r1), Err(HeapError::NoSuchRegion(r1)));
    assert!(!h.region_is_free(r1));
    // The slot is reused with a new generation: the stale id stays dead.
    let r3 = h.add_region(MIB, MIB).unwrap();
    assert_eq!(r3.index(), r1.index());
    assert_ne!(r3, r1);
    assert_eq!(h.remove_region(r1), Err(HeapError::NoSuchRegion(r1)));
    for r in [r0, r2, r3] {
        h.remove_region(r).unwrap();
    }
    assert_eq!(
        h.stats(),
        HeapStats {
            lanes: 1,
            ..HeapStats::default()
        }
    );
    h.check_invariants().unwrap();
}

#[test]
fn blocks_never_cross_regions() {
    let mut h = LaneHeap::new();
    h.add_region(0, 4096).unwrap();
    h.add_region(4096, 4096).unwrap();
    assert!(
        h.allocate(G, 8192, 256).is_none(),
        "adjacent regions are not merged"
    );
    assert!(h.allocate(G, 4096, 256).is_some());
    assert!(h.allocate(G, 4096, 256).is_some());
    h.check_invariants().unwrap();
}

#[test]
fn stats_add_up() {
    let (mut h, _) = heap_with(0, 16 * MIB);
    let s = h.create_lane().unwrap();
    let a = h.allocate(G, MIB, 256).unwrap();
    let b = h.allocate(G, 3 * MIB, 256).unwrap();
    h.free(a.addr, s).unwrap();
    let st = h.stats();
    assert_eq!(st.used_bytes, 3 * MIB);
    assert_eq!(st.used_blocks, 1);
    assert_eq!(st.free_bytes, 13 * MIB);
    assert_eq!(st.free_blocks, 2);
    assert_eq!(st.largest_free, 12 * MIB);
    assert_eq!(st.lanes, 2);
    assert_eq!(st.region_bytes, 16 * MIB);
    assert_eq!(h.largest_free(s), MIB);
    assert_eq!(h.used_block(b.addr), Some(b.block));
    assert_eq!(h.lanes().collect::<Vec<_>>(), vec![G, s]);
}

#[test]
fn free_absorbing_takes_global_neighbours_into_the_lane() {
    let (mut h, r) = heap_with(0, 16 * MIB);
    let s = h.create_lane().unwrap();
    let a = h.allocate(G, MIB, 256).unwrap();
    let b = h.allocate(G, MIB, 256).unwrap();
    // Plain free: b stays apart from the global tail beside it.
    assert_eq!(h.free(b.addr, s), Ok(MIB));
    assert_eq!(layout(&h, r).len(), 3);
    let c = h.allocate(s, MIB, 256).unwrap();
    assert_eq!(c.addr, b.addr);
    // Absorbing free: b's space and the tail become one block of lane s.
    assert_eq!(h.free_absorbing(c.addr, s), Ok(MIB));
    let free_s = BlockState::Free { lane: s };
    assert_eq!(
        layout(&h, r),
        vec![(0, MIB, BlockState::Used), (MIB, 15 * MIB, free_s)]
    );
    assert_eq!(h.lane_free_bytes(G), 0);
    h.check_invariants().unwrap();
    // Both sides at once, and errors change nothing.
    assert!(h.free_absorbing(0x100, s).is_err());
    h.move_lane(s, G).unwrap();
    assert_eq!(h.free_absorbing(a.addr, s), Ok(MIB));
    assert_eq!(layout(&h, r), vec![(0, 16 * MIB, free_s)]);
    h.check_invariants().unwrap();
    // The global lane itself: a plain free.
    let d = h.allocate(s, MIB, 256).unwrap();
    assert_eq!(h.free_absorbing(d.addr, G), Ok(MIB));
    h.check_invariants().unwrap();
}

#[test]
fn absorb_global_joins_a_lanes_blocks_with_the_global_space_beside_them() {
    let (mut h, r) = heap_with(0, 16 * MIB);
    let s = h.create_lane().unwrap();
    let a = h.allocate(G, 4 * MIB, 256).unwrap();
    let _b = h.allocate(G, MIB, 256).unwrap();
    h.free(a.addr, s).unwrap();
    // 4 MiB free in lane s, 11 MiB in the global lane: 8 MiB fits neither.
    assert!(h.allocate_best(s, 8 * MIB, 256).is_none());
    assert!(!h.absorb_global(G), "the global lane cannot absorb itself");
    assert!(h.absorb_global(s));
    assert_eq!(h.lane_free_bytes(G), 0);
    assert_eq!(h.lane_free_bytes(s), 15 * MIB);
    assert!(!h.absorb_global(s), "nothing left to absorb");
    h.check_invariants().unwrap();
    // Lane s's block and its neighbours: one free range each side of b.
    let c = h.allocate_best(s, 8 * MIB, 256).unwrap();
    assert_eq!(c.addr, 5 * MIB, "the tail, now lane s's");
    let free_s = BlockState::Free { lane: s };
    assert_eq!(layout(&h, r)[0], (0, 4 * MIB, free_s));
    assert!(!h.absorb_global(LaneId(99)), "no such lane");
}

#[test]
fn allocate_best_reuses_a_block_of_its_own_size_first() {
    let (mut h, _) = heap_with(0, 64 * MIB);
    // A freed block of 3 MiB + 256 (its class rounds down) and a huge tail.
    let a = h.allocate(G, 3 * MIB + 256, 256).unwrap();
    let _pin = h.allocate(G, 256, 256).unwrap();
    h.free(a.addr, G).unwrap();
    // Good fit rounds the request up and splits the tail instead ...
    let mut h2 = h.clone();
    let x = h2.allocate(G, 3 * MIB + 256, 256).unwrap();
    assert_ne!(x.addr, a.addr);
    // ... best fit finds the freed block of the same size.
    let y = h.allocate_best(G, 3 * MIB + 256, 256).unwrap();
    assert_eq!(y.addr, a.addr);
    h.check_invariants().unwrap();
}

#[test]
fn allocate_from_carves_a_range_out_of_a_free_block() {
    let (mut h, r) = heap_with(0, 16 * MIB);
    let s = h.create_lane().unwrap();
    let a = h.allocate(G, MIB, 256).unwrap();
    h.free(a.addr, s).unwrap();
    let blocks = h.free_blocks_at_least(G, 4 * MIB, 8);
    assert_eq!(blocks.len(), 1);
    let (id, addr, size) = blocks[0];
    assert_eq!((addr, size), (MIB, 15 * MIB));
    assert!(h.free_blocks_at_least(G, 16 * MIB, 8).is_empty());
    assert_eq!(h.free_blocks_at_least(s, 1, 8).len(), 1);
    // Outside the block, or not 256-aligned: nothing changes.
    assert!(h.allocate_from(id, 0, MIB).is_none());
    assert!(h.allocate_from(id, 15 * MIB + 256, MIB).is_none());
    assert!(h.allocate_from(id, 2 * MIB + 1, 1000).is_none());
    h.check_invariants().unwrap();
    // In the middle: free space stays on both sides, in the block's lane.
    let b = h.allocate_from(id, 4 * MIB, 1000).unwrap();
    assert_eq!((b.addr, b.size), (4 * MIB, 1024));
    assert_eq!(
        layout(&h, r),
        vec![
            (0, MIB, BlockState::Free { lane: s }),
            (MIB, 3 * MIB, FREE_G),
            (4 * MIB, 1024, BlockState::Used),
            (4 * MIB + 1024, 12 * MIB - 1024, FREE_G),
        ]
    );
    h.check_invariants().unwrap();
    assert_eq!(h.free(b.addr, G), Ok(1024));
    h.check_invariants().unwrap();
}

#[test]
fn a_sized_free_must_name_the_blocks_granules() {
    let (mut h, r) = heap_with(0x10000, MIB);
    let a = h.allocate(G, 1000, 1).unwrap();
    let lane = h.create_lane().unwrap();
    let before = layout(&h, r);
    for wrong in [0, 768, 1025, 40_000, u64::MAX] {
        assert_eq!(
            h.free_sized(a.addr, lane, wrong),
            Err(HeapError::SizeMismatch {
                addr: a.addr,
                block: 1024,
                freed: wrong
            }),
            "{wrong}"
        );
        assert_eq!(
            h.free_absorbing_sized(a.addr, lane, wrong).unwrap_err(),
            HeapError::SizeMismatch {
                addr: a.addr,
                block: 1024,
                freed: wrong
            }
        );
        assert_eq!(layout(&h, r), before, "nothing changed");
        assert_eq!(h.used_bytes(), 1024);
    }
    assert_eq!(
        HeapError::SizeMismatch {
            addr: a.addr,
            block: 1024,
            freed: 40_000
        }
        .free_reason(),
        Some(crate::FreeError::SizeMismatch {
            allocated: 1024,
            freed: 40_000
        })
    );
    // Any size in the block's granules is the block.
    assert_eq!(h.free_sized(a.addr, lane, 1001), Ok(1024));
    assert_eq!(
        h.free_sized(a.addr, lane, 1000),
        Err(HeapError::DoubleFree(a.addr))
    );
    let b = h.allocate(G, 4096, 1).unwrap();
    assert_eq!(h.free_absorbing_sized(b.addr, lane, 3841), Ok(4096));
    h.check_invariants().unwrap();
}

#[test]
fn a_used_block_keeps_its_tag_and_a_reused_one_starts_untagged() {
    let (mut h, _) = heap_with(0, MIB);
    let a = h.allocate(G, 4096, 256).unwrap();
    let b = h.allocate(G, 4096, 256).unwrap();
    assert_eq!(
        h.used_tag(a.addr),
        Some(0),
        "every used block starts with 0"
    );
    h.set_tag(a.block, 7);
    assert_eq!((h.used_tag(a.addr), h.used_tag(b.addr)), (Some(7), Some(0)));
    assert_eq!(h.tagged_ranges(7).collect::<Vec<_>>(), vec![(a.addr, 4096)]);
    h.check_invariants().unwrap();
    // Freed (its entry then links a free list) and handed out again: no tag.
    h.free(a.addr, G).unwrap();
    assert_eq!(h.used_tag(a.addr), None);
    let c = h.allocate(G, 4096, 256).unwrap();
    assert_eq!(c.addr, a.addr);
    assert_eq!(h.used_tag(c.addr), Some(0));
    assert_eq!(h.tagged_ranges(7).count(), 0);
    // A free block is not tagged.
    let free = h.free_blocks_at_least(G, 256, 1)[0].0;
    h.set_tag(free, 9);
    h.check_invariants().unwrap();
    assert_eq!(h.tagged_ranges(9).count(), 0);
}

#[test]
fn a_region_grows_and_shrinks_at_its_end() {
    let (mut h, r) = heap_with(0, MIB);
    let s = h.create_lane().unwrap();
    let a = h.allocate(G, MIB / 2, 256).unwrap();
    // The free half at the end merges with the extension: one block of 1.5 MiB.
    h.extend_region(r, MIB).unwrap();
    let (_, tail) = h.region_tail(r).unwrap();
    assert_eq!((tail.addr(), tail.end()), (MIB / 2, 2 * MIB));
    assert_eq!(h.largest_free(G), 3 * MIB / 2);
    assert_eq!(h.stats().region_bytes, 2 * MIB);
    // A block across the old end.
    let b = h.allocate(G, MIB, 256).unwrap();
    assert_eq!(b.addr, MIB / 2);
    h.check_invariants().unwrap();
    // Nothing free at the end: no shrink, nothing changes.
    assert_eq!(h.shrink_region(r, MIB), Err(HeapError::RegionNotFree(r)));
    // Free in a stream's lane is not free for everyone: no shrink either.
    h.free(b.addr, s).unwrap();
    assert_eq!(h.shrink_region(r, MIB), Err(HeapError::RegionNotFree(r)));
    h.move_lane(s, G).unwrap();
    assert_eq!(h.shrink_region(r, MIB), Ok(MIB));
    let (_, tail) = h.region_tail(r).unwrap();
    assert_eq!((tail.addr(), tail.end()), (MIB / 2, MIB));
    // Cut at a block's start: the whole block goes.
    assert_eq!(h.shrink_region(r, MIB / 2), Ok(MIB / 2));
    assert_eq!(h.region_tail(r).unwrap().0, a.block);
    assert_eq!(h.stats().region_bytes, MIB / 2);
    // Bad sizes and neighbours are refused.
    assert!(matches!(
        h.shrink_region(r, MIB / 2),
        Err(HeapError::BadRegion { .. })
    ));
    assert!(matches!(
        h.extend_region(r, 100),
        Err(HeapError::BadRegion { .. })
    ));
    h.add_region(MIB, MIB).unwrap();
    assert_eq!(
        h.extend_region(r, MIB),
        Err(HeapError::RegionOverlap {
            base: MIB / 2,
            size: MIB
        })
    );
    h.extend_region(r, MIB / 2).unwrap();
    h.check_invariants().unwrap();
}

#[test]
fn split_region_cuts_free_blocks_and_moves_the_blocks_past_the_cut() {
    let (mut h, r) = heap_with(0, 4 * MIB);
    let s = h.create_lane().unwrap();
    let a = h.allocate(G, MIB, 256).unwrap();
    let b = h.allocate(G, MIB, 256).unwrap();
    let c = h.allocate(G, MIB, 256).unwrap();
    h.free(b.addr, s).unwrap();
    // Inside a used block: refused, nothing changes.
    assert_eq!(h.split_region(r, MIB / 2), Err(HeapError::RegionNotFree(r)));
    assert!(matches!(
        h.split_region(r, 0),
        Err(HeapError::BadRegion { .. })
    ));
    assert!(matches!(
        h.split_region(r, 4 * MIB),
        Err(HeapError::BadRegion { .. })
    ));
    // Inside b, free in lane s: two free blocks of s, one each side.
    let t = h.split_region(r, MIB + MIB / 2).unwrap();
    assert_eq!(
        layout(&h, r),
        vec![
            (0, MIB, BlockState::Used),
            (MIB, MIB / 2, BlockState::Free { lane: s })
        ]
    );
    assert_eq!(
        layout(&h, t),
        vec![
            (MIB + MIB / 2, MIB / 2, BlockState::Free { lane: s }),
            (2 * MIB, MIB, BlockState::Used),
            (3 * MIB, MIB, FREE_G),
        ]
    );
    assert_eq!(h.region_of(2 * MIB), Some(t));
    assert_eq!(h.region_tail(r).unwrap().1.end(), MIB + MIB / 2);
    h.check_invariants().unwrap();
    // At an edge between blocks: no block splits; c's free still finds it.
    let u = h.split_region(t, 2 * MIB).unwrap();
    assert_eq!(layout(&h, u)[0], (2 * MIB, MIB, BlockState::Used));
    h.free(c.addr, G).unwrap();
    assert!(h.region_is_free(u));
    assert_eq!(h.remove_region(u), Ok((2 * MIB, 2 * MIB)));
    h.move_lane(s, G).unwrap();
    assert_eq!(h.remove_region(t), Ok((MIB + MIB / 2, MIB / 2)));
    h.free(a.addr, G).unwrap();
    assert_eq!(h.remove_region(r), Ok((0, MIB + MIB / 2)));
    assert_eq!(h.stats().region_bytes, 0);
    h.check_invariants().unwrap();
}
