//! CORS and the WebSocket `Origin` check over real HTTP and WebSocket clients: preflights and
//! their refusals, the headers an allowed origin gets, what another origin gets, and that
//! clients without an `Origin` and the server's own pages are untouched. (A real browser on
//! both sides of this is `crates/onehop/tests/browser.rs`.)

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use onehop_engine::{Engine, EngineOptions};
use onehop_server::http::origin::AllowedOrigins;
use onehop_server::{AppState, HttpConfig, serve_http};
use reqwest::{Method, Response};
use serde_json::Value;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const PAGE: &str = "https://app.example.com";
const OTHER: &str = "https://elsewhere.example.com";

/// A server allowing `origins`, with the stream `s` holding one record.
async fn start(origins: &[&str]) -> (SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Engine::open_in(dir.path(), EngineOptions::default()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut state = AppState::new(engine, None);
    state.allowed_origins = Arc::new(AllowedOrigins::parse(origins.iter().copied()).unwrap());
    let config = HttpConfig { connections_max: 1024, ..HttpConfig::default() };
    tokio::spawn(async move { serve_http(listener, state, config, std::future::pending()).await.unwrap() });
    common::publish(address, "/streams/s", r#"{"n":0}"#).await;
    (address, dir)
}

async fn send(address: SocketAddr, method: Method, path: &str, headers: &[(&str, &str)]) -> Response {
    let mut request = reqwest::Client::new().request(method, format!("http://{address}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

/// A browser's preflight: `OPTIONS path` from `origin` asking to send `method`, with the other
/// `access-control-request-*` headers in `asking`.
async fn preflight(address: SocketAddr, path: &str, origin: &str, method: &str, asking: &[(&str, &str)]) -> Response {
    let mut headers = vec![("origin", origin), ("access-control-request-method", method)];
    headers.extend_from_slice(asking);
    send(address, Method::OPTIONS, path, &headers).await
}

fn header<'a>(response: &'a Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|value| value.to_str().unwrap())
}

fn varies_by_origin(response: &Response) -> bool {
    response.headers().get_all("vary").iter().any(|value| value.to_str().unwrap().eq_ignore_ascii_case("origin"))
}

async fn error_code(response: Response) -> (u16, String, String) {
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    (
        status,
        body["error"]["code"].as_str().unwrap().to_string(),
        body["error"]["message"].as_str().unwrap().to_string(),
    )
}

async fn records(address: SocketAddr, stream: &str) -> usize {
    let body: Value =
        reqwest::get(format!("http://{address}/streams/{stream}?from=earliest")).await.unwrap().json().await.unwrap();
    body["records"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn a_preflight_from_an_allowed_origin_is_answered_with_what_it_may_send() {
    let (address, _dir) = start(&[PAGE]).await;
    let asking = [("access-control-request-headers", "content-type,if-match,onehop-durability,last-event-id")];
    let response = preflight(address, "/tables/orders/o1", PAGE, "PUT", &asking).await;
    assert_eq!(response.status().as_u16(), 204);
    assert_eq!(header(&response, "access-control-allow-origin"), Some(PAGE));
    assert_eq!(header(&response, "access-control-allow-methods"), Some("GET, HEAD, POST, PUT, PATCH, DELETE"));
    assert_eq!(
        header(&response, "access-control-allow-headers"),
        Some(
            "accept, authorization, content-type, if-match, if-none-match, last-event-id, onehop-durability, idempotency-key"
        )
    );
    assert_eq!(header(&response, "access-control-max-age"), Some("3600"));
    assert_eq!(header(&response, "access-control-allow-credentials"), None);
    assert_eq!(header(&response, "access-control-allow-private-network"), None);
    assert!(varies_by_origin(&response));

    // A page on a public address asking to reach this private one.
    let asking = [("access-control-request-private-network", "true")];
    let response = preflight(address, "/streams/s", PAGE, "GET", &asking).await;
    assert_eq!(response.status().as_u16(), 204);
    assert_eq!(header(&response, "access-control-allow-private-network"), Some("true"));
}

#[tokio::test]
async fn a_preflight_asking_for_more_is_refused_with_a_reason() {
    let (address, _dir) = start(&[PAGE]).await;
    let response = preflight(address, "/streams/s", PAGE, "TRACE", &[]).await;
    assert_eq!(header(&response, "access-control-allow-origin"), None);
    let (status, code, message) = error_code(response).await;
    assert_eq!((status, code.as_str()), (403, "preflight_refused"));
    assert!(message.contains("method TRACE") && message.contains("GET, HEAD"), "{message}");

    let asking = [("access-control-request-headers", "content-type, x-secret")];
    let response = preflight(address, "/streams/s", PAGE, "POST", &asking).await;
    let (status, code, message) = error_code(response).await;
    assert_eq!((status, code.as_str()), (403, "preflight_refused"));
    assert!(message.contains("header x-secret"), "{message}");

    // From an origin not allowed, whatever it asks.
    let response = preflight(address, "/streams/s", OTHER, "GET", &[]).await;
    assert_eq!(header(&response, "access-control-allow-origin"), None);
    let (status, code, message) = error_code(response).await;
    assert_eq!((status, code.as_str()), (403, "origin_not_allowed"));
    assert!(message.contains(OTHER) && message.contains("--allowed-origins"), "{message}");
}

#[tokio::test]
async fn an_allowed_origin_reads_its_answers_and_the_etag() {
    let (address, _dir) = start(&["http://127.0.0.1:5173", PAGE]).await;
    reqwest::Client::new()
        .post(format!("http://{address}/sql"))
        .body("CREATE TABLE notes (id TEXT PRIMARY KEY)")
        .send()
        .await
        .unwrap();
    let response = reqwest::Client::new()
        .put(format!("http://{address}/tables/notes/n1"))
        .header("origin", PAGE)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 201);
    assert_eq!(header(&response, "access-control-allow-origin"), Some(PAGE));
    assert_eq!(header(&response, "access-control-expose-headers"), Some("etag, idempotent-replayed"));
    assert!(header(&response, "etag").is_some());
    assert!(varies_by_origin(&response));
    // Errors are readable too, so the page can show why.
    let response = send(address, Method::GET, "/tables/notes/none", &[("origin", PAGE)]).await;
    assert_eq!(header(&response, "access-control-allow-origin"), Some(PAGE));
    assert_eq!(error_code(response).await.1, "not_found");
    // An SSE subscription.
    let response =
        send(address, Method::GET, "/streams/s?from=earliest", &[("origin", PAGE), ("accept", "text/event-stream")])
            .await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(header(&response, "access-control-allow-origin"), Some(PAGE));
    // Clients without an Origin get no CORS headers, but the answer still varies by it.
    let response = send(address, Method::GET, "/streams/s", &[]).await;
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(header(&response, "access-control-allow-origin"), None);
    assert!(varies_by_origin(&response));
}

#[tokio::test]
async fn another_origin_is_refused_before_anything_is_done() {
    for origins in [&[][..], &[PAGE][..]] {
        let (address, _dir) = start(origins).await;
        // A text/plain POST is a simple request: the browser sends it without asking.
        let response = reqwest::Client::new()
            .post(format!("http://{address}/streams/s"))
            .header("origin", OTHER)
            .header("content-type", "text/plain")
            .body("sneaked in")
            .send()
            .await
            .unwrap();
        assert_eq!(header(&response, "access-control-allow-origin"), None);
        let (status, code, _) = error_code(response).await;
        assert_eq!((status, code.as_str()), (403, "origin_not_allowed"), "allowed: {origins:?}");
        assert_eq!(records(address, "s").await, 1, "nothing written");
        let response = send(address, Method::GET, "/streams/s", &[("origin", OTHER)]).await;
        assert_eq!(error_code(response).await.1, "origin_not_allowed");
        // A sandboxed frame or a local file.
        let response = send(address, Method::GET, "/streams/s", &[("origin", "null")]).await;
        assert_eq!(error_code(response).await.1, "origin_not_allowed");
    }
}

#[tokio::test]
async fn by_default_only_clients_without_an_origin_and_the_servers_own_pages_are_served() {
    let (address, _dir) = start(&[]).await;
    let response = send(address, Method::GET, "/streams/s", &[]).await;
    assert_eq!(response.status().as_u16(), 200);
    assert!(!varies_by_origin(&response), "no CORS at all: nothing varies by origin");
    // A page served from the server's own address (a browser sends Origin on a same-origin
    // POST), and a native client that names the server as its Origin (paho-mqtt does, over
    // WebSocket), over TLS through a proxy.
    for origin in [format!("http://{address}"), format!("https://{address}")] {
        let response = reqwest::Client::new()
            .post(format!("http://{address}/streams/s"))
            .header("origin", &origin)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{origin}");
        assert_eq!(header(&response, "access-control-allow-origin"), None);
    }
    let response = preflight(address, "/streams/s", PAGE, "GET", &[]).await;
    assert_eq!(error_code(response).await.1, "origin_not_allowed");
}

#[tokio::test]
async fn star_allows_every_origin() {
    let (address, _dir) = start(&["*"]).await;
    for origin in [PAGE, OTHER, "http://localhost:3000"] {
        let response = send(address, Method::GET, "/streams/s", &[("origin", origin)]).await;
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(header(&response, "access-control-allow-origin"), Some(origin));
    }
}

/// Opens a WebSocket on `path` with `origin`; the refusal's status and JSON body if refused.
async fn web_socket(address: SocketAddr, path: &str, origin: Option<&str>) -> Result<(), (u16, Value)> {
    let mut request = format!("ws://{address}{path}").into_client_request().unwrap();
    if let Some(origin) = origin {
        request.headers_mut().insert("origin", origin.parse().unwrap());
    }
    if path == "/mqtt" {
        request.headers_mut().insert("sec-websocket-protocol", "mqtt".parse().unwrap());
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((mut socket, _)) => {
            socket.close(None).await.unwrap();
            Ok(())
        }
        Err(tungstenite::Error::Http(response)) => {
            let body = response.body().as_deref().unwrap_or_default();
            Err((response.status().as_u16(), serde_json::from_slice(body).unwrap_or(Value::Null)))
        }
        Err(error) => panic!("{path}: {error}"),
    }
}

#[tokio::test]
async fn a_web_socket_from_another_origin_is_refused_before_the_upgrade() {
    let (address, _dir) = start(&[PAGE]).await;
    for path in ["/streams/s?from=earliest", "/mqtt"] {
        let (status, body) = web_socket(address, path, Some(OTHER)).await.unwrap_err();
        assert_eq!((status, body["error"]["code"].as_str()), (403, Some("origin_not_allowed")), "{path}: {body}");
    }
    // Allowed, the server's own, and no Origin at all (a native client).
    let own = format!("http://{address}");
    for origin in [Some(PAGE), Some(own.as_str()), None] {
        web_socket(address, "/streams/s?from=earliest", origin)
            .await
            .unwrap_or_else(|refused| panic!("{origin:?}: {refused:?}"));
    }
}
