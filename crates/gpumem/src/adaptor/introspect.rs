//! [`Introspect`] through the adaptors that only count, cap or log: what the
//! resource below holds is what the adaptor holds.

use super::{LimitingAdaptor, LoggingAdaptor, StatisticsAdaptor};
use crate::driver::{DevicePtr, RawStream};
use crate::resource::{Introspect, LiveBlock, MemoryResource, Segment};

macro_rules! through_upstream {
    ($($adaptor:ident),*) => {$(
        impl<U: MemoryResource + Introspect> Introspect for $adaptor<U> {
            fn segments(&self) -> Vec<Segment> {
                self.upstream().segments()
            }
            fn live_blocks(&self) -> Vec<(LiveBlock, RawStream)> {
                self.upstream().live_blocks()
            }
            fn live_block_size(&self, ptr: DevicePtr) -> Option<usize> {
                self.upstream().live_block_size(ptr)
            }
            fn largest_free_block(&self) -> usize {
                self.upstream().largest_free_block()
            }
        }
    )*};
}

through_upstream!(LimitingAdaptor, StatisticsAdaptor, LoggingAdaptor);
