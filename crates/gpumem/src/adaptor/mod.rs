//! Adaptors: resources that wrap another resource (their *upstream*) and add one
//! thing to it: a limit, statistics, tracking, a log, larger alignment, a retry
//! on out-of-memory, a lock, prefetching. Each is generic over its upstream, so a
//! stack such as `StatisticsAdaptor<LimitingAdaptor<DeviceResource>>` costs
//! only what each layer adds; `Arc<dyn MemoryResource>` works as an upstream too.
//!
//! Every adaptor follows the resource rules of [`crate::resource`]: zero-byte
//! requests return [`DevicePtr::NULL`](crate::DevicePtr::NULL) without reaching
//! the upstream and are not counted, logged or tracked; bad alignments are
//! [`Error::BadAlignment`](crate::Error::BadAlignment); failures are values.
//!
//! | adaptor | adds | fast-path cost |
//! |---|---|---|
//! | [`LimitingAdaptor`] | a byte limit, changeable at run time | one compare-exchange per allocate, one atomic sub per free |
//! | [`StatisticsAdaptor`] | current/peak/total bytes and counts, scoped frames, deferred frees | a few counter updates under a one-flag lock (one atomic read-modify-write) per call |
//! | [`TrackingAdaptor`] | outstanding allocations, leak report, bad-free detection | one hash-map insert/remove under a mutex (plus a backtrace when enabled: µs) |
//! | [`LoggingAdaptor`] | RMM's CSV log | one formatted line into a buffer under a mutex |
//! | [`AlignedAdaptor`] | alignments above 256 bytes | none below the threshold; a map insert/remove above it |
//! | [`FailureCallbackAdaptor`] | a user callback and retry on out-of-memory | none unless the upstream fails |
//! | [`HoldingAdaptor`] | frees held until given back (a graph-private pool's upstream: captured addresses never reused); bad frees refused when made | a table insert per allocation, a remove and a mutex push per free (it sees only a pool's regions) |
//! | [`ThreadSafeAdaptor`] | a mutex around a `&mut self` resource | one mutex per call |
//! | [`PrefetchAdaptor`] | prefetch of managed memory after allocation | one driver call per allocation of managed memory |
//!
//! Sizes are counted at the allocation granularity [`ALLOCATION_GRANULARITY`]
//! (256 bytes) where an adaptor says so: a 1-byte allocation takes 256 bytes of
//! any driver allocator or pool.

mod aligned;
mod failure_callback;
mod flag_lock;
mod holding;
mod introspect;
mod limiting;
mod logging;
mod prefetch;
mod statistics;
mod thread_safe;
mod tracking;

pub use aligned::{AlignedAdaptor, DEFAULT_ALIGNMENT_THRESHOLD};
pub use failure_callback::{FailureCallbackAdaptor, RetryCounter};
pub use holding::HoldingAdaptor;
pub use limiting::LimitingAdaptor;
pub use logging::{format_log_line, LogAction, LoggingAdaptor, LOG_FILE_ENV, LOG_HEADER};
pub use prefetch::PrefetchAdaptor;
pub use statistics::{
    CallCount, ClassStats, MemoryStats, Stat, StatisticsAdaptor, SMALL_BLOCK_MAX, SMALL_SEGMENT_MAX,
};
pub use thread_safe::{LocalMemoryResource, ThreadSafeAdaptor};
pub use tracking::{Allocation, TrackingAdaptor};

/// The granularity sizes are counted at: 256 bytes, what `cuMemAlloc` aligns
/// to and the smallest block any gpumem pool hands out.
pub const ALLOCATION_GRANULARITY: usize = crate::resource::DEFAULT_ALIGNMENT;

/// `bytes` rounded up to [`ALLOCATION_GRANULARITY`]; `None` on overflow.
#[inline]
pub fn granular_size(bytes: usize) -> Option<usize> {
    bytes.checked_next_multiple_of(ALLOCATION_GRANULARITY)
}

/// The device ordinal to put in an [`OomInfo`](crate::OomInfo) for memory of
/// `properties`: the device for device-only memory, `None` for host memory.
pub(crate) fn oom_device(
    device: &crate::Device,
    properties: crate::resource::Properties,
) -> Option<u32> {
    (!properties.host_accessible).then(|| device.ordinal())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_to_the_granularity() {
        assert_eq!(granular_size(0), Some(0));
        assert_eq!(granular_size(1), Some(256));
        assert_eq!(granular_size(256), Some(256));
        assert_eq!(granular_size(257), Some(512));
        assert_eq!(granular_size(1 << 50), Some(1 << 50));
        assert_eq!(granular_size(usize::MAX), None);
    }
}
