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

/// Milliseconds since the Unix epoch of an RFC 3339 time with a zone (`Z` or `±HH:MM`) and
/// optional fractional seconds.
pub fn parse_rfc3339_ms(text: &str) -> Result<i64, String> {
    let bytes = text.as_bytes();
    let (local, offset_minutes) = if let Some(local) = text.strip_suffix(['Z', 'z']) {
        (local, 0i64)
    } else if bytes.len() > 6 && matches!(bytes[bytes.len() - 6], b'+' | b'-') && bytes[bytes.len() - 3] == b':' {
        let zone = &text[text.len() - 6..];
        let hours: i64 = zone[1..3].parse().map_err(|_| format!("bad zone {zone:?}"))?;
        let minutes: i64 = zone[4..6].parse().map_err(|_| format!("bad zone {zone:?}"))?;
        if hours > 23 || minutes > 59 {
            return Err(format!("bad zone {zone:?}"));
        }
        let sign = if zone.starts_with('-') { -1 } else { 1 };
        (&text[..text.len() - 6], sign * (hours * 60 + minutes))
    } else {
        return Err("a zone is required: end with Z or ±HH:MM".into());
    };
    let time = humantime::parse_rfc3339(&format!("{local}Z")).map_err(|error| error.to_string())?;
    let since_epoch =
        time.duration_since(std::time::UNIX_EPOCH).map_err(|_| "times before 1970 are not supported".to_string())?;
    Ok(since_epoch.as_millis() as i64 - offset_minutes * 60_000)
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

    #[test]
    fn zones_and_fractions() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:01Z"), Ok(1_000));
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:01.250Z"), Ok(1_250));
        assert_eq!(parse_rfc3339_ms("1970-01-01T02:00:00+02:00"), Ok(0));
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00-01:00"), Ok(3_600_000));
        assert!(parse_rfc3339_ms("1969-12-31T23:00:00Z").is_err(), "before 1970 is refused, not wrapped");
        assert_eq!(parse_rfc3339_ms("2026-11-21T10:00:00Z"), Ok(1_795_255_200_000));
        assert!(parse_rfc3339_ms("2026-11-21T10:00:00").unwrap_err().contains("zone"));
        assert!(parse_rfc3339_ms("2026-13-21T10:00:00Z").is_err());
        assert!(parse_rfc3339_ms("2026-11-21T10:00:00+25:00").is_err());
        assert!(parse_rfc3339_ms("yesterday").is_err());
        assert!(parse_rfc3339_ms("").is_err());
    }
}
