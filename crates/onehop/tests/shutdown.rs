//! Stopping `onehop serve` with open subscriptions, as systemd or Kubernetes do: SIGTERM, and a
//! second signal for a server that takes too long. Real binary, real clients over loopback.
//!
//! Settings are given as environment variables: a server without them would start all the
//! same, and fail these tests on what it does, not on a flag it does not know.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{DataDir, get, publish_batch};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// An SSE subscription read line by line, chunked framing and all.
struct Sse {
    reader: BufReader<TcpStream>,
}

/// One event: its id, name and data.
#[derive(Debug)]
struct Event {
    id: Option<String>,
    name: String,
    data: Value,
}

impl Sse {
    fn open(address: SocketAddr, path: &str) -> Sse {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: test\r\nAccept: text/event-stream\r\n\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        assert!(line.contains(" 200 "), "{line}");
        while line != "\r\n" {
            line.clear();
            reader.read_line(&mut line).unwrap();
        }
        Sse { reader }
    }

    /// The next event, or `None` once the response has ended (its last chunk, or a close).
    /// Within 15 s: keep-alive comments do not count as an event.
    fn next(&mut self) -> Option<Event> {
        let deadline = Instant::now() + Duration::from_secs(15);
        let (mut id, mut name, mut line) = (None, String::from("message"), String::new());
        loop {
            assert!(Instant::now() < deadline, "no event within 15 s");
            line.clear();
            if self.reader.read_line(&mut line).unwrap() == 0 || line == "0\r\n" {
                return None;
            }
            if let Some(value) = line.strip_prefix("id: ") {
                id = Some(value.trim().to_string());
            } else if let Some(value) = line.strip_prefix("event: ") {
                name = value.trim().to_string();
            } else if let Some(data) = line.strip_prefix("data: ") {
                return Some(Event { id, name, data: serde_json::from_str(data.trim()).unwrap() });
            }
        }
    }
}

async fn receive(socket: &mut Socket) -> Message {
    tokio::time::timeout(Duration::from_secs(15), socket.next()).await.expect("a message within 15 s").unwrap().unwrap()
}

async fn receive_json(socket: &mut Socket) -> Value {
    match receive(socket).await {
        Message::Text(text) => serde_json::from_str(&text).unwrap(),
        other => panic!("expected a JSON message, got {other:?}"),
    }
}

/// The close frame's code, skipping anything before it.
async fn close_code(socket: &mut Socket) -> CloseCode {
    loop {
        match receive(socket).await {
            Message::Close(frame) => return frame.expect("a close code").code,
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("expected a close, got {other:?}"),
        }
    }
}

/// CONNECT, clean start, keep-alive 60 s, empty client id: 5.0 (no properties) or 3.1.1.
fn mqtt_connect(version: u8) -> Vec<u8> {
    let mut packet = vec![0x10, 0x0c, 0x00, 0x04, b'M', b'Q', b'T', b'T', version, 0x02, 0x00, 0x3c];
    if version == 5 {
        packet[1] += 1;
        packet.push(0x00);
    }
    packet.extend_from_slice(&[0x00, 0x00]);
    packet
}

/// A connected MQTT client over TCP, its CONNACK read.
fn mqtt_client(address: SocketAddr, version: u8) -> TcpStream {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    stream.write_all(&mqtt_connect(version)).unwrap();
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 0x20, "CONNACK");
    let mut rest = vec![0u8; usize::from(head[1])];
    stream.read_exact(&mut rest).unwrap();
    stream
}

/// A 5.0 DISCONNECT "server shutting down" (0x8B) at the start of `bytes`.
fn is_shutting_down(bytes: &[u8]) -> bool {
    bytes.first() == Some(&0xe0) && bytes.get(2) == Some(&0x8b)
}

#[test]
fn sigterm_ends_every_subscription_with_its_resume_id_and_exits() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[("ONEHOP_SHUTDOWN_TIMEOUT_S", "3")]);
    let address = server.address;
    assert!(publish_batch(address, "s", &[json!(0), json!(1), json!(2)]));

    let mut sse = Sse::open(address, "/streams/s?from=earliest");
    for offset in 0..3 {
        assert_eq!(sse.next().unwrap().id.as_deref(), Some(format!("0:{offset}").as_str()));
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (mut socket, mut mqtt_socket) = runtime.block_on(async {
        let (mut socket, _) =
            tokio_tungstenite::connect_async(format!("ws://{address}/streams/s?from=earliest")).await.unwrap();
        assert_eq!(receive_json(&mut socket).await["type"], "subscribed");
        for _ in 0..3 {
            assert_eq!(receive_json(&mut socket).await["type"], "record");
        }
        let command = json!({"op": "subscribe", "subscription": "live", "stream": "s"});
        socket.send(Message::Text(command.to_string().into())).await.unwrap();
        assert_eq!(receive_json(&mut socket).await["type"], "subscribed");

        let mut request = format!("ws://{address}/mqtt").into_client_request().unwrap();
        request.headers_mut().insert("sec-websocket-protocol", "mqtt".parse().unwrap());
        let (mut mqtt_socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
        mqtt_socket.send(Message::Binary(mqtt_connect(5).into())).await.unwrap();
        match receive(&mut mqtt_socket).await {
            Message::Binary(bytes) => assert_eq!(bytes[0], 0x20, "CONNACK"),
            other => panic!("expected a CONNACK, got {other:?}"),
        }
        (socket, mqtt_socket)
    });
    let mut mqtt_v5 = mqtt_client(server.mqtt_address, 5);
    let mut mqtt_v311 = mqtt_client(server.mqtt_address, 4);
    // A keep-alive connection between requests.
    let mut idle = TcpStream::connect(address).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut answer = [0u8; 1024];
    assert!(idle.read(&mut answer).unwrap() > 0);

    let signalled = Instant::now();
    server.signal("TERM");

    // SSE: a last event with the resume id, then the end of the response.
    let last = sse.next().expect("a last event");
    assert_eq!(last.name, "shutdown", "{last:?}");
    assert_eq!(last.id.as_deref(), Some("0:2"), "{last:?}");
    assert_eq!(last.data["resume_id"], "0:2", "{last:?}");
    assert!(sse.next().is_none(), "the response ends after the last event");

    runtime.block_on(async {
        // WebSocket: a last message per subscription with its resume id, then close 1001.
        let mut last = Vec::new();
        for _ in 0..2 {
            let message = receive_json(&mut socket).await;
            assert_eq!(message["type"], "shutdown", "{message}");
            let (subscription, id) = (message["subscription"].as_str(), message["id"].as_str());
            last.push((subscription.unwrap().to_string(), id.unwrap().to_string()));
        }
        last.sort();
        assert_eq!(last, [("live".to_string(), "0:2".to_string()), ("url".to_string(), "0:2".to_string())]);
        assert_eq!(close_code(&mut socket).await, CloseCode::Away);

        // MQTT over WebSocket: DISCONNECT "server shutting down", then close 1001.
        match receive(&mut mqtt_socket).await {
            Message::Binary(bytes) => assert!(is_shutting_down(&bytes), "{bytes:02x?}"),
            other => panic!("expected a DISCONNECT, got {other:?}"),
        }
        assert_eq!(close_code(&mut mqtt_socket).await, CloseCode::Away);
    });

    // MQTT over TCP: 5.0 is told why, 3.1.1 is closed.
    let mut said = Vec::new();
    let _ = mqtt_v5.read_to_end(&mut said);
    assert!(is_shutting_down(&said), "{said:02x?}");
    let mut said = Vec::new();
    let _ = mqtt_v311.read_to_end(&mut said);
    assert!(said.is_empty(), "{said:02x?}");
    // The idle HTTP connection is closed.
    let mut said = Vec::new();
    let _ = idle.read_to_end(&mut said);
    assert!(said.is_empty(), "{}", String::from_utf8_lossy(&said));

    let status = server.wait_exit();
    assert!(status.success(), "exit {status:?}; said:\n{}", server.seen.join("\n"));
    // A bound, not a speed: the shutdown timeout is 3 s.
    assert!(signalled.elapsed() < Duration::from_secs(13), "stopped {:?} after SIGTERM", signalled.elapsed());
    assert!(server.seen.iter().any(|line| line.contains("stopped cleanly")), "{}", server.seen.join("\n"));

    // Everything acknowledged is there after a restart.
    let server = dir.start(&[], &[]);
    let (status, body) = get(server.address, "/streams/s?from=earliest");
    assert_eq!(status, 200);
    let body: Value = serde_json::from_str(&body).unwrap();
    let values: Vec<&Value> = body["records"].as_array().unwrap().iter().map(|record| &record["value"]).collect();
    assert_eq!(values, [&json!(0), &json!(1), &json!(2)]);
}

#[test]
fn a_second_signal_exits_at_once_keeping_acknowledged_writes() {
    let dir = DataDir::new();
    // Long enough that only the second signal can end the wait for the stalled upload below.
    let settings = [("ONEHOP_SHUTDOWN_TIMEOUT_S", "120"), ("ONEHOP_HTTP_BODY_READ_TIMEOUT_S", "120")];
    let mut server = dir.start(&[], &settings);
    let values: Vec<Value> = (0..20).map(|value| json!(value)).collect();
    assert!(publish_batch(server.address, "s", &values), "acknowledged");
    // A request in flight that will not finish: an upload that stalls.
    let mut stalled = TcpStream::connect(server.address).unwrap();
    stalled.write_all(b"POST /streams/s HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\n\r\n0123").unwrap();
    std::thread::sleep(Duration::from_millis(500));

    server.signal("TERM");
    server.wait_for_line("shutdown requested");
    std::thread::sleep(Duration::from_secs(1));
    assert!(server.child.try_wait().unwrap().is_none(), "still waiting for the upload");
    let signalled = Instant::now();
    server.signal("INT");
    let status = server.wait_exit();
    assert!(signalled.elapsed() < Duration::from_secs(10), "exited {:?} after the second signal", signalled.elapsed());
    // As a shell reports a process the signal ended: 128 + SIGINT.
    assert_eq!(status.code(), Some(130), "said:\n{}", server.seen.join("\n"));
    assert!(server.seen.iter().any(|line| line.contains("second signal")), "{}", server.seen.join("\n"));
    drop(stalled);

    let server = dir.start(&[], &[]);
    let (status, body) = get(server.address, "/streams/s?from=earliest");
    assert_eq!(status, 200);
    let body: Value = serde_json::from_str(&body).unwrap();
    let read: Vec<Value> = body["records"].as_array().unwrap().iter().map(|record| record["value"].clone()).collect();
    assert_eq!(read, values, "every acknowledged write survives the hurried exit");
}
