//! [`GraphPool`]: what a capture frees serves captures into the pool and
//! nothing else, and a graph keeps the memory it was captured with for as
//! long as it or an executable of it lives, whatever happens to the pool.
//!
//! Simulator-only where they read its memory counters; a Global capture
//! binds every thread, so the tests take turns.

mod common;

use std::sync::{Mutex, MutexGuard};

use gpumem::driver::CaptureMode;
use gpumem::graph_pool::GraphPool;
use gpumem::pool::Pool;
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, DeviceBuffer, DevicePtr, GraphExec, Stream};

const MIB: usize = 1 << 20;
/// The bytes of a graph's temporary.
const N: usize = 4 * MIB;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn overlaps(a: (DevicePtr, usize), b: (DevicePtr, usize)) -> bool {
    a.0 .0 < b.0 .0 + b.1 as u64 && b.0 .0 < a.0 .0 + a.1 as u64
}

#[test]
fn a_captured_free_serves_captures_into_the_pool_and_nothing_else() {
    let _turn = serial();
    let (device, _sim) = common::device(false);
    let [s, t] = common::streams(&device);
    let pool = GraphPool::new(&device).unwrap();
    let n = 3 * MIB;

    pool.begin(&s, CaptureMode::Global).unwrap();
    let tmp = pool.allocate(n, 256, &s).unwrap();
    pool.deallocate(tmp, n, 256, &s).unwrap();
    let again = pool.allocate(n, 256, &s).unwrap();
    assert_eq!(again, tmp, "the same capture reuses its temporary");
    pool.deallocate(again, n, 256, &s).unwrap();
    let first = pool.end(&s).unwrap();

    // No capture into the pool: other memory, on the stream that captured
    // and on any other.
    let outside: Vec<_> = [&s, &t, &s, &t]
        .into_iter()
        .map(|st| (pool.allocate(n, 256, st).unwrap(), st))
        .collect();
    for &(p, _) in &outside {
        assert!(
            !overlaps((p, n), (tmp, n)),
            "{p:#x} is the graph's {tmp:#x}"
        );
    }
    for (p, st) in outside {
        pool.deallocate(p, n, 256, st).unwrap();
    }

    // A later capture into the pool reuses it.
    pool.begin(&s, CaptureMode::Global).unwrap();
    let later = pool.allocate(n, 256, &s).unwrap();
    assert_eq!(
        later, tmp,
        "a later capture into the pool reuses the temporary"
    );
    pool.deallocate(later, n, 256, &s).unwrap();
    let second = pool.end(&s).unwrap();
    drop((first, second));
    s.synchronize().unwrap();
    t.synchronize().unwrap();
}

/// Captures, on `s`, a graph that zeroes a temporary of `n` bytes from
/// `pool` and frees it; returns its executable (the graph itself dropped)
/// and the temporary's address. The capture ends through the stream, not
/// the pool: the graph keeps the memory all the same.
fn zeroing_graph(pool: &GraphPool, s: &Stream, n: usize) -> (GraphExec, DevicePtr) {
    s.begin_capture(CaptureMode::Global).unwrap();
    let tmp = DeviceBuffer::<u8, _>::zeroed(n, pool, s).unwrap();
    let at = tmp.as_device_ptr();
    drop(tmp);
    let exec = s.end_capture().unwrap().instantiate().unwrap();
    (exec, at)
}

/// Takes buffers of `n` bytes of `0x5A` from the driver (cuMemAlloc), up to
/// 64 of them or as many as it gives (the simulator hands out the lowest
/// free address first, so memory the pool gave back comes first); then
/// launches `exec` and checks that no buffer was written.
fn launch_beside_fresh_memory(device: &Device, exec: &GraphExec, at: DevicePtr, n: usize) {
    let s = device.create_stream().unwrap();
    let driver = DeviceResource::new(device.clone());
    let mut bufs = Vec::new();
    while let Some(Ok(b)) =
        (bufs.len() < 64).then(|| DeviceBuffer::<u8, _>::from_slice(&vec![0x5A; n], &driver, &s))
    {
        assert!(
            !overlaps((b.as_device_ptr(), n), (at, n)),
            "handed out again"
        );
        bufs.push(b);
    }
    assert!(!bufs.is_empty());
    exec.launch(&s).unwrap();
    s.synchronize().unwrap();
    for b in &bufs {
        assert_eq!(
            b.to_vec().unwrap(),
            vec![0x5A; n],
            "the launch wrote fresh memory"
        );
    }
}

/// On a fresh backed device: a graph pool and an executable captured from
/// it (see [`zeroing_graph`]), handed to `f` with the stream and the
/// temporary's address. Once `f` has dropped them, the device holds what it
/// held before.
fn with_a_graph(f: impl FnOnce(&Device, &Stream, GraphPool, GraphExec, DevicePtr)) {
    let _turn = serial();
    let (device, sim) = common::device(true);
    let base = sim.as_ref().map(|sim| sim.device_bytes(0));
    let s = device.create_stream().unwrap();
    let pool = GraphPool::new(&device).unwrap();
    let (exec, at) = zeroing_graph(&pool, &s, N);
    f(&device, &s, pool, exec, at);
    assert_eq!(sim.as_ref().map(|sim| sim.device_bytes(0)), base);
}

#[test]
fn a_graph_keeps_its_memory_through_a_release_of_the_pool() {
    with_a_graph(|device, _, pool, exec, at| {
        assert_eq!(pool.graphs(), 1);
        pool.release().unwrap();
        assert!(
            pool.reserved_bytes() >= N,
            "the executable's memory is kept"
        );
        launch_beside_fresh_memory(device, &exec, at, N);
        drop(exec);
        assert_eq!(pool.graphs(), 0);
        assert!(pool.release().unwrap() >= N);
        assert_eq!(pool.reserved_bytes(), 0);
    });
}

#[test]
fn a_graph_keeps_its_memory_after_the_pool_is_dropped() {
    with_a_graph(|device, s, pool, exec, at| {
        drop(pool);
        launch_beside_fresh_memory(device, &exec, at, N);
        exec.launch(s).unwrap();
        // The memory goes back with the last executable, once its launches
        // have run.
    });
}
