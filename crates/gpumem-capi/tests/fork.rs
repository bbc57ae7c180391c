//! A child forked after gpumem's first use gets a clear error, never a
//! hang: its allocations return NULL with a message naming the fork and
//! what to do, and frees of the parent's memory are ignored.
//!
//! The fork happens in a child of the test (this binary run again), whose
//! output is checked and whose run is bounded by a deadline.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpumem_capi::conf::Conf;
use gpumem_capi::{Allocator, Backend};

const ROLE: &str = "GPUMEM_CAPI_FORK_ROLE";

/// The forking process: allocate, fork, and in the child allocate and free.
fn forking_process() {
    // GPUMEM_DEVICE=cuda: the parent has initialised CUDA before the fork.
    let backend = match std::env::var("GPUMEM_DEVICE").as_deref() {
        Ok("cuda") => Backend::Cuda,
        _ => Backend::sim(),
    };
    let a = Allocator::new(Conf::default(), backend);
    let p = a.malloc(1 << 20, 0, 0);
    assert!(!p.is_null(), "the parent allocates");
    // SAFETY: the child calls the allocator (which returns before any lock
    // in a forked child), writes a line and calls `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let q = a.malloc(1 << 20, 0, 0);
        a.free(p, 1 << 20, 0, 0);
        let stats = a.allocated_bytes(0);
        eprintln!("fork child: malloc gave {q:#x}, allocated_bytes {stats}");
        // SAFETY: ends the child at once; its status is the verdict.
        unsafe { libc::_exit(if q.is_null() && stats == 0 { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: `pid` is our child; `status` is a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the forked child got memory or statistics: status {status}"
    );
    // The parent goes on as before.
    a.free(p, 1 << 20, 0, 0);
    assert_eq!(a.allocated_bytes(0), 0);
}

#[test]
fn child_role() {
    if std::env::var(ROLE).is_ok() {
        forking_process();
    }
}

#[test]
fn a_forked_child_gets_a_clear_error_not_a_hang() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_role", "--nocapture", "--test-threads=1"])
        .env(ROLE, "fork")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the forking process hung");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("forked") && text.contains("spawn"),
        "the child's message names the fork and the way out:\n{text}"
    );
}
