//! How a JSON value reads in SQL: as text, as a number, as a truth value; the order and equality
//! of two values; GROUP BY keys, event times, and `CAST`. Everything that does not fit gives
//! `None` (null), never an error.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::{Number, Value};

use super::CastType;

/// Only JSON `true` is true: how WHERE, CASE WHEN and AND/OR read a value.
pub fn is_true(value: &Value) -> bool {
    matches!(value, Value::Bool(true))
}

/// The text a GROUP BY value is keyed by: a string as it is, a number as its shortest JSON text
/// (an integral float as an integer: `42.0` → `42`), `true`/`false`, `null`, and an array or
/// object as compact JSON.
pub fn key_text(value: &Value) -> String {
    match text_of(value) {
        Some(text) => text.into_owned(),
        None => "null".to_string(),
    }
}

/// An event time: a number of ms since the epoch, or an RFC 3339 text with a zone. Anything
/// else (including a number out of range) is `None`.
pub fn as_time_ms(value: &Value) -> Option<i64> {
    match value {
        Value::Number(number) => match number.as_i64() {
            Some(ms) => Some(ms),
            None => number.as_f64().and_then(float_to_i64),
        },
        Value::String(text) => crate::units::parse_rfc3339_ms(text).ok(),
        _ => None,
    }
}

pub(super) static NULL: Value = Value::Null;

pub(super) fn owned<'v>(value: Option<Value>) -> Cow<'v, Value> {
    match value {
        Some(value) => Cow::Owned(value),
        None => Cow::Borrowed(&NULL),
    }
}

/// A value as text (`->>`, `CAST(… AS TEXT)`, `||`, CONCAT, GROUP BY keys); `None` for null.
pub(super) fn text_of(value: &Value) -> Option<Cow<'_, str>> {
    match value {
        Value::Null => None,
        Value::String(text) => Some(Cow::Borrowed(text)),
        Value::Bool(true) => Some(Cow::Borrowed("true")),
        Value::Bool(false) => Some(Cow::Borrowed("false")),
        Value::Number(number) => Some(Cow::Owned(number_text(number))),
        Value::Array(_) | Value::Object(_) => Some(Cow::Owned(value.to_string())),
    }
}

/// A number's canonical text: integers as they are, integral floats within the i64 range as
/// integers (so `42` and `42.0` group together), other floats as serde_json writes them.
pub(super) fn number_text(number: &Number) -> String {
    if number.is_f64()
        && let Some(float) = number.as_f64()
        && float.fract() == 0.0
        && let Some(int) = float_to_i64(float)
    {
        return int.to_string();
    }
    number.to_string()
}

/// A float's integer part, if it is in the i64 range.
pub(super) fn float_to_i64(float: f64) -> Option<i64> {
    // 2^63 is exactly representable; every float below it and at or above -2^63 fits.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    (-LIMIT..LIMIT).contains(&float).then_some(float as i64)
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Num {
    Int(i64),
    Float(f64),
}

pub(super) fn number(value: &Value) -> Option<Num> {
    let Value::Number(number) = value else { return None };
    match number.as_i64() {
        Some(int) => Some(Num::Int(int)),
        None => number.as_f64().map(Num::Float),
    }
}

impl Num {
    pub(super) fn float(self) -> f64 {
        match self {
            Num::Int(int) => int as f64,
            Num::Float(float) => float,
        }
    }
}

/// A float as JSON; NaN and infinities (which JSON cannot hold) are null.
pub(super) fn float_value(float: f64) -> Value {
    Number::from_f64(float).map_or(Value::Null, Value::Number)
}

/// An integer argument (an integral float counts).
pub(super) fn integer(value: &Value) -> Option<i64> {
    match number(value)? {
        Num::Int(int) => Some(int),
        Num::Float(float) if float.fract() == 0.0 => float_to_i64(float),
        Num::Float(_) => None,
    }
}

pub(super) fn truth(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(truth) => Some(*truth),
        _ => None,
    }
}

/// SQL AND over known/unknown truths: false wins over unknown.
pub(super) fn and(left: Option<bool>, right: Option<bool>) -> Option<bool> {
    match (left, right) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

/// SQL OR: true wins over unknown.
pub(super) fn or(left: Option<bool>, right: Option<bool>) -> Option<bool> {
    match (left, right) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

/// Order of two values of one kind: numbers numerically, strings by code point, false before
/// true. Null, mixed kinds, arrays and objects have none.
pub fn compare(left: &Value, right: &Value) -> Option<Ordering> {
    match (left, right) {
        (Value::Number(_), Value::Number(_)) => match (number(left)?, number(right)?) {
            (Num::Int(left), Num::Int(right)) => Some(left.cmp(&right)),
            (Num::Int(int), Num::Float(float)) => compare_int_float(int, float),
            (Num::Float(float), Num::Int(int)) => compare_int_float(int, float).map(Ordering::reverse),
            (Num::Float(left), Num::Float(right)) => left.partial_cmp(&right),
        },
        (Value::String(left), Value::String(right)) => Some(left.cmp(right)),
        (Value::Bool(left), Value::Bool(right)) => Some(left.cmp(right)),
        _ => None,
    }
}

/// Exact order of an integer and a float (converting the integer would round above 2^53).
pub(super) fn compare_int_float(int: i64, float: f64) -> Option<Ordering> {
    if float.is_nan() {
        return None;
    }
    let Some(whole) = float_to_i64(float.trunc()) else {
        return Some(if float > 0.0 { Ordering::Less } else { Ordering::Greater });
    };
    Some(int.cmp(&whole).then_with(|| 0.0.partial_cmp(&float.fract()).unwrap_or(Ordering::Equal)))
}

/// SQL `=`: values of one kind (arrays and objects when they are the same JSON); unknown when
/// either is null or the kinds differ.
pub fn equals(left: &Value, right: &Value) -> Option<bool> {
    match (left, right) {
        (Value::Array(_), Value::Array(_)) | (Value::Object(_), Value::Object(_)) => Some(left == right),
        _ => compare(left, right).map(Ordering::is_eq),
    }
}
pub(super) fn cast(value: &Value, to: CastType) -> Option<Value> {
    match to {
        CastType::Text => text_of(value).map(|text| Value::String(text.into_owned())),
        CastType::Bigint => match value {
            Value::Number(_) => match number(value)? {
                Num::Int(int) => Some(Value::from(int)),
                Num::Float(float) => float_to_i64(float.round()).map(Value::from),
            },
            Value::String(text) => text.trim().parse::<i64>().ok().map(Value::from),
            Value::Bool(truth) => Some(Value::from(i64::from(*truth))),
            _ => None,
        },
        CastType::Double => match value {
            Value::Number(_) => Some(float_value(number(value)?.float())),
            Value::String(text) => text.trim().parse::<f64>().ok().filter(|float| float.is_finite()).map(float_value),
            _ => None,
        },
        CastType::Boolean => match value {
            Value::Bool(truth) => Some(Value::Bool(*truth)),
            Value::Number(_) => match number(value)? {
                Num::Int(int) => Some(Value::Bool(int != 0)),
                Num::Float(_) => None,
            },
            Value::String(text) => {
                let text = text.trim();
                let is = |words: &[&str]| words.iter().any(|word| word.eq_ignore_ascii_case(text));
                if is(&["true", "t", "yes", "y", "on", "1"]) {
                    Some(Value::Bool(true))
                } else if is(&["false", "f", "no", "n", "off", "0"]) {
                    Some(Value::Bool(false))
                } else {
                    None
                }
            }
            _ => None,
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::Expr;
    use super::super::testing::{eval, literal};
    use super::*;

    #[test]
    fn casts_convert_or_give_null() {
        let cast = |value: Value, to| eval(&Expr::Cast { expr: Box::new(literal(value)), to });
        use CastType::*;
        assert_eq!(cast(json!("x"), Text), json!("x"));
        assert_eq!(cast(json!(42), Text), json!("42"));
        assert_eq!(cast(json!(42.0), Text), json!("42"));
        assert_eq!(cast(json!(4.25), Text), json!("4.25"));
        assert_eq!(cast(json!(false), Text), json!("false"));
        assert_eq!(cast(json!({"a": [1]}), Text), json!("{\"a\":[1]}"));
        assert_eq!(cast(json!(null), Text), Value::Null);
        assert_eq!(cast(json!(7), Bigint), json!(7));
        assert_eq!(cast(json!(2.5), Bigint), json!(3));
        assert_eq!(cast(json!(-2.5), Bigint), json!(-3));
        assert_eq!(cast(json!(1e300), Bigint), Value::Null);
        assert_eq!(cast(json!(" 42 "), Bigint), json!(42));
        assert_eq!(cast(json!("4.5"), Bigint), Value::Null);
        assert_eq!(cast(json!("x"), Bigint), Value::Null);
        assert_eq!(cast(json!(true), Bigint), json!(1));
        assert_eq!(cast(json!([1]), Bigint), Value::Null);
        assert_eq!(cast(json!(3), Double), json!(3.0));
        assert!(cast(json!(3), Double).is_f64());
        assert_eq!(cast(json!("2.5"), Double), json!(2.5));
        assert_eq!(cast(json!("NaN"), Double), Value::Null);
        assert_eq!(cast(json!("inf"), Double), Value::Null);
        assert_eq!(cast(json!(true), Double), Value::Null);
        assert_eq!(cast(json!("TRUE"), Boolean), json!(true));
        assert_eq!(cast(json!(" off "), Boolean), json!(false));
        assert_eq!(cast(json!("maybe"), Boolean), Value::Null);
        assert_eq!(cast(json!(0), Boolean), json!(false));
        assert_eq!(cast(json!(-3), Boolean), json!(true));
        assert_eq!(cast(json!(0.5), Boolean), Value::Null);
        assert_eq!(cast(json!(null), Boolean), Value::Null);
    }

    #[test]
    fn keys_truth_and_times() {
        assert_eq!(key_text(&json!("eu")), "eu");
        assert_eq!(key_text(&json!(42)), "42");
        assert_eq!(key_text(&json!(42.0)), "42");
        assert_eq!(key_text(&json!(-0.0)), "0");
        assert_eq!(key_text(&json!(4.5)), "4.5");
        assert_eq!(key_text(&json!(1e300)), "1e+300", "beyond i64: serde_json's text");
        assert_eq!(key_text(&json!(u64::MAX)), "18446744073709551615");
        assert_eq!(key_text(&json!(true)), "true");
        assert_eq!(key_text(&json!(null)), "null");
        assert_eq!(key_text(&json!({"b": [1, "x"]})), "{\"b\":[1,\"x\"]}");
        assert!(is_true(&json!(true)));
        for other in [json!(false), json!(null), json!(1), json!("true"), json!([true])] {
            assert!(!is_true(&other), "{other}");
        }
        assert_eq!(as_time_ms(&json!(1_700_000_000_123i64)), Some(1_700_000_000_123));
        assert_eq!(as_time_ms(&json!(-5)), Some(-5));
        assert_eq!(as_time_ms(&json!(1.7e12)), Some(1_700_000_000_000));
        assert_eq!(as_time_ms(&json!(1e30)), None);
        assert_eq!(as_time_ms(&json!(u64::MAX)), None);
        assert_eq!(as_time_ms(&json!("2023-11-14T22:13:20.123Z")), Some(1_700_000_000_123));
        assert_eq!(as_time_ms(&json!("2023-11-14T23:13:20+01:00")), Some(1_700_000_000_000));
        assert_eq!(as_time_ms(&json!("yesterday")), None);
        assert_eq!(as_time_ms(&json!(true)), None);
        assert_eq!(as_time_ms(&json!(null)), None);
    }
}
