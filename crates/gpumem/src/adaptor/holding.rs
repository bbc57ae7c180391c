//! `HoldingAdaptor`: memory freed through it is held, not given back, until
//! [`HoldingAdaptor::give_back`] or drop.
//!
//! The upstream of a graph-private pool: a captured CUDA graph keeps using
//! the addresses it was captured with on every replay, including those of
//! blocks freed during the capture. A pool over this adaptor may "give back"
//! a region (when it trims on out of memory) without the address ever being
//! handed out again by the driver while the graph may still be replayed;
//! the memory goes back when the graph is gone.
//!
//! Bad frees: the adaptor keeps its own table of the allocations it handed
//! out ([`HandedOut`]), so a double, foreign or wrong-size free is refused
//! with [`Error::InvalidFree`](crate::Error::InvalidFree) when it is made and
//! nothing is held. Holding an unchecked free would give it back later and
//! free whatever lives at that address by then.

use std::sync::Mutex;

use crate::device::Device;
use crate::driver::DevicePtr;
use crate::resource::{HandedOut, MemoryResource, Properties};
use crate::stream::Stream;
use crate::Result;

/// A resource whose frees are held until [`HoldingAdaptor::give_back`].
#[derive(Debug)]
pub struct HoldingAdaptor<U: MemoryResource> {
    upstream: U,
    /// Allocations handed out and not freed: pointer → bytes, alignment.
    live: HandedOut<usize>,
    /// Freed allocations not yet given back: (pointer, bytes, alignment).
    held: Mutex<Vec<(DevicePtr, usize, usize)>>,
}

impl<U: MemoryResource> HoldingAdaptor<U> {
    /// Wraps `upstream`.
    pub fn new(upstream: U) -> Self {
        Self {
            upstream,
            live: HandedOut::default(),
            held: Mutex::new(Vec::new()),
        }
    }

    /// The wrapped resource.
    pub fn upstream(&self) -> &U {
        &self.upstream
    }

    /// Bytes handed out through the adaptor and not freed.
    pub fn live_bytes(&self) -> usize {
        self.live.bytes()
    }

    /// Bytes freed through the adaptor and held.
    pub fn held_bytes(&self) -> usize {
        self.lock().iter().map(|&(_, b, _)| b).sum()
    }

    /// Frees everything held to the upstream, synchronously (the caller
    /// knows the work that used it is done). Returns the bytes given back;
    /// when the upstream refuses some, the others are given back all the
    /// same, the refused ones stay held, and the first error is returned.
    pub fn give_back(&self) -> Result<usize> {
        let held = std::mem::take(&mut *self.lock());
        let mut given = 0;
        let mut first_err = None;
        let mut kept = Vec::new();
        for (ptr, bytes, alignment) in held {
            match self.upstream.deallocate_sync(ptr, bytes, alignment) {
                Ok(()) => given += bytes,
                Err(e) => {
                    kept.push((ptr, bytes, alignment));
                    first_err.get_or_insert(e);
                }
            }
        }
        if !kept.is_empty() {
            self.lock().extend(kept);
        }
        first_err.map_or(Ok(given), Err)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(DevicePtr, usize, usize)>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<U: MemoryResource> MemoryResource for HoldingAdaptor<U> {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        let ptr = self.upstream.allocate(bytes, alignment, stream)?;
        self.live.insert(ptr, bytes, alignment);
        Ok(ptr)
    }

    /// Holds the allocation: nothing reaches the upstream until
    /// [`HoldingAdaptor::give_back`]. A pointer this adaptor did not hand
    /// out, one already freed, or a size other than the allocation's is
    /// refused and nothing is held.
    fn deallocate(&self, ptr: DevicePtr, bytes: usize, alignment: usize, _: &Stream) -> Result<()> {
        if ptr.is_null() {
            return Ok(());
        }
        crate::error::check_alignment(alignment)?;
        let alignment = self.live.take(ptr, bytes)?;
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
    #[test]
    fn bad_frees_are_refused_when_made_and_never_free_a_live_block_later() {
        let device = Device::sim(SimConfig::default());
        let s = device.create_stream().unwrap();
        let h = HoldingAdaptor::new(DeviceResource::new(device.clone()));
        let a = h.allocate(4096, 256, &s).unwrap();
        h.deallocate(a, 4096, 256, &s).unwrap();
        let e = h.deallocate(a, 4096, 256, &s).unwrap_err();
        assert!(e.to_string().contains("double free"), "{e}");
        assert!(h.deallocate(DevicePtr(0xdead_0000), 77, 256, &s).is_err());
        let b = h.allocate(4096, 256, &s).unwrap();
        let e = h.deallocate(b, 4000, 256, &s).unwrap_err();
        assert!(e.to_string().contains("4096"), "{e}");
        assert_eq!(h.held_bytes(), 4096, "only the good free is held");
        assert_eq!(h.give_back().unwrap(), 4096);
        // `b` is still live: a new allocation never shares its address.
        let c = h.allocate(4096, 256, &s).unwrap();
        assert_ne!(b, c);
        assert_eq!(h.live_bytes(), 8192);
        h.deallocate(b, 4096, 256, &s).unwrap();
        h.deallocate(c, 4096, 256, &s).unwrap();
    }
}
