//! An aggregate's running value: what COUNT, COUNT(DISTINCT), SUM, AVG, MIN, MAX, FIRST and LAST
//! keep per window, how an event adds to it (and, in a view over a table, a row takes back from
//! it), how two sessions' values merge, and the value a row shows.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::super::expr::key_text;
use super::super::{AggregateKind, Column, ViewDef};

/// An aggregate's running value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "acc", rename_all = "snake_case")]
pub(super) enum Acc {
    Count {
        n: u64,
    },
    Distinct {
        values: HashMap<String, u64>,
    },
    /// Integers add exactly; a float, or an integer sum leaving i64, makes the sum a float.
    Sum {
        int: i64,
        float: f64,
        floats: u64,
        n: u64,
    },
    Avg {
        sum: f64,
        n: u64,
    },
    Min {
        best: Option<Value>,
    },
    Max {
        best: Option<Value>,
    },
    /// The value at the earliest (First) or latest (Last) event time; ties by log position.
    First {
        at: Option<(i64, u32, u64)>,
        value: Value,
    },
    Last {
        at: Option<(i64, u32, u64)>,
        value: Value,
    },
    /// MIN or MAX of values that can also leave (a view over a table): every value with its
    /// count, by [`rank`]: numbers before texts, each in their order.
    Ranked {
        values: BTreeMap<String, (Value, u64)>,
        max: bool,
    },
}

/// A key that sorts numbers (by value) before texts (by text); `None` for other values.
fn rank(value: &Value) -> Option<String> {
    match value {
        Value::Number(number) => {
            let bits = number.as_f64()?.to_bits();
            // Flip so that the unsigned order of the bits is the order of the numbers.
            let sortable = if bits >> 63 == 1 { !bits } else { bits | (1 << 63) };
            Some(format!("n{sortable:016x}"))
        }
        Value::String(text) => Some(format!("t{text}")),
        _ => None,
    }
}

/// Numbers compare as numbers, text as text; anything else has no order.
fn compare(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64()?.partial_cmp(&y.as_f64()?),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

/// Replaces `best` with `arg` when it orders `want` against it (or there is none yet).
fn keep_if(best: &mut Option<Value>, arg: Option<&Value>, want: std::cmp::Ordering) {
    let Some(value) = arg.filter(|value| value.is_number() || value.is_string()) else { return };
    if best.as_ref().is_none_or(|current| compare(value, current) == Some(want)) {
        *best = Some(value.clone());
    }
}

impl Acc {
    pub(super) fn new(function: AggregateKind) -> Acc {
        match function {
            AggregateKind::Count => Acc::Count { n: 0 },
            AggregateKind::CountDistinct => Acc::Distinct { values: HashMap::new() },
            AggregateKind::Sum => Acc::Sum { int: 0, float: 0.0, floats: 0, n: 0 },
            AggregateKind::Avg => Acc::Avg { sum: 0.0, n: 0 },
            AggregateKind::Min => Acc::Min { best: None },
            AggregateKind::Max => Acc::Max { best: None },
            AggregateKind::First => Acc::First { at: None, value: Value::Null },
            AggregateKind::Last => Acc::Last { at: None, value: Value::Null },
        }
    }

    /// An accumulator rows can leave as well as join (views over tables).
    pub(super) fn retractable(function: AggregateKind) -> Acc {
        match function {
            AggregateKind::Min => Acc::Ranked { values: BTreeMap::new(), max: false },
            AggregateKind::Max => Acc::Ranked { values: BTreeMap::new(), max: true },
            other => Acc::new(other),
        }
    }

    /// Takes back what `add(arg)` added (a row left or changed). FIRST and LAST cannot be taken
    /// back (views over tables refuse them).
    pub(super) fn remove(&mut self, arg: Option<&Value>) {
        match self {
            Acc::Count { n } => {
                if arg.is_none_or(|value| !value.is_null()) {
                    *n = n.saturating_sub(1);
                }
            }
            Acc::Distinct { values } => {
                if let Some(value) = arg.filter(|value| !value.is_null()) {
                    let text = key_text(value);
                    if let Some(count) = values.get_mut(&text) {
                        *count -= 1;
                        if *count == 0 {
                            values.remove(&text);
                        }
                    }
                }
            }
            Acc::Sum { int, float, floats, n } => match arg.and_then(Value::as_number) {
                Some(number) if let Some(difference) = number.as_i64().and_then(|value| int.checked_sub(value)) => {
                    *int = difference;
                    *n = n.saturating_sub(1);
                }
                Some(number) => {
                    *float -= number.as_f64().unwrap_or(0.0);
                    *floats = floats.saturating_sub(1);
                    *n = n.saturating_sub(1);
                    if *floats == 0 {
                        // No float left in the sum: drop the rounding error with it.
                        *float = 0.0;
                    }
                }
                None => {}
            },
            Acc::Avg { sum, n } => {
                if let Some(value) = arg.and_then(Value::as_f64) {
                    *n = n.saturating_sub(1);
                    *sum = if *n == 0 { 0.0 } else { *sum - value };
                }
            }
            Acc::Ranked { values, .. } => {
                if let Some(rank) = arg.and_then(rank)
                    && let Some((_, count)) = values.get_mut(&rank)
                {
                    *count -= 1;
                    if *count == 0 {
                        values.remove(&rank);
                    }
                }
            }
            Acc::Min { .. } | Acc::Max { .. } | Acc::First { .. } | Acc::Last { .. } => {}
        }
    }

    /// Adds one event's argument (`None` for `COUNT(*)`), at `at` = (event time, partition,
    /// offset).
    pub(super) fn add(&mut self, arg: Option<&Value>, at: (i64, u32, u64)) {
        match self {
            Acc::Count { n } => {
                if arg.is_none_or(|value| !value.is_null()) {
                    *n += 1;
                }
            }
            Acc::Distinct { values } => {
                if let Some(value) = arg.filter(|value| !value.is_null()) {
                    *values.entry(key_text(value)).or_default() += 1;
                }
            }
            Acc::Sum { int, float, floats, n } => match arg.and_then(Value::as_number) {
                Some(number) if let Some(sum) = number.as_i64().and_then(|value| int.checked_add(value)) => {
                    *int = sum;
                    *n += 1;
                }
                Some(number) => {
                    *float += number.as_f64().unwrap_or(0.0);
                    *floats += 1;
                    *n += 1;
                }
                None => {}
            },
            Acc::Avg { sum, n } => {
                if let Some(value) = arg.and_then(Value::as_f64) {
                    *sum += value;
                    *n += 1;
                }
            }
            // A value of another kind than the best so far (text among numbers) is ignored: it
            // cannot be ordered against it.
            Acc::Min { best } => keep_if(best, arg, std::cmp::Ordering::Less),
            Acc::Max { best } => keep_if(best, arg, std::cmp::Ordering::Greater),
            Acc::First { at: best_at, value } => {
                if best_at.is_none_or(|best| at < best) {
                    *best_at = Some(at);
                    *value = arg.cloned().unwrap_or(Value::Null);
                }
            }
            Acc::Last { at: best_at, value } => {
                if best_at.is_none_or(|best| at > best) {
                    *best_at = Some(at);
                    *value = arg.cloned().unwrap_or(Value::Null);
                }
            }
            Acc::Ranked { values, .. } => {
                if let Some(value) = arg
                    && let Some(rank) = rank(value)
                {
                    values.entry(rank).or_insert_with(|| (value.clone(), 0)).1 += 1;
                }
            }
        }
    }

    /// Folds `other` (of the same function) in: two sessions become one.
    pub(super) fn merge(&mut self, other: Acc) {
        match (self, other) {
            (Acc::Count { n }, Acc::Count { n: more }) => *n += more,
            (Acc::Distinct { values }, Acc::Distinct { values: more }) => {
                for (value, count) in more {
                    *values.entry(value).or_default() += count;
                }
            }
            (Acc::Sum { int, float, floats, n }, Acc::Sum { int: i, float: f, floats: fs, n: more }) => {
                match int.checked_add(i) {
                    Some(sum) => *int = sum,
                    None => {
                        *float += i as f64;
                        *floats += 1;
                    }
                }
                *float += f;
                *floats += fs;
                *n += more;
            }
            (Acc::Avg { sum, n }, Acc::Avg { sum: s, n: more }) => {
                *sum += s;
                *n += more;
            }
            (
                this @ (Acc::Min { .. } | Acc::Max { .. }),
                Acc::Min { best: Some(value) } | Acc::Max { best: Some(value) },
            ) => {
                this.add(Some(&value), (0, 0, 0));
            }
            (this @ Acc::First { .. }, Acc::First { at: Some(at), value }) => this.add(Some(&value), at),
            (this @ Acc::Last { .. }, Acc::Last { at: Some(at), value }) => this.add(Some(&value), at),
            _ => {}
        }
    }

    pub(super) fn value(&self) -> Value {
        match self {
            Acc::Count { n } => Value::from(*n),
            Acc::Distinct { values } => Value::from(values.len()),
            Acc::Sum { n: 0, .. } => Value::Null,
            Acc::Sum { int, floats: 0, .. } => Value::from(*int),
            Acc::Sum { int, float, .. } => Value::from(*int as f64 + float),
            Acc::Avg { n: 0, .. } => Value::Null,
            Acc::Avg { sum, n } => Value::from(sum / *n as f64),
            Acc::Min { best } | Acc::Max { best } => best.clone().unwrap_or(Value::Null),
            Acc::First { value, .. } | Acc::Last { value, .. } => value.clone(),
            // The least number (or, with none, the least text); the greatest likewise.
            Acc::Ranked { values, max: false } => {
                values.values().next().map_or(Value::Null, |(value, _)| value.clone())
            }
            Acc::Ranked { values, max: true } => values
                .range(..="o".to_string())
                .next_back()
                .or_else(|| values.iter().next_back())
                .map_or(Value::Null, |(_, (value, _))| value.clone()),
        }
    }
}

pub(super) fn aggregates(def: &ViewDef) -> impl Iterator<Item = AggregateKind> + '_ {
    def.columns.iter().filter_map(|column| match column {
        Column::Aggregate { function, .. } => Some(*function),
        Column::Key { .. } => None,
    })
}
