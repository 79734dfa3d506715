//! The order ORDER BY sorts by, and the keys by which GROUP BY, DISTINCT and the set operations
//! tell values apart.
//!
//! Values of one kind compare as the expression language compares them (numbers numerically,
//! text by code point, false before true); across kinds, numbers come before text, text before
//! truth values, those before arrays and objects (compared as their JSON text). Null is the
//! largest, as in Postgres: last in ascending order, first in descending.

use std::cmp::Ordering;

use onehop_engine::view::expr::compare;
use serde_json::Value;

fn rank(value: &Value) -> u8 {
    match value {
        Value::Number(_) => 0,
        Value::String(_) => 1,
        Value::Bool(_) => 2,
        Value::Array(_) => 3,
        Value::Object(_) => 4,
        Value::Null => 5,
    }
}

/// The total order of two values.
pub(super) fn total(left: &Value, right: &Value) -> Ordering {
    match (rank(left), rank(right)) {
        (l, r) if l != r => l.cmp(&r),
        (3 | 4, _) => left.to_string().cmp(&right.to_string()),
        _ => compare(left, right).unwrap_or(Ordering::Equal),
    }
}

/// One ORDER BY term's direction.
#[derive(Clone, Copy, Debug)]
pub(super) struct Direction {
    pub descending: bool,
    pub nulls_first: bool,
}

/// Rows' sort keys compared term by term.
pub(super) fn by_terms(left: &[Value], right: &[Value], terms: &[Direction]) -> Ordering {
    for ((l, r), term) in left.iter().zip(right).zip(terms) {
        let ordering = match (l.is_null(), r.is_null()) {
            (true, true) => Ordering::Equal,
            (true, false) => {
                if term.nulls_first {
                    Ordering::Less
                } else {
                    Ordering::Greater
                }
            }
            (false, true) => {
                if term.nulls_first {
                    Ordering::Greater
                } else {
                    Ordering::Less
                }
            }
            (false, false) if term.descending => total(r, l),
            (false, false) => total(l, r),
        };
        if ordering != Ordering::Equal {
            return ordering;
        }
    }
    Ordering::Equal
}

/// The key two values share when GROUP BY or DISTINCT counts them as one: their kind and
/// canonical text (`1` and `1.0` are one number; `1` and `'1'` are two values).
pub(super) fn key(value: &Value) -> String {
    match onehop_engine::filter::value_key(value) {
        Some(key) => key,
        None => format!("j:{value}"),
    }
}

/// The key of several values at once.
pub(super) fn row_key(values: &[Value]) -> String {
    let mut text = String::new();
    for value in values {
        push_key(&mut text, value);
    }
    text
}

/// Appends the key of `value` to a key of several values, its length first (so that no two
/// rows' keys run together).
pub(super) fn push_key(text: &mut String, value: &Value) {
    use std::fmt::Write;
    match value {
        // As `key` spells it, without making it first.
        Value::String(string) => {
            let _ = write!(text, "{}:s:{string}", string.len() + 2);
        }
        other => {
            let key = key(other);
            let _ = write!(text, "{}:{key}", key.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn null_is_largest_and_kinds_do_not_mix() {
        let mut values = vec![json!(null), json!("b"), json!(2.5), json!(true), json!(1), json!("a")];
        values.sort_by(total);
        assert_eq!(values, vec![json!(1), json!(2.5), json!("a"), json!("b"), json!(true), json!(null)]);
        let descending = Direction { descending: true, nulls_first: true };
        assert_eq!(by_terms(&[json!(null)], &[json!(3)], &[descending]), Ordering::Less);
        assert_eq!(by_terms(&[json!(1)], &[json!(3)], &[descending]), Ordering::Greater);
    }

    #[test]
    fn keys_tell_kinds_apart_and_numbers_by_value() {
        assert_eq!(key(&json!(1)), key(&json!(1.0)));
        assert_ne!(key(&json!(1)), key(&json!("1")));
        assert_ne!(row_key(&[json!("a:b")]), row_key(&[json!("a"), json!("b")]));
    }
}
