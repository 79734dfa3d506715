//! Names to places: a query's SQL expressions to the engine's [`Expr`] over the query's row.
//!
//! A row is one JSON object with each input's row under the input's alias, so the column `x`
//! of the input `o` is the path `o.x`. An unqualified name is the column of the one input that
//! declares it (a table's columns, a view's, a subquery's; a stream's `_` fields); a name no
//! input declares belongs to the one input whose rows may hold undeclared fields, and is
//! refused as ambiguous when several may. An aggregate becomes a reference to its value
//! (computed per group, under [`AGGREGATES`]); an uncorrelated subquery is run first and
//! becomes its answer.

use std::ops::ControlFlow;

use onehop_engine::view::Expr;
use onehop_engine::view::expr::Step;
use serde_json::Value;
use sqlparser::ast::{self, VisitMut, VisitorMut};

use super::aggregate::{Aggregate, Kind, NAMES};
use super::correlated::{Shape, outer_references};
use super::order::Direction;
use super::select::Context;
use super::source::Source;
use crate::SqlError;
use crate::view::expr::{convert_expr, function_name};

/// The field of a grouped row that holds its aggregates' values, by position.
pub(super) const AGGREGATES: &str = "\u{1}";
/// The field subquery answers are put under while an expression is converted.
const ANSWERS: &str = "\u{2}";

/// What aggregates may do where an expression is: be collected, or be refused (and where).
pub(super) enum Aggregates<'v> {
    Refused(&'static str),
    Collect(&'v mut Vec<Aggregate>),
}

fn invalid(message: impl Into<String>) -> SqlError {
    SqlError::InvalidQuery(message.into())
}

/// `expr` over the inputs `scope`, as the engine evaluates it against the query's row.
pub(super) fn resolve(
    context: &mut Context,
    scope: &[Source],
    expr: &ast::Expr,
    aggregates: &mut Aggregates,
) -> Result<Expr, SqlError> {
    let mut rewritten = expr.clone();
    let mut answers = Vec::new();
    let mut rewriter = Rewriter { context, scope, aggregates, answers: &mut answers };
    if let ControlFlow::Break(error) = rewritten.visit(&mut rewriter) {
        return Err(error);
    }
    let mut converted = convert_expr(&rewritten)?;
    substitute(&mut converted, &answers);
    Ok(converted)
}

struct Rewriter<'r, 'a, 'v> {
    context: &'r mut Context<'a>,
    scope: &'r [Source],
    aggregates: &'r mut Aggregates<'v>,
    answers: &'r mut Vec<Value>,
}

impl VisitorMut for Rewriter<'_, '_, '_> {
    type Break = SqlError;

    fn pre_visit_expr(&mut self, expr: &mut ast::Expr) -> ControlFlow<SqlError> {
        match self.rewrite(expr) {
            Ok(()) => ControlFlow::Continue(()),
            Err(error) => ControlFlow::Break(error),
        }
    }

    fn pre_visit_query(&mut self, query: &mut ast::Query) -> ControlFlow<SqlError> {
        // Subqueries are replaced by their answers before the walk reaches them; one that is
        // not is somewhere a subquery cannot be.
        ControlFlow::Break(invalid(format!("a subquery is not allowed here: ({query})")))
    }
}

impl Rewriter<'_, '_, '_> {
    fn rewrite(&mut self, expr: &mut ast::Expr) -> Result<(), SqlError> {
        let session = super::catalog::Session { user: self.context.user() };
        let context = &mut *self.context;
        if super::catalog::rewrite(expr, &session, &mut || context.catalog())? {
            // What it became may itself need resolving (a column under a COLLATE).
            return self.rewrite(expr);
        }
        match expr {
            // A quoted literal compared with a numeric column is a number, as Postgres types
            // an untyped literal by the column it meets (`WHERE c.oid = '16391'`).
            ast::Expr::BinaryOp { left, op, right } if is_comparison(op) => {
                if self.numeric_column(left) {
                    number_literal(right);
                } else if self.numeric_column(right) {
                    number_literal(left);
                }
            }
            ast::Expr::InList { expr: tested, list, .. } if self.numeric_column(tested) => {
                list.iter_mut().for_each(number_literal);
            }
            _ => {}
        }
        match expr {
            ast::Expr::Identifier(ident) => {
                *expr = self.column(std::slice::from_ref(ident))?;
            }
            ast::Expr::CompoundIdentifier(parts) => {
                if parts.first().is_some_and(|first| first.value == AGGREGATES || first.value == ANSWERS) {
                    return Ok(());
                }
                *expr = self.column(parts)?;
            }
            ast::Expr::Function(function) if function.over.is_none() => {
                let Some(kind) = function_name(function).as_deref().and_then(Kind::from_name) else { return Ok(()) };
                let aggregate = self.aggregate(kind, function)?;
                let Aggregates::Collect(collected) = &mut self.aggregates else {
                    let Aggregates::Refused(place) = self.aggregates else { unreachable!() };
                    return Err(invalid(format!("aggregates are not allowed in {place}: {function}")));
                };
                collected.push(aggregate);
                *expr = placeholder(AGGREGATES, collected.len() - 1);
            }
            ast::Expr::Subquery(query) => {
                if let Some(value) = self.correlated(query, |_| Ok(Shape::Scalar))? {
                    *expr = value;
                    return Ok(());
                }
                let answer = self.context.query(query)?;
                let value = match (answer.columns.len(), answer.rows.as_slice()) {
                    (1, []) => Value::Null,
                    (1, [row]) => row[0].clone(),
                    (1, _) => {
                        return Err(invalid(format!(
                            "more than one row returned by a subquery used as an expression: ({query})"
                        )));
                    }
                    (n, _) => {
                        return Err(invalid(format!(
                            "a subquery used as an expression returns one column, not {n}: ({query})"
                        )));
                    }
                };
                *expr = self.answer(value);
            }
            ast::Expr::InSubquery { expr: tested, subquery, negated } => {
                let shape = |rewriter: &mut Self| -> Result<Shape, SqlError> {
                    let tested = resolve(rewriter.context, rewriter.scope, tested, &mut Aggregates::Refused("IN"))?;
                    Ok(Shape::In { tested, negated: *negated })
                };
                if let Some(value) = self.correlated(subquery, shape)? {
                    *expr = value;
                    return Ok(());
                }
                let answer = self.context.query(subquery)?;
                if answer.columns.len() != 1 {
                    return Err(invalid(format!(
                        "IN (SELECT …) takes a subquery of one column, not {}: ({subquery})",
                        answer.columns.len()
                    )));
                }
                let list = answer.rows.into_iter().map(|mut row| self.answer(row.swap_remove(0))).collect();
                *expr = ast::Expr::InList { expr: tested.clone(), list, negated: *negated };
            }
            ast::Expr::Exists { subquery, negated } => {
                let negated = *negated;
                if let Some(value) = self.correlated(subquery, |_| Ok(Shape::Exists { negated }))? {
                    *expr = value;
                    return Ok(());
                }
                let answer = self.context.query(subquery)?;
                let exists = answer.rows.is_empty() == negated;
                *expr = self.answer(Value::Bool(exists));
            }
            _ => {}
        }
        Ok(())
    }

    /// Whether `expr` is a column whose values are numbers: a table's declared integer or
    /// float column, or a column of a computed input (the catalog's, a subquery's) whose
    /// first row holds a number there.
    fn numeric_column(&self, expr: &ast::Expr) -> bool {
        let found = match expr {
            ast::Expr::Identifier(ident) => column_of(self.scope, ident).ok(),
            ast::Expr::CompoundIdentifier(parts) => match super::catalog::without_schema(parts) {
                [relation, column] => alias(self.scope, relation).map(|index| (index, column.value.clone())),
                _ => None,
            },
            _ => None,
        };
        let Some((index, column)) = found else { return false };
        let source = &self.scope[index];
        match &source.kind {
            super::source::Kind::Table(table, _) => table.def().columns.iter().any(|declared| {
                declared.name == column
                    && matches!(declared.ty, onehop_engine::ColumnType::Integer | onehop_engine::ColumnType::Float)
            }),
            super::source::Kind::Rows(answer) => {
                let position = answer.columns.iter().position(|name| *name == column);
                position.is_some_and(|position| {
                    answer.rows.first().and_then(|row| row.get(position)).is_some_and(Value::is_number)
                })
            }
            _ => false,
        }
    }

    /// A correlated subquery (one that reads columns of the inputs in scope), kept to be run
    /// per row, and the column that stands for its value; `None` when `query` reads none.
    fn correlated(
        &mut self,
        query: &ast::Query,
        shape: impl FnOnce(&mut Self) -> Result<Shape, SqlError>,
    ) -> Result<Option<ast::Expr>, SqlError> {
        let mut query = query.clone();
        let references = outer_references(&mut query, self.scope);
        if references.is_empty() {
            return Ok(None);
        }
        let mut outer = Vec::with_capacity(references.len());
        let mut anchor = 0;
        for (written, input) in references {
            anchor = anchor.max(input);
            let column = ast::Expr::CompoundIdentifier(written);
            outer.push(resolve(self.context, self.scope, &column, &mut Aggregates::Refused("a correlated subquery"))?);
        }
        let shape = shape(self)?;
        let field = self.context.correlate(anchor, outer, query, shape);
        Ok(Some(ast::Expr::CompoundIdentifier(vec![quoted(&self.scope[anchor].alias), quoted(&field)])))
    }

    /// A subquery's answer, put aside and referred to until the expression is converted.
    fn answer(&mut self, value: Value) -> ast::Expr {
        self.answers.push(value);
        placeholder(ANSWERS, self.answers.len() - 1)
    }

    /// `name` or `alias.name[.field…]`: the path into the query's row.
    fn column(&self, parts: &[ast::Ident]) -> Result<ast::Expr, SqlError> {
        // `schema.relation.column`: the schema adds nothing once the relation is an input.
        let relative = super::catalog::without_schema(parts);
        let parts =
            if relative.len() < parts.len() && alias(self.scope, &relative[0]).is_some() { relative } else { parts };
        let (first, rest) = parts.split_first().expect("a name has a part");
        if !rest.is_empty()
            && let Some(source) = alias(self.scope, first)
        {
            let mut path = vec![quoted(&self.scope[source].alias)];
            path.extend(rest.iter().cloned());
            return Ok(ast::Expr::CompoundIdentifier(path));
        }
        let (source, column) = column_of(self.scope, first)?;
        let mut path = vec![quoted(&self.scope[source].alias), quoted(&column)];
        path.extend(rest.iter().cloned());
        Ok(ast::Expr::CompoundIdentifier(path))
    }

    fn aggregate(&mut self, kind: Kind, function: &ast::Function) -> Result<Aggregate, SqlError> {
        let name = function.name.to_string().to_ascii_uppercase();
        if !function.within_group.is_empty() || function.null_treatment.is_some() {
            return Err(invalid(format!("{name}: WITHIN GROUP and IGNORE NULLS are not supported")));
        }
        let (args, distinct, clauses) = match &function.args {
            ast::FunctionArguments::List(list) => (
                list.args.as_slice(),
                matches!(list.duplicate_treatment, Some(ast::DuplicateTreatment::Distinct)),
                list.clauses.as_slice(),
            ),
            ast::FunctionArguments::None => (&[][..], false, &[][..]),
            ast::FunctionArguments::Subquery(_) => return Err(invalid(format!("{name} takes expressions"))),
        };
        let mut inner = Aggregates::Refused("an aggregate's argument");
        let mut exprs = Vec::with_capacity(args.len());
        for arg in args {
            match arg {
                ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard) if kind == Kind::Count && args.len() == 1 => {
                }
                ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(arg)) => {
                    exprs.push(resolve(self.context, self.scope, arg, &mut inner)?);
                }
                other => return Err(invalid(format!("{name}({other}) is not supported; aggregates are {NAMES}"))),
            }
        }
        let wanted = match kind {
            Kind::Count => 0..=1,
            Kind::StringAgg => 2..=2,
            _ => 1..=1,
        };
        if !wanted.contains(&exprs.len()) {
            return Err(invalid(format!("{name} takes {} argument(s), not {}", wanted.end(), exprs.len())));
        }
        let mut order = Vec::new();
        for clause in clauses {
            let ast::FunctionArgumentClause::OrderBy(terms) = clause else {
                return Err(invalid(format!("{name}: {clause} is not supported")));
            };
            for term in terms {
                let expr = resolve(self.context, self.scope, &term.expr, &mut inner)?;
                order.push((expr, direction(&term.options)));
            }
        }
        let filter = match &function.filter {
            Some(filter) => Some(resolve(self.context, self.scope, filter, &mut Aggregates::Refused("FILTER"))?),
            None => None,
        };
        let mut exprs = exprs.into_iter();
        Ok(Aggregate { kind, arg: exprs.next(), separator: exprs.next(), distinct, filter, order })
    }
}

/// An ORDER BY term's direction, as Postgres defaults it: nulls last ascending, first
/// descending.
pub(super) fn direction(options: &ast::OrderByOptions) -> Direction {
    let descending = matches!(options.sort, Some(ast::OrderBySort::Desc));
    Direction { descending, nulls_first: options.nulls_first.unwrap_or(descending) }
}

fn quoted(name: &str) -> ast::Ident {
    ast::Ident::with_quote('"', name)
}

fn placeholder(field: &str, index: usize) -> ast::Expr {
    ast::Expr::CompoundIdentifier(vec![quoted(field), quoted(&index.to_string())])
}

fn is_comparison(op: &ast::BinaryOperator) -> bool {
    use ast::BinaryOperator::*;
    matches!(op, Eq | NotEq | Lt | LtEq | Gt | GtEq)
}

/// A quoted literal that spells a number, as that number.
fn number_literal(expr: &mut ast::Expr) {
    if let ast::Expr::Value(value) = expr
        && let ast::Value::SingleQuotedString(text) = &value.value
        && text.trim().parse::<f64>().is_ok_and(f64::is_finite)
    {
        value.value = ast::Value::Number(text.trim().to_string(), false);
    }
}

/// The input `ident` names as an alias.
pub(super) fn alias(scope: &[Source], ident: &ast::Ident) -> Option<usize> {
    scope.iter().position(|source| source.alias == ident.value).or_else(|| {
        if ident.quote_style.is_some() {
            return None;
        }
        scope.iter().position(|source| source.alias.eq_ignore_ascii_case(&ident.value))
    })
}

/// The input an unqualified column belongs to, and the column's name as that input spells it.
fn column_of(scope: &[Source], ident: &ast::Ident) -> Result<(usize, String), SqlError> {
    let name = &ident.value;
    let declaring = |exact: bool| -> Vec<(usize, String)> {
        scope
            .iter()
            .enumerate()
            .filter(|(_, source)| !source.merged.iter().any(|merged| merged.eq_ignore_ascii_case(name)))
            .filter_map(|(index, source)| {
                let found = source
                    .known
                    .iter()
                    .find(|column| if exact { *column == name } else { column.eq_ignore_ascii_case(name) })?;
                Some((index, found.clone()))
            })
            .collect()
    };
    let mut found = declaring(true);
    if found.is_empty() && ident.quote_style.is_none() {
        found = declaring(false);
    }
    match found.len() {
        1 => return Ok(found.swap_remove(0)),
        0 => {}
        _ => {
            let options: Vec<String> =
                found.iter().map(|(index, column)| format!("{}.{column}", scope[*index].alias)).collect();
            return Err(invalid(format!("the column {name} is ambiguous: write {}", options.join(" or "))));
        }
    }
    if scope.is_empty() {
        return Err(invalid(format!("the column {name} does not exist: the query has no FROM")));
    }
    let open: Vec<usize> = (0..scope.len()).filter(|index| scope[*index].open).collect();
    match open.as_slice() {
        [index] => Ok((*index, name.clone())),
        [] => {
            let columns: Vec<String> = scope
                .iter()
                .flat_map(|source| source.known.iter().map(move |column| format!("{}.{column}", source.alias)))
                .collect();
            Err(invalid(format!("the column {name} does not exist; the columns are {}", columns.join(", "))))
        }
        several => {
            let options: Vec<String> = several.iter().map(|index| format!("{}.{name}", scope[*index].alias)).collect();
            Err(invalid(format!(
                "no input declares the column {name}, and several may hold it: write {}",
                options.join(" or ")
            )))
        }
    }
}

/// Puts each subquery's answer in place of its placeholder.
fn substitute(expr: &mut Expr, answers: &[Value]) {
    if let Expr::Path { path } = expr
        && let [Step::Field(first), Step::Field(index)] = path.as_slice()
        && first == ANSWERS
        && let Some(value) = index.parse::<usize>().ok().and_then(|index| answers.get(index))
    {
        *expr = Expr::Literal { value: value.clone() };
        return;
    }
    for child in children_mut(expr) {
        substitute(child, answers);
    }
}

/// The expressions directly inside `expr`.
pub(super) fn children(expr: &Expr) -> Vec<&Expr> {
    match expr {
        Expr::Literal { .. } | Expr::Record { .. } | Expr::Path { .. } => Vec::new(),
        Expr::Get { base, .. } => vec![base],
        Expr::Unary { expr, .. } | Expr::Is { expr, .. } | Expr::Cast { expr, .. } => vec![expr],
        Expr::Binary { left, right, .. } => vec![left, right],
        Expr::In { expr, list, .. } => std::iter::once(&**expr).chain(list.iter()).collect(),
        Expr::Like { expr, pattern, .. } => vec![expr, pattern],
        Expr::Between { expr, low, high, .. } => vec![expr, low, high],
        Expr::Case { operand, branches, otherwise } => operand
            .iter()
            .map(|operand| &**operand)
            .chain(branches.iter().flat_map(|branch| [&branch.when, &branch.then]))
            .chain(otherwise.iter().map(|otherwise| &**otherwise))
            .collect(),
        Expr::Call { args, .. } => args.iter().collect(),
    }
}

fn children_mut(expr: &mut Expr) -> Vec<&mut Expr> {
    match expr {
        Expr::Literal { .. } | Expr::Record { .. } | Expr::Path { .. } => Vec::new(),
        Expr::Get { base, .. } => vec![base],
        Expr::Unary { expr, .. } | Expr::Is { expr, .. } | Expr::Cast { expr, .. } => vec![expr],
        Expr::Binary { left, right, .. } => vec![left, right],
        Expr::In { expr, list, .. } => std::iter::once(&mut **expr).chain(list.iter_mut()).collect(),
        Expr::Like { expr, pattern, .. } => vec![expr, pattern],
        Expr::Between { expr, low, high, .. } => vec![expr, low, high],
        Expr::Case { operand, branches, otherwise } => operand
            .iter_mut()
            .map(|operand| &mut **operand)
            .chain(branches.iter_mut().flat_map(|branch| [&mut branch.when, &mut branch.then]))
            .chain(otherwise.iter_mut().map(|otherwise| &mut **otherwise))
            .collect(),
        Expr::Call { args, .. } => args.iter_mut().collect(),
    }
}

/// The inputs (by position in `scope`) `expr` reads.
pub(super) fn inputs_of(expr: &Expr, scope: &[Source]) -> Vec<usize> {
    let mut found = Vec::new();
    collect_inputs(expr, scope, &mut found);
    found.sort_unstable();
    found.dedup();
    found
}

fn collect_inputs(expr: &Expr, scope: &[Source], found: &mut Vec<usize>) {
    if let Expr::Path { path } = expr
        && let Some(Step::Field(first)) = path.first()
        && let Some(index) = scope.iter().position(|source| &source.alias == first)
    {
        found.push(index);
    }
    for child in children(expr) {
        collect_inputs(child, scope, found);
    }
}

/// `expr`'s `AND`ed parts.
pub(super) fn conjuncts(expr: Expr) -> Vec<Expr> {
    match expr {
        Expr::Binary { operator: onehop_engine::view::expr::BinaryOp::And, left, right } => {
            let mut parts = conjuncts(*left);
            parts.extend(conjuncts(*right));
            parts
        }
        other => vec![other],
    }
}

/// The column `alias.field` `expr` is, when it is one.
pub(super) fn column_path<'e>(expr: &'e Expr, alias: &str) -> Option<&'e str> {
    match expr {
        Expr::Path { path } => match path.as_slice() {
            [Step::Field(first), Step::Field(field)] if first == alias => Some(field),
            _ => None,
        },
        _ => None,
    }
}
