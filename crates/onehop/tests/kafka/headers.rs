//! Record headers are an ordered list, as Kafka has them: a name may repeat and a value may be
//! null. Written by confluent-kafka, by an HTTP batch and by an MQTT 5 publisher with repeated
//! user properties, they reach a Kafka consumer (confluent-kafka) exactly as written, and an
//! HTTP read lists every one in order.

use std::process::Command;

use crate::common::{DataDir, curl, get, request};

/// Produces one record with `headers` (a JSON list of `[name, text or null]`) to `topic`, then
/// reads `count` records from the start; prints each as a JSON line `{"key", "headers"}`.
const PRODUCE_AND_CONSUME: &str = r#"
import json, sys, time
from confluent_kafka import Consumer, Producer
broker, topic, headers, count = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
producer = Producer({"bootstrap.servers": broker})
producer.produce(topic, key="from-kafka", value="v",
                 headers=[(name, None if value is None else value.encode()) for name, value in headers])
if producer.flush(30) != 0:
    raise RuntimeError("the record was not sent")
consumer = Consumer({"bootstrap.servers": broker, "group.id": "header-readers", "auto.offset.reset": "earliest"})
consumer.subscribe([topic])
seen = []
deadline = time.time() + 60
while len(seen) < count and time.time() < deadline:
    message = consumer.poll(0.5)
    if message is None or message.error():
        continue
    pairs = [[name, None if value is None else value.decode()] for name, value in (message.headers() or [])]
    seen.append({"key": message.key().decode() if message.key() else None, "headers": pairs})
consumer.close()
for record in seen:
    print(json.dumps(record))
"#;

#[test]
fn repeated_names_and_null_values_reach_every_reader_as_written() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    let (status, body) = request(server.address, "POST", "/sql", "CREATE STREAM traces WITH (partitions = 1)").unwrap();
    assert_eq!(status, 200, "{body}");

    // HTTP: a batch line whose headers are a list, to repeat a name and give a null.
    let line = r#"{"key":"from-http","value":1,"headers":[["trace","x"],["trace","y"],["n",null]]}"#;
    let (status, body) = curl(
        server.address,
        "/streams/traces",
        &["-X", "POST", "-H", "content-type: application/x-ndjson", "--data-binary", line],
    );
    assert_eq!(status, 200, "{body}");

    // MQTT 5: user properties may repeat a name; they become headers in order.
    let published = Command::new("timeout")
        .args(["30", "mosquitto_pub", "-h", "127.0.0.1", "-p", &server.mqtt_address.port().to_string()])
        .args(["-V", "mqttv5", "-q", "1", "-t", "traces/mqtt", "-m", "m"])
        .args(["-D", "publish", "user-property", "trace", "p"])
        .args(["-D", "publish", "user-property", "trace", "q"])
        .output()
        .expect("mosquitto_pub runs");
    assert!(published.status.success(), "{}", String::from_utf8_lossy(&published.stderr));

    // Kafka: confluent-kafka writes repeats, a null and an empty value, and reads all three
    // records back.
    let produced = r#"[["trace","a"],["n",null],["trace","b"],["e",""],["trace",null]]"#;
    let output = Command::new("python3")
        .args(["-c", PRODUCE_AND_CONSUME, &kafka.to_string(), "traces", produced, "3"])
        .output()
        .expect("python3 runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let records: Vec<serde_json::Value> =
        String::from_utf8_lossy(&output.stdout).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(records.len(), 3, "{records:?}");
    let headers = |key: &str| -> serde_json::Value {
        let record = records.iter().find(|record| record["key"] == key).unwrap_or_else(|| panic!("{key}: {records:?}"));
        record["headers"].clone()
    };
    assert_eq!(headers("from-kafka"), serde_json::from_str::<serde_json::Value>(produced).unwrap());
    assert_eq!(headers("from-http"), serde_json::json!([["trace", "x"], ["trace", "y"], ["n", null]]));
    // The MQTT message (no key) carries its subject and QoS as onehop's headers too; its own
    // properties keep their order.
    let mqtt = records.iter().find(|record| record["key"].is_null()).expect("the MQTT message");
    let traces: Vec<&serde_json::Value> =
        mqtt["headers"].as_array().unwrap().iter().filter(|pair| pair[0] == "trace").map(|pair| &pair[1]).collect();
    assert_eq!(traces, [&serde_json::json!("p"), &serde_json::json!("q")], "{mqtt}");

    // HTTP reads list every header in order once a name repeats; the object keeps the last.
    let (status, body) = get(server.address, "/streams/traces?from=earliest");
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    let from_kafka = page["records"].as_array().unwrap().iter().find(|record| record["key"] == "from-kafka").unwrap();
    assert_eq!(
        from_kafka["header_list"],
        serde_json::json!([["trace", "a"], ["n", null], ["trace", "b"], ["e", ""], ["trace", null]]),
        "{from_kafka}"
    );
    assert_eq!(from_kafka["headers"], serde_json::json!({"trace": null, "n": null, "e": ""}), "{from_kafka}");
}
