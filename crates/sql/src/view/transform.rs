//! `CREATE STREAM … AS SELECT` (a transform): the SELECT list of a stream's records, computed
//! one by one from the source's, to a [`TransformDef`]; `CROSS JOIN UNNEST(…)` makes one
//! record per element of an array, `JOIN table ON table.id = …` enriches each record with a
//! table's row (parsed here, resolved against the tables by `enrich`), and `UNION ALL` merges
//! several sources into one stream.

use onehop_engine::view::expr::{Function, RecordField, Step};
use onehop_engine::view::transform::{TransformBranch, ValueFormat};
use onehop_engine::view::{Expr, Start, TransformDef};
use sqlparser::ast;

use super::columns::column_name;
use super::enrich::{self, ALL_COLUMNS};
use super::expr::{convert_expr, function_name};
use super::query::{plain_wildcard, source_relation, union_all_selects};
use super::{KEY_COLUMN, SUBJECT_COLUMN, TRANSFORM_SHAPE, invalid, unsupported};
use crate::SqlError;
use crate::parse::simple_name;

/// What an UNNEST looks like, for errors.
const UNNEST_SHAPE: &str =
    "one array per record: FROM source CROSS JOIN UNNEST(array) [WITH ORDINALITY] AS alias(element [, position])";

pub(super) fn transform_def(name: String, query: &ast::Query, sql: String) -> Result<TransformDef, SqlError> {
    let selects = union_all_selects(query, TRANSFORM_SHAPE)?;
    let mut branches = Vec::with_capacity(selects.len());
    for (index, select) in selects.into_iter().enumerate() {
        branches.push(branch_def(&name, select, index == 0)?);
    }
    let mut branches = branches.into_iter();
    let first = branches.next().expect("a query has a SELECT");
    let mut union: Vec<TransformBranch> = branches.collect();
    // A joined branch's `alias.*` is expanded when it is resolved, and compared then.
    for (index, branch) in union.iter_mut().enumerate() {
        if first.lookups.is_empty() && branch.lookups.is_empty() {
            same_columns(&first, branch, index + 2)?;
        }
    }
    Ok(TransformDef { name, first, union, start: Start::Latest, value_format: ValueFormat::Json, sql })
}

/// Takes `branch` (the `ordinal`th SELECT) to the first's columns: as many, in the same
/// places, named as the first names them (as `UNION ALL` does in Postgres).
pub(super) fn same_columns(
    first: &TransformBranch,
    branch: &mut TransformBranch,
    ordinal: usize,
) -> Result<(), SqlError> {
    let names = |branch: &TransformBranch| -> String {
        let mut names: Vec<&str> = branch.columns.iter().map(|(name, _)| name.as_str()).collect();
        if branch.all_fields {
            names.insert(0, "*");
        }
        names.join(", ")
    };
    if first.all_fields != branch.all_fields || first.columns.len() != branch.columns.len() {
        return Err(invalid(format!(
            "each SELECT of a UNION ALL gives the same columns: the first gives {}, SELECT {ordinal} gives {}",
            names(first),
            names(branch)
        )));
    }
    for ((name, _), (first_name, _)) in branch.columns.iter_mut().zip(&first.columns) {
        name.clone_from(first_name);
    }
    Ok(())
}

/// The UNNEST of a branch: its array, and the names of its element and position columns.
struct Unnest {
    array: Expr,
    alias: Option<String>,
    element: String,
    ordinality: Option<String>,
}

/// One SELECT of a transform; one after the first (`first` false) may leave its columns
/// unnamed, as the first's names them.
fn branch_def(name: &str, select: &ast::Select, first: bool) -> Result<TransformBranch, SqlError> {
    match &select.group_by {
        ast::GroupByExpr::Expressions(expressions, modifiers) if expressions.is_empty() && modifiers.is_empty() => {}
        _ => {
            return Err(unsupported(
                "GROUP BY in a stream transform",
                "a transform maps each record on its own; aggregate with CREATE VIEW",
            ));
        }
    }
    let (from, unnest) = split_unnest(&select.from)?;
    let (source, alias, lookups) = match from.as_slice() {
        [joined] if !joined.joins.is_empty() && unnest.is_none() => enrich::parse_joins(joined)?,
        _ => {
            let (source, window) = source_relation(&from, TRANSFORM_SHAPE)?;
            if window.is_some() {
                return Err(unsupported(
                    format!("FROM {source}(…) in a stream transform"),
                    "a transform reads streams: FROM source (windows belong to CREATE VIEW)",
                ));
            }
            (simple_name(source)?, None, Vec::new())
        }
    };
    if source == name {
        return Err(invalid(format!("stream {name} cannot be computed from itself")));
    }
    let unnest = unnest.map(unnest_def).transpose()?;
    let convert = |expr: &ast::Expr| -> Result<Expr, SqlError> {
        let mut expr = convert_expr(expr)?;
        if let Some(unnest) = &unnest {
            unnest.resolve(&mut expr);
        }
        Ok(expr)
    };
    let filter = select.selection.as_ref().map(convert).transpose()?;
    let mut branch = TransformBranch {
        source,
        filter,
        columns: Vec::new(),
        all_fields: false,
        key: None,
        subject: None,
        unnest: unnest.as_ref().map(|unnest| unnest.array.clone()),
        alias,
        lookups,
    };
    let joined = !branch.lookups.is_empty();
    for item in &select.projection {
        let (expr, name) = match item {
            ast::SelectItem::Wildcard(_) if joined => {
                return Err(unsupported(
                    "SELECT * in a transform that joins tables",
                    "the record's fields and the rows' columns may share names: take alias.* (the record's \
                     fields, or a table's columns) or name the columns",
                ));
            }
            ast::SelectItem::QualifiedWildcard(kind, options) if joined => {
                plain_wildcard(item, options, "a transform takes a plain alias.*")?;
                let ast::SelectItemQualifiedWildcardKind::ObjectName(alias) = kind else {
                    return Err(unsupported(item, TRANSFORM_SHAPE));
                };
                // Resolved into the record's fields or the table's columns by `enrich`.
                let alias = Expr::Path { path: vec![Step::Field(simple_name(alias)?)] };
                branch.columns.push((ALL_COLUMNS.into(), alias));
                continue;
            }
            ast::SelectItem::Wildcard(options) => {
                plain_wildcard(item, options, "a transform takes a plain *")?;
                if branch.all_fields {
                    return Err(invalid("* is selected twice"));
                }
                branch.all_fields = true;
                continue;
            }
            ast::SelectItem::UnnamedExpr(expr) => match output_name(expr) {
                Some(name) => (expr, name),
                // Named as the first SELECT names it, by `same_columns`.
                None if !first => (expr, expr.to_string()),
                None => return Err(invalid(format!("name the column {expr}: {expr} AS name"))),
            },
            ast::SelectItem::ExprWithAlias { expr, alias } => (expr, alias.value.clone()),
            other => return Err(unsupported(other, TRANSFORM_SHAPE)),
        };
        let expr = convert(expr)?;
        let slot = if name.eq_ignore_ascii_case(KEY_COLUMN) {
            Some(&mut branch.key)
        } else if name.eq_ignore_ascii_case(SUBJECT_COLUMN) {
            Some(&mut branch.subject)
        } else {
            None
        };
        match slot {
            Some(Some(_)) => return Err(invalid(format!("{name} is selected twice"))),
            Some(slot) => *slot = Some(expr),
            // After the first SELECT, columns take the first's names, in place.
            None if first && branch.columns.iter().any(|(existing, _)| *existing == name) => {
                return Err(invalid(format!("two columns are named {name}; name one with AS")));
            }
            None => branch.columns.push((name, expr)),
        }
    }
    Ok(branch)
}

/// FROM as the source alone, and the UNNEST joined to it if any (`CROSS JOIN UNNEST(…)`, or
/// `, UNNEST(…)`).
fn split_unnest(
    from: &[ast::TableWithJoins],
) -> Result<(Vec<ast::TableWithJoins>, Option<&ast::TableFactor>), SqlError> {
    let is_unnest = |factor: &ast::TableFactor| matches!(factor, ast::TableFactor::UNNEST { .. });
    match from {
        [source] => match source.joins.as_slice() {
            [join] if is_unnest(&join.relation) => {
                if !matches!(join.join_operator, ast::JoinOperator::CrossJoin(ast::JoinConstraint::None)) {
                    return Err(unsupported(format!("{} UNNEST", join_name(&join.join_operator)), UNNEST_SHAPE));
                }
                let alone = ast::TableWithJoins { relation: source.relation.clone(), joins: Vec::new() };
                Ok((vec![alone], Some(&join.relation)))
            }
            _ => Ok((from.to_vec(), None)),
        },
        [source, unnest] if source.joins.is_empty() && unnest.joins.is_empty() && is_unnest(&unnest.relation) => {
            Ok((vec![source.clone()], Some(&unnest.relation)))
        }
        _ => Ok((from.to_vec(), None)),
    }
}

fn join_name(operator: &ast::JoinOperator) -> &'static str {
    match operator {
        ast::JoinOperator::LeftOuter(_) | ast::JoinOperator::Left(_) => "LEFT JOIN",
        ast::JoinOperator::CrossApply | ast::JoinOperator::OuterApply => "APPLY",
        _ => "a JOIN with a condition on",
    }
}

fn unnest_def(factor: &ast::TableFactor) -> Result<Unnest, SqlError> {
    let ast::TableFactor::UNNEST { alias, array_exprs, with_offset, with_offset_alias: _, with_ordinality } = factor
    else {
        unreachable!("split_unnest gives UNNEST only")
    };
    if *with_offset {
        return Err(unsupported("UNNEST … WITH OFFSET", UNNEST_SHAPE));
    }
    let [array] = array_exprs.as_slice() else {
        return Err(unsupported(format!("UNNEST of {} arrays", array_exprs.len()), UNNEST_SHAPE));
    };
    let array = convert_expr(array)?;
    if never_array(&array) {
        return Err(invalid(format!(
            "UNNEST({array_sql}) takes an array, and {array_sql} never is one: split text into one with              STRING_TO_ARRAY(text, ' ') or REGEXP_SPLIT_TO_ARRAY(text, '\\s+'), or name a field that holds an array",
            array_sql = array_exprs[0]
        )));
    }
    let (alias, columns) = match alias {
        None => (None, Vec::new()),
        Some(alias) => {
            if alias.at.is_some() || alias.columns.iter().any(|column| column.data_type.is_some()) {
                return Err(unsupported(alias, UNNEST_SHAPE));
            }
            (Some(alias.name.value.clone()), alias.columns.iter().map(|column| column.name.value.clone()).collect())
        }
    };
    let wanted = if *with_ordinality { 2 } else { 1 };
    if columns.len() > wanted {
        return Err(invalid(format!(
            "UNNEST gives {wanted} column{}, and the alias names {}: {UNNEST_SHAPE}",
            if wanted == 1 { "" } else { "s (the element and its position)" },
            columns.len()
        )));
    }
    // Postgres's names: the alias's columns, else the alias itself, else `unnest`; and
    // `ordinality` for the position.
    let element = columns.first().cloned().or_else(|| alias.clone()).unwrap_or_else(|| "unnest".into());
    let ordinality = with_ordinality.then(|| columns.get(1).cloned().unwrap_or_else(|| "ordinality".into()));
    if ordinality.as_ref().is_some_and(|ordinality| ordinality.eq_ignore_ascii_case(&element)) {
        return Err(invalid(format!("UNNEST's two columns are both named {element}")));
    }
    Ok(Unnest { array, alias, element, ordinality })
}

impl Unnest {
    /// Makes the names of the UNNEST's columns (`word`, or `w.word` through its alias) mean
    /// them. They hide a field of the record's value of the same name (`value->>'word'` reads
    /// that field as text).
    fn resolve(&self, expr: &mut Expr) {
        let _ = expr.try_rewrite(&mut |node: &mut Expr| {
            let Expr::Path { path } = node else { return Ok::<(), ()>(()) };
            let named = |step: Option<&Step>, name: &str| {
                matches!(step, Some(Step::Field(field)) if field.eq_ignore_ascii_case(name))
            };
            let through_alias = self.alias.as_deref().is_some_and(|alias| named(path.first(), alias))
                && path.len() >= 2
                && self.column(&path[1]).is_some();
            let (field, rest) = if through_alias {
                (self.column(&path[1]), &path[2..])
            } else {
                (path.first().and_then(|step| self.column(step)), path.get(1..).unwrap_or_default())
            };
            if let Some(field) = field {
                let element = Expr::Record { field };
                *node = if rest.is_empty() {
                    element
                } else {
                    Expr::Get { base: Box::new(element), path: rest.to_vec(), text: false }
                };
            }
            Ok(())
        });
    }

    fn column(&self, step: &Step) -> Option<RecordField> {
        let Step::Field(name) = step else { return None };
        if name.eq_ignore_ascii_case(&self.element) {
            Some(RecordField::Element)
        } else if self.ordinality.as_ref().is_some_and(|ordinality| name.eq_ignore_ascii_case(ordinality)) {
            Some(RecordField::Ordinality)
        } else {
            None
        }
    }
}

/// Whether `expr` can never give an array (so UNNEST of it never gives a row): literals that
/// are not arrays, operators, record fields, casts and the scalar functions that give text,
/// numbers or truth values.
fn never_array(expr: &Expr) -> bool {
    match expr {
        Expr::Literal { value } => !value.is_array(),
        Expr::Record { .. }
        | Expr::Unary { .. }
        | Expr::Binary { .. }
        | Expr::Is { .. }
        | Expr::In { .. }
        | Expr::Like { .. }
        | Expr::Between { .. }
        | Expr::Cast { .. } => true,
        Expr::Call { function, .. } => !matches!(
            function,
            Function::JsonBuildArray
                | Function::StringToArray
                | Function::RegexpSplitToArray
                | Function::Coalesce
                | Function::Nullif
                | Function::Greatest
                | Function::Least
        ),
        Expr::Path { .. } | Expr::Get { .. } | Expr::Case { .. } => false,
    }
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
    use onehop_engine::view::expr::{BinaryOp, Function, RecordField, Step};
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
                first: TransformBranch {
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
                    ..TransformBranch::all_of("orders")
                },
                union: Vec::new(),
                value_format: ValueFormat::Json,
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
        let def = def.first;
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
            ("SELECT * FROM a JOIN b ON a.x = b.x", "SELECT * in a transform that joins tables"),
            ("SELECT a.x FROM a RIGHT JOIN b ON a.x = b.x", "RIGHT JOIN"),
            ("SELECT a.x FROM a JOIN b USING (x)", "join ON a condition"),
            ("SELECT a.x FROM a JOIN (SELECT * FROM b) c ON c.id = a.x", "a subquery in FROM"),
            ("SELECT w FROM s JOIN t ON t.id = s.x CROSS JOIN UNNEST(a) AS w", "UNNEST and JOIN in one SELECT"),
            ("SELECT * FROM a UNION SELECT * FROM b", "UNION without ALL"),
            ("SELECT * FROM a INTERSECT SELECT * FROM b", "INTERSECT is not supported"),
            ("SELECT a, b FROM x UNION ALL SELECT a FROM y", "the first gives a, b, SELECT 2 gives a"),
            ("SELECT a FROM x UNION ALL SELECT * FROM y", "the first gives a, SELECT 2 gives *"),
            ("SELECT * FROM x UNION ALL SELECT * FROM t", "cannot be computed from itself"),
            ("SELECT w FROM s CROSS JOIN UNNEST(UPPER(a)) AS w", "UNNEST(UPPER(a)) takes an array"),
            ("SELECT w FROM s CROSS JOIN UNNEST('a b') AS w", "STRING_TO_ARRAY(text, ' ')"),
            ("SELECT w FROM s CROSS JOIN UNNEST(a, b) AS w", "UNNEST of 2 arrays"),
            ("SELECT w FROM s CROSS JOIN UNNEST(a) WITH OFFSET AS w", "WITH OFFSET"),
            ("SELECT w FROM s CROSS JOIN UNNEST(a) AS u(w, n)", "UNNEST gives 1 column, and the alias names 2"),
            ("SELECT w FROM s CROSS JOIN UNNEST(a) WITH ORDINALITY AS u(w, w)", "both named w"),
            ("SELECT w FROM s LEFT JOIN UNNEST(a) AS w ON true", "LEFT JOIN UNNEST"),
            ("SELECT w FROM s CROSS JOIN UNNEST(a) AS w CROSS JOIN UNNEST(b) AS v", "several UNNESTs"),
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

    #[test]
    fn unnest_names_the_element_and_its_position() {
        let element = Expr::Record { field: RecordField::Element };
        let position = Expr::Record { field: RecordField::Ordinality };
        let split = |text: &str| Expr::Call {
            function: Function::StringToArray,
            args: vec![Expr::Call { function: Function::Lower, args: vec![path(&[text])] }, lit(json!(" "))],
        };
        let def = transform(
            "CREATE STREAM words AS SELECT word AS _key, w.word, n, value->>'word' AS field FROM lines \
             CROSS JOIN UNNEST(SPLIT(LOWER(line), ' ')) WITH ORDINALITY AS w(word, n) WHERE LENGTH(word) > 2",
        )
        .first;
        assert_eq!(def.unnest, Some(split("line")));
        assert_eq!(def.key, Some(element.clone()));
        assert_eq!(
            def.columns,
            [
                ("word".into(), element.clone()),
                ("n".into(), position.clone()),
                // ->> reads the value's own field of that name.
                (
                    "field".into(),
                    Expr::Get { base: Box::new(path(&[])), path: vec![Step::Field("word".into())], text: true }
                ),
            ]
        );
        assert!(matches!(&def.filter, Some(Expr::Binary { left, .. })
            if **left == Expr::Call { function: Function::Length, args: vec![element.clone()] }));
        // The comma form, an alias without columns, a path into an element, no alias at all.
        let def = transform("CREATE STREAM t AS SELECT tag.name, tag->>'id' AS id FROM s, UNNEST(tags) AS tag").first;
        assert_eq!(
            def.columns[0].1,
            Expr::Get { base: Box::new(element.clone()), path: vec![Step::Field("name".into())], text: false }
        );
        assert!(matches!(&def.columns[1].1, Expr::Get { base, text: true, .. } if **base == element));
        let def = transform(
            "CREATE STREAM t AS SELECT unnest AS x, ordinality AS i FROM s CROSS JOIN UNNEST(a) WITH ORDINALITY",
        )
        .first;
        assert_eq!(def.columns, [("x".into(), element), ("i".into(), position)]);
    }

    #[test]
    fn union_all_merges_branches_under_the_first_names() {
        let def = transform(
            "CREATE STREAM merged AS SELECT id AS _key, 'user' AS kind, name FROM users WHERE active \
             UNION ALL SELECT sku AS _key, 'product', title FROM products \
             UNION ALL SELECT id AS _key, 'tag', t FROM posts CROSS JOIN UNNEST(tags) AS t",
        );
        assert_eq!(def.sources(), ["users", "products", "posts"]);
        assert_eq!(def.union.len(), 2);
        for branch in def.branches() {
            let names: Vec<&str> = branch.columns.iter().map(|(name, _)| name.as_str()).collect();
            assert_eq!(names, ["kind", "name"]);
        }
        assert_eq!(def.union[0].key, Some(path(&["sku"])));
        assert_eq!(def.union[1].key, Some(path(&["id"])));
        assert!(def.union[1].unnest.is_some() && def.first.unnest.is_none());
        let def = transform("CREATE STREAM t AS SELECT a FROM x UNION ALL SELECT b FROM y");
        assert_eq!(def.union[0].key, None, "a branch without _key keeps its source's key");
        let def = transform("CREATE STREAM both AS SELECT * FROM a UNION ALL SELECT * FROM a");
        assert_eq!(def.sources(), ["a"]);
        assert_eq!(def.branches().count(), 2);
    }
}
