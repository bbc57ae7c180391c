//! Random operation sequences against any pool, checked against a simple
//! model and the simulator's ordering oracle (shared by the pool tests).

use std::sync::Arc;

use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::Driver;
use gpumem::pool::{
    BinningResource, CachingPool, FixedSizeResource, Pool, PoolResource, SegmentPool, VirtualPool,
};
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
}

pub fn op(max_log: u32) -> impl Strategy<Value = Op> {
    op_between(0, max_log)
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
        assert_eq!(s.free + in_use, s.reserved, "{s:?}");
        self.live_bytes()
    }
    fn process(&self) {
        self.process_deferred().unwrap();
    }
}

/// A SegmentPool counts what was asked for (a block may keep a remainder
/// it did not split off); its segments tile exactly into blocks.
impl<U: MemoryResource> Modeled for SegmentPool<U> {
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

/// Runs `ops` against `pool`, checking overlap, alignment, the stats model
/// and the ordering oracle; then frees everything and checks that the pool
/// gives all memory back. After every operation each live block must be
/// mapped whole, and a freed block whose memory left its mapping (a trim,
/// or a pool that moves memory under free blocks) must have had its
/// stream's work run first: that memory may now serve anyone.
pub fn run_model<P: Modeled>(
    pool: P,
    sim: &SimDriver,
    streams: &[Stream],
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let mut live: Vec<(DevicePtr, usize, usize)> = Vec::new();
    let mut freed: Vec<Freed> = Vec::new();
    let mut held = [false; 3];
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
                live.push((p, bytes, stream));
            }
            Op::Free { pick, stream } => {
                if live.is_empty() {
                    continue;
                }
                let (p, bytes, owner) = live.swap_remove(pick % live.len());
                let s = &streams[stream];
                if owner != stream {
                    // Correct code orders the free after the block's last use.
                    s.wait_for(&streams[owner]).unwrap();
                }
                pool.deallocate(p, bytes, 256, s).unwrap();
                freed.push(Freed {
                    start: p.0,
                    end: p.0 + bytes as u64,
                    stream: s.raw(),
                    pos: sim.stream_position(s.raw()),
                });
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
            Op::Trim => {
                pool.trim(0).unwrap();
                pool.check();
            }
            Op::BadFree { pick, kind } => bad_free(&pool, streams, &mut live, &freed, pick, kind)?,
        }
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
    }
    for (p, bytes, owner) in live.drain(..) {
        pool.deallocate(p, bytes, 256, &streams[owner]).unwrap();
    }
    prop_assert_eq!(pool.live(), 0);
    pool.release().unwrap();
    prop_assert_eq!(
        pool.reserved_bytes(),
        0,
        "every chunk is free, so every chunk goes back"
    );
    drop(pool);
    for (s, h) in streams.iter().zip(held) {
        if h {
            sim.release(s.raw());
        }
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
    let streams: Vec<Stream> = (0..3).map(|_| device.create_stream().unwrap()).collect();
    let base = sim.device_bytes(0);
    (device, sim, streams, base)
}
