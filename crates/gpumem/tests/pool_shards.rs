//! PoolResource's lock shards: each thread allocates from its own shard; a
//! free made on another thread goes to the shard owning the block; a shard
//! adopts another's free region before growing; the model check of
//! `pool_resource.rs` with each stream's operations run on a thread of its own.

mod common;

use std::sync::Arc;

use common::model::{model_setup, op, run_model, sim};
use common::threads::{self, OnThreads, Worker};
use gpumem::pool::{Pool, PoolConfig, PoolResource, Spread};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, DevicePtr, Error, FreeError, Stream};
use proptest::prelude::*;

type SimPool = PoolResource<DeviceResource>;

/// Enough shards that live threads never share one, in use from the start.
fn sharded(device: &Device, mut config: PoolConfig) -> SimPool {
    config.shards = 64;
    config.spread = Spread::Always;
    PoolResource::new(DeviceResource::new(device.clone()), config).unwrap()
}

#[test]
fn a_free_on_another_thread_goes_back_to_the_owning_shard() {
    let (device, _) = common::device(false);
    let pool = Arc::new(sharded(&device, PoolConfig::default()));
    let s = device.create_stream().unwrap();
    let other = Worker::new();
    let (p, s2) = (pool.clone(), s.clone());
    let ptr = other.run(move || p.allocate(1000, 256, &s2).unwrap());
    assert_eq!(pool.live_block_size(ptr), Some(1024));
    pool.deallocate(ptr, 1000, 256, &s).unwrap();
    assert_eq!(pool.live_bytes(), 0);
    // A second free, from either thread, is refused.
    let err = pool.deallocate(ptr, 1000, 256, &s).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidFree {
                reason: FreeError::DoubleFree,
                ..
            }
        ),
        "{err:?}"
    );
    let (p, s2) = (pool.clone(), s.clone());
    let err = other.run(move || p.deallocate(ptr, 1000, 256, &s2).unwrap_err());
    assert!(matches!(
        err,
        Error::InvalidFree {
            reason: FreeError::DoubleFree,
            ..
        }
    ));
    // A pointer no shard knows.
    let err = pool
        .deallocate(DevicePtr(ptr.0 + (1 << 40)), 1000, 256, &s)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidFree { .. }));
    // Same stream, same owning shard: the owner thread reuses the block.
    let (p, s2) = (pool.clone(), s.clone());
    assert_eq!(other.run(move || p.allocate(1000, 256, &s2).unwrap()), ptr);
}

#[test]
fn a_thread_adopts_another_threads_free_region_instead_of_growing() {
    let (device, _) = common::device(false);
    let pool = Arc::new(sharded(&device, PoolConfig::default()));
    let s = device.create_stream().unwrap();
    let first = Worker::new();
    let (p, s2) = (pool.clone(), s.clone());
    first.run(move || {
        let a = p.allocate(3 << 20, 256, &s2).unwrap();
        let b = p.allocate(1 << 10, 256, &s2).unwrap();
        p.deallocate(a, 3 << 20, 256, &s2).unwrap();
        p.deallocate(b, 1 << 10, 256, &s2).unwrap();
    });
    let reserved = pool.reserved_bytes();
    assert_eq!(reserved, (20 << 20) + (2 << 20));
    device.synchronize().unwrap();
    // This thread's shard is empty: it takes the other shard's regions.
    let a = pool.allocate(5 << 20, 256, &s).unwrap();
    let b = pool.allocate(4 << 10, 256, &s).unwrap();
    assert_eq!(pool.reserved_bytes(), reserved, "no growth");
    pool.deallocate(a, 5 << 20, 256, &s).unwrap();
    // A free on the first thread of a block of this thread's shard.
    let (p, s2) = (pool.clone(), s.clone());
    first.run(move || p.deallocate(b, 4 << 10, 256, &s2).unwrap());
    assert_eq!(pool.live_bytes(), 0);
    assert_eq!(pool.release().unwrap(), reserved);
    assert_eq!(pool.stats().regions, 0);
}

/// Allocates and frees `n` blocks of varying sizes on `stream`.
fn churn(pool: &SimPool, stream: &Stream, n: usize) {
    threads::churn(pool, stream, n, |i| 4096 * (1 + i % 37));
}

/// Threads that take turns, as PyTorch's main and autograd threads do,
/// never contend: they keep shard 0, one pool's memory.
#[test]
fn threads_that_take_turns_keep_one_shard() {
    let (device, _) = common::device(false);
    let pool = Arc::new(PoolResource::with_defaults(DeviceResource::new(device.clone())).unwrap());
    let workers = [Worker::new(), Worker::new()];
    let stream = device.create_stream().unwrap();
    for round in 0..200 {
        let (p, s) = (pool.clone(), stream.clone());
        workers[round % 2].run(move || churn(&p, &s, 64));
    }
    let st = pool.stats();
    assert_eq!(st.shards_in_use, 1);
    assert_eq!(st.live, 0);
}

/// Threads spread over the shards (once shard 0 is contended, a rule the
/// shards' own tests check; `Spread::Always` here, so that the test does
/// not wait for contention) each use their own shard, and a free, by any
/// thread, goes to the shard owning its block.
#[test]
fn spread_threads_use_their_own_shards_and_frees_find_the_owner() {
    let (device, _) = common::device(false);
    let mut config = PoolConfig::default();
    // Thread slots are process-wide: with 64 shards, the few threads of
    // this test binary never share one.
    config.shards = 64;
    config.spread = Spread::Always;
    let pool = PoolResource::new(DeviceResource::new(device.clone()), config).unwrap();
    // Every thread holds its slot until all have allocated: eight live
    // threads have eight different shards.
    let all_in = std::sync::Barrier::new(8);
    let blocks = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..8 {
            let (pool, device, all_in, blocks) = (&pool, &device, &all_in, &blocks);
            scope.spawn(move || {
                let s = device.create_stream().unwrap();
                churn(pool, &s, 200);
                let p = pool.allocate(4096, 256, &s).unwrap();
                blocks.lock().unwrap().push((p, s));
                all_in.wait();
            });
        }
    });
    assert_eq!(
        pool.stats().regions,
        8,
        "one shard, so one region, per thread"
    );
    // This thread frees the others' blocks: each goes back to its owner.
    for (p, s) in blocks.into_inner().unwrap() {
        pool.deallocate(p, 4096, 256, &s).unwrap();
        s.synchronize().unwrap();
    }
    let st = pool.stats();
    assert_eq!(st.live, 0);
    assert_eq!(pool.release().unwrap(), st.reserved);
}

#[test]
fn threads_on_their_own_streams_do_not_overlap() {
    let (device, _) = common::device(false);
    let pool = Arc::new(sharded(&device, PoolConfig::default()));
    let streams: Vec<Stream> = (0..4).map(|_| device.create_stream().unwrap()).collect();
    common::suite::many_threads_many_streams(pool.clone(), streams);
    assert_eq!(pool.live_bytes(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn pool_model_on_threads(ops in prop::collection::vec(op(22), 1..160)) {
        let (device, sim, streams, base) = model_setup();
        let pool = OnThreads::new(sharded(&device, PoolConfig::default()), &streams);
        run_model(pool, &sim, &streams, &ops)?;
        sim.complete_all();
        prop_assert_eq!(sim.device_bytes(0), base, "all memory back on drop");
    }

    #[test]
    fn pool_model_on_threads_tight(ops in prop::collection::vec(op(21), 1..160)) {
        // A small device and a limit: growth fails, regions move between
        // shards and the reclaim searches every shard.
        let (device, sim) = sim(24 << 20);
        let streams: Vec<_> = (0..3).map(|_| device.create_stream().unwrap()).collect();
        let base = sim.device_bytes(0);
        let mut config = PoolConfig::default();
        config.max_reserved = Some(20 << 20);
        let pool = OnThreads::new(sharded(&device, config), &streams);
        run_model(pool, &sim, &streams, &ops)?;
        sim.complete_all();
        prop_assert_eq!(sim.device_bytes(0), base, "all memory back on drop");
    }
}

/// Blocks allocated on one thread and freed on another count their free in
/// the cell where they were allocated (the owning shard's).
#[test]
fn blocks_handed_to_another_thread_keep_the_peak() {
    let (device, _) = common::device(false);
    threads::handed_blocks_keep_the_peak(sharded(&device, PoolConfig::default()));
}

/// A release whose wait for one shard's stream fails gives back the other
/// shards' free memory, keeps that shard's (its stream's work may still use
/// it), and reports the failure.
#[test]
fn a_failed_wait_keeps_only_its_shards_memory() {
    let (device, sim) =
        gpumem::Device::from_env(gpumem::driver::sim::SimConfig::default()).unwrap();
    let Some(sim) = common::sim_only(sim, "a_failed_wait_keeps_only_its_shards_memory") else {
        return;
    };
    let mut config = PoolConfig::default();
    // Thread slots are process-wide: with 64 shards, the few threads of
    // this test binary never share one.
    config.shards = 64;
    config.spread = Spread::Always;
    let pool = PoolResource::new(DeviceResource::new(device.clone()), config).unwrap();
    // Two threads, two shards, a block freed in each on a stream whose
    // work is still pending (held): a release must wait for both.
    let all_in = std::sync::Barrier::new(2);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            let (pool, device, all_in, sim) = (&pool, &device, &all_in, &sim);
            scope.spawn(move || {
                let s = device.create_stream().unwrap();
                sim.hold(s.raw());
                let p = pool.allocate(1 << 20, 256, &s).unwrap();
                common::model::enqueue_work(&s);
                all_in.wait();
                pool.deallocate(p, 1 << 20, 256, &s).unwrap();
            });
        }
    });
    let st = pool.stats();
    assert_eq!(st.regions, 2, "one shard, so one region, per thread");
    let reserved = pool.reserved_bytes();
    // The first shard's stream cannot be waited for, nor the device (the
    // fallback for a stream that fails).
    sim.fail_call("cuStreamSynchronize", 1, 999);
    sim.fail_call("cuCtxSynchronize", 1, 999);
    assert!(pool.release().is_err(), "the failed wait is reported");
    let kept = pool.reserved_bytes();
    assert!(
        kept > 0 && kept < reserved,
        "one shard gave back, one kept: {kept} of {reserved}"
    );
    sim.clear_faults();
    assert_eq!(pool.release().unwrap(), kept);
    assert_eq!(pool.reserved_bytes(), 0);
}
