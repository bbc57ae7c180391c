//! The adaptors on a device (the simulated one by default, the GPU with
//! GPUMEM_DEVICE=cuda): each through the shared resource suite, composed
//! stacks, prefetch of managed memory, the per-device registry, the exit flag
//! and a process that exits with a resource in a `static`.

mod common;

#[allow(dead_code)]
#[path = "../examples/static_pool_exit.rs"]
mod static_pool_exit;

use std::process::Command;
use std::sync::Arc;

use common::suite;
use gpumem::adaptor::*;
use gpumem::driver::sim::SimConfig;
use gpumem::registry::Registry;
use gpumem::resource::{
    DeviceResource, ManagedResource, MemoryResource, Properties, SharedResource,
};
use gpumem::{Backend, Device, DevicePtr, Error, Result, Stream};

fn device_resource() -> (DeviceResource, Option<Arc<gpumem::driver::sim::SimDriver>>) {
    let (device, sim) = common::device(false);
    (DeviceResource::new(device), sim)
}

#[test]
fn limiting_passes_the_suite() {
    let (up, _) = device_resource();
    let mr = Arc::new(LimitingAdaptor::new(up, 1 << 40));
    suite::run_all(mr.clone());
    assert_eq!(mr.allocated_bytes(), 0);
}

#[test]
fn statistics_passes_the_suite_and_balances() {
    let (up, _) = device_resource();
    let mr = Arc::new(StatisticsAdaptor::new(up));
    suite::run_all(mr.clone());
    let s = mr.stats();
    assert_eq!(s.allocated_bytes.current, 0);
    assert_eq!(s.active.current, 0);
    assert_eq!(s.num_allocs(), s.num_frees());
    assert!(s.num_allocs() > 1000);
    assert_eq!(s.num_ooms, 1, "the suite's 1 PiB request");
    assert!(s.allocated_bytes.peak > 0);
}

#[test]
fn tracking_passes_the_suite_and_ends_with_nothing_outstanding() {
    let (up, _) = device_resource();
    let mr = Arc::new(TrackingAdaptor::new(up));
    suite::run_all(mr.clone());
    assert_eq!(mr.outstanding_count(), 0, "{}", mr.leak_report());
    assert_eq!(mr.outstanding_bytes(), 0);
}

#[test]
fn logging_passes_the_suite() {
    let (up, _) = device_resource();
    let path = std::env::temp_dir().join(format!("gpumem-suite-log-{}.csv", std::process::id()));
    let mr = Arc::new(LoggingAdaptor::new(up, &path).unwrap());
    suite::run_all(mr.clone());
    mr.flush().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(LOG_HEADER));
    let (mut allocs, mut frees, mut failures) = (0, 0, 0);
    for l in lines {
        match l.split(',').nth(2) {
            Some("allocate") => allocs += 1,
            Some("free") => frees += 1,
            Some("allocate failure") => failures += 1,
            other => panic!("unexpected action {other:?} in {l:?}"),
        }
    }
    // Every call is logged, the bad frees of the suite's bad-free matrix
    // (refused upstream) too: each allocation has its free, and no more
    // frees than the matrix's refused ones.
    let report = gpumem::trace::check(&gpumem::trace::parse_str(&text).unwrap()).unwrap();
    assert_eq!(report.leaked, 0, "{report:?}");
    assert!(allocs <= frees && frees <= allocs + common::bad_free::CASES.len() + 2);
    assert_eq!(failures, 1);
    drop(mr);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn aligned_passes_the_suite_and_aligns_large_requests() {
    let (up, _) = device_resource();
    let mr = Arc::new(AlignedAdaptor::with_threshold(up, 1 << 16, 1 << 20).unwrap());
    suite::run_all(mr.clone());
    assert_eq!(mr.over_aligned_count(), 0);
    let s = mr.device().create_stream().unwrap();
    let mut ptrs = Vec::new();
    for _ in 0..8 {
        let p = mr.allocate(1 << 20, 256, &s).unwrap();
        assert_eq!(p.0 % (1 << 16), 0);
        ptrs.push(p);
    }
    let q = mr.allocate(3000, 1 << 13, &s).unwrap();
    assert_eq!(q.0 % (1 << 13), 0);
    for p in ptrs {
        mr.deallocate(p, 1 << 20, 256, &s).unwrap();
    }
    mr.deallocate(q, 3000, 1 << 13, &s).unwrap();
}

/// Over a pool, which takes frees at its granule's precision: an
/// over-aligned block freed with another size or a small alignment is
/// refused by the adaptor's table, never taken by the pool behind it.
#[test]
fn aligned_refuses_an_over_aligned_block_freed_as_another_size() {
    let (device, _) = common::device(false);
    let pool = gpumem::pool::PoolResource::with_defaults(DeviceResource::new(device)).unwrap();
    let mr = AlignedAdaptor::new(&pool, 4096).unwrap();
    let s = mr.device().create_stream().unwrap();
    let a = mr.allocate(1000, 4096, &s).unwrap();
    let padded = 1000 + 4096 - 256;
    for (bytes, align) in [(padded, 256), (1001, 4096), (999, 8), (1024, 256)] {
        let e = mr.deallocate(a, bytes, align, &s).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidFree {
                    reason: gpumem::FreeError::SizeMismatch {
                        allocated: 1000,
                        ..
                    },
                    ..
                }
            ),
            "free of {bytes} bytes at alignment {align}: {e}"
        );
    }
    assert_eq!(mr.over_aligned_count(), 1);
    // No other allocation is handed the block meanwhile.
    let b = mr.allocate(padded, 256, &s).unwrap();
    assert_ne!(b, a);
    // Its exact size frees it whole, whatever alignment the free names.
    mr.deallocate(a, 1000, 256, &s).unwrap();
    assert_eq!(mr.over_aligned_count(), 0);
    mr.deallocate(b, padded, 256, &s).unwrap();
    assert_eq!(pool.live_bytes(), 0);
}

#[test]
fn failure_callback_passes_the_suite() {
    let (up, _) = device_resource();
    let mr = Arc::new(FailureCallbackAdaptor::new(up, |_, _| false));
    suite::run_all(mr.clone());
    assert_eq!(mr.retries(), 0);
}

/// A `&mut self` resource over the device: what `ThreadSafeAdaptor` is for.
struct Exclusive {
    inner: DeviceResource,
    calls: u64,
}

impl LocalMemoryResource for Exclusive {
    fn allocate(&mut self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        self.calls += 1;
        self.inner.allocate(bytes, alignment, stream)
    }
    fn deallocate(
        &mut self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.calls += 1;
        self.inner.deallocate(ptr, bytes, alignment, stream)
    }
    fn device(&self) -> &Device {
        self.inner.device()
    }
    fn properties(&self) -> Properties {
        self.inner.properties()
    }
}

#[test]
fn thread_safe_passes_the_suite() {
    let (up, _) = device_resource();
    let mr = Arc::new(ThreadSafeAdaptor::new(Exclusive {
        inner: up,
        calls: 0,
    }));
    suite::run_all(mr.clone());
    assert!(mr.lock().calls > 1000);
}

#[test]
fn prefetch_passes_the_suite_and_prefetches_managed_memory() {
    let (device, _) = common::device(true);
    let managed = Arc::new(PrefetchAdaptor::new(ManagedResource::new(device.clone())));
    assert!(managed.prefetches_enabled());
    if device.backend() == Backend::Cuda {
        suite::run_all_but_huge(managed.clone());
    } else {
        suite::run_all(managed.clone());
    }
    assert!(managed.prefetches() > 100);
    assert_eq!(managed.prefetch_failures(), 0);

    let plain = Arc::new(PrefetchAdaptor::new(DeviceResource::new(device)));
    assert!(!plain.prefetches_enabled());
    suite::run_all(plain.clone());
    assert_eq!(plain.prefetches() + plain.prefetch_failures(), 0);
}

#[test]
fn stacked_adaptors_pass_the_suite_and_agree_with_the_device() {
    let (device, sim) = common::device(false);
    let stack = Arc::new(StatisticsAdaptor::new(LimitingAdaptor::new(
        TrackingAdaptor::new(DeviceResource::new(device.clone())),
        1 << 34,
    )));
    suite::run_all(stack.clone());
    assert_eq!(stack.stats().allocated_bytes.current, 0);
    let s = device.create_stream().unwrap();
    let before = sim.as_ref().map(|s| s.device_bytes(0));
    let p = stack.allocate(1 << 20, 256, &s).unwrap();
    let q = stack.allocate(1000, 256, &s).unwrap();
    assert_eq!(stack.stats().allocated_bytes.current, (1 << 20) + 1024);
    assert_eq!(stack.upstream().allocated_bytes(), (1 << 20) + 1024);
    if let (Some(sim), Some(before)) = (&sim, before) {
        assert!(sim.device_bytes(0) >= before + (1 << 20) + 1000);
    }
    // Over the limit: refused at the limiting layer, counted at the top.
    let err = stack.allocate(1 << 34, 256, &s).unwrap_err();
    assert_eq!(err.oom_info().unwrap().limit, Some(1 << 34));
    assert_eq!(
        stack.stats().num_ooms,
        2,
        "the suite's 1 PiB request and this one"
    );
    stack.deallocate(p, 1 << 20, 256, &s).unwrap();
    assert!(matches!(
        stack.deallocate(p, 1 << 20, 256, &s),
        Err(Error::InvalidFree { .. })
    ));
    stack.deallocate(q, 1000, 256, &s).unwrap();
    if let (Some(sim), Some(before)) = (&sim, before) {
        assert_eq!(sim.device_bytes(0), before);
    }
}

// ----- registry -----

fn two_devices() -> Device {
    let mut config = SimConfig::default();
    config.devices = 2;
    Device::sim(config)
}

#[test]
fn registry_starts_with_device_resources_and_set_returns_the_previous() {
    let device = two_devices();
    let reg = Registry::for_device(&device).unwrap();
    assert_eq!(reg.device_count(), 2);
    let initial = reg.device_resource(0).unwrap();
    assert!(
        initial.is_equal(&reg.device_resource(0).unwrap()),
        "created once"
    );
    assert_eq!(initial.device().ordinal(), 0);
    assert_eq!(initial.properties(), Properties::DEVICE);

    let stats: SharedResource =
        Arc::new(StatisticsAdaptor::new(DeviceResource::new(device.clone())));
    let previous = reg.set_device_resource(0, stats.clone()).unwrap();
    assert!(previous.is_equal(&initial));
    assert!(reg.device_resource(0).unwrap().is_equal(&stats));
    // Device 1 is untouched.
    assert_eq!(reg.device_resource(1).unwrap().device().ordinal(), 1);
    assert!(!reg.device_resource(1).unwrap().is_equal(&stats));

    let back = reg.reset_device_resource(0).unwrap();
    assert!(back.is_equal(&stats));
    assert!(!reg.device_resource(0).unwrap().is_equal(&stats));

    // Wrong device or wrong driver: refused, nothing changed.
    let on_one: SharedResource = Arc::new(DeviceResource::new(device.sibling(1).unwrap()));
    assert!(matches!(
        reg.set_device_resource(0, on_one.clone()),
        Err(Error::InvalidArgument(_))
    ));
    let other_driver: SharedResource = Arc::new(DeviceResource::new(two_devices()));
    assert!(matches!(
        reg.set_device_resource(0, other_driver),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        reg.device_resource(2),
        Err(Error::NoSuchDevice {
            device: 2,
            count: 2
        })
    ));
    assert!(reg.set_device_resource(1, on_one).is_ok());
}

#[test]
fn registry_current_device_follows_the_thread() {
    let device = two_devices();
    let reg = Arc::new(Registry::for_device(&device).unwrap());
    let one: SharedResource = Arc::new(DeviceResource::new(device.sibling(1).unwrap()));
    device.driver().set_current_device(1).unwrap();
    let prev = reg.set_current_device_resource(one.clone()).unwrap();
    assert_eq!(prev.device().ordinal(), 1);
    assert!(reg.current_device_resource().unwrap().is_equal(&one));
    device.driver().set_current_device(0).unwrap();
    assert_eq!(reg.current_device_resource().unwrap().device().ordinal(), 0);
    assert!(reg.reset_current_device_resource().is_ok());
    assert!(reg.device_resource(1).unwrap().is_equal(&one));
}

#[test]
fn registry_is_thread_safe() {
    let device = two_devices();
    let reg = Arc::new(Registry::for_device(&device).unwrap());
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let reg = reg.clone();
            let device = device.clone();
            std::thread::spawn(move || {
                let ordinal = t % 2;
                let mine: SharedResource = Arc::new(StatisticsAdaptor::new(DeviceResource::new(
                    device.sibling(ordinal).unwrap(),
                )));
                let s = device.sibling(ordinal).unwrap().default_stream();
                for _ in 0..200 {
                    let r = reg.device_resource(ordinal).unwrap();
                    assert_eq!(r.device().ordinal(), ordinal);
                    let p = r.allocate(4096, 256, &s).unwrap();
                    r.deallocate(p, 4096, 256, &s).unwrap();
                    let prev = reg.set_device_resource(ordinal, mine.clone()).unwrap();
                    assert_eq!(prev.device().ordinal(), ordinal);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn the_cuda_registry_needs_a_driver() {
    match Registry::cuda() {
        Ok(reg) => assert_eq!(reg.driver().backend(), Backend::Cuda),
        Err(e) => assert!(matches!(e, Error::NoDriver { .. }), "{e}"),
    }
    if Registry::cuda().is_err() {
        assert!(gpumem::registry::current_device_resource().is_err());
    }
}

// ----- exit -----

#[test]
fn the_process_is_not_exiting_while_tests_run() {
    assert!(!gpumem::exit::process_is_exiting());
}

const CHILD_ENV: &str = "GPUMEM_STATIC_EXIT_CHILD";

/// Runs the example's body when started as the child of
/// `a_static_resource_survives_process_exit` (a no-op otherwise).
#[test]
fn static_pool_exit_child() {
    if std::env::var_os(CHILD_ENV).is_some() {
        static_pool_exit::run().unwrap();
    }
}

#[test]
fn a_static_resource_survives_process_exit() {
    // The example's body runs in a child process of this very test binary
    // (through `static_pool_exit_child`), so it is always the current code;
    // `cargo test` also builds the example itself.
    let log = std::env::temp_dir().join(format!("gpumem-exit-{}.csv", std::process::id()));
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "static_pool_exit_child",
        "--test-threads=1",
        "-q",
    ])
    .env(CHILD_ENV, "1");
    let out = cmd.env(LOG_FILE_ENV, &log).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit status {:?}; stderr:\n{stderr}",
        out.status
    );
    assert!(stderr.is_empty(), "stderr must be empty:\n{stderr}");
    // The static logging adaptor is never dropped: the exit hook flushed it.
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.first(),
        Some(&LOG_HEADER),
        "the log was not flushed at exit"
    );
    assert_eq!(
        lines.len(),
        1 + 16 + 8,
        "16 allocations and 8 frees reached the file:\n{text}"
    );
    std::fs::remove_file(&log).unwrap();
}
