//! Tests of the simulated device through the `Driver` trait and its test controls.

use super::*;
use crate::Error;
use proptest::prelude::*;

const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

fn sim() -> SimDriver {
    SimDriver::new(SimConfig::default())
}

fn backed() -> SimDriver {
    SimDriver::new(SimConfig::backed(64 * MIB))
}

/// The CUresult code of a driver error (panics on other errors: tests only).
fn code(e: Error) -> i32 {
    match e {
        Error::Driver { code, .. } => code,
        other => panic!("expected a driver error, got {other:?}"),
    }
}

fn put(d: &SimDriver, dst: DevicePtr, data: &[u8], s: RawStream) {
    // SAFETY: `data` outlives the copy: every test stream runs it at once or
    // is synchronized before `data` goes.
    unsafe { d.memcpy_htod_async(dst, data.as_ptr(), data.len(), s) }.unwrap();
}

fn get(d: &SimDriver, src: DevicePtr, n: usize) -> Vec<u8> {
    let mut v = vec![0xEEu8; n];
    // SAFETY: `v` is writable for `n` bytes and outlives the synchronize.
    unsafe { d.memcpy_dtoh_async(v.as_mut_ptr(), src, n, 0) }.unwrap();
    d.stream_synchronize(0).unwrap();
    v
}

fn assert_clean(d: &SimDriver) {
    assert_eq!(d.device_bytes(0), 0);
    assert_eq!(d.device_allocations(0), 0);
    assert_eq!(d.pinned_host_bytes(), 0);
    assert_eq!(d.host_allocations(), 0);
    assert_eq!(d.mapped_bytes(), 0);
    assert_eq!(d.physical_bytes(), 0);
    assert_eq!(d.reserved_va_bytes(), 0);
    assert_eq!(d.live_pools(), 0);
    assert_eq!(d.live_streams(), 0);
    assert_eq!(d.live_events(), 0);
}

#[test]
fn is_send_and_sync() {
    fn check<T: Send + Sync + 'static>() {}
    check::<SimDriver>();
    let _: Arc<dyn Driver> = Arc::new(sim());
}

use std::os::fd::AsFd;
use std::sync::Arc;

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
    ) -> crate::Result<()>;
    fn dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> crate::Result<()>;
}

impl<D: Driver + ?Sized> DataOps for D {
    fn memset(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: RawStream,
    ) -> crate::Result<()> {
        // SAFETY: see the trait documentation.
        unsafe { self.memset_async(dst, value, bytes, stream) }
    }
    fn dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: RawStream,
    ) -> crate::Result<()> {
        // SAFETY: see the trait documentation.
        unsafe { self.memcpy_dtod_async(dst, src, bytes, stream) }
    }
}

/// Safe forms, for these tests, of the driver's methods that are `unsafe` for
/// their raw handles: each is an inherent method of `SimDriver` with the
/// trait method's name, so a call on a `SimDriver` here (not through `dyn
/// Driver`) takes it (an inherent method wins over a trait method).
///
/// SAFETY (for every method the macro makes): the simulator never follows a
/// handle. A stream, event, pool or physical handle, and an address range,
/// is a key of its own tables, and one it does not hold is
/// refused with CUDA's error: the tests below pass stale and forged handles
/// on purpose to check exactly that (`stale_handles_are_refused` goes
/// through the trait itself). The memory the simulator frees for these
/// calls is its own, or host memory of a test that holds no reference
/// into it past the free.
macro_rules! safe_on_the_simulator {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        impl SimDriver {
            $(
                fn $name(&self, $($arg: $ty),*) -> crate::Result<$ret> {
                    // SAFETY: see `safe_on_the_simulator`.
                    unsafe { <Self as Driver>::$name(self, $($arg),*) }
                }
            )*
        }
    };
}

safe_on_the_simulator! {
    stream_destroy(stream: RawStream) -> ();
    stream_synchronize(stream: RawStream) -> ();
    stream_query(stream: RawStream) -> bool;
    event_destroy(event: RawEvent) -> ();
    event_record(event: RawEvent, stream: RawStream) -> ();
    event_query(event: RawEvent) -> bool;
    event_synchronize(event: RawEvent) -> ();
    stream_wait_event(stream: RawStream, event: RawEvent) -> ();
    mem_free(device: u32, ptr: DevicePtr) -> ();
    mem_free_host(ptr: DevicePtr) -> ();
    mem_prefetch(ptr: DevicePtr, bytes: usize, device: u32, stream: RawStream) -> ();
    mempool_destroy(pool: RawPool) -> ();
    mempool_set_attr(pool: RawPool, attr: PoolAttr, value: u64) -> ();
    mempool_get_attr(pool: RawPool, attr: PoolAttr) -> u64;
    mempool_trim_to(pool: RawPool, keep: usize) -> ();
    mempool_set_access(pool: RawPool, device: u32, access: AccessFlags) -> ();
    mempool_get_access(pool: RawPool, device: u32) -> AccessFlags;
    mem_alloc_from_pool_async(bytes: usize, pool: RawPool, stream: RawStream) -> DevicePtr;
    mem_alloc_async(bytes: usize, stream: RawStream) -> DevicePtr;
    mem_free_async(ptr: DevicePtr, stream: RawStream) -> ();
    mempool_export_fd(pool: RawPool) -> std::os::fd::OwnedFd;
    mempool_import_pointer(pool: RawPool, data: &PoolPtrExport) -> DevicePtr;
    vmm_free_address(ptr: DevicePtr, bytes: usize) -> ();
    vmm_release(handle: RawPhys) -> ();
    vmm_map(ptr: DevicePtr, bytes: usize, offset: usize, handle: RawPhys) -> ();
    vmm_unmap(ptr: DevicePtr, bytes: usize) -> ();
    vmm_set_access(ptr: DevicePtr, bytes: usize, device: u32, access: AccessFlags) -> ();
    vmm_export_fd(handle: RawPhys) -> std::os::fd::OwnedFd;
}

// ----- devices -----

#[test]
fn devices_and_features() {
    let d = SimDriver::new(SimConfig::multi(2));
    assert_eq!(d.device_count().unwrap(), 2);
    let info = d.device_info(1).unwrap();
    assert_eq!(info.ordinal, 1);
    assert_eq!(info.total_memory, 80 * GIB);
    assert_eq!(info.compute_capability, (9, 0));
    assert!(info.memory_pools && info.vmm && info.posix_fd_ipc && info.managed_memory);
    assert_eq!(code(d.device_info(2).unwrap_err()), 101);
    assert_eq!(code(d.mem_alloc(7, 256).unwrap_err()), 101);
    assert!(d.can_access_peer(0, 1).unwrap());
    assert!(
        d.can_access_peer(1, 1).unwrap(),
        "a device reaches its own memory"
    );
    assert_eq!(code(d.can_access_peer(0, 5).unwrap_err()), 101);
    assert_eq!(d.vmm_granularity(0, true).unwrap(), 2 * MIB);
    let m = d.mem_info(0).unwrap();
    assert_eq!((m.free, m.total), (80 * GIB, 80 * GIB));
}

#[test]
fn features_switched_off() {
    let d = SimDriver::new(SimConfig {
        memory_pools: false,
        vmm: false,
        managed_memory: false,
        ..SimConfig::default()
    });
    let info = d.device_info(0).unwrap();
    assert!(!info.memory_pools && !info.vmm && !info.managed_memory);
    assert_eq!(code(d.mempool_default(0).unwrap_err()), 801);
    assert_eq!(code(d.mem_alloc_async(256, 0).unwrap_err()), 801);
    assert_eq!(code(d.vmm_reserve(2 * MIB, 0).unwrap_err()), 801);
    assert_eq!(
        code(
            d.vmm_create(0, 2 * MIB, HandleType::None.into())
                .unwrap_err()
        ),
        801
    );
    assert_eq!(code(d.vmm_granularity(0, false).unwrap_err()), 801);
    assert_eq!(code(d.mem_alloc_managed(0, 256).unwrap_err()), 801);
    assert_eq!(
        code(d.mempool_create(&PoolProps::device(0)).unwrap_err()),
        801
    );
}

#[test]
fn current_device_is_per_thread() {
    let d = Arc::new(SimDriver::new(SimConfig::multi(2)));
    assert_eq!(d.current_device().unwrap(), 0);
    d.set_current_device(1).unwrap();
    assert_eq!(d.current_device().unwrap(), 1);
    let d2 = d.clone();
    std::thread::spawn(move || assert_eq!(d2.current_device().unwrap(), 0))
        .join()
        .unwrap();
    assert_eq!(code(d.set_current_device(2).unwrap_err()), 101);
    assert_eq!(d.current_device().unwrap(), 1);
    // A call taking a device acts on it and leaves the current one alone.
    d.mem_info(0).unwrap();
    assert_eq!(d.current_device().unwrap(), 1);
}

// ----- plain allocation -----

#[test]
fn address_only_peak_of_14_gb_uses_no_ram() {
    let d = sim();
    let rss_before = rss_bytes();
    let mut live = Vec::new();
    for i in 0..144 {
        live.push(d.mem_alloc(0, 100_000_000 + i).unwrap());
    }
    assert!(d.device_bytes(0) >= 14_400_000_000);
    assert_eq!(d.device_allocations(0), 144);
    // Data operations on address-only memory are checked and counted.
    d.memset(live[0], 7, 100_000_000, 0).unwrap();
    d.dtod(live[1], live[0], 100_000_000, 0).unwrap();
    let st = d.data_stats();
    assert_eq!((st.ops, st.bytes, st.bytes_moved), (2, 200_000_000, 0));
    for p in live.drain(..72) {
        d.mem_free(0, p).unwrap();
    }
    for _ in 0..72 {
        live.push(d.mem_alloc(0, 100_000_000).unwrap());
    }
    if let (Some(a), Some(b)) = (rss_before, rss_bytes()) {
        assert!(b.saturating_sub(a) < 256 * MIB, "RSS grew by {}", b - a);
    }
    for p in live {
        d.mem_free(0, p).unwrap();
    }
    assert_clean(&d);
}

/// Resident set size from /proc (Linux), if available.
fn rss_bytes() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = s.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn huge_and_zero_requests_fail_cleanly() {
    let d = sim();
    let e = d.mem_alloc(0, 1 << 50).unwrap_err();
    let info = e.oom_info().expect("out of memory");
    assert_eq!(info.requested, 1 << 50);
    assert_eq!(info.device, Some(0));
    assert!(d.mem_alloc(0, usize::MAX).unwrap_err().is_oom());
    assert!(d.mem_alloc(0, usize::MAX - 100).unwrap_err().is_oom());
    assert!(d.mem_alloc_async(1 << 50, 0).unwrap_err().is_oom());
    assert!(d.mem_alloc_async(usize::MAX, 0).unwrap_err().is_oom());
    assert!(d
        .mem_alloc_host(0, 1 << 50, HostAllocFlags::default())
        .unwrap_err()
        .is_oom());
    assert!(d.mem_alloc_managed(0, 1 << 50).unwrap_err().is_oom());
    assert!(d
        .vmm_create(0, 1 << 50, HandleType::None.into())
        .unwrap_err()
        .is_oom());
    assert_eq!(
        d.mem_alloc(0, 0).unwrap_err(),
        Error::Driver {
            call: "cuMemAlloc",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".into()
        }
    );
    assert_eq!(code(d.mem_alloc_async(0, 0).unwrap_err()), 1);
    assert_eq!(
        code(
            d.mem_alloc_host(0, 0, HostAllocFlags::default())
                .unwrap_err()
        ),
        1
    );
    assert_clean(&d);
}

#[test]
fn capacity_is_enforced_and_reused() {
    let d = SimDriver::new(SimConfig {
        capacity: 4 * MIB,
        ..SimConfig::default()
    });
    let a = d.mem_alloc(0, 2 * MIB).unwrap();
    let b = d.mem_alloc(0, 2 * MIB).unwrap();
    assert!(d.mem_alloc(0, 1).unwrap_err().is_oom());
    assert_eq!(d.mem_info(0).unwrap().free, 0);
    d.mem_free(0, a).unwrap();
    assert_eq!(d.mem_alloc(0, 2 * MIB).unwrap(), a, "freed address reused");
    assert_eq!(code(d.mem_free(0, DevicePtr(a.0 + 256)).unwrap_err()), 1);
    d.mem_free(0, a).unwrap();
    assert_eq!(code(d.mem_free(0, a).unwrap_err()), 1, "double free");
    d.mem_free(0, b).unwrap();
    d.mem_free(0, DevicePtr::NULL).unwrap();
    assert_clean(&d);
}

#[test]
fn devices_have_separate_high_ranges() {
    let d = SimDriver::new(SimConfig::multi(3));
    let a = d.mem_alloc(0, 256).unwrap();
    let b = d.mem_alloc(1, 256).unwrap();
    let c = d.mem_alloc(2, 256).unwrap();
    assert!(a.0 >= 1 << 47 && b.0 > a.0 + (1 << 40) && c.0 > b.0 + (1 << 40));
    assert_eq!(d.device_bytes(1), 256);
    for (dev, p) in [(0, a), (1, b), (2, c)] {
        d.mem_free(dev, p).unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_alloc_free_never_overlaps(ops in proptest::collection::vec((any::<bool>(), 1usize..3 * MIB, any::<usize>()), 1..200)) {
        let d = SimDriver::new(SimConfig { capacity: 64 * MIB, ..SimConfig::default() });
        let mut live: Vec<(u64, u64)> = Vec::new();
        for (alloc, bytes, pick) in ops {
            if alloc || live.is_empty() {
                let rounded = bytes.div_ceil(256) as u64 * 256;
                let used: u64 = live.iter().map(|x| x.1).sum();
                match d.mem_alloc(0, bytes) {
                    Ok(p) => {
                        prop_assert_eq!(p.0 % 256, 0);
                        prop_assert!(p.0 >= 1 << 47);
                        for &(a, l) in &live {
                            prop_assert!(p.0 + rounded <= a || a + l <= p.0);
                        }
                        live.push((p.0, rounded));
                    }
                    Err(e) => {
                        prop_assert!(e.is_oom());
                        prop_assert!(used + rounded > 64 * MIB as u64);
                    }
                }
            } else {
                let (a, _) = live.swap_remove(pick % live.len());
                d.mem_free(0, DevicePtr(a)).unwrap();
            }
            prop_assert_eq!(d.device_bytes(0) as u64, live.iter().map(|x| x.1).sum::<u64>());
            prop_assert_eq!(d.device_allocations(0), live.len());
        }
    }
}

// ----- data movement -----

#[test]
fn backed_memset_and_copies_move_bytes() {
    let d = backed();
    let a = d.mem_alloc(0, 1000).unwrap();
    let b = d.mem_alloc(0, 1000).unwrap();
    assert_eq!(get(&d, a, 1000), vec![0; 1000], "zeroed");
    d.memset(a, 0xAB, 1000, 0).unwrap();
    assert_eq!(get(&d, a, 1000), vec![0xAB; 1000]);
    let data: Vec<u8> = (0..1000).map(|i| i as u8).collect();
    put(&d, DevicePtr(a.0 + 10), &data[..500], 0);
    d.dtod(b, a, 1000, 0).unwrap();
    let out = get(&d, b, 1000);
    assert_eq!(&out[..10], &[0xAB; 10]);
    assert_eq!(&out[10..510], &data[..500]);
    assert_eq!(&out[510..], &[0xAB; 490][..]);
    // Overlapping copy within one allocation behaves like memmove.
    d.dtod(DevicePtr(a.0 + 1), DevicePtr(a.0 + 10), 500, 0)
        .unwrap();
    assert_eq!(&get(&d, DevicePtr(a.0 + 1), 500), &data[..500]);
    d.mem_free(0, a).unwrap();
    d.mem_free(0, b).unwrap();
}

#[test]
fn bad_addresses_are_invalid_value() {
    let d = backed();
    let a = d.mem_alloc(0, 1000).unwrap(); // 1024 bytes rounded
    let err = d.memset(DevicePtr(a.0 + 1024), 0, 1, 0).unwrap_err();
    assert_eq!(
        err,
        Error::Driver {
            call: "cuMemsetD8Async",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".into()
        }
    );
    assert_eq!(code(d.memset(a, 0, 1025, 0).unwrap_err()), 1);
    assert_eq!(code(d.memset(DevicePtr(8), 0, 1, 0).unwrap_err()), 1);
    assert_eq!(
        code(d.memset(DevicePtr(u64::MAX - 4), 0, 100, 0).unwrap_err()),
        1
    );
    assert_eq!(code(d.dtod(a, DevicePtr(a.0 + 4096), 1, 0).unwrap_err()), 1);
    let mut buf = [0u8; 4];
    // SAFETY: buf is valid; the call fails before enqueueing anything.
    let e = unsafe { d.memcpy_dtoh_async(buf.as_mut_ptr(), DevicePtr(a.0 + (1 << 30)), 4, 0) };
    assert_eq!(code(e.unwrap_err()), 1);
    d.mem_free(0, a).unwrap();
    assert_eq!(code(d.memset(a, 0, 1, 0).unwrap_err()), 1, "use after free");
}

#[test]
fn pinned_and_managed_are_real_host_memory() {
    let d = sim(); // even address-only
    let h = d
        .mem_alloc_host(0, 4096, HostAllocFlags::default())
        .unwrap();
    assert_eq!(h.0 % 256, 0);
    assert_eq!(d.pinned_host_bytes(), 4096);
    d.memset(h, 5, 4096, 0).unwrap();
    d.stream_synchronize(0).unwrap();
    // SAFETY: h is a live 4096-byte host allocation and no work is pending.
    let view = unsafe { std::slice::from_raw_parts(h.as_mut_ptr::<u8>() as *const u8, 4096) };
    assert!(view.iter().all(|&b| b == 5));
    let m = d.mem_alloc_managed(0, 1000).unwrap();
    assert_eq!(d.device_bytes(0), 1024);
    d.dtod(m, h, 1000, 0).unwrap();
    assert_eq!(get(&d, m, 1000), vec![5; 1000]);
    d.mem_prefetch(m, 1000, 0, 0).unwrap();
    assert_eq!(code(d.mem_prefetch(m, 2000, 0, 0).unwrap_err()), 1);
    assert_eq!(code(d.mem_free_host(m).unwrap_err()), 1);
    assert_eq!(code(d.mem_free(0, h).unwrap_err()), 1);
    d.mem_free(0, m).unwrap();
    d.mem_free_host(h).unwrap();
    assert_eq!(code(d.mem_free_host(h).unwrap_err()), 1);
    assert_clean(&d);
}

#[test]
fn address_only_device_to_host_leaves_host_bytes() {
    let d = sim();
    let a = d.mem_alloc(0, 256).unwrap();
    d.memset(a, 9, 256, 0).unwrap();
    assert_eq!(get(&d, a, 16), vec![0xEE; 16], "no bytes move");
    d.mem_free(0, a).unwrap();
}

// ----- streams and events -----

#[test]
fn held_stream_keeps_work_pending() {
    let d = backed();
    let a = d.mem_alloc(0, 256).unwrap();
    let s = d.stream_create(0, true).unwrap();
    assert!(d.stream_query(s).unwrap());
    d.hold(s);
    d.memset(a, 1, 256, s).unwrap();
    assert_eq!(d.pending_ops(s), 1);
    assert_eq!(d.stream_position(s), 1);
    assert!(!d.stream_query(s).unwrap(), "query reports pending work");
    assert!(!d.stream_query(s).unwrap(), "query never runs work");
    assert_eq!(get(&d, a, 4), vec![0; 4]);
    d.complete(s);
    assert_eq!(d.pending_ops(s), 0);
    assert_eq!(get(&d, a, 4), vec![1; 4]);
    // Still held after complete; release runs what is pending.
    d.memset(a, 2, 256, s).unwrap();
    assert_eq!(d.pending_ops(s), 1);
    d.release(s);
    assert_eq!(get(&d, a, 4), vec![2; 4]);
    // Synchronize runs held work too.
    d.hold(s);
    d.memset(a, 3, 256, s).unwrap();
    let before = d.call_count("cuStreamSynchronize");
    d.stream_synchronize(s).unwrap();
    assert_eq!(d.call_count("cuStreamSynchronize"), before + 1);
    assert_eq!(get(&d, a, 4), vec![3; 4]);
    d.stream_destroy(s).unwrap();
    d.mem_free(0, a).unwrap();
}

#[test]
fn events_and_waits() {
    let d = backed();
    let buf = d.mem_alloc(0, 256).unwrap();
    let a = d.stream_create(0, true).unwrap();
    let b = d.stream_create(0, true).unwrap();
    let e = d.event_create(0).unwrap();
    assert!(d.event_query(e).unwrap(), "never recorded is complete");
    d.stream_wait_event(b, e).unwrap();
    assert_eq!(
        d.stream_position(b),
        0,
        "waiting on an unrecorded event is a no-op"
    );
    d.hold(a);
    d.memset(buf, 1, 256, a).unwrap();
    d.event_record(e, a).unwrap();
    assert!(!d.event_query(e).unwrap());
    d.stream_wait_event(b, e).unwrap();
    d.memset(buf, 2, 256, b).unwrap();
    assert_eq!(
        d.pending_ops(b),
        2,
        "b is blocked on a's record though not held"
    );
    d.release(a);
    assert!(d.event_query(e).unwrap());
    assert_eq!(d.pending_ops(b), 0);
    assert_eq!(get(&d, buf, 1), vec![2]);
    // event_synchronize completes held work up to the record only.
    d.hold(a);
    d.memset(buf, 3, 256, a).unwrap();
    d.event_record(e, a).unwrap();
    d.memset(buf, 4, 256, a).unwrap();
    d.event_synchronize(e).unwrap();
    assert_eq!(d.pending_ops(a), 1);
    assert_eq!(get(&d, buf, 1), vec![3]);
    d.complete_all();
    assert_eq!(get(&d, buf, 1), vec![4]);
    assert_eq!(code(d.event_record(e, 0xdead).unwrap_err()), 400);
    d.event_destroy(e).unwrap();
    assert_eq!(code(d.event_destroy(e).unwrap_err()), 400);
    assert_eq!(code(d.event_query(e).unwrap_err()), 400);
    d.stream_destroy(a).unwrap();
    d.stream_destroy(b).unwrap();
    d.mem_free(0, buf).unwrap();
    assert_clean(&d);
}

#[test]
fn wait_uses_the_record_current_at_wait_time() {
    let d = sim();
    let a = d.stream_create(0, true).unwrap();
    let b = d.stream_create(0, true).unwrap();
    let (e, f, g) = (
        d.event_create(0).unwrap(),
        d.event_create(0).unwrap(),
        d.event_create(0).unwrap(),
    );
    d.hold(a);
    d.event_record(f, a).unwrap(); // a@1
    d.event_record(e, a).unwrap(); // a@2
    d.event_record(g, a).unwrap(); // a@3
    d.stream_wait_event(b, e).unwrap(); // b waits a@2
    let dummy = d.event_create(0).unwrap();
    d.event_record(dummy, b).unwrap();
    d.event_record(e, a).unwrap(); // a@4: a later record
    d.event_synchronize(f).unwrap();
    assert_eq!(d.pending_ops(b), 2, "a@1 is not enough");
    d.event_synchronize(g).unwrap();
    assert_eq!(
        d.pending_ops(b),
        0,
        "a@2 done: b runs although a@4 is pending"
    );
    assert_eq!(d.pending_ops(a), 1);
    assert!(!d.event_query(e).unwrap());
    d.complete(a);
    assert!(d.event_query(e).unwrap());
}

#[test]
fn complete_runs_prerequisites_of_other_streams() {
    let d = sim();
    let a = d.stream_create(0, true).unwrap();
    let b = d.stream_create(0, true).unwrap();
    let e = d.event_create(0).unwrap();
    d.hold(a);
    d.hold(b);
    d.memset(d.mem_alloc(0, 256).unwrap(), 0, 1, a).unwrap();
    d.event_record(e, a).unwrap();
    d.event_record(e, a).unwrap();
    d.stream_wait_event(b, e).unwrap();
    d.complete(b);
    assert_eq!(d.pending_ops(b), 0);
    assert_eq!(d.pending_ops(a), 0, "a ran up to the record b waited for");
    // stream_synchronize on b does the same.
    let f = d.event_create(0).unwrap();
    d.event_record(f, a).unwrap();
    d.event_record(e, a).unwrap();
    d.stream_wait_event(b, f).unwrap();
    d.stream_synchronize(b).unwrap();
    assert_eq!(d.pending_ops(a), 1, "only up to f's record");
    d.device_synchronize(0).unwrap();
    assert_eq!(d.pending_ops(a), 0);
}

#[test]
fn destroyed_stream_work_still_completes() {
    let d = backed();
    let buf = d.mem_alloc(0, 256).unwrap();
    let s = d.stream_create(0, true).unwrap();
    d.hold(s);
    d.memset(buf, 7, 256, s).unwrap();
    d.stream_destroy(s).unwrap();
    assert_eq!(d.live_streams(), 0);
    assert_eq!(code(d.memset(buf, 1, 1, s).unwrap_err()), 400);
    assert_eq!(code(d.stream_synchronize(s).unwrap_err()), 400);
    assert_eq!(code(d.stream_destroy(s).unwrap_err()), 400);
    // The work is still pending (the stream was held) and still runs.
    assert_eq!(d.pending_ops(s), 1);
    assert_eq!(get(&d, buf, 1), vec![0]);
    d.complete(s);
    assert_eq!(d.pending_ops(s), 0);
    assert_eq!(get(&d, buf, 1), vec![7]);
    // A destroyed stream blocked on a held one drains once that one runs.
    let a = d.stream_create(0, true).unwrap();
    let t = d.stream_create(0, true).unwrap();
    let e = d.event_create(0).unwrap();
    d.hold(a);
    d.event_record(e, a).unwrap();
    d.stream_wait_event(t, e).unwrap();
    d.memset(buf, 8, 256, t).unwrap();
    d.stream_destroy(t).unwrap();
    assert_eq!(d.pending_ops(t), 2);
    d.complete(a);
    assert_eq!(get(&d, buf, 1), vec![8]);
    d.stream_destroy(a).unwrap();
    d.event_destroy(e).unwrap();
    d.mem_free(0, buf).unwrap();
    assert_clean(&d);
}

#[test]
fn legacy_and_per_thread_streams() {
    let d = Arc::new(SimDriver::new(SimConfig::multi(2)));
    d.hold(0);
    d.memset(d.mem_alloc(0, 256).unwrap(), 0, 1, 0).unwrap();
    assert_eq!(
        d.pending_ops(STREAM_LEGACY),
        1,
        "0 and CU_STREAM_LEGACY are one stream"
    );
    assert!(!d.stream_query(STREAM_LEGACY).unwrap());
    d.set_current_device(1).unwrap();
    assert!(
        d.stream_query(0).unwrap(),
        "each device has its own legacy stream"
    );
    d.set_current_device(0).unwrap();
    d.complete(0);
    d.hold(STREAM_PER_THREAD);
    let p = d.mem_alloc(0, 256).unwrap();
    d.memset(p, 0, 1, STREAM_PER_THREAD).unwrap();
    assert_eq!(d.pending_ops(STREAM_PER_THREAD), 1);
    assert_eq!(d.pending_ops(0), 0);
    let d2 = d.clone();
    std::thread::spawn(move || {
        assert_eq!(d2.pending_ops(STREAM_PER_THREAD), 0, "a queue per thread");
        d2.memset(p, 0, 1, STREAM_PER_THREAD).unwrap();
        assert!(d2.stream_query(STREAM_PER_THREAD).unwrap());
    })
    .join()
    .unwrap();
    d.stream_synchronize(STREAM_PER_THREAD).unwrap();
    assert_eq!(d.pending_ops(STREAM_PER_THREAD), 0);
}

// ----- ordering oracle -----

#[test]
fn oracle_same_stream_and_completed() {
    let d = sim();
    let a = d.stream_create(0, true).unwrap();
    let b = d.stream_create(0, true).unwrap();
    let e = d.event_create(0).unwrap();
    d.event_record(e, a).unwrap();
    // Ran already (not held): ordered for everyone.
    assert!(d.is_ordered_after(a, 1, b));
    d.hold(a);
    d.event_record(e, a).unwrap();
    let pos = d.stream_position(a);
    assert_eq!(pos, 2);
    assert!(d.is_ordered_after(a, pos, a), "same stream");
    assert!(!d.is_ordered_after(a, pos, b));
    assert!(d.is_ordered_after(a, 1, b), "first op already ran");
    assert!(!d.is_ordered_after(a, pos, 0));
    d.complete(a);
    assert!(d.is_ordered_after(a, pos, b));
    assert!(d.is_ordered_after(a, pos, 0));
    assert!(!d.is_ordered_after(a, pos, 0xbad), "unknown handle");
}

#[test]
fn oracle_direct_wait() {
    let d = sim();
    let a = d.stream_create(0, true).unwrap();
    let b = d.stream_create(0, true).unwrap();
    let e = d.event_create(0).unwrap();
    d.hold(a);
    d.event_record(e, a).unwrap(); // a@1
    d.event_record(e, a).unwrap(); // a@2
    let pos = d.stream_position(a);
    assert!(!d.is_ordered_after(a, pos, b));
    d.stream_wait_event(b, e).unwrap();
    assert!(d.is_ordered_after(a, pos, b));
    assert!(d.is_ordered_after(a, 1, b));
    d.event_record(e, a).unwrap(); // a@3, after the wait
    assert!(!d.is_ordered_after(a, 3, b), "wait names a@2, not a@3");
    assert!(!d.is_ordered_after(b, 1, a), "not symmetric");
    // The wait stays valid once it has run.
    d.complete(a);
    assert!(d.is_ordered_after(a, 3, b));
}

#[test]
fn oracle_transitive_waits() {
    let d = sim();
    let [a, b, c, x] = [0; 4].map(|_| d.stream_create(0, true).unwrap());
    let [ea, eb, eb0] = [0; 3].map(|_| d.event_create(0).unwrap());
    d.hold(a);
    d.hold(b);
    d.event_record(eb0, b).unwrap(); // b@1, before b waits on a
    d.event_record(ea, a).unwrap(); // a@1
    d.stream_wait_event(b, ea).unwrap(); // b@2 waits a@1
    d.event_record(eb, b).unwrap(); // b@3
    d.event_record(ea, a).unwrap(); // a@2
    d.stream_wait_event(c, eb).unwrap(); // c waits b@3
    assert!(d.is_ordered_after(a, 1, c), "c -> b@3 -> b's wait on a@1");
    assert!(!d.is_ordered_after(a, 2, c), "a@2 came later");
    assert!(d.is_ordered_after(b, 3, c));
    d.stream_wait_event(x, eb0).unwrap(); // x waits b@1, before b's wait
    assert!(!d.is_ordered_after(a, 1, x), "b@1 precedes b's wait on a");
    assert!(d.is_ordered_after(b, 1, x));
    // A chain through several streams.
    let [s1, s2, s3] = [0; 3].map(|_| d.stream_create(0, true).unwrap());
    let [e1, e2] = [0; 2].map(|_| d.event_create(0).unwrap());
    d.stream_wait_event(s1, ea).unwrap(); // s1 waits a@2
    d.hold(s1);
    d.event_record(e1, s1).unwrap();
    d.stream_wait_event(s2, e1).unwrap();
    d.hold(s2);
    d.event_record(e2, s2).unwrap();
    assert!(!d.is_ordered_after(a, 2, s3));
    d.stream_wait_event(s3, e2).unwrap();
    assert!(d.is_ordered_after(a, 2, s3));
    assert!(d.is_ordered_after(a, 1, s3));
    assert!(!d.is_ordered_after(b, 3, s3), "nothing orders s3 after b");
    d.complete_all();
    assert!(d.is_ordered_after(b, 3, s3), "everything ran");
}

#[test]
fn oracle_after_stream_destroyed() {
    let d = sim();
    let a = d.stream_create(0, true).unwrap();
    let b = d.stream_create(0, true).unwrap();
    d.hold(a);
    let e = d.event_create(0).unwrap();
    d.event_record(e, a).unwrap();
    d.stream_destroy(a).unwrap();
    assert!(!d.is_ordered_after(a, 1, b), "still pending after destroy");
    d.stream_wait_event(b, e).unwrap();
    assert!(d.is_ordered_after(a, 1, b));
    d.release(a);
    assert!(d.is_ordered_after(a, 1, b));
    assert_eq!(
        d.stream_position(a),
        1,
        "position survives the drained queue"
    );
    assert_eq!(d.pending_ops(b), 0);
}

/// Random waits and records on held streams: the oracle says "ordered"
/// exactly when completing the later stream alone (which runs only what its
/// waits need) runs all of the earlier stream's ops.
#[test]
fn oracle_agrees_with_execution() {
    let mut rng = 0x2545F4914F6CDD1Du64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    for _ in 0..500 {
        let d = sim();
        let s: Vec<RawStream> = (0..4).map(|_| d.stream_create(0, true).unwrap()).collect();
        let ev: Vec<RawEvent> = (0..4).map(|_| d.event_create(0).unwrap()).collect();
        for &x in &s {
            d.hold(x);
        }
        for _ in 0..12 {
            let (i, j) = (next(4) as usize, next(4) as usize);
            if next(2) == 0 {
                d.event_record(ev[j], s[i]).unwrap();
            } else {
                d.stream_wait_event(s[i], ev[j]).unwrap();
            }
        }
        let (e, l) = (next(4) as usize, next(4) as usize);
        let pos = d.stream_position(s[e]);
        let ordered = d.is_ordered_after(s[e], pos, s[l]);
        // Put a marker on l, then complete only l (and what it needs).
        let m = d.event_create(0).unwrap();
        d.event_record(m, s[l]).unwrap();
        d.event_synchronize(m).unwrap();
        // Completing l runs exactly what l's waits need, so the oracle is
        // both sound and complete here.
        let done = d.pending_ops(s[e]) == 0 || e == l;
        assert_eq!(ordered, done, "streams {e} -> {l} at {pos}");
    }
}

// ----- faults -----

#[test]
fn nth_alloc_fails_and_changes_nothing() {
    let d = sim();
    d.fail_nth_alloc(2);
    let a = d.mem_alloc(0, 256).unwrap();
    let (bytes, n) = (d.device_bytes(0), d.device_allocations(0));
    let e = d.mem_alloc(0, 512).unwrap_err();
    assert_eq!(e.oom_info().unwrap().requested, 512);
    assert_eq!(e.oom_info().unwrap().device, Some(0));
    assert_eq!((d.device_bytes(0), d.device_allocations(0)), (bytes, n));
    assert_eq!(d.call_count("cuMemAlloc"), 2);
    let b = d.mem_alloc(0, 512).unwrap();
    // Counted across the four allocation calls.
    d.fail_nth_alloc(3);
    let p = d.mem_alloc_async(256, 0).unwrap();
    let h = d.vmm_create(0, 2 * MIB, HandleType::None.into()).unwrap();
    let pool = d.mempool_default(0).unwrap();
    let used = d.mempool_get_attr(pool, PoolAttr::UsedMemCurrent).unwrap();
    let pos = d.stream_position(0);
    assert!(d
        .mem_alloc_from_pool_async(256, pool, 0)
        .unwrap_err()
        .is_oom());
    assert_eq!(
        d.mempool_get_attr(pool, PoolAttr::UsedMemCurrent).unwrap(),
        used
    );
    assert_eq!(d.stream_position(0), pos);
    d.mem_alloc_from_pool_async(256, pool, 0).unwrap();
    // Cleared faults do not fire.
    d.fail_nth_alloc(1);
    d.clear_faults();
    d.mem_free(0, d.mem_alloc(0, 1).unwrap()).unwrap();
    d.mem_free(0, a).unwrap();
    d.mem_free(0, b).unwrap();
    d.mem_free_async(p, 0).unwrap();
    d.vmm_release(h).unwrap();
}

#[test]
fn chosen_call_fails_with_its_code() {
    let d = sim();
    let s = d.stream_create(0, true).unwrap();
    let e = d.event_create(0).unwrap();
    d.fail_call("cuEventRecord", 2, 999);
    d.event_record(e, s).unwrap();
    let pos = d.stream_position(s);
    assert_eq!(
        d.event_record(e, s).unwrap_err(),
        Error::Driver {
            call: "cuEventRecord",
            code: 999,
            name: "CUDA_ERROR_UNKNOWN".into()
        }
    );
    assert_eq!(d.stream_position(s), pos, "a failed call enqueues nothing");
    d.event_record(e, s).unwrap();
    assert_eq!(d.call_count("cuEventRecord"), 3);
    d.fail_call("cuStreamSynchronize", 1, 700);
    assert_eq!(code(d.stream_synchronize(s).unwrap_err()), 700);
    d.stream_synchronize(s).unwrap();
    d.fail_call("cuMemMap", 1, 2);
    let va = d.vmm_reserve(2 * MIB, 0).unwrap();
    let h = d.vmm_create(0, 2 * MIB, HandleType::None.into()).unwrap();
    assert_eq!(code(d.vmm_map(va, 2 * MIB, 0, h).unwrap_err()), 2);
    assert_eq!(d.mapped_bytes(), 0);
    d.vmm_map(va, 2 * MIB, 0, h).unwrap();
    d.fail_call("cuMemFree", 1, 1);
    let p = d.mem_alloc(0, 256).unwrap();
    assert_eq!(code(d.mem_free(0, p).unwrap_err()), 1);
    assert_eq!(d.device_allocations(0), 2, "still allocated");
    d.mem_free(0, p).unwrap();
    assert_eq!(cu_result_name(12345), "CUDA_ERROR_12345");
    d.vmm_unmap(va, 2 * MIB).unwrap();
    d.vmm_release(h).unwrap();
    d.vmm_free_address(va, 2 * MIB).unwrap();
    d.stream_destroy(s).unwrap();
    d.event_destroy(e).unwrap();
    assert_clean(&d);
}

// ----- pools -----

#[test]
fn pool_attributes() {
    let d = sim();
    let p = d.mempool_default(0).unwrap();
    assert_eq!(d.mempool_current(0).unwrap(), p);
    for (attr, v) in [
        (PoolAttr::ReleaseThreshold, 0),
        (PoolAttr::ReuseFollowEventDependencies, 1),
        (PoolAttr::ReuseAllowOpportunistic, 1),
        (PoolAttr::ReuseAllowInternalDependencies, 1),
        (PoolAttr::ReservedMemCurrent, 0),
        (PoolAttr::UsedMemHigh, 0),
    ] {
        assert_eq!(d.mempool_get_attr(p, attr).unwrap(), v, "{attr:?}");
    }
    d.mempool_set_attr(p, PoolAttr::ReuseAllowOpportunistic, 0)
        .unwrap();
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::ReuseAllowOpportunistic)
            .unwrap(),
        0
    );
    assert_eq!(
        code(
            d.mempool_set_attr(p, PoolAttr::UsedMemCurrent, 0)
                .unwrap_err()
        ),
        1
    );
    assert_eq!(
        code(
            d.mempool_set_attr(p, PoolAttr::ReservedMemHigh, 5)
                .unwrap_err()
        ),
        1
    );
    assert_eq!(
        code(
            d.mempool_get_attr(0x999, PoolAttr::UsedMemHigh)
                .unwrap_err()
        ),
        400
    );
    assert_eq!(code(d.mempool_destroy(p).unwrap_err()), 1, "default pool");
    d.mempool_set_attr(p, PoolAttr::ReleaseThreshold, u64::MAX)
        .unwrap();
    let a = d.mem_alloc_async(3 * MIB, 0).unwrap();
    let b = d.mem_alloc_async(1000, 0).unwrap();
    let used = 3 * MIB as u64 + 1024;
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::UsedMemCurrent).unwrap(),
        used
    );
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::ReservedMemCurrent).unwrap(),
        6 * MIB as u64
    );
    assert_eq!(d.device_bytes(0), 6 * MIB);
    d.mem_free_async(a, 0).unwrap();
    assert_eq!(code(d.mem_free_async(a, 0).unwrap_err()), 1, "double free");
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::UsedMemCurrent).unwrap(),
        1024
    );
    assert_eq!(d.mempool_get_attr(p, PoolAttr::UsedMemHigh).unwrap(), used);
    d.mempool_set_attr(p, PoolAttr::UsedMemHigh, 0).unwrap();
    assert_eq!(d.mempool_get_attr(p, PoolAttr::UsedMemHigh).unwrap(), 1024);
    d.mempool_set_attr(p, PoolAttr::ReservedMemHigh, 0).unwrap();
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::ReservedMemHigh).unwrap(),
        6 * MIB as u64
    );
    // Threshold max: synchronize keeps the cache; the block is reused.
    d.stream_synchronize(0).unwrap();
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::ReservedMemCurrent).unwrap(),
        6 * MIB as u64
    );
    let c = d.mem_alloc_async(4 * MIB, 0).unwrap();
    assert_eq!(c, a, "cached block reused");
    d.mem_free_async(c, 0).unwrap();
    d.mem_free_async(b, 0).unwrap();
    d.mempool_trim_to(p, 2 * MIB).unwrap();
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::ReservedMemCurrent).unwrap(),
        2 * MIB as u64
    );
    d.mempool_trim_to(p, 0).unwrap();
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::ReservedMemCurrent).unwrap(),
        0
    );
    assert_clean(&d);
}

#[test]
fn pool_release_threshold_at_synchronize() {
    let d = sim();
    let p = d.mempool_default(0).unwrap();
    let a = d.mem_alloc_async(10 * MIB, 0).unwrap();
    let b = d.mem_alloc_async(4 * MIB, 0).unwrap();
    d.mem_free_async(a, 0).unwrap();
    d.mem_free_async(b, 0).unwrap();
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::ReservedMemCurrent).unwrap(),
        14 * MIB as u64
    );
    d.mempool_set_attr(p, PoolAttr::ReleaseThreshold, 5 * MIB as u64)
        .unwrap();
    d.stream_synchronize(0).unwrap();
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::ReservedMemCurrent).unwrap(),
        4 * MIB as u64
    );
    d.mempool_set_attr(p, PoolAttr::ReleaseThreshold, 0)
        .unwrap();
    let e = d.event_create(0).unwrap();
    d.event_synchronize(e).unwrap();
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::ReservedMemCurrent).unwrap(),
        0
    );
    d.event_destroy(e).unwrap();
    assert_clean(&d);
}

#[test]
fn pool_free_takes_effect_in_stream_order() {
    let d = sim();
    let p = d.mempool_default(0).unwrap();
    let s = d.stream_create(0, true).unwrap();
    let a = d.mem_alloc_async(MIB, s).unwrap();
    d.hold(s);
    d.mem_free_async(a, s).unwrap();
    assert_eq!(d.pending_ops(s), 1);
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::UsedMemCurrent).unwrap(),
        MIB as u64
    );
    let b = d.mem_alloc_async(MIB, 0).unwrap();
    assert_ne!(a, b, "not reusable before the free runs");
    // The block is still usable by work ordered before the free.
    d.memset(a, 0, 16, 0).unwrap();
    d.complete(s);
    assert_eq!(
        d.mempool_get_attr(p, PoolAttr::UsedMemCurrent).unwrap(),
        MIB as u64
    );
    assert_eq!(code(d.memset(a, 0, 16, 0).unwrap_err()), 1, "freed");
    d.mempool_set_attr(p, PoolAttr::ReleaseThreshold, u64::MAX)
        .unwrap();
    let c = d.mem_alloc_async(MIB, 0).unwrap();
    assert_eq!(c, a, "reusable once the free ran");
    d.mem_free_async(b, 0).unwrap();
    d.mem_free_async(c, 0).unwrap();
    d.stream_destroy(s).unwrap();
    d.mempool_trim_to(p, 0).unwrap();
    assert_clean(&d);
}

#[test]
fn created_pools_limits_and_destroy() {
    let d = SimDriver::new(SimConfig {
        capacity: 16 * MIB,
        ..SimConfig::default()
    });
    let props = PoolProps {
        max_size: 4 * MIB,
        ..PoolProps::device(0)
    };
    let p = d.mempool_create(&props).unwrap();
    assert_eq!(d.live_pools(), 1);
    let a = d.mem_alloc_from_pool_async(3 * MIB, p, 0).unwrap();
    let e = d.mem_alloc_from_pool_async(MIB, p, 0).unwrap_err();
    assert_eq!(e.oom_info().unwrap().limit, Some(4 * MIB));
    // Device capacity: the default pool cannot exceed 16 MiB - 4 MiB.
    let q = d.mempool_default(0).unwrap();
    let big = d.mem_alloc_async(12 * MIB, 0).unwrap();
    assert!(d.mem_alloc_async(1, 0).unwrap_err().is_oom());
    d.mem_free_async(big, 0).unwrap();
    d.mempool_trim_to(q, 0).unwrap();
    // Destroying a pool with a live allocation defers until it is freed.
    d.mempool_destroy(p).unwrap();
    assert_eq!(code(d.mempool_destroy(p).unwrap_err()), 400);
    assert_eq!(code(d.mem_alloc_from_pool_async(1, p, 0).unwrap_err()), 400);
    assert_eq!(d.live_pools(), 1);
    assert_eq!(d.device_bytes(0), 4 * MIB);
    d.mem_free_async(a, 0).unwrap();
    assert_eq!(d.live_pools(), 0);
    assert_clean(&d);
    // Unsupported kinds.
    let fabric = PoolProps {
        handle_type: HandleType::Fabric,
        ..PoolProps::device(0)
    };
    assert!(matches!(
        d.mempool_create(&fabric),
        Err(Error::Unsupported { .. })
    ));
    let bad = PoolProps::device(3);
    assert_eq!(code(d.mempool_create(&bad).unwrap_err()), 101);
    let no_fd = SimDriver::new(SimConfig {
        posix_fd_ipc: false,
        ..SimConfig::default()
    });
    let fd_props = PoolProps {
        handle_type: HandleType::PosixFd,
        ..PoolProps::device(0)
    };
    assert_eq!(code(no_fd.mempool_create(&fd_props).unwrap_err()), 801);
}

#[test]
fn pool_access_from_other_devices() {
    let d = SimDriver::new(SimConfig {
        devices: 2,
        ..SimConfig::backed(16 * MIB)
    });
    let p = d.mempool_create(&PoolProps::device(0)).unwrap();
    let a = d.mem_alloc_from_pool_async(256, p, 0).unwrap();
    assert_eq!(d.mempool_get_access(p, 0).unwrap(), AccessFlags::ReadWrite);
    assert_eq!(d.mempool_get_access(p, 1).unwrap(), AccessFlags::None);
    d.set_current_device(1).unwrap();
    // Another device's memory without the pool's grant.
    assert_eq!(code(d.memset(a, 1, 16, 0).unwrap_err()), 705);
    d.mempool_set_access(p, 1, AccessFlags::Read).unwrap();
    assert_eq!(code(d.memset(a, 1, 16, 0).unwrap_err()), 705, "read only");
    assert_eq!(d.peer_violations().len(), 2);
    assert_eq!(get(&d, a, 4), vec![0; 4]);
    d.mempool_set_access(p, 1, AccessFlags::ReadWrite).unwrap();
    d.memset(a, 1, 16, 0).unwrap();
    assert_eq!(
        code(d.mempool_set_access(p, 0, AccessFlags::None).unwrap_err()),
        1
    );
    assert_eq!(
        code(d.mempool_set_access(p, 9, AccessFlags::None).unwrap_err()),
        101
    );
    d.mem_free_async(a, 0).unwrap();
    d.mempool_destroy(p).unwrap();
    assert_eq!(d.live_pools(), 0);
}

#[test]
fn pool_export_import_in_process() {
    let d = backed();
    let props = PoolProps {
        handle_type: HandleType::PosixFd,
        ..PoolProps::device(0)
    };
    let p = d.mempool_create(&props).unwrap();
    let fd = d.mempool_export_fd(p).unwrap();
    let q = d.mempool_import_fd(fd.as_fd()).unwrap();
    drop(fd);
    assert_ne!(p, q);
    let a = d.mem_alloc_from_pool_async(1000, p, 0).unwrap();
    assert_eq!(
        d.mempool_get_attr(q, PoolAttr::UsedMemCurrent).unwrap(),
        1024,
        "shared state"
    );
    d.memset(a, 0x5A, 1000, 0).unwrap();
    let data = d.mempool_export_pointer(a).unwrap();
    let b = d.mempool_import_pointer(q, &data).unwrap();
    assert_ne!(a, b);
    assert_eq!(get(&d, b, 1000), vec![0x5A; 1000], "same bytes");
    d.memset(b, 0x11, 10, 0).unwrap();
    assert_eq!(get(&d, a, 10), vec![0x11; 10]);
    // Wrong pool or garbage data.
    let other = d.mempool_create(&props).unwrap();
    assert_eq!(code(d.mempool_import_pointer(other, &data).unwrap_err()), 1);
    assert_eq!(
        code(
            d.mempool_import_pointer(q, &PoolPtrExport([0; 64]))
                .unwrap_err()
        ),
        1
    );
    // A non-exportable pool and a foreign driver refuse.
    let plain = d.mempool_create(&PoolProps::device(0)).unwrap();
    assert_eq!(code(d.mempool_export_fd(plain).unwrap_err()), 1);
    let fd2 = d.mempool_export_fd(p).unwrap();
    assert_eq!(
        code(backed().mempool_import_fd(fd2.as_fd()).unwrap_err()),
        1
    );
    drop(fd2);
    // A descriptor that is not an export.
    let (socket, _peer) = std::os::unix::net::UnixStream::pair().unwrap();
    assert_eq!(code(d.mempool_import_fd(socket.as_fd()).unwrap_err()), 1);
    d.mem_free_async(b, 0).unwrap();
    d.mem_free_async(a, 0).unwrap();
    for h in [p, q, other, plain] {
        d.mempool_destroy(h).unwrap();
    }
    assert_clean(&d);
}

/// Closes a descriptor handed out by an export, through std's ownership.
// ----- VMM -----

#[test]
fn vmm_rules() {
    let d = sim();
    let g = 2 * MIB;
    assert_eq!(code(d.vmm_reserve(g + 1, 0).unwrap_err()), 1);
    assert_eq!(code(d.vmm_reserve(0, 0).unwrap_err()), 1);
    assert_eq!(code(d.vmm_reserve(g, 3 * MIB).unwrap_err()), 1);
    let big = d.vmm_reserve(1 << 40, 0).unwrap();
    assert_eq!(
        d.reserved_va_bytes(),
        1 << 40,
        "address space, not capacity"
    );
    assert_eq!(d.device_bytes(0), 0);
    d.vmm_free_address(big, 1 << 40).unwrap();
    let va = d.vmm_reserve(8 * g, 16 * g).unwrap();
    assert_eq!(va.0 % (16 * g) as u64, 0);
    assert_eq!(
        code(
            d.vmm_create(0, g + 256, HandleType::None.into())
                .unwrap_err()
        ),
        1
    );
    let h1 = d.vmm_create(0, 2 * g, HandleType::None.into()).unwrap();
    let h2 = d.vmm_create(0, g, HandleType::None.into()).unwrap();
    assert_eq!(d.physical_bytes(), 3 * g);
    assert_eq!(d.device_bytes(0), 3 * g);
    d.vmm_map(va, 2 * g, 0, h1).unwrap();
    assert_eq!(
        code(d.vmm_map(va.offset(g), g, 0, h2).unwrap_err()),
        1,
        "overlap"
    );
    assert_eq!(
        code(d.vmm_map(va.offset(2 * g), 2 * g, 0, h2).unwrap_err()),
        1,
        "too long"
    );
    assert_eq!(
        code(d.vmm_map(va.offset(2 * g), g, g, h2).unwrap_err()),
        801,
        "a nonzero offset is not supported, as on CUDA"
    );
    assert_eq!(
        code(d.vmm_map(va.offset(7 * g), 2 * g, 0, h1).unwrap_err()),
        1,
        "outside"
    );
    assert_eq!(
        code(d.vmm_map(va.offset(256), g, 0, h2).unwrap_err()),
        1,
        "unaligned"
    );
    assert_eq!(
        code(d.vmm_map(va.offset(2 * g), g, 0, 0x77).unwrap_err()),
        400
    );
    d.vmm_map(va.offset(2 * g), g, 0, h2).unwrap();
    d.vmm_map(va.offset(4 * g), 2 * g, 0, h1).unwrap(); // all of h1 again
    assert_eq!(d.mapped_bytes(), 5 * g);
    // Access: none until set, and set only on whole mappings.
    assert_eq!(code(d.memset(va, 0, 1, 0).unwrap_err()), 1);
    assert_eq!(
        code(
            d.vmm_set_access(va, g, 0, AccessFlags::ReadWrite)
                .unwrap_err()
        ),
        1
    );
    assert_eq!(
        code(
            d.vmm_set_access(va, 5 * g, 0, AccessFlags::ReadWrite)
                .unwrap_err()
        ),
        1,
        "gap"
    );
    d.vmm_set_access(va, 3 * g, 0, AccessFlags::ReadWrite)
        .unwrap();
    d.memset(va, 0, 3 * g, 0).unwrap();
    assert_eq!(code(d.memset(va, 0, 3 * g + 1, 0).unwrap_err()), 1);
    // Release while mapped: the memory stays until unmapped.
    d.vmm_release(h2).unwrap();
    assert_eq!(code(d.vmm_release(h2).unwrap_err()), 400);
    assert_eq!(d.physical_bytes(), 3 * g);
    assert_eq!(
        code(d.vmm_free_address(va, 8 * g).unwrap_err()),
        1,
        "still mapped"
    );
    assert_eq!(
        code(d.vmm_unmap(va, g).unwrap_err()),
        1,
        "part of a mapping"
    );
    d.vmm_unmap(va, 3 * g).unwrap();
    assert_eq!(d.physical_bytes(), 2 * g, "h2 freed once unmapped");
    d.vmm_release(h1).unwrap();
    assert_eq!(d.physical_bytes(), 2 * g, "h1 still mapped at 4g");
    d.vmm_unmap(va.offset(4 * g), 2 * g).unwrap();
    assert_eq!(
        code(d.vmm_free_address(va, 4 * g).unwrap_err()),
        1,
        "wrong size"
    );
    d.vmm_free_address(va, 8 * g).unwrap();
    assert_clean(&d);
}

#[test]
fn vmm_copies_across_pages_of_different_handles() {
    let g = 2 * MIB;
    let d = SimDriver::new(SimConfig::backed(16 * MIB));
    let va = d.vmm_reserve(3 * g, 0).unwrap();
    let h1 = d.vmm_create(0, g, HandleType::None.into()).unwrap();
    let h2 = d.vmm_create(0, g, HandleType::None.into()).unwrap();
    let h3 = d.vmm_create(0, g, HandleType::None.into()).unwrap();
    d.vmm_map(va, g, 0, h1).unwrap();
    d.vmm_map(va.offset(g), g, 0, h3).unwrap();
    d.vmm_map(va.offset(2 * g), g, 0, h2).unwrap();
    d.vmm_set_access(va, 3 * g, 0, AccessFlags::ReadWrite)
        .unwrap();
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    let at = va.offset(g - 2048);
    put(&d, at, &data, 0);
    assert_eq!(get(&d, at, 4096), data);
    // The same physical bytes seen through a second mapping elsewhere.
    let va2 = d.vmm_reserve(g, 0).unwrap();
    d.vmm_map(va2, g, 0, h1).unwrap();
    d.vmm_set_access(va2, g, 0, AccessFlags::Read).unwrap();
    assert_eq!(get(&d, va2.offset(g - 2048), 2048), &data[..2048]);
    assert_eq!(code(d.memset(va2, 0, 1, 0).unwrap_err()), 1, "read only");
    // A copy spanning the seam between h3 and h2.
    d.memset(va.offset(2 * g - 8), 0x33, 16, 0).unwrap();
    assert_eq!(get(&d, va.offset(2 * g - 8), 16), vec![0x33; 16]);
    d.dtod(va.offset(2 * g + g / 2), at, 4096, 0).unwrap();
    assert_eq!(get(&d, va.offset(2 * g + g / 2), 4096), data);
    // Import through a file descriptor needs a PosixFd handle.
    assert_eq!(code(d.vmm_export_fd(h1).unwrap_err()), 1);
    let hx = d.vmm_create(0, g, HandleType::PosixFd.into()).unwrap();
    let fd = d.vmm_export_fd(hx).unwrap();
    let hy = d.vmm_import_fd(fd.as_fd()).unwrap();
    drop(fd);
    d.vmm_release(hx).unwrap();
    assert_eq!(d.physical_bytes(), 4 * g, "imported handle keeps it alive");
    d.vmm_release(hy).unwrap();
    for (p, n) in [(va, 3 * g), (va2, g)] {
        d.vmm_unmap(p, n).unwrap();
        d.vmm_free_address(p, n).unwrap();
    }
    d.vmm_release(h1).unwrap();
    d.vmm_release(h2).unwrap();
    d.vmm_release(h3).unwrap();
    assert_clean(&d);
}

// ----- threads -----

#[test]
fn many_threads_allocate_concurrently() {
    let d = Arc::new(sim());
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let d = d.clone();
            std::thread::spawn(move || {
                let s = d.stream_create(0, true).unwrap();
                let mut live = Vec::new();
                for i in 0..500 {
                    live.push(d.mem_alloc_async(256 * (1 + (i + t) % 64), s).unwrap());
                    if i % 3 == 0 {
                        d.mem_free_async(live.swap_remove(0), s).unwrap();
                    }
                    if i % 5 == 0 {
                        d.mem_free(0, d.mem_alloc(0, 1 << 16).unwrap()).unwrap();
                    }
                }
                for p in live {
                    d.mem_free_async(p, s).unwrap();
                }
                d.stream_destroy(s).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    d.device_synchronize(0).unwrap();
    assert_clean(&d);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Random stream-ordered allocations and frees on two streams, some held:
    /// used <= reserved, reserved is what the device is charged, live blocks
    /// never overlap, and everything goes back after a synchronize.
    #[test]
    fn pool_invariants(ops in proptest::collection::vec((0u8..6, 1usize..5 * MIB, any::<usize>()), 1..150)) {
        let d = SimDriver::new(SimConfig { capacity: 256 * MIB, ..SimConfig::default() });
        let p = d.mempool_default(0).unwrap();
        let s = [d.stream_create(0, true).unwrap(), d.stream_create(0, true).unwrap()];
        let mut live: Vec<(u64, u64, usize)> = Vec::new();
        for (op, bytes, pick) in ops {
            let st = s[pick % 2];
            match op {
                0 | 1 => match d.mem_alloc_async(bytes, st) {
                    Ok(ptr) => {
                        let len = bytes.div_ceil(256) as u64 * 256;
                        for &(a, l, _) in &live {
                            prop_assert!(ptr.0 + len <= a || a + l <= ptr.0, "overlap");
                        }
                        live.push((ptr.0, len, pick % 2));
                    }
                    Err(e) => prop_assert!(e.is_oom()),
                },
                2 if !live.is_empty() => {
                    let (a, _, _) = live.swap_remove(pick % live.len());
                    d.mem_free_async(DevicePtr(a), st).unwrap();
                }
                3 => d.hold(st),
                4 => d.release(st),
                _ => d.stream_synchronize(st).unwrap(),
            }
            let used = d.mempool_get_attr(p, PoolAttr::UsedMemCurrent).unwrap();
            let reserved = d.mempool_get_attr(p, PoolAttr::ReservedMemCurrent).unwrap();
            prop_assert!(used <= reserved);
            prop_assert!(used >= live.iter().map(|x| x.1).sum::<u64>());
            prop_assert_eq!(d.device_bytes(0) as u64, reserved);
            prop_assert!(reserved <= 256 * MIB as u64);
        }
        for (a, _, which) in live {
            d.mem_free_async(DevicePtr(a), s[which]).unwrap();
        }
        d.device_synchronize(0).unwrap();
        prop_assert_eq!(d.mempool_get_attr(p, PoolAttr::UsedMemCurrent).unwrap(), 0);
        prop_assert_eq!(d.mempool_get_attr(p, PoolAttr::ReservedMemCurrent).unwrap(), 0);
        for x in s {
            d.stream_destroy(x).unwrap();
        }
        assert_clean(&d);
    }
}

/// Rough cost of the simulator's bookkeeping (run with --ignored --nocapture).
#[test]
#[ignore]
fn bench_bookkeeping() {
    let d = sim();
    let p = d.mempool_default(0).unwrap();
    d.mempool_set_attr(p, PoolAttr::ReleaseThreshold, u64::MAX)
        .unwrap();
    let n = 200_000;
    let t = std::time::Instant::now();
    for _ in 0..n {
        let a = d.mem_alloc_async(MIB, 0).unwrap();
        d.mem_free_async(a, 0).unwrap();
    }
    println!("alloc_async+free_async: {:?}/pair", t.elapsed() / n);
    let mut live = Vec::new();
    let t = std::time::Instant::now();
    for i in 0..n {
        live.push(
            d.mem_alloc(0, 256 * (1 + (i as usize * 7919) % 4096))
                .unwrap(),
        );
        if i % 2 == 1 {
            d.mem_free(0, live.swap_remove((i as usize * 31) % live.len()))
                .unwrap();
        }
    }
    println!(
        "mem_alloc/free with ~{} live: {:?}/op",
        live.len(),
        t.elapsed() / (n + n / 2)
    );
}

#[test]
fn a_gated_call_waits_for_its_gate_and_others_do_not() {
    use std::time::Duration;
    let d = Arc::new(SimDriver::new(SimConfig::default()));
    let gate = d.gate_call("cuMemAlloc", 2);
    let first = d.mem_alloc(0, 1 << 20).unwrap(); // the first passes
    std::thread::scope(|s| {
        let d2 = d.clone();
        let second = s.spawn(move || d2.mem_alloc(0, 1 << 20).unwrap());
        assert!(gate.wait_arrival(Duration::from_secs(60)));
        // Stopped before it ran: nothing allocated yet, other calls go on.
        assert_eq!(d.device_allocations(0), 1);
        d.mem_info(0).unwrap();
        gate.open();
        let p = second.join().unwrap();
        assert_eq!(d.device_allocations(0), 2);
        d.mem_free(0, p).unwrap();
    });
    d.mem_free(0, first).unwrap();
    // A gate never reached stops nothing once its handle is gone.
    drop(d.gate_call("cuMemAlloc", 1));
    let p = d.mem_alloc(0, 1 << 20).unwrap();
    d.mem_free(0, p).unwrap();
}

// ----- the `unsafe` methods' contract, broken -----

/// What a broken promise of the trait's `unsafe` methods (a handle that is
/// not live, memory that is not the caller's) does on the simulator: the
/// call is refused with an error, and nothing changes. The calls go through
/// the trait, not this file's safe forms. The codes: for streams and events,
/// and for memory and address ranges, those the CUDA driver documents for
/// what it detects of the same misuse (`CUDA_ERROR_INVALID_HANDLE`,
/// `CUDA_ERROR_INVALID_VALUE`); for pool and physical handles the simulator
/// says `CUDA_ERROR_INVALID_HANDLE` where CUDA documents only
/// `CUDA_ERROR_INVALID_VALUE` (and, for `cuMemRelease`, undefined
/// behaviour).
#[test]
fn stale_handles_are_refused() {
    const INVALID_VALUE: i32 = 1;
    const INVALID_HANDLE: i32 = 400;
    let d = sim();
    let drv: &dyn Driver = &d;
    let s = d.stream_create(0, true).unwrap();
    let e = d.event_create(0).unwrap();
    let pool = d.mempool_create(&PoolProps::device(0)).unwrap();
    let plain = d.mem_alloc(0, 4096).unwrap();
    let host = d
        .mem_alloc_host(0, 4096, HostAllocFlags::default())
        .unwrap();
    let gran = d.vmm_granularity(0, false).unwrap();
    let va = d.vmm_reserve(gran, 0).unwrap();
    let phys = d.vmm_create(0, gran, HandleType::None.into()).unwrap();
    // SAFETY: every handle was just made by `d` and is destroyed once, here.
    unsafe {
        let pooled = drv.mem_alloc_from_pool_async(4096, pool, s).unwrap();
        drv.mem_free_async(pooled, s).unwrap();
        drv.stream_synchronize(s).unwrap();
        drv.stream_destroy(s).unwrap();
        drv.event_destroy(e).unwrap();
        drv.mempool_destroy(pool).unwrap();
        drv.mem_free(0, plain).unwrap();
        drv.mem_free_host(host).unwrap();
        drv.vmm_release(phys).unwrap();
        drv.vmm_free_address(va, gran).unwrap();
    }
    assert_clean(&d);
    let before = d.total_calls();
    let refused = |r: crate::Result<()>, want: i32| assert_eq!(code(r.unwrap_err()), want);
    // SAFETY: none, on purpose: every handle and range below is destroyed,
    // which the contracts forbid. The simulator keeps them as keys of its
    // tables and refuses the ones it does not hold, which is what this test
    // checks; it runs on the simulator only.
    unsafe {
        refused(drv.stream_destroy(s), INVALID_HANDLE);
        refused(drv.stream_synchronize(s), INVALID_HANDLE);
        refused(drv.stream_query(s).map(drop), INVALID_HANDLE);
        refused(drv.stream_wait_event(0, e), INVALID_HANDLE);
        refused(drv.event_record(e, 0), INVALID_HANDLE);
        refused(drv.event_query(e).map(drop), INVALID_HANDLE);
        refused(drv.event_synchronize(e), INVALID_HANDLE);
        refused(drv.event_destroy(e), INVALID_HANDLE);
        refused(drv.mem_alloc_async(256, s).map(drop), INVALID_HANDLE);
        refused(drv.mem_free(0, plain), INVALID_VALUE);
        refused(drv.mem_free_host(host), INVALID_VALUE);
        refused(drv.vmm_unmap(va, gran), INVALID_VALUE);
        refused(drv.vmm_free_address(va, gran), INVALID_VALUE);
        let attr = PoolAttr::ReservedMemCurrent;
        refused(drv.mempool_destroy(pool), INVALID_HANDLE);
        refused(drv.mempool_trim_to(pool, 0), INVALID_HANDLE);
        refused(drv.mempool_get_attr(pool, attr).map(drop), INVALID_HANDLE);
        refused(
            drv.mem_alloc_from_pool_async(256, pool, 0).map(drop),
            INVALID_HANDLE,
        );
        refused(drv.vmm_release(phys), INVALID_HANDLE);
        refused(drv.vmm_map(va, gran, 0, phys), INVALID_HANDLE);
    }
    assert_eq!(
        d.total_calls(),
        before + 19,
        "each call reached the simulator"
    );
    assert_clean(&d);
}
