//! Ad-hoc SELECT over `POST /sql`, with curl, on a server with users: a user reads only what
//! they may READ (a join with anything else is refused whole), an anonymous query is asked for
//! credentials, and the query limits (memory, stream records) end a query with `query_limit`,
//! counted in /metrics, while the server goes on answering.

mod common;

use std::net::SocketAddr;

use common::{DataDir, curl, sql_as};
use serde_json::{Value, json};

const ROOT: (&str, &str) = ("root", "root-pass");
const ALICE: (&str, &str) = ("alice", "alice-pass");

/// POST /sql as `user` (none: anonymous): the status and the body as JSON.
fn sql(address: SocketAddr, user: Option<(&str, &str)>, statement: &str) -> (u16, Value) {
    let credentials = user.map(|(name, password)| format!("{name}:{password}"));
    let mut args = vec!["-X", "POST", "--data-binary", statement];
    if let Some(credentials) = &credentials {
        args.extend(["-u", credentials.as_str()]);
    }
    let (status, body) = curl(address, "/sql", &args);
    (status, serde_json::from_str(&body).unwrap_or_else(|_| panic!("{statement}: not JSON: {body}")))
}

fn rows(answer: &Value) -> &Vec<Value> {
    answer["results"][0]["rows"].as_array().unwrap_or_else(|| panic!("no rows in {answer}"))
}

#[test]
fn queries_read_what_grants_allow_and_stop_at_their_limits() {
    let dir = DataDir::new();
    let server = dir.start(
        &["--admin-user", ROOT.0, "--query-memory-max", "200KiB", "--query-stream-records-max", "50"],
        &[("ONEHOP_ADMIN_PASSWORD", ROOT.1)],
    );
    let address = server.address;
    sql_as(
        address,
        ROOT,
        "CREATE TABLE items (id TEXT PRIMARY KEY, name TEXT, price BIGINT); CREATE STREAM events; \
         CREATE USER alice PASSWORD 'alice-pass'; GRANT READ ON TABLE items TO alice",
    );
    for i in 0..40 {
        let row = json!({"name": format!("item {i:02}"), "price": i * 10}).to_string();
        let credentials = format!("{}:{}", ROOT.0, ROOT.1);
        let (status, body) =
            curl(address, &format!("/tables/items/i{i:02}"), &["-X", "PUT", "-u", &credentials, "--data-binary", &row]);
        assert!(status == 200 || status == 201, "{body}");
    }
    let lines: String = (0..60).map(|i| format!("{{\"value\":{{\"n\":{i}}}}}\n")).collect();
    let credentials = format!("{}:{}", ROOT.0, ROOT.1);
    let (status, body) = curl(
        address,
        "/streams/events",
        &["-X", "POST", "-u", &credentials, "-H", "content-type: application/x-ndjson", "--data-binary", &lines],
    );
    assert_eq!(status, 200, "{body}");

    // alice reads the table she may read.
    let (status, answer) =
        sql(address, Some(ALICE), "SELECT name, price FROM items WHERE price >= 350 ORDER BY price DESC");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        rows(&answer),
        &vec![
            json!(["item 39", 390]),
            json!(["item 38", 380]),
            json!(["item 37", 370]),
            json!(["item 36", 360]),
            json!(["item 35", 350])
        ]
    );
    assert_eq!(answer["results"][0]["columns"], json!(["name", "price"]));
    // Not the stream, not even joined to what she may read.
    for statement in ["SELECT * FROM events", "SELECT i.name FROM items i JOIN events e ON e.n = i.price"] {
        let (status, answer) = sql(address, Some(ALICE), statement);
        assert_eq!(status, 403, "{statement}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains("events"), "{answer}");
    }
    let (status, answer) = sql(address, None, "SELECT * FROM items");
    assert_eq!(status, 401, "{answer}");

    // The stream-records limit: the whole stream is 60 records, a range of it fewer.
    let (status, answer) = sql(address, Some(ROOT), "SELECT COUNT(*) FROM events");
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "query_limit", "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("query_stream_records_max"), "{answer}");
    let (status, answer) = sql(address, Some(ROOT), "SELECT COUNT(*), MIN(n) FROM events WHERE _offset >= 20");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(rows(&answer), &vec![json!([40, 20])]);

    // The memory limit: 40³ joined rows would be far more than 200 KiB.
    let (status, answer) =
        sql(address, Some(ROOT), "SELECT a.name, b.name, c.name FROM items a CROSS JOIN items b CROSS JOIN items c");
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "query_limit", "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("query_memory_max"), "{answer}");
    // A COUNT over the same join holds nothing per row, and is answered.
    let (status, answer) =
        sql(address, Some(ROOT), "SELECT COUNT(*) FROM items a CROSS JOIN items b CROSS JOIN items c");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(rows(&answer), &vec![json!([64000])]);

    let (status, scrape) = curl(address, "/metrics", &["-u", &credentials]);
    assert_eq!(status, 200);
    for series in
        ["sql_queries_limited_total{limit=\"memory\"} 1", "sql_queries_limited_total{limit=\"stream_records\"} 1"]
    {
        assert!(scrape.lines().any(|line| line == series), "{series} in\n{scrape}");
    }
}
