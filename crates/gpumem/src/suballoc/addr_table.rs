//! `AddrTable`: a map from block addresses (multiples of 256) to block indices.
//!
//! Algorithm: open addressing with linear probing over one array of
//! `(key, value)` slots, Fibonacci hashing of `addr >> 8` (top bits of a
//! multiply), and backward-shift deletion (no tombstones, so probe lengths
//! never decay). The load is kept at most 1/8 while the array is small
//! enough to stay in a core's cache ([`SPARSE_SLOTS`]) and at most 1/2
//! beyond: a probe that ends at its first slot almost always makes the
//! probe loops' exits predictable, and on sizes that change from one
//! request to the next those exits were the pool's most mispredicted
//! branches. Costs: O(1) expected insert, lookup and remove, one multiply
//! and usually one cache line; growth doubles the array (amortised O(1)).

/// Key of an empty slot: never a valid address (not a multiple of 256).
const EMPTY: u64 = u64::MAX;
const K: u64 = 0x9E37_79B9_7F4A_7C15;
const MIN_BITS: u32 = 4;
/// Slots up to which the load stays at most 1/8 (1 MiB of slots); larger
/// arrays keep it at most 1/2, where memory counts more than the probes.
pub const SPARSE_SLOTS: usize = 1 << 16;

/// A hash map from `u64` addresses (multiples of 256) to `u32` block indices.
#[derive(Debug, Clone)]
pub struct AddrTable {
    slots: Vec<(u64, u32)>,
    shift: u32,
    mask: usize,
    len: usize,
}

impl Default for AddrTable {
    fn default() -> Self {
        Self::new()
    }
}

impl AddrTable {
    /// An empty table with 16 slots.
    pub fn new() -> Self {
        Self::with_bits(MIN_BITS)
    }

    fn with_bits(bits: u32) -> Self {
        Self {
            slots: vec![(EMPTY, 0); 1 << bits],
            shift: 64 - bits,
            mask: (1 << bits) - 1,
            len: 0,
        }
    }

    /// Number of entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the table holds no entry.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when one more entry would take the load past its bound (see
    /// the module documentation).
    #[inline]
    fn full_after_one_more(&self) -> bool {
        let (entries, slots) = (self.len + 1, self.slots.len());
        let per_entry = if slots <= SPARSE_SLOTS { 8 } else { 2 };
        entries * per_entry > slots
    }

    #[inline]
    fn home(&self, key: u64) -> usize {
        ((key >> 8).wrapping_mul(K) >> self.shift) as usize
    }

    /// Inserts `key → val`. `key` must be a multiple of 256 not already in the
    /// table (checked in debug builds only).
    #[inline]
    pub fn insert(&mut self, key: u64, val: u32) {
        debug_assert!(key.is_multiple_of(256) && self.get(key).is_none());
        if self.full_after_one_more() {
            self.grow();
        }
        let mut i = self.home(key);
        loop {
            let s = &mut self.slots[i];
            if s.0 == EMPTY {
                *s = (key, val);
                self.len += 1;
                return;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// The value of `key`, if present.
    #[inline]
    pub fn get(&self, key: u64) -> Option<u32> {
        let mut i = self.home(key);
        loop {
            let s = self.slots[i];
            if s.0 == key {
                return Some(s.1);
            }
            if s.0 == EMPTY {
                return None;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Removes `key` and returns its value, if present.
    #[inline(always)]
    pub fn remove(&mut self, key: u64) -> Option<u32> {
        if key == EMPTY {
            return None;
        }
        let mask = self.mask;
        let mut i = self.home(key);
        let val = loop {
            let s = self.slots[i];
            if s.0 == key {
                break s.1;
            }
            if s.0 == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        };
        // Backward shift: pull later entries of the cluster into the hole when
        // their home is not after the hole (cyclically).
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s.0 == EMPTY {
                break;
            }
            let h = self.home(s.0);
            if (j.wrapping_sub(h) & mask) >= (j.wrapping_sub(i) & mask) {
                self.slots[i] = s;
                i = j;
            }
        }
        self.slots[i].0 = EMPTY;
        self.len -= 1;
        Some(val)
    }

    #[cold]
    fn grow(&mut self) {
        let bits = 64 - self.shift + 1;
        let old = std::mem::replace(self, Self::with_bits(bits));
        for (k, v) in old.slots {
            if k != EMPTY {
                self.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[test]
    fn basic() {
        let mut t = AddrTable::new();
        assert_eq!(t.remove(0), None);
        for i in 0..1000u64 {
            t.insert(i << 20, i as u32);
        }
        assert_eq!(t.len(), 1000);
        for i in 0..1000u64 {
            assert_eq!(t.get(i << 20), Some(i as u32));
        }
        for i in (0..1000u64).step_by(2) {
            assert_eq!(t.remove(i << 20), Some(i as u32));
        }
        for i in 0..1000u64 {
            assert_eq!(t.get(i << 20), (i % 2 == 1).then_some(i as u32));
        }
        assert_eq!(t.remove(EMPTY), None);
        assert_eq!(t.len(), 500);
    }

    #[test]
    fn load_bound_follows_size() {
        let mut t = AddrTable::new();
        let slots_after = |t: &mut AddrTable, n: u64| {
            for i in t.len() as u64..n {
                t.insert(i << 8, i as u32);
            }
            t.slots.len()
        };
        // Sparse (at most 1/8) up to SPARSE_SLOTS slots...
        assert_eq!(slots_after(&mut t, 2), 16);
        assert_eq!(slots_after(&mut t, 3), 32);
        assert_eq!(slots_after(&mut t, (SPARSE_SLOTS / 8) as u64), SPARSE_SLOTS);
        // ...then at most 1/2.
        assert_eq!(
            slots_after(&mut t, (SPARSE_SLOTS / 8 + 1) as u64),
            2 * SPARSE_SLOTS
        );
        assert_eq!(slots_after(&mut t, SPARSE_SLOTS as u64), 2 * SPARSE_SLOTS);
        assert_eq!(
            slots_after(&mut t, SPARSE_SLOTS as u64 + 1),
            4 * SPARSE_SLOTS
        );
        for i in (0..t.len() as u64).step_by(997) {
            assert_eq!(t.get(i << 8), Some(i as u32));
        }
    }

    proptest! {
        #[test]
        fn matches_hashmap(ops in prop::collection::vec((any::<bool>(), 0u64..64), 1..2000)) {
            let mut t = AddrTable::new();
            let mut m = HashMap::new();
            for (k, (ins, key)) in ops.into_iter().enumerate() {
                // Few distinct keys in a narrow range: long clusters, many shifts.
                let key = key * 256 * 64;
                if ins && !m.contains_key(&key) {
                    t.insert(key, k as u32);
                    m.insert(key, k as u32);
                } else {
                    prop_assert_eq!(t.remove(key), m.remove(&key));
                }
                prop_assert_eq!(t.len(), m.len());
            }
            for (&k, &v) in &m {
                prop_assert_eq!(t.get(k), Some(v));
            }
        }

        /// A sparse table seldom has clusters, so they are made: keys that
        /// all hash to the last of 64 slots, whose cluster wraps around the
        /// array's end, removed in any order.
        #[test]
        fn wrapping_cluster_removed_in_any_order(
            order in Just((0..8usize).collect::<Vec<_>>()).prop_shuffle(),
            absent in 0..8usize,
        ) {
            // Homes as a table of 64 slots (2^6) places them.
            let of_64 = AddrTable::with_bits(6);
            let keys: Vec<u64> =
                (1u64..).map(|i| i << 8).filter(|&k| of_64.home(k) == 63).take(9).collect();
            let mut t = AddrTable::new();
            for (v, &k) in keys[..8].iter().enumerate() {
                t.insert(k, v as u32);
            }
            prop_assert_eq!(t.slots.len(), 64);
            // A key of the same home that was never inserted is not found.
            prop_assert_eq!(t.get(keys[8]), None);
            prop_assert_eq!(t.remove(keys[8]), None);
            let mut live: Vec<usize> = (0..8).collect();
            for &i in &order {
                prop_assert_eq!(t.remove(keys[i]), Some(i as u32));
                live.retain(|&j| j != i);
                prop_assert_eq!(t.get(keys[i]), None);
                for &j in &live {
                    prop_assert_eq!(t.get(keys[j]), Some(j as u32));
                }
                if i == absent {
                    // Put one back mid-way: it joins what is left of the cluster.
                    t.insert(keys[i], 100);
                    prop_assert_eq!(t.get(keys[i]), Some(100));
                    prop_assert_eq!(t.remove(keys[i]), Some(100));
                }
            }
            prop_assert!(t.is_empty());
            prop_assert!(t.slots.iter().all(|s| s.0 == EMPTY));
        }
    }
}
