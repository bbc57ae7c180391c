//! Streams and events: thin calls, each a single driver call once some context
//! is current (a TLS read when one already is).
//!
//! Raw handles are the driver's pointers as integers; 0, `CU_STREAM_LEGACY`
//! (1) and `CU_STREAM_PER_THREAD` (2) pass straight through as the driver's
//! own special handles.

use cudarc::driver::sys::{self, CUevent_flags, CUresult, CUstream_flags};

use super::error::{check, to_error};
use super::CudaDriver;
use crate::driver::{RawEvent, RawStream, STREAM_LEGACY, STREAM_PER_THREAD};
use crate::{Error, Result};

#[inline]
pub(super) fn cu_stream(s: RawStream) -> sys::CUstream {
    s as usize as sys::CUstream
}

#[inline]
fn cu_event(e: RawEvent) -> sys::CUevent {
    e as usize as sys::CUevent
}

/// `Ok(true)` on success, `Ok(false)` on `CUDA_ERROR_NOT_READY`.
#[inline]
fn ready(res: CUresult, call: &'static str) -> Result<bool> {
    match res {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        _ => Err(to_error(res, call)),
    }
}

fn null_event(call: &str) -> Error {
    Error::InvalidArgument(format!("{call}: null event handle"))
}

impl CudaDriver {
    pub(super) fn stream_create_impl(&self, device: u32, non_blocking: bool) -> Result<RawStream> {
        let _bound = self.bind(device)?;
        let flags = if non_blocking {
            CUstream_flags::CU_STREAM_NON_BLOCKING
        } else {
            CUstream_flags::CU_STREAM_DEFAULT
        };
        let mut s: sys::CUstream = std::ptr::null_mut();
        check(
            // SAFETY: `s` is a valid out-pointer; `device`'s context is current.
            unsafe { sys::cuStreamCreate(&mut s, flags as u32) },
            "cuStreamCreate",
        )?;
        Ok(s as usize as RawStream)
    }

    /// # Safety
    /// As [`crate::driver::Driver::stream_destroy`].
    pub(super) unsafe fn stream_destroy_impl(&self, stream: RawStream) -> Result<()> {
        if matches!(stream, 0 | STREAM_LEGACY | STREAM_PER_THREAD) {
            return Err(Error::InvalidArgument(format!(
                "cuStreamDestroy: stream {stream:#x} is a default stream"
            )));
        }
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: a live stream, not a default one, that the caller owns
            // and destroys once (this function's contract).
            unsafe { sys::cuStreamDestroy_v2(cu_stream(stream)) },
            "cuStreamDestroy",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::stream_synchronize`].
    pub(super) unsafe fn stream_synchronize_impl(&self, stream: RawStream) -> Result<()> {
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: a live stream (this function's contract).
            unsafe { sys::cuStreamSynchronize(cu_stream(stream)) },
            "cuStreamSynchronize",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::stream_query`].
    pub(super) unsafe fn stream_query_impl(&self, stream: RawStream) -> Result<bool> {
        let _bound = self.ensure_context()?;
        ready(
            // SAFETY: a live stream (this function's contract).
            unsafe { sys::cuStreamQuery(cu_stream(stream)) },
            "cuStreamQuery",
        )
    }

    pub(super) fn event_create_impl(&self, device: u32) -> Result<RawEvent> {
        let _bound = self.bind(device)?;
        let mut e: sys::CUevent = std::ptr::null_mut();
        check(
            // SAFETY: `e` is a valid out-pointer; `device`'s context is current.
            unsafe { sys::cuEventCreate(&mut e, CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) },
            "cuEventCreate",
        )?;
        Ok(e as usize as RawEvent)
    }

    /// # Safety
    /// As [`crate::driver::Driver::event_destroy`].
    pub(super) unsafe fn event_destroy_impl(&self, event: RawEvent) -> Result<()> {
        if event == 0 {
            return Err(null_event("cuEventDestroy"));
        }
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: a live event the caller owns and destroys once (this
            // function's contract).
            unsafe { sys::cuEventDestroy_v2(cu_event(event)) },
            "cuEventDestroy",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::event_record`].
    pub(super) unsafe fn event_record_impl(
        &self,
        event: RawEvent,
        stream: RawStream,
    ) -> Result<()> {
        if event == 0 {
            return Err(null_event("cuEventRecord"));
        }
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: a live event and stream (this function's contract).
            unsafe { sys::cuEventRecord(cu_event(event), cu_stream(stream)) },
            "cuEventRecord",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::event_query`].
    pub(super) unsafe fn event_query_impl(&self, event: RawEvent) -> Result<bool> {
        if event == 0 {
            return Err(null_event("cuEventQuery"));
        }
        let _bound = self.ensure_context()?;
        ready(
            // SAFETY: a live event (this function's contract).
            unsafe { sys::cuEventQuery(cu_event(event)) },
            "cuEventQuery",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::event_synchronize`].
    pub(super) unsafe fn event_synchronize_impl(&self, event: RawEvent) -> Result<()> {
        if event == 0 {
            return Err(null_event("cuEventSynchronize"));
        }
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: a live event (this function's contract).
            unsafe { sys::cuEventSynchronize(cu_event(event)) },
            "cuEventSynchronize",
        )
    }

    /// # Safety
    /// As [`crate::driver::Driver::stream_wait_event`].
    pub(super) unsafe fn stream_wait_event_impl(
        &self,
        stream: RawStream,
        event: RawEvent,
    ) -> Result<()> {
        if event == 0 {
            return Err(null_event("cuStreamWaitEvent"));
        }
        let _bound = self.ensure_context()?;
        check(
            // SAFETY: a live stream and event (this function's contract),
            // flags 0 (the only portable value).
            unsafe { sys::cuStreamWaitEvent(cu_stream(stream), cu_event(event), 0) },
            "cuStreamWaitEvent",
        )
    }

    /// The device a stream belongs to (`cuStreamGetDevice`, CUDA 12.8+); for the
    /// default streams, the device current on this thread.
    ///
    /// # Safety
    /// `stream` is live (see [`crate::driver`]).
    pub unsafe fn stream_device(&self, stream: RawStream) -> Result<u32> {
        let _bound = self.ensure_context()?;
        if !self.has_stream_get_device {
            return Err(Error::unsupported(
                "cuStreamGetDevice: needs a CUDA 12.8 or newer driver",
            ));
        }
        let mut dev: sys::CUdevice = 0;
        check(
            // SAFETY: the symbol was found at load; `dev` is a valid
            // out-pointer; the stream is live (this function's contract).
            unsafe { sys::cuStreamGetDevice(cu_stream(stream), &mut dev) },
            "cuStreamGetDevice",
        )?;
        self.ordinal_of(dev)
    }

    /// The device to report in an out-of-memory error from an allocation on
    /// `stream` (error path only): the stream's device, else the thread's.
    ///
    /// # Safety
    /// `stream` is live.
    pub(super) unsafe fn oom_device(&self, stream: RawStream) -> Option<u32> {
        // SAFETY: this function's contract.
        unsafe { self.stream_device(stream) }
            .ok()
            .or_else(|| self.thread_device())
    }
}
