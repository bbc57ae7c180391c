//! DeviceBuffer: typed RAII buffers, their copies, and their return to the
//! resource on drop. Runs on the simulated device (backed) or the real GPU.

mod common;

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
