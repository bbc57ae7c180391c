//! `gpumem capi-cost`: what gpumem's C ABI adds to an allocation and a free,
//! over the same resource called from Rust.
//!
//! Three paths serve the same allocate/free pairs (same sizes, in turn, on
//! the same stream), each from a resource of its own built from the same
//! configuration (`GPUMEM_CONF`'s syntax):
//! - `resource`: the resource the configuration names, built as the C ABI
//!   builds it ([`gpumem_capi::served::build`]) and called through
//!   [`MemoryResource`];
//! - `stack`: the C ABI's stack for device 0 lent to Rust
//!   ([`gpumem_capi::device_resource`]): statistics, `record_stream`'s
//!   deferred frees and the out-of-memory retry over its resource;
//! - `capi`: the exported functions `gpumem_malloc` and `gpumem_free` of the
//!   process's C ABI allocator (the stack of the `stack` path).
//!
//! Each run times `pairs` pairs per path, the paths in turn; after one
//! untimed run of each, `runs` runs give the median, fastest and slowest ns
//! per call (an allocation or a free). `overhead_ns_per_call` is a path's
//! median less the `resource` path's; `overhead_paired_ns_per_call` the
//! median of the differences run by run, which a host whose speed drifts
//! moves less (short runs, many of them: `--pairs 20000 --runs 301`).
//! With `threads` above one, every run has that many threads make
//! `pairs` pairs each at once, each on a stream of its own, and the time
//! is the wall time from the first thread's start to the last one's end
//! over all their calls: what threads that share the C ABI's pool (and its
//! statistics) cost each other.
//! `paths` picks some of the paths; with
//! one, a profiler can count the instructions of its loop, a function of its
//! own (`valgrind --tool=callgrind --toggle-collect='*::rust_pairs'` or
//! `'*::capi_pairs'`).

use std::ffi::c_void;
use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use gpumem::resource::{MemoryResource, DEFAULT_ALIGNMENT};
use gpumem::Stream;
use serde::Serialize;

use crate::bench::{median, RunContext};
use crate::outln;
use crate::units::{fmt_bytes, fmt_count};

/// What to measure.
#[derive(Debug, Clone)]
pub struct CostConfig {
    /// The configuration, in `GPUMEM_CONF`'s syntax.
    pub conf: String,
    /// Allocate/free pairs per timed run and path.
    pub pairs: usize,
    /// Timed runs per path; the median is reported.
    pub runs: usize,
    /// Request sizes, used in turn.
    pub sizes: Vec<usize>,
    /// Pass the legacy default stream (handle 0) rather than a stream
    /// created for the measurement.
    pub legacy_stream: bool,
    /// The paths to measure, of [`PATHS`] (empty: all).
    pub paths: Vec<String>,
    /// Threads making pairs at once, each on its own stream (1: the
    /// calling thread alone).
    pub threads: usize,
}

/// One line of results: one path.
#[derive(Debug, Clone, Serialize)]
pub struct CostRecord {
    /// `resource`, `stack` or `capi` (see the module documentation).
    pub path: String,
    /// The configuration served.
    pub conf: String,
    /// Median over runs of nanoseconds per call (an allocation or a free).
    pub ns_per_call: f64,
    /// Fastest run.
    pub ns_per_call_min: f64,
    /// Slowest run.
    pub ns_per_call_max: f64,
    /// `ns_per_call` less the `resource` path's (null when that path was
    /// not measured).
    pub overhead_ns_per_call: Option<f64>,
    /// The median over runs of this path's time less the `resource` path's
    /// in the same run (null when that path was not measured): paired, so
    /// a host whose speed drifts between runs moves it less than
    /// `overhead_ns_per_call`.
    pub overhead_paired_ns_per_call: Option<f64>,
    /// Allocate/free pairs per run.
    pub pairs: usize,
    /// Timed runs.
    pub runs: usize,
    /// The request sizes, used in turn.
    pub sizes: Vec<usize>,
    /// `created` or `legacy`.
    pub stream: String,
    /// Threads making pairs at once.
    pub threads: usize,
    /// `cuda` or `sim`.
    pub device: String,
    /// The device's name.
    pub device_name: String,
    /// What the timings measure.
    pub measures: String,
    /// UTC date of the run.
    pub date: String,
    /// The command line.
    pub command: String,
}

/// The paths, in the order they run and are reported.
pub const PATHS: [&str; 3] = ["resource", "stack", "capi"];

/// `pairs` allocate/free pairs through a Rust resource.
#[inline(never)]
fn rust_pairs(
    r: &dyn MemoryResource,
    stream: &Stream,
    sizes: &[usize],
    pairs: usize,
) -> Result<Duration> {
    let start = Instant::now();
    for &size in sizes.iter().cycle().take(pairs) {
        let p = r.allocate(size, DEFAULT_ALIGNMENT, stream)?;
        r.deallocate(black_box(p), size, DEFAULT_ALIGNMENT, stream)?;
    }
    Ok(start.elapsed())
}

/// `pairs` pairs through `gpumem_malloc` and `gpumem_free` on device 0.
#[inline(never)]
fn capi_pairs(stream: *mut c_void, sizes: &[usize], pairs: usize) -> Result<Duration> {
    let start = Instant::now();
    for &size in sizes.iter().cycle().take(pairs) {
        let size = size as isize;
        let p = gpumem_capi::gpumem_malloc(size, 0, stream);
        if p.is_null() {
            bail!(
                "gpumem_malloc({size}) returned NULL: {}",
                gpumem_capi::allocator::last_error().unwrap_or_default()
            );
        }
        gpumem_capi::gpumem_free(black_box(p), size, 0, stream);
    }
    Ok(start.elapsed())
}

/// Measures the three paths (see the module documentation) on device 0 of
/// the process's C ABI allocator, which must serve `cfg.conf` (see
/// [`configure`]); `ctx` stamps the records.
pub fn run(ctx: &RunContext, cfg: &CostConfig) -> Result<Vec<CostRecord>> {
    if cfg.pairs == 0 || cfg.runs == 0 || cfg.sizes.is_empty() || cfg.threads == 0 {
        bail!("capi-cost needs at least one pair, one run, one size and one thread");
    }
    if let Some(p) = cfg.paths.iter().find(|p| !PATHS.contains(&p.as_str())) {
        bail!("unknown path {p:?}; known: {}", PATHS.join(", "));
    }
    let parsed = gpumem_capi::conf::parse(&cfg.conf);
    if let Some(e) = parsed.error() {
        bail!("{e}");
    }
    let stack = gpumem_capi::device_resource(0)
        .context("the C ABI cannot serve device 0 (see the messages above)")?;
    let device = stack.device().clone();
    let resource = gpumem_capi::served::build(&parsed.conf, &device, None)
        .with_context(|| format!("building {}", parsed.conf))?
        .boxed();
    let streams = (0..cfg.threads)
        .map(|_| match cfg.legacy_stream {
            true => Ok(device.default_stream()),
            false => device.create_stream(),
        })
        .collect::<gpumem::Result<Vec<Stream>>>()?;
    let on = |path: &str, stream: &Stream, pairs: usize| -> Result<Duration> {
        match path {
            "resource" => rust_pairs(&*resource, stream, &cfg.sizes, pairs),
            "stack" => rust_pairs(&*stack, stream, &cfg.sizes, pairs),
            _ => capi_pairs(stream.raw() as usize as *mut c_void, &cfg.sizes, pairs),
        }
    };
    let one = |path: &str, pairs: usize| -> Result<Duration> {
        if cfg.threads == 1 {
            return on(path, &streams[0], pairs);
        }
        let start = Barrier::new(cfg.threads);
        let spans = std::thread::scope(|scope| {
            let handles: Vec<_> = streams
                .iter()
                .map(|stream| {
                    let (on, start) = (&on, &start);
                    scope.spawn(move || -> Result<(Instant, Instant)> {
                        start.wait();
                        let t0 = Instant::now();
                        on(path, stream, pairs)?;
                        Ok((t0, Instant::now()))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a measuring thread panicked"))
                .collect::<Result<Vec<_>>>()
        })?;
        let first = spans.iter().map(|s| s.0).min().expect("one thread");
        let last = spans.iter().map(|s| s.1).max().expect("one thread");
        Ok(last - first)
    };
    let calls = (2 * cfg.pairs * cfg.threads) as f64;
    let paths: Vec<&str> = PATHS
        .into_iter()
        .filter(|p| cfg.paths.is_empty() || cfg.paths.iter().any(|q| q == p))
        .collect();
    let mut ns: Vec<Vec<f64>> = vec![Vec::with_capacity(cfg.runs); paths.len()];
    for run in 0..=cfg.runs {
        for (i, path) in paths.iter().enumerate() {
            let t = one(path, cfg.pairs).with_context(|| format!("the {path} path"))?;
            device.synchronize()?;
            if run > 0 {
                ns[i].push(t.as_nanos() as f64 / calls);
            }
        }
    }
    let base_runs = paths
        .iter()
        .position(|p| *p == "resource")
        .map(|i| ns[i].clone());
    let mut records = Vec::with_capacity(paths.len());
    let mut base = None;
    for (path, mut v) in paths.iter().zip(ns) {
        let paired = base_runs.as_ref().map(|b| {
            let mut d: Vec<f64> = v.iter().zip(b).map(|(x, y)| x - y).collect();
            median(&mut d)
        });
        let m = median(&mut v);
        if *path == "resource" {
            base = Some(m);
        }
        records.push(CostRecord {
            path: path.to_string(),
            conf: parsed.conf.to_string(),
            ns_per_call: m,
            ns_per_call_min: v[0],
            ns_per_call_max: v[v.len() - 1],
            overhead_ns_per_call: base.map(|b| m - b),
            overhead_paired_ns_per_call: paired,
            pairs: cfg.pairs,
            runs: cfg.runs,
            sizes: cfg.sizes.clone(),
            stream: if cfg.legacy_stream {
                "legacy"
            } else {
                "created"
            }
            .into(),
            threads: cfg.threads,
            device: ctx.device_kind.clone(),
            device_name: ctx.device_name.clone(),
            measures: ctx.measures().to_string(),
            date: ctx.date.clone(),
            command: ctx.command.clone(),
        });
    }
    Ok(records)
}

/// Makes the process's C ABI allocator serve `conf` (before its first
/// allocation).
pub fn configure(conf: &str) -> Result<()> {
    gpumem_capi::global()
        .configure(conf)
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Prints records as a table.
pub fn print_table(records: &[CostRecord]) -> Result<()> {
    let Some(first) = records.first() else {
        return Ok(());
    };
    let sizes: Vec<String> = first.sizes.iter().map(|&s| fmt_bytes(s as u64)).collect();
    outln!(
        "\ncapi-cost: {} ({} pairs per run, sizes {}, {} stream; median of {} runs)",
        first.conf,
        first.pairs,
        sizes.join(", "),
        first.stream,
        first.runs
    )?;
    outln!(
        "  {:<10} {:>10} {:>17} {:>14} {:>8}",
        "path",
        "ns/call",
        "min..max",
        "over resource",
        "paired"
    )?;
    for r in records {
        outln!(
            "  {:<10} {:>10} {:>17} {:>14} {:>8}",
            r.path,
            fmt_count(r.ns_per_call),
            format!(
                "{}..{}",
                fmt_count(r.ns_per_call_min),
                fmt_count(r.ns_per_call_max)
            ),
            r.overhead_ns_per_call
                .map_or_else(|| "-".into(), |o| format!("{o:+.1}")),
            r.overhead_paired_ns_per_call
                .map_or_else(|| "-".into(), |o| format!("{o:+.1}"))
        )?;
    }
    Ok(())
}
