//! RFC 3339 times in query strings (`from=2026-11-21T10:00:00Z`, `…+02:00`).

use std::time::UNIX_EPOCH;

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
    let since_epoch = time.duration_since(UNIX_EPOCH).map_err(|_| "times before 1970 are not supported".to_string())?;
    Ok(since_epoch.as_millis() as i64 - offset_minutes * 60_000)
}

#[cfg(test)]
mod tests {
    use super::*;

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
