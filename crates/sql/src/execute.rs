//! Running statements on the engine.

use onehop_engine::{Engine, EngineError, ObjectKind, Principal, Privilege, StreamDef, Table, TableDef};
use serde::Serialize;
use serde_json::{Value, json};

use crate::SqlError;
use crate::parse::{Statement, StreamOptions};

/// What a statement did.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Output {
    /// A definition was created (durably, in the catalog).
    Created { statement: String, definition: String },
    /// It existed already; nothing changed. `note` says why that is fine.
    Unchanged { statement: String, definition: String, note: String },
    /// A definition was changed (durably, in the catalog).
    Altered { statement: String, definition: String },
    /// A definition was dropped (durably) and its data deleted.
    Dropped { statement: String },
    /// A result set; `verb` names the write (`INSERT`, `UPDATE`, `DELETE`) when these are the
    /// rows its `RETURNING` gave, one per row written.
    Rows { statement: String, columns: Vec<String>, rows: Vec<Vec<Value>>, verb: Option<String> },
    /// Rows written by `INSERT`, `UPDATE` or `DELETE` (without `RETURNING`, which answers
    /// [`Output::Rows`]), all in one batch.
    Changed { statement: String, verb: String, rows: u64 },
}

const TABLE_COLUMNS: [&str; 6] = ["name", "primary_key", "columns", "indexes", "durability", "rows"];

fn table_row(table: &Table) -> Vec<Value> {
    let def = table.def();
    let columns: Vec<String> = def
        .columns
        .iter()
        .map(|column| format!("{} {}{}", column.name, column.ty, if column.not_null { " NOT NULL" } else { "" }))
        .collect();
    let indexes: Vec<String> = def.indexes.iter().map(|index| format!("{} ({})", index.name, index.field)).collect();
    vec![
        json!(def.name),
        json!(def.primary_key),
        json!(columns),
        json!(indexes),
        json!(def.durability.to_string()),
        json!(table.row_count()),
    ]
}

const DESCRIBE_TABLE_COLUMNS: [&str; 5] = ["column", "type", "not_null", "primary_key", "index"];

fn describe_table(label: String, def: &TableDef) -> Output {
    let rows = def
        .columns
        .iter()
        .map(|column| {
            vec![
                json!(column.name),
                json!(column.ty.to_string()),
                json!(column.not_null),
                json!(column.name == def.primary_key),
                json!(def.index_on(&column.name).map(|index| index.name.clone())),
            ]
        })
        .chain(def.indexes.iter().filter(|index| def.column(&index.field).is_none()).map(|index| {
            // An index on an undeclared field: the field is listed with no type.
            vec![json!(index.field), Value::Null, json!(false), json!(false), json!(index.name)]
        }))
        .collect();
    Output::Rows {
        statement: label,
        columns: DESCRIBE_TABLE_COLUMNS.iter().map(|c| c.to_string()).collect(),
        rows,
        verb: None,
    }
}

pub(crate) fn stream_def(engine: &Engine, name: &str, options: &StreamOptions) -> StreamDef {
    let defaults = engine.default_stream_def(name);
    StreamDef {
        name: name.to_string(),
        partitions: options.partitions.unwrap_or(defaults.partitions),
        retention_ms: options.retention_ms,
        retention_bytes: options.retention_bytes,
        durability: options.durability.unwrap_or(defaults.durability),
        mqtt_topic: options.mqtt_topic.clone(),
        compacted: options.compacted,
    }
}

const STREAM_COLUMNS: [&str; 9] = [
    "name",
    "partitions",
    "durability",
    "retention_ms",
    "retention_bytes",
    "end_offsets",
    "mqtt_topic",
    "computed_by",
    "cleanup",
];

fn stream_row(engine: &Engine, stream: &onehop_engine::Stream) -> Vec<Value> {
    let def = stream.def();
    let end_offsets = stream.end_offsets();
    vec![
        json!(def.name),
        json!(def.partitions),
        json!(def.durability.to_string()),
        json!(def.retention_ms),
        json!(def.retention_bytes),
        json!(end_offsets),
        json!(def.mqtt_topic),
        json!(engine.transform(&def.name).map(|transform| transform.def().sql.clone())),
        json!(if def.compacted { "compact" } else { "delete" }),
    ]
}

const TRANSFORM_COLUMNS: [&str; 8] =
    ["name", "source", "records_in", "records_out", "filtered", "rejected", "restoring", "definition"];

fn transform_row(transform: &onehop_engine::view::Transform) -> Vec<Value> {
    let def = transform.def();
    let status = transform.status();
    vec![
        json!(def.name),
        json!(def.sources().join(", ")),
        json!(status.records_in),
        json!(status.records_out),
        json!(status.filtered),
        json!(status.rejected),
        json!(status.restoring),
        json!(def.sql),
    ]
}

const VIEW_COLUMNS: [&str; 8] =
    ["name", "source", "window", "keys", "events", "late_events", "restoring", "definition"];

fn view_row(view: &onehop_engine::view::View) -> Vec<Value> {
    let def = view.def();
    let status = view.status();
    vec![
        json!(def.name),
        json!(def.source),
        serde_json::to_value(&def.window).unwrap_or(Value::Null),
        json!(status.keys),
        json!(status.events),
        json!(status.late_events),
        json!(status.restoring),
        json!(def.sql),
    ]
}

/// A DROP's answer: done, or, with IF EXISTS, nothing to drop.
fn dropped(label: String, result: Result<(), EngineError>, if_exists: bool, kind: &str) -> Result<Output, SqlError> {
    match result {
        Ok(()) => Ok(Output::Dropped { statement: label }),
        Err(
            EngineError::UnknownStream { .. }
            | EngineError::UnknownTable(_)
            | EngineError::UnknownIndex(_)
            | EngineError::UnknownView(_),
        ) if if_exists => Ok(Output::Unchanged {
            statement: label,
            definition: String::new(),
            note: format!("IF EXISTS: there is no such {kind}"),
        }),
        Err(error) => Err(error.into()),
    }
}

/// A write's answer: RETURNING's rows, or how many rows it wrote.
fn changed_output(changed: crate::query::write::Changed, text: &str) -> Output {
    match changed.returning {
        Some(answer) => Output::Rows {
            statement: text.to_string(),
            columns: answer.columns,
            rows: answer.rows,
            verb: Some(changed.verb.to_string()),
        },
        None => Output::Changed { statement: text.to_string(), verb: changed.verb.to_string(), rows: changed.rows },
    }
}

/// Runs one statement with every right: for the server's own schema file and tools that run
/// in its process, never for a client (see [`execute_as`]).
pub async fn execute(engine: &Engine, statement: &Statement) -> Result<Output, SqlError> {
    run(engine, None, statement).await
}

/// Runs one statement for `principal`, if it may: definitions take `ADMIN` on what they
/// define (and `READ` on a view's or transform's source), `SHOW` lists what it has grants on,
/// and access statements are for superusers (see `access::execute`).
///
/// A query (`SELECT`) reads only what the principal may `READ`, and runs on a blocking thread
/// under the engine's query limits.
pub async fn execute_as(
    engine: &std::sync::Arc<Engine>,
    principal: &Principal,
    statement: &Statement,
) -> Result<Output, SqlError> {
    execute_cancellable(engine, principal, statement, None).await
}

/// Runs the query `statement` for `principal`, if it may read what it reads, handing its
/// answer on as it is made (see [`crate::query::stream`]); any other statement is refused.
pub fn stream_as(
    engine: &std::sync::Arc<Engine>,
    principal: &Principal,
    statement: &Statement,
    cancel: Option<&crate::query::Cancel>,
) -> Result<tokio::sync::mpsc::Receiver<Result<crate::query::stream::Streamed, SqlError>>, SqlError> {
    let Statement::Query { query, .. } = statement else {
        return Err(SqlError::InvalidQuery(format!(
            "{} is not a query: only a SELECT's rows are streamed (send it without asking for NDJSON)",
            statement.label()
        )));
    };
    authorize(engine, Some(principal), statement)?;
    Ok(crate::query::stream::stream(engine, principal, query, cancel))
}

/// [`execute_as`], with a query ended early when `cancel` is set.
pub async fn execute_cancellable(
    engine: &std::sync::Arc<Engine>,
    principal: &Principal,
    statement: &Statement,
    cancel: Option<&crate::query::Cancel>,
) -> Result<Output, SqlError> {
    match statement {
        Statement::Query { query, text } => {
            authorize(engine, Some(principal), statement)?;
            crate::query::run_shared(engine, Some(principal), query, text.clone(), cancel, None).await
        }
        Statement::Write { statement: write, text } => {
            authorize(engine, Some(principal), statement)?;
            let changed = crate::query::write::write_shared(engine, Some(principal), write).await?;
            Ok(changed_output(changed, text))
        }
        _ => run(engine, Some(principal), statement).await,
    }
}

/// Runs `statement` for `principal` inside `transaction` (`BEGIN` … `COMMIT`): a query reads
/// the table the transaction writes through its uncommitted writes; a write is decided now and
/// kept until [`Transaction::commit`](crate::Transaction::commit); `EXPLAIN`, `DESCRIBE` and
/// `SHOW` run as outside. A definition or an access statement is refused: it would take effect
/// at once, whatever the transaction's end.
pub async fn execute_in(
    engine: &std::sync::Arc<Engine>,
    principal: &Principal,
    statement: &Statement,
    cancel: Option<&crate::query::Cancel>,
    transaction: &mut crate::Transaction,
) -> Result<Output, SqlError> {
    match statement {
        Statement::Query { query, text } => {
            authorize(engine, Some(principal), statement)?;
            crate::query::run_shared(engine, Some(principal), query, text.clone(), cancel, transaction.overlay()).await
        }
        Statement::Write { statement: write, text } => {
            authorize(engine, Some(principal), statement)?;
            let plan = crate::query::write::plan_shared(engine, Some(principal), write, transaction.overlay()).await?;
            let limits = crate::query::QueryLimits::of(engine.options());
            let changed = transaction.stage(plan, limits.memory_bytes_max)?;
            Ok(changed_output(changed, text))
        }
        Statement::Explain { .. }
        | Statement::Describe { .. }
        | Statement::ShowStreams
        | Statement::ShowTables
        | Statement::ShowViews
        | Statement::ShowTransforms => execute_cancellable(engine, principal, statement, cancel).await,
        Statement::Access(access) if access.is_show() => {
            execute_cancellable(engine, principal, statement, cancel).await
        }
        other => Err(SqlError::ActiveTransaction(format!(
            "{} cannot run inside a transaction: definitions take effect at once",
            other.label()
        ))),
    }
}

/// What a name is, for a check on it: streams, tables and views share one namespace.
fn kind_of(engine: &Engine, name: &str) -> ObjectKind {
    if engine.has_table(name) {
        ObjectKind::Table
    } else if engine.view(name).is_ok() {
        ObjectKind::View
    } else {
        ObjectKind::Stream
    }
}

/// Whether `principal` may declare `mqtt_topic = topic`: the stream then takes the MQTT
/// messages of every topic the filter matches, which would otherwise go to the stream their
/// first level names (existing or not yet). So it takes ADMIN over that stream, or, when the
/// first level is a wildcard, over every stream: ADMIN over the new stream alone must not let
/// a user capture another stream's traffic.
fn authorize_route(engine: &Engine, principal: &Principal, topic: &str) -> Result<(), SqlError> {
    let access = engine.access();
    let first = topic.split('/').next().unwrap_or_default();
    if first != "+" && first != "#" {
        let stream = engine.stream_named_by(first);
        return Ok(access.authorize(principal, Privilege::Admin, ObjectKind::Stream, stream)?);
    }
    let every_stream = onehop_engine::access::model::ObjectPattern { kind: Some(ObjectKind::Stream), name: "*".into() };
    match access.permissions(principal)? {
        Some(permissions) if !permissions.allows_all(Privilege::Admin, &every_stream) => {
            Err(SqlError::from(onehop_engine::EngineError::Forbidden {
                user: principal.user().map(str::to_string),
                privilege: Privilege::Admin,
                object: "stream '*'".into(),
            }))
        }
        _ => Ok(()),
    }
}

/// Whether `principal` may run `statement` (nothing to check without one).
fn authorize(engine: &Engine, principal: Option<&Principal>, statement: &Statement) -> Result<(), SqlError> {
    let Some(principal) = principal else {
        return Ok(());
    };
    let access = engine.access();
    let admin = |kind, name: &str| access.authorize(principal, Privilege::Admin, kind, name);
    let read = |name: &str| access.authorize(principal, Privilege::Read, kind_of(engine, name), name);
    match statement {
        Statement::CreateStream { name, options, .. } => {
            admin(ObjectKind::Stream, name)?;
            if let Some(topic) = &options.mqtt_topic {
                authorize_route(engine, principal, topic)?;
            }
        }
        Statement::AlterStream { name, .. } | Statement::DropStream { name, .. } => admin(ObjectKind::Stream, name)?,
        Statement::CreateView { def, .. } => {
            admin(ObjectKind::View, &def.name)?;
            for source in def.sources() {
                read(source)?;
            }
            // Late events are published there: a write, as any other publish to it.
            if let Some(late) = &def.late_stream {
                access.authorize(principal, Privilege::Write, ObjectKind::Stream, late)?;
            }
        }
        Statement::CreateTransform { def, .. } => {
            admin(ObjectKind::Stream, &def.name)?;
            for source in def.sources().into_iter().chain(def.tables()) {
                read(source)?;
            }
        }
        Statement::CreateTable { name, .. } | Statement::DropTable { name, .. } => admin(ObjectKind::Table, name)?,
        Statement::CreateIndex { table, .. } => admin(ObjectKind::Table, table)?,
        Statement::DropIndex { name, .. } => {
            let table =
                engine.tables().into_iter().find(|table| table.def().indexes.iter().any(|index| &index.name == name));
            match table {
                Some(table) => admin(ObjectKind::Table, &table.name())?,
                None => access.authorize_superuser(principal, "drop an index no table has")?,
            }
        }
        Statement::DropView { name, .. } => admin(ObjectKind::View, name)?,
        Statement::Describe { name } => {
            let kind = kind_of(engine, name);
            let visible = access.permissions(principal)?.is_none_or(|permissions| permissions.sees(kind, name));
            if !visible {
                read(name)?;
            }
        }
        // Listings show what the principal has grants on, once it may ask at all: a client
        // without credentials, where they are required, is asked for them as for any other
        // statement. Access statements check themselves.
        Statement::ShowStreams | Statement::ShowTables | Statement::ShowViews | Statement::ShowTransforms => {
            if principal.user().is_none() && !access.anonymous_welcome() {
                return Err(
                    onehop_engine::EngineError::Unauthenticated(onehop_engine::access::LoginFailure::Missing).into()
                );
            }
        }
        Statement::Access(_) => {}
        // Each input is checked as the query reads it, the target as it is written.
        Statement::Query { .. } | Statement::Explain { .. } | Statement::Write { .. } => {
            if principal.user().is_none() && !access.anonymous_welcome() {
                return Err(
                    onehop_engine::EngineError::Unauthenticated(onehop_engine::access::LoginFailure::Missing).into()
                );
            }
        }
    }
    Ok(())
}

async fn run(engine: &Engine, principal: Option<&Principal>, statement: &Statement) -> Result<Output, SqlError> {
    authorize(engine, principal, statement)?;
    let permissions = match principal {
        Some(principal) => engine.access().permissions(principal)?,
        None => None,
    };
    let visible =
        |kind: ObjectKind, name: &str| permissions.as_ref().is_none_or(|permissions| permissions.sees(kind, name));
    let label = statement.label();
    match statement {
        Statement::Access(statement) => crate::access::execute(engine, principal, statement).await,
        Statement::Query { query, text } => {
            let limits = crate::query::QueryLimits::of(engine.options());
            let answer = crate::query::run(engine, principal, query, &limits, None)?;
            Ok(Output::Rows { statement: text.clone(), columns: answer.columns, rows: answer.rows, verb: None })
        }
        Statement::Write { statement: write, text } => {
            let changed = crate::query::write::write(engine, principal, write).await?;
            Ok(changed_output(changed, text))
        }
        Statement::Explain { query, text } => {
            let lines = crate::query::explain(engine, principal, query)?;
            let rows = lines.into_iter().map(|line| vec![Value::String(line)]).collect();
            Ok(Output::Rows { statement: format!("EXPLAIN {text}"), columns: vec!["plan".into()], rows, verb: None })
        }
        Statement::CreateStream { name, if_not_exists, options } => {
            let def = stream_def(engine, name, options);
            if let Ok(existing) = engine.stream(name) {
                if existing.def() == &def {
                    let note = "it already exists with this definition".to_string();
                    return Ok(Output::Unchanged { statement: label, definition: def.describe(), note });
                }
                if *if_not_exists {
                    let note = format!(
                        "IF NOT EXISTS: it exists with another definition, kept ({})",
                        existing.def().describe()
                    );
                    return Ok(Output::Unchanged { statement: label, definition: existing.def().describe(), note });
                }
            }
            let stream = engine.create_stream(def).await?;
            Ok(Output::Created { statement: label, definition: stream.def().describe() })
        }
        Statement::CreateView { def, if_not_exists } => {
            crate::view::execute_create_view(engine, def, *if_not_exists, label).await
        }
        Statement::CreateTransform { def, if_not_exists, stream_options } => {
            crate::view::execute_create_transform(engine, def, stream_options, *if_not_exists, label).await
        }
        Statement::ShowStreams => Ok(Output::Rows {
            statement: label,
            columns: STREAM_COLUMNS.iter().map(|column| column.to_string()).collect(),
            rows: engine
                .streams()
                .iter()
                .filter(|stream| visible(ObjectKind::Stream, stream.name()))
                .map(|stream| stream_row(engine, stream))
                .collect(),
            verb: None,
        }),
        Statement::CreateTable { name, if_not_exists, primary_key, columns, durability, foreign_keys } => {
            for (key, referred) in foreign_keys {
                let column = columns.iter().find(|column| column.name == key.column);
                // The other table's key: its own, for a table that references itself.
                let (other_key, other_type) = if key.table == *name {
                    (
                        primary_key.clone(),
                        columns.iter().find(|column| column.name == *primary_key).map(|c| c.ty.clone()),
                    )
                } else {
                    let other = engine.table(&key.table).map_err(|_| {
                        SqlError::InvalidQuery(format!(
                            "{}.{} REFERENCES {}: there is no table {} (create it first)",
                            name, key.column, key.table, key.table
                        ))
                    })?;
                    let other = other.def();
                    let ty = other.column(&other.primary_key).map(|column| column.ty.clone());
                    (other.primary_key.clone(), ty)
                };
                if let Some(referred) = referred
                    && *referred != other_key
                {
                    return Err(SqlError::InvalidQuery(format!(
                        "{}.{} REFERENCES {}({referred}): a foreign key references a table's primary key, and {}'s \
                         is {other_key}",
                        name, key.column, key.table, key.table
                    )));
                }
                if let (Some(column), Some(other_type)) = (column, other_type)
                    && column.ty != other_type
                {
                    return Err(SqlError::InvalidQuery(format!(
                        "{}.{} is {} and {}.{other_key} is {other_type}: a foreign key has its key's type",
                        name, key.column, column.ty, key.table
                    )));
                }
            }
            let def = TableDef {
                name: name.clone(),
                primary_key: primary_key.clone(),
                columns: columns.clone(),
                indexes: Vec::new(),
                durability: durability.unwrap_or(engine.default_table_durability()),
                foreign_keys: foreign_keys.iter().map(|(key, _)| key.clone()).collect(),
            };
            if let Ok(existing) = engine.table(name) {
                let existing = existing.def();
                if existing.without_indexes() == def {
                    let note = "it already exists with these columns".to_string();
                    return Ok(Output::Unchanged { statement: label, definition: existing.describe(), note });
                }
                if *if_not_exists {
                    let note =
                        format!("IF NOT EXISTS: it exists with another definition, kept ({})", existing.describe());
                    return Ok(Output::Unchanged { statement: label, definition: existing.describe(), note });
                }
            }
            let table = engine.create_table(def).await?;
            Ok(Output::Created { statement: label, definition: table.def().describe() })
        }
        Statement::CreateIndex { name, table, field } => {
            let (index, created) = engine.create_index(table, name.as_deref(), field).await?;
            let definition = format!("index {} on {table} ({})", index.name, index.field);
            if created {
                Ok(Output::Created { statement: label, definition })
            } else {
                let note = "an index on this field exists already".to_string();
                Ok(Output::Unchanged { statement: label, definition, note })
            }
        }
        Statement::AlterStream { name, retention_ms, retention_bytes, partitions } => {
            let current = engine.stream(name)?.def().clone();
            if let Some(partitions) = partitions {
                engine.add_stream_partitions(name, *partitions).await?;
            }
            let retention_ms = retention_ms.unwrap_or(current.retention_ms);
            let retention_bytes = retention_bytes.unwrap_or(current.retention_bytes);
            let stream = engine.alter_stream_retention(name, retention_ms, retention_bytes).await?;
            Ok(Output::Altered { statement: label, definition: stream.def().describe() })
        }
        Statement::DropStream { name, if_exists } => {
            dropped(label, engine.drop_stream(name).await, *if_exists, "stream")
        }
        Statement::DropTable { name, if_exists } => {
            let referencing: Vec<String> = engine
                .tables()
                .iter()
                .filter(|table| table.name() != *name)
                .flat_map(|table| {
                    let def = table.def();
                    def.foreign_keys
                        .iter()
                        .filter(|key| key.table == *name)
                        .map(|key| format!("{}.{}", def.name, key.column))
                        .collect::<Vec<_>>()
                })
                .collect();
            if !referencing.is_empty() {
                return Err(SqlError::InvalidQuery(format!(
                    "{name} is referenced by {}: drop that table first (or make it again without the foreign key)",
                    referencing.join(", ")
                )));
            }
            dropped(label, engine.drop_table(name).await, *if_exists, "table")
        }
        Statement::DropIndex { name, if_exists } => {
            dropped(label, engine.drop_index(name).await.map(|_| ()), *if_exists, "index")
        }
        Statement::ShowTables => Ok(Output::Rows {
            statement: label,
            columns: TABLE_COLUMNS.iter().map(|column| column.to_string()).collect(),
            rows: engine
                .tables()
                .iter()
                .filter(|table| visible(ObjectKind::Table, &table.name()))
                .map(|table| table_row(table))
                .collect(),
            verb: None,
        }),
        Statement::ShowViews => Ok(Output::Rows {
            statement: label,
            columns: VIEW_COLUMNS.iter().map(|column| column.to_string()).collect(),
            rows: engine
                .views()
                .iter()
                .filter(|view| visible(ObjectKind::View, view.name()))
                .map(|view| view_row(view))
                .collect(),
            verb: None,
        }),
        Statement::ShowTransforms => Ok(Output::Rows {
            statement: label,
            columns: TRANSFORM_COLUMNS.iter().map(|column| column.to_string()).collect(),
            rows: engine
                .transforms()
                .iter()
                .filter(|transform| visible(ObjectKind::Stream, transform.name()))
                .map(|transform| transform_row(transform))
                .collect(),
            verb: None,
        }),
        Statement::DropView { name, if_exists } => dropped(label, engine.drop_view(name).await, *if_exists, "view"),
        Statement::Describe { name } => {
            if let Ok(table) = engine.table(name) {
                return Ok(describe_table(label, &table.def()));
            }
            if let Ok(view) = engine.view(name) {
                return Ok(Output::Rows {
                    statement: label,
                    columns: VIEW_COLUMNS.iter().map(|column| column.to_string()).collect(),
                    rows: vec![view_row(&view)],
                    verb: None,
                });
            }
            let stream = engine.stream(name).map_err(|error| match error {
                EngineError::UnknownStream { auto_create, .. } => {
                    EngineError::UnknownStream { name: name.clone(), auto_create }
                }
                other => other,
            })?;
            Ok(Output::Rows {
                statement: label,
                columns: STREAM_COLUMNS.iter().map(|column| column.to_string()).collect(),
                rows: vec![stream_row(engine, &stream)],
                verb: None,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use onehop_engine::EngineOptions;
    use onehop_log::{Log, LogOptions};

    use super::*;
    use crate::parse;

    #[tokio::test]
    async fn statements_run_against_the_engine() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = Log::open(dir.path(), LogOptions::default()).unwrap();
        let engine = Engine::open(Arc::new(log), EngineOptions::default()).unwrap();
        let run = |sql: &'static str| {
            let engine = &engine;
            async move {
                let mut outputs = Vec::new();
                for statement in parse(sql)? {
                    outputs.push(execute(engine, &statement).await?);
                }
                Ok::<_, SqlError>(outputs)
            }
        };
        let outputs = run("CREATE STREAM orders WITH (partitions = 2, retention = '1h')").await.unwrap();
        assert!(matches!(&outputs[0], Output::Created { definition, .. } if definition.contains("partitions = 2")));
        // The same statement again changes nothing (a schema file can be applied at every start).
        let outputs = run("CREATE STREAM orders WITH (partitions = 2, retention = '1h')").await.unwrap();
        assert!(matches!(&outputs[0], Output::Unchanged { .. }), "{outputs:?}");
        // A different definition is refused, unless IF NOT EXISTS keeps the existing one.
        let error = run("CREATE STREAM orders WITH (partitions = 3)").await.unwrap_err();
        assert_eq!(error.code(), "stream_exists");
        let outputs = run("CREATE STREAM IF NOT EXISTS orders WITH (partitions = 3)").await.unwrap();
        assert!(matches!(&outputs[0], Output::Unchanged { note, .. } if note.contains("kept")), "{outputs:?}");
        assert_eq!(engine.stream("orders").unwrap().partition_count(), 2);

        let outputs = run("CREATE STREAM clicks; SHOW STREAMS; DESCRIBE orders").await.unwrap();
        let Output::Rows { columns, rows, .. } = &outputs[1] else { panic!("{outputs:?}") };
        assert_eq!(columns[0], "name");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1][0], "orders");
        assert_eq!(rows[1][3], 3_600_000);
        let Output::Rows { rows, .. } = &outputs[2] else { panic!("{outputs:?}") };
        assert_eq!(rows[0][5], json!([0, 0]));
        assert_eq!(run("DESCRIBE nothing").await.unwrap_err().code(), "unknown_stream");
    }

    #[tokio::test]
    async fn tables_and_indexes_are_created_described_and_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = Log::open(dir.path(), LogOptions::default()).unwrap();
        let engine = Engine::open(Arc::new(log), EngineOptions::default()).unwrap();
        let run = |sql: &'static str| {
            let engine = &engine;
            async move {
                let mut outputs = Vec::new();
                for statement in parse(sql)? {
                    outputs.push(execute(engine, &statement).await?);
                }
                Ok::<_, SqlError>(outputs)
            }
        };
        let schema = "CREATE TABLE orders (id TEXT PRIMARY KEY, customer BIGINT, tags TEXT[]); \
                      CREATE INDEX ON orders (customer); CREATE INDEX by_tag ON orders (tags)";
        let outputs = run(schema).await.unwrap();
        assert!(outputs.iter().all(|output| matches!(output, Output::Created { .. })), "{outputs:?}");
        // A schema file applied again changes nothing.
        let outputs = run(schema).await.unwrap();
        assert!(outputs.iter().all(|output| matches!(output, Output::Unchanged { .. })), "{outputs:?}");
        assert_eq!(run("CREATE TABLE orders (id TEXT PRIMARY KEY)").await.unwrap_err().code(), "table_exists");
        assert_eq!(run("CREATE STREAM orders").await.unwrap_err().code(), "name_taken");

        let outputs = run("SHOW TABLES; DESCRIBE orders").await.unwrap();
        let Output::Rows { rows, .. } = &outputs[0] else { panic!("{outputs:?}") };
        assert_eq!(rows[0][0], "orders");
        assert_eq!(rows[0][3], json!(["orders_customer_idx (customer)", "by_tag (tags)"]));
        let Output::Rows { columns, rows, .. } = &outputs[1] else { panic!("{outputs:?}") };
        assert_eq!(columns[0], "column");
        assert_eq!(rows[0], [json!("id"), json!("TEXT"), json!(true), json!(true), Value::Null]);
        assert_eq!(rows[1][4], "orders_customer_idx");

        let outputs =
            run("DROP INDEX by_tag; DROP INDEX IF EXISTS by_tag; DROP TABLE orders; DROP TABLE IF EXISTS orders")
                .await
                .unwrap();
        assert!(matches!(outputs[0], Output::Dropped { .. }));
        assert!(matches!(outputs[1], Output::Unchanged { .. }));
        assert!(matches!(outputs[2], Output::Dropped { .. }));
        assert!(matches!(outputs[3], Output::Unchanged { .. }));
        assert_eq!(run("DROP TABLE orders").await.unwrap_err().code(), "unknown_table");
        assert_eq!(run("DROP STREAM nothing").await.unwrap_err().code(), "unknown_stream");
    }
}
