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
    /// JSON_AGG and ARRAY_AGG: every value with its sort keys and count, kept in order (rows
    /// of a table can leave, so each value is kept, not only the array).
    Collected {
        entries: Vec<Collected>,
        /// Per sort key, whether it sorts descending.
        descending: Vec<bool>,
    },
}

/// One collected value: `[value, sort keys…]` as [`Column::argument`] gives it, how many
/// times it was added.
///
/// [`Column::argument`]: super::super::Column::argument
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Collected {
    keys: Vec<Value>,
    value: Value,
    count: u64,
}

/// The order of collected values: by each sort key (nulls last ascending, first descending;
/// values of different kinds by kind), then by the value's JSON text, so that the order is
/// the same on every node and after every replay.
fn collected_order(descending: &[bool], a: (&[Value], &Value), b: (&[Value], &Value)) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let kind = |value: &Value| match value {
        Value::Bool(_) => 0,
        Value::Number(_) => 1,
        Value::String(_) => 2,
        Value::Array(_) => 3,
        Value::Object(_) => 4,
        Value::Null => 5,
    };
    for (at, (left, right)) in a.0.iter().zip(b.0).enumerate() {
        let order = match (left.is_null(), right.is_null()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            (false, false) => super::super::expr::compare(left, right)
                .unwrap_or_else(|| kind(left).cmp(&kind(right)).then_with(|| left.to_string().cmp(&right.to_string()))),
        };
        let order = if descending.get(at).copied().unwrap_or(false) { order.reverse() } else { order };
        if order != Ordering::Equal {
            return order;
        }
    }
    a.1.to_string().cmp(&b.1.to_string())
}

impl Acc {
    /// Where `[value, keys…]` goes in `entries`: `Ok` at an equal entry, `Err` where it would.
    fn collected_at(entries: &[Collected], descending: &[bool], keys: &[Value], value: &Value) -> Result<usize, usize> {
        entries.binary_search_by(|entry| collected_order(descending, (&entry.keys, &entry.value), (keys, value)))
    }

    /// `[value, keys…]` apart.
    fn split_collected(arg: Option<&Value>) -> (Value, Vec<Value>) {
        match arg {
            Some(Value::Array(parts)) if !parts.is_empty() => (parts[0].clone(), parts[1..].to_vec()),
            _ => (Value::Null, Vec::new()),
        }
    }
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
    pub(super) fn new(spec: Spec) -> Acc {
        let Spec { function, descending } = spec;
        match function {
            AggregateKind::Count => Acc::Count { n: 0 },
            AggregateKind::CountDistinct => Acc::Distinct { values: HashMap::new() },
            AggregateKind::Sum => Acc::Sum { int: 0, float: 0.0, floats: 0, n: 0 },
            AggregateKind::Avg => Acc::Avg { sum: 0.0, n: 0 },
            AggregateKind::Min => Acc::Min { best: None },
            AggregateKind::Max => Acc::Max { best: None },
            AggregateKind::First => Acc::First { at: None, value: Value::Null },
            AggregateKind::Last => Acc::Last { at: None, value: Value::Null },
            AggregateKind::JsonAgg | AggregateKind::ArrayAgg => Acc::Collected { entries: Vec::new(), descending },
        }
    }

    /// An accumulator rows can leave as well as join (views over tables).
    pub(super) fn retractable(spec: Spec) -> Acc {
        match spec.function {
            AggregateKind::Min => Acc::Ranked { values: BTreeMap::new(), max: false },
            AggregateKind::Max => Acc::Ranked { values: BTreeMap::new(), max: true },
            _ => Acc::new(spec),
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
            Acc::Collected { entries, descending } => {
                let (value, keys) = Acc::split_collected(arg);
                if let Ok(at) = Acc::collected_at(entries, descending, &keys, &value) {
                    entries[at].count -= 1;
                    if entries[at].count == 0 {
                        entries.remove(at);
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
            Acc::Collected { entries, descending } => {
                let (value, keys) = Acc::split_collected(arg);
                match Acc::collected_at(entries, descending, &keys, &value) {
                    Ok(at) => entries[at].count += 1,
                    Err(at) => entries.insert(at, Collected { keys, value, count: 1 }),
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
            (this @ Acc::Collected { .. }, Acc::Collected { entries, .. }) => {
                for entry in entries {
                    let arg = Value::Array(std::iter::once(entry.value).chain(entry.keys).collect());
                    for _ in 0..entry.count {
                        this.add(Some(&arg), (0, 0, 0));
                    }
                }
            }
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
            Acc::Collected { entries, .. } if entries.is_empty() => Value::Null,
            Acc::Collected { entries, .. } => Value::Array(
                entries
                    .iter()
                    .flat_map(|entry| std::iter::repeat_n(&entry.value, entry.count as usize))
                    .cloned()
                    .collect(),
            ),
        }
    }
}

/// What an accumulator is made for: its function and, for one that collects, its sort keys'
/// directions.
pub(super) struct Spec {
    function: AggregateKind,
    descending: Vec<bool>,
}

pub(super) fn aggregates(def: &ViewDef) -> impl Iterator<Item = Spec> + '_ {
    def.columns.iter().filter_map(|column| match column {
        Column::Aggregate { function, order_by, .. } => {
            Some(Spec { function: *function, descending: order_by.iter().map(|key| key.descending).collect() })
        }
        Column::Key { .. } => None,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn collected_values_keep_their_order_their_duplicates_and_can_leave() {
        let mut acc = Acc::retractable(Spec { function: AggregateKind::JsonAgg, descending: vec![true] });
        let arg = |value: Value, key: Value| json!([value, key]);
        for (value, key) in
            [(json!("b"), json!(2)), (json!("a"), json!(5)), (json!("n"), json!(null)), (json!("b"), json!(2))]
        {
            acc.add(Some(&arg(value, key)), (0, 0, 0));
        }
        // Descending: nulls first, then 5, then the two 2s.
        assert_eq!(acc.value(), json!(["n", "a", "b", "b"]));
        acc.remove(Some(&arg(json!("b"), json!(2))));
        acc.remove(Some(&arg(json!("zz"), json!(9))));
        assert_eq!(acc.value(), json!(["n", "a", "b"]));
        for (value, key) in [("n", json!(null)), ("a", json!(5)), ("b", json!(2))] {
            acc.remove(Some(&arg(json!(value), key)));
        }
        assert_eq!(acc.value(), Value::Null);
        // Without ORDER BY, by the values' JSON text; a null value is collected too.
        let mut plain = Acc::new(Spec { function: AggregateKind::ArrayAgg, descending: Vec::new() });
        for value in [json!(3), json!(null), json!(1)] {
            plain.add(Some(&json!([value])), (0, 0, 0));
        }
        assert_eq!(plain.value(), json!([1, 3, null]));
    }
}
