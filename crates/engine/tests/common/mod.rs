//! Helpers shared by the engine's tests: an engine on a directory of its own, its clean close,
//! and the stream and table definitions most tests start from.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use onehop_engine::{Column, ColumnType, Engine, EngineOptions, StreamDef, TableDef};
use onehop_log::{Durability, Log, LogOptions};

pub fn open(dir: &Path, options: EngineOptions) -> Engine {
    let (log, _) = Log::open(dir, LogOptions::default()).unwrap();
    Engine::open(Arc::new(log), options).unwrap()
}

/// An engine with `options` on a fresh temporary directory, and the directory: `open` after
/// `close` finds the same data again.
pub fn fresh(options: EngineOptions) -> (tempfile::TempDir, Engine) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), options);
    (dir, engine)
}

/// Drops the engine and closes its log, as a clean shutdown does.
pub fn close(engine: Engine) {
    let log = engine.log().clone();
    drop(engine);
    log.close();
}

/// A stream of `partitions` partitions, synced on every write, with no retention limit and no
/// MQTT topic; a test sets what it needs otherwise with `..stream_def(…)`.
pub fn stream_def(name: &str, partitions: u32) -> StreamDef {
    StreamDef {
        name: name.into(),
        partitions,
        retention_ms: None,
        retention_bytes: None,
        durability: Durability::Fsync,
        mqtt_topic: None,
        compacted: false,
    }
}

/// A table keyed by the text column `id`, then `columns` (each nullable), with no index,
/// synced on every write.
pub fn table_def(name: &str, columns: &[(&str, ColumnType)]) -> TableDef {
    let key = Column { name: "id".into(), ty: ColumnType::Text, not_null: true };
    let others = columns.iter().map(|(name, ty)| Column { name: (*name).into(), ty: ty.clone(), not_null: false });
    TableDef {
        name: name.into(),
        primary_key: "id".into(),
        columns: std::iter::once(key).chain(others).collect(),
        indexes: Vec::new(),
        durability: Durability::Fsync,
        foreign_keys: Vec::new(),
    }
}
