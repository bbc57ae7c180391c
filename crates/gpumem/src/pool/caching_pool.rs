//! `CachingPool` (the seeds' CudaMemPool): power-of-two size classes from
//! 512 B to 2 GiB, finer classes above, each with its own lock and free
//! lists, over an upstream.
//!
//! Algorithm: a request up to `max_block_size` (2 GiB) is rounded up to its
//! class (`next_power_of_two`, at least `min_block_size`); classes smaller
//! than `chunk_size` (2 MiB) are carved from chunks of `chunk_size`, larger
//! ones take one upstream allocation per block. Above `max_block_size`, up
//! to 2^40 bytes, there are `large_class_steps` (8) classes per doubling: a
//! request takes the next eighth of its power of two (2.25, 2.5, ... 4 GiB
//! above 2 GiB), each block one upstream allocation. Frees follow the
//! pools' stream-ordering policy (see the `pool` module): a block freed on S
//! is reused by S at once; other streams get it when one of S's batch
//! events (one per stream per `batch_size` frees or per
//! [`CachingPool::process_deferred`]) shows it complete, when S is found
//! idle, or by waiting for S. Requests above 2^40 bytes (above
//! `max_block_size` with `large_class_steps` 0) go straight to the upstream
//! and back to it when freed (not cached).
//!
//! Why the classes above 2 GiB: such requests used to bypass the cache,
//! since a power-of-two class rounds 2.1 GB up to 4 GiB. A loop that asks
//! for such a block in every iteration then paid a driver allocation and a
//! driver free (which waits for the stream's work) in every iteration, each
//! dearer than all of the iteration's other operations together
//! (`docs/decisions.md`, "The caching pool above 2 GiB"). The finer
//! classes keep the rounding within an eighth. But a size that changes
//! every iteration would leave a cached block of GiBs in each class it
//! passes through, so two rules bound the cache from the `max_block_size`
//! class up (the largest power-of-two class included: sizes on both sides
//! of 2 GiB are one size that varies): a request whose class has no free
//! block takes one of the next `large_class_steps` classes (a block at most
//! twice its own class's, the rounding the power-of-two classes allow), and
//! before one of these classes grows, the free blocks of the smaller ones,
//! which cannot serve the request, go back to the upstream (those known
//! complete: the streams are polled, not waited for). Once warm, a loop
//! whose large sizes vary within a factor of two is served without a
//! driver call by the largest blocks it has needed at once. The classes
//! below keep their free blocks until a trim, a release or memory pressure,
//! as before: a size that varies within a power of two stays in one class,
//! and their blocks are small next to these. Splitting large blocks (best
//! fit with a remainder)
//! would round less, but blocks of one class would no longer be
//! interchangeable, which the per-stream free lists rely on.
//!
//! Costs: the fast path (a cached class, same stream or a completed block) is
//! one class lock, a deque pop or push and a hash-map insert or remove, with
//! no driver call, no event and no global lock. The bytes reserved from the
//! upstream are an atomic (touched only when growing and releasing); live
//! and cached bytes are counted per class under the class lock the fast path
//! holds anyway and summed when read, so concurrent threads share no counter.
//!
//! Out of memory (upstream failure or `max_reserved`): the streams holding
//! free blocks are synchronized and entirely free chunks go back to the
//! upstream, the largest first, just enough to make room for the request's
//! block, and the request is retried; then every free chunk goes back and it
//! is retried again; then [`Error::OutOfMemory`] carries the requested,
//! reserved and live bytes and the largest free block. A loop whose sizes
//! change every iteration at the memory limit thus keeps most of its cache
//! rather than taking it all from the upstream again.

use std::sync::Mutex;

use super::ptr_map::PtrMap;
use super::slab::{ClassSpec, ClassStats, Freed, Slab, SlabConfig};
use super::stream_order::parked::Parked;
use super::stream_order::streams::may_wait;
use super::stream_order::sync::lock;
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{
    validate_request, DeviceResource, LiveBlock, MemoryResource, Properties, DEFAULT_ALIGNMENT,
};
use crate::stream::Stream;
use crate::{Error, FreeError, OomInfo, Result};

/// log2 of the largest class's block (and of the largest `max_block_size`).
const LARGEST_SHIFT: u32 = 40;

/// Configuration of a [`CachingPool`]. `Default` gives the documented values.
///
/// Two fields are hidden from this documentation: `large_class_steps` and
/// `batch_size` are the pool's tuning, which the project's own measurements
/// turn (`docs/decisions.md`). They are not part of the stable API.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct CachingPoolConfig {
    /// Most bytes the pool may hold from its upstream: its chunks and its
    /// live blocks above the largest class. A request that would pass it is
    /// out of memory (after giving back free chunks). `None` (default): no
    /// limit; `Some(0)` is refused.
    pub max_reserved: Option<usize>,
    /// Smallest class, in bytes: a power of two, at least 256 (default 512).
    pub min_block_size: usize,
    /// Largest power-of-two class: a power of two, at least
    /// `min_block_size`, at most 2^40 (default 2 GiB). Larger requests take
    /// the classes of `large_class_steps`.
    pub max_block_size: usize,
    /// Classes per doubling above `max_block_size`, up to 2^40 bytes: 0, or
    /// a power of two of at most 64 that cuts `max_block_size` into steps of
    /// at least 256 bytes (default 8). A request above `max_block_size`
    /// takes the next step of its power of two, one upstream allocation per
    /// block, cached. A request of these classes or of the `max_block_size`
    /// class whose class has no free block may take one of the next
    /// `large_class_steps` classes (at most twice its own class's block), and
    /// growing one of them gives the free blocks of the smaller ones back
    /// (see the module documentation). 0: requests above `max_block_size`
    /// bypass the cache (an upstream allocation and free each), as requests
    /// above 2^40 do.
    #[doc(hidden)]
    pub large_class_steps: usize,
    /// Classes smaller than this are carved from chunks of this many bytes:
    /// a multiple of 256 (default 2 MiB).
    pub chunk_size: usize,
    /// Frees are ordered on their stream (default). With `false` the stream
    /// arguments of frees are ignored: a free promises that no work uses the
    /// block any more, and every block is shared by all streams.
    pub stream_ordered: bool,
    /// A stream that finds no completed block may be made to wait for another
    /// stream's free blocks (one event record and one stream wait) rather
    /// than grow the pool (default `true`).
    pub cross_stream_wait: bool,
    /// Frees on one stream after which a batch event is recorded (default 256).
    #[doc(hidden)]
    pub batch_size: usize,
}

impl Default for CachingPoolConfig {
    fn default() -> Self {
        Self {
            max_reserved: None,
            min_block_size: 512,
            max_block_size: 2 << 30,
            large_class_steps: 8,
            chunk_size: 2 << 20,
            stream_ordered: true,
            cross_stream_wait: true,
            batch_size: 256,
        }
    }
}

impl CachingPoolConfig {
    /// Checks the configuration; [`Error::InvalidArgument`] names the bad field.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.max_reserved == Some(0) {
            return bad("max_reserved must be non-zero".into());
        }
        if !self.min_block_size.is_power_of_two() || self.min_block_size < DEFAULT_ALIGNMENT {
            return bad(format!(
                "min_block_size {} must be a power of two of at least {DEFAULT_ALIGNMENT}",
                self.min_block_size
            ));
        }
        if !self.max_block_size.is_power_of_two()
            || self.max_block_size < self.min_block_size
            || self.max_block_size > 1 << LARGEST_SHIFT
        {
            return bad(format!(
                "max_block_size {} must be a power of two between min_block_size {} and 2^40",
                self.max_block_size, self.min_block_size
            ));
        }
        let steps = self.large_class_steps;
        if steps != 0
            && (!steps.is_power_of_two()
                || steps > 64
                || self.max_block_size / steps < DEFAULT_ALIGNMENT)
        {
            return bad(format!(
                "large_class_steps {steps} must be 0 or a power of two of at most 64 and at most \
                 max_block_size {} / {DEFAULT_ALIGNMENT}",
                self.max_block_size
            ));
        }
        if self.chunk_size == 0 || !self.chunk_size.is_multiple_of(DEFAULT_ALIGNMENT) {
            return bad(format!(
                "chunk_size {} must be a non-zero multiple of {DEFAULT_ALIGNMENT}",
                self.chunk_size
            ));
        }
        if self.batch_size == 0 {
            return bad("batch_size must be non-zero".into());
        }
        Ok(())
    }
}

/// What a [`CachingPool`] holds, by class.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CachingPoolStats {
    /// Bytes held from the upstream (chunks and uncached blocks above the
    /// largest class).
    pub reserved: usize,
    /// Highest `reserved` since the pool was made or its peak was reset.
    pub peak_reserved: usize,
    /// Bytes callers asked for and have not freed.
    pub live: usize,
    /// Bytes of free cached blocks.
    pub free: usize,
    /// Bytes of blocks freed on a stream while it captured a CUDA graph:
    /// kept for the graph until the pool goes.
    pub parked: usize,
    /// Live allocations above the largest class (served by the upstream).
    pub large_allocations: usize,
    /// One entry per class, smallest first.
    pub classes: Vec<ClassStats>,
}

/// A caching, stream-ordered pool of power-of-two size classes.
///
/// Thread-safe; use it through [`MemoryResource`] (for example as the
/// resource of a [`DeviceBuffer`](crate::DeviceBuffer)`<T, &CachingPool>`) or
/// through [`CachingPool::allocate_async`] / [`CachingPool::deallocate_async`].
/// The synchronous forms are the trait's `allocate_sync` / `deallocate_sync`.
///
/// ```
/// use gpumem::pool::CachingPool;
/// use gpumem::resource::DeviceResource;
/// use gpumem::DeviceBuffer;
/// # fn main() -> gpumem::Result<()> {
/// # let device = gpumem::Device::sim(Default::default());
/// let pool = CachingPool::with_defaults(DeviceResource::new(device.clone()))?;
/// let stream = device.create_stream()?;
/// let p = pool.allocate_async(1 << 20, &stream)?;
/// pool.deallocate_async(p, Some(1 << 20), &stream)?;
/// let buf = DeviceBuffer::<f32, _>::new(1024, &pool, &stream)?;
/// assert_eq!(pool.live_bytes(), 4096);
/// drop(buf);
/// assert_eq!(pool.live_bytes(), 0);
/// # Ok(()) }
/// ```
pub struct CachingPool<U: MemoryResource = DeviceResource> {
    slab: Slab<U>,
    config: CachingPoolConfig,
    min_shift: u32,
    /// The power-of-two classes (the classes above come after them).
    pow2_classes: usize,
    /// log2 of `large_class_steps`.
    steps_shift: u32,
    /// The largest class's block: larger requests go to the upstream.
    largest: usize,
    /// The largest request whose block is always of its own class (frees
    /// of larger ones look their block's class up by address).
    own_class_max: usize,
    /// Requests above `largest`: pointer → bytes.
    large: Mutex<PtrMap<usize>>,
    /// Large blocks freed on capturing streams (see `stream_order::parked`):
    /// still held from the upstream, given back when the pool goes. Cached
    /// blocks park in the slab.
    parked: Parked,
}

impl<U: MemoryResource> std::fmt::Debug for CachingPool<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingPool")
            .field("config", &self.config)
            .field("reserved_bytes", &self.slab.reserved())
            .finish()
    }
}

impl<U: MemoryResource> CachingPool<U> {
    /// A pool over `upstream`. [`Error::InvalidArgument`] for a bad
    /// configuration.
    pub fn new(upstream: U, config: CachingPoolConfig) -> Result<Self> {
        config.validate()?;
        let min_shift = config.min_block_size.trailing_zeros();
        let max_shift = config.max_block_size.trailing_zeros();
        let steps = config.large_class_steps;
        let max_block_size = config.max_block_size;
        let spec = |block: usize| ClassSpec {
            block,
            chunk_blocks: (config.chunk_size / block).max(1),
        };
        let mut specs: Vec<ClassSpec> = (min_shift..=max_shift).map(|s| spec(1 << s)).collect();
        let pow2_classes = specs.len();
        let steps_shift = steps.trailing_zeros();
        if steps > 0 {
            for k in max_shift..LARGEST_SHIFT {
                let step = (1usize << k) >> steps_shift;
                specs.extend((1..=steps).map(|j| spec((1 << k) + j * step)));
            }
        }
        let largest = specs.last().map_or(0, |c| c.block);
        let slab = Slab::new(
            upstream,
            &specs,
            SlabConfig {
                stream_ordered: config.stream_ordered,
                cross_stream_wait: config.cross_stream_wait,
                batch_size: config.batch_size as u64,
                max_reserved: config.max_reserved.unwrap_or(usize::MAX),
                // From the `max_block_size` class up (see the module docs).
                borrow_from: if steps > 0 {
                    pow2_classes - 1
                } else {
                    usize::MAX
                },
                borrow: steps,
            },
        );
        Ok(Self {
            slab,
            config,
            min_shift,
            pow2_classes,
            steps_shift,
            largest,
            own_class_max: if steps > 0 {
                max_block_size / 2
            } else {
                max_block_size
            },
            large: Mutex::new(PtrMap::default()),
            parked: Parked::default(),
        })
    }

    /// A pool over `upstream` with the default configuration.
    pub fn with_defaults(upstream: U) -> Result<Self> {
        Self::new(upstream, CachingPoolConfig::default())
    }

    /// The configuration.
    pub fn config(&self) -> &CachingPoolConfig {
        &self.config
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &U {
        self.slab.upstream()
    }

    /// The class of a request of `bytes` (at most `max_block_size`).
    #[inline]
    fn class_of(&self, bytes: usize) -> usize {
        let s = bytes.max(1).next_power_of_two();
        (s.trailing_zeros().saturating_sub(self.min_shift)) as usize
    }

    /// The class of a request of `bytes` above `max_block_size` and at most
    /// `largest`: in (2^k, 2^(k+1)], the `j`th step of 2^k / steps above 2^k.
    fn large_class_of(&self, bytes: usize) -> usize {
        let k = usize::BITS - 1 - (bytes - 1).leading_zeros();
        let step = (1usize << k) >> self.steps_shift;
        let j = (bytes - (1 << k)).div_ceil(step);
        let first = (k - self.config.max_block_size.trailing_zeros()) << self.steps_shift;
        self.pow2_classes + first as usize + j - 1
    }

    /// The class a request of `bytes` belongs to (`None`: above the largest
    /// class, served by the upstream as it is).
    fn class_for(&self, bytes: usize) -> Option<usize> {
        if bytes <= self.config.max_block_size {
            Some(self.class_of(bytes))
        } else {
            (bytes <= self.largest).then(|| self.large_class_of(bytes))
        }
    }

    /// The block size of the class a request of `bytes` belongs to (`None`:
    /// above the largest class, served by the upstream as it is). A request
    /// above `max_block_size` may get a larger block of the classes above
    /// its own ([`CachingPool::live_block_size`] tells).
    pub fn block_size_for(&self, bytes: usize) -> Option<usize> {
        self.class_for(bytes).map(|c| self.slab.block_size(c))
    }

    /// Allocates `bytes` (256-byte aligned) for use on `stream`.
    #[inline]
    pub fn allocate_async(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        if bytes <= self.config.max_block_size {
            self.slab.allocate(self.class_of(bytes), bytes, stream)
        } else if bytes <= self.largest {
            self.slab
                .allocate(self.large_class_of(bytes), bytes, stream)
        } else {
            self.allocate_large(bytes, stream)
        }
    }

    /// Frees `ptr` once the work enqueued on `stream` so far has run. `bytes`
    /// is the size allocated, or `None` to look it up (slower: a read lock on
    /// the chunk index).
    #[inline]
    pub fn deallocate_async(
        &self,
        ptr: DevicePtr,
        bytes: Option<usize>,
        stream: &Stream,
    ) -> Result<()> {
        self.free(ptr, bytes, Some(stream))
    }

    #[inline]
    fn free(&self, ptr: DevicePtr, bytes: Option<usize>, stream: Option<&Stream>) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let freed = stream.map_or(Freed::Done, Freed::on);
        match bytes {
            Some(b) if b <= self.own_class_max => self
                .slab
                .deallocate(self.class_of(b), ptr, bytes, freed)
                .map_err(|e| self.explain(e, ptr, b)),
            Some(b) => self.free_above(ptr, b, freed),
            None => match self.slab.locate(ptr) {
                Some(class) => self.slab.deallocate(class, ptr, None, freed),
                None => self.free_large(ptr, None, freed),
            },
        }
    }

    /// A free of a size above `own_class_max`: the block may be of a class
    /// above the size's own (see the module documentation), so its class is
    /// looked up by address.
    #[cold]
    fn free_above(&self, ptr: DevicePtr, bytes: usize, freed: Freed<'_>) -> Result<()> {
        match self.slab.locate(ptr) {
            Some(class) => self
                .slab
                .deallocate(class, ptr, Some(bytes), freed)
                .map_err(|e| self.explain(e, ptr, bytes)),
            None => self.free_large(ptr, Some(bytes), freed),
        }
    }

    #[cold]
    fn allocate_large(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        match self.try_large(bytes, stream) {
            Err(e) if e.is_oom() => {
                // Not waiting for streams during a capture (see
                // `stream_order::streams::may_wait`).
                let _ = self.slab.release(may_wait(), 0);
                match self.try_large(bytes, stream) {
                    Err(e) if e.is_oom() => Err(Error::oom_with(self.oom_info(bytes))),
                    other => other,
                }
            }
            other => other,
        }
    }

    fn try_large(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        if !self.slab.reserve_budget(bytes) {
            return Err(Error::oom(bytes));
        }
        match self
            .slab
            .upstream()
            .allocate(bytes, DEFAULT_ALIGNMENT, stream)
        {
            Ok(p) => {
                self.slab.note_reserved();
                lock(&self.large).insert(p.0, bytes);
                Ok(p)
            }
            Err(e) => {
                self.slab.unreserve_budget(bytes);
                Err(e)
            }
        }
    }

    #[cold]
    fn free_large(&self, ptr: DevicePtr, bytes: Option<usize>, freed: Freed<'_>) -> Result<()> {
        let mut large = lock(&self.large);
        let Some(&allocated) = large.get(&ptr.0) else {
            drop(large);
            return Err(self.misrouted(ptr, bytes.unwrap_or(0)));
        };
        if let Some(b) = bytes {
            if b != allocated {
                return Err(Error::InvalidFree {
                    ptr: ptr.0,
                    reason: FreeError::SizeMismatch {
                        allocated,
                        freed: b,
                    },
                });
            }
        }
        large.remove(&ptr.0);
        drop(large);
        let up = self.slab.upstream();
        let res = match freed {
            // Still held from the upstream: the budget stays reserved.
            Freed::Parked => return self.parked.park(ptr, allocated),
            Freed::On(s) if self.config.stream_ordered => {
                up.deallocate(ptr, allocated, DEFAULT_ALIGNMENT, s)
            }
            _ => up.deallocate_sync(ptr, allocated, DEFAULT_ALIGNMENT),
        };
        self.slab.unreserve_budget(allocated);
        res
    }

    /// The error of a refused free of a cached size: an unknown pointer is
    /// looked up elsewhere ([`CachingPool::misrouted`]).
    #[cold]
    #[inline(never)]
    fn explain(&self, e: Error, ptr: DevicePtr, bytes: usize) -> Error {
        match e {
            Error::InvalidFree {
                reason: FreeError::Unknown,
                ..
            } => self.misrouted(ptr, bytes),
            other => other,
        }
    }

    /// Why a free of `ptr` with `bytes` found no block where the size sent
    /// it: a large block or a cached block of another class (allocated with
    /// another size), a free or parked block (a double free), or not ours.
    #[cold]
    fn misrouted(&self, ptr: DevicePtr, bytes: usize) -> Error {
        let mismatch = |allocated| FreeError::SizeMismatch {
            allocated,
            freed: bytes,
        };
        if self.parked.contains(ptr) {
            return Error::InvalidFree {
                ptr: ptr.0,
                reason: FreeError::DoubleFree,
            };
        }
        let reason = match lock(&self.large).get(&ptr.0) {
            Some(&allocated) => mismatch(allocated),
            None => match self.slab.lookup(ptr) {
                Some(state) => state.map_or(FreeError::DoubleFree, mismatch),
                None => FreeError::Unknown,
            },
        };
        Error::InvalidFree { ptr: ptr.0, reason }
    }

    /// Seals every stream's open batch of frees (one event per stream), checks
    /// the batch events, and moves the blocks of completed batches to the
    /// lists every stream allocates from. Never blocks.
    pub fn process_deferred(&self) -> Result<()> {
        self.slab.process_deferred()
    }

    /// Bytes callers asked for and have not freed.
    pub fn live_bytes(&self) -> usize {
        self.slab.totals().0 + lock(&self.large).values().sum::<usize>()
    }

    /// Bytes of free cached blocks.
    pub fn free_bytes(&self) -> usize {
        self.slab.totals().2
    }

    /// The blocks handed out, in address order: cached classes with their
    /// block size, large blocks with their size; both with the bytes asked
    /// for. O(blocks).
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        let mut out = self.slab.live_blocks();
        out.extend(lock(&self.large).iter().map(|(&p, &size)| LiveBlock {
            address: DevicePtr(p),
            size,
            requested: Some(size),
        }));
        out.sort_unstable();
        out
    }

    /// The size of the live block starting at `ptr` (its class's block size,
    /// or a large block's size), if there is one.
    pub fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        self.slab
            .live_block_size(ptr)
            .or_else(|| lock(&self.large).get(&ptr.0).copied())
    }

    /// The largest class with a free block: the largest request the pool can
    /// serve without growing (after waiting for the stream that freed it,
    /// when that is another stream).
    pub fn largest_free_block(&self) -> usize {
        self.slab.largest_free()
    }

    /// Numbers of the whole pool and of each class.
    pub fn stats(&self) -> CachingPoolStats {
        let classes: Vec<ClassStats> = (0..self.slab.class_count())
            .map(|c| self.slab.class_stats(c))
            .collect();
        let large = lock(&self.large);
        CachingPoolStats {
            reserved: self.slab.reserved(),
            peak_reserved: self.slab.peak_reserved(),
            live: classes.iter().map(|c| c.live).sum::<usize>() + large.values().sum::<usize>(),
            free: classes.iter().map(|c| c.free_blocks * c.block_size).sum(),
            parked: classes.iter().map(|c| c.parked_blocks * c.block_size).sum(),
            large_allocations: large.len(),
            classes,
        }
    }

    fn oom_info(&self, requested: usize) -> OomInfo {
        let mut info = self.slab.oom_info(requested);
        info.live = Some(self.live_bytes());
        info
    }
}

super::slab::pool_over_slab!(
    /// The pool's reserve is its chunks and its live large blocks.
    /// [`Pool::trim`](super::Pool::trim) gives back chunks whose blocks are
    /// all free and known complete (batch events polled, never waited for),
    /// smallest classes first; [`Pool::release`](super::Pool::release) waits
    /// for the streams that freed blocks first. Blocks above the largest
    /// class go back when they are freed.
    CachingPool<U>
);

impl<U: MemoryResource> MemoryResource for CachingPool<U> {
    #[inline]
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        validate_request(bytes, alignment, DEFAULT_ALIGNMENT)?;
        self.allocate_async(bytes, stream)
    }

    #[inline]
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        crate::error::check_alignment(alignment)?;
        self.free(ptr, Some(bytes), Some(stream))
    }

    fn device(&self) -> &Device {
        self.slab.device()
    }

    fn properties(&self) -> Properties {
        self.slab.upstream().properties()
    }

    fn allocate_sync(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        if let Some(class) = self.class_for(bytes) {
            if let Some(p) = self.slab.take_settled(class, bytes) {
                return Ok(p);
            }
        }
        let stream = self.device().default_stream();
        let ptr = self.allocate_async(bytes, &stream)?;
        if let Err(e) = super::stream_order::streams::synchronize(&stream) {
            let _ = self.free(ptr, Some(bytes), Some(&stream));
            return Err(e);
        }
        Ok(ptr)
    }

    fn deallocate_sync(&self, ptr: DevicePtr, bytes: usize, alignment: usize) -> Result<()> {
        crate::error::check_alignment(alignment)?;
        self.free(ptr, Some(bytes), None)
    }
}

impl<U: MemoryResource> Drop for CachingPool<U> {
    fn drop(&mut self) {
        if crate::exit::process_is_exiting() {
            return; // the driver may be gone: leak (see `crate::exit`)
        }
        // Large blocks still live belong to the pool's upstream: give them back
        // (the chunks go back when the slab drops).
        let large = std::mem::take(&mut *lock(&self.large));
        for (p, bytes) in large {
            crate::exit::give_back(
                || format!("CachingPool block {p:#x}"),
                || {
                    self.slab
                        .upstream()
                        .deallocate_sync(DevicePtr(p), bytes, DEFAULT_ALIGNMENT)
                },
            );
        }
        let slab = &self.slab;
        self.parked.give_back(slab.device(), |p, bytes| {
            slab.upstream()
                .deallocate_sync(p, bytes, DEFAULT_ALIGNMENT)?;
            slab.unreserve_budget(bytes);
            Ok(())
        });
    }
}
