//! Sizes, counts and dates: parsing and printing.

use std::ops::RangeInclusive;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::builder::TypedValueParser;
pub use gpumem::units::parse_size;

/// [`parse_size`] (gpumem's one reading of sizes) for options where 0
/// bytes makes no sense.
pub fn parse_nonzero_size(s: &str) -> Result<usize, String> {
    match parse_size(s)? {
        0 => Err(format!("{s:?}: the size must be at least 1 byte")),
        n => Ok(n),
    }
}

/// A command-line parser for a count within `range`: clap refuses anything
/// else with a one-line error that names the option and the range.
pub fn count_in(range: RangeInclusive<u64>) -> impl TypedValueParser<Value = usize> {
    // The ranges used are far below usize::MAX, even on 32 bits.
    clap::value_parser!(u64).range(range).map(|n| n as usize)
}

/// Formats bytes with a binary unit: `512 B`, `64.0 KiB`, `3.04 GiB`.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

/// Formats a number with thousands separators, no decimals below 100 shown
/// with one: `46,119`, `405`, `12.3`.
pub fn fmt_count(x: f64) -> String {
    if x < 100.0 {
        return format!("{x:.1}");
    }
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Formats seconds since the Unix epoch as RFC 3339 UTC: `2026-11-21T17:10:00Z`.
pub fn utc_from_unix(secs: u64) -> String {
    let (y, mo, d) = civil_from_days((secs / 86_400) as i64);
    let t = secs % 86_400;
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}Z",
        t / 3600,
        (t / 60) % 60,
        t % 60
    )
}

/// The current UTC time, RFC 3339.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    utc_from_unix(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert!(parse_nonzero_size("0").is_err());
        assert!(parse_nonzero_size("K").is_err());
        assert_eq!(parse_nonzero_size("4K"), Ok(4096));
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(1 << 20), "1.00 MiB");
        assert_eq!(fmt_bytes(3_265_807_076), "3.04 GiB");
    }

    #[test]
    fn counts_and_dates() {
        assert_eq!(fmt_count(46119.4), "46,119");
        assert_eq!(fmt_count(1234567.0), "1,234,567");
        assert_eq!(fmt_count(405.0), "405");
        assert_eq!(fmt_count(12.34), "12.3");
        assert_eq!(utc_from_unix(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_from_unix(1_795_280_400), "2026-11-21T17:00:00Z");
        assert_eq!(utc_from_unix(951_782_400), "2000-02-29T00:00:00Z");
    }
}
