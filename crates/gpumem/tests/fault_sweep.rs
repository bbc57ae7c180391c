//! The fault sweep: every driver call each pool makes, failed at each of its
//! call numbers, once in the pool's working life and once while it drops.
//!
//! For each pool a fixed workload runs on a small simulated device: blocks
//! of several sizes allocated and freed on a held stream, then wanted by a
//! second stream (the steal path), trims and releases, memory filled until
//! out of memory and wanted again (the reclaim path), everything freed, the
//! pool dropped. A dry run counts the calls of each driver function; then
//! the workload runs again once per (function, call number), that call
//! failing with `CUDA_ERROR_UNKNOWN`, and once per device allocation call
//! failing with out-of-memory. Each run must show:
//! - no panic, and no two live blocks overlapping;
//! - the pool's invariants (where it has a checker) after every step;
//! - after the drop, nothing left with the driver: no device, pinned or
//!   physical memory, mapping, address range, event, stream or pool;
//! - when only the stream-ordering machinery failed (an event or stream
//!   query, record or wait), every allocation that fits still succeeds.
//!
//! Simulator only: the real driver cannot be made to fail on request.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::suite::LiveSet;
use gpumem::adaptor::FailureCallbackAdaptor;
use gpumem::async_pool::AsyncResource;
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::manager::{PinnedPool, PinnedPoolConfig};
use gpumem::pool::{
    ArenaConfig, ArenaResource, BinningConfig, BinningResource, CachingPool, CachingPoolConfig,
    FixedSizeResource, Pool, PoolConfig, PoolResource, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::{DeviceResource, MemoryResource, PinnedHostResource};
use gpumem::{Device, DevicePtr, Error, Event, Result, Stream};

/// `CUDA_ERROR_UNKNOWN`: what an injected failure returns.
const UNKNOWN: i32 = 999;
/// Capacity of the simulated device: small, so the workload reaches
/// out-of-memory quickly.
const CAPACITY: usize = 512 << 20;

/// Calls of the stream-ordering machinery: when one of them fails, a pool
/// must fall back (grow, synchronize) rather than fail an allocation.
const ORDERING_CALLS: &[&str] = &[
    "cuEventCreate",
    "cuEventRecord",
    "cuEventQuery",
    "cuStreamWaitEvent",
    "cuStreamQuery",
];

/// What the sweep needs of a pool besides allocating and freeing.
trait SweepPool: MemoryResource {
    /// Gives back what can be given back without waiting.
    fn sweep_trim(&self) -> Result<usize>;
    /// Waits for the streams, then gives back all cached memory.
    fn sweep_release(&self) -> Result<usize>;
    /// The pool's own invariant check, where it has one.
    fn check(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// The pools whose sweep gives back through [`Pool`] alone.
macro_rules! sweep_through_pool {
    ($($t:ty),*) => {$(
        impl SweepPool for $t {
            fn sweep_trim(&self) -> Result<usize> {
                Pool::trim(self, 0)
            }
            fn sweep_release(&self) -> Result<usize> {
                Pool::release(self)
            }
        }
    )*};
}

sweep_through_pool!(
    CachingPool<DeviceResource>,
    FixedSizeResource<DeviceResource>,
    ArenaResource<DeviceResource>,
    PinnedPool,
    AsyncResource
);

impl SweepPool for BinningResource<PoolResource<DeviceResource>> {
    fn sweep_trim(&self) -> Result<usize> {
        Pool::release(self)
    }
    fn sweep_release(&self) -> Result<usize> {
        let bins = Pool::release(self)?;
        Ok(bins + self.upstream().release()?)
    }
}

/// The pools with an invariant check of their own.
macro_rules! sweep_checked {
    ($($t:ty),*) => {$(
        impl SweepPool for $t {
            fn sweep_trim(&self) -> Result<usize> {
                Pool::trim(self, 0)
            }
            fn sweep_release(&self) -> Result<usize> {
                Pool::release(self)
            }
            fn check(&self) -> std::result::Result<(), String> {
                self.check_invariants()
            }
        }
    )*};
}

sweep_checked!(PoolResource<DeviceResource>, VirtualPool);

/// A pool under test: its name, the largest request it serves, and how to
/// build it on a device.
struct Subject {
    name: &'static str,
    max_request: usize,
    make: fn(&Device) -> Result<Box<dyn SweepPool>>,
}

fn subjects() -> Vec<Subject> {
    vec![
        Subject {
            name: "PoolResource",
            max_request: 64 << 20,
            make: |d| {
                let p = PoolResource::new(DeviceResource::new(d.clone()), PoolConfig::default())?;
                Ok(Box::new(p))
            },
        },
        Subject {
            name: "PoolResource (expandable)",
            max_request: 64 << 20,
            make: |d| {
                let mut config = PoolConfig::default();
                config.expandable = true;
                let p = PoolResource::new(DeviceResource::new(d.clone()), config)?;
                Ok(Box::new(p))
            },
        },
        Subject {
            name: "CachingPool",
            max_request: 64 << 20,
            make: |d| {
                let p =
                    CachingPool::new(DeviceResource::new(d.clone()), CachingPoolConfig::default())?;
                Ok(Box::new(p))
            },
        },
        Subject {
            name: "FixedSizeResource",
            max_request: 4 << 20,
            make: |d| {
                let p = FixedSizeResource::new(
                    DeviceResource::new(d.clone()),
                    common::fixed_size_config(4 << 20, 4),
                )?;
                Ok(Box::new(p))
            },
        },
        Subject {
            name: "BinningResource",
            max_request: 64 << 20,
            make: |d| {
                let pool =
                    PoolResource::new(DeviceResource::new(d.clone()), PoolConfig::default())?;
                Ok(Box::new(BinningResource::new(
                    pool,
                    BinningConfig::fixed_bins(8, 20),
                )?))
            },
        },
        Subject {
            name: "ArenaResource",
            max_request: 64 << 20,
            make: |d| {
                let p = ArenaResource::new(
                    DeviceResource::new(d.clone()),
                    ArenaConfig::with_size(CAPACITY / 2),
                )?;
                Ok(Box::new(p))
            },
        },
        Subject {
            name: "VirtualPool",
            max_request: 64 << 20,
            make: |d| {
                Ok(Box::new(VirtualPool::new(
                    d.clone(),
                    VirtualPoolConfig::default(),
                )?))
            },
        },
        Subject {
            name: "VirtualPool (NCCL-ready)",
            max_request: 64 << 20,
            make: |d| {
                Ok(Box::new(VirtualPool::new(
                    d.clone(),
                    VirtualPoolConfig::nccl_ready(Vec::new()),
                )?))
            },
        },
        Subject {
            name: "PinnedPool",
            max_request: 64 << 20,
            make: |d| {
                let mut config = PinnedPoolConfig::default();
                config.max_reserved = Some(CAPACITY / 2);
                Ok(Box::new(PinnedPool::new(
                    PinnedHostResource::new(d.clone()),
                    config,
                )?))
            },
        },
        Subject {
            name: "AsyncResource",
            max_request: 64 << 20,
            make: |d| Ok(Box::new(AsyncResource::with_defaults(d.clone())?)),
        },
    ]
}

/// How one run went.
#[derive(Default)]
struct Outcome {
    /// Frees that failed (by injection): the block must still be live, so
    /// freeing it again once the driver works must succeed.
    failed_frees: Vec<(DevicePtr, usize, Stream)>,
    /// Failed allocations that had room (the workload's first two phases).
    failed_allocations: Vec<String>,
    /// Invariant violations seen after a step.
    broken: Vec<String>,
    /// Blocks served again after out-of-memory, once half were freed.
    refilled: usize,
}

/// The test's own streams, and an event whose records stand for kernels
/// still running on a held stream; made before any fault is armed.
struct Harness {
    s1: Stream,
    s2: Stream,
    work: Event,
}

impl Harness {
    fn new(device: &Device) -> Self {
        Self {
            s1: device.create_stream().expect("stream"),
            s2: device.create_stream().expect("stream"),
            work: Event::new(device).expect("event"),
        }
    }

    /// Enqueues work on `s` (which a held stream keeps pending). A failure
    /// is an injected one and only means less work is pending.
    fn busy(&self, s: &Stream) {
        let _ = self.work.record(s);
    }
}

/// The workload. Allocation failures are noted, never fatal: an injected
/// failure may legitimately surface as one.
fn workload(pool: &dyn SweepPool, sim: &SimDriver, h: &Harness, max: usize) -> Outcome {
    let mut out = Outcome::default();
    let live = LiveSet::default();
    let (s1, s2) = (&h.s1, &h.s2);
    let sizes: Vec<usize> = [1000, 300_000, 3 << 20, 12 << 20, 40 << 20]
        .into_iter()
        .map(|b: usize| b.min(max))
        .collect();
    let check = |out: &mut Outcome, step: &str| {
        if let Err(e) = pool.check() {
            out.broken.push(format!("after {step}: {e}"));
        }
    };
    let alloc = |out: &mut Outcome,
                 bytes: usize,
                 s: &Stream,
                 held: &mut Vec<(DevicePtr, usize)>| {
        match pool.allocate(bytes, 256, s) {
            Ok(p) => {
                live.insert(p, bytes);
                held.push((p, bytes));
            }
            Err(e) => out.failed_allocations.push(format!("{bytes} B: {e}")),
        }
    };
    let free_all = |out: &mut Outcome, held: &mut Vec<(DevicePtr, usize)>, s: &Stream| {
        for (p, bytes) in held.drain(..) {
            match pool.deallocate(p, bytes, 256, s) {
                Ok(()) => live.remove(p),
                Err(_) => out.failed_frees.push((p, bytes, s.clone())),
            }
        }
    };

    // 1. Blocks freed on a held stream, then wanted by another stream.
    sim.hold(s1.raw());
    let mut held = Vec::new();
    for &b in &sizes {
        alloc(&mut out, b, s1, &mut held);
    }
    check(&mut out, "allocating on s1");
    h.busy(s1);
    free_all(&mut out, &mut held, s1);
    for &b in &sizes {
        alloc(&mut out, b, s2, &mut held);
    }
    check(&mut out, "allocating on s2");
    sim.release(s1.raw());
    free_all(&mut out, &mut held, s2);
    let _ = pool.sweep_trim();
    check(&mut out, "trim");
    for &b in sizes.iter().rev() {
        alloc(&mut out, b, s1, &mut held);
    }
    free_all(&mut out, &mut held, s1);
    let _ = pool.sweep_release();
    check(&mut out, "release");
    let had_room = std::mem::take(&mut out.failed_allocations);

    // 2. Fill the device, free half on a held stream, and want it again.
    let big = max;
    for _ in 0..(2 * CAPACITY / big) {
        match pool.allocate(big, 256, s1) {
            Ok(p) => {
                live.insert(p, big);
                held.push((p, big));
            }
            Err(_) => break,
        }
    }
    check(&mut out, "filling");
    sim.hold(s2.raw());
    h.busy(s2);
    let half = held.len() / 2;
    let mut second = held.split_off(half);
    free_all(&mut out, &mut second, s2);
    for _ in 0..half {
        match pool.allocate(big, 256, s1) {
            Ok(p) => {
                live.insert(p, big);
                held.push((p, big));
                out.refilled += 1;
            }
            Err(_) => break,
        }
    }
    check(&mut out, "reclaiming");
    sim.release(s2.raw());
    free_all(&mut out, &mut held, s1);
    let _ = pool.sweep_release();
    check(&mut out, "final release");
    out.failed_allocations = had_room;
    out
}

/// What the driver holds for a device: every kind of resource a pool can
/// leave behind.
fn holdings(sim: &SimDriver) -> BTreeMap<&'static str, usize> {
    BTreeMap::from([
        ("device bytes", sim.device_bytes(0)),
        ("device allocations", sim.device_allocations(0)),
        ("pinned bytes", sim.pinned_host_bytes()),
        ("host allocations", sim.host_allocations()),
        ("mapped bytes", sim.mapped_bytes()),
        ("physical bytes", sim.physical_bytes()),
        ("reserved address bytes", sim.reserved_va_bytes()),
        ("events", sim.live_events()),
        ("streams", sim.live_streams()),
        ("pools", sim.live_pools()),
    ])
}

/// Where the injected failure goes.
#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    /// The nth call of a driver function during the pool's life.
    Working(&'static str, u64),
    /// The nth device allocation call during the pool's life: out of memory.
    WorkingOom(u64),
    /// The nth call of a driver function while the pool drops.
    Dropping(&'static str, u64),
}

/// One run: the calls made while working and while dropping, per function.
struct Run {
    refilled: usize,
    working: Vec<(&'static str, u64)>,
    dropping: Vec<(&'static str, u64)>,
    allocation_calls: u64,
}

fn diff(after: &[(&'static str, u64)], before: &[(&'static str, u64)]) -> Vec<(&'static str, u64)> {
    let before: BTreeMap<_, _> = before.iter().copied().collect();
    after
        .iter()
        .filter_map(|&(k, n)| {
            let d = n - before.get(k).copied().unwrap_or(0);
            (d > 0).then_some((k, d))
        })
        .collect()
}

const ALLOCATION_CALLS: &[&str] = &[
    "cuMemAlloc",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemCreate",
];

/// Runs the workload once with `fault`; `dry` is the fault-free run, whose
/// refill every run with only an ordering fault must match.
fn run_once(subject: &Subject, fault: Fault, dry: Option<&Run>) -> Run {
    let mut config = SimConfig::default();
    config.capacity = CAPACITY;
    let sim = Arc::new(SimDriver::new(config));
    let device = Device::new(sim.clone(), 0).expect("simulated device");
    let baseline = holdings(&sim);
    let harness = Harness::new(&device);
    match fault {
        Fault::Working(call, n) => sim.fail_call(call, n, UNKNOWN),
        Fault::WorkingOom(n) => sim.fail_nth_alloc(n),
        Fault::None | Fault::Dropping(..) => {}
    }
    let c0 = sim.call_counts();
    let what = format!("{} with fault {fault:?}", subject.name);
    let mut outcome;
    let c1;
    match (subject.make)(&device) {
        Ok(pool) => {
            outcome = workload(&*pool, &sim, &harness, subject.max_request);
            c1 = sim.call_counts();
            sim.clear_faults();
            for (p, bytes, s) in std::mem::take(&mut outcome.failed_frees) {
                pool.deallocate(p, bytes, 256, &s).unwrap_or_else(|e| {
                    panic!("{what}: a failed free of {p:#x} left it unfreeable: {e}")
                });
            }
            if let Fault::Dropping(call, n) = fault {
                sim.fail_call(call, n, UNKNOWN);
            }
            drop(pool);
        }
        Err(e) => {
            // Only an injected failure may stop the pool from being built.
            assert!(
                !matches!(fault, Fault::None),
                "{what}: building failed without a fault: {e}"
            );
            outcome = Outcome::default();
            c1 = sim.call_counts();
        }
    }
    let c2 = sim.call_counts();
    sim.clear_faults();
    drop(harness);
    assert!(outcome.broken.is_empty(), "{what}: {:?}", outcome.broken);
    let ordering_fault = matches!(fault, Fault::Working(c, _) if ORDERING_CALLS.contains(&c));
    if matches!(fault, Fault::None) || ordering_fault {
        assert!(
            outcome.failed_allocations.is_empty(),
            "{what}: allocations with room failed: {:?}",
            outcome.failed_allocations
        );
        if let Some(dry) = dry {
            assert_eq!(
                outcome.refilled, dry.refilled,
                "{what}: fewer blocks served again after out-of-memory"
            );
        }
    }
    let left = holdings(&sim);
    assert_eq!(left, baseline, "{what}: left with the driver after drop");
    let working = diff(&c1, &c0);
    let allocation_calls = working
        .iter()
        .filter(|(k, _)| ALLOCATION_CALLS.contains(k))
        .map(|&(_, n)| n)
        .sum();
    Run {
        refilled: outcome.refilled,
        dropping: diff(&c2, &c1),
        working,
        allocation_calls,
    }
}

/// Runs the whole sweep for one pool; returns (functions, injection points).
fn sweep(subject: &Subject) -> (usize, u64) {
    let dry = run_once(subject, Fault::None, None);
    assert!(
        dry.refilled > 0,
        "{}: the reclaim phase serves blocks",
        subject.name
    );
    let mut points = 0;
    for &(call, n) in &dry.working {
        for i in 1..=n {
            run_once(subject, Fault::Working(call, i), Some(&dry));
            points += 1;
        }
    }
    for i in 1..=dry.allocation_calls {
        run_once(subject, Fault::WorkingOom(i), Some(&dry));
        points += 1;
    }
    for &(call, n) in &dry.dropping {
        for i in 1..=n {
            run_once(subject, Fault::Dropping(call, i), Some(&dry));
            points += 1;
        }
    }
    let mut functions: Vec<_> = dry.working.iter().map(|&(k, _)| k).collect();
    functions.extend(dry.dropping.iter().map(|&(k, _)| k));
    functions.sort_unstable();
    functions.dedup();
    eprintln!(
        "fault sweep: {}: {} driver functions, {points} injection points ({})",
        subject.name,
        functions.len(),
        functions.join(", ")
    );
    (functions.len(), points)
}

macro_rules! sweep_tests {
    ($($test:ident => $name:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            let s = subjects().into_iter().find(|s| s.name == $name).expect("subject");
            let (functions, points) = sweep(&s);
            assert!(functions > 0 && points > 0, "the workload calls the driver");
        }
    )*};
}

sweep_tests! {
    sweep_pool_resource => "PoolResource",
    sweep_pool_resource_expandable => "PoolResource (expandable)",
    sweep_caching_pool => "CachingPool",
    sweep_fixed_size => "FixedSizeResource",
    sweep_binning => "BinningResource",
    sweep_arena => "ArenaResource",
    sweep_virtual_pool => "VirtualPool",
    sweep_virtual_pool_nccl_ready => "VirtualPool (NCCL-ready)",
    sweep_async_resource => "AsyncResource",
    sweep_pinned_pool => "PinnedPool",
}

/// Finding 6: two pools share an upstream whose failure callback releases
/// both on out-of-memory, the usual reason for such a callback. Before the
/// fix, the pool that grew held its lock across the upstream call and the
/// callback's release of that same pool deadlocked.
#[test]
fn a_failure_callback_that_releases_the_pools_does_not_deadlock() {
    use std::sync::{mpsc, OnceLock};
    use std::time::Duration;

    type Shared = Arc<FailureCallbackAdaptor<DeviceResource>>;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut config = SimConfig::default();
        config.capacity = 64 << 20;
        let sim = Arc::new(SimDriver::new(config));
        let device = Device::new(sim.clone(), 0).expect("simulated device");
        let pools: Arc<OnceLock<[PoolResource<Shared>; 2]>> = Arc::new(OnceLock::new());
        let seen = pools.clone();
        let upstream: Shared = Arc::new(FailureCallbackAdaptor::new(
            DeviceResource::new(device.clone()),
            move |_bytes, _err| {
                // Give back what both pools cache, then ask for a retry.
                let mut freed = 0;
                if let Some(ps) = seen.get() {
                    for p in ps {
                        freed += p.release().unwrap_or(0);
                    }
                }
                freed > 0
            },
        ));
        let make = || PoolResource::new(upstream.clone(), PoolConfig::default()).unwrap();
        let _ = pools.set([make(), make()]);
        let [a, b] = pools.get().unwrap();
        let s = device.create_stream().unwrap();
        // Pool b caches 40 MiB; pool a then needs 40 MiB of a 64 MiB device.
        let p = b.allocate(40 << 20, 256, &s).unwrap();
        b.deallocate(p, 40 << 20, 256, &s).unwrap();
        let got = a.allocate(40 << 20, 256, &s);
        tx.send(got.map(|p| (p, b.reserved_bytes()))).unwrap();
    });
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok((p, b_reserved))) => {
            assert!(!p.is_null());
            assert_eq!(b_reserved, 0, "the callback released pool b");
        }
        Ok(Err(e)) => panic!("the retry after the callback failed: {e}"),
        Err(_) => panic!("deadlock: the allocation did not return within 20 s"),
    }
}

/// Finding 7: a region whose give-back fails stays the pool's (it used to
/// be taken off the books first and leaked for good).
#[test]
fn a_failed_give_back_keeps_the_region() {
    let (device, sim) = Device::sim_with_driver(SimConfig::default());
    let pool =
        PoolResource::new(DeviceResource::new(device.clone()), PoolConfig::default()).unwrap();
    let s = device.create_stream().unwrap();
    let p = pool.allocate(20 << 20, 256, &s).unwrap();
    pool.deallocate(p, 20 << 20, 256, &s).unwrap();
    let reserved = pool.reserved_bytes();
    sim.fail_call("cuMemFree", 1, UNKNOWN);
    assert!(matches!(pool.release(), Err(Error::Driver { .. })));
    assert_eq!(
        pool.reserved_bytes(),
        reserved,
        "the region is still the pool's"
    );
    assert_eq!(
        pool.release().unwrap(),
        reserved,
        "and goes back once the driver takes it"
    );
    assert_eq!(sim.device_bytes(0), 0);
}

/// Finding 8: a failed event on the cross-stream path no longer fails an
/// allocation that could grow.
#[test]
fn a_failed_steal_falls_back_to_growing() {
    for call in ["cuEventCreate", "cuEventRecord", "cuStreamWaitEvent"] {
        let (device, sim) = Device::sim_with_driver(SimConfig::default());
        for pool in [
            Box::new(
                PoolResource::new(DeviceResource::new(device.clone()), PoolConfig::default())
                    .unwrap(),
            ) as Box<dyn MemoryResource>,
            Box::new(VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap()),
        ] {
            let h = Harness::new(&device);
            let (s1, s2) = (&h.s1, &h.s2);
            sim.hold(s1.raw());
            let p = pool.allocate(32 << 20, 256, s1).unwrap();
            h.busy(s1);
            pool.deallocate(p, 32 << 20, 256, s1).unwrap();
            sim.fail_call(call, 1, UNKNOWN);
            let before = sim.call_count(call);
            let q = pool.allocate(32 << 20, 256, s2);
            assert!(sim.call_count(call) > before, "{call} was tried");
            sim.clear_faults();
            let q = q.unwrap_or_else(|e| panic!("{call} failing failed the allocation: {e}"));
            assert_ne!(
                q, p,
                "{call}: s1's block is still pending: not handed to s2"
            );
            pool.deallocate(q, 32 << 20, 256, s2).unwrap();
            sim.release(s1.raw());
        }
    }
}
