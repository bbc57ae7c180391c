//! `TrackingAdaptor`: remembers every outstanding allocation (pointer, bytes,
//! stream, and optionally where it was made) and checks every free against it
//! (RMM's tracking_resource_adaptor, plus bad-free detection).
//!
//! A free of a pointer that is not outstanding, a second free of a pointer, or a
//! free with a size other than the allocation's is rejected with
//! [`Error::InvalidFree`] naming the pointer, and is **not** forwarded to the
//! upstream: nothing is lost and nothing is corrupted. To tell a double free
//! from a pointer never seen, the adaptor remembers the last
//! [`TrackingAdaptor::FREED_HISTORY`] freed pointers (a pointer handed out
//! again leaves that history).
//!
//! [`TrackingAdaptor::leak_report`] describes what is outstanding; when the
//! adaptor drops with allocations outstanding, the report is logged as a
//! warning.
//!
//! Fast path: one hash-map insert (allocate) or lookup and remove (free) under
//! one mutex. Capturing backtraces ([`TrackingAdaptor::with_backtraces`]) costs
//! microseconds per allocation: a debugging tool.

use std::backtrace::Backtrace;
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::device::Device;
use crate::driver::{DevicePtr, RawStream};
use crate::resource::{MemoryResource, Properties};
use crate::stream::{Stream, StreamId};
use crate::{check_alignment, Error, FreeError, Result};

/// One outstanding allocation.
#[derive(Debug, Clone)]
pub struct Allocation {
    /// The pointer handed out.
    pub ptr: DevicePtr,
    /// The bytes requested.
    pub bytes: usize,
    /// The alignment requested.
    pub alignment: usize,
    /// The stream it was allocated on (ordering key).
    pub stream: StreamId,
    /// The stream's raw handle.
    pub raw_stream: RawStream,
    /// Where it was allocated, when backtraces are enabled.
    pub backtrace: Option<Arc<Backtrace>>,
}

#[derive(Default)]
struct Table {
    live: HashMap<u64, Allocation>,
    live_bytes: usize,
    /// Recently freed pointers → the generation they were freed at.
    freed: HashMap<u64, u64>,
    freed_order: VecDeque<(u64, u64)>,
    generation: u64,
}

impl Table {
    fn remember_freed(&mut self, ptr: u64) {
        self.generation += 1;
        self.freed.insert(ptr, self.generation);
        self.freed_order.push_back((ptr, self.generation));
        while self.freed_order.len() > TrackingAdaptor::<()>::FREED_HISTORY {
            if let Some((p, g)) = self.freed_order.pop_front() {
                if self.freed.get(&p) == Some(&g) {
                    self.freed.remove(&p);
                }
            }
        }
    }
}

/// A resource that tracks outstanding allocations and rejects bad frees.
pub struct TrackingAdaptor<U> {
    upstream: U,
    backtraces: bool,
    table: Mutex<Table>,
}

impl<U> TrackingAdaptor<U> {
    /// How many freed pointers are remembered to recognise double frees.
    pub const FREED_HISTORY: usize = 4096;
}

impl<U: std::fmt::Debug> std::fmt::Debug for TrackingAdaptor<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackingAdaptor")
            .field("upstream", &self.upstream)
            .field("backtraces", &self.backtraces)
            .finish_non_exhaustive()
    }
}

impl<U: MemoryResource> TrackingAdaptor<U> {
    /// Wraps `upstream`, without backtraces.
    pub fn new(upstream: U) -> Self {
        Self::with_backtraces(upstream, false)
    }

    /// Wraps `upstream`, capturing a backtrace at every allocation when
    /// `backtraces` is true (regardless of `RUST_BACKTRACE`).
    pub fn with_backtraces(upstream: U, backtraces: bool) -> Self {
        Self {
            upstream,
            backtraces,
            table: Mutex::new(Table::default()),
        }
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// The outstanding allocations, in address order.
    pub fn outstanding(&self) -> Vec<Allocation> {
        let mut v: Vec<_> = self.lock().live.values().cloned().collect();
        v.sort_by_key(|a| a.ptr.0);
        v
    }

    /// Number of outstanding allocations.
    pub fn outstanding_count(&self) -> usize {
        self.lock().live.len()
    }

    /// Bytes outstanding (as requested).
    pub fn outstanding_bytes(&self) -> usize {
        self.lock().live_bytes
    }

    /// A human-readable description of what is outstanding: one line per
    /// allocation (pointer, bytes, stream) and its backtrace when captured.
    pub fn leak_report(&self) -> String {
        report(&self.outstanding())
    }
}

fn report(outstanding: &[Allocation]) -> String {
    let bytes: usize = outstanding.iter().map(|a| a.bytes).sum();
    let mut s = format!(
        "TrackingAdaptor: {} allocation(s) outstanding, {} bytes\n",
        outstanding.len(),
        bytes
    );
    for a in outstanding {
        let _ = writeln!(
            s,
            "  {:#x}: {} bytes, alignment {}, stream {:#x} (id {})",
            a.ptr.0, a.bytes, a.alignment, a.raw_stream, a.stream.0
        );
        if let Some(bt) = &a.backtrace {
            for line in bt.to_string().lines() {
                let _ = writeln!(s, "      {line}");
            }
        }
    }
    s
}

impl<U> TrackingAdaptor<U> {
    fn lock(&self) -> MutexGuard<'_, Table> {
        // Each operation leaves the table consistent before it can panic.
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<U: MemoryResource> MemoryResource for TrackingAdaptor<U> {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        check_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        let backtrace = self
            .backtraces
            .then(|| Arc::new(Backtrace::force_capture()));
        let ptr = self.upstream.allocate(bytes, alignment, stream)?;
        let mut t = self.lock();
        t.freed.remove(&ptr.0);
        let previous = t.live.insert(
            ptr.0,
            Allocation {
                ptr,
                bytes,
                alignment,
                stream: stream.id(),
                raw_stream: stream.raw(),
                backtrace,
            },
        );
        t.live_bytes += bytes;
        if let Some(p) = previous {
            // The upstream handed out a live pointer twice: keep the newer
            // record, and the byte count honest.
            t.live_bytes -= p.bytes;
        }
        Ok(ptr)
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
        crate::error::check_alignment(alignment)?;
        let record = {
            let mut t = self.lock();
            match t.live.get(&ptr.0) {
                None => {
                    let reason = if t.freed.contains_key(&ptr.0) {
                        FreeError::DoubleFree
                    } else {
                        FreeError::Unknown
                    };
                    return Err(Error::InvalidFree { ptr: ptr.0, reason });
                }
                Some(a) if a.bytes != bytes => {
                    return Err(Error::InvalidFree {
                        ptr: ptr.0,
                        reason: FreeError::SizeMismatch {
                            allocated: a.bytes,
                            freed: bytes,
                        },
                    });
                }
                Some(_) => {}
            }
            let record = t.live.remove(&ptr.0);
            t.live_bytes -= bytes;
            record
        };
        match self.upstream.deallocate(ptr, bytes, alignment, stream) {
            Ok(()) => {
                self.lock().remember_freed(ptr.0);
                Ok(())
            }
            Err(e) => {
                // The upstream still holds the memory: it stays outstanding.
                if let Some(r) = record {
                    let mut t = self.lock();
                    t.live_bytes += r.bytes;
                    t.live.insert(ptr.0, r);
                }
                Err(e)
            }
        }
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

impl<U> Drop for TrackingAdaptor<U> {
    fn drop(&mut self) {
        // Logging touches no driver, so this runs at process exit too.
        let t = self.lock();
        if t.live.is_empty() {
            return;
        }
        let mut v: Vec<_> = t.live.values().cloned().collect();
        drop(t);
        v.sort_by_key(|a| a.ptr.0);
        log::warn!("{}", report(&v).trim_end());
    }
}
