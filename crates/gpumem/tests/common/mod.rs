//! Shared test support: backend selection from the environment and the resource
//! suite that every memory resource must pass.
#![allow(dead_code)]

pub mod bad_free;
pub mod expandable;
pub mod model;
pub mod pattern;
pub mod regions_model;
pub mod suite;
pub mod threads;

use std::sync::Arc;

use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::pool::FixedSizeConfig;
use gpumem::Device;

/// The device the tests run on: the simulated device by default, the real GPU
/// when `GPUMEM_DEVICE=cuda`. `backed` asks the simulated device for host memory
/// behind its addresses (small capacity) so data can be checked.
pub fn device(backed: bool) -> (Device, Option<Arc<SimDriver>>) {
    let config = if backed {
        SimConfig::backed(512 << 20)
    } else {
        SimConfig::default()
    };
    Device::from_env(config).expect("GPUMEM_DEVICE names a usable backend")
}

/// Two devices of one driver: devices 0 and 1 of a simulated driver with
/// two (configured by `sim`) by default; with `GPUMEM_DEVICE=cuda`, the
/// first two GPUs, or `None` (and a note) where there is only one.
pub fn two_devices(mut sim: SimConfig) -> Option<(Device, Device, Option<Arc<SimDriver>>)> {
    sim.devices = sim.devices.max(2);
    let (d0, s) = Device::from_env(sim).expect("GPUMEM_DEVICE names a usable backend");
    match d0.sibling(if d0.ordinal() == 0 { 1 } else { 0 }) {
        Ok(d1) => Some((d0, d1, s)),
        Err(_) => {
            eprintln!("one device: the multi-device test needs two, skipped");
            None
        }
    }
}

/// The simulated driver, or `None` (and a note) when running on the real GPU:
/// for tests that need the simulator's controls.
pub fn sim_only(sim: Option<Arc<SimDriver>>, test: &str) -> Option<Arc<SimDriver>> {
    if sim.is_none() {
        eprintln!("{test}: simulator-only test, skipped on the real GPU");
    }
    sim
}

/// `N` new streams of `device`.
pub fn streams<const N: usize>(device: &Device) -> [gpumem::Stream; N] {
    std::array::from_fn(|_| device.create_stream().expect("stream"))
}

/// Blocks of `block_size` bytes, `blocks_per_chunk` to an upstream chunk.
pub fn fixed_size_config(block_size: usize, blocks_per_chunk: usize) -> FixedSizeConfig {
    let mut config = FixedSizeConfig::with_block_size(block_size);
    config.blocks_per_chunk = Some(blocks_per_chunk);
    config
}

/// Deterministic random bytes for data checks.
pub fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    // SmallRng fills eight bytes per step: tens of MiB stay cheap in debug
    // builds, where a call per byte took most of the suite's time.
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    let mut out = vec![0u8; n];
    rng.fill_bytes(&mut out);
    out
}
