//! A bad `GPUMEM_CONF` is an error that cannot be missed: the library says
//! so on stderr, serves nothing (every allocation returns NULL, reported) and
//! `gpumem_config_error()` returns the reason. The check runs this test
//! binary again as a child with the bad configuration and reads the child's
//! stderr.

use std::ffi::CStr;
use std::process::Command;

const CHILD_ENV: &str = "GPUMEM_CAPI_TEST_CHILD";
const BAD: &str = "resource=poool,max_size=lots,speed=11";

/// The child's side: allocate through the C functions; any panic fails it.
#[test]
fn child_allocates_under_bad_conf() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let why = gpumem_capi::gpumem_config_error();
    assert!(!why.is_null(), "the configuration is invalid");
    // SAFETY: a non-null result is a NUL-terminated string that lives as long
    // as the process.
    let why = unsafe { CStr::from_ptr(why) }.to_str().unwrap();
    println!("WHY={why}");
    for size in [1 << 20, 256] {
        let p = gpumem_capi::gpumem_malloc(size, 0, std::ptr::null_mut());
        assert!(p.is_null(), "nothing is served");
    }
    assert!(gpumem_capi::gpumem_cupy_malloc(std::ptr::null_mut(), 256, 0).is_null());
    assert_eq!(gpumem_capi::gpumem_allocated_bytes(0), 0);
    println!("CHILD-OK");
}

#[test]
fn bad_conf_is_an_error_and_nothing_is_served() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "child_allocates_under_bad_conf",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env("GPUMEM_DEVICE", "sim")
        .env("GPUMEM_CONF", BAD)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("CHILD-OK"), "child did not run:\n{stdout}");
    let why = format!(
        "GPUMEM_CONF=\"{BAD}\" is invalid: unknown resource \"poool\" (expected one of \
         pool, caching, binning, arena, async, vpool, cuda); max_size: \"lots\" is not a size"
    );
    assert!(stdout.contains(&format!("WHY={why}")), "{stdout}");
    assert!(
        stdout.contains("unknown key \"speed\" (known: resource,"),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("gpumem: {why}")),
        "stderr says it at once:\n{stderr}"
    );
    assert!(
        stderr.contains("every allocation returns NULL until it is fixed"),
        "{stderr}"
    );
    assert!(
        stderr.contains("gpumem: device 0: allocation of 1048576 bytes refused: GPUMEM_CONF="),
        "each refused allocation is reported:\n{stderr}"
    );
}

#[test]
fn bad_device_env_serves_nothing_and_says_why() {
    // GPUMEM_DEVICE=gpu names no backend: a misspelt `sim` must not run on
    // the GPU instead, so nothing is served, on any machine, and the reason
    // is printed at once and with each refused allocation.
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "child_without_sim",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "1")
        .env("GPUMEM_DEVICE", "gpu")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("CHILD-OK"), "child did not run:\n{stdout}");
    assert!(
        stdout.contains("SERVED=false"),
        "nothing is served:\n{stdout}"
    );
    assert!(
        stderr.contains(
            "gpumem: GPUMEM_DEVICE=\"gpu\": expected sim, cuda or auto; every allocation returns NULL"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("gpumem: device 0: allocation of 1048576 bytes refused:"),
        "each refused allocation is reported:\n{stderr}"
    );
}

#[test]
fn child_without_sim() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let p = gpumem_capi::gpumem_malloc(1 << 20, 0, std::ptr::null_mut());
    println!("SERVED={}", !p.is_null());
    if !p.is_null() {
        gpumem_capi::gpumem_free(p, 1 << 20, 0, std::ptr::null_mut());
    }
    println!("CHILD-OK");
}
