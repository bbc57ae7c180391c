//! More streams than a pool has stream slots or stream bits (64): streams
//! made and destroyed by the hundred, up to 80 alive at once, their slots
//! and handles reused, blocks outliving the stream that allocated them and
//! freed on another one, work left pending on held streams. Over every
//! stream-ordered pool, with the simulator's ordering oracle: no block
//! overlaps a live one, memory freed on a stream serves another only once
//! that work is ordered before it, and everything goes back at the end.

mod common;

use common::model::{enqueue_work, sim, Modeled};
use gpumem::driver::sim::SimDriver;
use gpumem::pool::{
    ArenaConfig, ArenaResource, BinningConfig, BinningResource, CachingPool, CachingPoolConfig,
    FixedSizeResource, Pool, PoolConfig, PoolResource, SegmentPool, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::DeviceResource;
use gpumem::{Device, DevicePtr, Stream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A block live in the test: where, how big, and the stream that allocated
/// it (which may be gone).
struct Live {
    ptr: DevicePtr,
    bytes: usize,
    stream: u64,
}

/// Memory freed on `stream` after its first `pos` operations.
struct Freed {
    start: u64,
    end: u64,
    stream: u64,
    pos: u64,
}

/// Churns `pool` with requests up to `max_bytes`; at the end, after a
/// release, the pool holds `kept` bytes (what it took up front, if any).
fn churn<P: Pool>(
    pool: &P,
    device: &Device,
    sim: &SimDriver,
    live_of: impl Fn(&P) -> usize,
    max_bytes: usize,
    kept: usize,
) {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut streams: Vec<Stream> = Vec::new();
    let mut live: Vec<Live> = Vec::new();
    let mut freed: Vec<Freed> = Vec::new();
    let mut made = 0;
    for round in 0..600 {
        // Up to 80 streams alive; a new one most rounds, an old one dropped
        // when there are many (its slot, bit and handle come back).
        if streams.len() < 80 || rng.random_bool(0.5) {
            let s = device.create_stream().unwrap();
            if rng.random_bool(0.3) {
                sim.hold(s.raw());
            }
            streams.push(s);
            made += 1;
        }
        if streams.len() > 70 && rng.random_bool(0.6) {
            let i = rng.random_range(0..streams.len());
            let gone = streams.swap_remove(i);
            sim.release(gone.raw());
        }
        let s = streams[rng.random_range(0..streams.len())].clone();
        for _ in 0..rng.random_range(1..4) {
            let bytes = rng.random_range(1..=max_bytes);
            let p = match pool.allocate(bytes, 256, &s) {
                Ok(p) => p,
                Err(e) if e.is_oom() => break,
                Err(e) => panic!("round {round}: allocate {bytes}: {e}"),
            };
            let (start, end) = (p.0, p.0 + bytes as u64);
            for l in &live {
                assert!(
                    end <= l.ptr.0 || l.ptr.0 + l.bytes as u64 <= start,
                    "round {round}: overlap"
                );
            }
            freed.retain(|f| {
                if f.start < end && start < f.end {
                    assert!(
                        sim.is_ordered_after(f.stream, f.pos, s.raw()),
                        "round {round}: memory freed on {:#x} reused on {:#x} before that work was ordered",
                        f.stream,
                        s.raw()
                    );
                    false
                } else {
                    true
                }
            });
            enqueue_work(&s); // the block's use
            live.push(Live {
                ptr: p,
                bytes,
                stream: s.raw(),
            });
        }
        // Free a few: on the allocating stream when it lives, else on
        // another one after making it wait for the first's work (correct
        // code orders a free after the block's last use).
        for _ in 0..rng.random_range(0..4) {
            if live.is_empty() {
                break;
            }
            let b = live.swap_remove(rng.random_range(0..live.len()));
            let on = match streams.iter().find(|t| t.raw() == b.stream) {
                Some(own) if rng.random_bool(0.7) => own.clone(),
                _ => {
                    let other = streams[rng.random_range(0..streams.len())].clone();
                    if let Some(own) = streams.iter().find(|t| t.raw() == b.stream) {
                        other.wait_for(own).unwrap();
                    } else {
                        // Its stream is gone: its work must be done first.
                        sim.complete_all();
                    }
                    other
                }
            };
            pool.deallocate(b.ptr, b.bytes, 256, &on).unwrap();
            freed.push(Freed {
                start: b.ptr.0,
                end: b.ptr.0 + b.bytes as u64,
                stream: on.raw(),
                pos: sim.stream_position(on.raw()),
            });
        }
        if round % 97 == 0 {
            pool.trim(0).unwrap();
        }
        assert!(pool.reserved_bytes() >= live_of(pool).min(pool.reserved_bytes()));
    }
    assert!(made > 300, "streams made: {made}");
    sim.complete_all();
    for b in live.drain(..) {
        pool.deallocate(b.ptr, b.bytes, 256, &streams[0]).unwrap();
    }
    assert_eq!(live_of(pool), 0);
    for s in &streams {
        sim.release(s.raw());
    }
    pool.release().unwrap();
    assert_eq!(pool.reserved_bytes(), kept, "everything back");
}

fn setup() -> (Device, std::sync::Arc<SimDriver>) {
    sim(4 << 30)
}

#[test]
fn pool_resource() {
    let (device, sim) = setup();
    let pool =
        PoolResource::new(DeviceResource::new(device.clone()), PoolConfig::default()).unwrap();
    churn(&pool, &device, &sim, |p| p.live(), 1 << 20, 0);
}

#[test]
fn virtual_pool() {
    let (device, sim) = setup();
    let pool = VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap();
    churn(&pool, &device, &sim, |p| p.live(), 4 << 20, 0);
    pool.check_invariants().unwrap();
}

#[test]
fn arena() {
    let (device, sim) = setup();
    let mut config = ArenaConfig::default();
    config.max_reserved = Some(1 << 30);
    let pool = ArenaResource::new(DeviceResource::new(device.clone()), config).unwrap();
    // The arena keeps the memory it took up front.
    churn(&pool, &device, &sim, |p| p.stats().live, 1 << 20, 1 << 30);
}

#[test]
fn fixed_size() {
    let (device, sim) = setup();
    let pool = FixedSizeResource::new(
        DeviceResource::new(device.clone()),
        common::fixed_size_config(64 << 10, 16),
    )
    .unwrap();
    churn(&pool, &device, &sim, |p| p.live(), 64 << 10, 0);
}

#[test]
fn binning() {
    let (device, sim) = setup();
    // Requests within the bins: larger ones go to cuMemAlloc and cuMemFree,
    // whose implicit wait for the device the simulator's ordering oracle
    // does not model.
    let pool = BinningResource::new(
        DeviceResource::new(device.clone()),
        BinningConfig::fixed_bins(8, 17),
    )
    .unwrap();
    churn(&pool, &device, &sim, |p| p.live(), 128 << 10, 0);
}

#[test]
fn caching() {
    let (device, sim) = setup();
    let pool = CachingPool::new(
        DeviceResource::new(device.clone()),
        CachingPoolConfig::default(),
    )
    .unwrap();
    churn(&pool, &device, &sim, |p| p.live(), 2 << 20, 0);
}

#[test]
fn segment_pool() {
    let (device, sim) = setup();
    let pool = SegmentPool::new(DeviceResource::new(device.clone())).unwrap();
    churn(&pool, &device, &sim, |p| p.live(), 12 << 20, 0);
}
