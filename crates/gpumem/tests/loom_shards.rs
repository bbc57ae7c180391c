//! Model-checks the pools' lock shards with `loom`:
//! `RUSTFLAGS="--cfg loom" cargo test -p gpumem --release --test loom_shards`.
//!
//! The pool's two moves across shards, on a model heap whose regions are
//! one block each: a free made on a thread whose shard does not know the
//! block (it looks in its own shard, then asks the owners which shard holds
//! the region, then frees there), racing with another shard adopting a free
//! region (taken out under the giver's lock, re-owned under the owners'
//! lock, put in under the taker's lock). In every interleaving: no deadlock
//! (one shard lock at a time, the owners' lock inside it), the free lands,
//! each region ends in exactly one shard, and the owners name that shard.
#![cfg(loom)]

use std::collections::BTreeMap;

use gpumem::pool::{RegionOwners, Shards, SlotRegistry, Spread};
use loom::sync::Arc;
use loom::thread;

/// A shard of the model: region base → used.
type Heap = BTreeMap<u64, bool>;

struct Owners(RegionOwners);

impl AsRef<RegionOwners> for Owners {
    fn as_ref(&self) -> &RegionOwners {
        &self.0
    }
}

type Model = Shards<Heap, Owners>;

const REGION: usize = 1 << 20;

/// Frees `addr` from a thread whose shard is `home`, as the pool does.
fn free(shards: &Model, home: usize, addr: u64) -> bool {
    {
        let mut h = shards.lock(home);
        if let Some(used) = h.get_mut(&addr) {
            assert!(*used, "double free");
            *used = false;
            return true;
        }
    }
    let Some(owner) = shards.owner_other_than(addr, home) else {
        return false;
    };
    let mut h = shards.lock(owner);
    match h.get_mut(&addr) {
        Some(used) => {
            assert!(*used, "double free");
            *used = false;
            true
        }
        None => false,
    }
}

/// Moves a free region of shard `from` to shard `to`, as the pool adopts.
fn adopt(shards: &Model, from: usize, to: usize) -> bool {
    let mut giver = shards.lock(from);
    let Some(base) = giver.iter().find(|(_, used)| !**used).map(|(&b, _)| b) else {
        return false;
    };
    giver.remove(&base);
    assert!(shards.global().0.set_owner(base, to));
    drop(giver);
    shards.lock(to).insert(base, false);
    true
}

fn setup() -> Arc<Model> {
    let shards: Model = Shards::spreading(
        2,
        Spread::Always,
        Heap::new,
        Owners(RegionOwners::default()),
    );
    {
        let mut h = shards.lock(0);
        let mut g = shards.global();
        for base in [1u64 << 30, 2 << 30] {
            h.insert(base, false);
            g.0.insert(base, REGION, 0);
        }
        // One region in use, allocated by a thread of shard 0.
        h.insert(1 << 30, true);
    }
    Arc::new(shards)
}

#[test]
fn cross_shard_free_and_adoption_keep_every_region_in_one_shard() {
    loom::model(|| {
        let shards = setup();
        let freer = {
            let s = shards.clone();
            thread::spawn(move || assert!(free(&s, 1, 1 << 30), "the free found its block"))
        };
        let adopter = {
            let s = shards.clone();
            thread::spawn(move || adopt(&s, 0, 1))
        };
        freer.join().unwrap();
        let adopted = adopter.join().unwrap();
        assert!(adopted, "a free region was there all along");
        let (a, b) = (shards.lock(0).clone(), shards.lock(1).clone());
        for base in [1u64 << 30, 2 << 30] {
            let here = [a.contains_key(&base), b.contains_key(&base)];
            assert_eq!(here.iter().filter(|&&x| x).count(), 1, "in one shard");
            let owner = shards.global().0.owner_of(base).unwrap();
            assert!(here[owner], "the owners name the shard holding it");
        }
        assert!(a.values().chain(b.values()).all(|used| !used));
    });
}

/// Threads spreading over the shards while a thread allocates (a region in
/// its shard of the moment) and frees (from its shard of the next moment):
/// the free finds its block whichever shard the thread had each time.
#[test]
fn spreading_midway_keeps_every_free_finding_its_block() {
    loom::model(|| {
        let shards: Arc<Model> = Arc::new(Shards::spreading(
            2,
            Spread::OnContention,
            Heap::new,
            Owners(RegionOwners::default()),
        ));
        let spreader = {
            let s = shards.clone();
            thread::spawn(move || s.spread())
        };
        let worker = {
            let s = shards.clone();
            thread::spawn(move || {
                let home = s.home_of(1);
                s.lock(home).insert(1 << 30, true);
                s.global().0.insert(1 << 30, REGION, home);
                assert!(free(&s, s.home_of(1), 1 << 30), "the free found its block");
            })
        };
        spreader.join().unwrap();
        worker.join().unwrap();
        assert!(shards.spread_out());
        assert_eq!(shards.home_of(1), 1);
        let (a, b) = (shards.lock(0).clone(), shards.lock(1).clone());
        assert_eq!(a.len() + b.len(), 1, "the region is in one shard");
        assert!(a.values().chain(b.values()).all(|used| !used));
    });
}

#[test]
fn two_adopters_never_take_the_same_region() {
    loom::model(|| {
        let shards: Arc<Model> = {
            let s: Model = Shards::spreading(
                4,
                Spread::Always,
                Heap::new,
                Owners(RegionOwners::default()),
            );
            s.lock(0).insert(1 << 30, false);
            s.global().0.insert(1 << 30, REGION, 0);
            Arc::new(s)
        };
        let t: Vec<_> = [1, 2]
            .into_iter()
            .map(|to| {
                let s = shards.clone();
                thread::spawn(move || adopt(&s, 0, to))
            })
            .collect();
        let took: Vec<bool> = t.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(took.iter().filter(|&&x| x).count(), 1);
        let owner = shards.global().0.owner_of(1 << 30).unwrap();
        assert!(shards.lock(owner).contains_key(&(1 << 30)));
    });
}

#[test]
fn live_threads_hold_different_slots_and_the_lowest_comes_back() {
    loom::model(|| {
        let reg = Arc::new(SlotRegistry::new());
        let t: Vec<_> = (0..2)
            .map(|_| {
                let r = reg.clone();
                thread::spawn(move || r.take())
            })
            .collect();
        let mut got: Vec<usize> = t.into_iter().map(|h| h.join().unwrap()).collect();
        got.sort();
        assert_eq!(got, [0, 1]);
        reg.give_back(1);
        reg.give_back(0);
        assert_eq!(reg.take(), 0);
    });
}

/// A VirtualPool beginning a region (pinning its threads to shard 0) while
/// contention spreads them: either the pin wins and the threads stay on
/// shard 0 for good, or the spread wins and the pin is refused. Never both
/// pinned and spread, which would leave a region's blocks in several
/// shards.
#[test]
fn pinning_and_spreading_never_both_win() {
    loom::model(|| {
        let shards: Arc<Model> = Arc::new(Shards::spreading(
            2,
            Spread::OnContention,
            Heap::new,
            Owners(RegionOwners::default()),
        ));
        let spreader = {
            let s = shards.clone();
            thread::spawn(move || s.spread())
        };
        let pinner = {
            let s = shards.clone();
            thread::spawn(move || {
                let pinned = s.pin();
                // A thread's shard right after a successful pin is 0.
                (pinned, s.home_of(1))
            })
        };
        spreader.join().unwrap();
        let (pinned, home_after_pin) = pinner.join().unwrap();
        assert_ne!(pinned, shards.spread_out(), "exactly one wins");
        if pinned {
            assert_eq!(home_after_pin, 0);
            shards.spread();
            assert_eq!(shards.home_of(1), 0, "pinned for good");
        }
    });
}
