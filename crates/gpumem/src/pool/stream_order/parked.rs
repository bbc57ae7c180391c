//! Memory freed on a stream that is capturing a CUDA graph.
//!
//! A free captured into a graph happens again on every launch, at a time
//! the pool cannot know, and the graph's kernels use the memory on every
//! launch too: handing it to other work, during the capture or after, would
//! let the two overlap. So a pool parks it: the block stays allocated, kept
//! aside for the graph, and the pool never hands it out again. The memory
//! comes back when the pool is dropped. Graphs that free their temporaries
//! and want them reused belong in a [`GraphPool`](crate::graph_pool::GraphPool),
//! whose frees during a capture serve the same capture and later ones.
//!
//! Parking costs the free one atomic load when gpumem counts no capture
//! ([`crate::captures`]), and one capture-status query otherwise. A block
//! parked twice is a double free and is refused; a pointer the pool never
//! gave out, freed on a capturing stream, is kept aside like the others.

use std::sync::Mutex;

use super::streams::capturing;
use super::sync::lock;
use crate::driver::DevicePtr;
use crate::error::FreeError;
use crate::stream::Stream;
use crate::{Error, Result};

/// A pool's parked blocks, by address.
#[derive(Debug, Default)]
pub(crate) struct Parked {
    blocks: Mutex<Vec<u64>>,
}

impl Parked {
    /// Parks `ptr` when `stream` is capturing; `Ok(false)` when it is not
    /// (the pool frees it as usual).
    #[inline]
    pub(crate) fn park_if_capturing(&self, ptr: DevicePtr, stream: &Stream) -> Result<bool> {
        if !capturing(stream) {
            return Ok(false);
        }
        self.park(ptr).map(|()| true)
    }

    #[cold]
    fn park(&self, ptr: DevicePtr) -> Result<()> {
        let mut blocks = lock(&self.blocks);
        if blocks.contains(&ptr.0) {
            return Err(Error::InvalidFree {
                ptr: ptr.0,
                reason: FreeError::DoubleFree,
            });
        }
        blocks.push(ptr.0);
        Ok(())
    }
}
