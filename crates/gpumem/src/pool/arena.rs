//! `ArenaResource`: RMM's arena allocator, per-stream arenas over one global
//! arena of superblocks.
//!
//! # Algorithm
//! At construction the arena takes one big allocation from its upstream
//! (default: half the device's free memory, as RMM does; an explicit size may
//! be smaller) and cuts it into superblocks (default 1 MiB). The **global
//! arena** owns the superblocks no stream uses. Each stream gets a **stream
//! arena** (the legacy default stream gets one per thread, the per-thread
//! default stream is already one stream per thread) that takes superblocks
//! from the global arena and serves small requests from them by
//! address-ordered first fit over 256-byte granules, coalescing on free.
//! Requests of at least the large threshold (default half a superblock) take
//! whole runs of superblocks. Fully free superblocks and freed large runs stay
//! cached in the stream arena for reuse on its stream, and go back to the
//! global arena when the cache passes its limit. When the global arena cannot
//! serve a request, every stream arena returns its free superblocks (after
//! their streams are done with them, below) and the request is retried, then
//! the device is synchronized and it is retried once more, then it fails with
//! [`Error::OutOfMemory`] carrying requested, reserved, live and largest-free
//! bytes (and, if configured, a fragmentation report in the log).
//!
//! # Bad frees
//! A free is checked against the block the arena recorded: a small block's
//! length in granules (in its superblock), a large block's length in
//! superblocks (in the directory) and the bytes it was asked for. A pointer
//! that starts no live block, a second free, or a size that needs another
//! number of 256-byte granules is [`Error::InvalidFree`] and frees nothing;
//! a size within the same granules is the same block, as in every pool, so
//! adaptors that count in granules stay exact. The live count is kept in
//! whole granules and superblocks, so no free can make it wrong.
//!
//! # Costs
//! The fast path (a request served from the calling stream's arena) takes one
//! uncontended mutex and two O(log n) tree descents: no driver call, no event,
//! no global lock. Superblock hand-offs take the global lock; events and
//! driver queries happen only there. Host memory: 6 bytes per 256-byte granule
//! of the superblocks serving small blocks (2.3%).
//!
//! # Stream-ordering policy (all gpumem pools follow it)
//! A block freed on stream S is reusable at once by allocations on S. Another
//! stream T gets it only (a) once S's work up to the free is known complete (S
//! idle by `stream_query`, or an event recorded on S after the free has
//! completed), or (b) after T is made to wait for it (`stream_wait_event(T,
//! event recorded on S after the free)`). There is no event per free: memory
//! leaves S's arena in batches fenced by one event per stream per batch
//! (re-recorded as the batch grows), and a small block allocated on T but
//! freed on S (a cross-stream free, a slow path) waits in T's arena for an
//! event recorded on S. The arena keeps a clone of every stream whose arena or
//! batch holds free memory, so a stream the user drops is not destroyed while
//! its blocks wait. For a foreign stream whose query or record fails, the
//! device is synchronized instead.

mod directory;
mod global;
mod stream_arena;
mod superblock;
mod tree;

/// `std` or `loom` primitives for the structures `loom` model-checks.
pub(crate) mod sync {
    #[cfg(loom)]
    pub(crate) use loom::sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, MutexGuard,
    };
    #[cfg(not(loom))]
    pub(crate) use std::sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, MutexGuard,
    };
}

#[cfg(not(loom))]
use directory::OwnerWord;
#[cfg(loom)]
pub use directory::{OwnerWord, SuperblockDirectory};

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64 as StdAtomicU64, Ordering as StdOrdering};
use std::sync::{Arc, Mutex};

use global::GlobalArena;
use stream_arena::{ArenaState, StreamArena};

use super::stream_order::parked::{capturing, Parked};
use super::stream_order::streams::synchronize_device;
use super::stream_order::sync::lock;
use super::Pool;

use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{validate_request, MemoryResource, Properties, DEFAULT_ALIGNMENT};
use crate::stream::{Stream, StreamId};
use crate::{check_alignment, Error, FreeError, OomInfo, Result};

/// Granule of small blocks: sizes round up to it, and it is the alignment served.
pub(crate) const GRANULE: usize = 256;

/// Configuration of an [`ArenaResource`]. `Default`: half the device's free
/// memory, 1 MiB superblocks, the large threshold and cache limit derived
/// from them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ArenaConfig {
    /// Bytes the arena takes from the upstream at construction, rounded down
    /// to whole superblocks: all it ever holds. `None` takes half the
    /// device's free memory, as RMM does.
    pub max_reserved: Option<usize>,
    /// Superblock size: a power of two from 4 KiB to 8 MiB (default 1 MiB).
    pub superblock_size: usize,
    /// Requests of at least this many bytes take whole superblocks; `None` means
    /// half a superblock. At most one superblock.
    pub large_threshold: Option<usize>,
    /// Bytes of whole free superblocks a stream arena keeps for its stream
    /// before returning them to the global arena; `None` means 1/64 of the
    /// arena, at least 64 superblocks.
    pub cache_limit: Option<usize>,
    /// Log a fragmentation report (`log::error!`) when a request fails for
    /// lack of memory.
    pub dump_log_on_oom: bool,
}

impl Default for ArenaConfig {
    fn default() -> Self {
        Self {
            max_reserved: None,
            superblock_size: 1 << 20,
            large_threshold: None,
            cache_limit: None,
            dump_log_on_oom: false,
        }
    }
}

impl ArenaConfig {
    /// The default configuration with an arena of `bytes`.
    pub fn with_size(bytes: usize) -> Self {
        Self {
            max_reserved: Some(bytes),
            ..Self::default()
        }
    }

    /// Sets the superblock size.
    pub fn superblock_size(mut self, bytes: usize) -> Self {
        self.superblock_size = bytes;
        self
    }

    /// Sets the large-request threshold.
    pub fn large_threshold(mut self, bytes: usize) -> Self {
        self.large_threshold = Some(bytes);
        self
    }

    /// Sets the per-stream cache limit.
    pub fn cache_limit(mut self, bytes: usize) -> Self {
        self.cache_limit = Some(bytes);
        self
    }

    /// Asks for a fragmentation report in the log at out-of-memory.
    pub fn dump_log_on_oom(mut self, yes: bool) -> Self {
        self.dump_log_on_oom = yes;
        self
    }
}

/// A snapshot of an arena's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaStats {
    /// Bytes held from the upstream (the region).
    pub reserved: usize,
    /// Bytes in the blocks handed out and not yet freed: small blocks in
    /// whole 256-byte granules, large ones in whole superblocks (what the
    /// arena records, and checks a free against).
    pub live: usize,
    /// Largest block that could be handed out without waiting for another
    /// stream: the largest clean or cached run, or free block in a superblock.
    pub largest_free: usize,
    /// Bytes in superblocks held by stream arenas (small-block service and caches).
    pub in_arenas: usize,
    /// Bytes released by stream arenas and waiting for their streams' fences.
    pub fenced: usize,
    /// Bytes that could never be proven idle (device synchronization failed).
    pub lost: usize,
    /// Stream arenas alive.
    pub arenas: usize,
}

/// Stream arenas by key and by id.
#[derive(Default)]
struct Registry {
    by_key: HashMap<(u64, u64), Arc<StreamArena>>,
    by_uid: HashMap<u32, Arc<StreamArena>>,
}

/// Everything an arena resource shares, without its upstream.
pub(crate) struct Core {
    uid: u64,
    pub(crate) device: Device,
    pub(crate) global: GlobalArena,
    pub(crate) base: u64,
    size: usize,
    pub(crate) sb_shift: u32,
    pub(crate) granules: u32,
    large_threshold: usize,
    /// In superblocks.
    pub(crate) cache_limit: u64,
    dump_on_oom: bool,
    registry: Mutex<Registry>,
    next_arena: AtomicU32,
    /// Bytes asked for by the large block starting at each superblock, so
    /// that its free is checked to the 256-byte granule as a small block's
    /// is. Written before the block is handed out, read at its free, which
    /// the caller orders after.
    large_bytes: Box<[StdAtomicU64]>,
}

static NEXT_RESOURCE: StdAtomicU64 = StdAtomicU64::new(1);
static NEXT_THREAD: StdAtomicU64 = StdAtomicU64::new(1);

/// Entries of the per-thread arena cache: (resource uid, stream id, arena).
type TlsEntry = (u64, u64, Arc<StreamArena>);
const TLS_ENTRIES: usize = 8;

thread_local! {
    static TLS: RefCell<Vec<TlsEntry>> = const { RefCell::new(Vec::new()) };
    static THREAD_SEQ: u64 = NEXT_THREAD.fetch_add(1, StdOrdering::Relaxed);
}

/// What a request needs.
#[derive(Debug, Clone, Copy)]
enum Req {
    /// Granules in a superblock.
    Small(u32),
    /// Whole superblocks.
    Large(u32),
}

impl Req {
    /// Bytes of the block that serves the request.
    #[inline]
    fn block_bytes(self, core: &Core) -> usize {
        match self {
            Req::Small(g) => g as usize * GRANULE,
            Req::Large(n) => (n as usize) << core.sb_shift,
        }
    }
}

enum Hit<R> {
    Done(R),
    Miss,
}

impl Core {
    #[inline]
    fn sb_size(&self) -> usize {
        1 << self.sb_shift
    }

    #[inline]
    fn classify(&self, bytes: usize) -> Option<Req> {
        if bytes < self.large_threshold {
            Some(Req::Small(bytes.div_ceil(GRANULE) as u32))
        } else {
            let n = bytes.div_ceil(self.sb_size());
            if n > self.global.dir.len() as usize {
                None
            } else {
                Some(Req::Large(n as u32))
            }
        }
    }

    fn lock_registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        lock(&self.registry)
    }

    /// The registry key of `stream`'s arena on this thread.
    fn key(stream: &Stream) -> (u64, u64) {
        let id = stream.id();
        if id == StreamId::LEGACY {
            (id.0, THREAD_SEQ.try_with(|s| *s).unwrap_or(0))
        } else {
            (id.0, 0)
        }
    }

    /// `stream`'s arena from the registry, created if needed.
    fn arena_from_registry(&self, stream: &Stream) -> Arc<StreamArena> {
        let key = Self::key(stream);
        let mut reg = self.lock_registry();
        if let Some(a) = reg.by_key.get(&key) {
            return a.clone();
        }
        let uid = self.next_arena.fetch_add(1, StdOrdering::Relaxed);
        let a = Arc::new(StreamArena::new(uid, stream, key));
        reg.by_key.insert(key, a.clone());
        reg.by_uid.insert(uid, a.clone());
        a
    }

    /// Runs `f` on `stream`'s arena, under its lock. The per-thread cache makes
    /// this one thread-local lookup and one uncontended lock.
    #[inline]
    fn with_arena<R>(
        &self,
        stream: &Stream,
        mut f: impl FnMut(&StreamArena, &mut ArenaState) -> R,
    ) -> R {
        let sid = stream.id().0;
        loop {
            let hit = TLS.try_with(|c| {
                let Ok(c) = c.try_borrow() else {
                    return Hit::Miss;
                };
                for (r, s, a) in c.iter() {
                    if *r == self.uid && *s == sid {
                        let mut st = a.lock();
                        if st.retired {
                            return Hit::Miss;
                        }
                        return Hit::Done(f(a, &mut st));
                    }
                }
                Hit::Miss
            });
            if let Ok(Hit::Done(r)) = hit {
                return r;
            }
            let a = self.arena_from_registry(stream);
            let cached = TLS.try_with(|c| {
                let Ok(mut c) = c.try_borrow_mut() else {
                    return false;
                };
                c.retain(|(r, s, _)| !(*r == self.uid && *s == sid));
                if c.len() >= TLS_ENTRIES {
                    c.remove(0);
                }
                c.push((self.uid, sid, a.clone()));
                true
            });
            if cached != Ok(true) {
                // No thread-local cache (thread teardown): use the registry's arena.
                let mut st = a.lock();
                if !st.retired {
                    return f(&a, &mut st);
                }
            }
        }
    }

    fn arena_by_uid(&self, uid: u32) -> Option<Arc<StreamArena>> {
        self.lock_registry().by_uid.get(&uid).cloned()
    }

    fn all_arenas(&self) -> Vec<Arc<StreamArena>> {
        self.lock_registry().by_uid.values().cloned().collect()
    }

    /// Returns every stream arena's free superblocks to the global arena and
    /// drops arenas that hold nothing. With `synced`, the device has been
    /// synchronized: everything goes back clean.
    fn reclaim(&self, synced: bool) {
        let mut reg = self.lock_registry();
        let mut unused = Vec::new();
        for a in reg.by_uid.values() {
            let mut st = a.lock();
            if st.flush(self, synced) {
                st.retire();
                unused.push((a.uid, a.key));
            }
        }
        for (uid, key) in unused {
            reg.by_uid.remove(&uid);
            reg.by_key.remove(&key);
        }
        drop(reg);
        self.global.collect(synced);
    }

    /// A block for `req`, a request of `bytes`.
    fn try_alloc(&self, req: Req, bytes: usize, stream: &Stream) -> Option<u64> {
        let p = self.with_arena(stream, |_, st| {
            let p = match req {
                Req::Small(g) => st.alloc_small(self, g, stream),
                Req::Large(n) => st.alloc_large(self, n, stream),
            };
            if p.is_some() {
                st.live += req.block_bytes(self);
            }
            p
        })?;
        if let Req::Large(_) = req {
            let idx = ((p - self.base) >> self.sb_shift) as usize;
            self.large_bytes[idx].store(bytes as u64, StdOrdering::Relaxed);
        }
        Some(p)
    }

    fn stats(&self) -> ArenaStats {
        let arenas = self.all_arenas();
        let mut live = 0;
        let mut largest = (self.global.dir.largest_free() as usize) << self.sb_shift;
        for a in &arenas {
            let st = a.lock();
            live += st.live;
            largest = largest.max(st.largest_free(self));
        }
        let free_clean = (self.global.dir.free_count() as usize) << self.sb_shift;
        let fenced = (self.global.fenced_count() as usize) << self.sb_shift;
        let lost = (self.global.lost_count() as usize) << self.sb_shift;
        ArenaStats {
            reserved: self.size,
            live,
            largest_free: largest,
            in_arenas: self.size.saturating_sub(free_clean + fenced + lost),
            fenced,
            lost,
            arenas: arenas.len(),
        }
    }

    fn report(&self) -> String {
        let mut out = String::new();
        let s = self.stats();
        let runs = self.global.dir.free_runs();
        out.push_str(&format!(
            "arena: reserved {} bytes, live {}, largest free {}, {} superblocks of {} bytes\n\
             global: {} clean runs ({} superblocks, largest {})\n",
            s.reserved,
            s.live,
            s.largest_free,
            self.global.dir.len(),
            self.sb_size(),
            runs.len(),
            runs.iter().map(|&(_, l)| l as u64).sum::<u64>(),
            runs.iter().map(|&(_, l)| l).max().unwrap_or(0),
        ));
        for line in self.global.describe_batches() {
            out.push_str(&line);
            out.push('\n');
        }
        for a in self.all_arenas() {
            out.push_str(&a.lock().describe(a.stream_id));
            out.push('\n');
        }
        out
    }

    fn oom(&self, bytes: usize) -> Error {
        let s = self.stats();
        if self.dump_on_oom {
            log::error!("arena: out of memory for {bytes} bytes\n{}", self.report());
        }
        Error::oom_with(OomInfo {
            requested: bytes,
            device: Some(self.device.ordinal()),
            reserved: Some(s.reserved),
            live: Some(s.live),
            largest_free: Some(s.largest_free),
            limit: None,
        })
    }
}

/// RMM's arena allocator over an upstream resource; see the module documentation.
///
/// ```
/// use gpumem::pool::{ArenaConfig, ArenaResource, Pool};
/// use gpumem::resource::{DeviceResource, MemoryResource};
/// use gpumem::Device;
///
/// fn main() -> gpumem::Result<()> {
///     let device = Device::sim(Default::default());
///     let config = ArenaConfig::with_size(64 << 20);
///     let arena = ArenaResource::new(DeviceResource::new(device.clone()), config)?;
///     assert_eq!(arena.reserved_bytes(), 64 << 20); // taken whole, up front
///
///     let stream = device.create_stream()?;
///     let small = arena.allocate(1000, 256, &stream)?; // from the stream's arena
///     let large = arena.allocate(3 << 20, 256, &stream)?; // whole superblocks
///     assert_eq!(arena.stats().live, 1024 + (3 << 20));
///     arena.deallocate(small, 1000, 256, &stream)?;
///     arena.deallocate(large, 3 << 20, 256, &stream)?;
///     assert_eq!(arena.stats().live, 0);
///     Ok(())
/// }
/// ```
pub struct ArenaResource<U: MemoryResource> {
    upstream: U,
    core: Core,
    region: DevicePtr,
    /// Blocks freed on capturing streams (see `stream_order::parked`): live
    /// in their superblocks, counted as freed in their stream arenas.
    parked: Parked,
}

impl<U: MemoryResource> std::fmt::Debug for ArenaResource<U> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaResource")
            .field("region", &format_args!("{:#x}", self.region.0))
            .field("size", &self.core.size)
            .field("superblock_size", &self.core.sb_size())
            .finish()
    }
}

impl<U: MemoryResource> ArenaResource<U> {
    /// An arena over `upstream` with the default configuration (half the
    /// device's free memory, 1 MiB superblocks).
    pub fn with_defaults(upstream: U) -> Result<Self> {
        Self::new(upstream, ArenaConfig::default())
    }

    /// An arena over `upstream` configured by `config`. Takes the whole arena
    /// from the upstream now; fails with [`Error::InvalidArgument`] for a bad
    /// configuration and with the upstream's error when it cannot serve it.
    pub fn new(upstream: U, config: ArenaConfig) -> Result<Self> {
        let sb = config.superblock_size;
        if !sb.is_power_of_two() || !(4096..=8 << 20).contains(&sb) {
            return Err(Error::InvalidArgument(format!(
                "arena superblock size {sb}: must be a power of two from 4 KiB to 8 MiB"
            )));
        }
        let threshold = config.large_threshold.unwrap_or(sb / 2);
        if threshold == 0 || threshold > sb {
            return Err(Error::InvalidArgument(format!(
                "arena large threshold {threshold}: must be from 1 byte to the superblock size {sb}"
            )));
        }
        let device = upstream.device().clone();
        let size = match config.max_reserved {
            Some(s) => s,
            None => device.mem_info()?.free / 2,
        };
        let count = (size / sb).min(u32::MAX as usize / 2);
        if count == 0 {
            return Err(Error::InvalidArgument(format!(
                "arena size {size}: smaller than one superblock ({sb} bytes)"
            )));
        }
        let size = count * sb;
        let cache_limit = match config.cache_limit {
            Some(c) => (c / sb) as u64,
            None => ((count / 64).max(64)) as u64,
        };
        let region = upstream.allocate_sync(size, DEFAULT_ALIGNMENT)?;
        let core = Core {
            uid: NEXT_RESOURCE.fetch_add(1, StdOrdering::Relaxed),
            global: GlobalArena::new(device.clone(), count as u32),
            device,
            base: region.0,
            size,
            sb_shift: sb.trailing_zeros(),
            granules: (sb / GRANULE) as u32,
            large_threshold: threshold,
            cache_limit,
            dump_on_oom: config.dump_log_on_oom,
            registry: Mutex::new(Registry::default()),
            next_arena: AtomicU32::new(1),
            large_bytes: (0..count).map(|_| StdAtomicU64::new(0)).collect(),
        };
        Ok(Self {
            upstream,
            core,
            region,
            parked: Parked::default(),
        })
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// The superblock size.
    pub fn superblock_size(&self) -> usize {
        self.core.sb_size()
    }

    /// The bytes a request of `bytes` takes: whole 256-byte granules below
    /// the large threshold, whole superblocks above; `None` when the arena
    /// can never serve it.
    pub fn block_size_for(&self, bytes: usize) -> Option<usize> {
        self.core.classify(bytes).map(|r| r.block_bytes(&self.core))
    }

    /// A snapshot of the arena's memory (locks every stream arena in turn).
    pub fn stats(&self) -> ArenaStats {
        self.core.stats()
    }

    /// A human-readable account of where the free memory is.
    pub fn fragmentation_report(&self) -> String {
        self.core.report()
    }

    fn invalid(ptr: DevicePtr, reason: FreeError) -> Error {
        Error::InvalidFree { ptr: ptr.0, reason }
    }

    /// A refused free of `bytes`: a size mismatch names the bytes freed, not
    /// their granules.
    fn refused(ptr: DevicePtr, reason: FreeError, bytes: usize) -> Error {
        let reason = match reason {
            FreeError::SizeMismatch { allocated, .. } => FreeError::SizeMismatch {
                allocated,
                freed: bytes,
            },
            r => r,
        };
        Self::invalid(ptr, reason)
    }

    fn free_small(
        &self,
        ptr: DevicePtr,
        idx: u32,
        gran: u32,
        g: u32,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        let core = &self.core;
        // The superblock checks the granules against the block's; the live
        // count is kept in the same granules, so it stays exact.
        let block = Req::Small(g).block_bytes(core);
        let local = core.with_arena(stream, |a, st| {
            let w = core.global.dir.owner(idx);
            if w.arena() != a.uid {
                return None;
            }
            let Some(slot) = w.slot() else {
                return Some(Err(FreeError::Unknown));
            };
            let r = st.free_small(core, slot, gran, g);
            if r.is_ok() {
                st.live -= block;
            }
            Some(r)
        });
        if let Some(r) = local {
            return r.map_err(|e| Self::refused(ptr, e, bytes));
        }
        // Allocated by another arena: a cross-stream (or cross-thread) free.
        self.with_owner(idx, Self::small_owner, |a, st, slot| {
            if a.stream_id == stream.id() {
                st.free_small(core, slot, gran, g)?;
            } else {
                st.defer_small(core, slot, gran, g, stream)?;
            }
            st.live -= block;
            Ok(())
        })
        .map_err(|e| Self::refused(ptr, e, bytes))
    }

    fn free_large(
        &self,
        ptr: DevicePtr,
        idx: u32,
        n: u32,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        let core = &self.core;
        // Checked to the granule, counted in whole superblocks (see
        // `free_small`).
        let block = Req::Large(n).block_bytes(core);
        let local = core.with_arena(stream, |a, st| {
            let w = core.global.dir.owner(idx);
            if w.arena() != a.uid {
                return None;
            }
            if let Err(e) = self.check_large(w, idx, n, bytes) {
                return Some(Err(e));
            }
            st.free_large(core, idx, n);
            st.live -= block;
            Some(Ok(()))
        });
        if let Some(r) = local {
            return r.map_err(|e| Self::invalid(ptr, e));
        }
        // Allocated by another arena: the run moves to the freeing stream's arena.
        self.with_owner(
            idx,
            |w| self.check_large(w, idx, n, bytes),
            |_, st, _| {
                st.disown_large(core, idx);
                st.live -= block;
                Ok(())
            },
        )
        .map_err(|e| Self::invalid(ptr, e))?;
        core.with_arena(stream, |_, st| st.add_spare(core, idx, n));
        Ok(())
    }

    /// A free of a block on a capturing stream: checked as [`Self::free_small`]
    /// and [`Self::free_large`] check it, counted as freed in the arena that
    /// holds it, and parked (it stays live in its superblocks).
    #[cold]
    #[inline(never)]
    fn park(&self, ptr: DevicePtr, idx: u32, gran: u32, req: Req, bytes: usize) -> Result<()> {
        let block = req.block_bytes(&self.core);
        let park = |st: &mut ArenaState| {
            self.parked
                .park(ptr, block)
                .map_err(|_| FreeError::DoubleFree)?;
            st.live -= block;
            Ok(())
        };
        match req {
            Req::Small(g) => self
                .with_owner(idx, Self::small_owner, |_, st, slot| {
                    st.check_small(slot, gran, g)?;
                    park(st)
                })
                .map_err(|e| Self::refused(ptr, e, bytes)),
            Req::Large(n) => self
                .with_owner(
                    idx,
                    |w| self.check_large(w, idx, n, bytes),
                    |_, st, _| park(st),
                )
                .map_err(|e| Self::invalid(ptr, e)),
        }
    }

    /// The slot of a superblock held for small blocks, from its owner word.
    fn small_owner(w: OwnerWord) -> std::result::Result<u32, FreeError> {
        w.slot().ok_or(FreeError::Unknown)
    }

    /// Checks that `w`, superblock `idx`'s owner word, starts a large block
    /// of `n` superblocks that a free of `bytes` names (to the granule).
    fn check_large(
        &self,
        w: OwnerWord,
        idx: u32,
        n: u32,
        bytes: usize,
    ) -> std::result::Result<(), FreeError> {
        let granules = |b: usize| b.div_ceil(GRANULE);
        match w.large_len() {
            Some(l) => {
                let allocated = self.core.large_bytes[idx as usize].load(StdOrdering::Relaxed);
                let allocated = allocated as usize;
                if l == n && granules(allocated) == granules(bytes) {
                    Ok(())
                } else {
                    Err(FreeError::SizeMismatch {
                        allocated,
                        freed: bytes,
                    })
                }
            }
            None => Err(FreeError::Unknown),
        }
    }

    /// Runs `f` under the lock of the stream arena that owns superblock
    /// `idx`, with what `vet` makes of its owner word (an error ends the
    /// call). The word is read again under the lock: an owner that changed
    /// meanwhile is looked up again. An owner no arena answers for is an
    /// unknown pointer.
    fn with_owner<V>(
        &self,
        idx: u32,
        vet: impl Fn(OwnerWord) -> std::result::Result<V, FreeError>,
        f: impl FnOnce(&StreamArena, &mut ArenaState, V) -> std::result::Result<(), FreeError>,
    ) -> std::result::Result<(), FreeError> {
        let core = &self.core;
        for _ in 0..16 {
            let w = core.global.dir.owner(idx);
            let v = vet(w)?;
            let Some(a) = core.arena_by_uid(w.arena()) else {
                return Err(FreeError::Unknown);
            };
            let mut st = a.lock();
            if core.global.dir.owner(idx) != w {
                continue;
            }
            return f(&a, &mut st, v);
        }
        Err(FreeError::Unknown)
    }
}

/// The arena holds its one region, taken whole at construction, for its
/// whole life: its reserve and peak are that region, and nothing goes back to
/// the upstream before the drop. [`Pool::trim`] returns every stream arena's
/// cached free superblocks to the global arena (fenced per the
/// stream-ordering policy), so every stream can use them, and drops the
/// stream arenas (and their stream clones) that hold nothing;
/// [`Pool::release`] synchronizes the device first, so they go back clean.
/// Both return 0.
impl<U: MemoryResource> Pool for ArenaResource<U> {
    fn reserved_bytes(&self) -> usize {
        self.core.size
    }

    fn peak_reserved_bytes(&self) -> usize {
        self.core.size
    }

    fn reset_peak(&self) {}

    fn trim(&self, _to: usize) -> Result<usize> {
        self.core.reclaim(false);
        Ok(0)
    }

    fn release(&self) -> Result<usize> {
        synchronize_device(&self.core.device)?;
        self.core.reclaim(true);
        Ok(0)
    }
}

impl<U: MemoryResource> MemoryResource for ArenaResource<U> {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        let core = &self.core;
        let Some(req) = core.classify(bytes) else {
            return Err(core.oom(bytes));
        };
        if let Some(p) = core.try_alloc(req, bytes, stream) {
            return Ok(DevicePtr(p));
        }
        // Out of superblocks: collect every arena's free ones, then synchronize.
        for synced in [false, true] {
            if synced && synchronize_device(&core.device).is_err() {
                break;
            }
            core.reclaim(synced);
            if let Some(p) = core.try_alloc(req, bytes, stream) {
                return Ok(DevicePtr(p));
            }
        }
        Err(core.oom(bytes))
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
        check_alignment(alignment)?;
        let core = &self.core;
        let off = ptr.0.wrapping_sub(core.base);
        if bytes == 0 || ptr.0 < core.base || off >= core.size as u64 {
            return Err(Self::invalid(ptr, FreeError::Unknown));
        }
        // A parked block stays live in its superblocks: it is refused first.
        self.parked.refuse(ptr)?;
        let idx = (off >> core.sb_shift) as u32;
        let within = off & (core.sb_size() as u64 - 1);
        let req = core.classify(bytes);
        let gran = (within / GRANULE as u64) as u32;
        match req {
            Some(Req::Small(_)) if !within.is_multiple_of(GRANULE as u64) => {
                Err(Self::invalid(ptr, FreeError::Unknown))
            }
            Some(Req::Large(_)) if within != 0 => Err(Self::invalid(ptr, FreeError::Unknown)),
            Some(req) if capturing(stream) => self.park(ptr, idx, gran, req, bytes),
            Some(Req::Small(g)) => self.free_small(ptr, idx, gran, g, bytes, stream),
            Some(Req::Large(n)) => self.free_large(ptr, idx, n, bytes, stream),
            None => Err(Self::invalid(ptr, FreeError::Unknown)),
        }
    }

    fn device(&self) -> &Device {
        &self.core.device
    }

    fn properties(&self) -> Properties {
        self.upstream.properties()
    }
}

impl<U: MemoryResource> Drop for ArenaResource<U> {
    fn drop(&mut self) {
        if crate::exit::process_is_exiting() {
            return; // the driver may be gone: leak (see `crate::exit`)
        }
        let arenas: Vec<_> = {
            let mut reg = self.core.lock_registry();
            reg.by_key.clear();
            reg.by_uid.drain().map(|(_, a)| a).collect()
        };
        // Work still queued on the arenas' streams may touch the region.
        let _ = synchronize_device(&self.core.device);
        for a in arenas {
            a.lock().retire();
        }
        self.core.global.clear();
        let _ = TLS.try_with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                c.retain(|(r, _, _)| *r != self.core.uid);
            }
        });
        crate::exit::give_back(
            || format!("ArenaResource region {:#x}", self.region.0),
            || {
                self.upstream
                    .deallocate_sync(self.region, self.core.size, DEFAULT_ALIGNMENT)
            },
        );
    }
}
