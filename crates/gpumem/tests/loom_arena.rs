//! Model-checks the arena's shared superblock hand-off with `loom`:
//! `RUSTFLAGS="--cfg loom" cargo test -p gpumem --release --test loom_arena`.
//!
//! Threads take runs from the [`SuperblockDirectory`], publish themselves in
//! the owner words, and hand the runs back, while another thread routes
//! "frees" by reading owner words. In every interleaving: no superblock is in
//! two hands at once, an owner word read names the arena holding the block or
//! none, and all superblocks are clean and coalesced at the end.
#![cfg(loom)]

use gpumem::pool::{OwnerWord, SuperblockDirectory};
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::Arc;
use loom::thread;

fn worker(dir: Arc<SuperblockDirectory>, held: Arc<Vec<AtomicBool>>, arena: u32, len: u32) {
    if let Some(s) = dir.take(len) {
        for i in s..s + len {
            assert!(
                !held[i as usize].swap(true, Ordering::SeqCst),
                "superblock {i} in two hands"
            );
        }
        dir.set_owner(s, OwnerWord::large(arena, len));
        assert_eq!(dir.owner(s).arena(), arena);
        // Hand back: clear the owner word, then the run.
        dir.set_owner(s, OwnerWord::NONE);
        for i in s..s + len {
            held[i as usize].store(false, Ordering::SeqCst);
        }
        dir.give_back(s, len);
    }
}

#[test]
fn superblock_handoff_is_exclusive() {
    loom::model(|| {
        let dir = Arc::new(SuperblockDirectory::new(3));
        let held = Arc::new((0..3).map(|_| AtomicBool::new(false)).collect::<Vec<_>>());
        let a = {
            let (d, h) = (dir.clone(), held.clone());
            thread::spawn(move || worker(d, h, 1, 2))
        };
        let b = {
            let (d, h) = (dir.clone(), held.clone());
            thread::spawn(move || worker(d, h, 2, 1))
        };
        // A reader routing frees sees each owner word as none or a live owner.
        for i in 0..3 {
            let w = dir.owner(i);
            assert!(matches!(w.arena(), 0 | 1 | 2));
        }
        a.join().unwrap();
        b.join().unwrap();
        assert_eq!(dir.largest_free(), 3, "all back and coalesced");
        assert_eq!(dir.free_count(), 3);
        for i in 0..3 {
            assert_eq!(dir.owner(i), OwnerWord::NONE);
        }
    });
}

#[test]
fn small_slots_and_large_runs_encode_apart() {
    loom::model(|| {
        let w = OwnerWord::small(7, 3);
        assert_eq!((w.arena(), w.slot(), w.large_len()), (7, Some(3), None));
        let l = OwnerWord::large(7, 5);
        assert_eq!((l.arena(), l.slot(), l.large_len()), (7, None, Some(5)));
        assert_eq!(OwnerWord::NONE.slot(), None);
    });
}
