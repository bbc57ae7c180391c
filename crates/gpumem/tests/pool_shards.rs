//! PoolResource's lock shards: each thread allocates from its own shard; a
//! free made on another thread goes to the shard owning the block; a shard
//! adopts another's free region before growing; the model check of
//! `pool_resource.rs` with each stream's operations run on a thread of its own.

mod common;

use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use common::model::{model_setup, op, run_model, sim, Modeled};
use gpumem::pool::{Pool, PoolConfig, PoolResource, Spread};
use gpumem::resource::{DeviceResource, MemoryResource, Properties};
use gpumem::{Device, DevicePtr, Error, FreeError, Result, Stream};
use proptest::prelude::*;

type SimPool = PoolResource<DeviceResource>;

/// Enough shards that live threads never share one, in use from the start.
fn sharded(device: &Device, mut config: PoolConfig) -> SimPool {
    config.shards = 64;
    config.spread = Spread::Always;
    PoolResource::new(DeviceResource::new(device.clone()), config).unwrap()
}

type Job = Box<dyn FnOnce() + Send>;

/// A thread that runs the jobs it is sent, one at a time.
struct Worker {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    fn new() -> Self {
        let (jobs, rx) = channel::<Job>();
        let thread = std::thread::spawn(move || {
            for job in rx {
                job();
            }
        });
        Self {
            jobs: Some(jobs),
            thread: Some(thread),
        }
    }

    /// Runs `f` on the worker and waits for its result.
    fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
        let (tx, rx) = channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        self.jobs.as_ref().unwrap().send(job).unwrap();
        rx.recv().unwrap()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A pool whose allocations and frees on stream `i` run on worker `i`
/// (so on shard of their own), one call at a time.
struct OnThreads {
    pool: Arc<SimPool>,
    streams: Vec<u64>,
    workers: Vec<Worker>,
}

impl OnThreads {
    fn new(pool: SimPool, streams: &[Stream]) -> Self {
        Self {
            pool: Arc::new(pool),
            streams: streams.iter().map(|s| s.raw()).collect(),
            workers: streams.iter().map(|_| Worker::new()).collect(),
        }
    }

    fn worker(&self, stream: &Stream) -> &Worker {
        let i = self
            .streams
            .iter()
            .position(|&s| s == stream.raw())
            .unwrap();
        &self.workers[i]
    }
}

impl MemoryResource for OnThreads {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        let (pool, s) = (self.pool.clone(), stream.clone());
        self.worker(stream)
            .run(move || pool.allocate(bytes, alignment, &s))
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        let (pool, s) = (self.pool.clone(), stream.clone());
        self.worker(stream)
            .run(move || pool.deallocate(ptr, bytes, alignment, &s))
    }

    fn device(&self) -> &Device {
        self.pool.device()
    }

    fn properties(&self) -> Properties {
        self.pool.properties()
    }
}

impl Pool for OnThreads {
    fn reserved_bytes(&self) -> usize {
        self.pool.reserved_bytes()
    }
    fn peak_reserved_bytes(&self) -> usize {
        self.pool.peak_reserved_bytes()
    }
    fn reset_peak(&self) {
        self.pool.reset_peak()
    }
    fn trim(&self, to: usize) -> Result<usize> {
        self.pool.trim(to)
    }
    fn release(&self) -> Result<usize> {
        self.pool.release()
    }
}

impl Modeled for OnThreads {
    fn accounted(&self, bytes: usize) -> usize {
        bytes.next_multiple_of(256)
    }
    fn live(&self) -> usize {
        self.pool.live_bytes()
    }
    fn process(&self) {}
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
    let mut held = Vec::new();
    for i in 0..n {
        let bytes = 4096 * (1 + i % 37);
        held.push((pool.allocate(bytes, 256, stream).unwrap(), bytes));
        if held.len() == 8 {
            for (p, b) in held.drain(..) {
                pool.deallocate(p, b, 256, stream).unwrap();
            }
        }
    }
    for (p, b) in held {
        pool.deallocate(p, b, 256, stream).unwrap();
    }
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

/// Threads that allocate at the same moment contend for shard 0's lock and
/// spread over the shards; a free then goes to the shard owning its block.
#[test]
fn threads_that_contend_spread_over_the_shards() {
    let (device, _) = common::device(false);
    let mut config = PoolConfig::default();
    config.shards = 8;
    let pool = PoolResource::new(DeviceResource::new(device.clone()), config).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            let (pool, device) = (&pool, &device);
            scope.spawn(move || {
                let s = device.create_stream().unwrap();
                while pool.stats().shards_in_use == 1 && std::time::Instant::now() < deadline {
                    churn(pool, &s, 2_000);
                }
                churn(pool, &s, 2_000);
                s.synchronize().unwrap();
            });
        }
    });
    let st = pool.stats();
    assert_eq!(st.shards_in_use, 8, "the threads spread");
    assert_eq!(st.live, 0);
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
