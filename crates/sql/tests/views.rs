//! Views end to end on a real engine: defined in SQL, fed by publishes, read by key, their
//! changes in the change stream, listed and described, kept across a restart, and dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use onehop_engine::{Engine, EngineOptions, Position};
use onehop_log::{Log, LogOptions, NewRecord};
use onehop_sql::{Output, execute, parse};
use serde_json::{Value, json};

fn open(dir: &std::path::Path) -> Arc<Engine> {
    let (log, _) = Log::open(dir, LogOptions::default()).unwrap();
    Arc::new(Engine::open(Arc::new(log), EngineOptions::default()).unwrap())
}

async fn close(engine: Arc<Engine>) {
    engine.stop_derived().await;
    let log = engine.log().clone();
    drop(engine);
    log.close();
}

async fn run(engine: &Engine, sql: &str) -> Result<Vec<Output>, onehop_sql::SqlError> {
    let mut outputs = Vec::new();
    for statement in parse(sql)? {
        outputs.push(execute(engine, &statement).await?);
    }
    Ok(outputs)
}

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

const VIEW: &str = "CREATE STREAM clicks; \
    CREATE VIEW per_page WITH (emit = 'changes,final', start = 'earliest') AS \
    SELECT page, COUNT(*) AS n, SUM(ms) AS total FROM TUMBLE(clicks, INTERVAL '10' SECOND) GROUP BY page";

fn all_closed(page: &[(String, Vec<Value>)]) -> bool {
    page.len() == 3 && page.iter().all(|(_, rows)| rows.len() == 3 && rows.iter().all(|row| row["final"] == true))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_aggregates_serves_keys_pushes_changes_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
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
    while output.partition(0).unwrap().end_offset() < 39 && Instant::now() < deadline {
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

    // A restart finds the view as it was (from its checkpoint), and it keeps counting.
    close(engine).await;
    let engine = open(dir.path());
    let again = settle(&engine, "per_page", all_closed).await;
    assert_eq!(again, page);
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
    run(&engine, "DROP STREAM clicks").await.unwrap();
    close(engine).await;
    let engine = open(dir.path());
    assert!(engine.views().is_empty());
    close(engine).await;
}

#[tokio::test]
async fn bad_view_definitions_are_refused_with_what_is_supported() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    run(&engine, "CREATE STREAM s; CREATE TABLE t (id TEXT PRIMARY KEY)").await.unwrap();
    let cases = [
        ("CREATE VIEW v AS SELECT k, COUNT(*) FROM nowhere GROUP BY k", "unknown_stream"),
        ("CREATE VIEW v AS SELECT k, COUNT(*) FROM t GROUP BY k", "invalid_definition"),
        ("CREATE VIEW t AS SELECT k, COUNT(*) FROM s GROUP BY k", "name_taken"),
        ("CREATE VIEW v AS SELECT k, COUNT(*) FROM s JOIN s2 ON true GROUP BY k", "sql_unsupported"),
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
