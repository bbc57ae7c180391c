//! GPUMEM_CONF's parser on any text: it never panics, and a configuration
//! it accepts prints as a text that parses back to the same configuration.
#![no_main]

use gpumem_capi::conf::parse;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let parsed = parse(&text);
    if parsed.problems.is_empty() {
        let again = parse(&parsed.conf.to_string());
        assert!(
            again.problems.is_empty(),
            "{:?} printed as {:?}, which is refused: {:?}",
            text,
            parsed.conf.to_string(),
            again.problems
        );
        assert_eq!(again.conf, parsed.conf, "{text:?} does not print back to itself");
    } else {
        assert!(parsed.error().is_some(), "problems without an error for {text:?}");
    }
});
