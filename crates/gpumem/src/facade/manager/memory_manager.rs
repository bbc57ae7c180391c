//! `MemoryManager`: one object that owns a pinned host pool and a device pool
//! for one device, and moves data between them on streams.
//!
//! Each device has its own manager ([`MemoryManager::global_for`], or
//! [`MemoryManager::new`] per device): a manager's pools, records and frees
//! are its device's alone, so a pointer of another device's manager is
//! [`Error::InvalidFree`] here and stays live there.
//!
//! Pools are built lazily, at the first allocation of each kind, so sizes and
//! the device allocator mode can be chosen before; afterwards changing them is
//! an [`Error::InvalidArgument`]. The manager records every device allocation
//! (pointer → bytes, one ordered-map operation under a mutex) so
//! that frees need no size, copies can check that their device range is the
//! manager's, and shutdown can report what was never freed. Shutdown refuses
//! while pinned memory is live ([`Error::InUse`]): safe code may hold
//! references into it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use super::device_mode::{DeviceAllocatorMode, DeviceBackend};
use super::pinned_pool::{PinnedPool, PinnedPoolConfig, PinnedRelease};
use super::planned_pool::PlannedPool;
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::pool::stream_order::sync::{lock, read_lock, write_lock};
use crate::resource::{
    MemoryResource, PinnedHostResource, Properties, SharedResource, DEFAULT_ALIGNMENT,
};
use crate::stream::Stream;
use crate::{Error, Result};

const NAME: &str = "MemoryManager";

#[derive(Debug, Clone)]
struct Settings {
    pinned_size: Option<usize>,
    device_size: Option<usize>,
    mode: DeviceAllocatorMode,
}

/// What [`MemoryManager::shutdown`] gave back and found outstanding.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShutdownReport {
    /// Pinned bytes given back to the driver.
    pub released_pinned_bytes: usize,
    /// Device bytes the device pool held when it was released.
    pub released_device_bytes: usize,
    /// Pinned allocations never freed: (pointer, bytes). Always empty from
    /// [`MemoryManager::shutdown`], which refuses while any is live; filled by
    /// [`MemoryManager::shutdown_unchecked`], whose release frees them.
    pub outstanding_pinned: Vec<(DevicePtr, usize)>,
    /// Device allocations never freed: (pointer, bytes). They were freed by
    /// the shutdown.
    pub outstanding_device: Vec<(DevicePtr, usize)>,
}

impl std::fmt::Display for ShutdownReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sum = |v: &[(DevicePtr, usize)]| v.iter().map(|x| x.1).sum::<usize>();
        write!(
            f,
            "released {} pinned and {} device bytes; outstanding: {} pinned allocations ({} bytes), {} device allocations ({} bytes)",
            self.released_pinned_bytes,
            self.released_device_bytes,
            self.outstanding_pinned.len(),
            sum(&self.outstanding_pinned),
            self.outstanding_device.len(),
            sum(&self.outstanding_device),
        )
    }
}

/// The process-wide memory manager: a pinned host pool, a device pool and
/// copies between them. Thread-safe; see the module documentation.
///
/// ```
/// use gpumem::driver::sim::SimConfig;
/// use gpumem::manager::{DeviceAllocatorMode, MemoryManager};
/// use gpumem::Device;
///
/// # fn main() -> gpumem::Result<()> {
/// let mm = MemoryManager::new(Device::sim(SimConfig::backed(64 << 20)));
/// mm.set_device_allocator_mode(DeviceAllocatorMode::AsyncStreamOrdered)?;
/// let stream = mm.device().create_stream()?;
/// let host = mm.allocate_pinned(4096)?;
/// let dev = mm.allocate_device_async(4096, &stream)?;
/// mm.copy_to_device_async(dev, host, 4096, &stream)?;
/// mm.free_pinned(host)?; // reused only once the copy has run
/// mm.free_device_async(dev, &stream)?;
/// let report = mm.shutdown()?;
/// assert!(report.outstanding_device.is_empty());
/// assert!(mm.allocate_pinned(1).is_err());
/// # Ok(())
/// # }
/// ```
pub struct MemoryManager {
    device: Device,
    supports_async: bool,
    settings: Mutex<Settings>,
    pinned: RwLock<Option<Arc<PinnedPool>>>,
    device_pool: RwLock<Option<Arc<DeviceBackend>>>,
    /// Set once the device pool was built (settings are frozen then).
    device_started: AtomicBool,
    pinned_started: AtomicBool,
    /// Effective device mode and why, fixed when the device pool is built.
    effective: Mutex<Option<(DeviceAllocatorMode, Option<String>)>>,
    live_device: Mutex<BTreeMap<u64, usize>>,
    shut: AtomicBool,
}

impl std::fmt::Debug for MemoryManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryManager")
            .field("device", &self.device)
            .field("settings", &*lock(&self.settings))
            .field("shut_down", &self.shut.load(Ordering::Relaxed))
            .finish()
    }
}

fn read<T: Clone>(m: &RwLock<Option<T>>) -> Option<T> {
    read_lock(m).clone()
}

static GLOBAL: OnceLock<MemoryManager> = OnceLock::new();

impl MemoryManager {
    /// The process-wide manager, made at the first call over
    /// [`Device::auto`]: CUDA device 0 when a CUDA driver and GPU are present,
    /// else a default simulated device (80 GiB of addresses, no data behind
    /// device memory; pinned memory is real host memory). It lives until the
    /// process exits; [`MemoryManager::shutdown`] releases its pools earlier.
    pub fn global() -> &'static MemoryManager {
        GLOBAL.get_or_init(|| MemoryManager::new(Device::auto()))
    }

    /// The process-wide manager of device `ordinal` of
    /// [`MemoryManager::global`]'s driver, made at the first call for it:
    /// each device has its own, with its own pools (the global one is
    /// device 0's). [`Error::NoSuchDevice`] for an ordinal the driver lacks.
    pub fn global_for(ordinal: u32) -> Result<&'static MemoryManager> {
        static OTHERS: OnceLock<Box<[OnceLock<MemoryManager>]>> = OnceLock::new();
        let global = Self::global();
        if ordinal == global.device.ordinal() {
            return Ok(global);
        }
        let device = global.device.sibling(ordinal)?;
        let others = OTHERS.get_or_init(|| {
            let count = global.device.driver().device_count().unwrap_or(0);
            (0..count).map(|_| OnceLock::new()).collect()
        });
        let slot = others.get(ordinal as usize).ok_or(Error::NoSuchDevice {
            device: ordinal,
            count: others.len() as u32,
        })?;
        Ok(slot.get_or_init(|| MemoryManager::new(device)))
    }

    /// A manager of its own over `device` (tests, several devices).
    pub fn new(device: Device) -> Self {
        let supports_async = device.info().map(|i| i.memory_pools).unwrap_or(false);
        Self {
            device,
            supports_async,
            settings: Mutex::new(Settings {
                pinned_size: None,
                device_size: None,
                mode: DeviceAllocatorMode::default(),
            }),
            pinned: RwLock::new(None),
            device_pool: RwLock::new(None),
            device_started: AtomicBool::new(false),
            pinned_started: AtomicBool::new(false),
            effective: Mutex::new(None),
            live_device: Mutex::new(BTreeMap::new()),
            shut: AtomicBool::new(false),
        }
    }

    /// The device the manager serves.
    pub fn device(&self) -> &Device {
        &self.device
    }

    fn check_open(&self) -> Result<()> {
        if self.shut.load(Ordering::Acquire) {
            Err(Error::ShutDown(NAME))
        } else {
            Ok(())
        }
    }

    // ----- settings -----

    /// The settings, for a change allowed only before the first allocation
    /// `started` records; `what` names the change for the error.
    fn settings_before(
        &self,
        started: &AtomicBool,
        what: &str,
    ) -> Result<MutexGuard<'_, Settings>> {
        self.check_open()?;
        let s = lock(&self.settings);
        if started.load(Ordering::Acquire) {
            return Err(Error::InvalidArgument(format!(
                "{what} cannot change after the first allocation it governs"
            )));
        }
        Ok(s)
    }

    /// Sets the pinned pool's size: `bytes` are pinned at the first pinned
    /// allocation and the pool never grows past them. Without it the pool
    /// grows on demand in 32 MiB regions. Only before the first pinned
    /// allocation; afterwards [`Error::InvalidArgument`].
    pub fn set_pinned_pool_size(&self, bytes: usize) -> Result<()> {
        let mut s = self.settings_before(
            &self.pinned_started,
            &format!("the pinned pool size (asked for {bytes} bytes)"),
        )?;
        s.pinned_size = Some(bytes);
        Ok(())
    }

    /// Sets the device pool's size: `bytes` are reserved at the first device
    /// allocation and the pool never grows past them (CUDA's pool: primed with
    /// `bytes` and capped there). Without it: grow on demand, keep everything.
    /// Only before the first device allocation; afterwards
    /// [`Error::InvalidArgument`].
    pub fn set_device_pool_size(&self, bytes: usize) -> Result<()> {
        let mut s = self.settings_before(
            &self.device_started,
            &format!("the device pool size (asked for {bytes} bytes)"),
        )?;
        s.device_size = Some(bytes);
        Ok(())
    }

    /// Chooses the device allocator. Only before the first device allocation;
    /// afterwards [`Error::InvalidArgument`]. Asking for
    /// [`DeviceAllocatorMode::CudaAsyncPool`] where the driver has no
    /// stream-ordered pools is accepted: the effective mode is then `Pool`
    /// ([`MemoryManager::device_allocator_mode_reason`] says why).
    pub fn set_device_allocator_mode(&self, mode: DeviceAllocatorMode) -> Result<()> {
        let mut s = self.settings_before(
            &self.device_started,
            &format!("the device allocator mode (asked for {mode})"),
        )?;
        s.mode = mode;
        Ok(())
    }

    /// The mode asked for (the default is [`DeviceAllocatorMode::Pool`]).
    pub fn requested_device_allocator_mode(&self) -> DeviceAllocatorMode {
        lock(&self.settings).mode
    }

    /// The mode in use (or that will be used): the requested one, or `Pool`
    /// when CUDA's pool was asked for and the driver lacks it.
    pub fn effective_device_allocator_mode(&self) -> DeviceAllocatorMode {
        if let Some((m, _)) = &*lock(&self.effective) {
            return *m;
        }
        self.resolve(self.requested_device_allocator_mode()).0
    }

    /// Why the effective mode differs from the requested one (`None` when it
    /// does not).
    pub fn device_allocator_mode_reason(&self) -> Option<String> {
        if let Some((_, r)) = &*lock(&self.effective) {
            return r.clone();
        }
        self.resolve(self.requested_device_allocator_mode()).1
    }

    /// True when the driver has stream-ordered memory pools, which
    /// [`DeviceAllocatorMode::CudaAsyncPool`] needs.
    pub fn supports_async_device_allocator(&self) -> bool {
        self.supports_async
    }

    fn resolve(&self, mode: DeviceAllocatorMode) -> (DeviceAllocatorMode, Option<String>) {
        if mode == DeviceAllocatorMode::CudaAsyncPool && !self.supports_async {
            (
                DeviceAllocatorMode::Pool,
                Some(format!(
                    "{mode} requested, but device {} ({} backend) has no stream-ordered memory pools; using {}",
                    self.device.ordinal(),
                    self.device.backend(),
                    DeviceAllocatorMode::Pool
                )),
            )
        } else {
            (mode, None)
        }
    }

    // ----- pools -----

    /// The pinned pool, built at the first call (for collections in pinned
    /// memory: `allocator_api2::vec::Vec<T, &PinnedPool>`).
    pub fn pinned_pool(&self) -> Result<Arc<PinnedPool>> {
        self.check_open()?;
        if let Some(p) = read(&self.pinned) {
            return Ok(p);
        }
        let s = lock(&self.settings);
        let mut slot = write_lock(&self.pinned);
        self.check_open()?;
        if let Some(p) = &*slot {
            return Ok(p.clone());
        }
        let config = match s.pinned_size {
            Some(bytes) => PinnedPoolConfig::fixed(bytes),
            None => PinnedPoolConfig::default(),
        };
        let upstream = PinnedHostResource::new(self.device.clone());
        let pool = Arc::new(PinnedPool::new(upstream, config)?);
        *slot = Some(pool.clone());
        self.pinned_started.store(true, Ordering::Release);
        Ok(pool)
    }

    fn device_backend(&self) -> Result<Arc<DeviceBackend>> {
        self.check_open()?;
        if let Some(p) = read(&self.device_pool) {
            return Ok(p);
        }
        let s = lock(&self.settings);
        let mut slot = write_lock(&self.device_pool);
        self.check_open()?;
        if let Some(p) = &*slot {
            return Ok(p.clone());
        }
        let (mode, reason) = self.resolve(s.mode);
        if let Some(r) = &reason {
            log::warn!("{r}");
        }
        let backend = Arc::new(DeviceBackend::build(&self.device, mode, s.device_size)?);
        *lock(&self.effective) = Some((mode, reason));
        *slot = Some(backend.clone());
        self.device_started.store(true, Ordering::Release);
        Ok(backend)
    }

    /// A shared resource over the manager's device pool (for
    /// [`DeviceBuffer`](crate::DeviceBuffer)s and planned pools). Its
    /// allocations are not in the manager's records: free them through it.
    pub fn device_resource(&self) -> Result<SharedResource> {
        Ok(Arc::new(ManagerDevice(self.device_backend()?)))
    }

    /// A [`PlannedPool`] over the manager's pools with the given capacities.
    pub fn planned_pool(
        &self,
        host_capacity: usize,
        device_capacity: usize,
    ) -> Result<PlannedPool> {
        Ok(PlannedPool::new(
            self.pinned_pool()?,
            self.device_resource()?,
            host_capacity,
            device_capacity,
        ))
    }

    // ----- pinned memory -----

    /// `bytes` of pinned host memory, 256-byte aligned (null for 0 bytes).
    pub fn allocate_pinned(&self, bytes: usize) -> Result<DevicePtr> {
        self.pinned_pool()?.allocate_sync(bytes, DEFAULT_ALIGNMENT)
    }

    /// Frees pinned memory; it is reused once the copies that used it are done.
    pub fn free_pinned(&self, ptr: DevicePtr) -> Result<()> {
        self.pinned_pool()?.free(ptr)
    }

    // ----- device memory -----

    fn record(&self, ptr: DevicePtr, bytes: usize) {
        if !ptr.is_null() {
            lock(&self.live_device).insert(ptr.0, bytes);
        }
    }

    fn forget(&self, ptr: DevicePtr) -> Result<usize> {
        lock(&self.live_device)
            .remove(&ptr.0)
            .ok_or(Error::InvalidFree {
                ptr: ptr.0,
                reason: crate::FreeError::Unknown,
            })
    }

    /// `bytes` of device memory usable by any stream at once.
    pub fn allocate_device(&self, bytes: usize) -> Result<DevicePtr> {
        let b = self.device_backend()?;
        let p = b.resource().allocate_sync(bytes, DEFAULT_ALIGNMENT)?;
        self.record(p, bytes);
        Ok(p)
    }

    /// Frees device memory that no stream uses any more.
    pub fn free_device(&self, ptr: DevicePtr) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let b = self.device_backend()?;
        let bytes = self.forget(ptr)?;
        b.resource().deallocate_sync(ptr, bytes, DEFAULT_ALIGNMENT)
    }

    /// `bytes` of device memory usable by work on `stream` at once.
    pub fn allocate_device_async(&self, bytes: usize, stream: &Stream) -> Result<DevicePtr> {
        let b = self.device_backend()?;
        let p = b.resource().allocate(bytes, DEFAULT_ALIGNMENT, stream)?;
        self.record(p, bytes);
        Ok(p)
    }

    /// Frees device memory once the work enqueued on `stream` so far has run.
    /// In [`DeviceAllocatorMode::Pool`] this waits for `stream` and frees at
    /// once; in the other modes it does not block.
    pub fn free_device_async(&self, ptr: DevicePtr, stream: &Stream) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        let b = self.device_backend()?;
        let bytes = self.forget(ptr)?;
        if self.effective_device_allocator_mode() == DeviceAllocatorMode::Pool {
            stream.synchronize()?;
            b.resource().deallocate_sync(ptr, bytes, DEFAULT_ALIGNMENT)
        } else {
            b.resource()
                .deallocate(ptr, bytes, DEFAULT_ALIGNMENT, stream)
        }
    }

    fn check_device_range(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let live = lock(&self.live_device);
        let end = ptr.0.checked_add(bytes as u64);
        match live.range(..=ptr.0).next_back() {
            Some((&base, &n)) if end.is_some_and(|e| e <= base + n as u64) => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "device range {:#x}+{bytes} is not inside a live device allocation of this manager",
                ptr.0
            ))),
        }
    }

    /// Enqueues a copy of `bytes` from pinned memory at `src` (from
    /// [`MemoryManager::allocate_pinned`]) to device memory at `dst` (from the
    /// manager's device allocations) on `stream`. Both ranges are checked; the
    /// pinned block is not reused before the copy has run, even if freed at
    /// once.
    pub fn copy_to_device_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_open()?;
        if bytes == 0 {
            return Ok(());
        }
        self.check_device_range(dst, bytes)?;
        self.pinned_pool()?
            .copy_to_device_async(dst, src, bytes, stream)
    }

    /// Enqueues a copy of `bytes` from the manager's device memory at `src`
    /// into pinned memory at `dst` on `stream` (see
    /// [`PinnedPool::copy_to_host_async`] for what host code may do meanwhile).
    pub fn copy_to_host_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_open()?;
        if bytes == 0 {
            return Ok(());
        }
        self.check_device_range(src, bytes)?;
        self.pinned_pool()?
            .copy_to_host_async(dst, src, bytes, stream)
    }

    /// Device bytes the device pool holds (0 before the first allocation).
    pub fn device_reserved_bytes(&self) -> usize {
        read(&self.device_pool).map_or(0, |b| b.reserved())
    }

    /// Device allocations the manager handed out and has not taken back.
    pub fn outstanding_device(&self) -> Vec<(DevicePtr, usize)> {
        lock(&self.live_device)
            .iter()
            .map(|(&p, &n)| (DevicePtr(p), n))
            .collect()
    }

    // ----- shutdown -----

    /// Shuts the manager down: every later allocation is [`Error::ShutDown`];
    /// pending copies are waited for; outstanding device allocations are
    /// freed; both pools give all their memory back to the driver. Returns what
    /// was released and what was still outstanding (also logged as a warning
    /// when anything was). A second call returns an empty report.
    ///
    /// Pinned memory is host memory that safe code may still hold references
    /// into, so while pinned allocations are live (from
    /// [`MemoryManager::allocate_pinned`], a collection in
    /// [`MemoryManager::pinned_pool`], a [`PlannedPool`]'s layout) the call is
    /// refused with [`Error::InUse`], which lists them, and nothing changes.
    /// The same holds when waiting for the pinned pool's copies fails. See
    /// [`MemoryManager::shutdown_unchecked`] to force it.
    pub fn shutdown(&self) -> Result<ShutdownReport> {
        self.shutdown_with(PinnedPool::release_all)
    }

    /// [`MemoryManager::shutdown`] even while pinned allocations are live:
    /// their memory is given back too ([`PinnedPool::release_all_unchecked`])
    /// and they are listed in [`ShutdownReport::outstanding_pinned`].
    ///
    /// # Safety
    /// As for [`PinnedPool::release_all_unchecked`]: no outstanding pinned
    /// allocation may be used after the call (no reference into one, no copy
    /// naming one, no drop of a collection or plan that owns one: leak those).
    pub unsafe fn shutdown_unchecked(&self) -> Result<ShutdownReport> {
        // SAFETY: forwarded to the caller.
        self.shutdown_with(|p| unsafe { p.release_all_unchecked() })
    }

    fn shutdown_with(
        &self,
        release_pinned: impl FnOnce(&PinnedPool) -> Result<PinnedRelease>,
    ) -> Result<ShutdownReport> {
        let _s = lock(&self.settings);
        let mut report = ShutdownReport::default();
        {
            let mut slot = write_lock(&self.pinned);
            if let Some(p) = &*slot {
                // Refused (live allocations, a failed wait): nothing changed.
                let r = release_pinned(p)?;
                report.released_pinned_bytes = r.released_bytes;
                report.outstanding_pinned = r.outstanding;
                *slot = None;
            }
            self.shut.store(true, Ordering::Release);
        }
        let mut first_err = None;
        let backend = write_lock(&self.device_pool).take();
        let outstanding: Vec<_> = std::mem::take(&mut *lock(&self.live_device))
            .into_iter()
            .map(|(p, n)| (DevicePtr(p), n))
            .collect();
        if let Some(b) = backend {
            if let Err(e) = self.device.synchronize() {
                first_err.get_or_insert(e);
            }
            for &(p, n) in &outstanding {
                if let Err(e) = b.resource().deallocate_sync(p, n, DEFAULT_ALIGNMENT) {
                    first_err.get_or_insert(e);
                }
            }
            report.released_device_bytes = b.reserved();
            // The pool gives its regions back when the last handle drops (now,
            // unless another thread is inside a call or holds a device_resource).
            drop(b);
        }
        report.outstanding_device = outstanding;
        if !report.outstanding_pinned.is_empty() || !report.outstanding_device.is_empty() {
            log::warn!("MemoryManager shut down: {report}");
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(report),
        }
    }

    /// True once [`MemoryManager::shutdown`] ran.
    pub fn is_shut_down(&self) -> bool {
        self.shut.load(Ordering::Acquire)
    }
}

/// The manager's device pool as a [`MemoryResource`].
struct ManagerDevice(Arc<DeviceBackend>);

impl MemoryResource for ManagerDevice {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        self.0.resource().allocate(bytes, alignment, stream)
    }
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.0.resource().deallocate(ptr, bytes, alignment, stream)
    }
    fn device(&self) -> &Device {
        self.0.resource().device()
    }
    fn properties(&self) -> Properties {
        self.0.resource().properties()
    }
    fn identity(&self) -> *const () {
        Arc::as_ptr(&self.0) as *const ()
    }
}
