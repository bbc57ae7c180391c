//! Fork detection.
//!
//! CUDA cannot be used in a child process forked after the parent initialised
//! the driver: every driver call there fails, and a lock another thread of
//! the parent held at the moment of the fork stays locked for ever in the
//! child. Python's `multiprocessing` and PyTorch's `DataLoader` fork by
//! default, so such children are common; they must get a clear error, not a
//! hang or a mysterious driver code.
//!
//! gpumem registers a `pthread_atfork` child handler together with its exit
//! hook ([`crate::exit::install_hook`]). In a child made by `fork()` after
//! that, [`in_forked_child`] is true: the C ABI then refuses every call
//! before it takes any lock (allocations return NULL with
//! [`forked_error`]'s message, frees of the parent's memory are ignored),
//! and a failing CUDA driver call reports [`forked_error`] instead of the
//! driver's code. Rust code that keeps gpumem objects across a fork must not
//! use them in the child: a pool whose lock was held at the fork cannot be
//! entered there.
//!
//! Cost: one relaxed atomic load per check.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::Error;

static FORKED: AtomicBool = AtomicBool::new(false);

/// True in a child process forked after gpumem installed its hooks (its
/// first use of a device, registry or adaptor).
#[inline]
pub fn in_forked_child() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// The error every CUDA use in a forked child gets: [`Error::NoDriver`]
/// saying why, and what to do instead.
pub fn forked_error() -> Error {
    Error::NoDriver {
        reason: "this process was forked after its parent used CUDA through gpumem; \
                 CUDA cannot be used in such a child (start worker processes with the \
                 'spawn' method, or use gpumem only in the parent)"
            .into(),
    }
}

extern "C" fn on_fork_child() {
    // Only atomic stores: async-signal-safe, as a child handler must be.
    FORKED.store(true, Ordering::Relaxed);
    crate::exit::mark_off_limits();
}

/// Registers the child handler; false where `pthread_atfork` refused it.
pub(crate) fn register() -> bool {
    crate::os::at_fork_child(on_fork_child)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_forked_here_and_the_error_says_what_to_do() {
        assert!(!in_forked_child());
        let msg = forked_error().to_string();
        assert!(msg.contains("forked") && msg.contains("spawn"), "{msg}");
    }
}
