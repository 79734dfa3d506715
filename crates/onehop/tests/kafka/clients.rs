use std::collections::BTreeSet;

use crate::common::{DataDir, RawSse, get, sql};
use crate::{console_consume, console_produce, create_topic, kafka_tool, succeed};

/// Every compression the Java producer offers, each through the idempotent console producer,
/// read back per partition with the console consumer and over HTTP: the same keys and values,
/// each once.
#[test]
fn java_clients_produce_with_every_compression_and_read_back_over_kafka_and_http() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    create_topic(kafka, "orders", 3);
    let listed =
        succeed(kafka_tool("org.apache.kafka.tools.TopicCommand", kafka).args(["--describe", "--topic", "orders"]));
    assert!(listed.contains("PartitionCount: 3"), "{listed}");

    let mut sent = BTreeSet::new();
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let lines: Vec<String> = (0..20).map(|i| format!("{codec}-{i}\tvalue {codec} {i}")).collect();
        console_produce(
            kafka,
            "orders",
            &lines,
            &["--property", "key.separator=\t", "--compression-codec", codec, "--producer-property", "linger.ms=20"],
        );
        sent.extend((0..20).map(|i| (format!("{codec}-{i}"), format!("value {codec} {i}"))));
    }

    // Over Kafka: each partition from its start, every record once.
    let (_, body) = get(server.address, "/streams/orders?from=earliest&limit=1000");
    let http: serde_json::Value = serde_json::from_str(&body).unwrap();
    let next = &http["next"];
    let mut read = BTreeSet::new();
    for partition in 0..3u32 {
        let count = next[partition.to_string()].as_u64().unwrap() as usize;
        if count == 0 {
            continue;
        }
        for line in console_consume(kafka, "orders", partition, count) {
            let fields: Vec<&str> = line.split('\t').collect();
            assert_eq!(fields.len(), 4, "{line}");
            assert_eq!(fields[1], "NO_HEADERS", "the server's own producer header is not sent: {line}");
            assert!(read.insert((fields[2].to_string(), fields[3].to_string())), "read twice: {line}");
        }
    }
    assert_eq!(read, sent);

    // Over HTTP: the same records, nothing stored twice.
    let records = http["records"].as_array().unwrap();
    assert_eq!(records.len(), sent.len(), "{body}");
    let over_http: BTreeSet<(String, String)> = records
        .iter()
        .map(|record| (record["key"].as_str().unwrap().to_string(), record["value_text"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(over_http, sent);
}

/// A subject crosses protocols: an MQTT publish reaches a Kafka consumer with its topic in the
/// `onehop-subject` header, and a Kafka record with that header reaches an SSE subscriber
/// filtered by subject and updates a live view (the topic, created by the MQTT publish, is a
/// stream like any other).
#[test]
fn subjects_cross_from_mqtt_to_kafka_and_from_kafka_to_sse() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    let mqtt = server.mqtt_address;
    let status = std::process::Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &mqtt.port().to_string(), "-q", "1", "-t", "home/hall", "-m", "lights on"])
        .status()
        .unwrap();
    assert!(status.success());
    let lines = console_consume(kafka, "home", 0, 1);
    assert_eq!(lines, ["Offset:0\tonehop-subject:home/hall,onehop-mqtt-qos:1\tnull\tlights on"]);

    sql(server.address, "CREATE VIEW rooms AS SELECT room, COUNT(*) AS n, MAX(celsius) AS top FROM home GROUP BY room");
    let mut sse = RawSse::open(server.address, "/streams/home?subject=home/kitchen", None);
    let lines = [
        "onehop-subject:home/garage\tk1\t{\"room\":\"garage\",\"celsius\":9}".to_string(),
        "onehop-subject:home/kitchen,trace:abc\tk2\t{\"room\":\"kitchen\",\"celsius\":21}".to_string(),
    ];
    console_produce(kafka, "home", &lines, &["--property", "parse.headers=true"]);
    let (id, event) = sse.next();
    assert_eq!(id, "0:2", "{event}");
    assert_eq!(event["subject"], "home/kitchen");
    assert_eq!(event["key"], "k2");
    assert_eq!(event["value"]["celsius"], 21);
    assert_eq!(event["headers"]["trace"], "abc");
    // The view applies the record on its own task: give it a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (view, body) = loop {
        let (status, body) = get(server.address, "/views/rooms/kitchen");
        // 404 until the view has folded the record in: its key does not exist before.
        assert!(status == 200 || (status == 404 && std::time::Instant::now() < deadline), "{status} {body}");
        let view: serde_json::Value = serde_json::from_str(&body).unwrap();
        if (status == 200 && view["rows"][0]["n"] == 1) || std::time::Instant::now() > deadline {
            break (view, body);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(view["rows"][0]["n"], 1, "{body}");
    assert_eq!(view["rows"][0]["top"], 21, "{body}");
}

/// Kafka's topic and config tools: a topic created with `cleanup.policy=compact` is a compacted
/// stream; ConfigCommand describes it, sets its retention (then `compact,delete`), and is
/// refused a change of policy; a policy that does not exist is refused at creation.
#[test]
fn topic_settings_are_created_described_and_altered_with_kafkas_tools() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    let created = succeed(kafka_tool("org.apache.kafka.tools.TopicCommand", kafka).args([
        "--create",
        "--topic",
        "accounts",
        "--partitions",
        "2",
        "--config",
        "cleanup.policy=compact",
    ]));
    assert!(created.contains("Created topic accounts"), "{created}");
    let configs = |extra: &[&str]| {
        let mut command = kafka_tool("kafka.admin.ConfigCommand", kafka);
        command.args(["--entity-type", "topics", "--entity-name", "accounts"]).args(extra);
        command.output().expect("java runs")
    };
    let described = String::from_utf8_lossy(&configs(&["--describe"]).stdout).into_owned();
    assert!(described.contains("cleanup.policy=compact "), "{described}");
    assert!(configs(&["--alter", "--add-config", "retention.ms=3600000"]).status.success());
    let described = String::from_utf8_lossy(&configs(&["--describe"]).stdout).into_owned();
    assert!(described.contains("cleanup.policy=compact,delete "), "{described}");
    assert!(described.contains("retention.ms=3600000 "), "{described}");
    let refused = configs(&["--alter", "--add-config", "cleanup.policy=delete"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("does not change"));

    let shown: serde_json::Value = serde_json::from_str(&sql(server.address, "SHOW STREAMS")).unwrap();
    let row = shown["results"][0]["rows"].as_array().unwrap().iter().find(|row| row[0] == "accounts").unwrap().clone();
    let columns = shown["results"][0]["columns"].clone();
    let at = |name: &str| columns.as_array().unwrap().iter().position(|column| column == name).unwrap();
    assert_eq!(row[at("cleanup")], "compact");
    assert_eq!(row[at("retention_ms")], 3_600_000);

    let bogus = kafka_tool("org.apache.kafka.tools.TopicCommand", kafka)
        .args(["--create", "--topic", "bogus", "--config", "cleanup.policy=bogus"])
        .output()
        .unwrap();
    assert!(!bogus.status.success());
    let said = format!("{}{}", String::from_utf8_lossy(&bogus.stdout), String::from_utf8_lossy(&bogus.stderr));
    assert!(said.contains("cleanup.policy"), "{said}");
}

/// A Java consumer resuming a group from a committed offset checks it against the leader's
/// epoch first (OffsetForLeaderEpoch, KIP-320), then reads on from exactly there.
#[test]
fn a_consumer_resuming_from_a_commit_validates_it_by_leader_epoch() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    create_topic(kafka, "audit", 1);
    let lines = |range: std::ops::Range<u32>| -> Vec<String> { range.map(|i| format!("k{i}\tv{i}")).collect() };
    let read_in_group = || -> Vec<String> {
        let said = succeed(kafka_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", kafka).args([
            "--topic",
            "audit",
            "--group",
            "auditors",
            "--from-beginning",
            "--timeout-ms",
            "6000",
        ]));
        said.lines().filter(|line| line.starts_with('v')).map(str::to_string).collect()
    };
    console_produce(kafka, "audit", &lines(0..20), &[]);
    assert_eq!(read_in_group().len(), 20);
    console_produce(kafka, "audit", &lines(20..25), &[]);
    assert_eq!(read_in_group(), ["v20", "v21", "v22", "v23", "v24"], "on from the commit, nothing again");
    let (_, metrics) = get(server.address, "/metrics");
    let validations = metrics
        .lines()
        .find_map(|line| line.strip_prefix("kafka_requests_total{api=\"OffsetForLeaderEpoch\"} "))
        .map_or(0, |count| count.trim().parse::<u64>().unwrap());
    assert!(validations >= 1, "the resumed position was validated: {validations}");
}

/// A Kafka record without an `onehop-subject` header is on the topic its stream names: MQTT
/// subscribers of `#` and of `{stream}/#` get it (on topic `{stream}`), and an HTTP read
/// filtered by that subject finds it. A topic name may be as long as Kafka's, 249 characters.
#[test]
fn a_kafka_record_without_a_subject_reaches_mqtt_on_its_streams_topic() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    let mqtt = server.mqtt_address.port().to_string();
    sql(server.address, "CREATE STREAM plain");
    let subscriber = |filter: &str| {
        let mut child = crate::common::Spawned(
            std::process::Command::new("mosquitto_sub")
                .args(["-h", "127.0.0.1", "-p", &mqtt, "-t", filter, "-v"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let lines = crate::common::line_channel(child.0.stdout.take().unwrap());
        (child, lines)
    };
    let (_everything, everything) = subscriber("#");
    let (_under, under) = subscriber("plain/#");
    crate::common::wait_for_mqtt_subscriptions(server.address, 2, None);
    let output = crate::librdkafka::kcat_output(kafka, &["-P", "-t", "plain"], "no subject here\n");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for (lines, filter) in [(&everything, "#"), (&under, "plain/#")] {
        let line =
            lines.recv_timeout(std::time::Duration::from_secs(20)).unwrap_or_else(|_| panic!("{filter}: nothing"));
        assert_eq!(line, "plain no subject here", "{filter}");
    }
    let (status, body) = get(server.address, "/streams/plain?from=0&subject=plain");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("no subject here"), "{body}");

    let long = "t".repeat(249);
    let output = crate::librdkafka::kcat_output(kafka, &["-P", "-t", &long], "x\n");
    assert!(output.status.success(), "a 249-character topic: {}", String::from_utf8_lossy(&output.stderr));
    let output = crate::librdkafka::kcat_output(kafka, &["-P", "-t", &"t".repeat(250)], "x\n");
    assert!(!output.status.success(), "250 characters is past Kafka's limit too");
}
