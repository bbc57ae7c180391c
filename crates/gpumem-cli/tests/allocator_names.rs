//! One name, one meaning: the command's allocator `NAME+K=V` is what
//! `GPUMEM_CONF=resource=NAME,K=V` serves through the C ABI, settings after
//! `+` are `GPUMEM_CONF`'s own (and refused with its own errors), and the
//! command's old names say what they are called now.

use std::sync::Arc;

use gpumem::driver::sim::SimDriver;
use gpumem::driver::Driver;
use gpumem::pool::Spread;
use gpumem::resource::DEFAULT_ALIGNMENT;
use gpumem::{Device, DevicePtr, Stream};
use gpumem_capi::conf::{parse, ResourceKind};
use gpumem_capi::{Allocator as CapiAllocator, Backend};
use gpumem_cli::allocators::{self, AllocatorSpec, RENAMED};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// A fixed sequence: `Some(bytes)` allocates, `None` frees the oldest
/// live block. Sizes of several classes (small, 1-2 MiB, above 10 MiB) so
/// the pools take several kinds of memory.
const STEPS: &[Option<usize>] = &[
    Some(MIB),
    Some(100),
    Some(3 * MIB),
    Some(64 * KIB),
    Some(20 * MIB),
    None,
    Some(2 * MIB),
    None,
    Some(512),
    None,
    None,
    None,
    None,
    None,
];

/// What is observed after each step: the reserve the allocator reports,
/// the bytes the simulated driver has given out, and the driver allocation
/// and free calls counted.
type Observed = (usize, usize, u64, u64);

/// A fresh simulated driver, as the C ABI's `Backend::sim` makes one.
fn sim_driver() -> Arc<SimDriver> {
    match Backend::sim() {
        Backend::Sim(sim) => sim,
        _ => unreachable!("Backend::sim is simulated"),
    }
}

/// The sequence through the C ABI's state configured by `GPUMEM_CONF`
/// text `conf`; the last entry is after `empty_cache`.
fn through_capi(conf: &str) -> (ResourceKind, Vec<Observed>) {
    let parsed = parse(conf);
    assert!(parsed.problems.is_empty(), "{conf}: {:?}", parsed.problems);
    let backend = Backend::sim();
    let Backend::Sim(sim) = backend.clone() else {
        unreachable!()
    };
    let a = CapiAllocator::new(parsed.conf, backend);
    let observe = |a: &CapiAllocator| {
        let s = a.device_stats(0).unwrap();
        (
            a.reserved_bytes(0),
            sim.device_bytes(0),
            s.num_device_alloc as u64,
            s.num_device_free as u64,
        )
    };
    let mut live: Vec<(DevicePtr, usize)> = Vec::new();
    let mut seen = Vec::new();
    for step in STEPS {
        match *step {
            Some(bytes) => {
                let p = a.malloc(bytes, 0, 0);
                assert!(!p.is_null(), "{conf}: {bytes}");
                live.push((p, bytes));
            }
            None => {
                let (p, bytes) = live.remove(0);
                a.free(p, bytes, 0, 0);
            }
        }
        seen.push(observe(&a));
    }
    a.empty_cache(0);
    seen.push(observe(&a));
    (a.resource_kind(0).unwrap(), seen)
}

/// The same sequence through the command's allocator `name`, on the
/// legacy default stream (the C ABI's stream 0).
fn through_cli(name: &str) -> (ResourceKind, Vec<Observed>) {
    let specs = allocators::select(&[name.to_string()]).unwrap();
    let sim = sim_driver();
    let driver: Arc<dyn Driver> = sim.clone();
    let device = Device::new(driver, 0).unwrap();
    let alloc = specs[0].build(&device).unwrap();
    let stream = Stream::legacy(device.clone());
    let observe = |alloc: &allocators::Allocator| {
        let d = alloc.served().driver_stats();
        (
            alloc.pool.reserved_bytes(),
            sim.device_bytes(0),
            d.device_allocs,
            d.device_frees,
        )
    };
    let mut live: Vec<(DevicePtr, usize)> = Vec::new();
    let mut seen = Vec::new();
    for step in STEPS {
        match *step {
            Some(bytes) => {
                let p = alloc
                    .resource
                    .allocate(bytes, DEFAULT_ALIGNMENT, &stream)
                    .unwrap();
                live.push((p, bytes));
            }
            None => {
                let (p, bytes) = live.remove(0);
                alloc
                    .resource
                    .deallocate(p, bytes, DEFAULT_ALIGNMENT, &stream)
                    .unwrap();
            }
        }
        seen.push(observe(&alloc));
    }
    alloc.pool.release().unwrap();
    seen.push(observe(&alloc));
    (alloc.served().kind(), seen)
}

/// `name` (`R+K=V+...`) and `GPUMEM_CONF=conf` reserve, take from the
/// driver and call it alike, step by step.
fn assert_same(name: &str, conf: &str) {
    let (cli_kind, cli) = through_cli(name);
    let (capi_kind, capi) = through_capi(conf);
    assert_eq!(cli_kind, capi_kind, "{name} / {conf}");
    assert_eq!(
        cli, capi,
        "{name} / {conf}: (reserved, driver bytes, allocs, frees) per step"
    );
    // The sequence made the resource take memory at all.
    assert!(cli.iter().any(|o| o.0 > 0 && o.1 > 0), "{name}: {cli:?}");
}

#[test]
fn every_resource_name_is_the_resource_gpumem_conf_builds() {
    // The names are GPUMEM_CONF's, in its order, and `all` is each with
    // its defaults.
    let names: Vec<&str> = ResourceKind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(allocators::names(), names);
    let all = allocators::select(&[]).unwrap();
    assert_eq!(all, allocators::select(&["all".into()]).unwrap());
    assert_eq!(all.len(), ResourceKind::ALL.len());
    for (spec, kind) in all.iter().zip(ResourceKind::ALL) {
        assert_eq!(spec.name, kind.name());
        assert_eq!(spec.conf, parse(&format!("resource={kind}")).conf, "{kind}");
        assert_eq!(spec, &AllocatorSpec::parse(kind.name()).unwrap());
    }
    // And each behaves as the C ABI's resource of that name.
    for kind in ResourceKind::ALL {
        assert_same(kind.name(), &format!("resource={kind}"));
    }
}

#[test]
fn settings_after_plus_are_gpumem_conf_settings_and_applied() {
    for (name, conf) in [
        ("pool+expandable=false", "resource=pool,expandable=false"),
        ("pool+recycle=true", "resource=pool,recycle=true"),
        (
            "pool+expandable=false+spread=always+shards=2",
            "resource=pool,expandable=false,spread=always,shards=2",
        ),
        ("vpool+spread=always", "resource=vpool,spread=always"),
        ("vpool+nccl_ready=true", "resource=vpool,nccl_ready=true"),
        (
            "binning+expandable=false+min_bin=512+max_bin=64KiB",
            "resource=binning,expandable=false,min_bin=512,max_bin=64KiB",
        ),
        (
            "arena+initial_size=64MiB",
            "resource=arena,initial_size=64MiB",
        ),
        (
            "async+release_threshold=0",
            "resource=async,release_threshold=0",
        ),
        ("caching+max_size=1GiB", "resource=caching,max_size=1GiB"),
        // Case and spaces as GPUMEM_CONF takes them.
        ("Pool + Expandable=False", "resource=pool,expandable=false"),
    ] {
        let spec = AllocatorSpec::parse(name).unwrap();
        assert_eq!(spec.name, name.trim(), "the name is kept as given");
        assert_eq!(spec.conf, parse(conf).conf, "{name}");
        assert_same(name, conf);
    }
    // The settings change what is built: separate regions instead of one
    // growing range, an arena of exactly the size asked for, a cap.
    let (_, grown) = through_cli("pool");
    let (_, regions) = through_cli("pool+expandable=false");
    assert_ne!(grown, regions);
    let (_, arena) = through_cli("arena+initial_size=64MiB");
    assert_eq!(arena[0].0, 64 * MIB);
    let device = Device::new(sim_driver(), 0).unwrap();
    let capped = AllocatorSpec::parse("caching+max_size=8MiB")
        .unwrap()
        .build(&device)
        .unwrap();
    let stream = Stream::legacy(device.clone());
    assert!(capped
        .resource
        .allocate(16 * MIB, DEFAULT_ALIGNMENT, &stream)
        .is_err());
    let vpool = AllocatorSpec::parse("vpool+nccl_ready=true")
        .unwrap()
        .build(&device)
        .unwrap();
    assert!(vpool.served().virtual_pool().unwrap().config().nccl_ready);
}

#[test]
fn bad_settings_are_refused_with_gpumem_conf_s_own_error() {
    for name in [
        "pool+nccl_ready=true",
        "vpool+expandable=false",
        "pool+colour=blue",
        "pool+shards=many",
        "pool+resource=vpool",
        "pool+recycle=true+expandable=false",
        "pool+junk",
        "nope",
        "arena+initial_size=1",
    ] {
        let conf = allocators::conf_text(name);
        let problems = parse(&conf).problems;
        assert!(!problems.is_empty(), "{name}: {conf} should be invalid");
        let err = AllocatorSpec::parse(name).unwrap_err().to_string();
        assert!(err.contains(&format!("allocator {name:?}")), "{err}");
        assert!(err.contains(&format!("GPUMEM_CONF={conf:?}")), "{err}");
        for p in &problems {
            assert!(err.contains(p.as_str()), "{name}: {err} lacks {p}");
        }
        // The whole `--alloc` list fails on it.
        assert!(allocators::select(&["pool".into(), name.into()]).is_err());
    }
    let err = AllocatorSpec::parse("nope").unwrap_err().to_string();
    assert!(
        err.contains("unknown resource \"nope\" (expected one of pool, caching, binning, arena, async, vpool, cuda)"),
        "{err}"
    );
    // GPUMEM_CONF's log is the C ABI's; the command has `replay --log`.
    let err = AllocatorSpec::parse("pool+log=job.csv")
        .unwrap_err()
        .to_string();
    assert!(err.contains("gpumem replay --log"), "{err}");
    // Commas separate allocators, never settings.
    let err = AllocatorSpec::parse("pool+shards=1,spread=always")
        .unwrap_err()
        .to_string();
    assert!(err.contains("after +"), "{err}");
}

#[test]
fn old_names_say_their_spelling_now() {
    let olds: Vec<&str> = RENAMED.iter().map(|(old, _)| *old).collect();
    assert_eq!(
        olds,
        [
            "cuda-async",
            "pool-expandable",
            "pool-recycling",
            "pool-sharded",
            "vpool-sharded"
        ]
    );
    for (old, new) in RENAMED {
        for given in [
            old.to_string(),
            old.to_uppercase(),
            format!("{old}+shards=1"),
        ] {
            let err = AllocatorSpec::parse(&given).unwrap_err().to_string();
            assert!(
                err.contains(&format!("allocator {old:?} is now {new:?}")),
                "{given}: {err}"
            );
            assert!(err.contains("pool+expandable=false"), "{err}");
        }
        AllocatorSpec::parse(new).unwrap_or_else(|e| panic!("{new}: {e}"));
    }
    // What each new spelling builds is what the old name built.
    let conf = |name: &str| AllocatorSpec::parse(name).unwrap().conf;
    assert_eq!(conf("async").resource, ResourceKind::Async);
    assert_eq!(conf("async").release_threshold, u64::MAX);
    let expandable = conf("pool");
    assert!(expandable.expandable && !expandable.recycle);
    let recycling = conf("pool+recycle=true");
    assert!(recycling.expandable && recycling.recycle);
    let sharded = conf("pool+expandable=false+spread=always");
    assert!(!sharded.expandable && sharded.spread == Spread::Always);
    let vsharded = conf("vpool+spread=always");
    assert_eq!(
        (vsharded.resource, vsharded.spread),
        (ResourceKind::Virtual, Spread::Always)
    );
    // The old `pool`, regions of their own.
    assert!(!conf("pool+expandable=false").expandable);
}
