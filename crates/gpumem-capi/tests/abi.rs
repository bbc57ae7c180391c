//! The extern "C" functions, called directly, over the simulated device with
//! `GPUMEM_CONF=resource=pool,max_size=64MiB` (the configuration is read once
//! per process, so each configuration has its own test binary).

use std::ffi::{c_void, CStr};
use std::ptr::null_mut;
use std::sync::Once;

use gpumem_capi::*;

const MIB: usize = 1 << 20;

fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Set before the first call into the library, which reads them.
        std::env::set_var("GPUMEM_DEVICE", "sim");
        std::env::set_var("GPUMEM_CONF", "resource=pool,max_size=64MiB");
        assert_eq!(global().conf().max_size, Some(64 * MIB));
    });
}

fn stream(raw: u64) -> gpumem_stream_t {
    raw as usize as *mut c_void
}

/// Each test uses its own device so that parallel tests see only their own
/// numbers.
mod dev {
    pub const STATS: i32 = 0;
    pub const OOM: i32 = 1;
    pub const EMPTY: i32 = 2;
    pub const STREAMS: i32 = 3;
    pub const CUPY: i32 = 4;
    pub const THREADS: i32 = 5;
    pub const EDGES: i32 = 6;
    pub const TORCH: i32 = 7;
}

#[test]
fn stats_follow_allocations() {
    setup();
    let d = dev::STATS;
    assert_eq!(gpumem_allocated_bytes(d), 0, "nothing before first use");
    assert_eq!(gpumem_reserved_bytes(d), 0);
    let a = gpumem_malloc(MIB as isize, d, null_mut());
    assert!(!a.is_null());
    assert_eq!(a as usize % 256, 0, "256-byte aligned");
    assert_eq!(gpumem_allocated_bytes(d), MIB);
    assert!(gpumem_reserved_bytes(d) >= MIB);
    let b = gpumem_malloc(1000, d, null_mut());
    assert_eq!(gpumem_allocated_bytes(d), MIB + 1024, "counted at 256 B");
    let peak = gpumem_peak_reserved_bytes(d);
    assert!(peak >= gpumem_reserved_bytes(d));
    assert!(gpumem_peak_allocated_bytes(d) >= MIB + 1024);
    gpumem_free(a, MIB as isize, d, null_mut());
    gpumem_free(b, 1000, d, null_mut());
    assert_eq!(gpumem_allocated_bytes(d), 0);
    assert_eq!(gpumem_peak_allocated_bytes(d), MIB + 1024, "peak stays");
    gpumem_reset_peak(d);
    assert_eq!(gpumem_peak_allocated_bytes(d), 0);
    assert_eq!(
        gpumem_peak_reserved_bytes(d),
        gpumem_reserved_bytes(d),
        "reset brings the reserved peak to the reserve"
    );
    // Reuse: the same request again takes nothing new from the driver.
    let reserved = gpumem_reserved_bytes(d);
    let c = gpumem_malloc(MIB as isize, d, null_mut());
    assert_eq!(gpumem_reserved_bytes(d), reserved);
    gpumem_free(c, MIB as isize, d, null_mut());
}

#[test]
fn out_of_memory_is_null() {
    setup();
    let d = dev::OOM;
    assert!(
        gpumem_malloc(1 << 30, d, null_mut()).is_null(),
        "1 GiB over a 64 MiB limit"
    );
    assert_eq!(gpumem_allocated_bytes(d), 0);
    let a = gpumem_malloc((48 * MIB) as isize, d, null_mut());
    assert!(!a.is_null());
    assert!(
        gpumem_malloc((32 * MIB) as isize, d, null_mut()).is_null(),
        "past the limit"
    );
    assert!(gpumem_reserved_bytes(d) <= 64 * MIB);
    gpumem_free(a, (48 * MIB) as isize, d, null_mut());
    let b = gpumem_malloc((32 * MIB) as isize, d, null_mut());
    assert!(!b.is_null(), "fits once the first is freed");
    gpumem_free(b, (32 * MIB) as isize, d, null_mut());
    // A 1 PiB request fails cleanly too.
    assert!(gpumem_malloc(1 << 50, d, null_mut()).is_null());
    assert!(gpumem_cupy_malloc(null_mut(), 1 << 50, d).is_null());
}

#[test]
fn empty_cache_gives_memory_back() {
    setup();
    let d = dev::EMPTY;
    let ptrs: Vec<_> = (0..8)
        .map(|_| gpumem_malloc((3 * MIB) as isize, d, null_mut()))
        .collect();
    assert!(ptrs.iter().all(|p| !p.is_null()));
    let full = gpumem_reserved_bytes(d);
    assert!(full >= 24 * MIB);
    for p in ptrs {
        gpumem_free(p, (3 * MIB) as isize, d, null_mut());
    }
    assert_eq!(gpumem_reserved_bytes(d), full, "a pool keeps what it freed");
    gpumem_empty_cache(d);
    assert_eq!(gpumem_reserved_bytes(d), 0, "everything was free");
    assert_eq!(gpumem_peak_reserved_bytes(d), full, "the peak remembers");
    let sim = global_sim_driver().expect("sim backend");
    assert_eq!(sim.device_bytes(d as u32), 0, "the driver got it back");
}

#[test]
fn foreign_streams_are_served_and_reused() {
    setup();
    let d = dev::STREAMS;
    let sim = global_sim_driver().expect("sim backend");
    let driver: &dyn gpumem::driver::Driver = &*sim;
    let s1 = driver.stream_create(d as u32, true).unwrap();
    let s2 = driver.stream_create(d as u32, true).unwrap();
    let a = gpumem_malloc(4096, d, stream(s1));
    assert!(!a.is_null());
    gpumem_free(a, 4096, d, stream(s1));
    // Same stream, same size: the block freed on it comes back at once.
    let b = gpumem_malloc(4096, d, stream(s1));
    assert_eq!(a, b, "same-stream reuse through one wrapper per handle");
    // Another stream while s1 has pending work must not get s1's block.
    sim.hold(s1);
    let ev = driver.event_create(d as u32).unwrap();
    // SAFETY: `ev` and `s1` are this test's, live.
    unsafe { driver.event_record(ev, s1) }.unwrap(); // pending work on s1
    let pos = sim.stream_position(s1);
    gpumem_free(b, 4096, d, stream(s1));
    let c = gpumem_malloc(4096, d, stream(s2));
    assert!(!c.is_null());
    if c == b {
        assert!(
            sim.is_ordered_after(s1, pos, s2),
            "s2 got s1's block without waiting for s1"
        );
    }
    sim.release(s1);
    gpumem_free(c, 4096, d, stream(s2));
    // SAFETY: `ev` is this test's, destroyed once.
    unsafe { driver.event_destroy(ev) }.unwrap();
    // The legacy and per-thread default handles are served too.
    for raw in [0u64, 1, 2] {
        let p = gpumem_malloc(512, d, stream(raw));
        assert!(!p.is_null(), "stream handle {raw}");
        gpumem_free(p, 512, d, stream(raw));
    }
    gpumem_empty_cache(d);
    assert_eq!(gpumem_allocated_bytes(d), 0);
    // SAFETY: this test's streams, destroyed once; the cache was emptied,
    // nothing freed on them is pending.
    unsafe {
        driver.stream_destroy(s1).unwrap();
        driver.stream_destroy(s2).unwrap();
    }
}

#[test]
fn cupy_entry_points_remember_sizes() {
    setup();
    let d = dev::CUPY;
    let param = 0x1234usize as *mut c_void; // ignored
    assert!(gpumem_cupy_malloc(param, 0, d).is_null(), "zero bytes");
    let a = gpumem_cupy_malloc(param, 3 * MIB, d);
    let b = gpumem_cupy_malloc(param, 100, d);
    assert!(!a.is_null() && !b.is_null());
    assert_eq!(gpumem_allocated_bytes(d), 3 * MIB + 256);
    gpumem_cupy_free(param, a, d);
    assert_eq!(gpumem_allocated_bytes(d), 256);
    gpumem_cupy_free(param, b, d);
    assert_eq!(gpumem_allocated_bytes(d), 0);
    // Twice, or never allocated: counted and reported, nothing freed.
    gpumem_cupy_free(param, b, d);
    gpumem_cupy_free(param, 0xdead_0000usize as *mut c_void, d);
    gpumem_cupy_free(param, null_mut(), d);
    assert_eq!(gpumem_allocated_bytes(d), 0);
    assert_eq!(gpumem_bad_free_count(d), 2);
}

#[test]
fn threads_share_a_device() {
    setup();
    let d = dev::THREADS;
    let sim = global_sim_driver().expect("sim backend");
    let driver: &dyn gpumem::driver::Driver = &*sim;
    let streams: Vec<u64> = (0..4)
        .map(|_| driver.stream_create(d as u32, true).unwrap())
        .collect();
    std::thread::scope(|scope| {
        for (t, &s) in streams.iter().enumerate() {
            scope.spawn(move || {
                let mut live = Vec::new();
                for i in 0..500usize {
                    let size = 256 + (i * 7919 + t * 104729) % (256 * 1024);
                    let p = gpumem_malloc(size as isize, d, stream(s));
                    assert!(!p.is_null());
                    live.push((p as usize, size));
                    if live.len() > 16 {
                        let (p, size) = live.swap_remove(i % live.len());
                        gpumem_free(p as *mut c_void, size as isize, d, stream(s));
                    }
                }
                for (p, size) in live {
                    gpumem_free(p as *mut c_void, size as isize, d, stream(s));
                }
            });
        }
    });
    assert_eq!(gpumem_allocated_bytes(d), 0);
    assert!(gpumem_peak_allocated_bytes(d) > 0);
    for s in streams {
        // SAFETY: this test's streams, destroyed once; nothing freed on them is pending any more (all freed and synchronized).
        unsafe { driver.stream_destroy(s) }.unwrap();
    }
}

#[test]
fn edge_cases_return_null_or_do_nothing() {
    setup();
    let d = dev::EDGES;
    assert!(
        gpumem_malloc(0, d, null_mut()).is_null(),
        "zero bytes: NULL, like cudaMalloc"
    );
    assert!(gpumem_malloc(-5, d, null_mut()).is_null(), "negative size");
    assert!(
        gpumem_malloc(256, -1, null_mut()).is_null(),
        "negative device"
    );
    assert!(
        gpumem_malloc(256, 1000, null_mut()).is_null(),
        "device out of range"
    );
    assert!(
        gpumem_malloc(256, 60, null_mut()).is_null(),
        "device the driver lacks"
    );
    gpumem_free(null_mut(), 0, d, null_mut());
    gpumem_free(null_mut(), 256, d, null_mut());
    // PyTorch frees an empty tensor's NULL with size 0.
    let p = gpumem_malloc(0, d, null_mut());
    gpumem_free(p, 0, d, null_mut());
    // Bad frees: counted, reported, nothing freed, and the allocator still
    // works. NULL is not one.
    assert_eq!(gpumem_bad_free_count(d), 0);
    gpumem_free(0x1000usize as *mut c_void, 256, d, null_mut());
    gpumem_free(0x1000usize as *mut c_void, 256, 1000, null_mut());
    gpumem_free(0x1000usize as *mut c_void, 256, 59, null_mut());
    assert_eq!(gpumem_bad_free_count(d), 1);
    assert_eq!(gpumem_bad_free_count(59), 1);
    assert_eq!(
        gpumem_bad_free_count(1000),
        0,
        "no such device: in the total"
    );
    assert!(gpumem_bad_free_count(-1) >= 3);
    let q = gpumem_malloc(256, d, null_mut());
    assert!(!q.is_null());
    gpumem_free(q, 255, d, null_mut());
    gpumem_free(q, 256, d, null_mut());
    gpumem_free(q, 256, d, null_mut());
    assert_eq!(gpumem_bad_free_count(d), 3, "wrong size, then double free");
    assert_eq!(gpumem_allocated_bytes(d), 0);
    assert!(
        gpumem_config_error().is_null(),
        "the configuration is valid"
    );
    // Statistics of devices never used (or out of range) are zero.
    for dev in [-1, 40, 1000] {
        assert_eq!(gpumem_allocated_bytes(dev), 0);
        assert_eq!(gpumem_reserved_bytes(dev), 0);
        assert_eq!(gpumem_peak_reserved_bytes(dev), 0);
        gpumem_reset_peak(dev);
        gpumem_empty_cache(dev);
    }
}

/// The functions PyTorch's native allocator calls, through C: statistics
/// into the C struct, resets, the memory fraction, record_stream, snapshots
/// into caller arrays (too small first), and the thread's last error.
#[test]
fn torch_entry_points_through_c() {
    setup();
    let d = dev::TORCH;
    let read = |d| {
        let mut s = gpumem_device_stats_t::default();
        // SAFETY: a writable struct.
        let rc = unsafe { gpumem_get_device_stats(d, &mut s) };
        (rc, s)
    };
    assert_eq!(read(d), (0, gpumem_device_stats_t::default()), "never used");
    assert_eq!(read(64).0, -1);
    assert_eq!(read(-1).0, -1);
    // SAFETY: NULL is refused.
    assert_eq!(
        unsafe { gpumem_get_device_stats(d, std::ptr::null_mut()) },
        -1
    );

    let sim = global_sim_driver().expect("sim backend");
    let driver: &dyn gpumem::driver::Driver = &*sim;
    let other = driver.stream_create(d as u32, true).unwrap();
    let ptrs: Vec<_> = [1000usize, 2 * MIB, 5 * MIB]
        .iter()
        .map(|&n| (gpumem_malloc(n as isize, d, null_mut()), n))
        .collect();
    let (rc, s) = read(d);
    assert_eq!(rc, 0);
    assert_eq!(s.allocation.current, 3);
    assert_eq!(
        s.allocated_bytes.current as usize,
        gpumem_allocated_bytes(d)
    );
    assert_eq!(s.reserved_bytes.current as usize, gpumem_reserved_bytes(d));

    // Snapshot: counts first, then arrays too small, then large enough.
    let (mut ns, mut nb) = (0usize, 0usize);
    // SAFETY: NULL arrays with maxima of 0; writable counts.
    let rc = unsafe {
        gpumem_snapshot(
            d,
            std::ptr::null_mut(),
            0,
            &mut ns,
            std::ptr::null_mut(),
            0,
            &mut nb,
        )
    };
    assert_eq!((rc, nb), (0, 3));
    assert!(ns >= 1);
    let mut segs = vec![gpumem_segment_t::default(); ns];
    let mut blocks = vec![gpumem_block_t::default(); 2];
    // SAFETY: arrays of the lengths passed.
    let rc = unsafe {
        gpumem_snapshot(
            d,
            segs.as_mut_ptr(),
            ns,
            &mut ns,
            blocks.as_mut_ptr(),
            2,
            &mut nb,
        )
    };
    assert_eq!((rc, nb), (0, 3), "the total, though only 2 fit");
    let mut sorted: Vec<_> = ptrs.iter().map(|&(p, n)| (p as u64, n as u64)).collect();
    sorted.sort();
    for (b, (p, n)) in blocks.iter().zip(&sorted) {
        assert_eq!(b.address, *p);
        assert!(b.size >= *n && b.requested <= b.size);
        assert!(segs
            .iter()
            .any(|s| s.address <= b.address && b.address + b.size <= s.address + s.size));
    }
    // SAFETY: a bad device writes nothing.
    assert_eq!(
        unsafe {
            gpumem_snapshot(
                -3,
                std::ptr::null_mut(),
                0,
                &mut ns,
                std::ptr::null_mut(),
                0,
                &mut nb,
            )
        },
        -1
    );

    // record_stream through C: the free waits for the held stream.
    let (p, n) = ptrs[2];
    gpumem_record_stream(p, d, stream(other));
    sim.hold(other);
    gpumem_free(p, n as isize, d, null_mut());
    let (_, s) = read(d);
    assert_eq!((s.allocation.current, s.active.current), (2, 3));
    sim.release(other);
    gpumem_empty_cache(d);
    let (_, s) = read(d);
    assert_eq!(s.active.current, 2);

    // Resets.
    gpumem_reset_peak_stats(d);
    let (_, s) = read(d);
    assert_eq!(s.allocated_bytes.peak, s.allocated_bytes.current);
    gpumem_reset_accumulated_stats(d);
    let (_, s) = read(d);
    assert_eq!((s.allocation.allocated, s.allocation.freed), (0, 0));
    assert_eq!(s.allocation.current, 2);

    // The fraction: 16 MiB of the 80 GiB device refuses 32 MiB, with the
    // reason for this thread; 1.0 lifts it.
    assert_eq!(gpumem_get_memory_fraction(d), 1.0);
    assert_eq!(gpumem_set_memory_fraction(d, 1.5), -1);
    assert_eq!(gpumem_set_memory_fraction(64, 0.5), -1);
    assert_eq!(gpumem_set_memory_fraction(d, 1.0 / 5120.0), 0);
    assert_eq!(gpumem_get_memory_fraction(d), 1.0 / 5120.0);
    assert!(gpumem_malloc((32 * MIB) as isize, d, null_mut()).is_null());
    let why = gpumem_last_error();
    assert!(!why.is_null());
    // SAFETY: a NUL-terminated string, valid until this thread's next malloc.
    let why = unsafe { CStr::from_ptr(why) }.to_str().unwrap().to_owned();
    assert!(
        why.contains("out of memory") && why.contains("limit 16777216 bytes"),
        "{why}"
    );
    let (_, s) = read(d);
    assert_eq!((s.num_alloc_retries, s.num_ooms), (1, 1));
    assert_eq!(gpumem_set_memory_fraction(d, 1.0), 0);
    let big = gpumem_malloc((32 * MIB) as isize, d, null_mut());
    assert!(!big.is_null());
    assert!(gpumem_last_error().is_null(), "the last call did not fail");
    gpumem_free(big, (32 * MIB) as isize, d, null_mut());
    for &(p, n) in &ptrs[..2] {
        gpumem_free(p, n as isize, d, null_mut());
    }
    assert_eq!(gpumem_allocated_bytes(d), 0);
    // SAFETY: `other` is this test's stream, destroyed once; nothing freed on it is pending.
    unsafe { driver.stream_destroy(other) }.unwrap();
}

/// PyTorch's `graph_capture_record_stream_reuse` through C: off until set,
/// any non-zero value turns it on, and each call returns the setting it
/// replaced.
#[test]
fn graph_capture_reuse_is_set_and_returns_the_previous_setting() {
    setup();
    assert!(!global().graph_capture_reuse());
    assert_eq!(gpumem_set_graph_capture_reuse(1), 0);
    assert!(global().graph_capture_reuse());
    assert_eq!(gpumem_set_graph_capture_reuse(7), 1);
    assert_eq!(gpumem_set_graph_capture_reuse(0), 1);
    assert!(!global().graph_capture_reuse());
}
