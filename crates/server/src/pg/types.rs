//! onehop's JSON values as Postgres types, and a client's parameters as JSON values.
//!
//! An answer's column gets the type its values share: `int8` for integers, `float8` for numbers
//! with a fraction among them, `bool`, `text`, and `json` for arrays, objects, or a column whose
//! values mix kinds; a column of nulls only is `text`. Values go out in text (Postgres's own
//! spellings: `t`/`f`, shortest floats) or, when the client asks, in binary for `int8`,
//! `float8` and `bool` (text and json are their UTF-8 either way).

use serde_json::Value;

pub const BOOL: u32 = 16;
pub const INT8: u32 = 20;
pub const INT2: u32 = 21;
pub const INT4: u32 = 23;
pub const TEXT: u32 = 25;
pub const JSON: u32 = 114;
pub const FLOAT4: u32 = 700;
pub const FLOAT8: u32 = 701;
pub const VARCHAR: u32 = 1043;
pub const UNKNOWN: u32 = 0;

/// The type of a column holding `values`.
pub fn column_type<'v>(values: impl Iterator<Item = &'v Value>) -> u32 {
    let mut kind = None;
    for value in values {
        let this = match value {
            Value::Null => continue,
            Value::Bool(_) => BOOL,
            Value::Number(number) if number.is_i64() || number.is_u64() => INT8,
            Value::Number(_) => FLOAT8,
            Value::String(_) => TEXT,
            Value::Array(_) | Value::Object(_) => JSON,
        };
        kind = Some(match (kind, this) {
            (None, this) => this,
            (Some(same), this) if same == this => same,
            (Some(INT8), FLOAT8) | (Some(FLOAT8), INT8) => FLOAT8,
            _ => JSON,
        });
    }
    kind.unwrap_or(TEXT)
}

/// A value as the client reads it in a column of `oid`, in text or (`binary`) in binary.
pub fn encode(value: &Value, oid: u32, binary: bool) -> Option<Vec<u8>> {
    let text = |value: &Value| match value {
        Value::String(text) => text.clone(),
        Value::Bool(true) => "t".into(),
        Value::Bool(false) => "f".into(),
        other => other.to_string(),
    };
    match value {
        Value::Null => None,
        _ if oid == JSON => Some(value.to_string().into_bytes()),
        Value::Number(number) if binary && oid == INT8 => number.as_i64().map(|int| int.to_be_bytes().to_vec()),
        Value::Number(number) if binary && oid == FLOAT8 => number.as_f64().map(|float| float.to_be_bytes().to_vec()),
        Value::Bool(truth) if binary && oid == BOOL => Some(vec![u8::from(*truth)]),
        other => Some(text(other).into_bytes()),
    }
}

/// A parameter of type `oid`, sent in text or binary, as the JSON value the query compares:
/// integers and floats as numbers, booleans, and anything else (text, `unknown`) as text.
pub fn decode_parameter(bytes: &[u8], oid: u32, binary: bool) -> Result<Value, String> {
    let number = |text: &str| -> Result<Value, String> {
        if let Ok(int) = text.parse::<i64>() {
            return Ok(Value::from(int));
        }
        text.parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .ok_or_else(|| format!("{text:?} is not a number"))
    };
    if binary {
        return match (oid, bytes.len()) {
            (INT2, 2) => Ok(Value::from(i16::from_be_bytes(bytes.try_into().expect("2")))),
            (INT4, 4) => Ok(Value::from(i32::from_be_bytes(bytes.try_into().expect("4")))),
            (INT8, 8) => Ok(Value::from(i64::from_be_bytes(bytes.try_into().expect("8")))),
            (FLOAT4, 4) => Ok(float(f32::from_be_bytes(bytes.try_into().expect("4")) as f64)),
            (FLOAT8, 8) => Ok(float(f64::from_be_bytes(bytes.try_into().expect("8")))),
            (BOOL, 1) => Ok(Value::Bool(bytes[0] != 0)),
            (TEXT | VARCHAR | UNKNOWN | JSON, _) => utf8(bytes).map(Value::String),
            (oid, length) => Err(format!("a binary parameter of type {oid} and {length} bytes is not supported")),
        };
    }
    let text = utf8(bytes)?;
    match oid {
        INT2 | INT4 | INT8 | FLOAT4 | FLOAT8 => number(&text),
        BOOL => match text.to_ascii_lowercase().as_str() {
            "t" | "true" | "1" | "yes" | "on" => Ok(Value::Bool(true)),
            "f" | "false" | "0" | "no" | "off" => Ok(Value::Bool(false)),
            _ => Err(format!("{text:?} is not a boolean")),
        },
        _ => Ok(Value::String(text)),
    }
}

/// The Postgres type a declared column type's values are sent as.
pub fn oid_of(ty: &onehop_engine::ColumnType) -> u32 {
    match ty {
        onehop_engine::ColumnType::Integer => INT8,
        onehop_engine::ColumnType::Float => FLOAT8,
        onehop_engine::ColumnType::Boolean => BOOL,
        _ => TEXT,
    }
}

fn float(value: f64) -> Value {
    serde_json::Number::from_f64(value).map_or(Value::Null, Value::Number)
}

fn utf8(bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec()).map_err(|_| "a parameter is not UTF-8".to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn columns_take_the_type_their_values_share() {
        assert_eq!(column_type([json!(1), Value::Null, json!(2)].iter()), INT8);
        assert_eq!(column_type([json!(1), json!(2.5)].iter()), FLOAT8);
        assert_eq!(column_type([json!("a"), json!(1)].iter()), JSON);
        assert_eq!(column_type([Value::Null].iter()), TEXT);
        assert_eq!(encode(&json!(true), BOOL, false), Some(b"t".to_vec()));
        assert_eq!(encode(&json!(7), INT8, true), Some(7i64.to_be_bytes().to_vec()));
        assert_eq!(encode(&json!("x"), JSON, false), Some(b"\"x\"".to_vec()));
        assert_eq!(encode(&Value::Null, TEXT, false), None);
    }

    #[test]
    fn parameters_decode_by_their_type() {
        assert_eq!(decode_parameter(b"42", INT4, false).unwrap(), json!(42));
        assert_eq!(decode_parameter(&42i32.to_be_bytes(), INT4, true).unwrap(), json!(42));
        assert_eq!(decode_parameter(b"42", UNKNOWN, false).unwrap(), json!("42"));
        assert_eq!(decode_parameter(b"on", BOOL, false).unwrap(), json!(true));
        assert!(decode_parameter(b"x", INT8, false).is_err());
        assert!(decode_parameter(&[1, 2, 3], INT8, true).is_err());
    }
}
