//! Data test of [`VirtualPool`] for a real GPU (run it under
//! `compute-sanitizer --tool memcheck`): writes patterns into blocks whose
//! physical pages move under other addresses between rounds (mapped there
//! as aliases, or unmapped and re-mapped), reads them back, and exits 0
//! only if every byte matches, pages did move and all memory went back.
//!
//! ```text
//! GPUMEM_DEVICE=cuda cargo run --release -p gpumem --example vpool_data
//! ```
//!
//! Without `GPUMEM_DEVICE=cuda` it runs on the simulated device in backed mode.
//! The pool is capped at 64 MiB of physical memory so pages must move.

use gpumem::driver::sim::SimConfig;
use gpumem::pool::{Pool, VirtualPool, VirtualPoolConfig};
use gpumem::{Device, DeviceBuffer, Stream};

const MIB: usize = 1 << 20;

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn run() -> Result<(), String> {
    let (device, sim) =
        Device::from_env(SimConfig::backed(256 * MIB)).map_err(|e| e.to_string())?;
    println!("vpool_data on {:?}", device.backend());
    let mut config = VirtualPoolConfig::default();
    config.max_reserved = Some(64 * MIB);
    let pool = VirtualPool::new(device.clone(), config).map_err(|e| e.to_string())?;
    let streams: Vec<Stream> = (0..2)
        .map(|_| device.create_stream())
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut keep: Vec<(DeviceBuffer<u8, &VirtualPool>, Vec<u8>)> = Vec::new();
    let mut checked = 0usize;
    for round in 0..40u64 {
        // Sizes grow and shrink; every few rounds a block is larger than any
        // hole before it, so it lands on fresh addresses and takes pages
        // unmapped from freed blocks.
        let len = match round % 5 {
            0 => (round as usize % 7 + 3) * MIB + 4096,
            1 => 700 * 1024,
            2 => (round as usize % 4 + 1) * 5 * MIB + 256,
            3 => 3000,
            _ => 2 * MIB,
        };
        let s = &streams[round as usize % 2];
        let data = pattern(len, round);
        let buf = loop {
            match DeviceBuffer::from_slice(&data, &pool, s) {
                Ok(b) => break b,
                Err(e) if e.is_oom() && !keep.is_empty() => {
                    keep.remove(0);
                }
                Err(e) => return Err(format!("round {round}: {e}")),
            }
        };
        keep.push((buf, data));
        if keep.len() > 4 {
            keep.remove(0);
        }
        for (b, d) in &keep {
            let got = b.to_vec().map_err(|e| e.to_string())?;
            if &got != d {
                let at = got.iter().zip(d).position(|(a, b)| a != b).unwrap_or(0);
                return Err(format!(
                    "round {round}: block {:#x} differs at byte {at}",
                    b.as_device_ptr().0
                ));
            }
            checked += d.len();
        }
        if round == 20 {
            pool.trim(0).map_err(|e| e.to_string())?;
        }
        pool.check_invariants()?;
    }
    let st = pool.stats();
    println!(
        "checked {checked} bytes; peak physical {} MiB, pages created {}, released {}, aliases {}, mappings unmapped {}",
        st.peak_reserved / MIB,
        st.pages_created,
        st.pages_released,
        st.aliases_made,
        st.mappings_unmapped
    );
    if st.aliases_made + st.mappings_unmapped == 0 {
        return Err("no page moved".into());
    }
    drop(keep);
    for s in &streams {
        s.synchronize().map_err(|e| e.to_string())?;
    }
    drop(pool);
    if let Some(sim) = sim {
        println!("simulator: {} faults", sim.data_stats().faults);
        if sim.data_stats().faults != 0 || sim.physical_bytes() != 0 || sim.reserved_va_bytes() != 0
        {
            return Err("simulator: faults or memory left behind".into());
        }
    }
    Ok(())
}

fn main() {
    match run() {
        Ok(()) => println!("vpool_data: OK"),
        Err(e) => {
            eprintln!("vpool_data: FAILED: {e}");
            std::process::exit(1);
        }
    }
}
