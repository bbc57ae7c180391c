//! `HoldingAdaptor`: memory freed through it is held, not given back, until
//! [`HoldingAdaptor::give_back`] or drop.
//!
//! The upstream of a graph-private pool: a captured CUDA graph keeps using
//! the addresses it was captured with on every replay, including those of
//! blocks freed during the capture. A pool over this adaptor may "give back"
//! a region (when it trims on out of memory) without the address ever being
//! handed out again by the driver while the graph may still be replayed;
//! the memory goes back when the graph is gone.

use std::sync::Mutex;

use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{MemoryResource, Properties};
use crate::stream::Stream;
use crate::Result;

/// A resource whose frees are held until [`HoldingAdaptor::give_back`].
#[derive(Debug)]
pub struct HoldingAdaptor<U: MemoryResource> {
    upstream: U,
    /// Freed allocations not yet given back: (pointer, bytes, alignment).
    held: Mutex<Vec<(DevicePtr, usize, usize)>>,
}

impl<U: MemoryResource> HoldingAdaptor<U> {
    /// Wraps `upstream`.
    pub fn new(upstream: U) -> Self {
        Self {
            upstream,
            held: Mutex::new(Vec::new()),
        }
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Bytes freed through the adaptor and held.
    pub fn held_bytes(&self) -> usize {
        self.lock().iter().map(|&(_, b, _)| b).sum()
    }

    /// Frees everything held to the upstream, synchronously (the caller
    /// knows the work that used it is done). Returns the bytes given back;
    /// on an upstream error, what was not given back stays held.
    pub fn give_back(&self) -> Result<usize> {
        let held = std::mem::take(&mut *self.lock());
        let mut given = 0;
        let mut rest = held.into_iter();
        for (ptr, bytes, alignment) in rest.by_ref() {
            if let Err(e) = self.upstream.deallocate_sync(ptr, bytes, alignment) {
                let mut kept = self.lock();
                kept.push((ptr, bytes, alignment));
                kept.extend(rest);
                return Err(e);
            }
            given += bytes;
        }
        Ok(given)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(DevicePtr, usize, usize)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<U: MemoryResource> MemoryResource for HoldingAdaptor<U> {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        self.upstream.allocate(bytes, alignment, stream)
    }

    /// Holds the allocation: nothing reaches the upstream until
    /// [`HoldingAdaptor::give_back`].
    fn deallocate(&self, ptr: DevicePtr, bytes: usize, alignment: usize, _: &Stream) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        self.lock().push((ptr, bytes, alignment));
        Ok(())
    }

    fn device(&self) -> &Device {
        self.upstream.device()
    }

    fn properties(&self) -> Properties {
        self.upstream.properties()
    }

    fn check_access(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.upstream.check_access(ptr, bytes)
    }
}

impl<U: MemoryResource> Drop for HoldingAdaptor<U> {
    fn drop(&mut self) {
        if let Err(e) = self.give_back() {
            log::warn!("holding adaptor: giving held memory back failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptor::StatisticsAdaptor;
    use crate::driver::sim::SimConfig;
    use crate::resource::DeviceResource;

    #[test]
    fn frees_are_held_until_given_back_and_the_address_is_not_reused_meanwhile() {
        let device = Device::sim(SimConfig::default());
        let s = device.create_stream().unwrap();
        let h = HoldingAdaptor::new(StatisticsAdaptor::new(DeviceResource::new(device.clone())));
        let a = h.allocate(1 << 20, 256, &s).unwrap();
        h.deallocate(a, 1 << 20, 256, &s).unwrap();
        assert_eq!(h.held_bytes(), 1 << 20);
        assert_eq!(
            h.upstream().stats().allocated_bytes.current,
            1 << 20,
            "still allocated upstream"
        );
        let b = h.allocate(1 << 20, 256, &s).unwrap();
        assert_ne!(a, b, "the held address is not handed out again");
        assert_eq!(h.give_back().unwrap(), 1 << 20);
        assert_eq!(h.held_bytes(), 0);
        h.deallocate(b, 1 << 20, 256, &s).unwrap();
        drop(h); // gives `b` back
    }
}
