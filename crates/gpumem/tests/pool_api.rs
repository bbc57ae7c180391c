//! The `Pool` trait, the same for every pool: the reserve and its peak,
//! resetting the peak, trimming down to a target without waiting, releasing
//! everything not live; and adaptors and smart pointers answering for the
//! pool they wrap.

mod common;

use std::sync::Arc;

use gpumem::adaptor::{LimitingAdaptor, StatisticsAdaptor};
use gpumem::async_pool::AsyncResource;
use gpumem::driver::sim::SimConfig;
use gpumem::graph_pool::GraphPool;
use gpumem::manager::{PinnedPool, PinnedPoolConfig};
use gpumem::pool::{
    ArenaConfig, ArenaResource, BinningConfig, BinningResource, CachingPool, FixedSizeConfig,
    FixedSizeResource, Pool, PoolConfig, PoolResource, SegmentPool, VirtualPool,
};
use gpumem::resource::{DeviceResource, MemoryResource, PinnedHostResource};
use gpumem::{Backend, Device};

const MIB: usize = 1 << 20;

/// Three blocks of this size land in three separate upstream pieces in every
/// pool below (regions, chunks, extents), so a trim can give back some.
const BLOCK: usize = 12 * MIB;

/// The pools that cache what they take, each built fresh on `device`.
fn caching_pools(device: &Device) -> Vec<(&'static str, Box<dyn Pool>)> {
    let up = || DeviceResource::new(device.clone());
    let mut pinned = PinnedPoolConfig::default();
    pinned.growth = MIB;
    vec![
        (
            "PoolResource",
            Box::new(PoolResource::with_defaults(up()).unwrap()),
        ),
        (
            "CachingPool",
            Box::new(CachingPool::with_defaults(up()).unwrap()),
        ),
        (
            "FixedSizeResource",
            Box::new(
                FixedSizeResource::new(up(), FixedSizeConfig::with_block_size(BLOCK)).unwrap(),
            ),
        ),
        (
            "BinningResource",
            Box::new(BinningResource::new(up(), BinningConfig::fixed_bins(8, 24)).unwrap()),
        ),
        (
            "VirtualPool",
            Box::new(VirtualPool::with_defaults(device.clone()).unwrap()),
        ),
        (
            "PinnedPool",
            Box::new(PinnedPool::new(PinnedHostResource::new(device.clone()), pinned).unwrap()),
        ),
        (
            "AsyncResource",
            Box::new(AsyncResource::with_defaults(device.clone()).unwrap()),
        ),
    ]
}

#[test]
fn every_pool_reports_its_peak_trims_to_a_target_and_releases() {
    let (device, _) = common::device(false);
    for (name, pool) in caching_pools(&device) {
        let s = device.create_stream().unwrap();
        let start = pool.reserved_bytes();
        let blocks: Vec<_> = (0..3)
            .map(|_| pool.allocate(BLOCK, 256, &s).unwrap())
            .collect();
        let grown = pool.reserved_bytes();
        assert!(grown >= start + 3 * BLOCK, "{name}: {start} -> {grown}");
        assert!(pool.peak_reserved_bytes() >= grown, "{name}: peak follows");
        for p in blocks {
            pool.deallocate(p, BLOCK, 256, &s).unwrap();
        }
        s.synchronize().unwrap();
        let before = pool.reserved_bytes();
        assert!(before >= 3 * BLOCK, "{name}: freed memory stays cached");

        pool.reset_peak();
        assert_eq!(pool.peak_reserved_bytes(), before, "{name}: peak reset");
        assert_eq!(
            pool.trim(before).unwrap(),
            0,
            "{name}: already at the target"
        );

        // CUDA's cuMemPoolTrimTo keeps at least its target; the others, and
        // the simulated driver, give back until at most the target is held.
        let exact_target = name != "AsyncResource" || device.backend() == Backend::Sim;
        let to = before - 1;
        let back = pool.trim(to).unwrap();
        let after = pool.reserved_bytes();
        assert_eq!(back, before - after, "{name}: trim says what it gave back");
        if exact_target {
            assert!(back > 0 && after <= to, "{name}: {before} -> {after}");
            assert!(
                after >= 2 * BLOCK,
                "{name}: only what the target asked: {after}"
            );
        }
        assert_eq!(pool.peak_reserved_bytes(), before, "{name}: the peak stays");
        pool.reset_peak();
        assert_eq!(
            pool.peak_reserved_bytes(),
            after,
            "{name}: peak reset again"
        );

        assert_eq!(pool.release().unwrap(), after, "{name}: release");
        assert_eq!(
            pool.reserved_bytes(),
            0,
            "{name}: nothing live, nothing held"
        );
        pool.reset_peak();
        assert_eq!(pool.peak_reserved_bytes(), 0, "{name}");
    }
}

#[test]
fn the_arena_holds_its_region_for_life() {
    let (device, _) = common::device(false);
    let mut config = ArenaConfig::default();
    config.max_reserved = Some(64 * MIB);
    let arena = ArenaResource::new(DeviceResource::new(device.clone()), config).unwrap();
    let s = device.create_stream().unwrap();
    let p = arena.allocate(BLOCK, 256, &s).unwrap();
    arena.deallocate(p, BLOCK, 256, &s).unwrap();
    assert_eq!(arena.reserved_bytes(), 64 * MIB);
    assert_eq!(arena.peak_reserved_bytes(), 64 * MIB);
    assert_eq!(arena.trim(0).unwrap(), 0);
    assert_eq!(arena.release().unwrap(), 0);
    arena.reset_peak();
    assert_eq!(arena.reserved_bytes(), 64 * MIB);
    assert_eq!(arena.peak_reserved_bytes(), 64 * MIB);
}

#[test]
fn wrappers_answer_for_the_pool_they_wrap() {
    let (device, _) = common::device(false);
    let pool = Arc::new(PoolResource::with_defaults(DeviceResource::new(device.clone())).unwrap());
    let stack = StatisticsAdaptor::new(LimitingAdaptor::new(pool.clone(), usize::MAX));
    let s = device.create_stream().unwrap();
    let p = stack.allocate(BLOCK, 256, &s).unwrap();
    stack.deallocate(p, BLOCK, 256, &s).unwrap();
    let as_pool: &dyn Pool = &stack;
    assert_eq!(as_pool.reserved_bytes(), pool.reserved_bytes());
    assert_eq!(as_pool.peak_reserved_bytes(), BLOCK);
    let shared: Arc<dyn Pool> = pool.clone();
    let boxed: Box<dyn Pool> = Box::new(shared.clone());
    assert_eq!(boxed.release().unwrap(), BLOCK);
    assert_eq!(shared.reserved_bytes(), 0);
    assert_eq!(Pool::reserved_bytes(&stack), 0);
    // The stack is still a resource: a trait object of one upcasts.
    let resource: Arc<dyn MemoryResource> = shared;
    assert!(resource.is_equal(&*pool));
}

#[test]
fn every_pool_is_made_with_defaults_the_same_way() {
    let (device, _) = common::device(false);
    let up = || DeviceResource::new(device.clone());
    let pools: Vec<Box<dyn Pool>> = vec![
        Box::new(PoolResource::with_defaults(up()).unwrap()),
        Box::new(CachingPool::with_defaults(up()).unwrap()),
        Box::new(FixedSizeResource::with_defaults(up()).unwrap()),
        Box::new(BinningResource::with_defaults(up()).unwrap()),
        Box::new(ArenaResource::with_defaults(up()).unwrap()),
        Box::new(VirtualPool::with_defaults(device.clone()).unwrap()),
        Box::new(AsyncResource::with_defaults(device.clone()).unwrap()),
        Box::new(PinnedPool::with_defaults(PinnedHostResource::new(device.clone())).unwrap()),
    ];
    let s = device.create_stream().unwrap();
    for pool in pools {
        let p = pool.allocate(MIB, 256, &s).unwrap();
        pool.deallocate(p, MIB, 256, &s).unwrap();
        pool.release().unwrap();
    }
}

/// Sizes in a configuration that no allocation can have are errors, never
/// an overflow: an initial size is out of memory, as a request of that size
/// is; a region size that cannot be rounded is an invalid argument.
#[test]
fn absurd_sizes_in_a_configuration_are_errors() {
    let (device, _) = common::device(false);
    let up = || DeviceResource::new(device.clone());
    for initial in [usize::MAX, usize::MAX - 100] {
        let mut c = PoolConfig::default();
        c.initial_size = initial;
        let Err(e) = PoolResource::new(up(), c) else {
            panic!("pool initial_size {initial:#x} accepted")
        };
        assert!(e.is_oom(), "pool initial_size {initial:#x}: {e}");
        let mut c = PinnedPoolConfig::default();
        c.initial_size = initial;
        let Err(e) = PinnedPool::new(PinnedHostResource::new(device.clone()), c) else {
            panic!("pinned initial_size {initial:#x} accepted")
        };
        assert!(e.is_oom(), "pinned initial_size {initial:#x}: {e}");
    }
    let mut c = PoolConfig::default();
    c.growth.small_region = usize::MAX;
    let Err(e) = PoolResource::new(up(), c) else {
        panic!("small_region usize::MAX accepted")
    };
    assert!(e.to_string().contains("small region"), "{e}");

    // A pinned growth step too large to pin: the pool pins what requests need.
    let mut c = PinnedPoolConfig::default();
    c.growth = usize::MAX;
    let pinned = PinnedPool::new(PinnedHostResource::new(device.clone()), c).unwrap();
    let p = pinned.allocate_sync(1000, 256).unwrap();
    assert_eq!(pinned.stats().reserved, 1024);
    pinned.deallocate_sync(p, 1000, 256).unwrap();

    let mm = gpumem::manager::MemoryManager::new(device.clone());
    mm.set_device_pool_size(usize::MAX).unwrap();
    assert!(mm.allocate_device(16).unwrap_err().is_oom());
    mm.set_pinned_pool_size(usize::MAX).unwrap();
    assert!(mm.allocate_pinned(16).unwrap_err().is_oom());
}

/// The calls a release waits with: stream and device synchronizations and
/// event waits.
const WAITS: [&str; 3] = [
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
];

/// Blocks that cover a VirtualPool's group of 64 pages (128 MiB).
const SPACERS: usize = 11;

/// A release whose waits all fail still gives back what is known done
/// without a wait (memory freed on a stream a query finds idle), keeps what
/// a stream's pending work may still use, and returns the error; once the
/// waits work, a release gives back the rest. Nothing is lost or freed
/// twice: the driver ends with every byte back.
#[test]
fn a_release_whose_waits_fail_gives_back_what_is_known_done() {
    let (device, sim) = Device::sim_with_driver(SimConfig::default());
    let base = sim.device_bytes(0);
    let mut pools = caching_pools(&device);
    pools.push((
        "SegmentPool",
        Box::new(SegmentPool::new(DeviceResource::new(device.clone())).unwrap()),
    ));
    pools.push(("GraphPool", Box::new(GraphPool::new(&device).unwrap())));
    for (name, pool) in pools {
        let (busy, idle) = (
            device.create_stream().unwrap(),
            device.create_stream().unwrap(),
        );
        sim.hold(busy.raw());
        let a = pool.allocate(BLOCK, 256, &busy).unwrap();
        // Live blocks between the two, so that in a VirtualPool they lie in
        // different groups of 64 pages (it records frees per group).
        let spacers: Vec<_> = (0..SPACERS)
            .map(|_| pool.allocate(BLOCK, 256, &idle).unwrap())
            .collect();
        let b = pool.allocate(BLOCK, 256, &idle).unwrap();
        common::model::enqueue_work(&busy); // a kernel still using `a`
        pool.deallocate(a, BLOCK, 256, &busy).unwrap();
        pool.deallocate(b, BLOCK, 256, &idle).unwrap();
        let before = pool.reserved_bytes();
        for call in WAITS {
            for nth in 1..=64 {
                sim.fail_call(call, nth, 999);
            }
        }
        let failed = pool.release();
        assert!(failed.is_err(), "{name}: the failed wait is reported");
        let kept = pool.reserved_bytes();
        assert!(
            kept >= (SPACERS + 1) * BLOCK,
            "{name}: the busy stream's memory stays, and the live blocks': {kept}"
        );
        assert!(
            kept <= before - BLOCK,
            "{name}: the idle stream's goes back: {kept} of {before}"
        );
        sim.clear_faults();
        sim.release(busy.raw());
        for p in spacers {
            pool.deallocate(p, BLOCK, 256, &idle).unwrap();
        }
        assert_eq!(
            pool.release().unwrap(),
            kept,
            "{name}: the rest goes once the waits work"
        );
        assert_eq!(pool.reserved_bytes(), 0, "{name}");
    }
    assert_eq!(sim.device_bytes(0), base, "every byte back");
    assert_eq!(sim.pinned_host_bytes(), 0, "every pinned byte back");
}
