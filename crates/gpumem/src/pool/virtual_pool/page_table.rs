//! The page table of a [`VirtualPool`](super::VirtualPool): one entry per
//! page of every reservation. Words are those of the glossary in
//! `docs/virtual_pool.md`.
//!
//! Each page names the physical page mapped there (if any). Three bitmaps
//! per reservation say which pages are *mapped*, which *own* their physical
//! page (see [`PhysCache`]) and which are *busy* (some live block lies on
//! them). Pages are kept 64 to a group, each group's three bitmap words
//! beside its entries, so an operation on a page touches one place in memory
//! rather than four arrays.
//! A mapped page that is not busy is *idle*: it is kept mapped (re-using it
//! costs no driver call) and may be unmapped once every stream that freed a
//! block on its extent has been seen complete at or after that free (see
//! [`FreeStreams`]). Frees are recorded per group of 64 pages ([`Frees`]: a
//! mask of stream bits and the tick of the last free); an extent's record
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
//! a mapping at a time: when the whole run passes from one other idle
//! mapping (the usual case) its bitmaps move a word at a time, else page by
//! page; the extent's frees are looked at only when a stream other than the
//! taker's ever freed a block. No allocation, no driver call.

use std::ops::{Index, IndexMut};

use super::bits::{all_set, any_set, bit, next_clear, set_bits, words};
use super::phys_cache::{ExtentId, PhysCache, NO_OWNER};
use crate::pool::stream_order::free_streams::{FreeStreams, Frees};

/// A physical page: page `index` of extent `extent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PhysPage {
    pub(super) extent: ExtentId,
    pub(super) index: u32,
}

/// A page named in one word ([`PageTable::pack`]: reservation << 40 |
/// page), as extents record their mappings and owners.
pub(super) type PackedPage = u64;

/// Page `idx` of reservation `res`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PageRef {
    pub(super) res: usize,
    pub(super) idx: usize,
}

/// The pages a block covers: pages `first..=last` of reservation `res`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PageSpan {
    pub(super) res: usize,
    pub(super) first: usize,
    pub(super) last: usize,
}

const UNMAPPED: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Page {
    /// Live blocks that begin or end on the page (pages strictly inside a
    /// block are not counted: they have the busy bit only).
    users: u32,
    /// Extent of the physical page mapped here, or `UNMAPPED`.
    extent: ExtentId,
    /// Page within the extent.
    index: u32,
}

const EMPTY: Page = Page {
    users: 0,
    extent: UNMAPPED,
    index: 0,
};

/// Which of a reservation's bitmaps: mapped, owns its physical page, busy.
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

/// One bitmap of a reservation, a word per group (`G` is `&[Group]` to read,
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

/// One reservation: a virtual address range reserved with one
/// `cuMemAddressReserve`.
pub(super) struct Reservation {
    pub(super) base: u64,
    pub(super) bytes: u64,
    /// Pages in the reservation.
    len: usize,
    /// The pages, 64 to a group. Bitmaps: [`MAPPED`], [`OWNS`] (owns its
    /// physical page; always so while busy), [`BUSY`] (some live block lies
    /// on it).
    groups: Vec<Group>,
}

impl Reservation {
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
    #[inline(always)]
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
    #[inline(always)]
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

/// What [`PageTable::acquire`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Acquired {
    /// Every page is mapped.
    pub(super) all_mapped: bool,
    /// Some mapped page's physical page is in use through another alias (or
    /// was freed there by a stream not known done): the block cannot stay.
    pub(super) conflict: bool,
}

/// The pages of every reservation.
pub(super) struct PageTable {
    shift: u32,
    pub(super) reservations: Vec<Reservation>,
    mapped_pages: usize,
}

impl PageTable {
    /// An empty table for pages of `gran` bytes (a power of two).
    pub(super) fn new(gran: u64) -> Self {
        Self {
            shift: gran.trailing_zeros(),
            reservations: Vec::new(),
            mapped_pages: 0,
        }
    }

    /// Adds a reservation (base and bytes multiples of the page size).
    pub(super) fn add_reservation(&mut self, base: u64, bytes: u64) {
        let n = (bytes >> self.shift) as usize;
        self.reservations.push(Reservation {
            base,
            bytes,
            len: n,
            groups: vec![EMPTY_GROUP; n.div_ceil(64)],
        });
    }

    /// Bytes of every reservation.
    pub(super) fn reserved_bytes(&self) -> usize {
        self.reservations.iter().map(|r| r.bytes as usize).sum()
    }

    /// Pages mapped.
    pub(super) fn mapped_pages(&self) -> usize {
        self.mapped_pages
    }

    /// Mapped pages with no live block (a scan of the bitmaps).
    pub(super) fn idle_pages(&self) -> usize {
        self.reservations
            .iter()
            .map(|r| {
                (0..r.groups.len())
                    .map(|w| r.idle_word(w).count_ones() as usize)
                    .sum::<usize>()
            })
            .sum()
    }

    /// The pages under `[addr, addr + size)` (size > 0), or `None` when
    /// they lie in no reservation.
    #[inline]
    pub(super) fn span(&self, addr: u64, size: u64) -> Option<PageSpan> {
        let res = self
            .reservations
            .iter()
            .position(|r| addr >= r.base && addr - r.base < r.bytes)?;
        let r = &self.reservations[res];
        let off = addr - r.base;
        let last = off + size.max(1) - 1;
        if last >= r.bytes {
            return None;
        }
        Some(PageSpan {
            res,
            first: (off >> self.shift) as usize,
            last: (last >> self.shift) as usize,
        })
    }

    /// Address of a page.
    pub(super) fn addr(&self, p: PageRef) -> u64 {
        self.reservations[p.res].base + ((p.idx as u64) << self.shift)
    }

    /// Page `idx` of reservation `res`, packed in one word.
    #[inline]
    pub(super) fn pack(res: usize, idx: usize) -> PackedPage {
        ((res as u64) << 40) | idx as u64
    }

    /// The page `packed` names.
    #[inline]
    pub(super) fn unpack(packed: PackedPage) -> PageRef {
        PageRef {
            res: (packed >> 40) as usize,
            idx: (packed & ((1 << 40) - 1)) as usize,
        }
    }

    /// True when a live block lies on page `packed`.
    #[inline]
    fn busy_packed(&self, packed: PackedPage) -> bool {
        let p = Self::unpack(packed);
        bit(&self.reservations[p.res].bits(BUSY), p.idx)
    }

    /// True when the physical page under mapped page `idx` of `res` could
    /// pass to it now: its owner is this page, nobody, or a page with no
    /// live block.
    #[inline]
    fn phys_free_for(&self, res: usize, idx: usize, phys: &PhysCache) -> bool {
        let r = &self.reservations[res];
        if bit(&r.bits(OWNS), idx) {
            return true;
        }
        let p = r.page(idx);
        let owner = phys.owner(p.extent, p.index);
        owner == NO_OWNER || !self.busy_packed(owner)
    }

    /// A block now covers `span`: marks it live and makes each mapped page
    /// the owner of its physical page. `safe` answers
    /// whether the frees (given on demand) recorded on a physical page that
    /// passes from another alias are done as far as the caller's stream is
    /// concerned. On a conflict the marks stay (undo them with
    /// [`PageTable::unacquire`]). Always inlined: it is the allocation fast
    /// path's core, a bitmap test and two entries.
    #[inline(always)]
    pub(super) fn acquire(
        &mut self,
        span: PageSpan,
        phys: &mut PhysCache,
        safe: impl FnMut(&dyn Fn() -> Frees) -> bool,
    ) -> Acquired {
        let r = &mut self.reservations[span.res];
        let ready = all_set(&r.bits(OWNS), span.first, span.last);
        r.mark(span.first, span.last);
        if ready {
            return Acquired {
                all_mapped: true,
                conflict: false,
            };
        }
        self.take_pages(span.res, span.first, span.last, phys, safe)
    }

    /// The pages of a just-marked block that do not own their memory:
    /// unmapped ones are reported, mapped ones take their physical page over
    /// where its owner has no live block and `safe` accepts the extent's
    /// frees (asked once per extent), one mapping at a time. Owned pages are
    /// skipped a bitmap word at a time. The pages come as three words, not a
    /// [`PageSpan`]: a struct argument is passed by pointer, which would
    /// make the allocation fast path store its span before this call.
    #[cold]
    fn take_pages(
        &mut self,
        res: usize,
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
        while let Some(idx) = next_clear(&self.reservations[res].bits(OWNS), from, last) {
            let r = &self.reservations[res];
            if !bit(&r.bits(MAPPED), idx) {
                out.all_mapped = false;
                from = idx + 1;
                continue;
            }
            // The extent's mapping here: pages `base..base + n`.
            let (x, i) = (r.page(idx).extent, r.page(idx).index as usize);
            let base = idx - i;
            let end = (base + phys.pages(x) - 1).min(last);
            let mut frees_ok = None;
            if let Some(old) = Self::run_owner(&phys.extent_mut(x).owners[idx - base..=end - base])
            {
                // The usual case: the whole run passes from one other idle
                // mapping of the extent, so the bitmaps move a word at a
                // time. Otherwise page by page, below.
                let o = Self::unpack(old);
                let o_last = o.idx + (end - idx);
                if self.all_clear(res, idx, end)
                    && !any_set(&self.reservations[o.res].bits(BUSY), o.idx, o_last)
                {
                    let ok = *frees_ok.get_or_insert_with(|| safe(&|| self.extent_frees(x, phys)));
                    if ok {
                        let owners = &mut phys.extent_mut(x).owners[idx - base..=end - base];
                        for (k, slot) in owners.iter_mut().enumerate() {
                            *slot = Self::pack(res, idx + k);
                        }
                        set_bits(
                            &mut self.reservations[o.res].bits_mut(OWNS),
                            o.idx,
                            o_last,
                            false,
                        );
                        set_bits(&mut self.reservations[res].bits_mut(OWNS), idx, end, true);
                        from = end + 1;
                        continue;
                    }
                }
            }
            // Asked before the loop (the owner list is borrowed in it); the
            // record itself is looked at only when another stream ever freed.
            let frees_ok = *frees_ok.get_or_insert_with(|| safe(&|| self.extent_frees(x, phys)));
            let owners = &mut phys.extent_mut(x).owners;
            let mut j = idx;
            while let Some(k) = next_clear(&self.reservations[res].bits(OWNS), j, end) {
                j = k + 1;
                let old = owners[k - base];
                if (old != NO_OWNER && self.busy_packed(old)) || !frees_ok {
                    out.conflict = true;
                    continue;
                }
                owners[k - base] = Self::pack(res, k);
                self.move_owns_bit(old, PageRef { res, idx: k });
            }
            from = end + 1;
        }
        out
    }

    /// The packed first page of the one run of consecutive pages that owns
    /// every physical page of `owners` (consecutive pages of an extent), or
    /// `None` when they have no owner or several.
    #[inline]
    fn run_owner(owners: &[PackedPage]) -> Option<PackedPage> {
        let first = *owners.first()?;
        let contiguous = owners
            .iter()
            .enumerate()
            .all(|(k, &o)| o == first.wrapping_add(k as u64));
        (first != NO_OWNER && contiguous).then_some(first)
    }

    /// True when none of pages `first..=last` of `res` owns its memory.
    #[inline]
    fn all_clear(&self, res: usize, first: usize, last: usize) -> bool {
        !any_set(&self.reservations[res].bits(OWNS), first, last)
    }

    /// Moves the owns bit from page `old` (or [`NO_OWNER`]) to `p`.
    #[inline]
    fn move_owns_bit(&mut self, old: PackedPage, p: PageRef) {
        if old != NO_OWNER {
            let o = Self::unpack(old);
            self.reservations[o.res].bits_mut(OWNS)[o.idx / 64] &= !(1 << (o.idx % 64));
        }
        self.reservations[p.res].bits_mut(OWNS)[p.idx / 64] |= 1 << (p.idx % 64);
    }

    /// Makes page `p`, just mapped under a live block, the owner of its
    /// physical page (a new mapping: no other page can be using it).
    pub(super) fn own_new(&mut self, p: PageRef, phys: &mut PhysCache) {
        let e = self.reservations[p.res].page(p.idx);
        let slot = &mut phys.extent_mut(e.extent).owners[e.index as usize];
        let old = std::mem::replace(slot, Self::pack(p.res, p.idx));
        self.move_owns_bit(old, p);
    }

    /// True when a block on `span` (not acquired) would conflict, as
    /// [`PageTable::acquire`] finds it: a mapped page that does not own its
    /// memory is backed by a physical page in use through another alias,
    /// or by one that another page of the span maps too (two mappings of
    /// one extent under the span: the block would hold the same physical
    /// page twice), or by an extent whose frees `safe` (asked once per
    /// extent met, as `acquire` asks) does not accept. Checking less than
    /// `acquire` would let a placement pick a place that `acquire` then
    /// refuses, and the block go to a new reservation.
    pub(super) fn has_conflict(
        &self,
        span: PageSpan,
        phys: &PhysCache,
        mut safe: impl FnMut(&dyn Fn() -> Frees) -> bool,
    ) -> bool {
        let PageSpan { res, first, last } = span;
        let r = &self.reservations[res];
        let mut conflict = false;
        // The last extent whose frees were asked about, and the answer.
        let mut asked: Option<(ExtentId, bool)> = None;
        // Only mapped pages that neither own their memory nor are busy can
        // conflict: visit those bits alone.
        words(first, last, |w, m| {
            let b = &r.groups[w].bits;
            let mut bits = b[MAPPED] & !b[OWNS] & !b[BUSY] & m;
            while bits != 0 && !conflict {
                let idx = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let p = r.page(idx);
                conflict = !self.phys_free_for(res, idx, phys)
                    || Self::mapped_again_in(span, phys, p.extent, p.index, idx)
                    || !match asked {
                        Some((x, ok)) if x == p.extent => ok,
                        _ => {
                            let ok = safe(&|| self.extent_frees(p.extent, phys));
                            asked = Some((p.extent, ok));
                            ok
                        }
                    };
            }
        });
        conflict
    }

    /// True when physical page `index` of extent `x`, mapped at page `idx`
    /// of `span`, is also mapped at another page of `span` (through another
    /// mapping of the extent: an extent is mapped whole, so its page
    /// `index` lies `index` pages after each mapping's first page).
    fn mapped_again_in(
        span: PageSpan,
        phys: &PhysCache,
        x: ExtentId,
        index: u32,
        idx: usize,
    ) -> bool {
        let here = Self::pack(span.res, idx - index as usize);
        phys.extent(x).is_some_and(|ext| {
            ext.mappings.iter().any(|&at| {
                let p = Self::unpack(at);
                let q = p.idx + index as usize;
                at != here && p.res == span.res && (span.first..=span.last).contains(&q)
            })
        })
    }

    /// True when some physical page of extent `x` is in use through the
    /// page that owns it.
    pub(super) fn extent_busy(&self, x: ExtentId, phys: &PhysCache) -> bool {
        phys.extent(x).is_some_and(|ext| {
            ext.owners
                .iter()
                .any(|&o| o != NO_OWNER && self.busy_packed(o))
        })
    }

    /// Undoes [`PageTable::acquire`] for a block that was never handed out.
    pub(super) fn unacquire(&mut self, span: PageSpan) {
        self.reservations[span.res].unmark(span.first, span.last);
    }

    /// The block on `span` was freed by the stream of bit `bit` at `tick`:
    /// marks it gone and records the free on each group of 64 pages under
    /// it.
    #[inline(always)]
    pub(super) fn release(&mut self, span: PageSpan, bit: u64, tick: u64) {
        let PageSpan { res, first, last } = span;
        let r = &mut self.reservations[res];
        r.unmark(first, last);
        for g in &mut r.groups[first / 64..=last / 64] {
            g.frees.add(bit, tick);
        }
    }

    /// The frees recorded on the `n` pages from `p`.
    pub(super) fn frees_on(&self, p: PageRef, n: usize) -> Frees {
        self.reservations[p.res].groups[p.idx / 64..=(p.idx + n.max(1) - 1) / 64]
            .iter()
            .fold(Frees::default(), |f, g| f.union(g.frees))
    }

    /// Every free on extent `x` that its memory may still be subject to:
    /// those through its current mappings (their groups' records: coarser
    /// than the extent, so conservative) and those kept from mappings gone.
    pub(super) fn extent_frees(&self, x: ExtentId, phys: &PhysCache) -> Frees {
        let (kept, n) = (phys.summary(x).frees, phys.pages(x));
        phys.extent(x).map_or(kept, |ext| {
            ext.mappings
                .iter()
                .fold(kept, |f, &at| f.union(self.frees_on(Self::unpack(at), n)))
        })
    }

    /// Records that the mapping of extent `x` at `at` (its first page) is
    /// gone, its frees kept by the extent (see [`PhysCache::unmapped_at`]).
    pub(super) fn unmapped_at(&self, x: ExtentId, at: PackedPage, phys: &mut PhysCache) {
        let frees = self.frees_on(Self::unpack(at), phys.pages(x));
        phys.unmapped_at(x, at, frees);
    }

    /// True when page `p` owns its physical page.
    pub(super) fn owns(&self, p: PageRef) -> bool {
        bit(&self.reservations[p.res].bits(OWNS), p.idx)
    }

    /// Live blocks that begin or end on page `p` (0 for a page strictly
    /// inside a block).
    pub(super) fn users(&self, p: PageRef) -> u32 {
        self.reservations[p.res].page(p.idx).users
    }

    /// True when a live block lies on page `p`.
    pub(super) fn busy(&self, p: PageRef) -> bool {
        bit(&self.reservations[p.res].bits(BUSY), p.idx)
    }

    /// How many pages of `span` are unmapped: a popcount per 64 pages.
    pub(super) fn count_unmapped(&self, span: PageSpan) -> usize {
        let PageSpan { res, first, last } = span;
        let map = self.reservations[res].bits(MAPPED);
        let mut mapped = 0;
        words(first, last, |w, m| {
            mapped += (map[w] & m).count_ones() as usize
        });
        last - first + 1 - mapped
    }

    /// The unmapped pages of `span`, as runs `(first page, pages)`.
    pub(super) fn unmapped_runs(&self, span: PageSpan) -> Vec<(usize, usize)> {
        let PageSpan { res, first, last } = span;
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for idx in first..=last {
            if !bit(&self.reservations[res].bits(MAPPED), idx) {
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
        let r = &mut self.reservations[p.res];
        let e = r.page_mut(p.idx);
        debug_assert_eq!(e.extent, UNMAPPED);
        e.extent = phys.extent;
        e.index = phys.index;
        r.bits_mut(MAPPED)[p.idx / 64] |= 1 << (p.idx % 64);
        self.mapped_pages += 1;
    }

    /// Records that `p` is no longer mapped; returns what was mapped there.
    pub(super) fn set_unmapped(&mut self, p: PageRef) -> Option<PhysPage> {
        let r = &mut self.reservations[p.res];
        let e = r.page_mut(p.idx);
        if e.extent == UNMAPPED {
            return None;
        }
        let pp = PhysPage {
            extent: e.extent,
            index: e.index,
        };
        e.extent = UNMAPPED;
        let (w, b) = (p.idx / 64, 1u64 << (p.idx % 64));
        // The extent's owner entry goes with its mapping record
        // (`PhysCache::unmapped_at`).
        let bits = &mut r.groups[w].bits;
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
        for (res, r) in self.reservations.iter().enumerate() {
            for w in 0..r.groups.len() {
                let word = r.idle_word(w);
                if word == 0 {
                    continue;
                }
                let (mut ok, mut bits) = (0u64, word);
                while bits != 0 {
                    let b = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    let p = &r.groups[w].pages[b];
                    let quiet = self
                        .extent_frees(p.extent, phys)
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
                        Some((run, n)) if run.res == res && run.idx + *n == idx => *n += len,
                        _ => runs.push((PageRef { res, idx }, len)),
                    }
                    let mask = if len >= 64 {
                        u64::MAX
                    } else {
                        (1u64 << len) - 1
                    };
                    bits &= !(mask << start);
                }
            }
        }
        runs
    }

    /// What is mapped at `p`, if anything.
    pub(super) fn phys_at(&self, p: PageRef) -> Option<PhysPage> {
        let e = self.reservations[p.res].page(p.idx);
        (e.extent != UNMAPPED).then_some(PhysPage {
            extent: e.extent,
            index: e.index,
        })
    }

    /// What is mapped at `p`, if anything; `None` too when `p` lies in no
    /// reservation (for the checker, which follows recorded page words).
    pub(super) fn phys_at_checked(&self, p: PageRef) -> Option<PhysPage> {
        let r = self.reservations.get(p.res)?;
        (p.idx < r.len).then(|| self.phys_at(p)).flatten()
    }

    /// Every mapped page in address order.
    pub(super) fn mapped(&self) -> impl Iterator<Item = (PageRef, PhysPage)> + '_ {
        self.reservations.iter().enumerate().flat_map(|(res, r)| {
            r.pages().enumerate().filter_map(move |(idx, p)| {
                (p.extent != UNMAPPED).then_some((
                    PageRef { res, idx },
                    PhysPage {
                        extent: p.extent,
                        index: p.index,
                    },
                ))
            })
        })
    }

    /// Checks the table against the live blocks `[addr, addr + size)`, of
    /// which those at the addresses `asleep` (sorted) sleep, and the
    /// extents' owners: invariants 3, 4, the page side of 5, and 6 of
    /// `docs/virtual_pool.md`.
    pub(super) fn check(
        &self,
        live: &[(u64, u64)],
        asleep: &[u64],
        phys: &PhysCache,
    ) -> Result<(), String> {
        let mut users: Vec<Vec<u32>> = self.reservations.iter().map(|r| vec![0; r.len]).collect();
        let mut busy: Vec<Vec<bool>> = self
            .reservations
            .iter()
            .map(|r| vec![false; r.len])
            .collect();
        // Pages an awake block lies on.
        let mut awake = busy.clone();
        for &(addr, size) in live {
            let PageSpan { res, first, last } = self.span(addr, size).ok_or_else(|| {
                format!("invariant 3: live block {addr:#x}+{size} outside every reservation")
            })?;
            users[res][first] += 1;
            if last > first {
                users[res][last] += 1;
            }
            for b in &mut busy[res][first..=last] {
                *b = true;
            }
            if asleep.binary_search(&addr).is_err() {
                for a in &mut awake[res][first..=last] {
                    *a = true;
                }
            }
        }
        let mut mapped = 0;
        for (res, r) in self.reservations.iter().enumerate() {
            for (idx, p) in r.pages().enumerate() {
                let addr = r.base + ((idx as u64) << self.shift);
                // 3. Block counts and the busy bit.
                if p.users != users[res][idx] {
                    return Err(format!(
                        "invariant 3: page {addr:#x}: {} users counted, {} live blocks begin or end on it",
                        p.users, users[res][idx]
                    ));
                }
                if bit(&r.bits(BUSY), idx) != busy[res][idx] {
                    return Err(format!("invariant 3: page {addr:#x}: busy bit is wrong"));
                }
                // 4. Pages with awake blocks are mapped; busy pages that are
                //    mapped own their memory.
                let is_mapped = p.extent != UNMAPPED;
                let owns = bit(&r.bits(OWNS), idx);
                if awake[res][idx] && !is_mapped {
                    return Err(format!(
                        "invariant 4: page {addr:#x} has awake blocks but is unmapped"
                    ));
                }
                if busy[res][idx] && is_mapped && !owns {
                    return Err(format!(
                        "invariant 4: page {addr:#x} has live blocks but does not own its physical page"
                    ));
                }
                // 5 (the page side). The owns bit is set exactly on mapped
                // pages their physical page's owner entry names.
                if owns && !is_mapped {
                    return Err(format!(
                        "invariant 5: page {addr:#x} owns memory but is unmapped"
                    ));
                }
                if is_mapped && owns != (phys.owner(p.extent, p.index) == Self::pack(res, idx)) {
                    return Err(format!("invariant 5: page {addr:#x}: owns bit is wrong"));
                }
                // 6. The mapped bit and the count of mapped pages.
                if bit(&r.bits(MAPPED), idx) != is_mapped {
                    return Err(format!("invariant 6: page {addr:#x}: mapped bit is wrong"));
                }
                mapped += usize::from(is_mapped);
            }
        }
        if mapped != self.mapped_pages {
            return Err(format!(
                "invariant 6: {} pages counted as mapped, {mapped} mapped",
                self.mapped_pages
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    const G: u64 = 2 << 20;
    const BASE: u64 = 1 << 40;
    const OTHER: u64 = 1 << 41;

    /// A table of two reservations (256 pages at `BASE`, 64 at `OTHER`) and
    /// no extent.
    fn table() -> (PageTable, PhysCache) {
        let mut t = PageTable::new(G);
        t.add_reservation(BASE, 256 * G);
        t.add_reservation(OTHER, 64 * G);
        (t, PhysCache::default())
    }

    /// Page `idx` of the first reservation.
    fn pg(idx: usize) -> PageRef {
        PageRef { res: 0, idx }
    }

    /// Pages `first..=last` of the first reservation.
    fn sp(first: usize, last: usize) -> PageSpan {
        PageSpan {
            res: 0,
            first,
            last,
        }
    }

    /// A new extent of `n` pages mapped at `first` as `map_extent` does:
    /// pages under a live block take ownership.
    fn map(t: &mut PageTable, phys: &mut PhysCache, first: usize, n: usize) -> ExtentId {
        let x = phys.add_extent(0, n as u32);
        phys.mapped_at(x, PageTable::pack(0, first));
        for i in 0..n {
            let p = pg(first + i);
            t.set_mapped(
                p,
                PhysPage {
                    extent: x,
                    index: i as u32,
                },
            );
            if t.busy(p) {
                t.own_new(p, phys);
            }
        }
        x
    }

    /// An extent mapped under a block on `here` (then freed by stream bit
    /// `bit` at tick 3) and mapped again, as an alias, at the same number of
    /// pages from `there`.
    fn aliased(
        t: &mut PageTable,
        phys: &mut PhysCache,
        here: PageSpan,
        there: usize,
        bit: u64,
    ) -> ExtentId {
        let n = here.last - here.first + 1;
        take(t, phys, here);
        let x = map(t, phys, here.first, n);
        t.release(here, bit, 3);
        phys.mapped_at(x, PageTable::pack(0, there));
        for i in 0..n {
            let index = i as u32;
            t.set_mapped(pg(there + i), PhysPage { extent: x, index });
        }
        x
    }

    /// The block covering whole pages `first..=last`, as the checker sees it.
    fn block(first: usize, last: usize) -> (u64, u64) {
        (BASE + first as u64 * G, (last - first + 1) as u64 * G)
    }

    /// Acquires with every frees record safe.
    fn take(t: &mut PageTable, phys: &mut PhysCache, span: PageSpan) -> Acquired {
        t.acquire(span, phys, |_| true)
    }

    const CLEAN: Acquired = Acquired {
        all_mapped: true,
        conflict: false,
    };

    #[test]
    fn span_names_the_pages_under_a_range() {
        let (t, _) = table();
        assert_eq!(t.span(BASE, 1), Some(sp(0, 0)));
        assert_eq!(
            t.span(BASE, 0),
            Some(sp(0, 0)),
            "an empty range is one byte"
        );
        assert_eq!(t.span(BASE + G - 1, 2), Some(sp(0, 1)));
        assert_eq!(t.span(BASE + 3 * G, G), Some(sp(3, 3)));
        assert_eq!(t.span(BASE + 255 * G, G), Some(sp(255, 255)));
        assert_eq!(t.span(BASE + 255 * G, G + 1), None, "past the reservation");
        assert_eq!(t.span(BASE - 1, 1), None);
        assert_eq!(
            t.span(OTHER + 5 * G, 3 * G),
            Some(PageSpan {
                res: 1,
                first: 5,
                last: 7
            })
        );
        assert_eq!(t.reserved_bytes(), (320 * G) as usize);
    }

    #[test]
    fn packed_pages_and_addresses_round_trip() {
        let p = PageRef { res: 1, idx: 63 };
        assert_eq!(PageTable::unpack(PageTable::pack(1, 63)), p);
        assert_ne!(PageTable::pack(1, 63), NO_OWNER);
        let (t, _) = table();
        assert_eq!(t.addr(p), OTHER + 63 * G);
        assert_eq!(t.phys_at_checked(PageRef { res: 2, idx: 0 }), None);
        assert_eq!(t.phys_at_checked(PageRef { res: 1, idx: 64 }), None);
    }

    #[test]
    fn blocks_sharing_a_page_count_on_it() {
        let (mut t, mut phys) = table();
        map(&mut t, &mut phys, 0, 6);
        // A block on pages 0..=2 and one on 2..=4: page 2 holds both.
        let (a, b) = (sp(0, 2), sp(2, 4));
        assert_eq!(take(&mut t, &mut phys, a), CLEAN);
        assert_eq!(take(&mut t, &mut phys, b), CLEAN);
        let (a_at, b_at) = ((BASE, 2 * G + G / 2), (BASE + 2 * G + G / 2, 2 * G + G / 2));
        assert_eq!(t.span(a_at.0, a_at.1), Some(a));
        assert_eq!(t.span(b_at.0, b_at.1), Some(b));
        t.check(&[a_at, b_at], &[], &phys).unwrap();
        assert_eq!(t.idle_pages(), 1, "page 5 only");
        t.release(a, 1, 1);
        assert!(t.busy(pg(2)), "page 2 still carries the second block");
        assert!(!t.busy(pg(0)) && !t.busy(pg(1)));
        t.check(&[b_at], &[], &phys).unwrap();
        assert_eq!(t.idle_pages(), 3);
        assert_eq!(t.mapped_pages(), 6);
    }

    #[test]
    fn a_free_is_recorded_on_each_group_under_the_block() {
        let (mut t, mut phys) = table();
        map(&mut t, &mut phys, 60, 11);
        let s = sp(60, 70);
        take(&mut t, &mut phys, s);
        t.release(s, 0b100, 5);
        let freed = Frees {
            mask: 0b100,
            tick: 5,
        };
        assert_eq!(t.frees_on(pg(60), 11), freed);
        assert_eq!(t.frees_on(pg(64), 1), freed, "both groups under the block");
        assert_eq!(t.frees_on(pg(0), 1), freed, "the record is per 64 pages");
        assert_eq!(t.frees_on(pg(128), 1), Frees::default());
        let x = t.phys_at(pg(60)).unwrap().extent;
        assert_eq!(t.extent_frees(x, &phys), freed);
    }

    #[test]
    fn unmapped_pages_are_reported_and_counted_in_runs() {
        let (mut t, mut phys) = table();
        map(&mut t, &mut phys, 2, 2);
        map(&mut t, &mut phys, 70, 1);
        let s = sp(0, 71);
        assert_eq!(t.count_unmapped(s), 72 - 3);
        assert_eq!(t.unmapped_runs(s), vec![(0, 2), (4, 66), (71, 1)]);
        let got = take(&mut t, &mut phys, s);
        assert!(!got.all_mapped && !got.conflict);
        t.unacquire(s);
        assert!(!t.busy(pg(2)));
        assert_eq!(t.set_unmapped(pg(70)).map(|p| p.index), Some(0));
        assert_eq!(t.set_unmapped(pg(70)), None, "already unmapped");
        assert_eq!(t.mapped_pages(), 2);
    }

    #[test]
    fn an_idle_alias_gives_its_memory_to_a_new_block() {
        let (mut t, mut phys) = table();
        // One extent of 3 pages, mapped at 0..=2 (where a block lived) and
        // at 10..=12 (an alias).
        let (here, there) = (sp(0, 2), sp(10, 12));
        let x = aliased(&mut t, &mut phys, here, 10, 0b1);
        assert!(t.owns(pg(0)) && !t.owns(pg(10)));
        assert!(!t.has_conflict(there, &phys, |_| true), "the owner is idle");
        assert_eq!(take(&mut t, &mut phys, there), CLEAN);
        assert!(!t.owns(pg(0)) && t.owns(pg(10)) && t.owns(pg(12)));
        assert_eq!(phys.owner(x, 1), PageTable::pack(0, 11));
        assert!(t.extent_busy(x, &phys));
        t.check(&[block(10, 12)], &[], &phys).unwrap();
        // Now the first place conflicts: its memory is in use through the alias.
        assert!(t.has_conflict(here, &phys, |_| true));
        let back = take(&mut t, &mut phys, here);
        assert!(back.conflict && back.all_mapped);
        t.unacquire(here);
        t.check(&[block(10, 12)], &[], &phys).unwrap();
    }

    #[test]
    fn a_span_over_two_mappings_of_one_extent_conflicts_as_acquire_finds() {
        let (mut t, mut phys) = table();
        // One extent of 3 pages, owned at 0..=2 (idle), an alias at 10..=12.
        aliased(&mut t, &mut phys, sp(0, 2), 10, 0b1);
        // Each page alone could be taken, but a block over both mappings
        // would hold each physical page twice.
        let both = sp(0, 12);
        assert!(t.has_conflict(both, &phys, |_| true));
        let got = take(&mut t, &mut phys, both);
        assert!(got.conflict, "acquire refuses it too");
        t.unacquire(both);
        t.check(&[], &[], &phys).unwrap();
        // Over parts of both mappings with no physical page twice: no
        // conflict, for either.
        let apart = sp(2, 10);
        assert!(!t.has_conflict(apart, &phys, |_| true));
        let got = take(&mut t, &mut phys, apart);
        assert!(!got.conflict && !got.all_mapped);
        t.unacquire(apart);
        // Frees the taking stream cannot follow conflict, as in `acquire`.
        assert!(t.has_conflict(sp(10, 12), &phys, |_| false));
        assert!(!t.has_conflict(sp(10, 12), &phys, |_| true));
    }

    #[test]
    fn frees_not_known_done_keep_the_memory_where_it_is() {
        let (mut t, mut phys) = table();
        let (here, there) = (sp(0, 1), sp(20, 21));
        aliased(&mut t, &mut phys, here, 20, 0b10);
        let asked = Cell::new(0);
        let got = t.acquire(there, &mut phys, |frees| {
            asked.set(asked.get() + 1);
            assert_eq!(frees().mask, 0b10);
            false
        });
        assert!(got.conflict);
        assert_eq!(asked.get(), 1, "asked once for the extent");
        assert!(t.owns(pg(0)) && !t.owns(pg(20)), "nothing moved");
        t.unacquire(there);
        t.check(&[], &[], &phys).unwrap();
    }

    #[test]
    fn reclaimable_runs_are_the_idle_pages_whose_frees_are_done() {
        let (mut t, mut phys) = table();
        map(&mut t, &mut phys, 0, 3);
        map(&mut t, &mut phys, 3, 2);
        map(&mut t, &mut phys, 100, 1);
        take(&mut t, &mut phys, sp(3, 4));
        let mut streams = FreeStreams::default();
        let runs = t.reclaimable_runs(&mut streams, &phys);
        assert_eq!(runs, vec![(pg(0), 3), (pg(100), 1)]);
    }

    #[test]
    fn check_names_each_broken_invariant() {
        let (mut t, mut phys) = table();
        map(&mut t, &mut phys, 0, 4);
        let s = sp(0, 1);
        take(&mut t, &mut phys, s);
        let live = [block(0, 1)];
        t.check(&live, &[], &phys).unwrap();
        let expect = |t: &PageTable, phys: &PhysCache, n: &str| {
            let err = t.check(&live, &[], phys).unwrap_err();
            assert!(err.starts_with(&format!("invariant {n}:")), "{err}");
        };
        // 3: a boundary count off by one.
        t.reservations[0].page_mut(0).users += 1;
        expect(&t, &phys, "3");
        t.reservations[0].page_mut(0).users -= 1;
        // 3: a busy bit missing.
        t.reservations[0].bits_mut(BUSY)[0] &= !0b10;
        expect(&t, &phys, "3");
        t.reservations[0].bits_mut(BUSY)[0] |= 0b10;
        // 4: a busy page that does not own its memory.
        t.reservations[0].bits_mut(OWNS)[0] &= !0b1;
        expect(&t, &phys, "4");
        t.reservations[0].bits_mut(OWNS)[0] |= 0b1;
        // 5: an idle page with the owns bit its physical page does not give.
        t.reservations[0].bits_mut(OWNS)[0] |= 0b1000;
        expect(&t, &phys, "5");
        t.reservations[0].bits_mut(OWNS)[0] &= !0b1000;
        // 6: a mapped bit without a mapping, and a wrong count.
        t.reservations[0].bits_mut(MAPPED)[0] |= 0b1_0000;
        expect(&t, &phys, "6");
        t.reservations[0].bits_mut(MAPPED)[0] &= !0b1_0000;
        t.mapped_pages += 1;
        expect(&t, &phys, "6");
        t.mapped_pages -= 1;
        t.check(&live, &[], &phys).unwrap();
    }
}
