//! The stream-ordered pool resources (issue 6) on the simulated device or,
//! with GPUMEM_DEVICE=cuda, the real GPU. Assertions on reserved memory are
//! relations, not exact sizes: the CUDA driver reserves in its own granularity.

mod common;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use common::suite;
use gpumem::async_pool::{
    ipc, AsyncManagedResource, AsyncResource, AsyncResourceConfig, AsyncViewResource, ReusePolicy,
};
use gpumem::driver::sim::SimConfig;
use gpumem::driver::{AccessFlags, HandleType, Location, PoolPtrExport};
use gpumem::pool::Pool;
use gpumem::resource::{DeviceResource, MemoryResource, Properties};
use gpumem::{Backend, Device, DeviceBuffer, Error, FreeError};

const MIB: usize = 1 << 20;

fn unsupported_feature(r: Result<impl std::fmt::Debug, Error>) -> String {
    match r {
        Err(Error::Unsupported { feature }) => feature,
        other => panic!("expected Error::Unsupported, got {other:?}"),
    }
}

#[test]
fn default_pool_passes_the_suite() {
    let (device, _) = common::device(false);
    let mr = AsyncResource::default_pool(device).unwrap();
    assert!(
        !mr.is_owned(),
        "the default pool is never destroyed by gpumem"
    );
    assert_eq!(mr.properties(), Properties::DEVICE);
    suite::run_all(Arc::new(mr));
}

#[test]
fn custom_pool_passes_the_suite() {
    let (device, _) = common::device(false);
    let mut config = AsyncResourceConfig::default();
    config.initial_size = 32 * MIB;
    let mr = AsyncResource::new(device, config).unwrap();
    assert!(mr.is_owned());
    assert_eq!(
        mr.release_threshold().unwrap(),
        u64::MAX,
        "keeps everything by default"
    );
    assert!(mr.reserved_current().unwrap() >= 32 * MIB, "primed");
    assert_eq!(mr.used_current().unwrap(), 0, "priming frees what it took");
    suite::run_all(Arc::new(mr));
}

#[test]
fn view_of_a_pool_passes_the_suite_and_leaves_the_pool_alone() {
    let (device, _) = common::device(false);
    let owner = AsyncResource::with_defaults(device.clone()).unwrap();
    // SAFETY: `owner` outlives both views and their allocations.
    let view =
        || unsafe { AsyncViewResource::new(device.clone(), owner.raw(), Properties::DEVICE) };
    let first = view().unwrap();
    assert!(!first.is_owned());
    suite::run_all(Arc::new(view().unwrap()));
    let view = first;
    drop(view);
    // The pool survived the views.
    let s = device.create_stream().unwrap();
    let p = owner.allocate(MIB, 256, &s).unwrap();
    owner.deallocate(p, MIB, 256, &s).unwrap();
    s.synchronize().unwrap();

    let current = AsyncViewResource::current(device.clone()).unwrap();
    let p = current.allocate(4096, 256, &s).unwrap();
    current.deallocate(p, 4096, 256, &s).unwrap();
    s.synchronize().unwrap();
    let default = AsyncViewResource::default_pool(device).unwrap();
    assert!(!default.is_owned());
}

#[test]
fn attributes_read_back_what_was_set() {
    let (device, _) = common::device(false);
    let mut config = AsyncResourceConfig::default();
    config.release_threshold = 8 * MIB as u64;
    let mr = AsyncResource::new(device, config).unwrap();
    assert_eq!(mr.release_threshold().unwrap(), 8 * MIB as u64);
    mr.set_release_threshold(u64::MAX).unwrap();
    assert_eq!(mr.release_threshold().unwrap(), u64::MAX);
    mr.set_release_threshold(0).unwrap();
    assert_eq!(mr.release_threshold().unwrap(), 0);
    for policy in ReusePolicy::ALL {
        assert!(
            mr.reuse_policy(policy).unwrap(),
            "{policy:?} is on by default"
        );
        mr.set_reuse_policy(policy, false).unwrap();
        assert!(!mr.reuse_policy(policy).unwrap(), "{policy:?} off");
        mr.set_reuse_policy(policy, true).unwrap();
        assert!(mr.reuse_policy(policy).unwrap(), "{policy:?} on again");
    }
}

#[test]
fn trim_returns_unused_memory() {
    let (device, _) = common::device(false);
    let mut config = AsyncResourceConfig::default();
    config.initial_size = 64 * MIB;
    let mr = AsyncResource::new(device.clone(), config).unwrap();
    let s = device.create_stream().unwrap();
    let keep = mr.allocate(8 * MIB, 256, &s).unwrap();
    let ptrs: Vec<_> = (0..4)
        .map(|_| mr.allocate(8 * MIB, 256, &s).unwrap())
        .collect();
    for p in ptrs {
        mr.deallocate(p, 8 * MIB, 256, &s).unwrap();
    }
    s.synchronize().unwrap();
    let before = mr.reserved_current().unwrap();
    assert!(
        before >= 64 * MIB,
        "threshold u64::MAX keeps the primed memory: {before}"
    );
    let back = mr.trim(0).unwrap();
    let after = mr.reserved_current().unwrap();
    assert!(
        after < before,
        "trim(0) returned memory: {before} -> {after}"
    );
    assert_eq!(back, before - after, "trim says what it gave back");
    assert!(
        after >= 8 * MIB,
        "a live allocation's memory stays: {after}"
    );
    assert!(mr.used_current().unwrap() >= 8 * MIB);
    mr.deallocate(keep, 8 * MIB, 256, &s).unwrap();
    s.synchronize().unwrap();
    mr.trim(0).unwrap();
    assert_eq!(mr.used_current().unwrap(), 0);
    assert!(
        mr.reserved_current().unwrap() < after,
        "nothing live: trimmed further"
    );
}

#[test]
fn release_threshold_decides_what_synchronize_keeps() {
    let (device, _) = common::device(false);
    let s = device.create_stream().unwrap();
    let keep_all = AsyncResource::with_defaults(device.clone()).unwrap();
    let p = keep_all.allocate(32 * MIB, 256, &s).unwrap();
    keep_all.deallocate(p, 32 * MIB, 256, &s).unwrap();
    device.synchronize().unwrap();
    assert!(
        keep_all.reserved_current().unwrap() >= 32 * MIB,
        "kept across synchronize"
    );

    let mut config = AsyncResourceConfig::default();
    config.release_threshold = 0;
    let keep_none = AsyncResource::new(device.clone(), config).unwrap();
    let p = keep_none.allocate(32 * MIB, 256, &s).unwrap();
    assert!(keep_none.reserved_current().unwrap() >= 32 * MIB);
    keep_none.deallocate(p, 32 * MIB, 256, &s).unwrap();
    s.synchronize().unwrap();
    device.synchronize().unwrap();
    assert!(
        keep_none.reserved_current().unwrap() < 32 * MIB,
        "threshold 0 gives memory back at synchronize"
    );
}

#[test]
fn highs_track_peaks_and_reset_to_current() {
    let (device, _) = common::device(false);
    let mr = AsyncResource::with_defaults(device.clone()).unwrap();
    let s = device.create_stream().unwrap();
    let a = mr.allocate(16 * MIB, 256, &s).unwrap();
    let b = mr.allocate(16 * MIB, 256, &s).unwrap();
    let u = mr.usage().unwrap();
    assert!(u.live >= 32 * MIB && u.peak_live >= u.live, "{u:?}");
    assert!(
        u.reserved >= u.live && u.peak_reserved >= u.reserved,
        "{u:?}"
    );
    mr.deallocate(a, 16 * MIB, 256, &s).unwrap();
    mr.deallocate(b, 16 * MIB, 256, &s).unwrap();
    s.synchronize().unwrap();
    let u = mr.usage().unwrap();
    assert_eq!(u.live, 0, "{u:?}");
    assert!(u.peak_live >= 32 * MIB, "the peak is remembered: {u:?}");
    // CUDA documents the highs as reset by writing zero; what a reset high
    // reads before the next change is the current value or less.
    mr.reset_used_high().unwrap();
    assert!(mr.used_high().unwrap() <= mr.used_current().unwrap());

    mr.trim(0).unwrap();
    let u = mr.usage().unwrap();
    assert!(
        u.peak_reserved >= 32 * MIB && u.peak_reserved > u.reserved,
        "{u:?}"
    );
    mr.reset_reserved_high().unwrap();
    let high = mr.reserved_high().unwrap();
    assert!(
        high <= mr.reserved_current().unwrap() && high < u.peak_reserved,
        "{high}"
    );
    // The high follows new growth after a reset.
    let c = mr.allocate(8 * MIB, 256, &s).unwrap();
    assert!(mr.reserved_high().unwrap() >= 8 * MIB);
    assert!(mr.used_high().unwrap() >= 8 * MIB);
    mr.deallocate(c, 8 * MIB, 256, &s).unwrap();
    s.synchronize().unwrap();
}

#[test]
fn max_reserved_of_zero_is_refused_not_taken_for_no_limit() {
    let (device, _) = common::device(false);
    let mut config = AsyncResourceConfig::default();
    config.max_reserved = Some(0);
    let err = AsyncResource::new(device, config).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
}

#[test]
fn max_reserved_bounds_the_pool_with_numbers() {
    let (device, _) = common::device(false);
    let mut config = AsyncResourceConfig::default();
    config.max_reserved = Some(64 * MIB);
    let mr = AsyncResource::new(device.clone(), config).unwrap();
    assert_eq!(mr.max_reserved(), Some(64 * MIB));
    let s = device.create_stream().unwrap();
    let a = mr.allocate(32 * MIB, 256, &s).unwrap();
    let err = mr.allocate(64 * MIB, 256, &s).unwrap_err();
    let info = err
        .oom_info()
        .unwrap_or_else(|| panic!("expected OutOfMemory, got {err}"));
    assert_eq!(info.requested, 64 * MIB);
    assert_eq!(info.device, Some(device.ordinal()));
    assert_eq!(info.limit, Some(64 * MIB));
    let reserved = info.reserved.expect("reserved bytes reported");
    assert!(
        (32 * MIB..=64 * MIB).contains(&reserved),
        "reserved {reserved}"
    );
    mr.deallocate(a, 32 * MIB, 256, &s).unwrap();
    s.synchronize().unwrap();
    mr.trim(0).unwrap();
    // Room again once freed and trimmed.
    let b = mr.allocate(48 * MIB, 256, &s).unwrap();
    mr.deallocate(b, 48 * MIB, 256, &s).unwrap();
    s.synchronize().unwrap();
}

#[test]
fn huge_request_reports_reserved_and_device() {
    let (device, _) = common::device(false);
    let mut config = AsyncResourceConfig::default();
    config.initial_size = 4 * MIB;
    let mr = AsyncResource::new(device.clone(), config).unwrap();
    let s = device.create_stream().unwrap();
    let err = mr.allocate(1 << 50, 256, &s).unwrap_err();
    let info = err
        .oom_info()
        .unwrap_or_else(|| panic!("expected OutOfMemory, got {err}"));
    assert_eq!(info.requested, 1 << 50);
    assert_eq!(info.device, Some(device.ordinal()));
    // Reserved bytes at the failure (the driver may have released its cache
    // trying to make room, so no lower bound).
    assert!(info.reserved.is_some());
}

#[test]
fn bad_builds_are_errors() {
    let (device, _) = common::device(false);
    let n = device.driver().device_count().unwrap();
    let bad = |edit: &dyn Fn(&mut AsyncResourceConfig)| {
        let mut config = AsyncResourceConfig::default();
        edit(&mut config);
        AsyncResource::new(device.clone(), config)
    };
    assert!(matches!(
        bad(&|c| c.location = Some(Location::Device(n))),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        bad(&|c| {
            c.max_reserved = Some(MIB);
            c.initial_size = 2 * MIB;
        }),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        bad(&|c| {
            c.location = Some(Location::Host);
            c.handle_type = HandleType::PosixFd;
        }),
        Err(Error::InvalidArgument(_))
    ));
    let mr = AsyncResource::with_defaults(device.clone()).unwrap();
    let s = device.create_stream().unwrap();
    assert!(matches!(
        mr.allocate(64, 512, &s),
        Err(Error::AlignmentTooLarge { .. })
    ));
    assert!(
        matches!(mr.export_fd(), Err(Error::InvalidArgument(_))),
        "not exportable"
    );
    let p = mr.allocate(4096, 256, &s).unwrap();
    assert!(matches!(
        mr.export_pointer(p),
        Err(Error::InvalidArgument(_))
    ));
    mr.deallocate(p, 4096, 256, &s).unwrap();
    s.synchronize().unwrap();
}

#[test]
fn missing_memory_pools_are_unsupported_not_panics() {
    let mut config = SimConfig::default();
    config.memory_pools = false;
    let device = Device::sim(config);
    let f = unsupported_feature(AsyncResource::with_defaults(device.clone()));
    assert!(f.contains("memory pools"), "{f}");
    let f = unsupported_feature(AsyncResource::default_pool(device.clone()));
    assert!(f.contains("memory pools"), "{f}");
    let f = unsupported_feature(AsyncViewResource::current(device.clone()));
    assert!(f.contains("memory pools"), "{f}");
    let f = unsupported_feature(AsyncManagedResource::with_defaults(device.clone()));
    assert!(f.contains("memory pools"), "{f}");
    let fd = std::fs::File::open("/dev/null").unwrap();
    let f = unsupported_feature(AsyncResource::import_fd(device, fd.as_fd()));
    assert!(f.contains("memory pools"), "{f}");
}

#[test]
fn missing_ipc_and_managed_support_are_unsupported() {
    let mut config = SimConfig::default();
    config.posix_fd_ipc = false;
    config.managed_memory = false;
    let device = Device::sim(config);
    let mut config = AsyncResourceConfig::default();
    config.handle_type = HandleType::PosixFd;
    let f = unsupported_feature(AsyncResource::new(device.clone(), config));
    assert!(f.contains("POSIX file descriptor"), "{f}");
    let fd = std::fs::File::open("/dev/null").unwrap();
    let f = unsupported_feature(AsyncResource::import_fd(device.clone(), fd.as_fd()));
    assert!(f.contains("POSIX file descriptor"), "{f}");
    let f = unsupported_feature(AsyncManagedResource::with_defaults(device.clone()));
    assert!(f.contains("managed"), "{f}");
    // Plain pools still work on that device.
    AsyncResource::with_defaults(device).unwrap();
}

#[test]
fn managed_pool_where_supported() {
    let (device, _) = common::device(false);
    let mr = match AsyncManagedResource::with_defaults(device.clone()) {
        Ok(mr) => mr,
        Err(Error::Unsupported { feature }) => {
            eprintln!("managed pools unsupported here: {feature}");
            assert_eq!(
                device.backend(),
                Backend::Cuda,
                "the simulator has managed pools"
            );
            return;
        }
        Err(e) => panic!("managed pool: {e}"),
    };
    assert_eq!(mr.properties(), Properties::HOST_AND_DEVICE);
    assert_eq!(mr.release_threshold().unwrap(), u64::MAX);
    if device.backend() == Backend::Cuda {
        suite::run_all_but_huge(Arc::new(mr));
    } else {
        suite::run_all(Arc::new(mr));
    }
}

#[test]
fn own_device_access_is_read_write_and_fixed() {
    let (device, _) = common::device(false);
    let mr = AsyncResource::with_defaults(device.clone()).unwrap();
    let me = device.ordinal();
    assert_eq!(mr.access(me).unwrap(), AccessFlags::ReadWrite);
    mr.grant_access(me, AccessFlags::ReadWrite).unwrap();
    assert!(matches!(
        mr.grant_access(me, AccessFlags::Read),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        mr.grant_access(me, AccessFlags::None),
        Err(Error::InvalidArgument(_))
    ));
    let n = device.driver().device_count().unwrap();
    assert!(matches!(
        mr.grant_access(n, AccessFlags::ReadWrite),
        Err(Error::NoSuchDevice { .. })
    ));
    assert!(matches!(mr.access(n), Err(Error::NoSuchDevice { .. })));
}

#[test]
fn peer_access_on_two_simulated_devices() {
    let mut config = SimConfig::default();
    config.devices = 2;
    let device = Device::sim(config);
    let mr = AsyncResource::with_defaults(device.clone()).unwrap();
    assert_eq!(
        mr.access(1).unwrap(),
        AccessFlags::None,
        "no peer access by default"
    );
    mr.grant_access(1, AccessFlags::Read).unwrap();
    assert_eq!(mr.access(1).unwrap(), AccessFlags::Read);
    mr.grant_access(1, AccessFlags::ReadWrite).unwrap();
    assert_eq!(mr.access(1).unwrap(), AccessFlags::ReadWrite);
    mr.grant_access(1, AccessFlags::None).unwrap();
    assert_eq!(mr.access(1).unwrap(), AccessFlags::None);

    // A pool of device 1, reached from device 0.
    let d1 = device.sibling(1).unwrap();
    let mr1 = AsyncResource::with_defaults(d1.clone()).unwrap();
    mr1.grant_access(0, AccessFlags::ReadWrite).unwrap();
    assert_eq!(mr1.access(0).unwrap(), AccessFlags::ReadWrite);
    assert_eq!(mr1.access(1).unwrap(), AccessFlags::ReadWrite);
    let s = d1.create_stream().unwrap();
    let p = mr1.allocate(MIB, 256, &s).unwrap();
    mr1.deallocate(p, MIB, 256, &s).unwrap();
    s.synchronize().unwrap();
}

#[test]
fn peer_access_on_the_real_devices_when_there_are_two() {
    let (device, _) = common::device(false);
    let n = device.driver().device_count().unwrap();
    let me = device.ordinal();
    let Some(peer) = (0..n).find(|&d| d != me) else {
        eprintln!("one device: peer access has no peer to test");
        return;
    };
    let mr = AsyncResource::with_defaults(device.clone()).unwrap();
    match mr.grant_access(peer, AccessFlags::ReadWrite) {
        Ok(()) => assert_eq!(mr.access(peer).unwrap(), AccessFlags::ReadWrite),
        Err(Error::Unsupported { feature }) => eprintln!("no peer access: {feature}"),
        Err(e) => panic!("grant_access: {e}"),
    }
}

#[test]
fn fd_passing_over_a_unix_socket() {
    let (a, b) = UnixStream::pair().unwrap();
    let file = tempfile_with(b"hello through SCM_RIGHTS");
    ipc::send_fd(&a, file.as_fd(), b"payload").unwrap();
    let mut buf = [0u8; 64];
    let (fd, n) = ipc::recv_fd(&b, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"payload");
    let mut text = String::new();
    use std::io::{Read, Seek};
    let mut f = std::fs::File::from(fd);
    f.rewind().unwrap();
    f.read_to_string(&mut text).unwrap();
    assert_eq!(text, "hello through SCM_RIGHTS");
    assert!(
        ipc::send_fd(&a, file.as_fd(), b"").is_err(),
        "empty payload refused"
    );
    drop(a);
    assert!(
        ipc::recv_fd(&b, &mut buf).is_err(),
        "closed peer is an error"
    );
}

fn tempfile_with(bytes: &[u8]) -> std::fs::File {
    use std::io::Write;
    let path = std::env::temp_dir().join(format!(
        "gpumem-async-pool-test-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let _ = std::fs::remove_file(&path);
    f.write_all(bytes).unwrap();
    f
}

#[test]
fn export_and_import_within_one_process() {
    let (device, sim) = common::device(true);
    // CUDA shares pools between processes, not within one: the two-process
    // example `ipc_pool` covers the real GPU.
    let Some(_sim) = common::sim_only(sim, "export_and_import_within_one_process") else {
        return;
    };
    let mut config = AsyncResourceConfig::default();
    config.handle_type = HandleType::PosixFd;
    let mr = AsyncResource::new(device.clone(), config).unwrap();
    assert_eq!(mr.handle_type(), HandleType::PosixFd);
    let stream = device.create_stream().unwrap();
    let pattern = common::random_bytes(3 * MIB + 17, 6);
    let buf = DeviceBuffer::from_slice(&pattern, &mr, &stream).unwrap();
    stream.synchronize().unwrap();

    // The exporter's side: the pool as a descriptor, the allocation as 64 bytes.
    let fd = mr.export_fd().unwrap();
    let export = mr.export_pointer(buf.as_device_ptr()).unwrap();
    assert!(matches!(
        mr.export_pointer(gpumem::DevicePtr::NULL),
        Err(Error::InvalidArgument(_))
    ));
    let (tx, rx) = UnixStream::pair().unwrap();
    ipc::send_fd(&tx, fd.as_fd(), &export.0).unwrap();
    drop(fd);

    // The importer's side.
    let mut data = [0u8; 64];
    let (fd, n) = ipc::recv_fd(&rx, &mut data).unwrap();
    assert_eq!(n, 64);
    let imported = AsyncResource::import_fd(device.clone(), fd.as_fd()).unwrap();
    drop(fd);
    let ptr = imported.import_pointer(&PoolPtrExport(data)).unwrap();
    let copy =
        DeviceBuffer::<u8, _>::new(pattern.len(), DeviceResource::new(device.clone()), &stream)
            .unwrap();
    // SAFETY: both ranges are device memory (the imported allocation of a
    // device-located pool, and a DeviceResource buffer); no host memory is
    // involved, which is all the contract restricts.
    unsafe {
        device
            .driver()
            .memcpy_dtod_async(copy.as_device_ptr(), ptr, pattern.len(), stream.raw())
            .unwrap();
    }
    assert_eq!(
        copy.to_vec().unwrap(),
        pattern,
        "the importer sees the exporter's bytes"
    );
    assert!(
        imported.import_pointer(&PoolPtrExport([7; 64])).is_err(),
        "garbage export data is an error"
    );
    // Only what the pool imported is freed, and once.
    let refused = |p: gpumem::DevicePtr| match imported.free_pointer(p, &stream) {
        Err(Error::InvalidFree { reason, .. }) => reason,
        other => panic!("{p:?}: expected a refused free, got {other:?}"),
    };
    assert_eq!(refused(copy.as_device_ptr()), FreeError::Unknown);
    imported.free_pointer(ptr, &stream).unwrap();
    assert_eq!(refused(ptr), FreeError::DoubleFree);
    stream.synchronize().unwrap();
    drop(imported);

    // The exporter frees after the importer.
    drop(buf);
    stream.synchronize().unwrap();
    assert_eq!(mr.used_current().unwrap(), 0);
}
