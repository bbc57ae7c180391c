//! The RMM log parser on any bytes: it never panics, and a log it accepts
//! written back as CSV parses to the same events; `check` never panics on
//! what it accepts.
#![no_main]

use gpumem::trace;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(events) = trace::parse(data) else { return };
    let mut csv = Vec::new();
    trace::write_csv(&mut csv, &events).expect("writing to memory");
    let again = trace::parse(&csv[..]).expect("a log written by write_csv parses");
    assert_eq!(again, events, "written and read back");
    let _ = trace::check(&events);
});
