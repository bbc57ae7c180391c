//! `FailureCallbackAdaptor`: calls a user callback when the upstream runs out of
//! memory, and retries while the callback says so (RMM's
//! failure_callback_resource_adaptor). The callback typically frees caches,
//! trims a pool or waits for other work, then returns `true` to retry or
//! `false` to give up, in which case the out-of-memory error goes to the caller.
//!
//! Fast path: none beyond the upstream call; the callback and the retry counter
//! (one atomic add) are reached only on out-of-memory. Other errors are returned
//! at once, without the callback.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{MemoryResource, Properties};
use crate::stream::Stream;
use crate::{check_alignment, OomInfo, Result};

/// A shared count of retries, readable while the adaptor is in use (and by a
/// [`StatisticsAdaptor`](super::StatisticsAdaptor) stacked above it). Cheap to
/// clone.
#[derive(Debug, Clone, Default)]
pub struct RetryCounter(Arc<AtomicU64>);

impl RetryCounter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// Retries counted so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn bump(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

type Callback = dyn Fn(usize, &OomInfo) -> bool + Send + Sync;

/// A resource that lets a callback react to out-of-memory and retry.
///
/// The callback is `Fn(bytes, &OomInfo) -> bool` and must be `Send + Sync`,
/// since the adaptor is shared between threads and the callback may run on
/// several at once; keep mutable state behind a `Mutex` or atomics inside it.
/// A callback that always returns `true` retries forever: it is the callback's
/// job to give up.
pub struct FailureCallbackAdaptor<U> {
    upstream: U,
    callback: Box<Callback>,
    retries: RetryCounter,
}

impl<U: std::fmt::Debug> std::fmt::Debug for FailureCallbackAdaptor<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FailureCallbackAdaptor")
            .field("upstream", &self.upstream)
            .field("retries", &self.retries.get())
            .finish()
    }
}

impl<U: MemoryResource> FailureCallbackAdaptor<U> {
    /// Wraps `upstream`; on out-of-memory, `callback(bytes, info)` decides
    /// whether to retry.
    pub fn new(
        upstream: U,
        callback: impl Fn(usize, &OomInfo) -> bool + Send + Sync + 'static,
    ) -> Self {
        Self {
            upstream,
            callback: Box::new(callback),
            retries: RetryCounter::new(),
        }
    }

    /// Retries made so far (each `true` from the callback is one).
    pub fn retries(&self) -> u64 {
        self.retries.get()
    }

    /// A handle on the retry count, for a statistics adaptor above this one.
    pub fn retry_counter(&self) -> RetryCounter {
        self.retries.clone()
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }
}

impl<U: MemoryResource> MemoryResource for FailureCallbackAdaptor<U> {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        check_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        loop {
            match self.upstream.allocate(bytes, alignment, stream) {
                Err(e) => match e.oom_info() {
                    Some(info) if (self.callback)(bytes, info) => self.retries.bump(),
                    _ => return Err(e),
                },
                ok => return ok,
            }
        }
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.upstream.deallocate(ptr, bytes, alignment, stream)
    }

    fn device(&self) -> &Device {
        self.upstream.device()
    }

    fn properties(&self) -> Properties {
        self.upstream.properties()
    }

    fn check_access(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.upstream.check_access(ptr, bytes)
    }
}
