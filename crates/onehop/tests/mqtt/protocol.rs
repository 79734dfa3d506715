//! Bad input and limits at the packet level: malformed and oversized packets, the receive
//! maximum, refused CONNECTs and topic aliases, and the gauges that follow clients.

use super::*;

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
/// a closed socket. A 5.0 session that ends with the connection (expiry 0) needs no name:
/// Clean Start 0 with an empty id is accepted then, and given an id, as paho's interop
/// suite expects.
#[test]
fn an_empty_client_id_with_a_persistent_session_is_refused_by_connack() {
    let (server, _dir) = server();
    let v311 = raw_exchange(server.mqtt_address, &raw::connect(false, "", false));
    assert_eq!(v311, [0x20, 0x02, 0x00, 0x02], "3.1.1: identifier rejected");
    let v5 = raw_exchange(server.mqtt_address, &raw::connect(true, "", false));
    assert_eq!((v5.first(), v5.get(3)), (Some(&0x20), Some(&0x00)), "5.0, expiry 0: accepted: {v5:02x?}");
    assert!(v5.windows(2).any(|pair| pair[0] == 0x12), "with an assigned client identifier: {v5:02x?}");
    let v5 = raw_exchange(server.mqtt_address, &raw::connect_v5_expiring("", false, 3600));
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
