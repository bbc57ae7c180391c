//! `gpumem bench`: workloads across allocators, side by side, in one process.
//!
//! Each (workload, allocator) pair runs `repeats` times; every repeat builds
//! the allocator afresh (so pools pay for their growth), runs the timed loop
//! `passes` times on it (default once), timing each pass, and frees
//! everything. With `warm`, each repeat first runs the workload untimed on
//! the same allocator (`warm_passes` times, default once), so the timed run
//! measures the steady state (RMM's own benchmarks pre-size their pools the
//! same way); records say which. The reported `ns_per_op` is the median over
//! repeats of the timed passes together, and each pass's own median is
//! reported too (first, second, steady: the median of the later passes);
//! `peak_reserved` is the most the allocator held from the driver in any
//! repeat, and `peak_live` the most the workload had allocated at once.

use std::sync::Arc;

use anyhow::{bail, Context as _, Result};
use gpumem::adaptor::StatisticsAdaptor;
use gpumem::{Backend, Device, Stream};
use indicatif::ProgressBar;
use serde::Serialize;

use crate::allocators::{Allocator, AllocatorSpec};
use crate::iterations::{self, IterationsConfig};
use crate::outln;
use crate::replay::{self, PreparedReplay};
use crate::thread_crew::ThreadCrew;
use crate::units::{fmt_bytes, fmt_count};
use crate::workload::{self, OpSequence, Timed};

/// A benchmark workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Workload {
    /// `--size` alloc/free pairs, `--iters` times, on one stream.
    Same,
    /// `--ops` steps, each a log-uniform allocation in [`--min-size`,
    /// `--max-size`] or a free of a random live block, at most `--max-live` live.
    Random,
    /// `--threads` threads, each on its own stream, running the random workload
    /// (`--ops` split between them); wall ns per op.
    Threads,
    /// `--holes` free holes between live blocks, then small alloc/free pairs.
    Holes,
    /// A trace (`--trace`) replayed op by op.
    Replay,
    /// A synthetic training loop of `--iterations` iterations per pass whose
    /// sizes change by up to `--vary` (see [`crate::iterations`]).
    Iterations,
}

impl Workload {
    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Same => "same",
            Workload::Random => "random",
            Workload::Threads => "threads",
            Workload::Holes => "holes",
            Workload::Replay => "replay",
            Workload::Iterations => "iterations",
        }
    }
}

/// What to run and with which parameters.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Workloads, in order.
    pub workloads: Vec<Workload>,
    /// Runs per (workload, allocator); the median is reported.
    pub repeats: usize,
    /// `same`: bytes per request.
    pub size: usize,
    /// `same` and `holes`: alloc/free pairs timed.
    pub iters: usize,
    /// `random` and `threads`: steps in all.
    pub ops: usize,
    /// `random` and `threads`: most blocks live at once (split between threads).
    pub max_live: usize,
    /// `random` and `threads`: smallest request.
    pub min_size: usize,
    /// `random`: largest request.
    pub max_size: usize,
    /// `threads`: largest request.
    pub thread_max_size: usize,
    /// Seed of the random sequences.
    pub seed: u64,
    /// `threads`: how many.
    pub threads: usize,
    /// `holes`: how many holes.
    pub holes: usize,
    /// `replay`: the trace, read and prepared ([`replay::load`]).
    pub trace: Option<replay::Trace>,
    /// Untimed runs of each workload on the same allocator before the timed
    /// one (0: cold, growth included).
    pub warm_passes: usize,
    /// Timed runs of each workload on the same allocator, each timed alone.
    pub passes: usize,
    /// `iterations`: iterations per pass.
    pub iterations: usize,
    /// `iterations`: how much sizes change between iterations, 0 to 1.
    pub vary: f64,
    /// `iterations`: sequences per batch.
    pub batch: usize,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            workloads: vec![
                Workload::Same,
                Workload::Random,
                Workload::Threads,
                Workload::Holes,
            ],
            repeats: 3,
            size: 1 << 20,
            iters: 1000,
            ops: 10_000,
            max_live: 1000,
            min_size: 256,
            max_size: 64 << 20,
            thread_max_size: 4 << 20,
            seed: 42,
            warm_passes: 0,
            passes: 1,
            iterations: 20,
            vary: 0.3,
            batch: iterations::BATCH,
            threads: 8,
            holes: 4096,
            trace: None,
        }
    }
}

impl BenchConfig {
    /// Refuses parameters that make no sense, in the command's words: counts
    /// of 0, an empty size range, threads without a step each.
    pub fn check(&self) -> Result<()> {
        let zero = [
            ("--repeats", self.repeats),
            ("--size", self.size),
            ("--iters", self.iters),
            ("--ops", self.ops),
            ("--max-live", self.max_live),
            ("--min-size", self.min_size),
            ("--threads", self.threads),
            ("--passes", self.passes),
            ("--iterations", self.iterations),
            ("--batch", self.batch),
        ];
        if let Some((name, _)) = zero.iter().find(|(_, v)| *v == 0) {
            bail!("{name} 0: must be at least 1");
        }
        check_vary(self.vary).map_err(|e| anyhow::anyhow!("--vary {}: {e}", self.vary))?;
        let has = |w| self.workloads.contains(&w);
        if has(Workload::Random) && self.min_size > self.max_size {
            bail!(
                "--min-size {} is larger than --max-size {}",
                fmt_bytes(self.min_size as u64),
                fmt_bytes(self.max_size as u64)
            );
        }
        if has(Workload::Threads) {
            if self.min_size > self.thread_max_size {
                bail!(
                    "--min-size {} is larger than --thread-max-size {}",
                    fmt_bytes(self.min_size as u64),
                    fmt_bytes(self.thread_max_size as u64)
                );
            }
            if self.ops < self.threads {
                bail!(
                    "--ops {} is fewer than --threads {}: each thread needs at least one step",
                    self.ops,
                    self.threads
                );
            }
        }
        Ok(())
    }
}

/// Refuses a `--vary` outside 0.0..=1.0 (or not a number), saying why.
pub fn check_vary(vary: f64) -> std::result::Result<f64, String> {
    if (0.0..=1.0).contains(&vary) {
        Ok(vary)
    } else {
        Err("must be between 0.0 (identical iterations) and 1.0".into())
    }
}

/// Where and when the measurements are made, stamped on every record.
#[derive(Debug, Clone)]
pub struct RunContext {
    /// The device.
    pub device: Device,
    /// `cuda` or `sim`.
    pub device_kind: String,
    /// The device's name.
    pub device_name: String,
    /// UTC date and time of the run (RFC 3339).
    pub date: String,
    /// The command line.
    pub command: String,
}

impl RunContext {
    /// Stamps a run on `device` now, with this process's command line.
    pub fn new(device: Device) -> Result<Self> {
        let info = device.info().context("reading the device's name")?;
        Ok(Self {
            device_kind: device.backend().to_string(),
            device_name: info.name,
            date: crate::units::utc_now(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
            device,
        })
    }

    /// What the timings mean on this device.
    pub fn measures(&self) -> &'static str {
        match self.device.backend() {
            Backend::Cuda => "real GPU allocations",
            Backend::Sim => "bookkeeping only (simulated device: no GPU time)",
        }
    }
}

/// One line of results: a workload through one allocator.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRecord {
    /// Allocator name.
    pub alloc: String,
    /// Workload name.
    pub workload: String,
    /// `cuda` or `sim`.
    pub device: String,
    /// The device's name.
    pub device_name: String,
    /// True when the timed run followed an untimed run of the same workload on
    /// the same allocator (steady state); false when it includes growth.
    pub warm: bool,
    /// Untimed runs before the timed one (0 when cold).
    #[serde(default)]
    pub warm_passes: usize,
    /// Timed passes per repeat, one after the other on the same allocator.
    pub passes: usize,
    /// Median over repeats of each timed pass's ns per operation, in order.
    pub pass_ns_per_op: Vec<f64>,
    /// The first timed pass's ns per operation.
    pub first_ns_per_op: Option<f64>,
    /// The second timed pass's; null with one pass.
    pub second_ns_per_op: Option<f64>,
    /// The steady state: the median of the passes after the second, or the
    /// last pass when there are fewer than three.
    pub steady_ns_per_op: Option<f64>,
    /// `iterations` only: iterations per pass.
    pub iterations: Option<usize>,
    /// `iterations` only: how much sizes change between iterations.
    pub vary: Option<f64>,
    /// VirtualPool only: the most `cuMemMap` calls one timed run made
    /// (0 once a repeating workload's aliases are all in place).
    #[serde(default)]
    pub vmm_mappings: Option<u64>,
    /// Median over repeats of nanoseconds per operation (allocate or free),
    /// all timed passes together; null when the run failed.
    pub ns_per_op: Option<f64>,
    /// Fastest repeat.
    pub ns_per_op_min: Option<f64>,
    /// Slowest repeat.
    pub ns_per_op_max: Option<f64>,
    /// Median time of one repeat's timed loop, in milliseconds.
    pub time_ms: Option<f64>,
    /// Operations per repeat (all timed passes).
    pub ops: u64,
    /// Repeats run.
    pub repeats: usize,
    /// Most bytes the workload had live at once (for `threads`, whose
    /// interleaving varies, measured in one extra untimed run).
    pub peak_live: u64,
    /// Most bytes the allocator held from the driver, over all repeats.
    pub peak_reserved: Option<u64>,
    /// `peak_reserved / peak_live` (1.00 is perfect).
    pub reserved_over_live: Option<f64>,
    /// The workload's parameters.
    pub params: String,
    /// What the timings measure (real GPU, or bookkeeping on the simulator).
    pub measures: String,
    /// UTC date of the run.
    pub date: String,
    /// The command line.
    pub command: String,
    /// Why the run failed, when it did.
    pub error: Option<String>,
}

/// A workload made ready to run: sequences generated, trace prepared.
enum Prepared {
    Same,
    Random(OpSequence),
    Threads(Vec<Arc<OpSequence>>),
    Holes,
    Replay(Arc<PreparedReplay>),
    Iterations(IterationsConfig),
}

impl Prepared {
    fn peak_live(&self, cfg: &BenchConfig) -> u64 {
        match self {
            Prepared::Same => cfg.size as u64,
            Prepared::Random(s) => s.peak_live as u64,
            // An upper bound; measured after the timed runs.
            Prepared::Threads(s) => s.iter().map(|s| s.peak_live as u64).sum(),
            Prepared::Holes => ((2 * cfg.holes + 1) * workload::HOLE_SIZE) as u64,
            Prepared::Replay(p) => p.peak_live as u64,
            Prepared::Iterations(c) => {
                iterations::peak_live(c, cfg.warm_passes + cfg.passes) as u64
            }
        }
    }
}

fn params(w: Workload, cfg: &BenchConfig, prep: &Prepared) -> String {
    match (w, prep) {
        (Workload::Same, _) => format!("size={} iters={}", fmt_bytes(cfg.size as u64), cfg.iters),
        (Workload::Random, _) => format!(
            "ops={} max_live={} sizes={}..{} seed={}",
            cfg.ops,
            cfg.max_live,
            fmt_bytes(cfg.min_size as u64),
            fmt_bytes(cfg.max_size as u64),
            cfg.seed
        ),
        (Workload::Threads, _) => format!(
            "threads={} ops={} max_live={} sizes={}..{} seed={}",
            cfg.threads,
            cfg.ops,
            cfg.max_live,
            fmt_bytes(cfg.min_size as u64),
            fmt_bytes(cfg.thread_max_size as u64),
            cfg.seed
        ),
        (Workload::Holes, _) => format!(
            "holes={} of {} then {} alloc/free x{}",
            cfg.holes,
            fmt_bytes(workload::HOLE_SIZE as u64),
            fmt_bytes(workload::HOLES_REQUEST as u64),
            cfg.iters
        ),
        (Workload::Replay, Prepared::Replay(p)) => format!(
            "trace={} events={} skipped={}",
            cfg.trace.as_ref().map_or("", |t| t.name.as_str()),
            p.report.events,
            p.skipped_failures + p.skipped_unknown_frees + p.skipped_zero
        ),
        (Workload::Replay, _) => String::new(),
        (Workload::Iterations, _) => format!(
            "iterations={} vary={} batch={} layers={} streams={} seed={}",
            cfg.iterations,
            cfg.vary,
            cfg.batch,
            iterations::LAYERS,
            iterations::STREAMS,
            cfg.seed
        ),
    }
}

fn prepare(w: Workload, cfg: &BenchConfig) -> Result<Prepared> {
    Ok(match w {
        Workload::Same => Prepared::Same,
        Workload::Holes => Prepared::Holes,
        Workload::Random => Prepared::Random(workload::random_sequence(
            cfg.ops,
            cfg.max_live,
            cfg.min_size,
            cfg.max_size,
            cfg.seed,
        )),
        Workload::Threads => {
            let n = cfg.threads;
            Prepared::Threads(
                (0..n)
                    .map(|t| {
                        Arc::new(workload::random_sequence(
                            cfg.ops / n,
                            (cfg.max_live / n).max(1),
                            cfg.min_size,
                            cfg.thread_max_size,
                            cfg.seed.wrapping_add(t as u64),
                        ))
                    })
                    .collect(),
            )
        }
        Workload::Replay => {
            let Some(trace) = &cfg.trace else {
                bail!("the replay workload needs --trace FILE");
            };
            Prepared::Replay(trace.prep.clone())
        }
        Workload::Iterations => Prepared::Iterations(IterationsConfig {
            iterations: cfg.iterations,
            vary: cfg.vary,
            seed: cfg.seed,
            batch: cfg.batch,
        }),
    })
}

/// The streams one repeat uses, made once so its warm-up and timed runs
/// share them (a program keeps its streams across iterations).
fn repeat_streams(device: &Device, prep: &Prepared) -> gpumem::Result<Vec<Stream>> {
    match prep {
        Prepared::Replay(p) => workload::replay_streams(device, p),
        Prepared::Threads(_) => Ok(Vec::new()),
        Prepared::Iterations(_) => (0..iterations::STREAMS)
            .map(|_| device.create_stream())
            .collect(),
        _ => Ok(vec![device.create_stream()?]),
    }
}

/// The threads of the `threads` workload for one repeat, started once so
/// its warm-up and timed passes share them and their streams (a program
/// keeps its threads); `None` for the other workloads.
fn repeat_crew(alloc: &Allocator, device: &Device, prep: &Prepared) -> Result<Option<ThreadCrew>> {
    match prep {
        Prepared::Threads(seqs) => Ok(Some(ThreadCrew::new(&alloc.resource, device, seqs)?)),
        _ => Ok(None),
    }
}

/// Runs pass `pass` (warm passes counted) of a workload once, timed, on
/// the repeat's `streams` and, for `threads`, its `crew`.
fn run_once(
    alloc: &Allocator,
    device: &Device,
    cfg: &BenchConfig,
    prep: &Prepared,
    (streams, crew): (&[Stream], Option<&ThreadCrew>),
    pass: usize,
) -> Result<Timed> {
    let r = &*alloc.resource;
    let one = || {
        streams
            .first()
            .cloned()
            .map_or_else(|| device.create_stream(), Ok)
    };
    Ok(match prep {
        Prepared::Same => workload::run_same(r, device, &one()?, cfg.size, cfg.iters)?,
        Prepared::Random(seq) => workload::run_sequence(r, device, &one()?, seq)?,
        Prepared::Threads(seqs) => match crew {
            Some(crew) => crew.run_pass()?,
            None => workload::run_threads(&alloc.resource, device, seqs)?,
        },
        Prepared::Holes => workload::run_holes(r, device, &one()?, cfg.holes, cfg.iters)?,
        Prepared::Replay(p) => workload::run_replay(r, device, p, Some(streams), None)?,
        Prepared::Iterations(c) => {
            let pass = iterations::generate(c, pass);
            workload::run_replay(r, device, &pass.prep, Some(streams), None)?
        }
    })
}

/// Runs the threads workload once through a counter in front of a fresh
/// allocator and returns the highest live bytes seen.
fn threads_peak_live(
    spec: &AllocatorSpec,
    device: &Device,
    seqs: &[Arc<OpSequence>],
) -> Result<u64> {
    let alloc = spec.build(device)?;
    let counter = Arc::new(StatisticsAdaptor::new(alloc.resource.clone()));
    let top: Arc<dyn gpumem::resource::MemoryResource> = counter.clone();
    workload::run_threads(&top, device, seqs)?;
    Ok(counter.stats().requested_bytes.peak.max(0) as u64)
}

/// The median of a non-empty list.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The steady state of per-pass timings: the median of the passes after
/// the second, or the last pass when there are fewer than three.
pub fn steady(pass_ns: &[f64]) -> Option<f64> {
    match pass_ns.len() {
        0..=2 => pass_ns.last().copied(),
        _ => Some(median(&mut pass_ns[2..].to_vec())),
    }
}

/// Timed passes as one run: their times and operations summed.
fn together(passes: &[Timed]) -> Timed {
    Timed {
        elapsed: passes.iter().map(|t| t.elapsed).sum(),
        ops: passes.iter().map(|t| t.ops).sum(),
    }
}

/// Runs every workload of `cfg` through every allocator of `specs`, calling
/// `on_record` as each (workload, allocator) finishes. A failing allocator
/// yields a record with `error` set; the others go on. Fails only when a
/// workload cannot be prepared (a missing or bad trace).
pub fn run(
    ctx: &RunContext,
    cfg: &BenchConfig,
    specs: &[AllocatorSpec],
    progress: &ProgressBar,
    mut on_record: impl FnMut(&BenchRecord) -> Result<()>,
) -> Result<Vec<BenchRecord>> {
    cfg.check()?;
    let repeats = cfg.repeats;
    progress.set_length((cfg.workloads.len() * specs.len() * repeats) as u64);
    let device = &ctx.device;
    let _ = device.driver().set_current_device(device.ordinal());
    let mut out = Vec::new();
    for &w in &cfg.workloads {
        progress.set_message(format!("{}: preparing", w.name()));
        let prep = prepare(w, cfg)?;
        let peak_live = prep.peak_live(cfg);
        for spec in specs {
            progress.set_message(format!("{} / {}", w.name(), spec.name));
            let mut times = Vec::with_capacity(repeats);
            let mut pass_times: Vec<Vec<Timed>> = Vec::with_capacity(repeats);
            let mut ops = 0;
            let mut peak_reserved: Option<u64> = Some(0);
            let mut vmm_mappings: Option<u64> = None;
            let mut error = None;
            for _ in 0..repeats {
                let result = (|| -> Result<(Vec<Timed>, usize, Option<u64>)> {
                    let alloc = spec.build(device)?;
                    alloc.pool.reset_peak();
                    let streams = repeat_streams(device, &prep)?;
                    let crew = repeat_crew(&alloc, device, &prep)?;
                    let kept = (&streams[..], crew.as_ref());
                    for pass in 0..cfg.warm_passes {
                        run_once(&alloc, device, cfg, &prep, kept, pass)?;
                    }
                    let m0 = alloc.mappings_made();
                    let t = (cfg.warm_passes..cfg.warm_passes + cfg.passes)
                        .map(|pass| run_once(&alloc, device, cfg, &prep, kept, pass))
                        .collect::<Result<Vec<_>>>()?;
                    let peak = alloc.pool.peak_reserved_bytes();
                    let maps = m0.zip(alloc.mappings_made()).map(|(a, b)| b - a);
                    Ok((t, peak, maps))
                })();
                progress.inc(1);
                match result {
                    Ok((passes, peak, maps)) => {
                        let t = together(&passes);
                        pass_times.push(passes);
                        times.push(t);
                        ops = t.ops;
                        peak_reserved = peak_reserved.map(|p| p.max(peak as u64));
                        vmm_mappings = maps.map(|m| m.max(vmm_mappings.unwrap_or(0)));
                    }
                    Err(e) => {
                        error = Some(format!("{e:#}"));
                        progress.inc((repeats - times.len() - 1) as u64);
                        break;
                    }
                }
            }
            let mut ok = error.is_none() && !times.is_empty();
            let mut peak_live = peak_live;
            if let (true, Prepared::Threads(seqs)) = (ok, &prep) {
                // Threads interleave, so the workload's live peak is not known
                // in advance: measure it in one more, untimed, run with a
                // counter in front of the allocator.
                match threads_peak_live(spec, device, seqs) {
                    Ok(p) => peak_live = p,
                    Err(e) => {
                        error = Some(format!("untimed live-peak run: {e:#}"));
                        ok = false;
                    }
                }
            }
            let mut ns: Vec<f64> = times.iter().map(Timed::ns_per_op).collect();
            let mut ms: Vec<f64> = times
                .iter()
                .map(|t| t.elapsed.as_secs_f64() * 1e3)
                .collect();
            let peak_reserved = peak_reserved.filter(|_| ok);
            let pass_ns: Vec<f64> = if ok {
                (0..cfg.passes)
                    .map(|p| {
                        let mut v: Vec<f64> = pass_times.iter().map(|r| r[p].ns_per_op()).collect();
                        median(&mut v)
                    })
                    .collect()
            } else {
                Vec::new()
            };
            let is_iterations = w == Workload::Iterations;
            let rec = BenchRecord {
                alloc: spec.name.to_string(),
                workload: w.name().to_string(),
                device: ctx.device_kind.clone(),
                device_name: ctx.device_name.clone(),
                warm: cfg.warm_passes > 0,
                warm_passes: cfg.warm_passes,
                passes: cfg.passes,
                first_ns_per_op: pass_ns.first().copied(),
                second_ns_per_op: pass_ns.get(1).copied(),
                steady_ns_per_op: steady(&pass_ns),
                pass_ns_per_op: pass_ns,
                iterations: is_iterations.then_some(cfg.iterations),
                vary: is_iterations.then_some(cfg.vary),
                vmm_mappings,
                ns_per_op: ok.then(|| median(&mut ns)),
                ns_per_op_min: ok.then(|| ns[0]),
                ns_per_op_max: ok.then(|| ns[ns.len() - 1]),
                time_ms: ok.then(|| median(&mut ms)),
                ops,
                repeats: times.len(),
                peak_live,
                peak_reserved,
                reserved_over_live: peak_reserved
                    .filter(|_| peak_live > 0)
                    .map(|r| r as f64 / peak_live as f64),
                params: params(w, cfg, &prep),
                measures: ctx.measures().to_string(),
                date: ctx.date.clone(),
                command: ctx.command.clone(),
                error,
            };
            on_record(&rec)?;
            out.push(rec);
        }
    }
    progress.finish_and_clear();
    Ok(out)
}

/// An error when any record is of a failed run, naming how many failed and
/// the first failure: a run in which an allocator fails is a failed run,
/// whatever the others did.
pub fn check_records(records: &[BenchRecord]) -> Result<()> {
    let failed: Vec<&BenchRecord> = records.iter().filter(|r| r.error.is_some()).collect();
    if let Some(first) = failed.first() {
        bail!(
            "{} of {} runs failed; the first, {} / {}: {}",
            failed.len(),
            records.len(),
            first.alloc,
            first.workload,
            first.error.as_deref().unwrap_or_default()
        );
    }
    Ok(())
}

/// The reserve note of the allocator named `alloc`, if it has one.
fn reserve_note(alloc: &str) -> Option<&'static str> {
    AllocatorSpec::parse(alloc)
        .ok()
        .and_then(|s| s.reserve_note())
}

/// Prints records as a table, one block per workload, allocators side by side;
/// allocators whose reserve is large by design get a `*` and a note under it.
pub fn print_table(records: &[BenchRecord]) -> Result<()> {
    let mut workloads: Vec<&str> = Vec::new();
    for r in records {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    let name_w = records
        .iter()
        .map(|r| r.alloc.len())
        .max()
        .unwrap_or(5)
        .max(9);
    for w in workloads {
        let rows: Vec<&BenchRecord> = records.iter().filter(|r| r.workload == w).collect();
        let first = rows[0];
        let repeats = rows
            .iter()
            .filter(|r| r.error.is_none())
            .map(|r| r.repeats)
            .max();
        let passes = rows.iter().map(|r| r.passes).max().unwrap_or(1);
        let each = if passes > 1 {
            format!(", {passes} timed passes each")
        } else {
            String::new()
        };
        match repeats {
            Some(n) => outln!("\n{w}: {} (median of {n} repeats{each})", first.params)?,
            None => outln!("\n{w}: {} (every allocator failed)", first.params)?,
        }
        // Several timed passes: each pass's ns/op in place of the spread.
        let by_pass = rows.iter().any(|r| r.passes > 1);
        let mut head = vec!["ns/op".to_string()];
        if by_pass {
            head.extend(["first", "second", "steady"].map(String::from));
        } else {
            head.push("min..max".into());
        }
        head.extend(["ops", "peak live", "peak reserved", "res/live"].map(String::from));
        let widths: Vec<usize> = head
            .iter()
            .map(|h| match h.as_str() {
                "min..max" => 21,
                "ops" | "res/live" => 9,
                "peak live" => 11,
                "peak reserved" => 13,
                _ => 10,
            })
            .collect();
        let line = |name: &str, cells: &[String]| {
            let mut l = format!("  {name:<name_w$}");
            for (c, w) in cells.iter().zip(&widths) {
                l.push_str(&format!(" {c:>w$}"));
            }
            l
        };
        outln!("{}", line("allocator", &head))?;
        for r in rows {
            match (&r.error, r.ns_per_op) {
                (None, Some(ns)) => {
                    let opt = |x: Option<f64>| x.map_or_else(|| "-".into(), fmt_count);
                    let mut cells = vec![fmt_count(ns)];
                    if by_pass {
                        cells.push(opt(r.first_ns_per_op));
                        cells.push(opt(r.second_ns_per_op));
                        cells.push(opt(r.steady_ns_per_op));
                    } else {
                        cells.push(format!(
                            "{}..{}",
                            fmt_count(r.ns_per_op_min.unwrap_or(ns)),
                            fmt_count(r.ns_per_op_max.unwrap_or(ns))
                        ));
                    }
                    let mark = if reserve_note(&r.alloc).is_some() {
                        "*"
                    } else {
                        ""
                    };
                    cells.extend([
                        r.ops.to_string(),
                        fmt_bytes(r.peak_live),
                        r.peak_reserved.map(fmt_bytes).unwrap_or_else(|| "-".into()),
                        r.reserved_over_live
                            .map(|x| format!("{x:.2}{mark}"))
                            .unwrap_or_else(|| "-".into()),
                    ]);
                    outln!("{}", line(&r.alloc, &cells))?
                }
                (e, _) => outln!(
                    "  {:<name_w$} error: {}",
                    r.alloc,
                    e.as_deref().unwrap_or("no result")
                )?,
            }
        }
    }
    // Once per note: several settings of one resource share its note.
    let mut noted: Vec<&str> = Vec::new();
    for r in records {
        if let Some(note) = reserve_note(&r.alloc).filter(|n| !noted.contains(n)) {
            outln!("  * {note}")?;
            noted.push(note);
        }
    }
    Ok(())
}
