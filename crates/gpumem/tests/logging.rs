//! What the library cannot return as a value (a failure in `Drop`, a leak
//! report) goes through the `log` facade, at error level for failures and
//! warn level for things lost: the application's logger decides what is
//! printed, and without one the library prints nothing.

mod common;

use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::thread::ThreadId;

use gpumem::adaptor::TrackingAdaptor;
use gpumem::resource::{DeviceResource, MemoryResource};
use gpumem::DeviceBuffer;

/// Records every message with the thread that logged it, so tests running
/// side by side each see their own.
struct Capture(Mutex<Vec<(ThreadId, log::Level, String)>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, record: &log::Record<'_>) {
        let line = (
            std::thread::current().id(),
            record.level(),
            record.args().to_string(),
        );
        self.0.lock().unwrap().push(line);
    }
    fn flush(&self) {}
}

/// This thread's messages so far. The first call installs the capturing
/// logger: each test calls it before it does anything that logs.
fn logged() -> Vec<(log::Level, String)> {
    static CAPTURE: OnceLock<&'static Capture> = OnceLock::new();
    let capture = CAPTURE.get_or_init(|| {
        let c: &'static Capture = Box::leak(Box::new(Capture(Mutex::new(Vec::new()))));
        log::set_logger(c).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Trace);
        c
    });
    let me = std::thread::current().id();
    let all = capture.0.lock().unwrap();
    all.iter()
        .filter(|(t, _, _)| *t == me)
        .map(|(_, level, msg)| (*level, msg.clone()))
        .collect()
}

#[test]
fn a_free_that_fails_in_drop_is_logged_as_an_error() {
    let (device, sim) = common::device(false);
    let Some(sim) = common::sim_only(sim, "free_fails_in_drop") else {
        return;
    };
    assert!(logged().is_empty());
    let stream = device.create_stream().unwrap();
    let mr = DeviceResource::new(device.clone());
    let buf = DeviceBuffer::<u8, _>::new(4096, &mr, &stream).unwrap();
    let ptr = buf.as_device_ptr().0;
    sim.fail_call("cuMemFree", 1, 999);
    drop(buf);
    let got = logged();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, log::Level::Error);
    assert!(
        got[0]
            .1
            .starts_with(&format!("DeviceBuffer free of {ptr:#x} failed")),
        "{got:?}"
    );
    assert!(
        !got[0].1.starts_with("gpumem"),
        "the logger adds any prefix"
    );
}

#[test]
fn a_leak_report_at_drop_is_logged_as_a_warning() {
    assert!(logged().is_empty());
    let (device, _) = common::device(false);
    let stream = device.create_stream().unwrap();
    let upstream = DeviceResource::new(device.clone());
    let mr = TrackingAdaptor::new(&upstream);
    let p = mr.allocate(1000, 256, &stream).unwrap();
    drop(mr);
    let got = logged();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, log::Level::Warn);
    assert!(
        got[0]
            .1
            .starts_with("TrackingAdaptor: 1 allocation(s) outstanding, 1000 bytes"),
        "{got:?}"
    );
    assert!(
        got[0].1.contains(&format!("{:#x}: 1000 bytes", p.0)),
        "{got:?}"
    );
    // The upstream kept the block; give it back.
    upstream.deallocate(p, 1000, 256, &stream).unwrap();
}

const CHILD_ENV: &str = "GPUMEM_LOGGING_TEST_CHILD";

/// Run by [`without_a_logger_the_library_prints_nothing`] in a child
/// process: drops an adaptor with a leak and never installs a logger.
#[test]
fn leak_without_a_logger_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let (device, _) = common::device(false);
    let stream = device.create_stream().unwrap();
    let mr = TrackingAdaptor::new(DeviceResource::new(device));
    mr.allocate(1000, 256, &stream).unwrap();
    drop(mr);
}

#[test]
fn without_a_logger_the_library_prints_nothing() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "leak_without_a_logger_child",
            "--test-threads=1",
            "--nocapture", // what the library would print reaches stderr
        ])
        .env(CHILD_ENV, "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stderr}", out.status);
    assert!(stderr.is_empty(), "stderr must be empty:\n{stderr}");
}
