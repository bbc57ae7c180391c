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
