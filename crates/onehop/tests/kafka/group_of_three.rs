//! One test every Kafka client passes, written once: each client brings two roles, started as
//! processes by the test's `spawn(args)`:
//!
//! - `consume BROKER TOPIC GROUP`: a member of GROUP printing `V <value>` per record, then
//!   committing the offset after it synchronously (retrying while the server is away) before
//!   taking the next; SIGTERM makes it leave the group (LeaveGroup) and end with status 0.
//! - `produce BROKER TOPIC FIRST COUNT`: an idempotent producer (acks=all, lz4) writing keys
//!   `kFIRST`… and values `vFIRST`…, printing `A <partition> <offset> <value>` per
//!   acknowledgement and `F <error>` per failure, retrying across a server restart, ending with
//!   status 0 once every record is acknowledged.
//!
//! librdkafka's roles are `confluent/group.py`, kafkajs's `kafkajs/group.js`, franz-go's
//! `onehop-peer-glue group` (bench/baselines/glue/group.go).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::Spawned;
use crate::common::{DataDir, line_channel};
use crate::groups::{lag, members, wait_until};

/// How long the group may take to consume what was produced (a rebalance included).
const CONSUME_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the producer may take for its 4000 records, a kill -9 and restart included.
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(180);

/// A member of the group: its process, its lines, and how many values it printed.
struct Member {
    child: Spawned,
    lines: Receiver<String>,
    printed: usize,
}

impl Member {
    fn start(spawn: &impl Fn(&[&str]) -> Spawned, address: &str) -> Member {
        let mut child = spawn(&["consume", address, "jobs", "workers"]);
        let lines = line_channel(child.stdout.take().unwrap());
        Member { child, lines, printed: 0 }
    }

    /// Counts the values it printed so far into `consumed`.
    fn drain(&mut self, consumed: &mut BTreeMap<String, usize>) {
        while let Ok(line) = self.lines.try_recv() {
            if let Some(value) = line.strip_prefix("V ") {
                *consumed.entry(value.to_string()).or_default() += 1;
                self.printed += 1;
            }
        }
    }

    /// Sends it SIGTERM (by its PID): it leaves the group and ends; returns whether it ended
    /// with success.
    fn terminate(&mut self) -> bool {
        let sent = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status().unwrap();
        assert!(sent.success());
        self.child.wait().unwrap().success()
    }
}

/// Waits for `child` to end with success, collecting its lines.
fn collect(mut child: Spawned) -> Vec<String> {
    let lines: Vec<String> =
        std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap())).map_while(Result::ok).collect();
    assert!(child.wait().unwrap().success(), "{lines:?}");
    lines
}

/// Waits until `members` consumed `total` records in all.
fn wait_for(members: &mut [Member], consumed: &mut BTreeMap<String, usize>, total: usize) {
    let deadline = Instant::now() + CONSUME_TIMEOUT;
    while consumed.values().sum::<usize>() < total {
        assert!(Instant::now() < deadline, "{} of {total} consumed", consumed.values().sum::<usize>());
        for member in members.iter_mut() {
            member.drain(consumed);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the group's members hold `shares` partitions (in any order), by Kafka's tool.
fn wait_for_shares(kafka: SocketAddr, shares: &[usize]) {
    wait_until(&format!("the members hold {shares:?} partitions"), || {
        let mut held = members(kafka, "workers");
        held.sort();
        held == shares
    });
}

/// The offsets the group committed, summed over its partitions, by Kafka's tool.
fn committed(kafka: SocketAddr) -> i64 {
    lag(kafka, "workers").iter().map(|(committed, _)| committed).sum()
}

/// Three members of a group share three partitions, one each, and each consumes its share;
/// one leaves (SIGTERM) and the other two take its partition over; the server is killed with
/// kill -9 once all is committed and started again, and the group resumes from its commits:
/// 900 records, each consumed exactly once, and all committed. Then an idempotent producer
/// writes 4000 records while the server is killed after 1000 acknowledgements and restarted:
/// every acknowledged record is at its acknowledged offset (read over HTTP), none is stored
/// twice, all 4000 are stored.
pub fn group_of_three_and_idempotent_producer_across_kill_9(spawn: impl Fn(&[&str]) -> Spawned) {
    let dir = DataDir::new();
    let address = format!("127.0.0.1:{}", crate::free_port());
    let mut server = crate::start_with_kafka_on(&dir, &address);
    let kafka = server.kafka_address.unwrap();
    crate::create_topic(kafka, "jobs", 3);
    let mut members: Vec<Member> = (0..3).map(|_| Member::start(&spawn, &address)).collect();
    wait_for_shares(kafka, &[1, 1, 1]);
    let mut consumed: BTreeMap<String, usize> = BTreeMap::new();
    collect(spawn(&["produce", &address, "jobs", "0", "300"]));
    wait_for(&mut members, &mut consumed, 300);
    let printed: Vec<usize> = members.iter().map(|member| member.printed).collect();
    assert!(printed.iter().all(|count| *count > 0), "each member consumed its partition: {printed:?}");

    // One member leaves; the other two take its partition over.
    let mut leaving = members.pop().unwrap();
    assert!(leaving.terminate(), "the member that left ended with success");
    leaving.drain(&mut consumed);
    wait_for_shares(kafka, &[1, 2]);
    let before: Vec<usize> = members.iter().map(|member| member.printed).collect();
    collect(spawn(&["produce", &address, "jobs", "300", "300"]));
    wait_for(&mut members, &mut consumed, 600);
    let printed: Vec<usize> = members.iter().zip(&before).map(|(member, before)| member.printed - before).collect();
    assert!(printed.iter().all(|count| *count > 0), "each of the two consumed: {printed:?}");

    // Once all is committed (each member commits before taking more): kill -9, start again.
    wait_until("600 are committed", || committed(kafka) == 600);
    server.kill_9();
    server = crate::start_with_kafka_on(&dir, &address);
    assert_eq!(committed(kafka), 600, "the commits survived the kill -9");
    collect(spawn(&["produce", &address, "jobs", "600", "300"]));
    wait_for(&mut members, &mut consumed, 900);
    wait_until("900 are committed", || committed(kafka) == 900);
    for member in &mut members {
        assert!(member.terminate(), "a member ended with success");
        member.drain(&mut consumed);
    }
    let twice: Vec<&String> = consumed.iter().filter(|(_, count)| **count > 1).map(|(value, _)| value).collect();
    if !twice.is_empty() {
        let logs: Vec<String> = members.iter().map(|member| member.child.log_tail(60)).collect();
        panic!(
            "consumed more than once: {twice:?}\nthe members' logs (last lines):\n{}\nthe server's log:\n{}",
            logs.join("\n----\n"),
            server.said().join("\n")
        );
    }
    assert_eq!(consumed.len(), 900, "every record consumed");

    // An idempotent producer cut mid-run by a kill -9.
    let mut producer = spawn(&["produce", &address, "ledger", "0", "4000"]);
    let acks = line_channel(producer.stdout.take().unwrap());
    let mut killed = false;
    let acked = collect_acknowledgements(&acks, |acknowledged| {
        if !killed && acknowledged >= 1000 {
            server.kill_9();
            killed = true;
            std::thread::sleep(Duration::from_millis(300));
            server = crate::start_with_kafka_on(&dir, &address);
        }
    });
    assert!(producer.wait().unwrap().success());
    assert!(killed);
    assert_stored_once_where_acknowledged(server.address, "ledger", &acked, 4000);
}

/// Reads a producer role's acknowledgements (`A <partition> <offset> <value>`, as every
/// client's `produce` role prints them) until it ends, calling `after_each` with how many so
/// far; a failed delivery (`F …`) fails the test.
pub(crate) fn collect_acknowledgements(
    acks: &Receiver<String>,
    mut after_each: impl FnMut(usize),
) -> Vec<(u64, u64, String)> {
    let mut acked = Vec::new();
    let deadline = Instant::now() + PRODUCE_TIMEOUT;
    loop {
        assert!(Instant::now() < deadline, "the producer did not finish: {} acknowledged", acked.len());
        match acks.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => {
                let fields: Vec<&str> = line.split(' ').collect();
                assert_eq!(fields[0], "A", "a failed delivery: {line}");
                acked.push((fields[1].parse().unwrap(), fields[2].parse().unwrap(), fields[3].to_string()));
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return acked,
        }
        after_each(acked.len());
    }
}

/// Every one of `total` records was acknowledged, each is in `stream` at the partition and
/// offset it was acknowledged at, and no value is stored twice.
pub(crate) fn assert_stored_once_where_acknowledged(
    address: SocketAddr,
    stream: &str,
    acked: &[(u64, u64, String)],
    total: usize,
) {
    assert_eq!(acked.len(), total, "every record acknowledged");
    let stored: BTreeMap<(u64, u64), String> =
        crate::records_over_http(address, stream).iter().map(crate::placed_value).collect();
    for (partition, offset, value) in acked {
        assert_eq!(stored.get(&(*partition, *offset)), Some(value), "acknowledged {value} at {partition}:{offset}");
    }
    let distinct: BTreeSet<&String> = stored.values().collect();
    assert_eq!(distinct.len(), stored.len(), "a value stored twice");
    assert_eq!(stored.len(), total);
}
