//! PoolResource: the shared resource suite, random operation sequences checked
//! against a model and the simulator's ordering oracle, growth, trim and
//! release, reclaim on out-of-memory, holes, and dropped streams.

mod common;

use std::sync::Arc;

use common::model::{enqueue_work, model_setup, op, run_model, sim};
use common::suite;
use gpumem::pool::{GrowthPolicy, Pool, PoolConfig, PoolResource};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{DeviceBuffer, DevicePtr, Error, FreeError};
use proptest::prelude::*;

fn pool_on(device: &gpumem::Device, config: PoolConfig) -> PoolResource<DeviceResource> {
    PoolResource::new(DeviceResource::new(device.clone()), config).unwrap()
}

#[test]
fn pool_passes_the_suite() {
    let (device, _) = common::device(false);
    suite::run_all(Arc::new(pool_on(&device, PoolConfig::default())));
}

#[test]
fn pool_with_initial_size_and_limit_passes_the_suite() {
    let (device, _) = common::device(false);
    let mut config = PoolConfig::default();
    config.initial_size = 64 << 20;
    config.max_reserved = Some(1 << 30);
    suite::run_all(Arc::new(pool_on(&device, config)));
}

#[test]
fn config_is_validated() {
    let (device, _) = common::device(false);
    let up = || DeviceResource::new(device.clone());
    let mut over = PoolConfig::default();
    over.initial_size = 2 << 20;
    over.max_reserved = Some(1 << 20);
    assert!(matches!(
        PoolResource::new(up(), over),
        Err(Error::InvalidArgument(_))
    ));
    let mut bad_gran = PoolConfig::default();
    bad_gran.growth.granularity = 100;
    assert!(matches!(
        PoolResource::new(up(), bad_gran),
        Err(Error::InvalidArgument(_))
    ));
}

#[test]
fn growth_is_tiered_not_doubling() {
    let g = GrowthPolicy::default();
    assert_eq!(g.region_for(256), Some(2 << 20));
    assert_eq!(g.region_for(1 << 20), Some(2 << 20));
    assert_eq!(g.region_for(3 << 20), Some(20 << 20));
    assert_eq!(g.region_for(100 << 20), Some(100 << 20));
    assert_eq!(g.region_for((100 << 20) + 1), Some(102 << 20));
    assert_eq!(g.region_for(usize::MAX), None);
    // A run of large allocations reserves what is live, give or take a region.
    let (device, _sim) = sim(80 << 30);
    let pool = pool_on(&device, PoolConfig::default());
    let s = device.create_stream().unwrap();
    let ptrs: Vec<_> = (0..20)
        .map(|_| pool.allocate(300 << 20, 256, &s).unwrap())
        .collect();
    let st = pool.stats();
    assert_eq!(st.live, 20 * (300 << 20));
    assert!(st.reserved <= st.live + (2 << 20) * 20, "{st:?}");
    for p in ptrs {
        pool.deallocate(p, 300 << 20, 256, &s).unwrap();
    }
}

#[test]
fn small_requests_do_not_split_a_large_free_block() {
    // Small requests come from small regions only: a free 100 MiB block stays
    // whole for the next 100 MiB request, which needs no growth.
    let (device, _sim) = sim(8 << 30);
    let pool = pool_on(&device, PoolConfig::default());
    let s = device.create_stream().unwrap();
    let big = pool.allocate(100 << 20, 256, &s).unwrap();
    pool.deallocate(big, 100 << 20, 256, &s).unwrap();
    let smalls: Vec<_> = (0..1000)
        .map(|_| pool.allocate(4096, 256, &s).unwrap())
        .collect();
    let before = pool.stats();
    assert_eq!(before.largest_free, 100 << 20, "{before:?}");
    let again = pool.allocate(100 << 20, 256, &s).unwrap();
    assert_eq!(again, big);
    let after = pool.stats();
    assert_eq!(after.reserved, before.reserved, "no growth: {after:?}");
    assert_eq!(after.regions, before.regions);
    // Medium requests reuse a free block of their exact size first.
    let m1 = pool.allocate(3 << 20, 256, &s).unwrap();
    let m2 = pool.allocate(5 << 20, 256, &s).unwrap();
    pool.deallocate(m1, 3 << 20, 256, &s).unwrap();
    assert_eq!(pool.allocate(3 << 20, 256, &s).unwrap(), m1);
    // A free whose size names the other heap finds the block there and is
    // refused: the size is not the block's. Nothing is freed.
    let live = pool.live_bytes();
    for (p, wrong, block) in [(smalls[0], 8 << 20, 4096), (again, 100, 100 << 20)] {
        match pool.deallocate(p, wrong, 256, &s) {
            Err(Error::InvalidFree {
                reason: FreeError::SizeMismatch { allocated, freed },
                ..
            }) => assert_eq!((allocated, freed), (block, wrong)),
            other => panic!("{p:#x} freed as {wrong}: {other:?}"),
        }
    }
    assert_eq!(pool.live_bytes(), live);
    pool.deallocate(smalls[0], 4096, 256, &s).unwrap();
    pool.deallocate(again, 100 << 20, 256, &s).unwrap();
    for p in &smalls[1..] {
        pool.deallocate(*p, 4096, 256, &s).unwrap();
    }
    pool.deallocate(m1, 3 << 20, 256, &s).unwrap();
    pool.deallocate(m2, 5 << 20, 256, &s).unwrap();
    assert_eq!(pool.live_bytes(), 0);
}

#[test]
fn bad_frees_are_errors_and_lose_nothing() {
    let (device, _) = common::device(false);
    let pool = pool_on(&device, PoolConfig::default());
    let s = device.create_stream().unwrap();
    let p = pool.allocate(1000, 256, &s).unwrap();
    let q = pool.allocate(1000, 256, &s).unwrap();
    assert!(matches!(
        pool.deallocate(DevicePtr(p.0 + 256), 1000, 256, &s),
        Err(Error::InvalidFree {
            reason: FreeError::Unknown,
            ..
        })
    ));
    pool.deallocate(p, 1000, 256, &s).unwrap();
    let err = pool.deallocate(p, 1000, 256, &s).unwrap_err();
    assert!(
        matches!(err, Error::InvalidFree { reason: FreeError::DoubleFree | FreeError::Unknown, ptr } if ptr == p.0),
        "{err:?}"
    );
    assert_eq!(pool.live_bytes(), 1024);
    pool.deallocate(q, 1000, 256, &s).unwrap();
    assert_eq!(pool.live_bytes(), 0);
}

#[test]
fn large_alignments_are_served() {
    let (device, _) = common::device(false);
    let pool = pool_on(&device, PoolConfig::default());
    let s = device.create_stream().unwrap();
    for shift in [9, 12, 16, 21] {
        let a = 1usize << shift;
        let p = pool.allocate(3000, a, &s).unwrap();
        assert_eq!(p.0 % a as u64, 0);
        pool.deallocate(p, 3000, a, &s).unwrap();
    }
}

#[test]
fn trim_and_release_give_free_regions_back() {
    let (device, sim) = sim(8 << 30);
    let base = sim.device_bytes(0);
    let pool = pool_on(&device, PoolConfig::default());
    let s = device.create_stream().unwrap();
    let big = pool.allocate(64 << 20, 256, &s).unwrap();
    let small = pool.allocate(4096, 256, &s).unwrap();
    assert!(sim.device_bytes(0) >= base + (66 << 20));
    pool.deallocate(big, 64 << 20, 256, &s).unwrap();
    // The stream is idle (the simulator runs work at once): trim settles and
    // gives the free 64 MiB region back, keeping the region still in use.
    let released = pool.trim(0).unwrap();
    assert_eq!(released, 64 << 20);
    assert_eq!(pool.reserved_bytes(), 2 << 20);
    // A held stream's frees are not settled by trim, but release waits.
    sim.hold(s.raw());
    enqueue_work(&s);
    pool.deallocate(small, 4096, 256, &s).unwrap();
    assert_eq!(pool.trim(0).unwrap(), 0);
    assert_eq!(pool.release().unwrap(), 2 << 20);
    assert_eq!(pool.reserved_bytes(), 0);
    assert_eq!(sim.pending_ops(s.raw()), 0, "release waited for the stream");
    sim.release(s.raw());
    drop(pool);
    assert_eq!(sim.device_bytes(0), base);
}

#[test]
fn a_busy_streams_free_block_goes_to_another_stream_only_after_a_wait() {
    let (device, sim) = sim(8 << 30);
    let pool = pool_on(&device, PoolConfig::default());
    let a = device.create_stream().unwrap();
    let b = device.create_stream().unwrap();
    let p = pool.allocate(1 << 20, 256, &a).unwrap();
    sim.hold(a.raw());
    enqueue_work(&a);
    pool.deallocate(p, 1 << 20, 256, &a).unwrap();
    let pos = sim.stream_position(a.raw());
    // Same stream: reused at once, no event.
    let events = sim.call_count("cuEventRecord");
    let q = pool.allocate(1 << 20, 256, &a).unwrap();
    assert_eq!(q, p);
    assert_eq!(
        sim.call_count("cuEventRecord"),
        events,
        "no event on the fast path"
    );
    pool.deallocate(q, 1 << 20, 256, &a).unwrap();
    // Another stream: either other memory, or the block after B waited for A.
    let r = pool.allocate(1 << 20, 256, &b).unwrap();
    if r == p {
        assert!(sim.is_ordered_after(a.raw(), pos, b.raw()));
    }
    sim.release(a.raw());
    pool.deallocate(r, 1 << 20, 256, &b).unwrap();
}

#[test]
fn a_busy_streams_freed_block_joins_the_rest_of_its_region() {
    // A stream whose work still runs keeps its freed block in its own lane,
    // while the untouched rest of the block's region is in the global lane.
    // The two are one free range: the stream's next, larger request fits in
    // it and must not grow a region beside it.
    let (device, sim) = sim(8 << 30);
    let pool = pool_on(&device, PoolConfig::default());
    let s = device.create_stream().unwrap();
    sim.hold(s.raw());
    let p = pool.allocate(4 << 20, 256, &s).unwrap();
    assert_eq!(pool.stats().reserved, 20 << 20, "one medium region");
    enqueue_work(&s);
    pool.deallocate(p, 4 << 20, 256, &s).unwrap();
    let q = pool.allocate(18 << 20, 256, &s).unwrap();
    let st = pool.stats();
    assert_eq!(st.reserved, 20 << 20, "grew beside 20 MiB free: {st:?}");
    assert_eq!(q, p, "the request starts where the freed block did");
    // Another stream does not get the busy stream's memory without waiting.
    let t = device.create_stream().unwrap();
    let pos = sim.stream_position(s.raw());
    pool.deallocate(q, 18 << 20, 256, &s).unwrap();
    let r = pool.allocate(18 << 20, 256, &t).unwrap();
    if r == q {
        assert!(sim.is_ordered_after(s.raw(), pos, t.raw()));
    }
    pool.deallocate(r, 18 << 20, 256, &t).unwrap();
    sim.release(s.raw());
}

#[test]
fn out_of_memory_reclaims_and_reports_detail() {
    // A 64 MiB device: the pool fills it, frees on a held stream, and a large
    // request must wait for those frees, give the regions back and retry.
    let (device, sim) = sim(64 << 20);
    let pool = pool_on(&device, PoolConfig::default());
    let a = device.create_stream().unwrap();
    let b = device.create_stream().unwrap();
    let ptrs: Vec<_> = (0..24)
        .map(|_| pool.allocate(2 << 20, 256, &a).unwrap())
        .collect();
    sim.hold(a.raw());
    enqueue_work(&a);
    for p in ptrs {
        pool.deallocate(p, 2 << 20, 256, &a).unwrap();
    }
    let big = pool.allocate(40 << 20, 256, &b).unwrap();
    assert_eq!(
        sim.pending_ops(a.raw()),
        0,
        "the reclaim waited for stream a"
    );
    let err = pool.allocate(40 << 20, 256, &b).unwrap_err();
    let info = err.oom_info().expect("out of memory");
    assert_eq!(info.requested, 40 << 20);
    assert_eq!(info.live, Some(40 << 20));
    assert!(info.reserved.unwrap() >= 40 << 20);
    assert!(info.largest_free.is_some());
    pool.deallocate(big, 40 << 20, 256, &b).unwrap();
    sim.release(a.raw());
    // Still usable.
    let p = pool.allocate(40 << 20, 256, &b).unwrap();
    pool.deallocate(p, 40 << 20, 256, &b).unwrap();
}

#[test]
fn injected_out_of_memory_is_retried_then_reported() {
    let (device, sim) = sim(1 << 30);
    let base = sim.device_bytes(0);
    let pool = pool_on(&device, PoolConfig::default());
    let s = device.create_stream().unwrap();
    sim.fail_nth_alloc(1);
    // First growth fails, the reclaim retry succeeds.
    let p = pool.allocate(4096, 256, &s).unwrap();
    pool.deallocate(p, 4096, 256, &s).unwrap();
    let mut config = PoolConfig::default();
    config.max_reserved = Some(4 << 20);
    let limited = pool_on(&device, config);
    let err = limited.allocate(8 << 20, 256, &s).unwrap_err();
    assert_eq!(err.oom_info().unwrap().limit, Some(4 << 20));
    drop(limited);
    drop(pool);
    assert_eq!(sim.device_bytes(0), base);
}

#[test]
fn many_holes_do_not_slow_or_break_the_pool() {
    let (device, _) = common::device(false);
    let pool = pool_on(&device, PoolConfig::default());
    let s = device.create_stream().unwrap();
    let ptrs: Vec<_> = (0..8192)
        .map(|_| pool.allocate(512, 256, &s).unwrap())
        .collect();
    for p in ptrs.iter().step_by(2) {
        pool.deallocate(*p, 512, 256, &s).unwrap();
    }
    let st = pool.stats();
    assert!(st.free_blocks >= 4096, "{st:?}");
    for _ in 0..1000 {
        let p = pool.allocate(256, 256, &s).unwrap();
        pool.deallocate(p, 256, 256, &s).unwrap();
    }
    for p in ptrs.iter().skip(1).step_by(2) {
        pool.deallocate(*p, 512, 256, &s).unwrap();
    }
    assert_eq!(pool.live_bytes(), 0);
}

#[test]
fn a_dropped_stream_with_free_blocks_is_neither_stranded_nor_reused_early() {
    let (device, sim) = sim(8 << 30);
    let pool = pool_on(&device, PoolConfig::default());
    let b = device.create_stream().unwrap();
    let (p, raw, pos) = {
        let a = device.create_stream().unwrap();
        let p = pool.allocate(1 << 20, 256, &a).unwrap();
        sim.hold(a.raw());
        enqueue_work(&a);
        pool.deallocate(p, 1 << 20, 256, &a).unwrap();
        (p, a.raw(), sim.stream_position(a.raw()))
        // `a` dropped here by the user; the pool keeps it alive.
    };
    assert_eq!(
        sim.live_streams(),
        2,
        "a is kept alive by the pool beside b"
    );
    let q = pool.allocate(1 << 20, 256, &b).unwrap();
    if q == p {
        assert!(sim.is_ordered_after(raw, pos, b.raw()));
    }
    sim.release(raw);
    pool.deallocate(q, 1 << 20, 256, &b).unwrap();
    // Once settled, the dropped stream's lane is let go and the stream destroyed.
    pool.release().unwrap();
    assert_eq!(pool.stats().lanes, 1, "only b's lane remains");
    assert_eq!(
        sim.live_streams(),
        1,
        "the dropped stream is destroyed at last"
    );
}

#[test]
fn device_buffer_round_trip_through_the_pool() {
    let (device, _) = common::device(true);
    let pool = pool_on(&device, PoolConfig::default());
    let s = device.create_stream().unwrap();
    let data = common::random_bytes(3 << 20, 11);
    let buf = DeviceBuffer::from_slice(&data, &pool, &s).unwrap();
    assert_eq!(buf.to_vec().unwrap(), data);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn pool_model(ops in prop::collection::vec(op(22), 1..160)) {
        let (device, sim, streams, base) = model_setup();
        run_model(pool_on(&device, PoolConfig::default()), &sim, &streams, &ops)?;
        sim.complete_all();
        prop_assert_eq!(sim.device_bytes(0), base, "all memory back on drop");
    }

    #[test]
    fn pool_model_tight(ops in prop::collection::vec(op(21), 1..160)) {
        // A small device and a limit: growth fails often and the reclaim runs.
        let (device, sim) = sim(24 << 20);
        let streams: Vec<_> = (0..3).map(|_| device.create_stream().unwrap()).collect();
        let base = sim.device_bytes(0);
        let mut config = PoolConfig::default();
        config.max_reserved = Some(20 << 20);
        run_model(pool_on(&device, config), &sim, &streams, &ops)?;
        sim.complete_all();
        prop_assert_eq!(sim.device_bytes(0), base, "all memory back on drop");
    }
}

/// A statistics wrapper counts through the pool's own lock (shard 0's) and
/// loses no update, whether the threads share shard 0 or use their own:
/// threads on their own streams, growth on the slow path, a refused free
/// and an out-of-memory.
#[test]
fn statistics_over_the_pool_count_every_call_once() {
    use gpumem::adaptor::StatisticsAdaptor;
    use gpumem::pool::Spread;
    let (device, _) = common::device(false);
    for (shards, spread) in [
        (1, Spread::OnContention),
        (4, Spread::Always),
        (0, Spread::OnContention),
    ] {
        let mut config = PoolConfig::default();
        config.shards = shards;
        config.spread = spread;
        config.max_reserved = Some(256 << 20);
        let pool = pool_on(&device, config);
        assert!(pool.lent_lock().is_some());
        let mr = StatisticsAdaptor::new(pool);
        let (threads, rounds) = (4, 20_000);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            // Reads, which take every lock lent, while the others count.
            let (reader, done) = (&mr, &done);
            scope.spawn(move || {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let st = reader.stats();
                    assert!(st.allocation.current >= 0, "{st:?}");
                    assert!(st.allocation.current <= st.allocation.peak, "{st:?}");
                    std::thread::yield_now();
                }
            });
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let (mr, device) = (&mr, &device);
                    scope.spawn(move || {
                        let left = common::threads::count_from_thread(mr, device, t, rounds);
                        assert!(left.is_empty(), "rounds is a multiple of 8");
                    })
                })
                .collect();
            for w in workers {
                w.join().unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let s = device.create_stream().unwrap();
        let p = mr.allocate(4096, 256, &s).unwrap();
        mr.deallocate(p, 4096, 256, &s).unwrap();
        assert!(mr.deallocate(p, 4096, 256, &s).is_err(), "a double free");
        assert!(mr.allocate(1 << 30, 256, &s).unwrap_err().is_oom());
        let st = mr.stats();
        let n = (threads * rounds + 1) as u64;
        let case = format!("{shards} shards, {spread:?}");
        assert_eq!(
            (
                st.allocation.current,
                st.allocation.total,
                st.allocation.freed
            ),
            (0, n, n),
            "{case}"
        );
        assert_eq!(st.allocated_bytes.current, 0, "{case}");
        assert_eq!(st.allocated_bytes.total, st.allocated_bytes.freed);
        // Each thread holds at most 8 blocks. With one shard the peak is
        // exact; with several, each shard's cell keeps its own peak and the
        // sum bounds the true one: at most 8 per thread in each of the two
        // eras (all on shard 0, then spread).
        let bound = match (shards, spread) {
            (1, _) | (_, Spread::Always) => 8 * threads as i64,
            _ => 2 * 8 * threads as i64,
        };
        assert!(
            st.allocation.peak >= 8 && st.allocation.peak <= bound,
            "{case}: {st:?}"
        );
        assert_eq!(st.num_ooms, 1);
        assert_eq!(mr.upstream().live_bytes(), 0);
    }
}

/// One shard, two streams with work pending: a release whose wait for the
/// first stream fails (and the device's in its place) still waits for the
/// second and gives its memory back; the first stream's stays, and the
/// error is returned. Once the waits work, the rest goes.
#[test]
fn a_failed_wait_keeps_only_its_streams_memory() {
    let (device, sim) = sim(1 << 30);
    let pool = pool_on(&device, PoolConfig::default());
    let (first, second) = (
        device.create_stream().unwrap(),
        device.create_stream().unwrap(),
    );
    let blocks: Vec<_> = [&first, &second]
        .map(|s| {
            sim.hold(s.raw());
            let p = pool.allocate(12 << 20, 256, s).unwrap();
            enqueue_work(s);
            (p, s)
        })
        .into();
    for (p, s) in blocks {
        pool.deallocate(p, 12 << 20, 256, s).unwrap();
    }
    let reserved = pool.reserved_bytes();
    assert!(reserved >= 24 << 20, "one region each: {reserved}");
    // Lanes are waited for in the order the streams came.
    sim.fail_call("cuStreamSynchronize", 1, 999);
    sim.fail_call("cuCtxSynchronize", 1, 999);
    assert!(pool.release().is_err(), "the failed wait is reported");
    let kept = pool.reserved_bytes();
    assert!(
        (12 << 20..=reserved - (12 << 20)).contains(&kept),
        "the second stream's region went back, the first's stayed: {kept} of {reserved}"
    );
    sim.clear_faults();
    assert_eq!(pool.release().unwrap(), kept);
    assert_eq!(pool.reserved_bytes(), 0);
}
