//! Replays RMM allocation logs through a [`VirtualPool`] on the simulated
//! device (address-only, 80 GiB) and prints, per trace and pass, the peak
//! physical memory reserved over the peak live bytes, the VMM driver calls
//! made, the driver time they would cost on an H100 (measured by
//! `examples/vmm_costs.rs`, below) per trace
//! event, and the measured bookkeeping time per event.
//!
//! ```text
//! cargo run --release -p gpumem --example vpool_replay -- [--passes N] \
//!     [--nccl-ready] [--small BYTES] [--slack PERMILLE] [--slack-min BYTES] [--extent PAGES] [--alias-ratio N] \
//!     [trace.rmm.csv ...]
//! ```
//!
//! Pass 1 is cold (every page created); later passes replay the same trace
//! through the same pool (warm), on the same streams. Environment:
//! `VPOOL_VERBOSE` adds a line per pass with the alias counters,
//! `VPOOL_STEP=N` prints the counters and every driver call made since
//! the previous step, every N events, `VPOOL_FRESH_STREAMS`
//! makes new streams for every pass. Driver costs used (H100, driver 580; see
//! `examples/vmm_costs.rs`, which measures them on any GPU):
//! cuMemCreate 15 µs per call plus 0.2 µs per 2 MiB page, cuMemRelease 14
//! µs per call plus 1.1 µs per page, cuMemMap 1.6 µs per page;
//! cuMemSetAccess 18 µs per call plus 25 µs per mapping in its range,
//! cuMemUnmap 9 µs per call plus 17 µs per mapping (a mapping is one
//! extent, one physical allocation of one or more pages mapped whole);
//! cuMemAddressReserve 22 µs. Batching mappings into one call saves only the
//! per-call part: on the H100 the cost follows the mappings covered.

use std::collections::HashMap;
use std::time::Instant;

use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::pool::{VirtualPool, VirtualPoolConfig};
use gpumem::resource::MemoryResource;
use gpumem::trace::{self, Action};
use gpumem::{Device, DevicePtr, Stream};

const DEFAULT_TRACES: [&str; 2] = [
    "/work/shared/traces/resnet50_train.rmm.csv",
    "/work/shared/traces/gpt2_train.rmm.csv",
];

#[derive(Clone, Copy)]
enum Ev {
    Alloc { ptr: u64, size: usize, stream: u64 },
    Free { ptr: u64, stream: u64 },
}

/// Reads an RMM log with [`gpumem::trace`]; failed allocations are skipped.
fn parse(path: &str) -> Result<Vec<Ev>, String> {
    let events = trace::read_file(path).map_err(|e| e.to_string())?;
    Ok(events
        .iter()
        .filter_map(|e| match e.action {
            Action::Allocate => Some(Ev::Alloc {
                ptr: e.ptr,
                size: e.size,
                stream: e.stream,
            }),
            Action::Free => Some(Ev::Free {
                ptr: e.ptr,
                stream: e.stream,
            }),
            _ => None,
        })
        .collect())
}

const CALLS: [(&str, &str); 6] = [
    ("cuMemCreate", "create"),
    ("cuMemMap", "map"),
    ("cuMemSetAccess", "access"),
    ("cuMemUnmap", "unmap"),
    ("cuMemRelease", "release"),
    ("cuMemAddressReserve", "reserve"),
];

struct Counts {
    calls: [u64; 6],
}

fn counts(sim: &SimDriver) -> Counts {
    let mut calls = [0; 6];
    for (i, (name, _)) in CALLS.iter().enumerate() {
        calls[i] = sim.call_count(name);
    }
    Counts { calls }
}

/// Replays `events` once; returns (wall ns, peak requested live bytes).
fn replay(
    pool: &VirtualPool,
    device: &Device,
    events: &[Ev],
    streams: &mut HashMap<u64, Stream>,
    sim: &SimDriver,
) -> (u128, usize) {
    let mut live: HashMap<u64, (DevicePtr, usize, u64)> = HashMap::with_capacity(4096);
    for ev in events {
        let s = match *ev {
            Ev::Alloc { stream, .. } | Ev::Free { stream, .. } => stream,
        };
        streams
            .entry(s)
            .or_insert_with(|| device.create_stream().expect("stream"));
    }
    let (mut cur, mut peak) = (0usize, 0usize);
    // VPOOL_STEP=N: print the pool's counters every N events (stderr).
    let step: Option<usize> = std::env::var("VPOOL_STEP")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0);
    let mut calls_before = sim.call_counts();
    let t0 = Instant::now();
    for (i, ev) in events.iter().enumerate() {
        if step.is_some_and(|n| i % n == 0) {
            // Every driver call since the last step, not only the VMM ones.
            let now = sim.call_counts();
            let made: Vec<String> = now
                .iter()
                .filter_map(|&(name, n)| {
                    let was = calls_before.iter().find(|c| c.0 == name).map_or(0, |c| c.1);
                    (n > was).then(|| format!("{name} {}", n - was))
                })
                .collect();
            calls_before = now;
            eprintln!("  calls: {}", made.join(", "));
            let st = pool.stats();
            eprintln!(
                "  event {i}: mappings {} aliases {} reloc {} fresh {} va-mapped GB {:.2}",
                st.mappings_made,
                st.aliases_made,
                st.relocations,
                st.fresh_ranges,
                st.mapped as f64 / 1e9
            );
        }
        match *ev {
            Ev::Alloc { ptr, size, stream } => {
                let s = &streams[&stream];
                match pool.allocate(size, 256, s) {
                    Ok(p) => {
                        live.insert(ptr, (p, size, stream));
                        cur += size;
                        peak = peak.max(cur);
                    }
                    Err(e) => eprintln!("allocate {size}: {e}"),
                }
            }
            Ev::Free { ptr, stream } => {
                if let Some((p, size, _)) = live.remove(&ptr) {
                    pool.deallocate(p, size, 256, &streams[&stream])
                        .expect("free");
                    cur -= size;
                }
            }
        }
    }
    let ns = t0.elapsed().as_nanos();
    // Whatever the trace left live is freed (not timed), in the trace's
    // pointer order and each on the stream that allocated it, as `gpumem
    // replay` does: a free on another stream would give that stream a lane
    // of its own, and the next pass would start from other free blocks.
    let mut left: Vec<_> = live.drain().collect();
    left.sort_unstable_by_key(|&(ptr, _)| ptr);
    for (_, (p, size, stream)) in left {
        pool.deallocate(p, size, 256, &streams[&stream])
            .expect("free");
    }
    (ns, peak)
}

/// The simulator's own time per VMM call (map, set-access and unmap of one
/// page, measured here), to subtract from the measured wall time: the
/// bookkeeping column then counts the pool's work only.
fn sim_ns_per_call() -> f64 {
    let (device, _sim) = Device::sim_with_driver(SimConfig::default());
    let d = device.driver();
    let page = d.vmm_granularity(0, true).expect("granularity");
    let va = d.vmm_reserve(64 * page, page).expect("reserve");
    let h = d.vmm_create(0, page, Default::default()).expect("create");
    let n = 20_000;
    let t0 = Instant::now();
    for i in 0..n {
        let at = va.offset((i % 64) * page);
        // SAFETY: `h` and the reservation `va` were made above; each round
        // maps one page of the unmapped reservation and unmaps it again.
        unsafe {
            d.vmm_map(at, page, 0, h).expect("map");
            d.vmm_set_access(at, page, 0, gpumem::driver::AccessFlags::ReadWrite)
                .expect("access");
            d.vmm_unmap(at, page).expect("unmap");
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / (3 * n) as f64;
    // SAFETY: made above, nothing mapped any more; each ended once.
    unsafe {
        d.vmm_release(h).expect("release");
        d.vmm_free_address(va, 64 * page).expect("free");
    }
    ns
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // --nccl-ready: the NCCL-ready mode (one physical allocation per block).
    let mut config = match args.iter().position(|a| a == "--nccl-ready") {
        Some(i) => {
            args.remove(i);
            VirtualPoolConfig::nccl_ready(Vec::new())
        }
        None => VirtualPoolConfig::default(),
    };
    let mut take = |flag: &str| -> Option<String> {
        let i = args.iter().position(|a| a == flag)?;
        let v = args.get(i + 1).cloned();
        args.drain(i..(i + 2).min(args.len()));
        v
    };
    let passes: usize = take("--passes").and_then(|v| v.parse().ok()).unwrap_or(2);
    if let Some(c) = take("--small").and_then(|v| v.parse().ok()) {
        config.small_limit = c;
    }
    if let Some(c) = take("--slack").and_then(|v| v.parse().ok()) {
        config.slack_permille = c;
    }
    if let Some(c) = take("--slack-min").and_then(|v| v.parse().ok()) {
        config.slack_min_bytes = c;
    }
    if let Some(c) = take("--extent").and_then(|v| v.parse().ok()) {
        config.max_extent_pages = c;
    }
    if let Some(c) = take("--alias-ratio").and_then(|v| v.parse().ok()) {
        config.max_alias_ratio = c;
    }
    let traces: Vec<String> = if args.is_empty() {
        DEFAULT_TRACES.iter().map(|s| s.to_string()).collect()
    } else {
        args
    };
    println!(
        "VirtualPool replay on the simulated device (address-only, 80 GiB); small_limit {}, slack_permille {}, slack_min_bytes {}, max_extent_pages {}, nccl_ready {}",
        config.small_limit, config.slack_permille, config.slack_min_bytes, config.max_extent_pages, config.nccl_ready
    );
    let sim_call = sim_ns_per_call();
    println!(
        "bk ns/op: wall time per event less the simulator's time in VMM calls ({sim_call:.0} ns per call, measured)"
    );
    println!(
        "{:<16} {:>4} {:>6} {:>9} {:>9} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>7} {:>9} {:>8} {:>8}",
        "trace", "pass", "events", "live GB", "resv GB", "ratio",
        "create", "pages", "map", "access", "unmap", "unmapped", "release",
        "drv ns/op", "bk ns/op", "total"
    );
    // VPOOL_VERBOSE: a second line per pass with the alias counters.
    let verbose = std::env::var_os("VPOOL_VERBOSE").is_some();
    for path in traces {
        let events = match parse(&path) {
            Ok(e) => e,
            Err(e) => {
                eprintln!("{path}: {e}");
                continue;
            }
        };
        let name = std::path::Path::new(&path)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(&path)
            .trim_end_matches(".rmm.csv")
            .to_string();
        let (device, sim) = Device::sim_with_driver(SimConfig::default());
        let pool = VirtualPool::new(device.clone(), config.clone()).expect("pool");
        let mut streams = HashMap::new();
        let mut peak_live = 0;
        for pass in 1..=passes {
            let before = counts(&sim);
            let st0 = pool.stats();
            if std::env::var_os("VPOOL_FRESH_STREAMS").is_some() {
                // New streams for every pass (a program that keeps none).
                streams.clear();
            }
            let (ns, peak) = replay(&pool, &device, &events, &mut streams, &sim);
            peak_live = peak_live.max(peak);
            let after = counts(&sim);
            let d: Vec<u64> = (0..6).map(|i| after.calls[i] - before.calls[i]).collect();
            let st = pool.stats();
            let page = st.page_size as u64;
            let created = st.pages_created - st0.pages_created;
            let released = st.pages_released - st0.pages_released;
            let scale = page as f64 / (2u64 << 20) as f64;
            // Mappings (extents) made and unmapped, and pages mapped, in the pass.
            let maps = st.mappings_made - st0.mappings_made;
            let unmaps = st.mappings_unmapped - st0.mappings_unmapped;
            let mapped_pages = st.pages_mapped - st0.pages_mapped;
            let drv_us = d[0] as f64 * 15.0
                + created as f64 * 0.2 * scale
                + mapped_pages as f64 * 1.6 * scale
                + d[2] as f64 * 18.0
                + maps as f64 * 25.0
                + d[3] as f64 * 9.0
                + unmaps as f64 * 17.0
                + d[4] as f64 * 14.0
                + released as f64 * 1.1 * scale
                + d[5] as f64 * 22.0;
            let drv = drv_us * 1000.0 / events.len() as f64;
            let sim_calls: u64 = d.iter().sum();
            let bk = (ns as f64 - sim_calls as f64 * sim_call).max(0.0) / events.len() as f64;
            println!(
                "{:<16} {:>4} {:>6} {:>9.3} {:>9.3} {:>6.3} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>7} {:>9.1} {:>8.1} {:>8.1}",
                name,
                pass,
                events.len(),
                peak_live as f64 / 1e9,
                st.peak_reserved as f64 / 1e9,
                st.peak_reserved as f64 / peak_live as f64,
                d[0],
                created,
                d[1],
                d[2],
                d[3],
                unmaps,
                d[4],
                drv,
                bk,
                drv + bk
            );
            if verbose {
                println!(
                    "    aliases {} collected {} reloc {} fresh {} va-mapped GB {:.2} aliased GB {:.2} chunks {} va GB {:.0}",
                    st.aliases_made - st0.aliases_made,
                    st.aliases_collected - st0.aliases_collected,
                    st.relocations - st0.relocations,
                    st.fresh_ranges - st0.fresh_ranges,
                    st.mapped as f64 / 1e9,
                    st.aliased as f64 / 1e9,
                    st.chunks,
                    st.virtual_reserved as f64 / 1e9
                );
            }
        }
        pool.check_invariants().expect("invariants");
        drop(pool);
        assert_eq!(sim.physical_bytes(), 0, "all physical memory back");
        assert_eq!(sim.reserved_va_bytes(), 0, "all address space back");
    }
}
