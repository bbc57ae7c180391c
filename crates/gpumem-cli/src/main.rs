//! The `gpumem` command: device information, an allocation demo, benchmarks
//! across allocators, trace replay, memory timelines, the offline packing
//! bound of a log and a PyTorch snapshot converter. Runs on the real GPU
//! when there is one and on the simulated device otherwise, and always says
//! which.

#![forbid(unsafe_code)]

mod transfer;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use clap::{Args, Parser, Subcommand};

use gpumem_cli::allocators;
use gpumem_cli::bench::{self, BenchConfig, BenchRecord, RunContext, Workload};
use gpumem_cli::target::{self, DeviceChoice, Target};
use gpumem_cli::units::{count_in, fmt_bytes, parse_nonzero_size};
use gpumem_cli::{bound, capi_cost, demo, outln, output, plot, progress, replay, snapshot, view};

/// gpumem, a GPU memory manager: its allocators side by side on benchmarks
/// and on recorded allocation logs.
///
/// With no subcommand, runs the main job: device information, a short
/// side-by-side benchmark of every allocator and a replay of the logs named
/// by --trace (a file or a folder) or found in ./traces, ../shared/traces or
/// gpu-bundle/traces.
#[derive(Parser, Debug)]
#[command(name = "gpumem", version)]
struct Cli {
    /// Which device to run on: the real GPU, the simulated device, or auto
    /// (the GPU when present).
    #[arg(long, global = true, value_enum, default_value_t = DeviceChoice::Auto)]
    device: DeviceChoice,

    /// Main job only: the trace to replay, or a folder whose `.csv` logs are
    /// all replayed (default: those of the first of ./traces,
    /// ../shared/traces, gpu-bundle/traces that exists).
    #[arg(long)]
    trace: Option<PathBuf>,

    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the device, its memory and the features gpumem uses.
    Info,
    /// Allocate, copy and free through the device resource, checking contents.
    Demo,
    /// Run workloads through allocators side by side; print a table or JSON lines.
    Bench(BenchArgs),
    /// Host<->device copy bandwidth: pinned-pool memory versus pageable memory.
    Transfer(transfer::TransferArgs),
    /// Replay an RMM log (CSV) through allocators: time, ns/op, peak live and reserved.
    Replay(ReplayArgs),
    /// Draw live and reserved memory along a trace replay, one line per allocator.
    Plot(PlotArgs),
    /// How lean a pool that never moves memory could be on RMM logs, with
    /// every placement planned knowing the whole log (needs no device).
    Bound(BoundArgs),
    /// Write an interactive HTML page of a log replayed through allocators:
    /// timeline, memory maps, side-by-side figures (works offline).
    View(ViewArgs),
    /// Convert a PyTorch memory snapshot (pickle) to an RMM log (CSV).
    ConvertSnapshot(ConvertArgs),
    /// What the C ABI (gpumem_malloc/gpumem_free) adds per call over the same
    /// resource called from Rust.
    CapiCost(CapiCostArgs),
}

#[derive(Args, Debug)]
struct CapiCostArgs {
    /// The configuration, in GPUMEM_CONF's syntax.
    #[arg(long, default_value = "resource=pool")]
    conf: String,
    /// Allocate/free pairs per timed run and path (1 to 10^9).
    #[arg(long, default_value_t = 1_000_000, value_parser = count_in(1..=1_000_000_000))]
    pairs: usize,
    /// Timed runs per path (1 to 1000); the median is reported.
    #[arg(long, default_value_t = 7, value_parser = count_in(1..=1000))]
    runs: usize,
    /// Request sizes, comma-separated, used in turn.
    #[arg(long, value_delimiter = ',', default_value = "512,64K,1M", value_parser = parse_nonzero_size)]
    sizes: Vec<usize>,
    /// Pass the legacy default stream (0) instead of a stream of its own.
    #[arg(long)]
    legacy_stream: bool,
    /// Paths to measure, comma-separated: resource, stack, capi (default: all).
    #[arg(long, value_delimiter = ',')]
    path: Vec<String>,
    /// Threads making pairs at once, each on its own stream (1 to 256);
    /// ns per call is then wall time over all their calls.
    #[arg(long, default_value_t = 1, value_parser = count_in(1..=256))]
    threads: usize,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct AllocArg {
    /// Allocators, comma-separated (default: all, every resource with its
    /// defaults): GPUMEM_CONF's resource names (`gpumem bench
    /// --list-allocators`), each meaning what GPUMEM_CONF=resource=NAME
    /// means, with more GPUMEM_CONF settings after `+`, e.g.
    /// `pool+expandable=false,vpool+spread=always+shards=4,async`.
    #[arg(long, value_delimiter = ',')]
    alloc: Vec<String>,
}

#[derive(Args, Debug)]
struct BenchArgs {
    /// Print the allocator names (GPUMEM_CONF's resources), one per line,
    /// and exit.
    #[arg(long)]
    list_allocators: bool,
    #[command(flatten)]
    alloc: AllocArg,
    /// Workloads, comma-separated (default: same,random,threads,holes, plus
    /// replay when --trace is given; iterations only when asked for).
    #[arg(long, value_delimiter = ',', value_enum)]
    workload: Vec<Workload>,
    /// Runs per workload and allocator (1 to 1000); the median is reported.
    #[arg(long, default_value_t = 3, value_parser = count_in(1..=1000))]
    repeats: usize,
    /// same: bytes per request (256, 4K, 1MiB, ...).
    #[arg(long, default_value = "1MiB", value_parser = parse_nonzero_size)]
    size: usize,
    /// same, holes: alloc/free pairs timed (1 to 10^9).
    #[arg(long, default_value_t = 1000, value_parser = count_in(1..=1_000_000_000))]
    iters: usize,
    /// random, threads: steps in all, threads split them (1 to 10^8).
    #[arg(long, default_value_t = 10_000, value_parser = count_in(1..=100_000_000))]
    ops: usize,
    /// random, threads: most blocks live at once, threads split them (1 to 10^7).
    #[arg(long, default_value_t = 1000, value_parser = count_in(1..=10_000_000))]
    max_live: usize,
    /// random, threads: smallest request.
    #[arg(long, default_value = "256", value_parser = parse_nonzero_size)]
    min_size: usize,
    /// random: largest request.
    #[arg(long, default_value = "64MiB", value_parser = parse_nonzero_size)]
    max_size: usize,
    /// threads: largest request.
    #[arg(long, default_value = "4MiB", value_parser = parse_nonzero_size)]
    thread_max_size: usize,
    /// Seed of the random sequences.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// threads: how many threads, each with its own stream (1 to 1024).
    #[arg(long, default_value_t = 8, value_parser = count_in(1..=1024))]
    threads: usize,
    /// holes: free holes left between live blocks before timing (0 to 10^7).
    #[arg(long, default_value_t = 4096, value_parser = count_in(0..=10_000_000))]
    holes: usize,
    /// replay: the RMM log to replay (`-`: standard input).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Print JSON lines instead of a table (no progress bar).
    #[arg(long)]
    json: bool,
    /// Time the steady state: run each workload once untimed on the same
    /// allocator before the timed run (default: cold, growth included).
    #[arg(long)]
    warm: bool,
    /// Like --warm, with this many untimed runs first (1 to 1000).
    #[arg(long, value_name = "N", value_parser = count_in(1..=1000))]
    warm_passes: Option<usize>,
    /// Timed runs of each workload on the same allocator, each timed alone
    /// (1 to 1000): ns/op of the first, the second and the steady state (the
    /// median of the later passes) are reported.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = count_in(1..=1000))]
    passes: usize,
    /// iterations: training iterations per pass (1 to 100000).
    #[arg(long, default_value_t = 20, value_parser = count_in(1..=100_000))]
    iterations: usize,
    /// iterations: how much sizes change between iterations, 0.0 (identical
    /// iterations) to 1.0 (a size factor log-uniform in [1 - 0.9 F, 1 + F]
    /// per iteration).
    #[arg(long, value_name = "F", default_value_t = 0.3, value_parser = parse_vary, allow_negative_numbers = true)]
    vary: f64,
    /// iterations: sequences per batch (1 to 4096); activations grow with it.
    #[arg(long, default_value_t = gpumem_cli::iterations::BATCH, value_parser = count_in(1..=4096))]
    batch: usize,
}

/// `--vary`: a number from 0.0 to 1.0.
fn parse_vary(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number"))?;
    bench::check_vary(v)
}

#[derive(Args, Debug)]
struct BoundArgs {
    /// RMM logs (Thread,Time,Action,Pointer,Size,Stream); `-` reads
    /// standard input.
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ReplayArgs {
    /// The RMM log (Thread,Time,Action,Pointer,Size,Stream); `-` reads
    /// standard input.
    trace: PathBuf,
    #[command(flatten)]
    alloc: AllocArg,
    /// Runs per allocator (1 to 1000); the median is reported.
    #[arg(long, default_value_t = 1, value_parser = count_in(1..=1000))]
    repeats: usize,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
    /// Time the steady state: replay once untimed on the same allocator first.
    #[arg(long)]
    warm: bool,
    /// Like --warm, with this many untimed replays first (1 to 1000).
    #[arg(long, value_name = "N", value_parser = count_in(1..=1000))]
    warm_passes: Option<usize>,
    /// Also write gpumem's own RMM log of the replay (through the
    /// LoggingAdaptor, in one extra untimed run): FILE for one allocator,
    /// FILE's stem.ALLOC.ext for each of several.
    #[arg(long)]
    log: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct PlotArgs {
    /// The RMM log to replay (`-`: standard input).
    trace: PathBuf,
    #[command(flatten)]
    alloc: AllocArg,
    /// Output file: .svg, .png or .html.
    #[arg(short, long)]
    output: PathBuf,
    /// X axis: the event index or the trace's time.
    #[arg(long, value_enum, default_value_t = plot::XAxis::Index)]
    x: plot::XAxis,
    /// Picture size in pixels, WIDTHxHEIGHT, each 100 to 10000.
    #[arg(long, default_value = "1200x700", value_parser = plot::parse_picture_size)]
    size: (u32, u32),
}

#[derive(Args, Debug)]
struct ViewArgs {
    /// The log: an RMM log or a GPUMEM_CONF log= recording (CSV), or a
    /// PyTorch memory snapshot (pickle, from torch.cuda.memory._dump_snapshot);
    /// `-` reads standard input.
    trace: PathBuf,
    /// Allocators, comma-separated, named as for `gpumem replay` (default:
    /// pool,vpool,caching; `all`: every resource with its defaults).
    #[arg(long, value_delimiter = ',')]
    alloc: Vec<String>,
    /// The HTML page to write.
    #[arg(short, long)]
    output: PathBuf,
    /// Evenly spaced moments with memory maps, besides each allocator's
    /// peak, the live peak and the end of the log (0 to 1000).
    #[arg(long, default_value_t = view::DEFAULT_MOMENTS, value_parser = count_in(0..=view::MAX_MOMENTS as u64))]
    moments: usize,
    /// PyTorch snapshots: which device's trace (default: the only one with
    /// events).
    #[arg(long)]
    device_index: Option<usize>,
    /// PyTorch snapshots: which event is the free.
    #[arg(long, value_enum, default_value_t = snapshot::FreeOn::Completed)]
    free_on: snapshot::FreeOn,
}

#[derive(Args, Debug)]
struct ConvertArgs {
    /// The snapshot pickle (`torch.cuda.memory._dump_snapshot`); `-` reads
    /// standard input.
    snapshot: PathBuf,
    /// The RMM log to write.
    #[arg(short, long)]
    output: PathBuf,
    /// Which device's trace to convert (default: the only one with events).
    #[arg(long)]
    device_index: Option<usize>,
    /// Which snapshot event is the free: when the program asked for it or when
    /// the caching allocator completed it (after cross-stream uses).
    #[arg(long, value_enum, default_value_t = snapshot::FreeOn::Completed)]
    free_on: snapshot::FreeOn,
}

fn main() {
    // The library's warnings and errors (a leak report, a failure in a
    // `Drop`) as `gpumem: ...` lines on stderr.
    gpumem::logger::StderrLogger::install();
    let result = match Cli::try_parse() {
        Ok(cli) => run(cli),
        // Help and version: printed here, as clap would print them ignoring
        // a closed pipe or a full disk.
        Err(e) if !e.use_stderr() => output::text(&e.render().to_string()).map_err(Into::into),
        Err(e) => e.exit(),
    };
    if let Err(e) = result.and_then(|()| Ok(output::flush()?)) {
        if output::is_broken_pipe(&e) {
            // The reader went away (`gpumem ... | head`): nothing to say.
            std::process::exit(output::BROKEN_PIPE_STATUS);
        }
        output::errln(format_args!("gpumem: error: {e:#}"));
        std::process::exit(1);
    }
}

/// The device for measuring: address-only simulation (80 GiB, no host memory
/// behind it), so real traces with 14 GB peaks replay on a small machine.
fn measuring_target(choice: DeviceChoice, quiet: bool) -> Result<Target> {
    let t = target::open(choice, false)?;
    if !quiet {
        target::print_device_line(&t)?;
        print_measures(&t)?;
    }
    Ok(t)
}

fn print_measures(t: &Target) -> Result<()> {
    let what = match t.device.backend() {
        gpumem::Backend::Cuda => "real GPU allocations",
        gpumem::Backend::Sim => "bookkeeping only (simulated device: no GPU time)",
    };
    outln!("measuring: {what}")?;
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Some(Command::Info) => Ok(target::print_info(&target::open(cli.device, false)?)?),
        Some(Command::Demo) => {
            let t = target::open(cli.device, true)?;
            target::print_info(&t)?;
            Ok(demo::run(&t)?)
        }
        Some(Command::Bench(a)) => cmd_bench(cli.device, a),
        Some(Command::Transfer(a)) => Ok(transfer::run(&target::open(cli.device, true)?, &a)?),
        Some(Command::Replay(a)) => cmd_replay(cli.device, a),
        Some(Command::Bound(a)) => cmd_bound(a),
        Some(Command::Plot(a)) => cmd_plot(cli.device, a),
        Some(Command::View(a)) => cmd_view(cli.device, a),
        Some(Command::ConvertSnapshot(a)) => cmd_convert(a),
        Some(Command::CapiCost(a)) => cmd_capi_cost(cli.device, a),
        None => main_job(cli.device, cli.trace),
    }
}

fn json_line(r: &BenchRecord) -> Result<()> {
    let line = serde_json::to_string(r).context("writing a record as JSON")?;
    Ok(outln!("{line}")?)
}

/// Runs `cfg` and prints its records (a table, or JSON lines as they come).
/// Failed runs are records too: see [`bench::check_records`].
fn run_bench(
    t: &Target,
    cfg: &BenchConfig,
    alloc: &[String],
    json: bool,
) -> Result<Vec<BenchRecord>> {
    let specs = allocators::select(alloc)?;
    let ctx = RunContext::new(t.device.clone())?;
    let pb = progress::bar(0, json);
    let records = bench::run(&ctx, cfg, &specs, &pb, |r| {
        if json {
            json_line(r)?;
        }
        Ok(())
    })?;
    if !json {
        bench::print_table(&records)?;
    }
    Ok(records)
}

/// Untimed runs before the timed one from `--warm` and `--warm-passes N`
/// (which implies `--warm`; clap keeps N at least 1).
fn warm_passes(warm: bool, passes: Option<usize>) -> usize {
    passes.unwrap_or(usize::from(warm))
}

fn cmd_bench(choice: DeviceChoice, a: BenchArgs) -> Result<()> {
    if a.list_allocators {
        for name in allocators::names() {
            outln!("{name}")?;
        }
        return Ok(());
    }
    let mut workloads = a.workload.clone();
    if workloads.is_empty() {
        workloads = BenchConfig::default().workloads;
        if a.trace.is_some() {
            workloads.push(Workload::Replay);
        }
    }
    if workloads.contains(&Workload::Replay) && a.trace.is_none() {
        bail!("--workload replay needs --trace FILE");
    }
    allocators::select(&a.alloc.alloc)?;
    let mut cfg = BenchConfig {
        workloads,
        repeats: a.repeats,
        size: a.size,
        iters: a.iters,
        ops: a.ops,
        max_live: a.max_live,
        min_size: a.min_size,
        max_size: a.max_size,
        thread_max_size: a.thread_max_size,
        seed: a.seed,
        threads: a.threads,
        holes: a.holes,
        trace: None,
        warm_passes: warm_passes(a.warm, a.warm_passes),
        passes: a.passes,
        iterations: a.iterations,
        vary: a.vary,
        batch: a.batch,
    };
    cfg.check()?;
    if let (Some(path), true) = (&a.trace, cfg.workloads.contains(&Workload::Replay)) {
        cfg.trace = Some(replay::load(path)?);
    }
    let t = measuring_target(choice, a.json)?;
    let records = run_bench(&t, &cfg, &a.alloc.alloc, a.json)?;
    bench::check_records(&records)
}

/// Replays `trace` through `alloc`, `repeats` times each, and prints the
/// records (after the trace's own report, for a table).
fn replay_trace(
    t: &Target,
    trace: &replay::Trace,
    alloc: &[String],
    repeats: usize,
    warm_passes: usize,
    json: bool,
) -> Result<Vec<BenchRecord>> {
    let prep = &trace.prep;
    if !json {
        outln!("\ntrace {}: {}", trace.path.display(), prep.report)?;
        if prep.skipped_failures + prep.skipped_unknown_frees + prep.skipped_zero > 0 {
            outln!(
                "  skipped: {} failed allocations, {} frees of unknown pointers, {} zero-byte requests",
                prep.skipped_failures,
                prep.skipped_unknown_frees,
                prep.skipped_zero
            )?;
        }
    }
    let cfg = BenchConfig {
        workloads: vec![Workload::Replay],
        repeats,
        trace: Some(trace.clone()),
        warm_passes,
        ..BenchConfig::default()
    };
    run_bench(t, &cfg, alloc, json)
}

fn cmd_replay(choice: DeviceChoice, a: ReplayArgs) -> Result<()> {
    let specs = allocators::select(&a.alloc.alloc)?;
    let logs: Vec<PathBuf> = a
        .log
        .iter()
        .flat_map(|log| {
            specs
                .iter()
                .map(|s| replay::log_path(log, &s.name, specs.len()))
        })
        .collect();
    for path in &logs {
        output::check_writable(path).context("--log")?;
    }
    let trace = replay::load(&a.trace)?;
    let t = measuring_target(choice, a.json)?;
    let records = replay_trace(
        &t,
        &trace,
        &a.alloc.alloc,
        a.repeats,
        warm_passes(a.warm, a.warm_passes),
        a.json,
    )?;
    bench::check_records(&records)?;
    for (s, path) in specs.iter().zip(&logs) {
        let alloc = s.build(&t.device)?;
        let rows = replay::write_log(&alloc, &t.device, &trace.prep, path)
            .with_context(|| format!("writing the log of {} to {}", s.name, path.display()))?;
        if !a.json {
            outln!(
                "log of the replay through {}: {} ({rows} rows)",
                s.name,
                path.display()
            )?;
        }
    }
    Ok(())
}

fn cmd_bound(a: BoundArgs) -> Result<()> {
    if a.traces.iter().filter(|t| t.as_os_str() == "-").count() > 1 {
        bail!("standard input (-) can be read once");
    }
    let pb = progress::bar((a.traces.len() * 2 * bound::ORDERS.len()) as u64, a.json);
    for path in &a.traces {
        let trace = replay::load(path)?;
        pb.set_message(trace.name.clone());
        let records = bound::bound(&trace.name, &trace.prep, |_| pb.inc(1));
        pb.suspend(|| -> Result<()> {
            if a.json {
                for r in &records {
                    outln!("{}", serde_json::to_string(r)?)?;
                }
                return Ok(());
            }
            let first = &records[0];
            outln!(
                "{}: {} blocks, live peak {}; range needed over the live peak:",
                trace.path.display(),
                first.blocks,
                fmt_bytes(first.peak_live)
            )?;
            outln!("  {:<16} {:>9} {:>9}", "order", "first fit", "best fit")?;
            for pair in records.chunks(2) {
                outln!(
                    "  {:<16} {:>9.4} {:>9.4}",
                    pair[0].order.name(),
                    pair[0].ratio,
                    pair[1].ratio
                )?;
            }
            Ok(())
        })?;
    }
    pb.finish_and_clear();
    Ok(())
}

fn cmd_plot(choice: DeviceChoice, a: PlotArgs) -> Result<()> {
    let specs = allocators::select(&a.alloc.alloc)?;
    plot::Format::of(&a.output)?;
    output::check_writable(&a.output)?;
    let trace = replay::load(&a.trace)?;
    let prep = &trace.prep;
    let t = measuring_target(choice, false)?;
    let pb = progress::bar(specs.len() as u64, false);
    let mut series = Vec::new();
    for s in &specs {
        pb.set_message(s.name.clone());
        let alloc = s.build(&t.device)?;
        let tl = replay::timeline(&alloc, &t.device, prep, 4000)
            .with_context(|| format!("replaying through {}", s.name))?;
        series.push((s.name.clone(), tl));
        pb.inc(1);
    }
    pb.finish_and_clear();
    let title = format!("{} on {}", trace.name, t.device.backend());
    plot::draw(&a.output, &title, &series, a.x, a.size)?;
    outln!("wrote {}", a.output.display())?;
    for (name, tl) in &series {
        outln!(
            "  {name}: peak reserved {} (peak live {}, ratio {:.2})",
            fmt_bytes(tl.peak_reserved),
            fmt_bytes(prep.peak_live as u64),
            tl.peak_reserved as f64 / prep.peak_live.max(1) as f64
        )?;
    }
    Ok(())
}

fn cmd_view(choice: DeviceChoice, a: ViewArgs) -> Result<()> {
    let specs = view::select(&a.alloc)?;
    view::check_output(&a.output)?;
    output::check_writable(&a.output)?;
    let opts = view::ViewOptions {
        moments: a.moments,
        device_index: a.device_index,
        free_on: a.free_on,
    };
    let input = view::load(&a.trace, &opts)?;
    let t = measuring_target(choice, false)?;
    let device_text = format!("{} ({})", t.device.backend(), t.device.info()?.name);
    // Two replays per allocator: one for its peak, one for the page.
    let pb = progress::bar(2 * specs.len() as u64, false);
    let data = view::build(&input, &specs, &t.device, &device_text, &opts, |name| {
        pb.set_message(name.to_string());
        pb.inc(1);
    })?;
    pb.finish_and_clear();
    let bytes = view::write(&data, &a.output)?;
    outln!(
        "wrote {} ({}; {} events, {} map moments)",
        a.output.display(),
        fmt_bytes(bytes),
        data.source.ops,
        data.moments.len()
    )?;
    for al in &data.allocators {
        outln!(
            "  {}: peak reserved {} (peak live {}, ratio {:.2})",
            al.name,
            fmt_bytes(al.peak_reserved),
            fmt_bytes(data.peak_live),
            al.ratio
        )?;
    }
    Ok(())
}

fn cmd_capi_cost(choice: DeviceChoice, a: CapiCostArgs) -> Result<()> {
    // The C ABI's allocator takes its backend from GPUMEM_DEVICE when it is
    // first used, which is below: nothing else runs yet.
    let backend = match choice {
        DeviceChoice::Auto => "auto",
        DeviceChoice::Cuda => "cuda",
        DeviceChoice::Sim => "sim",
    };
    std::env::set_var(gpumem_capi::allocator::DEVICE_ENV, backend);
    capi_cost::configure(&a.conf)?;
    let cfg = capi_cost::CostConfig {
        conf: a.conf,
        pairs: a.pairs,
        runs: a.runs,
        sizes: a.sizes,
        legacy_stream: a.legacy_stream,
        paths: a.path,
        threads: a.threads,
    };
    let device = gpumem_capi::device_resource(0)
        .context("the C ABI cannot serve device 0")?
        .device()
        .clone();
    let ctx = RunContext::new(device)?;
    if !a.json {
        outln!("device: {} ({})", ctx.device_kind, ctx.device_name)?;
        outln!("measuring: {}", ctx.measures())?;
    }
    let records = capi_cost::run(&ctx, &cfg)?;
    if a.json {
        for r in &records {
            let line = serde_json::to_string(r).context("writing a record as JSON")?;
            outln!("{line}")?;
        }
    } else {
        capi_cost::print_table(&records)?;
    }
    Ok(())
}

fn cmd_convert(a: ConvertArgs) -> Result<()> {
    output::check_writable(&a.output)?;
    let s = snapshot::convert_file(&a.snapshot, &a.output, a.device_index, a.free_on)?;
    outln!("{}: {s}", a.output.display())?;
    Ok(())
}

/// The traces the main job replays: `--trace`, else every `*.csv` of the first
/// of ./traces, ../shared/traces, gpu-bundle/traces that exists.
/// The traces the main job replays: `given` (a log, or a folder of `.csv`
/// logs, which must hold one), else the logs of the first default folder
/// that exists.
fn find_traces(given: Option<PathBuf>) -> Result<Vec<PathBuf>> {
    if let Some(p) = given {
        if !p.is_dir() {
            return Ok(vec![p]);
        }
        let files = csv_files(&p)?;
        if files.is_empty() {
            bail!(
                "--trace {}: the folder holds no .csv log (RMM logs, or GPUMEM_CONF=log= recordings)",
                p.display()
            );
        }
        return Ok(files);
    }
    for dir in ["traces", "../shared/traces", "gpu-bundle/traces"] {
        let dir = Path::new(dir);
        if dir.is_dir() {
            return csv_files(dir);
        }
    }
    Ok(Vec::new())
}

/// The `.csv` files directly in `dir`, by name.
fn csv_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let path = entry.with_context(|| format!("{}", dir.display()))?.path();
        if path.is_file() && path.extension().is_some_and(|e| e == "csv") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn main_job(choice: DeviceChoice, trace: Option<PathBuf>) -> Result<()> {
    // Every trace is read before anything is timed: a bad one fails at once.
    let traces = find_traces(trace)?
        .iter()
        .map(|p| replay::load(p))
        .collect::<Result<Vec<_>>>()?;
    let t = target::open(choice, false)?;
    target::print_info(&t)?;
    print_measures(&t)?;
    outln!("\nbench: every allocator, short same and random workloads")?;
    let cfg = BenchConfig {
        workloads: vec![Workload::Same, Workload::Random],
        repeats: 3,
        iters: 1000,
        ops: 5000,
        max_live: 500,
        ..BenchConfig::default()
    };
    let mut records = run_bench(&t, &cfg, &[], false)?;
    if traces.is_empty() {
        outln!(
            "\nreplay: no trace found (give --trace FILE, or put RMM logs in ./traces; \
             record one with GPUMEM_CONF=log=FILE)"
        )?;
    }
    for trace in &traces {
        records.extend(replay_trace(&t, trace, &[], 3, 0, false)?);
    }
    bench::check_records(&records)
}
