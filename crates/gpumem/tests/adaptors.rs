//! The adaptors' own logic, over a strict host-only fake upstream (no driver
//! calls): limits, statistics frames, tracking and bad frees, the RMM log
//! format (checked against the real RMM logs in traces/), alignment, retry on
//! out-of-memory, the thread-safe wrapper and prefetch. The same adaptors run
//! through the shared resource suite on the simulated device in
//! `adaptors_sim.rs`.

mod fake;

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use fake::Fake;
use gpumem::adaptor::*;
use gpumem::resource::{MemoryResource, Properties};
use gpumem::{Device, DevicePtr, Error, FreeError, Result, Stream};

// ----- LimitingAdaptor -----

#[test]
fn limiting_counts_at_256_bytes_and_refuses_past_the_limit() {
    let mr = LimitingAdaptor::new(Fake::new(1 << 30), 1024);
    let s = mr.upstream().stream();
    let a = mr.allocate(1, 8, &s).unwrap();
    assert_eq!(
        mr.allocated_bytes(),
        256,
        "1 byte counts one 256-byte granule"
    );
    let b = mr.allocate(512, 256, &s).unwrap();
    let c = mr.allocate(200, 256, &s).unwrap();
    assert_eq!(mr.allocated_bytes(), 1024);
    assert_eq!(mr.available_bytes(), 0);
    let calls = mr.upstream().alloc_calls.load(Ordering::Relaxed);
    let err = mr.allocate(1, 256, &s).unwrap_err();
    let info = err.oom_info().expect("out of memory");
    assert_eq!(info.limit, Some(1024));
    assert_eq!(info.requested, 1);
    assert_eq!(info.live, Some(1024));
    assert_eq!(info.device, Some(0));
    assert!(err.to_string().contains("limit 1024"), "{err}");
    assert_eq!(
        mr.upstream().alloc_calls.load(Ordering::Relaxed),
        calls,
        "a refused request never reaches the upstream"
    );
    mr.deallocate(b, 512, 256, &s).unwrap();
    assert_eq!(mr.allocated_bytes(), 512);
    let d = mr.allocate(512, 256, &s).unwrap();
    for (p, n) in [(a, 1), (c, 200), (d, 512)] {
        mr.deallocate(p, n, 256, &s).unwrap();
    }
    assert_eq!(mr.allocated_bytes(), 0);
    assert_eq!(mr.upstream().live(), 0);
}

#[test]
fn limiting_gives_bytes_back_when_the_upstream_fails() {
    let mr = LimitingAdaptor::new(Fake::new(1000), 1 << 20);
    let s = mr.upstream().stream();
    let err = mr.allocate(4096, 256, &s).unwrap_err();
    assert!(err.is_oom());
    assert_eq!(
        err.oom_info().unwrap().limit,
        None,
        "the upstream's error, not the limit's"
    );
    assert_eq!(mr.allocated_bytes(), 0);
    assert!(mr.allocate(0, 256, &s).unwrap().is_null());
    assert!(matches!(
        mr.allocate(64, 3, &s),
        Err(Error::BadAlignment { alignment: 3 })
    ));
    // A 1 PiB request is refused by the limit with the requested bytes.
    let err = mr.allocate(1 << 50, 256, &s).unwrap_err();
    assert_eq!(err.oom_info().unwrap().requested, 1 << 50);
    // usize::MAX cannot even be rounded: still a clean out-of-memory.
    assert!(mr.allocate(usize::MAX, 256, &s).unwrap_err().is_oom());
}

#[test]
fn limiting_limit_changes_at_run_time() {
    let mr = LimitingAdaptor::new(Fake::new(1 << 30), 4096);
    let s = mr.upstream().stream();
    let a = mr.allocate(3072, 256, &s).unwrap();
    mr.set_limit(2048);
    assert_eq!(mr.limit(), 2048);
    assert_eq!(mr.available_bytes(), 0, "more live than the new limit");
    let err = mr.allocate(256, 256, &s).unwrap_err();
    assert_eq!(err.oom_info().unwrap().limit, Some(2048), "{err}");
    mr.deallocate(a, 3072, 256, &s).unwrap();
    let b = mr.allocate(2048, 256, &s).unwrap();
    assert!(mr.allocate(256, 256, &s).unwrap_err().is_oom());
    mr.set_limit(8192);
    let c = mr.allocate(4096, 256, &s).unwrap();
    mr.deallocate(b, 2048, 256, &s).unwrap();
    mr.deallocate(c, 4096, 256, &s).unwrap();
    assert_eq!(mr.allocated_bytes(), 0);
}

#[test]
fn limiting_never_overshoots_under_contention() {
    let limit = 64 * 256;
    let mr = Arc::new(LimitingAdaptor::new(Fake::new(1 << 30), limit));
    let peak = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let mr = mr.clone();
            let peak = peak.clone();
            std::thread::spawn(move || {
                let s = mr.upstream().stream();
                let mut mine = Vec::new();
                for i in 0..2000 {
                    if i % 3 != 2 {
                        if let Ok(p) = mr.allocate(256, 256, &s) {
                            mine.push(p);
                        }
                    } else if let Some(p) = mine.pop() {
                        mr.deallocate(p, 256, 256, &s).unwrap();
                    }
                    peak.fetch_max(mr.upstream().used(), Ordering::Relaxed);
                }
                for p in mine {
                    mr.deallocate(p, 256, 256, &s).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert!(peak.load(Ordering::Relaxed) <= limit);
    assert_eq!(mr.allocated_bytes(), 0);
}

// ----- StatisticsAdaptor -----

#[test]
fn statistics_counts_bytes_requests_and_ooms() {
    // Counting under the adaptor's own lock, and under the one its upstream lends.
    for mr in [Fake::new(1 << 20), Fake::lending(1 << 20)].map(StatisticsAdaptor::new) {
        let s = mr.upstream().stream();
        let a = mr.allocate(100, 256, &s).unwrap();
        let b = mr.allocate(1000, 256, &s).unwrap();
        assert!(mr.allocate(0, 256, &s).unwrap().is_null());
        assert!(mr.allocate(1 << 30, 256, &s).is_err());
        mr.deallocate(a, 100, 256, &s).unwrap();
        let st = mr.stats();
        assert_eq!(st.allocated_bytes.current, 1024);
        assert_eq!(st.allocated_bytes.peak, 256 + 1024);
        assert_eq!(st.allocated_bytes.total, 256 + 1024);
        assert_eq!(st.allocated_bytes.freed, 256);
        assert_eq!(st.requested_bytes.current, 1000);
        assert_eq!(st.requested_bytes.peak, 1100);
        assert_eq!(
            st.reserved_bytes, st.allocated_bytes,
            "reserved == allocated over a driver-like upstream"
        );
        assert_eq!(st.active.current, 1);
        assert_eq!(st.active.peak, 2);
        assert_eq!((st.num_allocs(), st.num_frees()), (2, 1));
        assert_eq!(st.num_ooms, 1);
        assert_eq!(st.num_alloc_retries, 0);
        mr.reset_peak();
        assert_eq!(mr.stats().allocated_bytes.peak, 1024);
        // A rejected free is not counted.
        assert!(mr.deallocate(DevicePtr(0x1234_5600), 100, 256, &s).is_err());
        assert_eq!(mr.stats().active.freed, 1);
        mr.deallocate(b, 1000, 256, &s).unwrap();
        assert_eq!(mr.stats().allocated_bytes.current, 0);
    }
}

#[test]
fn statistics_lose_no_update_from_threads_allocating_at_once() {
    for fake in [Fake::new(1 << 30), Fake::lending(1 << 30)] {
        let mr = Arc::new(StatisticsAdaptor::new(fake));
        let threads = 4;
        let rounds = 20_000;
        std::thread::scope(|scope| {
            for t in 0..threads {
                let mr = mr.clone();
                scope.spawn(move || {
                    let s = mr.upstream().stream();
                    let bytes = 256 * (t + 1);
                    let mut held = Vec::new();
                    for i in 0..rounds {
                        held.push(mr.allocate(bytes, 256, &s).unwrap());
                        if i % 4 == 3 {
                            for p in held.drain(..) {
                                mr.deallocate(p, bytes, 256, &s).unwrap();
                            }
                        }
                    }
                });
            }
        });
        let st = mr.stats();
        let n = (threads * rounds) as u64;
        let bytes: u64 = (1..=threads as u64).map(|t| 256 * t * rounds as u64).sum();
        for (stat, total) in [
            (st.allocation, n),
            (st.active, n),
            (st.allocated_bytes, bytes),
            (st.requested_bytes, bytes),
            (st.active_bytes, bytes),
        ] {
            assert_eq!((stat.current, stat.total, stat.freed), (0, total, total));
            // At most four blocks per thread were live at once.
            assert!(stat.peak > 0 && stat.peak as u64 <= total);
        }
        assert!(st.allocation.peak <= 4 * threads as i64);
    }
}

#[test]
fn statistics_deferred_frees_stay_active_until_finished() {
    for mr in [Fake::new(1 << 20), Fake::lending(1 << 20)].map(StatisticsAdaptor::new) {
        let s = mr.upstream().stream();
        let a = mr.allocate(1000, 256, &s).unwrap();
        let b = mr.allocate(300, 256, &s).unwrap();
        mr.begin_deferred_free(1000);
        let st = mr.stats();
        assert_eq!(
            st.allocated_bytes.current, 512,
            "the caller's free counts now"
        );
        assert_eq!(st.requested_bytes.current, 300);
        assert_eq!(st.allocation.current, 1);
        assert_eq!(st.active.current, 2, "the upstream still holds it");
        assert_eq!(st.active_bytes.current, 1024 + 512);
        assert_eq!(st.reserved_bytes, st.active_bytes);
        assert_eq!(mr.upstream().frees.load(Ordering::Relaxed), 0);
        // A refused deferred free counts nothing; cancelling makes it live again.
        assert!(mr
            .finish_deferred_free(DevicePtr(0x1234_5600), 1000, 256, &s)
            .is_err());
        assert_eq!(mr.stats().active.current, 2);
        mr.cancel_deferred_free(1000);
        let st = mr.stats();
        assert_eq!(st.allocated_bytes.current, 1024 + 512);
        assert_eq!(st.allocated_bytes.freed, 0);
        assert_eq!(st.allocation.current, 2);
        mr.begin_deferred_free(1000);
        mr.finish_deferred_free(a, 1000, 256, &s).unwrap();
        let st = mr.stats();
        assert_eq!((st.active.current, st.active_bytes.current), (1, 512));
        assert_eq!(st.active_bytes.peak, 1024 + 512);
        assert_eq!(mr.upstream().frees.load(Ordering::Relaxed), 1);
        mr.reset_peak();
        let st = mr.stats();
        assert_eq!(
            (st.allocation.peak, st.active.peak, st.active_bytes.peak),
            (1, 1, 512)
        );
        mr.deallocate(b, 300, 256, &s).unwrap();
        let st = mr.stats();
        assert_eq!((st.allocation.current, st.active.current), (0, 0));
        assert_eq!((st.allocation.total, st.allocation.freed), (2, 2));
    }
}

#[test]
fn statistics_of_rounded_blocks_count_the_block_and_the_request() {
    for mr in [Fake::new(1 << 20), Fake::lending(1 << 20)].map(StatisticsAdaptor::new) {
        let s = mr.upstream().stream();
        let a = mr.allocate_rounded(700, 1024, 256, &s).unwrap();
        let b = mr.allocate_rounded(8, 512, 256, &s).unwrap();
        let st = mr.stats();
        assert_eq!(st.requested_bytes.current, 708);
        assert_eq!(st.allocated_bytes.current, 1536);
        assert_eq!(st.active_bytes.current, 1536);
        assert!(
            mr.allocate_rounded(1025, 1024, 256, &s).is_err(),
            "a request larger than its block"
        );
        assert_eq!(mr.stats().allocation.total, 2);
        // Deferred: the caller's side now, the block's later.
        mr.begin_deferred_free_rounded(700, 1024);
        let st = mr.stats();
        assert_eq!(
            (st.requested_bytes.current, st.allocated_bytes.current),
            (8, 512)
        );
        assert_eq!(st.active_bytes.current, 1536);
        mr.cancel_deferred_free_rounded(700, 1024);
        assert_eq!(mr.stats().requested_bytes.current, 708);
        mr.begin_deferred_free_rounded(700, 1024);
        mr.finish_deferred_free(a, 1024, 256, &s).unwrap();
        mr.deallocate_rounded(b, 8, 512, 256, &s).unwrap();
        let st = mr.stats();
        assert_eq!(st.requested_bytes.current, 0);
        assert_eq!(st.requested_bytes.freed, 708);
        assert_eq!(
            (st.allocated_bytes.current, st.active_bytes.current),
            (0, 0)
        );
        assert_eq!(st.active_bytes.freed, 1536);
        assert_eq!(mr.upstream().frees.load(Ordering::Relaxed), 2);
    }
}

#[test]
fn statistics_frames_are_fresh_and_merge_peaks_into_the_parent() {
    for mr in [Fake::new(1 << 30), Fake::lending(1 << 30)].map(StatisticsAdaptor::new) {
        let s = mr.upstream().stream();
        let base = mr.allocate(10 * 256, 256, &s).unwrap(); // root at 2560
        assert_eq!(mr.push_frame(), 2);
        assert_eq!(
            mr.stats(),
            MemoryStats::default(),
            "a pushed frame starts at zero"
        );
        let x = mr.allocate(4 * 256, 256, &s).unwrap();
        let y = mr.allocate(2 * 256, 256, &s).unwrap();
        mr.deallocate(x, 4 * 256, 256, &s).unwrap();
        mr.deallocate(base, 10 * 256, 256, &s).unwrap(); // freed in the child: negative current
        let child = mr.pop_frame().expect("a pushed frame pops");
        assert_eq!(child.allocated_bytes.current, 2 * 256 - 10 * 256);
        assert_eq!(child.allocated_bytes.peak, 6 * 256);
        assert_eq!(child.allocated_bytes.total, 6 * 256);
        assert_eq!(child.active.total, 2);
        assert_eq!(child.active.freed, 2);
        let root = mr.stats();
        assert_eq!(root.allocated_bytes.current, 2 * 256);
        assert_eq!(
            root.allocated_bytes.peak,
            16 * 256,
            "parent at push (10) + child peak (6)"
        );
        assert_eq!(root.allocated_bytes.total, 16 * 256);
        assert_eq!(root.active.total, 3);
        assert_eq!(mr.pop_frame(), None, "the root frame stays");
        assert_eq!(mr.frame_depth(), 1);

        // Nested frames, and total_stats merging everything pushed.
        mr.push_frame();
        let a = mr.allocate(256, 256, &s).unwrap();
        mr.push_frame();
        let b = mr.allocate(512, 256, &s).unwrap();
        let total = mr.total_stats();
        assert_eq!(total.allocated_bytes.current, (2 + 1 + 2) * 256);
        assert_eq!(total.allocated_bytes.peak, 16 * 256);
        assert_eq!(total.active.total, 5);
        assert_eq!(mr.stats().allocated_bytes.current, 512);
        let inner = mr.pop_frame().unwrap();
        assert_eq!(inner.allocated_bytes.peak, 512);
        let outer = mr.pop_frame().unwrap();
        assert_eq!(outer.allocated_bytes.peak, 768);
        assert_eq!(mr.total_stats(), mr.stats());

        let ((), scoped) = mr.scoped(|| {
            let p = mr.allocate(300, 256, &s).unwrap();
            mr.deallocate(p, 300, 256, &s).unwrap();
        });
        assert_eq!(scoped.allocated_bytes.peak, 512);
        assert_eq!(scoped.allocated_bytes.current, 0);
        assert_eq!(scoped.requested_bytes.peak, 300);
        for (p, n) in [(y, 512), (a, 256), (b, 512)] {
            mr.deallocate(p, n, 256, &s).unwrap();
        }
        assert_eq!(mr.stats().allocated_bytes.current, 0);
    }
}

#[test]
fn statistics_sees_retries_of_a_failure_callback_below_it() {
    let fake = Arc::new(Fake::new(4096));
    let s = fake.stream();
    let hog = fake.allocate(4096, 256, &s).unwrap();
    let tries = Arc::new(AtomicUsize::new(0));
    let (fk, t) = (fake.clone(), tries.clone());
    let retry = FailureCallbackAdaptor::new(fake.clone(), move |_, _| {
        // Free the hog on the second call: two retries in all.
        if t.fetch_add(1, Ordering::Relaxed) == 1 {
            fk.deallocate(hog, 4096, 256, &fk.stream()).unwrap();
        }
        true
    });
    let counter = retry.retry_counter();
    let mr = StatisticsAdaptor::with_retry_counter(retry, counter);
    let p = mr.allocate(1024, 256, &s).unwrap();
    assert_eq!(mr.stats().num_alloc_retries, 2);
    assert_eq!(mr.upstream().retries(), 2);
    mr.push_frame();
    assert_eq!(
        mr.stats().num_alloc_retries,
        0,
        "a fresh frame counts its own retries"
    );
    mr.pop_frame();
    assert_eq!(mr.stats().num_alloc_retries, 2);
    mr.deallocate(p, 1024, 256, &s).unwrap();
}

// ----- TrackingAdaptor -----

#[test]
fn tracking_lists_outstanding_and_reports_leaks() {
    let mr = TrackingAdaptor::new(Fake::new(1 << 30));
    let s = mr.upstream().stream();
    let a = mr.allocate(1000, 256, &s).unwrap();
    let b = mr.allocate(24, 64, &s).unwrap();
    assert!(mr.allocate(0, 256, &s).unwrap().is_null());
    assert_eq!(mr.outstanding_count(), 2);
    assert_eq!(mr.outstanding_bytes(), 1024);
    let out = mr.outstanding();
    assert_eq!(out[0].ptr, a);
    assert_eq!(
        (out[0].bytes, out[0].alignment, out[0].stream),
        (1000, 256, s.id())
    );
    assert!(out[0].backtrace.is_none());
    let report = mr.leak_report();
    assert!(
        report.contains("2 allocation(s) outstanding, 1024 bytes"),
        "{report}"
    );
    assert!(
        report.contains(&format!("{:#x}: 1000 bytes", a.0)),
        "{report}"
    );
    assert!(
        report.contains(&format!("{:#x}: 24 bytes", b.0)),
        "{report}"
    );
    mr.deallocate(a, 1000, 256, &s).unwrap();
    mr.deallocate(b, 24, 64, &s).unwrap();
    assert_eq!(mr.outstanding_count(), 0);
    assert!(mr.leak_report().contains("0 allocation(s)"));
}

#[test]
fn tracking_rejects_bad_frees_without_forwarding_them() {
    let mr = TrackingAdaptor::new(Fake::new(1 << 30));
    let s = mr.upstream().stream();
    let p = mr.allocate(4096, 256, &s).unwrap();
    let forwarded = || mr.upstream().free_calls.load(Ordering::Relaxed);
    let before = forwarded();

    let e = mr.deallocate(p, 4000, 256, &s).unwrap_err();
    assert_eq!(
        e,
        Error::InvalidFree {
            ptr: p.0,
            reason: FreeError::SizeMismatch {
                allocated: 4096,
                freed: 4000
            }
        }
    );
    assert!(
        e.to_string().contains(&format!("{:#x}", p.0)),
        "names the pointer: {e}"
    );
    let bogus = DevicePtr(p.0 + 256);
    assert_eq!(
        mr.deallocate(bogus, 4096, 256, &s).unwrap_err(),
        Error::InvalidFree {
            ptr: bogus.0,
            reason: FreeError::Unknown
        }
    );
    assert_eq!(forwarded(), before, "bad frees never reach the upstream");
    assert_eq!(mr.outstanding_count(), 1, "the allocation is intact");

    mr.deallocate(p, 4096, 256, &s).unwrap();
    assert_eq!(forwarded(), before + 1);
    assert_eq!(
        mr.deallocate(p, 4096, 256, &s).unwrap_err(),
        Error::InvalidFree {
            ptr: p.0,
            reason: FreeError::DoubleFree
        }
    );
    assert_eq!(forwarded(), before + 1);
    assert_eq!(mr.upstream().live(), 0);
    // Freeing null is still fine.
    mr.deallocate(DevicePtr::NULL, 0, 256, &s).unwrap();
}

#[test]
fn tracking_captures_backtraces_when_asked() {
    let mr = TrackingAdaptor::with_backtraces(Fake::new(1 << 30), true);
    let s = mr.upstream().stream();
    let p = mr.allocate(512, 256, &s).unwrap();
    let out = mr.outstanding();
    let bt = out[0]
        .backtrace
        .as_ref()
        .expect("backtrace captured")
        .to_string();
    assert!(!bt.is_empty());
    assert!(
        mr.leak_report().lines().count() > 2,
        "report includes the backtrace"
    );
    mr.deallocate(p, 512, 256, &s).unwrap();
}

#[test]
fn tracking_keeps_the_record_when_the_upstream_refuses_the_free() {
    // The upstream rejects a free that tracking believes valid (the memory was
    // freed behind tracking's back): the upstream's error comes back and the
    // record stays.
    let fake = Fake::new(1 << 30);
    let s = fake.stream();
    let mr = TrackingAdaptor::new(CallbackUpstream(fake));
    let p = mr.allocate(300, 256, &s).unwrap();
    mr.upstream().0.deallocate(p, 300, 256, &s).unwrap(); // freed behind tracking's back
    assert!(matches!(
        mr.deallocate(p, 300, 256, &s),
        Err(Error::InvalidFree {
            reason: FreeError::Unknown,
            ..
        })
    ));
    assert_eq!(
        mr.outstanding_count(),
        1,
        "still outstanding: the upstream kept it"
    );
    std::mem::forget(mr); // skip the leak report on stderr
}

/// Forwards to a fake, so a test can reach the fake behind an adaptor.
struct CallbackUpstream(Fake);

impl MemoryResource for CallbackUpstream {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        self.0.allocate(bytes, alignment, stream)
    }
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.0.deallocate(ptr, bytes, alignment, stream)
    }
    fn device(&self) -> &Device {
        self.0.device()
    }
    fn properties(&self) -> Properties {
        self.0.properties()
    }
}

// ----- LoggingAdaptor -----

/// A writer whose bytes the test can read while the adaptor owns it.
#[derive(Clone, Default)]
struct SharedBuf(Arc<Mutex<Vec<u8>>>);

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl SharedBuf {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// A hex field as RMM's `fmt::ptr` writes it: `0x`, lowercase, no padding.
fn check_hex(field: &str) -> std::result::Result<(), String> {
    let digits = field
        .strip_prefix("0x")
        .ok_or(format!("{field:?}: no 0x"))?;
    if digits.is_empty()
        || !digits
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!("{field:?}: not lowercase hex"));
    }
    if digits.len() > 1 && digits.starts_with('0') {
        return Err(format!("{field:?}: padded"));
    }
    Ok(())
}

/// Checks one data line of an RMM log, field by field.
fn check_rmm_line(line: &str) -> std::result::Result<(), String> {
    let f: Vec<&str> = line.split(',').collect();
    if f.len() != 6 {
        return Err(format!("{line:?}: {} fields", f.len()));
    }
    if f[0].is_empty() || !f[0].bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{line:?}: thread not decimal"));
    }
    let t = f[1].as_bytes();
    let time_ok = t.len() == 15
        && t.iter().enumerate().all(|(i, &b)| match i {
            2 | 5 => b == b':',
            8 => b == b'.',
            _ => b.is_ascii_digit(),
        })
        && f[1][0..2].parse::<u32>().unwrap() < 24
        && f[1][3..5].parse::<u32>().unwrap() < 60
        && f[1][6..8].parse::<u32>().unwrap() < 60;
    if !time_ok {
        return Err(format!("{line:?}: time not HH:MM:SS.ffffff"));
    }
    if !["allocate", "allocate failure", "free"].contains(&f[2]) {
        return Err(format!("{line:?}: action {:?}", f[2]));
    }
    check_hex(f[3])?;
    if f[4].is_empty()
        || !f[4].bytes().all(|b| b.is_ascii_digit())
        || (f[4].len() > 1 && f[4].starts_with('0'))
    {
        return Err(format!("{line:?}: size not decimal"));
    }
    check_hex(f[5])
}

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../traces/resnet50_train.rmm.csv"
);

#[test]
fn the_checker_accepts_real_rmm_logs() {
    let Ok(text) = std::fs::read_to_string(TRACE) else {
        eprintln!("traces absent ({TRACE}): skipping the check against a real RMM log");
        return;
    };
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(LOG_HEADER), "same header as RMM");
    let mut n = 0;
    for line in lines {
        check_rmm_line(line).unwrap();
        n += 1;
    }
    assert!(n > 1000);
}

#[test]
fn logging_writes_rmm_csv() {
    let buf = SharedBuf::default();
    let mr = LoggingAdaptor::with_writer(Fake::new(1 << 20), buf.clone()).unwrap();
    let s = mr.upstream().stream();
    let p = mr.allocate(37632, 256, &s).unwrap();
    let q = mr.allocate(256, 256, &s).unwrap();
    assert!(mr.allocate(1 << 30, 256, &s).is_err());
    assert!(mr.allocate(0, 256, &s).unwrap().is_null());
    assert!(mr.allocate(64, 3, &s).is_err());
    mr.deallocate(q, 256, 256, &s).unwrap();
    mr.deallocate(p, 37632, 256, &s).unwrap();
    assert!(buf.text().is_empty(), "buffered until flushed");
    mr.flush().unwrap();

    let text = buf.text();
    assert!(text.ends_with('\n'));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], LOG_HEADER);
    assert_eq!(
        lines.len(),
        1 + 5,
        "zero-byte and bad-alignment requests are not logged:\n{text}"
    );
    for l in &lines[1..] {
        check_rmm_line(l).unwrap();
    }
    let fields = |i: usize| lines[i].split(',').collect::<Vec<_>>();
    let stream = format!("{:#x}", s.raw());
    assert_eq!(
        stream, "0x0",
        "the legacy stream prints as RMM prints a null stream"
    );
    assert_eq!(
        fields(1)[2..],
        ["allocate", &format!("{:#x}", p.0), "37632", &stream][..]
    );
    assert_eq!(
        fields(2)[2..],
        ["allocate", &format!("{:#x}", q.0), "256", &stream][..]
    );
    assert_eq!(
        fields(3)[2..],
        ["allocate failure", "0x0", "1073741824", &stream][..]
    );
    assert_eq!(
        fields(4)[2..],
        ["free", &format!("{:#x}", q.0), "256", &stream][..]
    );
    assert_eq!(
        fields(5)[2..],
        ["free", &format!("{:#x}", p.0), "37632", &stream][..]
    );
    assert!(fields(1)[0] == fields(5)[0], "one thread, one id");
}

#[test]
fn logging_to_a_file_flushes_on_drop_and_threads_get_their_ids() {
    let dir = std::env::temp_dir().join(format!("gpumem-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("a.csv");
    {
        let mr = Arc::new(LoggingAdaptor::new(Fake::new(1 << 30), &path).unwrap());
        assert_eq!(mr.path(), Some(path.as_path()));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let mr = mr.clone();
                std::thread::spawn(move || {
                    let s = mr.upstream().stream();
                    for i in 1..=100usize {
                        let p = mr.allocate(i * 8, 256, &s).unwrap();
                        mr.deallocate(p, i * 8, 256, &s).unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + 800, "every line reached the file on drop");
    let mut threads = std::collections::HashSet::new();
    for l in &lines[1..] {
        check_rmm_line(l).unwrap();
        threads.insert(l.split(',').next().unwrap().to_string());
    }
    assert_eq!(threads.len(), 4, "one thread id per thread");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn logging_to_a_path_that_cannot_be_written_is_an_io_error() {
    let Err(e) = LoggingAdaptor::new(Fake::new(1), "/nonexistent-dir/gpumem.csv") else {
        panic!("a log in a missing directory was created");
    };
    assert!(matches!(e, Error::Io(_)), "{e:?}");
    assert!(e.to_string().contains("/nonexistent-dir/gpumem.csv"), "{e}");
}

#[test]
fn logging_from_env_uses_gpumem_log_file() {
    let path = std::env::temp_dir().join(format!("gpumem-env-log-{}.csv", std::process::id()));
    // Only this test reads or writes the variable.
    std::env::remove_var(LOG_FILE_ENV);
    assert!(matches!(
        LoggingAdaptor::from_env(Fake::new(1)),
        Err(Error::InvalidArgument(_))
    ));
    std::env::set_var(LOG_FILE_ENV, &path);
    let mr = LoggingAdaptor::from_env(Fake::new(1 << 20))
        .unwrap()
        .with_auto_flush(true);
    std::env::remove_var(LOG_FILE_ENV);
    let s = mr.upstream().stream();
    let p = mr.allocate(4096, 256, &s).unwrap();
    // Auto-flush: on disk before any flush or drop.
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    mr.deallocate(p, 4096, 256, &s).unwrap();
    drop(mr);
    std::fs::remove_file(&path).unwrap();
    assert!(LoggingAdaptor::new(Fake::new(1), "/nonexistent-dir/x.csv").is_err());
}

// ----- AlignedAdaptor -----

#[test]
fn aligned_over_allocates_large_requests_and_frees_the_upstream_pointer() {
    let mr = AlignedAdaptor::with_threshold(Fake::new(1 << 30), 4096, 64 << 10).unwrap();
    let s = mr.upstream().stream();
    // Shift the fake's addresses off 4096 alignment.
    let filler = mr.allocate(256, 256, &s).unwrap();
    let big = mr.allocate(64 << 10, 256, &s).unwrap();
    assert_eq!(
        big.0 % 4096,
        0,
        "requests at the threshold get the adaptor's alignment"
    );
    assert_eq!(mr.over_aligned_count(), 1);
    let small = mr.allocate(1000, 256, &s).unwrap();
    assert_eq!(
        mr.upstream().size_of(small),
        Some(1000),
        "small requests are forwarded untouched"
    );
    let explicit = mr.allocate(1000, 2048, &s).unwrap();
    assert_eq!(
        explicit.0 % 2048,
        0,
        "an explicit alignment is honoured at any size"
    );
    assert_eq!(mr.over_aligned_count(), 2);
    // Unknown over-aligned pointer: rejected, nothing forwarded.
    let frees = mr.upstream().free_calls.load(Ordering::Relaxed);
    assert!(matches!(
        mr.deallocate(DevicePtr(big.0 + 4096), 64 << 10, 256, &s),
        Err(Error::InvalidFree {
            reason: FreeError::Unknown,
            ..
        })
    ));
    assert_eq!(mr.upstream().free_calls.load(Ordering::Relaxed), frees);
    mr.deallocate(big, 64 << 10, 256, &s).unwrap();
    mr.deallocate(explicit, 1000, 2048, &s).unwrap();
    mr.deallocate(small, 1000, 256, &s).unwrap();
    mr.deallocate(filler, 256, 256, &s).unwrap();
    assert_eq!(
        mr.upstream().live(),
        0,
        "the strict fake saw every upstream pointer back"
    );
    assert_eq!(mr.over_aligned_count(), 0);
    // The caller's size is reported on out-of-memory, not the padded one.
    let err = mr.allocate(1 << 50, 256, &s).unwrap_err();
    assert_eq!(err.oom_info().unwrap().requested, 1 << 50);
    assert!(matches!(
        AlignedAdaptor::new(Fake::new(1), 3000),
        Err(Error::BadAlignment { .. })
    ));
    assert_eq!(
        AlignedAdaptor::new(Fake::new(1), 4096).unwrap().threshold(),
        DEFAULT_ALIGNMENT_THRESHOLD
    );
}

// ----- FailureCallbackAdaptor -----

#[test]
fn failure_callback_retries_until_told_to_stop() {
    let fake = Arc::new(Fake::new(1 << 20));
    let s = fake.stream();
    let calls = Arc::new(Mutex::new(Vec::new()));
    let c = calls.clone();
    let mr = FailureCallbackAdaptor::new(fake.clone(), move |bytes, info| {
        let mut c = c.lock().unwrap();
        c.push((bytes, info.requested));
        c.len() < 3
    });
    let err = mr.allocate(2 << 20, 256, &s).unwrap_err();
    assert!(err.is_oom());
    assert_eq!(*calls.lock().unwrap(), vec![(2 << 20, 2 << 20); 3]);
    assert_eq!(mr.retries(), 2, "two trues, then false");
    // Other errors go straight back without the callback.
    assert!(matches!(
        mr.allocate(64, 3, &s),
        Err(Error::BadAlignment { .. })
    ));
    assert_eq!(calls.lock().unwrap().len(), 3);
    let p = mr.allocate(4096, 256, &s).unwrap();
    mr.deallocate(p, 4096, 256, &s).unwrap();
    assert_eq!(mr.retries(), 2);
    assert!(mr.allocate(0, 256, &s).unwrap().is_null());
}

// ----- ThreadSafeAdaptor -----

/// A bump allocator with plain `&mut self` state: not `Sync`-safe by itself.
struct Bump {
    device: Device,
    next: u64,
    live: std::collections::HashMap<u64, usize>,
}

impl LocalMemoryResource for Bump {
    fn allocate(&mut self, bytes: usize, _alignment: usize, _stream: &Stream) -> Result<DevicePtr> {
        let p = self.next;
        self.next += bytes.next_multiple_of(256) as u64;
        self.live.insert(p, bytes);
        Ok(DevicePtr(p))
    }
    fn deallocate(
        &mut self,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
        _stream: &Stream,
    ) -> Result<()> {
        match self.live.remove(&ptr.0) {
            Some(b) if b == bytes => Ok(()),
            _ => Err(Error::InvalidFree {
                ptr: ptr.0,
                reason: FreeError::Unknown,
            }),
        }
    }
    fn device(&self) -> &Device {
        &self.device
    }
    fn properties(&self) -> Properties {
        Properties::DEVICE
    }
}

#[test]
fn thread_safe_adaptor_shares_a_mut_self_resource() {
    let device = Device::sim(gpumem::driver::sim::SimConfig::default());
    let mr = Arc::new(ThreadSafeAdaptor::new(Bump {
        device: device.clone(),
        next: fake::BASE,
        live: Default::default(),
    }));
    assert_eq!(mr.properties(), Properties::DEVICE);
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let mr = mr.clone();
            let s = device.default_stream();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                for i in 0..500usize {
                    mine.push((
                        mr.allocate(256 * (1 + (i + t) % 8), 256, &s).unwrap(),
                        256 * (1 + (i + t) % 8),
                    ));
                }
                mine
            })
        })
        .collect();
    let mut all: Vec<(DevicePtr, usize)> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort_by_key(|(p, _)| p.0);
    for w in all.windows(2) {
        assert!(w[0].0 .0 + w[0].1 as u64 <= w[1].0 .0, "no overlap");
    }
    assert_eq!(mr.lock().live.len(), 4000);
    let s = device.default_stream();
    for (p, b) in all {
        mr.deallocate(p, b, 256, &s).unwrap();
    }
    assert!(mr.allocate(0, 256, &s).unwrap().is_null());
    let Ok(mr) = Arc::try_unwrap(mr) else {
        panic!("one owner left")
    };
    assert!(mr.into_inner().live.is_empty());
}

// ----- PrefetchAdaptor -----

#[test]
fn prefetch_is_a_pass_through_for_device_memory() {
    let mr = PrefetchAdaptor::new(Fake::new(1 << 20));
    assert!(!mr.prefetches_enabled());
    let s = mr.upstream().stream();
    let p = mr.allocate(4096, 256, &s).unwrap();
    mr.deallocate(p, 4096, 256, &s).unwrap();
    assert_eq!((mr.prefetches(), mr.prefetch_failures()), (0, 0));
}

#[test]
fn prefetch_failure_does_not_fail_the_allocation() {
    // The fake's "managed" addresses do not exist on the driver: the prefetch
    // is refused, the allocation stands.
    let mr = PrefetchAdaptor::new(Fake::with_properties(1 << 20, Properties::HOST_AND_DEVICE));
    assert!(mr.prefetches_enabled());
    let s = mr.upstream().stream();
    let p = mr.allocate(4096, 256, &s).unwrap();
    assert_eq!(mr.prefetches() + mr.prefetch_failures(), 1);
    mr.deallocate(p, 4096, 256, &s).unwrap();
}

// ----- stacks -----

#[test]
fn composed_stack_counts_limits_and_tracks() {
    let stack = StatisticsAdaptor::new(LimitingAdaptor::new(
        TrackingAdaptor::new(Fake::new(1 << 30)),
        8192,
    ));
    let s = stack.upstream().upstream().upstream().stream();
    let a = stack.allocate(4000, 256, &s).unwrap();
    let b = stack.allocate(4000, 256, &s).unwrap();
    let err = stack.allocate(100, 256, &s).unwrap_err();
    assert_eq!(err.oom_info().unwrap().limit, Some(8192));
    assert_eq!(stack.stats().num_ooms, 1);
    assert_eq!(stack.upstream().upstream().outstanding_count(), 2);
    // A double free is caught at the tracking layer and counted nowhere.
    stack.deallocate(a, 4000, 256, &s).unwrap();
    assert!(matches!(
        stack.deallocate(a, 4000, 256, &s),
        Err(Error::InvalidFree {
            reason: FreeError::DoubleFree,
            ..
        })
    ));
    assert_eq!(stack.stats().active.current, 1);
    assert_eq!(stack.upstream().allocated_bytes(), 4096);
    stack.deallocate(b, 4000, 256, &s).unwrap();
    assert_eq!(stack.stats().allocated_bytes.peak, 8192);
    assert_eq!(stack.upstream().allocated_bytes(), 0);

    // The same stack behind `Arc<dyn MemoryResource>`.
    let dynamic: gpumem::resource::SharedResource = Arc::new(stack);
    let p = dynamic.allocate(10, 256, &s).unwrap();
    dynamic.deallocate(p, 10, 256, &s).unwrap();
}

#[test]
fn the_small_class_can_end_at_another_size() {
    for mr in [Fake::new(64 << 20), Fake::lending(64 << 20)]
        .map(|f| StatisticsAdaptor::new(f).with_small_class_max(SMALL_SEGMENT_MAX))
    {
        let s = mr.upstream().stream();
        let a = mr.allocate(SMALL_SEGMENT_MAX, 256, &s).unwrap();
        let b = mr.allocate(SMALL_BLOCK_MAX + 512, 256, &s).unwrap();
        let c = mr.allocate(SMALL_SEGMENT_MAX + 1, 256, &s).unwrap();
        let st = mr.stats();
        assert_eq!(
            (st.small.allocation.current, st.large.allocation.current),
            (2, 1)
        );
        assert_eq!(
            st.small.allocated_bytes.current as usize,
            SMALL_SEGMENT_MAX + SMALL_BLOCK_MAX + 512
        );
        mr.deallocate(a, SMALL_SEGMENT_MAX, 256, &s).unwrap();
        mr.deallocate(b, SMALL_BLOCK_MAX + 512, 256, &s).unwrap();
        mr.deallocate(c, SMALL_SEGMENT_MAX + 1, 256, &s).unwrap();
        let st = mr.stats();
        assert_eq!(
            (st.small.allocation.freed, st.large.allocation.freed),
            (2, 1)
        );
        assert_eq!(
            st.small.allocated_bytes.peak as usize,
            SMALL_SEGMENT_MAX + SMALL_BLOCK_MAX + 512
        );
    }
    // Without it, PyTorch's block classes.
    let mr = StatisticsAdaptor::new(Fake::new(64 << 20));
    let s = mr.upstream().stream();
    let b = mr.allocate(SMALL_BLOCK_MAX + 512, 256, &s).unwrap();
    assert_eq!(mr.stats().large.allocation.current, 1);
    mr.deallocate(b, SMALL_BLOCK_MAX + 512, 256, &s).unwrap();
}
