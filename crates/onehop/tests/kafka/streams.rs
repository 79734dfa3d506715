use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::{DataDir, get, sql};
use crate::{Spawned, console_produce, create_topic, kafka_jars, kafka_tool, succeed};

/// Compiles `tests/kafka/streams/WindowedCount.java` against Kafka's jars into `classes`.
fn compile(classes: &Path) {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/streams/WindowedCount.java");
    let output = Command::new("javac")
        .arg("-cp")
        .arg(format!("{}/*", kafka_jars().display()))
        .arg("-d")
        .arg(classes)
        .arg(&source)
        .output()
        .expect("javac runs");
    assert!(output.status.success(), "javac: {}", String::from_utf8_lossy(&output.stderr));
}

fn start_app(kafka: &str, classes: &Path, state: &Path, base_ms: u64) -> Spawned {
    // RocksDB unpacks its 14 MB native library into java.io.tmpdir and deletes it only on a
    // clean exit; the test kills the app with kill -9, so it goes in the test's own directory.
    let child = Command::new("java")
        .arg(format!("-Djava.io.tmpdir={}", classes.display()))
        .arg("-cp")
        .arg(format!("{}/*:{}", kafka_jars().display(), classes.display()))
        .arg("WindowedCount")
        .args([kafka, &state.display().to_string(), &base_ms.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("java runs");
    Spawned(child, None)
}

/// The records `stream` holds (the sum of its end offsets, from `SHOW STREAMS`).
fn stored(address: std::net::SocketAddr, stream: &str) -> u64 {
    let shown: serde_json::Value = serde_json::from_str(&sql(address, "SHOW STREAMS")).unwrap();
    let result = &shown["results"][0];
    let column = |name: &str| result["columns"].as_array().unwrap().iter().position(|c| c == name).unwrap();
    let (name, ends) = (column("name"), column("end_offsets"));
    result["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row[name] == stream)
        .map_or(0, |row| row[ends].as_array().unwrap().iter().map(|end| end.as_u64().unwrap()).sum())
}

/// A Kafka Streams app with `exactly_once_v2` (a windowed count, `streams/WindowedCount.java`,
/// compiled by the test against Kafka Streams 4.1) runs against onehop and is killed with
/// kill -9 mid-run, then started again. Its output, which onehop serves committed only, holds
/// for every user and window the counts 1, 2, …, n exactly once each, n the records that fell in
/// it: nothing counted twice, nothing lost, across the crash.
#[test]
fn a_kafka_streams_app_counts_exactly_once_across_a_kill_9() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    let classes = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    compile(classes.path());
    create_topic(kafka, "clicks", 2);
    create_topic(kafka, "counts", 2);
    let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    let base_ms = now_ms / 10_000 * 10_000;
    let (users, first, total) = (7u64, 6000u64, 8000u64);
    let lines =
        |range: std::ops::Range<u64>| -> Vec<String> { range.map(|i| format!("user-{}\t{i}", i % users)).collect() };
    console_produce(kafka, "clicks", &lines(0..first), &[]);

    // Killed with kill -9 mid-run, until a kill leaves an open transaction's batches on the
    // server (they must never show): most kills do, one between a commit and the next send not.
    let open_transaction = |listed: &str| listed.lines().any(|line| line.contains("Ongoing"));
    let waiting = || {
        let (_, metrics) = get(server.address, "/metrics");
        let line = metrics.lines().find(|line| line.starts_with("kafka_transaction_batches_waiting "));
        line.map_or(0.0, |line| line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap())
    };
    let mut left_open = false;
    for _ in 0..5 {
        let mut app = start_app(&kafka.to_string(), classes.path(), state.path(), base_ms);
        let already = stored(server.address, "counts");
        let deadline = Instant::now() + Duration::from_secs(120);
        while stored(server.address, "counts") < already + 300 {
            assert!(Instant::now() < deadline, "the app produced nothing");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Killed the moment the server holds an open transaction's batches (polled): a fixed
        // pause landed between transactions five times running on a loaded machine.
        let until = Instant::now() + Duration::from_secs(3);
        while waiting() == 0.0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(2));
        }
        app.kill().unwrap();
        app.wait().unwrap();
        let before = stored(server.address, "counts");
        assert!(before < first, "the kill comes mid-run: {before} counts already");
        if waiting() > 0.0 {
            left_open = true;
            break;
        }
    }
    assert!(left_open, "no kill left a transaction open");
    console_produce(kafka, "clicks", &lines(first..total), &[]);
    let mut app = start_app(&kafka.to_string(), classes.path(), state.path(), base_ms);

    // One output record per input record: wait for all, and a little longer for any extra.
    let deadline = Instant::now() + Duration::from_secs(180);
    while stored(server.address, "counts") < total {
        assert!(Instant::now() < deadline, "{} of {total} counts", stored(server.address, "counts"));
        std::thread::sleep(Duration::from_millis(200));
    }
    // The killed app's open transaction ends too: aborted by the new app's producer (the same
    // transactional id) or by its timeout (10 s, Kafka Streams' default). Nothing of it may show.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let listed = succeed(kafka_tool("org.apache.kafka.tools.TransactionsCommand", kafka).arg("list"));
        if !open_transaction(&listed) {
            break;
        }
        assert!(Instant::now() < deadline, "a transaction stayed open: {listed}");
        std::thread::sleep(Duration::from_secs(1));
    }
    let _ = app.kill();
    let _ = app.wait();

    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..total {
        let window = (base_ms + i * 100) / 10_000 * 10_000;
        *expected.entry(format!("user-{}@{window}", i % users)).or_default() += 1;
    }
    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for record in crate::records_over_http(server.address, "counts") {
        let key = record["key"].as_str().unwrap().to_string();
        seen.entry(key).or_default().push(record["value"].as_u64().unwrap());
    }
    assert_eq!(seen.len(), expected.len(), "one count per user and window");
    for (key, n) in &expected {
        let counts = seen.get(key).unwrap_or_else(|| panic!("no count for {key}"));
        let exact: Vec<u64> = (1..=*n).collect();
        assert_eq!(counts, &exact, "{key}: each count once, in order");
    }
}
