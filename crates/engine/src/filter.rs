//! Subscription filters: which records (of a stream) or row changes (of a table) a subscription
//! wants, and how the hub finds subscriptions without visiting each one.
//!
//! A filter is a conjunction of: a subject pattern (`subject=scores/+`), a record key (a table
//! row: `/tables/t/{id}`) and `field=value` conditions on the JSON value. A condition matches a
//! field holding the string `value`, a number equal to `value`, `true`/`false`, `null` — or an
//! array with such an element (array membership: `tags=sports`).
//!
//! Equality is on canonical *typed keys* (`s:` text, `n:` number, `b:` boolean, `z` null), the
//! same keys the table indexes use, so "does 42 equal 42.0" has one answer everywhere. The hub
//! files each subscription under one anchor (its key, else one field condition's typed keys,
//! else its subject pattern) and, for a record, looks up only the anchors the record has.

use bytes::Bytes;
use serde_json::{Map, Number, Value};

use crate::error::EngineError;
use crate::subject::SubjectFilter;
use crate::tabledef::validate_field_name;

/// Most `field=value` conditions in one filter.
pub const FIELD_CONDITIONS_MAX: usize = 16;
/// Longest condition value, in bytes.
pub const CONDITION_VALUE_BYTES_MAX: usize = 1024;
/// Deepest `a.b.c` path.
pub const FIELD_PATH_DEPTH_MAX: usize = 8;

/// `field=value`: the field (a `.`-separated path into nested objects) holds `value`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Condition {
    pub path: String,
    segments: Vec<String>,
    pub value: String,
    /// The typed keys a field value may have to match (`s:42`, `n:42`).
    keys: Vec<String>,
}

impl Condition {
    pub fn new(path: &str, value: &str) -> Result<Condition, EngineError> {
        let segments: Vec<String> = path.split('.').map(str::to_string).collect();
        if segments.len() > FIELD_PATH_DEPTH_MAX {
            return Err(EngineError::InvalidFilter(format!(
                "{path}: at most {FIELD_PATH_DEPTH_MAX} levels of nesting"
            )));
        }
        for segment in &segments {
            validate_field_name(segment).map_err(|error| EngineError::InvalidFilter(format!("{path}: {error}")))?;
        }
        if value.len() > CONDITION_VALUE_BYTES_MAX {
            return Err(EngineError::InvalidFilter(format!(
                "{path}: the value is longer than {CONDITION_VALUE_BYTES_MAX} bytes"
            )));
        }
        Ok(Condition { path: path.to_string(), segments, value: value.to_string(), keys: query_keys(value) })
    }

    /// The typed keys a field must have for this condition to hold.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The field this condition looks at, in `doc`.
    pub fn field<'a>(&self, doc: &'a Value) -> Option<&'a Value> {
        field_at(doc, &self.segments)
    }

    pub fn matches(&self, doc: &Value) -> bool {
        doc.as_object().is_some_and(|row| self.matches_row(row))
    }

    /// Whether the condition holds for the JSON object `row`.
    pub fn matches_row(&self, row: &Map<String, Value>) -> bool {
        let (first, rest) = self.segments.split_first().expect("a path has a segment");
        row.get(first).and_then(|value| field_at(value, rest)).is_some_and(|field| {
            let mut found = false;
            for_each_key(field, |key| found |= self.keys.iter().any(|wanted| wanted == key));
            found
        })
    }
}

fn field_at<'a>(doc: &'a Value, segments: &[String]) -> Option<&'a Value> {
    let mut value = doc;
    for segment in segments {
        value = value.as_object()?.get(segment)?;
    }
    Some(value)
}

/// The typed key of a scalar JSON value; `None` for objects and arrays.
pub fn value_key(value: &Value) -> Option<String> {
    Some(match value {
        Value::String(text) => format!("s:{text}"),
        Value::Number(number) => format!("n:{}", canonical_number(number)),
        Value::Bool(flag) => format!("b:{flag}"),
        Value::Null => "z".to_string(),
        Value::Array(_) | Value::Object(_) => return None,
    })
}

/// Calls `visit` with the typed key of `value`, or of each scalar element when it is an array
/// (an element repeated is visited once).
pub fn for_each_key(value: &Value, mut visit: impl FnMut(&str)) {
    match value {
        Value::Array(items) => {
            let mut keys: Vec<String> = items.iter().filter_map(value_key).collect();
            keys.sort_unstable();
            keys.dedup();
            for key in &keys {
                visit(key);
            }
        }
        other => {
            if let Some(key) = value_key(other) {
                visit(&key);
            }
        }
    }
}

/// One spelling per number: integers without a fraction, others in Rust's shortest form.
fn canonical_number(number: &Number) -> String {
    if let Some(integer) = number.as_i64() {
        return integer.to_string();
    }
    if let Some(integer) = number.as_u64() {
        return integer.to_string();
    }
    canonical_float(number.as_f64().unwrap_or(f64::NAN))
}

fn canonical_float(float: f64) -> String {
    if float.fract() == 0.0 && float.abs() < 9.0e15 { (float as i64).to_string() } else { float.to_string() }
}

/// The typed keys that a query or filter value `text` (always a string in a URL) matches.
pub fn query_keys(text: &str) -> Vec<String> {
    let mut keys = vec![format!("s:{text}")];
    let number = if let Ok(integer) = text.parse::<i64>() {
        Some(integer.to_string())
    } else if let Ok(integer) = text.parse::<u64>() {
        Some(integer.to_string())
    } else {
        // Only JSON-looking numbers: "inf", "NaN" and "1e400" are text.
        text.parse::<f64>()
            .ok()
            .filter(|float| float.is_finite() && text.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)))
            .map(canonical_float)
    };
    if let Some(number) = number {
        keys.push(format!("n:{number}"));
    }
    if text == "true" || text == "false" {
        keys.push(format!("b:{text}"));
    }
    if text == "null" {
        keys.push("z".into());
    }
    keys
}

/// What a subscription asks for. Every part present must hold (an empty filter matches
/// everything).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    pub subject: Option<SubjectFilter>,
    pub key: Option<Bytes>,
    pub conditions: Vec<Condition>,
}

impl Filter {
    pub fn subject(filter: SubjectFilter) -> Filter {
        Filter { subject: Some(filter), ..Filter::default() }
    }

    /// Adds `path=value`.
    pub fn with_condition(mut self, path: &str, value: &str) -> Result<Filter, EngineError> {
        if self.conditions.len() == FIELD_CONDITIONS_MAX {
            return Err(EngineError::InvalidFilter(format!(
                "at most {FIELD_CONDITIONS_MAX} field conditions in one filter"
            )));
        }
        self.conditions.push(Condition::new(path, value)?);
        Ok(self)
    }

    pub fn is_empty(&self) -> bool {
        self.subject.is_none() && self.key.is_none() && self.conditions.is_empty()
    }

    /// Whether a record with `key` and `subject` whose value is `doc` matches.
    pub fn matches(&self, key: Option<&[u8]>, subject: Option<&str>, doc: Option<&Value>) -> bool {
        self.matches_row(key, subject, doc.and_then(Value::as_object))
    }

    /// As `matches`, for a value already known to be an object (or none).
    pub fn matches_row(&self, key: Option<&[u8]>, subject: Option<&str>, doc: Option<&Map<String, Value>>) -> bool {
        if let Some(wanted) = &self.subject
            && !subject.is_some_and(|subject| wanted.matches(subject))
        {
            return false;
        }
        if let Some(wanted) = &self.key
            && key != Some(wanted.as_ref())
        {
            return false;
        }
        if self.conditions.is_empty() {
            return true;
        }
        let Some(doc) = doc else { return false };
        self.conditions.iter().all(|condition| condition.matches_row(doc))
    }
}

/// Parses a JSON object, or `None` when `bytes` is not one (a stream value may be anything).
pub fn parse_object(bytes: &[u8]) -> Option<Value> {
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value @ Value::Object(_)) => Some(value),
        _ => None,
    }
}

/// A row before a change, rebuilt from the row after it and the change's `prev` description:
/// `{"set": {field: old value}, "unset": [fields the old row lacked]}`.
pub fn previous_row(after: &Map<String, Value>, prev: &Value) -> Option<Map<String, Value>> {
    let mut before = after.clone();
    let prev = prev.as_object()?;
    if let Some(Value::Object(set)) = prev.get("set") {
        for (field, value) in set {
            before.insert(field.clone(), value.clone());
        }
    }
    if let Some(Value::Array(unset)) = prev.get("unset") {
        for field in unset {
            before.remove(field.as_str()?);
        }
    }
    Some(before)
}

/// What `previous_row` needs to rebuild `before` from `after`: the top-level fields that differ.
pub fn describe_change(before: &Map<String, Value>, after: &Map<String, Value>) -> Value {
    let mut set = Map::new();
    for (field, value) in before {
        if after.get(field) != Some(value) {
            set.insert(field.clone(), value.clone());
        }
    }
    let unset: Vec<Value> =
        after.keys().filter(|field| !before.contains_key(*field)).map(|field| Value::String(field.clone())).collect();
    let mut prev = Map::new();
    if !set.is_empty() {
        prev.insert("set".into(), Value::Object(set));
    }
    if !unset.is_empty() {
        prev.insert("unset".into(), Value::Array(unset));
    }
    Value::Object(prev)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn condition(path: &str, value: &str) -> Condition {
        Condition::new(path, value).unwrap()
    }

    #[test]
    fn conditions_compare_typed_values() {
        let doc = json!({"customer": 42, "name": "42", "price": 4.5, "paid": true, "note": null,
                         "tags": ["sports", "news", 7], "address": {"city": "Oslo"}});
        assert!(condition("customer", "42").matches(&doc));
        assert!(condition("customer", "42.0").matches(&doc), "one number, two spellings");
        assert!(condition("name", "42").matches(&doc));
        assert!(!condition("name", "42.0").matches(&doc), "text compares as text");
        assert!(condition("price", "4.5").matches(&doc));
        assert!(condition("paid", "true").matches(&doc));
        assert!(!condition("paid", "1").matches(&doc));
        assert!(condition("note", "null").matches(&doc));
        assert!(!condition("missing", "null").matches(&doc), "absent is not null");
        assert!(condition("tags", "sports").matches(&doc), "array membership");
        assert!(condition("tags", "7").matches(&doc));
        assert!(!condition("tags", "sport").matches(&doc));
        assert!(condition("address.city", "Oslo").matches(&doc));
        assert!(!condition("address", "Oslo").matches(&doc));
        assert!(!condition("customer", "inf").matches(&json!({"customer": 1e308})));
        assert_eq!(query_keys("NaN"), ["s:NaN"]);
    }

    #[test]
    fn bad_conditions_are_refused() {
        assert!(Condition::new("a b", "x").is_err());
        assert!(Condition::new("a..b", "x").is_err());
        assert!(Condition::new(&"a.".repeat(9), "x").is_err());
        assert!(Condition::new("a", &"x".repeat(2000)).is_err());
        let mut filter = Filter::default();
        for i in 0..FIELD_CONDITIONS_MAX {
            filter = filter.with_condition(&format!("f{i}"), "1").unwrap();
        }
        assert!(filter.with_condition("one_more", "1").is_err());
    }

    #[test]
    fn filters_combine_subject_key_and_fields() {
        let filter = Filter::subject(SubjectFilter::parse("scores/+").unwrap()).with_condition("team", "red").unwrap();
        let doc = json!({"team": "red"});
        assert!(filter.matches(None, Some("scores/1"), Some(&doc)));
        assert!(!filter.matches(None, Some("scores/1/2"), Some(&doc)));
        assert!(!filter.matches(None, Some("scores/1"), Some(&json!({"team": "blue"}))));
        assert!(!filter.matches(None, Some("scores/1"), None), "a value that is not JSON has no fields");
        let row = Filter { key: Some(Bytes::from_static(b"o1")), ..Filter::default() };
        assert!(row.matches(Some(b"o1"), None, None));
        assert!(!row.matches(Some(b"o2"), None, None));
        assert!(Filter::default().matches(None, None, None));
    }

    #[test]
    fn a_change_description_rebuilds_the_row_before() {
        let before = json!({"id": "o1", "customer": 42, "gone": 1, "same": [1, 2]});
        let after = json!({"id": "o1", "customer": 43, "new": true, "same": [1, 2]});
        let prev = describe_change(before.as_object().unwrap(), after.as_object().unwrap());
        assert_eq!(prev, json!({"set": {"customer": 42, "gone": 1}, "unset": ["new"]}));
        let rebuilt = previous_row(after.as_object().unwrap(), &prev).unwrap();
        assert_eq!(Value::Object(rebuilt), before);
    }
}
