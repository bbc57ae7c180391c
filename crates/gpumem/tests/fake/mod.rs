//! A host-only fake upstream for adaptor tests: hands out addresses from a
//! counter (no memory behind them), checks every free strictly, counts calls and
//! fails with out-of-memory past a capacity. It makes no driver call, so the
//! adaptors' own logic can be tested deterministically on any backend.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use gpumem::adaptor::CallCount;
use gpumem::driver::sim::SimConfig;
use gpumem::resource::{validate_request, LentLock, MemoryResource, Properties, DEFAULT_ALIGNMENT};
use gpumem::{Device, DevicePtr, Error, FreeError, OomInfo, Result, Stream};

/// First address handed out (looks like a CUDA device address).
pub const BASE: u64 = 0x7f00_0000_0000;

#[derive(Default)]
struct State {
    next: u64,
    live: HashMap<u64, usize>,
    used: usize,
}

/// The fake upstream.
pub struct Fake {
    device: Device,
    properties: Properties,
    capacity: usize,
    /// Lends its state's lock to a statistics wrapper ([`Fake::lending`]).
    lends: bool,
    state: Mutex<State>,
    /// Successful allocations.
    pub allocs: AtomicUsize,
    /// Successful frees.
    pub frees: AtomicUsize,
    /// Every allocate call that reached the fake.
    pub alloc_calls: AtomicUsize,
    /// Every deallocate call that reached the fake.
    pub free_calls: AtomicUsize,
}

impl Fake {
    /// A fake device resource of `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        Self::with_properties(capacity, Properties::DEVICE)
    }

    /// A fake with the given properties (managed-like with `HOST_AND_DEVICE`).
    pub fn with_properties(capacity: usize, properties: Properties) -> Self {
        Self {
            device: Device::sim(SimConfig::default()),
            properties,
            capacity,
            lends: false,
            state: Mutex::new(State {
                next: BASE,
                ..State::default()
            }),
            allocs: AtomicUsize::new(0),
            frees: AtomicUsize::new(0),
            alloc_calls: AtomicUsize::new(0),
            free_calls: AtomicUsize::new(0),
        }
    }

    /// Like [`Fake::new`], lending the lock of its state
    /// ([`MemoryResource::lent_lock`]), as a pool does.
    pub fn lending(capacity: usize) -> Self {
        Self {
            lends: true,
            ..Self::new(capacity)
        }
    }

    /// The legacy stream of the fake's device (no driver call needed).
    pub fn stream(&self) -> Stream {
        self.device.default_stream()
    }

    /// Bytes live (as requested).
    pub fn used(&self) -> usize {
        self.state.lock().unwrap().used
    }

    /// Live allocations.
    pub fn live(&self) -> usize {
        self.state.lock().unwrap().live.len()
    }

    /// The size the fake recorded for `ptr`.
    pub fn size_of(&self, ptr: DevicePtr) -> Option<usize> {
        self.state.lock().unwrap().live.get(&ptr.0).copied()
    }
}

impl Fake {
    fn serve(
        &self,
        bytes: usize,
        alignment: usize,
        count: Option<CallCount<'_>>,
    ) -> Result<DevicePtr> {
        self.alloc_calls.fetch_add(1, Ordering::Relaxed);
        if !validate_request(bytes, alignment, DEFAULT_ALIGNMENT)? {
            return Ok(DevicePtr::NULL);
        }
        let mut s = self.state.lock().unwrap();
        if bytes > self.capacity - s.used {
            return Err(Error::oom_with(OomInfo {
                requested: bytes,
                live: Some(s.used),
                ..OomInfo::requested(bytes).on_device(0)
            }));
        }
        let ptr = s.next;
        s.next += bytes.next_multiple_of(DEFAULT_ALIGNMENT) as u64 + DEFAULT_ALIGNMENT as u64;
        s.live.insert(ptr, bytes);
        s.used += bytes;
        self.allocs.fetch_add(1, Ordering::Relaxed);
        if let Some(count) = count {
            count.apply(0);
        }
        Ok(DevicePtr(ptr))
    }

    fn free(&self, ptr: DevicePtr, bytes: usize, count: Option<CallCount<'_>>) -> Result<()> {
        self.free_calls.fetch_add(1, Ordering::Relaxed);
        if ptr.is_null() {
            return Ok(());
        }
        let mut s = self.state.lock().unwrap();
        match s.live.get(&ptr.0) {
            None => Err(Error::InvalidFree {
                ptr: ptr.0,
                reason: FreeError::Unknown,
            }),
            Some(&b) if b != bytes => Err(Error::InvalidFree {
                ptr: ptr.0,
                reason: FreeError::SizeMismatch {
                    allocated: b,
                    freed: bytes,
                },
            }),
            Some(_) => {
                s.live.remove(&ptr.0);
                s.used -= bytes;
                self.frees.fetch_add(1, Ordering::Relaxed);
                if let Some(count) = count {
                    count.apply(0);
                }
                Ok(())
            }
        }
    }
}

impl LentLock for Fake {
    fn allocate_counted(
        &self,
        bytes: usize,
        alignment: usize,
        _stream: &Stream,
        count: CallCount<'_>,
    ) -> Result<DevicePtr> {
        self.serve(bytes, alignment, Some(count))
    }

    fn deallocate_counted(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
        _stream: &Stream,
        count: CallCount<'_>,
    ) -> Result<()> {
        self.free(ptr, bytes, Some(count))
    }

    fn cells(&self) -> usize {
        1
    }

    fn locked(&self, f: &mut dyn FnMut()) {
        let _state = self.state.lock().unwrap();
        f();
    }
}

impl MemoryResource for Fake {
    fn allocate(&self, bytes: usize, alignment: usize, _stream: &Stream) -> Result<DevicePtr> {
        self.serve(bytes, alignment, None)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        _alignment: usize,
        _stream: &Stream,
    ) -> Result<()> {
        self.free(ptr, bytes, None)
    }

    fn lent_lock(&self) -> Option<&dyn LentLock> {
        self.lends.then_some(self as &dyn LentLock)
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn properties(&self) -> Properties {
        self.properties
    }
}
