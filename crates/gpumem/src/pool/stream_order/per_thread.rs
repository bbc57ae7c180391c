//! The per-thread default stream rule.
//!
//! The handle `CU_STREAM_PER_THREAD` names a different stream on each thread
//! (its [`StreamId`](crate::StreamId) depends on the calling thread). A pool
//! that keeps such a stream remembers the thread that handed it over; only
//! that thread may query it, record on it or synchronize it, since the same
//! handle on another thread is another stream. Other threads rely on events
//! that thread recorded, or synchronize the device.

use std::thread::ThreadId;

use crate::driver::STREAM_PER_THREAD;
use crate::stream::Stream;

/// The thread a kept stream handle means the right stream on: `None` for
/// every stream but the per-thread default one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HomeThread(Option<ThreadId>);

impl HomeThread {
    /// The home of `stream` as handed over by the calling thread.
    pub(crate) fn of(stream: &Stream) -> Self {
        Self((stream.raw() == STREAM_PER_THREAD).then(|| std::thread::current().id()))
    }

    /// True when the handle means the same stream on the calling thread.
    #[inline]
    pub(crate) fn is_current(&self) -> bool {
        self.0.is_none_or(|t| t == std::thread::current().id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sim::SimConfig;
    use crate::Device;

    #[test]
    fn only_the_per_thread_stream_is_bound_to_its_thread() {
        let device = Device::sim(SimConfig::default());
        let created = HomeThread::of(&device.create_stream().unwrap());
        let per_thread = HomeThread::of(&Stream::per_thread(device.clone()));
        assert!(created.is_current() && per_thread.is_current());
        std::thread::scope(|s| {
            s.spawn(|| {
                assert!(
                    created.is_current(),
                    "a created stream is the same everywhere"
                );
                assert!(!per_thread.is_current(), "another thread's default stream");
            });
        });
    }
}
