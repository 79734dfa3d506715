//! Joined views through the real binary, across `kill -9`: writes over HTTP to the inputs of a
//! four-input joined view and of a view aggregating that join, the server killed at a random
//! instant while they go on, 50 times; after every restart each acknowledged write is in its
//! table and each view, once it has loaded its inputs again, is row for row its own SELECT
//! evaluated by the query engine; and its change stream, read over Kafka, ends on those rows
//! (what a kill kept it from writing is written at the restart).

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{DataDir, get, request, sql};
use onehop_bench::plan::Rng;
use serde_json::{Value, json};

const SCHEMA: &str = "CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT); \
     CREATE TABLE products (id TEXT PRIMARY KEY, title TEXT); \
     CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT, product TEXT, qty BIGINT); \
     CREATE TABLE shipments (id TEXT PRIMARY KEY, order_id TEXT, carrier TEXT)";
const QUERY: &str = "SELECT o.id AS order_id, o.qty, c.name, p.title, s.carrier \
     FROM orders o JOIN customers c ON c.id = o.customer LEFT JOIN products p ON p.id = o.product \
     LEFT JOIN shipments s ON s.order_id = o.id";
/// The same join, aggregated per customer name (a rename moves the customer's rows).
const GROUPED: &str = "SELECT c.name, COUNT(*) AS n, SUM(o.qty) AS qty, COUNT(s.carrier) AS shipped \
     FROM orders o JOIN customers c ON c.id = o.customer LEFT JOIN shipments s ON s.order_id = o.id \
     GROUP BY c.name";
const VIEWS: [(&str, &str); 2] = [("enriched", QUERY), ("per_name", GROUPED)];
const CYCLES: u64 = 50;

/// One write: a row put into a table (`None`: deleted).
fn write(rng: &mut Rng, step: u64) -> (&'static str, String, Option<Value>) {
    let id = rng.below(12);
    match rng.below(10) {
        0 | 1 => ("customers", format!("c{id}"), Some(json!({"name": format!("customer {id} v{step}")}))),
        2 => ("products", format!("p{id}"), Some(json!({"title": format!("product {id} v{step}")}))),
        3 => {
            ("shipments", format!("s{id}"), Some(json!({"order_id": format!("o{}", rng.below(12)), "carrier": "dhl"})))
        }
        4 => ("orders", format!("o{id}"), None),
        _ => {
            let row = json!({"customer": format!("c{}", rng.below(12)), "product": format!("p{}", rng.below(14)), "qty": step});
            ("orders", format!("o{id}"), Some(row))
        }
    }
}

/// Every row of `table`, by id, as the server has it.
fn table_rows(address: SocketAddr, table: &str) -> BTreeMap<String, Value> {
    let (status, body) = get(address, &format!("/tables/{table}?limit=10000"));
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let mut row = row.clone();
            let id = row.as_object_mut().unwrap().remove("id").unwrap();
            (id.as_str().unwrap().to_string(), row)
        })
        .collect()
}

/// The query's rows from scratch, each as JSON text, sorted.
fn from_scratch(address: SocketAddr, query: &str) -> Vec<String> {
    let answer: Value = serde_json::from_str(&sql(address, query)).unwrap();
    let result = answer["results"].as_array().unwrap().last().unwrap().clone();
    let columns: Vec<String> =
        result["columns"].as_array().unwrap().iter().map(|column| column.as_str().unwrap().to_string()).collect();
    let mut rows: Vec<String> = result["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let values = row.as_array().unwrap().iter().cloned();
            Value::Object(columns.iter().cloned().zip(values).collect()).to_string()
        })
        .collect();
    rows.sort();
    rows
}

/// The view's rows, each as JSON text, sorted, once it has loaded its inputs and equals its
/// query (20 s at most).
fn settled(address: SocketAddr, view: &str, query: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let expected = from_scratch(address, query);
        let (status, body) = get(address, &format!("/views/{view}?limit=10000"));
        assert_eq!(status, 200, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        let mut rows: Vec<String> = body["keys"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|entry| entry["rows"].as_array().unwrap().clone())
            .map(|row| {
                let mut row = row;
                row.as_object_mut().unwrap().remove("final");
                row.to_string()
            })
            .collect();
        rows.sort();
        if body["status"]["restoring"] == false && rows == expected {
            return rows;
        }
        assert!(Instant::now() < deadline, "{view} did not settle:\n  view:  {rows:?}\n  query: {expected:?}");
        std::thread::sleep(Duration::from_millis(30));
    }
}

/// The newest change of each key in the view's change stream (read over Kafka) is `rows` (as
/// `settled` gives them), once the stream has caught up (20 s at most); a key whose newest
/// change removed it has no row.
fn changes_end_on(kafka: SocketAddr, view: &str, rows: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut newest: BTreeMap<String, Value> = BTreeMap::new();
        for (key, mut row) in common::view_changes_over_kafka(kafka, view) {
            let fields = row.as_object_mut().unwrap();
            fields.remove("final");
            fields.remove("before");
            if fields.remove("removed").is_some() {
                newest.remove(&key);
            } else {
                newest.insert(key, row);
            }
        }
        let mut ended: Vec<String> = newest.values().map(Value::to_string).collect();
        ended.sort();
        if ended == rows {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the change stream of {view} ends elsewhere:\n  changes: {ended:?}\n  view:    {rows:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_joined_view_after_kill_9_at_random_instants_equals_its_query() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    sql(server.address, SCHEMA);
    for (view, query) in VIEWS {
        sql(server.address, &format!("CREATE VIEW {view} AS {query}"));
    }
    let mut rng = Rng::new(0x0000_05ee_d50f_c4a5, 0);
    // What each table must hold: the acknowledged writes; the one a kill cut short may be
    // either its old or its new row.
    let mut model: BTreeMap<&str, BTreeMap<String, Value>> = BTreeMap::new();
    let mut step = 0u64;
    let mut rows_seen = [0usize; VIEWS.len()];
    for cycle in 0..CYCLES {
        let killer = server.kill_9_after(Duration::from_millis(20 + u64::from(rng.below(200))));
        let (cut_table, cut_id, cut_row) = loop {
            step += 1;
            let (table, id, row) = write(&mut rng, step);
            let (method, body) = match &row {
                Some(row) => ("PUT", row.to_string()),
                None => ("DELETE", String::new()),
            };
            match request(server.address, method, &format!("/tables/{table}/{id}"), &body) {
                Some((status, _)) if (200..300).contains(&status) || (method == "DELETE" && status == 404) => {
                    let rows = model.entry(table).or_default();
                    match row {
                        Some(row) => rows.insert(id, row),
                        None => rows.remove(&id),
                    };
                }
                Some((status, body)) => panic!("{method} /tables/{table}/{id}: {status} {body}"),
                None => break (table, id, row),
            }
        };
        killer.join().unwrap();
        server.kill_9();
        server = dir.start(&[], &[]);
        // The write the kill cut short may have landed: take the server's word for that row.
        for table in ["customers", "products", "orders", "shipments"] {
            let mut stored = table_rows(server.address, table);
            let expected = model.entry(table).or_default();
            if cut_table == table {
                let (id, row) = (&cut_id, &cut_row);
                let now = stored.get(id);
                assert!(
                    now == expected.get(id) || now == row.as_ref(),
                    "cycle {cycle}: {table}/{id} is {now:?}: neither its acknowledged row nor the cut write"
                );
                match stored.remove(id) {
                    Some(row) => expected.insert(id.clone(), row),
                    None => expected.remove(id),
                };
                stored.extend(expected.get(id).map(|row| (id.clone(), row.clone())));
            }
            assert_eq!(&stored, expected, "cycle {cycle}: every acknowledged write of {table} is there");
        }
        for (at, (view, query)) in VIEWS.into_iter().enumerate() {
            let rows = settled(server.address, view, query);
            rows_seen[at] = rows_seen[at].max(rows.len());
            if cycle % 10 == 9 {
                changes_end_on(server.kafka_address.unwrap(), view, &rows);
            }
        }
    }
    assert!(rows_seen.iter().all(|&seen| seen > 3), "the views had rows to compare: {rows_seen:?}");
    assert!(step > CYCLES * 3, "writes went on between the kills: {step} in {CYCLES} cycles");
}

#[test]
fn a_view_list_read_filters_by_any_column_and_pages_on() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    sql(server.address, SCHEMA);
    for (view, query) in VIEWS {
        sql(server.address, &format!("CREATE VIEW {view} AS {query}"));
    }
    for (id, name) in [("c1", "Ada"), ("c2", "Bo")] {
        let (status, body) =
            request(server.address, "PUT", &format!("/tables/customers/{id}"), &json!({"name": name}).to_string())
                .unwrap();
        assert!((200..300).contains(&status), "{body}");
    }
    for i in 0..5 {
        let row = json!({"customer": if i % 2 == 0 { "c1" } else { "c2" }, "product": "p1", "qty": i});
        let (status, body) = request(server.address, "PUT", &format!("/tables/orders/o{i}"), &row.to_string()).unwrap();
        assert!((200..300).contains(&status), "{body}");
    }
    let keys = |body: &Value| -> Vec<String> {
        body["keys"].as_array().unwrap().iter().map(|entry| entry["key"].as_str().unwrap().to_string()).collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (status, body) = get(server.address, "/views/enriched?name=Ada");
        assert_eq!(status, 200, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        if keys(&body).len() == 3 {
            break body;
        }
        assert!(Instant::now() < deadline, "{body}");
        std::thread::sleep(Duration::from_millis(30));
    };
    assert_eq!(keys(&body), ["o0:", "o2:", "o4:"]);
    assert!(body["keys"][0]["rows"][0]["name"] == "Ada" && body["next_after"].is_null(), "{body}");
    // Two filters, a number by its text, and pages of one key.
    let (_, body) = get(server.address, "/views/enriched?name=Ada&qty=2");
    assert_eq!(keys(&serde_json::from_str(&body).unwrap()), ["o2:"]);
    // Pages of one key, each going on from the `next_after` the one before gave.
    let (mut seen, mut path) = (Vec::new(), "/views/enriched?name=Bo&limit=1".to_string());
    loop {
        let (_, body) = get(server.address, &path);
        let body: Value = serde_json::from_str(&body).unwrap();
        seen.extend(keys(&body));
        let Some(next) = body["next_after"].as_str() else { break };
        assert!(seen.len() <= 2, "{body}");
        path = format!("/views/enriched?name=Bo&limit=1&after={}", next.replace(':', "%3A"));
    }
    assert_eq!(seen, ["o1:", "o3:"]);
    let (_, body) = get(server.address, "/views/enriched?nothing=1");
    assert!(keys(&serde_json::from_str(&body).unwrap()).is_empty(), "a column no row has matches none");
}
