//! The invariant checker (for tests).

use super::page_table::{PageRef, PageTable, PhysPage};
use super::VirtualPool;

impl VirtualPool {
    /// Checks the pool's invariants: the heaps' structure, and that every page
    /// under a live block is mapped and counts exactly the live blocks on it.
    /// For tests; O(pages + blocks).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let st = self.lock();
        let mut live = Vec::new();
        for a in &st.areas {
            a.heap.check_invariants()?;
            live.extend(a.heap.used_ranges());
        }
        st.pages.check(&live, &st.phys)?;
        // Every extent is mapped whole, in order, or not at all.
        for (p, pp) in st.pages.mapped() {
            let n = st.phys.pages(pp.extent);
            let start = p.idx.checked_sub(pp.index as usize);
            let whole = start.is_some_and(|s0| {
                (0..n).all(|i| {
                    st.pages
                        .phys_at(PageRef {
                            res: p.res,
                            idx: s0 + i,
                        })
                        .is_some_and(|q| q.extent == pp.extent && q.index as usize == i)
                })
            });
            if !whole {
                return Err(format!(
                    "page {:#x}: extent {} is not mapped whole",
                    st.pages.addr(p),
                    pp.extent
                ));
            }
        }
        // Each extent's list of mappings matches the table; an extent is
        // cached exactly when it is mapped nowhere.
        let mut mapped = 0;
        for (x, ext) in st.phys.extents() {
            for &at in &ext.mappings {
                let p = PageTable::unpack(at);
                if st.pages.phys_at(p)
                    != Some(PhysPage {
                        extent: x,
                        index: 0,
                    })
                {
                    return Err(format!("extent {x}: no mapping at {:#x}", st.pages.addr(p)));
                }
            }
            if ext.mappings.is_empty() != st.phys.is_cached(x) {
                return Err(format!(
                    "extent {x}: {} mappings but cached {}",
                    ext.mappings.len(),
                    st.phys.is_cached(x)
                ));
            }
            mapped += ext.mappings.len() * st.phys.pages(x);
        }
        if mapped != st.pages.mapped_pages() {
            return Err(format!(
                "{mapped} pages mapped by extents, {} in the table",
                st.pages.mapped_pages()
            ));
        }
        Ok(())
    }
}
