//! `AlignedAdaptor`: alignments above the 256 bytes every resource serves
//! (RMM's aligned_resource_adaptor).
//!
//! The adaptor has an alignment of its own and a threshold: requests of at
//! least `threshold` bytes are aligned to the adaptor's alignment (or the
//! request's, if larger); smaller ones only to what the request asks. A request
//! whose resulting alignment is above 256 bytes is over-allocated from the
//! upstream by `alignment - 256` bytes and the first aligned address inside is
//! handed out; a table from that address to the upstream's pointer lets the
//! free go back to the upstream with the upstream's own pointer and size.
//!
//! Bad frees: an over-aligned allocation is freed only with its exact size,
//! whatever size or alignment the free names: a free of an address in the
//! table goes through the table, which compares sizes exactly. An
//! over-aligned free must name a live over-aligned allocation with its size,
//! else it is [`Error::InvalidFree`] (a double free is named as one while the
//! table remembers it) and nothing is freed. Other frees go to the upstream,
//! which checks them.
//!
//! Fast path: requests that need no more than 256-byte alignment are forwarded
//! untouched (two comparisons); their frees look in the table only while
//! over-aligned allocations are live (one atomic load otherwise).
//! Over-aligned ones cost one table insert and remove (one of 16 mutexes),
//! and `alignment - 256` bytes of upstream memory.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{HandedOut, MemoryResource, Properties, DEFAULT_ALIGNMENT};
use crate::stream::Stream;
use crate::{check_alignment, Error, OomInfo, Result};

/// RMM's default threshold: requests of 64 KiB and more get the adaptor's
/// alignment.
pub const DEFAULT_ALIGNMENT_THRESHOLD: usize = 64 << 10;

/// A resource serving alignments above 256 bytes by over-allocating.
#[derive(Debug)]
pub struct AlignedAdaptor<U> {
    upstream: U,
    alignment: usize,
    threshold: usize,
    /// Aligned pointer → bytes asked for, (upstream pointer, upstream bytes).
    over_aligned: HandedOut<(DevicePtr, usize)>,
    /// Over-aligned allocations live: while none is, a free of 256-byte
    /// alignment skips the table.
    over_aligned_live: AtomicUsize,
}

impl<U: MemoryResource> AlignedAdaptor<U> {
    /// Aligns requests of at least [`DEFAULT_ALIGNMENT_THRESHOLD`] bytes to
    /// `alignment`, a power of two ([`Error::BadAlignment`] otherwise).
    pub fn new(upstream: U, alignment: usize) -> Result<Self> {
        Self::with_threshold(upstream, alignment, DEFAULT_ALIGNMENT_THRESHOLD)
    }

    /// Aligns requests of at least `threshold` bytes to `alignment`.
    pub fn with_threshold(upstream: U, alignment: usize, threshold: usize) -> Result<Self> {
        check_alignment(alignment)?;
        Ok(Self {
            upstream,
            alignment,
            threshold,
            over_aligned: HandedOut::default(),
            over_aligned_live: AtomicUsize::new(0),
        })
    }

    /// The adaptor's alignment.
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Requests of this many bytes or more get the adaptor's alignment.
    pub fn threshold(&self) -> usize {
        self.threshold
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Over-aligned allocations outstanding.
    pub fn over_aligned_count(&self) -> usize {
        self.over_aligned.len()
    }

    /// The alignment a request gets.
    #[inline]
    fn effective(&self, bytes: usize, alignment: usize) -> usize {
        if bytes >= self.threshold {
            alignment.max(self.alignment)
        } else {
            alignment
        }
    }
}

impl<U: MemoryResource> MemoryResource for AlignedAdaptor<U> {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        check_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let align = self.effective(bytes, alignment);
        if align <= DEFAULT_ALIGNMENT {
            return self.upstream.allocate(bytes, alignment, stream);
        }
        let upstream_bytes = bytes
            .checked_add(align - DEFAULT_ALIGNMENT)
            .ok_or_else(|| Error::oom_with(OomInfo::requested(bytes)))?;
        let base = self
            .upstream
            .allocate(upstream_bytes, DEFAULT_ALIGNMENT, stream)
            .map_err(|e| match e {
                // Report what the caller asked for, not the padded size.
                Error::OutOfMemory(mut info) => {
                    info.requested = bytes;
                    Error::OutOfMemory(info)
                }
                other => other,
            })?;
        let aligned = DevicePtr(base.0.next_multiple_of(align as u64));
        self.over_aligned
            .insert(aligned, bytes, (base, upstream_bytes));
        self.over_aligned_live.fetch_add(1, Ordering::Relaxed);
        Ok(aligned)
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
        crate::error::check_alignment(alignment)?;
        // An over-aligned allocation freed as a small one would reach the
        // upstream, which could take it (its aligned address can be the
        // upstream's own) at the granule's precision, and leave its entry
        // live here: look in the table while it holds any. The allocation
        // happened before this free, so its count is seen.
        if self.effective(bytes, alignment) <= DEFAULT_ALIGNMENT
            && (self.over_aligned_live.load(Ordering::Relaxed) == 0
                || self.over_aligned.bytes_of(ptr).is_none())
        {
            return self.upstream.deallocate(ptr, bytes, alignment, stream);
        }
        let upstream = &self.upstream;
        self.over_aligned
            .free_with(ptr, bytes, |&(base, upstream_bytes)| {
                upstream.deallocate(base, upstream_bytes, DEFAULT_ALIGNMENT, stream)
            })?;
        self.over_aligned_live.fetch_sub(1, Ordering::Relaxed);
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
}
