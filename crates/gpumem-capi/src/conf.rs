//! `GPUMEM_CONF`: which resource serves the C ABI, and its sizes and limits.
//!
//! The form is `key=value,key=value`, read once, at the first call into the
//! library. Keys and values are case-insensitive; spaces around them are
//! ignored; an empty string (or no variable) gives every default.
//!
//! | key | values | default | meaning |
//! |---|---|---|---|
//! | `resource` | `pool`, `caching`, `binning`, `arena`, `async`, `vpool`, `cuda` | `pool` | what serves each device (see below) |
//! | `initial_size` | size | `0` | bytes the pool takes up front (`pool`, `binning`, `async`); `arena`: the arena's size |
//! | `max_size` | size or `none` | `none` | most bytes taken from the driver per device (`vpool`: physical bytes); past it, allocations fail (NULL) |
//! | `release_threshold` | size or `max` | `max` | `async` only: bytes the CUDA pool keeps at a synchronize |
//! | `min_bin`, `max_bin` | size, a power of two | `256B`, `1MiB` | `binning` only: smallest and largest fixed-size bin |
//!
//! Resources: `pool` is gpumem's coalescing TLSF pool (`PoolResource`);
//! `caching` the power-of-two caching pool (`CachingPool`); `binning`
//! fixed-size bins over a `PoolResource` (`BinningResource`); `cuda` plain
//! `cuMemAlloc`/`cuMemFree` (no caching); `arena` gpumem's arena
//! (`ArenaResource`: one region taken whole at the start, of `initial_size`
//! bytes, else `max_size`, else half the device's free memory); `async`
//! CUDA's stream-ordered pool (`AsyncResource`, `cudaMallocAsync`), with
//! `max_size` as the pool's maximum size; `vpool` gpumem's pool on virtual
//! memory (`VirtualPool`: physical pages only under live blocks, moved by
//! aliasing), with `max_size` as its most physical memory.
//!
//! Sizes: a number (decimals allowed) with an optional unit: `B`; `K`, `KiB`,
//! `M`, `MiB`, `G`, `GiB`, `T`, `TiB` (powers of 1024); `KB`, `MB`, `GB`, `TB`
//! (powers of 1000). `70GiB`, `1.5G` and `512MB` are sizes.
//!
//! Bad input never stops the host program: an unknown key, a bad value or a
//! key that means nothing for the chosen resource is reported on stderr as
//! `gpumem: GPUMEM_CONF: ...` and ignored, so its default applies.

use std::fmt;

/// Environment variable holding the configuration.
pub const CONF_ENV: &str = "GPUMEM_CONF";

/// Which resource serves allocations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResourceKind {
    /// `PoolResource`: coalescing best fit over TLSF lanes (the default).
    #[default]
    Pool,
    /// `CachingPool`: power-of-two size classes.
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
        Ok(())
    }
}

/// Parses a size: a number with an optional unit (see the module
/// documentation). `Err` says what is wrong.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "{s:?} is not a size (expected a number such as 512MiB)"
        ));
    }
    let unit = unit.trim().to_ascii_lowercase();
    let mult: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (use B, K/KiB, M/MiB, G/GiB, T/TiB or KB/MB/GB/TB)"
            ))
        }
    };
    if !num.contains('.') {
        let n: u64 = num
            .parse()
            .map_err(|_| format!("{s:?} is not a size (the number is too large)"))?;
        let bytes = (n as u128) * (mult as u128);
        return usize::try_from(bytes).map_err(|_| format!("{s:?} is too large"));
    }
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bad number {num:?})"))?;
    let bytes = (n * mult).round();
    if !bytes.is_finite() || bytes >= usize::MAX as f64 {
        return Err(format!("{s:?} is too large"));
    }
    Ok(bytes as usize)
}

/// A parsed configuration and the problems found on the way (each one line,
/// without the `gpumem: GPUMEM_CONF: ` prefix). The configuration has the
/// default for every entry that was reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The configuration to use.
    pub conf: Conf,
    /// What was wrong, one line each, in input order.
    pub problems: Vec<String>,
}

/// Parses `GPUMEM_CONF`'s text. Never fails: problems are returned as lines
/// and the affected entries keep their defaults.
pub fn parse(text: &str) -> Parsed {
    let mut conf = Conf::default();
    let mut problems = Vec::new();
    let mut release_threshold_set = false;
    let mut bins_set = false;
    let mut initial_set = false;
    for entry in text.split(',') {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let Some((key, value)) = entry.split_once('=') else {
            problems.push(format!("{entry:?} is not key=value; ignored"));
            continue;
        };
        let key = key.trim().to_ascii_lowercase();
        let value = value.trim().to_ascii_lowercase();
        let result: Result<(), String> = match key.as_str() {
            "resource" => match ResourceKind::parse(&value) {
                Some(k) => {
                    conf.resource = k;
                    Ok(())
                }
                None => Err(format!(
                    "unknown resource {value:?} (expected one of pool, caching, binning, arena, async, cuda); using resource={}",
                    Conf::default().resource
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
            _ => Err(format!(
                "unknown key {key:?} (known: resource, initial_size, max_size, release_threshold, min_bin, max_bin)"
            )),
        };
        if let Err(e) = result {
            let msg = if e.contains(&key) || key == "resource" {
                e
            } else {
                format!("{key}: {e}")
            };
            problems.push(if msg.contains("using resource=") {
                msg
            } else {
                format!("{msg}; default used")
            });
        }
    }
    // Consistency, after every key is known.
    if conf.min_bin > conf.max_bin {
        problems.push(format!(
            "min_bin {} exceeds max_bin {}; default bins used",
            conf.min_bin, conf.max_bin
        ));
        let d = Conf::default();
        conf.min_bin = d.min_bin;
        conf.max_bin = d.max_bin;
    }
    if let Some(max) = conf.max_size {
        if conf.initial_size > max {
            problems.push(format!(
                "initial_size {} exceeds max_size {max}; initial_size=0 used",
                conf.initial_size
            ));
            conf.initial_size = 0;
        }
    }
    if release_threshold_set && conf.resource != ResourceKind::Async {
        problems.push(format!(
            "release_threshold means nothing for resource={} (only for async); ignored",
            conf.resource
        ));
    }
    if bins_set && conf.resource != ResourceKind::Binning {
        problems.push(format!(
            "min_bin/max_bin mean nothing for resource={} (only for binning); ignored",
            conf.resource
        ));
    }
    if initial_set
        && conf.initial_size > 0
        && matches!(conf.resource, ResourceKind::Caching | ResourceKind::Cuda)
    {
        problems.push(format!(
            "initial_size means nothing for resource={}; ignored",
            conf.resource
        ));
    }
    Parsed { conf, problems }
}

/// Reads and parses `GPUMEM_CONF` (unset or not Unicode: the defaults; the
/// latter is reported).
pub fn from_env() -> Parsed {
    match std::env::var(CONF_ENV) {
        Ok(s) => parse(&s),
        Err(std::env::VarError::NotPresent) => parse(""),
        Err(std::env::VarError::NotUnicode(_)) => Parsed {
            conf: Conf::default(),
            problems: vec!["the value is not valid Unicode; defaults used".into()],
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("70GiB"), Ok(70 << 30));
        assert_eq!(parse_size("70G"), Ok(70 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("512MB"), Ok(512_000_000));
        assert_eq!(parse_size(" 2 TiB "), Ok(2 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("12XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("1.2.3G").is_err());
        assert!(parse_size("99999999999999999999999").is_err());
        assert!(parse_size("16777216TiB").is_err());
    }

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
    fn bad_entries_fall_back_and_say_why() {
        let p = parse("resource=pol,max_size=7OGiB,colour=blue,initial_size=64MiB,junk");
        assert_eq!(p.conf.resource, ResourceKind::Pool);
        assert_eq!(p.conf.max_size, None);
        assert_eq!(p.conf.initial_size, 64 << 20, "good entries still apply");
        assert_eq!(p.problems.len(), 4, "{:?}", p.problems);
        assert!(p.problems[0].contains("unknown resource \"pol\""));
        assert!(p.problems[0].contains("using resource=pool"));
        assert!(p.problems[1].starts_with("max_size: "), "{}", p.problems[1]);
        assert!(p.problems[1].ends_with("default used"));
        assert!(p.problems[2].contains("unknown key \"colour\""));
        assert!(p.problems[3].contains("not key=value"));
    }

    #[test]
    fn inconsistent_entries() {
        let p = parse("initial_size=2GiB,max_size=1GiB");
        assert_eq!(p.conf.initial_size, 0);
        assert_eq!(p.conf.max_size, Some(1 << 30));
        assert!(p.problems[0].contains("exceeds max_size"));
        let p = parse("resource=binning,min_bin=1MiB,max_bin=4KiB");
        assert_eq!((p.conf.min_bin, p.conf.max_bin), (256, 1 << 20));
        assert_eq!(p.problems.len(), 1);
        let p = parse("min_bin=300");
        assert!(p.problems[0].contains("power of two"), "{:?}", p.problems);
        let p = parse("release_threshold=1G");
        assert!(p.problems[0].contains("only for async"));
        let p = parse("max_size=0");
        assert_eq!(p.conf.max_size, None);
        assert!(p.problems[0].contains("max_size=0"));
        let p = parse("resource=cuda,initial_size=1G");
        assert!(p.problems[0].contains("initial_size means nothing"));
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
