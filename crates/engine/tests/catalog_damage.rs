//! A damaged or lost catalog never costs data: the engine refuses to start on a catalog it
//! cannot read whole, and deletes a topic's files only when the catalog says it was dropped.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{close, stream_def, table_def};
use onehop_engine::{
    CATALOG_TOPIC, ColumnType, Engine, EngineOptions, Position, Precondition, TableDef, Write, set_system_recovery,
};
use onehop_log::{BatchHeader, Log, LogOptions, NewRecord, OpenError};

fn log_options(recover_catalog: bool) -> LogOptions {
    let mut options = LogOptions::default();
    set_system_recovery(&mut options, recover_catalog);
    options
}

fn open(dir: &Path, recover_catalog: bool) -> Result<Engine, String> {
    let (log, _) = Log::open(dir, log_options(recover_catalog)).map_err(|error| error.to_string())?;
    Engine::open(Arc::new(log), EngineOptions::default()).map_err(|error| error.to_string())
}

/// A table with a text key and one integer column.
fn users_def() -> TableDef {
    table_def("users", &[("score", ColumnType::Integer)])
}

/// Every segment under `dir` (except the catalog's) with a digest of its data.
fn data_files(dir: &Path) -> BTreeMap<PathBuf, (usize, u32)> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if !path.ends_with(CATALOG_TOPIC) {
                    pending.push(path);
                }
            } else if path.extension().is_some_and(|extension| extension == "log") {
                // Without the zeros an open segment keeps ahead of its data (they come and go).
                let mut bytes = fs::read(&path).unwrap();
                let data_end = bytes.iter().rposition(|&byte| byte != 0).map_or(0, |at| at + 1);
                bytes.truncate(data_end);
                files.insert(path.clone(), (bytes.len(), fnv1a(&bytes)));
            }
        }
    }
    files
}

fn catalog_segment(dir: &Path) -> PathBuf {
    dir.join(CATALOG_TOPIC).join("0").join(format!("{:020}.log", 0))
}

/// The position of each batch of the catalog's segment.
fn catalog_batches(dir: &Path) -> Vec<(u64, BatchHeader)> {
    let bytes = fs::read(catalog_segment(dir)).unwrap();
    let mut batches = Vec::new();
    let mut at = 0;
    while at + 48 <= bytes.len() && bytes[at..at + 4] == *b"OHB1" {
        let header = BatchHeader::parse(&bytes[at..]).unwrap();
        batches.push((at as u64, header));
        at += header.batch_len as usize;
    }
    batches
}

/// What a `kill -9` leaves of the catalog (no index: it is written on a clean close only), with
/// four bytes flipped inside the batch at `batch_at`.
fn damage_catalog(dir: &Path, batch_at: u64) {
    for suffix in ["index", "timeindex"] {
        let _ = fs::remove_file(catalog_segment(dir).with_extension(suffix));
    }
    let mut bytes = fs::read(catalog_segment(dir)).unwrap();
    for at in 60..64 {
        bytes[batch_at as usize + at] ^= 0xFF;
    }
    fs::write(catalog_segment(dir), bytes).unwrap();
}

/// Creates `orders` (2 partitions, 40 records) and then the table `users` (3 rows).
async fn write_data(dir: &Path) {
    let engine = open(dir, false).unwrap();
    let orders = engine.create_stream(stream_def("orders", 2)).await.unwrap();
    for i in 0..40 {
        orders.publish(&[NewRecord::keyed(format!("customer-{i}"), format!("order {i}"))], None).await.unwrap();
    }
    let users = engine.create_table(users_def()).await.unwrap();
    for (id, score) in [("ada", 1), ("bob", 2), ("cy", 3)] {
        let serde_json::Value::Object(row) = serde_json::json!({ "score": score }) else { unreachable!() };
        users.write(id, Write::Put(row), Precondition::None, None).await.unwrap();
    }
    close(engine);
}

fn records_in(engine: &Engine, stream: &str) -> usize {
    let stream = engine.stream(stream).unwrap();
    (0..stream.partition_count())
        .map(|partition| stream.read(partition, Position::Earliest, 1000, 1 << 20).unwrap().len())
        .sum()
}

#[tokio::test]
async fn a_damaged_catalog_stops_the_start_and_deletes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path()).await;
    let batches = catalog_batches(dir.path());
    assert_eq!(batches.len(), 2, "one batch per definition");
    let data = data_files(dir.path());

    // The last batch (the table's definition) damaged: a torn write, to a partition of user
    // data; for the catalog, a refusal that names the file, the byte and the way out.
    damage_catalog(dir.path(), batches[1].0);
    let damaged = fs::read(catalog_segment(dir.path())).unwrap();
    let error = open(dir.path(), false).err().expect("a damaged catalog stops the start");
    for needed in [catalog_segment(dir.path()).display().to_string(), format!("byte {}", batches[1].0)] {
        assert!(error.contains(&needed), "the refusal names {needed:?}: {error}");
    }
    assert!(error.contains("--recover-catalog"), "the refusal says the way out: {error}");
    assert_eq!(data_files(dir.path()), data, "no data file changed");
    assert_eq!(fs::read(catalog_segment(dir.path())).unwrap(), damaged, "nor the catalog");

    // Recovering keeps the definitions before the damage and every byte of data: the table the
    // catalog lost is an orphan, not deleted.
    let engine = open(dir.path(), true).unwrap();
    assert_eq!(engine.orphans(), ["users"]);
    assert!(engine.table("users").is_err());
    assert_eq!(records_in(&engine, "orders"), 40);
    assert_eq!(data_files(dir.path()), data, "no data file changed");
    // A definition that does not fit the orphan's data is refused, saying why.
    let error = engine.create_stream(stream_def("users", 1)).await.err().unwrap().to_string();
    assert!(error.contains("orphan") && error.contains("table"), "{error}");
    // Defined again, the table takes its rows back.
    let users = engine.create_table(users_def()).await.unwrap();
    assert_eq!(users.get("bob").unwrap().doc()["score"], 2);
    assert!(engine.orphans().is_empty());
    close(engine);
    let engine = open(dir.path(), false).unwrap();
    assert_eq!(engine.table("users").unwrap().get("cy").unwrap().doc()["score"], 3);
    // The damaged catalog file is kept beside the repaired one.
    let kept = fs::read_dir(dir.path().join(CATALOG_TOPIC).join("0"))
        .unwrap()
        .filter(|entry| entry.as_ref().unwrap().file_name().to_string_lossy().contains(".log.damaged-"))
        .count();
    assert_eq!(kept, 1);
}

#[tokio::test]
async fn damage_in_the_first_catalog_batch_is_refused_and_recovered_the_same_way() {
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path()).await;
    let batches = catalog_batches(dir.path());
    let data = data_files(dir.path());
    damage_catalog(dir.path(), batches[0].0);
    let (log_error, _) = match Log::open(dir.path(), log_options(false)) {
        Err(error @ OpenError::Damaged(_)) => (error.to_string(), ()),
        Err(other) => panic!("expected Damaged, got {other}"),
        Ok(_) => panic!("a catalog damaged before a valid batch must not open"),
    };
    assert!(log_error.contains("--recover-catalog"), "{log_error}");
    let engine = open(dir.path(), true).unwrap();
    // The stream's definition was in the damaged batch; the table's, after it, stands.
    assert_eq!(engine.orphans(), ["orders"]);
    assert_eq!(engine.table("users").unwrap().get("ada").unwrap().doc()["score"], 1);
    assert_eq!(data_files(dir.path()), data, "no data file changed");
    engine.create_stream(stream_def("orders", 2)).await.unwrap();
    assert_eq!(records_in(&engine, "orders"), 40);
}

#[tokio::test]
async fn a_lost_catalog_keeps_every_topic_and_a_drop_cut_short_is_still_finished() {
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path()).await;
    // A stream dropped, whose files come back as if the process died before removing them.
    let engine = open(dir.path(), false).unwrap();
    engine.create_stream(stream_def("gone", 1)).await.unwrap().publish(&[NewRecord::value("x")], None).await.unwrap();
    close(engine);
    let saved = tempfile::tempdir().unwrap();
    copy_tree(&dir.path().join("gone"), &saved.path().join("gone"));
    let engine = open(dir.path(), false).unwrap();
    engine.drop_stream("gone").await.unwrap();
    close(engine);
    copy_tree(&saved.path().join("gone"), &dir.path().join("gone"));
    let engine = open(dir.path(), false).unwrap();
    assert!(!dir.path().join("gone").exists(), "the drop the catalog records is finished");
    assert!(engine.orphans().is_empty());
    close(engine);

    // The whole catalog gone: every topic is kept, as an orphan.
    let data = data_files(dir.path());
    fs::remove_dir_all(dir.path().join(CATALOG_TOPIC)).unwrap();
    let engine = open(dir.path(), false).unwrap();
    assert_eq!(engine.orphans(), ["orders", "users"]);
    assert!(engine.streams().is_empty());
    close(engine);
    assert_eq!(data_files(dir.path()), data, "no data file changed");
}

fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.path().is_dir() {
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        } else {
            fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// A checksum that needs no crate: FNV-1a, enough to tell two files apart in a test.
fn fnv1a(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |hash, &byte| (hash ^ byte as u32).wrapping_mul(0x0100_0193))
}
