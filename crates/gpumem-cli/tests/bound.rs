//! `gpumem bound`'s packings: valid (no two blocks live at once share a
//! byte), never below the live peak, and the same placements as a plain
//! scan over every block placed, on logs made up at random.

use gpumem_cli::bound::{self, Fit, Life, Order, ORDERS};
use gpumem_cli::replay::{prepare, PreparedReplay};
use proptest::prelude::*;

/// An RMM log of `(allocate?, pointer, size)` rows on one stream.
fn log(rows: &[(bool, u64, usize)]) -> String {
    let mut s = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for (i, &(alloc, ptr, size)) in rows.iter().enumerate() {
        let action = if alloc { "allocate" } else { "free" };
        s += &format!("1,00:00:00.{:06},{action},{ptr:#x},{size},0x0\n", i + 1);
    }
    s
}

fn prepared(rows: &[(bool, u64, usize)]) -> PreparedReplay {
    let events = gpumem::trace::parse_str(&log(rows)).expect("a valid log");
    prepare(&events).expect("something to replay")
}

/// The packing without the index: every block placed so far is looked at.
fn naive(lives: &[Life], order_idx: &[usize], fit: Fit) -> Vec<u64> {
    let mut offsets = vec![0u64; lives.len()];
    let mut placed: Vec<usize> = Vec::new();
    for &i in order_idx {
        let b = &lives[i];
        let mut taken: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| lives[j].overlaps(b))
            .map(|&j| (offsets[j], offsets[j] + lives[j].size))
            .collect();
        taken.sort_unstable();
        let mut end = 0;
        let mut best: Option<(u64, u64)> = None;
        for (lo, hi) in taken {
            if lo >= end + b.size {
                let cand = (lo - end, end);
                match fit {
                    Fit::First => {
                        best.get_or_insert(cand);
                    }
                    Fit::Best => {
                        if best.is_none_or(|g| cand.0 < g.0) {
                            best = Some(cand);
                        }
                    }
                }
            }
            end = end.max(hi);
        }
        offsets[i] = best.map_or(end, |(_, o)| o);
        placed.push(i);
    }
    offsets
}

#[test]
fn a_block_too_large_for_the_hole_costs_the_log_order_and_not_the_planner() {
    // A and B live together, A goes, then C (twice A's size) comes while B
    // lives: in the log's order C cannot use A's place; largest first puts
    // C down first and A beside it.
    let p = prepared(&[
        (true, 0x1000, 1024),
        (true, 0x2000, 1024),
        (false, 0x1000, 1024),
        (true, 0x3000, 2048),
        (false, 0x2000, 1024),
        (false, 0x3000, 2048),
    ]);
    let mut heard = 0;
    let records = bound::bound("tiny", &p, |_| heard += 1);
    assert_eq!(heard, 8);
    assert_eq!(records.len(), 8);
    for r in &records {
        assert_eq!(r.peak_live, 3072);
        assert_eq!(r.blocks, 3);
        let want = if r.order == Order::LogOrder {
            4096
        } else {
            3072
        };
        assert_eq!(r.high_water, want, "{:?} {:?}", r.order, r.fit);
        assert!((r.ratio - want as f64 / 3072.0).abs() < 1e-12);
    }
}

#[test]
fn sizes_round_to_granules_and_blocks_never_freed_live_to_the_end() {
    let p = prepared(&[(true, 0x1000, 1), (true, 0x2000, 300), (false, 0x1000, 1)]);
    let lives = bound::lives(&p);
    assert_eq!(
        lives,
        vec![
            Life {
                start: 0,
                end: 2,
                size: 256
            },
            Life {
                start: 1,
                end: 3,
                size: 512
            },
        ]
    );
    assert_eq!(bound::live_peak(&lives), 768);
}

#[test]
fn a_pointer_handed_out_twice_keeps_the_first_block_to_the_end() {
    let p = prepared(&[
        (true, 0x1000, 256),
        (true, 0x1000, 512),
        (false, 0x1000, 512),
    ]);
    let mut lives = bound::lives(&p);
    lives.sort_by_key(|b| b.start);
    assert_eq!(lives.len(), 2);
    assert_eq!((lives[0].start, lives[0].end, lives[0].size), (0, 3, 256));
    assert_eq!((lives[1].start, lives[1].end, lives[1].size), (1, 2, 512));
}

/// Random logs: allocations of 1 byte to 8 KiB, each live block freed at
/// a random later step or never.
fn logs() -> impl Strategy<Value = Vec<(bool, u64, usize)>> {
    prop::collection::vec(
        (any::<bool>(), 1usize..8192, any::<prop::sample::Index>()),
        1..60,
    )
    .prop_map(|steps| {
        let (mut rows, mut live, mut next) = (Vec::new(), Vec::<(u64, usize)>::new(), 1u64);
        for (free, size, pick) in steps {
            if free && !live.is_empty() {
                let (ptr, size) = live.swap_remove(pick.index(live.len()));
                rows.push((false, ptr, size));
            } else {
                rows.push((true, next << 20, size));
                live.push((next << 20, size));
                next += 1;
            }
        }
        rows
    })
}

proptest! {
    #[test]
    fn packings_are_valid_and_match_the_plain_scan(rows in logs()) {
        let p = prepared(&rows);
        let lives = bound::lives(&p);
        let peak = bound::live_peak(&lives);
        for order in ORDERS {
            for fit in [Fit::First, Fit::Best] {
                let packing = bound::pack(&lives, p.ops.len(), order, fit);
                let want = naive(&lives, &order.arrange(&lives), fit);
                prop_assert_eq!(&packing.offsets, &want, "{:?} {:?}", order, fit);
                prop_assert!(packing.high >= peak);
                for (i, a) in lives.iter().enumerate() {
                    let oa = packing.offsets[i];
                    prop_assert!(oa + a.size <= packing.high);
                    for (j, b) in lives.iter().enumerate().skip(i + 1) {
                        let ob = packing.offsets[j];
                        if a.overlaps(b) {
                            prop_assert!(oa + a.size <= ob || ob + b.size <= oa,
                                "blocks {} and {} share bytes", i, j);
                        }
                    }
                }
            }
        }
    }
}
