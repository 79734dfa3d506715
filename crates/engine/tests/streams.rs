//! Streams through the engine: definitions in the catalog across restarts, partitioning,
//! publishing, reading from every kind of position, and the errors a client can cause.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{close, fresh, open, stream_def};
use onehop_engine::{EngineOptions, Position, StreamDef};
use onehop_log::{Durability, NewRecord};

#[tokio::test]
async fn a_streams_retention_changes_durably_and_keeps_its_records() {
    let (dir, engine) = fresh(EngineOptions::default());
    let orders = engine.create_stream(stream_def("orders", 2)).await.unwrap();
    let published = orders.publish(&[NewRecord::keyed("k", "kept")], None).await.unwrap();
    let altered = engine.alter_stream_retention("orders", Some(3_600_000), Some(1 << 30)).await.unwrap();
    let expected =
        StreamDef { retention_ms: Some(3_600_000), retention_bytes: Some(1 << 30), ..stream_def("orders", 2) };
    assert_eq!(altered.def(), &expected);
    assert_eq!(engine.stream("orders").unwrap().def(), &expected);
    let config = altered.partition_config(1).unwrap();
    assert_eq!((config.retention_ms, config.retention_bytes), (Some(3_600_000), Some(1 << 30)));
    assert!(engine.alter_stream_retention("nothing", None, None).await.is_err());
    close(engine);

    let engine = open(dir.path(), EngineOptions::default());
    let orders = engine.stream("orders").unwrap();
    assert_eq!(orders.def(), &expected, "the change is in the catalog");
    let records = orders.read(published[0].partition, Position::Earliest, 10, 1 << 20).unwrap();
    assert_eq!(records[0].value.as_deref(), Some(&b"kept"[..]));
    engine.alter_stream_retention("orders", None, None).await.unwrap();
    assert_eq!(engine.stream("orders").unwrap().partition_config(0).unwrap().retention_ms, None);
    close(engine);
}

#[tokio::test]
async fn definitions_and_records_survive_a_restart() {
    let (dir, engine) = fresh(EngineOptions::default());
    let orders =
        engine.create_stream(StreamDef { retention_ms: Some(86_400_000), ..stream_def("orders", 4) }).await.unwrap();
    engine.create_stream(stream_def("clicks", 1)).await.unwrap();
    let published = orders.publish(&[NewRecord::keyed("customer-7", "first")], None).await.unwrap();
    close(engine);

    let engine = open(dir.path(), EngineOptions::default());
    let names: Vec<String> = engine.streams().iter().map(|stream| stream.name().to_string()).collect();
    assert_eq!(names, ["clicks", "orders"]);
    let orders = engine.stream("orders").unwrap();
    assert_eq!(orders.def(), &StreamDef { retention_ms: Some(86_400_000), ..stream_def("orders", 4) });
    let records = orders.read(published[0].partition, Position::Earliest, 10, 1 << 20).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].value.as_deref(), Some(&b"first"[..]));
    // The stream's partitions carry its settings.
    assert_eq!(orders.partition_config(0).unwrap().retention_ms, Some(86_400_000));
}

#[tokio::test]
async fn creating_again_is_idempotent_but_a_different_definition_is_refused() {
    let (_dir, engine) = fresh(EngineOptions::default());
    let first = engine.create_stream(stream_def("orders", 4)).await.unwrap();
    let again = engine.create_stream(stream_def("orders", 4)).await.unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    let error = match engine.create_stream(stream_def("orders", 8)).await {
        Err(error) => error,
        Ok(_) => panic!("a conflicting definition was accepted"),
    };
    assert_eq!(error.code(), "stream_exists");
    assert!(error.to_string().contains("partitions = 4"), "{error}");
    // The catalog holds one definition, not three.
    let catalog = engine.log().partition(onehop_engine::CATALOG_TOPIC, 0).unwrap();
    assert_eq!(catalog.end_offset(), 1);
}

#[tokio::test]
async fn auto_create_on_first_publish_and_refusal_when_off() {
    let (dir, engine) = fresh(EngineOptions { default_partitions: 2, ..EngineOptions::default() });
    let stream = engine.stream_or_create("telemetry").await.unwrap();
    assert_eq!(stream.partition_count(), 2);
    close(engine);

    let engine = open(dir.path(), EngineOptions { auto_create: false, ..EngineOptions::default() });
    assert!(engine.stream_or_create("telemetry").await.is_ok(), "created before, so it exists");
    let error = engine.stream_or_create("other").await.err().unwrap();
    assert_eq!(error.code(), "unknown_stream");
    assert!(error.to_string().contains("CREATE STREAM other"), "{error}");
}

#[tokio::test]
async fn a_key_always_lands_in_the_same_partition_in_order() {
    let (_dir, engine) = fresh(EngineOptions::default());
    let stream = engine.create_stream(stream_def("orders", 8)).await.unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for customer in 0..64 {
        let key = format!("customer-{customer}");
        let expected = stream.partition_for_key(key.as_bytes());
        seen.insert(expected);
        for sequence in 0..3 {
            let published = stream
                .publish(&[NewRecord::keyed(key.clone(), format!("{sequence}"))], Some(Durability::Async))
                .await
                .unwrap();
            assert_eq!(published[0].partition, expected);
        }
    }
    assert!(seen.len() > 4, "64 keys should spread over most of 8 partitions, got {seen:?}");
    // One key's records are in publish order within its partition.
    let key = Bytes::from("customer-5");
    let partition = stream.partition_for_key(&key);
    let values: Vec<_> = stream
        .read(partition, Position::Earliest, 1000, 1 << 20)
        .unwrap()
        .into_iter()
        .filter(|record| record.key.as_ref() == Some(&key))
        .map(|record| record.value.unwrap())
        .collect();
    assert_eq!(values, ["0", "1", "2"]);
}

#[tokio::test]
async fn a_mixed_batch_reports_where_each_record_went() {
    let (_dir, engine) = fresh(EngineOptions::default());
    let stream = engine.create_stream(stream_def("mixed", 4)).await.unwrap();
    let records: Vec<NewRecord> = (0..20)
        .map(|i| {
            if i % 3 == 0 {
                NewRecord::value(format!("v{i}"))
            } else {
                NewRecord::keyed(format!("k{i}"), format!("v{i}"))
            }
        })
        .collect();
    let published = stream.publish(&records, None).await.unwrap();
    assert_eq!(published.len(), records.len());
    for (record, place) in records.iter().zip(&published) {
        let read = stream.read(place.partition, Position::Offset(place.offset), 1, 1 << 20).unwrap();
        assert_eq!(read[0].value, record.value, "record published at {place:?} reads back");
        if let Some(key) = &record.key {
            assert_eq!(place.partition, stream.partition_for_key(key));
        }
    }
    // Keyless records of one publish share a partition; the next publish moves on.
    let keyless: Vec<u32> = published.iter().step_by(3).map(|place| place.partition).collect();
    assert!(keyless.windows(2).all(|pair| pair[0] == pair[1]), "{keyless:?}");
    let next = stream.publish(&[NewRecord::value("x")], None).await.unwrap();
    assert_ne!(next[0].partition, keyless[0]);
}

#[tokio::test]
async fn a_refused_batch_writes_nothing_in_any_partition() {
    let options = EngineOptions {
        stream_defaults: onehop_log::PartitionConfig { record_bytes_max: 1024, ..Default::default() },
        ..EngineOptions::default()
    };
    let (_dir, engine) = fresh(options);
    let stream = engine.create_stream(stream_def("limited", 4)).await.unwrap();
    let mut records: Vec<NewRecord> = (0..8).map(|i| NewRecord::keyed(format!("k{i}"), "small")).collect();
    records.push(NewRecord::keyed("big", vec![0u8; 4096]));
    let error = stream.publish(&records, None).await.unwrap_err();
    assert_eq!(error.code(), "record_too_large");
    for partition in 0..4 {
        assert_eq!(stream.end_offset(partition).unwrap(), 0, "partition {partition} was written");
    }
}

#[tokio::test]
async fn reads_start_at_earliest_latest_an_offset_or_a_time() {
    let (_dir, engine) = fresh(EngineOptions::default());
    let stream = engine.create_stream(stream_def("ticks", 1)).await.unwrap();
    let records: Vec<NewRecord> = (0..10)
        .map(|i| NewRecord { timestamp_ms: Some(1_000 + i * 100), ..NewRecord::value(format!("t{i}")) })
        .collect();
    stream.publish(&records, None).await.unwrap();
    let values = |position| -> Vec<String> {
        stream
            .read(0, position, 100, 1 << 20)
            .unwrap()
            .into_iter()
            .map(|record| String::from_utf8(record.value.unwrap().to_vec()).unwrap())
            .collect()
    };
    assert_eq!(values(Position::Earliest).len(), 10);
    assert!(values(Position::Latest).is_empty());
    assert_eq!(values(Position::Offset(7)), ["t7", "t8", "t9"]);
    assert_eq!(values(Position::Time(1_450)), ["t5", "t6", "t7", "t8", "t9"]);
    assert!(values(Position::Time(5_000)).is_empty(), "a time after every record reads from the end");
    let error = stream.read(0, Position::Offset(11), 10, 1 << 20).unwrap_err();
    assert_eq!(error.code(), "offset_past_end");
    let error = stream.read(3, Position::Earliest, 10, 1 << 20).unwrap_err();
    assert_eq!(error.code(), "unknown_partition");
}

#[tokio::test]
async fn bad_names_and_definitions_are_refused_with_reasons() {
    let (_dir, engine) = fresh(EngineOptions::default());
    for (name, reason) in
        [("", "1 to 249"), ("a/b", "'/'"), ("..", "\"..\""), ("__catalog", "reserved"), ("__mine", "reserved")]
    {
        let error =
            engine.create_stream(stream_def(name, 1)).await.err().unwrap_or_else(|| panic!("{name:?} accepted"));
        assert_eq!(error.code(), "invalid_name", "{name:?}");
        assert!(error.to_string().contains(reason), "{name:?}: {error}");
        let error = engine.stream_or_create(name).await.err().unwrap();
        assert_eq!(error.code(), "invalid_name", "{name:?} via auto-create");
    }
    let error = engine.create_stream(stream_def("zero", 0)).await.err().unwrap();
    assert_eq!(error.code(), "invalid_definition");
    let error = engine.create_stream(stream_def("huge", 65)).await.err().unwrap();
    assert!(error.to_string().contains("between 1 and 64"), "{error}");
    assert!(engine.streams().is_empty());
}

#[tokio::test]
async fn concurrent_auto_creates_of_one_name_make_one_definition() {
    let (_dir, engine) = fresh(EngineOptions::default());
    let engine = Arc::new(engine);
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let engine = engine.clone();
            tokio::spawn(async move { engine.stream_or_create("races").await.map(|stream| stream.partition_count()) })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap(), 1);
    }
    let catalog = engine.log().partition(onehop_engine::CATALOG_TOPIC, 0).unwrap();
    assert_eq!(catalog.end_offset(), 1, "one catalog record for one stream");
}

#[tokio::test]
async fn declared_mqtt_topics_route_publishes_and_never_overlap() {
    let (dir, engine) = fresh(EngineOptions::default());
    let routed = |topic: &str| engine.stream_for_mqtt_topic(topic).map(|stream| stream.name().to_string());
    engine
        .create_stream(StreamDef { mqtt_topic: Some("devices/+/telemetry".into()), ..stream_def("telemetry", 1) })
        .await
        .unwrap();
    assert_eq!(routed("devices/d1/telemetry").as_deref(), Some("telemetry"));
    assert_eq!(routed("devices/d1/status"), None);

    // A second stream may not claim a topic the first already takes.
    let error = engine
        .create_stream(StreamDef { mqtt_topic: Some("devices/#".into()), ..stream_def("everything", 1) })
        .await
        .err()
        .expect("an overlapping mqtt_topic was accepted");
    assert_eq!(error.code(), "invalid_definition");
    assert!(error.to_string().contains("overlaps stream telemetry"), "{error}");
    assert!(engine.stream("everything").is_err(), "nothing was created");
    // Disjoint filters are fine; `$` topics and malformed filters are not.
    engine
        .create_stream(StreamDef { mqtt_topic: Some("devices/+/status".into()), ..stream_def("status", 1) })
        .await
        .unwrap();
    for bad in ["$SYS/#", "devices/#/x", "a+/b"] {
        let error =
            engine.create_stream(StreamDef { mqtt_topic: Some(bad.into()), ..stream_def("bad", 1) }).await.err();
        assert!(error.is_some_and(|error| error.to_string().contains("mqtt_topic")), "{bad} was accepted");
    }

    // The routes come back with the catalog, and go with a dropped stream.
    close(engine);
    let engine = open(dir.path(), EngineOptions::default());
    assert_eq!(
        engine.stream("telemetry").unwrap().def().mqtt_topic.as_deref(),
        Some("devices/+/telemetry"),
        "the definition kept its route"
    );
    assert_eq!(engine.stream_for_mqtt_topic("devices/d2/status").unwrap().name(), "status");
    engine.drop_stream("status").await.unwrap();
    assert!(engine.stream_for_mqtt_topic("devices/d2/status").is_none());
}

/// A compacted stream (Kafka's `cleanup.policy=compact`): the definition keeps it across a
/// restart, its partitions are compacted, and a compaction pass leaves the newest record per key
/// in its closed segments (records without a key all stay).
#[tokio::test]
async fn a_compacted_stream_keeps_the_newest_record_per_key() {
    let mut options = EngineOptions::default();
    options.stream_defaults.segment_bytes_max = 4096;
    options.stream_defaults.batch_bytes_max = 4096;
    options.stream_defaults.record_bytes_max = 1024;
    let (dir, engine) = fresh(options.clone());
    let def = StreamDef { compacted: true, ..stream_def("accounts", 1) };
    let accounts = engine.create_stream(def.clone()).await.unwrap();
    for round in 0..100 {
        let records = [
            NewRecord::keyed("alice", format!("balance {round}")),
            NewRecord::keyed("bob", format!("balance {round}")),
            NewRecord::value(format!("keyless {round}")),
        ];
        accounts.publish(&records[..], None).await.unwrap();
    }
    close(engine);

    let engine = open(dir.path(), options);
    let accounts = engine.stream("accounts").unwrap();
    assert_eq!(accounts.def(), &def, "the catalog keeps it compacted");
    assert!(accounts.partition_config(0).unwrap().compacted);
    let partition = engine.log().partitions().into_iter().find(|(name, ..)| name == "accounts").unwrap().2;
    partition.maintain().unwrap();
    let records = accounts.read(0, Position::Earliest, 1000, 1 << 20).unwrap();
    let value = |record: &onehop_log::Record| String::from_utf8(record.value.clone().unwrap().to_vec()).unwrap();
    let keyed: Vec<String> = records.iter().filter(|record| record.key.is_some()).map(value).collect();
    let keyless = records.iter().filter(|record| record.key.is_none()).count();
    assert_eq!(keyless, 100, "records without a key are kept");
    assert!(keyed.len() < 100, "older values were compacted away: {keyed:?}");
    assert_eq!(keyed.iter().filter(|value| *value == "balance 99").count(), 2, "the newest per key stays");
    close(engine);
}
