//! Subscriptions over Server-Sent Events through a real HTTP client on a loopback socket.

mod common;

use serde_json::Value;

use common::{Events, publish, start};
use onehop_engine::EngineOptions;

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
async fn a_reader_that_stops_reading_carries_on_from_the_log_on_the_same_response() {
    let (address, _dir) = start(EngineOptions { subscriber_queue_capacity: 4, ..EngineOptions::default() }).await;
    publish(address, "/streams/flood", "start").await;
    let mut events = Events::open(address, "/streams/flood?from=latest", None).await;
    // Enough data to fill the socket buffers while this client does not read, so the server's
    // live queue of 4 overflows many times over.
    let value = "x".repeat(4000);
    let total = 2000;
    for i in 0..total {
        publish(address, "/streams/flood", format!("\"{i:05}{value}\"")).await;
    }
    let mut received = Vec::new();
    while (received.len() as u32) < total {
        let event = events.next().await.expect("the response goes on");
        assert_eq!(event.kind, "record", "nothing but records: {event:?}");
        let number: u32 = event.data["value"].as_str().unwrap()[..5].parse().unwrap();
        assert_eq!(event.id, Some(format!("0:{}", number + 1)), "ids stay resumable");
        received.push(number);
    }
    assert_eq!(received, (0..total).collect::<Vec<_>>(), "everything once, in order, with no reconnection");
    // And it is live again: a record written now arrives.
    publish(address, "/streams/flood", "\"after\"").await;
    assert_eq!(events.next().await.unwrap().data["value"], "after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_subscriptions_are_refused_with_json() {
    let (address, _dir) = start(EngineOptions::default()).await;
    publish(address, "/streams/s", "v").await;
    let cases = [
        ("/streams/s?subject=a/%23/b", None, 400, "bad_filter"),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_to_a_stream_not_yet_created_creates_it_when_auto_create_is_on() {
    let (address, _dir) = start(EngineOptions::default()).await;
    // The subscriber comes first, as in most apps; the publisher's record reaches it.
    let mut events = Events::open(address, "/streams/later?subject=scores/%2B", None).await;
    publish(address, "/streams/later?subject=scores/red", "first").await;
    let event = events.next().await.unwrap();
    assert_eq!(event.data["value_text"], "first");

    // Without auto_create, the refusal says how to create it, and never to turn on a setting
    // that is on.
    let (address, _dir) = start(EngineOptions { auto_create: false, ..EngineOptions::default() }).await;
    let response = reqwest::Client::new()
        .get(format!("http://{address}/streams/nothing"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unknown_stream");
    assert_eq!(body["error"]["message"], "unknown stream \"nothing\"");
    let hint = body["error"]["hint"].as_str().unwrap();
    assert!(hint.contains("CREATE STREAM nothing") && hint.contains("auto_create off"), "{hint}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plus_typed_as_is_in_a_subject_filter_is_the_wildcard() {
    let (address, _dir) = start(EngineOptions::default()).await;
    publish(address, "/streams/scores?subject=scores/red", "r").await;
    publish(address, "/streams/scores?subject=other/red", "o").await;
    // reqwest sends the query as written: a raw `+`, as curl and browsers' address bars do.
    let mut events = Events::open(address, "/streams/scores?subject=scores/+&from=earliest", None).await;
    let event = events.next().await.unwrap();
    assert_eq!((event.data["subject"].as_str(), event.data["value_text"].as_str()), (Some("scores/red"), Some("r")));
    publish(address, "/streams/scores?subject=scores/blue", "b").await;
    let event = events.next().await.unwrap();
    assert_eq!(event.data["value_text"], "b", "the record on other/red did not match");
}
