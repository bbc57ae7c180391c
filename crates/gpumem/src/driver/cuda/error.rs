//! Turning a `CUresult` into an [`Error`]: the one place that knows the mapping.
//!
//! - `CUDA_SUCCESS` is `Ok`.
//! - `CUDA_ERROR_OUT_OF_MEMORY` from an allocation call is
//!   [`Error::OutOfMemory`] carrying the requested bytes and the device.
//! - `CUDA_ERROR_NOT_SUPPORTED` is [`Error::Unsupported`] naming the call: the
//!   device or driver lacks the feature (an IPC handle type, managed pools...).
//! - The stream-capture codes (`CUDA_ERROR_STREAM_CAPTURE_*`,
//!   `CUDA_ERROR_CAPTURED_EVENT`) are [`Error::StreamCapture`].
//! - Everything else is [`Error::Driver`] with the call, the code and the name
//!   `cuGetErrorName` gives (or the binding's variant name, identical, when the
//!   library is not loaded).

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::sys::{self, CUresult};

use crate::{Error, OomInfo, Result};

/// Set once the driver library is loaded and has every symbol we call, so that
/// [`error_name`] may call `cuGetErrorName`.
static LIB_READY: AtomicBool = AtomicBool::new(false);

pub(super) fn mark_library_ready() {
    LIB_READY.store(true, Ordering::Release);
}

/// The name of a `CUresult`, such as `CUDA_ERROR_INVALID_VALUE`.
///
/// Asks the driver (`cuGetErrorName`) when it is loaded; otherwise, or if the
/// driver does not know the code, uses the binding's name for it, which is the
/// same string.
pub fn error_name(res: CUresult) -> String {
    if LIB_READY.load(Ordering::Acquire) {
        let mut p: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: LIB_READY is set only after the library was found and
        // cuGetErrorName resolved, so the call cannot panic on a missing symbol;
        // `p` is a valid out-pointer for the duration of the call.
        let r = unsafe { sys::cuGetErrorName(res, &mut p) };
        if r == CUresult::CUDA_SUCCESS && !p.is_null() {
            // SAFETY: on success the driver sets `p` to a static NUL-terminated
            // string that lives for the whole process.
            let s = unsafe { CStr::from_ptr(p) };
            return s.to_string_lossy().into_owned();
        }
    }
    format!("{res:?}")
}

/// The error for a failed call that is not an allocation.
pub(super) fn to_error(res: CUresult, call: &'static str) -> Error {
    if crate::fork::in_forked_child() {
        // The driver's code would only puzzle: say why nothing works here.
        return crate::fork::forked_error();
    }
    match res {
        CUresult::CUDA_ERROR_NOT_SUPPORTED => Error::Unsupported {
            feature: format!(
                "{call}: not supported by this device or driver (CUDA_ERROR_NOT_SUPPORTED)"
            ),
        },
        _ => Error::from_driver(call, res as i32, error_name(res)),
    }
}

/// `Ok` on success, else [`to_error`].
#[inline]
pub(super) fn check(res: CUresult, call: &'static str) -> Result<()> {
    if res == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(to_error(res, call))
    }
}

/// Like [`check`] for an allocation call: out-of-memory becomes
/// [`Error::OutOfMemory`] with `requested` bytes and the device `device` names
/// (a closure, so that finding the device costs nothing on success).
#[inline]
pub(super) fn check_alloc(
    res: CUresult,
    call: &'static str,
    requested: usize,
    device: impl FnOnce() -> Option<u32>,
) -> Result<()> {
    match res {
        CUresult::CUDA_SUCCESS => Ok(()),
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(Error::oom_with(OomInfo {
            requested,
            device: device(),
            ..Default::default()
        })),
        _ => Err(to_error(res, call)),
    }
}

/// `ptr + bytes` must not wrap: the driver would read it as a range crossing
/// the end of the address space.
#[inline]
pub(super) fn check_range(ptr: u64, bytes: usize, call: &'static str) -> Result<()> {
    match ptr.checked_add(bytes as u64) {
        Some(_) => Ok(()),
        None => Err(Error::InvalidArgument(format!(
            "{call}: range {ptr:#x} + {bytes} bytes overflows the address space"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn success_is_ok() {
        assert_eq!(check(CUresult::CUDA_SUCCESS, "cuMemFree"), Ok(()));
        assert_eq!(
            check_alloc(CUresult::CUDA_SUCCESS, "cuMemAlloc", 1, || Some(0)),
            Ok(())
        );
    }

    #[test]
    fn oom_from_allocation_carries_requested_bytes_and_device() {
        let e = check_alloc(
            CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            "cuMemAlloc",
            1 << 50,
            || Some(3),
        )
        .unwrap_err();
        let info = e.oom_info().expect("OutOfMemory");
        assert_eq!(info.requested, 1 << 50);
        assert_eq!(info.device, Some(3));
        assert_eq!(info.reserved, None);
    }

    #[test]
    fn oom_from_a_non_allocation_call_is_a_driver_error() {
        let e = check(CUresult::CUDA_ERROR_OUT_OF_MEMORY, "cuMemPoolTrimTo").unwrap_err();
        assert_eq!(
            e,
            Error::Driver {
                call: "cuMemPoolTrimTo",
                code: 2,
                name: "CUDA_ERROR_OUT_OF_MEMORY".into()
            }
        );
    }

    #[test]
    fn not_supported_is_unsupported_naming_the_call() {
        for e in [
            check(CUresult::CUDA_ERROR_NOT_SUPPORTED, "cuMemPoolCreate").unwrap_err(),
            check_alloc(CUresult::CUDA_ERROR_NOT_SUPPORTED, "cuMemCreate", 8, || {
                None
            })
            .unwrap_err(),
        ] {
            match e {
                Error::Unsupported { feature } => {
                    assert!(feature.starts_with("cuMem"), "{feature}");
                    assert!(feature.contains("CUDA_ERROR_NOT_SUPPORTED"), "{feature}");
                }
                other => panic!("expected Unsupported, got {other:?}"),
            }
        }
    }

    #[test]
    fn capture_failures_are_stream_capture_errors() {
        for res in [
            CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
            CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            CUresult::CUDA_ERROR_CAPTURED_EVENT,
            CUresult::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
        ] {
            let e = check(res, "cuMemAlloc").unwrap_err();
            assert!(
                matches!(&e, Error::StreamCapture { call: "cuMemAlloc", code, .. } if *code == res as i32),
                "{e:?}"
            );
        }
    }

    #[test]
    fn generic_failure_is_driver_error_with_code_and_name() {
        let e = check(CUresult::CUDA_ERROR_INVALID_VALUE, "cuMemAlloc").unwrap_err();
        assert_eq!(
            e,
            Error::Driver {
                call: "cuMemAlloc",
                code: 1,
                name: "CUDA_ERROR_INVALID_VALUE".into()
            }
        );
        let e = check_alloc(
            CUresult::CUDA_ERROR_INVALID_CONTEXT,
            "cuMemAlloc",
            8,
            || None,
        )
        .unwrap_err();
        assert!(
            matches!(&e, Error::Driver { code: 201, name, .. } if name == "CUDA_ERROR_INVALID_CONTEXT"),
            "{e:?}"
        );
        assert!(e.to_string().contains("cuMemAlloc"));
    }

    #[test]
    fn error_names_match_the_c_names() {
        assert_eq!(
            error_name(CUresult::CUDA_ERROR_NO_DEVICE),
            "CUDA_ERROR_NO_DEVICE"
        );
        assert_eq!(
            error_name(CUresult::CUDA_ERROR_NOT_READY),
            "CUDA_ERROR_NOT_READY"
        );
    }

    #[test]
    fn wrapping_ranges_are_rejected() {
        assert!(check_range(u64::MAX - 10, 5, "cuMemsetD8Async").is_ok());
        assert!(matches!(
            check_range(u64::MAX - 10, 11, "cuMemsetD8Async"),
            Err(Error::InvalidArgument(_))
        ));
    }
}
