//! Which driver calls a stream capture refuses, measured: for each call, a
//! fresh Global-mode capture begins on a fresh stream, the call is made, and
//! one line reports the call's result, the capture's status after it
//! (`cuStreamGetCaptureInfo`) and what ending the capture returned. Each call
//! gets three rows: made from the capturing thread, from another thread, and
//! from the capturing thread in relaxed mode. Everything a case made or took
//! is given back before the next one.
//!
//! ```text
//! cargo run -p gpumem --example capture_rules                  # CUDA device 0
//! cargo run -p gpumem --example capture_rules -- --device sim  # the simulator
//! ```
//!
//! `GPUMEM_DEVICE=sim` also selects the simulator. Lines starting with `#`
//! name the device; the rest is the same on both, so
//! `diff <(grep -v '^#' gpu.txt) <(grep -v '^#' sim.txt)` shows where the
//! simulator's rules (`gpumem::driver::sim`, module `capture`) differ from
//! the GPU's.

use std::sync::{Arc, Mutex};

use gpumem::device::DEVICE_ENV;
use gpumem::driver::sim::{SimConfig, SimDriver};
use gpumem::driver::{
    AccessFlags, CaptureMode, DevicePtr, Driver, HandleType, HostAllocFlags, RawPhys,
};
use gpumem::{Device, Error, Event, RelaxedCapture, Stream};

/// Something a case owns until the end of the case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// `cuMemAlloc` memory.
    Plain(DevicePtr),
    /// Pinned host memory.
    Host(DevicePtr),
    /// Physical memory.
    Phys(RawPhys),
    /// A reserved address range.
    Va(DevicePtr, usize),
    /// A mapping in a reserved range.
    Mapping(DevicePtr, usize),
    /// A stream-ordered pool allocation.
    PoolPtr(DevicePtr),
}

/// What the calls act on, made before the capture begins.
struct Fixture {
    dev: Device,
    gran: usize,
    /// A stream that is not capturing.
    other: Stream,
    /// An event recorded on `other` and complete.
    done: Event,
    /// An event for records made during the case.
    event: Event,
    /// `cuMemAlloc` memory, 1 MiB.
    plain: DevicePtr,
    /// Pinned host memory.
    host: DevicePtr,
    /// Physical memory, one granule, not mapped.
    spare_phys: RawPhys,
    /// A reserved range of two granules with nothing mapped.
    free_va: DevicePtr,
    /// A reserved granule with memory mapped, read-write.
    mapped: DevicePtr,
    /// A pool allocation made before the capture.
    pool_ptr: DevicePtr,
    /// What must be given back when the case ends.
    held: Mutex<Vec<Held>>,
}

impl Fixture {
    fn new(dev: &Device) -> gpumem::Result<Fixture> {
        let (d, o) = (dev.driver(), dev.ordinal());
        let gran = d.vmm_granularity(o, false)?;
        let other = dev.create_stream()?;
        let done = Event::new(dev)?;
        done.record(&other)?;
        done.synchronize()?;
        let plain = d.mem_alloc(o, 1 << 20)?;
        let host = d.mem_alloc_host(o, 4096, HostAllocFlags::default())?;
        let spare_phys = d.vmm_create(o, gran, HandleType::None.into())?;
        let free_va = d.vmm_reserve(2 * gran, gran)?;
        let mapped_phys = d.vmm_create(o, gran, HandleType::None.into())?;
        let mapped = d.vmm_reserve(gran, gran)?;
        // SAFETY: physical memory and a reservation just made, mapped once;
        // `other` is a live stream.
        let pool_ptr = unsafe {
            d.vmm_map(mapped, gran, 0, mapped_phys)?;
            d.vmm_set_access(mapped, gran, o, AccessFlags::ReadWrite)?;
            d.mem_alloc_async(4096, other.raw())?
        };
        other.synchronize()?;
        let held = vec![
            Held::Plain(plain),
            Held::Host(host),
            Held::Phys(spare_phys),
            Held::Va(free_va, 2 * gran),
            Held::Phys(mapped_phys),
            Held::Va(mapped, gran),
            Held::Mapping(mapped, gran),
            Held::PoolPtr(pool_ptr),
        ];
        Ok(Fixture {
            dev: dev.clone(),
            gran,
            other,
            done,
            event: Event::new(dev)?,
            plain,
            host,
            spare_phys,
            free_va,
            mapped,
            pool_ptr,
            held: Mutex::new(held),
        })
    }

    fn d(&self) -> &dyn Driver {
        self.dev.driver().as_ref()
    }

    fn o(&self) -> u32 {
        self.dev.ordinal()
    }

    /// Notes what a call made, if it succeeded.
    fn made(&self, r: gpumem::Result<Held>) -> gpumem::Result<()> {
        r.map(|h| self.held.lock().unwrap().push(h))
    }

    /// Notes that a call gave `h` back, if it succeeded.
    fn gone(&self, h: Held, r: gpumem::Result<()>) -> gpumem::Result<()> {
        if r.is_ok() {
            self.held.lock().unwrap().retain(|&x| x != h);
        }
        r
    }

    /// Gives back everything still held: mappings first, then memory. A
    /// case gives back through [`Fixture::gone`] only, so each thing is
    /// given back once: by the case or here.
    fn release(self) {
        let (d, o) = (self.dev.driver().clone(), self.dev.ordinal());
        let mut held = std::mem::take(&mut *self.held.lock().unwrap());
        held.sort_by_key(|h| !matches!(h, Held::Mapping(..)));
        for h in held {
            // SAFETY: `h` is still held (see above): made by this fixture or
            // its case and not given back yet. No work uses it: the case's
            // work went into a capture that has ended, whose graph is never
            // launched.
            let r = unsafe {
                match h {
                    Held::Plain(p) => d.mem_free(o, p),
                    Held::Host(p) => d.mem_free_host(p),
                    Held::Phys(p) => d.vmm_release(p),
                    Held::Va(p, n) => d.vmm_free_address(p, n),
                    Held::Mapping(p, n) => d.vmm_unmap(p, n),
                    Held::PoolPtr(p) => d
                        .mem_free_async(p, self.other.raw())
                        .and_then(|()| self.other.synchronize()),
                }
            };
            if let Err(e) = r {
                println!("# cleanup of {h:?} failed: {e}");
            }
        }
    }
}

/// Bytes a captured host-to-device copy reads: static, so that a capture
/// holding the copy can never outlive them.
static PAGEABLE: [u8; 256] = [7; 256];

/// When the call is made.
#[derive(Clone, Copy, PartialEq, Eq)]
enum When {
    /// While the capture is under way.
    During,
    /// After the capture has ended.
    AfterEnd,
}

/// One row group: the call's name, work done on the capturing thread before
/// it (while capturing), when it is made, and the call.
struct Case {
    name: &'static str,
    prep: fn(&Fixture, &Stream) -> gpumem::Result<()>,
    when: When,
    call: fn(&Fixture, &Stream) -> gpumem::Result<()>,
}

fn nothing(_: &Fixture, _: &Stream) -> gpumem::Result<()> {
    Ok(())
}

fn record_in_capture(f: &Fixture, s: &Stream) -> gpumem::Result<()> {
    f.event.record(s)
}

const fn during(name: &'static str, call: fn(&Fixture, &Stream) -> gpumem::Result<()>) -> Case {
    Case {
        name,
        prep: nothing,
        when: When::During,
        call,
    }
}

const CASES: &[Case] = &[
    during("mem_alloc", |f, _| {
        f.made(f.d().mem_alloc(f.o(), 1 << 20).map(Held::Plain))
    }),
    during("mem_free", |f, _| {
        let p = f.plain;
        // SAFETY: the fixture's (see `Fixture`); given back through `gone`.
        f.gone(Held::Plain(p), unsafe { f.d().mem_free(f.o(), p) })
    }),
    during("vmm_create", |f, _| {
        f.made(
            f.d()
                .vmm_create(f.o(), f.gran, HandleType::None.into())
                .map(Held::Phys),
        )
    }),
    during("vmm_map", |f, _| {
        let va = f.free_va;
        // SAFETY: the fixture's physical memory and reservation, nothing mapped.
        let r = unsafe { f.d().vmm_map(va, f.gran, 0, f.spare_phys) };
        f.made(r.map(|()| Held::Mapping(va, f.gran)))
    }),
    during("vmm_set_access", |f, _| {
        // SAFETY: the fixture's mapping.
        unsafe {
            f.d()
                .vmm_set_access(f.mapped, f.gran, f.o(), AccessFlags::ReadWrite)
        }
    }),
    during("vmm_unmap", |f, _| {
        let p = f.mapped;
        // SAFETY: the fixture's (see `Fixture`); given back through `gone`.
        f.gone(Held::Mapping(p, f.gran), unsafe {
            f.d().vmm_unmap(p, f.gran)
        })
    }),
    during("vmm_release", |f, _| {
        let p = f.spare_phys;
        // SAFETY: the fixture's (see `Fixture`); given back through `gone`.
        f.gone(Held::Phys(p), unsafe { f.d().vmm_release(p) })
    }),
    during("vmm_reserve", |f, _| {
        let r = f.d().vmm_reserve(f.gran, f.gran);
        f.made(r.map(|p| Held::Va(p, f.gran)))
    }),
    during("vmm_free_address", |f, _| {
        let p = f.free_va;
        f.gone(
            Held::Va(p, 2 * f.gran),
            // SAFETY: the fixture's (see `Fixture`); given back through `gone`.
            unsafe { f.d().vmm_free_address(p, 2 * f.gran) },
        )
    }),
    during("event_query (unrelated event)", |f, _| {
        f.done.is_complete().map(drop)
    }),
    during("event_synchronize (unrelated event)", |f, _| {
        f.done.synchronize()
    }),
    during("event_record (another stream)", |f, _| {
        f.event.record(&f.other)
    }),
    during("stream_query (another stream)", |f, _| {
        f.other.is_idle().map(drop)
    }),
    during("stream_synchronize (another stream)", |f, _| {
        f.other.synchronize()
    }),
    Case {
        name: "event_query (event recorded in the capture)",
        prep: record_in_capture,
        when: When::During,
        call: |f, _| f.event.is_complete().map(drop),
    },
    Case {
        name: "event_synchronize (event recorded in the capture)",
        prep: record_in_capture,
        when: When::During,
        call: |f, _| f.event.synchronize(),
    },
    Case {
        name: "event_query (recorded in the capture, after its end)",
        prep: record_in_capture,
        when: When::AfterEnd,
        call: |f, _| f.event.is_complete().map(drop),
    },
    during("stream_end_capture (the capturing stream)", |_, s| {
        s.end_capture().map(drop)
    }),
    Case {
        name: "stream_end_capture (a stream that joined)",
        prep: |f, s| {
            f.event.record(s)?;
            f.other.wait_event(&f.event)
        },
        when: When::During,
        call: |f, _| f.other.end_capture().map(drop),
    },
    during("stream_query (the capturing stream)", |_, s| {
        s.is_idle().map(drop)
    }),
    during("stream_synchronize (the capturing stream)", |_, s| {
        s.synchronize()
    }),
    during("device_synchronize", |f, _| f.dev.synchronize()),
    during(
        "stream_wait_event (capturing stream, event outside)",
        |f, s| s.wait_event(&f.done),
    ),
    during(
        "mem_alloc_async + mem_free_async (capturing stream)",
        |f, s| {
            // SAFETY: `s` is the live capturing stream; `p` is freed once.
            unsafe {
                let p = f.d().mem_alloc_async(4096, s.raw())?;
                f.d().mem_free_async(p, s.raw())
            }
        },
    ),
    during(
        "mem_free_async (capturing stream, memory from before)",
        // SAFETY: the fixture's (see `Fixture`); a free the capture takes is a node of a graph never
        // launched, so `release` still frees it, once.
        |f, s| unsafe { f.d().mem_free_async(f.pool_ptr, s.raw()) },
    ),
    during("mempool_trim_to (default pool)", |f, _| {
        let pool = f.d().mempool_default(f.o())?;
        // SAFETY: a device's default pool lives as long as its context.
        unsafe { f.d().mempool_trim_to(pool, 0) }
    }),
    during("mem_alloc_host", |f, _| {
        let r = f.d().mem_alloc_host(f.o(), 4096, HostAllocFlags::default());
        f.made(r.map(Held::Host))
    }),
    during("mem_free_host", |f, _| {
        let p = f.host;
        // SAFETY: the fixture's (see `Fixture`); given back through `gone`.
        f.gone(Held::Host(p), unsafe { f.d().mem_free_host(p) })
    }),
    during("memcpy_htod_async (capturing stream, pageable)", |f, s| {
        // SAFETY: `PAGEABLE` is static, so it outlives any capture of the
        // copy; `plain` is at least 256 bytes of device memory held until the
        // case ends, after the capture.
        unsafe {
            f.d()
                .memcpy_htod_async(f.plain, PAGEABLE.as_ptr(), PAGEABLE.len(), s.raw())
        }
    }),
];

/// From which thread, and in which mode, the call is made.
#[derive(Clone, Copy)]
enum Caller {
    /// The capturing thread, in its default (Global) mode.
    Same,
    /// Another thread, in its default (Global) mode.
    Other,
    /// The capturing thread in relaxed mode.
    Relaxed,
}

impl Caller {
    const ALL: [Caller; 3] = [Caller::Same, Caller::Other, Caller::Relaxed];

    fn name(self) -> &'static str {
        match self {
            Caller::Same => "same",
            Caller::Other => "other",
            Caller::Relaxed => "relaxed",
        }
    }
}

/// A call's outcome in a table cell: `ok` or the `CUresult` name.
fn outcome<T>(r: &gpumem::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(Error::Driver { name, .. } | Error::StreamCapture { name, .. }) => name.clone(),
        Err(Error::Unsupported { .. }) => "CUDA_ERROR_NOT_SUPPORTED".into(),
        Err(Error::OutOfMemory(_)) => "CUDA_ERROR_OUT_OF_MEMORY".into(),
        Err(other) => format!("error: {other}"),
    }
}

fn make_call(case: &Case, caller: Caller, f: &Fixture, s: &Stream) -> gpumem::Result<()> {
    match caller {
        Caller::Same => (case.call)(f, s),
        Caller::Other => std::thread::scope(|t| {
            t.spawn(|| (case.call)(f, s))
                .join()
                .expect("the call does not panic")
        }),
        Caller::Relaxed => {
            let _relaxed = RelaxedCapture::new(&f.dev)?;
            (case.call)(f, s)
        }
    }
}

/// One row: `[call, caller, result, status after, end]`.
fn run(dev: &Device, case: &Case, caller: Caller) -> gpumem::Result<[String; 5]> {
    let f = Fixture::new(dev)?;
    let s = dev.create_stream()?;
    s.begin_capture(CaptureMode::Global)?;
    let prep = (case.prep)(&f, &s);
    let (result, status, end) = if case.when == When::During {
        let result = outcome(&prep.and_then(|()| make_call(case, caller, &f, &s)));
        let status = s.capture_status().map(|st| st.to_string());
        (result, status, s.end_capture())
    } else {
        let end = s.end_capture();
        let result = outcome(&prep.and_then(|()| make_call(case, caller, &f, &s)));
        (result, s.capture_status().map(|st| st.to_string()), end)
    };
    let status = status.unwrap_or_else(|e| outcome::<()>(&Err(e)));
    let end = outcome(&end);
    dev.synchronize()?;
    f.release();
    Ok([case.name.into(), caller.name().into(), result, status, end])
}

fn print_row(cells: &[String; 5]) {
    println!(
        "{:<55} | {:<7} | {:<40} | {:<11} | {}",
        cells[0], cells[1], cells[2], cells[3], cells[4]
    );
}

fn choose_device() -> gpumem::Result<(Device, Option<Arc<SimDriver>>)> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = args
        .iter()
        .position(|a| a == "--device")
        .and_then(|i| args.get(i + 1).cloned());
    match flag.or_else(|| std::env::var(DEVICE_ENV).ok()).as_deref() {
        Some("sim") => {
            let (dev, sim) = Device::sim_with_driver(SimConfig::backed(256 << 20));
            Ok((dev, Some(sim)))
        }
        None | Some("cuda") | Some("auto") => Ok((Device::cuda(0)?, None)),
        Some(other) => Err(Error::InvalidArgument(format!(
            "--device {other}: expected sim or cuda"
        ))),
    }
}

fn main() {
    let (dev, sim) = match choose_device() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("capture_rules: {e}");
            std::process::exit(2);
        }
    };
    let name = dev.info().map(|i| i.name).unwrap_or_default();
    println!(
        "# capture_rules on {} device {} ({name})",
        dev.backend(),
        dev.ordinal()
    );
    println!("# each row: fresh stream, Global capture, the call, cuStreamGetCaptureInfo, cuStreamEndCapture");
    print_row(&[
        "call".into(),
        "thread".into(),
        "result".into(),
        "after".into(),
        "end capture".into(),
    ]);
    for case in CASES {
        for caller in Caller::ALL {
            match run(&dev, case, caller) {
                Ok(cells) => print_row(&cells),
                Err(e) => println!("# {} ({}): setup failed: {e}", case.name, caller.name()),
            }
        }
    }
    if let Some(sim) = sim {
        println!(
            "# the simulator logged {} capture violations",
            sim.capture_violations().len()
        );
    }
}
