//! `gpumem view` through the binary on the simulated device: the page it
//! writes for a shipped trace and for a PyTorch snapshot (its embedded data,
//! the vendored chart library, the maps), and its errors on bad input. The
//! page's behaviour in a browser is checked by tests/browser/view_page.mjs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn gpumem(args: &[&str]) -> Output {
    let bin = std::env::var("GPUMEM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_gpumem").into());
    Command::new(bin)
        .args(args)
        .args(["--device", "sim"])
        .output()
        .unwrap()
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `gpumem view` and returns the page and its embedded data.
fn view(input: &Path, extra: &[&str]) -> (String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("view.html");
    let mut args = vec![
        "view",
        input.to_str().unwrap(),
        "-o",
        page.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = gpumem(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let html = std::fs::read_to_string(&page).unwrap();
    let data = embedded_data(&html);
    (html, data)
}

/// The JSON in the page's data script element.
fn embedded_data(html: &str) -> Value {
    let open = r#"<script id="gpumem-data" type="application/json">"#;
    let start = html.find(open).expect("no data element") + open.len();
    let len = html[start..]
        .find("</script>")
        .expect("data element not closed");
    serde_json::from_str(&html[start..start + len]).expect("the embedded data is not JSON")
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn names(data: &Value) -> Vec<String> {
    data["allocators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_string())
        .collect()
}

/// Checks what every page must hold: a timeline whose series line up and
/// keep every peak, maps whose blocks lie in their segments and are all in
/// the block table, and the moments at each allocator's peak.
fn check_consistent(data: &Value) {
    let allocs = data["allocators"].as_array().unwrap();
    let tl = &data["timeline"];
    let points = tl["x"].as_array().unwrap().len();
    assert!(points > 0);
    assert_eq!(tl["live"].as_array().unwrap().len(), points);
    assert_eq!(tl["time_ms"].as_array().unwrap().len(), points);
    // Downsampling keeps every peak.
    assert_eq!(
        u64s(&tl["live"]).into_iter().max(),
        data["peak_live"].as_u64()
    );
    let samples = tl["at"].as_array().unwrap().len();
    for (i, a) in allocs.iter().enumerate() {
        let reserved = u64s(&tl["reserved"][i]);
        assert_eq!(reserved.len(), points);
        assert_eq!(
            reserved.into_iter().max(),
            a["peak_reserved"].as_u64(),
            "{a}"
        );
        assert_eq!(tl["ratio"][i].as_array().unwrap().len(), samples);
        assert_eq!(tl["hole"][i].as_array().unwrap().len(), samples);
    }
    let block_ops = u64s(&data["blocks"]["op"]);
    assert!(
        block_ops.windows(2).all(|w| w[0] < w[1]),
        "block table not in event order"
    );
    let ops = data["source"]["ops"].as_u64().unwrap();
    let moments = data["moments"].as_array().unwrap();
    let mut last = None;
    for m in moments {
        let op = m["op"].as_u64().unwrap();
        assert!(op < ops);
        assert!(last < Some(op), "moments out of order");
        last = Some(op);
        let maps = m["maps"].as_array().unwrap();
        assert_eq!(maps.len(), allocs.len());
        for map in maps {
            let segs = u64s(&map["segs"]);
            let blocks: Vec<i64> = map["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_i64().unwrap())
                .collect();
            assert_eq!(segs.len() % 3, 0);
            assert_eq!(blocks.len() % 4, 0);
            // Segment addresses travel as gaps from the previous segment's end.
            let mut addrs = Vec::new();
            let mut end = 0;
            for s in segs.chunks(3) {
                addrs.push(end + s[0]);
                end += s[0] + s[1];
            }
            let mut at: Option<(u64, u64)> = None;
            for b in blocks.chunks(4) {
                let (seg, gap, op) = (b[0] as usize, b[1] as u64, b[3] as u64);
                let row = block_ops
                    .binary_search(&op)
                    .unwrap_or_else(|_| panic!("block {op} not in the table"));
                // Sizes travel relative to the size asked for; a block is
                // never smaller than that.
                assert!(b[2] >= 0, "a block smaller than its request");
                let size = data["blocks"]["size"][row].as_u64().unwrap() + b[2] as u64;
                let (addr, len) = (addrs[seg], segs[seg * 3 + 1]);
                let start = match at {
                    Some((s, end)) if s == seg as u64 => end + gap,
                    _ => addr + gap,
                };
                assert!(start + size <= addr + len, "block outside its segment");
                at = Some((seg as u64, start + size));
            }
        }
    }
    for (i, a) in allocs.iter().enumerate() {
        let peak = a["peak_op"].as_u64().unwrap();
        let m = moments
            .iter()
            .find(|m| m["op"].as_u64() == Some(peak))
            .unwrap_or_else(|| panic!("no moment at the peak of {a}"));
        assert_eq!(m["maps"][i]["reserved"], a["peak_reserved"]);
    }
}

#[test]
fn view_of_a_shipped_trace() {
    let (html, data) = view(
        &repo_file("traces/resnet50_train.rmm.csv"),
        &["--alloc", "pool,vpool", "--moments", "10"],
    );
    assert_eq!(data["format"], 1);
    assert_eq!(data["source"]["kind"], "rmm-log");
    assert_eq!(data["source"]["has_stacks"], false);
    assert_eq!(names(&data), ["pool", "vpool"]);
    let moments = data["moments"].as_array().unwrap();
    // Ten evenly spaced (the last is the end of the log), plus the live
    // peak and two reserve peaks where they fall between them.
    assert!(
        (10..=13).contains(&moments.len()),
        "{} moments",
        moments.len()
    );
    let whys: Vec<&str> = moments
        .iter()
        .flat_map(|m| m["why"].as_array().unwrap())
        .map(|w| w.as_str().unwrap())
        .collect();
    for w in [
        "peak live",
        "peak reserved of pool",
        "peak reserved of vpool",
        "end of the log",
    ] {
        assert!(whys.contains(&w), "no moment for {w}: {whys:?}");
    }
    check_consistent(&data);
    // Every map of a pool shows blocks at the live peak.
    let peak = data["peak_live_op"].as_u64();
    let m = moments.iter().find(|m| m["op"].as_u64() == peak).unwrap();
    for map in m["maps"].as_array().unwrap() {
        assert!(!map["blocks"].as_array().unwrap().is_empty());
        assert!(map["reserved"].as_u64().unwrap() >= data["peak_live"].as_u64().unwrap());
    }
    // The chart library is inlined with its licence; nothing is fetched.
    let uplot = include_str!("../assets/view/uplot/uPlot.iife.min.js");
    assert!(html.contains(&uplot[..200]));
    assert!(html.contains("uPlot 1.6.32"));
    assert!(html.contains("Copyright (c) 2022 Leon Sorokin"));
    assert!(html.contains(
        include_str!("../assets/view/view.js")
            .lines()
            .nth(5)
            .unwrap()
    ));
    for remote in ["src=\"http", "href=\"http", "<link", "import("] {
        assert!(!html.contains(remote), "the page loads {remote}");
    }
}

#[test]
fn view_defaults_to_pool_vpool_caching() {
    let (_, data) = view(&repo_file("traces/gpt2_train.rmm.csv"), &["--moments", "0"]);
    assert_eq!(names(&data), ["pool", "vpool", "caching"]);
    // No evenly spaced moments: the key ones only.
    let n = data["moments"].as_array().unwrap().len();
    assert!((1..=5).contains(&n), "{n} moments");
    check_consistent(&data);
}

#[test]
fn view_of_a_pytorch_snapshot() {
    let snapshot = repo_file("crates/gpumem-cli/tests/data/training_snapshot.pickle");
    let (_, data) = view(&snapshot, &["--alloc", "caching", "--moments", "20"]);
    assert_eq!(data["source"]["kind"], "pytorch-snapshot");
    assert_eq!(data["source"]["has_stacks"], true);
    assert_eq!(names(&data), ["caching", "pytorch (recorded)"]);
    check_consistent(&data);
    let recorded = &data["allocators"][1];
    assert_eq!(recorded["replayed"], false);
    // PyTorch's reserve at the end is the snapshot's own segment list.
    let bytes = std::fs::read(&snapshot).unwrap();
    let value = gpumem_cli::snapshot::read_pickle(&bytes).unwrap();
    let gpumem_cli::pickle_values::Value::Dict(top) = value else {
        panic!("not a dict")
    };
    let segments = gpumem_cli::snapshot::key(&top, "segments")
        .and_then(gpumem_cli::snapshot::as_list)
        .unwrap();
    let total: u64 = segments
        .iter()
        .map(|s| match s {
            gpumem_cli::pickle_values::Value::Dict(d) => gpumem_cli::snapshot::key(d, "total_size")
                .and_then(gpumem_cli::snapshot::as_u64)
                .unwrap(),
            _ => panic!("segment not a dict"),
        })
        .sum();
    assert_eq!(recorded["final_reserved"].as_u64(), Some(total));
    let last = data["moments"].as_array().unwrap().last().unwrap();
    assert_eq!(
        last["maps"][1]["segs"].as_array().unwrap().len(),
        segments.len() * 3
    );
    // Every block shown has its stack, frames resolvable.
    let frames = data["stacks"]["frames"].as_array().unwrap().len() as u64;
    let stacks = data["stacks"]["stacks"].as_array().unwrap();
    for s in data["blocks"]["stack"].as_array().unwrap() {
        let s = s.as_u64().expect("a block without its stack") as usize;
        assert!(u64s(&stacks[s]).iter().all(|&f| f < frames));
    }
    assert!(data["stacks"]["frames"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f.as_str().unwrap().starts_with("forward (model.py:")));
}

#[test]
fn view_reads_standard_input() {
    for (input, kind) in [
        ("traces/resnet50_train.rmm.csv", "rmm-log"),
        (
            "crates/gpumem-cli/tests/data/training_snapshot.pickle",
            "pytorch-snapshot",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let page = dir.path().join("stdin.html");
        let bin =
            std::env::var("GPUMEM_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_gpumem").into());
        let out = Command::new(bin)
            .args([
                "--device",
                "sim",
                "view",
                "-",
                "--alloc",
                "pool",
                "--moments",
                "5",
                "-o",
            ])
            .arg(&page)
            .stdin(Stdio::from(std::fs::File::open(repo_file(input)).unwrap()))
            .output()
            .unwrap();
        assert!(out.status.success(), "{input}: {}", stderr(&out));
        let data = embedded_data(&std::fs::read_to_string(&page).unwrap());
        assert_eq!(data["source"]["name"], "stdin");
        assert_eq!(data["source"]["kind"], kind);
        assert_eq!(names(&data)[0], "pool");
    }
}

#[test]
fn view_refuses_bad_input_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("out.html");
    let page = page.to_str().unwrap();
    let trace = repo_file("traces/resnet50_train.rmm.csv");
    let trace = trace.to_str().unwrap();
    let fails = |args: &[&str], wanted: &[&str]| {
        let out = gpumem(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = stderr(&out);
        for w in wanted {
            assert!(err.contains(w), "{args:?}: {w:?} not in {err}");
        }
        assert!(!Path::new(page).exists(), "{args:?} left a page behind");
    };
    let missing = dir.path().join("no-such-log.csv");
    fails(
        &["view", missing.to_str().unwrap(), "-o", page],
        &["cannot read", "no-such-log.csv"],
    );
    fails(
        &["view", trace, "--alloc", "pool,nosuch", "-o", page],
        &["nosuch", "--list-allocators"],
    );
    fails(
        &["view", trace, "-o", "/nonexistent-dir/out.html"],
        &["cannot write", "/nonexistent-dir/out.html"],
    );
    fails(
        &["view", trace, "-o", &page.replace(".html", ".csv")],
        &[".html"],
    );
    fails(&["view", trace, "--moments", "1001", "-o", page], &["1001"]);
    let junk = dir.path().join("junk.csv");
    std::fs::write(&junk, "hello, this is not a log\n").unwrap();
    fails(
        &["view", junk.to_str().unwrap(), "-o", page],
        &["junk.csv", "not an RMM log"],
    );
    let bad_pickle = dir.path().join("bad.pickle");
    std::fs::write(&bad_pickle, [0x80, 0x04, 0x95, 0x01]).unwrap();
    fails(
        &["view", bad_pickle.to_str().unwrap(), "-o", page],
        &["bad.pickle", "PyTorch snapshot"],
    );
    fails(
        &["view", dir.path().to_str().unwrap(), "-o", page],
        &["directory"],
    );
}
