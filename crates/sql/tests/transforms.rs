//! Stateless transforms end to end on a real engine: `CREATE STREAM … AS SELECT` backfills and
//! then follows its source, computes values, keys and subjects, is listed and described, keeps
//! its place across a restart, guards its source against a drop, and is dropped with its stream.

mod common;

use std::time::{Duration, Instant};

use common::{close, fresh, open, run};
use onehop_engine::{Engine, Position};
use onehop_log::{NewRecord, Record};
use onehop_sql::Output;
use serde_json::{Value, json};

async fn publish(engine: &Engine, stream: &str, values: &[Value]) {
    let records: Vec<NewRecord> =
        values.iter().map(|value| NewRecord::value(serde_json::to_vec(value).unwrap())).collect();
    engine.stream(stream).unwrap().publish(&records, None).await.unwrap();
}

/// Every record of `stream`, partition by partition, once it holds `count` (10 s at most).
async fn records(engine: &Engine, stream: &str, count: usize) -> Vec<Record> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stream = engine.stream(stream).unwrap();
        let mut all = Vec::new();
        for partition in 0..stream.partition_count() {
            all.extend(stream.read(partition, Position::Earliest, 100_000, usize::MAX).unwrap());
        }
        if all.len() >= count {
            assert_eq!(all.len(), count, "more records than expected");
            return all;
        }
        assert!(Instant::now() < deadline, "{} of {count} records arrived", all.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn order(i: usize) -> Value {
    let region = ["eu", "us", "ap"][i % 3];
    json!({ "id": format!("o{i}"), "amount": (i * 37) % 200, "region": region, "name": "widget" })
}

/// What the transform below makes of `order(i)`, or `None` when its filter skips it.
fn transformed(i: usize) -> Option<(String, String, Value)> {
    let order = order(i);
    let amount = order["amount"].as_u64().unwrap();
    if amount <= 100 {
        return None;
    }
    let mut value = order.clone();
    value["name"] = json!("WIDGET");
    value["cents"] = json!(amount * 100);
    let region = order["region"].as_str().unwrap();
    Some((format!("o{i}"), format!("orders/{region}"), value))
}

const TRANSFORM: &str = "CREATE STREAM orders WITH (partitions = 2); \
    CREATE STREAM big WITH (partitions = 3, start = 'earliest') AS \
    SELECT *, UPPER(name) AS name, amount * 100 AS cents, id AS _key, 'orders/' || region AS _subject \
    FROM orders WHERE amount > 100";

/// The output's records by key, as (subject, value); checks each names its source record.
fn by_key(records: &[Record], source: &Engine) -> std::collections::BTreeMap<String, (String, Value)> {
    let orders = source.stream("orders").unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for record in records {
        let key = String::from_utf8(record.key.clone().unwrap().to_vec()).unwrap();
        let value: Value = serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
        // The header names the source record, which has the same timestamp and id.
        let (partition, offset) = onehop_engine::view::transform::source_position(record).unwrap();
        let origin = orders.read(partition, Position::Offset(offset), 1, usize::MAX).unwrap().remove(0);
        let origin_value: Value = serde_json::from_slice(origin.value.as_deref().unwrap()).unwrap();
        assert_eq!(origin_value["id"], value["id"]);
        assert_eq!(origin.timestamp_ms, record.timestamp_ms);
        let previous = seen.insert(key.clone(), (record.subject.as_deref().unwrap().to_string(), value));
        assert!(previous.is_none(), "{key} written twice");
    }
    seen
}

fn expected(count: usize) -> std::collections::BTreeMap<String, (String, Value)> {
    (0..count).filter_map(transformed).map(|(key, subject, value)| (key, (subject, value))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_backfills_follows_restarts_and_drops() {
    let (dir, engine) = fresh();
    run(&engine, "CREATE STREAM orders WITH (partitions = 2)").await.unwrap();
    let history: Vec<Value> = (0..300).map(order).collect();
    for chunk in history.chunks(50) {
        publish(&engine, "orders", chunk).await;
    }
    // start = 'earliest': what the source holds already is transformed too.
    let outputs = run(&engine, TRANSFORM).await.unwrap();
    assert!(matches!(&outputs[1], Output::Created { definition, .. } if definition.contains("UPPER(name)")));
    let count = expected(300).len();
    let records_now = records(&engine, "big", count).await;
    assert_eq!(by_key(&records_now, &engine), expected(300));
    // Each key in its partition, as for any keyed publish.
    let big = engine.stream("big").unwrap();
    for partition in 0..3 {
        for record in big.read(partition, Position::Earliest, 10_000, usize::MAX).unwrap() {
            assert_eq!(big.partition_for_key(record.key.as_deref().unwrap()), partition);
        }
    }

    // Live records follow.
    let live: Vec<Value> = (300..400).map(order).collect();
    publish(&engine, "orders", &live).await;
    let records_now = records(&engine, "big", expected(400).len()).await;
    assert_eq!(by_key(&records_now, &engine), expected(400));

    // Listed, described, and the same statement again changes nothing.
    let Output::Rows { columns, rows, .. } = run(&engine, "SHOW TRANSFORMS").await.unwrap().remove(0) else {
        panic!("rows expected")
    };
    let row: serde_json::Map<String, Value> = columns.into_iter().zip(rows[0].clone()).collect();
    assert_eq!(row["name"], "big");
    assert_eq!(row["source"], "orders");
    assert_eq!(row["records_in"], 400);
    assert_eq!(row["records_out"], expected(400).len());
    assert_eq!(row["filtered"], 400 - expected(400).len());
    assert_eq!(row["restoring"], false);
    let Output::Rows { columns, rows, .. } = run(&engine, "DESCRIBE big").await.unwrap().remove(0) else {
        panic!("rows expected")
    };
    let row: serde_json::Map<String, Value> = columns.into_iter().zip(rows[0].clone()).collect();
    assert_eq!(row["partitions"], 3);
    assert!(row["computed_by"].as_str().unwrap().starts_with("CREATE STREAM big WITH"), "{row:?}");
    let again = run(&engine, &TRANSFORM.replace("CREATE STREAM orders WITH (partitions = 2); ", "")).await.unwrap();
    assert!(matches!(&again[0], Output::Unchanged { .. }), "{again:?}");
    let other = run(&engine, "CREATE STREAM big AS SELECT id FROM orders").await.unwrap_err();
    assert_eq!(other.code(), "stream_exists", "{other}");
    let kept = run(&engine, "CREATE STREAM IF NOT EXISTS big AS SELECT id FROM orders").await.unwrap();
    assert!(matches!(&kept[0], Output::Unchanged { .. }), "{kept:?}");

    // The source cannot be dropped while the transform reads it.
    let error = run(&engine, "DROP STREAM orders").await.unwrap_err();
    assert_eq!(error.code(), "in_use");
    assert!(error.to_string().contains("DROP STREAM big"), "{error}");

    // A restart carries on where the transform was: nothing again, nothing missed.
    close(engine).await;
    let engine = open(dir.path());
    let more: Vec<Value> = (400..500).map(order).collect();
    publish(&engine, "orders", &more).await;
    let records_now = records(&engine, "big", expected(500).len()).await;
    assert_eq!(by_key(&records_now, &engine), expected(500));

    // Dropping the stream drops the transform; then the source can go, and the name is free.
    run(&engine, "DROP STREAM big; DROP STREAM orders").await.unwrap();
    assert!(engine.transforms().is_empty());
    close(engine).await;
    let engine = open(dir.path());
    assert!(engine.transforms().is_empty() && engine.streams().is_empty());
    run(&engine, "CREATE STREAM big").await.unwrap();
    close(engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_starts_at_the_end_by_default_and_passes_what_is_not_json() {
    let (_dir, engine) = fresh();
    run(&engine, "CREATE STREAM raw").await.unwrap();
    publish(&engine, "raw", &[json!({"n": 1})]).await;
    run(&engine, "CREATE STREAM copy AS SELECT *, n + 1 AS next, key AS key_seen FROM raw").await.unwrap();
    // Not JSON: its fields are none, so the computed ones are null.
    let raw = engine.stream("raw").unwrap();
    let mut keyed = NewRecord::keyed(bytes::Bytes::from_static(b"k1"), b"not json".to_vec());
    keyed.subject = Some("raw/a".into());
    raw.publish(&[keyed, NewRecord::value(serde_json::to_vec(&json!({"n": 41})).unwrap())], None).await.unwrap();
    let out = records(&engine, "copy", 2).await;
    let values: Vec<Value> =
        out.iter().map(|record| serde_json::from_slice(record.value.as_deref().unwrap()).unwrap()).collect();
    assert_eq!(values, [json!({"next": null, "key_seen": "k1"}), json!({"n": 41, "next": 42, "key_seen": null})]);
    // No `_key` or `_subject` column: the source's key and subject are kept.
    assert_eq!(out[0].key.as_deref(), Some(&b"k1"[..]));
    assert_eq!(out[0].subject.as_deref(), Some("raw/a"));
    close(engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_transforms_are_refused_and_define_nothing() {
    let (_dir, engine) = fresh();
    run(&engine, "CREATE STREAM s; CREATE TABLE t (id TEXT PRIMARY KEY)").await.unwrap();
    for (sql, code) in [
        ("CREATE STREAM out AS SELECT * FROM nowhere", "unknown_stream"),
        ("CREATE STREAM out AS SELECT * FROM t", "invalid_definition"),
        ("CREATE STREAM s AS SELECT * FROM s", "sql_invalid_query"),
        ("CREATE STREAM t2 AS SELECT COUNT(*) AS n FROM s", "sql_unsupported"),
        ("CREATE STREAM out AS SELECT a FROM s GROUP BY a", "sql_unsupported"),
        ("CREATE STREAM out WITH (start = 'now') AS SELECT * FROM s", "sql_invalid_option"),
        ("CREATE STREAM plain WITH (start = 'earliest')", "sql_invalid_option"),
        ("CREATE STREAM s AS SELECT * FROM s2", "stream_exists"),
        ("CREATE STREAM t AS SELECT * FROM s", "name_taken"),
    ] {
        if sql.contains("FROM s2") {
            run(&engine, "CREATE STREAM s2").await.unwrap();
        }
        let error = run(&engine, sql).await.unwrap_err();
        assert_eq!(error.code(), code, "{sql}: {error}");
    }
    assert!(engine.transforms().is_empty());
    let names: Vec<String> = engine.streams().iter().map(|stream| stream.name().to_string()).collect();
    assert_eq!(names, ["s", "s2"]);
    close(engine).await;
}
