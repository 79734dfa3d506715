//! mosquitto and paho clients: every QoS both ways, v5 properties, wills, shared
//! subscriptions, MQTT over WebSocket, MQTT ↔ HTTP, and the `bench mqtt` command.

use super::*;

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
