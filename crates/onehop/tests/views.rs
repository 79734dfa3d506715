//! Views through the real binary: defined over `POST /sql`, fed over HTTP, read by key,
//! subscribed to over SSE, and after `kill -9` equal to what a run without the crash gives.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{DataDir, RawSse, get, publish_batch, publish_in_batches, sql};
use onehop_bench::plan::Rng;
use serde_json::{Value, json};

/// The events of the test: who bought what, deterministic.
fn event(i: usize) -> Value {
    let who = ["alice", "bob", "carol", "dave"][i % 4];
    json!({ "who": who, "amount": (i * 7) % 50, "item": format!("sku-{}", (i * 3) % 11) })
}

/// What the view must hold after `events`: per buyer, count, total and distinct items.
fn expected(events: &[Value]) -> BTreeMap<String, Value> {
    let mut totals: BTreeMap<String, (u64, i64, BTreeSet<String>)> = BTreeMap::new();
    for event in events {
        let entry = totals.entry(event["who"].as_str().unwrap().to_string()).or_default();
        entry.0 += 1;
        entry.1 += event["amount"].as_i64().unwrap();
        entry.2.insert(event["item"].as_str().unwrap().to_string());
    }
    totals
        .into_iter()
        .map(|(who, (n, total, items))| {
            let row = json!({ "who": who, "n": n, "total": total, "items": items.len() });
            (who, row)
        })
        .collect()
}

/// The view's rows by key, once it has counted `events` events (20 s at most).
fn settled(address: SocketAddr, events: u64) -> BTreeMap<String, Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = get(address, "/views/totals?limit=100");
        assert_eq!(status, 200, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        if body["status"]["events"] == events && body["status"]["restoring"] == false {
            return body["keys"]
                .as_array()
                .unwrap()
                .iter()
                .map(|entry| (entry["key"].as_str().unwrap().to_string(), entry["rows"][0].clone()))
                .collect();
        }
        assert!(Instant::now() < deadline, "the view did not reach {events} events: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

const SCHEMA: &str = "CREATE STREAM purchases; \
    CREATE VIEW totals WITH (start = 'earliest') AS \
    SELECT who, COUNT(*) AS n, SUM(amount) AS total, COUNT(DISTINCT item) AS items FROM purchases GROUP BY who";

#[test]
fn a_view_after_kill_9_equals_the_view_without_the_crash() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    sql(server.address, SCHEMA);
    let events: Vec<Value> = (0..3000).map(event).collect();
    // Half of it in batches, in three parts over more than two seconds (so checkpoints, each
    // writing what changed since the one before, are taken in between), then kill -9 right
    // after the last acknowledgement: the view has not checkpointed (nor perhaps even read)
    // the newest of them.
    for (part, events) in events[..1500].chunks(500).enumerate() {
        if part > 0 {
            std::thread::sleep(Duration::from_millis(1200));
        }
        publish_in_batches(server.address, "purchases", events, 100);
    }
    // Checkpoints are taken on the view's own timer: wait for the second.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, metrics) = get(server.address, "/metrics");
        let checkpoints: u64 = metrics
            .lines()
            .find_map(|line| line.strip_prefix("view_checkpoints_total{view=\"totals\"} "))
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or(0);
        if checkpoints >= 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "checkpoints were taken before the crash: {checkpoints}");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill_9();

    let server = dir.start(&[], &[]);
    publish_in_batches(server.address, "purchases", &events[1500..], 100);
    let after_crash = settled(server.address, 3000);
    assert_eq!(after_crash, expected(&events), "every event counted exactly once");

    // Point reads, and a missing key.
    let (status, body) = get(server.address, "/views/totals/alice");
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["rows"][0], expected(&events)["alice"]);
    let (status, body) = get(server.address, "/views/totals/nobody");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("not_found"), "{body}");
    let (status, body) = get(server.address, "/views/nothing/alice");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("unknown_view"), "{body}");

    // A subscription to one key gets its changes as they happen.
    let mut sse = RawSse::open(server.address, "/views/totals/alice", None);
    assert!(publish_batch(server.address, "purchases", &[json!({"who": "bob", "amount": 1, "item": "x"})]));
    assert!(publish_batch(server.address, "purchases", &[json!({"who": "alice", "amount": 5, "item": "new"})]));
    let mut row = expected(&events)["alice"].clone();
    let before = row["n"].as_u64().unwrap();
    // Changes are written without waiting for the disk, so one from before the subscription
    // may still come first; it is alice's and older.
    let change = loop {
        let (_, change) = sse.next();
        assert_eq!(change["view"], "totals");
        assert_eq!(change["key"], "alice", "only alice's changes");
        if change["row"]["n"].as_u64().unwrap() > before {
            break change;
        }
    };
    assert_eq!(change["final"], false);
    row["n"] = json!(row["n"].as_u64().unwrap() + 1);
    row["total"] = json!(row["total"].as_i64().unwrap() + 5);
    row["items"] = json!(row["items"].as_u64().unwrap() + 1);
    assert_eq!(change["row"], row, "only alice's change, and the right one");

    // Over MQTT: the key's current row comes first, as a retained message.
    let output = std::process::Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &server.mqtt_address.port().to_string()])
        .args(["-t", "views/totals/alice", "-C", "1", "-W", "10", "-F", "%t %r %p"])
        .output()
        .expect("mosquitto_sub is installed by scripts/test");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let line = String::from_utf8(output.stdout).unwrap();
    let (topic, rest) = line.trim().split_once(' ').unwrap();
    let (retained, payload) = rest.split_once(' ').unwrap();
    assert_eq!((topic, retained), ("views/totals/alice", "1"));
    let payload: Value = serde_json::from_str(payload).unwrap();
    assert_eq!(payload, row);
    // Views are read-only over MQTT too.
    let refused = std::process::Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &server.mqtt_address.port().to_string(), "-V", "mqttv5"])
        .args(["-t", "views/totals/alice", "-q", "1", "-m", "{}"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&refused.stderr).contains("views are read-only"), "{refused:?}");
    assert_eq!(settled(server.address, 3002)["alice"], row, "nothing was written to the view");
}

#[test]
fn bench_restore_replays_every_record_into_each_view() {
    let (report, dir) = common::bench_report(&["restore", "--records", "20000", "--keys", "100"]);
    assert_eq!(report["bench"], "restore");
    assert_eq!(report["records"], 20000);
    let views = report["views"].as_array().unwrap();
    assert_eq!(views.len(), 2);
    for view in views {
        // Every key seen, so every record was folded in.
        assert_eq!(view["keys"], 100, "{view}");
        assert!(view["records_per_s"].as_f64().unwrap() > 0.0, "{view}");
    }
    // The scratch data is gone afterwards.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

const COUNT_CYCLES: u64 = 20;

/// A view's change stream over Kafka (read_committed): per key, the rows in order.
fn committed_changes(kafka: SocketAddr, view: &str) -> BTreeMap<String, Vec<Value>> {
    let mut changes: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for (key, row) in common::view_changes_over_kafka(kafka, view) {
        changes.entry(key).or_default().push(row);
    }
    changes
}

/// Once the view `word_counts` over `source` (3 partitions) has settled: it holds each word's
/// count in the source, and its change stream, read by a Kafka consumer with read_committed,
/// holds each word's counts 1, 2, …, n once, in order, each with the count before it. The
/// counts, by word.
fn each_count_once(server: &common::Server, source: &str) -> BTreeMap<String, u64> {
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for record in common::stream_records(server.address, source, 3) {
        *expected.entry(record["value"]["word"].as_str().unwrap().to_string()).or_default() += 1;
    }
    // The view settles on the source's counts.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (rows, restoring) = common::view_first_rows(server.address, "word_counts");
        let counts: BTreeMap<String, u64> =
            rows.into_iter().map(|(word, row)| (word, row["count"].as_u64().unwrap())).collect();
        if counts == expected && !restoring {
            break;
        }
        assert!(Instant::now() < deadline, "the view did not settle: {counts:?}, want {expected:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its changes, once written (the change stream is written behind the view).
    let kafka = server.kafka_address.expect("the Kafka listener");
    let deadline = Instant::now() + Duration::from_secs(30);
    let changes = loop {
        let changes = committed_changes(kafka, "word_counts");
        let last = |word: &str| changes.get(word).and_then(|rows| rows.last()).map(|row| row["count"].clone());
        if expected.iter().all(|(word, count)| last(word) == Some(json!(count))) {
            break changes;
        }
        assert!(Instant::now() < deadline, "the change stream did not catch up");
        std::thread::sleep(Duration::from_millis(200));
    };
    for (word, count) in &expected {
        let counts: Vec<u64> = changes[word].iter().map(|row| row["count"].as_u64().unwrap()).collect();
        let once: Vec<u64> = (1..=*count).collect();
        assert_eq!(counts, once, "{word}: each count once, in order");
        assert!(changes[word].iter().all(|row| row["final"] == false && row["word"] == word.as_str()));
        // Each change carries the row it replaced: count n was count n - 1, the first was none.
        for row in &changes[word] {
            let count = row["count"].as_u64().unwrap();
            let before = row.get("before").map(|before| before["count"].as_u64().unwrap());
            assert_eq!(before, (count > 1).then(|| count - 1), "{word}: {row}");
        }
    }
    expected
}

/// A server on a data directory of its own with a stream of words and a view counting them.
fn word_counts() -> (DataDir, common::Server) {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    sql(
        server.address,
        "CREATE STREAM words WITH (partitions = 3); \
         CREATE VIEW word_counts AS SELECT word, COUNT(*) AS count FROM words GROUP BY word",
    );
    (dir, server)
}

/// A view's change stream holds each change once across kill -9: a count per word, the server
/// killed at random instants while words are published, 20 times. Read by a Kafka consumer
/// with read_committed, each word's changes are its counts 1, 2, …, n in order, n being how
/// many times the source holds the word: none written twice by a replay, none left out.
#[test]
fn a_views_change_stream_holds_each_change_once_across_kill_9_at_random_instants() {
    let (dir, mut server) = word_counts();
    let mut rng = Rng::new(0x0000_c0de_c0c0_0001, 0);
    let mut published = 0usize;
    for _ in 0..COUNT_CYCLES {
        let killer = server.kill_9_after(Duration::from_millis(200 + u64::from(rng.below(1500))));
        loop {
            let batch: Vec<Value> = (0..50).map(|_| json!({ "word": format!("w{}", rng.below(30)) })).collect();
            if !publish_batch(server.address, "words", &batch) {
                break;
            }
            published += batch.len();
        }
        killer.join().unwrap();
        server.kill_9();
        server = dir.start(&[], &[]);
    }
    let expected = each_count_once(&server, "words");
    assert!(expected.values().sum::<u64>() >= published as u64, "every acknowledged word is stored");
    assert!(published as u64 > COUNT_CYCLES * 50, "words went on between the kills: {published}");
}

/// Words of the backlog a crashed run leaves past its checkpoint in the next test: enough
/// that replaying them takes the restart far longer than its checkpoint interval.
const REPLAYED_WORDS: usize = 200_000;

/// The replay after a crash leaves out the changes the crashed run wrote past its checkpoint,
/// and a crash in the middle of that replay must not make the next start forget them: a run
/// that checkpoints once an hour crashes with a long stretch of words counted past its
/// checkpoint, a restart that checkpoints every 10 ms is killed while it replays that stretch,
/// and a third start follows. Each count is in the change stream once, in order.
#[test]
fn a_crash_in_the_middle_of_the_replay_after_a_crash_writes_no_change_twice() {
    let (dir, mut server) = word_counts();
    let word = |i: usize| json!({ "word": format!("w{}", (i * 7) % 30) });
    publish_in_batches(server.address, "words", &(0..30).map(word).collect::<Vec<_>>(), 30);
    // A clean stop checkpoints: the next run starts past these 30.
    server.signal("TERM");
    assert!(server.wait_exit().success());
    let mut server = dir.start(&["--checkpoint-interval-ms", "3600000"], &[]);
    let words: Vec<Value> = (30..30 + REPLAYED_WORDS).map(word).collect();
    publish_in_batches(server.address, "words", &words, 5000);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (rows, _) = common::view_first_rows(server.address, "word_counts");
        let counted: u64 = rows.values().map(|row| row["count"].as_u64().unwrap()).sum();
        if counted == (30 + REPLAYED_WORDS) as u64 {
            break;
        }
        assert!(Instant::now() < deadline, "the view did not count every word: {counted}");
        std::thread::sleep(Duration::from_millis(50));
    }
    server.kill_9();
    // The restart replays the 200 000 words from the checkpoint, leaving out their changes.
    let mut server = dir.start(&["--checkpoint-interval-ms", "10"], &[]);
    server.wait_for_line("found changes written after the last checkpoint");
    // Many checkpoint intervals into the replay (some 20 000 words a second in a debug
    // build), and before its end.
    std::thread::sleep(Duration::from_secs(1));
    let (_, restoring) = common::view_first_rows(server.address, "word_counts");
    server.kill_9();
    assert!(restoring, "killed in the middle of the replay");
    let server = dir.start(&[], &[]);
    let counts = each_count_once(&server, "words");
    assert_eq!(counts.values().sum::<u64>(), (30 + REPLAYED_WORDS) as u64);
}
