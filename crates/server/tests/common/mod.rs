//! Helpers shared by the HTTP tests: a server on a loopback port, publishing, and an SSE
//! client that parses events.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use onehop_engine::{Engine, EngineOptions};
use onehop_server::{AppState, HttpConfig, serve_http};
use serde_json::Value;

pub async fn start(options: EngineOptions) -> (SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Engine::open_in(dir.path(), options).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    // The server's own listener (connection limit, lingering close), as `onehop serve` runs it.
    let state = AppState::new(engine, None);
    let config = HttpConfig { connections_max: 1024, ..HttpConfig::default() };
    tokio::spawn(async move { serve_http(listener, state, config, std::future::pending()).await.unwrap() });
    (address, dir)
}

pub async fn publish(address: SocketAddr, path: &str, body: impl Into<reqwest::Body>) {
    let response = reqwest::Client::new().post(format!("http://{address}{path}")).body(body).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200, "{}", response.text().await.unwrap());
}

pub struct Events {
    response: reqwest::Response,
    buffer: String,
}

#[derive(Debug)]
pub struct SseEvent {
    pub id: Option<String>,
    pub kind: String,
    pub data: Value,
}

impl Events {
    pub async fn open(address: SocketAddr, path: &str, last_event_id: Option<&str>) -> Events {
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
    pub async fn next(&mut self) -> Option<SseEvent> {
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
