//! Memory resources: RMM's model in Rust.
//!
//! A [`MemoryResource`] hands out memory ordered on a stream and takes it back
//! ordered on a stream. Upstream resources talk to the driver ([`DeviceResource`],
//! [`PinnedHostResource`], [`ManagedResource`], [`SystemResource`],
//! [`SamHeadroomResource`], [`CallbackResource`]); pools and adaptors take any
//! resource as their upstream, so stacks compose freely. Generic upstreams keep
//! layering free on the fast path; `Arc<dyn MemoryResource>` also implements the
//! trait for when a stack is chosen at run time.
//!
//! Rules every resource follows:
//! - `allocate(0, ..)` returns [`DevicePtr::NULL`] without touching the upstream,
//!   and `deallocate(DevicePtr::NULL, n, ..)` does nothing and returns `Ok`,
//!   whatever `n` (as C's `free(NULL)`; NULL is never a live allocation).
//! - The alignment must be a power of two ([`Error::BadAlignment`] otherwise);
//!   every resource serves alignments up to [`DEFAULT_ALIGNMENT`] (256 bytes);
//!   larger ones are served where a resource says so, else
//!   [`Error::AlignmentTooLarge`] (wrap the resource in an aligned adaptor).
//! - A request that cannot be met is [`Error::OutOfMemory`] carrying the
//!   requested bytes, never a panic; a 1 PiB request is such a request.
//! - Memory allocated on stream `s` may be used by work on `s` at once; freeing on
//!   `s` means the memory is free once the work enqueued on `s` before the free has
//!   run. Resources that are not stream-ordered (the driver's synchronous
//!   allocators) ignore the stream.
//! - A bad free is refused with [`Error::InvalidFree`] and frees nothing: a
//!   pointer the resource did not hand out (another allocator's, or one inside
//!   a block), a pointer already freed, or a size other than the one
//!   allocated. Resources that record the requested size compare it exactly
//!   (the driver resources, the slab pools [`FixedSizeResource`],
//!   [`CachingPool`] and [`BinningResource`]'s bins and direct allocations,
//!   the async pools, the tracking adaptor, the aligned adaptor's
//!   over-aligned blocks); pools that record only the block compare at its
//!   granularity: [`PoolResource`] and [`VirtualPool`] accept any size that
//!   rounds up to the block's 256-byte granules, [`ArenaResource`] any size in
//!   the same granules (small blocks) or superblocks (large blocks), and their
//!   statistics count those rounded blocks, so they stay exact. The reason
//!   says what is wrong ([`FreeError`](crate::FreeError)); a second free is
//!   `DoubleFree` where the resource can still tell (a pool whose block is
//!   free, a driver resource that freed the pointer recently), else `Unknown`.
//!   A pool's block freed on a stream that captures a graph is parked for the
//!   graph (see [`crate::pool`]): it is checked the same way first, and
//!   freeing it again is always `DoubleFree`.
//!   [`CallbackResource`] leaves all this to its closures.
//! - The pointer and the size name the block: an alignment of at most 256
//!   bytes passed to `deallocate` need not be the allocation's (the aligned
//!   adaptor routes larger ones by it). Freeing on a stream other than the
//!   allocation's is valid and ordered on the freeing stream.
//! - The shared resource suite (`tests/common`) checks these rules on every
//!   resource, bad frees included (its bad-free matrix).
//!
//! [`FixedSizeResource`]: crate::pool::FixedSizeResource
//! [`CachingPool`]: crate::pool::CachingPool
//! [`BinningResource`]: crate::pool::BinningResource
//! [`PoolResource`]: crate::pool::PoolResource
//! [`VirtualPool`]: crate::pool::VirtualPool
//! [`ArenaResource`]: crate::pool::ArenaResource

mod callback;
// The driver resources free what they handed out (their `HandedOut` tables
// say what that is), and the growable ranges map and unmap their own VMM
// memory: each passes its own allocations to the driver's `unsafe` methods.
#[allow(unsafe_code)]
mod device;
#[allow(unsafe_code)]
pub(crate) mod growable;
mod handed_out;
mod lent_lock;
#[allow(unsafe_code)]
mod managed;
#[allow(unsafe_code)]
mod pinned;
mod sam_headroom;
mod snapshot;
mod system;

pub use callback::CallbackResource;
pub use device::DeviceResource;
pub use growable::{GrowInPlace, PIECE_GRANULES};
pub use handed_out::HandedOut;
pub use lent_lock::LentLock;
pub use managed::ManagedResource;
pub use pinned::PinnedHostResource;
pub use sam_headroom::SamHeadroomResource;
pub(crate) use snapshot::{each_a_segment, on_no_stream};
pub use snapshot::{merge_adjacent, Introspect, LiveBlock, Segment};
pub use system::SystemResource;

use std::sync::Arc;

use crate::device::Device;
use crate::driver::DevicePtr;
use crate::stream::Stream;
use crate::{check_alignment, Error, Result};

/// The alignment every resource serves and allocations get by default: 256
/// bytes, what `cuMemAlloc` guarantees.
pub const DEFAULT_ALIGNMENT: usize = 256;

/// Where a resource's memory can be accessed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Properties {
    /// Kernels on the device can read and write it.
    pub device_accessible: bool,
    /// Host code can read and write it through the pointer.
    pub host_accessible: bool,
}

impl Properties {
    /// Device memory.
    pub const DEVICE: Properties = Properties {
        device_accessible: true,
        host_accessible: false,
    };
    /// Host memory that the device can also access (pinned, managed).
    pub const HOST_AND_DEVICE: Properties = Properties {
        device_accessible: true,
        host_accessible: true,
    };
}

/// A source of memory ordered on streams. See the module documentation for the
/// rules every implementation follows.
pub trait MemoryResource: Send + Sync {
    /// Allocates `bytes` aligned to `alignment`, usable by work on `stream` at once.
    fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr>;

    /// Frees memory from [`MemoryResource::allocate`] of this resource, once the
    /// work enqueued on `stream` so far has run. `bytes` and `alignment` are the
    /// values it was allocated with.
    fn deallocate(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        alignment: usize,
        stream: &Stream,
    ) -> Result<()>;

    /// The device this resource serves (for host resources: the device whose
    /// driver they use).
    fn device(&self) -> &Device;

    /// Where the memory can be accessed from.
    fn properties(&self) -> Properties;

    /// Allocates memory usable by any stream as soon as this returns: allocates
    /// on the legacy default stream and synchronizes it.
    fn allocate_sync(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
        let stream = self.device().default_stream();
        let ptr = self.allocate(bytes, alignment, &stream)?;
        if let Err(e) = stream.synchronize() {
            let _ = self.deallocate(ptr, bytes, alignment, &stream);
            return Err(e);
        }
        Ok(ptr)
    }

    /// Frees memory that no stream uses any more (the caller has synchronized).
    fn deallocate_sync(&self, ptr: DevicePtr, bytes: usize, alignment: usize) -> Result<()> {
        self.deallocate(ptr, bytes, alignment, &self.device().default_stream())
    }

    /// Checks that the `bytes` at `ptr`, memory this resource handed out, can
    /// be used now: the memory operations of gpumem (such as
    /// [`DeviceBuffer`](crate::DeviceBuffer)'s copies) call it first. Always
    /// `Ok` but where a resource can take the memory of live blocks away for
    /// a while: [`VirtualPool`](crate::pool::VirtualPool) refuses blocks of
    /// a region asleep ([`Error::Asleep`]). Adaptors ask their upstream.
    #[inline]
    fn check_access(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let _ = (ptr, bytes);
        Ok(())
    }

    /// The address that identifies this resource; wrappers such as `Arc<R>`
    /// report their inner resource's identity.
    fn identity(&self) -> *const () {
        self as *const Self as *const ()
    }

    /// True when memory allocated by one of the two can be freed by the other.
    /// By default, only a resource is equal to itself (through any wrapper).
    fn is_equal(&self, other: &dyn MemoryResource) -> bool {
        self.identity() == other.identity()
    }

    /// The locks this resource holds while it serves a call (one, or one
    /// per shard), lent to a wrapper that counts the calls (see
    /// [`LentLock`]); `None`, the default, where it has no such lock. The
    /// answer, and the number of locks, are the same for the
    /// resource's whole life. Adaptors keep the default: a wrapper counting
    /// through a lent lock calls the lender itself, past anything between
    /// them. `Arc`, `Box` and references forward it.
    #[inline]
    fn lent_lock(&self) -> Option<&dyn LentLock> {
        None
    }

    /// Growing allocations in place at their end, where this resource can
    /// ([`GrowInPlace`]: [`DeviceResource`] on a device with CUDA's virtual
    /// memory management); `None`, the default, otherwise. A pool asks its
    /// upstream for it to grow one address range per heap instead of
    /// taking separate regions. The limiting and statistics adaptors pass
    /// it on, counting the growth; other adaptors keep the default, and a
    /// pool over them takes separate regions. `Arc`, `Box` and references
    /// forward it.
    fn grow_in_place(&self) -> Option<&dyn GrowInPlace> {
        None
    }

    /// The allocations this resource holds from the driver, each a
    /// [`Segment`], in address order, where it can list them
    /// ([`DeviceResource`]); `None`, the default, otherwise. A pool answers
    /// [`Introspect::segments`] with its upstream's. The limiting and
    /// statistics adaptors pass it on; `Arc`, `Box` and references forward
    /// it.
    fn driver_segments(&self) -> Option<Vec<Segment>> {
        None
    }
}

/// Checks a request the way every resource must: power-of-two alignment no
/// larger than `max_alignment`. Returns `Ok(false)` for zero bytes (the caller
/// returns [`DevicePtr::NULL`]) and `Ok(true)` for a request to serve.
#[inline]
pub fn validate_request(bytes: usize, alignment: usize, max_alignment: usize) -> Result<bool> {
    check_alignment(alignment)?;
    if alignment > max_alignment {
        return Err(Error::AlignmentTooLarge {
            alignment,
            max: max_alignment,
        });
    }
    Ok(bytes != 0)
}

macro_rules! forward_resource {
    ($($ty:ty),*) => {$(
        impl<R: MemoryResource + ?Sized> MemoryResource for $ty {
            #[inline]
            fn allocate(&self, bytes: usize, alignment: usize, stream: &Stream) -> Result<DevicePtr> {
                (**self).allocate(bytes, alignment, stream)
            }
            #[inline]
            fn deallocate(&self, ptr: DevicePtr, bytes: usize, alignment: usize, stream: &Stream) -> Result<()> {
                (**self).deallocate(ptr, bytes, alignment, stream)
            }
            fn device(&self) -> &Device {
                (**self).device()
            }
            fn properties(&self) -> Properties {
                (**self).properties()
            }
            fn allocate_sync(&self, bytes: usize, alignment: usize) -> Result<DevicePtr> {
                (**self).allocate_sync(bytes, alignment)
            }
            fn deallocate_sync(&self, ptr: DevicePtr, bytes: usize, alignment: usize) -> Result<()> {
                (**self).deallocate_sync(ptr, bytes, alignment)
            }
            #[inline]
            fn check_access(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
                (**self).check_access(ptr, bytes)
            }
            fn identity(&self) -> *const () {
                (**self).identity()
            }
            fn is_equal(&self, other: &dyn MemoryResource) -> bool {
                (**self).is_equal(other)
            }
            #[inline]
            fn lent_lock(&self) -> Option<&dyn LentLock> {
                (**self).lent_lock()
            }
            fn grow_in_place(&self) -> Option<&dyn GrowInPlace> {
                (**self).grow_in_place()
            }
            fn driver_segments(&self) -> Option<Vec<Segment>> {
                (**self).driver_segments()
            }
        }
    )*};
}

forward_resource!(Arc<R>, Box<R>, &R);

/// A shared, dynamically chosen resource.
pub type SharedResource = Arc<dyn MemoryResource>;
