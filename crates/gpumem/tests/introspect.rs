//! `Introspect`: every pool answers the same four questions about the memory
//! it holds, checked against what the test allocated: every live block is
//! one the test holds, at its size, inside one of the segments; freed blocks
//! leave the list; a pool that caches has free memory to show after frees.

mod common;

use std::collections::BTreeMap;

use gpumem::adaptor::{LimitingAdaptor, StatisticsAdaptor};
use gpumem::async_pool::AsyncResource;
use gpumem::pool::{
    BinningResource, CachingPool, PoolConfig, PoolResource, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::{DeviceResource, Introspect, MemoryResource};
use gpumem::{Device, DevicePtr, Stream};

const SIZES: [usize; 6] = [1000, 4096, 300_000, 1 << 20, 5 << 20, 24 << 20];

/// Allocates `SIZES` (twice), frees every other block, and checks the
/// answers after each step. `caches`: the resource keeps freed memory.
fn check<R: MemoryResource + Introspect>(name: &str, r: &R, s: &Stream, caches: bool) {
    let mut live: BTreeMap<u64, usize> = BTreeMap::new();
    let mut order = Vec::new();
    for &bytes in SIZES.iter().chain(SIZES.iter()) {
        let p = r.allocate(bytes, 256, s).unwrap();
        live.insert(p.0, bytes);
        order.push(p);
    }
    agrees(name, r, &live);
    for p in order.iter().step_by(2) {
        let bytes = live.remove(&p.0).unwrap();
        r.deallocate(*p, bytes, 256, s).unwrap();
    }
    s.synchronize().unwrap();
    agrees(name, r, &live);
    if caches {
        assert!(r.largest_free_block() > 0, "{name}: freed memory is held");
    } else {
        assert_eq!(r.largest_free_block(), 0, "{name}: nothing is cached");
    }
    for (&p, &bytes) in &live {
        r.deallocate(DevicePtr(p), bytes, 256, s).unwrap();
    }
    assert!(r.live_blocks().is_empty(), "{name}: all freed");
}

fn agrees<R: Introspect>(name: &str, r: &R, live: &BTreeMap<u64, usize>) {
    let blocks = r.live_blocks();
    let listed: Vec<u64> = blocks.iter().map(|(b, _)| b.address.0).collect();
    let held: Vec<u64> = live.keys().copied().collect();
    assert_eq!(
        listed, held,
        "{name}: the blocks the test holds, in address order"
    );
    let segments = r.segments();
    assert!(
        segments.windows(2).all(|w| w[0].address < w[1].address),
        "{name}: segments in address order"
    );
    for (b, _) in &blocks {
        let asked = live[&b.address.0];
        assert!(b.size >= asked, "{name}: {b:?} holds what was asked");
        assert_eq!(r.live_block_size(b.address), Some(b.size), "{name}: {b:?}");
        assert!(
            segments.iter().any(|s| s.contains(b)),
            "{name}: {b:?} lies in a segment of {segments:?}"
        );
    }
    assert_eq!(
        r.live_block_size(DevicePtr(1)),
        None,
        "{name}: no block there"
    );
}

fn device() -> Device {
    common::device(false).0
}

#[test]
fn every_pool_shows_its_blocks_inside_its_segments() {
    let d = device();
    let s = d.create_stream().unwrap();
    let over_adaptors = || {
        StatisticsAdaptor::new(LimitingAdaptor::new(
            DeviceResource::new(d.clone()),
            usize::MAX,
        ))
    };
    check("cuda", &DeviceResource::new(d.clone()), &s, false);
    check("cuda, through the adaptors", &over_adaptors(), &s, false);
    let regions = PoolResource::new(over_adaptors(), PoolConfig::default()).unwrap();
    check("pool, regions", &regions, &s, true);
    let mut config = PoolConfig::default();
    config.expandable = true;
    let expandable = PoolResource::new(over_adaptors(), config).unwrap();
    check("pool, expandable", &expandable, &s, true);
    check(
        "caching",
        &CachingPool::with_defaults(over_adaptors()).unwrap(),
        &s,
        true,
    );
    let inner = PoolResource::new(over_adaptors(), PoolConfig::default()).unwrap();
    check(
        "binning",
        &BinningResource::with_defaults(inner).unwrap(),
        &s,
        true,
    );
    check(
        "vpool",
        &VirtualPool::new(d.clone(), VirtualPoolConfig::default()).unwrap(),
        &s,
        true,
    );
    check(
        "async",
        &AsyncResource::with_defaults(d.clone()).unwrap(),
        &s,
        true,
    );
}

#[test]
fn a_pool_over_an_upstream_that_lists_nothing_shows_no_segments() {
    // A pool's segments are its upstream's driver allocations; an adaptor
    // that does not pass them on hides them, and the pool says so by
    // listing none rather than guessing.
    let d = device();
    let s = d.create_stream().unwrap();
    let hidden = gpumem::adaptor::TrackingAdaptor::new(DeviceResource::new(d.clone()));
    let pool = PoolResource::new(hidden, PoolConfig::default()).unwrap();
    let p = pool.allocate(4096, 256, &s).unwrap();
    assert!(pool.segments().is_empty());
    assert_eq!(pool.live_blocks().len(), 1);
    pool.deallocate(p, 4096, 256, &s).unwrap();
}
