//! What the C ABI's tests over [`Allocator`] values share: an allocator per
//! configuration on its own simulated driver, and that driver.
#![allow(dead_code)]

use std::sync::Arc;

pub mod foreign;
pub mod wide_sizes;

use gpumem::driver::sim::SimDriver;
use gpumem_capi::conf::{parse, ResourceKind};
use gpumem_capi::{gpumem_device_stats_t, gpumem_stat_t, Allocator, Backend};

pub const MIB: usize = 1 << 20;

/// Captures (and MemPool contexts) are the process's, and deferred frees
/// and empty_cache wait while any is under way: a test binary whose tests
/// begin them runs them one at a time, each holding this.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// An allocator serving `text` (which must be valid) on a fresh simulated
/// driver.
pub fn allocator(text: &str) -> Allocator {
    let parsed = parse(text);
    assert!(parsed.problems.is_empty(), "{text}: {:?}", parsed.problems);
    Allocator::new(parsed.conf, Backend::sim())
}

/// The simulated driver behind `a`.
pub fn sim(a: &Allocator) -> Arc<SimDriver> {
    match a.backend() {
        Backend::Sim(s) => s.clone(),
        _ => panic!("these tests run on the simulated device"),
    }
}

/// Every resource kind.
pub fn kinds() -> Vec<ResourceKind> {
    ResourceKind::ALL.to_vec()
}

/// The statistics of device `d` (which must be in range).
pub fn stats(a: &Allocator, d: i32) -> gpumem_device_stats_t {
    a.device_stats(d).expect("device in range")
}

/// The statistics of `s` that are PyTorch's `StatArray`s, by name.
pub fn named(s: &gpumem_device_stats_t) -> [(&'static str, gpumem_stat_t); 7] {
    [
        ("allocation", s.allocation),
        ("segment", s.segment),
        ("active", s.active),
        ("allocated_bytes", s.allocated_bytes),
        ("requested_bytes", s.requested_bytes),
        ("reserved_bytes", s.reserved_bytes),
        ("active_bytes", s.active_bytes),
    ]
}
