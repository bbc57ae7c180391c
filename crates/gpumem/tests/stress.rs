//! Concurrent stress with data checks, for every pool.
//!
//! 16 threads, each on its own stream, allocate blocks of log-uniform sizes
//! (256 B to 512 KiB) from one pool held to a small limit, so out-of-memory
//! comes often and concurrently. Every block is filled with a pattern that
//! names its thread and number, then handed to the next thread, which checks
//! the whole block and frees it, half the time on its own stream (the
//! cross-stream path), half on the allocating one. A block whose pattern
//! changed means two live blocks shared memory; overlapping address ranges
//! are also checked on every allocation. After the run every pool holds no
//! live bytes.
//!
//! `GPUMEM_STRESS_SECS` sets the seconds per pool (default 1: the suite's
//! ten-second version over all pools); on the GPU, `GPUMEM_DEVICE=cuda` and
//! a longer time. Each test prints its figures: threads, operations,
//! seconds, out-of-memory errors, bytes verified. The recycling pool also
//! moves pieces of its ranges while the threads work (on the simulator,
//! whose small granules make small pieces).

mod common;

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::pattern::{pattern, seconds, Figures};
use common::suite::LiveSet;
use gpumem::adaptor::{LimitingAdaptor, StatisticsAdaptor};
use gpumem::async_pool::{AsyncResource, AsyncResourceConfig};
use gpumem::manager::{PinnedPool, PinnedPoolConfig};
use gpumem::pool::{
    ArenaConfig, ArenaResource, BinningConfig, BinningResource, CachingPool, CachingPoolConfig,
    FixedSizeResource, PoolConfig, PoolResource, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::{DeviceResource, MemoryResource, PinnedHostResource};
use gpumem::{Device, DeviceBuffer, Stream};
use rand::{Rng, SeedableRng};

const THREADS: usize = 16;
/// Bytes each pool may hold: small, so 16 threads run it out of memory.
const LIMIT: usize = 16 << 20;
/// Blocks a thread holds at most before it frees one.
const HELD: usize = 8;

type Mr = Arc<dyn MemoryResource>;
type Buf = DeviceBuffer<u8, Mr>;

/// A block in flight between threads: its buffer and the seed of its pattern.
struct Block {
    buf: Buf,
    seed: u64,
}

/// What every thread shares: the pool, its device, the deadline, the live
/// ranges and the figures.
struct Shared {
    mr: Mr,
    device: Device,
    until: Instant,
    live: LiveSet,
    fig: Figures,
}

/// Checks a block's contents, then frees it (on `stream` when given).
fn check_and_free(b: Block, stream: Option<&Stream>, live: &LiveSet, fig: &Figures) {
    let mut got = vec![0u8; b.buf.len()];
    b.buf.copy_to_host(&mut got).expect("copy to host");
    if got != pattern(b.seed, got.len()) {
        let first = got
            .iter()
            .zip(pattern(b.seed, got.len()))
            .position(|(a, b)| *a != b)
            .unwrap_or(0);
        panic!(
            "block {:#x} ({} bytes) was overwritten at byte {first}: two live blocks shared memory",
            b.buf.as_device_ptr().0,
            got.len()
        );
    }
    fig.verified(got.len());
    let mut buf = b.buf;
    if let Some(s) = stream {
        // The copy above synchronized the old stream: ordering holds.
        buf.set_stream(s).unwrap();
    }
    live.remove(buf.as_device_ptr());
    drop(buf);
    fig.op();
}

fn worker(t: usize, sh: &Shared, inbox: Receiver<Block>, next: Sender<Block>) {
    let (live, fig) = (&sh.live, &sh.fig);
    let stream = sh.device.create_stream().expect("stream");
    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
    let mut held: Vec<Block> = Vec::new();
    let mut n = 0u64;
    while Instant::now() < sh.until {
        // Blocks from the previous thread: check, then free on this stream
        // or the allocating one.
        while let Ok(b) = inbox.try_recv() {
            let own = rng.random_bool(0.5);
            check_and_free(b, own.then_some(&stream), live, fig);
        }
        if held.len() >= HELD || rng.random_bool(0.3) {
            if let Some(b) = held.pop() {
                // Hand it on; if the next thread is gone, check and free here.
                if let Err(e) = next.send(b) {
                    check_and_free(e.0, None, live, fig);
                }
            }
            continue;
        }
        let len = 2f64.powf(rng.random_range(8.0..19.0)) as usize;
        match Buf::new(len, sh.mr.clone(), &stream) {
            Ok(mut buf) => {
                live.insert(buf.as_device_ptr(), len);
                n += 1;
                let seed = (t as u64) << 40 | n;
                buf.copy_from_host(&pattern(seed, len))
                    .expect("copy to device");
                held.push(Block { buf, seed });
                fig.op();
            }
            Err(e) if e.is_oom() => {
                fig.oom();
                // Make room: check and free one of ours.
                if let Some(b) = held.pop() {
                    check_and_free(b, None, live, fig);
                } else {
                    std::thread::yield_now();
                }
            }
            Err(e) => panic!("thread {t}: allocation of {len} bytes failed: {e}"),
        }
    }
    // No more sends: the next thread's drain below ends once this drops.
    drop(next);
    for b in held {
        check_and_free(b, None, live, fig);
    }
    // Drain what the previous thread sent until it is gone.
    for b in inbox {
        check_and_free(b, None, live, fig);
    }
}

/// Runs the stress over `mr`; returns the live bytes it reports at the end
/// through `live_after`.
fn stress(name: &str, mr: Mr, device: &Device, live_after: impl Fn() -> usize) {
    let secs = seconds();
    let start = Instant::now();
    let sh = Arc::new(Shared {
        mr,
        device: device.clone(),
        until: start + Duration::from_secs_f64(secs),
        live: LiveSet::default(),
        fig: Figures::default(),
    });
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| channel()).unzip();
    let mut handles = Vec::new();
    for (t, inbox) in receivers.into_iter().enumerate() {
        let next = senders[(t + 1) % THREADS].clone();
        let sh = sh.clone();
        handles.push(std::thread::spawn(move || worker(t, &sh, inbox, next)));
    }
    drop(senders);
    for h in handles {
        h.join().expect("a stress thread panicked");
    }
    let elapsed = start.elapsed().as_secs_f64();
    device.synchronize().unwrap();
    sh.fig.report(name, THREADS, elapsed);
    assert_eq!(
        live_after(),
        0,
        "{name}: live bytes after every block was freed"
    );
}

fn device() -> Device {
    common::device(true).0
}

#[test]
fn stress_pool_resource() {
    let d = device();
    let mut config = PoolConfig::default();
    config.max_reserved = Some(LIMIT);
    let mr = Arc::new(PoolResource::new(DeviceResource::new(d.clone()), config).unwrap());
    stress("PoolResource", mr.clone(), &d, || mr.live_bytes());
}

#[test]
fn stress_pool_resource_expandable() {
    let d = device();
    let mut config = PoolConfig::default();
    config.max_reserved = Some(LIMIT);
    config.expandable = true;
    let mr = Arc::new(PoolResource::new(DeviceResource::new(d.clone()), config).unwrap());
    stress("PoolResource (expandable)", mr.clone(), &d, || {
        mr.live_bytes()
    });
}

#[test]
fn stress_pool_resource_recycling() {
    // On the simulator, granules of 4 KiB make pieces of 128 KiB, so the
    // pool moves pieces while other threads fill and check their blocks;
    // on the GPU (64 MiB pieces) this is the expandable stress again.
    let mut small_granules = gpumem::driver::sim::SimConfig::backed(512 << 20);
    small_granules.granularity = 4 << 10;
    let (d, sim) = Device::from_env(small_granules).expect("GPUMEM_DEVICE names a usable backend");
    let mut config = PoolConfig::default();
    config.max_reserved = Some(LIMIT);
    config.expandable = true;
    config.recycle_pieces = true;
    config.growth.granularity = 4 << 10;
    let mr = Arc::new(PoolResource::new(DeviceResource::new(d.clone()), config).unwrap());
    // Moves come with growths, which a loaded machine makes fewer of in a
    // round: on the simulator, rounds run until a piece moved (at most 8).
    for round in 1.. {
        stress("PoolResource (recycling)", mr.clone(), &d, || {
            mr.live_bytes()
        });
        let Some(sim) = &sim else { break };
        // A map that created nothing is a moved piece.
        let moved = sim.call_count("cuMemMap") - sim.call_count("cuMemCreate");
        eprintln!("stress: PoolResource (recycling): {moved} pieces moved in {round} rounds");
        if moved > 0 {
            break;
        }
        assert!(round < 8, "the stress moved no piece in {round} rounds");
    }
}

#[test]
fn stress_caching_pool() {
    let d = device();
    let mut config = CachingPoolConfig::default();
    config.max_reserved = Some(LIMIT);
    let mr = Arc::new(CachingPool::new(DeviceResource::new(d.clone()), config).unwrap());
    stress("CachingPool", mr.clone(), &d, || mr.live_bytes());
}

#[test]
fn stress_fixed_size() {
    let d = device();
    let up = LimitingAdaptor::new(DeviceResource::new(d.clone()), LIMIT);
    let mr = Arc::new(FixedSizeResource::new(up, common::fixed_size_config(512 << 10, 4)).unwrap());
    stress("FixedSizeResource", mr.clone(), &d, || mr.live_bytes());
}

#[test]
fn stress_binning() {
    let d = device();
    let mut config = PoolConfig::default();
    config.max_reserved = Some(LIMIT);
    let pool = PoolResource::new(DeviceResource::new(d.clone()), config).unwrap();
    let mr = Arc::new(BinningResource::new(pool, BinningConfig::fixed_bins(8, 16)).unwrap());
    stress("BinningResource", mr.clone(), &d, || mr.live_bytes());
}

#[test]
fn stress_arena() {
    let d = device();
    let mr = Arc::new(
        ArenaResource::new(
            DeviceResource::new(d.clone()),
            ArenaConfig::with_size(LIMIT),
        )
        .unwrap(),
    );
    stress("ArenaResource", mr.clone(), &d, || mr.stats().live);
}

#[test]
fn stress_virtual_pool() {
    let d = device();
    let mut config = VirtualPoolConfig::default();
    config.max_reserved = Some(LIMIT);
    let mr = Arc::new(VirtualPool::new(d.clone(), config).unwrap());
    stress("VirtualPool", mr.clone(), &d, || mr.live_bytes());
    mr.check_invariants().unwrap();
}

#[test]
fn stress_async_resource() {
    let d = device();
    let mut config = AsyncResourceConfig::default();
    config.max_reserved = Some(LIMIT);
    let mr = Arc::new(AsyncResource::new(d.clone(), config).unwrap());
    stress("AsyncResource", mr.clone(), &d, || {
        mr.used_current().unwrap()
    });
}

#[test]
fn stress_pinned_pool() {
    let d = device();
    let mut config = PinnedPoolConfig::default();
    config.max_reserved = Some(LIMIT);
    let mr = Arc::new(PinnedPool::new(PinnedHostResource::new(d.clone()), config).unwrap());
    stress("PinnedPool", mr.clone(), &d, || mr.stats().live);
}

#[test]
fn stress_statistics_over_a_pool() {
    let d = device();
    let mut config = PoolConfig::default();
    config.max_reserved = Some(LIMIT);
    let pool = PoolResource::new(DeviceResource::new(d.clone()), config).unwrap();
    let mr = Arc::new(StatisticsAdaptor::new(pool));
    stress("StatisticsAdaptor<PoolResource>", mr.clone(), &d, || {
        mr.stats().allocated_bytes.current as usize
    });
}
