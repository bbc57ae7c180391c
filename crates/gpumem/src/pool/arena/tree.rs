//! `MaxTree`: a segment tree of maxima over a fixed number of slots, the O(log n)
//! engine behind address-ordered first fit.
//!
//! Slot `i` holds the length of the free block that starts at unit `i` (0 where
//! no free block starts). The leftmost slot whose value is at least `k` is the
//! lowest-addressed free block that fits `k` units: first fit by address in
//! O(log n), found by descending from the root. The rightmost non-zero slot
//! before `i` is the free block just below `i`, which freeing uses to coalesce.

/// Values a [`MaxTree`] stores: small unsigned integers.
pub trait TreeValue: Copy + Ord + Default {
    /// Converts from `u32`, saturating (callers keep values in range).
    fn from_u32(v: u32) -> Self;
    /// Converts to `u32`.
    fn to_u32(self) -> u32;
}

impl TreeValue for u16 {
    #[inline]
    fn from_u32(v: u32) -> Self {
        v.min(u16::MAX as u32) as u16
    }
    #[inline]
    fn to_u32(self) -> u32 {
        self as u32
    }
}

impl TreeValue for u32 {
    #[inline]
    fn from_u32(v: u32) -> Self {
        v
    }
    #[inline]
    fn to_u32(self) -> u32 {
        self
    }
}

/// A segment tree of maxima over `len` slots (see the module documentation).
#[derive(Debug, Clone)]
pub(crate) struct MaxTree<T: TreeValue> {
    /// Leaves start at `cap`; node `j` has children `2j` and `2j + 1`.
    nodes: Box<[T]>,
    cap: usize,
    len: usize,
}

impl<T: TreeValue> MaxTree<T> {
    /// A tree of `len` slots, all zero.
    pub(crate) fn new(len: usize) -> Self {
        let cap = len.max(1).next_power_of_two();
        Self {
            nodes: vec![T::default(); 2 * cap].into_boxed_slice(),
            cap,
            len,
        }
    }

    /// Number of slots.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The value of slot `i`.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> u32 {
        self.nodes[self.cap + i].to_u32()
    }

    /// The largest value of any slot.
    #[inline]
    pub(crate) fn max(&self) -> u32 {
        self.nodes[1].to_u32()
    }

    /// Sets slot `i` to `v`.
    #[inline]
    pub(crate) fn set(&mut self, i: usize, v: u32) {
        let mut j = self.cap + i;
        self.nodes[j] = T::from_u32(v);
        while j > 1 {
            j >>= 1;
            let m = self.nodes[2 * j].max(self.nodes[2 * j + 1]);
            if self.nodes[j] == m {
                break;
            }
            self.nodes[j] = m;
        }
    }

    /// Sets slots `i` and `j` (`i != j`) and updates their ancestors once.
    #[inline]
    pub(crate) fn set_two(&mut self, i: usize, vi: u32, j: usize, vj: u32) {
        let (mut a, mut b) = (self.cap + i, self.cap + j);
        self.nodes[a] = T::from_u32(vi);
        self.nodes[b] = T::from_u32(vj);
        while a != b {
            a >>= 1;
            b >>= 1;
            self.nodes[a] = self.nodes[2 * a].max(self.nodes[2 * a + 1]);
            self.nodes[b] = self.nodes[2 * b].max(self.nodes[2 * b + 1]);
        }
        while a > 1 {
            a >>= 1;
            let m = self.nodes[2 * a].max(self.nodes[2 * a + 1]);
            if self.nodes[a] == m {
                break;
            }
            self.nodes[a] = m;
        }
    }

    /// The leftmost slot whose value is at least `k` (`k >= 1`).
    #[inline]
    pub(crate) fn first_at_least(&self, k: u32) -> Option<usize> {
        let k = T::from_u32(k);
        if self.nodes[1] < k {
            return None;
        }
        let mut j = 1;
        while j < self.cap {
            j = if self.nodes[2 * j] >= k {
                2 * j
            } else {
                2 * j + 1
            };
        }
        Some(j - self.cap)
    }

    /// The rightmost slot below `i` whose value is non-zero.
    #[inline]
    pub(crate) fn last_nonzero_before(&self, i: usize) -> Option<usize> {
        let zero = T::default();
        let mut j = self.cap + i;
        while j > 1 {
            if j & 1 == 1 && self.nodes[j - 1] > zero {
                let mut n = j - 1;
                while n < self.cap {
                    n = if self.nodes[2 * n + 1] > zero {
                        2 * n + 1
                    } else {
                        2 * n
                    };
                }
                return Some(n - self.cap);
            }
            j >>= 1;
        }
        None
    }

    /// Takes `k` units from the lowest-addressed free block that fits, splitting
    /// it; returns the first unit.
    #[inline]
    pub(crate) fn take_first_fit(&mut self, k: u32) -> Option<usize> {
        let s = self.first_at_least(k)?;
        let len = self.get(s);
        if len > k {
            self.set_two(s, 0, s + k as usize, len - k);
        } else {
            self.set(s, 0);
        }
        Some(s)
    }

    /// Returns `[start, start + k)` as free, coalescing with free neighbours.
    /// The range must not overlap a free block (callers check).
    #[inline]
    pub(crate) fn give_back(&mut self, start: usize, k: u32) {
        let mut s = start;
        let mut len = k;
        let end = start + k as usize;
        let mut right_start = None;
        if end < self.len {
            let right = self.get(end);
            if right > 0 {
                len += right;
                right_start = Some(end);
            }
        }
        if let Some(p) = self.last_nonzero_before(start) {
            let plen = self.get(p);
            if p + plen as usize == start {
                s = p;
                len += plen;
            }
        }
        match right_start {
            Some(r) => self.set_two(r, 0, s, len),
            None => self.set(s, len),
        }
    }

    /// True when `[start, start + k)` overlaps no free block.
    pub(crate) fn is_allocated(&self, start: usize, k: u32) -> bool {
        let end = start + k as usize;
        if start >= self.len || end > self.len {
            return false;
        }
        // A free block starting inside the range?
        if let Some(p) = self.last_nonzero_before(end) {
            let plen = self.get(p) as usize;
            if p + plen > start {
                return false;
            }
        }
        true
    }

    /// Iterates the free blocks as `(start, len)` in address order (O(n); for
    /// reports and checks only).
    pub(crate) fn free_blocks(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        (0..self.len)
            .map(|i| (i, self.get(i)))
            .filter(|&(_, v)| v > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_by_address_and_coalescing() {
        let mut t: MaxTree<u16> = MaxTree::new(16);
        t.set(0, 16);
        let a = t.take_first_fit(4).unwrap();
        let b = t.take_first_fit(4).unwrap();
        let c = t.take_first_fit(4).unwrap();
        assert_eq!((a, b, c), (0, 4, 8));
        t.give_back(0, 4);
        t.give_back(8, 4);
        // first fit takes the lowest address
        assert_eq!(t.take_first_fit(2), Some(0));
        assert_eq!(t.take_first_fit(3), Some(8), "2..4 is too small");
        t.give_back(0, 2);
        t.give_back(8, 3);
        t.give_back(4, 4);
        assert_eq!(
            t.get(0),
            16,
            "all coalesced: {:?}",
            t.free_blocks().collect::<Vec<_>>()
        );
        assert_eq!(t.max(), 16);
    }

    #[test]
    fn non_power_of_two_length() {
        let mut t: MaxTree<u32> = MaxTree::new(5);
        t.set(0, 5);
        assert_eq!(t.take_first_fit(5), Some(0));
        assert!(t.is_allocated(0, 5));
        assert_eq!(t.take_first_fit(1), None);
        t.give_back(2, 1);
        assert!(!t.is_allocated(0, 5));
        assert!(t.is_allocated(3, 2));
        t.give_back(0, 2);
        t.give_back(3, 2);
        assert_eq!(t.free_blocks().collect::<Vec<_>>(), vec![(0, 5)]);
    }
}
