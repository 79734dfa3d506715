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

use std::borrow::Cow;
use std::cmp::Ordering;

use serde::{Deserialize, Serialize};
use serde_json::{Number, Value};

/// What an expression is evaluated against: one record, its value parsed as JSON (`Null`
/// when it is not JSON).
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    pub key: Option<&'a [u8]>,
    pub subject: Option<&'a str>,
    pub timestamp_ms: i64,
    pub partition: u32,
    pub offset: u64,
    pub value: &'a Value,
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

    fn get(self, input: &Input) -> Value {
        match self {
            RecordField::Key => {
                input.key.map_or(Value::Null, |key| Value::String(String::from_utf8_lossy(key).into_owned()))
            }
            RecordField::Subject => input.subject.map_or(Value::Null, |subject| Value::String(subject.to_string())),
            RecordField::Ts => Value::from(input.timestamp_ms),
            RecordField::Partition => Value::from(input.partition),
            RecordField::Offset => Value::from(input.offset),
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

/// A scalar function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Function {
    Upper,
    Lower,
    Length,
    Trim,
    Ltrim,
    Rtrim,
    Substring,
    Replace,
    Concat,
    Coalesce,
    Nullif,
    Abs,
    Round,
    Floor,
    Ceil,
    Greatest,
    Least,
}

/// Names of the scalar functions, as [`Function::from_name`] accepts them (for error messages).
pub const FUNCTION_NAMES: &str = "UPPER, LOWER, LENGTH (CHAR_LENGTH), TRIM, LTRIM, RTRIM, SUBSTRING (SUBSTR), REPLACE, \
     CONCAT, COALESCE, NULLIF, ABS, ROUND, FLOOR, CEIL (CEILING), GREATEST, LEAST";

impl Function {
    /// The function a SQL name means, in any case.
    pub fn from_name(name: &str) -> Option<Function> {
        const FUNCTIONS: [(&str, Function); 22] = [
            ("upper", Function::Upper),
            ("lower", Function::Lower),
            ("length", Function::Length),
            ("char_length", Function::Length),
            ("character_length", Function::Length),
            ("trim", Function::Trim),
            ("btrim", Function::Trim),
            ("ltrim", Function::Ltrim),
            ("rtrim", Function::Rtrim),
            ("substring", Function::Substring),
            ("substr", Function::Substring),
            ("replace", Function::Replace),
            ("concat", Function::Concat),
            ("coalesce", Function::Coalesce),
            ("nullif", Function::Nullif),
            ("abs", Function::Abs),
            ("round", Function::Round),
            ("floor", Function::Floor),
            ("ceil", Function::Ceil),
            ("ceiling", Function::Ceil),
            ("greatest", Function::Greatest),
            ("least", Function::Least),
        ];
        FUNCTIONS.iter().find(|(function_name, _)| function_name.eq_ignore_ascii_case(name)).map(|(_, f)| *f)
    }

    /// The SQL name, upper case.
    pub fn name(self) -> &'static str {
        match self {
            Function::Upper => "UPPER",
            Function::Lower => "LOWER",
            Function::Length => "LENGTH",
            Function::Trim => "TRIM",
            Function::Ltrim => "LTRIM",
            Function::Rtrim => "RTRIM",
            Function::Substring => "SUBSTRING",
            Function::Replace => "REPLACE",
            Function::Concat => "CONCAT",
            Function::Coalesce => "COALESCE",
            Function::Nullif => "NULLIF",
            Function::Abs => "ABS",
            Function::Round => "ROUND",
            Function::Floor => "FLOOR",
            Function::Ceil => "CEIL",
            Function::Greatest => "GREATEST",
            Function::Least => "LEAST",
        }
    }

    /// How many arguments it takes: at least the first, at most the second (`None`: any number).
    pub fn arity(self) -> (usize, Option<usize>) {
        match self {
            Function::Upper | Function::Lower | Function::Length | Function::Abs | Function::Floor | Function::Ceil => {
                (1, Some(1))
            }
            Function::Trim | Function::Ltrim | Function::Rtrim | Function::Round => (1, Some(2)),
            Function::Substring => (2, Some(3)),
            Function::Replace => (3, Some(3)),
            Function::Nullif => (2, Some(2)),
            Function::Concat | Function::Coalesce | Function::Greatest | Function::Least => (1, None),
        }
    }
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
        }
    }
}

/// A record's value as JSON: `Null` when it has none or it is not JSON.
pub fn parse_value(record: &onehop_log::Record) -> Value {
    record.value.as_deref().and_then(|bytes| serde_json::from_slice(bytes).ok()).unwrap_or(Value::Null)
}

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

static NULL: Value = Value::Null;

impl Expr {
    /// The value of this expression for one record.
    pub fn eval(&self, input: &Input) -> Value {
        self.value(input).into_owned()
    }

    /// Evaluation, borrowing from the record or the expression where the result is part of them.
    fn value<'v>(&'v self, input: &Input<'v>) -> Cow<'v, Value> {
        match self {
            Expr::Literal { value } => Cow::Borrowed(value),
            Expr::Record { field } => Cow::Owned(field.get(input)),
            Expr::Path { path } => Cow::Borrowed(walk(input.value, path).unwrap_or(&NULL)),
            Expr::Get { base, path, text } => {
                let found = match base.value(input) {
                    Cow::Borrowed(base) => walk(base, path).map(Cow::Borrowed),
                    Cow::Owned(base) => walk(&base, path).cloned().map(Cow::Owned),
                };
                match (found, *text) {
                    (None, _) => Cow::Borrowed(&NULL),
                    (Some(found), false) => found,
                    (Some(found), true) => owned(text_of(&found).map(|text| Value::String(text.into_owned()))),
                }
            }
            Expr::Unary { operator, expr } => {
                let value = expr.value(input);
                Cow::Owned(match operator {
                    UnaryOp::Negate => match number(&value) {
                        Some(Num::Int(int)) => int.checked_neg().map_or(Value::Null, Value::from),
                        Some(Num::Float(float)) => float_value(-float),
                        None => Value::Null,
                    },
                    UnaryOp::Not => truth(&value).map_or(Value::Null, |truth| Value::Bool(!truth)),
                })
            }
            Expr::Binary { operator, left, right } => Cow::Owned(binary(*operator, left, right, input)),
            Expr::Is { expr, test, negated } => {
                let value = expr.value(input);
                let holds = match test {
                    IsTest::Null => value.is_null(),
                    IsTest::True => *value == Value::Bool(true),
                    IsTest::False => *value == Value::Bool(false),
                };
                Cow::Owned(Value::Bool(holds != *negated))
            }
            Expr::In { expr, list, negated } => {
                let value = expr.value(input);
                if value.is_null() {
                    return Cow::Borrowed(&NULL);
                }
                let mut unknown = false;
                for item in list {
                    match equals(&value, &item.value(input)) {
                        Some(true) => return Cow::Owned(Value::Bool(!negated)),
                        Some(false) => {}
                        None => unknown = true,
                    }
                }
                owned((!unknown).then_some(Value::Bool(*negated)))
            }
            Expr::Like { expr, pattern, negated, case_insensitive, escape } => {
                let (value, pattern) = (expr.value(input), pattern.value(input));
                let (Value::String(text), Value::String(pattern)) = (&*value, &*pattern) else {
                    return Cow::Borrowed(&NULL);
                };
                Cow::Owned(Value::Bool(like(text, pattern, *escape, *case_insensitive) != *negated))
            }
            Expr::Between { expr, low, high, negated } => {
                let value = expr.value(input);
                let above_low = compare(&value, &low.value(input)).map(|order| order != Ordering::Less);
                let below_high = compare(&value, &high.value(input)).map(|order| order != Ordering::Greater);
                owned(and(above_low, below_high).map(|within| Value::Bool(within != *negated)))
            }
            Expr::Case { operand, branches, otherwise } => {
                let operand = operand.as_ref().map(|operand| operand.value(input));
                for branch in branches {
                    let when = branch.when.value(input);
                    let taken = match &operand {
                        Some(operand) => equals(operand, &when) == Some(true),
                        None => is_true(&when),
                    };
                    if taken {
                        return branch.then.value(input);
                    }
                }
                match otherwise {
                    Some(otherwise) => otherwise.value(input),
                    None => Cow::Borrowed(&NULL),
                }
            }
            Expr::Cast { expr, to } => owned(cast(&expr.value(input), *to)),
            Expr::Call { function, args } => call(*function, args, input),
        }
    }
}

fn owned<'v>(value: Option<Value>) -> Cow<'v, Value> {
    match value {
        Some(value) => Cow::Owned(value),
        None => Cow::Borrowed(&NULL),
    }
}

fn walk<'v>(mut at: &'v Value, path: &[Step]) -> Option<&'v Value> {
    for step in path {
        at = match (step, at) {
            (Step::Field(name), Value::Object(fields)) => fields.get(name)?,
            (Step::Index(index), Value::Array(items)) => {
                let index = if *index < 0 {
                    items.len().checked_sub(usize::try_from(index.unsigned_abs()).ok()?)?
                } else {
                    usize::try_from(*index).ok()?
                };
                items.get(index)?
            }
            _ => return None,
        };
    }
    Some(at)
}

/// A value as text (`->>`, `CAST(… AS TEXT)`, `||`, CONCAT, GROUP BY keys); `None` for null.
fn text_of(value: &Value) -> Option<Cow<'_, str>> {
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
fn number_text(number: &Number) -> String {
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
fn float_to_i64(float: f64) -> Option<i64> {
    // 2^63 is exactly representable; every float below it and at or above -2^63 fits.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    (-LIMIT..LIMIT).contains(&float).then_some(float as i64)
}

#[derive(Clone, Copy, Debug)]
enum Num {
    Int(i64),
    Float(f64),
}

fn number(value: &Value) -> Option<Num> {
    let Value::Number(number) = value else { return None };
    match number.as_i64() {
        Some(int) => Some(Num::Int(int)),
        None => number.as_f64().map(Num::Float),
    }
}

impl Num {
    fn float(self) -> f64 {
        match self {
            Num::Int(int) => int as f64,
            Num::Float(float) => float,
        }
    }
}

/// A float as JSON; NaN and infinities (which JSON cannot hold) are null.
fn float_value(float: f64) -> Value {
    Number::from_f64(float).map_or(Value::Null, Value::Number)
}

/// An integer argument (an integral float counts).
fn integer(value: &Value) -> Option<i64> {
    match number(value)? {
        Num::Int(int) => Some(int),
        Num::Float(float) if float.fract() == 0.0 => float_to_i64(float),
        Num::Float(_) => None,
    }
}

fn truth(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(truth) => Some(*truth),
        _ => None,
    }
}

/// SQL AND over known/unknown truths: false wins over unknown.
fn and(left: Option<bool>, right: Option<bool>) -> Option<bool> {
    match (left, right) {
        (Some(false), _) | (_, Some(false)) => Some(false),
        (Some(true), Some(true)) => Some(true),
        _ => None,
    }
}

/// SQL OR: true wins over unknown.
fn or(left: Option<bool>, right: Option<bool>) -> Option<bool> {
    match (left, right) {
        (Some(true), _) | (_, Some(true)) => Some(true),
        (Some(false), Some(false)) => Some(false),
        _ => None,
    }
}

/// Order of two values of one kind: numbers numerically, strings by code point, false before
/// true. Null, mixed kinds, arrays and objects have none.
fn compare(left: &Value, right: &Value) -> Option<Ordering> {
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
fn compare_int_float(int: i64, float: f64) -> Option<Ordering> {
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
fn equals(left: &Value, right: &Value) -> Option<bool> {
    match (left, right) {
        (Value::Array(_), Value::Array(_)) | (Value::Object(_), Value::Object(_)) => Some(left == right),
        _ => compare(left, right).map(Ordering::is_eq),
    }
}

fn binary<'v>(operator: BinaryOp, left: &'v Expr, right: &'v Expr, input: &Input<'v>) -> Value {
    match operator {
        BinaryOp::And => {
            let left = truth(&left.value(input));
            if left == Some(false) {
                return Value::Bool(false);
            }
            and(left, truth(&right.value(input))).map_or(Value::Null, Value::Bool)
        }
        BinaryOp::Or => {
            let left = truth(&left.value(input));
            if left == Some(true) {
                return Value::Bool(true);
            }
            or(left, truth(&right.value(input))).map_or(Value::Null, Value::Bool)
        }
        _ => {
            let (left, right) = (left.value(input), right.value(input));
            let result = match operator {
                BinaryOp::Add | BinaryOp::Subtract | BinaryOp::Multiply | BinaryOp::Divide | BinaryOp::Modulo => {
                    arithmetic(operator, &left, &right)
                }
                BinaryOp::Eq => equals(&left, &right).map(Value::Bool),
                BinaryOp::NotEq => equals(&left, &right).map(|equal| Value::Bool(!equal)),
                BinaryOp::Lt => compare(&left, &right).map(|order| Value::Bool(order.is_lt())),
                BinaryOp::LtEq => compare(&left, &right).map(|order| Value::Bool(order.is_le())),
                BinaryOp::Gt => compare(&left, &right).map(|order| Value::Bool(order.is_gt())),
                BinaryOp::GtEq => compare(&left, &right).map(|order| Value::Bool(order.is_ge())),
                BinaryOp::Concat => match (text_of(&left), text_of(&right)) {
                    (Some(left), Some(right)) => Some(Value::String(left.into_owned() + &right)),
                    _ => None,
                },
                BinaryOp::And | BinaryOp::Or => unreachable!("handled above"),
            };
            result.unwrap_or(Value::Null)
        }
    }
}

/// `+ - * / %`: integers stay integers (overflow and division by zero are null; `/` truncates
/// like SQL's integer division); anything with a float is a float.
fn arithmetic(operator: BinaryOp, left: &Value, right: &Value) -> Option<Value> {
    match (number(left)?, number(right)?) {
        (Num::Int(left), Num::Int(right)) => {
            let result = match operator {
                BinaryOp::Add => left.checked_add(right),
                BinaryOp::Subtract => left.checked_sub(right),
                BinaryOp::Multiply => left.checked_mul(right),
                BinaryOp::Divide => left.checked_div(right),
                BinaryOp::Modulo => left.checked_rem(right),
                _ => None,
            };
            result.map(Value::from)
        }
        (left, right) => {
            let (left, right) = (left.float(), right.float());
            let result = match operator {
                BinaryOp::Add => left + right,
                BinaryOp::Subtract => left - right,
                BinaryOp::Multiply => left * right,
                BinaryOp::Divide | BinaryOp::Modulo if right == 0.0 => return None,
                BinaryOp::Divide => left / right,
                BinaryOp::Modulo => left % right,
                _ => return None,
            };
            Some(float_value(result))
        }
    }
}

fn cast(value: &Value, to: CastType) -> Option<Value> {
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

/// SQL LIKE: greedy matching that backtracks to the last `%`, so at worst
/// O(text × pattern) and without allocating.
fn like(text: &str, pattern: &str, escape: Option<char>, case_insensitive: bool) -> bool {
    let same = |a: char, b: char| a == b || (case_insensitive && a.to_lowercase().eq(b.to_lowercase()));
    let char_at = |text: &str, at: usize| text[at..].chars().next();
    let (mut text_at, mut pattern_at) = (0, 0);
    // Where to resume after a mismatch: the pattern just after the last `%`, and how much of the
    // text that `%` has swallowed so far.
    let mut resume: Option<(usize, usize)> = None;
    loop {
        if let Some(wanted) = char_at(pattern, pattern_at) {
            if wanted == '%' && Some(wanted) != escape {
                pattern_at += 1;
                resume = Some((pattern_at, text_at));
                continue;
            }
            if let Some(got) = char_at(text, text_at) {
                let (literal, width) = match (Some(wanted) == escape, char_at(pattern, pattern_at + wanted.len_utf8()))
                {
                    (true, Some(escaped)) => (Some(escaped), wanted.len_utf8() + escaped.len_utf8()),
                    _ if wanted == '_' => (None, 1),
                    _ => (Some(wanted), wanted.len_utf8()),
                };
                if literal.is_none_or(|literal| same(literal, got)) {
                    pattern_at += width;
                    text_at += got.len_utf8();
                    continue;
                }
            }
        } else if text_at == text.len() {
            return true;
        }
        match resume {
            Some((resume_pattern_at, swallowed_to)) if swallowed_to < text.len() => {
                let swallowed = char_at(text, swallowed_to).map_or(1, char::len_utf8);
                resume = Some((resume_pattern_at, swallowed_to + swallowed));
                pattern_at = resume_pattern_at;
                text_at = swallowed_to + swallowed;
            }
            _ => return false,
        }
    }
}

fn call<'v>(function: Function, args: &'v [Expr], input: &Input<'v>) -> Cow<'v, Value> {
    // Arity is checked when a definition is parsed; a missing argument here (a hand-written
    // catalog entry) is null like any other missing value.
    let arg = |index: usize| args.get(index).map_or(Cow::Borrowed(&NULL), |arg| arg.value(input));
    let string = |value: String| Cow::Owned(Value::String(value));
    match function {
        Function::Coalesce => {
            for arg in args {
                let value = arg.value(input);
                if !value.is_null() {
                    return value;
                }
            }
            Cow::Borrowed(&NULL)
        }
        Function::Nullif => {
            let (first, second) = (arg(0), arg(1));
            if equals(&first, &second) == Some(true) { Cow::Borrowed(&NULL) } else { first }
        }
        Function::Greatest | Function::Least => {
            let wanted = if function == Function::Greatest { Ordering::Greater } else { Ordering::Less };
            let mut best: Option<Cow<'v, Value>> = None;
            for arg in args {
                let value = arg.value(input);
                if value.is_null() {
                    continue;
                }
                best = match best {
                    None => Some(value),
                    Some(current) => match compare(&value, &current) {
                        Some(order) if order == wanted => Some(value),
                        Some(_) => Some(current),
                        None => return Cow::Borrowed(&NULL),
                    },
                };
            }
            best.unwrap_or(Cow::Borrowed(&NULL))
        }
        Function::Concat => {
            let mut joined = String::new();
            for arg in args {
                if let Some(text) = text_of(&arg.value(input)) {
                    joined.push_str(&text);
                }
            }
            string(joined)
        }
        Function::Upper | Function::Lower | Function::Length => {
            let value = arg(0);
            let Value::String(text) = &*value else { return Cow::Borrowed(&NULL) };
            match function {
                Function::Upper => string(text.to_uppercase()),
                Function::Lower => string(text.to_lowercase()),
                _ => Cow::Owned(Value::from(text.chars().count())),
            }
        }
        Function::Trim | Function::Ltrim | Function::Rtrim => {
            let value = arg(0);
            let Value::String(text) = &*value else { return Cow::Borrowed(&NULL) };
            let characters_value = (args.len() > 1).then(|| arg(1));
            let characters = match characters_value.as_deref() {
                None => None,
                Some(Value::String(characters)) => Some(characters.as_str()),
                Some(_) => return Cow::Borrowed(&NULL),
            };
            let trimmed = match (characters, function) {
                (None, Function::Trim) => text.trim(),
                (None, Function::Ltrim) => text.trim_start(),
                (None, _) => text.trim_end(),
                (Some(characters), Function::Trim) => text.trim_matches(|c| characters.contains(c)),
                (Some(characters), Function::Ltrim) => text.trim_start_matches(|c| characters.contains(c)),
                (Some(characters), _) => text.trim_end_matches(|c| characters.contains(c)),
            };
            string(trimmed.to_string())
        }
        Function::Substring => {
            let value = arg(0);
            let Value::String(text) = &*value else { return Cow::Borrowed(&NULL) };
            let Some(start) = integer(&arg(1)) else { return Cow::Borrowed(&NULL) };
            // SQL positions are 1-based and may start before the text: SUBSTRING('abc', 0, 2)
            // is 'a'. The end is exclusive.
            let end = if args.len() > 2 {
                match integer(&arg(2)) {
                    Some(length) if length >= 0 => Some(start.saturating_add(length)),
                    _ => return Cow::Borrowed(&NULL),
                }
            } else {
                None
            };
            let first = start.max(1);
            let taken: String = text
                .chars()
                .zip(1i64..)
                .skip_while(|(_, position)| *position < first)
                .take_while(|(_, position)| end.is_none_or(|end| *position < end))
                .map(|(c, _)| c)
                .collect();
            string(taken)
        }
        Function::Replace => {
            let (value, from, to) = (arg(0), arg(1), arg(2));
            let (Value::String(text), Value::String(from), Value::String(to)) = (&*value, &*from, &*to) else {
                return Cow::Borrowed(&NULL);
            };
            if from.is_empty() { string(text.clone()) } else { string(text.replace(from.as_str(), to)) }
        }
        Function::Abs | Function::Floor | Function::Ceil => {
            let Some(value) = number(&arg(0)) else { return Cow::Borrowed(&NULL) };
            Cow::Owned(match (value, function) {
                (Num::Int(int), Function::Abs) => int.checked_abs().map_or(Value::Null, Value::from),
                (Num::Int(int), _) => Value::from(int),
                (Num::Float(float), Function::Abs) => float_value(float.abs()),
                (Num::Float(float), Function::Floor) => float_value(float.floor()),
                (Num::Float(float), _) => float_value(float.ceil()),
            })
        }
        Function::Round => {
            let Some(value) = number(&arg(0)) else { return Cow::Borrowed(&NULL) };
            let digits = if args.len() > 1 {
                match integer(&arg(1)) {
                    Some(digits) => digits,
                    None => return Cow::Borrowed(&NULL),
                }
            } else {
                0
            };
            owned(round(value, digits))
        }
    }
}

/// ROUND: half away from zero, to `digits` after the point (before it when negative). An
/// integer stays an integer.
fn round(value: Num, digits: i64) -> Option<Value> {
    match value {
        Num::Int(int) if digits >= 0 => Some(Value::from(int)),
        Num::Int(int) => {
            // 10^19 overflows i64: every i64 rounds to 0 at that scale.
            let Some(scale) = u32::try_from(-digits).ok().and_then(|exponent| 10i64.checked_pow(exponent)) else {
                return Some(Value::from(0));
            };
            let half = scale / 2;
            let remainder = int % scale;
            let down = int - remainder;
            let rounded = if remainder.abs() >= half {
                if int >= 0 { down.checked_add(scale) } else { down.checked_sub(scale) }
            } else {
                Some(down)
            };
            rounded.map(Value::from)
        }
        Num::Float(float) => {
            let digits = digits.clamp(-400, 400) as i32;
            if digits == 0 {
                return Some(float_value(float.round()));
            }
            let scale = 10f64.powi(digits);
            let scaled = float * scale;
            // Past the precision of a double, the value is already as rounded as it gets.
            if !scaled.is_finite() || scale == 0.0 {
                return Some(float_value(if scale == 0.0 { 0.0 } else { float }));
            }
            Some(float_value(scaled.round() / scale))
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn record(value: &Value) -> Input<'_> {
        Input {
            key: Some(b"k1"),
            subject: Some("shop/orders"),
            timestamp_ms: 1_700_000_000_000,
            partition: 2,
            offset: 7,
            value,
        }
    }

    fn literal(value: Value) -> Expr {
        Expr::Literal { value }
    }

    /// A value path from dotted text; numeric parts are array indexes.
    fn path(text: &str) -> Expr {
        let path = text
            .split('.')
            .filter(|part| !part.is_empty())
            .map(|part| part.parse().map_or_else(|_| Step::Field(part.to_string()), Step::Index))
            .collect();
        Expr::Path { path }
    }

    fn binary(operator: BinaryOp, left: Expr, right: Expr) -> Expr {
        Expr::Binary { operator, left: Box::new(left), right: Box::new(right) }
    }

    fn call(function: Function, args: Vec<Expr>) -> Expr {
        Expr::Call { function, args }
    }

    fn eval(expr: &Expr) -> Value {
        expr.eval(&record(&json!({"a": 1})))
    }

    fn eval_on(expr: &Expr, value: &Value) -> Value {
        expr.eval(&record(value))
    }

    /// `left operator right` over literals.
    fn op(operator: BinaryOp, left: Value, right: Value) -> Value {
        eval(&binary(operator, literal(left), literal(right)))
    }

    fn function(function: Function, args: Vec<Value>) -> Value {
        eval(&call(function, args.into_iter().map(literal).collect()))
    }

    #[test]
    fn record_fields_are_read_from_the_record() {
        let value = json!({"key": "in the value"});
        let field = |field| eval_on(&Expr::Record { field }, &value);
        assert_eq!(field(RecordField::Key), json!("k1"));
        assert_eq!(field(RecordField::Subject), json!("shop/orders"));
        assert_eq!(field(RecordField::Ts), json!(1_700_000_000_000i64));
        assert_eq!(field(RecordField::Partition), json!(2));
        assert_eq!(field(RecordField::Offset), json!(7));
        let bare = Input { key: None, subject: None, ..record(&value) };
        assert_eq!(Expr::Record { field: RecordField::Key }.eval(&bare), Value::Null);
        assert_eq!(Expr::Record { field: RecordField::Subject }.eval(&bare), Value::Null);
        let binary_key = Input { key: Some(&[b'a', 0xff]), ..bare };
        assert_eq!(Expr::Record { field: RecordField::Key }.eval(&binary_key), json!("a\u{fffd}"));
        assert_eq!(RecordField::from_name("OFFSET"), Some(RecordField::Offset));
        assert_eq!(RecordField::from_name("Ts"), Some(RecordField::Ts));
        assert_eq!(RecordField::from_name("value"), None);
    }

    #[test]
    fn paths_walk_objects_and_arrays() {
        let value = json!({"a": {"b": {"c": 3}}, "items": [10, 20, 30], "s": "text", "n": null});
        assert_eq!(eval_on(&path(""), &value), value);
        assert_eq!(eval_on(&path("a.b.c"), &value), json!(3));
        assert_eq!(eval_on(&path("a.b"), &value), json!({"c": 3}));
        assert_eq!(eval_on(&path("items.0"), &value), json!(10));
        assert_eq!(eval_on(&path("items.-1"), &value), json!(30));
        assert_eq!(eval_on(&path("items.-3"), &value), json!(10));
        for missing in ["items.3", "items.-4", "a.x", "a.b.c.d", "s.x", "n.x", "missing", "a.0"] {
            assert_eq!(eval_on(&path(missing), &value), Value::Null, "{missing}");
        }
        assert_eq!(eval_on(&path("a"), &json!("not an object")), Value::Null);
        assert_eq!(eval_on(&path("items.9223372036854775807"), &value), Value::Null);
        assert_eq!(eval_on(&path("items.-9223372036854775808"), &value), Value::Null);
    }

    #[test]
    fn get_walks_computed_values_and_gives_text_with_arrow_arrow() {
        let value = json!({"doc": {"n": 42, "f": 1.5, "s": "x", "o": {"k": [1, 2]}, "t": true, "z": null}});
        let get = |base: Expr, path: Vec<Step>, text| Expr::Get { base: Box::new(base), path, text };
        let field = |name: &str| vec![Step::Field(name.to_string())];
        assert_eq!(eval_on(&get(path("doc"), field("n"), false), &value), json!(42));
        let text = |name: &str| eval_on(&get(path("doc"), field(name), true), &value);
        assert_eq!(text("n"), json!("42"));
        assert_eq!(text("f"), json!("1.5"));
        assert_eq!(text("s"), json!("x"));
        assert_eq!(text("o"), json!("{\"k\":[1,2]}"));
        assert_eq!(text("t"), json!("true"));
        assert_eq!(text("z"), Value::Null);
        assert_eq!(text("missing"), Value::Null);
        // On an owned base (a CASE result): the same walk.
        let computed = Expr::Case {
            operand: None,
            branches: vec![When { when: literal(json!(true)), then: literal(json!({"a": [5, 6]})) }],
            otherwise: None,
        };
        let steps = vec![Step::Field("a".into()), Step::Index(1)];
        assert_eq!(eval(&get(computed.clone(), steps.clone(), false)), json!(6));
        assert_eq!(eval(&get(computed, steps, true)), json!("6"));
        assert_eq!(eval(&get(literal(json!("str")), field("a"), false)), Value::Null);
    }

    #[test]
    fn arithmetic_keeps_integers_and_turns_failures_into_null() {
        use BinaryOp::*;
        assert_eq!(op(Add, json!(2), json!(3)), json!(5));
        assert!(op(Add, json!(2), json!(3)).is_i64());
        assert_eq!(op(Add, json!(2), json!(0.5)), json!(2.5));
        assert_eq!(op(Subtract, json!(2), json!(5)), json!(-3));
        assert_eq!(op(Multiply, json!(4), json!(2.5)), json!(10.0));
        assert_eq!(op(Divide, json!(7), json!(2)), json!(3));
        assert_eq!(op(Divide, json!(-7), json!(2)), json!(-3));
        assert_eq!(op(Divide, json!(7.0), json!(2)), json!(3.5));
        assert_eq!(op(Modulo, json!(7), json!(3)), json!(1));
        assert_eq!(op(Modulo, json!(-7), json!(3)), json!(-1));
        assert_eq!(op(Modulo, json!(7.5), json!(2)), json!(1.5));
        for zero in [json!(0), json!(0.0)] {
            assert_eq!(op(Divide, json!(1), zero.clone()), Value::Null);
            assert_eq!(op(Modulo, json!(1), zero.clone()), Value::Null);
            assert_eq!(op(Divide, json!(1.5), zero), Value::Null);
        }
        assert_eq!(op(Add, json!(i64::MAX), json!(1)), Value::Null);
        assert_eq!(op(Subtract, json!(i64::MIN), json!(1)), Value::Null);
        assert_eq!(op(Multiply, json!(i64::MAX), json!(2)), Value::Null);
        assert_eq!(op(Divide, json!(i64::MIN), json!(-1)), Value::Null);
        assert_eq!(op(Modulo, json!(i64::MIN), json!(-1)), Value::Null);
        assert_eq!(op(Multiply, json!(1e308), json!(10)), Value::Null, "infinity is not JSON");
        // u64 beyond i64 is computed as a float.
        assert_eq!(op(Add, json!(u64::MAX), json!(0)), json!(u64::MAX as f64));
        for other in [json!("1"), json!(null), json!(true), json!([1]), json!({})] {
            assert_eq!(op(Add, json!(1), other.clone()), Value::Null, "{other}");
            assert_eq!(op(Add, other.clone(), json!(1)), Value::Null, "{other}");
        }
        let negate = |value| eval(&Expr::Unary { operator: UnaryOp::Negate, expr: Box::new(literal(value)) });
        assert_eq!(negate(json!(5)), json!(-5));
        assert_eq!(negate(json!(-1.5)), json!(1.5));
        assert_eq!(negate(json!(i64::MIN)), Value::Null);
        assert_eq!(negate(json!("5")), Value::Null);
        assert_eq!(negate(json!(null)), Value::Null);
    }

    #[test]
    fn comparisons_need_two_values_of_one_kind() {
        use BinaryOp::*;
        assert_eq!(op(Eq, json!(1), json!(1.0)), json!(true));
        assert_eq!(op(NotEq, json!(1), json!(1.0)), json!(false));
        assert_eq!(op(Lt, json!(1), json!(1.5)), json!(true));
        assert_eq!(op(Gt, json!(-1), json!(-1.5)), json!(true));
        assert_eq!(op(LtEq, json!(2), json!(2)), json!(true));
        assert_eq!(op(GtEq, json!(1.5), json!(2)), json!(false));
        // Exact even where a double cannot hold the integer.
        assert_eq!(op(Gt, json!(9_007_199_254_740_993i64), json!(9_007_199_254_740_992.0)), json!(true));
        assert_eq!(op(Lt, json!(i64::MAX), json!(1e19)), json!(true));
        assert_eq!(op(Gt, json!(i64::MIN), json!(-1e19)), json!(true));
        assert_eq!(op(Lt, json!(u64::MAX), json!(1e30)), json!(true));
        assert_eq!(op(Lt, json!("apple"), json!("banana")), json!(true));
        assert_eq!(op(Lt, json!("Z"), json!("a")), json!(true), "by code point");
        assert_eq!(op(Eq, json!("a"), json!("a")), json!(true));
        assert_eq!(op(Lt, json!(false), json!(true)), json!(true));
        assert_eq!(op(Eq, json!([1, {"a": 2}]), json!([1, {"a": 2}])), json!(true));
        assert_eq!(op(NotEq, json!({"a": 1}), json!({"a": 2})), json!(true));
        assert_eq!(op(Lt, json!([1]), json!([2])), Value::Null, "arrays have no order");
        for (left, right) in [
            (json!(1), json!("1")),
            (json!(null), json!(null)),
            (json!(1), json!(null)),
            (json!(true), json!(1)),
            (json!([1]), json!({})),
        ] {
            for operator in [Eq, NotEq, Lt, LtEq, Gt, GtEq] {
                assert_eq!(op(operator, left.clone(), right.clone()), Value::Null, "{left} {operator:?} {right}");
            }
        }
    }

    #[test]
    fn logic_is_three_valued() {
        use BinaryOp::{And, Or};
        let (t, f, n) = (json!(true), json!(false), json!(null));
        let cases = [
            (t.clone(), t.clone(), t.clone(), t.clone()),
            (t.clone(), f.clone(), f.clone(), t.clone()),
            (t.clone(), n.clone(), n.clone(), t.clone()),
            (f.clone(), f.clone(), f.clone(), f.clone()),
            (f.clone(), n.clone(), f.clone(), n.clone()),
            (n.clone(), n.clone(), n.clone(), n.clone()),
        ];
        for (left, right, and, or) in cases {
            assert_eq!(op(And, left.clone(), right.clone()), and, "{left} AND {right}");
            assert_eq!(op(And, right.clone(), left.clone()), and, "{right} AND {left}");
            assert_eq!(op(Or, left.clone(), right.clone()), or, "{left} OR {right}");
            assert_eq!(op(Or, right.clone(), left.clone()), or, "{right} OR {left}");
        }
        // Anything but a boolean is unknown.
        assert_eq!(op(And, json!(1), t.clone()), n);
        assert_eq!(op(Or, json!("true"), f.clone()), n);
        let not = |value| eval(&Expr::Unary { operator: UnaryOp::Not, expr: Box::new(literal(value)) });
        assert_eq!(not(t.clone()), f);
        assert_eq!(not(f.clone()), t);
        assert_eq!(not(n.clone()), n);
        assert_eq!(not(json!(0)), n);
    }

    #[test]
    fn is_tests_are_never_null() {
        let is = |value: Value, test, negated| eval(&Expr::Is { expr: Box::new(literal(value)), test, negated });
        assert_eq!(is(json!(null), IsTest::Null, false), json!(true));
        assert_eq!(is(json!(0), IsTest::Null, false), json!(false));
        assert_eq!(is(json!(0), IsTest::Null, true), json!(true));
        assert_eq!(
            eval_on(&Expr::Is { expr: Box::new(path("missing")), test: IsTest::Null, negated: false }, &json!({})),
            json!(true)
        );
        assert_eq!(is(json!(true), IsTest::True, false), json!(true));
        assert_eq!(is(json!(null), IsTest::True, true), json!(true));
        assert_eq!(is(json!(1), IsTest::True, false), json!(false));
        assert_eq!(is(json!(false), IsTest::False, false), json!(true));
        assert_eq!(is(json!(null), IsTest::False, false), json!(false));
    }

    #[test]
    fn in_lists_follow_sql() {
        let in_list = |value: Value, list: Vec<Value>, negated| {
            eval(&Expr::In { expr: Box::new(literal(value)), list: list.into_iter().map(literal).collect(), negated })
        };
        assert_eq!(in_list(json!(2), vec![json!(1), json!(2.0)], false), json!(true));
        assert_eq!(in_list(json!(3), vec![json!(1), json!(2)], false), json!(false));
        assert_eq!(in_list(json!(3), vec![json!(1), json!(2)], true), json!(true));
        assert_eq!(in_list(json!("a"), vec![json!("a"), json!(1)], false), json!(true));
        // No match, but one comparison unknown: unknown.
        assert_eq!(in_list(json!("c"), vec![json!("a"), json!(null)], false), Value::Null);
        assert_eq!(in_list(json!("c"), vec![json!("a"), json!(null)], true), Value::Null);
        assert_eq!(in_list(json!("c"), vec![json!("a"), json!(1)], true), Value::Null);
        assert_eq!(in_list(json!(null), vec![json!(1)], false), Value::Null);
        assert_eq!(in_list(json!(1), vec![], false), json!(false));
    }

    fn like_with(text: &str, pattern: &str, escape: Option<char>, case_insensitive: bool) -> Value {
        eval(&Expr::Like {
            expr: Box::new(literal(json!(text))),
            pattern: Box::new(literal(json!(pattern))),
            negated: false,
            case_insensitive,
            escape,
        })
    }

    #[test]
    fn like_matches_percent_and_underscore() {
        let like = |text: &str, pattern: &str| like_with(text, pattern, Some('\\'), false) == json!(true);
        assert!(like("hello", "hello"));
        assert!(!like("hello", "Hello"));
        assert!(like("hello", "h%"));
        assert!(like("hello", "%o"));
        assert!(like("hello", "%ll%"));
        assert!(like("hello", "h_llo"));
        assert!(!like("hello", "h_lo"));
        assert!(like("hello", "%"));
        assert!(like("", "%"));
        assert!(like("", "%%"));
        assert!(!like("", "_"));
        assert!(like("", ""));
        assert!(!like("a", ""));
        assert!(like("abcbc", "a%bc"));
        assert!(like("aXbXc", "a%b%c"));
        assert!(!like("aXbXd", "a%b%c"));
        assert!(like("mississippi", "%iss%ppi"));
        assert!(like("héllo wörld", "h_llo w%d"));
        assert!(like("100%", "100\\%"));
        assert!(!like("1000", "100\\%"));
        assert!(like("a_b", "a\\_b"));
        assert!(!like("axb", "a\\_b"));
        assert!(like("a\\", "a\\"), "a trailing escape is literal");
        assert_eq!(like_with("100%", "100!%", Some('!'), false), json!(true));
        assert_eq!(like_with("a\\b", "a\\b", None, false), json!(true), "no escape character");
        assert_eq!(like_with("HeLLo", "hel%", Some('\\'), true), json!(true));
        assert_eq!(like_with("ÉCOLE", "éc%", Some('\\'), true), json!(true));
        let negated = Expr::Like {
            expr: Box::new(literal(json!("abc"))),
            pattern: Box::new(literal(json!("a%"))),
            negated: true,
            case_insensitive: false,
            escape: None,
        };
        assert_eq!(eval(&negated), json!(false));
        let on_number = Expr::Like {
            expr: Box::new(literal(json!(12))),
            pattern: Box::new(literal(json!("1%"))),
            negated: false,
            case_insensitive: false,
            escape: None,
        };
        assert_eq!(eval(&on_number), Value::Null);
    }

    #[test]
    fn between_includes_both_ends() {
        let between = |value: Value, low: Value, high: Value, negated| {
            eval(&Expr::Between {
                expr: Box::new(literal(value)),
                low: Box::new(literal(low)),
                high: Box::new(literal(high)),
                negated,
            })
        };
        assert_eq!(between(json!(1), json!(1), json!(3), false), json!(true));
        assert_eq!(between(json!(3.0), json!(1), json!(3), false), json!(true));
        assert_eq!(between(json!(4), json!(1), json!(3), false), json!(false));
        assert_eq!(between(json!(4), json!(1), json!(3), true), json!(true));
        assert_eq!(between(json!("b"), json!("a"), json!("c"), false), json!(true));
        assert_eq!(between(json!(2), json!(1), json!(null), false), Value::Null);
        assert_eq!(between(json!(0), json!(1), json!(null), false), json!(false), "false beats unknown");
        assert_eq!(between(json!(null), json!(1), json!(3), true), Value::Null);
    }

    #[test]
    fn case_takes_the_first_matching_branch() {
        let branches = vec![
            When { when: binary(BinaryOp::Gt, path("n"), literal(json!(10))), then: literal(json!("big")) },
            When { when: binary(BinaryOp::Gt, path("n"), literal(json!(0))), then: literal(json!("small")) },
        ];
        let searched =
            Expr::Case { operand: None, branches: branches.clone(), otherwise: Some(Box::new(literal(json!("none")))) };
        assert_eq!(eval_on(&searched, &json!({"n": 11})), json!("big"));
        assert_eq!(eval_on(&searched, &json!({"n": 5})), json!("small"));
        assert_eq!(eval_on(&searched, &json!({"n": -5})), json!("none"));
        assert_eq!(eval_on(&searched, &json!({})), json!("none"), "an unknown WHEN is not taken");
        let no_else = Expr::Case { operand: None, branches, otherwise: None };
        assert_eq!(eval_on(&no_else, &json!({"n": -5})), Value::Null);
        let simple = Expr::Case {
            operand: Some(Box::new(path("status"))),
            branches: vec![
                When { when: literal(json!("paid")), then: literal(json!(1)) },
                When { when: literal(json!(null)), then: literal(json!(2)) },
            ],
            otherwise: Some(Box::new(literal(json!(0)))),
        };
        assert_eq!(eval_on(&simple, &json!({"status": "paid"})), json!(1));
        assert_eq!(eval_on(&simple, &json!({"status": "open"})), json!(0));
        assert_eq!(eval_on(&simple, &json!({})), json!(0), "null equals nothing, not even null");
    }

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
    fn concatenation() {
        assert_eq!(op(BinaryOp::Concat, json!("a"), json!("b")), json!("ab"));
        assert_eq!(op(BinaryOp::Concat, json!("n="), json!(5)), json!("n=5"));
        assert_eq!(op(BinaryOp::Concat, json!("a"), json!(null)), Value::Null);
        assert_eq!(function(Function::Concat, vec![json!("a"), json!(null), json!(1), json!(true)]), json!("a1true"));
        assert_eq!(function(Function::Concat, vec![json!(null)]), json!(""));
    }

    #[test]
    fn string_functions() {
        use Function::*;
        assert_eq!(function(Upper, vec![json!("straße")]), json!("STRASSE"));
        assert_eq!(function(Lower, vec![json!("ÀB")]), json!("àb"));
        assert_eq!(function(Length, vec![json!("héllo")]), json!(5));
        assert_eq!(function(Length, vec![json!([1, 2])]), Value::Null);
        assert_eq!(function(Upper, vec![json!(1)]), Value::Null);
        assert_eq!(function(Trim, vec![json!("  a b \n")]), json!("a b"));
        assert_eq!(function(Ltrim, vec![json!("  a ")]), json!("a "));
        assert_eq!(function(Rtrim, vec![json!("  a ")]), json!("  a"));
        assert_eq!(function(Trim, vec![json!("xxaxyx"), json!("xy")]), json!("a"));
        assert_eq!(function(Ltrim, vec![json!("xxax"), json!("x")]), json!("ax"));
        assert_eq!(function(Rtrim, vec![json!("xxax"), json!("x")]), json!("xxa"));
        assert_eq!(function(Trim, vec![json!("xa"), json!(null)]), Value::Null);
        assert_eq!(function(Substring, vec![json!("hello"), json!(2), json!(3)]), json!("ell"));
        assert_eq!(function(Substring, vec![json!("hello"), json!(2)]), json!("ello"));
        assert_eq!(function(Substring, vec![json!("hello"), json!(0), json!(3)]), json!("he"));
        assert_eq!(function(Substring, vec![json!("hello"), json!(-5), json!(3)]), json!(""));
        assert_eq!(function(Substring, vec![json!("hello"), json!(9)]), json!(""));
        assert_eq!(function(Substring, vec![json!("héllo"), json!(2), json!(1)]), json!("é"));
        assert_eq!(function(Substring, vec![json!("hello"), json!(2), json!(-1)]), Value::Null);
        assert_eq!(function(Substring, vec![json!("hello"), json!(1.5)]), Value::Null);
        assert_eq!(function(Substring, vec![json!("hello"), json!(2.0), json!(i64::MAX)]), json!("ello"));
        assert_eq!(function(Replace, vec![json!("a-b-c"), json!("-"), json!("+")]), json!("a+b+c"));
        assert_eq!(function(Replace, vec![json!("abc"), json!(""), json!("+")]), json!("abc"));
        assert_eq!(function(Replace, vec![json!("abc"), json!("b"), json!(null)]), Value::Null);
    }

    #[test]
    fn numeric_functions() {
        use Function::*;
        assert_eq!(function(Abs, vec![json!(-3)]), json!(3));
        assert_eq!(function(Abs, vec![json!(-2.5)]), json!(2.5));
        assert_eq!(function(Abs, vec![json!(i64::MIN)]), Value::Null);
        assert_eq!(function(Abs, vec![json!("-3")]), Value::Null);
        assert_eq!(function(Floor, vec![json!(2.7)]), json!(2.0));
        assert_eq!(function(Floor, vec![json!(-2.2)]), json!(-3.0));
        assert_eq!(function(Floor, vec![json!(5)]), json!(5));
        assert_eq!(function(Ceil, vec![json!(2.2)]), json!(3.0));
        assert_eq!(function(Ceil, vec![json!(-2.7)]), json!(-2.0));
        assert_eq!(function(Round, vec![json!(2.5)]), json!(3.0));
        assert_eq!(function(Round, vec![json!(-2.5)]), json!(-3.0));
        assert_eq!(function(Round, vec![json!(2.345), json!(2)]), json!(2.35));
        assert_eq!(function(Round, vec![json!(1234.5), json!(-2)]), json!(1200.0));
        assert_eq!(function(Round, vec![json!(1.5), json!(1000)]), json!(1.5));
        assert_eq!(function(Round, vec![json!(1.5), json!(-1000)]), json!(0.0));
        assert_eq!(function(Round, vec![json!(7)]), json!(7));
        assert_eq!(function(Round, vec![json!(1250), json!(-2)]), json!(1300));
        assert_eq!(function(Round, vec![json!(-1250), json!(-2)]), json!(-1300));
        assert_eq!(function(Round, vec![json!(1249), json!(-2)]), json!(1200));
        assert_eq!(function(Round, vec![json!(i64::MAX), json!(-1)]), Value::Null, "overflow");
        assert_eq!(function(Round, vec![json!(i64::MAX), json!(-30)]), json!(0));
        assert_eq!(function(Round, vec![json!(1.5), json!("x")]), Value::Null);
        assert_eq!(function(Greatest, vec![json!(1), json!(null), json!(3.5), json!(2)]), json!(3.5));
        assert_eq!(function(Least, vec![json!("b"), json!("a"), json!(null)]), json!("a"));
        assert_eq!(function(Greatest, vec![json!(null), json!(null)]), Value::Null);
        assert_eq!(function(Greatest, vec![json!(1), json!("a")]), Value::Null, "mixed kinds");
        assert_eq!(function(Coalesce, vec![json!(null), json!(0), json!(1)]), json!(0));
        assert_eq!(function(Coalesce, vec![json!(null)]), Value::Null);
        assert_eq!(function(Nullif, vec![json!(1), json!(1.0)]), Value::Null);
        assert_eq!(function(Nullif, vec![json!(1), json!(2)]), json!(1));
        assert_eq!(function(Nullif, vec![json!(1), json!(null)]), json!(1));
    }

    #[test]
    fn missing_arguments_are_null() {
        for function in [
            Function::Upper,
            Function::Trim,
            Function::Substring,
            Function::Replace,
            Function::Nullif,
            Function::Round,
            Function::Greatest,
            Function::Concat,
            Function::Coalesce,
        ] {
            let result = call(function, vec![]);
            assert!(matches!(eval(&result), Value::Null | Value::String(_)), "{function:?}");
        }
        assert_eq!(function(Function::Substring, vec![json!("abc")]), Value::Null);
    }

    #[test]
    fn function_names_and_arity() {
        assert_eq!(Function::from_name("char_length"), Some(Function::Length));
        assert_eq!(Function::from_name("CEILING"), Some(Function::Ceil));
        assert_eq!(Function::from_name("Substr"), Some(Function::Substring));
        assert_eq!(Function::from_name("sum"), None);
        assert_eq!(Function::Substring.arity(), (2, Some(3)));
        assert_eq!(Function::Coalesce.arity(), (1, None));
        for name in FUNCTION_NAMES.split([',', '(', ')', ' ']).filter(|name| !name.is_empty()) {
            let function = Function::from_name(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(Function::from_name(function.name()), Some(function));
        }
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

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            prop_oneof![Just(i64::MIN), Just(i64::MAX), Just(0), Just(-1), Just(1)].prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e20f64..1e20).prop_map(float_value),
            prop_oneof![Just(1e308), Just(-1e308), Just(0.5), Just(-0.0)].prop_map(float_value),
            "[a-c%_\\\\é ]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-c]", inner, 0..4)
                    .prop_map(|fields| Value::Object(fields.into_iter().collect())),
            ]
        })
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof!["[a-c]".prop_map(Step::Field), (-3i64..3).prop_map(Step::Index), any::<i64>().prop_map(Step::Index)]
    }

    fn expr() -> impl Strategy<Value = Expr> {
        let record_field = prop_oneof![
            Just(RecordField::Key),
            Just(RecordField::Subject),
            Just(RecordField::Ts),
            Just(RecordField::Partition),
            Just(RecordField::Offset),
        ];
        let leaf = prop_oneof![
            json_value().prop_map(|value| Expr::Literal { value }),
            record_field.prop_map(|field| Expr::Record { field }),
            prop::collection::vec(step(), 0..3).prop_map(|path| Expr::Path { path }),
        ];
        let binary_op = prop_oneof![
            Just(BinaryOp::Add),
            Just(BinaryOp::Subtract),
            Just(BinaryOp::Multiply),
            Just(BinaryOp::Divide),
            Just(BinaryOp::Modulo),
            Just(BinaryOp::Eq),
            Just(BinaryOp::NotEq),
            Just(BinaryOp::Lt),
            Just(BinaryOp::LtEq),
            Just(BinaryOp::Gt),
            Just(BinaryOp::GtEq),
            Just(BinaryOp::And),
            Just(BinaryOp::Or),
            Just(BinaryOp::Concat),
        ];
        let function = prop_oneof![
            Just(Function::Upper),
            Just(Function::Lower),
            Just(Function::Length),
            Just(Function::Trim),
            Just(Function::Ltrim),
            Just(Function::Rtrim),
            Just(Function::Substring),
            Just(Function::Replace),
            Just(Function::Concat),
            Just(Function::Coalesce),
            Just(Function::Nullif),
            Just(Function::Abs),
            Just(Function::Round),
            Just(Function::Floor),
            Just(Function::Ceil),
            Just(Function::Greatest),
            Just(Function::Least),
        ];
        let cast_type =
            prop_oneof![Just(CastType::Text), Just(CastType::Bigint), Just(CastType::Double), Just(CastType::Boolean)];
        let is_test = prop_oneof![Just(IsTest::Null), Just(IsTest::True), Just(IsTest::False)];
        let unary_op = prop_oneof![Just(UnaryOp::Negate), Just(UnaryOp::Not)];
        leaf.prop_recursive(4, 48, 4, move |inner| {
            let boxed = inner.clone().prop_map(Box::new);
            prop_oneof![
                (boxed.clone(), prop::collection::vec(step(), 0..3), any::<bool>())
                    .prop_map(|(base, path, text)| Expr::Get { base, path, text }),
                (unary_op.clone(), boxed.clone()).prop_map(|(operator, expr)| Expr::Unary { operator, expr }),
                (binary_op.clone(), boxed.clone(), boxed.clone()).prop_map(|(operator, left, right)| Expr::Binary {
                    operator,
                    left,
                    right
                }),
                (boxed.clone(), is_test.clone(), any::<bool>()).prop_map(|(expr, test, negated)| Expr::Is {
                    expr,
                    test,
                    negated
                }),
                (boxed.clone(), prop::collection::vec(inner.clone(), 0..3), any::<bool>())
                    .prop_map(|(expr, list, negated)| Expr::In { expr, list, negated }),
                (
                    boxed.clone(),
                    boxed.clone(),
                    any::<bool>(),
                    any::<bool>(),
                    prop::option::of(prop_oneof![Just('\\'), Just('%'), Just('_'), Just('é')])
                )
                    .prop_map(|(expr, pattern, negated, case_insensitive, escape)| Expr::Like {
                        expr,
                        pattern,
                        negated,
                        case_insensitive,
                        escape
                    }),
                (boxed.clone(), boxed.clone(), boxed.clone(), any::<bool>())
                    .prop_map(|(expr, low, high, negated)| Expr::Between { expr, low, high, negated }),
                (
                    prop::option::of(boxed.clone()),
                    prop::collection::vec((inner.clone(), inner.clone()), 0..3),
                    prop::option::of(boxed.clone())
                )
                    .prop_map(|(operand, branches, otherwise)| Expr::Case {
                        operand,
                        branches: branches.into_iter().map(|(when, then)| When { when, then }).collect(),
                        otherwise,
                    }),
                (boxed.clone(), cast_type.clone()).prop_map(|(expr, to)| Expr::Cast { expr, to }),
                (function.clone(), prop::collection::vec(inner, 0..4))
                    .prop_map(|(function, args)| Expr::Call { function, args }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Any expression over any value evaluates without panicking, to something JSON can
        /// hold, and survives the catalog's serde form.
        #[test]
        fn eval_never_panics(expr in expr(), value in json_value(), key in prop::option::of("[a-c]{0,3}")) {
            let input = Input { key: key.as_deref().map(str::as_bytes), ..record(&value) };
            let result = expr.eval(&input);
            let text = serde_json::to_string(&result).unwrap();
            prop_assert!(serde_json::from_str::<Value>(&text).is_ok());
            let _ = key_text(&result);
            let _ = as_time_ms(&result);
            let stored = serde_json::to_value(&expr).unwrap();
            prop_assert_eq!(serde_json::from_value::<Expr>(stored).unwrap(), expr);
        }

        /// LIKE agrees with a naive recursive matcher.
        #[test]
        fn like_agrees_with_a_naive_matcher(text in "[ab%_\\\\]{0,8}", pattern in "[ab%_\\\\]{0,6}") {
            fn naive(text: &[char], pattern: &[char]) -> bool {
                match pattern.split_first() {
                    None => text.is_empty(),
                    Some(('%', rest)) => (0..=text.len()).any(|skip| naive(&text[skip..], rest)),
                    Some(('\\', [escaped, rest @ ..])) => text.first() == Some(escaped) && naive(&text[1..], rest),
                    Some(('_', rest)) => !text.is_empty() && naive(&text[1..], rest),
                    Some((c, rest)) => text.first() == Some(c) && naive(&text[1..], rest),
                }
            }
            let expected = naive(&text.chars().collect::<Vec<_>>(), &pattern.chars().collect::<Vec<_>>());
            prop_assert_eq!(like(&text, &pattern, Some('\\'), false), expected);
        }
    }
}
