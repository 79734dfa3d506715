//! Where MQTT topics land: one stream per first level, declared topics, tables and views
//! followed as they change, retained rows on a table, and reserved `$` topics.

use super::*;

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
