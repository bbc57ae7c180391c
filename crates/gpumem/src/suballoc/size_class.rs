//! TLSF two-level size classes over 256-byte granules.
//!
//! Algorithm: a size in granules `u` (bytes / 256) maps to a first level `fl`
//! (its power of two) and a second level `sl` (which of the 2^[`SL_LOG`] equal
//! slices of that power of two it falls in); sizes below 2^[`SL_LOG`] granules
//! are mapped linearly into first level 0. Inserting a block rounds *down* (the
//! class whose lower bound is at most the size); searching rounds *up* (the
//! class whose every block is at least the size), wasting at most 1/2^SL_LOG
//! (6.25%) of the request. Cost: O(1), a leading-zero count and a few shifts.

/// Bytes per granule: every size and address is a multiple of this.
pub const GRANULE: u64 = 256;
/// log2 of [`GRANULE`].
pub const GRANULE_LOG: u32 = 8;
/// log2 of the number of second-level subdivisions per power of two.
pub const SL_LOG: u32 = 4;
/// Number of second-level classes per first level (16).
pub const SL_COUNT: usize = 1 << SL_LOG;
/// Number of first-level classes: enough for any u64 byte size.
///
/// Granule counts are below 2^56, so `fl` = log2(u) − SL_LOG + 1 ≤ 52.
pub const FL_COUNT: usize = 64 - GRANULE_LOG as usize - SL_LOG as usize + 1;
/// Total number of classes.
pub const CLASS_COUNT: usize = FL_COUNT * SL_COUNT;

/// A size class: first level and second level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SizeClass {
    /// First level: 0 for the linear range, else log2(granules) − SL_LOG + 1.
    pub fl: u32,
    /// Second level: which of the [`SL_COUNT`] slices of the first level.
    pub sl: u32,
}

impl SizeClass {
    /// The flat index `fl * SL_COUNT + sl`, below [`CLASS_COUNT`].
    #[inline]
    pub fn index(self) -> usize {
        self.fl as usize * SL_COUNT + self.sl as usize
    }

    /// The smallest byte size that maps to this class on insert.
    #[inline]
    pub fn min_size(self) -> u64 {
        let units = if self.fl == 0 {
            self.sl as u64
        } else {
            (SL_COUNT as u64 + self.sl as u64) << (self.fl - 1)
        };
        units << GRANULE_LOG
    }
}

/// Rounds `size` up to a multiple of [`GRANULE`]; `None` on overflow.
///
/// Zero stays zero; callers decide what a zero-byte request means.
#[inline]
pub fn round_to_granule(size: u64) -> Option<u64> {
    Some(size.checked_add(GRANULE - 1)? & !(GRANULE - 1))
}

/// The free bytes a heap must find to place a block of `bytes` at
/// `alignment` (a power of two) wherever its free block starts: `bytes`
/// rounded up to the granule plus the most padding the alignment can cost.
/// `None` on overflow.
#[inline]
pub(crate) fn span_with_padding(bytes: usize, alignment: usize) -> Option<usize> {
    let granule = GRANULE as usize;
    bytes
        .checked_next_multiple_of(granule)?
        .checked_add(alignment.max(granule) - granule)
}

#[inline]
fn class_of_units(u: u64) -> SizeClass {
    if u < SL_COUNT as u64 {
        SizeClass {
            fl: 0,
            sl: u as u32,
        }
    } else {
        let log = 63 - u.leading_zeros();
        let fl = log - SL_LOG + 1;
        let sl = ((u >> (log - SL_LOG)) as u32) - SL_COUNT as u32;
        SizeClass { fl, sl }
    }
}

/// The class a free block of `size` bytes is filed under (rounds down):
/// `class.min_size() <= size`, and `size` is below the next class's minimum.
///
/// `size` must be a non-zero multiple of [`GRANULE`] (not checked in release).
#[inline]
pub fn insert_class(size: u64) -> SizeClass {
    debug_assert!(size >= GRANULE && size.is_multiple_of(GRANULE));
    class_of_units(size >> GRANULE_LOG)
}

/// The smallest class whose every block holds at least `size` bytes (rounds
/// up): `class.min_size() >= size`. `None` when no class is that large.
///
/// `size` must be a non-zero multiple of [`GRANULE`] (not checked in release).
#[inline]
pub fn search_class(size: u64) -> Option<SizeClass> {
    debug_assert!(size >= GRANULE && size.is_multiple_of(GRANULE));
    let mut u = size >> GRANULE_LOG;
    if u >= SL_COUNT as u64 {
        let log = 63 - u.leading_zeros();
        // u < 2^56, so this cannot overflow.
        u += (1u64 << (log - SL_LOG)) - 1;
    }
    let c = class_of_units(u);
    (c.index() < CLASS_COUNT).then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_span_with_padding_covers_the_rounded_size_and_the_alignment() {
        assert_eq!(span_with_padding(1, 1), Some(256));
        assert_eq!(span_with_padding(256, 256), Some(256));
        assert_eq!(span_with_padding(300, 4096), Some(512 + 4096 - 256));
        assert_eq!(span_with_padding(usize::MAX, 256), None);
        assert_eq!(span_with_padding(usize::MAX - 1023, 1 << 20), None);
    }

    fn all_classes() -> impl Iterator<Item = SizeClass> {
        (0..CLASS_COUNT).map(|i| SizeClass {
            fl: (i / SL_COUNT) as u32,
            sl: (i % SL_COUNT) as u32,
        })
    }

    #[test]
    fn small_sizes_are_exact() {
        for u in 1..SL_COUNT as u64 * 2 {
            let s = u * GRANULE;
            assert_eq!(insert_class(s).min_size(), s);
            assert_eq!(search_class(s).unwrap().min_size(), s);
        }
    }

    #[test]
    fn class_minimums_increase_and_roundtrip() {
        let mut last = 0;
        for c in all_classes().skip(1) {
            let m = c.min_size();
            assert!(m > last, "{c:?}");
            assert_eq!(insert_class(m), c);
            assert_eq!(search_class(m), Some(c));
            last = m;
        }
    }

    #[test]
    fn extremes() {
        let max = !(GRANULE - 1);
        let c = insert_class(max);
        assert_eq!(c.index(), CLASS_COUNT - 1);
        assert!(c.min_size() <= max);
        assert_eq!(search_class(max), None);
        assert_eq!(search_class(1 << 48).unwrap().min_size(), 1 << 48);
        assert_eq!(round_to_granule(u64::MAX), None);
        assert_eq!(round_to_granule(1), Some(256));
        assert_eq!(round_to_granule(0), Some(0));
        assert_eq!(round_to_granule(512), Some(512));
    }

    #[test]
    fn rounding_waste_is_bounded() {
        // 1 MiB + 256 rounds up to the next class, at most 1/16 above.
        let s = (1 << 20) + 256;
        let up = search_class(s).unwrap().min_size();
        assert!(up >= s && up - s <= s / SL_COUNT as u64);
    }

    proptest! {
        #[test]
        fn round_up_never_below_round_down_never_above(units in 1u64..(1u64 << 55)) {
            let s = units * GRANULE;
            let down = insert_class(s);
            prop_assert!(down.min_size() <= s);
            if down.index() + 1 < CLASS_COUNT {
                let next = all_classes().nth(down.index() + 1).unwrap();
                prop_assert!(next.min_size() > s);
            }
            if let Some(up) = search_class(s) {
                prop_assert!(up.min_size() >= s);
                prop_assert!(up >= down);
                prop_assert!(up.min_size() - s <= s / SL_COUNT as u64);
                // The class just below `up` would not be good enough.
                if up.index() > 0 {
                    let below = all_classes().nth(up.index() - 1).unwrap();
                    prop_assert!(below.min_size() < s);
                }
            }
        }

        #[test]
        fn monotonic(a in 1u64..(1u64 << 50), b in 1u64..(1u64 << 50)) {
            let (a, b) = (a.min(b) * GRANULE, a.max(b) * GRANULE);
            prop_assert!(insert_class(a) <= insert_class(b));
            prop_assert!(search_class(a) <= search_class(b));
        }
    }
}
