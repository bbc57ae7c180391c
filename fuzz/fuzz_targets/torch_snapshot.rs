//! The PyTorch snapshot reader on any bytes: bounded reading
//! (`pickle_bounds`), decoding (`pickle_values`) and the conversion to RMM events never
//! panic nor overflow the stack; converted events write and read back as
//! an RMM log.
#![no_main]

use gpumem::trace;
use gpumem_cli::snapshot::{convert, read_pickle, FreeOn};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(value) = read_pickle(data) else { return };
    for free_on in [FreeOn::Requested, FreeOn::Completed] {
        if let Ok((events, _)) = convert(&value, None, free_on) {
            let mut csv = Vec::new();
            trace::write_csv(&mut csv, &events).expect("writing to memory");
            assert_eq!(trace::parse(&csv[..]).expect("converted events parse"), events);
        }
    }
});
