//! The NCCL-ready mode's kept blocks: a freed block stays whole, with its
//! extent mapped under it, for the next request of its size on the stream
//! that freed it.
//!
//! In that mode every block is one extent of exactly its size, so a freed
//! block given back to the heap merges with its free neighbours, and the
//! next request of the same size rarely lands on the same pages: it maps a
//! new extent and the idle one is unmapped later. A training step frees and
//! asks again for the same sizes in every step, so without this each step
//! paid a create, a map and a set-access per block. A kept block is served
//! again in O(1) with no driver call, as a caching allocator serves a block
//! of the size asked for.
//!
//! The rules:
//! - a block is kept only after its free was checked as any free is (its
//!   size, a live block of the pool); it stays used in its heap with its
//!   pages counted under a live block, and is also parked
//!   (`stream_order::parked`): freed for the caller (live bytes and blocks,
//!   a second free is a double free), invisible to the code that unmaps
//!   idle pages;
//! - it is handed out again only to a request of its size on the stream
//!   that freed it, whose order makes the reuse safe;
//! - kept blocks are not bound by the slack over the live peak: the pool
//!   holds what the largest mix of sizes a step asks for needs, as a
//!   caching allocator does. They are freed into the heap (oldest first),
//!   and then follow the usual rules, when the pool is out of memory (the
//!   driver's or `max_reserved`), on a trim, and when address space runs
//!   short;
//! - blocks of a region, and blocks freed while a region is begun or
//!   asleep, are not kept (a sleep must find them free).

use std::collections::{BTreeMap, HashMap};

use crate::stream::{Stream, StreamId};

/// One kept block.
#[derive(Debug)]
struct Kept {
    bytes: usize,
    /// A pool's handle ([`Stream::pool_handle`]): a block kept for its
    /// stream does not keep the stream its users' (only they can ask for
    /// the block again), so once they drop it a trim flushes the block and
    /// the pool lets the stream go.
    stream: Stream,
    seq: u64,
}

/// Kept blocks by address, by (size, stream) and by age.
#[derive(Debug, Default)]
pub(super) struct KeptBlocks {
    blocks: HashMap<u64, Kept>,
    by_key: HashMap<(usize, StreamId), Vec<u64>>,
    by_age: BTreeMap<u64, u64>,
    next_seq: u64,
}

impl KeptBlocks {
    /// Keeps the block at `addr` (`bytes`, whole pages) freed on `stream`.
    pub(super) fn keep(&mut self, addr: u64, bytes: usize, stream: &Stream) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.by_key
            .entry((bytes, stream.id()))
            .or_default()
            .push(addr);
        self.by_age.insert(seq, addr);
        self.blocks.insert(
            addr,
            Kept {
                bytes,
                stream: stream.pool_handle(),
                seq,
            },
        );
    }

    /// A kept block of `bytes` freed on `stream` (the one kept last),
    /// taken out.
    #[inline]
    pub(super) fn take(&mut self, bytes: usize, stream: &Stream) -> Option<u64> {
        if self.blocks.is_empty() {
            return None;
        }
        let key = (bytes, stream.id());
        let list = self.by_key.get_mut(&key)?;
        let addr = list.pop()?;
        if list.is_empty() {
            self.by_key.remove(&key);
        }
        if let Some(k) = self.blocks.remove(&addr) {
            self.by_age.remove(&k.seq);
        }
        Some(addr)
    }

    /// The oldest kept block, taken out: its address, bytes and the stream
    /// that freed it.
    pub(super) fn take_oldest(&mut self) -> Option<(u64, usize, Stream)> {
        let (_, addr) = self.by_age.pop_first()?;
        let k = self.blocks.remove(&addr)?;
        let key = (k.bytes, k.stream.id());
        if let Some(list) = self.by_key.get_mut(&key) {
            list.retain(|&a| a != addr);
            if list.is_empty() {
                self.by_key.remove(&key);
            }
        }
        Some((addr, k.bytes, k.stream))
    }

    /// True when no block is kept.
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Blocks kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::sim::SimConfig;
    use crate::Device;

    #[test]
    fn blocks_come_back_by_size_and_stream_then_by_age() {
        let device = Device::sim(SimConfig::default());
        let (s, t) = (
            device.create_stream().unwrap(),
            device.create_stream().unwrap(),
        );
        let mut k = KeptBlocks::default();
        k.keep(0x1000_0000, 2 << 20, &s);
        k.keep(0x2000_0000, 2 << 20, &s);
        k.keep(0x3000_0000, 4 << 20, &t);
        assert_eq!(k.take(2 << 20, &t), None, "another stream");
        assert_eq!(k.take(6 << 20, &s), None, "another size");
        assert_eq!(
            k.take(2 << 20, &s),
            Some(0x2000_0000),
            "the last kept first"
        );
        let (addr, bytes, stream) = k.take_oldest().unwrap();
        assert_eq!((addr, bytes, stream.id()), (0x1000_0000, 2 << 20, s.id()));
        assert_eq!(k.take(2 << 20, &s), None);
        assert_eq!(k.len(), 1);
        assert_eq!(k.take(4 << 20, &t), Some(0x3000_0000));
        assert!(k.is_empty() && k.take_oldest().is_none());
    }
}
