//! A bad `GPUMEM_CONF` does not stop the host program: the library reports it
//! on stderr and serves with the defaults. The check runs this test binary
//! again as a child with the bad configuration and reads the child's stderr.

use std::process::Command;

const CHILD_ENV: &str = "GPUMEM_CAPI_TEST_CHILD";

/// The child's side: allocate through the C functions; any panic fails it.
#[test]
fn child_allocates_under_bad_conf() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let p = gpumem_capi::gpumem_malloc(1 << 20, 0, std::ptr::null_mut());
    assert!(!p.is_null(), "defaults serve");
    assert_eq!(gpumem_capi::gpumem_allocated_bytes(0), 1 << 20);
    gpumem_capi::gpumem_free(p, 1 << 20, 0, std::ptr::null_mut());
    let conf = gpumem_capi::global().conf();
    assert_eq!(conf.resource, gpumem_capi::conf::ResourceKind::Pool);
    assert_eq!(conf.max_size, None);
    println!("CHILD-OK");
}

#[test]
fn bad_conf_is_reported_and_defaults_serve() {
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
        .env("GPUMEM_CONF", "resource=poool,max_size=lots,speed=11")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("CHILD-OK"), "child did not run:\n{stdout}");
    for needle in [
        "gpumem: GPUMEM_CONF: unknown resource \"poool\"",
        "gpumem: GPUMEM_CONF: max_size: \"lots\" is not a size",
        "gpumem: GPUMEM_CONF: unknown key \"speed\"",
    ] {
        assert!(
            stderr.contains(needle),
            "stderr lacks {needle:?}:\n{stderr}"
        );
    }
}

#[test]
fn bad_device_env_falls_back_to_cuda_and_fails_cleanly() {
    // GPUMEM_DEVICE=gpu is reported and CUDA is used; on this machine there is
    // no CUDA driver, so allocations return NULL, with a report, and nothing
    // crashes. (On a GPU machine the allocation succeeds.)
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
        stderr.contains("gpumem: GPUMEM_DEVICE=\"gpu\": expected cuda, sim or auto; using cuda"),
        "{stderr}"
    );
}

#[test]
fn child_without_sim() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let p = gpumem_capi::gpumem_malloc(1 << 20, 0, std::ptr::null_mut());
    if !p.is_null() {
        gpumem_capi::gpumem_free(p, 1 << 20, 0, std::ptr::null_mut());
    }
    println!("CHILD-OK");
}
