//! The allocators the command measures, by name: `GPUMEM_CONF`'s resources,
//! built by the C ABI's own builder.
//!
//! An allocator name is a `GPUMEM_CONF` `resource=` value (`pool`,
//! `caching`, `binning`, `arena`, `async`, `vpool`, `cuda`), with more of
//! `GPUMEM_CONF`'s settings after `+` when wanted: `vpool+spread=always`,
//! `pool+expandable=false+shards=1` (the spelling the Python benches use,
//! `native:vpool+nccl_ready=true`). The name `R+K=V+...` means exactly
//! `GPUMEM_CONF=resource=R,K=V,...`: it is read by
//! [`gpumem_capi::conf::parse`], refused with that parser's error, and built
//! by [`gpumem_capi::served::build`] with the limit the C ABI gives a device
//! whose memory fraction is 1 ([`gpumem_capi::served::limit`]). So there is
//! one construction of each resource, and replaying a job's log with
//! `--alloc NAME` replays the allocator that served the job under
//! `GPUMEM_CONF=resource=NAME`, with the same defaults (`pool` and `binning`
//! have expandable heaps unless `+expandable=false` says otherwise).
//!
//! The command's own names before 2026-11-29 ([`RENAMED`]) are refused
//! with their spelling now.

use std::sync::Arc;

use anyhow::{bail, Result};
use gpumem::pool::Pool;
use gpumem::resource::SharedResource;
use gpumem::Device;
use gpumem_capi::conf::{self, Conf, ResourceKind};
use gpumem_capi::served::{self, Served};

/// The command's allocator names before 2026-11-29 that are no longer
/// names, each with the name that builds the same allocator now. (The old
/// `pool` and `binning` had heaps of separate regions; they are
/// `pool+expandable=false` and `binning+expandable=false` now, their names
/// meaning what `GPUMEM_CONF` means by them.)
pub const RENAMED: &[(&str, &str)] = &[
    ("cuda-async", "async"),
    ("pool-expandable", "pool"),
    ("pool-recycling", "pool+recycle=true"),
    ("pool-sharded", "pool+expandable=false+spread=always"),
    ("vpool-sharded", "vpool+spread=always"),
];

/// A named allocator: a `GPUMEM_CONF` resource and its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatorSpec {
    /// The name as given (`pool`, `vpool+spread=always`): what records and
    /// tables call it.
    pub name: String,
    /// The configuration the name stands for, as `GPUMEM_CONF` reads it.
    pub conf: Conf,
}

impl AllocatorSpec {
    /// Reads an allocator name (see the module documentation). An old name
    /// is refused with its spelling now; a bad resource or setting with
    /// `GPUMEM_CONF`'s own error.
    pub fn parse(name: &str) -> Result<Self> {
        let name = name.trim();
        let (resource, _) = name.split_once('+').unwrap_or((name, ""));
        let resource = resource.trim().to_ascii_lowercase();
        if let Some((old, new)) = RENAMED.iter().find(|(old, _)| *old == resource) {
            bail!(
                "allocator {old:?} is now {new:?}: allocator names are GPUMEM_CONF's \
                 resources ({}), meaning what they mean there, with its settings after + \
                 (the command's old `pool` is `pool+expandable=false`)",
                ResourceKind::names()
            );
        }
        if name.contains(',') {
            // Only reachable through the library: the command splits `--alloc`
            // at commas first. A comma here would slip settings past the
            // name's own syntax.
            bail!(
                "allocator {name:?}: settings follow the resource after +, not a comma \
                 (commas separate allocators)"
            );
        }
        let text = conf_text(name);
        let parsed = conf::parse(&text);
        if let Some(e) = parsed.error_as(&format!("allocator {name:?} (GPUMEM_CONF={text:?})")) {
            bail!("{e} (see `gpumem bench --list-allocators`)");
        }
        if let Some(log) = &parsed.conf.log {
            bail!(
                "allocator {name:?}: log={} is for GPUMEM_CONF; the command writes a \
                 replay's log with `gpumem replay --log FILE`",
                log.display()
            );
        }
        Ok(Self {
            name: name.to_string(),
            conf: parsed.conf,
        })
    }

    /// The allocator of `resource` with `GPUMEM_CONF`'s defaults.
    pub fn of(resource: ResourceKind) -> Self {
        Self {
            name: resource.name().to_string(),
            conf: Conf {
                resource,
                ..Conf::default()
            },
        }
    }

    /// Builds a fresh instance over `device`, as the C ABI builds
    /// `GPUMEM_CONF`'s resource for a device at memory fraction 1.
    pub fn build(&self, device: &Device) -> gpumem::Result<Allocator> {
        let limit = served::limit(&self.conf, None);
        let served: Arc<dyn Served> = served::build(&self.conf, device, limit)?.boxed().into();
        Ok(Allocator {
            resource: served.clone(),
            pool: served.clone(),
            served,
        })
    }

    /// Why its reserve does not follow the live bytes, when that is by
    /// design: printed under tables, whose res/live it marks with `*`.
    pub fn reserve_note(&self) -> Option<&'static str> {
        (self.conf.resource == ResourceKind::Arena).then_some(
            "arena takes its whole size up front (half the device's free memory unless \
             initial_size or max_size say otherwise), as RMM's arena does: its reserve \
             does not follow the live bytes",
        )
    }
}

/// `GPUMEM_CONF`'s text for an allocator name: `pool+shards=1` is
/// `resource=pool,shards=1`.
pub fn conf_text(name: &str) -> String {
    let mut parts = name.split('+');
    let resource = parts.next().unwrap_or_default().trim();
    std::iter::once(format!("resource={resource}"))
        .chain(parts.map(|s| s.trim().to_string()))
        .collect::<Vec<_>>()
        .join(",")
}

/// An allocator ready to measure. Dropping it releases what it holds.
pub struct Allocator {
    /// The allocator.
    pub resource: SharedResource,
    /// The allocator as a pool: its reserve is what it holds from the
    /// driver (for `binning`, its inner pool's; for `cuda`, its live
    /// `cuMemAlloc` bytes at 256-byte granularity; for `async`, CUDA's
    /// `ReservedMemCurrent`).
    pub pool: Arc<dyn Pool>,
    served: Arc<dyn Served>,
}

impl Allocator {
    /// The allocator as the C ABI sees it: driver calls, segments, live
    /// blocks.
    pub fn served(&self) -> &dyn Served {
        &*self.served
    }

    /// For a `vpool`, the `cuMemMap` calls it has made so far (a steady
    /// state makes none); `None` for the others.
    pub fn mappings_made(&self) -> Option<u64> {
        self.served.virtual_pool().map(|v| v.stats().mappings_made)
    }
}

impl Drop for Allocator {
    fn drop(&mut self) {
        let _ = self.pool.release();
    }
}

/// Every resource's name, in `GPUMEM_CONF`'s order: what `--alloc all`
/// measures, each with its defaults.
pub fn names() -> Vec<&'static str> {
    ResourceKind::ALL.iter().map(|k| k.name()).collect()
}

/// Resolves a `--alloc` list (`all` or empty: every resource with its
/// defaults) to specs, failing on the first bad name (see
/// [`AllocatorSpec::parse`]).
pub fn select(list: &[String]) -> Result<Vec<AllocatorSpec>> {
    if list.is_empty() || list.iter().any(|n| n.trim() == "all") {
        return Ok(ResourceKind::ALL.map(AllocatorSpec::of).into());
    }
    list.iter().map(|n| AllocatorSpec::parse(n)).collect()
}
