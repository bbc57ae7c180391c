//! Turning an RMM trace into a replayable operation sequence, and the
//! timeline of live and reserved memory along a replay.
//!
//! The trace is replayed on one thread in its global (file) order, whatever
//! threads made the calls. Each distinct trace stream maps to one stream of
//! ours, created before the clock starts. Trace pointers map to slots of a
//! pointer table (slots are reused as blocks are freed), so pointer reuse in
//! the trace is followed exactly. Rows the replay cannot follow are skipped and
//! counted: `allocate failure` rows, frees of pointers that are not live, and
//! zero-byte requests; a pointer handed out again while live leaves the earlier
//! block allocated (freed after the replay). A trace with nothing left to
//! replay is an error.
//!
//! [`load`] reads and prepares a trace once, from a file or from standard
//! input (`-`), before anything is timed.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context as _};

use gpumem::adaptor::LoggingAdaptor;

use gpumem::trace::{self, Action, TraceEvent, TraceReport};

use crate::allocators::Allocator;
use crate::workload::run_replay;
use gpumem::Device;

/// One replay operation: like a workload [`Op`](crate::workload::Op), plus the
/// stream it runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayOp {
    /// Index into the pointer table.
    pub slot: u32,
    /// Index into [`PreparedReplay::streams`].
    pub stream: u16,
    /// Bytes allocated (for frees: the size the block was allocated with).
    pub size: usize,
    /// Allocate (true) or free (false).
    pub alloc: bool,
}

/// A trace ready to replay.
#[derive(Debug, Clone, Default)]
pub struct PreparedReplay {
    /// The operations, in trace order.
    pub ops: Vec<ReplayOp>,
    /// For each operation, the index of its trace event.
    pub event_index: Vec<usize>,
    /// For each operation, its trace time in microseconds.
    pub time_us: Vec<u64>,
    /// Live bytes after each operation.
    pub live_after: Vec<u64>,
    /// Size of the pointer table.
    pub slots: usize,
    /// The distinct trace streams, in order of first use.
    pub streams: Vec<u64>,
    /// Highest live bytes.
    pub peak_live: usize,
    /// `allocate failure` rows skipped.
    pub skipped_failures: usize,
    /// Frees of pointers not live at that point, skipped.
    pub skipped_unknown_frees: usize,
    /// Zero-byte allocations and frees of null, skipped.
    pub skipped_zero: usize,
    /// What [`trace::check`] found.
    pub report: TraceReport,
}

/// Prepares `events` for replay (see the module documentation). An error when
/// no operation is left to replay.
pub fn prepare(events: &[TraceEvent]) -> anyhow::Result<PreparedReplay> {
    let mut p = PreparedReplay {
        report: trace::check(events)?,
        ..PreparedReplay::default()
    };
    let mut stream_index: HashMap<u64, u16> = HashMap::new();
    let mut ptr_slot: HashMap<u64, (u32, usize)> = HashMap::new();
    let mut free_slots: Vec<u32> = Vec::new();
    let mut live = 0u64;
    for (i, e) in events.iter().enumerate() {
        let alloc = match e.action {
            Action::AllocateFailure => {
                p.skipped_failures += 1;
                continue;
            }
            Action::Allocate if e.size == 0 => {
                p.skipped_zero += 1;
                continue;
            }
            Action::Free if e.ptr == 0 => {
                p.skipped_zero += 1;
                continue;
            }
            Action::Allocate => true,
            Action::Free => false,
        };
        let (slot, size) = if alloc {
            let slot = free_slots.pop().unwrap_or_else(|| {
                p.slots += 1;
                (p.slots - 1) as u32
            });
            // A live pointer handed out again: the earlier block stays
            // allocated (leaked) and the new one takes the pointer's name.
            ptr_slot.insert(e.ptr, (slot, e.size));
            live += e.size as u64;
            (slot, e.size)
        } else {
            match ptr_slot.remove(&e.ptr) {
                Some((slot, size)) => {
                    free_slots.push(slot);
                    live -= size as u64;
                    (slot, size)
                }
                None => {
                    p.skipped_unknown_frees += 1;
                    continue;
                }
            }
        };
        let n = stream_index.len();
        let stream = *stream_index.entry(e.stream).or_insert_with(|| {
            p.streams.push(e.stream);
            n as u16
        });
        if p.streams.len() > u16::MAX as usize {
            anyhow::bail!("trace uses more than {} streams", u16::MAX);
        }
        p.ops.push(ReplayOp {
            slot,
            stream,
            size,
            alloc,
        });
        p.event_index.push(i);
        p.time_us.push(e.time_us);
        p.live_after.push(live);
        p.peak_live = p.peak_live.max(live as usize);
    }
    if p.ops.is_empty() {
        if events.is_empty() {
            bail!("nothing to replay: no events (an empty log, or a header only)");
        }
        bail!(
            "nothing to replay: all {} events are skipped ({} failed allocations, {} frees of unknown pointers, {} zero-byte requests)",
            events.len(),
            p.skipped_failures,
            p.skipped_unknown_frees,
            p.skipped_zero
        );
    }
    Ok(p)
}

/// A trace read and prepared for replay.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Where it came from, for headings: the path, or `-` for standard input.
    pub path: PathBuf,
    /// Its file name (`stdin` for standard input), for records.
    pub name: String,
    /// The replay.
    pub prep: Arc<PreparedReplay>,
}

/// Reads the RMM log at `path` (`-`: standard input) and prepares it for
/// replay; errors name the path.
pub fn load(path: &Path) -> anyhow::Result<Trace> {
    let stdin = path == Path::new("-");
    let events = if stdin {
        trace::parse(io::stdin().lock())
    } else {
        trace::read_file(path)
    };
    let prep = events
        .map_err(anyhow::Error::new)
        .and_then(|events| prepare(&events))
        .with_context(|| {
            if stdin {
                "trace on standard input".to_string()
            } else {
                format!("trace {}", path.display())
            }
        })?;
    let name = if stdin {
        "stdin".to_string()
    } else {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string())
    };
    Ok(Trace {
        path: path.to_path_buf(),
        name,
        prep: Arc::new(prep),
    })
}

/// Live and reserved bytes after each operation of a replay through one
/// allocator, sampled at up to `max_points` evenly spaced operations (the
/// operation at the reserve peak included).
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// Operation index of each sample.
    pub op: Vec<usize>,
    /// Trace time of each sample, in microseconds from the first operation.
    pub time_us: Vec<u64>,
    /// Live bytes at each sample.
    pub live: Vec<u64>,
    /// Reserved bytes at each sample.
    pub reserved: Vec<u64>,
    /// Highest reserved bytes seen.
    pub peak_reserved: u64,
}

/// Replays `prep` through `alloc` (untimed), sampling its reserve.
pub fn timeline(
    alloc: &Allocator,
    device: &Device,
    prep: &PreparedReplay,
    max_points: usize,
) -> anyhow::Result<Timeline> {
    let n = prep.ops.len();
    let every = n.div_ceil(max_points.max(1)).max(1);
    let t0 = prep.time_us.first().copied().unwrap_or(0);
    let mut t = Timeline::default();
    let mut sample = |i: usize, _| {
        let reserved = alloc.pool.reserved_bytes() as u64;
        let is_peak = reserved > t.peak_reserved;
        t.peak_reserved = t.peak_reserved.max(reserved);
        if i.is_multiple_of(every) || i + 1 == n || is_peak {
            t.op.push(i);
            t.time_us.push(prep.time_us[i].saturating_sub(t0));
            t.live.push(prep.live_after[i]);
            t.reserved.push(reserved);
        }
    };
    run_replay(&*alloc.resource, device, prep, None, Some(&mut sample))?;
    Ok(t)
}

/// The log file for `alloc` when `--log path` was given for `count`
/// allocators: `path` itself for one allocator, else `stem.ALLOC.ext`.
pub fn log_path(path: &Path, alloc: &str, count: usize) -> PathBuf {
    if count <= 1 {
        return path.to_path_buf();
    }
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "replay".into());
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{alloc}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{alloc}"),
    };
    path.with_file_name(name)
}

/// Replays `prep` once more (untimed: logging costs a formatted line per
/// call) through a [`LoggingAdaptor`] in front of `alloc`, writing gpumem's
/// own RMM log of the replay to `path`. Returns the rows written.
pub fn write_log(
    alloc: &Allocator,
    device: &Device,
    prep: &PreparedReplay,
    path: &Path,
) -> anyhow::Result<usize> {
    let logger = LoggingAdaptor::new(alloc.resource.clone(), path)?;
    run_replay(&logger, device, prep, None, None)?;
    logger.flush()?;
    drop(logger);
    let rows = trace::read_file(path)
        .map_err(|e| anyhow::anyhow!("reading back {}: {e}", path.display()))?
        .len();
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_follows_pointer_reuse_streams_and_skips() {
        let log = "\
1,10:00:00.000001,allocate,0x1000,256,0x0
2,10:00:00.000002,allocate,0x2000,1024,0xdeadbeef
1,10:00:00.000003,allocate failure,0x0,1099511627776,0x0
2,10:00:00.000005,free,0x1000,256,0xdeadbeef
1,10:00:00.000006,allocate,0x1000,4096,0x0
3,10:00:00.000007,free,0x9999,64,0x1
1,10:00:00.000008,allocate,0x0,0,0x0
1,10:00:00.000009,free,0x1000,4096,0x0
";
        let p = prepare(&trace::parse_str(log).unwrap()).unwrap();
        assert_eq!(p.skipped_failures, 1);
        assert_eq!(p.skipped_unknown_frees, 1);
        assert_eq!(p.skipped_zero, 1);
        assert_eq!(p.ops.len(), 5);
        assert_eq!(p.streams, vec![0, 0xdeadbeef]);
        // Slot 0 is freed at op 2 and reused for the second 0x1000.
        assert_eq!(
            p.ops[2],
            ReplayOp {
                slot: 0,
                stream: 1,
                size: 256,
                alloc: false
            }
        );
        assert_eq!(
            p.ops[3],
            ReplayOp {
                slot: 0,
                stream: 0,
                size: 4096,
                alloc: true
            }
        );
        assert_eq!(
            p.ops[4],
            ReplayOp {
                slot: 0,
                stream: 0,
                size: 4096,
                alloc: false
            }
        );
        assert_eq!(p.slots, 2);
        assert_eq!(p.peak_live, 5120);
        assert_eq!(p.live_after, vec![256, 1280, 1024, 5120, 1024]);
        assert_eq!(p.event_index, vec![0, 1, 3, 4, 7]);
    }

    #[test]
    fn log_paths() {
        let p = Path::new("/tmp/out.csv");
        assert_eq!(log_path(p, "pool", 1), PathBuf::from("/tmp/out.csv"));
        assert_eq!(log_path(p, "pool", 2), PathBuf::from("/tmp/out.pool.csv"));
        assert_eq!(
            log_path(Path::new("log"), "cuda", 3),
            PathBuf::from("log.cuda")
        );
    }
}
