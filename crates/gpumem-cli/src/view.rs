//! `gpumem view`: one self-contained HTML page that shows why a job holds
//! more memory than it uses, and which allocator or setting would hold less.
//!
//! The input is a log of allocations: an RMM log, a `GPUMEM_CONF=log=FILE`
//! recording (the same format), or a PyTorch memory snapshot pickle
//! (`torch.cuda.memory._dump_snapshot`, read as `gpumem convert-snapshot`
//! reads it). Its requests are replayed through each allocator named with
//! `--alloc` (the names of `gpumem replay` and `gpumem plot`), on the
//! simulated device unless `--device cuda` says otherwise, twice each: once
//! to find the allocator's reserve peak, once to record what the page shows.
//!
//! The page holds:
//! - the timeline: live bytes and each allocator's reserved bytes after every
//!   event, downsampled to [`TIMELINE_BUCKETS`] buckets of consecutive events,
//!   each kept as its lowest and highest value (in the order they came), so
//!   no peak is lost at any zoom;
//! - below it, each allocator's reserved/live ratio and its largest free
//!   block ([`gpumem::resource::Introspect::largest_free_block`]) at the last
//!   event of each bucket;
//! - memory maps at a bounded set of moments ([`choose_moments`]): each
//!   allocator's segments ([`gpumem::resource::Introspect::segments`]) and
//!   live blocks ([`gpumem::resource::Introspect::live_blocks`]) in full
//!   detail, each block tied to the event that allocated it, the one that
//!   freed it, its stream, its stack (PyTorch snapshots) and what the
//!   allocator did to serve it (its reserve and driver calls across that
//!   one allocation); a click on the timeline snaps to the nearest moment;
//! - for a PyTorch snapshot, PyTorch's own caching allocator beside the
//!   replays ([`torch`]): its segments as the snapshot's segment events and
//!   final segment list give them, with the blocks at the addresses PyTorch
//!   handed out;
//! - a table of each allocator's peak reserved, ratio and driver calls.
//!
//! The data travel as JSON inside the page; the page's script, style and the
//! vendored chart library (`assets/view/`, see [`render`]) are compiled into
//! the binary, so the page needs no network.

mod page;
mod record;
pub mod torch;

use std::collections::BTreeMap;
use std::io::{BufRead as _, Read as _};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use gpumem::trace::{self, TraceEvent};
use gpumem::Device;
use serde::Serialize;

use crate::allocators::{self, AllocatorSpec};
use crate::replay::{self, PreparedReplay};
use crate::snapshot::{self, FreeOn};

pub use page::{render, UPLOT_VERSION};

/// The allocators a view shows when `--alloc` is not given: the two pools
/// gpumem recommends and the caching allocator that mirrors PyTorch's.
pub const DEFAULT_ALLOCATORS: &[&str] = &["pool", "vpool", "caching"];

/// Evenly spaced map moments when `--moments` is not given.
pub const DEFAULT_MOMENTS: usize = 100;

/// The most evenly spaced map moments `--moments` accepts.
pub const MAX_MOMENTS: usize = 1000;

/// Buckets of consecutive events the timeline keeps at most (two points
/// each, the lowest and highest value in the bucket).
pub const TIMELINE_BUCKETS: usize = 4096;

/// Version of the page's data layout (`format` in the embedded JSON).
pub const DATA_FORMAT: u32 = 1;

/// How to read the input and how many map moments to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ViewOptions {
    /// Evenly spaced map moments, besides the key ones (0 to [`MAX_MOMENTS`]).
    pub moments: usize,
    /// PyTorch snapshots: which device's trace (default: the only one with
    /// events).
    pub device_index: Option<usize>,
    /// PyTorch snapshots: which event is the free.
    pub free_on: FreeOn,
}

impl Default for ViewOptions {
    fn default() -> Self {
        Self {
            moments: DEFAULT_MOMENTS,
            device_index: None,
            free_on: FreeOn::Completed,
        }
    }
}

/// What kind of file the input was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// An RMM log (CSV), RMM's or gpumem's own `log=` recording.
    RmmLog,
    /// A PyTorch memory snapshot (pickle).
    PytorchSnapshot,
}

/// An input read and prepared for replay.
#[derive(Debug, Clone)]
pub struct Input {
    /// Where it came from (`-`: standard input).
    pub path: PathBuf,
    /// Its file name, for the title.
    pub name: String,
    /// What it was.
    pub kind: SourceKind,
    /// The requests to replay.
    pub prep: PreparedReplay,
    /// The RMM events the requests came from (their addresses are the
    /// traced program's).
    pub events: Vec<TraceEvent>,
    /// PyTorch snapshots: stacks and PyTorch's own segments.
    pub torch: Option<torch::TorchDetail>,
}

/// Whether a file whose first byte is `first` is a pickle: protocol 2 and up
/// begin with the PROTO opcode (0x80). Older protocols are recognised by the
/// file's extension only.
fn looks_like_pickle(first: Option<u8>, path: &Path) -> bool {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    first == Some(0x80) || matches!(ext.as_str(), "pickle" | "pkl")
}

/// Reads the log or snapshot at `path` (`-`: standard input), telling the
/// two apart by their first byte, and prepares it for replay. Errors name the
/// path and say what was expected.
pub fn load(path: &Path, opts: &ViewOptions) -> Result<Input> {
    let stdin = path == Path::new("-");
    let shown = if stdin {
        "standard input".to_string()
    } else {
        path.display().to_string()
    };
    // The first byte tells a pickle from a CSV log; the input is then read
    // by the reader of its kind, within that reader's limits.
    let first = if stdin {
        // Peeked, not taken: standard input's buffer keeps it for the reader.
        std::io::stdin()
            .lock()
            .fill_buf()
            .context("reading standard input")?
            .first()
            .copied()
    } else {
        if path.is_dir() {
            bail!("{shown} is a directory, not a log or a snapshot");
        }
        let mut f = std::fs::File::open(path).with_context(|| format!("cannot read {shown}"))?;
        let mut byte = [0u8; 1];
        let n = f
            .read(&mut byte)
            .with_context(|| format!("cannot read {shown}"))?;
        byte.get(..n).and_then(|b| b.first()).copied()
    };
    let name = if stdin {
        "stdin".to_string()
    } else {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| shown.clone())
    };
    let pickle = looks_like_pickle(first, path);
    let (kind, events, torch) = if pickle {
        // `-` is standard input here too.
        let value = snapshot::read_pickle_file(path)
            .with_context(|| format!("{shown}: a PyTorch snapshot was expected"))?;
        let converted = snapshot::convert_traced(&value, opts.device_index, opts.free_on)
            .with_context(|| format!("{shown}: not a usable PyTorch snapshot"))?;
        let detail = torch::TorchDetail::read(&value, &converted)
            .with_context(|| format!("{shown}: reading its stacks and segments"))?;
        (SourceKind::PytorchSnapshot, converted.events, Some(detail))
    } else {
        let events = if stdin {
            trace::parse(std::io::stdin().lock())
        } else {
            trace::read_file(path)
        }
        .with_context(|| {
            format!(
                "{shown}: not an RMM log (Thread,Time,Action,Pointer,Size,Stream) nor a PyTorch \
                 snapshot pickle"
            )
        })?;
        (SourceKind::RmmLog, events, None)
    };
    let prep = replay::prepare(&events).with_context(|| shown.clone())?;
    let torch = torch.map(|t| t.align(&prep));
    Ok(Input {
        path: path.to_path_buf(),
        name,
        kind,
        prep,
        events,
        torch,
    })
}

/// The `--alloc` list of a view: the given names (see
/// [`allocators::select`]), or [`DEFAULT_ALLOCATORS`] when none is given.
pub fn select(list: &[String]) -> Result<Vec<AllocatorSpec>> {
    if list.is_empty() {
        let defaults: Vec<String> = DEFAULT_ALLOCATORS.iter().map(|s| s.to_string()).collect();
        return allocators::select(&defaults);
    }
    allocators::select(list)
}

/// The moments maps are kept at: `evenly` evenly spaced events (the last
/// one is the end of the log) and the key ones given (peaks), each with why
/// it was chosen, in event order, without duplicates.
pub fn choose_moments(
    ops: usize,
    evenly: usize,
    keys: &[(usize, String)],
) -> Vec<(usize, Vec<String>)> {
    let mut at: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    if ops == 0 {
        return Vec::new();
    }
    for j in 1..=evenly {
        let op = (j * ops / evenly).saturating_sub(1);
        at.entry(op).or_default();
    }
    for (op, why) in keys {
        at.entry((*op).min(ops - 1)).or_default().push(why.clone());
    }
    at.entry(ops - 1).or_default().push("end of the log".into());
    at.into_iter().collect()
}

/// Everything the page shows, as it travels in the page (JSON).
#[derive(Debug, Clone, Serialize)]
pub struct ViewData {
    /// [`DATA_FORMAT`].
    pub format: u32,
    /// The page's title.
    pub title: String,
    /// The input.
    pub source: Source,
    /// The device the replays ran on, in words.
    pub device: String,
    /// Highest live bytes (requested, as the log has them).
    pub peak_live: u64,
    /// The event at which they were first reached.
    pub peak_live_op: usize,
    /// The allocators, replayed ones first, in `--alloc` order.
    pub allocators: Vec<AllocatorView>,
    /// Live and reserved bytes along the log.
    pub timeline: TimelineData,
    /// The moments with maps, in event order.
    pub moments: Vec<Moment>,
    /// The blocks the maps show, by the event that allocated them.
    pub blocks: BlockTable,
    /// Stack traces of the blocks (PyTorch snapshots), else empty.
    pub stacks: Stacks,
}

/// The input, as the page describes it.
#[derive(Debug, Clone, Serialize)]
pub struct Source {
    /// The path given.
    pub path: String,
    /// Its file name.
    pub name: String,
    /// What it was.
    pub kind: SourceKind,
    /// Events replayed (the page's "events" count these).
    pub ops: usize,
    /// Rows (RMM events) read.
    pub rows: usize,
    /// What [`trace::check`] said of the rows.
    pub report: String,
    /// Rows skipped: failed allocations, frees of unknown pointers,
    /// zero-byte requests.
    pub skipped: [usize; 3],
    /// The distinct streams, as the log writes them (hex).
    pub streams: Vec<String>,
    /// Whether the blocks carry stack traces.
    pub has_stacks: bool,
}

/// One allocator (or PyTorch's own, recorded) as the page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct AllocatorView {
    /// Its `--alloc` name, or `pytorch (recorded)`.
    pub name: String,
    /// `GPUMEM_CONF`'s resource name, or `recorded`.
    pub kind: String,
    /// Whether its memory was replayed here (false: recorded by PyTorch).
    pub replayed: bool,
    /// Whether its maps place free memory truthfully (false: the allocator
    /// cannot say where its free memory lies; only its blocks are shown).
    pub layout: bool,
    /// What its segments and blocks are, and what it cannot tell.
    pub note: String,
    /// Highest reserved bytes along the log.
    pub peak_reserved: u64,
    /// The event at which they were first reached.
    pub peak_op: usize,
    /// Peak reserved over peak live.
    pub ratio: f64,
    /// Reserved bytes after the last event.
    pub final_reserved: u64,
    /// Driver allocation calls over the replay, where known.
    pub driver_allocs: Option<u64>,
    /// Driver free calls over the replay, where known.
    pub driver_frees: Option<u64>,
    /// `vpool`: `cuMemMap` calls over the replay.
    pub mappings: Option<u64>,
    /// For each allocation after which the allocator held more or called the
    /// driver: event → [driver allocations, reserved bytes added, mappings
    /// made]. Every other allocation was served from memory already held.
    pub growth: BTreeMap<usize, [u64; 3]>,
}

/// The timeline, downsampled (see the module documentation).
#[derive(Debug, Clone, Default, Serialize)]
pub struct TimelineData {
    /// Events per bucket (1: every event is a point).
    pub bucket: usize,
    /// The x of each point: the event index (fractional inside a bucket).
    pub x: Vec<f64>,
    /// Trace time of each point, in milliseconds from the first event.
    pub time_ms: Vec<f64>,
    /// Live bytes at each point.
    pub live: Vec<u64>,
    /// Each allocator's reserved bytes at each point.
    pub reserved: Vec<Vec<u64>>,
    /// The events the ratio and holes are sampled at (each bucket's last).
    pub at: Vec<usize>,
    /// Each allocator's reserved over live bytes at those events (`None`
    /// when nothing is live).
    pub ratio: Vec<Vec<Option<f64>>>,
    /// Each allocator's largest free block at those events (`None` where it
    /// cannot say).
    pub hole: Vec<Vec<Option<u64>>>,
}

/// A moment with maps.
#[derive(Debug, Clone, Serialize)]
pub struct Moment {
    /// The event after which the maps were taken.
    pub op: usize,
    /// Its trace time, in milliseconds from the first event.
    pub time_ms: f64,
    /// Live bytes then.
    pub live: u64,
    /// Why this moment was chosen (empty: one of the evenly spaced).
    pub why: Vec<String>,
    /// Each allocator's map, in [`ViewData::allocators`] order.
    pub maps: Vec<MapData>,
}

/// Segment flag: an ordinary segment (one driver allocation).
pub const SEG_PLAIN: u64 = 0;
/// Segment flag: memory mapped in pieces into a virtual range (vpool's runs
/// of mapped pages, expandable segments); the gaps between such segments
/// are unmapped.
pub const SEG_MAPPED: u64 = 1;
/// Segment flag: not a segment the allocator reported: it stands for the
/// unknown memory under a block found outside every reported segment.
pub const SEG_UNKNOWN: u64 = 2;

/// One allocator's memory at a moment.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MapData {
    /// Reserved bytes.
    pub reserved: u64,
    /// Its largest free block, where it can say.
    pub largest_free: Option<u64>,
    /// Segments in address order, flat: the gap from the end of the
    /// previous segment (for the first, its address), size, flag
    /// ([`SEG_PLAIN`], [`SEG_MAPPED`], [`SEG_UNKNOWN`]).
    pub segs: Vec<u64>,
    /// Live blocks in address order, flat: segment index, gap from the end
    /// of the previous block in the segment (or the segment's start), the
    /// size the allocator gave it less the size asked for (in
    /// [`BlockTable::size`]: short numbers, mostly 0 or a rounding), the
    /// event that allocated it.
    pub blocks: Vec<i64>,
}

/// The blocks the maps show, one column per field, in event order.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BlockTable {
    /// The event that allocated the block.
    pub op: Vec<usize>,
    /// The event that freed it (`None`: never freed in the log).
    pub free: Vec<Option<usize>>,
    /// Bytes asked for.
    pub size: Vec<u64>,
    /// Its stream (index into [`Source::streams`]).
    pub stream: Vec<u16>,
    /// Its stack (index into [`Stacks::stacks`]), where the log has one.
    pub stack: Vec<Option<u32>>,
}

/// Stack traces, frames shared.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stacks {
    /// Each frame, as `function (file:line)`.
    pub frames: Vec<String>,
    /// Each stack, innermost frame first, as indices into `frames`.
    pub stacks: Vec<Vec<u32>>,
}

/// Replays `input` through `specs` on `device` and gathers what the page
/// shows. `progress` is told each allocator's name as its replays start.
pub fn build(
    input: &Input,
    specs: &[AllocatorSpec],
    device: &Device,
    device_text: &str,
    opts: &ViewOptions,
    mut progress: impl FnMut(&str),
) -> Result<ViewData> {
    if opts.moments > MAX_MOMENTS {
        bail!("--moments {}: at most {MAX_MOMENTS}", opts.moments);
    }
    let prep = &input.prep;
    let n = prep.ops.len();
    let peak_live_op = prep
        .live_after
        .iter()
        .position(|&l| l as usize == prep.peak_live)
        .unwrap_or(0);
    // First pass: each allocator's reserve peak, so that the maps can be
    // taken there in the second.
    let mut keys = vec![(peak_live_op, "peak live".to_string())];
    for s in specs {
        progress(&s.name);
        let alloc = s
            .build(device)
            .with_context(|| format!("building {}", s.name))?;
        let (op, _) = record::peak(&alloc, device, prep)
            .with_context(|| format!("replaying {} through {}", input.name, s.name))?;
        keys.push((op, format!("peak reserved of {}", s.name)));
    }
    let recorded = input.torch.as_ref().and_then(|t| t.recorded.as_ref());
    if let Some(r) = recorded {
        keys.push((r.peak_op(n), "peak reserved of pytorch (recorded)".into()));
    }
    let moments = choose_moments(n, opts.moments, &keys);
    let moment_ops: Vec<usize> = moments.iter().map(|(op, _)| *op).collect();
    let timeline = record::Buckets::new(n, TIMELINE_BUCKETS);
    let samples = timeline.sample_ops();

    let mut runs = Vec::new();
    for s in specs {
        progress(&s.name);
        let alloc = s
            .build(device)
            .with_context(|| format!("building {}", s.name))?;
        let run = record::replay(&alloc, s, device, prep, &moment_ops, &samples)
            .with_context(|| format!("replaying {} through {}", input.name, s.name))?;
        runs.push(run);
    }
    if let Some(r) = recorded {
        runs.push(r.replay(input, &moment_ops, &samples));
    }

    let t0 = prep.time_us.first().copied().unwrap_or(0);
    let time_ms = |op: usize| prep.time_us[op].saturating_sub(t0) as f64 / 1e3;
    let mut tl = TimelineData {
        bucket: timeline.len,
        ..TimelineData::default()
    };
    let (x, live) = timeline.minmax(&prep.live_after);
    tl.time_ms = x.iter().map(|&x| round4(time_ms(x as usize))).collect();
    tl.x = x;
    tl.live = live;
    tl.at = samples.clone();
    for run in &runs {
        tl.reserved.push(timeline.minmax(&run.reserved).1);
        tl.ratio.push(
            samples
                .iter()
                .map(|&op| {
                    let live = prep.live_after[op];
                    (live > 0).then(|| round4(run.reserved[op] as f64 / live as f64))
                })
                .collect(),
        );
        tl.hole.push(run.holes.clone());
    }

    let mut table = record::BlockRefs::default();
    let mut out_moments = Vec::new();
    for (k, (op, why)) in moments.into_iter().enumerate() {
        let mut maps: Vec<MapData> = runs.iter().map(|r| r.maps[k].clone()).collect();
        for m in &mut maps {
            relative_segments(&mut m.segs);
            for b in m.blocks.chunks_exact_mut(4) {
                let op = b[3] as usize;
                table.add(op);
                b[2] -= prep.ops[op].size as i64;
            }
        }
        out_moments.push(Moment {
            op,
            time_ms: time_ms(op),
            live: prep.live_after[op],
            why,
            maps,
        });
    }
    let (blocks, stacks) = table.finish(prep, input.torch.as_ref());

    let allocators = runs
        .into_iter()
        .map(|r| r.summary(prep.peak_live as u64))
        .collect();
    Ok(ViewData {
        format: DATA_FORMAT,
        title: format!(
            "{}: memory through {}",
            input.name,
            names(specs, recorded.is_some())
        ),
        source: Source {
            path: input.path.display().to_string(),
            name: input.name.clone(),
            kind: input.kind,
            ops: n,
            rows: input.events.len(),
            report: prep.report.to_string(),
            skipped: [
                prep.skipped_failures,
                prep.skipped_unknown_frees,
                prep.skipped_zero,
            ],
            streams: prep.streams.iter().map(|s| format!("{s:#x}")).collect(),
            has_stacks: !stacks.stacks.is_empty(),
        },
        device: device_text.to_string(),
        peak_live: prep.peak_live as u64,
        peak_live_op,
        allocators,
        timeline: tl,
        moments: out_moments,
        blocks,
        stacks,
    })
}

/// `x` to four decimals: the page shows no more, and the JSON is shorter.
fn round4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

/// Makes flat (address, size, flag) segments in address order relative:
/// each address becomes the gap from the end of the previous segment.
fn relative_segments(segs: &mut [u64]) {
    let mut end = 0;
    for s in segs.chunks_exact_mut(3) {
        let (addr, size) = (s[0], s[1]);
        s[0] = addr.saturating_sub(end);
        end = addr + size;
    }
}

fn names(specs: &[AllocatorSpec], recorded: bool) -> String {
    let mut v: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    if recorded {
        v.push("PyTorch's allocator");
    }
    v.join(", ")
}

/// Writes the page for `data` to `path`. Returns its size in bytes.
pub fn write(data: &ViewData, path: &Path) -> Result<u64> {
    let html = render(data)?;
    std::fs::write(path, &html).with_context(|| format!("writing {}", path.display()))?;
    Ok(html.len() as u64)
}

/// Checks that `path` names an HTML file: `.html` or `.htm`.
pub fn check_output(path: &Path) -> Result<()> {
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    if ext != "html" && ext != "htm" {
        bail!(
            "{}: the view is an HTML page: give a file name ending in .html",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_are_even_plus_keys_without_duplicates() {
        let m = choose_moments(100, 4, &[(49, "peak live".into()), (7, "peak of x".into())]);
        let ops: Vec<usize> = m.iter().map(|(op, _)| *op).collect();
        assert_eq!(ops, vec![7, 24, 49, 74, 99]);
        assert_eq!(m[2].1, vec!["peak live".to_string()]);
        assert_eq!(m[4].1, vec!["end of the log".to_string()]);
        assert!(m[1].1.is_empty());
        // More moments than events: each event once.
        assert_eq!(choose_moments(3, 10, &[]).len(), 3);
        assert_eq!(choose_moments(5, 0, &[(9, "k".into())]).len(), 1);
        assert!(choose_moments(0, 10, &[]).is_empty());
    }

    #[test]
    fn segments_travel_as_gaps() {
        let mut segs = vec![
            1000, 100, SEG_PLAIN, 1100, 50, SEG_MAPPED, 2000, 10, SEG_PLAIN,
        ];
        relative_segments(&mut segs);
        assert_eq!(
            segs,
            vec![1000, 100, SEG_PLAIN, 0, 50, SEG_MAPPED, 850, 10, SEG_PLAIN]
        );
        assert_eq!(round4(1.234_567), 1.2346);
    }

    #[test]
    fn pickles_are_told_from_logs() {
        assert!(looks_like_pickle(Some(0x80), Path::new("x.bin")));
        assert!(looks_like_pickle(Some(b'('), Path::new("snap.PICKLE")));
        assert!(!looks_like_pickle(Some(b'T'), Path::new("log.csv")));
        assert!(!looks_like_pickle(None, Path::new("-")));
    }

    #[test]
    fn output_must_be_html() {
        assert!(check_output(Path::new("a.html")).is_ok());
        assert!(check_output(Path::new("a.HTM")).is_ok());
        let e = check_output(Path::new("a.csv")).unwrap_err().to_string();
        assert!(e.contains(".html"), "{e}");
    }
}
