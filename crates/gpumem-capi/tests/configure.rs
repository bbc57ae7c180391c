//! `gpumem_configure`: any valid configuration until the first allocation,
//! afterwards only the one in force; a refused one changes nothing and says
//! why in the thread's last error. One test: the configuration is the
//! process's.

use std::ffi::{c_char, CStr};
use std::ptr::null_mut;

use gpumem_capi::conf::ResourceKind;
use gpumem_capi::*;

fn text(p: *const c_char) -> Option<String> {
    // SAFETY: the library's strings are NUL-terminated and live long enough.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn configure(conf: &CStr) -> i32 {
    // SAFETY: a NUL-terminated string.
    unsafe { gpumem_configure(conf.as_ptr()) }
}

#[test]
fn configure_before_and_after_the_first_allocation() {
    std::env::set_var("GPUMEM_DEVICE", "sim");
    std::env::set_var("GPUMEM_CONF", "resource=caching");
    assert_eq!(text(gpumem_config_error()), None, "GPUMEM_CONF is valid");

    // Before the first allocation: an invalid text is refused and changes
    // nothing; the thread's last error says why.
    assert_eq!(configure(c"resource=pol,max_size=lots"), -1);
    let why = text(gpumem_last_error()).expect("says why");
    assert!(
        why.starts_with(
            "configuration \"resource=pol,max_size=lots\" is invalid: unknown resource \"pol\""
        ),
        "{why}"
    );
    assert!(why.contains("max_size: \"lots\" is not a size"), "{why}");
    assert!(
        why.ends_with("the configuration in force is unchanged"),
        "{why}"
    );
    assert_eq!(
        text(gpumem_config_error()),
        None,
        "GPUMEM_CONF still in force"
    );
    assert_eq!(global().conf().resource, ResourceKind::Caching);
    // SAFETY: NULL is allowed and refused.
    assert_eq!(unsafe { gpumem_configure(std::ptr::null()) }, -1);
    assert!(text(gpumem_last_error()).unwrap().contains("NULL"));
    assert_eq!(global().conf().resource, ResourceKind::Caching);

    assert_eq!(configure(c"resource=vpool,max_size=64MiB"), 0);
    assert_eq!(text(gpumem_config_error()), None);
    assert_eq!(global().conf().resource, ResourceKind::Virtual);
    let p = gpumem_malloc(4096, 0, null_mut());
    assert!(!p.is_null(), "served by the new configuration");
    assert_eq!(text(gpumem_last_error()), None);
    assert_eq!(global().resource_kind(0), Some(ResourceKind::Virtual));

    // After it: the configuration in force, however written, is accepted...
    assert_eq!(configure(c"resource=vpool,max_size=64MiB"), 0);
    assert_eq!(configure(c" Resource = VPOOL , max_size=65536KiB "), 0);
    // ...anything else is refused and changes nothing.
    assert_eq!(configure(c"resource=pool"), -1);
    assert_eq!(
        text(gpumem_config_error()),
        None,
        "the one in force is valid"
    );
    let why = text(gpumem_last_error()).unwrap();
    assert!(
        why.contains("gpumem already serves \"resource=vpool,initial_size=0,max_size=67108864\""),
        "{why}"
    );
    assert!(why.contains("before the first allocation"), "{why}");
    assert_eq!(configure(c"resource=vpool,junk=1"), -1);
    assert!(text(gpumem_last_error())
        .unwrap()
        .contains("unknown key \"junk\""));
    let q = gpumem_malloc(4096, 1, null_mut());
    assert!(!q.is_null(), "still served");
    assert_eq!(global().resource_kind(1), Some(ResourceKind::Virtual));
    gpumem_free(p, 4096, 0, null_mut());
    gpumem_free(q, 4096, 1, null_mut());
    assert_eq!(configure(c"resource=vpool,max_size=64MiB"), 0);
    assert_eq!(text(gpumem_config_error()), None);
}
