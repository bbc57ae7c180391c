//! Statistics in PyTorch's terms (`gpumem_get_device_stats`), over every
//! resource `GPUMEM_CONF` can choose: they agree with the resource's own
//! numbers and with the (simulated) driver's, and reset as
//! `torch.cuda.reset_peak_memory_stats` and
//! `reset_accumulated_memory_stats` do.

mod support;

use gpumem::adaptor::granular_size;
use gpumem_capi::conf::ResourceKind;
use gpumem_capi::gpumem_device_stats_t;
use support::{allocator, kinds, named, sim, stats, MIB};

/// Every kind's configuration, and the pools' without expandable heaps.
fn confs() -> Vec<(ResourceKind, String)> {
    let mut out: Vec<_> = kinds()
        .into_iter()
        .map(|k| (k, format!("resource={k}")))
        .collect();
    for k in [ResourceKind::Pool, ResourceKind::Binning] {
        out.push((k, format!("resource={k},expandable=false")));
    }
    out
}

/// The driver calls that make and end what a resource configured by
/// `conf` counts as segments.
fn driver_calls(kind: ResourceKind, conf: &str) -> Option<(&'static str, &'static str)> {
    match kind {
        ResourceKind::Virtual => Some(("cuMemCreate", "cuMemRelease")),
        // CUDA's pool grows inside the driver: no call to count.
        ResourceKind::Async => None,
        // Expandable heaps: a segment is a range, grown in place.
        ResourceKind::Pool | ResourceKind::Binning if !conf.contains("expandable=false") => {
            Some(("cuMemAddressReserve", "cuMemAddressFree"))
        }
        _ => Some(("cuMemAlloc", "cuMemFree")),
    }
}

#[test]
fn statistics_agree_with_the_resource_and_the_driver() {
    let sizes = [1000, 4096, 3 * MIB, 25 * MIB, 300];
    for (kind, conf) in confs() {
        let kind_conf = conf.as_str();
        let a = allocator(kind_conf);
        let sim = sim(&a);
        assert_eq!(stats(&a, 0), gpumem_device_stats_t::default(), "{kind}");
        let ptrs: Vec<_> = sizes.iter().map(|&n| a.malloc(n, 0, 0)).collect();
        assert!(ptrs.iter().all(|p| !p.is_null()), "{kind}");
        a.free(ptrs[1], sizes[1], 0, 0);
        let live = [0, 2, 3, 4];
        let s = stats(&a, 0);
        let c = (s.allocation.current, s.allocation.peak);
        assert_eq!(c, (4, 5), "{kind}: allocation current, peak");
        assert_eq!(
            (s.allocation.allocated, s.allocation.freed),
            (5, 1),
            "{kind}"
        );
        assert_eq!(s.active, s.allocation, "{kind}: nothing deferred");
        let granular: i64 = live
            .iter()
            .map(|&i| granular_size(sizes[i]).unwrap() as i64)
            .sum();
        assert_eq!(s.allocated_bytes.current, granular, "{kind}");
        assert_eq!(s.allocated_bytes.current, a.allocated_bytes(0) as i64);
        assert_eq!(s.active_bytes, s.allocated_bytes, "{kind}");
        let requested: i64 = live.iter().map(|&i| sizes[i] as i64).sum();
        assert_eq!(s.requested_bytes.current, requested, "{kind}");
        assert_eq!(
            s.reserved_bytes.current,
            a.reserved_bytes(0) as i64,
            "{kind}: the resource's own reserve"
        );
        assert_eq!(s.reserved_bytes.peak, a.peak_reserved_bytes(0) as i64);
        match kind {
            ResourceKind::Virtual => {
                assert_eq!(s.reserved_bytes.current, sim.physical_bytes() as i64)
            }
            ResourceKind::Async => {
                assert_eq!(s.segment, s.allocation, "{kind}: one per live block");
            }
            _ => {
                assert_eq!(
                    s.reserved_bytes.current,
                    sim.device_bytes(0) as i64,
                    "{kind_conf}: what the driver handed out"
                );
                let (made, ended) = driver_calls(kind, kind_conf).unwrap();
                assert_eq!(
                    s.segment.current,
                    (sim.call_count(made) - sim.call_count(ended)) as i64,
                    "{kind_conf}: one segment per {made}"
                );
            }
        }
        if let Some((alloc, free)) = driver_calls(kind, kind_conf) {
            assert_eq!(s.num_device_alloc, sim.call_count(alloc) as i64, "{kind}");
            assert_eq!(s.num_device_free, sim.call_count(free) as i64, "{kind}");
            assert_eq!(
                s.segment.current,
                s.segment.allocated - s.segment.freed,
                "{kind}"
            );
            assert_eq!(s.segment.allocated, s.num_device_alloc, "{kind}");
        }
        for &i in &live {
            a.free(ptrs[i], sizes[i], 0, 0);
        }
        a.empty_cache(0);
        let s = stats(&a, 0);
        assert_eq!(s.allocation.current, 0, "{kind}");
        assert_eq!(s.allocated_bytes.current, 0, "{kind}");
        assert_eq!((s.allocation.allocated, s.allocation.freed), (5, 5));
        assert_eq!(s.reserved_bytes.current, a.reserved_bytes(0) as i64);
        if let Some((alloc, free)) = driver_calls(kind, kind_conf) {
            assert_eq!(s.num_device_alloc, sim.call_count(alloc) as i64, "{kind}");
            assert_eq!(s.num_device_free, sim.call_count(free) as i64, "{kind}");
        }
        assert_eq!((s.num_alloc_retries, s.num_ooms), (0, 0), "{kind}");
    }
}

#[test]
fn peaks_and_totals_reset_as_pytorch_resets_them() {
    for kind in kinds() {
        let a = allocator(&format!("resource={kind}"));
        let p = a.malloc(30 * MIB, 0, 0);
        let q = a.malloc(MIB, 0, 0);
        a.free(p, 30 * MIB, 0, 0);
        a.empty_cache(0);
        let before = stats(&a, 0);
        assert!(before.allocated_bytes.peak > before.allocated_bytes.current);
        a.reset_peak(0);
        let s = stats(&a, 0);
        for (name, stat) in named(&s) {
            assert_eq!(
                stat.peak, stat.current,
                "{kind}: {name}.peak after the reset"
            );
        }
        assert_eq!(
            s.allocation.allocated, 2,
            "{kind}: a peak reset leaves totals"
        );
        a.reset_accumulated(0);
        let s = stats(&a, 0);
        for (name, stat) in [
            ("allocation", s.allocation),
            ("segment", s.segment),
            ("allocated_bytes", s.allocated_bytes),
            ("reserved_bytes", s.reserved_bytes),
        ] {
            assert_eq!((stat.allocated, stat.freed), (0, 0), "{kind}: {name}");
        }
        assert_eq!(s.allocation.current, 1, "{kind}: current stays");
        assert_eq!(s.reserved_bytes.current, before.reserved_bytes.current);
        assert_eq!((s.num_device_alloc, s.num_device_free), (0, 0), "{kind}");
        let r = a.malloc(2 * MIB, 0, 0);
        a.free(q, MIB, 0, 0);
        let s = stats(&a, 0);
        assert_eq!(
            (s.allocation.allocated, s.allocation.freed),
            (1, 1),
            "{kind}: counted from the reset"
        );
        assert_eq!(s.allocated_bytes.allocated, 2 * MIB as i64);
        a.free(r, 2 * MIB, 0, 0);
    }
}

#[test]
fn largest_free_block_is_servable_without_the_driver() {
    for (kind, conf) in confs() {
        let a = allocator(&conf);
        let sim = sim(&a);
        let p = a.malloc(8 * MIB, 0, 0);
        let keep = a.malloc(MIB, 0, 0);
        a.free(p, 8 * MIB, 0, 0);
        let largest = stats(&a, 0).largest_free_block as usize;
        match kind {
            ResourceKind::Cuda => assert_eq!(largest, 0, "{kind}: nothing cached"),
            _ => assert!(largest >= 8 * MIB, "{kind}: {largest}"),
        }
        // CUDA's pool says only how much it caches, not in what pieces.
        if largest > 0 && kind != ResourceKind::Async {
            // Any call that takes memory from the driver.
            let grows =
                || ["cuMemAlloc", "cuMemCreate", "cuMemAddressReserve"].map(|c| sim.call_count(c));
            let (calls, reserved) = (grows(), a.reserved_bytes(0));
            let q = a.malloc(largest, 0, 0);
            assert!(!q.is_null(), "{kind}");
            assert_eq!(a.reserved_bytes(0), reserved, "{kind}: no growth");
            assert_eq!(grows(), calls, "{kind}: no driver allocation");
            a.free(q, largest, 0, 0);
        }
        a.free(keep, MIB, 0, 0);
    }
}

#[test]
fn devices_count_apart_and_out_of_range_is_none() {
    let a = allocator("resource=pool");
    let p = a.malloc(MIB, 1, 0);
    assert_eq!(stats(&a, 1).allocation.current, 1);
    assert_eq!(stats(&a, 0), gpumem_device_stats_t::default());
    assert_eq!(a.device_stats(-1), None);
    assert_eq!(a.device_stats(64), None);
    assert!(a.device_stats(63).is_some(), "in range, never used");
    a.free(p, MIB, 1, 0);
}

#[test]
fn recycling_takes_a_hole_s_pieces_and_the_statistics_follow() {
    for (conf, grown) in [
        ("resource=pool", 184),
        ("resource=pool,recycle=true", 56),
        // At the limit, only the moves make room.
        ("resource=pool,recycle=true,max_size=204MiB", 56),
    ] {
        let a = allocator(conf);
        let sim = sim(&a);
        let x = a.malloc(128 * MIB, 0, 0);
        let y = a.malloc(4 * MIB, 0, 0);
        assert!(!x.is_null() && !y.is_null(), "{conf}");
        assert_eq!(
            a.reserved_bytes(0),
            148 * MIB,
            "{conf}: a 20 MiB step after x"
        );
        a.free(x, 128 * MIB, 0, 0);
        // 200 MiB fit nowhere: the range grows by what it lacks, less x's
        // two free 64 MiB pieces when they are recycled.
        let z = a.malloc(200 * MIB, 0, 0);
        assert!(!z.is_null(), "{conf}");
        let reserved = (148 + grown) * MIB;
        assert_eq!(a.reserved_bytes(0), reserved, "{conf}");
        assert_eq!(sim.mapped_bytes(), reserved, "{conf}");
        let s = stats(&a, 0);
        assert_eq!(s.reserved_bytes.current, reserved as i64, "{conf}");
        assert_eq!(s.reserved_bytes.peak, reserved as i64, "{conf}");
        assert_eq!(s.allocated_bytes.current, (204 * MIB) as i64, "{conf}");
        a.free(y, 4 * MIB, 0, 0);
        a.free(z, 200 * MIB, 0, 0);
        assert_eq!(stats(&a, 0).allocated_bytes.current, 0, "{conf}");
    }
}

/// A design choice, pinned: pools record a block to its 256-byte granule,
/// so a free naming another size within the granule is accepted (not a
/// bad free), and `requested_bytes` loses the size the free names.
#[test]
fn a_free_within_the_granule_moves_requested_bytes_by_the_size_named() {
    for kind in [ResourceKind::Pool, ResourceKind::Virtual] {
        let a = allocator(&format!("resource={kind}"));
        let p = a.malloc(1000, 0, 0);
        a.free(p, 1001, 0, 0);
        assert_eq!(a.bad_free_count(0), 0, "{kind}");
        let s = stats(&a, 0);
        assert_eq!(s.allocated_bytes.current, 0, "{kind}");
        assert_eq!(
            s.requested_bytes.current, -1,
            "{kind}: drifts by the difference"
        );
        assert_eq!(s.requested_bytes.freed, 1001, "{kind}");
    }
}

/// The device's segments count in PyTorch's size classes by their size: a
/// small request's growth makes a small segment (2 MiB, as PyTorch's small
/// pool's are), a large request's a large one; the classes split every
/// count of all segments; CUDA's pool, which cannot tell, counts its
/// reserve as large.
#[test]
fn device_segments_count_in_the_class_of_their_size() {
    for (kind, conf) in confs() {
        let a = allocator(&conf);
        let small = a.malloc(512, 0, 0);
        let [s, l] = a.class_stats(0).unwrap();
        let all = stats(&a, 0);
        assert_eq!(
            s.segment.current + l.segment.current,
            all.segment.current,
            "{conf}"
        );
        assert_eq!(
            s.reserved_bytes.current + l.reserved_bytes.current,
            all.reserved_bytes.current,
            "{conf}"
        );
        match kind {
            ResourceKind::Pool | ResourceKind::Virtual => {
                assert_eq!((s.segment.current, l.segment.current), (1, 0), "{conf}");
                assert_eq!(s.reserved_bytes.current, 2 * MIB as i64, "{conf}");
            }
            ResourceKind::Async => assert_eq!(s.segment.current, 0, "{conf}"),
            _ => {}
        }
        let large = a.malloc(30 * MIB, 0, 0);
        let [s2, l2] = a.class_stats(0).unwrap();
        if matches!(kind, ResourceKind::Pool | ResourceKind::Virtual) {
            assert_eq!(s2.segment.current, 1, "{conf}");
            assert!(l2.segment.current >= 1, "{conf}: {:?}", l2.segment);
            assert_eq!(l2.segment.allocated, l2.segment.current, "{conf}");
        }
        a.free(large, 30 * MIB, 0, 0);
        a.free(small, 512, 0, 0);
        a.empty_cache(0);
        let [s3, l3] = a.class_stats(0).unwrap();
        assert!(l3.segment.peak >= l2.segment.current, "{conf}");
        if kind != ResourceKind::Arena {
            // (The arena keeps its one region.)
            assert_eq!((s3.segment.current, l3.segment.current), (0, 0), "{conf}");
            assert_eq!(s3.segment.freed, s3.segment.allocated, "{conf}");
        }
    }
}

/// `gpumem_mapping_changes` under `vpool`: every mapping made is one
/// `cuMemMap` of the simulated driver, and after `empty_cache` every one
/// was unmapped too (by fewer `cuMemUnmap` calls, each covering adjacent
/// extents). -1 (`None`) under every other resource and before the first
/// use.
#[test]
fn mapping_changes_are_the_drivers_maps_and_their_unmaps_under_vpool_only() {
    for (kind, conf) in confs() {
        let a = allocator(&conf);
        assert_eq!(a.mapping_changes(0), None, "{conf}: before the first use");
        let sizes = [40 * MIB, 3 * MIB, 100 * MIB, 7 * MIB];
        for round in 0..3 {
            let ptrs: Vec<_> = sizes
                .iter()
                .map(|&n| a.malloc(n + round * MIB, 0, 0))
                .collect();
            for (p, &n) in ptrs.into_iter().zip(&sizes).rev() {
                a.free(p, n + round * MIB, 0, 0);
            }
        }
        a.empty_cache(0);
        let d = sim(&a);
        if kind == ResourceKind::Virtual {
            let maps = d.call_count("cuMemMap");
            assert!(maps > 0 && d.call_count("cuMemUnmap") > 0, "{conf}");
            assert_eq!(a.mapping_changes(0), Some(2 * maps), "{conf}");
        } else {
            assert_eq!(a.mapping_changes(0), None, "{conf}");
        }
    }
}
