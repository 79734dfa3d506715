//! Subscriptions over Server-Sent Events through a real HTTP client on a loopback socket.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use onehop_engine::{Engine, EngineOptions};
use onehop_log::{Log, LogOptions};
use onehop_server::{AppState, app};
use serde_json::Value;

async fn start(options: EngineOptions) -> (SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(dir.path(), LogOptions::default()).unwrap();
    let engine = Arc::new(Engine::open(Arc::new(log), options).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let router = app(AppState::new(engine, None));
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (address, dir)
}

async fn publish(address: SocketAddr, path: &str, body: impl Into<reqwest::Body>) {
    let response = reqwest::Client::new().post(format!("http://{address}{path}")).body(body).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200, "{}", response.text().await.unwrap());
}

struct Events {
    response: reqwest::Response,
    buffer: String,
}

#[derive(Debug)]
struct SseEvent {
    id: Option<String>,
    kind: String,
    data: Value,
}

impl Events {
    async fn open(address: SocketAddr, path: &str, last_event_id: Option<&str>) -> Events {
        let mut request =
            reqwest::Client::new().get(format!("http://{address}{path}")).header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Events { response, buffer: String::new() }
    }

    /// The next event (comments skipped), or None when the server ended the stream.
    async fn next(&mut self) -> Option<SseEvent> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut id, mut kind, mut data) = (None, String::from("message"), String::new());
                for line in block.lines() {
                    if let Some(value) = line.strip_prefix("id: ") {
                        id = Some(value.to_string());
                    } else if let Some(value) = line.strip_prefix("event: ") {
                        kind = value.to_string();
                    } else if let Some(value) = line.strip_prefix("data: ") {
                        data.push_str(value);
                    }
                }
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some(SseEvent { id, kind, data: serde_json::from_str(&data).unwrap() });
            }
            let chunk =
                tokio::time::timeout(Duration::from_secs(10), self.response.chunk()).await.expect("data within 10 s");
            match chunk.unwrap() {
                Some(bytes) => self.buffer.push_str(std::str::from_utf8(&bytes).unwrap()),
                None => return None,
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_subscription_gets_matching_records_with_resumable_ids() {
    let (address, _dir) = start(EngineOptions::default()).await;
    publish(address, "/streams/scores?subject=scores/team-0", "{\"points\":0}").await;
    let mut events = Events::open(address, "/streams/scores?subject=scores/%2B", None).await;
    publish(address, "/streams/scores?subject=news/x", "\"not a score\"").await;
    publish(address, "/streams/scores?subject=scores/team-1&key=t1", "{\"points\":1}").await;
    publish(address, "/streams/scores?subject=scores/team-2", "{\"points\":2}").await;
    let first = events.next().await.unwrap();
    assert_eq!(first.kind, "record");
    assert_eq!(first.id.as_deref(), Some("0:2"), "latest by default: the record before subscribing is not sent");
    assert_eq!(first.data["subject"], "scores/team-1");
    assert_eq!(first.data["key"], "t1");
    assert_eq!(first.data["value"]["points"], 1);
    let second = events.next().await.unwrap();
    assert_eq!(second.id.as_deref(), Some("0:3"));
    assert_eq!(second.data["value"]["points"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_event_id_resumes_with_nothing_missed_or_repeated() {
    let (address, _dir) = start(EngineOptions::default()).await;
    for i in 0..10 {
        publish(address, &format!("/streams/ticks?key=k{i}"), format!("{i}")).await;
    }
    let mut events = Events::open(address, "/streams/ticks?from=earliest", None).await;
    let mut seen = Vec::new();
    let mut last_id = None;
    for _ in 0..4 {
        let event = events.next().await.unwrap();
        seen.push(event.data["value"].as_i64().unwrap());
        last_id = event.id;
    }
    drop(events);
    for i in 10..15 {
        publish(address, &format!("/streams/ticks?key=k{i}"), format!("{i}")).await;
    }
    let mut events = Events::open(address, "/streams/ticks?from=earliest", last_id.as_deref()).await;
    while seen.len() < 15 {
        seen.push(events.next().await.unwrap().data["value"].as_i64().unwrap());
    }
    assert_eq!(seen, (0..15).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_is_cut_off_and_resumes_without_a_gap() {
    let (address, _dir) = start(EngineOptions { subscriber_queue_capacity: 4, ..EngineOptions::default() }).await;
    publish(address, "/streams/flood", "start").await;
    let mut events = Events::open(address, "/streams/flood?from=latest", None).await;
    // Enough data to fill the socket buffers while this client does not read, so the server's
    // queue of 4 overflows.
    let value = "x".repeat(4000);
    let total = 2000;
    for i in 0..total {
        publish(address, "/streams/flood", format!("\"{i:05}{value}\"")).await;
    }
    let mut received = Vec::new();
    let resume = loop {
        let event = events.next().await.expect("the stream ends with an overflow event, not silently");
        match event.kind.as_str() {
            "record" => received.push(event.data["value"].as_str().unwrap()[..5].parse::<u32>().unwrap()),
            "overflow" => {
                assert_eq!(event.data["code"], "subscriber_overflow");
                break event.data["resume_id"].as_str().unwrap().to_string();
            }
            other => panic!("unexpected event {other}"),
        }
    };
    assert!(events.next().await.is_none(), "the response ends after the overflow");
    assert!((received.len() as u32) < total, "the slow reader was cut off");
    let mut events = Events::open(address, "/streams/flood", Some(&resume)).await;
    while (received.len() as u32) < total {
        let event = events.next().await.unwrap();
        received.push(event.data["value"].as_str().unwrap()[..5].parse().unwrap());
    }
    assert_eq!(received, (0..total).collect::<Vec<_>>(), "everything once, in order, across the cut");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_subscriptions_are_refused_with_json() {
    let (address, _dir) = start(EngineOptions::default()).await;
    publish(address, "/streams/s", "v").await;
    let cases = [
        ("/streams/s?subject=a/%23/b", None, 400, "bad_filter"),
        ("/streams/nothing", None, 404, "unknown_stream"),
        ("/streams/s?from=5", None, 416, "offset_past_end"),
        ("/streams/s", Some("0:zz"), 400, "bad_offset"),
        ("/streams/s?limit=5", None, 400, "bad_query"),
    ];
    for (path, last_event_id, status, code) in cases {
        let mut request =
            reqwest::Client::new().get(format!("http://{address}{path}")).header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], code, "{path}: {body}");
    }
}
