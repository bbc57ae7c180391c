//! The resource suite: the behaviour every memory resource must show, whatever
//! it is built on (RMM's shared resource tests, in spirit). Each check takes the
//! resource under test; `run_all` runs them all.

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc, Mutex};

use gpumem::resource::MemoryResource;
use gpumem::{DevicePtr, Error, Stream};
use rand::{Rng, SeedableRng};

/// Live ranges shared between threads, to prove no two allocations overlap.
#[derive(Default)]
pub struct LiveSet {
    ranges: Mutex<BTreeMap<u64, u64>>,
}

impl LiveSet {
    /// Records `[ptr, ptr+bytes)` and panics if it overlaps a live range.
    pub fn insert(&self, ptr: DevicePtr, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let (start, end) = (ptr.0, ptr.0 + bytes as u64);
        let mut r = self.ranges.lock().unwrap();
        if let Some((&s, &e)) = r.range(..end).next_back() {
            assert!(
                e <= start || s >= end,
                "[{start:#x},{end:#x}) overlaps live [{s:#x},{e:#x})"
            );
        }
        r.insert(start, end);
    }

    /// Forgets a range.
    pub fn remove(&self, ptr: DevicePtr) {
        self.ranges.lock().unwrap().remove(&ptr.0);
    }
}

/// Zero bytes: a null pointer, and freeing it is a no-op.
pub fn zero_bytes<R: MemoryResource>(mr: &R, stream: &Stream) {
    let p = mr.allocate(0, 256, stream).expect("zero-byte allocate");
    assert!(p.is_null(), "zero-byte allocation returns null");
    mr.deallocate(p, 0, 256, stream)
        .expect("freeing a zero-byte allocation");
}

/// Every power-of-two alignment up to 256 is honoured; others are errors.
pub fn alignment<R: MemoryResource>(mr: &R, stream: &Stream) {
    for shift in 0..=8 {
        let align = 1usize << shift;
        for bytes in [1usize, 3, 255, 256, 1000, 4097, 1 << 20] {
            let p = mr.allocate(bytes, align, stream).expect("aligned allocate");
            assert_eq!(
                p.0 % align as u64,
                0,
                "{bytes} bytes at alignment {align}: {p:#x}"
            );
            mr.deallocate(p, bytes, align, stream).unwrap();
        }
    }
    for bad in [0usize, 3, 384, 1000] {
        match mr.allocate(64, bad, stream) {
            Err(Error::BadAlignment { alignment }) => assert_eq!(alignment, bad),
            other => panic!("alignment {bad}: expected BadAlignment, got {other:?}"),
        }
    }
}

/// A 1 PiB request fails cleanly with the requested bytes, and the resource
/// still works afterwards.
pub fn huge_request<R: MemoryResource>(mr: &R, stream: &Stream) {
    let pib = 1usize << 50;
    match mr.allocate(pib, 256, stream) {
        Err(e) => {
            let info = e
                .oom_info()
                .unwrap_or_else(|| panic!("expected OutOfMemory, got {e}"));
            assert_eq!(info.requested, pib);
        }
        Ok(p) => panic!("1 PiB allocation succeeded at {p:#x}"),
    }
    let p = mr
        .allocate(4096, 256, stream)
        .expect("allocation after a failed one");
    mr.deallocate(p, 4096, 256, stream).unwrap();
}

/// Many sizes live at once never overlap; all can be freed.
pub fn sizes_do_not_overlap<R: MemoryResource>(mr: &R, stream: &Stream) {
    let live = LiveSet::default();
    let mut ptrs = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    for _ in 0..300 {
        let bytes = 1usize << rng.random_range(0..22);
        let bytes = bytes + rng.random_range(0..bytes);
        let p = mr.allocate(bytes, 256, stream).unwrap();
        live.insert(p, bytes);
        ptrs.push((p, bytes));
        if rng.random_bool(0.4) {
            let i = rng.random_range(0..ptrs.len());
            let (q, b) = ptrs.swap_remove(i);
            live.remove(q);
            mr.deallocate(q, b, 256, stream).unwrap();
        }
    }
    for (p, b) in ptrs {
        mr.deallocate(p, b, 256, stream).unwrap();
    }
}

/// Eight threads, each with its own stream, allocate and free at random; no
/// two live allocations overlap across threads.
pub fn many_threads_many_streams<R: MemoryResource + 'static>(mr: Arc<R>, streams: Vec<Stream>) {
    let live = Arc::new(LiveSet::default());
    let handles: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(t, stream)| {
            let mr = mr.clone();
            let live = live.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                let mut mine: Vec<(DevicePtr, usize)> = Vec::new();
                for _ in 0..400 {
                    if mine.len() < 32 && (mine.is_empty() || rng.random_bool(0.55)) {
                        let bytes = 256 << rng.random_range(0..12);
                        let p = mr.allocate(bytes, 256, &stream).unwrap();
                        live.insert(p, bytes);
                        mine.push((p, bytes));
                    } else {
                        let (p, b) = mine.swap_remove(rng.random_range(0..mine.len()));
                        live.remove(p);
                        mr.deallocate(p, b, 256, &stream).unwrap();
                    }
                }
                for (p, b) in mine {
                    live.remove(p);
                    mr.deallocate(p, b, 256, &stream).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread");
    }
}

/// One thread allocates on its stream, another frees on a different stream
/// (after waiting for the producer's stream, as correct code does).
pub fn producer_consumer<R: MemoryResource + 'static>(
    mr: Arc<R>,
    producer: Stream,
    consumer: Stream,
) {
    let (tx, rx) = mpsc::channel::<(DevicePtr, usize)>();
    let prod_stream = producer.clone();
    let mr_p = mr.clone();
    let p = std::thread::spawn(move || {
        for i in 0..200usize {
            let bytes = 256 * (1 + i % 64);
            let ptr = mr_p.allocate(bytes, 256, &prod_stream).unwrap();
            tx.send((ptr, bytes)).unwrap();
        }
    });
    let c = std::thread::spawn(move || {
        let live = LiveSet::default();
        for (ptr, bytes) in rx {
            live.insert(ptr, bytes);
            consumer.wait_for(&producer).unwrap();
            live.remove(ptr);
            mr.deallocate(ptr, bytes, 256, &consumer).unwrap();
        }
    });
    p.join().unwrap();
    c.join().unwrap();
}

/// Runs every single-threaded check on one stream (the bad-free matrix
/// among them), then the threaded ones on fresh streams of the resource's
/// device, then the 1 PiB request.
pub fn run_all<R: MemoryResource + 'static>(mr: Arc<R>) {
    checks(mr, true);
}

/// `run_all` without the 1 PiB request: for managed memory on a real GPU, where
/// asking for more managed memory than the card has is not safe to try.
pub fn run_all_but_huge<R: MemoryResource + 'static>(mr: Arc<R>) {
    checks(mr, false);
}

fn checks<R: MemoryResource + 'static>(mr: Arc<R>, huge: bool) {
    let device = mr.device().clone();
    let stream = device.create_stream().unwrap();
    zero_bytes(&*mr, &stream);
    alignment(&*mr, &stream);
    sizes_do_not_overlap(&*mr, &stream);
    super::bad_free::matrix(&*mr, None);
    let streams = (0..8).map(|_| device.create_stream().unwrap()).collect();
    many_threads_many_streams(mr.clone(), streams);
    producer_consumer(
        mr.clone(),
        device.create_stream().unwrap(),
        device.create_stream().unwrap(),
    );
    stream.synchronize().unwrap();
    if huge {
        huge_request(&*mr, &device.create_stream().unwrap());
    }
}
