//! Writes passes of the `iterations` workload as one RMM log, so that tools
//! that take traces (`gpumem replay`, `examples/vpool_replay.rs` of the
//! `gpumem` crate) can run it. What a pass leaves live is freed at its end,
//! as `gpumem bench` does after the clock stops; those frees are written by
//! thread 2 (every other row by thread 1), so a replayer can leave them
//! untimed. Pass `p`'s addresses have `p` in their bits 40 and up.
//!
//! ```text
//! cargo run --release -p gpumem-cli --example iterations_trace -- \
//!     --vary 1.0 --passes 6 [--iterations 20] [--batch 4] [--seed 1] > out.rmm.csv
//! ```

use gpumem::trace::{write_csv, Action, TraceEvent};
use gpumem_cli::iterations::{generate, IterationsConfig, BATCH};

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut take = |flag: &str, default: f64| -> f64 {
        match args.iter().position(|a| a == flag) {
            Some(i) if i + 1 < args.len() => {
                let v = args[i + 1].parse().unwrap_or_else(|_| {
                    eprintln!("{flag}: not a number: {}", args[i + 1]);
                    std::process::exit(2)
                });
                args.drain(i..i + 2);
                v
            }
            _ => default,
        }
    };
    let cfg = IterationsConfig {
        vary: take("--vary", 0.0),
        iterations: take("--iterations", 20.0) as usize,
        batch: take("--batch", BATCH as f64) as usize,
        seed: take("--seed", 1.0) as u64,
    };
    let passes = take("--passes", 1.0) as usize;
    if !args.is_empty() {
        eprintln!("unknown arguments: {args:?}");
        std::process::exit(2);
    }
    let mut events = Vec::new();
    let mut time_us = 0;
    for pass in 0..passes {
        let p = generate(&cfg, pass);
        // Slots are reused once freed; each pass gets addresses of its own.
        let ptr = |slot: u32| ((pass as u64) << 40) | ((slot as u64 + 1) << 12);
        let mut live = vec![None; p.prep.slots];
        let mut event = |thread, action, slot: u32, size, stream| {
            time_us += 1;
            events.push(TraceEvent {
                thread,
                time_us,
                action,
                ptr: ptr(slot),
                size,
                stream,
            });
        };
        for op in &p.prep.ops {
            let stream = p.prep.streams[op.stream as usize];
            let action = if op.alloc {
                Action::Allocate
            } else {
                Action::Free
            };
            live[op.slot as usize] = op.alloc.then_some((op.size, stream));
            event(1, action, op.slot, op.size, stream);
        }
        for (slot, block) in live.iter().enumerate() {
            if let Some((size, stream)) = *block {
                event(2, Action::Free, slot as u32, size, stream);
            }
        }
    }
    if let Err(e) = write_csv(std::io::stdout().lock(), &events) {
        eprintln!("cannot write the trace: {e}");
        std::process::exit(1);
    }
}
