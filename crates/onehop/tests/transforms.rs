//! Transforms through the real binary: `CREATE STREAM … AS SELECT` over `POST /sql`, fed over
//! HTTP, and after `kill -9` mid-stream the output holds every transformed record (enriched
//! with a table's row) exactly once;
//! so does a merge of two streams split into words (`UNION ALL` of `CROSS JOIN UNNEST`s) killed
//! at random instants while writes go on, with a view counting its words.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{DataDir, publish_batch, publish_in_batches, sql};
use onehop_bench::plan::Rng;
use serde_json::{Value, json};

const SCHEMA: &str = "CREATE STREAM readings WITH (partitions = 2); \
    CREATE TABLE sensors (id TEXT PRIMARY KEY, site TEXT); \
    INSERT INTO sensors (id, site) VALUES ('s0', 'north'), ('s1', 'east'), ('s2', 'south'), ('s3', 'west'), \
      ('s4', 'north'), ('s5', 'east'); \
    CREATE STREAM alerts WITH (partitions = 2, start = 'earliest') AS \
    SELECT r.seq, UPPER(r.sensor) AS sensor, celsius * 9 / 5 + 32 AS fahrenheit, s.site, r.sensor AS _key \
    FROM readings r LEFT JOIN sensors s ON s.id = r.sensor WHERE r.celsius >= 30";

/// The site `SCHEMA` gives sensor `s{n}` (s6 has none).
const SITES: [&str; 6] = ["north", "east", "south", "west", "north", "east"];

fn reading(seq: u64) -> Value {
    json!({ "seq": seq, "sensor": format!("s{}", seq % 7), "celsius": seq % 40 })
}

/// The alert `reading(seq)` becomes, or `None` when the filter skips it.
fn alert(seq: u64) -> Option<Value> {
    let celsius = seq % 40;
    let site = SITES.get((seq % 7) as usize);
    (celsius >= 30).then(
        || json!({ "seq": seq, "sensor": format!("S{}", seq % 7), "fahrenheit": celsius * 9 / 5 + 32, "site": site }),
    )
}

/// The output's values by `seq`, once it holds `count` records (30 s at most); a `seq` seen twice
/// fails the test.
fn settled(address: SocketAddr, count: usize) -> BTreeMap<u64, Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let records = common::stream_records(address, "alerts", 2);
        if records.len() >= count {
            let mut by_seq = BTreeMap::new();
            for record in &records {
                let value = record["value"].clone();
                // Keyed by sensor, and naming the reading it came from.
                assert_eq!(record["key"].as_str().unwrap(), value["sensor"].as_str().unwrap().to_lowercase());
                assert!(record["headers"]["onehop-source"].as_str().unwrap().contains(':'), "{record}");
                let seq = value["seq"].as_u64().unwrap();
                assert!(by_seq.insert(seq, value).is_none(), "reading {seq} was transformed twice");
            }
            assert_eq!(records.len(), count, "more output than input");
            return by_seq;
        }
        assert!(Instant::now() < deadline, "{} of {count} alerts arrived", records.len());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_transform_after_kill_9_writes_every_record_exactly_once() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    sql(server.address, SCHEMA);
    let readings: Vec<Value> = (0..6000).map(reading).collect();
    // Half, then kill -9 right after the last acknowledgement: the transform is still writing
    // and has not checkpointed its newest output.
    publish_in_batches(server.address, "readings", &readings[..3000], 200);
    server.kill_9();

    let server = dir.start(&[], &[]);
    publish_in_batches(server.address, "readings", &readings[3000..], 200);
    let expected: BTreeMap<u64, Value> = (0..6000).filter_map(|seq| alert(seq).map(|value| (seq, value))).collect();
    assert_eq!(settled(server.address, expected.len()), expected);

    // SHOW TRANSFORMS reports it caught up.
    let body = sql(server.address, "SHOW TRANSFORMS");
    assert!(body.contains("\"alerts\"") && body.contains("\"readings\""), "{body}");
}

const WORDS_SCHEMA: &str = "CREATE STREAM posts WITH (partitions = 2); CREATE STREAM comments WITH (partitions = 2); \
    CREATE STREAM words WITH (partitions = 3, start = 'earliest') AS \
    SELECT 'post' AS kind, id, word, n, word AS _key FROM posts \
    CROSS JOIN UNNEST(SPLIT(text, ' ')) WITH ORDINALITY AS w(word, n) \
    UNION ALL SELECT 'comment', id, word, n, word AS _key FROM comments \
    CROSS JOIN UNNEST(SPLIT(body, ' ')) WITH ORDINALITY AS w(word, n); \
    CREATE VIEW word_counts AS SELECT word, COUNT(*) AS count FROM words GROUP BY word";
const WORD_CYCLES: u64 = 15;

/// A sentence of 1 to 12 words over a vocabulary of 40.
fn sentence(rng: &mut Rng) -> String {
    let words: Vec<String> = (0..=rng.below(12)).map(|_| format!("w{}", rng.below(40))).collect();
    words.join(" ")
}

/// What the merge must hold: one `(kind, id, n) → word` per word of every stored post and
/// comment.
fn words_expected(address: SocketAddr) -> BTreeMap<(String, String, u64), String> {
    let mut expected = BTreeMap::new();
    for (stream, kind, field) in [("posts", "post", "text"), ("comments", "comment", "body")] {
        for record in common::stream_records(address, stream, 2) {
            let value = &record["value"];
            for (n, word) in value[field].as_str().unwrap().split(' ').enumerate() {
                let id = value["id"].as_str().unwrap().to_string();
                expected.insert((kind.to_string(), id, n as u64 + 1), word.to_string());
            }
        }
    }
    expected
}

/// The merge's records as `(kind, id, n) → word` once it holds `count` (30 s at most); one
/// written twice fails the test.
fn words_settled(address: SocketAddr, count: usize) -> BTreeMap<(String, String, u64), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let records = common::stream_records(address, "words", 3);
        if records.len() >= count {
            let mut words = BTreeMap::new();
            for record in &records {
                let value = &record["value"];
                let at = (
                    value["kind"].as_str().unwrap().to_string(),
                    value["id"].as_str().unwrap().to_string(),
                    value["n"].as_u64().unwrap(),
                );
                let word = value["word"].as_str().unwrap().to_string();
                assert_eq!(record["key"].as_str(), Some(word.as_str()));
                assert!(words.insert(at.clone(), word).is_none(), "{at:?} was written twice");
            }
            assert_eq!(records.len(), count, "more words than the sentences have");
            return words;
        }
        assert!(Instant::now() < deadline, "{} of {count} words arrived", records.len());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The view's counts once they equal `expected` (30 s at most).
fn counts_settle(address: SocketAddr, expected: &BTreeMap<String, u64>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (rows, restoring) = common::view_first_rows(address, "word_counts");
        let counts: BTreeMap<String, u64> =
            rows.into_iter().map(|(word, row)| (word, row["count"].as_u64().unwrap())).collect();
        if &counts == expected && !restoring {
            return;
        }
        assert!(Instant::now() < deadline, "the counts did not settle:\n  view: {counts:?}\n  want: {expected:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_merge_split_into_words_after_kill_9_at_random_instants_writes_each_word_once() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    sql(server.address, WORDS_SCHEMA);
    let mut rng = Rng::new(0x0000_0a11_5eed_0051, 0);
    let mut seq = 0u64;
    let mut acknowledged: Vec<(&str, String)> = Vec::new();
    for cycle in 0..WORD_CYCLES {
        let killer = server.kill_9_after(Duration::from_millis(30 + u64::from(rng.below(300))));
        loop {
            let (stream, field) = if seq.is_multiple_of(2) { ("posts", "text") } else { ("comments", "body") };
            let batch: Vec<Value> =
                (0..20).map(|i| json!({ "id": format!("{stream}-{seq}-{i}"), field: sentence(&mut rng) })).collect();
            seq += 1;
            if !publish_batch(server.address, stream, &batch) {
                break;
            }
            acknowledged.extend(batch.iter().map(|value| (stream, value["id"].as_str().unwrap().to_string())));
        }
        killer.join().unwrap();
        server.kill_9();
        server = dir.start(&[], &[]);
        // Every acknowledged sentence is stored; the merge holds each of their words once.
        let expected = words_expected(server.address);
        let stored: std::collections::BTreeSet<(String, String)> =
            expected.keys().map(|(kind, id, _)| (kind.clone(), id.clone())).collect();
        for (stream, id) in &acknowledged {
            let kind = if *stream == "posts" { "post" } else { "comment" };
            assert!(stored.contains(&(kind.to_string(), id.clone())), "cycle {cycle}: {id} was acknowledged and lost");
        }
        assert_eq!(words_settled(server.address, expected.len()), expected, "cycle {cycle}");
    }
    let expected = words_expected(server.address);
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for word in expected.values() {
        *counts.entry(word.clone()).or_default() += 1;
    }
    counts_settle(server.address, &counts);
    assert!(acknowledged.len() as u64 > WORD_CYCLES * 20, "writes went on between the kills: {}", acknowledged.len());
}

/// Readings a crashed run leaves past its checkpoint in the next test: enough that replaying
/// them takes the restart far longer than its checkpoint interval.
const REPLAYED_READINGS: u64 = 200_000;

/// Whether SHOW TRANSFORMS says `alerts` is still replaying what its source held at its start.
fn alerts_restoring(address: SocketAddr) -> bool {
    let body: Value = serde_json::from_str(&sql(address, "SHOW TRANSFORMS")).unwrap();
    let result = &body["results"][0];
    let column = result["columns"].as_array().unwrap().iter().position(|name| name == "restoring").unwrap();
    let row = result["rows"].as_array().unwrap().iter().find(|row| row[0] == "alerts").expect("alerts is listed");
    row[column] == true
}

/// The replay after a crash leaves out the records the crashed run wrote past its checkpoint,
/// and a crash in the middle of that replay must not make the next start forget them: a run
/// that checkpoints once an hour crashes with a long stretch of readings transformed past its
/// checkpoint, a restart that checkpoints every 10 ms is killed while it replays that stretch,
/// and a third start follows. Each reading's alert is written once.
#[test]
fn a_crash_in_the_middle_of_the_replay_after_a_crash_writes_no_record_twice() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    sql(server.address, SCHEMA);
    publish_in_batches(server.address, "readings", &(0..100).map(reading).collect::<Vec<_>>(), 100);
    // A clean stop checkpoints: the next run starts past these 100.
    server.signal("TERM");
    assert!(server.wait_exit().success());
    let mut server = dir.start(&["--checkpoint-interval-ms", "3600000"], &[]);
    let readings: Vec<Value> = (100..100 + REPLAYED_READINGS).map(reading).collect();
    publish_in_batches(server.address, "readings", &readings, 5000);
    let expected: BTreeMap<u64, Value> =
        (0..100 + REPLAYED_READINGS).filter_map(|seq| alert(seq).map(|value| (seq, value))).collect();
    settled(server.address, expected.len());
    server.kill_9();
    // The restart replays the readings from the checkpoint, leaving out their alerts.
    let mut server = dir.start(&["--checkpoint-interval-ms", "10"], &[]);
    server.wait_for_line("found output written after the last checkpoint");
    // Many checkpoint intervals into the replay, and before its end.
    std::thread::sleep(Duration::from_secs(1));
    let restoring = alerts_restoring(server.address);
    server.kill_9();
    assert!(restoring, "killed in the middle of the replay");
    let server = dir.start(&[], &[]);
    assert_eq!(settled(server.address, expected.len()), expected);
}
