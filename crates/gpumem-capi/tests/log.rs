//! `log=FILE`: every allocation and free through the C ABI is written as
//! RMM's CSV log, one file per device, which `gpumem::trace` (and so
//! `gpumem replay` and `gpumem plot`) reads back.

mod support;

use gpumem::trace::{self, Action};
use support::{allocator, MIB};

#[test]
fn the_log_is_rmm_csv_that_trace_reads_back() {
    let dir = std::env::temp_dir().join(format!("gpumem-capi-log-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("Job Trace.csv");
    let a = allocator(&format!(
        "resource=pool,max_size=64MiB,log={}",
        path.display()
    ));
    let p = a.malloc(1000, 0, 0x5000);
    let q = a.malloc(3 * MIB, 0, 0);
    a.free(p, 1000, 0, 0x5000);
    assert!(a.malloc(1 << 50, 0, 0).is_null());
    a.free(q, 3 * MIB, 0, 0);
    let r = a.malloc(4096, 1, 0);
    a.free(r, 4096, 1, 0);
    drop(a); // flushes the logs

    let events = trace::read_file(&path).expect("device 0's log parses");
    let rows: Vec<(Action, u64, usize, u64)> = events
        .iter()
        .map(|e| (e.action, e.ptr, e.size, e.stream))
        .collect();
    assert_eq!(
        rows,
        vec![
            (Action::Allocate, p.0, 1000, 0x5000),
            (Action::Allocate, q.0, 3 * MIB, 0),
            (Action::Free, p.0, 1000, 0x5000),
            // The first try and the retry after emptying the cache.
            (Action::AllocateFailure, 0, 1 << 50, 0),
            (Action::AllocateFailure, 0, 1 << 50, 0),
            (Action::Free, q.0, 3 * MIB, 0),
        ]
    );
    assert_eq!(trace::check(&events).unwrap().peak_live, 3 * MIB + 1000);
    let other = trace::read_file(dir.join("Job Trace-dev1.csv")).expect("device 1's log");
    assert_eq!(
        other.iter().map(|e| e.action).collect::<Vec<_>>(),
        [Action::Allocate, Action::Free]
    );
    assert_eq!(other[0].ptr, r.0);
    let _ = std::fs::remove_dir_all(&dir);
}
