//! The expression language of views and transforms: SQL expressions over one record and its
//! JSON value.
//!
//! An [`Expr`] is our own tree, not sqlparser's: it is what the catalog stores (as JSON, so its
//! serde form is part of the catalog format and only grows) and what the view runtime evaluates
//! once per record. Evaluation follows SQL with JSON values: a missing field, a type mismatch, a
//! division by zero or an overflow gives `null`, never an error or a panic, and `null` flows
//! through operators with SQL's three-valued logic.
//!
//! Evaluation borrows from the record and from the expression wherever it can (a field path is a
//! walk over the record's value, a literal is not copied to be compared), so a simple filter such
//! as `status = 'paid'` allocates nothing.
//!
//! - `value`: how a JSON value reads in SQL (text, numbers, truth, order, equality, casts).
//! - `eval`: evaluating an [`Expr`] against one record (paths, operators, IS/IN/BETWEEN/CASE).
//! - `like`: the LIKE matcher.
//! - `function`: the scalar functions (names, arity, evaluation).
//! - this module: the tree itself (what the catalog stores) and the record it is evaluated
//!   against.

mod eval;
mod function;
mod like;
#[cfg(test)]
mod testing;
mod value;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use function::{FUNCTION_NAMES, Function, compile_regex};
pub use value::{as_time_ms, compare, equals, is_true, key_text};

/// What an expression is evaluated against: one record, its value parsed as JSON (the value
/// as text when it is not JSON, `Null` when it has none).
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    pub key: Option<&'a [u8]>,
    pub subject: Option<&'a str>,
    pub timestamp_ms: i64,
    pub partition: u32,
    pub offset: u64,
    pub value: &'a Value,
    /// In a transform with `CROSS JOIN UNNEST(…)`: the element this output is made for, and
    /// its position in the array (from 1).
    pub element: Option<(&'a Value, u64)>,
    /// A query's joined row: each input's row by its alias, shared with where it was read
    /// rather than copied into `value`. A path whose first step names one of them reads that
    /// row; any other path reads `value`.
    pub scope: &'a [Scoped],
}

/// One input's row in a query's joined row: `None` where a LEFT JOIN found no match.
#[derive(Clone, Debug)]
pub struct Scoped {
    pub alias: std::sync::Arc<str>,
    pub row: Option<std::sync::Arc<serde_json::Map<String, Value>>>,
}

/// A field of the record itself rather than of its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordField {
    /// The key as UTF-8 text (invalid bytes replaced by U+FFFD); null when the record has none.
    Key,
    /// The subject; null when the record has none.
    Subject,
    /// The record's timestamp, ms since the epoch.
    Ts,
    Partition,
    Offset,
    /// The element of a transform's `UNNEST(…)` this output is made for (null elsewhere). No
    /// bare name means it: the SQL front end gives it the name the statement's alias says.
    Element,
    /// That element's position in its array, from 1 (`WITH ORDINALITY`; null elsewhere).
    Ordinality,
}

impl RecordField {
    /// The record field a bare SQL name means (`key`, `subject`, `ts`, `partition`, `offset`, in
    /// any case), if it is one.
    pub fn from_name(name: &str) -> Option<RecordField> {
        const FIELDS: [(&str, RecordField); 5] = [
            ("key", RecordField::Key),
            ("subject", RecordField::Subject),
            ("ts", RecordField::Ts),
            ("partition", RecordField::Partition),
            ("offset", RecordField::Offset),
        ];
        FIELDS.iter().find(|(field_name, _)| field_name.eq_ignore_ascii_case(name)).map(|(_, field)| *field)
    }

    pub(super) fn get(self, input: &Input) -> Value {
        match self {
            RecordField::Key => {
                input.key.map_or(Value::Null, |key| Value::String(String::from_utf8_lossy(key).into_owned()))
            }
            RecordField::Subject => input.subject.map_or(Value::Null, |subject| Value::String(subject.to_string())),
            RecordField::Ts => Value::from(input.timestamp_ms),
            RecordField::Partition => Value::from(input.partition),
            RecordField::Offset => Value::from(input.offset),
            RecordField::Element => input.element.map_or(Value::Null, |(element, _)| element.clone()),
            RecordField::Ordinality => input.element.map_or(Value::Null, |(_, position)| Value::from(position)),
        }
    }
}

/// One step into a JSON value: a field of an object, or an element of an array (a negative index
/// counts from the end). Serialized as the bare name or number.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Step {
    Field(String),
    Index(i64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnaryOp {
    /// `-x`
    Negate,
    /// `NOT x`
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryOp {
    Add,
    Subtract,
    Multiply,
    Divide,
    Modulo,
    Eq,
    NotEq,
    Lt,
    LtEq,
    Gt,
    GtEq,
    And,
    Or,
    /// `||`
    Concat,
}

/// What `IS [NOT] …` tests for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsTest {
    Null,
    True,
    False,
}

/// The target of `CAST(x AS …)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CastType {
    Text,
    Bigint,
    Double,
    Boolean,
}

/// One `WHEN … THEN …` of a CASE.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct When {
    pub when: Expr,
    pub then: Expr,
}

/// An expression. Stored in the catalog as JSON, tagged by `kind`:
/// `{"kind":"binary","operator":"gt","left":{"kind":"path","path":["amount"]},"right":{"kind":"literal","value":100}}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Expr {
    Literal {
        value: Value,
    },
    /// `key`, `subject`, `ts`, `partition`, `offset`.
    Record {
        field: RecordField,
    },
    /// A field of the record's value (`amount`, `customer.address.city`, `value->'items'->0`);
    /// the empty path is the whole value.
    Path {
        path: Vec<Step>,
    },
    /// `base->step->…` on a computed value; with `text`, the result as text (`->>`).
    Get {
        base: Box<Expr>,
        path: Vec<Step>,
        text: bool,
    },
    Unary {
        operator: UnaryOp,
        expr: Box<Expr>,
    },
    Binary {
        operator: BinaryOp,
        left: Box<Expr>,
        right: Box<Expr>,
    },
    /// `x IS [NOT] NULL | TRUE | FALSE`: never null itself.
    Is {
        expr: Box<Expr>,
        test: IsTest,
        negated: bool,
    },
    /// `x [NOT] IN (a, b, …)`
    In {
        expr: Box<Expr>,
        list: Vec<Expr>,
        negated: bool,
    },
    /// `x [NOT] LIKE | ILIKE pattern`: `%` any run of characters, `_` one character, `escape`
    /// (if any) makes the next character literal. SQL's default escape is a backslash.
    Like {
        expr: Box<Expr>,
        pattern: Box<Expr>,
        negated: bool,
        case_insensitive: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        escape: Option<char>,
    },
    /// `x [NOT] BETWEEN low AND high` (both ends included).
    Between {
        expr: Box<Expr>,
        low: Box<Expr>,
        high: Box<Expr>,
        negated: bool,
    },
    /// `CASE [operand] WHEN … THEN … [ELSE …] END`: with an operand, the first branch whose
    /// `when` equals it; without, the first whose `when` is true.
    Case {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        operand: Option<Box<Expr>>,
        branches: Vec<When>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        otherwise: Option<Box<Expr>>,
    },
    Cast {
        expr: Box<Expr>,
        to: CastType,
    },
    Call {
        function: Function,
        args: Vec<Expr>,
    },
}

impl Expr {
    /// Calls `visit` with every path of the value this expression reads (`Path` nodes; a
    /// `Get` reads its base's).
    pub fn visit_paths(&self, visit: &mut impl FnMut(&[Step])) {
        match self {
            Expr::Literal { .. } | Expr::Record { .. } => {}
            Expr::Path { path } => visit(path),
            Expr::Get { base, .. } => base.visit_paths(visit),
            Expr::Unary { expr, .. } | Expr::Is { expr, .. } | Expr::Cast { expr, .. } => expr.visit_paths(visit),
            Expr::Binary { left, right, .. } => {
                left.visit_paths(visit);
                right.visit_paths(visit);
            }
            Expr::In { expr, list, .. } => {
                expr.visit_paths(visit);
                list.iter().for_each(|item| item.visit_paths(visit));
            }
            Expr::Like { expr, pattern, .. } => {
                expr.visit_paths(visit);
                pattern.visit_paths(visit);
            }
            Expr::Between { expr, low, high, .. } => {
                expr.visit_paths(visit);
                low.visit_paths(visit);
                high.visit_paths(visit);
            }
            Expr::Case { operand, branches, otherwise } => {
                if let Some(operand) = operand {
                    operand.visit_paths(visit);
                }
                for branch in branches {
                    branch.when.visit_paths(visit);
                    branch.then.visit_paths(visit);
                }
                if let Some(otherwise) = otherwise {
                    otherwise.visit_paths(visit);
                }
            }
            Expr::Call { args, .. } => args.iter().for_each(|arg| arg.visit_paths(visit)),
        }
    }

    /// Rewrites every node bottom-up with `rewrite` (which may replace it), for a front end
    /// resolving names: `rewrite` returns an error to refuse the expression.
    pub fn try_rewrite<E>(&mut self, rewrite: &mut impl FnMut(&mut Expr) -> Result<(), E>) -> Result<(), E> {
        match self {
            Expr::Literal { .. } | Expr::Record { .. } | Expr::Path { .. } => {}
            Expr::Get { base, .. } => base.try_rewrite(rewrite)?,
            Expr::Unary { expr, .. } | Expr::Is { expr, .. } | Expr::Cast { expr, .. } => expr.try_rewrite(rewrite)?,
            Expr::Binary { left, right, .. } => {
                left.try_rewrite(rewrite)?;
                right.try_rewrite(rewrite)?;
            }
            Expr::In { expr, list, .. } => {
                expr.try_rewrite(rewrite)?;
                for item in list {
                    item.try_rewrite(rewrite)?;
                }
            }
            Expr::Like { expr, pattern, .. } => {
                expr.try_rewrite(rewrite)?;
                pattern.try_rewrite(rewrite)?;
            }
            Expr::Between { expr, low, high, .. } => {
                expr.try_rewrite(rewrite)?;
                low.try_rewrite(rewrite)?;
                high.try_rewrite(rewrite)?;
            }
            Expr::Case { operand, branches, otherwise } => {
                if let Some(operand) = operand {
                    operand.try_rewrite(rewrite)?;
                }
                for branch in branches {
                    branch.when.try_rewrite(rewrite)?;
                    branch.then.try_rewrite(rewrite)?;
                }
                if let Some(otherwise) = otherwise {
                    otherwise.try_rewrite(rewrite)?;
                }
            }
            Expr::Call { args, .. } => {
                for arg in args {
                    arg.try_rewrite(rewrite)?;
                }
            }
        }
        rewrite(self)
    }
}

impl<'a> Input<'a> {
    /// The input of `record` of `partition`, whose value parsed as JSON is `value`.
    pub fn of(record: &'a onehop_log::Record, partition: u32, value: &'a Value) -> Input<'a> {
        Input {
            key: record.key.as_deref(),
            subject: record.subject.as_deref(),
            timestamp_ms: record.timestamp_ms,
            partition,
            offset: record.offset,
            value,
            element: None,
            scope: &[],
        }
    }

    /// The input of a row (of a table, a view or a query) rather than of a record: no key,
    /// subject, time or position of its own.
    pub fn row(value: &'a Value) -> Input<'a> {
        Input { key: None, subject: None, timestamp_ms: 0, partition: 0, offset: 0, value, element: None, scope: &[] }
    }
}

/// A record's value as JSON: `Null` when it has none; its text (invalid UTF-8 replaced by
/// U+FFFD) when it is not JSON, so that `value` is a line of text a producer sent as such.
pub fn parse_value(record: &onehop_log::Record) -> Value {
    match record.value.as_deref() {
        None => Value::Null,
        Some(bytes) => {
            serde_json::from_slice(bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::testing::{binary, eval_on, literal, path};
    use super::*;

    #[test]
    fn the_catalog_form_is_tagged_json() {
        let expr = binary(
            BinaryOp::And,
            binary(BinaryOp::Gt, path("order.amount"), literal(json!(100))),
            Expr::Like {
                expr: Box::new(Expr::Record { field: RecordField::Subject }),
                pattern: Box::new(literal(json!("shop/%"))),
                negated: false,
                case_insensitive: false,
                escape: Some('\\'),
            },
        );
        let stored = serde_json::to_value(&expr).unwrap();
        assert_eq!(
            stored,
            json!({
                "kind": "binary", "operator": "and",
                "left": {"kind": "binary", "operator": "gt",
                         "left": {"kind": "path", "path": ["order", "amount"]},
                         "right": {"kind": "literal", "value": 100}},
                "right": {"kind": "like", "expr": {"kind": "record", "field": "subject"},
                          "pattern": {"kind": "literal", "value": "shop/%"},
                          "negated": false, "case_insensitive": false, "escape": "\\"}
            })
        );
        let text = serde_json::to_string(&expr).unwrap();
        assert_eq!(serde_json::from_str::<Expr>(&text).unwrap(), expr);
        let indexed: Expr = serde_json::from_value(json!({"kind": "path", "path": ["items", -1, "sku"]})).unwrap();
        assert_eq!(eval_on(&indexed, &json!({"items": [{"sku": "a"}, {"sku": "b"}]})), json!("b"));
        let case: Expr = serde_json::from_value(json!({"kind": "case", "branches": []})).unwrap();
        assert_eq!(case, Expr::Case { operand: None, branches: vec![], otherwise: None });
    }
}
