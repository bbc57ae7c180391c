//! A segment source of the caller's (`gpumem_segment_source_t`) for tests:
//! Rust `extern "C"` functions that take memory from a simulated driver
//! and count every call.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use gpumem::driver::sim::SimDriver;
use gpumem::driver::Driver;
use gpumem::DevicePtr;
use gpumem_capi::foreign_segments::ForeignSource;
use gpumem_capi::{gpumem_segment_source_t, gpumem_stream_t};

/// What the source's functions did, and what they hold.
#[derive(Default)]
pub struct Calls {
    pub allocs: AtomicUsize,
    pub frees: AtomicUsize,
    pub releases: AtomicUsize,
    /// Makes `alloc` return NULL.
    pub refuse: AtomicBool,
    /// Makes `alloc` return a pointer 16 bytes into what it took.
    pub misalign: AtomicBool,
    /// Live segments: pointer → (size, device, stream).
    pub live: Mutex<BTreeMap<u64, (usize, c_int, u64)>>,
}

/// The context: the driver the segments come from, and the counts.
pub struct Source {
    pub driver: Arc<SimDriver>,
    pub calls: Arc<Calls>,
}

impl Calls {
    pub fn allocs(&self) -> usize {
        self.allocs.load(Ordering::SeqCst)
    }
    pub fn frees(&self) -> usize {
        self.frees.load(Ordering::SeqCst)
    }
    pub fn releases(&self) -> usize {
        self.releases.load(Ordering::SeqCst)
    }
    pub fn live_bytes(&self) -> usize {
        self.live.lock().unwrap().values().map(|v| v.0).sum()
    }
}

unsafe extern "C" fn alloc(
    ctx: *mut c_void,
    size: usize,
    device: c_int,
    stream: gpumem_stream_t,
) -> *mut c_void {
    // SAFETY: `ctx` is the `Source` that `source` leaked, alive until
    // `release`.
    let s = unsafe { &*(ctx as *const Source) };
    s.calls.allocs.fetch_add(1, Ordering::SeqCst);
    if s.calls.refuse.load(Ordering::SeqCst) {
        return std::ptr::null_mut();
    }
    let driver: &dyn Driver = &*s.driver;
    let Ok(p) = driver.mem_alloc(device as u32, size + 256) else {
        return std::ptr::null_mut();
    };
    let p = if s.calls.misalign.load(Ordering::SeqCst) {
        p.0 + 16
    } else {
        p.0
    };
    let raw = stream as usize as u64;
    s.calls.live.lock().unwrap().insert(p, (size, device, raw));
    p as usize as *mut c_void
}

unsafe extern "C" fn free(
    ctx: *mut c_void,
    ptr: *mut c_void,
    size: usize,
    device: c_int,
    _stream: gpumem_stream_t,
) {
    // SAFETY: as in `alloc`.
    let s = unsafe { &*(ctx as *const Source) };
    s.calls.frees.fetch_add(1, Ordering::SeqCst);
    let p = ptr as usize as u64;
    let (was, on, _) = s
        .calls
        .live
        .lock()
        .unwrap()
        .remove(&p)
        .expect("a segment this source made, freed once");
    assert_eq!((was, on), (size, device), "freed as it was made");
    let driver: &dyn Driver = &*s.driver;
    driver
        .mem_free(device as u32, DevicePtr(p & !255))
        .expect("the driver's memory");
}

unsafe extern "C" fn release(ctx: *mut c_void) {
    // SAFETY: `ctx` came from `Box::into_raw` in `source`, released once.
    let s = unsafe { Box::from_raw(ctx as *mut Source) };
    s.calls.releases.fetch_add(1, Ordering::SeqCst);
}

/// The C structure of a source over `driver`, with its counts.
pub fn source_t(driver: Arc<SimDriver>) -> (gpumem_segment_source_t, Arc<Calls>) {
    let calls = Arc::new(Calls::default());
    let ctx = Box::into_raw(Box::new(Source {
        driver,
        calls: calls.clone(),
    }));
    let c = gpumem_segment_source_t {
        alloc: Some(alloc),
        free: Some(free),
        release: Some(release),
        ctx: ctx as *mut c_void,
    };
    (c, calls)
}

/// A source over `driver` taken over by gpumem, with its counts.
pub fn source(driver: Arc<SimDriver>) -> (ForeignSource, Arc<Calls>) {
    let (c, calls) = source_t(driver);
    // SAFETY: the functions above take a live `Source` (released once, by
    // `release`) from any thread, never unwind across the boundary and
    // never call gpumem.
    let s = unsafe { ForeignSource::new(&c) }.expect("alloc and free given");
    (s, calls)
}
