//! The gpumem command's measuring tools on the simulated device: the bench JSON
//! contract (in process and through the binary), trace replay, the snapshot
//! converter and the timeline plot.

use std::path::{Path, PathBuf};
use std::process::Command;

use gpumem::driver::sim::SimConfig;
use gpumem::Device;
use gpumem_cli::allocators;
use gpumem_cli::bench::{self, BenchConfig, RunContext, Workload};
use gpumem_cli::iterations::{self, IterationsConfig};
use gpumem_cli::{plot, replay, snapshot, workload};
use indicatif::ProgressBar;

const KEYS: &[&str] = &[
    "alloc",
    "workload",
    "device",
    "ns_per_op",
    "ops",
    "peak_live",
    "peak_reserved",
    "reserved_over_live",
    "date",
    "command",
    "device_name",
];

const SMALL_TRACE: &str = "\
Thread,Time,Action,Pointer,Size,Stream
1,10:00:00.000001,allocate,0x1000,256,0x0
2,10:00:00.000002,allocate,0x2000,1048576,0x5644c9042ce0
1,10:00:00.000003,allocate failure,0x0,1099511627776,0x0
3,10:00:00.000004,allocate,0x3000,4096,0x7
2,10:00:00.000005,free,0x1000,256,0x5644c9042ce0
1,10:00:00.000006,allocate,0x1000,65536,0x0
3,10:00:00.000007,free,0xdead,64,0x7
3,10:00:00.000008,free,0x3000,4096,0x7
1,10:00:00.000009,free,0x1000,65536,0x0
";

/// The most bytes live at once along `ops` (allocate?, bytes), each block
/// rounded up to the driver's 256-byte granule: what `cuda` holds at its
/// peak.
fn granule_peak(ops: impl Iterator<Item = (bool, usize)>) -> u64 {
    let (mut live, mut peak) = (0u64, 0u64);
    for (alloc, size) in ops {
        let size = size.next_multiple_of(256) as u64;
        if alloc {
            live += size;
            peak = peak.max(live);
        } else {
            live -= size;
        }
    }
    peak
}

fn sim() -> Device {
    Device::sim(SimConfig::default())
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn shared_trace(name: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::env::var("GPUMEM_TRACES")
        .ok()
        .map(PathBuf::from)
        .into_iter()
        .chain([root.join("../shared/traces"), root.join("traces")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn tiny_config(trace: &Path) -> BenchConfig {
    BenchConfig {
        workloads: vec![
            Workload::Same,
            Workload::Random,
            Workload::Threads,
            Workload::Holes,
            Workload::Replay,
            Workload::Iterations,
        ],
        repeats: 3,
        size: 4096,
        iters: 20,
        ops: 200,
        max_live: 16,
        min_size: 256,
        max_size: 1 << 20,
        thread_max_size: 64 << 10,
        seed: 1,
        threads: 2,
        holes: 8,
        trace: Some(replay::load(trace).unwrap()),
        warm_passes: 0,
        passes: 1,
        iterations: 2,
        vary: 0.5,
        batch: 1,
    }
}

#[test]
fn allocator_table_lists_cuda_and_async() {
    let names = allocators::names();
    assert!(names.contains(&"cuda"));
    assert!(names.contains(&"async"));
    assert_eq!(allocators::select(&[]).unwrap().len(), names.len());
    let two = allocators::select(&["async".into(), "cuda".into()]).unwrap();
    assert_eq!(two[0].name, "async");
    let err = allocators::select(&["nope".into()])
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("nope") && err.contains("async"), "{err}");
    // Every allocator builds on the simulated device, and only `vpool`
    // counts mappings.
    for spec in allocators::select(&[]).unwrap() {
        let alloc = spec
            .build(&sim())
            .unwrap_or_else(|e| panic!("{}: {e}", spec.name));
        assert_eq!(
            alloc.mappings_made().is_some(),
            spec.name == "vpool",
            "{}",
            spec.name
        );
    }
}

#[test]
fn warm_runs_are_marked_and_measured() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("small.csv");
    std::fs::write(&trace, SMALL_TRACE).unwrap();
    let ctx = RunContext::new(sim()).unwrap();
    let cfg = BenchConfig {
        warm_passes: 3,
        workloads: vec![Workload::Random, Workload::Replay],
        ..tiny_config(&trace)
    };
    let specs = allocators::select(&["pool".into(), "cuda".into()]).unwrap();
    let records = bench::run(&ctx, &cfg, &specs, &ProgressBar::hidden(), |_| Ok(())).unwrap();
    assert_eq!(records.len(), 4);
    for r in &records {
        assert!(r.warm && r.error.is_none(), "{r:?}");
        assert_eq!(r.warm_passes, 3, "{r:?}");
        assert!(r.ns_per_op.unwrap() > 0.0);
        let line = serde_json::to_string(r).unwrap();
        assert!(line.contains("\"warm\":true"), "{line}");
        assert!(line.contains("\"warm_passes\":3"), "{line}");
    }
}

#[test]
fn bench_json_contract_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("small.csv");
    std::fs::write(&trace, SMALL_TRACE).unwrap();
    let ctx = RunContext::new(sim()).unwrap();
    let cfg = tiny_config(&trace);
    let specs = allocators::select(&[]).unwrap();
    let mut streamed = 0;
    let records = bench::run(&ctx, &cfg, &specs, &ProgressBar::hidden(), |_| {
        streamed += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(records.len(), 6 * specs.len());
    assert_eq!(streamed, records.len());
    for r in &records {
        assert!(
            r.error.is_none(),
            "{} / {}: {:?}",
            r.alloc,
            r.workload,
            r.error
        );
        let line = serde_json::to_string(r).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        for k in KEYS {
            assert!(v.get(k).is_some(), "key {k} missing in {line}");
        }
        assert_eq!(v["device"], "sim");
        assert!(v["ns_per_op"].as_f64().unwrap() > 0.0, "{line}");
        assert!(v["ops"].as_u64().unwrap() > 0);
        assert!(v["peak_live"].as_u64().unwrap() > 0);
        assert!(v["peak_reserved"].as_u64().unwrap() > 0, "{line}");
        assert!(v["reserved_over_live"].as_f64().unwrap() > 0.0);
        assert!(v["date"].as_str().unwrap().ends_with('Z'));
        assert!(v["measures"].as_str().unwrap().contains("bookkeeping"));
        assert_eq!(r.repeats, 3);
    }
    let get = |a: &str, w: &str| {
        records
            .iter()
            .find(|r| r.alloc == a && r.workload == w)
            .unwrap()
    };
    // Operation counts follow the parameters.
    assert_eq!(get("cuda", "same").ops, 40);
    assert_eq!(get("cuda", "holes").ops, 40);
    assert_eq!(get("cuda", "random").ops, 200);
    assert_eq!(get("cuda", "threads").ops, 200);
    // The replay skips the failure row and the unknown free.
    assert_eq!(get("cuda", "replay").ops, 7);
    // The training loop: the same sequence for every allocator.
    let loop_ops = get("cuda", "iterations").ops;
    assert!(records
        .iter()
        .filter(|r| r.workload == "iterations")
        .all(|r| r.ops == loop_ops && r.vary == Some(0.5) && r.iterations == Some(2)));
    // The plain device resource holds exactly what is live, in the driver's
    // 256-byte granules (as the C ABI counts `cuda`'s reserve).
    let pass = iterations::generate(
        &IterationsConfig {
            iterations: 2,
            vary: 0.5,
            seed: 1,
            batch: 1,
        },
        0,
    );
    let ops = pass.prep.ops.iter().map(|o| (o.alloc, o.size));
    assert_eq!(
        get("cuda", "iterations").peak_reserved,
        Some(granule_peak(ops))
    );
    assert_eq!(get("cuda", "same").peak_reserved, Some(4096));
    assert_eq!(get("cuda", "same").reserved_over_live, Some(1.0));
    let random = workload::random_sequence(200, 16, 256, 1 << 20, 1);
    let ops = random.ops.iter().map(|o| (o.alloc, o.size));
    assert_eq!(get("cuda", "random").peak_reserved, Some(granule_peak(ops)));
    assert_eq!(get("cuda", "replay").peak_live, 1048576 + 4096 + 65536);
    assert_eq!(
        get("cuda", "replay").peak_reserved,
        Some(1048576 + 4096 + 65536)
    );
    assert_eq!(get("cuda", "holes").peak_live, 17 * 65536);
}

#[test]
fn bench_workload_replay_needs_a_trace() {
    let ctx = RunContext::new(sim()).unwrap();
    let cfg = BenchConfig {
        workloads: vec![Workload::Replay],
        trace: None,
        ..BenchConfig::default()
    };
    let specs = allocators::select(&[]).unwrap();
    let err = bench::run(&ctx, &cfg, &specs, &ProgressBar::hidden(), |_| Ok(())).unwrap_err();
    assert!(err.to_string().contains("--trace"), "{err}");
}

#[test]
fn replay_of_a_real_trace_through_cuda_holds_the_live_bytes_in_granules() {
    let Some(path) = shared_trace("resnet50_train.rmm.csv") else {
        eprintln!("skipped: resnet50_train.rmm.csv not found");
        return;
    };
    let events = gpumem::trace::read_file(path).unwrap();
    let prep = replay::prepare(&events).unwrap();
    assert_eq!(prep.ops.len(), 10_172);
    assert_eq!(prep.peak_live, 3_265_807_076);
    let device = sim();
    for spec in allocators::select(&[]).unwrap() {
        let alloc = spec.build(&device).unwrap();
        let t =
            gpumem_cli::workload::run_replay(&*alloc.resource, &device, &prep, None, None).unwrap();
        assert_eq!(t.ops, 10_172);
        let peak = alloc.pool.peak_reserved_bytes();
        assert!(peak >= prep.peak_live, "{}: {peak}", spec.name);
        if spec.name == "cuda" {
            let ops = prep.ops.iter().map(|o| (o.alloc, o.size));
            assert_eq!(peak as u64, granule_peak(ops));
        }
        // Everything is given back after the replay.
        if spec.name == "cuda" {
            assert_eq!(alloc.pool.reserved_bytes(), 0);
        }
    }
}

#[test]
fn converter_reads_every_protocol_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let mut outputs = Vec::new();
    for proto in [2, 4, 5] {
        let out = dir.path().join(format!("p{proto}.csv"));
        let stats = snapshot::convert_file(
            &data(&format!("snapshot_p{proto}.pickle")),
            &out,
            None,
            snapshot::FreeOn::Completed,
        )
        .unwrap();
        assert_eq!(stats.device, 0);
        assert_eq!(stats.events_in, 16);
        assert_eq!(stats.rows, 9);
        assert_eq!(stats.skipped.get("free_requested"), Some(&4));
        assert_eq!(stats.skipped.get("segment_alloc"), Some(&1));
        assert!(stats.report.is_clean(), "{}", stats.report);
        assert_eq!(stats.report.failures, 1);
        assert_eq!(stats.report.streams, 2);
        outputs.push(std::fs::read_to_string(out).unwrap());
    }
    assert_eq!(outputs[0], outputs[1]);
    assert_eq!(outputs[1], outputs[2]);
    let expected = "\
Thread,Time,Action,Pointer,Size,Stream
0,17:00:00.000002,allocate,0x7f0000000000,4096,0x0
0,17:00:00.000003,allocate,0x7f0000001000,1048576,0x0
0,17:00:00.000004,allocate,0x7f0000200000,512,0x558706afe0e0
0,17:00:00.000006,free,0x7f0000000000,4096,0x0
0,17:00:00.000007,allocate,0x7f0000000000,2048,0x0
0,17:00:00.000008,allocate failure,0x0,1099511627776,0x0
0,17:00:00.000012,free,0x7f0000200000,512,0x558706afe0e0
0,17:00:00.000013,free,0x7f0000001000,1048576,0x0
0,17:00:00.000014,free,0x7f0000000000,2048,0x0
";
    assert_eq!(outputs[0], expected);
    // The converted log replays.
    let events = gpumem::trace::parse_str(&outputs[0]).unwrap();
    let prep = replay::prepare(&events).unwrap();
    assert_eq!(prep.skipped_failures, 1);
    assert_eq!(prep.peak_live, 4096 + 1048576 + 512);
}

#[test]
fn converter_free_on_requested_and_errors() {
    let bytes = std::fs::read(data("snapshot_p4.pickle")).unwrap();
    let value = snapshot::read_pickle(&bytes).unwrap();
    let (events, stats) = snapshot::convert(&value, Some(0), snapshot::FreeOn::Requested).unwrap();
    assert_eq!(stats.skipped.get("free_completed"), Some(&4));
    // The side-stream block's free is requested at 9 µs (completed at 12).
    let side_free = events
        .iter()
        .find(|e| e.action == gpumem::trace::Action::Free && e.size == 512)
        .unwrap();
    assert_eq!(side_free.time_us % 1_000_000, 9);

    let err = snapshot::convert(&value, Some(5), snapshot::FreeOn::Completed).unwrap_err();
    assert!(err.to_string().contains("2 device traces"), "{err}");
    let err = snapshot::convert(&value, Some(1), snapshot::FreeOn::Completed).unwrap();
    assert_eq!(err.1.rows, 0);

    let not_snapshot = serde_pickle::to_vec(&vec![1, 2, 3], Default::default()).unwrap();
    let v = snapshot::read_pickle(&not_snapshot).unwrap();
    let err = snapshot::convert(&v, None, snapshot::FreeOn::Completed).unwrap_err();
    assert!(err.to_string().contains("not a dict"), "{err}");
    assert!(snapshot::read_pickle(b"not a pickle").is_err());
}

#[test]
fn plot_writes_svg_and_html_with_the_legend() {
    let events = gpumem::trace::parse_str(SMALL_TRACE).unwrap();
    let prep = replay::prepare(&events).unwrap();
    let device = sim();
    let mut series = Vec::new();
    for spec in allocators::select(&[]).unwrap() {
        let alloc = spec.build(&device).unwrap();
        let tl = replay::timeline(&alloc, &device, &prep, 1000).unwrap();
        assert_eq!(tl.live.len(), prep.ops.len());
        series.push((spec.name.clone(), tl));
    }
    // The trace's sizes are whole 256-byte granules: `cuda` holds exactly
    // what is live.
    let cuda = series.iter().find(|(name, _)| name == "cuda").unwrap();
    assert_eq!(cuda.1.peak_reserved as usize, prep.peak_live);
    let dir = tempfile::tempdir().unwrap();
    for (file, x) in [("t.svg", plot::XAxis::Index), ("t.html", plot::XAxis::Time)] {
        let path = dir.path().join(file);
        plot::draw(&path, "small trace", &series, x, (800, 500)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.len() > 1000);
        for label in [
            "live (requested)",
            "cuda reserved",
            "async reserved",
            "memory (GiB)",
        ] {
            assert!(text.contains(label), "{file}: no {label:?}");
        }
        if file.ends_with("html") {
            assert!(text.starts_with("<!DOCTYPE html>") && text.contains("<svg"));
        }
    }
    let err = plot::draw(
        &dir.path().join("t.gif"),
        "t",
        &series,
        plot::XAxis::Index,
        (10, 10),
    )
    .unwrap_err();
    assert!(err.to_string().contains(".svg"), "{err}");
}

/// The `gpumem` binary: the one cargo built, or `GPUMEM_BIN` where the tests
/// run away from the build tree (the GPU bundle).
fn gpumem_command(args: &[&str]) -> Command {
    let bin = std::env::var("GPUMEM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_gpumem").into());
    let mut c = Command::new(bin);
    c.args(args);
    c
}

fn gpumem(args: &[&str]) -> std::process::Output {
    gpumem_command(args).output().unwrap()
}

/// The JSON lines a successful run printed.
fn json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn command_line_bench_json_and_errors() {
    let out = gpumem(&["bench", "--list-allocators"]);
    assert!(out.status.success());
    let list = String::from_utf8(out.stdout).unwrap();
    assert_eq!(list.lines().collect::<Vec<_>>(), allocators::names());

    let out = gpumem(&[
        "--device",
        "sim",
        "bench",
        "--json",
        "--workload",
        "same,random",
        "--iters",
        "10",
        "--ops",
        "50",
        "--repeats",
        "1",
        "--alloc",
        "cuda",
    ]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2);
    for v in &lines {
        for k in KEYS {
            assert!(v.get(k).is_some(), "{k} missing: {v}");
        }
        assert!(v["command"].as_str().unwrap().contains("bench"));
    }
    // The progress bar stays off a non-terminal stderr.
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.csv");
    std::fs::write(
        &bad,
        "Thread,Time,Action,Pointer,Size,Stream\n1,10:00:00.1,allocate,0x10,many,0x0\n",
    )
    .unwrap();
    let out = gpumem(&["--device", "sim", "replay", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("line 2, column Size"), "{err}");

    let good = dir.path().join("good.csv");
    std::fs::write(&good, SMALL_TRACE).unwrap();
    let log = dir.path().join("ours.csv");
    let out = gpumem(&[
        "--device",
        "sim",
        "replay",
        good.to_str().unwrap(),
        "--alloc",
        "pool,cuda",
        "--log",
        log.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for alloc in ["pool", "cuda"] {
        let ours = gpumem::trace::read_file(dir.path().join(format!("ours.{alloc}.csv"))).unwrap();
        // The 7 calls the replay makes, and the free of the block the trace
        // leaks (0x2000), made after the replay.
        assert_eq!(ours.len(), 8, "{alloc}");
        let r = gpumem::trace::check(&ours).unwrap();
        assert!(r.is_clean(), "{alloc}: {r}");
        assert_eq!(r.peak_live, 1048576 + 4096 + 65536);
        assert_eq!(r.streams, 3);
    }

    let out = gpumem(&[
        "--device",
        "sim",
        "replay",
        good.to_str().unwrap(),
        "--alloc",
        "cuda",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("device: sim"), "{text}");
    assert!(text.contains("bookkeeping only"), "{text}");
    assert!(text.contains("1 failed allocations"), "{text}");
    assert!(
        text.contains("skipped: 1 failed allocations, 1 frees of unknown pointers"),
        "{text}"
    );

    let out = gpumem(&["--device", "sim", "bench", "--alloc", "nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("unknown resource \"nope\""));
}

#[test]
fn command_line_names_are_gpumem_conf_resources_with_settings_after_plus() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.csv");
    std::fs::write(&good, SMALL_TRACE).unwrap();
    let names = "pool+expandable=false,vpool+shards=1,async";
    let out = gpumem(&[
        "--device",
        "sim",
        "replay",
        good.to_str().unwrap(),
        "--alloc",
        names,
        "--json",
    ]);
    let lines = json_lines(&out);
    let got: Vec<&str> = lines.iter().map(|v| v["alloc"].as_str().unwrap()).collect();
    assert_eq!(got, names.split(',').collect::<Vec<_>>());
    for v in &lines {
        assert!(v["error"].is_null(), "{v}");
        assert!(v["peak_reserved"].as_u64().unwrap() > 0, "{v}");
    }
    // An old name: the error says the new one, on one line.
    let out = gpumem(&["--device", "sim", "bench", "--alloc", "cuda,pool-sharded"]);
    assert_eq!(out.status.code(), Some(1));
    let err = one_line_error(&out);
    assert!(
        err.contains("allocator \"pool-sharded\" is now \"pool+expandable=false+spread=always\""),
        "{err}"
    );
    // A bad setting: GPUMEM_CONF's own reason.
    let out = gpumem(&[
        "--device",
        "sim",
        "plot",
        "-",
        "--alloc",
        "pool+nccl_ready=true",
        "-o",
        "x.svg",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = one_line_error(&out);
    assert!(
        err.contains("nccl_ready means nothing for resource=pool (only for vpool)"),
        "{err}"
    );
}

#[test]
fn command_line_iterations_report_every_pass_in_json_and_the_table() {
    let args = [
        "--device",
        "sim",
        "bench",
        "--workload",
        "iterations",
        "--vary",
        "0.3",
        "--passes",
        "3",
        "--iterations",
        "2",
        "--batch",
        "1",
        "--repeats",
        "1",
        "--alloc",
        "pool,async",
    ];
    let lines = json_lines(&gpumem(&[&args[..], &["--json"]].concat()));
    assert_eq!(lines.len(), 2);
    for v in &lines {
        assert_eq!(v["workload"], "iterations");
        assert_eq!(v["vary"], 0.3);
        assert_eq!(v["passes"], 3);
        assert_eq!(v["pass_ns_per_op"].as_array().unwrap().len(), 3);
    }
    let out = gpumem(&args);
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    for word in ["first", "second", "steady", "3 timed passes", "vary=0.3"] {
        assert!(table.contains(word), "{word}: {table}");
    }
}

#[test]
fn capi_cost_measures_the_three_paths() {
    let lines = json_lines(&gpumem(&[
        "--device",
        "sim",
        "capi-cost",
        "--pairs",
        "2000",
        "--runs",
        "2",
        "--sizes",
        "512,1M",
        "--json",
    ]));
    let paths: Vec<&str> = lines.iter().map(|v| v["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["resource", "stack", "capi"]);
    for v in &lines {
        assert!(v["ns_per_call"].as_f64().unwrap() > 0.0, "{v}");
        assert!(v["overhead_ns_per_call"].is_f64(), "{v}");
        assert_eq!(v["device"], "sim");
        assert_eq!(v["stream"], "created");
        assert_eq!(v["sizes"], serde_json::json!([512, 1 << 20]));
        assert!(v["conf"].as_str().unwrap().starts_with("resource=pool"));
    }
    assert_eq!(lines[0]["overhead_ns_per_call"], 0.0);
    // One path alone (for a profiler), on the legacy default stream.
    let lines = json_lines(&gpumem(&[
        "--device",
        "sim",
        "capi-cost",
        "--conf",
        "resource=caching",
        "--path",
        "capi",
        "--legacy-stream",
        "--pairs",
        "100",
        "--runs",
        "1",
        "--json",
    ]));
    assert_eq!(lines.len(), 1);
    assert!(lines[0]["overhead_ns_per_call"].is_null());
    assert_eq!(lines[0]["stream"], "legacy");
    assert_eq!(lines[0]["threads"], 1);
    // Threads at once, each on its own stream, through every path.
    let lines = json_lines(&gpumem(&[
        "--device",
        "sim",
        "capi-cost",
        "--threads",
        "3",
        "--pairs",
        "500",
        "--runs",
        "2",
        "--json",
    ]));
    assert_eq!(lines.len(), 3);
    for v in &lines {
        assert_eq!(v["threads"], 3, "{v}");
        assert!(v["ns_per_call"].as_f64().unwrap() > 0.0, "{v}");
    }
    for (args, msg) in [
        (&["--path", "rust"][..], "unknown path \"rust\""),
        (&["--conf", "resource=nope"][..], "nope"),
    ] {
        let out = gpumem(&[&["--device", "sim", "capi-cost", "--pairs", "10"], args].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(one_line_error(&out).contains(msg), "{args:?}");
    }
}

#[test]
fn the_help_says_what_the_command_and_its_main_job_do() {
    let out = gpumem(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("gpumem, a GPU memory manager"), "{text}");
    assert!(
        text.contains("With no subcommand, runs the main job"),
        "{text}"
    );
    assert!(text.contains("(a file or a folder)"), "{text}");
    // Every subcommand has its one-line description.
    let commands: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert!(commands.len() >= 10, "{text}");
    for line in commands {
        assert!(line.split_whitespace().count() >= 3, "bare: {line:?}");
    }
}

/// A few quick runs that print to standard output.
const PRINTING_RUNS: &[&[&str]] = &[
    &["--help"],
    &["bench", "--list-allocators"],
    &["--device", "sim", "info"],
    &[
        "--device",
        "sim",
        "bench",
        "--json",
        "--workload",
        "same",
        "--iters",
        "2",
        "--repeats",
        "1",
        "--alloc",
        "cuda",
    ],
    &[
        "--device",
        "sim",
        "bench",
        "--workload",
        "same",
        "--iters",
        "2",
        "--repeats",
        "1",
        "--alloc",
        "cuda",
    ],
];

/// The standard error of a failed run: one line, `gpumem: error: ...`.
fn one_line_error(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(err.lines().count(), 1, "not one line: {err:?}");
    assert!(err.starts_with("gpumem: error: "), "{err:?}");
    err
}

#[test]
fn a_closed_pipe_ends_quietly_with_the_sigpipe_status() {
    for args in PRINTING_RUNS {
        // `gpumem ... | head -0`: the reading end is closed before any write.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = gpumem_command(args).stdout(writer).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}

#[test]
fn a_full_disk_is_a_one_line_error() {
    for args in PRINTING_RUNS {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let out = gpumem_command(args).stdout(full).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = one_line_error(&out);
        assert!(
            err.contains("writing to standard output") && err.contains("No space left"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn numbers_that_make_no_sense_are_refused_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    std::fs::write(&trace, SMALL_TRACE).unwrap();
    let trace = trace.to_str().unwrap();
    let svg = dir.path().join("t.svg");
    let svg = svg.to_str().unwrap();
    let cases: &[&[&str]] = &[
        &["bench", "--repeats", "0"],
        &["bench", "--threads", "0"],
        &["bench", "--threads", "100000"],
        &["bench", "--iters", "0"],
        &["bench", "--ops", "0"],
        &["bench", "--ops", "99999999999"],
        &["bench", "--size", "0"],
        &["bench", "--max-live", "0"],
        &["bench", "--min-size", "0"],
        &["bench", "--holes", "99999999999"],
        &["bench", "--warm-passes", "0"],
        &["bench", "--passes", "0"],
        &["bench", "--passes", "1001"],
        &["bench", "--iterations", "0"],
        &["bench", "--batch", "0"],
        &["bench", "--vary", "1.5"],
        &["bench", "--vary", "-0.1"],
        &["bench", "--vary", "NaN"],
        &["bench", "--vary", "lots"],
        &["replay", trace, "--repeats", "0"],
        &["replay", trace, "--warm-passes", "0"],
        &["transfer", "--repeats", "0"],
        &["transfer", "--min", "0"],
        &["plot", trace, "-o", svg, "--size", "0x0"],
        &["plot", trace, "-o", svg, "--size", "100000x100000"],
        &["plot", trace, "-o", svg, "--size", "wide"],
    ];
    for args in cases {
        let out = gpumem(&[&["--device", "sim"], *args].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        // clap's one-line error naming the option, then its usual hint.
        let first = err.lines().next().unwrap_or_default();
        let flag = args.iter().find(|a| a.starts_with("--")).unwrap();
        assert!(
            first.starts_with("error: invalid value") && first.contains(flag),
            "{args:?}: {err}"
        );
    }
    // Ranges that only make sense together: our own one-line errors.
    let pairs: &[(&[&str], &str)] = &[
        (
            &[
                "bench",
                "--workload",
                "random",
                "--min-size",
                "1M",
                "--max-size",
                "4K",
            ],
            "--min-size 1.00 MiB is larger than --max-size 4.00 KiB",
        ),
        (
            &["bench", "--workload", "threads", "--min-size", "8M"],
            "--min-size 8.00 MiB is larger than --thread-max-size 4.00 MiB",
        ),
        (
            &[
                "bench",
                "--workload",
                "threads",
                "--ops",
                "4",
                "--threads",
                "8",
            ],
            "--ops 4 is fewer than --threads 8",
        ),
        (
            &["transfer", "--min", "2M", "--max", "1M"],
            "--min 2.00 MiB is larger than --max 1.00 MiB",
        ),
    ];
    for (args, msg) in pairs {
        let out = gpumem(&[&["--device", "sim"], *args].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = one_line_error(&out);
        assert!(err.contains(msg), "{args:?}: {err}");
    }
}

#[test]
fn bench_run_refuses_a_config_that_makes_no_sense() {
    let ctx = RunContext::new(sim()).unwrap();
    let specs = allocators::select(&["cuda".into()]).unwrap();
    for (cfg, msg) in [
        (
            BenchConfig {
                repeats: 0,
                ..BenchConfig::default()
            },
            "--repeats 0",
        ),
        (
            BenchConfig {
                threads: 0,
                ..BenchConfig::default()
            },
            "--threads 0",
        ),
        (
            BenchConfig {
                min_size: 1 << 30,
                ..BenchConfig::default()
            },
            "--min-size 1.00 GiB is larger than --max-size",
        ),
        (
            BenchConfig {
                vary: 1.01,
                ..BenchConfig::default()
            },
            "--vary 1.01: must be between 0.0 (identical iterations) and 1.0",
        ),
        (
            BenchConfig {
                passes: 0,
                ..BenchConfig::default()
            },
            "--passes 0",
        ),
    ] {
        let err = bench::run(&ctx, &cfg, &specs, &ProgressBar::hidden(), |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains(msg), "{err}");
    }
}

/// A trace whose one allocation (200 GB) no allocator on the 80 GiB
/// simulated device can serve.
const OOM_TRACE: &str = "\
Thread,Time,Action,Pointer,Size,Stream
1,10:00:00.000001,allocate,0x1000,200000000000,0x0
1,10:00:00.000002,free,0x1000,200000000000,0x0
";

#[test]
fn a_failing_allocator_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let oom = dir.path().join("oom.csv");
    std::fs::write(&oom, OOM_TRACE).unwrap();
    let oom = oom.to_str().unwrap();
    let runs: &[&[&str]] = &[
        &["replay", oom, "--alloc", "cuda,pool"],
        &["replay", oom, "--alloc", "cuda,pool", "--json"],
        &[
            "bench",
            "--workload",
            "replay",
            "--trace",
            oom,
            "--alloc",
            "cuda,pool",
        ],
        &[
            "bench",
            "--workload",
            "same",
            "--size",
            "100G",
            "--iters",
            "2",
            "--alloc",
            "pool",
        ],
        &[
            "bench",
            "--json",
            "--workload",
            "same",
            "--size",
            "100G",
            "--iters",
            "2",
        ],
        // The main job: its short bench passes, the replay fails.
        &["--trace", oom],
    ];
    for args in runs {
        let out = gpumem(&[&["--device", "sim"], *args].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = one_line_error(&out);
        assert!(err.contains("failed"), "{args:?}: {err}");
        let text = String::from_utf8(out.stdout).unwrap();
        // Labelled for what it is, not "invalid argument".
        assert!(text.contains("out of memory"), "{args:?}: {text}");
        assert!(!text.contains("invalid argument"), "{args:?}: {text}");
        assert!(!text.contains("median of 0 repeats"), "{args:?}: {text}");
    }
    let out = gpumem(&["--device", "sim", "replay", oom, "--alloc", "cuda"]);
    let err = one_line_error(&out);
    assert!(err.contains("1 of 1 runs failed"), "{err}");
    assert!(
        err.contains("cuda") && err.contains("out of memory"),
        "{err}"
    );
}

#[test]
fn an_empty_or_header_only_trace_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in [
        ("empty.csv", ""),
        ("header.csv", "Thread,Time,Action,Pointer,Size,Stream\n"),
        (
            "failures.csv",
            "1,10:00:00.1,allocate failure,0x0,1099511627776,0x0\n",
        ),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        let path = path.to_str().unwrap();
        let svg = dir.path().join("t.svg");
        for args in [
            &["replay", path][..],
            &["bench", "--workload", "replay", "--trace", path],
            &["plot", path, "-o", svg.to_str().unwrap()],
            &["bound", path],
        ] {
            let out = gpumem(&[&["--device", "sim"], args].concat());
            assert_eq!(out.status.code(), Some(1), "{name} {args:?}");
            let err = one_line_error(&out);
            assert!(
                err.contains(name) && err.contains("nothing to replay"),
                "{name} {args:?}: {err}"
            );
            assert!(!svg.exists());
        }
    }
}

#[test]
fn bound_prints_every_packing_as_a_table_and_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.csv");
    std::fs::write(&path, SMALL_TRACE).unwrap();
    let path = path.to_str().unwrap();
    let out = gpumem(&["bound", path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    for row in [
        "largest first",
        "size x lifetime",
        "longest lived",
        "the log's order",
    ] {
        assert!(table.contains(row), "{row}: {table}");
    }
    let records = json_lines(&gpumem(&["bound", "--json", path, path]));
    assert_eq!(records.len(), 16, "two logs, eight packings each");
    for r in &records {
        // 256 B live, then 1 MiB, 4 KiB and 64 KiB: the peak is all but
        // the first block, which the 64 KiB one replaces.
        assert_eq!(r["trace"], "small.csv");
        assert_eq!(r["blocks"], 4);
        assert_eq!(r["peak_live"], 1048576 + 4096 + 65536);
        assert!(r["ratio"].as_f64().unwrap() >= 1.0, "{r}");
    }
    let out = gpumem(&["bound", "-", "-"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(one_line_error(&out).contains("standard input"));
    let out = gpumem(&["bound"]);
    assert_eq!(out.status.code(), Some(2), "a log is required");
}

#[test]
fn output_paths_are_checked_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.csv");
    std::fs::write(&good, SMALL_TRACE).unwrap();
    let good = good.to_str().unwrap();
    let not_a_pickle = dir.path().join("bad.pickle");
    std::fs::write(&not_a_pickle, b"not a pickle").unwrap();
    let nowhere = dir.path().join("no/such/dir/out");
    let nowhere = nowhere.to_str().unwrap();
    let gif = dir.path().join("t.gif");
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "replay",
                good,
                "--alloc",
                "cuda",
                "--log",
                &format!("{nowhere}.csv"),
            ],
            "--log: cannot write",
        ),
        (
            &["plot", good, "-o", &format!("{nowhere}.svg")],
            "cannot write",
        ),
        (
            &["plot", good, "-o", gif.to_str().unwrap()],
            "unknown picture format",
        ),
        (
            &[
                "convert-snapshot",
                not_a_pickle.to_str().unwrap(),
                "-o",
                &format!("{nowhere}.csv"),
            ],
            "cannot write",
        ),
    ];
    for (args, msg) in cases {
        let out = gpumem(&[&["--device", "sim"], *args].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = one_line_error(&out);
        assert!(err.contains(msg), "{args:?}: {err}");
        // Nothing was replayed or timed: not even the device line came out.
        assert!(
            out.stdout.is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // A path that can be written is left as it was found (absent) by the
    // check, here by a run that then fails.
    let oom = dir.path().join("oom.csv");
    std::fs::write(&oom, OOM_TRACE).unwrap();
    let log = dir.path().join("log.csv");
    let out = gpumem(&[
        "--device",
        "sim",
        "replay",
        oom.to_str().unwrap(),
        "--alloc",
        "cuda",
        "--log",
        log.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!log.exists());
}

/// A protocol 2 pickle of lists nested `depth` deep: `[[[...]]]`.
fn nested_lists(depth: usize) -> Vec<u8> {
    let mut p = b"\x80\x02".to_vec();
    p.extend(std::iter::repeat_n(b']', depth));
    p.extend(std::iter::repeat_n(b'a', depth - 1));
    p.push(b'.');
    p
}

/// A pickle whose nesting hides in memo references: `n` empty lists, memoized,
/// then each put in the next one, last first (so no list is deep when it is
/// put in another), then the last list: `n` deep once references resolve.
fn memo_chain(n: u32) -> Vec<u8> {
    let mut p = b"\x80\x02".to_vec();
    for i in 0..n {
        p.push(b']');
        p.push(b'r');
        p.extend(i.to_le_bytes());
        p.push(b'0');
    }
    for i in (0..n - 1).rev() {
        p.push(b'j');
        p.extend((i + 1).to_le_bytes());
        p.push(b'j');
        p.extend(i.to_le_bytes());
        p.extend(b"a0");
    }
    p.push(b'j');
    p.extend((n - 1).to_le_bytes());
    p.push(b'.');
    p
}

#[test]
fn deep_or_endless_pickles_are_refused_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let out_csv = dir.path().join("out.csv");
    let cases: &[(&str, Vec<u8>, &str)] = &[
        (
            "deep.pickle",
            nested_lists(200_000),
            "nested deeper than 100 levels",
        ),
        (
            "memo.pickle",
            memo_chain(100_000),
            "nested deeper than 100 levels",
        ),
    ];
    for (name, bytes, msg) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let out = gpumem(&[
            "convert-snapshot",
            path.to_str().unwrap(),
            "-o",
            out_csv.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let err = one_line_error(&out);
        assert!(err.contains(msg), "{name}: {err}");
    }
    // An input without end is refused at its first byte.
    let out = gpumem(&[
        "convert-snapshot",
        "/dev/zero",
        "-o",
        out_csv.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = one_line_error(&out);
    assert!(err.contains("byte 0: opcode 0x00"), "{err}");
}

/// A pickle the fuzzer found: serde-pickle's sort panics on it (set
/// members it cannot order); the bounded reader refuses it first.
#[test]
fn a_pickle_the_reader_panics_on_is_an_error() {
    let bytes =
        include_bytes!("../../../fuzz/corpus/torch_snapshot/regression-unordered-keys.pickle");
    let err = format!(
        "{:#}",
        gpumem_cli::snapshot::read_pickle(bytes).unwrap_err()
    );
    assert!(err.contains("not a readable pickle"), "{err}");
    assert!(err.contains("a set"), "{err}");
}

/// What serde-pickle cannot order: floats as dict keys (alone or in a tuple,
/// protocols 0 and 2), sets however pickled. A float as a value is fine
/// (a snapshot's allocator settings hold one).
#[test]
fn pickles_with_unorderable_keys_are_refused() {
    let refused: &[(&[u8], &str)] = &[
        (b"(dp0\nF1.5\nI1\ns.", "dict key"),
        (b"\x80\x02}q\x00G?\xf8\x00\x00\x00\x00\x00\x00K\x01s.", "dict key"),
        (b"(dp0\n(I1\nF2.0\ntp1\nI1\ns.", "dict key"),
        (b"\x80\x02}q\x00(K\x01K\x02G\x7f\xf8\x00\x00\x00\x00\x00\x00K\x03u.", "dict key"),
        (b"(G\x7f\xf8\x00\x00\x00\x00\x00\x00K\x01d.", "dict key"),
        (b"\x80\x04\x8f\x94(G?\xf0\x00\x00\x00\x00\x00\x00\x90.", "a set"),
        (b"\x80\x04(G?\xf0\x00\x00\x00\x00\x00\x00\x91\x94.", "a set"),
        (
            b"\x80\x02c__builtin__\nset\nq\x00]q\x01G?\xf0\x00\x00\x00\x00\x00\x00a\x85q\x02Rq\x03.",
            "a call on floats",
        ),
    ];
    for (bytes, what) in refused {
        let err = format!("{:#}", snapshot::read_pickle(bytes).unwrap_err());
        assert!(err.contains(what), "{err}");
    }
    let v = snapshot::read_pickle(
        b"\x80\x02}q\x00(K\x01G@\x04\x00\x00\x00\x00\x00\x00X\x01\x00\x00\x00aq\x01]q\x02G?\xe0\x00\x00\x00\x00\x00\x00au.",
    )
    .unwrap();
    assert!(
        matches!(v, gpumem_cli::pickle_values::Value::Dict(_)),
        "{v:?}"
    );
}

#[test]
fn pickles_up_to_the_depth_limit_are_read() {
    let limit = gpumem_cli::pickle_bounds::Limits::default().max_depth as usize;
    // The deepest accepted pickle goes through serde-pickle on this test
    // thread's stack (2 MiB) in a debug build.
    let v = snapshot::read_pickle(&nested_lists(limit)).unwrap();
    assert!(matches!(v, gpumem_cli::pickle_values::Value::List(_)));
    let err = snapshot::read_pickle(&nested_lists(limit + 1)).unwrap_err();
    assert!(format!("{err:#}").contains("nested deeper"), "{err:#}");
    assert!(snapshot::read_pickle(&memo_chain(limit as u32)).is_ok());
    let err = snapshot::read_pickle(&memo_chain(limit as u32 + 1)).unwrap_err();
    assert!(format!("{err:#}").contains("nested deeper"), "{err:#}");
    // A list that holds itself, and a pickle cut short.
    let err = snapshot::read_pickle(b"\x80\x02]q\x00h\x00a.").unwrap_err();
    assert!(format!("{err:#}").contains("refers to itself"), "{err:#}");
    let err = snapshot::read_pickle(&nested_lists(10)[..12]).unwrap_err();
    assert!(format!("{err:#}").contains("ends early"), "{err:#}");
    // What Python never writes: a memo index stored twice (a reference taken
    // before would change meaning), items added to a number.
    let err = snapshot::read_pickle(b"\x80\x02]q\x00]q\x00.").unwrap_err();
    assert!(format!("{err:#}").contains("stored twice"), "{err:#}");
    let err = snapshot::read_pickle(b"\x80\x02K\x01K\x02a.").unwrap_err();
    assert!(format!("{err:#}").contains("not a container"), "{err:#}");
}

#[test]
fn a_snapshot_on_standard_input_converts() {
    let dir = tempfile::tempdir().unwrap();
    let out_csv = dir.path().join("out.csv");
    let out = gpumem_command(&["convert-snapshot", "-", "-o", out_csv.to_str().unwrap()])
        .stdin(std::fs::File::open(data("snapshot_p4.pickle")).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&out_csv).unwrap();
    assert_eq!(gpumem::trace::parse_str(&text).unwrap().len(), 9);
}

#[test]
fn a_trace_on_standard_input_with_a_byte_order_mark_replays() {
    let dir = tempfile::tempdir().unwrap();
    let with_bom = dir.path().join("bom.csv");
    std::fs::write(&with_bom, format!("\u{feff}{SMALL_TRACE}")).unwrap();
    let svg = dir.path().join("t.svg");
    let runs: &[&[&str]] = &[
        &["replay", "-", "--alloc", "cuda"],
        &[
            "bench",
            "--workload",
            "replay",
            "--trace",
            "-",
            "--alloc",
            "cuda",
        ],
        &["plot", "-", "--alloc", "cuda", "-o", svg.to_str().unwrap()],
    ];
    for args in runs {
        let out = gpumem_command(&[&["--device", "sim"], *args].concat())
            .stdin(std::fs::File::open(&with_bom).unwrap())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("cuda"), "{args:?}: {text}");
    }
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
}

#[test]
fn an_endless_line_is_an_error_naming_it() {
    let out = gpumem(&["--device", "sim", "replay", "/dev/zero"]);
    assert_eq!(out.status.code(), Some(1));
    let err = one_line_error(&out);
    assert!(
        err.contains("/dev/zero: line 1: longer than 4096 bytes"),
        "{err}"
    );
    let out = gpumem_command(&["--device", "sim", "replay", "-"])
        .stdin(std::fs::File::open("/dev/zero").unwrap())
        .output()
        .unwrap();
    let err = one_line_error(&out);
    assert!(
        err.contains("standard input: line 1: longer than 4096 bytes"),
        "{err}"
    );
}

#[test]
fn info_shows_the_simulated_device_bench_and_replay_use() {
    use gpumem_cli::target::{self, DeviceChoice};
    let measured = target::open(DeviceChoice::Sim, false).unwrap();
    let total = measured.device.mem_info().unwrap().total;
    let shown = format!("{:.2} GiB total", total as f64 / (1u64 << 30) as f64);
    let out = gpumem(&["--device", "sim", "info"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(&shown), "{shown:?} not in {text}");
    // The demo's backed device is the same device, with host memory behind it.
    let backed = target::open(DeviceChoice::Sim, true).unwrap();
    assert_eq!(backed.device.mem_info().unwrap().total, total);
}

#[test]
fn the_arena_s_reserve_is_explained_under_the_table() {
    let out = gpumem(&[
        "--device",
        "sim",
        "bench",
        "--workload",
        "same",
        "--iters",
        "2",
        "--repeats",
        "1",
        "--alloc",
        "arena,pool,arena+initial_size=64MiB",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    // Both arenas are marked, and the note comes once.
    assert_eq!(
        text.lines().filter(|l| l.ends_with('*')).count(),
        2,
        "{text}"
    );
    assert_eq!(text.matches("* arena takes").count(), 1, "{text}");
    let arena = text
        .lines()
        .find(|l| l.trim_start().starts_with("arena"))
        .unwrap();
    assert!(arena.ends_with('*'), "{arena}");
    let pool = text
        .lines()
        .find(|l| l.trim_start().starts_with("pool"))
        .unwrap();
    assert!(!pool.ends_with('*'), "{pool}");
    assert!(
        text.contains("* arena takes its whole size up front (half the device's free memory unless initial_size or max_size say otherwise), as RMM's arena does"),
        "{text}"
    );
}

#[test]
fn plot_refuses_picture_sizes_out_of_range_in_process() {
    let events = gpumem::trace::parse_str(SMALL_TRACE).unwrap();
    let prep = replay::prepare(&events).unwrap();
    let device = sim();
    let alloc = allocators::select(&["cuda".into()]).unwrap()[0]
        .build(&device)
        .unwrap();
    let series = vec![(
        "cuda".to_string(),
        replay::timeline(&alloc, &device, &prep, 100).unwrap(),
    )];
    let dir = tempfile::tempdir().unwrap();
    for file in ["t.svg", "t.png"] {
        let path = dir.path().join(file);
        for size in [(0, 0), (1200, 50), (100_000, 100_000)] {
            let err = plot::draw(&path, "t", &series, plot::XAxis::Index, size).unwrap_err();
            assert!(err.to_string().contains("100 to 10000 pixels"), "{err}");
            assert!(!path.exists(), "{file} {size:?}");
        }
    }
    assert!(plot::parse_picture_size("1200x700").is_ok());
    assert!(plot::parse_picture_size("99x700").is_err());
}

#[test]
fn the_main_job_reads_its_traces_before_timing_anything() {
    let out = gpumem(&["--device", "sim", "--trace", "/no/such/trace.csv"]);
    assert_eq!(out.status.code(), Some(1));
    let err = one_line_error(&out);
    assert!(err.contains("/no/such/trace.csv"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_main_job_replays_every_log_of_a_folder_and_refuses_an_empty_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = |a: u64, b: u64| {
        format!(
            "Thread,Time,Action,Pointer,Size,Stream\n\
             1,10:00:00.1,allocate,{a:#x},4096,0x0\n\
             1,10:00:00.2,allocate,{b:#x},8192,0x0\n\
             1,10:00:00.3,free,{a:#x},4096,0x0\n\
             1,10:00:00.4,free,{b:#x},8192,0x0\n"
        )
    };
    std::fs::write(dir.path().join("first.csv"), log(0x1000, 0x9000)).unwrap();
    std::fs::write(dir.path().join("second.csv"), log(0x2000, 0xa000)).unwrap();
    std::fs::write(dir.path().join("notes.txt"), "not a log").unwrap();
    let out = gpumem(&["--device", "sim", "--trace", dir.path().to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["first.csv", "second.csv"] {
        assert!(text.contains(name), "{name} replayed: {text}");
    }
    assert!(!text.contains("notes.txt"), "{text}");

    let empty = tempfile::tempdir().unwrap();
    let out = gpumem(&["--device", "sim", "--trace", empty.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = one_line_error(&out);
    assert!(err.contains("holds no .csv log"), "{err}");
    assert!(out.stdout.is_empty(), "nothing runs before the error");
}

#[test]
fn a_thread_crew_keeps_its_streams_across_passes_and_survives_a_failure() {
    use gpumem::adaptor::LimitingAdaptor;
    use gpumem::pool::{PoolConfig, PoolResource};
    use gpumem::resource::{DeviceResource, MemoryResource};
    use gpumem_cli::thread_crew::ThreadCrew;
    use gpumem_cli::workload::random_sequence;
    use std::sync::Arc;

    let (device, sim) = Device::sim_with_driver(SimConfig::default());
    let seqs: Vec<_> = (0..3)
        .map(|t| Arc::new(random_sequence(400, 8, 256, 1 << 20, t)))
        .collect();
    let ops: u64 = seqs.iter().map(|s| s.ops.len() as u64).sum();
    let pool = Arc::new(
        PoolResource::new(DeviceResource::new(device.clone()), PoolConfig::default()).unwrap(),
    );
    let r: Arc<dyn MemoryResource> = pool.clone();
    let streams = sim.call_count("cuStreamCreate");
    let crew = ThreadCrew::new(&r, &device, &seqs).unwrap();
    for _ in 0..3 {
        let t = crew.run_pass().unwrap();
        assert_eq!(t.ops, ops);
        assert_eq!(pool.stats().live, 0, "each pass frees what it left live");
    }
    assert_eq!(
        sim.call_count("cuStreamCreate") - streams,
        3,
        "one stream per thread, kept across the passes"
    );
    drop((crew, r, pool));
    assert_eq!(
        sim.call_count("cuStreamDestroy"),
        3,
        "the streams end with the crew and the pool"
    );

    // A thread whose allocation fails: the pass reports the error, the other
    // threads are not left waiting, and the next pass runs.
    let small: Arc<dyn MemoryResource> = Arc::new(LimitingAdaptor::new(
        DeviceResource::new(device.clone()),
        2 << 20,
    ));
    let crew = ThreadCrew::new(&small, &device, &seqs).unwrap();
    for _ in 0..2 {
        let e = crew.run_pass().unwrap_err().to_string();
        assert!(e.contains("out of memory"), "{e}");
    }
}
