//! `FixedSizeResource`: blocks of one size, carved from upstream chunks of N
//! blocks, kept on free lists per stream.
//!
//! Algorithm: one size class of the pools' slab engine (see the `pool` module
//! documentation for the stream-ordering policy). Allocation and free are
//! O(1): a lock, a pop or push on a double-ended queue, and an insert or
//! remove in a hash map of live blocks (which makes bad frees errors, not
//! corruption: a pointer that is not a live block, or a size other than the
//! one allocated, frees nothing). Growth takes a chunk of
//! `blocks_per_chunk` blocks from the upstream (a single block when the
//! chunk does not fit). [`Pool::release`](super::Pool::release)
//! gives back the chunks whose blocks are all free; drop gives back every
//! chunk.
//!
//! A request larger than the block size is [`Error::OutOfMemory`] with the
//! block size as `limit`: this resource can never serve it.
//! [`BinningResource`](super::BinningResource) routes sizes to such bins.

use super::slab::{ClassSpec, ClassStats, Freed, Slab, SlabConfig};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{validate_request, LiveBlock, MemoryResource, Properties, DEFAULT_ALIGNMENT};
use crate::stream::Stream;
use crate::{Error, OomInfo, Result};

/// Bytes a chunk holds by default: 2 MiB (the VMM granularity), at least one block.
pub const DEFAULT_CHUNK_BYTES: usize = 2 << 20;

/// Frees per stream after which a batch event is recorded by default.
pub const DEFAULT_BATCH_SIZE: usize = 256;

/// Configuration of a [`FixedSizeResource`]. `Default`: blocks of 1 MiB (as
/// RMM's), chunks of about [`DEFAULT_CHUNK_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FixedSizeConfig {
    /// The one block size served: a non-zero multiple of 256 bytes.
    pub block_size: usize,
    /// Blocks per chunk taken from the upstream; `None`: as many as fit in
    /// [`DEFAULT_CHUNK_BYTES`], at least one.
    pub blocks_per_chunk: Option<usize>,
}

impl Default for FixedSizeConfig {
    fn default() -> Self {
        Self {
            block_size: 1 << 20,
            blocks_per_chunk: None,
        }
    }
}

impl FixedSizeConfig {
    /// The default configuration with blocks of `block_size` bytes.
    pub fn with_block_size(block_size: usize) -> Self {
        Self {
            block_size,
            ..Self::default()
        }
    }
}

/// A memory resource that hands out blocks of one size.
///
/// ```
/// use gpumem::pool::{FixedSizeConfig, FixedSizeResource};
/// use gpumem::resource::{DeviceResource, MemoryResource};
/// # fn main() -> gpumem::Result<()> {
/// # let device = gpumem::Device::sim(Default::default());
/// let config = FixedSizeConfig::with_block_size(4096);
/// let pool = FixedSizeResource::new(DeviceResource::new(device.clone()), config)?;
/// let stream = device.create_stream()?;
/// let p = pool.allocate(3000, 256, &stream)?;
/// pool.deallocate(p, 3000, 256, &stream)?;
/// assert!(pool.allocate(8192, 256, &stream).unwrap_err().is_oom());
/// # Ok(()) }
/// ```
pub struct FixedSizeResource<U: MemoryResource> {
    slab: Slab<U>,
}

impl<U: MemoryResource> std::fmt::Debug for FixedSizeResource<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedSizeResource")
            .field("block_size", &self.block_size())
            .field("stats", &self.stats())
            .finish()
    }
}

impl<U: MemoryResource> FixedSizeResource<U> {
    /// Blocks of `config.block_size` bytes over `upstream`.
    /// [`Error::InvalidArgument`] unless the block size is a non-zero multiple
    /// of 256 and the chunk size is non-zero and fits in memory.
    pub fn new(upstream: U, config: FixedSizeConfig) -> Result<Self> {
        let block_size = config.block_size;
        let blocks_per_chunk = config
            .blocks_per_chunk
            .unwrap_or_else(|| (DEFAULT_CHUNK_BYTES / block_size.max(1)).max(1));
        if block_size == 0 || !block_size.is_multiple_of(DEFAULT_ALIGNMENT) {
            return Err(Error::InvalidArgument(format!(
                "block size {block_size} is not a non-zero multiple of {DEFAULT_ALIGNMENT}"
            )));
        }
        if blocks_per_chunk == 0
            || block_size
                .checked_mul(blocks_per_chunk)
                .is_none_or(|b| b > isize::MAX as usize)
        {
            return Err(Error::InvalidArgument(format!(
                "{blocks_per_chunk} blocks of {block_size} bytes is not a valid chunk"
            )));
        }
        let slab = Slab::new(
            upstream,
            &[ClassSpec {
                block: block_size,
                chunk_blocks: blocks_per_chunk,
            }],
            SlabConfig {
                stream_ordered: true,
                cross_stream_wait: true,
                batch_size: DEFAULT_BATCH_SIZE as u64,
                max_reserved: usize::MAX,
                borrow_from: usize::MAX,
                borrow: 0,
            },
        );
        Ok(Self { slab })
    }

    /// Blocks of 1 MiB over `upstream` (the default configuration).
    pub fn with_defaults(upstream: U) -> Result<Self> {
        Self::new(upstream, FixedSizeConfig::default())
    }

    /// The one block size this resource serves.
    pub fn block_size(&self) -> usize {
        self.slab.block_size(0)
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &U {
        self.slab.upstream()
    }

    /// Seals and checks the batch events of every stream that freed blocks, so
    /// completed frees become reusable by every stream. Never blocks.
    pub fn process_deferred(&self) -> Result<()> {
        self.slab.process_deferred()
    }

    /// Bytes callers asked for, over the blocks they hold.
    pub fn live_bytes(&self) -> usize {
        self.slab.totals().0
    }

    /// Bytes of free blocks held.
    pub fn free_bytes(&self) -> usize {
        self.slab.totals().2
    }

    /// Counts of the block class.
    pub fn stats(&self) -> ClassStats {
        self.slab.class_stats(0)
    }

    /// Largest free block: the block size when one is free, else 0.
    pub fn largest_free_block(&self) -> usize {
        self.slab.largest_free()
    }

    /// The blocks handed out (block size, bytes asked for), unsorted.
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        self.slab.live_blocks()
    }

    /// The block size when `ptr` starts a live block of this resource.
    pub fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        self.slab.live_block_size(ptr)
    }

    pub(crate) fn oom_info(&self, requested: usize) -> OomInfo {
        self.slab.oom_info(requested)
    }

    /// What `ptr` is to this resource: `None` when it starts none of its
    /// blocks, `Some(None)` for a free block, `Some(Some(bytes))` for a live
    /// block allocated with `bytes`. A slow path, for diagnosing frees.
    pub(crate) fn lookup(&self, ptr: DevicePtr) -> Option<Option<usize>> {
        self.slab.lookup(ptr)
    }
}

super::slab::pool_over_slab!(
    /// The resource's reserve is its chunks.
    /// [`Pool::trim`](super::Pool::trim) gives back chunks whose blocks are
    /// all free and known complete (batch events polled, never waited for);
    /// [`Pool::release`](super::Pool::release) waits for the streams that
    /// freed blocks first.
    FixedSizeResource<U>
);

impl<U: MemoryResource> MemoryResource for FixedSizeResource<U> {
    #[inline]
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        if bytes > self.block_size() {
            let mut info = self.oom_info(bytes);
            info.limit = Some(self.block_size());
            return Err(Error::oom_with(info));
        }
        self.slab.allocate(0, bytes, stream)
    }

    #[inline]
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
        self.slab.deallocate(0, ptr, Some(bytes), Freed::on(stream))
    }

    fn device(&self) -> &Device {
        self.slab.device()
    }

    fn properties(&self) -> Properties {
        self.slab.upstream().properties()
    }

    fn allocate_sync(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
        if validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? && bytes <= self.block_size() {
            if let Some(p) = self.slab.take_settled(0, bytes) {
                return Ok(p);
            }
        }
        let stream = self.device().default_stream();
        let ptr = self.allocate(bytes, alignment, &stream)?;
        if let Err(e) = super::stream_order::streams::synchronize(&stream) {
            let _ = self.deallocate(ptr, bytes, alignment, &stream);
            return Err(e);
        }
        Ok(ptr)
    }

    fn deallocate_sync(&self, ptr: DevicePtr, bytes: usize, alignment: usize) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        crate::error::check_alignment(alignment)?;
        self.slab.deallocate(0, ptr, Some(bytes), Freed::Done)
    }
}
