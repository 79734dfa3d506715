use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{DataDir, line_channel};
use crate::{create_topic, kafka_tool};

/// Kafka's VerifiableProducer (idempotent, acks=all) writes while the server is killed with
/// kill -9 and started again on the same port. Every record it was told is acknowledged is in
/// the stream at the partition and offset it was told, and no value is stored twice: the
/// batches in flight at the kill are retried after the restart and recognised.
#[test]
fn acknowledged_records_survive_kill_9_and_retries_are_not_stored_twice() {
    let dir = DataDir::new();
    let port = crate::free_port().to_string();
    let address = format!("127.0.0.1:{port}");
    let mut server = crate::start_with_kafka_on(&dir, &address);
    let kafka = server.kafka_address.unwrap();
    create_topic(kafka, "ledger", 3);
    let total = 6000;
    let mut producer = kafka_tool("org.apache.kafka.tools.VerifiableProducer", kafka)
        .args(["--topic", "ledger", "--max-messages", &total.to_string(), "--throughput", "1500", "--acks", "-1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("java runs");
    let lines = line_channel(producer.stdout.take().unwrap());
    let mut acked: Vec<serde_json::Value> = Vec::new();
    let mut killed = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "the producer did not finish; {} acknowledged", acked.len());
        let Ok(line) = lines.recv_timeout(Duration::from_secs(60)) else { break };
        let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
        match event["name"].as_str() {
            Some("producer_send_success") => acked.push(event),
            Some("tool_data") => break,
            _ => {}
        }
        if !killed && acked.len() >= 1500 {
            server.kill_9();
            killed = true;
            std::thread::sleep(Duration::from_millis(300));
            server = crate::start_with_kafka_on(&dir, &address);
        }
    }
    assert!(killed, "the server was killed mid-run");
    let _ = producer.wait();
    assert!(acked.len() > 3000, "most records were acknowledged: {}", acked.len());

    // Every acknowledged record is where the producer was told, each value stored once, and
    // each partition's values in the order they were sent.
    // The producer's values are numbers, which read back as JSON values.
    let stored: BTreeMap<(u64, u64), String> =
        crate::records_over_http(server.address, "ledger").iter().map(crate::placed_value).collect();
    for event in &acked {
        let at = (event["partition"].as_u64().unwrap(), event["offset"].as_u64().unwrap());
        assert_eq!(stored.get(&at).map(String::as_str), event["value"].as_str(), "acknowledged {event} lost or moved");
    }
    let mut seen = BTreeMap::new();
    let mut last_per_partition: BTreeMap<u64, u64> = BTreeMap::new();
    for ((partition, offset), value) in &stored {
        assert!(seen.insert(value.clone(), (*partition, *offset)).is_none(), "value {value} stored twice");
        let number: u64 = value.parse().unwrap();
        if let Some(last) = last_per_partition.insert(*partition, number) {
            assert!(number > last, "partition {partition}: {number} after {last}");
        }
    }
}
