//! A synthetic training loop whose sizes vary widely and differ in every
//! iteration, as a graph network's do (the number of nodes and edges of
//! each sampled batch scales its tensors): per iteration some 200 small
//! blocks (4 B to 256 KiB), 24 medium ones (1 to 64 MiB), 8 activations
//! of 200 to 420 MB, and two blocks above 2 GiB live together (2.1 to
//! 2.6 GB and 2.7 to 3.5 GB). Sizes are drawn afresh each iteration. A
//! third of the blocks are temporaries freed a few allocations later; the
//! rest are freed at the end of the iteration, the last allocated first.
//! Everything is on one stream.
//!
//! Shared by the C ABI's test of this workload (`tests/wide_sizes.rs`)
//! and `examples/capi_replay.rs --wide SEED`, which can also write it as
//! an RMM log.

use gpumem::trace::{Action, TraceEvent};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Iterations the test and the example replay per pass.
pub const ITERATIONS: usize = 6;

/// One step of an iteration: allocate block `id` of `size` bytes, or
/// free block `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Alloc { id: usize, size: usize },
    Free { id: usize },
}

/// `n` iterations drawn from `seed`; block ids are unique over all of them.
pub fn iterations(seed: u64, n: usize) -> Vec<Vec<Step>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut next_id = 0;
    (0..n).map(|_| iteration(&mut rng, &mut next_id)).collect()
}

/// A size log-uniform in `lo..hi`.
fn log_uniform(rng: &mut StdRng, lo: usize, hi: usize) -> usize {
    let (l, h) = ((lo as f64).ln(), (hi as f64).ln());
    rng.random_range(l..h).exp() as usize
}

fn iteration(rng: &mut StdRng, next_id: &mut usize) -> Vec<Step> {
    const MB: usize = 1_000_000;
    let mut sizes: Vec<usize> = Vec::new();
    sizes.extend((0..200).map(|_| log_uniform(rng, 4, 256 << 10)));
    sizes.extend((0..24).map(|_| log_uniform(rng, 1 << 20, 64 << 20)));
    sizes.extend((0..8).map(|_| rng.random_range(200 * MB..420 * MB)));
    // Shuffled in, the two large ones placed at random among the others.
    for i in (1..sizes.len()).rev() {
        sizes.swap(i, rng.random_range(0..=i));
    }
    let first = rng.random_range(0..sizes.len() / 2);
    sizes.insert(first, rng.random_range(2_100 * MB..2_600 * MB));
    let second = rng.random_range(first + 1..sizes.len());
    sizes.insert(second, rng.random_range(2_700 * MB..3_500 * MB));
    let mut steps = Vec::new();
    let mut kept = Vec::new();
    // Temporaries: (id, allocations left before its free).
    let mut temporaries: Vec<(usize, usize)> = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let id = *next_id;
        *next_id += 1;
        steps.push(Step::Alloc { id, size });
        temporaries.retain_mut(|(t, left)| {
            *left -= 1;
            if *left == 0 {
                steps.push(Step::Free { id: *t });
            }
            *left > 0
        });
        let large = i == first || i == second;
        if !large && rng.random_bool(1.0 / 3.0) {
            temporaries.push((id, rng.random_range(1..8)));
        } else {
            kept.push(id);
        }
    }
    steps.extend(temporaries.iter().map(|&(id, _)| Step::Free { id }));
    steps.extend(kept.iter().rev().map(|&id| Step::Free { id }));
    steps
}

/// The iterations as an RMM log on the legacy default stream: block `id`
/// at a made-up address of its own.
pub fn rmm_log(iterations: &[Vec<Step>]) -> Vec<TraceEvent> {
    let mut sizes = std::collections::HashMap::new();
    let mut out = Vec::new();
    for (time_us, step) in iterations.iter().flatten().enumerate() {
        let (action, id, size) = match *step {
            Step::Alloc { id, size } => {
                sizes.insert(id, size);
                (Action::Allocate, id, size)
            }
            Step::Free { id } => (Action::Free, id, sizes[&id]),
        };
        out.push(TraceEvent {
            thread: 1,
            time_us: time_us as u64,
            action,
            ptr: 0x7f00_0000_0000 + ((id as u64) << 32),
            size,
            stream: 0,
        });
    }
    out
}
