//! The counted stack that serves one device: [`StatisticsAdaptor`] (the
//! numbers of `torch.cuda.memory_stats`) over the configured resource.
//!
//! The default resource, `pool`, and `vpool` are held by their types, every
//! other one behind `dyn Served`. Every `gpumem_malloc` and `gpumem_free`
//! goes through the counters to the resource: with the pool's type known,
//! the counters reach its counted path by a direct call, which the compiler
//! inlines, instead of two calls through vtables (`docs/decisions.md`,
//! "The C ABI's pools held by type").

use gpumem::adaptor::{MemoryStats, StatisticsAdaptor};
use gpumem::pool::{PoolResource, VirtualPool};
use gpumem::{DevicePtr, Result, Stream};

use crate::served::{Served, Upstream};

/// The resource a device is configured with, as [`crate::served::build`]
/// makes it.
pub enum Resource {
    /// The default, `pool`.
    Pool(PoolResource<Upstream>),
    /// `vpool`.
    Virtual(VirtualPool),
    /// Any other resource, or either pool under a log.
    Other(Box<dyn Served>),
}

impl Resource {
    /// The resource behind `dyn Served` (to wrap it, as the log does).
    pub fn boxed(self) -> Box<dyn Served> {
        match self {
            Resource::Pool(p) => Box::new(p),
            Resource::Virtual(v) => Box::new(v),
            Resource::Other(s) => s,
        }
    }
}

/// The statistics over the resource serving a device.
pub enum Stack {
    /// Over the default pool, by type.
    Pool(StatisticsAdaptor<PoolResource<Upstream>>),
    /// Over `vpool`, by type.
    Virtual(StatisticsAdaptor<VirtualPool>),
    /// Over any other resource.
    Other(StatisticsAdaptor<Box<dyn Served>>),
}

/// Runs `$e` with `$s` bound to the stack's adaptor, whichever it is.
macro_rules! each {
    ($stack:expr, $s:ident => $e:expr) => {
        match $stack {
            Stack::Pool($s) => $e,
            Stack::Virtual($s) => $e,
            Stack::Other($s) => $e,
        }
    };
}

impl Stack {
    /// Counts what `resource` serves.
    pub fn new(resource: Resource) -> Self {
        match resource {
            Resource::Pool(p) => Stack::Pool(StatisticsAdaptor::new(p)),
            Resource::Virtual(v) => Stack::Virtual(StatisticsAdaptor::new(v)),
            Resource::Other(s) => Stack::Other(StatisticsAdaptor::new(s)),
        }
    }

    /// The resource counted.
    pub fn upstream(&self) -> &dyn Served {
        match self {
            Stack::Pool(s) => s.upstream(),
            Stack::Virtual(s) => s.upstream(),
            Stack::Other(s) => s.upstream().as_ref(),
        }
    }

    /// [`StatisticsAdaptor::allocate_rounded`].
    #[inline]
    pub fn allocate_rounded(
        &self,
        requested: usize,
        block: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<DevicePtr> {
        each!(self, s => s.allocate_rounded(requested, block, alignment, stream))
    }

    /// [`StatisticsAdaptor::deallocate_rounded`].
    #[inline]
    pub fn deallocate_rounded(
        &self,
        ptr: DevicePtr,
        requested: usize,
        block: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        each!(self, s => s.deallocate_rounded(ptr, requested, block, alignment, stream))
    }

    /// [`StatisticsAdaptor::begin_deferred_free_rounded`].
    pub fn begin_deferred_free_rounded(&self, requested: usize, block: usize) {
        each!(self, s => s.begin_deferred_free_rounded(requested, block))
    }

    /// [`StatisticsAdaptor::cancel_deferred_free_rounded`].
    pub fn cancel_deferred_free_rounded(&self, requested: usize, block: usize) {
        each!(self, s => s.cancel_deferred_free_rounded(requested, block))
    }

    /// [`StatisticsAdaptor::stats`].
    pub fn stats(&self) -> MemoryStats {
        each!(self, s => s.stats())
    }

    /// [`StatisticsAdaptor::reset_peak`].
    pub fn reset_peak(&self) {
        each!(self, s => s.reset_peak())
    }

    /// [`StatisticsAdaptor::finish_deferred_free`].
    pub fn finish_deferred_free(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        each!(self, s => s.finish_deferred_free(ptr, bytes, alignment, stream))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conf::parse;
    use crate::served::build;
    use gpumem::driver::sim::SimConfig;
    use gpumem::resource::DEFAULT_ALIGNMENT;
    use gpumem::Device;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// A stack for `conf` on a device of its own, typed or behind `dyn`.
    fn stack(conf: &str, typed: bool) -> (Stack, Device) {
        let device = Device::sim(SimConfig::default());
        let resource = build(&parse(conf).conf, &device, None).unwrap();
        let resource = match typed {
            true => resource,
            false => Resource::Other(resource.boxed()),
        };
        (Stack::new(resource), device)
    }

    /// The same calls through the typed stack and through `dyn` give the
    /// same blocks and the same statistics, frees out of order and a
    /// deferred free included.
    #[test]
    fn typed_and_dyn_stacks_serve_and_count_alike() {
        for (conf, kind) in [("resource=pool", "Pool"), ("resource=vpool", "Virtual")] {
            let (typed, dev_a) = stack(conf, true);
            let (boxed, dev_b) = stack(conf, false);
            assert!(matches!(boxed, Stack::Other(_)));
            let held_by_type = match &typed {
                Stack::Pool(_) => "Pool",
                Stack::Virtual(_) => "Virtual",
                Stack::Other(_) => "Other",
            };
            assert_eq!(held_by_type, kind, "{conf}");
            let (sa, sb) = (
                dev_a.create_stream().unwrap(),
                dev_b.create_stream().unwrap(),
            );
            let mut rng = StdRng::seed_from_u64(7);
            let mut live: Vec<(DevicePtr, DevicePtr, usize)> = Vec::new();
            for step in 0..2_000 {
                if live.is_empty() || rng.random_bool(0.55) {
                    // Rounded as the native allocator rounds: 512-byte steps.
                    let bytes = rng.random_range(1..=4usize << 20);
                    let block = bytes.next_multiple_of(512);
                    let a = typed
                        .allocate_rounded(bytes, block, DEFAULT_ALIGNMENT, &sa)
                        .unwrap();
                    let b = boxed
                        .allocate_rounded(bytes, block, DEFAULT_ALIGNMENT, &sb)
                        .unwrap();
                    live.push((a, b, bytes));
                } else {
                    let (a, b, bytes) = live.swap_remove(rng.random_range(0..live.len()));
                    let block = bytes.next_multiple_of(512);
                    for (s, p, st) in [(&typed, a, &sa), (&boxed, b, &sb)] {
                        if step % 97 == 0 {
                            s.begin_deferred_free_rounded(bytes, block);
                            s.finish_deferred_free(p, block, DEFAULT_ALIGNMENT, st)
                                .unwrap();
                        } else {
                            s.deallocate_rounded(p, bytes, block, DEFAULT_ALIGNMENT, st)
                                .unwrap();
                        }
                    }
                }
                if step % 250 == 0 {
                    assert_eq!(typed.stats(), boxed.stats(), "{conf}, step {step}");
                }
            }
            assert_eq!(typed.stats(), boxed.stats(), "{conf}");
            let sizes = |s: &Stack| -> Vec<usize> {
                s.upstream()
                    .live_blocks()
                    .iter()
                    .map(|(b, _)| b.size)
                    .collect()
            };
            assert_eq!(sizes(&typed), sizes(&boxed), "{conf}");
            assert_eq!(typed.stats().allocation.current, live.len() as i64);
            // A bad free is refused by both, and counts in neither.
            let (a, b, bytes) = live[0];
            let block = bytes.next_multiple_of(512);
            let before = typed.stats();
            for (s, p, st) in [(&typed, a, &sa), (&boxed, b, &sb)] {
                let interior = DevicePtr(p.0 + 1);
                assert!(s
                    .deallocate_rounded(interior, bytes, block, DEFAULT_ALIGNMENT, st)
                    .is_err());
            }
            assert_eq!(typed.stats(), before, "{conf}");
            assert_eq!(boxed.stats(), before, "{conf}");
        }
    }
}
