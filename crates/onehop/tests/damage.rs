//! The binary on a damaged data directory, as an outside test found it: after `kill -9`, bytes
//! flipped inside a stream's last segment. The server refuses to start, naming the file, the
//! byte and the way out, and loses no acknowledged record.

mod common;

use std::fs;
use std::path::{Path, PathBuf};

use common::{get, onehop, post, publish_batch, start};

/// Starts the server in `dir` on `data`, publishes `count` records to `stream` one request at a
/// time (one batch each), and kills it with SIGKILL: no clean close, so no segment index.
fn publish_then_kill(dir: &Path, data: &str, stream: &str, count: usize) {
    let mut server = start(dir, &["--http-addr", "127.0.0.1:0", "--data-dir", data], &[]);
    for i in 0..count {
        assert!(publish_batch(server.address, stream, &[serde_json::json!({ "n": i })]), "publish {i}");
    }
    server.child.kill().unwrap();
    server.child.wait().unwrap();
}

/// Runs `onehop serve` expecting it to refuse to start; returns what it printed.
fn refused_start(dir: &Path, data: &str, extra: &[&str]) -> String {
    let output = onehop()
        .args(["serve", "--http-addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0", "--data-dir", data])
        .args(extra)
        .current_dir(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "the server started on damaged data:\n{stderr}");
    stderr
}

/// Every record of partition 0 of `stream`, as (offset, value).
fn read_all(address: std::net::SocketAddr, stream: &str) -> Vec<(u64, serde_json::Value)> {
    let (status, body) = get(address, &format!("/streams/{stream}?from=0&limit=10000"));
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    body["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|record| (record["offset"].as_u64().unwrap(), record["value"].clone()))
        .collect()
}

fn segment(data: &Path, topic: &str) -> PathBuf {
    data.join("log").join(topic).join("0").join(format!("{:020}.log", 0))
}

/// The start of each batch in a segment file (its zero-filled tail ends the list).
fn batch_positions(path: &Path) -> Vec<usize> {
    let bytes = fs::read(path).unwrap();
    let mut positions = Vec::new();
    let mut at = 0;
    while at + 12 <= bytes.len() && bytes[at..at + 4] == *b"OHB1" {
        positions.push(at);
        at += u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
    }
    positions
}

fn flip(path: &Path, range: std::ops::Range<usize>) {
    let mut bytes = fs::read(path).unwrap();
    for at in range {
        bytes[at] ^= 0xFF;
    }
    fs::write(path, bytes).unwrap();
}

#[test]
fn damage_inside_a_stream_that_valid_batches_follow_stops_the_start_until_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_arg = data.to_str().unwrap();
    publish_then_kill(dir.path(), data_arg, "events", 40);
    let events = segment(&data, "events");
    let positions = batch_positions(&events);
    assert_eq!(positions.len(), 40, "one batch per publish");
    // A flipped byte in the records of the eleventh batch (offset 10); 29 valid batches follow.
    let bad_at = positions[10];
    flip(&events, bad_at + 50..bad_at + 51);
    let damaged = fs::read(&events).unwrap();

    let stderr = refused_start(dir.path(), data_arg, &[]);
    for needed in
        [events.display().to_string(), format!("byte {bad_at}"), "offset 11".into(), "--discard-damaged".into()]
    {
        assert!(stderr.contains(&needed), "the refusal names {needed:?}:\n{stderr}");
    }
    assert_eq!(fs::read(&events).unwrap(), damaged, "a refused start changes nothing");

    let server = start(dir.path(), &["--http-addr", "127.0.0.1:0", "--data-dir", data_arg, "--discard-damaged"], &[]);
    let records = read_all(server.address, "events");
    let offsets: Vec<u64> = records.iter().map(|(offset, _)| *offset).collect();
    let expected: Vec<u64> = (0..40).filter(|offset| *offset != 10).collect();
    assert_eq!(offsets, expected, "every record but the damaged one, each at its own offset");
    let (status, body) = post(server.address, "/streams/events", r#"{"n":"after"}"#).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""offset":40"#), "no offset is given out again: {body}");
    // The damaged file is kept beside the repaired one, as it was.
    let copies: Vec<PathBuf> = fs::read_dir(events.parent().unwrap())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_string_lossy().contains(".log.damaged-"))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert_eq!(fs::read(&copies[0]).unwrap(), damaged);
}
