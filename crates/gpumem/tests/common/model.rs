//! Random operation sequences against any pool, checked against a simple
//! model and the simulator's ordering oracle (shared by the pool tests and
//! the `pools` fuzz target). On a backed simulated device every block is
//! written when it is handed out and read back now and then, so memory that
//! changes under a live block (a stream's late write, a page unmapped and
//! mapped again) shows as lost data.

use std::sync::Arc;

use gpumem::adaptor::{LimitingAdaptor, StatisticsAdaptor, TrackingAdaptor};
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::{CaptureMode, Driver};
use gpumem::pool::{
    ArenaConfig, ArenaResource, BinningConfig, BinningResource, CachingPool, CachingPoolConfig,
    FixedSizeConfig, FixedSizeResource, Pool, PoolConfig, PoolResource, SegmentPool, VirtualPool,
    VirtualPoolConfig,
};
use gpumem::resource::DeviceResource;
use gpumem::resource::MemoryResource;
use gpumem::{Device, DevicePtr, Stream};
use proptest::prelude::*;

/// Enqueues one operation on `stream` (an event record: safe, and on a held
/// stream it stays pending like a kernel would).
pub fn enqueue_work(stream: &Stream) {
    let ev = gpumem::Event::new(stream.device()).unwrap();
    ev.record(stream).unwrap();
}

pub fn sim(capacity: usize) -> (Device, Arc<SimDriver>) {
    let mut config = SimConfig::default();
    config.capacity = capacity;
    Device::sim_with_driver(config)
}

#[derive(Debug, Clone)]
pub enum Op {
    Alloc {
        stream: usize,
        bytes: usize,
    },
    Free {
        pick: usize,
        stream: usize,
    },
    Touch {
        pick: usize,
    },
    Hold {
        stream: usize,
    },
    Release {
        stream: usize,
    },
    Process,
    Trim,
    /// A bad free of a live block (`kind` 0: a size of another class, 1: a
    /// pointer inside it), of a block already freed (2) or of a pointer no
    /// pool hands out (3).
    BadFree {
        pick: usize,
        kind: u8,
    },
    /// Stream 0 begins a Global capture, or ends the one under way (a pool
    /// that is not capture-safe ignores it).
    Capture,
    /// Reads every live block back and checks what was written (backed
    /// devices only; waits for the blocks' streams).
    Verify,
}

pub fn op(max_log: u32) -> impl Strategy<Value = Op> {
    op_between(0, max_log)
}

/// [`op`] with captures too. A capture counts process-wide (pools do not
/// wait for streams while one is under way), so tests that capture take
/// turns with every other test of their binary.
pub fn op_capturing(max_log: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => op(max_log),
        1 => Just(Op::Capture),
    ]
}

/// [`op`] with requests of `2^log` bytes plus up to 1023 (never twice
/// `2^log`), `log` from `min_log` to `max_log`.
pub fn op_between(min_log: u32, max_log: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3usize, min_log..=max_log, 0..1024usize).prop_map(move |(stream, log, extra)| {
            let base = 1usize << log;
            Op::Alloc { stream, bytes: (base + extra % base).max(1) }
        }),
        4 => (any::<usize>(), 0..3usize).prop_map(|(pick, stream)| Op::Free { pick, stream }),
        2 => any::<usize>().prop_map(|pick| Op::Touch { pick }),
        1 => (0..3usize).prop_map(|stream| Op::Hold { stream }),
        1 => (0..3usize).prop_map(|stream| Op::Release { stream }),
        1 => Just(Op::Process),
        1 => Just(Op::Trim),
        1 => (any::<usize>(), 0..4u8).prop_map(|(pick, kind)| Op::BadFree { pick, kind }),
        1 => Just(Op::Verify),
    ]
}

/// What the harness needs of a pool under test besides [`Pool`] (whose
/// `reserved_bytes`, `trim(0)` and `release` it calls).
pub trait Modeled: Pool {
    /// Bytes the pool counts as live for a request of `bytes` (default: as asked).
    fn accounted(&self, bytes: usize) -> usize {
        bytes
    }
    fn live(&self) -> usize;
    fn process(&self);
    /// Checks the pool's invariants after a trim (default: nothing to check).
    fn check(&self) {}
    /// Checks counters of the live blocks' sizes as asked, `requested`
    /// (adaptors count them; default: nothing to check).
    fn check_requested(&self, _requested: &[usize]) {}
    /// Whether the pool serves a stream while it captures a graph (no call
    /// CUDA forbids then, and nothing a capture freed handed out again).
    fn capture_safe(&self) -> bool {
        true
    }
    /// Whether what a capture freed serves its stream again (a graph's
    /// private pool: its graphs run in the order of that stream), never
    /// another stream. Such a pool does not know when its graphs go: its
    /// owner trims it only then, and so does the model.
    fn graph_private(&self) -> bool {
        false
    }
    /// Bytes the pool holds after a release with nothing live (default:
    /// none; an arena holds its one region for its whole life).
    fn kept(&self) -> usize {
        0
    }
}

/// A VirtualPool checks its invariants after every operation; its blocks
/// count 256-byte granules, whole pages in the NCCL-ready mode.
impl Modeled for VirtualPool {
    fn accounted(&self, bytes: usize) -> usize {
        match self.config().nccl_ready {
            true => bytes.next_multiple_of(self.page_size()),
            false => bytes.next_multiple_of(256),
        }
    }
    fn live(&self) -> usize {
        self.live_bytes()
    }
    fn process(&self) {
        self.check_invariants().unwrap();
    }
    fn check(&self) {
        self.check_invariants().unwrap();
    }
}

/// A PoolResource checks its structure after every operation; its blocks
/// count 256-byte granules.
impl<U: MemoryResource> Modeled for PoolResource<U> {
    fn accounted(&self, bytes: usize) -> usize {
        bytes.next_multiple_of(256)
    }
    fn live(&self) -> usize {
        self.live_bytes()
    }
    fn process(&self) {
        self.check_invariants().unwrap();
    }
    fn check(&self) {
        self.check_invariants().unwrap();
    }
}

impl<U: MemoryResource> Modeled for FixedSizeResource<U> {
    fn live(&self) -> usize {
        self.live_bytes()
    }
    fn process(&self) {
        self.process_deferred().unwrap();
    }
}

impl<U: MemoryResource + 'static> Modeled for BinningResource<U> {
    fn live(&self) -> usize {
        self.live_bytes()
    }
    fn process(&self) {
        self.process_deferred().unwrap();
    }
}

impl<U: MemoryResource> Modeled for CachingPool<U> {
    fn live(&self) -> usize {
        let s = self.stats();
        assert_eq!(s.live, self.live_bytes());
        assert_eq!(s.reserved, self.reserved_bytes());
        let in_use: usize = s.classes.iter().map(|c| c.live_blocks * c.block_size).sum();
        assert_eq!(s.free + in_use + s.parked, s.reserved, "{s:?}");
        self.live_bytes()
    }
    fn process(&self) {
        self.process_deferred().unwrap();
    }
}

/// A SegmentPool counts what was asked for (a block may keep a remainder
/// it did not split off); its segments tile exactly into blocks.
impl<U: MemoryResource> Modeled for SegmentPool<U> {
    fn graph_private(&self) -> bool {
        true
    }
    fn live(&self) -> usize {
        let s = self.stats();
        (s.small.requested_bytes.current + s.large.requested_bytes.current) as usize
    }
    fn process(&self) {}
    fn check(&self) {
        for seg in self.segments() {
            let tiled: usize = seg.blocks.iter().map(|b| b.size).sum();
            assert_eq!(tiled, seg.size, "{seg:?}");
        }
    }
}

/// An ArenaResource counts small blocks in 256-byte granules and large
/// ones in whole superblocks.
impl<U: MemoryResource> Modeled for ArenaResource<U> {
    fn accounted(&self, bytes: usize) -> usize {
        self.block_size_for(bytes).unwrap_or(bytes)
    }
    fn live(&self) -> usize {
        self.stats().live
    }
    fn process(&self) {}
    fn kept(&self) -> usize {
        self.reserved_bytes()
    }
}

/// Implements `Modeled` for an adaptor: everything but its own count of
/// what was asked (`check_requested`) is its upstream's.
macro_rules! modeled_adaptor {
    ($adaptor:ident, |$this:ident, $requested:ident| $check:block) => {
        impl<P: Modeled> Modeled for $adaptor<P> {
            fn accounted(&self, bytes: usize) -> usize {
                self.upstream().accounted(bytes)
            }
            fn live(&self) -> usize {
                self.upstream().live()
            }
            fn process(&self) {
                self.upstream().process()
            }
            fn check(&self) {
                self.upstream().check()
            }
            fn check_requested(&self, $requested: &[usize]) {
                let $this = self;
                $check
                self.upstream().check_requested($requested)
            }
            fn capture_safe(&self) -> bool {
                self.upstream().capture_safe()
            }
            fn graph_private(&self) -> bool {
                self.upstream().graph_private()
            }
            fn kept(&self) -> usize {
                self.upstream().kept()
            }
        }
    };
}

// The adaptors count what was asked, each in its way, whatever the pool
// beneath does.
modeled_adaptor!(StatisticsAdaptor, |this, requested| {
    let s = this.stats();
    let sum: usize = requested.iter().sum();
    let granules: usize = requested.iter().map(|b| b.next_multiple_of(256)).sum();
    assert_eq!(s.requested_bytes.current as usize, sum, "{s:?}");
    assert_eq!(s.allocated_bytes.current as usize, granules, "{s:?}");
    assert_eq!(s.allocation.current as usize, requested.len(), "{s:?}");
});
modeled_adaptor!(TrackingAdaptor, |this, requested| {
    let sum: usize = requested.iter().sum();
    assert_eq!(this.outstanding_bytes(), sum, "{}", this.leak_report());
});
modeled_adaptor!(LimitingAdaptor, |this, requested| {
    let granules: usize = requested
        .iter()
        .map(|b| b.next_multiple_of(this.granularity()))
        .sum();
    assert_eq!(this.allocated_bytes(), granules);
});

pub struct Freed {
    start: u64,
    end: u64,
    stream: u64,
    pos: u64,
}

/// Whether `[start, end)` lies wholly in device memory the driver holds
/// allocated or mapped (walked allocation by allocation, mapping by mapping).
fn mapped(sim: &SimDriver, start: u64, end: u64) -> bool {
    let mut at = start;
    while at < end {
        match sim.mem_address_range(DevicePtr(at)) {
            Ok((base, len)) if base.0 + len as u64 > at => at = base.0 + len as u64,
            _ => return false,
        }
    }
    true
}

/// Bytes of a block written and read back at each of its start, middle
/// and end (at most).
const SAMPLE: usize = 64;

/// Where a block of `bytes` is sampled (never twice the same byte), and
/// how long each sample is: the whole of a small block.
fn samples(bytes: usize) -> (Vec<usize>, usize) {
    if bytes < 3 * SAMPLE {
        return (vec![0], bytes);
    }
    (vec![0, (bytes - SAMPLE) / 2, bytes - SAMPLE], SAMPLE)
}

/// What a block written with `seed` holds at `at`.
fn expected(seed: u64, at: usize, len: usize) -> Vec<u8> {
    super::pattern::pattern(seed ^ (at as u64).rotate_left(32), len)
}

/// A live block of the model.
struct LiveData {
    /// The seed its samples were written with; `None` when its data is
    /// undefined (allocated on a capturing stream: the write would be the
    /// graph's).
    seed: Option<u64>,
}

/// Runs `ops` against `pool`, checking overlap, alignment, the stats model
/// and the ordering oracle; then frees everything and checks that the pool
/// gives all memory back. After every operation each live block must be
/// mapped whole, and a freed block whose memory left its mapping (a trim,
/// or a pool that moves memory under free blocks) must have had its
/// stream's work run first: that memory may now serve anyone. While
/// stream 0 captures a graph, no call may break the capture and nothing
/// freed on the capturing stream (the graph's) is handed out again. On a
/// backed device, blocks hold what was written into them.
pub fn run_model<P: Modeled>(
    pool: P,
    sim: &SimDriver,
    streams: &[Stream],
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let backed = sim.config().backed;
    let device = streams[0].device().clone();
    let mut live: Vec<(DevicePtr, usize, usize)> = Vec::new();
    let mut data: std::collections::HashMap<u64, LiveData> = Default::default();
    // Host sources of writes that may still be pending on a held stream.
    let mut sources: Vec<Vec<u8>> = Vec::new();
    let mut freed: Vec<Freed> = Vec::new();
    let mut held = [false; 3];
    let mut capturing = false;
    let mut graphs = Vec::new();
    let mut graphs_own: Vec<(u64, u64)> = Vec::new();
    let mut next_seed = 0u64;
    sim.clear_capture_violations();
    for op in ops {
        match *op {
            Op::Alloc { stream, bytes } => {
                let s = &streams[stream];
                let p = match pool.allocate(bytes, 256, s) {
                    Ok(p) => p,
                    Err(e) if e.is_oom() => continue,
                    Err(e) => return Err(TestCaseError::fail(format!("allocate {bytes}: {e}"))),
                };
                prop_assert_eq!(p.0 % 256, 0, "alignment");
                let (start, end) = (p.0, p.0 + bytes as u64);
                for &(q, b, _) in &live {
                    prop_assert!(
                        end <= q.0 || q.0 + b as u64 <= start,
                        "overlap with a live block"
                    );
                }
                let private = pool.graph_private() && stream == 0;
                for &(a, b) in graphs_own.iter().filter(|_| !private) {
                    prop_assert!(
                        end <= a || b <= start,
                        "{:#x} (+{}) is memory a graph freed during its capture",
                        start,
                        bytes
                    );
                }
                let mut i = 0;
                while i < freed.len() {
                    let f = &freed[i];
                    if f.start < end && start < f.end {
                        prop_assert!(
                            sim.is_ordered_after(f.stream, f.pos, s.raw()),
                            "block freed on stream {:#x} at {} reused on {:#x} before that work was ordered",
                            f.stream,
                            f.pos,
                            s.raw()
                        );
                        freed.swap_remove(i);
                    } else {
                        i += 1;
                    }
                }
                let seed = if backed && !(capturing && stream == 0) {
                    next_seed += 1;
                    let (at, len) = samples(bytes);
                    for off in at {
                        let src = expected(next_seed, off, len);
                        // SAFETY: a live block of `bytes` bytes; `src` is kept in
                        // `sources` until every stream's work has run.
                        unsafe {
                            device.driver().memcpy_htod_async(
                                DevicePtr(p.0 + off as u64),
                                src.as_ptr(),
                                len,
                                s.raw(),
                            )
                        }
                        .unwrap();
                        sources.push(src);
                    }
                    Some(next_seed)
                } else {
                    None
                };
                data.insert(p.0, LiveData { seed });
                live.push((p, bytes, stream));
            }
            Op::Free { pick, stream } => {
                if live.is_empty() {
                    continue;
                }
                let (p, bytes, owner) = live.swap_remove(pick % live.len());
                // While stream 0 captures, a block crosses to or from it
                // only through the graph: free it where it was used.
                let stream = if capturing && owner != stream && (owner == 0 || stream == 0) {
                    owner
                } else {
                    stream
                };
                let s = &streams[stream];
                if owner != stream {
                    // Correct code orders the free after the block's last use.
                    s.wait_for(&streams[owner]).unwrap();
                }
                pool.deallocate(p, bytes, 256, s).unwrap();
                data.remove(&p.0);
                if capturing && stream == 0 {
                    graphs_own.push((p.0, p.0 + bytes as u64));
                } else {
                    freed.push(Freed {
                        start: p.0,
                        end: p.0 + bytes as u64,
                        stream: s.raw(),
                        pos: sim.stream_position(s.raw()),
                    });
                }
            }
            Op::Touch { pick } => {
                if let Some(&(_, _, owner)) = live.get(pick % live.len().max(1)) {
                    // Work that uses the block, on the block's stream.
                    enqueue_work(&streams[owner]);
                }
            }
            Op::Hold { stream } => {
                sim.hold(streams[stream].raw());
                held[stream] = true;
            }
            Op::Release { stream } => {
                sim.release(streams[stream].raw());
                held[stream] = false;
            }
            Op::Process => pool.process(),
            // Trimming frees memory, which CUDA forbids during a capture.
            Op::Trim if capturing || (pool.graph_private() && !graphs_own.is_empty()) => {}
            Op::Trim => {
                pool.trim(0).unwrap();
                pool.check();
            }
            Op::BadFree { pick, kind } => bad_free(&pool, streams, &mut live, &freed, pick, kind)?,
            Op::Capture if !pool.capture_safe() => {}
            Op::Capture if capturing => {
                let g = streams[0].end_capture();
                prop_assert!(g.is_ok(), "the capture ends with a graph: {:?}", g.err());
                graphs.extend(g.ok());
                capturing = false;
            }
            Op::Capture => {
                streams[0].begin_capture(CaptureMode::Global).unwrap();
                capturing = true;
            }
            Op::Verify if capturing || !backed => {}
            Op::Verify => verify(&device, streams, &live, &data)?,
        }
        let v = sim.capture_violations();
        prop_assert!(
            v.is_empty(),
            "after {:?}: calls that break a capture: {:?}",
            op,
            v
        );
        for &(p, bytes, _) in &live {
            prop_assert!(
                mapped(sim, p.0, p.0 + bytes as u64),
                "live block {:#x} (+{}) is no longer mapped whole",
                p.0,
                bytes
            );
        }
        for f in &freed {
            if !mapped(sim, f.start, f.end) {
                for s in streams {
                    prop_assert!(
                        sim.is_ordered_after(f.stream, f.pos, s.raw()),
                        "memory of a block freed on stream {:#x} at {} left its mapping before that work ran",
                        f.stream,
                        f.pos
                    );
                }
            }
        }
        let model: usize = live.iter().map(|&(_, b, _)| pool.accounted(b)).sum();
        prop_assert_eq!(pool.live(), model, "live bytes");
        prop_assert!(pool.reserved_bytes() >= model);
        let requested: Vec<usize> = live.iter().map(|&(_, b, _)| b).collect();
        pool.check_requested(&requested);
    }
    if capturing {
        let g = streams[0].end_capture();
        prop_assert!(g.is_ok(), "the capture ends with a graph: {:?}", g.err());
        graphs.extend(g.ok());
    }
    if backed {
        verify(&device, streams, &live, &data)?;
    }
    for (p, bytes, owner) in live.drain(..) {
        pool.deallocate(p, bytes, 256, &streams[owner]).unwrap();
    }
    prop_assert_eq!(pool.live(), 0);
    pool.check_requested(&[]);
    drop(graphs);
    pool.release().unwrap();
    // What a capture freed stays parked for its graph until the pool goes
    // (`stream_order::parked`), unless the pool is the graphs' own; the
    // callers check that it then goes back.
    if graphs_own.is_empty() || pool.graph_private() {
        prop_assert_eq!(
            pool.reserved_bytes(),
            pool.kept(),
            "every chunk is free, so every chunk goes back"
        );
    }
    drop(pool);
    for (s, h) in streams.iter().zip(held) {
        if h {
            sim.release(s.raw());
        }
    }
    sim.complete_all();
    drop(sources);
    Ok(())
}

/// [`Op::Verify`]: reads the samples of every live block written (on its
/// stream, then waits) and compares them with what was written.
fn verify(
    device: &Device,
    streams: &[Stream],
    live: &[(DevicePtr, usize, usize)],
    data: &std::collections::HashMap<u64, LiveData>,
) -> Result<(), TestCaseError> {
    let mut reads = Vec::new();
    for &(p, bytes, owner) in live {
        let Some(seed) = data.get(&p.0).and_then(|d| d.seed) else {
            continue;
        };
        let (at, len) = samples(bytes);
        for off in at {
            let mut buf = vec![0u8; len];
            // SAFETY: a live block of `bytes` bytes; `buf` is read only after
            // the stream has been waited for below.
            unsafe {
                device.driver().memcpy_dtoh_async(
                    buf.as_mut_ptr(),
                    DevicePtr(p.0 + off as u64),
                    len,
                    streams[owner].raw(),
                )
            }
            .unwrap();
            reads.push((p, off, seed, buf));
        }
    }
    for s in streams {
        s.synchronize().unwrap();
    }
    for (p, off, seed, got) in reads {
        prop_assert!(
            got == expected(seed, off, got.len()),
            "the block at {:#x} lost what was written at +{}",
            p.0,
            off
        );
    }
    Ok(())
}

/// One [`Op::BadFree`]: a double free, an interior or foreign pointer must
/// be refused; a size of another class is refused or, where the pool does
/// not compare sizes that way, a valid free (the block is then gone). A
/// refused free changes nothing.
fn bad_free<P: Modeled>(
    pool: &P,
    streams: &[Stream],
    live: &mut Vec<(DevicePtr, usize, usize)>,
    freed: &[Freed],
    pick: usize,
    kind: u8,
) -> Result<(), TestCaseError> {
    let before = pool.live();
    let overlaps_live =
        |a: u64, b: u64| live.iter().any(|&(q, n, _)| a < q.0 + n as u64 && q.0 < b);
    match kind {
        0 | 1 if !live.is_empty() => {
            let i = pick % live.len();
            let (p, bytes, owner) = live[i];
            let s = &streams[owner];
            if kind == 0 {
                let other = if bytes > 4096 {
                    bytes / 8
                } else {
                    bytes + (1 << 20)
                };
                if pool.deallocate(p, other, 256, s).is_ok() {
                    live.swap_remove(i);
                    return Ok(());
                }
            } else if bytes > 512 {
                let inside = DevicePtr(p.0 + 256);
                prop_assert!(
                    pool.deallocate(inside, 256, 256, s).is_err(),
                    "interior free accepted"
                );
            }
        }
        2 => {
            let Some(f) = freed
                .iter()
                .cycle()
                .skip(pick % freed.len().max(1))
                .take(freed.len())
                .find(|f| !overlaps_live(f.start, f.end))
            else {
                return Ok(());
            };
            let r = pool.deallocate(
                DevicePtr(f.start),
                (f.end - f.start) as usize,
                256,
                &streams[0],
            );
            prop_assert!(r.is_err(), "double free of {:#x} accepted", f.start);
        }
        3 => {
            let r = pool.deallocate(DevicePtr(0x10), 4096, 256, &streams[pick % streams.len()]);
            prop_assert!(r.is_err(), "foreign pointer accepted");
        }
        _ => {}
    }
    prop_assert_eq!(pool.live(), before, "a refused free changed the live bytes");
    Ok(())
}

pub fn model_setup() -> (Device, Arc<SimDriver>, Vec<Stream>, usize) {
    let (device, sim) = sim(1 << 30);
    setup_on(device, sim)
}

/// [`model_setup`] on a backed device: the model checks blocks' data too.
pub fn model_setup_backed() -> (Device, Arc<SimDriver>, Vec<Stream>, usize) {
    let (device, sim) = Device::sim_with_driver(SimConfig::backed(1 << 30));
    setup_on(device, sim)
}

fn setup_on(device: Device, sim: Arc<SimDriver>) -> (Device, Arc<SimDriver>, Vec<Stream>, usize) {
    let streams: Vec<Stream> = (0..3).map(|_| device.create_stream().unwrap()).collect();
    let base = sim.device_bytes(0);
    (device, sim, streams, base)
}

/// How many pools [`run_kind`] knows.
pub const KINDS: u8 = 10;

/// The largest request of pool `kind`, as a power of two: the fixed-size
/// pool serves blocks of 64 KiB and nothing larger.
pub fn max_log(kind: u8) -> u32 {
    if kind == 4 {
        15
    } else {
        25
    }
}

/// Runs `ops` through the model on pool `kind` (0 to [`KINDS`] - 1), on a
/// fresh simulated device (backed when asked), and checks that every byte
/// goes back to the driver when the pool goes: `PoolResource` grown in place
/// or in regions, `VirtualPool` and its NCCL-ready mode, `FixedSizeResource`,
/// `BinningResource`, `CachingPool`, `SegmentPool`, `ArenaResource`, and the
/// statistics, tracking and limiting adaptors over a `PoolResource`.
pub fn run_kind(kind: u8, ops: &[Op], backed: bool) -> Result<(), TestCaseError> {
    let (device, sim, streams, base) = if backed {
        model_setup_backed()
    } else {
        model_setup()
    };
    let up = || DeviceResource::new(device.clone());
    let (s, st) = (&*sim, &streams[..]);
    match kind {
        0 => run_model(PoolResource::with_defaults(up()).unwrap(), s, st, ops),
        1 => {
            let mut c = PoolConfig::default();
            c.expandable = false;
            run_model(PoolResource::new(up(), c).unwrap(), s, st, ops)
        }
        2 => run_model(
            VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap(),
            s,
            st,
            ops,
        ),
        3 => {
            let c = VirtualPoolConfig::nccl_ready(Vec::new());
            run_model(VirtualPool::new(device.clone(), c).unwrap(), s, st, ops)
        }
        4 => {
            let mut c = FixedSizeConfig::with_block_size(64 << 10);
            c.blocks_per_chunk = Some(16);
            run_model(FixedSizeResource::new(up(), c).unwrap(), s, st, ops)
        }
        5 => run_model(
            BinningResource::new(up(), BinningConfig::default()).unwrap(),
            s,
            st,
            ops,
        ),
        6 => run_model(
            CachingPool::new(up(), CachingPoolConfig::default()).unwrap(),
            s,
            st,
            ops,
        ),
        7 => run_model(SegmentPool::new(up()).unwrap(), s, st, ops),
        8 => run_model(
            ArenaResource::new(up(), ArenaConfig::with_size(256 << 20)).unwrap(),
            s,
            st,
            ops,
        ),
        _ => {
            let pool = PoolResource::with_defaults(up()).unwrap();
            let stack =
                StatisticsAdaptor::new(TrackingAdaptor::new(LimitingAdaptor::new(pool, 1 << 40)));
            run_model(stack, s, st, ops)
        }
    }
    .map_err(|e| TestCaseError::fail(format!("pool {kind}: {e}")))?;
    sim.complete_all();
    prop_assert_eq!(
        sim.device_bytes(0),
        base,
        "pool {}: every byte back to the driver",
        kind
    );
    Ok(())
}
