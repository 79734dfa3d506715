//! Subscriptions over WebSocket with a real WebSocket client on a loopback socket.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use onehop_engine::{Engine, EngineOptions};
use onehop_server::{AppState, app};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn start() -> (SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Engine::open_in(dir.path(), EngineOptions::default()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let router = app(AppState::new(engine, None));
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (address, dir)
}

async fn publish(address: SocketAddr, path: &str, body: &str) {
    let response =
        reqwest::Client::new().post(format!("http://{address}{path}")).body(body.to_string()).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
}

async fn receive(socket: &mut Socket) -> Value {
    loop {
        let message =
            tokio::time::timeout(Duration::from_secs(10), socket.next()).await.expect("a message within 10 s");
        match message.unwrap().unwrap() {
            Message::Text(text) => return serde_json::from_str(&text).unwrap(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
}

async fn send(socket: &mut Socket, command: Value) {
    socket.send(Message::Text(command.to_string().into())).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_socket_carries_several_subscriptions() {
    let (address, _dir) = start().await;
    publish(address, "/streams/scores?subject=scores/team-0", "0").await;
    publish(address, "/streams/news", "\"old\"").await;
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{address}/streams/scores?subject=scores/%2B")).await.unwrap();
    assert_eq!(receive(&mut socket).await, json!({ "type": "subscribed", "subscription": "url" }));
    publish(address, "/streams/scores?subject=scores/team-1", "{\"points\":1}").await;
    let record = receive(&mut socket).await;
    assert_eq!(record["type"], "record");
    assert_eq!(record["subscription"], "url");
    assert_eq!(record["id"], "0:1");
    assert_eq!(record["record"]["value"], json!({ "points": 1 }));

    send(&mut socket, json!({ "op": "subscribe", "subscription": "n", "stream": "news", "from": "earliest" })).await;
    assert_eq!(receive(&mut socket).await, json!({ "type": "subscribed", "subscription": "n" }));
    let record = receive(&mut socket).await;
    assert_eq!((record["subscription"].clone(), record["record"]["value"].clone()), (json!("n"), json!("old")));

    send(&mut socket, json!({ "op": "unsubscribe", "subscription": "n" })).await;
    assert_eq!(receive(&mut socket).await, json!({ "type": "unsubscribed", "subscription": "n" }));
    publish(address, "/streams/news", "\"after\"").await;
    publish(address, "/streams/scores?subject=scores/team-2", "2").await;
    let record = receive(&mut socket).await;
    assert_eq!(record["subscription"], "url", "nothing more arrives for the removed subscription: {record}");
    assert_eq!(record["record"]["value"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_resumes_from_a_record_id() {
    let (address, _dir) = start().await;
    for i in 0..6 {
        publish(address, "/streams/ticks", &i.to_string()).await;
    }
    let (mut socket, _) =
        tokio_tungstenite::connect_async(format!("ws://{address}/streams/ticks?from=earliest")).await.unwrap();
    receive(&mut socket).await;
    let mut last_id = Value::Null;
    for expected in 0..3 {
        let record = receive(&mut socket).await;
        assert_eq!(record["record"]["value"], expected);
        last_id = record["id"].clone();
    }
    drop(socket);
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{address}/streams/ticks")).await.unwrap();
    receive(&mut socket).await;
    send(&mut socket, json!({ "op": "subscribe", "subscription": "again", "stream": "ticks", "from": last_id })).await;
    receive(&mut socket).await;
    // The URL's own subscription starts at the end, so only "again" delivers, from record 3.
    for expected in 3..6 {
        let record = receive(&mut socket).await;
        assert_eq!(record["subscription"], "again", "{record}");
        assert_eq!(record["record"]["value"], expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_commands_get_error_messages_and_the_socket_stays_open() {
    let (address, _dir) = start().await;
    publish(address, "/streams/s", "1").await;
    // A bad first subscription is refused in HTTP, before the upgrade. (A stream that does not
    // exist is created: with auto_create on, subscribers may come before publishers.)
    let refused = tokio_tungstenite::connect_async(format!("ws://{address}/tables/nothing")).await;
    assert!(refused.is_err(), "upgrading to an unknown table must fail");
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{address}/streams/s")).await.unwrap();
    receive(&mut socket).await;
    let cases = [
        (json!({ "op": "subscribe", "subscription": "x", "url": "/tables/nothing" }), "unknown_table"),
        (json!({ "op": "subscribe", "subscription": "url", "stream": "s" }), "subscription_exists"),
        (json!({ "op": "subscribe", "subscription": "y", "stream": "s", "subject": "a/#/b" }), "bad_filter"),
        (json!({ "op": "subscribe", "subscription": "z", "stream": "s", "from": "99" }), "offset_past_end"),
        (json!({ "op": "unsubscribe", "subscription": "never" }), "unknown_subscription"),
        (json!({ "op": "dance" }), "bad_json"),
    ];
    for (command, code) in cases {
        send(&mut socket, command.clone()).await;
        let answer = receive(&mut socket).await;
        assert_eq!(
            (answer["type"].clone(), answer["code"].clone()),
            (json!("error"), json!(code)),
            "{command}: {answer}"
        );
    }
    // Said in the API's words, with the commands there are, not the decoder's.
    send(&mut socket, json!({ "op": "dance" })).await;
    let answer = receive(&mut socket).await;
    let message = answer["message"].as_str().unwrap();
    assert!(message.starts_with("the message is not a command") && !message.contains(" at line "), "{answer}");
    assert!(answer["hint"].as_str().unwrap().contains("\"op\":\"subscribe\""), "{answer}");
    socket.send(Message::Text("not json".into())).await.unwrap();
    let answer = receive(&mut socket).await;
    assert_eq!(
        (answer["code"].as_str(), answer["message"].as_str()),
        (Some("bad_json"), Some("the message is not JSON"))
    );
    // Still serving.
    publish(address, "/streams/s", "2").await;
    assert_eq!(receive(&mut socket).await["record"]["value"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_message_closes_only_that_socket() {
    let (address, _dir) = start().await;
    publish(address, "/streams/s", "1").await;
    let (mut big, _) = tokio_tungstenite::connect_async(format!("ws://{address}/streams/s")).await.unwrap();
    receive(&mut big).await;
    let (mut other, _) = tokio_tungstenite::connect_async(format!("ws://{address}/streams/s")).await.unwrap();
    receive(&mut other).await;
    let _ = big.send(Message::Text("x".repeat(200 * 1024).into())).await;
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match big.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return true,
                Some(Ok(_)) => continue,
            }
        }
    })
    .await
    .expect("the server closes the socket");
    assert!(closed);
    publish(address, "/streams/s", "2").await;
    assert_eq!(receive(&mut other).await["record"]["value"], 2, "other sockets are unaffected");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_to_a_stream_not_yet_created_waits_for_its_first_record() {
    let (address, _dir) = start().await;
    let (mut socket, _) = tokio_tungstenite::connect_async(format!("ws://{address}/streams/first")).await.unwrap();
    assert_eq!(receive(&mut socket).await, json!({ "type": "subscribed", "subscription": "url" }));
    send(&mut socket, json!({ "op": "subscribe", "subscription": "second", "stream": "second" })).await;
    assert_eq!(receive(&mut socket).await, json!({ "type": "subscribed", "subscription": "second" }));
    publish(address, "/streams/first", "1").await;
    publish(address, "/streams/second", "2").await;
    let mut got = [receive(&mut socket).await, receive(&mut socket).await];
    got.sort_by_key(|record| record["record"]["value"].as_u64());
    assert_eq!((got[0]["subscription"].as_str(), got[0]["record"]["value"].as_u64()), (Some("url"), Some(1)));
    assert_eq!((got[1]["subscription"].as_str(), got[1]["record"]["value"].as_u64()), (Some("second"), Some(2)));
}
