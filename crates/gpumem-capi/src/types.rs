//! The structs the C ABI fills: statistics in PyTorch's terms
//! (`torch.cuda.memory_stats`) and snapshot entries
//! (`torch.cuda.memory._snapshot`). Declared in `include/gpumem.h` under the
//! same names.
#![allow(non_camel_case_types)]

use gpumem::adaptor::Stat;

/// One statistic as PyTorch keeps it: the value now, its peak since the last
/// peak reset, and the totals added and removed since the last reset of
/// accumulated statistics.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct gpumem_stat_t {
    /// Value now.
    pub current: i64,
    /// Highest value since the start or the last `gpumem_reset_peak_stats`.
    pub peak: i64,
    /// Total added since the start or the last `gpumem_reset_accumulated_stats`.
    pub allocated: i64,
    /// Total removed since the start or the last `gpumem_reset_accumulated_stats`.
    pub freed: i64,
}

impl From<Stat> for gpumem_stat_t {
    fn from(s: Stat) -> Self {
        Self {
            current: s.current,
            peak: s.peak,
            allocated: i64::try_from(s.total).unwrap_or(i64::MAX),
            freed: i64::try_from(s.freed).unwrap_or(i64::MAX),
        }
    }
}

impl gpumem_stat_t {
    /// The totals counted since `base` was taken (current and peak as they are).
    fn since(self, base: &Self) -> Self {
        Self {
            allocated: self.allocated.saturating_sub(base.allocated).max(0),
            freed: self.freed.saturating_sub(base.freed).max(0),
            ..self
        }
    }
}

/// Statistics of one device, with the names of `torch.cuda.memory_stats`
/// (each `gpumem_stat_t` is PyTorch's `<name>.all.{current,peak,allocated,freed}`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct gpumem_device_stats_t {
    /// Live allocations (count).
    pub allocation: gpumem_stat_t,
    /// Segments held from the driver: regions, chunks, physical allocations (count).
    pub segment: gpumem_stat_t,
    /// Live allocations plus freed blocks still waiting for a recorded stream (count).
    pub active: gpumem_stat_t,
    /// Bytes of live allocations, each rounded up to 256 bytes.
    pub allocated_bytes: gpumem_stat_t,
    /// Bytes asked for by the live allocations.
    pub requested_bytes: gpumem_stat_t,
    /// Bytes held from the driver (the resource's reserve).
    pub reserved_bytes: gpumem_stat_t,
    /// Bytes of the active blocks (rounded as `allocated_bytes`).
    pub active_bytes: gpumem_stat_t,
    /// Allocations that failed, emptied the cache and retried.
    pub num_alloc_retries: i64,
    /// Allocations that failed after the retry.
    pub num_ooms: i64,
    /// Driver allocation calls (`cuMemAlloc`, `cuMemCreate`).
    pub num_device_alloc: i64,
    /// Driver free calls (`cuMemFree`, `cuMemRelease`).
    pub num_device_free: i64,
    /// Bytes of the largest request servable now without taking more from
    /// the driver (PyTorch's `cacheInfo`).
    pub largest_free_block: i64,
}

impl gpumem_device_stats_t {
    /// These statistics with every accumulated counter (totals, retries,
    /// out-of-memory failures, driver calls) counted from `base`, the
    /// statistics at the last reset.
    pub fn since(self, base: &Self) -> Self {
        let d = |now: i64, then: i64| now.saturating_sub(then).max(0);
        Self {
            allocation: self.allocation.since(&base.allocation),
            segment: self.segment.since(&base.segment),
            active: self.active.since(&base.active),
            allocated_bytes: self.allocated_bytes.since(&base.allocated_bytes),
            requested_bytes: self.requested_bytes.since(&base.requested_bytes),
            reserved_bytes: self.reserved_bytes.since(&base.reserved_bytes),
            active_bytes: self.active_bytes.since(&base.active_bytes),
            num_alloc_retries: d(self.num_alloc_retries, base.num_alloc_retries),
            num_ooms: d(self.num_ooms, base.num_ooms),
            num_device_alloc: d(self.num_device_alloc, base.num_device_alloc),
            num_device_free: d(self.num_device_free, base.num_device_free),
            largest_free_block: self.largest_free_block,
        }
    }
}

/// A segment of a snapshot: memory held from the driver.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct gpumem_segment_t {
    /// First byte.
    pub address: u64,
    /// Bytes.
    pub size: u64,
    /// The stream it belongs to; 0 where unknown or shared by all streams.
    pub stream: u64,
    /// The graph pool it belongs to (PyTorch's `MempoolId_t`), `(0, 0)` for
    /// the device's own pool.
    pub pool_id0: u64,
    /// See `pool_id0`.
    pub pool_id1: u64,
    /// 1 when it serves requests above 1 MiB (PyTorch's "large" segments),
    /// 0 for small ones.
    pub is_large: i32,
    /// 1 when it is a range of virtual memory grown and shrunk in place
    /// (PyTorch's expandable segments, which CUDA IPC cannot share), 0 for
    /// memory allocated whole.
    pub is_expandable: i32,
}

/// A block of a snapshot: a live allocation.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct gpumem_block_t {
    /// The pointer handed out.
    pub address: u64,
    /// Bytes the block takes, as the resource rounds the request.
    pub size: u64,
    /// Bytes asked for (the size where the resource does not record it).
    pub requested: u64,
    /// The stream it was allocated on; 0 where unknown.
    pub stream: u64,
}

impl gpumem_block_t {
    /// The entry of `b`, allocated on the raw stream `stream`.
    pub fn of(b: &gpumem::resource::LiveBlock, stream: u64) -> Self {
        Self {
            address: b.address.0,
            size: b.size as u64,
            requested: b.requested.unwrap_or(b.size) as u64,
            stream,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_only_accumulated_counters() {
        let stat = |c, p, a, f| gpumem_stat_t {
            current: c,
            peak: p,
            allocated: a,
            freed: f,
        };
        let base = gpumem_device_stats_t {
            allocated_bytes: stat(5, 9, 100, 95),
            num_ooms: 2,
            num_device_alloc: 7,
            largest_free_block: 1,
            ..Default::default()
        };
        let now = gpumem_device_stats_t {
            allocated_bytes: stat(10, 12, 130, 120),
            num_ooms: 3,
            num_device_alloc: 7,
            largest_free_block: 4,
            ..Default::default()
        };
        let d = now.since(&base);
        assert_eq!(d.allocated_bytes, stat(10, 12, 30, 25));
        assert_eq!((d.num_ooms, d.num_device_alloc), (1, 0));
        assert_eq!(d.largest_free_block, 4);
    }
}
