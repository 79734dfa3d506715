//! The engine's one way to open a subscription, as every protocol calls it: a snapshot and the
//! cursor that follows it, a stream created by its first subscriber, and a subscriber that
//! falls behind reading on from the log instead of being cut off.

mod common;

use common::table_def;
use onehop_engine::hub::{Change, Delivery};
use onehop_engine::subscription::{Snapshot, Start, Target};
use onehop_engine::{ColumnType, Engine, EngineOptions, Filter, NewRecord, Position, Precondition, Write};
use serde_json::{Value, json};

fn object(value: Value) -> serde_json::Map<String, Value> {
    let Value::Object(map) = value else { panic!("not an object: {value}") };
    map
}

async fn next(cursor: &mut onehop_engine::hub::Cursor) -> (Change, onehop_engine::Record) {
    let delivery = tokio::time::timeout(std::time::Duration::from_secs(10), cursor.next()).await.expect("in time");
    match delivery.unwrap() {
        Delivery::Event(event, change) => (change, event.record.clone()),
        Delivery::Overflow { positions } => panic!("a protocol's cursor never overflows (at {positions:?})"),
    }
}

#[tokio::test]
async fn a_table_snapshot_then_every_change_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open_in(dir.path(), EngineOptions::default()).unwrap();
    let orders = engine.create_table(table_def("orders", &[("customer", ColumnType::Integer)])).await.unwrap();
    for (id, customer) in [("o1", 42), ("o2", 7), ("o3", 42)] {
        orders.write(id, Write::Put(object(json!({ "customer": customer }))), Precondition::None, None).await.unwrap();
    }
    let filter = Filter::default().with_condition("customer", "42").unwrap();
    let target = Target::Table("orders".into());
    let mut opened =
        engine.open_subscription(&engine.access().anonymous(), &target, filter, Start::Snapshot).await.unwrap();
    let Some(Snapshot::Rows(rows)) = opened.snapshot.take() else { panic!("a table snapshot is rows") };
    let ids: Vec<&str> = rows.iter().map(|row| row.id.as_str()).collect();
    assert_eq!(ids, ["o1", "o3"], "the rows the filter selects");
    orders.write("o2", Write::Put(object(json!({ "customer": 42 }))), Precondition::None, None).await.unwrap();
    let (change, record) = next(&mut opened.cursor).await;
    assert_eq!((change.as_str(), record.key.as_deref()), ("insert", Some(&b"o2"[..])), "o2 entered the set");

    // One row: the target sets the filter's key.
    let target = Target::Row { table: "orders".into(), id: "o3".into() };
    let mut one = engine
        .open_subscription(&engine.access().anonymous(), &target, Filter::default(), Start::At(Position::Latest))
        .await
        .unwrap();
    orders.write("o1", Write::Delete, Precondition::None, None).await.unwrap();
    orders.write("o3", Write::Delete, Precondition::None, None).await.unwrap();
    let (change, record) = next(&mut one.cursor).await;
    assert_eq!((change.as_str(), record.key.as_deref()), ("delete", Some(&b"o3"[..])), "only o3's changes");

    // A stream has no snapshot.
    let refused = engine
        .open_subscription(
            &engine.access().anonymous(),
            &Target::Stream("s".into()),
            Filter::default(),
            Start::Snapshot,
        )
        .await;
    assert_eq!(refused.err().unwrap().code(), "bad_filter");
}

#[tokio::test]
async fn a_first_subscriber_creates_its_stream_and_a_slow_one_reads_on_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    // A queue of 4 events: any burst overflows it.
    let options = EngineOptions { subscriber_queue_capacity: 4, ..EngineOptions::default() };
    let engine = Engine::open_in(dir.path(), options).unwrap();
    let target = Target::Stream("later".into());
    let mut opened = engine
        .open_subscription(&engine.access().anonymous(), &target, Filter::default(), Start::At(Position::Latest))
        .await
        .unwrap();
    assert_eq!(opened.stream.name(), "later", "created by its subscriber");
    let stream = engine.stream("later").unwrap();
    // Live first: the first record comes through the hub.
    stream.publish(&[NewRecord::value("0")], None).await.unwrap();
    assert_eq!(next(&mut opened.cursor).await.1.offset, 0);
    // Then a burst while the subscriber reads nothing: far more than its queue.
    for i in 1..300u64 {
        stream.publish(&[NewRecord::value(i.to_string())], None).await.unwrap();
    }
    for i in 1..300u64 {
        let (_, record) = next(&mut opened.cursor).await;
        assert_eq!(record.offset, i, "every record, in order, none twice");
    }
    assert!(opened.cursor.carried_on() > 0, "it fell behind, and read on from the log");

    let refused = Engine::open_in(
        tempfile::tempdir().unwrap().path(),
        EngineOptions { auto_create: false, ..EngineOptions::default() },
    )
    .unwrap()
    .open_subscription(&engine.access().anonymous(), &target, Filter::default(), Start::At(Position::Latest))
    .await;
    assert_eq!(refused.err().unwrap().code(), "unknown_stream");
}
