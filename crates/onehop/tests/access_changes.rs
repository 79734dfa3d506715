//! Access that changes under open connections, and what a user may claim, with real clients:
//! curl (an SSE subscription), mosquitto_sub and mosquitto_pub (3.1.1 and 5.0) and kcat. A
//! dropped token and a revoked grant end what is no longer allowed, in each protocol's own
//! words; an MQTT route may not capture another stream's topics, and a retained message is
//! read only with READ on the stream that stored it; a view's `late_stream` takes WRITE on it.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::{DataDir, Server, Spawned, curl, line_channel};

const ROOT: (&str, &str) = ("root", "root-pass");
/// How long a test waits for something that should come.
const PATIENCE: Duration = Duration::from_secs(20);

fn start(dir: &DataDir) -> Server {
    dir.start(&["--admin-user", ROOT.0], &[("ONEHOP_ADMIN_PASSWORD", ROOT.1)])
}

/// Runs SQL as `user`: the status and the answer.
fn sql_as(address: SocketAddr, user: (&str, &str), statements: &str) -> (u16, serde_json::Value) {
    let (status, body) = curl(address, "/sql", &["-u", &format!("{}:{}", user.0, user.1), "--data-binary", statements]);
    (status, serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}")))
}

fn sql(address: SocketAddr, statements: &str) -> serde_json::Value {
    let (status, answer) = sql_as(address, ROOT, statements);
    assert_eq!(status, 200, "{statements}: {answer}");
    answer
}

/// Publishes `value` to `stream` with `subject` as root.
fn publish(address: SocketAddr, stream: &str, subject: &str, value: &str) {
    let path = format!("/streams/{stream}?subject={subject}");
    let (status, body) = curl(address, &path, &["-u", "root:root-pass", "--data-binary", value]);
    assert_eq!(status, 200, "{body}");
}

/// Waits for a line containing `needle`; the lines before it are returned with it.
fn wait_for(lines: &Receiver<String>, needle: &str, what: &str) -> Vec<String> {
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => {
                let found = line.contains(needle);
                seen.push(line);
                if found {
                    return seen;
                }
            }
            Err(_) => panic!("{what}: no line with {needle:?} in {PATIENCE:?}; saw {seen:?}"),
        }
    }
}

/// Waits for `child` to exit; its exit code.
fn exited(child: &mut Child, what: &str) -> i32 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(Instant::now() < deadline, "{what} is still running after {PATIENCE:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An SSE subscription with curl; its output lines.
fn sse(address: SocketAddr, path: &str) -> (Spawned, Receiver<String>) {
    let mut child = Spawned(
        Command::new("curl")
            .args(["-s", "-N", "--max-time", "60", "-H", "Accept: text/event-stream"])
            .arg(format!("http://{address}{path}"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let lines = line_channel(child.0.stdout.take().unwrap());
    (child, lines)
}

/// mosquitto_sub as `user` with `password` on `topic`, version `version` (`mqttv311` or
/// `mqttv5`), printing each topic and payload; its output and error lines together.
fn mosquitto_sub(
    mqtt: SocketAddr,
    version: &str,
    user: &str,
    password: &str,
    topic: &str,
) -> (Spawned, Receiver<String>) {
    let mut child = Spawned(
        Command::new("stdbuf")
            .args(["-oL", "-eL", "mosquitto_sub", "-h", "127.0.0.1", "-p", &mqtt.port().to_string(), "-V", version])
            .args(["-u", user, "-P", password, "-t", topic, "-v", "-q", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let lines = line_channel(child.0.stdout.take().unwrap());
    let errors = line_channel(child.0.stderr.take().unwrap());
    // One channel: the error lines forwarded after the output ones.
    let (sender, merged) = std::sync::mpsc::channel();
    let forward = |from: Receiver<String>, to: std::sync::mpsc::Sender<String>| {
        std::thread::spawn(move || {
            while let Ok(line) = from.recv() {
                if to.send(line).is_err() {
                    return;
                }
            }
        })
    };
    forward(lines, sender.clone());
    forward(errors, sender);
    (child, merged)
}

/// The values stored in `stream`, read as root.
fn stored(address: SocketAddr, stream: &str) -> Vec<serde_json::Value> {
    common::stored_as(address, stream, ROOT)
}

/// An MQTT 5 subscriber with paho (PyPI) as `user` with `password` on `topic`: prints
/// `subscribed`, then `message <topic> <payload>` per message, and `disconnected <reason code>`
/// when the server ends the connection.
fn paho_subscriber(mqtt: SocketAddr, user: &str, password: &str, topic: &str) -> (Spawned, Receiver<String>) {
    const SCRIPT: &str = r#"
import sys, paho.mqtt.client as mqtt
port, user, password, topic = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="revoked-" + user, protocol=mqtt.MQTTv5)
c.username_pw_set(user, password)
def on_connect(client, userdata, flags, reason_code, properties):
    client.subscribe(topic, qos=1)
def on_subscribe(client, userdata, mid, reason_codes, properties):
    print("subscribed", [int(code.value) for code in reason_codes], flush=True)
def on_message(client, userdata, message):
    print("message", message.topic, message.payload.decode(), flush=True)
def on_disconnect(client, userdata, flags, reason_code, properties):
    print("disconnected", int(reason_code.value), flush=True)
    client.disconnect()
    sys.exit(0)
c.on_connect, c.on_subscribe, c.on_message, c.on_disconnect = on_connect, on_subscribe, on_message, on_disconnect
c.connect("127.0.0.1", port)
c.loop_forever(retry_first_connection=False)
"#;
    let mut child = Spawned(
        Command::new("python3")
            .args(["-c", SCRIPT, &mqtt.port().to_string(), user, password, topic])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let lines = line_channel(child.0.stdout.take().unwrap());
    wait_for(&lines, "subscribed [1]", "the paho subscriber's SUBACK");
    (child, lines)
}

/// Publishes numbered `ready-N` records to `stream` until each of `receivers` has seen one:
/// every subscriber is then in, whenever its subscription took effect.
fn until_received(address: SocketAddr, stream: &str, receivers: &[(&Receiver<String>, &str)]) {
    for (receiver, what) in receivers {
        let deadline = Instant::now() + PATIENCE;
        let mut n = 0;
        'published: loop {
            n += 1;
            publish(address, stream, &format!("{stream}/ready"), &format!("\"ready-{n}\""));
            let until = Instant::now() + Duration::from_millis(500);
            while let Ok(line) = receiver.recv_timeout(until.saturating_duration_since(Instant::now())) {
                if line.contains("ready-") {
                    break 'published;
                }
            }
            assert!(Instant::now() < deadline, "{what} received nothing in {PATIENCE:?}");
        }
    }
}

#[test]
fn a_dropped_token_ends_its_subscriptions_publishers_and_fetches() {
    let dir = DataDir::new();
    let server = start(&dir);
    let (address, mqtt) = (server.address, server.mqtt_address);
    let kafka = server.kafka_address.expect("a Kafka listener").to_string();
    let answer = sql(
        address,
        "CREATE USER alice PASSWORD 'alice-pass'; CREATE STREAM orders; \
         GRANT READ ON STREAM orders TO alice; GRANT WRITE ON STREAM orders TO alice; \
         CREATE TOKEN FOR alice VALID FOR '1h'",
    );
    let token = answer["results"][4]["rows"][0][2].as_str().unwrap().to_string();
    let token_id = answer["results"][4]["rows"][0][0].as_str().unwrap().to_string();

    // Alice, by her token: an SSE subscription, an MQTT 5 (paho) and an MQTT 3.1.1
    // (mosquitto_sub) subscriber, a long-lived MQTT publisher (mosquitto_pub -l publishes each
    // line of its input), and a Kafka consumer (kcat).
    let (_sse, events) = sse(address, &format!("/streams/orders?from=earliest&access_token={token}"));
    let (mut paho, received5) = paho_subscriber(mqtt, "alice", &token, "orders/#");
    let (mut sub3, received3) = mosquitto_sub(mqtt, "mqttv311", "alice", &token, "orders/#");
    let mut publisher = Spawned(
        Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &mqtt.port().to_string(), "-V", "mqttv5", "-q", "1"])
            .args(["-u", "alice", "-P", &token, "-t", "orders/from-alice", "-l"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut consumer = Spawned(
        Command::new("stdbuf")
            .args(["-oL", "-eL", "kcat", "-C", "-b", &kafka, "-t", "orders", "-o", "beginning", "-u"])
            .args(["-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanisms=PLAIN"])
            .args(["-X", "sasl.username=alice", "-X", &format!("sasl.password={token}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let fetched = line_channel(consumer.0.stdout.take().unwrap());
    let kafka_errors = line_channel(consumer.0.stderr.take().unwrap());
    until_received(
        address,
        "orders",
        &[(&events, "the SSE subscription"), (&received5, "paho"), (&received3, "mosquitto_sub"), (&fetched, "kcat")],
    );
    let mut input = publisher.0.stdin.take().unwrap();
    writeln!(input, "\"from alice before\"").unwrap();
    let deadline = Instant::now() + PATIENCE;
    while !stored(address, "orders").contains(&serde_json::json!("from alice before")) {
        assert!(Instant::now() < deadline, "alice's MQTT publish was not stored");
        std::thread::sleep(Duration::from_millis(50));
    }

    sql(address, &format!("DROP TOKEN '{token_id}'"));

    // The SSE subscription ends with an error event saying why.
    wait_for(&events, "event: error", "the SSE subscription's end");
    let data = wait_for(&events, "data:", "the error event's data");
    assert!(data.last().unwrap().contains("unauthenticated"), "{data:?}");
    assert!(data.last().unwrap().contains("token"), "{data:?}");
    // MQTT 5 is told with DISCONNECT 0x87 (not authorized); 3.1.1 has no reason to give: its
    // connection is closed, and its reconnection with the token refused.
    wait_for(&received5, "disconnected 135", "paho's DISCONNECT");
    exited(&mut paho.0, "paho");
    let said = wait_for(&received3, "bad user name or password", "mosquitto_sub (3.1.1) reconnecting");
    assert_ne!(exited(&mut sub3.0, "mosquitto_sub (3.1.1)"), 0, "{said:?}");
    // The Kafka connection is closed (logging in again with the token is refused, when
    // librdkafka tries before it gives up).
    wait_for(&kafka_errors, "Disconnected", "kcat");
    exited(&mut consumer.0, "kcat");
    // A publish with the dropped token is refused and never stored.
    let _ = writeln!(input, "\"from alice after\"");
    drop(input);
    exited(&mut publisher.0, "mosquitto_pub");
    publish(address, "orders", "orders/last", "\"last\"");
    let stored = stored(address, "orders");
    assert_eq!(stored.last(), Some(&serde_json::json!("last")));
    assert!(!stored.contains(&serde_json::json!("from alice after")), "{stored:?}");
    let (status, _) = curl(address, &format!("/streams/orders?access_token={token}"), &[]);
    assert_eq!(status, 401);
}

#[test]
fn a_revoked_grant_ends_the_subscriptions_that_needed_it() {
    let dir = DataDir::new();
    let server = start(&dir);
    let (address, mqtt) = (server.address, server.mqtt_address);
    sql(
        address,
        "CREATE USER viewer PASSWORD 'viewer-pass'; CREATE STREAM orders; CREATE STREAM other; \
         GRANT READ ON STREAM orders TO viewer; GRANT READ ON STREAM other TO viewer",
    );
    let (_sse, events) = {
        let mut child = Spawned(
            Command::new("curl")
                .args(["-s", "-N", "--max-time", "60", "-H", "Accept: text/event-stream", "-u", "viewer:viewer-pass"])
                .arg(format!("http://{address}/streams/orders?from=earliest"))
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
        );
        let lines = line_channel(child.0.stdout.take().unwrap());
        (child, lines)
    };
    let (mut orders, received_orders) = paho_subscriber(mqtt, "viewer", "viewer-pass", "orders/#");
    let (mut other, received_other) = mosquitto_sub(mqtt, "mqttv5", "viewer", "viewer-pass", "other/#");
    until_received(address, "orders", &[(&events, "the SSE subscription"), (&received_orders, "paho on orders")]);
    until_received(address, "other", &[(&received_other, "mosquitto_sub on other")]);

    sql(address, "REVOKE READ ON STREAM orders FROM viewer");
    wait_for(&events, "event: error", "the SSE subscription's end");
    let data = wait_for(&events, "data:", "the error event's data");
    assert!(data.last().unwrap().contains("forbidden"), "{data:?}");
    wait_for(&received_orders, "disconnected 135", "paho's DISCONNECT");
    exited(&mut orders.0, "paho");
    // Another connection, whose subscription the revoke does not touch, goes on.
    publish(address, "other", "other/2", "\"other after\"");
    wait_for(&received_other, "other after", "the other subscription");
    assert!(other.0.try_wait().unwrap().is_none(), "the other subscriber is still connected");
    // And a new subscription to orders is refused.
    let (status, _) = curl(address, "/streams/orders", &["-u", "viewer:viewer-pass"]);
    assert_eq!(status, 403);
}

#[test]
fn an_mqtt_route_may_not_capture_another_streams_topics_nor_its_retained_messages() {
    let dir = DataDir::new();
    let server = start(&dir);
    let (address, mqtt) = (server.address, server.mqtt_address);
    let port = mqtt.port().to_string();
    sql(
        address,
        "CREATE USER alice PASSWORD 'alice-pass'; CREATE STREAM b; \
         GRANT ADMIN ON STREAM 'alice_*' TO alice",
    );
    let alice = ("alice", "alice-pass");
    // A retained message in stream b.
    let output = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &port, "-u", ROOT.0, "-P", ROOT.1, "-q", "1", "-r"])
        .args(["-t", "b/x", "-m", "b's secret"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));

    // A route over b's topics, or over every stream's, takes ADMIN on them.
    for topic in ["b/#", "+/x", "#"] {
        let (status, answer) =
            sql_as(address, alice, &format!("CREATE STREAM alice_cap WITH (mqtt_topic = '{topic}')"));
        assert_eq!(status, 403, "{topic}: {answer}");
        assert_eq!(answer["error"]["code"], "forbidden", "{topic}: {answer}");
    }
    let (status, answer) = sql_as(address, alice, "CREATE STREAM alice_cap WITH (mqtt_topic = 'alice_zone/#')");
    assert_eq!(status, 200, "a route under her own streams' names: {answer}");

    // Routed by a superuser, b's topics now go to alice's stream; the message b stored stays
    // b's: alice, who may read only her own streams, does not get it.
    sql(address, "CREATE STREAM alice_routed WITH (mqtt_topic = 'b/#'); GRANT READ ON STREAM alice_routed TO alice");
    let (_subscriber, received) = mosquitto_sub(mqtt, "mqttv5", "alice", "alice-pass", "b/#");
    // A live message published after she subscribed: the first thing she receives. A retained
    // one would have come before it.
    let deadline = Instant::now() + PATIENCE;
    let first = loop {
        let output = Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port, "-u", ROOT.0, "-P", ROOT.1, "-q", "1"])
            .args(["-t", "b/y", "-m", "routed to alice"])
            .output()
            .unwrap();
        assert!(output.status.success());
        if let Ok(line) = received.recv_timeout(Duration::from_millis(500)) {
            break line;
        }
        assert!(Instant::now() < deadline, "alice received nothing");
    };
    assert_eq!(first, "b/y routed to alice", "the retained message of stream b did not reach alice");
}

#[test]
fn a_views_late_stream_takes_write_on_it() {
    let dir = DataDir::new();
    let server = start(&dir);
    let address = server.address;
    sql(
        address,
        "CREATE USER analyst PASSWORD 'analyst-pass'; CREATE STREAM clicks; CREATE STREAM b; \
         GRANT READ ON STREAM clicks TO analyst; GRANT ADMIN ON VIEW 'analyst_*' TO analyst",
    );
    let analyst = ("analyst", "analyst-pass");
    let view = "CREATE VIEW analyst_counts WITH (late_stream = 'b') AS \
                SELECT page, COUNT(*) AS n FROM TUMBLE(clicks, INTERVAL '1' MINUTE) GROUP BY page";
    let (status, answer) = sql_as(address, analyst, view);
    assert_eq!(status, 403, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("stream b"), "{answer}");
    sql(address, "GRANT WRITE ON STREAM b TO analyst");
    let (status, answer) = sql_as(address, analyst, view);
    assert_eq!(status, 200, "{answer}");
}

/// curl with `args` from the source address `from` (a loopback address), to the server at
/// 127.0.0.1: the status and body.
fn curl_from(from: &str, address: SocketAddr, path: &str, args: &[&str]) -> (u16, String) {
    curl(address, path, &[&["--interface", from][..], args].concat())
}

#[test]
fn password_guesses_back_off_per_address_and_the_right_password_from_another_still_logs_in() {
    let dir = DataDir::new();
    let server = start(&dir);
    let address = server.address;
    sql(address, "CREATE USER alice PASSWORD 'alice-pass'; CREATE STREAM orders; GRANT READ ON STREAM orders TO alice");
    let mut statuses = Vec::new();
    for n in 0..10 {
        let (status, body) = curl(address, "/streams/orders", &["-u", &format!("alice:wrong-{n}")]);
        statuses.push(status);
        if status == 429 {
            assert!(body.contains("login_throttled"), "{body}");
        }
    }
    // The first guesses are checked (401); then they are refused unchecked (429).
    assert_eq!(&statuses[..6], &[401; 6], "{statuses:?}");
    assert_eq!(&statuses[6..], &[429; 4], "{statuses:?}");
    let output = Command::new("curl")
        .args(["-s", "-i", "-u", "alice:alice-pass"])
        .arg(format!("http://{address}/streams/orders"))
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&output.stdout).to_lowercase();
    assert!(answer.starts_with("http/1.1 429") && answer.contains("retry-after: "), "{answer}");
    // From another address the right password logs in at once.
    let (status, body) = curl_from("127.0.0.2", address, "/streams/orders", &["-u", "alice:alice-pass"]);
    assert_eq!(status, 200, "{body}");
    let (_, metrics) = curl(address, "/metrics", &["-u", "root:root-pass"]);
    let throttled = metrics
        .lines()
        .find_map(|line| line.strip_prefix("auth_logins_throttled_total "))
        .and_then(|value| value.trim().parse::<u64>().ok());
    assert!(throttled.is_some_and(|n| n >= 5), "{metrics}");
}

#[test]
fn listings_grants_tokens_and_mqtt_subscriptions_have_their_edges_closed() {
    let dir = DataDir::new();
    let server =
        dir.start(&["--admin-user", ROOT.0, "--mqtt-subscriptions-max", "3"], &[("ONEHOP_ADMIN_PASSWORD", ROOT.1)]);
    let (address, mqtt) = (server.address, server.mqtt_address);
    sql(
        address,
        "CREATE USER alice PASSWORD 'alice-pass'; CREATE STREAM orders; \
         CREATE TABLE accounts (id TEXT PRIMARY KEY); GRANT READ ON STREAM orders TO alice",
    );
    // A listing without credentials is asked for them, as every other statement is.
    let (status, body) = curl(address, "/sql", &["--data-binary", "SHOW STREAMS"]);
    assert_eq!(status, 401, "{body}");
    // SHOW GRANTS without FOR is the caller's own.
    let (status, answer) = sql_as(address, ("alice", "alice-pass"), "SHOW GRANTS");
    assert_eq!(status, 200, "{answer}");
    let rows = answer["results"][0]["rows"].as_array().unwrap();
    assert!(!rows.is_empty() && rows.iter().all(|row| row[0] == "alice"), "{answer}");
    // A token made without VALID FOR expires, in 30 days.
    let answer = sql(address, "CREATE TOKEN FOR alice");
    let expires_ms = answer["results"][0]["rows"][0][3].as_u64().expect("an expiry");
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let days = (expires_ms - now_ms) as f64 / 86_400_000.0;
    assert!((29.9..=30.0).contains(&days), "{days} days: {answer}");
    // A grant on a table named as a stream is refused, naming what it is.
    let (status, answer) = sql_as(address, ROOT, "GRANT READ ON STREAM accounts TO alice");
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("ON TABLE accounts"), "{answer}");
    // One MQTT connection holds at most 3 topic filters: the fourth gets SUBACK 0x97.
    const SCRIPT: &str = r#"
import sys, threading, paho.mqtt.client as mqtt
done = threading.Event()
c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="many", protocol=mqtt.MQTTv5)
c.username_pw_set("root", "root-pass")
def on_connect(client, userdata, flags, reason_code, properties):
    client.subscribe([("a/1", 1), ("a/2", 1), ("a/3", 1), ("a/4", 1)])
def on_subscribe(client, userdata, mid, reason_codes, properties):
    print([int(code.value) for code in reason_codes], flush=True)
    done.set()
c.on_connect, c.on_subscribe = on_connect, on_subscribe
c.connect("127.0.0.1", int(sys.argv[1]))
c.loop_start()
ok = done.wait(20)
c.disconnect()
sys.exit(0 if ok else 1)
"#;
    let output = Command::new("python3").args(["-c", SCRIPT, &mqtt.port().to_string()]).output().unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{said}{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(said.trim(), "[1, 1, 1, 151]");
}
