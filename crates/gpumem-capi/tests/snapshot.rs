//! Snapshots (`gpumem_snapshot`, `torch.cuda.memory._snapshot`) over every
//! resource: the blocks are exactly the live allocations, each inside one
//! segment, and the segments are what the device holds.

mod support;

use std::collections::BTreeMap;

use gpumem::adaptor::granular_size;
use gpumem::DevicePtr;
use gpumem_capi::conf::ResourceKind;
use support::{allocator, kinds, stats, MIB};

#[test]
fn blocks_are_the_live_allocations_and_lie_inside_segments() {
    let sizes = [
        300,
        1000,
        4096,
        40_000,
        700 << 10,
        3 * MIB,
        13 * MIB,
        30 * MIB,
    ];
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        let mut live: BTreeMap<DevicePtr, usize> = BTreeMap::new();
        for (i, &n) in sizes.iter().cycle().take(24).enumerate() {
            let p = a.malloc(n, 0, 0);
            assert!(!p.is_null(), "{kind}");
            live.insert(p, n);
            if i % 3 == 2 {
                let (&q, &m) = live.iter().nth(i % live.len()).unwrap();
                a.free(q, m, 0, 0);
                live.remove(&q);
            }
        }
        let snap = a.snapshot(0).unwrap();
        let got: Vec<DevicePtr> = snap.blocks.iter().map(|(b, _)| b.address).collect();
        let want: Vec<DevicePtr> = live.keys().copied().collect();
        assert_eq!(got, want, "{kind}: the live allocations, in address order");
        for (b, _) in &snap.blocks {
            let asked = live[&b.address];
            assert!(b.size >= granular_size(asked).unwrap(), "{kind}: {b:?}");
            if let Some(r) = b.requested {
                assert_eq!(r, asked, "{kind}: {b:?}");
            }
            let holders = snap.segments.iter().filter(|s| s.contains(b)).count();
            assert_eq!(holders, 1, "{kind}: {b:?} in one segment");
        }
        for w in snap.segments.windows(2) {
            assert!(
                w[0].address.0 + w[0].size as u64 <= w[1].address.0,
                "{kind}: segments sorted and apart"
            );
        }
        let segment_bytes: usize = snap.segments.iter().map(|s| s.size).sum();
        let s = stats(&a, 0);
        match kind {
            // Mapped ranges: an aliased extent counts at each place.
            ResourceKind::Virtual => assert!(segment_bytes >= a.reserved_bytes(0) / 2),
            // CUDA's pool: one segment per live block, as asked for.
            ResourceKind::Async => assert_eq!(snap.segments.len(), live.len()),
            _ => {
                assert_eq!(segment_bytes, a.reserved_bytes(0), "{kind}");
                assert_eq!(snap.segments.len() as i64, s.segment.current, "{kind}");
            }
        }
        for (p, n) in live {
            a.free(p, n, 0, 0);
        }
        assert!(a.snapshot(0).unwrap().blocks.is_empty(), "{kind}");
    }
}

#[test]
fn snapshot_of_devices_never_used_or_out_of_range() {
    let a = allocator("resource=pool");
    let snap = a.snapshot(3).unwrap();
    assert!(snap.segments.is_empty() && snap.blocks.is_empty());
    assert!(a.snapshot(-1).is_none());
    assert!(a.snapshot(64).is_none());
}

#[test]
fn the_arena_knows_each_block_s_stream() {
    let a = allocator("resource=arena,initial_size=64MiB");
    let p = a.malloc(1000, 0, 0);
    let q = a.malloc(MIB, 0, 0x7000);
    let snap = a.snapshot(0).unwrap();
    let streams: BTreeMap<DevicePtr, u64> =
        snap.blocks.iter().map(|(b, s)| (b.address, *s)).collect();
    assert_eq!(streams[&p], 0);
    assert_eq!(streams[&q], 0x7000);
    a.free(p, 1000, 0, 0);
    a.free(q, MIB, 0, 0x7000);
}

#[test]
fn segments_say_whether_they_grow_in_place() {
    for kind in kinds() {
        let choices: &[bool] = match kind {
            ResourceKind::Pool | ResourceKind::Binning => &[true, false],
            _ => &[true],
        };
        for &expandable in choices {
            let text = match kind {
                ResourceKind::Pool | ResourceKind::Binning => {
                    format!("resource={kind},expandable={expandable}")
                }
                _ => format!("resource={kind}"),
            };
            let a = allocator(&text);
            let live: Vec<_> = [1000, 3 * MIB, 30 * MIB]
                .iter()
                .map(|&n| (a.malloc(n, 0, 0), n))
                .collect();
            let snap = a.snapshot(0).unwrap();
            assert!(!snap.segments.is_empty(), "{kind}");
            let all: Vec<DevicePtr> = snap.segments.iter().map(|s| s.address).collect();
            let want = match kind {
                // Heaps that grow one range of virtual memory each.
                ResourceKind::Pool | ResourceKind::Binning if expandable => all,
                // Runs of pages mapped into its virtual ranges.
                ResourceKind::Virtual => all,
                // cuMemAlloc regions, or CUDA's own pool.
                _ => vec![],
            };
            assert_eq!(snap.expandable, want, "{kind}, expandable={expandable}");
            // A graph pool's segments are allocated whole (a pool retained,
            // with no capture begun).
            a.graph_pool_retain(0, (0, 5)).unwrap();
            let g = a.graph_pool_malloc(MIB, 0, (0, 5), 0);
            let snap = a.snapshot(0).unwrap();
            assert_eq!(snap.graph_segments.len(), 1);
            let at = snap.graph_segments[0].segment.address;
            assert!(!snap.expandable.contains(&at), "{kind}");
            a.graph_pool_free(g, MIB, 0, (0, 5), 0);
            a.graph_pool_release(0, (0, 5)).unwrap();
            for (p, n) in live {
                a.free(p, n, 0, 0);
            }
        }
    }
}
