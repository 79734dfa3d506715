//! Tables: writes, conditional writes, typed columns, indexed queries, replay after restart,
//! and subscriptions that see rows enter, change in and leave their filter's set.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{stream_def, table_def};
use onehop_engine::hub::{Change, Cursor, Delivery};
use onehop_engine::{ColumnType, Engine, EngineOptions, Filter, Precondition, StreamDef, Table, TableDef, Write};
use onehop_log::{Durability, NewRecord};
use serde_json::{Map, Value, json};

fn open(dir: &std::path::Path) -> Arc<Engine> {
    Arc::new(common::open(dir, EngineOptions::default()))
}

fn orders_def() -> TableDef {
    table_def("orders", &[("customer", ColumnType::Integer), ("tags", ColumnType::parse("text[]").unwrap())])
}

fn object(value: Value) -> Map<String, Value> {
    let Value::Object(map) = value else { panic!("not an object: {value}") };
    map
}

/// An engine on a fresh directory, holding the table `orders_def()`.
async fn orders_table() -> (tempfile::TempDir, Arc<Engine>, Arc<Table>) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let table = engine.create_table(orders_def()).await.unwrap();
    (dir, engine, table)
}

async fn put(table: &Arc<Table>, id: &str, row: Value) -> u64 {
    table.write(id, Write::Put(object(row)), Precondition::None, None).await.unwrap().offset
}

fn row_json(table: &Table, id: &str) -> Option<Value> {
    table.get(id).map(|row| serde_json::from_slice(&row.json).unwrap())
}

fn ids(page: &onehop_engine::Page) -> Vec<&str> {
    page.rows.iter().map(|row| row.id.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_are_written_read_patched_and_deleted() {
    let (_dir, _engine, orders) = orders_table().await;

    let written =
        orders.write("o1", Write::Put(object(json!({"customer": 42}))), Precondition::None, None).await.unwrap();
    assert!(written.created);
    assert_eq!(row_json(&orders, "o1"), Some(json!({"id": "o1", "customer": 42})), "read your write");
    let version = written.offset;

    let patched = orders
        .write("o1", Write::Patch(object(json!({"tags": ["a"], "note": "x"}))), Precondition::Version(version), None)
        .await
        .unwrap();
    assert!(!patched.created);
    assert_eq!(row_json(&orders, "o1"), Some(json!({"id": "o1", "customer": 42, "tags": ["a"], "note": "x"})));

    // The old version no longer matches: nothing is written.
    let error = orders.write("o1", Write::Delete, Precondition::Version(version), None).await.unwrap_err();
    assert_eq!(error.code(), "precondition_failed");
    assert!(error.to_string().contains(&format!("version is {}", patched.offset)), "{error}");
    let error = orders.write("o1", Write::Put(object(json!({}))), Precondition::Missing, None).await.unwrap_err();
    assert_eq!(error.code(), "precondition_failed");
    assert_eq!(orders.storage().end_offset(0).unwrap(), 2, "refused writes append nothing");

    // Type checks, key checks, unknown rows.
    let bad = orders.write("o2", Write::Put(object(json!({"customer": "42"}))), Precondition::None, None).await;
    assert_eq!(bad.unwrap_err().code(), "invalid_row");
    let bad = orders.write("o2", Write::Put(object(json!({"id": "o3"}))), Precondition::None, None).await;
    assert!(bad.unwrap_err().to_string().contains("cannot change"));
    let missing = orders.write("nope", Write::Patch(Map::new()), Precondition::None, None).await;
    assert_eq!(missing.unwrap_err().code(), "not_found");
    assert_eq!(orders.write("nope", Write::Delete, Precondition::None, None).await.unwrap_err().code(), "not_found");

    orders.write("o1", Write::Delete, Precondition::Exists, Some(Durability::Async)).await.unwrap();
    assert_eq!(row_json(&orders, "o1"), None);
    assert_eq!(orders.row_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexed_queries_page_in_id_order_and_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let engine = open(dir.path());
        let orders = engine.create_table(orders_def()).await.unwrap();
        for i in 0..20 {
            let customer = if i % 2 == 0 { json!(42) } else { json!(7) };
            put(&orders, &format!("o{i:02}"), json!({"customer": customer, "tags": ["t", format!("t{}", i % 3)]}))
                .await;
        }
        // An undeclared field with mixed types: "42" and 42 both match ?flag=42.
        put(&orders, "x1", json!({"flag": "42"})).await;
        put(&orders, "x2", json!({"flag": 42})).await;

        let condition = |path: &str, value: &str| onehop_engine::filter::Condition::new(path, value).unwrap();
        let error = orders.query(&[condition("customer", "42")], None, 10, false).unwrap_err();
        assert_eq!(error.code(), "unindexed_field");
        assert!(error.to_string().contains("CREATE INDEX ON orders (customer)"), "{error}");
        let scanned = orders.query(&[condition("customer", "42")], None, 100, true).unwrap();
        assert_eq!(scanned.rows.len(), 10);

        let (index, created) = engine.create_index("orders", None, "customer").await.unwrap();
        assert!(created);
        assert_eq!(index.name, "orders_customer_idx");
        assert!(!engine.create_index("orders", None, "customer").await.unwrap().1, "idempotent");
        engine.create_index("orders", Some("by_tag"), "tags").await.unwrap();
        engine.create_index("orders", None, "flag").await.unwrap();

        let first = orders.query(&[condition("customer", "42")], None, 4, false).unwrap();
        assert_eq!(ids(&first), ["o00", "o02", "o04", "o06"]);
        assert_eq!(first.next_after.as_deref(), Some("o06"));
        let second = orders.query(&[condition("customer", "42")], first.next_after.as_deref(), 100, false).unwrap();
        assert_eq!(ids(&second), ["o08", "o10", "o12", "o14", "o16", "o18"]);
        assert_eq!(second.next_after, None);
        // Array membership, combined with a second condition checked on each row.
        let both = orders.query(&[condition("tags", "t1"), condition("customer", "7")], None, 100, false).unwrap();
        assert_eq!(ids(&both), ["o01", "o07", "o13", "o19"]);
        let mixed = orders.query(&[condition("flag", "42")], None, 100, false).unwrap();
        assert_eq!(ids(&mixed), ["x1", "x2"]);

        // Indexes follow changes.
        put(&orders, "o00", json!({"customer": 7})).await;
        orders.write("o02", Write::Delete, Precondition::None, None).await.unwrap();
        let after = orders.query(&[condition("customer", "42")], None, 3, false).unwrap();
        assert_eq!(ids(&after), ["o04", "o06", "o08"]);
        engine.log().close();
    }
    // Replayed from the log: the same rows, the same indexes.
    let engine = open(dir.path());
    let orders = engine.table("orders").unwrap();
    assert_eq!(orders.row_count(), 21);
    assert_eq!(orders.def().indexes.len(), 3);
    let condition = onehop_engine::filter::Condition::new("customer", "42").unwrap();
    let page = orders.query(&[condition], None, 3, false).unwrap();
    assert_eq!(ids(&page), ["o04", "o06", "o08"]);
    assert_eq!(row_json(&orders, "o00"), Some(json!({"id": "o00", "customer": 7})));

    assert_eq!(engine.drop_index("by_tag").await.unwrap(), "orders");
    assert_eq!(engine.drop_index("by_tag").await.unwrap_err().code(), "unknown_index");
    let tags = onehop_engine::filter::Condition::new("tags", "t1").unwrap();
    assert_eq!(orders.query(&[tags], None, 3, false).unwrap_err().code(), "unindexed_field");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_patches_lose_nothing() {
    let (_dir, _engine, counters) = orders_table().await;
    put(&counters, "c", json!({})).await;
    let mut tasks = Vec::new();
    for writer in 0..16 {
        let counters = counters.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..10 {
                let patch = object(json!({ format!("w{writer}_{i}"): true }));
                counters.write("c", Write::Patch(patch), Precondition::None, None).await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let row = row_json(&counters, "c").unwrap();
    assert_eq!(row.as_object().unwrap().len(), 1 + 160, "every patch applied on top of the one before");
}

async fn next(cursor: &mut Cursor) -> (Change, String, Option<Value>) {
    match tokio::time::timeout(Duration::from_secs(10), cursor.next()).await.expect("an event within 10 s").unwrap() {
        Delivery::Event(event, change) => {
            let id = String::from_utf8(event.record.key.clone().unwrap().to_vec()).unwrap();
            (change, id, event.doc().cloned())
        }
        Delivery::Overflow { positions } => panic!("overflow at {positions:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_see_rows_enter_change_and_leave() {
    let (_dir, engine, orders) = orders_table().await;
    put(&orders, "before", json!({"customer": 42})).await;
    let start = orders.applied_offset();
    let filter = Filter::default().with_condition("customer", "42").unwrap();
    let mut customer = engine.subscribe(orders.storage(), filter.clone(), vec![start]).unwrap();
    let mut tagged = engine
        .subscribe(orders.storage(), Filter::default().with_condition("tags", "vip").unwrap(), vec![start])
        .unwrap();
    let row = Filter { key: Some("o1".into()), ..Filter::default() };
    let mut one_row = engine.subscribe(orders.storage(), row, vec![start]).unwrap();

    put(&orders, "o1", json!({"customer": 42})).await; // enters customer=42
    put(&orders, "o2", json!({"customer": 7})).await; // concerns nobody but the whole table
    orders.write("o1", Write::Patch(object(json!({"tags": ["vip"]}))), Precondition::None, None).await.unwrap();
    orders.write("o1", Write::Patch(object(json!({"customer": 7}))), Precondition::None, None).await.unwrap(); // leaves
    orders.write("o2", Write::Patch(object(json!({"customer": 42}))), Precondition::None, None).await.unwrap(); // enters
    orders.write("o1", Write::Delete, Precondition::None, None).await.unwrap();

    let expected_customer =
        [(Change::Insert, "o1"), (Change::Update, "o1"), (Change::Delete, "o1"), (Change::Insert, "o2")];
    for (change, id) in expected_customer {
        let (got, got_id, _) = next(&mut customer).await;
        assert_eq!((got, got_id.as_str()), (change, id));
    }
    let (change, id, doc) = next(&mut tagged).await;
    assert_eq!((change, id.as_str()), (Change::Insert, "o1"));
    assert_eq!(doc.unwrap()["tags"], json!(["vip"]));
    assert_eq!(next(&mut tagged).await.0, Change::Update, "o1 changed customer, still tagged");
    assert_eq!(next(&mut tagged).await.0, Change::Delete, "o1 deleted: leaves the set");
    for change in [Change::Insert, Change::Update, Change::Update, Change::Delete] {
        assert_eq!(next(&mut one_row).await.0, change);
    }

    // Resuming from the log alone classifies the same way: read it again from the start.
    let mut replayed = engine.subscribe(orders.storage(), filter, vec![start]).unwrap();
    for (change, id) in expected_customer {
        let (got, got_id, _) = next(&mut replayed).await;
        assert_eq!((got, got_id.as_str()), (change, id));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_then_changes_has_no_gap_and_no_duplicate() {
    let (_dir, engine, counters) = orders_table().await;
    for i in 0..50 {
        put(&counters, &format!("r{i:02}"), json!({"customer": 1, "n": 0})).await;
    }
    // Writers keep bumping every row while subscriptions take their snapshots.
    let writer = {
        let counters = counters.clone();
        tokio::spawn(async move {
            for n in 1..=20 {
                for i in 0..50 {
                    let patch = object(json!({ "n": n }));
                    counters.write(&format!("r{i:02}"), Write::Patch(patch), Precondition::None, None).await.unwrap();
                }
            }
        })
    };
    let filter = Filter::default().with_condition("customer", "1").unwrap();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        let (rows, next_offset) = counters.snapshot(&filter);
        assert_eq!(rows.len(), 50);
        let mut seen: std::collections::HashMap<String, i64> =
            rows.iter().map(|row| (row.id.clone(), row.doc()["n"].as_i64().unwrap())).collect();
        let mut cursor = engine.subscribe(counters.storage(), filter.clone(), vec![next_offset]).unwrap();
        // Every change after the snapshot moves a row's n up by exactly one.
        while seen.values().any(|&n| n < 20) {
            let (change, id, doc) = next(&mut cursor).await;
            assert_eq!(change, Change::Update);
            let n = doc.unwrap()["n"].as_i64().unwrap();
            let before = seen.insert(id.clone(), n).unwrap();
            assert_eq!(n, before + 1, "row {id}: a gap or a duplicate between snapshot and changes");
        }
    }
    writer.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_shared_and_drops_remove_data() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let events_def = stream_def("events", 1);
    let events = engine.create_stream(events_def.clone()).await.unwrap();
    events.publish(&[NewRecord::value("old")], None).await.unwrap();
    let clash = TableDef { name: "events".into(), ..orders_def() };
    assert_eq!(engine.create_table(clash).await.err().unwrap().code(), "name_taken");
    let orders = engine.create_table(orders_def()).await.unwrap();
    put(&orders, "o1", json!({})).await;
    assert_eq!(
        engine.create_stream(StreamDef { name: "orders".into(), ..events_def.clone() }).await.err().unwrap().code(),
        "name_taken"
    );
    let other = TableDef { columns: vec![orders_def().columns[0].clone()], ..orders_def() };
    assert_eq!(engine.create_table(other).await.err().unwrap().code(), "table_exists");

    engine.drop_stream("events").await.unwrap();
    engine.drop_table("orders").await.unwrap();
    assert_eq!(engine.drop_table("orders").await.unwrap_err().code(), "unknown_table");
    assert!(!dir.path().join("events").exists());
    // Created again, they start empty.
    let events = engine.create_stream(events_def).await.unwrap();
    assert_eq!(events.end_offset(0).unwrap(), 0);
    let orders = engine.create_table(orders_def()).await.unwrap();
    assert_eq!(orders.row_count(), 0);
    assert_eq!(orders.get("o1").map(|row| row.id), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_subscriptions_filter_on_json_fields() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    let scores =
        engine.create_stream(StreamDef { durability: Durability::Async, ..stream_def("scores", 2) }).await.unwrap();
    let filter = Filter::default().with_condition("team", "red").unwrap().with_condition("points", "3").unwrap();
    let mut red_threes = engine.subscribe(&scores, filter, vec![0, 0]).unwrap();
    let values = [
        json!({"team": "red", "points": 3, "n": 1}),
        json!({"team": "blue", "points": 3, "n": 2}),
        json!({"team": "red", "points": 2, "n": 3}),
        json!({"team": ["red", "green"], "points": 3.0, "n": 4}),
        json!("not an object"),
        json!({"team": "red", "points": "3", "n": 5}),
    ];
    for value in &values {
        scores.publish(&[NewRecord::value(value.to_string())], None).await.unwrap();
    }
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (change, _, doc) =
            match tokio::time::timeout(Duration::from_secs(10), red_threes.next()).await.unwrap().unwrap() {
                Delivery::Event(event, change) => (change, (), event.doc().cloned()),
                Delivery::Overflow { .. } => panic!("overflow"),
            };
        assert_eq!(change, Change::Record);
        seen.push(doc.unwrap()["n"].as_i64().unwrap());
    }
    seen.sort();
    assert_eq!(seen, [1, 4, 5]);
}
