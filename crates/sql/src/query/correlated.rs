//! Correlated subqueries: a `(SELECT …)`, `EXISTS (SELECT …)` or `x IN (SELECT …)` that reads
//! columns of the query around it (`WHERE r.product_id = p.id`).
//!
//! Such a subquery is run per row of the outer query, with the outer columns it reads put in
//! as literals; its answers are kept per distinct set of those values, so a thousand orders of
//! ten customers run it ten times. The outer columns it reads fix where in the join it can be
//! answered: at the input joined last among them (its anchor), where its value is put into
//! that input's row under a hidden name (`\u{3}n`), so WHERE, ON, GROUP BY, HAVING and the
//! SELECT list read it like a column and conditions on it are checked as soon as it is known.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use onehop_engine::view::Expr;
use onehop_engine::view::expr::Input;
use onehop_engine::{Engine, Principal};
use serde_json::{Map, Value};
use sqlparser::ast::{self, VisitMut, VisitorMut};

use super::budget::{Cancel, QueryLimits};
use super::catalog::Catalog;
use super::order::row_key;
use super::select::{Context, Joined, RowLike};
use super::source::Overlay;
use super::{Answer, source::Source};
use crate::SqlError;

/// The hidden fields correlated values are kept under start with this.
pub(super) const HIDDEN: char = '\u{3}';

/// Answers kept per subquery before the cache starts again.
const CACHED_MAX: usize = 10_000;

/// What a correlated subquery stands for.
pub(super) enum Shape {
    /// `(SELECT x …)`: its one value (null for no row; more than one is an error).
    Scalar,
    /// `[NOT] EXISTS (SELECT …)`.
    Exists { negated: bool },
    /// `tested [NOT] IN (SELECT x …)`.
    In { tested: Expr, negated: bool },
}

/// One correlated subquery of a SELECT.
pub(super) struct Correlated {
    /// The input of the outer query at which it is answered.
    pub anchor: usize,
    /// The hidden field of the anchor's row its value is put under.
    pub field: String,
    /// The outer values it reads, in the order of its `$outerN` placeholders.
    pub outer: Vec<Expr>,
    pub query: ast::Query,
    pub shape: Shape,
    cache: HashMap<String, Arc<Answer>>,
}

/// The placeholder an outer column becomes inside the subquery.
fn outer_placeholder(index: usize) -> ast::Expr {
    ast::Expr::Value(ast::Value::Placeholder(format!("$outer{index}")).into())
}

/// The relations a query names in its FROM clauses, at any depth (their aliases, or their
/// names): a qualified column of one of them is the subquery's own.
fn own_relations(query: &mut ast::Query) -> Vec<String> {
    struct Names(Vec<String>);
    impl VisitorMut for Names {
        type Break = ();
        fn pre_visit_table_factor(&mut self, factor: &mut ast::TableFactor) -> ControlFlow<()> {
            match factor {
                ast::TableFactor::Table { name, alias, .. } => match alias {
                    Some(alias) => self.0.push(alias.name.value.to_ascii_lowercase()),
                    None => {
                        if let Some(last) = name.0.last().and_then(|part| part.as_ident()) {
                            self.0.push(last.value.to_ascii_lowercase());
                        }
                    }
                },
                ast::TableFactor::Derived { alias: Some(alias), .. } => {
                    self.0.push(alias.name.value.to_ascii_lowercase())
                }
                _ => {}
            }
            ControlFlow::Continue(())
        }
    }
    let mut names = Names(Vec::new());
    let _ = query.visit(&mut names);
    names.0
}

/// The outer columns `query` reads, each replaced by a placeholder: (the column as written
/// outside, the input of `scope` it belongs to). Empty: the subquery is not correlated.
pub(super) fn outer_references(query: &mut ast::Query, scope: &[Source]) -> Vec<(Vec<ast::Ident>, usize)> {
    let own = own_relations(query);
    let mut found: Vec<(Vec<ast::Ident>, usize)> = Vec::new();
    let _ = ast::visit_expressions_mut(query, |expr: &mut ast::Expr| {
        if let ast::Expr::CompoundIdentifier(parts) = expr {
            let relative = super::catalog::without_schema(parts);
            if let [relation, _] = relative
                && !own.contains(&relation.value.to_ascii_lowercase())
                && let Some(input) = super::resolve::alias(scope, relation)
            {
                let written = relative.to_vec();
                let index = match found.iter().position(|(other, _)| *other == written) {
                    Some(index) => index,
                    None => {
                        found.push((written, input));
                        found.len() - 1
                    }
                };
                *expr = outer_placeholder(index);
            }
        }
        ControlFlow::<()>::Continue(())
    });
    found
}

impl Correlated {
    pub(super) fn new(anchor: usize, field: String, outer: Vec<Expr>, query: ast::Query, shape: Shape) -> Self {
        Correlated { anchor, field, outer, query, shape, cache: HashMap::new() }
    }
}

fn literal(value: &Value) -> ast::Value {
    match value {
        Value::Null => ast::Value::Null,
        Value::Bool(truth) => ast::Value::Boolean(*truth),
        Value::Number(number) => ast::Value::Number(number.to_string(), false),
        Value::String(text) => ast::Value::SingleQuotedString(text.clone()),
        other => ast::Value::SingleQuotedString(other.to_string()),
    }
}

/// What answers the correlated subqueries of one SELECT, row by row.
pub(super) struct Correlator<'a> {
    pub engine: &'a Engine,
    pub principal: Option<&'a Principal>,
    pub limits: QueryLimits,
    pub cancel: Option<Cancel>,
    pub overlay: Option<Arc<Overlay>>,
    pub catalog: Option<Arc<Catalog>>,
    pub entries: Vec<Correlated>,
}

impl Correlator<'_> {
    /// Puts the value of every subquery anchored at input `level` into that input's row in
    /// `row` (which holds the inputs up to it).
    pub(super) fn fill(&mut self, level: usize, row: &mut Joined) -> Result<(), SqlError> {
        for index in 0..self.entries.len() {
            if self.entries[index].anchor != level {
                continue;
            }
            let value = self.value(index, &row.input())?;
            let Some(part) = row.parts.get_mut(level) else { continue };
            // An unmatched LEFT JOIN's input: its columns stay null beside the value. A row
            // shared with its table is copied before the value is put in.
            let doc = part.row.get_or_insert_with(|| Arc::new(Map::new()));
            Arc::make_mut(doc).insert(self.entries[index].field.clone(), value);
        }
        Ok(())
    }

    fn value(&mut self, index: usize, input: &Input) -> Result<Value, SqlError> {
        let values: Vec<Value> = self.entries[index].outer.iter().map(|expr| expr.eval(input)).collect();
        let key = row_key(&values);
        let answer = match self.entries[index].cache.get(&key) {
            Some(answer) => answer.clone(),
            None => {
                let mut query = self.entries[index].query.clone();
                let _ = ast::visit_expressions_mut(&mut query, |expr: &mut ast::Expr| {
                    if let ast::Expr::Value(value) = expr
                        && let ast::Value::Placeholder(name) = &value.value
                        && let Some(n) = name.strip_prefix("$outer").and_then(|n| n.parse::<usize>().ok())
                        && let Some(outer) = values.get(n)
                    {
                        value.value = literal(outer);
                    }
                    ControlFlow::<()>::Continue(())
                });
                let mut context = Context::new(self.engine, self.principal, &self.limits);
                context.cancel_with(self.cancel.clone());
                context.read_through(self.overlay.clone());
                context.preset_catalog(self.catalog.clone());
                let answer = Arc::new(context.query(&query)?);
                let cache = &mut self.entries[index].cache;
                if cache.len() >= CACHED_MAX {
                    cache.clear();
                }
                cache.insert(key, answer.clone());
                answer
            }
        };
        let entry = &self.entries[index];
        let subquery = &entry.query;
        Ok(match &entry.shape {
            Shape::Scalar => match (answer.columns.len(), answer.rows.as_slice()) {
                (1, []) => Value::Null,
                (1, [only]) => only[0].clone(),
                (1, _) => {
                    return Err(SqlError::InvalidQuery(format!(
                        "more than one row returned by a subquery used as an expression: ({subquery})"
                    )));
                }
                (n, _) => {
                    return Err(SqlError::InvalidQuery(format!(
                        "a subquery used as an expression returns one column, not {n}: ({subquery})"
                    )));
                }
            },
            Shape::Exists { negated } => Value::Bool(answer.rows.is_empty() == *negated),
            Shape::In { .. } if answer.columns.len() != 1 => {
                return Err(SqlError::InvalidQuery(format!(
                    "IN (SELECT …) takes a subquery of one column, not {}: ({subquery})",
                    answer.columns.len()
                )));
            }
            Shape::In { tested, negated } => {
                let tested = tested.eval(input);
                if tested.is_null() {
                    Value::Null
                } else {
                    let mut found = false;
                    let mut unknown = false;
                    for row in &answer.rows {
                        match onehop_engine::view::expr::equals(&tested, &row[0]) {
                            Some(true) => {
                                found = true;
                                break;
                            }
                            None => unknown = true,
                            Some(false) => {}
                        }
                    }
                    match (found, unknown) {
                        (true, _) => Value::Bool(!negated),
                        (false, true) => Value::Null,
                        (false, false) => Value::Bool(*negated),
                    }
                }
            }
        })
    }
}
