//! The MQTT broker with real, independent clients: mosquitto_pub / mosquitto_sub (Debian's
//! mosquitto-clients) and paho-mqtt (PyPI), both installed by scripts/test. QoS 0/1/2 each
//! way in 3.1.1 and 5, wildcards, v5 properties, wills, takeover, keep-alive, MQTT ↔ HTTP,
//! bad input, and acknowledged publishes surviving kill -9.

mod common;
#[path = "mqtt/raw.rs"]
mod raw;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::Duration;

use common::{DataDir, RawSse, Server, get, post, sql};
use serde_json::{Value, json};

fn tool(name: &str) -> Command {
    let found = Command::new("sh").args(["-c", &format!("command -v {name}")]).output().unwrap();
    assert!(found.status.success(), "{name} is missing: run scripts/test, which installs the MQTT test clients");
    Command::new(name)
}

fn server() -> (Server, DataDir) {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    (server, dir)
}

fn port(address: SocketAddr) -> String {
    address.port().to_string()
}

fn mosquitto_pub(address: SocketAddr, args: &[&str]) {
    let (status, said) = mosquitto_pub_unchecked(address, args);
    assert!(status.success(), "mosquitto_pub {args:?}: {said}");
}

/// `mosquitto_pub` where a refusal is what the test expects: its exit status, and what it
/// printed (stdout, then stderr).
fn mosquitto_pub_unchecked(address: SocketAddr, args: &[&str]) -> (ExitStatus, String) {
    let output = tool("mosquitto_pub").args(["-h", "127.0.0.1", "-p", &port(address)]).args(args).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status, said)
}

/// A running `mosquitto_sub`, subscribed (its SUBACK seen), and its output lines.
struct Sub {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

/// `mosquitto_sub` waiting for `count` messages, printing each as `-F format` (which must start
/// with `MSG ` to tell messages from the `-d` debug lines). Returns once it is subscribed.
fn mosquitto_sub(address: SocketAddr, args: &[&str], count: usize) -> Sub {
    tool("mosquitto_sub");
    // Line-buffered: piped stdio would otherwise hold the SUBACK line until exit.
    let mut child = Command::new("stdbuf")
        .args(["-oL", "mosquitto_sub", "-h", "127.0.0.1", "-p", &port(address), "-C", &count.to_string(), "-W", "20"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (sender, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        match lines.recv_timeout(Duration::from_secs(10)) {
            Ok(line) if line.contains("SUBACK") => return Sub { child, lines },
            Ok(_) => {}
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("mosquitto_sub did not subscribe within 10 s");
            }
        }
    }
}

/// The message lines a `mosquitto_sub` printed (without the `MSG ` mark), once it exits.
fn sub_output(mut sub: Sub) -> Vec<String> {
    let status = sub.child.wait().unwrap();
    let mut stderr = String::new();
    sub.child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(status.success(), "mosquitto_sub failed: {stderr}");
    sub.lines.iter().filter_map(|line| line.strip_prefix("MSG ").map(str::to_string)).collect()
}

fn paho(address: SocketAddr, args: &[&str]) -> Output {
    tool("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mqtt/paho_client.py"))
        .arg(port(address))
        .args(args)
        .output()
        .unwrap()
}

/// The JSON facts a paho scenario printed, by their "check" name.
fn paho_checks(address: SocketAddr, scenario: &str) -> Vec<Value> {
    paho_checks_with(address, &[scenario])
}

fn paho_checks_with(address: SocketAddr, args: &[&str]) -> Vec<Value> {
    let scenario = args[0];
    let output = paho(address, args);
    assert!(
        output.status.success(),
        "paho scenario {scenario} failed: {}{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8(output.stdout).unwrap().lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

fn check<'a>(checks: &'a [Value], name: &str) -> Vec<&'a Value> {
    checks.iter().filter(|check| check["check"] == name).collect()
}

#[test]
fn mosquitto_clients_publish_and_subscribe_with_wildcards_and_every_qos() {
    let (server, _dir) = server();
    let mqtt = server.mqtt_address;
    // The format "MSG %t %q %p" marks message lines apart from -d's debug lines.
    let plus = mosquitto_sub(mqtt, &["-d", "-q", "2", "-t", "sensors/+/temp", "-F", "MSG %t %q %p"], 4);
    let v5 = mosquitto_sub(mqtt, &["-d", "-V", "mqttv5", "-q", "1", "-t", "sensors/#", "-F", "MSG %t %q %p"], 5);
    for qos in ["0", "1", "2"] {
        mosquitto_pub(mqtt, &["-q", qos, "-t", &format!("sensors/room-{qos}/temp"), "-m", &format!("t{qos}")]);
    }
    mosquitto_pub(mqtt, &["-V", "mqttv5", "-q", "1", "-t", "sensors/room-9/humidity", "-m", "h"]);
    // HTTP → MQTT: an HTTP publish with a matching subject reaches both.
    let (status, body) = post(server.address, "/streams/sensors?subject=sensors/room-h/temp", "from-http").unwrap();
    assert_eq!(status, 200, "{body}");

    let mut plus = sub_output(plus);
    plus.sort();
    assert_eq!(
        plus,
        [
            "sensors/room-0/temp 0 t0",
            "sensors/room-1/temp 1 t1",
            "sensors/room-2/temp 2 t2",
            "sensors/room-h/temp 1 from-http"
        ],
        "delivered at the lower of publish and subscription QoS; HTTP publishes count as QoS 1"
    );
    let mut v5 = sub_output(v5);
    v5.sort();
    assert_eq!(v5.len(), 5, "{v5:?}");
    assert!(v5.contains(&"sensors/room-2/temp 1 t2".to_string()), "QoS 2 capped at the subscription's 1: {v5:?}");
    assert!(v5.contains(&"sensors/room-9/humidity 1 h".to_string()));

    // The counters: four MQTT publishes (the HTTP one is not an MQTT packet), nine messages
    // sent, and the packets around them (connects, subscribes, acknowledgements).
    let (_, metrics) = get(server.address, "/metrics");
    let counter = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
    };
    assert_eq!(counter("mqtt_publishes_received_total"), 4);
    assert_eq!(counter("mqtt_messages_sent_total"), 9);
    // Per publisher a CONNECT and a PUBLISH at least, per subscriber a CONNECT and a SUBSCRIBE
    // (their acknowledgements may still be on the way).
    assert!(counter("mqtt_packets_received_total") >= 4 * 2 + 2 * 2, "{metrics}");
}

#[test]
fn mqtt_publishes_reach_http_readers_and_sse_subscribers() {
    let (server, _dir) = server();
    let mut sse = {
        // The stream must exist before an SSE subscription to it.
        mosquitto_pub(server.mqtt_address, &["-q", "1", "-t", "orders/created", "-m", "{\"n\":0}"]);
        RawSse::open(server.address, "/streams/orders?subject=orders/%2B", None)
    };
    mosquitto_pub(server.mqtt_address, &["-q", "1", "-t", "orders/created", "-m", "{\"n\":1}"]);
    let (id, record) = sse.next();
    assert_eq!(id, "0:1");
    assert_eq!(record["value"]["n"], 1);
    assert_eq!(record["subject"], "orders/created");
    let (status, body) = get(server.address, "/streams/orders?from=earliest");
    assert_eq!(status, 200);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["records"].as_array().unwrap().len(), 2);
    assert_eq!(body["records"][0]["headers"]["onehop-mqtt-qos"], "1");
}

#[test]
fn paho_round_trips_every_qos_exactly_once_in_both_versions() {
    let (server, _dir) = server();
    let checks = paho_checks(server.mqtt_address, "qos");
    for suback in check(&checks, "suback") {
        assert_eq!(suback["granted"], serde_json::json!([2]), "{suback}");
    }
    for round_trip in check(&checks, "round_trip") {
        let protocol = round_trip["protocol"].as_str().unwrap();
        let expected = serde_json::json!([
            [format!("paho/{protocol}/q0"), "qos0", 0],
            [format!("paho/{protocol}/q1"), "qos1", 1],
            [format!("paho/{protocol}/q2"), "qos2", 2],
        ]);
        assert_eq!(round_trip["messages"], expected, "each message once, at its QoS");
    }
    // QoS 2 stored exactly once in the log.
    let (_, body) = get(server.address, "/streams/paho?from=earliest");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["records"].as_array().unwrap().len(), 6, "{body}");
}

#[test]
fn paho_v5_properties_subscription_ids_aliases_and_assigned_ids() {
    let (server, _dir) = server();
    let checks = paho_checks(server.mqtt_address, "v5");
    let assigned = &check(&checks, "assigned_id")[0]["id"];
    assert!(assigned.as_str().is_some_and(|id| id.starts_with("onehop-")), "{assigned}");
    let v5 = check(&checks, "v5_properties")[0];
    assert_eq!(v5["user_properties"], serde_json::json!([["site", "oslo"], ["unit", "celsius"]]));
    assert_eq!(v5["subscription_ids"], serde_json::json!([7]));
    assert!(v5["expiry"].as_u64().is_some_and(|secs| (58..=60).contains(&secs)), "{v5}");
    assert_eq!(v5["topics"], serde_json::json!(["v5/things/a", "v5/things/b", "v5/things/b"]), "the alias resolves");
}

#[test]
fn wills_takeover_and_keep_alive() {
    let (server, _dir) = server();
    let checks = paho_checks(server.mqtt_address, "will");
    let will = check(&checks, "will")[0];
    assert_eq!((will["topic"].as_str(), will["payload"].as_str()), (Some("status/doomed"), Some("gone")));
    assert_eq!(check(&checks, "takeover")[0]["first_closed"], true);
    assert_eq!(
        check(&checks, "wills_seen")[0]["topics"],
        serde_json::json!(["status/doomed"]),
        "a normal DISCONNECT sends no will"
    );
    let checks = paho_checks(server.mqtt_address, "keepalive");
    let timed_out = check(&checks, "keep_alive")[0];
    assert_eq!(timed_out["topic"], "status/silent");
    let seconds = timed_out["seconds"].as_f64().unwrap();
    assert!((1.0..6.0).contains(&seconds), "dropped after {seconds} s with a 1 s keep-alive");
}

/// Sends raw bytes and returns what the server answers before it closes the connection.
fn raw_exchange(address: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let _ = stream.write_all(bytes);
    // The client says it has nothing more: a half-read packet cannot keep the connection open.
    let _ = stream.shutdown(std::net::Shutdown::Write);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    answer
}

#[test]
fn bad_input_closes_only_the_offending_connection() {
    let (server, _dir) = server();
    let mqtt = server.mqtt_address;
    // CONNECT with protocol level 9: CONNACK "unacceptable protocol version", then close.
    let bad_level = [0x10, 0x0c, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x09, 0x02, 0x00, 0x3c, 0x00, 0x00];
    assert_eq!(raw_exchange(mqtt, &bad_level), [0x20, 0x02, 0x00, 0x01]);
    // Not MQTT at all, and a packet claiming 200 MB: closed without an answer.
    assert_eq!(raw_exchange(mqtt, b"GET / HTTP/1.1\r\n\r\n"), b"");
    let v311_connect = [0x10, 0x0c, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x04, 0x02, 0x00, 0x3c, 0x00, 0x00];
    let mut huge = v311_connect.to_vec();
    huge.extend_from_slice(&[0x30, 0xff, 0xff, 0xff, 0x7f]);
    let answer = raw_exchange(mqtt, &huge);
    assert_eq!(&answer[..], &[0x20, 0x02, 0x00, 0x00], "CONNACK, then closed on the oversize header");
    // Random bytes, many times: every connection ends, the broker keeps serving.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for _ in 0..200 {
        let mut bytes = v311_connect.to_vec();
        for _ in 0..64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            bytes.push(seed as u8);
        }
        raw_exchange(mqtt, &bytes);
    }
    let sub = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "alive/check", "-F", "MSG %p"], 1);
    mosquitto_pub(mqtt, &["-q", "1", "-t", "alive/check", "-m", "still serving"]);
    assert_eq!(sub_output(sub), ["still serving"]);
    // A topic whose first level cannot name a stream is refused (v5: with a reason), not stored.
    let (_, said) = mosquitto_pub_unchecked(mqtt, &["-V", "mqttv5", "-q", "1", "-t", "no spaces/x", "-m", "m"]);
    assert!(said.contains("Topic Name invalid") && said.contains("not allowed in a name"), "{said}");
    // MQTT 3.1.1 has no negative PUBACK: the connection is closed instead.
    let (status, _) = mosquitto_pub_unchecked(mqtt, &["-q", "1", "-t", "no spaces/x", "-m", "m"]);
    assert!(!status.success());
    let (_, health) = get(server.address, "/healthz");
    assert!(health.contains("\"streams\":1"), "only the alive stream exists: {health}");
}

/// A 5.0 PUBLISH over the maximum packet size is refused from its header with a DISCONNECT
/// naming why (0x95, packet too large). The client is still sending the packet then, and must
/// still read that answer: the server closes by shutting its side and reading the rest, not
/// by closing with input unread (which the kernel answers with a reset).
#[test]
fn an_oversized_packet_is_answered_even_while_the_client_still_sends_it() {
    let (server, _dir) = server();
    for attempt in 0..3 {
        let mut stream = TcpStream::connect(server.mqtt_address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        // CONNECT, MQTT 5.0, clean start, keep-alive 60 s, no properties, empty client id.
        let connect = [0x10, 0x0d, 0x00, 0x04, b'M', b'Q', b'T', b'T', 0x05, 0x02, 0x00, 0x3c, 0x00, 0x00, 0x00];
        stream.write_all(&connect).unwrap();
        // PUBLISH QoS 0 of 8 MiB (the limit is 1 MiB): topic "a", no properties, then the payload.
        let remaining = 8usize << 20;
        // The remaining length 2^23 as a variable byte integer: 0, 0, 0 with continuation, 4.
        let head = [0x30, 0x80, 0x80, 0x80, 0x04, 0x00, 0x01, b'a', 0x00];
        let payload = remaining - 4;
        stream.write_all(&head).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        let mut sent = 0;
        while sent < payload {
            let n = chunk.len().min(payload - sent);
            if let Err(error) = stream.write_all(&chunk[..n]) {
                panic!("attempt {attempt}: the server reset the connection after {sent} bytes: {error}");
            }
            sent += n;
        }
        stream.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap_or_else(|error| panic!("attempt {attempt}: {error}"));
        // CONNACK (its length in one byte here), then DISCONNECT with reason 0x95.
        assert_eq!(answer.first(), Some(&0x20), "attempt {attempt}: {answer:02x?}");
        let disconnect = &answer[2 + usize::from(answer[1])..];
        assert_eq!(disconnect.first(), Some(&0xe0), "attempt {attempt}: {answer:02x?}");
        assert_eq!(disconnect.get(2), Some(&0x95), "attempt {attempt}: {answer:02x?}");
    }
}

#[test]
fn a_wildcard_first_level_follows_every_stream_even_new_ones() {
    let (server, _dir) = server();
    let mqtt = server.mqtt_address;
    mosquitto_pub(mqtt, &["-q", "1", "-t", "alpha/x", "-m", "before"]);
    let everything = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "#", "-F", "MSG %t %p"], 3);
    let temps = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "+/temp", "-F", "MSG %t %p"], 2);
    mosquitto_pub(mqtt, &["-q", "1", "-t", "alpha/x", "-m", "a"]);
    // A stream that does not exist yet: created by this publish, followed from its start.
    mosquitto_pub(mqtt, &["-q", "1", "-t", "beta/temp", "-m", "b"]);
    mosquitto_pub(mqtt, &["-q", "1", "-t", "gamma/temp", "-m", "c"]);
    let mut got = sub_output(everything);
    got.sort();
    assert_eq!(got, ["alpha/x a", "beta/temp b", "gamma/temp c"], "nothing from before subscribing");
    let mut got = sub_output(temps);
    got.sort();
    assert_eq!(got, ["beta/temp b", "gamma/temp c"]);
}

#[test]
fn a_stream_declaring_an_mqtt_topic_takes_those_topics() {
    let (server, _dir) = server();
    let mqtt = server.mqtt_address;
    sql(server.address, "CREATE STREAM telemetry WITH (mqtt_topic = 'devices/+/telemetry')");
    // Subscribed before any stream named `devices` exists: the declared stream is followed,
    // and so is `devices` once a publish outside the declared filter creates it.
    let devices = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "devices/#", "-F", "MSG %t %p"], 2);
    let telemetry = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "devices/d1/telemetry", "-F", "MSG %t %p"], 1);
    mosquitto_pub(mqtt, &["-q", "1", "-t", "devices/d1/telemetry", "-m", "21.5"]);
    mosquitto_pub(mqtt, &["-q", "1", "-t", "devices/d1/status", "-m", "online"]);
    let mut got = sub_output(devices);
    got.sort();
    assert_eq!(got, ["devices/d1/status online", "devices/d1/telemetry 21.5"]);
    assert_eq!(sub_output(telemetry), ["devices/d1/telemetry 21.5"]);

    // Each record is in the stream its topic routes to.
    let records = |stream: &str| {
        let (status, body) = get(server.address, &format!("/streams/{stream}?from=earliest"));
        assert_eq!(status, 200, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        body["records"].as_array().unwrap().iter().map(|record| record["subject"].clone()).collect::<Vec<_>>()
    };
    assert_eq!(records("telemetry"), ["devices/d1/telemetry"]);
    assert_eq!(records("devices"), ["devices/d1/status"]);

    // A second stream may not claim topics the first one takes.
    let (status, body) =
        post(server.address, "/sql", "CREATE STREAM all_devices WITH (mqtt_topic = 'devices/#')").unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("overlaps stream telemetry"), "{body}");
}

#[test]
fn acknowledged_qos1_publishes_survive_kill_9() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    let mut publisher = tool("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mqtt/paho_client.py"))
        .args([&port(server.mqtt_address), "publisher", "durable/acked", "1000000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(publisher.stdout.take().unwrap()).lines();
    // Let a few hundred acknowledgements go by, then kill the server mid-stream.
    for _ in 0..300 {
        lines.next().expect("the publisher stopped early").unwrap();
    }
    server.kill_9();
    let acked: Vec<String> = lines
        .map_while(Result::ok)
        .chain(std::iter::empty())
        .filter_map(|line| line.strip_prefix("acked ").map(str::to_string))
        .collect();
    let _ = publisher.wait();
    let acked_total = 300 + acked.len();

    let server = dir.start(&[], &[]);
    let (status, body) = get(server.address, "/streams/durable?from=earliest&limit=10000");
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    let stored: Vec<&str> = body["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|record| record["value_text"].as_str().unwrap_or_else(|| record["value"].as_str().unwrap()))
        .collect();
    assert!(stored.len() >= acked_total, "{} stored, {acked_total} acknowledged", stored.len());
    for (i, value) in stored.iter().take(acked_total).enumerate() {
        assert_eq!(*value, format!("m{i}"), "acknowledged message {i} lost or out of order");
    }
}

#[test]
fn a_connection_publishing_on_follows_streams_tables_and_views_as_they_change() {
    // A connection remembers where its last topic went; every change to the catalog must
    // still count for its next publish.
    let (server, _dir) = server();
    let checks = paho_checks_with(server.mqtt_address, &["routes", &port(server.address)]);
    let codes: Vec<(String, u64)> = check(&checks, "route")
        .iter()
        .map(|check| (check["step"].as_str().unwrap().to_string(), check["code"].as_u64().unwrap()))
        .collect();
    let code = |step: &str| codes.iter().find(|(name, _)| name == step).map(|(_, code)| *code);
    let stored =
        ["new_stream", "again", "stream_dropped", "routed_stream", "table_dropped", "before_view", "before_view_again"];
    for step in stored {
        assert_eq!(code(step), Some(0), "{step} is stored: {codes:?}");
    }
    assert_eq!(code("table_created"), Some(0x90), "a table's topic takes no plain message: {codes:?}");
    assert_eq!(code("view_created"), Some(0x87), "a view's topic is read-only: {codes:?}");

    // Each stored message is in the stream its topic named when it was sent.
    let values = |stream: &str| {
        let (status, body) = get(server.address, &format!("/streams/{stream}?from=earliest"));
        assert_eq!(status, 200, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        body["records"].as_array().unwrap().iter().map(|record| record["value"].clone()).collect::<Vec<_>>()
    };
    assert_eq!(values("gadgets"), [json!(3)], "the stream made again after the drop, holding only what came after");
    assert_eq!(values("gz"), [json!(4), json!(6)]);
}

#[test]
fn retained_messages_are_sent_to_new_subscribers_and_survive_a_restart() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    let mqtt = server.mqtt_address;
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "home/kitchen/light", "-m", "on"]);
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "home/hall/light", "-m", "off"]);
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "home/hall/light", "-m", "dim"]);
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "home-other/x", "-m", "not under home"]);
    mosquitto_pub(mqtt, &["-q", "1", "-t", "home/kitchen/door", "-m", "not retained"]);
    // %r is the retain flag.
    let sub = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "home/+/light", "-F", "MSG %r %t %p"], 2);
    let mut got = sub_output(sub);
    got.sort();
    assert_eq!(got, ["1 home/hall/light dim", "1 home/kitchen/light on"], "the newest retained message per topic");

    // A clean stop and a start: still there. An empty retained message clears a topic.
    server.signal("TERM");
    assert!(server.wait_exit().success());
    let server = dir.start(&[], &[]);
    let mqtt = server.mqtt_address;
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "home/kitchen/light", "-n"]);
    let sub = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "home/#", "-F", "MSG %r %t %p"], 1);
    assert_eq!(sub_output(sub), ["1 home/hall/light dim"]);
    // Live messages reach existing subscribers without the flag (MQTT 3.1.1 rules).
    let sub = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "home/garage/light", "-F", "MSG %r %t %p"], 1);
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "home/garage/light", "-m", "on"]);
    assert_eq!(sub_output(sub), ["0 home/garage/light on"]);
}

/// A retained message is one record in its stream; the retained messages are derived from
/// those records and checkpointed about once a second. Messages acknowledged just before a
/// `kill -9`, after the last checkpoint, are found by reading the streams on from it.
#[test]
fn retained_messages_acknowledged_just_before_kill_9_are_still_retained() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    let mqtt = server.mqtt_address;
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "site/a/state", "-m", "a1"]);
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "site/b/state", "-m", "b1"]);
    // Long enough for a checkpoint to hold these.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "site/a/state", "-m", "a2"]);
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "site/b/state", "-n"]);
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "other/c/state", "-m", "c1"]);
    // Acknowledged (mosquitto_pub waits for the PUBACK), and at once:
    server.kill_9();

    let server = dir.start(&[], &[]);
    let mqtt = server.mqtt_address;
    let sub = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "#", "-F", "MSG %r %t %p"], 2);
    let mut got = sub_output(sub);
    got.sort();
    assert_eq!(got, ["1 other/c/state c1", "1 site/a/state a2"], "the newest per topic, b cleared");
}

#[test]
fn bench_mqtt_runs_end_to_end_and_a_sweep_reports_what_held() {
    let (report, dir) = common::bench_report(&[
        "mqtt",
        "--duration",
        "0.5",
        "--warmup",
        "0.2",
        "--rate",
        "500",
        "--subscribers",
        "2",
        "--sweep",
        "--idle-clients",
        "20",
    ]);
    assert_eq!(report["bench"], "mqtt");
    let sweep = report["sweep"].as_array().unwrap();
    assert!(!sweep.is_empty());
    // The sweep doubles the rate until one does not hold (or a cap).
    for (step, point) in sweep.iter().enumerate() {
        assert_eq!(point["rate"].as_f64().unwrap(), 500.0 * 2f64.powi(step as i32));
    }
    if report["max_rate_held"].is_number() {
        assert_eq!(report["delivered_pct"], 100.0, "{report}");
        assert_eq!(report["errors"], 0);
        assert_eq!(report["deliveries"], report["deliveries_expected"]);
        assert!(report["p50_us"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(report["idle_clients"], 20);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the server's data was removed");
}

#[test]
fn mqtt_over_websocket_and_tcp_see_each_other() {
    let (server, _dir) = server();
    let output = paho(server.address, &["websocket", &port(server.mqtt_address)]);
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    let facts: Value = serde_json::from_str(String::from_utf8_lossy(&output.stdout).trim()).unwrap();
    let both = serde_json::json!([["web/from-tcp", "hello browser"], ["web/from-ws", "hello device"]]);
    assert_eq!(facts["ws_got"], both);
    assert_eq!(facts["tcp_got"], both);
    // A plain GET is not an upgrade: a clear refusal, in HTTP.
    let (status, body) = get(server.address, "/mqtt");
    assert_eq!(status, 400);
    assert!(body.contains("not_websocket"), "{body}");
}

#[test]
fn shared_subscriptions_balance_messages_across_members() {
    let (server, _dir) = server();
    let checks = paho_checks(server.mqtt_address, "shared");
    let shared = check(&checks, "shared")[0];
    let per_member: Vec<u64> = shared["per_member"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect();
    assert_eq!(per_member.iter().sum::<u64>(), 40, "each message to exactly one member: {shared}");
    assert!(per_member.iter().all(|&n| n > 0), "both members got work: {shared}");
    let mut expected: Vec<String> = (0..40).map(|i| format!("job{i}")).collect();
    expected.sort();
    assert_eq!(shared["payloads"], serde_json::json!(expected));
    assert_eq!(shared["watcher"], 40, "a plain subscription still gets everything");
    assert_eq!(check(&checks, "shared_after_leave")[0]["got"], 10);
}

fn expected_inbox(count: usize) -> Value {
    let mut payloads: Vec<String> = (0..count).map(|i| format!("msg{i}")).collect();
    payloads.sort();
    serde_json::json!(payloads)
}

#[test]
fn persistent_sessions_keep_subscriptions_and_messages_across_reconnects() {
    let (server, _dir) = server();
    let mqtt = server.mqtt_address;
    for (client, protocol) in [("keeper-v311", "v311"), ("keeper-v5", "v5")] {
        let checks = paho_checks_with(mqtt, &["session_subscribe", client, protocol]);
        assert_eq!(check(&checks, "session_subscribed")[0]["present"], false, "{client}: a new session");
    }
    paho_checks_with(mqtt, &["session_publish", "12"]);
    for (client, protocol) in [("keeper-v311", "v311"), ("keeper-v5", "v5")] {
        let checks = paho_checks_with(mqtt, &["session_resume", client, protocol, "12"]);
        let resumed = check(&checks, "session_resumed")[0];
        assert_eq!(resumed["present"], true, "{client}: {resumed}");
        assert_eq!(resumed["payloads"], expected_inbox(12), "{client}: what came while away, once");
        // Acknowledged: a second reconnect brings nothing again.
        let checks = paho_checks_with(mqtt, &["session_resume", client, protocol, "0"]);
        let again = check(&checks, "session_resumed")[0];
        assert_eq!((again["present"].clone(), again["payloads"].clone()), (Value::Bool(true), serde_json::json!([])));
    }
    // A clean session ends the stored one.
    let checks = paho_checks_with(mqtt, &["session_clean", "keeper-v311"]);
    assert_eq!(check(&checks, "session_clean")[0]["present"], false);
    paho_checks_with(mqtt, &["session_publish", "3"]);
    let checks = paho_checks_with(mqtt, &["session_resume", "keeper-v311", "v311", "0"]);
    let after = check(&checks, "session_resumed")[0];
    assert_eq!((after["present"].clone(), after["payloads"].clone()), (Value::Bool(false), serde_json::json!([])));
}

#[test]
fn a_persistent_session_gets_every_acknowledged_message_after_kill_9() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    paho_checks_with(server.mqtt_address, &["session_subscribe", "survivor", "v311"]);
    paho_checks_with(server.mqtt_address, &["session_publish", "30"]);
    server.kill_9();
    let server = dir.start(&[], &[]);
    let checks = paho_checks_with(server.mqtt_address, &["session_resume", "survivor", "v311", "30"]);
    let resumed = check(&checks, "session_resumed")[0];
    assert_eq!(resumed["present"], true, "the session survived: {resumed}");
    assert_eq!(resumed["payloads"], expected_inbox(30), "every PUBACKed message, once");
}

#[test]
fn qos2_messages_are_stored_and_delivered_exactly_once_across_kill_9() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    let count = 400;
    let mut client = tool("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/mqtt/paho_client.py"))
        .args([port(server.mqtt_address), "exactly_once_crash".into(), count.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
    let line = lines.next().expect("the scenario ended early").unwrap();
    assert!(line.contains("kill_me"), "{line}");
    // Mid-stream: messages are being stored, acknowledged, delivered and released.
    server.kill_9();
    let server = dir.start(&[], &[]);
    writeln!(client.stdin.as_mut().unwrap(), "{}", server.mqtt_address.port()).unwrap();
    let output = client.wait_with_output().unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(output.status.success(), "the scenario failed: {}", String::from_utf8_lossy(&output.stderr));
    let result: Value = serde_json::from_str(rest.last().expect("a result line")).unwrap();
    let received: Vec<String> =
        result["payloads"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()).collect();

    // Stored once: the stream holds each message one time.
    let (status, body) = get(server.address, &format!("/streams/exact?from=earliest&limit={}", count * 2));
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    let stored: Vec<String> =
        body["records"].as_array().unwrap().iter().map(|r| r["value_text"].as_str().unwrap().to_string()).collect();
    let (stored_twice, stored_missing) = compared(&stored, count);
    let (received_twice, received_missing) = compared(&received, count);
    assert!(
        stored_twice.is_empty() && stored_missing.is_empty(),
        "stored twice: {stored_twice:?}, never stored: {stored_missing:?}"
    );
    assert!(
        received_twice.is_empty() && received_missing.is_empty(),
        "delivered twice: {received_twice:?}, never delivered: {received_missing:?}"
    );
}

/// Which of `e0`…`e{count-1}` occur more than once in `payloads`, and which never.
fn compared(payloads: &[String], count: usize) -> (Vec<String>, Vec<String>) {
    let mut seen = std::collections::BTreeMap::<&str, usize>::new();
    for payload in payloads {
        *seen.entry(payload.as_str()).or_default() += 1;
    }
    let expected: Vec<String> = (0..count).map(|i| format!("e{i}")).collect();
    let twice = seen.iter().filter(|(_, n)| **n > 1).map(|(p, _)| p.to_string()).collect();
    let missing = expected.into_iter().filter(|p| !seen.contains_key(p.as_str())).collect();
    (twice, missing)
}

#[test]
fn unacknowledged_messages_come_again_flagged_dup() {
    let (server, _dir) = server();
    let checks = paho_checks(server.mqtt_address, "session_unacked");
    let unacked = check(&checks, "unacked")[0];
    assert_eq!(unacked["present"], true);
    assert_eq!(unacked["first_dup"], serde_json::json!([false, false, false, false]));
    let second = serde_json::json!([["chore0", true], ["chore1", true], ["chore2", true], ["chore3", true]]);
    assert_eq!(unacked["second"], second, "the same messages, once each, flagged DUP: {unacked}");
}

#[test]
fn retained_messages_on_a_table_topic_write_rows_and_subscribers_get_rows() {
    let (server, _dir) = server();
    let mqtt = server.mqtt_address;
    sql(server.address, "CREATE TABLE devices (id TEXT PRIMARY KEY, state TEXT)");
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "devices/d1", "-m", r#"{"state":"on"}"#]);
    let (status, row) = get(server.address, "/tables/devices/d1");
    assert_eq!((status, row.as_str()), (200, r#"{"id":"d1","state":"on"}"#), "the retained message wrote the row");

    // A subscriber to the table gets its rows as retained messages, then every change.
    let sub = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "devices/#", "-F", "MSG %r %t %p"], 4);
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "devices/d2", "-m", r#"{"state":"off"}"#]);
    let (status, _) = common::request(server.address, "PUT", "/tables/devices/d3", r#"{"state":"idle"}"#).unwrap();
    assert_eq!(status, 201);
    mosquitto_pub(mqtt, &["-q", "1", "-r", "-t", "devices/d1", "-n"]);
    assert_eq!(
        sub_output(sub),
        [
            r#"1 devices/d1 {"id":"d1","state":"on"}"#,
            r#"0 devices/d2 {"id":"d2","state":"off"}"#,
            r#"0 devices/d3 {"id":"d3","state":"idle"}"#,
            "0 devices/d1 ",
        ]
    );
    assert_eq!(get(server.address, "/tables/devices/d1").0, 404, "an empty retained message deleted the row");

    // Rows are JSON objects; and a table takes no plain (non-retained) messages.
    let (_, said) = mosquitto_pub_unchecked(mqtt, &["-V", "mqttv5", "-q", "1", "-r", "-t", "devices/d4", "-m", "on"]);
    assert!(said.contains("JSON object"), "{said}");
    let (_, said) = mosquitto_pub_unchecked(mqtt, &["-V", "mqttv5", "-q", "1", "-t", "devices/d4", "-m", "{}"]);
    assert!(said.contains("is a table"), "{said}");
    assert_eq!(get(server.address, "/tables/devices/d4").0, 404);
}

#[test]
fn v5_no_local_will_delay_and_ending_a_session_at_disconnect() {
    let (server, _dir) = server();
    let checks = paho_checks(server.mqtt_address, "v5_more");
    assert_eq!(check(&checks, "no_local")[0]["topics"], serde_json::json!(["chat/theirs"]), "not its own message");
    assert_eq!(
        check(&checks, "will_delay")[0]["topics"],
        serde_json::json!(["gone/stays-away"]),
        "a client back within its will delay sends no will"
    );
    assert_eq!(check(&checks, "session_ended")[0]["present"], false);
}

/// MQTT 5 counts a QoS 2 publish against the server's receive maximum until the PUBCOMP that
/// ends its exchange, not until its PUBREC: a client holding more unreleased than that gets
/// DISCONNECT 0x93 (receive maximum exceeded). Sent as raw bytes: paho keeps to the limit.
#[test]
fn unreleased_qos2_publishes_count_against_the_receive_maximum_until_pubcomp() {
    let (server, _dir) = server();
    let mut client = raw::RawClient::connect(server.mqtt_address, &raw::connect(true, "hoarder", true));
    let connack = client.expect(2);
    assert_eq!(connack.body[1], 0, "accepted: {connack:02x?}");
    let receive_maximum = raw::receive_maximum(&connack);
    assert!(receive_maximum < u16::MAX - 2, "a receive maximum is announced: {connack:02x?}");
    // As many QoS 2 publishes as the server takes at once, none released: each gets its PUBREC.
    let publishes: Vec<u8> = (1..=receive_maximum)
        .flat_map(|id| raw::publish_v5("quota/q2", 2, id, &[], format!("m{id}").as_bytes()))
        .collect();
    client.send(&publishes);
    for id in 1..=receive_maximum {
        let pubrec = client.expect(5);
        assert_eq!((raw::packet_id(&pubrec), raw::ack_reason(&pubrec)), (id, 0), "{pubrec:02x?}");
    }
    // Releasing one makes room for exactly one more.
    client.send(&raw::pubrel(1));
    let pubcomp = client.expect(7);
    assert_eq!(raw::packet_id(&pubcomp), 1);
    let next = receive_maximum + 1;
    client.send(&raw::publish_v5("quota/q2", 2, next, &[], b"fits"));
    let pubrec = client.expect(5);
    assert_eq!((raw::packet_id(&pubrec), raw::ack_reason(&pubrec)), (next, 0), "{pubrec:02x?}");
    // One over: DISCONNECT with reason 0x93, then the connection closes.
    client.send(&raw::publish_v5("quota/q2", 2, next + 1, &[], b"one too many"));
    client.expect_disconnect(0x93);
}

/// An empty client id cannot name a session that outlives the connection: MQTT 3.1.1 refuses
/// it with CONNACK 0x02 (identifier rejected), MQTT 5 with CONNACK 0x85 (client identifier
/// not valid). Either way the first packet the client gets is a CONNACK, not a DISCONNECT or
/// a closed socket.
#[test]
fn an_empty_client_id_with_a_persistent_session_is_refused_by_connack() {
    let (server, _dir) = server();
    let v311 = raw_exchange(server.mqtt_address, &raw::connect(false, "", false));
    assert_eq!(v311, [0x20, 0x02, 0x00, 0x02], "3.1.1: identifier rejected");
    let v5 = raw_exchange(server.mqtt_address, &raw::connect(true, "", false));
    assert_eq!(v5.first(), Some(&0x20), "5.0: a CONNACK first: {v5:02x?}");
    assert_eq!(v5.get(3), Some(&0x85), "5.0: client identifier not valid: {v5:02x?}");
    assert_eq!(v5.len(), 2 + usize::from(v5[1]), "5.0: the CONNACK and nothing after it: {v5:02x?}");
    // With a clean session an empty id is still welcome (and gets an id of its own).
    let v311 = raw_exchange(server.mqtt_address, &raw::connect(false, "", true));
    assert_eq!(v311, [0x20, 0x02, 0x00, 0x00]);
    // Any other CONNECT the codec refuses gets a 5.0 CONNACK naming why: here the reserved
    // connect flag is set, a protocol error (0x82).
    let mut reserved_flag = raw::connect(true, "flagged", true);
    reserved_flag[9] |= 0x01;
    let v5 = raw_exchange(server.mqtt_address, &reserved_flag);
    assert_eq!((v5.first(), v5.get(3)), (Some(&0x20), Some(&0x82)), "{v5:02x?}");
    assert_eq!(v5.len(), 2 + usize::from(v5[1]), "the CONNACK and nothing after it: {v5:02x?}");
}

/// A topic alias of 0 is not a malformed packet but an invalid topic alias: DISCONNECT 0x94.
#[test]
fn topic_alias_zero_is_refused_as_an_invalid_topic_alias() {
    let (server, _dir) = server();
    let mut client = raw::RawClient::connect(server.mqtt_address, &raw::connect(true, "aliaser", true));
    assert_eq!(client.expect(2).body[1], 0);
    // Property 0x23 (topic alias) with the value 0.
    client.send(&raw::publish_v5("alias/zero", 1, 1, &[0x23, 0x00, 0x00], b"m"));
    client.expect_disconnect(0x94);
}

/// Payload format, content type, response topic and correlation data reach MQTT 5
/// subscribers as published — live, as a retained message, and to a persistent session that
/// was away — and show as record headers over HTTP; an HTTP publish can set them too.
#[test]
fn request_response_properties_travel_with_the_message() {
    let (server, _dir) = server();
    let checks = paho_checks_with(server.mqtt_address, &["properties", &port(server.address)]);
    let expected = json!({
        "format": 1,
        "content_type": "application/json",
        "response_topic": "rpc/replies/caller-7",
        "correlation_hex": "0072657134322dff",
        "user_properties": [["trace", "t-1"]],
    });
    for via in ["live", "retained", "session"] {
        let got = check(&checks, "properties").into_iter().find(|check| check["via"] == via);
        let got = got.unwrap_or_else(|| panic!("no message {via}: {checks:?}"));
        for (name, value) in expected.as_object().unwrap() {
            assert_eq!(&got[name], value, "{via}: {name} in {got}");
        }
    }
    let from_http = check(&checks, "properties").into_iter().find(|check| check["via"] == "http").unwrap();
    assert_eq!(from_http["response_topic"], "rpc/replies/http", "{from_http}");
    assert_eq!(from_http["correlation_hex"], hex(b"from-http"), "{from_http}");
    assert_eq!(from_http["content_type"], "text/plain", "{from_http}");

    // Over HTTP: headers, the binary correlation data in base64.
    let (status, body) = get(server.address, "/streams/rpc?from=earliest");
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    let record = &body["records"][0];
    assert_eq!(record["headers"]["onehop-mqtt-payload-format"], "1", "{record}");
    assert_eq!(record["headers"]["onehop-mqtt-content-type"], "application/json", "{record}");
    assert_eq!(record["headers"]["onehop-mqtt-response-topic"], "rpc/replies/caller-7", "{record}");
    assert_eq!(record["headers_base64"]["onehop-mqtt-correlation-data"], "AHJlcTQyLf8=", "{record}");
    assert!(record["headers"].get("onehop-mqtt-correlation-data").is_none(), "not twice: {record}");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// `/devices/1` (an empty first level, common on devices) goes to the stream set by
/// `mqtt_empty_first_level_stream` (`root` unless set), and subscriptions find it there; `$`
/// topics stay reserved for the server: publishing to one is refused, subscribing is allowed
/// (and brings nothing yet).
#[test]
fn an_empty_first_level_goes_to_its_own_stream_and_dollar_topics_stay_reserved() {
    let (server, _dir) = server();
    let mqtt = server.mqtt_address;
    let devices = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "/devices/+", "-F", "MSG %t %p"], 1);
    let everything = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "#", "-F", "MSG %t %p"], 2);
    mosquitto_pub(mqtt, &["-q", "1", "-t", "/devices/1", "-m", "on"]);
    mosquitto_pub(mqtt, &["-q", "1", "-t", "devices/2", "-m", "not under /devices"]);
    assert_eq!(sub_output(devices), ["/devices/1 on"]);
    let mut got = sub_output(everything);
    got.sort();
    assert_eq!(got, ["/devices/1 on", "devices/2 not under /devices"]);
    let (status, body) = get(server.address, "/streams/root?from=earliest");
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["records"][0]["subject"], "/devices/1", "{body}");

    // $ topics: a publish is refused, with the reason; a subscription is granted.
    let (_, said) = mosquitto_pub_unchecked(mqtt, &["-V", "mqttv5", "-q", "1", "-t", "$SYS/broker/x", "-m", "m"]);
    assert!(said.contains("Topic Name invalid") && said.contains("reserved"), "{said}");
    let mut client = raw::RawClient::connect(mqtt, &raw::connect(true, "sys-watcher", true));
    assert_eq!(client.expect(2).body[1], 0);
    client.send(&raw::subscribe_v5(1, "$SYS/#", 1));
    let suback = client.expect(9);
    // Packet id, no properties, then the granted QoS.
    assert_eq!(suback.body, [0x00, 0x01, 0x00, 0x01], "granted QoS 1: {suback:02x?}");

    // The stream is a setting.
    let dir = DataDir::new();
    let server = dir.start(&[], &[("ONEHOP_MQTT_EMPTY_FIRST_LEVEL_STREAM", "leading-slash")]);
    mosquitto_pub(server.mqtt_address, &["-q", "1", "-t", "/x", "-m", "m"]);
    let (status, body) = get(server.address, "/streams/leading-slash?from=earliest");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"subject\":\"/x\""), "{body}");
    // A name no stream can have is refused at start, naming the setting.
    let output = common::onehop()
        .args(["serve", "--data-dir", dir.data_arg(), "--mqtt-empty-first-level-stream", "no spaces"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && said.contains("mqtt_empty_first_level_stream"), "{said}");
}

/// `mqtt_subscriptions` counts the subscriptions of connected clients: it goes back down
/// when a client leaves without unsubscribing, whether it says DISCONNECT or just vanishes.
#[test]
fn the_subscriptions_gauge_follows_clients_that_leave() {
    let (server, _dir) = server();
    let mqtt = server.mqtt_address;
    let sub = mosquitto_sub(mqtt, &["-d", "-q", "1", "-t", "gauge/a", "-t", "gauge/b", "-F", "MSG %t %p"], 1);
    let mut vanishing = raw::RawClient::connect(mqtt, &raw::connect(true, "vanishing", true));
    vanishing.expect(2);
    vanishing.send(&raw::subscribe_v5(1, "gauge/#", 1));
    vanishing.expect(9);
    assert_eq!(metric(server.address, "mqtt_subscriptions"), Some(3.0));
    mosquitto_pub(mqtt, &["-q", "1", "-t", "gauge/a", "-m", "bye"]);
    assert_eq!(sub_output(sub), ["gauge/a bye"], "it got its message and disconnected");
    drop(vanishing);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metric(server.address, "mqtt_connections") != Some(0.0) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(metric(server.address, "mqtt_connections"), Some(0.0));
    assert_eq!(metric(server.address, "mqtt_subscriptions"), Some(0.0), "no client, no subscription");
}

/// The value of the unlabelled series `name` in `/metrics`.
fn metric(address: SocketAddr, name: &str) -> Option<f64> {
    let (_, metrics) = get(address, "/metrics");
    metrics.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
