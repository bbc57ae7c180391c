//! Times the suballocation engine (`LaneHeap`) on pure address arithmetic.
//!
//! Run with `cargo run --release --example tlsf_speed`. Prints ns per operation
//! (an allocate or a free) or per pair; nothing is asserted.

use std::hint::black_box;
use std::time::Instant;

use gpumem::suballoc::{LaneHeap, LaneId};

const G: LaneId = LaneId::GLOBAL;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Log-uniform in [lo, hi).
    fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let (a, b) = ((lo as f64).ln(), (hi as f64).ln());
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        (a + u * (b - a)).exp() as u64
    }
}

fn pairs(label: &str, size: u64, n: u64) {
    let mut h = LaneHeap::new();
    h.add_region(GIB, 64 * GIB).unwrap();
    // Warm up: grow the slab and the map.
    for _ in 0..1000 {
        let a = h.allocate(G, size, 256).unwrap();
        h.free(a.addr, G).unwrap();
    }
    // Align only where asked (size == alignment for the aligned run).
    let align = if label.contains("aligned") { size } else { 256 };
    for _ in 0..1000 {
        let a = h.allocate(G, size, align).unwrap();
        h.free(a.addr, G).unwrap();
    }
    let t = Instant::now();
    for _ in 0..n {
        let a = h.allocate(G, black_box(size), align).unwrap();
        h.free(black_box(a.addr), G).unwrap();
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!("{label:<48} {ns:7.1} ns/pair  ({:.1} ns/op)", ns / 2.0);
}

fn random_workload(n: u64) {
    let mut h = LaneHeap::new();
    h.add_region(GIB, 256 * GIB).unwrap();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    // Pre-generate the decisions so the timed loop measures the heap.
    let ops: Vec<(bool, u64, u64)> = (0..n)
        .map(|_| {
            (
                rng.next().is_multiple_of(2),
                rng.log_uniform(256, 64 * MIB),
                rng.next(),
            )
        })
        .collect();
    let mut live: Vec<u64> = Vec::with_capacity(1000);
    let t = Instant::now();
    for &(want_alloc, size, pick) in &ops {
        if live.is_empty() || (want_alloc && live.len() < 1000) {
            live.push(h.allocate(G, size, 256).unwrap().addr);
        } else {
            let addr = live.swap_remove((pick % live.len() as u64) as usize);
            h.free(addr, G).unwrap();
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    let st = h.stats();
    println!(
        "{:<48} {ns:7.1} ns/op    ({} free blocks at end)",
        "random 256 B-64 MiB log-uniform, <=1000 live", st.free_blocks
    );
}

fn holes(n: u64) {
    let mut h = LaneHeap::new();
    h.add_region(GIB, 64 * GIB).unwrap();
    let blocks: Vec<u64> = (0..131_072)
        .map(|_| h.allocate(G, 4096, 256).unwrap().addr)
        .collect();
    for a in blocks.iter().step_by(2) {
        h.free(*a, G).unwrap();
    }
    println!(
        "  (64k-holes setup: {} free blocks in the lane)",
        h.lane_block_count(G)
    );
    for (label, size) in [
        ("64k holes: 256 B alloc/free (fits a hole)", 256u64),
        ("64k holes: 4 KiB alloc/free (exact hole)", 4096),
        ("64k holes: 8 KiB alloc/free (no hole fits)", 8192),
    ] {
        let t = Instant::now();
        for _ in 0..n {
            let a = h.allocate(G, black_box(size), 256).unwrap();
            h.free(black_box(a.addr), G).unwrap();
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        println!("{label:<48} {ns:7.1} ns/pair  ({:.1} ns/op)", ns / 2.0);
    }
    h.check_invariants().unwrap();
}

fn lanes(n: u64) {
    // Per-stream lane: free into the stream's lane, reuse from it (the
    // same-stream fast path), with the neighbour of the block in another lane.
    let mut h = LaneHeap::new();
    h.add_region(GIB, 64 * GIB).unwrap();
    let s = h.create_lane().unwrap();
    let a = h.allocate(G, MIB, 256).unwrap();
    h.free(a.addr, s).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        let a = h.allocate(s, black_box(MIB), 256).unwrap();
        h.free(black_box(a.addr), s).unwrap();
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "{:<48} {ns:7.1} ns/pair",
        "1 MiB alloc/free in a stream lane"
    );

    // move_lane: 64k separated blocks to global, per block moved.
    let blocks: Vec<u64> = (0..131_072)
        .map(|_| h.allocate(G, 4096, 256).unwrap().addr)
        .collect();
    let mut victims: Vec<u64> = blocks.iter().copied().step_by(2).collect();
    let mut total = 0.0;
    let rounds = 20;
    for _ in 0..rounds {
        for a in &victims {
            h.free(*a, s).unwrap();
        }
        let t = Instant::now();
        h.move_lane(s, G).unwrap();
        total += t.elapsed().as_nanos() as f64;
        for a in victims.iter_mut() {
            *a = h.allocate(G, 4096, 256).unwrap().addr;
        }
    }
    println!(
        "{:<48} {:7.1} ns/block",
        "move_lane of 64k blocks",
        total / (rounds as f64 * 65536.0)
    );
}

/// The host floor of DESIGN.md §1: Vec pop + HashMap insert + remove + Vec push.
fn floor(n: u64) {
    use std::collections::HashMap;
    let mut free: Vec<u64> = (0..1000).map(|i| GIB + i * MIB).collect();
    let mut map: HashMap<u64, u32> = HashMap::new();
    let t = Instant::now();
    for _ in 0..n {
        let a = free.pop().unwrap();
        map.insert(black_box(a), 7);
        black_box(map.remove(&black_box(a)).unwrap());
        free.push(a);
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    println!(
        "{:<48} {ns:7.1} ns/pair",
        "floor: Vec pop+push, std HashMap insert+remove"
    );
}

/// Arguments: `[pairs-only | random-only] [n]` — run just the cached 1 MiB
/// pairs or the random workload (for instruction counting under a profiler);
/// `n` defaults to 10M.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let only_pairs = args.iter().any(|a| a == "pairs-only");
    let n = args
        .iter()
        .find_map(|a| a.parse().ok())
        .unwrap_or(10_000_000);
    if only_pairs {
        pairs("1 MiB alloc/free pairs (cached)", MIB, n);
        return;
    }
    if args.iter().any(|a| a == "random-only") {
        random_workload(n);
        return;
    }
    floor(n);
    pairs("1 MiB alloc/free pairs (cached)", MIB, n);
    pairs("256 B alloc/free pairs (cached)", 256, n);
    pairs("1 MiB aligned to 1 MiB, alloc/free pairs", MIB, n / 10);
    random_workload(n);
    holes(n);
    lanes(n);
}
