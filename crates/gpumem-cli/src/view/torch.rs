//! What a PyTorch memory snapshot adds to a view: the stack of each
//! allocation, and PyTorch's own caching allocator as the snapshot recorded
//! it.
//!
//! PyTorch's memory over the log is rebuilt from the snapshot alone: its
//! segments are the ranges of the trace's `segment_alloc` / `segment_free`
//! events (whole `cudaMalloc` segments) and `segment_map` / `segment_unmap`
//! events (pieces of expandable segments), starting from the segments that
//! existed when the trace began: the snapshot's final `segments` list with
//! the trace's segment events undone, last first. Its blocks are the live
//! requests at the addresses PyTorch handed out, with the sizes the trace
//! records. Nothing is replayed: this is the job's own allocator.

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context as _, Result};

use super::record::{lay_out, Run};
use super::{Input, MapData, SEG_MAPPED, SEG_PLAIN};
use crate::pickle_values::Value;
use crate::replay::PreparedReplay;
use crate::snapshot::{as_list, as_u64, key, Converted};

/// The most frames kept of one stack (innermost first).
const MAX_FRAMES: usize = 64;

/// A change to PyTorch's segments, from one trace event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SegmentEvent {
    /// The trace event's index in the device's trace.
    index: usize,
    /// Memory taken (`segment_alloc`, `segment_map`) or given back.
    add: bool,
    addr: u64,
    size: u64,
    flag: u64,
}

/// A snapshot's stacks and segments.
#[derive(Debug, Clone, Default)]
pub struct TorchDetail {
    /// Every distinct frame, as `function (file:line)`.
    frames: Vec<String>,
    /// Every distinct stack, innermost frame first.
    stacks: Vec<Vec<u32>>,
    /// For each RMM event of the conversion, its stack.
    row_stack: Vec<Option<u32>>,
    /// For each RMM event, the trace event it came from.
    row_origin: Vec<usize>,
    /// For each replayed event (after [`TorchDetail::align`]), its stack.
    op_stack: Vec<Option<u32>>,
    /// The trace's segment events, in order.
    segment_events: Vec<SegmentEvent>,
    /// The snapshot's final segments (address, size, flag), if it lists them.
    final_segments: Option<Vec<(u64, u64, u64)>>,
    /// PyTorch's allocator along the log, after [`TorchDetail::align`];
    /// `None` when the snapshot says nothing of its segments.
    pub recorded: Option<Recorded>,
}

/// A list of frames, as strings.
fn frames_of(list: &[Value]) -> Vec<String> {
    list.iter()
        .take(MAX_FRAMES)
        .filter_map(|f| {
            let Value::Dict(f) = f else { return None };
            let text = |k: &str| key(f, k).and_then(Value::as_str).unwrap_or("?");
            let line = key(f, "line").and_then(as_u64).unwrap_or(0);
            Some(format!("{} ({}:{line})", text("name"), text("filename")))
        })
        .collect()
}

impl TorchDetail {
    /// Reads the stacks and segment events of the device `converted` was
    /// made from.
    pub fn read(snapshot: &Value, converted: &Converted) -> Result<Self> {
        let Value::Dict(top) = snapshot else {
            anyhow::bail!("the snapshot is not a dict");
        };
        let device = converted.stats.device;
        let list = key(top, "device_traces")
            .and_then(as_list)
            .and_then(|t| t.get(device))
            .and_then(as_list)
            .context("no device trace")?;
        let mut detail = TorchDetail {
            row_origin: converted.origin.clone(),
            ..TorchDetail::default()
        };
        let mut frame_ids: HashMap<String, u32> = HashMap::new();
        let mut stack_ids: HashMap<Vec<u32>, u32> = HashMap::new();
        // PyTorch shares one list of frames between the events with that
        // stack: each list is read once (by its address while the snapshot
        // is held).
        let mut by_list: HashMap<*const Value, Option<u32>> = HashMap::new();
        for &i in &converted.origin {
            let frames = match list.get(i) {
                Some(Value::Dict(d)) => key(d, "frames").and_then(as_list),
                _ => None,
            };
            let Some(frames) = frames else {
                detail.row_stack.push(None);
                continue;
            };
            let id = *by_list.entry(frames.as_ptr()).or_insert_with(|| {
                let frames = frames_of(frames);
                if frames.is_empty() {
                    return None;
                }
                let ids: Vec<u32> = frames
                    .into_iter()
                    .map(|f| {
                        let n = frame_ids.len() as u32;
                        *frame_ids.entry(f.clone()).or_insert_with(|| {
                            detail.frames.push(f);
                            n
                        })
                    })
                    .collect();
                let n = stack_ids.len() as u32;
                Some(*stack_ids.entry(ids.clone()).or_insert_with(|| {
                    detail.stacks.push(ids);
                    n
                }))
            });
            detail.row_stack.push(id);
        }
        for (index, e) in list.iter().enumerate() {
            let Value::Dict(d) = e else { continue };
            let (add, flag) = match key(d, "action").and_then(Value::as_str) {
                Some("segment_alloc") => (true, SEG_PLAIN),
                Some("segment_free") => (false, SEG_PLAIN),
                Some("segment_map") => (true, SEG_MAPPED),
                Some("segment_unmap") => (false, SEG_MAPPED),
                _ => continue,
            };
            let (Some(addr), Some(size)) = (
                key(d, "addr").and_then(as_u64),
                key(d, "size").and_then(as_u64),
            ) else {
                continue;
            };
            detail.segment_events.push(SegmentEvent {
                index,
                add,
                addr,
                size,
                flag,
            });
        }
        if let Some(segs) = key(top, "segments").and_then(as_list) {
            let mut out = Vec::new();
            for s in segs {
                let Value::Dict(s) = s else { continue };
                let on_device = key(s, "device")
                    .and_then(as_u64)
                    .is_none_or(|d| d == device as u64);
                let (Some(addr), Some(size)) = (
                    key(s, "address").and_then(as_u64),
                    key(s, "total_size").and_then(as_u64),
                ) else {
                    continue;
                };
                let expandable = matches!(key(s, "is_expandable"), Some(Value::Bool(true)));
                if on_device && size > 0 {
                    out.push((addr, size, if expandable { SEG_MAPPED } else { SEG_PLAIN }));
                }
            }
            detail.final_segments = Some(out);
        }
        Ok(detail)
    }

    /// Ties the stacks and segment events to the replayed events of `prep`
    /// (made from the conversion's events).
    pub fn align(mut self, prep: &PreparedReplay) -> Self {
        let origin: Vec<usize> = prep
            .event_index
            .iter()
            .map(|&e| self.row_origin[e])
            .collect();
        self.op_stack = prep
            .event_index
            .iter()
            .map(|&e| self.row_stack.get(e).copied().flatten())
            .collect();
        if self.segment_events.is_empty() && self.final_segments.is_none() {
            return self;
        }
        // Before which replayed event each segment event happened.
        let changes = self
            .segment_events
            .iter()
            .map(|s| (origin.partition_point(|&o| o < s.index), *s))
            .collect();
        // The segments when the trace began: the final ones with every
        // segment event undone, last first.
        let mut segs = Segments::default();
        for &(a, s, f) in self.final_segments.iter().flatten() {
            segs.add(a, s, f);
        }
        for e in self.segment_events.iter().rev() {
            if e.add {
                segs.remove(e.addr, e.size);
            } else {
                segs.add(e.addr, e.size, e.flag);
            }
        }
        self.recorded = Some(Recorded {
            initial: segs,
            changes,
            from_list: self.final_segments.is_some(),
        });
        self
    }

    /// The stack of the allocation at replayed event `op`, innermost frame
    /// first, if the snapshot has one.
    pub fn frames_of(&self, op: usize) -> Option<Vec<String>> {
        let id = self.op_stack.get(op).copied().flatten()?;
        Some(
            self.stacks[id as usize]
                .iter()
                .map(|&f| self.frames[f as usize].clone())
                .collect(),
        )
    }
}

/// Address ranges held, each with its flag; pieces of mapped memory that
/// touch are one range.
#[derive(Debug, Clone, Default)]
struct Segments {
    ranges: BTreeMap<u64, (u64, u64)>,
    bytes: u64,
}

impl Segments {
    fn add(&mut self, addr: u64, size: u64, flag: u64) {
        if size == 0 {
            return;
        }
        // A range over memory already held (a snapshot that disagrees with
        // itself) replaces it.
        self.remove(addr, size);
        let (mut start, mut len) = (addr, size);
        if flag == SEG_MAPPED {
            if let Some((&a, &(s, f))) = self.ranges.range(..addr).next_back() {
                if f == SEG_MAPPED && a + s == addr {
                    self.ranges.remove(&a);
                    start = a;
                    len += s;
                }
            }
            if let Some(&(s, f)) = self.ranges.get(&(addr + size)) {
                if f == SEG_MAPPED {
                    self.ranges.remove(&(addr + size));
                    len += s;
                }
            }
        }
        self.ranges.insert(start, (len, flag));
        self.bytes += size;
    }

    fn remove(&mut self, addr: u64, size: u64) {
        let end = addr.saturating_add(size);
        let overlapping: Vec<(u64, (u64, u64))> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|(&a, &(s, _))| a + s > addr)
            .map(|(&a, &v)| (a, v))
            .collect();
        for (a, (s, f)) in overlapping {
            self.ranges.remove(&a);
            let (lo, hi) = (a.max(addr), (a + s).min(end));
            self.bytes -= hi - lo;
            if a < addr {
                self.ranges.insert(a, (addr - a, f));
            }
            if a + s > end {
                self.ranges.insert(end, (a + s - end, f));
            }
        }
    }

    fn list(&self) -> Vec<(u64, u64, u64)> {
        self.ranges.iter().map(|(&a, &(s, f))| (a, s, f)).collect()
    }
}

/// PyTorch's allocator along the log, as the snapshot recorded it.
#[derive(Debug, Clone)]
pub struct Recorded {
    initial: Segments,
    /// (before which replayed event, change), in order.
    changes: Vec<(usize, SegmentEvent)>,
    /// Whether the snapshot listed its final segments (else those that
    /// existed before the trace and outlived it are unknown).
    from_list: bool,
}

/// The largest stretch of `segs` (address, size, flag) that no block of
/// `live` (address → (size, event)) covers.
fn largest_hole(segs: &Segments, live: &BTreeMap<u64, (u64, usize)>) -> u64 {
    let mut best = 0;
    for (&a, &(s, _)) in &segs.ranges {
        let end = a + s;
        let mut at = a;
        for (&b, &(bs, _)) in live.range(a..end) {
            best = best.max(b.saturating_sub(at));
            at = at.max(b + bs);
        }
        best = best.max(end.saturating_sub(at));
    }
    best
}

impl Recorded {
    /// The event at which PyTorch's reserve first peaked, over `ops` events.
    pub(super) fn peak_op(&self, ops: usize) -> usize {
        let reserved = self.walk(ops, None, &[], &[]).reserved;
        let peak = reserved.iter().copied().max().unwrap_or(0);
        reserved.iter().position(|&r| r == peak).unwrap_or(0)
    }

    /// PyTorch's allocator along `input` as a [`Run`]: its reserve after
    /// each event, its largest hole at `samples`, its maps at `moments`.
    pub(super) fn replay(&self, input: &Input, moments: &[usize], samples: &[usize]) -> Run {
        self.walk(input.prep.ops.len(), Some(input), moments, samples)
    }

    fn walk(&self, ops: usize, input: Option<&Input>, moments: &[usize], samples: &[usize]) -> Run {
        let mut run = Run {
            name: "pytorch (recorded)".into(),
            kind: "recorded".into(),
            replayed: false,
            layout: true,
            note: format!(
                "PyTorch's own caching allocator, as the snapshot recorded it (not replayed): \
                 segments from the trace's segment_alloc/free and segment_map/unmap events{}; \
                 blocks at the addresses PyTorch handed out, with the sizes the trace records; \
                 driver calls are the segment events in the trace",
                if self.from_list {
                    ", from the segments that existed when the trace began"
                } else {
                    " (the snapshot lists no segments: those older than the trace and \
                     never freed in it are missing, their blocks marked as outside any segment)"
                }
            ),
            reserved: Vec::with_capacity(ops),
            holes: Vec::new(),
            maps: Vec::new(),
            growth: BTreeMap::new(),
            driver_allocs: Some(self.changes.iter().filter(|c| c.1.add).count() as u64),
            driver_frees: Some(self.changes.iter().filter(|c| !c.1.add).count() as u64),
            mappings: None,
        };
        let mut segs = self.initial.clone();
        let mut live: BTreeMap<u64, (u64, usize)> = BTreeMap::new();
        let mut c = 0;
        let (mut next_moment, mut next_sample) = (0, 0);
        for i in 0..ops {
            let (mut calls, before) = (0, segs.bytes);
            while let Some((_, e)) = self.changes.get(c).filter(|(pos, _)| *pos <= i) {
                if e.add {
                    segs.add(e.addr, e.size, e.flag);
                    calls += 1;
                } else {
                    segs.remove(e.addr, e.size);
                }
                c += 1;
            }
            if let Some(input) = input {
                let prep = &input.prep;
                let op = prep.ops[i];
                let addr = input.events[prep.event_index[i]].ptr;
                if op.alloc {
                    live.insert(addr, (op.size as u64, i));
                    let grew = segs.bytes.saturating_sub(before);
                    if calls > 0 || grew > 0 {
                        run.growth.insert(i, [calls, grew, 0]);
                    }
                } else {
                    live.remove(&addr);
                }
            }
            run.reserved.push(segs.bytes);
            while samples.get(next_sample) == Some(&i) {
                run.holes.push(Some(largest_hole(&segs, &live)));
                next_sample += 1;
            }
            while moments.get(next_moment) == Some(&i) {
                let blocks = live.iter().map(|(&a, &(s, op))| (a, s, op)).collect();
                let mut m: MapData = lay_out(segs.list(), blocks);
                m.reserved = segs.bytes;
                m.largest_free = Some(largest_hole(&segs, &live));
                run.maps.push(m);
                next_moment += 1;
            }
        }
        run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_add_merge_and_split() {
        let mut s = Segments::default();
        s.add(100, 50, SEG_PLAIN);
        s.add(200, 100, SEG_MAPPED);
        s.add(300, 100, SEG_MAPPED);
        assert_eq!(s.list(), vec![(100, 50, SEG_PLAIN), (200, 200, SEG_MAPPED)]);
        assert_eq!(s.bytes, 250);
        s.remove(250, 100);
        assert_eq!(
            s.list(),
            vec![
                (100, 50, SEG_PLAIN),
                (200, 50, SEG_MAPPED),
                (350, 50, SEG_MAPPED)
            ]
        );
        assert_eq!(s.bytes, 150);
        s.remove(0, 1000);
        assert!(s.list().is_empty());
        assert_eq!(s.bytes, 0);
    }

    #[test]
    fn holes_are_the_gaps_between_blocks() {
        let mut s = Segments::default();
        s.add(0, 100, SEG_PLAIN);
        s.add(1000, 10, SEG_PLAIN);
        let live = BTreeMap::from([(10, (20, 0)), (60, (10, 1))]);
        // Gaps: 0..10, 30..60, 70..100, and the whole second segment.
        assert_eq!(largest_hole(&s, &live), 30);
    }
}
