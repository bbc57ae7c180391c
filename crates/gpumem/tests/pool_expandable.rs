//! PoolResource with expandable heaps (`PoolConfig::expandable`): the
//! shared resource suite and the model over heaps that grow one range in
//! place; blocks across what was the range's end; trims that give back its
//! free end; limits, failures and upstreams that cannot grow; the
//! statistics that count growth; threads. And `DeviceResource`'s growable
//! allocations themselves. (What recycling does while a graph capture is
//! under way is tested with the captures, in `capture_pools.rs`: a capture
//! changes what every pool of the process may do.)

mod common;

use std::sync::Arc;

use common::expandable::{expandable, hole_in_the_middle, recycling};
use common::model::{model_setup, op, op_between, run_model, sim};
use common::suite;
use common::threads::OnThreads;
use gpumem::adaptor::{LimitingAdaptor, StatisticsAdaptor, TrackingAdaptor};
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::DevicePtr;
use gpumem::pool::{Pool, PoolConfig, PoolResource, Spread};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, DeviceBuffer, Error, FreeError};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

/// A simulated device of `capacity` bytes with VMM granules of 64 KiB, its
/// three streams and its memory in use before the test.
fn small_pieces(capacity: usize) -> (Device, Arc<SimDriver>, Vec<gpumem::Stream>, usize) {
    let mut config = SimConfig::default();
    config.capacity = capacity;
    config.granularity = 64 << 10;
    let (device, sim) = Device::sim_with_driver(config);
    let streams = (0..3).map(|_| device.create_stream().unwrap()).collect();
    let base = sim.device_bytes(0);
    (device, sim, streams, base)
}

/// Recycling on [`small_pieces`]: growths of 64 KiB granules make pieces
/// of 2 MiB, so requests of a few MiB leave whole pieces free and growths
/// move them often.
fn small_piece_recycling() -> PoolConfig {
    let mut config = recycling();
    config.growth.granularity = 64 << 10;
    config.growth.small_region = 2 * MIB;
    config.growth.medium_region = 2 * MIB;
    config
}

fn pool_on<U: MemoryResource>(upstream: U, config: PoolConfig) -> PoolResource<U> {
    PoolResource::new(upstream, config).unwrap()
}

/// An expandable pool on a simulated device of 8 GiB, a stream, and the
/// device's memory in use before the pool.
fn expandable_on_sim() -> (
    PoolResource<DeviceResource>,
    Arc<SimDriver>,
    gpumem::Stream,
    usize,
) {
    let (device, sim) = sim(8 << 30);
    let base = sim.device_bytes(0);
    let pool = pool_on(DeviceResource::new(device.clone()), expandable());
    (pool, sim, device.create_stream().unwrap(), base)
}

#[test]
fn expandable_pool_passes_the_suite() {
    let (device, _) = common::device(false);
    suite::run_all(Arc::new(pool_on(DeviceResource::new(device), expandable())));
    let (device, _) = common::device(false);
    let mut config = expandable();
    config.max_reserved = Some(1 << 30);
    suite::run_all(Arc::new(pool_on(DeviceResource::new(device), config)));
}

#[test]
fn a_block_spans_what_was_the_end_of_the_range() {
    let (device, _) = common::device(false);
    let pool = pool_on(DeviceResource::new(device.clone()), expandable());
    let s = device.create_stream().unwrap();
    // A medium request takes a 20 MiB range; the next one does not fit in
    // the 5 MiB left and grows the range by 20 MiB, starting in those 5.
    let a = pool.allocate(15 * MIB, 256, &s).unwrap();
    assert_eq!(pool.reserved_bytes(), 20 * MIB);
    let b = pool.allocate(15 * MIB, 256, &s).unwrap();
    assert_eq!(b.0, a.0 + (15 * MIB) as u64, "b starts where a ends");
    let st = pool.stats();
    assert_eq!((st.reserved, st.regions), (40 * MIB, 1), "{st:?}");
    // Without expandable heaps: two regions, b in the second.
    let plain = pool_on(DeviceResource::new(device.clone()), PoolConfig::default());
    let c = plain.allocate(15 * MIB, 256, &s).unwrap();
    let d = plain.allocate(15 * MIB, 256, &s).unwrap();
    assert_eq!(plain.stats().regions, 2);
    assert_ne!(d.0, c.0 + (15 * MIB) as u64);
    // The data of a block across the old end is whole.
    let (device, _) = common::device(true);
    let pool = pool_on(DeviceResource::new(device.clone()), expandable());
    let s = device.create_stream().unwrap();
    let first = DeviceBuffer::<u8, _>::new(15 * MIB, &pool, &s).unwrap();
    let data = common::random_bytes(15 * MIB, 5);
    let across = DeviceBuffer::from_slice(&data, &pool, &s).unwrap();
    assert_eq!(pool.stats().regions, 1);
    assert_eq!(across.to_vec().unwrap(), data);
    drop((first, across));
}

#[test]
fn a_busy_streams_free_end_joins_the_growth() {
    // The block at the end was freed on a stream whose work still runs: it
    // is that stream's to reuse, so its next, larger request grows the
    // range by what it lacks and takes the two as one block.
    let (device, sim) = sim(8 << 30);
    let pool = pool_on(DeviceResource::new(device.clone()), expandable());
    let s = device.create_stream().unwrap();
    let a = pool.allocate(10 * MIB, 256, &s).unwrap();
    let b = pool.allocate(10 * MIB, 256, &s).unwrap();
    sim.hold(s.raw());
    common::model::enqueue_work(&s);
    pool.deallocate(b, 10 * MIB, 256, &s).unwrap();
    let c = pool.allocate(25 * MIB, 256, &s).unwrap();
    assert_eq!(c, b, "the grown block starts at the freed one");
    assert_eq!(pool.reserved_bytes(), 40 * MIB);
    sim.release(s.raw());
    pool.deallocate(c, 25 * MIB, 256, &s).unwrap();
    pool.deallocate(a, 10 * MIB, 256, &s).unwrap();
}

/// One pass of a job that repeats: the same requests in the same order,
/// every block freed at its end. Returns the blocks' addresses.
fn one_pass<U: MemoryResource>(pool: &PoolResource<U>, s: &gpumem::Stream) -> Vec<DevicePtr> {
    let a = pool.allocate(10 * MIB, 256, s).unwrap();
    let b = pool.allocate(6 * MIB, 256, s).unwrap();
    pool.deallocate(a, 10 * MIB, 256, s).unwrap();
    let c = pool.allocate(4 * MIB, 256, s).unwrap();
    let d = pool.allocate(10 * MIB, 256, s).unwrap();
    let e = pool.allocate(30 * MIB, 256, s).unwrap();
    for (p, size) in [(b, 6), (c, 4), (d, 10), (e, 30)] {
        pool.deallocate(p, size * MIB, 256, s).unwrap();
    }
    vec![a, b, c, d, e]
}

#[test]
fn a_repeated_pass_lands_where_the_first_did_without_growing() {
    // In the first pass, c (4 MiB) comes when the range's free end is 4
    // MiB and a's 10 MiB hole is free. Taking the end would leave d no
    // hole and make e's growth start later; the second pass, finding the
    // whole range free, would then place c in the hole and grow again. The
    // free end is split only when no hole fits, as while the range grew,
    // so both passes place every block alike.
    let (device, _) = common::device(false);
    let pool = pool_on(DeviceResource::new(device.clone()), expandable());
    let s = device.create_stream().unwrap();
    let first = one_pass(&pool, &s);
    let reserved = pool.reserved_bytes();
    assert_eq!(first[2], first[0], "c took a's hole, not the range's end");
    for pass in 2..=4 {
        assert_eq!(one_pass(&pool, &s), first, "pass {pass}");
        assert_eq!(
            pool.reserved_bytes(),
            reserved,
            "pass {pass} grew the range"
        );
    }
    assert_eq!(pool.stats().regions, 1);
}

#[test]
fn trim_gives_back_the_free_end_and_release_everything() {
    let (pool, sim, s, base) = expandable_on_sim();
    let blocks: Vec<_> = (0..4)
        .map(|_| pool.allocate(15 * MIB, 256, &s).unwrap())
        .collect();
    assert_eq!(pool.reserved_bytes(), 60 * MIB);
    assert_eq!(sim.device_bytes(0), base + 60 * MIB);
    for &p in &blocks[1..] {
        pool.deallocate(p, 15 * MIB, 256, &s).unwrap();
    }
    // Everything past the first block is free: the range shrinks to the
    // granule holding its end (growths are whole pieces: the first 20 MiB
    // stay).
    let released = pool.trim(0).unwrap();
    assert_eq!(released, 40 * MIB);
    assert_eq!(pool.reserved_bytes(), 20 * MIB);
    assert_eq!(sim.device_bytes(0), base + 20 * MIB);
    // It grows again where it left off.
    let again = pool.allocate(15 * MIB, 256, &s).unwrap();
    assert_eq!(again.0, blocks[1].0);
    assert_eq!(pool.stats().regions, 1);
    pool.deallocate(again, 15 * MIB, 256, &s).unwrap();
    // A trim to a floor stops there.
    assert_eq!(pool.trim(100 * MIB).unwrap(), 0);
    pool.deallocate(blocks[0], 15 * MIB, 256, &s).unwrap();
    assert_eq!(pool.release().unwrap(), 40 * MIB);
    assert_eq!(pool.reserved_bytes(), 0);
    assert_eq!(sim.device_bytes(0), base);
    assert_eq!(
        sim.reserved_va_bytes(),
        0,
        "the range's addresses went back"
    );
    // Used again after a release: a new range.
    let p = pool.allocate(MIB, 256, &s).unwrap();
    pool.deallocate(p, MIB, 256, &s).unwrap();
    drop(pool);
    assert_eq!(sim.device_bytes(0), base);
}

#[test]
fn trims_give_back_the_free_middle_of_a_range() {
    // y, still live, holds the range's last piece: the first piece, all
    // free below it, goes back on a trim, and the range grows on above y.
    let (pool, sim, s, base) = expandable_on_sim();
    let y = hole_in_the_middle(&pool, &s);
    assert_eq!(pool.trim(0).unwrap(), 128 * MIB);
    assert_eq!(pool.reserved_bytes(), 20 * MIB);
    assert_eq!(sim.device_bytes(0), base + 20 * MIB);
    pool.check_invariants().unwrap();
    let z = pool.allocate(64 * MIB, 256, &s).unwrap();
    assert_eq!(z.0, y.0 + (4 * MIB) as u64, "z follows y in the range");
    let st = pool.stats();
    assert_eq!((st.reserved, st.regions), (68 * MIB, 1), "{st:?}");
    pool.deallocate(z, 64 * MIB, 256, &s).unwrap();
    pool.deallocate(y, 4 * MIB, 256, &s).unwrap();
    assert_eq!(pool.release().unwrap(), 68 * MIB);
    assert_eq!(sim.device_bytes(0), base);
    assert_eq!(
        sim.reserved_va_bytes(),
        0,
        "the reservation's addresses went back"
    );
}

#[test]
fn the_adaptors_below_count_a_cut_out_middle_as_given_back() {
    // As the C ABI builds it: statistics over a limit over the device.
    let (device, _) = common::device(false);
    let s = device.create_stream().unwrap();
    let limit = LimitingAdaptor::new(DeviceResource::new(device.clone()), 1 << 30);
    let stats = StatisticsAdaptor::new(&limit);
    let pool = pool_on(&stats, expandable());
    let y = hole_in_the_middle(&pool, &s);
    assert_eq!(pool.trim(0).unwrap(), 128 * MIB);
    let st = stats.stats();
    assert_eq!(st.allocated_bytes.current as usize, 20 * MIB);
    assert_eq!(st.allocation.current, 1, "the range's part above the cut");
    assert_eq!(limit.allocated_bytes(), 20 * MIB);
    pool.deallocate(y, 4 * MIB, 256, &s).unwrap();
    pool.release().unwrap();
    let st = stats.stats();
    assert_eq!((st.allocation.current, st.allocated_bytes.current), (0, 0));
    assert_eq!(limit.allocated_bytes(), 0);
}

#[test]
fn a_trim_keeps_the_middle_a_busy_stream_freed_and_a_release_waits_for_it() {
    let (pool, sim, s, base) = expandable_on_sim();
    let x = pool.allocate(128 * MIB, 256, &s).unwrap();
    let y = pool.allocate(4 * MIB, 256, &s).unwrap();
    // Work queued on s still uses x when it is freed: a trim, which does
    // not wait, leaves its memory mapped.
    sim.hold(s.raw());
    common::model::enqueue_work(&s);
    pool.deallocate(x, 128 * MIB, 256, &s).unwrap();
    assert_eq!(pool.trim(0).unwrap(), 0);
    assert_eq!(sim.device_bytes(0), base + 148 * MIB);
    // A release waits for the stream, then the piece goes.
    sim.release(s.raw());
    assert_eq!(pool.release().unwrap(), 128 * MIB);
    assert_eq!(pool.reserved_bytes(), 20 * MIB);
    pool.deallocate(y, 4 * MIB, 256, &s).unwrap();
    assert_eq!(pool.release().unwrap(), 20 * MIB);
    assert_eq!(sim.device_bytes(0), base);
}

#[test]
fn a_trim_cuts_runs_of_pieces_around_live_blocks_and_keeps_their_data() {
    // Growths of one granule (64 KiB here): a range of many pieces. Live
    // blocks spread over it keep their pieces and their bytes; every run of
    // free pieces between them goes back.
    let mut sim_config = SimConfig::backed(512 << 20);
    sim_config.granularity = 64 << 10;
    let (device, sim) = Device::sim_with_driver(sim_config);
    let base = sim.device_bytes(0);
    let mut config = expandable();
    config.growth.granularity = 64 << 10;
    config.growth.small_region = 2 * MIB;
    config.growth.medium_region = 2 * MIB;
    let pool = pool_on(DeviceResource::new(device.clone()), config);
    let s = &device.create_stream().unwrap();
    let mut kept = Vec::new();
    let mut freed = Vec::new();
    for i in 0..24 {
        if i % 5 == 0 {
            let data = common::random_bytes(3 * MIB, i);
            kept.push((DeviceBuffer::from_slice(&data, &pool, s).unwrap(), data));
        } else {
            freed.push(pool.allocate(3 * MIB, 256, s).unwrap());
        }
    }
    for p in freed {
        pool.deallocate(p, 3 * MIB, 256, s).unwrap();
    }
    let before = pool.reserved_bytes();
    let released = pool.trim(0).unwrap();
    assert!(released >= before / 2, "{released} of {before} went back");
    assert_eq!(sim.device_bytes(0), base + pool.reserved_bytes());
    pool.check_invariants().unwrap();
    for (k, (buf, data)) in kept.iter().enumerate() {
        assert!(buf.to_vec().unwrap() == *data, "block {k} kept its bytes");
    }
    // Requests after the trim are served, and every byte goes back in the end.
    let more: Vec<_> = (0..8)
        .map(|_| pool.allocate(3 * MIB, 256, s).unwrap())
        .collect();
    for p in more {
        pool.deallocate(p, 3 * MIB, 256, s).unwrap();
    }
    drop(kept);
    pool.release().unwrap();
    assert_eq!(sim.device_bytes(0), base);
    assert_eq!(sim.reserved_va_bytes(), 0);
}

#[test]
fn growth_honours_max_reserved_and_the_upstreams_limit() {
    let (device, sim) = sim(8 << 30);
    let s = device.create_stream().unwrap();
    let mut config = expandable();
    config.max_reserved = Some(50 * MIB);
    let pool = pool_on(DeviceResource::new(device.clone()), config);
    let a = pool.allocate(30 * MIB, 256, &s).unwrap();
    let err = pool.allocate(30 * MIB, 256, &s).unwrap_err();
    let info = err.oom_info().expect("out of memory");
    assert_eq!((info.requested, info.limit), (30 * MIB, Some(50 * MIB)));
    assert!(pool.reserved_bytes() <= 50 * MIB);
    let b = pool.allocate(15 * MIB, 256, &s).unwrap();
    pool.deallocate(a, 30 * MIB, 256, &s).unwrap();
    pool.deallocate(b, 15 * MIB, 256, &s).unwrap();
    drop(pool);
    // A limiting adaptor below: a growth past its limit fails there.
    let base = sim.device_bytes(0);
    let limited = LimitingAdaptor::new(DeviceResource::new(device.clone()), 40 * MIB);
    let pool = pool_on(&limited, expandable());
    let a = pool.allocate(30 * MIB, 256, &s).unwrap();
    assert_eq!(limited.allocated_bytes(), 30 * MIB);
    // 20 MiB more would pass 40.
    let err = pool.allocate(20 * MIB, 256, &s).unwrap_err();
    assert!(err.is_oom(), "{err}");
    assert_eq!(limited.allocated_bytes(), 30 * MIB);
    let b = pool.allocate(8 * MIB, 256, &s).unwrap();
    assert_eq!(b.0, a.0 + (30 * MIB) as u64);
    pool.deallocate(b, 8 * MIB, 256, &s).unwrap();
    pool.deallocate(a, 30 * MIB, 256, &s).unwrap();
    pool.release().unwrap();
    assert_eq!(limited.allocated_bytes(), 0);
    drop(pool);
    assert_eq!(sim.device_bytes(0), base);
}

#[test]
fn a_failed_growth_loses_nothing() {
    let (device, sim) = sim(8 << 30);
    let base = sim.device_bytes(0);
    let pool = pool_on(DeviceResource::new(device.clone()), expandable());
    let s = device.create_stream().unwrap();
    let a = pool.allocate(15 * MIB, 256, &s).unwrap();
    let state = || {
        (
            pool.reserved_bytes(),
            sim.device_bytes(0),
            sim.mapped_bytes(),
        )
    };
    let before = state();
    // Out of memory in the growth (cuMemCreate): the reclaim gives nothing
    // back (the range is in use) and the retry succeeds.
    sim.fail_nth_alloc(1);
    let b = pool.allocate(15 * MIB, 256, &s).unwrap();
    pool.deallocate(b, 15 * MIB, 256, &s).unwrap();
    pool.trim(0).unwrap();
    assert_eq!(state(), before);
    // Out of memory every time: the error, nothing lost.
    for n in 1..=32 {
        sim.fail_nth_alloc(n);
    }
    assert!(pool.allocate(15 * MIB, 256, &s).unwrap_err().is_oom());
    sim.clear_faults();
    assert_eq!(state(), before);
    // Any other failure of the driver (the mapping, the access): that
    // error, and the pieces made so far undone.
    for call in ["cuMemMap", "cuMemSetAccess"] {
        sim.fail_call(call, 1, 999);
        let err = pool.allocate(15 * MIB, 256, &s).unwrap_err();
        assert!(matches!(err, Error::Driver { .. }), "{call}: {err:?}");
        assert_eq!(state(), before, "after a failed {call}");
        let b = pool.allocate(15 * MIB, 256, &s).unwrap();
        assert_eq!(
            b.0,
            a.0 + (15 * MIB) as u64,
            "the range still grows in place"
        );
        pool.deallocate(b, 15 * MIB, 256, &s).unwrap();
        pool.trim(0).unwrap();
    }
    pool.deallocate(a, 15 * MIB, 256, &s).unwrap();
    drop(pool);
    assert_eq!(sim.device_bytes(0), base);
    assert_eq!(sim.mapped_bytes(), 0);
}

#[test]
fn a_growth_recycles_free_pieces_instead_of_creating_memory() {
    let (device, sim) = sim(8 << 30);
    let base = sim.device_bytes(0);
    // Without recycling (the default): the range grows by all it lacks.
    let plain = pool_on(DeviceResource::new(device.clone()), expandable());
    let s = device.create_stream().unwrap();
    let y = hole_in_the_middle(&plain, &s);
    let z = plain.allocate(200 * MIB, 256, &s).unwrap();
    assert_eq!(plain.reserved_bytes(), (148 + 184) * MIB);
    drop((plain, y, z));
    let pool = pool_on(DeviceResource::new(device.clone()), recycling());
    let y = hole_in_the_middle(&pool, &s);
    let creates = sim.call_count("cuMemCreate");
    // 200 MiB fit nowhere: the two free pieces of x (64 MiB each) move to
    // the end, and the range creates only the 56 MiB still lacking.
    let z = pool.allocate(200 * MIB, 256, &s).unwrap();
    assert_eq!(pool.reserved_bytes(), (148 + 56) * MIB);
    assert_eq!(sim.device_bytes(0), base + (148 + 56) * MIB);
    assert_eq!(
        sim.mapped_bytes(),
        (148 + 56) * MIB,
        "x's addresses are unmapped"
    );
    assert_eq!(
        sim.call_count("cuMemCreate"),
        creates + 1,
        "one piece of 56 MiB"
    );
    assert_eq!(z.0, y.0 + (4 * MIB) as u64, "z follows y");
    let st = pool.stats();
    assert_eq!((st.regions, st.reserved), (1, (148 + 56) * MIB), "{st:?}");
    pool.check_invariants().unwrap();
    pool.deallocate(z, 200 * MIB, 256, &s).unwrap();
    pool.deallocate(y, 4 * MIB, 256, &s).unwrap();
    assert_eq!(pool.release().unwrap(), (148 + 56) * MIB);
    assert_eq!(sim.device_bytes(0), base);
    assert_eq!((sim.mapped_bytes(), sim.reserved_va_bytes()), (0, 0));
    drop(pool);
    assert_eq!(sim.device_bytes(0), base);
}

#[test]
fn recycling_works_up_to_max_reserved() {
    // At the limit, moving free pieces is the only way to grow: the range's
    // addresses must have room for them beyond `max_reserved`.
    let (device, _) = sim(8 << 30);
    let mut config = recycling();
    config.max_reserved = Some((148 + 56) * MIB);
    let pool = pool_on(DeviceResource::new(device.clone()), config);
    let s = device.create_stream().unwrap();
    let y = hole_in_the_middle(&pool, &s);
    let z = pool.allocate(200 * MIB, 256, &s).unwrap();
    assert_eq!(pool.reserved_bytes(), (148 + 56) * MIB, "x's pieces moved");
    assert!(pool.allocate(256, 256, &s).unwrap_err().is_oom(), "full");
    pool.check_invariants().unwrap();
    pool.deallocate(z, 200 * MIB, 256, &s).unwrap();
    pool.deallocate(y, 4 * MIB, 256, &s).unwrap();
}

#[test]
fn data_across_recycled_pieces_is_whole() {
    // On the real GPU too: the moved memory is mapped and accessible where
    // it lands, and a block across the kept, moved and new pieces holds
    // its data.
    let (device, _) = common::device(true);
    let pool = pool_on(DeviceResource::new(device.clone()), recycling());
    let s = device.create_stream().unwrap();
    let x = pool.allocate(128 * MIB, 256, &s).unwrap();
    let y_data = common::random_bytes(4 * MIB, 3);
    let y = DeviceBuffer::from_slice(&y_data, &pool, &s).unwrap();
    pool.deallocate(x, 128 * MIB, 256, &s).unwrap();
    let data = common::random_bytes(200 * MIB, 9);
    let z = DeviceBuffer::from_slice(&data, &pool, &s).unwrap();
    assert_eq!(pool.reserved_bytes(), (148 + 56) * MIB, "x's pieces moved");
    let same = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(p, q)| p != q);
    assert_eq!(same(&z.to_vec().unwrap(), &data), None, "z differs at");
    assert_eq!(same(&y.to_vec().unwrap(), &y_data), None, "y differs at");
    pool.check_invariants().unwrap();
    drop((y, z));
    assert_eq!(pool.release().unwrap(), (148 + 56) * MIB);
}

#[test]
fn a_piece_freed_on_a_busy_stream_moves_after_its_work() {
    let (device, sim) = sim(8 << 30);
    let pool = pool_on(DeviceResource::new(device.clone()), recycling());
    let s = device.create_stream().unwrap();
    let x = pool.allocate(128 * MIB, 256, &s).unwrap();
    let y = pool.allocate(4 * MIB, 256, &s).unwrap();
    // Work queued on s still uses x when it is freed.
    sim.hold(s.raw());
    common::model::enqueue_work(&s);
    pool.deallocate(x, 128 * MIB, 256, &s).unwrap();
    assert!(sim.pending_ops(s.raw()) > 0);
    let z = pool.allocate(200 * MIB, 256, &s).unwrap();
    assert_eq!(
        sim.pending_ops(s.raw()),
        0,
        "the stream was waited for first"
    );
    assert_eq!(pool.reserved_bytes(), (148 + 56) * MIB);
    pool.deallocate(z, 200 * MIB, 256, &s).unwrap();
    pool.deallocate(y, 4 * MIB, 256, &s).unwrap();
    pool.check_invariants().unwrap();
}

#[test]
fn a_failed_recycle_loses_nothing() {
    let (device, sim) = sim(8 << 30);
    let base = sim.device_bytes(0);
    let pool = pool_on(DeviceResource::new(device.clone()), recycling());
    let s = device.create_stream().unwrap();
    let y = hole_in_the_middle(&pool, &s);
    // The first map of a moved piece fails: that piece goes back to the
    // driver, and the growth creates what is lacking.
    sim.fail_call("cuMemMap", 1, 999);
    let z = pool.allocate(200 * MIB, 256, &s).unwrap();
    sim.clear_faults();
    pool.check_invariants().unwrap();
    assert_eq!(pool.reserved_bytes(), sim.device_bytes(0) - base);
    assert_eq!(sim.mapped_bytes(), sim.device_bytes(0) - base);
    assert!(pool.reserved_bytes() <= (148 + 184) * MIB);
    pool.deallocate(z, 200 * MIB, 256, &s).unwrap();
    pool.deallocate(y, 4 * MIB, 256, &s).unwrap();
    pool.release().unwrap();
    drop(pool);
    assert_eq!(sim.device_bytes(0), base);
    assert_eq!((sim.mapped_bytes(), sim.reserved_va_bytes()), (0, 0));
}

#[test]
fn an_upstream_that_cannot_grow_gets_regions() {
    // Without VMM on the device, or through an adaptor that does not pass
    // growth on, the expandable pool takes regions as the plain one does.
    let mut config = SimConfig::default();
    config.vmm = false;
    let (device, _) = Device::sim_with_driver(config);
    let s = device.create_stream().unwrap();
    let up = DeviceResource::new(device.clone());
    assert!(up.grow_in_place().is_none());
    let pool = pool_on(up, expandable());
    let a = pool.allocate(15 * MIB, 256, &s).unwrap();
    let b = pool.allocate(15 * MIB, 256, &s).unwrap();
    assert_eq!(pool.stats().regions, 2);
    pool.deallocate(a, 15 * MIB, 256, &s).unwrap();
    pool.deallocate(b, 15 * MIB, 256, &s).unwrap();
    let (device, _) = common::device(false);
    let tracked = TrackingAdaptor::new(DeviceResource::new(device.clone()));
    assert!(tracked.grow_in_place().is_none());
    let pool = pool_on(tracked, expandable());
    let a = pool.allocate(15 * MIB, 256, &s).unwrap();
    let b = pool.allocate(15 * MIB, 256, &s).unwrap();
    assert_eq!(pool.stats().regions, 2);
    pool.deallocate(a, 15 * MIB, 256, &s).unwrap();
    pool.deallocate(b, 15 * MIB, 256, &s).unwrap();
}

#[test]
fn statistics_below_the_pool_follow_the_range() {
    let (device, _) = common::device(false);
    let s = device.create_stream().unwrap();
    let stats = StatisticsAdaptor::new(LimitingAdaptor::new(
        DeviceResource::new(device.clone()),
        usize::MAX,
    ));
    let pool = pool_on(&stats, expandable());
    let blocks: Vec<_> = (0..3)
        .map(|_| pool.allocate(15 * MIB, 256, &s).unwrap())
        .collect();
    let st = stats.stats();
    // One allocation (the range) of the pool's whole reserve.
    assert_eq!(st.allocation.current, 1);
    assert_eq!(st.allocated_bytes.current as usize, pool.reserved_bytes());
    assert_eq!(st.allocated_bytes.current as usize, 60 * MIB);
    for &p in &blocks[1..] {
        pool.deallocate(p, 15 * MIB, 256, &s).unwrap();
    }
    pool.trim(0).unwrap();
    let st = stats.stats();
    assert_eq!(st.allocated_bytes.current as usize, 20 * MIB);
    assert_eq!(st.allocated_bytes.peak as usize, 60 * MIB);
    assert_eq!(st.allocated_bytes.freed as usize, 40 * MIB);
    pool.deallocate(blocks[0], 15 * MIB, 256, &s).unwrap();
    pool.release().unwrap();
    let st = stats.stats();
    assert_eq!((st.allocation.current, st.allocated_bytes.current), (0, 0));
    assert_eq!(st.allocation.total, 1);
}

#[test]
fn threads_growing_one_heap_lose_nothing() {
    // Four threads on shard 0 (no spreading): their growths of the same
    // range meet (one grows, the others take regions), and every block is
    // whole and given back.
    let (device, sim) = sim(8 << 30);
    let base = sim.device_bytes(0);
    let mut config = expandable();
    config.shards = 1;
    let pool = Arc::new(pool_on(DeviceResource::new(device.clone()), config));
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let (pool, device) = (pool.clone(), device.clone());
            std::thread::spawn(move || {
                let s = device.create_stream().unwrap();
                common::threads::churn(&*pool, &s, 400, |i| (1 + (i * 7 + t) % 23) * MIB / 2);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(pool.live_bytes(), 0);
    pool.release().unwrap();
    assert_eq!(pool.reserved_bytes(), 0);
    drop(pool);
    assert_eq!(sim.device_bytes(0), base);
}

#[test]
fn device_resource_grows_and_shrinks_in_place() {
    let (device, sim) = sim(8 << 30);
    let base = sim.device_bytes(0);
    let up = DeviceResource::new(device.clone());
    let g = up.grow_in_place().expect("the simulator has VMM");
    assert_eq!(g.growth_granularity(), 2 * MIB);
    let p = g.allocate_growable(3 * MIB, 64 * MIB).unwrap();
    assert_eq!(sim.device_bytes(0), base + 4 * MIB, "whole granules");
    assert_eq!(up.allocation_size(p), Some(3 * MIB));
    g.grow(p, 3 * MIB, 9 * MIB).unwrap();
    assert_eq!(up.allocation_size(p), Some(9 * MIB));
    assert_eq!(up.live_blocks()[0].size, 9 * MIB);
    assert_eq!(sim.device_bytes(0), base + 10 * MIB);
    // Past the capacity: out of memory, nothing changes.
    assert!(g.grow(p, 9 * MIB, 65 * MIB).unwrap_err().is_oom());
    // A wrong current size or a foreign pointer: refused.
    assert!(matches!(
        g.grow(p, 3 * MIB, 20 * MIB),
        Err(Error::InvalidArgument(_))
    ));
    let plain = up.allocate_sync(MIB, 256).unwrap();
    assert!(g.grow(plain, MIB, 4 * MIB).is_err());
    // Shrinking keeps whole pieces: the first piece (4 MiB) stays.
    assert_eq!(g.shrink(p, 9 * MIB, 2 * MIB).unwrap(), 4 * MIB);
    assert_eq!(sim.device_bytes(0), base + 5 * MIB);
    // Freed at its current size only.
    let err = up.deallocate_sync(p, 9 * MIB, 256).unwrap_err();
    assert!(matches!(
        err,
        Error::InvalidFree {
            reason: FreeError::SizeMismatch { .. },
            ..
        }
    ));
    up.deallocate_sync(p, 4 * MIB, 256).unwrap();
    up.deallocate_sync(plain, MIB, 256).unwrap();
    assert_eq!(sim.device_bytes(0), base);
    assert_eq!((sim.mapped_bytes(), sim.reserved_va_bytes()), (0, 0));
    assert!(g.allocate_growable(0, MIB).is_err());
}

#[test]
fn device_resource_splits_ranges_and_recycles_pieces() {
    let (device, sim) = sim(8 << 30);
    let base = sim.device_bytes(0);
    let up = DeviceResource::new(device.clone());
    let g = up.grow_in_place().unwrap();
    // Without pieces asked for, a growth is one piece.
    let whole = g.allocate_growable(100 * MIB, 1 << 30).unwrap();
    assert_eq!(g.pieces(whole, 100 * MIB).unwrap(), vec![(0, 100 * MIB)]);
    up.deallocate_sync(whole, 100 * MIB, 256).unwrap();
    // Pieces of at most 64 MiB, cut from each growth's start.
    let p = g
        .allocate_growable_in_pieces(100 * MIB, 1 << 30, 64 * MIB)
        .unwrap();
    assert_eq!(
        g.pieces(p, 100 * MIB).unwrap(),
        vec![(0, 64 * MIB), (64 * MIB, 36 * MIB)]
    );
    g.grow(p, 100 * MIB, 120 * MIB).unwrap();
    assert_eq!(
        g.pieces(p, 120 * MIB).unwrap().len(),
        3,
        "a growth is a piece of its own"
    );
    // Cuts fall between pieces only.
    for at in [0, 10 * MIB, 120 * MIB] {
        assert!(matches!(
            g.split(p, 120 * MIB, at),
            Err(Error::InvalidArgument(_))
        ));
    }
    let tail = g.split(p, 120 * MIB, 64 * MIB).unwrap();
    assert_eq!(tail.0, p.0 + (64 * MIB) as u64);
    assert_eq!(up.allocation_size(p), Some(64 * MIB));
    assert_eq!(up.allocation_size(tail), Some(56 * MIB));
    assert!(
        g.grow(p, 64 * MIB, 66 * MIB).unwrap_err().is_oom(),
        "the head cannot grow"
    );
    g.grow(tail, 56 * MIB, 60 * MIB).unwrap();
    // Recycling: one piece only, into another range, named at its sizes.
    assert!(
        g.recycle(tail, 60 * MIB, p, 64 * MIB).is_err(),
        "several pieces"
    );
    assert!(g.recycle(p, 64 * MIB, p, 64 * MIB).is_err(), "into itself");
    assert!(
        g.recycle(p, 64 * MIB, tail, 58 * MIB).is_err(),
        "a wrong size"
    );
    let (mapped, physical) = (sim.mapped_bytes(), sim.device_bytes(0));
    g.recycle(p, 64 * MIB, tail, 60 * MIB).unwrap();
    assert_eq!(up.allocation_size(p), None, "p ended");
    assert_eq!(up.allocation_size(tail), Some(124 * MIB));
    assert_eq!(
        (sim.mapped_bytes(), sim.device_bytes(0)),
        (mapped, physical),
        "the same memory"
    );
    assert!(up.deallocate_sync(p, 64 * MIB, 256).is_err());
    // The reservation goes with its last range.
    assert!(sim.reserved_va_bytes() > 0);
    up.deallocate_sync(tail, 124 * MIB, 256).unwrap();
    assert_eq!(sim.device_bytes(0), base);
    assert_eq!((sim.mapped_bytes(), sim.reserved_va_bytes()), (0, 0));
}

/// After a model run and the pool's drop: the driver has every byte and
/// every address back.
fn all_back(sim: &SimDriver, base: usize) -> Result<(), TestCaseError> {
    sim.complete_all();
    prop_assert_eq!(sim.device_bytes(0), base, "all memory back on drop");
    prop_assert_eq!(sim.reserved_va_bytes(), 0, "all addresses back on drop");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn expandable_pool_model(ops in prop::collection::vec(op(24), 1..160)) {
        let (device, sim, streams, base) = model_setup();
        let pool = pool_on(DeviceResource::new(device.clone()), expandable());
        run_model(pool, &sim, &streams, &ops)?;
        all_back(&sim, base)?;
    }

    #[test]
    fn expandable_pool_model_in_small_steps(ops in prop::collection::vec(op(23), 1..160)) {
        // Growths of one granule: ranges of many pieces, which trims give
        // back one by one.
        let (device, sim, streams, base) = model_setup();
        let mut config = expandable();
        config.growth.small_region = 2 * MIB;
        config.growth.medium_region = 2 * MIB;
        let pool = pool_on(DeviceResource::new(device.clone()), config);
        run_model(pool, &sim, &streams, &ops)?;
        all_back(&sim, base)?;
    }

    #[test]
    fn expandable_pool_model_tight(ops in prop::collection::vec(op(22), 1..160)) {
        // A small device and a limit: growth fails often and the reclaim runs.
        let (device, sim) = sim(48 << 20);
        let streams: Vec<_> = (0..3).map(|_| device.create_stream().unwrap()).collect();
        let base = sim.device_bytes(0);
        let mut config = expandable();
        config.max_reserved = Some(40 << 20);
        run_model(pool_on(DeviceResource::new(device.clone()), config), &sim, &streams, &ops)?;
        all_back(&sim, base)?;
    }

    #[test]
    fn recycling_pool_model(ops in prop::collection::vec(op_between(16, 22), 1..200)) {
        let (device, sim, streams, base) = small_pieces(1 << 30);
        let pool = pool_on(DeviceResource::new(device.clone()), small_piece_recycling());
        run_model(pool, &sim, &streams, &ops)?;
        all_back(&sim, base)?;
    }

    #[test]
    fn recycling_pool_model_tight(ops in prop::collection::vec(op_between(16, 22), 1..200)) {
        // Growth and moves fail often; the reclaim runs between them.
        let (device, sim, streams, base) = small_pieces(48 << 20);
        let mut config = small_piece_recycling();
        config.max_reserved = Some(40 << 20);
        run_model(pool_on(DeviceResource::new(device.clone()), config), &sim, &streams, &ops)?;
        all_back(&sim, base)?;
    }

    #[test]
    fn recycling_pool_model_on_threads(ops in prop::collection::vec(op_between(16, 22), 1..120)) {
        // Each stream on its own thread and shard: moves from one shard's
        // heap while others allocate.
        let (device, sim, streams, base) = small_pieces(1 << 30);
        let mut config = small_piece_recycling();
        config.spread = Spread::Always;
        let pool = OnThreads::new(pool_on(DeviceResource::new(device.clone()), config), &streams);
        run_model(pool, &sim, &streams, &ops)?;
        all_back(&sim, base)?;
    }

    #[test]
    fn expandable_pool_model_on_threads(ops in prop::collection::vec(op(23), 1..120)) {
        // Each stream on its own thread and shard.
        let (device, sim, streams, base) = model_setup();
        let mut config = expandable();
        config.spread = Spread::Always;
        let pool = OnThreads::new(pool_on(DeviceResource::new(device.clone()), config), &streams);
        run_model(pool, &sim, &streams, &ops)?;
        all_back(&sim, base)?;
    }
}
