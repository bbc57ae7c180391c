//! The same assertions over every resource `GPUMEM_CONF` can choose, through
//! [`Allocator`] values (the state behind the C functions) on a simulated
//! driver each.

use gpumem::DevicePtr;
use gpumem_capi::conf::{parse, ResourceKind};
use gpumem_capi::{Allocator, Backend};

const MIB: usize = 1 << 20;

fn allocator(text: &str) -> Allocator {
    let parsed = parse(text);
    assert!(parsed.problems.is_empty(), "{text}: {:?}", parsed.problems);
    Allocator::new(parsed.conf, Backend::sim())
}

fn kinds() -> Vec<ResourceKind> {
    ResourceKind::ALL.to_vec()
}

#[test]
fn every_kind_allocates_counts_and_frees() {
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        let p = a.malloc(MIB, 0, 0);
        assert!(!p.is_null(), "{kind}");
        assert_eq!(a.resource_kind(0), Some(kind));
        let q = a.malloc(100, 0, 0);
        assert!(!q.is_null(), "{kind}");
        assert_ne!(p, q);
        assert_eq!(a.allocated_bytes(0), MIB + 256, "{kind}");
        assert!(
            a.reserved_bytes(0) >= MIB + 256,
            "{kind}: reserve covers what is live"
        );
        assert!(a.peak_reserved_bytes(0) >= a.reserved_bytes(0), "{kind}");
        a.free(p, MIB, 0, 0);
        a.free(q, 100, 0, 0);
        assert_eq!(a.allocated_bytes(0), 0, "{kind}");
        a.empty_cache(0);
        let Backend::Sim(sim) = a.backend() else {
            unreachable!()
        };
        if kind == ResourceKind::Arena {
            // The arena holds its region for life.
            assert!(a.reserved_bytes(0) > 0, "{kind}");
        } else {
            assert_eq!(
                a.reserved_bytes(0),
                0,
                "{kind}: empty_cache gives everything back"
            );
            assert_eq!(sim.device_bytes(0), 0, "{kind}: the driver has it all back");
        }
        assert!(a.peak_reserved_bytes(0) >= MIB, "{kind}: peak remembers");
        a.reset_peak(0);
        assert_eq!(a.peak_reserved_bytes(0), a.reserved_bytes(0), "{kind}");
        assert_eq!(a.peak_allocated_bytes(0), 0, "{kind}");
    }
}

#[test]
fn every_kind_honours_max_size() {
    for kind in kinds() {
        let a = allocator(&format!("resource={kind},max_size=64MiB"));
        assert!(
            a.malloc(1 << 30, 0, 0).is_null(),
            "{kind}: 1 GiB over 64 MiB"
        );
        let mut live = Vec::new();
        loop {
            let p = a.malloc(4 * MIB, 0, 0);
            if p.is_null() {
                break;
            }
            live.push(p);
            assert!(live.len() <= 16, "{kind}: more than the limit handed out");
        }
        assert!(
            live.len() >= 8,
            "{kind}: only {} blocks of 4 MiB",
            live.len()
        );
        assert!(a.reserved_bytes(0) <= 64 * MIB, "{kind}");
        for p in live {
            a.free(p, 4 * MIB, 0, 0);
        }
        assert!(!a.malloc(4 * MIB, 0, 0).is_null(), "{kind}: room again");
    }
}

#[test]
fn arena_and_async_take_their_sizes() {
    let a = allocator("resource=arena,initial_size=128MiB");
    let p = a.malloc(MIB, 0, 0);
    assert_eq!(a.reserved_bytes(0), 128 * MIB, "the arena is its size");
    a.free(p, MIB, 0, 0);
    let a = allocator("resource=async,initial_size=32MiB,release_threshold=max");
    let p = a.malloc(MIB, 0, 0);
    assert!(a.reserved_bytes(0) >= 32 * MIB, "primed");
    a.free(p, MIB, 0, 0);
    a.empty_cache(0);
    assert_eq!(a.reserved_bytes(0), 0, "trimmed");
}

#[test]
fn pool_takes_initial_size_up_front() {
    let a = allocator("resource=pool,initial_size=256MiB");
    let p = a.malloc(256, 0, 0);
    assert!(a.reserved_bytes(0) >= 256 * MIB);
    a.free(p, 256, 0, 0);
    // Other devices are built on their own first use.
    assert_eq!(a.reserved_bytes(1), 0);
    let q = a.malloc(256, 1, 0);
    assert!(a.reserved_bytes(1) >= 256 * MIB);
    a.free(q, 256, 1, 0);
}

/// A resource that cannot be built is not replaced by another: the device
/// serves nothing, and every refusal says why (the thread's last error).
#[test]
fn a_resource_that_cannot_be_built_serves_nothing_and_says_why() {
    // 100 GiB up front does not fit the simulated 80 GiB device.
    for text in [
        "resource=pool,initial_size=100GiB",
        "resource=arena,max_size=100GiB",
    ] {
        let a = allocator(text);
        for _ in 0..2 {
            assert!(a.malloc(MIB, 0, 0).is_null(), "{text}");
            let why = gpumem_capi::last_error::last_error().expect("a reason");
            assert!(
                why.contains("device 0 cannot be used") && why.contains("out of memory"),
                "{text}: {why}"
            );
        }
        assert_eq!(a.resource_kind(0), None);
        assert_eq!(a.reserved_bytes(0), 0);
    }
}

#[test]
fn allocators_do_not_share_stream_wrappers() {
    // The per-thread stream cache is keyed by allocator: two allocators on
    // different drivers with the same raw handle value must not mix.
    let a = allocator("resource=pool");
    let b = allocator("resource=pool");
    let p = a.malloc(4096, 0, 0x5000);
    let q = b.malloc(4096, 0, 0x5000);
    assert!(!p.is_null() && !q.is_null());
    a.free(p, 4096, 0, 0x5000);
    b.free(q, 4096, 0, 0x5000);
    assert_eq!(a.allocated_bytes(0), 0);
    assert_eq!(b.allocated_bytes(0), 0);
    let _ = DevicePtr::NULL;
}

#[test]
fn vpool_in_the_nccl_ready_mode_gives_each_block_an_allocation_of_its_own() {
    let a = allocator("resource=vpool,nccl_ready=true");
    let Backend::Sim(sim) = a.backend().clone() else {
        unreachable!()
    };
    use gpumem::driver::Driver;
    let access = sim.call_count("cuMemSetAccess");
    let p = a.malloc(1000, 0, 0);
    let q = a.malloc(3 * MIB, 0, 0);
    assert!(!p.is_null() && !q.is_null());
    assert_eq!(
        sim.call_count("cuMemSetAccess"),
        access + 2 * 8,
        "each block: the device and its seven peers"
    );
    assert_eq!(
        sim.mem_address_range(p).unwrap(),
        (p, 2 * MIB),
        "whole pages"
    );
    assert_eq!(sim.mem_address_range(q).unwrap(), (q, 4 * MIB));
    let (hp, hq) = (
        sim.vmm_retain_handle(p).unwrap(),
        sim.vmm_retain_handle(q.offset(3 * MIB - 1)).unwrap(),
    );
    assert_ne!(hp, hq, "a handle per block");
    // SAFETY: `hp` was just retained, released below.
    drop(unsafe { sim.vmm_export_fd(hp) }.unwrap());
    for h in [hp, hq] {
        // SAFETY: each handle was retained above, released once.
        unsafe { sim.vmm_release(h) }.unwrap();
    }
    a.free(p, 1000, 0, 0);
    a.free(q, 3 * MIB, 0, 0);
    assert_eq!(a.bad_free_count(-1), 0, "freed with the sizes asked for");
    assert_eq!(a.allocated_bytes(0), 0);
}

/// Calls other than allocations (regions, graph pools) under an invalid
/// configuration are refused, and build nothing: once a valid configuration
/// is set, the device is served.
#[test]
fn an_invalid_configuration_builds_nothing_until_fixed() {
    let a = Allocator::from_parsed(parse("resource=vpol"), Backend::sim());
    assert!(a.conf_error().is_some());
    assert!(a.region_begin(0, 1).is_err());
    assert!(a.graph_pool_begin(0, (1, 1)).is_err());
    assert!(a.malloc(MIB, 0, 0).is_null());
    assert!(a.configure("resource=pool,max_size=1GiB,junk").is_err());
    assert!(a.conf_error().is_some(), "still the invalid one");
    a.configure("resource=vpool").unwrap();
    assert!(a.conf_error().is_none());
    let p = a.malloc(MIB, 0, 0);
    assert!(!p.is_null(), "{:?}", gpumem_capi::last_error::last_error());
    assert_eq!(a.resource_kind(0), Some(ResourceKind::Virtual));
    a.region_begin(0, 1).unwrap();
    a.free(p, MIB, 0, 0);
}

/// A device that cannot be used says why in the thread's last error, not
/// only on stderr.
#[test]
fn a_device_that_does_not_exist_says_why() {
    let a = allocator("resource=pool");
    for _ in 0..2 {
        assert!(a.malloc(MIB, 8, 0).is_null());
        let why = gpumem_capi::last_error::last_error().unwrap();
        assert!(why.contains("device 8 cannot be used: "), "{why}");
        assert!(why.len() > "device 8 cannot be used: ".len() + 40, "{why}");
    }
}

/// A `GPUMEM_DEVICE` that names no backend serves nothing and says why: a
/// misspelt `sim` must not run on the GPU.
#[test]
fn an_unknown_backend_serves_nothing_and_says_why() {
    let why = "GPUMEM_DEVICE=\"simm\": expected sim, cuda or auto".to_string();
    let a = Allocator::new(parse("").conf, Backend::Invalid(why));
    assert!(a.malloc(MIB, 0, 0).is_null());
    let last = gpumem_capi::last_error::last_error().unwrap();
    assert!(last.contains("GPUMEM_DEVICE=\"simm\""), "{last}");
}
