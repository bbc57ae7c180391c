//! `MemPool`: one CUDA memory pool handle and its typed attributes.
//!
//! Every async resource holds one `MemPool` and dereferences to it, so the
//! attributes read the same on all of them: `resource.release_threshold()`,
//! `resource.usage()`. Each getter or setter is one
//! `cuMemPoolGetAttribute` / `cuMemPoolSetAttribute` call (tens of ns on the
//! driver, no synchronization).
//!
//! A `MemPool` either owns its handle (pools gpumem created or imported, which
//! it destroys on drop) or borrows it (the device's default pool, pools of other
//! libraries), in which case dropping it leaves the pool alone.

use crate::device::Device;
use crate::driver::{DevicePtr, HandleType, Location, PoolAttr, RawPool};
use crate::pool::stream_order::streams::synchronize_device;
use crate::resource::{validate_request, HandedOut, LiveBlock, Properties, DEFAULT_ALIGNMENT};
use crate::stream::Stream;
use crate::{Error, Result};

/// One of the pool's three reuse policies (all on by default in CUDA).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReusePolicy {
    /// Reuse memory freed on another stream once event dependencies recorded
    /// after the free show it complete
    /// (`CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES`).
    FollowEventDependencies,
    /// Reuse memory whose free has already completed, without dependencies
    /// (`CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC`).
    AllowOpportunistic,
    /// Reuse memory freed on another stream by making the allocating stream wait
    /// for the freeing stream (`CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`).
    AllowInternalDependencies,
}

impl ReusePolicy {
    /// All three policies.
    pub const ALL: [ReusePolicy; 3] = [
        ReusePolicy::FollowEventDependencies,
        ReusePolicy::AllowOpportunistic,
        ReusePolicy::AllowInternalDependencies,
    ];

    fn attr(self) -> PoolAttr {
        match self {
            ReusePolicy::FollowEventDependencies => PoolAttr::ReuseFollowEventDependencies,
            ReusePolicy::AllowOpportunistic => PoolAttr::ReuseAllowOpportunistic,
            ReusePolicy::AllowInternalDependencies => PoolAttr::ReuseAllowInternalDependencies,
        }
    }
}

/// The pool's memory counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolUsage {
    /// Bytes the pool holds from the device now (`RESERVED_MEM_CURRENT`).
    pub reserved: usize,
    /// Highest `reserved` since the last reset (`RESERVED_MEM_HIGH`).
    pub peak_reserved: usize,
    /// Bytes handed out and not yet freed (`USED_MEM_CURRENT`).
    pub live: usize,
    /// Highest `live` since the last reset (`USED_MEM_HIGH`).
    pub peak_live: usize,
}

/// A CUDA memory pool of one device: its handle, what it hands out, and its
/// typed attributes. Owned pools are destroyed when this drops; borrowed ones
/// (the default pool, foreign pools) are not.
///
/// The handle is live (see [`crate::driver`]) as long as this value: an
/// owned pool (created or imported here) is destroyed only by its drop; a
/// borrowed one is a device's default pool, which lives as long as the
/// device's primary context (neither backend releases it), or a foreign pool
/// whose owner promised it outlives the view
/// ([`AsyncViewResource::new`](super::AsyncViewResource::new)). Every driver
/// call of this type and of its `access` and `ipc` modules rests on that.
pub struct MemPool {
    device: Device,
    raw: RawPool,
    owned: bool,
    location: Location,
    handle_type: HandleType,
    properties: Properties,
    max_size: usize,
    imported: bool,
    /// Allocations made through this handle and not yet freed, so bad frees
    /// are refused before `cuMemFreeAsync`.
    handed_out: HandedOut,
}

impl std::fmt::Debug for MemPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemPool")
            .field("raw", &format_args!("{:#x}", self.raw))
            .field("device", &self.device.ordinal())
            .field("owned", &self.owned)
            .field("location", &self.location)
            .field("handle_type", &self.handle_type)
            .field("max_size", &self.max_size)
            .field("imported", &self.imported)
            .finish()
    }
}

impl MemPool {
    /// Wraps a handle. `owned` pools are destroyed on drop.
    pub(crate) fn new(
        device: Device,
        raw: RawPool,
        owned: bool,
        location: Location,
        handle_type: HandleType,
        properties: Properties,
        max_size: usize,
    ) -> Self {
        Self {
            device,
            raw,
            owned,
            location,
            handle_type,
            properties,
            max_size,
            imported: false,
            handed_out: HandedOut::default(),
        }
    }

    /// Marks the pool as imported from another process: its owning device is
    /// then unknown here, so access questions always go to the driver.
    #[cfg(unix)]
    pub(crate) fn mark_imported(mut self) -> Self {
        self.imported = true;
        self
    }

    /// True for a pool imported from another process.
    #[inline]
    pub fn is_imported(&self) -> bool {
        self.imported
    }

    /// The raw pool handle (a `CUmemoryPool`), for other libraries.
    #[inline]
    pub fn raw(&self) -> RawPool {
        self.raw
    }

    /// The device whose driver serves this pool.
    #[inline]
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// True when gpumem destroys this pool on drop.
    #[inline]
    pub fn is_owned(&self) -> bool {
        self.owned
    }

    /// Where the pool's memory lives.
    #[inline]
    pub fn location(&self) -> Location {
        self.location
    }

    /// The IPC handle type the pool was created with ([`HandleType::None`] for
    /// the default pool and foreign pools).
    #[inline]
    pub fn handle_type(&self) -> HandleType {
        self.handle_type
    }

    /// The most bytes the pool may reserve; `None` when it has no limit (or
    /// the limit is unknown: pools gpumem did not create).
    #[inline]
    pub fn max_reserved(&self) -> Option<usize> {
        (self.max_size > 0).then_some(self.max_size)
    }

    /// Where the pool's memory can be accessed from.
    #[inline]
    pub fn properties(&self) -> Properties {
        self.properties
    }

    fn get(&self, attr: PoolAttr) -> Result<u64> {
        // SAFETY: the pool is live while `self` is (see `MemPool`).
        unsafe { self.device.driver().mempool_get_attr(self.raw, attr) }
    }

    fn set(&self, attr: PoolAttr, value: u64) -> Result<()> {
        // SAFETY: the pool is live while `self` is (see `MemPool`).
        unsafe { self.device.driver().mempool_set_attr(self.raw, attr, value) }
    }

    /// `cuMemPoolTrimTo` on the pool.
    fn trim_to(&self, keep: usize) -> Result<()> {
        // SAFETY: the pool is live while `self` is (see `MemPool`).
        unsafe { self.device.driver().mempool_trim_to(self.raw, keep) }
    }

    fn get_bytes(&self, attr: PoolAttr) -> Result<usize> {
        Ok(usize::try_from(self.get(attr)?).unwrap_or(usize::MAX))
    }

    /// Bytes of unused memory the pool keeps across synchronizations
    /// (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`). `u64::MAX` keeps everything.
    pub fn release_threshold(&self) -> Result<u64> {
        self.get(PoolAttr::ReleaseThreshold)
    }

    /// Sets the release threshold: at each synchronization the pool returns
    /// unused memory to the device until it holds at most `bytes`.
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.set(PoolAttr::ReleaseThreshold, bytes)
    }

    /// Whether a reuse policy is on.
    pub fn reuse_policy(&self, policy: ReusePolicy) -> Result<bool> {
        Ok(self.get(policy.attr())? != 0)
    }

    /// Turns a reuse policy on or off.
    pub fn set_reuse_policy(&self, policy: ReusePolicy, enabled: bool) -> Result<()> {
        self.set(policy.attr(), u64::from(enabled))
    }

    /// Bytes the pool holds from the device now.
    pub fn reserved_current(&self) -> Result<usize> {
        self.get_bytes(PoolAttr::ReservedMemCurrent)
    }

    /// Highest [`MemPool::reserved_current`] since the last reset.
    pub fn reserved_high(&self) -> Result<usize> {
        self.get_bytes(PoolAttr::ReservedMemHigh)
    }

    /// Bytes handed out by the pool and not yet freed.
    pub fn used_current(&self) -> Result<usize> {
        self.get_bytes(PoolAttr::UsedMemCurrent)
    }

    /// Highest [`MemPool::used_current`] since the last reset.
    pub fn used_high(&self) -> Result<usize> {
        self.get_bytes(PoolAttr::UsedMemHigh)
    }

    /// Resets the reserved high-water mark to the current reserved bytes.
    pub fn reset_reserved_high(&self) -> Result<()> {
        self.set(PoolAttr::ReservedMemHigh, 0)
    }

    /// Resets the used high-water mark to the current used bytes.
    pub fn reset_used_high(&self) -> Result<()> {
        self.set(PoolAttr::UsedMemHigh, 0)
    }

    /// All four memory counters (four driver calls; not one atomic snapshot).
    pub fn usage(&self) -> Result<PoolUsage> {
        Ok(PoolUsage {
            reserved: self.reserved_current()?,
            peak_reserved: self.reserved_high()?,
            live: self.used_current()?,
            peak_live: self.used_high()?,
        })
    }

    /// Every allocation made through this handle and not yet freed, in
    /// address order, with the bytes asked for and those rounded up to 256
    /// bytes (the alignment CUDA guarantees; the driver's own rounding cannot
    /// be read). O(allocations), for snapshots.
    pub fn live_blocks(&self) -> Vec<LiveBlock> {
        self.handed_out.live_blocks()
    }

    /// The bytes asked for by the live allocation at `ptr`, if it is one made
    /// through this handle.
    pub fn allocation_size(&self, ptr: DevicePtr) -> Option<usize> {
        self.handed_out.bytes_of(ptr)
    }

    /// Returns unused memory to the device (`cuMemPoolTrimTo`: CUDA keeps at
    /// least `to` bytes, the simulated device at most `to`); the bytes given
    /// back. Memory whose free has not yet run on its stream is not unused.
    pub(crate) fn give_back(&self, to: usize) -> Result<usize> {
        self.giving_back(|| self.trim_to(to))
    }

    /// Synchronizes the device, so every free has run (the synchronization
    /// itself returns what the release threshold does not keep), then
    /// returns all unused memory; the bytes given back. When the
    /// synchronization fails, the memory whose frees have run goes back all
    /// the same and the error is returned.
    pub(crate) fn give_back_all(&self) -> Result<usize> {
        self.giving_back(|| {
            // Without the wait, the trim still gives back the memory whose
            // frees have run; the failed wait is the answer after it.
            let waited = self.device.synchronize();
            self.trim_to(0)?;
            waited
        })
    }

    /// The reserved bytes `give` returns to the device.
    fn giving_back(&self, give: impl FnOnce() -> Result<()>) -> Result<usize> {
        let before = self.reserved_current()?;
        give()?;
        Ok(before.saturating_sub(self.reserved_current()?))
    }

    /// Allocates from the pool on `stream` (`cuMemAllocFromPoolAsync`) with the
    /// rules of [`MemoryResource::allocate`](crate::resource::MemoryResource::allocate).
    pub(crate) fn allocate(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<DevicePtr> {
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        let s = stream.raw_on(&self.device)?;
        // SAFETY: the pool is live while `self` is (see `MemPool`), the
        // stream while the borrowed `stream` is, and it is this driver's
        // (`raw_on` checked).
        let alloc = || unsafe {
            self.device
                .driver()
                .mem_alloc_from_pool_async(bytes, self.raw, s)
        };
        let got = match alloc() {
            // Memory freed on other streams returns to the pool only when
            // their frees have run: wait for them and try once more.
            // Never while a capture is under way: CUDA refuses the
            // synchronization then, and the refusal breaks the capture.
            Err(e) if e.is_oom() && synchronize_device(&self.device).is_ok() => alloc(),
            other => other,
        };
        match got {
            Ok(p) => {
                self.handed_out.insert(p, bytes, ());
                Ok(p)
            }
            Err(e) if e.is_oom() => Err(self.oom(bytes, e)),
            Err(e) => Err(e),
        }
    }

    /// Frees on `stream` (`cuMemFreeAsync`) an allocation of `bytes` made
    /// through this handle. Anything else (another allocator's pointer, a
    /// second free, another size) is [`Error::InvalidFree`] and the driver is
    /// not called: one table insert and remove per allocation, a few percent
    /// of the driver's microsecond.
    pub(crate) fn deallocate(&self, ptr: DevicePtr, bytes: usize, stream: &Stream) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let s = stream.raw_on(&self.device)?;
        self.handed_out.free_with(ptr, bytes, |_| {
            // SAFETY: `ptr` was just taken out of `handed_out`: an allocation
            // of this pool, handed out and freed once, whose owner frees it
            // in `stream`'s order (the resource rules). The stream is live
            // while borrowed and this driver's (`raw_on` checked).
            unsafe { self.device.driver().mem_free_async(ptr, s) }
        })
    }

    /// The driver's out-of-memory error, completed with what the pool knows.
    fn oom(&self, requested: usize, err: Error) -> Error {
        let mut info = err.oom_info().cloned().unwrap_or_default();
        info.requested = requested;
        info.device = Some(self.device.ordinal());
        if let Ok(r) = self.reserved_current() {
            info.reserved = Some(r);
        }
        if let Ok(u) = self.used_current() {
            info.live = Some(u);
        }
        if self.max_size > 0 {
            info.limit = Some(self.max_size);
        }
        Error::oom_with(info)
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        // Live allocations keep the pool's memory until they are freed (the
        // driver destroys it then).
        if self.owned {
            let (driver, raw) = (self.device.driver(), self.raw);
            crate::exit::give_back(
                || format!("memory pool {raw:#x}"),
                // SAFETY: an owned pool, created or imported for this value
                // alone (never a default pool), destroyed only here.
                || unsafe { driver.mempool_destroy(raw) },
            );
        }
    }
}
