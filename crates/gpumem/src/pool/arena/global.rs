//! The global arena: the region's superblocks that no stream arena holds.
//!
//! Two kinds of free runs live here. Clean runs (in the
//! [`SuperblockDirectory`]) are usable by any stream at once. Fenced runs were
//! released by a stream arena whose stream may still have work touching them:
//! they sit in one batch per stream with one event recorded on that stream
//! after the latest release (re-recorded as the batch grows, so one event per
//! stream per batch, never one per free). A batch becomes clean when its event
//! is complete; its own stream may take from it at once; another stream may
//! take from it after being made to wait on the event (the batch then belongs
//! to the waiting stream, with the event re-recorded there). Where the driver
//! cannot query or record (a foreign stream destroyed under us), the device is
//! synchronized instead.

use super::directory::SuperblockDirectory;
use crate::device::Device;
use crate::pool::stream_order::events::{EventPool, Fence};
use crate::pool::stream_order::streams::{query, synchronize_device, HeldStream, Progress};
use crate::pool::stream_order::sync::lock;
use crate::stream::Stream;
use std::sync::Mutex;

/// Spare events kept for batches and deferred frees.
const SPARE_EVENTS: usize = 256;

/// Runs released on one stream, fenced by one event.
struct Batch {
    /// Keeps the stream alive while its runs wait (a user may drop theirs).
    owner: HeldStream,
    fence: Fence,
    runs: Vec<(u32, u32)>,
}

/// Fenced batches and a pool of spare events, beside the directory.
pub(crate) struct GlobalArena {
    pub(crate) dir: SuperblockDirectory,
    device: Device,
    batches: Mutex<Vec<Batch>>,
    /// Spare events, also for the stream arenas' deferred frees.
    pub(crate) events: EventPool,
    /// Superblocks that could not be proven idle (device synchronization
    /// failed): never reused.
    lost: Mutex<u64>,
}

/// Takes `len` superblocks from the first run of `runs` that fits.
fn take_from_runs(runs: &mut Vec<(u32, u32)>, len: u32) -> Option<u32> {
    let i = runs.iter().position(|&(_, l)| l >= len)?;
    let (s, l) = runs[i];
    if l == len {
        runs.swap_remove(i);
    } else {
        runs[i] = (s + len, l - len);
    }
    Some(s)
}

impl GlobalArena {
    pub(crate) fn new(device: Device, superblocks: u32) -> Self {
        Self {
            dir: SuperblockDirectory::new(superblocks),
            device,
            batches: Mutex::new(Vec::new()),
            events: EventPool::new(SPARE_EVENTS),
            lost: Mutex::new(0),
        }
    }

    fn give_back_all(&self, runs: &[(u32, u32)]) {
        for &(s, l) in runs {
            self.dir.give_back(s, l);
        }
    }

    /// Last resort when the driver cannot tell whether `runs` are idle:
    /// synchronize the device, else never reuse them.
    fn give_back_after_sync(&self, runs: &[(u32, u32)]) {
        if synchronize_device(&self.device).is_ok() {
            self.give_back_all(runs);
        } else {
            *lock(&self.lost) += runs.iter().map(|&(_, l)| l as u64).sum::<u64>();
        }
    }

    /// Releases runs freed on `stream` (no live data in them): clean at once if
    /// the stream is idle, else fenced by the stream's batch event.
    pub(crate) fn release(&self, stream: &Stream, runs: Vec<(u32, u32)>) {
        if runs.is_empty() {
            return;
        }
        match query(stream) {
            Progress::Idle => return self.give_back_all(&runs),
            Progress::Busy | Progress::NotHere => {}
            Progress::Unknown => return self.give_back_after_sync(&runs),
        }
        let mut batches = lock(&self.batches);
        let id = stream.id();
        if let Some(b) = batches.iter_mut().find(|b| b.owner.id() == id) {
            if b.fence.extend(stream).is_ok() {
                b.runs.extend(runs);
                return;
            }
            // Cannot fence this stream: synchronize, which also frees its batch.
            drop(batches);
            return self.give_back_after_sync(&runs);
        }
        let Ok(fence) = Fence::new(stream, &self.events) else {
            drop(batches);
            return self.give_back_after_sync(&runs);
        };
        batches.push(Batch {
            owner: HeldStream::new(stream),
            fence,
            runs,
        });
    }

    /// Moves every batch whose event is complete to the clean runs; with
    /// `synced`, the caller has synchronized the device and all of them are.
    pub(crate) fn collect(&self, synced: bool) {
        let mut batches = lock(&self.batches);
        let mut i = 0;
        while i < batches.len() {
            if synced || batches[i].fence.has_passed() {
                let b = batches.swap_remove(i);
                self.give_back_all(&b.runs);
                b.fence.recycle(&self.events);
            } else {
                i += 1;
            }
        }
    }

    /// Takes `len` contiguous superblocks usable by work on `stream` from now
    /// on: clean runs first, then completed batches, then `stream`'s own batch,
    /// then other batches after making `stream` wait on their events.
    pub(crate) fn acquire(&self, len: u32, stream: &Stream) -> Option<u32> {
        if let Some(s) = self.dir.take(len) {
            return Some(s);
        }
        let id = stream.id();
        {
            let mut batches = lock(&self.batches);
            if batches.is_empty() {
                return None;
            }
            if let Some(b) = batches.iter_mut().find(|b| b.owner.id() == id) {
                if let Some(s) = take_from_runs(&mut b.runs, len) {
                    return Some(s);
                }
            }
        }
        self.collect(false);
        if let Some(s) = self.dir.take(len) {
            return Some(s);
        }
        let mut batches = lock(&self.batches);
        // Oldest first: make `stream` wait, then the batch is `stream`'s.
        let i = batches
            .iter()
            .position(|b| b.owner.id() != id && b.runs.iter().any(|&(_, l)| l >= len))?;
        let b = &mut batches[i];
        if b.fence.hand_to(stream).is_err() {
            drop(batches);
            if synchronize_device(&self.device).is_ok() {
                self.collect(true);
            }
            return self.dir.take(len);
        }
        b.owner = HeldStream::new(stream);
        let s = take_from_runs(&mut b.runs, len);
        // Merge `stream`'s older batch into this one: the new record covers it.
        if let Some(j) = (0..batches.len()).find(|&j| j != i && batches[j].owner.id() == id) {
            let old = batches.swap_remove(j);
            let i = if i == batches.len() { j } else { i };
            batches[i].runs.extend(old.runs);
            old.fence.recycle(&self.events);
        }
        s
    }

    /// Superblocks waiting in batches.
    pub(crate) fn fenced_count(&self) -> u64 {
        lock(&self.batches)
            .iter()
            .flat_map(|b| b.runs.iter())
            .map(|&(_, l)| l as u64)
            .sum()
    }

    /// Superblocks never reused because the device could not be synchronized.
    pub(crate) fn lost_count(&self) -> u64 {
        *lock(&self.lost)
    }

    /// One line per batch, for the fragmentation report.
    pub(crate) fn describe_batches(&self) -> Vec<String> {
        lock(&self.batches)
            .iter()
            .map(|b| {
                format!(
                    "fenced on stream {}: {} runs, {} superblocks (largest {})",
                    b.owner.id().0,
                    b.runs.len(),
                    b.runs.iter().map(|&(_, l)| l as u64).sum::<u64>(),
                    b.runs.iter().map(|&(_, l)| l).max().unwrap_or(0)
                )
            })
            .collect()
    }

    /// Drops every batch (the resource is going away, the device synchronized).
    pub(crate) fn clear(&self) {
        lock(&self.batches).clear();
        self.events.clear();
    }
}
