//! The query of a view or a transform: one plain `SELECT … FROM source [WHERE …] [GROUP BY …]`.
//! Everything else SELECT can say (joins, subqueries, ORDER BY, LIMIT, DISTINCT, HAVING, …) is
//! refused here, with the shape of what is supported.

use sqlparser::ast;

use super::unsupported;
use crate::SqlError;

/// A query that is one plain `SELECT … FROM … [WHERE …] [GROUP BY …]`.
pub(super) fn plain_select<'q>(query: &'q ast::Query, shape: &str) -> Result<&'q ast::Select, SqlError> {
    plain_query(query, shape)?;
    match query.body.as_ref() {
        ast::SetExpr::Select(select) => plain_body(select, shape),
        other => refuse_body(other, shape),
    }
}

/// The `SELECT`s of a query that is plain `SELECT`s joined by `UNION ALL`, in order.
pub(super) fn union_all_selects<'q>(query: &'q ast::Query, shape: &str) -> Result<Vec<&'q ast::Select>, SqlError> {
    plain_query(query, shape)?;
    let mut selects = Vec::new();
    collect_union_all(&query.body, shape, &mut selects)?;
    Ok(selects)
}

fn collect_union_all<'q>(body: &'q ast::SetExpr, shape: &str, into: &mut Vec<&'q ast::Select>) -> Result<(), SqlError> {
    match body {
        ast::SetExpr::Select(select) => into.push(plain_body(select, shape)?),
        ast::SetExpr::SetOperation { op: ast::SetOperator::Union, set_quantifier, left, right }
            if *set_quantifier == ast::SetQuantifier::All =>
        {
            collect_union_all(left, shape, into)?;
            collect_union_all(right, shape, into)?;
        }
        ast::SetExpr::SetOperation { op: ast::SetOperator::Union, .. } => {
            return Err(unsupported(
                "UNION without ALL (it removes duplicates)",
                "a stream keeps every record: merge streams with UNION ALL",
            ));
        }
        other => return refuse_body(other, shape),
    }
    Ok(())
}

/// Refuses the clauses around a query's body: WITH, ORDER BY, LIMIT and other dialects'.
fn plain_query(query: &ast::Query, shape: &str) -> Result<(), SqlError> {
    let refuse = |what: &str| Err(unsupported(what, shape));
    if query.with.is_some() {
        return refuse("WITH (a common table expression)");
    }
    if query.order_by.is_some() {
        return refuse("ORDER BY");
    }
    if query.limit_clause.is_some() || query.fetch.is_some() {
        return refuse("LIMIT, OFFSET or FETCH");
    }
    if !query.locks.is_empty()
        || query.for_clause.is_some()
        || query.settings.is_some()
        || query.format_clause.is_some()
        || !query.pipe_operators.is_empty()
    {
        return refuse(&format!("{query}"));
    }
    Ok(())
}

fn refuse_body<T>(body: &ast::SetExpr, shape: &str) -> Result<T, SqlError> {
    let what = match body {
        ast::SetExpr::SetOperation { op, .. } => op.to_string(),
        ast::SetExpr::Query(_) => "a parenthesized query".into(),
        ast::SetExpr::Values(_) => "VALUES".into(),
        other => other.to_string(),
    };
    Err(unsupported(what, shape))
}

/// Refuses what a plain SELECT does not take: DISTINCT, HAVING, WINDOW, other dialects'.
fn plain_body<'q>(select: &'q ast::Select, shape: &str) -> Result<&'q ast::Select, SqlError> {
    let refuse = |what: &str| Err(unsupported(what, shape));
    if select.distinct.is_some() {
        return refuse("SELECT DISTINCT (COUNT(DISTINCT x) counts distinct values)");
    }
    if select.having.is_some() {
        return refuse("HAVING");
    }
    if !select.named_window.is_empty() {
        return refuse("a WINDOW clause");
    }
    if has_dialect_clauses(select) {
        return refuse(&format!("{select}"));
    }
    Ok(select)
}

/// Whether `select` has a clause of another SQL dialect than onehop's (TOP, INTO, QUALIFY,
/// CLUSTER BY, LATERAL VIEW, …): refused by views, transforms and queries alike.
pub(crate) fn has_dialect_clauses(select: &ast::Select) -> bool {
    select.top.is_some()
        || select.into.is_some()
        || select.exclude.is_some()
        || select.select_modifiers.is_some()
        || !select.optimizer_hints.is_empty()
        || !select.lateral_views.is_empty()
        || select.prewhere.is_some()
        || !select.connect_by.is_empty()
        || !select.cluster_by.is_empty()
        || !select.distribute_by.is_empty()
        || !select.sort_by.is_empty()
        || select.qualify.is_some()
        || select.value_table_mode.is_some()
}

/// The one relation of FROM: its name and, for `TUMBLE(…)` and the like, the call's arguments.
pub(super) fn source_relation<'q>(
    from: &'q [ast::TableWithJoins],
    shape: &str,
) -> Result<(&'q ast::ObjectName, Option<&'q ast::TableFunctionArgs>), SqlError> {
    let [table] = from else {
        let what = if from.is_empty() { "a SELECT without FROM" } else { "several sources in FROM (a join)" };
        return Err(unsupported(what, shape));
    };
    if !table.joins.is_empty() {
        return Err(unsupported("JOIN", shape));
    }
    match &table.relation {
        ast::TableFactor::Table {
            name,
            alias,
            args,
            with_hints,
            version,
            with_ordinality,
            partitions,
            json_path,
            sample,
            index_hints,
        } => {
            if let Some(alias) = alias {
                return Err(unsupported(
                    format!("the alias {alias} of the source"),
                    "fields are named directly (amount, customer.city), not through the source",
                ));
            }
            if !with_hints.is_empty()
                || version.is_some()
                || *with_ordinality
                || !partitions.is_empty()
                || json_path.is_some()
                || sample.is_some()
                || !index_hints.is_empty()
            {
                return Err(unsupported(&table.relation, shape));
            }
            Ok((name, args.as_ref()))
        }
        ast::TableFactor::Derived { .. } => Err(unsupported("a subquery in FROM", shape)),
        other => Err(unsupported(other, shape)),
    }
}

/// Refuses `*` with options of other dialects (`* EXCLUDE (a)`, `* REPLACE …`); `supported`
/// says what is.
pub(super) fn plain_wildcard(
    item: &ast::SelectItem,
    options: &ast::WildcardAdditionalOptions,
    supported: &str,
) -> Result<(), SqlError> {
    if options.opt_ilike.is_some()
        || options.opt_exclude.is_some()
        || options.opt_except.is_some()
        || options.opt_replace.is_some()
        || options.opt_rename.is_some()
        || options.opt_alias.is_some()
    {
        return Err(unsupported(item, supported));
    }
    Ok(())
}
