//! [`FreeStreams`]: the streams that free blocks in a pool that records its
//! frees per piece of memory rather than per block
//! ([`VirtualPool`](crate::pool::VirtualPool), per group of pages), and what
//! is known of their completion.
//!
//! Each stream gets a small slot (a [`StreamSlots`] index) and its bit,
//! `1 << (slot % 64)`; every free gets the next tick of one monotone clock
//! shared by all streams. Memory records its frees as a [`Frees`]: the union
//! of the bits of the streams that freed there and the latest tick. "Are
//! these frees done?" ([`FreeStreams::complete`]) asks each stream of the
//! mask whether its frees up to the tick have run: its [`Watermark`] on the
//! tick clock, else a sealed event, else one stream query per reclaim pass
//! (recording an event on a busy stream, so a later pass learns of its
//! progress); never a wait.

use super::events::{Batches, EventPool};
use super::slots::StreamSlots;
use super::streams::{synchronize_each, Progress, Watermark};
use crate::device::Device;
use crate::stream::Stream;

/// Spare events kept for busy streams.
const SPARE_EVENTS: usize = 8;

/// Frees recorded on some memory: the stream slots (mod 64) that freed
/// blocks there and the tick of the latest such free (no reset: a mask only
/// grows, so the record is conservative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Frees {
    pub(crate) mask: u64,
    pub(crate) tick: u64,
}

impl Frees {
    /// Adds a free by stream slot bit `bit` at `tick` (ticks only grow).
    #[inline]
    pub(crate) fn add(&mut self, bit: u64, tick: u64) {
        self.mask |= bit;
        self.tick = tick;
    }

    /// The union of two records.
    #[inline]
    pub(crate) fn union(self, o: Frees) -> Frees {
        Frees {
            mask: self.mask | o.mask,
            tick: self.tick.max(o.tick),
        }
    }

    /// True when nothing is recorded, or `done(mask, tick)` says the
    /// recorded frees have run.
    #[inline]
    pub(crate) fn quiet(&self, done: impl FnOnce(u64, u64) -> bool) -> bool {
        self.mask == 0 || done(self.mask, self.tick)
    }
}

/// What a pool knows of one stream's frees, on the table's tick clock.
struct StreamFrees {
    /// The tick of its latest free, and the tick up to which all its frees
    /// have run.
    frees: Watermark,
    /// At most one event recorded on the stream, with the tick it covers.
    pending: Batches,
    /// The reclaim pass that last asked the driver about this stream.
    asked_in: u64,
}

/// The streams that free blocks, and what is known of their completion in
/// terms of free ticks.
pub(crate) struct FreeStreams {
    slots: StreamSlots<StreamFrees>,
    events: EventPool,
    /// The tick of the latest free.
    tick: u64,
    /// Every slot bit that ever freed a block.
    ever: u64,
    pass: u64,
    /// Every free with a tick at or below this has run (all streams).
    floor: u64,
    /// Set when a stream was found further along (the floor is then
    /// recomputed from every stream's state).
    refloor: bool,
}

impl Default for FreeStreams {
    fn default() -> Self {
        Self {
            slots: StreamSlots::default(),
            events: EventPool::new(SPARE_EVENTS),
            tick: 0,
            ever: 0,
            pass: 0,
            floor: 0,
            refloor: false,
        }
    }
}

impl FreeStreams {
    /// Streams known.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Registers a free on `stream`: returns its slot bit and the free's tick.
    #[inline]
    pub(crate) fn on_free(&mut self, stream: &Stream) -> (u64, u64) {
        let slot = match self.slots.find(stream) {
            Some(s) => s,
            None => self.add(stream),
        };
        self.tick += 1;
        if let Some(s) = self.slots.get_mut(slot) {
            s.data.frees.note(self.tick);
        }
        let bit = 1u64 << (slot % 64);
        self.ever |= bit;
        (bit, self.tick)
    }

    /// Gives `stream` a slot, the lowest free one; first the streams their
    /// users dropped whose frees are done give theirs back (each not known
    /// done is asked once, [`FreeStreams::prune_asking`]), so a program that
    /// makes and drops streams keeps as many slots (and streams) as it
    /// uses, and stream bits stay unshared where it uses 64 or fewer.
    #[cold]
    fn add(&mut self, stream: &Stream) -> u32 {
        self.prune_asking();
        let entry = StreamFrees {
            // Nothing was freed on it before: complete up to now.
            frees: Watermark::complete_upto(self.tick),
            pending: Batches::default(),
            asked_in: 0,
        };
        self.slots.insert(stream, entry)
    }

    /// The *taker bit* of `stream`, about to use memory: its slot bit when
    /// it is the only stream on that bit (its own frees need no check before
    /// it re-uses their memory), else 0.
    #[inline]
    pub(crate) fn taker_bit(&self, stream: &Stream) -> u64 {
        match self.slots.peek(stream) {
            Some(s) if self.slots.capacity() <= 64 => 1u64 << s,
            _ => 0,
        }
    }

    /// True when a stream slot other than `taker` (see
    /// [`FreeStreams::taker_bit`]) ever freed a block: when none did, all
    /// frees are the taking stream's own, ordered before its new work.
    #[inline]
    pub(crate) fn others_freed(&self, taker: u64) -> bool {
        self.ever & !taker != 0
    }

    /// True when frees `(mask, tick)` on memory about to be used by the
    /// stream of bit `taker` (see [`FreeStreams::taker_bit`]) are safe to
    /// follow: the stream's own frees are ordered before its new work, the
    /// others must be known done (a query at most, never a wait).
    pub(crate) fn safe_for(&mut self, taker: u64, mask: u64, tick: u64) -> bool {
        if mask & !taker == 0 || tick <= self.floor {
            return true;
        }
        self.begin_pass();
        self.safe_in_pass(taker, mask, tick)
    }

    /// [`FreeStreams::safe_for`] within a pass the caller began
    /// ([`FreeStreams::begin_pass`]): a search that checks many places asks
    /// each stream at most once.
    pub(crate) fn safe_in_pass(&mut self, taker: u64, mask: u64, tick: u64) -> bool {
        let others = mask & !taker;
        others == 0 || self.complete(others, tick)
    }

    /// Starts a reclaim pass: each stream is asked about at most once per pass.
    pub(crate) fn begin_pass(&mut self) {
        self.pass += 1;
        self.floor = self.min_idle_tick();
        self.refloor = false;
    }

    fn min_idle_tick(&self) -> u64 {
        // A stream known idle since its latest free is done up to now.
        self.slots
            .iter()
            .map(|(_, s)| {
                if s.data.frees.all_complete() {
                    self.tick
                } else {
                    s.data.frees.completed()
                }
            })
            .min()
            .unwrap_or(self.tick)
    }

    /// True when every free recorded under `mask` up to `tick` is known to
    /// have run. May query streams (once per pass each) and record an event
    /// on a busy stream so a later pass learns of its progress; never blocks.
    #[inline]
    pub(crate) fn complete(&mut self, mask: u64, tick: u64) -> bool {
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
            while slot < self.slots.capacity() {
                if !self.slot_complete(slot as u32, tick) {
                    return false;
                }
                slot += 64;
            }
        }
        true
    }

    fn slot_complete(&mut self, slot: u32, tick: u64) -> bool {
        let (now, pass) = (self.tick, self.pass);
        let Some(s) = self.slots.get_mut(slot) else {
            return true;
        };
        let f = &mut s.data;
        if f.frees.is_complete(tick.min(f.frees.latest())) {
            return true;
        }
        if f.asked_in == pass {
            return false;
        }
        f.asked_in = pass;
        let mut sealed_done = None;
        // A failed query leaves the event pending: a later pass asks again.
        let _ = f.pending.poll(&self.events, |t| sealed_done = Some(t));
        if let Some(t) = sealed_done {
            f.frees.set_complete_upto(t);
            if f.frees.is_complete(tick) {
                return true;
            }
        }
        match s.held.query() {
            Progress::Idle => {
                f.frees.set_complete_upto(now);
                f.pending.forget(&self.events);
                self.refloor = true;
                true
            }
            Progress::Busy => {
                if f.pending.is_empty() {
                    // Best effort: without it, a later pass queries again.
                    let _ = f.pending.seal(s.held.stream(), now, &self.events);
                }
                false
            }
            // Another thread's per-thread stream, or a foreign stream that
            // cannot be queried: the blocking paths synchronize the device.
            Progress::NotHere | Progress::Unknown => false,
        }
    }

    /// Blocks until every free so far has run (each stream synchronized, the
    /// device when one cannot be).
    pub(crate) fn synchronize_all(&mut self, device: &Device) -> crate::Result<()> {
        let now = self.tick;
        let busy = self
            .slots
            .iter()
            .filter(|(_, s)| !s.data.frees.is_complete(now))
            .map(|(_, s)| &s.held);
        synchronize_each(busy, device)?;
        for (_, s) in self.slots.iter_mut() {
            s.data.frees.set_complete_upto(now);
            s.data.pending.forget(&self.events);
        }
        Ok(())
    }

    /// Forgets streams only the pool still references once all their frees
    /// are known to have run, so user-dropped streams are destroyed. (A slot
    /// reused by a new stream starts complete up to the current tick, which
    /// stays true of the old stream.)
    pub(crate) fn prune(&mut self) {
        let now = self.tick;
        self.slots.prune(|_, s| s.data.frees.is_complete(now));
    }

    /// [`FreeStreams::prune`], after asking each stream its users dropped
    /// whose frees are not known done whether it is idle: one query each,
    /// never a wait (what a trim does).
    pub(crate) fn prune_asking(&mut self) {
        let now = self.tick;
        for (_, s) in self.slots.iter_mut() {
            let f = &mut s.data;
            if s.held.is_dropped() && !f.frees.is_complete(now) && s.held.query() == Progress::Idle
            {
                f.frees.set_complete_upto(now);
                f.pending.forget(&self.events);
            }
        }
        self.prune();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sim::SimConfig;
    use crate::stream::Event;
    use crate::Device;

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
        let mut streams = FreeStreams::default();
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
        let mut streams = FreeStreams::default();
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
        let mut streams = FreeStreams::default();
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
