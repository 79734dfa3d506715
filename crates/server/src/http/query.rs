//! Query strings, decoded strictly, in one place for every route.
//!
//! - Percent escapes must be whole (`%` and two hex digits), and the decoded bytes of every
//!   name and value must be UTF-8. A lenient decoder turns bad bytes into U+FFFD, so two
//!   different keys (`%FF` and `%FE`) would both be stored as the same `�`: refused instead.
//! - `+` means a space, as in HTML forms, except in `subject`: a subject cannot contain a
//!   space that matters there, and `+` is the single-level wildcard of a subject filter, so a
//!   `?subject=scores/+` typed as is means the wildcard (`%2B` still works).

use super::error::ApiError;

/// The parameter whose `+` is taken literally.
const LITERAL_PLUS: &str = "subject";

/// The `name=value` pairs of `raw` (the part of the URL after `?`), in order, decoded.
pub fn pairs(raw: &str) -> Result<Vec<(String, String)>, ApiError> {
    let mut pairs = Vec::new();
    for piece in raw.split('&').filter(|piece| !piece.is_empty()) {
        let (name, value) = piece.split_once('=').unwrap_or((piece, ""));
        let name = decode(name, true).map_err(|reason| bad(format!("a parameter name {name:?} {reason}")))?;
        // A browser's credentials, taken by `auth`: never a filter or an option.
        if name == super::auth::ACCESS_TOKEN_PARAMETER {
            continue;
        }
        let value = decode(value, name != LITERAL_PLUS).map_err(|reason| bad(format!("{name}={value} {reason}")))?;
        pairs.push((name, value));
    }
    Ok(pairs)
}

fn bad(message: String) -> ApiError {
    ApiError::bad_request("bad_query", message)
}

/// Percent-decodes `text`, with `+` as a space when `plus_is_space`.
pub(crate) fn decode(text: &str, plus_is_space: bool) -> Result<String, &'static str> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'%' => {
                let hex = bytes.get(at + 1..at + 3).ok_or("ends in an incomplete percent escape")?;
                let hex = std::str::from_utf8(hex).map_err(|_| "has a bad percent escape")?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| "has a bad percent escape")?);
                at += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                at += 1;
            }
            byte => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| "is not UTF-8 once decoded (keys, subjects and filters are text)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plus_is_a_wildcard_in_subject_and_a_space_elsewhere() {
        let pairs = pairs("subject=scores/+&team=red+sox&key=a%2Bb&subject=x%2By").unwrap();
        assert_eq!(
            pairs,
            [("subject", "scores/+"), ("team", "red sox"), ("key", "a+b"), ("subject", "x+y")]
                .map(|(name, value)| (name.to_string(), value.to_string()))
        );
    }

    #[test]
    fn bad_escapes_and_bytes_that_are_not_utf8_are_refused() {
        for raw in ["key=%FF", "key=%C3", "subject=%ZZ", "key=abc%4", "%FF=1", "key=%"] {
            let error = pairs(raw).unwrap_err();
            assert_eq!(error.code, "bad_query", "{raw}");
        }
        assert_eq!(pairs("key=%C3%A9").unwrap(), [("key".to_string(), "é".to_string())]);
        assert_eq!(
            pairs("&&flag&x=").unwrap(),
            [("flag".to_string(), String::new()), ("x".to_string(), String::new())]
        );
    }
}
