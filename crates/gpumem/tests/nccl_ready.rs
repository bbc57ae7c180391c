//! The NCCL-ready mode of the VirtualPool: every block is exactly one
//! physical allocation of its own, mapped once, as `ncclMemAlloc` makes
//! them. Checked with the driver's own answers (`cuMemGetAddressRange`,
//! `cuMemRetainAllocationHandle`), so the single-device tests run on the
//! real GPU too (`GPUMEM_DEVICE=cuda`).

mod common;

use std::collections::HashSet;

use common::model::{model_setup, op, run_model};
use gpumem::driver::sim::SimConfig;
use gpumem::driver::{DevicePtr, Driver, HandleType, RawPhys};
use gpumem::pool::{Backup, Pool, VirtualPool, VirtualPoolConfig};
use gpumem::resource::MemoryResource;
use gpumem::{Device, Error, FreeError, Stream};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

fn nccl_pool(device: &Device) -> VirtualPool {
    VirtualPool::new(device.clone(), VirtualPoolConfig::nccl_ready(Vec::new())).unwrap()
}

/// Checks that the live block at `ptr` of `size` bytes is one allocation of
/// its own: the address range that holds it starts at it and covers it (on
/// the simulator: is exactly its pages), and its first and last bytes have
/// the same handle. Returns that handle, retained once: release it.
fn one_allocation(drv: &dyn Driver, ptr: DevicePtr, size: usize, page: usize) -> RawPhys {
    let (base, len) = drv.mem_address_range(ptr).unwrap();
    assert_eq!(base, ptr, "the block starts its allocation");
    assert!(
        len >= size,
        "the allocation at {ptr:#x} ({len}) covers {size} bytes"
    );
    if drv.backend() == gpumem::Backend::Sim {
        assert_eq!(
            len,
            size.next_multiple_of(page),
            "exactly the block's pages"
        );
    }
    let first = drv.vmm_retain_handle(ptr).unwrap();
    let last = drv.vmm_retain_handle(ptr.offset(size - 1)).unwrap();
    // SAFETY: `last` was just retained, released once.
    unsafe { drv.vmm_release(last) }.unwrap();
    assert_eq!(first, last, "one handle from the first byte to the last");
    first
}

/// Every block of `live` is one allocation, and no two share one.
fn all_whole(drv: &dyn Driver, live: &[(DevicePtr, usize)], page: usize) {
    let handles: Vec<RawPhys> = live
        .iter()
        .map(|&(p, n)| one_allocation(drv, p, n, page))
        .collect();
    let distinct: HashSet<RawPhys> = handles.iter().copied().collect();
    assert_eq!(distinct.len(), live.len(), "a handle per block");
    for h in handles {
        // SAFETY: each handle was retained by `one_allocation` for this, released once.
        unsafe { drv.vmm_release(h) }.unwrap();
    }
}

#[test]
fn every_block_is_one_physical_allocation_of_its_own() {
    let (device, sim) = common::device(false);
    let pool = nccl_pool(&device);
    let drv = device.driver();
    let g = pool.page_size();
    let s = device.create_stream().unwrap();
    let sizes = [1, 4096, g - 1, g, g + 1, 3 * g + 12345, 64 * MIB];
    let mut live: Vec<(DevicePtr, usize)> = sizes
        .iter()
        .map(|&n| (pool.allocate(n, 256, &s).unwrap(), n))
        .collect();
    for &(p, _) in &live {
        assert_eq!(p.0 % g as u64, 0, "blocks start on a page");
    }
    all_whole(&**drv, &live, g);
    pool.check_invariants().unwrap();

    // The memory is exportable (POSIX file descriptors), RDMA-capable where
    // the device can, and the device has read-write access.
    let h = drv.vmm_retain_handle(live[0].0).unwrap();
    // SAFETY: `h` was just retained, live until released below.
    drop(unsafe { drv.vmm_export_fd(h) }.unwrap());
    if let Some(sim) = &sim {
        let props = sim.phys_props(h).unwrap();
        assert_eq!(props.handle_type, HandleType::PosixFd);
        assert!(props.rdma_capable);
    }
    // SAFETY: `h` was retained above, released once.
    unsafe { drv.vmm_release(h) }.unwrap();

    // Frees in another order, and other sizes where they were: still one
    // allocation per block (reused where it fits, placed elsewhere where not).
    for n in [64 * MIB, 4096, g, 3 * g + 12345] {
        let i = live.iter().position(|b| b.1 == n).unwrap();
        let (p, n) = live.remove(i);
        pool.deallocate(p, n, 256, &s).unwrap();
    }
    // Smaller blocks where larger ones were (their extents do not fit),
    // and a block the size of a freed one.
    for n in [2 * g, g / 2, 3 * g + 1, 4 * g, 5 * g, 4 * g] {
        live.push((pool.allocate(n, 256, &s).unwrap(), n));
    }
    all_whole(&**drv, &live, g);
    pool.check_invariants().unwrap();
    for (p, n) in live {
        pool.deallocate(p, n, 256, &s).unwrap();
    }
    s.synchronize().unwrap();
    pool.trim(0).unwrap();
    assert_eq!(pool.stats().reserved, 0);
    drop(pool);
    if let Some(sim) = sim {
        assert_eq!(sim.physical_bytes(), 0);
        assert_eq!(sim.mapped_bytes(), 0);
    }
}

#[test]
fn a_block_asked_for_again_at_its_size_costs_no_driver_call() {
    let (device, sim) = common::device(false);
    let Some(sim) = common::sim_only(sim, "driver call counts") else {
        return;
    };
    let pool = nccl_pool(&device);
    let s = device.create_stream().unwrap();
    let g = pool.page_size();
    let p = pool.allocate(3 * g, 256, &s).unwrap();
    pool.deallocate(p, 3 * g, 256, &s).unwrap();
    let calls = sim.total_calls();
    let q = pool.allocate(3 * g - 100, 256, &s).unwrap();
    assert_eq!(q, p, "the same place");
    assert_eq!(sim.total_calls(), calls, "no driver call");
    // A smaller block does not take part of that extent: it gets its own.
    pool.deallocate(q, 3 * g - 100, 256, &s).unwrap();
    let creates = sim.call_count("cuMemCreate");
    let r = pool.allocate(g, 256, &s).unwrap();
    assert_eq!(sim.call_count("cuMemCreate"), creates + 1);
    all_whole(&**device.driver(), &[(r, g)], g);
    pool.check_invariants().unwrap();
    pool.deallocate(r, g, 256, &s).unwrap();
}

/// A freed block stays whole for the next request of its size on the
/// stream that freed it (no driver call, wherever the heap would have
/// put the request), while it counts as freed: live bytes and blocks, a
/// second free is a double free. Another stream gets memory of its own; a
/// trim gives every kept block's memory back.
#[test]
fn a_freed_block_is_kept_for_its_size_on_its_stream() {
    let (device, sim) = common::device(false);
    let pool = nccl_pool(&device);
    let (s, t) = (
        device.create_stream().unwrap(),
        device.create_stream().unwrap(),
    );
    let g = pool.page_size();
    let a = pool.allocate(3 * g, 256, &s).unwrap();
    let b = pool.allocate(g, 256, &s).unwrap();
    pool.deallocate(a, 3 * g, 256, &s).unwrap();
    let st = pool.stats();
    assert_eq!((st.live, st.live_blocks), (g, 1), "freed for the caller");
    assert_eq!(pool.live_block_size(a), None);
    assert!(matches!(
        pool.deallocate(a, 3 * g, 256, &s),
        Err(Error::InvalidFree {
            reason: FreeError::DoubleFree,
            ..
        })
    ));
    let other = pool.allocate(3 * g, 256, &t).unwrap();
    assert_ne!(other, a, "another stream does not take it");
    let calls = sim.as_ref().map(|s| s.total_calls());
    let again = pool.allocate(3 * g - 1000, 256, &s).unwrap();
    assert_eq!(again, a, "its stream gets it back");
    if let Some(sim) = &sim {
        assert_eq!(Some(sim.total_calls()), calls, "no driver call");
    }
    all_whole(&**device.driver(), &[(a, 3 * g), (b, g), (other, 3 * g)], g);
    pool.check_invariants().unwrap();
    for (p, n, on) in [(again, 3 * g - 1000, &s), (b, g, &s), (other, 3 * g, &t)] {
        pool.deallocate(p, n, 256, on).unwrap();
    }
    s.synchronize().unwrap();
    t.synchronize().unwrap();
    pool.trim(0).unwrap();
    assert_eq!(pool.reserved_bytes(), 0, "a trim gives kept blocks back");
    assert_eq!(pool.stats().live, 0);
    pool.check_invariants().unwrap();
}

/// Kept blocks never make an allocation fail: at the pool's limit, a
/// request of another size frees them and takes their memory.
#[test]
fn kept_blocks_give_way_at_the_limit() {
    let (device, _) = common::device(false);
    let pool = nccl_pool(&device);
    let s = device.create_stream().unwrap();
    let g = pool.page_size();
    pool.set_max_reserved(Some(4 * g));
    let a = pool.allocate(3 * g, 256, &s).unwrap();
    pool.deallocate(a, 3 * g, 256, &s).unwrap();
    let b = pool.allocate(2 * g, 256, &s).unwrap();
    let c = pool.allocate(2 * g, 256, &s).unwrap();
    assert!(pool.reserved_bytes() <= 4 * g);
    all_whole(&**device.driver(), &[(b, 2 * g), (c, 2 * g)], g);
    pool.check_invariants().unwrap();
    pool.deallocate(b, 2 * g, 256, &s).unwrap();
    pool.deallocate(c, 2 * g, 256, &s).unwrap();
}

/// A block is whole pages, but a free must name the size it was asked
/// with (to 256 bytes): a 5,000-byte block freed as 1 MiB, within the same
/// page, is refused and changes nothing; the right free then succeeds once.
#[test]
fn a_free_naming_another_size_within_the_page_is_refused() {
    let (device, _) = common::device(false);
    let pool = nccl_pool(&device);
    let s = device.create_stream().unwrap();
    let p = pool.allocate(5000, 256, &s).unwrap();
    let live = pool.live_bytes();
    for wrong in [MIB, 4096, 5377, pool.page_size()] {
        match pool.deallocate(p, wrong, 256, &s) {
            Err(Error::InvalidFree {
                reason: FreeError::SizeMismatch { allocated, freed },
                ..
            }) => assert_eq!((allocated, freed), (5120, wrong)),
            other => panic!("freed as {wrong}: {other:?}"),
        }
        assert_eq!(pool.live_bytes(), live, "nothing freed");
    }
    pool.deallocate(p, 5100, 256, &s).unwrap(); // the same 256-byte granule
    assert_eq!(pool.live_bytes(), 0);
    assert!(matches!(
        pool.deallocate(p, 5000, 256, &s),
        Err(Error::InvalidFree {
            reason: FreeError::DoubleFree,
            ..
        })
    ));
    pool.check_invariants().unwrap();
}

#[test]
fn every_peer_gets_read_write_access_and_sleep_is_refused() {
    let (device, sim) = Device::sim_with_driver(SimConfig::multi(3));
    let pool = VirtualPool::new(device.clone(), VirtualPoolConfig::nccl_ready(vec![1, 2])).unwrap();
    let s = device.create_stream().unwrap();
    let before = sim.call_count("cuMemSetAccess");
    let p = pool.allocate(5 * MIB, 256, &s).unwrap();
    assert_eq!(
        sim.call_count("cuMemSetAccess"),
        before + 3,
        "device and two peers"
    );
    let d2 = device.sibling(2).unwrap();
    let dst = device.driver().mem_alloc(2, 5 * MIB).unwrap();
    let s2 = d2.create_stream().unwrap();
    // SAFETY: device memory only; synchronized before it is freed.
    unsafe {
        device
            .driver()
            .memcpy_peer_async(dst, 2, p, 0, 5 * MIB, s2.raw())
    }
    .unwrap();
    s2.synchronize().unwrap();
    assert!(sim.peer_violations().is_empty());
    pool.begin_region(7).unwrap();
    assert!(matches!(
        pool.sleep(7, Backup::Discard, &s),
        Err(Error::Unsupported { .. })
    ));
    pool.deallocate(p, 5 * MIB, 256, &s).unwrap();
    // SAFETY: `dst` is this test's allocation, freed once; the copy that used it has run.
    unsafe { device.driver().mem_free(2, dst) }.unwrap();
}

#[derive(Debug, Clone)]
enum WOp {
    Alloc {
        pages: usize,
        short: usize,
        stream: usize,
    },
    Free {
        pick: usize,
    },
    Trim,
}

fn wop() -> impl Strategy<Value = WOp> {
    prop_oneof![
        5 => (1..=6usize, 0..4096usize, 0..2usize)
            .prop_map(|(pages, short, stream)| WOp::Alloc { pages, short, stream }),
        4 => any::<usize>().prop_map(|pick| WOp::Free { pick }),
        1 => Just(WOp::Trim),
    ]
}

/// Runs `ops` on an NCCL-ready pool of a simulated device against a model
/// of its live blocks (whole pages each): no overlap, the pool's live bytes,
/// and every live block one allocation of its own, after every step.
fn run_whole(ops: &[WOp]) -> Result<(), TestCaseError> {
    let (device, sim) = common::model::sim(2 << 30);
    let pool = nccl_pool(&device);
    let drv = device.driver();
    let g = pool.page_size();
    let streams: Vec<Stream> = (0..2).map(|_| device.create_stream().unwrap()).collect();
    let mut live: Vec<(DevicePtr, usize, usize)> = Vec::new();
    for op in ops {
        match *op {
            WOp::Alloc {
                pages,
                short,
                stream,
            } => {
                let n = pages * g - short.min(g - 1);
                let p = pool.allocate(n, 256, &streams[stream]).unwrap();
                let end = p.0 + (pages * g) as u64;
                for &(q, m, _) in &live {
                    let q_end = q.0 + m.next_multiple_of(g) as u64;
                    prop_assert!(end <= q.0 || q_end <= p.0, "overlap with a live block");
                }
                live.push((p, n, stream));
            }
            WOp::Free { pick } => {
                if live.is_empty() {
                    continue;
                }
                let (p, n, stream) = live.swap_remove(pick % live.len());
                pool.deallocate(p, n, 256, &streams[stream]).unwrap();
            }
            WOp::Trim => {
                for s in &streams {
                    s.synchronize().unwrap();
                }
                pool.trim(0).unwrap();
            }
        }
        let model: usize = live.iter().map(|&(_, n, _)| n.next_multiple_of(g)).sum();
        prop_assert_eq!(pool.stats().live, model, "live bytes: whole pages");
        let blocks: Vec<(DevicePtr, usize)> = live.iter().map(|&(p, n, _)| (p, n)).collect();
        all_whole(&**drv, &blocks, g);
        pool.check_invariants().map_err(TestCaseError::fail)?;
    }
    for (p, n, stream) in live {
        pool.deallocate(p, n, 256, &streams[stream]).unwrap();
    }
    drop(pool);
    prop_assert_eq!(sim.physical_bytes(), 0);
    prop_assert_eq!(sim.mapped_bytes(), 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn nccl_ready_blocks_against_a_model(ops in prop::collection::vec(wop(), 1..60)) {
        run_whole(&ops)?;
    }

    #[test]
    fn nccl_ready_pool_model(ops in prop::collection::vec(op(23), 1..120)) {
        let (device, sim, streams, _) = model_setup();
        run_model(nccl_pool(&device), &sim, &streams, &ops)?;
        sim.complete_all();
        prop_assert_eq!(sim.physical_bytes(), 0);
        prop_assert_eq!(sim.reserved_va_bytes(), 0);
    }
}
