//! One [`Stream`] per foreign stream handle of a device, found on every
//! allocation and free without a lock, a reference count or a thread-local.
//!
//! The C ABI receives raw handles (`cudaStream_t`); a pool must see the same
//! stream for every call with the same handle, so each handle is wrapped
//! once and kept. The wrappers live in a table of slots, each set once and
//! never changed, looked up by open addressing from the handle's hash: a
//! handle's probe sequence is fixed, and every slot before its own holds
//! another handle for good, so a lookup is a few loads and compares and
//! hands out a reference (no `Arc` count touched). Handles beyond the table
//! (more distinct streams than [`SLOTS`] on one device) go to a map under a
//! lock and are handed out as clones.
//!
//! The legacy default stream (0 or `cudaStreamLegacy`) and the per-thread
//! default stream have wrappers of their own.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use gpumem::driver::{STREAM_LEGACY, STREAM_PER_THREAD};
use gpumem::{Device, Stream};

/// Slots of the table: more distinct streams than PyTorch's and CuPy's
/// stream pools make on one device.
pub const SLOTS: usize = 256;

/// The first slot of the handle `raw`'s probe sequence: Fibonacci hashing
/// (the product's top bits), as handles are pointers, aligned and close
/// together.
#[inline]
fn first_slot(raw: u64) -> usize {
    const BITS: u32 = SLOTS.trailing_zeros();
    const _: () = assert!(SLOTS.is_power_of_two());
    (raw.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - BITS)) as usize
}

/// The wrappers of one device's stream handles.
pub struct ForeignStreams {
    device: Device,
    legacy: Stream,
    per_thread: Stream,
    /// Each slot: a handle and its wrapper.
    slots: [OnceLock<(u64, Stream)>; SLOTS],
    overflow: RwLock<HashMap<u64, Stream>>,
}

impl ForeignStreams {
    /// No handle wrapped yet, on `device`.
    pub fn new(device: &Device) -> Self {
        Self {
            legacy: device.default_stream(),
            per_thread: device.per_thread_stream(),
            device: device.clone(),
            slots: std::array::from_fn(|_| OnceLock::new()),
            overflow: RwLock::new(HashMap::new()),
        }
    }

    /// The one wrapper of the handle `raw` (0 is the legacy default stream).
    #[inline]
    pub fn get(&self, raw: u64) -> Cow<'_, Stream> {
        match self.found(raw) {
            Some(s) => Cow::Borrowed(s),
            None => self.probe(raw, first_slot(raw)),
        }
    }

    /// Runs `f` with the one wrapper of `raw` ([`ForeignStreams::get`]
    /// without a `Cow` to look at on the allocation path).
    #[inline]
    pub fn with<R>(&self, raw: u64, f: impl FnOnce(&Stream) -> R) -> R {
        let probed;
        let s = match self.found(raw) {
            Some(s) => s,
            None => {
                probed = self.probe(raw, first_slot(raw));
                &*probed
            }
        };
        f(s)
    }

    /// The wrapper of `raw` when it is a default stream or in its first slot.
    #[inline]
    fn found(&self, raw: u64) -> Option<&Stream> {
        // The default streams are the three smallest handles: one test
        // sends every other handle to its slot.
        const _: () = assert!(STREAM_LEGACY == 1 && STREAM_PER_THREAD == 2);
        if raw > STREAM_PER_THREAD {
            return match self.slots[first_slot(raw)].get() {
                Some((r, s)) if *r == raw => Some(s),
                _ => None,
            };
        }
        Some(match raw {
            STREAM_PER_THREAD => &self.per_thread,
            _ => &self.legacy,
        })
    }

    /// [`ForeignStreams::get`] past the handle's first slot: its probe
    /// sequence, wrapping the handle where it finds room.
    #[cold]
    #[inline(never)]
    fn probe(&self, raw: u64, start: usize) -> Cow<'_, Stream> {
        for i in 0..SLOTS {
            let slot = &self.slots[(start + i) % SLOTS];
            let (r, s) = slot.get_or_init(|| (raw, Stream::from_raw(self.device.clone(), raw)));
            if *r == raw {
                return Cow::Borrowed(s);
            }
        }
        Cow::Owned(self.overflowed(raw))
    }

    /// The wrapper of a handle the table has no room for.
    #[cold]
    fn overflowed(&self, raw: u64) -> Stream {
        let found = self
            .overflow
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&raw)
            .cloned();
        found.unwrap_or_else(|| {
            self.overflow
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .entry(raw)
                .or_insert_with(|| Stream::from_raw(self.device.clone(), raw))
                .clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem::driver::sim::SimConfig;

    #[test]
    fn one_wrapper_per_handle_past_the_table_too() {
        let device = Device::sim(SimConfig::default());
        let streams = ForeignStreams::new(&device);
        let handles: Vec<u64> = (1..=SLOTS as u64 + 40)
            .map(|i| 0x7f00_0000 + 64 * i)
            .collect();
        let ids: Vec<_> = handles.iter().map(|&h| streams.get(h).id()).collect();
        for (&h, &id) in handles.iter().zip(&ids) {
            let s = streams.get(h);
            assert_eq!((s.raw(), s.id()), (h, id));
        }
        let distinct: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(distinct.len(), handles.len());
        assert!(matches!(streams.get(handles[0]), Cow::Borrowed(_)));
        assert!(matches!(
            streams.get(*handles.last().unwrap()),
            Cow::Owned(_)
        ));
        assert_eq!(streams.get(0).raw(), device.default_stream().raw());
        assert_eq!(streams.get(STREAM_LEGACY).id(), streams.get(0).id());
        assert_eq!(streams.get(STREAM_PER_THREAD).raw(), STREAM_PER_THREAD);
    }

    #[test]
    fn threads_racing_for_handles_agree_on_their_wrappers() {
        let device = Device::sim(SimConfig::default());
        let streams = std::sync::Arc::new(ForeignStreams::new(&device));
        let ids: Vec<Vec<_>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..4)
                .map(|_| {
                    let streams = streams.clone();
                    scope.spawn(move || {
                        (1..=64u64)
                            .map(|h| streams.get(h * 8).id())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).collect()
        });
        assert!(ids.iter().all(|v| *v == ids[0]));
    }
}
