//! Transforms through the real binary: `CREATE STREAM … AS SELECT` over `POST /sql`, fed over
//! HTTP, and after `kill -9` mid-stream the output holds every transformed record exactly once.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{DataDir, get, publish_in_batches, sql};
use serde_json::{Value, json};

const SCHEMA: &str = "CREATE STREAM readings WITH (partitions = 2); \
    CREATE STREAM alerts WITH (partitions = 2, start = 'earliest') AS \
    SELECT seq, UPPER(sensor) AS sensor, celsius * 9 / 5 + 32 AS fahrenheit, sensor AS _key \
    FROM readings WHERE celsius >= 30";

fn reading(seq: u64) -> Value {
    json!({ "seq": seq, "sensor": format!("s{}", seq % 7), "celsius": seq % 40 })
}

/// The alert `reading(seq)` becomes, or `None` when the filter skips it.
fn alert(seq: u64) -> Option<Value> {
    let celsius = seq % 40;
    (celsius >= 30)
        .then(|| json!({ "seq": seq, "sensor": format!("S{}", seq % 7), "fahrenheit": celsius * 9 / 5 + 32 }))
}

/// Every record of `stream`, each partition read from its start.
fn read_all(address: SocketAddr, stream: &str, partitions: u32) -> Vec<Value> {
    let mut all = Vec::new();
    for partition in 0..partitions {
        let mut from = 0u64;
        loop {
            let (status, body) =
                get(address, &format!("/streams/{stream}?partition={partition}&from={from}&limit=10000"));
            assert_eq!(status, 200, "{body}");
            let body: Value = serde_json::from_str(&body).unwrap();
            let records = body["records"].as_array().unwrap();
            if records.is_empty() {
                break;
            }
            from = records.last().unwrap()["offset"].as_u64().unwrap() + 1;
            all.extend(records.iter().cloned());
        }
    }
    all
}

/// The output's values by `seq`, once it holds `count` records (30 s at most); a `seq` seen twice
/// fails the test.
fn settled(address: SocketAddr, count: usize) -> BTreeMap<u64, Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let records = read_all(address, "alerts", 2);
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
