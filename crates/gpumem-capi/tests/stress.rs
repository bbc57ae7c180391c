//! Concurrent stress through the C ABI, for every resource `GPUMEM_CONF`
//! can choose, held to a small `max_size`.
//!
//! 16 threads, each with its own stream handle (as PyTorch passes them),
//! call [`Allocator::malloc`] for log-uniform sizes (256 B to 512 KiB), fill
//! each block with a pattern naming its thread and number, and hand it to
//! the next thread, which reads it back in full and frees it with the size
//! and stream it was allocated with. Out-of-memory (NULL) comes often and
//! concurrently. A changed pattern means two live blocks shared memory.
//! Afterwards `allocated_bytes` is 0 and no bad free was counted.
//!
//! The simulated device is backed by host memory, so the bytes are real;
//! `GPUMEM_DEVICE=cuda` runs the same on the GPU, and `GPUMEM_STRESS_SECS`
//! sets the seconds per resource (default 1).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::Driver;
use gpumem::DevicePtr;
use gpumem_capi::conf::parse;
use gpumem_capi::{Allocator, Backend};
use rand::{Rng, SeedableRng};

#[path = "../../gpumem/tests/common/pattern.rs"]
mod pattern;
use pattern::{pattern, seconds, Figures};

const THREADS: usize = 16;
const HELD: usize = 8;
const DEV: i32 = 0;

/// A block in flight: pointer, bytes, allocating stream, pattern seed.
struct Block {
    ptr: DevicePtr,
    bytes: usize,
    stream: u64,
    seed: u64,
}

/// The backend and its driver: a backed simulated device, or the GPU.
fn backend() -> (Backend, Arc<dyn Driver>) {
    if std::env::var("GPUMEM_DEVICE").as_deref() == Ok("cuda") {
        let d = gpumem::Device::cuda(0).expect("GPUMEM_DEVICE=cuda needs a GPU");
        return (Backend::Cuda, d.driver().clone());
    }
    let sim = Arc::new(SimDriver::new(SimConfig::backed(256 << 20)));
    (Backend::Sim(sim.clone()), sim)
}

fn write(driver: &dyn Driver, b: &Block) {
    let data = pattern(b.seed, b.bytes);
    // SAFETY: `data` lives until the stream is synchronized just below, and
    // nothing else touches it; the device range is the block just allocated.
    unsafe {
        driver
            .memcpy_htod_async(b.ptr, data.as_ptr(), b.bytes, b.stream)
            .expect("copy to device");
    }
    // SAFETY: the block's stream is one of the test's live streams.
    unsafe { driver.stream_synchronize(b.stream) }.expect("synchronize");
}

fn check(driver: &dyn Driver, b: &Block, fig: &Figures) {
    let mut got = vec![0u8; b.bytes];
    // SAFETY: `got` lives until the stream is synchronized just below and is
    // not read before; the device range is a live block of `b.bytes`.
    unsafe {
        driver
            .memcpy_dtoh_async(got.as_mut_ptr(), b.ptr, b.bytes, b.stream)
            .expect("copy to host");
    }
    // SAFETY: as in `write`.
    unsafe { driver.stream_synchronize(b.stream) }.expect("synchronize");
    assert!(
        got == pattern(b.seed, b.bytes),
        "block {:#x} ({} bytes) was overwritten: two live blocks shared memory",
        b.ptr.0,
        b.bytes
    );
    fig.verified(b.bytes);
}

struct Shared {
    a: Allocator,
    driver: Arc<dyn Driver>,
    until: Instant,
    fig: Figures,
}

impl Shared {
    fn check_and_free(&self, b: Block) {
        check(&*self.driver, &b, &self.fig);
        self.a.free(b.ptr, b.bytes, DEV, b.stream);
        self.fig.op();
    }
}

fn worker(t: usize, sh: &Shared, inbox: Receiver<Block>, next: Sender<Block>, stream: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
    let mut held: Vec<Block> = Vec::new();
    let mut n = 0u64;
    while Instant::now() < sh.until {
        while let Ok(b) = inbox.try_recv() {
            sh.check_and_free(b);
        }
        if held.len() >= HELD || rng.random_bool(0.3) {
            if let Some(b) = held.pop() {
                if let Err(e) = next.send(b) {
                    sh.check_and_free(e.0);
                }
            }
            continue;
        }
        let bytes = 2f64.powf(rng.random_range(8.0..19.0)) as usize;
        let ptr = sh.a.malloc(bytes, DEV, stream);
        if ptr.is_null() {
            sh.fig.oom();
            match held.pop() {
                Some(b) => sh.check_and_free(b),
                None => std::thread::yield_now(),
            }
            continue;
        }
        n += 1;
        let b = Block {
            ptr,
            bytes,
            stream,
            seed: (t as u64) << 40 | n,
        };
        write(&*sh.driver, &b);
        held.push(b);
        sh.fig.op();
    }
    drop(next);
    for b in held {
        sh.check_and_free(b);
    }
    for b in inbox {
        sh.check_and_free(b);
    }
}

fn stress(kind: &str) {
    let secs = seconds();
    let text = format!("resource={kind},max_size=16MiB");
    let parsed = parse(&text);
    assert_eq!(parsed.error(), None);
    let (backend, driver) = backend();
    let streams: Vec<u64> = (0..THREADS)
        .map(|_| driver.stream_create(DEV as u32, true).unwrap())
        .collect();
    let start = Instant::now();
    let sh = Arc::new(Shared {
        a: Allocator::new(parsed.conf, backend),
        driver: driver.clone(),
        until: start + Duration::from_secs_f64(secs),
        fig: Figures::default(),
    });
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| channel()).unzip();
    let mut handles = Vec::new();
    for (t, inbox) in receivers.into_iter().enumerate() {
        let next = senders[(t + 1) % THREADS].clone();
        let (sh, s) = (sh.clone(), streams[t]);
        handles.push(std::thread::spawn(move || worker(t, &sh, inbox, next, s)));
    }
    drop(senders);
    for h in handles {
        h.join().expect("a stress thread panicked");
    }
    let elapsed = start.elapsed().as_secs_f64();
    sh.fig.report(&format!("C ABI {text}"), THREADS, elapsed);
    assert_eq!(
        sh.a.allocated_bytes(DEV),
        0,
        "{kind}: bytes still allocated"
    );
    assert_eq!(sh.a.bad_free_count(DEV), 0, "{kind}: bad frees");
    let held = sh.a.reserved_bytes(DEV);
    let given = sh.a.empty_cache(DEV);
    if kind != "arena" && kind != "cuda" {
        // Everything held goes back.
        assert_eq!((given, sh.a.reserved_bytes(DEV)), (held, 0), "{kind}");
        // gpumem's pools keep their memory until asked; CUDA's pool may have
        // given it all back at a synchronize already (its chunks are larger
        // than the 16 MiB release threshold this limit sets).
        assert!(held > 0 || kind == "async", "{kind}: nothing was cached");
    }
    drop(sh);
    for s in streams {
        // SAFETY: the test's streams, destroyed once, after the allocator that used them is dropped.
        unsafe { driver.stream_destroy(s) }.unwrap();
    }
}

macro_rules! stress_tests {
    ($($test:ident => $kind:literal),* $(,)?) => {$(
        #[test]
        fn $test() {
            stress($kind);
        }
    )*};
}

stress_tests! {
    stress_pool => "pool",
    stress_caching => "caching",
    stress_binning => "binning",
    stress_arena => "arena",
    stress_async => "async",
    stress_vpool => "vpool",
    stress_cuda => "cuda",
}
