//! Lifecycle: the exit rule and fork.
//!
//! - Every pool, buffer, stream and event dropped from an `atexit` handler
//!   that runs after gpumem's exit hook makes no driver call (the CUDA
//!   driver may be gone by then). A child process builds them all with
//!   memory live and cached and work pending, stores them in a static and
//!   exits; its late handler drops them and counts the driver calls.
//! - A child forked after gpumem was first used is told so.
//!
//! The children are this test binary run again with a variable naming the
//! part to play. Simulator only: the count of driver calls needs it.

mod common;

use std::process::Command;
use std::sync::{Arc, Mutex};

use gpumem::adaptor::StatisticsAdaptor;
use gpumem::async_pool::AsyncResource;
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::manager::{MemoryManager, PinnedPool, PinnedPoolConfig};
use gpumem::pool::{
    ArenaConfig, ArenaResource, BinningConfig, BinningResource, CachingPool, CachingPoolConfig,
    FixedSizeResource, PoolConfig, PoolResource, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::{DeviceResource, MemoryResource, PinnedHostResource};
use gpumem::{Device, DeviceBuffer, Event, Stream};

/// The variable that makes this binary play a child's part.
const ROLE: &str = "GPUMEM_LIFECYCLE_ROLE";

/// Everything the exit child keeps alive until its late handler.
struct Kept {
    sim: Arc<SimDriver>,
    things: Vec<(&'static str, Box<dyn Send>)>,
}

static KEPT: Mutex<Option<Kept>> = Mutex::new(None);

/// Runs after gpumem's exit hook (it was registered before it): drops each
/// thing and reports the driver calls each drop made, then ends the process
/// with status 0 when there were none.
extern "C" fn late_handler() {
    let kept = KEPT.lock().map(|mut k| k.take()).unwrap_or(None);
    let Some(Kept { sim, things }) = kept else {
        println!("lifecycle: nothing kept");
        // SAFETY: `_exit` ends the process at once; nothing runs after it.
        unsafe { libc::_exit(2) };
    };
    let exiting = gpumem::exit::process_is_exiting() && gpumem::exit::driver_off_limits();
    let mut calls = 0;
    for (name, thing) in things {
        let before = sim.total_calls();
        drop(thing);
        let made = sim.total_calls() - before;
        println!("lifecycle: dropping {name} at exit made {made} driver calls");
        calls += made;
    }
    println!("lifecycle: exiting flag {exiting}, driver calls after it: {calls}");
    let status = if exiting && calls == 0 { 0 } else { 1 };
    // SAFETY: `_exit` ends the process at once with the verdict as its status.
    unsafe { libc::_exit(status) };
}

/// Allocates and frees a few blocks on `s` (freed with work pending, so the
/// pool caches them), and keeps one block live.
fn exercise(mr: &dyn MemoryResource, s: &Stream) {
    let kept = mr.allocate(1 << 20, 256, s).expect("allocate");
    let _ = kept; // live until the pool drops
    for bytes in [1000, 300_000, 3 << 20] {
        let p = mr.allocate(bytes, 256, s).expect("allocate");
        mr.deallocate(p, bytes, 256, s).expect("free");
    }
}

/// The exit child's part: build everything, keep it, return (the test
/// harness then exits the process normally).
fn exit_child() {
    // Registered before gpumem's hook, so it runs after it.
    // SAFETY: `late_handler` is an `extern "C" fn()` that never unwinds.
    assert_eq!(unsafe { libc::atexit(late_handler) }, 0);
    assert!(gpumem::exit::install_hook());

    let sim = Arc::new(SimDriver::new(SimConfig::backed(256 << 20)));
    let device = Device::new(sim.clone(), 0).unwrap();
    let s = device.create_stream().unwrap();
    sim.hold(s.raw());
    // Pending work on the held stream: every pool has something to wait for.
    let ev = Event::new(&device).unwrap();
    ev.record(&s).unwrap();

    let up = || DeviceResource::new(device.clone());
    let mut things: Vec<(&'static str, Box<dyn Send>)> = Vec::new();
    macro_rules! keep {
        ($name:literal, $mr:expr) => {{
            let mr = $mr;
            exercise(&mr, &s);
            things.push(($name, Box::new(mr)));
        }};
    }
    keep!(
        "PoolResource",
        PoolResource::new(up(), PoolConfig::default()).unwrap()
    );
    keep!(
        "CachingPool",
        CachingPool::new(up(), CachingPoolConfig::default()).unwrap()
    );
    keep!(
        "FixedSizeResource",
        FixedSizeResource::new(up(), common::fixed_size_config(4 << 20, 4)).unwrap()
    );
    keep!(
        "BinningResource",
        BinningResource::new(
            PoolResource::new(up(), PoolConfig::default()).unwrap(),
            BinningConfig::fixed_bins(8, 20)
        )
        .unwrap()
    );
    keep!(
        "ArenaResource",
        ArenaResource::new(up(), ArenaConfig::with_size(64 << 20)).unwrap()
    );
    keep!(
        "VirtualPool",
        VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap()
    );
    keep!(
        "AsyncResource",
        AsyncResource::with_defaults(device.clone()).unwrap()
    );
    keep!(
        "StatisticsAdaptor<PoolResource>",
        StatisticsAdaptor::new(PoolResource::new(up(), PoolConfig::default()).unwrap())
    );
    keep!(
        "PinnedPool",
        PinnedPool::new(
            PinnedHostResource::new(device.clone()),
            PinnedPoolConfig::default()
        )
        .unwrap()
    );
    let mm = MemoryManager::new(device.clone());
    let _ = mm.allocate_device(1 << 20).unwrap();
    let _ = mm.allocate_pinned(1 << 20).unwrap();
    things.push(("MemoryManager", Box::new(mm)));
    let pool = Arc::new(PoolResource::new(up(), PoolConfig::default()).unwrap());
    let buf = DeviceBuffer::<u8, _>::zeroed(4096, pool.clone(), &s).unwrap();
    things.push(("DeviceBuffer", Box::new(buf)));
    things.push(("PoolResource under a DeviceBuffer", Box::new(pool)));
    things.push(("Event", Box::new(ev)));
    things.push(("Stream", Box::new(s)));
    *KEPT.lock().unwrap() = Some(Kept { sim, things });
}

/// The fork child's part: use a pool, fork, and in the child try again.
fn fork_parent() {
    let (device, _sim) = Device::sim_with_driver(SimConfig::default());
    let pool = PoolResource::new(DeviceResource::new(device.clone()), PoolConfig::default())
        .expect("pool");
    let s = device.create_stream().unwrap();
    let p = pool.allocate(1 << 20, 256, &s).unwrap();
    assert!(!gpumem::fork::in_forked_child());
    assert!(!gpumem::exit::driver_off_limits());
    // SAFETY: the child only reads atomic flags, formats a line and calls
    // `_exit`; this process runs one test, so no other thread holds a lock
    // the child needs.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let forked = gpumem::fork::in_forked_child();
        let off = gpumem::exit::driver_off_limits();
        println!(
            "lifecycle: in the forked child, in_forked_child() = {forked}, \
             driver_off_limits() = {off}"
        );
        // SAFETY: ends the child at once, with the verdict as its status.
        unsafe { libc::_exit(if forked && off { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: `pid` is our child; `status` is a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status}"
    );
    assert!(!gpumem::exit::driver_off_limits(), "the parent goes on");
    pool.deallocate(p, 1 << 20, 256, &s).unwrap();
}

/// The entry point of the children: does nothing unless [`ROLE`] is set.
#[test]
fn child_role() {
    match std::env::var(ROLE).as_deref() {
        Ok("exit") => exit_child(),
        Ok("fork") => fork_parent(),
        _ => {}
    }
}

fn run_child(role: &str) -> (bool, String) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
        .env(ROLE, role)
        .output()
        .expect("the test binary runs again");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Finding 9: Slab (CachingPool, FixedSizeResource, the binning bins),
/// ArenaResource and the async MemPool called the driver from Drop after
/// the exit flag was set.
#[test]
fn every_drop_after_the_exit_flag_makes_no_driver_call() {
    if common::sim_only(common::device(false).1, "exit rule").is_none() {
        return;
    }
    let (ok, text) = run_child("exit");
    assert!(
        text.contains("driver calls after it"),
        "the child reported:\n{text}"
    );
    assert!(ok, "drops at exit called the driver:\n{text}");
}

/// A child forked after gpumem's first use knows it.
#[test]
fn a_forked_child_knows_it_was_forked() {
    let (ok, text) = run_child("fork");
    assert!(ok, "the forked child did not see the flag:\n{text}");
}
