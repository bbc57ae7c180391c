//! How lean any pool that never moves memory could be on an RMM log, even
//! one that knew the whole log in advance: each block placed once, at a
//! fixed offset of one address range, for its whole life, by offline
//! packing heuristics that see every block's size and lifetime before
//! placing any. Prints the high-water mark of each packing over the peak
//! of live bytes (granules of 256 bytes, as the pools round).
//!
//! The packings: blocks taken in one of four orders (largest first; largest
//! size times lifetime first; longest lived first; the log's own order,
//! which is what an online allocator sees), each placed at the lowest
//! offset where it fits beside the blocks already placed that live at the
//! same time (first fit) or in the smallest such gap (best fit). Largest
//! first is the strongest of the usual offline heuristics for tensor
//! memory planning. None of them is optimal (the problem is NP-hard), so
//! the lowest line is what planning reaches, not a proof of a floor; it
//! tells how much of a pool's reserve over the live peak the log's order
//! of requests forces on any placement that does not move memory.
//!
//! `cargo run --release -p gpumem --example offline_bound -- LOG.csv...`

use std::collections::HashMap;

use gpumem::trace::{self, Action};

/// The pools' allocation granule.
const GRANULE: u64 = 256;

/// One block of the log: its size and the events that start and end it.
#[derive(Debug, Clone, Copy)]
struct Life {
    start: usize,
    end: usize,
    size: u64,
}

impl Life {
    fn overlaps(&self, other: &Life) -> bool {
        self.start < other.end && other.start < self.end
    }
}

fn main() {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        eprintln!("usage: offline_bound LOG.csv...");
        std::process::exit(2);
    }
    for path in &paths {
        let events = trace::read_file(path).unwrap_or_else(|e| {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        });
        let lives = lives(&events);
        let peak = live_peak(&lives);
        println!(
            "{path}: {} blocks, live peak {:.1} MiB",
            lives.len(),
            peak as f64 / f64::from(1u32 << 20)
        );
        type Order = fn(&Life) -> (i128, usize);
        let orders: [(&str, Order); 4] = [
            ("largest first", |b| (-(b.size as i128), b.start)),
            ("size x lifetime", |b| {
                (-(b.size as i128 * (b.end - b.start) as i128), b.start)
            }),
            ("longest lived", |b| (-((b.end - b.start) as i128), b.start)),
            ("the log's order", |b| (0, b.start)),
        ];
        for (name, key) in orders {
            let mut order = lives.clone();
            order.sort_by_key(key);
            for best in [false, true] {
                let high = pack(&order, best);
                println!(
                    "  {name:>16}, {}: {:.4}",
                    if best { "best fit " } else { "first fit" },
                    high as f64 / peak as f64
                );
            }
        }
    }
}

/// Every block of the log with its lifetime, in 256-byte granules; blocks
/// never freed live to the end.
fn lives(events: &[trace::TraceEvent]) -> Vec<Life> {
    let mut open: HashMap<u64, (usize, u64)> = HashMap::new();
    let mut lives = Vec::new();
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Allocate => {
                let size = (e.size as u64).max(1).div_ceil(GRANULE) * GRANULE;
                open.insert(e.ptr, (i, size));
            }
            Action::Free => {
                if let Some((start, size)) = open.remove(&e.ptr) {
                    lives.push(Life {
                        start,
                        end: i,
                        size,
                    });
                }
            }
            Action::AllocateFailure => {}
        }
    }
    let end = events.len();
    lives.extend(
        open.into_values()
            .map(|(start, size)| Life { start, end, size }),
    );
    lives
}

/// The most bytes live at once.
fn live_peak(lives: &[Life]) -> u64 {
    let mut changes: Vec<(usize, i64)> = lives
        .iter()
        .flat_map(|b| [(b.start, b.size as i64), (b.end, -(b.size as i64))])
        .collect();
    // Each event does one thing, so no time has both a start and an end.
    changes.sort_unstable();
    let (mut live, mut peak) = (0i64, 0i64);
    for (_, d) in changes {
        live += d;
        peak = peak.max(live);
    }
    peak as u64
}

/// Places the blocks in the order given, each at a fixed offset that no
/// block living at the same time overlaps: the lowest such offset, or the
/// smallest gap that fits. Returns the highest end.
fn pack(order: &[Life], best: bool) -> u64 {
    let mut placed: Vec<(Life, u64)> = Vec::with_capacity(order.len());
    let mut taken: Vec<(u64, u64)> = Vec::new();
    let mut high = 0;
    for b in order {
        taken.clear();
        taken.extend(
            placed
                .iter()
                .filter(|(p, _)| p.overlaps(b))
                .map(|&(p, off)| (off, off + p.size)),
        );
        taken.sort_unstable();
        let (mut end, mut chosen) = (0u64, None::<(u64, u64)>);
        for &(lo, hi) in &taken {
            if lo >= end + b.size {
                let gap = lo - end;
                if chosen.is_none_or(|(g, _)| best && gap < g) {
                    chosen = Some((gap, end));
                }
                if !best {
                    break;
                }
            }
            end = end.max(hi);
        }
        // A gap below the blocks placed, else above them all.
        let at = chosen.map_or(end, |(_, off)| off);
        placed.push((*b, at));
        high = high.max(at + b.size);
    }
    high
}
