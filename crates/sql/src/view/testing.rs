//! What the view module's unit tests share: definitions parsed from SQL, the refusal a statement
//! gets, and expressions built or evaluated against a sample record.

use onehop_engine::view::expr::Step;
use onehop_engine::view::{Expr, Input, TransformDef, ViewDef};
use serde_json::Value;

use super::expr::parse_expression;
use crate::parse::{Statement, parse};

pub(super) fn view(sql: &str) -> ViewDef {
    match parse(sql).unwrap_or_else(|error| panic!("{sql}: {error}")).remove(0) {
        Statement::CreateView { def, .. } => def,
        other => panic!("{other:?}"),
    }
}

pub(super) fn transform(sql: &str) -> TransformDef {
    match parse(sql).unwrap_or_else(|error| panic!("{sql}: {error}")).remove(0) {
        Statement::CreateTransform { def, .. } => def,
        other => panic!("{other:?}"),
    }
}

pub(super) fn error(sql: &str) -> String {
    match parse(sql) {
        Ok(statements) => panic!("{sql} parsed: {statements:?}"),
        Err(error) => error.to_string(),
    }
}

pub(super) fn path(parts: &[&str]) -> Expr {
    Expr::Path { path: parts.iter().map(|part| Step::Field(part.to_string())).collect() }
}

pub(super) fn lit(value: Value) -> Expr {
    Expr::Literal { value }
}

/// An expression's value for a record with key `k1`, subject `shop/eu`, ts 1000, partition
/// 3, offset 42 and the given value.
pub(super) fn eval(text: &str, value: &Value) -> Value {
    let expr = parse_expression(text).unwrap_or_else(|error| panic!("{text}: {error}"));
    expr.eval(&Input {
        key: Some(b"k1"),
        subject: Some("shop/eu"),
        timestamp_ms: 1000,
        partition: 3,
        offset: 42,
        value,
        element: None,
        scope: &[],
    })
}
