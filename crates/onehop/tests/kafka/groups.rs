use std::collections::BTreeMap;
use std::process::{Child, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::common::{DataDir, line_channel};
use crate::{console_produce, create_topic, kafka_tool, succeed};

/// A console consumer in group `group`, printing each record's value, and its lines.
struct Consumer {
    child: Child,
    lines: Receiver<String>,
    values: Vec<String>,
}

impl Consumer {
    fn start(kafka: std::net::SocketAddr, group: &str) -> Consumer {
        let mut child = kafka_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", kafka)
            .args(["--topic", "jobs", "--group", group, "--from-beginning"])
            .args(["--consumer-property", "session.timeout.ms=6000"])
            .args(["--consumer-property", "heartbeat.interval.ms=500"])
            .args(["--consumer-property", "auto.commit.interval.ms=200"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("java runs");
        let lines = line_channel(child.stdout.take().unwrap());
        Consumer { child, lines, values: Vec::new() }
    }

    /// Takes in the values it printed so far (not its other lines, such as its closing count).
    fn drain(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            if line.strip_prefix('v').is_some_and(|number| number.parse::<u32>().is_ok()) {
                self.values.push(line);
            }
        }
    }

    /// Stops it with SIGTERM: the consumer closes and leaves its group.
    fn leave(mut self) -> Vec<String> {
        let status = std::process::Command::new("kill").arg(self.child.id().to_string()).status().unwrap();
        assert!(status.success());
        let _ = self.child.wait();
        std::thread::sleep(Duration::from_millis(200));
        self.drain();
        std::mem::take(&mut self.values)
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The group's members and the partitions each has, by the consumer groups tool.
pub(crate) fn members(kafka: std::net::SocketAddr, group: &str) -> Vec<usize> {
    let said = succeed(kafka_tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", kafka).args([
        "--describe",
        "--members",
        "--group",
        group,
    ]));
    said.lines()
        .filter(|line| line.starts_with(group))
        .filter_map(|line| line.split_whitespace().last()?.parse().ok())
        .collect()
}

/// The group's committed offset and log end per partition, by the consumer groups tool.
pub(crate) fn lag(kafka: std::net::SocketAddr, group: &str) -> Vec<(i64, i64)> {
    let said = succeed(kafka_tool("org.apache.kafka.tools.consumer.group.ConsumerGroupCommand", kafka).args([
        "--describe",
        "--offsets",
        "--group",
        group,
    ]));
    said.lines()
        .filter(|line| line.starts_with(group))
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields[3].parse().unwrap_or(-1), fields[4].parse().unwrap_or(-1))
        })
        .collect()
}

/// Waits until `done` says so, asking every 300 ms for at most a minute.
pub(crate) fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn produce(kafka: std::net::SocketAddr, from: usize, count: usize) {
    let lines: Vec<String> = (from..from + count).map(|n| format!("key-{n}\tv{n}")).collect();
    console_produce(kafka, "jobs", &lines, &[]);
}

/// Three console consumers in one group share a topic's three partitions; when one leaves
/// (SIGTERM: it sends LeaveGroup) the other two take its partition over; the server is killed
/// with kill -9 and restarted on the same port once everything is committed, and the group
/// resumes from its committed offsets: every record is consumed exactly once across all of it.
#[test]
fn a_group_of_three_rebalances_when_one_leaves_and_resumes_from_committed_offsets_after_kill_9() {
    let dir = DataDir::new();
    let address = format!("127.0.0.1:{}", crate::free_port());
    let mut server = crate::start_with_kafka_on(&dir, &address);
    let kafka = server.kafka_address.unwrap();
    create_topic(kafka, "jobs", 3);
    produce(kafka, 0, 300);

    let mut consumers: Vec<Consumer> = (0..3).map(|_| Consumer::start(kafka, "workers")).collect();
    wait_until("three members have a partition each", || {
        let mut shares = members(kafka, "workers");
        shares.sort();
        shares == [1, 1, 1]
    });
    wait_until("the first 300 are consumed and committed", || {
        let lag = lag(kafka, "workers");
        lag.len() == 3 && lag.iter().map(|(committed, _)| committed).sum::<i64>() == 300
    });

    let left = consumers.pop().unwrap().leave();
    wait_until("two members have the three partitions", || {
        let mut shares = members(kafka, "workers");
        shares.sort();
        shares == [1, 2]
    });
    produce(kafka, 300, 300);
    wait_until("600 are committed", || {
        lag(kafka, "workers").iter().map(|(committed, _)| committed).sum::<i64>() == 600
    });

    server.kill_9();
    server = crate::start_with_kafka_on(&dir, &address);
    let resumed = lag(kafka, "workers");
    assert_eq!(
        resumed.iter().map(|(committed, _)| committed).sum::<i64>(),
        600,
        "committed offsets survived: {resumed:?}"
    );
    produce(kafka, 600, 300);
    wait_until("900 are committed", || {
        lag(kafka, "workers").iter().map(|(committed, _)| committed).sum::<i64>() == 900
    });

    let mut consumed: BTreeMap<String, usize> = BTreeMap::new();
    for value in left {
        *consumed.entry(value).or_default() += 1;
    }
    for mut consumer in consumers {
        std::thread::sleep(Duration::from_millis(300));
        consumer.drain();
        for value in std::mem::take(&mut consumer.values) {
            *consumed.entry(value).or_default() += 1;
        }
    }
    let twice: Vec<&String> = consumed.iter().filter(|(_, count)| **count > 1).map(|(value, _)| value).collect();
    assert!(twice.is_empty(), "consumed more than once: {twice:?}");
    let expected: BTreeMap<String, usize> = (0..900).map(|n| (format!("v{n}"), 1)).collect();
    assert_eq!(
        consumed.len(),
        900,
        "missing: {:?}",
        expected.keys().filter(|value| !consumed.contains_key(*value)).collect::<Vec<_>>()
    );
    drop(server);
}

/// A consumer of `group` with confluent-kafka (PyPI) that reads `count` records of `topic`
/// (from the start when the group has no offset there), commits, and prints their values.
pub(crate) fn consume_and_commit(kafka: std::net::SocketAddr, group: &str, topic: &str, count: usize) -> Vec<String> {
    let script = r#"
import sys
from confluent_kafka import Consumer
broker, group, topic, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
consumer = Consumer({"bootstrap.servers": broker, "group.id": group, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False})
consumer.subscribe([topic])
values = []
import time
deadline = time.time() + 60
while len(values) < count and time.time() < deadline:
    message = consumer.poll(0.5)
    if message is None or message.error():
        continue
    values.append(message.value().decode())
consumer.commit(asynchronous=False)
consumer.close()
print("\n".join(values))
"#;
    let output = std::process::Command::new("python3")
        .args(["-c", script, &kafka.to_string(), group, topic, &count.to_string()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect()
}

/// The offsets `group` committed, as (topic, partition, offset), by confluent-kafka's admin.
pub(crate) fn committed(kafka: std::net::SocketAddr, group: &str) -> Vec<(String, i32, i64)> {
    let script = r#"
import sys, json
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
future = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(sys.argv[2])])[sys.argv[2]]
print(json.dumps([[tp.topic, tp.partition, tp.offset] for tp in future.result().topic_partitions]))
"#;
    let output =
        std::process::Command::new("python3").args(["-c", script, &kafka.to_string(), group]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// A topic dropped (by Kafka's DeleteTopics, or by SQL) takes its groups' committed offsets
/// with it, as Kafka's do: made again, it is read from its start, not from the old offsets,
/// which would silently skip that many new records.
#[test]
fn a_dropped_topics_committed_offsets_go_with_it() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    let produce_values = |values: &[&str]| {
        for value in values {
            let (status, body) = crate::common::post(server.address, "/streams/orders", value).unwrap();
            assert_eq!(status, 200, "{body}");
        }
    };
    for drop_by in ["DeleteTopics", "SQL"] {
        crate::common::sql(server.address, "CREATE STREAM orders");
        produce_values(&["\"a\"", "\"b\"", "\"c\"", "\"d\""]);
        assert_eq!(consume_and_commit(kafka, "billing", "orders", 4).len(), 4, "{drop_by}");
        assert!(committed(kafka, "billing").iter().any(|(topic, _, offset)| topic == "orders" && *offset == 4));
        match drop_by {
            "DeleteTopics" => {
                let script = r#"
import sys
from confluent_kafka.admin import AdminClient
admin = AdminClient({"bootstrap.servers": sys.argv[1]})
admin.delete_topics(["orders"], operation_timeout=30)["orders"].result()
"#;
                let output =
                    std::process::Command::new("python3").args(["-c", script, &kafka.to_string()]).output().unwrap();
                assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
            }
            _ => {
                crate::common::sql(server.address, "DROP STREAM orders");
            }
        }
        // Gone with the topic (the SQL drop's are deleted by the coordinator when it notices).
        wait_until("the dropped topic's offsets deleted", || {
            committed(kafka, "billing").iter().all(|(topic, _, offset)| topic != "orders" || *offset < 0)
        });
        crate::common::sql(server.address, "CREATE STREAM orders");
        produce_values(&["\"new-1\"", "\"new-2\""]);
        let read = consume_and_commit(kafka, "billing", "orders", 2);
        assert_eq!(read, ["\"new-1\"", "\"new-2\""], "{drop_by}: the group reads the new topic from its start");
        crate::common::sql(server.address, "DROP STREAM orders");
    }
}

/// A static member (confluent-kafka with `group.instance.id`) and what it printed.
struct StaticMember {
    child: Child,
    lines: Receiver<String>,
    events: Vec<serde_json::Value>,
}

impl StaticMember {
    fn start(kafka: std::net::SocketAddr, instance: &str) -> StaticMember {
        let script =
            std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/confluent/static_member.py");
        let mut child = std::process::Command::new("python3")
            .arg(script)
            .args([&kafka.to_string(), "work", "statics", instance])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let lines = line_channel(child.stdout.take().unwrap());
        StaticMember { child, lines, events: Vec::new() }
    }

    fn take_in(&mut self) {
        while let Ok(line) = self.lines.try_recv() {
            self.events.push(serde_json::from_str(&line).unwrap_or_else(|_| panic!("not an event: {line}")));
        }
    }

    /// The partitions of its last assignment, if it has one it was not revoked since.
    fn assigned(&self) -> Option<Vec<u64>> {
        let last = self.events.iter().rev().find(|event| event["event"] != "record")?;
        (last["event"] == "assign")
            .then(|| last["partitions"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap()).collect())
    }

    fn rebalances(&self) -> usize {
        self.events.iter().filter(|event| event["event"] != "record").count()
    }

    fn consumed(&self, partition: u64, offset: u64) -> bool {
        self.events
            .iter()
            .any(|event| event["event"] == "record" && event["partition"] == partition && event["offset"] == offset)
    }
}

impl Drop for StaticMember {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `members` (taking in what they print) until `settled` holds of them.
fn wait_for(members: &mut [&mut StaticMember], what: &str, settled: impl Fn(&[&mut StaticMember]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        for member in members.iter_mut() {
            member.take_in();
        }
        if settled(members) {
            return;
        }
        let said: Vec<&Vec<serde_json::Value>> = members.iter().map(|member| &member.events).collect();
        assert!(Instant::now() < deadline, "{what}: never; they said {said:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Static membership (KIP-345): a member killed with SIGKILL and started again under its
/// `group.instance.id` gets its partitions back with no rebalance: the other member is never
/// asked to give its partitions up, and both go on consuming. Before static membership was
/// served, the member came back as a new one: a rebalance revoked the other's partitions and
/// waited for the killed member until its session timeout. Both are restarted in turn, so the
/// leader's return is always among them.
#[test]
fn a_static_member_killed_and_started_again_gets_its_partitions_back_without_a_rebalance() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    let (status, body) =
        crate::common::request(server.address, "POST", "/sql", "CREATE STREAM work WITH (partitions = 4)").unwrap();
    assert_eq!(status, 200, "{body}");
    let mut b = StaticMember::start(kafka, "member-b");
    let mut a = StaticMember::start(kafka, "member-a");
    let split = |members: &[&mut StaticMember]| {
        let (Some(first), Some(second)) = (members[0].assigned(), members[1].assigned()) else { return false };
        let mut all = [first.clone(), second.clone()].concat();
        all.sort_unstable();
        !first.is_empty() && !second.is_empty() && all == [0, 1, 2, 3]
    };
    wait_for(&mut [&mut a, &mut b], "the two members share the four partitions", split);
    let a_had = a.assigned().unwrap();
    let b_had = b.assigned().unwrap();
    let b_rebalances = b.rebalances();

    // a is killed (no LeaveGroup) and started again under its instance id.
    drop(a);
    let mut a = StaticMember::start(kafka, "member-a");
    wait_for(&mut [&mut a], "the restarted member is assigned", |members| members[0].assigned().is_some());
    assert_eq!(a.assigned().unwrap(), a_had, "its partitions handed back");

    // Records on every partition: each member consumes its own, and b's events, read up to
    // its last record, show it was never asked to give its partitions up.
    let mut written = Vec::new();
    for key in 0..24 {
        let (status, body) = crate::common::post(server.address, &format!("/streams/work?key=k{key}"), "1").unwrap();
        assert_eq!(status, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        written.push((answer["partition"].as_u64().unwrap(), answer["offset"].as_u64().unwrap()));
    }
    let owners = [(&a_had, "a"), (&b_had, "b")];
    assert!(owners.iter().all(|(partitions, _)| written.iter().any(|(p, _)| partitions.contains(p))), "{written:?}");
    wait_for(&mut [&mut a, &mut b], "every record consumed by the member it belongs to", |members| {
        written.iter().all(|(partition, offset)| {
            let owner = if a_had.contains(partition) { &members[0] } else { &members[1] };
            owner.consumed(*partition, *offset)
        })
    });
    assert_eq!(b.rebalances(), b_rebalances, "no rebalance reached the other member: {:?}", b.events);
    assert_eq!(b.assigned().unwrap(), b_had);

    // And b the same way: one of the two is the group's leader, which librdkafka's JoinGroup
    // (before version 9) cannot be told to skip the assignment: it assigns again and is given
    // the one the group kept.
    let a_rebalances = a.rebalances();
    drop(b);
    let mut b = StaticMember::start(kafka, "member-b");
    wait_for(&mut [&mut b], "the restarted member b is assigned", |members| members[0].assigned().is_some());
    assert_eq!(b.assigned().unwrap(), b_had, "its partitions handed back");
    a.take_in();
    assert_eq!(a.rebalances(), a_rebalances, "no rebalance reached a: {:?}", a.events);
}
