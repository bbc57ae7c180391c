//! The RMM log parser and checker, on the shared real traces and on hand-written
//! logs with several threads, reused pointers, odd streams and failure rows.

use std::path::PathBuf;

use gpumem::trace::{self, Action, TraceEvent};

/// The real traces: `$GPUMEM_TRACES`, else `shared/traces` beside the
/// repository, else the repository's own `traces/`.
fn shared_trace(name: &str) -> Option<PathBuf> {
    let mut dirs = Vec::new();
    if let Ok(d) = std::env::var("GPUMEM_TRACES") {
        dirs.push(PathBuf::from(d));
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    dirs.push(root.join("../shared/traces"));
    dirs.push(root.join("traces"));
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

fn check_shared(name: &str, events: usize, peak_live: usize) {
    let Some(path) = shared_trace(name) else {
        eprintln!("skipped: {name} not found (set GPUMEM_TRACES)");
        return;
    };
    let ev = trace::read_file(&path).unwrap();
    assert_eq!(ev.len(), events);
    let r = trace::check(&ev).unwrap();
    assert!(r.is_clean(), "{r}");
    assert_eq!(r.events, events);
    assert_eq!(r.allocations + r.frees + r.failures, events);
    assert_eq!(r.peak_live, peak_live);
    assert_eq!(r.threads, 1);
    assert_eq!(r.streams, 1);
    assert_eq!(r.failures, 0);
    assert_eq!(r.unknown_frees, 0);
    assert_eq!(r.time_regressions, 0);
    // Every block of these training runs is freed by the end.
    assert_eq!(r.leaked, 0);
    assert_eq!(r.allocations, r.frees);
}

#[test]
fn resnet50_trace() {
    // 10,172 events, peak live 3.27 GB (what the data says, to the byte).
    check_shared("resnet50_train.rmm.csv", 10_172, 3_265_807_076);
}

#[test]
fn gpt2_trace() {
    // 15,224 events, peak live 14.42 GB.
    check_shared("gpt2_train.rmm.csv", 15_224, 14_419_418_892);
}

#[test]
fn first_row_of_a_real_trace() {
    let Some(path) = shared_trace("gpt2_train.rmm.csv") else {
        return;
    };
    let ev = trace::read_file(path).unwrap();
    assert_eq!(
        ev[0],
        TraceEvent {
            thread: 425,
            time_us: 61_286_656_531,
            action: Action::Allocate,
            ptr: 0x7fe6ba000000,
            size: 154_389_504,
            stream: 0x5644c9042ce0,
        }
    );
}

const MULTI: &str = "\
Thread,Time,Action,Pointer,Size,Stream
1,10:00:00.000001,allocate,0x1000,256,0x0
2,10:00:00.000002,allocate,0x2000,1024,0xdeadbeef
1,10:00:00.000003,allocate failure,0x0,1099511627776,0x0
3,10:00:00.000004,allocate,0x3000,512,0x1
2,10:00:00.000005,free,0x1000,256,0xdeadbeef
1,10:00:00.000006,allocate,0x1000,4096,0x0

3,10:00:00.000007,free,0x9999,64,0x1
3,10:00:00.000008,free,0x3000,512,0x1
1,10:00:00.000009,free,0x1000,4096,0x0
";

#[test]
fn hand_written_multi_thread_log() {
    let ev = trace::parse_str(MULTI).unwrap();
    assert_eq!(ev.len(), 9);
    assert_eq!(ev[2].action, Action::AllocateFailure);
    assert_eq!(ev[2].size, 1 << 40);
    assert_eq!(ev[1].stream, 0xdeadbeef);
    let r = trace::check(&ev).unwrap();
    assert_eq!(r.allocations, 4);
    assert_eq!(r.frees, 4);
    assert_eq!(r.failures, 1);
    assert_eq!(r.unknown_frees, 1);
    assert_eq!(r.threads, 3);
    assert_eq!(r.streams, 3);
    // 1024 (0x2000) + 512 (0x3000) + 4096 (0x1000 reused) at event 5.
    assert_eq!(r.peak_live, 5632);
    assert_eq!(r.peak_event, 5);
    assert_eq!(r.leaked, 1);
    assert_eq!(r.leaked_bytes, 1024);
    assert!(!r.is_clean());
    let text = r.to_string();
    assert!(text.contains("1 frees of unknown pointers"), "{text}");
}

#[test]
fn live_pointer_handed_out_twice_and_size_mismatch() {
    let log = "1,00:00:00.1,allocate,0x100,10,0\n\
               1,00:00:00.2,allocate,0x100,20,0\n\
               1,00:00:00.3,free,0x100,99,0\n\
               1,00:00:00.0,free,0x100,20,0\n";
    let ev = trace::parse_str(log).unwrap();
    let r = trace::check(&ev).unwrap();
    assert_eq!(r.live_pointer_reused, 1);
    assert_eq!(r.size_mismatches, 1);
    assert_eq!(r.unknown_frees, 1);
    assert_eq!(r.time_regressions, 1);
    assert_eq!(r.peak_live, 30);
    assert_eq!(r.leaked, 1);
    assert_eq!(r.leaked_bytes, 10);
}

#[test]
fn errors_name_the_line_and_column() {
    let bad_size = "Thread,Time,Action,Pointer,Size,Stream\n\
                    1,10:00:00.000001,allocate,0x1000,256,0x0\n\
                    1,10:00:00.000002,allocate,0x2000,lots,0x0\n";
    let e = trace::parse_str(bad_size).unwrap_err();
    assert_eq!(e.line, 3);
    assert_eq!(e.column, Some("Size"));
    assert!(e.to_string().starts_with("line 3, column Size:"), "{e}");
    assert!(e.to_string().contains("\"lots\""), "{e}");

    let e = trace::parse_str("1,10:00:00.1,allocate,0x1,2\n").unwrap_err();
    assert_eq!(e.line, 1);
    assert!(e.message.contains("expected 6"), "{e}");

    let e = trace::parse_str("1,10:00:00.1,realloc,0x1,2,0\n").unwrap_err();
    assert_eq!(e.column, Some("Action"));
    assert!(e.message.contains("realloc"));

    let e = trace::parse_str("1,ten o'clock,free,0x1,2,0\n").unwrap_err();
    assert_eq!(e.column, Some("Time"));

    let e = trace::parse_str("1,10:00:00.1,free,0xzz,2,0\n").unwrap_err();
    assert_eq!(e.column, Some("Pointer"));

    let e = trace::parse_str("Thread,When,Action,Pointer,Size,Stream\n").unwrap_err();
    assert_eq!(e.line, 1);
    assert!(e.message.contains("header"));

    let e = trace::read_file("/nonexistent/trace.csv").unwrap_err();
    assert!(e.to_string().contains("cannot open"), "{e}");
}

#[test]
fn write_then_parse_round_trips() {
    let ev = trace::parse_str(MULTI).unwrap();
    let mut out = Vec::new();
    trace::write_csv(&mut out, &ev).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with(trace::HEADER));
    assert!(text.contains("1,10:00:00.000003,allocate failure,0x0,1099511627776,0x0"));
    assert_eq!(trace::parse_str(&text).unwrap(), ev);
}

#[test]
fn a_time_too_large_for_64_bits_is_an_error_naming_the_line() {
    let log = "Thread,Time,Action,Pointer,Size,Stream\n\
               1,99999999999999999:00:00.000001,allocate,0x1000,256,0x0\n";
    let e = trace::parse_str(log).unwrap_err();
    assert_eq!((e.line, e.column), (2, Some("Time")), "{e}");
    assert!(e.message.contains("too large"), "{e}");
}

#[test]
fn live_bytes_beyond_64_bits_are_refused_not_wrapped() {
    let half = usize::MAX / 2 + 1;
    let log = format!(
        "1,10:00:00.1,allocate,0x1000,{half},0\n\
         1,10:00:00.2,allocate,0x2000,{half},0\n"
    );
    let ev = trace::parse_str(&log).unwrap();
    let e = trace::check(&ev).unwrap_err();
    assert_eq!(e.event, 1);
    assert!(e.to_string().starts_with("event 1:"), "{e}");
    assert!(e.to_string().contains("64 bits"), "{e}");
}

#[test]
fn a_line_without_end_is_an_error_naming_the_line() {
    // An endless input with no line break (/dev/zero) stops at the limit.
    let endless = std::io::BufReader::new(std::io::repeat(0));
    let e = trace::parse(endless).unwrap_err();
    assert_eq!(e.line, 1);
    assert!(e.message.contains("longer than 4096 bytes"), "{e}");
    // The same after a good line, and a line of exactly the limit is fine.
    let ok_then_long = format!("{}\n{}\n", trace::HEADER, "x".repeat(5000));
    let e = trace::parse_str(&ok_then_long).unwrap_err();
    assert_eq!(e.line, 2);
    assert!(e.message.contains("longer than"), "{e}");
    let padded = format!(
        "1,10:00:00.1,allocate,0x1000,256,0{}\n",
        " ".repeat(4096 - 34)
    );
    assert_eq!(padded.len(), 4097);
    assert_eq!(trace::parse_str(&padded).unwrap().len(), 1);
}

#[test]
fn the_number_of_events_is_bounded() {
    let limits = trace::Limits {
        max_events: 2,
        ..trace::Limits::default()
    };
    let e = trace::parse_with_limits(MULTI.as_bytes(), limits).unwrap_err();
    // The header is line 1; the third event is on line 4.
    assert_eq!(e.line, 4);
    assert!(e.message.contains("more than 2 events"), "{e}");
    assert!(trace::Limits::default().max_events >= 1 << 24);
}

#[test]
fn a_byte_order_mark_before_the_header_is_accepted() {
    let with_bom = format!("\u{feff}{MULTI}");
    assert_eq!(
        trace::parse_str(&with_bom).unwrap(),
        trace::parse_str(MULTI).unwrap()
    );
    let no_header = "\u{feff}1,10:00:00.1,allocate,0x1000,256,0\n";
    assert_eq!(trace::parse_str(no_header).unwrap().len(), 1);
}
