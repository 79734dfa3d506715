use std::path::PathBuf;
use std::process::Command;

use crate::common::DataDir;

/// The glue (`onehop-peer-glue`, franz-go's side), as `scripts/peers install kafka` builds it.
fn glue() -> PathBuf {
    let peers = std::env::var_os("ONEHOP_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/onehop-peers"));
    let glue = peers.join("bin/onehop-peer-glue");
    assert!(glue.exists(), "{} is missing: run `scripts/peers install kafka` (scripts/test does)", glue.display());
    glue
}

/// franz-go (Go, the client of the harness's Kafka targets; `onehop-peer-glue codecs`, which
/// `scripts/peers install kafka` builds): an idempotent producer writes 100 records with a
/// header under each codec (none, gzip, snappy, lz4, zstd), and a consumer group reads every one
/// back once, with its header, and commits them all.
#[test]
fn franz_go_produces_with_every_codec_and_its_group_reads_and_commits_them() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap().to_string();
    let output = Command::new(glue())
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

/// franz-go's roles (`onehop-peer-glue group consume|produce`, bench/baselines/glue/group.go),
/// started as processes.
fn franz_go(args: &[&str]) -> crate::Spawned {
    crate::spawn_role(Command::new(glue()).arg("group").args(args))
}

/// franz-go as the Java client and librdkafka are tested (`group_of_three`): three members of a
/// group (its default cooperative-sticky balancer, each record committed with CommitRecords)
/// hold a partition each and each consumes its share; one leaves (SIGTERM: Close, LeaveGroup)
/// and the other two take its partition over; the server is killed with kill -9 once all is
/// committed and started again, and the group resumes from its commits, every record consumed
/// exactly once. Then franz-go's idempotent lz4 producer writes while the server is killed
/// after 1000 acknowledgements and restarted: every acknowledged record is at its acknowledged
/// offset, and none is stored twice.
#[test]
fn franz_go_group_of_three_and_idempotent_producer_across_kill_9() {
    crate::group_of_three::group_of_three_and_idempotent_producer_across_kill_9(franz_go);
}
