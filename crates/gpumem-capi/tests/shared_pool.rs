//! One process, one pool: Rust code linked with the C ABI allocates from the
//! same per-device stack ([`gpumem_capi::device_resource`]), so memory freed
//! through the C ABI is reused by Rust allocations and the other way round.

mod support;

use std::ffi::c_void;
use std::ptr::null_mut;

use gpumem::resource::MemoryResource;
use gpumem_capi::conf::ResourceKind;
use gpumem_capi::*;
use support::{allocator, kinds, stats, MIB};

#[test]
fn the_c_abi_and_rust_share_the_global_pool() {
    std::env::set_var("GPUMEM_DEVICE", "sim");
    std::env::set_var("GPUMEM_CONF", "resource=pool");
    let d = 0;
    let p = gpumem_malloc((4 * MIB) as isize, d, null_mut());
    assert!(!p.is_null());
    gpumem_free(p, (4 * MIB) as isize, d, null_mut());
    let reserved = gpumem_reserved_bytes(d);
    let rust = device_resource(d).expect("device 0 is served");
    let stream = rust.device().default_stream();
    let q = rust.allocate(4 * MIB, 256, &stream).unwrap();
    assert_eq!(q.0, p as u64, "the C ABI's freed block serves Rust");
    assert_eq!(gpumem_allocated_bytes(d), 4 * MIB, "counted by the C ABI");
    rust.deallocate(q, 4 * MIB, 256, &stream).unwrap();
    let c = gpumem_malloc((4 * MIB) as isize, d, null_mut());
    assert_eq!(c as u64, q.0, "Rust's freed block serves the C ABI");
    gpumem_free(c, (4 * MIB) as isize, d, null_mut());
    assert_eq!(gpumem_reserved_bytes(d), reserved, "one pool, no growth");
    // Errors come back as values, not NULL.
    let err = rust.allocate(1 << 50, 256, &stream).unwrap_err();
    assert!(err.is_oom(), "{err}");
    assert!(device_resource(-1).is_none());
    assert!(device_resource(64).is_none());
    let _: *mut c_void = null_mut();
}

#[test]
fn every_kind_shares_its_stack() {
    for kind in kinds() {
        let a: &'static Allocator = Box::leak(Box::new(allocator(&format!("resource={kind}"))));
        let rust = a.device_resource(0).expect("served");
        let s = rust.device().default_stream();
        let p = a.malloc(2 * MIB, 0, 0);
        a.free(p, 2 * MIB, 0, 0);
        let reserved = a.reserved_bytes(0);
        let q = rust.allocate(2 * MIB, 256, &s).unwrap();
        if kind != ResourceKind::Cuda {
            // cuMemAlloc caches nothing; everything else keeps the block.
            assert_eq!(a.reserved_bytes(0), reserved, "{kind}: reused, no growth");
        }
        assert_eq!(stats(a, 0).allocation.current, 1, "{kind}");
        rust.deallocate(q, 2 * MIB, 256, &s).unwrap();
        let reserved = a.reserved_bytes(0);
        let c = a.malloc(2 * MIB, 0, 0);
        if kind != ResourceKind::Cuda {
            assert_eq!(a.reserved_bytes(0), reserved, "{kind}: reused, no growth");
        }
        a.free(c, 2 * MIB, 0, 0);
        assert_eq!(stats(a, 0).allocation.allocated, 3, "{kind}");
        // A bad free through Rust is an error and frees nothing.
        let r = rust.allocate(MIB, 256, &s).unwrap();
        assert!(rust.deallocate(r, 3 * MIB, 256, &s).is_err(), "{kind}");
        rust.deallocate(r, MIB, 256, &s).unwrap();
        assert_eq!(a.allocated_bytes(0), 0, "{kind}");
    }
}
