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
use gpumem::driver::{AccessFlags, RawPhys};
use gpumem::Device;

fn us(t: Instant) -> f64 {
    t.elapsed().as_nanos() as f64 / 1000.0
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
        for _ in 0..reps {
            // One allocation, one mapping.
            let t = Instant::now();
            d.vmm_map(va, n * page, 0, big).expect("map");
            a1.push(us(t));
            let t = Instant::now();
            d.vmm_set_access(va, n * page, dev, rw).expect("access");
            b1.push(us(t));
            let t = Instant::now();
            d.vmm_unmap(va, n * page).expect("unmap");
            c1.push(us(t));
            // n allocations, n mappings, one call each for access and unmap.
            let t = Instant::now();
            for (i, &h) in small.iter().enumerate() {
                d.vmm_map(va.offset(i * page), page, 0, h).expect("map");
            }
            a2.push(us(t));
            let t = Instant::now();
            d.vmm_set_access(va, n * page, dev, rw).expect("access");
            b2.push(us(t));
            let t = Instant::now();
            d.vmm_unmap(va, n * page).expect("unmap");
            c2.push(us(t));
            // n mappings, one call per page.
            for (i, &h) in small.iter().enumerate() {
                d.vmm_map(va.offset(i * page), page, 0, h).expect("map");
            }
            let t = Instant::now();
            for i in 0..n {
                d.vmm_set_access(va.offset(i * page), page, dev, rw)
                    .expect("access");
            }
            b3.push(us(t));
            let t = Instant::now();
            for i in 0..n {
                d.vmm_unmap(va.offset(i * page), page).expect("unmap");
            }
            c3.push(us(t));
        }
        d.vmm_release(big).expect("release");
        for h in small {
            d.vmm_release(h).expect("release");
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
    d.vmm_free_address(va, max_n * page).expect("free");

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
            d.vmm_release(h).expect("release");
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
