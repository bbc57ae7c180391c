//! Regions, sleep and wake through the C ABI, for a device served by a
//! [`VirtualPool`] (`resource=vpool`): what RL frameworks and serving engines
//! use to give a model's weights or a KV cache back to the driver between
//! phases and get them back at the same addresses.
//!
//! ```c
//! int    gpumem_region_begin(int device, uint32_t tag);  // allocations on the device carry tag
//! int    gpumem_region_end(int device);                  // back to the region begun before
//! int    gpumem_sleep(int device, uint32_t tag, int backup);
//! int    gpumem_wake(int device, uint32_t tag);
//! size_t gpumem_sleeping_bytes(int device, uint32_t tag);
//! ```
//!
//! Each returns 0 on success, -1 on failure and -2 when the device's
//! resource is not a VirtualPool, with the reason in `gpumem_last_error`.
//! The region is the device's, not a thread's (every allocation on the
//! device gets it while it is begun). The C ABI passes no stream: sleep
//! first waits for all work on the device, then copies and releases; wake
//! maps, copies back and waits for the copies. A region keeps the pool on
//! one lock shard (see `VirtualPool::begin_region`): a pool whose threads
//! already spread over its shards refuses `gpumem_region_begin` (-1; make
//! it with `shards=1`). See
//! [`VirtualPool::sleep`] and [`VirtualPool::wake`] for the rest.

use std::ffi::c_int;

use gpumem::pool::{Backup, VirtualPool};
use gpumem::{Device, Stream};

use crate::allocator::set_last_error;
use crate::{global, guard, Allocator};

/// What `gpumem_region_*`, `gpumem_sleep` and `gpumem_wake` return when the
/// device's resource is not a VirtualPool.
pub const NOT_A_VIRTUAL_POOL: c_int = -2;

/// Why a region call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionError {
    /// The device's resource is not a VirtualPool (the message says which).
    NotVirtual(String),
    /// The call failed (the message says why).
    Failed(String),
}

impl RegionError {
    /// The reason, for people.
    pub fn message(&self) -> &str {
        match self {
            RegionError::NotVirtual(m) | RegionError::Failed(m) => m,
        }
    }
}

impl Allocator {
    /// Runs `f` on the VirtualPool serving `device` (built on first use),
    /// with the device and its legacy default stream.
    fn with_virtual_pool<T>(
        &self,
        device: i32,
        what: &str,
        f: impl FnOnce(&VirtualPool, &Device, &Stream) -> gpumem::Result<T>,
    ) -> Result<T, RegionError> {
        let fail = |e: &dyn std::fmt::Display| format!("{what} on device {device}: {e}");
        let (served, dev, legacy) = self
            .served(device)
            .map_err(|e| RegionError::Failed(fail(&e)))?;
        let Some(pool) = served.virtual_pool() else {
            let why = format!(
                "regions need resource=vpool, and the device is served by {}",
                served.kind()
            );
            return Err(RegionError::NotVirtual(fail(&why)));
        };
        f(pool, dev, legacy).map_err(|e| RegionError::Failed(fail(&e)))
    }

    /// Begins region `tag` (1 and up) on `device`: every allocation on it
    /// from now on carries the tag, until [`Allocator::region_end`].
    pub fn region_begin(&self, device: i32, tag: u32) -> Result<(), RegionError> {
        self.with_virtual_pool(device, "region_begin", |p, _, _| p.begin_region(tag))
    }

    /// Ends the region begun last on `device`; returns its tag.
    pub fn region_end(&self, device: i32) -> Result<u32, RegionError> {
        self.with_virtual_pool(device, "region_end", |p, _, _| p.end_region())
    }

    /// Puts region `tag` of `device` to sleep once all work on the device is
    /// done, its contents first copied to pinned host memory when `backup`;
    /// returns the device bytes given back to the driver.
    pub fn sleep(&self, device: i32, tag: u32, backup: bool) -> Result<usize, RegionError> {
        let how = if backup {
            Backup::HostPinned
        } else {
            Backup::Discard
        };
        self.with_virtual_pool(device, "sleep", |p, dev, legacy| {
            dev.synchronize()?;
            p.sleep(tag, how, legacy)
        })
    }

    /// Wakes region `tag` of `device`: its memory back at the same
    /// addresses, and its contents if it slept with a backup; returns the
    /// bytes of its blocks.
    pub fn wake(&self, device: i32, tag: u32) -> Result<usize, RegionError> {
        self.with_virtual_pool(device, "wake", |p, _, legacy| p.wake(tag, legacy))
    }

    /// Bytes of region `tag`'s blocks asleep on `device` (0 while it is
    /// awake, or when the device is not served by a VirtualPool or not used
    /// yet: a query builds nothing, so the configuration can still change).
    pub fn sleeping_bytes(&self, device: i32, tag: u32) -> usize {
        self.built_served(device)
            .and_then(|s| s.virtual_pool())
            .map_or(0, |p| p.sleeping_bytes(tag))
    }
}

/// 0, or the code for `e` with its reason as the thread's last error.
fn code<T>(r: Result<T, RegionError>) -> c_int {
    match r {
        Ok(_) => 0,
        Err(e) => {
            set_last_error(e.message());
            match e {
                RegionError::NotVirtual(_) => NOT_A_VIRTUAL_POOL,
                RegionError::Failed(_) => -1,
            }
        }
    }
}

/// Begins region `tag` (1 and up) on `device`: every allocation on the
/// device from now on, from any thread, carries the tag until
/// [`gpumem_region_end`]. Regions nest. 0 on success; -1 on failure (tag 0,
/// a device out of range); -2 when the device's resource is not a
/// VirtualPool (`resource=vpool`); the reason in `gpumem_last_error`.
#[no_mangle]
pub extern "C" fn gpumem_region_begin(device: c_int, tag: u32) -> c_int {
    guard("gpumem_region_begin", -1, || {
        code(global().region_begin(device, tag))
    })
}

/// Ends the region begun last on `device`: allocations carry the region
/// begun before it again (or none). 0 on success; -1 when no region is
/// begun; -2 when the device's resource is not a VirtualPool.
#[no_mangle]
pub extern "C" fn gpumem_region_end(device: c_int) -> c_int {
    guard("gpumem_region_end", -1, || {
        code(global().region_end(device))
    })
}

/// Puts region `tag` of `device` to sleep: waits for all work on the
/// device, copies the region's blocks to pinned host memory when `backup`
/// is not 0, then gives their physical memory back to the driver. The
/// blocks keep their addresses (nothing else gets them); while the region
/// sleeps, freeing them is allowed, allocating in the region fails and
/// kernels must not touch them. On failure the region stays awake as it
/// was. 0 on success; -1 on failure (the region already asleep, a driver
/// error); -2 when the device's resource is not a VirtualPool.
#[no_mangle]
pub extern "C" fn gpumem_sleep(device: c_int, tag: u32, backup: c_int) -> c_int {
    guard("gpumem_sleep", -1, || {
        code(global().sleep(device, tag, backup != 0))
    })
}

/// Wakes region `tag` of `device`: maps memory again at the same addresses
/// and copies the backup back (contents are undefined after a sleep without
/// backup), then waits for the copies. Pointers into the region, and CUDA
/// graphs that use them, work again. On failure (out of memory included)
/// the region stays asleep as it was. 0 on success; -1 on failure (the
/// region not asleep); -2 when the device's resource is not a VirtualPool.
#[no_mangle]
pub extern "C" fn gpumem_wake(device: c_int, tag: u32) -> c_int {
    guard("gpumem_wake", -1, || code(global().wake(device, tag)))
}

/// Bytes of the live blocks of region `tag` on `device` that sleep (0 while
/// it is awake, for a device not served by a VirtualPool, and for one not
/// used yet: the query builds nothing).
#[no_mangle]
pub extern "C" fn gpumem_sleeping_bytes(device: c_int, tag: u32) -> usize {
    guard("gpumem_sleeping_bytes", 0, || {
        global().sleeping_bytes(device, tag)
    })
}
