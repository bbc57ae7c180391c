//! The configuration of a [`VirtualPool`].

use super::VirtualPool;
use crate::pool::Spread;

/// Largest alignment a [`VirtualPool`] serves.
pub const VIRTUAL_POOL_MAX_ALIGNMENT: usize = 1 << 30;

/// Configuration of a [`VirtualPool`].
///
/// Five fields are hidden from this documentation: `small_limit`,
/// `slack_permille`, `slack_min_bytes`, `max_extent_pages` and
/// `max_alias_ratio` are the pool's tuning, which the project's own
/// measurements turn (`docs/decisions-virtual-pool.md`). They are not part
/// of the stable API: their meaning and defaults may change with the
/// placement they tune.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VirtualPoolConfig {
    /// Virtual address space reserved up front, in multiples of the device's
    /// memory (1 to 16; default 2). More is reserved if it runs out.
    pub va_multiple: usize,
    /// Requests up to this many bytes go to the small area (default 1 MiB).
    #[doc(hidden)]
    pub small_limit: usize,
    /// Physical memory the pool may create beyond its live peak, in
    /// thousandths of that peak (default 30: up to 3% over the live peak),
    /// when no cached or idle extent fits a run. Beyond it, idle extents
    /// that fit nowhere are released before new ones are made, so the pool
    /// stays near its live peak; 0 makes new memory only in their place.
    /// The slack is never less than `slack_min_bytes`.
    #[doc(hidden)]
    pub slack_permille: usize,
    /// The least slack, in bytes (default 64 MiB): new memory may be made
    /// up to the live peak plus the larger of this and `slack_permille` of
    /// the peak. Three percent of a small pool is less than a page (each
    /// lock shard counts its own peak, so threads spread over shards make
    /// small pools), and such a pool would unmap idle memory at nearly
    /// every mapping only to map it again; from about 2 GiB of live peak
    /// on, `slack_permille` decides alone (`docs/decisions-virtual-pool.md`).
    /// 0 leaves `slack_permille` alone.
    #[doc(hidden)]
    pub slack_min_bytes: usize,
    /// Most pages of one extent (one `cuMemCreate`, mapped whole with one
    /// `cuMemMap`); 1 gives every page its own allocation (default 6).
    /// Larger extents mean fewer mappings (each `cuMemSetAccess` a slow
    /// driver call), but an extent can serve elsewhere only when all its
    /// pages are idle and only under a run at least as long. 6 is the value
    /// with which the simulator's replays of the two shared traces both stay
    /// within 5% of the live peak and reach a steady state with no driver
    /// call (`docs/decisions-virtual-pool.md`).
    #[doc(hidden)]
    pub max_extent_pages: usize,
    /// Bytes of unmapped physical pages kept cached for re-mapping; beyond
    /// it, whole cached extents go back to the driver (default 0).
    pub release_threshold: usize,
    /// Most alias pages kept mapped, in multiples of the physical pages
    /// (default 8); beyond it, idle aliases are unmapped. A training step's
    /// memory may change place several times, each a mapping kept for the
    /// next step (GPT-2's replay keeps several mappings per physical page in
    /// its steady state: `docs/decisions-virtual-pool.md`).
    #[doc(hidden)]
    pub max_alias_ratio: usize,
    /// Most physical bytes the pool may hold (mapped plus cached, whole
    /// pages); `None` for no limit. A request needing new physical memory
    /// beyond it is out of memory (after reclaiming idle pages). The
    /// starting value: [`VirtualPool::set_max_reserved`] changes it.
    pub max_reserved: Option<usize>,
    /// Other devices granted read-write access to every mapped page.
    pub peers: Vec<u32>,
    /// Create physical memory exportable as POSIX file descriptors (see
    /// [`VirtualPool::export_page_fds`]).
    pub ipc: bool,
    /// Bytes of a region copied to or from its host backup at a time (whole
    /// blocks; default 512 MiB): a sleep releases one slice's memory while
    /// the next is copied out, a wake maps the next slice while one is
    /// copied back ([`VirtualPool::sleep`], [`VirtualPool::wake`]).
    pub copy_slice_bytes: usize,
    /// The NCCL-ready mode ([`VirtualPoolConfig::nccl_ready`]): every block
    /// is one physical allocation of its own, mapped once. Default false.
    pub nccl_ready: bool,
    /// Lock shards (rounded up to a power of two): 0 (the default) is one
    /// per CPU (at most 64), 1 one lock for all threads. Each shard is a
    /// whole pool with its own reservations and physical memory, so threads
    /// on different shards never wait for each other, and memory moves
    /// between shards only by being given back and created again (on out of
    /// memory, the other shards give back what no live block uses before
    /// the allocation fails). `max_reserved` bounds all shards together.
    /// One shard with `ipc` or `nccl_ready`, whose exports cover the pool;
    /// regions keep the pool on one shard (see
    /// [`VirtualPool::begin_region`]).
    pub shards: usize,
    /// When threads spread over the shards: once shard 0's lock is
    /// contended often (the default), or from the start (as for
    /// [`PoolConfig::spread`](crate::pool::PoolConfig::spread)).
    pub spread: Spread,
}

impl Default for VirtualPoolConfig {
    fn default() -> Self {
        Self {
            va_multiple: 2,
            small_limit: 1 << 20,
            slack_permille: 30,
            slack_min_bytes: 64 << 20,
            max_extent_pages: 6,
            release_threshold: 0,
            max_alias_ratio: 8,
            max_reserved: None,
            peers: Vec::new(),
            ipc: false,
            copy_slice_bytes: 512 << 20,
            nccl_ready: false,
            shards: 0,
            spread: Spread::OnContention,
        }
    }
}

impl VirtualPoolConfig {
    /// The NCCL-ready mode: memory laid out as `ncclMemAlloc` lays it out,
    /// so that NCCL can register the pool's blocks (user-buffer
    /// registration, symmetric memory) where it refuses memory that spans
    /// several physical allocations (as PyTorch's expandable segments do).
    ///
    /// - Every block is exactly one physical allocation (one `cuMemCreate`)
    ///   mapped once, at the block: `cuMemGetAddressRange` of the block
    ///   gives the block, and `cuMemRetainAllocationHandle` of any of its
    ///   bytes the same handle, another than any other block's. No block
    ///   spans several allocations, no allocation is shared between blocks
    ///   or mapped twice (no aliases).
    /// - **Blocks are rounded up to whole pages** (the device's recommended
    ///   VMM granularity, 2 MiB on an H100) and start on a page: a 1-byte
    ///   request holds a page. Frees take the size asked for (or anything
    ///   that rounds to the same pages).
    /// - The memory is created with POSIX file descriptor handles, and
    ///   RDMA-capable (`gpuDirectRDMACapable`) where the device supports
    ///   GPUDirect RDMA with VMM memory.
    /// - The device and every device of `peers` get read-write access to
    ///   every mapping.
    ///
    /// A freed block is kept whole for the next request of its size on the
    /// stream that freed it, which costs no driver call; one that needs
    /// memory costs a create, a map and a set-access per device. Kept blocks
    /// are not bound by `slack_permille` (the pool holds what the largest
    /// mix of sizes needs, as a caching allocator does): they go back when
    /// the pool is out of memory or at its `max_reserved`, on
    /// [`Pool::trim`](crate::pool::Pool::trim) and on
    /// [`Pool::release`](crate::pool::Pool::release).
    /// [`VirtualPool::sleep`] is refused in this mode.
    pub fn nccl_ready(peers: Vec<u32>) -> Self {
        Self {
            peers,
            ipc: true,
            nccl_ready: true,
            ..Self::default()
        }
    }
}

impl VirtualPool {
    /// The configuration.
    pub fn config(&self) -> &VirtualPoolConfig {
        &self.config
    }

    /// Bytes of one page (the device's VMM granularity).
    pub fn page_size(&self) -> usize {
        self.gran
    }

    /// Most physical bytes the pool may hold now; `None` for no limit.
    pub fn max_reserved(&self) -> Option<usize> {
        self.lock().max_physical
    }

    /// Changes the most physical bytes the pool may hold (`None`: no limit).
    /// Memory held above a lowered limit stays until it is freed and given
    /// back; meanwhile requests needing new physical memory fail as out of
    /// memory with the limit.
    pub fn set_max_reserved(&self, bytes: Option<usize>) {
        self.each_shard(|st| st.max_physical = bytes);
    }
}
