//! Streams over HTTP: the real router on a loopback socket, driven by a real HTTP client.

use std::net::SocketAddr;
use std::sync::Arc;

mod common;

use common::Events;
use onehop_engine::{Engine, EngineOptions, PartitionConfig};
use onehop_server::{AppState, app};
use serde_json::{Value, json};

struct Server {
    address: SocketAddr,
    engine: Arc<Engine>,
    _dir: tempfile::TempDir,
}

async fn start(options: EngineOptions) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(Engine::open_in(dir.path(), options).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let router = app(AppState::new(engine.clone(), None));
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    Server { address, engine, _dir: dir }
}

fn small_limits() -> EngineOptions {
    EngineOptions {
        stream_defaults: PartitionConfig {
            batch_bytes_max: 64 * 1024,
            record_bytes_max: 32 * 1024,
            ..Default::default()
        },
        ..EngineOptions::default()
    }
}

impl Server {
    /// Creates the stream `name` of `partitions` partitions in the engine, synced on every write.
    async fn create_stream(&self, name: &str, partitions: u32) {
        let def = onehop_engine::StreamDef {
            name: name.into(),
            partitions,
            retention_ms: None,
            retention_bytes: None,
            durability: onehop_engine::Durability::Fsync,
            mqtt_topic: None,
            compacted: false,
        };
        self.engine.create_stream(def).await.unwrap();
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    async fn post(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let response = reqwest::Client::new().post(self.url(path)).body(body).send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    async fn post_ndjson(&self, path: &str, body: &str) -> (u16, Value) {
        let response = reqwest::Client::new()
            .post(self.url(path))
            .header("content-type", "application/x-ndjson")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let response = reqwest::get(self.url(path)).await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap())
    }

    fn end_offset(&self, stream: &str) -> u64 {
        match self.engine.stream(stream) {
            Ok(stream) => stream.end_offsets().iter().sum(),
            Err(_) => 0,
        }
    }
}

fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_else(|| panic!("not an error body: {body}"))
}

#[tokio::test]
async fn publish_one_record_and_read_it_back() {
    let server = start(EngineOptions::default()).await;
    let (status, body) = server.post("/streams/scores?key=team-42&subject=scores/team-42", r#"{"points":3}"#).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({ "stream": "scores", "partition": 0, "offset": 0 }));
    server.post("/streams/scores", "plain text").await;
    let (status, body) = server.get("/streams/scores?from=earliest").await;
    assert_eq!(status, 200, "{body}");
    let records = body["records"].as_array().unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[0]["id"], "0:0");
    assert_eq!(records[0]["key"], "team-42");
    assert_eq!(records[0]["subject"], "scores/team-42");
    assert_eq!(records[0]["value"], json!({ "points": 3 }));
    assert!(records[0]["timestamp"].as_i64().unwrap() > 1_700_000_000_000);
    assert_eq!(records[1]["value_text"], "plain text");
    assert_eq!(body["next"], json!({ "0": 2 }));
}

#[tokio::test]
async fn an_ndjson_batch_reports_each_record_and_keeps_tombstones() {
    let server = start(EngineOptions::default()).await;
    let batch = concat!(
        r#"{"key":"a","subject":"s/1","headers":{"trace":"x1"},"value":{"n":1}}"#,
        "\n\n",
        r#"{"key":"b","value":"text"}"#,
        "\n",
        r#"{"key":"a"}"#,
        "\n"
    );
    let (status, body) = server.post_ndjson("/streams/events", batch).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["records"],
        json!([
            { "partition": 0, "offset": 0 }, { "partition": 0, "offset": 1 }, { "partition": 0, "offset": 2 }
        ])
    );
    let (_, body) = server.get("/streams/events").await;
    let records = body["records"].as_array().unwrap();
    assert_eq!(records[0]["headers"], json!({ "trace": "x1" }));
    assert_eq!(records[0]["value"], json!({ "n": 1 }));
    assert_eq!(records[1]["value"], "text", "a JSON string value stays a JSON string");
    assert_eq!(records[2]["value"], Value::Null, "a missing value is a tombstone");
}

#[tokio::test]
async fn bad_input_is_refused_with_a_code_and_nothing_is_written() {
    let server = start(small_limits()).await;
    struct Refusal {
        path: &'static str,
        header: Option<(&'static str, &'static str)>,
        body: String,
        status: u16,
        code: &'static str,
        says: &'static str,
    }
    impl Refusal {
        fn with_header(self, name: &'static str, value: &'static str) -> Refusal {
            Refusal { header: Some((name, value)), ..self }
        }
    }
    let refusal = |path, body: String, status, code, says| Refusal { path, header: None, body, status, code, says };
    let cases = [
        refusal("/streams/s?subject=scores/%2B", "v".into(), 400, "bad_subject", "wildcards"),
        refusal("/streams/s?colour=red", "v".into(), 400, "bad_query", "colour"),
        refusal("/streams/bad%2Fname", "v".into(), 400, "invalid_name", "not allowed"),
        refusal("/streams/__system", "v".into(), 400, "invalid_name", "reserved"),
        refusal("/streams/s", "x".repeat(40 * 1024), 413, "record_too_large", "record_bytes_max"),
        refusal("/streams/s", "x".repeat(200 * 1024), 413, "body_too_large", "limit is 131072 bytes"),
        // A `+` typed as is in a subject is the wildcard, never a space: refused in a publish.
        refusal("/streams/s?subject=scores/+", "v".into(), 400, "bad_subject", "wildcards"),
        // Bytes that are not UTF-8 would be stored as U+FFFD, so distinct keys would collide.
        refusal("/streams/s?key=%FF", "v".into(), 400, "bad_query", "UTF-8"),
        refusal("/streams/s?key=a&subject=%C3", "v".into(), 400, "bad_query", "UTF-8"),
        refusal("/streams/s?key=%G1", "v".into(), 400, "bad_query", "percent escape"),
        refusal("/streams/s", "v".into(), 400, "bad_durability", "eventually")
            .with_header("onehop-durability", "eventually"),
        refusal("/streams/s", "{\"score\": 1".into(), 400, "bad_json", "not valid JSON")
            .with_header("content-type", "application/json"),
        refusal("/streams/s", "score=1".into(), 400, "bad_json", "not valid JSON")
            .with_header("content-type", "application/merge-patch+json; charset=utf-8"),
    ];
    for case in cases {
        let mut request = reqwest::Client::new().post(server.url(case.path)).body(case.body);
        if let Some((name, value)) = case.header {
            request = request.header(name, value);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), case.status, "{}", case.path);
        let answer: Value = response.json().await.unwrap();
        assert_eq!(error_code(&answer), case.code, "{}: {answer}", case.path);
        assert!(answer["error"]["message"].as_str().unwrap().contains(case.says), "{}: {answer}", case.path);
    }
    // A bad line anywhere in a batch refuses the whole batch.
    let (status, answer) = server.post_ndjson("/streams/s", "{\"value\":1}\n{\"value\":\n{\"value\":3}\n").await;
    assert_eq!(status, 400);
    assert_eq!(error_code(&answer), "bad_json");
    assert!(answer["error"]["message"].as_str().unwrap().starts_with("line 2"), "{answer}");
    let (status, answer) = server.post_ndjson("/streams/s", "{\"value\":1, \"colour\":\"red\"}\n").await;
    assert_eq!((status, error_code(&answer)), (400, "bad_json"));
    let (status, answer) = server.post_ndjson("/streams/s", "\n\n").await;
    assert_eq!((status, error_code(&answer)), (400, "empty_batch"));
    assert_eq!(server.end_offset("s"), 0, "nothing was written");
}

#[tokio::test]
async fn reads_from_offsets_times_and_partitions() {
    let server = start(EngineOptions::default()).await;
    for i in 0..5 {
        server.post("/streams/ticks", format!("{i}")).await;
    }
    let (_, body) = server.get("/streams/ticks?from=3").await;
    let values: Vec<&Value> = body["records"].as_array().unwrap().iter().map(|record| &record["value"]).collect();
    assert_eq!(values, [&json!(3), &json!(4)]);
    let (_, body) = server.get("/streams/ticks?from=latest").await;
    assert_eq!(body["records"], json!([]));
    assert_eq!(body["next"], json!({ "0": 5 }));
    let (_, body) = server.get("/streams/ticks?from=2000-01-01T00:00:00Z&limit=2").await;
    assert_eq!(body["records"].as_array().unwrap().len(), 2);
    assert_eq!(body["next"], json!({ "0": 2 }));
    let (_, body) = server.get("/streams/ticks?from=2999-01-01T00:00:00%2B02:00").await;
    assert_eq!(body["records"], json!([]));

    let cases = [
        ("/streams/nothing", 404, "unknown_stream"),
        ("/streams/ticks?from=yesterday", 400, "bad_offset"),
        ("/streams/ticks?from=99", 416, "offset_past_end"),
        ("/streams/ticks?limit=0", 400, "bad_limit"),
        ("/streams/ticks?limit=10001", 400, "bad_limit"),
        ("/streams/ticks?partition=1", 404, "unknown_partition"),
        ("/streams/ticks?from=-1", 400, "bad_offset"),
    ];
    for (path, status, code) in cases {
        let (got, body) = server.get(path).await;
        assert_eq!((got, error_code(&body)), (status, code), "{path}: {body}");
    }

    server.create_stream("wide", 3).await;
    for key in ["a", "b", "c", "d", "e", "f"] {
        server.post(&format!("/streams/wide?key={key}"), key.to_string()).await;
    }
    let (status, body) = server.get("/streams/wide?from=0").await;
    assert_eq!((status, error_code(&body)), (400, "bad_offset"));
    assert!(body["error"]["message"].as_str().unwrap().contains("partition=0..2"), "{body}");
    let (_, body) = server.get("/streams/wide").await;
    assert_eq!(body["records"].as_array().unwrap().len(), 6, "every partition is read");
    let (_, body) = server.get("/streams/wide?partition=1&from=0").await;
    for record in body["records"].as_array().unwrap() {
        assert_eq!(record["partition"], 1);
    }
}

#[tokio::test]
async fn publishing_to_an_unknown_stream_without_auto_create_is_refused() {
    let server = start(EngineOptions { auto_create: false, ..EngineOptions::default() }).await;
    let (status, body) = server.post("/streams/orders", "v").await;
    assert_eq!((status, error_code(&body)), (404, "unknown_stream"));
    assert!(body["error"]["hint"].as_str().unwrap().contains("CREATE STREAM orders"), "{body}");
}

#[tokio::test]
async fn async_durability_is_accepted_per_request() {
    let server = start(EngineOptions::default()).await;
    let response = reqwest::Client::new()
        .post(server.url("/streams/fast"))
        .header("Onehop-Durability", "async")
        .body("v")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(server.end_offset("fast"), 1);
}

#[tokio::test]
async fn sql_defines_streams_and_answers_with_rows_or_reasons() {
    let server = start(EngineOptions::default()).await;
    let (status, body) =
        server.post("/sql", "CREATE STREAM orders WITH (partitions = 2, retention = '1d'); SHOW STREAMS").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["result"], "created");
    assert_eq!(body["results"][1]["rows"][0][0], "orders");
    assert_eq!(server.engine.stream("orders").unwrap().partition_count(), 2);
    // Publishing keeps working through the defined stream.
    let (status, _) = server.post("/streams/orders?key=k", "v").await;
    assert_eq!(status, 200);
    let (_, body) = server.post("/sql", "DESCRIBE orders").await;
    let end_offsets = &body["results"][0]["rows"][0][5];
    assert_eq!(end_offsets.as_array().unwrap().iter().map(|offset| offset.as_u64().unwrap()).sum::<u64>(), 1);

    // An ad-hoc query reads the stream's records as rows.
    let (status, body) = server.post("/sql", "SELECT _key, _offset FROM orders WHERE _key = 'k'").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["columns"], json!(["_key", "_offset"]), "{body}");
    assert_eq!(body["results"][0]["rows"][0][0], "k", "{body}");
    // A write in SQL appends to the stream; one without its columns is refused with why.
    let (status, body) = server.post("/sql", "INSERT INTO orders (_key, n) VALUES ('k2', 1)").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["result"], "changed", "{body}");
    assert_eq!(body["results"][0]["rows"], 1, "{body}");
    let (status, body) = server.post("/sql", "INSERT INTO orders VALUES (1)").await;
    assert_eq!((status, error_code(&body)), (400, "sql_invalid_query"));
    assert!(body["error"]["message"].as_str().unwrap().contains("needs its columns named"), "{body}");
    // Another unsupported statement lists the supported ones in the hint.
    let (_, body) = server.post("/sql", "TRUNCATE orders").await;
    assert!(body["error"]["hint"].as_str().unwrap().contains("CREATE TABLE"), "{body}");
    let (status, body) = server.post("/sql", "CREATE STREAM broken WITH (partitions = ").await;
    assert_eq!((status, error_code(&body)), (400, "sql_syntax"));
    assert!(server.engine.stream("broken").is_err(), "nothing ran");
    let (status, body) = server.post("/sql", "CREATE STREAM fine; CREATE STREAM orders WITH (partitions = 5)").await;
    assert_eq!((status, error_code(&body)), (409, "stream_exists"));
    assert!(body["error"]["hint"].as_str().unwrap().contains("ALTER STREAM orders SET"), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("statement 2 of 2, CREATE STREAM orders (the 1 statement(s) before it took effect)"),
        "{message}"
    );
    assert!(server.engine.stream("fine").is_ok());
}

#[tokio::test]
async fn a_body_that_is_not_json_is_stored_as_text_unless_it_says_it_is_json() {
    let server = start(EngineOptions::default()).await;
    let send = |content_type: &'static str, body: &'static str| {
        reqwest::Client::new().post(server.url("/streams/docs")).header("content-type", content_type).body(body).send()
    };
    assert_eq!(send("application/json", r#"{"ok":true}"#).await.unwrap().status().as_u16(), 200);
    assert_eq!(send("text/plain", "{not json").await.unwrap().status().as_u16(), 200);
    let (_, read) = server.get("/streams/docs?from=earliest").await;
    assert_eq!(read["records"][0]["value"], json!({ "ok": true }));
    assert_eq!(read["records"][1]["value_text"], "{not json");
}

#[tokio::test]
async fn reads_filter_by_subject_and_next_from_continues_them_across_partitions() {
    let server = start(EngineOptions::default()).await;
    server.create_stream("multi", 3).await;
    for i in 0..30 {
        let subject = if i % 2 == 0 { "a/x" } else { "b/x" };
        let (status, _) = server.post(&format!("/streams/multi?key=k{i}&subject={subject}"), format!("{i}")).await;
        assert_eq!(status, 200);
    }
    // Page through everything, 7 at a time, giving each answer's next_from back as from.
    let server = &server;
    let page_through = |query: &'static str| async move {
        let mut seen = Vec::new();
        let mut from = "earliest".to_string();
        for _ in 0..100 {
            let (status, read) = server.get(&format!("/streams/multi?limit=7&from={from}{query}")).await;
            assert_eq!(status, 200, "{read}");
            let records = read["records"].as_array().unwrap();
            if records.is_empty() {
                return (seen, from);
            }
            seen.extend(records.iter().map(|record| record["value"].as_u64().unwrap()));
            from = read["next_from"].as_str().unwrap().to_string();
        }
        panic!("paging never ended");
    };
    let (mut all, end) = page_through("").await;
    all.sort_unstable();
    assert_eq!(all, (0..30).collect::<Vec<u64>>(), "every record exactly once");
    // `+` as typed is the wildcard.
    let (mut matched, _) = page_through("&subject=a/+").await;
    matched.sort_unstable();
    assert_eq!(matched, (0..30).step_by(2).collect::<Vec<u64>>());

    // next_from is also where a subscription can go on from: only what comes after.
    let mut events = Events::open(server.address, &format!("/streams/multi?from={end}"), None).await;
    let (status, _) = server.post("/streams/multi?key=k99", "99").await;
    assert_eq!(status, 200);
    assert_eq!(events.next().await.unwrap().data["value"], 99);

    // A read that names something it does not take says what it takes.
    let (status, read) = server.get("/streams/multi?subject=a/%2B&colour=red").await;
    assert_eq!((status, error_code(&read)), (400, "bad_query"));
    let message = read["error"]["message"].as_str().unwrap();
    assert!(message.contains("colour") && message.contains("from, limit, partition and subject"), "{message}");
}
