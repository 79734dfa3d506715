use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use crate::common::DataDir;

/// Runs kcat against `kafka` with `args`, `input` on its stdin; returns its stdout lines.
fn kcat(kafka: SocketAddr, args: &[&str], input: &str) -> Vec<String> {
    let mut child = Command::new("kcat")
        .args(["-b", &kafka.to_string()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat is installed (Debian's kcat; scripts/test installs it)");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "kcat {args:?}: {stderr}");
    String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect()
}

/// librdkafka, through kcat: an idempotent producer at acks=all with every compression, read
/// back whole; then a consumer group (librdkafka's balanced consumer) reads everything, and,
/// started again, only what came after its committed offset.
#[test]
fn kcat_produces_with_every_compression_and_its_group_resumes_from_its_commit() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    let mut sent = BTreeSet::new();
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let lines: String = (0..10).map(|i| format!("{codec}{i}:{codec}-{i}\n")).collect();
        let settings = ["-X", "enable.idempotence=true", "-X", "acks=all"];
        kcat(kafka, &[&["-P", "-t", "events", "-K:", "-z", codec][..], &settings[..]].concat(), &lines);
        sent.extend((0..10).map(|i| format!("{codec}{i}={codec}-{i}")));
    }
    let read: BTreeSet<String> =
        kcat(kafka, &["-C", "-t", "events", "-o", "beginning", "-e", "-f", "%k=%s\n"], "").into_iter().collect();
    assert_eq!(read, sent);

    let group = ["-G", "readers", "-e", "-f", "%s\n", "-X", "auto.offset.reset=earliest", "events"];
    let first = kcat(kafka, &group, "");
    assert_eq!(first.len(), 50, "{first:?}");
    kcat(kafka, &["-P", "-t", "events", "-K:"], "late:after-1\nlate:after-2\n");
    let second = kcat(kafka, &group, "");
    assert_eq!(second, ["after-1", "after-2"], "the group resumed from its committed offset");
}
