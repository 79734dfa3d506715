//! Ad-hoc SELECT and writes over `POST /sql`, with curl, on a server with users: a user reads only what
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
    assert_eq!(answer["results"][0]["types"], json!(["text", "bigint"]));
    // Not the stream, not even joined to what she may read.
    for statement in ["SELECT * FROM events", "SELECT i.name FROM items i JOIN events e ON e.n = i.price"] {
        let (status, answer) = sql(address, Some(ALICE), statement);
        assert_eq!(status, 403, "{statement}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains("events"), "{answer}");
    }
    let (status, answer) = sql(address, None, "SELECT * FROM items");
    assert_eq!(status, 401, "{answer}");
    // Writes take WRITE on their target: alice may read items, not change them.
    let (status, answer) = sql(address, Some(ALICE), "UPDATE items SET price = 0 WHERE id = 'i01'");
    assert_eq!(status, 403, "{answer}");
    let (status, answer) =
        sql(address, Some(ROOT), "UPDATE items SET price = price + 1 WHERE id = 'i01' RETURNING price");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(rows(&answer), &vec![json!([11])]);
    let (status, row) = curl(address, "/tables/items/i01", &["-u", &format!("{}:{}", ROOT.0, ROOT.1)]);
    assert_eq!(status, 200);
    assert!(row.contains("\"price\":11"), "HTTP reads what SQL wrote: {row}");

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

/// Multi-row INSERTs from a writer thread while the server is killed with kill -9 at random
/// moments: after each restart every statement's rows are all there or none is, and every
/// acknowledged statement's are all there.
#[test]
fn a_statements_rows_survive_kill_9_all_or_none() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    const ROWS: usize = 8;
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    let (status, body) =
        common::request(server.address, "POST", "/sql", "CREATE TABLE ledger (id TEXT PRIMARY KEY, batch BIGINT)")
            .unwrap();
    assert_eq!(status, 200, "{body}");
    let acknowledged = Arc::new(Mutex::new(Vec::<u64>::new()));
    let mut next_batch = 0u64;
    let mut seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    println!("seed {seed}");
    for cycle in 0..8 {
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (address, stop, acknowledged) = (server.address, stop.clone(), acknowledged.clone());
            let first = next_batch;
            std::thread::spawn(move || {
                let mut batch = first;
                while !stop.load(Ordering::Relaxed) {
                    let values: Vec<String> = (0..ROWS).map(|row| format!("('b{batch}-{row}', {batch})")).collect();
                    let statement = format!("INSERT INTO ledger (id, batch) VALUES {}", values.join(", "));
                    match common::request(address, "POST", "/sql", &statement) {
                        Some((200, _)) => acknowledged.lock().unwrap().push(batch),
                        _ => break,
                    }
                    batch += 1;
                }
                batch
            })
        };
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(std::time::Duration::from_millis(100 + seed % 400));
        server.kill_9();
        stop.store(true, Ordering::Relaxed);
        next_batch = writer.join().unwrap() + 1;
        drop(server);
        server = dir.start(&[], &[]);
        let (status, answer) = common::request(
            server.address,
            "POST",
            "/sql",
            "SELECT batch, COUNT(*) AS n FROM ledger GROUP BY batch HAVING COUNT(*) <> 8",
        )
        .unwrap();
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(answer["results"][0]["rows"], json!([]), "cycle {cycle}: a statement half written: {answer}");
        let (_, answer) = common::request(server.address, "POST", "/sql", "SELECT DISTINCT batch FROM ledger").unwrap();
        let answer: Value = serde_json::from_str(&answer).unwrap();
        let stored: std::collections::HashSet<u64> =
            answer["results"][0]["rows"].as_array().unwrap().iter().map(|row| row[0].as_u64().unwrap()).collect();
        for batch in acknowledged.lock().unwrap().iter() {
            assert!(stored.contains(batch), "cycle {cycle}: acknowledged batch {batch} lost");
        }
    }
    assert!(!acknowledged.lock().unwrap().is_empty(), "the writer wrote nothing");
}

/// Harper-style REST reads with curl: `select` picks fields, `sort` orders by fields (`-`
/// descending, missing values last, the id breaking ties), `offset` skips, `limit` cuts, over
/// the same conditions and index rule as every table read; the next page is named.
#[test]
fn rest_reads_select_sort_and_offset() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let (status, body) = sql(
        server.address,
        None,
        "CREATE TABLE products (id TEXT PRIMARY KEY, title TEXT, category TEXT, price DOUBLE PRECISION); \
         CREATE INDEX ON products (category)",
    );
    assert_eq!(status, 200, "{body}");
    for (id, row) in [
        ("p1", r#"{"title":"lamp","category":"home","price":20}"#),
        ("p2", r#"{"title":"desk","category":"home","price":150.5}"#),
        ("p3", r#"{"title":"rug","category":"home","price":20}"#),
        ("p4", r#"{"title":"vase","category":"home"}"#),
        ("p5", r#"{"title":"pen","category":"office","price":2}"#),
    ] {
        let (status, body) =
            curl(server.address, &format!("/tables/products/{id}"), &["-X", "PUT", "--data-binary", row]);
        assert!(status == 200 || status == 201, "{body}");
    }
    let get = |target: &str| -> (u16, Value) {
        let (status, body) = curl(server.address, target, &[]);
        (status, serde_json::from_str(&body).unwrap_or_else(|_| panic!("{target}: {body}")))
    };
    let (status, page) = get("/tables/products?category=home&select=title,price&sort=-price&limit=2");
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["rows"], json!([{"title": "desk", "price": 150.5}, {"title": "lamp", "price": 20}]));
    assert_eq!(page["next_offset"], json!(2));
    let (_, page) = get("/tables/products?category=home&select=title&sort=-price&limit=2&offset=2");
    assert_eq!(page["rows"], json!([{"title": "rug"}, {"title": "vase"}]), "ties by id, the missing price last");
    assert_eq!(page["next_offset"], Value::Null);
    let (_, page) = get("/tables/products?scan=true&sort=title&select=title&offset=1&limit=3");
    assert_eq!(page["rows"], json!([{"title": "lamp"}, {"title": "pen"}, {"title": "rug"}]));
    // Offset without sort pages in id order and names the next page's start.
    let (_, page) = get("/tables/products?category=home&offset=1&limit=2&select=title");
    assert_eq!(page["rows"], json!([{"title": "desk"}, {"title": "rug"}]));
    assert_eq!(page["next_after"], json!("p3"));
    // The index rule holds: a condition nothing indexes is refused with the index to make.
    let (status, refusal) = get("/tables/products?title=lamp&sort=price");
    assert_eq!(status, 400, "{refusal}");
    assert_eq!(refusal["error"]["code"], "unindexed_field", "{refusal}");
    let (status, refusal) = get("/tables/products?category=home&sort=-");
    assert_eq!(status, 400, "{refusal}");
    assert!(refusal["error"]["message"].as_str().unwrap().contains("names no field"), "{refusal}");
}

/// Declared relationships: `REFERENCES` in CREATE TABLE (checked: the table exists, its
/// primary key, the same type), and `?include=` nesting the referenced row and the rows that
/// reference this one, so a product page is one request; refusals name the missing
/// relationship or index; a referenced table is not dropped from under its references.
#[test]
fn relationships_nest_related_rows_in_one_read() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let (status, body) = sql(
        server.address,
        None,
        "CREATE TABLE categories (id TEXT PRIMARY KEY, name TEXT); \
         CREATE TABLE products (id TEXT PRIMARY KEY, title TEXT, category TEXT REFERENCES categories (id)); \
         CREATE TABLE reviews (id TEXT PRIMARY KEY, product TEXT, stars BIGINT, FOREIGN KEY (product) REFERENCES products); \
         CREATE INDEX ON reviews (product)",
    );
    assert_eq!(status, 200, "{body}");
    let put = |target: &str, row: &str| {
        let (status, body) = curl(server.address, target, &["-X", "PUT", "--data-binary", row]);
        assert!(status == 200 || status == 201, "{target}: {body}");
    };
    put("/tables/categories/c1", r#"{"name":"home"}"#);
    put("/tables/products/p1", r#"{"title":"lamp","category":"c1"}"#);
    put("/tables/products/p2", r#"{"title":"desk","category":"c9"}"#);
    put("/tables/reviews/r1", r#"{"product":"p1","stars":5}"#);
    put("/tables/reviews/r2", r#"{"product":"p1","stars":3}"#);
    put("/tables/reviews/r3", r#"{"product":"p2","stars":4}"#);
    let get = |target: &str| -> (u16, Value) {
        let (status, body) = curl(server.address, target, &[]);
        (status, serde_json::from_str(&body).unwrap_or_else(|_| panic!("{target}: {body}")))
    };
    let (status, page) = get("/tables/products/p1?include=category,reviews");
    assert_eq!(status, 200, "{page}");
    assert_eq!(
        page,
        json!({"id": "p1", "title": "lamp", "category": {"id": "c1", "name": "home"},
               "reviews": [{"id": "r1", "product": "p1", "stars": 5}, {"id": "r2", "product": "p1", "stars": 3}]})
    );
    // In a list, with select; a key no row has is null.
    let (status, page) = get("/tables/products?scan=true&include=category,reviews&select=title&sort=title");
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["rows"][0]["title"], "desk");
    assert_eq!(page["rows"][0]["category"], Value::Null);
    assert_eq!(page["rows"][0]["reviews"], json!([{"id": "r3", "product": "p2", "stars": 4}]));
    assert_eq!(page["rows"][1]["category"]["name"], "home");
    // What is refused, and why.
    let (status, refusal) = get("/tables/products/p1?include=owner");
    assert_eq!((status, refusal["error"]["code"].as_str()), (400, Some("unknown_relationship")), "{refusal}");
    assert!(refusal["error"]["message"].as_str().unwrap().contains("[category]"), "{refusal}");
    let (status, body) = sql(server.address, None, "DROP INDEX reviews_product_idx");
    assert_eq!(status, 200, "{body}");
    let (status, refusal) = get("/tables/products/p1?include=reviews");
    assert_eq!((status, refusal["error"]["code"].as_str()), (400, Some("unindexed_field")), "{refusal}");
    for (statement, wanted) in [
        ("CREATE TABLE bad (id TEXT PRIMARY KEY, x TEXT REFERENCES nowhere)", "there is no table nowhere"),
        ("CREATE TABLE bad (id TEXT PRIMARY KEY, x TEXT REFERENCES products (title))", "primary key"),
        ("CREATE TABLE bad (id TEXT PRIMARY KEY, x BIGINT REFERENCES products)", "has its key's type"),
        ("DROP TABLE products", "referenced by reviews.product"),
    ] {
        let (status, refusal) = sql(server.address, None, statement);
        assert_eq!(status, 400, "{statement}: {refusal}");
        assert!(refusal["error"]["message"].as_str().unwrap().contains(wanted), "{statement}: {refusal}");
    }
    let (status, tables) = sql(server.address, None, "SHOW TABLES");
    assert_eq!(status, 200);
    assert!(!tables.to_string().contains("\"bad\""), "nothing was created: {tables}");
    // The relationships survive a restart (they are in the catalog).
    drop(server);
    let server = dir.start(&[], &[]);
    let (status, page) = {
        let (status, body) = curl(server.address, "/tables/products/p1?include=category", &[]);
        (status, serde_json::from_str::<Value>(&body).unwrap())
    };
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["category"]["name"], "home");
}

/// POST /sql answering NDJSON (`Accept: application/x-ndjson`): a SELECT's rows go out as they
/// are found, so an answer larger than query_memory_max, which the JSON answer refuses, is
/// sent whole; a grouped query is answered whole and then sent the same way; refusals before
/// the first row keep their status.
#[test]
fn a_query_answered_as_ndjson_streams_past_what_one_answer_may_hold() {
    let dir = DataDir::new();
    let server =
        dir.start(&["--admin-user", ROOT.0, "--query-memory-max", "256KiB"], &[("ONEHOP_ADMIN_PASSWORD", ROOT.1)]);
    let address = server.address;
    sql_as(
        address,
        ROOT,
        "CREATE TABLE big (id TEXT PRIMARY KEY, n BIGINT, pad TEXT); CREATE USER alice PASSWORD 'alice-pass'",
    );
    let pad = "x".repeat(200);
    for chunk in 0..10 {
        let values: Vec<String> =
            (0..300).map(|i| chunk * 300 + i).map(|n| format!("('r{n:04}', {n}, '{pad}')")).collect();
        sql_as(address, ROOT, &format!("INSERT INTO big (id, n, pad) VALUES {}", values.join(", ")));
    }
    // As one JSON answer, 3 000 rows of 200 bytes are more than the query may hold.
    let (status, answer) = sql(address, Some(ROOT), "SELECT id, pad FROM big");
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "query_limit", "{answer}");

    let ndjson = |user: (&str, &str), statement: &str| -> (u16, Vec<Value>) {
        let credentials = format!("{}:{}", user.0, user.1);
        let args = ["-X", "POST", "-u", &credentials, "-H", "accept: application/x-ndjson", "--data-binary", statement];
        let (status, body) = curl(address, "/sql", &args);
        let lines = body
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("{statement}: not a JSON line: {line}")))
            .collect();
        (status, lines)
    };
    let (status, lines) = ndjson(ROOT, "SELECT id, n, pad FROM big");
    assert_eq!(status, 200, "{lines:?}");
    assert_eq!(lines[0], json!({"columns": ["id", "n", "pad"], "types": ["text", "bigint", "text"]}));
    assert_eq!(lines.len(), 3002);
    assert_eq!(lines[3001], json!({"rows": 3000}));
    let mut ids: Vec<&str> = lines[1..3001].iter().map(|row| row[0].as_str().unwrap()).collect();
    assert!(lines[1..3001].iter().all(|row| row[2] == json!(pad)));
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3000);

    // No row: the columns, as text.
    let (status, lines) = ndjson(ROOT, "SELECT id FROM big WHERE n < 0");
    assert_eq!(status, 200, "{lines:?}");
    assert_eq!(lines, [json!({"columns": ["id"], "types": ["text"]}), json!({"rows": 0})]);

    let (status, lines) = ndjson(ROOT, "SELECT n FROM big WHERE n >= 100 LIMIT 5 OFFSET 2");
    assert_eq!(status, 200, "{lines:?}");
    assert_eq!(lines.len(), 7, "{lines:?}");
    assert!(lines[1..6].iter().all(|row| row[0].as_i64().is_some_and(|n| n >= 100)), "{lines:?}");
    assert_eq!(lines[6], json!({"rows": 5}));

    // Subqueries answer into the outer query, not into the stream.
    let (status, lines) = ndjson(
        ROOT,
        "SELECT id, (SELECT COUNT(*) FROM big) AS total FROM big WHERE n IN (SELECT n FROM big WHERE n < 3)",
    );
    assert_eq!(status, 200, "{lines:?}");
    let mut found: Vec<Value> = lines[1..lines.len() - 1].to_vec();
    found.sort_by_key(|row| row[0].as_str().unwrap().to_string());
    assert_eq!(lines[0], json!({"columns": ["id", "total"], "types": ["text", "bigint"]}));
    assert_eq!(found, [json!(["r0000", 3000]), json!(["r0001", 3000]), json!(["r0002", 3000])]);
    assert_eq!(lines[lines.len() - 1], json!({"rows": 3}));

    let (status, lines) = ndjson(ROOT, "SELECT n % 3 AS m, COUNT(*) AS c FROM big GROUP BY n % 3 ORDER BY m");
    assert_eq!(status, 200, "{lines:?}");
    assert_eq!(
        lines,
        [
            json!({"columns": ["m", "c"], "types": ["bigint", "bigint"]}),
            json!([0, 1000]),
            json!([1, 1000]),
            json!([2, 1000]),
            json!({"rows": 3})
        ]
    );

    // Refused before any row: with the status and body of any refusal.
    let (status, lines) = ndjson(ROOT, "SELECT * FROM nowhere");
    assert_eq!(status, 400, "{lines:?}");
    assert!(lines[0]["error"]["message"].as_str().unwrap().contains("nowhere"), "{lines:?}");
    let (status, lines) = ndjson(ROOT, "DELETE FROM big");
    assert_eq!(status, 400, "{lines:?}");
    assert!(lines[0]["error"]["message"].as_str().unwrap().contains("not a query"), "{lines:?}");
    let (status, lines) = ndjson(ROOT, "SELECT 1; SELECT 2");
    assert_eq!(status, 400, "{lines:?}");
    let (status, lines) = ndjson(ALICE, "SELECT id FROM big");
    assert_eq!(status, 403, "{lines:?}");
    let (_, answer) = sql(address, Some(ROOT), "SELECT COUNT(*) FROM big");
    assert_eq!(rows(&answer), &vec![json!([3000])]);
}
