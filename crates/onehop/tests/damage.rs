//! The binary on a damaged data directory, as an outside test found it: after `kill -9`, bytes
//! flipped inside the catalog or inside a stream's last segment; after a clean stop, a byte
//! flipped under an intact index; a middle segment cut short where a batch ends, or deleted.
//! The server refuses to start, naming the file, the bytes or offsets and the way out (or, for
//! damage it did not read, fails the read and ends subscriptions with an error event), `onehop
//! check` finds all of it, and no acknowledged record is lost either way.

mod common;

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{DataDir, RawSse, STARTUP_TIMEOUT, get, onehop, post, publish_batch, sql};

/// Starts the server on `dir`, publishes `count` records to `stream` one request at a time
/// (one batch each), and kills it with SIGKILL: no clean close, so no segment index.
fn publish_then_kill(dir: &DataDir, stream: &str, count: usize) {
    let mut server = dir.start(&[], &[]);
    for i in 0..count {
        assert!(publish_batch(server.address, stream, &[serde_json::json!({ "n": i })]), "publish {i}");
    }
    server.kill_9();
}

/// Runs `onehop serve` expecting it to refuse to start; returns what it printed. A server
/// that starts instead is stopped (by its PID) and the test fails.
fn refused_start(dir: &DataDir, extra: &[&str]) -> String {
    let mut child = onehop()
        .arg("serve")
        .args(dir.serve_args(&["--mqtt-addr", "127.0.0.1:0"]))
        .args(extra)
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    match status {
        Some(status) if !status.success() => stderr,
        _ => panic!("the server started on damaged data:\n{stderr}"),
    }
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
fn a_damaged_catalog_stops_the_start_and_costs_no_record() {
    let dir = DataDir::new();
    let data = &dir.data;
    publish_then_kill(&dir, "orders", 120);
    let catalog = segment(data, "__catalog");
    assert_eq!(batch_positions(&catalog), [0], "the auto-created stream is the catalog's only batch");
    let orders = fs::read(segment(data, "orders")).unwrap();
    // Four bytes inside the catalog's only batch, as the outside test flipped them.
    flip(&catalog, 52..56);

    let stderr = refused_start(&dir, &[]);
    for needed in [catalog.display().to_string(), "byte 0".to_string(), "--recover-catalog".to_string()] {
        assert!(stderr.contains(&needed), "the refusal names {needed:?}:\n{stderr}");
    }
    assert!(!stderr.contains("removing the data"), "{stderr}");
    assert_eq!(fs::read(segment(data, "orders")).unwrap(), orders, "the stream's data is untouched");

    // With --recover-catalog the server starts, keeps the stream's data as an orphan, and a
    // definition takes it back whole.
    let server = dir.start(&["--recover-catalog"], &[]);
    let (_, health) = get(server.address, "/healthz");
    assert!(health.contains(r#""orphaned":["orders"]"#), "{health}");
    sql(server.address, "CREATE STREAM orders");
    let records = read_all(server.address, "orders");
    assert_eq!(records.len(), 120);
    for (i, (offset, value)) in records.iter().enumerate() {
        assert_eq!((*offset, value["n"].as_u64()), (i as u64, Some(i as u64)));
    }
    let (_, health) = get(server.address, "/healthz");
    assert!(health.contains(r#""orphaned":[]"#), "{health}");
}

#[test]
fn damage_inside_a_stream_that_valid_batches_follow_stops_the_start_until_set_aside() {
    let dir = DataDir::new();
    publish_then_kill(&dir, "events", 40);
    let events = segment(&dir.data, "events");
    let positions = batch_positions(&events);
    assert_eq!(positions.len(), 40, "one batch per publish");
    // A flipped byte in the records of the eleventh batch (offset 10); 29 valid batches follow.
    let bad_at = positions[10];
    flip(&events, bad_at + 50..bad_at + 51);
    let damaged = fs::read(&events).unwrap();

    let stderr = refused_start(&dir, &[]);
    for needed in
        [events.display().to_string(), format!("byte {bad_at}"), "offset 11".into(), "--discard-damaged".into()]
    {
        assert!(stderr.contains(&needed), "the refusal names {needed:?}:\n{stderr}");
    }
    assert_eq!(fs::read(&events).unwrap(), damaged, "a refused start changes nothing");

    let server = dir.start(&["--discard-damaged"], &[]);
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

/// Runs `onehop check` on the data directory: its exit code and report.
fn check(dir: &DataDir, json: bool) -> (i32, String) {
    let mut command = onehop();
    command.args(["check", "--data-dir", dir.data_arg()]);
    if json {
        command.arg("--json");
    }
    let output = command.output().unwrap();
    let code = output.status.code().expect("an exit code");
    (code, String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr))
}

/// Starts the server on `dir`, publishes `count` records to `stream` one request at a time,
/// and stops it cleanly (SIGTERM): every segment's index is written, and trusted at the next
/// start.
fn publish_then_stop(dir: &DataDir, stream: &str, count: usize, extra: &[&str]) {
    let mut server = dir.start(extra, &[]);
    for i in 0..count {
        assert!(publish_batch(server.address, stream, &[serde_json::json!({ "n": i, "pad": "x".repeat(60) })]));
    }
    server.signal("TERM");
    assert!(server.wait_exit().success());
}

#[test]
fn damage_under_an_intact_index_fails_reads_and_subscriptions_loudly_and_check_finds_it() {
    let dir = DataDir::new();
    let (code, report) = check(&dir, false);
    assert_eq!(code, 2, "no data directory yet: {report}");
    publish_then_stop(&dir, "events", 40, &[]);
    let (code, report) = check(&dir, false);
    assert_eq!(code, 0, "{report}");
    assert!(report.contains("no damage"), "{report}");

    let events = segment(&dir.data, "events");
    let positions = batch_positions(&events);
    let bad_at = positions[10];
    flip(&events, bad_at + 50..bad_at + 51);
    let (code, report) = check(&dir, false);
    assert_eq!(code, 1, "{report}");
    for needed in ["events/0", "DAMAGED", &format!("bytes {bad_at} to {}", positions[11]), "--discard-damaged"] {
        assert!(report.contains(needed), "the report names {needed:?}:\n{report}");
    }
    let (_, json) = check(&dir, true);
    let json: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
    assert_eq!(json["damaged"], 1, "{json}");

    // The index is intact, so the start trusts it: the damage is met by readers.
    let server = dir.start(&[], &[]);
    // A read answers the records before the damage; the next one, from the damage, fails
    // saying what to do.
    let (status, body) = get(server.address, "/streams/events?from=0&limit=100");
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["records"].as_array().unwrap().len(), 10, "{body}");
    let (status, body) = get(server.address, "/streams/events?from=10&limit=100");
    assert_eq!(status, 500, "{body}");
    assert!(body.contains("storage_failed") && body.contains("--discard-damaged"), "{body}");
    // A subscription from the start gets the ten records before the damage, then an error
    // event saying why it ends and where it would resume.
    let mut subscription = RawSse::open(server.address, "/streams/events?from=earliest", None);
    for n in 0..10 {
        let (name, data) = subscription.next_event().expect("a record");
        assert_eq!((name.as_str(), data["value"]["n"].as_u64()), ("record", Some(n)), "{data}");
    }
    let (name, data) = subscription.next_event().expect("an error event, not a silent end");
    assert_eq!(name, "error", "{data}");
    assert_eq!(data["error"]["code"], "storage_failed", "{data}");
    assert_eq!(data["resume_id"], "0:9", "{data}");
    drop(subscription);
    drop(server);

    // --discard-damaged reads past the intact index and sets the batch aside.
    let server = dir.start(&["--discard-damaged"], &[]);
    let offsets: Vec<u64> = read_all(server.address, "events").iter().map(|(offset, _)| *offset).collect();
    assert_eq!(offsets, (0..40).filter(|offset| *offset != 10).collect::<Vec<u64>>());
    drop(server);
    let (code, report) = check(&dir, false);
    assert_eq!(code, 0, "{report}");
}

#[test]
fn a_middle_segment_cut_short_or_deleted_stops_the_start_until_the_loss_is_accepted() {
    let dir = DataDir::new();
    publish_then_stop(&dir, "events", 120, &["--segment-bytes-max", "4096"]);
    let partition = dir.data.join("log").join("events").join("0");
    let mut bases: Vec<u64> = fs::read_dir(&partition)
        .unwrap()
        .filter_map(|entry| entry.unwrap().file_name().to_string_lossy().strip_suffix(".log")?.parse().ok())
        .collect();
    bases.sort_unstable();
    assert!(bases.len() >= 4, "{bases:?}");
    let victim = partition.join(format!("{:020}.log", bases[1]));
    let positions = batch_positions(&victim);
    // Cut at a batch boundary: every file still looks whole.
    let cut_at = positions[positions.len() / 2];
    let first_lost = bases[1] + (positions.len() / 2) as u64;
    fs::OpenOptions::new().write(true).open(&victim).unwrap().set_len(cut_at as u64).unwrap();

    let (code, report) = check(&dir, false);
    assert_eq!(code, 1, "{report}");
    assert!(report.contains(&format!("missing records at offsets {first_lost} up to {}", bases[2])), "{report}");
    let stderr = refused_start(&dir, &[]);
    for needed in [
        format!("{:020}.log", bases[1]),
        format!("offsets {first_lost} up to but not including {}", bases[2]),
        "--discard-damaged".into(),
    ] {
        assert!(stderr.contains(&needed), "the refusal names {needed:?}:\n{stderr}");
    }
    // Deleting the next segment too: both are named.
    fs::remove_file(partition.join(format!("{:020}.log", bases[2]))).unwrap();
    let stderr = refused_start(&dir, &[]);
    assert!(stderr.contains(&format!("segment {:020}.log is gone", bases[2])), "{stderr}");

    let server = dir.start(&["--discard-damaged"], &[]);
    let offsets: Vec<u64> = read_all(server.address, "events").iter().map(|(offset, _)| *offset).collect();
    let expected: Vec<u64> = (0..120).filter(|offset| !(first_lost..bases[3]).contains(offset)).collect();
    assert_eq!(offsets, expected);
    let (status, body) = post(server.address, "/streams/events", r#"{"n":"after"}"#).unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""offset":120"#), "no offset is given out again: {body}");
    drop(server);
    // The accepted loss is part of the partition now: the next start needs no flag.
    let server = dir.start(&[], &[]);
    assert_eq!(read_all(server.address, "events").len(), expected.len() + 1);
}

#[test]
fn a_catalog_damaged_under_an_intact_index_names_the_way_out_and_is_recovered() {
    let dir = DataDir::new();
    publish_then_stop(&dir, "orders", 5, &[]);
    let catalog = segment(&dir.data, "__catalog");
    assert!(dir.data.join("log/__catalog/0/00000000000000000000.index").exists(), "a clean stop wrote the index");
    flip(&catalog, 52..56);
    let stderr = refused_start(&dir, &[]);
    assert!(stderr.contains("--recover-catalog"), "the refusal says what to do:\n{stderr}");
    let (code, report) = check(&dir, false);
    assert_eq!(code, 1, "{report}");
    assert!(report.contains("__catalog/0"), "{report}");
    // --recover-catalog reads past the intact index and sets the damaged batch aside.
    let server = dir.start(&["--recover-catalog"], &[]);
    let (_, health) = get(server.address, "/healthz");
    assert!(health.contains(r#""orphaned":["orders"]"#), "{health}");
}
