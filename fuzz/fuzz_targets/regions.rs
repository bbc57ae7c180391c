//! VirtualPool's regions, sleep and wake, driven by any sequence of steps
//! against the regions model (`crates/gpumem/tests/common/regions_model.rs`,
//! the one the sleep tests use), on a backed simulated device: refusals
//! exactly when the model says, sleeping bytes as modelled, no overlap with
//! a sleeping block, contents kept across a sleep with a backup, and every
//! byte (device, mapped and pinned) back at the end.
#![no_main]

#[path = "../../crates/gpumem/tests/common/regions_model.rs"]
#[allow(dead_code)]
mod regions_model;

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use regions_model::{run_regions, ROp};

fn step(u: &mut Unstructured) -> Result<ROp> {
    Ok(match u.int_in_range(0..=16)? {
        0..=5 => {
            let tag = u.int_in_range(0..=3)?;
            let log = u.int_in_range(8..=23)?;
            let extra = u.int_in_range(0..=4095usize)?;
            let base = 1usize << log;
            ROp::Alloc { tag, bytes: base + extra * (base / 4096).max(1) }
        }
        6..=8 => ROp::Free { pick: u.arbitrary()? },
        9..=11 => ROp::Fill { pick: u.arbitrary()? },
        12 | 13 => ROp::Sleep { tag: u.int_in_range(1..=3)?, backup: u.arbitrary()? },
        14 | 15 => ROp::Wake { tag: u.int_in_range(1..=3)? },
        _ => ROp::Trim,
    })
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let mut ops = Vec::new();
    while ops.len() < 120 {
        match step(&mut u) {
            Ok(s) => ops.push(s),
            Err(_) => break,
        }
    }
    if let Err(e) = run_regions(&ops) {
        panic!("{e}");
    }
});
