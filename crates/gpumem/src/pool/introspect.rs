//! [`Introspect`] for the pools: each answers from its own tables, and its
//! segments are what its upstream holds from the driver
//! ([`MemoryResource::driver_segments`]), or for [`VirtualPool`] the runs of
//! pages it has mapped.

use super::{BinningResource, CachingPool, PoolResource, VirtualPool};
use crate::async_pool::{AsyncResource, MemPool};
use crate::driver::{DevicePtr, RawStream};
use crate::resource::{
    each_a_segment, on_no_stream, Introspect, LiveBlock, MemoryResource, Segment, DEFAULT_ALIGNMENT,
};

/// The pools that carve their upstream's allocations: their own answers of
/// the same names, over the upstream's segments.
macro_rules! over_upstream {
    ($($pool:ident),*) => {$(
        impl<U: MemoryResource> Introspect for $pool<U> {
            fn segments(&self) -> Vec<Segment> {
                self.upstream().driver_segments().unwrap_or_default()
            }
            fn live_blocks(&self) -> Vec<(LiveBlock, RawStream)> {
                on_no_stream($pool::live_blocks(self))
            }
            fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
                $pool::live_block_size(self, ptr)
            }
            fn largest_free_block(&self) -> usize {
                $pool::largest_free_block(self)
            }
        }
    )*};
}

over_upstream!(PoolResource, CachingPool);

/// Bins over a pool: the bins' blocks and the upstream's segments; the
/// largest free block is the bins' or the upstream's, whichever is larger.
impl<U: MemoryResource + Introspect + 'static> Introspect for BinningResource<U> {
    fn segments(&self) -> Vec<Segment> {
        self.upstream().segments()
    }
    fn live_blocks(&self) -> Vec<(LiveBlock, RawStream)> {
        on_no_stream(BinningResource::live_blocks(self))
    }
    fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        BinningResource::live_block_size(self, ptr)
    }
    fn largest_free_block(&self) -> usize {
        BinningResource::largest_free_block(self).max(self.upstream().largest_free_block())
    }
}

/// Its segments are the runs of pages mapped into its virtual ranges; what
/// it can serve without the driver is the physical memory no live block
/// holds.
impl Introspect for VirtualPool {
    fn segments(&self) -> Vec<Segment> {
        self.mapped_ranges()
    }
    fn live_blocks(&self) -> Vec<(LiveBlock, RawStream)> {
        on_no_stream(VirtualPool::live_blocks(self))
    }
    fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        VirtualPool::live_block_size(self, ptr)
    }
    fn largest_free_block(&self) -> usize {
        self.free_physical_bytes()
    }
}

/// CUDA's pool lists no segments of its own: each live allocation stands
/// for one, and its free memory is what it reserves beyond what is used.
impl Introspect for AsyncResource {
    fn segments(&self) -> Vec<Segment> {
        each_a_segment(MemPool::live_blocks(self))
    }
    fn live_blocks(&self) -> Vec<(LiveBlock, RawStream)> {
        on_no_stream(MemPool::live_blocks(self))
    }
    fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
        self.allocation_size(ptr)
            .map(|bytes| bytes.next_multiple_of(DEFAULT_ALIGNMENT))
    }
    fn largest_free_block(&self) -> usize {
        match (self.reserved_current(), self.used_current()) {
            (Ok(r), Ok(u)) => r.saturating_sub(u),
            _ => 0,
        }
    }
}
