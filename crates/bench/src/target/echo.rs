//! The echo target: the harness's own latency floor.
//!
//! A loopback server inside the harness process that speaks just enough of onehop's protocols
//! for the workloads — HTTP writes (single and NDJSON), SSE subscriptions to streams and views,
//! view point reads, MQTT 3.1.1 CONNECT / SUBSCRIBE / PUBLISH — and does as little as a server
//! can: each HTTP connection is a thread blocked in `read`, which answers a write at once and
//! writes it to every matching subscriber's socket itself before reading on; nothing touches a
//! disk; a view window is a counter, closed by a timer thread at exactly end + grace. The
//! workloads drive it with the same client code as onehop, so what it measures is the harness
//! plus two loopback hops (a write in, a delivery out) and the thread wake-ups they cost on
//! this machine: a floor no target can go under.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::BytesMut;
use rmqtt_codec::types::{Publish, QoS};
use rmqtt_codec::v3;
use serde_json::{Value, json};
use tokio::runtime::Handle;
use tokio_util::codec::{Decoder, Encoder};

use super::{Session, Target};
use crate::client::{self, Endpoints};
use crate::plan::Plan;
use crate::recorder::Recorder;

/// A subscriber's socket that stays full this long is dropped (its observer reports it).
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);

pub struct EchoTarget {
    endpoints: Endpoints,
    echo: Arc<Echo>,
}

impl EchoTarget {
    /// Starts the echo on loopback ports of its own.
    pub fn start(plan: &Plan) -> anyhow::Result<EchoTarget> {
        let (window_ms, grace_ms) = match plan {
            Plan::View(view) => (view.window_ms, view.grace_ms),
            _ => (5_000, 1_000),
        };
        let http = TcpListener::bind("127.0.0.1:0").context("binding the echo's HTTP port")?;
        let mqtt = TcpListener::bind("127.0.0.1:0").context("binding the echo's MQTT port")?;
        let endpoints = Endpoints::plain(format!("http://{}", http.local_addr()?), mqtt.local_addr()?.to_string());
        let echo = Arc::new(Echo { window_ms, grace_ms, ..Echo::default() });
        {
            let echo = echo.clone();
            std::thread::Builder::new().name("echo-http".into()).spawn(move || accept(http, echo, http_connection))?;
        }
        {
            let echo = echo.clone();
            std::thread::Builder::new().name("echo-mqtt".into()).spawn(move || accept(mqtt, echo, mqtt_connection))?;
        }
        {
            let echo = echo.clone();
            std::thread::Builder::new().name("echo-timer".into()).spawn(move || close_windows(echo))?;
        }
        Ok(EchoTarget { endpoints, echo })
    }
}

impl Target for EchoTarget {
    fn name(&self) -> &str {
        "echo"
    }

    fn durability(&self, _plan: &Plan) -> String {
        "none (loopback echo: answered on receipt)".into()
    }

    fn open(&self, plan: &Plan, recorder: &Arc<Recorder>, runtime: &Handle) -> anyhow::Result<Session> {
        client::open(&self.endpoints, plan, recorder, runtime)
    }
}

impl Drop for EchoTarget {
    fn drop(&mut self) {
        // Every thread ends when its socket does: wake the listeners and close what is open.
        *self.echo.stopping.lock().expect("stopping") = true;
        self.echo.closing.notify_all();
        for socket in self.echo.sockets.lock().expect("sockets").drain(..) {
            let _ = socket.shutdown(std::net::Shutdown::Both);
        }
        for address in [self.endpoints.http.trim_start_matches("http://"), self.endpoints.mqtt.as_str()] {
            let _ = TcpStream::connect(address);
        }
    }
}

/// A stream subscription: the stream, an exact subject or one `field=value` condition.
struct Subscriber {
    stream: String,
    subject: Option<String>,
    field: Option<(String, String)>,
    socket: TcpStream,
}

/// A view window's count and whether it has closed.
#[derive(Clone, Copy, Default)]
struct Window {
    count: u64,
    closed: bool,
}

#[derive(Default)]
struct Echo {
    window_ms: i64,
    grace_ms: i64,
    subscribers: Mutex<Vec<Subscriber>>,
    /// Key → window start → window.
    windows: Mutex<HashMap<String, BTreeMap<i64, Window>>>,
    /// Close time (epoch ms) → the windows closing then.
    deadlines: Mutex<BTreeMap<i64, Vec<(String, i64)>>>,
    closing: Condvar,
    view_subscribers: Mutex<Vec<TcpStream>>,
    mqtt_subscribers: Mutex<Vec<TcpStream>>,
    /// Every accepted socket, to close them all when the target stops.
    sockets: Mutex<Vec<TcpStream>>,
    stopping: Mutex<bool>,
}

fn accept(listener: TcpListener, echo: Arc<Echo>, serve: fn(TcpStream, Arc<Echo>)) {
    for socket in listener.incoming() {
        if *echo.stopping.lock().expect("stopping") {
            return;
        }
        let Ok(socket) = socket else { continue };
        let _ = socket.set_nodelay(true);
        if let Ok(copy) = socket.try_clone() {
            echo.sockets.lock().expect("sockets").push(copy);
        }
        let echo = echo.clone();
        let _ = std::thread::Builder::new().name("echo-connection".into()).spawn(move || serve(socket, echo));
    }
}

fn now_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_nanos() as i64)
}

fn now_ms() -> i64 {
    now_ns() / 1_000_000
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let decoded = (bytes[index] == b'%' && index + 2 < bytes.len())
            .then(|| std::str::from_utf8(&bytes[index + 1..index + 3]).ok())
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match decoded {
            Some(byte) => {
                out.push(byte);
                index += 3;
            }
            None => {
                out.push(if bytes[index] == b'+' { b' ' } else { bytes[index] });
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A request's head: method, path, query pairs, and the headers the echo looks at.
struct Request {
    method: String,
    path: String,
    query: Vec<(String, String)>,
    content_length: usize,
    ndjson: bool,
    event_stream: bool,
    head_length: usize,
}

fn parse_request(bytes: &[u8]) -> Option<Result<Request, ()>> {
    let end = bytes.windows(4).position(|window| window == b"\r\n\r\n")?;
    let Ok(text) = std::str::from_utf8(&bytes[..end]) else { return Some(Err(())) };
    let mut lines = text.split("\r\n");
    let mut words = lines.next().unwrap_or_default().split(' ');
    let (method, target) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut request = Request {
        method: method.to_string(),
        path: path.to_string(),
        query: query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                (percent_decode(name), percent_decode(value))
            })
            .collect(),
        content_length: 0,
        ndjson: false,
        event_stream: false,
        head_length: end + 4,
    };
    for line in lines {
        let Some((name, value)) = line.split_once(':') else { continue };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        match name.as_str() {
            "content-length" => request.content_length = value.parse().unwrap_or(0),
            "content-type" => request.ndjson = value == "application/x-ndjson",
            "accept" => request.event_stream = value.contains("text/event-stream"),
            _ => {}
        }
    }
    Some(Ok(request))
}

fn respond(socket: &mut TcpStream, status: &str, body: &str) -> std::io::Result<()> {
    let response =
        format!("HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    socket.write_all(response.as_bytes())
}

const EVENT_STREAM_HEAD: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";

/// One SSE event as one chunk of a chunked body.
fn sse_chunk(data: &str) -> Vec<u8> {
    let event = format!("event: record\ndata: {data}\n\n");
    format!("{:x}\r\n{event}\r\n", event.len()).into_bytes()
}

/// Writes to every socket in `sockets`, dropping the ones that fail or stay full.
fn broadcast(sockets: &mut Vec<TcpStream>, bytes: &[u8]) {
    sockets.retain_mut(|socket| socket.write_all(bytes).is_ok());
}

/// One HTTP connection: requests answered in order as they are read.
fn http_connection(mut socket: TcpStream, echo: Arc<Echo>) {
    let mut buffer: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let read = match socket.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        buffer.extend_from_slice(&chunk[..read]);
        loop {
            let request = match parse_request(&buffer) {
                None => break,
                Some(Err(())) => return,
                Some(Ok(request)) => request,
            };
            if buffer.len() < request.head_length + request.content_length {
                break;
            }
            let body: Vec<u8> =
                buffer.drain(..request.head_length + request.content_length).skip(request.head_length).collect();
            if request.event_stream {
                // The socket now belongs to the subscription; this thread only waits for its end.
                subscribe(&echo, &request, &socket);
                let _ = std::io::copy(&mut socket, &mut std::io::sink());
                return;
            }
            if handle(&echo, &request, &body, &mut socket).is_err() {
                return;
            }
        }
    }
}

fn subscribe(echo: &Echo, request: &Request, socket: &TcpStream) {
    let Ok(mut writer) = socket.try_clone() else { return };
    let _ = writer.set_write_timeout(Some(WRITE_TIMEOUT));
    if writer.write_all(EVENT_STREAM_HEAD).is_err() {
        return;
    }
    if request.path.starts_with("/views/") {
        echo.view_subscribers.lock().expect("view subscribers").push(writer);
        return;
    }
    let stream = request.path.trim_start_matches("/streams/").to_string();
    let mut subscriber = Subscriber { stream, subject: None, field: None, socket: writer };
    for (name, value) in &request.query {
        match name.as_str() {
            "subject" => subscriber.subject = Some(value.clone()),
            "from" => {}
            _ => subscriber.field = Some((name.clone(), value.clone())),
        }
    }
    echo.subscribers.lock().expect("subscribers").push(subscriber);
}

fn handle(echo: &Echo, request: &Request, body: &[u8], socket: &mut TcpStream) -> std::io::Result<()> {
    let segments: Vec<&str> = request.path.trim_start_matches('/').split('/').collect();
    match (request.method.as_str(), segments.as_slice()) {
        ("POST", ["sql"]) => respond(socket, "200 OK", r#"{"results":[]}"#),
        ("POST", ["streams", stream]) => {
            let mut records: Vec<(Option<String>, Option<String>, String)> = Vec::new();
            if request.ndjson {
                for line in body.split(|byte| *byte == b'\n').filter(|line| !line.is_empty()) {
                    let Ok(envelope) = serde_json::from_slice::<Value>(line) else {
                        return respond(socket, "400 Bad Request", r#"{"error":{"code":"bad_json"}}"#);
                    };
                    let text = |name: &str| envelope[name].as_str().map(str::to_string);
                    records.push((text("key"), text("subject"), envelope["value"].to_string()));
                }
            } else {
                let find = |wanted: &str| {
                    request.query.iter().find(|(name, _)| name == wanted).map(|(_, value)| value.clone())
                };
                records.push((find("key"), find("subject"), String::from_utf8_lossy(body).into_owned()));
            }
            // Answered first, as onehop does once the write is durable; delivered right after.
            respond(socket, "200 OK", &format!(r#"{{"offset":0,"partition":0,"stream":"{stream}"}}"#))?;
            for (key, subject, value) in records {
                echo.route(stream, key, subject.as_deref(), &value);
            }
            Ok(())
        }
        ("GET", ["views", view, key]) => {
            let rows: Option<Vec<Value>> = echo.windows.lock().expect("windows").get(*key).map(|windows| {
                windows
                    .iter()
                    .rev()
                    .map(|(start, window)| {
                        json!({ "key": key, "n": window.count, "window_start": start,
                                "window_end": start + echo.window_ms, "final": window.closed })
                    })
                    .collect()
            });
            match rows {
                Some(rows) => respond(socket, "200 OK", &json!({ "view": view, "key": key, "rows": rows }).to_string()),
                None => respond(socket, "404 Not Found", r#"{"error":{"code":"not_found"}}"#),
            }
        }
        // As onehop: what a client asks to see the server up (the harness's writers warm
        // their connections with it).
        ("GET", ["healthz"]) => respond(socket, "200 OK", r#"{"status":"ok"}"#),
        _ => respond(socket, "404 Not Found", r#"{"error":{"code":"unknown"}}"#),
    }
}

impl Echo {
    fn route(&self, stream: &str, key: Option<String>, subject: Option<&str>, value: &str) {
        let parsed: Value = serde_json::from_str(value).unwrap_or(Value::Null);
        let chunk = sse_chunk(&format!("{{\"value\":{value}}}"));
        self.subscribers.lock().expect("subscribers").retain_mut(|subscriber| {
            let matches = subscriber.stream == stream
                && subscriber.subject.as_deref().is_none_or(|wanted| Some(wanted) == subject)
                && subscriber.field.as_ref().is_none_or(|(field, wanted)| match &parsed[field.as_str()] {
                    Value::String(text) => text == wanted,
                    Value::Array(items) => items.iter().any(|item| item.as_str() == Some(wanted)),
                    _ => false,
                });
            !matches || subscriber.socket.write_all(&chunk).is_ok()
        });
        if let (Some(key), Some(event_ms)) = (key, parsed["event_ms"].as_i64()) {
            self.count(key, event_ms);
        }
    }

    /// Counts an event into its key's window and pushes the new count; the window's first
    /// event schedules its close.
    fn count(&self, key: String, event_ms: i64) {
        let start = event_ms.div_euclid(self.window_ms) * self.window_ms;
        let close_ms = start + self.window_ms + self.grace_ms;
        if now_ms() >= close_ms {
            return; // late
        }
        let count = {
            let mut windows = self.windows.lock().expect("windows");
            let window = windows.entry(key.clone()).or_default().entry(start).or_default();
            window.count += 1;
            window.count
        };
        if count == 1 {
            self.deadlines.lock().expect("deadlines").entry(close_ms).or_default().push((key.clone(), start));
            self.closing.notify_one();
        }
        self.push_row(&key, start, count, false);
    }

    fn push_row(&self, key: &str, start: i64, count: u64, is_final: bool) {
        let row = json!({ "key": key, "final": is_final,
                          "row": { "key": key, "n": count, "window_start": start, "window_end": start + self.window_ms } });
        broadcast(&mut self.view_subscribers.lock().expect("view subscribers"), &sse_chunk(&row.to_string()));
    }
}

/// Closes windows at their close time (epoch ms), by the wall clock, and pushes their rows.
fn close_windows(echo: Arc<Echo>) {
    crate::schedule::tighten_timer_slack();
    let mut deadlines = echo.deadlines.lock().expect("deadlines");
    loop {
        if *echo.stopping.lock().expect("stopping") {
            return;
        }
        let now = now_ms();
        let due: Vec<i64> = deadlines.range(..=now).map(|(at, _)| *at).collect();
        for at in due {
            for (key, start) in deadlines.remove(&at).unwrap_or_default() {
                let count = {
                    let mut windows = echo.windows.lock().expect("windows");
                    let window = windows.entry(key.clone()).or_default().entry(start).or_default();
                    window.closed = true;
                    window.count
                };
                echo.push_row(&key, start, count, true);
            }
        }
        let wait = match deadlines.keys().next() {
            Some(next) => Duration::from_nanos((next * 1_000_000 - now_ns()).clamp(0, 1_000_000_000) as u64),
            None => Duration::from_secs(1),
        };
        deadlines = echo.closing.wait_timeout(deadlines, wait).expect("deadlines").0;
    }
}

/// One MQTT connection: CONNACK, SUBACK, PUBACK at once; every publish forwarded at QoS 1 to
/// every subscriber (the workloads subscribe to everything they publish).
fn mqtt_connection(mut socket: TcpStream, echo: Arc<Echo>) {
    let mut codec = v3::Codec::new(0);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    // Packet ids of forwarded publishes, one sequence for all subscribers (each sees a strictly
    // increasing subset, so none repeats while in flight).
    let mut next_id: u16 = 0;
    loop {
        let read = match socket.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(read) => read,
        };
        buf.extend_from_slice(&chunk[..read]);
        let mut answers = BytesMut::new();
        let mut forwarded = BytesMut::new();
        loop {
            let packet = match codec.decode(&mut buf) {
                Ok(Some((packet, _))) => packet,
                Ok(None) => break,
                Err(_) => return,
            };
            let answer = match packet {
                v3::Packet::Connect(_) => Some(v3::Packet::ConnectAck(v3::ConnectAck {
                    return_code: v3::ConnectAckReason::ConnectionAccepted,
                    session_present: false,
                })),
                v3::Packet::Subscribe { packet_id, topic_filters } => {
                    if let Ok(writer) = socket.try_clone() {
                        let _ = writer.set_write_timeout(Some(WRITE_TIMEOUT));
                        echo.mqtt_subscribers.lock().expect("MQTT subscribers").push(writer);
                    }
                    let status =
                        topic_filters.iter().map(|_| v3::SubscribeReturnCode::Success(QoS::AtLeastOnce)).collect();
                    Some(v3::Packet::SubscribeAck { packet_id, status })
                }
                v3::Packet::Publish(publish) => {
                    next_id = next_id.checked_add(1).unwrap_or(1);
                    let copy = Publish {
                        dup: false,
                        retain: false,
                        qos: QoS::AtLeastOnce,
                        topic: publish.topic.clone(),
                        packet_id: std::num::NonZeroU16::new(next_id),
                        payload: publish.payload.clone(),
                        properties: None,
                    };
                    let _ = codec.encode(v3::Packet::Publish(Box::new(copy)), &mut forwarded);
                    publish.packet_id.map(|packet_id| v3::Packet::PublishAck { packet_id })
                }
                v3::Packet::PingRequest => Some(v3::Packet::PingResponse),
                v3::Packet::Disconnect => return,
                _ => None,
            };
            if let Some(answer) = answer {
                let _ = codec.encode(answer, &mut answers);
            }
        }
        if !answers.is_empty() && socket.write_all(&answers).is_err() {
            return;
        }
        if !forwarded.is_empty() {
            broadcast(&mut echo.mqtt_subscribers.lock().expect("MQTT subscribers"), &forwarded);
        }
    }
}
