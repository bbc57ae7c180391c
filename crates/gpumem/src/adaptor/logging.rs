//! `LoggingAdaptor`: writes every allocation and free as one line of RMM's CSV
//! log (RMM's logging_resource_adaptor), byte-compatible with the logs RMM
//! writes, so RMM's replay tools and gpumem's replay read it alike:
//!
//! ```text
//! Thread,Time,Action,Pointer,Size,Stream
//! 441,17:01:27.901355,allocate,0x7f149a800000,37632,0x55d67d9ebae0
//! 441,17:01:27.901412,free,0x7f149a800000,37632,0x55d67d9ebae0
//! ```
//!
//! - Thread: the operating-system thread id in decimal (what RMM's logger
//!   prints: `gettid()` on Linux; a process-unique number elsewhere).
//! - Time: wall-clock time of day `HH:MM:SS.ffffff`, in UTC (RMM prints local
//!   time; UTC needs no time-zone database and orders the same within a day).
//! - Action: `allocate`, `allocate failure` or `free`.
//! - Pointer and Stream: lowercase hex with `0x`, no padding (`0x0` for a
//!   failed allocation and for the legacy default stream), as RMM's `fmt::ptr`.
//! - Size: the bytes requested, in decimal.
//!
//! As in RMM, a free is logged before it is forwarded, and any upstream error
//! on allocation is logged as `allocate failure`. The log records the calls
//! made: a free the upstream refuses (a bad free) is in it too, as a `free`
//! row (a replay skips it when its pointer is not live). Zero-byte requests and
//! requests with an invalid alignment never reach the upstream and are not
//! logged.
//!
//! Output goes to a file given to the constructor or named by the
//! `GPUMEM_LOG_FILE` environment variable, or to any writer. It is buffered
//! (64 KiB) and flushed by [`LoggingAdaptor::flush`], on drop, and at process
//! exit (so an adaptor kept in a `static` loses nothing). A failed write does
//! not fail the allocation; the first such error is returned by the next
//! [`LoggingAdaptor::flush`].
//!
//! Fast path: one line formatted straight into the buffer under one mutex; a
//! system call only when the buffer fills.

use std::fmt;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::device::Device;
use crate::driver::{DevicePtr, RawStream};
use crate::exit::{self, AtExit};
use crate::resource::{MemoryResource, Properties};
use crate::stream::Stream;
use crate::{check_alignment, Error, Result};

/// The first line of every log.
pub const LOG_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// Environment variable naming the log file for [`LoggingAdaptor::from_env`].
pub const LOG_FILE_ENV: &str = "GPUMEM_LOG_FILE";

const BUFFER_BYTES: usize = 64 << 10;

/// What a log line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogAction {
    /// A successful allocation.
    Allocate,
    /// An allocation the upstream refused.
    AllocateFailure,
    /// A free.
    Free,
}

impl LogAction {
    /// The action as the log spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            LogAction::Allocate => "allocate",
            LogAction::AllocateFailure => "allocate failure",
            LogAction::Free => "free",
        }
    }
}

impl fmt::Display for LogAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One log line, without the trailing newline: `thread` is the OS thread id,
/// `since_epoch` the wall-clock time since the Unix epoch (printed as the UTC
/// time of day).
pub fn format_log_line(
    thread: u64,
    since_epoch: Duration,
    action: LogAction,
    ptr: DevicePtr,
    bytes: usize,
    stream: RawStream,
) -> String {
    Line {
        thread,
        since_epoch,
        action,
        ptr,
        bytes,
        stream,
    }
    .to_string()
}

struct Line {
    thread: u64,
    since_epoch: Duration,
    action: LogAction,
    ptr: DevicePtr,
    bytes: usize,
    stream: RawStream,
}

impl fmt::Display for Line {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let day = self.since_epoch.as_secs() % 86_400;
        write!(
            f,
            "{},{:02}:{:02}:{:02}.{:06},{},{:#x},{},{:#x}",
            self.thread,
            day / 3600,
            day / 60 % 60,
            day % 60,
            self.since_epoch.subsec_micros(),
            self.action.as_str(),
            self.ptr.0,
            self.bytes,
            self.stream
        )
    }
}

/// The calling thread's operating-system id, as RMM's logger prints it.
fn os_thread_id() -> u64 {
    thread_local! {
        static TID: u64 = read_os_thread_id();
    }
    TID.with(|t| *t)
}

fn read_os_thread_id() -> u64 {
    // Linux: /proc/thread-self links to "<pid>/task/<tid>" (no FFI needed).
    if let Ok(target) = std::fs::read_link("/proc/thread-self") {
        if let Some(tid) = target
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<u64>().ok())
        {
            return tid;
        }
    }
    // Elsewhere: a process-unique number per thread.
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

struct Out {
    writer: BufWriter<Box<dyn Write + Send>>,
    error: Option<String>,
}

struct Sink {
    out: Mutex<Out>,
    path: Option<PathBuf>,
}

impl Sink {
    fn lock(&self) -> MutexGuard<'_, Out> {
        // A panic mid-write leaves at worst a partial line; keep logging.
        self.out.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(
        &self,
        action: LogAction,
        ptr: DevicePtr,
        bytes: usize,
        stream: RawStream,
        flush: bool,
    ) {
        let line = Line {
            thread: os_thread_id(),
            since_epoch: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default(),
            action,
            ptr,
            bytes,
            stream,
        };
        let mut out = self.lock();
        let mut r = writeln!(out.writer, "{line}");
        if flush && r.is_ok() {
            r = out.writer.flush();
        }
        if let Err(e) = r {
            if out.error.is_none() {
                out.error = Some(e.to_string());
            }
        }
    }

    fn flush(&self) -> Result<()> {
        let mut out = self.lock();
        let r = out.writer.flush();
        let earlier = out.error.take();
        let what = || match &self.path {
            Some(p) => format!("log file {}", p.display()),
            None => "log writer".to_string(),
        };
        if let Some(e) = earlier {
            return Err(Error::Io(format!("writing {}: {e}", what())));
        }
        r.map_err(|e| Error::Io(format!("flushing {}: {e}", what())))
    }
}

impl AtExit for Sink {
    fn at_exit(&self) {
        // Never block at exit: a thread holding the lock is still logging.
        if let Ok(mut out) = self.out.try_lock() {
            let _ = out.writer.flush();
        }
    }
}

/// A resource that logs every allocation and free in RMM's CSV format.
pub struct LoggingAdaptor<U> {
    upstream: U,
    sink: Arc<Sink>,
    auto_flush: bool,
}

impl<U: fmt::Debug> fmt::Debug for LoggingAdaptor<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoggingAdaptor")
            .field("upstream", &self.upstream)
            .field("path", &self.sink.path)
            .field("auto_flush", &self.auto_flush)
            .finish()
    }
}

impl<U: MemoryResource> LoggingAdaptor<U> {
    /// Logs to the file at `path` (created or truncated), header first.
    pub fn new(upstream: U, path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::create(path)
            .map_err(|e| Error::Io(format!("cannot create log file {}: {e}", path.display())))?;
        Self::build(upstream, Box::new(file), Some(path.to_path_buf()))
    }

    /// Logs to the file named by `GPUMEM_LOG_FILE`;
    /// [`Error::InvalidArgument`] when it is unset or empty.
    pub fn from_env(upstream: U) -> Result<Self> {
        match std::env::var_os(LOG_FILE_ENV) {
            Some(p) if !p.is_empty() => Self::new(upstream, PathBuf::from(p)),
            _ => Err(Error::InvalidArgument(format!(
                "{LOG_FILE_ENV} is not set: no log file to write"
            ))),
        }
    }

    /// Logs to `writer`, header first.
    pub fn with_writer(upstream: U, writer: impl Write + Send + 'static) -> Result<Self> {
        Self::build(upstream, Box::new(writer), None)
    }

    fn build(upstream: U, writer: Box<dyn Write + Send>, path: Option<PathBuf>) -> Result<Self> {
        let mut writer = BufWriter::with_capacity(BUFFER_BYTES, writer);
        writeln!(writer, "{LOG_HEADER}")
            .map_err(|e| Error::Io(format!("cannot write the log header: {e}")))?;
        let sink = Arc::new(Sink {
            out: Mutex::new(Out {
                writer,
                error: None,
            }),
            path,
        });
        let hook: Arc<dyn AtExit> = sink.clone();
        exit::run_at_exit(Arc::downgrade(&hook));
        Ok(Self {
            upstream,
            sink,
            auto_flush: false,
        })
    }

    /// Flushes after every line when `on` (slow: a system call per line; for
    /// logs that must survive a crash).
    pub fn with_auto_flush(mut self, on: bool) -> Self {
        self.auto_flush = on;
        self
    }

    /// The log file, when logging to a file.
    pub fn path(&self) -> Option<&Path> {
        self.sink.path.as_deref()
    }

    /// Writes out buffered lines. Returns the first write error since the last
    /// flush, if any.
    pub fn flush(&self) -> Result<()> {
        self.sink.flush()
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }
}

impl<U: MemoryResource> MemoryResource for LoggingAdaptor<U> {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        check_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let r = self.upstream.allocate(bytes, alignment, stream);
        let (action, ptr) = match &r {
            Ok(p) => (LogAction::Allocate, *p),
            Err(_) => (LogAction::AllocateFailure, DevicePtr::NULL),
        };
        self.sink
            .write(action, ptr, bytes, stream.raw(), self.auto_flush);
        r
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        self.sink
            .write(LogAction::Free, ptr, bytes, stream.raw(), self.auto_flush);
        self.upstream.deallocate(ptr, bytes, alignment, stream)
    }

    fn device(&self) -> &Device {
        self.upstream.device()
    }

    fn properties(&self) -> Properties {
        self.upstream.properties()
    }

    fn check_access(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.upstream.check_access(ptr, bytes)
    }
}

impl<U> Drop for LoggingAdaptor<U> {
    fn drop(&mut self) {
        // Only a file is touched, never the driver: safe at exit too.
        let _ = self.sink.lock().writer.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_look_like_rmm() {
        // 17:01:27.901355 UTC on some day.
        let t = Duration::new(20_000 * 86_400 + 17 * 3600 + 60 + 27, 901_355_999);
        let line = format_log_line(
            441,
            t,
            LogAction::Allocate,
            DevicePtr(0x7f14_9a80_0000),
            37632,
            0x55d6_7d9e_bae0,
        );
        assert_eq!(
            line,
            "441,17:01:27.901355,allocate,0x7f149a800000,37632,0x55d67d9ebae0"
        );
        let fail = format_log_line(
            7,
            Duration::new(5, 42_000),
            LogAction::AllocateFailure,
            DevicePtr::NULL,
            1 << 50,
            0,
        );
        assert_eq!(
            fail,
            "7,00:00:05.000042,allocate failure,0x0,1125899906842624,0x0"
        );
        assert_eq!(LogAction::Free.to_string(), "free");
    }

    #[test]
    fn thread_ids_are_stable_per_thread_and_distinct_across() {
        let a = os_thread_id();
        assert_eq!(a, os_thread_id());
        let b = std::thread::spawn(os_thread_id).join().unwrap();
        assert_ne!(a, b);
    }
}
