//! [`Pool`] for [`VirtualPool`] (its reserve is physical memory, mapped plus
//! cached; giving back unmaps idle pages and releases physical extents), and
//! its `with_defaults`.

use std::sync::atomic::Ordering::Relaxed;

use super::{State, VirtualPool, VirtualPoolConfig};
use crate::device::Device;
use crate::pool::Pool;
use crate::Result;

impl VirtualPool {
    /// A pool on `device` with the default configuration (see
    /// [`VirtualPool::new`]).
    pub fn with_defaults(device: Device) -> Result<Self> {
        Self::new(device, VirtualPoolConfig::default())
    }

    /// Physical bytes held, all shards.
    pub(super) fn held_bytes(&self) -> usize {
        self.pool_pages.load(Relaxed) * self.gran
    }

    /// [`Self::give_back`] on every shard in turn, towards `to` bytes for
    /// the whole pool; returns the bytes released, or the first error after
    /// every shard was tried.
    fn give_back_all(&self, to: usize) -> Result<usize> {
        let (mut given, mut first_err) = (0, None);
        self.each_shard(|st| {
            let others = self.held_bytes() - st.phys.total_pages() * self.gran;
            match self.give_back(st, to.saturating_sub(others)) {
                Ok(n) => given += n,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
            // After the give-back, which may have freed kept blocks on
            // their streams.
            Self::forget_dropped_streams(st);
        });
        first_err.map_or(Ok(given), Err)
    }

    /// Lets go of the streams of shard `st` that their users dropped and
    /// whose work is known done, without waiting: each area's lanes are
    /// settled (a query per stream with free blocks) and forgotten when
    /// empty, and each such stream that freed blocks is asked once.
    fn forget_dropped_streams(st: &mut State) {
        for a in &mut st.areas {
            a.lanes.settle_and_forget(&mut a.heap);
        }
        st.streams.prune_asking();
    }

    /// Releases shard `st`'s cached extents, after unmapping idle ones into
    /// the cache as needed, until the shard holds at most `to` physical
    /// bytes (0: all of them). Idle pages go only where their freeing
    /// streams are known done.
    fn give_back(&self, st: &mut State, to: usize) -> Result<usize> {
        let reserved = st.phys.total_pages() * self.gran;
        let Some(excess) = reserved.checked_sub(to).filter(|&e| e > 0) else {
            return Ok(0);
        };
        let want = if to == 0 {
            usize::MAX
        } else {
            excess
                .div_ceil(self.gran)
                .saturating_sub(st.phys.cached_pages())
        };
        self.reclaim(st, want)?;
        let keep = (st.phys.cached_pages() * self.gran).saturating_sub(excess);
        match self.release_cached(st, keep) {
            (_, Some(e)) => Err(e),
            (bytes, None) => Ok(bytes),
        }
    }
}

/// The reserve is the physical memory held (mapped plus cached), whole pages.
/// [`Pool::trim`] unmaps idle pages whose freeing streams are known complete
/// (without waiting for any) and releases the extents then mapped nowhere,
/// largest first; [`Pool::release`] first waits for every stream that freed
/// blocks, so all physical memory not under a live block goes back, and
/// gives back the pinned host memory kept from region backups no longer
/// needed ([`VirtualPool::release_host_backups`]; not in the bytes returned,
/// which are device memory).
/// [`Pool::reset_peak`] restarts the peaks of reserved and live bytes and of
/// physical allocations.
impl Pool for VirtualPool {
    fn reserved_bytes(&self) -> usize {
        self.held_bytes()
    }

    /// O(1); [`VirtualPool::stats`] scans pages.
    fn peak_reserved_bytes(&self) -> usize {
        self.peak_pages.load(Relaxed) * self.gran
    }

    fn reset_peak(&self) {
        self.each_shard(|st| {
            st.peak_live = st.live_bytes();
            st.peak_extents = st.phys.extent_count();
            st.extent_classes.iter_mut().for_each(|c| c.reset_peak());
        });
        self.peak_pages
            .store(self.pool_pages.load(Relaxed), Relaxed);
    }

    fn trim(&self, to: usize) -> Result<usize> {
        self.give_back_all(to)
    }

    /// A stream that cannot be waited for (a failed synchronize, and the
    /// device's in its place) keeps the pages it freed blocks on, which its
    /// work may still use; everything else goes back as a trim would give
    /// it (streams waited for, or found idle), in every shard, and the
    /// first error is returned.
    fn release(&self) -> Result<usize> {
        let mut first_err = None;
        self.each_shard(|st| {
            // Kept blocks are freed first, so that the wait covers them.
            let flushed = self.flush_kept(st, usize::MAX);
            let waited = st.streams.synchronize_all(&self.device);
            let mut settled = Ok(());
            for a in &mut st.areas {
                settled = settled.and(a.lanes.settle_blocking(&mut a.heap));
            }
            st.streams.prune();
            for r in [flushed, waited, settled] {
                if let Err(e) = r {
                    first_err.get_or_insert(e);
                }
            }
        });
        let given = self.give_back_all(0);
        let host = self
            .lock()
            .regions
            .host
            .as_ref()
            .map_or(Ok(0), Pool::release);
        match (first_err, given, host) {
            (Some(e), _, _) | (None, Err(e), _) | (None, Ok(_), Err(e)) => Err(e),
            (None, Ok(given), Ok(_)) => Ok(given),
        }
    }
}
