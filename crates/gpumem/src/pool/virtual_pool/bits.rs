//! Bitmap primitives over words of 64 bits: the page table's bitmaps are
//! read and written through these, a word at a time.

use std::ops::{Index, IndexMut};

/// Bit `idx` of a bitmap.
#[inline]
pub(super) fn bit(map: &impl Index<usize, Output = u64>, idx: usize) -> bool {
    map[idx / 64] & (1 << (idx % 64)) != 0
}

/// The mask of bits `lo..=hi` (both within one word).
#[inline]
pub(super) fn word_mask(lo: usize, hi: usize) -> u64 {
    (u64::MAX >> (63 - hi)) & (u64::MAX << lo)
}

/// Calls `f(word, mask)` for each word of bits `first..=last` (always
/// inlined: with the closure in place, one or two words cost a few
/// instructions).
#[inline(always)]
pub(super) fn words(first: usize, last: usize, mut f: impl FnMut(usize, u64)) {
    let (w0, w1) = (first / 64, last / 64);
    for w in w0..=w1 {
        let lo = if w == w0 { first % 64 } else { 0 };
        let hi = if w == w1 { last % 64 } else { 63 };
        f(w, word_mask(lo, hi));
    }
}

/// The first clear bit of `map` among `from..=last`, if any.
#[inline]
pub(super) fn next_clear(
    map: &impl Index<usize, Output = u64>,
    from: usize,
    last: usize,
) -> Option<usize> {
    if from > last {
        return None;
    }
    let (mut w, w1) = (from / 64, last / 64);
    let mut clear = !map[w] & (u64::MAX << (from % 64));
    loop {
        if clear != 0 {
            let idx = w * 64 + clear.trailing_zeros() as usize;
            return (idx <= last).then_some(idx);
        }
        w += 1;
        if w > w1 {
            return None;
        }
        clear = !map[w];
    }
}

/// True when some bit among `first..=last` of `map` is set.
#[inline]
pub(super) fn any_set(map: &impl Index<usize, Output = u64>, first: usize, last: usize) -> bool {
    let mut any = false;
    words(first, last, |w, m| any |= map[w] & m != 0);
    any
}

/// Sets (`on`) or clears bits `first..=last` of `map`.
#[inline]
pub(super) fn set_bits(
    map: &mut impl IndexMut<usize, Output = u64>,
    first: usize,
    last: usize,
    on: bool,
) {
    words(first, last, |w, m| {
        if on {
            map[w] |= m;
        } else {
            map[w] &= !m;
        }
    });
}

/// True when bits `first..=last` of `map` are all set.
#[inline]
pub(super) fn all_set(map: &impl Index<usize, Output = u64>, first: usize, last: usize) -> bool {
    let mut all = true;
    words(first, last, |w, m| all &= map[w] & m == m);
    all
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Bits `0..256` of a bitmap as four words, from a list of bools.
    fn words_of(bits: &[bool]) -> [u64; 4] {
        let mut map = [0u64; 4];
        for (i, &b) in bits.iter().enumerate() {
            map[i / 64] |= u64::from(b) << (i % 64);
        }
        map
    }

    #[test]
    fn word_masks_cover_their_bits() {
        assert_eq!(word_mask(0, 63), u64::MAX);
        assert_eq!(word_mask(3, 5), 0b11_1000);
        assert_eq!(word_mask(63, 63), 1 << 63);
        assert_eq!(word_mask(0, 0), 1);
    }

    #[test]
    fn words_visits_each_word_once_with_its_part() {
        let mut seen = Vec::new();
        words(60, 130, |w, m| seen.push((w, m)));
        assert_eq!(
            seen,
            vec![(0, word_mask(60, 63)), (1, u64::MAX), (2, word_mask(0, 2))]
        );
        seen.clear();
        words(5, 5, |w, m| seen.push((w, m)));
        assert_eq!(seen, vec![(0, 1 << 5)]);
        seen.clear();
        words(64, 127, |w, m| seen.push((w, m)));
        assert_eq!(seen, vec![(1, u64::MAX)]);
    }

    #[test]
    fn next_clear_finds_the_first_hole_across_words() {
        let mut map = [u64::MAX; 4];
        assert_eq!(next_clear(&map, 0, 255), None);
        map[2] &= !(1 << 7); // bit 135
        assert_eq!(next_clear(&map, 0, 255), Some(135));
        assert_eq!(next_clear(&map, 135, 135), Some(135));
        assert_eq!(next_clear(&map, 136, 255), None);
        assert_eq!(
            next_clear(&map, 0, 134),
            None,
            "a hole past `last` is not found"
        );
        assert_eq!(next_clear(&map, 10, 9), None, "an empty range has no hole");
    }

    proptest! {
        /// Every primitive agrees with the same question asked bit by bit.
        #[test]
        fn primitives_match_a_bit_by_bit_model(
            bits in prop::collection::vec(prop::bool::weighted(0.8), 256),
            a in 0usize..256,
            b in 0usize..256,
            on in any::<bool>(),
        ) {
            let (first, last) = (a.min(b), a.max(b));
            let map = words_of(&bits);
            for (i, &v) in bits.iter().enumerate() {
                prop_assert_eq!(bit(&map, i), v);
            }
            let range = &bits[first..=last];
            prop_assert_eq!(any_set(&map, first, last), range.iter().any(|&v| v));
            prop_assert_eq!(all_set(&map, first, last), range.iter().all(|&v| v));
            prop_assert_eq!(
                next_clear(&map, first, last),
                range.iter().position(|&v| !v).map(|k| first + k)
            );
            let mut set = map;
            set_bits(&mut set, first, last, on);
            let mut expect = bits.clone();
            expect[first..=last].iter_mut().for_each(|v| *v = on);
            prop_assert_eq!(set, words_of(&expect));
        }
    }
}
