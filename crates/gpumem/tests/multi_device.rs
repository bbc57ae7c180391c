//! Several devices in one process: the registry, the managers and the pools
//! serve each device with its own memory, and a pointer freed on the wrong
//! device is refused there and stays live where it belongs. On two simulated
//! devices by default, on the first two GPUs with `GPUMEM_DEVICE=cuda`.

mod common;

use std::sync::Arc;

use gpumem::async_pool::AsyncResource;
use gpumem::driver::sim::{SimConfig, SimDriver};
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
