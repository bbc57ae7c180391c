//! The superblock directory: the one structure every stream arena shares.
//!
//! It holds the region's clean free superblocks (free runs usable by any
//! stream at once) in a [`MaxTree`] under one mutex, and an owner word per
//! superblock that lock-free readers use to route a free to the arena holding
//! the superblock. Owner words change only under the owning arena's lock
//! (owner to 0 on release, 0 to owner on acquire), so a reader that finds its
//! arena's word under that arena's lock knows the arena still holds the block.
//!
//! It is written against [`crate::pool::arena`]'s `sync` shim so that the
//! hand-off can be model-checked with `loom` (`RUSTFLAGS="--cfg loom"`).

use super::sync::{AtomicU64, Mutex, Ordering};
use super::tree::MaxTree;

/// Owner word: which arena holds a superblock and what for.
///
/// The high 32 bits are the arena's id (never 0); the low 32 bits are the slot
/// of a small-block superblock in that arena, or [`OwnerWord::LARGE`] plus the
/// length in superblocks of a large block starting here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerWord(pub u64);

impl OwnerWord {
    /// No arena holds the superblock for live data.
    pub const NONE: OwnerWord = OwnerWord(0);
    /// Tag bit of a large block's first superblock.
    pub const LARGE: u32 = 1 << 31;

    /// A small-block superblock in `slot` of arena `arena`.
    #[inline]
    pub fn small(arena: u32, slot: u32) -> Self {
        OwnerWord(((arena as u64) << 32) | (slot & !Self::LARGE) as u64)
    }

    /// The first superblock of a large block of `len` superblocks held by `arena`.
    #[inline]
    pub fn large(arena: u32, len: u32) -> Self {
        OwnerWord(((arena as u64) << 32) | (Self::LARGE | len) as u64)
    }

    /// The arena id (0 for none).
    #[inline]
    pub fn arena(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The slot, for a small-block superblock.
    #[inline]
    pub fn slot(self) -> Option<u32> {
        let t = self.0 as u32;
        (self.0 != 0 && t & Self::LARGE == 0).then_some(t)
    }

    /// The length in superblocks, for a large block's first superblock.
    #[inline]
    pub fn large_len(self) -> Option<u32> {
        let t = self.0 as u32;
        (self.0 != 0 && t & Self::LARGE != 0).then_some(t & !Self::LARGE)
    }
}

/// Clean free superblocks plus an owner word per superblock (see the module
/// documentation). Indices are superblock numbers within the region.
pub struct SuperblockDirectory {
    clean: Mutex<MaxTree<u32>>,
    owners: Box<[AtomicU64]>,
}

impl std::fmt::Debug for SuperblockDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SuperblockDirectory")
            .field("superblocks", &self.owners.len())
            .finish()
    }
}

impl SuperblockDirectory {
    /// A directory of `count` superblocks (at most `u32::MAX / 2`), all clean
    /// and free.
    pub fn new(count: u32) -> Self {
        let count = count.min(u32::MAX / 2);
        let mut tree = MaxTree::new(count as usize);
        if count > 0 {
            tree.set(0, count);
        }
        Self {
            clean: Mutex::new(tree),
            owners: (0..count).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Number of superblocks.
    pub fn len(&self) -> u32 {
        self.owners.len() as u32
    }

    fn tree(&self) -> super::sync::MutexGuard<'_, MaxTree<u32>> {
        // A panic while holding this lock cannot leave the tree half-updated in
        // a way later calls cannot use, so poisoning is ignored.
        self.clean.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `len` contiguous clean superblocks, lowest address first; returns
    /// the first index. The caller becomes responsible for them.
    pub fn take(&self, len: u32) -> Option<u32> {
        if len == 0 || len > self.len() {
            return None;
        }
        self.tree().take_first_fit(len).map(|s| s as u32)
    }

    /// Returns `[start, start + len)` to the clean free runs, coalescing. Every
    /// superblock in it must be free of live data and no longer in use by any
    /// stream (or fenced, per the arena's stream-ordering policy); its owner
    /// words must be [`OwnerWord::NONE`].
    pub fn give_back(&self, start: u32, len: u32) {
        if len == 0 || start as u64 + len as u64 > self.len() as u64 {
            return;
        }
        let mut t = self.tree();
        if t.is_allocated(start as usize, len) {
            t.give_back(start as usize, len);
        }
    }

    /// The largest clean free run, in superblocks.
    pub fn largest_free(&self) -> u32 {
        self.tree().max()
    }

    /// Clean free superblocks in all.
    pub fn free_count(&self) -> u64 {
        self.tree().free_blocks().map(|(_, l)| l as u64).sum()
    }

    /// Clean free runs as `(start, len)` in address order (O(n); for reports).
    pub fn free_runs(&self) -> Vec<(u32, u32)> {
        self.tree()
            .free_blocks()
            .map(|(s, l)| (s as u32, l))
            .collect()
    }

    /// The owner word of superblock `idx` (NONE when out of range).
    #[inline]
    pub fn owner(&self, idx: u32) -> OwnerWord {
        match self.owners.get(idx as usize) {
            Some(w) => OwnerWord(w.load(Ordering::Acquire)),
            None => OwnerWord::NONE,
        }
    }

    /// Sets the owner word of superblock `idx`; only the arena named in the
    /// old or new word may do so, under its own lock.
    #[inline]
    pub fn set_owner(&self, idx: u32, word: OwnerWord) {
        if let Some(w) = self.owners.get(idx as usize) {
            w.store(word.0, Ordering::Release);
        }
    }
}
