//! The streams that free blocks in a [`VirtualPool`](super::VirtualPool),
//! and what is known of their completion in terms of free ticks.

use std::thread::ThreadId;

use crate::device::Device;
use crate::driver::STREAM_PER_THREAD;
use crate::pool::ptr_map::PtrMap;
use crate::stream::{Event, Stream};

/// Frees recorded on some memory: the stream slots (mod 64) that freed
/// blocks there and the tick of the latest such free (no reset: a mask only
/// grows, so the record is conservative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Frees {
    pub(super) mask: u64,
    pub(super) tick: u64,
}

impl Frees {
    /// Adds a free by stream slot bit `bit` at `tick` (ticks only grow).
    #[inline]
    pub(super) fn add(&mut self, bit: u64, tick: u64) {
        self.mask |= bit;
        self.tick = tick;
    }

    /// The union of two records.
    #[inline]
    pub(super) fn union(self, o: Frees) -> Frees {
        Frees {
            mask: self.mask | o.mask,
            tick: self.tick.max(o.tick),
        }
    }

    /// True when nothing is recorded, or `done(mask, tick)` says the
    /// recorded frees have run.
    #[inline]
    pub(super) fn quiet(&self, done: impl FnOnce(u64, u64) -> bool) -> bool {
        self.mask == 0 || done(self.mask, self.tick)
    }
}

struct FreeStream {
    stream: Stream,
    /// For the per-thread default stream: only its own thread may query it.
    thread: Option<ThreadId>,
    /// Every free on this stream with a tick at or below this has run.
    idle_tick: u64,
    /// Tick of this stream's latest free (all its frees have run once
    /// `idle_tick` reaches it).
    last_free: u64,
    /// An event recorded on the stream and the tick it covers.
    pending: Option<(Event, u64)>,
    /// The reclaim pass that last asked the driver about this stream.
    asked_in: u64,
}

/// The streams that free blocks, and what is known of their completion in
/// terms of free ticks.
pub(super) struct FreeStreams {
    slots: Vec<Option<FreeStream>>,
    by_id: PtrMap<u32>,
    /// The last stream looked up and its slot (stream ids are never reused).
    last: Option<(u64, u32)>,
    /// The tick of the latest free.
    pub(super) tick: u64,
    /// Every slot bit that ever freed a block.
    ever: u64,
    pass: u64,
    /// Every free with a tick at or below this has run (all streams).
    floor: u64,
    /// Set when a stream was found further along (the floor is then
    /// recomputed from every stream's state).
    refloor: bool,
}

impl FreeStreams {
    pub(super) fn new() -> Self {
        Self {
            slots: Vec::new(),
            by_id: PtrMap::default(),
            last: None,
            tick: 0,
            ever: 0,
            pass: 0,
            floor: 0,
            refloor: false,
        }
    }

    /// Streams known.
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Registers a free on `stream`: returns its slot bit and the free's tick.
    #[inline]
    pub(super) fn on_free(&mut self, stream: &Stream) -> (u64, u64) {
        let id = stream.id().0;
        let slot = match self.last {
            Some((last, s)) if last == id => s,
            _ => {
                let s = match self.by_id.get(&id) {
                    Some(&s) => s,
                    None => self.add(stream),
                };
                self.last = Some((id, s));
                s
            }
        };
        self.tick += 1;
        if let Some(s) = self.slots[slot as usize].as_mut() {
            s.last_free = self.tick;
        }
        let bit = 1u64 << (slot % 64);
        self.ever |= bit;
        (bit, self.tick)
    }

    #[cold]
    fn add(&mut self, stream: &Stream) -> u32 {
        let entry = FreeStream {
            stream: stream.clone(),
            thread: (stream.raw() == STREAM_PER_THREAD).then(|| std::thread::current().id()),
            // Nothing was freed on it before: complete up to now.
            idle_tick: self.tick,
            last_free: 0,
            pending: None,
            asked_in: 0,
        };
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(i) => {
                self.slots[i] = Some(entry);
                i
            }
            None => {
                self.slots.push(Some(entry));
                self.slots.len() - 1
            }
        };
        self.by_id.insert(stream.id().0, slot as u32);
        slot as u32
    }

    /// The *taker bit* of `stream`, about to use memory: its slot bit when
    /// it is the only stream on that bit (its own frees need no check before
    /// it re-uses their memory), else 0.
    #[inline]
    pub(super) fn taker_bit(&self, stream: &Stream) -> u64 {
        let id = stream.id().0;
        let slot = match self.last {
            Some((last, s)) if last == id => Some(s),
            _ => self.by_id.get(&id).copied(),
        };
        match slot {
            Some(s) if self.slots.len() <= 64 => 1u64 << s,
            _ => 0,
        }
    }

    /// True when a stream slot other than `taker` (see
    /// [`FreeStreams::taker_bit`]) ever freed a block: when none did, all
    /// frees are the taking stream's own, ordered before its new work.
    #[inline]
    pub(super) fn others_freed(&self, taker: u64) -> bool {
        self.ever & !taker != 0
    }

    /// True when frees `(mask, tick)` on memory about to be used by the
    /// stream of bit `taker` (see [`FreeStreams::taker_bit`]) are safe to
    /// follow: the stream's own frees are ordered before its new work, the
    /// others must be known done (a query at most, never a wait).
    pub(super) fn safe_for(&mut self, taker: u64, mask: u64, tick: u64) -> bool {
        let others = mask & !taker;
        if others == 0 || tick <= self.floor {
            return true;
        }
        self.begin_pass();
        self.complete(others, tick)
    }

    /// Starts a reclaim pass: each stream is asked about at most once per pass.
    pub(super) fn begin_pass(&mut self) {
        self.pass += 1;
        self.floor = self.min_idle_tick();
        self.refloor = false;
    }

    fn min_idle_tick(&self) -> u64 {
        // A stream known idle since its latest free is done up to now.
        self.slots
            .iter()
            .flatten()
            .map(|s| {
                if s.idle_tick >= s.last_free {
                    self.tick
                } else {
                    s.idle_tick
                }
            })
            .min()
            .unwrap_or(self.tick)
    }

    /// True when every free recorded under `mask` up to `tick` is known to
    /// have run. May query streams (once per pass each) and record an event
    /// on a busy stream so a later pass learns of its progress; never blocks.
    #[inline]
    pub(super) fn complete(&mut self, mask: u64, tick: u64) -> bool {
        if tick <= self.floor {
            return true;
        }
        let done = self.complete_slow(mask, tick);
        if self.refloor {
            self.refloor = false;
            self.floor = self.min_idle_tick();
        }
        done
    }

    fn complete_slow(&mut self, mask: u64, tick: u64) -> bool {
        let mut bits = mask;
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let mut slot = b;
            while slot < self.slots.len() {
                if !self.slot_complete(slot, tick) {
                    return false;
                }
                slot += 64;
            }
        }
        true
    }

    fn slot_complete(&mut self, slot: usize, tick: u64) -> bool {
        let (now, pass) = (self.tick, self.pass);
        let Some(s) = self.slots[slot].as_mut() else {
            return true;
        };
        if s.idle_tick >= tick.min(s.last_free) {
            return true;
        }
        if s.asked_in == pass {
            return false;
        }
        s.asked_in = pass;
        if let Some((ev, t)) = &s.pending {
            if ev.is_complete().unwrap_or(false) {
                s.idle_tick = s.idle_tick.max(*t);
                s.pending = None;
                if s.idle_tick >= tick {
                    return true;
                }
            }
        }
        if s.thread.is_some_and(|t| t != std::thread::current().id()) {
            return false;
        }
        match s.stream.is_idle() {
            Ok(true) => {
                s.idle_tick = now;
                s.pending = None;
                self.refloor = true;
                true
            }
            Ok(false) => {
                if s.pending.is_none() {
                    if let Ok(ev) = Event::new(s.stream.device()) {
                        if ev.record(&s.stream).is_ok() {
                            s.pending = Some((ev, now));
                        }
                    }
                }
                false
            }
            // A foreign stream that cannot be queried: the blocking paths
            // synchronize the device for it.
            Err(_) => false,
        }
    }

    /// Blocks until every free so far has run (each stream synchronized, the
    /// device when one cannot be).
    pub(super) fn synchronize_all(&mut self, device: &Device) -> crate::Result<()> {
        let now = self.tick;
        let mut device_sync = false;
        for s in self.slots.iter_mut().flatten() {
            if s.idle_tick >= now {
                continue;
            }
            let here = s.thread.is_none_or(|t| t == std::thread::current().id());
            if !here || s.stream.synchronize().is_err() {
                device_sync = true;
            }
        }
        if device_sync {
            device.synchronize()?;
        }
        for s in self.slots.iter_mut().flatten() {
            s.idle_tick = now;
            s.pending = None;
        }
        Ok(())
    }

    /// Forgets streams only the pool still references once all their frees
    /// are known to have run, so user-dropped streams are destroyed. (A slot
    /// reused by a new stream starts complete up to the current tick, which
    /// stays true of the old stream.)
    pub(super) fn prune(&mut self) {
        let now = self.tick;
        for slot in self.slots.iter_mut() {
            if slot
                .as_ref()
                .is_some_and(|s| s.idle_tick >= now && s.stream.is_sole_handle())
            {
                if let Some(s) = slot.take() {
                    self.by_id.remove(&s.stream.id().0);
                    self.last = None;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sim::SimConfig;

    /// An event recorded on `stream`: work that stays pending while the
    /// simulator holds the stream.
    fn enqueue_work(stream: &Stream) {
        Event::new(stream.device()).unwrap().record(stream).unwrap();
    }

    #[test]
    fn a_frees_record_only_grows() {
        let mut f = Frees::default();
        assert!(f.quiet(|_, _| false), "nothing recorded is quiet");
        f.add(0b1, 3);
        f.add(0b100, 4);
        assert_eq!(
            f,
            Frees {
                mask: 0b101,
                tick: 4
            }
        );
        let g = f.union(Frees {
            mask: 0b10,
            tick: 2,
        });
        assert_eq!(
            g,
            Frees {
                mask: 0b111,
                tick: 4
            }
        );
        assert!(g.quiet(|m, t| m == 0b111 && t == 4));
        assert!(!g.quiet(|_, _| false));
    }

    #[test]
    fn frees_get_slot_bits_and_rising_ticks() {
        let device = Device::sim(SimConfig::default());
        let (s, t) = (
            device.create_stream().unwrap(),
            device.create_stream().unwrap(),
        );
        let mut streams = FreeStreams::new();
        assert_eq!(
            streams.taker_bit(&s),
            0,
            "a stream that never freed has no bit"
        );
        assert_eq!(streams.on_free(&s), (0b1, 1));
        assert_eq!(streams.on_free(&t), (0b10, 2));
        assert_eq!(streams.on_free(&s), (0b1, 3));
        assert_eq!(streams.len(), 2);
        assert_eq!((streams.taker_bit(&s), streams.taker_bit(&t)), (0b1, 0b10));
        assert!(streams.others_freed(0b1));
        assert!(!streams.others_freed(0b11));
    }

    #[test]
    fn other_streams_frees_are_safe_once_their_work_is_done() {
        let (device, sim) = Device::sim_with_driver(SimConfig::default());
        let (s, t) = (
            device.create_stream().unwrap(),
            device.create_stream().unwrap(),
        );
        let mut streams = FreeStreams::new();
        let (own, _) = streams.on_free(&s);
        sim.hold(t.raw());
        enqueue_work(&t);
        let (bit, tick) = streams.on_free(&t);
        assert!(streams.safe_for(own, own, tick), "the taker's own frees");
        assert!(!streams.safe_for(own, bit, tick), "t's work is pending");
        assert!(!streams.complete(bit, tick), "nor known done by a query");
        sim.release(t.raw());
        assert!(
            !streams.complete(bit, tick),
            "t was asked once in this pass"
        );
        streams.begin_pass();
        assert!(streams.complete(bit, tick), "a new pass asks again");
        assert!(streams.safe_for(own, bit | own, tick));
    }

    #[test]
    fn synchronize_all_completes_every_free_and_prune_forgets_dropped_streams() {
        let (device, sim) = Device::sim_with_driver(SimConfig::default());
        let s = device.create_stream().unwrap();
        let mut streams = FreeStreams::new();
        sim.hold(s.raw());
        enqueue_work(&s);
        let (bit, tick) = streams.on_free(&s);
        streams.prune();
        assert_eq!(streams.len(), 1, "a stream with frees not known done stays");
        streams.synchronize_all(&device).unwrap();
        assert!(streams.complete(bit, tick));
        drop(s);
        streams.prune();
        assert_eq!(streams.len(), 0, "only the tracker held it");
    }
}
