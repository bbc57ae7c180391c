//! The `iterations` workload: a synthetic training loop whose tensor sizes
//! may change from one iteration to the next.
//!
//! The model is transformer-like: [`LAYERS`] layers of hidden size [`HIDDEN`]
//! with [`HEADS`] attention heads, a vocabulary of [`VOCAB`], batches of
//! `batch` sequences (default [`BATCH`]; activations grow with it, so a
//! large batch puts a pool under memory pressure). Each iteration draws a
//! size factor `f` and runs on
//! sequences of `SEQ·f` tokens (rounded to a multiple of 8, at least 8):
//! - stream 2 (data): the input and target token ids, freed at the end of
//!   the iteration;
//! - stream 0 (compute), forward: per layer a dozen saved activations (layer
//!   norms and their statistics, QKV, attention probabilities and dropout
//!   mask, context, projection, MLP) and a temporary (the attention scores,
//!   freed after the softmax), then the logits;
//! - backward: the layers in reverse; each saved activation is freed as the
//!   gradient of its size is allocated (the previous gradient freed), the
//!   layer's parameter gradients are allocated, and a gradient bucket of the
//!   layer's parameter bytes is allocated on stream 1 (communication) and
//!   freed one layer later;
//! - optimizer: the parameter gradients are freed (`zero_grad` to `None`).
//!
//! The parameters and the optimizer's two moments per parameter (Adam) are
//! allocated in the first iteration only and stay live to the end of the
//! pass. Activations scale with `f`, attention with `f²`; parameters,
//! gradients of parameters and optimizer state do not.
//!
//! `vary` (0 to 1) sets how much `f` changes: it is drawn per iteration,
//! log-uniform in `[1 − 0.9·vary, 1 + vary]`: always 1 at `vary` 0 (every
//! iteration identical), 0.73 to 1.3 at 0.3, 0.1 to 2 at 1 (sizes 20 times
//! apart, attention 400 times). Each pass (a run of `iterations`
//! iterations) draws its own factors from `seed` and the pass's index, so a
//! later pass is not a replay of an earlier one unless `vary` is 0.
//!
//! The sequence is generated before the clock starts and replayed like a
//! trace ([`crate::workload::run_replay`]); what is still live at the end
//! (parameters, optimizer state) is freed after the clock stops.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::replay::{PreparedReplay, ReplayOp};

/// Transformer layers.
pub const LAYERS: usize = 12;
/// Hidden size.
pub const HIDDEN: usize = 1024;
/// Attention heads.
pub const HEADS: usize = 16;
/// Sequences per batch by default.
pub const BATCH: usize = 4;
/// Tokens per sequence at factor 1.
pub const SEQ: usize = 512;
/// Vocabulary (the logits' last dimension).
pub const VOCAB: usize = 32_000;
/// Streams the workload uses: compute, communication, data.
pub const STREAMS: usize = 3;

const COMPUTE: u16 = 0;
const COMM: u16 = 1;
const DATA: u16 = 2;
/// Bytes per element of activations (bf16), parameters (fp32), token ids.
const ACT: usize = 2;
const PARAM: usize = 4;
const TOKEN: usize = 8;

/// What a pass of the workload is made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IterationsConfig {
    /// Iterations per pass.
    pub iterations: usize,
    /// How much sizes change between iterations, 0 to 1.
    pub vary: f64,
    /// Seed of the size factors.
    pub seed: u64,
    /// Sequences per batch.
    pub batch: usize,
}

/// One pass, ready to replay.
#[derive(Debug, Clone)]
pub struct Pass {
    /// The operations over [`STREAMS`] streams.
    pub prep: PreparedReplay,
    /// Index in `prep.ops` of each iteration's first operation.
    pub iteration_starts: Vec<usize>,
    /// Each iteration's size factor.
    pub factors: Vec<f64>,
}

impl Pass {
    /// The operations of iteration `i`.
    pub fn iteration(&self, i: usize) -> &[ReplayOp] {
        let end = self
            .iteration_starts
            .get(i + 1)
            .copied()
            .unwrap_or(self.prep.ops.len());
        &self.prep.ops[self.iteration_starts[i]..end]
    }
}

/// The size factor of one iteration (see the module documentation).
fn factor(rng: &mut StdRng, vary: f64) -> f64 {
    if vary <= 0.0 {
        return 1.0;
    }
    let (lo, hi) = (1.0 - 0.9 * vary, 1.0 + vary);
    rng.random_range(lo.ln()..=hi.ln()).exp().clamp(lo, hi)
}

/// Builds the operation list: slots are reused as blocks are freed.
struct Builder {
    prep: PreparedReplay,
    free_slots: Vec<u32>,
    slot_size: Vec<usize>,
    live: u64,
}

/// A live block of the sequence being built.
#[derive(Debug, Clone, Copy)]
struct Block {
    slot: u32,
    stream: u16,
}

impl Builder {
    fn new() -> Self {
        Self {
            prep: PreparedReplay {
                streams: (0..STREAMS as u64).collect(),
                ..PreparedReplay::default()
            },
            free_slots: Vec::new(),
            slot_size: Vec::new(),
            live: 0,
        }
    }

    fn push(&mut self, slot: u32, stream: u16, size: usize, alloc: bool) {
        let p = &mut self.prep;
        p.event_index.push(p.ops.len());
        p.time_us.push(p.ops.len() as u64);
        p.ops.push(ReplayOp {
            slot,
            stream,
            size,
            alloc,
        });
        p.live_after.push(self.live);
    }

    fn alloc(&mut self, size: usize, stream: u16) -> Block {
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.prep.slots += 1;
            self.slot_size.push(0);
            (self.prep.slots - 1) as u32
        });
        self.slot_size[slot as usize] = size;
        self.live += size as u64;
        self.prep.peak_live = self.prep.peak_live.max(self.live as usize);
        self.push(slot, stream, size, true);
        Block { slot, stream }
    }

    fn free(&mut self, b: Block) {
        let size = self.slot_size[b.slot as usize];
        self.live -= size as u64;
        self.free_slots.push(b.slot);
        self.push(b.slot, b.stream, size, false);
    }
}

/// Parameter sizes of one layer, in bytes: QKV, projection, two MLP
/// matrices with their biases, two layer norms' weights and biases.
fn layer_params() -> [usize; 12] {
    let (d, p) = (HIDDEN, PARAM);
    [
        3 * d * d * p,
        3 * d * p,
        d * d * p,
        d * p,
        4 * d * d * p,
        4 * d * p,
        4 * d * d * p,
        d * p,
        d * p,
        d * p,
        d * p,
        d * p,
    ]
}

/// Pass `pass` of the workload (see the module documentation).
pub fn generate(cfg: &IterationsConfig, pass: usize) -> Pass {
    let mut rng =
        StdRng::seed_from_u64(cfg.seed ^ (pass as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut b = Builder::new();
    let mut starts = Vec::with_capacity(cfg.iterations);
    let mut factors = Vec::with_capacity(cfg.iterations);
    let (d, h) = (HIDDEN, HEADS);
    let embedding = VOCAB * d * PARAM;
    let params = std::iter::once(embedding)
        .chain((0..LAYERS).flat_map(|_| layer_params()))
        .collect::<Vec<_>>();
    let mut persistent = Vec::new();
    for it in 0..cfg.iterations {
        starts.push(b.prep.ops.len());
        let f = factor(&mut rng, cfg.vary);
        factors.push(f);
        let s = ((SEQ as f64 * f / 8.0).round() as usize * 8).max(8);
        let t = cfg.batch * s;
        let attn = cfg.batch * h * s * s;
        let inputs = b.alloc(t * TOKEN, DATA);
        let targets = b.alloc(t * TOKEN, DATA);
        if it == 0 {
            for &p in &params {
                persistent.push(b.alloc(p, COMPUTE));
            }
        }
        // Forward: what backward needs is kept, layer by layer.
        let mut saved: Vec<Vec<Block>> = Vec::with_capacity(LAYERS);
        let emb = b.alloc(t * d * ACT, COMPUTE);
        for _ in 0..LAYERS {
            let mut layer = Vec::with_capacity(12);
            layer.push(b.alloc(t * d * ACT, COMPUTE)); // layer norm 1
            layer.push(b.alloc(t * 2 * 4, COMPUTE)); // its mean and rstd
            layer.push(b.alloc(t * 3 * d * ACT, COMPUTE)); // QKV
            let scores = b.alloc(attn * ACT, COMPUTE);
            layer.push(b.alloc(attn * ACT, COMPUTE)); // softmax
            b.free(scores);
            layer.push(b.alloc(attn, COMPUTE)); // dropout mask
            layer.push(b.alloc(t * d * ACT, COMPUTE)); // context
            layer.push(b.alloc(t * d * ACT, COMPUTE)); // projection
            layer.push(b.alloc(t * d * ACT, COMPUTE)); // layer norm 2
            layer.push(b.alloc(t * 2 * 4, COMPUTE)); // its mean and rstd
            layer.push(b.alloc(t * 4 * d * ACT, COMPUTE)); // MLP in
            layer.push(b.alloc(t * 4 * d * ACT, COMPUTE)); // GELU
            layer.push(b.alloc(t * d * ACT, COMPUTE)); // MLP out
            saved.push(layer);
        }
        let final_norm = b.alloc(t * d * ACT, COMPUTE);
        let logits = b.alloc(t * VOCAB * ACT, COMPUTE);
        let loss = b.alloc(4, COMPUTE);
        // Backward: activations go in reverse as gradients come.
        let dlogits = b.alloc(t * VOCAB * ACT, COMPUTE);
        b.free(logits);
        b.free(loss);
        let mut grad = b.alloc(t * d * ACT, COMPUTE);
        b.free(dlogits);
        b.free(final_norm);
        let mut grads = vec![b.alloc(embedding, COMPUTE)];
        let mut bucket: Option<Block> = None;
        for layer in saved.into_iter().rev() {
            let mut layer_bytes = 0;
            for p in layer_params() {
                grads.push(b.alloc(p, COMPUTE));
                layer_bytes += p;
            }
            for act in layer.into_iter().rev() {
                let size = b.slot_size[act.slot as usize];
                let g = b.alloc(size, COMPUTE);
                b.free(act);
                b.free(grad);
                grad = g;
            }
            let next = b.alloc(layer_bytes, COMM);
            if let Some(prev) = bucket.replace(next) {
                b.free(prev);
            }
        }
        if let Some(last) = bucket {
            b.free(last);
        }
        b.free(grad);
        b.free(emb);
        b.free(targets);
        b.free(inputs);
        // Optimizer: Adam's moments on the first step; gradients to None.
        if it == 0 {
            for &p in &params {
                persistent.push(b.alloc(p, COMPUTE));
                persistent.push(b.alloc(p, COMPUTE));
            }
        }
        for g in grads {
            b.free(g);
        }
    }
    Pass {
        prep: b.prep,
        iteration_starts: starts,
        factors,
    }
}

/// Highest live bytes over passes `0..passes`.
pub fn peak_live(cfg: &IterationsConfig, passes: usize) -> usize {
    (0..passes)
        .map(|p| generate(cfg, p).prep.peak_live)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vary: f64) -> IterationsConfig {
        IterationsConfig {
            iterations: 6,
            vary,
            seed: 3,
            batch: BATCH,
        }
    }

    #[test]
    fn every_block_is_freed_once_on_its_stream_and_the_rest_persists() {
        let pass = generate(&cfg(1.0), 0);
        let mut live: Vec<Option<(usize, u16)>> = vec![None; pass.prep.slots];
        let mut bytes = 0usize;
        for (i, op) in pass.prep.ops.iter().enumerate() {
            let s = op.slot as usize;
            if op.alloc {
                assert!(live[s].is_none());
                live[s] = Some((op.size, op.stream));
                bytes += op.size;
            } else {
                assert_eq!(live[s].take(), Some((op.size, op.stream)));
                bytes -= op.size;
            }
            assert_eq!(pass.prep.live_after[i], bytes as u64);
        }
        // Parameters and two moments each stay live.
        let params = 1 + LAYERS * 12;
        assert_eq!(live.iter().flatten().count(), 3 * params);
        let streams: std::collections::HashSet<u16> =
            pass.prep.ops.iter().map(|o| o.stream).collect();
        assert_eq!(streams.len(), STREAMS);
    }

    #[test]
    fn factors_follow_vary() {
        let zero = generate(&cfg(0.0), 0);
        assert!(zero.factors.iter().all(|&f| f == 1.0));
        let one = generate(&cfg(1.0), 0);
        assert!(one.factors.iter().all(|&f| (0.1..=2.0).contains(&f)));
        let mut rng = StdRng::seed_from_u64(9);
        let f: Vec<f64> = (0..10_000).map(|_| factor(&mut rng, 0.3)).collect();
        assert!(f.iter().all(|&x| (0.73 - 1e-12..=1.3 + 1e-12).contains(&x)));
        // Log-uniform: half the draws lie below the geometric middle.
        let mid = (0.73f64 * 1.3).sqrt();
        let below = f.iter().filter(|&&x| x < mid).count();
        assert!((4500..5500).contains(&below), "{below}");
    }
}
