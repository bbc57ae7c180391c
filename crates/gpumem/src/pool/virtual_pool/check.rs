//! The invariant checker (for tests). It follows the numbered list of
//! invariants in `docs/virtual_pool.md`; each check names its number, and so
//! does its error.

use std::sync::atomic::Ordering;

use super::page_table::{PageRef, PageTable, PhysPage};
use super::phys_cache::NO_OWNER;
use super::{State, VirtualPool};

impl VirtualPool {
    /// Checks the pool's invariants (the numbered list of
    /// `docs/virtual_pool.md`): the heaps' structure, the areas' addresses,
    /// that every page under a live block is mapped, owns its physical page
    /// and counts exactly the live blocks on it, that extents are mapped
    /// whole and recorded where they are, and the cache; each shard's, and
    /// what the shards share. For tests, with no other thread using the
    /// pool; O(pages + blocks + extents).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut pages = 0;
        for i in 0..self.shards.len() {
            let st = self.shards.lock(i);
            let named = |e: String| match self.shards.len() {
                1 => e,
                _ => format!("{e} (shard {i})"),
            };
            self.check_shard(&st).map_err(named)?;
            // 12. Each reservation is recorded as its shard's, and the
            //     shards' physical pages add up to the pool's count.
            let owners = self.shards.global();
            for r in &st.pages.reservations {
                let last = r.base + r.bytes - 1;
                if owners.owner_of(r.base) != Some(i) || owners.owner_of(last) != Some(i) {
                    return Err(named(format!(
                        "invariant 12: reservation {:#x} of {} bytes is recorded as shard {:?}'s",
                        r.base,
                        r.bytes,
                        owners.owner_of(r.base)
                    )));
                }
            }
            pages += st.phys.total_pages();
        }
        let counted = self.pool_pages.load(Ordering::Relaxed);
        if pages != counted {
            return Err(format!(
                "invariant 12: the shards hold {pages} pages, the pool counts {counted}"
            ));
        }
        Ok(())
    }

    /// The invariants of one shard.
    fn check_shard(&self, st: &State) -> std::result::Result<(), String> {
        // 1. Each area's heap is well formed.
        let mut live = Vec::new();
        for a in &st.areas {
            a.heap.check_invariants()?;
            live.extend(a.heap.used_ranges());
        }
        // 2. Each area's heap holds exactly the addresses given to the area,
        //    and those addresses tile the reservations.
        for (area, a) in st.areas.iter().enumerate() {
            let mut given: Vec<(u64, u64)> = st
                .area_ranges
                .iter()
                .filter(|r| r.2 == area)
                .map(|&(start, end, _)| (start, end))
                .collect();
            let mut held: Vec<(u64, u64)> = a
                .heap
                .regions()
                .map(|(_, base, bytes)| (base, base + bytes))
                .collect();
            given.sort_unstable();
            held.sort_unstable();
            if given != held {
                return Err(format!(
                    "invariant 2: area {area} was given {given:#x?} but its heap holds {held:#x?}"
                ));
            }
        }
        let mut ranges = st.area_ranges.clone();
        ranges.sort_unstable();
        let mut given = 0;
        for (i, &(start, end, _)) in ranges.iter().enumerate() {
            if end <= start || st.pages.span(start, end - start).is_none() {
                return Err(format!(
                    "invariant 2: area range {start:#x}..{end:#x} lies in no reservation"
                ));
            }
            if ranges.get(i + 1).is_some_and(|next| next.0 < end) {
                return Err(format!(
                    "invariant 2: area range {start:#x}..{end:#x} overlaps the next"
                ));
            }
            given += (end - start) as usize;
        }
        if given != st.pages.reserved_bytes() {
            return Err(format!(
                "invariant 2: {given} bytes given to the areas, {} reserved",
                st.pages.reserved_bytes()
            ));
        }
        // 3, 4, 5 (the page side) and 6: the page table against the live
        // blocks (those asleep apart) and the owners.
        let asleep: Vec<u64> = st.regions.blocks.keys().copied().collect();
        st.pages.check(&live, &asleep, &st.phys)?;
        // 5 (the extent side). An owner entry names a page that maps that
        // very physical page.
        for (x, ext) in st.phys.extents() {
            for (i, &owner) in ext.owners.iter().enumerate() {
                let here = PhysPage {
                    extent: x,
                    index: i as u32,
                };
                let p = PageTable::unpack(owner);
                if owner != NO_OWNER && st.pages.phys_at_checked(p) != Some(here) {
                    return Err(format!(
                        "invariant 5: page {i} of extent {x} is owned by {owner:#x}, which does not map it"
                    ));
                }
            }
        }
        // 7. An extent is mapped whole, in order, wherever it is mapped.
        for (p, pp) in st.pages.mapped() {
            let n = st.phys.pages(pp.extent);
            let start = p.idx.checked_sub(pp.index as usize);
            let whole = start.is_some_and(|first| {
                (0..n).all(|i| {
                    let q = PageRef {
                        res: p.res,
                        idx: first + i,
                    };
                    st.pages.phys_at_checked(q)
                        == Some(PhysPage {
                            extent: pp.extent,
                            index: i as u32,
                        })
                })
            });
            if !whole {
                return Err(format!(
                    "invariant 7: page {:#x}: extent {} is not mapped whole",
                    st.pages.addr(p),
                    pp.extent
                ));
            }
        }
        // 8. Each extent's list of mappings names places where its first page
        //    is mapped, and the mappings' pages add up to the mapped pages.
        let mut mapped = 0;
        for (x, ext) in st.phys.extents() {
            for &at in &ext.mappings {
                let p = PageTable::unpack(at);
                let first = PhysPage {
                    extent: x,
                    index: 0,
                };
                if st.pages.phys_at_checked(p) != Some(first) {
                    return Err(format!("invariant 8: extent {x}: no mapping at {at:#x}"));
                }
            }
            mapped += ext.mappings.len() * st.phys.pages(x);
        }
        if mapped != st.pages.mapped_pages() {
            return Err(format!(
                "invariant 8: {mapped} pages mapped by extents, {} in the table",
                st.pages.mapped_pages()
            ));
        }
        // 9. An extent is cached exactly when it has no mapping, and the page
        //    counts add up.
        for (x, ext) in st.phys.extents() {
            if ext.mappings.is_empty() != st.phys.is_cached(x) {
                return Err(format!(
                    "invariant 9: extent {x}: {} mappings but cached {}",
                    ext.mappings.len(),
                    st.phys.is_cached(x)
                ));
            }
        }
        st.phys.check()?;
        // 10. The blocks asleep are exactly the live blocks carrying the tag
        //     of a region asleep, and each region counts them.
        let r = &st.regions;
        let mut counted = 0;
        for a in &r.asleep {
            let mut tagged: Vec<(u64, u64)> = st
                .areas
                .iter()
                .flat_map(|area| area.heap.tagged_ranges(a.tag))
                .collect();
            tagged.sort_unstable();
            let held: Vec<(u64, u64)> = r
                .placed(a.tag)
                .into_iter()
                .map(|(addr, size, _)| (addr, size))
                .collect();
            if tagged != held {
                return Err(format!(
                    "invariant 10: region {} has live blocks {tagged:#x?} but {held:#x?} asleep",
                    a.tag
                ));
            }
            let bytes: u64 = held.iter().map(|b| b.1).sum();
            if (a.blocks, a.bytes) != (held.len(), bytes) {
                return Err(format!(
                    "invariant 10: region {} counts {} blocks of {} bytes asleep, holds {} of {bytes}",
                    a.tag,
                    a.blocks,
                    a.bytes,
                    held.len()
                ));
            }
            if let Some(b) = a.backup {
                let end = r.placed(a.tag).iter().map(|p| p.2 + p.1).max().unwrap_or(0);
                if end > b.bytes as u64 {
                    return Err(format!(
                        "invariant 10: region {}'s blocks reach {end} bytes into a backup of {}",
                        a.tag, b.bytes
                    ));
                }
            }
            counted += held.len();
        }
        if counted != r.blocks.len() {
            return Err(format!(
                "invariant 10: {counted} blocks of regions asleep, {} held",
                r.blocks.len()
            ));
        }
        // Regions live in shard 0 (a pool with regions never spreads).
        if st.shard == 0 && self.any_asleep.load(Ordering::Relaxed) == r.asleep.is_empty() {
            return Err(format!(
                "invariant 10: {} regions asleep, but the flag says {}",
                r.asleep.len(),
                self.any_asleep.load(Ordering::Relaxed)
            ));
        }
        // 11. In the NCCL-ready mode, no extent is mapped twice, and every
        //     live block is whole pages exactly covered by one extent.
        if self.config.nccl_ready {
            if let Some((x, _)) = st.phys.extents().find(|(_, e)| e.mappings.len() > 1) {
                return Err(format!("invariant 11: extent {x} is mapped more than once"));
            }
            for &(addr, size) in &live {
                let span = st.pages.span(addr, size);
                let first = span.and_then(|s| {
                    st.pages.phys_at_checked(PageRef {
                        res: s.res,
                        idx: s.first,
                    })
                });
                let whole = match (span, first) {
                    (Some(s), Some(pp)) => {
                        addr % self.gran as u64 == 0
                            && size % self.gran as u64 == 0
                            && pp.index == 0
                            && st.phys.pages(pp.extent) == s.last - s.first + 1
                    }
                    _ => false,
                };
                if !whole {
                    return Err(format!(
                        "invariant 11: block {addr:#x} of {size} bytes is not one extent of its own"
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::super::page_table::{PageRef, PageSpan, PageTable};
    use super::super::phys_cache::NO_OWNER;
    use super::super::{State, VirtualPool, VirtualPoolConfig, SMALL};
    use crate::driver::sim::SimConfig;
    use crate::resource::MemoryResource;
    use crate::Device;

    /// Three pages of a 2 MiB-page pool.
    const BLOCK: usize = 6 << 20;

    /// A pool with a live block of three pages (`live`) and an idle extent of
    /// three pages, each page owning its memory, where a block was freed.
    fn pool() -> (Device, VirtualPool, PageSpan, PageSpan) {
        let device = Device::sim(SimConfig::default());
        let pool = VirtualPool::new(device.clone(), VirtualPoolConfig::default()).unwrap();
        let s = device.create_stream().unwrap();
        let live = pool.allocate(BLOCK, 256, &s).unwrap();
        let idle = pool.allocate(BLOCK, 256, &s).unwrap();
        pool.deallocate(idle, BLOCK, 256, &s).unwrap();
        pool.check_invariants().unwrap();
        let st = pool.lock();
        let live = st.pages.span(live.0, BLOCK as u64).unwrap();
        let idle = st.pages.span(idle.0, BLOCK as u64).unwrap();
        drop(st);
        (device, pool, live, idle)
    }

    /// Breaks the pool with `corrupt`, returns what the checker says, and
    /// mends it with `mend` (so the drop finds a sound pool).
    fn broken(
        corrupt: impl FnOnce(&mut State, PageSpan, PageSpan),
        mend: impl FnOnce(&mut State, PageSpan, PageSpan),
    ) -> String {
        let (_device, pool, live, idle) = pool();
        corrupt(&mut pool.lock(), live, idle);
        let err = pool
            .check_invariants()
            .expect_err("the corruption is caught");
        mend(&mut pool.lock(), live, idle);
        pool.check_invariants().unwrap();
        err
    }

    fn page(span: PageSpan, i: usize) -> PageRef {
        PageRef {
            res: span.res,
            idx: span.first + i,
        }
    }

    #[test]
    fn a_range_given_to_no_heap_breaks_invariant_2() {
        let err = broken(
            |st, _, _| st.area_ranges.push((1 << 20, 2 << 20, SMALL)),
            |st, _, _| {
                st.area_ranges.pop();
            },
        );
        assert!(err.starts_with("invariant 2:"), "{err}");
    }

    #[test]
    fn a_live_block_not_counted_breaks_invariant_3() {
        let err = broken(
            |st, live, _| st.pages.unacquire(live),
            |st, live, _| {
                let State { pages, phys, .. } = st;
                pages.acquire(live, phys, |_| true);
            },
        );
        assert!(err.starts_with("invariant 3:"), "{err}");
    }

    #[test]
    fn a_busy_page_unmapped_breaks_invariant_4() {
        let under = Cell::new(None);
        let err = broken(
            |st, live, _| under.set(st.pages.set_unmapped(page(live, 1))),
            |st, live, _| {
                st.pages.set_mapped(page(live, 1), under.get().unwrap());
                st.pages.own_new(page(live, 1), &mut st.phys);
            },
        );
        assert!(err.starts_with("invariant 4:"), "{err}");
    }

    #[test]
    fn an_owner_entry_naming_another_page_breaks_invariant_5() {
        let was = Cell::new(0);
        let err = broken(
            |st, _, idle| {
                let x = st.pages.phys_at(page(idle, 0)).unwrap().extent;
                was.set(std::mem::replace(
                    &mut st.phys.extent_mut(x).owners[0],
                    NO_OWNER,
                ));
            },
            |st, _, idle| {
                let x = st.pages.phys_at(page(idle, 0)).unwrap().extent;
                st.phys.extent_mut(x).owners[0] = was.get();
            },
        );
        assert!(err.starts_with("invariant 5:"), "{err}");
    }

    #[test]
    fn an_extent_mapped_in_part_breaks_invariant_7() {
        let (under, owner) = (Cell::new(None), Cell::new(0));
        let err = broken(
            |st, _, idle| {
                under.set(st.pages.set_unmapped(page(idle, 1)));
                let pp = under.get().unwrap();
                owner.set(std::mem::replace(
                    &mut st.phys.extent_mut(pp.extent).owners[pp.index as usize],
                    NO_OWNER,
                ));
            },
            |st, _, idle| {
                let pp = under.get().unwrap();
                st.pages.set_mapped(page(idle, 1), pp);
                st.phys.extent_mut(pp.extent).owners[pp.index as usize] = owner.get();
                st.pages.own_new(page(idle, 1), &mut st.phys);
            },
        );
        assert!(err.starts_with("invariant 7:"), "{err}");
    }

    #[test]
    fn a_mapping_listed_where_there_is_none_breaks_invariant_8() {
        let err = broken(
            |st, _, idle| {
                let x = st.pages.phys_at(page(idle, 0)).unwrap().extent;
                let nowhere = PageTable::pack(idle.res, idle.last + 100);
                st.phys.extent_mut(x).mappings.push(nowhere);
            },
            |st, _, idle| {
                let x = st.pages.phys_at(page(idle, 0)).unwrap().extent;
                st.phys.extent_mut(x).mappings.pop();
            },
        );
        assert!(err.starts_with("invariant 8:"), "{err}");
    }

    #[test]
    fn a_mapped_extent_in_the_cache_breaks_invariant_9() {
        let err = broken(
            |st, _, idle| {
                let x = st.pages.phys_at(page(idle, 0)).unwrap().extent;
                st.phys.put(x);
            },
            |st, _, _| {
                st.phys.take_fitting(usize::MAX).unwrap();
            },
        );
        assert!(err.starts_with("invariant 9:"), "{err}");
    }
}
