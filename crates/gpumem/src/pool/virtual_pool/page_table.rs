//! The page table of a [`VirtualPool`](super::VirtualPool): one entry per
//! granularity-sized page of every reserved virtual range.
//!
//! Each page names the physical page mapped there (if any). Three bitmaps
//! per range say which pages are *mapped*, which *own* their physical page
//! (see [`PhysCache`]) and which are *busy* (some live block lies on them).
//! Pages are kept 64 to a group, each group's three bitmap words beside its
//! entries, so an operation on a page touches one place in memory rather
//! than four arrays.
//! A mapped page that is not busy is *idle*: it is kept mapped (re-using it
//! costs no driver call) and may be unmapped once every stream that freed a
//! block on its extent has been seen complete at or after that free (see
//! [`FreeStreams`]). Frees are recorded per group of 64 pages ([`Frees`]: a
//! mask of stream slots and the tick of the last free); an extent's record
//! is the union over the groups under each of its mappings (coarser than
//! the extent, so conservative), plus what it kept from mappings gone.
//!
//! A block's first and last page may be shared with other blocks, so they
//! count their blocks (`users`); the pages strictly between are the block's
//! alone and only carry the busy bit. A block is handed out only over pages
//! that own their physical page: taking a page whose physical page another
//! alias owns with live blocks is a *conflict*, and the pool places the
//! block elsewhere.
//!
//! Costs: allocate and free touch the block's two boundary entries and a
//! few group words (bitmaps; on free, the frees record). Pages that must
//! take their memory over from another alias are handled off the fast path,
//! an extent mapping at a time: when the whole run passes from one other
//! idle mapping (the usual case) its bitmaps move a word at a time, else
//! page by page; the extent's frees are looked at only when a stream other
//! than the taker's ever freed a block. No allocation, no driver call.

use std::ops::{Index, IndexMut};

use super::bits::{all_set, any_set, bit, next_clear, set_bits, words};
use super::free_streams::{FreeStreams, Frees};
use super::phys_cache::{PhysCache, NO_OWNER};

/// A physical page: page `index` of extent (physical allocation) `chunk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PhysPage {
    pub(super) chunk: u32,
    pub(super) index: u32,
}

const UNMAPPED: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Page {
    /// Live blocks that begin or end on the page (pages strictly inside a
    /// block are not counted: they have the busy bit only).
    users: u32,
    /// Chunk of the physical page mapped here, or `UNMAPPED`.
    chunk: u32,
    /// Page within the chunk.
    index: u32,
}

const EMPTY: Page = Page {
    users: 0,
    chunk: UNMAPPED,
    index: 0,
};

/// Which of a segment's bitmaps: mapped, owns its physical page, busy.
const MAPPED: usize = 0;
const OWNS: usize = 1;
const BUSY: usize = 2;

/// 64 consecutive pages: their three bitmap words beside their entries, so
/// that an operation on a page touches one place in memory.
#[derive(Clone)]
struct Group {
    /// Words of the [`MAPPED`], [`OWNS`] and [`BUSY`] bitmaps.
    bits: [u64; 3],
    /// Frees of blocks on these pages (a free records itself once per group
    /// under its block, not once per extent).
    frees: Frees,
    pages: [Page; 64],
}

const EMPTY_GROUP: Group = Group {
    bits: [0; 3],
    frees: Frees { mask: 0, tick: 0 },
    pages: [EMPTY; 64],
};

/// One bitmap of a segment, a word per group (`G` is `&[Group]` to read,
/// `&mut [Group]` to write).
struct Bits<G> {
    groups: G,
    k: usize,
}

impl<G: AsRef<[Group]>> Index<usize> for Bits<G> {
    type Output = u64;
    #[inline]
    fn index(&self, w: usize) -> &u64 {
        &self.groups.as_ref()[w].bits[self.k]
    }
}

impl<G: AsRef<[Group]> + AsMut<[Group]>> IndexMut<usize> for Bits<G> {
    #[inline]
    fn index_mut(&mut self, w: usize) -> &mut u64 {
        &mut self.groups.as_mut()[w].bits[self.k]
    }
}

/// One reserved virtual range.
pub(super) struct Segment {
    pub(super) base: u64,
    pub(super) bytes: u64,
    /// Pages in the range.
    len: usize,
    /// The pages, 64 to a group. Bitmaps: [`MAPPED`], [`OWNS`] (owns its
    /// physical page; always so while busy), [`BUSY`] (some live block lies
    /// on it).
    groups: Vec<Group>,
}

impl Segment {
    /// Bitmap `k`.
    #[inline]
    fn bits(&self, k: usize) -> Bits<&[Group]> {
        Bits {
            groups: &self.groups,
            k,
        }
    }

    /// Bitmap `k`, writable.
    #[inline]
    fn bits_mut(&mut self, k: usize) -> Bits<&mut [Group]> {
        Bits {
            groups: &mut self.groups,
            k,
        }
    }

    /// The entry of page `idx`.
    #[inline]
    fn page(&self, idx: usize) -> &Page {
        &self.groups[idx / 64].pages[idx % 64]
    }

    /// The entry of page `idx`, writable.
    #[inline]
    fn page_mut(&mut self, idx: usize) -> &mut Page {
        &mut self.groups[idx / 64].pages[idx % 64]
    }

    /// The entries of every page, in order.
    fn pages(&self) -> impl Iterator<Item = &Page> + '_ {
        self.groups
            .iter()
            .flat_map(|g| g.pages.iter())
            .take(self.len)
    }

    /// Bits of word `w` (64 pages): mapped with no live block.
    fn idle_word(&self, w: usize) -> u64 {
        let b = &self.groups[w].bits;
        b[MAPPED] & !b[BUSY]
    }

    /// Marks a block on pages `first..=last` live.
    #[inline]
    fn mark(&mut self, first: usize, last: usize) {
        self.page_mut(first).users += 1;
        self.bits_mut(BUSY)[first / 64] |= 1 << (first % 64);
        if last > first {
            self.page_mut(last).users += 1;
            self.bits_mut(BUSY)[last / 64] |= 1 << (last % 64);
            if last > first + 1 {
                let mut busy = self.bits_mut(BUSY);
                words(first + 1, last - 1, |w, m| {
                    debug_assert_eq!(busy[w] & m, 0, "a block's inner page is shared");
                    busy[w] |= m;
                });
            }
        }
    }

    /// Marks the block on pages `first..=last` gone.
    #[inline]
    fn unmark(&mut self, first: usize, last: usize) {
        for idx in [first, last] {
            let p = self.page_mut(idx);
            p.users -= 1;
            if p.users == 0 {
                self.bits_mut(BUSY)[idx / 64] &= !(1 << (idx % 64));
            }
            if last == first {
                break;
            }
        }
        if last > first + 1 {
            let mut busy = self.bits_mut(BUSY);
            words(first + 1, last - 1, |w, m| busy[w] &= !m);
        }
    }
}

/// Page `idx` of segment `seg`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PageRef {
    pub(super) seg: usize,
    pub(super) idx: usize,
}

/// What [`PageTable::acquire`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Acquired {
    /// Every page is mapped.
    pub(super) all_mapped: bool,
    /// Some mapped page's physical page is in use through another alias (or
    /// was freed there by a stream not known done): the block cannot stay.
    pub(super) conflict: bool,
}

/// The pages of every reserved range.
pub(super) struct PageTable {
    shift: u32,
    pub(super) segs: Vec<Segment>,
    mapped_pages: usize,
}

impl PageTable {
    /// An empty table for pages of `gran` bytes (a power of two).
    pub(super) fn new(gran: u64) -> Self {
        Self {
            shift: gran.trailing_zeros(),
            segs: Vec::new(),
            mapped_pages: 0,
        }
    }

    /// Adds a reserved range (base and bytes multiples of the page size).
    pub(super) fn add_segment(&mut self, base: u64, bytes: u64) {
        let n = (bytes >> self.shift) as usize;
        self.segs.push(Segment {
            base,
            bytes,
            len: n,
            groups: vec![EMPTY_GROUP; n.div_ceil(64)],
        });
    }

    /// Bytes of every reserved range.
    pub(super) fn reserved_bytes(&self) -> usize {
        self.segs.iter().map(|s| s.bytes as usize).sum()
    }

    /// Pages mapped.
    pub(super) fn mapped_pages(&self) -> usize {
        self.mapped_pages
    }

    /// Mapped pages with no live block (a scan of the bitmaps).
    pub(super) fn idle_pages(&self) -> usize {
        self.segs
            .iter()
            .map(|s| {
                (0..s.groups.len())
                    .map(|w| s.idle_word(w).count_ones() as usize)
                    .sum::<usize>()
            })
            .sum()
    }

    /// The segment and first and last page of `[addr, addr + size)` (size > 0),
    /// or `None` when it lies in no segment.
    #[inline]
    pub(super) fn range(&self, addr: u64, size: u64) -> Option<(usize, usize, usize)> {
        let seg = self
            .segs
            .iter()
            .position(|s| addr >= s.base && addr - s.base < s.bytes)?;
        let s = &self.segs[seg];
        let off = addr - s.base;
        let last = off + size.max(1) - 1;
        if last >= s.bytes {
            return None;
        }
        Some((
            seg,
            (off >> self.shift) as usize,
            (last >> self.shift) as usize,
        ))
    }

    /// Address of a page.
    pub(super) fn addr(&self, p: PageRef) -> u64 {
        self.segs[p.seg].base + ((p.idx as u64) << self.shift)
    }

    /// A page reference packed in a `u64` (segment << 40 | page).
    #[inline]
    pub(super) fn pack(seg: usize, idx: usize) -> u64 {
        ((seg as u64) << 40) | idx as u64
    }

    /// The page a packed reference names.
    #[inline]
    pub(super) fn unpack(packed: u64) -> PageRef {
        PageRef {
            seg: (packed >> 40) as usize,
            idx: (packed & ((1 << 40) - 1)) as usize,
        }
    }

    /// True when a live block lies on the page `packed` refers to.
    #[inline]
    fn busy_packed(&self, packed: u64) -> bool {
        let p = Self::unpack(packed);
        bit(&self.segs[p.seg].bits(BUSY), p.idx)
    }

    /// True when the physical page under mapped page `idx` of `seg` could
    /// pass to it now: its owner is this page, nobody, or a page with no
    /// live block.
    #[inline]
    fn phys_free_for(&self, seg: usize, idx: usize, phys: &PhysCache) -> bool {
        let s = &self.segs[seg];
        if bit(&s.bits(OWNS), idx) {
            return true;
        }
        let p = s.page(idx);
        let owner = phys.owner(p.chunk, p.index);
        owner == NO_OWNER || !self.busy_packed(owner)
    }

    /// A block now covers pages `first..=last` of `seg`: marks it live and
    /// makes each mapped page the owner of its physical page. `safe` answers
    /// whether the frees (given on demand) recorded on a physical page that
    /// passes from another alias are done as far as the caller's stream is
    /// concerned. On a conflict the marks stay (undo them with
    /// [`PageTable::unacquire`]). Always inlined: it is the allocation fast
    /// path's core, a bitmap test and two entries.
    #[inline(always)]
    pub(super) fn acquire(
        &mut self,
        seg: usize,
        first: usize,
        last: usize,
        phys: &mut PhysCache,
        safe: impl FnMut(&dyn Fn() -> Frees) -> bool,
    ) -> Acquired {
        let s = &mut self.segs[seg];
        let ready = all_set(&s.bits(OWNS), first, last);
        s.mark(first, last);
        if ready {
            return Acquired {
                all_mapped: true,
                conflict: false,
            };
        }
        self.take_pages(seg, first, last, phys, safe)
    }

    /// The pages of a just-marked block that do not own their memory:
    /// unmapped ones are reported, mapped ones take their physical page over
    /// where its owner has no live block and `safe` accepts the extent's
    /// frees (asked once per extent), one extent mapping at a time. Owned
    /// pages are skipped a bitmap word at a time.
    #[cold]
    fn take_pages(
        &mut self,
        seg: usize,
        first: usize,
        last: usize,
        phys: &mut PhysCache,
        mut safe: impl FnMut(&dyn Fn() -> Frees) -> bool,
    ) -> Acquired {
        let mut out = Acquired {
            all_mapped: true,
            conflict: false,
        };
        let mut from = first;
        while let Some(idx) = next_clear(&self.segs[seg].bits(OWNS), from, last) {
            let s = &self.segs[seg];
            if !bit(&s.bits(MAPPED), idx) {
                out.all_mapped = false;
                from = idx + 1;
                continue;
            }
            // The extent's mapping here: pages `base..base + n`.
            let (c, i) = (s.page(idx).chunk, s.page(idx).index as usize);
            let base = idx - i;
            let end = (base + phys.pages(c) - 1).min(last);
            let mut frees_ok = None;
            if let Some(old) = Self::run_owner(&phys.chunk_mut(c).owner[idx - base..=end - base]) {
                // The usual case: the whole run passes from one other idle
                // mapping of the extent, so the bitmaps move a word at a
                // time. Otherwise page by page, below.
                let o = Self::unpack(old);
                let o_last = o.idx + (end - idx);
                if self.all_clear(seg, idx, end)
                    && !any_set(&self.segs[o.seg].bits(BUSY), o.idx, o_last)
                {
                    let ok = *frees_ok.get_or_insert_with(|| safe(&|| self.extent_frees(c, phys)));
                    if ok {
                        let owners = &mut phys.chunk_mut(c).owner[idx - base..=end - base];
                        for (k, slot) in owners.iter_mut().enumerate() {
                            *slot = Self::pack(seg, idx + k);
                        }
                        set_bits(&mut self.segs[o.seg].bits_mut(OWNS), o.idx, o_last, false);
                        set_bits(&mut self.segs[seg].bits_mut(OWNS), idx, end, true);
                        from = end + 1;
                        continue;
                    }
                }
            }
            // Asked before the loop (the owner list is borrowed in it); the
            // record itself is looked at only when another stream ever freed.
            let frees_ok = *frees_ok.get_or_insert_with(|| safe(&|| self.extent_frees(c, phys)));
            let owners = &mut phys.chunk_mut(c).owner;
            let mut j = idx;
            while let Some(k) = next_clear(&self.segs[seg].bits(OWNS), j, end) {
                j = k + 1;
                let old = owners[k - base];
                if (old != NO_OWNER && self.busy_packed(old)) || !frees_ok {
                    out.conflict = true;
                    continue;
                }
                owners[k - base] = Self::pack(seg, k);
                self.move_owns_bit(old, PageRef { seg, idx: k });
            }
            from = end + 1;
        }
        out
    }

    /// The packed first page of the one run of consecutive pages that owns
    /// every physical page of `owners` (consecutive pages of an extent), or
    /// `None` when they have no owner or several.
    #[inline]
    fn run_owner(owners: &[u64]) -> Option<u64> {
        let first = *owners.first()?;
        let contiguous = owners
            .iter()
            .enumerate()
            .all(|(k, &o)| o == first.wrapping_add(k as u64));
        (first != NO_OWNER && contiguous).then_some(first)
    }

    /// True when none of pages `first..=last` of `seg` owns its memory.
    #[inline]
    fn all_clear(&self, seg: usize, first: usize, last: usize) -> bool {
        !any_set(&self.segs[seg].bits(OWNS), first, last)
    }

    /// Moves the owns bit from page `old` (packed, or [`NO_OWNER`]) to `p`.
    #[inline]
    fn move_owns_bit(&mut self, old: u64, p: PageRef) {
        if old != NO_OWNER {
            let o = Self::unpack(old);
            self.segs[o.seg].bits_mut(OWNS)[o.idx / 64] &= !(1 << (o.idx % 64));
        }
        self.segs[p.seg].bits_mut(OWNS)[p.idx / 64] |= 1 << (p.idx % 64);
    }

    /// Makes page `p`, just mapped under a live block, the owner of its
    /// physical page (a new mapping: no other page can be using it).
    pub(super) fn own_new(&mut self, p: PageRef, phys: &mut PhysCache) {
        let e = self.segs[p.seg].page(p.idx);
        let slot = &mut phys.chunk_mut(e.chunk).owner[e.index as usize];
        let old = std::mem::replace(slot, Self::pack(p.seg, p.idx));
        self.move_owns_bit(old, p);
    }

    /// True when a mapped page among `first..=last` of `seg` (where no block
    /// lives) is backed by a physical page in use through another alias.
    pub(super) fn has_conflict(
        &self,
        seg: usize,
        first: usize,
        last: usize,
        phys: &PhysCache,
    ) -> bool {
        let s = &self.segs[seg];
        let mut conflict = false;
        // Only mapped pages that neither own their memory nor are busy can
        // conflict: visit those bits alone.
        words(first, last, |w, m| {
            let b = &s.groups[w].bits;
            let mut bits = b[MAPPED] & !b[OWNS] & !b[BUSY] & m;
            while bits != 0 && !conflict {
                let idx = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                conflict = !self.phys_free_for(seg, idx, phys);
            }
        });
        conflict
    }

    /// True when some page of extent `c` is in use through the alias that
    /// owns it.
    pub(super) fn extent_busy(&self, c: u32, phys: &PhysCache) -> bool {
        phys.chunk(c).is_some_and(|ch| {
            ch.owner
                .iter()
                .any(|&o| o != NO_OWNER && self.busy_packed(o))
        })
    }

    /// Undoes [`PageTable::acquire`] for a block that was never handed out.
    pub(super) fn unacquire(&mut self, seg: usize, first: usize, last: usize) {
        self.segs[seg].unmark(first, last);
    }

    /// A block on pages `first..=last` was freed by stream slot bit `bit` at
    /// `tick`: marks it gone and records the free on each group of 64 pages
    /// under it.
    #[inline(always)]
    pub(super) fn release(&mut self, seg: usize, first: usize, last: usize, bit: u64, tick: u64) {
        let s = &mut self.segs[seg];
        s.unmark(first, last);
        for g in &mut s.groups[first / 64..=last / 64] {
            g.frees.add(bit, tick);
        }
    }

    /// The frees recorded on the `n` pages from `p`.
    pub(super) fn frees_on(&self, p: PageRef, n: usize) -> Frees {
        self.segs[p.seg].groups[p.idx / 64..=(p.idx + n.max(1) - 1) / 64]
            .iter()
            .fold(Frees::default(), |f, g| f.union(g.frees))
    }

    /// Every free on extent `c` that its memory may still be subject to:
    /// those through its current mappings (their groups' records: coarser
    /// than the extent, so conservative) and those kept from mappings gone.
    pub(super) fn extent_frees(&self, c: u32, phys: &PhysCache) -> Frees {
        let (kept, n) = (phys.extent(c).frees, phys.pages(c));
        phys.chunk(c).map_or(kept, |ch| {
            ch.at
                .iter()
                .fold(kept, |f, &at| f.union(self.frees_on(Self::unpack(at), n)))
        })
    }

    /// Records that the mapping of extent `c` at `at` (packed first page) is
    /// gone, its frees kept by the extent (see [`PhysCache::unmapped_at`]).
    pub(super) fn unmapped_at(&self, c: u32, at: u64, phys: &mut PhysCache) {
        let frees = self.frees_on(Self::unpack(at), phys.pages(c));
        phys.unmapped_at(c, at, frees);
    }

    /// True when page `p` owns its physical page.
    pub(super) fn owns(&self, p: PageRef) -> bool {
        bit(&self.segs[p.seg].bits(OWNS), p.idx)
    }

    /// True when a live block lies on page `p`.
    pub(super) fn busy(&self, p: PageRef) -> bool {
        bit(&self.segs[p.seg].bits(BUSY), p.idx)
    }

    /// How many of pages `first..=last` of `seg` are unmapped: a popcount
    /// per 64 pages.
    pub(super) fn count_unmapped(&self, seg: usize, first: usize, last: usize) -> usize {
        let map = self.segs[seg].bits(MAPPED);
        let mut mapped = 0;
        words(first, last, |w, m| {
            mapped += (map[w] & m).count_ones() as usize
        });
        last - first + 1 - mapped
    }

    /// The unmapped pages among `first..=last` of `seg`, as runs
    /// `(first, count)`.
    pub(super) fn unmapped_runs(
        &self,
        seg: usize,
        first: usize,
        last: usize,
    ) -> Vec<(usize, usize)> {
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for idx in first..=last {
            if !bit(&self.segs[seg].bits(MAPPED), idx) {
                match runs.last_mut() {
                    Some((f, n)) if *f + *n == idx => *n += 1,
                    _ => runs.push((idx, 1)),
                }
            }
        }
        runs
    }

    /// Records that `phys` is now mapped at `p`.
    pub(super) fn set_mapped(&mut self, p: PageRef, phys: PhysPage) {
        let s = &mut self.segs[p.seg];
        let e = s.page_mut(p.idx);
        debug_assert_eq!(e.chunk, UNMAPPED);
        e.chunk = phys.chunk;
        e.index = phys.index;
        s.bits_mut(MAPPED)[p.idx / 64] |= 1 << (p.idx % 64);
        self.mapped_pages += 1;
    }

    /// Records that `p` is no longer mapped; returns what was mapped there.
    pub(super) fn set_unmapped(&mut self, p: PageRef) -> Option<PhysPage> {
        let s = &mut self.segs[p.seg];
        let e = s.page_mut(p.idx);
        if e.chunk == UNMAPPED {
            return None;
        }
        let pp = PhysPage {
            chunk: e.chunk,
            index: e.index,
        };
        e.chunk = UNMAPPED;
        let (w, b) = (p.idx / 64, 1u64 << (p.idx % 64));
        // The extent's owner entry goes with its mapping record
        // (`PhysCache::unmapped_at`).
        let bits = &mut s.groups[w].bits;
        bits[OWNS] &= !b;
        bits[MAPPED] &= !b;
        self.mapped_pages -= 1;
        Some(pp)
    }

    /// The runs of idle pages whose extents' freeing streams are all known
    /// complete, in address order: (first page, pages).
    pub(super) fn reclaimable_runs(
        &self,
        streams: &mut FreeStreams,
        phys: &PhysCache,
    ) -> Vec<(PageRef, usize)> {
        let mut runs: Vec<(PageRef, usize)> = Vec::new();
        for (seg, s) in self.segs.iter().enumerate() {
            for w in 0..s.groups.len() {
                let word = s.idle_word(w);
                if word == 0 {
                    continue;
                }
                let (mut ok, mut bits) = (0u64, word);
                while bits != 0 {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    let p = &s.groups[w].pages[b];
                    let quiet = self
                        .extent_frees(p.chunk, phys)
                        .quiet(|m, t| streams.complete(m, t));
                    if quiet {
                        ok |= 1 << b;
                    }
                }
                let mut bits = ok;
                while bits != 0 {
                    let start = bits.trailing_zeros() as usize;
                    let len = (bits >> start).trailing_ones() as usize;
                    let idx = w * 64 + start;
                    match runs.last_mut() {
                        Some((r, n)) if r.seg == seg && r.idx + *n == idx => *n += len,
                        _ => runs.push((PageRef { seg, idx }, len)),
                    }
                    let span = if len >= 64 {
                        u64::MAX
                    } else {
                        (1u64 << len) - 1
                    };
                    bits &= !(span << start);
                }
            }
        }
        runs
    }

    /// What is mapped at `p`, if anything.
    pub(super) fn phys_at(&self, p: PageRef) -> Option<PhysPage> {
        let e = self.segs[p.seg].page(p.idx);
        (e.chunk != UNMAPPED).then_some(PhysPage {
            chunk: e.chunk,
            index: e.index,
        })
    }

    /// Every mapped page in address order.
    pub(super) fn mapped(&self) -> impl Iterator<Item = (PageRef, PhysPage)> + '_ {
        self.segs.iter().enumerate().flat_map(|(seg, s)| {
            s.pages().enumerate().filter_map(move |(idx, p)| {
                (p.chunk != UNMAPPED).then_some((
                    PageRef { seg, idx },
                    PhysPage {
                        chunk: p.chunk,
                        index: p.index,
                    },
                ))
            })
        })
    }

    /// Checks the table against the live blocks `[addr, addr + size)`: each
    /// page's count is the number of live blocks beginning or ending on it,
    /// a page is busy exactly when a live block lies on it, every busy page
    /// is mapped and owns its physical page, and the bitmaps and counter
    /// agree with the entries and the extents.
    pub(super) fn check(&self, live: &[(u64, u64)], phys: &PhysCache) -> Result<(), String> {
        let mut users: Vec<Vec<u32>> = self.segs.iter().map(|s| vec![0; s.len]).collect();
        let mut busy: Vec<Vec<bool>> = self.segs.iter().map(|s| vec![false; s.len]).collect();
        for &(addr, size) in live {
            let (seg, first, last) = self
                .range(addr, size)
                .ok_or_else(|| format!("live block {addr:#x}+{size} outside every range"))?;
            users[seg][first] += 1;
            if last > first {
                users[seg][last] += 1;
            }
            for b in &mut busy[seg][first..=last] {
                *b = true;
            }
        }
        let mut mapped = 0;
        for (seg, s) in self.segs.iter().enumerate() {
            for (idx, p) in s.pages().enumerate() {
                let addr = s.base + ((idx as u64) << self.shift);
                if p.users != users[seg][idx] {
                    return Err(format!(
                        "page {addr:#x}: {} users counted, {} live blocks begin or end on it",
                        p.users, users[seg][idx]
                    ));
                }
                if bit(&s.bits(BUSY), idx) != busy[seg][idx] {
                    return Err(format!("page {addr:#x}: busy bit is wrong"));
                }
                let is_mapped = p.chunk != UNMAPPED;
                let owns = bit(&s.bits(OWNS), idx);
                if busy[seg][idx] && !is_mapped {
                    return Err(format!("page {addr:#x} has live blocks but is unmapped"));
                }
                if busy[seg][idx] && !owns {
                    return Err(format!(
                        "page {addr:#x} has live blocks but does not own its physical page"
                    ));
                }
                if owns && !is_mapped {
                    return Err(format!("page {addr:#x} owns memory but is unmapped"));
                }
                if is_mapped && owns != (phys.owner(p.chunk, p.index) == Self::pack(seg, idx)) {
                    return Err(format!("page {addr:#x}: owns bit is wrong"));
                }
                if bit(&s.bits(MAPPED), idx) != is_mapped {
                    return Err(format!("page {addr:#x}: mapped bit is wrong"));
                }
                mapped += usize::from(is_mapped);
            }
        }
        if mapped != self.mapped_pages {
            return Err(format!(
                "counters: {} mapped recorded, {mapped} found",
                self.mapped_pages
            ));
        }
        Ok(())
    }
}
