//! Measures what `cuMemSetAccess` and `cuMemUnmap` cost over a range of `n`
//! pages, when the range is one mapping of one physical allocation and when
//! it is `n` adjacent mappings of `n` one-page allocations (what a
//! [`VirtualPool`](gpumem::pool::VirtualPool) maps), plus the per-page calls;
//! then what `cuMemCreate` and `cuMemRelease` cost for one allocation of
//! `n` pages.
//!
//! ```text
//! GPUMEM_DEVICE=cuda cargo run --release -p gpumem --example vmm_costs
//! ```
//!
//! Without `GPUMEM_DEVICE=cuda` it runs on the simulated device (the times
//! are then the simulator's).

use std::time::Instant;

use gpumem::driver::sim::SimConfig;
use gpumem::driver::{AccessFlags, DevicePtr, RawPhys};
use gpumem::Device;

fn us(t: Instant) -> f64 {
    t.elapsed().as_nanos() as f64 / 1000.0
}

/// Microseconds `f` takes.
fn timed(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    us(t)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let (device, _sim) = Device::from_env(SimConfig::default()).expect("device");
    println!("vmm_costs on {:?}", device.backend());
    let d = device.driver();
    let dev = device.ordinal();
    let page = d.vmm_granularity(dev, true).expect("granularity");
    let max_n = 256;
    let va = d.vmm_reserve(max_n * page, page).expect("reserve");
    let rw = AccessFlags::ReadWrite;
    let reps = 7;
    println!(
        "{:>5} | {:>10} {:>10} {:>10} | {:>10} {:>10} {:>10} | {:>10} {:>10}   (µs, median of {reps})",
        "pages",
        "1h map",
        "1h access",
        "1h unmap",
        "nh map",
        "nh access",
        "nh unmap",
        "pp access",
        "pp unmap"
    );
    for n in [1usize, 2, 4, 8, 16, 64, 256] {
        let (mut a1, mut b1, mut c1) = (vec![], vec![], vec![]);
        let (mut a2, mut b2, mut c2) = (vec![], vec![], vec![]);
        let (mut b3, mut c3) = (vec![], vec![]);
        let big = d
            .vmm_create(dev, n * page, Default::default())
            .expect("create");
        let small: Vec<RawPhys> = (0..n)
            .map(|_| d.vmm_create(dev, page, Default::default()).expect("create"))
            .collect();
        // SAFETY: `va` (reserved above, `max_n` pages) and the physical
        // memory just made are this program's; each round maps into the
        // unmapped reservation and unmaps what it mapped, then the physical
        // memory is released once.
        unsafe {
            let map_small = || {
                for (i, &h) in small.iter().enumerate() {
                    d.vmm_map(va.offset(i * page), page, 0, h).expect("map");
                }
            };
            let access =
                |at: DevicePtr, bytes| d.vmm_set_access(at, bytes, dev, rw).expect("access");
            let unmap = |at: DevicePtr, bytes| d.vmm_unmap(at, bytes).expect("unmap");
            for _ in 0..reps {
                // One allocation, one mapping.
                a1.push(timed(|| d.vmm_map(va, n * page, 0, big).expect("map")));
                b1.push(timed(|| access(va, n * page)));
                c1.push(timed(|| unmap(va, n * page)));
                // n allocations, n mappings, one call each for access and unmap.
                a2.push(timed(map_small));
                b2.push(timed(|| access(va, n * page)));
                c2.push(timed(|| unmap(va, n * page)));
                // n mappings, one call per page.
                map_small();
                b3.push(timed(|| {
                    (0..n).for_each(|i| access(va.offset(i * page), page))
                }));
                c3.push(timed(|| {
                    (0..n).for_each(|i| unmap(va.offset(i * page), page))
                }));
            }
            d.vmm_release(big).expect("release");
            for h in small {
                d.vmm_release(h).expect("release");
            }
        }
        println!(
            "{n:>5} | {:>10.1} {:>10.1} {:>10.1} | {:>10.1} {:>10.1} {:>10.1} | {:>10.1} {:>10.1}",
            median(a1),
            median(b1),
            median(c1),
            median(a2),
            median(b2),
            median(c2),
            median(b3),
            median(c3)
        );
    }
    // SAFETY: the reservation made above, nothing mapped in it, freed once.
    unsafe { d.vmm_free_address(va, max_n * page) }.expect("free");

    println!(
        "{:>5} | {:>10} {:>10} {:>12}   (µs, median of {reps})",
        "pages", "create", "release", "create/page"
    );
    for n in [1usize, 2, 4, 6, 8, 16, 32, 64, 256] {
        let (mut cr, mut rl) = (vec![], vec![]);
        for _ in 0..reps {
            let t = Instant::now();
            let h = d
                .vmm_create(dev, n * page, Default::default())
                .expect("create");
            cr.push(us(t));
            let t = Instant::now();
            // SAFETY: `h` was just made, released once.
            unsafe { d.vmm_release(h) }.expect("release");
            rl.push(us(t));
        }
        let c = median(cr);
        println!(
            "{n:>5} | {c:>10.1} {:>10.1} {:>12.2}",
            median(rl),
            c / n as f64
        );
    }
}
