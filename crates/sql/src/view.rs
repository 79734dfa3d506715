//! `CREATE VIEW … AS SELECT …` and `CREATE STREAM … AS SELECT …`: sqlparser's query AST to the
//! engine's [`ViewDef`] and [`TransformDef`], and SQL expressions to the engine's [`Expr`].
//!
//! Everything outside the dialect is refused here, when the statement is parsed, with what is
//! supported instead; the engine only ever sees definitions it can run. docs/sql.md ("Views
//! and transforms") describes the dialect this module accepts.

use onehop_engine::Engine;
use onehop_engine::units::parse_duration;
use onehop_engine::view::expr::{
    BinaryOp, CastType, FUNCTION_NAMES, Function, IsTest, RecordField, Step, UnaryOp, When,
};
use onehop_engine::view::{
    AggregateKind, Column, DEFAULT_GRACE_MS, DEFAULT_RETENTION_MS, Expr, Start, TransformDef, ViewDef, Window,
};
use serde_json::{Number, Value};
use sqlparser::ast::{self, SqlOption};
use sqlparser::dialect::GenericDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Location, Token};

use crate::SqlError;
use crate::execute::Output;
use crate::parse::{Statement, StreamOptions, literal, simple_name, syntax};

/// What a view looks like, for errors.
const VIEW_SHAPE: &str = "a view is CREATE VIEW name [WITH (…)] AS SELECT [key,] aggregates \
     FROM source | TUMBLE|HOP|SLIDING|SESSION(source, …) [WHERE condition] GROUP BY key";
/// What a view's FROM looks like, for errors.
const SOURCE_SHAPE: &str =
    "views aggregate one source: FROM source or FROM TUMBLE|HOP|SLIDING|SESSION(source, [time_column,] …)";
/// What a transform looks like, for errors.
const TRANSFORM_SHAPE: &str = "a transform is CREATE STREAM name [WITH (…)] AS SELECT [*,] expression [AS name], … \
     FROM source [WHERE condition]";
/// The aggregates of a view's SELECT list.
const AGGREGATES: &str = "COUNT(*), COUNT(x), COUNT(DISTINCT x), SUM(x), AVG(x), MIN(x), MAX(x), FIRST(x), LAST(x)";
/// Columns every windowed view row gets from the runtime.
const WINDOW_COLUMNS: [&str; 2] = ["window_start", "window_end"];
/// The flags every row of a view's changes carries beside its columns.
const FLAG_COLUMNS: [&str; 2] = ["final", "removed"];
/// Output columns of a transform that set the record's key and subject instead of a field.
const KEY_COLUMN: &str = "_key";
const SUBJECT_COLUMN: &str = "_subject";

/// What expressions may contain, for errors.
fn expressions() -> String {
    format!(
        "expressions are literals, fields (key, subject, ts, partition, offset, value, name, a.b.c, \
         value->'a'->>'b'), + - * / %, = <> < <= > >=, AND, OR, NOT, IS [NOT] NULL|TRUE|FALSE, [NOT] IN (…), \
         [NOT] LIKE|ILIKE, [NOT] BETWEEN, CASE, CAST(x AS TEXT|BIGINT|DOUBLE|BOOLEAN), || and the functions \
         {FUNCTION_NAMES}"
    )
}

fn unsupported(what: impl std::fmt::Display, supported: impl Into<String>) -> SqlError {
    SqlError::UnsupportedQuery { what: what.to_string(), supported: supported.into() }
}

fn invalid(message: impl Into<String>) -> SqlError {
    SqlError::InvalidQuery(message.into())
}

// --- Statements ---------------------------------------------------------------------------

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

/// Runs `CREATE VIEW`.
pub(crate) async fn execute_create_view(
    engine: &Engine,
    def: &ViewDef,
    if_not_exists: bool,
    label: String,
) -> Result<Output, SqlError> {
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

// --- Views --------------------------------------------------------------------------------

fn view_def(name: String, options: &[SqlOption], query: &ast::Query, sql: String) -> Result<ViewDef, SqlError> {
    let select = plain_select(query, VIEW_SHAPE)?;
    let (source, window, time_column) = view_source(&select.from)?;
    if source == name {
        return Err(invalid(format!("view {name} cannot read itself")));
    }
    let filter = select.selection.as_ref().map(convert_expr).transpose()?;
    let group_by = group_by(select)?;
    let (key, columns) = view_columns(&select.projection, group_by)?;
    let mut def = ViewDef {
        name,
        source,
        window,
        event_time: time_column,
        filter,
        key,
        columns,
        grace_ms: DEFAULT_GRACE_MS,
        emit_changes: true,
        emit_final: false,
        retention_ms: DEFAULT_RETENTION_MS,
        start: Start::Latest,
        late_stream: None,
        sql,
    };
    apply_view_options(&mut def, options)?;
    Ok(def)
}

/// A query that is one plain `SELECT … FROM … [WHERE …] [GROUP BY …]`.
fn plain_select<'q>(query: &'q ast::Query, shape: &str) -> Result<&'q ast::Select, SqlError> {
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
    let select = match query.body.as_ref() {
        ast::SetExpr::Select(select) => select,
        ast::SetExpr::SetOperation { op, .. } => return refuse(&op.to_string()),
        ast::SetExpr::Query(_) => return refuse("a parenthesized query"),
        ast::SetExpr::Values(_) => return refuse("VALUES"),
        other => return refuse(&other.to_string()),
    };
    if select.distinct.is_some() {
        return refuse("SELECT DISTINCT (COUNT(DISTINCT x) counts distinct values)");
    }
    if select.having.is_some() {
        return refuse("HAVING");
    }
    if !select.named_window.is_empty() {
        return refuse("a WINDOW clause");
    }
    if select.top.is_some()
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
    {
        return refuse(&format!("{select}"));
    }
    Ok(select)
}

/// The one relation of FROM: its name and, for `TUMBLE(…)` and the like, the call's arguments.
fn source_relation<'q>(
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

/// FROM of a view: the source, the window, and the event time a window function names.
fn view_source(from: &[ast::TableWithJoins]) -> Result<(String, Window, Option<Expr>), SqlError> {
    let (name, args) = source_relation(from, SOURCE_SHAPE)?;
    let Some(args) = args else {
        return Ok((simple_name(name)?, Window::None, None));
    };
    let function = simple_name(name)?.to_ascii_uppercase();
    let (durations_wanted, form) = match function.as_str() {
        "TUMBLE" => (1, "TUMBLE(source, [time_column,] size)"),
        "HOP" => (2, "HOP(source, [time_column,] slide, size)"),
        "SLIDING" => (1, "SLIDING(source, [time_column,] size)"),
        "SESSION" => (1, "SESSION(source, [time_column,] gap)"),
        _ => return Err(unsupported(format!("FROM {name}(…)"), SOURCE_SHAPE)),
    };
    if args.settings.is_some() {
        return Err(unsupported(format!("SETTINGS in {function}"), form));
    }
    let args = args
        .args
        .iter()
        .map(|arg| match arg {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(expr)) => Ok(expr),
            other => Err(invalid(format!("{function} takes plain arguments, {form}; found {other}"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let Some((source, rest)) = args.split_first() else {
        return Err(invalid(format!("{function} needs its arguments: {form}")));
    };
    let source = match source {
        ast::Expr::Identifier(ident) => ident.value.clone(),
        other => {
            return Err(invalid(format!(
                "the first argument of {function} names the source stream, found {other}: {form}"
            )));
        }
    };
    if rest.len() != durations_wanted && rest.len() != durations_wanted + 1 {
        return Err(invalid(format!("{function} takes {form}; {} arguments were given", args.len())));
    }
    let (time_column, durations) = match rest.split_first() {
        Some((time_column, durations)) if rest.len() > durations_wanted => {
            (Some(convert_expr(time_column)?), durations)
        }
        _ => (None, rest),
    };
    let durations = durations.iter().map(|duration| duration_ms(duration)).collect::<Result<Vec<_>, _>>()?;
    let window = match (function.as_str(), durations.as_slice()) {
        ("TUMBLE", [size_ms]) => Window::Tumble { size_ms: *size_ms },
        ("HOP", [slide_ms, size_ms]) => {
            if slide_ms > size_ms {
                return Err(invalid(format!(
                    "HOP slide ({slide_ms} ms) is longer than its size ({size_ms} ms): events between windows \
                     would count nowhere; the slide must be at most the size (for gaps, filter with WHERE)"
                )));
            }
            if size_ms % slide_ms != 0 {
                return Err(invalid(format!(
                    "HOP size ({size_ms} ms) must be a whole multiple of its slide ({slide_ms} ms), so that \
                     every event is in the same number of windows (size / slide)"
                )));
            }
            Window::Hop { slide_ms: *slide_ms, size_ms: *size_ms }
        }
        ("SLIDING", [size_ms]) => Window::Sliding { size_ms: *size_ms },
        ("SESSION", [gap_ms]) => Window::Session { gap_ms: *gap_ms },
        _ => unreachable!("the argument count was checked against the window function"),
    };
    Ok((source, window, time_column))
}

/// A window length: `INTERVAL '5' SECOND`, `INTERVAL '5 seconds'` or `'5s'`, in ms.
fn duration_ms(expr: &ast::Expr) -> Result<u64, SqlError> {
    let text = match expr {
        ast::Expr::Interval(interval) => interval_text(interval)?,
        ast::Expr::Value(value) => match string_value(&value.value) {
            Some(text) => text.to_string(),
            None => return Err(not_a_duration(expr)),
        },
        _ => return Err(not_a_duration(expr)),
    };
    let duration = parse_duration(&text).map_err(|reason| invalid(format!("{expr}: {reason}")))?;
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return Err(invalid(format!("{expr} is shorter than a millisecond: windows are at least 1 ms")));
    }
    Ok(ms)
}

fn not_a_duration(expr: &ast::Expr) -> SqlError {
    invalid(format!("{expr} is not a duration: write INTERVAL '5' SECOND, INTERVAL '5 seconds' or '5s'"))
}

/// An INTERVAL as text `parse_duration` reads.
fn interval_text(interval: &ast::Interval) -> Result<String, SqlError> {
    const UNITS: &str = "one unit of MILLISECOND, SECOND, MINUTE, HOUR, DAY or WEEK (INTERVAL '90' SECOND), \
         or units in the text (INTERVAL '1 minute 30 seconds')";
    if interval.last_field.is_some() || interval.fractional_seconds_precision.is_some() {
        return Err(unsupported(format!("INTERVAL {interval}"), UNITS));
    }
    let value = match interval.value.as_ref() {
        ast::Expr::Value(value) => match &value.value {
            ast::Value::Number(number, _) => number.clone(),
            other => string_value(other).ok_or_else(|| not_a_duration(&interval.value))?.to_string(),
        },
        other => return Err(not_a_duration(other)),
    };
    let Some(field) = &interval.leading_field else {
        // SQL reads units in any case; parse_duration wants them in lower case.
        return Ok(value.to_lowercase());
    };
    use ast::DateTimeField as Field;
    let unit = match field {
        Field::Millisecond | Field::Milliseconds => "ms",
        Field::Second | Field::Seconds => "s",
        Field::Minute | Field::Minutes => "m",
        Field::Hour | Field::Hours => "h",
        Field::Day | Field::Days => "d",
        Field::Week(_) | Field::Weeks => "w",
        other => return Err(unsupported(format!("INTERVAL in {other}"), UNITS)),
    };
    Ok(format!("{value} {unit}"))
}

/// The one GROUP BY expression of a view.
fn group_by(select: &ast::Select) -> Result<&ast::Expr, SqlError> {
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
fn view_columns(projection: &[ast::SelectItem], group_by: &ast::Expr) -> Result<(Expr, Vec<Column>), SqlError> {
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
            Some((function, arg, default_name)) => {
                Column::Aggregate { name: alias.unwrap_or(default_name), function, arg }
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

/// An aggregate of a view's SELECT list: its function, argument (`None` for `COUNT(*)`), and
/// default column name (`count`, `sum_amount`, `count_distinct_user`). `None`: not an aggregate.
fn aggregate(expr: &ast::Expr) -> Result<Option<(AggregateKind, Option<Expr>, String)>, SqlError> {
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
            if list.clauses.is_empty()
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
    match list.args.as_slice() {
        [ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard)] if kind == AggregateKind::Count && !distinct => {
            Ok(Some((AggregateKind::Count, None, prefix)))
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
            Ok(Some((kind, Some(convert_expr(arg)?), default_name)))
        }
        _ => {
            let form =
                if kind == AggregateKind::Count { "COUNT(*), COUNT(x) or COUNT(DISTINCT x)" } else { "one expression" };
            Err(invalid(format!("{expr}: {upper} takes {form}")))
        }
    }
}

fn aggregate_kind(name: &str) -> Option<AggregateKind> {
    const KINDS: [(&str, AggregateKind); 7] = [
        ("count", AggregateKind::Count),
        ("sum", AggregateKind::Sum),
        ("avg", AggregateKind::Avg),
        ("min", AggregateKind::Min),
        ("max", AggregateKind::Max),
        ("first", AggregateKind::First),
        ("last", AggregateKind::Last),
    ];
    KINDS.iter().find(|(kind_name, _)| kind_name.eq_ignore_ascii_case(name)).map(|(_, kind)| *kind)
}

/// The name a column gets from its expression when it has no alias: a field's name
/// (`amount`, the last part of `customer.city`, the last key of `value->'a'->>'b'`).
fn column_name(expr: &ast::Expr) -> Option<String> {
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

fn apply_view_options(def: &mut ViewDef, options: &[SqlOption]) -> Result<(), SqlError> {
    for option in options {
        let SqlOption::KeyValue { key, value } = option else {
            return Err(SqlError::InvalidOption(format!("{option}: expected key = value")));
        };
        let key = key.value.to_ascii_lowercase();
        let text = literal(value)
            .ok_or_else(|| SqlError::InvalidOption(format!("{key} = {value}: expected a number or a string")))?;
        let invalid_option = |reason: String| SqlError::InvalidOption(format!("{key} = {text:?}: {reason}"));
        let duration_ms =
            || parse_duration(&text).map(|duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX));
        match key.as_str() {
            "grace" => def.grace_ms = duration_ms().map_err(invalid_option)?,
            "retention" => def.retention_ms = duration_ms().map_err(invalid_option)?,
            "emit" => {
                let (mut changes, mut final_) = (false, false);
                for part in text.split(',') {
                    match part.trim().to_ascii_lowercase().as_str() {
                        "changes" => changes = true,
                        "final" => final_ = true,
                        _ => return Err(invalid_option("expected 'changes', 'final' or 'changes,final'".into())),
                    }
                }
                (def.emit_changes, def.emit_final) = (changes, final_);
            }
            "start" => {
                def.start = match text.to_ascii_lowercase().as_str() {
                    "earliest" => Start::Earliest,
                    "latest" => Start::Latest,
                    _ => return Err(invalid_option("expected 'earliest' or 'latest'".into())),
                };
            }
            "late_stream" => {
                onehop_engine::validate_name(&text).map_err(|error| invalid_option(error.to_string()))?;
                if text == def.source || text == def.name {
                    return Err(invalid_option(
                        "late events go to another stream than the view's source or the view itself".into(),
                    ));
                }
                def.late_stream = Some(text.clone());
            }
            "event_time" => {
                if def.event_time.is_some() {
                    return Err(invalid_option(
                        "the window function names the time column already; give it once".into(),
                    ));
                }
                def.event_time = Some(parse_expression(&text).map_err(|error| invalid_option(error.to_string()))?);
            }
            other => {
                return Err(SqlError::InvalidOption(format!(
                    "unknown option {other:?}; a view takes grace, emit, retention, start, late_stream and event_time"
                )));
            }
        }
    }
    if def.window == Window::None {
        let refuse = |what: &str| {
            Err(SqlError::InvalidOption(format!(
                "{what} needs a window (FROM TUMBLE|HOP|SLIDING|SESSION(…)): running totals never close"
            )))
        };
        if def.emit_final {
            return refuse("emit = 'final'");
        }
        if def.grace_ms > 0 {
            return refuse("grace");
        }
        if def.late_stream.is_some() {
            return refuse("late_stream");
        }
    }
    Ok(())
}

/// One expression from text (the `event_time` option).
fn parse_expression(text: &str) -> Result<Expr, SqlError> {
    let dialect = GenericDialect {};
    let mut parser = Parser::new(&dialect).try_with_sql(text).map_err(syntax)?;
    let expr = parser.parse_expr().map_err(syntax)?;
    if parser.peek_token().token != Token::EOF {
        return Err(SqlError::Syntax(format!("one expression expected, found more: {}", parser.peek_token())));
    }
    convert_expr(&expr)
}

// --- Transforms ---------------------------------------------------------------------------

fn transform_def(name: String, query: &ast::Query, sql: String) -> Result<TransformDef, SqlError> {
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
                if options.opt_ilike.is_some()
                    || options.opt_exclude.is_some()
                    || options.opt_except.is_some()
                    || options.opt_replace.is_some()
                    || options.opt_rename.is_some()
                    || options.opt_alias.is_some()
                {
                    return Err(unsupported(item, "a transform takes a plain *"));
                }
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
fn output_name(expr: &ast::Expr) -> Option<String> {
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

// --- Expressions --------------------------------------------------------------------------

/// A SQL expression as the engine's. Aggregates are not expressions: a view's SELECT list takes
/// them whole, and anywhere else they are refused.
pub(crate) fn convert_expr(expr: &ast::Expr) -> Result<Expr, SqlError> {
    use ast::Expr as Sql;
    let boxed = |expr: &ast::Expr| convert_expr(expr).map(Box::new);
    Ok(match expr {
        Sql::Identifier(ident) => identifier(ident),
        Sql::CompoundIdentifier(parts) => {
            // A dotted name is a path into the value; a leading `value.` may be written.
            let parts = match parts.split_first() {
                Some((first, rest)) if is_value(first) => rest,
                _ => parts.as_slice(),
            };
            Expr::Path { path: parts.iter().map(|part| Step::Field(part.value.clone())).collect() }
        }
        Sql::CompoundFieldAccess { root, access_chain } => {
            let mut steps = Vec::with_capacity(access_chain.len());
            for access in access_chain {
                steps.push(match access {
                    ast::AccessExpr::Dot(Sql::Identifier(ident)) => Step::Field(ident.value.clone()),
                    ast::AccessExpr::Subscript(ast::Subscript::Index { index }) => step(index)?,
                    other => return Err(unsupported(other, expressions())),
                });
            }
            get(convert_expr(root)?, steps, false)
        }
        Sql::Nested(inner) => convert_expr(inner)?,
        Sql::Value(value) => Expr::Literal { value: literal_value(&value.value)? },
        Sql::UnaryOp { op, expr } => match op {
            ast::UnaryOperator::Minus => negate(convert_expr(expr)?),
            ast::UnaryOperator::Plus => convert_expr(expr)?,
            ast::UnaryOperator::Not => Expr::Unary { operator: UnaryOp::Not, expr: boxed(expr)? },
            other => return Err(unsupported(format!("the operator {other}"), expressions())),
        },
        Sql::BinaryOp { left, op, right } => match op {
            ast::BinaryOperator::Arrow => get(convert_expr(left)?, vec![step(right)?], false),
            ast::BinaryOperator::LongArrow => get(convert_expr(left)?, vec![step(right)?], true),
            op => Expr::Binary { operator: binary_operator(op)?, left: boxed(left)?, right: boxed(right)? },
        },
        Sql::IsNull(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::Null, negated: false },
        Sql::IsNotNull(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::Null, negated: true },
        Sql::IsUnknown(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::Null, negated: false },
        Sql::IsNotUnknown(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::Null, negated: true },
        Sql::IsTrue(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::True, negated: false },
        Sql::IsNotTrue(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::True, negated: true },
        Sql::IsFalse(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::False, negated: false },
        Sql::IsNotFalse(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::False, negated: true },
        Sql::InList { expr, list, negated } => Expr::In {
            expr: boxed(expr)?,
            list: list.iter().map(convert_expr).collect::<Result<_, _>>()?,
            negated: *negated,
        },
        Sql::Between { expr, negated, low, high } => {
            Expr::Between { expr: boxed(expr)?, low: boxed(low)?, high: boxed(high)?, negated: *negated }
        }
        Sql::Like { negated, any, expr, pattern, escape_char } => {
            like(expr, pattern, *negated, *any, escape_char, false)?
        }
        Sql::ILike { negated, any, expr, pattern, escape_char } => {
            like(expr, pattern, *negated, *any, escape_char, true)?
        }
        Sql::Case { operand, conditions, else_result, .. } => Expr::Case {
            operand: operand.as_deref().map(boxed).transpose()?,
            branches: conditions
                .iter()
                .map(|branch| Ok(When { when: convert_expr(&branch.condition)?, then: convert_expr(&branch.result)? }))
                .collect::<Result<_, SqlError>>()?,
            otherwise: else_result.as_deref().map(boxed).transpose()?,
        },
        Sql::Cast { expr, data_type, format: None, .. } => Expr::Cast { expr: boxed(expr)?, to: cast_type(data_type)? },
        Sql::Function(function) => call(expr, function)?,
        Sql::Substring { expr: text, substring_from, substring_for, .. } => {
            let start = match (substring_from, substring_for) {
                (Some(start), _) => convert_expr(start)?,
                (None, Some(_)) => Expr::Literal { value: Value::from(1) },
                (None, None) => {
                    return Err(invalid(format!(
                        "SUBSTRING takes (text, start [, length]) or (text FROM start [FOR length]): {expr}"
                    )));
                }
            };
            let mut args = vec![convert_expr(text)?, start];
            if let Some(length) = substring_for {
                args.push(convert_expr(length)?);
            }
            Expr::Call { function: Function::Substring, args }
        }
        Sql::Trim { trim_where, trim_what, expr, trim_characters } => {
            let function = match trim_where {
                None | Some(ast::TrimWhereField::Both) => Function::Trim,
                Some(ast::TrimWhereField::Leading) => Function::Ltrim,
                Some(ast::TrimWhereField::Trailing) => Function::Rtrim,
            };
            let characters = match (trim_what, trim_characters.as_deref()) {
                (Some(characters), None) => Some(characters.as_ref()),
                (None, Some([characters])) => Some(characters),
                (None, None) => None,
                _ => return Err(unsupported(expr, format!("{} takes (text [, characters])", function.name()))),
            };
            let mut args = vec![convert_expr(expr)?];
            if let Some(characters) = characters {
                args.push(convert_expr(characters)?);
            }
            Expr::Call { function, args }
        }
        Sql::Ceil { expr: inner, field } | Sql::Floor { expr: inner, field } => {
            let function = if matches!(expr, Sql::Ceil { .. }) { Function::Ceil } else { Function::Floor };
            match field {
                ast::CeilFloorKind::DateTimeField(ast::DateTimeField::NoDateTime) => {
                    Expr::Call { function, args: vec![convert_expr(inner)?] }
                }
                _ => return Err(unsupported(expr, format!("{} takes one number", function.name()))),
            }
        }
        Sql::Subquery(_) | Sql::Exists { .. } | Sql::InSubquery { .. } => {
            return Err(unsupported("a subquery", expressions()));
        }
        Sql::Interval(_) => {
            return Err(unsupported("INTERVAL outside a window function", expressions()));
        }
        other => return Err(unsupported(format!("the expression {other}"), expressions())),
    })
}

/// `value` written plainly (not quoted): the whole value.
fn is_value(ident: &ast::Ident) -> bool {
    ident.quote_style.is_none() && ident.value.eq_ignore_ascii_case("value")
}

/// A bare name: `value`, a record field, or a field of the value. A quoted name is always a
/// field of the value (`"key"` is the value's field `key`, not the record's key).
fn identifier(ident: &ast::Ident) -> Expr {
    if is_value(ident) {
        return Expr::Path { path: Vec::new() };
    }
    if ident.quote_style.is_none()
        && let Some(field) = RecordField::from_name(&ident.value)
    {
        return Expr::Record { field };
    }
    Expr::Path { path: vec![Step::Field(ident.value.clone())] }
}

/// `base->steps` (or `->>` with `text`), folding chains into one walk: `value->'a'->'b'` is the
/// path `a.b`, and `x->'a'->>'b'` walks `x` once.
fn get(base: Expr, mut steps: Vec<Step>, text: bool) -> Expr {
    match base {
        Expr::Path { mut path } if !text => {
            path.append(&mut steps);
            Expr::Path { path }
        }
        Expr::Get { base, mut path, text: false } => {
            path.append(&mut steps);
            Expr::Get { base, path, text }
        }
        base => Expr::Get { base: Box::new(base), path: steps, text },
    }
}

/// The right side of `->`/`->>` or a subscript: a field name or an array index, as a literal.
fn step(expr: &ast::Expr) -> Result<Step, SqlError> {
    match convert_expr(expr)? {
        Expr::Literal { value: Value::String(name) } => Ok(Step::Field(name)),
        Expr::Literal { value: Value::Number(number) } if number.as_i64().is_some() => {
            Ok(Step::Index(number.as_i64().unwrap_or_default()))
        }
        _ => Err(unsupported(
            format!("{expr} after -> or ->>"),
            "they take a literal field name or array index: value->'items'->0->>'sku'",
        )),
    }
}

fn string_value(value: &ast::Value) -> Option<&str> {
    match value {
        ast::Value::SingleQuotedString(text)
        | ast::Value::DoubleQuotedString(text)
        | ast::Value::EscapedStringLiteral(text)
        | ast::Value::UnicodeStringLiteral(text)
        | ast::Value::NationalStringLiteral(text) => Some(text),
        ast::Value::DollarQuotedString(quoted) => Some(&quoted.value),
        _ => None,
    }
}

fn literal_value(value: &ast::Value) -> Result<Value, SqlError> {
    match value {
        ast::Value::Number(text, _) => number_value(text).ok_or_else(|| invalid(format!("{text} is not a number"))),
        ast::Value::Boolean(truth) => Ok(Value::Bool(*truth)),
        ast::Value::Null => Ok(Value::Null),
        other => match string_value(other) {
            Some(text) => Ok(Value::String(text.to_string())),
            None => {
                Err(unsupported(format!("the literal {other}"), "literals are numbers, 'text', TRUE, FALSE and NULL"))
            }
        },
    }
}

/// A numeric literal: an integer when it is one (i64, or u64 above that), else a finite float.
fn number_value(text: &str) -> Option<Value> {
    if let Ok(int) = text.parse::<i64>() {
        return Some(Value::from(int));
    }
    if let Ok(int) = text.parse::<u64>() {
        return Some(Value::from(int));
    }
    let float = text.parse::<f64>().ok().filter(|float| float.is_finite())?;
    Number::from_f64(float).map(Value::Number)
}

/// `-x`, folded into a numeric literal (so `-9223372036854775808` is i64::MIN).
fn negate(expr: Expr) -> Expr {
    if let Expr::Literal { value: Value::Number(number) } = &expr {
        if let Some(negated) = number.as_i64().and_then(i64::checked_neg) {
            return Expr::Literal { value: Value::from(negated) };
        }
        if number.as_u64() == Some(1 << 63) {
            return Expr::Literal { value: Value::from(i64::MIN) };
        }
        if number.is_f64()
            && let Some(negated) = number.as_f64().and_then(|float| Number::from_f64(-float))
        {
            return Expr::Literal { value: Value::Number(negated) };
        }
    }
    Expr::Unary { operator: UnaryOp::Negate, expr: Box::new(expr) }
}

fn binary_operator(op: &ast::BinaryOperator) -> Result<BinaryOp, SqlError> {
    use ast::BinaryOperator as Sql;
    Ok(match op {
        Sql::Plus => BinaryOp::Add,
        Sql::Minus => BinaryOp::Subtract,
        Sql::Multiply => BinaryOp::Multiply,
        Sql::Divide => BinaryOp::Divide,
        Sql::Modulo => BinaryOp::Modulo,
        Sql::Eq => BinaryOp::Eq,
        Sql::NotEq => BinaryOp::NotEq,
        Sql::Lt => BinaryOp::Lt,
        Sql::LtEq => BinaryOp::LtEq,
        Sql::Gt => BinaryOp::Gt,
        Sql::GtEq => BinaryOp::GtEq,
        Sql::And => BinaryOp::And,
        Sql::Or => BinaryOp::Or,
        Sql::StringConcat => BinaryOp::Concat,
        other => return Err(unsupported(format!("the operator {other}"), expressions())),
    })
}

fn like(
    expr: &ast::Expr,
    pattern: &ast::Expr,
    negated: bool,
    any: bool,
    escape: &Option<Box<ast::Expr>>,
    case_insensitive: bool,
) -> Result<Expr, SqlError> {
    if any {
        return Err(unsupported("LIKE ANY", "LIKE takes one pattern; combine several with OR"));
    }
    // SQL's default escape character is a backslash; ESCAPE '' turns escaping off.
    let escape = match escape.as_deref() {
        None => Some('\\'),
        Some(ast::Expr::Value(value)) => {
            let text = string_value(&value.value).unwrap_or_default();
            let mut chars = text.chars();
            match (chars.next(), chars.next()) {
                (None, _) if string_value(&value.value).is_some() => None,
                (Some(c), None) => Some(c),
                _ => return Err(invalid(format!("ESCAPE {value}: the escape is one character in quotes"))),
            }
        }
        Some(other) => return Err(invalid(format!("ESCAPE {other}: the escape is one character in quotes"))),
    };
    Ok(Expr::Like {
        expr: Box::new(convert_expr(expr)?),
        pattern: Box::new(convert_expr(pattern)?),
        negated,
        case_insensitive,
        escape,
    })
}

fn cast_type(data_type: &ast::DataType) -> Result<CastType, SqlError> {
    let text = data_type.to_string().to_ascii_uppercase();
    // Lengths and precisions do not matter: VARCHAR(20) is TEXT.
    let plain = text.split('(').next().unwrap_or_default().trim();
    Ok(match plain {
        "TEXT" | "VARCHAR" | "CHARACTER VARYING" | "STRING" => CastType::Text,
        "BIGINT" | "INTEGER" | "INT" | "INT8" | "INT64" => CastType::Bigint,
        "DOUBLE" | "DOUBLE PRECISION" | "FLOAT" | "FLOAT8" | "FLOAT64" | "REAL" => CastType::Double,
        "BOOLEAN" | "BOOL" => CastType::Boolean,
        _ => {
            return Err(unsupported(
                format!("CAST to {data_type}"),
                "CAST takes TEXT (VARCHAR), BIGINT (INTEGER, INT), DOUBLE (FLOAT, REAL) and BOOLEAN",
            ));
        }
    })
}

/// A function's name, when it is a plain one.
fn function_name(function: &ast::Function) -> Option<String> {
    match function.name.0.as_slice() {
        [part] => part.as_ident().map(|ident| ident.value.clone()),
        _ => None,
    }
}

/// A scalar function call.
fn call(expr: &ast::Expr, function: &ast::Function) -> Result<Expr, SqlError> {
    let name =
        function_name(function).ok_or_else(|| unsupported(format!("the function {}", function.name), expressions()))?;
    let upper = name.to_ascii_uppercase();
    if aggregate_kind(&name).is_some() {
        return Err(unsupported(
            format!("{upper}() inside an expression or WHERE"),
            "an aggregate is a whole column of a view's SELECT list (SUM(amount) AS total); a stream transform has none",
        ));
    }
    let Some(scalar) = Function::from_name(&name) else {
        return Err(unsupported(format!("the function {upper}()"), format!("the functions are {FUNCTION_NAMES}")));
    };
    if function.over.is_some() {
        return Err(unsupported("window functions (OVER)", "views window their source in FROM"));
    }
    let args = match &function.args {
        ast::FunctionArguments::List(list)
            if list.duplicate_treatment.is_none()
                && list.clauses.is_empty()
                && function.filter.is_none()
                && function.within_group.is_empty()
                && function.null_treatment.is_none()
                && matches!(function.parameters, ast::FunctionArguments::None) =>
        {
            &list.args
        }
        ast::FunctionArguments::None => &Vec::new(),
        _ => return Err(unsupported(expr, format!("{upper} takes plain arguments: {upper}(x, …)"))),
    };
    let args = args
        .iter()
        .map(|arg| match arg {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(arg)) => convert_expr(arg),
            other => Err(unsupported(format!("the argument {other} of {upper}"), "arguments are expressions")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (min, max) = scalar.arity();
    if args.len() < min || max.is_some_and(|max| args.len() > max) {
        let wanted = match max {
            Some(max) if max == min => format!("{min}"),
            Some(max) => format!("{min} to {max}"),
            None => format!("at least {min}"),
        };
        return Err(invalid(format!("{upper} takes {wanted} argument(s), {} given: {expr}", args.len())));
    }
    Ok(Expr::Call { function: scalar, args })
}

#[cfg(test)]
mod tests {
    use onehop_engine::view::Input;
    use onehop_log::Durability;
    use serde_json::json;

    use super::*;
    use crate::parse;

    fn view(sql: &str) -> ViewDef {
        match parse(sql).unwrap_or_else(|error| panic!("{sql}: {error}")).remove(0) {
            Statement::CreateView { def, .. } => def,
            other => panic!("{other:?}"),
        }
    }

    fn transform(sql: &str) -> TransformDef {
        match parse(sql).unwrap_or_else(|error| panic!("{sql}: {error}")).remove(0) {
            Statement::CreateTransform { def, .. } => def,
            other => panic!("{other:?}"),
        }
    }

    fn error(sql: &str) -> String {
        match parse(sql) {
            Ok(statements) => panic!("{sql} parsed: {statements:?}"),
            Err(error) => error.to_string(),
        }
    }

    fn path(parts: &[&str]) -> Expr {
        Expr::Path { path: parts.iter().map(|part| Step::Field(part.to_string())).collect() }
    }

    fn lit(value: Value) -> Expr {
        Expr::Literal { value }
    }

    /// An expression's value for a record with key `k1`, subject `shop/eu`, ts 1000, partition
    /// 3, offset 42 and the given value.
    fn eval(text: &str, value: &Value) -> Value {
        let expr = parse_expression(text).unwrap_or_else(|error| panic!("{text}: {error}"));
        expr.eval(&Input {
            key: Some(b"k1"),
            subject: Some("shop/eu"),
            timestamp_ms: 1000,
            partition: 3,
            offset: 42,
            value,
        })
    }

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
                    Column::Aggregate { name: "count".into(), function: AggregateKind::Count, arg: None },
                    Column::Aggregate {
                        name: "total".into(),
                        function: AggregateKind::Sum,
                        arg: Some(path(&["amount"])),
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
    fn every_window_form() {
        let window = |from: &str| {
            let def = view(&format!("CREATE VIEW v AS SELECT key, COUNT(*) FROM {from} GROUP BY key"));
            (def.source, def.window, def.event_time)
        };
        assert_eq!(window("orders"), ("orders".into(), Window::None, None));
        assert_eq!(window("TUMBLE(orders, '1m')"), ("orders".into(), Window::Tumble { size_ms: 60_000 }, None));
        assert_eq!(
            window("tumble(orders, placed_at, '1m')"),
            ("orders".into(), Window::Tumble { size_ms: 60_000 }, Some(path(&["placed_at"])))
        );
        assert_eq!(
            window("HOP(orders, INTERVAL '10' SECOND, INTERVAL '1' MINUTE)"),
            ("orders".into(), Window::Hop { slide_ms: 10_000, size_ms: 60_000 }, None)
        );
        assert_eq!(
            window("Hop(orders, ts, '30s', '30s')"),
            (
                "orders".into(),
                Window::Hop { slide_ms: 30_000, size_ms: 30_000 },
                Some(Expr::Record { field: RecordField::Ts })
            )
        );
        assert_eq!(window("SLIDING(orders, '5m')"), ("orders".into(), Window::Sliding { size_ms: 300_000 }, None));
        assert_eq!(
            window("SLIDING(orders, payload.at, '5m')"),
            ("orders".into(), Window::Sliding { size_ms: 300_000 }, Some(path(&["payload", "at"])))
        );
        assert_eq!(window("SESSION(clicks, '30m')"), ("clicks".into(), Window::Session { gap_ms: 1_800_000 }, None));
        assert_eq!(
            window("SESSION(clicks, value->>'at', '30m')").2,
            Some(Expr::Get { base: Box::new(path(&[])), path: vec![Step::Field("at".into())], text: true })
        );
    }

    #[test]
    fn intervals() {
        let size = |duration: &str| {
            let def = view(&format!("CREATE VIEW v AS SELECT COUNT(*) FROM TUMBLE(s, {duration}) GROUP BY key"));
            let Window::Tumble { size_ms } = def.window else { panic!("{:?}", def.window) };
            size_ms
        };
        assert_eq!(size("INTERVAL '5' SECOND"), 5_000);
        assert_eq!(size("INTERVAL '5' SECONDS"), 5_000);
        assert_eq!(size("INTERVAL 5 SECOND"), 5_000);
        assert_eq!(size("INTERVAL '5 seconds'"), 5_000);
        assert_eq!(size("INTERVAL '5 SECONDS'"), 5_000);
        assert_eq!(size("INTERVAL '1' MINUTE"), 60_000);
        assert_eq!(size("INTERVAL '1 minute 30 seconds'"), 90_000);
        assert_eq!(size("INTERVAL '250' MILLISECOND"), 250);
        assert_eq!(size("INTERVAL '2' HOUR"), 7_200_000);
        assert_eq!(size("INTERVAL '1' DAY"), 86_400_000);
        assert_eq!(size("INTERVAL '1' WEEK"), 604_800_000);
        assert_eq!(size("'5s'"), 5_000);
        assert_eq!(size("'1h 30m'"), 5_400_000);
        assert_eq!(size("'1.5s'"), 1_500);
        let message = |duration: &str| {
            error(&format!("CREATE VIEW v AS SELECT COUNT(*) FROM TUMBLE(s, {duration}) GROUP BY key"))
        };
        assert!(message("5").contains("not a duration: write INTERVAL '5' SECOND"), "{}", message("5"));
        assert!(message("'soon'").contains("not a duration"), "{}", message("'soon'"));
        assert!(message("'0s'").contains("at least 1 ms"));
        assert!(message("'500us'").contains("shorter than a millisecond"));
        assert!(message("INTERVAL '1' MONTH").contains("MILLISECOND, SECOND, MINUTE"));
        assert!(message("INTERVAL '1:30' MINUTE TO SECOND").contains("one unit"));
        assert!(message("INTERVAL '5' SECOND + INTERVAL '1' SECOND").contains("not a duration"));
    }

    #[test]
    fn options_and_their_defaults() {
        let def = view(
            "CREATE VIEW v WITH (grace = '2s', emit = 'changes, final', retention = '1d', start = 'earliest', \
             late_stream = 'late_orders', event_time = 'payload.placed_at') \
             AS SELECT COUNT(*) FROM TUMBLE(orders, '1m') GROUP BY key",
        );
        assert_eq!(def.grace_ms, 2_000);
        assert!(def.emit_changes && def.emit_final);
        assert_eq!(def.retention_ms, 86_400_000);
        assert_eq!(def.start, Start::Earliest);
        assert_eq!(def.late_stream.as_deref(), Some("late_orders"));
        assert_eq!(def.event_time, Some(path(&["payload", "placed_at"])));
        let emit = |emit: &str| {
            let def = view(&format!(
                "CREATE VIEW v WITH (emit = '{emit}') AS SELECT COUNT(*) FROM TUMBLE(s, '1s') GROUP BY key"
            ));
            (def.emit_changes, def.emit_final)
        };
        assert_eq!(emit("changes"), (true, false));
        assert_eq!(emit("FINAL"), (false, true));
        assert_eq!(emit("final,changes"), (true, true));
        let def = view(
            "CREATE VIEW v WITH (event_time = 'CAST(ms AS BIGINT) * 1000', start = latest) AS SELECT COUNT(*) FROM s GROUP BY key",
        );
        assert!(matches!(def.event_time, Some(Expr::Binary { operator: BinaryOp::Multiply, .. })));
        assert_eq!(def.start, Start::Latest);
        let message = |options: &str| {
            error(&format!("CREATE VIEW v WITH ({options}) AS SELECT COUNT(*) FROM TUMBLE(s, '1s') GROUP BY key"))
        };
        assert!(
            message("colour = 'red'")
                .contains("a view takes grace, emit, retention, start, late_stream and event_time")
        );
        assert!(message("emit = 'sometimes'").contains("'changes', 'final' or 'changes,final'"));
        assert!(message("emit = ''").contains("'changes', 'final'"));
        assert!(message("start = 'now'").contains("'earliest' or 'latest'"));
        assert!(message("grace = 'a bit'").contains("grace = \"a bit\""));
        assert!(message("retention = 'forever'").contains("retention"));
        assert!(message("late_stream = 's'").contains("another stream than the view's source"));
        assert!(message("late_stream = '__late'").contains("reserved"));
        assert!(message("event_time = 'a +'").contains("syntax error"), "{}", message("event_time = 'a +'"));
        assert!(message("event_time = 'a b'").contains("one expression"));
        assert!(message("grace = ARRAY[1]").contains("expected a number or a string"));
        let both =
            error("CREATE VIEW v WITH (event_time = 'at') AS SELECT COUNT(*) FROM TUMBLE(s, at, '1s') GROUP BY key");
        assert!(both.contains("names the time column already"), "{both}");
        let running =
            |options: &str| error(&format!("CREATE VIEW v WITH ({options}) AS SELECT COUNT(*) FROM s GROUP BY key"));
        assert!(running("emit = 'final'").contains("needs a window"));
        assert!(running("grace = '1s'").contains("running totals never close"));
        assert!(running("late_stream = 'late'").contains("needs a window"));
        // A zero grace on running totals is no contradiction.
        assert_eq!(view("CREATE VIEW v WITH (grace = '0s') AS SELECT COUNT(*) FROM s GROUP BY key").grace_ms, 0);
    }

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
                },
                Column::Aggregate {
                    name: "revenue".into(),
                    function: AggregateKind::Sum,
                    arg: Some(Expr::Binary {
                        operator: BinaryOp::Multiply,
                        left: Box::new(path(&["price"])),
                        right: Box::new(path(&["qty"])),
                    }),
                },
            ]
        );
    }

    #[test]
    fn view_errors_say_what_is_supported() {
        let cases = [
            (
                "SELECT key, COUNT(*) FROM a JOIN b ON a.x = b.x GROUP BY key",
                "JOIN is not supported here; views aggregate one source: FROM source or FROM TUMBLE|HOP|SLIDING|SESSION",
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
                "SELECT COUNT(*) FROM s WHERE x ~ 'a' GROUP BY a",
                "the operator ~ is not supported here; expressions are literals",
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
        assert_eq!(codes("CREATE VIEW v AS SELECT COUNT(*) FROM a JOIN b ON x = y GROUP BY k"), "sql_unsupported");
        assert_eq!(codes("CREATE VIEW v AS SELECT b, COUNT(*) FROM s GROUP BY a"), "sql_invalid_query");
        assert_eq!(codes("CREATE VIEW v WITH (x = 1) AS SELECT COUNT(*) FROM s GROUP BY a"), "sql_invalid_option");
    }

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

    #[test]
    fn record_fields_paths_and_json_operators() {
        let value =
            json!({"region": "eu", "key": "value key", "customer": {"city": "Oslo", "tags": ["a", "b"]}, "n": 5});
        assert_eq!(eval("key", &value), json!("k1"));
        assert_eq!(eval("KEY", &value), json!("k1"));
        assert_eq!(eval("\"key\"", &value), json!("value key"));
        assert_eq!(eval("value.key", &value), json!("value key"));
        assert_eq!(eval("value->>'key'", &value), json!("value key"));
        assert_eq!(eval("subject", &value), json!("shop/eu"));
        assert_eq!(eval("ts", &value), json!(1000));
        assert_eq!(eval("partition", &value), json!(3));
        assert_eq!(eval("offset", &value), json!(42));
        assert_eq!(eval("value", &value), value);
        assert_eq!(eval("region", &value), json!("eu"));
        assert_eq!(eval("missing", &value), Value::Null);
        assert_eq!(eval("customer.city", &value), json!("Oslo"));
        assert_eq!(eval("value.customer.city", &value), json!("Oslo"));
        assert_eq!(eval("value->'customer'->'tags'->1", &value), json!("b"));
        assert_eq!(eval("value->'customer'->'tags'->-1", &value), json!("b"));
        assert_eq!(eval("customer->'tags'", &value), json!(["a", "b"]));
        assert_eq!(eval("customer->>'tags'", &value), json!("[\"a\",\"b\"]"));
        assert_eq!(eval("value->>'n'", &value), json!("5"));
        assert_eq!(eval("customer['city']", &value), json!("Oslo"));
        assert_eq!(eval("customer['tags'][0]", &value), json!("a"));
        // Folded into one walk of the value.
        assert_eq!(
            parse_expression("value->'customer'->'tags'->0").unwrap(),
            Expr::Path { path: vec![Step::Field("customer".into()), Step::Field("tags".into()), Step::Index(0)] }
        );
        assert_eq!(
            parse_expression("customer->'tags'->>0").unwrap(),
            Expr::Get { base: Box::new(path(&["customer", "tags"])), path: vec![Step::Index(0)], text: true }
        );
        assert!(error_of("customer->name").contains("literal field name or array index"));
    }

    fn error_of(text: &str) -> String {
        parse_expression(text).unwrap_err().to_string()
    }

    #[test]
    fn operators_and_null_semantics() {
        let value = json!({"a": 7, "b": 2, "f": 1.5, "s": "Hello", "t": true, "n": null});
        let cases = [
            ("a + b", json!(9)),
            ("a - b * 2", json!(3)),
            ("a / b", json!(3)),
            ("a % b", json!(1)),
            ("a / 0", Value::Null),
            ("a + f", json!(8.5)),
            ("-a", json!(-7)),
            ("- f", json!(-1.5)),
            ("-9223372036854775808", json!(i64::MIN)),
            ("9223372036854775807 + 1", Value::Null),
            ("a + s", Value::Null),
            ("a + missing", Value::Null),
            ("a = 7", json!(true)),
            ("a <> 7.0", json!(false)),
            ("a != 8", json!(true)),
            ("a < f", json!(false)),
            ("a >= 7 AND b <= 2", json!(true)),
            ("s > 'Apple'", json!(true)),
            ("a = '7'", Value::Null),
            ("n = n", Value::Null),
            ("t AND n", Value::Null),
            ("NOT t OR n", Value::Null),
            ("(a = 1) AND n", json!(false)),
            ("t OR n", json!(true)),
            ("NOT n", Value::Null),
            ("n IS NULL", json!(true)),
            ("missing IS NULL", json!(true)),
            ("a IS NOT NULL", json!(true)),
            ("t IS TRUE", json!(true)),
            ("n IS NOT TRUE", json!(true)),
            ("t IS FALSE", json!(false)),
            ("t IS NOT FALSE", json!(true)),
            ("n IS UNKNOWN", json!(true)),
            ("a IN (1, 7)", json!(true)),
            ("a NOT IN (1, 2)", json!(true)),
            ("a IN (1, NULL)", Value::Null),
            ("s LIKE 'He%'", json!(true)),
            ("s LIKE 'h%'", json!(false)),
            ("s ILIKE 'h%'", json!(true)),
            ("s NOT LIKE '_ello'", json!(false)),
            ("'100%' LIKE '100\\%'", json!(true)),
            ("'100!' LIKE '100!%' ESCAPE '!'", json!(false)),
            ("'a\\b' LIKE 'a\\b' ESCAPE ''", json!(true)),
            ("a BETWEEN 1 AND 7", json!(true)),
            ("a NOT BETWEEN 1 AND 7", json!(false)),
            ("CASE WHEN a > 5 THEN 'big' ELSE 'small' END", json!("big")),
            ("CASE WHEN n THEN 1 END", Value::Null),
            ("CASE s WHEN 'Hello' THEN 1 WHEN 'x' THEN 2 END", json!(1)),
            ("CAST(a AS TEXT)", json!("7")),
            ("CAST(a AS VARCHAR(3))", json!("7")),
            ("CAST('42' AS BIGINT)", json!(42)),
            ("CAST('x' AS INTEGER)", Value::Null),
            ("CAST(f AS INT)", json!(2)),
            ("CAST(a AS DOUBLE)", json!(7.0)),
            ("CAST('2.5' AS FLOAT)", json!(2.5)),
            ("CAST(a AS REAL)", json!(7.0)),
            ("CAST('yes' AS BOOLEAN)", json!(true)),
            ("a::text", json!("7")),
            ("s || '!'", json!("Hello!")),
            ("s || n", Value::Null),
            ("TRUE", json!(true)),
            ("NULL", Value::Null),
            ("1e3", json!(1000.0)),
            ("18446744073709551615", json!(u64::MAX)),
            ("'it''s'", json!("it's")),
            ("+a", json!(7)),
        ];
        for (text, expected) in cases {
            assert_eq!(eval(text, &value), expected, "{text}");
        }
    }

    #[test]
    fn functions() {
        let value = json!({"s": "  Hello  ", "w": "héllo", "x": -2.5, "i": -3, "n": null});
        let cases = [
            ("UPPER(w)", json!("HÉLLO")),
            ("lower('ABC')", json!("abc")),
            ("LENGTH(w)", json!(5)),
            ("CHAR_LENGTH(w)", json!(5)),
            ("TRIM(s)", json!("Hello")),
            ("LTRIM(s)", json!("Hello  ")),
            ("RTRIM(s)", json!("  Hello")),
            ("TRIM(BOTH 'x' FROM 'xxaxx')", json!("a")),
            ("TRIM(LEADING 'x' FROM 'xxaxx')", json!("axx")),
            ("TRIM(TRAILING 'x' FROM 'xxaxx')", json!("xxa")),
            ("TRIM('xxaxx', 'x')", json!("a")),
            ("LTRIM('xxa', 'x')", json!("a")),
            ("SUBSTRING(w, 2, 3)", json!("éll")),
            ("SUBSTRING(w, 2)", json!("éllo")),
            ("SUBSTRING(w FROM 2 FOR 3)", json!("éll")),
            ("SUBSTRING(w FROM 4)", json!("lo")),
            ("SUBSTR(w, 1, 1)", json!("h")),
            ("REPLACE(w, 'l', 'L')", json!("héLLo")),
            ("CONCAT(w, n, 1)", json!("héllo1")),
            ("COALESCE(n, missing, 'x')", json!("x")),
            ("NULLIF(i, -3)", Value::Null),
            ("ABS(i)", json!(3)),
            ("ABS(x)", json!(2.5)),
            ("ROUND(x)", json!(-3.0)),
            ("ROUND(1.23456, 3)", json!(1.235)),
            ("FLOOR(x)", json!(-3.0)),
            ("CEIL(x)", json!(-2.0)),
            ("CEILING(x)", json!(-2.0)),
            ("GREATEST(1, i, 4.5)", json!(4.5)),
            ("LEAST(1, i, n)", json!(-3)),
            ("UPPER(i)", Value::Null),
        ];
        for (text, expected) in cases {
            assert_eq!(eval(text, &value), expected, "{text}");
        }
        assert!(error_of("CAST(a AS DATE)").contains("CAST takes TEXT"));
        assert!(error_of("FLOOR(a TO DAY)").contains("FLOOR takes one number"));
        assert!(error_of("INTERVAL '1' SECOND").contains("INTERVAL outside a window function"));
        assert!(error_of("a IS DISTINCT FROM b").contains("is not supported here; expressions are"));
        assert!(error_of("a LIKE ANY ('x', 'y')").contains("LIKE ANY"));
        assert!(error_of("a LIKE 'x' ESCAPE 'ab'").contains("one character"));
        assert!(error_of("UPPER(DISTINCT a)").contains("plain arguments"));
        assert!(error_of("x'ff'").contains("the literal"));
    }
}
