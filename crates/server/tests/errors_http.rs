//! Every refusal has the documented JSON body, including those the router and the HTTP parser
//! make themselves: an unknown route, a method a route does not take, a URL or a head too large,
//! a head that does not parse. Driven over a raw TCP socket, so nothing in between rewrites what
//! the server sends.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use onehop_engine::EngineOptions;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What came back for `request`: the status, the headers (names lowercased) and the body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.as_str())
    }

    /// The error body's code, after checking the body is `{"error":{"code","message"}}`.
    fn error_code(&self) -> String {
        assert_eq!(self.header("content-type"), Some("application/json"), "status {}: {:?}", self.status, self.body);
        let body: Value = serde_json::from_str(&self.body).unwrap_or_else(|_| panic!("not JSON: {:?}", self.body));
        let message = body["error"]["message"].as_str().unwrap_or_else(|| panic!("no message in {body}"));
        assert!(!message.is_empty(), "{body}");
        body["error"]["code"].as_str().unwrap_or_else(|| panic!("no code in {body}")).to_string()
    }
}

/// Sends `request` as is and reads the answer until the server closes the connection.
async fn exchange(address: SocketAddr, request: &[u8]) -> Answer {
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    // The server may answer before it has read everything (a head too large): send on while
    // it lets us, and read its answer either way.
    let _ = socket.write_all(request).await;
    let mut raw = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut raw)).await;
    assert!(read.is_ok(), "no answer and close within 10 s; got {:?}", String::from_utf8_lossy(&raw));
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no head in {text:?}"));
    let mut lines = head.lines();
    let status = lines.next().unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_string()))
        .collect();
    Answer { status, headers, body: body.to_string() }
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_s_own_refusals_are_json() {
    let (address, _dir) = common::start(EngineOptions::default()).await;

    let answer = exchange(address, &get("/no/such/thing")).await;
    assert_eq!(answer.status, 404);
    assert_eq!(answer.error_code(), "unknown_route");
    assert!(answer.body.contains("/no/such/thing"), "{}", answer.body);

    let answer = exchange(address, b"PUT /streams/s HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").await;
    assert_eq!(answer.status, 405);
    assert_eq!(answer.error_code(), "method_not_allowed");
    // The client still learns which methods the route takes, in the header and the message.
    let allow = answer.header("allow").expect("an Allow header");
    assert!(allow.contains("GET") && allow.contains("POST") && allow.contains("DELETE"), "{allow}");
    assert!(answer.body.contains("GET") && answer.body.contains("POST"), "{}", answer.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_parser_s_refusals_are_json() {
    let (address, _dir) = common::start(EngineOptions::default()).await;

    // A request line longer than the parser takes (64 KiB).
    let long = format!("/streams/s?subject={}", "a".repeat(70_000));
    let answer = exchange(address, &get(&long)).await;
    assert_eq!(answer.status, 414);
    assert_eq!(answer.error_code(), "uri_too_long");
    assert_eq!(answer.header("connection"), Some("close"));

    // More header fields than the parser takes (100).
    let mut request = String::from("GET /healthz HTTP/1.1\r\nHost: test\r\n");
    for field in 0..120 {
        request.push_str(&format!("x-field-{field}: {field}\r\n"));
    }
    request.push_str("\r\n");
    let answer = exchange(address, request.as_bytes()).await;
    assert_eq!(answer.status, 431);
    assert_eq!(answer.error_code(), "headers_too_large");

    // A head that is not HTTP.
    let answer = exchange(address, b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n").await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.error_code(), "bad_request");

    // The connections above were each closed after their answer; the server still serves.
    let answer = exchange(address, &get("/healthz")).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
}
