//! The MemoryManager, PinnedPool and PlannedPool on the simulated device (the
//! suite test also runs on the GPU with GPUMEM_DEVICE=cuda).

mod common;

use std::sync::Arc;

use common::suite;
use gpumem::driver::sim::SimConfig;
use gpumem::manager::{
    DeviceAllocatorMode, MemoryManager, PinnedPool, PinnedPoolConfig, PlanPhase,
};
use gpumem::resource::{MemoryResource, PinnedHostResource, Properties};
use gpumem::{Device, DevicePtr, Error, FreeError};

fn backed() -> (Device, Arc<gpumem::driver::sim::SimDriver>) {
    Device::sim_with_driver(SimConfig::backed(256 << 20))
}

#[test]
fn pinned_pool_passes_the_suite() {
    let (device, _) = common::device(true);
    let pool =
        PinnedPool::new(PinnedHostResource::new(device), PinnedPoolConfig::default()).unwrap();
    assert_eq!(pool.properties(), Properties::HOST_AND_DEVICE);
    // PinnedPool frees by address whatever the size: back to `run_all` (the
    // bad-free matrix) once it refuses wrong sizes.
    suite::run_all(Arc::new(pool));
}

#[test]
fn fixed_pinned_pool_passes_the_suite() {
    let (device, _) = common::device(true);
    let pool = PinnedPool::new(
        PinnedHostResource::new(device),
        PinnedPoolConfig::fixed(64 << 20),
    )
    .unwrap();
    suite::run_all(Arc::new(pool));
}

#[test]
fn a_freed_pinned_block_is_not_reused_while_its_copy_is_pending() {
    let (device, sim) = backed();
    let pool = PinnedPool::new(
        PinnedHostResource::new(device.clone()),
        PinnedPoolConfig::default(),
    )
    .unwrap();
    let stream = device.create_stream().unwrap();
    let dev = device.driver().mem_alloc(0, 1 << 20).unwrap();
    let a = pool.allocate_sync(1 << 20, 256).unwrap();

    sim.hold(stream.raw());
    pool.copy_to_device_async(dev, a, 1 << 20, &stream).unwrap();
    pool.deallocate_sync(a, 1 << 20, 256).unwrap();
    let s = pool.stats();
    assert_eq!(s.pending_blocks, 1, "the block waits for its copy: {s:?}");
    assert_eq!(s.events_recorded, 1, "one event for the batch, at the free");

    // Same size again: must not be `a` while the copy is pending.
    let b = pool.allocate_sync(1 << 20, 256).unwrap();
    assert_ne!(a, b, "pinned block reused while its copy was pending");
    assert_eq!(pool.process_pending().unwrap(), 0, "still pending");

    sim.release(stream.raw());
    assert_eq!(pool.process_pending().unwrap(), 1);
    let c = pool.allocate_sync(1 << 20, 256).unwrap();
    assert_eq!(c, a, "reused once the copy completed");
    for p in [b, c] {
        pool.deallocate_sync(p, 1 << 20, 256).unwrap();
    }
    // SAFETY: `dev` is this test's allocation, freed once; the copies that used it have run.
    unsafe { device.driver().mem_free(0, dev) }.unwrap();
}

#[test]
fn copies_are_batched_one_event_per_batch_not_per_free() {
    let (device, sim) = backed();
    let pool = PinnedPool::new(
        PinnedHostResource::new(device.clone()),
        PinnedPoolConfig::default(),
    )
    .unwrap();
    let stream = device.create_stream().unwrap();
    let dev = device.driver().mem_alloc(0, 4096).unwrap();
    sim.hold(stream.raw());
    let blocks: Vec<_> = (0..10)
        .map(|_| pool.allocate_sync(4096, 256).unwrap())
        .collect();
    for &b in &blocks {
        pool.copy_to_device_async(dev, b, 4096, &stream).unwrap();
    }
    for &b in &blocks {
        pool.deallocate_sync(b, 4096, 256).unwrap();
    }
    let s = pool.stats();
    assert_eq!(s.copies, 10);
    assert_eq!(
        s.events_recorded, 1,
        "ten frees of one batch: one event ({s:?})"
    );
    assert_eq!(s.pending_blocks, 10);
    sim.release(stream.raw());
    assert_eq!(pool.process_pending().unwrap(), 10);
    assert_eq!(pool.stats().pending_blocks, 0);
    // SAFETY: `dev` is this test's allocation, freed once; the copies that used it have run.
    unsafe { device.driver().mem_free(0, dev) }.unwrap();
}

#[test]
fn a_full_pinned_pool_waits_for_pending_copies_instead_of_failing() {
    let (device, sim) = backed();
    let pool = PinnedPool::new(
        PinnedHostResource::new(device.clone()),
        PinnedPoolConfig::fixed(1 << 20),
    )
    .unwrap();
    let stream = device.create_stream().unwrap();
    let dev = device.driver().mem_alloc(0, 1 << 20).unwrap();
    let a = pool.allocate_sync(1 << 20, 256).unwrap();
    sim.hold(stream.raw());
    pool.copy_to_device_async(dev, a, 1 << 20, &stream).unwrap();
    pool.deallocate_sync(a, 1 << 20, 256).unwrap();
    assert!(sim.pending_ops(stream.raw()) > 0);
    let b = pool.allocate_sync(1 << 20, 256).unwrap();
    assert_eq!(a, b);
    assert_eq!(sim.pending_ops(stream.raw()), 0, "it waited for the copy");
    // Now it is full and nothing is pending: out of memory, with numbers.
    let e = pool.allocate_sync(256, 256).unwrap_err();
    assert_eq!(e.oom_info().unwrap().limit, Some(1 << 20));
    pool.deallocate_sync(b, 1 << 20, 256).unwrap();
    // SAFETY: `dev` is this test's allocation, freed once; the copies that used it have run.
    unsafe { device.driver().mem_free(0, dev) }.unwrap();
}

#[test]
fn pinned_data_round_trips_and_bad_ranges_are_errors() {
    let (device, _) = backed();
    let pool = PinnedPool::new(
        PinnedHostResource::new(device.clone()),
        PinnedPoolConfig::default(),
    )
    .unwrap();
    let stream = device.create_stream().unwrap();
    let dev = device.driver().mem_alloc(0, 4096).unwrap();
    let a = pool.allocate_sync(4096, 256).unwrap();
    let b = pool.allocate_sync(4096, 256).unwrap();
    let data = common::random_bytes(4096, 7);
    // SAFETY: no copies pending on `a`; the slice is dropped before any.
    unsafe { pool.host_slice_mut(a, 4096).unwrap() }.copy_from_slice(&data);
    pool.copy_to_device_async(dev, a, 4096, &stream).unwrap();
    pool.copy_to_host_async(b, dev, 4096, &stream).unwrap();
    stream.synchronize().unwrap();
    // SAFETY: the stream is synchronized; nothing else references `b`.
    assert_eq!(unsafe { pool.host_slice_mut(b, 4096).unwrap() }, &data[..]);

    // Out of range, foreign pointers, double frees: errors, not panics.
    assert!(matches!(
        pool.copy_to_device_async(dev, a.offset(4000), 200, &stream),
        Err(Error::InvalidArgument(_))
    ));
    assert!(pool
        .copy_to_host_async(DevicePtr(0x1000), dev, 16, &stream)
        .is_err());
    pool.deallocate_sync(a, 4096, 256).unwrap();
    assert!(matches!(
        pool.deallocate_sync(a, 4096, 256),
        Err(Error::InvalidFree { .. })
    ));
    pool.deallocate_sync(b, 4096, 256).unwrap();
    // SAFETY: `dev` is this test's allocation, freed once; the copies that used it have run.
    unsafe { device.driver().mem_free(0, dev) }.unwrap();
}

#[test]
fn a_double_free_is_reported_as_one() {
    let (device, sim) = backed();
    let pool = PinnedPool::new(
        PinnedHostResource::new(device.clone()),
        PinnedPoolConfig::default(),
    )
    .unwrap();
    let reason = |r: gpumem::Result<()>| match r {
        Err(Error::InvalidFree { reason, .. }) => reason,
        other => panic!("{other:?}"),
    };
    // Freed at once (no copies), then freed again.
    let a = pool.allocate_sync(4096, 256).unwrap();
    let b = pool.allocate_sync(4096, 256).unwrap();
    pool.deallocate_sync(a, 4096, 256).unwrap();
    assert_eq!(
        reason(pool.deallocate_sync(a, 4096, 256)),
        FreeError::DoubleFree
    );
    // Freed while its copy is queued (pending), then freed again.
    let stream = device.create_stream().unwrap();
    let dev = device.driver().mem_alloc(0, 4096).unwrap();
    let c = pool.allocate_sync(4096, 256).unwrap();
    sim.hold(stream.raw());
    pool.copy_to_device_async(dev, c, 4096, &stream).unwrap();
    pool.deallocate_sync(c, 4096, 256).unwrap();
    assert_eq!(
        reason(pool.deallocate_sync(c, 4096, 256)),
        FreeError::DoubleFree
    );
    // Never handed out: inside a block, or not the pool's at all.
    assert_eq!(
        reason(pool.deallocate_sync(b.offset(256), 256, 256)),
        FreeError::Unknown
    );
    assert_eq!(
        reason(pool.deallocate_sync(DevicePtr(0x1000), 1, 256)),
        FreeError::Unknown
    );
    sim.release(stream.raw());
    // SAFETY: `dev` is this test's allocation, freed once; the copies that used it have run.
    unsafe { device.driver().mem_free(0, dev) }.unwrap();
}

#[test]
fn allocator_api2_vec_lives_in_pinned_memory() {
    let (device, sim) = backed();
    let pool = PinnedPool::new(
        PinnedHostResource::new(device.clone()),
        PinnedPoolConfig::default(),
    )
    .unwrap();
    let before = sim.pinned_host_bytes();
    {
        let mut v: allocator_api2::vec::Vec<u64, &PinnedPool> =
            allocator_api2::vec::Vec::new_in(&pool);
        v.extend(0..100_000u64);
        assert_eq!(v.iter().sum::<u64>(), 99_999 * 100_000 / 2);
        let s = pool.stats();
        assert_eq!(s.live_blocks, 1, "{s:?}");
        assert!(s.live >= 100_000 * 8);
        assert!(sim.pinned_host_bytes() > before, "memory is pinned");
        assert_eq!(v.as_ptr() as usize % 256, 0);

        // A device-to-host copy into memory a collection owns is refused.
        let stream = device.create_stream().unwrap();
        let dev = device.driver().mem_alloc(0, 64).unwrap();
        let e = pool
            .copy_to_host_async(DevicePtr(v.as_ptr() as u64), dev, 64, &stream)
            .unwrap_err();
        assert!(e.to_string().contains("collection"), "{e}");
        // Host-to-device from it is fine.
        pool.copy_to_device_async(dev, DevicePtr(v.as_ptr() as u64), 64, &stream)
            .unwrap();
        stream.synchronize().unwrap();
        // SAFETY: `dev` is this test's allocation, freed once; the copies that used it have run.
        unsafe { device.driver().mem_free(0, dev) }.unwrap();
    }
    let s = pool.stats();
    assert_eq!((s.live_blocks, s.live), (0, 0), "{s:?}");
}

#[test]
fn cuda_pool_mode_falls_back_to_pool_without_driver_pools() {
    let mut config = SimConfig::default();
    config.memory_pools = false;
    let device = Device::sim(config);
    let mm = MemoryManager::new(device);
    assert!(!mm.supports_async_device_allocator());
    mm.set_device_allocator_mode(DeviceAllocatorMode::CudaAsyncPool)
        .unwrap();
    assert_eq!(
        mm.requested_device_allocator_mode(),
        DeviceAllocatorMode::CudaAsyncPool
    );
    assert_eq!(
        mm.effective_device_allocator_mode(),
        DeviceAllocatorMode::Pool
    );
    let why = mm.device_allocator_mode_reason().unwrap();
    assert!(why.contains("no stream-ordered memory pools"), "{why}");
    let p = mm.allocate_device(1 << 20).unwrap();
    assert_eq!(
        mm.effective_device_allocator_mode(),
        DeviceAllocatorMode::Pool
    );
    mm.free_device(p).unwrap();
    // gpumem's stream-ordered mode needs no driver pools: no fallback.
    let mut config = SimConfig::default();
    config.memory_pools = false;
    let mm = MemoryManager::new(Device::sim(config));
    mm.set_device_allocator_mode(DeviceAllocatorMode::AsyncStreamOrdered)
        .unwrap();
    assert_eq!(
        mm.effective_device_allocator_mode(),
        DeviceAllocatorMode::AsyncStreamOrdered
    );
    assert!(mm.device_allocator_mode_reason().is_none());
}

#[test]
fn every_mode_round_trips_data() {
    for mode in [
        DeviceAllocatorMode::Pool,
        DeviceAllocatorMode::AsyncStreamOrdered,
        DeviceAllocatorMode::CudaAsyncPool,
    ] {
        let (device, sim) = backed();
        let mm = MemoryManager::new(device.clone());
        assert!(mm.supports_async_device_allocator());
        mm.set_device_allocator_mode(mode).unwrap();
        assert_eq!(mm.effective_device_allocator_mode(), mode);
        let stream = device.create_stream().unwrap();
        let n = 64 << 10;
        let h1 = mm.allocate_pinned(n).unwrap();
        let h2 = mm.allocate_pinned(n).unwrap();
        let d = mm.allocate_device_async(n, &stream).unwrap();
        let d2 = mm.allocate_device(n).unwrap();
        let data = common::random_bytes(n, mode as u64);
        let pool = mm.pinned_pool().unwrap();
        // SAFETY: nothing pending on h1; the slice is dropped at once.
        unsafe { pool.host_slice_mut(h1, n).unwrap() }.copy_from_slice(&data);
        mm.copy_to_device_async(d, h1, n, &stream).unwrap();
        mm.free_pinned(h1).unwrap();
        mm.copy_to_host_async(h2, d, n, &stream).unwrap();
        stream.synchronize().unwrap();
        // SAFETY: synchronized; nothing else references h2.
        assert_eq!(
            unsafe { pool.host_slice_mut(h2, n).unwrap() },
            &data[..],
            "{mode}"
        );
        // Copies must stay inside the manager's allocations.
        assert!(mm
            .copy_to_device_async(d.offset(n - 128), h2, 256, &stream)
            .is_err());
        assert!(mm
            .copy_to_host_async(h2, DevicePtr(0xdead_0000), 256, &stream)
            .is_err());
        mm.free_device_async(d, &stream).unwrap();
        mm.free_device(d2).unwrap();
        assert!(matches!(mm.free_device(d2), Err(Error::InvalidFree { .. })));
        mm.free_pinned(h2).unwrap();
        let r = mm.shutdown().unwrap();
        assert!(r.outstanding_device.is_empty() && r.outstanding_pinned.is_empty());
        device.synchronize().unwrap();
        assert_eq!(sim.device_bytes(0), 0, "{mode}: device memory returned");
        assert_eq!(sim.pinned_host_bytes(), 0, "{mode}: pinned memory returned");
    }
}

#[test]
fn sizes_and_mode_cannot_change_after_first_use() {
    let (device, _) = backed();
    let mm = MemoryManager::new(device);
    mm.set_pinned_pool_size(4 << 20).unwrap();
    mm.set_device_pool_size(8 << 20).unwrap();
    mm.set_pinned_pool_size(2 << 20).unwrap(); // still allowed
    let h = mm.allocate_pinned(1024).unwrap();
    let e = mm.set_pinned_pool_size(8 << 20).unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("pinned"),
        "{e}"
    );
    // The device side is still open.
    mm.set_device_allocator_mode(DeviceAllocatorMode::AsyncStreamOrdered)
        .unwrap();
    let d = mm.allocate_device(1024).unwrap();
    assert_eq!(mm.device_reserved_bytes(), 8 << 20);
    assert!(matches!(
        mm.set_device_pool_size(1 << 20),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        mm.set_device_allocator_mode(DeviceAllocatorMode::Pool),
        Err(Error::InvalidArgument(_))
    ));
    // The fixed sizes hold: more than the pinned pool's size is out of memory.
    assert!(mm.allocate_pinned(3 << 20).unwrap_err().is_oom());
    assert!(mm.allocate_device(9 << 20).unwrap_err().is_oom());
    mm.free_pinned(h).unwrap();
    mm.free_device(d).unwrap();
}

#[test]
fn shutdown_returns_everything_and_reports_outstanding() {
    let (device, sim) = backed();
    let mm = MemoryManager::new(device.clone());
    let stream = device.create_stream().unwrap();
    let h = mm.allocate_pinned(1 << 20).unwrap();
    let d = mm.allocate_device(3000).unwrap();
    let kept = mm.allocate_pinned(5000).unwrap();
    mm.free_pinned(h).unwrap();
    sim.hold(stream.raw());
    let h2 = mm.allocate_pinned(4096).unwrap();
    mm.copy_to_device_async(d, h2, 3000, &stream).unwrap();
    assert!(sim.device_bytes(0) > 0 && sim.pinned_host_bytes() > 0);

    // Live pinned memory: refused, naming it, and nothing changes.
    let e = mm.shutdown().unwrap_err();
    let Error::InUse(live) = &e else {
        panic!("{e}")
    };
    assert_eq!((live.count, live.bytes), (2, 9096), "{e}");
    assert!(live.first.contains(&(h2.0, 4096)), "{e}");
    assert!(!mm.is_shut_down() && sim.pending_ops(stream.raw()) > 0);
    mm.free_pinned(kept).unwrap();
    mm.free_pinned(h2).unwrap();

    let r = mm.shutdown().unwrap();
    assert_eq!(
        sim.pending_ops(stream.raw()),
        0,
        "shutdown waited for copies"
    );
    assert_eq!(r.outstanding_device, vec![(d, 3000)]);
    assert!(r.outstanding_pinned.is_empty(), "{r:?}");
    assert!(r.released_pinned_bytes >= 1 << 20 && r.released_device_bytes > 0);
    assert!(r.to_string().contains("outstanding"));
    device.synchronize().unwrap();
    assert_eq!(sim.device_bytes(0), 0, "device pool released");
    assert_eq!(sim.pinned_host_bytes(), 0, "pinned pool released");

    assert!(mm.is_shut_down());
    assert_eq!(mm.allocate_pinned(1), Err(Error::ShutDown("MemoryManager")));
    assert_eq!(mm.allocate_device(1), Err(Error::ShutDown("MemoryManager")));
    assert!(matches!(
        mm.allocate_device_async(1, &stream),
        Err(Error::ShutDown(_))
    ));
    assert!(mm.set_pinned_pool_size(1).is_err());
    assert!(mm.planned_pool(1, 1).is_err());
    assert_eq!(mm.shutdown().unwrap().outstanding_device, vec![]);
}

#[test]
fn a_plan_over_capacity_states_desired_and_available() {
    let (device, _) = backed();
    let mm = MemoryManager::new(device);
    let mut plan = mm.planned_pool(1024, 4096).unwrap();
    plan.want_host(600).unwrap();
    plan.want_host(300).unwrap(); // 768 + 512 = 1280 > 1024 laid out
    plan.want_device(100).unwrap();
    let e = plan.satisfy().unwrap_err().to_string();
    assert!(
        e.contains("desired 1280") && e.contains("available 1024") && e.contains("host"),
        "{e}"
    );
    assert_eq!(plan.phase(), PlanPhase::Collecting);
    let mut plan = mm.planned_pool(1 << 20, 256).unwrap();
    plan.want_device(257).unwrap();
    let e = plan.satisfy().unwrap_err().to_string();
    assert!(
        e.contains("desired 512") && e.contains("available 256") && e.contains("device"),
        "{e}"
    );
    // Overflowing requests are errors too.
    let mut plan = mm.planned_pool(1 << 20, 1 << 20).unwrap();
    plan.want_host(usize::MAX).unwrap();
    assert!(plan.satisfy().is_err());
}

#[test]
fn a_plan_lays_out_hands_out_disjoint_slices_and_freezes() {
    let (device, sim) = backed();
    let mm = MemoryManager::new(device.clone());
    let stream = device.create_stream().unwrap();
    let mut plan = mm.planned_pool(1 << 20, 1 << 20).unwrap();
    let a = plan.want_host(100).unwrap();
    let b = plan.want_host(1000).unwrap();
    let c = plan.want_host(0).unwrap();
    let da = plan.want_device(1000).unwrap();
    let db = plan.want_device(100).unwrap();
    assert!(plan.host_slice(a).is_err(), "not satisfied yet");
    assert!(plan.commit().is_err(), "commit needs satisfy");
    assert_eq!(plan.required_bytes(), (256 + 1024, 1024 + 256));
    plan.satisfy().unwrap();
    plan.commit().unwrap();
    assert!(plan.want_host(1).is_err() && plan.want_device(1).is_err());
    let pinned_one_alloc = sim.host_allocations();

    {
        let mut s = plan.host_slices().unwrap();
        assert_eq!(
            s.iter().map(|x| x.len()).collect::<Vec<_>>(),
            vec![100, 1000, 0]
        );
        s[0].fill(0xaa);
        s[1].fill(0xbb);
    }
    let hp = [plan.host_ptr(a).unwrap(), plan.host_ptr(b).unwrap()];
    assert_eq!(hp[1].0 - hp[0].0, 256, "256-byte aligned, packed");
    let dp = [plan.device_ptr(da).unwrap(), plan.device_ptr(db).unwrap()];
    assert_eq!(dp[1].0 - dp[0].0, 1024);

    sim.hold(stream.raw());
    plan.copy_to_device_async(b, da, &stream).unwrap();
    plan.copy_to_host_async(da, b, &stream).unwrap();
    assert!(
        plan.copy_to_device_async(b, db, &stream).is_err(),
        "too small"
    );
    // Host access waits for the plan's copies.
    assert!(plan.host_slice(b).unwrap().iter().all(|&x| x == 0xbb));
    assert_eq!(sim.pending_ops(stream.raw()), 0);
    assert_eq!(plan.host_slice(c).unwrap().len(), 0);
    assert_eq!(sim.host_allocations(), pinned_one_alloc);

    // Slots of another plan or an old layout are refused.
    let mut other = mm.planned_pool(1 << 20, 1 << 20).unwrap();
    let o = other.want_host(10).unwrap();
    assert!(plan.host_slice(o).is_err());
    plan.release_all().unwrap();
    assert_eq!(plan.phase(), PlanPhase::Collecting);
    let a2 = plan.want_host(10).unwrap();
    plan.satisfy().unwrap();
    assert!(plan.host_slice(a).is_err(), "stale slot");
    assert_eq!(plan.host_slice(a2).unwrap().len(), 10);
}

#[test]
fn the_global_manager_is_one_instance() {
    let a = MemoryManager::global() as *const MemoryManager;
    let b = MemoryManager::global() as *const MemoryManager;
    assert_eq!(a, b);
    let p = MemoryManager::global().allocate_pinned(1024).unwrap();
    MemoryManager::global().free_pinned(p).unwrap();
}

#[test]
fn the_manager_is_shared_across_threads() {
    let (device, _) = backed();
    let mm = Arc::new(MemoryManager::new(device.clone()));
    mm.set_device_allocator_mode(DeviceAllocatorMode::AsyncStreamOrdered)
        .unwrap();
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let mm = mm.clone();
            let stream = device.create_stream().unwrap();
            std::thread::spawn(move || {
                for k in 0..200 {
                    let n = 256 * (1 + (i * 7 + k) % 64);
                    let h = mm.allocate_pinned(n).unwrap();
                    let d = mm.allocate_device_async(n, &stream).unwrap();
                    mm.copy_to_device_async(d, h, n, &stream).unwrap();
                    mm.free_pinned(h).unwrap();
                    mm.free_device_async(d, &stream).unwrap();
                }
                stream.synchronize().unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let r = mm.shutdown().unwrap();
    assert!(r.outstanding_device.is_empty() && r.outstanding_pinned.is_empty());
}

#[test]
fn the_gpumem_modes_serve_from_gpumem_conf_s_pool_and_say_how_frees_go() {
    // One name, one meaning: the manager's two gpumem modes build the pool
    // `GPUMEM_CONF=resource=pool` names, whose heaps grow one address range
    // in place: blocks freed across what would have been separate regions
    // coalesce, so a request as large as all of them together needs no new
    // memory. Separate regions would hold twice as much here.
    const MIB: usize = 1 << 20;
    for mode in [
        DeviceAllocatorMode::Pool,
        DeviceAllocatorMode::AsyncStreamOrdered,
    ] {
        let mm = MemoryManager::new(Device::sim(SimConfig::default()));
        mm.set_device_allocator_mode(mode).unwrap();
        let blocks: Vec<_> = (0..8)
            .map(|_| mm.allocate_device(50 * MIB).unwrap())
            .collect();
        for p in blocks {
            mm.free_device(p).unwrap();
        }
        let big = mm.allocate_device(400 * MIB).unwrap();
        let reserved = mm.device_reserved_bytes();
        assert!(
            reserved < 480 * MIB,
            "{mode}: {} MiB reserved for 400 MiB live",
            reserved / MIB
        );
        mm.free_device(big).unwrap();
    }
    assert_eq!(
        DeviceAllocatorMode::Pool.to_string(),
        "pool (synchronous frees)"
    );
    assert_eq!(
        DeviceAllocatorMode::AsyncStreamOrdered.to_string(),
        "pool (stream-ordered frees)"
    );
    assert_eq!(DeviceAllocatorMode::CudaAsyncPool.to_string(), "async");
}
