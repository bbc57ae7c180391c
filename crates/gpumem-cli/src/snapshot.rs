//! PyTorch memory snapshot → RMM log.
//!
//! `torch.cuda.memory._snapshot()` (written to disk by `_dump_snapshot` with
//! pickle) holds `device_traces`: one list per device of event dicts with
//! `action`, `addr`, `size`, `stream` and `time_us`. The program's own
//! requests are `alloc` and the free: `free_requested` when the program freed
//! the tensor, `free_completed` when the caching allocator took the block back
//! (later, if other streams still used it); older PyTorch wrote a single
//! `free`. `oom` is a failed allocation. The caching allocator's own traffic
//! (`segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`) and
//! `snapshot` markers are not requests and are skipped (counted).
//!
//! The RMM log gets one row per request: thread 0 (snapshots do not record
//! threads), the time of day of `time_us` (UTC), the action, the address, the
//! size and the stream.
//!
//! The pickle is checked by [`pickle_bounds`] before [`pickle_values`]
//! decodes it (serde-pickle cannot: it loses values that a snapshot shares),
//! so a hostile one (nested 100,000 deep, endless) is an error, not a crash.

use std::collections::BTreeMap;
use std::fmt;
use std::io::BufReader;
use std::path::Path;

use anyhow::{anyhow, bail, Context as _, Result};
use gpumem::trace::{self, Action, TraceEvent};

use crate::pickle_bounds::{self, Limits};
use crate::pickle_values::{self, Value};

/// Which snapshot event becomes the RMM `free` row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FreeOn {
    /// `free_requested`: when the program freed the tensor.
    Requested,
    /// `free_completed`: when the block became reusable (the default; it is
    /// when an allocator without cross-stream tracking could reuse it).
    Completed,
}

/// What a conversion found and wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConvertStats {
    /// The device whose trace was converted.
    pub device: usize,
    /// Snapshot events read for that device.
    pub events_in: usize,
    /// RMM rows written.
    pub rows: usize,
    /// Events skipped, by action.
    pub skipped: BTreeMap<String, usize>,
    /// What [`trace::check`] says about the rows written.
    pub report: trace::TraceReport,
}

impl fmt::Display for ConvertStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "device {}: {} snapshot events -> {} rows; {}",
            self.device, self.events_in, self.rows, self.report
        )?;
        if !self.skipped.is_empty() {
            let s: Vec<String> = self
                .skipped
                .iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect();
            write!(f, "; skipped {}", s.join(", "))?;
        }
        Ok(())
    }
}

/// The value under the string key `k` of a pickled dict (the last one, as
/// in Python, should the pickle set it twice).
pub fn key<'a>(d: &'a [(Value, Value)], k: &str) -> Option<&'a Value> {
    d.iter()
        .rev()
        .find(|(key, _)| key.as_str() == Some(k))
        .map(|(_, v)| v)
}

/// A pickled integer (or bool) as a `u64`, if it is one that fits.
pub fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::I64(i) => u64::try_from(*i).ok(),
        Value::Int(b) => u64::try_from(b).ok(),
        Value::Bool(b) => Some(u64::from(*b)),
        _ => None,
    }
}

/// A pickled list or tuple as a slice.
pub fn as_list(v: &Value) -> Option<&[Value]> {
    match v {
        Value::List(l) | Value::Tuple(l) => Some(l),
        _ => None,
    }
}

/// Reads a snapshot pickle (any protocol 0–5) into a pickle value, within
/// [`pickle_bounds`]' default limits.
pub fn read_pickle(bytes: &[u8]) -> Result<Value> {
    pickle_bounds::check(bytes, Limits::default()).context("not a readable pickle")?;
    parse_checked(bytes)
}

/// [`pickle_values::decode`] on bytes [`pickle_bounds`] has accepted.
fn parse_checked(bytes: &[u8]) -> Result<Value> {
    pickle_values::decode(bytes).map_err(|e| anyhow!("not a readable pickle: {e}"))
}

/// Reads a snapshot pickle from the file at `path`, or from standard input
/// for `-`, within [`pickle_bounds`]' default limits.
pub fn read_pickle_file(path: &Path) -> Result<Value> {
    let bytes = if path == Path::new("-") {
        pickle_bounds::read(std::io::stdin().lock(), Limits::default())
    } else {
        let file =
            std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
        pickle_bounds::read(BufReader::new(file), Limits::default())
    };
    let bytes = bytes.context("not a readable pickle")?;
    parse_checked(&bytes)
}

/// Converts a snapshot value to RMM events. `device`: which device's trace
/// (default: the only one with events; an error if several have events).
pub fn convert(
    snapshot: &Value,
    device: Option<usize>,
    free_on: FreeOn,
) -> Result<(Vec<TraceEvent>, ConvertStats)> {
    convert_traced(snapshot, device, free_on).map(|c| (c.events, c.stats))
}

/// What [`convert_traced`] makes: the RMM events, what the conversion found,
/// and where each event came from.
#[derive(Debug, Clone, Default)]
pub struct Converted {
    /// The RMM events, one per request.
    pub events: Vec<TraceEvent>,
    /// What the conversion found ([`ConvertStats::device`] is the device
    /// whose trace was read).
    pub stats: ConvertStats,
    /// For each event, the index of the snapshot event it came from in
    /// `device_traces[stats.device]` (the rest of that entry, such as its
    /// stack frames, is there).
    pub origin: Vec<usize>,
}

/// [`convert`], also saying which snapshot event each RMM event came from.
pub fn convert_traced(
    snapshot: &Value,
    device: Option<usize>,
    free_on: FreeOn,
) -> Result<Converted> {
    let Value::Dict(top) = snapshot else {
        bail!("the snapshot is not a dict (expected torch.cuda.memory._snapshot() output)");
    };
    let traces = key(top, "device_traces")
        .and_then(as_list)
        .context("the snapshot has no device_traces list (was it taken with torch.cuda.memory._record_memory_history enabled?)")?;
    let device = match device {
        Some(d) if d < traces.len() => d,
        Some(d) => bail!(
            "--device-index {d}: the snapshot has {} device traces",
            traces.len()
        ),
        None => {
            let busy: Vec<usize> = traces
                .iter()
                .enumerate()
                .filter(|(_, t)| as_list(t).is_some_and(|l| !l.is_empty()))
                .map(|(i, _)| i)
                .collect();
            match busy.as_slice() {
                [] => bail!("every device trace in the snapshot is empty"),
                [d] => *d,
                many => bail!("devices {many:?} all have events: choose one with --device-index"),
            }
        }
    };
    let list = as_list(&traces[device])
        .with_context(|| format!("device_traces[{device}] is not a list"))?;
    let mut stats = ConvertStats {
        device,
        events_in: list.len(),
        ..ConvertStats::default()
    };
    let mut out = Vec::new();
    let mut origin = Vec::new();
    for (i, e) in list.iter().enumerate() {
        let Value::Dict(d) = e else {
            bail!("device_traces[{device}][{i}] is not a dict");
        };
        let field = |name: &str| -> Result<u64> {
            key(d, name)
                .and_then(as_u64)
                .with_context(|| format!("device_traces[{device}][{i}]: no integer {name:?}"))
        };
        let Some(action) = key(d, "action").and_then(Value::as_str) else {
            bail!("device_traces[{device}][{i}]: no action string");
        };
        let action = match (action, free_on) {
            ("alloc", _) => Action::Allocate,
            ("free", _)
            | ("free_requested", FreeOn::Requested)
            | ("free_completed", FreeOn::Completed) => Action::Free,
            ("oom", _) => Action::AllocateFailure,
            (other, _) => {
                *stats.skipped.entry(other.to_string()).or_default() += 1;
                continue;
            }
        };
        let time_us = match key(d, "time_us").and_then(as_u64) {
            Some(t) => t % 86_400_000_000,
            None => i as u64,
        };
        out.push(TraceEvent {
            thread: 0,
            time_us,
            action,
            ptr: if action == Action::AllocateFailure {
                0
            } else {
                field("addr")?
            },
            size: field("size")? as usize,
            stream: key(d, "stream").and_then(as_u64).unwrap_or(0),
        });
        origin.push(i);
    }
    stats.rows = out.len();
    stats.report = trace::check(&out)?;
    Ok(Converted {
        events: out,
        stats,
        origin,
    })
}

/// Reads a snapshot pickle file (`-`: standard input) and writes its RMM log.
pub fn convert_file(
    input: &Path,
    output: &Path,
    device: Option<usize>,
    free_on: FreeOn,
) -> Result<ConvertStats> {
    let value = read_pickle_file(input).with_context(|| input.display().to_string())?;
    let (events, stats) = convert(&value, device, free_on)?;
    let file =
        std::fs::File::create(output).with_context(|| format!("creating {}", output.display()))?;
    let mut w = std::io::BufWriter::new(file);
    trace::write_csv(&mut w, &events)
        .and_then(|()| std::io::Write::flush(&mut w))
        .with_context(|| format!("writing {}", output.display()))?;
    Ok(stats)
}
