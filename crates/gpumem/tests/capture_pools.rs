//! Every pool while a stream captures a CUDA graph (Global mode, the
//! strictest): allocating and freeing on the capturing stream makes no call
//! CUDA forbids during a capture (the simulator logs and refuses them), and
//! the capture ends with a graph; an expandable pool moves no free piece
//! (that would wait for streams). Then [`GraphPool`]: the capture's memory
//! keeps its address for every launch and is not handed out elsewhere.
//!
//! Simulator-only where they read its violation log; a Global capture binds
//! every thread, so the tests take turns.

mod common;

use std::sync::{Arc, Mutex, MutexGuard};

use common::expandable::{hole_in_the_middle, recycling};
use gpumem::adaptor::StatisticsAdaptor;
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::CaptureMode;
use gpumem::graph_pool::GraphPool;
use gpumem::pool::{
    ArenaConfig, ArenaResource, CachingPool, CachingPoolConfig, FixedSizeConfig, FixedSizeResource,
    Pool, PoolResource, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, DeviceBuffer, DevicePtr, Stream};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn sim() -> (Device, Arc<SimDriver>) {
    Device::sim_with_driver(SimConfig::backed(2 << 30))
}

/// Allocates and frees on `s` while it captures: a few sizes, a temporary
/// freed and allocated again. Returns the violations the simulator logged
/// and whether the capture ended with a graph.
fn capture_with<R: MemoryResource>(
    mr: &R,
    sim: &SimDriver,
    s: &Stream,
    sizes: &[usize],
) -> (Vec<String>, bool) {
    // Warm: the pool holds memory before the capture.
    for &n in sizes {
        let p = mr.allocate(n, 256, s).unwrap();
        mr.deallocate(p, n, 256, s).unwrap();
    }
    s.synchronize().unwrap();
    sim.clear_capture_violations();
    s.begin_capture(CaptureMode::Global).unwrap();
    let mut live: Vec<(DevicePtr, usize)> = Vec::new();
    for &n in sizes {
        if let Ok(p) = mr.allocate(n, 256, s) {
            live.push((p, n));
        }
    }
    let (t, n) = live.pop().unwrap_or((DevicePtr::NULL, 0));
    if !t.is_null() {
        let _ = mr.deallocate(t, n, 256, s);
        if let Ok(p) = mr.allocate(n, 256, s) {
            live.push((p, n));
        }
    }
    let ended = s.end_capture().is_ok();
    let violations = sim
        .capture_violations()
        .iter()
        .map(|v| format!("{} ({})", v.call, v.reason))
        .collect();
    for (p, n) in live {
        mr.deallocate(p, n, 256, s).unwrap();
    }
    s.synchronize().unwrap();
    (violations, ended)
}

fn check<R: MemoryResource>(name: &str, mr: &R, sim: &SimDriver, s: &Stream, sizes: &[usize]) {
    let (violations, ended) = capture_with(mr, sim, s, sizes);
    assert!(
        violations.is_empty(),
        "{name}: forbidden calls during capture: {violations:?}"
    );
    assert!(ended, "{name}: the capture was invalidated");
}

#[test]
fn every_pool_allocates_and_frees_inside_a_capture_without_a_forbidden_call() {
    let _turn = serial();
    let sizes = [1000, 64 << 10, MIB, 3 * MIB];
    let (device, sim) = sim();
    let s = device.create_stream().unwrap();
    let up = || DeviceResource::new(device.clone());
    check(
        "pool",
        &PoolResource::with_defaults(up()).unwrap(),
        &sim,
        &s,
        &sizes,
    );
    check(
        "caching",
        &CachingPool::new(up(), CachingPoolConfig::default()).unwrap(),
        &sim,
        &s,
        &sizes,
    );
    check(
        "arena",
        &ArenaResource::new(up(), ArenaConfig::with_size(64 * MIB)).unwrap(),
        &sim,
        &s,
        &sizes,
    );
    check(
        "fixed",
        &FixedSizeResource::new(up(), FixedSizeConfig::default()).unwrap(),
        &sim,
        &s,
        &[4096; 4],
    );
    check(
        "vpool",
        &VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap(),
        &sim,
        &s,
        &sizes,
    );
    check(
        "graph pool",
        &GraphPool::new(&device).unwrap(),
        &sim,
        &s,
        &sizes,
    );
}

#[test]
fn a_graph_pool_grows_during_a_global_capture_and_its_memory_stays_the_graphs() {
    let _turn = serial();
    let (device, sim) = sim();
    let s = device.create_stream().unwrap();
    let pool = GraphPool::new(&device).unwrap();
    let other = StatisticsAdaptor::new(
        PoolResource::with_defaults(DeviceResource::new(device.clone())).unwrap(),
    );
    sim.clear_capture_violations();
    pool.begin(&s, CaptureMode::Global).unwrap();
    let out = DeviceBuffer::<u32, _>::zeroed(MIB, &pool, &s).unwrap();
    let tmp = DeviceBuffer::<u32, _>::zeroed(2 * MIB, &pool, &s).unwrap(); // a temporary
    let tmp_ptr = tmp.as_device_ptr();
    drop(tmp); // freed in the capture: reusable by it, by no one else
    let again = DeviceBuffer::<u32, _>::zeroed(2 * MIB, &pool, &s).unwrap();
    assert_eq!(
        again.as_device_ptr(),
        tmp_ptr,
        "the capture's stream reuses its own temporary"
    );
    drop(again);
    let exec = pool.end(&s).unwrap().instantiate().unwrap();
    assert!(
        sim.capture_violations().is_empty(),
        "{:?}",
        sim.capture_violations()
    );
    for _ in 0..3 {
        exec.launch(&s).unwrap();
        assert_eq!(out.to_vec().unwrap(), vec![0u32; MIB]);
    }
    // Other work never gets the graph's memory.
    let p = other.allocate(2 * MIB * 4, 256, &s).unwrap();
    assert!(p.0 + (8 * MIB) as u64 <= tmp_ptr.0 || p.0 >= tmp_ptr.0 + (8 * MIB) as u64);
    other.deallocate(p, 2 * MIB * 4, 256, &s).unwrap();
    drop(out);
    drop(exec);
    let given = pool.release().unwrap();
    assert!(given >= 12 * MIB, "gave back {given}");
    assert_eq!(pool.live_bytes(), 0);
}

#[test]
fn nothing_is_recycled_while_a_capture_is_under_way() {
    // An expandable pool moves free pieces to its end only after waiting
    // for their streams, which a capture anywhere forbids.
    let _turn = serial();
    let (device, sim) = common::model::sim(8 << 30);
    let pool = PoolResource::new(DeviceResource::new(device.clone()), recycling()).unwrap();
    let s = device.create_stream().unwrap();
    let y = hole_in_the_middle(&pool, &s);
    let other = device.create_stream().unwrap();
    other.begin_capture(CaptureMode::Global).unwrap();
    let z = pool.allocate(200 * MIB, 256, &s).unwrap();
    assert_eq!(
        pool.reserved_bytes(),
        (148 + 184) * MIB,
        "the range grew by all it lacked"
    );
    drop(other.end_capture().unwrap());
    assert!(sim.capture_violations().is_empty());
    pool.deallocate(z, 200 * MIB, 256, &s).unwrap();
    pool.deallocate(y, 4 * MIB, 256, &s).unwrap();
    pool.check_invariants().unwrap();
}

/// One step of the interleaving proptest.
#[derive(Debug, Clone)]
enum Step {
    /// Allocate a size (by index) on the capturing stream or the other one.
    Alloc { on_capturing: bool, size: usize },
    /// Free a live block (by index, modulo) on one of the streams.
    Free { pick: usize, on_capturing: bool },
    /// Queue work on the other stream over a live block, so its frees wait.
    Work { pick: usize },
    /// Begin a Global capture on the capturing stream, or end it.
    Toggle,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (any::<bool>(), 0..5usize).prop_map(|(on_capturing, size)| Step::Alloc { on_capturing, size }),
        3 => (any::<usize>(), any::<bool>()).prop_map(|(pick, on_capturing)| Step::Free { pick, on_capturing }),
        1 => any::<usize>().prop_map(|pick| Step::Work { pick }),
        1 => Just(Step::Toggle),
    ]
}

const STEP_SIZES: [usize; 5] = [512, 4096, 100_000, MIB, 3 * MIB];

fn overlaps(a: (u64, usize), b: (u64, usize)) -> bool {
    a.0 < b.0 + b.1 as u64 && b.0 < a.0 + a.1 as u64
}

/// Runs `steps` on `mr`: stream `s` captures now and then while stream `t`
/// runs uncaptured work beside it on the same thread. Checks that no call
/// breaks a capture, that live blocks never overlap, and that no block
/// freed during a capture (the graph's) is handed out again.
fn interleave<R: MemoryResource>(mr: &R, sim: &SimDriver, device: &Device, steps: &[Step]) {
    let s = device.create_stream().unwrap();
    let t = device.create_stream().unwrap();
    sim.clear_capture_violations();
    let mut live: Vec<(u64, usize, bool)> = Vec::new(); // ptr, bytes, allocated on s
    let mut graphs_own: Vec<(u64, usize)> = Vec::new();
    let mut capturing = false;
    let mut graphs = Vec::new();
    for st in steps {
        match *st {
            Step::Alloc { on_capturing, size } => {
                let n = STEP_SIZES[size];
                let stream = if on_capturing { &s } else { &t };
                let p = mr
                    .allocate(n, 256, stream)
                    .unwrap_or_else(|e| panic!("{st:?}: {e}"));
                let b = (p.0, n);
                assert!(
                    live.iter().all(|&(q, m, _)| !overlaps(b, (q, m))),
                    "{b:?} overlaps a live block"
                );
                assert!(
                    graphs_own.iter().all(|&g| !overlaps(b, g)),
                    "{b:?} overlaps memory a graph freed during its capture"
                );
                live.push((p.0, n, on_capturing));
            }
            Step::Free { pick, on_capturing } if !live.is_empty() => {
                let (p, n, _) = live.swap_remove(pick % live.len());
                let stream = if on_capturing { &s } else { &t };
                mr.deallocate(DevicePtr(p), n, 256, stream)
                    .unwrap_or_else(|e| panic!("{st:?}: {e}"));
                if on_capturing && capturing {
                    graphs_own.push((p, n));
                }
            }
            Step::Work { pick } if !live.is_empty() => {
                let (p, n, _) = live[pick % live.len()];
                // SAFETY: a live block of `n` bytes, kept until the work ran.
                unsafe { device.driver().memset_async(DevicePtr(p), 7, n, t.raw()) }.unwrap();
            }
            Step::Toggle if capturing => {
                graphs.push(s.end_capture().expect("the capture ends with a graph"));
                capturing = false;
            }
            Step::Toggle => {
                s.begin_capture(CaptureMode::Global).unwrap();
                capturing = true;
            }
            _ => {}
        }
        let v = sim.capture_violations();
        assert!(v.is_empty(), "after {st:?}: {v:?}");
    }
    if capturing {
        graphs.push(s.end_capture().expect("the capture ends with a graph"));
    }
    for (p, n, _) in live {
        mr.deallocate(DevicePtr(p), n, 256, &t).unwrap();
    }
    t.synchronize().unwrap();
    s.synchronize().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn captured_and_uncaptured_work_interleave_safely(
        steps in proptest::collection::vec(step(), 1..48),
    ) {
        let _turn = serial();
        let (device, sim) = Device::sim_with_driver(SimConfig::default());
        let up = || DeviceResource::new(device.clone());
        interleave(&PoolResource::with_defaults(up()).unwrap(), &sim, &device, &steps);
        interleave(&CachingPool::new(up(), CachingPoolConfig::default()).unwrap(), &sim, &device, &steps);
        interleave(&ArenaResource::new(up(), ArenaConfig::with_size(256 * MIB)).unwrap(), &sim, &device, &steps);
        interleave(
            &VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap(),
            &sim,
            &device,
            &steps,
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    /// The pool model (`common::model`) with captures on stream 0, over every
    /// pool and the adaptors, on a backed device: no call breaks a capture,
    /// nothing a capture freed is handed out again, stream order and data
    /// hold across captures, and everything goes back when the pool goes.
    #[test]
    fn every_pool_follows_the_model_across_captures(
        ops in proptest::collection::vec(common::model::op_capturing(22), 1..120),
    ) {
        let _turn = serial();
        for kind in 0..common::model::KINDS {
            let ops: Vec<_> = ops
                .iter()
                .cloned()
                .map(|op| match op {
                    common::model::Op::Alloc { stream, bytes } if kind == 4 => {
                        common::model::Op::Alloc { stream, bytes: bytes.min(64 << 10) }
                    }
                    op => op,
                })
                .collect();
            common::model::run_kind(kind, &ops, true)?;
        }
    }
}
