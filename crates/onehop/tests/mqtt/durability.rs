//! What survives kill -9 and restarts: acknowledged QoS 1/2 publishes, retained messages,
//! persistent sessions and redelivery flagged DUP.

use super::*;

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
