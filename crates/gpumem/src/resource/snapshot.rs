//! What a resource holds at one moment, for memory snapshots (PyTorch's
//! `torch.cuda.memory._snapshot()`): the segments it holds from the driver
//! and the blocks it has handed out.
//!
//! Resources that can list them offer getters returning these types
//! (`segments`, `live_blocks`); listing takes the resource's locks and is
//! O(blocks): a slow path, never on the allocation path.

use std::sync::Arc;

use crate::driver::{DevicePtr, RawStream};

/// What a pool or resource can show of the memory it holds: the same four
/// answers from every pool, for memory snapshots (the C ABI's, which PyTorch's
/// `torch.cuda.memory._snapshot()` reads) and viewers (`gpumem view`). Every
/// method takes the resource's locks and is O(blocks) or O(pages): a slow
/// path, never on the allocation path.
pub trait Introspect {
    /// What the resource holds from the driver, in address order: its
    /// `cuMemAlloc` allocations, or runs of pages mapped into its virtual
    /// ranges. Every live block lies inside one. Empty where it cannot say
    /// (a pool whose upstream lists no
    /// [`driver_segments`](super::MemoryResource::driver_segments)).
    fn segments(&self) -> Vec<Segment>;
    /// The blocks handed out and not yet freed, in address order, each with
    /// the stream it was allocated on where the resource records it (else 0).
    fn live_blocks(&self) -> Vec<(LiveBlock, RawStream)>;
    /// The bytes the live block starting at `ptr` takes, if there is one.
    fn live_block_size(&self, ptr: DevicePtr) -> Option<usize>;
    /// The largest request the resource can serve now without taking more
    /// from the driver (PyTorch's `cacheInfo`).
    fn largest_free_block(&self) -> usize;
}

macro_rules! forward_introspect {
    ($($ty:ty),*) => {$(
        impl<R: Introspect + ?Sized> Introspect for $ty {
            fn segments(&self) -> Vec<Segment> {
                (**self).segments()
            }
            fn live_blocks(&self) -> Vec<(LiveBlock, RawStream)> {
                (**self).live_blocks()
            }
            fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
                (**self).live_block_size(ptr)
            }
            fn largest_free_block(&self) -> usize {
                (**self).largest_free_block()
            }
        }
    )*};
}

forward_introspect!(Arc<R>, Box<R>, &R);

/// Blocks of a resource that records no stream, as [`Introspect`] gives them.
pub(crate) fn on_no_stream(blocks: Vec<LiveBlock>) -> Vec<(LiveBlock, RawStream)> {
    blocks.into_iter().map(|b| (b, 0)).collect()
}

/// Each block of `blocks` as a segment of its own (each a driver
/// allocation).
pub(crate) fn each_a_segment(blocks: Vec<LiveBlock>) -> Vec<Segment> {
    blocks
        .into_iter()
        .map(|b| Segment {
            address: b.address,
            size: b.size,
        })
        .collect()
}

/// A range of memory a resource holds from the driver (a `cuMemAlloc`
/// allocation, or a run of mapped virtual pages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Segment {
    /// First byte.
    pub address: DevicePtr,
    /// Length in bytes.
    pub size: usize,
}

/// A block handed out and not yet freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LiveBlock {
    /// First byte (the pointer the caller got).
    pub address: DevicePtr,
    /// Bytes the block takes, as the resource rounds the request.
    pub size: usize,
    /// Bytes the caller asked for, where the resource records it.
    pub requested: Option<usize>,
}

impl Segment {
    /// True when `block` lies entirely inside this segment.
    pub fn contains(&self, block: &LiveBlock) -> bool {
        let (start, end) = (self.address.0, self.address.0 + self.size as u64);
        block.address.0 >= start && block.address.0 + block.size as u64 <= end
    }
}

/// Sorts `segments` by address and merges those that touch (the end of one is
/// the start of the next) into one.
pub fn merge_adjacent(mut segments: Vec<Segment>) -> Vec<Segment> {
    segments.sort_unstable();
    let mut out: Vec<Segment> = Vec::with_capacity(segments.len());
    for s in segments {
        match out.last_mut() {
            Some(last) if last.address.0 + last.size as u64 == s.address.0 => last.size += s.size,
            _ => out.push(s),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(a: u64, size: usize) -> Segment {
        Segment {
            address: DevicePtr(a),
            size,
        }
    }

    #[test]
    fn adjacent_segments_merge_in_address_order() {
        let merged = merge_adjacent(vec![
            seg(0x3000, 0x1000),
            seg(0x1000, 0x1000),
            seg(0x2000, 0x800),
        ]);
        assert_eq!(merged, vec![seg(0x1000, 0x1800), seg(0x3000, 0x1000)]);
        assert!(merge_adjacent(Vec::new()).is_empty());
    }

    #[test]
    fn containment() {
        let s = seg(0x1000, 0x1000);
        let b = |a, size| LiveBlock {
            address: DevicePtr(a),
            size,
            requested: None,
        };
        assert!(s.contains(&b(0x1000, 0x1000)));
        assert!(s.contains(&b(0x1800, 0x100)));
        assert!(!s.contains(&b(0x1f00, 0x200)));
        assert!(!s.contains(&b(0x800, 0x100)));
    }
}
