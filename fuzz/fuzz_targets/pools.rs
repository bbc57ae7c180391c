//! Every pool driven by any sequence of operations against the shared pool
//! model (`crates/gpumem/tests/common/model.rs`, the one the pool tests
//! use): allocations of any size on three streams, frees (from another
//! stream too), bad frees (double, interior, foreign, another size class),
//! work left pending on held streams, trims, releases. The model checks
//! that no two live blocks overlap, that every live block stays mapped,
//! that no memory freed on a stream serves another before that stream's
//! work is ordered, that the live bytes match, and that everything goes
//! back to the driver.
#![no_main]

#[path = "../../crates/gpumem/tests/common/model.rs"]
#[allow(dead_code)]
mod model;

use arbitrary::{Result, Unstructured};
use gpumem::pool::{
    BinningConfig, BinningResource, CachingPool, CachingPoolConfig, FixedSizeConfig,
    FixedSizeResource, PoolConfig, PoolResource, SegmentPool, VirtualPool, VirtualPoolConfig,
};
use gpumem::resource::DeviceResource;
use libfuzzer_sys::fuzz_target;
use model::{model_setup, run_model, Op};

/// One operation from the fuzzer's bytes; requests up to `2^max_log` bytes
/// plus 1023.
fn op(u: &mut Unstructured, max_log: u32) -> Result<Op> {
    let stream = u.int_in_range(0..=2)?;
    Ok(match u.int_in_range(0..=13)? {
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
        12 => match u.int_in_range(0..=2)? {
            0 => Op::Process,
            1 => Op::Trim,
            _ => Op::BadFree { pick: u.arbitrary()?, kind: u.int_in_range(0..=3)? },
        },
        _ => Op::BadFree { pick: u.arbitrary()?, kind: u.int_in_range(0..=3)? },
    })
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(kind) = u.int_in_range(0..=7u8) else { return };
    // The fixed-size pool serves blocks of 64 KiB and nothing larger.
    let max_log = if kind == 4 { 15 } else { 25 };
    let mut ops = Vec::new();
    while ops.len() < 200 {
        match op(&mut u, max_log) {
            Ok(o) => ops.push(o),
            Err(_) => break,
        }
    }
    let (device, sim, streams, base) = model_setup();
    let up = || DeviceResource::new(device.clone());
    let r = match kind {
        0 => run_model(PoolResource::with_defaults(up()).unwrap(), &sim, &streams, &ops),
        1 => {
            let mut c = PoolConfig::default();
            c.expandable = false;
            run_model(PoolResource::new(up(), c).unwrap(), &sim, &streams, &ops)
        }
        2 => run_model(VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap(), &sim, &streams, &ops),
        3 => run_model(
            VirtualPool::new(device.clone(), VirtualPoolConfig::nccl_ready(Vec::new())).unwrap(),
            &sim,
            &streams,
            &ops,
        ),
        4 => run_model(
            FixedSizeResource::new(up(), {
                let mut c = FixedSizeConfig::with_block_size(64 << 10);
                c.blocks_per_chunk = Some(16);
                c
            })
            .unwrap(),
            &sim,
            &streams,
            &ops,
        ),
        5 => run_model(BinningResource::new(up(), BinningConfig::default()).unwrap(), &sim, &streams, &ops),
        6 => run_model(CachingPool::new(up(), CachingPoolConfig::default()).unwrap(), &sim, &streams, &ops),
        _ => run_model(SegmentPool::new(up()).unwrap(), &sim, &streams, &ops),
    };
    if let Err(e) = r {
        panic!("pool {kind}: {e}");
    }
    sim.complete_all();
    assert_eq!(sim.device_bytes(0), base, "pool {kind}: every byte back to the driver");
});
