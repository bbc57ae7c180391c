//! `gpumem bound`: how lean any pool that never moves memory could be on
//! an RMM log, even one that knew the whole log in advance.
//!
//! Every block of the log is placed once, at a fixed offset of one address
//! range, for its whole life, by offline packing heuristics that see every
//! block's size and lifetime before placing any. The high-water mark of a
//! packing over the peak of live bytes (both in 256-byte granules, as the
//! pools round) is the reserve such a pool would hold.
//!
//! The packings take the blocks in one of four [`Order`]s and place each
//! at the lowest offset where it fits beside the blocks already placed that
//! live at the same time ([`Fit::First`]) or in the smallest such gap
//! ([`Fit::Best`]). Largest first is the strongest of the usual offline
//! heuristics for tensor memory planning; the log's own order is what an
//! online allocator sees. None is optimal (the problem is NP-hard), so the
//! lowest ratio is what planning reaches, not a proven floor. An allocator
//! whose reserve is above it loses that much to not knowing the future or
//! to its own placement; one that moves memory (VirtualPool, or recycling)
//! is not bound by it at all.
//!
//! Lifetimes are counted in the replay's operations ([`PreparedReplay`]),
//! so failed allocations, zero-byte requests and frees of unknown pointers
//! are skipped as a replay skips them, and a block never freed lives to the
//! end. Finding the blocks that share a block's lifetime takes a segment
//! tree over time (those alive when it starts) and an index by start (those
//! starting during its life): the cost follows the blocks placed beside
//! each one, not the whole log.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::replay::PreparedReplay;

/// The pools' allocation granule (their heaps' own): sizes are rounded up
/// to it.
pub use gpumem::suballoc::GRANULE;

/// One block of a log: its size (rounded to [`GRANULE`]) and the replay
/// operations that allocate it (`start`) and free it (`end`, the number of
/// operations for a block never freed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Life {
    /// The allocating operation.
    pub start: usize,
    /// The freeing operation, or the number of operations.
    pub end: usize,
    /// Bytes, a multiple of [`GRANULE`].
    pub size: u64,
}

impl Life {
    /// Whether the two blocks are live at the same time.
    pub fn overlaps(&self, other: &Life) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// The order in which blocks are placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Order {
    /// Largest first.
    LargestFirst,
    /// Largest size times lifetime first.
    SizeTimesLifetime,
    /// Longest lived first.
    LongestLived,
    /// The log's order (what an online allocator sees).
    LogOrder,
}

/// Every order, in the order `gpumem bound` prints them.
pub const ORDERS: [Order; 4] = [
    Order::LargestFirst,
    Order::SizeTimesLifetime,
    Order::LongestLived,
    Order::LogOrder,
];

impl Order {
    /// The order's name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Order::LargestFirst => "largest first",
            Order::SizeTimesLifetime => "size x lifetime",
            Order::LongestLived => "longest lived",
            Order::LogOrder => "the log's order",
        }
    }

    /// The indices of `lives` in this order (ties in the log's order).
    pub fn arrange(self, lives: &[Life]) -> Vec<usize> {
        let mut idx: Vec<usize> = (0..lives.len()).collect();
        let key = |i: &usize| {
            let b = &lives[*i];
            let life = (b.end - b.start) as u128;
            let first = match self {
                Order::LargestFirst => u128::from(b.size),
                Order::SizeTimesLifetime => u128::from(b.size) * life,
                Order::LongestLived => life,
                Order::LogOrder => 0,
            };
            (std::cmp::Reverse(first), b.start)
        };
        idx.sort_by_key(key);
        idx
    }
}

/// Where a block goes among the free gaps beside the blocks placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fit {
    /// The lowest offset that fits.
    First,
    /// The smallest gap that fits (the lowest of equal ones).
    Best,
}

/// A packing: each block's offset (indexed as the blocks given) and the
/// highest end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packing {
    /// Offset of each block, in the order of the blocks given.
    pub offsets: Vec<u64>,
    /// The highest end of any block: the range the packing needs.
    pub high: u64,
}

/// Every block of a prepared replay with its lifetime.
pub fn lives(prep: &PreparedReplay) -> Vec<Life> {
    let mut open: Vec<Option<(usize, u64)>> = vec![None; prep.slots];
    let mut lives = Vec::new();
    for (i, op) in prep.ops.iter().enumerate() {
        let slot = op.slot as usize;
        if op.alloc {
            let size = (op.size as u64).max(1).div_ceil(GRANULE) * GRANULE;
            // `prepare` reuses a slot only once freed (a pointer handed out
            // twice gets a new slot, the earlier block leaked); a slot
            // still open here would be such a block, live to the end.
            if let Some((start, size)) = open[slot].replace((i, size)) {
                lives.push(Life {
                    start,
                    end: prep.ops.len(),
                    size,
                });
            }
        } else if let Some((start, size)) = open[slot].take() {
            lives.push(Life {
                start,
                end: i,
                size,
            });
        }
    }
    let end = prep.ops.len();
    lives.extend(
        open.into_iter()
            .flatten()
            .map(|(start, size)| Life { start, end, size }),
    );
    lives.sort_by_key(|b| b.start);
    lives
}

/// The most bytes live at once.
pub fn live_peak(lives: &[Life]) -> u64 {
    let mut changes: Vec<(usize, i128)> = lives
        .iter()
        .flat_map(|b| [(b.start, i128::from(b.size)), (b.end, -i128::from(b.size))])
        .collect();
    // No operation both allocates and frees, so no time has two kinds of
    // change.
    changes.sort_unstable();
    let (mut live, mut peak) = (0i128, 0i128);
    for (_, d) in changes {
        live += d;
        peak = peak.max(live);
    }
    peak as u64
}

/// The blocks placed so far, found by lifetime.
struct Placed {
    /// Segment tree over operations: each node lists the blocks live over
    /// its whole span (bottom-up layout, leaves from `leaves`).
    nodes: Vec<Vec<u32>>,
    leaves: usize,
    /// Blocks by the operation that allocates them.
    by_start: BTreeMap<usize, Vec<u32>>,
}

impl Placed {
    fn new(ops: usize) -> Self {
        let leaves = (ops + 1).next_power_of_two();
        Self {
            nodes: vec![Vec::new(); 2 * leaves],
            leaves,
            by_start: BTreeMap::new(),
        }
    }

    fn insert(&mut self, id: u32, b: &Life) {
        self.by_start.entry(b.start).or_default().push(id);
        // The operations b is live at: start..end.
        let (mut l, mut r) = (b.start + self.leaves, b.end + self.leaves);
        while l < r {
            if l & 1 == 1 {
                self.nodes[l].push(id);
                l += 1;
            }
            if r & 1 == 1 {
                r -= 1;
                self.nodes[r].push(id);
            }
            l >>= 1;
            r >>= 1;
        }
    }

    /// Every placed block live at the same time as `b`: those live at its
    /// start, and those that start during its life.
    fn beside(&self, b: &Life, mut f: impl FnMut(u32)) {
        // Every block is freed after the operation that allocates it.
        debug_assert!(b.start < b.end);
        let mut i = b.start + self.leaves;
        while i >= 1 {
            self.nodes[i].iter().copied().for_each(&mut f);
            i >>= 1;
        }
        for ids in self.by_start.range(b.start + 1..b.end).map(|(_, v)| v) {
            ids.iter().copied().for_each(&mut f);
        }
    }
}

/// Packs `lives` (whose `end`s are at most `ops`) in `order` with `fit`.
pub fn pack(lives: &[Life], ops: usize, order: Order, fit: Fit) -> Packing {
    let mut offsets = vec![0u64; lives.len()];
    let mut placed = Placed::new(ops);
    let mut taken: Vec<(u64, u64)> = Vec::new();
    let mut high = 0;
    for i in order.arrange(lives) {
        let b = &lives[i];
        taken.clear();
        placed.beside(b, |j| {
            let (o, s) = (offsets[j as usize], lives[j as usize].size);
            taken.push((o, o + s));
        });
        taken.sort_unstable();
        // The gaps between the blocks beside it, lowest first; above them
        // all when none fits.
        let (mut end, mut chosen) = (0u64, None::<(u64, u64)>);
        for &(lo, hi) in &taken {
            if lo >= end + b.size {
                let gap = lo - end;
                if chosen.is_none_or(|(g, _)| fit == Fit::Best && gap < g) {
                    chosen = Some((gap, end));
                }
                if fit == Fit::First {
                    break;
                }
            }
            end = end.max(hi);
        }
        let at = chosen.map_or(end, |(_, off)| off);
        offsets[i] = at;
        high = high.max(at + b.size);
        placed.insert(i as u32, b);
    }
    Packing { offsets, high }
}

/// One packing of one log, as `gpumem bound --json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct BoundRecord {
    /// The log's file name.
    pub trace: String,
    /// Blocks in the log.
    pub blocks: usize,
    /// The most bytes live at once (rounded to 256 each).
    pub peak_live: u64,
    /// The order blocks were placed in.
    pub order: Order,
    /// The placement rule.
    pub fit: Fit,
    /// The range the packing needs.
    pub high_water: u64,
    /// `high_water / peak_live`.
    pub ratio: f64,
}

/// Every packing of a prepared log named `trace`, in [`ORDERS`]' order, first
/// fit then best fit; `done` hears of each as it ends (a log of millions of
/// events takes minutes: the cost follows the blocks times those beside
/// each).
pub fn bound(
    trace: &str,
    prep: &PreparedReplay,
    mut done: impl FnMut(&BoundRecord),
) -> Vec<BoundRecord> {
    let lives = lives(prep);
    let peak = live_peak(&lives);
    let mut records = Vec::new();
    for order in ORDERS {
        for fit in [Fit::First, Fit::Best] {
            let p = pack(&lives, prep.ops.len(), order, fit);
            let r = BoundRecord {
                trace: trace.to_string(),
                blocks: lives.len(),
                peak_live: peak,
                order,
                fit,
                high_water: p.high,
                ratio: p.high as f64 / peak.max(1) as f64,
            };
            done(&r);
            records.push(r);
        }
    }
    records
}
