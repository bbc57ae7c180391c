//! Lock shards: a pool's state split into shards, each behind its own lock,
//! with the calling thread choosing its shard, and one shared record of
//! which shard owns each upstream region.
//!
//! Why shards of the whole pool rather than per-stream front caches: a front
//! cache serves a freed block again only to a request of its size (or size
//! bin), and workloads whose sizes vary miss it and fall through to the
//! shared lock, while bins round sizes up and raise the reserve. A shard is
//! a whole pool (coalescing, best fit, stream lanes), so every request is
//! served under one uncontended lock, and nothing is rounded further.
//!
//! Why per thread rather than per stream: a program that uses several
//! streams from one thread keeps one shard, so a block freed on any of its
//! streams is found where today's single pool would find it; threads get
//! shards apart whatever streams they use. Stream ordering is unchanged:
//! inside a shard every stream has its lane, as in an unsharded pool.
//!
//! A thread's shard is its slot (the lowest number no live thread holds,
//! given back when the thread exits, see [`SlotRegistry`]) modulo the number
//! of shards, so threads that replace exited ones find the same shards.
//!
//! Locking rules: a thread holds at most one shard lock at a time, and may
//! take the owners' lock ([`Shards::global`]) while holding it, never the
//! other way round. Memory moves between shards only as whole free regions
//! (see the pool), recorded in [`RegionOwners`] under the owners' lock, so
//! a free made on another thread finds the shard owning its block.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::OnceLock;

#[cfg(loom)]
use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
use std::sync::{Mutex, MutexGuard};

/// The guard of a shard or of the shared state.
pub type Guard<'a, T> = MutexGuard<'a, T>;

/// Locks `m`, ignoring poisoning (see `stream_order::sync`).
#[inline]
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Numbers handed to threads: always the lowest one not held.
#[derive(Debug, Default)]
pub struct SlotRegistry {
    state: Mutex<(BinaryHeap<Reverse<usize>>, usize)>,
}

impl SlotRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The lowest number nobody holds.
    pub fn take(&self) -> usize {
        let mut s = lock(&self.state);
        match s.0.pop() {
            Some(Reverse(n)) => n,
            None => {
                s.1 += 1;
                s.1 - 1
            }
        }
    }

    /// Gives `slot` back for the next thread.
    pub fn give_back(&self, slot: usize) {
        lock(&self.state).0.push(Reverse(slot));
    }
}

/// The process's thread slots.
fn registry() -> &'static SlotRegistry {
    static REGISTRY: OnceLock<SlotRegistry> = OnceLock::new();
    REGISTRY.get_or_init(SlotRegistry::new)
}

/// A thread's slot, given back when the thread exits.
struct ThreadSlot(usize);

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        registry().give_back(self.0);
    }
}

thread_local! {
    static SLOT: ThreadSlot = ThreadSlot(registry().take());
}

/// The calling thread's slot (0 while the thread is being torn down).
#[inline]
fn thread_slot() -> usize {
    SLOT.try_with(|s| s.0).unwrap_or(0)
}

/// Upstream regions by base address: their size and the shard owning them.
#[derive(Debug, Default)]
pub struct RegionOwners {
    by_base: BTreeMap<u64, (usize, usize)>,
    bytes: usize,
}

impl RegionOwners {
    /// Records a region of `bytes` at `base`, owned by `shard`.
    pub fn insert(&mut self, base: u64, bytes: usize, shard: usize) {
        if let Some((old, _)) = self.by_base.insert(base, (bytes, shard)) {
            self.bytes -= old;
        }
        self.bytes += bytes;
    }

    /// Forgets the region at `base`; returns its size.
    pub fn remove(&mut self, base: u64) -> Option<usize> {
        let (bytes, _) = self.by_base.remove(&base)?;
        self.bytes -= bytes;
        Some(bytes)
    }

    /// Hands the region at `base` to `shard`; false if there is none.
    pub fn set_owner(&mut self, base: u64, shard: usize) -> bool {
        match self.by_base.get_mut(&base) {
            Some(r) => {
                r.1 = shard;
                true
            }
            None => false,
        }
    }

    /// The shard owning the region that contains `addr`.
    pub fn owner_of(&self, addr: u64) -> Option<usize> {
        let (&base, &(bytes, shard)) = self.by_base.range(..=addr).next_back()?;
        (addr - base < bytes as u64).then_some(shard)
    }

    /// Bytes of all regions.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Number of regions.
    pub fn len(&self) -> usize {
        self.by_base.len()
    }

    /// Every region as `(base, bytes)`.
    pub fn iter(&self) -> impl Iterator<Item = (u64, usize)> + '_ {
        self.by_base.iter().map(|(&b, &(n, _))| (b, n))
    }
}

/// A shard on its own cache lines, so that threads locking neighbouring
/// shards do not write the same line.
#[repr(align(128))]
struct Padded<T>(T);

/// The shards of a pool (`S` each) and its shared state `G` (which holds
/// the [`RegionOwners`]); see the module documentation.
pub struct Shards<S, G> {
    shards: Box<[Padded<Mutex<S>>]>,
    mask: usize,
    global: Mutex<G>,
}

impl<S, G> Shards<S, G> {
    /// `count` shards (rounded up to a power of two, at least one) made by
    /// `make`, and the shared state.
    pub fn new(count: usize, mut make: impl FnMut() -> S, global: G) -> Self {
        let n = count.max(1).next_power_of_two();
        Self {
            shards: (0..n).map(|_| Padded(Mutex::new(make()))).collect(),
            mask: n - 1,
            global: Mutex::new(global),
        }
    }

    /// The number of shards.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// The calling thread's shard.
    #[inline]
    pub fn home(&self) -> usize {
        thread_slot() & self.mask
    }

    /// Locks shard `i`.
    #[inline]
    pub fn lock(&self, i: usize) -> MutexGuard<'_, S> {
        lock(&self.shards[i].0)
    }

    /// Locks the shared state (allowed while holding one shard lock).
    pub fn global(&self) -> MutexGuard<'_, G> {
        lock(&self.global)
    }

    /// Every shard's state, for the owner of the whole structure.
    pub fn get_mut(&mut self) -> (impl Iterator<Item = &mut S>, &mut G) {
        let g = self.global.get_mut().unwrap_or_else(|e| e.into_inner());
        let s = self
            .shards
            .iter_mut()
            .map(|p| p.0.get_mut().unwrap_or_else(|e| e.into_inner()));
        (s, g)
    }
}

impl<S, G: AsRef<RegionOwners>> Shards<S, G> {
    /// The shard that owns the region containing `addr`, if not `except`.
    pub fn owner_other_than(&self, addr: u64, except: usize) -> Option<usize> {
        self.global()
            .as_ref()
            .owner_of(addr)
            .filter(|&o| o != except)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_lowest_free_numbers() {
        let r = SlotRegistry::new();
        assert_eq!((r.take(), r.take(), r.take()), (0, 1, 2));
        r.give_back(1);
        r.give_back(0);
        assert_eq!((r.take(), r.take(), r.take()), (0, 1, 3));
    }

    #[test]
    fn live_threads_have_different_shards() {
        let shards: Shards<(), RegionOwners> = Shards::new(64, || (), RegionOwners::default());
        let here = shards.home();
        let there = std::thread::scope(|sc| sc.spawn(|| shards.home()).join().unwrap());
        assert_ne!(here, there);
    }

    #[test]
    fn owners_find_the_region_of_an_address() {
        let mut o = RegionOwners::default();
        o.insert(1 << 20, 1 << 20, 3);
        o.insert(4 << 20, 2 << 20, 5);
        assert_eq!(o.owner_of((1 << 20) + 7), Some(3));
        assert_eq!(o.owner_of(2 << 20), None, "one past the end");
        assert_eq!(o.owner_of(5 << 20), Some(5));
        assert!(o.set_owner(4 << 20, 1));
        assert_eq!(o.owner_of(4 << 20), Some(1));
        assert_eq!(o.bytes(), 3 << 20);
        assert_eq!(o.remove(1 << 20), Some(1 << 20));
        assert_eq!(o.bytes(), 2 << 20);
        assert_eq!(o.owner_of(1 << 20), None);
    }
}
