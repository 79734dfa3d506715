use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use crate::common::DataDir;

/// The directory of the kafkajs scripts, with kafkajs installed in it.
fn script_dir() -> PathBuf {
    let script_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/kafkajs");
    assert!(
        script_dir.join("node_modules/kafkajs").exists(),
        "kafkajs is not installed: run `npm ci` in {} (scripts/test does)",
        script_dir.display()
    );
    script_dir
}

/// kafkajs (Node.js, `tests/kafka/kafkajs/client.js`): the admin client creates a topic, an
/// idempotent producer writes with acks=all under every codec (none, gzip, snappy, lz4, zstd;
/// the last three registered as kafkajs's docs show), a consumer group reads everything from
/// the beginning with its headers, and the admin client reads back offsets committed for every
/// record. kafkajs comes from the npm registry (scripts/test installs it).
#[test]
fn kafkajs_creates_produces_consumes_in_a_group_and_commits() {
    let script_dir = script_dir();
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    let output = Command::new("node")
        .arg(script_dir.join("client.js"))
        .args([&kafka.to_string(), "payments", "ledger", "200"])
        .current_dir(&script_dir)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "kafkajs failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let read: Vec<&str> = report["read"].as_array().unwrap().iter().map(|value| value.as_str().unwrap()).collect();
    let distinct: BTreeSet<&str> = read.iter().copied().collect();
    let expected: BTreeSet<String> = (0..200).map(|i| format!("key-{i}=value-{i}")).collect();
    assert_eq!(read.len(), 200, "each record once: {report}");
    assert_eq!(distinct, expected.iter().map(String::as_str).collect());
    assert_eq!(report["headersSeen"], 200, "{report}");
    assert_eq!(report["committedTotal"], 200, "the group committed every record: {report}");
}

/// kafkajs's transactional producer (`tests/kafka/kafkajs/transaction.js`): a transaction's
/// records are invisible over HTTP while it is open and all there once it commits, with the
/// offsets it committed for a group; an aborted transaction's records never appear, over HTTP
/// or to a `read_committed` consumer.
#[test]
fn kafkajs_transactions_show_their_records_on_commit_and_never_on_abort() {
    let script_dir = script_dir();
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    let output = Command::new("node")
        .arg(script_dir.join("transaction.js"))
        .args([&kafka.to_string(), &server.address.to_string(), "transfers", "settlement"])
        .current_dir(&script_dir)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "kafkajs failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(report["whileOpen"], 0, "an open transaction's records are not readable: {report}");
    assert_eq!(report["afterCommit"], 5, "{report}");
    let committed: BTreeSet<String> = (0..5).map(|i| format!("committed-{i}")).collect();
    let over_http: BTreeSet<String> =
        report["afterAbort"].as_array().unwrap().iter().map(|value| value.as_str().unwrap().to_string()).collect();
    assert_eq!(over_http, committed, "the aborted records never appear: {report}");
    let read: Vec<String> =
        report["read"].as_array().unwrap().iter().map(|value| value.as_str().unwrap().to_string()).collect();
    assert_eq!(read.len(), 5, "{report}");
    assert_eq!(read.into_iter().collect::<BTreeSet<_>>(), committed);
    assert!(
        report["offsets"].as_array().unwrap().iter().any(|pair| pair[0] == 0 && pair[1] == 42),
        "the transaction committed the group's offset: {report}"
    );
}

/// kafkajs's roles (`tests/kafka/kafkajs/group.js`), started as processes.
fn kafkajs_group(args: &[&str]) -> crate::Spawned {
    let script_dir = script_dir();
    crate::spawn_role(Command::new("node").arg(script_dir.join("group.js")).args(args).current_dir(&script_dir))
}

/// kafkajs as the Java client and librdkafka are tested (`group_of_three`): three members of a
/// group (eachMessage, each record committed with commitOffsets) hold a partition each and each
/// consumes its share; one leaves (SIGTERM: disconnect, LeaveGroup) and the other two take its
/// partition over; the server is killed with kill -9 once all is committed and started again,
/// and the group resumes from its commits, every record consumed exactly once. Then an
/// idempotent lz4 producer (sends of ten, one in flight, as kafkajs's idempotence requires)
/// writes while the server is killed after 1000 acknowledgements and restarted: every
/// acknowledged record is at its acknowledged offset, and none is stored twice.
#[test]
fn kafkajs_group_of_three_and_idempotent_producer_across_kill_9() {
    crate::group_of_three::group_of_three_and_idempotent_producer_across_kill_9(kafkajs_group);
}
