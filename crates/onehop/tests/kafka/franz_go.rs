use std::process::Command;

use crate::common::DataDir;

/// franz-go (Go, the client of the harness's Kafka targets; `onehop-peer-glue codecs`, which
/// `scripts/peers install kafka` builds): an idempotent producer writes 100 records with a
/// header under each codec (none, gzip, snappy, lz4, zstd), and a consumer group reads every one
/// back once, with its header, and commits them all.
#[test]
fn franz_go_produces_with_every_codec_and_its_group_reads_and_commits_them() {
    let peers = std::env::var_os("ONEHOP_PEERS_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| {
        std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/onehop-peers")
    });
    let glue = peers.join("bin/onehop-peer-glue");
    assert!(glue.exists(), "{} is missing: run `scripts/peers install kafka` (scripts/test does)", glue.display());
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap().to_string();
    let output = Command::new(glue)
        .args(["codecs", "--address", &kafka, "--topic", "events", "--group", "readers"])
        .output()
        .expect("the glue runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "franz-go failed: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for field in ["acknowledged", "read", "distinct", "headers", "committed"] {
        assert_eq!(report[field], 500, "{field}: {report}");
    }
}
