use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::common::{DataDir, get};

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
        ("a frame over the request limit", (64i32 << 20).to_be_bytes().to_vec()),
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
