//! A lock of one flag, for data updated in a few instructions on every
//! allocation and free (the statistics' counters).
//!
//! Taking it is one atomic read-modify-write and giving it back a plain
//! store, where a `Mutex` costs two read-modify-writes (its unlock swaps, to
//! see whether a waiter must be woken): on the allocation fast path each of
//! those costs as much as the rest of the update. A waiter spins a little,
//! then yields its time slice. The data it guards are atomics accessed with
//! relaxed loads and stores (plain moves) while it is held, so no `unsafe`
//! is needed.

use std::sync::atomic::{AtomicBool, Ordering};

/// The lock.
#[derive(Debug, Default)]
pub(crate) struct FlagLock(AtomicBool);

/// Holds a [`FlagLock`] until dropped.
pub(crate) struct FlagGuard<'a>(&'a AtomicBool);

/// Spins before a waiter starts yielding.
const SPINS: u32 = 64;

impl FlagLock {
    /// Takes the lock, waiting while another thread holds it.
    #[inline]
    pub(crate) fn lock(&self) -> FlagGuard<'_> {
        if self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.wait();
        }
        FlagGuard(&self.0)
    }

    #[cold]
    #[inline(never)]
    fn wait(&self) {
        let mut spins = 0;
        loop {
            while self.0.load(Ordering::Relaxed) {
                if spins < SPINS {
                    std::hint::spin_loop();
                    spins += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            if self
                .0
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

impl Drop for FlagGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn threads_take_turns() {
        let lock = FlagLock::default();
        let n = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        let _g = lock.lock();
                        // A non-atomic increment made of two steps: lost
                        // updates would show without mutual exclusion.
                        let v = n.load(Ordering::Relaxed);
                        std::hint::spin_loop();
                        n.store(v + 1, Ordering::Relaxed);
                    }
                });
            }
        });
        assert_eq!(n.load(Ordering::Relaxed), 80_000);
    }
}
