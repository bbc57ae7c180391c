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
//! ([`StreamUses::wait_all`]); both hand the finished frees to the caller,
//! which makes them where the block lives ([`Home`]: the device's stack or
//! a graph pool).
//!
//! While a stream capture is under way ([`gpumem::captures::underway`]),
//! nothing is recorded or queried: an event recorded on a capturing stream
//! would be part of the graph, and a query during a capture in global mode
//! breaks it. A free made then keeps its block pending with the streams to
//! record on, and the events are recorded at the first poll after the
//! capture (as PyTorch does). With PyTorch's
//! `graph_capture_record_stream_reuse` on
//! ([`StreamUses::set_reuse_in_capture`]), a graph-pool block freed during
//! a capture notes where its uses end in the graph, and an allocation of
//! the capture on its stream may take it back before the capture ends
//! ([`StreamUses::reusable_in_capture`], see [`crate::capture_reuse`]). A
//! second free of a pending block is refused as a double free, and a query
//! that fails keeps the block pending: a block is never reused on a guess.
//!
//! Cost when nothing is recorded: one atomic load per free and one per
//! allocation (the counters below); everything else runs only while some
//! block has recorded streams or a deferred free is pending. Events are
//! kept for reuse, so a steady state creates none.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use gpumem::adaptor::granular_size;
use gpumem::{DevicePtr, Error, Event, FreeError, Result, Stream};

use crate::capture_reuse::{self, Markers, Reach};
use crate::graph_pools::PoolId;

/// Whether a free naming `size` bytes can be the allocation of a live
/// block of `block_size` bytes (as its resource rounded it), for frees
/// whose check by the resource comes later or never: not larger than the
/// block, and, above the smallest size classes, where every resource rounds
/// a request up by less than twice, more than half of it. (Closer sizes
/// are checked by the resource when the free is made.)
pub(crate) fn size_fits_block(size: usize, block_size: usize) -> bool {
    let too_small = |g: usize| block_size > (64 << 10) && g <= block_size / 2;
    granular_size(size).is_some_and(|g| g <= block_size && !too_small(g))
}
/// Where a block lives: the device's stack (`None`) or a graph pool.
pub type Home = Option<PoolId>;

/// A live block's recorded streams, its size in the resource (to check the
/// size its free names) and where it lives.
struct Uses {
    block_size: usize,
    streams: Vec<Stream>,
    home: Home,
}

/// A freed block waiting for its events.
struct Pending {
    ptr: DevicePtr,
    size: usize,
    requested: usize,
    stream: Stream,
    home: Home,
    events: Vec<Event>,
    /// Streams to record an event on once no capture is under way.
    later: Vec<Stream>,
    /// Where its uses end in the graph of the capture it was freed in, when
    /// it may be reused before that capture ends.
    markers: Option<Markers>,
}

impl Pending {
    /// Whether it waits, with markers, for an allocation of `pool` on
    /// `stream` during a capture.
    fn marked_for(&self, pool: PoolId, stream: &Stream) -> bool {
        self.markers.is_some() && self.home == Some(pool) && self.stream.id() == stream.id()
    }
}

#[derive(Default)]
struct Inner {
    uses: HashMap<u64, Uses>,
    pending: Vec<Pending>,
    spare_events: Vec<Event>,
    /// What each capturing stream's next work comes after.
    reach: Reach,
}

impl Inner {
    /// An event recorded on `stream` now (a spare one when there is one);
    /// `None` when none can be, after waiting for the stream's work here
    /// instead (a stream that cannot even be waited for runs nothing).
    fn event_on(&mut self, stream: &Stream) -> Option<Event> {
        let event = match self.spare_events.pop() {
            Some(e) => Ok(e),
            None => Event::new(stream.device()),
        };
        match event.and_then(|e| e.record(stream).map(|()| e)) {
            Ok(e) => Some(e),
            Err(_) => {
                let _ = stream.synchronize();
                None
            }
        }
    }
}

/// The recorded streams and deferred frees of one device.
#[derive(Default)]
pub struct StreamUses {
    /// Blocks with recorded streams plus pending frees: frees look further
    /// only when non-zero.
    any: AtomicUsize,
    /// Pending frees: allocations poll only when non-zero.
    pending: AtomicUsize,
    /// Pending frees with markers: allocations during a capture look for
    /// reusable ones only when non-zero.
    marked: AtomicUsize,
    /// PyTorch's `graph_capture_record_stream_reuse` (shared by the
    /// devices of an allocator).
    reuse_in_capture: Arc<AtomicBool>,
    inner: Mutex<Inner>,
}

/// A deferred free whose streams are done: the caller frees the block into
/// its home now.
#[derive(Debug)]
pub struct Done {
    /// The block.
    pub ptr: DevicePtr,
    /// The size its free named.
    pub size: usize,
    /// The bytes its allocation asked for (`size` unless the caller
    /// rounded the request up: `gpumem_malloc_rounded`).
    pub requested: usize,
    /// The stream it was freed on.
    pub stream: Stream,
    /// Where it lives.
    pub home: Home,
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

    /// Recorded streams and deferred frees that follow `reuse_in_capture`
    /// for PyTorch's `graph_capture_record_stream_reuse` (see
    /// [`StreamUses::set_reuse_in_capture`]); the default value has a flag
    /// of its own, off.
    pub fn with_reuse_flag(reuse_in_capture: Arc<AtomicBool>) -> Self {
        Self {
            reuse_in_capture,
            ..Self::default()
        }
    }

    /// Sets PyTorch's `graph_capture_record_stream_reuse` (for everything
    /// sharing the flag): whether a graph-pool block freed during a capture
    /// may be reused before it ends, once every stream that used it has
    /// joined its stream in the graph. Applies to the frees and allocations
    /// made from now on.
    pub fn set_reuse_in_capture(&self, on: bool) {
        self.reuse_in_capture.store(on, Ordering::Relaxed);
    }

    /// True when an allocation during a capture may find a reusable pending
    /// block (one atomic load, two with blocks waiting).
    #[inline]
    pub fn has_marked(&self) -> bool {
        self.marked.load(Ordering::Relaxed) != 0 && self.reuse_in_capture.load(Ordering::Relaxed)
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
    /// resource at `home`, is used by work on `stream` too.
    pub fn record(&self, ptr: DevicePtr, block_size: usize, stream: Stream, home: Home) {
        let mut inner = self.lock();
        let uses = inner.uses.entry(ptr.0).or_insert_with(|| {
            self.any.fetch_add(1, Ordering::Relaxed);
            Uses {
                block_size,
                streams: Vec::new(),
                home,
            }
        });
        if uses.home != home {
            // The address was freed and handed out again elsewhere without
            // a free through here: the old record is stale.
            *uses = Uses {
                block_size,
                streams: Vec::new(),
                home,
            };
        }
        if !uses.streams.iter().any(|s| s.id() == stream.id()) {
            uses.streams.push(stream);
        }
    }

    /// Drops the streams recorded for the live block at `ptr` of `home`:
    /// it is held for a graph, and freed only once the device's work is
    /// done, so its free needs no events.
    pub fn forget(&self, ptr: DevicePtr, home: Home) {
        if !self.any() {
            return;
        }
        let mut inner = self.lock();
        if inner.uses.get(&ptr.0).is_some_and(|u| u.home == home) {
            inner.uses.remove(&ptr.0);
            self.any.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Defers the free of `ptr` (of `size` bytes allocated for `requested`,
    /// freed on `stream`, living
    /// at `home`) if it has recorded streams other than `stream`: keeps the
    /// block until events recorded on those streams have completed, and
    /// returns `Ok(true)`; the caller counts the free now. `Ok(false)`:
    /// nothing recorded, free it as usual. An error is a free that cannot
    /// be right ([`Error::InvalidFree`]: the block's free is already
    /// pending, or, for a block of the device's stack, a size its block
    /// cannot have); nothing is freed. A graph pool's block may be far
    /// larger than its request (a pool that does not split): the caller
    /// has its pool check the size exactly instead.
    pub fn defer_free(
        &self,
        ptr: DevicePtr,
        size: usize,
        requested: usize,
        stream: &Stream,
        home: Home,
    ) -> Result<bool> {
        let mut inner = self.lock();
        let Some(uses) = inner.uses.get(&ptr.0).filter(|u| u.home == home) else {
            if inner.pending.iter().any(|p| p.ptr == ptr && p.home == home) {
                return Err(Error::InvalidFree {
                    ptr: ptr.0,
                    reason: FreeError::DoubleFree,
                });
            }
            return Ok(false);
        };
        if home.is_none() && !size_fits_block(size, uses.block_size) {
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
        let capture = gpumem::captures::underway();
        let (mut events, mut later) = (Vec::new(), Vec::new());
        for other in uses.streams.into_iter().filter(|s| s.id() != stream.id()) {
            if capture {
                later.push(other);
            } else if let Some(e) = inner.event_on(&other) {
                events.push(e);
            }
        }
        if events.is_empty() && later.is_empty() {
            return Ok(false);
        }
        let markers =
            if !later.is_empty() && home.is_some() && self.reuse_in_capture.load(Ordering::Relaxed)
            {
                capture_reuse::markers(stream, &later)
            } else {
                None
            };
        if markers.is_some() {
            self.marked.fetch_add(1, Ordering::Relaxed);
        }
        inner.pending.push(Pending {
            ptr,
            size,
            requested,
            stream: stream.clone(),
            home,
            events,
            later,
            markers,
        });
        self.pending.fetch_add(1, Ordering::Relaxed);
        self.any.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// The pending blocks of graph pool `pool` freed on `stream` during the
    /// capture `stream` is in, which an allocation of that capture on
    /// `stream` may reuse now: every stream that used them has joined
    /// `stream` in the graph (see [`crate::capture_reuse`]). Taken out for
    /// the caller to free into the pool. None unless the reuse is on.
    pub fn reusable_in_capture(&self, pool: PoolId, stream: &Stream) -> Vec<Done> {
        if !self.has_marked() {
            return Vec::new();
        }
        let done: Vec<Pending> = {
            let mut inner = self.lock();
            let Inner { pending, reach, .. } = &mut *inner;
            if !pending.iter().any(|p| p.marked_for(pool, stream)) {
                return Vec::new();
            }
            let Some(behind) = reach.behind(stream) else {
                return Vec::new();
            };
            let (done, waiting) = std::mem::take(pending).into_iter().partition(|p| {
                p.marked_for(pool, stream) && p.markers.as_ref().is_some_and(|m| behind.covers(m))
            });
            *pending = waiting;
            done
        };
        self.take_out(done)
    }

    /// The pending blocks whose events have completed, taken out for the
    /// caller to free; never blocks. Nothing while a capture is under way.
    pub fn poll(&self) -> Vec<Done> {
        self.finish(false)
    }

    /// Waits for every pending block's events and takes out those that
    /// completed (all but those whose wait failed). Nothing while a capture
    /// is under way: waiting would break it.
    pub fn wait_all(&self) -> Vec<Done> {
        self.finish(true)
    }

    fn finish(&self, wait: bool) -> Vec<Done> {
        if gpumem::captures::underway() {
            return Vec::new();
        }
        let done: Vec<Pending> = {
            let mut inner = self.lock();
            let inner = &mut *inner;
            // No capture left: what was noted of their graphs is done with.
            inner.reach.clear();
            let mut pending = std::mem::take(&mut inner.pending);
            for p in &mut pending {
                if p.markers.take().is_some() {
                    self.marked.fetch_sub(1, Ordering::Relaxed);
                }
                for s in std::mem::take(&mut p.later) {
                    if let Some(e) = inner.event_on(&s) {
                        p.events.push(e);
                    }
                }
            }
            // A failed query or wait keeps the block: its stream may still
            // run work that uses it.
            let (done, waiting): (Vec<_>, Vec<_>) = pending.into_iter().partition(|p| {
                p.events.iter().all(|e| {
                    if wait {
                        e.synchronize().is_ok()
                    } else {
                        e.is_complete().unwrap_or(false)
                    }
                })
            });
            inner.pending = waiting;
            done
        };
        self.take_out(done)
    }

    /// Counts `done` out of the pending frees (their events kept for reuse)
    /// and hands them to the caller.
    fn take_out(&self, done: Vec<Pending>) -> Vec<Done> {
        if done.is_empty() {
            return Vec::new();
        }
        self.pending.fetch_sub(done.len(), Ordering::Relaxed);
        self.any.fetch_sub(done.len(), Ordering::Relaxed);
        let marked = done.iter().filter(|p| p.markers.is_some()).count();
        self.marked.fetch_sub(marked, Ordering::Relaxed);
        let mut events = Vec::new();
        let done = done
            .into_iter()
            .map(|p| {
                events.extend(p.events);
                Done {
                    ptr: p.ptr,
                    size: p.size,
                    requested: p.requested,
                    stream: p.stream,
                    home: p.home,
                }
            })
            .collect();
        self.lock().spare_events.extend(events);
        done
    }
}
