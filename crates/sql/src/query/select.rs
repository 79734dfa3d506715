//! One query, run: WITH, the set operations, ORDER BY, LIMIT and OFFSET around each SELECT;
//! and each SELECT's inputs, joins, WHERE, GROUP BY, HAVING and SELECT list.
//!
//! The first input is read by the best access path the WHERE clause allows (primary key,
//! index, a stream's offsets or time; a scan otherwise). Each input joined after it is probed
//! per row by its primary key or index when the ON clause equates that column with the rows
//! before it, or else read once and kept: hashed on an equality of the ON clause, or as a list
//! for a nested loop. Every condition of ON is checked on each pair whichever path found it,
//! and each WHERE condition as soon as the inputs it reads are joined.

use std::collections::HashMap;
use std::sync::Arc;

use onehop_engine::view::Expr;
use onehop_engine::view::expr::{BinaryOp, Input, Scoped, Step, is_true};
use onehop_engine::{Engine, ObjectKind, Principal, Privilege};
use serde_json::{Map, Value};
use sqlparser::ast;

use super::Answer;
use super::aggregate::{Accumulator, Aggregate};
use super::budget::{Budget, QueryLimits, estimate};
use super::catalog::Catalog;
use super::correlated::{Correlated, Correlator, HIDDEN, Shape};
use super::order::{Direction, by_terms, push_key, row_key};
use super::resolve::{AGGREGATES, Aggregates, children, column_path, conjuncts, direction, inputs_of, resolve};
use super::source::{Access, Doc, Kind, Overlay, Probe, Range, STREAM_FIELDS, Source};
use crate::SqlError;

fn invalid(message: impl Into<String>) -> SqlError {
    SqlError::InvalidQuery(message.into())
}

fn unsupported(what: impl std::fmt::Display) -> SqlError {
    SqlError::UnsupportedQuery { what: what.to_string(), supported: SUPPORTED.to_string() }
}

/// What a query may contain, for refusals.
const SUPPORTED: &str = "queries are SELECT [DISTINCT] … FROM tables, views, streams and subqueries with [INNER|LEFT|CROSS] \
     JOIN … ON/USING, WHERE, GROUP BY, HAVING, ORDER BY, LIMIT, OFFSET, WITH, UNION/INTERSECT/EXCEPT [ALL], \
     VALUES, and subqueries in FROM, IN (SELECT …), EXISTS and (SELECT …) (docs/sql.md, \"Queries\")";

/// A query being run (or, with `explain`, planned).
pub(crate) struct Context<'a> {
    engine: &'a Engine,
    principal: Option<&'a Principal>,
    budget: Budget,
    /// WITH's answers in scope, innermost last.
    ctes: Vec<(String, Arc<Answer>)>,
    /// The plan's lines, when the query is explained rather than run.
    pub(super) explain: Option<Vec<String>>,
    depth: usize,
    subqueries: usize,
    /// The uncommitted writes of the transaction the query runs in, read through.
    overlay: Option<Arc<Overlay>>,
    /// The catalog Postgres clients read, built when the query first needs it.
    catalog: Option<Arc<Catalog>>,
    limits: QueryLimits,
    /// Correlated subqueries resolved and not yet taken by their SELECT.
    correlated: Vec<Correlated>,
    /// Where the answer's rows go as they are made, when the query is streamed and its
    /// SELECT can hand them on (no GROUP BY, DISTINCT or ORDER BY, its columns known before
    /// its rows); taken by that SELECT.
    pub(super) stream: Option<super::stream::Streamer>,
    /// The outermost SELECT of a streamed query (its address in the statement): the only one
    /// that takes `stream`, never a subquery's.
    pub(super) streamed_select: Option<usize>,
    /// Correlated subqueries numbered so far (their hidden fields' names).
    correlated_count: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JoinKind {
    Inner,
    Left,
    Cross,
}

/// How an input joined to the rows before it finds its matches.
enum Strategy {
    /// Probe its key or index with `key`, evaluated on the rows before it.
    Probe { probe: Probe, field: String, key: Expr },
    /// Read it once, hashed by `right`; look up `left` of the rows before it.
    Hash { right: Expr, left: Expr },
    /// Read it once; try every row.
    Loop,
}

struct JoinPlan {
    kind: JoinKind,
    /// ON's conditions, every one checked on each pair.
    on: Vec<Expr>,
    /// ON's conditions on this input alone: rows read once are filtered by them.
    alone: Vec<Expr>,
    strategy: Strategy,
    /// ON is the one equality a probe by a text primary key looks up: a row it finds by a
    /// text holds it, so ON holds without being checked again.
    exact: bool,
}

/// A joined input read once.
enum Built {
    None,
    Hash(HashMap<String, Arc<Vec<Doc>>>),
    Rows(Arc<Vec<Doc>>),
}

/// A row of the joined inputs: each input's row so far, in FROM's order, shared with where
/// it was read (a table's document, a row read once for a hash join) rather than copied.
pub(super) struct Joined {
    pub(super) parts: Vec<Scoped>,
}

static NO_VALUE: Value = Value::Null;

impl Joined {
    fn one(alias: &Arc<str>, row: Doc) -> Joined {
        Joined { parts: vec![Scoped { alias: alias.clone(), row: Some(row) }] }
    }
}

/// A row the SELECT list, GROUP BY and ORDER BY read: joined, or made whole (a group's first
/// row with its aggregates, an expanded row).
pub(super) trait RowLike {
    fn input(&self) -> Input<'_>;
    /// The row of the input named `alias` (`*`'s value), null if it has none.
    fn part(&self, alias: &str) -> Value;
    /// The row as one object of its inputs' rows, as a group keeps its first.
    fn whole(&self) -> Value;
}

impl RowLike for Joined {
    fn input(&self) -> Input<'_> {
        Input { scope: &self.parts, ..Input::row(&NO_VALUE) }
    }

    fn part(&self, alias: &str) -> Value {
        match self.parts.iter().find(|part| &*part.alias == alias).and_then(|part| part.row.as_ref()) {
            Some(row) => Value::Object((**row).clone()),
            None => Value::Null,
        }
    }

    fn whole(&self) -> Value {
        let parts = self.parts.iter().map(|part| {
            let row = part.row.as_ref().map_or(Value::Null, |row| Value::Object((**row).clone()));
            (part.alias.to_string(), row)
        });
        Value::Object(parts.collect())
    }
}

impl RowLike for Value {
    fn input(&self) -> Input<'_> {
        Input::row(self)
    }

    fn part(&self, alias: &str) -> Value {
        self.get(alias).cloned().unwrap_or(Value::Null)
    }

    fn whole(&self) -> Value {
        self.clone()
    }
}

/// One column of the SELECT list.
enum Item {
    Expr {
        expr: Expr,
        name: String,
    },
    /// `*` or `alias.*`: every column of the input.
    Star(usize),
}

/// A value of an answer row before `*` is spread into columns.
#[derive(Clone)]
enum Cell {
    Value(Value),
    Star(Value),
}

/// What an ORDER BY term sorts by.
enum SortKey {
    /// A SELECT list item's value.
    Output(usize),
    Expr(Expr),
}

struct Limit {
    limit: Option<u64>,
    offset: u64,
}

const NO_LIMIT: Limit = Limit { limit: None, offset: 0 };

/// A FROM name's schema (if written: `public`, `pg_catalog`, `information_schema`) and name.
fn schema_and_name(name: &ast::ObjectName) -> Result<(Option<String>, String), SqlError> {
    let part =
        |part: &ast::ObjectNamePart| part.as_ident().map_or_else(|| part.to_string(), |ident| ident.value.clone());
    match name.0.as_slice() {
        [schema, bare] => {
            let schema = part(schema);
            if !schema.eq_ignore_ascii_case("public") && !super::catalog::is_catalog_schema(&schema) {
                return Err(invalid(format!(
                    "{name}: onehop has the schemas public (its streams, tables and views), pg_catalog and \
                     information_schema"
                )));
            }
            Ok((Some(schema.to_ascii_lowercase()).filter(|schema| schema != "public"), part(bare)))
        }
        _ => Ok((None, crate::parse::simple_name(name)?)),
    }
}

fn input(row: &Value) -> Input<'_> {
    Input::row(row)
}

fn holds(conditions: &[Expr], row: &impl RowLike) -> bool {
    let input = row.input();
    conditions.iter().all(|condition| is_true(&condition.value(&input)))
}

impl<'a> Context<'a> {
    pub(crate) fn new(engine: &'a Engine, principal: Option<&'a Principal>, limits: &QueryLimits) -> Context<'a> {
        Context {
            engine,
            principal,
            budget: Budget::new(limits),
            ctes: Vec::new(),
            explain: None,
            depth: 0,
            subqueries: 0,
            overlay: None,
            catalog: None,
            limits: limits.clone(),
            correlated: Vec::new(),
            correlated_count: 0,
            stream: None,
            streamed_select: None,
        }
    }

    /// Starts with the catalog another query of the same statement built.
    pub(super) fn preset_catalog(&mut self, catalog: Option<Arc<Catalog>>) {
        self.catalog = catalog;
    }

    /// Keeps a correlated subquery for the SELECT being resolved; the hidden field its value
    /// is put under.
    pub(super) fn correlate(&mut self, anchor: usize, outer: Vec<Expr>, query: ast::Query, shape: Shape) -> String {
        self.correlated_count += 1;
        let field = format!("{HIDDEN}{}", self.correlated_count);
        self.correlated.push(Correlated::new(anchor, field.clone(), outer, query, shape));
        field
    }

    /// The catalog as the principal sees it (`pg_catalog`, `information_schema`).
    pub(super) fn catalog(&mut self) -> Result<Arc<Catalog>, SqlError> {
        if let Some(catalog) = &self.catalog {
            return Ok(catalog.clone());
        }
        let catalog = Arc::new(Catalog::of(self.engine, self.principal)?);
        self.catalog = Some(catalog.clone());
        Ok(catalog)
    }

    /// The user the query runs for, if it has one.
    pub(super) fn user(&self) -> Option<String> {
        self.principal.and_then(|principal| principal.user().map(str::to_string))
    }

    /// Reads the table `overlay` is of through it: a transaction's statements see its writes.
    pub(crate) fn read_through(&mut self, overlay: Option<Arc<Overlay>>) {
        self.overlay = overlay;
    }

    /// Ends the query at its next look at the clock once `cancel` is set.
    pub(crate) fn cancel_with(&mut self, cancel: Option<super::Cancel>) {
        self.budget.cancel = cancel;
    }

    fn note(&mut self, line: String) {
        let depth = self.depth;
        if let Some(lines) = &mut self.explain {
            lines.push(format!("{}{line}", "  ".repeat(depth)));
        }
    }

    /// Runs `query` (a nested one in the same way: its own scope, the CTEs around it visible).
    pub(crate) fn query(&mut self, query: &ast::Query) -> Result<Answer, SqlError> {
        if query.fetch.is_some() || !query.locks.is_empty() || query.for_clause.is_some() {
            return Err(unsupported("FETCH, FOR UPDATE and FOR XML/JSON"));
        }
        if query.settings.is_some() || query.format_clause.is_some() || !query.pipe_operators.is_empty() {
            return Err(unsupported("SETTINGS, FORMAT and pipe operators"));
        }
        let limit = limit(query)?;
        let scope = self.ctes.len();
        let answer = self.with_ctes(query).and_then(|()| self.body(&query.body, query.order_by.as_ref(), &limit));
        self.ctes.truncate(scope);
        answer
    }

    fn with_ctes(&mut self, query: &ast::Query) -> Result<(), SqlError> {
        let Some(with) = &query.with else { return Ok(()) };
        if with.recursive {
            return Err(unsupported("WITH RECURSIVE"));
        }
        for cte in &with.cte_tables {
            let name = cte.alias.name.value.clone();
            self.note(format!("with {name}"));
            let mut answer = self.nested(|context| context.query(&cte.query))?;
            rename(&mut answer, &cte.alias, &name)?;
            self.ctes.push((name, Arc::new(answer)));
        }
        Ok(())
    }

    /// Runs `inner` one level deeper in the plan.
    fn nested<T>(&mut self, inner: impl FnOnce(&mut Context<'a>) -> Result<T, SqlError>) -> Result<T, SqlError> {
        self.depth += 1;
        let result = inner(self);
        self.depth -= 1;
        result
    }

    fn body(&mut self, body: &ast::SetExpr, order: Option<&ast::OrderBy>, limit: &Limit) -> Result<Answer, SqlError> {
        match body {
            ast::SetExpr::Select(select) => self.select(select, order, limit),
            ast::SetExpr::Query(query) => {
                let answer = self.query(query)?;
                self.order_answer(answer, order, limit)
            }
            ast::SetExpr::SetOperation { left, op, set_quantifier, right } => {
                let label = format!("{op} {set_quantifier}").trim().to_ascii_lowercase();
                self.note(label);
                let (left, right) = self.nested(|context| {
                    Ok((context.body(left, None, &NO_LIMIT)?, context.body(right, None, &NO_LIMIT)?))
                })?;
                let answer = set_operation(left, *op, *set_quantifier, right)?;
                self.order_answer(answer, order, limit)
            }
            ast::SetExpr::Values(values) => {
                let answer = self.values(values)?;
                self.order_answer(answer, order, limit)
            }
            other => Err(unsupported(format!("the query {other}"))),
        }
    }

    fn values(&mut self, values: &ast::Values) -> Result<Answer, SqlError> {
        self.note("values".into());
        let mut rows = Vec::with_capacity(values.rows.len());
        let width = values.rows.first().map_or(0, |row| row.content.len());
        for row in &values.rows {
            let row = &row.content;
            if row.len() != width {
                return Err(invalid("VALUES lists must all be the same length"));
            }
            let mut cells = Vec::with_capacity(width);
            for expr in row {
                let expr = resolve(self, &[], expr, &mut Aggregates::Refused("VALUES"))?;
                cells.push(expr.eval(&input(&Value::Null)));
            }
            rows.push(cells);
        }
        let columns = (1..=width).map(|n| format!("column{n}")).collect();
        Ok(Answer { columns, rows })
    }

    /// ORDER BY, OFFSET and LIMIT over an answer's own columns (of a set operation, VALUES, a
    /// parenthesized query).
    fn order_answer(
        &mut self,
        mut answer: Answer,
        order: Option<&ast::OrderBy>,
        limit: &Limit,
    ) -> Result<Answer, SqlError> {
        if let Some(order) = order {
            let ast::OrderByKind::Expressions(terms) = &order.kind else { return Err(unsupported("ORDER BY ALL")) };
            let mut keys = Vec::with_capacity(terms.len());
            for term in terms {
                let position = match &term.expr {
                    ast::Expr::Identifier(ident) => answer.columns.iter().position(|column| column == &ident.value),
                    ast::Expr::Value(value) => ordinal(&value.value, answer.columns.len())?,
                    _ => None,
                };
                let Some(position) = position else {
                    return Err(invalid(format!(
                        "ORDER BY {} : here ORDER BY names the answer's columns ({}) or their positions",
                        term.expr,
                        answer.columns.join(", ")
                    )));
                };
                keys.push((position, direction(&term.options)));
            }
            let terms: Vec<Direction> = keys.iter().map(|(_, direction)| *direction).collect();
            let mut keyed: Vec<(Vec<Value>, Vec<Value>)> = answer
                .rows
                .into_iter()
                .map(|row| (keys.iter().map(|(position, _)| row[*position].clone()).collect(), row))
                .collect();
            keyed.sort_by(|(left, _), (right, _)| by_terms(left, right, &terms));
            answer.rows = keyed.into_iter().map(|(_, row)| row).collect();
        }
        answer.rows = apply_limit(answer.rows, limit);
        Ok(answer)
    }

    /// A function's rows in FROM: `unnest(array, …)` (each element a row, several arrays side
    /// by side) or `generate_series(start, stop [, step])`, `WITH ORDINALITY` adding each row's
    /// position. The arguments are constants (or outer columns of a correlated subquery): a
    /// function over another input's rows (LATERAL) is not served yet.
    fn table_function(
        &mut self,
        function: &str,
        args: &[ast::Expr],
        alias: Option<&ast::TableAlias>,
        ordinality: bool,
    ) -> Result<Source, SqlError> {
        let mut values = Vec::with_capacity(args.len());
        for arg in args {
            let expr = resolve(self, &[], arg, &mut Aggregates::Refused("a function in FROM")).map_err(|error| {
                invalid(format!(
                    "FROM {function}({arg}): its arguments are constants here (LATERAL is not served yet): {error}"
                ))
            })?;
            values.push(expr.eval(&input(&Value::Null)));
        }
        let mut rows: Vec<Vec<Value>> = match function {
            "unnest" => {
                if values.is_empty() {
                    return Err(invalid("unnest takes one or more arrays"));
                }
                let arrays: Vec<&[Value]> = values
                    .iter()
                    .map(|value| match value {
                        Value::Array(items) => Ok(items.as_slice()),
                        Value::Null => Ok(&[][..]),
                        other => Err(invalid(format!("unnest takes arrays, not {other}"))),
                    })
                    .collect::<Result<_, _>>()?;
                let length = arrays.iter().map(|items| items.len()).max().unwrap_or(0);
                (0..length)
                    .map(|index| arrays.iter().map(|items| items.get(index).cloned().unwrap_or(Value::Null)).collect())
                    .collect()
            }
            "generate_series" => {
                let integer = |value: &Value| value.as_i64();
                let (Some(start), Some(stop)) = (values.first().and_then(integer), values.get(1).and_then(integer))
                else {
                    return Err(invalid("generate_series takes integers: (start, stop [, step])"));
                };
                let step = match values.get(2) {
                    None => 1,
                    Some(step) => integer(step).ok_or_else(|| invalid("generate_series's step is an integer"))?,
                };
                if step == 0 {
                    return Err(invalid("generate_series's step cannot be 0"));
                }
                let count = if (step > 0 && stop < start) || (step < 0 && stop > start) {
                    0
                } else {
                    ((stop as i128 - start as i128) / step as i128 + 1) as u64
                };
                self.budget.hold_bytes(count.saturating_mul(16))?;
                (0..count)
                    .map(|index| vec![Value::from((start as i128 + index as i128 * step as i128) as i64)])
                    .collect()
            }
            other => {
                return Err(unsupported(format!(
                    "the function {other}() in FROM (unnest and generate_series are served)"
                )));
            }
        };
        let width = rows.first().map_or(values.len().max(1), Vec::len);
        let base = alias.map_or_else(|| function.to_string(), |alias| alias.name.value.clone());
        let mut columns: Vec<String> = if width == 1 {
            vec![base.clone()]
        } else {
            (1..=width).map(|index| format!("{function}{index}")).collect()
        };
        if function == "generate_series" {
            columns = vec![if alias.is_some() { base.clone() } else { function.to_string() }];
        }
        if ordinality {
            columns.push("ordinality".into());
            for (index, row) in rows.iter_mut().enumerate() {
                row.push(Value::from(index + 1));
            }
        }
        for row in &rows {
            self.budget.hold_bytes(super::budget::estimate(&Value::Array(row.clone())))?;
        }
        self.note(format!("function {function}"));
        answer_source(base, format!("function {function}"), Arc::new(Answer { columns, rows }), alias)
    }

    /// One input of FROM, checked against what the principal may read.
    fn source(&mut self, relation: &ast::TableFactor) -> Result<Source, SqlError> {
        match relation {
            ast::TableFactor::Table { name, alias, args: None, with_hints, version: None, partitions, .. }
                if with_hints.is_empty() && partitions.is_empty() =>
            {
                let (schema, name) = schema_and_name(name)?;
                let alias_name = alias.as_ref().map_or_else(|| name.clone(), |alias| alias.name.value.clone());
                if let Some((schema, relation)) = super::catalog::relation(schema.as_deref(), &name) {
                    let answer = Arc::new(self.catalog()?.rows(schema, relation));
                    return answer_source(alias_name, format!("catalog {schema}.{relation}"), answer, alias.as_ref());
                }
                if let Some(schema) = schema.filter(|schema| super::catalog::is_catalog_schema(schema)) {
                    return Err(invalid(format!(
                        "{schema}.{name} is not among the catalog relations onehop answers (docs/postgres.md lists them)"
                    )));
                }
                if let Some((_, answer)) = self.ctes.iter().rev().find(|(cte, _)| *cte == name) {
                    return answer_source(alias_name, format!("with {name}"), answer.clone(), alias.as_ref());
                }
                let (kind, object_kind, known, open) = if let Ok(table) = self.engine.table(&name) {
                    let known = table.def().columns.iter().map(|column| column.name.clone()).collect();
                    let overlay = Overlay::of(self.overlay.as_ref(), &name).cloned();
                    (Kind::Table(table, overlay), ObjectKind::Table, known, true)
                } else if let Ok(view) = self.engine.view(&name) {
                    let known = view.def().column_names();
                    (Kind::View(view), ObjectKind::View, known, true)
                } else if let Ok(stream) = self.engine.stream(&name) {
                    let known = STREAM_FIELDS.iter().map(|field| field.to_string()).collect();
                    (Kind::Stream(stream), ObjectKind::Stream, known, true)
                } else {
                    return Err(invalid(format!(
                        "{name} is not a table, view or stream (SHOW TABLES, SHOW VIEWS and SHOW STREAMS list them)"
                    )));
                };
                if let Some(principal) = self.principal {
                    self.engine.access().authorize(principal, Privilege::Read, object_kind, &name)?;
                }
                let label = format!("{} {name}", object_kind.to_string().to_ascii_lowercase());
                let mut source = Source { alias: alias_name, label, kind, known, open, merged: Vec::new() };
                if let Some(alias) = alias {
                    rename_source(&mut source, alias)?;
                }
                Ok(source)
            }
            ast::TableFactor::Table { name, alias, args: Some(args), with_ordinality, .. } => {
                let function = match name.0.as_slice() {
                    [part] | [_, part] => part.as_ident().map(|ident| ident.value.to_ascii_lowercase()),
                    _ => None,
                }
                .ok_or_else(|| unsupported(format!("FROM {name}(…)")))?;
                let mut values = Vec::with_capacity(args.args.len());
                for arg in &args.args {
                    let ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(arg)) = arg else {
                        return Err(unsupported(format!("the argument {arg} of {name}")));
                    };
                    values.push(arg.clone());
                }
                self.table_function(&function, &values, alias.as_ref(), *with_ordinality)
            }
            ast::TableFactor::UNNEST { alias, array_exprs, with_offset: false, with_ordinality, .. } => {
                self.table_function("unnest", array_exprs, alias.as_ref(), *with_ordinality)
            }
            ast::TableFactor::Derived { lateral: false, subquery, alias, .. } => {
                self.subqueries += 1;
                let alias_name =
                    alias.as_ref().map_or_else(|| format!("subquery{}", self.subqueries), |a| a.name.value.clone());
                self.note(format!("subquery {alias_name}"));
                let answer = self.nested(|context| context.query(subquery))?;
                let mut source = Source {
                    alias: alias_name,
                    label: "subquery".into(),
                    known: answer.columns.clone(),
                    open: false,
                    kind: Kind::Rows(Arc::new(answer)),
                    merged: Vec::new(),
                };
                if let Some(alias) = alias {
                    rename_source(&mut source, alias)?;
                }
                Ok(source)
            }
            ast::TableFactor::Derived { lateral: true, .. } => Err(unsupported("LATERAL subqueries")),
            other => Err(unsupported(format!("FROM {other}"))),
        }
    }

    fn select(
        &mut self,
        select: &ast::Select,
        order: Option<&ast::OrderBy>,
        limit: &Limit,
    ) -> Result<Answer, SqlError> {
        check_select(select)?;
        let correlated_mark = self.correlated.len();
        // The inputs, in the order they are joined.
        let mut sources: Vec<Source> = Vec::new();
        let mut joins: Vec<(JoinKind, Option<&ast::JoinConstraint>)> = Vec::new();
        for item in &select.from {
            let source = self.source(&item.relation)?;
            if !sources.is_empty() {
                joins.push((JoinKind::Cross, None));
            }
            sources.push(source);
            for join in &item.joins {
                if join.global {
                    return Err(unsupported("GLOBAL JOIN"));
                }
                let (kind, constraint) = join_kind(&join.join_operator)?;
                sources.push(self.source(&join.relation)?);
                joins.push((kind, constraint));
            }
        }
        for (index, source) in sources.iter().enumerate() {
            if sources[..index].iter().any(|other| other.alias == source.alias) {
                return Err(invalid(format!("{} is named twice in FROM: give one an alias", source.alias)));
            }
        }

        // WHERE and ON, as conditions.
        let filter = match &select.selection {
            Some(selection) => conjuncts(resolve(self, &sources, selection, &mut Aggregates::Refused("WHERE"))?),
            None => Vec::new(),
        };
        let mut ons = Vec::with_capacity(joins.len());
        for (index, (kind, constraint)) in joins.iter().enumerate() {
            let right = index + 1;
            let on = match constraint {
                None => Vec::new(),
                Some(ast::JoinConstraint::On(on)) => {
                    let scope = &sources[..=right];
                    let on = resolve(self, scope, on, &mut Aggregates::Refused("ON"))?;
                    if let Some(later) = inputs_of(&on, &sources).into_iter().find(|input| *input > right) {
                        return Err(invalid(format!(
                            "the ON clause of {} reads {}, joined after it",
                            sources[right].alias, sources[later].alias
                        )));
                    }
                    conjuncts(on)
                }
                Some(ast::JoinConstraint::Using(columns)) => {
                    let conditions = using(&sources[..=right], columns)?;
                    // The column is one now: unqualified, it is the left input's.
                    for column in columns {
                        sources[right].merged.push(crate::parse::simple_name(column)?);
                    }
                    conditions
                }
                Some(other) => return Err(unsupported(format!("the join condition {other:?}"))),
            };
            if *kind != JoinKind::Cross && constraint.is_none() {
                return Err(invalid(format!("JOIN {} needs ON or USING (or write CROSS JOIN)", sources[right].alias)));
            }
            ons.push(on);
        }

        // The SELECT list, HAVING and ORDER BY, collecting their aggregates.
        let mut aggregates = Vec::new();
        let mut items = Vec::with_capacity(select.projection.len());
        let mut item_asts: Vec<Option<(&ast::Expr, String)>> = Vec::with_capacity(select.projection.len());
        // Set-returning functions of the SELECT list: (which, the array they read).
        let mut expanding: Vec<(Expanding, Expr)> = Vec::new();
        for item in &select.projection {
            match item {
                ast::SelectItem::UnnamedExpr(expr) | ast::SelectItem::ExprWithAlias { expr, .. } => {
                    let name = match item {
                        ast::SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
                        _ => output_name(expr),
                    };
                    if let Some((kind, array)) = expanding_call(expr) {
                        let array = resolve(self, &sources, array, &mut Aggregates::Refused("unnest"))?;
                        expanding.push((kind, array));
                        let path = vec![Step::Field(EXPANDED.into()), Step::Field((expanding.len() - 1).to_string())];
                        items.push(Item::Expr { expr: Expr::Path { path }, name: name.clone() });
                        item_asts.push(Some((expr, name)));
                        continue;
                    }
                    let resolved = resolve(self, &sources, expr, &mut Aggregates::Collect(&mut aggregates))?;
                    items.push(Item::Expr { expr: resolved, name: name.clone() });
                    item_asts.push(Some((expr, name)));
                }
                ast::SelectItem::Wildcard(options) => {
                    check_wildcard(options)?;
                    if sources.is_empty() {
                        return Err(invalid("SELECT * needs FROM"));
                    }
                    for index in 0..sources.len() {
                        items.push(Item::Star(index));
                        item_asts.push(None);
                    }
                }
                ast::SelectItem::QualifiedWildcard(ast::SelectItemQualifiedWildcardKind::ObjectName(name), options) => {
                    check_wildcard(options)?;
                    let [part] = name.0.as_slice() else { return Err(invalid(format!("{name}.*: name one input"))) };
                    let ident = part.as_ident().ok_or_else(|| invalid(format!("{name}.*: name one input")))?;
                    let index = super::resolve::alias(&sources, ident)
                        .ok_or_else(|| invalid(format!("{name}.*: no input of FROM is called {name}")))?;
                    items.push(Item::Star(index));
                    item_asts.push(None);
                }
                other => return Err(unsupported(format!("the SELECT item {other}"))),
            }
        }
        let having = match &select.having {
            Some(having) => Some(resolve(self, &sources, having, &mut Aggregates::Collect(&mut aggregates))?),
            None => None,
        };
        let group = self.group_by(select, &sources, &item_asts)?;
        let mut sort = Vec::new();
        if let Some(order) = order {
            let ast::OrderByKind::Expressions(terms) = &order.kind else { return Err(unsupported("ORDER BY ALL")) };
            for term in terms {
                let key = match sort_output(&term.expr, &item_asts)? {
                    Some(position) => SortKey::Output(position),
                    None => {
                        SortKey::Expr(resolve(self, &sources, &term.expr, &mut Aggregates::Collect(&mut aggregates))?)
                    }
                };
                sort.push((key, direction(&term.options)));
            }
        }
        let grouped = !group.is_empty() || !aggregates.is_empty() || having.is_some();
        if grouped && !expanding.is_empty() {
            return Err(unsupported("unnest or generate_subscripts in the SELECT list of a grouped query"));
        }
        if grouped {
            for item in &items {
                match item {
                    Item::Star(_) => return Err(invalid("SELECT * with GROUP BY or aggregates: list the columns")),
                    Item::Expr { expr, name } => check_grouped(expr, &group, &sources, name)?,
                }
            }
            if let Some(having) = &having {
                check_grouped(having, &group, &sources, "HAVING")?;
            }
            for (key, _) in &sort {
                if let SortKey::Expr(expr) = key {
                    check_grouped(expr, &group, &sources, "ORDER BY")?;
                }
            }
        }
        let distinct = match &select.distinct {
            None | Some(ast::Distinct::All) => false,
            Some(ast::Distinct::Distinct) => true,
            Some(ast::Distinct::On(_)) => return Err(unsupported("DISTINCT ON")),
        };

        let correlated = self.correlated.split_off(correlated_mark.min(self.correlated.len()));
        for entry in &correlated {
            self.note(format!(
                "  correlated subquery, run per distinct row of {} it reads: ({})",
                sources[entry.anchor].alias, entry.query
            ));
        }

        // The plan.
        let mut filters: Vec<Vec<Expr>> = (0..sources.len().max(1)).map(|_| Vec::new()).collect();
        for condition in filter {
            let level = inputs_of(&condition, &sources).last().copied().unwrap_or(0);
            filters[level].push(condition);
        }
        let access = match sources.first() {
            Some(first) => first_access(first, &filters[0])?,
            None => Access::Scan,
        };
        let plans: Vec<JoinPlan> = ons
            .into_iter()
            .zip(&joins)
            .enumerate()
            .map(|(index, (on, (kind, _)))| plan_join(&sources, index + 1, *kind, on))
            .collect();
        self.note_plan(&sources, &access, &plans, &group, &aggregates, having.is_some(), &sort, distinct, limit);
        if self.explain.is_some() {
            let columns = columns_of(&items, &sources, &[]).into_iter().map(|column| column.name).collect();
            return Ok(Answer { columns, rows: Vec::new() });
        }

        // The run.
        let stop_at = match (grouped || distinct || !sort.is_empty(), limit.limit) {
            (false, Some(limit_rows)) => Some(limit.offset.saturating_add(limit_rows)),
            _ => None,
        };
        let known = items.iter().all(|item| !matches!(item, Item::Star(index) if sources[*index].open));
        let mut streamer = match self.streamed_select == Some(std::ptr::from_ref(select) as usize)
            && !grouped
            && !distinct
            && sort.is_empty()
            && expanding.is_empty()
            && known
        {
            true => self.stream.take(),
            false => None,
        };
        let stream_columns = columns_of(&items, &sources, &[]);
        if let Some(streamer) = &mut streamer {
            streamer.columns(stream_columns.iter().map(|column| column.name.clone()).collect())?;
        }
        let (mut skipped, mut streamed) = (0u64, 0u64);
        let mut out: Vec<(Vec<Cell>, Vec<Value>)> = Vec::new();
        let mut groups: Vec<(Value, Vec<Accumulator>)> = Vec::new();
        let mut group_index: foldhash::HashMap<String, usize> = foldhash::HashMap::default();
        if grouped && group.is_empty() {
            groups.push((Value::Null, aggregates.iter().map(Accumulator::new).collect()));
            group_index.insert(String::new(), 0);
        }
        {
            let mut sink = |row: &Joined, budget: &mut Budget| -> Result<bool, SqlError> {
                budget.tick()?;
                if grouped {
                    let input = row.input();
                    let mut key = String::new();
                    for expr in &group {
                        push_key(&mut key, &expr.value(&input));
                    }
                    let at = match group_index.get(&key) {
                        Some(at) => *at,
                        None => {
                            let first = row.whole();
                            budget.hold(&first)?;
                            groups.push((first, aggregates.iter().map(Accumulator::new).collect()));
                            group_index.insert(key, groups.len() - 1);
                            groups.len() - 1
                        }
                    };
                    for (accumulator, aggregate) in groups[at].1.iter_mut().zip(&aggregates) {
                        accumulator.add(aggregate, &input, budget)?;
                    }
                    return Ok(true);
                }
                if let Some(streamer) = &mut streamer {
                    // Handed on as it is made: held by nobody, so not counted against memory.
                    if skipped < limit.offset {
                        skipped += 1;
                        return Ok(true);
                    }
                    if limit.limit.is_some_and(|limit| streamed >= limit) {
                        return Ok(false);
                    }
                    let (cells, _) = project(&items, &sources, &sort, row);
                    streamer.row(spread(&cells, &stream_columns))?;
                    streamed += 1;
                    return Ok(limit.limit.is_none_or(|limit| streamed < limit));
                }
                if expanding.is_empty() {
                    let entry = project(&items, &sources, &sort, row);
                    budget.hold_bytes(cells_bytes(&entry))?;
                    out.push(entry);
                    return Ok(stop_at.is_none_or(|stop| (out.len() as u64) < stop));
                }
                for expanded in expand(&expanding, &row.whole()) {
                    let entry = project(&items, &sources, &sort, &expanded);
                    budget.hold_bytes(cells_bytes(&entry))?;
                    out.push(entry);
                }
                Ok(stop_at.is_none_or(|stop| (out.len() as u64) < stop))
            };
            if sources.is_empty() {
                // No FROM: one row of no columns, if WHERE holds for it.
                let row = Joined { parts: Vec::new() };
                if holds(&filters[0], &row) {
                    sink(&row, &mut self.budget)?;
                }
            } else {
                let correlator = Correlator {
                    engine: self.engine,
                    principal: self.principal,
                    limits: self.limits.clone(),
                    cancel: self.budget.cancel.clone(),
                    overlay: self.overlay.clone(),
                    catalog: self.catalog.clone(),
                    entries: correlated,
                };
                let aliases = sources.iter().map(|source| Arc::from(source.alias.as_str())).collect();
                let mut join = Join {
                    sources: &sources,
                    aliases,
                    plans: &plans,
                    filters: &filters,
                    built: Vec::new(),
                    probed: plans.iter().map(|_| foldhash::HashMap::default()).collect(),
                    correlator,
                };
                join.build(&mut self.budget)?;
                join.run(&access, &mut self.budget, &mut sink)?;
            }
        }
        if let Some(mut streamer) = streamer {
            streamer.flush()?;
            let columns = stream_columns.into_iter().map(|column| column.name).collect();
            self.stream = Some(streamer);
            return Ok(Answer { columns, rows: Vec::new() });
        }
        if grouped {
            for (first, accumulators) in groups {
                let values: Vec<Value> = accumulators
                    .into_iter()
                    .zip(&aggregates)
                    .map(|(accumulator, aggregate)| accumulator.finish(aggregate))
                    .collect();
                let mut row = match first {
                    Value::Object(fields) => fields,
                    _ => Map::new(),
                };
                let computed: Map<String, Value> =
                    values.into_iter().enumerate().map(|(index, value)| (index.to_string(), value)).collect();
                row.insert(AGGREGATES.to_string(), Value::Object(computed));
                let row = Value::Object(row);
                if let Some(having) = &having
                    && !is_true(&having.eval(&input(&row)))
                {
                    continue;
                }
                let entry = project(&items, &sources, &sort, &row);
                self.budget.hold_bytes(cells_bytes(&entry))?;
                out.push(entry);
            }
        }
        if distinct {
            let mut seen = std::collections::HashSet::new();
            out.retain(|(cells, _)| seen.insert(cells_key(cells)));
        }
        if !sort.is_empty() {
            let terms: Vec<Direction> = sort.iter().map(|(_, direction)| *direction).collect();
            out.sort_by(|(_, left), (_, right)| by_terms(left, right, &terms));
        }
        let out = apply_limit(out, limit);
        let rows: Vec<Vec<Cell>> = out.into_iter().map(|(cells, _)| cells).collect();
        let columns = columns_of(&items, &sources, &rows);
        let rows = rows.iter().map(|cells| spread(cells, &columns)).collect();
        Ok(Answer { columns: columns.into_iter().map(|column| column.name).collect(), rows })
    }

    /// GROUP BY's expressions; a position or an alias of the SELECT list stands for its item.
    fn group_by(
        &mut self,
        select: &ast::Select,
        sources: &[Source],
        items: &[Option<(&ast::Expr, String)>],
    ) -> Result<Vec<Expr>, SqlError> {
        let exprs = match &select.group_by {
            ast::GroupByExpr::Expressions(exprs, modifiers) if modifiers.is_empty() => exprs,
            other => return Err(unsupported(format!("{other}"))),
        };
        let mut group = Vec::with_capacity(exprs.len());
        for expr in exprs {
            let stands_for = match expr {
                ast::Expr::Value(value) => match ordinal(&value.value, items.len())? {
                    Some(position) => match items[position] {
                        Some((item, _)) => Some(item),
                        None => return Err(invalid("GROUP BY a position of * : name the columns")),
                    },
                    None => None,
                },
                ast::Expr::Identifier(ident) if !declared(sources, ident) => {
                    items.iter().flatten().find(|(_, name)| *name == ident.value).map(|(item, _)| *item)
                }
                _ => None,
            };
            group.push(resolve(self, sources, stands_for.unwrap_or(expr), &mut Aggregates::Refused("GROUP BY"))?);
        }
        Ok(group)
    }

    #[allow(clippy::too_many_arguments)]
    fn note_plan(
        &mut self,
        sources: &[Source],
        access: &Access,
        plans: &[JoinPlan],
        group: &[Expr],
        aggregates: &[Aggregate],
        having: bool,
        sort: &[(SortKey, Direction)],
        distinct: bool,
        limit: &Limit,
    ) {
        if self.explain.is_none() {
            return;
        }
        self.note("select".into());
        self.depth += 1;
        if let Some(first) = sources.first() {
            let line = format!("{} AS {}: {}", first.label, first.alias, describe_access(first, access));
            self.note(line);
        }
        for (index, plan) in plans.iter().enumerate() {
            let source = &sources[index + 1];
            let kind = match plan.kind {
                JoinKind::Inner => "join",
                JoinKind::Left => "left join",
                JoinKind::Cross => "cross join",
            };
            let how = match &plan.strategy {
                Strategy::Probe { probe: Probe::Key, field, .. } => format!("by primary key {field}, per row"),
                Strategy::Probe { probe: Probe::Index, field, .. } => format!("by index on {field}, per row"),
                Strategy::Hash { .. } => "read once, hashed on the ON equality".to_string(),
                Strategy::Loop => "read once, every pair tried (nested loop)".to_string(),
            };
            let line = format!("{kind} {} AS {}: {how}", source.label, source.alias);
            self.note(line);
        }
        if group.is_empty() && !aggregates.is_empty() {
            self.note(format!("aggregate: {} aggregate(s) over all rows", aggregates.len()));
        } else if !group.is_empty() {
            self.note(format!("group by {} expression(s): {} aggregate(s)", group.len(), aggregates.len()));
        }
        if having {
            self.note("having".into());
        }
        if distinct {
            self.note("distinct".into());
        }
        if !sort.is_empty() {
            self.note(format!("sort by {} term(s)", sort.len()));
        }
        if limit.limit.is_some() || limit.offset > 0 {
            let shown = limit.limit.map_or("all".to_string(), |limit| limit.to_string());
            self.note(format!("limit {shown} offset {}", limit.offset));
        }
        self.depth -= 1;
    }
}

/// The rows of the inputs joined, each passed to a sink.
struct Join<'p> {
    sources: &'p [Source],
    /// Each input's alias, as the joined rows name it.
    aliases: Vec<Arc<str>>,
    plans: &'p [JoinPlan],
    filters: &'p [Vec<Expr>],
    built: Vec<Built>,
    /// Per joined input probed by its primary key, the rows found so far by key: each key is
    /// probed once per query, however many rows before it name it (a table's row as the
    /// query first read it, which is also what a snapshot would give).
    probed: Vec<foldhash::HashMap<String, Option<Doc>>>,
    correlator: Correlator<'p>,
}

/// Keys a probe remembers per joined input at most; past it, it forgets them all and goes on.
const PROBED_MAX: usize = 65_536;

/// What a sink of joined rows is handed: each row, until it answers false.
type Sink<'s> = dyn FnMut(&Joined, &mut Budget) -> Result<bool, SqlError> + 's;

impl Join<'_> {
    /// Reads once the inputs that are read once.
    fn build(&mut self, budget: &mut Budget) -> Result<(), SqlError> {
        for (index, plan) in self.plans.iter().enumerate() {
            let source = &self.sources[index + 1];
            let alias = &self.aliases[index + 1];
            let built = match &plan.strategy {
                Strategy::Probe { .. } => Built::None,
                Strategy::Hash { right, .. } => {
                    let mut hashed: HashMap<String, Vec<Doc>> = HashMap::new();
                    source.read(&Access::Scan, budget, &mut |row, budget| {
                        budget.tick()?;
                        let row = Joined::one(alias, row);
                        if !holds(&plan.alone, &row) {
                            return Ok(true);
                        }
                        let key = right.value(&row.input());
                        if key.is_null() {
                            return Ok(true);
                        }
                        let key = super::order::key(&key);
                        let Some(doc) = row.parts.into_iter().next().and_then(|part| part.row) else {
                            return Ok(true);
                        };
                        budget.hold_bytes(doc_bytes(&doc))?;
                        hashed.entry(key).or_default().push(doc);
                        Ok(true)
                    })?;
                    Built::Hash(hashed.into_iter().map(|(key, rows)| (key, Arc::new(rows))).collect())
                }
                Strategy::Loop => {
                    let mut rows = Vec::new();
                    source.read(&Access::Scan, budget, &mut |row, budget| {
                        budget.tick()?;
                        let row = Joined::one(alias, row);
                        if holds(&plan.alone, &row)
                            && let Some(doc) = row.parts.into_iter().next().and_then(|part| part.row)
                        {
                            budget.hold_bytes(doc_bytes(&doc))?;
                            rows.push(doc);
                        }
                        Ok(true)
                    })?;
                    Built::Rows(Arc::new(rows))
                }
            };
            self.built.push(built);
        }
        Ok(())
    }

    fn run(&mut self, access: &Access, budget: &mut Budget, sink: &mut Sink) -> Result<(), SqlError> {
        let first = &self.sources[0];
        let alias = self.aliases[0].clone();
        first.read(access, budget, &mut |row, budget| {
            budget.tick()?;
            let mut parts = Vec::with_capacity(self.sources.len());
            parts.push(Scoped { alias: alias.clone(), row: Some(row) });
            let mut joined = Joined { parts };
            self.correlator.fill(0, &mut joined)?;
            if !holds(&self.filters[0], &joined) {
                return Ok(true);
            }
            self.extend(1, &mut joined, budget, sink)
        })
    }

    /// Joins input `level` to `row` (which holds the inputs before it) and on; false once the
    /// sink wants no more rows.
    fn extend(
        &mut self,
        level: usize,
        row: &mut Joined,
        budget: &mut Budget,
        sink: &mut Sink,
    ) -> Result<bool, SqlError> {
        if level == self.sources.len() {
            return sink(row, budget);
        }
        let (sources, plans, filters) = (self.sources, self.plans, self.filters);
        let source = &sources[level];
        let plan = &plans[level - 1];
        // Rows probed are found per row; rows read once are shared by every row.
        let mut probed: Vec<Doc> = Vec::new();
        let mut exact = false;
        let shared: Option<Arc<Vec<Doc>>> = match (&plan.strategy, &self.built[level - 1]) {
            (Strategy::Probe { probe: Probe::Key, field, key }, _) if source.is_table() => {
                let key = key.value(&row.input());
                exact = plan.exact && key.is_string();
                if let Some(id) = onehop_engine::TableDef::id_text(&key) {
                    let known = &mut self.probed[level - 1];
                    let found = match known.get(&*id) {
                        Some(found) => found.clone(),
                        None => {
                            let mut found = None;
                            source.probe(Probe::Key, field, &key, budget, &mut |candidate, _| {
                                found = Some(candidate);
                                Ok(false)
                            })?;
                            if known.len() >= PROBED_MAX {
                                known.clear();
                            }
                            known.insert(id.into_owned(), found.clone());
                            found
                        }
                    };
                    probed.extend(found);
                }
                None
            }
            (Strategy::Probe { probe, field, key }, _) => {
                let key = key.value(&row.input());
                source.probe(*probe, field, &key, budget, &mut |candidate, _| {
                    probed.push(candidate);
                    Ok(true)
                })?;
                None
            }
            (Strategy::Hash { left, .. }, Built::Hash(hashed)) => {
                let key = left.value(&row.input());
                if key.is_null() { None } else { hashed.get(&super::order::key(&key)).cloned() }
            }
            (_, Built::Rows(rows)) => Some(rows.clone()),
            _ => None,
        };
        row.parts.push(Scoped { alias: self.aliases[level].clone(), row: None });
        let mut matched = false;
        let candidates = probed.into_iter().chain(shared.iter().flat_map(|rows| rows.iter().cloned()));
        let mut going = true;
        for candidate in candidates {
            budget.tick()?;
            row.parts[level].row = Some(candidate);
            self.correlator.fill(level, row)?;
            if !exact && !holds(&plan.on, row) {
                continue;
            }
            matched = true;
            if holds(&filters[level], row) && !self.extend(level + 1, row, budget, sink)? {
                going = false;
                break;
            }
        }
        if going && !matched && plan.kind == JoinKind::Left {
            row.parts[level].row = None;
            self.correlator.fill(level, row)?;
            if holds(&filters[level], row) && !self.extend(level + 1, row, budget, sink)? {
                going = false;
            }
        }
        row.parts.pop();
        Ok(going)
    }
}

/// What a shared row counts against the query's memory.
fn doc_bytes(doc: &Doc) -> u64 {
    doc.iter().map(|(name, value)| name.len() as u64 + estimate(value)).sum()
}

/// A set-returning function of a SELECT list: one row per element of an array.
#[derive(Clone, Copy)]
enum Expanding {
    /// `unnest(array)`: the element.
    Unnest,
    /// `generate_subscripts(array, 1)`: the element's position, from 1.
    Subscripts,
}

/// Where an expanded row holds its set-returning functions' values.
const EXPANDED: &str = "\u{4}";

/// `unnest(x)` or `generate_subscripts(x, 1)` as a whole SELECT item.
fn expanding_call(expr: &ast::Expr) -> Option<(Expanding, &ast::Expr)> {
    let ast::Expr::Function(function) = expr else { return None };
    let name = crate::view::expr::function_name(function)?.to_ascii_lowercase();
    let ast::FunctionArguments::List(list) = &function.args else { return None };
    let args: Vec<&ast::Expr> = list
        .args
        .iter()
        .filter_map(|arg| match arg {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(expr)) => Some(expr),
            _ => None,
        })
        .collect();
    match (name.as_str(), args.as_slice()) {
        ("unnest", [array]) => Some((Expanding::Unnest, array)),
        ("generate_subscripts", [array, _dimension]) => Some((Expanding::Subscripts, array)),
        _ => None,
    }
}

/// The rows `row` becomes under its set-returning functions: as many as the longest array
/// (the others' values null past their ends), none when every array is empty or null.
fn expand(expanding: &[(Expanding, Expr)], row: &Value) -> Vec<Value> {
    let arrays: Vec<Vec<Value>> = expanding
        .iter()
        .map(|(_, array)| match array.eval(&input(row)) {
            Value::Array(items) => items,
            // An int2vector of the catalog (`pg_index.indkey`), as Postgres writes it: "1 3".
            Value::String(vector) if !vector.is_empty() && vector.split(' ').all(|n| n.parse::<i64>().is_ok()) => {
                vector.split(' ').map(|n| Value::from(n.parse::<i64>().unwrap_or(0))).collect()
            }
            _ => Vec::new(),
        })
        .collect();
    let length = arrays.iter().map(Vec::len).max().unwrap_or(0);
    (0..length)
        .map(|index| {
            let values: Map<String, Value> = expanding
                .iter()
                .zip(&arrays)
                .enumerate()
                .map(|(position, ((kind, _), items))| {
                    let value = match (kind, items.get(index)) {
                        (_, None) => Value::Null,
                        (Expanding::Unnest, Some(item)) => item.clone(),
                        (Expanding::Subscripts, Some(_)) => Value::from(index + 1),
                    };
                    (position.to_string(), value)
                })
                .collect();
            let mut expanded = row.clone();
            if let Some(fields) = expanded.as_object_mut() {
                fields.insert(EXPANDED.to_string(), Value::Object(values));
            }
            expanded
        })
        .collect()
}

/// Whether `expr` reads a correlated subquery's value (a hidden field of an input's row).
fn reads_hidden(expr: &Expr) -> bool {
    if let Expr::Path { path } = expr
        && matches!(path.get(1), Some(Step::Field(field)) if field.starts_with(HIDDEN))
    {
        return true;
    }
    super::resolve::children(expr).into_iter().any(reads_hidden)
}

/// How the input joined at `right` finds its matches, from its ON conditions.
fn plan_join(sources: &[Source], right: usize, kind: JoinKind, on: Vec<Expr>) -> JoinPlan {
    let source = &sources[right];
    // A condition reading a correlated subquery's value waits for the row that has it.
    let alone: Vec<Expr> = on
        .iter()
        .filter(|condition| inputs_of(condition, sources) == [right] && !reads_hidden(condition))
        .cloned()
        .collect();
    let mut strategy = Strategy::Loop;
    let mut hashed = None;
    for condition in &on {
        let Expr::Binary { operator: BinaryOp::Eq, left, right: other } = condition else { continue };
        for (mine, theirs) in [(&**left, &**other), (&**other, &**left)] {
            let mine_inputs = inputs_of(mine, sources);
            let theirs_inputs = inputs_of(theirs, sources);
            if mine_inputs != [right] || theirs_inputs.iter().any(|input| *input >= right) {
                continue;
            }
            if let Some(field) = column_path(mine, &source.alias) {
                if source.key_field().as_deref() == Some(field) {
                    strategy = Strategy::Probe { probe: Probe::Key, field: field.to_string(), key: theirs.clone() };
                    break;
                }
                if source.indexed(field) && !matches!(strategy, Strategy::Probe { .. }) {
                    strategy = Strategy::Probe { probe: Probe::Index, field: field.to_string(), key: theirs.clone() };
                }
            }
            if hashed.is_none() && !theirs_inputs.is_empty() {
                hashed = Some((mine.clone(), theirs.clone()));
            }
        }
        if matches!(strategy, Strategy::Probe { probe: Probe::Key, .. }) {
            break;
        }
    }
    if matches!(strategy, Strategy::Loop)
        && let Some((mine, theirs)) = hashed
    {
        strategy = Strategy::Hash { right: mine, left: theirs };
    }
    let exact = on.len() == 1 && matches!(strategy, Strategy::Probe { probe: Probe::Key, .. }) && source.text_key();
    JoinPlan { kind, on, alone, strategy, exact }
}

/// The access path of the first input, from WHERE's conditions on it alone.
fn first_access(source: &Source, conditions: &[Expr]) -> Result<Access, SqlError> {
    let alias = source.alias.as_str();
    if source.is_stream() {
        let mut range = Range::default();
        for condition in conditions {
            narrow(&mut range, condition, alias)?;
        }
        return Ok(if range.is_whole() { Access::Scan } else { Access::Range(range) });
    }
    let key_field = source.key_field();
    let mut best = Access::Scan;
    for condition in conditions {
        let Some((field, mut values)) = equality(condition, alias) else { continue };
        // A key listed twice (`IN ('a', 'a')`, or a subquery's answer) finds its rows once.
        let mut seen = std::collections::HashSet::new();
        values.retain(|value| seen.insert(super::order::key(value)));
        if key_field.as_deref() == Some(field) {
            return Ok(Access::Keys(values));
        }
        if source.indexed(field) && matches!(best, Access::Scan) {
            best = Access::Index { field: field.to_string(), values };
        }
    }
    Ok(best)
}

/// `alias.field = literal` or `alias.field IN (literals)`: the field and the values.
fn equality<'e>(condition: &'e Expr, alias: &str) -> Option<(&'e str, Vec<Value>)> {
    match condition {
        Expr::Binary { operator: BinaryOp::Eq, left, right } => match (&**left, &**right) {
            (column, Expr::Literal { value }) | (Expr::Literal { value }, column) => {
                Some((column_path(column, alias)?, vec![value.clone()]))
            }
            _ => None,
        },
        Expr::In { expr, list, negated: false } => {
            let field = column_path(expr, alias)?;
            let values = list
                .iter()
                .map(|item| match item {
                    Expr::Literal { value } => Some(value.clone()),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?;
            Some((field, values))
        }
        _ => None,
    }
}

/// Narrows a stream's range by one WHERE condition on `_partition`, `_offset` or `_time`.
fn narrow(range: &mut Range, condition: &Expr, alias: &str) -> Result<(), SqlError> {
    let (field, operator, value) = match condition {
        Expr::Binary { operator, left, right } => match (&**left, &**right) {
            (column, Expr::Literal { value }) if column_path(column, alias).is_some() => {
                (column_path(column, alias).unwrap_or_default(), *operator, value)
            }
            (Expr::Literal { value }, column) if column_path(column, alias).is_some() => {
                let flipped = match operator {
                    BinaryOp::Lt => BinaryOp::Gt,
                    BinaryOp::LtEq => BinaryOp::GtEq,
                    BinaryOp::Gt => BinaryOp::Lt,
                    BinaryOp::GtEq => BinaryOp::LtEq,
                    other => *other,
                };
                (column_path(column, alias).unwrap_or_default(), flipped, value)
            }
            _ => return Ok(()),
        },
        Expr::Between { expr, low, high, negated: false } => {
            if let (Expr::Literal { value: low }, Expr::Literal { value: high }) = (&**low, &**high) {
                let low = Expr::Binary {
                    operator: BinaryOp::GtEq,
                    left: expr.clone(),
                    right: Box::new(Expr::Literal { value: low.clone() }),
                };
                let high = Expr::Binary {
                    operator: BinaryOp::LtEq,
                    left: expr.clone(),
                    right: Box::new(Expr::Literal { value: high.clone() }),
                };
                narrow(range, &low, alias)?;
                narrow(range, &high, alias)?;
            }
            return Ok(());
        }
        _ => return Ok(()),
    };
    let number = value.as_u64();
    match (field, operator) {
        ("_partition", BinaryOp::Eq) => {
            if let Some(partition) = number.and_then(|n| u32::try_from(n).ok()) {
                range.partition = Some(partition);
            }
        }
        ("_offset", BinaryOp::Eq) => {
            if let Some(offset) = number {
                range.from_offset = Some(range.from_offset.map_or(offset, |from| from.max(offset)));
                range.until_offset = Some(range.until_offset.map_or(offset + 1, |until| until.min(offset + 1)));
            }
        }
        ("_offset", BinaryOp::GtEq | BinaryOp::Gt) => {
            if let Some(offset) = number {
                let offset = if operator == BinaryOp::Gt { offset + 1 } else { offset };
                range.from_offset = Some(range.from_offset.map_or(offset, |from| from.max(offset)));
            }
        }
        ("_offset", BinaryOp::Lt | BinaryOp::LtEq) => {
            if let Some(offset) = number {
                let until = if operator == BinaryOp::LtEq { offset + 1 } else { offset };
                range.until_offset = Some(range.until_offset.map_or(until, |old| old.min(until)));
            }
        }
        ("_time", BinaryOp::GtEq | BinaryOp::Gt | BinaryOp::Eq) => {
            let time = match value {
                Value::String(text) => onehop_engine::units::parse_rfc3339_ms(text).ok(),
                other => other.as_i64(),
            };
            if let Some(time) = time {
                range.from_time = Some(range.from_time.map_or(time, |from| from.max(time)));
            }
        }
        _ => {}
    }
    Ok(())
}

fn describe_access(source: &Source, access: &Access) -> String {
    match access {
        Access::Scan if matches!(source.kind, Kind::Rows(_)) => "every row of its answer".into(),
        Access::Scan => "scan of every row".into(),
        Access::Keys(keys) if matches!(source.kind, Kind::View(_)) => format!("by key, {} key(s)", keys.len()),
        Access::Keys(keys) => format!("by primary key, {} key(s)", keys.len()),
        Access::Index { field, values } => format!("by index on {field}, {} value(s)", values.len()),
        Access::Range(range) => {
            let partitions = range.partition.map_or("every partition".to_string(), |p| format!("partition {p}"));
            let from = match (range.from_offset, range.from_time) {
                (Some(offset), _) => format!("from offset {offset}"),
                (None, Some(time)) => format!("from time {time}"),
                (None, None) => "from the start".to_string(),
            };
            let until = range.until_offset.map_or("to the end".to_string(), |until| format!("to offset {until}"));
            format!("{partitions}, {from} {until}")
        }
    }
}

/// USING (a, b): each column equal in the input joined and in the one before it that has it.
fn using(scope: &[Source], columns: &[ast::ObjectName]) -> Result<Vec<Expr>, SqlError> {
    let (right, left) = scope.split_last().expect("a join has a right input");
    let mut conditions = Vec::with_capacity(columns.len());
    for column in columns {
        let name = crate::parse::simple_name(column)?;
        let declaring: Vec<&Source> = left.iter().filter(|source| source.known.contains(&name)).collect();
        let other = match (declaring.as_slice(), left) {
            ([one], _) => *one,
            ([], [only]) => only,
            _ => return Err(invalid(format!("USING ({name}): say which input it is in with ON"))),
        };
        let path = |alias: &str| Expr::Path { path: vec![Step::Field(alias.to_string()), Step::Field(name.clone())] };
        conditions.push(Expr::Binary {
            operator: BinaryOp::Eq,
            left: Box::new(path(&other.alias)),
            right: Box::new(path(&right.alias)),
        });
    }
    Ok(conditions)
}

fn join_kind(operator: &ast::JoinOperator) -> Result<(JoinKind, Option<&ast::JoinConstraint>), SqlError> {
    use ast::JoinOperator as Op;
    let (kind, constraint) = match operator {
        Op::Join(constraint) | Op::Inner(constraint) => (JoinKind::Inner, constraint),
        Op::Left(constraint) | Op::LeftOuter(constraint) => (JoinKind::Left, constraint),
        Op::CrossJoin(constraint) => (JoinKind::Cross, constraint),
        Op::Right(_) | Op::RightOuter(_) => {
            return Err(unsupported("RIGHT JOIN (write it as a LEFT JOIN with the inputs swapped)"));
        }
        other => return Err(unsupported(format!("the join {other:?}"))),
    };
    match constraint {
        ast::JoinConstraint::None => Ok((kind, None)),
        ast::JoinConstraint::Natural => Err(unsupported("NATURAL JOIN (name the columns with USING)")),
        constraint if kind == JoinKind::Cross => Err(invalid(format!("CROSS JOIN takes no condition: {constraint:?}"))),
        constraint => Ok((kind, Some(constraint))),
    }
}

fn check_select(select: &ast::Select) -> Result<(), SqlError> {
    if crate::view::query::has_dialect_clauses(select) || !select.named_window.is_empty() {
        return Err(unsupported("this SELECT's clauses (TOP, INTO, QUALIFY, WINDOW, …)"));
    }
    Ok(())
}

fn check_wildcard(options: &ast::WildcardAdditionalOptions) -> Result<(), SqlError> {
    let plain = options.opt_ilike.is_none()
        && options.opt_exclude.is_none()
        && options.opt_except.is_none()
        && options.opt_replace.is_none()
        && options.opt_rename.is_none();
    if plain { Ok(()) } else { Err(unsupported("* with EXCLUDE, EXCEPT, REPLACE or RENAME")) }
}

/// Whether any input declares the column `ident`.
fn declared(sources: &[Source], ident: &ast::Ident) -> bool {
    sources.iter().any(|source| source.known.iter().any(|column| column.eq_ignore_ascii_case(&ident.value)))
}

/// An ORDER BY term that names a SELECT item: by position, or by its name (which, as in
/// Postgres, wins over an input column of that name).
fn sort_output(expr: &ast::Expr, items: &[Option<(&ast::Expr, String)>]) -> Result<Option<usize>, SqlError> {
    match expr {
        ast::Expr::Value(value) => match ordinal(&value.value, items.len())? {
            Some(position) if items[..=position].iter().all(Option::is_some) => Ok(Some(position)),
            Some(_) => Err(invalid("ORDER BY a position at or past * : name the column")),
            None => Ok(None),
        },
        ast::Expr::Identifier(ident) => {
            Ok(items.iter().position(|item| item.as_ref().is_some_and(|(_, name)| *name == ident.value)))
        }
        _ => Ok(None),
    }
}

/// A position (1-based) in a list of `len`, when `value` is a number.
fn ordinal(value: &ast::Value, len: usize) -> Result<Option<usize>, SqlError> {
    let ast::Value::Number(text, _) = value else { return Ok(None) };
    match text.parse::<usize>() {
        Ok(position) if (1..=len).contains(&position) => Ok(Some(position - 1)),
        _ => Err(invalid(format!("position {text} is not in the SELECT list (1 to {len})"))),
    }
}

/// Refuses a grouped query's `expr` that reads a column outside GROUP BY and aggregates.
fn check_grouped(expr: &Expr, group: &[Expr], sources: &[Source], place: &str) -> Result<(), SqlError> {
    if group.contains(expr) {
        return Ok(());
    }
    if let Expr::Path { path } = expr
        && let Some(Step::Field(first)) = path.first()
    {
        if first == AGGREGATES {
            return Ok(());
        }
        if sources.iter().any(|source| &source.alias == first) {
            let shown: Vec<String> = path
                .iter()
                .map(|step| match step {
                    Step::Field(field) => field.clone(),
                    Step::Index(index) => index.to_string(),
                })
                .collect();
            return Err(invalid(format!(
                "{place}: the column {} must appear in GROUP BY or be used in an aggregate",
                shown.join(".")
            )));
        }
    }
    for child in children(expr) {
        check_grouped(child, group, sources, place)?;
    }
    Ok(())
}

/// A SELECT item's name when it has no alias, as Postgres names it.
pub(super) fn output_name(expr: &ast::Expr) -> String {
    match expr {
        ast::Expr::Identifier(ident) => ident.value.clone(),
        ast::Expr::CompoundIdentifier(parts) => parts.last().map_or_else(String::new, |part| part.value.clone()),
        ast::Expr::Function(function) => crate::view::expr::function_name(function)
            .map_or_else(|| "?column?".to_string(), |name| name.to_ascii_lowercase()),
        ast::Expr::Cast { expr, .. } | ast::Expr::Nested(expr) => output_name(expr),
        _ => "?column?".to_string(),
    }
}

fn limit(query: &ast::Query) -> Result<Limit, SqlError> {
    let number = |expr: &ast::Expr, what: &str| -> Result<u64, SqlError> {
        match expr {
            ast::Expr::Value(value) => match &value.value {
                ast::Value::Number(text, _) => text.parse::<u64>().ok(),
                _ => None,
            },
            _ => None,
        }
        .ok_or_else(|| invalid(format!("{what} takes a whole number, not {expr}")))
    };
    Ok(match &query.limit_clause {
        None => NO_LIMIT,
        Some(ast::LimitClause::LimitOffset { limit, offset, limit_by }) => {
            if !limit_by.is_empty() {
                return Err(unsupported("LIMIT … BY"));
            }
            let limit = match limit {
                None | Some(ast::Expr::Value(ast::ValueWithSpan { value: ast::Value::Null, .. })) => None,
                Some(expr) => Some(number(expr, "LIMIT")?),
            };
            let offset = offset.as_ref().map(|offset| number(&offset.value, "OFFSET")).transpose()?.unwrap_or(0);
            Limit { limit, offset }
        }
        Some(ast::LimitClause::OffsetCommaLimit { offset, limit }) => {
            Limit { limit: Some(number(limit, "LIMIT")?), offset: number(offset, "OFFSET")? }
        }
    })
}

fn apply_limit<T>(rows: Vec<T>, limit: &Limit) -> Vec<T> {
    let offset = usize::try_from(limit.offset).unwrap_or(usize::MAX);
    let taken = limit.limit.map_or(usize::MAX, |limit| usize::try_from(limit).unwrap_or(usize::MAX));
    rows.into_iter().skip(offset).take(taken).collect()
}

/// A row's SELECT list values and sort keys.
fn project(
    items: &[Item],
    sources: &[Source],
    sort: &[(SortKey, Direction)],
    row: &impl RowLike,
) -> (Vec<Cell>, Vec<Value>) {
    let input = row.input();
    let cells: Vec<Cell> = items
        .iter()
        .map(|item| match item {
            Item::Expr { expr, .. } => Cell::Value(expr.eval(&input)),
            Item::Star(index) => Cell::Star(row.part(&sources[*index].alias)),
        })
        .collect();
    let keys = sort
        .iter()
        .map(|(key, _)| match key {
            SortKey::Output(position) => match &cells[*position] {
                Cell::Value(value) => value.clone(),
                Cell::Star(..) => Value::Null,
            },
            SortKey::Expr(expr) => expr.eval(&input),
        })
        .collect();
    (cells, keys)
}

fn cells_bytes((cells, keys): &(Vec<Cell>, Vec<Value>)) -> u64 {
    let cells: u64 = cells
        .iter()
        .map(|cell| match cell {
            Cell::Value(value) | Cell::Star(value) => estimate(value),
        })
        .sum();
    cells + keys.iter().map(estimate).sum::<u64>()
}

fn cells_key(cells: &[Cell]) -> String {
    let values: Vec<Value> = cells
        .iter()
        .map(|cell| match cell {
            Cell::Value(value) | Cell::Star(value) => value.clone(),
        })
        .collect();
    row_key(&values)
}

/// One column of an answer: its name, the SELECT item it comes from, and for `*` the field.
struct OutColumn {
    name: String,
    item: usize,
    field: Option<String>,
}

/// The answer's columns: each item's name, each `*` spread into its input's known columns
/// and then the fields its rows hold beyond them (in the order first seen).
fn columns_of(items: &[Item], sources: &[Source], rows: &[Vec<Cell>]) -> Vec<OutColumn> {
    let mut columns = Vec::new();
    for (position, item) in items.iter().enumerate() {
        match item {
            Item::Expr { name, .. } => columns.push(OutColumn { name: name.clone(), item: position, field: None }),
            Item::Star(index) => {
                let source = &sources[*index];
                let mut fields: Vec<String> = source.known.clone();
                if source.open {
                    for row in rows {
                        if let Some(Cell::Star(Value::Object(row_fields))) = row.get(position) {
                            for field in row_fields.keys() {
                                if !field.starts_with(HIDDEN) && !fields.contains(field) {
                                    fields.push(field.clone());
                                }
                            }
                        }
                    }
                }
                columns.extend(fields.into_iter().map(|field| OutColumn {
                    name: field.clone(),
                    item: position,
                    field: Some(field),
                }));
            }
        }
    }
    columns
}

/// A row's cells as the answer's values, each `*` spread over its columns.
fn spread(cells: &[Cell], columns: &[OutColumn]) -> Vec<Value> {
    columns
        .iter()
        .map(|column| match (&cells[column.item], &column.field) {
            (Cell::Value(value), _) => value.clone(),
            (Cell::Star(row), Some(field)) => row.get(field).cloned().unwrap_or(Value::Null),
            (Cell::Star(..), None) => Value::Null,
        })
        .collect()
}

/// An answer's rows under WITH's or an alias's column names.
fn rename(answer: &mut Answer, alias: &ast::TableAlias, name: &str) -> Result<(), SqlError> {
    if alias.columns.is_empty() {
        return Ok(());
    }
    if alias.columns.len() > answer.columns.len() {
        return Err(invalid(format!(
            "{name} has {} columns, but {} names are given",
            answer.columns.len(),
            alias.columns.len()
        )));
    }
    for (column, named) in answer.columns.iter_mut().zip(&alias.columns) {
        *column = named.name.value.clone();
    }
    Ok(())
}

/// An input of computed rows (a CTE's, the catalog's, a function's), under `alias`'s column
/// names if it gives them.
fn answer_source(
    name: String,
    label: String,
    answer: Arc<Answer>,
    alias: Option<&ast::TableAlias>,
) -> Result<Source, SqlError> {
    let mut source = Source {
        alias: name,
        label,
        known: answer.columns.clone(),
        open: false,
        kind: Kind::Rows(answer),
        merged: Vec::new(),
    };
    if let Some(alias) = alias {
        rename_source(&mut source, alias)?;
    }
    Ok(source)
}

fn rename_source(source: &mut Source, alias: &ast::TableAlias) -> Result<(), SqlError> {
    if alias.columns.is_empty() {
        return Ok(());
    }
    let Kind::Rows(answer) = &source.kind else {
        return Err(unsupported("column aliases on a table, view or stream (alias the columns in SELECT)"));
    };
    let mut answer = (**answer).clone();
    rename(&mut answer, alias, &source.alias)?;
    source.known = answer.columns.clone();
    source.kind = Kind::Rows(Arc::new(answer));
    Ok(())
}

/// UNION, INTERSECT and EXCEPT, with ALL or as sets.
fn set_operation(
    left: Answer,
    op: ast::SetOperator,
    quantifier: ast::SetQuantifier,
    right: Answer,
) -> Result<Answer, SqlError> {
    if left.columns.len() != right.columns.len() {
        return Err(invalid(format!(
            "each {op} query must have the same number of columns: {} and {}",
            left.columns.len(),
            right.columns.len()
        )));
    }
    let all = match quantifier {
        ast::SetQuantifier::All => true,
        ast::SetQuantifier::Distinct | ast::SetQuantifier::None => false,
        other => return Err(unsupported(format!("{op} {other}"))),
    };
    let Answer { columns, rows: left_rows } = left;
    let rows = match op {
        ast::SetOperator::Union => {
            let mut rows = left_rows;
            rows.extend(right.rows);
            if !all {
                let mut seen = std::collections::HashSet::new();
                rows.retain(|row| seen.insert(row_key(row)));
            }
            rows
        }
        ast::SetOperator::Intersect | ast::SetOperator::Except | ast::SetOperator::Minus => {
            let mut counts: HashMap<String, usize> = HashMap::new();
            for row in &right.rows {
                *counts.entry(row_key(row)).or_default() += 1;
            }
            let intersect = op == ast::SetOperator::Intersect;
            let mut emitted = std::collections::HashSet::new();
            let mut rows = Vec::new();
            for row in left_rows {
                let key = row_key(&row);
                let count = counts.get(&key).copied().unwrap_or(0);
                let keep = if all {
                    let keep = if intersect { count > 0 } else { count == 0 };
                    if count > 0 {
                        counts.insert(key.clone(), count - 1);
                    }
                    keep
                } else {
                    (if intersect { count > 0 } else { count == 0 }) && emitted.insert(key)
                };
                if keep {
                    rows.push(row);
                }
            }
            rows
        }
    };
    Ok(Answer { columns, rows })
}
