//! `libgpumem.so`: the C ABI of `gpumem-capi` as a shared library.
//!
//! Everything lives in `gpumem-capi`; this crate only links it into a
//! `cdylib`. Its `#[no_mangle] extern "C"` functions are exported from the
//! library because they are reachable through this re-export. The header is
//! `crates/gpumem-capi/include/gpumem.h`.

#![forbid(unsafe_code)]

pub use gpumem_capi::*;
