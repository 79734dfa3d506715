//! `CREATE STREAM … AS SELECT` (a transform): the SELECT list of a stream's records, computed
//! one by one from the source's, to a [`TransformDef`].

use onehop_engine::view::{Start, TransformDef};
use sqlparser::ast;

use super::columns::column_name;
use super::expr::{convert_expr, function_name};
use super::query::{plain_select, plain_wildcard, source_relation};
use super::{KEY_COLUMN, SUBJECT_COLUMN, TRANSFORM_SHAPE, invalid, unsupported};
use crate::SqlError;
use crate::parse::simple_name;

pub(super) fn transform_def(name: String, query: &ast::Query, sql: String) -> Result<TransformDef, SqlError> {
    let select = plain_select(query, TRANSFORM_SHAPE)?;
    match &select.group_by {
        ast::GroupByExpr::Expressions(expressions, modifiers) if expressions.is_empty() && modifiers.is_empty() => {}
        _ => {
            return Err(unsupported(
                "GROUP BY in a stream transform",
                "a transform maps each record on its own; aggregate with CREATE VIEW",
            ));
        }
    }
    let (source, window) = source_relation(&select.from, TRANSFORM_SHAPE)?;
    if window.is_some() {
        return Err(unsupported(
            format!("FROM {source}(…) in a stream transform"),
            "a transform reads one stream: FROM source (windows belong to CREATE VIEW)",
        ));
    }
    let source = simple_name(source)?;
    if source == name {
        return Err(invalid(format!("stream {name} cannot be computed from itself")));
    }
    let filter = select.selection.as_ref().map(convert_expr).transpose()?;
    let mut def = TransformDef {
        name,
        source,
        filter,
        columns: Vec::new(),
        all_fields: false,
        key: None,
        subject: None,
        start: Start::Latest,
        sql,
    };
    for item in &select.projection {
        let (expr, name) = match item {
            ast::SelectItem::Wildcard(options) => {
                plain_wildcard(item, options, "a transform takes a plain *")?;
                if def.all_fields {
                    return Err(invalid("* is selected twice"));
                }
                def.all_fields = true;
                continue;
            }
            ast::SelectItem::UnnamedExpr(expr) => {
                let name =
                    output_name(expr).ok_or_else(|| invalid(format!("name the column {expr}: {expr} AS name")))?;
                (expr, name)
            }
            ast::SelectItem::ExprWithAlias { expr, alias } => (expr, alias.value.clone()),
            other => return Err(unsupported(other, TRANSFORM_SHAPE)),
        };
        let expr = convert_expr(expr)?;
        let slot = if name.eq_ignore_ascii_case(KEY_COLUMN) {
            Some(&mut def.key)
        } else if name.eq_ignore_ascii_case(SUBJECT_COLUMN) {
            Some(&mut def.subject)
        } else {
            None
        };
        match slot {
            Some(Some(_)) => return Err(invalid(format!("{name} is selected twice"))),
            Some(slot) => *slot = Some(expr),
            None if def.columns.iter().any(|(existing, _)| *existing == name) => {
                return Err(invalid(format!("two columns are named {name}; name one with AS")));
            }
            None => def.columns.push((name, expr)),
        }
    }
    Ok(def)
}

/// A transform column's name when it has no alias: a field's name, else the function's.
pub(super) fn output_name(expr: &ast::Expr) -> Option<String> {
    column_name(expr).or_else(|| match expr {
        ast::Expr::Function(function) => function_name(function).map(|name| name.to_ascii_lowercase()),
        ast::Expr::Cast { expr, .. } | ast::Expr::Nested(expr) => output_name(expr),
        ast::Expr::Substring { .. } => Some("substring".into()),
        ast::Expr::Trim { .. } => Some("trim".into()),
        ast::Expr::Ceil { .. } => Some("ceil".into()),
        ast::Expr::Floor { .. } => Some("floor".into()),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use onehop_engine::view::Expr;
    use onehop_engine::view::expr::{BinaryOp, Function};
    use onehop_log::Durability;
    use serde_json::json;

    use super::super::testing::{error, lit, path, transform};
    use super::*;
    use crate::parse::{Statement, StreamOptions, parse};

    #[test]
    fn transforms() {
        let statements = parse(
            "CREATE STREAM IF NOT EXISTS big_orders WITH (partitions = 2, durability = 'async', start = 'earliest') \
             AS SELECT *, UPPER(name) AS name_upper, amount * 100 AS cents FROM orders WHERE amount > 100",
        )
        .unwrap();
        let Statement::CreateTransform { def, if_not_exists, stream_options } = &statements[0] else {
            panic!("{statements:?}")
        };
        assert!(if_not_exists);
        assert_eq!(
            *stream_options,
            StreamOptions { partitions: Some(2), durability: Some(Durability::Async), ..StreamOptions::default() }
        );
        assert_eq!(statements[0].label(), "CREATE STREAM big_orders AS SELECT");
        assert_eq!(
            *def,
            TransformDef {
                name: "big_orders".into(),
                source: "orders".into(),
                filter: Some(Expr::Binary {
                    operator: BinaryOp::Gt,
                    left: Box::new(path(&["amount"])),
                    right: Box::new(lit(json!(100))),
                }),
                columns: vec![
                    ("name_upper".into(), Expr::Call { function: Function::Upper, args: vec![path(&["name"])] }),
                    (
                        "cents".into(),
                        Expr::Binary {
                            operator: BinaryOp::Multiply,
                            left: Box::new(path(&["amount"])),
                            right: Box::new(lit(json!(100))),
                        },
                    ),
                ],
                all_fields: true,
                key: None,
                subject: None,
                start: Start::Earliest,
                sql: "CREATE STREAM IF NOT EXISTS big_orders WITH (partitions = 2, durability = 'async', \
                      start = 'earliest') AS SELECT *, UPPER(name) AS name_upper, amount * 100 AS cents FROM orders \
                      WHERE amount > 100"
                    .into(),
            }
        );
        let def = transform(
            "CREATE STREAM by_customer AS SELECT customer.id AS _key, 'orders/' || region AS _subject, id, \
             value->>'total', LOWER(status), CAST(qty AS DOUBLE), ts FROM orders",
        );
        assert!(!def.all_fields);
        assert_eq!(def.key, Some(path(&["customer", "id"])));
        assert!(matches!(def.subject, Some(Expr::Binary { operator: BinaryOp::Concat, .. })));
        let names: Vec<&str> = def.columns.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["id", "total", "lower", "qty", "ts"]);
        // A plain CREATE STREAM is still a stream.
        assert!(matches!(parse("CREATE STREAM s WITH (partitions = 2)").unwrap()[0], Statement::CreateStream { .. }));

        let cases = [
            (
                "SELECT key, COUNT(*) FROM s GROUP BY key",
                "GROUP BY in a stream transform is not supported here; a transform maps each record on its own; aggregate with CREATE VIEW",
            ),
            ("SELECT COUNT(*) AS n FROM s", "COUNT() inside an expression or WHERE"),
            ("SELECT * FROM TUMBLE(s, '1s')", "windows belong to CREATE VIEW"),
            ("SELECT * FROM a JOIN b ON a.x = b.x", "JOIN is not supported here; a transform is CREATE STREAM"),
            ("SELECT * FROM s ORDER BY a", "ORDER BY"),
            ("SELECT *, * FROM s", "* is selected twice"),
            ("SELECT a, a FROM s", "two columns are named a"),
            ("SELECT a AS _key, b AS _KEY FROM s", "selected twice"),
            ("SELECT a + 1 FROM s", "name the column a + 1: a + 1 AS name"),
            ("SELECT s.* FROM s", "not supported"),
            ("SELECT * EXCLUDE (a) FROM s", "a plain *"),
            ("SELECT * FROM t", "cannot be computed from itself"),
            ("SELECT NOW() FROM s", "the function NOW()"),
            ("SELECT SUBSTRING(a) AS b FROM s", "SUBSTRING takes (text, start [, length])"),
            ("SELECT REPLACE(a, 'b') FROM s", "REPLACE takes 3 argument(s), 2 given"),
            ("SELECT ROUND(a, 1, 2) FROM s", "ROUND takes 1 to 2 argument(s), 3 given"),
            ("SELECT UPPER(a, b) AS b FROM s", "UPPER takes 1 argument(s), 2 given"),
            ("SELECT COALESCE() AS b FROM s", "COALESCE takes at least 1 argument(s), 0 given"),
        ];
        for (select, fragment) in cases {
            let message = error(&format!("CREATE STREAM t AS {select}"));
            assert!(message.contains(fragment), "{select}\n  gave: {message}\n  wanted: {fragment}");
        }
        assert!(error("CREATE STREAM t WITH (colour = 'red') AS SELECT * FROM s").contains("unknown option"));
    }
}
