//! Frees deferred by `record_stream`: a second free of a pending block is a
//! double free, a free made during a capture records nothing inside the
//! capture and queries nothing until it ends, graph-pool blocks wait for
//! their recorded streams too (during a capture, until it ends, or with
//! PyTorch's `graph_capture_record_stream_reuse` until those streams joined
//! in the graph), a size far from the block's is refused at once, and a
//! pending block is not held for a graph.

mod support;

use gpumem::driver::{CaptureMode, Driver};
use gpumem::DevicePtr;
use gpumem_capi::Allocator;
use support::{allocator, kinds, one_at_a_time, sim, stats, MIB};

const POOL: (u64, u64) = (1, 0);
const OTHER: (u64, u64) = (0, 7);

fn stream(a: &Allocator) -> u64 {
    let sim = sim(a);
    let driver: &dyn Driver = &*sim;
    driver.stream_create(0, true).unwrap()
}

#[test]
fn a_second_free_of_a_pending_block_is_a_double_free() {
    let _one = one_at_a_time();
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        let sim = sim(&a);
        let (s1, s2) = (stream(&a), stream(&a));
        let p = a.malloc(4 * MIB, 0, s1);
        a.record_stream(p, 0, s2);
        sim.hold(s2);
        a.free(p, 4 * MIB, 0, s1);
        assert_eq!(a.pending_frees(0), 1, "{kind}");
        a.free(p, 4 * MIB, 0, s1);
        assert_eq!(a.bad_free_count(0), 1, "{kind}: refused at once");
        let st = stats(&a, 0);
        assert_eq!(st.allocated_bytes.current, 0, "{kind}: counted once");
        assert_eq!(st.allocation.current, 0, "{kind}");
        assert_eq!(st.active.current, 1, "{kind}: still active");
        let q = a.malloc(4 * MIB, 0, s1);
        assert_ne!(p, q, "{kind}: reused while s2 may use it");
        sim.release(s2);
        a.free(q, 4 * MIB, 0, s1);
        a.empty_cache(0);
        let st = stats(&a, 0);
        assert_eq!(
            (st.active.current, st.allocated_bytes.current),
            (0, 0),
            "{kind}"
        );
        assert_eq!(a.bad_free_count(0), 1, "{kind}");
    }
}

/// PyTorch frees a block recorded on a capturing stream from another thread
/// without a hold: nothing is recorded in the capture or queried while it
/// runs (either would break it), and the block waits until after it.
#[test]
fn a_free_during_a_capture_waits_without_touching_the_capture() {
    let _one = one_at_a_time();
    let a = allocator("resource=pool");
    let sim = sim(&a);
    let driver: &dyn Driver = &*sim;
    let (cap, s1) = (stream(&a), stream(&a));
    let p = a.malloc(4 * MIB, 0, s1);
    driver
        .thread_exchange_capture_mode(CaptureMode::Relaxed)
        .unwrap();
    // SAFETY: `cap` is this test's stream, live.
    unsafe { driver.stream_begin_capture(cap, CaptureMode::Global) }.unwrap();
    a.graph_pool_begin(0, POOL).unwrap();
    a.record_stream(p, 0, cap);
    a.free(p, 4 * MIB, 0, s1);
    assert_eq!(a.pending_frees(0), 1);
    let q = a.malloc(4 * MIB, 0, s1);
    assert_ne!(p, q, "reused while the capture may use it");
    assert!(
        sim.capture_violations().is_empty(),
        "{:?}",
        sim.capture_violations()
    );
    // SAFETY: as above.
    unsafe { driver.stream_end_capture(cap) }.expect("the capture is intact");
    a.graph_pool_end(0, POOL).unwrap();
    driver
        .thread_exchange_capture_mode(CaptureMode::Global)
        .unwrap();
    // After the capture the event is recorded (at the next poll), and the
    // block goes back to the pool once it completes.
    a.free(q, 4 * MIB, 0, s1);
    a.empty_cache(0);
    assert_eq!(a.pending_frees(0), 0);
    assert_eq!(a.bad_free_count(0), 0);
    assert_eq!(stats(&a, 0).active.current, 0);
}

#[test]
fn a_graph_pool_block_waits_for_its_recorded_stream() {
    let _one = one_at_a_time();
    let a = allocator("resource=pool");
    let sim = sim(&a);
    let (s1, s2) = (stream(&a), stream(&a));
    a.graph_pool_begin(0, POOL).unwrap();
    let p = a.graph_pool_malloc(4 * MIB, 0, POOL, s1);
    a.record_stream(p, 0, s2);
    sim.hold(s2);
    a.graph_pool_free(p, 4 * MIB, 0, POOL, s1);
    assert_eq!(a.pending_frees(0), 1);
    let q = a.graph_pool_malloc(4 * MIB, 0, POOL, s1);
    assert_ne!(p, q, "reused while s2 may use it");
    a.graph_pool_free(p, 4 * MIB, 0, POOL, s1);
    assert_eq!(a.bad_free_count(0), 1, "a second free is a double free");
    a.graph_pool_free(q, 4 * MIB, 0, POOL, s1);
    a.graph_pool_end(0, POOL).unwrap();
    sim.release(s2);
    a.empty_cache(0);
    assert_eq!(
        a.pending_frees(0),
        0,
        "freed into the graph pool once s2 is done and no capture is under way"
    );
    assert_eq!(a.graph_pool_live_blocks(0, POOL), Some(vec![]));
    a.graph_pool_release(0, POOL).unwrap();
    assert_eq!(a.graph_pool_count(0), 0);
    assert_eq!(a.bad_free_count(0), 1);
}

/// A recorded block freed with its own size is deferred whatever its size
/// and resource; above 64 KiB, a size far from it is refused at once (not
/// when the recorded stream is done), and the block stays live.
#[test]
fn a_deferred_free_checks_the_size_at_once() {
    let _one = one_at_a_time();
    let sizes = [
        1,
        255,
        257,
        1000,
        4097,
        65_537,
        MIB + 1,
        3 * MIB + 1,
        33 * MIB + 1,
    ];
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        let sim = sim(&a);
        let (s1, s2) = (stream(&a), stream(&a));
        let mut bad = 0;
        for size in sizes {
            sim.hold(s2);
            let p = a.malloc(size, 0, s1);
            a.record_stream(p, 0, s2);
            if size > 64 << 10 {
                for wrong in [256, 3 * size] {
                    a.free(p, wrong, 0, s1);
                    bad += 1;
                    assert_eq!(a.bad_free_count(0), bad, "{kind}, {size} freed as {wrong}");
                    assert_eq!(a.pending_frees(0), 0, "{kind}, {size}");
                }
            }
            a.free(p, size, 0, s1);
            assert_eq!(a.pending_frees(0), 1, "{kind}, {size}: deferred");
            sim.release(s2);
            a.empty_cache(0);
            assert_eq!(a.pending_frees(0), 0, "{kind}, {size}");
            assert_eq!(a.bad_free_count(0), bad, "{kind}, {size}: its own size");
        }
        assert_eq!(stats(&a, 0).allocated_bytes.current, 0, "{kind}");
    }
}

/// A block whose free already waits for a recorded stream is not held: the
/// hold is a second free, and the block goes back to the pool once, when
/// the stream is done.
#[test]
fn a_block_whose_free_is_pending_is_not_held() {
    let _one = one_at_a_time();
    let a = allocator("resource=pool");
    let sim = sim(&a);
    let (s1, s2) = (stream(&a), stream(&a));
    let x = a.malloc(4 * MIB, 0, s1);
    a.record_stream(x, 0, s2);
    sim.hold(s2);
    a.free(x, 4 * MIB, 0, s1);
    assert_eq!(a.pending_frees(0), 1);
    a.graph_pool_begin(0, POOL).unwrap();
    a.graph_pool_hold(x, 4 * MIB, 0, POOL, s1);
    assert_eq!(a.bad_free_count(0), 1);
    a.graph_pool_end(0, POOL).unwrap();
    sim.release(s2);
    a.empty_cache(0);
    assert_eq!(a.pending_frees(0), 0);
    a.graph_pool_release(0, POOL).unwrap();
    assert_eq!(a.bad_free_count(0), 1, "freed once");
    assert_eq!(stats(&a, 0).active.current, 0);
}

/// How a block of the capture's own graph pool is freed during the capture.
#[derive(Debug, Clone, Copy)]
enum CaptureFree {
    /// `gpumem_graph_pool_hold`: PyTorch's native allocator, for a block
    /// freed on the capturing stream.
    Hold,
    /// `gpumem_graph_pool_hold_rounded`, with a request below the block.
    HoldRounded,
    /// `gpumem_graph_pool_free`: a free from outside the capture.
    Free,
}

/// A block of the capture's own graph pool, used by work on another stream
/// and freed during the capture, is not handed out again while the capture
/// is under way, whichever call frees it: nothing in the graph orders the
/// other stream's work before that of the block's next owner, so every
/// replay would race. Once the capture is over it goes back to its pool
/// after the other stream's work, and a later capture reuses it.
#[test]
fn a_graph_pool_block_used_on_another_stream_is_not_reused_during_the_capture() {
    let _one = one_at_a_time();
    for how in [
        CaptureFree::Hold,
        CaptureFree::HoldRounded,
        CaptureFree::Free,
    ] {
        let a = allocator("resource=pool");
        let sim = sim(&a);
        let (s1, s2) = (stream(&a), stream(&a));
        a.graph_pool_begin(0, POOL).unwrap();
        let p = a.graph_pool_malloc(4 * MIB, 0, POOL, s1);
        a.record_stream(p, 0, s2);
        match how {
            CaptureFree::Hold => a.graph_pool_hold(p, 4 * MIB, 0, POOL, s1),
            CaptureFree::HoldRounded => {
                a.graph_pool_hold_rounded(p, 4 * MIB - 100, 4 * MIB, 0, POOL, s1)
            }
            CaptureFree::Free => a.graph_pool_free(p, 4 * MIB, 0, POOL, s1),
        }
        assert_eq!(a.pending_frees(0), 1, "{how:?}: waits for s2");
        assert_eq!(a.bad_free_count(0), 0, "{how:?}");
        assert_eq!(
            a.graph_pool_live_blocks(0, POOL),
            Some(vec![]),
            "{how:?}: freed for the caller (PyTorch's checkPoolLiveAllocations)"
        );
        let q = a.graph_pool_malloc(4 * MIB, 0, POOL, s1);
        assert!(!q.is_null(), "{how:?}");
        assert_ne!(p, q, "{how:?}: reused while s2's work may still read it");
        a.graph_pool_hold(p, 4 * MIB, 0, POOL, s1);
        assert_eq!(a.bad_free_count(0), 1, "{how:?}: a second free is refused");
        a.graph_pool_hold(q, 4 * MIB, 0, POOL, s1);
        a.graph_pool_end(0, POOL).unwrap();
        // After the capture the event is recorded on s2 (held: not done).
        sim.hold(s2);
        let x = a.malloc(MIB, 0, s1);
        a.free(x, MIB, 0, s1);
        assert_eq!(a.pending_frees(0), 1, "{how:?}: s2's work is pending");
        sim.release(s2);
        a.empty_cache(0);
        assert_eq!(a.pending_frees(0), 0, "{how:?}");
        assert_eq!(a.graph_pool_live_blocks(0, POOL), Some(vec![]), "{how:?}");
        a.graph_pool_begin(0, POOL).unwrap();
        let r = a.graph_pool_malloc(4 * MIB, 0, POOL, s1);
        assert!(r == p || r == q, "{how:?}: a later capture reuses the pool");
        a.graph_pool_free(r, 4 * MIB, 0, POOL, s1);
        a.graph_pool_end(0, POOL).unwrap();
        a.graph_pool_release(0, POOL).unwrap();
        a.graph_pool_release(0, POOL).unwrap();
        assert_eq!(a.graph_pool_count(0), 0, "{how:?}");
        assert_eq!(a.bad_free_count(0), 1, "{how:?}");
    }
}

/// A block of the device's pool or of another graph pool, used on another
/// stream and freed during a capture, is held for the graph: never handed
/// out before the capture's pool goes, which waits for the device first.
/// What was recorded on it goes with the hold: the block then goes back at
/// once, and a later block at its address is not kept waiting for streams
/// recorded on the old one.
#[test]
fn a_held_block_used_on_another_stream_waits_for_the_graph_not_for_events() {
    let _one = one_at_a_time();
    let a = allocator("resource=pool");
    let (s1, s2) = (stream(&a), stream(&a));
    a.graph_pool_begin(0, OTHER).unwrap();
    let y = a.graph_pool_malloc(4 * MIB, 0, OTHER, s1);
    a.graph_pool_end(0, OTHER).unwrap();
    let x = a.malloc(4 * MIB, 0, s1);
    for p in [x, y] {
        a.record_stream(p, 0, s2);
    }
    a.graph_pool_begin(0, POOL).unwrap();
    a.graph_pool_hold(x, 4 * MIB, 0, POOL, s1);
    a.graph_pool_hold(y, 4 * MIB, 0, POOL, s1);
    assert_eq!(a.pending_frees(0), 0, "held, not deferred");
    assert_eq!(a.bad_free_count(0), 0);
    let x2 = a.malloc(4 * MIB, 0, s1);
    let y2 = a.graph_pool_malloc(4 * MIB, 0, OTHER, s1);
    assert!(x2 != x && y2 != y, "a held block was handed out");
    a.free(x2, 4 * MIB, 0, s1);
    a.graph_pool_free(y2, 4 * MIB, 0, OTHER, s1);
    a.graph_pool_end(0, POOL).unwrap();
    a.graph_pool_release(0, POOL).unwrap();
    assert_eq!(a.graph_pool_count(0), 1, "POOL went, OTHER stays");
    assert_eq!(a.pending_frees(0), 0, "given back at once");
    assert_eq!(a.allocated_bytes(0), 0);
    // Fresh blocks at those addresses, never recorded: freed at once, even
    // while s2 has work pending.
    let sim = sim(&a);
    sim.hold(s2);
    let x3 = a.malloc(4 * MIB, 0, s1);
    a.free(x3, 4 * MIB, 0, s1);
    a.graph_pool_begin(0, OTHER).unwrap();
    let y3 = a.graph_pool_malloc(4 * MIB, 0, OTHER, s1);
    a.graph_pool_free(y3, 4 * MIB, 0, OTHER, s1);
    assert_eq!(a.pending_frees(0), 0, "no stale record defers them");
    sim.release(s2);
    a.graph_pool_end(0, OTHER).unwrap();
    a.graph_pool_release(0, OTHER).unwrap();
    a.graph_pool_release(0, OTHER).unwrap();
    assert_eq!(a.graph_pool_count(0), 0);
    assert_eq!(a.bad_free_count(0), 0);
}

/// A capture on the simulator, as PyTorch runs one: begun on its stream in
/// Global mode while this thread allocates in Relaxed mode, with its graph
/// pool's allocations routed to `POOL`.
struct Capture<'a> {
    a: &'a Allocator,
    driver: &'a dyn Driver,
    origin: u64,
}

impl<'a> Capture<'a> {
    fn begin(a: &'a Allocator, driver: &'a dyn Driver, origin: u64) -> Self {
        driver
            .thread_exchange_capture_mode(CaptureMode::Relaxed)
            .unwrap();
        // SAFETY: the tests pass their own live stream as `origin`.
        unsafe { driver.stream_begin_capture(origin, CaptureMode::Global) }.unwrap();
        a.graph_pool_begin(0, POOL).unwrap();
        Capture { a, driver, origin }
    }

    /// Later work on `to` comes after the work on `from` so far
    /// (`to.wait_stream(from)`); a stream not capturing joins the capture.
    fn join(&self, to: u64, from: u64) {
        let e = self.driver.event_create(0).unwrap();
        // SAFETY: `e` was just made and is destroyed once; `from` and `to`
        // are the test's live streams.
        unsafe {
            self.driver.event_record(e, from).unwrap();
            self.driver.stream_wait_event(to, e).unwrap();
            self.driver.event_destroy(e).unwrap();
        }
    }

    /// Captured work on `s` that writes `p`.
    fn work(&self, p: DevicePtr, s: u64) {
        // SAFETY: captured, not run: the simulator records a node.
        unsafe { self.driver.memset_async(p, 1, 512, s) }.unwrap();
    }

    fn end(self) {
        // SAFETY: `origin` is live (see `begin`).
        let graph =
            unsafe { self.driver.stream_end_capture(self.origin) }.expect("the capture is intact");
        self.a.graph_pool_end(0, POOL).unwrap();
        // SAFETY: `graph` was just made by the capture's end, destroyed once.
        unsafe { self.driver.graph_destroy(graph) }.unwrap();
        self.driver
            .thread_exchange_capture_mode(CaptureMode::Global)
            .unwrap();
    }
}

/// PyTorch's `graph_capture_record_stream_reuse`, two streams: a block read
/// on s2 and freed on s1 during the capture is not reused on s1 before s1
/// has joined s2 in the graph, and is reused after, when the setting is on;
/// with it off it waits for the capture to end. Either way the capture is
/// left intact and nothing is freed twice.
#[test]
fn capture_reuse_takes_a_block_back_once_its_streams_joined() {
    let _one = one_at_a_time();
    for on in [false, true] {
        let a = allocator("resource=pool");
        let sim = sim(&a);
        let driver: &dyn Driver = &*sim;
        let (s1, s2) = (stream(&a), stream(&a));
        assert!(!a.graph_capture_reuse(), "off by default");
        assert!(!a.set_graph_capture_reuse(on));
        let cap = Capture::begin(&a, driver, s1);
        let size = 512;
        let sink = a.graph_pool_malloc(size, 0, POOL, s1);
        let data1 = a.graph_pool_malloc(size, 0, POOL, s1);
        cap.work(data1, s1);
        cap.join(s2, s1);
        let buf2 = a.graph_pool_malloc(size, 0, POOL, s2);
        cap.work(buf2, s2); // reads data1
        a.record_stream(data1, 0, s2);
        a.graph_pool_hold(data1, size, 0, POOL, s1);
        assert_eq!(a.pending_frees(0), 1, "on={on}");
        let data2 = a.graph_pool_malloc(size, 0, POOL, s1);
        assert_ne!(data1, data2, "on={on}: reused before s1 joined s2");
        let on_s2 = a.graph_pool_malloc(size, 0, POOL, s2);
        assert_ne!(data1, on_s2, "on={on}: only its own stream takes it");
        cap.join(s1, s2);
        cap.work(sink, s1);
        let data3 = a.graph_pool_malloc(size, 0, POOL, s1);
        if on {
            assert_eq!(data1, data3, "reused once s1 joined s2");
            assert_eq!(a.pending_frees(0), 0);
        } else {
            assert_ne!(data1, data3, "reused before the capture ended");
            assert_eq!(a.pending_frees(0), 1);
        }
        for p in [sink, data2, data3] {
            a.graph_pool_hold(p, size, 0, POOL, s1);
        }
        for p in [buf2, on_s2] {
            a.graph_pool_hold(p, size, 0, POOL, s2);
        }
        assert!(
            sim.capture_violations().is_empty(),
            "on={on}: {:?}",
            sim.capture_violations()
        );
        cap.end();
        a.empty_cache(0);
        assert_eq!(a.pending_frees(0), 0, "on={on}: freed after the capture");
        assert_eq!(a.graph_pool_live_blocks(0, POOL), Some(vec![]), "on={on}");
        assert_eq!(a.bad_free_count(0), 0, "on={on}");
        a.graph_pool_release(0, POOL).unwrap();
        assert_eq!(a.graph_pool_count(0), 0, "on={on}");
    }
}

/// PyTorch's `graph_capture_record_stream_reuse`, four streams: a block read
/// on s2, s3 and s4 is not reused on s1 after partial joins (s1 with s2, s3
/// with s4), and is once s1 has joined s3 too.
#[test]
fn capture_reuse_waits_for_every_stream_that_used_the_block() {
    let _one = one_at_a_time();
    let a = allocator("resource=pool");
    let sim = sim(&a);
    let driver: &dyn Driver = &*sim;
    let [s1, s2, s3, s4] = [(); 4].map(|()| stream(&a));
    a.set_graph_capture_reuse(true);
    let cap = Capture::begin(&a, driver, s1);
    let size = 512;
    let data1 = a.graph_pool_malloc(size, 0, POOL, s1);
    cap.work(data1, s1);
    let sink1 = a.graph_pool_malloc(size, 0, POOL, s1);
    let sink3 = a.graph_pool_malloc(size, 0, POOL, s1);
    let mut bufs = Vec::new();
    for s in [s2, s3, s4] {
        cap.join(s, s1);
        let buf = a.graph_pool_malloc(size, 0, POOL, s);
        cap.work(buf, s); // reads data1
        a.record_stream(data1, 0, s);
        bufs.push((buf, s));
    }
    a.graph_pool_hold(data1, size, 0, POOL, s1);
    cap.join(s1, s2);
    cap.work(sink1, s1);
    cap.join(s3, s4);
    cap.work(sink3, s3);
    a.record_stream(sink3, 0, s3);
    let data2 = a.graph_pool_malloc(size, 0, POOL, s1);
    assert_ne!(data1, data2, "reused before s1 joined s3 and s4");
    assert_eq!(a.pending_frees(0), 1);
    cap.join(s1, s3);
    cap.work(sink1, s1);
    let data3 = a.graph_pool_malloc(size, 0, POOL, s1);
    assert_eq!(data1, data3, "reused once every stream joined s1");
    assert_eq!(a.pending_frees(0), 0);
    for p in [sink1, sink3, data2, data3] {
        a.graph_pool_hold(p, size, 0, POOL, s1);
    }
    for (p, s) in bufs {
        a.graph_pool_hold(p, size, 0, POOL, s);
    }
    assert!(
        sim.capture_violations().is_empty(),
        "{:?}",
        sim.capture_violations()
    );
    cap.end();
    a.empty_cache(0);
    assert_eq!(a.pending_frees(0), 0);
    assert_eq!(a.graph_pool_live_blocks(0, POOL), Some(vec![]));
    assert_eq!(a.bad_free_count(0), 0);
    a.graph_pool_release(0, POOL).unwrap();
}

/// With the setting on, a block recorded on a stream outside the capture
/// has no place in the graph to wait for: it waits for the capture to end,
/// and goes back after it once that stream's work is done.
#[test]
fn capture_reuse_leaves_a_block_used_outside_the_capture_waiting() {
    let _one = one_at_a_time();
    let a = allocator("resource=pool");
    let sim = sim(&a);
    let driver: &dyn Driver = &*sim;
    let (s1, outside) = (stream(&a), stream(&a));
    a.set_graph_capture_reuse(true);
    let cap = Capture::begin(&a, driver, s1);
    let p = a.graph_pool_malloc(512, 0, POOL, s1);
    cap.work(p, s1);
    a.record_stream(p, 0, outside);
    a.graph_pool_hold(p, 512, 0, POOL, s1);
    cap.work(p, s1);
    let q = a.graph_pool_malloc(512, 0, POOL, s1);
    assert_ne!(p, q, "reused while work outside the graph may use it");
    a.graph_pool_hold(q, 512, 0, POOL, s1);
    cap.end();
    sim.hold(outside);
    a.graph_pool_begin(0, POOL).unwrap();
    let r = a.graph_pool_malloc(512, 0, POOL, s1);
    assert_ne!(p, r, "reused while the other stream's work is pending");
    a.graph_pool_free(r, 512, 0, POOL, s1);
    a.graph_pool_end(0, POOL).unwrap();
    sim.release(outside);
    a.empty_cache(0);
    assert_eq!(a.pending_frees(0), 0);
    assert_eq!(a.bad_free_count(0), 0);
    a.graph_pool_release(0, POOL).unwrap();
    a.graph_pool_release(0, POOL).unwrap();
    assert_eq!(a.graph_pool_count(0), 0);
}
