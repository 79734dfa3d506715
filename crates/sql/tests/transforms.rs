//! Stateless transforms end to end on a real engine: `CREATE STREAM … AS SELECT` backfills and
//! then follows its source, computes values, keys and subjects, is listed and described, keeps
//! its place across a restart, guards its source against a drop, and is dropped with its stream;
//! `CROSS JOIN UNNEST` splits records (word count, with a view counting the words), `UNION ALL`
//! merges streams and `value_format = 'text'` reads and writes plain text.

mod common;

use std::time::{Duration, Instant};

use common::{close, fresh, open, run};
use onehop_engine::{Engine, Position};
use onehop_log::{NewRecord, Record};
use onehop_sql::Output;
use serde_json::{Value, json};

async fn publish(engine: &Engine, stream: &str, values: &[Value]) {
    let records: Vec<NewRecord> =
        values.iter().map(|value| NewRecord::value(serde_json::to_vec(value).unwrap())).collect();
    engine.stream(stream).unwrap().publish(&records, None).await.unwrap();
}

/// Every record of `stream`, partition by partition, once it holds `count` (10 s at most).
async fn records(engine: &Engine, stream: &str, count: usize) -> Vec<Record> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stream = engine.stream(stream).unwrap();
        let mut all = Vec::new();
        for partition in 0..stream.partition_count() {
            all.extend(stream.read(partition, Position::Earliest, 100_000, usize::MAX).unwrap());
        }
        if all.len() >= count {
            assert_eq!(all.len(), count, "more records than expected");
            return all;
        }
        assert!(Instant::now() < deadline, "{} of {count} records arrived", all.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn order(i: usize) -> Value {
    let region = ["eu", "us", "ap"][i % 3];
    json!({ "id": format!("o{i}"), "amount": (i * 37) % 200, "region": region, "name": "widget" })
}

/// What the transform below makes of `order(i)`, or `None` when its filter skips it.
fn transformed(i: usize) -> Option<(String, String, Value)> {
    let order = order(i);
    let amount = order["amount"].as_u64().unwrap();
    if amount <= 100 {
        return None;
    }
    let mut value = order.clone();
    value["name"] = json!("WIDGET");
    value["cents"] = json!(amount * 100);
    let region = order["region"].as_str().unwrap();
    Some((format!("o{i}"), format!("orders/{region}"), value))
}

const TRANSFORM: &str = "CREATE STREAM orders WITH (partitions = 2); \
    CREATE STREAM big WITH (partitions = 3, start = 'earliest') AS \
    SELECT *, UPPER(name) AS name, amount * 100 AS cents, id AS _key, 'orders/' || region AS _subject \
    FROM orders WHERE amount > 100";

/// The output's records by key, as (subject, value); checks each names its source record.
fn by_key(records: &[Record], source: &Engine) -> std::collections::BTreeMap<String, (String, Value)> {
    let orders = source.stream("orders").unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for record in records {
        let key = String::from_utf8(record.key.clone().unwrap().to_vec()).unwrap();
        let value: Value = serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
        // The header names the source record, which has the same timestamp and id.
        let source = onehop_engine::view::transform::SourcePosition::of(record).unwrap();
        assert_eq!((source.branch, source.element), (0, None));
        let origin = orders.read(source.partition, Position::Offset(source.offset), 1, usize::MAX).unwrap().remove(0);
        let origin_value: Value = serde_json::from_slice(origin.value.as_deref().unwrap()).unwrap();
        assert_eq!(origin_value["id"], value["id"]);
        assert_eq!(origin.timestamp_ms, record.timestamp_ms);
        let previous = seen.insert(key.clone(), (record.subject.as_deref().unwrap().to_string(), value));
        assert!(previous.is_none(), "{key} written twice");
    }
    seen
}

fn expected(count: usize) -> std::collections::BTreeMap<String, (String, Value)> {
    (0..count).filter_map(transformed).map(|(key, subject, value)| (key, (subject, value))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_backfills_follows_restarts_and_drops() {
    let (dir, engine) = fresh();
    run(&engine, "CREATE STREAM orders WITH (partitions = 2)").await.unwrap();
    let history: Vec<Value> = (0..300).map(order).collect();
    for chunk in history.chunks(50) {
        publish(&engine, "orders", chunk).await;
    }
    // start = 'earliest': what the source holds already is transformed too.
    let outputs = run(&engine, TRANSFORM).await.unwrap();
    assert!(matches!(&outputs[1], Output::Created { definition, .. } if definition.contains("UPPER(name)")));
    let count = expected(300).len();
    let records_now = records(&engine, "big", count).await;
    assert_eq!(by_key(&records_now, &engine), expected(300));
    // Each key in its partition, as for any keyed publish.
    let big = engine.stream("big").unwrap();
    for partition in 0..3 {
        for record in big.read(partition, Position::Earliest, 10_000, usize::MAX).unwrap() {
            assert_eq!(big.partition_for_key(record.key.as_deref().unwrap()), partition);
        }
    }

    // Live records follow.
    let live: Vec<Value> = (300..400).map(order).collect();
    publish(&engine, "orders", &live).await;
    let records_now = records(&engine, "big", expected(400).len()).await;
    assert_eq!(by_key(&records_now, &engine), expected(400));

    // Listed, described, and the same statement again changes nothing.
    let Output::Rows { columns, rows, .. } = run(&engine, "SHOW TRANSFORMS").await.unwrap().remove(0) else {
        panic!("rows expected")
    };
    let row: serde_json::Map<String, Value> = columns.into_iter().zip(rows[0].clone()).collect();
    assert_eq!(row["name"], "big");
    assert_eq!(row["source"], "orders");
    assert_eq!(row["records_in"], 400);
    assert_eq!(row["records_out"], expected(400).len());
    assert_eq!(row["filtered"], 400 - expected(400).len());
    assert_eq!(row["restoring"], false);
    let Output::Rows { columns, rows, .. } = run(&engine, "DESCRIBE big").await.unwrap().remove(0) else {
        panic!("rows expected")
    };
    let row: serde_json::Map<String, Value> = columns.into_iter().zip(rows[0].clone()).collect();
    assert_eq!(row["partitions"], 3);
    assert!(row["computed_by"].as_str().unwrap().starts_with("CREATE STREAM big WITH"), "{row:?}");
    let again = run(&engine, &TRANSFORM.replace("CREATE STREAM orders WITH (partitions = 2); ", "")).await.unwrap();
    assert!(matches!(&again[0], Output::Unchanged { .. }), "{again:?}");
    let other = run(&engine, "CREATE STREAM big AS SELECT id FROM orders").await.unwrap_err();
    assert_eq!(other.code(), "stream_exists", "{other}");
    let kept = run(&engine, "CREATE STREAM IF NOT EXISTS big AS SELECT id FROM orders").await.unwrap();
    assert!(matches!(&kept[0], Output::Unchanged { .. }), "{kept:?}");

    // The source cannot be dropped while the transform reads it.
    let error = run(&engine, "DROP STREAM orders").await.unwrap_err();
    assert_eq!(error.code(), "in_use");
    assert!(error.to_string().contains("DROP STREAM big"), "{error}");

    // A restart carries on where the transform was: nothing again, nothing missed.
    close(engine).await;
    let engine = open(dir.path());
    let more: Vec<Value> = (400..500).map(order).collect();
    publish(&engine, "orders", &more).await;
    let records_now = records(&engine, "big", expected(500).len()).await;
    assert_eq!(by_key(&records_now, &engine), expected(500));

    // Dropping the stream drops the transform; then the source can go, and the name is free.
    run(&engine, "DROP STREAM big; DROP STREAM orders").await.unwrap();
    assert!(engine.transforms().is_empty());
    close(engine).await;
    let engine = open(dir.path());
    assert!(engine.transforms().is_empty() && engine.streams().is_empty());
    run(&engine, "CREATE STREAM big").await.unwrap();
    close(engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_starts_at_the_end_by_default_and_passes_what_is_not_json() {
    let (_dir, engine) = fresh();
    run(&engine, "CREATE STREAM raw").await.unwrap();
    publish(&engine, "raw", &[json!({"n": 1})]).await;
    run(&engine, "CREATE STREAM copy AS SELECT *, n + 1 AS next, key AS key_seen FROM raw").await.unwrap();
    // Not JSON: its fields are none, so the computed ones are null.
    let raw = engine.stream("raw").unwrap();
    let mut keyed = NewRecord::keyed(bytes::Bytes::from_static(b"k1"), b"not json".to_vec());
    keyed.subject = Some("raw/a".into());
    raw.publish(&[keyed, NewRecord::value(serde_json::to_vec(&json!({"n": 41})).unwrap())], None).await.unwrap();
    let out = records(&engine, "copy", 2).await;
    let values: Vec<Value> =
        out.iter().map(|record| serde_json::from_slice(record.value.as_deref().unwrap()).unwrap()).collect();
    assert_eq!(values, [json!({"next": null, "key_seen": "k1"}), json!({"n": 41, "next": 42, "key_seen": null})]);
    // No `_key` or `_subject` column: the source's key and subject are kept.
    assert_eq!(out[0].key.as_deref(), Some(&b"k1"[..]));
    assert_eq!(out[0].subject.as_deref(), Some("raw/a"));
    close(engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_transforms_are_refused_and_define_nothing() {
    let (_dir, engine) = fresh();
    run(&engine, "CREATE STREAM s; CREATE TABLE t (id TEXT PRIMARY KEY)").await.unwrap();
    for (sql, code) in [
        ("CREATE STREAM out AS SELECT * FROM nowhere", "unknown_stream"),
        ("CREATE STREAM out AS SELECT * FROM t", "invalid_definition"),
        ("CREATE STREAM s AS SELECT * FROM s", "sql_invalid_query"),
        ("CREATE STREAM t2 AS SELECT COUNT(*) AS n FROM s", "sql_unsupported"),
        ("CREATE STREAM out AS SELECT a FROM s GROUP BY a", "sql_unsupported"),
        ("CREATE STREAM out WITH (start = 'now') AS SELECT * FROM s", "sql_invalid_option"),
        ("CREATE STREAM plain WITH (start = 'earliest')", "sql_invalid_option"),
        ("CREATE STREAM s AS SELECT * FROM s2", "stream_exists"),
        ("CREATE STREAM t AS SELECT * FROM s", "name_taken"),
    ] {
        if sql.contains("FROM s2") {
            run(&engine, "CREATE STREAM s2").await.unwrap();
        }
        let error = run(&engine, sql).await.unwrap_err();
        assert_eq!(error.code(), code, "{sql}: {error}");
    }
    assert!(engine.transforms().is_empty());
    let names: Vec<String> = engine.streams().iter().map(|stream| stream.name().to_string()).collect();
    assert_eq!(names, ["s", "s2"]);
    close(engine).await;
}

async fn publish_text(engine: &Engine, stream: &str, lines: &[&str]) {
    let records: Vec<NewRecord> = lines.iter().map(|line| NewRecord::value(line.as_bytes().to_vec())).collect();
    engine.stream(stream).unwrap().publish(&records, None).await.unwrap();
}

/// A view's rows as `(key, row)`, once it has `count` keys (10 s at most).
async fn view_rows(engine: &Engine, view: &str, count: usize) -> std::collections::BTreeMap<String, Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let page = engine.view(view).unwrap().page(None, usize::MAX);
        if page.len() >= count && !engine.view(view).unwrap().status().restoring {
            return page.into_iter().map(|(key, mut rows)| (key, rows.remove(0))).collect();
        }
        assert!(Instant::now() < deadline, "{} of {count} rows of {view}", page.len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Word count in SQL: lines of plain text split into words (1 → N), the words counted by a
/// view; each word record names its line and its place in it, and survives a restart once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn word_count_is_a_transform_with_unnest_and_a_view() {
    let (dir, engine) = fresh();
    let lines = ["The cat sat", "the dog  sat down", "", "Cat", "a b c d e f g"];
    run(&engine, "CREATE STREAM lines WITH (partitions = 2)").await.unwrap();
    publish_text(&engine, "lines", &lines).await;
    run(
        &engine,
        "CREATE STREAM words WITH (partitions = 3, start = 'earliest') AS \
         SELECT word AS _key, word, n FROM lines \
         CROSS JOIN UNNEST(REGEXP_SPLIT_TO_ARRAY(LOWER(value), '\\s+')) WITH ORDINALITY AS w(word, n) \
         WHERE LENGTH(word) > 0; \
         CREATE VIEW word_counts WITH (start = 'earliest') AS SELECT word, COUNT(*) AS count FROM words GROUP BY word",
    )
    .await
    .unwrap();
    let mut expected = std::collections::BTreeMap::<String, u64>::new();
    let mut total = 0;
    for line in lines {
        for word in line.to_lowercase().split_whitespace() {
            *expected.entry(word.to_string()).or_default() += 1;
            total += 1;
        }
    }
    let words = records(&engine, "words", total).await;
    let source = engine.stream("lines").unwrap();
    let mut seen = std::collections::HashSet::new();
    for record in &words {
        let value: Value = serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
        let position = onehop_engine::view::transform::SourcePosition::of(record).unwrap();
        assert!(seen.insert(position), "{position} written twice");
        let line = source.read(position.partition, Position::Offset(position.offset), 1, usize::MAX).unwrap().remove(0);
        let line = String::from_utf8(line.value.unwrap().to_vec()).unwrap().to_lowercase();
        let n = value["n"].as_u64().unwrap();
        // The element and its position: the regex splits "dog  sat" on the whole run of spaces.
        assert_eq!(line.split_whitespace().nth(n as usize - 1), value["word"].as_str());
        assert_eq!(position.element, Some(n as u32 - 1));
        assert_eq!(record.key.as_deref(), value["word"].as_str().map(str::as_bytes));
    }
    let counts = view_rows(&engine, "word_counts", expected.len()).await;
    let counted: std::collections::BTreeMap<String, u64> =
        counts.into_iter().map(|(word, row)| (word, row["count"].as_u64().unwrap())).collect();
    assert_eq!(counted, expected);

    // Live lines count on; a restart writes nothing twice.
    publish_text(&engine, "lines", &["cat CAT"]).await;
    records(&engine, "words", total + 2).await;
    close(engine).await;
    let engine = open(dir.path());
    publish_text(&engine, "lines", &["dog"]).await;
    records(&engine, "words", total + 3).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while view_rows(&engine, "word_counts", 0).await["cat"]["count"] != 4 {
        assert!(Instant::now() < deadline, "the count of cat did not reach 4");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    close(engine).await;
}

/// Two streams merged by UNION ALL, split into tags, re-keyed and routed by priority into
/// three streams with one WHERE each (study 5's first path), and a text stream upper-cased into
/// text (its stateless scenario).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn union_all_merges_streams_and_outputs_route_by_a_field() {
    let (_dir, engine) = fresh();
    run(
        &engine,
        "CREATE STREAM users; CREATE STREAM products WITH (partitions = 2); \
         CREATE STREAM tagged WITH (partitions = 2, start = 'earliest') AS \
         SELECT 'user' AS kind, id, tag, priority, tag AS _key FROM users CROSS JOIN UNNEST(tags) AS tag \
         UNION ALL SELECT 'product', sku, t, CASE WHEN stock < 5 THEN 'high' ELSE 'low' END, t AS _key \
         FROM products CROSS JOIN UNNEST(labels) AS t; \
         CREATE STREAM high WITH (start = 'earliest') AS SELECT * FROM tagged WHERE priority = 'high'; \
         CREATE STREAM low WITH (start = 'earliest') AS SELECT * FROM tagged WHERE priority = 'low'; \
         CREATE STREAM other WITH (start = 'earliest') AS SELECT * FROM tagged \
         WHERE priority IS NULL OR priority NOT IN ('high', 'low')",
    )
    .await
    .unwrap();
    publish(
        &engine,
        "users",
        &[
            json!({"id": "u1", "tags": ["a", "b"], "priority": "high"}),
            json!({"id": "u2", "tags": ["c"]}),
            json!({"id": "u3", "tags": "not an array", "priority": "high"}),
        ],
    )
    .await;
    publish(
        &engine,
        "products",
        &[json!({"sku": "p1", "labels": ["a"], "stock": 2}), json!({"sku": "p2", "labels": ["x", "y"], "stock": 9})],
    )
    .await;
    let summary = |records: Vec<Record>| -> Vec<String> {
        let mut summary: Vec<String> = records
            .iter()
            .map(|record| {
                let value: Value = serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
                let key = String::from_utf8(record.key.clone().unwrap().to_vec()).unwrap();
                format!("{key}:{}:{}", value["kind"].as_str().unwrap(), value["id"].as_str().unwrap())
            })
            .collect();
        summary.sort();
        summary
    };
    // The second SELECT's columns take the first's names; each branch keys its records.
    assert_eq!(summary(records(&engine, "tagged", 6).await).len(), 6);
    assert_eq!(summary(records(&engine, "high", 3).await), ["a:product:p1", "a:user:u1", "b:user:u1"]);
    assert_eq!(summary(records(&engine, "low", 2).await), ["x:product:p2", "y:product:p2"]);
    assert_eq!(summary(records(&engine, "other", 1).await), ["c:user:u2"]);
    // The merged records name their branch: products' are the second SELECT's.
    for record in records(&engine, "tagged", 6).await {
        let value: Value = serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
        let position = onehop_engine::view::transform::SourcePosition::of(&record).unwrap();
        assert_eq!(position.branch, if value["kind"] == "user" { 0 } else { 1 });
    }
    let Output::Rows { rows, .. } = run(&engine, "SHOW TRANSFORMS").await.unwrap().pop().unwrap() else { panic!() };
    assert!(rows.iter().any(|row| row[0] == "tagged" && row[1] == "users, products"), "{rows:?}");
    // Neither source can be dropped while the merge reads it.
    assert_eq!(run(&engine, "DROP STREAM products").await.unwrap_err().code(), "in_use");

    // Text in, text out: 1 KB lines upper-cased, those longer than 5 characters kept.
    run(
        &engine,
        "CREATE STREAM texts; CREATE STREAM shouted WITH (value_format = 'text', start = 'earliest') AS \
         SELECT UPPER(value) AS line FROM texts WHERE LENGTH(value) > 5",
    )
    .await
    .unwrap();
    let long = "x".repeat(1024);
    publish_text(&engine, "texts", &["short", "hello world", "{\"json\": true}", &long]).await;
    let shouted: Vec<Vec<u8>> =
        records(&engine, "shouted", 2).await.into_iter().map(|record| record.value.unwrap().to_vec()).collect();
    assert_eq!(shouted, [b"HELLO WORLD".to_vec(), long.to_uppercase().into_bytes()]);
    close(engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_unnests_and_unions_are_refused_and_define_nothing() {
    let (_dir, engine) = fresh();
    run(&engine, "CREATE STREAM s; CREATE TABLE t (id TEXT PRIMARY KEY)").await.unwrap();
    for (sql, fragment) in [
        ("CREATE STREAM o AS SELECT * FROM s UNION ALL SELECT * FROM nowhere", "nowhere"),
        ("CREATE STREAM o AS SELECT * FROM s UNION ALL SELECT * FROM t", "is a table"),
        ("CREATE STREAM o AS SELECT w FROM s CROSS JOIN UNNEST(LENGTH(a)) AS w", "never is one"),
        ("CREATE STREAM o WITH (value_format = 'text') AS SELECT a, b FROM s", "exactly one"),
        ("CREATE STREAM o WITH (value_format = 'text') AS SELECT * FROM s", "exactly one"),
        ("CREATE STREAM o WITH (value_format = 'yaml') AS SELECT a FROM s", "expected 'json'"),
        ("CREATE STREAM o WITH (value_format = 'text')", "applies to a stream computed by a transform"),
    ] {
        let error = run(&engine, sql).await.unwrap_err();
        assert!(error.to_string().contains(fragment), "{sql}: {error}");
    }
    assert!(engine.transforms().is_empty());
    close(engine).await;
}

/// The examples of "Splitting, merging and text" run as written and do what the page says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_splitting_and_merging_examples_of_the_docs_run() {
    let (_dir, engine) = fresh();
    let blocks = common::sql_blocks("sql.md", "### Splitting, merging and text");
    assert_eq!(blocks.len(), 3);
    for block in &blocks {
        run(&engine, block).await.unwrap_or_else(|error| panic!("{block}\n{error}"));
    }
    publish_text(&engine, "lines", &["to be or not to be"]).await;
    let counts = view_rows(&engine, "word_counts", 4).await;
    assert_eq!(counts["to"]["count"], 2);
    assert_eq!(counts["be"]["count"], 2);
    publish(&engine, "user_events", &[json!({"id": "u1", "tags": ["a"], "priority": "high"})]).await;
    publish(&engine, "product_updates", &[json!({"sku": "p1", "labels": ["b", "c"], "stock": 40})]).await;
    assert_eq!(records(&engine, "urgent", 1).await[0].key.as_deref(), Some(&b"a"[..]));
    assert_eq!(records(&engine, "routine", 2).await.len(), 2);
    publish_text(&engine, "sentences", &["hi", "hello there"]).await;
    assert_eq!(records(&engine, "shouted", 1).await[0].value.as_deref(), Some(&b"HELLO THERE"[..]));
    close(engine).await;
}

async fn publish_keyed(engine: &Engine, stream: &str, records: &[(&str, Value)]) {
    let records: Vec<NewRecord> = records
        .iter()
        .map(|(key, value)| NewRecord::keyed(key.as_bytes().to_vec(), serde_json::to_vec(value).unwrap()))
        .collect();
    engine.stream(stream).unwrap().publish(&records, None).await.unwrap();
}

/// The values of `records`, by their `id` field.
fn values_by_id(records: &[Record]) -> std::collections::BTreeMap<String, Value> {
    let mut values = std::collections::BTreeMap::new();
    for record in records {
        let value: Value = serde_json::from_slice(record.value.as_deref().unwrap()).unwrap();
        let id = value["id"].as_str().unwrap().to_string();
        assert!(values.insert(id.clone(), value).is_none(), "{id} written twice");
    }
    values
}

/// Enrichment: each order joined with its customer (inner: an order of no known customer is
/// left out) and the customer's region (left: null without one), by primary key, as the tables
/// hold them when the order is read; a table it reads cannot be dropped, and a restart writes
/// nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transform_enriches_records_with_table_rows() {
    let (dir, engine) = fresh();
    run(
        &engine,
        "CREATE TABLE regions (id TEXT PRIMARY KEY, label TEXT); \
         CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT, region TEXT, tier BIGINT); \
         INSERT INTO regions (id, label) VALUES ('eu', 'Europe'); \
         INSERT INTO customers (id, name, region, tier) VALUES ('c1', 'Ada', 'eu', 2), ('c2', 'Bo', 'mars', 1); \
         CREATE STREAM orders WITH (partitions = 2); \
         CREATE STREAM enriched WITH (start = 'earliest') AS \
           SELECT o.*, c.name AS customer_name, r.label AS region, o.id AS _key, UPPER(key) AS shouted \
           FROM orders o JOIN customers c ON c.id = o.customer AND c.tier >= 1 \
           LEFT JOIN regions r ON r.id = c.region WHERE o.qty > 0",
    )
    .await
    .unwrap();
    publish_keyed(
        &engine,
        "orders",
        &[
            ("k1", json!({"id": "o1", "customer": "c1", "qty": 2})),
            ("k2", json!({"id": "o2", "customer": "c2", "qty": 1})),
            ("k3", json!({"id": "o3", "customer": "c9", "qty": 1})),
            ("k4", json!({"id": "o4", "customer": "c1", "qty": 0})),
            ("k5", json!({"id": "o5", "qty": 3})),
        ],
    )
    .await;
    let written = records(&engine, "enriched", 2).await;
    let values = values_by_id(&written);
    assert_eq!(
        values["o1"],
        json!({"id": "o1", "customer": "c1", "qty": 2, "customer_name": "Ada", "region": "Europe", "shouted": "K1"})
    );
    assert_eq!(values["o2"]["region"], Value::Null, "a left join that matched none");
    assert_eq!(values["o2"]["customer_name"], "Bo");
    let keys: Vec<_> = written.iter().map(|record| record.key.clone().unwrap()).collect();
    assert!(keys.contains(&bytes::Bytes::from_static(b"o1")), "{keys:?}");

    // A changed row enriches the records read after it; what was written stays.
    run(&engine, "UPDATE customers SET name = 'Ada L' WHERE id = 'c1'").await.unwrap();
    publish_keyed(&engine, "orders", &[("k6", json!({"id": "o6", "customer": "c1", "qty": 1}))]).await;
    let values = values_by_id(&records(&engine, "enriched", 3).await);
    assert_eq!(
        (values["o1"]["customer_name"].as_str(), values["o6"]["customer_name"].as_str()),
        (Some("Ada"), Some("Ada L"))
    );

    let error = run(&engine, "DROP TABLE customers").await.unwrap_err();
    assert_eq!(error.code(), "in_use", "{error}");
    assert!(error.to_string().contains("enriched"), "{error}");
    let described = run(&engine, "SHOW TRANSFORMS").await.unwrap();
    assert!(format!("{described:?}").contains("JOIN customers c"), "{described:?}");

    // After a restart it goes on from its checkpoint, writing nothing twice.
    close(engine).await;
    let engine = open(dir.path());
    publish_keyed(&engine, "orders", &[("k7", json!({"id": "o7", "customer": "c2", "qty": 1}))]).await;
    let values = values_by_id(&records(&engine, "enriched", 4).await);
    assert_eq!(values["o7"]["customer_name"], "Bo");
    close(engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_enrichments_are_refused_and_define_nothing() {
    let (_dir, engine) = fresh();
    run(
        &engine,
        "CREATE STREAM s; CREATE STREAM other; \
         CREATE TABLE t (id TEXT PRIMARY KEY, name TEXT, n BIGINT); CREATE TABLE u (id TEXT PRIMARY KEY); \
         CREATE VIEW by_name AS SELECT name, COUNT(*) AS n FROM t GROUP BY name",
    )
    .await
    .unwrap();
    for (select, fragment) in [
        ("SELECT t.name FROM s JOIN t ON t.name = s.name", "finds its row by the table's primary key: ON t.id ="),
        ("SELECT x.id FROM s JOIN nowhere x ON x.id = s.x", "nowhere is not a table"),
        ("SELECT o.id FROM s JOIN other o ON o.id = s.x", "other is a stream"),
        ("SELECT v.n FROM s JOIN by_name v ON v.name = s.x", "by_name is a view"),
        ("SELECT * FROM s JOIN t ON t.id = s.x", "SELECT * in a transform that joins tables"),
        ("SELECT t.nope FROM s JOIN t ON t.id = s.x", "column t.nope does not exist"),
        ("SELECT t.id FROM s JOIN t ON t.id = u.id JOIN u ON u.id = s.x", "joined after it"),
        ("SELECT u.id FROM s JOIN t ON t.id = s.x JOIN u ON u.id = t.n", "t.n is BIGINT"),
        ("SELECT t.id FROM s JOIN t ON t.id = s.x JOIN t ON t.id = s.y", "two inputs are named t"),
        ("SELECT s.*, s.* FROM s JOIN t ON t.id = s.x", "s.* is selected twice"),
        ("SELECT t.*, t.name FROM s JOIN t ON t.id = s.x", "two columns are named name"),
        ("SELECT t.id FROM s FULL JOIN t ON t.id = s.x", "FULL JOIN"),
        ("SELECT t.id FROM s JOIN t ON t.id = s.x UNION ALL SELECT a, b FROM other", "SELECT 2 gives a, b"),
    ] {
        let error = run(&engine, &format!("CREATE STREAM out AS {select}")).await.unwrap_err();
        assert!(error.to_string().contains(fragment), "{select}\n  gave: {error}\n  wanted: {fragment}");
    }
    assert!(engine.transforms().is_empty());
    assert!(engine.stream("out").is_err());
    close(engine).await;
}

/// The example of "Enriching a stream with tables" runs as written and does what it says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_enrichment_example_of_the_docs_runs() {
    let (_dir, engine) = fresh();
    let blocks = common::sql_blocks("sql.md", "### Enriching a stream with tables");
    assert_eq!(blocks.len(), 1);
    run(&engine, &blocks[0]).await.unwrap_or_else(|error| panic!("{}\n{error}", blocks[0]));
    run(
        &engine,
        "INSERT INTO regions (id, label) VALUES ('eu', 'Europe'); \
         INSERT INTO customers (id, name, region) VALUES ('c1', 'Ada', 'eu'), ('c2', 'Bo', NULL)",
    )
    .await
    .unwrap();
    publish(
        &engine,
        "orders",
        &[
            json!({"id": "o1", "customer_id": "c1", "total": 10}),
            json!({"id": "o2", "customer_id": "c2", "total": 5}),
            json!({"id": "o3", "customer_id": "c3", "total": 5}),
            json!({"id": "o4", "customer_id": "c1", "total": 0}),
        ],
    )
    .await;
    let values = values_by_id(&records(&engine, "orders_enriched", 2).await);
    assert_eq!(
        values["o1"],
        json!({"id": "o1", "customer_id": "c1", "total": 10, "customer": "Ada", "region": "Europe"})
    );
    assert_eq!((values["o2"]["customer"].as_str(), &values["o2"]["region"]), (Some("Bo"), &Value::Null));
    close(engine).await;
}
