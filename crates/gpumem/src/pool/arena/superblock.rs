//! A superblock: one superblock-sized slice of the arena's region, carved into
//! 256-byte granules and handed out by address-ordered first fit.
//!
//! Free blocks live in a [`MaxTree`] indexed by granule (first fit and
//! coalescing in O(log granules)); a parallel table records the length of
//! every live block at its first granule, so a free with a wrong pointer or size
//! is detected rather than corrupting the free space. Host cost: 6 bytes per
//! 256-byte granule (2.3% of the superblock's size), paid only while a stream
//! arena holds the superblock.

use super::tree::MaxTree;
use crate::FreeError;

/// Marks a live block freed on another stream whose free has not yet been
/// applied (it waits for that stream's fence).
const DEFERRED: u16 = u16::MAX;
/// Marks a block freed on its own stream and parked in the arena's quick list
/// (free, but not yet merged into the free blocks).
const QUICK: u16 = u16::MAX - 1;

/// One superblock held by a stream arena.
#[derive(Debug)]
pub(crate) struct Superblock {
    /// Index of the superblock in the region.
    pub(crate) idx: u32,
    free: MaxTree<u16>,
    live_len: Box<[u16]>,
}

impl Superblock {
    /// A fully free superblock of `granules` granules (at most 32768).
    pub(crate) fn new(idx: u32, granules: u32) -> Self {
        let mut free = MaxTree::new(granules as usize);
        free.set(0, granules);
        Self {
            idx,
            free,
            live_len: vec![0u16; granules as usize].into_boxed_slice(),
        }
    }

    /// Reuses this superblock's tables for another, fully free superblock.
    pub(crate) fn reset(&mut self, idx: u32) {
        let g = self.granules();
        self.idx = idx;
        self.free = MaxTree::new(g as usize);
        self.free.set(0, g);
        self.live_len.fill(0);
    }

    /// Granules in the superblock.
    #[inline]
    pub(crate) fn granules(&self) -> u32 {
        self.free.len() as u32
    }

    /// The largest free block, in granules.
    #[inline]
    pub(crate) fn largest_free(&self) -> u32 {
        self.free.max()
    }

    /// True when nothing in the superblock is live or waiting.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.free.max() == self.granules()
    }

    /// Takes `g` granules by address-ordered first fit; returns the first granule.
    #[inline]
    pub(crate) fn alloc(&mut self, g: u32) -> Option<u32> {
        let s = self.free.take_first_fit(g)?;
        self.live_len[s] = g as u16;
        Some(s as u32)
    }

    /// Checks that a live block of `g` granules starts at `off`.
    #[inline]
    pub(crate) fn check_live(&self, off: u32, g: u32) -> Result<(), FreeError> {
        match self.live_len.get(off as usize) {
            None => Err(FreeError::Unknown),
            Some(0) => {
                if self.free.get(off as usize) > 0 || !self.free.is_allocated(off as usize, 1) {
                    Err(FreeError::DoubleFree)
                } else {
                    Err(FreeError::Unknown)
                }
            }
            Some(&DEFERRED) | Some(&QUICK) => Err(FreeError::DoubleFree),
            Some(&len) if len as u32 != g => Err(FreeError::SizeMismatch {
                allocated: len as usize * super::GRANULE,
                freed: g as usize * super::GRANULE,
            }),
            Some(_) => Ok(()),
        }
    }

    /// Frees the live block of `g` granules at `off` (checked first).
    #[inline]
    pub(crate) fn free(&mut self, off: u32, g: u32) -> Result<(), FreeError> {
        self.check_live(off, g)?;
        self.live_len[off as usize] = 0;
        self.free.give_back(off as usize, g);
        Ok(())
    }

    /// Parks the live block at `off` (checked) in the quick list.
    #[inline]
    pub(crate) fn park_quick(&mut self, off: u32, g: u32) -> Result<(), FreeError> {
        self.check_live(off, g)?;
        self.live_len[off as usize] = QUICK;
        Ok(())
    }

    /// Hands out a block parked in the quick list again.
    #[inline]
    pub(crate) fn unpark_quick(&mut self, off: u32, g: u32) {
        self.live_len[off as usize] = g as u16;
    }

    /// Merges a block parked in the quick list into the free blocks.
    pub(crate) fn free_quick(&mut self, off: u32, g: u32) {
        if self.live_len[off as usize] == QUICK {
            self.live_len[off as usize] = 0;
            self.free.give_back(off as usize, g);
        }
    }

    /// Marks the live block at `off` as freed but not yet reusable.
    pub(crate) fn defer(&mut self, off: u32, g: u32) -> Result<(), FreeError> {
        self.check_live(off, g)?;
        self.live_len[off as usize] = DEFERRED;
        Ok(())
    }

    /// Applies a deferred free.
    pub(crate) fn apply_deferred(&mut self, off: u32, g: u32) {
        if self.live_len[off as usize] == DEFERRED {
            self.live_len[off as usize] = 0;
            self.free.give_back(off as usize, g);
        }
    }

    /// Free blocks as `(first granule, granules)` in address order.
    pub(crate) fn free_blocks(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        self.free.free_blocks()
    }
}
