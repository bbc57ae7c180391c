//! Frees on a stream that captures a CUDA graph, in each of the six pools:
//! the free is checked as any free is (the bad-free matrix run during a
//! capture gives what it gives outside one), and a block freed in a capture
//! is the graph's from then on: counted as freed, held by the pool, never
//! handed out again, and refused as a double free if freed again, during
//! the capture or after it.
//!
//! On the simulated device by default (and with `GPUMEM_DEVICE=cuda` on the
//! GPU); a Global capture binds every thread, so the tests take turns.

mod common;

use std::sync::{Arc, Mutex, MutexGuard};

use common::bad_free;
use gpumem::driver::CaptureMode;
use gpumem::pool::{
    ArenaConfig, ArenaResource, BinningConfig, BinningResource, CachingPool, CachingPoolConfig,
    FixedSizeConfig, FixedSizeResource, Pool, PoolResource, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::DeviceResource;
use gpumem::{Device, DevicePtr, Error, FreeError};

const MIB: usize = 1 << 20;

fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// One pool under test, with its own count of live bytes.
struct Subject {
    name: &'static str,
    pool: Arc<dyn Pool>,
    live: Box<dyn Fn() -> usize>,
}

fn subject<P: Pool + 'static>(name: &'static str, pool: P, live: fn(&P) -> usize) -> Subject {
    let pool = Arc::new(pool);
    let counted = pool.clone();
    Subject {
        name,
        pool,
        live: Box::new(move || live(&counted)),
    }
}

/// Makes one of the six pools, fresh, over a device.
type Maker = fn(&Device) -> Subject;

const POOLS: [Maker; 6] = [
    |d| {
        let pool = PoolResource::with_defaults(DeviceResource::new(d.clone())).unwrap();
        subject("PoolResource", pool, |p| p.live_bytes())
    },
    |d| {
        let config = ArenaConfig::with_size(64 * MIB);
        let pool = ArenaResource::new(DeviceResource::new(d.clone()), config).unwrap();
        subject("ArenaResource", pool, |p| p.stats().live)
    },
    |d| {
        let config = FixedSizeConfig::with_block_size(4096);
        let pool = FixedSizeResource::new(DeviceResource::new(d.clone()), config).unwrap();
        subject("FixedSizeResource", pool, |p| p.live_bytes())
    },
    |d| {
        let config = BinningConfig::fixed_bins(8, 20);
        let pool = BinningResource::new(DeviceResource::new(d.clone()), config).unwrap();
        subject("BinningResource", pool, |p| p.live_bytes())
    },
    |d| {
        let config = CachingPoolConfig::default();
        let pool = CachingPool::new(DeviceResource::new(d.clone()), config).unwrap();
        subject("CachingPool", pool, |p| p.live_bytes())
    },
    |d| {
        let pool = VirtualPool::new(d.clone(), VirtualPoolConfig::default()).unwrap();
        subject("VirtualPool", pool, |p| p.live_bytes())
    },
];

#[test]
fn a_free_on_a_capturing_stream_is_checked_as_any_free() {
    let _turn = serial();
    let (device, _sim) = common::device(false);
    for make in POOLS {
        let (a, b) = (make(&device), make(&device));
        let want = bad_free::matrix(&*a.pool, Some(&*a.live));
        let got = bad_free::matrix_in_capture(&*b.pool, Some(&*b.live));
        assert_eq!(got.rows, want.rows, "{}", b.name);
    }
}

/// Sizes each pool serves: a small block and, where the pool has them, a
/// block above its bins or classes.
fn sizes(name: &str) -> &'static [usize] {
    match name {
        "FixedSizeResource" => &[4096],
        _ => &[1000, 3 * MIB],
    }
}

#[test]
fn a_block_freed_in_a_capture_is_the_graphs_until_the_pool_goes() {
    let _turn = serial();
    let (device, sim) = common::device(false);
    let [s, t] = common::streams(&device);
    for make in POOLS {
        let held_before = sim.as_ref().map(|sim| sim.device_bytes(0));
        let sub = make(&device);
        let (name, mr) = (sub.name, &*sub.pool);
        for &n in sizes(name) {
            let live = (sub.live)();
            let p = mr.allocate(n, 256, &s).unwrap();
            s.begin_capture(CaptureMode::Global).unwrap();
            mr.deallocate(p, n, 256, &s).unwrap();
            assert_eq!((sub.live)(), live, "{name}: a parked block counts as freed");
            let double = Err(Error::InvalidFree {
                ptr: p.0,
                reason: FreeError::DoubleFree,
            });
            assert_eq!(
                mr.deallocate(p, n, 256, &s),
                double,
                "{name}, in the capture"
            );
            let graph = s.end_capture().unwrap();
            for stream in [&s, &t] {
                assert_eq!(mr.deallocate(p, n, 256, stream), double, "{name}, after it");
            }
            assert_eq!(
                (sub.live)(),
                live,
                "{name}: refused frees changed the count"
            );
            // Neither giving memory back nor later allocations on any
            // stream reach the parked block.
            mr.trim(0).unwrap();
            mr.release().unwrap();
            assert!(mr.reserved_bytes() >= n, "{name}: the parked block is held");
            let got: Vec<DevicePtr> = (0..8)
                .map(|i| {
                    mr.allocate(n, 256, if i % 2 == 0 { &s } else { &t })
                        .unwrap()
                })
                .collect();
            assert!(
                got.iter()
                    .all(|&q| q.0 + n as u64 <= p.0 || q.0 >= p.0 + n as u64),
                "{name}: {n} B at {p:#x} handed out again: {got:x?}"
            );
            for (i, q) in got.into_iter().enumerate() {
                mr.deallocate(q, n, 256, if i % 2 == 0 { &s } else { &t })
                    .unwrap();
            }
            assert_eq!((sub.live)(), live, "{name}");
            drop(graph);
        }
        s.synchronize().unwrap();
        t.synchronize().unwrap();
        drop(sub);
        // The pool gave everything back when it went, parked blocks included.
        if let Some(sim) = &sim {
            assert_eq!(Some(sim.device_bytes(0)), held_before, "{name}");
        }
    }
}
