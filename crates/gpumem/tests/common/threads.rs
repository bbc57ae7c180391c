//! Running a pool's calls on threads of their own: [`Worker`] runs jobs on
//! one thread, [`OnThreads`] sends each stream's calls to its worker, so a
//! sharded pool serves every stream from another shard.

use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use gpumem::adaptor::StatisticsAdaptor;
use gpumem::pool::Pool;
use gpumem::resource::{MemoryResource, Properties};
use gpumem::{Device, DevicePtr, Result, Stream};

use super::model::Modeled;

type Job = Box<dyn FnOnce() + Send>;

/// A thread that runs the jobs it is sent, one at a time.
pub struct Worker {
    jobs: Option<Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    pub fn new() -> Self {
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
    pub fn run<R: Send + 'static>(&self, f: impl FnOnce() -> R + Send + 'static) -> R {
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
/// (so on a shard of their own), one call at a time.
pub struct OnThreads<P> {
    pool: Arc<P>,
    streams: Vec<u64>,
    workers: Vec<Worker>,
}

impl<P> OnThreads<P> {
    pub fn new(pool: P, streams: &[Stream]) -> Self {
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

impl<P: MemoryResource + Send + Sync + 'static> MemoryResource for OnThreads<P> {
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

impl<P: Pool + Send + Sync + 'static> Pool for OnThreads<P> {
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

/// Makes threads contend for the first lock shard of `pool` until `until`
/// says so (its threads spread, say), or 20 s pass: in rounds, this thread
/// holds every lock the pool lends ([`LentLock::locked`], as a slow path
/// holds one) while each of `threads` threads, on a stream of its own, runs
/// `step` once and so finds the lock held. Every round counts a contended
/// acquisition per thread, whatever the free cores: threads that merely
/// churn meet at the lock as often as the cores let them, which a test
/// cannot count on. Then each thread runs `after` once.
///
/// [`LentLock::locked`]: gpumem::resource::LentLock::locked
pub fn contend<R: MemoryResource + Sync + ?Sized>(
    pool: &R,
    threads: usize,
    until: impl Fn() -> bool,
    step: impl Fn(&Stream) + Sync,
    after: impl Fn(&Stream) + Sync,
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Barrier;
    use std::time::{Duration, Instant};

    let lent = pool.lent_lock().expect("the pool lends its locks");
    let (go, back) = (Barrier::new(threads + 1), Barrier::new(threads + 1));
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let (go, back, done, step, after) = (&go, &back, &done, &step, &after);
            scope.spawn(move || {
                let s = pool.device().create_stream().unwrap();
                loop {
                    go.wait();
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    step(&s);
                    back.wait();
                }
                after(&s);
                s.synchronize().unwrap();
            });
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while !until() && Instant::now() < deadline {
            lent.locked(&mut || {
                go.wait();
                std::thread::sleep(Duration::from_millis(5));
            });
            back.wait();
        }
        done.store(true, Ordering::Relaxed);
        go.wait();
    });
}

/// Allocates and frees `n` blocks on `stream`, block `i` of `size(i)`
/// bytes, eight live at a time.
pub fn churn<R: MemoryResource + ?Sized>(
    pool: &R,
    stream: &Stream,
    n: usize,
    size: impl Fn(usize) -> usize,
) {
    let mut held = Vec::new();
    for i in 0..n {
        let bytes = size(i);
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

impl<P: Modeled + Send + Sync + 'static> Modeled for OnThreads<P> {
    fn accounted(&self, bytes: usize) -> usize {
        self.pool.accounted(bytes)
    }
    fn live(&self) -> usize {
        self.pool.live()
    }
    fn process(&self) {
        self.pool.process()
    }
    fn check(&self) {
        self.pool.check()
    }
}

/// Through a statistics wrapper over `pool`: a block allocated on another
/// thread and freed on this one, 100 times. The free counts in the cell
/// where the allocation counted, so the peak stays one block rather than
/// growing with every block handed over.
pub fn handed_blocks_keep_the_peak<P: MemoryResource + Send + Sync + 'static>(pool: P) {
    let s = pool.device().create_stream().unwrap();
    let mr = Arc::new(StatisticsAdaptor::new(pool));
    let producer = Worker::new();
    for _ in 0..100 {
        let (m, s2) = (mr.clone(), s.clone());
        let p = producer.run(move || m.allocate(4096, 256, &s2).unwrap());
        mr.deallocate(p, 4096, 256, &s).unwrap();
    }
    let st = mr.stats();
    assert_eq!((st.allocation.current, st.allocation.total), (0, 100));
    assert_eq!(st.allocation.peak, 1, "{st:?}");
    assert_eq!(st.allocated_bytes.peak, 4096);
}

/// Allocates and frees `rounds` blocks of 1 KiB to 3 MiB on a stream of its
/// own, eight live at a time, as thread `t` of a test; returns the blocks
/// still live at the end.
pub fn count_from_thread<R: MemoryResource + ?Sized>(
    mr: &R,
    device: &Device,
    t: usize,
    rounds: usize,
) -> Vec<(DevicePtr, usize)> {
    let s = device.create_stream().unwrap();
    let mut held = Vec::new();
    for i in 0..rounds {
        // Sizes from 1 KiB to 3 MiB: small and large heaps.
        let bytes = 1024 * (1 + (i * 7 + t * 13) % 3072);
        held.push((mr.allocate(bytes, 256, &s).unwrap(), bytes));
        if i % 8 == 7 {
            for (p, n) in held.drain(..) {
                mr.deallocate(p, n, 256, &s).unwrap();
            }
        }
    }
    s.synchronize().unwrap();
    held
}
