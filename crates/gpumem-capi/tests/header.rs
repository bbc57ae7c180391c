//! The committed header `include/gpumem.h` is what cbindgen makes of the
//! crate with `cbindgen.toml`. `GPUMEM_BLESS=1` rewrites it instead.

use std::path::PathBuf;

#[test]
fn header_is_up_to_date() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let have_cargo = std::process::Command::new(&cargo)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !crate_dir.join("cbindgen.toml").exists() || !have_cargo {
        // A test binary copied to another machine (the GPU bundle) has no
        // sources or no cargo to read them with.
        eprintln!(
            "skipping: no sources or no cargo at {}",
            crate_dir.display()
        );
        return;
    }
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml parses");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(&crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("header is UTF-8");
    let path = crate_dir.join("include/gpumem.h");
    if std::env::var_os("GPUMEM_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("header written");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/gpumem.h is out of date: run `GPUMEM_BLESS=1 cargo test -p gpumem-capi --test header`"
    );
    for sig in [
        "void *gpumem_malloc(ssize_t size, int device, gpumem_stream_t stream);",
        "void gpumem_free(void *ptr, ssize_t size, int device, gpumem_stream_t stream);",
        "void *gpumem_cupy_malloc(void *param, size_t size, int device);",
        "void gpumem_cupy_free(void *param, void *ptr, int device);",
        "size_t gpumem_allocated_bytes(int device);",
        "size_t gpumem_reserved_bytes(int device);",
        "size_t gpumem_peak_reserved_bytes(int device);",
        "void gpumem_reset_peak(int device);",
        "void gpumem_empty_cache(int device);",
        "uint64_t gpumem_bad_free_count(int device);",
        "const char *gpumem_config_error(void);",
        "typedef void *gpumem_stream_t;",
        "int gpumem_configure(const char *conf);",
        "const char *gpumem_last_error(void);",
        "int gpumem_get_device_stats(int device, struct gpumem_device_stats_t *out);",
        "void gpumem_reset_peak_stats(int device);",
        "void gpumem_reset_accumulated_stats(int device);",
        "int gpumem_set_memory_fraction(int device, double fraction);",
        "double gpumem_get_memory_fraction(int device);",
        "void gpumem_record_stream(void *ptr, int device, gpumem_stream_t stream);",
        "int gpumem_region_begin(int device, uint32_t tag);",
        "int gpumem_region_end(int device);",
        "int gpumem_sleep(int device, uint32_t tag, int backup);",
        "int gpumem_wake(int device, uint32_t tag);",
        "size_t gpumem_sleeping_bytes(int device, uint32_t tag);",
        "typedef struct gpumem_stat_t {",
        "} gpumem_device_stats_t;",
        "} gpumem_segment_t;",
        "} gpumem_block_t;",
    ] {
        assert!(
            generated.contains(sig),
            "header lacks `{sig}`:\n{generated}"
        );
    }
}

/// The header compiles as C and as C++ (where a compiler is installed), with
/// CUDA's own `cudaStream_t` passing as `gpumem_stream_t` without a cast.
#[test]
fn header_compiles_as_c_and_cpp() {
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if !crate_dir.join("include/gpumem.h").exists() {
        eprintln!("skipping: no sources at {}", crate_dir.display());
        return;
    }
    let dir = std::env::temp_dir().join(format!("gpumem-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = r#"
#include "gpumem.h"
typedef struct CUstream_st *cudaStream_t; /* as cuda_runtime_api.h has it */
int use(cudaStream_t s) {
    void *p = gpumem_malloc((ssize_t)256, 0, s);
    gpumem_free(p, (ssize_t)256, 0, s);
    void *q = gpumem_cupy_malloc(NULL, (size_t)256, 0);
    gpumem_cupy_free(NULL, q, 0);
    gpumem_reset_peak(0);
    gpumem_empty_cache(0);
    const char *why = gpumem_config_error();
    uint64_t bad = gpumem_bad_free_count(-1);
    /* The contract's spelling of the types (no struct keyword). */
    gpumem_device_stats_t stats;
    gpumem_segment_t segments[4];
    gpumem_block_t blocks[4];
    size_t n_segments = 0, n_blocks = 0;
    int ok = gpumem_configure("resource=pool") + gpumem_get_device_stats(0, &stats)
        + gpumem_set_memory_fraction(0, 0.5)
        + gpumem_snapshot(0, segments, 4, &n_segments, blocks, 4, &n_blocks);
    gpumem_reset_peak_stats(0);
    gpumem_reset_accumulated_stats(0);
    gpumem_record_stream(p, 0, s);
    const char *last = gpumem_last_error();
    double f = gpumem_get_memory_fraction(0);
    ok += gpumem_region_begin(0, 1) + gpumem_region_end(0) + gpumem_sleep(0, 1, 1) + gpumem_wake(0, 1);
    size_t asleep = gpumem_sleeping_bytes(0, 1);
    return (int)(gpumem_allocated_bytes(0) + gpumem_reserved_bytes(0) + gpumem_peak_reserved_bytes(0) + bad + (why != NULL)
        + ok + stats.allocation.current + stats.largest_free_block + (last != NULL) + (f < 1.0) + n_segments + n_blocks + asleep);
}
"#;
    for (compiler, file) in [("cc", "t.c"), ("c++", "t.cpp")] {
        let path = dir.join(file);
        std::fs::write(&path, src).unwrap();
        let out = std::process::Command::new(compiler)
            .args(["-fsyntax-only", "-Wall", "-Werror", "-I"])
            .arg(crate_dir.join("include"))
            .arg(&path)
            .output();
        match out {
            Ok(o) => assert!(
                o.status.success(),
                "{compiler} rejects the header: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("skipping the {compiler} check: {e}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
