//! Fault injection and call counting, and the `CUresult` codes the simulated
//! device reports.
//!
//! Every driver call first passes through [`Faults::on_call`], which counts it
//! under its CUDA name and fails it if a test asked for that; allocation calls
//! then pass through [`Faults::on_alloc`]. Both run before the call touches any
//! state, so a failed call changes nothing but the counters. Costs: one hash
//! lookup per call, plus a scan of the armed faults for that name.

use std::collections::HashMap;

use crate::{Error, OomInfo};

/// `CUDA_ERROR_INVALID_VALUE`.
pub(super) const INVALID_VALUE: i32 = 1;
/// `CUDA_ERROR_INVALID_DEVICE`.
pub(super) const INVALID_DEVICE: i32 = 101;
/// `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`: the two devices cannot reach each other.
pub(super) const PEER_ACCESS_UNSUPPORTED: i32 = 217;
/// `CUDA_ERROR_NOT_FOUND`.
pub(super) const NOT_FOUND: i32 = 500;
/// `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED`: what the simulator answers when a
/// device would touch another device's memory it was given no access to.
pub(super) const PEER_ACCESS_NOT_ENABLED: i32 = 705;
/// `CUDA_ERROR_INVALID_CONTEXT`.
pub(super) const INVALID_CONTEXT: i32 = 201;
/// `CUDA_ERROR_INVALID_HANDLE`.
pub(super) const INVALID_HANDLE: i32 = 400;
/// `CUDA_ERROR_ILLEGAL_STATE`.
pub(super) const ILLEGAL_STATE: i32 = 401;
/// `CUDA_ERROR_NOT_SUPPORTED`.
pub(super) const NOT_SUPPORTED: i32 = 801;
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`: not permitted while capturing.
pub(super) const CAPTURE_UNSUPPORTED: i32 = 900;
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`: the capture was broken earlier.
pub(super) const CAPTURE_INVALIDATED: i32 = 901;
/// `CUDA_ERROR_STREAM_CAPTURE_MERGE`: would merge two captures.
pub(super) const CAPTURE_MERGE: i32 = 902;
/// `CUDA_ERROR_STREAM_CAPTURE_UNMATCHED`: the capture did not begin on this stream.
pub(super) const CAPTURE_UNMATCHED: i32 = 903;
/// `CUDA_ERROR_STREAM_CAPTURE_UNJOINED`: a joined stream was not joined back.
pub(super) const CAPTURE_UNJOINED: i32 = 904;
/// `CUDA_ERROR_STREAM_CAPTURE_ISOLATION`: a dependency on uncaptured work.
pub(super) const CAPTURE_ISOLATION: i32 = 905;
/// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT`: the legacy stream would depend on a capture.
pub(super) const CAPTURE_IMPLICIT: i32 = 906;
/// `CUDA_ERROR_CAPTURED_EVENT`: the event was last recorded in a capture.
pub(super) const CAPTURED_EVENT: i32 = 907;
/// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`: ended from another thread.
pub(super) const CAPTURE_WRONG_THREAD: i32 = 908;

/// The `CUresult` name of a code, for [`Error::Driver`].
pub fn cu_result_name(code: i32) -> String {
    let s = match code {
        0 => "CUDA_SUCCESS",
        1 => "CUDA_ERROR_INVALID_VALUE",
        2 => "CUDA_ERROR_OUT_OF_MEMORY",
        3 => "CUDA_ERROR_NOT_INITIALIZED",
        4 => "CUDA_ERROR_DEINITIALIZED",
        46 => "CUDA_ERROR_DEVICES_UNAVAILABLE",
        100 => "CUDA_ERROR_NO_DEVICE",
        101 => "CUDA_ERROR_INVALID_DEVICE",
        201 => "CUDA_ERROR_INVALID_CONTEXT",
        217 => "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
        304 => "CUDA_ERROR_OPERATING_SYSTEM",
        400 => "CUDA_ERROR_INVALID_HANDLE",
        401 => "CUDA_ERROR_ILLEGAL_STATE",
        500 => "CUDA_ERROR_NOT_FOUND",
        600 => "CUDA_ERROR_NOT_READY",
        700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        704 => "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
        705 => "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
        709 => "CUDA_ERROR_CONTEXT_IS_DESTROYED",
        719 => "CUDA_ERROR_LAUNCH_FAILED",
        801 => "CUDA_ERROR_NOT_SUPPORTED",
        802 => "CUDA_ERROR_SYSTEM_NOT_READY",
        900 => "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        901 => "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        902 => "CUDA_ERROR_STREAM_CAPTURE_MERGE",
        903 => "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
        904 => "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
        905 => "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
        906 => "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
        907 => "CUDA_ERROR_CAPTURED_EVENT",
        908 => "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
        999 => "CUDA_ERROR_UNKNOWN",
        other => return format!("CUDA_ERROR_{other}"),
    };
    s.to_string()
}

/// The error a real driver call failing with `code` gives: [`Error::Driver`],
/// or [`Error::StreamCapture`] for the stream-capture codes.
pub(super) fn drv(call: &'static str, code: i32) -> Error {
    Error::from_driver(call, code, cu_result_name(code))
}

/// An out-of-memory error for `requested` bytes on `device`.
pub(super) fn oom(requested: usize, device: Option<u32>) -> Error {
    Error::oom_with(OomInfo {
        requested,
        device,
        ..OomInfo::default()
    })
}

/// Call counters and armed faults.
#[derive(Debug, Default)]
pub(super) struct Faults {
    calls: HashMap<&'static str, u64>,
    allocs: u64,
    /// Absolute allocation-call numbers that fail.
    fail_allocs: Vec<u64>,
    /// Per call name: (absolute call number, code) pairs that fail.
    fail_calls: HashMap<String, Vec<(u64, i32)>>,
}

impl Faults {
    /// Counts a call; fails it if a fault is armed for this call number.
    pub(super) fn on_call(&mut self, call: &'static str) -> Result<(), Error> {
        let n = self.calls.entry(call).or_insert(0);
        *n += 1;
        let n = *n;
        if let Some(v) = self.fail_calls.get_mut(call) {
            if let Some(i) = v.iter().position(|&(at, _)| at == n) {
                let (_, code) = v.swap_remove(i);
                return Err(drv(call, code));
            }
        }
        Ok(())
    }

    /// Counts a device allocation call; fails it with out-of-memory if armed.
    pub(super) fn on_alloc(&mut self, requested: usize, device: u32) -> Result<(), Error> {
        self.allocs += 1;
        if let Some(i) = self.fail_allocs.iter().position(|&a| a == self.allocs) {
            self.fail_allocs.swap_remove(i);
            return Err(oom(requested, Some(device)));
        }
        Ok(())
    }

    /// Arms an out-of-memory failure for the `nth` allocation call from now.
    pub(super) fn fail_nth_alloc(&mut self, nth: u64) {
        if nth > 0 {
            self.fail_allocs.push(self.allocs.saturating_add(nth));
        }
    }

    /// Arms a failure with `code` for the `nth` call of `call` from now.
    pub(super) fn fail_call(&mut self, call: &str, nth: u64, code: i32) {
        if nth == 0 {
            return;
        }
        let now = self.calls.get(call).copied().unwrap_or(0);
        self.fail_calls
            .entry(call.to_string())
            .or_default()
            .push((now.saturating_add(nth), code));
    }

    /// Calls of `call` so far.
    pub(super) fn count(&self, call: &str) -> u64 {
        self.calls.get(call).copied().unwrap_or(0)
    }

    /// Every call name counted so far with its count, sorted by name.
    pub(super) fn counts(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<_> = self.calls.iter().map(|(&k, &n)| (k, n)).collect();
        v.sort_unstable();
        v
    }

    /// Disarms every fault (counters stay).
    pub(super) fn clear(&mut self) {
        self.fail_allocs.clear();
        self.fail_calls.clear();
    }
}
