//! The replays behind a view: each allocator's reserve after every event,
//! its largest free block at the timeline's samples, its maps at the chosen
//! moments and what it did for each allocation; and the downsampling of the
//! timeline.

use std::collections::{BTreeMap, HashMap};

use gpumem::{Device, DevicePtr};
use gpumem_capi::served::Served;

use super::torch::TorchDetail;
use super::{AllocatorView, BlockTable, MapData, Stacks, SEG_MAPPED, SEG_PLAIN, SEG_UNKNOWN};
use crate::allocators::{Allocator, AllocatorSpec};
use crate::replay::PreparedReplay;
use crate::workload::run_replay;
use gpumem_capi::conf::ResourceKind;

/// The timeline's buckets: `count` runs of `len` consecutive events (the
/// last one shorter), over `ops` events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Buckets {
    /// Events in all.
    pub ops: usize,
    /// Events per bucket.
    pub len: usize,
    /// Buckets.
    pub count: usize,
}

impl Buckets {
    /// At most `max` buckets over `ops` events (one event each when they fit).
    pub fn new(ops: usize, max: usize) -> Self {
        let len = ops.div_ceil(max.max(1)).max(1);
        Self {
            ops,
            len,
            count: ops.div_ceil(len),
        }
    }

    /// The last event of each bucket: where ratios and holes are sampled.
    pub fn sample_ops(&self) -> Vec<usize> {
        (0..self.count)
            .map(|b| ((b + 1) * self.len).min(self.ops) - 1)
            .collect()
    }

    /// The points of `values` (one per event): with one event per bucket,
    /// every event; else two per bucket, its lowest and highest value in the
    /// order they came, at the bucket's first event and half-way through it.
    /// Returns (x, values).
    pub fn minmax(&self, values: &[u64]) -> (Vec<f64>, Vec<u64>) {
        if self.len == 1 {
            let x = (0..values.len()).map(|i| i as f64).collect();
            return (x, values.to_vec());
        }
        let mut xs = Vec::with_capacity(self.count * 2);
        let mut ys = Vec::with_capacity(self.count * 2);
        for (b, chunk) in values.chunks(self.len).enumerate() {
            let start = b * self.len;
            let (mut lo, mut hi) = (0, 0);
            for (i, &v) in chunk.iter().enumerate() {
                if v < chunk[lo] {
                    lo = i;
                }
                if v > chunk[hi] {
                    hi = i;
                }
            }
            let (first, second) = if lo <= hi { (lo, hi) } else { (hi, lo) };
            xs.push(start as f64);
            xs.push(start as f64 + (chunk.len() as f64 / 2.0).max(0.5));
            ys.push(chunk[first]);
            ys.push(chunk[second]);
        }
        (xs, ys)
    }
}

/// Replays `prep` through `alloc` and returns the first event at which its
/// reserve peaked, and the peak.
pub(super) fn peak(
    alloc: &Allocator,
    device: &Device,
    prep: &PreparedReplay,
) -> anyhow::Result<(usize, u64)> {
    let (mut at, mut peak) = (0, 0u64);
    let mut step = |i: usize, _| {
        let r = alloc.pool.reserved_bytes() as u64;
        if r > peak {
            (at, peak) = (i, r);
        }
    };
    run_replay(&*alloc.resource, device, prep, None, Some(&mut step))?;
    Ok((at, peak))
}

/// What one allocator (replayed, or PyTorch's as recorded) did along a log.
pub(super) struct Run {
    pub name: String,
    pub kind: String,
    pub replayed: bool,
    pub layout: bool,
    pub note: String,
    /// Reserved bytes after each event.
    pub reserved: Vec<u64>,
    /// Largest free block at each timeline sample.
    pub holes: Vec<Option<u64>>,
    /// A map at each moment.
    pub maps: Vec<MapData>,
    pub growth: BTreeMap<usize, [u64; 3]>,
    pub driver_allocs: Option<u64>,
    pub driver_frees: Option<u64>,
    pub mappings: Option<u64>,
}

impl Run {
    /// The allocator's line of the page.
    pub fn summary(self, peak_live: u64) -> AllocatorView {
        let peak_reserved = self.reserved.iter().copied().max().unwrap_or(0);
        AllocatorView {
            peak_op: self
                .reserved
                .iter()
                .position(|&r| r == peak_reserved)
                .unwrap_or(0),
            ratio: peak_reserved as f64 / peak_live.max(1) as f64,
            final_reserved: self.reserved.last().copied().unwrap_or(0),
            peak_reserved,
            name: self.name,
            kind: self.kind,
            replayed: self.replayed,
            layout: self.layout,
            note: self.note,
            driver_allocs: self.driver_allocs,
            driver_frees: self.driver_frees,
            mappings: self.mappings,
            growth: self.growth,
        }
    }
}

/// What a resource's map shows, and what it cannot tell: the answers of
/// [`Served::segments`] and [`Served::live_blocks`] per resource (the table
/// in `gpumem_capi::served`).
pub(super) fn layout_note(kind: ResourceKind) -> (bool, &'static str) {
    match kind {
        ResourceKind::Pool => (
            true,
            "segments: the pool's cuMemAlloc regions (an expandable region grows in place); \
             blocks as the pool rounded them; the rest of each region is free, cached memory",
        ),
        ResourceKind::Caching => (
            true,
            "segments: the caching pool's cuMemAlloc chunks and large blocks; blocks with the \
             bytes asked for; the rest of each chunk is free (class slots and rounding)",
        ),
        ResourceKind::Binning => (
            true,
            "segments: the inner pool's regions; blocks: the bins' blocks and the direct \
             allocations (a bin's chunk that holds no live block shows as free)",
        ),
        ResourceKind::Arena => (
            true,
            "one region taken whole up front; blocks as tracked by the command (the arena \
             cannot list them), at its granule size",
        ),
        ResourceKind::Virtual => (
            true,
            "segments: runs of physical pages mapped into the pool's virtual reservation; the \
             gaps between them are unmapped addresses; an extent mapped at two places (an \
             alias) shows at both, so mapped space can exceed reserved",
        ),
        ResourceKind::Cuda => (
            true,
            "every block is its own cuMemAlloc (nothing is cached), rounded to 256 bytes",
        ),
        ResourceKind::Async => (
            false,
            "CUDA's pool cannot list its memory: each live block is shown as its own \
             segment and where its free memory lies is unknown (the largest free block is \
             reserved minus used, an upper bound)",
        ),
    }
}

/// Replays `prep` through `alloc`, recording its reserve after every event,
/// its largest free block at `samples`, its map at `moments` (both sorted)
/// and what it did for each allocation.
pub(super) fn replay(
    alloc: &Allocator,
    spec: &AllocatorSpec,
    device: &Device,
    prep: &PreparedReplay,
    moments: &[usize],
    samples: &[usize],
) -> anyhow::Result<Run> {
    let served = alloc.served();
    let (layout, note) = layout_note(spec.conf.resource);
    let mut run = Run {
        name: spec.name.clone(),
        kind: spec.conf.resource.name().to_string(),
        replayed: true,
        layout,
        note: note.to_string(),
        reserved: Vec::with_capacity(prep.ops.len()),
        holes: Vec::with_capacity(samples.len()),
        maps: Vec::with_capacity(moments.len()),
        growth: BTreeMap::new(),
        driver_allocs: None,
        driver_frees: None,
        mappings: None,
    };
    let mut owner: HashMap<u64, usize> = HashMap::new();
    // Driver allocations and mappings so far; a vpool's from its cheap
    // counters (its driver_stats scans its pages).
    let counters = |s: &dyn Served| -> [u64; 2] {
        match s.virtual_pool() {
            Some(v) => {
                let (created, mapped) = v.driver_calls();
                [created, mapped]
            }
            None => [s.driver_stats().device_allocs, 0],
        }
    };
    let mut before = counters(served);
    let mut reserved_before = alloc.pool.reserved_bytes() as u64;
    let (mut next_moment, mut next_sample) = (0, 0);
    let mut step = |i: usize, block: DevicePtr| {
        let op = prep.ops[i];
        let reserved = alloc.pool.reserved_bytes() as u64;
        if op.alloc {
            owner.insert(block.0, i);
            let now = counters(served);
            let grew = reserved.saturating_sub(reserved_before);
            let calls = now[0] - before[0];
            let maps = now[1] - before[1];
            if grew > 0 || calls > 0 || maps > 0 {
                run.growth.insert(i, [calls, grew, maps]);
            }
            before = now;
        } else {
            owner.remove(&block.0);
            // Frees make no driver allocation; the counters move on.
            before = counters(served);
        }
        reserved_before = reserved;
        run.reserved.push(reserved);
        while samples.get(next_sample) == Some(&i) {
            run.holes.push(Some(served.largest_free_block() as u64));
            next_sample += 1;
        }
        while moments.get(next_moment) == Some(&i) {
            run.maps.push(map_of(served, reserved, &owner));
            next_moment += 1;
        }
    };
    run_replay(&*alloc.resource, device, prep, None, Some(&mut step))?;
    if !layout {
        // The largest free block of such an allocator is only a bound.
        run.holes.iter_mut().for_each(|h| *h = None);
    }
    let d = served.driver_stats();
    if d.segments.is_some() {
        run.driver_allocs = Some(d.device_allocs);
        run.driver_frees = Some(d.device_frees);
    }
    run.mappings = alloc.mappings_made();
    Ok(run)
}

/// An allocator's map now: its segments and live blocks, each block tied to
/// the event that allocated it (`owner`: address → event).
fn map_of(served: &dyn Served, reserved: u64, owner: &HashMap<u64, usize>) -> MapData {
    let mapped = served.virtual_pool().is_some();
    let segs: Vec<(u64, u64, u64)> = served
        .segments()
        .into_iter()
        .map(|s| {
            let flag = if mapped || served.is_expandable(s.address) {
                SEG_MAPPED
            } else {
                SEG_PLAIN
            };
            (s.address.0, s.size as u64, flag)
        })
        .collect();
    let blocks: Vec<(u64, u64, usize)> = served
        .live_blocks()
        .into_iter()
        .map(|(b, _)| {
            let op = owner.get(&b.address.0).copied().unwrap_or(usize::MAX);
            (b.address.0, b.size as u64, op)
        })
        .collect();
    let mut m = lay_out(segs, blocks);
    m.reserved = reserved;
    m.largest_free = Some(served.largest_free_block() as u64);
    m
}

/// Places `blocks` (address, size, event) in `segs` (address, size, flag),
/// both in any order, as [`MapData`] has them (addresses and block sizes
/// whole: the caller makes them relative). A block that starts outside
/// every segment gets a segment of its own flagged [`SEG_UNKNOWN`]; a block of no
/// known event (`usize::MAX`) is dropped: it is not the log's.
pub(super) fn lay_out(
    mut segs: Vec<(u64, u64, u64)>,
    mut blocks: Vec<(u64, u64, usize)>,
) -> MapData {
    segs.sort_unstable();
    blocks.sort_unstable();
    blocks.retain(|b| b.2 != usize::MAX);
    let mut out_segs: Vec<(u64, u64, u64)> = Vec::with_capacity(segs.len());
    let mut out_blocks = Vec::with_capacity(blocks.len() * 4);
    // The next segment to place, and (segment, its output index) of the
    // segment placed last.
    let mut s = 0;
    let mut placed: Option<(usize, usize)> = None;
    // (output segment, end) of the previous block.
    let mut cursor: Option<(usize, u64)> = None;
    for (addr, size, op) in blocks {
        while s < segs.len() && segs[s].0 + segs[s].1 <= addr {
            if placed.map(|p| p.0) != Some(s) {
                out_segs.push(segs[s]);
            }
            s += 1;
        }
        // Segments ending at or before `addr` are placed: `s` is the first
        // that ends after it. A block that starts in a segment belongs to it
        // (one that overran it would be the allocator's bug, drawn as is);
        // one that starts before it lies outside every segment.
        let inside = s < segs.len() && segs[s].0 <= addr;
        let seg_index = if !inside {
            out_segs.push((addr, size, SEG_UNKNOWN));
            out_segs.len() - 1
        } else if let Some((_, i)) = placed.filter(|p| p.0 == s) {
            i
        } else {
            out_segs.push(segs[s]);
            placed = Some((s, out_segs.len() - 1));
            out_segs.len() - 1
        };
        let start = match cursor {
            Some((i, end)) if i == seg_index && end <= addr => end,
            _ => out_segs[seg_index].0,
        };
        cursor = Some((seg_index, addr + size));
        out_blocks.extend_from_slice(&[
            seg_index as i64,
            (addr - start) as i64,
            size as i64,
            op as i64,
        ]);
    }
    for (i, seg) in segs.iter().enumerate().skip(s) {
        if placed.map(|p| p.0) != Some(i) {
            out_segs.push(*seg);
        }
    }
    MapData {
        reserved: 0,
        largest_free: None,
        segs: out_segs
            .into_iter()
            .flat_map(|(a, b, c)| [a, b, c])
            .collect(),
        blocks: out_blocks,
    }
}

/// The allocations the maps show, gathered into the page's block table.
#[derive(Debug, Default)]
pub(super) struct BlockRefs {
    ops: Vec<usize>,
}

impl BlockRefs {
    /// Notes that the block allocated at event `op` is shown.
    pub fn add(&mut self, op: usize) {
        self.ops.push(op);
    }

    /// The block table, in event order, and the stacks it refers to.
    pub fn finish(
        mut self,
        prep: &PreparedReplay,
        torch: Option<&TorchDetail>,
    ) -> (BlockTable, Stacks) {
        self.ops.sort_unstable();
        self.ops.dedup();
        // Each allocation's free: the next operation on its slot.
        let mut free_of = vec![None; prep.ops.len()];
        let mut open: Vec<Option<usize>> = vec![None; prep.slots];
        for (i, op) in prep.ops.iter().enumerate() {
            let slot = op.slot as usize;
            if op.alloc {
                open[slot] = Some(i);
            } else if let Some(a) = open[slot].take() {
                free_of[a] = Some(i);
            }
        }
        let mut table = BlockTable::default();
        let mut stacks = Stacks::default();
        let mut frame_ids: HashMap<String, u32> = HashMap::new();
        let mut stack_ids: HashMap<Vec<u32>, u32> = HashMap::new();
        for &op in &self.ops {
            let o = prep.ops[op];
            table.op.push(op);
            table.free.push(free_of[op]);
            table.size.push(o.size as u64);
            table.stream.push(o.stream);
            let frames = torch.and_then(|t| t.frames_of(op));
            let stack = frames.filter(|f| !f.is_empty()).map(|f| {
                let ids: Vec<u32> = f
                    .iter()
                    .map(|name| {
                        let n = frame_ids.len() as u32;
                        *frame_ids.entry(name.clone()).or_insert_with(|| {
                            stacks.frames.push(name.clone());
                            n
                        })
                    })
                    .collect();
                let n = stack_ids.len() as u32;
                *stack_ids.entry(ids.clone()).or_insert_with(|| {
                    stacks.stacks.push(ids);
                    n
                })
            });
            table.stack.push(stack);
        }
        (table, stacks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_extremes_in_order() {
        let b = Buckets::new(10, 3);
        assert_eq!((b.len, b.count), (4, 3));
        assert_eq!(b.sample_ops(), vec![3, 7, 9]);
        let (x, y) = b.minmax(&[5, 9, 1, 4, 0, 0, 7, 2, 3, 3]);
        assert_eq!(y, vec![9, 1, 0, 7, 3, 3]);
        assert_eq!(x, vec![0.0, 2.0, 4.0, 6.0, 8.0, 9.0]);
        let one = Buckets::new(3, 10);
        assert_eq!(one.len, 1);
        assert_eq!(one.minmax(&[1, 2, 3]), (vec![0.0, 1.0, 2.0], vec![1, 2, 3]));
    }

    #[test]
    fn blocks_are_placed_in_their_segments() {
        let segs = vec![
            (1000, 100, SEG_PLAIN),
            (100, 50, SEG_PLAIN),
            (5000, 10, SEG_MAPPED),
        ];
        let blocks = vec![
            (1010, 20, 3),
            (100, 10, 1),
            (1030, 5, 4),
            (120, 10, 2),
            (3000, 8, 7),
            (1, 1, usize::MAX),
        ];
        let m = lay_out(segs, blocks);
        assert_eq!(
            m.segs,
            vec![
                100,
                50,
                SEG_PLAIN,
                1000,
                100,
                SEG_PLAIN,
                3000,
                8,
                SEG_UNKNOWN,
                5000,
                10,
                SEG_MAPPED
            ]
        );
        assert_eq!(
            m.blocks,
            vec![0, 0, 10, 1, 0, 10, 10, 2, 1, 10, 20, 3, 1, 0, 5, 4, 2, 0, 8, 7]
        );
    }
}
