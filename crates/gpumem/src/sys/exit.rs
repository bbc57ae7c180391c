//! Safe drop at process exit.
//!
//! When a process exits normally, the C runtime runs its `atexit` handlers, and
//! the CUDA driver tears itself down in one of them. Anything that calls the
//! driver after that (destroying a stream or an event, freeing pool memory from
//! a destructor that runs late) can crash the process on the way out, which is
//! the classic failure of a C++ pool kept in a static. Rust never drops
//! `static`s, but thread-locals, other threads still running during `exit`, and
//! resources reached from `atexit`-time code can still drop.
//!
//! The rule: **a `Drop` that would call the driver first checks
//! [`process_is_exiting`]; when it is true it leaks instead** (the process is
//! going away; the operating system takes the memory back). Drops that only touch
//! host memory or files (flushing a log, printing a leak report) need not check.
//!
//! How the flag is set: the first call to [`process_is_exiting`] or
//! [`install_hook`] registers an `atexit` handler that sets it. `atexit`
//! handlers run in the reverse order of registration, so ours runs before every
//! handler registered before it, the driver's included as long as the hook is
//! installed after the driver was loaded. gpumem installs it when the
//! per-device registry and the adaptors are created; a driver backend should call
//! [`install_hook`] right after initialising the driver. The registration
//! itself is an OS call (the crate's private `os` module).
//!
//! The same handler flushes the buffered logs of live
//! [`LoggingAdaptor`](crate::adaptor::LoggingAdaptor)s, so a logging adaptor kept
//! in a `static` (which is never dropped) loses no lines.
//!
//! Cost: one relaxed atomic load per check once the hook is installed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, Once, Weak};

use crate::Result;

static EXITING: AtomicBool = AtomicBool::new(false);
/// Set with [`EXITING`] and by the fork handler: [`driver_off_limits`].
static OFF_LIMITS: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();
static HOOK_OK: AtomicBool = AtomicBool::new(false);

/// Something to run when the process exits: flushing a buffer, for instance.
/// Must not call the driver and must not block (use `try_lock`).
pub(crate) trait AtExit: Send + Sync {
    /// Runs once, from the exit handler.
    fn at_exit(&self);
}

static AT_EXIT: Mutex<Vec<Weak<dyn AtExit>>> = Mutex::new(Vec::new());

/// True once the process has started its normal exit (`exit()` or a return
/// from `main`): from then on, a `Drop` must not call the driver and leaks
/// instead. Installs the exit hook on first use.
#[inline]
pub fn process_is_exiting() -> bool {
    install_hook();
    EXITING.load(Ordering::Acquire)
}

/// True once the process has started its exit or is a child forked after
/// the hooks went in: [`process_is_exiting`] or
/// [`crate::fork::in_forked_child`], in one load.
///
/// Unlike [`process_is_exiting`], it does not install the hooks: for
/// checks that matter only once a device was opened (which installs them),
/// such as an allocator's fast path. Before then it is false.
#[inline(always)]
pub fn driver_off_limits() -> bool {
    OFF_LIMITS.load(Ordering::Acquire)
}

/// Marks the driver off limits ([`driver_off_limits`]); an atomic store,
/// async-signal-safe (the fork handler calls it).
pub(crate) fn mark_off_limits() {
    OFF_LIMITS.store(true, Ordering::Release);
}

/// Registers the exit hook if it is not registered yet. Returns whether the
/// hook is in place (false if the C runtime refused the registration). Cheap
/// after the first call.
#[inline]
pub fn install_hook() -> bool {
    HOOK.call_once(|| {
        HOOK_OK.store(crate::os::at_exit(on_exit), Ordering::Release);
        // The fork handler goes in at the same moment: from the first use on.
        crate::fork::register();
    });
    HOOK_OK.load(Ordering::Acquire)
}

/// Gives something back to the driver from a `Drop` (destroys a handle,
/// frees memory): nothing once the process is exiting (the rule above);
/// otherwise `call`, tried a second time if it fails, so a transient failure
/// loses nothing; a second failure is logged (`log::error!`) with `what` and
/// the thing is left to the process's end. Returns whether it was given back.
pub(crate) fn give_back(
    what: impl FnOnce() -> String,
    mut call: impl FnMut() -> Result<()>,
) -> bool {
    if process_is_exiting() {
        return false;
    }
    match call().or_else(|_| call()) {
        Ok(()) => true,
        Err(e) => {
            log::error!("could not give back {}: {e}", what());
            false
        }
    }
}

/// Runs `hook.at_exit()` when the process exits, if `hook` is still alive then.
pub(crate) fn run_at_exit(hook: Weak<dyn AtExit>) {
    install_hook();
    let mut hooks = AT_EXIT.lock().unwrap_or_else(|p| p.into_inner());
    hooks.retain(|h| h.strong_count() > 0);
    hooks.push(hook);
}

/// Runs the registered hooks that are still alive. Never blocks: if another
/// thread holds the hook list at exit, the hooks are skipped.
fn run_hooks() {
    let hooks: Vec<_> = match AT_EXIT.try_lock() {
        Ok(h) => h.iter().filter_map(Weak::upgrade).collect(),
        Err(std::sync::TryLockError::Poisoned(p)) => {
            p.into_inner().iter().filter_map(Weak::upgrade).collect()
        }
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    for h in hooks {
        h.at_exit();
    }
}

extern "C" fn on_exit() {
    EXITING.store(true, Ordering::Release);
    mark_off_limits();
    // A panic must not unwind out of an `extern "C"` function (it would abort);
    // the hooks do not panic, and a bug there should not turn a clean exit
    // into an abort.
    let _ = std::panic::catch_unwind(run_hooks);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    struct Counter(AtomicUsize);
    impl AtExit for Counter {
        fn at_exit(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn not_exiting_while_tests_run() {
        assert!(!process_is_exiting());
        assert!(!driver_off_limits());
        assert!(install_hook(), "atexit registration succeeds");
    }

    #[test]
    fn live_hooks_run_and_dead_ones_are_skipped() {
        let live = Arc::new(Counter(AtomicUsize::new(0)));
        let dead = Arc::new(Counter(AtomicUsize::new(0)));
        let live_dyn: Arc<dyn AtExit> = live.clone();
        let dead_dyn: Arc<dyn AtExit> = dead.clone();
        run_at_exit(Arc::downgrade(&live_dyn));
        run_at_exit(Arc::downgrade(&dead_dyn));
        drop(dead_dyn);
        drop(dead);
        run_hooks();
        assert!(live.0.load(Ordering::Relaxed) >= 1);
        assert!(
            !EXITING.load(Ordering::Relaxed),
            "running hooks does not set the flag"
        );
    }
}
