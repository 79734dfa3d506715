use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use crate::common::{DataDir, get};

/// Runs kcat against `kafka` with `args`, `input` on its stdin; returns its stdout lines.
/// Runs kcat against `kafka` with `args` and `input` on its stdin, for at most a minute;
/// returns its output whatever its status.
pub(crate) fn kcat_output(kafka: SocketAddr, args: &[&str], input: &str) -> std::process::Output {
    let mut child = Command::new("timeout")
        .args(["60", "kcat", "-b", &kafka.to_string()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat is installed (Debian's kcat; scripts/test installs it)");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// Runs kcat as [`kcat_output`] does, expecting it to succeed; returns its stdout's lines.
fn kcat(kafka: SocketAddr, args: &[&str], input: &str) -> Vec<String> {
    let output = kcat_output(kafka, args, input);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "kcat {args:?}: {stderr}");
    String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect()
}

/// librdkafka, through kcat: an idempotent producer at acks=all with every compression, read
/// back whole; then a consumer group (librdkafka's balanced consumer) reads everything, and,
/// started again, only what came after its committed offset.
#[test]
fn kcat_produces_with_every_compression_and_its_group_resumes_from_its_commit() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    let mut sent = BTreeSet::new();
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let lines: String = (0..10).map(|i| format!("{codec}{i}:{codec}-{i}\n")).collect();
        let settings = ["-X", "enable.idempotence=true", "-X", "acks=all"];
        kcat(kafka, &[&["-P", "-t", "events", "-K:", "-z", codec][..], &settings[..]].concat(), &lines);
        sent.extend((0..10).map(|i| format!("{codec}{i}={codec}-{i}")));
    }
    let read: BTreeSet<String> =
        kcat(kafka, &["-C", "-t", "events", "-o", "beginning", "-e", "-f", "%k=%s\n"], "").into_iter().collect();
    assert_eq!(read, sent);

    let group = ["-G", "readers", "-e", "-f", "%s\n", "-X", "auto.offset.reset=earliest", "events"];
    let first = kcat(kafka, &group, "");
    assert_eq!(first.len(), 50, "{first:?}");
    kcat(kafka, &["-P", "-t", "events", "-K:"], "late:after-1\nlate:after-2\n");
    let second = kcat(kafka, &group, "");
    assert_eq!(second, ["after-1", "after-2"], "the group resumed from its committed offset");
}

/// confluent-kafka for Python (PyPI, bundling a current librdkafka; scripts/test installs it):
/// the admin client creates a topic; idempotent producers write with every codec, each record
/// acknowledged at an offset where onehop's HTTP API finds it; a transaction commits five
/// records and another aborts three; a `read_committed` consumer group reads every committed
/// record once (and no aborted one) and commits.
#[test]
fn confluent_kafka_produces_with_every_codec_in_transactions_and_consumes_in_a_group() {
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/confluent/client.py");
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    let output = Command::new("python3")
        .arg(&script)
        .args([&kafka.to_string(), "invoices", "billing"])
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "confluent-kafka failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let acked = report["acked"].as_array().unwrap();
    assert_eq!(acked.len(), 200, "every record acknowledged");
    for entry in acked {
        let (partition, offset, value) =
            (entry[0].as_u64().unwrap(), entry[1].as_u64().unwrap(), entry[2].as_str().unwrap());
        let (status, body) =
            get(server.address, &format!("/streams/invoices?partition={partition}&from={offset}&limit=1"));
        assert_eq!(status, 200, "{body}");
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        let record = &page["records"][0];
        assert_eq!(
            (record["partition"].as_u64(), record["offset"].as_u64()),
            (Some(partition), Some(offset)),
            "{body}"
        );
        // A value that is not JSON reads back as text.
        let stored = record["value_text"].as_str().map_or_else(|| record["value"].to_string(), str::to_string);
        assert_eq!(stored, value, "acknowledged at {partition}:{offset}");
    }
    let read: Vec<&str> = report["read"].as_array().unwrap().iter().map(|value| value.as_str().unwrap()).collect();
    let distinct: BTreeSet<&str> = read.iter().copied().collect();
    assert_eq!(read.len(), 205, "each committed record once, no aborted one: {report}");
    assert_eq!(distinct.len(), 205);
    assert!(!read.iter().any(|value| value.starts_with("aborted")), "{read:?}");
    assert_eq!(report["headers"], 200, "{report}");
    assert_eq!(report["committed"], 205, "the group committed every record: {report}");
}

/// Kafka's topic tool adds partitions (CreatePartitions) to a topic an SSE subscriber is
/// following: the tool describes the new count, kcat writes to a new partition, and the
/// subscriber, opened before, receives it without reconnecting. Taking partitions away is
/// refused with Kafka's INVALID_PARTITIONS.
#[test]
fn partitions_added_with_kafkas_tool_reach_a_subscriber_already_following() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    crate::create_topic(kafka, "sensors", 2);
    let mut sse = crate::common::RawSse::open(server.address, "/streams/sensors", None);
    let topics = |args: &[&str]| {
        crate::kafka_tool("org.apache.kafka.tools.TopicCommand", kafka).args(args).output().expect("java runs")
    };
    assert!(topics(&["--alter", "--topic", "sensors", "--partitions", "5"]).status.success());
    let described = String::from_utf8_lossy(&topics(&["--describe", "--topic", "sensors"]).stdout).into_owned();
    assert!(described.contains("PartitionCount: 5"), "{described}");
    kcat(kafka, &["-P", "-t", "sensors", "-p", "4", "-K", ":"], "probe:in partition 4\n");
    let (id, event) = sse.next();
    assert_eq!(event["partition"], 4, "{event}");
    assert_eq!(event["value_text"], "in partition 4", "{event}");
    assert_eq!(id, "0:-1,1:-1,2:-1,3:-1,4:0", "the resume id covers the new partitions");
    let fewer = topics(&["--alter", "--topic", "sensors", "--partitions", "3"]);
    let said = format!("{}{}", String::from_utf8_lossy(&fewer.stdout), String::from_utf8_lossy(&fewer.stderr));
    assert!(said.contains("InvalidPartitionsException"), "{said}");
}

/// confluent-kafka's roles (`tests/kafka/confluent/group.py`), started as processes.
pub(crate) fn confluent(args: &[&str]) -> crate::Spawned {
    let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/confluent/group.py");
    crate::spawn_role(Command::new("python3").arg(script).args(args))
}

/// librdkafka (confluent-kafka) as the Java client is tested (`group_of_three`): three members
/// of a group hold a partition each and each consumes its share; one leaves (SIGTERM: close,
/// LeaveGroup) and the other two take its partition over; the server is killed with kill -9
/// once all is committed and started again, and the group resumes from its commits, every
/// record consumed exactly once. Then an idempotent lz4 producer writes while the server is
/// killed after 1000 acknowledgements and restarted: every acknowledged record is at its
/// acknowledged offset, and none is stored twice.
#[test]
fn confluent_kafka_group_of_three_and_idempotent_producer_across_kill_9() {
    crate::group_of_three::group_of_three_and_idempotent_producer_across_kill_9(confluent);
}
