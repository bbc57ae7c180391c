//! VirtualPool's lock shards: threads that contend spread over shards, each
//! a whole pool with its own reservations and physical memory; a free made
//! on another thread goes to the shard owning the block; out of memory in
//! one shard takes the others' idle memory; `max_reserved` bounds them all;
//! regions keep the pool on one shard; the model check of `virtual_pool.rs`
//! with each stream's operations run on a thread of its own.

mod common;

use std::sync::{Arc, Mutex};

use common::model::{model_setup, op, run_model, sim};
use common::threads::{self, OnThreads, Worker};
use gpumem::pool::{Pool, Spread, VirtualPool, VirtualPoolConfig};
use gpumem::resource::MemoryResource;
use gpumem::{Device, DevicePtr, Error, FreeError, Stream};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

/// Enough shards that live threads never share one, in use from the start.
fn sharded(device: &Device, mut config: VirtualPoolConfig) -> VirtualPool {
    config.shards = 64;
    config.spread = Spread::Always;
    VirtualPool::new(device.clone(), config).unwrap()
}

fn is_free_error(err: &Error, want: FreeError) -> bool {
    matches!(err, Error::InvalidFree { reason, .. } if *reason == want)
}

#[test]
fn a_free_on_another_thread_goes_back_to_the_owning_shard() {
    let (device, _) = common::device(false);
    let pool = Arc::new(sharded(&device, VirtualPoolConfig::default()));
    let s = device.create_stream().unwrap();
    let other = Worker::new();
    let (p, s2) = (pool.clone(), s.clone());
    let ptr = other.run(move || p.allocate(3 * MIB, 256, &s2).unwrap());
    // This thread's shard is another: its first block gets a reservation
    // of its own.
    let mine = pool.allocate(MIB, 256, &s).unwrap();
    assert_eq!(pool.live_block_size(ptr), Some(3 * MIB));
    assert_eq!(pool.live_block_size(mine), Some(MIB));
    assert_eq!(pool.region_of(ptr), Some(0), "a live block of no region");
    assert_eq!(pool.region_of(mine), Some(0));
    assert_eq!(pool.live_blocks().len(), 2);
    assert_eq!(pool.stats().shards_in_use, 64);
    assert_eq!(pool.stats().live_blocks, 2);
    assert!(pool.stats().virtual_reserved > 2 * pool.config().va_multiple * MIB);
    pool.check_invariants().unwrap();
    pool.deallocate(ptr, 3 * MIB, 256, &s).unwrap();
    assert_eq!(pool.live_bytes(), MIB);
    // A second free, from either thread, is refused.
    let err = pool.deallocate(ptr, 3 * MIB, 256, &s).unwrap_err();
    assert!(is_free_error(&err, FreeError::DoubleFree), "{err:?}");
    let (p, s2) = (pool.clone(), s.clone());
    let err = other.run(move || p.deallocate(ptr, 3 * MIB, 256, &s2).unwrap_err());
    assert!(is_free_error(&err, FreeError::DoubleFree), "{err:?}");
    // A free of this thread's block from the other thread, at a wrong size,
    // is refused and frees nothing; at its size it goes through.
    let (p, s2) = (pool.clone(), s.clone());
    let err = other.run(move || p.deallocate(mine, 2 * MIB, 256, &s2).unwrap_err());
    assert!(matches!(err, Error::InvalidFree { .. }), "{err:?}");
    assert_eq!(pool.live_bytes(), MIB);
    let (p, s2) = (pool.clone(), s.clone());
    other.run(move || p.deallocate(mine, MIB, 256, &s2).unwrap());
    // A pointer no shard knows.
    let err = pool
        .deallocate(DevicePtr(ptr.0 + (1 << 47)), MIB, 256, &s)
        .unwrap_err();
    assert!(is_free_error(&err, FreeError::Unknown), "{err:?}");
    assert_eq!(pool.live_bytes(), 0);
    pool.check_invariants().unwrap();
    // Same stream, same owning shard: the owner thread reuses the block.
    let (p, s2) = (pool.clone(), s.clone());
    assert_eq!(
        other.run(move || p.allocate(3 * MIB, 256, &s2).unwrap()),
        ptr
    );
    pool.deallocate(ptr, 3 * MIB, 256, &s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(
        pool.release().unwrap(),
        6 * MIB,
        "both shards' pages go back"
    );
    assert_eq!(pool.stats().reserved, 0);
    pool.check_invariants().unwrap();
}

/// A shard out of memory takes what the other shards hold under no live
/// block, and `max_reserved` counts every shard's memory.
#[test]
fn a_shard_out_of_memory_takes_the_other_shards_idle_memory() {
    let (device, _) = common::device(false);
    let mut config = VirtualPoolConfig::default();
    config.max_reserved = Some(16 * MIB);
    let pool = Arc::new(sharded(&device, config));
    let s = device.create_stream().unwrap();
    let other = Worker::new();
    let (p, s2) = (pool.clone(), s.clone());
    other.run(move || {
        let a = p.allocate(12 * MIB, 256, &s2).unwrap();
        p.deallocate(a, 12 * MIB, 256, &s2).unwrap();
    });
    assert_eq!(pool.stats().reserved, 12 * MIB, "kept mapped in its shard");
    // 12 MiB held elsewhere, 4 left under the limit: this shard takes the
    // other's idle pages back to the driver and creates its own.
    let b = pool.allocate(10 * MIB, 256, &s).unwrap();
    let st = pool.stats();
    assert_eq!((st.reserved, st.live), (10 * MIB, 10 * MIB));
    assert!(st.peak_reserved <= 16 * MIB, "{st:?}");
    pool.check_invariants().unwrap();
    // Over the limit whatever the other shards give back: out of memory,
    // with the limit, and nothing lost.
    let (p, s2) = (pool.clone(), s.clone());
    let err = other.run(move || p.allocate(8 * MIB, 256, &s2).unwrap_err());
    assert!(err.is_oom(), "{err:?}");
    assert_eq!(err.oom_info().unwrap().limit, Some(16 * MIB));
    assert_eq!(pool.live_bytes(), 10 * MIB);
    pool.deallocate(b, 10 * MIB, 256, &s).unwrap();
    pool.check_invariants().unwrap();
}

/// Regions need every block of a region in one shard: beginning one keeps
/// the pool on shard 0 for good, and a pool already spread refuses it.
#[test]
fn regions_keep_the_pool_on_one_shard() {
    let (device, _) = common::device(false);
    let spread = sharded(&device, VirtualPoolConfig::default());
    let err = spread.begin_region(1).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    assert!(err.to_string().contains("shards=1"), "{err}");
    assert_eq!(spread.current_region(), 0, "nothing begun");

    // Beginning a region pins the pool to shard 0 (the pin itself, and
    // that no contention then spreads a pinned pool, are the shards' own
    // tests): threads working at once all use shard 0.
    let mut config = VirtualPoolConfig::default();
    config.shards = 8;
    let pool = Arc::new(VirtualPool::new(device.clone(), config).unwrap());
    pool.begin_region(1).unwrap();
    pool.end_region().unwrap();
    let all_in = std::sync::Barrier::new(8);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            let (pool, device, all_in) = (&pool, &device, &all_in);
            scope.spawn(move || {
                let s = device.create_stream().unwrap();
                churn(pool, &s, 200, false);
                all_in.wait();
                churn(pool, &s, 200, false);
                s.synchronize().unwrap();
            });
        }
    });
    assert_eq!(pool.stats().shards_in_use, 1, "pinned to shard 0");
    pool.check_invariants().unwrap();
}

/// Allocates and frees `n` blocks of varying sizes on `stream`: up to 2 KiB
/// (the fastest path, for contention), or some of them over a page when
/// `large`.
fn churn(pool: &VirtualPool, stream: &Stream, n: usize, large: bool) {
    threads::churn(pool, stream, n, |i| match large {
        false => 256 * (1 + i % 8),
        true => 4096 * (1 + i % 37) + (i % 3) * MIB,
    });
}

/// Threads that take turns, as PyTorch's main and autograd threads do,
/// never contend: they keep shard 0, one pool's memory.
#[test]
fn threads_that_take_turns_keep_one_shard() {
    let (device, _) = common::device(false);
    let pool = Arc::new(VirtualPool::with_defaults(device.clone()).unwrap());
    let workers = [Worker::new(), Worker::new()];
    let stream = device.create_stream().unwrap();
    for round in 0..100 {
        let (p, s) = (pool.clone(), stream.clone());
        workers[round % 2].run(move || churn(&p, &s, 64, true));
    }
    let st = pool.stats();
    assert_eq!((st.shards_in_use, st.live), (1, 0));
    pool.check_invariants().unwrap();
}

/// Threads spread over the shards (once shard 0 is contended, a rule the
/// shards' own tests check; `Spread::Always` here, so that the test does
/// not wait for contention) each use their own shard, and a free, by any
/// thread, goes to the shard owning its block.
#[test]
fn spread_threads_use_their_own_shards_and_frees_find_the_owner() {
    let (device, _) = common::device(false);
    let mut config = VirtualPoolConfig::default();
    // Thread slots are process-wide: with 64 shards, the few threads of
    // this test binary never share one.
    config.shards = 64;
    config.spread = Spread::Always;
    let pool = VirtualPool::new(device.clone(), config).unwrap();
    // Every thread holds its slot until all have allocated: eight live
    // threads have eight different shards.
    let all_in = std::sync::Barrier::new(8);
    let blocks = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..8 {
            let (pool, device, all_in, blocks) = (&pool, &device, &all_in, &blocks);
            scope.spawn(move || {
                let s = device.create_stream().unwrap();
                churn(pool, &s, 200, true);
                let p = pool.allocate(3 * MIB, 256, &s).unwrap();
                blocks.lock().unwrap().push((p, s));
                all_in.wait();
            });
        }
    });
    // Shard 0 holds the reservation made with the pool; a shard other than
    // 0 makes its own at its first allocation: spread threads made some.
    let base = VirtualPool::new(device.clone(), VirtualPoolConfig::default())
        .unwrap()
        .stats()
        .virtual_reserved;
    let st = pool.stats();
    assert!(st.virtual_reserved > base, "threads beyond shard 0: {st:?}");
    for (p, s) in blocks.into_inner().unwrap() {
        pool.deallocate(p, 3 * MIB, 256, &s).unwrap();
        s.synchronize().unwrap();
    }
    let st = pool.stats();
    assert_eq!(st.live, 0);
    pool.check_invariants().unwrap();
    assert_eq!(pool.release().unwrap(), st.reserved);
    assert_eq!(pool.stats().reserved, 0);
}

#[test]
fn threads_on_their_own_streams_do_not_overlap() {
    let (device, _) = common::device(false);
    let pool = Arc::new(sharded(&device, VirtualPoolConfig::default()));
    let streams: Vec<Stream> = (0..4).map(|_| device.create_stream().unwrap()).collect();
    common::suite::many_threads_many_streams(pool.clone(), streams);
    assert_eq!(pool.live_bytes(), 0);
    pool.check_invariants().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn virtual_pool_model_on_threads(ops in prop::collection::vec(op(22), 1..160)) {
        let (device, sim, streams, _) = model_setup();
        let pool = OnThreads::new(sharded(&device, VirtualPoolConfig::default()), &streams);
        run_model(pool, &sim, &streams, &ops)?;
        sim.complete_all();
        prop_assert_eq!(sim.physical_bytes(), 0);
        prop_assert_eq!(sim.mapped_bytes(), 0);
        prop_assert_eq!(sim.reserved_va_bytes(), 0);
    }

    #[test]
    fn virtual_pool_model_on_threads_tight(ops in prop::collection::vec(op(22), 1..160)) {
        // 24 pages for three shards: out of memory in one shard takes the
        // others' idle pages.
        let (device, sim) = sim(48 * MIB);
        let streams: Vec<_> = (0..3).map(|_| device.create_stream().unwrap()).collect();
        let pool = OnThreads::new(sharded(&device, VirtualPoolConfig::default()), &streams);
        run_model(pool, &sim, &streams, &ops)?;
        sim.complete_all();
        prop_assert_eq!(sim.physical_bytes(), 0);
        prop_assert_eq!(sim.reserved_va_bytes(), 0);
    }
}

/// A statistics wrapper over a VirtualPool counts every call once with its
/// threads on several shards (each counted in its shard's cell, under that
/// shard's lock), while another thread reads the counts.
#[test]
fn statistics_over_the_shards_count_every_call_once() {
    use gpumem::adaptor::StatisticsAdaptor;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    let (device, _) = common::device(false);
    let pool = sharded(&device, VirtualPoolConfig::default());
    assert!(pool.lent_lock().is_some());
    let mr = StatisticsAdaptor::new(pool);
    let (threads, rounds) = (4, 2_003);
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (reader, done) = (&mr, &done);
        scope.spawn(move || {
            while !done.load(Relaxed) {
                let st = reader.stats();
                assert!(st.allocation.current >= 0, "{st:?}");
                assert!(st.allocation.current <= st.allocation.peak, "{st:?}");
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (mr, device) = (&mr, &device);
                scope.spawn(move || threads::count_from_thread(mr, device, t, rounds))
            })
            .collect();
        // Each thread's last blocks are freed by this one: counted in the
        // cell of the shard that owns them.
        let s = device.create_stream().unwrap();
        for w in workers {
            for (p, n) in w.join().unwrap() {
                mr.deallocate(p, n, 256, &s).unwrap();
            }
        }
        done.store(true, Relaxed);
    });
    let st = mr.stats();
    let n = (threads * rounds) as u64;
    assert_eq!(
        (
            st.allocation.current,
            st.allocation.total,
            st.allocation.freed
        ),
        (0, n, n),
        "{st:?}"
    );
    assert_eq!(st.allocated_bytes.current, 0);
    assert_eq!(st.allocated_bytes.total, st.allocated_bytes.freed);
    // Each thread holds at most 8 blocks, each shard's cell counts its own.
    assert!(
        st.allocation.peak >= 8 && st.allocation.peak <= 8 * threads as i64,
        "{st:?}"
    );
    assert_eq!(mr.upstream().live_bytes(), 0);
    mr.upstream().check_invariants().unwrap();
}

/// Blocks allocated on one thread and freed on another count their free in
/// the cell where they were allocated (the owning shard's).
#[test]
fn blocks_handed_to_another_thread_keep_the_peak() {
    let (device, _) = common::device(false);
    threads::handed_blocks_keep_the_peak(sharded(&device, VirtualPoolConfig::default()));
}
