//! Data patterns and figures for the stress tests (of this crate and, by
//! path, of the C ABI's): every block's bytes name its thread and number.

use std::sync::atomic::{AtomicU64, Ordering};

/// The bytes of a block: a cheap generator seeded by (thread, number).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What a stress run did, counted by every thread.
#[derive(Default)]
pub struct Figures {
    /// Allocations and frees.
    pub ops: AtomicU64,
    /// Allocations refused for want of memory.
    pub ooms: AtomicU64,
    /// Bytes read back and found intact.
    pub bytes_verified: AtomicU64,
}

impl Figures {
    /// Counts an operation.
    pub fn op(&self) {
        self.ops.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an out-of-memory.
    pub fn oom(&self) {
        self.ooms.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts bytes found intact.
    pub fn verified(&self, bytes: usize) {
        self.bytes_verified
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The one-line report every stress test prints, then checks that it did
    /// work: `stress: NAME: T threads, N operations, S s, K out-of-memory, B
    /// bytes verified`.
    pub fn report(&self, name: &str, threads: usize, seconds: f64) {
        let (ops, ooms, verified) = (
            self.ops.load(Ordering::Relaxed),
            self.ooms.load(Ordering::Relaxed),
            self.bytes_verified.load(Ordering::Relaxed),
        );
        println!(
            "stress: {name}: {threads} threads, {ops} operations, {seconds:.1} s, \
             {ooms} out-of-memory, {verified} bytes verified"
        );
        assert!(ops > 0 && verified > 0, "{name}: the stress did work");
    }
}

/// Seconds per pool: `GPUMEM_STRESS_SECS`, default 1.
pub fn seconds() -> f64 {
    std::env::var("GPUMEM_STRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&s: &f64| s > 0.0)
        .unwrap_or(1.0)
}
