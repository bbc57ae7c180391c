//! The CUDA backend on a real GPU. Runs only with `GPUMEM_DEVICE=cuda`
//! (device `GPUMEM_CUDA_DEVICE`, default 0); otherwise each test prints
//! "skipped: GPUMEM_DEVICE is not cuda" and passes.
//!
//! Each test is independent (the harness runs them on several threads at
//! once, which also exercises the per-thread context handling); tests that
//! read pool counters use their own pool, except the default-pool test, which
//! asserts lower bounds only.

use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use gpumem::driver::cuda::CudaDriver;
use gpumem::driver::{
    AccessFlags, AllocationType, DevicePtr, Driver, HandleType, HostAllocFlags, Location, PoolAttr,
    PoolProps, RawStream,
};
use gpumem::Error;

/// Test shorthand for the driver's `unsafe` memset and device copy.
///
/// SAFETY (for every use in this file): the tests only pass ranges of memory
/// they allocated and keep alive until they synchronize, and read host-side
/// memory only after that.
trait DataOps {
    fn memset(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: RawStream,
    ) -> gpumem::Result<()>;
    fn dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> gpumem::Result<()>;
}

impl<D: Driver + ?Sized> DataOps for D {
    fn memset(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: RawStream,
    ) -> gpumem::Result<()> {
        // SAFETY: see the trait documentation.
        unsafe { self.memset_async(dst, value, bytes, stream) }
    }
    fn dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> gpumem::Result<()> {
        // SAFETY: see the trait documentation.
        unsafe { self.memcpy_dtod_async(dst, src, bytes, stream) }
    }
}

const MIB: usize = 1 << 20;

/// The driver and device ordinal, or `None` (after printing why) when the
/// tests are not asked to run on CUDA.
fn cuda() -> Option<(Arc<CudaDriver>, u32)> {
    if std::env::var(gpumem::device::DEVICE_ENV).as_deref() != Ok("cuda") {
        println!("skipped: GPUMEM_DEVICE is not cuda");
        return None;
    }
    let ordinal = std::env::var(gpumem::device::ORDINAL_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let drv = CudaDriver::get().expect("GPUMEM_DEVICE=cuda but the CUDA driver did not load");
    Some((drv, ordinal))
}

/// Copies `bytes` of device memory at `src` back to the host.
fn read_back(drv: &CudaDriver, src: DevicePtr, bytes: usize, stream: RawStream) -> Vec<u8> {
    let mut v = vec![0u8; bytes];
    // SAFETY: `v` is `bytes` writable bytes, untouched until the synchronize.
    unsafe { drv.memcpy_dtoh_async(v.as_mut_ptr(), src, bytes, stream) }.unwrap();
    // SAFETY: the tests pass their own live streams.
    unsafe { drv.stream_synchronize(stream) }.unwrap();
    v
}

/// Copies `data` to device memory at `dst` and waits.
fn write(drv: &CudaDriver, dst: DevicePtr, data: &[u8], stream: RawStream) {
    // SAFETY: `data` is readable and outlives the synchronize below.
    unsafe { drv.memcpy_htod_async(dst, data.as_ptr(), data.len(), stream) }.unwrap();
    // SAFETY: the tests pass their own live streams.
    unsafe { drv.stream_synchronize(stream) }.unwrap();
}

fn pattern(bytes: usize, seed: u8) -> Vec<u8> {
    (0..bytes)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn device_info_and_limits() {
    let Some((drv, dev)) = cuda() else { return };
    assert!(drv.device_count().unwrap() > dev);
    println!("driver version {}", drv.driver_version().unwrap());
    let info = drv.device_info(dev).unwrap();
    println!("{info:?}");
    assert_eq!(info.ordinal, dev);
    assert!(!info.name.is_empty());
    assert!(info.total_memory > 0);
    assert!(
        info.compute_capability.0 >= 5,
        "{:?}",
        info.compute_capability
    );
    let mem = drv.mem_info(dev).unwrap();
    assert!(mem.free <= mem.total && mem.total > 0, "{mem:?}");
    assert_eq!(mem.total, info.total_memory);
    let min = drv.vmm_granularity(dev, false).unwrap();
    let rec = drv.vmm_granularity(dev, true).unwrap();
    assert!(min.is_power_of_two() && rec >= min, "{min} {rec}");
    if info.name.contains("H100") || info.name.contains("H200") {
        assert_eq!(info.compute_capability, (9, 0));
        assert!(info.memory_pools && info.vmm && info.managed_memory);
        assert!(info.posix_fd_ipc);
        assert_eq!(min, 2 * MIB);
        assert_eq!(rec, 2 * MIB);
    }
    assert!(drv.can_access_peer(dev, dev).unwrap());
    drv.set_current_device(dev).unwrap();
    assert_eq!(drv.current_device().unwrap(), dev);
    drv.device_synchronize(dev).unwrap();

    let count = drv.device_count().unwrap();
    assert_eq!(
        drv.mem_alloc(count, 256),
        Err(Error::NoSuchDevice {
            device: count,
            count
        })
    );
}

#[test]
fn alloc_free_zero_and_oom() {
    let Some((drv, dev)) = cuda() else { return };
    let p = drv.mem_alloc(dev, MIB).unwrap();
    assert!(!p.is_null());
    assert_eq!(p.addr() % 256, 0);
    // SAFETY: `p` was just allocated, freed once.
    unsafe { drv.mem_free(dev, p) }.unwrap();

    assert_eq!(drv.mem_alloc(dev, 0).unwrap(), DevicePtr::NULL);
    // SAFETY: null is allowed.
    unsafe { drv.mem_free(dev, DevicePtr::NULL) }.unwrap();

    let e = drv.mem_alloc(dev, 1 << 50).unwrap_err();
    let info = e
        .oom_info()
        .unwrap_or_else(|| panic!("expected OOM, got {e:?}"));
    assert_eq!(info.requested, 1 << 50);
    assert_eq!(info.device, Some(dev));
    // The device still works after the failed request.
    let p = drv.mem_alloc(dev, 4096).unwrap();
    // SAFETY: `p` was just allocated, freed once.
    unsafe { drv.mem_free(dev, p) }.unwrap();
}

#[test]
fn streams_events_and_cross_stream_wait() {
    let Some((drv, dev)) = cuda() else { return };
    // SAFETY: the streams, the event and the allocations are this test's, each destroyed or freed once after its last use (the copies have run: read back); destroying the default stream is refused, as the contract says.
    unsafe {
        let s1 = drv.stream_create(dev, true).unwrap();
        let s2 = drv.stream_create(dev, false).unwrap();
        let ev = drv.event_create(dev).unwrap();
        assert!(
            drv.event_query(ev).unwrap(),
            "a never-recorded event is complete"
        );

        let bytes = 64 * MIB;
        let a = drv.mem_alloc(dev, bytes).unwrap();
        let b = drv.mem_alloc(dev, bytes).unwrap();
        drv.memset(a, 0x3C, bytes, s1).unwrap();
        drv.event_record(ev, s1).unwrap();
        drv.stream_wait_event(s2, ev).unwrap();
        drv.dtod(b, a, bytes, s2).unwrap();
        drv.stream_synchronize(s2).unwrap();
        assert!(drv.event_query(ev).unwrap());
        drv.event_synchronize(ev).unwrap();
        assert!(drv.stream_query(s1).unwrap());
        assert!(drv.stream_query(s2).unwrap());
        let got = read_back(&drv, b, bytes, s2);
        assert!(got.iter().all(|x| *x == 0x3C));

        assert!(matches!(
            drv.stream_destroy(0),
            Err(Error::InvalidArgument(_))
        ));
        drv.mem_free(dev, a).unwrap();
        drv.mem_free(dev, b).unwrap();
        drv.event_destroy(ev).unwrap();
        drv.stream_destroy(s1).unwrap();
        drv.stream_destroy(s2).unwrap();
    }
}

#[test]
fn memset_and_copies_round_trip() {
    let Some((drv, dev)) = cuda() else { return };
    let s = drv.stream_create(dev, true).unwrap();
    let bytes = MIB + 123;
    let a = drv.mem_alloc(dev, bytes).unwrap();
    let b = drv.mem_alloc(dev, bytes).unwrap();

    drv.memset(a, 0xAB, bytes, s).unwrap();
    assert!(read_back(&drv, a, bytes, s).iter().all(|x| *x == 0xAB));

    let data = pattern(bytes, 7);
    write(&drv, a, &data, s);
    drv.dtod(b, a, bytes, s).unwrap();
    assert_eq!(read_back(&drv, b, bytes, s), data);

    // A sub-range at an odd offset.
    drv.memset(b.offset(1001), 0, 77, s).unwrap();
    let got = read_back(&drv, b, bytes, s);
    assert_eq!(&got[..1001], &data[..1001]);
    assert!(got[1001..1078].iter().all(|x| *x == 0));
    assert_eq!(&got[1078..], &data[1078..]);

    // Zero-byte operations are no-ops.
    drv.memset(a, 1, 0, s).unwrap();
    drv.dtod(b, a, 0, s).unwrap();

    // SAFETY: the allocations and the stream are this test's, freed and
    // destroyed once; the work on them has run (read back).
    unsafe {
        drv.mem_free(dev, a).unwrap();
        drv.mem_free(dev, b).unwrap();
        drv.stream_destroy(s).unwrap();
    }
}

#[test]
fn pinned_host_memory() {
    let Some((drv, dev)) = cuda() else { return };
    let s = drv.stream_create(dev, true).unwrap();
    let bytes = 4 * MIB;
    let flags = HostAllocFlags {
        portable: true,
        device_map: true,
        write_combined: false,
    };
    let h = drv.mem_alloc_host(dev, bytes, flags).unwrap();
    assert!(!h.is_null());
    let d = drv.mem_alloc(dev, bytes).unwrap();
    let data = pattern(bytes, 3);
    // SAFETY: `h` is `bytes` of pinned host memory we own; nothing else uses it.
    let host = unsafe { std::slice::from_raw_parts_mut(h.as_mut_ptr::<u8>(), bytes) };
    host.copy_from_slice(&data);
    // SAFETY: pinned host memory stays valid until the synchronize.
    unsafe { drv.memcpy_htod_async(d, host.as_ptr(), bytes, s) }.unwrap();
    // SAFETY: `s` is this test's stream.
    unsafe { drv.stream_synchronize(s) }.unwrap();
    assert_eq!(read_back(&drv, d, bytes, s), data);

    // SAFETY: `h` is this test's, freed once; the copy from it has run and
    // `host` is not used any more.
    unsafe { drv.mem_free_host(h) }.unwrap();
    let wc = HostAllocFlags {
        write_combined: true,
        ..Default::default()
    };
    let h2 = drv.mem_alloc_host(dev, MIB, wc).unwrap();
    assert_eq!(drv.mem_alloc_host(dev, 0, flags).unwrap(), DevicePtr::NULL);
    // SAFETY: `h2`, `d` and `s` are this test's, freed and destroyed once
    // after their last use; null is allowed.
    unsafe {
        drv.mem_free_host(h2).unwrap();
        drv.mem_free_host(DevicePtr::NULL).unwrap();
        drv.mem_free(dev, d).unwrap();
        drv.stream_destroy(s).unwrap();
    }
}

#[test]
fn managed_memory_and_prefetch() {
    let Some((drv, dev)) = cuda() else { return };
    if !drv.device_info(dev).unwrap().managed_memory {
        println!("skipped: no managed memory");
        return;
    }
    let s = drv.stream_create(dev, true).unwrap();
    let bytes = 4 * MIB;
    let m = drv.mem_alloc_managed(dev, bytes).unwrap();
    // SAFETY: managed memory is host-accessible; no device work touches it yet.
    let host = unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr::<u8>(), bytes) };
    host.fill(0x11);
    // SAFETY: `s` is this test's stream.
    unsafe { drv.mem_prefetch(m, bytes, dev, s) }.unwrap();
    drv.memset(m.offset(MIB), 0x22, MIB, s).unwrap();
    // SAFETY: as above.
    unsafe { drv.stream_synchronize(s) }.unwrap();
    // SAFETY: the device work on `m` is complete (synchronized above).
    let host = unsafe { std::slice::from_raw_parts(m.as_mut_ptr::<u8>() as *const u8, bytes) };
    assert!(host[..MIB].iter().all(|x| *x == 0x11));
    assert!(host[MIB..2 * MIB].iter().all(|x| *x == 0x22));
    assert!(host[2 * MIB..].iter().all(|x| *x == 0x11));
    // SAFETY: `m` and `s` are this test's, freed and destroyed once; the
    // work on them has run and `host` is not used any more.
    unsafe {
        drv.mem_free(dev, m).unwrap();
        drv.stream_destroy(s).unwrap();
    }
}

#[test]
fn default_pool_alloc_and_attributes() {
    let Some((drv, dev)) = cuda() else { return };
    // SAFETY: the device's default pool lives as long as its context; the stream and the allocation are this test's, freed and destroyed once after their last use.
    unsafe {
        if !drv.device_info(dev).unwrap().memory_pools {
            println!("skipped: no memory pools");
            return;
        }
        let pool = drv.mempool_default(dev).unwrap();
        assert_ne!(pool, 0);
        assert_eq!(drv.mempool_current(dev).unwrap(), pool);

        drv.mempool_set_attr(pool, PoolAttr::ReleaseThreshold, u64::MAX)
            .unwrap();
        assert_eq!(
            drv.mempool_get_attr(pool, PoolAttr::ReleaseThreshold)
                .unwrap(),
            u64::MAX
        );
        // Reuse policies are booleans passed as int.
        assert_eq!(
            drv.mempool_get_attr(pool, PoolAttr::ReuseFollowEventDependencies)
                .unwrap(),
            1
        );
        drv.mempool_set_attr(pool, PoolAttr::ReuseAllowInternalDependencies, 0)
            .unwrap();
        assert_eq!(
            drv.mempool_get_attr(pool, PoolAttr::ReuseAllowInternalDependencies)
                .unwrap(),
            0
        );
        drv.mempool_set_attr(pool, PoolAttr::ReuseAllowInternalDependencies, 1)
            .unwrap();
        assert!(matches!(
            drv.mempool_set_attr(pool, PoolAttr::UsedMemCurrent, 0),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(
            drv.mempool_get_access(pool, dev).unwrap(),
            AccessFlags::ReadWrite
        );

        let s = drv.stream_create(dev, true).unwrap();
        let bytes = 8 * MIB;
        let p = drv.mem_alloc_async(bytes, s).unwrap();
        assert!(!p.is_null());
        assert!(
            drv.mempool_get_attr(pool, PoolAttr::UsedMemCurrent)
                .unwrap()
                >= bytes as u64
        );
        assert!(
            drv.mempool_get_attr(pool, PoolAttr::ReservedMemCurrent)
                .unwrap()
                >= bytes as u64
        );
        assert!(drv.mempool_get_attr(pool, PoolAttr::UsedMemHigh).unwrap() >= bytes as u64);
        drv.memset(p, 0x77, bytes, s).unwrap();
        assert!(read_back(&drv, p, bytes, s).iter().all(|x| *x == 0x77));
        drv.mem_free_async(p, s).unwrap();
        assert_eq!(drv.mem_alloc_async(0, s).unwrap(), DevicePtr::NULL);
        drv.mem_free_async(DevicePtr::NULL, s).unwrap();

        let e = drv.mem_alloc_async(1 << 50, s).unwrap_err();
        let info = e
            .oom_info()
            .unwrap_or_else(|| panic!("expected OOM, got {e:?}"));
        assert_eq!(info.requested, 1 << 50);
        assert_eq!(info.device, Some(dev));

        drv.stream_synchronize(s).unwrap();
        drv.mempool_set_attr(pool, PoolAttr::ReleaseThreshold, 0)
            .unwrap();
        drv.stream_destroy(s).unwrap();
    }
}

#[test]
fn custom_pool_trim_and_max_size() {
    let Some((drv, dev)) = cuda() else { return };
    // SAFETY: the pools, the stream and the allocation are this test's, each freed or destroyed once after its last use.
    unsafe {
        if !drv.device_info(dev).unwrap().memory_pools {
            println!("skipped: no memory pools");
            return;
        }
        let pool = drv.mempool_create(&PoolProps::device(dev)).unwrap();
        assert_ne!(pool, drv.mempool_default(dev).unwrap());
        drv.mempool_set_attr(pool, PoolAttr::ReleaseThreshold, u64::MAX)
            .unwrap();
        let s = drv.stream_create(dev, true).unwrap();
        let bytes = 32 * MIB;
        let p = drv.mem_alloc_from_pool_async(bytes, pool, s).unwrap();
        drv.memset(p, 0x42, bytes, s).unwrap();
        assert!(read_back(&drv, p, bytes, s).iter().all(|x| *x == 0x42));
        assert_eq!(
            drv.mempool_get_attr(pool, PoolAttr::UsedMemCurrent)
                .unwrap(),
            bytes as u64
        );
        drv.mem_free_async(p, s).unwrap();
        drv.stream_synchronize(s).unwrap();
        assert_eq!(
            drv.mempool_get_attr(pool, PoolAttr::UsedMemCurrent)
                .unwrap(),
            0
        );
        let reserved = drv
            .mempool_get_attr(pool, PoolAttr::ReservedMemCurrent)
            .unwrap();
        assert!(
            reserved >= bytes as u64,
            "threshold max keeps the memory: {reserved}"
        );
        drv.mempool_trim_to(pool, 0).unwrap();
        let after = drv
            .mempool_get_attr(pool, PoolAttr::ReservedMemCurrent)
            .unwrap();
        assert!(after < reserved, "trim_to(0): {reserved} -> {after}");
        assert!(
            drv.mempool_get_attr(pool, PoolAttr::ReservedMemHigh)
                .unwrap()
                >= bytes as u64
        );
        drv.mempool_set_attr(pool, PoolAttr::ReservedMemHigh, 0)
            .unwrap();
        drv.mempool_destroy(pool).unwrap();

        // A pool with a size limit refuses more than it may hold.
        let limited = drv
            .mempool_create(&PoolProps {
                max_size: 64 * MIB,
                ..PoolProps::device(dev)
            })
            .unwrap();
        let e = drv
            .mem_alloc_from_pool_async(128 * MIB, limited, s)
            .unwrap_err();
        let info = e
            .oom_info()
            .unwrap_or_else(|| panic!("expected OOM, got {e:?}"));
        assert_eq!(info.requested, 128 * MIB);
        assert_eq!(info.device, Some(dev));
        drv.stream_synchronize(s).unwrap();
        drv.mempool_destroy(limited).unwrap();
        drv.stream_destroy(s).unwrap();
    }
}

#[test]
fn pinned_host_pool() {
    let Some((drv, dev)) = cuda() else { return };
    // SAFETY: the pool, the stream and the allocation are this test's, each freed or destroyed once after its last use.
    unsafe {
        if !drv.device_info(dev).unwrap().memory_pools {
            println!("skipped: no memory pools");
            return;
        }
        let props = PoolProps {
            alloc_type: AllocationType::Pinned,
            location: Location::Host,
            handle_type: HandleType::None,
            max_size: 0,
        };
        match drv.mempool_create(&props) {
            Ok(pool) => {
                let s = drv.stream_create(dev, true).unwrap();
                let p = drv.mem_alloc_from_pool_async(MIB, pool, s).unwrap();
                drv.mem_free_async(p, s).unwrap();
                drv.stream_synchronize(s).unwrap();
                drv.mempool_destroy(pool).unwrap();
                drv.stream_destroy(s).unwrap();
            }
            // Host-located pools need a recent driver and HMM/ATS support.
            Err(e) => println!("host pool not available: {e}"),
        }
    }
}

#[test]
fn vmm_map_access_copy_unmap() {
    let Some((drv, dev)) = cuda() else { return };
    // SAFETY: the reservation and the physical handles are this test's: mapped into the reservation, unmapped once the copies have run (read back), then released and freed once.
    unsafe {
        if !drv.device_info(dev).unwrap().vmm {
            println!("skipped: no VMM");
            return;
        }
        let g = drv.vmm_granularity(dev, false).unwrap();
        let s = drv.stream_create(dev, true).unwrap();
        let va = drv.vmm_reserve(4 * g, 0).unwrap();
        assert!(!va.is_null());
        assert_eq!(va.addr() % g as u64, 0);
        let h1 = drv.vmm_create(dev, 2 * g, HandleType::None.into()).unwrap();
        let h2 = drv.vmm_create(dev, 2 * g, HandleType::None.into()).unwrap();
        drv.vmm_map(va, 2 * g, 0, h1).unwrap();
        drv.vmm_map(va.offset(2 * g), 2 * g, 0, h2).unwrap();
        drv.vmm_set_access(va, 4 * g, dev, AccessFlags::ReadWrite)
            .unwrap();

        drv.memset(va, 0x5A, 4 * g, s).unwrap();
        let data = pattern(g, 9);
        // Straddles the boundary between the two physical handles.
        write(&drv, va.offset(2 * g - g / 2), &data, s);
        let got = read_back(&drv, va, 4 * g, s);
        let start = 2 * g - g / 2;
        assert!(got[..start].iter().all(|x| *x == 0x5A));
        assert_eq!(&got[start..start + g], &data[..]);
        assert!(got[start + g..].iter().all(|x| *x == 0x5A));

        drv.vmm_unmap(va, 4 * g).unwrap();
        drv.vmm_release(h1).unwrap();
        drv.vmm_release(h2).unwrap();
        drv.vmm_free_address(va, 4 * g).unwrap();

        // Sizes off the granularity are the driver's to refuse, as an error value.
        if g > 1 {
            assert!(drv.vmm_create(dev, g + 1, HandleType::None.into()).is_err());
        }
        assert!(drv.vmm_reserve(0, 0).is_err());
        assert!(matches!(
            drv.vmm_reserve(g, 3),
            Err(Error::BadAlignment { alignment: 3 })
        ));
        drv.stream_destroy(s).unwrap();
    }
}

#[test]
fn ipc_export_to_posix_fd() {
    let Some((drv, dev)) = cuda() else { return };
    // SAFETY: the pool, the stream, the allocation and the physical handles are this test's, each destroyed, freed or released once after its last use.
    unsafe {
        let info = drv.device_info(dev).unwrap();
        if !info.posix_fd_ipc {
            println!("skipped: no POSIX fd IPC");
            return;
        }
        let pool = drv
            .mempool_create(&PoolProps {
                handle_type: HandleType::PosixFd,
                ..PoolProps::device(dev)
            })
            .unwrap();
        let fd = drv.mempool_export_fd(pool).unwrap();
        assert!(fd.as_raw_fd() >= 0);
        drop(fd);
        let s = drv.stream_create(dev, true).unwrap();
        let p = drv.mem_alloc_from_pool_async(MIB, pool, s).unwrap();
        drv.stream_synchronize(s).unwrap();
        let data = drv.mempool_export_pointer(p).unwrap();
        assert_ne!(data.0, [0u8; 64]);
        drv.mem_free_async(p, s).unwrap();
        drv.stream_synchronize(s).unwrap();
        drv.mempool_destroy(pool).unwrap();
        drv.stream_destroy(s).unwrap();

        let g = drv.vmm_granularity(dev, false).unwrap();
        let h = drv.vmm_create(dev, g, HandleType::PosixFd.into()).unwrap();
        let fd = drv.vmm_export_fd(h).unwrap();
        // Importing our own export gives a handle to the same memory.
        let h2 = drv.vmm_import_fd(fd.as_fd()).unwrap();
        drop(fd);
        drv.vmm_release(h2).unwrap();
        drv.vmm_release(h).unwrap();
    }
}

#[test]
fn fresh_threads_get_a_context() {
    let Some((drv, dev)) = cuda() else { return };
    // SAFETY: `s` and each thread's `own` are streams this test creates and destroys once, after every use; each allocation is freed once, on its stream.
    unsafe {
        let s = drv.stream_create(dev, true).unwrap();
        let handles: Vec<_> = (0..4)
            .map(|i| {
                let drv = drv.clone();
                std::thread::spawn(move || {
                    // First call on this thread takes only a stream: the backend
                    // must make a context current by itself.
                    assert!(drv.stream_query(s).is_ok());
                    let own = drv.stream_create(dev, true).unwrap();
                    for _ in 0..100 {
                        let p = drv.mem_alloc_async(4096 * (i + 1), own).unwrap();
                        drv.mem_free_async(p, own).unwrap();
                    }
                    drv.stream_synchronize(own).unwrap();
                    drv.stream_destroy(own).unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        drv.stream_destroy(s).unwrap();
    }
}
