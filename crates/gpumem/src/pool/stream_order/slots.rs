//! [`StreamSlots`]: a pool's table of kept streams, each at a small index
//! (a lane number, a stream bit), found by stream id in O(1) and cheapest
//! for the stream seen last.

use super::streams::HeldStream;
use crate::pool::ptr_map::PtrMap;
use crate::stream::Stream;

/// One kept stream and what its pool keeps with it.
pub(crate) struct Slot<T> {
    pub(crate) held: HeldStream,
    pub(crate) data: T,
}

/// Kept streams by index, with an id → index map.
pub(crate) struct StreamSlots<T> {
    slots: Vec<Option<Slot<T>>>,
    by_id: PtrMap<u32>,
    /// The last stream looked up and its index (stream ids are never reused).
    last: Option<(u64, u32)>,
}

impl<T> Default for StreamSlots<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            by_id: PtrMap::default(),
            last: None,
        }
    }
}

impl<T> StreamSlots<T> {
    /// Streams kept.
    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// One past the highest index in use.
    #[inline]
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The index of `stream`, remembering it as the last one seen.
    #[inline]
    pub(crate) fn find(&mut self, stream: &Stream) -> Option<u32> {
        let id = stream.id().0;
        match self.last {
            Some((last, i)) if last == id => Some(i),
            _ => self.find_slow(id),
        }
    }

    #[cold]
    fn find_slow(&mut self, id: u64) -> Option<u32> {
        let i = *self.by_id.get(&id)?;
        self.last = Some((id, i));
        Some(i)
    }

    /// The index of `stream`, without remembering it.
    #[inline]
    pub(crate) fn peek(&self, stream: &Stream) -> Option<u32> {
        let id = stream.id().0;
        match self.last {
            Some((last, i)) if last == id => Some(i),
            _ => self.by_id.get(&id).copied(),
        }
    }

    /// Keeps `stream` at the lowest free index.
    pub(crate) fn insert(&mut self, stream: &Stream, data: T) -> u32 {
        let i = self
            .slots
            .iter()
            .position(Option::is_none)
            .unwrap_or(self.slots.len());
        self.insert_at(i as u32, stream, data);
        i as u32
    }

    /// Keeps `stream` at index `i` (free).
    pub(crate) fn insert_at(&mut self, i: u32, stream: &Stream, data: T) {
        let idx = i as usize;
        if self.slots.len() <= idx {
            self.slots.resize_with(idx + 1, || None);
        }
        debug_assert!(self.slots[idx].is_none(), "slot {i} in use");
        let held = HeldStream::new(stream);
        self.by_id.insert(held.id().0, i);
        self.last = Some((held.id().0, i));
        self.slots[idx] = Some(Slot { held, data });
    }

    #[inline]
    pub(crate) fn get(&self, i: u32) -> Option<&Slot<T>> {
        self.slots.get(i as usize)?.as_ref()
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, i: u32) -> Option<&mut Slot<T>> {
        self.slots.get_mut(i as usize)?.as_mut()
    }

    /// Every kept stream with its index.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &Slot<T>)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i as u32, s.as_ref()?)))
    }

    /// Every kept stream with its index, mutably.
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut Slot<T>)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| Some((i as u32, s.as_mut()?)))
    }

    /// Forgets the stream at `i` (dropping the pool's clone of it). The
    /// capacity shrinks to one past the highest index left in use, so
    /// indices above 63 (which share stream bits) go once unused.
    pub(crate) fn remove(&mut self, i: u32) -> Option<Slot<T>> {
        let slot = self.slots.get_mut(i as usize)?.take()?;
        self.by_id.remove(&slot.held.id().0);
        if self.last.is_some_and(|(_, l)| l == i) {
            self.last = None;
        }
        while self.slots.last().is_some_and(Option::is_none) {
            self.slots.pop();
        }
        Some(slot)
    }

    /// Forgets every stream its user dropped for which `done(index, slot)`
    /// holds.
    pub(crate) fn prune(&mut self, mut done: impl FnMut(u32, &Slot<T>) -> bool) {
        for i in 0..self.slots.len() as u32 {
            if self
                .get(i)
                .is_some_and(|s| s.held.is_dropped() && done(i, s))
            {
                self.remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sim::SimConfig;
    use crate::Device;

    #[test]
    fn streams_get_the_lowest_free_index_and_dropped_ones_are_pruned() {
        let device = Device::sim(SimConfig::default());
        let (s, t) = (
            device.create_stream().unwrap(),
            device.create_stream().unwrap(),
        );
        let mut slots = StreamSlots::default();
        assert_eq!(slots.insert(&s, 'a'), 0);
        assert_eq!(slots.insert(&t, 'b'), 1);
        assert_eq!((slots.find(&s), slots.peek(&t)), (Some(0), Some(1)));
        slots.prune(|_, _| true);
        assert_eq!(slots.len(), 2, "both streams are still the user's");
        drop(s);
        slots.prune(|_, x| x.data != 'a');
        assert_eq!(slots.len(), 2, "kept while its owner says so");
        slots.prune(|_, _| true);
        assert_eq!(slots.len(), 1);
        let u = device.create_stream().unwrap();
        assert_eq!(slots.find(&u), None);
        assert_eq!(slots.insert(&u, 'c'), 0, "the freed index is reused");
        slots.insert_at(5, &device.create_stream().unwrap(), 'd');
        assert_eq!(slots.capacity(), 6);
        assert_eq!(
            slots.iter().map(|(i, x)| (i, x.data)).collect::<Vec<_>>(),
            [(0, 'c'), (1, 'b'), (5, 'd')]
        );
    }
}
