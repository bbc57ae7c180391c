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
//! Why spread only on contention ([`Spread::OnContention`], the pool's
//! default): shards cost memory where threads share their blocks (PyTorch's
//! autograd thread frees the main thread's activations and allocates its
//! own; one shard per CPU reserved 18-22% more on an H100), and such threads
//! seldom take the lock at the same moment. So every thread starts on shard
//! 0, one lock as in an unsharded pool, and the shards come into use only
//! once that lock is contended often: [`CONTENDED_BURST`] contended
//! acquisitions within [`BURST_WINDOW`]. Spreading is for good: a program
//! whose threads contended once would contend again.
//!
//! Locking rules: a thread holds at most one shard lock at a time, and may
//! take the owners' lock ([`Shards::global`]) while holding it, never the
//! other way round. Memory moves between shards only as whole free regions
//! (see the pool), recorded in [`RegionOwners`] under the owners' lock, so
//! a free made on another thread finds the shard owning its block.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

#[cfg(loom)]
use loom::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
#[cfg(loom)]
use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
#[cfg(not(loom))]
use std::sync::{Mutex, MutexGuard, TryLockError};

/// When a pool's threads spread over its shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Spread {
    /// From the start: each thread allocates from its own shard.
    Always,
    /// Once the first shard's lock is contended often (see the module
    /// documentation); until then every thread uses shard 0.
    #[default]
    OnContention,
}

/// Contended acquisitions of shard 0 that, within [`BURST_WINDOW`], spread
/// the threads ([`Spread::OnContention`]).
pub const CONTENDED_BURST: u64 = 256;

/// See [`CONTENDED_BURST`]: 2,560 contended acquisitions per second.
pub const BURST_WINDOW: Duration = Duration::from_millis(100);

/// The number of shards for a configured count (0: one per CPU, at most
/// 64; at most 1,024 in any case).
pub fn shard_count(configured: usize) -> usize {
    if configured > 0 {
        return configured.min(1024);
    }
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(64)
}

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

impl AsRef<RegionOwners> for RegionOwners {
    fn as_ref(&self) -> &RegionOwners {
        self
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
    /// The mask in force: `mask` once spread, 0 (every thread on shard 0)
    /// before.
    active: AtomicUsize,
    /// Contended acquisitions of shard 0 while not spread.
    contended: AtomicU64,
    /// When the current burst of [`CONTENDED_BURST`] began, in ns since
    /// `epoch` (the first at `epoch`). Not read under loom, whose models
    /// spread the threads themselves.
    #[cfg_attr(loom, allow(dead_code))]
    burst_start: AtomicU64,
    #[cfg_attr(loom, allow(dead_code))]
    epoch: Instant,
    /// The threads stay on shard 0 for good ([`Shards::pin`]).
    pinned: AtomicBool,
    global: Mutex<G>,
}

impl<S, G> Shards<S, G> {
    /// `count` shards (rounded up to a power of two, at least one) made by
    /// `make`, and the shared state; the threads spread over them as
    /// `spread` says.
    pub fn spreading(count: usize, spread: Spread, mut make: impl FnMut() -> S, global: G) -> Self {
        let n = count.max(1).next_power_of_two();
        let mask = n - 1;
        Self {
            shards: (0..n).map(|_| Padded(Mutex::new(make()))).collect(),
            mask,
            active: AtomicUsize::new(match spread {
                Spread::Always => mask,
                Spread::OnContention => 0,
            }),
            contended: AtomicU64::new(0),
            burst_start: AtomicU64::new(0),
            epoch: Instant::now(),
            pinned: AtomicBool::new(false),
            global: Mutex::new(global),
        }
    }

    /// The number of shards.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Whether the threads use every shard (rather than shard 0 alone).
    pub fn spread_out(&self) -> bool {
        self.active.load(Relaxed) == self.mask
    }

    /// Acquisitions of shard 0 that found it held, counted until the
    /// threads spread.
    pub fn contended(&self) -> u64 {
        self.contended.load(Relaxed)
    }

    /// Spreads the threads over every shard, for good, unless they were
    /// pinned to shard 0 ([`Shards::pin`]).
    pub fn spread(&self) {
        // Under the shared lock, so that it and `pin` see each other.
        let _g = self.global();
        if !self.pinned.load(Relaxed) {
            self.active.store(self.mask, Relaxed);
        }
    }

    /// Keeps every thread on shard 0 for good, for state that must stay in
    /// one shard; false when the threads already use several shards.
    pub fn pin(&self) -> bool {
        let _g = self.global();
        if self.mask == 0 {
            return true;
        }
        if self.active.load(Relaxed) != 0 {
            return false;
        }
        self.pinned.store(true, Relaxed);
        true
    }

    /// The shard of the thread holding `slot`.
    #[inline]
    pub fn home_of(&self, slot: usize) -> usize {
        slot & self.active.load(Relaxed)
    }

    /// The calling thread's shard.
    #[inline]
    pub fn home(&self) -> usize {
        self.home_of(thread_slot())
    }

    /// Locks the calling thread's shard; returns its index with the guard.
    /// Watches for contention while the threads are not spread. Inlined:
    /// out of line, its call and the guard returned through memory cost
    /// about 15 instructions per allocation and free.
    #[inline(always)]
    pub fn lock_home(&self) -> (usize, MutexGuard<'_, S>) {
        let active = self.active.load(Relaxed);
        #[cfg(not(loom))]
        if active == 0 && self.mask != 0 {
            let m = &self.shards[0].0;
            return match m.try_lock() {
                Ok(g) => (0, g),
                Err(TryLockError::Poisoned(e)) => (0, e.into_inner()),
                Err(TryLockError::WouldBlock) => {
                    self.on_contention();
                    (0, lock(m))
                }
            };
        }
        let home = thread_slot() & active;
        (home, self.lock(home))
    }

    /// Shard 0 was found held: counts it, and spreads the threads after a
    /// burst (see the module documentation).
    #[cold]
    #[inline(never)]
    #[cfg_attr(loom, allow(dead_code))]
    fn on_contention(&self) {
        self.on_contention_at(|| {
            u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
        });
    }

    /// [`Shards::on_contention`] with the clock (ns since `epoch`) given,
    /// read only at the end of a burst.
    #[cfg_attr(loom, allow(dead_code))]
    fn on_contention_at(&self, clock: impl FnOnce() -> u64) {
        if self.spread_out() {
            return;
        }
        let n = self.contended.fetch_add(1, Relaxed) + 1;
        if !n.is_multiple_of(CONTENDED_BURST) {
            return;
        }
        let now = clock();
        let began = self.burst_start.swap(now, Relaxed);
        // The first burst began when the pool was made (`epoch`).
        if now.saturating_sub(began) <= BURST_WINDOW.as_nanos() as u64 {
            self.spread();
        }
    }

    /// Locks shard `i`.
    #[inline]
    pub fn lock(&self, i: usize) -> MutexGuard<'_, S> {
        lock(&self.shards[i].0)
    }

    /// Locks every shard, in order (for readers of what all shards count;
    /// no other code holds more than one shard lock).
    pub fn lock_all(&self) -> Vec<MutexGuard<'_, S>> {
        (0..self.len()).map(|i| self.lock(i)).collect()
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
        let shards: Shards<(), RegionOwners> =
            Shards::spreading(64, Spread::Always, || (), RegionOwners::default());
        let here = shards.home();
        let there = std::thread::scope(|sc| sc.spawn(|| shards.home()).join().unwrap());
        assert_ne!(here, there);
    }

    fn shards(spread: Spread) -> Shards<(), RegionOwners> {
        Shards::spreading(8, spread, || (), RegionOwners::default())
    }

    /// `n` contended acquisitions, the clock reading `at` ms.
    fn contend(s: &Shards<(), RegionOwners>, n: u64, at: u64) {
        for _ in 0..n {
            s.on_contention_at(|| at * 1_000_000);
        }
    }

    #[test]
    fn a_burst_of_contention_within_the_window_spreads_the_threads() {
        let s = shards(Spread::OnContention);
        assert_eq!(s.home_of(5), 0, "all on shard 0 first");
        contend(&s, CONTENDED_BURST - 1, 10);
        assert!(!s.spread_out(), "one short of a burst");
        contend(&s, 1, 90);
        assert!(s.spread_out(), "a burst within 100 ms of the start");
        assert_eq!(s.home_of(5), 5);
        assert_eq!(s.contended(), CONTENDED_BURST);
    }

    #[test]
    fn contention_slower_than_a_burst_per_window_does_not_spread() {
        let s = shards(Spread::OnContention);
        let window = BURST_WINDOW.as_millis() as u64;
        // Each burst ends more than a window after the previous one.
        for k in 1..=5 {
            contend(&s, CONTENDED_BURST, k * (window + 1));
            assert!(!s.spread_out(), "burst {k}");
        }
        // The next one within a window spreads.
        contend(&s, CONTENDED_BURST, 5 * (window + 1) + window);
        assert!(s.spread_out());
    }

    #[test]
    fn a_pinned_pool_never_spreads() {
        let s = shards(Spread::OnContention);
        assert!(s.pin());
        contend(&s, 16 * CONTENDED_BURST, 1);
        assert!(!s.spread_out());
        assert_eq!(s.home_of(3), 0);
        let spread = shards(Spread::Always);
        assert!(!spread.pin(), "the threads already use several shards");
    }

    /// The lock path counts an acquisition that finds shard 0 held: a
    /// thread blocks on it while another holds it.
    #[test]
    fn an_acquisition_that_finds_shard_0_held_is_counted() {
        let s = shards(Spread::OnContention);
        let held = s.lock(0);
        std::thread::scope(|sc| {
            let t = sc.spawn(|| drop(s.lock_home()));
            while s.contended() == 0 {
                std::thread::yield_now();
            }
            drop(held);
            t.join().unwrap();
        });
        assert_eq!(s.contended(), 1);
        assert!(!s.spread_out());
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
