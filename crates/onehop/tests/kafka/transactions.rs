use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{DataDir, get, line_channel, publish_in_batches};
use crate::{Spawned, create_topic, kafka_tool, succeed};

/// Kafka's TransactionalMessageCopier for one input partition: consumes it, produces each
/// record to `output` in transactions of 50 that also commit the consumed offsets (with the
/// consumer's group metadata, KIP-447), and aborts about a third of them at random.
fn copier(kafka: &str, partition: u32) -> Spawned {
    let mut command = std::process::Command::new("java");
    command
        .arg("-cp")
        .arg(format!("{}/*", crate::kafka_jars().display()))
        .arg("org.apache.kafka.tools.TransactionalMessageCopier")
        .args(["--broker-list", kafka, "--input-topic", "input", "--output-topic", "output"])
        .args(["--input-partition", &partition.to_string(), "--transactional-id", &format!("copier-{partition}")])
        .args(["--consumer-group", "copiers", "--transaction-size", "50", "--enable-random-aborts"])
        .arg("--use-group-metadata")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    Spawned(command.spawn().expect("java runs"), None)
}

fn aborted_so_far(address: std::net::SocketAddr) -> u64 {
    let (_, metrics) = get(address, "/metrics");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("kafka_transactions_aborted_total "))
        .map_or(0, |value| value.trim().parse().unwrap())
}

/// Three copiers (Java transactional producers with read_committed consumers, aborting at
/// random) copy 3 000 records published over HTTP while the server is killed with kill -9 and
/// started again on the same port. The output holds every input record exactly once, none of
/// an aborted or interrupted transaction, and the group's committed offsets are the input's
/// ends: the copy is exactly once across the crash.
#[test]
fn a_transactional_copy_is_exactly_once_across_aborts_and_a_kill_9() {
    let dir = DataDir::new();
    let address = format!("127.0.0.1:{}", crate::free_port());
    let mut server = crate::start_with_kafka_on(&dir, &address);
    let kafka = server.kafka_address.unwrap();
    create_topic(kafka, "input", 3);
    create_topic(kafka, "output", 3);
    let total = 3000;
    let values: Vec<serde_json::Value> = (0..total).map(|i| serde_json::json!(i)).collect();
    publish_in_batches(server.address, "input", &values, 500);

    let mut copiers: Vec<(u32, Spawned, u32)> =
        (0..3).map(|partition| (partition, copier(&address, partition), 0)).collect();
    // The kill comes once the copiers are under way, and before they are done.
    let progress: Vec<_> = copiers.iter_mut().map(|(_, child, _)| line_channel(child.stdout.take().unwrap())).collect();
    let mut processed = [0u64; 3];
    let started = Instant::now();
    while processed.iter().sum::<u64>() < 300 && started.elapsed() < Duration::from_secs(60) {
        for (copier, lines) in progress.iter().enumerate() {
            while let Ok(line) = lines.try_recv() {
                if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) {
                    processed[copier] = processed[copier].max(event["totalProcessed"].as_u64().unwrap_or(0));
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let before_kill: u64 = processed.iter().sum();
    assert!((300..total).contains(&before_kill), "the kill comes mid-copy: {processed:?}");
    let mut aborted = aborted_so_far(server.address);
    server.kill_9();
    std::thread::sleep(Duration::from_millis(300));
    server = crate::start_with_kafka_on(&dir, &address);

    // A copier that gives up on an error is started again: it goes on from its committed offsets.
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut drains = Vec::new();
    while !copiers.is_empty() {
        assert!(Instant::now() < deadline, "the copiers did not finish");
        let mut running = Vec::new();
        for (partition, mut child, restarts) in copiers {
            match child.try_wait().unwrap() {
                None => running.push((partition, child, restarts)),
                Some(status) if status.success() => {}
                Some(status) => {
                    assert!(restarts < 3, "copier {partition} failed {restarts} times, last: {status}");
                    let mut again = copier(&address, partition);
                    drains.push(line_channel(again.stdout.take().unwrap()));
                    running.push((partition, again, restarts + 1));
                }
            }
        }
        copiers = running;
        std::thread::sleep(Duration::from_millis(200));
    }
    aborted += aborted_so_far(server.address);
    assert!(aborted > 0, "some transactions were aborted");

    let copied: Vec<String> =
        crate::records_over_http(server.address, "output").iter().map(|record| record["value"].to_string()).collect();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for value in &copied {
        *counts.entry(value.clone()).or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = (0..total).map(|i| (i.to_string(), 1)).collect();
    let twice: Vec<_> = counts.iter().filter(|(_, count)| **count > 1).take(5).collect();
    assert!(twice.is_empty(), "copied more than once: {twice:?}");
    assert_eq!(counts, expected, "{} copied of {total}", copied.len());

    let described = succeed(kafka_tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", kafka).args([
        "--describe",
        "--group",
        "copiers",
    ]));
    let rows: Vec<Vec<&str>> = described
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|fields| fields.first() == Some(&"copiers"))
        .collect();
    assert_eq!(rows.len(), 3, "{described}");
    for fields in rows {
        assert_eq!(fields[3], fields[4], "the committed offset is the input's end: {described}");
    }
}
