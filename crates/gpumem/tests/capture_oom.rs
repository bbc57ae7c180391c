//! Out of memory while a stream captures a CUDA graph: every pool answers
//! with the out-of-memory error and its numbers, on the capturing stream
//! and on any other, and waits for nothing meanwhile (no stream, event or
//! device synchronization: CUDA refuses them during a capture, and the
//! refusal breaks it). The memory it could have had by waiting sits in
//! blocks freed on a stream whose work is held pending.
//!
//! Simulator-only: the tests hold a stream's work and count the driver's
//! synchronizations. A Global capture binds every thread, so they take
//! turns.

use std::sync::{Arc, Mutex, MutexGuard};

use gpumem::async_pool::AsyncResource;
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::{CaptureMode, CaptureStatus};
use gpumem::graph_pool::GraphPool;
use gpumem::pool::{
    ArenaConfig, ArenaResource, BinningConfig, BinningResource, CachingPool, CachingPoolConfig,
    FixedSizeConfig, FixedSizeResource, PoolResource, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, Event};

const MIB: usize = 1 << 20;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The synchronizations the driver has been asked for so far.
fn syncs(sim: &SimDriver) -> u64 {
    [
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "cuCtxSynchronize",
    ]
    .iter()
    .map(|c| sim.call_count(c))
    .sum()
}

/// How one pool is driven out of memory: blocks of `cached_s` and
/// `cached_t` bytes freed before the capture on the capturing stream and on
/// the held one (0: none), then a request of `ask` bytes that only waiting
/// for the held stream could serve.
struct Case {
    name: &'static str,
    make: fn(&Device) -> Box<dyn MemoryResource>,
    cached_s: usize,
    cached_t: usize,
    ask: usize,
}

fn device_resource(d: &Device) -> DeviceResource {
    DeviceResource::new(d.clone())
}

const CASES: [Case; 8] = [
    Case {
        name: "PoolResource",
        make: |d| Box::new(PoolResource::with_defaults(device_resource(d)).unwrap()),
        cached_s: MIB,
        cached_t: MIB,
        ask: 4 * MIB,
    },
    Case {
        name: "ArenaResource",
        make: |d| {
            let config = ArenaConfig::with_size(64 * MIB);
            Box::new(ArenaResource::new(device_resource(d), config).unwrap())
        },
        cached_s: MIB,
        cached_t: 32 * MIB,
        ask: 48 * MIB,
    },
    Case {
        name: "FixedSizeResource",
        make: |d| {
            let mut config = FixedSizeConfig::with_block_size(MIB);
            config.blocks_per_chunk = Some(1);
            Box::new(FixedSizeResource::new(device_resource(d), config).unwrap())
        },
        cached_s: 0,
        cached_t: MIB,
        ask: MIB,
    },
    Case {
        name: "BinningResource",
        make: |d| {
            let config = BinningConfig::fixed_bins(8, 20);
            Box::new(BinningResource::new(device_resource(d), config).unwrap())
        },
        cached_s: 0,
        cached_t: MIB,
        ask: MIB,
    },
    Case {
        name: "CachingPool",
        make: |d| {
            let config = CachingPoolConfig::default();
            Box::new(CachingPool::new(device_resource(d), config).unwrap())
        },
        cached_s: 0,
        cached_t: MIB,
        ask: MIB,
    },
    Case {
        name: "VirtualPool",
        make: |d| Box::new(VirtualPool::new(d.clone(), VirtualPoolConfig::default()).unwrap()),
        cached_s: MIB,
        cached_t: 32 * MIB,
        ask: 64 * MIB,
    },
    Case {
        name: "AsyncResource",
        make: |d| Box::new(AsyncResource::with_defaults(d.clone()).unwrap()),
        cached_s: MIB,
        cached_t: 32 * MIB,
        ask: 64 * MIB,
    },
    Case {
        name: "GraphPool",
        make: |d| Box::new(GraphPool::new(d).unwrap()),
        cached_s: MIB,
        cached_t: MIB,
        ask: 4 * MIB,
    },
];

fn sim() -> (Device, Arc<SimDriver>) {
    let mut config = SimConfig::default();
    config.capacity = 1 << 30;
    Device::sim_with_driver(config)
}

#[test]
fn out_of_memory_during_a_capture_is_out_of_memory_and_waits_for_nothing() {
    let _turn = serial();
    for c in CASES {
        let (device, sim) = sim();
        let d = device.driver();
        let (name, mr) = (c.name, &*(c.make)(&device));
        let [s, t, u] = [(); 3].map(|()| device.create_stream().unwrap());
        if c.cached_s > 0 {
            let p = mr.allocate(c.cached_s, 256, &s).unwrap();
            mr.deallocate(p, c.cached_s, 256, &s).unwrap();
        }
        // Work pending on `t` from here on: its frees are not known done.
        sim.hold(t.raw());
        Event::new(&device).unwrap().record(&t).unwrap();
        assert!(sim.pending_ops(t.raw()) > 0);
        let p = mr.allocate(c.cached_t, 256, &t).unwrap();
        mr.deallocate(p, c.cached_t, 256, &t).unwrap();
        // Nothing is left on the device: more memory means waiting for `t`.
        let free = device.mem_info().unwrap().free;
        let hog = d.mem_alloc(device.ordinal(), free).unwrap();
        sim.clear_capture_violations();
        let before = syncs(&sim);

        s.begin_capture(CaptureMode::Global).unwrap();
        let e = mr.allocate(c.ask, 256, &s).unwrap_err();
        assert_oom(&e, c.ask, name, "the capturing stream");
        // Another stream may take the held stream's blocks after an event
        // wait (no synchronization); else it is out of memory as well.
        match mr.allocate(c.ask, 256, &u) {
            Ok(p) => mr.deallocate(p, c.ask, 256, &u).unwrap(),
            Err(e) => assert_oom(&e, c.ask, name, "another stream"),
        }
        assert_eq!(
            syncs(&sim),
            before,
            "{name}: synchronized during the capture"
        );
        assert_eq!(s.capture_status().unwrap(), CaptureStatus::Active, "{name}");
        let v = sim.capture_violations();
        assert!(v.is_empty(), "{name}: {v:?}");
        s.end_capture().unwrap();

        // SAFETY: `hog` is this case's allocation, freed once; no work uses it.
        unsafe { d.mem_free(device.ordinal(), hog) }.unwrap();
        sim.release(t.raw());
        for stream in [&s, &t, &u] {
            stream.synchronize().unwrap();
        }
    }
}

/// `e` must be out of memory for `ask` bytes, with the pool's numbers.
fn assert_oom(e: &gpumem::Error, ask: usize, name: &str, on: &str) {
    assert!(e.is_oom(), "{name}, on {on}: {e:?}");
    let info = e.oom_info().unwrap();
    assert_eq!(info.requested, ask, "{name}, on {on}: {info:?}");
    assert!(
        info.reserved.is_some() && info.live.is_some(),
        "{name}, on {on}: {info:?}"
    );
}
