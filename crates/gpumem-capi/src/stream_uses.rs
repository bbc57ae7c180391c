//! `Tensor.record_stream` for one device: blocks used by work on streams other
//! than the one they are freed on, and their deferred frees.
//!
//! PyTorch's semantics: [`StreamUses::record`] notes that a live block is
//! also used on a stream. When the block is freed, one event is recorded on
//! each such stream (other than the freeing one, whose order the pool
//! follows anyway) and the block stays out of the pool, still *active* in the
//! statistics, until every event has completed; then it is freed into the
//! pool on the freeing stream. Completion is checked on later allocations
//! and frees ([`StreamUses::poll`]) and waited for by `empty_cache`
//! ([`StreamUses::wait_all`]).
//!
//! Cost when nothing is recorded: one atomic load per free and one per
//! allocation (the counters below); everything else runs only while some
//! block has recorded streams or a deferred free is pending. Events are
//! kept for reuse, so a steady state creates none.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use gpumem::adaptor::granular_size;
use gpumem::resource::DEFAULT_ALIGNMENT;
use gpumem::{DevicePtr, Error, Event, FreeError, Result, Stream};

use crate::stack::Stack;

/// A live block's recorded streams, and its size in the resource (to check
/// the size its free names).
struct Uses {
    block_size: usize,
    streams: Vec<Stream>,
}

/// A freed block waiting for its events.
struct Pending {
    ptr: DevicePtr,
    size: usize,
    stream: Stream,
    events: Vec<Event>,
}

#[derive(Default)]
struct Inner {
    uses: HashMap<u64, Uses>,
    pending: Vec<Pending>,
    spare_events: Vec<Event>,
}

/// The recorded streams and deferred frees of one device.
#[derive(Default)]
pub struct StreamUses {
    /// Blocks with recorded streams plus pending frees: frees look further
    /// only when non-zero.
    any: AtomicUsize,
    /// Pending frees: allocations poll only when non-zero.
    pending: AtomicUsize,
    inner: Mutex<Inner>,
}

/// A deferred free the resource refused when it was finally made (its size
/// was not the allocation's): the block stays live.
#[derive(Debug)]
pub struct Refused {
    /// The block.
    pub ptr: DevicePtr,
    /// The size its free named.
    pub size: usize,
    /// Why the resource refused it.
    pub error: Error,
}

impl StreamUses {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True when a free must look here (one atomic load).
    #[inline]
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed) != 0
    }

    /// True when deferred frees are pending (one atomic load).
    #[inline]
    pub fn has_pending(&self) -> bool {
        self.pending.load(Ordering::Relaxed) != 0
    }

    /// Deferred frees pending now.
    pub fn pending_count(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// The blocks whose frees are pending.
    pub fn pending_ptrs(&self) -> std::collections::HashSet<DevicePtr> {
        self.lock().pending.iter().map(|p| p.ptr).collect()
    }

    /// Notes that the live block at `ptr`, of `block_size` bytes in the
    /// resource, is used by work on `stream` too.
    pub fn record(&self, ptr: DevicePtr, block_size: usize, stream: Stream) {
        let mut inner = self.lock();
        let uses = inner.uses.entry(ptr.0).or_insert_with(|| {
            self.any.fetch_add(1, Ordering::Relaxed);
            Uses {
                block_size,
                streams: Vec::new(),
            }
        });
        if !uses.streams.iter().any(|s| s.id() == stream.id()) {
            uses.streams.push(stream);
        }
    }

    /// Frees `ptr` (of `size` bytes, freed on `stream`) if it has recorded
    /// streams other than `stream`: counts the free in `stack` now and keeps
    /// the block until events recorded on those streams have completed.
    /// `Ok(false)`: nothing recorded, free it as usual. An error is a size
    /// its block cannot have ([`Error::InvalidFree`]); nothing is freed.
    pub fn defer_free(
        &self,
        stack: &Stack,
        ptr: DevicePtr,
        size: usize,
        stream: &Stream,
    ) -> Result<bool> {
        let mut inner = self.lock();
        let Some(uses) = inner.uses.get(&ptr.0) else {
            return Ok(false);
        };
        if granular_size(size).is_none_or(|g| g > uses.block_size) {
            return Err(Error::InvalidFree {
                ptr: ptr.0,
                reason: FreeError::SizeMismatch {
                    allocated: uses.block_size,
                    freed: size,
                },
            });
        }
        let uses = inner.uses.remove(&ptr.0).expect("found above");
        self.any.fetch_sub(1, Ordering::Relaxed);
        let mut events = Vec::new();
        for other in uses.streams.iter().filter(|s| s.id() != stream.id()) {
            let event = match inner.spare_events.pop() {
                Some(e) => Ok(e),
                None => Event::new(stream.device()),
            };
            match event.and_then(|e| e.record(other).map(|()| e)) {
                Ok(e) => events.push(e),
                // No event: wait for the stream's work here instead (a
                // stream that cannot even be waited for runs nothing).
                Err(_) => {
                    let _ = other.synchronize();
                }
            }
        }
        if events.is_empty() {
            return Ok(false);
        }
        stack.begin_deferred_free(size);
        inner.pending.push(Pending {
            ptr,
            size,
            stream: stream.clone(),
            events,
        });
        self.pending.fetch_add(1, Ordering::Relaxed);
        self.any.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Forgets the recorded streams of `ptr` (its block was freed elsewhere
    /// or not at all).
    pub fn forget(&self, ptr: DevicePtr) {
        if self.lock().uses.remove(&ptr.0).is_some() {
            self.any.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Frees into `stack` every pending block whose events have completed;
    /// never blocks. Returns the frees the resource refused.
    pub fn poll(&self, stack: &Stack) -> Vec<Refused> {
        self.finish(stack, false)
    }

    /// Waits for every pending block's events, then frees them all into
    /// `stack`. Returns the frees the resource refused.
    pub fn wait_all(&self, stack: &Stack) -> Vec<Refused> {
        self.finish(stack, true)
    }

    fn finish(&self, stack: &Stack, wait: bool) -> Vec<Refused> {
        let done: Vec<Pending> = {
            let mut inner = self.lock();
            let (done, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut inner.pending)
                .into_iter()
                .partition(|p| {
                    p.events.iter().all(|e| {
                        // A failed query or wait: the event's stream is
                        // unusable; its work cannot touch the block.
                        if wait {
                            let _ = e.synchronize();
                            true
                        } else {
                            e.is_complete().unwrap_or(true)
                        }
                    })
                });
            inner.pending = waiting;
            done
        };
        if done.is_empty() {
            return Vec::new();
        }
        self.pending.fetch_sub(done.len(), Ordering::Relaxed);
        self.any.fetch_sub(done.len(), Ordering::Relaxed);
        let mut refused = Vec::new();
        let mut events = Vec::new();
        for p in done {
            if let Err(error) =
                stack.finish_deferred_free(p.ptr, p.size, DEFAULT_ALIGNMENT, &p.stream)
            {
                stack.cancel_deferred_free(p.size);
                refused.push(Refused {
                    ptr: p.ptr,
                    size: p.size,
                    error,
                });
            }
            events.extend(p.events);
        }
        self.lock().spare_events.extend(events);
        refused
    }
}
