//! The memory fraction (`gpumem_set_memory_fraction`,
//! `torch.cuda.set_per_process_memory_fraction`) over every resource, and
//! out of memory as PyTorch has it: the retry after emptying the cache, the
//! counters, and the thread's last error.

mod support;

use gpumem::driver::Driver;
use gpumem_capi::allocator::last_error;
use gpumem_capi::conf::ResourceKind;
use support::{allocator, kinds, sim, stats, MIB};

/// 1/1024 of the simulated device's 80 GiB: 80 MiB.
const FRACTION: f64 = 1.0 / 1024.0;
const CAP: usize = 80 * MIB;

/// Allocates 8 MiB blocks until one fails; returns them.
fn fill(a: &gpumem_capi::Allocator, kind: ResourceKind) -> Vec<gpumem::DevicePtr> {
    let mut live = Vec::new();
    loop {
        let p = a.malloc(8 * MIB, 0, 0);
        if p.is_null() {
            return live;
        }
        live.push(p);
        assert!(live.len() <= CAP / (8 * MIB), "{kind}: past the cap");
    }
}

/// What holds memory against the cap: physical bytes for the pools, the
/// bytes live in CUDA's pool for `async`.
fn held(a: &gpumem_capi::Allocator, kind: ResourceKind) -> usize {
    match kind {
        ResourceKind::Async => a.allocated_bytes(0),
        ResourceKind::Virtual => sim(a).physical_bytes(),
        _ => sim(a).device_bytes(0),
    }
}

#[test]
fn fraction_refuses_past_the_cap_and_accepts_after_raising_it() {
    // The arena takes its region whole when it is built: see the next test.
    for kind in kinds().into_iter().filter(|&k| k != ResourceKind::Arena) {
        let a = allocator(&format!("resource={kind}"));
        let first = a.malloc(MIB, 0, 0);
        assert!(!first.is_null(), "{kind}");
        assert_eq!(a.memory_fraction(0), 1.0);
        a.set_memory_fraction(0, FRACTION).unwrap();
        assert_eq!(a.memory_fraction(0), FRACTION);
        let live = fill(&a, kind);
        assert!(live.len() >= 7, "{kind}: only {} blocks", live.len());
        assert!(held(&a, kind) <= CAP, "{kind}: {} held", held(&a, kind));
        let why = last_error().expect("the failure is kept");
        assert!(why.contains("out of memory"), "{kind}: {why}");
        assert!(why.contains(&format!("limit {CAP} bytes")), "{kind}: {why}");
        assert!(why.contains("memory fraction"), "{kind}: {why}");
        let s = stats(&a, 0);
        assert!(
            s.num_ooms >= 1 && s.num_alloc_retries >= s.num_ooms,
            "{kind}"
        );
        // Raised: the same request is served.
        a.set_memory_fraction(0, 1.0).unwrap();
        let more = a.malloc(8 * MIB, 0, 0);
        assert!(!more.is_null(), "{kind}: served once the cap is raised");
        assert_eq!(last_error(), None, "{kind}: a success clears it");
        for p in live.into_iter().chain([more]) {
            a.free(p, 8 * MIB, 0, 0);
        }
        a.free(first, MIB, 0, 0);
    }
}

#[test]
fn fraction_set_before_first_use_bounds_the_stack_it_builds() {
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        a.set_memory_fraction(0, FRACTION).unwrap();
        let live = fill(&a, kind);
        assert!(!live.is_empty(), "{kind}");
        assert!(a.reserved_bytes(0) <= CAP, "{kind}");
        assert!(held(&a, kind) <= CAP, "{kind}");
        for p in live {
            a.free(p, 8 * MIB, 0, 0);
        }
    }
}

#[test]
fn fraction_takes_the_smaller_of_itself_and_max_size() {
    let a = allocator("resource=pool,max_size=40MiB");
    a.set_memory_fraction(0, FRACTION).unwrap();
    assert!(fill(&a, ResourceKind::Pool).len() <= 5);
    let why = last_error().unwrap();
    assert!(why.contains(&format!("limit {} bytes", 40 * MIB)), "{why}");
}

#[test]
fn bad_fractions_and_devices_are_refused() {
    let a = allocator("resource=pool");
    for f in [-0.5, 1.5, f64::NAN, f64::INFINITY, -0.0001] {
        assert!(a.set_memory_fraction(0, f).is_err(), "{f}");
    }
    assert!(a.set_memory_fraction(-1, 0.5).is_err());
    assert!(a.set_memory_fraction(64, 0.5).is_err());
    assert_eq!(a.memory_fraction(0), 1.0, "nothing changed");
    assert_eq!(a.memory_fraction(99), 1.0);
    let e = a.set_memory_fraction(0, 2.0).unwrap_err();
    assert!(e.contains("outside [0, 1]"), "{e}");
}

/// PyTorch's whole range: a fraction of 0 is accepted and leaves nothing to
/// take from the driver (memory already cached still serves; the arena took
/// all of its memory up front).
#[test]
fn a_fraction_of_zero_allows_nothing_new() {
    for kind in kinds().into_iter().filter(|&k| k != ResourceKind::Arena) {
        let a = allocator(&format!("resource={kind}"));
        let p = a.malloc(MIB, 0, 0);
        a.set_memory_fraction(0, 0.0).unwrap();
        assert_eq!(a.memory_fraction(0), 0.0);
        assert!(
            a.malloc(64 * MIB, 0, 0).is_null(),
            "{kind}: new memory refused"
        );
        let why = last_error().unwrap();
        assert!(why.contains("memory fraction 0"), "{kind}: {why}");
        a.free(p, MIB, 0, 0);
        a.set_memory_fraction(0, 1.0).unwrap();
        let q = a.malloc(64 * MIB, 0, 0);
        assert!(!q.is_null(), "{kind}");
        a.free(q, 64 * MIB, 0, 0);
    }
}

#[test]
fn out_of_memory_retries_once_then_fails_with_the_numbers() {
    // Plain cuMemAlloc caches nothing: the retry finds nothing to give back.
    let a = allocator("resource=cuda,max_size=16MiB");
    let p = a.malloc(12 * MIB, 0, 0);
    assert!(a.malloc(8 * MIB, 0, 0).is_null());
    let s = stats(&a, 0);
    assert_eq!((s.num_alloc_retries, s.num_ooms), (1, 1));
    let why = last_error().unwrap();
    for part in [
        "device 0: allocation of 8388608 bytes failed: out of memory: requested 8388608 bytes",
        "limit 16777216 bytes",
        "reserved 12582912 bytes",
        "live 12582912 bytes",
        "largest free block 0 bytes",
    ] {
        assert!(why.contains(part), "{part:?} in {why}");
    }
    // The process goes on: what fits is served.
    let q = a.malloc(MIB, 0, 0);
    assert!(!q.is_null());
    assert_eq!(last_error(), None);
    a.free(p, 12 * MIB, 0, 0);
    a.free(q, MIB, 0, 0);
}

#[test]
fn last_error_belongs_to_the_thread() {
    let a = allocator("resource=pool,max_size=8MiB");
    assert!(a.malloc(1 << 50, 0, 0).is_null());
    assert!(last_error()
        .unwrap()
        .contains("requested 1125899906842624 bytes"));
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(last_error(), None, "another thread's failure"));
    });
    assert!(a.malloc(0, 0, 0).is_null());
    assert_eq!(last_error(), None, "zero bytes is no failure");
    assert!(a.malloc(256, 70, 0).is_null());
    assert!(last_error().unwrap().contains("out of range"));
}

/// With the memory fraction `FRACTION` in force on an `async` device: what
/// the pool caches past the cap goes back at a synchronize (the release
/// threshold was lowered to the cap), and live bytes stop at the cap.
fn async_cap_in_force(a: &gpumem_capi::Allocator) {
    let live = fill(a, ResourceKind::Async);
    assert!(
        held(a, ResourceKind::Async) <= CAP,
        "live bytes stop at the cap"
    );
    let why = last_error().unwrap();
    assert!(why.contains(&format!("limit {CAP} bytes")), "{why}");
    for p in live {
        a.free(p, 8 * MIB, 0, 0);
    }
    // Cache more than the cap: a 48 MiB block freed, then a 64 MiB one that
    // the cached block cannot serve.
    let sim = sim(a);
    sim.device_synchronize(0).unwrap();
    let p = a.malloc(48 * MIB, 0, 0);
    a.free(p, 48 * MIB, 0, 0);
    let q = a.malloc(64 * MIB, 0, 0);
    assert!(!p.is_null() && !q.is_null());
    a.free(q, 64 * MIB, 0, 0);
    assert!(a.reserved_bytes(0) > CAP, "cached past the cap");
    sim.device_synchronize(0).unwrap();
    let kept = a.reserved_bytes(0);
    assert!(
        kept <= CAP,
        "the release threshold is the cap's: {kept} kept"
    );
}

/// Sets the fraction while the `nth` `cuMemPoolSetAttribute` of an async
/// device's first allocation is stopped at a gate (`reached` names that
/// call), then checks that the cap in force is the new fraction's.
fn fraction_set_at_the_gate(nth: u64, reached: &str) {
    let a = allocator("resource=async");
    let gate = sim(&a).gate_call("cuMemPoolSetAttribute", nth);
    std::thread::scope(|scope| {
        let first = scope.spawn(|| a.malloc(MIB, 0, 0));
        assert!(
            gate.wait_arrival(std::time::Duration::from_secs(60)),
            "{reached} reached the driver"
        );
        a.set_memory_fraction(0, FRACTION).unwrap();
        gate.open();
        let p = first.join().unwrap();
        assert!(!p.is_null());
        async_cap_in_force(&a);
        a.free(p, MIB, 0, 0);
    });
}

/// The fraction set while the device's first build is under way, after the
/// build read the one before (its `cuMemPoolSetAttribute` stopped at a
/// gate): found no device to apply itself to, so the build applies the
/// fraction in force once it is done.
#[test]
fn a_fraction_set_during_the_first_build_is_applied() {
    fraction_set_at_the_gate(1, "the build");
}

/// The fraction set while the limit of the one before is being applied
/// (the builder's, once the device is built; its release threshold's
/// `cuMemPoolSetAttribute` stopped at a gate): the application under way
/// must not have the last word with the old fraction.
#[test]
fn a_fraction_set_while_the_limit_is_applied_is_the_one_in_force() {
    // The pool's creation and the build's limit set the threshold first.
    fraction_set_at_the_gate(3, "the builder's application");
}
