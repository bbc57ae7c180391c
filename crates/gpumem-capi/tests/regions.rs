//! Regions, sleep and wake through the C ABI: over a VirtualPool a region's
//! blocks keep their addresses and contents across a sleep that gives their
//! memory back, allocating in a region asleep and `record_stream` on its
//! blocks are refused, freeing them is not a bad free; every other resource
//! answers "not a VirtualPool". The extern functions are called directly
//! with `GPUMEM_CONF=resource=vpool` (this binary's configuration).

mod support;

use std::ffi::CStr;
use std::sync::{Arc, Once};

use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::Driver;
use gpumem::DevicePtr;
use gpumem_capi::allocator::last_error;
use gpumem_capi::conf::{parse, ResourceKind};
use gpumem_capi::regions::{RegionError, NOT_A_VIRTUAL_POOL};
use gpumem_capi::*;
use support::{allocator, kinds, sim, MIB};

const WEIGHTS: u32 = 5;

/// An allocator serving `resource=vpool` on a backed simulated device.
fn backed_vpool() -> Allocator {
    let parsed = parse("resource=vpool");
    let driver = Arc::new(SimDriver::new(SimConfig::backed(256 * MIB)));
    Allocator::new(parsed.conf, Backend::Sim(driver))
}

fn write(sim: &SimDriver, s: u64, p: DevicePtr, data: &[u8]) {
    let driver: &dyn Driver = sim;
    // SAFETY: `data` outlives the copy: the stream is synchronized below.
    unsafe { driver.memcpy_htod_async(p, data.as_ptr(), data.len(), s) }.unwrap();
    // SAFETY: the tests pass their own live streams.
    unsafe { driver.stream_synchronize(s) }.unwrap();
}

fn read(sim: &SimDriver, s: u64, p: DevicePtr, len: usize) -> Vec<u8> {
    let driver: &dyn Driver = sim;
    let mut out = vec![0u8; len];
    // SAFETY: `out` outlives the copy: the stream is synchronized below.
    unsafe { driver.memcpy_dtoh_async(out.as_mut_ptr(), p, len, s) }.unwrap();
    // SAFETY: as in `write`.
    unsafe { driver.stream_synchronize(s) }.unwrap();
    out
}

fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn a_region_sleeps_and_wakes_with_its_addresses_and_contents() {
    let a = backed_vpool();
    let sim = sim(&a);
    let driver: &dyn Driver = &*sim;
    let (s, t) = (
        driver.stream_create(0, true).unwrap(),
        driver.stream_create(0, true).unwrap(),
    );
    a.region_begin(0, WEIGHTS).unwrap();
    let sizes = [8 * MIB, 3 * MIB + 512, 12 * MIB];
    let blocks: Vec<(DevicePtr, usize)> = sizes.iter().map(|&n| (a.malloc(n, 0, s), n)).collect();
    assert_eq!(a.region_end(0), Ok(WEIGHTS));
    let other = a.malloc(2 * MIB, 0, s);
    for (i, &(p, n)) in blocks.iter().enumerate() {
        assert!(!p.is_null());
        write(&sim, s, p, &bytes(n, i as u8));
    }
    let reserved = a.reserved_bytes(0);
    let released = a.sleep(0, WEIGHTS, true).unwrap();
    // The last block's last extent also lies under the block outside the
    // region, and stays.
    assert!(released >= 8 * MIB, "{released}");
    assert_eq!(a.reserved_bytes(0), reserved - released);
    let asleep: usize = sizes.iter().map(|n| n.next_multiple_of(256)).sum();
    assert_eq!(a.sleeping_bytes(0, WEIGHTS), asleep);
    // Allocating in the region is refused, with the reason.
    a.region_begin(0, WEIGHTS).unwrap();
    assert!(a.malloc(MIB, 0, s).is_null());
    let why = last_error().unwrap();
    assert!(why.contains("asleep"), "{why}");
    a.region_end(0).unwrap();
    // record_stream on a sleeping block is refused; freeing it is fine.
    let (gone, gone_len) = blocks[0];
    a.record_stream(gone, 0, t);
    a.free(gone, gone_len, 0, s);
    assert_eq!(a.pending_frees(0), 0, "nothing was recorded");
    assert_eq!(a.bad_free_count(0), 0);
    assert_eq!(a.sleeping_bytes(0, WEIGHTS), asleep - gone_len);
    assert_eq!(a.wake(0, WEIGHTS).unwrap(), asleep - gone_len);
    for (i, &(p, n)) in blocks.iter().enumerate().skip(1) {
        assert_eq!(read(&sim, s, p, n), bytes(n, i as u8), "block {i}");
        a.free(p, n, 0, s);
    }
    a.free(other, 2 * MIB, 0, s);
    assert_eq!(a.allocated_bytes(0), 0);
    assert_eq!(sim.data_stats().faults, 0);
}

#[test]
fn regions_need_a_virtual_pool() {
    for kind in kinds() {
        if kind == ResourceKind::Virtual {
            continue;
        }
        let a = allocator(&format!("resource={kind}"));
        let e = a.region_begin(0, WEIGHTS).unwrap_err();
        assert!(matches!(e, RegionError::NotVirtual(_)), "{kind}: {e:?}");
        assert!(e.message().contains("resource=vpool"), "{kind}: {e:?}");
        assert!(matches!(
            a.sleep(0, WEIGHTS, true),
            Err(RegionError::NotVirtual(_))
        ));
        assert!(matches!(
            a.wake(0, WEIGHTS),
            Err(RegionError::NotVirtual(_))
        ));
        assert_eq!(a.sleeping_bytes(0, WEIGHTS), 0);
    }
}

/// A VirtualPool whose threads use several shards refuses regions, saying
/// how to get one shard; with one shard (or before spreading) they work.
#[test]
fn regions_need_the_pool_on_one_shard() {
    let a = allocator("resource=vpool,shards=4,spread=always");
    let e = a.region_begin(0, WEIGHTS).unwrap_err();
    assert!(matches!(e, RegionError::Failed(_)), "{e:?}");
    assert!(e.message().contains("shards"), "{e:?}");
    let b = allocator("resource=vpool,shards=4");
    b.region_begin(0, WEIGHTS).unwrap();
    assert_eq!(b.region_end(0).unwrap(), WEIGHTS);
}

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Set before the first call into the library, which reads them.
        std::env::set_var("GPUMEM_DEVICE", "sim");
        std::env::set_var("GPUMEM_CONF", "resource=vpool");
        assert_eq!(global().conf().resource, ResourceKind::Virtual);
    });
}

fn last() -> String {
    let p = gpumem_last_error();
    assert!(!p.is_null());
    // SAFETY: a non-NULL last error is a NUL-terminated string valid until
    // this thread's next allocation.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[test]
fn the_c_functions_return_codes_and_reasons() {
    setup();
    let d = 0;
    assert_eq!(gpumem_region_begin(d, 0), -1, "tag 0 is no region");
    assert!(last().contains("tag 0"), "{}", last());
    assert_eq!(gpumem_region_end(d), -1, "none begun");
    assert_eq!(gpumem_region_begin(d, WEIGHTS), 0);
    let p = gpumem_malloc(4 * MIB as isize, d, std::ptr::null_mut());
    assert!(!p.is_null());
    assert_eq!(gpumem_region_end(d), 0);
    assert_eq!(gpumem_sleeping_bytes(d, WEIGHTS), 0);
    assert_eq!(gpumem_wake(d, WEIGHTS), -1, "not asleep");
    assert_eq!(gpumem_sleep(d, WEIGHTS, 1), 0);
    assert_eq!(gpumem_sleeping_bytes(d, WEIGHTS), 4 * MIB);
    assert_eq!(gpumem_sleep(d, WEIGHTS, 0), -1);
    assert!(last().contains("already asleep"), "{}", last());
    assert_eq!(gpumem_wake(d, WEIGHTS), 0);
    assert_eq!(gpumem_sleeping_bytes(d, WEIGHTS), 0);
    assert_eq!(gpumem_sleep(-1, WEIGHTS, 1), -1, "no such device");
    assert_ne!(NOT_A_VIRTUAL_POOL, -1);
    gpumem_free(p, 4 * MIB as isize, d, std::ptr::null_mut());
    assert_eq!(gpumem_allocated_bytes(d), 0);
}

/// Asking how much of a region sleeps builds no device, so the
/// configuration can still change afterwards.
#[test]
fn sleeping_bytes_builds_nothing() {
    let a = allocator("resource=pool");
    assert_eq!(a.sleeping_bytes(0, WEIGHTS), 0);
    assert_eq!(a.resource_kind(0), None, "no device was built");
    a.configure("resource=vpool")
        .expect("the configuration can change");
    assert_eq!(a.sleeping_bytes(0, WEIGHTS), 0);
}
