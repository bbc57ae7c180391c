//! [`Pool`]: what every pool answers besides allocating: the bytes it holds
//! from its upstream, their peak, and giving cached memory back.
//!
//! Every pool of [`crate::pool`], CUDA's pools of [`crate::async_pool`] and
//! the [`PinnedPool`](crate::manager::PinnedPool) implement it; the adaptors
//! of [`crate::adaptor`] and `Arc`, `Box` and `&` forward it to the pool they
//! wrap, so a stack such as `LimitingAdaptor<PoolResource<_>>` or an
//! `Arc<dyn Pool>` answers for its pool.
//!
//! Two ways to give memory back:
//! - [`Pool::trim`] never waits: it gives back the cached memory whose frees
//!   are already known complete, largest first, until the pool holds at most
//!   `to` bytes (whole regions, chunks or extents, so it may end below `to`);
//!   `trim(0)` gives back all of it.
//! - [`Pool::release`] first waits for the streams that freed memory, then
//!   gives back everything not under a live allocation.
//!
//! Both return the bytes given back. What a pool can give back, and how,
//! depends on the pool; each implementation's documentation says so.

use crate::resource::MemoryResource;
use crate::Result;

/// A memory resource that caches memory taken from its upstream; see the
/// module documentation.
///
/// ```
/// use gpumem::pool::{Pool, PoolResource};
/// use gpumem::resource::{DeviceResource, MemoryResource};
/// use gpumem::Device;
///
/// fn main() -> gpumem::Result<()> {
///     let device = Device::sim(Default::default());
///     let pool = PoolResource::with_defaults(DeviceResource::new(device.clone()))?;
///     let stream = device.create_stream()?;
///     let p = pool.allocate(1 << 20, 256, &stream)?;
///     pool.deallocate(p, 1 << 20, 256, &stream)?;
///     assert_eq!(pool.reserved_bytes(), 2 << 20); // one 2 MiB region, kept
///
///     // Any pool, or any stack over one, answers the same questions.
///     let any: &dyn Pool = &pool;
///     assert_eq!(any.peak_reserved_bytes(), 2 << 20);
///     assert_eq!(any.release()?, 2 << 20); // waits for `stream`, gives it back
///     assert_eq!(any.reserved_bytes(), 0);
///     Ok(())
/// }
/// ```
pub trait Pool: MemoryResource {
    /// Bytes the pool holds from its upstream now.
    fn reserved_bytes(&self) -> usize;

    /// Highest [`Pool::reserved_bytes`] since the pool was made or since the
    /// last [`Pool::reset_peak`].
    fn peak_reserved_bytes(&self) -> usize;

    /// Restarts the peaks the pool keeps (reserved bytes, and live bytes
    /// where it counts them) from their current values.
    fn reset_peak(&self);

    /// Gives cached memory back to the upstream without waiting for any
    /// stream, largest pieces first, until the pool holds at most `to` bytes
    /// or nothing more can go now. Returns the bytes given back.
    fn trim(&self, to: usize) -> Result<usize>;

    /// Waits for the streams that freed memory into the pool, then gives back
    /// everything not under a live allocation. Returns the bytes given back.
    fn release(&self) -> Result<usize>;
}

/// `Pool` for wrappers of a pool, answered by the pool `$inner` reaches from
/// `$me`.
macro_rules! forward_pool {
    ($me:ident => $inner:expr; $([$($bound:tt)*] $ty:ty),* $(,)?) => {$(
        impl<P: $($bound)*> Pool for $ty {
            fn reserved_bytes(&$me) -> usize {
                $inner.reserved_bytes()
            }
            fn peak_reserved_bytes(&$me) -> usize {
                $inner.peak_reserved_bytes()
            }
            fn reset_peak(&$me) {
                $inner.reset_peak()
            }
            fn trim(&$me, to: usize) -> Result<usize> {
                $inner.trim(to)
            }
            fn release(&$me) -> Result<usize> {
                $inner.release()
            }
        }
    )*};
}

forward_pool!(self => (**self);
    [Pool + ?Sized] std::sync::Arc<P>,
    [Pool + ?Sized] Box<P>,
    [Pool + ?Sized] &P,
);

// The statistics adaptor's own counters keep their own peaks
// (`StatisticsAdaptor::reset_peak`, an inherent method); `Pool::reset_peak`
// restarts the pool's.
forward_pool!(self => self.upstream();
    [Pool] crate::adaptor::AlignedAdaptor<P>,
    [Pool] crate::adaptor::FailureCallbackAdaptor<P>,
    [Pool] crate::adaptor::LimitingAdaptor<P>,
    [Pool] crate::adaptor::LoggingAdaptor<P>,
    [Pool] crate::adaptor::PrefetchAdaptor<P>,
    [Pool] crate::adaptor::StatisticsAdaptor<P>,
    [Pool] crate::adaptor::TrackingAdaptor<P>,
);
