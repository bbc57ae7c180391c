//! Giving back the free middle of an expandable heap's ranges
//! ([`PoolConfig::expandable`]) on a trim or a release.
//!
//! Why: a heap that grows one range at its end could give back only the
//! range's free end. One block still live near the end (a library's
//! workspace, a cache kept across jobs) then held every free byte below it:
//! under PyTorch, `torch.cuda.empty_cache()` after a training job left the
//! next job gigabytes above PyTorch's own allocator (`docs/decisions.md`,
//! "Trims give back the middle of a range"). PyTorch's expandable segments
//! unmap free pages anywhere in their range.
//!
//! How: after the whole free regions and the free ends went, every run of
//! the upstream's pieces (each growth maps at least one) that lies wholly in
//! one block free for every stream is cut out of its range, the heap's
//! region and the upstream's allocation alike (as a recycle cuts a piece,
//! `recycle.rs`), and given back. The part below the cut keeps its blocks
//! and no longer grows; the part above it stays the frontier when the cut
//! was in the frontier's range. The addresses of what went are not used
//! again. Blocks free only in a stream's lane stay: that stream's work may
//! still use them ([`Pool::release`] waits for the streams first, so there
//! every free block counts). Nothing is cut while a graph capture is under
//! way, as nothing is recycled then.
//!
//! [`PoolConfig::expandable`]: super::PoolConfig::expandable
//! [`Pool::release`]: crate::pool::Pool::release

use super::free_pieces::free_pieces;
use super::{PoolResource, CLASSES};
use crate::driver::DevicePtr;
use crate::resource::{GrowInPlace, MemoryResource};
use crate::suballoc::{LaneHeap, LaneId, RegionId};
use crate::Result;

/// Whole pieces of a region that lie in one block free for every stream.
#[derive(Debug, Clone, Copy)]
struct FreeRun {
    /// The region holding them: `(id, base, bytes)`.
    region: (RegionId, u64, usize),
    addr: u64,
    bytes: usize,
}

impl<U: MemoryResource> PoolResource<U> {
    /// Gives back runs of free pieces of shard `i`'s ranges (see the module
    /// documentation) until `excess` bytes went or none is left. A run the
    /// upstream refuses goes back into the heap, free, so nothing is lost;
    /// that error is returned. Returns the bytes given back.
    pub(super) fn release_free_pieces(&self, i: usize, excess: usize) -> Result<usize> {
        let Some(up) = self.expander() else {
            return Ok(0);
        };
        let mut released = 0;
        while released < excess && !crate::captures::underway() {
            let mut st = self.shards.lock(i);
            let found = (0..CLASSES).find_map(|class| {
                let frontier = st.frontier[class];
                // A range being grown or shrunk is left alone.
                let busy = frontier.filter(|f| f.busy).map(|f| f.region);
                let end = frontier.map(|f| f.base + f.bytes as u64);
                free_run(&st.heaps[class], up, busy, end).map(|run| (class, run))
            });
            let Some((class, run)) = found else { break };
            let (region, base, bytes) = run.region;
            let (start, end) = (run.addr, run.addr + run.bytes as u64);
            let Some((middle, tail)) =
                self.cut_out(&mut st, i, class, up, run.region, (start, end))
            else {
                break;
            };
            if let Some(f) = st.frontier[class] {
                st.frontier[class] = Some(f.after_cut(region, tail, end, base + bytes as u64));
            }
            // Out of the heap and the pool's regions before the upstream
            // call: once given back, its addresses are the upstream's.
            if let Err(e) = st.heaps[class].remove_region(middle) {
                log::error!("pool: a run of free pieces is not free: {e}");
                break;
            }
            self.shards.global().regions.remove(start);
            drop(st);
            if let Err(e) = self
                .upstream
                .deallocate_sync(DevicePtr(start), run.bytes, 256)
            {
                let mut st = self.shards.lock(i);
                if st.heaps[class].add_region(start, run.bytes as u64).is_ok() {
                    self.shards.global().regions.insert(start, run.bytes, i);
                }
                return Err(e);
            }
            released += run.bytes;
        }
        Ok(released)
    }
}

/// The first run, in region order, of whole pieces of `heap`'s ranges that
/// lie in one block free for every stream, other than in the block that
/// ends at `frontier_end` (the free end a shrink gives back) and in region
/// `busy`.
fn free_run(
    heap: &LaneHeap,
    up: &dyn GrowInPlace,
    busy: Option<RegionId>,
    frontier_end: Option<u64>,
) -> Option<FreeRun> {
    let mut pieces = free_pieces(heap, up, busy, frontier_end).filter(|p| p.lane == LaneId::GLOBAL);
    let first = pieces.next()?;
    let mut run = FreeRun {
        region: first.region,
        addr: first.addr,
        bytes: first.bytes,
    };
    // The run goes on while its pieces follow in the same block.
    for p in pieces {
        if p.block != first.block || p.addr != run.addr + run.bytes as u64 {
            break;
        }
        run.bytes += p.bytes;
    }
    Some(run)
}
