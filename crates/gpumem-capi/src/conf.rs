//! `GPUMEM_CONF`: which resource serves the C ABI, and its sizes and limits.
//!
//! The form is `key=value,key=value`, read once, at the first call into the
//! library; `gpumem_configure` sets it instead, in the same form, until the
//! first allocation. Keys and values are case-insensitive (except the `log`
//! file name); spaces around them are ignored; an empty string (or no
//! variable) gives every default.
//!
//! | key | values | default | meaning |
//! |---|---|---|---|
//! | `resource` | `pool`, `caching`, `binning`, `arena`, `async`, `vpool`, `cuda` | `pool` | what serves each device (see below) |
//! | `initial_size` | size | `0` | bytes the pool takes up front (`pool`, `binning`, `async`); `arena`: the arena's size |
//! | `max_size` | size or `none` | `none` | most bytes taken from the driver per device (`vpool`: physical bytes); past it, allocations fail (NULL) |
//! | `release_threshold` | size or `max` | `max` | `async` only: bytes the CUDA pool keeps at a synchronize |
//! | `min_bin`, `max_bin` | size, a power of two | `256B`, `1MiB` | `binning` only: smallest and largest fixed-size bin |
//! | `shards` | a count, `0` for one per CPU | `0` | `pool`, `binning`, `vpool`: lock shards of the pool (`PoolConfig::shards`, `VirtualPoolConfig::shards`): threads that allocate at the same time stop waiting for each other, but each shard keeps the free space of its partly used regions (`vpool`: its own physical memory); `1` is one lock |
//! | `spread` | `contended`, `always` | `contended` | `pool`, `binning`, `vpool`: when threads spread over the shards (`PoolConfig::spread`): once one lock is contended often, or from the start (under PyTorch, whose autograd thread allocates beside the main thread, one shard per CPU in use from the start reserved 11-22% more on GPT-2) |
//! | `expandable` | `true`, `false` | `true` | `pool`, `binning`: each heap of the pool grows one address range in place (`PoolConfig::expandable`, through CUDA's virtual memory management) instead of taking separate `cuMemAlloc` regions: leaner on the shared traces and the `iterations` workload, at the same speed once grown (`docs/decisions.md`). `false` where memory must be `cuMemAlloc`'s: CUDA IPC of gpumem memory (`cudaIpcGetMemHandle`, as PyTorch's MemPool mode with `torch.multiprocessing` or CuPy's IPC use) does not accept VMM memory |
//! | `recycle` | `true`, `false` | `false` | `pool`, `binning`, with `expandable=true`: before a heap's range grows, pieces of its ranges lying wholly in free blocks move to the range's end instead of new memory being created (`PoolConfig::recycle_pieces`). PyTorch's GPT-2 training holds less with it at the same speed; a workload that empties the pool and refills it in another order moves pieces every pass, several times slower (`docs/decisions.md`). It waits for the pool's streams before a piece free on one of them moves, and moves nothing during a graph capture |
//! | `nccl_ready` | `true`, `false` | `false` | `vpool` only: the NCCL-ready mode (`VirtualPoolConfig::nccl_ready`): every block one physical allocation of its own, POSIX-fd exportable, RDMA-capable where the device can, read-write for every device that can reach it; blocks are rounded up to whole pages (the device's VMM granularity) |
//! | `log` | a file name (no comma) | none | writes every allocation and free of the C ABI as RMM's CSV log, for `gpumem replay` and `gpumem plot`: device 0 to the file, device N > 0 to the name with `-devN` before its extension (`job.csv`, `job-dev1.csv`) |
//!
//! Resources: `pool` is gpumem's coalescing TLSF pool (`PoolResource`);
//! `caching` the size-class caching pool (`CachingPool`); `binning`
//! fixed-size bins over a `PoolResource` (`BinningResource`); `cuda` plain
//! `cuMemAlloc`/`cuMemFree` (no caching); `arena` gpumem's arena
//! (`ArenaResource`: one region taken whole at the start, of `initial_size`
//! bytes, else `max_size`, else half the device's free memory); `async`
//! CUDA's stream-ordered pool (`AsyncResource`, `cudaMallocAsync`), with
//! `max_size` as the pool's maximum size; `vpool` gpumem's pool on virtual
//! memory (`VirtualPool`: physical pages only under live blocks, moved by
//! aliasing), with `max_size` as its most physical memory.
//!
//! Sizes are read by [`gpumem::units::parse_size`], as everywhere in
//! gpumem: `K`, `KiB`, `M`, `MiB`, ... are powers of 1024, `KB`, `MB`, ...
//! powers of 1000. `70GiB`, `1.5G` and `512MB` are sizes.
//!
//! The log file is created when the configuration is read (a name that
//! cannot be created makes the configuration invalid) and written from the
//! first allocation on the device; lines are buffered and flushed at exit.
//!
//! A bad configuration is an error that cannot be missed, never a silent
//! default: an unknown key, a value that is not valid for its key, a key
//! given twice, entries that contradict each other, or a key that means
//! nothing for the chosen resource make the whole configuration invalid. The library then serves
//! nothing: it says so on stderr (`gpumem: GPUMEM_CONF="..." is invalid:
//! ...`), every allocation returns NULL (reported), and
//! `gpumem_config_error()` returns the text, which the Python helpers raise as
//! `ValueError` before they install the allocator.

use gpumem::pool::Spread;
use gpumem::units::parse_size;
use std::fmt;
use std::path::{Path, PathBuf};

/// Environment variable holding the configuration.
pub const CONF_ENV: &str = "GPUMEM_CONF";

/// Which resource serves allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResourceKind {
    /// `PoolResource`: coalescing best fit over TLSF lanes (the default).
    #[default]
    Pool,
    /// `CachingPool`: power-of-two size classes up to 2 GiB, eighths above.
    Caching,
    /// `BinningResource`: fixed-size bins over a `PoolResource`.
    Binning,
    /// `ArenaResource`: per-stream arenas over a global arena.
    Arena,
    /// `AsyncResource`: CUDA's stream-ordered pool (`cudaMallocAsync`).
    Async,
    /// `VirtualPool`: CUDA virtual memory, pages mapped under live blocks.
    Virtual,
    /// Plain `cuMemAlloc`/`cuMemFree`.
    Cuda,
}

impl ResourceKind {
    /// Every kind, in the order the documentation lists them.
    pub const ALL: [ResourceKind; 7] = [
        ResourceKind::Pool,
        ResourceKind::Caching,
        ResourceKind::Binning,
        ResourceKind::Arena,
        ResourceKind::Async,
        ResourceKind::Virtual,
        ResourceKind::Cuda,
    ];

    /// The name used in `GPUMEM_CONF`.
    pub fn name(self) -> &'static str {
        match self {
            ResourceKind::Pool => "pool",
            ResourceKind::Caching => "caching",
            ResourceKind::Binning => "binning",
            ResourceKind::Arena => "arena",
            ResourceKind::Async => "async",
            ResourceKind::Virtual => "vpool",
            ResourceKind::Cuda => "cuda",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Every name, as a list for messages: `pool, caching, ..., cuda`.
    pub fn names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The parsed configuration. `Default` gives the documented defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conf {
    /// Which resource serves each device.
    pub resource: ResourceKind,
    /// Bytes taken up front (pool, binning, async).
    pub initial_size: usize,
    /// Most bytes taken from the driver per device; `None`: no limit.
    pub max_size: Option<usize>,
    /// `async` only: the CUDA pool's release threshold (default `u64::MAX`).
    pub release_threshold: u64,
    /// `binning` only: smallest bin (a power of two, default 256 B).
    pub min_bin: usize,
    /// `binning` only: largest bin (a power of two, default 1 MiB).
    pub max_bin: usize,
    /// `pool`, `binning`, `vpool`: lock shards (`PoolConfig::shards`; default 0, one
    /// per CPU).
    pub shards: usize,
    /// `pool`, `binning`, `vpool`: when threads spread over the shards
    /// (`PoolConfig::spread`; default on contention).
    pub spread: Spread,
    /// `pool`, `binning`: expandable heaps (`PoolConfig::expandable`;
    /// default true).
    pub expandable: bool,
    /// `pool`, `binning` with expandable heaps: recycle free pieces into a
    /// growth (`PoolConfig::recycle_pieces`; default false).
    pub recycle: bool,
    /// `vpool` only: the NCCL-ready mode (default false).
    pub nccl_ready: bool,
    /// Where to write RMM's CSV log of every allocation and free (device 0;
    /// see [`log_path`] for the others); `None`: no log.
    pub log: Option<PathBuf>,
}

impl Default for Conf {
    fn default() -> Self {
        Self {
            resource: ResourceKind::Pool,
            initial_size: 0,
            max_size: None,
            release_threshold: u64::MAX,
            min_bin: 256,
            max_bin: 1 << 20,
            shards: 0,
            spread: Spread::OnContention,
            expandable: true,
            recycle: false,
            nccl_ready: false,
            log: None,
        }
    }
}

impl fmt::Display for Conf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "resource={}", self.resource)?;
        write!(f, ",initial_size={}", self.initial_size)?;
        match self.max_size {
            Some(m) => write!(f, ",max_size={m}")?,
            None => write!(f, ",max_size=none")?,
        }
        match self.resource {
            ResourceKind::Async if self.release_threshold == u64::MAX => {
                write!(f, ",release_threshold=max")?
            }
            ResourceKind::Async => write!(f, ",release_threshold={}", self.release_threshold)?,
            ResourceKind::Binning => {
                write!(f, ",min_bin={},max_bin={}", self.min_bin, self.max_bin)?
            }
            _ => {}
        }
        if self.shards != 0 {
            write!(f, ",shards={}", self.shards)?;
        }
        if self.spread == Spread::Always {
            write!(f, ",spread=always")?;
        }
        if !self.expandable {
            write!(f, ",expandable=false")?;
        }
        if self.recycle {
            write!(f, ",recycle=true")?;
        }
        if self.nccl_ready {
            write!(f, ",nccl_ready=true")?;
        }
        if let Some(log) = &self.log {
            write!(f, ",log={}", log.display())?;
        }
        Ok(())
    }
}

/// The log file of `device` for the configured name `log`: the name itself
/// for device 0, else the name with `-devN` before its extension.
pub fn log_path(log: &Path, device: u32) -> PathBuf {
    if device == 0 {
        return log.to_path_buf();
    }
    let stem = log.file_stem().map(|s| s.to_string_lossy().into_owned());
    let name = match (stem, log.extension()) {
        (Some(stem), Some(ext)) => format!("{stem}-dev{device}.{}", ext.to_string_lossy()),
        (Some(stem), None) => format!("{stem}-dev{device}"),
        (None, _) => format!("gpumem-dev{device}.csv"),
    };
    log.with_file_name(name)
}

/// A parsed configuration and the problems found on the way (each a short
/// phrase). Any problem makes the configuration invalid (see
/// [`Parsed::error`]); `conf` then holds what could be read, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The text parsed.
    pub text: String,
    /// The configuration, valid when there are no problems.
    pub conf: Conf,
    /// What was wrong, in input order.
    pub problems: Vec<String>,
}

impl Parsed {
    /// Checks what parsing cannot: that the log file can be created (it is,
    /// empty, when it did not exist). A failure is one more problem.
    pub fn check_files(mut self) -> Self {
        if let Some(log) = &self.conf.log {
            let opened = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(log);
            if let Err(e) = opened {
                self.problems
                    .push(format!("log: cannot create {}: {e}", log.display()));
            }
        }
        self
    }

    /// The configuration error, one line naming the text and every problem;
    /// `None` when the configuration is valid.
    pub fn error(&self) -> Option<String> {
        self.error_as(&format!("{CONF_ENV}={:?}", self.text))
    }

    /// [`Parsed::error`] naming the configuration `what` (such as
    /// `GPUMEM_CONF="..."`) rather than the variable.
    pub fn error_as(&self, what: &str) -> Option<String> {
        (!self.problems.is_empty())
            .then(|| format!("{what} is invalid: {}", self.problems.join("; ")))
    }
}

/// A true/false value of `key`.
fn flag(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "{key}={value}: expected true or false (also accepted: 1 or 0, yes or no, on or off)"
        )),
    }
}

/// Parses `GPUMEM_CONF`'s text. Problems are collected, not fatal here: the
/// caller refuses a configuration with any ([`Parsed::error`]).
pub fn parse(text: &str) -> Parsed {
    let mut conf = Conf::default();
    let mut problems = Vec::new();
    let mut release_threshold_set = false;
    let mut bins_set = false;
    let mut expandable_set = false;
    let mut initial_set = false;
    let mut seen: Vec<String> = Vec::new();
    for entry in text.split(',') {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let Some((key, value)) = entry.split_once('=') else {
            problems.push(format!("{entry:?} is not key=value"));
            continue;
        };
        let key = key.trim().to_ascii_lowercase();
        if seen.contains(&key) {
            // Which one was meant cannot be known: neither wins.
            problems.push(format!("{key} is given more than once"));
            continue;
        }
        seen.push(key.clone());
        let raw_value = value.trim();
        let value = raw_value.to_ascii_lowercase();
        let result: Result<(), String> = match key.as_str() {
            "log" if raw_value.is_empty() => Err("log needs a file name".into()),
            "log" => {
                conf.log = Some(PathBuf::from(raw_value));
                Ok(())
            }
            "resource" => match ResourceKind::parse(&value) {
                Some(k) => {
                    conf.resource = k;
                    Ok(())
                }
                None => Err(format!(
                    "unknown resource {value:?} (expected one of {})",
                    ResourceKind::names()
                )),
            },
            "initial_size" => parse_size(&value).map(|v| {
                conf.initial_size = v;
                initial_set = true;
            }),
            "max_size" => match value.as_str() {
                "none" | "unlimited" => {
                    conf.max_size = None;
                    Ok(())
                }
                _ => parse_size(&value).and_then(|v| {
                    if v == 0 {
                        Err("max_size=0 would refuse every allocation; use none for no limit".into())
                    } else {
                        conf.max_size = Some(v);
                        Ok(())
                    }
                }),
            },
            "release_threshold" => {
                release_threshold_set = true;
                match value.as_str() {
                    "max" => {
                        conf.release_threshold = u64::MAX;
                        Ok(())
                    }
                    _ => parse_size(&value).map(|v| conf.release_threshold = v as u64),
                }
            }
            "min_bin" | "max_bin" => parse_size(&value).and_then(|v| {
                if !v.is_power_of_two() || !(256..=1 << 40).contains(&v) {
                    return Err(format!(
                        "{key}={value}: a bin must be a power of two from 256B to 1TiB"
                    ));
                }
                bins_set = true;
                if key == "min_bin" {
                    conf.min_bin = v;
                } else {
                    conf.max_bin = v;
                }
                Ok(())
            }),
            "shards" => match value.parse::<usize>() {
                Ok(n) if n <= 1024 => {
                    conf.shards = n;
                    Ok(())
                }
                _ => Err(format!(
                    "shards={value}: expected a count from 0 (one per CPU) to 1024"
                )),
            },
            "spread" => match value.as_str() {
                "contended" => {
                    conf.spread = Spread::OnContention;
                    Ok(())
                }
                "always" => {
                    conf.spread = Spread::Always;
                    Ok(())
                }
                _ => Err(format!("spread={value}: expected contended or always")),
            },
            "nccl_ready" => flag(&key, &value).map(|on| conf.nccl_ready = on),
            "expandable" => flag(&key, &value).map(|on| {
                expandable_set = true;
                conf.expandable = on;
            }),
            "recycle" => flag(&key, &value).map(|on| conf.recycle = on),
            _ => Err(format!(
                "unknown key {key:?} (known: resource, initial_size, max_size, release_threshold, min_bin, max_bin, shards, spread, expandable, recycle, nccl_ready, log)"
            )),
        };
        if let Err(e) = result {
            problems.push(if e.contains(&key) || key == "resource" {
                e
            } else {
                format!("{key}: {e}")
            });
        }
    }
    // Consistency, after every key is known.
    if conf.min_bin > conf.max_bin {
        problems.push(format!(
            "min_bin {} exceeds max_bin {}",
            conf.min_bin, conf.max_bin
        ));
    }
    if let Some(max) = conf.max_size {
        if conf.initial_size > max {
            problems.push(format!(
                "initial_size {} exceeds max_size {max}",
                conf.initial_size
            ));
        }
    }
    if conf.resource == ResourceKind::Arena {
        // The arena takes this much up front, in whole superblocks: less
        // than one would serve nothing at all.
        let sb = gpumem::pool::ArenaConfig::default().superblock_size;
        let size = Some(conf.initial_size).filter(|&s| s > 0).or(conf.max_size);
        if let Some(size) = size.filter(|&s| s < sb) {
            let key = if conf.initial_size > 0 {
                "initial_size"
            } else {
                "max_size"
            };
            problems.push(format!(
                "resource=arena: {key} {size} is smaller than one superblock ({sb} bytes), so the arena could serve nothing"
            ));
        }
    }
    if release_threshold_set && conf.resource != ResourceKind::Async {
        problems.push(format!(
            "release_threshold means nothing for resource={} (only for async)",
            conf.resource
        ));
    }
    if conf.nccl_ready && conf.resource != ResourceKind::Virtual {
        problems.push(format!(
            "nccl_ready means nothing for resource={} (only for vpool)",
            conf.resource
        ));
    }
    let sharded = conf.shards != 0 || conf.spread != Spread::OnContention;
    if sharded
        && !matches!(
            conf.resource,
            ResourceKind::Pool | ResourceKind::Binning | ResourceKind::Virtual
        )
    {
        problems.push(format!(
            "shards and spread mean nothing for resource={} (only for pool, binning and vpool)",
            conf.resource
        ));
    }
    if expandable_set && !matches!(conf.resource, ResourceKind::Pool | ResourceKind::Binning) {
        problems.push(format!(
            "expandable means nothing for resource={} (only for pool and binning)",
            conf.resource
        ));
    }
    if conf.recycle && !matches!(conf.resource, ResourceKind::Pool | ResourceKind::Binning) {
        problems.push(format!(
            "recycle means nothing for resource={} (only for pool and binning)",
            conf.resource
        ));
    } else if conf.recycle && !conf.expandable {
        problems.push(
            "recycle needs expandable heaps: it moves pieces of a heap's range (drop expandable=false)"
                .to_string(),
        );
    }
    if bins_set && conf.resource != ResourceKind::Binning {
        problems.push(format!(
            "min_bin/max_bin mean nothing for resource={} (only for binning)",
            conf.resource
        ));
    }
    if initial_set
        && conf.initial_size > 0
        && matches!(
            conf.resource,
            ResourceKind::Caching | ResourceKind::Cuda | ResourceKind::Virtual
        )
    {
        problems.push(format!(
            "initial_size means nothing for resource={}",
            conf.resource
        ));
    }
    Parsed {
        text: text.to_string(),
        conf,
        problems,
    }
}

/// Reads and parses `GPUMEM_CONF` and checks its files (unset: the
/// defaults; not Unicode: a problem).
pub fn from_env() -> Parsed {
    match std::env::var(CONF_ENV) {
        Ok(s) => parse(&s).check_files(),
        Err(std::env::VarError::NotPresent) => parse(""),
        Err(std::env::VarError::NotUnicode(v)) => Parsed {
            text: v.to_string_lossy().into_owned(),
            conf: Conf::default(),
            problems: vec!["the value is not valid Unicode".into()],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let p = parse("");
        assert_eq!(p.conf, Conf::default());
        assert!(p.problems.is_empty());
        assert_eq!(p.conf.resource, ResourceKind::Pool);
    }

    #[test]
    fn full_line() {
        let p = parse("resource=pool, initial_size=1GiB,max_size=70GiB");
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        assert_eq!(p.conf.initial_size, 1 << 30);
        assert_eq!(p.conf.max_size, Some(70 << 30));
        let p = parse("RESOURCE=Async,release_threshold=2GiB,max_size=none");
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        assert_eq!(p.conf.resource, ResourceKind::Async);
        assert_eq!(p.conf.release_threshold, 2 << 30);
        assert_eq!(p.conf.max_size, None);
        let p = parse("resource=binning,min_bin=512,max_bin=4MiB");
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        assert_eq!((p.conf.min_bin, p.conf.max_bin), (512, 4 << 20));
        for k in ResourceKind::ALL {
            assert_eq!(parse(&format!("resource={k}")).conf.resource, k);
        }
    }

    #[test]
    fn shards_and_spread_for_the_pools_only() {
        let p = parse("resource=pool,shards=1");
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        assert_eq!(p.conf.shards, 1);
        assert_eq!(
            p.conf.to_string(),
            "resource=pool,initial_size=0,max_size=none,shards=1"
        );
        let p = parse("resource=pool,spread=always");
        assert_eq!((p.conf.shards, p.conf.spread), (0, Spread::Always));
        assert_eq!(
            p.conf.to_string(),
            "resource=pool,initial_size=0,max_size=none,spread=always"
        );
        assert_eq!(parse("spread=contended").conf.spread, Spread::OnContention);
        assert!(parse("spread=never").problems[0].contains("expected contended or always"));
        assert_eq!(parse("resource=binning,shards=8").conf.shards, 8);
        assert!(parse("shards=-1").problems[0].contains("expected a count"));
        assert!(parse("shards=4096").problems[0].contains("expected a count"));
        assert_eq!(parse("resource=vpool,shards=4").conf.shards, 4);
        for bad in ["resource=arena,shards=4", "resource=caching,spread=always"] {
            let p = parse(bad);
            assert!(
                p.problems[0].contains("only for pool, binning and vpool"),
                "{bad}: {:?}",
                p.problems
            );
        }
        // The defaults are valid everywhere.
        assert!(parse("resource=vpool,shards=0,spread=contended")
            .problems
            .is_empty());
    }

    #[test]
    fn bad_entries_are_errors_that_say_why() {
        let p = parse("resource=pol,max_size=7OGiB,colour=blue,initial_size=64MiB,junk");
        assert_eq!(p.problems.len(), 4, "{:?}", p.problems);
        assert_eq!(
            p.problems[0],
            "unknown resource \"pol\" (expected one of pool, caching, binning, arena, async, vpool, cuda)"
        );
        assert!(p.problems[1].starts_with("max_size: "), "{}", p.problems[1]);
        assert!(p.problems[2].contains("unknown key \"colour\""));
        assert!(p.problems[3].contains("not key=value"));
        let e = p.error().expect("invalid");
        assert!(
            e.starts_with("GPUMEM_CONF=\"resource=pol,max_size=7OGiB,colour=blue,initial_size=64MiB,junk\" is invalid: unknown resource"),
            "{e}"
        );
        for problem in &p.problems {
            assert!(e.contains(problem.as_str()), "{e}");
            assert!(!problem.contains("default") && !problem.contains("ignored"));
        }
        assert_eq!(parse("resource=vpool").error(), None);
    }

    #[test]
    fn inconsistent_entries() {
        for (text, says) in [
            ("initial_size=2GiB,max_size=1GiB", "exceeds max_size"),
            (
                "resource=binning,min_bin=1MiB,max_bin=4KiB",
                "exceeds max_bin",
            ),
            ("min_bin=300", "power of two"),
            ("release_threshold=1G", "only for async"),
            ("max_size=0", "max_size=0"),
            (
                "resource=cuda,initial_size=1G",
                "initial_size means nothing",
            ),
            (
                "resource=vpool,initial_size=1G",
                "initial_size means nothing",
            ),
            (
                "resource=vpool,resource=pool",
                "resource is given more than once",
            ),
            (
                "max_size=64MiB, MAX_SIZE=none",
                "max_size is given more than once",
            ),
        ] {
            let p = parse(text);
            assert_eq!(p.problems.len(), 1, "{text}: {:?}", p.problems);
            assert!(p.problems[0].contains(says), "{text}: {:?}", p.problems);
            assert!(p.error().is_some(), "{text}");
        }
    }

    #[test]
    fn an_arena_smaller_than_a_superblock_is_refused() {
        for text in [
            "resource=arena,initial_size=1",
            "resource=arena,max_size=4096",
        ] {
            let p = parse(text);
            assert!(
                p.problems
                    .iter()
                    .any(|e| e.contains("smaller than one superblock")),
                "{text}: {:?}",
                p.problems
            );
        }
        assert!(parse("resource=arena,initial_size=1MiB")
            .problems
            .is_empty());
        assert!(
            parse("resource=arena").problems.is_empty(),
            "sized at run time"
        );
    }

    #[test]
    fn nccl_ready_is_for_the_virtual_pool() {
        let p = parse("resource=vpool, NCCL_READY=True");
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        assert!(p.conf.nccl_ready);
        assert!(p.conf.to_string().ends_with(",nccl_ready=true"));
        assert_eq!(parse(&p.conf.to_string()).conf, p.conf, "round trip");
        assert!(!parse("resource=vpool,nccl_ready=0").conf.nccl_ready);
        let wrong = parse("resource=pool,nccl_ready=true");
        assert!(wrong.problems[0].contains("only for vpool"), "{wrong:?}");
        let bad = parse("resource=vpool,nccl_ready=maybe");
        assert!(
            bad.problems[0].contains("expected true or false"),
            "{bad:?}"
        );
    }

    /// Every spelling a flag accepts is the one its error names.
    #[test]
    fn a_bad_flag_names_every_accepted_spelling() {
        let bad = parse("expandable=maybe");
        let why = &bad.problems[0];
        for (on, off) in [("true", "false"), ("1", "0"), ("yes", "no"), ("on", "off")] {
            assert!(why.contains(on) && why.contains(off), "{why}");
            assert!(parse(&format!("expandable={on}")).conf.expandable, "{on}");
            assert!(
                !parse(&format!("expandable={off}")).conf.expandable,
                "{off}"
            );
        }
    }

    #[test]
    fn expandable_is_for_the_pools_and_on_by_default() {
        assert!(parse("").conf.expandable);
        let p = parse("resource=binning, Expandable=False");
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        assert!(!p.conf.expandable);
        assert!(p.conf.to_string().ends_with(",expandable=false"));
        assert_eq!(parse(&p.conf.to_string()).conf, p.conf, "round trip");
        assert!(parse("resource=pool,expandable=on").conf.expandable);
        let wrong = parse("resource=vpool,expandable=true");
        assert!(
            wrong.problems[0].contains("only for pool and binning"),
            "{wrong:?}"
        );
        let bad = parse("expandable=2");
        assert!(
            bad.problems[0].contains("expandable=2: expected true or false"),
            "{bad:?}"
        );
    }

    #[test]
    fn recycle_is_off_by_default_and_needs_expandable_heaps() {
        assert!(!parse("").conf.recycle);
        let p = parse("resource=binning, Recycle=True");
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        assert!(p.conf.recycle);
        assert!(p.conf.to_string().ends_with(",recycle=true"));
        assert_eq!(parse(&p.conf.to_string()).conf, p.conf, "round trip");
        let wrong = parse("resource=vpool,recycle=true");
        assert!(
            wrong.problems[0].contains("only for pool and binning"),
            "{wrong:?}"
        );
        let fixed = parse("recycle=true,expandable=false");
        assert_eq!(fixed.problems.len(), 1, "{fixed:?}");
        assert!(
            fixed.problems[0].contains("recycle needs expandable heaps"),
            "{fixed:?}"
        );
        assert!(parse("recycle=false,expandable=false").problems.is_empty());
    }

    #[test]
    fn log_keeps_the_case_of_its_file_name() {
        let p = parse("resource=pool, LOG = /tmp/Job Trace.csv ");
        assert!(p.problems.is_empty(), "{:?}", p.problems);
        assert_eq!(p.conf.log, Some(PathBuf::from("/tmp/Job Trace.csv")));
        assert_eq!(parse("log=").problems, vec!["log needs a file name"]);
        let again = parse(&p.conf.to_string());
        assert_eq!(again.conf, p.conf);
        let p = parse("log=/no/such/dir/x.csv").check_files();
        assert_eq!(p.problems.len(), 1, "{:?}", p.problems);
        assert!(p.problems[0].starts_with("log: cannot create /no/such/dir/x.csv"));
    }

    #[test]
    fn each_device_logs_to_its_own_file() {
        let p = Path::new("/tmp/job.csv");
        assert_eq!(log_path(p, 0), PathBuf::from("/tmp/job.csv"));
        assert_eq!(log_path(p, 3), PathBuf::from("/tmp/job-dev3.csv"));
        assert_eq!(log_path(Path::new("trace"), 1), PathBuf::from("trace-dev1"));
    }

    #[test]
    fn display_round_trips() {
        for text in [
            "resource=pool,initial_size=1GiB,max_size=70GiB",
            "resource=async,release_threshold=1MiB",
            "resource=binning,min_bin=512,max_bin=2MiB",
            "resource=cuda",
        ] {
            let p = parse(text);
            let again = parse(&p.conf.to_string());
            assert_eq!(again.conf, p.conf);
            assert!(again.problems.is_empty(), "{:?}", again.problems);
        }
    }
}
