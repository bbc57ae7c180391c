//! Regions of a [`VirtualPool`]: tags on its blocks, so that a group of
//! blocks (a model's weights, a KV cache) can be put to sleep and woken as
//! one (`sleep.rs`). See the glossary in `docs/virtual_pool.md`.
//!
//! A *tag* is a small number the caller chooses; 0 ([`NO_REGION`]) is no
//! region. While a region is begun ([`VirtualPool::begin_region`]), every
//! block the pool hands out carries its tag, stored in the block's heap
//! entry ([`LaneHeap::set_tag`](crate::suballoc::LaneHeap::set_tag)): one
//! store on the allocation path, and nothing at all when no region is begun.
//! Regions nest: [`VirtualPool::end_region`] goes back to the one begun
//! before. The region is the pool's, not a thread's: every allocation on the
//! pool, from any thread, gets it.
//!
//! While a region sleeps, [`Regions`] keeps its blocks (address, size, place
//! in the backup) and its backup; the blocks stay live and their addresses
//! are not handed out, but the pages only they lie on are unmapped. Freeing
//! one forgets it; other uses of one through gpumem are [`Error::Asleep`].

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::backup::HostBackup;
use super::{State, VirtualPool};
use crate::driver::DevicePtr;
use crate::manager::PinnedPool;
use crate::{Error, Result};

/// The tag of no region: blocks allocated outside every region carry it.
pub const NO_REGION: u32 = 0;

/// What [`VirtualPool::sleep`] does with the contents of the region's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backup {
    /// Copied to pinned host memory before the pages go, and copied back by
    /// [`VirtualPool::wake`]: the blocks come back as they were.
    HostPinned,
    /// Not kept: after [`VirtualPool::wake`] the blocks' contents are
    /// undefined (whatever the memory mapped there held: zeros, or bytes
    /// of blocks freed earlier in this process).
    Discard,
}

/// A block of a region asleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SleepingBlock {
    /// Bytes of the block (as the heap rounded it).
    pub(super) size: u64,
    pub(super) tag: u32,
    /// Where its contents lie in the region's backup.
    pub(super) offset: u64,
}

/// A region asleep.
pub(super) struct Asleep {
    pub(super) tag: u32,
    /// The contents of its blocks, in address order (none for
    /// [`Backup::Discard`], or when every block was freed).
    pub(super) backup: Option<HostBackup>,
    /// Its blocks still live, and their bytes.
    pub(super) blocks: usize,
    pub(super) bytes: u64,
}

/// The regions of a pool: the one begun, those asleep and their blocks.
#[derive(Default)]
pub(super) struct Regions {
    /// The tag new blocks get.
    pub(super) current: u32,
    /// The regions begun before `current` and not ended, innermost last.
    outer: Vec<u32>,
    pub(super) asleep: Vec<Asleep>,
    /// The blocks of the regions asleep, by address.
    pub(super) blocks: BTreeMap<u64, SleepingBlock>,
    /// The pinned host memory of the backups (made at the first backup).
    pub(super) host: Option<PinnedPool>,
}

impl Regions {
    /// The region asleep with `tag`, if it is.
    pub(super) fn asleep(&self, tag: u32) -> Option<&Asleep> {
        self.asleep.iter().find(|a| a.tag == tag)
    }

    /// True when some block is asleep.
    #[inline]
    pub(super) fn has_sleeping_blocks(&self) -> bool {
        !self.blocks.is_empty()
    }

    /// The sleeping block overlapping `[addr, addr + bytes)` (at least one
    /// byte), if there is one: (its address, the block).
    pub(super) fn sleeping_in(&self, addr: u64, bytes: u64) -> Option<(u64, SleepingBlock)> {
        let end = addr.saturating_add(bytes.max(1));
        let (&at, &b) = self.blocks.range(..end).next_back()?;
        (at + b.size > addr).then_some((at, b))
    }

    /// Region `tag` falls asleep with its `placed` blocks (`(address, size,
    /// offset in the backup)`) and `backup`.
    pub(super) fn fall_asleep(
        &mut self,
        tag: u32,
        backup: Option<HostBackup>,
        placed: &[(u64, u64, u64)],
    ) {
        for &(addr, size, offset) in placed {
            self.blocks
                .insert(addr, SleepingBlock { size, tag, offset });
        }
        self.asleep.push(Asleep {
            tag,
            backup,
            blocks: placed.len(),
            bytes: placed.iter().map(|p| p.1).sum(),
        });
    }

    /// The blocks of region `tag` asleep, `(address, size, offset in the
    /// backup)`, in address order.
    pub(super) fn placed(&self, tag: u32) -> Vec<(u64, u64, u64)> {
        self.blocks
            .iter()
            .filter(|(_, b)| b.tag == tag)
            .map(|(&addr, b)| (addr, b.size, b.offset))
            .collect()
    }

    /// Region `tag` is awake again: forgets it and its blocks; returns its
    /// backup.
    pub(super) fn wake(&mut self, tag: u32) -> Option<HostBackup> {
        self.blocks.retain(|_, b| b.tag != tag);
        let i = self.asleep.iter().position(|a| a.tag == tag)?;
        self.asleep.swap_remove(i).backup
    }

    /// Forgets the sleeping block at `addr` (just freed), if it is one: the
    /// region's backup goes once no block needs it. Out of line: frees call
    /// it only while some block sleeps.
    #[cold]
    #[inline(never)]
    pub(super) fn forget(&mut self, addr: u64) {
        let Some(b) = self.blocks.remove(&addr) else {
            return;
        };
        if let Some(a) = self.asleep.iter_mut().find(|a| a.tag == b.tag) {
            a.blocks -= 1;
            a.bytes -= b.size;
            if a.blocks == 0 {
                if let Some(backup) = a.backup.take() {
                    VirtualPool::free_backup(&self.host, backup);
                }
            }
        }
    }
}

/// The error for `what`, refused as region `tag` is asleep.
#[cold]
pub(super) fn asleep_error(tag: u32, what: String) -> Error {
    Error::Asleep { tag, what }
}

/// Refuses the tag of no region where a region is needed.
pub(super) fn check_tag(tag: u32, what: &str) -> Result<()> {
    if tag == NO_REGION {
        return Err(Error::InvalidArgument(format!(
            "virtual pool: {what}: tag 0 is no region (tags are 1 and up)"
        )));
    }
    Ok(())
}

impl VirtualPool {
    /// Begins region `tag` (1 and up): the blocks the pool hands out from
    /// now on, to any thread, carry it, until [`VirtualPool::end_region`].
    /// Regions nest: ending this one goes back to the region begun before.
    /// Allocating in a region asleep is [`Error::Asleep`].
    ///
    /// Regions keep the pool on one lock shard: once one is begun, the
    /// threads never spread over the shards ([`VirtualPoolConfig::shards`](super::VirtualPoolConfig::shards)),
    /// so a sleep or a wake covers every block of the region at once. A
    /// pool whose threads already spread refuses it
    /// ([`Error::Unsupported`]); make such a pool with `shards: 1`.
    ///
    /// ```
    /// use gpumem::driver::sim::SimConfig;
    /// use gpumem::pool::{Backup, VirtualPool, VirtualPoolConfig};
    /// use gpumem::resource::MemoryResource;
    /// use gpumem::Device;
    ///
    /// let device = Device::sim(SimConfig::default());
    /// let pool = VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap();
    /// let s = device.create_stream().unwrap();
    /// const WEIGHTS: u32 = 1;
    /// pool.begin_region(WEIGHTS).unwrap();
    /// let w = pool.allocate(64 << 20, 256, &s).unwrap();
    /// pool.end_region().unwrap();
    /// assert_eq!(pool.region_of(w), Some(WEIGHTS));
    ///
    /// // The weights' pages go back to the driver; their address stays theirs.
    /// pool.sleep(WEIGHTS, Backup::HostPinned, &s).unwrap();
    /// assert_eq!(pool.sleeping_bytes(WEIGHTS), 64 << 20);
    /// assert_eq!(pool.stats().reserved, 0);
    /// // Back, at the same address, with the same contents.
    /// pool.wake(WEIGHTS, &s).unwrap();
    /// assert_eq!(pool.stats().reserved, 64 << 20);
    /// pool.deallocate(w, 64 << 20, 256, &s).unwrap();
    /// ```
    pub fn begin_region(&self, tag: u32) -> Result<()> {
        check_tag(tag, "begin_region")?;
        if !self.shards.pin() {
            return Err(Error::unsupported(
                "regions in a virtual pool whose threads spread over its lock shards \
                 (begin the first region before threads contend, or make the pool with \
                 one shard: shards=1 in GPUMEM_CONF, VirtualPoolConfig::shards = 1 in Rust)",
            ));
        }
        let mut st = self.lock();
        let r = &mut st.regions;
        let outer = r.current;
        r.outer.push(outer);
        r.current = tag;
        Ok(())
    }

    /// Ends the region begun last; returns its tag. New blocks get the
    /// region begun before it again (or none). An error when no region is
    /// begun.
    pub fn end_region(&self) -> Result<u32> {
        let mut st = self.lock();
        let r = &mut st.regions;
        let Some(outer) = r.outer.pop() else {
            return Err(Error::InvalidArgument(
                "virtual pool: end_region: no region is begun".into(),
            ));
        };
        Ok(std::mem::replace(&mut r.current, outer))
    }

    /// The region new blocks get now ([`NO_REGION`] outside every region).
    pub fn current_region(&self) -> u32 {
        self.lock().regions.current
    }

    /// The tag of the live block starting at `ptr` ([`NO_REGION`] for a
    /// block allocated outside every region); `None` when no live block
    /// starts there.
    pub fn region_of(&self, ptr: DevicePtr) -> Option<u32> {
        let st = self.lock_owner(ptr.0);
        let area = st.area_of(ptr.0)?;
        st.areas[area].heap.used_tag(ptr.0)
    }

    /// True while region `tag` sleeps (between [`VirtualPool::sleep`] and
    /// [`VirtualPool::wake`]).
    pub fn is_asleep(&self, tag: u32) -> bool {
        self.lock().regions.asleep(tag).is_some()
    }

    /// Bytes of the live blocks of region `tag` that sleep (as the pool
    /// rounds blocks, to 256 bytes); 0 while it is awake.
    pub fn sleeping_bytes(&self, tag: u32) -> usize {
        self.lock()
            .regions
            .asleep(tag)
            .map_or(0, |a| a.bytes as usize)
    }

    /// Refuses an allocation of `bytes` in the region begun while it
    /// sleeps. Out of line: allocations outside regions never call it.
    #[cold]
    #[inline(never)]
    pub(super) fn check_awake(st: &State, bytes: usize) -> Result<()> {
        let tag = st.regions.current;
        if st.regions.asleep(tag).is_none() {
            return Ok(());
        }
        Err(asleep_error(
            tag,
            format!("cannot allocate {bytes} bytes in it"),
        ))
    }

    /// [`MemoryResource::check_access`](crate::resource::MemoryResource::check_access):
    /// [`Error::Asleep`] when the range overlaps a block asleep. One atomic
    /// load while no region sleeps.
    pub(super) fn check_access_of(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        if !self.any_asleep.load(Ordering::Relaxed) {
            return Ok(());
        }
        let st = self.lock();
        match st.regions.sleeping_in(ptr.0, bytes as u64) {
            Some((at, b)) => Err(asleep_error(
                b.tag,
                format!(
                    "cannot use {bytes} bytes at {:#x}: they lie in its block {at:#x}+{}",
                    ptr.0, b.size
                ),
            )),
            None => Ok(()),
        }
    }
}
