//! VirtualPool regions against a model (shared by the sleep tests and the
//! `regions` fuzz target): allocations in regions, frees, fills, sleeps
//! with or without a backup, wakes and trims, on a backed simulated device.

use std::collections::HashMap;

use gpumem::driver::sim::SimConfig;
use gpumem::pool::{Backup, Pool, VirtualPool, VirtualPoolConfig, NO_REGION};
use gpumem::{Device, DeviceBuffer, Error};
use proptest::prelude::*;

const MIB: usize = 1 << 20;

type Buf<'a> = DeviceBuffer<u8, &'a VirtualPool>;

fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.0 + b.1 && b.0 < a.0 + a.1
}

/// One step of the regions model (tag 0: no region).
#[derive(Debug, Clone)]
pub enum ROp {
    Alloc { tag: u32, bytes: usize },
    Free { pick: usize },
    Fill { pick: usize },
    Sleep { tag: u32, backup: bool },
    Wake { tag: u32 },
    Trim,
}

/// A step, sizes from 256 B to 8 MiB and regions 0 to 3.
pub fn rop() -> impl Strategy<Value = ROp> {
    prop_oneof![
        6 => (0..4u32, 8..=23u32, 0..4096usize).prop_map(|(tag, log, extra)| {
            let base = 1usize << log;
            ROp::Alloc { tag, bytes: base + extra * (base / 4096).max(1) }
        }),
        3 => any::<usize>().prop_map(|pick| ROp::Free { pick }),
        3 => any::<usize>().prop_map(|pick| ROp::Fill { pick }),
        2 => (1..4u32, any::<bool>()).prop_map(|(tag, backup)| ROp::Sleep { tag, backup }),
        2 => (1..4u32).prop_map(|tag| ROp::Wake { tag }),
        1 => Just(ROp::Trim),
    ]
}

/// A live block of the model: its buffer, region and byte (`None`: undefined
/// after a discarding sleep).
struct Live<'a> {
    buf: Buf<'a>,
    tag: u32,
    byte: Option<u8>,
}

/// Random allocations in regions, frees, fills, sleeps and wakes against
/// a model: the pool's invariants hold after every step; allocating in a
/// region asleep, filling its blocks, sleeping it again or waking one
/// awake are refused exactly when the model says so; sleeping bytes are
/// the model's; live blocks never overlap (a sleeping block's addresses
/// are never handed out); a region woken from a backup holds what it
/// held; and everything goes back at the end.
pub fn run_regions(ops: &[ROp]) -> Result<(), TestCaseError> {
    let (device, sim) = Device::sim_with_driver(SimConfig::backed(48 * MIB));
    let p = VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap();
    let s = device.create_stream().unwrap();
    let mut live: Vec<Live> = Vec::new();
    // Regions asleep: tag -> whether a backup was kept.
    let mut asleep: HashMap<u32, bool> = HashMap::new();
    let mut next = 0u8;
    for op in ops {
        match *op {
            ROp::Alloc { tag, bytes } => {
                if tag != NO_REGION {
                    p.begin_region(tag).unwrap();
                }
                let r = DeviceBuffer::<u8, _>::new(bytes.min(8 * MIB), &p, &s);
                if tag != NO_REGION {
                    p.end_region().unwrap();
                }
                match r {
                    Ok(buf) => {
                        prop_assert!(!asleep.contains_key(&tag), "allocated in a region asleep");
                        let at = (buf.as_device_ptr().0, buf.len() as u64);
                        for l in &live {
                            let o = (l.buf.as_device_ptr().0, l.buf.len() as u64);
                            prop_assert!(!overlaps(at, o), "{at:#x?} overlaps {o:#x?}");
                        }
                        next = next % 250 + 1;
                        buf.memset_async(next).unwrap();
                        live.push(Live {
                            buf,
                            tag,
                            byte: Some(next),
                        });
                    }
                    Err(Error::Asleep { tag: t, .. }) => {
                        prop_assert_eq!(t, tag);
                        prop_assert!(asleep.contains_key(&tag));
                    }
                    Err(e) if e.is_oom() => {}
                    Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
                }
            }
            ROp::Free { pick } => {
                if !live.is_empty() {
                    drop(live.swap_remove(pick % live.len()));
                }
            }
            ROp::Fill { pick } => {
                let n = live.len().max(1);
                if let Some(l) = live.get_mut(pick % n) {
                    next = next % 250 + 1;
                    match l.buf.memset_async(next) {
                        Ok(()) => {
                            prop_assert!(!asleep.contains_key(&l.tag));
                            l.byte = Some(next);
                        }
                        Err(Error::Asleep { .. }) => prop_assert!(asleep.contains_key(&l.tag)),
                        Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
                    }
                }
            }
            ROp::Sleep { tag, backup } => {
                let how = if backup {
                    Backup::HostPinned
                } else {
                    Backup::Discard
                };
                match p.sleep(tag, how, &s) {
                    Ok(_) => {
                        prop_assert!(!asleep.contains_key(&tag));
                        asleep.insert(tag, backup);
                    }
                    Err(Error::InvalidArgument(_)) => prop_assert!(asleep.contains_key(&tag)),
                    Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
                }
            }
            ROp::Wake { tag } => match p.wake(tag, &s) {
                Ok(_) => {
                    let backup = asleep.remove(&tag);
                    prop_assert!(backup.is_some(), "woke a region awake");
                    if backup == Some(false) {
                        for l in live.iter_mut().filter(|l| l.tag == tag) {
                            l.byte = None;
                        }
                    }
                }
                Err(Error::InvalidArgument(_)) => prop_assert!(!asleep.contains_key(&tag)),
                Err(e) if e.is_oom() => prop_assert!(asleep.contains_key(&tag)),
                Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
            },
            ROp::Trim => {
                p.trim(0).unwrap();
            }
        }
        p.check_invariants().map_err(TestCaseError::fail)?;
        for tag in 1..4u32 {
            let model: usize = if asleep.contains_key(&tag) {
                live.iter()
                    .filter(|l| l.tag == tag)
                    .map(|l| l.buf.len().next_multiple_of(256))
                    .sum()
            } else {
                0
            };
            prop_assert_eq!(p.sleeping_bytes(tag), model, "region {}", tag);
            prop_assert_eq!(p.is_asleep(tag), asleep.contains_key(&tag));
        }
    }
    for tag in asleep.keys().copied().collect::<Vec<_>>() {
        if p.wake(tag, &s).is_ok() && !asleep[&tag] {
            for l in live.iter_mut().filter(|l| l.tag == tag) {
                l.byte = None;
            }
        }
    }
    for l in &live {
        if let (Some(byte), false) = (l.byte, p.is_asleep(l.tag)) {
            let got = l.buf.to_vec().unwrap();
            prop_assert!(got.iter().all(|&x| x == byte), "a block lost its contents");
        }
    }
    prop_assert_eq!(sim.data_stats().faults, 0);
    drop(live);
    drop(p);
    prop_assert_eq!(sim.physical_bytes(), 0);
    prop_assert_eq!(sim.mapped_bytes(), 0);
    prop_assert_eq!(sim.pinned_host_bytes(), 0);
    Ok(())
}
