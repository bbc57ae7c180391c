//! Each thread's last allocation error ([`crate::gpumem_last_error`]).
//!
//! Every allocation forgets its thread's last error first. In a shared
//! library, as `libgpumem.so` is under PyTorch and CuPy, each access to a
//! thread-local is a call to `__tls_get_addr`; so a count of the threads
//! holding a message comes first, and while it is zero (no allocation of any
//! thread has failed since that thread's last success) an allocation reads
//! that one atomic and touches no thread-local. A thread sees its own
//! updates of the count, which is all its allocations need: a message of
//! another thread is not theirs to forget.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Threads whose [`LAST_ERROR`] holds a message.
static THREADS_WITH_ERROR: AtomicUsize = AtomicUsize::new(0);

/// One thread's message, counted in [`THREADS_WITH_ERROR`] while it holds
/// one (until it is forgotten or the thread ends).
struct LastError(Option<CString>);

impl LastError {
    fn replace(&mut self, msg: Option<CString>) {
        match (self.0.is_some(), msg.is_some()) {
            (false, true) => {
                THREADS_WITH_ERROR.fetch_add(1, Relaxed);
            }
            (true, false) => {
                THREADS_WITH_ERROR.fetch_sub(1, Relaxed);
            }
            _ => {}
        }
        self.0 = msg;
    }
}

impl Drop for LastError {
    fn drop(&mut self) {
        self.replace(None);
    }
}

thread_local! {
    /// Why this thread's last allocation through the C ABI failed.
    static LAST_ERROR: RefCell<LastError> = const { RefCell::new(LastError(None)) };
}

/// Keeps `msg` as the calling thread's last error.
pub(crate) fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|e| e.borrow_mut().replace(Some(c)));
}

/// Forgets the calling thread's last error (an allocation begins).
#[inline]
pub(crate) fn clear_last_error() {
    if THREADS_WITH_ERROR.load(Relaxed) != 0 {
        forget_own_error();
    }
}

/// [`clear_last_error`] once some thread holds a message.
#[cold]
#[inline(never)]
fn forget_own_error() {
    let _ = LAST_ERROR.try_with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            e.replace(None);
        }
    });
}

/// The message of the calling thread's last failed allocation through
/// [`crate::Allocator::malloc`] or [`crate::Allocator::cupy_malloc`] (of any
/// allocator), as a pointer valid until the thread's next allocation; NULL
/// when the last one did not fail.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|e| {
            e.borrow()
                .0
                .as_ref()
                .map_or(std::ptr::null(), |c| c.as_ptr())
        })
        .unwrap_or(std::ptr::null())
}

/// The calling thread's last allocation error as text, if its last
/// allocation failed.
pub fn last_error() -> Option<String> {
    LAST_ERROR
        .try_with(|e| {
            e.borrow()
                .0
                .as_ref()
                .map(|c| c.to_string_lossy().into_owned())
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The only test of this binary that sets messages: the count is
    /// exact.
    #[test]
    fn a_message_is_counted_until_forgotten_or_its_thread_ends() {
        std::thread::spawn(|| {
            assert_eq!(THREADS_WITH_ERROR.load(Relaxed), 0);
            set_last_error("first");
            set_last_error("second");
            assert_eq!(THREADS_WITH_ERROR.load(Relaxed), 1);
            assert_eq!(last_error().as_deref(), Some("second"));
            clear_last_error();
            assert_eq!(last_error(), None);
            assert!(last_error_ptr().is_null());
            assert_eq!(THREADS_WITH_ERROR.load(Relaxed), 0);
            set_last_error("held when the thread ends");
            assert_eq!(THREADS_WITH_ERROR.load(Relaxed), 1);
        })
        .join()
        .unwrap();
        assert_eq!(THREADS_WITH_ERROR.load(Relaxed), 0);
    }
}
