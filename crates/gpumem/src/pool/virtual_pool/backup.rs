//! Host backups of a [`VirtualPool`] region asleep: one block of pinned host
//! memory per region, holding its blocks' contents one after the other in
//! address order, and the copies into it and back (one per run of adjacent
//! blocks). The blocks come from a [`PinnedPool`] the pool makes at its
//! first backup: pinning host memory is slow (`cuMemHostAlloc`), so a
//! backup's memory stays pinned for the next one, and the pinned pool keeps
//! a block from reuse until the copies that used it have run.

use super::VirtualPool;
use crate::driver::DevicePtr;
use crate::manager::PinnedPool;
use crate::pool::stream_order::events::{Batches, EventPool};
use crate::pool::Pool;
use crate::resource::{MemoryResource, PinnedHostResource};
use crate::stream::Stream;
use crate::Result;

/// A region's backup: a block of the pool's pinned host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HostBackup {
    pub(super) ptr: DevicePtr,
    pub(super) bytes: usize,
}

/// The copies of a backup under way, one event per slice of blocks.
pub(super) struct CopiedSlices {
    batches: Batches,
    events: EventPool,
    /// The end address of each slice's last block, in order.
    ends: Vec<u64>,
}

impl CopiedSlices {
    /// Copies known to have run (nothing left to wait for).
    pub(super) fn done() -> Self {
        Self {
            batches: Batches::default(),
            events: EventPool::new(0),
            ends: Vec::new(),
        }
    }

    /// Blocks until the copies of every block below `addr` (and of the slice
    /// holding it) have run.
    pub(super) fn wait_below(&mut self, addr: u64) -> Result<()> {
        let i = self.ends.partition_point(|&end| end < addr);
        self.batches
            .wait_for((i as u64 + 1).min(self.ends.len() as u64), &self.events)
    }
}

/// `placed` (address order) cut into slices of about `limit` bytes (whole
/// blocks; a larger block is a slice of its own).
pub(super) fn slices(placed: &[(u64, u64, u64)], limit: u64) -> Vec<&[(u64, u64, u64)]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, p) in placed.iter().enumerate() {
        if bytes > 0 && bytes + p.1 > limit {
            out.push(&placed[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += p.1;
    }
    if start < placed.len() {
        out.push(&placed[start..]);
    }
    out
}

/// Where `blocks` (`(address, size)`, in address order) lie in a backup
/// made of them: one after the other, `(address, size, offset)`.
pub(super) fn layout(blocks: &[(u64, u64)]) -> Vec<(u64, u64, u64)> {
    let mut offset = 0;
    blocks
        .iter()
        .map(|&(addr, size)| {
            offset += size;
            (addr, size, offset - size)
        })
        .collect()
}

/// The copies for `placed` blocks (`(address, size, offset in the
/// backup)`, in address order): `(address, offset, bytes)`, blocks adjacent
/// both in memory and in the backup in one copy.
pub(super) fn copy_runs(placed: &[(u64, u64, u64)]) -> Vec<(u64, u64, u64)> {
    let mut runs: Vec<(u64, u64, u64)> = Vec::new();
    for &(addr, size, offset) in placed {
        match runs.last_mut() {
            Some((a, o, n)) if *a + *n == addr && *o + *n == offset => *n += size,
            _ => runs.push((addr, offset, size)),
        }
    }
    runs
}

impl VirtualPool {
    /// The pinned pool of the backups, made at first use.
    fn host_pool<'a>(&self, host: &'a mut Option<PinnedPool>) -> Result<&'a PinnedPool> {
        match host {
            Some(p) => Ok(p),
            None => {
                let p = PinnedPool::with_defaults(PinnedHostResource::new(self.device.clone()))?;
                Ok(host.insert(p))
            }
        }
    }

    /// Copies `placed` blocks (`(address, size, offset)`, as [`layout`]
    /// places them; `bytes` in all, more than 0) into a new backup on
    /// `stream`, after the work enqueued there, in slices of about `slice`
    /// bytes with an event after each ([`CopiedSlices`]): the caller waits
    /// for a slice before its pages go. On an error nothing is kept.
    pub(super) fn back_up(
        &self,
        host: &mut Option<PinnedPool>,
        placed: &[(u64, u64, u64)],
        bytes: usize,
        slice: u64,
        stream: &Stream,
    ) -> Result<(HostBackup, CopiedSlices)> {
        let pool = self.host_pool(host)?;
        let ptr = pool.allocate(bytes, 256, stream)?;
        let backup = HostBackup { ptr, bytes };
        let mut copied = CopiedSlices::done();
        let copies = slices(placed, slice).into_iter().try_for_each(|part| {
            copy_runs(part).into_iter().try_for_each(|(addr, off, n)| {
                pool.copy_to_host_async(DevicePtr(ptr.0 + off), DevicePtr(addr), n as usize, stream)
            })?;
            let last = part.last().expect("slices are not empty");
            copied.ends.push(last.0 + last.1);
            let n = copied.ends.len() as u64;
            copied.batches.seal(stream, n, &copied.events)
        });
        if let Err(e) = copies {
            // Reused only once the copies enqueued have run.
            let _ = stream.synchronize();
            Self::free_backup(host, backup);
            return Err(e);
        }
        Ok((backup, copied))
    }

    /// Copies `backup` back into `placed` blocks (`(address, size, offset)`:
    /// those it was made from, or some of them) on `stream`, after the work
    /// enqueued there; the caller synchronizes the stream.
    pub(super) fn restore(
        &self,
        host: &mut Option<PinnedPool>,
        backup: HostBackup,
        placed: &[(u64, u64, u64)],
        stream: &Stream,
    ) -> Result<()> {
        let pool = self.host_pool(host)?;
        copy_runs(placed)
            .into_iter()
            .try_for_each(|(addr, off, n)| {
                pool.copy_to_device_async(
                    DevicePtr(addr),
                    DevicePtr(backup.ptr.0 + off),
                    n as usize,
                    stream,
                )
            })
    }

    /// Gives a backup's memory back to the pinned pool (reused once its
    /// copies have run; pinned until [`VirtualPool::release_host_backups`]).
    pub(super) fn free_backup(host: &Option<PinnedPool>, backup: HostBackup) {
        if let Some(pool) = host {
            if let Err(e) = pool.free(backup.ptr) {
                log::error!(
                    "virtual pool: the host backup at {:#x} could not be freed: {e}",
                    backup.ptr.0
                );
            }
        }
    }

    /// Gives the pinned host memory no backup uses back to the driver
    /// (backups no longer needed keep theirs pinned for the next sleep, as
    /// pinning takes long); returns its bytes. Backups of regions asleep
    /// stay.
    pub fn release_host_backups(&self) -> Result<usize> {
        let st = self.lock();
        st.regions.host.as_ref().map_or(Ok(0), Pool::release)
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_runs, layout, slices};

    #[test]
    fn adjacent_blocks_are_copied_together() {
        let placed = layout(&[(0x1000, 0x100), (0x1100, 0x200), (0x2000, 0x100)]);
        assert_eq!(
            placed,
            vec![
                (0x1000, 0x100, 0),
                (0x1100, 0x200, 0x100),
                (0x2000, 0x100, 0x300)
            ]
        );
        assert_eq!(
            copy_runs(&placed),
            vec![(0x1000, 0, 0x300), (0x2000, 0x300, 0x100)]
        );
        // Adjacent in memory but not in the backup (a block between them in
        // the backup was freed): two copies.
        assert_eq!(
            copy_runs(&[(0x1000, 0x100, 0), (0x1100, 0x100, 0x200)]),
            vec![(0x1000, 0, 0x100), (0x1100, 0x200, 0x100)]
        );
        assert_eq!(copy_runs(&[]), vec![]);
    }

    #[test]
    fn slices_cut_at_whole_blocks_and_cover_everything() {
        let placed: Vec<(u64, u64, u64)> = [3, 3, 5, 1, 1, 1, 9]
            .iter()
            .scan(0, |a, &n| {
                *a += n;
                Some((*a - n, n, 0))
            })
            .collect();
        let sizes = |v: Vec<&[(u64, u64, u64)]>| -> Vec<Vec<u64>> {
            v.iter().map(|s| s.iter().map(|p| p.1).collect()).collect()
        };
        assert_eq!(
            sizes(slices(&placed, 6)),
            vec![vec![3, 3], vec![5, 1], vec![1, 1], vec![9]]
        );
        assert_eq!(sizes(slices(&placed, 100)), vec![vec![3, 3, 5, 1, 1, 1, 9]]);
        assert_eq!(sizes(slices(&placed, 1)).len(), placed.len());
        assert!(slices(&[], 6).is_empty());
    }
}
