//! The engine's one routing rule for messages published by subject, and its one partitioning
//! rule: what MQTT (and any protocol that publishes by subject) calls.

mod common;

use common::{stream_def, table_def};
use onehop_engine::route::RouteError;
use onehop_engine::{Engine, EngineOptions, StreamDef};

fn def(name: &str, partitions: u32, mqtt_topic: Option<&str>) -> StreamDef {
    StreamDef { mqtt_topic: mqtt_topic.map(str::to_string), ..stream_def(name, partitions) }
}

#[tokio::test]
async fn a_subject_goes_to_its_declared_stream_else_the_one_its_first_level_names() {
    let dir = tempfile::tempdir().unwrap();
    let options = EngineOptions { empty_first_level_stream: "slash".into(), ..EngineOptions::default() };
    let engine = Engine::open_in(dir.path(), options).unwrap();
    engine.create_stream(def("telemetry", 4, Some("devices/+/telemetry"))).await.unwrap();

    let declared = engine.route("devices/7/telemetry").await.unwrap();
    assert_eq!(declared.stream.name(), "telemetry", "a declared mqtt_topic wins over the first level");
    let named = engine.route("devices/7/status").await.unwrap();
    assert_eq!(named.stream.name(), "devices", "created on first use");
    let empty = engine.route("/devices/7").await.unwrap();
    assert_eq!(empty.stream.name(), "slash", "an empty first level names the configured stream");

    // One subject, one partition, every time: its messages stay in order.
    for subject in ["devices/1/telemetry", "devices/2/telemetry", "devices/3/telemetry"] {
        let first = engine.route(subject).await.unwrap().partition;
        for _ in 0..3 {
            assert_eq!(engine.route(subject).await.unwrap().partition, first, "{subject}");
        }
        assert_eq!(first, declared.stream.partition_for_subject(subject));
    }
}

#[tokio::test]
async fn subjects_that_take_no_message_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open_in(dir.path(), EngineOptions::default()).unwrap();
    engine.create_table(table_def("users", &[])).await.unwrap();
    let refused = |subject: &'static str| {
        let engine = &engine;
        async move { engine.route(subject).await.err().unwrap_or_else(|| panic!("{subject} was routed")) }
    };
    assert!(matches!(refused("$SYS/uptime").await, RouteError::Reserved(_)));
    assert!(matches!(refused("scores/+").await, RouteError::InvalidSubject { .. }));
    assert!(matches!(refused("users").await, RouteError::Table { table } if table == "users"));
    assert!(matches!(refused("__catalog/x").await, RouteError::Stream(error) if error.code() == "invalid_name"));

    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open_in(dir.path(), EngineOptions { auto_create: false, ..EngineOptions::default() }).unwrap();
    match engine.route("nowhere/1").await {
        Err(RouteError::Stream(error)) => {
            assert_eq!(error.code(), "unknown_stream");
            assert!(error.to_string().contains("auto_create off"), "{error}");
        }
        other => panic!("a stream that may not be created: {:?}", other.map(|route| route.stream.name().to_string())),
    }
}

#[tokio::test]
async fn the_partitioning_rule_puts_a_key_before_a_subject() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open_in(dir.path(), EngineOptions::default()).unwrap();
    let stream = engine.create_stream(def("orders", 8, None)).await.unwrap();
    for i in 0..20 {
        let key = format!("customer-{i}");
        let subject = format!("orders/{i}");
        assert_eq!(
            stream.partition_of(Some(key.as_bytes()), Some(&subject), 5),
            stream.partition_for_key(key.as_bytes())
        );
        assert_eq!(stream.partition_of(None, Some(&subject), 5), stream.partition_for_subject(&subject));
        assert_eq!(stream.partition_of(None, None, 5), 5);
    }
}
