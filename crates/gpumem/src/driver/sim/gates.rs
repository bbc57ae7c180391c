//! Gates: a driver call made to wait, for tests that must interleave
//! threads at an exact point (a growth in flight while another thread
//! allocates) instead of hoping a race happens.
//!
//! [`SimDriver::gate_call`](super::SimDriver::gate_call) arms a gate on the
//! nth call of a name; the thread making that call stops before the call
//! runs (holding none of the simulator's locks), the test sees it arrive
//! ([`CallGate::wait_arrival`]), does what it must, then lets it go
//! ([`CallGate::open`]). Unarmed, a call pays one atomic load.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Debug, Default)]
struct GateState {
    arrived: bool,
    open: bool,
}

/// One armed gate (see the module documentation). Dropping the handle
/// [`SimDriver::gate_call`](super::SimDriver::gate_call) returned opens it,
/// so a failing test never leaves a thread stopped.
#[derive(Debug)]
pub struct CallGate {
    inner: Arc<(Mutex<GateState>, Condvar)>,
    /// The test's handle (the driver keeps another until the call comes).
    owner: bool,
}

impl CallGate {
    fn new() -> Self {
        Self {
            inner: Arc::new((Mutex::new(GateState::default()), Condvar::new())),
            owner: true,
        }
    }

    fn driver_side(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            owner: false,
        }
    }

    fn state(&self) -> MutexGuard<'_, GateState> {
        self.inner.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until a call stops at the gate; false if none did within
    /// `timeout` (the test then fails on its own terms, not by hanging).
    pub fn wait_arrival(&self, timeout: Duration) -> bool {
        let guard = self.state();
        let (guard, _) = self
            .inner
            .1
            .wait_timeout_while(guard, timeout, |s| !s.arrived)
            .unwrap_or_else(|p| p.into_inner());
        guard.arrived
    }

    /// Lets the stopped call (or the next one to arrive) go on.
    pub fn open(&self) {
        self.state().open = true;
        self.inner.1.notify_all();
    }

    /// Called by the gated call: says it arrived, waits until opened.
    fn pass(&self) {
        let mut s = self.state();
        s.arrived = true;
        self.inner.1.notify_all();
        while !s.open {
            s = self.inner.1.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The gates armed on one driver.
#[derive(Debug, Default)]
pub(super) struct Gates {
    armed: AtomicBool,
    /// Call name, calls of that name still to let through, the gate.
    waiting: Mutex<Vec<(&'static str, u64, CallGate)>>,
}

impl Gates {
    /// Arms a gate on the `nth` (1-based) call of `call` from now on.
    pub(super) fn arm(&self, call: &'static str, nth: u64) -> CallGate {
        let gate = CallGate::new();
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        w.push((call, nth.max(1), gate.driver_side()));
        self.armed.store(true, Ordering::Release);
        gate
    }

    /// Before a call named `call` runs: stops it at a gate whose turn it is.
    #[inline]
    pub(super) fn pass(&self, call: &'static str) {
        if !self.armed.load(Ordering::Acquire) {
            return;
        }
        let gate = {
            let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            let mut hit = None;
            for (i, (name, left, _)) in w.iter_mut().enumerate() {
                if *name == call {
                    *left -= 1;
                    if *left == 0 {
                        hit = Some(i);
                        break;
                    }
                }
            }
            let gate = hit.map(|i| w.swap_remove(i).2);
            if w.is_empty() {
                self.armed.store(false, Ordering::Release);
            }
            gate
        };
        if let Some(g) = gate {
            g.pass();
        }
    }
}

impl Drop for CallGate {
    fn drop(&mut self) {
        if self.owner {
            self.open();
        }
    }
}
