//! The one error type of gpumem.
//!
//! Every variant carries what a person needs to act on it: the bytes asked for,
//! the device, the driver's code and name, the feature that is missing.

use std::fmt;

/// Result alias used throughout gpumem.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What an allocator knew when it ran out of memory.
///
/// Fields an allocator cannot know are `None` (a plain device resource has no
/// notion of a largest free block, for instance).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OomInfo {
    /// Bytes the caller asked for.
    pub requested: usize,
    /// Device ordinal, when the memory is device memory.
    pub device: Option<u32>,
    /// Bytes the allocator holds from its upstream (or the driver).
    pub reserved: Option<usize>,
    /// Bytes handed out to callers and not yet freed.
    pub live: Option<usize>,
    /// Largest block the allocator could have handed out without growing.
    pub largest_free: Option<usize>,
    /// A configured byte limit that the request would have exceeded.
    pub limit: Option<usize>,
}

impl OomInfo {
    /// An `OomInfo` that only knows the requested size.
    pub fn requested(requested: usize) -> Self {
        Self {
            requested,
            ..Self::default()
        }
    }

    /// Sets the device ordinal.
    pub fn on_device(mut self, device: u32) -> Self {
        self.device = Some(device);
        self
    }
}

impl fmt::Display for OomInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "requested {} bytes", self.requested)?;
        if let Some(d) = self.device {
            write!(f, " on device {d}")?;
        }
        if let Some(l) = self.limit {
            write!(f, ", limit {l} bytes")?;
        }
        if let Some(r) = self.reserved {
            write!(f, ", reserved {r} bytes")?;
        }
        if let Some(l) = self.live {
            write!(f, ", live {l} bytes")?;
        }
        if let Some(b) = self.largest_free {
            write!(f, ", largest free block {b} bytes")?;
        }
        Ok(())
    }
}

/// The allocations that kept memory from being given back
/// ([`Error::InUse`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LiveAllocations {
    /// What refused, such as `PinnedPool`.
    pub what: &'static str,
    /// How many allocations are live.
    pub count: usize,
    /// Their bytes, as requested.
    pub bytes: usize,
    /// The first few, lowest address first: (pointer, requested bytes).
    pub first: Vec<(u64, usize)>,
}

impl fmt::Display for LiveAllocations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.count == 1 { "" } else { "s" };
        write!(
            f,
            "{} still has {} live allocation{s} ({} bytes): ",
            self.what, self.count, self.bytes
        )?;
        for (i, (ptr, bytes)) in self.first.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{ptr:#x}+{bytes}")?;
        }
        if self.count > self.first.len() {
            write!(f, " and {} more", self.count - self.first.len())?;
        }
        Ok(())
    }
}

/// Every error gpumem returns. More kinds may come in later versions: match
/// with a `_` arm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request cannot be satisfied: the device, a limit or a pool is exhausted.
    #[error("out of memory: {0}")]
    OutOfMemory(Box<OomInfo>),

    /// The alignment is zero or not a power of two.
    #[error("alignment {alignment} is not a power of two")]
    BadAlignment {
        /// The alignment asked for.
        alignment: usize,
    },

    /// The alignment is a power of two but larger than this resource serves.
    #[error("alignment {alignment} exceeds the {max} bytes this resource supports (wrap it in AlignedAdaptor)")]
    AlignmentTooLarge {
        /// The alignment asked for.
        alignment: usize,
        /// The largest alignment the resource supports.
        max: usize,
    },

    /// A driver call failed.
    #[error("CUDA driver call {call} failed: {name} ({code})")]
    Driver {
        /// The driver function, such as `cuMemAlloc`.
        call: &'static str,
        /// The numeric `CUresult`.
        code: i32,
        /// The `CUresult` name, such as `CUDA_ERROR_INVALID_VALUE`.
        name: String,
    },

    /// A driver call that a stream capture refused, or that failed because
    /// such a refusal broke the capture it belongs to: the `CUresult` codes
    /// `CUDA_ERROR_STREAM_CAPTURE_*` (900 to 906, 908) and
    /// `CUDA_ERROR_CAPTURED_EVENT` (907). See [`crate::driver::CaptureMode`]
    /// for which calls a capture refuses.
    #[error("CUDA driver call {call} is not allowed during stream capture: {name} ({code})")]
    StreamCapture {
        /// The driver function, such as `cuMemAlloc`.
        call: &'static str,
        /// The numeric `CUresult`.
        code: i32,
        /// The `CUresult` name, such as `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
        name: String,
    },

    /// No CUDA driver library could be loaded, or it has no usable device.
    #[error("no CUDA driver: {reason}")]
    NoDriver {
        /// Why the driver is unusable.
        reason: String,
    },

    /// The driver, device or resource lacks a feature.
    #[error("unsupported: {feature}")]
    Unsupported {
        /// The missing feature, such as `memory pools` or `POSIX fd IPC handles`.
        feature: String,
    },

    /// A pointer was freed that this resource did not hand out (or already took back).
    #[error("invalid free of pointer {ptr:#x}: {reason}")]
    InvalidFree {
        /// The pointer passed to deallocate.
        ptr: u64,
        /// What is wrong with it.
        reason: FreeError,
    },

    /// The device ordinal does not exist.
    #[error("device {device} does not exist ({count} devices)")]
    NoSuchDevice {
        /// The ordinal asked for.
        device: u32,
        /// How many devices there are.
        count: u32,
    },

    /// An argument is outside what the call accepts.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// Memory cannot be given back while allocations made from it are live
    /// (freeing it would leave their owners reading freed memory).
    #[error("{0}; free them first")]
    InUse(Box<LiveAllocations>),

    /// The resource or manager has been shut down.
    #[error("{0} has been shut down")]
    ShutDown(&'static str),

    /// Reading or writing a file failed (a log, a trace): what was being
    /// done and the operating system's message.
    #[error("I/O error: {0}")]
    Io(String),

    /// Memory of a [`VirtualPool`](crate::pool::VirtualPool) region that is
    /// asleep was used, or the region was asked to allocate: its physical
    /// pages are given back until it wakes.
    #[error("region {tag} is asleep: {what} (wake it first)")]
    Asleep {
        /// The region's tag.
        tag: u32,
        /// What was refused, such as `cannot copy to 0x7f0000000000+4096`.
        what: String,
    },
}

/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (900) to
/// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD` (908).
const CAPTURE_CODES: std::ops::RangeInclusive<i32> = 900..=908;

/// Why a free was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FreeError {
    /// The pointer was never handed out by this resource.
    Unknown,
    /// The pointer was already freed.
    DoubleFree,
    /// The block is owned by something safe code holds references through
    /// (a collection in pinned memory, a planned pool's layout): only its
    /// owner frees it.
    Owned,
    /// The size passed to deallocate differs from the size allocated.
    SizeMismatch {
        /// Bytes recorded at allocation.
        allocated: usize,
        /// Bytes passed to deallocate.
        freed: usize,
    },
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FreeError::Unknown => f.write_str("not allocated by this resource"),
            FreeError::DoubleFree => f.write_str("already freed (double free)"),
            FreeError::Owned => f.write_str(
                "owned by a collection or a planned pool, which frees it (safe code holds references into it)",
            ),
            FreeError::SizeMismatch { allocated, freed } => {
                write!(f, "allocated with {allocated} bytes but freed with {freed}")
            }
        }
    }
}

impl Error {
    /// An out-of-memory error that knows only the requested size.
    pub fn oom(requested: usize) -> Self {
        Error::OutOfMemory(Box::new(OomInfo::requested(requested)))
    }

    /// An out-of-memory error with full detail.
    pub fn oom_with(info: OomInfo) -> Self {
        Error::OutOfMemory(Box::new(info))
    }

    /// An unsupported-feature error.
    pub fn unsupported(feature: impl Into<String>) -> Self {
        Error::Unsupported {
            feature: feature.into(),
        }
    }

    /// True for [`Error::OutOfMemory`].
    pub fn is_oom(&self) -> bool {
        matches!(self, Error::OutOfMemory(_))
    }

    /// True for [`Error::StreamCapture`]: the call failed because of a stream
    /// capture.
    pub fn is_capture_error(&self) -> bool {
        matches!(self, Error::StreamCapture { .. })
    }

    /// The error for a failed driver call with `CUresult` `code` named `name`:
    /// [`Error::StreamCapture`] for the stream-capture codes, else
    /// [`Error::Driver`].
    pub(crate) fn from_driver(call: &'static str, code: i32, name: String) -> Self {
        if CAPTURE_CODES.contains(&code) {
            Error::StreamCapture { call, code, name }
        } else {
            Error::Driver { call, code, name }
        }
    }

    /// The out-of-memory detail, if this is an out-of-memory error.
    pub fn oom_info(&self) -> Option<&OomInfo> {
        match self {
            Error::OutOfMemory(i) => Some(i),
            _ => None,
        }
    }
}

/// Checks that `alignment` is a non-zero power of two.
#[inline]
pub fn check_alignment(alignment: usize) -> Result<()> {
    if alignment.is_power_of_two() {
        Ok(())
    } else {
        Err(Error::BadAlignment { alignment })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_message_names_every_known_number() {
        let e = Error::oom_with(OomInfo {
            requested: 1 << 50,
            device: Some(0),
            reserved: Some(4096),
            live: Some(1024),
            largest_free: Some(512),
            limit: None,
        });
        let s = e.to_string();
        assert!(s.contains("1125899906842624"), "{s}");
        assert!(s.contains("device 0") && s.contains("4096") && s.contains("512"));
        assert_eq!(e.oom_info().unwrap().requested, 1 << 50);
    }

    #[test]
    fn capture_codes_are_stream_capture_errors_and_others_driver_errors() {
        let e = Error::from_driver(
            "cuMemAlloc",
            900,
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED".into(),
        );
        assert!(e.is_capture_error(), "{e:?}");
        assert!(e.to_string().contains("cuMemAlloc"), "{e}");
        assert!(Error::from_driver("cuEventQuery", 907, String::new()).is_capture_error());
        assert!(Error::from_driver("cuStreamEndCapture", 908, String::new()).is_capture_error());
        for code in [1, 401, 899, 909] {
            let e = Error::from_driver("cuMemAlloc", code, String::new());
            assert!(matches!(e, Error::Driver { .. }), "{code}: {e:?}");
        }
    }

    #[test]
    fn alignment_must_be_power_of_two() {
        assert!(check_alignment(256).is_ok());
        assert!(check_alignment(1).is_ok());
        assert_eq!(
            check_alignment(0),
            Err(Error::BadAlignment { alignment: 0 })
        );
        assert_eq!(
            check_alignment(384),
            Err(Error::BadAlignment { alignment: 384 })
        );
    }
}
