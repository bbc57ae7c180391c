//! The reserve a pool would need on an RMM log if each of its two heaps
//! (requests up to 1 MiB, and larger ones, as `PoolResource` splits them)
//! grew one contiguous range instead of separate regions: the high-water
//! mark of the TLSF heap's placements, each heap's rounded up to 2 MiB
//! pages, over the peak of live bytes. Free space inside the range stays
//! reserved. It tells how much of a pool's reserve is its regions'
//! fragmentation and how much the placement itself leaves.
//!
//! Each stream has its lane, as in the pool: an allocation takes its
//! stream's lane, then the global lane's blocks refiled in it, then the
//! global lane; a free goes to the stream's lane. Before the range grows,
//! every lane goes back to the global lane (the pool's settle, here with
//! every stream's work taken as done) and the allocation is tried again.
//!
//! `cargo run --release -p gpumem --example contiguous_bound -- LOG.csv [first]`
//! (`first`: the heap's first fit in place of its best fit in the size class).

use std::collections::HashMap;

use gpumem::suballoc::{Allocation, LaneHeap, LaneId};
use gpumem::trace::{self, Action};

/// The page every heap's range is mapped in.
const PAGE: u64 = 2 << 20;

/// Requests above this go to the large heap (`GrowthPolicy::small_limit`).
const SMALL_LIMIT: u64 = 1 << 20;

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: contiguous_bound LOG.csv [first]");
        std::process::exit(2);
    };
    let best = std::env::args().nth(2).as_deref() != Some("first");
    let events = trace::read_file(&path).unwrap_or_else(|e| {
        eprintln!("{path}: {e}");
        std::process::exit(1);
    });
    // Two ranges far apart, each larger than any trace needs.
    let bases = [1u64 << 40, 1u64 << 42];
    let mut heaps = [LaneHeap::new(), LaneHeap::new()];
    for (heap, &base) in heaps.iter_mut().zip(&bases) {
        heap.add_region(base, 1 << 40)
            .expect("an empty heap takes a range");
    }
    let mut placed: HashMap<u64, (usize, u64, u64, LaneId)> = HashMap::new();
    // Per heap: each stream's lane.
    let mut lanes: [HashMap<u64, LaneId>; 2] = [HashMap::new(), HashMap::new()];
    let (mut live, mut peak_live, mut high, mut peak_reserve) = (0u64, 0u64, [0u64; 2], 0u64);
    for e in &events {
        match e.action {
            Action::Allocate => {
                let size = (e.size as u64).max(1);
                let h = usize::from(size > SMALL_LIMIT);
                let heap = &mut heaps[h];
                let lane = *lanes[h]
                    .entry(e.stream)
                    .or_insert_with(|| heap.create_lane().expect("a lane"));
                let fits = |b: &Allocation| b.addr + b.size - bases[h] <= high[h];
                let block = match take(heap, lane, size, best) {
                    Some(b) if fits(&b) => b,
                    missed => {
                        // Settle every lane before growing, then try again.
                        if let Some(b) = missed {
                            heap.free(b.addr, lane).expect("just placed");
                        }
                        for &l in lanes[h].values() {
                            heap.move_lane(l, LaneId::GLOBAL).expect("a lane");
                        }
                        take(heap, lane, size, best).expect("the range is larger than the trace")
                    }
                };
                placed.insert(e.ptr, (h, block.addr, block.size, lane));
                live += block.size;
                peak_live = peak_live.max(live);
                high[h] = high[h].max(block.addr + block.size - bases[h]);
                let reserve: u64 = high.iter().map(|x| x.next_multiple_of(PAGE)).sum();
                peak_reserve = peak_reserve.max(reserve);
            }
            Action::Free => {
                if let Some((h, addr, size, lane)) = placed.remove(&e.ptr) {
                    // Freed on the stream it names, into that stream's lane.
                    let lane = lanes[h].get(&e.stream).copied().unwrap_or(lane);
                    heaps[h].free(addr, lane).expect("a placed block");
                    live -= size;
                }
            }
            Action::AllocateFailure => {}
        }
    }
    println!(
        "{path}: peak live {:.3} GB, contiguous reserve {:.3} GB (small {:.3}, large {:.3}), reserve/live {:.3}",
        peak_live as f64 / 1e9,
        peak_reserve as f64 / 1e9,
        high[0] as f64 / 1e9,
        high[1] as f64 / 1e9,
        peak_reserve as f64 / peak_live.max(1) as f64
    );
}

/// A block for `size` bytes from `lane`, the global blocks refiled in it,
/// or the global lane, as the pool takes one.
fn take(heap: &mut LaneHeap, lane: LaneId, size: u64, best: bool) -> Option<Allocation> {
    let from = |heap: &mut LaneHeap, l: LaneId| match best {
        true => heap.allocate_best(l, size, 256),
        false => heap.allocate(l, size, 256),
    };
    from(heap, lane).or_else(|| {
        let l = if heap.absorb_global(lane) {
            lane
        } else {
            LaneId::GLOBAL
        };
        from(heap, l)
    })
}
