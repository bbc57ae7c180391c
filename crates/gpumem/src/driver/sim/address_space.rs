//! A fake address allocator: hands out non-overlapping ranges of a numeric
//! address range without touching any memory.
//!
//! Free ranges are kept twice: by start address (to coalesce neighbours on
//! free) and by (length, start) (to find the best fit). Allocation and free are
//! O(log n) in the number of free ranges; an allocation whose alignment exceeds
//! the base alignment first looks for a range long enough to fit at any
//! alignment (O(log n)) and only then scans the candidates (O(n) worst case,
//! only for large-aligned VMM reservations that do not fit otherwise).

use std::collections::{BTreeMap, BTreeSet};

/// Base alignment of every range: 256 bytes, like `cuMemAlloc`.
pub(super) const BASE_ALIGN: u64 = 256;

/// Rounds `x` up to a multiple of `align` (a power of two); `None` on overflow.
pub(super) fn round_up(x: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(x.checked_add(align - 1)? & !(align - 1))
}

/// Non-overlapping ranges of `[base, base + len)`.
#[derive(Debug)]
pub(super) struct AddressSpace {
    by_addr: BTreeMap<u64, u64>,
    by_size: BTreeSet<(u64, u64)>,
    base: u64,
    len: u64,
    used: u64,
}

impl AddressSpace {
    /// All of `[base, base + len)` free; `base` and `len` multiples of 256.
    pub(super) fn new(base: u64, len: u64) -> Self {
        let mut s = Self {
            by_addr: BTreeMap::new(),
            by_size: BTreeSet::new(),
            base,
            len,
            used: 0,
        };
        if len > 0 {
            s.insert_free(base, len);
        }
        s
    }

    fn insert_free(&mut self, start: u64, len: u64) {
        self.by_addr.insert(start, len);
        self.by_size.insert((len, start));
    }

    fn remove_free(&mut self, start: u64, len: u64) {
        self.by_addr.remove(&start);
        self.by_size.remove(&(len, start));
    }

    /// A range of `size` bytes (a multiple of 256, non-zero) aligned to `align`
    /// (a power of two); `None` when no free range fits.
    pub(super) fn alloc(&mut self, size: u64, align: u64) -> Option<u64> {
        if size == 0 || !size.is_multiple_of(BASE_ALIGN) || !align.is_power_of_two() {
            return None;
        }
        let align = align.max(BASE_ALIGN);
        let (flen, fstart) = if align == BASE_ALIGN {
            *self.by_size.range((size, 0)..).next()?
        } else {
            // A range of size + align - 256 fits at any alignment.
            let sure = size.checked_add(align - BASE_ALIGN);
            match sure.and_then(|s| self.by_size.range((s, 0)..).next().copied()) {
                Some(r) => r,
                None => *self.by_size.range((size, 0)..).find(|&&(l, s)| {
                    round_up(s, align)
                        .and_then(|a| a.checked_add(size))
                        .is_some_and(|end| end <= s + l)
                })?,
            }
        };
        let start = round_up(fstart, align)?;
        let end = start.checked_add(size)?;
        let fend = fstart + flen;
        if end > fend {
            return None;
        }
        self.remove_free(fstart, flen);
        if start > fstart {
            self.insert_free(fstart, start - fstart);
        }
        if fend > end {
            self.insert_free(end, fend - end);
        }
        self.used += size;
        Some(start)
    }

    /// Returns `[start, start + size)`, which must have come from
    /// [`AddressSpace::alloc`] with the same size, coalescing with free neighbours.
    pub(super) fn free(&mut self, start: u64, size: u64) {
        debug_assert!(start >= self.base && start - self.base + size <= self.len);
        let mut s = start;
        let mut l = size;
        if let Some((&ps, &pl)) = self.by_addr.range(..start).next_back() {
            if ps + pl == start {
                self.remove_free(ps, pl);
                s = ps;
                l += pl;
            }
        }
        if let Some(&nl) = self.by_addr.get(&(start + size)) {
            self.remove_free(start + size, nl);
            l += nl;
        }
        self.insert_free(s, l);
        self.used -= size;
    }

    /// Bytes handed out and not returned.
    #[cfg(test)]
    pub(super) fn used(&self) -> u64 {
        self.used
    }

    /// Whether `addr` lies inside this space.
    #[cfg(test)]
    pub(super) fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr - self.base < self.len
    }

    /// Number of free ranges (fragmentation).
    #[cfg(test)]
    pub(super) fn free_ranges(&self) -> usize {
        self.by_addr.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reuses_and_coalesces() {
        let mut s = AddressSpace::new(1 << 40, 1 << 20);
        let a = s.alloc(256, 256).unwrap();
        let b = s.alloc(512, 256).unwrap();
        let c = s.alloc(256, 256).unwrap();
        assert_eq!(b, a + 256);
        assert_eq!(c, b + 512);
        s.free(b, 512);
        assert_eq!(s.alloc(512, 256), Some(b), "freed range is reused");
        s.free(a, 256);
        s.free(b, 512);
        s.free(c, 256);
        assert_eq!(s.free_ranges(), 1);
        assert_eq!(s.used(), 0);
        assert_eq!(s.alloc(1 << 20, 256), Some(1 << 40));
        assert_eq!(s.alloc(256, 256), None);
    }

    #[test]
    fn large_alignment() {
        let mut s = AddressSpace::new(1 << 40, 64 << 20);
        let _ = s.alloc(256, 256).unwrap();
        let a = s.alloc(2 << 20, 4 << 20).unwrap();
        assert_eq!(a % (4 << 20), 0);
        // Exact-fit scan: a space just big enough only at one aligned offset.
        let mut t = AddressSpace::new((1 << 40) + (2 << 20), 4 << 20);
        assert_eq!(t.alloc(2 << 20, 4 << 20), Some((1 << 40) + (4 << 20)));
    }

    #[test]
    fn bad_requests_fail() {
        let mut s = AddressSpace::new(1 << 40, 1 << 20);
        assert_eq!(s.alloc(0, 256), None);
        assert_eq!(s.alloc(100, 256), None);
        assert_eq!(s.alloc(!255u64, 256), None);
        assert_eq!(s.alloc(256, 3), None);
        assert_eq!(s.alloc(256, 1 << 63), None);
    }

    proptest! {
        #[test]
        fn random_alloc_free_matches_model(ops in proptest::collection::vec((any::<bool>(), 1u64..64, 0usize..64, 0u32..3), 1..300)) {
            let base = 1u64 << 40;
            let cap = 1u64 << 16;
            let mut s = AddressSpace::new(base, cap);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (alloc, units, pick, align_shift) in ops {
                if alloc || live.is_empty() {
                    let size = units * 256;
                    let align = 256u64 << (align_shift * 2);
                    match s.alloc(size, align) {
                        Some(a) => {
                            prop_assert_eq!(a % align, 0);
                            prop_assert!(s.contains(a) && s.contains(a + size - 1));
                            for &(b, l) in &live {
                                prop_assert!(a + size <= b || b + l <= a, "overlap");
                            }
                            live.push((a, size));
                        }
                        None => {
                            // Model: no gap of the aligned size exists.
                            let mut v = live.clone();
                            v.sort();
                            let mut cur = base;
                            let mut fits = false;
                            for &(b, l) in v.iter().chain(std::iter::once(&(base + cap, 0))) {
                                let st = round_up(cur, align).unwrap();
                                if st + size <= b { fits = true; }
                                cur = b + l;
                            }
                            prop_assert!(!fits, "a fitting gap existed");
                        }
                    }
                } else {
                    let (a, l) = live.swap_remove(pick % live.len());
                    s.free(a, l);
                }
                prop_assert_eq!(s.used(), live.iter().map(|x| x.1).sum::<u64>());
            }
            for (a, l) in live.drain(..) { s.free(a, l); }
            prop_assert_eq!(s.free_ranges(), 1);
        }
    }
}
