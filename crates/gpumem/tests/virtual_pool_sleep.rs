//! VirtualPool regions, sleep and wake: blocks carry the region they were
//! allocated in; a region asleep keeps its addresses (never handed out) but
//! gives its pages back, refuses every use through gpumem, and comes back
//! with its contents (from a pinned host backup) or undefined (discarded).
//! Also: pages other regions' blocks share stay mapped, sleep is ordered on
//! its stream, an injected driver failure halfway through sleep or wake
//! leaves the region as it was, freeing a sleeping block forgets it, and a
//! property test against a model of regions.
//!
//! Runs on the simulated device; with `GPUMEM_DEVICE=cuda` the tests that
//! need no simulator control run on the GPU.

mod common;

use std::sync::Arc;

use common::sim_only;
use gpumem::adaptor::{LimitingAdaptor, StatisticsAdaptor};
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::pool::{Backup, Pool, VirtualPool, VirtualPoolConfig, NO_REGION};
use gpumem::resource::MemoryResource;
use gpumem::{Device, DeviceBuffer, DevicePtr, Error, Stream};
use proptest::prelude::*;

const MIB: usize = 1 << 20;
const WEIGHTS: u32 = 1;
const KV: u32 = 2;

type Buf<'a> = DeviceBuffer<u8, &'a VirtualPool>;

fn pool(device: &Device) -> VirtualPool {
    VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap()
}

/// A buffer holding `data`, allocated in region `tag` (none for 0).
fn buf_in<'a>(p: &'a VirtualPool, tag: u32, data: &[u8], s: &Stream) -> Buf<'a> {
    if tag != NO_REGION {
        p.begin_region(tag).unwrap();
    }
    let b = DeviceBuffer::from_slice(data, p, s);
    if tag != NO_REGION {
        p.end_region().unwrap();
    }
    b.unwrap()
}

fn assert_asleep(e: Error, tag: u32) {
    match e {
        Error::Asleep { tag: t, .. } => assert_eq!(t, tag, "{e}"),
        e => panic!("expected Error::Asleep for region {tag}, got {e}"),
    }
}

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

fn assert_all_back(sim: &SimDriver) {
    assert_eq!(sim.physical_bytes(), 0, "physical memory back");
    assert_eq!(sim.mapped_bytes(), 0, "nothing mapped");
    assert_eq!(sim.reserved_va_bytes(), 0, "address space back");
    assert_eq!(sim.pinned_host_bytes(), 0, "pinned host memory back");
}

/// A pool with the default configuration on the test device (`backed` on
/// the simulator), the simulator if it is one, and a stream.
fn setup(backed: bool) -> (Device, Option<Arc<SimDriver>>, VirtualPool, Stream) {
    let (device, sim) = common::device(backed);
    let p = pool(&device);
    let s = device.create_stream().unwrap();
    (device, sim, p, s)
}

/// Drops the pool; on the simulator, checks that everything went back.
fn close(p: VirtualPool, sim: Option<Arc<SimDriver>>) {
    drop(p);
    if let Some(sim) = sim {
        assert_eq!(sim.data_stats().faults, 0, "no work on unmapped pages");
        assert_all_back(&sim);
    }
}

#[test]
fn a_region_sleeps_keeping_its_addresses_and_wakes_with_its_contents() {
    let (_device, sim, p, s) = setup(true);
    let data: Vec<Vec<u8>> = (0..3)
        .map(|i| common::random_bytes(12 * MIB + i * 4096 + 256, i as u64))
        .collect();
    let weights: Vec<Buf> = data.iter().map(|d| buf_in(&p, WEIGHTS, d, &s)).collect();
    let other_data = common::random_bytes(6 * MIB, 99);
    let other = buf_in(&p, NO_REGION, &other_data, &s);
    for w in &weights {
        assert_eq!(p.region_of(w.as_device_ptr()), Some(WEIGHTS));
    }
    assert_eq!(p.region_of(other.as_device_ptr()), Some(NO_REGION));
    let ranges: Vec<(u64, u64)> = weights
        .iter()
        .map(|w| (w.as_device_ptr().0, w.len() as u64))
        .collect();
    let region_bytes: usize = weights.iter().map(|w| w.len().next_multiple_of(256)).sum();
    let held = p.stats().reserved;

    let released = p.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap();
    p.check_invariants().unwrap();
    assert!(p.is_asleep(WEIGHTS) && !p.is_asleep(KV));
    assert_eq!(p.sleeping_bytes(WEIGHTS), region_bytes);
    // Pages the other block shares stay: at most two pages per block.
    let page = p.page_size();
    assert!(
        released + 6 * page >= region_bytes,
        "{released} of {region_bytes}"
    );
    assert_eq!(p.stats().reserved, held - released);
    // Every use of a sleeping block through gpumem is refused.
    assert_asleep(weights[0].to_vec().unwrap_err(), WEIGHTS);
    assert_asleep(weights[1].memset_async(0).unwrap_err(), WEIGHTS);
    let mut into = buf_in(&p, NO_REGION, &data[2], &s);
    assert_asleep(into.copy_from_device(&weights[2]).unwrap_err(), WEIGHTS);
    assert_asleep(
        p.check_access(DevicePtr(ranges[0].0 + 100), 1).unwrap_err(),
        WEIGHTS,
    );
    // So is allocating in the region.
    p.begin_region(WEIGHTS).unwrap();
    assert_asleep(p.allocate(MIB, 256, &s).unwrap_err(), WEIGHTS);
    p.end_region().unwrap();
    // Other blocks are untouched; new blocks never get a sleeping address.
    assert_eq!(other.to_vec().unwrap(), other_data);
    let fresh: Vec<Buf> = (1..8)
        .map(|i| DeviceBuffer::new(i * 3 * MIB, &p, &s).unwrap())
        .collect();
    for f in &fresh {
        let r = (f.as_device_ptr().0, f.len() as u64);
        assert!(ranges.iter().all(|&w| !overlaps(w, r)), "{r:#x?} overlaps");
        f.memset_async(0xee).unwrap();
    }
    p.check_invariants().unwrap();
    drop(fresh);
    drop(into);

    assert_eq!(p.wake(WEIGHTS, &s).unwrap(), region_bytes);
    p.check_invariants().unwrap();
    assert!(!p.is_asleep(WEIGHTS));
    assert_eq!(p.sleeping_bytes(WEIGHTS), 0);
    for (w, (d, r)) in weights.iter().zip(data.iter().zip(&ranges)) {
        assert_eq!(w.as_device_ptr().0, r.0, "same address");
        assert_eq!(&w.to_vec().unwrap(), d, "contents restored");
    }
    assert_eq!(other.to_vec().unwrap(), other_data);
    drop(weights);
    drop(other);
    close(p, sim);
}

#[test]
fn a_discarded_region_copies_nothing_and_comes_back_usable() {
    let (_device, sim, p, s) = setup(true);
    let kv = buf_in(&p, KV, &common::random_bytes(20 * MIB, 1), &s);
    let copies = sim.as_ref().map(|sim| sim.call_count("cuMemcpyDtoHAsync"));
    let released = p.sleep(KV, Backup::Discard, &s).unwrap();
    assert_eq!(released, 20 * MIB);
    assert_eq!(p.stats().reserved, 0);
    if let Some(sim) = &sim {
        assert_eq!(
            Some(sim.call_count("cuMemcpyDtoHAsync")),
            copies,
            "nothing copied"
        );
        assert_eq!(sim.pinned_host_bytes(), 0, "no backup");
    }
    assert_eq!(p.wake(KV, &s).unwrap(), 20 * MIB);
    // Undefined contents, but mapped and writable at the same address.
    kv.memset_async(3).unwrap();
    assert!(kv.to_vec().unwrap().iter().all(|&b| b == 3));
    p.check_invariants().unwrap();
    drop(kv);
    close(p, sim);
}

#[test]
fn pages_shared_with_blocks_of_other_regions_stay_mapped() {
    let (_device, sim, p, s) = setup(true);
    // Small blocks share pages: the other region's block keeps it mapped.
    let small_a = common::random_bytes(64 << 10, 1);
    let small_b = common::random_bytes(64 << 10, 2);
    let a = buf_in(&p, WEIGHTS, &small_a, &s);
    let b = buf_in(&p, KV, &small_b, &s);
    let page = p.page_size() as u64;
    assert_eq!(
        a.as_device_ptr().0 / page,
        b.as_device_ptr().0 / page,
        "one page"
    );
    assert_eq!(p.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap(), 0);
    assert_eq!(
        b.to_vec().unwrap(),
        small_b,
        "the other region is untouched"
    );
    b.memset_async(9).unwrap();
    assert_asleep(a.to_vec().unwrap_err(), WEIGHTS);
    p.check_invariants().unwrap();
    assert_eq!(p.sleeping_bytes(WEIGHTS), 64 << 10);
    // Both asleep: the page is theirs alone and goes.
    let held = p.stats().reserved;
    assert_eq!(p.sleep(KV, Backup::HostPinned, &s).unwrap(), page as usize);
    assert_eq!(p.stats().reserved, held - page as usize);
    p.check_invariants().unwrap();
    p.wake(WEIGHTS, &s).unwrap();
    assert_eq!(a.to_vec().unwrap(), small_a);
    assert_asleep(b.to_vec().unwrap_err(), KV);
    p.wake(KV, &s).unwrap();
    assert!(b.to_vec().unwrap().iter().all(|&x| x == 9));
    p.check_invariants().unwrap();
    drop((a, b));

    // A large block whose last page the next block shares: the extent
    // mapped under that page stays, whole (the others may go).
    let big = common::random_bytes(11 * MIB, 3);
    let x = buf_in(&p, WEIGHTS, &big, &s);
    let y = buf_in(&p, NO_REGION, &common::random_bytes(3 * MIB, 4), &s);
    assert!(overlaps(
        (
            (x.as_device_ptr().0 + 11 * MIB as u64 - 1) / page * page,
            page
        ),
        (y.as_device_ptr().0, 1)
    ));
    let released = p.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap();
    assert!(
        released < 6 * page as usize,
        "the shared page stays: {released}"
    );
    p.check_invariants().unwrap();
    y.memset_async(1).unwrap();
    assert!(y.to_vec().unwrap().iter().all(|&v| v == 1));
    p.wake(WEIGHTS, &s).unwrap();
    assert_eq!(x.to_vec().unwrap(), big);
    drop((x, y));
    close(p, sim);
}

#[test]
fn sleep_waits_for_the_work_queued_on_its_stream() {
    let (device, sim) = common::device(true);
    let Some(sim) = sim_only(sim, "sleep_waits_for_the_work_queued_on_its_stream") else {
        return;
    };
    let p = pool(&device);
    let s = device.create_stream().unwrap();
    // Discard first: on a fresh pool no free makes the sleep wait for s.
    for backup in [Backup::Discard, Backup::HostPinned] {
        let w = buf_in(&p, WEIGHTS, &common::random_bytes(8 * MIB, 5), &s);
        sim.hold(s.raw());
        w.memset_async(0x5a).unwrap(); // pending on s
        assert_eq!(sim.pending_ops(s.raw()), 1);
        p.sleep(WEIGHTS, backup, &s).unwrap();
        assert_eq!(sim.pending_ops(s.raw()), 0, "{backup:?}: s ran first");
        assert_eq!(
            sim.data_stats().faults,
            0,
            "{backup:?}: no work on unmapped pages"
        );
        sim.release(s.raw());
        p.wake(WEIGHTS, &s).unwrap();
        if backup == Backup::HostPinned {
            assert!(
                w.to_vec().unwrap().iter().all(|&b| b == 0x5a),
                "the backup came after"
            );
        }
        drop(w);
    }
    p.check_invariants().unwrap();
    drop(p);
    assert_all_back(&sim);
}

/// A backed device whose pool maps two pages per extent, and the contents
/// of a region of four 8 MiB blocks (two extents each).
fn faulty_setup(tag_data: &mut Vec<Vec<u8>>) -> (Device, Arc<SimDriver>, VirtualPool) {
    let (device, sim) = Device::sim_with_driver(SimConfig::backed(256 * MIB));
    let mut config = VirtualPoolConfig::default();
    config.max_extent_pages = 2;
    // Each block a slice of its own when it sleeps or wakes: failures in
    // later slices find earlier ones released (or mapped) and copies under
    // way.
    config.copy_slice_bytes = 8 * MIB;
    let p = VirtualPool::new(device.clone(), config).unwrap();
    *tag_data = (0..4).map(|i| common::random_bytes(8 * MIB, i)).collect();
    (device, sim, p)
}

#[test]
fn a_failure_halfway_through_sleep_leaves_the_region_awake() {
    let mut data = Vec::new();
    let (device, sim, p) = faulty_setup(&mut data);
    let s = device.create_stream().unwrap();
    let bufs: Vec<Buf> = data.iter().map(|d| buf_in(&p, WEIGHTS, d, &s)).collect();
    let other = buf_in(&p, NO_REGION, &data[0], &s);
    let cases = [
        ("cuMemHostAlloc", 1),
        ("cuMemcpyDtoHAsync", 1),
        ("cuMemcpyDtoHAsync", 3),
        ("cuEventSynchronize", 1),
        ("cuEventSynchronize", 3),
        ("cuEventSynchronize", 4),
        ("cuMemUnmap", 1),
        ("cuMemUnmap", 2),
        ("cuMemUnmap", 5),
        ("cuMemUnmap", 8),
    ];
    for (call, nth) in cases {
        let mapped = sim.mapped_bytes();
        sim.fail_call(call, nth, 1);
        let e = p.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap_err();
        sim.clear_faults();
        assert!(matches!(e, Error::Driver { .. }), "{call} {nth}: {e}");
        assert!(!p.is_asleep(WEIGHTS), "{call} {nth}: still awake");
        assert_eq!(p.sleeping_bytes(WEIGHTS), 0);
        assert_eq!(sim.mapped_bytes(), mapped, "{call} {nth}: every page back");
        p.check_invariants().unwrap();
        for (b, d) in bufs.iter().zip(&data) {
            assert_eq!(&b.to_vec().unwrap(), d, "{call} {nth}: contents kept");
        }
    }
    // When mapping a page back fails too, the region is left asleep, whole.
    sim.fail_call("cuMemUnmap", 5, 1);
    sim.fail_call("cuMemMap", 1, 1);
    assert!(p.sleep(WEIGHTS, Backup::HostPinned, &s).is_err());
    sim.clear_faults();
    assert!(p.is_asleep(WEIGHTS));
    assert_eq!(p.sleeping_bytes(WEIGHTS), 32 * MIB);
    p.check_invariants().unwrap();
    p.wake(WEIGHTS, &s).unwrap();
    // An extent the driver will not release stays cached: the sleep holds.
    sim.fail_call("cuMemRelease", 1, 1);
    let released = p.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap();
    sim.clear_faults();
    assert_eq!(released, 32 * MIB - 4 * MIB);
    assert_eq!(p.stats().cached, 4 * MIB);
    p.check_invariants().unwrap();
    p.wake(WEIGHTS, &s).unwrap();
    for (b, d) in bufs.iter().zip(&data) {
        assert_eq!(&b.to_vec().unwrap(), d);
    }
    assert_eq!(other.to_vec().unwrap(), data[0]);
    assert_eq!(sim.data_stats().faults, 0);
    drop((bufs, other));
    drop(p);
    assert_all_back(&sim);
}

#[test]
fn a_failure_halfway_through_wake_leaves_the_region_asleep() {
    let mut data = Vec::new();
    let (device, sim, p) = faulty_setup(&mut data);
    let s = device.create_stream().unwrap();
    let bufs: Vec<Buf> = data.iter().map(|d| buf_in(&p, WEIGHTS, d, &s)).collect();
    p.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap();
    let cases = [
        ("cuMemCreate", 1),
        ("cuMemCreate", 7),
        ("cuMemMap", 2),
        ("cuMemMap", 8),
        ("cuMemSetAccess", 1),
        ("cuMemcpyHtoDAsync", 1),
        ("cuMemcpyHtoDAsync", 3),
        ("cuStreamSynchronize", 1),
    ];
    for (call, nth) in cases {
        let (mapped, physical) = (sim.mapped_bytes(), sim.physical_bytes());
        sim.fail_call(call, nth, 1);
        let e = p.wake(WEIGHTS, &s).unwrap_err();
        sim.clear_faults();
        assert!(matches!(e, Error::Driver { .. }), "{call} {nth}: {e}");
        assert!(p.is_asleep(WEIGHTS), "{call} {nth}: still asleep");
        assert_eq!(p.sleeping_bytes(WEIGHTS), 32 * MIB);
        assert_eq!(
            sim.mapped_bytes(),
            mapped,
            "{call} {nth}: nothing left mapped"
        );
        assert_eq!(sim.physical_bytes(), physical, "{call} {nth}: nothing kept");
        assert_asleep(bufs[0].to_vec().unwrap_err(), WEIGHTS);
        p.check_invariants().unwrap();
    }
    // Out of memory too: the limit leaves no room.
    p.set_max_reserved(Some(8 * MIB));
    assert!(p.wake(WEIGHTS, &s).unwrap_err().is_oom());
    assert!(p.is_asleep(WEIGHTS));
    p.check_invariants().unwrap();
    p.set_max_reserved(None);
    p.wake(WEIGHTS, &s).unwrap();
    for (b, d) in bufs.iter().zip(&data) {
        assert_eq!(&b.to_vec().unwrap(), d);
    }
    assert_eq!(sim.data_stats().faults, 0);
    drop(bufs);
    drop(p);
    assert_all_back(&sim);
}

/// Driver calls sleep and wake make, directly or through the pinned pool.
const CALLS: [&str; 11] = [
    "cuMemHostAlloc",
    "cuMemcpyDtoHAsync",
    "cuMemcpyHtoDAsync",
    "cuStreamSynchronize",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuMemUnmap",
    "cuMemRelease",
    "cuMemCreate",
    "cuMemMap",
];

#[test]
fn every_single_driver_failure_in_sleep_or_wake_is_all_or_nothing() {
    let mut data = Vec::new();
    let (device, sim, p) = faulty_setup(&mut data);
    let s = device.create_stream().unwrap();
    let bufs: Vec<Buf> = data.iter().map(|d| buf_in(&p, WEIGHTS, d, &s)).collect();
    let intact = |what: &str| {
        for (b, d) in bufs.iter().zip(&data) {
            assert_eq!(&b.to_vec().unwrap(), d, "{what}: contents kept");
        }
    };
    for call in CALLS.iter().chain(["cuMemSetAccess"].iter()) {
        for nth in 1..=10 {
            let what = format!("sleep, {call} #{nth}");
            let mapped = sim.mapped_bytes();
            sim.fail_call(call, nth, 1);
            let slept = p.sleep(WEIGHTS, Backup::HostPinned, &s);
            sim.clear_faults();
            p.check_invariants()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            match slept {
                Ok(_) => {
                    assert!(p.is_asleep(WEIGHTS), "{what}");
                    p.wake(WEIGHTS, &s).unwrap();
                }
                Err(_) => {
                    assert!(!p.is_asleep(WEIGHTS), "{what}: awake");
                    assert_eq!(sim.mapped_bytes(), mapped, "{what}: every page back");
                }
            }
            intact(&what);

            let what = format!("wake, {call} #{nth}");
            p.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap();
            let (mapped, physical) = (sim.mapped_bytes(), sim.physical_bytes());
            sim.fail_call(call, nth, 1);
            let woke = p.wake(WEIGHTS, &s);
            sim.clear_faults();
            p.check_invariants()
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            if woke.is_err() {
                assert!(p.is_asleep(WEIGHTS), "{what}: asleep");
                assert_eq!(sim.mapped_bytes(), mapped, "{what}: nothing left mapped");
                assert_eq!(sim.physical_bytes(), physical, "{what}: nothing kept");
                p.wake(WEIGHTS, &s).unwrap();
            }
            assert!(!p.is_asleep(WEIGHTS), "{what}");
            intact(&what);
        }
    }
    assert_eq!(sim.data_stats().faults, 0);
    drop(bufs);
    drop(p);
    assert_all_back(&sim);
}

#[test]
fn freeing_a_sleeping_block_forgets_it() {
    let (_device, sim, p, s) = setup(true);
    let keep = common::random_bytes(4 * MIB, 1);
    let a = buf_in(&p, WEIGHTS, &keep, &s);
    let b = buf_in(&p, WEIGHTS, &common::random_bytes(6 * MIB, 2), &s);
    let b_at = (b.as_device_ptr().0, b.len() as u64);
    p.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap();
    drop(b); // allowed while asleep
    assert_eq!(p.sleeping_bytes(WEIGHTS), 4 * MIB);
    p.check_invariants().unwrap();
    // Its addresses are free again.
    let c = DeviceBuffer::<u8, _>::new(6 * MIB, &p, &s).unwrap();
    assert!(
        overlaps(b_at, (c.as_device_ptr().0, 1)),
        "the freed place is reused"
    );
    c.memset_async(7).unwrap();
    p.check_invariants().unwrap();
    p.wake(WEIGHTS, &s).unwrap();
    assert_eq!(a.to_vec().unwrap(), keep);
    assert!(c.to_vec().unwrap().iter().all(|&x| x == 7));
    // Every block freed while asleep: the backup goes, the wake is empty.
    p.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap();
    drop(a);
    assert_eq!(p.sleeping_bytes(WEIGHTS), 0);
    assert!(p.is_asleep(WEIGHTS));
    assert_eq!(p.wake(WEIGHTS, &s).unwrap(), 0);
    p.check_invariants().unwrap();
    drop(c);
    close(p, sim);
}

#[test]
fn adaptors_over_the_pool_refuse_sleeping_blocks_too() {
    let (_device, sim, p, s) = setup(true);
    let stack = LimitingAdaptor::new(StatisticsAdaptor::new(&p), usize::MAX);
    p.begin_region(KV).unwrap();
    let kv = DeviceBuffer::from_slice(&[7u8; 4096], &stack, &s).unwrap();
    p.end_region().unwrap();
    p.sleep(KV, Backup::HostPinned, &s).unwrap();
    assert_asleep(kv.to_vec().unwrap_err(), KV);
    assert_asleep(kv.memset_async(1).unwrap_err(), KV);
    p.wake(KV, &s).unwrap();
    assert_eq!(kv.to_vec().unwrap(), [7u8; 4096]);
    drop(kv);
    drop(stack);
    close(p, sim);
}

#[test]
fn regions_nest_and_the_state_machine_refuses_what_does_not_fit() {
    let (_device, _sim, p, s) = setup(false);
    assert!(matches!(p.end_region(), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        p.begin_region(NO_REGION),
        Err(Error::InvalidArgument(_))
    ));
    p.begin_region(WEIGHTS).unwrap();
    p.begin_region(KV).unwrap();
    let x = p.allocate(MIB, 256, &s).unwrap();
    assert_eq!(p.end_region().unwrap(), KV);
    let y = p.allocate(MIB, 256, &s).unwrap();
    assert_eq!(p.current_region(), WEIGHTS);
    assert_eq!(p.end_region().unwrap(), WEIGHTS);
    let z = p.allocate(MIB, 256, &s).unwrap();
    assert_eq!(p.current_region(), NO_REGION);
    let tags: Vec<_> = [x, y, z].iter().map(|&q| p.region_of(q)).collect();
    assert_eq!(tags, [Some(KV), Some(WEIGHTS), Some(NO_REGION)]);
    assert_eq!(
        p.region_of(DevicePtr(x.0 + 256)),
        None,
        "not a block's start"
    );
    for bad in [
        p.sleep(NO_REGION, Backup::Discard, &s),
        p.wake(NO_REGION, &s),
        p.wake(WEIGHTS, &s),
    ] {
        assert!(matches!(bad, Err(Error::InvalidArgument(_))), "{bad:?}");
    }
    p.sleep(WEIGHTS, Backup::Discard, &s).unwrap();
    let again = p.sleep(WEIGHTS, Backup::Discard, &s).unwrap_err();
    assert!(again.to_string().contains("already asleep"), "{again}");
    assert!(p.is_asleep(WEIGHTS) && !p.is_asleep(KV));
    // A region with nothing in it sleeps and wakes too.
    p.sleep(7, Backup::HostPinned, &s).unwrap();
    assert_eq!(p.wake(7, &s).unwrap(), 0);
    p.wake(WEIGHTS, &s).unwrap();
    for (q, n) in [(x, MIB), (y, MIB), (z, MIB)] {
        p.deallocate(q, n, 256, &s).unwrap();
    }
    p.check_invariants().unwrap();
}

#[test]
fn the_pools_memory_is_not_exported_while_a_region_sleeps() {
    let (device, _sim) = common::device(false);
    let mut config = VirtualPoolConfig::default();
    config.ipc = true;
    let Ok(p) = VirtualPool::new(device.clone(), config) else {
        eprintln!("no POSIX descriptor export on this device: skipped");
        return;
    };
    let s = device.create_stream().unwrap();
    p.begin_region(KV).unwrap();
    let x = p.allocate(4 * MIB, 256, &s).unwrap();
    p.end_region().unwrap();
    p.sleep(KV, Backup::Discard, &s).unwrap();
    assert_asleep(p.export_page_fds().unwrap_err(), KV);
    p.wake(KV, &s).unwrap();
    assert!(!p.export_page_fds().unwrap().is_empty());
    p.deallocate(x, 4 * MIB, 256, &s).unwrap();
}

#[test]
fn pinned_backups_are_kept_for_the_next_sleep_until_released() {
    let (device, sim) = common::device(true);
    let Some(sim) = sim_only(
        sim,
        "pinned_backups_are_kept_for_the_next_sleep_until_released",
    ) else {
        return;
    };
    let p = pool(&device);
    let s = device.create_stream().unwrap();
    let w = buf_in(&p, WEIGHTS, &common::random_bytes(40 * MIB, 1), &s);
    p.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap();
    p.wake(WEIGHTS, &s).unwrap();
    let pins = sim.call_count("cuMemHostAlloc");
    assert!(
        sim.pinned_host_bytes() >= 40 * MIB,
        "kept for the next sleep"
    );
    p.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap();
    p.wake(WEIGHTS, &s).unwrap();
    assert_eq!(sim.call_count("cuMemHostAlloc"), pins, "no new pinning");
    assert!(p.release_host_backups().unwrap() >= 40 * MIB);
    assert_eq!(sim.pinned_host_bytes(), 0);
    p.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap();
    p.wake(WEIGHTS, &s).unwrap();
    p.release().unwrap();
    assert_eq!(sim.pinned_host_bytes(), 0, "release gives it back too");
    drop(w);
    drop(p);
    assert_all_back(&sim);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn regions_follow_the_model(ops in prop::collection::vec(common::regions_model::rop(), 1..80)) {
        common::regions_model::run_regions(&ops)?;
    }
}
