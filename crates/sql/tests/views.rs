//! Views end to end on a real engine: defined in SQL, fed by publishes, read by key, their
//! changes in the change stream, listed and described, kept across a restart, and dropped.

mod common;

use std::time::{Duration, Instant};

use common::{close, fresh, open, run};
use onehop_engine::view::checkpoint;
use onehop_engine::{Engine, Position};
use onehop_log::NewRecord;
use onehop_sql::Output;
use serde_json::{Value, json};

/// Waits until `done` holds for the view's rows of every key (10 s at most).
async fn settle(
    engine: &Engine,
    view: &str,
    done: impl Fn(&[(String, Vec<Value>)]) -> bool,
) -> Vec<(String, Vec<Value>)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let page = engine.view(view).unwrap().page(None, 1000);
        if done(&page) {
            return page;
        }
        assert!(Instant::now() < deadline, "the view did not settle: {page:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The checkpoint topic's newest record per key.
fn stored_checkpoints(engine: &Engine) -> std::collections::HashMap<String, bytes::Bytes> {
    checkpoint::read_all(&engine.system_topic(checkpoint::CHECKPOINT_TOPIC, &Default::default()).unwrap()).unwrap()
}

const VIEW: &str = "CREATE STREAM clicks; \
    CREATE VIEW per_page WITH (emit = 'changes,final', start = 'earliest') AS \
    SELECT page, COUNT(*) AS n, SUM(ms) AS total FROM TUMBLE(clicks, INTERVAL '10' SECOND) GROUP BY page";

fn all_closed(page: &[(String, Vec<Value>)]) -> bool {
    page.len() == 3 && page.iter().all(|(_, rows)| rows.len() == 3 && rows.iter().all(|row| row["final"] == true))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_aggregates_serves_keys_pushes_changes_and_survives_a_restart() {
    let (dir, engine) = fresh();
    run(&engine, VIEW).await.unwrap();
    // 30 clicks on three pages over three 10 s windows that ended a minute ago (within the
    // hour closed windows are kept): each closes as soon as the view has them all.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let base = (now - 90_000) / 10_000 * 10_000;
    let clicks = engine.stream("clicks").unwrap();
    let records: Vec<NewRecord> = (0..30)
        .map(|i| NewRecord {
            timestamp_ms: Some(base + i * 1000),
            value: Some(json!({"page": format!("p{}", i % 3), "ms": i}).to_string().into()),
            ..NewRecord::default()
        })
        .collect();
    clicks.publish(&records, None).await.unwrap();
    let page = settle(&engine, "per_page", all_closed).await;
    let p0 = &page.iter().find(|(key, _)| key == "p0").unwrap().1;
    // Newest window first: the third has 21, 24, 27.
    assert_eq!(
        p0[0],
        json!({"page": "p0", "n": 3, "total": 72, "window_start": base + 20_000, "window_end": base + 30_000, "final": true})
    );
    assert_eq!(p0[2]["n"], 4, "0, 3, 6 and 9");
    let view = engine.view("per_page").unwrap();
    assert_eq!(view.rows("p1"), page.iter().find(|(key, _)| key == "p1").unwrap().1);
    assert!(view.rows("nothing").is_empty());
    let status = view.status();
    assert_eq!((status.events, status.late_events, status.restoring), (30, 0, false));

    // The change stream: every change, then each window's final, keyed and with its topic.
    let output = view.output().clone();
    // Written without waiting for the disk: give the writer a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    while output.end_offset(0).unwrap() < 39 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let offset = output.resolve(0, Position::Earliest).unwrap();
    let changes = output.read(0, Position::Offset(offset), 1000, 1 << 20).unwrap();
    let finals: Vec<&onehop_log::Record> = changes
        .iter()
        .filter(|record| serde_json::from_slice::<Value>(record.value.as_deref().unwrap()).unwrap()["final"] == true)
        .collect();
    assert_eq!(changes.len(), 30 + 9, "one change per click, one final per window");
    assert_eq!(finals.len(), 9);
    assert_eq!(finals[0].subject.as_deref().map(|subject| subject.starts_with("views/per_page/p")), Some(true));

    // Listed, described, and protecting its source.
    let outputs = run(&engine, "SHOW VIEWS; DESCRIBE per_page").await.unwrap();
    let Output::Rows { rows, .. } = &outputs[0] else { panic!("{outputs:?}") };
    assert_eq!(rows[0][0], "per_page");
    assert_eq!(rows[0][3], 3, "keys");
    let error = run(&engine, "DROP STREAM clicks").await.unwrap_err();
    assert_eq!(error.code(), "in_use");
    let outputs = run(&engine, VIEW.split_once(';').unwrap().1).await.unwrap();
    assert!(matches!(outputs[0], Output::Unchanged { .. }), "the same definition again: {outputs:?}");
    let error =
        run(&engine, "CREATE VIEW per_page AS SELECT page, COUNT(*) AS n FROM clicks GROUP BY page").await.unwrap_err();
    assert_eq!(error.code(), "view_exists");

    // A record of an earlier view of the same name, as a drop cut short by a crash leaves.
    let stray = "per_page\u{1}0000000000000001\u{1}k\u{1}p0";
    let checkpoints = engine.log().partition(checkpoint::CHECKPOINT_TOPIC, 0).unwrap();
    checkpoints.append(&[NewRecord::keyed(stray.as_bytes().to_vec(), b"{}".to_vec())]).await.unwrap();

    // A restart finds the view as it was (from its checkpoint), and it keeps counting.
    close(engine).await;
    let engine = open(dir.path());
    let again = settle(&engine, "per_page", all_closed).await;
    assert_eq!(again, page);
    // Its checkpoint is its header, its three keys and its nine closed windows; the stray
    // record is deleted.
    let deadline = Instant::now() + Duration::from_secs(10);
    while stored_checkpoints(&engine).contains_key(stray) {
        assert!(Instant::now() < deadline, "the stray checkpoint record was not deleted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stored = stored_checkpoints(&engine);
    assert_eq!(stored.keys().filter(|key| key.starts_with("per_page")).count(), 1 + 3 + 9, "{:?}", stored.keys());
    let clicks = engine.stream("clicks").unwrap();
    let late = NewRecord {
        timestamp_ms: Some(base + 40_000),
        value: Some(json!({"page": "p0", "ms": 1}).to_string().into()),
        ..NewRecord::default()
    };
    clicks.publish(&[late], None).await.unwrap();
    settle(&engine, "per_page", |page| page.iter().any(|(key, rows)| key == "p0" && rows.len() == 4)).await;
    assert_eq!(engine.view("per_page").unwrap().status().events, 31, "not one event counted twice");

    // Dropped: gone, with its changes, and it stays gone.
    run(&engine, "DROP VIEW per_page; DROP VIEW IF EXISTS per_page").await.unwrap();
    assert_eq!(engine.view("per_page").err().unwrap().code(), "unknown_view");
    assert!(engine.log().topics().iter().all(|topic| !topic.starts_with("__view.")));
    let stored = stored_checkpoints(&engine);
    assert!(stored.keys().all(|key| !key.starts_with("per_page")), "its checkpoint is deleted: {:?}", stored.keys());
    run(&engine, "DROP STREAM clicks").await.unwrap();
    close(engine).await;
    let engine = open(dir.path());
    assert!(engine.views().is_empty());
    close(engine).await;
}

#[tokio::test]
async fn bad_view_definitions_are_refused_with_what_is_supported() {
    let (_dir, engine) = fresh();
    run(&engine, "CREATE STREAM s; CREATE TABLE t (id TEXT PRIMARY KEY)").await.unwrap();
    let cases = [
        ("CREATE VIEW v AS SELECT k, COUNT(*) FROM nowhere GROUP BY k", "unknown_stream"),
        ("CREATE VIEW v AS SELECT k, FIRST(k) FROM t GROUP BY k", "invalid_definition"),
        ("CREATE VIEW t AS SELECT k, COUNT(*) FROM s GROUP BY k", "name_taken"),
        ("CREATE VIEW v AS SELECT k, COUNT(*) FROM t FULL JOIN s2 ON true GROUP BY k", "sql_unsupported"),
        ("CREATE VIEW v AS SELECT k, COUNT(*) FROM WINDOWED(s, INTERVAL '1' SECOND) GROUP BY k", "sql_unsupported"),
        (
            "CREATE VIEW v AS SELECT k, COUNT(*) FROM HOP(s, INTERVAL '3' SECOND, INTERVAL '5' SECOND) GROUP BY k",
            "sql_invalid_query",
        ),
    ];
    for (sql, code) in cases {
        let error = run(&engine, sql).await.unwrap_err();
        assert_eq!(error.code(), code, "{sql}: {error}");
    }
    assert!(engine.views().is_empty());
    close(engine).await;
}

fn object(value: Value) -> serde_json::Map<String, Value> {
    value.as_object().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_over_a_table_aggregates_its_current_rows_and_is_rebuilt_at_start() {
    use onehop_engine::{Precondition, Write};
    let (dir, engine) = fresh();
    run(&engine, "CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT, total FLOAT)").await.unwrap();
    let orders = engine.table("orders").unwrap();
    let put = |id: &'static str, status: &'static str, total: f64| {
        let orders = orders.clone();
        async move {
            let row = object(json!({ "status": status, "total": total }));
            orders.write(id, Write::Put(row), Precondition::None, None).await.unwrap();
        }
    };
    // Rows written before the view exists count: it aggregates what the table holds.
    put("o1", "open", 10.0).await;
    put("o2", "open", 5.0).await;
    run(
        &engine,
        "CREATE VIEW by_status AS SELECT status, COUNT(*) AS n, SUM(total) AS total FROM orders GROUP BY status",
    )
    .await
    .unwrap();
    let rows = |status: &str| engine.view("by_status").unwrap().rows(status);
    let settled = |want: Vec<(&'static str, Value)>| {
        let engine = engine.clone();
        async move {
            settle(&engine, "by_status", |page| {
                page.len() == want.len()
                    && want
                        .iter()
                        .all(|(key, row)| page.iter().any(|(k, rows)| k == key && rows == std::slice::from_ref(row)))
            })
            .await
        }
    };
    settled(vec![("open", json!({"status": "open", "n": 2, "total": 15.0}))]).await;
    // An order moves from open to paid, one is deleted, one is new.
    put("o1", "paid", 10.0).await;
    orders.write("o2", Write::Delete, Precondition::None, None).await.unwrap();
    put("o3", "open", 7.5).await;
    settled(vec![
        ("open", json!({"status": "open", "n": 1, "total": 7.5})),
        ("paid", json!({"status": "paid", "n": 1, "total": 10.0})),
    ])
    .await;
    assert_eq!(rows("paid"), [json!({"status": "paid", "n": 1, "total": 10.0})]);
    // The table cannot be dropped under the view.
    assert_eq!(run(&engine, "DROP TABLE orders").await.unwrap_err().code(), "in_use");
    // Time and order do not apply to rows: refused, with why.
    for sql in [
        "CREATE VIEW w AS SELECT status, COUNT(*) FROM TUMBLE(orders, INTERVAL '1' MINUTE) GROUP BY status",
        "CREATE VIEW w AS SELECT status, LAST(total) FROM orders GROUP BY status",
        "CREATE VIEW w AS SELECT status, FIRST(total) FROM orders GROUP BY status",
    ] {
        let error = run(&engine, sql).await.unwrap_err();
        assert_eq!(error.code(), "invalid_definition", "{sql}: {error}");
        assert!(error.to_string().contains("is a table"), "{error}");
    }
    // After a restart the view is rebuilt from the rows, and follows changes again.
    close(engine).await;
    let engine = open(dir.path());
    let orders = engine.table("orders").unwrap();
    orders.write("o3", Write::Delete, Precondition::None, None).await.unwrap();
    settle(&engine, "by_status", |page| {
        page.len() == 1 && page[0].0 == "paid" && page[0].1 == [json!({"status": "paid", "n": 1, "total": 10.0})]
    })
    .await;
    // The change stream said the open group went away.
    let changes = engine.view("by_status").unwrap().output().clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let records = changes.read(0, Position::Earliest, 1000, usize::MAX).unwrap();
        let last: Option<Value> =
            records.last().map(|record| serde_json::from_slice(record.value.as_deref().unwrap()).unwrap());
        if last.as_ref().is_some_and(|last| last["removed"] == true) {
            assert_eq!(last.unwrap()["status"], "open");
            break;
        }
        assert!(Instant::now() < deadline, "no removal in the change stream");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    run(&engine, "DROP VIEW by_status; DROP TABLE orders").await.unwrap();
    close(engine).await;
}

#[tokio::test]
async fn a_record_published_after_create_view_returns_is_live_however_late_the_view_starts() {
    // One runtime thread, kept busy while the records are published from another thread: the
    // view's task cannot run before they are in the log. They came after CREATE VIEW returned,
    // so they are live, and each has its change in the change stream (not replayed history).
    let (_dir, engine) = fresh();
    run(&engine, VIEW).await.unwrap();
    let clicks = engine.stream("clicks").unwrap();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            for i in 0..5 {
                let record = NewRecord::value(json!({ "page": "p0", "ms": i }).to_string());
                runtime.block_on(clicks.publish(&[record], None)).unwrap();
            }
        });
    });
    let output = engine.view("per_page").unwrap().output().clone();
    let deadline = Instant::now() + Duration::from_secs(10);
    while output.end_offset(0).unwrap() < 5 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(output.end_offset(0).unwrap(), 5, "one change per click published after the view was created");
}
