//! [`Allocator`]: the state behind the C ABI, one value per process (the C
//! functions use a global one) and any number in tests.
//!
//! Per device ordinal, a stack is built lazily at the first allocation on it:
//! a [`StatisticsAdaptor`] (allocated bytes and their peak) over the resource
//! chosen by `GPUMEM_CONF` (reserved bytes and their peak, see
//! [`crate::served`]). Foreign stream handles are wrapped once each and kept
//! in a per-device map, so a pool sees the same stream id for every call with
//! the same handle and reuses blocks on it without events; a one-entry cache
//! per thread skips the map's lock when a thread keeps using one stream.
//!
//! Foreign streams must outlive the memory freed on them (PyTorch's and
//! CuPy's streams do: PyTorch never destroys its pooled streams). A stream
//! destroyed while blocks freed on it sit in a pool, and another one created
//! with the same handle value, would be taken for the first.
//!
//! Errors never escape: a failed allocation returns NULL and is reported on
//! stderr (the first [`MAX_OOM_REPORTS`], then a line saying the rest are
//! not); a bad free (a pointer not handed out, a second free, a wrong size)
//! frees nothing, is counted per device ([`Allocator::bad_free_count`]) and
//! reported the same way (the first [`MAX_BAD_FREE_REPORTS`]). An invalid
//! `GPUMEM_CONF` serves nothing: every allocation returns NULL, reported, and
//! [`Allocator::conf_error`] says why.
//!
//! In a child process forked after the first use (Python's `multiprocessing`
//! and PyTorch's `DataLoader` fork by default), every call returns before
//! it takes a lock: allocations return NULL with a message saying why and
//! what to do, frees and statistics do nothing (see [`gpumem::fork`]).

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io::Write;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use gpumem::adaptor::StatisticsAdaptor;
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::{Driver, STREAM_LEGACY, STREAM_PER_THREAD};
use gpumem::resource::{HandedOut, MemoryResource, DEFAULT_ALIGNMENT};
use gpumem::{Device, DevicePtr, Error, FreeError, Stream};

use crate::conf::{self, Conf, Parsed, ResourceKind};
use crate::served::{self, Served};

/// Most device ordinals served (CUDA devices per process rarely pass 16).
pub const MAX_DEVICES: usize = 64;
/// Out-of-memory reports printed per allocator before the rest are not.
pub const MAX_OOM_REPORTS: u32 = 10;
/// Bad-free reports printed per allocator before the rest are only counted.
pub const MAX_BAD_FREE_REPORTS: u32 = 10;
/// Environment variable choosing the backend: `cuda` (the default), `sim`
/// or `auto` (CUDA when a GPU is there, else simulated).
pub const DEVICE_ENV: &str = "GPUMEM_DEVICE";
/// Number of devices of the simulated driver used with `GPUMEM_DEVICE=sim`.
pub const SIM_DEVICES: u32 = 8;

/// Writes `gpumem: {msg}` on stderr. Never panics (a closed stderr is ignored).
pub fn report(msg: &str) {
    let _ = writeln!(std::io::stderr().lock(), "gpumem: {msg}");
}

/// Which driver the allocator's devices come from.
#[derive(Clone)]
pub enum Backend {
    /// The CUDA driver (`Device::cuda`).
    Cuda,
    /// A simulated driver; devices are its ordinals.
    Sim(Arc<SimDriver>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Cuda => f.write_str("Cuda"),
            Backend::Sim(_) => f.write_str("Sim"),
        }
    }
}

impl Backend {
    /// The backend `GPUMEM_DEVICE` names (unset: CUDA). A bad value is
    /// reported and CUDA used.
    pub fn from_env() -> Backend {
        let want = std::env::var(DEVICE_ENV).unwrap_or_default();
        match want.trim().to_ascii_lowercase().as_str() {
            "" | "cuda" => Backend::Cuda,
            "sim" => Backend::sim(),
            "auto" => match Device::cuda(0) {
                Ok(_) => Backend::Cuda,
                Err(_) => Backend::sim(),
            },
            other => {
                report(&format!(
                    "{DEVICE_ENV}={other:?}: expected cuda, sim or auto; using cuda"
                ));
                Backend::Cuda
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
        }
    }
}

/// The stack serving one device.
struct DeviceState {
    device: Device,
    stack: StatisticsAdaptor<Box<dyn Served>>,
    legacy: Stream,
    per_thread: Stream,
    /// One wrapper per foreign stream handle.
    streams: RwLock<HashMap<u64, Stream>>,
    /// CuPy's allocations and their sizes (its frees carry none).
    cupy: HandedOut,
}

static NEXT_ALLOCATOR: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The last foreign stream this thread used: (allocator, device, handle).
    static LAST_STREAM: RefCell<Option<(u64, u32, u64, Stream)>> = const { RefCell::new(None) };
}

/// The C ABI's state: configuration, backend and the per-device stacks.
pub struct Allocator {
    id: u64,
    conf: Conf,
    backend: Backend,
    devices: Box<[OnceLock<Option<DeviceState>>]>,
    /// Why the configuration is invalid; the allocator then serves nothing.
    conf_error: Option<CString>,
    oom_reports: AtomicU32,
    /// Bad frees per device ordinal, and those naming no valid ordinal.
    bad_frees: Box<[AtomicU64]>,
    bad_frees_elsewhere: AtomicU64,
    bad_free_reports: AtomicU32,
}

impl std::fmt::Debug for Allocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocator")
            .field("conf", &self.conf.to_string())
            .field("backend", &self.backend)
            .finish()
    }
}

impl Allocator {
    /// An allocator serving `conf` over `backend`; builds nothing yet.
    pub fn new(conf: Conf, backend: Backend) -> Self {
        Self {
            id: NEXT_ALLOCATOR.fetch_add(1, Ordering::Relaxed),
            conf,
            backend,
            devices: (0..MAX_DEVICES).map(|_| OnceLock::new()).collect(),
            conf_error: None,
            oom_reports: AtomicU32::new(0),
            bad_frees: (0..MAX_DEVICES).map(|_| AtomicU64::new(0)).collect(),
            bad_frees_elsewhere: AtomicU64::new(0),
            bad_free_reports: AtomicU32::new(0),
        }
    }

    /// An allocator for a parsed configuration: when it is invalid, one that
    /// serves nothing and says why (reported on stderr now, and by
    /// [`Allocator::conf_error`]).
    pub fn from_parsed(parsed: Parsed, backend: Backend) -> Self {
        let error = parsed.error();
        let mut a = Self::new(parsed.conf, backend);
        if let Some(e) = error {
            report(&format!(
                "{e}; every allocation returns NULL until it is fixed"
            ));
            // The text comes from a Rust string: no interior NUL.
            a.conf_error = Some(CString::new(e.replace('\0', " ")).unwrap_or_default());
        }
        a
    }

    /// The allocator the environment asks for: `GPUMEM_CONF` over the
    /// backend of `GPUMEM_DEVICE`.
    pub fn from_env() -> Self {
        Self::from_parsed(conf::from_env(), Backend::from_env())
    }

    /// The configuration in force.
    pub fn conf(&self) -> &Conf {
        &self.conf
    }

    /// Why the configuration is invalid (then every allocation returns
    /// NULL); `None` when it is valid.
    pub fn conf_error(&self) -> Option<&CStr> {
        self.conf_error.as_deref()
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

    fn slot(&self, device: i32) -> Option<&OnceLock<Option<DeviceState>>> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.devices.get(d))
    }

    /// The state of `device` if it was built.
    /// `None` in a child forked after first use: its locks may be held for
    /// ever there (see [`gpumem::fork`]).
    fn built(&self, device: i32) -> Option<&DeviceState> {
        if gpumem::fork::in_forked_child() {
            return None;
        }
        self.slot(device)?.get()?.as_ref()
    }

    /// The state of `device`, built on first use; `None` (reported once) when
    /// the device cannot be served.
    fn state(&self, device: i32) -> Option<&DeviceState> {
        let Some(slot) = self.slot(device) else {
            report(&format!(
                "device {device} is out of range (0..{MAX_DEVICES}); returning NULL"
            ));
            return None;
        };
        slot.get_or_init(|| self.build(device as u32)).as_ref()
    }

    fn build(&self, ordinal: u32) -> Option<DeviceState> {
        let device = match self.backend.device(ordinal) {
            Ok(d) => d,
            Err(e) => {
                report(&format!(
                    "device {ordinal} cannot be used ({e}); its allocations return NULL"
                ));
                return None;
            }
        };
        let served = match served::build(&self.conf, &device) {
            Ok(s) => s,
            Err(e) => {
                let fallback = Conf {
                    resource: ResourceKind::Pool,
                    initial_size: 0,
                    ..self.conf.clone()
                };
                report(&format!(
                    "device {ordinal}: cannot build {} ({e}); using {fallback}",
                    self.conf
                ));
                match served::build(&fallback, &device) {
                    Ok(s) => s,
                    Err(e) => {
                        report(&format!(
                            "device {ordinal}: cannot build {fallback} either ({e}); its allocations return NULL"
                        ));
                        return None;
                    }
                }
            }
        };
        Some(DeviceState {
            legacy: device.default_stream(),
            per_thread: device.per_thread_stream(),
            device,
            stack: StatisticsAdaptor::new(served),
            streams: RwLock::new(HashMap::new()),
            cupy: HandedOut::default(),
        })
    }

    /// The one wrapper of `raw` on the device of `st`.
    fn stream(&self, st: &DeviceState, raw: u64) -> Stream {
        match raw {
            0 | STREAM_LEGACY => return st.legacy.clone(),
            STREAM_PER_THREAD => return st.per_thread.clone(),
            _ => {}
        }
        let ordinal = st.device.ordinal();
        let cached = LAST_STREAM.with(|c| match &*c.borrow() {
            Some((a, d, r, s)) if *a == self.id && *d == ordinal && *r == raw => Some(s.clone()),
            _ => None,
        });
        if let Some(s) = cached {
            return s;
        }
        let found = st
            .streams
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&raw)
            .cloned();
        let s = match found {
            Some(s) => s,
            None => st
                .streams
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .entry(raw)
                .or_insert_with(|| Stream::from_raw(st.device.clone(), raw))
                .clone(),
        };
        LAST_STREAM.with(|c| *c.borrow_mut() = Some((self.id, ordinal, raw, s.clone())));
        s
    }

    fn report_oom(&self, what: &str) {
        let n = self.oom_reports.fetch_add(1, Ordering::Relaxed);
        if n < MAX_OOM_REPORTS {
            report(what);
        } else if n == MAX_OOM_REPORTS {
            report("further allocation failures are not reported");
        }
    }

    /// Counts a bad free on `device` and reports it (the first
    /// [`MAX_BAD_FREE_REPORTS`], then one line saying the rest are counted).
    fn report_bad_free(&self, device: i32, what: &str) {
        let counter = usize::try_from(device)
            .ok()
            .and_then(|d| self.bad_frees.get(d))
            .unwrap_or(&self.bad_frees_elsewhere);
        counter.fetch_add(1, Ordering::Relaxed);
        let n = self.bad_free_reports.fetch_add(1, Ordering::Relaxed);
        if n < MAX_BAD_FREE_REPORTS {
            report(&format!("{what}; nothing freed"));
        } else if n == MAX_BAD_FREE_REPORTS {
            report("further bad frees are not reported (gpumem_bad_free_count counts them)");
        }
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
    /// failure (reported).
    pub fn malloc(&self, size: usize, device: i32, stream: u64) -> DevicePtr {
        if size == 0 {
            return DevicePtr::NULL;
        }
        if gpumem::fork::in_forked_child() {
            // Before any lock: one the parent held at the fork stays held here.
            self.report_oom(&format!(
                "device {device}: allocation of {size} bytes refused: {}; returning NULL",
                gpumem::fork::forked_error()
            ));
            return DevicePtr::NULL;
        }
        if gpumem::exit::process_is_exiting() {
            return DevicePtr::NULL;
        }
        if let Some(e) = &self.conf_error {
            self.report_oom(&format!(
                "device {device}: allocation of {size} bytes refused: {}; returning NULL",
                e.to_string_lossy()
            ));
            return DevicePtr::NULL;
        }
        let Some(st) = self.state(device) else {
            return DevicePtr::NULL;
        };
        let s = self.stream(st, stream);
        match st.stack.allocate(size, DEFAULT_ALIGNMENT, &s) {
            Ok(p) => p,
            Err(e) => {
                self.report_oom(&format!(
                    "device {device}: allocation of {size} bytes failed ({e}); returning NULL"
                ));
                DevicePtr::NULL
            }
        }
    }

    /// Frees memory from [`Allocator::malloc`] with the size and stream it
    /// was allocated with. NULL is ignored (whatever the size); a bad free
    /// frees nothing and is counted and reported.
    pub fn free(&self, ptr: DevicePtr, size: usize, device: i32, stream: u64) {
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
        let s = self.stream(st, stream);
        if let Err(e) = st.stack.deallocate(ptr, size, DEFAULT_ALIGNMENT, &s) {
            let why = match e {
                Error::InvalidFree { reason, .. } => reason.to_string(),
                e => e.to_string(),
            };
            self.report_bad_free(
                device,
                &format!("bad free of {ptr:#x} ({size} bytes) on device {device}: {why}"),
            );
        }
    }

    /// CuPy's allocation: on the legacy default stream, remembering the size
    /// for [`Allocator::cupy_free`].
    pub fn cupy_malloc(&self, size: usize, device: i32) -> DevicePtr {
        let p = self.malloc(size, device, 0);
        if !p.is_null() {
            if let Some(st) = self.built(device) {
                st.cupy.insert(p, size, ());
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
            Ok((size, ())) => self.free(ptr, size, device, 0),
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

    /// Bytes handed out on `device` and not freed (each allocation counted
    /// at 256-byte granularity); 0 for a device not used yet.
    pub fn allocated_bytes(&self, device: i32) -> usize {
        self.built(device).map_or(0, |s| {
            s.stack.stats().allocated_bytes.current.max(0) as usize
        })
    }

    /// Highest [`Allocator::allocated_bytes`] since the start or the last
    /// [`Allocator::reset_peak`].
    pub fn peak_allocated_bytes(&self, device: i32) -> usize {
        self.built(device)
            .map_or(0, |s| s.stack.stats().allocated_bytes.peak.max(0) as usize)
    }

    /// Bytes the resource of `device` holds from the driver.
    pub fn reserved_bytes(&self, device: i32) -> usize {
        self.built(device)
            .map_or(0, |s| s.stack.upstream().reserved_bytes())
    }

    /// Highest [`Allocator::reserved_bytes`] since the start or the last
    /// [`Allocator::reset_peak`].
    pub fn peak_reserved_bytes(&self, device: i32) -> usize {
        self.built(device)
            .map_or(0, |s| s.stack.upstream().peak_reserved_bytes())
    }

    /// Resets both peaks of `device` to the current values.
    pub fn reset_peak(&self, device: i32) {
        if let Some(s) = self.built(device) {
            s.stack.reset_peak();
            s.stack.upstream().reset_peak_reserved();
        }
    }

    /// Gives the cached memory of `device` back to the driver; returns the
    /// bytes given back (0 for a device not used yet; failures reported).
    pub fn empty_cache(&self, device: i32) -> usize {
        if unusable() {
            return 0;
        }
        match self.built(device).map(|s| s.stack.upstream().empty_cache()) {
            Some(Ok(n)) => n,
            Some(Err(e)) => {
                report(&format!("device {device}: empty_cache: {e}"));
                0
            }
            None => 0,
        }
    }
}

/// True once this process can no longer use its devices: it is exiting, or
/// it is a child forked after gpumem's first use. Checked before any lock.
fn unusable() -> bool {
    gpumem::exit::process_is_exiting() || gpumem::fork::in_forked_child()
}
