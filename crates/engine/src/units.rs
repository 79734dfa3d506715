//! Human units in settings and definitions: byte sizes (`64MiB`) and durations (`7d`).

use std::time::Duration;

/// Parses a byte size: a number with an optional K/KB/KiB, M/MB/MiB or G/GB/GiB suffix (all
/// binary multiples).
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let number: u64 = digits.parse().map_err(|_| format!("{text:?} is not a size: expected e.g. 4096 or 64MiB"))?;
    let multiplier: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("unknown size suffix {other:?}: use KiB, MiB or GiB")),
    };
    number.checked_mul(multiplier).ok_or_else(|| format!("{text:?} is too large"))
}

/// Parses a duration such as `500ms`, `30s`, `15m`, `12h`, `7d` or `2w` (units may be combined:
/// `1h 30m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|error| format!("{text:?} is not a duration ({error}): expected e.g. 500ms, 30s, 12h or 7d"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("2g"), Ok(2 << 30));
        assert_eq!(parse_bytes("1 KiB"), Ok(1024));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("5 parsecs").unwrap_err().contains("unknown size suffix"));
        assert!(parse_bytes("99999999999999GiB").unwrap_err().contains("too large"));
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("1h 30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("soon").unwrap_err().contains("7d"));
    }
}
