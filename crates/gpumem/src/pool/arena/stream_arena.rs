//! A stream arena: the superblocks one stream (or, for the legacy default
//! stream, one thread) allocates small blocks from, plus the whole superblocks
//! it keeps cached for reuse on its stream.
//!
//! Everything here runs under the arena's own lock. Small requests take the
//! lowest-addressed superblock whose largest free block fits (a [`MaxTree`]
//! over the arena's superblock slots) and, inside it, the lowest-addressed free
//! block that fits: two O(log n) descents, no driver call. Large requests take
//! the best-fitting run of cached superblocks (`BTreeMap`/`BTreeSet`, O(log n)).
//! Freed memory is reusable on this stream at once; it leaves the arena for
//! other streams only through the global arena's fences.

use std::collections::{BTreeMap, BTreeSet};

use super::directory::OwnerWord;
use super::superblock::Superblock;
use super::tree::MaxTree;
use super::Core;
use crate::pool::stream_order::events::Fence;
use crate::pool::stream_order::streams::{synchronize, synchronize_device};
use crate::pool::stream_order::sync::lock;
use crate::stream::{Stream, StreamId};
use crate::FreeError;

/// Fully free superblocks an arena keeps for its small blocks before caching
/// further ones as whole runs (avoids ping-pong at a superblock boundary).
const KEEP_EMPTY: u32 = 1;
/// Small blocks of up to this many granules freed on the arena's own stream are
/// parked, unmerged, in a per-size quick list for O(1) reuse.
const QUICK_MAX: u32 = 16;
/// Blocks parked per size.
const QUICK_DEPTH: usize = 8;

/// Small blocks freed on another stream, waiting for that stream's event.
struct Deferred {
    stream: StreamId,
    fence: Fence,
    /// `(slot, first granule, granules)`.
    blocks: Vec<(u32, u32, u32)>,
}

/// A stream arena (see the module documentation).
pub(crate) struct StreamArena {
    /// Id used in owner words (never 0).
    pub(crate) uid: u32,
    /// The stream this arena serves.
    pub(crate) stream_id: StreamId,
    /// Registry key.
    pub(crate) key: (u64, u64),
    state: std::sync::Mutex<ArenaState>,
}

impl StreamArena {
    pub(crate) fn new(uid: u32, stream: &Stream, key: (u64, u64)) -> Self {
        Self {
            uid,
            stream_id: stream.id(),
            key,
            state: std::sync::Mutex::new(ArenaState::new(uid, stream.clone())),
        }
    }

    /// Locks the arena (poisoning is ignored: every update leaves the state
    /// consistent before anything can panic).
    #[inline]
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, ArenaState> {
        lock(&self.state)
    }
}

/// The state behind a stream arena's lock.
pub(crate) struct ArenaState {
    uid: u32,
    /// A clone keeps the stream alive while this arena holds its memory.
    stream: Option<Stream>,
    /// Set when the arena has been dropped from the registry; callers then
    /// look the stream's arena up again.
    pub(crate) retired: bool,
    sbs: Vec<Option<Superblock>>,
    free_slots: Vec<u32>,
    /// Largest free block (granules) of the superblock in each slot.
    slots: MaxTree<u16>,
    empty: u32,
    recycled: Option<Superblock>,
    spare_by_start: BTreeMap<u32, u32>,
    spare_by_len: BTreeSet<(u32, u32)>,
    spare_total: u64,
    deferred: Vec<Deferred>,
    /// Quick lists by granule count: `(slot, first granule)`.
    quick: Vec<Vec<(u32, u32)>>,
    quick_count: usize,
    large_live: u64,
    /// Bytes of the blocks handed out from this arena and not yet freed
    /// (granules and superblocks, see `ArenaStats::live`).
    pub(crate) live: usize,
}

impl ArenaState {
    fn new(uid: u32, stream: Stream) -> Self {
        Self {
            uid,
            stream: Some(stream),
            retired: false,
            sbs: Vec::new(),
            free_slots: Vec::new(),
            slots: MaxTree::new(4),
            empty: 0,
            recycled: None,
            spare_by_start: BTreeMap::new(),
            spare_by_len: BTreeSet::new(),
            spare_total: 0,
            deferred: Vec::new(),
            quick: (0..=QUICK_MAX)
                .map(|_| Vec::with_capacity(QUICK_DEPTH))
                .collect(),
            quick_count: 0,
            large_live: 0,
            live: 0,
        }
    }

    #[inline]
    fn addr(core: &Core, idx: u32, granule: u32) -> u64 {
        core.base + ((idx as u64) << core.sb_shift) + granule as u64 * super::GRANULE as u64
    }

    // ----- small blocks -----

    /// Serves `g` granules from the arena's superblocks without leaving the arena.
    #[inline]
    pub(crate) fn alloc_small_local(&mut self, core: &Core, g: u32) -> Option<u64> {
        if g <= QUICK_MAX {
            if let Some((slot, off)) = self.quick[g as usize].pop() {
                self.quick_count -= 1;
                if let Some(Some(sb)) = self.sbs.get_mut(slot as usize) {
                    sb.unpark_quick(off, g);
                    return Some(Self::addr(core, sb.idx, off));
                }
            }
        }
        let slot = self.slots.first_at_least(g)?;
        let sb = self.sbs[slot].as_mut()?;
        let was_empty = sb.is_empty();
        let off = sb.alloc(g)?;
        let idx = sb.idx;
        self.slots.set(slot, sb.largest_free());
        if was_empty {
            self.empty -= 1;
        }
        Some(Self::addr(core, idx, off))
    }

    /// Serves `g` granules, taking a superblock from the cache or the global
    /// arena when needed.
    pub(crate) fn alloc_small(&mut self, core: &Core, g: u32, stream: &Stream) -> Option<u64> {
        if let Some(p) = self.alloc_small_local(core, g) {
            return Some(p);
        }
        if self.drain_quick(core) {
            if let Some(p) = self.alloc_small_local(core, g) {
                return Some(p);
            }
        }
        if self.apply_deferred(core, false) {
            if let Some(p) = self.alloc_small_local(core, g) {
                return Some(p);
            }
        }
        let idx = match self.take_spare(1) {
            Some(i) => i,
            None => core.global.acquire(1, stream)?,
        };
        self.add_superblock(core, idx);
        self.alloc_small_local(core, g)
    }

    fn add_superblock(&mut self, core: &Core, idx: u32) {
        let sb = match self.recycled.take() {
            Some(mut sb) => {
                sb.reset(idx);
                sb
            }
            None => Superblock::new(idx, core.granules),
        };
        let slot = match self.free_slots.pop() {
            Some(s) => s as usize,
            None => {
                self.sbs.push(None);
                self.sbs.len() - 1
            }
        };
        if slot >= self.slots.len() {
            let mut grown = MaxTree::new(self.slots.len() * 2);
            for i in 0..self.slots.len() {
                grown.set(i, self.slots.get(i));
            }
            self.slots = grown;
        }
        self.slots.set(slot, sb.largest_free());
        self.sbs[slot] = Some(sb);
        self.empty += 1;
        core.global
            .dir
            .set_owner(idx, OwnerWord::small(self.uid, slot as u32));
    }

    /// Frees a small block of a superblock this arena holds in `slot`.
    #[inline]
    pub(crate) fn free_small(
        &mut self,
        core: &Core,
        slot: u32,
        off: u32,
        g: u32,
    ) -> Result<(), FreeError> {
        let Some(Some(sb)) = self.sbs.get_mut(slot as usize) else {
            return Err(FreeError::Unknown);
        };
        if g <= QUICK_MAX && self.quick[g as usize].len() < QUICK_DEPTH {
            sb.park_quick(off, g)?;
            self.quick[g as usize].push((slot, off));
            self.quick_count += 1;
            return Ok(());
        }
        sb.free(off, g)?;
        let largest = sb.largest_free();
        let now_empty = sb.is_empty();
        self.slots.set(slot as usize, largest);
        if now_empty {
            self.empty += 1;
            if self.empty > KEEP_EMPTY {
                self.retire_superblock(core, slot);
            }
        }
        Ok(())
    }

    /// Checks that a live block of `g` granules starts at granule `off` of
    /// the superblock in `slot`, as [`ArenaState::free_small`] would.
    pub(crate) fn check_small(&self, slot: u32, off: u32, g: u32) -> Result<(), FreeError> {
        match self.sbs.get(slot as usize) {
            Some(Some(sb)) => sb.check_live(off, g),
            _ => Err(FreeError::Unknown),
        }
    }

    /// Merges every parked quick-list block into its superblock's free blocks.
    /// Returns whether there were any.
    fn drain_quick(&mut self, core: &Core) -> bool {
        if self.quick_count == 0 {
            return false;
        }
        self.quick_count = 0;
        for g in 1..=QUICK_MAX {
            let parked = std::mem::take(&mut self.quick[g as usize]);
            for &(slot, off) in &parked {
                self.merge_free(core, slot, |sb| sb.free_quick(off, g));
            }
            let mut parked = parked;
            parked.clear();
            self.quick[g as usize] = parked;
        }
        true
    }

    /// Applies `f` (which frees something) to the superblock in `slot`, then
    /// updates the slot tree and retires the superblock if it became empty.
    fn merge_free(&mut self, core: &Core, slot: u32, f: impl FnOnce(&mut Superblock)) {
        if let Some(Some(sb)) = self.sbs.get_mut(slot as usize) {
            f(sb);
            let largest = sb.largest_free();
            let now_empty = sb.is_empty();
            self.slots.set(slot as usize, largest);
            if now_empty {
                self.empty += 1;
                if self.empty > KEEP_EMPTY {
                    self.retire_superblock(core, slot);
                }
            }
        }
    }

    /// Marks a small block freed on another stream: it becomes reusable here
    /// once an event recorded on that stream after the free is complete.
    pub(crate) fn defer_small(
        &mut self,
        core: &Core,
        slot: u32,
        off: u32,
        g: u32,
        stream: &Stream,
    ) -> Result<(), FreeError> {
        let Some(Some(sb)) = self.sbs.get_mut(slot as usize) else {
            return Err(FreeError::Unknown);
        };
        sb.check_live(off, g)?;
        let id = stream.id();
        if let Some(d) = self.deferred.iter_mut().find(|d| d.stream == id) {
            if d.fence.extend(stream).is_ok() {
                sb.defer(off, g)?;
                d.blocks.push((slot, off, g));
                return Ok(());
            }
        } else if let Ok(fence) = Fence::new(stream, &core.global.events) {
            sb.defer(off, g)?;
            self.deferred.push(Deferred {
                stream: id,
                fence,
                blocks: vec![(slot, off, g)],
            });
            return Ok(());
        }
        // No event can be recorded on the freeing stream: wait for it (or the
        // device) now, then the block is free for everyone.
        if synchronize(stream).is_ok() || synchronize_device(&core.device).is_ok() {
            return self.free_small(core, slot, off, g);
        }
        // The device cannot tell us the block is idle: never reuse it.
        sb.defer(off, g)
    }

    /// Applies deferred frees whose events are complete (all of them with
    /// `synced`). Returns whether any was applied.
    pub(crate) fn apply_deferred(&mut self, core: &Core, synced: bool) -> bool {
        let mut applied = false;
        let mut i = 0;
        while i < self.deferred.len() {
            if !(synced || self.deferred[i].fence.has_passed()) {
                i += 1;
                continue;
            }
            let d = self.deferred.swap_remove(i);
            for (slot, off, g) in d.blocks {
                self.merge_free(core, slot, |sb| sb.apply_deferred(off, g));
            }
            d.fence.recycle(&core.global.events);
            applied = true;
        }
        applied
    }

    /// Moves a fully free superblock out of small-block service into the cache.
    fn retire_superblock(&mut self, core: &Core, slot: u32) {
        if let Some(sb) = self.sbs[slot as usize].take() {
            self.slots.set(slot as usize, 0);
            self.free_slots.push(slot);
            self.empty -= 1;
            core.global.dir.set_owner(sb.idx, OwnerWord::NONE);
            let idx = sb.idx;
            if self.recycled.is_none() {
                self.recycled = Some(sb);
            }
            self.add_spare(core, idx, 1);
        }
    }

    // ----- large blocks and the cache of whole superblocks -----

    /// Serves a large block of `len` superblocks.
    pub(crate) fn alloc_large(&mut self, core: &Core, len: u32, stream: &Stream) -> Option<u64> {
        let idx = match self.take_spare(len) {
            Some(i) => i,
            None => core.global.acquire(len, stream)?,
        };
        core.global
            .dir
            .set_owner(idx, OwnerWord::large(self.uid, len));
        self.large_live += 1;
        Some(Self::addr(core, idx, 0))
    }

    /// Frees a large block this arena handed out (the caller checked the owner
    /// word): it joins this arena's cache.
    pub(crate) fn free_large(&mut self, core: &Core, idx: u32, len: u32) {
        core.global.dir.set_owner(idx, OwnerWord::NONE);
        self.large_live -= 1;
        self.add_spare(core, idx, len);
    }

    /// Forgets a large block that was freed on another stream (its run goes to
    /// that stream's arena).
    pub(crate) fn disown_large(&mut self, core: &Core, idx: u32) {
        core.global.dir.set_owner(idx, OwnerWord::NONE);
        self.large_live -= 1;
    }

    /// Adds a run freed on this arena's stream to the cache, flushing the cache
    /// to the global arena when it grows past the configured limit.
    pub(crate) fn add_spare(&mut self, core: &Core, start: u32, len: u32) {
        let (mut s, mut l) = (start, len);
        if let Some((&ps, &pl)) = self.spare_by_start.range(..s).next_back() {
            if ps + pl == s {
                self.spare_by_start.remove(&ps);
                self.spare_by_len.remove(&(pl, ps));
                s = ps;
                l += pl;
            }
        }
        if let Some(nl) = self.spare_by_start.remove(&(s + l)) {
            self.spare_by_len.remove(&(nl, s + l));
            l += nl;
        }
        self.spare_by_start.insert(s, l);
        self.spare_by_len.insert((l, s));
        self.spare_total += len as u64;
        if self.spare_total > core.cache_limit {
            self.release_spare(core, false);
        }
    }

    fn take_spare(&mut self, len: u32) -> Option<u32> {
        let &(l, s) = self.spare_by_len.range((len, 0)..).next()?;
        self.spare_by_len.remove(&(l, s));
        self.spare_by_start.remove(&s);
        if l > len {
            self.spare_by_start.insert(s + len, l - len);
            self.spare_by_len.insert((l - len, s + len));
        }
        self.spare_total -= len as u64;
        Some(s)
    }

    /// Sends the whole cache to the global arena: fenced by this stream's event,
    /// or clean at once when `synced` (the device has been synchronized).
    fn release_spare(&mut self, core: &Core, synced: bool) {
        if self.spare_by_start.is_empty() {
            return;
        }
        let runs: Vec<(u32, u32)> = std::mem::take(&mut self.spare_by_start)
            .into_iter()
            .collect();
        self.spare_by_len.clear();
        self.spare_total = 0;
        match (&self.stream, synced) {
            (Some(stream), false) => core.global.release(stream, runs),
            _ => {
                for (s, l) in runs {
                    core.global.dir.give_back(s, l);
                }
            }
        }
    }

    /// Gives back everything not live: applies finished deferred frees (all
    /// when `synced`), moves every fully free superblock and the cache to the
    /// global arena. Returns true when the arena then holds nothing at all.
    pub(crate) fn flush(&mut self, core: &Core, synced: bool) -> bool {
        self.drain_quick(core);
        self.apply_deferred(core, synced);
        for slot in 0..self.sbs.len() {
            if matches!(&self.sbs[slot], Some(sb) if sb.is_empty()) {
                self.retire_superblock(core, slot as u32);
            }
        }
        self.release_spare(core, synced);
        self.recycled = None;
        self.is_unused()
    }

    /// True when the arena holds no memory and no pending frees.
    pub(crate) fn is_unused(&self) -> bool {
        self.free_slots.len() == self.sbs.len()
            && self.spare_by_start.is_empty()
            && self.deferred.is_empty()
            && self.large_live == 0
    }

    /// Drops the arena's contents and its stream clone (resource teardown or an
    /// unused arena leaving the registry).
    pub(crate) fn retire(&mut self) {
        self.retired = true;
        self.stream = None;
        self.sbs.clear();
        self.free_slots.clear();
        self.recycled = None;
        self.deferred.clear();
        self.quick.iter_mut().for_each(Vec::clear);
        self.quick_count = 0;
        self.spare_by_start.clear();
        self.spare_by_len.clear();
    }

    // ----- statistics -----

    /// Largest block this arena could hand out without the global arena, in bytes.
    pub(crate) fn largest_free(&self, core: &Core) -> usize {
        let small = self.slots.max() as usize * super::GRANULE;
        let spare = self
            .spare_by_len
            .iter()
            .next_back()
            .map_or(0, |&(l, _)| (l as usize) << core.sb_shift);
        small.max(spare)
    }

    /// One line describing the arena's fragmentation.
    pub(crate) fn describe(&self, id: StreamId) -> String {
        let held = self.sbs.iter().flatten().count();
        let mut holes = 0usize;
        let mut free_bytes = 0usize;
        for sb in self.sbs.iter().flatten() {
            for (_, l) in sb.free_blocks() {
                holes += 1;
                free_bytes += l as usize * super::GRANULE;
            }
        }
        format!(
            "stream {}: {} superblocks for small blocks ({} free bytes in {} holes, largest {}), \
             {} cached superblocks in {} runs, {} large blocks live, {} deferred groups, live {} bytes",
            id.0,
            held,
            free_bytes,
            holes,
            self.slots.max() as usize * super::GRANULE,
            self.spare_total,
            self.spare_by_start.len(),
            self.large_live,
            self.deferred.len(),
            self.live,
        )
    }
}
