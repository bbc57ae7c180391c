//! Soundness of host-visible memory: no safe call frees pinned memory under
//! live references, writes memory that safe code can reach, or returns while
//! a copy into or out of caller memory is still queued.
//!
//! CI also runs this file under AddressSanitizer (`.ci/run`), which reports
//! any read or write of freed pinned memory (the simulator's pinned memory is
//! heap memory). Runs on the simulated device (backed); the tests that need
//! the simulator's controls skip themselves with `GPUMEM_DEVICE=cuda`.

mod common;

use std::process::Command;
use std::sync::Arc;

use allocator_api2::vec::Vec as PinnedVec;
use gpumem::driver::sim::SimDriver;
use gpumem::manager::{MemoryManager, PinnedPool, PinnedPoolConfig};
use gpumem::resource::{DeviceResource, MemoryResource, PinnedHostResource};
use gpumem::{Device, DeviceBuffer, DevicePtr, Error, FreeError, LiveAllocations, Stream};

fn pool(device: &Device, config: PinnedPoolConfig) -> PinnedPool {
    PinnedPool::new(PinnedHostResource::new(device.clone()), config).unwrap()
}

fn in_use(e: &Error) -> &LiveAllocations {
    match e {
        Error::InUse(l) => l,
        other => panic!("expected InUse, got {other}"),
    }
}

/// On the simulated device, checks that no pinned memory is left.
fn all_pinned_memory_returned(sim: Option<Arc<SimDriver>>) {
    if let Some(sim) = sim {
        assert_eq!(sim.pinned_host_bytes(), 0, "pinned memory left");
    }
}

fn addr<T>(v: &[T]) -> DevicePtr {
    DevicePtr(v.as_ptr() as u64)
}

/// Device memory for copies, freed on drop.
struct DeviceBlock {
    device: Device,
    ptr: DevicePtr,
}

impl DeviceBlock {
    fn new(device: &Device, bytes: usize) -> Self {
        let ptr = device.driver().mem_alloc(device.ordinal(), bytes).unwrap();
        Self {
            device: device.clone(),
            ptr,
        }
    }
}

impl Drop for DeviceBlock {
    fn drop(&mut self) {
        let _ = self.device.synchronize();
        // SAFETY: the block's own allocation, freed once, by its drop, after the device is synchronized.
        let _ = unsafe {
            self.device
                .driver()
                .mem_free(self.device.ordinal(), self.ptr)
        };
    }
}

// ----- release_all and shutdown under live allocations -----

#[test]
fn release_all_refuses_while_a_collection_lives_and_names_it() {
    let (device, sim) = common::device(true);
    let pool = pool(&device, PinnedPoolConfig::default());
    let mut v: PinnedVec<u8, &PinnedPool> = PinnedVec::with_capacity_in(4000, &pool);
    v.resize(4000, 1);
    let before = pool.stats();

    let e = pool.release_all().unwrap_err();
    let live = in_use(&e);
    assert_eq!((live.what, live.count, live.bytes), ("PinnedPool", 1, 4000));
    assert_eq!(live.first, vec![(addr(&v).0, 4000)]);
    let msg = e.to_string();
    assert!(
        msg.contains("1 live allocation (4000 bytes)")
            && msg.contains(&format!("{:#x}+4000", addr(&v).0))
            && msg.contains("free them first"),
        "{msg}"
    );
    // Nothing changed: the memory is still there and the pool still serves.
    v[0] = 42;
    assert_eq!((v[0], v[3999]), (42, 1));
    assert_eq!(pool.stats(), before);
    let b = pool.allocate_sync(100, 256).unwrap();
    pool.deallocate_sync(b, 100, 256).unwrap();

    drop(v);
    let r = pool.release_all().unwrap();
    assert!(
        r.outstanding.is_empty() && r.released_bytes >= 4000,
        "{r:?}"
    );
    all_pinned_memory_returned(sim);
    assert_eq!(
        pool.allocate_sync(1, 256),
        Err(Error::ShutDown("PinnedPool"))
    );
}

#[test]
fn in_use_lists_the_first_few_and_counts_the_rest() {
    let (device, _) = common::device(true);
    let pool = pool(&device, PinnedPoolConfig::default());
    let blocks: Vec<_> = (1..=6)
        .map(|i| pool.allocate_sync(100 * i, 256).unwrap())
        .collect();
    let e = pool.release_all().unwrap_err();
    let live = in_use(&e);
    assert_eq!((live.count, live.bytes), (6, 2100));
    assert_eq!(live.first.len(), 4);
    assert!(e.to_string().contains("and 2 more"), "{e}");
    for (i, b) in blocks.into_iter().enumerate() {
        pool.deallocate_sync(b, 100 * (i + 1), 256).unwrap();
    }
    pool.release_all().unwrap();
}

#[test]
fn shutdown_refuses_while_a_plan_hands_out_host_slices() {
    let (device, sim) = common::device(true);
    let mm = MemoryManager::new(device);
    let mut plan = mm.planned_pool(1 << 20, 1 << 20).unwrap();
    let a = plan.want_host(1000).unwrap();
    plan.satisfy().unwrap();
    let s = plan.host_slice(a).unwrap();
    s.fill(7);

    let e = mm.shutdown().unwrap_err();
    assert_eq!(in_use(&e).count, 1, "{e}");
    assert!(!mm.is_shut_down(), "a refused shutdown changes nothing");
    s[999] = 9;
    assert_eq!((s[0], s[999]), (7, 9));
    let h = mm.allocate_pinned(64).unwrap();
    let e = mm.shutdown().unwrap_err();
    assert_eq!(in_use(&e).count, 2, "{e}");
    mm.free_pinned(h).unwrap();

    drop(plan);
    let r = mm.shutdown().unwrap();
    assert!(r.outstanding_pinned.is_empty(), "{r:?}");
    assert!(mm.is_shut_down());
    all_pinned_memory_returned(sim);
}

#[test]
fn the_unchecked_release_frees_live_allocations_and_lists_them() {
    let (device, sim) = common::device(true);
    let pool = pool(&device, PinnedPoolConfig::default());
    let raw = pool.allocate_sync(3000, 256).unwrap();
    let mut v: PinnedVec<u64, &PinnedPool> = PinnedVec::with_capacity_in(10, &pool);
    v.push(1);
    let vp = addr(&v);
    std::mem::forget(v);
    // SAFETY: neither allocation is used again; the vector was leaked.
    let mut r = unsafe { pool.release_all_unchecked() }.unwrap();
    r.outstanding.sort();
    let mut expected = vec![(raw, 3000), (vp, 80)];
    expected.sort();
    assert_eq!(r.outstanding, expected);
    all_pinned_memory_returned(sim);
    assert_eq!(
        pool.deallocate_sync(raw, 3000, 256),
        Err(Error::ShutDown("PinnedPool"))
    );

    let (device, sim) = common::device(true);
    let mm = MemoryManager::new(device);
    let h = mm.allocate_pinned(500).unwrap();
    // SAFETY: `h` is not used after the shutdown.
    let r = unsafe { mm.shutdown_unchecked() }.unwrap();
    assert_eq!(r.outstanding_pinned, vec![(h, 500)]);
    assert!(mm.is_shut_down());
    all_pinned_memory_returned(sim);
}

// ----- copies never write memory safe code can reach -----

#[test]
fn safe_copies_never_touch_pinned_memory_safe_code_can_reach() {
    let (device, _) = common::device(true);
    let pool = pool(&device, PinnedPoolConfig::default());
    let stream = device.create_stream().unwrap();
    let dev = DeviceBlock::new(&device, 4096);
    let v: PinnedVec<u8, &PinnedPool> = {
        let mut v = PinnedVec::with_capacity_in(4096, &pool);
        v.resize(4096, 5);
        v
    };
    let raw = pool.allocate_sync(4096, 256).unwrap();
    // SAFETY: no copy is pending on `raw`; the slice is dropped at once.
    unsafe { pool.host_slice_mut(raw, 4096).unwrap() }.fill(0xee);
    let first = &v[0];

    // Host to device with the collection as the destination.
    let e = pool
        .copy_to_device_async(addr(&v), raw, 64, &stream)
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("destination"),
        "{e}"
    );
    // Device to host into the collection, or with pool memory as the source.
    assert!(pool
        .copy_to_host_async(addr(&v), dev.ptr, 64, &stream)
        .is_err());
    let e = pool
        .copy_to_host_async(raw, addr(&v), 64, &stream)
        .unwrap_err();
    assert!(e.to_string().contains("source"), "{e}");
    // Free pool memory is no destination either: it may be handed out
    // before the copy runs.
    let gone = pool.allocate_sync(4096, 256).unwrap();
    pool.deallocate_sync(gone, 4096, 256).unwrap();
    assert!(pool.copy_to_device_async(gone, raw, 64, &stream).is_err());
    stream.synchronize().unwrap();
    assert_eq!(*first, 5, "a safe call wrote behind a live reference");
    assert!(v.iter().all(|&x| x == 5));

    // Device memory is still a fine destination.
    pool.copy_to_device_async(dev.ptr, addr(&v), 4096, &stream)
        .unwrap();
    stream.synchronize().unwrap();
    pool.deallocate_sync(raw, 4096, 256).unwrap();
}

#[test]
fn a_plans_host_slices_are_no_safe_copy_destination() {
    let (device, _) = common::device(true);
    let mm = MemoryManager::new(device.clone());
    let stream = device.create_stream().unwrap();
    let d = mm.allocate_device(256).unwrap();
    let mut plan = mm.planned_pool(1 << 20, 1 << 20).unwrap();
    let a = plan.want_host(256).unwrap();
    let da = plan.want_device(256).unwrap();
    plan.satisfy().unwrap();
    let hp = plan.host_ptr(a).unwrap();
    let pinned = mm.pinned_pool().unwrap();

    let s = plan.host_slice(a).unwrap();
    s.fill(3);
    assert!(mm.copy_to_host_async(hp, d, 256, &stream).is_err());
    let e = pinned.copy_to_host_async(hp, d, 256, &stream).unwrap_err();
    assert!(e.to_string().contains("reachable from safe code"), "{e}");
    stream.synchronize().unwrap();
    assert!(s.iter().all(|&x| x == 3), "a safe call wrote under a slice");

    // The plan's own copies still work: it orders its slices after them.
    plan.copy_to_host_async(da, a, &stream).unwrap();
    plan.host_slice(a).unwrap();
    drop(plan);
    mm.free_device(d).unwrap();
    mm.shutdown().unwrap();
}

/// A block that a collection or a plan owns is freed by its owner only: a
/// safe free of its address would let the pool hand it out again under the
/// owner's references.
#[test]
fn safe_frees_refuse_blocks_that_collections_and_plans_own() {
    let (device, sim) = common::device(true);
    let stream = device.create_stream().unwrap();
    let pool = pool(&device, PinnedPoolConfig::default());
    let mut v: PinnedVec<u64, &PinnedPool> = PinnedVec::with_capacity_in(1000, &pool);
    v.extend(0..1000u64);
    let owned = |e: Error| {
        matches!(
            e,
            Error::InvalidFree {
                reason: FreeError::Owned,
                ..
            }
        )
    };
    assert!(owned(pool.free(addr(&v)).unwrap_err()));
    assert!(owned(pool.deallocate_sync(addr(&v), 8000, 8).unwrap_err()));
    assert!(owned(
        pool.deallocate(addr(&v), 8000, 8, &stream).unwrap_err()
    ));
    // The block is still the collection's: a new one lies elsewhere.
    let w: PinnedVec<u64, &PinnedPool> = PinnedVec::with_capacity_in(1000, &pool);
    assert_ne!(addr(&w), addr(&v));
    assert!(v.iter().copied().eq(0..1000u64));
    drop((v, w));
    assert_eq!(pool.stats().live_blocks, 0, "the owners freed their blocks");

    let mm = MemoryManager::new(device.clone());
    let mut plan = mm.planned_pool(1 << 20, 1 << 20).unwrap();
    let a = plan.want_host(256).unwrap();
    plan.satisfy().unwrap();
    let hp = plan.host_ptr(a).unwrap();
    assert!(owned(mm.free_pinned(hp).unwrap_err()));
    plan.host_slice(a).unwrap().fill(1);
    let other = mm.allocate_pinned(256).unwrap();
    assert_ne!(other, hp);
    assert!(plan.host_slice(a).unwrap().iter().all(|&x| x == 1));
    mm.free_pinned(other).unwrap();
    drop(plan);
    mm.shutdown().unwrap();
    drop(pool);
    all_pinned_memory_returned(sim);
}

/// Pinned memory of another pool is no device-side operand either: the
/// driver would take it, and the copy would write under a collection.
#[test]
fn safe_copies_refuse_another_pools_pinned_memory() {
    let (device, _) = common::device(true);
    let stream = device.create_stream().unwrap();
    let (a, b) = (
        pool(&device, PinnedPoolConfig::default()),
        pool(&device, PinnedPoolConfig::default()),
    );
    let mut v: PinnedVec<u8, &PinnedPool> = PinnedVec::with_capacity_in(4096, &b);
    v.resize(4096, 1);
    let src = a.allocate_sync(4096, 256).unwrap();
    let e = a
        .copy_to_device_async(addr(&v), src, 4096, &stream)
        .unwrap_err();
    assert!(
        matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("pinned host memory"),
        "{e}"
    );
    let e = a
        .copy_to_host_async(src, addr(&v), 4096, &stream)
        .unwrap_err();
    assert!(e.to_string().contains("pinned host memory"), "{e}");
    stream.synchronize().unwrap();
    assert!(
        v.iter().all(|&x| x == 1),
        "a safe call wrote under a collection"
    );
    a.deallocate_sync(src, 4096, 256).unwrap();
}

// ----- no copy of caller memory outlives the call -----

fn sim_device(test: &str) -> Option<(Device, Arc<SimDriver>)> {
    let (device, sim) = common::device(true);
    common::sim_only(sim, test).map(|s| (device, s))
}

fn fail_waits(sim: &SimDriver, times: u64) {
    for n in 1..=times {
        sim.fail_call("cuStreamSynchronize", n, 999);
    }
}

#[test]
fn a_failed_wait_never_leaves_a_copy_of_caller_memory_queued() {
    let Some((device, sim)) = sim_device("a_failed_wait_never_leaves") else {
        return;
    };
    let stream = device.create_stream().unwrap();
    let mr = DeviceResource::new(device.clone());
    let data = common::random_bytes(1 << 16, 10);
    let mut buf = DeviceBuffer::<u8, _>::new(data.len(), &mr, &stream).unwrap();

    sim.hold(stream.raw());
    fail_waits(&sim, 1);
    let e = buf.copy_from_host(&data).unwrap_err();
    assert!(e.to_string().contains("cuStreamSynchronize"), "{e}");
    assert_eq!(
        sim.pending_ops(stream.raw()),
        0,
        "copy_from_host returned while its copy still read the caller's slice"
    );

    let mut back = vec![0u8; data.len()];
    fail_waits(&sim, 1);
    assert!(buf.copy_to_host(&mut back).is_err());
    assert_eq!(
        sim.pending_ops(stream.raw()),
        0,
        "copy_to_host returned while its copy still wrote the caller's slice"
    );
    assert_eq!(back, data, "the copy ran before the call returned");
    sim.release(stream.raw());
}

const ABORT_CHILD_ENV: &str = "GPUMEM_HOST_MEMORY_ABORT_CHILD";

/// The child of `a_copy_that_cannot_be_waited_for_aborts`: a copy whose
/// stream never synchronizes (a no-op unless started as that child).
#[test]
fn abort_child() {
    if std::env::var_os(ABORT_CHILD_ENV).is_none() {
        return;
    }
    let (device, sim) = sim_device("abort_child").unwrap();
    let stream = device.create_stream().unwrap();
    let mr = DeviceResource::new(device.clone());
    let buf = DeviceBuffer::<u8, _>::zeroed(4096, &mr, &stream).unwrap();
    stream.synchronize().unwrap();
    let mut dst = vec![1u8; 4096];
    sim.hold(stream.raw());
    fail_waits(&sim, 100);
    let r = buf.copy_to_host(&mut dst);
    // Reached only if the call returned with the copy still queued.
    println!(
        "returned {r:?} with {} ops pending",
        sim.pending_ops(stream.raw())
    );
}

#[test]
fn a_copy_that_cannot_be_waited_for_aborts() {
    if sim_device("a_copy_that_cannot_be_waited_for_aborts").is_none() {
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "abort_child", "--test-threads=1", "--nocapture"])
        .env(ABORT_CHILD_ENV, "1")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGABRT),
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("cannot wait for a copy into or out of caller memory"),
        "{stderr}"
    );
}

#[test]
fn a_plan_waits_again_after_a_failed_wait() {
    let Some((device, sim)) = sim_device("a_plan_waits_again") else {
        return;
    };
    let mm = MemoryManager::new(device.clone());
    let stream = device.create_stream().unwrap();
    let mut plan = mm.planned_pool(1 << 20, 1 << 20).unwrap();
    let a = plan.want_host(4096).unwrap();
    let d = plan.want_device(4096).unwrap();
    plan.satisfy().unwrap();
    sim.hold(stream.raw());
    plan.copy_to_host_async(d, a, &stream).unwrap();
    fail_waits(&sim, 1);
    assert!(plan.host_slice(a).is_err());
    assert_eq!(
        sim.pending_ops(stream.raw()),
        1,
        "the failed wait ran nothing"
    );
    let s = plan.host_slice(a).unwrap();
    assert_eq!(
        sim.pending_ops(stream.raw()),
        0,
        "a host slice was handed out while a copy into it was queued"
    );
    s.fill(1);
    sim.release(stream.raw());
}

// ----- the pinned pool keeps memory under its own copies -----

#[test]
fn a_copy_whose_batch_event_fails_still_holds_its_block() {
    let Some((device, sim)) = sim_device("a_copy_whose_batch_event_fails") else {
        return;
    };
    let pool = pool(&device, PinnedPoolConfig::default());
    let stream = device.create_stream().unwrap();
    let dev = DeviceBlock::new(&device, 4096);
    let (a, b) = (
        pool.allocate_sync(4096, 256).unwrap(),
        pool.allocate_sync(4096, 256).unwrap(),
    );
    sim.hold(stream.raw());
    for _ in 1..gpumem::manager::COPY_BATCH {
        pool.copy_to_device_async(dev.ptr, b, 4096, &stream)
            .unwrap();
    }
    // The copy that fills the batch records its event, and that fails: the
    // copy is enqueued all the same and must hold its block.
    sim.fail_call("cuEventRecord", 1, 999);
    pool.copy_to_device_async(dev.ptr, a, 4096, &stream)
        .unwrap();
    pool.deallocate_sync(a, 4096, 256).unwrap();
    let c = pool.allocate_sync(4096, 256).unwrap();
    assert_ne!(c, a, "a block was reused while a copy from it was queued");
    assert_eq!(pool.stats().pending_blocks, 1);
    sim.release(stream.raw());
    pool.wait_pending().unwrap();
    assert_eq!(pool.stats().pending_blocks, 0);
    for p in [b, c] {
        pool.deallocate_sync(p, 4096, 256).unwrap();
    }
}

#[test]
fn a_free_whose_event_fails_still_waits_for_the_copy() {
    let Some((device, sim)) = sim_device("a_free_whose_event_fails") else {
        return;
    };
    let pool = pool(&device, PinnedPoolConfig::default());
    let stream = device.create_stream().unwrap();
    let dev = DeviceBlock::new(&device, 4096);
    let a = pool.allocate_sync(4096, 256).unwrap();
    sim.hold(stream.raw());
    pool.copy_to_device_async(dev.ptr, a, 4096, &stream)
        .unwrap();
    sim.fail_call("cuEventRecord", 1, 999);
    pool.deallocate_sync(a, 4096, 256).unwrap();
    let s = pool.stats();
    assert_eq!((s.live_blocks, s.pending_blocks), (0, 1), "{s:?}");
    let c = pool.allocate_sync(4096, 256).unwrap();
    assert_ne!(c, a, "a block was reused while a copy from it was queued");
    sim.release(stream.raw());
    pool.wait_pending().unwrap();
    assert_eq!(pool.stats().pending_blocks, 0);
    pool.deallocate_sync(c, 4096, 256).unwrap();
}

/// A pool whose freed block `a` waits for a queued device-to-host copy into
/// it, with the next event wait armed to fail.
fn pool_with_a_queued_copy(
    device: &Device,
    sim: &SimDriver,
    stream: &Stream,
    dev: &DeviceBlock,
) -> PinnedPool {
    let pool = pool(device, PinnedPoolConfig::fixed(1 << 20));
    let a = pool.allocate_sync(1 << 16, 256).unwrap();
    sim.hold(stream.raw());
    pool.copy_to_host_async(a, dev.ptr, 4096, stream).unwrap();
    pool.deallocate_sync(a, 1 << 16, 256).unwrap();
    sim.fail_call("cuEventSynchronize", 1, 999);
    pool
}

#[test]
fn release_all_frees_nothing_when_it_cannot_wait_for_the_copies() {
    let Some((device, sim)) = sim_device("release_all_frees_nothing") else {
        return;
    };
    let stream = device.create_stream().unwrap();
    let dev = DeviceBlock::new(&device, 4096);
    let pool = pool_with_a_queued_copy(&device, &sim, &stream, &dev);
    assert!(pool.release_all().is_err());
    assert_eq!(
        sim.pinned_host_bytes(),
        1 << 20,
        "pinned memory freed under a queued copy"
    );
    assert_eq!(sim.pending_ops(stream.raw()), 2, "copy and event");
    // It can be repeated.
    pool.release_all().unwrap();
    assert_eq!(sim.pinned_host_bytes(), 0);
    assert_eq!(sim.pending_ops(stream.raw()), 0);
}

#[test]
fn drop_leaks_rather_than_frees_under_a_queued_copy() {
    let Some((device, sim)) = sim_device("drop_leaks_rather_than_frees") else {
        return;
    };
    let stream = device.create_stream().unwrap();
    let dev = DeviceBlock::new(&device, 4096);
    drop(pool_with_a_queued_copy(&device, &sim, &stream, &dev));
    assert_eq!(
        sim.pinned_host_bytes(),
        1 << 20,
        "pinned memory freed under a queued copy"
    );
    // The copy runs into memory that is still there.
    sim.release(stream.raw());
    assert_eq!(sim.pending_ops(stream.raw()), 0);
}

/// A pinned block whose buffer was freed on the legacy default stream, with
/// device work still queued there, is not handed to a safe collection until
/// that work has run (the legacy stream was once taken for idle).
#[test]
fn a_free_on_the_busy_legacy_stream_waits_for_its_work() {
    let (device, sim) = common::device(true);
    let Some(sim) = sim else { return };
    let pool = pool(&device, PinnedPoolConfig::default());
    let legacy = device.default_stream();
    sim.hold(legacy.raw());
    let buf = DeviceBuffer::<u8, &PinnedPool>::new(4096, &pool, &legacy).unwrap();
    buf.memset_async(0xAB).unwrap();
    drop(buf);
    let mut v: PinnedVec<u8, &PinnedPool> = PinnedVec::with_capacity_in(4096, &pool);
    v.resize(4096, 0);
    sim.release(legacy.raw());
    legacy.synchronize().unwrap();
    assert!(
        v.iter().all(|&b| b == 0),
        "the memset ran into the Vec: {:#x}",
        v[0]
    );
}

/// `set_stream` makes the new stream wait for the old one's work, so a free
/// on an idle new stream does not hand the block out while the old stream
/// still writes it.
#[test]
fn set_stream_orders_the_free_after_the_old_streams_work() {
    let (device, sim) = common::device(true);
    let Some(sim) = sim else { return };
    let pool = pool(&device, PinnedPoolConfig::default());
    let (a, b) = (
        device.create_stream().unwrap(),
        device.create_stream().unwrap(),
    );
    sim.hold(a.raw());
    let mut buf = DeviceBuffer::<u8, &PinnedPool>::new(4096, &pool, &a).unwrap();
    buf.memset_async(0xCD).unwrap();
    buf.set_stream(&b).unwrap();
    assert!(!b.is_idle().unwrap(), "b waits for a's memset");
    drop(buf);
    let mut v: PinnedVec<u8, &PinnedPool> = PinnedVec::with_capacity_in(4096, &pool);
    v.resize(4096, 0);
    sim.release(a.raw());
    b.synchronize().unwrap();
    assert!(
        v.iter().all(|&x| x == 0),
        "the memset ran into the Vec: {:#x}",
        v[0]
    );
}

/// A stream of another driver instance is refused by the pinned pool's
/// copies and frees: its driver would look up the device side where this
/// pool's checks did not (here: another driver's pinned memory, which a safe
/// collection holds).
#[test]
fn copies_and_frees_refuse_a_stream_of_another_driver() {
    let (d1, sim) = common::device(true);
    if sim.is_none() {
        return;
    }
    let (d2, _) = Device::sim_with_driver(gpumem::driver::sim::SimConfig::backed(64 << 20));
    let pool1 = pool(&d1, PinnedPoolConfig::default());
    let pool2 = pool(&d2, PinnedPoolConfig::default());
    let mut v: PinnedVec<u8, &PinnedPool> = PinnedVec::with_capacity_in(4096, &pool2);
    v.resize(4096, 0);
    let h = pool1.allocate_sync(4096, 256).unwrap();
    let s2 = d2.create_stream().unwrap();
    let e = pool1
        .copy_to_device_async(addr(&v), h, 4096, &s2)
        .unwrap_err();
    assert!(e.to_string().contains("another driver instance"), "{e}");
    let e = pool1
        .copy_to_host_async(h, addr(&v), 4096, &s2)
        .unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    s2.synchronize().unwrap();
    assert!(
        v.iter().all(|&b| b == 0),
        "the Vec was written: {:#x}",
        v[0]
    );
    let e = pool1.deallocate(h, 4096, 256, &s2).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    pool1
        .deallocate(h, 4096, 256, &d1.create_stream().unwrap())
        .unwrap();
}

/// A pool's regions are its own: a clone of the resource it was made with,
/// kept by the caller, cannot free a region under a collection that lives
/// in it. The free is refused as a pointer the clone did not hand out, and
/// nothing changes: the data stays, the pool's numbers stay, and every
/// pinned byte goes back when the pool goes.
#[test]
fn a_clone_of_the_upstream_cannot_free_the_pools_regions() {
    let (device, sim) = common::device(true);
    let upstream = PinnedHostResource::new(device.clone());
    let pool = PinnedPool::new(upstream.clone(), PinnedPoolConfig::fixed(1 << 20)).unwrap();
    let mut v: PinnedVec<u8, &PinnedPool> = PinnedVec::with_capacity_in(4096, &pool);
    v.extend((0..4096).map(|i| i as u8));
    // The pool's one region begins where its first block does.
    let region = addr(&v);
    let before = pool.stats();
    assert_eq!(
        upstream.live_allocations(),
        0,
        "the clone hands out nothing of the pool's"
    );
    for (p, bytes) in [(region, 1 << 20), (region, 4096)] {
        let e = upstream.deallocate_sync(p, bytes, 256).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidFree {
                    reason: FreeError::Unknown,
                    ..
                }
            ),
            "a free of the pool's memory through the clone is refused: {e}"
        );
    }
    assert!(
        v.iter().enumerate().all(|(i, &b)| b == i as u8),
        "data kept"
    );
    assert_eq!(pool.stats(), before, "the pool's numbers kept");
    drop(v);
    drop(pool);
    all_pinned_memory_returned(sim);
}
