//! Kafka's own admin tools on what they manage of a topic's data: kafka-delete-records
//! (DeleteRecords), GetOffsetShell's `--time -3` (ListOffsets' max timestamp), kafka-log-dirs
//! (DescribeLogDirs) and `kafka-consumer-groups --delete-offsets` (OffsetDelete).

use crate::common::{DataDir, get};
use crate::groups::{committed, consume_and_commit};
use crate::{console_produce, create_topic, kafka_tool, succeed};

/// GetOffsetShell's answer for `time`: the offset of partition 0 of `topic`.
fn offset_at(kafka: std::net::SocketAddr, topic: &str, time: &str) -> i64 {
    let said =
        succeed(kafka_tool("org.apache.kafka.tools.GetOffsetShell", kafka).args(["--topic", topic, "--time", time]));
    let line = said.lines().find(|line| line.starts_with(&format!("{topic}:0:"))).unwrap_or_else(|| panic!("{said}"));
    line.rsplit(':').next().unwrap().trim().parse().unwrap()
}

#[test]
fn kafkas_admin_tools_delete_records_find_the_newest_describe_log_dirs_and_delete_offsets() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    create_topic(kafka, "trail", 1);
    let lines: Vec<String> = (0..10).map(|n| format!("k{n}\tv{n}")).collect();
    console_produce(kafka, "trail", &lines, &[]);

    // --time -3: the first record with the largest timestamp, as the records say.
    let (_, body) = get(server.address, "/streams/trail?from=0&limit=100");
    let records: serde_json::Value = serde_json::from_str(&body).unwrap();
    let records = records["records"].as_array().unwrap();
    let max = records.iter().map(|record| record["timestamp"].as_i64().unwrap()).max().unwrap();
    let first_max = records.iter().find(|record| record["timestamp"].as_i64() == Some(max)).unwrap()["offset"].as_i64();
    assert_eq!(Some(offset_at(kafka, "trail", "-3")), first_max);

    // A group's offsets, then deleted by the group tool (no member subscribes now).
    assert_eq!(consume_and_commit(kafka, "auditors", "trail", 10).len(), 10);
    assert!(committed(kafka, "auditors").iter().any(|(topic, _, offset)| topic == "trail" && *offset == 10));
    succeed(kafka_tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", kafka).args([
        "--delete-offsets",
        "--group",
        "auditors",
        "--topic",
        "trail",
    ]));
    assert!(committed(kafka, "auditors").iter().all(|(topic, _, offset)| topic != "trail" || *offset < 0));

    // kafka-delete-records: the start moves to 4, durably.
    let offsets = dir.path().join("delete.json");
    std::fs::write(&offsets, r#"{"partitions":[{"topic":"trail","partition":0,"offset":4}],"version":1}"#).unwrap();
    let said = succeed(
        kafka_tool("org.apache.kafka.tools.DeleteRecordsCommand", kafka)
            .args(["--offset-json-file", offsets.to_str().unwrap()]),
    );
    assert!(said.contains("low_watermark: 4"), "{said}");
    assert_eq!(offset_at(kafka, "trail", "-2"), 4);
    let (status, body) = get(server.address, "/streams/trail?from=2");
    assert_eq!(status, 416, "a read before the start: {body}");
    server.kill_9();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    assert_eq!(offset_at(kafka, "trail", "-2"), 4, "the start survives kill -9");
    let (_, body) = get(server.address, "/streams/trail?from=earliest&limit=100");
    let records: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(records["records"][0]["offset"], 4, "{body}");

    // kafka-log-dirs: the log directory and the partition's size.
    let said = succeed(kafka_tool("org.apache.kafka.tools.LogDirsCommand", kafka).args([
        "--describe",
        "--topic-list",
        "trail",
    ]));
    let json = said.lines().find(|line| line.starts_with('{')).unwrap_or_else(|| panic!("{said}"));
    let described: serde_json::Value = serde_json::from_str(json).unwrap();
    let partition = &described["brokers"][0]["logDirs"][0]["partitions"][0];
    assert_eq!(partition["partition"], "trail-0", "{said}");
    assert!(partition["size"].as_i64().is_some_and(|size| size > 0), "{said}");
}
