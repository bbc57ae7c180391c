//! Poison-tolerant locking, used by every pool.
//!
//! A pool keeps its invariants between statements that can panic only
//! through bugs; failing every later call because one thread panicked while
//! holding a lock would leak all the pool's memory, so poisoning is ignored.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `m`, recovering the data if a thread panicked while holding it.
#[inline]
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Read-locks `m`, recovering from poisoning (see [`lock`]).
#[inline]
pub(crate) fn read_lock<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|e| e.into_inner())
}

/// Write-locks `m`, recovering from poisoning (see [`lock`]).
#[inline]
pub(crate) fn write_lock<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|e| e.into_inner())
}
