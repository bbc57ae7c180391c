//! `PlannedPool`: collect host and device requests, lay them out in one
//! pinned and one device allocation, freeze the plan.
//!
//! Phases: *collecting* (`want_host` / `want_device` hand out typed slots),
//! *satisfied* (`satisfy` laid every slot out 256-byte aligned in one pinned
//! host and one device allocation), *committed* (`commit` freezes the plan:
//! further requests are errors). `release_all` gives both allocations back and
//! starts over. A plan larger than the pool's capacity is an error naming the
//! desired and available bytes.
//!
//! Safety without aliasing: host slices borrow the plan (`host_slice` takes
//! `&mut self`, `host_slices` hands every slice out at once, split from one
//! slice, so they are disjoint by construction), and host access first waits
//! for the streams of the plan's own asynchronous copies (a stream whose wait
//! failed is waited for again next time). The pinned pool knows the layout is
//! reachable from safe code: its safe copies into it
//! ([`PinnedPool::copy_to_host_async`](super::PinnedPool::copy_to_host_async),
//! the manager's) are refused, and while the plan holds its layout the pool
//! and the manager refuse to shut down. Slots carry the plan's id and
//! generation, so a slot of another plan or of a released layout is refused.
//!
//! ```
//! use std::sync::Arc;
//! use gpumem::driver::sim::SimConfig;
//! use gpumem::manager::MemoryManager;
//! use gpumem::Device;
//!
//! # fn main() -> gpumem::Result<()> {
//! let mm = MemoryManager::new(Device::sim(SimConfig::backed(64 << 20)));
//! let mut plan = mm.planned_pool(1 << 20, 1 << 20)?;
//! let (a, b) = (plan.want_host(100)?, plan.want_host(300)?);
//! let d = plan.want_device(300)?;
//! plan.satisfy()?;
//! plan.commit()?;
//! let mut s = plan.host_slices()?;
//! s[0].fill(1);
//! s[1].fill(2);
//! let stream = mm.device().create_stream()?;
//! plan.copy_to_device_async(b, d, &stream)?;
//! assert_eq!(plan.host_slice(a)?.len(), 100);
//! assert!(plan.want_host(1).is_err()); // committed
//! # Ok(())
//! # }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::pinned_pool::PinnedPool;
use crate::driver::DevicePtr;
use crate::resource::{MemoryResource, SharedResource, DEFAULT_ALIGNMENT};
use crate::stream::Stream;
use crate::{Error, Result};

static NEXT_PLAN: AtomicU64 = AtomicU64::new(1);

/// A request for pinned host bytes in a [`PlannedPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HostSlot {
    plan: u64,
    generation: u64,
    index: usize,
}

/// A request for device bytes in a [`PlannedPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceSlot {
    plan: u64,
    generation: u64,
    index: usize,
}

/// Where a plan stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanPhase {
    /// Requests are being collected (or added since the last `satisfy`).
    Collecting,
    /// Every request is laid out; more may still be added.
    Satisfied,
    /// Frozen: slices and pointers are available, requests are refused.
    Committed,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    bytes: usize,
    offset: usize,
}

/// A want/satisfy/commit pool over one pinned and one device allocation; see
/// the module documentation.
pub struct PlannedPool {
    id: u64,
    generation: u64,
    pinned: Arc<PinnedPool>,
    device: SharedResource,
    host_capacity: usize,
    device_capacity: usize,
    host: Vec<Slot>,
    dev: Vec<Slot>,
    /// (pointer, bytes) of the current allocations.
    host_block: Option<(DevicePtr, usize)>,
    dev_block: Option<(DevicePtr, usize)>,
    phase: PlanPhase,
    /// Streams with copies of the plan's host memory not yet waited for.
    copy_streams: Vec<Stream>,
}

impl std::fmt::Debug for PlannedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannedPool")
            .field("phase", &self.phase)
            .field("host_requests", &self.host.len())
            .field("device_requests", &self.dev.len())
            .field("host_capacity", &self.host_capacity)
            .field("device_capacity", &self.device_capacity)
            .finish()
    }
}

/// Lays out `slots` 256-byte aligned; returns the total, or `None` on overflow.
fn layout(slots: &mut [Slot]) -> Option<usize> {
    let mut at = 0usize;
    for s in slots {
        s.offset = at;
        at = at
            .checked_add(s.bytes)?
            .checked_next_multiple_of(DEFAULT_ALIGNMENT)?;
    }
    Some(at)
}

impl PlannedPool {
    /// A plan drawing pinned memory from `pinned` (at most `host_capacity`
    /// bytes) and device memory from `device` (at most `device_capacity`).
    pub fn new(
        pinned: Arc<PinnedPool>,
        device: SharedResource,
        host_capacity: usize,
        device_capacity: usize,
    ) -> Self {
        Self {
            id: NEXT_PLAN.fetch_add(1, Ordering::Relaxed),
            generation: 0,
            pinned,
            device,
            host_capacity,
            device_capacity,
            host: Vec::new(),
            dev: Vec::new(),
            host_block: None,
            dev_block: None,
            phase: PlanPhase::Collecting,
            copy_streams: Vec::new(),
        }
    }

    /// Where the plan stands.
    pub fn phase(&self) -> PlanPhase {
        self.phase
    }

    fn check_open(&self) -> Result<()> {
        if self.phase == PlanPhase::Committed {
            Err(Error::InvalidArgument(
                "the plan is committed: no more requests (release_all starts over)".into(),
            ))
        } else {
            Ok(())
        }
    }

    /// Asks for `bytes` of pinned host memory.
    pub fn want_host(&mut self, bytes: usize) -> Result<HostSlot> {
        self.check_open()?;
        self.host.push(Slot { bytes, offset: 0 });
        self.phase = PlanPhase::Collecting;
        Ok(HostSlot {
            plan: self.id,
            generation: self.generation,
            index: self.host.len() - 1,
        })
    }

    /// Asks for `bytes` of device memory.
    pub fn want_device(&mut self, bytes: usize) -> Result<DeviceSlot> {
        self.check_open()?;
        self.dev.push(Slot { bytes, offset: 0 });
        self.phase = PlanPhase::Collecting;
        Ok(DeviceSlot {
            plan: self.id,
            generation: self.generation,
            index: self.dev.len() - 1,
        })
    }

    /// Host and device bytes the plan needs as laid out (256-byte aligned).
    pub fn required_bytes(&self) -> (usize, usize) {
        let (mut h, mut d) = (self.host.clone(), self.dev.clone());
        (
            layout(&mut h).unwrap_or(usize::MAX),
            layout(&mut d).unwrap_or(usize::MAX),
        )
    }

    fn too_large(kind: &str, desired: Option<usize>, available: usize) -> Error {
        let desired = desired.map_or("more than usize::MAX".to_string(), |d| d.to_string());
        Error::InvalidArgument(format!(
            "plan exceeds capacity: desired {desired} bytes of {kind} memory, available {available} bytes"
        ))
    }

    fn release_blocks(&mut self) -> Result<()> {
        self.wait_copies()?;
        let mut first = Ok(());
        if let Some((p, n)) = self.host_block.take() {
            first = first.and(self.pinned.free_reachable(p, n));
        }
        if let Some((p, n)) = self.dev_block.take() {
            first = first.and(self.device.deallocate_sync(p, n, DEFAULT_ALIGNMENT));
        }
        first
    }

    /// Lays every request out and takes one pinned and one device allocation
    /// holding them. Over capacity: an error naming the desired and available
    /// bytes, and nothing changes. Again after more requests: lays out anew
    /// (contents are not kept).
    pub fn satisfy(&mut self) -> Result<()> {
        self.check_open()?;
        let host_total = layout(&mut self.host);
        let dev_total = layout(&mut self.dev);
        match host_total {
            Some(h) if h <= self.host_capacity => {}
            _ => {
                return Err(Self::too_large(
                    "pinned host",
                    host_total,
                    self.host_capacity,
                ))
            }
        }
        match dev_total {
            Some(d) if d <= self.device_capacity => {}
            _ => return Err(Self::too_large("device", dev_total, self.device_capacity)),
        }
        let (h, d) = (host_total.unwrap_or(0), dev_total.unwrap_or(0));
        self.release_blocks()?;
        let hp = self.pinned.allocate_reachable(h, DEFAULT_ALIGNMENT)?;
        let dp = match self.device.allocate_sync(d, DEFAULT_ALIGNMENT) {
            Ok(p) => p,
            Err(e) => {
                let _ = self.pinned.free_reachable(hp, h);
                return Err(e);
            }
        };
        self.host_block = Some((hp, h));
        self.dev_block = Some((dp, d));
        self.phase = PlanPhase::Satisfied;
        Ok(())
    }

    /// Freezes a satisfied plan: further requests are errors.
    pub fn commit(&mut self) -> Result<()> {
        match self.phase {
            PlanPhase::Satisfied => {
                self.phase = PlanPhase::Committed;
                Ok(())
            }
            PlanPhase::Committed => Ok(()),
            PlanPhase::Collecting => Err(Error::InvalidArgument(
                "the plan has requests not yet laid out: call satisfy before commit".into(),
            )),
        }
    }

    /// Waits for the plan's copies, gives both allocations back and forgets
    /// every request; old slots are refused from now on.
    pub fn release_all(&mut self) -> Result<()> {
        let r = self.release_blocks();
        self.host.clear();
        self.dev.clear();
        self.generation += 1;
        self.phase = PlanPhase::Collecting;
        r
    }

    fn ready(&self) -> Result<()> {
        if self.phase == PlanPhase::Collecting {
            return Err(Error::InvalidArgument(
                "the plan is not satisfied: call satisfy first".into(),
            ));
        }
        Ok(())
    }

    fn host_index(&self, s: HostSlot) -> Result<Slot> {
        self.ready()?;
        if s.plan != self.id || s.generation != self.generation {
            return Err(Error::InvalidArgument(
                "host slot of another plan or of a released layout".into(),
            ));
        }
        self.host
            .get(s.index)
            .copied()
            .ok_or_else(|| Error::InvalidArgument("no such host slot".into()))
    }

    fn device_index(&self, s: DeviceSlot) -> Result<Slot> {
        self.ready()?;
        if s.plan != self.id || s.generation != self.generation {
            return Err(Error::InvalidArgument(
                "device slot of another plan or of a released layout".into(),
            ));
        }
        self.dev
            .get(s.index)
            .copied()
            .ok_or_else(|| Error::InvalidArgument("no such device slot".into()))
    }

    /// Waits for the streams of the plan's copies; a stream is forgotten only
    /// once waited for, so after a failed wait host access still waits.
    fn wait_copies(&mut self) -> Result<()> {
        while let Some(s) = self.copy_streams.last() {
            s.synchronize()?;
            self.copy_streams.pop();
        }
        Ok(())
    }

    fn whole_host(&mut self) -> Result<&mut [u8]> {
        self.wait_copies()?;
        let Some((p, n)) = self.host_block else {
            return Ok(&mut []);
        };
        if n == 0 || p.is_null() {
            return Ok(&mut []);
        }
        // SAFETY: `p..p+n` is one live pinned allocation the plan took for
        // itself and hands to no one else; the plan's copies of it have been
        // waited for above; the slice borrows `self` mutably, so no other slice
        // of it, no copy and no release can happen while it lives.
        unsafe { self.pinned.host_slice_mut(p, n) }
    }

    /// The host bytes of one slot (waits for the plan's pending copies first).
    pub fn host_slice(&mut self, slot: HostSlot) -> Result<&mut [u8]> {
        let s = self.host_index(slot)?;
        let all = self.whole_host()?;
        all.get_mut(s.offset..s.offset + s.bytes)
            .ok_or_else(|| Error::InvalidArgument("host slot outside the layout".into()))
    }

    /// Every host slot's bytes at once, in request order, disjoint (split
    /// from one slice). Waits for the plan's pending copies first.
    pub fn host_slices(&mut self) -> Result<Vec<&mut [u8]>> {
        self.ready()?;
        let slots = self.host.clone();
        let mut rest = self.whole_host()?;
        let mut at = 0;
        let mut out = Vec::with_capacity(slots.len());
        for s in slots {
            let tail = std::mem::take(&mut rest);
            let (_, tail) = tail.split_at_mut(s.offset - at);
            let (mine, tail) = tail.split_at_mut(s.bytes);
            out.push(mine);
            rest = tail;
            at = s.offset + s.bytes;
        }
        Ok(out)
    }

    /// The device address of one slot.
    pub fn device_ptr(&self, slot: DeviceSlot) -> Result<DevicePtr> {
        let s = self.device_index(slot)?;
        let (p, _) = self.dev_block.unwrap_or((DevicePtr::NULL, 0));
        Ok(p.offset(s.offset))
    }

    /// The pinned address of one slot (for copies issued elsewhere).
    pub fn host_ptr(&self, slot: HostSlot) -> Result<DevicePtr> {
        let s = self.host_index(slot)?;
        let (p, _) = self.host_block.unwrap_or((DevicePtr::NULL, 0));
        Ok(p.offset(s.offset))
    }

    fn note_stream(&mut self, stream: &Stream) {
        if !self.copy_streams.iter().any(|s| s.id() == stream.id()) {
            self.copy_streams.push(stream.clone());
        }
    }

    /// Enqueues a copy of the host slot into the device slot on `stream`; the
    /// device slot must be at least as large. Host access to the plan waits
    /// for it.
    pub fn copy_to_device_async(
        &mut self,
        host: HostSlot,
        device: DeviceSlot,
        stream: &Stream,
    ) -> Result<()> {
        let (h, d) = (self.host_index(host)?, self.device_index(device)?);
        if d.bytes < h.bytes {
            return Err(Error::InvalidArgument(format!(
                "device slot of {} bytes is smaller than host slot of {} bytes",
                d.bytes, h.bytes
            )));
        }
        let (src, dst) = (self.host_ptr(host)?, self.device_ptr(device)?);
        self.pinned
            .copy_to_device_async(dst, src, h.bytes, stream)?;
        self.note_stream(stream);
        Ok(())
    }

    /// Enqueues a copy of the device slot into the host slot on `stream`; the
    /// host slot must be at least as large. Host access to the plan waits for
    /// it.
    pub fn copy_to_host_async(
        &mut self,
        device: DeviceSlot,
        host: HostSlot,
        stream: &Stream,
    ) -> Result<()> {
        let (h, d) = (self.host_index(host)?, self.device_index(device)?);
        if h.bytes < d.bytes {
            return Err(Error::InvalidArgument(format!(
                "host slot of {} bytes is smaller than device slot of {} bytes",
                h.bytes, d.bytes
            )));
        }
        let (dst, src) = (self.host_ptr(host)?, self.device_ptr(device)?);
        // SAFETY: the plan's host memory is reached only through `&mut self`
        // methods that wait for the plan's copy streams first (this one is
        // noted below), and the pinned pool refuses safe copies into it.
        unsafe {
            self.pinned
                .copy_to_host_async_unchecked(dst, src, d.bytes, stream)?;
        }
        self.note_stream(stream);
        Ok(())
    }
}

impl Drop for PlannedPool {
    fn drop(&mut self) {
        if crate::exit::process_is_exiting() {
            return;
        }
        if let Err(e) = self.release_blocks() {
            log::error!("PlannedPool release failed: {e}");
        }
    }
}
