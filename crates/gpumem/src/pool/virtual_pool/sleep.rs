//! Sleep and wake of a [`VirtualPool`] region (see `regions.rs` for tags):
//! the physical memory under a region's blocks goes back to the driver while
//! their addresses stay theirs, and comes back at the same addresses.
//!
//! Sleep, ordered on a stream: the contents are copied to a pinned host
//! backup (or not, [`Backup::Discard`]) after the work enqueued there; every
//! extent mapped under the region's blocks whose pages carry no awake block
//! (through any of its mappings) is unmapped everywhere and released, with
//! a backup as soon as the copies of its pages have run (the copies go in
//! slices with an event after each, so the copy engine runs while extents
//! go), else once the stream is waited for. Pages an awake block shares, through
//! the page or through an extent, stay mapped (and held) while the region
//! sleeps. Wake maps memory under the unmapped pages of the region's blocks
//! as a new block's are mapped (`map_runs`: the cache, idle extents, new
//! ones), grants access, and copies the backup back.
//!
//! Each is all or nothing: on an error, the mappings made so far are undone
//! (wake) or made again where a block lies (sleep; where extents were
//! already released, fresh memory is mapped and the backup copied back),
//! and the region is as it was. Should making a mapping again fail too, the sleep goes through
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
use super::backup::{layout, slices, CopiedSlices, HostBackup};
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
    /// Some extents were already released: the blocks need fresh memory
    /// and their contents from the backup to be awake again.
    Released(Error),
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
    /// region already asleep, are errors; in the NCCL-ready mode
    /// ([`VirtualPoolConfig::nccl_ready`](super::VirtualPoolConfig::nccl_ready))
    /// the call is [`Error::Unsupported`].
    pub fn sleep(&self, tag: u32, backup: Backup, stream: &Stream) -> Result<usize> {
        check_tag(tag, "sleep")?;
        if self.config.nccl_ready {
            // Waking maps pages again as the usual mode does (aliases, several extents).
            return Err(Error::unsupported(
                "sleep of a virtual pool in the NCCL-ready mode",
            ));
        }
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
        // The work on the blocks done (and their contents kept): with a
        // backup, slice by slice as the copies run, each slice's pages going
        // while the next is copied.
        let mut kept = match backup {
            Backup::HostPinned if bytes > 0 => Some(self.back_up(
                &mut st.regions.host,
                &placed,
                bytes as usize,
                self.config.copy_slice_bytes as u64,
                stream,
            )?),
            _ => {
                stream.synchronize()?;
                None
            }
        };
        let outcome = self.release_pages(st, &blocks, kept.as_mut().map(|k| &mut k.1));
        // Every copy done, those of blocks on pages that stay mapped too.
        let outcome = match (outcome, kept.as_mut()) {
            (Ok(n), Some((_, copied))) => copied
                .wait_below(u64::MAX)
                .map(|()| n)
                .map_err(Unwound::Released),
            (other, _) => other,
        };
        let (released, stuck) = match outcome {
            Ok(n) => (n, None),
            Err(Unwound::Back(e)) => {
                if let Some((b, _)) = kept {
                    let _ = stream.synchronize();
                    Self::free_backup(&st.regions.host, b);
                }
                return Err(e);
            }
            Err(Unwound::Released(e)) => {
                let (b, _) = kept
                    .take()
                    .expect("only a sleep with a backup releases early");
                if self.rewake(st, &placed, b, stream).is_ok() {
                    Self::free_backup(&st.regions.host, b);
                    return Err(e);
                }
                kept = Some((b, CopiedSlices::done()));
                (0, Some(e))
            }
            Err(Unwound::Stuck(e)) => (0, Some(e)),
        };
        st.regions.fall_asleep(tag, kept.map(|k| k.0), &placed);
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
        for slice in slices(&placed, self.config.copy_slice_bytes as u64) {
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
    fn release_pages(
        &self,
        st: &mut State,
        blocks: &[(u64, u64)],
        copied: Option<&mut CopiedSlices>,
    ) -> Result<usize, Unwound> {
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
        if let Some(copied) = copied {
            return self.release_as_copied(st, &cands, copied);
        }
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

    /// Unmaps and releases `cands` in address order, each once the copies
    /// of the blocks on its pages have run (`copied`), so the copy engine
    /// works while they go. A failure after a release is
    /// [`Unwound::Released`].
    fn release_as_copied(
        &self,
        st: &mut State,
        cands: &[ExtentId],
        copied: &mut CopiedSlices,
    ) -> Result<usize, Unwound> {
        let gran = self.gran as u64;
        let mut order: Vec<(u64, ExtentId)> = cands
            .iter()
            .map(|&x| {
                let n = st.phys.pages(x);
                let end = st.phys.extent(x).map_or(0, |ext| {
                    ext.mappings
                        .iter()
                        .map(|&at| {
                            let p = PageTable::unpack(at);
                            let last = PageRef {
                                res: p.res,
                                idx: p.idx + n - 1,
                            };
                            st.pages.addr(last) + gran
                        })
                        .max()
                        .unwrap_or(0)
                });
                (end, x)
            })
            .collect();
        order.sort_unstable();
        let mut released = 0;
        let mut any_released = false;
        let after = |any: bool, u: Unwound| match u {
            Unwound::Back(e) if any => Unwound::Released(e),
            u => u,
        };
        for (end, x) in order {
            if let Err(e) = copied.wait_below(end) {
                return Err(after(any_released, Unwound::Back(e)));
            }
            let n = st.phys.pages(x);
            let mappings = st
                .phys
                .extent(x)
                .map_or_else(Vec::new, |ext| ext.mappings.clone());
            let mut gone: Vec<(ExtentId, PackedPage)> = Vec::new();
            for at in mappings {
                if let Err(e) = self.unmap_mapping(st, x, at, n) {
                    return Err(after(any_released, self.map_again(st, &gone, e)));
                }
                gone.push((x, at));
            }
            // An extent the driver refuses to release stays cached.
            let taken = st.phys.take_cached(&[x]);
            released += self.release_taken(st, taken).0;
            any_released = true;
        }
        Ok(released)
    }

    /// Undoes a sleep that released memory before it failed: fresh memory
    /// under the blocks' unmapped pages, their contents copied back from
    /// `backup`.
    fn rewake(
        &self,
        st: &mut State,
        placed: &[(u64, u64, u64)],
        backup: HostBackup,
        stream: &Stream,
    ) -> Result<()> {
        // Every copy into the backup done.
        stream.synchronize()?;
        let runs = Self::unmapped_under(st, placed);
        let bytes: u64 = placed.iter().map(|p| p.1).sum();
        let taker = st.streams.taker_bit(stream);
        let made = self.map_runs(st, &runs, bytes as usize, taker)?;
        let copied = self
            .restore(&mut st.regions.host, backup, placed, stream)
            .and_then(|()| stream.synchronize());
        if let Err(e) = copied {
            let _ = stream.synchronize();
            self.unmap_made(st, &made);
            return Err(e);
        }
        Ok(())
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
