//! One [`Stream`] per foreign stream handle of a device, found on every
//! allocation and free without a lock, a reference count or a thread-local.
//!
//! The C ABI receives raw handles (`cudaStream_t`); a pool must see the same
//! stream for every call with the same handle, so each handle is wrapped
//! once and kept. The wrappers live in a table of slots, each set once and
//! never changed, looked up by open addressing from the handle's hash: a
//! handle's probe sequence is fixed, and every slot before its own holds
//! another handle for good, so a lookup is a few loads and compares and
//! hands out a reference (no `Arc` count touched). A handle that finds the
//! table full (more distinct streams than [`SLOTS`] on one device) goes to
//! the next table of a chain, made when first needed, where the same holds.
//!
//! The legacy default stream (0 or `cudaStreamLegacy`) and the per-thread
//! default stream have wrappers of their own.

use std::sync::OnceLock;

use gpumem::driver::{STREAM_LEGACY, STREAM_PER_THREAD};
use gpumem::{Device, Stream};

/// Slots of a table: more distinct streams than PyTorch's and CuPy's
/// stream pools make on one device, so the first table is the only one.
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

/// Slots of handles and their wrappers, and the table after this one.
struct Table {
    /// Each slot: a handle and its wrapper.
    slots: [OnceLock<(u64, Stream)>; SLOTS],
    /// Where handles go once every slot here holds another one.
    next: OnceLock<Box<Table>>,
}

impl Table {
    fn new() -> Self {
        Self {
            slots: std::array::from_fn(|_| OnceLock::new()),
            next: OnceLock::new(),
        }
    }

    /// The wrapper of `raw` in this table, wrapping it in the first free
    /// slot of its probe sequence; `None` when every slot holds another
    /// handle.
    fn find_or_wrap(&self, raw: u64, device: &Device) -> Option<&Stream> {
        let start = first_slot(raw);
        (0..SLOTS).find_map(|i| {
            let slot = &self.slots[(start + i) % SLOTS];
            // SAFETY: the C ABI's contract: a stream handed to gpumem is a
            // stream of the device that outlives the memory freed on it
            // (PyTorch and CuPy never destroy their pooled streams).
            let (r, s) =
                slot.get_or_init(|| (raw, unsafe { Stream::from_raw(device.clone(), raw) }));
            (*r == raw).then_some(s)
        })
    }
}

/// The wrappers of one device's stream handles.
pub struct ForeignStreams {
    device: Device,
    legacy: Stream,
    per_thread: Stream,
    first: Table,
}

impl ForeignStreams {
    /// No handle wrapped yet, on `device`.
    pub fn new(device: &Device) -> Self {
        Self {
            legacy: device.default_stream(),
            per_thread: device.per_thread_stream(),
            device: device.clone(),
            first: Table::new(),
        }
    }

    /// The one wrapper of the handle `raw` (0 is the legacy default stream).
    #[inline]
    pub fn get(&self, raw: u64) -> &Stream {
        match self.found(raw) {
            Some(s) => s,
            None => self.probe(raw),
        }
    }

    /// The wrapper of `raw` when it is a default stream or in its first slot.
    #[inline]
    fn found(&self, raw: u64) -> Option<&Stream> {
        // The default streams are the three smallest handles: one test
        // sends every other handle to its slot.
        const _: () = assert!(STREAM_LEGACY == 1 && STREAM_PER_THREAD == 2);
        if raw > STREAM_PER_THREAD {
            return match self.first.slots[first_slot(raw)].get() {
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
    /// sequence in each table of the chain in turn, wrapping the handle
    /// where it finds room.
    #[cold]
    #[inline(never)]
    fn probe(&self, raw: u64) -> &Stream {
        let mut table = &self.first;
        loop {
            if let Some(s) = table.find_or_wrap(raw, &self.device) {
                return s;
            }
            table = table.next.get_or_init(|| Box::new(Table::new()));
        }
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
        // The first table is full: the last handles went to the next one.
        assert!(streams.first.next.get().is_some());
        let first = |h: u64| {
            streams
                .first
                .slots
                .iter()
                .any(|s| s.get().is_some_and(|(r, _)| *r == h))
        };
        assert!(first(handles[0]));
        assert!(!first(*handles.last().unwrap()));
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
                        // Past the first table: the chain's growth races too.
                        (1..=2 * SLOTS as u64 + 8)
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
