//! `HandedOut`: the blocks a resource has handed out and not taken back, so a
//! free can be checked before anything is freed.
//!
//! Resources that call the driver for every allocation (device, pinned,
//! managed, system memory, CUDA's async pools) and the routing layers that
//! pass some allocations straight through (binning's direct allocations,
//! the aligned adaptor's over-aligned ones) keep one. A free of a pointer not
//! in the table, a second free, or a free with a size other than the one
//! recorded is refused with [`Error::InvalidFree`] and the driver is not
//! called: the memory of another allocator is never freed, and a wrong size
//! loses nothing.
//!
//! Cost: 16 shards, each a mutex around a hash map; a pointer's shard is a
//! multiply and a shift of its address. One insert per allocation and one
//! remove per free, tens of nanoseconds uncontended, against the tens of
//! microseconds of the driver call they guard. Each shard remembers its last 32
//! freed pointers, so a second free is reported as a double free rather than
//! an unknown pointer (a pointer handed out again is live, and found live
//! first).

use std::sync::Mutex;

use super::{LiveBlock, DEFAULT_ALIGNMENT};
use crate::driver::DevicePtr;
use crate::pool::ptr_map::PtrMap;
use crate::pool::stream_order::sync::lock;
use crate::{Error, FreeError};

/// Shards of the table (a power of two).
const SHARDS: usize = 16;
/// Freed pointers each shard remembers to name double frees.
const FREED_HISTORY: usize = 32;

struct Shard<V> {
    /// Pointer → (bytes asked for, what the resource keeps with it).
    live: PtrMap<(usize, V)>,
    bytes: usize,
    freed: [u64; FREED_HISTORY],
    next_freed: usize,
}

impl<V> Default for Shard<V> {
    fn default() -> Self {
        Self {
            live: PtrMap::default(),
            bytes: 0,
            freed: [0; FREED_HISTORY],
            next_freed: 0,
        }
    }
}

impl<V> Shard<V> {
    /// Accounts for `ptr` (of `bytes`), just removed from `live`.
    #[inline]
    fn forget(&mut self, ptr: u64, bytes: usize) {
        self.bytes -= bytes;
        self.freed[self.next_freed] = ptr;
        self.next_freed = (self.next_freed + 1) % FREED_HISTORY;
    }

    /// Why `ptr`, not live, cannot be freed.
    fn not_live(&self, ptr: u64) -> FreeError {
        if ptr != 0 && self.freed.contains(&ptr) {
            FreeError::DoubleFree
        } else {
            FreeError::Unknown
        }
    }
}

/// Blocks handed out: pointer → bytes and a value kept with them. See the
/// module documentation; the driver resources, the async pools, binning's
/// direct allocations and the aligned adaptor use one, and so can any
/// allocator that must refuse bad frees (the C ABI's CuPy entry points do).
pub struct HandedOut<V = ()> {
    shards: Box<[Mutex<Shard<V>>]>,
}

impl<V> Default for HandedOut<V> {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl<V> std::fmt::Debug for HandedOut<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandedOut")
            .field("blocks", &self.len())
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl<V> HandedOut<V> {
    #[inline]
    fn shard(&self, ptr: u64) -> std::sync::MutexGuard<'_, Shard<V>> {
        // Addresses are multiples of 256: mix the bits above before picking.
        let h = (ptr >> 8).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        lock(&self.shards[(h >> (64 - SHARDS.trailing_zeros())) as usize])
    }

    /// Records `ptr`, handed out for `bytes`, with `value`.
    #[inline]
    pub fn insert(&self, ptr: DevicePtr, bytes: usize, value: V) {
        let mut s = self.shard(ptr.0);
        if let Some((old, _)) = s.live.insert(ptr.0, (bytes, value)) {
            // Handed out twice by the layer below: keep the count honest.
            s.bytes -= old;
        }
        s.bytes += bytes;
    }

    /// Takes `ptr` out of the table when it was handed out for `bytes`, and
    /// returns its value. Otherwise the reason as [`Error::InvalidFree`], and
    /// the table is unchanged.
    #[inline]
    pub fn take(&self, ptr: DevicePtr, bytes: usize) -> Result<V, Error> {
        let mut s = self.shard(ptr.0);
        let reason = match s.live.get(&ptr.0) {
            Some(&(recorded, _)) if recorded == bytes => {
                let (_, v) = s.live.remove(&ptr.0).expect("just found");
                s.forget(ptr.0, bytes);
                return Ok(v);
            }
            Some(&(allocated, _)) => FreeError::SizeMismatch {
                allocated,
                freed: bytes,
            },
            None => s.not_live(ptr.0),
        };
        Err(Error::InvalidFree { ptr: ptr.0, reason })
    }

    /// Takes `ptr` out whatever size it was handed out for, and returns that
    /// size and its value: for frees that carry no size (CuPy's). A pointer
    /// not live is [`Error::InvalidFree`] (`DoubleFree` when freed recently).
    pub fn take_any(&self, ptr: DevicePtr) -> Result<(usize, V), Error> {
        let mut s = self.shard(ptr.0);
        match s.live.remove(&ptr.0) {
            Some((bytes, v)) => {
                s.forget(ptr.0, bytes);
                Ok((bytes, v))
            }
            None => Err(Error::InvalidFree {
                ptr: ptr.0,
                reason: s.not_live(ptr.0),
            }),
        }
    }

    /// Puts back a block [`HandedOut::take`] returned, whose free then failed
    /// below (the memory is still held).
    pub fn restore(&self, ptr: DevicePtr, bytes: usize, value: V) {
        self.insert(ptr, bytes, value);
    }

    /// Takes `ptr` out (checked as by [`HandedOut::take`]) and frees it with
    /// `free`; when `free` fails the block is put back, still live.
    #[inline]
    pub fn free_with(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        free: impl FnOnce(&V) -> crate::Result<()>,
    ) -> crate::Result<()> {
        let v = self.take(ptr, bytes)?;
        free(&v).inspect_err(|_| self.restore(ptr, bytes, v))
    }

    /// Changes the bytes recorded for `ptr` from `bytes` to `new_bytes` (an
    /// allocation grown or shrunk in place). [`Error::InvalidArgument`] when
    /// `ptr` is not live with `bytes`; nothing changes then.
    pub fn resize(&self, ptr: DevicePtr, bytes: usize, new_bytes: usize) -> Result<(), Error> {
        let mut guard = self.shard(ptr.0);
        let s = &mut *guard;
        match s.live.get_mut(&ptr.0) {
            Some((recorded, _)) if *recorded == bytes => {
                *recorded = new_bytes;
                s.bytes = s.bytes - bytes + new_bytes;
                Ok(())
            }
            found => Err(Error::InvalidArgument(format!(
                "{:#x} is not a live allocation of {bytes} bytes (recorded: {:?})",
                ptr.0,
                found.map(|(b, _)| *b)
            ))),
        }
    }

    /// The bytes `ptr` was handed out for, if it is live.
    pub fn bytes_of(&self, ptr: DevicePtr) -> Option<usize> {
        self.shard(ptr.0).live.get(&ptr.0).map(|&(b, _)| b)
    }

    /// True when `ptr` was freed recently (the last 32 frees of its shard)
    /// and not handed out again.
    pub fn recently_freed(&self, ptr: DevicePtr) -> bool {
        let s = self.shard(ptr.0);
        ptr.0 != 0 && !s.live.contains_key(&ptr.0) && s.freed.contains(&ptr.0)
    }

    /// Every live block as (pointer, bytes asked for, value), in address
    /// order. Locks each shard in turn: O(blocks), for snapshots.
    pub fn entries(&self) -> Vec<(DevicePtr, usize, V)>
    where
        V: Clone,
    {
        let mut out: Vec<_> = self
            .shards
            .iter()
            .flat_map(|s| {
                lock(s)
                    .live
                    .iter()
                    .map(|(&p, (b, v))| (DevicePtr(p), *b, v.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        out.sort_unstable_by_key(|e| e.0);
        out
    }

    /// Every live block in address order, with the bytes asked for and
    /// those rounded up to 256 bytes (the alignment every driver allocation
    /// has; the driver's own rounding cannot be read). For snapshots.
    pub fn live_blocks(&self) -> Vec<LiveBlock>
    where
        V: Clone,
    {
        self.entries()
            .into_iter()
            .map(|(address, bytes, _)| LiveBlock {
                address,
                size: bytes.next_multiple_of(DEFAULT_ALIGNMENT),
                requested: Some(bytes),
            })
            .collect()
    }

    /// Blocks live.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).live.len()).sum()
    }

    /// True when no block is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes live, as asked for.
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|s| lock(s).bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_list_live_blocks_in_address_order() {
        let t: HandedOut<u8> = HandedOut::default();
        for (i, p) in [0x30_0000u64, 0x10_0000, 0x20_0000].into_iter().enumerate() {
            t.insert(DevicePtr(p), 100 * (i + 1), i as u8);
        }
        t.take(DevicePtr(0x20_0000), 300).unwrap();
        assert_eq!(
            t.entries(),
            vec![
                (DevicePtr(0x10_0000), 200, 1),
                (DevicePtr(0x30_0000), 100, 0)
            ]
        );
    }

    #[test]
    fn a_free_must_name_a_live_block_and_its_size() {
        let t: HandedOut<u8> = HandedOut::default();
        let p = DevicePtr(0x10_0000);
        t.insert(p, 1000, 7);
        assert_eq!((t.len(), t.bytes()), (1, 1000));
        let bad = |reason| Err(Error::InvalidFree { ptr: p.0, reason });
        assert_eq!(
            t.take(p, 1001),
            bad(FreeError::SizeMismatch {
                allocated: 1000,
                freed: 1001
            })
        );
        assert_eq!(t.bytes_of(p), Some(1000), "a refused free changes nothing");
        assert_eq!(t.take(p, 1000), Ok(7));
        assert_eq!((t.len(), t.bytes()), (0, 0));
        assert_eq!(t.take(p, 1000), bad(FreeError::DoubleFree));
        assert!(t.recently_freed(p));
        assert_eq!(
            t.take(DevicePtr(0x20_0000), 1000),
            Err(Error::InvalidFree {
                ptr: 0x20_0000,
                reason: FreeError::Unknown
            })
        );
        // Handed out again: live, no longer a double free.
        t.insert(p, 256, 1);
        assert!(!t.recently_freed(p));
        t.restore(DevicePtr(0x30_0000), 512, 2);
        assert_eq!((t.len(), t.bytes()), (2, 768));
        // Without a size: whatever it was handed out for.
        assert_eq!(t.take_any(DevicePtr(0x30_0000)), Ok((512, 2)));
        assert_eq!(
            t.take_any(DevicePtr(0x30_0000)),
            Err(Error::InvalidFree {
                ptr: 0x30_0000,
                reason: FreeError::DoubleFree
            })
        );
        assert!(!t.is_empty());
    }

    #[test]
    fn the_history_forgets_the_oldest() {
        let t: HandedOut = HandedOut::default();
        let ptrs: Vec<_> = (1..=(SHARDS * FREED_HISTORY * 4) as u64)
            .map(|i| DevicePtr(i << 8))
            .collect();
        for &p in &ptrs {
            t.insert(p, 256, ());
            t.take(p, 256).unwrap();
        }
        assert!(t.recently_freed(*ptrs.last().unwrap()));
        let remembered = ptrs.iter().filter(|&&p| t.recently_freed(p)).count();
        assert!(remembered <= SHARDS * FREED_HISTORY, "{remembered}");
    }
}
