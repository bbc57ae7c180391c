//! `Tlsf`: a two-level segregated-fit index over free blocks.
//!
//! Algorithm: one doubly linked free list per size class (see
//! [`size_class`](super::size_class)), threaded through the blocks' free-list
//! links in a shared [`BlockArena`], plus a first-level bitmap (which first
//! levels have any non-empty class) and one second-level bitmap per first level.
//! `insert` and `remove` are O(1) (link or unlink, set or clear two bits). `find`
//! is O(1): it rounds the request up to the class whose every block fits, takes
//! the head of that class or of the next non-empty class found by two
//! trailing-zero counts ("good fit"). Only when that fails does it scan at most
//! [`FALLBACK_SCAN`] blocks of the request's own (rounded-down) class, where
//! some blocks may still fit. `largest` scans the top non-empty class.

use super::block_arena::{BlockArena, NIL};
use super::size_class::{insert_class, search_class, SizeClass, CLASS_COUNT, FL_COUNT, SL_COUNT};

/// Blocks of the request's own class examined when the O(1) search fails.
pub const FALLBACK_SCAN: usize = 32;

/// A free-block index for one lane. Blocks live in a [`BlockArena`] shared by
/// all indexes; the index only owns list heads, bitmaps and counters.
#[derive(Debug, Clone)]
pub struct Tlsf {
    fl_bitmap: u64,
    sl_bitmap: [u32; FL_COUNT],
    heads: Box<[u32; CLASS_COUNT]>,
    free_bytes: u64,
    blocks: u64,
}

impl Default for Tlsf {
    fn default() -> Self {
        Self::new()
    }
}

impl Tlsf {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            fl_bitmap: 0,
            sl_bitmap: [0; FL_COUNT],
            heads: Box::new([NIL; CLASS_COUNT]),
            free_bytes: 0,
            blocks: 0,
        }
    }

    /// Total bytes of the blocks in the index.
    #[inline]
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Number of blocks in the index.
    #[inline]
    pub fn block_count(&self) -> u64 {
        self.blocks
    }

    /// True when the index holds no block.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.blocks == 0
    }

    /// Files block `i` (whose size is set) at the head of its class list.
    /// Does not touch the block's state; the caller sets it.
    #[inline(always)]
    pub fn insert(&mut self, arena: &mut BlockArena, i: u32) {
        let size = arena[i].size;
        let c = insert_class(size);
        let ci = c.index();
        let head = self.heads[ci];
        {
            let b = &mut arena[i];
            b.prev_free = NIL;
            b.next_free = head;
        }
        if head != NIL {
            arena[head].prev_free = i;
        }
        self.heads[ci] = i;
        self.fl_bitmap |= 1 << c.fl;
        self.sl_bitmap[c.fl as usize] |= 1 << c.sl;
        self.free_bytes += size;
        self.blocks += 1;
    }

    /// Unlinks block `i`, which must be in this index with its filed size.
    #[inline(always)]
    pub fn remove(&mut self, arena: &mut BlockArena, i: u32) {
        let (size, prev, next) = {
            let b = &arena[i];
            (b.size, b.prev_free, b.next_free)
        };
        if next != NIL {
            arena[next].prev_free = prev;
        }
        if prev != NIL {
            arena[prev].next_free = next;
        } else {
            let c = insert_class(size);
            let ci = c.index();
            debug_assert_eq!(self.heads[ci], i);
            self.heads[ci] = next;
            if next == NIL {
                let sl = &mut self.sl_bitmap[c.fl as usize];
                *sl &= !(1 << c.sl);
                if *sl == 0 {
                    self.fl_bitmap &= !(1 << c.fl);
                }
            }
        }
        self.free_bytes -= size;
        self.blocks -= 1;
    }

    /// The first non-empty class at or above `c`.
    #[inline(always)]
    fn first_at_or_above(&self, c: SizeClass) -> Option<usize> {
        let sl_map = self.sl_bitmap[c.fl as usize] & (u32::MAX << c.sl);
        if sl_map != 0 {
            return Some(c.fl as usize * SL_COUNT + sl_map.trailing_zeros() as usize);
        }
        let fl_map = self.fl_bitmap & (u64::MAX.checked_shl(c.fl + 1).unwrap_or(0));
        if fl_map == 0 {
            return None;
        }
        let fl = fl_map.trailing_zeros() as usize;
        Some(fl * SL_COUNT + self.sl_bitmap[fl].trailing_zeros() as usize)
    }

    /// A block of at least `size` bytes (a non-zero multiple of 256), without
    /// removing it: the head of the smallest non-empty class whose every block
    /// fits, else the first fitting block among the first [`FALLBACK_SCAN`]
    /// blocks of `size`'s own class. `None` when neither has one.
    #[inline]
    pub fn find(&self, arena: &BlockArena, size: u64) -> Option<u32> {
        if let Some(c) = search_class(size) {
            if let Some(ci) = self.first_at_or_above(c) {
                return Some(self.heads[ci]);
            }
        }
        self.find_slow(arena, size)
    }

    /// Like [`find`](Self::find), but also removes the block from the index.
    #[inline(always)]
    pub fn take(&mut self, arena: &mut BlockArena, size: u64) -> Option<u32> {
        if let Some(i) = self.take_head(arena, size) {
            return Some(i);
        }
        let i = self.find_slow(arena, size)?;
        self.remove(arena, i);
        Some(i)
    }

    /// [`take`](Self::take)'s O(1) part: the head of the smallest non-empty
    /// class whose every block fits, removed.
    #[inline(always)]
    fn take_head(&mut self, arena: &mut BlockArena, size: u64) -> Option<u32> {
        if let Some(c) = search_class(size) {
            if let Some(ci) = self.first_at_or_above(c) {
                // Pop the head of class `ci`: no class computation needed.
                let i = self.heads[ci];
                let (bsize, next) = (arena[i].size, arena[i].next_free);
                self.heads[ci] = next;
                if next != NIL {
                    arena[next].prev_free = NIL;
                } else {
                    let (fl, sl) = (ci / SL_COUNT, ci % SL_COUNT);
                    let m = &mut self.sl_bitmap[fl];
                    *m &= !(1 << sl);
                    if *m == 0 {
                        self.fl_bitmap &= !(1 << fl);
                    }
                }
                self.free_bytes -= bsize;
                self.blocks -= 1;
                return Some(i);
            }
        }
        None
    }

    /// Like [`take`](Self::take), but first looks among the first
    /// [`FALLBACK_SCAN`] blocks of `size`'s own class for one that fits, so a
    /// freed block is reused by a request of its own size before a larger
    /// block is split (closer to best fit; keeps a pool's footprint compact
    /// when one huge free block would otherwise absorb every miss).
    #[inline]
    pub fn take_best(&mut self, arena: &mut BlockArena, size: u64) -> Option<u32> {
        if let Some(i) = self.find_slow(arena, size) {
            self.remove(arena, i);
            return Some(i);
        }
        self.take(arena, size)
    }

    /// Block `spared`, just taken by [`take_best`](Self::take_best) for
    /// `size` bytes, is to be used only when no other block fits: takes the
    /// block that search finds without it and files `spared` back, or
    /// returns `spared` when there is none. A heap spares the free end of a
    /// range that grows in place, so that end is split only for requests
    /// that no hole fits.
    #[inline(never)]
    pub fn take_best_instead(&mut self, arena: &mut BlockArena, spared: u32, size: u64) -> u32 {
        // The search goes on where it found `spared`. In the request's own
        // class, the scan found it first: the blocks before it do not fit,
        // and it unlinked nothing else, so its old link leads on. From a
        // class that fits whole, the scan had found nothing.
        let in_scan = insert_class(arena[spared].size) == insert_class(size);
        let scanned = in_scan
            .then(|| self.scan(arena, arena[spared].next_free, size))
            .flatten();
        let other = match scanned {
            Some(i) => {
                self.remove(arena, i);
                Some(i)
            }
            None => self.take_head(arena, size),
        };
        match other {
            Some(i) => {
                self.insert(arena, spared);
                i
            }
            None => spared,
        }
    }

    #[cold]
    fn find_slow(&self, arena: &BlockArena, size: u64) -> Option<u32> {
        self.scan(arena, self.heads[insert_class(size).index()], size)
    }

    /// The first block of at least `size` bytes among at most
    /// [`FALLBACK_SCAN`] of a free list, from its block `first` on.
    #[inline(always)]
    fn scan(&self, arena: &BlockArena, first: u32, size: u64) -> Option<u32> {
        let mut i = first;
        let mut n = 0;
        while i != NIL && n < FALLBACK_SCAN {
            if arena[i].size >= size {
                return Some(i);
            }
            i = arena[i].next_free;
            n += 1;
        }
        None
    }

    /// Some block of the index (the head of its lowest non-empty class).
    #[inline]
    pub fn any_block(&self) -> Option<u32> {
        if self.fl_bitmap == 0 {
            return None;
        }
        let fl = self.fl_bitmap.trailing_zeros() as usize;
        Some(self.heads[fl * SL_COUNT + self.sl_bitmap[fl].trailing_zeros() as usize])
    }

    /// Size of the largest block, 0 when empty. Scans the top non-empty class.
    pub fn largest(&self, arena: &BlockArena) -> u64 {
        if self.fl_bitmap == 0 {
            return 0;
        }
        let fl = 63 - self.fl_bitmap.leading_zeros() as usize;
        let sl = 31 - self.sl_bitmap[fl].leading_zeros() as usize;
        let mut i = self.heads[fl * SL_COUNT + sl];
        let mut best = 0;
        while i != NIL {
            best = best.max(arena[i].size);
            i = arena[i].next_free;
        }
        best
    }

    /// Calls `f` on every block index in the index (class by class).
    pub fn for_each(&self, arena: &BlockArena, mut f: impl FnMut(u32)) {
        for &h in self.heads.iter() {
            let mut i = h;
            while i != NIL {
                f(i);
                i = arena[i].next_free;
            }
        }
    }

    /// Calls `f` on blocks of at least `size` bytes (a non-zero multiple of
    /// 256), smallest classes first, until `f` returns false.
    pub fn for_each_at_least(&self, arena: &BlockArena, size: u64, mut f: impl FnMut(u32) -> bool) {
        let first = insert_class(size).index();
        let (fl0, sl0) = (first / SL_COUNT, first % SL_COUNT);
        // Only the non-empty classes, through the bitmaps.
        let mut fls = self.fl_bitmap & (u64::MAX << fl0);
        while fls != 0 {
            let fl = fls.trailing_zeros() as usize;
            fls &= fls - 1;
            let mut sls = self.sl_bitmap[fl];
            if fl == fl0 {
                sls &= u32::MAX << sl0;
            }
            while sls != 0 {
                let sl = sls.trailing_zeros() as usize;
                sls &= sls - 1;
                let mut i = self.heads[fl * SL_COUNT + sl];
                while i != NIL {
                    if arena[i].size >= size && !f(i) {
                        return;
                    }
                    i = arena[i].next_free;
                }
            }
        }
    }

    /// Checks bitmaps, list links, classes and counters against the arena;
    /// describes the first inconsistency. O(classes + blocks).
    pub fn check(&self, arena: &BlockArena) -> Result<(), String> {
        let (mut bytes, mut count) = (0u64, 0u64);
        for ci in 0..CLASS_COUNT {
            let (fl, sl) = (ci / SL_COUNT, ci % SL_COUNT);
            let bit = self.sl_bitmap[fl] >> sl & 1 == 1;
            let mut i = self.heads[ci];
            if bit != (i != NIL) {
                return Err(format!("class {ci}: bitmap bit {bit} but head {i}"));
            }
            let mut prev = NIL;
            while i != NIL {
                let b = arena
                    .get(i)
                    .ok_or_else(|| format!("class {ci}: bad index {i}"))?;
                if b.prev_free != prev {
                    return Err(format!("block {i}: prev_free {} != {prev}", b.prev_free));
                }
                if insert_class(b.size).index() != ci {
                    return Err(format!("block {i} of {} bytes in class {ci}", b.size));
                }
                bytes += b.size;
                count += 1;
                if count > arena.capacity() as u64 {
                    return Err(format!("class {ci}: cycle"));
                }
                prev = i;
                i = b.next_free;
            }
        }
        for fl in 0..FL_COUNT {
            if (self.fl_bitmap >> fl & 1 == 1) != (self.sl_bitmap[fl] != 0) {
                return Err(format!("first level {fl}: bitmap mismatch"));
            }
        }
        if bytes != self.free_bytes || count != self.blocks {
            return Err(format!(
                "counters {} B / {} blocks, lists {bytes} B / {count} blocks",
                self.free_bytes, self.blocks
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn find_takes_a_fitting_class_or_none() {
        let mut a = BlockArena::new();
        let mut t = Tlsf::new();
        let sizes = [256u64, 4096, 1 << 20, (1 << 20) + 256 * 5];
        let ids: Vec<u32> = sizes
            .iter()
            .enumerate()
            .map(|(k, &s)| a.create(k as u64 * (1 << 24), s, 0).unwrap())
            .collect();
        for &i in &ids {
            t.insert(&mut a, i);
        }
        t.check(&a).unwrap();
        assert_eq!(t.block_count(), 4);
        assert_eq!(t.free_bytes(), sizes.iter().sum::<u64>());
        assert_eq!(t.find(&a, 256), Some(ids[0]));
        assert_eq!(t.find(&a, 512), Some(ids[1]));
        // Lists are LIFO: the last block filed in the 1 MiB class comes first.
        assert_eq!(t.find(&a, 1 << 20), Some(ids[3]));
        // Same class as 1 MiB + 1280, above the O(1) search: found by the scan.
        assert_eq!(t.find(&a, (1 << 20) + 512), Some(ids[3]));
        assert_eq!(t.find(&a, (1 << 20) + 256 * 6), None);
        assert_eq!(t.largest(&a), (1 << 20) + 256 * 5);
        t.remove(&mut a, ids[1]);
        t.check(&a).unwrap();
        assert_eq!(t.find(&a, 512), Some(ids[3]));
        for &i in &[ids[0], ids[2], ids[3]] {
            t.remove(&mut a, i);
        }
        t.check(&a).unwrap();
        assert!(t.is_empty());
        assert_eq!(t.any_block(), None);
        assert_eq!(t.largest(&a), 0);
    }

    #[test]
    fn a_spared_block_goes_only_when_nothing_else_fits() {
        const MIB: u64 = 1 << 20;
        let mut a = BlockArena::new();
        let mut t = Tlsf::new();
        let file = |t: &mut Tlsf, a: &mut BlockArena, k: u64, size: u64| {
            let i = a.create(k << 32, size, 0).unwrap();
            t.insert(a, i);
            i
        };
        // The request's own class (1 MiB up to 1.125 MiB): a block too
        // small, then the spared one, then one that fits, scanned in that
        // order (lists are LIFO).
        let fits = file(&mut t, &mut a, 0, MIB + 6 * 256);
        let spared = file(&mut t, &mut a, 1, MIB + 8 * 256);
        file(&mut t, &mut a, 2, MIB);
        let above = file(&mut t, &mut a, 3, 4 * MIB);
        let size = MIB + 4 * 256;
        assert_eq!(t.take_best(&mut a, size), Some(spared));
        assert_eq!(t.take_best_instead(&mut a, spared, size), fits);
        t.check(&a).unwrap();
        // The spared block is filed again: the next search finds it first.
        assert_eq!(t.take_best(&mut a, size), Some(spared));
        // Nothing else in its class fits: a class that fits whole.
        assert_eq!(t.take_best_instead(&mut a, spared, size), above);
        t.check(&a).unwrap();
        // Nothing else fits at all: the spared block itself, not filed.
        assert_eq!(t.take_best(&mut a, size), Some(spared));
        assert_eq!(t.take_best_instead(&mut a, spared, size), spared);
        t.check(&a).unwrap();
        assert_eq!(t.block_count(), 1);
        // Spared from a class that fits whole: the next such class.
        let big = file(&mut t, &mut a, 4, 8 * MIB);
        let bigger = file(&mut t, &mut a, 5, 32 * MIB);
        assert_eq!(t.take_best(&mut a, 2 * MIB), Some(big));
        assert_eq!(t.take_best_instead(&mut a, big, 2 * MIB), bigger);
        t.check(&a).unwrap();
        assert_eq!(t.block_count(), 2);
    }
}
