//! Sleep and wake of a [`VirtualPool`] region (see `regions.rs` for tags):
//! the physical memory under a region's blocks goes back to the driver while
//! their addresses stay theirs, and comes back at the same addresses.
//!
//! Sleep, ordered on a stream: the contents are copied to a pinned host
//! backup (or not, [`Backup::Discard`]) after the work enqueued there, and
//! the stream is waited for; then every extent mapped under the region's
//! blocks whose pages carry no awake block (through any of its mappings) is
//! unmapped everywhere and released. Pages an awake block shares, through
//! the page or through an extent, stay mapped (and held) while the region
//! sleeps. Wake maps memory under the unmapped pages of the region's blocks
//! as a new block's are mapped (`map_runs`: the cache, idle extents, new
//! ones), grants access, and copies the backup back.
//!
//! Each is all or nothing: on an error, the mappings made so far are undone
//! (wake) or made again where a block lies (sleep), and the region is as it
//! was. Should making a mapping again fail too, the sleep goes through
//! (its backup taken, the pages that could not come back unmapped) and the
//! first error is returned: the region is then asleep, and wakes whole.
//!
//! Costs: sleep and wake hold the pool's lock; besides the copies they cost
//! O(pages and blocks of the region) and one driver call per extent and
//! mapping (`cuMemUnmap`, `cuMemRelease`; `cuMemCreate`, `cuMemMap`) plus
//! one `cuMemSetAccess` per run of pages and device.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;

use super::backing::Mapped;
use super::backup::layout;
use super::page_table::{PackedPage, PageRef, PageTable};
use super::phys_cache::ExtentId;
use super::regions::{check_tag, Backup};
use super::{State, VirtualPool};
use crate::stream::Stream;
use crate::{Error, Result};

/// How a sleep that failed left the region.
enum Unwound {
    /// As it was: awake.
    Back(Error),
    /// Asleep: a mapping could not be made again.
    Stuck(Error),
}

/// Per page under sleeping blocks: the blocks that begin or end on it, and
/// whether one lies across it (the page strictly inside a block).
type QuietPages = HashMap<PackedPage, (u32, bool)>;

impl VirtualPool {
    /// Puts region `tag` to sleep: its blocks stay live at their addresses
    /// (no other block gets them), but their physical memory goes back to
    /// the driver; returns the physical bytes given back.
    ///
    /// Ordered on `stream`, like a free: the work enqueued there before the
    /// call runs before the pages go (work on other streams that uses the
    /// blocks must be ordered before it, as for
    /// [`deallocate`](crate::resource::MemoryResource::deallocate)). With
    /// [`Backup::HostPinned`], the blocks' contents are first copied to
    /// pinned host memory on `stream` (their blocks' rounded sizes);
    /// [`VirtualPool::wake`] copies them back. The call waits for `stream`.
    ///
    /// Pages also under blocks of other regions (or of none) stay mapped,
    /// as do the pages of extents mapped under such blocks too. While the
    /// region sleeps, freeing its blocks is allowed (their backup is
    /// forgotten), allocating in it and using its blocks through gpumem are
    /// [`Error::Asleep`]. An error leaves the region awake and as it was
    /// (see the module documentation for the one exception). Tag 0, and a
    /// region already asleep, are errors.
    pub fn sleep(&self, tag: u32, backup: Backup, stream: &Stream) -> Result<usize> {
        check_tag(tag, "sleep")?;
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.regions.asleep(tag).is_some() {
            return Err(Error::InvalidArgument(format!(
                "virtual pool: region {tag} is already asleep"
            )));
        }
        let mut blocks: Vec<(u64, u64)> = st
            .areas
            .iter()
            .flat_map(|a| a.heap.tagged_ranges(tag))
            .collect();
        blocks.sort_unstable();
        let placed = layout(&blocks);
        let bytes: u64 = blocks.iter().map(|b| b.1).sum();
        // The work on the blocks done (and their contents kept).
        let kept = match backup {
            Backup::HostPinned if bytes > 0 => {
                Some(self.back_up(&mut st.regions.host, &placed, bytes as usize, stream)?)
            }
            _ => {
                stream.synchronize()?;
                None
            }
        };
        let (released, stuck) = match self.release_pages(st, &blocks) {
            Ok(n) => (n, None),
            Err(Unwound::Back(e)) => {
                if let Some(b) = kept {
                    Self::free_backup(&st.regions.host, b);
                }
                return Err(e);
            }
            Err(Unwound::Stuck(e)) => (0, Some(e)),
        };
        st.regions.fall_asleep(tag, kept, &placed);
        self.any_asleep.store(true, Ordering::Relaxed);
        match stuck {
            Some(e) => Err(e),
            None => Ok(released),
        }
    }

    /// Wakes region `tag`: maps physical memory again under its blocks' pages
    /// (at the same addresses), gives the device and its peers access, and
    /// copies the backup back on `stream` (waiting for it); returns the
    /// bytes of the blocks woken. Pointers into the blocks work again as
    /// before, in kernels and in captured CUDA graphs. After
    /// [`Backup::Discard`], the contents are undefined. An error (out of
    /// memory included) leaves the region asleep as it was. A region not
    /// asleep is an error.
    pub fn wake(&self, tag: u32, stream: &Stream) -> Result<usize> {
        check_tag(tag, "wake")?;
        let mut guard = self.lock();
        let st = &mut *guard;
        let Some(asleep) = st.regions.asleep(tag) else {
            return Err(Error::InvalidArgument(format!(
                "virtual pool: region {tag} is not asleep"
            )));
        };
        let backup = asleep.backup;
        let placed = st.regions.placed(tag);
        let bytes: u64 = placed.iter().map(|p| p.1).sum();
        let taker = st.streams.taker_bit(stream);
        // In slices, each one's copies enqueued as soon as it is mapped: the
        // copy engine runs while the next slice is mapped.
        let mut made: Mapped = Vec::new();
        let mut result = Ok(());
        for slice in wake_slices(&placed, self.config.wake_slice_bytes as u64) {
            let runs = Self::unmapped_under(st, slice);
            let slice_bytes: u64 = slice.iter().map(|p| p.1).sum();
            result = self
                .map_runs(st, &runs, slice_bytes as usize, taker)
                .map(|m| made.extend(m));
            if result.is_ok() {
                if let Some(b) = backup {
                    result = self.restore(&mut st.regions.host, b, slice, stream);
                }
            }
            if result.is_err() {
                break;
            }
        }
        if backup.is_some() && result.is_ok() {
            result = stream.synchronize();
        }
        if let Err(e) = result {
            // No copy may still write the pages about to go.
            let _ = stream.synchronize();
            self.unmap_made(st, &made);
            return Err(e);
        }
        if let Some(b) = st.regions.wake(tag) {
            Self::free_backup(&st.regions.host, b);
        }
        self.any_asleep
            .store(!st.regions.asleep.is_empty(), Ordering::Relaxed);
        Ok(bytes as usize)
    }

    /// The unmapped pages under `placed` blocks (address order), as runs per
    /// reservation: what waking them maps.
    fn unmapped_under(st: &State, placed: &[(u64, u64, u64)]) -> Vec<(usize, Vec<(usize, usize)>)> {
        let mut by_res: BTreeMap<usize, Vec<(usize, usize)>> = BTreeMap::new();
        for &(addr, size, _) in placed {
            let span = st
                .pages
                .span(addr, size)
                .expect("a live block lies in a reservation");
            let runs = by_res.entry(span.res).or_default();
            for (start, n) in st.pages.unmapped_runs(span) {
                // A block shares at most its first page with the one before.
                let end = start + n;
                let start = runs.last().map_or(start, |&(s, m)| start.max(s + m));
                if start >= end {
                    continue;
                }
                match runs.last_mut() {
                    Some((s, m)) if *s + *m == start => *m += end - start,
                    _ => runs.push((start, end - start)),
                }
            }
        }
        by_res.into_iter().collect()
    }

    /// Counts, per page, the sleeping blocks on it once `blocks` sleep too
    /// (see [`QuietPages`]).
    fn quiet_pages(st: &State, blocks: &[(u64, u64)]) -> QuietPages {
        let mut quiet = QuietPages::new();
        let asleep = st.regions.blocks.iter().map(|(&a, b)| (a, b.size));
        for (addr, size) in asleep.chain(blocks.iter().copied()) {
            let Some(span) = st.pages.span(addr, size) else {
                continue;
            };
            quiet
                .entry(PageTable::pack(span.res, span.first))
                .or_default()
                .0 += 1;
            if span.last > span.first {
                quiet
                    .entry(PageTable::pack(span.res, span.last))
                    .or_default()
                    .0 += 1;
            }
            for idx in span.first + 1..span.last {
                quiet.entry(PageTable::pack(span.res, idx)).or_default().1 = true;
            }
        }
        quiet
    }

    /// Unmaps everywhere and releases the extents mapped under `blocks`
    /// (about to sleep) whose pages, through every mapping, carry no awake
    /// block; returns the bytes released. On an error, mappings under
    /// blocks are made again.
    fn release_pages(&self, st: &mut State, blocks: &[(u64, u64)]) -> Result<usize, Unwound> {
        let quiet = Self::quiet_pages(st, blocks);
        let awake_on = |pages: &PageTable, p: PageRef| {
            pages.busy(p)
                && match quiet.get(&PageTable::pack(p.res, p.idx)) {
                    Some(&(n, inside)) => !inside && n < pages.users(p),
                    None => true,
                }
        };
        let mut cands: Vec<ExtentId> = Vec::new();
        for &(addr, size) in blocks {
            let Some(span) = st.pages.span(addr, size) else {
                continue;
            };
            for idx in span.first..=span.last {
                if let Some(pp) = st.pages.phys_at(PageRef { res: span.res, idx }) {
                    cands.push(pp.extent);
                }
            }
        }
        cands.sort_unstable();
        cands.dedup();
        cands.retain(|&x| {
            let n = st.phys.pages(x);
            st.phys.extent(x).is_some_and(|ext| {
                ext.mappings.iter().all(|&at| {
                    let p = PageTable::unpack(at);
                    (p.idx..p.idx + n).all(|idx| !awake_on(&st.pages, PageRef { res: p.res, idx }))
                })
            })
        });
        // Idle pages of these extents may still be used by work of the
        // streams that freed blocks there: wait for those first.
        st.streams.begin_pass();
        let State {
            pages,
            phys,
            streams,
            ..
        } = &mut *st;
        let busy_frees = cands.iter().any(|&x| {
            !pages
                .extent_frees(x, phys)
                .quiet(|m, t| streams.complete(m, t))
        });
        if busy_frees {
            st.streams
                .synchronize_all(&self.device)
                .map_err(Unwound::Back)?;
        }
        let _relaxed = crate::graph::relaxed(&self.device);
        let mut gone: Vec<(ExtentId, PackedPage)> = Vec::new();
        for &x in &cands {
            let n = st.phys.pages(x);
            let mappings = st
                .phys
                .extent(x)
                .map_or_else(Vec::new, |ext| ext.mappings.clone());
            for at in mappings {
                if let Err(e) = self.unmap_mapping(st, x, at, n) {
                    return Err(self.map_again(st, &gone, e));
                }
                gone.push((x, at));
            }
        }
        // An extent the driver refuses to release stays cached: a later
        // trim tries again.
        let taken = st.phys.take_cached(&cands);
        Ok(self.release_taken(st, taken).0)
    }

    /// After `e`, maps again the mappings `gone` that lie under a block (an
    /// idle one may stay unmapped), last first, with access: the region is
    /// back as it was ([`Unwound::Back`]), or, if a mapping fails again,
    /// left asleep ([`Unwound::Stuck`]).
    fn map_again(&self, st: &mut State, gone: &[(ExtentId, PackedPage)], e: Error) -> Unwound {
        for &(x, at) in gone.iter().rev() {
            let p = PageTable::unpack(at);
            let n = st.phys.pages(x);
            let under_block =
                (p.idx..p.idx + n).any(|idx| st.pages.busy(PageRef { res: p.res, idx }));
            if !under_block {
                continue;
            }
            st.phys.uncache(x);
            let mut done = Vec::new();
            let mapped = self.map_extent(st, p.res, p.idx, x, &mut done);
            let access = mapped.and_then(|_| self.grant_access(st, p.res, p.idx, n));
            if access.is_err() {
                if !done.is_empty() {
                    // Mapped without access: no use to a block.
                    let _ = self.unmap_mapping(st, x, at, n);
                }
                return Unwound::Stuck(e);
            }
        }
        Unwound::Back(e)
    }
}

/// `placed` (address order) cut into slices of about `limit` bytes (whole
/// blocks; a larger block is a slice of its own).
fn wake_slices(placed: &[(u64, u64, u64)], limit: u64) -> Vec<&[(u64, u64, u64)]> {
    let mut slices = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, p) in placed.iter().enumerate() {
        if bytes > 0 && bytes + p.1 > limit {
            slices.push(&placed[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += p.1;
    }
    if start < placed.len() {
        slices.push(&placed[start..]);
    }
    slices
}

#[cfg(test)]
mod tests {
    use super::wake_slices;

    #[test]
    fn wake_slices_cut_at_whole_blocks_and_cover_everything() {
        let placed: Vec<(u64, u64, u64)> = [3, 3, 5, 1, 1, 1, 9]
            .iter()
            .scan(0, |a, &n| {
                *a += n;
                Some((*a - n, n, 0))
            })
            .collect();
        let sizes = |v: Vec<&[(u64, u64, u64)]>| -> Vec<Vec<u64>> {
            v.iter().map(|s| s.iter().map(|p| p.1).collect()).collect()
        };
        assert_eq!(
            sizes(wake_slices(&placed, 6)),
            vec![vec![3, 3], vec![5, 1], vec![1, 1], vec![9]]
        );
        assert_eq!(
            sizes(wake_slices(&placed, 100)),
            vec![vec![3, 3, 5, 1, 1, 1, 9]]
        );
        assert_eq!(sizes(wake_slices(&placed, 1)).len(), placed.len());
        assert!(wake_slices(&[], 6).is_empty());
    }
}
