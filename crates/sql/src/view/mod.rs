//! `CREATE VIEW … AS SELECT …` and `CREATE STREAM … AS SELECT …`: sqlparser's query AST to the
//! engine's [`ViewDef`] and [`TransformDef`], and SQL expressions to the engine's [`Expr`].
//!
//! Everything outside the dialect is refused here, when the statement is parsed, with what is
//! supported instead; the engine only ever sees definitions it can run. docs/sql.md ("Views
//! and transforms") describes the dialect this module accepts.
//!
//! - `query`: the one plain `SELECT … FROM source` both definitions are; the rest of SELECT is
//!   refused.
//! - `window`: a view's FROM: its source, window function and durations.
//! - `columns`: a view's GROUP BY key and its SELECT list of key and aggregates.
//! - `options`: a view's `WITH (…)` options.
//! - `transform`: `CREATE STREAM … AS SELECT` to a [`TransformDef`].
//! - `join`: a view without GROUP BY (joined inputs, or one filtered), parsed and then resolved
//!   against its inputs' columns.
//! - `expr`: SQL expressions to the engine's [`Expr`].
//! - this module: the statements (parsed and run), and a [`ViewDef`] put together from its parts.
//!
//! [`Expr`]: onehop_engine::view::Expr

mod columns;
mod enrich;
pub(crate) mod expr;
mod join;
mod options;
pub(crate) mod query;
#[cfg(test)]
mod testing;
mod transform;
mod window;

use onehop_engine::Engine;
use onehop_engine::view::expr::FUNCTION_NAMES;
use onehop_engine::view::{DEFAULT_GRACE_MS, DEFAULT_RETENTION_MS, Start, TransformDef, ViewDef};
use sqlparser::ast::{self, SqlOption};
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Location;

use crate::SqlError;
use crate::execute::Output;
use crate::parse::{Statement, StreamOptions, simple_name, syntax};
use columns::{group_by, view_columns};
use expr::{convert_expr, function_name};
use options::apply_view_options;
use query::plain_select;
use transform::transform_def;
use window::view_source;

/// What a view looks like, for errors.
const VIEW_SHAPE: &str = "a view is CREATE VIEW name [WITH (…)] AS SELECT [key,] aggregates \
     FROM source | TUMBLE|HOP|SLIDING|SESSION(source, …) [WHERE condition] GROUP BY key";
/// What a view's FROM looks like, for errors.
const SOURCE_SHAPE: &str =
    "views aggregate one source: FROM source or FROM TUMBLE|HOP|SLIDING|SESSION(source, [time_column,] …)";
/// What a transform looks like, for errors.
const TRANSFORM_SHAPE: &str = "a transform is CREATE STREAM name [WITH (…)] AS SELECT [*,] expression [AS name], … \
     FROM source [CROSS JOIN UNNEST(array) [WITH ORDINALITY] AS alias(element [, position]) | \
     [LEFT] JOIN table t ON t.primary_key = expression …] [WHERE condition] [UNION ALL SELECT … FROM another_source …]";
/// The aggregates of a view's SELECT list.
const AGGREGATES: &str = "COUNT(*), COUNT(x), COUNT(DISTINCT x), SUM(x), AVG(x), MIN(x), MAX(x), FIRST(x), LAST(x), \
     JSON_AGG(x [ORDER BY …]), ARRAY_AGG(x [ORDER BY …])";
/// Columns every windowed view row gets from the runtime.
const WINDOW_COLUMNS: [&str; 2] = ["window_start", "window_end"];
/// The flags every row of a view's changes carries beside its columns.
const FLAG_COLUMNS: [&str; 3] = ["final", "removed", "before"];
/// Output columns of a transform that set the record's key and subject instead of a field.
const KEY_COLUMN: &str = "_key";
const SUBJECT_COLUMN: &str = "_subject";

/// What expressions may contain, for errors.
fn expressions() -> String {
    format!(
        "expressions are literals, fields (key, subject, ts, partition, offset, value, name, a.b.c, \
         value->'a'->>'b'), + - * / %, = <> < <= > >=, AND, OR, NOT, IS [NOT] NULL|TRUE|FALSE, [NOT] IN (…), \
         [NOT] LIKE|ILIKE, ~ ~* !~ !~* (regular expressions), [NOT] BETWEEN, CASE, CAST(x AS TEXT|BIGINT|DOUBLE|BOOLEAN), || \
         and the functions \
         {FUNCTION_NAMES}"
    )
}

fn unsupported(what: impl std::fmt::Display, supported: impl Into<String>) -> SqlError {
    SqlError::UnsupportedQuery { what: what.to_string(), supported: supported.into() }
}

fn invalid(message: impl Into<String>) -> SqlError {
    SqlError::InvalidQuery(message.into())
}

/// `CREATE VIEW` (already read) `[IF NOT EXISTS] name [WITH (…)] AS SELECT …`. `start` is where
/// the statement began in `sql`, to keep its text.
pub(crate) fn parse_create_view(parser: &mut Parser, sql: &str, start: Location) -> Result<Statement, SqlError> {
    let if_not_exists = parser.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = simple_name(&parser.parse_object_name(false).map_err(syntax)?)?;
    let options = parser.parse_options(Keyword::WITH).map_err(syntax)?;
    parser.expect_keyword_is(Keyword::AS).map_err(syntax)?;
    let query = parser.parse_query().map_err(syntax)?;
    let text = statement_text(sql, start, parser.get_current_token().span.end);
    let def = view_def(name, &options, &query, text)?;
    Ok(Statement::CreateView { def, if_not_exists })
}

/// The `SELECT …` of `CREATE STREAM name [WITH (…)] AS` (already read).
pub(crate) fn parse_transform(
    parser: &mut Parser,
    name: String,
    sql: &str,
    start: Location,
) -> Result<TransformDef, SqlError> {
    let query = parser.parse_query().map_err(syntax)?;
    let text = statement_text(sql, start, parser.get_current_token().span.end);
    transform_def(name, &query, text)
}

/// A view of `source` with every option at its default, no window, no key and no columns:
/// what the two kinds of view fill in.
fn with_defaults(name: String, source: String, sql: String) -> ViewDef {
    ViewDef {
        name,
        source,
        window: onehop_engine::view::Window::None,
        event_time: None,
        filter: None,
        key: onehop_engine::view::Expr::Literal { value: serde_json::Value::Null },
        columns: Vec::new(),
        grace_ms: DEFAULT_GRACE_MS,
        emit_changes: true,
        emit_final: false,
        retention_ms: DEFAULT_RETENTION_MS,
        start: Start::Latest,
        late_stream: None,
        sql,
        join: None,
    }
}

/// Whether a view's SELECT is a joined view's: no GROUP BY and no aggregate in its SELECT list
/// (which asks for GROUP BY, and is told so).
fn is_join_view(select: &ast::Select) -> bool {
    let grouped = match &select.group_by {
        ast::GroupByExpr::Expressions(expressions, modifiers) => !expressions.is_empty() || !modifiers.is_empty(),
        ast::GroupByExpr::All(_) => true,
    };
    let aggregates = select.projection.iter().any(|item| match item {
        ast::SelectItem::UnnamedExpr(expr) | ast::SelectItem::ExprWithAlias { expr, .. } => {
            matches!(expr, ast::Expr::Function(function)
                if function_name(function).is_some_and(|name| columns::aggregate_kind(&name).is_some()))
        }
        _ => false,
    });
    !grouped && !aggregates
}

/// Runs `CREATE VIEW`.
pub(crate) async fn execute_create_view(
    engine: &Engine,
    def: &ViewDef,
    if_not_exists: bool,
    label: String,
) -> Result<Output, SqlError> {
    let resolved;
    let def = if def.join.is_some() {
        resolved = join::resolve(engine, def)?;
        &resolved
    } else {
        def
    };
    if let Ok(existing) = engine.view(&def.name)
        && let Some(output) = already_defined(
            &label,
            &existing.def().sql,
            existing.def() == def,
            if_not_exists,
            "the view exists with this definition",
        )
    {
        return Ok(output);
    }
    let view = engine.create_view(def.clone()).await?;
    Ok(Output::Created { statement: label, definition: view.def().sql.clone() })
}

/// Runs `CREATE STREAM … AS SELECT`: creates the output stream with `stream_options` and starts
/// the transform.
pub(crate) async fn execute_create_transform(
    engine: &Engine,
    def: &TransformDef,
    stream_options: &StreamOptions,
    if_not_exists: bool,
    label: String,
) -> Result<Output, SqlError> {
    let resolved;
    let def = if def.branches().any(|branch| !branch.lookups.is_empty()) {
        resolved = enrich::resolve(engine, def)?;
        &resolved
    } else {
        def
    };
    let output = crate::execute::stream_def(engine, &def.name, stream_options);
    if let Some(existing) = engine.transform(&def.name) {
        let same = existing.def() == def && existing.output().def() == &output;
        let note = "the stream exists, computed by this transform";
        if let Some(output) = already_defined(&label, &existing.def().sql, same, if_not_exists, note) {
            return Ok(output);
        }
    } else if if_not_exists && let Ok(existing) = engine.stream(&def.name) {
        return Ok(Output::Unchanged {
            statement: label,
            definition: existing.def().describe(),
            note: "IF NOT EXISTS: a stream of this name exists (written directly, not by a transform)".into(),
        });
    }
    let transform = engine.create_transform(def.clone(), output).await?;
    Ok(Output::Created { statement: label, definition: transform.def().sql.clone() })
}

/// What a CREATE of something that exists answers: unchanged when the definition is the same
/// (`note` says so) or IF NOT EXISTS keeps the existing one; `None` when it must be refused.
fn already_defined(label: &str, existing_sql: &str, same: bool, if_not_exists: bool, note: &str) -> Option<Output> {
    let note = if same {
        note
    } else if if_not_exists {
        "IF NOT EXISTS: the existing definition is kept"
    } else {
        return None;
    };
    Some(Output::Unchanged { statement: label.to_string(), definition: existing_sql.to_string(), note: note.into() })
}

/// The text between two token locations (line and column, 1-based, in characters), trimmed.
fn statement_text(sql: &str, start: Location, end: Location) -> String {
    let offset = |location: Location| {
        let (mut line, mut column) = (1, 1);
        for (offset, c) in sql.char_indices() {
            if (line, column) == (location.line, location.column) {
                return offset;
            }
            if c == '\n' {
                line += 1;
                column = 1;
            } else {
                column += 1;
            }
        }
        sql.len()
    };
    let (start, end) = (offset(start), offset(end));
    sql.get(start..end.max(start)).unwrap_or(sql).trim().to_string()
}

fn view_def(name: String, options: &[SqlOption], query: &ast::Query, sql: String) -> Result<ViewDef, SqlError> {
    let select = plain_select(query, VIEW_SHAPE)?;
    let joins = matches!(select.from.as_slice(), [from] if !from.joins.is_empty());
    if is_join_view(select) || joins {
        return join::join_view_def(name, options, select, sql);
    }
    let (source, window, time_column) = view_source(&select.from)?;
    if source == name {
        return Err(invalid(format!("view {name} cannot read itself")));
    }
    let filter = select.selection.as_ref().map(convert_expr).transpose()?;
    let group_by = group_by(select)?;
    let (key, columns) = view_columns(&select.projection, group_by)?;
    let mut def = ViewDef { window, event_time: time_column, filter, key, columns, ..with_defaults(name, source, sql) };
    apply_view_options(&mut def, options)?;
    Ok(def)
}

#[cfg(test)]
mod tests {
    use onehop_engine::view::expr::BinaryOp;
    use onehop_engine::view::{AggregateKind, Column, Expr, Window};
    use serde_json::json;

    use super::testing::{error, lit, path, view};
    use super::*;
    use crate::parse;

    #[test]
    fn a_tumbling_view_with_defaults() {
        let sql = "CREATE STREAM orders;\n  CREATE VIEW revenue AS\n    SELECT region, COUNT(*), SUM(amount) AS total \
                   FROM TUMBLE(orders, INTERVAL '5' SECOND) WHERE status = 'paid' GROUP BY region ;\nSHOW STREAMS";
        let statements = parse(sql).unwrap();
        assert_eq!(statements.len(), 3);
        let Statement::CreateView { def, if_not_exists } = &statements[1] else { panic!("{statements:?}") };
        assert!(!if_not_exists);
        assert_eq!(
            *def,
            ViewDef {
                name: "revenue".into(),
                source: "orders".into(),
                window: Window::Tumble { size_ms: 5000 },
                event_time: None,
                filter: Some(Expr::Binary {
                    operator: BinaryOp::Eq,
                    left: Box::new(path(&["status"])),
                    right: Box::new(lit(json!("paid"))),
                }),
                key: path(&["region"]),
                columns: vec![
                    Column::Key { name: "region".into() },
                    Column::Aggregate {
                        name: "count".into(),
                        function: AggregateKind::Count,
                        arg: None,
                        order_by: Vec::new()
                    },
                    Column::Aggregate {
                        name: "total".into(),
                        function: AggregateKind::Sum,
                        arg: Some(path(&["amount"])),
                        order_by: Vec::new(),
                    },
                ],
                grace_ms: DEFAULT_GRACE_MS,
                emit_changes: true,
                emit_final: false,
                retention_ms: DEFAULT_RETENTION_MS,
                start: Start::Latest,
                late_stream: None,
                sql: "CREATE VIEW revenue AS\n    SELECT region, COUNT(*), SUM(amount) AS total FROM TUMBLE(orders, \
                      INTERVAL '5' SECOND) WHERE status = 'paid' GROUP BY region"
                    .into(),
                join: None,
            }
        );
        assert_eq!(statements[1].label(), "CREATE VIEW revenue");
        let def = view("create view if not exists v as select count(*) from s group by 'all'");
        assert_eq!(def.window, Window::None);
        assert_eq!(def.key, lit(json!("all")));
        assert_eq!(def.sql, "create view if not exists v as select count(*) from s group by 'all'");
        assert!(matches!(
            parse("CREATE VIEW IF NOT EXISTS v AS SELECT COUNT(*) FROM s GROUP BY key").unwrap()[0],
            Statement::CreateView { if_not_exists: true, .. }
        ));
        // Text with multi-byte characters before it is cut at the right place.
        let def =
            view("CREATE VIEW v AS SELECT COUNT(*) AS \"nombre d'événements\" FROM s WHERE name = 'é' GROUP BY key");
        assert!(def.sql.ends_with("GROUP BY key"), "{}", def.sql);
        assert_eq!(def.columns[0].name(), "nombre d'événements");
    }

    #[test]
    fn view_errors_say_what_is_supported() {
        let cases = [
            ("SELECT key, COUNT(*) FROM a FULL JOIN b ON a.x = b.x GROUP BY key", "FULL JOIN is not supported here"),
            (
                "SELECT key, COUNT(*) FROM TUMBLE(a, '1s') JOIN b ON a.x = b.x GROUP BY key",
                "TUMBLE(a, '1s') is not supported here; a joined view is",
            ),
            ("SELECT key, COUNT(*) FROM a, b GROUP BY key", "several sources in FROM"),
            ("SELECT key, COUNT(*) FROM (SELECT * FROM a) GROUP BY key", "a subquery in FROM"),
            ("SELECT key, COUNT(*) FROM orders o GROUP BY key", "fields are named directly"),
            (
                "SELECT key, COUNT(*) FROM WINDOWED(s, '1s') GROUP BY key",
                "FROM WINDOWED(…) is not supported here; views aggregate one source",
            ),
            (
                "SELECT key, COUNT(*) FROM TUMBLE(s) GROUP BY key",
                "TUMBLE takes TUMBLE(source, [time_column,] size); 1 arguments",
            ),
            ("SELECT key, COUNT(*) FROM TUMBLE(s, a, b, '1s') GROUP BY key", "TUMBLE takes"),
            ("SELECT key, COUNT(*) FROM TUMBLE('s', '1s') GROUP BY key", "names the source stream"),
            ("SELECT key, COUNT(*) FROM HOP(s, '1m', '10s') GROUP BY key", "the slide must be at most the size"),
            ("SELECT key, COUNT(*) FROM HOP(s, '20s', '50s') GROUP BY key", "whole multiple of its slide"),
            (
                "SELECT key, COUNT(*) FROM s GROUP BY key ORDER BY key",
                "ORDER BY is not supported here; a view is CREATE VIEW",
            ),
            ("SELECT key, COUNT(*) FROM s GROUP BY key LIMIT 5", "LIMIT, OFFSET or FETCH"),
            ("SELECT key, COUNT(*) FROM s GROUP BY key HAVING COUNT(*) > 1", "HAVING"),
            ("SELECT DISTINCT key FROM s GROUP BY key", "SELECT DISTINCT"),
            ("SELECT key, COUNT(*) FROM s GROUP BY key UNION SELECT key, COUNT(*) FROM t GROUP BY key", "UNION"),
            ("WITH t AS (SELECT 1) SELECT key, COUNT(*) FROM s GROUP BY key", "common table expression"),
            ("SELECT key, COUNT(*) FROM s", "a view needs GROUP BY key"),
            (
                "SELECT a, b, COUNT(*) FROM s GROUP BY a, b",
                "GROUP BY of several expressions is not supported here; a view groups by one expression",
            ),
            ("SELECT a, COUNT(*) FROM s GROUP BY ROLLUP (a)", "groups by one expression"),
            ("SELECT b, COUNT(*) FROM s GROUP BY a", "b is neither the GROUP BY expression (a) nor an aggregate"),
            ("SELECT a, a, COUNT(*) FROM s GROUP BY a", "selected twice"),
            ("SELECT a, COUNT(*) AS a FROM s GROUP BY a", "two columns are named a"),
            ("SELECT COUNT(*), COUNT(*) FROM s GROUP BY a", "two columns are named count"),
            (
                "SELECT window_start, COUNT(*) FROM TUMBLE(s, '1s') GROUP BY a",
                "window_start and window_end come automatically",
            ),
            ("SELECT COUNT(*) AS window_end FROM TUMBLE(s, '1s') GROUP BY a", "come automatically"),
            ("SELECT a, COUNT(*) AS final FROM s GROUP BY a", "every row of a view carries \"final\""),
            ("SELECT removed, COUNT(*) FROM s GROUP BY removed", "name the column otherwise"),
            ("SELECT * FROM s GROUP BY a", "SELECT * in a view"),
            (
                "SELECT SUM(x) / COUNT(*) FROM s GROUP BY a",
                "SUM() inside an expression or WHERE is not supported here; an aggregate is a whole column",
            ),
            ("SELECT COUNT(*) FROM s WHERE MAX(x) > 1 GROUP BY a", "MAX() inside an expression"),
            ("SELECT SUM(DISTINCT x) FROM s GROUP BY a", "only COUNT takes DISTINCT"),
            ("SELECT SUM(*) FROM s GROUP BY a", "SUM takes one expression"),
            ("SELECT SUM(a, b) FROM s GROUP BY a", "SUM takes one expression"),
            ("SELECT COUNT(DISTINCT *) FROM s GROUP BY a", "COUNT takes COUNT(*)"),
            ("SELECT SUM(x) FILTER (WHERE x > 1) FROM s GROUP BY a", "filter the events with the view's WHERE"),
            ("SELECT SUM(x) OVER () FROM s GROUP BY a", "window functions (OVER)"),
            (
                "SELECT MEDIAN(x) FROM s GROUP BY a",
                "the function MEDIAN() is not supported here; the functions are UPPER",
            ),
            ("SELECT COUNT(*) FROM s WHERE x IN (SELECT y FROM t) GROUP BY a", "a subquery"),
            (
                "SELECT COUNT(*) FROM s WHERE x @> 'a' GROUP BY a",
                "the operator @> is not supported here; expressions are literals",
            ),
            ("SELECT COUNT(*) FROM v GROUP BY a", "view v cannot read itself"),
            ("SELECT COUNT(*) FROM s.t GROUP BY a", "no schemas"),
        ];
        for (select, fragment) in cases {
            let message = error(&format!("CREATE VIEW v AS {select}"));
            assert!(message.contains(fragment), "{select}\n  gave: {message}\n  wanted: {fragment}");
        }
        assert!(error("CREATE VIEW v (a) AS SELECT COUNT(*) FROM s GROUP BY a").starts_with("syntax error"));
        assert!(error("CREATE VIEW v SELECT COUNT(*) FROM s GROUP BY a").starts_with("syntax error"));
        assert!(error("CREATE VIEW a.v AS SELECT COUNT(*) FROM s GROUP BY a").contains("no schemas"));
        let codes = |sql: &str| parse(sql).unwrap_err().code();
        assert_eq!(
            codes("CREATE VIEW v AS SELECT COUNT(*) FROM a RIGHT JOIN b ON x = y GROUP BY k"),
            "sql_unsupported"
        );
        assert_eq!(codes("CREATE VIEW v AS SELECT b, COUNT(*) FROM s GROUP BY a"), "sql_invalid_query");
        assert_eq!(codes("CREATE VIEW v WITH (x = 1) AS SELECT COUNT(*) FROM s GROUP BY a"), "sql_invalid_option");
    }
}
