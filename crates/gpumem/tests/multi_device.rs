//! Several devices in one process: the registry, the managers and the pools
//! serve each device with its own memory, and a pointer freed on the wrong
//! device is refused there and stays live where it belongs. On two simulated
//! devices by default, on the first two GPUs with `GPUMEM_DEVICE=cuda`.

mod common;

use std::sync::Arc;

use gpumem::async_pool::{AsyncResource, AsyncResourceConfig};
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::{AccessFlags, DevicePtr};
use gpumem::manager::{DeviceAllocatorMode, MemoryManager};
use gpumem::pool::{PoolResource, VirtualPool, VirtualPoolConfig};
use gpumem::registry::Registry;
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, Error, FreeError};

const MIB: usize = 1 << 20;

fn refused_as_unknown(r: gpumem::Result<()>, what: &str) {
    match r {
        Err(Error::InvalidFree {
            reason: FreeError::Unknown,
            ..
        }) => {}
        other => panic!("{what}: expected an unknown-pointer refusal, got {other:?}"),
    }
}

/// Bytes the simulator charges to `device` (0 on a real GPU: not checked).
fn held(sim: &Option<Arc<SimDriver>>, device: &Device) -> Option<usize> {
    sim.as_ref().map(|s| s.device_bytes(device.ordinal()))
}

/// `r0` and `r1` serve devices 0 and 1: each allocation takes its own
/// device's memory, and each refuses the other's pointer, which stays live.
fn each_its_own(
    what: &str,
    sim: &Option<Arc<SimDriver>>,
    (d0, r0): (&Device, &dyn MemoryResource),
    (d1, r1): (&Device, &dyn MemoryResource),
) {
    let s0 = d0.create_stream().unwrap();
    let s1 = d1.create_stream().unwrap();
    let before1 = held(sim, d1);
    let p0 = r0.allocate(MIB, 256, &s0).unwrap();
    assert_eq!(held(sim, d1), before1, "{what}: device 1 untouched");
    let before0 = held(sim, d0);
    let p1 = r1.allocate(MIB, 256, &s1).unwrap();
    assert_eq!(held(sim, d0), before0, "{what}: device 0 untouched");
    assert_eq!(r0.device().ordinal(), d0.ordinal());
    assert_eq!(r1.device().ordinal(), d1.ordinal());

    refused_as_unknown(r1.deallocate(p0, MIB, 256, &s1), what);
    refused_as_unknown(r0.deallocate(p1, MIB, 256, &s0), what);
    // Nothing lost: each frees where it belongs.
    r0.deallocate(p0, MIB, 256, &s0).unwrap();
    r1.deallocate(p1, MIB, 256, &s1).unwrap();
    s0.synchronize().unwrap();
    s1.synchronize().unwrap();
}

#[test]
fn the_registry_serves_each_device_with_its_own_resource() {
    let Some((d0, d1, sim)) = common::two_devices(SimConfig::default()) else {
        return;
    };
    let reg = Registry::for_device(&d0).unwrap();
    assert!(reg.device_count() >= 2);
    let r0 = reg.device_resource(d0.ordinal()).unwrap();
    let r1 = reg.device_resource(d1.ordinal()).unwrap();
    each_its_own("registry", &sim, (&d0, &*r0), (&d1, &*r1));
    // A resource of one device cannot be set for another.
    assert!(matches!(
        reg.set_device_resource(d1.ordinal(), r0.clone()),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn every_pool_serves_only_its_device() {
    let Some((d0, d1, sim)) = common::two_devices(SimConfig::default()) else {
        return;
    };
    let p0 = PoolResource::with_defaults(DeviceResource::new(d0.clone())).unwrap();
    let p1 = PoolResource::with_defaults(DeviceResource::new(d1.clone())).unwrap();
    each_its_own("pool", &sim, (&d0, &p0), (&d1, &p1));
    let v0 = VirtualPool::new(d0.clone(), VirtualPoolConfig::default()).unwrap();
    let v1 = VirtualPool::new(d1.clone(), VirtualPoolConfig::default()).unwrap();
    each_its_own("vpool", &sim, (&d0, &v0), (&d1, &v1));
    let a0 = AsyncResource::with_defaults(d0.clone()).unwrap();
    let a1 = AsyncResource::with_defaults(d1.clone()).unwrap();
    each_its_own("async", &sim, (&d0, &a0), (&d1, &a1));
}

#[test]
fn each_device_has_its_own_manager() {
    let Some((d0, d1, sim)) = common::two_devices(SimConfig::default()) else {
        return;
    };
    for mode in [
        DeviceAllocatorMode::Pool,
        DeviceAllocatorMode::AsyncStreamOrdered,
        DeviceAllocatorMode::CudaAsyncPool,
    ] {
        let m0 = MemoryManager::new(d0.clone());
        let m1 = MemoryManager::new(d1.clone());
        m0.set_device_allocator_mode(mode).unwrap();
        m1.set_device_allocator_mode(mode).unwrap();
        let before1 = held(&sim, &d1);
        let p0 = m0.allocate_device(MIB).unwrap();
        assert_eq!(held(&sim, &d1), before1, "{mode}");
        let p1 = m1.allocate_device(MIB).unwrap();
        assert!(m1.device_reserved_bytes() >= MIB, "{mode}");
        refused_as_unknown(m1.free_device(p0), "manager");
        assert_eq!(m0.outstanding_device(), vec![(p0, MIB)], "{mode}");
        m0.free_device(p0).unwrap();
        m1.free_device(p1).unwrap();
        assert!(m0.shutdown().unwrap().outstanding_device.is_empty());
        assert!(m1.shutdown().unwrap().outstanding_device.is_empty());
    }
}

#[test]
fn the_global_managers_are_one_per_device() {
    let global = MemoryManager::global();
    let own = global.device().ordinal();
    assert!(std::ptr::eq(
        MemoryManager::global_for(own).unwrap(),
        global
    ));
    let count = global.device().driver().device_count().unwrap();
    assert!(matches!(
        MemoryManager::global_for(count),
        Err(Error::NoSuchDevice { device, .. }) if device == count
    ));
    if let Some(other) = (0..count).find(|&d| d != own) {
        let m = MemoryManager::global_for(other).unwrap();
        assert_eq!(m.device().ordinal(), other);
        assert!(std::ptr::eq(MemoryManager::global_for(other).unwrap(), m));
    }
}

/// Writes a pattern into `block` (memory of `d0`) and has `d1` copy it into
/// memory of its own with a peer copy run by `d1`: `Ok` with the bytes
/// checked, or the driver's refusal.
fn peer_reads(d0: &Device, d1: &Device, block: DevicePtr, n: usize) -> gpumem::Result<()> {
    let drv = d0.driver();
    let (s0, s1) = (d0.create_stream().unwrap(), d1.create_stream().unwrap());
    let data = common::random_bytes(n, block.0);
    // SAFETY: `data` outlives the copy: `s0` is synchronized below.
    unsafe { drv.memcpy_htod_async(block, data.as_ptr(), n, s0.raw()) }.unwrap();
    s0.synchronize().unwrap();
    let dst = drv.mem_alloc(d1.ordinal(), n).unwrap();
    // SAFETY: device memory only; synchronized before it is freed.
    let copied =
        unsafe { drv.memcpy_peer_async(dst, d1.ordinal(), block, d0.ordinal(), n, s1.raw()) };
    let mut back = vec![0u8; n];
    if copied.is_ok() {
        // SAFETY: `back` outlives the copy: `s1` is synchronized below.
        unsafe { drv.memcpy_dtoh_async(back.as_mut_ptr(), dst, n, s1.raw()) }.unwrap();
    }
    s1.synchronize().unwrap();
    // SAFETY: `dst` is this function's allocation, freed once; `s1`, which ran the copies, is synchronized.
    unsafe { drv.mem_free(d1.ordinal(), dst) }.unwrap();
    copied?;
    assert!(back == data, "the bytes of {block:#x} arrived on device 1");
    Ok(())
}

/// Two backed devices that reach each other, or `None` (two GPUs that do not).
fn reaching_pair() -> Option<(Device, Device, Option<Arc<SimDriver>>)> {
    let (d0, d1, sim) = common::two_devices(SimConfig::backed(256 << 20))?;
    if !d1
        .driver()
        .can_access_peer(d1.ordinal(), d0.ordinal())
        .unwrap()
    {
        eprintln!("the two GPUs cannot reach each other: no peer access to test");
        return None;
    }
    Some((d0, d1, sim))
}

/// Checks that `d1` reading `block` without `grant` is refused: on the
/// simulator only (a GPU would fault).
fn refused_without(
    sim: &Option<Arc<SimDriver>>,
    (d0, d1): (&Device, &Device),
    block: DevicePtr,
    grant: &str,
) {
    let Some(sim) = sim else {
        return;
    };
    match peer_reads(d0, d1, block, MIB) {
        Err(Error::Driver { code: 705, .. }) => {}
        other => panic!("expected a refused peer touch, got {other:?}"),
    }
    let v = sim.peer_violations();
    assert!(v.last().unwrap().reason.contains(grant), "{v:?}");
}

#[test]
fn a_virtual_pool_maps_every_page_for_its_peers() {
    let Some((d0, d1, sim)) = reaching_pair() else {
        return;
    };
    let mut config = VirtualPoolConfig::default();
    config.peers = vec![d1.ordinal()];
    let pool = VirtualPool::new(d0.clone(), config).unwrap();
    let s = d0.create_stream().unwrap();
    // Frees and sizes that send pages through the cache, aliases and new
    // extents; every block handed out must be open to the peer.
    let mut live = Vec::new();
    for (i, n) in [
        3 * MIB,
        5 * MIB,
        700_000,
        6 * MIB,
        2 * MIB,
        9 * MIB,
        4096,
        3 * MIB,
    ]
    .into_iter()
    .enumerate()
    {
        let p = pool.allocate(n, 256, &s).unwrap();
        peer_reads(&d0, &d1, p, n).unwrap();
        live.push((p, n));
        if i % 2 == 1 {
            let (q, m) = live.remove(0);
            pool.deallocate(q, m, 256, &s).unwrap();
        }
    }
    for (p, n) in live {
        pool.deallocate(p, n, 256, &s).unwrap();
    }
    s.synchronize().unwrap();
    assert!(pool.stats().aliases_made >= 1, "an alias was mapped too");

    let alone = VirtualPool::new(d0.clone(), VirtualPoolConfig::default()).unwrap();
    let p = alone.allocate(MIB, 256, &s).unwrap();
    refused_without(&sim, (&d0, &d1), p, "cuMemSetAccess");
    alone.deallocate(p, MIB, 256, &s).unwrap();
}

#[test]
fn a_stream_ordered_pool_grants_its_peers() {
    let Some((d0, d1, sim)) = reaching_pair() else {
        return;
    };
    let mut config = AsyncResourceConfig::default();
    config.peers = vec![d1.ordinal()];
    let pool = AsyncResource::new(d0.clone(), config).unwrap();
    assert_eq!(pool.access(d1.ordinal()).unwrap(), AccessFlags::ReadWrite);
    let s = d0.create_stream().unwrap();
    let p = pool.allocate(MIB, 256, &s).unwrap();
    peer_reads(&d0, &d1, p, MIB).unwrap();
    pool.deallocate(p, MIB, 256, &s).unwrap();

    let alone = AsyncResource::with_defaults(d0.clone()).unwrap();
    let p = alone.allocate(MIB, 256, &s).unwrap();
    refused_without(&sim, (&d0, &d1), p, "cuMemPoolSetAccess");
    alone.deallocate(p, MIB, 256, &s).unwrap();
    s.synchronize().unwrap();
}

#[test]
fn pools_over_cuda_memory_serve_a_peer_once_the_device_grants_it() {
    let Some((d0, d1, sim)) = reaching_pair() else {
        return;
    };
    let pool = PoolResource::with_defaults(DeviceResource::new(d0.clone())).unwrap();
    let s = d0.create_stream().unwrap();
    let p = pool.allocate(MIB, 256, &s).unwrap();
    refused_without(&sim, (&d0, &d1), p, "cuCtxEnablePeerAccess");
    d0.grant_peer_access(d1.ordinal()).unwrap();
    d0.grant_peer_access(d1.ordinal()).unwrap();
    peer_reads(&d0, &d1, p, MIB).unwrap();
    assert!(matches!(
        d0.grant_peer_access(d0.ordinal()),
        Err(Error::InvalidArgument(_))
    ));
    pool.deallocate(p, MIB, 256, &s).unwrap();
}

/// gpumem runs inside applications that keep a current device of their own
/// (PyTorch's `cudaSetDevice`): whatever it does on another device, or for
/// a peer, leaves the thread's current device as it was. (A context left on
/// the peer sent PyTorch's next kernels to the other GPU.)
#[test]
fn calls_for_another_device_leave_the_current_device_alone() {
    let Some((d0, d1, _sim)) = reaching_pair() else {
        return;
    };
    let driver = d0.driver();
    for (home, other) in [(&d0, &d1), (&d1, &d0)] {
        driver.set_current_device(home.ordinal()).unwrap();
        // A pool on the other device whose pages its peer (home) may use:
        // creating, mapping and granting access bind both devices' contexts.
        let mut config = VirtualPoolConfig::default();
        config.peers = vec![home.ordinal()];
        let pool = VirtualPool::new(other.clone(), config).unwrap();
        let s = other.create_stream().unwrap();
        let p = pool.allocate(3 * MIB, 256, &s).unwrap();
        let plain = DeviceResource::new(other.clone());
        let q = plain.allocate(MIB, 256, &s).unwrap();
        assert_eq!(
            driver.current_device().unwrap(),
            home.ordinal(),
            "after allocating"
        );
        plain.deallocate(q, MIB, 256, &s).unwrap();
        pool.deallocate(p, 3 * MIB, 256, &s).unwrap();
        s.synchronize().unwrap();
        drop(pool);
        assert_eq!(
            driver.current_device().unwrap(),
            home.ordinal(),
            "after freeing"
        );
    }
}
