//! `SUBSCRIBE`: a live query over the Postgres wire, as Materialize and RisingWave offer one.
//!
//! `SUBSCRIBE name`, `SUBSCRIBE TO name` or `SUBSCRIBE (SELECT a, b FROM name WHERE x = 'v' AND
//! …)` sends a table's or a view's matching rows, then each change, as an SSE subscription to
//! `/tables/name?x=v&snapshot=true` does; a stream's records from its end on. Every row is
//! `_op` (`snapshot`, `insert`, `update`, `delete` or `record`), `_key`, `_offset`, then the
//! selected columns (a deleted row's as they were). It runs until the client cancels it (a
//! cancel request, psql's Ctrl-C) or goes. `COPY (SUBSCRIBE …) TO STDOUT` sends the same rows
//! as copy data, which psql prints as they come.

use onehop_engine::hub::{Change, Cursor, Event};
use onehop_engine::subscription::{Snapshot, Start, Target};
use onehop_engine::{ColumnType, Engine, Filter, Held, Position, Principal, Resource};
use serde_json::Value;
use sqlparser::ast;
use sqlparser::dialect::PostgreSqlDialect;
use sqlparser::parser::Parser;

use super::{PgError, Relation as Kind, copy, types};

/// A SUBSCRIBE, parsed: what it follows, the columns it selects (none: all), its field
/// conditions, and its copy format when it is wrapped in `COPY ( … ) TO STDOUT`.
#[derive(Clone, Debug)]
pub struct Plan {
    pub name: String,
    pub columns: Vec<String>,
    pub conditions: Vec<(String, String)>,
    pub copy: Option<copy::Format>,
    /// `WITH (SNAPSHOT = …)`: whether it begins with what the object holds now (a table's or
    /// view's rows, a stream's retained records) or only with what changes after. `None`: a
    /// table's or view's rows first, a stream's records from now on.
    pub snapshot: Option<bool>,
}

/// The columns every row begins with.
const LEADING: [&str; 3] = ["_op", "_key", "_offset"];

const SHAPE: &str = "SUBSCRIBE follows one table, view or stream: SUBSCRIBE name, or SUBSCRIBE (SELECT column, … \
                     | * FROM name [WHERE column = literal [AND …]]), then [WITH (SNAPSHOT = true | false)]; \
                     and COPY (SUBSCRIBE …) TO STDOUT";

fn refused(what: impl std::fmt::Display) -> PgError {
    let mut error = PgError::new("0A000", format!("{what} is not supported in SUBSCRIBE"));
    error.hint = Some(SHAPE.into());
    error
}

/// `sql` as a SUBSCRIBE, or `None` when it is not one.
pub fn parse(sql: &str) -> Option<Result<Plan, PgError>> {
    let text = sql.trim().trim_end_matches(';').trim();
    let (inner, format) = match strip_keyword(text, "COPY") {
        Some(rest) => {
            let rest = rest.trim_start();
            strip_keyword(rest.strip_prefix('(')?.trim_start(), "SUBSCRIBE")?;
            let Some(close) = matching_paren(rest) else {
                return Some(Err(PgError::new("42601", "COPY (SUBSCRIBE …: the parenthesis is not closed")));
            };
            match copy_format(&rest[close + 1..]) {
                Ok(format) => (rest[1..close].trim(), Some(format)),
                Err(error) => return Some(Err(error)),
            }
        }
        None => (text, None),
    };
    let rest = strip_keyword(inner, "SUBSCRIBE")?;
    Some(plan(rest.trim(), format))
}

/// What follows `keyword` at the start of `text` (any case, as a whole word).
fn strip_keyword<'a>(text: &'a str, keyword: &str) -> Option<&'a str> {
    let head = text.get(..keyword.len())?;
    let rest = &text[keyword.len()..];
    let whole = rest.chars().next().is_none_or(|next| !next.is_alphanumeric() && next != '_');
    (head.eq_ignore_ascii_case(keyword) && whole).then_some(rest)
}

/// Where the parenthesis opening `text` closes (quotes and quoted names skipped).
fn matching_paren(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote = None;
    for (at, char) in text.char_indices() {
        match (quote, char) {
            (Some(open), char) if char == open => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(char),
            (None, '(') => depth += 1,
            (None, ')') => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(at);
                }
            }
            _ => {}
        }
    }
    None
}

/// The format of `COPY (SUBSCRIBE …) after`, read by the COPY parser on a stand-in query.
fn copy_format(after: &str) -> Result<copy::Format, PgError> {
    let sql = format!("COPY (SELECT 1) {after}");
    let statement = Parser::parse_sql(&PostgreSqlDialect {}, &sql)
        .map_err(|error| PgError::new("42601", format!("COPY (SUBSCRIBE …) {}: {error}", after.trim())))?;
    match statement.as_slice() {
        [statement] => match copy::plan(statement)? {
            copy::Copy::Out { format, .. } => Ok(format),
            copy::Copy::In { .. } => Err(PgError::new("42601", "COPY (SUBSCRIBE …) goes TO STDOUT")),
        },
        _ => Err(PgError::new("42601", "COPY (SUBSCRIBE …) TO STDOUT is one statement")),
    }
}

fn plan(rest: &str, copy: Option<copy::Format>) -> Result<Plan, PgError> {
    let (query, snapshot) = if rest.starts_with('(') {
        let close = matching_paren(rest).ok_or_else(|| PgError::new("42601", "SUBSCRIBE (…: not closed"))?;
        (rest[1..close].to_string(), options(&rest[close + 1..])?)
    } else {
        let rest = strip_keyword(rest, "TO").unwrap_or(rest).trim();
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let (name, after) = rest.split_at(end);
        if name.is_empty() {
            return Err(PgError::new("42601", format!("SUBSCRIBE what? {SHAPE}")));
        }
        (format!("SELECT * FROM {name}"), options(after)?)
    };
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, &query)
        .map_err(|error| PgError::new("42601", format!("SUBSCRIBE: {error}")))?;
    let [ast::Statement::Query(query)] = statements.as_slice() else {
        return Err(refused("anything but one SELECT"));
    };
    if query.with.is_some() || query.order_by.is_some() || query.limit_clause.is_some() || query.fetch.is_some() {
        return Err(refused("WITH, ORDER BY or LIMIT"));
    }
    let ast::SetExpr::Select(select) = &*query.body else {
        return Err(refused("UNION or VALUES"));
    };
    let grouped = !matches!(&select.group_by, ast::GroupByExpr::Expressions(exprs, _) if exprs.is_empty());
    if select.distinct.is_some() || grouped || select.having.is_some() {
        return Err(refused("DISTINCT, GROUP BY or HAVING (define a view, and subscribe to it)"));
    }
    let [from] = select.from.as_slice() else {
        return Err(refused("reading several inputs (define a joined view, and subscribe to it)"));
    };
    if !from.joins.is_empty() {
        return Err(refused("JOIN (define a joined view, and subscribe to it)"));
    }
    let ast::TableFactor::Table { name, .. } = &from.relation else {
        return Err(refused("a subquery in FROM"));
    };
    let name = super::local_name(name)?;
    let mut columns = Vec::new();
    for item in &select.projection {
        match item {
            ast::SelectItem::Wildcard(_) if select.projection.len() == 1 => {}
            ast::SelectItem::UnnamedExpr(ast::Expr::Identifier(ident)) => columns.push(ident.value.clone()),
            ast::SelectItem::UnnamedExpr(ast::Expr::CompoundIdentifier(parts)) if parts.len() == 2 => {
                columns.push(parts[1].value.clone());
            }
            other => return Err(refused(format!("the item {other} (select columns by name, or *)"))),
        }
    }
    let mut conditions = Vec::new();
    if let Some(selection) = &select.selection {
        conjuncts(selection, &mut conditions)?;
    }
    Ok(Plan { name, columns, conditions, copy, snapshot })
}

/// The options after a SUBSCRIBE's object: nothing, or `WITH (SNAPSHOT [=] true | false)`.
fn options(after: &str) -> Result<Option<bool>, PgError> {
    let after = after.trim();
    if after.is_empty() {
        return Ok(None);
    }
    let Some(with) = strip_keyword(after, "WITH") else {
        return Err(refused(format!("{after:?} after the object")));
    };
    let with = with.trim_start();
    let close = with.starts_with('(').then(|| matching_paren(with)).flatten();
    let Some(close) = close.filter(|close| with[close + 1..].trim().is_empty()) else {
        return Err(PgError::new("42601", format!("SUBSCRIBE … WITH (SNAPSHOT = true | false), not {after:?}")));
    };
    let option = with[1..close].trim();
    let Some(value) = strip_keyword(option, "SNAPSHOT") else {
        return Err(refused(format!("the option {option:?}")));
    };
    let value = value.trim();
    let value = value.strip_prefix('=').unwrap_or(value).trim().trim_matches('\'');
    match value.to_ascii_lowercase().as_str() {
        "" | "true" | "on" | "1" => Ok(Some(true)),
        "false" | "off" | "0" => Ok(Some(false)),
        _ => Err(PgError::new("22023", format!("SNAPSHOT takes true or false, not {value:?}"))),
    }
}

/// The `column = literal` conditions `expr` joins with AND.
fn conjuncts(expr: &ast::Expr, into: &mut Vec<(String, String)>) -> Result<(), PgError> {
    let column = |expr: &ast::Expr| match expr {
        ast::Expr::Identifier(ident) => Some(ident.value.clone()),
        ast::Expr::CompoundIdentifier(parts) => parts.last().map(|part| part.value.clone()),
        _ => None,
    };
    let literal = |expr: &ast::Expr| match expr {
        ast::Expr::Value(value) => match &value.value {
            ast::Value::SingleQuotedString(text) => Some(text.clone()),
            ast::Value::Number(number, _) => Some(number.clone()),
            ast::Value::Boolean(truth) => Some(truth.to_string()),
            _ => None,
        },
        _ => None,
    };
    match expr {
        ast::Expr::Nested(inner) => conjuncts(inner, into),
        ast::Expr::BinaryOp { left, op: ast::BinaryOperator::And, right } => {
            conjuncts(left, into)?;
            conjuncts(right, into)
        }
        ast::Expr::BinaryOp { left, op: ast::BinaryOperator::Eq, right } => {
            let pair = match (column(left), literal(right)) {
                (Some(column), Some(value)) => Some((column, value)),
                _ => column(right).zip(literal(left)),
            };
            let pair = pair.ok_or_else(|| refused(format!("the condition {expr}")))?;
            into.push(pair);
            Ok(())
        }
        other => {
            Err(refused(format!("the condition {other} (a subscription filters by column = literal, joined by AND)")))
        }
    }
}

/// A SUBSCRIBE's answer's shape: its target, kind, and value columns with their types.
pub struct Shape {
    target: Target,
    kind: Kind,
    selected: Vec<String>,
    /// A stream's `*`: one `value` column with the whole value.
    whole: bool,
    pub columns: Vec<String>,
    pub types: Vec<u32>,
}

/// The columns `plan` answers, once its target is known.
pub fn shape(engine: &Engine, principal: &Principal, plan: &Plan) -> Result<Shape, PgError> {
    let name = plan.name.clone();
    let kind = super::relation(engine, &name)?;
    let target = match kind {
        Kind::Table => Target::Table(name.clone()),
        Kind::View => Target::View { view: name.clone(), key: None },
        Kind::Stream => Target::Stream(name.clone()),
    };
    let declared = |column: &str| -> Option<ColumnType> {
        let table = engine.table(&name).ok()?;
        table.def().column(column).map(|column| column.ty.clone())
    };
    let whole = kind == Kind::Stream && plan.columns.is_empty();
    let selected = match kind {
        _ if !plan.columns.is_empty() => plan.columns.clone(),
        Kind::Table => engine
            .table(&name)
            .map(|table| table.def().columns.iter().map(|c| c.name.clone()).collect())
            .map_err(onehop_sql::SqlError::from)?,
        Kind::View => {
            let query = Parser::parse_sql(&PostgreSqlDialect {}, &format!("SELECT * FROM \"{name}\""))
                .map_err(|error| PgError::new("42601", error.to_string()))?;
            let [ast::Statement::Query(query)] = query.as_slice() else { unreachable!("one SELECT") };
            onehop_sql::query::columns(engine, Some(principal), query)?
                .into_iter()
                .filter(|column| !LEADING.contains(&column.as_str()))
                .collect()
        }
        Kind::Stream => vec!["value".to_string()],
    };
    let mut columns: Vec<String> = LEADING.iter().map(|column| column.to_string()).collect();
    columns.extend(selected.iter().cloned());
    let mut types = vec![types::TEXT, types::TEXT, types::INT8];
    types.extend(selected.iter().map(|column| match declared(column) {
        Some(ColumnType::Json | ColumnType::Array(_)) => types::JSON,
        Some(ty) => types::oid_of(&ty),
        None if whole => types::JSON,
        None => types::TEXT,
    }));
    Ok(Shape { target, kind, selected, whole, columns, types })
}

/// An open SUBSCRIBE: its shape, its snapshot's rows, and the cursor that follows.
pub struct Following {
    pub shape: Shape,
    pub snapshot: Vec<Vec<Value>>,
    pub cursor: Cursor,
    pub copy: Option<copy::Format>,
    /// Per column: binary (the extended protocol's result formats).
    pub binary: Vec<bool>,
    /// By the simple query protocol: ReadyForQuery follows its end.
    pub simple: bool,
    /// Counted against its user's subscription limit while it lives.
    _held: Option<Held>,
}

/// Opens `plan`'s subscription for `principal`, with the grants and limits of any other.
pub async fn open(engine: &Engine, principal: &Principal, plan: Plan) -> Result<Following, PgError> {
    let shape = shape(engine, principal, &plan)?;
    let mut filter = Filter::default();
    for (column, value) in &plan.conditions {
        filter = filter.with_condition(column, value).map_err(onehop_sql::SqlError::from)?;
    }
    let start = match (shape.kind, plan.snapshot) {
        (Kind::Stream, Some(true)) => Start::At(Position::Earliest),
        (Kind::Stream, _) | (Kind::Table | Kind::View, Some(false)) => Start::At(Position::Latest),
        (Kind::Table | Kind::View, _) => Start::Snapshot,
    };
    let held = principal.hold(Resource::Subscription).map_err(onehop_sql::SqlError::from)?;
    let opened =
        engine.open_subscription(principal, &shape.target, filter, start).await.map_err(onehop_sql::SqlError::from)?;
    let snapshot = match opened.snapshot {
        None => Vec::new(),
        Some(Snapshot::Rows(rows)) => rows
            .iter()
            .map(|row| {
                let doc: Value = serde_json::from_slice(&row.json).unwrap_or(Value::Null);
                shape.row("snapshot", &row.id, Value::from(row.offset), Some(&doc))
            })
            .collect(),
        Some(Snapshot::ViewRows(keys)) => {
            let shape = &shape;
            keys.iter()
                .flat_map(|(key, rows)| rows.iter().map(move |row| shape.row("snapshot", key, Value::Null, Some(row))))
                .collect()
        }
    };
    Ok(Following {
        shape,
        snapshot,
        cursor: opened.cursor,
        copy: plan.copy,
        binary: Vec::new(),
        simple: true,
        _held: held,
    })
}

impl Shape {
    fn row(&self, op: &str, key: &str, offset: Value, fields: Option<&Value>) -> Vec<Value> {
        let mut row = vec![Value::from(op), Value::from(key), offset];
        if self.whole {
            row.push(fields.cloned().unwrap_or(Value::Null));
        } else {
            row.extend(
                self.selected
                    .iter()
                    .map(|column| fields.and_then(|fields| fields.get(column)).cloned().unwrap_or(Value::Null)),
            );
        }
        row
    }

    /// An event's row: a table's row after the change (before it, for a delete), a view's
    /// changed row, a stream's record.
    pub fn event_row(&self, event: &Event, change: Change) -> Vec<Value> {
        let key = event.record.key.as_deref().map(String::from_utf8_lossy).unwrap_or_default();
        let offset = Value::from(event.record.offset);
        match self.kind {
            Kind::Table => {
                let fields = if change == Change::Delete { event.before() } else { event.doc() };
                self.row(change.as_str(), &key, offset, fields)
            }
            Kind::View => {
                let doc = event.doc();
                let flag = |name: &str| doc.and_then(|doc| doc.get(name)).filter(|value| !value.is_null());
                // A removal carries the row it took away as `before`.
                match (flag("removed") == Some(&Value::Bool(true)), flag("before")) {
                    (true, before) => self.row("delete", &key, offset, before.or(doc)),
                    (false, Some(_)) => self.row("update", &key, offset, doc),
                    (false, None) => self.row("insert", &key, offset, doc),
                }
            }
            Kind::Stream => {
                let text;
                let fields = match event.doc() {
                    Some(doc) => Some(doc),
                    None => {
                        text = event
                            .record
                            .value
                            .as_deref()
                            .map_or(Value::Null, |bytes| Value::from(String::from_utf8_lossy(bytes).into_owned()));
                        Some(&text)
                    }
                };
                self.row("record", &key, offset, fields)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned(sql: &str) -> Plan {
        match parse(sql) {
            Some(Ok(plan)) => plan,
            Some(Err(error)) => panic!("{sql}: {}", error.message),
            None => panic!("{sql}: not a SUBSCRIBE"),
        }
    }

    #[test]
    fn subscribes_parse_with_their_columns_conditions_and_copy() {
        let plan = planned("SUBSCRIBE orders");
        assert_eq!((plan.name.as_str(), plan.columns.len(), plan.copy.is_none()), ("orders", 0, true));
        assert_eq!(planned("subscribe to \"Orders\";").name, "Orders");
        let plan = planned("SUBSCRIBE (SELECT id, o.qty FROM public.orders o WHERE status = 'open' AND (qty = 2))");
        assert_eq!(plan.columns, ["id", "qty"]);
        assert_eq!(plan.conditions, [("status".to_string(), "open".to_string()), ("qty".to_string(), "2".to_string())]);
        let plan = planned("COPY (SUBSCRIBE (SELECT * FROM t WHERE 'x' = a)) TO STDOUT WITH (FORMAT csv)");
        assert!(plan.copy.is_some_and(|format| format.csv));
        assert_eq!(plan.conditions, [("a".to_string(), "x".to_string())]);
        // Whether it begins with what the object holds.
        assert_eq!(planned("SUBSCRIBE t").snapshot, None);
        assert_eq!(planned("SUBSCRIBE TO t WITH (SNAPSHOT = false)").snapshot, Some(false));
        assert_eq!(planned("subscribe t with (snapshot true)").snapshot, Some(true));
        let plan = planned("SUBSCRIBE (SELECT a FROM t WHERE b = 'x') WITH (SNAPSHOT = 'off')");
        assert_eq!((plan.name.as_str(), plan.snapshot), ("t", Some(false)));
        let plan = planned("COPY (SUBSCRIBE t WITH (SNAPSHOT = false)) TO STDOUT");
        assert_eq!((plan.name.as_str(), plan.snapshot), ("t", Some(false)));
        assert_eq!(parse("SUBSCRIBE t WITH (SNAPSHOT = maybe)").unwrap().unwrap_err().code, "22023");
        assert_eq!(parse("SUBSCRIBE t WITH SNAPSHOT").unwrap().unwrap_err().code, "42601");
        // Not a SUBSCRIBE: left to the rest of the server.
        assert!(parse("SELECT * FROM subscribers").is_none());
        assert!(parse("COPY (SELECT 1) TO STDOUT").is_none());
        assert!(parse("SUBSCRIBERS").is_none());
    }

    #[test]
    fn what_a_subscription_cannot_follow_is_refused_with_its_shape() {
        for sql in [
            "SUBSCRIBE (SELECT a FROM t JOIN u ON t.id = u.id)",
            "SUBSCRIBE (SELECT a FROM t, u)",
            "SUBSCRIBE (SELECT COUNT(*) FROM t GROUP BY a)",
            "SUBSCRIBE (SELECT a FROM t WHERE b > 2)",
            "SUBSCRIBE (SELECT a FROM t ORDER BY a)",
            "SUBSCRIBE (SELECT a + 1 FROM t)",
            "SUBSCRIBE (SELECT a FROM t) WITH (PROGRESS)",
            "SUBSCRIBE t AS OF 5",
        ] {
            let error = parse(sql).unwrap().unwrap_err();
            assert_eq!(error.code, "0A000", "{sql}: {}", error.message);
            assert!(error.hint.is_some_and(|hint| hint.contains("SUBSCRIBE name")), "{sql}");
        }
        for sql in ["SUBSCRIBE", "SUBSCRIBE (SELECT", "COPY (SUBSCRIBE t TO STDOUT", "COPY (SUBSCRIBE t) FROM STDIN"] {
            assert_eq!(parse(sql).unwrap().unwrap_err().code, "42601", "{sql}");
        }
    }
}
