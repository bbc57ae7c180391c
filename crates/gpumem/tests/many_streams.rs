//! More streams than a pool has stream slots or stream bits (64), over every
//! pool whose frees are stream-ordered. Streams are made in waves of 40 and
//! dropped a wave later (80 alive at most, 320 in all), so the pools forget
//! dropped streams and give their slots, lanes and bits to new ones while
//! blocks freed on older streams are still pending: a third of the streams
//! are held (their work stays pending) and stay held for a wave after the
//! test drops them. Blocks outlive the stream that allocated them and are
//! freed on other streams, ordered after their last use by a wait.
//!
//! Every allocation is checked against the live blocks (no overlap) and
//! against the simulator's ordering oracle (memory freed on a stream serves
//! another only once that work is ordered before it). After every wave the
//! live blocks are checked again, the pool's live bytes against a model of
//! what was asked, and the pool's own invariants. At the end everything is
//! freed and released: the pool holds only what it keeps for its life,
//! keeps no dropped stream alive, and once it is dropped every byte, device
//! or pinned, is back with the simulator. Fixed seeds: every run is the same.

mod common;

use std::rc::Rc;
use std::sync::Arc;

use common::model::{enqueue_work, sim, Modeled};
use gpumem::async_pool::AsyncResource;
use gpumem::driver::sim::SimDriver;
use gpumem::graph_pool::GraphPool;
use gpumem::manager::{PinnedPool, PinnedPoolConfig};
use gpumem::pool::{
    ArenaConfig, ArenaResource, BinningConfig, BinningResource, CachingPool, CachingPoolConfig,
    FixedSizeResource, PoolConfig, PoolResource, SegmentPool, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::{DeviceResource, PinnedHostResource};
use gpumem::{Device, DevicePtr, Event, Stream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Waves of new streams; streams each wave makes; rounds of allocations and
/// frees per wave.
const WAVES: usize = 8;
const PER_WAVE: usize = 40;
const ROUNDS: usize = 50;

/// CUDA's pool counts what was asked, rounded to 256 bytes on the simulator,
/// until the free has run in stream order (see [`Churn::unrun_frees`]).
impl Modeled for AsyncResource {
    fn accounted(&self, bytes: usize) -> usize {
        bytes.next_multiple_of(256)
    }
    fn live(&self) -> usize {
        self.pool().used_current().unwrap()
    }
    fn process(&self) {}
}

/// The pinned pool counts its heap's blocks, in 256-byte granules.
impl Modeled for PinnedPool {
    fn accounted(&self, bytes: usize) -> usize {
        bytes.next_multiple_of(256)
    }
    fn live(&self) -> usize {
        let s = self.stats();
        assert_eq!(s.reserved, s.live + s.free + s.pending_bytes, "{s:?}");
        s.live
    }
    fn process(&self) {
        self.process_pending().unwrap();
    }
}

/// Outside a capture a graph pool serves from its other memory, a
/// `PoolResource` counting 256-byte granules.
impl Modeled for GraphPool {
    fn accounted(&self, bytes: usize) -> usize {
        bytes.next_multiple_of(256)
    }
    fn live(&self) -> usize {
        self.live_bytes()
    }
    fn process(&self) {}
}

/// A block live in the test.
struct Live {
    ptr: DevicePtr,
    bytes: usize,
    /// The raw handle of the stream that allocated it (which may be gone).
    owner: u64,
    /// Recorded on the owner when the test dropped it: the end of the
    /// block's last use, for a free on another stream to wait for.
    fence: Option<Rc<Event>>,
}

/// Memory freed on `stream` after its first `pos` operations.
struct Freed {
    start: u64,
    end: u64,
    stream: u64,
    pos: u64,
}

/// One run: the pool, the simulator and what the test knows.
struct Churn<'a, P> {
    pool: &'a P,
    sim: &'a SimDriver,
    device: Device,
    rng: StdRng,
    max_bytes: usize,
    /// The test's streams with the wave that made them.
    streams: Vec<(Stream, usize)>,
    /// Held streams (raw handles, which outlive the test's handle) and the
    /// wave that made them.
    held: Vec<(u64, usize)>,
    live: Vec<Live>,
    freed: Vec<Freed>,
    /// Whether the pool counts a block live until its free has run (CUDA's
    /// pool does): then the model counts the frees not run yet, as
    /// (stream, position of the free, bytes).
    unrun_frees: Option<Vec<(u64, u64, usize)>>,
    made: usize,
    most_alive: usize,
}

impl<P: Modeled> Churn<'_, P> {
    fn run(&mut self) {
        for wave in 0..WAVES {
            for _ in 0..PER_WAVE {
                let s = self.device.create_stream().unwrap();
                if self.rng.random_bool(0.33) {
                    self.sim.hold(s.raw());
                    self.held.push((s.raw(), wave));
                }
                self.streams.push((s, wave));
                self.made += 1;
            }
            self.most_alive = self.most_alive.max(self.sim.live_streams());
            for round in 0..ROUNDS {
                self.round(wave, round);
            }
            // The previous wave's streams go; those held keep their work
            // pending for one more wave.
            self.drop_streams_of(wave.wrapping_sub(1));
            self.release_holds_of(wave.wrapping_sub(2));
            self.check(&format!("after wave {wave}"));
        }
        assert!(self.made >= 300, "streams made: {}", self.made);
        assert!(
            self.most_alive > 64,
            "more streams alive at once than stream bits: {}",
            self.most_alive
        );
    }

    fn round(&mut self, wave: usize, round: usize) {
        let s = self.pick_stream();
        for _ in 0..self.rng.random_range(1..4) {
            if !self.allocate(&s, wave, round) {
                break;
            }
        }
        for _ in 0..self.rng.random_range(0..4) {
            self.free_one();
        }
        if self.rng.random_bool(0.1) {
            // A kernel using a live block, on the block's stream.
            let i = self.rng.random_range(0..self.live.len().max(1));
            if let Some(own) = self.live.get(i).and_then(|b| self.stream_of(b.owner)) {
                enqueue_work(&own);
            }
        }
        if self.rng.random_bool(0.05) && !self.held.is_empty() {
            let (raw, _) = self
                .held
                .swap_remove(self.rng.random_range(0..self.held.len()));
            self.sim.release(raw);
        }
        if round % 17 == 16 {
            self.pool.trim(0).unwrap();
            self.pool.process();
            self.check(&format!("wave {wave} round {round}, after a trim"));
        }
    }

    fn pick_stream(&mut self) -> Stream {
        let i = self.rng.random_range(0..self.streams.len());
        self.streams[i].0.clone()
    }

    fn stream_of(&self, raw: u64) -> Option<Stream> {
        self.streams
            .iter()
            .find(|(s, _)| s.raw() == raw)
            .map(|(s, _)| s.clone())
    }

    /// One allocation on `s`, checked; false when the pool is out of memory.
    fn allocate(&mut self, s: &Stream, wave: usize, round: usize) -> bool {
        // Sizes spread over every power of two up to the largest.
        let top = self.max_bytes.ilog2();
        let log = self.rng.random_range(0..=top);
        let bytes = self
            .rng
            .random_range((1usize << log) / 2 + 1..=(1usize << log).min(self.max_bytes));
        let p = match self.pool.allocate(bytes, 256, s) {
            Ok(p) => p,
            Err(e) if e.is_oom() => return false,
            Err(e) => panic!("wave {wave} round {round}: allocate {bytes}: {e}"),
        };
        assert_eq!(p.0 % 256, 0, "alignment");
        let (start, end) = (p.0, p.0 + bytes as u64);
        for l in &self.live {
            assert!(
                end <= l.ptr.0 || l.ptr.0 + l.bytes as u64 <= start,
                "wave {wave} round {round}: {start:#x} (+{bytes}) overlaps live {:#x} (+{})",
                l.ptr.0,
                l.bytes
            );
        }
        let sim = self.sim;
        self.freed.retain(|f| {
            if f.start < end && start < f.end {
                assert!(
                    sim.is_ordered_after(f.stream, f.pos, s.raw()),
                    "wave {wave} round {round}: memory freed on {:#x} at {} reused on {:#x} before that work was ordered",
                    f.stream,
                    f.pos,
                    s.raw()
                );
                false
            } else {
                true
            }
        });
        enqueue_work(s); // the block's use
        self.live.push(Live {
            ptr: p,
            bytes,
            owner: s.raw(),
            fence: None,
        });
        true
    }

    /// Frees a live block: on its stream, or on another one made to wait
    /// for its last use (the stream's work so far, or the fence recorded
    /// when the test dropped it).
    fn free_one(&mut self) {
        if self.live.is_empty() {
            return;
        }
        let b = self
            .live
            .swap_remove(self.rng.random_range(0..self.live.len()));
        let on = match (self.stream_of(b.owner), &b.fence) {
            (Some(own), _) if self.rng.random_bool(0.5) => own,
            (Some(own), _) => {
                let other = self.pick_stream();
                if other.raw() != own.raw() {
                    other.wait_for(&own).unwrap();
                }
                other
            }
            (None, Some(fence)) => {
                let other = self.pick_stream();
                other.wait_event(fence).unwrap();
                other
            }
            (None, None) => unreachable!("a block of a dropped stream has its fence"),
        };
        self.pool.deallocate(b.ptr, b.bytes, 256, &on).unwrap();
        let pos = self.sim.stream_position(on.raw());
        self.freed.push(Freed {
            start: b.ptr.0,
            end: b.ptr.0 + b.bytes as u64,
            stream: on.raw(),
            pos,
        });
        if let Some(unrun) = &mut self.unrun_frees {
            unrun.push((on.raw(), pos, self.pool.accounted(b.bytes)));
        }
    }

    /// Drops the test's streams made in `wave`, fencing the blocks they
    /// allocated that are still live.
    fn drop_streams_of(&mut self, wave: usize) {
        let (gone, kept) = std::mem::take(&mut self.streams)
            .into_iter()
            .partition(|&(_, w)| w == wave);
        self.streams = kept;
        for (s, _) in gone {
            let mut fence = None;
            for b in self.live.iter_mut().filter(|b| b.owner == s.raw()) {
                let ev = fence.get_or_insert_with(|| {
                    let ev = Event::new(&self.device).unwrap();
                    ev.record(&s).unwrap();
                    Rc::new(ev)
                });
                b.fence = Some(ev.clone());
            }
        }
    }

    fn release_holds_of(&mut self, wave: usize) {
        let sim = self.sim;
        self.held.retain(|&(raw, w)| {
            if w == wave {
                sim.release(raw);
            }
            w != wave
        });
    }

    /// No two live blocks overlap; the pool's live bytes are the model's;
    /// the pool's own checks hold.
    fn check(&self, when: &str) {
        let mut blocks: Vec<(u64, u64)> = self
            .live
            .iter()
            .map(|b| (b.ptr.0, b.ptr.0 + b.bytes as u64))
            .collect();
        blocks.sort_unstable();
        for w in blocks.windows(2) {
            assert!(w[0].1 <= w[1].0, "{when}: live blocks {w:x?} overlap");
        }
        let mut model: usize = self.live.iter().map(|b| self.pool.accounted(b.bytes)).sum();
        if let Some(unrun) = &self.unrun_frees {
            // A stream runs its work in order: the free at `pos` has run
            // once no more than the work after it is pending.
            let sim = self.sim;
            model += unrun
                .iter()
                .filter(|&&(s, pos, _)| sim.stream_position(s) - (sim.pending_ops(s) as u64) < pos)
                .map(|&(_, _, bytes)| bytes)
                .sum::<usize>();
        }
        assert_eq!(self.pool.live(), model, "{when}: live bytes");
        assert!(self.pool.reserved_bytes() >= model, "{when}: reserve");
        self.pool.check();
    }

    /// Frees everything once all work has run, releases the pool, and checks
    /// that it keeps nothing but `kept()` and no stream the test dropped.
    fn finish(mut self, streams_before: usize) {
        for (raw, _) in self.held.drain(..) {
            self.sim.release(raw);
        }
        self.sim.complete_all();
        let s = self.streams[0].0.clone();
        for b in std::mem::take(&mut self.live) {
            self.pool.deallocate(b.ptr, b.bytes, 256, &s).unwrap();
        }
        assert_eq!(self.pool.live(), 0, "nothing live");
        drop(s);
        // All work has run: a trim, which waits for nothing, finds every
        // stream idle and lets go of those the test dropped.
        self.sim.complete_all();
        self.pool.trim(0).unwrap();
        self.pool.process();
        assert_eq!(
            self.sim.live_streams(),
            streams_before + self.streams.len(),
            "after a trim, the pool keeps no stream the test dropped"
        );
        self.streams.clear();
        self.pool.release().unwrap();
        self.pool.process();
        assert_eq!(
            self.pool.reserved_bytes(),
            self.pool.kept(),
            "every free chunk goes back"
        );
        self.pool.check();
        assert_eq!(
            self.sim.live_streams(),
            streams_before,
            "the pool keeps no stream the test dropped"
        );
    }
}

/// Churns the pool `make` builds with requests of up to `max_bytes`; after
/// the pool is dropped, checks that the simulator has everything back. With
/// `unrun_frees_live`, the pool counts a block live until its free has run
/// rather than until it is freed.
fn churn_counting<P: Modeled>(
    max_bytes: usize,
    unrun_frees_live: bool,
    make: impl FnOnce(&Device) -> P,
) {
    let (device, sim) = sim(4 << 30);
    let (device_bytes, streams) = (sim.device_bytes(0), sim.live_streams());
    let pool = make(&device);
    let mut c = Churn {
        pool: &pool,
        sim: &sim,
        device: device.clone(),
        rng: StdRng::seed_from_u64(0x5eed_0064),
        max_bytes,
        streams: Vec::new(),
        held: Vec::new(),
        live: Vec::new(),
        freed: Vec::new(),
        unrun_frees: unrun_frees_live.then(Vec::new),
        made: 0,
        most_alive: 0,
    };
    c.run();
    c.finish(streams);
    drop(pool);
    sim.complete_all();
    assert_eq!(sim.device_bytes(0), device_bytes, "device memory back");
    assert_eq!(sim.physical_bytes(), 0, "physical memory back");
    assert_eq!(sim.reserved_va_bytes(), 0, "address ranges back");
    assert_eq!(sim.pinned_host_bytes(), 0, "pinned memory back");
    assert_eq!(sim.live_streams(), streams, "every stream destroyed");
    let _: Arc<SimDriver> = sim;
}

/// When a pool lets go of the streams its users dropped.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LetsGo {
    /// Once a query finds the stream's work done, at the latest when the
    /// next new stream comes: pools whose stream tables are slots, lanes or
    /// tracks (and CUDA's pool, which keeps none).
    Soon,
    /// At a trim (or an out-of-memory path, or a release): pools that keep
    /// per-stream caches, whose blocks a dropped stream's lane or arena
    /// holds until then, by design (they learn of completion lazily).
    AtTrim,
}

/// Makes a stream, allocates and frees a block on it and drops it, 300
/// times, then trims once all work has run: the pool keeps at most two of
/// the streams it has seen all along ([`LetsGo::Soon`]), and none after the
/// trim.
fn one_by_one<P: Modeled>(lets_go: LetsGo, make: impl FnOnce(&Device) -> P) {
    let (device, sim) = sim(4 << 30);
    let before = sim.live_streams();
    let pool = make(&device);
    for i in 0..300 {
        let s = device.create_stream().unwrap();
        let p = pool.allocate(4096, 256, &s).unwrap();
        enqueue_work(&s);
        pool.deallocate(p, 4096, 256, &s).unwrap();
        drop(s);
        let kept = sim.live_streams() - before;
        assert!(
            kept <= 2 || lets_go == LetsGo::AtTrim,
            "after {} streams, the pool keeps {kept}",
            i + 1
        );
    }
    sim.complete_all();
    pool.trim(0).unwrap();
    pool.process();
    assert_eq!(
        sim.live_streams(),
        before,
        "after a trim, the pool keeps none"
    );
}

fn up(device: &Device) -> DeviceResource {
    DeviceResource::new(device.clone())
}

/// Both tests for each pool: `waves` ([`churn_counting`]) with requests of
/// up to `$max` bytes (`$unrun`: the pool counts a block live until its
/// free has run), and `one_by_one` (`$lets_go`).
macro_rules! pools {
    ($($name:ident: |$d:ident| $make:expr, $max:expr, $unrun:expr, $lets_go:ident;)*) => {$(
        mod $name {
            use super::*;

            #[test]
            fn waves() {
                churn_counting($max, $unrun, |$d: &Device| $make);
            }

            #[test]
            fn one_by_one() {
                super::one_by_one(LetsGo::$lets_go, |$d: &Device| $make);
            }
        }
    )*};
}

pools! {
    pool_resource: |d| PoolResource::new(up(d), PoolConfig::default()).unwrap(),
        1 << 20, false, Soon;
    pool_resource_in_regions: |d| {
        let mut config = PoolConfig::default();
        config.expandable = false;
        PoolResource::new(up(d), config).unwrap()
    }, 1 << 20, false, Soon;
    virtual_pool: |d| VirtualPool::new(d.clone(), VirtualPoolConfig::default()).unwrap(),
        4 << 20, false, Soon;
    // Its freed blocks are kept whole for their stream until a trim.
    virtual_pool_nccl_ready: |d| {
        VirtualPool::new(d.clone(), VirtualPoolConfig::nccl_ready(Vec::new())).unwrap()
    }, 4 << 20, false, AtTrim;
    caching: |d| CachingPool::new(up(d), CachingPoolConfig::default()).unwrap(),
        2 << 20, false, AtTrim;
    fixed_size: |d| {
        FixedSizeResource::new(up(d), common::fixed_size_config(64 << 10, 16)).unwrap()
    }, 64 << 10, false, AtTrim;
    // Requests within the bins: larger ones go to cuMemAlloc and cuMemFree,
    // whose implicit wait for the device the ordering oracle does not model.
    binning: |d| BinningResource::new(up(d), BinningConfig::fixed_bins(8, 17)).unwrap(),
        128 << 10, false, AtTrim;
    segment_pool: |d| SegmentPool::new(up(d)).unwrap(), 12 << 20, false, AtTrim;
    arena: |d| ArenaResource::new(up(d), ArenaConfig::with_size(1 << 30)).unwrap(),
        1 << 20, false, AtTrim;
    // CUDA's pool counts a block live until its free has run.
    async_pool: |d| AsyncResource::with_defaults(d.clone()).unwrap(), 4 << 20, true, Soon;
    graph_pool_outside_captures: |d| GraphPool::new(d).unwrap(), 1 << 20, false, Soon;
    pinned_pool: |d| {
        PinnedPool::new(PinnedHostResource::new(d.clone()), PinnedPoolConfig::default())
            .unwrap()
    }, 64 << 10, false, Soon;
}
