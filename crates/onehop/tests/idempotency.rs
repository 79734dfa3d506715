//! HTTP's `Idempotency-Key`, with curl: a retried publish (one record, or an NDJSON batch) is
//! answered with the first write's answer and `Idempotent-Replayed: true`, and writes nothing;
//! a key named for another write is refused with 422; keys are per user; a retry after a kill -9
//! of the server is still recognised.

mod common;

use std::net::SocketAddr;
use std::process::Command;

use common::{DataDir, get};

/// A POST with curl: (status, the headers' lines in lower case, the body).
fn post(address: SocketAddr, path: &str, headers: &[&str], body: &str) -> (u16, Vec<String>, String) {
    let mut command = Command::new("curl");
    command.args(["-s", "-S", "--max-time", "30", "-D", "-", "-X", "POST", "--data-binary", body]);
    for header in headers {
        command.args(["-H", header]);
    }
    let output = command.arg(format!("http://{address}{path}")).output().expect("curl runs");
    let text = String::from_utf8(output.stdout).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head in {text:?}"));
    let mut lines = head.lines();
    let status = lines.next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, lines.map(str::to_ascii_lowercase).collect(), body.to_string())
}

fn replayed(headers: &[String]) -> bool {
    headers.iter().any(|line| line.trim() == "idempotent-replayed: true")
}

/// How many records `stream` holds.
fn count(address: SocketAddr, stream: &str) -> usize {
    let (status, body) = get(address, &format!("/streams/{stream}?from=earliest&limit=1000"));
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    page["records"].as_array().unwrap().len()
}

#[test]
fn a_retried_publish_is_answered_once_written_and_survives_kill_9() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    let key = "Idempotency-Key: pay-7c1e0a42";
    let (status, headers, first) = post(server.address, "/streams/payments", &[key], "{\"amount\":5}");
    assert_eq!(status, 200, "{first}");
    assert!(!replayed(&headers), "{headers:?}");
    let (status, headers, again) = post(server.address, "/streams/payments", &[key], "{\"amount\":5}");
    assert_eq!((status, again.as_str()), (200, first.as_str()), "the first write's answer");
    assert!(replayed(&headers), "{headers:?}");
    assert_eq!(count(server.address, "payments"), 1, "written once");

    // The key named that write: another body under it is refused, and nothing is written.
    let (status, _, body) = post(server.address, "/streams/payments", &[key], "{\"amount\":6}");
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("idempotency_key_reused"), "{body}");
    let (status, _, body) = post(server.address, "/streams/payments", &["Idempotency-Key: has space"], "1");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("bad_idempotency_key"), "{body}");

    // A batch across partitions, keyed.
    let (status, body) =
        common::request(server.address, "POST", "/sql", "CREATE STREAM ledger WITH (partitions = 3)").unwrap();
    assert_eq!(status, 200, "{body}");
    let lines: String = (0..6).map(|i| format!("{{\"key\":\"acct-{i}\",\"value\":{i}}}\n")).collect();
    let batch = ["content-type: application/x-ndjson", "Idempotency-Key: batch-1"];
    let (status, headers, written) = post(server.address, "/streams/ledger", &batch, &lines);
    assert_eq!(status, 200, "{written}");
    assert!(!replayed(&headers));

    // kill -9, before any checkpoint could be written, and a start on the same data.
    server.kill_9();
    drop(server);
    let server = dir.start(&[], &[]);
    let (status, headers, after) = post(server.address, "/streams/payments", &[key], "{\"amount\":5}");
    assert_eq!((status, after.as_str()), (200, first.as_str()));
    assert!(replayed(&headers), "recognised after the restart: {headers:?}");
    let (status, headers, again) = post(server.address, "/streams/ledger", &batch, &lines);
    assert_eq!((status, again.as_str()), (200, written.as_str()));
    assert!(replayed(&headers));
    assert_eq!(count(server.address, "payments"), 1);
    assert_eq!(count(server.address, "ledger"), 6);
    // A publish without a key is written each time, as ever.
    for _ in 0..2 {
        let (status, headers, _) = post(server.address, "/streams/payments", &[], "{\"amount\":5}");
        assert!(status == 200 && !replayed(&headers));
    }
    assert_eq!(count(server.address, "payments"), 3);
}

#[test]
fn keys_are_per_user() {
    let dir = DataDir::new();
    let root = ("root", "root-pass");
    let server = dir.start(&["--admin-user", root.0], &[("ONEHOP_ADMIN_PASSWORD", root.1)]);
    common::sql_as(
        server.address,
        root,
        "CREATE USER alice PASSWORD 'alice-pass'; CREATE USER bob PASSWORD 'bob-pass'; CREATE STREAM shared; \
         GRANT WRITE ON STREAM shared TO alice; GRANT WRITE ON STREAM shared TO bob",
    );
    let as_user = |user: &str, password: &str| {
        let credentials = format!("{user}:{password}");
        let output = Command::new("curl")
            .args(["-s", "-S", "-D", "-", "-u", &credentials, "-H", "Idempotency-Key: same", "-d", "1"])
            .arg(format!("http://{}/streams/shared", server.address))
            .output()
            .unwrap();
        String::from_utf8(output.stdout).unwrap().to_ascii_lowercase()
    };
    let alice = as_user("alice", "alice-pass");
    let bob = as_user("bob", "bob-pass");
    assert!(alice.starts_with("http/1.1 200") && bob.starts_with("http/1.1 200"), "{alice}\n{bob}");
    assert!(!alice.contains("idempotent-replayed") && !bob.contains("idempotent-replayed"), "{bob}");
    assert!(as_user("bob", "bob-pass").contains("idempotent-replayed: true"));
    assert_eq!(common::stored_as(server.address, "shared", root).len(), 2, "one write each");
}
