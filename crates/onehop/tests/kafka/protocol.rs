use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::common::{DataDir, get, sql, sql_as};

/// A request frame: size, api key, version, correlation id, client id (a v1 header), body.
fn frame(api_key: i16, version: i16, correlation_id: i32, body: &[u8]) -> Vec<u8> {
    let mut request = Vec::new();
    request.extend_from_slice(&api_key.to_be_bytes());
    request.extend_from_slice(&version.to_be_bytes());
    request.extend_from_slice(&correlation_id.to_be_bytes());
    request.extend_from_slice(&4i16.to_be_bytes());
    request.extend_from_slice(b"test");
    request.extend_from_slice(body);
    let mut framed = (request.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(&request);
    framed
}

fn connect(kafka: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(kafka).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
}

/// Reads one response frame: its correlation id and the rest.
fn response(stream: &mut TcpStream) -> (i32, Vec<u8>) {
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).unwrap();
    let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut body).unwrap();
    (i32::from_be_bytes(body[..4].try_into().unwrap()), body[4..].to_vec())
}

/// Whether the server closed `stream` (end of stream or reset, not a timeout).
fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(error) => !matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
    }
}

/// ApiVersions v0 answers error 0 and lists Produce (0) and Fetch (1); a version newer than
/// served is answered in v0 with UNSUPPORTED_VERSION (35) and the same list, as a client needs
/// to fall back. Malformed, oversized and unknown requests close their connection and nothing
/// else: a second connection is answered throughout, and the metric counts each.
#[test]
fn api_versions_answer_and_bad_frames_close_only_their_connection() {
    let dir = DataDir::new();
    let server = dir.start(&["--batch-bytes-max", "1MiB"], &[]);
    let kafka = server.kafka_address.unwrap();
    let mut good = connect(kafka);
    good.write_all(&frame(18, 0, 7, &[])).unwrap();
    let (id, body) = response(&mut good);
    assert_eq!(id, 7);
    assert_eq!(&body[..2], &[0, 0], "no error");
    let count = i32::from_be_bytes(body[2..6].try_into().unwrap()) as usize;
    let keys: Vec<i16> =
        (0..count).map(|i| i16::from_be_bytes(body[6 + i * 6..8 + i * 6].try_into().unwrap())).collect();
    assert!(keys.contains(&0) && keys.contains(&1) && keys.contains(&18), "{keys:?}");

    let mut newer = connect(kafka);
    newer.write_all(&frame(18, 99, 8, &[])).unwrap();
    let (id, body) = response(&mut newer);
    assert_eq!(id, 8);
    assert_eq!(i16::from_be_bytes(body[..2].try_into().unwrap()), 35, "UNSUPPORTED_VERSION");

    let bad: [(&str, Vec<u8>); 7] = [
        ("an unknown API", frame(4242, 0, 1, &[])),
        ("an unserved version", frame(0, 2, 1, &[])),
        ("a body that does not decode", frame(3, 1, 1, &[0, 0, 0, 5])),
        ("a frame too short for a header", vec![0, 0, 0, 2, 0, 18]),
        // Past Kafka's 100 MiB socket.request.max.bytes, which onehop takes too.
        ("a frame over the request limit", (128i32 << 20).to_be_bytes().to_vec()),
        // Tiny requests declaring arrays of 2^31 groups and 2^29 topics: the codec reserves
        // for the count before reading an element, and the server must stay up.
        ("an array of 2^31 elements", frame(15, 0, 1, &[0x7f, 0xff, 0xff, 0xff])),
        ("an array of 2^29 elements", frame(3, 0, 1, &[0x20, 0, 0, 0])),
    ];
    for (what, bytes) in &bad {
        let mut stream = connect(kafka);
        stream.write_all(bytes).unwrap();
        assert!(closed(&mut stream), "{what}: the connection stays open");
        good.write_all(&frame(18, 0, 9, &[])).unwrap();
        assert_eq!(response(&mut good).0, 9, "{what}: the other connection is still answered");
    }
    let (_, metrics) = get(server.address, "/metrics");
    assert!(metrics.contains("kafka_protocol_errors_total 7"), "{metrics}");
}

/// Once users exist, a connection that does not log in within kafka_authentication_timeout_s
/// is closed, and counted: sockets that never authenticate cannot hold every connection slot
/// and keep a real client out.
#[test]
fn connections_that_never_log_in_are_closed_and_free_their_slots() {
    let dir = DataDir::new();
    let server = dir.start(
        &["--admin-user", "root", "--connections-max", "3", "--kafka-authentication-timeout-s", "1"],
        &[("ONEHOP_ADMIN_PASSWORD", "root-pass")],
    );
    let kafka = server.kafka_address.unwrap();
    sql_as(server.address, ("root", "root-pass"), "CREATE STREAM orders");
    let mut idle: Vec<TcpStream> = (0..3).map(|_| connect(kafka)).collect();
    for stream in &mut idle {
        assert!(closed(stream), "an idle connection that never logged in stays open");
    }
    let metrics = crate::common::get_as(server.address, "/metrics", ("root", "root-pass"));
    assert!(metrics.contains("kafka_authentication_timeouts_total 3"), "{metrics}");
    // The slots are free: a client that logs in is served.
    let output = std::process::Command::new("timeout")
        .args(["30", "kcat", "-b", &kafka.to_string(), "-X", "security.protocol=SASL_PLAINTEXT"])
        .args(["-X", "sasl.mechanisms=PLAIN", "-X", "sasl.username=root", "-X", "sasl.password=root-pass"])
        .args(["-P", "-t", "orders"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut kcat| {
            kcat.stdin.take().unwrap().write_all(b"after the idle ones\n")?;
            kcat.wait_with_output()
        })
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

/// A Produce request carrying one batch per partition for 24 partitions, each batch under the
/// batch limit and the whole past 20 MiB, is taken whole, as Kafka takes requests up to 100 MiB.
/// kafkajs's `sendBatch` puts what it is given for one broker into one Produce request.
#[test]
fn a_produce_request_of_many_batches_past_twenty_mib_is_taken() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let kafka = server.kafka_address.unwrap();
    sql(server.address, "CREATE STREAM big WITH (partitions = 24)");
    let script = r#"
const { Kafka, logLevel } = require('kafkajs');
const kafka = new Kafka({ brokers: [process.argv[1]], logLevel: logLevel.ERROR });
const producer = kafka.producer({ allowAutoTopicCreation: false });
(async () => {
  await producer.connect();
  const value = Buffer.alloc(900000, 'x');
  const messages = Array.from({ length: 24 }, (_, partition) => ({ partition, value }));
  const answer = await producer.sendBatch({ acks: -1, topicMessages: [{ topic: 'big', messages }] });
  console.log(JSON.stringify(answer.map((one) => one.partition)));
  await producer.disconnect();
})().catch((error) => { console.error(error); process.exit(1); });
"#;
    let kafkajs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/kafkajs");
    let output = std::process::Command::new("node")
        .args(["-e", script, &kafka.to_string()])
        .current_dir(&kafkajs)
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{said}");
    let (_, metrics) = get(server.address, "/metrics");
    assert!(metrics.contains("kafka_records_produced_total 24"), "{metrics}");
    assert!(metrics.contains("kafka_protocol_errors_total 0"), "no connection was closed: {metrics}");
}
