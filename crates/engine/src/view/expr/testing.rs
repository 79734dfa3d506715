//! What the expression modules' unit tests share: building expressions, evaluating them against a
//! sample record, and proptest strategies for arbitrary JSON values and expressions.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::value::float_value;
use super::{BinaryOp, CastType, Expr, Function, Input, IsTest, RecordField, Step, UnaryOp, When};

pub(super) fn record(value: &Value) -> Input<'_> {
    Input {
        key: Some(b"k1"),
        subject: Some("shop/orders"),
        timestamp_ms: 1_700_000_000_000,
        partition: 2,
        offset: 7,
        value,
        element: None,
        scope: &[],
    }
}

pub(super) fn literal(value: Value) -> Expr {
    Expr::Literal { value }
}

/// A value path from dotted text; numeric parts are array indexes.
pub(super) fn path(text: &str) -> Expr {
    let path = text
        .split('.')
        .filter(|part| !part.is_empty())
        .map(|part| part.parse().map_or_else(|_| Step::Field(part.to_string()), Step::Index))
        .collect();
    Expr::Path { path }
}

pub(super) fn binary(operator: BinaryOp, left: Expr, right: Expr) -> Expr {
    Expr::Binary { operator, left: Box::new(left), right: Box::new(right) }
}

pub(super) fn call(function: Function, args: Vec<Expr>) -> Expr {
    Expr::Call { function, args }
}

pub(super) fn eval(expr: &Expr) -> Value {
    expr.eval(&record(&json!({"a": 1})))
}

pub(super) fn eval_on(expr: &Expr, value: &Value) -> Value {
    expr.eval(&record(value))
}

/// `left operator right` over literals.
pub(super) fn op(operator: BinaryOp, left: Value, right: Value) -> Value {
    eval(&binary(operator, literal(left), literal(right)))
}

pub(super) fn function(function: Function, args: Vec<Value>) -> Value {
    eval(&call(function, args.into_iter().map(literal).collect()))
}

pub(super) fn json_value() -> impl Strategy<Value = Value> {
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

pub(super) fn expr() -> impl Strategy<Value = Expr> {
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
        Just(Function::RegexpLike),
        Just(Function::JsonBuildObject),
        Just(Function::ArrayPosition),
        Just(Function::ArrayToString),
        Just(Function::JsonBuildArray),
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
