//! Property tests: random operation sequences against a simple model.
//!
//! The model keeps live ranges and, per region and lane, the free bytes, which
//! is enough to predict every lane's free bytes and whether a region can be
//! removed. After every step the heap's own invariant check runs too.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::size_class::search_class;
use super::*;

const LANES: usize = 4; // global + 3 stream lanes

#[derive(Debug, Clone)]
enum Op {
    AddRegion {
        slot: u64,
        offset: u64,
        size: u64,
    },
    Allocate {
        lane: usize,
        size: u64,
        align_log: u32,
        /// Allocate with the last block of this region (picked among the
        /// model's) spared: `allocate_best_sparing_end`.
        spare: Option<usize>,
    },
    Free {
        pick: usize,
        lane: usize,
    },
    BadFree {
        pick: usize,
        delta: u64,
    },
    MoveLane {
        from: usize,
        to: usize,
    },
    AbsorbGlobal {
        lane: usize,
    },
    MoveBlock {
        pick: usize,
        to: usize,
    },
    RemoveRegion {
        pick: usize,
    },
    Recycle {
        lane: usize,
    },
    ExtendRegion {
        pick: usize,
        extra: u64,
    },
    ShrinkRegion {
        pick: usize,
        cut_granules: u64,
    },
    SplitRegion {
        pick: usize,
        at_granules: u64,
    },
}

fn log_uniform(lo_log: u32, hi_log: u32) -> impl Strategy<Value = u64> {
    (lo_log..hi_log, any::<u64>()).prop_map(|(l, r)| (1u64 << l) + r % (1u64 << l))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0u64..6, 0u64..4096, log_uniform(12, 25))
            .prop_map(|(slot, offset, size)| Op::AddRegion { slot, offset, size }),
        12 => (
            0..LANES,
            log_uniform(0, 22),
            prop_oneof![3 => Just(0u32), 1 => 0u32..17],
            prop_oneof![2 => Just(None), 1 => any::<usize>().prop_map(Some)],
        )
            .prop_map(|(lane, size, align_log, spare)| Op::Allocate {
                lane,
                size,
                align_log,
                spare
            }),
        10 => (any::<usize>(), 0..LANES).prop_map(|(pick, lane)| Op::Free { pick, lane }),
        1 => (any::<usize>(), 0u64..3).prop_map(|(pick, delta)| Op::BadFree { pick, delta }),
        2 => (0..LANES, 0..LANES).prop_map(|(from, to)| Op::MoveLane { from, to }),
        2 => (0..LANES).prop_map(|lane| Op::AbsorbGlobal { lane }),
        1 => (any::<usize>(), 0..LANES).prop_map(|(pick, to)| Op::MoveBlock { pick, to }),
        1 => any::<usize>().prop_map(|pick| Op::RemoveRegion { pick }),
        1 => (1..LANES).prop_map(|lane| Op::Recycle { lane }),
        2 => (any::<usize>(), log_uniform(8, 24))
            .prop_map(|(pick, extra)| Op::ExtendRegion { pick, extra }),
        2 => (any::<usize>(), log_uniform(0, 16))
            .prop_map(|(pick, cut_granules)| Op::ShrinkRegion { pick, cut_granules }),
        2 => (any::<usize>(), any::<u64>())
            .prop_map(|(pick, at_granules)| Op::SplitRegion { pick, at_granules }),
    ]
}

#[derive(Default)]
struct Model {
    /// addr -> (size, region base)
    live: BTreeMap<u64, (u64, u64)>,
    /// base -> (id, size, free bytes per lane)
    regions: BTreeMap<u64, (RegionId, u64, [u64; LANES])>,
    /// Addresses of freed blocks whose start may still be a block start.
    freed: Vec<u64>,
}

impl Model {
    fn region_base(&self, addr: u64) -> Option<u64> {
        let (&b, &(_, s, _)) = self.regions.range(..=addr).next_back()?;
        (addr < b + s).then_some(b)
    }
    fn lane_free(&self, l: usize) -> u64 {
        self.regions.values().map(|r| r.2[l]).sum()
    }
}

struct Harness {
    h: LaneHeap,
    m: Model,
    lanes: [LaneId; LANES],
}

impl Harness {
    fn new(min_split: u64) -> Self {
        let mut h = LaneHeap::with_min_split(min_split);
        let mut lanes = [LaneId::GLOBAL; LANES];
        for l in lanes.iter_mut().skip(1) {
            *l = h.create_lane().unwrap();
        }
        Self {
            h,
            m: Model::default(),
            lanes,
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let (h, m) = (&mut self.h, &mut self.m);
        match *op {
            Op::AddRegion { slot, offset, size } => {
                let base = (slot << 24) + offset * 256;
                let size = size & !255;
                let overlaps = m
                    .regions
                    .iter()
                    .any(|(&b, r)| b < base + size && base < b + r.1);
                match h.add_region(base, size) {
                    Ok(id) => {
                        prop_assert!(!overlaps);
                        let mut free = [0; LANES];
                        free[0] = size;
                        m.regions.insert(base, (id, size, free));
                    }
                    Err(e) => {
                        prop_assert!(overlaps, "{e}");
                        let is_overlap = matches!(e, HeapError::RegionOverlap { .. });
                        prop_assert!(is_overlap, "{}", e);
                    }
                }
            }
            Op::Allocate {
                lane,
                size,
                align_log,
                spare,
            } => {
                let align = 1u64 << align_log;
                let l = self.lanes[lane];
                let spared = spare
                    .filter(|_| !m.regions.is_empty())
                    .map(|pick| m.regions.values().nth(pick % m.regions.len()).unwrap().0);
                // The spared block: the region's last one, when free in the lane.
                let spared_range = spared
                    .and_then(|id| h.region_tail(id))
                    .filter(|(_, b)| b.is_free_in(l.0))
                    .map(|(_, b)| b.addr()..b.addr() + b.size());
                let got = match spared {
                    Some(id) => h.allocate_best_sparing_end(l, size, align, id),
                    None => h.allocate(l, size, align),
                };
                match got {
                    Some(a) => {
                        if let Some(r) = spared_range.filter(|r| r.contains(&a.addr)) {
                            // Out of the spared block: no other block of the
                            // lane fits whole.
                            let needed = size.div_ceil(256).max(1) * 256 + align.max(256) - 256;
                            let fits = search_class(needed).map_or(u64::MAX, |c| c.min_size());
                            let mut other = None;
                            h.for_each_free_at_least(l, fits, |_, addr, bsize| {
                                if !r.contains(&addr) && bsize >= fits {
                                    other = Some(addr);
                                }
                                other.is_none()
                            });
                            prop_assert!(
                                other.is_none(),
                                "block at {:?} fits, the end was split",
                                other
                            );
                        }
                        let rounded = size.div_ceil(256).max(1) * 256;
                        prop_assert!(a.size >= rounded);
                        prop_assert!(a.size - rounded < h.min_split());
                        prop_assert_eq!(a.addr % align.max(256), 0);
                        let base = m.region_base(a.addr);
                        prop_assert!(base.is_some(), "outside regions: {:?}", a);
                        let base = base.unwrap_or(0);
                        let r = &mut m.regions.get_mut(&base).unwrap_or_else(|| unreachable!());
                        prop_assert!(a.addr + a.size <= base + r.1, "crosses region end");
                        if let Some((&pa, &(ps, _))) = m.live.range(..a.addr).next_back() {
                            prop_assert!(pa + ps <= a.addr, "overlaps previous live block");
                        }
                        if let Some((&na, _)) = m.live.range(a.addr..).next() {
                            prop_assert!(a.addr + a.size <= na, "overlaps next live block");
                        }
                        r.2[lane] -= a.size;
                        m.live.insert(a.addr, (a.size, base));
                        prop_assert_eq!(h.used_block(a.addr), Some(a.block));
                    }
                    None => {
                        let needed = size.div_ceil(256).max(1) * 256 + align.max(256) - 256;
                        if let Some(c) = search_class(needed) {
                            prop_assert!(
                                h.largest_free(self.lanes[lane]) < c.min_size(),
                                "a block of the search class was there"
                            );
                        }
                    }
                }
            }
            Op::Free { pick, lane } => {
                if m.live.is_empty() {
                    return Ok(());
                }
                let (&addr, &(size, base)) = m.live.iter().nth(pick % m.live.len()).unwrap();
                prop_assert_eq!(h.free(addr, self.lanes[lane]), Ok(size));
                m.live.remove(&addr);
                m.regions.get_mut(&base).unwrap().2[lane] += size;
                m.freed.push(addr);
            }
            Op::BadFree { pick, delta } => {
                let before = h.stats();
                let addr = match (m.freed.is_empty(), m.live.is_empty()) {
                    (false, _) if delta == 0 => m.freed[pick % m.freed.len()],
                    (_, false) => *m.live.keys().nth(pick % m.live.len()).unwrap() + delta * 256,
                    _ => pick as u64 | 1,
                };
                if !m.live.contains_key(&addr) {
                    let r = h.free(addr, LaneId::GLOBAL);
                    let ok = matches!(
                        r,
                        Err(HeapError::UnknownAddress(a) | HeapError::DoubleFree(a)) if a == addr
                    );
                    prop_assert!(ok, "{:?}", r);
                    prop_assert_eq!(h.stats(), before);
                }
            }
            Op::MoveLane { from, to } => {
                h.move_lane(self.lanes[from], self.lanes[to]).unwrap();
                if from != to {
                    for r in m.regions.values_mut() {
                        r.2[to] += std::mem::take(&mut r.2[from]);
                    }
                }
            }
            Op::AbsorbGlobal { lane } => {
                let global_free: u64 = m.regions.values().map(|r| r.2[0]).sum();
                let want = lane != 0 && global_free > 0;
                prop_assert_eq!(h.absorb_global(self.lanes[lane]), want);
                if want {
                    for r in m.regions.values_mut() {
                        r.2[lane] += std::mem::take(&mut r.2[0]);
                    }
                }
            }
            Op::MoveBlock { pick, to } => {
                // Move the free block containing a freed address, if any.
                if m.freed.is_empty() {
                    return Ok(());
                }
                let addr = m.freed[pick % m.freed.len()];
                let Some(rid) = h.region_of(addr) else {
                    return Ok(());
                };
                let found = h
                    .region_blocks(rid)
                    .find(|(_, b)| b.addr() <= addr && addr < b.end());
                if let Some((id, b)) = found {
                    if let BlockState::Free { lane: from } = b.state() {
                        let from = self.lanes.iter().position(|&l| l == from).unwrap();
                        h.move_block(id, self.lanes[to]).unwrap();
                        let base = m.region_base(addr).unwrap();
                        let r = m.regions.get_mut(&base).unwrap();
                        r.2[from] -= b.size();
                        r.2[to] += b.size();
                    } else {
                        prop_assert_eq!(
                            h.move_block(id, self.lanes[to]),
                            Err(HeapError::BlockNotFree(id))
                        );
                    }
                }
            }
            Op::RemoveRegion { pick } => {
                if m.regions.is_empty() {
                    return Ok(());
                }
                let (&base, &(id, size, free)) =
                    m.regions.iter().nth(pick % m.regions.len()).unwrap();
                let removable = free[0] == size;
                prop_assert_eq!(h.region_is_free(id), removable);
                match h.remove_region(id) {
                    Ok(r) => {
                        prop_assert!(removable);
                        prop_assert_eq!(r, (base, size));
                        m.regions.remove(&base);
                        m.freed.retain(|&a| !(base..base + size).contains(&a));
                        prop_assert_eq!(h.remove_region(id), Err(HeapError::NoSuchRegion(id)));
                    }
                    Err(e) => {
                        prop_assert!(!removable);
                        prop_assert_eq!(e, HeapError::RegionNotFree(id));
                    }
                }
            }
            Op::ExtendRegion { pick, extra } => {
                if m.regions.is_empty() {
                    return Ok(());
                }
                let extra = extra & !255;
                let (&base, &(id, size, _)) = m.regions.iter().nth(pick % m.regions.len()).unwrap();
                let end = base + size;
                let reaches_next = m.regions.range(end..end + extra.max(1)).next().is_some();
                match h.extend_region(id, extra) {
                    Ok(()) => {
                        prop_assert!(extra > 0 && !reaches_next);
                        let r = m.regions.get_mut(&base).unwrap();
                        r.1 += extra;
                        r.2[0] += extra;
                        let (_, tail) = h.region_tail(id).unwrap();
                        prop_assert_eq!(tail.end(), end + extra);
                        prop_assert!(tail.is_free_in(0));
                    }
                    Err(HeapError::BadRegion { .. }) => prop_assert_eq!(extra, 0),
                    Err(e) => {
                        prop_assert!(reaches_next, "{}", e);
                        prop_assert_eq!(
                            e,
                            HeapError::RegionOverlap {
                                base: end,
                                size: extra
                            }
                        );
                    }
                }
            }
            Op::ShrinkRegion { pick, cut_granules } => {
                if m.regions.is_empty() {
                    return Ok(());
                }
                let (&base, &(id, size, _)) = m.regions.iter().nth(pick % m.regions.len()).unwrap();
                let cut = (cut_granules * 256).min(size);
                let keep = size - cut;
                // The heap's own layout says whether the cut lies in one
                // global free block at the end; the lane counts checked
                // after the step hold it to the model.
                let (_, tail) = h.region_tail(id).unwrap();
                let allowed =
                    cut > 0 && keep > 0 && tail.is_free_in(0) && tail.addr() <= base + keep;
                let live_in_cut = m.live.range(base + keep..base + size).next().is_some();
                match h.shrink_region(id, keep) {
                    Ok(n) => {
                        prop_assert!(allowed && !live_in_cut);
                        prop_assert_eq!(n, cut);
                        let r = m.regions.get_mut(&base).unwrap();
                        r.1 = keep;
                        r.2[0] -= cut;
                        m.freed
                            .retain(|&a| !(base + keep..base + size).contains(&a));
                        let (_, tail) = h.region_tail(id).unwrap();
                        prop_assert_eq!(tail.end(), base + keep);
                    }
                    Err(e) => {
                        prop_assert!(!allowed, "{}", e);
                        let expected = if cut == 0 || keep == 0 {
                            HeapError::BadRegion { base, size: keep }
                        } else {
                            HeapError::RegionNotFree(id)
                        };
                        prop_assert_eq!(e, expected);
                    }
                }
            }
            Op::SplitRegion { pick, at_granules } => {
                if m.regions.is_empty() {
                    return Ok(());
                }
                let (&base, &(id, size, free)) =
                    m.regions.iter().nth(pick % m.regions.len()).unwrap();
                let at = base + (at_granules % (size / 256)) * 256;
                let spans_used = m
                    .live
                    .range(base..at)
                    .next_back()
                    .is_some_and(|(&a, &(s, _))| a + s > at);
                // The free bytes of each lane below the cut, from the heap's
                // layout; the totals checked after the step hold them to
                // the model.
                let mut below = [0u64; LANES];
                for (_, b) in h.region_blocks(id) {
                    if let BlockState::Free { lane } = b.state() {
                        if b.addr() < at {
                            let l = self.lanes.iter().position(|&x| x == lane).unwrap();
                            below[l] += b.end().min(at) - b.addr();
                        }
                    }
                }
                match h.split_region(id, at) {
                    Ok(new) => {
                        prop_assert!(at > base && !spans_used);
                        let mut rest = free;
                        for (r, b) in rest.iter_mut().zip(below) {
                            *r -= b;
                        }
                        m.regions.insert(base, (id, at - base, below));
                        m.regions.insert(at, (new, base + size - at, rest));
                        for v in m.live.range_mut(at..base + size).map(|(_, v)| v) {
                            v.1 = at;
                        }
                        prop_assert_eq!(h.region_of(at), Some(new));
                        prop_assert_eq!(h.region_of(at - 256), Some(id));
                    }
                    Err(e) if at == base => {
                        prop_assert_eq!(e, HeapError::BadRegion { base: at, size: 0 })
                    }
                    Err(e) => {
                        prop_assert!(spans_used, "{}", e);
                        prop_assert_eq!(e, HeapError::RegionNotFree(id));
                    }
                }
            }
            Op::Recycle { lane } => {
                let l = self.lanes[lane];
                if m.lane_free(lane) == 0 {
                    h.drop_lane(l).unwrap();
                    prop_assert!(!h.has_lane(l));
                    prop_assert_eq!(h.create_lane(), Ok(l));
                } else {
                    prop_assert_eq!(h.drop_lane(l), Err(HeapError::LaneNotEmpty(l)));
                }
            }
        }
        self.check()
    }

    fn check(&self) -> Result<(), TestCaseError> {
        let (h, m) = (&self.h, &self.m);
        h.check_invariants().map_err(TestCaseError::fail)?;
        for (i, &l) in self.lanes.iter().enumerate() {
            prop_assert_eq!(h.lane_free_bytes(l), m.lane_free(i), "lane {}", i);
        }
        let live_bytes: u64 = m.live.values().map(|v| v.0).sum();
        prop_assert_eq!(h.used_bytes(), live_bytes);
        prop_assert_eq!(h.used_blocks(), m.live.len());
        for (&base, &(id, size, free)) in &m.regions {
            let used_in: u64 = m.live.range(base..base + size).map(|(_, v)| v.0).sum();
            let used_heap: u64 = h
                .region_blocks(id)
                .filter(|(_, b)| b.is_used())
                .map(|(_, b)| b.size())
                .sum();
            prop_assert_eq!(used_in, used_heap);
            prop_assert_eq!(used_in + free.iter().sum::<u64>(), size);
        }
        let st = h.stats();
        prop_assert_eq!(st.used_bytes + st.free_bytes, st.region_bytes);
        Ok(())
    }

    fn drain(&mut self) -> Result<(), TestCaseError> {
        let live: Vec<(u64, u64)> = self.m.live.iter().map(|(&a, &(s, _))| (a, s)).collect();
        for (k, (addr, size)) in live.into_iter().enumerate() {
            prop_assert_eq!(self.h.free(addr, self.lanes[k % LANES]), Ok(size));
        }
        for &l in &self.lanes[1..] {
            self.h.move_lane(l, LaneId::GLOBAL).unwrap();
        }
        self.h.check_invariants().map_err(TestCaseError::fail)?;
        let regions: Vec<_> = self.h.regions().collect();
        prop_assert_eq!(self.h.free_regions().count(), regions.len());
        for (id, base, size) in regions {
            prop_assert!(self.h.region_is_free(id));
            prop_assert_eq!(self.h.region_blocks(id).count(), 1);
            prop_assert_eq!(self.h.remove_region(id), Ok((base, size)));
        }
        for &l in &self.lanes[1..] {
            prop_assert_eq!(self.h.drop_lane(l), Ok(()));
        }
        prop_assert_eq!(
            self.h.stats(),
            HeapStats {
                lanes: 1,
                ..HeapStats::default()
            }
        );
        self.h.check_invariants().map_err(TestCaseError::fail)?;
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_match_the_model(
        min_split_log in prop_oneof![3 => Just(8u32), 1 => 8u32..14],
        ops in prop::collection::vec(op(), 1..300),
    ) {
        let mut t = Harness::new(1 << min_split_log);
        // Start with one region so that allocations have somewhere to go.
        t.step(&Op::AddRegion { slot: 0, offset: 0, size: 1 << 24 })?;
        for op in &ops {
            t.step(op)?;
        }
        t.drain()?;
    }
}
