//! The benchmark workloads: their pre-generated operation sequences and the
//! timed loops.
//!
//! Everything random is generated before the clock starts; the clock covers
//! only the loop of allocate/deallocate calls and a device synchronize at its
//! end (so stream-ordered allocators pay for the work they enqueued), with one
//! `Instant` around the whole loop. Whatever is still live when a loop ends is
//! freed after the clock stops.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpumem::resource::{MemoryResource, DEFAULT_ALIGNMENT};
use gpumem::{Device, DevicePtr, Stream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::replay::PreparedReplay;
use crate::thread_crew::ThreadCrew;

pub(crate) const ALIGN: usize = DEFAULT_ALIGNMENT;

/// What one timed run did.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    /// Wall time of the timed loop.
    pub elapsed: Duration,
    /// Allocate and deallocate calls in the loop.
    pub ops: u64,
}

impl Timed {
    /// Nanoseconds per operation.
    pub fn ns_per_op(&self) -> f64 {
        if self.ops == 0 {
            return 0.0;
        }
        self.elapsed.as_nanos() as f64 / self.ops as f64
    }
}

/// One step of a pre-generated sequence: allocate `size` bytes into `slot`, or
/// free what `slot` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    /// Index into the table of live pointers.
    pub slot: u32,
    /// Bytes (for frees: the size the slot was allocated with).
    pub size: usize,
    /// Allocate (true) or free (false).
    pub alloc: bool,
}

/// A pre-generated sequence of operations over a table of `slots` pointers.
#[derive(Debug, Clone, Default)]
pub struct OpSequence {
    /// The operations, in order.
    pub ops: Vec<Op>,
    /// Size of the pointer table the operations index.
    pub slots: usize,
    /// Highest sum of live bytes along the sequence.
    pub peak_live: usize,
}

/// A log-uniform size in `[min, max]`.
fn log_uniform(rng: &mut StdRng, min: usize, max: usize) -> usize {
    if min >= max {
        return min;
    }
    let (lo, hi) = ((min as f64).ln(), (max as f64 + 1.0).ln());
    let s = rng.random_range(lo..hi).exp() as usize;
    s.clamp(min, max)
}

/// The `random` workload's sequence: each step allocates a log-uniform size in
/// `[min_size, max_size]` (when fewer than `max_live` blocks are live and a
/// coin says so, or when nothing is live) or frees a random live block.
pub fn random_sequence(
    ops: usize,
    max_live: usize,
    min_size: usize,
    max_size: usize,
    seed: u64,
) -> OpSequence {
    let max_live = max_live.max(1);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut free_slots: Vec<u32> = (0..max_live as u32).rev().collect();
    let mut slot_size = vec![0usize; max_live];
    let mut live: Vec<u32> = Vec::with_capacity(max_live);
    let mut live_bytes = 0usize;
    let mut seq = OpSequence {
        ops: Vec::with_capacity(ops),
        slots: max_live,
        peak_live: 0,
    };
    for _ in 0..ops {
        let alloc = live.is_empty() || (live.len() < max_live && rng.random_bool(0.5));
        if alloc {
            let slot = free_slots.pop().expect("a free slot below max_live");
            let size = log_uniform(&mut rng, min_size, max_size);
            slot_size[slot as usize] = size;
            live.push(slot);
            live_bytes += size;
            seq.peak_live = seq.peak_live.max(live_bytes);
            seq.ops.push(Op { slot, size, alloc });
        } else {
            let slot = live.swap_remove(rng.random_range(0..live.len()));
            let size = slot_size[slot as usize];
            live_bytes -= size;
            free_slots.push(slot);
            seq.ops.push(Op { slot, size, alloc });
        }
    }
    seq
}

/// Frees every non-null pointer of `table` (sizes in `sizes`), untimed.
pub(crate) fn free_all(
    r: &dyn MemoryResource,
    table: &mut [DevicePtr],
    sizes: &[usize],
    streams: &[Stream],
    slot_stream: &[u16],
) -> gpumem::Result<()> {
    let mut first_err = Ok(());
    for (i, p) in table.iter_mut().enumerate() {
        if !p.is_null() {
            let s = &streams[slot_stream.get(i).copied().unwrap_or(0) as usize];
            if let Err(e) = r.deallocate(*p, sizes[i], ALIGN, s) {
                if first_err.is_ok() {
                    first_err = Err(e);
                }
            }
            *p = DevicePtr::NULL;
        }
    }
    first_err
}

/// Runs a sequence on one stream, timed. Frees what is left afterwards.
pub fn run_sequence(
    r: &dyn MemoryResource,
    device: &Device,
    stream: &Stream,
    seq: &OpSequence,
) -> gpumem::Result<Timed> {
    let mut table = vec![DevicePtr::NULL; seq.slots];
    let mut sizes = vec![0usize; seq.slots];
    device.synchronize()?;
    let start = Instant::now();
    let mut result = Ok(());
    for op in &seq.ops {
        let slot = op.slot as usize;
        if op.alloc {
            match r.allocate(op.size, ALIGN, stream) {
                Ok(p) => {
                    table[slot] = p;
                    sizes[slot] = op.size;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        } else if let Err(e) = r.deallocate(table[slot], op.size, ALIGN, stream) {
            result = Err(e);
            break;
        } else {
            table[slot] = DevicePtr::NULL;
        }
    }
    let synced = device.synchronize();
    let elapsed = start.elapsed();
    let freed = free_all(r, &mut table, &sizes, std::slice::from_ref(stream), &[]);
    result?;
    synced?;
    freed?;
    device.synchronize()?;
    Ok(Timed {
        elapsed,
        ops: seq.ops.len() as u64,
    })
}

/// The `same` workload: `iters` allocate/free pairs of `size` bytes on one
/// stream, after one untimed warm-up pair.
pub fn run_same(
    r: &dyn MemoryResource,
    device: &Device,
    stream: &Stream,
    size: usize,
    iters: usize,
) -> gpumem::Result<Timed> {
    let p = r.allocate(size, ALIGN, stream)?;
    r.deallocate(p, size, ALIGN, stream)?;
    device.synchronize()?;
    let start = Instant::now();
    for _ in 0..iters {
        let p = r.allocate(size, ALIGN, stream)?;
        r.deallocate(p, size, ALIGN, stream)?;
    }
    device.synchronize()?;
    Ok(Timed {
        elapsed: start.elapsed(),
        ops: 2 * iters as u64,
    })
}

/// Size of the blocks that make the holes of the `holes` workload.
pub const HOLE_SIZE: usize = 64 << 10;
/// Size of the timed requests of the `holes` workload.
pub const HOLES_REQUEST: usize = 256;

/// The `holes` workload: allocates `2 * holes + 1` blocks of [`HOLE_SIZE`] and
/// frees every other one, leaving `holes` free holes between live blocks
/// (untimed); then times `iters` allocate/free pairs of [`HOLES_REQUEST`]
/// bytes; then frees everything.
pub fn run_holes(
    r: &dyn MemoryResource,
    device: &Device,
    stream: &Stream,
    holes: usize,
    iters: usize,
) -> gpumem::Result<Timed> {
    let n = 2 * holes + 1;
    let mut table = vec![DevicePtr::NULL; n];
    let sizes = vec![HOLE_SIZE; n];
    let setup = (|| {
        for p in table.iter_mut() {
            *p = r.allocate(HOLE_SIZE, ALIGN, stream)?;
        }
        for p in table.iter_mut().skip(1).step_by(2) {
            r.deallocate(*p, HOLE_SIZE, ALIGN, stream)?;
            *p = DevicePtr::NULL;
        }
        device.synchronize()
    })();
    let timed = setup.and_then(|()| {
        let start = Instant::now();
        for _ in 0..iters {
            let p = r.allocate(HOLES_REQUEST, ALIGN, stream)?;
            r.deallocate(p, HOLES_REQUEST, ALIGN, stream)?;
        }
        device.synchronize()?;
        Ok(Timed {
            elapsed: start.elapsed(),
            ops: 2 * iters as u64,
        })
    });
    let freed = free_all(r, &mut table, &sizes, std::slice::from_ref(stream), &[]);
    let timed = timed?;
    freed?;
    Ok(timed)
}

/// The `threads` workload once: each of `seqs.len()` threads runs its own
/// sequence on its own stream (see [`ThreadCrew`], which `gpumem bench`
/// keeps across the passes of a repeat).
pub fn run_threads(
    r: &Arc<dyn MemoryResource>,
    device: &Device,
    seqs: &[Arc<OpSequence>],
) -> anyhow::Result<Timed> {
    ThreadCrew::new(r, device, seqs)?.run_pass()
}

/// Streams for replaying `prep`: one per distinct trace stream. A caller
/// that replays a trace several times on one allocator passes the same
/// streams each time, as the traced program kept its streams.
pub fn replay_streams(device: &Device, prep: &PreparedReplay) -> gpumem::Result<Vec<Stream>> {
    (0..prep.streams.len().max(1))
        .map(|_| device.create_stream())
        .collect()
}

/// Replays a prepared trace through `r`, timed, on `streams` (from
/// [`replay_streams`]; made when `None`). Frees what the trace leaves live
/// afterwards.
/// `on_step`, when given, is called after every operation with its index
/// and the block it allocated or freed (used for timelines and memory maps;
/// it is inside the timed loop, so only untimed callers pass one).
pub fn run_replay(
    r: &dyn MemoryResource,
    device: &Device,
    prep: &PreparedReplay,
    streams: Option<&[Stream]>,
    mut on_step: Option<&mut dyn FnMut(usize, DevicePtr)>,
) -> anyhow::Result<Timed> {
    let made;
    let streams = match streams {
        Some(s) if s.len() >= prep.streams.len().max(1) => s,
        _ => {
            made = replay_streams(device, prep)?;
            &made[..]
        }
    };
    let mut table = vec![DevicePtr::NULL; prep.slots];
    let mut sizes = vec![0usize; prep.slots];
    let mut slot_stream = vec![0u16; prep.slots];
    device.synchronize()?;
    let start = Instant::now();
    let mut result = Ok(());
    for (i, op) in prep.ops.iter().enumerate() {
        let slot = op.slot as usize;
        let stream = &streams[op.stream as usize];
        let block = table[slot];
        if op.alloc {
            match r.allocate(op.size, ALIGN, stream) {
                Ok(p) => {
                    table[slot] = p;
                    sizes[slot] = op.size;
                    slot_stream[slot] = op.stream;
                }
                Err(e) => {
                    result = Err(event_error(e, i, prep));
                    break;
                }
            }
        } else if let Err(e) = r.deallocate(block, op.size, ALIGN, stream) {
            result = Err(event_error(e, i, prep));
            break;
        } else {
            table[slot] = DevicePtr::NULL;
        }
        if let Some(f) = on_step.as_mut() {
            f(i, if op.alloc { table[slot] } else { block });
        }
    }
    let synced = device.synchronize();
    let elapsed = start.elapsed();
    let freed = free_all(r, &mut table, &sizes, streams, &slot_stream);
    result?;
    synced?;
    freed?;
    device.synchronize()?;
    Ok(Timed {
        elapsed,
        ops: prep.ops.len() as u64,
    })
}

/// Names the trace event behind a failed replay operation; the error itself
/// keeps its kind (out of memory, a driver failure, ...).
fn event_error(e: gpumem::Error, op: usize, prep: &PreparedReplay) -> anyhow::Error {
    let o = &prep.ops[op];
    anyhow::Error::new(e).context(format!(
        "trace event {} ({} of {} bytes)",
        prep.event_index[op],
        if o.alloc { "allocation" } else { "free" },
        o.size
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_sequence_is_balanced_and_bounded() {
        let seq = random_sequence(10_000, 50, 256, 1 << 20, 7);
        assert_eq!(seq.ops.len(), 10_000);
        let mut live = vec![None; seq.slots];
        let (mut n, mut bytes, mut peak) = (0usize, 0usize, 0usize);
        for op in &seq.ops {
            assert!(op.size >= 256 && op.size <= 1 << 20);
            let s = op.slot as usize;
            if op.alloc {
                assert!(live[s].is_none());
                live[s] = Some(op.size);
                n += 1;
                bytes += op.size;
                peak = peak.max(bytes);
            } else {
                assert_eq!(live[s].take(), Some(op.size));
                n -= 1;
                bytes -= op.size;
            }
            assert!(n <= 50);
        }
        assert_eq!(peak, seq.peak_live);
        // Same seed, same sequence.
        assert_eq!(random_sequence(10_000, 50, 256, 1 << 20, 7).ops, seq.ops);
    }

    #[test]
    fn log_uniform_spans_the_range() {
        let mut rng = StdRng::seed_from_u64(1);
        let v: Vec<usize> = (0..10_000)
            .map(|_| log_uniform(&mut rng, 256, 1 << 26))
            .collect();
        assert!(v.iter().all(|&s| (256..=1 << 26).contains(&s)));
        let small = v.iter().filter(|&&s| s < 1 << 17).count();
        // Half the log range lies below 2^17.
        assert!((4000..6000).contains(&small), "{small}");
    }
}
