//! `LimitingAdaptor`: caps the bytes allocated through it (RMM's
//! limiting_resource_adaptor).
//!
//! Bytes are counted at the 256-byte allocation granularity
//! ([`ALLOCATION_GRANULARITY`]): a 1-byte allocation counts 256 bytes, since
//! that is what it takes from any driver allocator or pool. A request that
//! would take the count above the limit fails with [`Error::OutOfMemory`]
//! carrying the limit, the requested bytes and the bytes live, without reaching
//! the upstream.
//!
//! The limit can be changed at any time ([`LimitingAdaptor::set_limit`]):
//! lowering it below the bytes live fails the requests that would need more
//! until enough is freed; nothing live is touched.
//!
//! Fast path: lock-free. One load of the limit and one compare-exchange loop
//! reserve the bytes before the upstream call (so concurrent requests can
//! never overshoot the limit); an upstream failure or a free gives them back
//! with one atomic subtraction.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{granular_size, oom_device, ALLOCATION_GRANULARITY};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::growable::not_growable;
use crate::resource::{GrowInPlace, MemoryResource, Properties, Segment};
use crate::stream::Stream;
use crate::{check_alignment, Error, OomInfo, Result};

/// A resource that fails requests beyond a byte limit.
#[derive(Debug)]
pub struct LimitingAdaptor<U> {
    upstream: U,
    limit: AtomicUsize,
    used: AtomicUsize,
}

impl<U: MemoryResource> LimitingAdaptor<U> {
    /// Wraps `upstream`, allowing at most `limit` bytes (counted at the 256-byte
    /// granularity) to be allocated through this adaptor at once.
    pub fn new(upstream: U, limit: usize) -> Self {
        Self {
            upstream,
            limit: AtomicUsize::new(limit),
            used: AtomicUsize::new(0),
        }
    }

    /// The byte limit.
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Changes the byte limit. Allocations live now stay; requests that would
    /// take the bytes live above the new limit fail from now on.
    pub fn set_limit(&self, limit: usize) {
        self.limit.store(limit, Ordering::Relaxed);
    }

    /// Bytes allocated through this adaptor and not yet freed, each allocation
    /// rounded up to 256 bytes.
    pub fn allocated_bytes(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes that can still be allocated before the limit is reached.
    pub fn available_bytes(&self) -> usize {
        self.limit().saturating_sub(self.allocated_bytes())
    }

    /// The granularity allocations are counted at (256 bytes).
    pub fn granularity(&self) -> usize {
        ALLOCATION_GRANULARITY
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Counts `counted` more bytes, or fails with the over-limit error for a
    /// request of `bytes`.
    fn take(&self, bytes: usize, counted: usize) -> Result<()> {
        let limit = self.limit();
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |used| {
                used.checked_add(counted).filter(|n| *n <= limit)
            })
            .map(drop)
            .map_err(|live| self.over_limit(bytes, live, limit))
    }

    /// Counts `counted` bytes fewer.
    fn give_back(&self, counted: usize) {
        // Saturating: a free with a wrong (larger) size is a caller error that
        // must not wrap the counter around and disable the limit.
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |used| {
                Some(used.saturating_sub(counted))
            });
    }

    fn over_limit(&self, bytes: usize, live: usize, limit: usize) -> Error {
        Error::oom_with(OomInfo {
            requested: bytes,
            device: oom_device(self.upstream.device(), self.upstream.properties()),
            live: Some(live),
            limit: Some(limit),
            ..OomInfo::default()
        })
    }
}

impl<U: MemoryResource> MemoryResource for LimitingAdaptor<U> {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        check_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let Some(counted) = granular_size(bytes) else {
            return Err(self.over_limit(bytes, self.allocated_bytes(), self.limit()));
        };
        self.take(bytes, counted)?;
        self.upstream
            .allocate(bytes, alignment, stream)
            .inspect_err(|_| self.give_back(counted))
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        self.upstream.deallocate(ptr, bytes, alignment, stream)?;
        self.give_back(granular_size(bytes).unwrap_or(usize::MAX));
        Ok(())
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

    fn grow_in_place(&self) -> Option<&dyn GrowInPlace> {
        self.upstream
            .grow_in_place()
            .map(|_| self as &dyn GrowInPlace)
    }

    fn driver_segments(&self) -> Option<Vec<Segment>> {
        self.upstream.driver_segments()
    }
}

/// Growth counts against the limit as allocations do: a growth that would
/// pass it fails without reaching the upstream.
impl<U: MemoryResource> GrowInPlace for LimitingAdaptor<U> {
    fn growth_granularity(&self) -> usize {
        self.upstream
            .grow_in_place()
            .map_or(ALLOCATION_GRANULARITY, |g| g.growth_granularity())
    }

    fn allocate_growable(&self, bytes: usize, capacity: usize) -> Result<DevicePtr> {
        // Pieces of any size: whole growths, as the upstream's own call.
        self.allocate_growable_in_pieces(bytes, capacity, usize::MAX)
    }

    fn allocate_growable_in_pieces(
        &self,
        bytes: usize,
        capacity: usize,
        max_piece: usize,
    ) -> Result<DevicePtr> {
        let g = self.upstream.grow_in_place().ok_or_else(not_growable)?;
        let Some(counted) = granular_size(bytes) else {
            return Err(self.over_limit(bytes, self.allocated_bytes(), self.limit()));
        };
        self.take(bytes, counted)?;
        g.allocate_growable_in_pieces(bytes, capacity, max_piece)
            .inspect_err(|_| self.give_back(counted))
    }

    fn grow(&self, ptr: DevicePtr, bytes: usize, new_bytes: usize) -> Result<()> {
        let g = self.upstream.grow_in_place().ok_or_else(not_growable)?;
        let (Some(old), Some(new)) = (granular_size(bytes), granular_size(new_bytes)) else {
            return Err(self.over_limit(new_bytes, self.allocated_bytes(), self.limit()));
        };
        let more = new.saturating_sub(old);
        self.take(more, more)?;
        g.grow(ptr, bytes, new_bytes)
            .inspect_err(|_| self.give_back(more))
    }

    fn shrink(&self, ptr: DevicePtr, bytes: usize, new_bytes: usize) -> Result<usize> {
        let g = self.upstream.grow_in_place().ok_or_else(not_growable)?;
        let kept = g.shrink(ptr, bytes, new_bytes)?;
        let (old, new) = (granular_size(bytes), granular_size(kept));
        self.give_back(old.unwrap_or(0).saturating_sub(new.unwrap_or(0)));
        Ok(kept)
    }

    fn pieces(&self, ptr: DevicePtr, bytes: usize) -> Result<Vec<(usize, usize)>> {
        let g = self.upstream.grow_in_place().ok_or_else(not_growable)?;
        g.pieces(ptr, bytes)
    }

    /// Counts nothing: the bytes stay (splits fall between pieces, whole
    /// granules).
    fn split(&self, ptr: DevicePtr, bytes: usize, at: usize) -> Result<DevicePtr> {
        let g = self.upstream.grow_in_place().ok_or_else(not_growable)?;
        g.split(ptr, bytes, at)
    }

    /// Counts nothing: the same memory moves from `src` to `dst`.
    fn recycle(
        &self,
        src: DevicePtr,
        src_bytes: usize,
        dst: DevicePtr,
        dst_bytes: usize,
    ) -> Result<()> {
        let g = self.upstream.grow_in_place().ok_or_else(not_growable)?;
        g.recycle(src, src_bytes, dst, dst_bytes)
    }
}
