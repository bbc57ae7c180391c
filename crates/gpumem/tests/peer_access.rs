//! Peer access between devices at the driver layer: enabling it, copies
//! across devices, the grant each kind of memory needs, and the address and
//! handle queries behind NCCL's registration. The simulator's refusals are
//! checked on it alone; the rest runs on the real GPUs too.

mod common;

use std::sync::Arc;

use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::{AccessFlags, DevicePtr, Driver, PoolProps, RawStream};
use gpumem::{Device, Error};

const MIB: usize = 1 << 20;

/// The `CUresult` of a driver error.
fn code(e: Error) -> i32 {
    match e {
        Error::Driver { code, .. } => code,
        other => panic!("expected a driver error, got {other}"),
    }
}

/// Two backed simulated devices (bytes behind every address).
fn backed_pair() -> (Device, Device, Arc<SimDriver>) {
    let mut config = SimConfig::backed(64 * MIB);
    config.devices = 2;
    let (d0, sim) = Device::sim_with_driver(config);
    let d1 = d0.sibling(1).unwrap();
    (d0, d1, sim)
}

fn write(d: &Device, dst: DevicePtr, bytes: &[u8]) {
    let s = d.create_stream().unwrap();
    // SAFETY: `bytes` outlives the copy: the stream is synchronized below.
    unsafe {
        d.driver()
            .memcpy_htod_async(dst, bytes.as_ptr(), bytes.len(), s.raw())
            .unwrap()
    };
    s.synchronize().unwrap();
}

fn read(d: &Device, src: DevicePtr, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    let s = d.create_stream().unwrap();
    // SAFETY: `out` outlives the copy: the stream is synchronized below.
    unsafe {
        d.driver()
            .memcpy_dtoh_async(out.as_mut_ptr(), src, n, s.raw())
            .unwrap()
    };
    s.synchronize().unwrap();
    out
}

fn dtod(d: &Device, dst: DevicePtr, src: DevicePtr, n: usize, s: RawStream) -> gpumem::Result<()> {
    // SAFETY: device memory only; the caller synchronizes before freeing.
    unsafe { d.driver().memcpy_dtod_async(dst, src, n, s) }
}

fn peer_copy(
    d: &Device,
    (dst, dst_dev): (DevicePtr, u32),
    (src, src_dev): (DevicePtr, u32),
    n: usize,
    s: RawStream,
) -> gpumem::Result<()> {
    // SAFETY: device memory only; the caller synchronizes before freeing.
    unsafe {
        d.driver()
            .memcpy_peer_async(dst, dst_dev, src, src_dev, n, s)
    }
}

#[test]
fn enabling_twice_is_success_and_itself_is_refused() {
    let Some((d0, d1, _)) = common::two_devices(SimConfig::default()) else {
        return;
    };
    let drv = d0.driver();
    let (a, b) = (d0.ordinal(), d1.ordinal());
    if !drv.can_access_peer(a, b).unwrap() {
        eprintln!("devices {a} and {b} cannot reach each other: nothing to enable");
        return;
    }
    assert!(
        drv.can_access_peer(a, a).unwrap(),
        "a device reaches itself"
    );
    // A real GPU may have it enabled already (by another test of this process).
    drv.enable_peer_access(a, b).unwrap();
    assert!(
        !drv.enable_peer_access(a, b).unwrap(),
        "the second enable is ALREADY_ENABLED, taken as success"
    );
    assert!(matches!(
        drv.enable_peer_access(a, a),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn a_pair_that_cannot_reach_each_other_is_refused() {
    let mut config = SimConfig::multi(2);
    config.peer_access = false;
    let d = SimDriver::new(config);
    assert!(!d.can_access_peer(0, 1).unwrap());
    assert!(d.can_access_peer(1, 1).unwrap());
    assert_eq!(code(d.enable_peer_access(0, 1).unwrap_err()), 217);
    assert!(!d.peer_access_enabled(0, 1));
    let fresh = SimDriver::new(SimConfig::multi(2));
    assert!(fresh.enable_peer_access(0, 1).unwrap());
    assert!(fresh.peer_access_enabled(0, 1));
    assert!(!fresh.peer_access_enabled(1, 0), "one direction only");
    assert_eq!(code(fresh.enable_peer_access(0, 2).unwrap_err()), 101);
}

#[test]
fn a_copy_touching_another_devices_memory_needs_peer_access() {
    let (d0, d1, sim) = backed_pair();
    let drv = d0.driver();
    let data = common::random_bytes(MIB, 7);
    let src = drv.mem_alloc(0, MIB).unwrap();
    let dst = drv.mem_alloc(1, MIB).unwrap();
    write(&d0, src, &data);
    let s1 = d1.create_stream().unwrap();

    // Device 1 runs the copy and would read device 0's memory.
    assert_eq!(code(dtod(&d1, dst, src, MIB, s1.raw()).unwrap_err()), 705);
    assert_eq!(
        code(peer_copy(&d1, (dst, 1), (src, 0), MIB, s1.raw()).unwrap_err()),
        705
    );
    let v = sim.peer_violations();
    assert_eq!(v.len(), 2, "{v:?}");
    assert_eq!((v[0].device, v[0].owner, v[0].address), (1, 0, src.0));
    assert!(
        v[0].to_string().contains("cuCtxEnablePeerAccess"),
        "{}",
        v[0]
    );
    assert_ne!(read(&d1, dst, MIB), data, "nothing was copied");

    // Access from 0 to 1 does not open 0's memory to 1.
    assert!(drv.enable_peer_access(0, 1).unwrap());
    assert!(dtod(&d1, dst, src, MIB, s1.raw()).is_err());
    assert!(drv.enable_peer_access(1, 0).unwrap());
    peer_copy(&d1, (dst, 1), (src, 0), MIB, s1.raw()).unwrap();
    s1.synchronize().unwrap();
    assert_eq!(read(&d1, dst, MIB), data, "the peer copy's bytes arrived");
    let other = drv.mem_alloc(1, MIB).unwrap();
    dtod(&d1, other, src, MIB, s1.raw()).unwrap();
    s1.synchronize().unwrap();
    assert_eq!(read(&d1, other, MIB), data, "a plain copy across devices");
    assert_eq!(sim.peer_violations().len(), 3, "no new refusal");
    for (dev, p) in [(0, src), (1, dst), (1, other)] {
        // SAFETY: this test's allocations, each freed once; the copies that
        // used them have run (read back).
        unsafe { drv.mem_free(dev, p) }.unwrap();
    }
}

#[test]
fn a_peer_copy_names_the_devices_that_own_its_memory() {
    let (_, d1, _) = backed_pair();
    let drv = d1.driver();
    drv.enable_peer_access(1, 0).unwrap();
    let src = drv.mem_alloc(0, MIB).unwrap();
    let dst = drv.mem_alloc(1, MIB).unwrap();
    let s = d1.create_stream().unwrap();
    let wrong = peer_copy(&d1, (dst, 0), (src, 0), MIB, s.raw()).unwrap_err();
    assert_eq!(code(wrong), 1, "dst is device 1's memory");
    peer_copy(&d1, (dst, 1), (src, 0), MIB, s.raw()).unwrap();
    s.synchronize().unwrap();
    // SAFETY: this test's allocations, freed once; the copy has run.
    unsafe {
        drv.mem_free(0, src).unwrap();
        drv.mem_free(1, dst).unwrap();
    }
}

#[test]
fn pool_and_mapped_memory_need_their_own_grant() {
    let (d0, d1, sim) = backed_pair();
    let drv = d0.driver();
    drv.enable_peer_access(1, 0).unwrap();
    let s0 = d0.create_stream().unwrap();
    let s1 = d1.create_stream().unwrap();
    let dst = drv.mem_alloc(1, MIB).unwrap();

    // Pool memory: peer access does not open it; the pool's grant does.
    let pool = drv.mempool_create(&PoolProps::device(0)).unwrap();
    // SAFETY: this test's pool, and a live stream.
    let p = unsafe { drv.mem_alloc_from_pool_async(MIB, pool, s0.raw()) }.unwrap();
    s0.synchronize().unwrap();
    assert_eq!(code(dtod(&d1, dst, p, MIB, s1.raw()).unwrap_err()), 705);
    assert!(sim.peer_violations()[0]
        .reason
        .contains("cuMemPoolSetAccess"));
    // SAFETY: this test's pool.
    unsafe { drv.mempool_set_access(pool, 1, AccessFlags::Read) }.unwrap();
    dtod(&d1, dst, p, MIB, s1.raw()).unwrap();
    assert!(dtod(&d1, p, dst, MIB, s1.raw()).is_err(), "read-only");
    s1.synchronize().unwrap();
    // SAFETY: `p` is this test's pool allocation, freed once after the copies
    // that used it ran; then the pool, destroyed once.
    unsafe {
        drv.mem_free_async(p, s0.raw()).unwrap();
        s0.synchronize().unwrap();
        drv.mempool_destroy(pool).unwrap();
    }

    // VMM memory: the mapping's grant for the device that touches it.
    let g = drv.vmm_granularity(0, true).unwrap();
    let va = drv.vmm_reserve(g, 0).unwrap();
    let h = drv.vmm_create(0, g, Default::default()).unwrap();
    // SAFETY: the physical memory and the reservation just made, mapped once.
    unsafe {
        drv.vmm_map(va, g, 0, h).unwrap();
        drv.vmm_set_access(va, g, 0, AccessFlags::ReadWrite)
            .unwrap();
    }
    assert_eq!(code(dtod(&d1, dst, va, MIB, s1.raw()).unwrap_err()), 705);
    assert!(sim
        .peer_violations()
        .last()
        .unwrap()
        .reason
        .contains("cuMemSetAccess"));
    // SAFETY: the mapping made above.
    unsafe { drv.vmm_set_access(va, g, 1, AccessFlags::ReadWrite) }.unwrap();
    peer_copy(&d1, (dst, 1), (va, 0), MIB, s1.raw()).unwrap();
    s1.synchronize().unwrap();
    // SAFETY: the mapping, the physical memory, the reservation and `dst`
    // are this test's, each ended once; the copy that used them has run.
    unsafe {
        drv.vmm_unmap(va, g).unwrap();
        drv.vmm_release(h).unwrap();
        drv.vmm_free_address(va, g).unwrap();
        drv.mem_free(1, dst).unwrap();
    }
    assert_eq!(sim.physical_bytes(), 0);
}

#[test]
fn address_range_and_retained_handle_name_the_allocation() {
    let (device, sim) = common::device(false);
    let drv = device.driver();
    let o = device.ordinal();
    let p = drv.mem_alloc(o, 3000).unwrap();
    let (base, size) = drv.mem_address_range(p.offset(1000)).unwrap();
    assert_eq!(base, p);
    assert!(size >= 3000, "{size}");
    assert!(
        drv.vmm_retain_handle(p).is_err(),
        "cuMemAlloc memory has no VMM handle"
    );
    // SAFETY: `p` is this test's allocation, freed once.
    unsafe { drv.mem_free(o, p) }.unwrap();

    let g = drv.vmm_granularity(o, true).unwrap();
    let va = drv.vmm_reserve(3 * g, 0).unwrap();
    let h1 = drv.vmm_create(o, g, Default::default()).unwrap();
    let h2 = drv.vmm_create(o, 2 * g, Default::default()).unwrap();
    // SAFETY: the physical memory and the reservation just made, each part
    // of the reservation mapped once.
    unsafe {
        drv.vmm_map(va, g, 0, h1).unwrap();
        drv.vmm_map(va.offset(g), 2 * g, 0, h2).unwrap();
        drv.vmm_set_access(va, 3 * g, o, AccessFlags::ReadWrite)
            .unwrap();
    }
    assert_eq!(drv.mem_address_range(va.offset(g - 1)).unwrap(), (va, g));
    assert_eq!(
        drv.mem_address_range(va.offset(3 * g - 1)).unwrap(),
        (va.offset(g), 2 * g)
    );
    let r1 = drv.vmm_retain_handle(va).unwrap();
    let r2 = drv.vmm_retain_handle(va.offset(g)).unwrap();
    let r2_last = drv.vmm_retain_handle(va.offset(3 * g - 1)).unwrap();
    assert_eq!((r1, r2, r2_last), (h1, h2, h2), "the handles cuMemMap got");
    // Each retain owes a release; the memory lives while mapped.
    for h in [r1, r2, r2_last, h1, h2] {
        // SAFETY: each create and retain above is released once.
        unsafe { drv.vmm_release(h) }.unwrap();
    }
    if let Some(sim) = &sim {
        assert_eq!(sim.physical_bytes(), 3 * g, "still mapped");
        // SAFETY: a release too many, on purpose, on the simulator only,
        // which refuses a handle it does not hold.
        let again = unsafe { drv.vmm_release(h1) };
        assert!(again.is_err(), "every release was owed once");
    }
    // SAFETY: the two mappings and the reservation made above, each ended
    // once.
    unsafe {
        drv.vmm_unmap(va, g).unwrap();
        drv.vmm_unmap(va.offset(g), 2 * g).unwrap();
        drv.vmm_free_address(va, 3 * g).unwrap();
    }
    if let Some(sim) = &sim {
        assert_eq!(sim.physical_bytes(), 0);
    }
}
