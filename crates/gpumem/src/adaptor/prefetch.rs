//! `PrefetchAdaptor`: prefetches managed memory to the device right after it is
//! allocated (RMM's prefetch_resource_adaptor), so the first kernel touching
//! it does not page-fault it over piece by piece.
//!
//! The upstream's memory counts as managed when it is both host- and
//! device-accessible ([`Properties::HOST_AND_DEVICE`]); for any other upstream
//! the adaptor is a pass-through. The prefetch is enqueued on the allocation's
//! stream to the upstream's device (`cuMemPrefetchAsync`). It is a hint: if the
//! driver refuses it (pinned host memory is also host- and device-accessible
//! but cannot be prefetched), the allocation still succeeds and the failure is
//! counted ([`PrefetchAdaptor::prefetch_failures`]).
//!
//! Fast path: one asynchronous driver call per allocation of managed memory
//! (a few µs on CUDA); nothing otherwise.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{MemoryResource, Properties};
use crate::stream::Stream;
use crate::{check_alignment, Result};

/// A resource that prefetches managed allocations to the device.
#[derive(Debug)]
pub struct PrefetchAdaptor<U> {
    upstream: U,
    managed: bool,
    prefetches: AtomicU64,
    failures: AtomicU64,
}

impl<U: MemoryResource> PrefetchAdaptor<U> {
    /// Wraps `upstream`.
    pub fn new(upstream: U) -> Self {
        let p = upstream.properties();
        Self {
            managed: p.host_accessible && p.device_accessible,
            upstream,
            prefetches: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// Whether allocations are prefetched (the upstream's memory is managed).
    pub fn prefetches_enabled(&self) -> bool {
        self.managed
    }

    /// Prefetches enqueued successfully.
    pub fn prefetches(&self) -> u64 {
        self.prefetches.load(Ordering::Relaxed)
    }

    /// Prefetches the driver refused.
    pub fn prefetch_failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }
}

impl<U: MemoryResource> MemoryResource for PrefetchAdaptor<U> {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        check_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let ptr = self.upstream.allocate(bytes, alignment, stream)?;
        if self.managed {
            let device = self.upstream.device();
            let counter = match stream.prefetch(ptr, bytes, device) {
                Ok(()) => &self.prefetches,
                Err(_) => &self.failures,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Ok(ptr)
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
