//! A view's key and columns: the one GROUP BY expression, and the SELECT list of the key and
//! aggregates (COUNT, SUM, …), with the names columns get when they have no alias.

use onehop_engine::view::{AggregateKind, Column, Expr, OrderKey};
use sqlparser::ast;

use super::expr::{convert_expr, function_name, string_value};
use super::{AGGREGATES, FLAG_COLUMNS, VIEW_SHAPE, WINDOW_COLUMNS, invalid, unsupported};
use crate::SqlError;

/// The one GROUP BY expression of a view.
pub(super) fn group_by(select: &ast::Select) -> Result<&ast::Expr, SqlError> {
    match &select.group_by {
        ast::GroupByExpr::Expressions(expressions, modifiers) if modifiers.is_empty() => match expressions.as_slice() {
            [ast::Expr::Rollup(_) | ast::Expr::Cube(_) | ast::Expr::GroupingSets(_)] => {
                Err(unsupported(&select.group_by, "a view groups by one expression: GROUP BY key"))
            }
            [expression] => Ok(expression),
            [] => Err(invalid(format!(
                "a view needs GROUP BY key (for one total over all events, GROUP BY a constant: \
                     GROUP BY 'all'); {VIEW_SHAPE}"
            ))),
            _ => Err(unsupported(
                "GROUP BY of several expressions",
                "a view groups by one expression (combine several: GROUP BY region || '/' || product)",
            )),
        },
        other => Err(unsupported(other, "a view groups by one expression: GROUP BY key")),
    }
}

/// The SELECT list of a view: the key (the GROUP BY expression; a SELECT alias may stand for
/// it) and the columns.
pub(super) fn view_columns(
    projection: &[ast::SelectItem],
    group_by: &ast::Expr,
) -> Result<(Expr, Vec<Column>), SqlError> {
    let mut items = Vec::with_capacity(projection.len());
    for item in projection {
        match item {
            ast::SelectItem::UnnamedExpr(expr) => items.push((expr, None)),
            ast::SelectItem::ExprWithAlias { expr, alias } => items.push((expr, Some(alias.value.clone()))),
            ast::SelectItem::Wildcard(_) | ast::SelectItem::QualifiedWildcard(..) => {
                return Err(unsupported("SELECT * in a view", "a view selects its key and aggregates"));
            }
            other => return Err(unsupported(other, VIEW_SHAPE)),
        }
    }
    for (expr, _) in &items {
        if let ast::Expr::Identifier(ident) = expr
            && WINDOW_COLUMNS.iter().any(|name| name.eq_ignore_ascii_case(&ident.value))
        {
            return Err(window_column_error(&ident.value));
        }
    }
    // GROUP BY may name a SELECT alias (GROUP BY r for UPPER(region) AS r): the key is then that
    // item's expression.
    let aliased = match group_by {
        ast::Expr::Identifier(ident) => items.iter().find(|(expr, alias)| {
            alias.as_deref() == Some(ident.value.as_str()) && !matches!(aggregate(expr), Ok(Some(_)))
        }),
        _ => None,
    };
    let key = match aliased {
        Some((expr, _)) => convert_expr(expr)?,
        None => convert_expr(group_by)?,
    };
    let mut columns: Vec<Column> = Vec::with_capacity(items.len());
    for (expr, alias) in items {
        let column = match aggregate(expr)? {
            Some((function, arg, default_name, order_by)) => {
                Column::Aggregate { name: alias.unwrap_or(default_name), function, arg, order_by }
            }
            None => {
                if convert_expr(expr)? != key {
                    return Err(invalid(format!(
                        "{expr} is neither the GROUP BY expression ({group_by}) nor an aggregate; a view's \
                         columns are its key and aggregates ({AGGREGATES})"
                    )));
                }
                if columns.iter().any(|column| matches!(column, Column::Key { .. })) {
                    return Err(invalid(format!("the key {group_by} is selected twice")));
                }
                Column::Key { name: alias.or_else(|| column_name(expr)).unwrap_or_else(|| "key".to_string()) }
            }
        };
        let name = column.name();
        if WINDOW_COLUMNS.iter().any(|window_column| window_column.eq_ignore_ascii_case(name)) {
            return Err(window_column_error(name));
        }
        if FLAG_COLUMNS.iter().any(|flag| flag.eq_ignore_ascii_case(name)) {
            return Err(invalid(format!(
                "{name}: every row of a view carries \"final\" (and \"removed\" when it is gone); \
                 name the column otherwise with AS"
            )));
        }
        if columns.iter().any(|existing| existing.name() == name) {
            return Err(invalid(format!("two columns are named {name}; name one with AS")));
        }
        columns.push(column);
    }
    Ok((key, columns))
}

fn window_column_error(name: &str) -> SqlError {
    invalid(format!(
        "{name}: window_start and window_end come automatically with every row of a windowed view; \
         leave them out of the SELECT list (and name no column so)"
    ))
}

/// An aggregate of a view's SELECT list: its function, argument (`None` for `COUNT(*)`),
/// default column name (`count`, `sum_amount`, `count_distinct_user`) and own ORDER BY
/// (JSON_AGG, ARRAY_AGG). `None`: not an aggregate.
type Aggregate = (AggregateKind, Option<Expr>, String, Vec<OrderKey>);

fn aggregate(expr: &ast::Expr) -> Result<Option<Aggregate>, SqlError> {
    let ast::Expr::Function(function) = expr else { return Ok(None) };
    let Some(name) = function_name(function) else { return Ok(None) };
    let Some(kind) = aggregate_kind(&name) else { return Ok(None) };
    let upper = name.to_ascii_uppercase();
    if function.over.is_some() {
        return Err(unsupported(
            "window functions (OVER)",
            "a view's windows come from FROM TUMBLE|HOP|SLIDING|SESSION(source, …)",
        ));
    }
    if function.filter.is_some() {
        return Err(unsupported("FILTER on an aggregate", "filter the events with the view's WHERE"));
    }
    let list = match &function.args {
        ast::FunctionArguments::List(list)
            if (list.clauses.is_empty()
                || kind.collects() && matches!(list.clauses.as_slice(), [ast::FunctionArgumentClause::OrderBy(_)]))
                && function.within_group.is_empty()
                && function.null_treatment.is_none()
                && matches!(function.parameters, ast::FunctionArguments::None) =>
        {
            list
        }
        _ => return Err(unsupported(expr, format!("aggregates are {AGGREGATES}"))),
    };
    let distinct = matches!(list.duplicate_treatment, Some(ast::DuplicateTreatment::Distinct));
    let prefix = name.to_ascii_lowercase();
    let mut order_by = Vec::new();
    if let [ast::FunctionArgumentClause::OrderBy(keys)] = list.clauses.as_slice() {
        for key in keys {
            let descending = match key.options.sort {
                None | Some(ast::OrderBySort::Asc) => false,
                Some(ast::OrderBySort::Desc) => true,
                Some(ast::OrderBySort::Using(_)) => {
                    return Err(unsupported("ORDER BY … USING", "order by ASC or DESC"));
                }
            };
            if key.options.nulls_first.is_some_and(|first| first != descending) || key.with_fill.is_some() {
                return Err(unsupported(
                    format!("{key} in {upper}"),
                    "nulls come last ascending and first descending; other placements are not supported yet",
                ));
            }
            order_by.push(OrderKey { expr: convert_expr(&key.expr)?, descending });
        }
    }
    match list.args.as_slice() {
        [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard)] if kind == AggregateKind::Count && !distinct => {
            Ok(Some((AggregateKind::Count, None, prefix, order_by)))
        }
        [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(arg))] => {
            let (kind, prefix) = match (kind, distinct) {
                (AggregateKind::Count, true) => (AggregateKind::CountDistinct, "count_distinct".to_string()),
                (kind, false) => (kind, prefix),
                (_, true) => {
                    return Err(unsupported(
                        format!("{upper}(DISTINCT …)"),
                        "only COUNT takes DISTINCT: COUNT(DISTINCT x)",
                    ));
                }
            };
            let default_name = match column_name(arg) {
                Some(arg_name) => format!("{prefix}_{arg_name}"),
                None => prefix,
            };
            Ok(Some((kind, Some(convert_expr(arg)?), default_name, order_by)))
        }
        _ => {
            let form =
                if kind == AggregateKind::Count { "COUNT(*), COUNT(x) or COUNT(DISTINCT x)" } else { "one expression" };
            Err(invalid(format!("{expr}: {upper} takes {form}")))
        }
    }
}

pub(super) fn aggregate_kind(name: &str) -> Option<AggregateKind> {
    const KINDS: [(&str, AggregateKind); 10] = [
        ("count", AggregateKind::Count),
        ("sum", AggregateKind::Sum),
        ("avg", AggregateKind::Avg),
        ("min", AggregateKind::Min),
        ("max", AggregateKind::Max),
        ("first", AggregateKind::First),
        ("last", AggregateKind::Last),
        ("json_agg", AggregateKind::JsonAgg),
        ("jsonb_agg", AggregateKind::JsonAgg),
        ("array_agg", AggregateKind::ArrayAgg),
    ];
    KINDS.iter().find(|(kind_name, _)| kind_name.eq_ignore_ascii_case(name)).map(|(_, kind)| *kind)
}

/// The name a column gets from its expression when it has no alias: a field's name
/// (`amount`, the last part of `customer.city`, the last key of `value->'a'->>'b'`).
pub(super) fn column_name(expr: &ast::Expr) -> Option<String> {
    match expr {
        ast::Expr::Identifier(ident) => Some(ident.value.clone()),
        ast::Expr::CompoundIdentifier(parts) => parts.last().map(|part| part.value.clone()),
        ast::Expr::Nested(inner) => column_name(inner),
        ast::Expr::BinaryOp { op: ast::BinaryOperator::Arrow | ast::BinaryOperator::LongArrow, right, .. } => {
            match right.as_ref() {
                ast::Expr::Value(value) => string_value(&value.value).map(str::to_string),
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use onehop_engine::view::expr::{BinaryOp, Function, RecordField};

    use super::super::testing::{path, view};
    use super::*;

    #[test]
    fn column_names() {
        let names = |sql: &str| view(sql).columns.iter().map(|column| column.name().to_string()).collect::<Vec<_>>();
        assert_eq!(
            names(
                "CREATE VIEW v AS SELECT region, COUNT(*), COUNT(user_id), COUNT(DISTINCT user_id), SUM(amount), \
                 AVG(amount), MIN(amount), MAX(amount), FIRST(status), LAST(status), SUM(price * qty), \
                 MAX(payload.total), MIN(value->>'score') FROM s GROUP BY region"
            ),
            [
                "region",
                "count",
                "count_user_id",
                "count_distinct_user_id",
                "sum_amount",
                "avg_amount",
                "min_amount",
                "max_amount",
                "first_status",
                "last_status",
                "sum",
                "max_total",
                "min_score",
            ]
        );
        assert_eq!(names("CREATE VIEW v AS SELECT key, COUNT(*) AS n FROM s GROUP BY key"), ["key", "n"]);
        assert_eq!(
            names("CREATE VIEW v AS SELECT customer.country, COUNT(*) FROM s GROUP BY customer.country"),
            ["country", "count"]
        );
        assert_eq!(
            names("CREATE VIEW v AS SELECT UPPER(region), COUNT(*) FROM s GROUP BY UPPER(region)"),
            ["key", "count"]
        );
        assert_eq!(names("CREATE VIEW v AS SELECT COUNT(*) FROM s GROUP BY region"), ["count"]);
        assert_eq!(names("CREATE VIEW v AS SELECT COUNT(*), region AS r FROM s GROUP BY region"), ["count", "r"]);
        // GROUP BY may name the key by its alias.
        let def = view("CREATE VIEW v AS SELECT LOWER(region) AS region, COUNT(*) FROM s GROUP BY region");
        assert_eq!(def.key, Expr::Call { function: Function::Lower, args: vec![path(&["region"])] });
        assert_eq!(def.columns[0], Column::Key { name: "region".into() });
        let def = view(
            "CREATE VIEW v AS SELECT COUNT(DISTINCT user_id) AS users, SUM(price * qty) AS revenue FROM s GROUP BY key",
        );
        assert_eq!(def.key, Expr::Record { field: RecordField::Key });
        assert_eq!(
            def.columns,
            [
                Column::Aggregate {
                    name: "users".into(),
                    function: AggregateKind::CountDistinct,
                    arg: Some(path(&["user_id"])),
                    order_by: Vec::new(),
                },
                Column::Aggregate {
                    name: "revenue".into(),
                    function: AggregateKind::Sum,
                    arg: Some(Expr::Binary {
                        operator: BinaryOp::Multiply,
                        left: Box::new(path(&["price"])),
                        right: Box::new(path(&["qty"])),
                    }),
                    order_by: Vec::new(),
                },
            ]
        );
    }
}
