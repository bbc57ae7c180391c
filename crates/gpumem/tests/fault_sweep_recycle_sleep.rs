//! A fault sweep of paths the shared sweep (`fault_sweep.rs`) does not take
//! (PoolResource with `recycle_pieces`, VirtualPool sleep/wake with
//! several streams), checking after every step that the pool's reserve
//! matches what the driver holds, and that once every block is freed and
//! faults are cleared a `release` gives everything back *before* the drop
//! (memory neither live nor free would only come back on drop).

mod common;

use std::sync::Arc;

use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::pool::{Backup, Pool, PoolConfig, PoolResource, VirtualPool, VirtualPoolConfig};
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::{Device, DevicePtr};

const MIB: usize = 1 << 20;
const UNKNOWN: i32 = 999;

fn recycle_scenario(sim: &Arc<SimDriver>, device: &Device) -> Result<(), String> {
    let base = sim.device_bytes(0);
    let mut config = PoolConfig::default();
    config.expandable = true;
    config.recycle_pieces = true;
    let pool = PoolResource::new(DeviceResource::new(device.clone()), config)
        .map_err(|e| format!("new: {e}"));
    let Ok(pool) = pool else { return Ok(()) };
    let (Ok(s), Ok(t)) = (device.create_stream(), device.create_stream()) else {
        return Ok(());
    };
    let check = |pool: &PoolResource<DeviceResource>, at: &str| -> Result<(), String> {
        pool.check_invariants().map_err(|e| format!("{at}: {e}"))?;
        let held = sim.device_bytes(0) - base;
        if pool.reserved_bytes() != held {
            return Err(format!(
                "{at}: reserved {} but the driver holds {held}",
                pool.reserved_bytes()
            ));
        }
        Ok(())
    };
    let mut live: Vec<(DevicePtr, usize, usize)> = Vec::new();
    let streams = [&s, &t];
    let alloc = |live: &mut Vec<(DevicePtr, usize, usize)>, bytes, k: usize| {
        if let Ok(p) = pool.allocate(bytes, 256, streams[k]) {
            live.push((p, bytes, k));
        }
    };
    // Frees the live block of `bytes`, if its allocation succeeded.
    let free_sized = |live: &mut Vec<(DevicePtr, usize, usize)>, bytes| -> Result<(), String> {
        if let Some(i) = live.iter().position(|l| l.1 == bytes) {
            let (p, b, k) = live.remove(i);
            pool.deallocate(p, b, 256, streams[k])
                .map_err(|e| format!("free: {e}"))?;
        }
        Ok(())
    };
    alloc(&mut live, 128 * MIB, 0);
    alloc(&mut live, 4 * MIB, 0);
    check(&pool, "first")?;
    free_sized(&mut live, 128 * MIB)?;
    alloc(&mut live, 200 * MIB, 1);
    check(&pool, "recycled")?;
    let _ = pool.trim(0);
    check(&pool, "trim")?;
    alloc(&mut live, 64 * MIB, 0);
    alloc(&mut live, 30 * MIB, 1);
    check(&pool, "more")?;
    free_sized(&mut live, 200 * MIB)?;
    alloc(&mut live, 300 * MIB, 0);
    check(&pool, "regrow")?;
    let _ = pool.trim(0);
    check(&pool, "trim 2")?;
    for (p, b, k) in live.drain(..) {
        pool.deallocate(p, b, 256, streams[k])
            .map_err(|e| format!("free: {e}"))?;
    }
    sim.clear_faults();
    pool.release().map_err(|e| format!("release: {e}"))?;
    check(&pool, "released")?;
    if pool.reserved_bytes() != 0 || sim.device_bytes(0) != base || sim.mapped_bytes() != 0 {
        return Err(format!(
            "after release with nothing live: reserved {}, driver {} mapped {}",
            pool.reserved_bytes(),
            sim.device_bytes(0) - base,
            sim.mapped_bytes()
        ));
    }
    drop(pool);
    if sim.reserved_va_bytes() != 0 {
        return Err("address space left after drop".into());
    }
    Ok(())
}

fn sleep_scenario(sim: &Arc<SimDriver>, device: &Device) -> Result<(), String> {
    let pool = VirtualPool::new(device.clone(), VirtualPoolConfig::default())
        .map_err(|e| format!("new: {e}"));
    let Ok(pool) = pool else { return Ok(()) };
    let (Ok(s), Ok(t)) = (device.create_stream(), device.create_stream()) else {
        return Ok(());
    };
    let check = |pool: &VirtualPool, at: &str| -> Result<(), String> {
        pool.check_invariants().map_err(|e| format!("{at}: {e}"))?;
        if pool.reserved_bytes() != sim.physical_bytes() {
            return Err(format!(
                "{at}: reserved {} but the driver holds {}",
                pool.reserved_bytes(),
                sim.physical_bytes()
            ));
        }
        Ok(())
    };
    let streams = [&s, &t];
    let mut live: Vec<(DevicePtr, usize, usize)> = Vec::new();
    let alloc = |live: &mut Vec<(DevicePtr, usize, usize)>, tag: u32, bytes, k: usize| {
        if tag != 0 {
            pool.begin_region(tag).unwrap();
        }
        if let Ok(p) = pool.allocate(bytes, 256, streams[k]) {
            live.push((p, bytes, k));
        }
        if tag != 0 {
            pool.end_region().unwrap();
        }
    };
    alloc(&mut live, 1, 5 * MIB + 512, 0);
    alloc(&mut live, 0, 3 * MIB, 1);
    alloc(&mut live, 1, 9 * MIB + 256, 1);
    alloc(&mut live, 2, 7 * MIB, 0);
    alloc(&mut live, 0, MIB, 0);
    check(&pool, "allocs")?;
    // Free one on t, then sleep region 1 (backup) on s.
    if let Some(i) = live.iter().position(|l| l.1 == 3 * MIB) {
        let (p, b, _) = live.remove(i);
        pool.deallocate(p, b, 256, &t)
            .map_err(|e| format!("free: {e}"))?;
    }
    let _ = pool.sleep(1, Backup::HostPinned, &s);
    check(&pool, "sleep 1")?;
    let _ = pool.sleep(2, Backup::Discard, &t);
    check(&pool, "sleep 2")?;
    alloc(&mut live, 0, 12 * MIB, 1);
    let _ = pool.trim(0);
    check(&pool, "trim")?;
    let _ = pool.wake(1, &t);
    check(&pool, "wake 1")?;
    let _ = pool.wake(2, &s);
    check(&pool, "wake 2")?;
    for (p, b, k) in live.drain(..) {
        pool.deallocate(p, b, 256, streams[k])
            .map_err(|e| format!("free: {e}"))?;
    }
    sim.clear_faults();
    pool.release().map_err(|e| format!("release: {e}"))?;
    check(&pool, "released")?;
    if pool.reserved_bytes() != 0 || sim.physical_bytes() != 0 || sim.mapped_bytes() != 0 {
        return Err(format!(
            "after release with nothing live: reserved {}, physical {} mapped {}",
            pool.reserved_bytes(),
            sim.physical_bytes(),
            sim.mapped_bytes()
        ));
    }
    drop(pool);
    if sim.reserved_va_bytes() != 0 || sim.pinned_host_bytes() != 0 {
        return Err("address space or pinned memory left after drop".into());
    }
    Ok(())
}

fn sweep(name: &str, config: SimConfig, f: fn(&Arc<SimDriver>, &Device) -> Result<(), String>) {
    let (device, sim) = Device::sim_with_driver(config.clone());
    let c0 = sim.call_counts();
    f(&sim, &device).unwrap_or_else(|e| panic!("{name} dry run: {e}"));
    let c1 = sim.call_counts();
    drop(device);
    let mut failures = Vec::new();
    for (call, n) in &c1 {
        let before = c0.iter().find(|c| c.0 == *call).map_or(0, |c| c.1);
        for nth in 1..=(n - before) {
            let (device, sim) = Device::sim_with_driver(config.clone());
            sim.fail_call(call, nth, UNKNOWN);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&sim, &device)));
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failures.push(format!("{call} #{nth}: {e}")),
                Err(_) => failures.push(format!("{call} #{nth}: PANIC")),
            }
        }
    }
    assert!(failures.is_empty(), "{name}:\n{}", failures.join("\n"));
}

#[test]
fn recycle_sweep() {
    let mut config = SimConfig::default();
    config.capacity = 8 << 30;
    sweep("recycle", config, recycle_scenario);
}

#[test]
fn sleep_sweep() {
    let config = SimConfig::backed(64 * MIB);
    sweep("sleep", config, sleep_scenario);
}
