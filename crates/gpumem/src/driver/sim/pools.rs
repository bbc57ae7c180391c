//! Stream-ordered memory pools (`cuMemPool*`, `cuMemAllocAsync`, `cuMemFreeAsync`).
//!
//! Each allocation reserves whole granules (2 MiB by default) from the device:
//! a block of `round_up(bytes, granularity)` bytes with its own address range.
//! A freed block goes back to the pool's cache when its `cuMemFreeAsync` runs
//! in stream order, and is handed out again to a request whose granule-rounded
//! size is at least the block's half (best fit by (length, address)). Cached
//! blocks are returned to the device by `cuMemPoolTrimTo`, when the device is
//! full, and at synchronize calls beyond the release threshold (default 0), as
//! CUDA does. Used bytes are the requests rounded to 256; used <= reserved,
//! and reserved counts toward device capacity.
//!
//! A destroyed pool with live allocations lives on until they are freed.
//! Imported pools share the exporter's state; imported pointers are aliases:
//! new addresses over the same backing bytes, removed by `cuMemFreeAsync`.
//!
//! Costs: O(log n) per allocation and free (cache and translation table).

use std::collections::BTreeSet;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::address_space::{round_up, BASE_ALIGN};
use super::faults::{drv, INVALID_DEVICE, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED};
use super::ipc;
use super::memory::{PoolBlock, Region};
use super::streams::{Op, QueueId};
use super::{PoolId, State};
use crate::driver::{
    AccessFlags, AllocationType, DevicePtr, HandleType, Location, PoolAttr, PoolProps,
    PoolPtrExport, RawPool,
};
use crate::{Error, OomInfo, Result};

/// One pool's state (shared by all handles to it).
#[derive(Debug)]
pub(super) struct PoolState {
    pub(super) device: u32,
    pub(super) props: PoolProps,
    pub(super) is_default: bool,
    release_threshold: u64,
    reuse: [u64; 3],
    pub(super) reserved: u64,
    reserved_high: u64,
    pub(super) used: u64,
    used_high: u64,
    /// Cached (freed) blocks by (length, address).
    cache: BTreeSet<(u64, u64)>,
    cached: u64,
    /// Blocks handed out whose free has not run yet.
    pub(super) live_blocks: usize,
    /// Handles naming this pool (the creator's and imported ones).
    handles: usize,
    access: Vec<AccessFlags>,
}

impl PoolState {
    pub(super) fn new(device: u32, props: PoolProps, is_default: bool, devices: usize) -> Self {
        PoolState {
            device,
            props,
            is_default,
            release_threshold: 0,
            reuse: [1, 1, 1],
            reserved: 0,
            reserved_high: 0,
            used: 0,
            used_high: 0,
            cache: BTreeSet::new(),
            cached: 0,
            live_blocks: 0,
            handles: 1,
            access: vec![AccessFlags::None; devices],
        }
    }

    /// The access `device` has to this pool's memory.
    pub(super) fn access_of(&self, device: u32) -> AccessFlags {
        if device == self.device {
            AccessFlags::ReadWrite
        } else {
            self.access
                .get(device as usize)
                .copied()
                .unwrap_or(AccessFlags::None)
        }
    }
}

/// What a pool handle names.
#[derive(Debug, Clone, Copy)]
pub(super) struct PoolHandle {
    pub(super) pool: PoolId,
}

impl State {
    fn pools_on(&self, call: &'static str) -> Result<()> {
        if self.cfg.memory_pools {
            Ok(())
        } else {
            Err(drv(call, NOT_SUPPORTED))
        }
    }

    /// The pool a handle names.
    pub(super) fn pool_of(&self, h: RawPool, call: &'static str) -> Result<PoolId> {
        self.pools_on(call)?;
        self.pool_handles
            .get(&h)
            .map(|p| p.pool)
            .ok_or_else(|| drv(call, INVALID_HANDLE))
    }

    /// Makes the default pool of a device.
    pub(super) fn make_default_pool(&mut self, device: u32) -> RawPool {
        let id = self.fresh_id();
        let n = self.devices.len();
        self.pools.insert(
            id,
            PoolState::new(device, PoolProps::device(device), true, n),
        );
        let h = self.fresh_handle(super::TAG_POOL);
        self.pool_handles.insert(h, PoolHandle { pool: id });
        h
    }

    /// `cuDeviceGetDefaultMemPool` / `cuDeviceGetMemPool`.
    pub(super) fn mempool_default(&self, device: u32, call: &'static str) -> Result<RawPool> {
        self.pools_on(call)?;
        Ok(self.devices[device as usize].default_pool)
    }

    /// `cuMemPoolCreate`.
    pub(super) fn mempool_create(&mut self, props: &PoolProps) -> Result<RawPool> {
        const CALL: &str = "cuMemPoolCreate";
        self.pools_on(CALL)?;
        let device = match props.location {
            Location::Device(d) if (d as usize) < self.devices.len() => d,
            Location::Device(_) => return Err(drv(CALL, INVALID_DEVICE)),
            Location::Host | Location::HostNuma(_) => {
                return Err(Error::unsupported(
                    "host-located memory pools on the simulated device",
                ))
            }
        };
        if props.alloc_type == AllocationType::Managed && !self.cfg.managed_memory {
            return Err(drv(CALL, NOT_SUPPORTED));
        }
        match props.handle_type {
            HandleType::None => {}
            HandleType::PosixFd if self.cfg.posix_fd_ipc => {}
            HandleType::PosixFd => return Err(drv(CALL, NOT_SUPPORTED)),
            HandleType::Fabric => {
                return Err(Error::unsupported("fabric handles on the simulated device"))
            }
        }
        let id = self.fresh_id();
        let n = self.devices.len();
        self.pools
            .insert(id, PoolState::new(device, props.clone(), false, n));
        let h = self.fresh_handle(super::TAG_POOL);
        self.pool_handles.insert(h, PoolHandle { pool: id });
        Ok(h)
    }

    /// `cuMemPoolDestroy`: the pool goes once its last handle is destroyed and
    /// its last allocation freed.
    pub(super) fn mempool_destroy(&mut self, h: RawPool) -> Result<()> {
        const CALL: &str = "cuMemPoolDestroy";
        let id = self.pool_of(h, CALL)?;
        if self.pools.get(&id).is_some_and(|p| p.is_default) {
            return Err(drv(CALL, INVALID_VALUE));
        }
        self.pool_handles.remove(&h);
        if let Some(p) = self.pools.get_mut(&id) {
            p.handles -= 1;
        }
        self.maybe_drop_pool(id);
        Ok(())
    }

    fn maybe_drop_pool(&mut self, id: PoolId) {
        let Some(p) = self.pools.get(&id) else {
            return;
        };
        if p.handles == 0 && p.live_blocks == 0 && !p.is_default {
            self.release_chunks(id, 0, 0);
            self.pools.remove(&id);
        }
    }

    /// Returns cached blocks to the device, largest first, until the cache
    /// holds at most `keep_cached` bytes or the pool reserves at most
    /// `keep_reserved` bytes.
    fn release_chunks(&mut self, id: PoolId, keep_cached: u64, keep_reserved: u64) {
        loop {
            let Some(p) = self.pools.get_mut(&id) else {
                return;
            };
            if p.cached <= keep_cached || p.reserved <= keep_reserved {
                return;
            }
            let Some((len, addr)) = p.cache.pop_last() else {
                return;
            };
            p.cached -= len;
            p.reserved -= len;
            let device = p.device;
            self.regions.remove(&addr);
            self.give_device_range(device, addr, len);
        }
    }

    /// What synchronize calls do for pools: release cached memory of the
    /// device's pools beyond their release thresholds.
    pub(super) fn release_at_sync(&mut self, device: u32) {
        let ids: Vec<PoolId> = self
            .pools
            .iter()
            .filter(|(_, p)| p.device == device)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            let t = self.pools[&id].release_threshold;
            self.release_chunks(id, 0, t);
        }
    }

    /// `cuMemPoolSetAttribute`.
    pub(super) fn mempool_set_attr(&mut self, h: RawPool, attr: PoolAttr, v: u64) -> Result<()> {
        const CALL: &str = "cuMemPoolSetAttribute";
        let id = self.pool_of(h, CALL)?;
        let p = self
            .pools
            .get_mut(&id)
            .ok_or_else(|| drv(CALL, INVALID_HANDLE))?;
        match attr {
            PoolAttr::ReleaseThreshold => p.release_threshold = v,
            PoolAttr::ReuseFollowEventDependencies => p.reuse[0] = u64::from(v != 0),
            PoolAttr::ReuseAllowOpportunistic => p.reuse[1] = u64::from(v != 0),
            PoolAttr::ReuseAllowInternalDependencies => p.reuse[2] = u64::from(v != 0),
            PoolAttr::ReservedMemHigh if v == 0 => p.reserved_high = p.reserved,
            PoolAttr::UsedMemHigh if v == 0 => p.used_high = p.used,
            _ => return Err(drv(CALL, INVALID_VALUE)),
        }
        Ok(())
    }

    /// `cuMemPoolGetAttribute`.
    pub(super) fn mempool_get_attr(&self, h: RawPool, attr: PoolAttr) -> Result<u64> {
        const CALL: &str = "cuMemPoolGetAttribute";
        let id = self.pool_of(h, CALL)?;
        let p = self
            .pools
            .get(&id)
            .ok_or_else(|| drv(CALL, INVALID_HANDLE))?;
        Ok(match attr {
            PoolAttr::ReleaseThreshold => p.release_threshold,
            PoolAttr::ReuseFollowEventDependencies => p.reuse[0],
            PoolAttr::ReuseAllowOpportunistic => p.reuse[1],
            PoolAttr::ReuseAllowInternalDependencies => p.reuse[2],
            PoolAttr::ReservedMemCurrent => p.reserved,
            PoolAttr::ReservedMemHigh => p.reserved_high,
            PoolAttr::UsedMemCurrent => p.used,
            PoolAttr::UsedMemHigh => p.used_high,
        })
    }

    /// `cuMemPoolTrimTo`: release cached blocks until at most `keep` unused
    /// (cached) bytes remain.
    pub(super) fn mempool_trim_to(&mut self, h: RawPool, keep: usize) -> Result<()> {
        let id = self.pool_of(h, "cuMemPoolTrimTo")?;
        self.release_chunks(id, 0, keep as u64);
        Ok(())
    }

    /// `cuMemPoolSetAccess`.
    pub(super) fn mempool_set_access(
        &mut self,
        h: RawPool,
        device: u32,
        access: AccessFlags,
    ) -> Result<()> {
        const CALL: &str = "cuMemPoolSetAccess";
        let id = self.pool_of(h, CALL)?;
        if device as usize >= self.devices.len() {
            return Err(drv(CALL, INVALID_DEVICE));
        }
        let p = self
            .pools
            .get_mut(&id)
            .ok_or_else(|| drv(CALL, INVALID_HANDLE))?;
        if device == p.device {
            // The owning device always has read-write access.
            return if access == AccessFlags::ReadWrite {
                Ok(())
            } else {
                Err(drv(CALL, INVALID_VALUE))
            };
        }
        p.access[device as usize] = access;
        Ok(())
    }

    /// `cuMemPoolGetAccess`.
    pub(super) fn mempool_get_access(&self, h: RawPool, device: u32) -> Result<AccessFlags> {
        const CALL: &str = "cuMemPoolGetAccess";
        let id = self.pool_of(h, CALL)?;
        if device as usize >= self.devices.len() {
            return Err(drv(CALL, INVALID_DEVICE));
        }
        Ok(self
            .pools
            .get(&id)
            .map_or(AccessFlags::None, |p| p.access_of(device)))
    }

    /// `cuMemAllocFromPoolAsync` / `cuMemAllocAsync` of `bytes` from pool `id`,
    /// completing in stream order on `q`.
    pub(super) fn pool_alloc(
        &mut self,
        id: PoolId,
        bytes: usize,
        q: QueueId,
        call: &'static str,
    ) -> Result<DevicePtr> {
        if bytes == 0 {
            return Err(drv(call, INVALID_VALUE));
        }
        let device = self.pools.get(&id).map_or(0, |p| p.device);
        self.faults.on_alloc(bytes, device)?;
        let too_big = || super::faults::oom(bytes, Some(device));
        let size = round_up(bytes as u64, BASE_ALIGN).ok_or_else(too_big)?;
        let chunk = round_up(size, self.gran).ok_or_else(too_big)?;
        let p = self
            .pools
            .get_mut(&id)
            .ok_or_else(|| drv(call, INVALID_HANDLE))?;
        let reuse = p
            .cache
            .range((chunk, 0)..)
            .next()
            .copied()
            .filter(|&(len, _)| len / 2 < chunk);
        let addr = if let Some((len, addr)) = reuse {
            p.cache.remove(&(len, addr));
            p.cached -= len;
            addr
        } else {
            let max = p.props.max_size as u64;
            if max > 0 && p.reserved.checked_add(chunk).is_none_or(|r| r > max) {
                self.release_chunks(id, 0, 0);
                let p = &self.pools[&id];
                if p.reserved.checked_add(chunk).is_none_or(|r| r > max) {
                    return Err(Error::oom_with(OomInfo {
                        requested: bytes,
                        device: Some(device),
                        reserved: Some(p.reserved as usize),
                        live: Some(p.used as usize),
                        largest_free: Some(0),
                        limit: Some(max as usize),
                    }));
                }
            }
            let taken = match self.take_device_range(device, chunk, bytes) {
                Ok(t) => t,
                Err(e) if e.is_oom() && self.pools[&id].cached > 0 => {
                    self.release_chunks(id, 0, 0);
                    self.take_device_range(device, chunk, bytes)?
                }
                Err(e) => return Err(e),
            };
            let (addr, buf) = taken;
            self.regions.insert(
                addr,
                Region::Pool(PoolBlock {
                    pool: id,
                    device,
                    len: chunk,
                    size: 0,
                    live: false,
                    free_enqueued: false,
                    alias_of: None,
                    buf: buf.map(Arc::new),
                }),
            );
            let p = self.pools.get_mut(&id).expect("pool checked above");
            p.reserved += chunk;
            p.reserved_high = p.reserved_high.max(p.reserved);
            addr
        };
        if let Some(Region::Pool(b)) = self.regions.get_mut(&addr) {
            b.live = true;
            b.size = size;
        }
        let p = self.pools.get_mut(&id).expect("pool checked above");
        p.used += size;
        p.used_high = p.used_high.max(p.used);
        p.live_blocks += 1;
        self.enqueue(q, Op::Marker);
        Ok(DevicePtr(addr))
    }

    /// `cuMemFreeAsync`: the block returns to its pool when the free runs.
    pub(super) fn mem_free_async(&mut self, ptr: DevicePtr, q: QueueId) -> Result<()> {
        const CALL: &str = "cuMemFreeAsync";
        match self.regions.get_mut(&ptr.0) {
            Some(Region::Pool(b)) if b.live && !b.free_enqueued => b.free_enqueued = true,
            _ => return Err(drv(CALL, INVALID_VALUE)),
        }
        self.enqueue(q, Op::PoolFree { addr: ptr.0 });
        Ok(())
    }

    /// Runs a `cuMemFreeAsync`.
    pub(super) fn exec_pool_free(&mut self, addr: u64) {
        let Some(Region::Pool(b)) = self.regions.get_mut(&addr) else {
            self.stats.faults += 1;
            return;
        };
        if b.alias_of.is_some() {
            let (device, len) = (b.device, b.len);
            self.regions.remove(&addr);
            self.devices[device as usize].space.free(addr, len);
            return;
        }
        b.live = false;
        b.free_enqueued = false;
        let (pool, len, size) = (b.pool, b.len, std::mem::take(&mut b.size));
        if let Some(p) = self.pools.get_mut(&pool) {
            p.used -= size;
            p.cache.insert((len, addr));
            p.cached += len;
            p.live_blocks -= 1;
        }
        self.maybe_drop_pool(pool);
    }

    /// `cuMemPoolExportToShareableHandle`.
    pub(super) fn mempool_export_fd(&self, h: RawPool) -> Result<OwnedFd> {
        const CALL: &str = "cuMemPoolExportToShareableHandle";
        let id = self.pool_of(h, CALL)?;
        if self.pools.get(&id).map(|p| p.props.handle_type) != Some(HandleType::PosixFd) {
            return Err(drv(CALL, INVALID_VALUE));
        }
        ipc::export_token(CALL, "pool", self.uid, id)
    }

    /// `cuMemPoolImportFromShareableHandle`.
    pub(super) fn mempool_import_fd(&mut self, fd: BorrowedFd<'_>) -> Result<RawPool> {
        const CALL: &str = "cuMemPoolImportFromShareableHandle";
        self.pools_on(CALL)?;
        let (kind, uid, id) = ipc::import_token(CALL, fd)?;
        if kind != "pool" || uid != self.uid {
            return Err(drv(CALL, INVALID_VALUE));
        }
        let p = self
            .pools
            .get_mut(&id)
            .filter(|p| p.handles > 0)
            .ok_or_else(|| drv(CALL, INVALID_VALUE))?;
        p.handles += 1;
        let h = self.fresh_handle(super::TAG_POOL);
        self.pool_handles.insert(h, PoolHandle { pool: id });
        Ok(h)
    }

    /// `cuMemPoolExportPointer`.
    pub(super) fn mempool_export_pointer(&self, ptr: DevicePtr) -> Result<PoolPtrExport> {
        const CALL: &str = "cuMemPoolExportPointer";
        self.pools_on(CALL)?;
        match self.regions.get(&ptr.0) {
            Some(Region::Pool(b))
                if b.live
                    && b.alias_of.is_none()
                    && self.pools.get(&b.pool).map(|p| p.props.handle_type)
                        == Some(HandleType::PosixFd) =>
            {
                Ok(ipc::pointer_data(self.uid, b.pool, ptr.0))
            }
            _ => Err(drv(CALL, INVALID_VALUE)),
        }
    }

    /// `cuMemPoolImportPointer`: a new address over the same bytes.
    pub(super) fn mempool_import_pointer(
        &mut self,
        h: RawPool,
        data: &PoolPtrExport,
    ) -> Result<DevicePtr> {
        const CALL: &str = "cuMemPoolImportPointer";
        let id = self.pool_of(h, CALL)?;
        let bad = || drv(CALL, INVALID_VALUE);
        let (uid, pool, addr) = ipc::parse_pointer_data(data).ok_or_else(bad)?;
        if uid != self.uid || pool != id {
            return Err(bad());
        }
        let (device, len, buf) = match self.regions.get(&addr) {
            Some(Region::Pool(b)) if b.live && b.alias_of.is_none() && b.pool == id => {
                (b.device, b.len, b.buf.clone())
            }
            _ => return Err(bad()),
        };
        let at = self.devices[device as usize]
            .space
            .alloc(len, BASE_ALIGN)
            .ok_or_else(|| super::faults::oom(len as usize, Some(device)))?;
        self.regions.insert(
            at,
            Region::Pool(PoolBlock {
                pool: id,
                device,
                len,
                size: 0,
                live: true,
                free_enqueued: false,
                alias_of: Some(addr),
                buf,
            }),
        );
        Ok(DevicePtr(at))
    }

    /// Pools created or imported and not yet gone (default pools excluded).
    pub(super) fn live_pools(&self) -> usize {
        self.pools.values().filter(|p| !p.is_default).count()
    }
}
