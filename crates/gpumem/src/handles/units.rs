//! Byte sizes as people write them, read the same way by every front end:
//! the `gpumem` command's options, `GPUMEM_CONF` and the Python package's
//! settings. One reading, so `512MB` means the same number everywhere.

/// Parses a size: a number (decimals allowed) with an optional unit: `B`;
/// `K`, `KiB`, `M`, `MiB`, `G`, `GiB`, `T`, `TiB` (powers of 1024); `KB`,
/// `MB`, `GB`, `TB` (powers of 1000), in any case, spaces around ignored.
/// `Err` says what is wrong.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "{s:?} is not a size (expected a number such as 512MiB)"
        ));
    }
    let unit = unit.trim().to_ascii_lowercase();
    let mult: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => {
            return Err(format!(
                "{s:?}: unknown unit {unit:?} (use B, K/KiB, M/MiB, G/GiB, T/TiB or KB/MB/GB/TB)"
            ))
        }
    };
    if !num.contains('.') {
        let n: u64 = num
            .parse()
            .map_err(|_| format!("{s:?} is not a size (the number is too large)"))?;
        let bytes = (n as u128) * (mult as u128);
        return usize::try_from(bytes).map_err(|_| format!("{s:?} is too large"));
    }
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bad number {num:?})"))?;
    let bytes = (n * mult).round();
    if !bytes.is_finite() || bytes >= usize::MAX as f64 {
        return Err(format!("{s:?} is too large"));
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("1k"), Ok(1024));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("70GiB"), Ok(70 << 30));
        assert_eq!(parse_size("70G"), Ok(70 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("512MB"), Ok(512_000_000));
        assert_eq!(parse_size(" 2 TiB "), Ok(2 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("12XB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("1.2.3G").is_err());
        assert!(parse_size("99999999999999999999999").is_err());
        assert!(parse_size("16777216TiB").is_err());
        assert_eq!(parse_size("64mb"), Ok(64_000_000));
        assert_eq!(parse_size("4K"), Ok(4096));
        assert!(parse_size("12Q").is_err());
    }
}
