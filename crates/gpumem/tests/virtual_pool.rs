//! VirtualPool on the simulated device: the shared resource suite, the model
//! harness with the ordering oracle, page-table properties under held streams
//! (no page unmapped under pending work), out-of-memory with reclaim,
//! all-or-nothing mapping under injected faults, peers, IPC export, data
//! written across re-mapped and aliased pages, and a property test that
//! pending work on held streams never lands in another block's memory,
//! whichever address it was issued through.

mod common;

use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

use common::model::{enqueue_work, model_setup, op, run_model, sim};
use common::suite;
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::pool::{Pool, VirtualPool, VirtualPoolConfig};
use gpumem::resource::MemoryResource;
use gpumem::{Device, DeviceBuffer, DevicePtr, Error, FreeError, Stream};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

fn pool(device: &Device) -> VirtualPool {
    VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap()
}

/// A pool whose extents are two pages at the most.
fn two_page_extents(device: &Device) -> VirtualPool {
    let mut config = VirtualPoolConfig::default();
    config.max_extent_pages = 2;
    VirtualPool::new(device.clone(), config).unwrap()
}

/// A pool whose physical memory can be exported.
fn ipc_pool(device: &Device) -> VirtualPool {
    let mut config = VirtualPoolConfig::default();
    config.ipc = true;
    VirtualPool::new(device.clone(), config).unwrap()
}

fn assert_all_back(sim: &SimDriver) {
    assert_eq!(sim.physical_bytes(), 0, "physical memory back");
    assert_eq!(sim.mapped_bytes(), 0, "nothing mapped");
    assert_eq!(sim.reserved_va_bytes(), 0, "address space back");
}

#[test]
fn virtual_pool_passes_the_suite() {
    let (device, sim) = common::device(false);
    suite::run_all(Arc::new(pool(&device)));
    if let Some(sim) = sim {
        assert_all_back(&sim);
    }
}

#[test]
fn small_and_large_blocks_map_only_what_they_cover() {
    let (device, sim) = sim(80 << 30);
    let p = pool(&device);
    let s = device.create_stream().unwrap();
    let page = p.page_size();
    assert_eq!(sim.physical_bytes(), 0, "nothing made up front");
    // Small blocks pack onto one page.
    let small: Vec<_> = (0..64)
        .map(|_| p.allocate(4096, 256, &s).unwrap())
        .collect();
    assert_eq!(p.stats().mapped, page);
    // A large block maps whole pages under it, one set-access per run.
    let access = sim.call_count("cuMemSetAccess");
    let big = p.allocate(10 * MIB, 256, &s).unwrap();
    assert_eq!(sim.call_count("cuMemSetAccess"), access + 1);
    let st = p.stats();
    assert!(st.mapped <= page + 10 * MIB + page, "{st:?}");
    assert_eq!(st.reserved, sim.physical_bytes());
    assert_eq!(st.mapped, sim.mapped_bytes());
    p.check_invariants().unwrap();
    // Freed and re-allocated on the same stream: no driver call at all.
    p.deallocate(big, 10 * MIB, 256, &s).unwrap();
    let maps = sim.call_count("cuMemMap");
    let again = p.allocate(10 * MIB, 256, &s).unwrap();
    assert_eq!(again, big, "same-stream reuse at once");
    assert_eq!(sim.call_count("cuMemMap"), maps);
    p.deallocate(again, 10 * MIB, 256, &s).unwrap();
    for q in small {
        p.deallocate(q, 4096, 256, &s).unwrap();
    }
    assert_eq!(p.live_bytes(), 0);
    // Idle pages stay mapped until trimmed.
    assert!(p.stats().idle_mapped > 0);
    let back = p.trim(0).unwrap();
    assert!(back > 0);
    assert_eq!(sim.physical_bytes(), 0);
    assert_eq!(p.stats().reserved, 0);
    drop(p);
    assert_all_back(&sim);
}

#[test]
fn a_multi_page_run_maps_with_one_set_access_and_moves_as_an_alias() {
    let (device, sim) = sim(80 << 30);
    let mut config = VirtualPoolConfig::default();
    config.slack_permille = 0;
    config.slack_min_bytes = 0;
    config.max_reserved = Some(22 * 2 * MIB);
    config.max_extent_pages = 32;
    let p = VirtualPool::new(device.clone(), config).unwrap();
    let s = device.create_stream().unwrap();
    assert_eq!(p.page_size(), 2 * MIB);
    // 20 new pages: one 20-page extent, one create, one map, one set-access.
    let (creates, maps, access) = (
        sim.call_count("cuMemCreate"),
        sim.call_count("cuMemMap"),
        sim.call_count("cuMemSetAccess"),
    );
    assert_eq!(p.driver_calls(), (0, 0));
    let a = p.allocate(40 * MIB, 256, &s).unwrap();
    assert_eq!(sim.call_count("cuMemCreate"), creates + 1);
    assert_eq!(sim.call_count("cuMemMap"), maps + 1);
    assert_eq!(p.driver_calls(), (1, 1));
    assert_eq!(sim.call_count("cuMemSetAccess"), access + 1);
    assert_eq!(p.stats().chunks, 1);
    // A page-sized block right after it fences its hole in.
    let fence = p.allocate(2 * MIB, 256, &s).unwrap();
    p.deallocate(a, 40 * MIB, 256, &s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(p.stats().idle_mapped, 40 * MIB);
    // A larger block cannot use the hole: the 20 idle pages are mapped
    // under it too (an alias: one cuMemMap, no unmap; they stay mapped at
    // the hole), one page is created, and one set-access covers the run.
    let (unmaps, maps, access) = (
        sim.call_count("cuMemUnmap"),
        sim.call_count("cuMemMap"),
        sim.call_count("cuMemSetAccess"),
    );
    let b = p.allocate(42 * MIB, 256, &s).unwrap();
    assert_ne!(b, a);
    assert_eq!(sim.call_count("cuMemUnmap"), unmaps, "aliased, not moved");
    assert_eq!(sim.call_count("cuMemMap"), maps + 2);
    assert_eq!(sim.call_count("cuMemSetAccess"), access + 1);
    let st = p.stats();
    // The cheap counters are the full statistics' own: a's extent and
    // mapping, the fence's, then b's new page (one extent, one mapping) and
    // its alias (one mapping).
    assert_eq!(p.driver_calls(), (3, 4));
    assert_eq!(p.driver_calls(), (st.chunks_created, st.mappings_made));
    assert_eq!(
        (st.reserved, st.aliased, st.aliases_made),
        (22 * 2 * MIB, 40 * MIB, 1),
        "{st:?}"
    );
    p.check_invariants().unwrap();
    // Freed and trimmed: each idle run goes with one unmap (the hole's
    // alias, and b's run of two mappings), then both extents are released.
    p.deallocate(b, 42 * MIB, 256, &s).unwrap();
    s.synchronize().unwrap();
    let unmaps = sim.call_count("cuMemUnmap");
    assert_eq!(p.trim(0).unwrap(), 42 * MIB);
    assert_eq!(sim.call_count("cuMemUnmap"), unmaps + 2);
    p.deallocate(fence, 2 * MIB, 256, &s).unwrap();
    drop(p);
    assert_all_back(&sim);
}

#[test]
fn a_multi_page_block_is_one_extent_released_only_when_wholly_idle() {
    let (device, sim) = sim(80 << 30);
    let p = pool(&device);
    let s = device.create_stream().unwrap();
    let k = p.config().max_extent_pages;
    assert!(k >= 4);
    let bytes = k * p.page_size();
    let calls =
        |sim: &SimDriver| ["cuMemCreate", "cuMemMap", "cuMemSetAccess"].map(|c| sim.call_count(c));
    // A k-page block: one physical allocation mapped once, one set-access.
    let before = calls(&sim);
    let a = p.allocate(bytes, 256, &s).unwrap();
    let after = calls(&sim);
    assert_eq!(after, before.map(|c| c + 1), "one create, map, set-access");
    let st = p.stats();
    assert_eq!((st.chunks, st.mapped, st.mappings_made), (1, bytes, 1));
    // Freed, and half of it re-used: the extent is partly live.
    p.deallocate(a, bytes, 256, &s).unwrap();
    let half = p.allocate(bytes / 2, 256, &s).unwrap();
    assert_eq!(half, a, "same-stream reuse at once");
    assert_eq!(calls(&sim), after, "no driver call");
    s.synchronize().unwrap();
    assert_eq!(p.stats().idle_mapped, bytes / 2);
    // A partly idle extent cannot be split: nothing is given back.
    let unmaps = sim.call_count("cuMemUnmap");
    assert_eq!(p.trim(0).unwrap(), 0);
    assert_eq!(sim.call_count("cuMemUnmap"), unmaps);
    assert_eq!(sim.physical_bytes(), bytes);
    p.check_invariants().unwrap();
    // Wholly idle: it goes, whole, with one unmap and one release.
    p.deallocate(half, bytes / 2, 256, &s).unwrap();
    s.synchronize().unwrap();
    let releases = sim.call_count("cuMemRelease");
    assert_eq!(p.trim(0).unwrap(), bytes);
    assert_eq!(sim.call_count("cuMemUnmap"), unmaps + 1);
    assert_eq!(sim.call_count("cuMemRelease"), releases + 1);
    assert_eq!(p.stats().mappings_unmapped, 1);
    drop(p);
    assert_all_back(&sim);
}

/// A place over two mappings of one extent can never be acquired (its
/// block would hold the same physical page twice), so the search for a
/// better place must not pick it. It did: it checked each page alone, and
/// the block, refused there, went to a new reservation, in every pass of
/// a repeating workload (with new pages mapped there each time; past 16
/// times the device's memory, each such block also unmapped every idle
/// alias).
#[test]
fn a_place_over_two_mappings_of_one_extent_is_not_picked() {
    let (device, sim) = sim(80 << 30);
    let (p, s) = (two_page_extents(&device), device.create_stream().unwrap());
    let pg = p.page_size();
    let alloc = |pages: usize| p.allocate(pages * pg, 256, &s).unwrap();
    let free = |ptr: DevicePtr, pages: usize| p.deallocate(ptr, pages * pg, 256, &s).unwrap();
    // Pages of the large area: w 0-15, a fence at 16, x 17-18, a 19-20.
    let w = alloc(16);
    let fence = alloc(1);
    let x = alloc(2);
    let a = alloc(2);
    assert_eq!(a.0, x.0 + 2 * pg as u64);
    // x's memory, idle, goes under the first two pages of y (21-24) as an
    // alias: one extent under pages 17-18 and 21-22.
    free(x, 2);
    let y = alloc(4);
    assert_eq!(y.0, a.0 + 2 * pg as u64);
    assert_eq!(p.stats().aliases_made, 1);
    let spacer = alloc(26);
    // w's memory, idle, goes under q (beyond the spacer): w's place now
    // conflicts while q lives.
    free(w, 16);
    let q = alloc(18);
    free(y, 4);
    free(a, 2);
    free(spacer, 26);
    // The next 16-page block fits w's place best, which conflicts. Of the
    // other free places, the one from page 17 is mapped but covers both
    // mappings of x's extent; the end of that free block is mapped too and
    // can be acquired.
    let before = p.stats();
    let z = alloc(16);
    let st = p.stats();
    assert_eq!(z.0, y.0 + 14 * pg as u64, "{st:?}");
    assert_eq!(st.fresh_ranges, before.fresh_ranges, "{st:?}");
    assert_eq!(st.mappings_made, before.mappings_made, "{st:?}");
    p.check_invariants().unwrap();
    free(z, 16);
    // Repeated, it goes there again: no new reservation, no driver call.
    let maps = sim.call_count("cuMemMap");
    for _ in 0..3 {
        let again = alloc(16);
        assert_eq!(again, z);
        free(again, 16);
    }
    assert_eq!(sim.call_count("cuMemMap"), maps);
    assert_eq!(p.stats().fresh_ranges, before.fresh_ranges);
    p.check_invariants().unwrap();
    free(q, 18);
    free(fence, 1);
    drop(p);
    assert_all_back(&sim);
}

/// A small pool: a 12 MiB block freed (six idle pages in the large area),
/// then a 1 MiB block (the small area, one new page). Returns the unmaps
/// and releases the second allocation made, and the bytes held after it.
fn small_pool_needs_a_page(slack_min_bytes: usize) -> (u64, u64, usize) {
    let (device, sim) = sim(80 << 30);
    let mut config = VirtualPoolConfig::default();
    config.slack_min_bytes = slack_min_bytes;
    let p = VirtualPool::new(device.clone(), config).unwrap();
    let s = device.create_stream().unwrap();
    let a = p.allocate(12 * MIB, 256, &s).unwrap();
    p.deallocate(a, 12 * MIB, 256, &s).unwrap();
    s.synchronize().unwrap();
    let calls = |sim: &SimDriver| ["cuMemUnmap", "cuMemRelease"].map(|c| sim.call_count(c));
    let before = calls(&sim);
    let b = p.allocate(MIB, 256, &s).unwrap();
    let after = calls(&sim);
    let held = p.stats().reserved;
    p.check_invariants().unwrap();
    p.deallocate(b, MIB, 256, &s).unwrap();
    drop(p);
    assert_all_back(&sim);
    (after[0] - before[0], after[1] - before[1], held)
}

#[test]
fn a_small_pool_makes_new_memory_within_the_least_slack() {
    // 3% of a 12 MiB peak is under a page. With no least slack the idle
    // extent, which cannot serve the small area, is unmapped and released
    // before one page is made: the pool holds one page.
    assert_eq!(small_pool_needs_a_page(0), (1, 1, 2 * MIB));
    // Within the default least slack (64 MiB) the page is made and the
    // idle extent stays mapped for the next large block.
    let least = VirtualPoolConfig::default().slack_min_bytes;
    assert_eq!(least, 64 * MIB);
    assert_eq!(small_pool_needs_a_page(least), (0, 0, 14 * MIB));
    // A least slack under the page needed changes nothing.
    assert_eq!(small_pool_needs_a_page(MIB), (1, 1, 2 * MIB));
}

#[test]
fn a_pool_at_its_limit_gives_back_only_the_idle_memory_it_needs() {
    // Two idle extents (six pages and two) fill a 16 MiB limit; a small
    // block needs one page. The least slack does not reach past the limit:
    // the larger idle extent goes (one unmap) and the other stays mapped,
    // rather than a create failing and every idle mapping going.
    let (device, sim) = sim(80 << 30);
    let mut config = VirtualPoolConfig::default();
    config.max_reserved = Some(16 * MIB);
    let p = VirtualPool::new(device.clone(), config).unwrap();
    let s = device.create_stream().unwrap();
    let a = p.allocate(12 * MIB, 256, &s).unwrap();
    let b = p.allocate(2 * MIB + 1, 256, &s).unwrap();
    p.deallocate(a, 12 * MIB, 256, &s).unwrap();
    p.deallocate(b, 2 * MIB + 1, 256, &s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(p.stats().reserved, 16 * MIB);
    let unmaps = sim.call_count("cuMemUnmap");
    let c = p.allocate(MIB, 256, &s).unwrap();
    assert_eq!(sim.call_count("cuMemUnmap"), unmaps + 1);
    let st = p.stats();
    assert_eq!((st.reserved, st.idle_mapped), (6 * MIB, 4 * MIB), "{st:?}");
    p.check_invariants().unwrap();
    p.deallocate(c, MIB, 256, &s).unwrap();
    drop(p);
    assert_all_back(&sim);
}

#[test]
fn physical_pages_move_to_where_they_are_needed() {
    // A device of 32 pages: blocks far apart in address space share them.
    let (device, sim) = sim(64 * MIB);
    let p = pool(&device);
    let s = device.create_stream().unwrap();
    for round in 0..20 {
        let a = p.allocate(40 * MIB, 256, &s).unwrap();
        // Another size each round lands elsewhere; pages must move.
        let b = p.allocate((round % 5 + 1) * 3 * MIB, 256, &s).unwrap();
        p.check_invariants().unwrap();
        assert!(sim.physical_bytes() <= 64 * MIB);
        p.deallocate(a, 40 * MIB, 256, &s).unwrap();
        p.deallocate(b, (round % 5 + 1) * 3 * MIB, 256, &s).unwrap();
    }
    let st = p.stats();
    assert!(st.peak_reserved <= 64 * MIB, "{st:?}");
    drop(p);
    assert_all_back(&sim);
}

#[test]
fn pages_pending_on_a_busy_stream_are_not_unmapped() {
    let (device, sim) = sim(32 * MIB);
    let p = pool(&device);
    let (s, t) = (
        device.create_stream().unwrap(),
        device.create_stream().unwrap(),
    );
    // Both streams known to the pool (each keeps its own free space).
    let x = p.allocate(4 * MIB, 256, &t).unwrap();
    p.deallocate(x, 4 * MIB, 256, &t).unwrap();
    let a = DeviceBuffer::<u8, _>::new(20 * MIB, &p, &s).unwrap();
    sim.hold(s.raw());
    a.memset_async(7).unwrap(); // pending on s
    drop(a); // freed on s, its work still pending
    assert!(p.stats().idle_mapped >= 20 * MIB);
    let unmaps = sim.call_count("cuMemUnmap");
    assert_eq!(p.trim(0).unwrap(), 0, "pending pages are not given back");
    assert_eq!(
        sim.call_count("cuMemUnmap"),
        unmaps,
        "pending pages stay mapped"
    );
    // t needs 12 pages; 10 are pending on s and 6 more do not fit: the pool
    // waits for s (out of memory), then moves s's pages.
    let b = p.allocate(24 * MIB, 256, &t).unwrap();
    assert_eq!(sim.pending_ops(s.raw()), 0, "s was synchronized");
    assert!(sim.call_count("cuMemUnmap") > unmaps, "s's pages moved");
    assert_eq!(sim.data_stats().faults, 0, "no work ran on unmapped pages");
    assert!(sim.physical_bytes() <= 32 * MIB);
    p.check_invariants().unwrap();
    sim.release(s.raw());
    p.deallocate(b, 24 * MIB, 256, &t).unwrap();
    drop(p);
    assert_all_back(&sim);
}

#[test]
fn idle_pages_are_reclaimed_once_the_freeing_stream_is_done() {
    let (device, sim) = sim(80 << 30);
    let p = pool(&device);
    let (s, t) = (
        device.create_stream().unwrap(),
        device.create_stream().unwrap(),
    );
    let a = p.allocate(16 * MIB, 256, &s).unwrap();
    sim.hold(s.raw());
    enqueue_work(&s);
    p.deallocate(a, 16 * MIB, 256, &s).unwrap();
    assert_eq!(p.trim(0).unwrap(), 0, "pending: nothing given back");
    assert_eq!(sim.physical_bytes(), 16 * MIB);
    sim.release(s.raw());
    assert_eq!(p.trim(0).unwrap(), 16 * MIB, "done: all given back");
    // The freeing stream's work is known done by an event on a later pass
    // too: hold, free, trim (records an event), complete, trim.
    let b = p.allocate(4 * MIB, 256, &t).unwrap();
    sim.hold(t.raw());
    enqueue_work(&t);
    p.deallocate(b, 4 * MIB, 256, &t).unwrap();
    assert_eq!(p.trim(0).unwrap(), 0);
    sim.complete(t.raw());
    assert!(p.trim(0).unwrap() > 0);
    sim.release(t.raw());
    drop(p);
    assert_all_back(&sim);
}

#[test]
fn out_of_memory_reports_detail_and_loses_nothing() {
    let (device, sim) = sim(32 * MIB);
    let p = pool(&device);
    let s = device.create_stream().unwrap();
    let a = p.allocate(24 * MIB, 256, &s).unwrap();
    let err = p.allocate(12 * MIB, 256, &s).unwrap_err();
    let info = err.oom_info().expect("out of memory").clone();
    assert_eq!(info.requested, 12 * MIB);
    assert_eq!(info.live, Some(24 * MIB));
    assert!(info.reserved.is_some_and(|r| r >= 24 * MIB));
    assert!(info.largest_free.is_some());
    p.check_invariants().unwrap();
    // More than the device: refused before any driver call.
    assert!(p.allocate(1 << 40, 256, &s).unwrap_err().is_oom());
    p.deallocate(a, 24 * MIB, 256, &s).unwrap();
    // Everything free again: the same request now fits.
    let b = p.allocate(30 * MIB, 256, &s).unwrap();
    p.deallocate(b, 30 * MIB, 256, &s).unwrap();
    drop(p);
    assert_all_back(&sim);
}

#[test]
fn max_reserved_is_a_limit() {
    let (device, sim) = sim(80 << 30);
    let mut config = VirtualPoolConfig::default();
    config.max_reserved = Some(8 * MIB);
    let p = VirtualPool::new(device.clone(), config).unwrap();
    let s = device.create_stream().unwrap();
    let a = p.allocate(6 * MIB, 256, &s).unwrap();
    let e = p.allocate(4 * MIB, 256, &s).unwrap_err();
    assert_eq!(e.oom_info().unwrap().limit, Some(8 * MIB));
    assert!(sim.physical_bytes() <= 8 * MIB);
    p.deallocate(a, 6 * MIB, 256, &s).unwrap();
    let b = p.allocate(8 * MIB, 256, &s).unwrap();
    p.deallocate(b, 8 * MIB, 256, &s).unwrap();
}

#[test]
fn max_reserved_changes_at_run_time_and_the_pool_lists_what_it_holds() {
    let (device, sim) = sim(80 << 30);
    let p = VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap();
    let s = device.create_stream().unwrap();
    let a = p.allocate(6 * MIB, 256, &s).unwrap();
    let b = p.allocate(1000, 256, &s).unwrap();
    p.set_max_reserved(Some(8 * MIB));
    assert_eq!(p.max_reserved(), Some(8 * MIB));
    let e = p.allocate(4 * MIB, 256, &s).unwrap_err();
    assert_eq!(e.oom_info().unwrap().limit, Some(8 * MIB));
    // Live blocks, their sizes, and the mapped ranges holding them.
    let live = p.live_blocks();
    assert_eq!(live.iter().map(|l| l.address).collect::<Vec<_>>(), {
        let mut v = vec![a, b];
        v.sort();
        v
    });
    assert_eq!(p.live_block_size(a), Some(6 * MIB));
    assert_eq!(p.live_block_size(b), Some(1024));
    assert_eq!(p.live_block_size(DevicePtr(a.0 + 256)), None);
    let ranges = p.mapped_ranges();
    for l in &live {
        assert_eq!(ranges.iter().filter(|r| r.contains(l)).count(), 1, "{l:?}");
    }
    let st = p.stats();
    assert_eq!(st.chunks_created as usize, st.chunks);
    assert_eq!(st.peak_chunks, st.chunks);
    assert_eq!(p.free_physical_bytes(), st.reserved - 4 * (2 * MIB));
    p.set_max_reserved(None);
    let c = p.allocate(4 * MIB, 256, &s).unwrap();
    for (q, n) in [(a, 6 * MIB), (b, 1000), (c, 4 * MIB)] {
        p.deallocate(q, n, 256, &s).unwrap();
    }
    p.release().unwrap();
    let st = p.stats();
    assert_eq!(st.chunks_released, st.chunks_created);
    assert_eq!(sim.physical_bytes(), 0);
}

#[test]
fn a_failed_mapping_is_undone_entirely() {
    let (device, sim) = sim(80 << 30);
    // Extents of two pages: the 8-page block takes four maps, so the third
    // fails after two succeeded.
    let p = two_page_extents(&device);
    let s = device.create_stream().unwrap();
    for (call, nth) in [("cuMemMap", 3), ("cuMemSetAccess", 1), ("cuMemCreate", 1)] {
        p.trim(0).unwrap(); // nothing mapped: the next allocation maps
        let mapped = sim.mapped_bytes();
        let live = p.live_bytes();
        sim.fail_call(call, nth, 1);
        let e = p.allocate(16 * MIB, 256, &s).unwrap_err();
        assert!(matches!(e, Error::Driver { .. }), "{call}: {e}");
        sim.clear_faults();
        assert_eq!(sim.mapped_bytes(), mapped, "{call}: no half mapping left");
        assert_eq!(p.live_bytes(), live);
        p.check_invariants().unwrap();
        let a = p.allocate(16 * MIB, 256, &s).unwrap();
        p.deallocate(a, 16 * MIB, 256, &s).unwrap();
    }
    drop(p);
    assert_all_back(&sim);
}

#[test]
fn bad_frees_are_errors() {
    let (device, _) = sim(80 << 30);
    let p = pool(&device);
    let s = device.create_stream().unwrap();
    let a = p.allocate(1000, 256, &s).unwrap();
    assert!(matches!(
        p.deallocate(DevicePtr(a.0 + 256), 1000, 256, &s),
        Err(Error::InvalidFree { .. })
    ));
    assert!(matches!(
        p.deallocate(DevicePtr(0x1000), 1000, 256, &s),
        Err(Error::InvalidFree {
            reason: FreeError::Unknown,
            ..
        })
    ));
    p.deallocate(a, 1000, 256, &s).unwrap();
    assert!(matches!(
        p.deallocate(a, 1000, 256, &s),
        Err(Error::InvalidFree {
            reason: FreeError::DoubleFree,
            ..
        })
    ));
    p.check_invariants().unwrap();
}

#[test]
fn construction_checks_the_device() {
    let mut config = SimConfig::default();
    config.vmm = false;
    let (device, _) = Device::sim_with_driver(config);
    assert!(matches!(
        VirtualPool::new(device, VirtualPoolConfig::default()),
        Err(Error::Unsupported { .. })
    ));
    let (device, _) = sim(80 << 30);
    let mut bad_peer = VirtualPoolConfig::default();
    bad_peer.peers = vec![3];
    assert!(VirtualPool::new(device.clone(), bad_peer).is_err());
    let mut self_peer = VirtualPoolConfig::default();
    self_peer.peers = vec![0];
    assert!(VirtualPool::new(device.clone(), self_peer).is_err());
    let mut no_space = VirtualPoolConfig::default();
    no_space.va_multiple = 0;
    assert!(VirtualPool::new(device, no_space).is_err());
}

#[test]
fn peers_get_access_to_every_mapped_run() {
    let (device, sim) = Device::sim_with_driver(SimConfig::multi(2));
    let mut config = VirtualPoolConfig::default();
    config.peers = vec![1];
    let p = VirtualPool::new(device.clone(), config).unwrap();
    let s = device.create_stream().unwrap();
    let before = sim.call_count("cuMemSetAccess");
    let a = p.allocate(6 * MIB, 256, &s).unwrap();
    assert_eq!(
        sim.call_count("cuMemSetAccess"),
        before + 2,
        "own device and peer"
    );
    p.deallocate(a, 6 * MIB, 256, &s).unwrap();
    drop(p);
    assert_all_back(&sim);
}

#[test]
fn physical_chunks_export_as_file_descriptors() {
    let (device, sim) = sim(80 << 30);
    let plain = pool(&device);
    assert!(plain.export_page_fds().is_err(), "not made with ipc");
    let p = ipc_pool(&device);
    let s = device.create_stream().unwrap();
    let a = p.allocate(6 * MIB, 256, &s).unwrap();
    let exports = p.export_page_fds().unwrap();
    assert_eq!(exports.len(), p.stats().chunks);
    let mapped: usize = exports.iter().map(|x| x.mappings.len()).sum();
    assert_eq!(mapped * p.page_size(), p.stats().mapped);
    for x in &exports {
        let h = device.driver().vmm_import_fd(x.fd.as_fd()).unwrap();
        // SAFETY: `h` was just imported, released once.
        unsafe { device.driver().vmm_release(h) }.unwrap();
    }
    p.deallocate(a, 6 * MIB, 256, &s).unwrap();
    drop(p);
    drop(plain);
    assert_all_back(&sim);
}

/// Descriptors open in this process for the simulated exports of `sim`'s
/// physical memory (its export files are named after the driver).
fn open_phys_exports(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().contains(prefix))
        .count()
}

/// An export that fails part-way closes the descriptors it had already
/// made (they leaked before: the driver returned bare integers).
#[test]
fn a_failed_export_leaks_no_descriptor() {
    let (device, sim) = sim(80 << 30);
    let p = ipc_pool(&device);
    let s = device.create_stream().unwrap();
    let a = p.allocate(6 * MIB, 256, &s).unwrap();
    let b = p.allocate(64 * MIB, 256, &s).unwrap();
    assert!(p.stats().chunks >= 2, "{:?}", p.stats());
    // The export files' name prefix, from one export that succeeds.
    let exports = p.export_page_fds().unwrap();
    let target =
        std::fs::read_link(format!("/proc/self/fd/{}", exports[0].fd.as_raw_fd())).unwrap();
    let name = target.file_name().unwrap().to_string_lossy().into_owned();
    let prefix = name[..name.find("-phys-").unwrap() + "-phys-".len()].to_string();
    drop(exports);
    assert_eq!(open_phys_exports(&prefix), 0, "dropped exports are closed");

    sim.fail_call("cuMemExportToShareableHandle", 2, 999);
    assert!(p.export_page_fds().is_err());
    assert_eq!(open_phys_exports(&prefix), 0, "no descriptor leaked");

    p.deallocate(a, 6 * MIB, 256, &s).unwrap();
    p.deallocate(b, 64 * MIB, 256, &s).unwrap();
}

#[test]
fn data_survives_across_re_mapped_pages() {
    // A backed device: blocks of growing sizes force idle pages to be
    // mapped under other addresses (aliases) between rounds.
    let (device, sim) = Device::sim_with_driver(SimConfig::backed(64 * MIB));
    let p = pool(&device);
    let s = device.create_stream().unwrap();
    let mut keep: Vec<(DeviceBuffer<u8, &VirtualPool>, Vec<u8>)> = Vec::new();
    for round in 0..10u64 {
        // Each block is larger than any hole left before it, so it lands on
        // fresh addresses and takes the pages of the freed ones.
        let len = (round as usize + 3) * MIB / 2 + 4096 * round as usize + 512;
        let data = common::random_bytes(len, round);
        let buf = DeviceBuffer::from_slice(&data, &p, &s).unwrap();
        keep.push((buf, data));
        if keep.len() > 2 {
            keep.remove(0);
        }
        for (b, d) in &keep {
            assert_eq!(&b.to_vec().unwrap(), d, "round {round}");
        }
        p.check_invariants().unwrap();
    }
    assert!(p.stats().aliases_made > 0, "pages moved: {:?}", p.stats());
    let st = p.stats();
    assert_eq!(
        st.pages_created * p.page_size() as u64,
        st.peak_reserved as u64
    );
    assert_eq!(sim.data_stats().faults, 0);
    drop(keep);
    drop(p);
    assert_all_back(&sim);
}

#[test]
fn aliased_memory_is_never_handed_out_twice() {
    let st = alias_rounds(8);
    assert!(st.aliases_made > 0, "{st:?}");
}

#[test]
fn idle_aliases_are_collected_beyond_the_ratio() {
    // No alias may stay beyond a mapping's use: every idle one is unmapped
    // after each mapping call, and data still survives.
    let st = alias_rounds(0);
    assert!(st.aliases_made > 0 && st.aliases_collected > 0, "{st:?}");
}

/// Rounds of blocks on a backed device of 24 pages with no slack: every
/// round's large block must take the pages of blocks freed elsewhere, while
/// the smaller ones come back to addresses whose pages another alias may
/// hold. Checks every live block's bytes after each round.
fn alias_rounds(max_alias_ratio: usize) -> gpumem::pool::VirtualPoolStats {
    let (device, sim) = Device::sim_with_driver(SimConfig::backed(48 * MIB));
    let mut config = VirtualPoolConfig::default();
    config.slack_permille = 0;
    config.slack_min_bytes = 0;
    config.max_alias_ratio = max_alias_ratio;
    let p = VirtualPool::new(device.clone(), config).unwrap();
    let s = device.create_stream().unwrap();
    let mut live: Vec<(DeviceBuffer<u8, &VirtualPool>, Vec<u8>)> = Vec::new();
    for round in 0..40u64 {
        let len = match round % 4 {
            0 => 30 * MIB,
            1 => 6 * MIB + 300,
            2 => 10 * MIB,
            _ => 3 * MIB + 77,
        };
        while live.iter().map(|(b, _)| b.len()).sum::<usize>() + len > 40 * MIB {
            live.remove(0);
        }
        let data = common::random_bytes(len, round);
        let buf = DeviceBuffer::from_slice(&data, &p, &s).unwrap();
        live.push((buf, data));
        for (b, d) in &live {
            assert_eq!(&b.to_vec().unwrap(), d, "round {round}");
        }
        p.check_invariants().unwrap();
        assert!(sim.physical_bytes() <= 48 * MIB);
    }
    let st = p.stats();
    assert_eq!(sim.data_stats().faults, 0);
    drop(live);
    drop(p);
    assert_all_back(&sim);
    st
}

#[test]
fn memory_freed_on_a_busy_stream_is_not_aliased_for_another() {
    let (device, sim) = sim(80 << 30);
    let mut config = VirtualPoolConfig::default();
    config.slack_permille = 0;
    config.slack_min_bytes = 0;
    let p = VirtualPool::new(device.clone(), config).unwrap();
    let (s, t) = (
        device.create_stream().unwrap(),
        device.create_stream().unwrap(),
    );
    let a = DeviceBuffer::<u8, _>::new(20 * MIB, &p, &s).unwrap();
    let fence = p.allocate(2 * MIB, 256, &s).unwrap();
    sim.hold(s.raw());
    a.memset_async(7).unwrap(); // pending on s
    drop(a);
    // t needs 11 pages: a's 10 are still in use by s's work, so they are
    // not mapped for t; new memory is made.
    let before = p.stats();
    let b = p.allocate(22 * MIB, 256, &t).unwrap();
    let st = p.stats();
    assert_eq!(st.aliases_made, before.aliases_made, "{st:?}");
    assert_eq!(st.reserved, before.reserved + 22 * MIB, "{st:?}");
    p.check_invariants().unwrap();
    p.deallocate(b, 22 * MIB, 256, &t).unwrap();
    // Once s is done, the same request on t may take a's pages.
    sim.release(s.raw());
    s.synchronize().unwrap();
    t.synchronize().unwrap();
    let c = p.allocate(44 * MIB, 256, &t).unwrap();
    assert!(p.stats().aliases_made > before.aliases_made);
    p.check_invariants().unwrap();
    p.deallocate(c, 44 * MIB, 256, &t).unwrap();
    p.deallocate(fence, 2 * MIB, 256, &s).unwrap();
    assert_eq!(sim.data_stats().faults, 0);
    drop(p);
    assert_all_back(&sim);
}

#[derive(Debug, Clone)]
enum VOp {
    Alloc { stream: usize, bytes: usize },
    Free { pick: usize, stream: usize },
    Touch { pick: usize },
    Hold { stream: usize },
    Release { stream: usize },
    Trim,
}

fn vop() -> impl Strategy<Value = VOp> {
    prop_oneof![
        6 => (0..3usize, 8..=24u32, 0..4096usize).prop_map(|(stream, log, extra)| {
            let base = 1usize << log;
            VOp::Alloc { stream, bytes: base + extra * (base / 4096).max(1) }
        }),
        4 => (any::<usize>(), 0..3usize).prop_map(|(pick, stream)| VOp::Free { pick, stream }),
        3 => any::<usize>().prop_map(|pick| VOp::Touch { pick }),
        1 => (0..3usize).prop_map(|stream| VOp::Hold { stream }),
        1 => (0..3usize).prop_map(|stream| VOp::Release { stream }),
        1 => Just(VOp::Trim),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn pending_work_never_lands_in_another_block(ops in prop::collection::vec(vop(), 1..100)) {
        // Backed memory and no slack, so pages move between blocks (aliases)
        // while streams are held. Each block is filled with its own byte on
        // its own stream: memory handed to another block while a held
        // stream's fill is still pending would be overwritten when that
        // stream runs, through whichever address it was filled by.
        let (device, sim) = Device::sim_with_driver(SimConfig::backed(32 * MIB));
        let mut config = VirtualPoolConfig::default();
        config.slack_permille = 0;
        config.slack_min_bytes = 0;
        let p = VirtualPool::new(device.clone(), config).unwrap();
        let streams: Vec<Stream> = (0..3).map(|_| device.create_stream().unwrap()).collect();
        let checker = device.create_stream().unwrap();
        let mut live: Vec<(DeviceBuffer<u8, &VirtualPool>, usize, u8)> = Vec::new();
        let (mut next, mut held) = (0u8, [false; 3]);
        for op in &ops {
            match *op {
                VOp::Alloc { stream, bytes } => {
                    match DeviceBuffer::<u8, _>::new(bytes.min(8 * MIB), &p, &streams[stream]) {
                        Ok(b) => {
                            next = next % 250 + 1;
                            b.memset_async(next).unwrap();
                            live.push((b, stream, next));
                        }
                        Err(e) if e.is_oom() => {}
                        Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
                    }
                }
                VOp::Free { pick, stream } => {
                    if live.is_empty() { continue; }
                    let (mut b, owner, _) = live.swap_remove(pick % live.len());
                    if owner != stream {
                        streams[stream].wait_for(&streams[owner]).unwrap();
                    }
                    b.set_stream(&streams[stream]).unwrap();
                    drop(b);
                }
                VOp::Touch { pick } => {
                    let n = live.len().max(1);
                    if let Some((b, _, v)) = live.get_mut(pick % n) {
                        next = next % 250 + 1;
                        b.memset_async(next).unwrap();
                        *v = next;
                    }
                }
                VOp::Hold { stream } => { sim.hold(streams[stream].raw()); held[stream] = true; }
                VOp::Release { stream } => { sim.release(streams[stream].raw()); held[stream] = false; }
                VOp::Trim => { p.trim(0).unwrap(); }
            }
            p.check_invariants().map_err(TestCaseError::fail)?;
        }
        for (s, h) in streams.iter().zip(held) {
            if h { sim.release(s.raw()); }
        }
        for s in &streams { s.synchronize().unwrap(); }
        for (b, _, v) in &mut live {
            b.set_stream(&checker).unwrap();
            let got = b.to_vec().unwrap();
            prop_assert!(got.iter().all(|x| x == v), "a block lost its bytes to pending work elsewhere");
        }
        prop_assert_eq!(sim.data_stats().faults, 0);
        prop_assert!(p.stats().peak_reserved <= 32 * MIB);
        drop(live);
        drop(p);
        prop_assert_eq!(sim.physical_bytes(), 0);
    }

    #[test]
    fn virtual_pool_model(ops in prop::collection::vec(op(22), 1..160)) {
        let (device, sim, streams, _) = model_setup();
        run_model(pool(&device), &sim, &streams, &ops)?;
        sim.complete_all();
        prop_assert_eq!(sim.physical_bytes(), 0);
        prop_assert_eq!(sim.mapped_bytes(), 0);
        prop_assert_eq!(sim.reserved_va_bytes(), 0);
    }

    #[test]
    fn virtual_pool_model_large_blocks(ops in prop::collection::vec(op(26), 1..120)) {
        // Blocks up to 128 MiB on a 1 GiB device: large blocks look for
        // places with mapped pages, and pages move between them.
        let (device, sim, streams, _) = model_setup();
        run_model(pool(&device), &sim, &streams, &ops)?;
        sim.complete_all();
        prop_assert_eq!(sim.physical_bytes(), 0);
        prop_assert_eq!(sim.reserved_va_bytes(), 0);
    }

    #[test]
    fn virtual_pool_model_tight(ops in prop::collection::vec(op(22), 1..160)) {
        // 24 pages: pages move and out-of-memory reclaims often.
        let (device, sim) = sim(48 * MIB);
        let streams: Vec<_> = (0..3).map(|_| device.create_stream().unwrap()).collect();
        run_model(pool(&device), &sim, &streams, &ops)?;
        sim.complete_all();
        prop_assert_eq!(sim.physical_bytes(), 0);
        prop_assert_eq!(sim.reserved_va_bytes(), 0);
    }

    /// Live blocks never overlap and sit on mapped, accessible pages (a memset
    /// of each succeeds); pages under pending work on a freeing stream are
    /// never unmapped (held streams' memsets run later without a fault); and
    /// everything goes back on drop.
    #[test]
    fn pages_follow_live_blocks(ops in prop::collection::vec(vop(), 1..120)) {
        let mut config = SimConfig::default();
        config.capacity = 40 * MIB;
        let (device, sim) = Device::sim_with_driver(config);
        let p = pool(&device);
        let streams: Vec<Stream> = (0..3).map(|_| device.create_stream().unwrap()).collect();
        let checker = device.create_stream().unwrap();
        let mut live: Vec<(DeviceBuffer<u8, &VirtualPool>, usize)> = Vec::new();
        let mut held = [false; 3];
        for op in &ops {
            match *op {
                VOp::Alloc { stream, bytes } => {
                    match DeviceBuffer::<u8, _>::new(bytes, &p, &streams[stream]) {
                        Ok(b) => {
                            let (s, e) = (b.as_device_ptr().0, b.as_device_ptr().0 + bytes as u64);
                            for (o, _) in &live {
                                let (os, oe) = (o.as_device_ptr().0, o.as_device_ptr().0 + o.len() as u64);
                                prop_assert!(e <= os || oe <= s, "overlap");
                            }
                            live.push((b, stream));
                        }
                        Err(e) if e.is_oom() => {}
                        Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
                    }
                }
                VOp::Free { pick, stream } => {
                    if live.is_empty() { continue; }
                    let (mut b, owner) = live.swap_remove(pick % live.len());
                    if owner != stream {
                        streams[stream].wait_for(&streams[owner]).unwrap();
                    }
                    b.set_stream(&streams[stream]).unwrap();
                    drop(b);
                }
                VOp::Touch { pick } => {
                    if let Some((b, _)) = live.get(pick % live.len().max(1)) {
                        // Work on the block's stream (pending if held).
                        b.memset_async(0xa5).unwrap();
                    }
                }
                VOp::Hold { stream } => { sim.hold(streams[stream].raw()); held[stream] = true; }
                VOp::Release { stream } => { sim.release(streams[stream].raw()); held[stream] = false; }
                VOp::Trim => { p.trim(0).unwrap(); }
            }
            p.check_invariants().map_err(TestCaseError::fail)?;
            // Every live block is mapped with access: a memset on a free-running
            // stream succeeds now.
            for (b, owner) in &mut live {
                b.set_stream(&checker).unwrap();
                b.memset_async(1).unwrap();
                b.set_stream(&streams[*owner]).unwrap();
            }
            prop_assert_eq!(sim.data_stats().faults, 0, "work hit an unmapped page");
        }
        for (s, h) in streams.iter().zip(held) {
            if h { sim.release(s.raw()); }
        }
        prop_assert_eq!(sim.data_stats().faults, 0, "pending work hit an unmapped page");
        drop(live);
        for s in &streams { s.synchronize().unwrap(); }
        p.check_invariants().map_err(TestCaseError::fail)?;
        drop(p);
        prop_assert_eq!(sim.physical_bytes(), 0);
        prop_assert_eq!(sim.mapped_bytes(), 0);
        prop_assert_eq!(sim.reserved_va_bytes(), 0);
    }
}
