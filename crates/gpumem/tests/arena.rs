//! The arena allocator: the shared resource suite, random operation sequences
//! against a model with the simulator's stream-ordering oracle, out-of-memory
//! recovery, threads, dropped streams and invalid frees.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::suite;
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::pool::{ArenaConfig, ArenaResource, Pool};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, DevicePtr, Error, FreeError, Stream};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

/// Work on `stream` that uses its memory (an event record: the simulator
/// counts it as an operation, and it stays pending while the stream is held).
fn enqueue_work(stream: &Stream) {
    let ev = gpumem::Event::new(stream.device()).unwrap();
    ev.record(stream).unwrap();
}

/// An arena of `size` bytes, configured further by `edit`.
fn arena_config(size: usize, edit: impl FnOnce(&mut ArenaConfig)) -> ArenaConfig {
    let mut config = ArenaConfig::with_size(size);
    edit(&mut config);
    config
}

fn arena(device: &Device, size: usize) -> ArenaResource<DeviceResource> {
    ArenaResource::new(
        DeviceResource::new(device.clone()),
        ArenaConfig::with_size(size),
    )
    .expect("arena")
}

#[test]
fn arena_passes_the_suite() {
    let (device, _) = common::device(false);
    suite::run_all(Arc::new(arena(&device, 256 * MIB)));
}

#[test]
fn default_arena_takes_half_the_free_memory_and_passes_the_suite() {
    let (device, sim) = common::device(false);
    let Some(_sim) = common::sim_only(sim, "default_arena") else {
        return;
    };
    let free = device.mem_info().unwrap().free;
    let mr = ArenaResource::with_defaults(DeviceResource::new(device.clone())).unwrap();
    assert_eq!(mr.reserved_bytes(), free / 2 / MIB * MIB);
    assert_eq!(mr.superblock_size(), MIB);
    suite::run_all(Arc::new(mr));
}

#[test]
fn small_superblocks_pass_the_suite() {
    let (device, _) = common::device(false);
    let cfg = arena_config(64 * MIB, |c| c.superblock_size = 64 << 10);
    let mr = ArenaResource::new(DeviceResource::new(device), cfg).unwrap();
    suite::run_all(Arc::new(mr));
}

#[test]
fn bad_configurations_are_errors() {
    let (device, _) = common::device(false);
    let up = || DeviceResource::new(device.clone());
    for cfg in [
        arena_config(64 * MIB, |c| c.superblock_size = 3 << 20),
        arena_config(64 * MIB, |c| c.superblock_size = 16 << 20),
        arena_config(64 * MIB, |c| c.large_threshold = Some(2 * MIB)),
        ArenaConfig::with_size(1000),
    ] {
        assert!(
            matches!(
                ArenaResource::new(up(), cfg.clone()),
                Err(Error::InvalidArgument(_))
            ),
            "{cfg:?}"
        );
    }
}

#[test]
fn all_upstream_memory_back_on_drop() {
    let (device, sim) = common::device(false);
    let Some(sim) = common::sim_only(sim, "upstream_back") else {
        return;
    };
    let before = sim.device_bytes(0);
    {
        let mr = arena(&device, 64 * MIB);
        assert_eq!(sim.device_bytes(0), before + 64 * MIB);
        let s = device.create_stream().unwrap();
        let a = mr.allocate(1000, 256, &s).unwrap();
        let b = mr.allocate(3 * MIB, 256, &s).unwrap();
        assert_eq!(mr.stats().live, 1024 + 3 * MIB, "granules and superblocks");
        mr.deallocate(a, 1000, 256, &s).unwrap();
        mr.deallocate(b, 3 * MIB, 256, &s).unwrap();
        assert_eq!(mr.stats().live, 0);
    }
    assert_eq!(sim.device_bytes(0), before);
}

#[test]
fn invalid_frees_are_detected_and_change_nothing() {
    let (device, _) = common::device(false);
    let mr = arena(&device, 64 * MIB);
    let s = device.create_stream().unwrap();
    let p = mr.allocate(1000, 256, &s).unwrap();
    let big = mr.allocate(2 * MIB, 256, &s).unwrap();
    let invalid = |r: gpumem::Result<()>| match r {
        Err(Error::InvalidFree { reason, .. }) => reason,
        other => panic!("expected InvalidFree, got {other:?}"),
    };
    assert!(matches!(
        invalid(mr.deallocate(p, 2000, 256, &s)),
        FreeError::SizeMismatch { .. }
    ));
    assert_eq!(
        invalid(mr.deallocate(DevicePtr(p.0 + 256), 256, 256, &s)),
        FreeError::Unknown
    );
    assert_eq!(
        invalid(mr.deallocate(DevicePtr(p.0 + 7), 256, 256, &s)),
        FreeError::Unknown
    );
    assert_eq!(
        invalid(mr.deallocate(DevicePtr(8), 256, 256, &s)),
        FreeError::Unknown
    );
    assert!(matches!(
        invalid(mr.deallocate(big, 5 * MIB, 256, &s)),
        FreeError::SizeMismatch { .. }
    ));
    // Within the same superblocks but not the same granules: refused too,
    // so adaptors that count granules (limiting, statistics) stay exact.
    for freed in [2 * MIB - 256, 2 * MIB + 1, MIB + 1] {
        assert_eq!(
            invalid(mr.deallocate(big, freed, 256, &s)),
            FreeError::SizeMismatch {
                allocated: 2 * MIB,
                freed
            }
        );
    }
    assert_eq!(
        invalid(mr.deallocate(DevicePtr(big.0 + MIB as u64), MIB, 256, &s)),
        FreeError::Unknown
    );
    assert!(matches!(
        mr.deallocate(p, 1000, 3, &s),
        Err(Error::BadAlignment { .. })
    ));
    mr.deallocate(p, 1000, 256, &s).unwrap();
    mr.deallocate(big, 2 * MIB, 256, &s).unwrap();
    assert!(matches!(
        invalid(mr.deallocate(p, 1000, 256, &s)),
        FreeError::DoubleFree | FreeError::Unknown
    ));
    assert_eq!(
        invalid(mr.deallocate(big, 2 * MIB, 256, &s)),
        FreeError::Unknown
    );
    assert_eq!(mr.stats().live, 0);
    // Still usable, and the same memory comes back on the same stream.
    let q = mr.allocate(1000, 256, &s).unwrap();
    assert_eq!(q, p);
    mr.deallocate(q, 1000, 256, &s).unwrap();
}

#[test]
fn injected_upstream_oom_fails_construction_cleanly() {
    let (device, sim) = common::device(false);
    let Some(sim) = common::sim_only(sim, "injected_upstream_oom") else {
        return;
    };
    let before = sim.device_bytes(0);
    sim.fail_nth_alloc(1);
    let err = ArenaResource::new(
        DeviceResource::new(device.clone()),
        ArenaConfig::with_size(64 * MIB),
    )
    .unwrap_err();
    assert_eq!(err.oom_info().unwrap().requested, 64 * MIB);
    assert_eq!(sim.device_bytes(0), before);
    let mr = arena(&device, 64 * MIB);
    let s = device.create_stream().unwrap();
    let p = mr.allocate(4096, 256, &s).unwrap();
    mr.deallocate(p, 4096, 256, &s).unwrap();
}

/// Fills a small arena from one stream, frees everything there (the memory
/// stays cached in that stream's arena), and asks for it from another: the
/// superblocks are returned to the global arena and the request retried.
/// With the first stream's work still pending, the second is made to wait.
#[test]
fn out_of_memory_returns_superblocks_and_retries_then_fails_with_detail() {
    let (device, sim) = common::device(false);
    let Some(sim) = common::sim_only(sim, "oom_retry") else {
        return;
    };
    let mr = ArenaResource::new(
        DeviceResource::new(device.clone()),
        arena_config(16 * MIB, |c| c.dump_log_on_oom = true),
    )
    .unwrap();
    let a = device.create_stream().unwrap();
    let b = device.create_stream().unwrap();
    sim.hold(a.raw());
    let mut blocks = Vec::new();
    for i in 0..(16 * 4) {
        let bytes = if i % 2 == 0 { 200 << 10 } else { 56 << 10 };
        blocks.push((mr.allocate(bytes, 256, &a).unwrap(), bytes));
    }
    let range = (
        blocks.iter().map(|b| b.0 .0).min().unwrap(),
        blocks.iter().map(|b| b.0 .0).max().unwrap(),
    );
    // The work on `a` that uses them, then the frees.
    enqueue_work(&a);
    for &(p, bytes) in &blocks {
        mr.deallocate(p, bytes, 256, &a).unwrap();
    }
    let pos = sim.stream_position(a.raw());
    assert_eq!(mr.stats().live, 0);
    // 12 MiB on `b` needs `a`'s superblocks.
    let big = mr.allocate(12 * MIB, 256, &b).unwrap();
    assert!(
        big.0 + (12 * MIB) as u64 > range.0 && big.0 <= range.1,
        "reused a's memory"
    );
    assert!(
        sim.is_ordered_after(a.raw(), pos, b.raw()),
        "b waits for a's frees"
    );
    // More than there is: a clean error with detail, and the arena stays usable.
    let err = mr.allocate(8 * MIB, 256, &b).unwrap_err();
    let info = err.oom_info().expect("out of memory");
    assert_eq!(info.requested, 8 * MIB);
    assert_eq!(info.reserved, Some(16 * MIB));
    assert_eq!(info.live, Some(12 * MIB));
    assert!(info.largest_free.unwrap() < 8 * MIB);
    assert!(mr.fragmentation_report().contains("reserved"));
    mr.deallocate(big, 12 * MIB, 256, &b).unwrap();
    let again = mr.allocate(16 * MIB, 256, &b).unwrap();
    mr.deallocate(again, 16 * MIB, 256, &b).unwrap();
    sim.release(a.raw());
}

#[test]
fn many_threads_each_with_its_own_stream() {
    let (device, sim) = common::device(false);
    let mr = Arc::new(arena(&device, 512 * MIB));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let mr = mr.clone();
            let device = device.clone();
            std::thread::spawn(move || {
                use rand::{Rng, SeedableRng};
                let s = device.create_stream().unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mut mine: Vec<(DevicePtr, usize)> = Vec::new();
                for _ in 0..5000 {
                    if mine.len() < 64 && (mine.is_empty() || rng.random_bool(0.5)) {
                        let bytes = 256usize << rng.random_range(0..14);
                        mine.push((mr.allocate(bytes, 256, &s).unwrap(), bytes));
                    } else {
                        let (p, b) = mine.swap_remove(rng.random_range(0..mine.len()));
                        mr.deallocate(p, b, 256, &s).unwrap();
                    }
                }
                for (p, b) in mine {
                    mr.deallocate(p, b, 256, &s).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = mr.stats();
    assert_eq!(st.live, 0);
    assert!(st.arenas >= 8);
    mr.trim(0).unwrap();
    if sim.is_some() {
        // Every stream is idle: everything is clean and free again.
        assert_eq!(mr.stats().largest_free, 512 * MIB);
    }
}

#[test]
fn legacy_stream_gets_one_arena_per_thread_and_frees_across_threads() {
    let (device, _) = common::device(false);
    let mr = Arc::new(arena(&device, 64 * MIB));
    let legacy = device.default_stream();
    let p = mr.allocate(4096, 256, &legacy).unwrap();
    let mr2 = mr.clone();
    let d2 = device.clone();
    let q = std::thread::spawn(move || {
        let l = d2.default_stream();
        let q = mr2.allocate(4096, 256, &l).unwrap();
        // Same stream, other thread's arena: freed at once.
        mr2.deallocate(p, 4096, 256, &l).unwrap();
        q
    })
    .join()
    .unwrap();
    assert_ne!(p, q);
    mr.deallocate(q, 4096, 256, &legacy).unwrap();
    assert_eq!(mr.stats().live, 0);
}

#[test]
fn a_dropped_user_stream_strands_nothing() {
    let (device, sim) = common::device(false);
    let Some(sim) = common::sim_only(sim, "dropped_stream") else {
        return;
    };
    let before = sim.device_bytes(0);
    let streams_before = sim.live_streams();
    {
        let mr = arena(&device, 16 * MIB);
        let s = device.create_stream().unwrap();
        let raw = s.raw();
        sim.hold(raw);
        let mut blocks = Vec::new();
        for _ in 0..30 {
            blocks.push(mr.allocate(300 << 10, 256, &s).unwrap());
        }
        blocks.push(mr.allocate(3 * MIB, 256, &s).unwrap());
        for (i, &p) in blocks.iter().enumerate() {
            let bytes = if i == 30 { 3 * MIB } else { 300 << 10 };
            enqueue_work(&s);
            mr.deallocate(p, bytes, 256, &s).unwrap();
        }
        let pos = sim.stream_position(raw);
        drop(s);
        assert_eq!(
            sim.live_streams(),
            streams_before + 1,
            "the arena keeps the stream alive"
        );
        let t = device.create_stream().unwrap();
        let all = mr.allocate(16 * MIB, 256, &t).unwrap();
        assert!(sim.is_ordered_after(raw, pos, t.raw()));
        mr.deallocate(all, 16 * MIB, 256, &t).unwrap();
        sim.release(raw);
        t.synchronize().unwrap();
        mr.trim(0).unwrap();
        assert_eq!(sim.live_streams(), streams_before + 1, "only t is left");
        drop(t);
        assert_eq!(mr.stats().live, 0);
    }
    assert_eq!(sim.live_streams(), streams_before);
    assert_eq!(sim.device_bytes(0), before);
}

#[test]
fn cross_stream_small_free_waits_for_the_freeing_stream() {
    let (device, sim) = common::device(false);
    let Some(sim) = common::sim_only(sim, "cross_stream_small") else {
        return;
    };
    let mr = arena(&device, 4 * MIB);
    let t = device.create_stream().unwrap();
    let s = device.create_stream().unwrap();
    let mut ps = Vec::new();
    // Fill the arena from t.
    while let Ok(p) = mr.allocate(64 << 10, 256, &t) {
        ps.push(p);
    }
    assert_eq!(ps.len(), 64);
    // s uses and frees one while held: t may not get it back yet without waiting.
    sim.hold(s.raw());
    enqueue_work(&s);
    mr.deallocate(ps[0], 64 << 10, 256, &s).unwrap();
    let pos = sim.stream_position(s.raw());
    match mr.allocate(64 << 10, 256, &t) {
        Ok(p) => {
            assert_eq!(p, ps[0]);
            assert!(sim.is_ordered_after(s.raw(), pos, t.raw()));
            ps[0] = p;
        }
        Err(e) => panic!("{e}"),
    }
    sim.release(s.raw());
    for p in ps {
        mr.deallocate(p, 64 << 10, 256, &t).unwrap();
    }
}

// ----- random operation sequences -----

#[derive(Debug, Clone)]
enum Op {
    Alloc {
        stream: usize,
        shift: u32,
        extra: u32,
    },
    Free {
        pick: usize,
        on: Option<usize>,
    },
    Hold(usize),
    Release(usize),
    Complete(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..3usize, 0u32..23, 0u32..1000).prop_map(|(stream, shift, extra)| Op::Alloc { stream, shift, extra }),
        4 => (any::<usize>(), prop::option::weighted(0.25, 0..3usize)).prop_map(|(pick, on)| Op::Free { pick, on }),
        1 => (0..3usize).prop_map(Op::Hold),
        1 => (0..3usize).prop_map(Op::Release),
        1 => (0..3usize).prop_map(Op::Complete),
    ]
}

struct Live {
    ptr: DevicePtr,
    bytes: usize,
    stream: usize,
}

/// The bytes the arena counts live for a request: whole granules below the
/// large threshold, whole superblocks at or above it.
fn counted(bytes: usize, cfg: &ArenaConfig) -> usize {
    let sb = cfg.superblock_size;
    if bytes < cfg.large_threshold.unwrap_or(sb / 2) {
        bytes.next_multiple_of(256)
    } else {
        bytes.next_multiple_of(sb)
    }
}

fn run_ops(sim: &Arc<SimDriver>, device: &Device, ops: &[Op], cfg: ArenaConfig) {
    let before = sim.device_bytes(0);
    {
        let counted = |bytes| counted(bytes, &cfg);
        let mr = ArenaResource::new(DeviceResource::new(device.clone()), cfg.clone()).unwrap();
        let streams: Vec<Stream> = (0..3).map(|_| device.create_stream().unwrap()).collect();
        let mut live: Vec<Live> = Vec::new();
        let mut ranges: BTreeMap<u64, u64> = BTreeMap::new();
        // (start, end, freeing stream, its position at the free)
        let mut freed: Vec<(u64, u64, usize, u64)> = Vec::new();
        let mut model_live = 0usize;
        for op in ops {
            match *op {
                Op::Alloc {
                    stream,
                    shift,
                    extra,
                } => {
                    let bytes = (1usize << shift) + (extra as usize * (1usize << shift) / 1000);
                    match mr.allocate(bytes, 256, &streams[stream]) {
                        Ok(p) => {
                            assert_eq!(p.0 % 256, 0, "alignment");
                            let (s, e) = (p.0, p.0 + bytes as u64);
                            if let Some((&ls, &le)) = ranges.range(..e).next_back() {
                                assert!(le <= s, "[{s:#x},{e:#x}) overlaps live [{ls:#x},{le:#x})");
                            }
                            ranges.insert(s, e);
                            for &(fs, fe, fstream, pos) in &freed {
                                if fs < e && s < fe {
                                    assert!(
                                        sim.is_ordered_after(streams[fstream].raw(), pos, streams[stream].raw()),
                                        "block freed on stream {fstream} at {pos} reused on {stream} unordered"
                                    );
                                }
                            }
                            live.push(Live {
                                ptr: p,
                                bytes,
                                stream,
                            });
                            model_live += counted(bytes);
                        }
                        Err(e) => {
                            let info = e.oom_info().unwrap_or_else(|| panic!("{e}"));
                            assert_eq!(info.requested, bytes);
                            assert_eq!(info.live, Some(model_live));
                        }
                    }
                }
                Op::Free { pick, on } => {
                    if live.is_empty() {
                        continue;
                    }
                    let l = live.swap_remove(pick % live.len());
                    let on = on.unwrap_or(l.stream);
                    if on != l.stream {
                        // Correct code orders the allocating stream's use before
                        // a free on another stream.
                        streams[on].wait_for(&streams[l.stream]).unwrap();
                    }
                    // The work that used it, on the freeing stream.
                    enqueue_work(&streams[on]);
                    mr.deallocate(l.ptr, l.bytes, 256, &streams[on]).unwrap();
                    ranges.remove(&l.ptr.0);
                    model_live -= counted(l.bytes);
                    freed.push((
                        l.ptr.0,
                        l.ptr.0 + l.bytes as u64,
                        on,
                        sim.stream_position(streams[on].raw()),
                    ));
                }
                Op::Hold(s) => sim.hold(streams[s].raw()),
                Op::Release(s) => sim.release(streams[s].raw()),
                Op::Complete(s) => sim.complete(streams[s].raw()),
            }
            let st = mr.stats();
            assert_eq!(st.live, model_live);
            assert!(st.largest_free <= st.reserved - model_live.min(st.reserved));
        }
        for l in live.drain(..) {
            mr.deallocate(l.ptr, l.bytes, 256, &streams[l.stream])
                .unwrap();
        }
        assert_eq!(mr.stats().live, 0);
        sim.complete_all();
        mr.trim(0).unwrap();
        assert_eq!(
            mr.stats().largest_free,
            mr.reserved_bytes(),
            "all clean after the streams finish"
        );
    }
    assert_eq!(sim.device_bytes(0), before, "region back to the upstream");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(48)
    ))]

    #[test]
    fn random_operations_keep_the_invariants(ops in prop::collection::vec(op(), 1..160)) {
        let (device, sim) = Device::sim_with_driver(SimConfig::default());
        run_ops(&sim, &device, &ops, arena_config(24 * MIB, |c| c.cache_limit = Some(4 * MIB)));
    }

    #[test]
    fn random_operations_with_small_superblocks(ops in prop::collection::vec(op(), 1..120)) {
        let (device, sim) = Device::sim_with_driver(SimConfig::backed(64 * MIB));
        let cfg = arena_config(16 * MIB, |c| { c.superblock_size = 256 << 10; c.large_threshold = Some(64 << 10); });
        run_ops(&sim, &device, &ops, cfg);
    }
}
