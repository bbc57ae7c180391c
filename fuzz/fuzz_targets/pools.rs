//! Every pool, and the adaptors over one, driven by any sequence of
//! operations against the shared pool model
//! (`crates/gpumem/tests/common/model.rs`, the one the pool tests use):
//! allocations of any size on three streams, frees (from another stream
//! too), bad frees (double, interior, foreign, another size), work left
//! pending on held streams, captures on stream 0, trims, and on a backed
//! device reads of what every block holds. The model checks that no two
//! live blocks overlap, that every live block stays mapped and keeps its
//! data, that no memory freed on a stream serves another before that
//! stream's work is ordered, that nothing a capture freed is handed out
//! again, that no call breaks a capture, that the live bytes (and the
//! adaptors' counters) match, and that everything goes back to the driver.
#![no_main]

// The model's data patterns (`super::pattern` there).
#[path = "../../crates/gpumem/tests/common/pattern.rs"]
#[allow(dead_code)]
mod pattern;
#[path = "../../crates/gpumem/tests/common/model.rs"]
#[allow(dead_code)]
mod model;

use arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use model::{max_log, run_kind, Op, KINDS};

/// One operation from the fuzzer's bytes; requests up to `2^max_log` bytes
/// plus 1023.
fn op(u: &mut Unstructured, max_log: u32) -> Result<Op> {
    let stream = u.int_in_range(0..=2)?;
    Ok(match u.int_in_range(0..=15)? {
        0..=5 => {
            let log = u.int_in_range(0..=max_log)?;
            let extra = u.int_in_range(0..=1023usize)?;
            let base = 1usize << log;
            Op::Alloc { stream, bytes: (base + extra % base).max(1) }
        }
        6..=8 => Op::Free { pick: u.arbitrary()?, stream },
        9 => Op::Touch { pick: u.arbitrary()? },
        10 => Op::Hold { stream },
        11 => Op::Release { stream },
        12 => match u.int_in_range(0..=1)? {
            0 => Op::Process,
            _ => Op::Trim,
        },
        13 => Op::Capture,
        14 => Op::Verify,
        _ => Op::BadFree { pick: u.arbitrary()?, kind: u.int_in_range(0..=3)? },
    })
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(kind) = u.int_in_range(0..=KINDS - 1) else { return };
    let Ok(backed) = u.arbitrary::<bool>() else { return };
    let mut ops = Vec::new();
    while ops.len() < 200 {
        match op(&mut u, max_log(kind)) {
            Ok(o) => ops.push(o),
            Err(_) => break,
        }
    }
    if let Err(e) = run_kind(kind, &ops, backed) {
        panic!("{e}");
    }
});
