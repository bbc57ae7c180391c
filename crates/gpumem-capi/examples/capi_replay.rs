//! Replays an RMM log through the C ABI's allocator (the state behind
//! `gpumem_malloc` and `gpumem_free`, [`Allocator`]) on the simulated
//! driver, several passes through one device, and prints per pass the
//! driver calls it made (by name), ns per operation (bookkeeping only: the
//! simulator's calls cost next to nothing) and the peak reserve over the
//! peak of live bytes so far. The log's stream 0 is the legacy default
//! stream, as the C ABI gets it from PyTorch; its other streams are
//! streams of the simulator.
//!
//! `--direct` replays through a `CachingPool` with its defaults over the
//! plain device resource on a stream of its own instead: the pool `gpumem
//! replay --alloc caching` builds, without the C ABI's counting upstream
//! (`--steps N`: with `large_class_steps`
//! N; 0 sends blocks above 2 GiB to the driver as before issue 47), and
//! prints the blocks each class holds at the end. `--wide SEED` replays the widely varying
//! synthetic log of `tests/support/wide_sizes.rs` instead of files, and
//! `--write FILE` writes that log as an RMM log.
//!
//! ```text
//! cargo run --release -p gpumem-capi --example capi_replay -- \
//!     [--conf resource=caching] [--direct [--steps N]] [--passes N] [--wide SEED] [--write FILE] [trace.rmm.csv ...]
//! ```

#[path = "../tests/support/wide_sizes.rs"]
#[allow(dead_code)]
mod wide_sizes;

use std::collections::HashMap;
use std::time::Instant;

use gpumem::driver::sim::SimDriver;
use gpumem::driver::Driver;
use gpumem::pool::{CachingPool, CachingPoolConfig, Pool};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::trace::{self, Action, TraceEvent};
use gpumem::{Device, DevicePtr, Stream};
use gpumem_capi::conf::parse;
use gpumem_capi::{Allocator, Backend};

/// One step of a replay: allocations fill slots, frees empty them.
enum Step {
    Alloc {
        slot: usize,
        size: usize,
        stream: usize,
    },
    Free {
        slot: usize,
    },
}

/// The log's allocations and frees as slot numbers (frees of unknown
/// pointers dropped), and the log's streams in order of appearance.
fn prepare(events: &[TraceEvent]) -> (Vec<Step>, usize, Vec<u64>) {
    let mut slots: HashMap<u64, usize> = HashMap::new();
    let mut streams: Vec<u64> = Vec::new();
    let mut steps = Vec::new();
    let mut next = 0;
    for e in events {
        let stream = match streams.iter().position(|&s| s == e.stream) {
            Some(i) => i,
            None => {
                streams.push(e.stream);
                streams.len() - 1
            }
        };
        match e.action {
            Action::Allocate => {
                slots.insert(e.ptr, next);
                steps.push(Step::Alloc {
                    slot: next,
                    size: e.size,
                    stream,
                });
                next += 1;
            }
            Action::Free => {
                if let Some(slot) = slots.remove(&e.ptr) {
                    steps.push(Step::Free { slot });
                }
            }
            _ => {}
        }
    }
    (steps, next, streams)
}

/// What is replayed through: the C ABI's allocator, or a pool of its own.
enum Target {
    Capi(Allocator),
    Direct(Box<CachingPool>, Vec<Stream>),
}

impl Target {
    fn malloc(&self, size: usize, stream: usize, raw: &[u64]) -> DevicePtr {
        match self {
            Target::Capi(a) => a.malloc(size, 0, raw[stream]),
            Target::Direct(p, s) => p.allocate(size, 256, &s[stream]).expect("allocate"),
        }
    }
    fn free(&self, ptr: DevicePtr, size: usize, stream: usize, raw: &[u64]) {
        match self {
            Target::Capi(a) => a.free(ptr, size, 0, raw[stream]),
            Target::Direct(p, s) => p.deallocate(ptr, size, 256, &s[stream]).expect("free"),
        }
    }
    /// Peak reserve and peak of live bytes.
    fn peaks(&self, peak_live: usize) -> (usize, usize) {
        match self {
            Target::Capi(a) => (a.peak_reserved_bytes(0), a.peak_allocated_bytes(0)),
            Target::Direct(p, _) => (p.peak_reserved_bytes(), peak_live),
        }
    }
}

fn main() {
    let mut passes = 8;
    let mut conf = "resource=caching".to_string();
    let mut direct = false;
    let mut large_steps = None;
    let mut wide = None;
    let mut write = None;
    let mut paths = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--passes" => passes = value(args.next(), "--passes N"),
            "--conf" => conf = value(args.next(), "--conf TEXT"),
            "--direct" => direct = true,
            "--steps" => large_steps = Some(value(args.next(), "--steps N")),
            "--wide" => wide = Some(value::<u64>(args.next(), "--wide SEED")),
            "--write" => write = Some(value::<String>(args.next(), "--write FILE")),
            _ => paths.push(a),
        }
    }
    let mut logs: Vec<(String, Vec<TraceEvent>)> = Vec::new();
    if let Some(seed) = wide {
        let events = wide_sizes::rmm_log(&wide_sizes::iterations(seed, wide_sizes::ITERATIONS));
        if let Some(path) = &write {
            let file = std::fs::File::create(path).expect("create the log");
            trace::write_csv(std::io::BufWriter::new(file), &events).expect("write the log");
        }
        logs.push((format!("wide sizes, seed {seed}"), events));
    }
    for path in &paths {
        logs.push((path.clone(), trace::read_file(path).expect("trace")));
    }
    assert!(!logs.is_empty(), "name an RMM log or --wide SEED");
    for (name, events) in &logs {
        let (steps, slots, log_streams) = prepare(events);
        let (target, sim, raw) = if direct {
            let (device, sim) = Device::sim_with_driver(Default::default());
            let streams: Vec<Stream> = log_streams
                .iter()
                .map(|_| device.create_stream().expect("stream"))
                .collect();
            let mut config = CachingPoolConfig::default();
            if let Some(n) = large_steps {
                config.large_class_steps = n;
            }
            let pool = CachingPool::new(DeviceResource::new(device), config).expect("pool");
            (Target::Direct(Box::new(pool), streams), sim, Vec::new())
        } else {
            let parsed = parse(&conf);
            assert!(parsed.problems.is_empty(), "{conf}: {:?}", parsed.problems);
            let a = Allocator::new(parsed.conf, Backend::sim());
            let Backend::Sim(sim) = a.backend() else {
                unreachable!("a simulated backend")
            };
            let sim = sim.clone();
            let raw: Vec<u64> = log_streams
                .iter()
                .map(|&s| match s {
                    0 => 0,
                    _ => sim.stream_create(0, true).expect("stream"),
                })
                .collect();
            (Target::Capi(a), sim, raw)
        };
        let what = if direct { "direct CachingPool" } else { &conf };
        println!("{name} ({what})");
        let mut ptrs = vec![(DevicePtr::NULL, 0usize, 0usize); slots];
        let mut peak_live = 0;
        for pass in 1..=passes {
            let before: HashMap<&str, u64> = calls(&sim).into_iter().collect();
            let mut live = 0;
            let t = Instant::now();
            for step in &steps {
                match *step {
                    Step::Alloc { slot, size, stream } => {
                        let p = target.malloc(size, stream, &raw);
                        assert!(!p.is_null(), "allocation of {size} bytes failed");
                        ptrs[slot] = (p, size, stream);
                        live += size;
                        peak_live = peak_live.max(live);
                    }
                    Step::Free { slot } => {
                        let (p, size, stream) = ptrs[slot];
                        target.free(p, size, stream, &raw);
                        ptrs[slot].0 = DevicePtr::NULL;
                        live -= size;
                    }
                }
            }
            for (p, size, stream) in ptrs.iter_mut() {
                if !p.is_null() {
                    target.free(*p, *size, *stream, &raw);
                    *p = DevicePtr::NULL;
                }
            }
            let ns = t.elapsed().as_nanos() as f64 / steps.len() as f64;
            let made: Vec<String> = calls(&sim)
                .into_iter()
                .filter_map(|(name, n)| {
                    let d = n - before.get(name).copied().unwrap_or(0);
                    (d > 0).then(|| format!("{name} {d}"))
                })
                .collect();
            let (reserved, live) = target.peaks(peak_live);
            println!(
                "  pass {pass}: {ns:6.1} ns/op  reserved/live {:.3}  reserved {:.0} MiB  driver calls: {}",
                reserved as f64 / live as f64,
                reserved as f64 / 1048576.0,
                if made.is_empty() {
                    "none".to_string()
                } else {
                    made.join(", ")
                }
            );
        }
        if let Target::Direct(pool, _) = &target {
            let held: Vec<String> = pool
                .stats()
                .classes
                .iter()
                .filter(|c| c.chunks > 0 && c.block_size >= 1 << 20)
                .map(|c| format!("{} MiB x{}", c.block_size >> 20, c.reserved / c.block_size))
                .collect();
            println!(
                "  classes of 1 MiB and more holding blocks: {}",
                held.join(", ")
            );
        }
    }
}

/// An option's value, parsed; `usage` says what was expected.
fn value<T: std::str::FromStr>(arg: Option<String>, usage: &str) -> T {
    arg.and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("usage: {usage}"))
}

/// The driver calls made so far, by name.
fn calls(sim: &SimDriver) -> Vec<(&'static str, u64)> {
    sim.call_counts()
}
