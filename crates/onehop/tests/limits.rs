//! Limits per user (`ALTER USER … SET LIMITS`) with real clients: connections and
//! subscriptions counted across MQTT (mosquitto, paho) and SSE (curl) together, refused at the
//! limit in each protocol's own form (CONNACK 0x97 or 3, SUBACK 0x97, HTTP 429 with
//! `Retry-After`), and freed when a client leaves; publish rates refusing HTTP writes past a
//! second's worth, and slowing MQTT (mosquitto_pub) and Kafka (kcat) publishers down without
//! losing anything they sent.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{DataDir, Spawned, line_channel};

/// curl as dev, with the response's head in what it prints (`-i`): the status and all that.
fn curl(address: SocketAddr, path: &str, args: &[&str]) -> (u16, String) {
    common::curl(address, path, &[&["-i", "-u", "dev:dev-pass"][..], args].concat())
}

const ROOT: (&str, &str) = ("root", "root-pass");

/// A paho client (v5) that connects as dev and subscribes to each filter in turn; prints the
/// CONNACK's reason code and each SUBACK's, as JSON.
const PAHO: &str = r#"
import json, sys, threading
import paho.mqtt.client as mqtt
port, filters = int(sys.argv[1]), sys.argv[2:]
found = {"suback": []}
connected, subscribed = threading.Event(), threading.Event()
def on_connect(client, userdata, flags, reason, properties):
    found["connack"] = reason.value
    connected.set()
def on_subscribe(client, userdata, mid, reasons, properties):
    found["suback"].extend(reason.value for reason in reasons)
    subscribed.set()
client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-limits", protocol=mqtt.MQTTv5)
client.username_pw_set("dev", "dev-pass")
client.on_connect, client.on_subscribe = on_connect, on_subscribe
client.connect("127.0.0.1", port)
client.loop_start()
connected.wait(10)
if found.get("connack") == 0:
    for topic in filters:
        subscribed.clear()
        client.subscribe(topic, qos=1)
        subscribed.wait(10)
client.disconnect()
client.loop_stop()
print(json.dumps(found))
"#;

fn paho(port: u16, filters: &[&str]) -> serde_json::Value {
    let output = Command::new("python3").args(["-c", PAHO, &port.to_string()]).args(filters).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "paho: {stdout}{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_str(stdout.trim()).unwrap_or_else(|_| panic!("paho printed {stdout:?}"))
}

/// The value of the metric `name{protocol="…"}`.
fn metric(address: SocketAddr, name: &str, protocol: &str) -> f64 {
    let metrics = common::get_as(address, "/metrics", ROOT);
    let prefix = format!("{name}{{protocol=\"{protocol}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {prefix}"))
        .parse()
        .unwrap()
}

/// Waits until `done` holds, or fails naming `what`.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_user_at_its_limits_is_refused_or_slowed_in_each_protocol_and_freed_when_it_leaves() {
    let dir = DataDir::new();
    let server = dir.start(&["--admin-user", ROOT.0], &[("ONEHOP_ADMIN_PASSWORD", ROOT.1)]);
    let (address, mqtt) = (server.address, server.mqtt_address.port());
    common::sql_as(
        address,
        ROOT,
        "CREATE USER dev PASSWORD 'dev-pass'; CREATE STREAM telemetry; CREATE STREAM alerts; \
         GRANT READ, WRITE ON STREAM telemetry, STREAM alerts TO dev; \
         ALTER USER dev SET LIMITS (connections = 2, subscriptions = 2)",
    );
    let shown = common::sql_as(address, ROOT, "SHOW USERS");
    assert!(shown.contains("connections = 2, subscriptions = 2"), "{shown}");

    // Two MQTT subscribers: two connections, two subscriptions.
    let subscribe = |filter: &str| {
        let mut child = Spawned(
            // Line-buffered (stdbuf execs mosquitto_sub: same process), so its debug lines come as printed.
            Command::new("stdbuf")
                .args([
                    "-oL",
                    "mosquitto_sub",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &mqtt.to_string(),
                    "-u",
                    "dev",
                    "-P",
                    "dev-pass",
                ])
                .args(["-d", "-t", filter])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let lines = line_channel(child.0.stdout.take().unwrap());
        loop {
            let line = lines.recv_timeout(Duration::from_secs(10)).expect("mosquitto_sub subscribes");
            if line.starts_with("Subscribed") {
                break;
            }
        }
        (child, lines)
    };
    let (_telemetry, received) = subscribe("telemetry/#");
    let (alerts, _) = subscribe("alerts/#");
    // What the first subscriber receives, without mosquitto_sub's debug lines.
    let next_message = || loop {
        let line = received.recv_timeout(Duration::from_secs(10)).expect("a message arrives");
        if !line.starts_with("Client ") && !line.starts_with("Subscribed") {
            return line;
        }
    };

    let publish = |version: &str| {
        let output = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &mqtt.to_string(), "-V", version, "-u", "dev", "-P", "dev-pass"])
            .args(["-q", "1", "-t", "telemetry/x", "-m", "third"])
            .output()
            .unwrap();
        output.status.code().unwrap_or(-1)
    };
    assert_eq!(publish("mqttv5"), 0x97, "a third connection: CONNACK 0x97 quota exceeded");
    assert_eq!(publish("mqttv311"), 3, "3.1.1: return code 3, server unavailable");
    let (status, said) = curl(address, "/streams/telemetry", &["-H", "Accept: text/event-stream", "--max-time", "3"]);
    assert_eq!(status, 429, "an SSE stream is a connection too: {said}");
    assert!(said.to_lowercase().contains("retry-after: 1") && said.contains("limit_exceeded"), "{said}");
    assert!(said.contains("connections = 2"), "the refusal names the limit: {said}");
    assert_eq!(metric(address, "limit_refusals_total", "http"), 1.0);

    // One subscriber leaves: its connection and subscription are free for paho, which may
    // then subscribe to one filter, and not to a second.
    drop(alerts);
    let mut found = paho(mqtt, &["alerts/#", "telemetry/a"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while found["connack"] == 0x97 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        found = paho(mqtt, &["alerts/#", "telemetry/a"]);
    }
    assert_eq!(found, serde_json::json!({"connack": 0, "suback": [1, 0x97]}), "the second filter is over the limit");
    assert!(metric(address, "limit_refusals_total", "mqtt") >= 3.0);
    // paho has disconnected: a publish gets its place and reaches the first subscriber.
    wait_until("paho's place is freed", || publish("mqttv5") == 0);
    assert_eq!(next_message(), "third");

    // Rates: five records a second.
    common::sql_as(address, ROOT, "ALTER USER dev SET LIMITS (publishes_per_second = 5)");
    let statuses: Vec<u16> =
        (0..8).map(|n| curl(address, "/streams/alerts", &["--data-binary", &format!("{{\"n\":{n}}}")]).0).collect();
    assert_eq!(statuses[..5], [200; 5], "a second's worth is let in at once: {statuses:?}");
    assert!(statuses[5..].contains(&429), "then refused: {statuses:?}");
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(curl(address, "/streams/alerts", &["--data-binary", "{\"n\":99}"]).0, 200, "room again a second later");

    // mosquitto_pub sends 20 at QoS 1: it is slowed to five a second and loses nothing.
    let started = Instant::now();
    let mut publisher = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &mqtt.to_string(), "-u", "dev", "-P", "dev-pass", "-q", "1"])
        .args(["-t", "telemetry/rate", "-l"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let lines: String = (0..20).map(|n| format!("m{n}\n")).collect();
    publisher.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    assert!(publisher.wait().unwrap().success());
    let took = started.elapsed();
    let got: Vec<String> = (0..20).map(|_| next_message()).collect();
    assert_eq!(got, (0..20).map(|n| format!("m{n}")).collect::<Vec<_>>());
    assert!(took >= Duration::from_millis(2500), "20 at five a second, a second's worth at once: {took:?}");
    assert!(metric(address, "publishes_throttled_total", "mqtt") >= 1.0);

    // kcat produces 20 in one batch: acknowledged, told to wait, and the wait is counted.
    let kafka = server.kafka_address.unwrap().to_string();
    let mut kcat = Command::new("timeout")
        .args(["30", "kcat", "-b", &kafka, "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=PLAIN"])
        .args(["-X", "sasl.username=dev", "-X", "sasl.password=dev-pass", "-P", "-t", "alerts"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    kcat.stdin.take().unwrap().write_all(lines.as_bytes()).unwrap();
    let output = kcat.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(metric(address, "publishes_throttled_total", "kafka") >= 1.0);
    let stored = common::get_as(address, "/streams/alerts?from=earliest&limit=1000", ROOT);
    let stored: serde_json::Value = serde_json::from_str(&stored).unwrap();
    let count = stored["records"].as_array().unwrap().len();
    let accepted_over_http = statuses.iter().filter(|status| **status == 200).count() + 1;
    assert_eq!(count, accepted_over_http + 20, "every accepted HTTP write and every Kafka record, nothing refused");
}
