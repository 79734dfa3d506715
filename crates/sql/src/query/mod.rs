//! Ad-hoc queries: `SELECT` (and `EXPLAIN SELECT`) over tables, views and bounded ranges of
//! streams, answered from what the engine holds now.
//!
//! A query is planned and run here, over sqlparser's AST and the engine's expression language
//! (the one views and transforms evaluate), without a query engine beside it:
//!
//! - `resolve`: names to places. Every row a query works on is one JSON object holding each
//!   input's row under the input's alias (`{"o": {…}, "c": {…}}`); a column reference becomes a
//!   path into it, an aggregate a reference to its computed value, and an uncorrelated
//!   subquery (`IN (SELECT …)`, a scalar `(SELECT …)`, `EXISTS`) its answer, computed first.
//! - `source`: the inputs and how each is read: a table by primary key, by index or by a scan
//!   in chunks; a view by key or by pages; a stream's partitions from the offsets or time the
//!   WHERE clause starts them at. Locks are held for one chunk at a time, never for a query.
//! - `select`: one SELECT: its joins (by primary key or index of the input joined, by hash, or
//!   a nested loop), WHERE, GROUP BY and aggregates, HAVING, the SELECT list, DISTINCT; and the
//!   query around it: WITH, UNION / INTERSECT / EXCEPT, ORDER BY, LIMIT and OFFSET.
//! - `aggregate`: the aggregate functions.
//! - `order`: the total order ORDER BY sorts by, and the keys GROUP BY and DISTINCT compare.
//! - `budget`: the limits every query runs under (memory, time, stream records), counted.

mod aggregate;
mod budget;
mod catalog;
mod correlated;
mod order;
mod resolve;
mod select;
mod source;
pub mod stream;
mod transaction;
pub mod write;

use std::sync::Arc;

use onehop_engine::{Engine, Principal};
use serde_json::Value;
use sqlparser::ast;

pub use budget::{Cancel, QueryLimits};
pub use transaction::Transaction;

use source::Overlay;

use crate::SqlError;
use crate::execute::Output;

/// Queries answered.
pub const QUERIES: &str = "sql_queries_total";
/// Queries ended by a limit, by `limit` (`memory`, `time`, `stream_records`).
pub const QUERIES_LIMITED: &str = "sql_queries_limited_total";

/// What a query answered: column names and rows of values.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<Value>>,
}

/// Runs `query` for `principal` (every right when `None`) under `limits`, until `cancel` (if
/// any) says otherwise.
pub fn run(
    engine: &Engine,
    principal: Option<&Principal>,
    query: &ast::Query,
    limits: &QueryLimits,
    cancel: Option<&Cancel>,
) -> Result<Answer, SqlError> {
    run_through(engine, principal, query, limits, cancel, None)
}

/// [`run`], reading the table `overlay` is of through a transaction's uncommitted writes.
pub(crate) fn run_through(
    engine: &Engine,
    principal: Option<&Principal>,
    query: &ast::Query,
    limits: &QueryLimits,
    cancel: Option<&Cancel>,
    overlay: Option<Arc<Overlay>>,
) -> Result<Answer, SqlError> {
    let mut context = select::Context::new(engine, principal, limits);
    context.cancel_with(cancel.cloned());
    context.read_through(overlay);
    let answer = context.query(query);
    metrics::counter!(QUERIES).increment(1);
    if let Err(SqlError::QueryLimit { limit, .. }) = &answer {
        metrics::counter!(QUERIES_LIMITED, "limit" => *limit).increment(1);
    }
    answer
}

/// The plan of `query`: one line per step, inputs indented under what reads them, each input
/// with its access path (primary key, index, scan). Subqueries are planned, not run.
pub fn explain(engine: &Engine, principal: Option<&Principal>, query: &ast::Query) -> Result<Vec<String>, SqlError> {
    let limits = QueryLimits::default();
    let mut context = select::Context::new(engine, principal, &limits);
    context.explain = Some(Vec::new());
    context.query(query)?;
    Ok(context.explain.take().unwrap_or_default())
}

/// The columns `query` answers with, from its plan (not run): the names a client is told
/// before it binds the query's parameters. A `*` over inputs with undeclared fields lists the
/// declared ones only.
pub fn columns(engine: &Engine, principal: Option<&Principal>, query: &ast::Query) -> Result<Vec<String>, SqlError> {
    let limits = QueryLimits::default();
    let mut context = select::Context::new(engine, principal, &limits);
    context.explain = Some(Vec::new());
    Ok(context.query(query)?.columns)
}

/// [`run`] on a blocking thread, so that a long query holds no async worker; in a
/// transaction, through its uncommitted writes (`overlay`). A lookup of one table's rows by
/// primary key reads a few rows whatever the table holds: it runs where it is, as a REST
/// `GET` does, sparing the two thread wake-ups a hand-off costs (most of such a query's time).
pub(crate) async fn run_shared(
    engine: &Arc<Engine>,
    principal: Option<&Principal>,
    query: &ast::Query,
    statement: String,
    cancel: Option<&Cancel>,
    overlay: Option<Arc<Overlay>>,
) -> Result<Output, SqlError> {
    if is_key_lookup(engine, query) {
        let limits = QueryLimits::of(engine.options());
        let answer = run_through(engine, principal, query, &limits, cancel, overlay)?;
        return Ok(Output::Rows { statement, columns: answer.columns, rows: answer.rows, verb: None });
    }
    let (engine, principal, query, cancel) = (engine.clone(), principal.cloned(), query.clone(), cancel.cloned());
    let limits = QueryLimits::of(engine.options());
    let answer = tokio::task::spawn_blocking(move || {
        run_through(&engine, principal.as_ref(), &query, &limits, cancel.as_ref(), overlay)
    })
    .await
    .map_err(|error| SqlError::InvalidQuery(format!("the query stopped: {error}")))??;
    Ok(Output::Rows { statement, columns: answer.columns, rows: answer.rows, verb: None })
}

/// Whether `query` reads one table by its primary key and nothing else: a single SELECT of
/// one table, no subquery anywhere, whose WHERE requires `key = literal` (or `key IN` a few
/// literals). Its cost is a few row reads and copies, whatever the table holds.
fn is_key_lookup(engine: &Engine, query: &ast::Query) -> bool {
    if query.with.is_some() {
        return false;
    }
    let ast::SetExpr::Select(select) = &*query.body else { return false };
    let [from] = select.from.as_slice() else { return false };
    if !from.joins.is_empty() {
        return false;
    }
    let ast::TableFactor::Table { name, args: None, alias, .. } = &from.relation else { return false };
    let Ok(name) = crate::parse::simple_name(name) else { return false };
    let Ok(table) = engine.table(&name) else { return false };
    let key = table.def().primary_key.clone();
    let alias = alias.as_ref().map_or(name.clone(), |alias| alias.name.value.clone());
    let mut subquery = false;
    let _ = ast::visit_expressions(query, |expr: &ast::Expr| {
        if matches!(expr, ast::Expr::Subquery(_) | ast::Expr::Exists { .. } | ast::Expr::InSubquery { .. }) {
            subquery = true;
        }
        std::ops::ControlFlow::<()>::Continue(())
    });
    if subquery {
        return false;
    }
    let is_key = |expr: &ast::Expr| match expr {
        ast::Expr::Identifier(ident) => ident.value == key,
        ast::Expr::CompoundIdentifier(parts) => {
            matches!(parts.as_slice(), [relation, column] if relation.value == alias && column.value == key)
        }
        _ => false,
    };
    let literal = |expr: &ast::Expr| matches!(expr, ast::Expr::Value(_));
    fn requires(expr: &ast::Expr, test: &dyn Fn(&ast::Expr) -> bool) -> bool {
        match expr {
            ast::Expr::BinaryOp { left, op: ast::BinaryOperator::And, right } => {
                requires(left, test) || requires(right, test)
            }
            ast::Expr::Nested(inner) => requires(inner, test),
            other => test(other),
        }
    }
    let lookup = |expr: &ast::Expr| match expr {
        ast::Expr::BinaryOp { left, op: ast::BinaryOperator::Eq, right } => {
            (is_key(left) && literal(right)) || (literal(left) && is_key(right))
        }
        ast::Expr::InList { expr, list, negated: false } => {
            is_key(expr) && list.len() <= 16 && list.iter().all(literal)
        }
        _ => false,
    };
    select.selection.as_ref().is_some_and(|selection| requires(selection, &lookup))
}
