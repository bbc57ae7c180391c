//! The used blocks of [`LaneHeap`]s as the [`LiveBlock`]s a pool reports
//! ([`PoolResource`](super::PoolResource), [`VirtualPool`](super::VirtualPool)).
//! A block parked for a graph stays used in its heap but is not live: the
//! caller freed it.

use super::stream_order::parked::ParkedBlocks;
use crate::driver::DevicePtr;
use crate::resource::LiveBlock;
use crate::suballoc::LaneHeap;

/// The used blocks of `heaps` not in `parked` as live blocks, in address
/// order, with their sizes as the heaps rounded them (the requested sizes
/// are not recorded). O(blocks).
pub(crate) fn live_blocks<'a>(
    heaps: impl IntoIterator<Item = &'a LaneHeap>,
    parked: &ParkedBlocks,
) -> Vec<LiveBlock> {
    let mut out: Vec<LiveBlock> = heaps
        .into_iter()
        .flat_map(|h| h.used_ranges())
        .filter(|&(addr, _)| !parked.contains(DevicePtr(addr)))
        .map(|(addr, size)| LiveBlock {
            address: DevicePtr(addr),
            size: size as usize,
            requested: None,
        })
        .collect();
    out.sort_unstable();
    out
}

/// The size of the used block starting at `ptr` in any of `heaps`, unless
/// it is in `parked`.
pub(crate) fn live_block_size<'a>(
    heaps: impl IntoIterator<Item = &'a LaneHeap>,
    parked: &ParkedBlocks,
    ptr: DevicePtr,
) -> Option<usize> {
    if parked.contains(ptr) {
        return None;
    }
    heaps
        .into_iter()
        .find_map(|h| h.used_size(ptr.0))
        .map(|s| s as usize)
}
