//! Running statements on the engine.

use onehop_engine::{Engine, EngineError, StreamDef};
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
    /// A result set.
    Rows { statement: String, columns: Vec<String>, rows: Vec<Vec<Value>> },
}

fn stream_def(engine: &Engine, name: &str, options: &StreamOptions) -> StreamDef {
    let defaults = engine.default_stream_def(name);
    StreamDef {
        name: name.to_string(),
        partitions: options.partitions.unwrap_or(defaults.partitions),
        retention_ms: options.retention_ms,
        retention_bytes: options.retention_bytes,
        durability: options.durability.unwrap_or(defaults.durability),
    }
}

const STREAM_COLUMNS: [&str; 6] =
    ["name", "partitions", "durability", "retention_ms", "retention_bytes", "end_offsets"];

fn stream_row(stream: &onehop_engine::Stream) -> Vec<Value> {
    let def = stream.def();
    let end_offsets: Vec<u64> =
        (0..def.partitions).map(|partition| stream.partition(partition).map_or(0, |log| log.end_offset())).collect();
    vec![
        json!(def.name),
        json!(def.partitions),
        json!(def.durability.to_string()),
        json!(def.retention_ms),
        json!(def.retention_bytes),
        json!(end_offsets),
    ]
}

/// Runs one statement.
pub async fn execute(engine: &Engine, statement: &Statement) -> Result<Output, SqlError> {
    let label = statement.label();
    match statement {
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
        Statement::ShowStreams => Ok(Output::Rows {
            statement: label,
            columns: STREAM_COLUMNS.iter().map(|column| column.to_string()).collect(),
            rows: engine.streams().iter().map(|stream| stream_row(stream)).collect(),
        }),
        Statement::Describe { name } => {
            let stream = engine.stream(name).map_err(|error| match error {
                EngineError::UnknownStream(_) => EngineError::UnknownStream(name.clone()),
                other => other,
            })?;
            Ok(Output::Rows {
                statement: label,
                columns: STREAM_COLUMNS.iter().map(|column| column.to_string()).collect(),
                rows: vec![stream_row(&stream)],
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
}
