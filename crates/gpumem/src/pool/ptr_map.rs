//! [`PtrMap`]: the maps keyed by device address of the pools (live blocks,
//! streams by id), with a hasher made for such keys.

use std::hash::{BuildHasherDefault, Hasher};

/// Hasher for device addresses: a folded 64×64→128 multiply (addresses are
/// multiples of 256, so their low bits carry nothing).
#[derive(Default, Clone, Copy)]
pub(crate) struct PtrHasher(u64);

impl Hasher for PtrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let p = ((x ^ self.0) as u128).wrapping_mul(0x9E37_79B9_7F4A_7C15_u128);
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
}

/// `HashMap` keyed by device address.
pub(crate) type PtrMap<V> = std::collections::HashMap<u64, V, BuildHasherDefault<PtrHasher>>;
