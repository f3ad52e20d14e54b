//! Sizes written for people (`8KiB`, `4MiB`, `16MB` or `4096`) and ratios
//! of sizes.

/// Logical / stored bytes; `None` when nothing was stored.
pub fn ratio(logical: u64, stored: u64) -> Option<f64> {
    (stored > 0).then(|| logical as f64 / stored as f64)
}

/// Parses a size with an optional unit (B, KiB, MiB, GiB, KB, MB, GB; case-insensitive).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 8KiB, 4MiB, 4096)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {text:?} is too large"))
}

/// Parses a size that must fit in 32 bits.
pub fn parse_size_u32(text: &str) -> Result<u32, String> {
    let n = parse_size(text)?;
    u32::try_from(n).map_err(|_| format!("size {text:?} is too large (at most 4 GiB - 1)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("8KiB").unwrap(), 8192);
        assert_eq!(parse_size("4mib").unwrap(), 4 << 20);
        assert_eq!(parse_size("16MB").unwrap(), 16_000_000);
        assert!(parse_size("x").is_err());
        assert!(parse_size("5XB").is_err());
        assert!(parse_size_u32("8GiB").is_err());
    }
}
