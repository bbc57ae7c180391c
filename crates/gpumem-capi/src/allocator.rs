//! [`Allocator`]: the state behind the C ABI, one value per process (the C
//! functions use a global one) and any number in tests.
//!
//! Per device ordinal, a stack is built lazily at the first allocation on it:
//! a [`Stack`]: a [`gpumem::adaptor::StatisticsAdaptor`] (PyTorch's
//! allocation, active, allocated, requested and active-bytes statistics)
//! over the resource chosen by the configuration (reserve, segments and
//! driver calls, see [`crate::served`]), with RMM's CSV log between them
//! when the configuration asks for one. Foreign stream handles are wrapped once each
//! and kept per device ([`ForeignStreams`], found without a lock), so a pool
//! sees the same stream id for every call with the same handle and reuses
//! blocks on it without events.
//!
//! The configuration comes from `GPUMEM_CONF`, or from
//! [`Allocator::configure`] until the first allocation; from then on it is
//! fixed. Out of memory behaves as PyTorch's allocator: the device's cache
//! is emptied and the allocation retried once (counted in
//! `num_alloc_retries`); a second failure is counted in `num_ooms` and its
//! message (requested, reserved, live, largest free block, limit) kept for
//! the thread ([`last_error`]). A memory fraction caps what a device holds
//! from the driver ([`Allocator::set_memory_fraction`]);
//! [`Allocator::record_stream`] defers a block's free until other streams'
//! work is done ([`StreamUses`]); [`Allocator::snapshot`] lists segments and
//! live blocks; [`Allocator::device_resource`] lends the stack to Rust code.
//!
//! Foreign streams must outlive the memory freed on them (PyTorch's and
//! CuPy's streams do: PyTorch never destroys its pooled streams). A stream
//! destroyed while blocks freed on it sit in a pool, and another one created
//! with the same handle value, would be taken for the first.
//!
//! Errors never escape: a failed allocation returns NULL and is reported as
//! an error (the first [`MAX_OOM_REPORTS`], then a line saying the rest are
//! not); a bad free (a pointer not handed out, a second free, a wrong size)
//! frees nothing, is counted per device ([`Allocator::bad_free_count`]) and
//! reported as a warning (the first [`MAX_BAD_FREE_REPORTS`]). An invalid
//! configuration serves nothing: every allocation returns NULL, reported,
//! and [`Allocator::conf_error`] says why. Reports go through the `log`
//! facade; unless the process has a logger of its own, [`install_logger`]
//! prints them on stderr as `gpumem: {message}` lines.
//!
//! In a child process forked after the first use (Python's `multiprocessing`
//! and PyTorch's `DataLoader` fork by default), every call returns before
//! it takes a lock: allocations return NULL with a message saying why and
//! what to do, frees and statistics do nothing (see [`gpumem::fork`]).

use std::ffi::{CStr, CString};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use gpumem::adaptor::LoggingAdaptor;
use gpumem::device::BackendChoice;
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::Driver;
use gpumem::pool::Pool;
use gpumem::resource::{
    HandedOut, LiveBlock, MemoryResource, Properties, Segment, SharedResource, DEFAULT_ALIGNMENT,
};
use gpumem::{Device, DevicePtr, Error, FreeError, OomInfo, Stream};

use crate::conf::{self, Conf, Parsed, ResourceKind};
use crate::foreign_segments::ForeignSource;
use crate::foreign_streams::ForeignStreams;
use crate::graph_pools::{GraphPools, GraphSegment, Held, PoolId, Retired, StatsOf, DEVICE_POOL};
use crate::last_error::clear_last_error;
pub(crate) use crate::last_error::set_last_error;
pub use crate::last_error::{last_error, last_error_ptr};
use crate::served::{self, Served};
use crate::stack::{Resource, Stack};
use crate::stream_uses::{size_fits_block, Done, StreamUses};
use crate::types::gpumem_device_stats_t;
use gpumem::pool::{Checkpoint, Restored, SizeClass};

/// Most device ordinals served (CUDA devices per process rarely pass 16).
pub const MAX_DEVICES: usize = 64;
/// Out-of-memory reports printed per allocator before the rest are not.
pub const MAX_OOM_REPORTS: u32 = 10;
/// Bad-free reports printed per allocator before the rest are only counted.
pub const MAX_BAD_FREE_REPORTS: u32 = 10;
/// Environment variable choosing the backend: `cuda` (the default here),
/// `sim` or `auto` (CUDA when a GPU is there, else simulated); parsed by
/// [`gpumem::device::BackendChoice`].
pub use gpumem::device::DEVICE_ENV;
/// Number of devices of the simulated driver used with `GPUMEM_DEVICE=sim`.
pub const SIM_DEVICES: u32 = 8;

/// Makes sure the C ABI's reports are printed: installs
/// [`gpumem::logger::StderrLogger`] (`gpumem: {message}` lines on stderr for
/// warnings and errors) unless the process has a logger already. Called
/// where an allocator is made, before anything can be reported.
pub fn install_logger() {
    gpumem::logger::StderrLogger::install();
}

/// Which driver the allocator's devices come from.
#[derive(Clone)]
pub enum Backend {
    /// The CUDA driver (`Device::cuda`).
    Cuda,
    /// A simulated driver; devices are its ordinals.
    Sim(Arc<SimDriver>),
    /// `GPUMEM_DEVICE` names no backend: no device can be used, and each
    /// says why (a misspelt `sim` must not run on the GPU instead).
    Invalid(String),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Cuda => f.write_str("Cuda"),
            Backend::Sim(_) => f.write_str("Sim"),
            Backend::Invalid(why) => write!(f, "Invalid({why:?})"),
        }
    }
}

impl Backend {
    /// The backend `GPUMEM_DEVICE` names (unset: CUDA). A bad value is
    /// reported, and no device can be used then.
    pub fn from_env() -> Backend {
        match BackendChoice::from_env() {
            Ok(None | Some(BackendChoice::Cuda)) => Backend::Cuda,
            Ok(Some(BackendChoice::Sim)) => Backend::sim(),
            Ok(Some(BackendChoice::Auto)) => match Device::cuda(0) {
                Ok(_) => Backend::Cuda,
                Err(_) => Backend::sim(),
            },
            Err(e) => {
                let why = match e {
                    gpumem::Error::InvalidArgument(why) => why,
                    other => other.to_string(),
                };
                log::error!("{why}; every allocation returns NULL");
                Backend::Invalid(why)
            }
        }
    }

    /// A fresh simulated driver with [`SIM_DEVICES`] address-only devices of
    /// 80 GiB each.
    pub fn sim() -> Backend {
        Backend::Sim(Arc::new(SimDriver::new(SimConfig::multi(SIM_DEVICES))))
    }

    fn device(&self, ordinal: u32) -> gpumem::Result<Device> {
        match self {
            Backend::Cuda => Device::cuda(ordinal),
            Backend::Sim(sim) => {
                let driver: Arc<dyn Driver> = sim.clone();
                Device::new(driver, ordinal)
            }
            Backend::Invalid(why) => Err(gpumem::Error::InvalidArgument(why.clone())),
        }
    }
}

/// The two sizes of a block: the bytes asked for and the block that serves
/// them (the same unless the caller rounded the request up).
#[derive(Debug, Clone, Copy)]
struct Sizes {
    requested: usize,
    block: usize,
}

impl From<usize> for Sizes {
    fn from(bytes: usize) -> Self {
        Sizes {
            requested: bytes,
            block: bytes,
        }
    }
}

/// The stack serving one device.
struct DeviceState {
    device: Device,
    /// The configuration it was built with (the one in force from then on).
    conf: Conf,
    /// Bytes of device memory, the base of the memory fraction.
    total_memory: usize,
    stack: Stack,
    /// One wrapper per stream handle.
    streams: ForeignStreams,
    /// CuPy's allocations and their sizes (its frees carry none).
    cupy: HandedOut,
    /// How many `cupy` holds: while none, a free of `gpumem_free` skips
    /// looking there.
    cupy_live: AtomicU64,
    /// `record_stream`: recorded streams and deferred frees.
    uses: StreamUses,
    /// Allocations that failed, emptied the cache and retried.
    retries: AtomicU64,
    /// Allocations that failed after the retry.
    ooms: AtomicU64,
    /// The statistics at the last reset of accumulated statistics.
    baseline: Mutex<[gpumem_device_stats_t; 3]>,
    /// CUDA graphs' private pools.
    graphs: GraphPools,
}

/// What a device holds at one moment ([`Allocator::snapshot`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// What it holds from the driver, in address order.
    pub segments: Vec<Segment>,
    /// Its live blocks with the raw stream each was allocated on (0 where
    /// unknown), in address order.
    pub blocks: Vec<(LiveBlock, u64)>,
    /// The segments of its graph pools (also in `segments`), with their
    /// pool, stream, size class and every block, in address order.
    pub graph_segments: Vec<GraphSegment>,
    /// The segments (by address, in order) that are ranges of virtual
    /// memory grown and shrunk in place (PyTorch's expandable segments);
    /// never a graph pool's.
    pub expandable: Vec<DevicePtr>,
}

/// The configuration and whether it can still change.
struct Settings {
    conf: Conf,
    /// The configuration in force is invalid: nothing is served.
    invalid: bool,
    /// A device was built with `conf`: it can no longer change.
    frozen: bool,
}

/// The C ABI's state: configuration, backend and the per-device stacks.
pub struct Allocator {
    backend: Backend,
    settings: Mutex<Settings>,
    /// `settings.invalid`, read by every allocation.
    invalid: AtomicBool,
    /// What [`Allocator::conf_error`] returns. Every message is kept for the
    /// life of the process, so a pointer handed to C never dangles.
    conf_error: Mutex<Option<&'static CStr>>,
    devices: Box<[OnceLock<Result<DeviceState, String>>]>,
    /// The memory fraction of each device, and the turns to apply its
    /// limit.
    limits: Box<[DeviceLimit]>,
    oom_reports: AtomicU32,
    /// Bad frees per device ordinal, and those naming no valid ordinal.
    bad_frees: Box<[AtomicU64]>,
    bad_frees_elsewhere: AtomicU64,
    bad_free_reports: AtomicU32,
    /// PyTorch's `graph_capture_record_stream_reuse`, shared by every
    /// device's [`StreamUses`].
    reuse_in_capture: Arc<AtomicBool>,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("conf", &self.conf().to_string())
            .field("backend", &self.backend)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `fraction` × `total` bytes, rounded down.
fn fraction_of(total: usize, fraction: f64) -> usize {
    (total as f64 * fraction) as usize
}

/// A device's memory fraction and the turns to apply its limit.
#[derive(Debug)]
struct DeviceLimit {
    /// 1.0: none.
    fraction: AtomicF64,
    turn: Mutex<LimitTurn>,
}

impl Default for DeviceLimit {
    fn default() -> Self {
        Self {
            fraction: AtomicF64::new(1.0),
            turn: Mutex::default(),
        }
    }
}

/// The applications of one device's limit: one at a time, and one asked
/// for while another is under way is made by that one, once more, after
/// it (see [`Allocator::apply_limit`]).
#[derive(Debug, Default)]
struct LimitTurn {
    /// An application is under way.
    busy: bool,
    /// Another was asked for meanwhile.
    again: bool,
}

/// Ends a turn whose application panicked, so that later ones still run.
struct EndTurnOnPanic<'a>(&'a Mutex<LimitTurn>);

impl Drop for EndTurnOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            *lock(self.0) = LimitTurn::default();
        }
    }
}

/// An `f64` kept in an atomic (its bits).
#[derive(Debug)]
struct AtomicF64(AtomicU64);

impl AtomicF64 {
    fn new(v: f64) -> Self {
        Self(AtomicU64::new(v.to_bits()))
    }
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
    fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed)
    }
}

impl Allocator {
    /// An allocator serving `conf` over `backend`; builds nothing yet.
    pub fn new(conf: Conf, backend: Backend) -> Self {
        install_logger();
        Self {
            backend,
            settings: Mutex::new(Settings {
                conf,
                invalid: false,
                frozen: false,
            }),
            invalid: AtomicBool::new(false),
            conf_error: Mutex::new(None),
            devices: (0..MAX_DEVICES).map(|_| OnceLock::new()).collect(),
            limits: (0..MAX_DEVICES).map(|_| DeviceLimit::default()).collect(),
            oom_reports: AtomicU32::new(0),
            bad_frees: (0..MAX_DEVICES).map(|_| AtomicU64::new(0)).collect(),
            bad_frees_elsewhere: AtomicU64::new(0),
            bad_free_reports: AtomicU32::new(0),
            reuse_in_capture: Arc::new(AtomicBool::new(false)),
        }
    }

    /// An allocator for a parsed configuration: when it is invalid, one that
    /// serves nothing and says why (reported on stderr now, and by
    /// [`Allocator::conf_error`]).
    pub fn from_parsed(parsed: Parsed, backend: Backend) -> Self {
        let error = parsed.error();
        let a = Self::new(parsed.conf, backend);
        if let Some(e) = error {
            log::error!("{e}; every allocation returns NULL until it is fixed");
            lock(&a.settings).invalid = true;
            a.invalid.store(true, Ordering::Relaxed);
            a.set_conf_error(Some(&e));
        }
        a
    }

    /// The allocator the environment asks for: `GPUMEM_CONF` over the
    /// backend of `GPUMEM_DEVICE`.
    pub fn from_env() -> Self {
        install_logger();
        Self::from_parsed(conf::from_env(), Backend::from_env())
    }

    /// The configuration in force.
    pub fn conf(&self) -> Conf {
        lock(&self.settings).conf.clone()
    }

    /// Why the configuration in force is invalid (then every allocation
    /// returns NULL); `None` when it is valid. The text lives as long as the
    /// process.
    pub fn conf_error(&self) -> Option<&'static CStr> {
        *lock(&self.conf_error)
    }

    /// Sets what [`Allocator::conf_error`] returns.
    pub(crate) fn set_conf_error(&self, msg: Option<&str>) {
        let kept: Option<&'static CStr> = msg.map(|m| {
            &*Box::leak(
                CString::new(m.replace('\0', " "))
                    .unwrap_or_default()
                    .into_boxed_c_str(),
            )
        });
        *lock(&self.conf_error) = kept;
    }

    /// Sets the configuration (`GPUMEM_CONF`'s syntax) in place of the one in
    /// force, which before the first allocation may be any valid one; after
    /// it, only the configuration already in force is accepted. A refused
    /// text (invalid, or different after the first allocation) changes
    /// nothing: `Err` says why, also kept as the thread's last error
    /// ([`last_error`]).
    pub fn configure(&self, text: &str) -> Result<(), String> {
        let refused = |why: String| {
            set_last_error(&why);
            Err(why)
        };
        let parsed = conf::parse(text);
        let what = format!("configuration {text:?}");
        let mut s = lock(&self.settings);
        if s.frozen {
            if parsed.problems.is_empty() && parsed.conf == s.conf {
                return Ok(());
            }
            return refused(parsed.error_as(&what).unwrap_or_else(|| {
                format!(
                    "{what} cannot be set: gpumem already serves \"{}\" (the configuration must be set before the first allocation)",
                    s.conf
                )
            }));
        }
        let parsed = parsed.check_files();
        if let Some(why) = parsed.error_as(&what) {
            return refused(format!("{why}; the configuration in force is unchanged"));
        }
        s.conf = parsed.conf;
        s.invalid = false;
        self.invalid.store(false, Ordering::Relaxed);
        self.set_conf_error(None);
        Ok(())
    }

    /// The backend.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The resource serving `device`, once built (`None` before the first
    /// allocation on it, or when it could not be built).
    pub fn resource_kind(&self, device: i32) -> Option<ResourceKind> {
        self.built(device).map(|s| s.stack.upstream().kind())
    }

    fn slot(&self, device: i32) -> Option<&OnceLock<Result<DeviceState, String>>> {
        // A negative ordinal wraps far past the table: one comparison.
        self.devices.get(device as u32 as usize)
    }

    /// The state of `device` if it was built.
    /// `None` in a child forked after first use: its locks may be held for
    /// ever there (see [`gpumem::fork`]).
    fn built(&self, device: i32) -> Option<&DeviceState> {
        if gpumem::fork::in_forked_child() {
            return None;
        }
        self.slot(device)?.get()?.as_ref().ok()
    }

    /// [`Allocator::built`], or why there is no state: the device was never
    /// used (for calls that make sense only after an allocation there).
    fn used(&self, device: i32) -> Result<&DeviceState, String> {
        self.built(device)
            .ok_or_else(|| format!("device {device} was never used"))
    }

    /// The state of `device`, built on first use; `Err` says why the device
    /// cannot be served. An invalid configuration builds nothing: the device
    /// is built once a valid one is set. A device that could not be built
    /// (reported once, then) keeps its reason.
    fn state(&self, device: i32) -> Result<&DeviceState, String> {
        let Some(slot) = self.slot(device) else {
            return Err(format!(
                "device {device} is out of range (0..{MAX_DEVICES})"
            ));
        };
        let built = match slot.get() {
            Some(built) => built,
            None => {
                // Checked and frozen at once: from here on `configure` cannot
                // make the configuration invalid, so what is built is valid.
                let conf = {
                    let mut s = lock(&self.settings);
                    if s.invalid {
                        drop(s);
                        let why = self.conf_error().map(|e| e.to_string_lossy().into_owned());
                        return Err(why.unwrap_or_else(|| "the configuration is invalid".into()));
                    }
                    s.frozen = true;
                    s.conf.clone()
                };
                let built = slot.get_or_init(|| self.build(device as u32, conf));
                // A memory fraction set while the device was being built
                // may have found it unbuilt (and not applied itself) after
                // the build read the old one: apply the one in force now.
                if built.is_ok() {
                    self.apply_limit_of(device as usize);
                }
                built
            }
        };
        built
            .as_ref()
            .map_err(|e| format!("device {device} cannot be used: {e}"))
    }

    /// The most `device` may hold from the driver: `max_size` and the memory
    /// fraction, whichever is smaller; `None` for no limit.
    fn limit_of(&self, conf: &Conf, device: u32, total_memory: usize) -> Option<usize> {
        let fraction = self.limits[device as usize].fraction.get();
        let cap = (fraction < 1.0).then(|| fraction_of(total_memory, fraction));
        served::limit(conf, cap)
    }

    /// Builds the stack of device `ordinal` for `conf` (valid). A failure
    /// is reported now and its reason kept: the configured resource is not
    /// replaced by another, since a program that asked for one resource
    /// should not silently run on a different one.
    fn build(&self, ordinal: u32, conf: Conf) -> Result<DeviceState, String> {
        self.try_build(ordinal, conf).inspect_err(|e| {
            log::error!("device {ordinal} cannot be used: {e}; its allocations return NULL");
        })
    }

    fn try_build(&self, ordinal: u32, conf: Conf) -> Result<DeviceState, String> {
        let device = self.backend.device(ordinal).map_err(|e| e.to_string())?;
        let total_memory = device.mem_info().map_or(0, |m| m.total);
        let limit = self.limit_of(&conf, ordinal, total_memory);
        let served = served::build(&conf, &device, limit)
            .map_err(|e| format!("cannot build {conf}: {e}"))?;
        let served = match &conf.log {
            Some(log) => Resource::Other(with_log(served.boxed(), &conf::log_path(log, ordinal))?),
            None => served,
        };
        Ok(DeviceState {
            streams: ForeignStreams::new(&device),
            device,
            conf,
            total_memory,
            stack: Stack::new(served),
            cupy: HandedOut::default(),
            cupy_live: AtomicU64::new(0),
            uses: StreamUses::with_reuse_flag(self.reuse_in_capture.clone()),
            retries: AtomicU64::new(0),
            ooms: AtomicU64::new(0),
            baseline: Mutex::new([gpumem_device_stats_t::default(); 3]),
            graphs: GraphPools::default(),
        })
    }

    /// Reports a failed allocation (an error): the first
    /// [`MAX_OOM_REPORTS`], then one line saying the rest are not.
    fn report_oom(&self, what: &str) {
        let n = self.oom_reports.fetch_add(1, Ordering::Relaxed);
        if n < MAX_OOM_REPORTS {
            log::error!("{what}");
        } else if n == MAX_OOM_REPORTS {
            log::error!("further allocation failures are not reported");
        }
    }

    /// Reports a misuse (a bad free, an unknown pointer; a warning: it was
    /// refused): the first [`MAX_BAD_FREE_REPORTS`], then one line saying the
    /// rest are not.
    fn report_misuse(&self, what: &str) {
        let n = self.bad_free_reports.fetch_add(1, Ordering::Relaxed);
        if n < MAX_BAD_FREE_REPORTS {
            log::warn!("{what}");
        } else if n == MAX_BAD_FREE_REPORTS {
            log::warn!("further bad frees are not reported (gpumem_bad_free_count counts them)");
        }
    }

    /// Counts a bad free on `device` and reports it (see
    /// [`Allocator::report_misuse`]).
    #[cold]
    #[inline(never)]
    fn report_bad_free(&self, device: i32, what: &str) {
        let counter = usize::try_from(device)
            .ok()
            .and_then(|d| self.bad_frees.get(d))
            .unwrap_or(&self.bad_frees_elsewhere);
        counter.fetch_add(1, Ordering::Relaxed);
        self.report_misuse(&format!("{what}; nothing freed"));
    }

    /// Bad frees refused on `device` (pointers not handed out, second frees,
    /// wrong sizes); a negative `device` gives the total over all devices,
    /// frees naming no valid device included.
    pub fn bad_free_count(&self, device: i32) -> u64 {
        match usize::try_from(device) {
            Ok(d) => self
                .bad_frees
                .get(d)
                .map_or(0, |c| c.load(Ordering::Relaxed)),
            Err(_) => {
                self.bad_frees
                    .iter()
                    .map(|c| c.load(Ordering::Relaxed))
                    .sum::<u64>()
                    + self.bad_frees_elsewhere.load(Ordering::Relaxed)
            }
        }
    }

    /// Allocates `size` bytes on `device`, ordered on the raw stream handle
    /// `stream` (0: the legacy default stream). NULL for zero bytes, and on
    /// failure: reported, and kept as the thread's [`last_error`]. Out of
    /// memory empties the device's cache and retries once first.
    #[inline]
    pub fn malloc(&self, size: usize, device: i32, stream: u64) -> DevicePtr {
        self.malloc_rounded(size, size, device, stream)
    }

    /// [`Allocator::malloc`] of a block of `block` bytes for a request of
    /// `requested` bytes that the caller rounded up (PyTorch's native
    /// allocator rounds as PyTorch's own does): the statistics count the
    /// block in `allocated_bytes` and `active_bytes`, the request in
    /// `requested_bytes`. Freed by [`Allocator::free_rounded`] with both
    /// sizes. A request larger than its block fails.
    #[inline]
    pub fn malloc_rounded(
        &self,
        requested: usize,
        block: usize,
        device: i32,
        stream: u64,
    ) -> DevicePtr {
        clear_last_error();
        if block == 0 {
            return DevicePtr::NULL;
        }
        let size = Sizes { requested, block };
        // A device already built serves the configuration it was built with
        // (valid, and fixed from then on). `unusable` is read before any
        // lock: in a forked child, one the parent held at the fork stays
        // held.
        match self.slot(device).and_then(OnceLock::get) {
            Some(Ok(st)) if !unusable() => self.malloc_on(st, size, st.streams.get(stream)),
            _ => self.malloc_first(size, device, stream),
        }
    }

    /// [`Allocator::malloc`] on a device not built yet (builds it, unless
    /// the configuration is invalid), or in a process that may not call the
    /// driver (a forked child, an exiting process).
    #[cold]
    #[inline(never)]
    fn malloc_first(&self, size: Sizes, device: i32, stream: u64) -> DevicePtr {
        if unusable() || self.invalid.load(Ordering::Relaxed) {
            return self.refuse(size.block, device);
        }
        match self.state(device) {
            Ok(st) => self.malloc_on(st, size, st.streams.get(stream)),
            Err(why) => self.cannot_serve(size.block, device, why),
        }
    }

    #[inline]
    fn malloc_on(&self, st: &DeviceState, size: Sizes, stream: &Stream) -> DevicePtr {
        match self.allocate_on(st, size, DEFAULT_ALIGNMENT, stream) {
            Ok(p) => p,
            Err(e) => self.failed(st, size.block, e),
        }
    }

    /// An allocation on a device that cannot be served, as a failed one.
    #[cold]
    #[inline(never)]
    fn cannot_serve(&self, size: usize, device: i32, why: String) -> DevicePtr {
        self.malloc_failed(format!(
            "device {device}: allocation of {size} bytes refused: {why}"
        ))
    }

    /// An allocation the device's stack refused, as a failed one.
    #[cold]
    #[inline(never)]
    fn failed(&self, st: &DeviceState, size: usize, e: Error) -> DevicePtr {
        let device = st.device.ordinal();
        self.malloc_failed(format!(
            "device {device}: allocation of {size} bytes failed: {e}{}",
            self.fraction_note(st)
        ))
    }

    /// Why an allocation cannot be served at all (a forked child, an
    /// exiting process, an invalid configuration), as a failed allocation.
    #[cold]
    #[inline(never)]
    fn refuse(&self, size: usize, device: i32) -> DevicePtr {
        let why = if gpumem::fork::in_forked_child() {
            gpumem::fork::forked_error().to_string()
        } else if gpumem::exit::process_is_exiting() {
            "the process is exiting".to_string()
        } else {
            let why = self.conf_error().map(|e| e.to_string_lossy().into_owned());
            why.unwrap_or_default()
        };
        self.malloc_failed(format!(
            "device {device}: allocation of {size} bytes refused: {why}"
        ))
    }

    /// A failed allocation: `msg` reported and kept as the thread's last
    /// error; NULL.
    #[cold]
    #[inline(never)]
    fn malloc_failed(&self, msg: String) -> DevicePtr {
        set_last_error(&msg);
        if !gpumem::exit::process_is_exiting() {
            self.report_oom(&format!("{msg}; returning NULL"));
        }
        DevicePtr::NULL
    }

    /// ", memory fraction F of T bytes" when a fraction is set on the device.
    fn fraction_note(&self, st: &DeviceState) -> String {
        let f = self.limits[st.device.ordinal() as usize].fraction.get();
        if f < 1.0 {
            format!(" (memory fraction {f} of {} bytes)", st.total_memory)
        } else {
            String::new()
        }
    }

    /// The allocation path every entry point shares: deferred frees whose
    /// streams are done go back first; out of memory empties the cache
    /// (waiting for deferred frees) and retries once, then fails with what
    /// the device holds.
    #[inline]
    fn allocate_on(
        &self,
        st: &DeviceState,
        size: Sizes,
        alignment: usize,
        stream: &Stream,
    ) -> gpumem::Result<DevicePtr> {
        if st.uses.has_pending() {
            self.poll_deferred(st);
        }
        match st
            .stack
            .allocate_rounded(size.requested, size.block, alignment, stream)
        {
            Ok(p) => Ok(p),
            Err(e) => self.not_allocated(st, e, size, alignment, stream),
        }
    }

    /// [`Allocator::allocate_on`] when the stack refused: out of memory
    /// empties the cache (waiting for deferred frees) and retries once, then
    /// fails with what the device holds; any other error is returned. Out of
    /// line, so that a served allocation tests its result once.
    #[cold]
    #[inline(never)]
    fn not_allocated(
        &self,
        st: &DeviceState,
        e: Error,
        size: Sizes,
        alignment: usize,
        stream: &Stream,
    ) -> gpumem::Result<DevicePtr> {
        if !e.is_oom() {
            return Err(e);
        }
        let again = || {
            match st
                .stack
                .allocate_rounded(size.requested, size.block, alignment, stream)
            {
                // The last resort: a MemPool's free memory.
                Err(e) if e.is_oom() => match st.graphs.lend(size.requested, alignment, stream) {
                    Some((_, p)) => Ok(p),
                    None => Err(e),
                },
                other => other,
            }
        };
        match self.after_oom(st, again) {
            Err(e) if e.is_oom() => Err(self.oom_error(st, size.block)),
            other => other,
        }
    }

    /// An allocation on `st` that ran out of memory, tried `again` once:
    /// counts the retry, empties the cache (waiting for deferred frees),
    /// and counts a second out of memory.
    #[cold]
    fn after_oom(
        &self,
        st: &DeviceState,
        again: impl FnOnce() -> gpumem::Result<DevicePtr>,
    ) -> gpumem::Result<DevicePtr> {
        st.retries.fetch_add(1, Ordering::Relaxed);
        self.empty_cache_of(st);
        let r = again();
        if matches!(&r, Err(e) if e.is_oom()) {
            st.ooms.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Out of memory on `st` for `size` bytes, with what the device holds.
    fn oom_error(&self, st: &DeviceState, size: usize) -> Error {
        let served = st.stack.upstream();
        Error::oom_with(OomInfo {
            requested: size,
            device: Some(st.device.ordinal()),
            reserved: Some(served.reserved_bytes()),
            live: Some(st.stack.stats().allocated_bytes.current.max(0) as usize),
            largest_free: Some(served.largest_free_block()),
            limit: self.limit_of(&st.conf, st.device.ordinal(), st.total_memory),
        })
    }

    /// Frees, through `st`, memory from the allocation path: deferred when
    /// the block has recorded streams (see [`StreamUses`]).
    #[inline]
    fn free_on(
        &self,
        st: &DeviceState,
        ptr: DevicePtr,
        size: Sizes,
        stream: &Stream,
    ) -> gpumem::Result<()> {
        if let Some(pool) = st.graphs.lender_of(ptr) {
            return self.free_in_graph_pool(st, ptr, size.requested, pool, stream);
        }
        if st.uses.any() {
            return self.free_with_uses(st, ptr, size, stream);
        }
        st.stack
            .deallocate_rounded(ptr, size.requested, size.block, DEFAULT_ALIGNMENT, stream)
    }

    /// [`Allocator::free_on`] while some block has recorded streams or a
    /// deferred free is pending.
    #[cold]
    #[inline(never)]
    fn free_with_uses(
        &self,
        st: &DeviceState,
        ptr: DevicePtr,
        size: Sizes,
        stream: &Stream,
    ) -> gpumem::Result<()> {
        let Sizes { requested, block } = size;
        let r = if st.uses.defer_free(ptr, block, requested, stream, None)? {
            st.stack.begin_deferred_free_rounded(requested, block);
            Ok(())
        } else {
            st.stack
                .deallocate_rounded(ptr, requested, block, DEFAULT_ALIGNMENT, stream)
        };
        self.poll_deferred(st);
        r
    }

    /// Frees the deferred blocks whose streams are done; reports the frees
    /// the resource refused.
    #[cold]
    #[inline(never)]
    fn poll_deferred(&self, st: &DeviceState) {
        let done = st.uses.poll();
        self.finish_deferred(st, done);
    }

    /// Makes the deferred frees whose streams are done, each where its block
    /// lives; a free the resource refuses (its size was not the block's) is
    /// counted and reported, and the block stays live.
    fn finish_deferred(&self, st: &DeviceState, done: Vec<Done>) {
        let device = st.device.ordinal() as i32;
        for d in done {
            let r = match d.home {
                None => st
                    .stack
                    .finish_deferred_free(d.ptr, d.size, DEFAULT_ALIGNMENT, &d.stream)
                    .inspect_err(|_| st.stack.cancel_deferred_free_rounded(d.requested, d.size)),
                Some(pool) => st
                    .graphs
                    .free(pool, d.ptr, d.size, &d.stream)
                    .map(|retired| self.give_back_retired(st, retired)),
            };
            if let Err(e) = r {
                self.report_bad_free(
                    device,
                    &format!(
                        "bad free of {:#x} ({} bytes) on device {device} after its recorded streams: {}",
                        d.ptr,
                        d.size,
                        free_reason(e)
                    ),
                );
            }
        }
    }

    /// Starts routing allocations to the graph pool `pool` of `device`
    /// (PyTorch's `beginAllocateToPool`): creates it or counts one more use
    /// of it. Which allocations go there is the caller's choice
    /// ([`Allocator::graph_pool_malloc`]). While a capture into any graph
    /// pool is under way, blocks freed on the capturing stream can be held
    /// for the graph ([`Allocator::graph_pool_hold`]).
    pub fn graph_pool_begin(&self, device: i32, pool: PoolId) -> Result<(), String> {
        self.create_graph_pool(device, pool, GraphPools::begin)
    }

    /// Ends one capture into `pool` (PyTorch's `endAllocateToPool`).
    pub fn graph_pool_end(&self, device: i32, pool: PoolId) -> Result<(), String> {
        self.drop_graph_pool_use(device, |g| g.end(pool))
    }

    /// Counts one more use of `pool` (PyTorch's `createOrIncrefPool`),
    /// creating it if needed.
    pub fn graph_pool_retain(&self, device: i32, pool: PoolId) -> Result<(), String> {
        self.create_graph_pool(device, pool, GraphPools::retain)
    }

    /// Creates the graph pool `pool` of `device` with one use, as
    /// [`Allocator::graph_pool_retain`] does, but with its segments from
    /// `source` (PyTorch's `createOrIncrefPool` with an allocator,
    /// `torch.cuda.MemPool(allocator)`): see
    /// [`crate::gpumem_graph_pool_retain_foreign`]. `source` is released
    /// once the pool and its last segment are gone, or at once on `Err`
    /// (the pool exists already, the device cannot be used).
    pub fn graph_pool_retain_foreign(
        &self,
        device: i32,
        pool: PoolId,
        source: ForeignSource,
    ) -> Result<(), String> {
        self.create_graph_pool(device, pool, |graphs, pool, device| {
            graphs.retain_foreign(pool, device, source)
        })
    }

    /// Counts one use of `pool` less (PyTorch's `releasePool`, when a graph
    /// is deleted). With no use and no capture left, the pool goes once its
    /// last block is freed: its memory goes back to the driver after the
    /// device's work is done.
    pub fn graph_pool_release(&self, device: i32, pool: PoolId) -> Result<(), String> {
        self.drop_graph_pool_use(device, |g| g.release(pool))
    }

    /// `begin` or `retain` on `device`'s graph pools (building the device's
    /// state on first use).
    fn create_graph_pool(
        &self,
        device: i32,
        pool: PoolId,
        f: impl FnOnce(&GraphPools, PoolId, &Device) -> gpumem::Result<()>,
    ) -> Result<(), String> {
        if unusable() {
            return Err("gpumem cannot be used in this process".into());
        }
        if pool == DEVICE_POOL {
            return Err(format!(
                "graph pool id {pool:?} names the device's own pool, not a graph pool"
            ));
        }
        let st = self.state(device)?;
        f(&st.graphs, pool, &st.device)
            .map_err(|e| format!("device {device}: graph pool {pool:?}: {e}"))
    }

    /// `end` or `release` on `device`'s graph pools, then frees what a
    /// retired pool held for the device.
    fn drop_graph_pool_use(
        &self,
        device: i32,
        f: impl FnOnce(&GraphPools) -> Result<Option<Retired>, String>,
    ) -> Result<(), String> {
        let st = self.used(device)?;
        let retired = f(&st.graphs)?;
        self.give_back_retired(st, retired);
        Ok(())
    }

    /// Lets the graph pool `pool` of `device` lend its free blocks to the
    /// device's own allocations when they run out of memory (`on`; PyTorch's
    /// `MemPool(use_on_oom=True)`, `setUseOnOOM`), or stops it. When an
    /// allocation from the device's pool fails even after the cache went
    /// back, the free blocks of the pools that lend, in the order they were
    /// made, serve it (the first that has a block that fits, split as
    /// usual; no pool grows for it), as long as something still uses the
    /// pool. The block stays the pool's (its statistics, its snapshot) and
    /// goes back there when freed. `Err` when setting it on a pool that
    /// does not exist; clearing it never fails.
    pub fn graph_pool_set_use_on_oom(
        &self,
        device: i32,
        pool: PoolId,
        on: bool,
    ) -> Result<(), String> {
        let Some(st) = self.built(device) else {
            return if on {
                Err(format!("device {device} was never used"))
            } else {
                Ok(())
            };
        };
        st.graphs
            .set_use_on_oom(pool, on)
            .map_err(|e| format!("device {device}: {e}"))
    }

    /// Makes the graph pool `pool` of `device` hand out its free blocks
    /// whole from now on (PyTorch's `MemPool(no_split=True)`, `setNoSplit`):
    /// each of its segments then holds one block, of the size PyTorch's
    /// allocator gives a segment for the request. `Err` when the pool does
    /// not exist.
    pub fn graph_pool_set_no_split(&self, device: i32, pool: PoolId) -> Result<(), String> {
        let st = self.used(device)?;
        st.graphs
            .set_no_split(pool)
            .map_err(|e| format!("device {device}: {e}"))
    }

    /// Uses of `pool` counted; 0 when it does not exist.
    pub fn graph_pool_use_count(&self, device: i32, pool: PoolId) -> u32 {
        self.built(device).map_or(0, |st| st.graphs.use_count(pool))
    }

    /// The live blocks of `pool`, `None` when it does not exist. A block
    /// whose free waits for recorded streams is not live (PyTorch's
    /// `checkPoolLiveAllocations` counts it freed).
    pub fn graph_pool_live_blocks(&self, device: i32, pool: PoolId) -> Option<Vec<DevicePtr>> {
        let st = self.built(device)?;
        let mut live = st.graphs.live_blocks(pool)?;
        if st.uses.has_pending() {
            let pending = st.uses.pending_ptrs();
            live.retain(|p| !pending.contains(p));
        }
        Some(live)
    }

    /// The device, graph pool, block and raw stream of the live graph-pool
    /// block at `ptr`, on whichever device has it.
    pub fn graph_pool_block(&self, ptr: DevicePtr) -> Option<(i32, PoolId, LiveBlock, u64)> {
        (0..MAX_DEVICES as i32).find_map(|d| {
            let st = self.built(d)?;
            if st.graphs.len() == 0 {
                return None;
            }
            let (pool, block, stream) = st.graphs.block(ptr)?;
            Some((d, pool, block, stream))
        })
    }

    /// Number of graph pools `device` has.
    pub fn graph_pool_count(&self, device: i32) -> usize {
        self.built(device).map_or(0, |st| st.graphs.len())
    }

    /// Sets PyTorch's `graph_capture_record_stream_reuse` for every device:
    /// with it on, a graph-pool block freed during a capture while work on
    /// other streams was recorded on it is reused by the capture before it
    /// ends, once every such stream has joined the stream it was freed on in
    /// the captured graph (see [`crate::capture_reuse`]); off (the default),
    /// it waits for the capture to end. Applies to the frees and allocations
    /// made from now on. Returns the previous setting.
    pub fn set_graph_capture_reuse(&self, on: bool) -> bool {
        self.reuse_in_capture.swap(on, Ordering::Relaxed)
    }

    /// PyTorch's `graph_capture_record_stream_reuse` as set here (off
    /// unless [`Allocator::set_graph_capture_reuse`] turned it on).
    pub fn graph_capture_reuse(&self) -> bool {
        self.reuse_in_capture.load(Ordering::Relaxed)
    }

    /// Allocates `size` bytes from the graph pool `pool` on `stream`. NULL
    /// on failure, with the reason as the thread's [`last_error`]. Out of
    /// memory empties the device's cache and retries once first. During a
    /// capture, with [`Allocator::set_graph_capture_reuse`] on, blocks freed
    /// on `stream` that waited for other streams go back to the pool first
    /// when those streams have joined `stream` in the graph.
    pub fn graph_pool_malloc(
        &self,
        size: usize,
        device: i32,
        pool: PoolId,
        stream: u64,
    ) -> DevicePtr {
        clear_last_error();
        if size == 0 {
            return DevicePtr::NULL;
        }
        let result = self.used(device).and_then(|st| {
            let s = st.streams.get(stream);
            if st.uses.has_marked() {
                let done = st.uses.reusable_in_capture(pool, s);
                self.finish_deferred(st, done);
            }
            let reserved = st.graphs.reserved_bytes().0;
            let mut r = st.graphs.allocate(pool, size, s, self.graph_room(st));
            if matches!(&r, Err(e) if e.is_oom()) {
                r = self.after_oom(st, || {
                    st.graphs.allocate(pool, size, s, self.graph_room(st))
                });
            }
            if st.graphs.reserved_bytes().0 != reserved {
                self.apply_limit(st);
            }
            r.map_err(|e| e.to_string())
        });
        result.unwrap_or_else(|e| {
            let msg = format!(
                "device {device}: allocation of {size} bytes in graph pool {pool:?} failed: {e}"
            );
            set_last_error(&msg);
            self.report_oom(&format!("{msg}; returning NULL"));
            DevicePtr::NULL
        })
    }

    /// Frees a block of the graph pool `pool`; a bad free is counted and
    /// reported.
    pub fn graph_pool_free(
        &self,
        ptr: DevicePtr,
        size: usize,
        device: i32,
        pool: PoolId,
        stream: u64,
    ) {
        if ptr.is_null() || unusable() {
            return;
        }
        let Some(st) = self.built(device) else {
            self.report_bad_free(
                device,
                &format!("free of {ptr:#x} on device {device}, where nothing was allocated"),
            );
            return;
        };
        let r = self.free_in_graph_pool(st, ptr, size, pool, st.streams.get(stream));
        if let Err(e) = r {
            self.report_bad_free(
                device,
                &format!("bad free of {ptr:#x} ({size} bytes) in graph pool {pool:?} on device {device}: {}", free_reason(e)),
            );
        }
    }

    /// Frees a block of the graph pool `pool` of `size` bytes as asked
    /// for, on `stream`: once the work of its recorded streams is done if
    /// it has any (after the capture, when one is under way: see
    /// [`StreamUses`]; its size checked by the pool at once), else at once;
    /// then gives back what a pool that went held for the device. `Err` is
    /// a bad free.
    fn free_in_graph_pool(
        &self,
        st: &DeviceState,
        ptr: DevicePtr,
        size: usize,
        pool: PoolId,
        stream: &Stream,
    ) -> gpumem::Result<()> {
        let deferred = if st.uses.any() {
            st.graphs.check_free(pool, ptr, size)?;
            st.uses.defer_free(ptr, size, size, stream, Some(pool))
        } else {
            Ok(false)
        };
        let r = deferred.and_then(|deferred| {
            if deferred {
                return Ok(());
            }
            let retired = st.graphs.free(pool, ptr, size, stream)?;
            self.give_back_retired(st, retired);
            Ok(())
        });
        if st.uses.has_pending() {
            self.poll_deferred(st);
        }
        r
    }

    /// A free made while `stream` captures into `pool`: the block stays
    /// live and untouched until the graph pool goes (the captured graph may
    /// use it in every replay), if it is a live block of the device's pool
    /// or of another graph pool; a block of `pool` itself is freed there as
    /// [`Allocator::graph_pool_free`] frees it (the capture reuses it in its
    /// own order, but not while work on other streams recorded on it may
    /// still use it). With no capture into `pool` under way, it is freed as
    /// a free outside a capture would be. Anything else is a bad free,
    /// refused and reported as [`Allocator::free`] refuses it: a block held
    /// already or whose free waits for a recorded stream, a CuPy block, a
    /// pointer not handed out, a wrong size.
    pub fn graph_pool_hold(
        &self,
        ptr: DevicePtr,
        size: usize,
        device: i32,
        pool: PoolId,
        stream: u64,
    ) {
        self.graph_pool_hold_rounded(ptr, size, size, device, pool, stream)
    }

    /// [`Allocator::graph_pool_hold`] of a block of
    /// [`Allocator::malloc_rounded`], with the two sizes it was allocated
    /// with.
    pub fn graph_pool_hold_rounded(
        &self,
        ptr: DevicePtr,
        requested: usize,
        size: usize,
        device: i32,
        pool: PoolId,
        stream: u64,
    ) {
        if ptr.is_null() || unusable() {
            return;
        }
        let Some(st) = self.built(device) else {
            return self.free_rounded(ptr, requested, size, device, stream);
        };
        let held = Held {
            ptr,
            size,
            requested,
            stream: st.streams.get(stream).clone(),
        };
        let pending = st.uses.has_pending() && st.uses.pending_ptrs().contains(&ptr);
        if let (false, Some((owner, _))) = (pending, st.graphs.block_size(ptr)) {
            // A graph pool's block is named by its request (the native
            // allocator's rounding is the device pool's, and a block the
            // pool lent to the device carries it).
            let held = Held {
                size: requested,
                ..held
            };
            let r =
                st.graphs
                    .hold_elsewhere(pool, owner, held)
                    .and_then(|declined| match declined {
                        Some(h) => self.free_in_graph_pool(st, h.ptr, h.size, owner, &h.stream),
                        // Held until the capture's pool goes, which waits for
                        // the device first: what other streams did is done then.
                        None => {
                            st.uses.forget(ptr, Some(owner));
                            Ok(())
                        }
                    });
            if let Err(e) = r {
                self.report_bad_free(
                    device,
                    &format!(
                        "bad free of {ptr:#x} ({size} bytes) of graph pool {owner:?} during a capture into {pool:?} on device {device}: {}",
                        free_reason(e)
                    ),
                );
            }
            return;
        }
        // A block of the device's pool. Anything else `free` refuses and
        // reports (a CuPy block, a block held already or whose free waits
        // for a recorded stream, a pointer not handed out).
        let cupy = st.cupy_live.load(Ordering::Relaxed) != 0 && st.cupy.bytes_of(ptr).is_some();
        let live = st.stack.upstream().live_block_size(ptr);
        if cupy || pending || st.graphs.is_held(ptr) || live.is_none() {
            return self.free_rounded(ptr, requested, size, device, stream);
        }
        // Held, its size is never checked by the resource: checked here.
        if let Some(block) = live.filter(|&b| !size_fits_block(size, b)) {
            let reason = FreeError::SizeMismatch {
                allocated: block,
                freed: size,
            };
            return self.refused_for(ptr, size, device, reason);
        }
        match st.graphs.hold(pool, held) {
            // Freed when the pool goes, after the device's work: the
            // streams recorded on it need no events then.
            Ok(()) => st.uses.forget(ptr, None),
            Err(held) => self.free_rounded(held.ptr, held.requested, held.size, device, stream),
        }
    }

    /// Whether a capture into a graph pool of any of this allocator's
    /// devices is under way (PyTorch routes every capture's allocations to
    /// one).
    fn capturing(&self) -> bool {
        self.devices.iter().any(|d| {
            d.get()
                .and_then(|r| r.as_ref().ok())
                .is_some_and(|st| st.graphs.capturing())
        })
    }

    /// Saves the layout of the graph pool `pool` of `device` (PyTorch's
    /// `getCheckpointState`).
    pub fn graph_pool_checkpoint(&self, device: i32, pool: PoolId) -> Result<Checkpoint, String> {
        let st = self.used(device)?;
        st.graphs
            .checkpoint(pool)
            .map_err(|e| format!("device {device}: graph pool {pool:?}: {e}"))
    }

    /// Puts a layout saved by [`Allocator::graph_pool_checkpoint`] back
    /// (PyTorch's `setCheckpointPoolState`): frees the pool's live blocks
    /// it does not have and makes its live blocks live again at their
    /// addresses. Refused, with nothing changed, when a segment it names is
    /// gone or when it would free a block another graph still uses.
    pub fn graph_pool_restore(
        &self,
        device: i32,
        pool: PoolId,
        saved: &Checkpoint,
    ) -> Result<Restored, String> {
        let st = self.used(device)?;
        st.graphs
            .restore(pool, saved)
            .map_err(|e| format!("device {device}: graph pool {pool:?}: {e}"))
    }

    /// Frees the blocks a retired graph pool held for the device, and gives
    /// the device's pool back the share of the limit the graph pools left.
    fn give_back_retired(&self, st: &DeviceState, retired: Option<Retired>) {
        if retired.is_some() {
            self.apply_limit(st);
        }
        for h in retired.into_iter().flatten() {
            let sizes = Sizes {
                requested: h.requested,
                block: h.size,
            };
            if let Err(e) = self.free_on(st, h.ptr, sizes, &h.stream) {
                let device = st.device.ordinal() as i32;
                self.report_bad_free(
                    device,
                    &format!(
                        "bad free of {:#x} ({} bytes) held for a graph on device {device}: {}",
                        h.ptr,
                        h.size,
                        free_reason(e)
                    ),
                );
            }
        }
    }

    /// Frees memory from [`Allocator::malloc`] with the size and stream it
    /// was allocated with. NULL is ignored (whatever the size); a bad free
    /// frees nothing and is counted and reported.
    #[inline]
    pub fn free(&self, ptr: DevicePtr, size: usize, device: i32, stream: u64) {
        self.free_rounded(ptr, size, size, device, stream)
    }

    /// Frees a block of [`Allocator::malloc_rounded`] with the two sizes it
    /// was allocated with (as [`Allocator::free`] frees).
    #[inline]
    pub fn free_rounded(
        &self,
        ptr: DevicePtr,
        requested: usize,
        size: usize,
        device: i32,
        stream: u64,
    ) {
        if ptr.is_null() {
            return;
        }
        let Some(Ok(st)) = self.slot(device).and_then(OnceLock::get) else {
            return self.free_nowhere(ptr, device);
        };
        if unusable() {
            return;
        }
        // A CuPy block freed here would stay in CuPy's table, and CuPy's
        // own free would later free whatever block then lies at the address.
        // Its allocation happened before this free, so its count is seen.
        if st.cupy_live.load(Ordering::Relaxed) != 0 && st.cupy.bytes_of(ptr).is_some() {
            return self.cupy_block_freed_here(ptr, size, device);
        }
        // A block held for a graph is freed when the graph pool goes; a
        // second free now would let the pool hand it out while it is held.
        if st.graphs.is_held(ptr) {
            return self.refused_for(ptr, size, device, FreeError::DoubleFree);
        }
        let sizes = Sizes {
            requested,
            block: size,
        };
        if let Err(e) = self.free_on(st, ptr, sizes, st.streams.get(stream)) {
            self.refused_free(ptr, size, device, e);
        }
    }

    /// `gpumem_free` of a block of `gpumem_cupy_malloc`: refused, counted
    /// and reported.
    #[cold]
    #[inline(never)]
    fn cupy_block_freed_here(&self, ptr: DevicePtr, size: usize, device: i32) {
        self.report_bad_free(
            device,
            &format!(
                "bad free of {ptr:#x} ({size} bytes) on device {device}: allocated by \
                 gpumem_cupy_malloc, so freed by gpumem_cupy_free only"
            ),
        );
    }

    /// A free on a device where nothing was allocated (counted and
    /// reported), unless the process may not call the driver.
    #[cold]
    #[inline(never)]
    fn free_nowhere(&self, ptr: DevicePtr, device: i32) {
        if unusable() {
            return;
        }
        let why = match self.holder_of(ptr, device) {
            Some(owner) => format!("; {}", allocated_on(owner)),
            None => String::new(),
        };
        self.report_bad_free(
            device,
            &format!("free of {ptr:#x} on device {device}, where nothing was allocated{why}"),
        );
    }

    /// A free refused for `reason`: counted and reported.
    #[cold]
    #[inline(never)]
    fn refused_for(&self, ptr: DevicePtr, size: usize, device: i32, reason: FreeError) {
        self.refused_free(ptr, size, device, Error::InvalidFree { ptr: ptr.0, reason });
    }

    /// A free the device's stack refused: counted and reported.
    #[cold]
    #[inline(never)]
    fn refused_free(&self, ptr: DevicePtr, size: usize, device: i32, e: Error) {
        let why = match (&e, self.holder_of(ptr, device)) {
            (
                Error::InvalidFree {
                    reason: FreeError::Unknown,
                    ..
                },
                Some(owner),
            ) => allocated_on(owner),
            _ => free_reason(e),
        };
        self.report_bad_free(
            device,
            &format!("bad free of {ptr:#x} ({size} bytes) on device {device}: {why}"),
        );
    }

    /// The device, other than `device`, whose stack has a live block at
    /// `ptr`: where a free naming the wrong device belongs. One lookup per
    /// device built, for reports only.
    fn holder_of(&self, ptr: DevicePtr, device: i32) -> Option<usize> {
        (0..MAX_DEVICES).filter(|&d| d as i32 != device).find(|&d| {
            self.built(d as i32)
                .is_some_and(|st| st.stack.upstream().live_block_size(ptr).is_some())
        })
    }

    /// CuPy's allocation: on the legacy default stream, remembering the size
    /// for [`Allocator::cupy_free`].
    pub fn cupy_malloc(&self, size: usize, device: i32) -> DevicePtr {
        let p = self.malloc(size, device, 0);
        if !p.is_null() {
            if let Some(st) = self.built(device) {
                st.cupy.insert(p, size, ());
                st.cupy_live.fetch_add(1, Ordering::Relaxed);
            }
        }
        p
    }

    /// CuPy's free: the size is the one [`Allocator::cupy_malloc`] remembered.
    pub fn cupy_free(&self, ptr: DevicePtr, device: i32) {
        if ptr.is_null() || unusable() {
            return;
        }
        let Some(st) = self.built(device) else {
            self.report_bad_free(
                device,
                &format!("CuPy free of {ptr:#x} on device {device}, where nothing was allocated"),
            );
            return;
        };
        match st.cupy.take_any(ptr) {
            Ok((size, ())) => {
                st.cupy_live.fetch_sub(1, Ordering::Relaxed);
                if let Err(e) = self.free_on(st, ptr, size.into(), st.streams.get(0)) {
                    self.refused_free(ptr, size, device, e);
                }
            }
            Err(e) => {
                let why = match e {
                    Error::InvalidFree {
                        reason: FreeError::DoubleFree,
                        ..
                    } => "already freed (double free)",
                    _ => "not handed out by gpumem_cupy_malloc",
                };
                self.report_bad_free(
                    device,
                    &format!("CuPy free of {ptr:#x} on device {device}: {why}"),
                );
            }
        }
    }

    /// Notes that the live block at `ptr` on `device` is also used by work on
    /// the raw stream `stream` (PyTorch's `Tensor.record_stream`): when it is
    /// freed, it goes back to the pool only once that work is done (see
    /// [`StreamUses`]). A pointer that is not a live block is reported and
    /// ignored.
    pub fn record_stream(&self, ptr: DevicePtr, device: i32, stream: u64) {
        if ptr.is_null() || unusable() {
            return;
        }
        let Some(st) = self.built(device) else {
            self.report_misuse(&format!(
                "record_stream of {ptr:#x} on device {device}, where nothing was allocated; ignored"
            ));
            return;
        };
        let served = st.stack.upstream();
        let s = st.streams.get(stream).clone();
        if let Some(size) = served.live_block_size(ptr) {
            match served.check_access(ptr, size) {
                Ok(()) => st.uses.record(ptr, size, s, None),
                Err(e) => self.report_misuse(&format!(
                    "record_stream of {ptr:#x} on device {device}: {e}; ignored"
                )),
            }
        } else if let Some((pool, size)) = st.graphs.block_size(ptr) {
            st.uses.record(ptr, size, s, Some(pool));
        } else {
            self.report_misuse(&format!(
                "record_stream of {ptr:#x} on device {device}: not a live allocation; ignored"
            ));
        }
    }

    /// The resource serving `device` (built on first use), its device and
    /// legacy default stream: what [`crate::regions`] works on.
    pub(crate) fn served(&self, device: i32) -> Result<(&dyn Served, &Device, &Stream), String> {
        if unusable() {
            return Err("gpumem cannot be used in this process".into());
        }
        let st = self.state(device)?;
        Ok((st.stack.upstream(), &st.device, st.streams.get(0)))
    }

    /// The resource serving `device` if it was built (nothing is built).
    pub(crate) fn built_served(&self, device: i32) -> Option<&dyn Served> {
        Some(self.built(device)?.stack.upstream())
    }

    /// Deferred frees of `device` waiting for their recorded streams.
    pub fn pending_frees(&self, device: i32) -> usize {
        self.built(device).map_or(0, |s| s.uses.pending_count())
    }

    /// Bytes handed out on `device` and not freed (each allocation counted
    /// at 256-byte granularity); 0 for a device not used yet.
    pub fn allocated_bytes(&self, device: i32) -> usize {
        self.built(device).map_or(0, |s| {
            s.stack.stats().allocated_bytes.current.max(0) as usize + s.graphs.allocated_bytes().0
        })
    }

    /// Highest [`Allocator::allocated_bytes`] since the start or the last
    /// [`Allocator::reset_peak`]: the device's stack's peak plus the graph
    /// pools' (an upper bound while graph pools hold memory).
    pub fn peak_allocated_bytes(&self, device: i32) -> usize {
        self.built(device).map_or(0, |s| {
            s.stack.stats().allocated_bytes.peak.max(0) as usize + s.graphs.allocated_bytes().1
        })
    }

    /// Mappings that the VirtualPool serving `device` has made and unmapped
    /// since it was built: one per extent mapped at one place (a
    /// `cuMemMap`), aliases included, which allocate nothing and so count in
    /// no `num_device_alloc`; and one per extent unmapped (a `cuMemUnmap`
    /// covers one or more, and costs by how many). `None` when `device` is
    /// served by another resource or not used yet.
    pub fn mapping_changes(&self, device: i32) -> Option<u64> {
        let pool = self.built_served(device)?.virtual_pool()?;
        let st = pool.stats();
        Some(st.mappings_made + st.mappings_unmapped)
    }

    /// Bytes the resource of `device` holds from the driver.
    pub fn reserved_bytes(&self, device: i32) -> usize {
        self.built(device).map_or(0, |s| {
            s.stack.upstream().reserved_bytes() + s.graphs.reserved_bytes().0
        })
    }

    /// Highest [`Allocator::reserved_bytes`] since the start or the last
    /// [`Allocator::reset_peak`], graph pools included as in
    /// [`Allocator::peak_allocated_bytes`].
    pub fn peak_reserved_bytes(&self, device: i32) -> usize {
        self.built(device).map_or(0, |s| {
            s.stack.upstream().peak_reserved_bytes() + s.graphs.reserved_bytes().1
        })
    }

    /// Resets every peak of `device` to its current value (PyTorch's
    /// `reset_peak_memory_stats`).
    pub fn reset_peak(&self, device: i32) {
        if let Some(s) = self.built(device) {
            s.stack.reset_peak();
            let served = s.stack.upstream();
            Pool::reset_peak(served);
            served.reset_driver_peaks();
            s.graphs.reset_peak();
        }
    }

    /// The statistics of `device` in PyTorch's terms; all zero for a device
    /// not used yet, `None` for one out of range.
    pub fn device_stats(&self, device: i32) -> Option<gpumem_device_stats_t> {
        self.stats_of(device, StatsOf::All)
    }

    /// The statistics of `device`'s blocks of at most 1 MiB and of the
    /// larger ones ([`gpumem::adaptor::SMALL_BLOCK_MAX`]: PyTorch's `small_pool` and
    /// `large_pool`), as [`Allocator::device_stats`] counts all blocks. The
    /// device's resource keeps both classes in one reserve: its segments
    /// of at most [`gpumem::adaptor::SMALL_SEGMENT_MAX`] count as small, as
    /// PyTorch's small pool's segments are that size ([`served::DriverStats::classes`];
    /// CUDA's pool cannot tell, its reserve counts as large). Graph pools
    /// keep the classes apart, as PyTorch's pools do. The driver calls, retries and out-of-memory
    /// failures count with all blocks only (zero here).
    pub fn class_stats(&self, device: i32) -> Option<[gpumem_device_stats_t; 2]> {
        Some([
            self.stats_of(device, StatsOf::Class(SizeClass::Small))?,
            self.stats_of(device, StatsOf::Class(SizeClass::Large))?,
        ])
    }

    fn stats_of(&self, device: i32, of: StatsOf) -> Option<gpumem_device_stats_t> {
        self.slot(device)?;
        let Some(st) = self.built(device) else {
            return Some(gpumem_device_stats_t::default());
        };
        let now = Self::raw_stats(st, of);
        Some(now.since(&lock(&st.baseline)[of.index()]))
    }

    /// The statistics of the blocks `of` counts, with their totals since
    /// the stack was built.
    fn raw_stats(st: &DeviceState, of: StatsOf) -> gpumem_device_stats_t {
        let s = st.stack.stats();
        let served = st.stack.upstream();
        let d = served.driver_stats();
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let mut stats = match of {
            StatsOf::All => gpumem_device_stats_t {
                allocation: s.allocation.into(),
                segment: d.segments.unwrap_or(s.active).into(),
                active: s.active.into(),
                allocated_bytes: s.allocated_bytes.into(),
                requested_bytes: s.requested_bytes.into(),
                reserved_bytes: d.reserved.into(),
                active_bytes: s.active_bytes.into(),
                num_alloc_retries: count(st.retries.load(Ordering::Relaxed)),
                num_ooms: count(st.ooms.load(Ordering::Relaxed)),
                num_device_alloc: count(d.device_allocs),
                num_device_free: count(d.device_frees),
                largest_free_block: count(served.largest_free_block() as u64),
            },
            StatsOf::Class(class) => {
                let c = match class {
                    SizeClass::Small => s.small,
                    SizeClass::Large => s.large,
                };
                // The device's segments by their size, as PyTorch's pools
                // make them; where the resource cannot tell (CUDA's pool),
                // its reserve counts in the large class.
                let (segment, reserved_bytes) = match (d.classes, class) {
                    (Some([small, _]), SizeClass::Small) => {
                        (small.segments.into(), small.reserved.into())
                    }
                    (Some([_, large]), SizeClass::Large) => {
                        (large.segments.into(), large.reserved.into())
                    }
                    (None, SizeClass::Small) => Default::default(),
                    (None, SizeClass::Large) => {
                        (d.segments.unwrap_or(s.active).into(), d.reserved.into())
                    }
                };
                gpumem_device_stats_t {
                    allocation: c.allocation.into(),
                    segment,
                    active: c.active.into(),
                    allocated_bytes: c.allocated_bytes.into(),
                    requested_bytes: c.requested_bytes.into(),
                    reserved_bytes,
                    active_bytes: c.active_bytes.into(),
                    ..Default::default()
                }
            }
        };
        st.graphs.add_stats(&mut stats, of);
        stats
    }

    /// Restarts every accumulated statistic of `device` (totals allocated and
    /// freed, retries, out-of-memory failures, driver calls) from zero
    /// (PyTorch's `reset_accumulated_memory_stats`).
    pub fn reset_accumulated(&self, device: i32) {
        if let Some(st) = self.built(device) {
            let mut baseline = lock(&st.baseline);
            for of in StatsOf::EACH {
                baseline[of.index()] = Self::raw_stats(st, of);
            }
        }
    }

    /// Caps what `device` holds from the driver at `fraction` of its memory
    /// (with `max_size`, whichever is smaller); 1.0 removes the cap. `Err`
    /// for a fraction outside [0, 1] or a device out of range.
    pub fn set_memory_fraction(&self, device: i32, fraction: f64) -> Result<(), String> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(format!("memory fraction {fraction} is outside [0, 1]"));
        }
        let Some(slot) = usize::try_from(device)
            .ok()
            .and_then(|d| self.limits.get(d).map(|l| &l.fraction))
        else {
            return Err(format!(
                "device {device} is out of range (0..{MAX_DEVICES})"
            ));
        };
        slot.set(fraction);
        self.apply_limit_of(device as usize);
        Ok(())
    }

    /// Sets the limit of `st`'s own resource to what its graph pools leave
    /// of the device's limit (`max_size` and the memory fraction): together
    /// they hold at most the limit. Called when the graph pools' reserve
    /// changes; a device allocation racing a graph pool's growth may find
    /// the old share, so the sum can pass the limit by one growth then (a
    /// choice: closing the window would put one lock on every growth of
    /// every pool of the device; `tests/graph_pool_limits.rs` makes the race
    /// happen and pins the bound).
    fn apply_limit(&self, st: &DeviceState) {
        self.apply_limit_of(st.device.ordinal() as usize);
    }

    /// [`Allocator::apply_limit`] of device `device`, if it is built.
    ///
    /// An application reads the fraction and the graph pools' reserve, then
    /// sets the limit (for `async`, the release threshold too, a driver
    /// call): two at once could end in either order, and the one that read
    /// the fraction before the other's was set would have the last word
    /// (`tests/fraction.rs` stops one at the driver call to show it). So
    /// they take turns, per device: one asked for while another is under way
    /// leaves it to that one, which applies the limit once more after its
    /// own, reading the fraction set before the request. The last limit set
    /// is then always the one of the fraction in force, and no caller waits
    /// for another's driver call. A fraction set before the build finds no
    /// device, the builder applies it after (see [`Allocator::state`]); the
    /// turn orders that too.
    fn apply_limit_of(&self, device: usize) {
        // In a forked child the turn may be held for ever (see `built`).
        if gpumem::fork::in_forked_child() {
            return;
        }
        let Some(turn) = self.limits.get(device).map(|l| &l.turn) else {
            return;
        };
        {
            let mut t = lock(turn);
            if t.busy {
                t.again = true;
                return;
            }
            t.busy = true;
        }
        let _end = EndTurnOnPanic(turn);
        loop {
            if let Some(st) = self.built(device as i32) {
                let limit = self.limit_of(&st.conf, st.device.ordinal(), st.total_memory);
                let graphs = st.graphs.reserved_bytes().0;
                let own = limit.map(|l| l.saturating_sub(graphs));
                st.stack.upstream().set_limit(own, &st.conf);
            }
            let mut t = lock(turn);
            if !t.again {
                t.busy = false;
                return;
            }
            t.again = false;
        }
    }

    /// What `st`'s graph pools may hold together: the device's limit less
    /// what its own resource holds (`None`: no limit).
    fn graph_room(&self, st: &DeviceState) -> Option<usize> {
        let limit = self.limit_of(&st.conf, st.device.ordinal(), st.total_memory)?;
        Some(limit.saturating_sub(st.stack.upstream().reserved_bytes()))
    }

    /// The memory fraction of `device` (1.0 when never set or out of range).
    pub fn memory_fraction(&self, device: i32) -> f64 {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.limits.get(d).map(|l| &l.fraction))
            .map_or(1.0, AtomicF64::get)
    }

    /// What `device` holds now: its segments and its live blocks (with their
    /// streams where known), each in address order, those of its graph pools
    /// included; blocks whose free waits for a recorded stream are not
    /// live. Empty for a device not used yet, `None` for one out of range.
    pub fn snapshot(&self, device: i32) -> Option<Snapshot> {
        self.pool_snapshot(device, DEVICE_POOL)
    }

    /// [`Allocator::snapshot`] of one pool (PyTorch's
    /// `memory_snapshot(mempool_id)`): [`DEVICE_POOL`] for everything the
    /// device holds, as [`Allocator::snapshot`]; any other id for the
    /// segments and live blocks of that graph pool only (none when it does
    /// not exist on `device`).
    pub fn pool_snapshot(&self, device: i32, pool: PoolId) -> Option<Snapshot> {
        self.slot(device)?;
        let Some(st) = self.built(device) else {
            return Some(Snapshot::default());
        };
        let whole = pool == DEVICE_POOL;
        let (mut segments, mut blocks, mut expandable): (Vec<Segment>, Vec<_>, Vec<_>) =
            Default::default();
        if whole {
            let served = st.stack.upstream();
            segments = served.segments();
            blocks = served.live_blocks();
            expandable = segments
                .iter()
                .map(|s| s.address)
                .filter(|&a| served.is_expandable(a))
                .collect();
        }
        let mut graph_segments = Vec::new();
        if st.graphs.len() > 0 {
            let (s, b) = st.graphs.snapshot((!whole).then_some(pool));
            segments.extend(s.iter().map(|g| Segment {
                address: g.segment.address,
                size: g.segment.size,
            }));
            segments.sort_by_key(|s| s.address);
            blocks.extend(b);
            blocks.sort_by_key(|(b, _)| b.address);
            graph_segments = s;
            graph_segments.sort_by_key(|g| g.segment.address);
        }
        if st.uses.has_pending() {
            let pending = st.uses.pending_ptrs();
            blocks.retain(|(b, _)| !pending.contains(&b.address));
        }
        expandable.sort();
        Some(Snapshot {
            segments,
            blocks,
            graph_segments,
            expandable,
        })
    }

    /// Gives the cached memory of `device` back to the driver, after the
    /// deferred frees' streams are done; returns the bytes given back (0 for
    /// a device not used yet; failures reported).
    pub fn empty_cache(&self, device: i32) -> usize {
        self.pool_empty_cache(device, DEVICE_POOL)
    }

    /// [`Allocator::empty_cache`] of one pool (PyTorch's
    /// `emptyCache(mempool_id)`, which a MemPool calls as it is deleted,
    /// after `releasePool`): [`DEVICE_POOL`] empties the device's cache as
    /// [`Allocator::empty_cache`] does (the device's pool and the free
    /// segments of graph pools nothing uses); another id gives back the
    /// segments without a live block of that graph pool only, and only
    /// when nothing uses it (no graph, no MemPool, no capture into it):
    /// the device's pool and other graph pools keep theirs. While a capture
    /// into a graph pool of any device is under way, nothing is given back
    /// (see [`Allocator::empty_cache`]). Returns the bytes given back.
    pub fn pool_empty_cache(&self, device: i32, pool: PoolId) -> usize {
        if unusable() {
            return 0;
        }
        let Some(st) = self.built(device) else {
            return 0;
        };
        if pool == DEVICE_POOL {
            return self.empty_cache_of(st);
        }
        if self.capturing() {
            return 0;
        }
        if st.uses.has_pending() {
            // Blocks of the pool whose frees wait for recorded streams.
            let done = st.uses.wait_all();
            self.finish_deferred(st, done);
        }
        let given = st.graphs.empty_cache(Some(pool));
        if given > 0 {
            self.apply_limit(st);
        }
        given
    }

    /// Empties `st`'s cache: waits for the deferred frees' streams, gives
    /// back the device pool's cached memory and the free segments of the
    /// graph pools no graph uses. While a capture into a graph pool of any
    /// device is under way it waits for nothing and gives nothing back: a
    /// wait or a driver free would break the capture.
    fn empty_cache_of(&self, st: &DeviceState) -> usize {
        if self.capturing() {
            return 0;
        }
        let done = st.uses.wait_all();
        self.finish_deferred(st, done);
        let pool = match st.stack.upstream().release() {
            Ok(n) => n,
            Err(e) => {
                log::error!("device {}: empty_cache: {e}", st.device.ordinal());
                0
            }
        };
        let graphs = st.graphs.empty_cache(None);
        if graphs > 0 {
            self.apply_limit(st);
        }
        pool + graphs
    }

    /// The stack serving `device` as a resource Rust code in the same process
    /// can allocate from: PyTorch, CuPy and Rust then share one pool per
    /// device (memory freed by one is reused by the others). Allocations
    /// through it take the same path as [`Allocator::malloc`] (statistics,
    /// the retry on out of memory, `record_stream`), returning errors rather
    /// than NULL. Builds the device's stack on first use; `None` when the
    /// device cannot be served (out of range, an invalid configuration, a
    /// forked child).
    pub fn device_resource(&'static self, device: i32) -> Option<SharedResource> {
        if unusable() || self.invalid.load(Ordering::Relaxed) {
            return None;
        }
        let state = self.state(device).ok()?;
        Some(Arc::new(DeviceHandle {
            allocator: self,
            state,
        }))
    }
}

/// Wraps `served` in a log of every allocation and free written to `path`;
/// `Err` says why when the file cannot be written.
fn with_log(served: Box<dyn Served>, path: &std::path::Path) -> Result<Box<dyn Served>, String> {
    let file = std::fs::File::create(path)
        .map_err(|e| format!("log: cannot create {} ({e})", path.display()))?;
    match LoggingAdaptor::with_writer(served, file) {
        Ok(l) => Ok(Box::new(l)),
        Err(e) => Err(format!("log: cannot write {} ({e})", path.display())),
    }
}

/// Why a free naming another device than its block's was refused.
fn allocated_on(owner: usize) -> String {
    format!("allocated on device {owner}, not this one (free it there)")
}

/// A free's refusal as a phrase.
fn free_reason(e: Error) -> String {
    match e {
        Error::InvalidFree { reason, .. } => reason.to_string(),
        e => e.to_string(),
    }
}

/// One device's stack of an [`Allocator`], as a [`MemoryResource`].
struct DeviceHandle {
    allocator: &'static Allocator,
    state: &'static DeviceState,
}

impl MemoryResource for DeviceHandle {
    fn allocate(
        &self,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> gpumem::Result<DevicePtr> {
        if unusable() {
            return Err(off_limits_error());
        }
        self.allocator
            .allocate_on(self.state, bytes.into(), alignment, stream)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
        stream: &Stream,
    ) -> gpumem::Result<()> {
        if ptr.is_null() || unusable() {
            return Ok(());
        }
        self.allocator
            .free_on(self.state, ptr, bytes.into(), stream)
    }

    fn device(&self) -> &Device {
        &self.state.device
    }

    fn properties(&self) -> Properties {
        Properties::DEVICE
    }
}

/// Why an allocation is refused once [`unusable`] holds: a forked child, or
/// an exiting process.
#[cold]
#[inline(never)]
fn off_limits_error() -> Error {
    if gpumem::fork::in_forked_child() {
        gpumem::fork::forked_error()
    } else {
        Error::ShutDown("gpumem's C ABI (the process is exiting)")
    }
}

/// True once this process can no longer use its devices: it is exiting, or
/// it is a child forked after gpumem's first use. Checked before any lock.
/// Both are set by hooks that opening a device installs, so before that it
/// is false, and one load answers it on every call.
#[inline(always)]
fn unusable() -> bool {
    gpumem::exit::driver_off_limits()
}
