//! DeviceBuffer: typed RAII buffers, their copies, and their return to the
//! resource on drop. Runs on the simulated device (backed) or the real GPU.

mod common;

use std::sync::Arc;

use gpumem::buffer::across_devices;
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::resource::DeviceResource;
use gpumem::{DeviceBuffer, Error};

#[test]
fn round_trip_equals_random_input() {
    let (device, _) = common::device(true);
    let stream = device.create_stream().unwrap();
    let mr = DeviceResource::new(device.clone());
    for (n, seed) in [(1usize, 1u64), (1000, 2), (3 << 20, 3)] {
        let input = common::random_bytes(n, seed);
        let buf = DeviceBuffer::from_slice(&input, &mr, &stream).unwrap();
        assert_eq!(buf.len(), n);
        assert_eq!(buf.to_vec().unwrap(), input, "{n} bytes");
    }
    // Wider element types go through the same bytes.
    let words: Vec<u64> = common::random_bytes(8 * 4096, 9)
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let buf = DeviceBuffer::from_slice(&words, &mr, &stream).unwrap();
    assert_eq!(buf.size_bytes(), 8 * 4096);
    assert_eq!(buf.as_device_ptr().0 % 256, 0);
    assert_eq!(buf.to_vec().unwrap(), words);
}

#[test]
fn zeroed_and_device_to_device_copy() {
    let (device, _) = common::device(true);
    let stream = device.create_stream().unwrap();
    let mr = DeviceResource::new(device.clone());
    let z = DeviceBuffer::<u32, _>::zeroed(5000, &mr, &stream).unwrap();
    assert!(z.to_vec().unwrap().iter().all(|&x| x == 0));
    let data: Vec<u32> = (0..5000).map(|i| i * 7 + 1).collect();
    let src = DeviceBuffer::from_slice(&data, &mr, &stream).unwrap();
    let mut dst = DeviceBuffer::<u32, _>::new(5000, &mr, &stream).unwrap();
    dst.copy_from_device(&src).unwrap();
    assert_eq!(dst.to_vec().unwrap(), data);
    // Async copies with the caller keeping host memory alive until a sync.
    let mut back = vec![0u32; 5000];
    // SAFETY: `back` is neither touched nor dropped before the synchronize below.
    unsafe { dst.copy_to_host_async(&mut back).unwrap() };
    stream.synchronize().unwrap();
    assert_eq!(back, data);
}

#[test]
fn length_mismatch_and_overflow_are_errors() {
    let (device, _) = common::device(true);
    let stream = device.create_stream().unwrap();
    let mr = DeviceResource::new(device.clone());
    let mut buf = DeviceBuffer::<u8, _>::new(10, &mr, &stream).unwrap();
    assert!(matches!(
        buf.copy_from_host(&[0u8; 11]),
        Err(Error::InvalidArgument(_))
    ));
    let mut small = [0u8; 9];
    assert!(matches!(
        buf.copy_to_host(&mut small),
        Err(Error::InvalidArgument(_))
    ));
    let err = DeviceBuffer::<u64, _>::new(usize::MAX / 4, &mr, &stream).unwrap_err();
    assert!(err.is_oom(), "{err}");
    let empty = DeviceBuffer::<u32, _>::new(0, &mr, &stream).unwrap();
    assert!(empty.is_empty() && empty.as_device_ptr().is_null());
    assert_eq!(empty.to_vec().unwrap(), Vec::<u32>::new());
}

#[test]
fn drop_returns_memory_to_the_resource() {
    let (device, sim) = common::device(true);
    let Some(sim) = common::sim_only(sim, "drop_returns_memory") else {
        return;
    };
    let stream = device.create_stream().unwrap();
    let mr = DeviceResource::new(device.clone());
    let before = sim.device_bytes(0);
    {
        let _a = DeviceBuffer::<f32, _>::zeroed(1 << 16, &mr, &stream).unwrap();
        assert!(sim.device_bytes(0) >= before + (1 << 18));
    }
    assert_eq!(sim.device_bytes(0), before);
}

/// Two backed devices (simulated by default), reaching each other or not.
fn two_backed(
    peer_access: bool,
) -> Option<(gpumem::Device, gpumem::Device, Option<Arc<SimDriver>>)> {
    let mut config = SimConfig::backed(160 << 20);
    config.peer_access = peer_access;
    common::two_devices(config)
}

#[test]
fn a_copy_between_devices_is_a_peer_copy_where_they_reach_each_other() {
    let Some((d0, d1, sim)) = two_backed(true) else {
        return;
    };
    if !d1
        .driver()
        .can_access_peer(d1.ordinal(), d0.ordinal())
        .unwrap()
    {
        eprintln!("the two GPUs cannot reach each other: no peer copy to test");
        return;
    }
    let (s0, s1) = (d0.create_stream().unwrap(), d1.create_stream().unwrap());
    let (mr0, mr1) = (
        DeviceResource::new(d0.clone()),
        DeviceResource::new(d1.clone()),
    );
    let data: Vec<u32> = (0..300_000).map(|i| i * 3 + 1).collect();
    let src = DeviceBuffer::from_slice(&data, &mr0, &s0).unwrap();
    let mut dst = DeviceBuffer::<u32, _>::zeroed(data.len(), &mr1, &s1).unwrap();
    let peer_copies = sim.as_ref().map(|s| s.call_count("cuMemcpyPeerAsync"));
    dst.copy_from_device(&src).unwrap();
    assert_eq!(dst.to_vec().unwrap(), data, "the bytes arrived on device 1");
    if let Some(sim) = &sim {
        assert_eq!(
            Some(sim.call_count("cuMemcpyPeerAsync")),
            peer_copies.map(|n| n + 1)
        );
        assert!(sim.peer_access_enabled(1, 0), "enabled on first use");
        assert_eq!(sim.pinned_host_bytes(), 0, "nothing staged");
        assert!(sim.peer_violations().is_empty());
    }
    // And back, into device 0.
    let mut back = DeviceBuffer::<u32, _>::zeroed(data.len(), &mr0, &s0).unwrap();
    s0.wait_for(&s1).unwrap();
    back.copy_from_device(&dst).unwrap();
    assert_eq!(back.to_vec().unwrap(), data);
}

#[test]
fn a_copy_between_devices_that_cannot_reach_each_other_is_staged() {
    let Some((d0, d1, sim)) = two_backed(false) else {
        return;
    };
    let Some(sim) = common::sim_only(sim, "staged copy between devices") else {
        return;
    };
    let (s0, s1) = (d0.create_stream().unwrap(), d1.create_stream().unwrap());
    let (mr0, mr1) = (
        DeviceResource::new(d0.clone()),
        DeviceResource::new(d1.clone()),
    );
    // More than one bounce buffer's worth, and not a multiple of it.
    let n = across_devices::STAGE_CHUNK + 3 * 4096 + 100;
    let data = common::random_bytes(n, 11);
    let src = DeviceBuffer::from_slice(&data, &mr0, &s0).unwrap();
    let mut dst = DeviceBuffer::<u8, _>::zeroed(n, &mr1, &s1).unwrap();
    let (out, into) = (
        sim.call_count("cuMemcpyDtoHAsync"),
        sim.call_count("cuMemcpyHtoDAsync"),
    );
    dst.copy_from_device(&src).unwrap();
    assert_eq!(
        sim.call_count("cuMemcpyDtoHAsync"),
        out + 2,
        "two chunks out"
    );
    assert_eq!(
        sim.call_count("cuMemcpyHtoDAsync"),
        into + 2,
        "two chunks in"
    );
    assert_eq!(sim.call_count("cuMemcpyPeerAsync"), 0);
    assert_eq!(sim.pinned_host_bytes(), 0, "the bounce buffer went back");
    assert!(
        sim.peer_violations().is_empty(),
        "{:?}",
        sim.peer_violations()
    );
    assert_eq!(dst.to_vec().unwrap(), data, "the bytes arrived on device 1");
}

/// A buffer's copies and free run on its stream against its resource's
/// memory: a stream of another device or another driver instance is refused,
/// and nothing is allocated.
#[test]
fn a_stream_of_another_device_is_refused() {
    let mut config = SimConfig::backed(64 << 20);
    config.devices = 2;
    let (d0, sim) = gpumem::Device::sim_with_driver(config);
    let d1 = d0.sibling(1).unwrap();
    let other = gpumem::Device::sim(SimConfig::backed(64 << 20));
    let mr = DeviceResource::new(d0.clone());
    let s0 = d0.create_stream().unwrap();
    let base = sim.device_bytes(0);
    for stream in [d1.create_stream().unwrap(), other.create_stream().unwrap()] {
        let e = DeviceBuffer::from_slice(&[2u32; 1024], &mr, &stream).unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(_)) && e.to_string().contains("device 0"),
            "{e}"
        );
        let mut b = DeviceBuffer::from_slice(&[1u32; 16], &mr, &s0).unwrap();
        assert!(b.set_stream(&stream).is_err());
        assert!(
            b.stream().device().same_as(&d0),
            "the buffer kept its stream"
        );
        assert_eq!(b.to_vec().unwrap(), [1u32; 16]);
    }
    assert_eq!(sim.device_bytes(0), base, "nothing left allocated");
}
