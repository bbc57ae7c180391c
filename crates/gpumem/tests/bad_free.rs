//! The bad-free matrix (tests/common/bad_free.rs) over every resource, each
//! with its own live count, and what each must answer beyond the matrix's
//! common rules: which refuse a size within the same 256-byte granule, which
//! name a double free. Then the findings of issue 15 one by one.

mod common;

use std::sync::Arc;

use common::bad_free::{self, Outcome, Report};
use gpumem::adaptor::{
    AlignedAdaptor, HoldingAdaptor, LimitingAdaptor, StatisticsAdaptor, TrackingAdaptor,
};
use gpumem::async_pool::AsyncResource;
use gpumem::pool::{
    ArenaConfig, ArenaResource, BinningConfig, BinningResource, CachingPool, CachingPoolConfig,
    FixedSizeConfig, FixedSizeResource, PoolConfig, PoolResource, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::{
    CallbackResource, DeviceResource, ManagedResource, MemoryResource, PinnedHostResource,
    Properties, SystemResource,
};
use gpumem::{DevicePtr, Error, FreeError};

const MIB: usize = 1 << 20;

/// Resources that record the requested size refuse 1000 freed as 1001, and
/// name a double free.
fn exact(name: &str, r: &Report) {
    assert!(
        matches!(
            r.outcome(bad_free::SAME_GRANULE),
            Outcome::Refused(FreeError::SizeMismatch {
                allocated: 1000,
                freed: 1001
            })
        ),
        "{name}: {r:?}"
    );
    assert_eq!(
        r.outcome(bad_free::DOUBLE_FREE),
        Outcome::Refused(FreeError::DoubleFree),
        "{name}"
    );
    assert_eq!(
        r.outcome(bad_free::FOREIGN),
        Outcome::Refused(FreeError::Unknown),
        "{name}"
    );
}

/// Pools that record only the block accept a size within its granules, and
/// still name a double free (the block is there, free).
fn granular(name: &str, r: &Report) {
    assert_eq!(
        r.outcome(bad_free::SAME_GRANULE),
        Outcome::Accepted,
        "{name}"
    );
    assert!(
        matches!(
            r.outcome(bad_free::OTHER_CLASS),
            Outcome::Refused(FreeError::SizeMismatch { .. })
        ),
        "{name}: {r:?}"
    );
    assert_eq!(
        r.outcome(bad_free::DOUBLE_FREE),
        Outcome::Refused(FreeError::DoubleFree),
        "{name}"
    );
}

fn report(name: &str, r: &Report) {
    eprintln!("{name}: {} cases run", r.run());
    for (case, o) in &r.rows {
        eprintln!("  {case:<40} {o:?}");
    }
}

#[test]
fn driver_resources() {
    let (device, _) = common::device(true);
    let mr = DeviceResource::new(device.clone());
    let r = bad_free::matrix(&mr, Some(&|| mr.live_bytes()));
    report("DeviceResource", &r);
    exact("DeviceResource", &r);

    let mr = PinnedHostResource::new(device.clone());
    let r = bad_free::matrix(&mr, Some(&|| mr.live_allocations()));
    exact("PinnedHostResource", &r);

    let mr = ManagedResource::new(device.clone());
    let r = bad_free::matrix(&mr, Some(&|| mr.live_allocations()));
    exact("ManagedResource", &r);

    let mr = SystemResource::new(device).unwrap();
    let r = bad_free::matrix(&mr, Some(&|| mr.live_allocations()));
    exact("SystemResource", &r);
}

#[test]
fn pools() {
    let (device, _) = common::device(false);
    let up = || DeviceResource::new(device.clone());

    let mr = PoolResource::new(up(), PoolConfig::default()).unwrap();
    let r = bad_free::matrix(&mr, Some(&|| mr.live_bytes()));
    report("PoolResource", &r);
    granular("PoolResource", &r);

    let mr = VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap();
    let r = bad_free::matrix(&mr, Some(&|| mr.live_bytes()));
    granular("VirtualPool", &r);

    let mr = ArenaResource::new(up(), ArenaConfig::with_size(64 * MIB)).unwrap();
    let r = bad_free::matrix(&mr, Some(&|| mr.stats().live));
    granular("ArenaResource", &r);

    let mr = CachingPool::new(up(), CachingPoolConfig::default()).unwrap();
    let r = bad_free::matrix(&mr, Some(&|| mr.live_bytes()));
    exact("CachingPool", &r);

    let mr = FixedSizeResource::new(up(), FixedSizeConfig::with_block_size(4096)).unwrap();
    let r = bad_free::matrix(&mr, Some(&|| mr.live_bytes()));
    exact("FixedSizeResource", &r);

    let mr = BinningResource::new(up(), BinningConfig::fixed_bins(8, 20)).unwrap();
    let r = bad_free::matrix(&mr, Some(&|| mr.live_bytes()));
    exact("BinningResource<DeviceResource>", &r);

    // The C ABI's binning: bins over a pool.
    let mr = BinningResource::new(
        PoolResource::with_defaults(up()).unwrap(),
        BinningConfig::fixed_bins(8, 20),
    )
    .unwrap();
    let r = bad_free::matrix(&mr, Some(&|| mr.live_bytes()));
    exact("BinningResource<PoolResource>", &r);

    let mr = AsyncResource::with_defaults(device.clone()).unwrap();
    let r = bad_free::matrix(&mr, None);
    exact("AsyncResource", &r);
}

#[test]
fn adaptors() {
    let (device, _) = common::device(false);
    let pool = || PoolResource::with_defaults(DeviceResource::new(device.clone())).unwrap();

    let mr = StatisticsAdaptor::new(pool());
    let r = bad_free::matrix(&mr, Some(&|| mr.stats().allocated_bytes.current as usize));
    granular("StatisticsAdaptor<PoolResource>", &r);

    let mr = StatisticsAdaptor::new(DeviceResource::new(device.clone()));
    let r = bad_free::matrix(&mr, Some(&|| mr.stats().requested_bytes.current as usize));
    exact("StatisticsAdaptor<DeviceResource>", &r);

    let mr = LimitingAdaptor::new(DeviceResource::new(device.clone()), 1 << 40);
    let r = bad_free::matrix(&mr, Some(&|| mr.allocated_bytes()));
    exact("LimitingAdaptor", &r);

    let mr = TrackingAdaptor::new(pool());
    let r = bad_free::matrix(&mr, Some(&|| mr.outstanding_bytes()));
    exact("TrackingAdaptor", &r);

    // A held bad free would be given back later and free whatever lives at
    // its address by then: each is refused when it is made.
    let mr = HoldingAdaptor::new(DeviceResource::new(device.clone()));
    let r = bad_free::matrix(&mr, Some(&|| mr.live_bytes()));
    exact("HoldingAdaptor", &r);

    // Over-aligned from 4 KiB: most of the matrix's blocks go through the
    // adaptor's own table.
    let mr = AlignedAdaptor::with_threshold(DeviceResource::new(device), 1 << 16, 4096).unwrap();
    let r = bad_free::matrix(&mr, Some(&|| mr.upstream().live_bytes()));
    report("AlignedAdaptor", &r);
    exact("AlignedAdaptor", &r);
    assert!(matches!(
        r.outcome(bad_free::LARGE_FREED_SMALL),
        Outcome::Refused(FreeError::SizeMismatch {
            allocated: 3145728,
            freed: 1000
        })
    ));
}

#[test]
fn binning_frees_a_small_block_with_a_size_above_the_bins_nowhere() {
    // Finding 2: the block went to the upstream by its size, which freed the
    // chunk it starts; then a 2 MiB and a 1000-byte allocation overlapped.
    let (device, sim) = common::device(false);
    let s = device.create_stream().unwrap();
    let pool = PoolResource::with_defaults(DeviceResource::new(device.clone())).unwrap();
    let mr = BinningResource::new(pool, BinningConfig::fixed_bins(8, 20)).unwrap();
    let small = mr.allocate(1000, 256, &s).unwrap();
    assert_eq!(
        mr.deallocate(small, 3 * MIB, 256, &s),
        Err(Error::InvalidFree {
            ptr: small.0,
            reason: FreeError::SizeMismatch {
                allocated: 1000,
                freed: 3 * MIB
            }
        })
    );
    let big = mr.allocate(2 * MIB, 256, &s).unwrap();
    let other = mr.allocate(1000, 256, &s).unwrap();
    let live = common::suite::LiveSet::default();
    for (p, b) in [(small, 1000), (big, 2 * MIB), (other, 1000)] {
        live.insert(p, b);
    }
    mr.deallocate(small, 1000, 256, &s).unwrap();
    mr.deallocate(big, 2 * MIB, 256, &s).unwrap();
    mr.deallocate(other, 1000, 256, &s).unwrap();
    assert_eq!(mr.live_bytes(), 0);

    // Over the driver: the wrong free reached cuMemFree with the chunk, and
    // the correct free afterwards returned Ok too.
    let mr = BinningResource::new(
        DeviceResource::new(device.clone()),
        BinningConfig::fixed_bins(8, 20),
    )
    .unwrap();
    let small = mr.allocate(1000, 256, &s).unwrap();
    let held = sim.as_ref().map(|sim| sim.device_bytes(0));
    assert!(mr.deallocate(small, 3 * MIB, 256, &s).is_err());
    assert_eq!(
        held,
        sim.as_ref().map(|sim| sim.device_bytes(0)),
        "nothing went back to the driver"
    );
    mr.deallocate(small, 1000, 256, &s).unwrap();
    assert!(matches!(
        mr.deallocate(small, 1000, 256, &s),
        Err(Error::InvalidFree {
            reason: FreeError::DoubleFree,
            ..
        })
    ));
    // A direct allocation freed with a bin's size is refused too.
    let big = mr.allocate(3 * MIB, 256, &s).unwrap();
    assert_eq!(
        mr.deallocate(big, 1000, 256, &s),
        Err(Error::InvalidFree {
            ptr: big.0,
            reason: FreeError::SizeMismatch {
                allocated: 3 * MIB,
                freed: 1000
            }
        })
    );
    mr.deallocate(big, 3 * MIB, 256, &s).unwrap();
}

#[test]
fn device_resource_leaves_other_allocators_pointers_alone() {
    // Finding 3: `resource=cuda` freed another library's cuMemAlloc pointer.
    let (device, sim) = common::device(false);
    let s = device.create_stream().unwrap();
    let mr = DeviceResource::new(device.clone());
    let driver = device.driver();
    let foreign = driver.mem_alloc(0, 1 << 20).unwrap();
    let held = sim.as_ref().map(|sim| sim.device_bytes(0));
    assert_eq!(
        mr.deallocate(foreign, 1 << 20, 256, &s),
        Err(Error::InvalidFree {
            ptr: foreign.0,
            reason: FreeError::Unknown
        })
    );
    assert_eq!(held, sim.as_ref().map(|sim| sim.device_bytes(0)));
    // SAFETY: `foreign` is this test's own allocation, which the resource refused to free; freed once, here.
    unsafe { driver.mem_free(0, foreign) }.expect("still the other allocator's");
    // Its own: freed once, with its size.
    let p = mr.allocate(4096, 256, &s).unwrap();
    assert!(mr.deallocate(p, 8192, 256, &s).is_err());
    assert_eq!(mr.live_allocations(), 1);
    mr.deallocate(p, 4096, 256, &s).unwrap();
    assert_eq!(
        mr.deallocate(p, 4096, 256, &s),
        Err(Error::InvalidFree {
            ptr: p.0,
            reason: FreeError::DoubleFree
        })
    );
    // Clones share what was handed out.
    let q = mr.allocate(4096, 256, &s).unwrap();
    mr.clone().deallocate(q, 4096, 256, &s).unwrap();
    assert_eq!(mr.live_allocations(), 0);
}

#[test]
fn arena_checks_the_size_against_the_block_without_panicking() {
    // Finding 4: 1000 freed as 1001 panicked ("attempt to subtract with
    // overflow") in debug builds and wrapped the live count in release.
    let (device, _) = common::device(false);
    let s = device.create_stream().unwrap();
    let mr = ArenaResource::new(
        DeviceResource::new(device.clone()),
        ArenaConfig::with_size(64 * MIB),
    )
    .unwrap();
    let p = mr.allocate(1000, 256, &s).unwrap();
    assert_eq!(mr.stats().live, 1024);
    // The same four granules: the same block, freed.
    mr.deallocate(p, 1001, 256, &s).unwrap();
    assert_eq!(mr.stats().live, 0);
    // Other granules or superblocks: refused, nothing freed, count unchanged.
    let p = mr.allocate(1000, 256, &s).unwrap();
    let big = mr.allocate(3 * MIB, 256, &s).unwrap();
    let live = mr.stats().live;
    assert_eq!(
        mr.deallocate(p, 1300, 256, &s),
        Err(Error::InvalidFree {
            ptr: p.0,
            reason: FreeError::SizeMismatch {
                allocated: 1024,
                freed: 1300
            }
        })
    );
    assert_eq!(
        mr.deallocate(big, 5 * MIB, 256, &s),
        Err(Error::InvalidFree {
            ptr: big.0,
            reason: FreeError::SizeMismatch {
                allocated: 3 * MIB,
                freed: 5 * MIB
            }
        })
    );
    assert_eq!(mr.stats().live, live);
    mr.deallocate(p, 1000, 256, &s).unwrap();
    mr.deallocate(big, 3 * MIB, 256, &s).unwrap();
    assert_eq!(mr.stats().live, 0);
}

#[test]
fn statistics_count_what_was_freed_and_never_overflow() {
    // Finding 5: a pool freeing by address accepted any size, so a wrong-size
    // free took `allocated_bytes` to 0 while a block was live.
    let (device, _) = common::device(false);
    let s = device.create_stream().unwrap();
    let mr = StatisticsAdaptor::new(
        PoolResource::with_defaults(DeviceResource::new(device.clone())).unwrap(),
    );
    let a = mr.allocate(MIB, 256, &s).unwrap();
    let b = mr.allocate(MIB, 256, &s).unwrap();
    assert!(mr.deallocate(a, 2 * MIB, 256, &s).is_err());
    assert_eq!(mr.stats().allocated_bytes.current, 2 * MIB as i64);
    mr.deallocate(a, MIB, 256, &s).unwrap();
    mr.deallocate(b, MIB, 256, &s).unwrap();
    assert_eq!(mr.stats().allocated_bytes.current, 0);

    // gpumem_free with SSIZE_MAX through an upstream that accepts anything:
    // the counters saturate, nothing panics.
    let lenient = CallbackResource::new(
        device.clone(),
        Properties::DEVICE,
        |_, _, _| Ok(DevicePtr(1 << 20)),
        |_, _, _, _| Ok(()),
    );
    let mr = StatisticsAdaptor::new(lenient);
    let p = mr.allocate(1000, 256, &s).unwrap();
    for _ in 0..3 {
        mr.deallocate(p, isize::MAX as usize, 256, &s).unwrap();
        mr.deallocate(p, usize::MAX, 256, &s).unwrap();
    }
    let st = mr.stats();
    assert_eq!(st.allocated_bytes.freed, u64::MAX);
    assert_eq!(st.allocated_bytes.current, i64::MIN);
    assert_eq!(st.active.freed, 6);
}

#[test]
fn aligned_adaptor_names_a_double_free() {
    let (device, _) = common::device(false);
    let s = device.create_stream().unwrap();
    let mr = AlignedAdaptor::new(DeviceResource::new(device), 1 << 16).unwrap();
    for bytes in [100, 1 << 20] {
        let p = mr.allocate(bytes, 256, &s).unwrap();
        mr.deallocate(p, bytes, 256, &s).unwrap();
        assert_eq!(
            mr.deallocate(p, bytes, 256, &s),
            Err(Error::InvalidFree {
                ptr: p.0,
                reason: FreeError::DoubleFree
            }),
            "{bytes} bytes"
        );
    }
}

#[test]
fn caching_pool_names_blocks_freed_with_another_class_or_as_large() {
    let (device, _) = common::device(false);
    let s = device.create_stream().unwrap();
    let mut config = CachingPoolConfig::default();
    config.max_block_size = MIB;
    let mr = CachingPool::new(DeviceResource::new(device), config).unwrap();
    let small = mr.allocate(1000, 256, &s).unwrap();
    let large = mr.allocate(3 * MIB, 256, &s).unwrap();
    let mismatch = |p: DevicePtr, allocated, freed| {
        Err(Error::InvalidFree {
            ptr: p.0,
            reason: FreeError::SizeMismatch { allocated, freed },
        })
    };
    assert_eq!(
        mr.deallocate(small, 2 * MIB, 256, &s),
        mismatch(small, 1000, 2 * MIB)
    );
    assert_eq!(
        mr.deallocate(large, 1000, 256, &s),
        mismatch(large, 3 * MIB, 1000)
    );
    mr.deallocate(small, 1000, 256, &s).unwrap();
    mr.deallocate(large, 3 * MIB, 256, &s).unwrap();
    assert_eq!(mr.live_bytes(), 0);
}

#[test]
fn null_frees_are_no_ops_everywhere() {
    // The rule of the resource module, for the pools that used to refuse it.
    let (device, _) = common::device(false);
    let s = device.create_stream().unwrap();
    let up = || DeviceResource::new(device.clone());
    let pools: Vec<Arc<dyn MemoryResource>> = vec![
        Arc::new(FixedSizeResource::new(up(), FixedSizeConfig::with_block_size(4096)).unwrap()),
        Arc::new(CachingPool::new(up(), CachingPoolConfig::default()).unwrap()),
        Arc::new(BinningResource::new(up(), BinningConfig::fixed_bins(8, 20)).unwrap()),
    ];
    for mr in pools {
        for bytes in [0, 1, 4096, 3 * MIB] {
            mr.deallocate(DevicePtr::NULL, bytes, 256, &s).unwrap();
            mr.deallocate_sync(DevicePtr::NULL, bytes, 256).unwrap();
        }
    }
}

#[test]
fn a_pools_upstream_clone_sees_its_segments_and_refuses_inexact_frees() {
    // By design an upstream is shared, as RMM's are: clones of a
    // `DeviceResource` share one table, so a pool built on one clone
    // allocates its segments in the table the others see (`live_blocks`).
    // What guards the pool's segments from a clone is the table's rule: only
    // the segment's own base and exact size free it, and the blocks the pool
    // hands out are never that pair unless a block is a whole segment.
    let (device, _sim) = common::device(false);
    let s = device.create_stream().unwrap();
    let upstream = DeviceResource::new(device.clone());
    let pool = PoolResource::with_defaults(upstream.clone()).unwrap();
    let blocks: Vec<DevicePtr> = (0..4)
        .map(|_| pool.allocate(4096, 256, &s).unwrap())
        .collect();
    let segments = upstream.live_blocks();
    assert!(!segments.is_empty(), "the clone sees the pool's segments");
    let live_before = pool.stats();
    for &b in &blocks {
        for bytes in [4096, 4095, 8192] {
            let e = upstream.deallocate(b, bytes, 256, &s).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::InvalidFree {
                        reason: FreeError::Unknown | FreeError::SizeMismatch { .. },
                        ..
                    }
                ),
                "a block's free through the upstream is refused: {e}"
            );
        }
    }
    for seg in &segments {
        let exact = seg.requested.expect("the driver resource records the size");
        for bytes in [exact - 256, exact + 256] {
            assert!(matches!(
                upstream.deallocate(seg.address, bytes, 256, &s),
                Err(Error::InvalidFree {
                    reason: FreeError::SizeMismatch { .. },
                    ..
                })
            ));
        }
    }
    assert_eq!(upstream.live_blocks(), segments, "no segment was freed");
    assert_eq!(pool.stats(), live_before, "the pool's numbers kept");
    for b in blocks {
        pool.deallocate(b, 4096, 256, &s).unwrap();
    }
    drop(pool);
    assert_eq!(
        upstream.live_allocations(),
        0,
        "the pool gave its segments back"
    );
}
