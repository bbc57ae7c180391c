//! Calls that come once the process has started its exit (from an `atexit`
//! handler that runs after gpumem's own) call no driver: an allocation
//! returns NULL with a message that says why, and a free does nothing. This
//! is the check on the allocation and free fast path, on a device built
//! before the exit. Rust code holding the device's resource
//! (`device_resource`) gets an error that says so.
//!
//! The exit happens in a child of the test (this binary run again), whose
//! output and status are checked.

use std::process::Command;
use std::sync::OnceLock;

use gpumem_capi::conf::Conf;
use gpumem_capi::{Allocator, Backend};

const ROLE: &str = "GPUMEM_CAPI_EXIT_ROLE";

static ALLOCATOR: OnceLock<Allocator> = OnceLock::new();
static LIVE: OnceLock<gpumem::DevicePtr> = OnceLock::new();
/// The device's stack as Rust code holds it (`Allocator::device_resource`).
static RUST: OnceLock<gpumem::resource::SharedResource> = OnceLock::new();

/// Runs after gpumem's exit hook (registered before it): allocates and
/// frees, then ends the process with the verdict as its status.
extern "C" fn late_handler() {
    let (Some(a), Some(&p)) = (ALLOCATOR.get(), LIVE.get()) else {
        // SAFETY: `_exit` ends the process at once; nothing runs after it.
        unsafe { libc::_exit(2) };
    };
    let q = a.malloc(1 << 20, 0, 0);
    let why = gpumem_capi::allocator::last_error().unwrap_or_default();
    a.free(p, 1 << 20, 0, 0);
    let allocated = a.allocated_bytes(0);
    let rust = RUST
        .get()
        .map(|r| r.allocate(1 << 20, 256, &r.device().default_stream()));
    println!("exit child: malloc gave {q:#x} ({why}); allocated_bytes after the free {allocated}; the Rust handle gave {rust:?}");
    // The free did nothing: the block still counts as allocated.
    let refused = matches!(&rust, Some(Err(e)) if e.to_string().contains("exiting"));
    let ok = q.is_null() && why.contains("exiting") && allocated == 1 << 20 && refused;
    // SAFETY: as above.
    unsafe { libc::_exit(if ok { 0 } else { 1 }) };
}

/// The exiting process: a handler first, then the allocator's first use
/// (which installs gpumem's hook), one live block, and a return from the
/// test, which exits.
fn exiting_process() {
    // SAFETY: `late_handler` is an `extern "C" fn()` that never unwinds.
    assert_eq!(unsafe { libc::atexit(late_handler) }, 0);
    let backend = match std::env::var("GPUMEM_DEVICE").as_deref() {
        Ok("cuda") => Backend::Cuda,
        _ => Backend::sim(),
    };
    let a = ALLOCATOR.get_or_init(|| Allocator::new(Conf::default(), backend));
    let p = a.malloc(1 << 20, 0, 0);
    assert!(!p.is_null(), "the process allocates before its exit");
    LIVE.set(p).unwrap();
    let rust = a.device_resource(0).expect("device 0 is served");
    assert!(RUST.set(rust).is_ok());
    assert!(!gpumem::exit::driver_off_limits());
}

#[test]
fn child_role() {
    if std::env::var(ROLE).is_ok() {
        exiting_process();
    }
}

#[test]
fn calls_after_the_exit_began_touch_no_driver() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
        .env(ROLE, "exit")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("exit child:"), "the handler ran:\n{text}");
    assert!(out.status.success(), "{text}");
}
