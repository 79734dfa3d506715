//! Tables over HTTP with a real client: DDL through /sql, row writes with ETags and
//! conditional writes, indexed queries, bad input, and subscriptions over SSE and WebSocket
//! (filters, array membership, snapshot, resume).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Events, start};
use futures_util::{SinkExt, StreamExt};
use onehop_engine::EngineOptions;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

async fn sql(address: SocketAddr, statements: &str) -> Value {
    let response =
        reqwest::Client::new().post(format!("http://{address}/sql")).body(statements.to_string()).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.unwrap()
}

async fn orders(address: SocketAddr) {
    sql(
        address,
        "CREATE TABLE orders (id TEXT PRIMARY KEY, customer BIGINT, tags TEXT[]); CREATE INDEX ON orders (customer)",
    )
    .await;
}

/// Sends a request; returns status, ETag and body.
async fn send(request: reqwest::RequestBuilder) -> (u16, Option<String>, Value) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let etag = response.headers().get("etag").map(|value| value.to_str().unwrap().to_string());
    let text = response.text().await.unwrap();
    (status, etag, if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap() })
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_have_versions_and_conditional_writes() {
    let (address, _dir) = start(EngineOptions::default()).await;
    orders(address).await;
    let url = format!("http://{address}/tables/orders/o1");

    let (status, etag, body) = send(client().put(&url).body(r#"{"customer": 42, "tags": ["a"]}"#)).await;
    assert_eq!(status, 201, "{body}");
    let etag = etag.unwrap();
    assert_eq!(body["row"], json!({"id": "o1", "customer": 42, "tags": ["a"]}));
    assert_eq!(etag, format!("\"{}\"", body["offset"]));

    let (status, got_etag, row) = send(client().get(&url)).await;
    assert_eq!((status, got_etag.as_deref()), (200, Some(etag.as_str())));
    assert_eq!(row["customer"], 42);
    let not_modified = client().get(&url).header("if-none-match", &etag).send().await.unwrap();
    assert_eq!(not_modified.status().as_u16(), 304);

    let (status, new_etag, body) =
        send(client().patch(&url).header("if-match", &etag).body(r#"{"tags": null, "note": "gift"}"#)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["row"], json!({"id": "o1", "customer": 42, "note": "gift"}));
    assert_ne!(new_etag.as_deref(), Some(etag.as_str()));

    // The old version: 412, nothing written.
    let (status, _, body) = send(client().put(&url).header("if-match", &etag).body("{}")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (412, Some("precondition_failed")));
    let (status, _, body) = send(client().put(&url).header("if-none-match", "*").body("{}")).await;
    assert_eq!(status, 412, "{body}");
    let (_, _, row) = send(client().get(&url)).await;
    assert_eq!(row["note"], "gift");

    let (status, _, _) = send(client().delete(&url).header("if-match", new_etag.unwrap())).await;
    assert_eq!(status, 200);
    let (status, _, body) = send(client().get(&url)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_writes_nothing() {
    let (address, _dir) = start(EngineOptions::default()).await;
    orders(address).await;
    let base = format!("http://{address}/tables");
    let cases: Vec<(reqwest::RequestBuilder, u16, &str)> = vec![
        (client().put(format!("{base}/orders/o1")).body("{not json"), 400, "bad_json"),
        (client().put(format!("{base}/orders/o1")).body("[1, 2]"), 400, "bad_json"),
        (client().put(format!("{base}/orders/o1")).body(r#"{"customer": "forty-two"}"#), 400, "invalid_row"),
        (client().put(format!("{base}/orders/o1")).body(r#"{"id": "o2"}"#), 400, "invalid_row"),
        (client().put(format!("{base}/orders/o1")).body(r#"{"tags": [1]}"#), 400, "invalid_row"),
        (client().put(format!("{base}/nothing/o1")).body("{}"), 404, "unknown_table"),
        (client().put(format!("{base}/orders/o1")).header("if-match", "yesterday").body("{}"), 400, "bad_precondition"),
        (
            client().put(format!("{base}/orders/o1")).header("onehop-durability", "soon").body("{}"),
            400,
            "bad_durability",
        ),
        (client().put(format!("{base}/orders/o1")).body(vec![b' '; 40 << 20]), 413, "body_too_large"),
        (client().patch(format!("{base}/orders/o1")).body("{}"), 404, "not_found"),
        (client().get(format!("{base}/orders?note=x")), 400, "unindexed_field"),
        (client().get(format!("{base}/orders?bad%20field=x")), 400, "bad_filter"),
        (client().get(format!("{base}/orders?limit=0")), 400, "bad_limit"),
        (client().get(format!("{base}/orders?customer=1&from=earliest")), 400, "bad_query"),
    ];
    for (request, status, code) in cases {
        let (got, _, body) = send(request).await;
        assert_eq!((got, body["error"]["code"].as_str()), (status, Some(code)), "{body}");
        assert!(body["error"]["message"].as_str().is_some_and(|message| !message.is_empty()));
    }
    let (_, _, body) = send(client().get(format!("{base}/orders?note=x"))).await;
    assert!(body["error"]["hint"].as_str().unwrap().contains("CREATE INDEX ON orders (note)"), "{body}");
    let (status, _, body) = send(client().get(format!("{base}/orders?limit=10"))).await;
    assert_eq!((status, body["rows"].as_array().map(Vec::len)), (200, Some(0)), "nothing was written: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_use_indexes_and_page() {
    let (address, _dir) = start(EngineOptions::default()).await;
    orders(address).await;
    for i in 0..7 {
        let row = json!({"customer": if i < 5 { 42 } else { 7 }, "tags": [format!("t{}", i % 2)]});
        let (status, _, _) =
            send(client().put(format!("http://{address}/tables/orders/o{i}")).body(row.to_string())).await;
        assert_eq!(status, 201);
    }
    let (_, _, page) = send(client().get(format!("http://{address}/tables/orders?customer=42&limit=3"))).await;
    let ids: Vec<&str> = page["rows"].as_array().unwrap().iter().map(|row| row["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["o0", "o1", "o2"]);
    assert_eq!(page["next_after"], "o2");
    let (_, _, page) = send(client().get(format!("http://{address}/tables/orders?customer=42&after=o2"))).await;
    let ids: Vec<&str> = page["rows"].as_array().unwrap().iter().map(|row| row["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["o3", "o4"]);
    assert_eq!(page["next_after"], Value::Null);
    // An unindexed field with scan=true, array membership, combined with an indexed one.
    let (_, _, page) =
        send(client().get(format!("http://{address}/tables/orders?tags=t1&customer=42&scan=true"))).await;
    assert_eq!(page["rows"].as_array().unwrap().len(), 2, "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_subscriptions_filter_snapshot_and_resume() {
    let (address, _dir) = start(EngineOptions::default()).await;
    orders(address).await;
    let put = |id: &'static str, row: Value| async move {
        let (status, _, body) =
            send(client().put(format!("http://{address}/tables/orders/{id}")).body(row.to_string())).await;
        assert!(status == 200 || status == 201, "{body}");
    };
    put("o1", json!({"customer": 42, "tags": ["sports"]})).await;
    put("o2", json!({"customer": 7, "tags": ["news"]})).await;

    // A snapshot of the matching rows, then changes; array membership needs no index.
    let mut sports = Events::open(address, "/tables/orders?tags=sports&snapshot=true", None).await;
    let first = sports.next().await.unwrap();
    assert_eq!((first.kind.as_str(), first.data["key"].as_str()), ("snapshot", Some("o1")));
    assert_eq!(first.data["row"]["customer"], 42);
    let end = sports.next().await.unwrap();
    assert_eq!(end.kind, "snapshot_end");
    let mut one_row = Events::open(address, "/tables/orders/o2", None).await;

    put("o2", json!({"customer": 7, "tags": ["news", "sports"]})).await; // enters
    put("o1", json!({"customer": 42, "tags": []})).await; // leaves
    put("o3", json!({"customer": 1, "tags": ["cooking"]})).await; // never matches

    let entered = sports.next().await.unwrap();
    assert_eq!((entered.kind.as_str(), entered.data["key"].as_str()), ("insert", Some("o2")));
    let left = sports.next().await.unwrap();
    assert_eq!((left.kind.as_str(), left.data["key"].as_str()), ("delete", Some("o1")));
    assert_eq!(left.data["row"]["tags"], json!([]), "a row that left still exists; its new state is sent");
    let changed = one_row.next().await.unwrap();
    assert_eq!((changed.kind.as_str(), changed.data["op"].as_str()), ("update", Some("update")));

    // Resume after the first change: the second is sent again, nothing before it. (Its id may
    // be past the non-matching o3 write: an id is a position, and o3 need not be read again.)
    let mut resumed = Events::open(address, "/tables/orders?tags=sports", entered.id.as_deref()).await;
    let again = resumed.next().await.unwrap();
    assert_eq!((again.kind.as_str(), again.data["key"].as_str()), ("delete", Some("o1")));
    assert_eq!(again.data["id"], left.data["id"]);
}

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn next_json(socket: &mut Socket) -> Value {
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next()).await.unwrap().unwrap().unwrap();
        if let Message::Text(text) = message {
            return serde_json::from_str(&text).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_subscribes_to_tables_and_streams_by_url() {
    let (address, _dir) = start(EngineOptions::default()).await;
    orders(address).await;
    let (status, _, _) =
        send(client().put(format!("http://{address}/tables/orders/o1")).body(r#"{"customer":42}"#)).await;
    assert_eq!(status, 201);
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{address}/tables/orders?customer=42&snapshot=true"))
            .await
            .unwrap();
    assert_eq!(next_json(&mut socket).await["type"], "subscribed");
    let snapshot = next_json(&mut socket).await;
    assert_eq!((snapshot["type"].as_str(), snapshot["change"]["key"].as_str()), (Some("snapshot"), Some("o1")));
    assert_eq!(next_json(&mut socket).await["type"], "snapshot_end");
    let command = json!({"op": "subscribe", "subscription": "hot", "url": "/streams/scores?team=red"});
    client().post(format!("http://{address}/streams/scores")).body("{}").send().await.unwrap();
    socket.send(Message::Text(command.to_string().into())).await.unwrap();
    assert_eq!(next_json(&mut socket).await["subscription"], "hot");
    client().post(format!("http://{address}/streams/scores")).body(r#"{"team":"blue"}"#).send().await.unwrap();
    client().post(format!("http://{address}/streams/scores")).body(r#"{"team":"red","n":1}"#).send().await.unwrap();
    client().patch(format!("http://{address}/tables/orders/o1")).body(r#"{"customer":7}"#).send().await.unwrap();
    let mut got = [next_json(&mut socket).await, next_json(&mut socket).await];
    got.sort_by_key(|message| message["type"].as_str().unwrap().to_string());
    assert_eq!((got[0]["type"].as_str(), got[0]["change"]["op"].as_str()), (Some("change"), Some("delete")));
    assert_eq!((got[1]["type"].as_str(), got[1]["record"]["value"]["n"].as_i64()), (Some("record"), Some(1)));
}

/// A body over the limit is refused with `413` before it is read. The client is still sending
/// it then, and must still get the answer: the server closes by shutting its side and reading
/// the rest, not by closing a socket with unread input (which the kernel answers with a
/// reset, so the client sees "broken pipe" or "connection reset" and never the `413`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_answered_even_while_the_client_still_sends_it() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let (address, _dir) = start(EngineOptions::default()).await;
    orders(address).await;
    for attempt in 0..3 {
        let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
        let body_bytes = 64usize << 20;
        let head = format!("PUT /tables/orders/o1 HTTP/1.1\r\nHost: onehop\r\nContent-Length: {body_bytes}\r\n\r\n");
        stream.write_all(head.as_bytes()).await.unwrap();
        // The whole declared body, as a client streaming an upload does: every write must be
        // taken (read and dropped by the server), none reset.
        let chunk = vec![b' '; 1 << 20];
        for sent in 0..body_bytes / chunk.len() {
            if let Err(error) = stream.write_all(&chunk).await {
                panic!("attempt {attempt}: the server reset the upload after {sent} MiB: {error}");
            }
        }
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap_or_else(|error| panic!("attempt {attempt}: {error}"));
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 413"), "attempt {attempt}: {answer}");
        assert!(answer.contains("\"body_too_large\""), "attempt {attempt}: {answer}");
    }
    // Nothing was written.
    let (status, _, _) = send(client().get(format!("http://{address}/tables/orders/o1"))).await;
    assert_eq!(status, 404);
}
