//! The upstream resources against the shared resource suite, on the simulated
//! device or (with GPUMEM_DEVICE=cuda) the real GPU.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::suite;
use gpumem::resource::{
    CallbackResource, DeviceResource, ManagedResource, MemoryResource, PinnedHostResource,
    Properties, SamHeadroomResource, SystemResource,
};
use gpumem::{Backend, DevicePtr, Error, FreeError};

#[test]
fn device_resource_passes_the_suite() {
    let (device, _) = common::device(false);
    suite::run_all(Arc::new(DeviceResource::new(device)));
}

#[test]
fn pinned_host_resource_passes_the_suite() {
    let (device, _) = common::device(true);
    let mr = PinnedHostResource::new(device);
    assert_eq!(mr.properties(), Properties::HOST_AND_DEVICE);
    assert!(!mr.flags().write_combined, "not write-combined by default");
    suite::run_all(Arc::new(mr));
}

#[test]
fn managed_resource_passes_the_suite() {
    let (device, _) = common::device(true);
    let mr = Arc::new(ManagedResource::new(device.clone()));
    if device.backend() == Backend::Cuda {
        suite::run_all_but_huge(mr);
    } else {
        suite::run_all(mr);
    }
}

#[test]
fn system_resource_passes_the_suite_and_rejects_bad_frees() {
    let (device, _) = common::device(false);
    let mr = Arc::new(SystemResource::new(device.clone()).unwrap());
    suite::run_all(mr.clone());
    assert_eq!(mr.live_allocations(), 0, "everything freed");
    let s = device.create_stream().unwrap();
    let p = mr.allocate(1000, 64, &s).unwrap();
    // Host memory: the pointer is directly usable.
    let err = mr.deallocate(p, 999, 64, &s).unwrap_err();
    assert_eq!(
        err,
        Error::InvalidFree {
            ptr: p.0,
            reason: FreeError::SizeMismatch {
                allocated: 1000,
                freed: 999
            }
        }
    );
    let bogus = DevicePtr(p.0 + 256);
    assert!(matches!(
        mr.deallocate(bogus, 1000, 64, &s),
        Err(Error::InvalidFree {
            reason: FreeError::Unknown,
            ..
        })
    ));
    mr.deallocate(p, 1000, 64, &s).unwrap();
    assert!(matches!(
        mr.deallocate(p, 1000, 64, &s),
        Err(Error::InvalidFree { .. })
    ));
}

#[test]
fn sam_headroom_splits_preferred_location() {
    let (device, _) = common::device(false);
    if !device.info().unwrap().pageable_memory_access {
        eprintln!("sam_headroom: device has no pageable memory access; checking the split only");
    }
    let mr = SamHeadroomResource::new(device.clone(), 1 << 30).unwrap();
    // 3 GiB free, 1 GiB headroom: 2 GiB may live on the GPU.
    assert_eq!(mr.split(1 << 20, 3 << 30), (1 << 20, 0));
    assert_eq!(mr.split(3 << 30, 3 << 30), (2 << 30, 1 << 30));
    assert_eq!(mr.split(4096, 512 << 20), (0, 4096));
    assert_eq!(
        mr.split(1000, 1 << 40).0 % 256,
        0,
        "gpu part is 256-aligned"
    );
    if device.info().unwrap().pageable_memory_access {
        suite::run_all(Arc::new(mr));
    }
}

#[test]
fn callback_resource_forwards_to_closures() {
    let (device, _) = common::device(false);
    let upstream = Arc::new(DeviceResource::new(device.clone()));
    let allocs = Arc::new(AtomicUsize::new(0));
    let frees = Arc::new(AtomicUsize::new(0));
    let (u1, u2, a, f) = (
        upstream.clone(),
        upstream.clone(),
        allocs.clone(),
        frees.clone(),
    );
    let mr = CallbackResource::new(
        device,
        Properties::DEVICE,
        move |bytes, align, s| {
            a.fetch_add(1, Ordering::Relaxed);
            u1.allocate(bytes, align, s)
        },
        move |p, bytes, align, s| {
            f.fetch_add(1, Ordering::Relaxed);
            u2.deallocate(p, bytes, align, s)
        },
    );
    let mr = Arc::new(mr);
    suite::run_all(mr.clone());
    assert!(allocs.load(Ordering::Relaxed) > 100);
    assert!(frees.load(Ordering::Relaxed) > 100);
}

#[test]
fn identity_sees_through_wrappers() {
    let (device, _) = common::device(false);
    let a = Arc::new(DeviceResource::new(device.clone()));
    let b = Arc::new(DeviceResource::new(device));
    let a2 = a.clone();
    assert!(a.is_equal(&a2));
    assert!(a.is_equal(&*a2));
    assert!(!a.is_equal(&b));
    let dynamic: Arc<dyn MemoryResource> = a.clone();
    assert!(dynamic.is_equal(&a));
}

#[test]
fn injected_out_of_memory_is_an_error_and_loses_nothing() {
    let (device, sim) = common::device(false);
    let Some(sim) = common::sim_only(sim, "injected_out_of_memory") else {
        return;
    };
    let mr = DeviceResource::new(device.clone());
    let s = device.create_stream().unwrap();
    let before = sim.device_bytes(0);
    sim.fail_nth_alloc(2);
    let a = mr.allocate(1 << 20, 256, &s).unwrap();
    let err = mr.allocate(1 << 20, 256, &s).unwrap_err();
    assert_eq!(err.oom_info().unwrap().requested, 1 << 20);
    assert_eq!(err.oom_info().unwrap().device, Some(0));
    let c = mr.allocate(1 << 20, 256, &s).unwrap();
    assert_eq!(sim.device_bytes(0), before + (2 << 20));
    mr.deallocate(a, 1 << 20, 256, &s).unwrap();
    mr.deallocate(c, 1 << 20, 256, &s).unwrap();
    assert_eq!(sim.device_bytes(0), before);
}

#[test]
fn injected_driver_error_names_the_call() {
    let (device, sim) = common::device(false);
    let Some(sim) = common::sim_only(sim, "injected_driver_error") else {
        return;
    };
    let mr = DeviceResource::new(device.clone());
    let s = device.create_stream().unwrap();
    let p = mr.allocate(4096, 256, &s).unwrap();
    sim.fail_call("cuMemFree", 1, 700);
    match mr.deallocate(p, 4096, 256, &s) {
        Err(Error::Driver { call, code, .. }) => {
            assert_eq!(call, "cuMemFree");
            assert_eq!(code, 700);
        }
        other => panic!("expected a driver error, got {other:?}"),
    }
    // The failed call changed nothing: the memory can still be freed.
    mr.deallocate(p, 4096, 256, &s).unwrap();
}
