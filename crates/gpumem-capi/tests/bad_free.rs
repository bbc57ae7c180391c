//! The bad-free matrix through the C ABI, for every resource `GPUMEM_CONF`
//! can choose: each bad free frees nothing, is counted once, leaves
//! `allocated_bytes` alone, and nothing allocated afterwards overlaps a live
//! block. Then, in a child process (the reports go to stderr once per
//! process), the reports themselves.

use std::collections::BTreeMap;
use std::process::Command;

use gpumem::driver::Driver;
use gpumem::DevicePtr;
use gpumem_capi::conf::{parse, ResourceKind};
use gpumem_capi::{Allocator, Backend};

const MIB: usize = 1 << 20;
const DEV: i32 = 0;

/// Sizes allocated after each bad free: what a wrongly freed block, chunk or
/// region would serve next.
const PROBES: [usize; 6] = [1000, 4096, 40_000, 256 << 10, 2 * MIB, 3 * MIB];

struct Run {
    a: Allocator,
    kind: ResourceKind,
    /// Live blocks: start → end.
    held: BTreeMap<u64, u64>,
    bad: u64,
    cases: usize,
}

impl Run {
    fn hold(&mut self, p: DevicePtr, bytes: usize) {
        assert!(!p.is_null(), "{}: allocation of {bytes} failed", self.kind);
        let (s, e) = (p.0, p.0 + bytes as u64);
        if let Some((&ls, &le)) = self.held.range(..e).next_back() {
            assert!(
                le <= s,
                "{}: [{s:#x},{e:#x}) overlaps live [{ls:#x},{le:#x})",
                self.kind
            );
        }
        self.held.insert(s, e);
    }

    fn alloc(&mut self, bytes: usize) -> DevicePtr {
        let p = self.a.malloc(bytes, DEV, 0);
        self.hold(p, bytes);
        p
    }

    fn free(&mut self, p: DevicePtr, bytes: usize) {
        self.held.remove(&p.0);
        self.a.free(p, bytes, DEV, 0);
    }

    /// Checks that exactly the bad frees expected so far were counted.
    fn counted(&self, case: &str) {
        let n = self.a.bad_free_count(DEV);
        assert_eq!(n, self.bad, "{}: {case}: {n} bad frees counted", self.kind);
    }

    /// Allocates one block of each probe size, checks none overlaps a live
    /// block, frees them.
    fn probe(&mut self) {
        let got: Vec<_> = PROBES
            .iter()
            .map(|&b| (self.a.malloc(b, DEV, 0), b))
            .collect();
        for &(p, b) in &got {
            self.hold(p, b);
        }
        for (p, b) in got {
            self.free(p, b);
        }
        self.counted("probes");
    }

    /// Runs `bad` (a bad free); it must be refused: counted once, with
    /// `allocated_bytes` unchanged.
    fn refused(&mut self, case: &str, bad: impl FnOnce(&Allocator)) {
        let before = self.a.allocated_bytes(DEV);
        bad(&self.a);
        self.bad += 1;
        self.cases += 1;
        self.counted(case);
        assert_eq!(
            self.a.allocated_bytes(DEV),
            before,
            "{}: {case}: allocated_bytes moved",
            self.kind
        );
        self.probe();
    }

    /// Allocates `bytes`, frees it as `wrong`: refused; the correct free then
    /// works. `may_accept`: a pool comparing at the 256-byte granule may take
    /// it as the block's size.
    fn wrong_size(&mut self, case: &str, bytes: usize, wrong: usize, may_accept: bool) {
        let base = self.a.allocated_bytes(DEV);
        let p = self.alloc(bytes);
        let during = self.a.allocated_bytes(DEV);
        self.a.free(p, wrong, DEV, 0);
        self.cases += 1;
        if self.a.bad_free_count(DEV) == self.bad {
            assert!(
                may_accept,
                "{}: {case}: {bytes} freed as {wrong} accepted",
                self.kind
            );
            assert_eq!(self.a.allocated_bytes(DEV), base, "{}: {case}", self.kind);
            self.held.remove(&p.0);
            self.probe();
            // Freed: the correct free is now a second free.
            self.a.free(p, bytes, DEV, 0);
            self.bad += 1;
            self.counted(case);
            return;
        }
        self.bad += 1;
        self.counted(case);
        assert_eq!(self.a.allocated_bytes(DEV), during, "{}: {case}", self.kind);
        self.probe();
        self.free(p, bytes);
        self.counted(&format!("{case}: correct free"));
        assert_eq!(self.a.allocated_bytes(DEV), base, "{}: {case}", self.kind);
    }
}

fn matrix(kind: ResourceKind) -> usize {
    let parsed = parse(&format!("resource={kind}"));
    let mut run = Run {
        a: Allocator::from_parsed(parsed, Backend::sim()),
        kind,
        held: BTreeMap::new(),
        bad: 0,
        cases: 0,
    };
    let Backend::Sim(sim) = run.a.backend().clone() else {
        unreachable!()
    };
    let anchor = run.alloc(1000);
    // Another allocator's live pointer, from before anything was freed.
    let foreign = sim.mem_alloc(DEV as u32, 4096).unwrap();
    run.hold(foreign, 4096);

    run.wrong_size("same granule", 1000, 1001, true);
    run.wrong_size("another size class", 1000, 40_000, false);
    run.wrong_size("above the largest bin", 1000, 3 * MIB, false);
    run.wrong_size("large freed small", 3 * MIB, 1000, false);
    run.wrong_size("zero", 1000, 0, false);
    run.wrong_size("SSIZE_MAX", 1000, isize::MAX as usize, false);
    run.wrong_size("SIZE_MAX", 1000, usize::MAX, false);

    let p = run.alloc(4096);
    run.free(p, 4096);
    run.refused("double free", |a| a.free(p, 4096, DEV, 0));

    let p = run.alloc(8192);
    run.refused("interior pointer", |a| a.free(p.offset(256), 256, DEV, 0));
    run.free(p, 8192);

    run.refused("another allocator's pointer", |a| {
        a.free(foreign, 4096, DEV, 0)
    });
    run.held.remove(&foreign.0);
    // SAFETY: `foreign` is this run's own allocation, which the allocator refused to free; freed once, here.
    unsafe { sim.mem_free(DEV as u32, foreign) }.expect("left alone: its owner frees it");

    // A device where nothing was allocated: counted there.
    run.a.free(anchor, 1000, 7, 0);
    run.cases += 1;
    assert_eq!(run.a.bad_free_count(7), 1, "{kind}");
    assert_eq!(run.a.bad_free_count(DEV), run.bad, "{kind}");

    let p = run.a.cupy_malloc(5000, DEV);
    run.hold(p, 5000);
    run.held.remove(&p.0);
    run.a.cupy_free(p, DEV);
    run.refused("CuPy double free", |a| a.cupy_free(p, DEV));
    run.refused("CuPy free of another pointer", |a| {
        a.cupy_free(anchor.offset(256), DEV)
    });
    // A CuPy block is freed by CuPy's free only: PyTorch's free would leave
    // it in CuPy's table, and CuPy's free would then free the next block
    // handed out at its address.
    let c = run.a.cupy_malloc(4096, DEV);
    run.hold(c, 4096);
    run.refused("CuPy block freed by gpumem_free", |a| {
        a.free(c, 4096, DEV, 0)
    });
    run.held.remove(&c.0);
    run.a.cupy_free(c, DEV);
    run.refused("CuPy double free after a refused free", |a| {
        a.cupy_free(c, DEV)
    });

    // NULL, whatever the size: nothing, not counted.
    let before = run.a.allocated_bytes(DEV);
    run.a.free(DevicePtr::NULL, 4096, DEV, 0);
    run.a.cupy_free(DevicePtr::NULL, DEV);
    assert_eq!(run.a.bad_free_count(DEV), run.bad, "{kind}: NULL");
    assert_eq!(run.a.allocated_bytes(DEV), before);

    // Another stream (after waiting for the first): a valid free.
    let s1 = sim.stream_create(DEV as u32, true).unwrap();
    let s2 = sim.stream_create(DEV as u32, true).unwrap();
    let p = run.a.malloc(4096, DEV, s1);
    run.hold(p, 4096);
    let ev = sim.event_create(DEV as u32).unwrap();
    // SAFETY: `ev`, `s1` and `s2` were just made here, live.
    unsafe {
        sim.event_record(ev, s1).unwrap();
        sim.stream_wait_event(s2, ev).unwrap();
    }
    run.held.remove(&p.0);
    run.a.free(p, 4096, DEV, s2);
    assert_eq!(
        run.a.bad_free_count(DEV),
        run.bad,
        "{kind}: wrong stream is valid"
    );
    assert_eq!(run.a.allocated_bytes(DEV), before);
    run.probe();

    run.free(anchor, 1000);
    assert_eq!(run.a.allocated_bytes(DEV), 0, "{kind}");
    assert_eq!(run.a.bad_free_count(-1), run.bad + 1, "{kind}: total");
    for s in [s1, s2] {
        // SAFETY: `s1` and `s2` are this run's streams, live.
        unsafe { sim.stream_synchronize(s) }.unwrap();
    }
    // SAFETY: `ev` is this run's event, destroyed once.
    unsafe { sim.event_destroy(ev) }.unwrap();
    run.a.empty_cache(DEV);
    for s in [s1, s2] {
        // SAFETY: this run's streams, destroyed once; the cache was emptied, nothing freed on them is pending.
        unsafe { sim.stream_destroy(s) }.unwrap();
    }
    run.cases + 2
}

#[test]
fn every_kind_refuses_every_bad_free() {
    let mut total = 0;
    for kind in ResourceKind::ALL {
        total += matrix(kind);
    }
    eprintln!(
        "{total} bad-free cases over {} resources",
        ResourceKind::ALL.len()
    );
}

/// Each device is served by its own stack: a block freed naming another
/// device is refused there, counted there, and loses nothing.
fn wrong_device(kind: ResourceKind) {
    let a = Allocator::from_parsed(parse(&format!("resource={kind}")), Backend::sim());
    let Backend::Sim(sim) = a.backend().clone() else {
        unreachable!()
    };
    let p0 = a.malloc(MIB, 0, 0);
    let held0 = sim.device_bytes(0);
    assert_eq!(sim.device_bytes(1), 0, "{kind}");
    let p1 = a.malloc(MIB, 1, 0);
    assert!(!p0.is_null() && !p1.is_null(), "{kind}");
    assert!(sim.device_bytes(1) > 0, "{kind}: device 1's own memory");
    assert_eq!(sim.device_bytes(0), held0, "{kind}: device 0 untouched");
    assert!(p0.0.abs_diff(p1.0) >= MIB as u64, "{kind}: disjoint");

    a.free(p0, MIB, 1, 0);
    assert_eq!(a.bad_free_count(1), 1, "{kind}: refused on device 1");
    a.free(p0, MIB, 2, 0);
    assert_eq!(a.bad_free_count(2), 1, "{kind}: device 2 holds nothing");
    assert_eq!(a.allocated_bytes(0), MIB, "{kind}: nothing lost");
    assert_eq!(a.allocated_bytes(1), MIB, "{kind}");
    a.free(p0, MIB, 0, 0);
    a.free(p1, MIB, 1, 0);
    assert_eq!(a.bad_free_count(-1), 2, "{kind}: the right frees are valid");
    assert_eq!(a.allocated_bytes(0) + a.allocated_bytes(1), 0, "{kind}");
}

#[test]
fn every_kind_refuses_a_free_naming_the_wrong_device() {
    for kind in ResourceKind::ALL {
        wrong_device(kind);
    }
}

const CHILD_ENV: &str = "GPUMEM_CAPI_BAD_FREE_CHILD";

/// The child: bad frees through the C functions, more than are reported.
#[test]
fn child_frees_badly() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    use gpumem_capi::*;
    let null = std::ptr::null_mut();
    let p = gpumem_malloc(4096, 0, null);
    gpumem_free(p, 4096, 0, null);
    for _ in 0..15 {
        gpumem_free(p, 4096, 0, null);
    }
    let q = gpumem_cupy_malloc(null, 1000, 0);
    gpumem_cupy_free(null, q, 0);
    gpumem_cupy_free(null, q, 0);
    gpumem_cupy_free(null, 0x1000 as *mut _, 0);
    assert_eq!(gpumem_bad_free_count(0), 17);
    assert_eq!(gpumem_bad_free_count(-1), 17);
    assert_eq!(gpumem_bad_free_count(1), 0);
    assert!(gpumem_config_error().is_null());
    println!("CHILD-OK");
}

/// Runs the child test `name` of this binary on the simulated device with
/// `GPUMEM_CONF=resource=pool`; returns its stderr after checking it passed.
fn run_child(name: &str) -> String {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .env("GPUMEM_DEVICE", "sim")
        .env("GPUMEM_CONF", "resource=pool")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("CHILD-OK"), "{stdout}");
    stderr
}

#[test]
fn each_bad_free_is_reported_until_the_limit_then_counted() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let stderr = run_child("child_frees_badly");
    let reports = stderr
        .lines()
        .filter(|l| l.starts_with("gpumem: bad free of") && l.ends_with("; nothing freed"))
        .count();
    assert_eq!(reports, 10, "{stderr}");
    assert!(
        stderr.contains("already freed (double free)"),
        "the first reports name the double free: {stderr}"
    );
    let further = "gpumem: further bad frees are not reported (gpumem_bad_free_count counts them)";
    assert_eq!(stderr.matches(further).count(), 1, "{stderr}");
    // The CuPy frees come after the limit: counted, not reported.
    assert!(!stderr.contains("CuPy"), "{stderr}");
}

#[test]
fn cupy_bad_frees_say_what_they_are() {
    // The messages are checked on a fresh allocator in a child, where they
    // are the first reports.
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let stderr = run_child("child_cupy");
    for says in [
        ": already freed (double free); nothing freed",
        ": not handed out by gpumem_cupy_malloc; nothing freed",
    ] {
        assert!(stderr.contains(says), "{stderr}");
    }
    assert!(!stderr.contains("did not hand out"), "{stderr}");
}

#[test]
fn child_cupy() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    use gpumem_capi::*;
    let null = std::ptr::null_mut();
    let q = gpumem_cupy_malloc(null, 1000, 0);
    gpumem_cupy_free(null, q, 0);
    gpumem_cupy_free(null, q, 0);
    gpumem_cupy_free(null, 0x1000 as *mut _, 0);
    assert_eq!(gpumem_bad_free_count(0), 2);
    println!("CHILD-OK");
}

#[test]
fn a_free_naming_the_wrong_device_says_where_its_block_belongs() {
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let stderr = run_child("child_wrong_device");
    let belongs = "allocated on device 0, not this one (free it there); nothing freed";
    for says in [
        format!("on device 2, where nothing was allocated; {belongs}"),
        format!("bytes) on device 1: {belongs}"),
    ] {
        assert!(stderr.contains(&says), "{says}: {stderr}");
    }
}

#[test]
fn child_wrong_device() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    use gpumem_capi::*;
    let null = std::ptr::null_mut();
    let p = gpumem_malloc(4096, 0, null);
    let q = gpumem_malloc(4096, 1, null);
    gpumem_free(p, 4096, 2, null);
    gpumem_free(p, 4096, 1, null);
    gpumem_free(p, 4096, 0, null);
    gpumem_free(q, 4096, 1, null);
    assert_eq!(gpumem_bad_free_count(-1), 2);
    assert_eq!(gpumem_allocated_bytes(0), 0);
    println!("CHILD-OK");
}
