//! `CallbackResource`: a resource built from two user closures, for plugging an
//! allocator gpumem does not know into any pool or adaptor stack.

use super::{MemoryResource, Properties};
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::stream::Stream;
use crate::Result;

type AllocFn = dyn Fn(usize, usize, &Stream) -> Result<DevicePtr> + Send + Sync;
type FreeFn = dyn Fn(DevicePtr, usize, usize, &Stream) -> Result<()> + Send + Sync;

/// A resource whose allocate and deallocate are user closures. The closures see
/// every request as made, zero bytes included, and must follow the resource
/// rules themselves.
pub struct CallbackResource {
    device: Device,
    properties: Properties,
    alloc: Box<AllocFn>,
    free: Box<FreeFn>,
}

impl std::fmt::Debug for CallbackResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackResource")
            .field("device", &self.device)
            .field("properties", &self.properties)
            .finish()
    }
}

impl CallbackResource {
    /// A resource on `device` with the given properties and closures:
    /// `alloc(bytes, alignment, stream)` and `free(ptr, bytes, alignment, stream)`.
    pub fn new(
        device: Device,
        properties: Properties,
        alloc: impl Fn(usize, usize, &Stream) -> Result<DevicePtr> + Send + Sync + 'static,
        free: impl Fn(DevicePtr, usize, usize, &Stream) -> Result<()> + Send + Sync + 'static,
    ) -> Self {
        Self {
            device,
            properties,
            alloc: Box::new(alloc),
            free: Box::new(free),
        }
    }
}

impl MemoryResource for CallbackResource {
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
        crate::check_alignment(alignment)?;
        (self.alloc)(bytes, alignment, stream)
    }

    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()> {
        (self.free)(ptr, bytes, alignment, stream)
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn properties(&self) -> Properties {
        self.properties
    }
}
