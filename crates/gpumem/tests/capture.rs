//! Stream capture and graphs through the driver and the handle layer: replay
//! writes memory on every launch and not at capture, forbidden calls
//! invalidate the capture and are reported, relaxed mode lets a thread
//! allocate during a capture, joined streams, graph allocations, and drop
//! order.
//!
//! The tests run on the simulated device (backed where they check data), and
//! with `GPUMEM_DEVICE=cuda` on the GPU, except those marked simulator-only
//! (they need its violation log or its counters). A Global-mode capture
//! forbids calls on every thread of the process, so the tests of this file
//! take turns ([`serial`]).

mod common;

use std::sync::{Arc, Mutex, MutexGuard};

use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::{
    AccessFlags, CaptureMode, CaptureStatus, DevicePtr, Driver, HandleType, HostAllocFlags,
    PoolAttr, PoolProps, RawStream,
};
use gpumem::{Device, Error, Event, RelaxedCapture, Stream};

const N: usize = 64 << 10;

/// Holds the other tests of this file off: on a GPU, one test's Global
/// capture would refuse another test's `cuMemAlloc`.
fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `CUresult` of a driver or stream-capture error.
fn code(e: &Error) -> i32 {
    match e {
        Error::Driver { code, .. } | Error::StreamCapture { code, .. } => *code,
        other => panic!("expected a driver error, got {other:?}"),
    }
}

const INVALID_VALUE: i32 = 1;
const UNSUPPORTED: i32 = 900;
const INVALIDATED: i32 = 901;
const UNMATCHED: i32 = 903;
const UNJOINED: i32 = 904;
const ISOLATION: i32 = 905;
const IMPLICIT: i32 = 906;
const CAPTURED_EVENT: i32 = 907;
const WRONG_THREAD: i32 = 908;

fn memset(
    d: &dyn Driver,
    dst: DevicePtr,
    value: u8,
    bytes: usize,
    s: RawStream,
) -> gpumem::Result<()> {
    // SAFETY: the tests pass device memory they allocated and keep alive
    // until the work (or the graph holding it) has run.
    unsafe { d.memset_async(dst, value, bytes, s) }
}

fn dtod(
    d: &dyn Driver,
    dst: DevicePtr,
    src: DevicePtr,
    bytes: usize,
    s: RawStream,
) -> gpumem::Result<()> {
    // SAFETY: as for `memset`.
    unsafe { d.memcpy_dtod_async(dst, src, bytes, s) }
}

/// Device memory at `src`, read on `s` (not capturing) after its other work.
fn read(d: &dyn Driver, src: DevicePtr, bytes: usize, s: &Stream) -> Vec<u8> {
    let mut v = vec![0xEEu8; bytes];
    // SAFETY: `v` is `bytes` writable bytes, untouched until the synchronize.
    unsafe { d.memcpy_dtoh_async(v.as_mut_ptr(), src, bytes, s.raw()) }.unwrap();
    s.synchronize().unwrap();
    v
}

fn bytes_used_by_default_pool(d: &dyn Driver, ordinal: u32) -> u64 {
    let pool = d.mempool_default(ordinal).unwrap();
    // SAFETY: a device's default pool lives as long as the device's context.
    unsafe { d.mempool_get_attr(pool, PoolAttr::UsedMemCurrent) }.unwrap()
}

fn assert_no_violation(sim: &Option<Arc<SimDriver>>) {
    if let Some(sim) = sim {
        let v = sim.capture_violations();
        assert!(v.is_empty(), "forbidden calls: {v:?}");
    }
}

#[test]
fn replay_runs_the_captured_work_on_every_launch_and_not_at_capture() {
    let _turn = serial();
    let (dev, sim) = common::device(true);
    let (d, o) = (dev.driver().as_ref(), dev.ordinal());
    let (a, b) = (d.mem_alloc(o, N).unwrap(), d.mem_alloc(o, N).unwrap());
    let s = dev.create_stream().unwrap();
    memset(d, a, 0, N, s.raw()).unwrap();
    memset(d, b, 0, N, s.raw()).unwrap();
    s.synchronize().unwrap();

    s.begin_capture(CaptureMode::Global).unwrap();
    assert_eq!(s.capture_status().unwrap(), CaptureStatus::Active);
    memset(d, a, 0x5A, N, s.raw()).unwrap();
    dtod(d, b, a, N, s.raw()).unwrap();
    memset(d, a, 0x11, N / 2, s.raw()).unwrap();
    let graph = s.end_capture().unwrap();
    assert_eq!(s.capture_status().unwrap(), CaptureStatus::None);
    assert_eq!(
        read(d, a, N, &s),
        vec![0; N],
        "captured work ran at capture"
    );
    assert_eq!(
        read(d, b, N, &s),
        vec![0; N],
        "captured work ran at capture"
    );

    let exec = graph.instantiate().unwrap();
    drop(graph);
    let mut want_a = vec![0x11u8; N / 2];
    want_a.resize(N, 0x5A);
    for round in 0..3u8 {
        memset(d, a, round, N, s.raw()).unwrap();
        memset(d, b, round, N, s.raw()).unwrap();
        exec.launch(&s).unwrap();
        assert_eq!(read(d, a, N, &s), want_a, "launch {round}");
        assert_eq!(read(d, b, N, &s), vec![0x5A; N], "launch {round}");
    }
    drop(exec);
    // SAFETY: `a` and `b` are this test's allocations, freed once, after the work on them has run.
    unsafe {
        d.mem_free(o, a).unwrap();
        d.mem_free(o, b).unwrap();
    }
    assert_no_violation(&sim);
}

/// What the forbidden calls of one case act on, made before the capture on
/// a fresh simulated device.
struct Fixture {
    dev: Device,
    other: Stream,
    /// A `cuMemAlloc` allocation.
    plain: DevicePtr,
    /// Pinned host memory.
    host: DevicePtr,
    /// Physical memory not mapped anywhere.
    phys: gpumem::driver::RawPhys,
    /// A reserved range with nothing mapped, two granules.
    free_va: DevicePtr,
    /// A mapped granule.
    mapped: DevicePtr,
    gran: usize,
    /// An event recorded on `other`, complete.
    done: Event,
    /// A pool allocation made before the capture.
    pool_ptr: DevicePtr,
    /// A pool the case may destroy.
    pool: gpumem::driver::RawPool,
}

impl Fixture {
    fn new() -> (Fixture, Arc<SimDriver>) {
        let (dev, sim) = Device::sim_with_driver(SimConfig::backed(64 << 20));
        let (d, o) = (dev.driver().clone(), dev.ordinal());
        let gran = d.vmm_granularity(o, false).unwrap();
        let other = dev.create_stream().unwrap();
        let phys = d.vmm_create(o, gran, HandleType::None.into()).unwrap();
        let mapped_phys = d.vmm_create(o, gran, HandleType::None.into()).unwrap();
        let mapped = d.vmm_reserve(gran, gran).unwrap();
        // SAFETY: fresh physical memory mapped into a fresh reservation, both this fixture's.
        unsafe { d.vmm_map(mapped, gran, 0, mapped_phys) }.unwrap();
        // SAFETY: the mapping just made.
        unsafe { d.vmm_set_access(mapped, gran, o, AccessFlags::ReadWrite) }.unwrap();
        let done = Event::new(&dev).unwrap();
        done.record(&other).unwrap();
        done.synchronize().unwrap();
        // SAFETY: `other` is a live stream of the device.
        let pool_ptr = unsafe { d.mem_alloc_async(4096, other.raw()) }.unwrap();
        other.synchronize().unwrap();
        let fixture = Fixture {
            plain: d.mem_alloc(o, 4096).unwrap(),
            host: d
                .mem_alloc_host(o, 4096, HostAllocFlags::default())
                .unwrap(),
            phys,
            free_va: d.vmm_reserve(2 * gran, gran).unwrap(),
            mapped,
            gran,
            done,
            pool_ptr,
            pool: d.mempool_create(&PoolProps::device(o)).unwrap(),
            other,
            dev,
        };
        sim.clear_capture_violations();
        (fixture, sim)
    }

    fn d(&self) -> &dyn Driver {
        self.dev.driver().as_ref()
    }
}

/// One forbidden call: its CUDA name, the `CUresult` it must fail with, and
/// how to make it while `s` captures.
type Case = (
    &'static str,
    i32,
    fn(&Fixture, &Stream) -> gpumem::Result<()>,
);

const FORBIDDEN: &[Case] = &[
    ("cuMemAlloc", UNSUPPORTED, |f, _| {
        f.d().mem_alloc(0, 4096).map(drop)
    }),
    // SAFETY: `f.plain` is the fixture's allocation (each case gets a fresh fixture), freed at most once.
    ("cuMemFree", UNSUPPORTED, |f, _| unsafe {
        f.d().mem_free(0, f.plain)
    }),
    ("cuMemAllocManaged", UNSUPPORTED, |f, _| {
        f.d().mem_alloc_managed(0, 4096).map(drop)
    }),
    ("cuMemHostAlloc", UNSUPPORTED, |f, _| {
        f.d()
            .mem_alloc_host(0, 4096, HostAllocFlags::default())
            .map(drop)
    }),
    ("cuMemFreeHost", UNSUPPORTED, |f, _| {
        // SAFETY: `f.host` is the fixture's allocation, freed at most once.
        unsafe { f.d().mem_free_host(f.host) }
    }),
    ("cuMemPoolTrimTo", UNSUPPORTED, |f, _| {
        // SAFETY: `f.pool` is the fixture's pool, live.
        unsafe { f.d().mempool_trim_to(f.pool, 0) }
    }),
    ("cuMemPoolDestroy", UNSUPPORTED, |f, _| {
        // SAFETY: `f.pool` is the fixture's pool, destroyed at most once.
        unsafe { f.d().mempool_destroy(f.pool) }
    }),
    ("cuEventQuery", UNSUPPORTED, |f, _| {
        f.done.is_complete().map(drop)
    }),
    ("cuEventSynchronize", UNSUPPORTED, |f, _| {
        f.done.synchronize()
    }),
    ("cuStreamQuery", UNSUPPORTED, |f, _| {
        f.other.is_idle().map(drop)
    }),
    ("cuStreamSynchronize", UNSUPPORTED, |f, _| {
        f.other.synchronize()
    }),
    ("cuStreamSynchronize", UNSUPPORTED, |_, s| s.synchronize()),
    ("cuStreamQuery", UNSUPPORTED, |_, s| s.is_idle().map(drop)),
    ("cuEventQuery", CAPTURED_EVENT, |f, s| {
        let e = Event::new(&f.dev)?;
        e.record(s)?;
        // Relaxed mode does not help: the event belongs to the capture.
        let _relaxed = RelaxedCapture::new(&f.dev)?;
        e.is_complete().map(drop)
    }),
    ("cuEventSynchronize", CAPTURED_EVENT, |f, s| {
        let e = Event::new(&f.dev)?;
        e.record(s)?;
        let _relaxed = RelaxedCapture::new(&f.dev)?;
        e.synchronize()
    }),
    ("cuCtxSynchronize", UNSUPPORTED, |f, _| {
        let _relaxed = RelaxedCapture::new(&f.dev)?;
        f.dev.synchronize()
    }),
    ("cuStreamWaitEvent", ISOLATION, |f, s| s.wait_event(&f.done)),
];

/// Calls a Global capture lets through, as on an H100 with driver 580
/// (`examples/capture_rules.rs`): the virtual memory calls, a copy of
/// pageable host memory on the capturing stream, and a refused
/// `cuMemFreeAsync`, which fails on its own without breaking the capture.
type Call = fn(&Fixture, &Stream) -> gpumem::Result<()>;

const ALLOWED: &[(&str, Call)] = &[
    ("cuMemCreate", |f, _| {
        let p = f.d().vmm_create(0, f.gran, HandleType::None.into())?;
        // SAFETY: `p` was just made, released once.
        unsafe { f.d().vmm_release(p) }
    }),
    // SAFETY: `f.phys` is the fixture's, released at most once.
    ("cuMemRelease", |f, _| unsafe { f.d().vmm_release(f.phys) }),
    ("cuMemMap", |f, _| {
        // SAFETY: the fixture's physical memory, mapped into its reservation
        // (both unused) and unmapped again.
        unsafe {
            f.d().vmm_map(f.free_va, f.gran, 0, f.phys)?;
            f.d()
                .vmm_set_access(f.free_va, f.gran, 0, AccessFlags::ReadWrite)?;
            f.d().vmm_unmap(f.free_va, f.gran)
        }
    }),
    // SAFETY: `f.mapped` is the fixture's mapping, unused, unmapped at most once.
    ("cuMemUnmap", |f, _| unsafe {
        f.d().vmm_unmap(f.mapped, f.gran)
    }),
    ("cuMemSetAccess", |f, _| {
        // SAFETY: `f.mapped` is the fixture's mapping.
        unsafe { f.d().vmm_set_access(f.mapped, f.gran, 0, AccessFlags::Read) }
    }),
    ("cuMemAddressReserve", |f, _| {
        let va = f.d().vmm_reserve(f.gran, f.gran)?;
        // SAFETY: `va` was just reserved, freed once.
        unsafe { f.d().vmm_free_address(va, f.gran) }
    }),
    ("cuMemAddressFree", |f, _| {
        // SAFETY: `f.free_va` is the fixture's reservation, nothing mapped, freed at most once.
        unsafe { f.d().vmm_free_address(f.free_va, 2 * f.gran) }
    }),
    ("cuMemcpyHtoDAsync", |f, s| {
        static DATA: [u8; 16] = [1; 16];
        // SAFETY: `DATA` lives as long as the graph that copies from it.
        unsafe { f.d().memcpy_htod_async(f.plain, DATA.as_ptr(), 16, s.raw()) }
    }),
    ("cuMemFreeAsync", |f, s| {
        // SAFETY: `f.pool_ptr` is the fixture's pool allocation and `s` a live stream (the free is refused during the capture).
        let e = unsafe { f.d().mem_free_async(f.pool_ptr, s.raw()) }.unwrap_err();
        assert_eq!(code(&e), INVALID_VALUE, "{e}");
        Ok(())
    }),
];

#[test]
fn vmm_calls_and_pageable_copies_leave_a_global_capture_valid() {
    let _turn = serial();
    for &(call, make) in ALLOWED {
        let (f, _sim) = Fixture::new();
        let s = f.dev.create_stream().unwrap();
        s.begin_capture(CaptureMode::Global).unwrap();
        make(&f, &s).unwrap_or_else(|e| panic!("{call}: {e}"));
        assert_eq!(s.capture_status().unwrap(), CaptureStatus::Active, "{call}");
        s.end_capture().unwrap_or_else(|e| panic!("{call}: {e}"));
    }
}

#[test]
fn forbidden_calls_fail_invalidate_the_capture_and_are_reported() {
    let _turn = serial();
    for &(call, want, make) in FORBIDDEN {
        let (f, sim) = Fixture::new();
        let s = f.dev.create_stream().unwrap();
        s.begin_capture(CaptureMode::Global).unwrap();
        let id = s.capture_info().unwrap().id;
        let e = make(&f, &s).expect_err(call);
        assert_eq!(code(&e), want, "{call}: {e}");
        assert!(e.is_capture_error(), "{call}: {e:?}");
        assert_eq!(
            s.capture_status().unwrap(),
            CaptureStatus::Invalidated,
            "{call}"
        );
        // Later work on the stream is refused too, and ending fails.
        let later = memset(f.d(), f.plain, 0, 16, s.raw()).unwrap_err();
        assert_eq!(code(&later), INVALIDATED, "{call}");
        let end = s.end_capture().unwrap_err();
        assert_eq!(code(&end), INVALIDATED, "{call}: {end}");
        assert_eq!(s.capture_status().unwrap(), CaptureStatus::None, "{call}");
        let v = sim.capture_violations();
        assert_eq!(v.len(), 2, "{call}: {v:?}");
        assert_eq!(v[0].call, call, "{v:?}");
        assert_eq!(v[0].invalidated, vec![id], "{call}: {v:?}");
        assert_eq!(
            (v[1].call, v[1].error.as_str()),
            ("cuMemsetD8Async", "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED")
        );
        assert_eq!(sim.active_captures(), 0);
    }
}

#[test]
fn relaxed_mode_permits_allocation_during_a_global_capture() {
    let _turn = serial();
    let (dev, sim) = common::device(false);
    let (d, o) = (dev.driver().as_ref(), dev.ordinal());
    let s = dev.create_stream().unwrap();
    s.begin_capture(CaptureMode::Global).unwrap();
    let p = {
        let relaxed = RelaxedCapture::new(&dev).unwrap();
        assert_eq!(relaxed.previous(), CaptureMode::Global);
        let p = d.mem_alloc(o, N).unwrap();
        memset(d, p, 3, N, s.raw()).unwrap();
        p
    };
    assert_eq!(s.capture_status().unwrap(), CaptureStatus::Active);
    assert_no_violation(&sim);
    // The guard restored Global mode: the same call is refused now.
    let e = d.mem_alloc(o, N).unwrap_err();
    assert!(e.is_capture_error(), "{e:?}");
    assert!(s.end_capture().unwrap_err().is_capture_error());
    // SAFETY: `p` is this test's allocation, freed once; the capture that used it is over.
    unsafe { d.mem_free(o, p) }.unwrap();
}

#[test]
fn a_global_capture_binds_other_threads_unless_they_opt_out() {
    let _turn = serial();
    let (dev, _sim) = common::device(false);
    let (d, o) = (dev.driver().clone(), dev.ordinal());
    let s = dev.create_stream().unwrap();
    let from_another_thread = |mode: Option<CaptureMode>| {
        let d = d.clone();
        std::thread::spawn(move || {
            if let Some(m) = mode {
                d.thread_exchange_capture_mode(m).unwrap();
            }
            let r = d.mem_alloc(o, 4096);
            if let Ok(p) = r {
                // SAFETY: `p` was just allocated, freed once.
                unsafe { d.mem_free(o, p) }.unwrap();
            }
            r.map(drop)
        })
        .join()
        .unwrap()
    };

    // A thread-local capture does not bind other threads.
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    from_another_thread(None).unwrap();
    assert_eq!(s.capture_status().unwrap(), CaptureStatus::Active);
    s.end_capture().unwrap();

    // A global one does, unless the other thread is thread-local or relaxed.
    s.begin_capture(CaptureMode::Global).unwrap();
    from_another_thread(Some(CaptureMode::ThreadLocal)).unwrap();
    from_another_thread(Some(CaptureMode::Relaxed)).unwrap();
    assert_eq!(s.capture_status().unwrap(), CaptureStatus::Active);
    let e = from_another_thread(None).unwrap_err();
    assert_eq!(code(&e), UNSUPPORTED, "{e}");
    assert_eq!(s.capture_status().unwrap(), CaptureStatus::Invalidated);
    assert_eq!(code(&s.end_capture().unwrap_err()), INVALIDATED);
}

#[test]
fn a_joined_stream_is_captured_and_must_rejoin() {
    let _turn = serial();
    let (dev, sim) = common::device(true);
    let (d, o) = (dev.driver().as_ref(), dev.ordinal());
    let (a, b) = (d.mem_alloc(o, N).unwrap(), d.mem_alloc(o, N).unwrap());
    let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let (fork, join) = (Event::new(&dev).unwrap(), Event::new(&dev).unwrap());
    memset(d, a, 0, N, s1.raw()).unwrap();
    memset(d, b, 0, N, s1.raw()).unwrap();
    s1.synchronize().unwrap();

    s1.begin_capture(CaptureMode::Global).unwrap();
    fork.record(&s1).unwrap();
    s2.wait_event(&fork).unwrap();
    let (i1, i2) = (s1.capture_info().unwrap(), s2.capture_info().unwrap());
    assert_eq!(
        i2.status,
        CaptureStatus::Active,
        "waiting on a captured event joins"
    );
    assert_eq!(i1.id, i2.id);
    memset(d, a, 0x21, N, s1.raw()).unwrap();
    memset(d, b, 0x42, N, s2.raw()).unwrap();
    join.record(&s2).unwrap();
    s1.wait_event(&join).unwrap();
    let exec = s1.end_capture().unwrap().instantiate().unwrap();
    assert_eq!(s2.capture_status().unwrap(), CaptureStatus::None);
    assert_eq!(
        read(d, b, N, &s2),
        vec![0; N],
        "the joined stream's work ran at capture"
    );
    exec.launch(&s1).unwrap();
    assert_eq!(read(d, a, N, &s1), vec![0x21; N]);
    assert_eq!(read(d, b, N, &s1), vec![0x42; N]);
    drop(exec);
    assert_no_violation(&sim);

    // Without the join back, ending fails and takes both out of capture.
    s1.begin_capture(CaptureMode::Global).unwrap();
    fork.record(&s1).unwrap();
    s2.wait_event(&fork).unwrap();
    memset(d, b, 0x43, N, s2.raw()).unwrap();
    assert_eq!(code(&s1.end_capture().unwrap_err()), UNJOINED);
    assert_eq!(s1.capture_status().unwrap(), CaptureStatus::None);
    assert_eq!(s2.capture_status().unwrap(), CaptureStatus::None);

    // Only the origin can end the capture. (Whether the refusal also
    // invalidates the capture, CUDA does not say; the simulator does not.)
    s1.begin_capture(CaptureMode::Global).unwrap();
    fork.record(&s1).unwrap();
    s2.wait_event(&fork).unwrap();
    assert_eq!(code(&s2.end_capture().unwrap_err()), UNMATCHED);
    let end = s1.end_capture();
    if sim.is_some() {
        end.unwrap();
    }
    // SAFETY: `a` and `b` are this test's allocations, freed once, after the work on them has run.
    unsafe {
        d.mem_free(o, a).unwrap();
        d.mem_free(o, b).unwrap();
    }
}

/// What finding whether captured work on one stream comes after work on
/// another reads: each stream's dependency set (its last captured work, plus
/// what its waits joined) and each node's own dependencies.
#[test]
fn capture_dependencies_name_each_stream_s_last_work_and_lead_to_its_ancestors() {
    let _turn = serial();
    let (dev, sim) = common::device(false);
    let (d, o) = (dev.driver().as_ref(), dev.ordinal());
    let a = d.mem_alloc(o, N).unwrap();
    let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
    let (fork, join) = (Event::new(&dev).unwrap(), Event::new(&dev).unwrap());
    let deps = |s: &Stream| {
        let (info, mut nodes) = s.capture_dependencies().unwrap();
        nodes.sort_unstable();
        (info.status, nodes)
    };
    let parents = |n: u64| {
        // SAFETY: `n` is a node the driver named for the capture under way on `s1`.
        let mut p = unsafe { d.graph_node_dependencies(n) }.unwrap();
        p.sort_unstable();
        p
    };
    let sorted = |mut v: Vec<u64>| {
        v.sort_unstable();
        v
    };
    assert_eq!(deps(&s1), (CaptureStatus::None, vec![]));

    s1.begin_capture(CaptureMode::Global).unwrap();
    assert_eq!(deps(&s1), (CaptureStatus::Active, vec![]), "nothing yet");
    memset(d, a, 1, N, s1.raw()).unwrap();
    let (_, first) = deps(&s1);
    assert_eq!(first.len(), 1);
    let n1 = first[0];
    assert_eq!(parents(n1), vec![]);
    fork.record(&s1).unwrap();
    s2.wait_event(&fork).unwrap();
    assert_eq!(
        deps(&s2),
        (CaptureStatus::Active, vec![n1]),
        "forked after n1"
    );
    memset(d, a, 2, N, s2.raw()).unwrap();
    let n2 = deps(&s2).1[0];
    memset(d, a, 3, N, s1.raw()).unwrap();
    let n3 = deps(&s1).1[0];
    assert_eq!((parents(n2), parents(n3)), (vec![n1], vec![n1]));
    join.record(&s2).unwrap();
    s1.wait_event(&join).unwrap();
    assert_eq!(
        deps(&s1).1,
        sorted(vec![n2, n3]),
        "the join adds s2's last work"
    );
    memset(d, a, 4, N, s1.raw()).unwrap();
    let n4 = deps(&s1).1[0];
    assert_eq!(parents(n4), sorted(vec![n2, n3]));
    if sim.is_some() {
        assert!(
            // SAFETY: not a node, on purpose, on the simulator only, which refuses a handle it does not hold.
            unsafe { d.graph_node_dependencies(n4 + (1 << 40)) }.is_err(),
            "no such node"
        );
    }
    let graph = s1.end_capture().unwrap();
    assert_eq!(deps(&s1), (CaptureStatus::None, vec![]));
    drop(graph);
    assert_no_violation(&sim);
    // SAFETY: `a` is this test's allocation, freed once; the graph that used it is gone.
    unsafe { d.mem_free(o, a) }.unwrap();
}

#[test]
fn only_the_thread_that_began_a_capture_ends_it_unless_relaxed() {
    let _turn = serial();
    let (dev, sim) = common::device(false);
    let s = dev.create_stream().unwrap();
    let end_elsewhere = |s: &Stream| {
        let s = s.clone();
        std::thread::spawn(move || s.end_capture().map(drop))
            .join()
            .unwrap()
    };
    s.begin_capture(CaptureMode::Global).unwrap();
    assert_eq!(code(&end_elsewhere(&s).unwrap_err()), WRONG_THREAD);
    // The capture goes on in the simulator; CUDA does not say.
    let end = s.end_capture();
    if sim.is_some() {
        end.unwrap();
    }
    s.begin_capture(CaptureMode::Relaxed).unwrap();
    end_elsewhere(&s).unwrap();
    assert_eq!(s.capture_status().unwrap(), CaptureStatus::None);
}

#[test]
fn graphs_executables_and_streams_drop_in_any_order_and_leak_nothing() {
    let _turn = serial();
    let (dev, sim) = common::device(true);
    let (d, o) = (dev.driver().clone(), dev.ordinal());
    let used_before = bytes_used_by_default_pool(d.as_ref(), o);
    for order in 0..3 {
        let s = dev.create_stream().unwrap();
        s.begin_capture(CaptureMode::Global).unwrap();
        // SAFETY: `s` is a live stream.
        let scratch = unsafe { d.mem_alloc_async(N, s.raw()) }.unwrap();
        memset(d.as_ref(), scratch, 9, N, s.raw()).unwrap();
        // SAFETY: `scratch` was just allocated on `s`, freed once.
        unsafe { d.mem_free_async(scratch, s.raw()) }.unwrap();
        let graph = s.end_capture().unwrap();
        let exec = graph.instantiate().unwrap();
        exec.launch(&s).unwrap();
        match order {
            0 => {
                drop(s);
                drop(graph);
                drop(exec);
            }
            1 => {
                drop(exec);
                drop(s);
                drop(graph);
            }
            _ => {
                drop(graph);
                drop(exec);
                drop(s);
            }
        }
        dev.synchronize().unwrap();
        if let Some(sim) = &sim {
            assert_eq!(sim.live_graphs(), 0, "order {order}");
            assert_eq!(sim.live_graph_execs(), 0, "order {order}");
            assert_eq!(sim.live_streams(), 0, "order {order}");
            assert_eq!(sim.active_captures(), 0, "order {order}");
            assert_eq!(
                bytes_used_by_default_pool(d.as_ref(), o),
                used_before,
                "order {order}"
            );
        }
    }
    assert_no_violation(&sim);
}

#[test]
fn graph_allocations_keep_their_address_and_go_back_with_the_graph() {
    let _turn = serial();
    let (dev, sim) = common::device(true);
    let Some(sim) = common::sim_only(sim, "graph_allocations_keep_their_address") else {
        return;
    };
    let (d, o) = (dev.driver().as_ref(), dev.ordinal());
    let s = dev.create_stream().unwrap();

    // An allocation the graph does not free is the caller's after each launch.
    s.begin_capture(CaptureMode::Global).unwrap();
    // SAFETY: `s` is a live stream.
    let out = unsafe { d.mem_alloc_async(N, s.raw()) }.unwrap();
    memset(d, out, 7, N, s.raw()).unwrap();
    let exec = s.end_capture().unwrap().instantiate().unwrap();
    exec.launch(&s).unwrap();
    assert_eq!(read(d, out, N, &s), vec![7; N]);
    let e = exec.launch(&s).unwrap_err();
    assert_eq!(
        code(&e),
        INVALID_VALUE,
        "relaunch before the output was freed: {e}"
    );
    // SAFETY: `out`, the graph's allocation, is the caller's after each launch, and freed once per launch; `s` is live.
    unsafe { d.mem_free_async(out, s.raw()) }.unwrap();
    exec.launch(&s).unwrap();
    assert_eq!(
        read(d, out, N, &s),
        vec![7; N],
        "same address on every launch"
    );
    // SAFETY: as above.
    unsafe { d.mem_free_async(out, s.raw()) }.unwrap();
    assert_eq!(
        // SAFETY: a second free, on purpose, on the simulator only, which refuses it.
        code(&unsafe { d.mem_free_async(out, s.raw()) }.unwrap_err()),
        INVALID_VALUE
    );
    drop(exec);
    assert_eq!(bytes_used_by_default_pool(d, o), 0);

    // Scratch memory the graph frees itself is never the caller's.
    s.begin_capture(CaptureMode::Global).unwrap();
    // SAFETY: `s` is a live stream.
    let scratch = unsafe { d.mem_alloc_async(N, s.raw()) }.unwrap();
    // SAFETY: `scratch` was just allocated on `s`, freed once.
    unsafe { d.mem_free_async(scratch, s.raw()) }.unwrap();
    let graph = s.end_capture().unwrap();
    let exec = graph.instantiate().unwrap();
    // One executable at a time for a graph with allocations.
    assert!(graph.instantiate().is_err());
    exec.launch(&s).unwrap();
    exec.launch(&s).unwrap();
    assert_eq!(
        // SAFETY: the graph's own scratch, never the caller's: refused, on the simulator only.
        code(&unsafe { d.mem_free_async(scratch, s.raw()) }.unwrap_err()),
        INVALID_VALUE
    );
    assert!(
        bytes_used_by_default_pool(d, o) > 0,
        "the graph holds its scratch"
    );
    drop((graph, exec));
    assert_eq!(bytes_used_by_default_pool(d, o), 0);
    assert!(sim.capture_violations().is_empty());
}

#[test]
fn the_legacy_stream_is_refused_while_a_blocking_stream_captures() {
    let _turn = serial();
    let (dev, sim) = common::device(false);
    let Some(sim) = common::sim_only(sim, "the_legacy_stream_is_refused") else {
        return;
    };
    let d = dev.driver().as_ref();
    let blocking = d.stream_create(0, false).unwrap();
    let legacy = dev.default_stream();
    let p = d.mem_alloc(0, 4096).unwrap();

    // A non-blocking stream's capture leaves the legacy stream alone.
    let s = dev.create_stream().unwrap();
    s.begin_capture(CaptureMode::Global).unwrap();
    memset(d, p, 1, 4096, legacy.raw()).unwrap();
    s.end_capture().unwrap();

    // SAFETY: `blocking` is this test's stream, live.
    unsafe { d.stream_begin_capture(blocking, CaptureMode::Global) }.unwrap();
    let e = memset(d, p, 1, 4096, legacy.raw()).unwrap_err();
    assert_eq!(code(&e), IMPLICIT, "{e}");
    assert_eq!(
        // SAFETY: as above.
        code(&unsafe { d.stream_end_capture(blocking) }.unwrap_err()),
        INVALIDATED
    );
    assert_eq!(
        code(&legacy.begin_capture(CaptureMode::Global).unwrap_err()),
        UNSUPPORTED
    );
    assert_eq!(sim.capture_violations().len(), 2);
    // SAFETY: `blocking` and `p` are this test's, destroyed and freed once;
    // no work on them is pending.
    unsafe {
        d.stream_destroy(blocking).unwrap();
        d.mem_free(0, p).unwrap();
    }
}
