//! `ThreadSafeAdaptor`: makes a resource that cannot be used from two threads at
//! once into a [`MemoryResource`] (RMM's thread_safe_resource_adaptor).
//!
//! In C++ any resource can be called concurrently and the adaptor is how an
//! unsafe one is protected. In Rust a `MemoryResource` is `Send + Sync` with
//! `&self` methods, so it is thread-safe by construction and wrapping it in a
//! lock would add cost and no safety. The honest Rust shape of RMM's use case is
//! a resource whose methods take `&mut self` (a simple allocator keeping plain,
//! unsynchronised state): it implements [`LocalMemoryResource`], needs only to
//! be `Send`, and this adaptor puts it behind one mutex, which the compiler then
//! knows makes it `Sync`.
//!
//! Fast path: one mutex lock around each call to the inner resource.

use std::sync::{Mutex, MutexGuard};

use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{MemoryResource, Properties};
use crate::stream::Stream;
use crate::{check_alignment, Result};

/// A memory resource used by one thread at a time: the same contract as
/// [`MemoryResource`] (see [`crate::resource`] for the rules), with `&mut self`
/// methods and no `Sync` requirement. Wrap it in a [`ThreadSafeAdaptor`] to
/// share it.
pub trait LocalMemoryResource: Send {
    /// Allocates `bytes` aligned to `alignment`, usable by work on `stream`.
    fn allocate(&mut self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr>;

    /// Frees memory from [`LocalMemoryResource::allocate`] of this resource.
    fn deallocate(
        &mut self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()>;

    /// The device this resource serves.
    fn device(&self) -> &Device;

    /// Where the memory can be accessed from.
    fn properties(&self) -> Properties;
}

/// A [`LocalMemoryResource`] behind a mutex: a shareable [`MemoryResource`].
#[derive(Debug)]
pub struct ThreadSafeAdaptor<U> {
    inner: Mutex<U>,
    // Kept outside the lock: `device()` returns a reference.
    device: Device,
    properties: Properties,
}

impl<U: LocalMemoryResource> ThreadSafeAdaptor<U> {
    /// Wraps `inner`.
    pub fn new(inner: U) -> Self {
        let device = inner.device().clone();
        let properties = inner.properties();
        Self {
            inner: Mutex::new(inner),
            device,
            properties,
        }
    }

    /// Locks the inner resource for direct use (inspection, configuration).
    /// Allocations through the adaptor wait while the guard lives.
    pub fn lock(&self) -> MutexGuard<'_, U> {
        // A panic inside the inner resource may have left it inconsistent, but
        // refusing every later call would turn one bug into a dead process; the
        // inner resource's own checks are what protect its state.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Unwraps the inner resource.
    pub fn into_inner(self) -> U {
        self.inner.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

impl<U: LocalMemoryResource> MemoryResource for ThreadSafeAdaptor<U> {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        check_alignment(alignment)?;
        if bytes == 0 {
            return Ok(DevicePtr::NULL);
        }
        self.lock().allocate(bytes, alignment, stream)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        self.lock().deallocate(ptr, bytes, alignment, stream)
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn properties(&self) -> Properties {
        self.properties
    }
}
