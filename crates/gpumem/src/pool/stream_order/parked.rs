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
//! The rules, the same in every pool:
//! - a free on a capturing stream is checked as any free is (a pointer the
//!   pool did not hand out, an interior pointer, another size: the same
//!   [`Error::InvalidFree`]) and refused before anything is parked; only a
//!   live block of the pool, named with its size, is parked;
//! - a parked block counts as freed for the caller (live bytes and blocks),
//!   while its memory stays in the pool's reserve;
//! - freeing a parked block again is a double free, whether or not a capture
//!   is under way, and the block stays parked.
//!
//! Pools keep their parked blocks where their free path already looks: a
//! [`ParkedBlocks`] behind the lock a free takes anyway (the lane-heap
//! pools), the slab's own table of live blocks (a parked block is neither
//! live nor free there), or a [`Parked`] whose one atomic counter tells the
//! free path that nothing is parked (the arena, whose blocks stay live in
//! its superblocks; the blocks the caching pool and the binning resource take
//! straight from their upstream, found only when a free is refused).
//! Recognising a capturing stream costs the free one atomic load when gpumem
//! counts no capture ([`crate::captures`]), and one capture-status query
//! otherwise.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::streams::synchronize_device;
use super::sync::lock;
use crate::device::Device;
use crate::driver::DevicePtr;
use crate::error::FreeError;
use crate::{Error, Result};

pub(crate) use super::streams::capturing;

/// The error of a free of a parked block.
#[cold]
fn double_free(ptr: DevicePtr) -> Error {
    Error::InvalidFree {
        ptr: ptr.0,
        reason: FreeError::DoubleFree,
    }
}

/// Parked blocks by address, with the bytes the pool counted for each; kept
/// behind the lock of the part of a pool that holds them.
#[derive(Debug, Default)]
pub(crate) struct ParkedBlocks {
    blocks: HashMap<u64, usize>,
    bytes: usize,
}

impl ParkedBlocks {
    /// Refuses a free of a parked block as a double free. A read of the
    /// map's length when nothing is parked.
    #[inline]
    pub(crate) fn refuse(&self, ptr: DevicePtr) -> Result<()> {
        if self.contains(ptr) {
            return Err(double_free(ptr));
        }
        Ok(())
    }

    /// Parks the block at `ptr`, counted as `bytes`; a block parked already
    /// is a double free.
    pub(crate) fn park(&mut self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.refuse(ptr)?;
        self.insert(ptr, bytes);
        Ok(())
    }

    /// Parks the block at `ptr`, counted as `bytes`, which the caller found
    /// not parked.
    pub(crate) fn insert(&mut self, ptr: DevicePtr, bytes: usize) {
        if self.blocks.insert(ptr.0, bytes).is_none() {
            self.bytes += bytes;
        }
    }

    /// Takes the block at `ptr` out (the NCCL-ready mode hands its kept
    /// blocks out again; see `virtual_pool::kept`); the bytes it counted.
    pub(crate) fn remove(&mut self, ptr: DevicePtr) -> Option<usize> {
        let bytes = self.blocks.remove(&ptr.0)?;
        self.bytes -= bytes;
        Some(bytes)
    }

    /// True when the block at `ptr` is parked.
    #[inline]
    pub(crate) fn contains(&self, ptr: DevicePtr) -> bool {
        !self.blocks.is_empty() && self.blocks.contains_key(&ptr.0)
    }

    /// Bytes parked.
    #[inline]
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Blocks parked.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// True when nothing is parked.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

/// Parked blocks shared by the threads of a pool whose free path holds no
/// lock of its own when it must look: one atomic load says none is parked.
#[derive(Debug, Default)]
pub(crate) struct Parked {
    count: AtomicUsize,
    blocks: Mutex<ParkedBlocks>,
}

impl Parked {
    /// Refuses a free of a parked block as a double free: one atomic load
    /// while nothing is parked.
    #[inline]
    pub(crate) fn refuse(&self, ptr: DevicePtr) -> Result<()> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        lock(&self.blocks).refuse(ptr)
    }

    /// Parks the block at `ptr`, counted as `bytes`; a block parked already
    /// is a double free.
    #[cold]
    pub(crate) fn park(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        let mut blocks = lock(&self.blocks);
        blocks.park(ptr, bytes)?;
        self.count.store(blocks.len(), Ordering::Release);
        Ok(())
    }

    /// True when the block at `ptr` is parked (for diagnosing a refused free).
    #[cold]
    pub(crate) fn contains(&self, ptr: DevicePtr) -> bool {
        self.count.load(Ordering::Acquire) != 0 && lock(&self.blocks).contains(ptr)
    }

    /// Gives every parked block back through `free` (the pool is going)
    /// once `device` is idle, as a graph's launches may still use them; keeps
    /// them when the device cannot be waited for (a capture is under way),
    /// since leaking memory is safe and freeing it under a running graph is
    /// not.
    pub(crate) fn give_back(
        &mut self,
        device: &Device,
        mut free: impl FnMut(DevicePtr, usize) -> Result<()>,
    ) {
        let blocks = self.blocks.get_mut().unwrap_or_else(|p| p.into_inner());
        if blocks.is_empty() || crate::exit::process_is_exiting() {
            return;
        }
        if let Err(e) = synchronize_device(device) {
            log::warn!(
                "{} bytes parked for CUDA graphs are not given back: the device cannot be waited for ({e})",
                blocks.bytes()
            );
            return;
        }
        for (ptr, bytes) in std::mem::take(blocks).blocks {
            crate::exit::give_back(
                || format!("parked block {ptr:#x}"),
                || free(DevicePtr(ptr), bytes),
            );
        }
    }
}
