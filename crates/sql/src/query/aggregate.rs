//! The aggregate functions of queries: COUNT (of rows, of values, of distinct values), SUM,
//! AVG, MIN, MAX, JSON_AGG and ARRAY_AGG (with their own ORDER BY), STRING_AGG, BOOL_AND and
//! BOOL_OR; each with DISTINCT and FILTER (WHERE …) as SQL has them.

use std::collections::HashSet;

use onehop_engine::view::Expr;
use onehop_engine::view::expr::Input;
use serde_json::{Number, Value};

use super::budget::{Budget, estimate};
use super::order::{Direction, by_terms, key, total};
use crate::SqlError;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// `COUNT(*)` when the argument is `None`.
    Count,
    Sum,
    Avg,
    Min,
    Max,
    /// JSON_AGG and ARRAY_AGG: the values as a JSON array.
    JsonAgg,
    StringAgg,
    BoolAnd,
    BoolOr,
}

/// The names aggregates are called by.
pub(super) const NAMES: &str = "COUNT, SUM, AVG, MIN, MAX, JSON_AGG, ARRAY_AGG, STRING_AGG, BOOL_AND, BOOL_OR";

impl Kind {
    pub(super) fn from_name(name: &str) -> Option<Kind> {
        Some(match name.to_ascii_lowercase().as_str() {
            "count" => Kind::Count,
            "sum" => Kind::Sum,
            "avg" => Kind::Avg,
            "min" => Kind::Min,
            "max" => Kind::Max,
            "json_agg" | "array_agg" | "jsonb_agg" => Kind::JsonAgg,
            "string_agg" => Kind::StringAgg,
            "bool_and" | "every" => Kind::BoolAnd,
            "bool_or" => Kind::BoolOr,
            _ => return None,
        })
    }
}

/// One aggregate of a query, its arguments resolved.
#[derive(Clone, Debug)]
pub(super) struct Aggregate {
    pub kind: Kind,
    pub arg: Option<Expr>,
    /// STRING_AGG's separator.
    pub separator: Option<Expr>,
    pub distinct: bool,
    pub filter: Option<Expr>,
    /// JSON_AGG's, ARRAY_AGG's and STRING_AGG's own ORDER BY.
    pub order: Vec<(Expr, Direction)>,
}

/// An aggregate's state for one group.
pub(super) struct Accumulator {
    seen: Option<HashSet<String>>,
    count: u64,
    int_sum: i128,
    float_sum: f64,
    floats: bool,
    best: Option<Value>,
    truth: Option<bool>,
    items: Vec<(Vec<Value>, Value)>,
    separator: Option<String>,
}

impl Accumulator {
    pub(super) fn new(aggregate: &Aggregate) -> Accumulator {
        Accumulator {
            seen: aggregate.distinct.then(HashSet::new),
            count: 0,
            int_sum: 0,
            float_sum: 0.0,
            floats: false,
            best: None,
            truth: None,
            items: Vec::new(),
            separator: None,
        }
    }

    /// Adds `row` (the query's row object) to the group.
    pub(super) fn add(&mut self, aggregate: &Aggregate, input: &Input, budget: &mut Budget) -> Result<(), SqlError> {
        if let Some(filter) = &aggregate.filter
            && !onehop_engine::view::expr::is_true(&filter.value(input))
        {
            return Ok(());
        }
        let Some(arg) = &aggregate.arg else {
            self.count += 1;
            return Ok(());
        };
        let value = arg.eval(input);
        if value.is_null() && aggregate.kind != Kind::JsonAgg {
            return Ok(());
        }
        if let Some(seen) = &mut self.seen
            && !seen.insert(key(&value))
        {
            return Ok(());
        }
        self.count += 1;
        match aggregate.kind {
            Kind::Count => {}
            Kind::Sum | Kind::Avg => match &value {
                Value::Number(number) => match number.as_i64() {
                    Some(int) if !self.floats => self.int_sum += i128::from(int),
                    _ => {
                        if !self.floats {
                            self.floats = true;
                            self.float_sum = self.int_sum as f64;
                        }
                        self.float_sum += number.as_f64().unwrap_or(f64::NAN);
                    }
                },
                // A value that is not a number is not added (and not counted for AVG).
                _ => self.count -= 1,
            },
            Kind::Min | Kind::Max => {
                let better = match &self.best {
                    None => true,
                    Some(best) => {
                        let ordering = total(&value, best);
                        if aggregate.kind == Kind::Min { ordering.is_lt() } else { ordering.is_gt() }
                    }
                };
                if better {
                    budget.hold(&value)?;
                    self.best = Some(value);
                }
            }
            Kind::JsonAgg | Kind::StringAgg => {
                if aggregate.kind == Kind::StringAgg && self.separator.is_none() {
                    let separator = aggregate.separator.as_ref().map(|separator| separator.eval(input));
                    self.separator = Some(separator.as_ref().map_or(String::new(), text));
                }
                let keys: Vec<Value> = aggregate.order.iter().map(|(expr, _)| expr.eval(input)).collect();
                budget.hold_bytes(estimate(&value) + keys.iter().map(estimate).sum::<u64>())?;
                self.items.push((keys, value));
            }
            Kind::BoolAnd | Kind::BoolOr => {
                let Value::Bool(truth) = value else {
                    self.count -= 1;
                    return Ok(());
                };
                self.truth = Some(match (self.truth, aggregate.kind) {
                    (None, _) => truth,
                    (Some(so_far), Kind::BoolAnd) => so_far && truth,
                    (Some(so_far), _) => so_far || truth,
                });
            }
        }
        Ok(())
    }

    /// The aggregate's value for the group.
    pub(super) fn finish(mut self, aggregate: &Aggregate) -> Value {
        match aggregate.kind {
            Kind::Count => Value::from(self.count),
            Kind::Sum if self.count == 0 => Value::Null,
            Kind::Sum if self.floats => float(self.float_sum),
            Kind::Sum => match i64::try_from(self.int_sum) {
                Ok(int) => Value::from(int),
                Err(_) => float(self.int_sum as f64),
            },
            Kind::Avg if self.count == 0 => Value::Null,
            Kind::Avg => {
                let sum = if self.floats { self.float_sum } else { self.int_sum as f64 };
                float(sum / self.count as f64)
            }
            Kind::Min | Kind::Max => self.best.unwrap_or(Value::Null),
            Kind::JsonAgg | Kind::StringAgg => {
                if self.items.is_empty() {
                    return Value::Null;
                }
                let terms: Vec<Direction> = aggregate.order.iter().map(|(_, direction)| *direction).collect();
                self.items.sort_by(|(left, _), (right, _)| by_terms(left, right, &terms));
                let values = self.items.into_iter().map(|(_, value)| value);
                if aggregate.kind == Kind::JsonAgg {
                    return Value::Array(values.collect());
                }
                let texts: Vec<String> = values.map(|value| text(&value)).collect();
                Value::String(texts.join(self.separator.as_deref().unwrap_or_default()))
            }
            Kind::BoolAnd | Kind::BoolOr => self.truth.map_or(Value::Null, Value::Bool),
        }
    }
}

fn float(value: f64) -> Value {
    Number::from_f64(value).map_or(Value::Null, Value::Number)
}

/// A value as STRING_AGG joins it: text as it is, anything else as JSON.
fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}
