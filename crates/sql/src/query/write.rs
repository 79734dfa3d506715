//! Writes in SQL: `INSERT` (of `VALUES` or a query's rows, with `ON CONFLICT (key) DO NOTHING`
//! or `DO UPDATE SET … [WHERE …]`), `UPDATE … SET … [WHERE …]` and `DELETE … [WHERE …]` on
//! tables, `INSERT` into streams; each with `RETURNING`.
//!
//! A statement is decided whole before anything is written: the rows it reads are found by the
//! query planner (so `WHERE id = …` reads one row), each change is checked against the row's
//! version as read, and the writes go to the table as one batch, which the log keeps whole or
//! not at all. A row changed by another writer since it was read fails the statement (nothing
//! of it is written: run it again). The records are those `PUT`, `PATCH` and `DELETE` write: a
//! subscriber, a view and a Kafka consumer see them alike.

use std::sync::Arc;

use onehop_engine::view::Expr;
use onehop_engine::view::expr::{Input, is_true};
use onehop_engine::{Engine, NewRecord, ObjectKind, Precondition, Principal, Privilege, Table, Write};
use serde_json::{Map, Value};
use sqlparser::ast;

use super::budget::QueryLimits;
use super::resolve::{Aggregates, resolve};
use super::select::Context;
use super::source::Overlay;
use super::source::{Kind, STREAM_FIELDS, Source};
use super::{Answer, run_through};
use crate::SqlError;

fn invalid(message: impl Into<String>) -> SqlError {
    SqlError::InvalidQuery(message.into())
}

fn unsupported(what: impl std::fmt::Display) -> SqlError {
    SqlError::UnsupportedQuery {
        what: what.to_string(),
        supported:
            "writes are INSERT INTO t [(columns)] VALUES … | SELECT … [ON CONFLICT (key) DO NOTHING | DO UPDATE \
                    SET … [WHERE …]], UPDATE t SET column = expression, … [WHERE …], DELETE FROM t [WHERE …], each \
                    [RETURNING …] (docs/sql.md, \"Writes\")"
                .into(),
    }
}

/// What a write statement did: its verb, the rows it wrote, and RETURNING's answer.
#[derive(Debug)]
pub struct Changed {
    pub verb: &'static str,
    pub rows: u64,
    pub returning: Option<Answer>,
}

/// Runs the write `statement` for `principal`, deciding it on the calling thread (for tools
/// that run SQL in the server's process, as `onehop serve --schema` does).
pub async fn write(
    engine: &Engine,
    principal: Option<&Principal>,
    statement: &ast::Statement,
) -> Result<Changed, SqlError> {
    let limits = QueryLimits::of(engine.options());
    apply(plan(engine, principal, statement, &limits, None)?).await
}

/// [`write`], deciding on a blocking thread: reading the rows a statement changes is a query's
/// work, under the query limits, and holds no async worker.
pub async fn write_shared(
    engine: &Arc<Engine>,
    principal: Option<&Principal>,
    statement: &ast::Statement,
) -> Result<Changed, SqlError> {
    apply(plan_shared(engine, principal, statement, None).await?).await
}

/// The write `statement` decided on a blocking thread, reading the table `overlay` is of
/// through a transaction's uncommitted writes; not yet made.
pub(crate) async fn plan_shared(
    engine: &Arc<Engine>,
    principal: Option<&Principal>,
    statement: &ast::Statement,
    overlay: Option<Arc<Overlay>>,
) -> Result<Plan, SqlError> {
    let limits = QueryLimits::of(engine.options());
    let (engine, principal, statement) = (engine.clone(), principal.cloned(), statement.clone());
    tokio::task::spawn_blocking(move || plan(&engine, principal.as_ref(), &statement, &limits, overlay.as_ref()))
        .await
        .map_err(|error| SqlError::InvalidQuery(format!("the statement stopped: {error}")))?
}

async fn apply(plan: Plan) -> Result<Changed, SqlError> {
    let rows = plan.count();
    match plan {
        Plan::Table { table, writes, verb, returning } => {
            if !writes.is_empty() {
                table.write_all(writes, None).await?;
            }
            Ok(Changed { verb, rows, returning })
        }
        Plan::Stream { stream, records, returning } => {
            if !records.is_empty() {
                stream.publish(&records, None).await?;
            }
            Ok(Changed { verb: "INSERT", rows, returning })
        }
    }
}

/// A write decided, not yet made.
pub(crate) enum Plan {
    Table {
        table: Arc<Table>,
        writes: Vec<(String, Write, Precondition)>,
        verb: &'static str,
        returning: Option<Answer>,
    },
    Stream {
        stream: Arc<onehop_engine::Stream>,
        records: Vec<NewRecord>,
        returning: Option<Answer>,
    },
}

impl Plan {
    pub(crate) fn count(&self) -> u64 {
        match self {
            Plan::Table { writes, .. } => writes.len() as u64,
            Plan::Stream { records, .. } => records.len() as u64,
        }
    }
}

/// Row `id` as the statement sees it (through the transaction's writes, if any), with the
/// precondition a write of it is made under: the version read, or none for a row the
/// transaction wrote (its first read's version is kept by the transaction).
fn current(table: &Table, overlay: Option<&Arc<Overlay>>, id: &str) -> Option<(Map<String, Value>, Precondition)> {
    if let Some(pending) = Overlay::of(overlay, &table.name()).and_then(|overlay| overlay.rows.get(id)) {
        return pending.clone().map(|doc| (doc, Precondition::None));
    }
    table.get(id).map(|row| (row.doc().clone(), Precondition::Version(row.offset)))
}

fn input(row: &Value) -> Input<'_> {
    Input::row(row)
}

/// The target of a write, checked against what the principal may write.
fn target(engine: &Engine, principal: Option<&Principal>, name: &ast::ObjectName) -> Result<Source, SqlError> {
    let name = crate::parse::simple_name(name)?;
    let (kind, object_kind, known) = if let Ok(table) = engine.table(&name) {
        let known = table.def().columns.iter().map(|column| column.name.clone()).collect();
        (Kind::Table(table, None), ObjectKind::Table, known)
    } else if let Ok(stream) = engine.stream(&name) {
        if engine.transform(&name).is_some() {
            return Err(invalid(format!("{name} is written by its transform; write to its source instead")));
        }
        (Kind::Stream(stream), ObjectKind::Stream, STREAM_FIELDS.iter().map(|field| field.to_string()).collect())
    } else if engine.view(&name).is_ok() {
        return Err(invalid(format!("{name} is a view: its rows are computed, not written")));
    } else {
        return Err(invalid(format!("{name} is not a table or stream (SHOW TABLES and SHOW STREAMS list them)")));
    };
    if let Some(principal) = principal {
        engine.access().authorize(principal, Privilege::Write, object_kind, &name)?;
    }
    Ok(Source { alias: name.clone(), label: name, kind, known, open: true, merged: Vec::new() })
}

/// READ on the target, for a statement that reads its rows (WHERE, RETURNING, ON CONFLICT).
fn authorize_read(engine: &Engine, principal: Option<&Principal>, source: &Source) -> Result<(), SqlError> {
    let kind = if matches!(source.kind, Kind::Table(..)) { ObjectKind::Table } else { ObjectKind::Stream };
    if let Some(principal) = principal {
        engine.access().authorize(principal, Privilege::Read, kind, &source.label)?;
    }
    Ok(())
}

fn plan(
    engine: &Engine,
    principal: Option<&Principal>,
    statement: &ast::Statement,
    limits: &QueryLimits,
    overlay: Option<&Arc<Overlay>>,
) -> Result<Plan, SqlError> {
    match statement {
        ast::Statement::Insert(insert) => plan_insert(engine, principal, insert, limits, overlay),
        ast::Statement::Update(update) => plan_update(engine, principal, update, limits, overlay),
        ast::Statement::Delete(delete) => plan_delete(engine, principal, delete, limits, overlay),
        other => Err(unsupported(other.to_string().split_whitespace().next().unwrap_or_default())),
    }
}

/// The rows `sql` (a SELECT of the target's key) finds.
fn keys_where(
    engine: &Engine,
    principal: Option<&Principal>,
    table: &Table,
    alias: &str,
    selection: Option<&ast::Expr>,
    limits: &QueryLimits,
    overlay: Option<&Arc<Overlay>>,
) -> Result<Vec<String>, SqlError> {
    let def = table.def();
    let mut sql = format!("SELECT \"{alias}\".\"{}\" FROM \"{}\" AS \"{alias}\"", def.primary_key, def.name);
    if let Some(selection) = selection {
        sql.push_str(&format!(" WHERE {selection}"));
    }
    let query = match crate::parse::parse(&sql)?.pop() {
        Some(crate::parse::Statement::Query { query, .. }) => query,
        _ => return Err(invalid("the WHERE clause does not make a query")),
    };
    let answer = run_through(engine, principal, &query, limits, None, overlay.cloned())?;
    Ok(answer.rows.into_iter().filter_map(|mut row| def.id_of(&row.swap_remove(0))).collect())
}

fn assignment_column(assignment: &ast::Assignment) -> Result<String, SqlError> {
    match &assignment.target {
        ast::AssignmentTarget::ColumnName(name) => match name.0.last().and_then(|part| part.as_ident()) {
            Some(ident) => Ok(ident.value.clone()),
            None => Err(invalid(format!("SET {name}: name a column"))),
        },
        ast::AssignmentTarget::Tuple(_) => Err(unsupported("SET (a, b) = (…)")),
    }
}

/// Each assignment's column and expression, resolved over `scope`.
fn assignments(
    context: &mut Context,
    scope: &[Source],
    assignments: &[ast::Assignment],
    primary_key: &str,
) -> Result<Vec<(String, Expr)>, SqlError> {
    let mut resolved = Vec::with_capacity(assignments.len());
    for assignment in assignments {
        let column = assignment_column(assignment)?;
        if column == primary_key {
            return Err(invalid(format!(
                "SET {column}: a row's primary key cannot change (delete it and insert another)"
            )));
        }
        let expr = resolve(context, scope, &assignment.value, &mut Aggregates::Refused("SET"))?;
        resolved.push((column, expr));
    }
    Ok(resolved)
}

/// The names of the columns RETURNING gives for the write `statement`, found without making
/// it (what a driver asks of a prepared statement before it runs it); `None` without
/// RETURNING. `*` names the target's declared columns (a table without declared columns names
/// its fields row by row, so only the run knows them).
pub fn returning_columns(
    engine: &Engine,
    principal: Option<&Principal>,
    statement: &ast::Statement,
) -> Result<Option<Vec<String>>, SqlError> {
    let (name, alias, items) = match statement {
        ast::Statement::Insert(insert) => {
            let ast::TableObject::TableName(name) = &insert.table else { return Ok(None) };
            (name, insert.table_alias.as_ref().map(|alias| &alias.alias), insert.returning.as_ref())
        }
        ast::Statement::Update(update) => {
            let ast::TableFactor::Table { name, alias, .. } = &update.table.relation else { return Ok(None) };
            (name, alias.as_ref().map(|alias| &alias.name), update.returning.as_ref())
        }
        ast::Statement::Delete(delete) => {
            let (ast::FromTable::WithFromKeyword(from) | ast::FromTable::WithoutKeyword(from)) = &delete.from;
            let Some(ast::TableFactor::Table { name, alias, .. }) = from.first().map(|from| &from.relation) else {
                return Ok(None);
            };
            (name, alias.as_ref().map(|alias| &alias.name), delete.returning.as_ref())
        }
        _ => return Ok(None),
    };
    let Some(items) = items else { return Ok(None) };
    let mut source = target(engine, principal, name)?;
    if let Some(alias) = alias {
        source.alias = alias.value.clone();
    }
    let limits = QueryLimits::default();
    let mut context = Context::new(engine, principal, &limits);
    Ok(returning(&mut context, &source, Some(items), &[])?.map(|answer| answer.columns))
}

/// RETURNING's items over the rows written (each the target's row as it is after the write,
/// or before it for DELETE).
fn returning(
    context: &mut Context,
    source: &Source,
    items: Option<&Vec<ast::SelectItem>>,
    rows: &[Map<String, Value>],
) -> Result<Option<Answer>, SqlError> {
    let Some(items) = items else { return Ok(None) };
    let scope = std::slice::from_ref(source);
    let mut columns = Vec::new();
    let mut exprs: Vec<Option<Expr>> = Vec::new();
    for item in items {
        match item {
            ast::SelectItem::Wildcard(_) => {
                let mut fields: Vec<String> = source.known.clone();
                for row in rows {
                    for field in row.keys() {
                        if !fields.contains(field) {
                            fields.push(field.clone());
                        }
                    }
                }
                for field in fields {
                    columns.push(field.clone());
                    exprs.push(Some(Expr::Path {
                        path: vec![
                            onehop_engine::view::expr::Step::Field(source.alias.clone()),
                            onehop_engine::view::expr::Step::Field(field),
                        ],
                    }));
                }
            }
            ast::SelectItem::UnnamedExpr(expr) | ast::SelectItem::ExprWithAlias { expr, .. } => {
                let name = match item {
                    ast::SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
                    _ => super::select::output_name(expr),
                };
                columns.push(name);
                exprs.push(Some(resolve(context, scope, expr, &mut Aggregates::Refused("RETURNING"))?));
            }
            other => return Err(unsupported(format!("RETURNING {other}"))),
        }
    }
    let rows = rows
        .iter()
        .map(|row| {
            let object = Value::Object(Map::from_iter([(source.alias.clone(), Value::Object(row.clone()))]));
            exprs.iter().map(|expr| expr.as_ref().map_or(Value::Null, |expr| expr.eval(&input(&object)))).collect()
        })
        .collect();
    Ok(Some(Answer { columns, rows }))
}

fn plan_insert(
    engine: &Engine,
    principal: Option<&Principal>,
    insert: &ast::Insert,
    limits: &QueryLimits,
    overlay: Option<&Arc<Overlay>>,
) -> Result<Plan, SqlError> {
    if insert.or.is_some() || insert.ignore || insert.overwrite || !insert.assignments.is_empty() || insert.replace_into
    {
        return Err(unsupported("this INSERT's form (OR, IGNORE, OVERWRITE, SET, REPLACE)"));
    }
    let ast::TableObject::TableName(name) = &insert.table else { return Err(unsupported("INSERT INTO a function")) };
    let mut source = target(engine, principal, name)?;
    if let Some(alias) = &insert.table_alias {
        source.alias = alias.alias.value.clone();
    }
    let Some(query) = &insert.source else { return Err(unsupported("INSERT without VALUES or SELECT")) };
    let answer = run_through(engine, principal, query, limits, None, overlay.cloned())?;
    let columns: Vec<String> = if insert.columns.is_empty() {
        match &source.kind {
            Kind::Table(..) => source.known.clone(),
            _ => return Err(invalid(format!("INSERT INTO {} needs its columns named: (a, b, …)", source.label))),
        }
    } else {
        insert.columns.iter().map(crate::parse::simple_name).collect::<Result<_, _>>()?
    };
    if answer.columns.len() != columns.len() {
        return Err(invalid(format!(
            "INSERT has {} column(s) and {} value(s) per row",
            columns.len(),
            answer.columns.len()
        )));
    }
    let rows: Vec<Map<String, Value>> = answer
        .rows
        .into_iter()
        .map(|row| columns.iter().cloned().zip(row).filter(|(_, value)| !value.is_null()).collect())
        .collect();
    let mut context = Context::new(engine, principal, limits);
    match &source.kind {
        Kind::Stream(stream) => {
            if insert.on.is_some() {
                return Err(invalid("ON CONFLICT is for tables: a stream keeps every record"));
            }
            let records: Vec<NewRecord> = rows.iter().map(stream_record).collect::<Result<_, _>>()?;
            check_one_partition(stream, &records)?;
            if insert.returning.is_some() {
                authorize_read(engine, principal, &source)?;
            }
            let returning = returning(&mut context, &source, insert.returning.as_ref(), &rows)?;
            Ok(Plan::Stream { stream: stream.clone(), records, returning })
        }
        Kind::Table(table, _) => {
            let table = table.clone();
            let def = table.def();
            let excluded = Source { alias: "excluded".into(), ..source_like(&source) };
            let conflict = match &insert.on {
                None => None,
                Some(ast::OnInsert::OnConflict(conflict)) => {
                    if let Some(target) = &conflict.conflict_target {
                        let ast::ConflictTarget::Columns(columns) = target else {
                            return Err(unsupported("ON CONFLICT ON CONSTRAINT"));
                        };
                        if !matches!(columns.as_slice(), [column] if column.value == def.primary_key) {
                            return Err(invalid(format!(
                                "ON CONFLICT ({}) : only the primary key ({}) is unique",
                                columns.iter().map(|column| column.value.clone()).collect::<Vec<_>>().join(", "),
                                def.primary_key
                            )));
                        }
                    }
                    authorize_read(engine, principal, &source)?;
                    Some(match &conflict.action {
                        ast::OnConflictAction::DoNothing => None,
                        ast::OnConflictAction::DoUpdate(update) => {
                            let scope = [source_like(&source), source_like(&excluded)];
                            let sets = assignments(&mut context, &scope, &update.assignments, &def.primary_key)?;
                            let condition = match &update.selection {
                                Some(selection) => {
                                    Some(resolve(&mut context, &scope, selection, &mut Aggregates::Refused("WHERE"))?)
                                }
                                None => None,
                            };
                            Some((sets, condition))
                        }
                    })
                }
                Some(other) => return Err(unsupported(format!("{other}"))),
            };
            let mut writes = Vec::with_capacity(rows.len());
            let mut written = Vec::with_capacity(rows.len());
            let mut seen = std::collections::HashSet::new();
            for row in rows {
                let Some(id) = row.get(&def.primary_key).and_then(|key| def.id_of(key)) else {
                    return Err(invalid(format!(
                        "each row needs its primary key {} (text or an integer)",
                        def.primary_key
                    )));
                };
                if !seen.insert(id.clone()) {
                    return Err(SqlError::Engine(onehop_engine::EngineError::InvalidRow(format!(
                        "the statement writes the row {id} twice"
                    ))));
                }
                let existing = current(&table, overlay, &id);
                match (existing, &conflict) {
                    (None, _) => {
                        writes.push((id, Write::Put(row.clone()), Precondition::Missing));
                        written.push(row);
                    }
                    (Some(_), None) => {
                        return Err(SqlError::UniqueViolation(format!(
                            "duplicate key value: {} already has a row {id} (ON CONFLICT ({}) DO UPDATE or DO NOTHING \
                             writes over or keeps it)",
                            def.name, def.primary_key
                        )));
                    }
                    (Some(_), Some(None)) => {}
                    (Some((existing, precondition)), Some(Some((sets, condition)))) => {
                        let object = Value::Object(Map::from_iter([
                            (source.alias.clone(), Value::Object(existing.clone())),
                            ("excluded".to_string(), Value::Object(row.clone())),
                        ]));
                        if let Some(condition) = condition
                            && !is_true(&condition.eval(&input(&object)))
                        {
                            continue;
                        }
                        let mut after = existing;
                        for (column, expr) in sets {
                            after.insert(column.clone(), expr.eval(&input(&object)));
                        }
                        after.retain(|_, value| !value.is_null());
                        writes.push((id, Write::Put(after.clone()), precondition));
                        written.push(after);
                    }
                }
            }
            if insert.returning.is_some() {
                authorize_read(engine, principal, &source)?;
            }
            let returning = returning(&mut context, &source, insert.returning.as_ref(), &written)?;
            Ok(Plan::Table { table, writes, verb: "INSERT", returning })
        }
        _ => unreachable!("a write's target is a table or a stream"),
    }
}

/// A copy of `source`'s description (its kind is not needed to resolve names).
fn source_like(source: &Source) -> Source {
    Source {
        alias: source.alias.clone(),
        label: source.label.clone(),
        kind: Kind::Rows(Arc::new(Answer { columns: Vec::new(), rows: Vec::new() })),
        known: source.known.clone(),
        open: true,
        merged: Vec::new(),
    }
}

/// A stream record from an inserted row: `_key` and `_subject` are the record's, `_value` a
/// value that is not an object, the other columns the value's fields.
fn stream_record(row: &Map<String, Value>) -> Result<NewRecord, SqlError> {
    let text = |field: &str| -> Result<Option<String>, SqlError> {
        match row.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(text)) => Ok(Some(text.clone())),
            Some(Value::Number(number)) => Ok(Some(number.to_string())),
            Some(other) => Err(invalid(format!("{field} is text, not {other}"))),
        }
    };
    for field in ["_partition", "_offset", "_time"] {
        if row.contains_key(field) {
            return Err(invalid(format!("{field} is given by the stream, not written")));
        }
    }
    let fields: Map<String, Value> =
        row.iter().filter(|(name, _)| !name.starts_with('_')).map(|(k, v)| (k.clone(), v.clone())).collect();
    let value = match row.get("_value") {
        Some(value) if fields.is_empty() => value.clone(),
        Some(_) => return Err(invalid("_value is a record's whole value: give it or fields, not both")),
        None => Value::Object(fields),
    };
    let subject = text("_subject")?.map(|subject| onehop_engine::Text::from(subject.as_str()));
    Ok(NewRecord {
        timestamp_ms: None,
        key: text("_key")?.map(|key| bytes::Bytes::from(key.into_bytes())),
        subject,
        headers: Vec::new(),
        value: Some(bytes::Bytes::from(serde_json::to_vec(&value).expect("JSON serializes"))),
    })
}

/// Several records are written all or none only within one partition's batch.
pub(crate) fn check_one_partition(stream: &onehop_engine::Stream, records: &[NewRecord]) -> Result<(), SqlError> {
    if records.len() < 2 || stream.def().partitions == 1 {
        return Ok(());
    }
    let keys: std::collections::HashSet<Option<&[u8]>> = records.iter().map(|record| record.key.as_deref()).collect();
    match keys.into_iter().collect::<Vec<_>>().as_slice() {
        [Some(_)] => Ok(()),
        _ => Err(invalid(format!(
            "{} has {} partitions, and records for several are not written all or none: insert them one statement \
             each, or give them one _key",
            stream.def().name,
            stream.def().partitions
        ))),
    }
}

fn single_table(
    engine: &Engine,
    principal: Option<&Principal>,
    name: &ast::ObjectName,
) -> Result<(Source, Arc<Table>), SqlError> {
    let source = target(engine, principal, name)?;
    let Kind::Table(table, _) = &source.kind else {
        return Err(invalid(format!(
            "{}: a stream's records are kept as written (UPDATE and DELETE are for tables)",
            source.label
        )));
    };
    let table = table.clone();
    Ok((source, table))
}

fn plan_update(
    engine: &Engine,
    principal: Option<&Principal>,
    update: &ast::Update,
    limits: &QueryLimits,
    overlay: Option<&Arc<Overlay>>,
) -> Result<Plan, SqlError> {
    if update.from.is_some() || update.or.is_some() || !update.order_by.is_empty() || update.limit.is_some() {
        return Err(unsupported("UPDATE … FROM, ORDER BY or LIMIT"));
    }
    if !update.table.joins.is_empty() {
        return Err(unsupported("UPDATE of a join"));
    }
    let ast::TableFactor::Table { name, alias, .. } = &update.table.relation else {
        return Err(unsupported("UPDATE of a subquery"));
    };
    let (mut source, table) = single_table(engine, principal, name)?;
    if let Some(alias) = alias {
        source.alias = alias.name.value.clone();
    }
    if update.selection.is_some() || update.returning.is_some() {
        authorize_read(engine, principal, &source)?;
    }
    let def = table.def();
    let mut context = Context::new(engine, principal, limits);
    let scope = [source_like(&source)];
    let sets = assignments(&mut context, &scope, &update.assignments, &def.primary_key)?;
    let ids = keys_where(engine, principal, &table, &source.alias, update.selection.as_ref(), limits, overlay)?;
    let mut writes = Vec::with_capacity(ids.len());
    let mut written = Vec::with_capacity(ids.len());
    for id in ids {
        let Some((row, precondition)) = current(&table, overlay, &id) else { continue };
        let object = Value::Object(Map::from_iter([(source.alias.clone(), Value::Object(row.clone()))]));
        let mut after = row;
        for (column, expr) in &sets {
            after.insert(column.clone(), expr.eval(&input(&object)));
        }
        after.retain(|_, value| !value.is_null());
        writes.push((id, Write::Put(after.clone()), precondition));
        written.push(after);
    }
    let returning = returning(&mut context, &source, update.returning.as_ref(), &written)?;
    Ok(Plan::Table { table, writes, verb: "UPDATE", returning })
}

fn plan_delete(
    engine: &Engine,
    principal: Option<&Principal>,
    delete: &ast::Delete,
    limits: &QueryLimits,
    overlay: Option<&Arc<Overlay>>,
) -> Result<Plan, SqlError> {
    if !delete.tables.is_empty() || delete.using.is_some() || !delete.order_by.is_empty() || delete.limit.is_some() {
        return Err(unsupported("DELETE … USING, ORDER BY or LIMIT, or of several tables"));
    }
    let (ast::FromTable::WithFromKeyword(from) | ast::FromTable::WithoutKeyword(from)) = &delete.from;
    let [from] = from.as_slice() else { return Err(unsupported("DELETE FROM several tables")) };
    let ast::TableFactor::Table { name, alias, .. } = &from.relation else {
        return Err(unsupported("DELETE FROM a subquery"));
    };
    if !from.joins.is_empty() {
        return Err(unsupported("DELETE FROM a join"));
    }
    let (mut source, table) = single_table(engine, principal, name)?;
    if let Some(alias) = alias {
        source.alias = alias.name.value.clone();
    }
    if delete.selection.is_some() || delete.returning.is_some() {
        authorize_read(engine, principal, &source)?;
    }
    let ids = keys_where(engine, principal, &table, &source.alias, delete.selection.as_ref(), limits, overlay)?;
    let mut writes = Vec::with_capacity(ids.len());
    let mut deleted = Vec::with_capacity(ids.len());
    for id in ids {
        let Some((row, precondition)) = current(&table, overlay, &id) else { continue };
        writes.push((id, Write::Delete, precondition));
        deleted.push(row);
    }
    let mut context = Context::new(engine, principal, limits);
    let returning = returning(&mut context, &source, delete.returning.as_ref(), &deleted)?;
    Ok(Plan::Table { table, writes, verb: "DELETE", returning })
}
