//! `BinningResource`: routes each request to a bin by size.
//!
//! Algorithm: bins are `(max_size, resource)` pairs sorted by `max_size`; a
//! request of `bytes` goes to the first bin whose `max_size >= bytes` (a binary
//! search over a handful of entries), larger requests to the upstream.
//! Deallocation routes by size the same way, and a pointer is only ever freed
//! by the bin or upstream that handed it out: allocations taken straight from
//! the upstream are recorded (a sharded table, one insert and remove on that
//! path), so a free whose size names the upstream must name one of them, with
//! its size; a free whose size names a bin is checked by the bin. A free that
//! does not match is [`Error::InvalidFree`] (the reason found by asking the
//! fixed-size bins and the table whose block it is) and frees nothing. Bins are
//! usually [`FixedSizeResource`]s over the same upstream, one per power of two
//! ([`BinningResource::add_fixed_bins`]), but any resource can be a bin.
//!
//! Out of memory in a bin or the upstream: every fixed-size bin gives its
//! entirely free chunks back (after the streams that freed them are done;
//! while a capture is under way, only those known done without waiting),
//! then the request is retried once; a second failure is
//! [`Error::OutOfMemory`] with the numbers over all bins.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::fixed_size::{FixedSizeConfig, FixedSizeResource};
use super::stream_order::parked::{capturing, Parked};
use super::stream_order::streams::may_wait;
use super::Pool;
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{
    validate_request, HandedOut, LiveBlock, MemoryResource, Properties, SharedResource,
    DEFAULT_ALIGNMENT,
};
use crate::stream::Stream;
use crate::{Error, FreeError, OomInfo, Result};

enum BinKind<U: MemoryResource + 'static> {
    Fixed(Arc<FixedSizeResource<Arc<Metered<U>>>>),
    Other(SharedResource),
}

/// The upstream as the fixed-size bins (their chunks) and the direct
/// allocations reach it, counting the bytes it holds for them and their
/// peak: the resource's reserve. Two relaxed atomics per upstream call, on
/// paths that call the upstream anyway.
struct Metered<U> {
    upstream: U,
    held: AtomicUsize,
    peak: AtomicUsize,
}

impl<U> Metered<U> {
    fn count(&self, got: Result<DevicePtr>, bytes: usize) -> Result<DevicePtr> {
        let p = got?;
        let now = self.held.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Ok(p)
    }

    fn uncount(&self, ptr: DevicePtr, bytes: usize) {
        if !ptr.is_null() {
            self.held.fetch_sub(bytes, Ordering::Relaxed);
        }
    }
}

impl<U: MemoryResource> MemoryResource for Metered<U> {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        self.count(self.upstream.allocate(bytes, alignment, stream), bytes)
    }

    fn allocate_sync(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
        self.count(self.upstream.allocate_sync(bytes, alignment), bytes)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.upstream.deallocate(ptr, bytes, alignment, stream)?;
        self.uncount(ptr, bytes);
        Ok(())
    }

    fn deallocate_sync(&self, ptr: DevicePtr, bytes: usize, alignment: usize) -> Result<()> {
        self.upstream.deallocate_sync(ptr, bytes, alignment)?;
        self.uncount(ptr, bytes);
        Ok(())
    }

    fn device(&self) -> &Device {
        self.upstream.device()
    }

    fn properties(&self) -> Properties {
        self.upstream.properties()
    }
}

struct Bin<U: MemoryResource + 'static> {
    max_size: usize,
    kind: BinKind<U>,
}

impl<U: MemoryResource + 'static> Bin<U> {
    #[inline]
    fn resource(&self) -> &dyn MemoryResource {
        match &self.kind {
            BinKind::Fixed(f) => &**f,
            BinKind::Other(o) => &**o,
        }
    }
}

/// Configuration of a [`BinningResource`]. `Default`: no bins (every request
/// goes to the upstream until bins are added).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct BinningConfig {
    /// A [`FixedSizeResource`] bin over the upstream for each power of two
    /// `2^n` bytes, `n` in this range (`8 <= start <= end <= 40`); more bins
    /// can be added later ([`BinningResource::add_fixed_bins`],
    /// [`BinningResource::add_bin`]). `None`: no bins.
    pub fixed_bins: Option<RangeInclusive<u32>>,
}

impl BinningConfig {
    /// Fixed-size bins of `2^min_pow2 ..= 2^max_pow2` bytes.
    pub fn fixed_bins(min_pow2: u32, max_pow2: u32) -> Self {
        Self {
            fixed_bins: Some(min_pow2..=max_pow2),
        }
    }
}

/// Size-routed bins over an upstream.
///
/// ```
/// use gpumem::pool::{BinningConfig, BinningResource};
/// use gpumem::resource::{DeviceResource, MemoryResource};
/// # fn main() -> gpumem::Result<()> {
/// # let device = gpumem::Device::sim(Default::default());
/// // Bins of 256 B, 512 B, ... 1 MiB; larger requests go to the device.
/// let config = BinningConfig::fixed_bins(8, 20);
/// let mr = BinningResource::new(DeviceResource::new(device.clone()), config)?;
/// let stream = device.create_stream()?;
/// let small = mr.allocate(300, 256, &stream)?;
/// let big = mr.allocate(3 << 20, 256, &stream)?;
/// mr.deallocate(small, 300, 256, &stream)?;
/// mr.deallocate(big, 3 << 20, 256, &stream)?;
/// # Ok(()) }
/// ```
pub struct BinningResource<U: MemoryResource + 'static> {
    upstream: Arc<Metered<U>>,
    bins: Vec<Bin<U>>,
    /// Allocations taken straight from the upstream.
    direct: HandedOut,
    /// Direct allocations freed on capturing streams (see
    /// `stream_order::parked`; the fixed-size bins park their own): still
    /// held from the upstream, given back when the resource goes.
    parked: Parked,
}

impl<U: MemoryResource + 'static> std::fmt::Debug for BinningResource<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinningResource")
            .field("bins", &self.bin_sizes())
            .field("reserved_bytes", &Pool::reserved_bytes(self))
            .finish()
    }
}

impl<U: MemoryResource + 'static> BinningResource<U> {
    /// Bins over `upstream` as `config` asks. [`Error::InvalidArgument`] for
    /// fixed bins out of range.
    pub fn new(upstream: U, config: BinningConfig) -> Result<Self> {
        let mut b = Self::with_defaults(upstream)?;
        if let Some(range) = config.fixed_bins {
            b.add_fixed_bins(*range.start(), *range.end())?;
        }
        Ok(b)
    }

    /// No bins yet: every request goes to `upstream` until bins are added.
    /// Never fails (the `Result` keeps the shape of every pool's
    /// `with_defaults`).
    pub fn with_defaults(upstream: U) -> Result<Self> {
        Ok(Self {
            upstream: Arc::new(Metered {
                upstream,
                held: AtomicUsize::new(0),
                peak: AtomicUsize::new(0),
            }),
            bins: Vec::new(),
            direct: HandedOut::default(),
            parked: Parked::default(),
        })
    }

    /// Adds a [`FixedSizeResource`] over the upstream for each power of two
    /// from `2^min_pow2` to `2^max_pow2` bytes. [`Error::InvalidArgument`]
    /// unless `8 <= min_pow2 <= max_pow2 <= 40`.
    pub fn add_fixed_bins(&mut self, min_pow2: u32, max_pow2: u32) -> Result<()> {
        if !(8..=40).contains(&min_pow2) || !(min_pow2..=40).contains(&max_pow2) {
            return Err(Error::InvalidArgument(format!(
                "fixed bins 2^{min_pow2}..2^{max_pow2}: need 8 <= min <= max <= 40"
            )));
        }
        for p in min_pow2..=max_pow2 {
            self.add_fixed_bin(1usize << p)?;
        }
        Ok(())
    }

    /// Adds (or replaces) a [`FixedSizeResource`] bin of `block_size` bytes
    /// over the upstream.
    pub fn add_fixed_bin(&mut self, block_size: usize) -> Result<()> {
        let config = FixedSizeConfig::with_block_size(block_size);
        let f = FixedSizeResource::new(self.upstream.clone(), config)?;
        self.insert(Bin {
            max_size: block_size,
            kind: BinKind::Fixed(Arc::new(f)),
        });
        Ok(())
    }

    /// Adds (or replaces) a bin serving requests up to `max_size` bytes (and
    /// above the next smaller bin) from `resource`, which must serve the same
    /// device. [`Error::InvalidArgument`] for `max_size` 0.
    pub fn add_bin(
        &mut self,
        max_size: usize,
        resource: impl MemoryResource + 'static,
    ) -> Result<()> {
        if max_size == 0 {
            return Err(Error::InvalidArgument(
                "a bin's max size must be non-zero".into(),
            ));
        }
        self.insert(Bin {
            max_size,
            kind: BinKind::Other(Arc::new(resource)),
        });
        Ok(())
    }

    fn insert(&mut self, bin: Bin<U>) {
        match self
            .bins
            .binary_search_by_key(&bin.max_size, |b| b.max_size)
        {
            Ok(i) => self.bins[i] = bin,
            Err(i) => self.bins.insert(i, bin),
        }
    }

    /// The bins' max sizes, ascending.
    pub fn bin_sizes(&self) -> Vec<usize> {
        self.bins.iter().map(|b| b.max_size).collect()
    }

    /// The upstream resource (larger requests, and the fixed bins' chunks).
    pub fn upstream(&self) -> &U {
        &self.upstream.upstream
    }

    #[inline]
    fn bin_for(&self, bytes: usize) -> Option<&Bin<U>> {
        self.bins
            .get(self.bins.partition_point(|b| b.max_size < bytes))
    }

    fn fixed(&self) -> impl Iterator<Item = &FixedSizeResource<Arc<Metered<U>>>> {
        self.bins.iter().filter_map(|b| match &b.kind {
            BinKind::Fixed(f) => Some(&**f),
            BinKind::Other(_) => None,
        })
    }

    /// Processes the deferred frees of every fixed-size bin (never blocks).
    pub fn process_deferred(&self) -> Result<()> {
        let mut first = Ok(());
        for f in self.fixed() {
            if let Err(e) = f.process_deferred() {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Runs `give_back` on every fixed-size bin with the bytes still to give
    /// back before the resource holds at most `to`, while some are; returns
    /// the bytes given back, or the first error once every bin was tried.
    fn give_back(
        &self,
        to: usize,
        give_back: impl Fn(&FixedSizeResource<Arc<Metered<U>>>, usize) -> Result<usize>,
    ) -> Result<usize> {
        let mut total = 0;
        let mut first = None;
        for f in self.fixed() {
            let excess = Pool::reserved_bytes(self).saturating_sub(to);
            if excess == 0 {
                break;
            }
            match give_back(f, excess) {
                Ok(b) => total += b,
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(total), Err)
    }

    /// Bytes callers hold from the fixed-size bins and the upstream (other
    /// bins are not counted).
    pub fn live_bytes(&self) -> usize {
        self.fixed().map(|f| f.live_bytes()).sum::<usize>() + self.direct.bytes()
    }

    /// Bytes of free blocks in the fixed-size bins.
    pub fn free_bytes(&self) -> usize {
        self.fixed().map(|f| f.free_bytes()).sum()
    }

    /// The blocks handed out, in address order: the fixed-size bins' blocks
    /// (their block size) and the allocations taken straight from the
    /// upstream (rounded up to 256 bytes), both with the bytes asked for. Blocks
    /// of other bins are not listed. O(blocks).
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        let mut out: Vec<LiveBlock> = self.fixed().flat_map(|f| f.live_blocks()).collect();
        out.extend(self.direct.live_blocks());
        out.sort_unstable();
        out
    }

    /// The size of the live block starting at `ptr` (a fixed bin's block
    /// size, or a direct allocation's bytes rounded up to 256), if there is
    /// one.
    pub fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        self.direct
            .bytes_of(ptr)
            .map(|b| b.next_multiple_of(DEFAULT_ALIGNMENT))
            .or_else(|| self.fixed().find_map(|f| f.live_block_size(ptr)))
    }

    /// The largest free block of the fixed-size bins (the upstream's free
    /// memory is the upstream's to report).
    pub fn largest_free_block(&self) -> usize {
        self.fixed()
            .map(|f| f.largest_free_block())
            .max()
            .unwrap_or(0)
    }

    fn oom_info(&self, requested: usize) -> OomInfo {
        OomInfo {
            requested,
            device: Some(self.upstream.device().ordinal()),
            reserved: Some(Pool::reserved_bytes(self)),
            live: Some(self.live_bytes()),
            largest_free: Some(self.largest_free_block()),
            limit: None,
        }
    }

    fn try_allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        match self.bin_for(bytes) {
            Some(bin) => bin.resource().allocate(bytes, alignment, stream),
            None => {
                let p = self.upstream.allocate(bytes, alignment, stream)?;
                self.direct.insert(p, bytes, ());
                Ok(p)
            }
        }
    }

    /// Frees `ptr` where `bytes` routes it: the bin of that size, or the
    /// upstream when it is one of the direct allocations, of that size.
    /// `stream` `None`: no stream uses the memory any more.
    #[inline]
    fn free(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: Option<&Stream>,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        crate::error::check_alignment(alignment)?;
        match self.bin_for(bytes) {
            Some(bin) => {
                let r = match stream {
                    Some(s) => bin.resource().deallocate(ptr, bytes, alignment, s),
                    None => bin.resource().deallocate_sync(ptr, bytes, alignment),
                };
                match r {
                    Err(Error::InvalidFree {
                        reason: FreeError::Unknown,
                        ..
                    }) => Err(self.misrouted(ptr, bytes)),
                    other => other,
                }
            }
            None => {
                let up = &self.upstream;
                let r = self.direct.free_with(ptr, bytes, |_| match stream {
                    Some(s) if capturing(s) => self.parked.park(ptr, bytes),
                    Some(s) => up.deallocate(ptr, bytes, alignment, s),
                    None => up.deallocate_sync(ptr, bytes, alignment),
                });
                match r {
                    // Not a live direct allocation: maybe a bin's block.
                    Err(Error::InvalidFree {
                        reason: FreeError::Unknown | FreeError::DoubleFree,
                        ..
                    }) => Err(self.misrouted(ptr, bytes)),
                    other => other,
                }
            }
        }
    }

    /// Why a free of `ptr` with `bytes` found no block where the size sent
    /// it: the block is elsewhere (a direct allocation or another fixed bin's
    /// block, allocated with another size), already free, or not ours.
    #[cold]
    fn misrouted(&self, ptr: DevicePtr, bytes: usize) -> Error {
        let mismatch = |allocated| FreeError::SizeMismatch {
            allocated,
            freed: bytes,
        };
        let reason = if self.parked.contains(ptr) {
            FreeError::DoubleFree
        } else if let Some(allocated) = self.direct.bytes_of(ptr) {
            mismatch(allocated)
        } else if let Some(state) = self.fixed().find_map(|f| f.lookup(ptr)) {
            state.map_or(FreeError::DoubleFree, mismatch)
        } else if self.direct.recently_freed(ptr) {
            FreeError::DoubleFree
        } else {
            FreeError::Unknown
        };
        Error::InvalidFree { ptr: ptr.0, reason }
    }
}

/// The resource's reserve is what its fixed-size bins hold from the upstream
/// (their chunks) plus the allocations taken straight from it; bins of other
/// resources hold their own. [`Pool::trim`] and [`Pool::release`] give back
/// the fixed-size bins' entirely free chunks (see [`FixedSizeResource`]).
impl<U: MemoryResource + 'static> Pool for BinningResource<U> {
    fn reserved_bytes(&self) -> usize {
        self.upstream.held.load(Ordering::Relaxed)
    }

    fn peak_reserved_bytes(&self) -> usize {
        self.upstream.peak.load(Ordering::Relaxed)
    }

    fn reset_peak(&self) {
        let now = Pool::reserved_bytes(self);
        self.upstream.peak.store(now, Ordering::Relaxed);
    }

    fn trim(&self, to: usize) -> Result<usize> {
        self.give_back(to, |f, excess| {
            f.trim(Pool::reserved_bytes(f).saturating_sub(excess))
        })
    }

    fn release(&self) -> Result<usize> {
        self.give_back(0, |f, _| f.release())
    }
}

impl<U: MemoryResource + 'static> Drop for BinningResource<U> {
    fn drop(&mut self) {
        let up = &self.upstream;
        self.parked.give_back(up.device(), |p, bytes| {
            up.deallocate_sync(p, bytes, DEFAULT_ALIGNMENT)
        });
    }
}

impl<U: MemoryResource + 'static> MemoryResource for BinningResource<U> {
    #[inline]
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        match self.try_allocate(bytes, alignment, stream) {
            Err(e) if e.is_oom() => {
                // Waiting for the bins' streams only where it may (see
                // `stream_order::streams::may_wait`).
                let _ = match may_wait() {
                    true => Pool::release(self),
                    false => Pool::trim(self, 0),
                };
                match self.try_allocate(bytes, alignment, stream) {
                    Err(e) if e.is_oom() => Err(Error::oom_with(self.oom_info(bytes))),
                    other => other,
                }
            }
            other => other,
        }
    }

    #[inline]
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.free(ptr, bytes, alignment, Some(stream))
    }

    fn device(&self) -> &Device {
        self.upstream.device()
    }

    fn properties(&self) -> Properties {
        self.upstream.properties()
    }

    fn deallocate_sync(&self, ptr: DevicePtr, bytes: usize, alignment: usize) -> Result<()> {
        self.free(ptr, bytes, alignment, None)
    }
}
