//! `onehop serve` as a user runs it: the real binary, real signals, real HTTP over loopback.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{DataDir, RawSse, Server, bench_report, curl, get, onehop, post, request, start};

use onehop_engine::{Engine, EngineOptions, Position, StreamDef};
use onehop_log::{Durability, Log, LogOptions, NewRecord};

#[test]
fn serves_health_and_metrics_then_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), &["--http-addr", "127.0.0.1:0"], &[]);
    assert!(server.address.ip().is_loopback());
    let (status, body) = get(server.address, "/healthz");
    assert_eq!(status, 200);
    assert!(body.contains(r#""status":"ok""#), "{body}");
    assert_eq!(post(server.address, "/streams/probe", "1").unwrap().0, 200);
    let (status, body) = get(server.address, "/metrics");
    assert_eq!(status, 200);
    // Two records: the auto-created stream's definition in the catalog, then the value.
    for metric in ["log_fsync_duration_seconds_bucket", "log_records_appended_total 2", "http_requests_total{"] {
        assert!(body.contains(metric), "{metric} missing from:\n{body}");
    }
    assert!(body.contains(r#"route="/streams/{stream}""#), "routes are labelled by template:\n{body}");
    // One write at a time, on an idle server: each was made durable by its partition's write
    // thread itself, without a hand-off to the sync thread.
    assert!(body.contains("log_inline_syncs_total 2"), "{body}");
    // The embedded default: data in ./onehop-data of the working directory, locked.
    assert!(dir.path().join("onehop-data/LOCK").exists());
    server.signal("TERM");
    let status = server.wait_exit();
    assert!(status.success(), "exit {status:?}; said:\n{}", server.seen.join("\n"));
    assert!(server.seen.iter().any(|line| line.contains("stopped cleanly")), "{}", server.seen.join("\n"));
}

#[test]
fn sigint_also_stops_cleanly() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    server.signal("INT");
    assert!(server.wait_exit().success(), "{}", server.seen.join("\n"));
}

#[test]
fn a_second_server_on_the_same_data_dir_is_refused() {
    let dir = DataDir::new();
    let first = dir.start(&[], &[]);
    let output = onehop().arg("serve").args(dir.serve_args(&[])).current_dir(dir.path()).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is in use by another onehop process"), "{stderr}");
    assert!(stderr.contains(&format!("pid {}", first.child.id())), "{stderr}");
    // The first one is unaffected.
    assert_eq!(get(first.address, "/healthz").0, 200);
}

#[test]
fn flags_beat_environment_and_environment_beats_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("onehop.toml"),
        "data_dir = \"from-file\"\nhttp_addr = \"127.0.0.1:0\"\nmaintenance_interval_s = 7\n",
    )
    .unwrap();
    // The file alone: its data_dir is used.
    let mut server = start(dir.path(), &[], &[]);
    assert!(dir.path().join("from-file/LOCK").exists());
    server.signal("TERM");
    assert!(server.wait_exit().success());
    // The environment beats the file.
    let mut server = start(dir.path(), &[], &[("ONEHOP_DATA_DIR", "from-env")]);
    assert!(dir.path().join("from-env/LOCK").exists());
    server.signal("TERM");
    assert!(server.wait_exit().success());
    // A flag beats both.
    let mut server = start(dir.path(), &["--data-dir", "from-flag"], &[("ONEHOP_DATA_DIR", "from-env")]);
    assert!(dir.path().join("from-flag/LOCK").exists());
    server.signal("TERM");
    assert!(server.wait_exit().success());
}

#[test]
fn a_bad_config_file_is_refused_with_its_name_and_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("onehop.toml"), "data_directory = \"x\"\n").unwrap();
    let output = onehop().arg("serve").current_dir(dir.path()).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("onehop.toml") && stderr.contains("data_directory"), "{stderr}");
}

#[test]
fn recovers_streams_after_kill_9_and_reports_them() {
    let dir = DataDir::new();
    let data = &dir.data;
    let open_engine = |data: &Path| {
        let (log, _) = Log::open(data.join("log"), LogOptions::default()).unwrap();
        Engine::open(Arc::new(log), EngineOptions::default()).unwrap()
    };
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    {
        let engine = open_engine(data);
        let def = StreamDef {
            name: "orders".into(),
            partitions: 2,
            retention_ms: None,
            retention_bytes: None,
            durability: Durability::Fsync,
            mqtt_topic: None,
            compacted: false,
        };
        let stream = runtime.block_on(engine.create_stream(def)).unwrap();
        runtime.block_on(stream.publish(&[NewRecord::keyed("a", "1"), NewRecord::keyed("b", "2")], None)).unwrap();
        let log = engine.log().clone();
        drop(engine);
        log.close();
    }
    let mut server = dir.start(&[], &[]);
    let (_, body) = get(server.address, "/healthz");
    assert!(body.contains(r#""streams":1"#), "{body}");
    server.kill_9();
    let server = dir.start(&[], &[]);
    let (_, body) = get(server.address, "/healthz");
    assert!(body.contains(r#""streams":1"#), "{body}");
    drop(server);
    let engine = open_engine(data);
    let stream = engine.stream("orders").unwrap();
    let total: usize =
        (0..2).map(|partition| stream.read(partition, Position::Earliest, 10, 1 << 20).unwrap().len()).sum();
    assert_eq!(total, 2);
}

#[test]
fn help_documents_every_serve_flag() {
    let output = onehop().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    for flag in [
        "--config",
        "--data-dir",
        "--http-addr",
        "--mqtt-addr",
        "--durability",
        "--async-fsync-interval-ms",
        "--segment-bytes-max",
        "--record-bytes-max",
        "--batch-bytes-max",
        "--maintenance-interval-s",
        "--auto-create",
        "--connections-max",
        "--subscriptions-per-socket-max",
        "--subscriber-queue",
        "--schema",
        "--log",
        "--discard-damaged",
        "--recover-catalog",
        "--allowed-origins",
        "--static-dir",
    ] {
        assert!(help.contains(flag), "{flag} missing from serve --help");
    }
    assert!(help.contains("ONEHOP_DATA_DIR"));
}

/// Runs four writers against `server`, each a thread calling `write(writer, address, stop)`,
/// kills the server with SIGKILL after `writing`, tells the writers to stop, and returns what
/// each one returned. A writer ends at the first request the dead server does not answer, or
/// once `stop` is set.
fn kill_9_while_writing<T: Send + 'static>(
    server: &mut Server,
    writing: Duration,
    write: impl Fn(usize, SocketAddr, &AtomicBool) -> T + Send + Sync + 'static,
) -> Vec<T> {
    let address = server.address;
    let stop = Arc::new(AtomicBool::new(false));
    let write = Arc::new(write);
    let writers: Vec<_> = (0..4)
        .map(|writer| {
            let (stop, write) = (stop.clone(), write.clone());
            std::thread::spawn(move || write(writer, address, &stop))
        })
        .collect();
    std::thread::sleep(writing);
    server.kill_9();
    stop.store(true, Ordering::Relaxed);
    writers.into_iter().map(|writer| writer.join().unwrap()).collect()
}

#[test]
fn acknowledged_http_publishes_survive_kill_9() {
    publishes_survive_kill_9(&[]);
}

/// The same with the shared journal: every acknowledgement waited for the journal's sync, not
/// the segment's, and the restart replays the journal into the segments before it serves.
#[test]
fn acknowledged_http_publishes_survive_kill_9_with_the_shared_journal() {
    publishes_survive_kill_9(&["--log-journal", "true"]);
}

fn publishes_survive_kill_9(args: &[&str]) {
    let dir = DataDir::new();
    let mut server = dir.start(args, &[]);
    let publishers = kill_9_while_writing(&mut server, Duration::from_millis(400), |writer, address, stop| {
        let mut acked = Vec::new();
        for sequence in 0..100_000 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let value = format!("{{\"writer\":{writer},\"sequence\":{sequence}}}");
            match post(address, "/streams/orders", &value) {
                Some((200, body)) => {
                    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
                    acked.push((answer["offset"].as_u64().unwrap(), value));
                }
                Some((status, body)) => panic!("publish refused with {status}: {body}"),
                None => break, // killed mid-request: not acknowledged
            }
        }
        acked
    });
    let acked: Vec<(u64, String)> = publishers.into_iter().flatten().collect();
    assert!(acked.len() > 20, "only {} publishes were acknowledged before the kill", acked.len());

    let server = dir.start(args, &[]);
    let mut stored = std::collections::HashMap::new();
    let mut from = 0;
    loop {
        let (status, body) = get(server.address, &format!("/streams/orders?from={from}&limit=10000"));
        assert_eq!(status, 200, "{body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        let records = body["records"].as_array().unwrap();
        if records.is_empty() {
            break;
        }
        for record in records {
            stored.insert(record["offset"].as_u64().unwrap(), record["value"].to_string());
        }
        from = body["next"]["0"].as_u64().unwrap();
    }
    for (offset, value) in &acked {
        let expected: serde_json::Value = serde_json::from_str(value).unwrap();
        assert_eq!(stored.get(offset), Some(&expected.to_string()), "acknowledged publish at {offset} lost or changed");
    }
}

/// A row's state as a writer knows it: its JSON, or `None` when deleted or never written.
type RowState = Option<serde_json::Value>;

#[test]
fn acknowledged_table_writes_and_their_indexes_survive_kill_9() {
    let dir = DataDir::new();
    let schema = dir.schema_file("CREATE TABLE items (id TEXT PRIMARY KEY, grp BIGINT); CREATE INDEX ON items (grp);");
    let mut server = dir.start(&["--schema", &schema], &[]);
    // Each writer owns ten rows and writes them one request at a time, so per row it knows the
    // last acknowledged state and the one write that may have been in flight at the kill.
    let writers = kill_9_while_writing(&mut server, Duration::from_millis(500), |writer, address, stop| {
        let mut rows: std::collections::HashMap<String, (RowState, Option<RowState>)> =
            (0..10).map(|row| (format!("w{writer}-{row}"), (None, None))).collect();
        for sequence in 0..100_000u64 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let id = format!("w{writer}-{}", sequence % 10);
            let path = format!("/tables/items/{id}");
            let exists = rows[&id].0.is_some();
            let (method, body, after) = if exists && sequence % 7 == 0 {
                ("DELETE", String::new(), None)
            } else {
                let row = serde_json::json!({"id": id, "grp": sequence % 3, "seq": sequence});
                ("PUT", row.to_string(), Some(row))
            };
            rows.get_mut(&id).unwrap().1 = Some(after.clone());
            match request(address, method, &path, &body) {
                Some((200 | 201, _)) => *rows.get_mut(&id).unwrap() = (after, None),
                Some((status, body)) => panic!("{method} {path} refused with {status}: {body}"),
                None => break, // killed mid-request: not acknowledged, maybe applied
            }
        }
        rows
    });
    let rows: Vec<(String, (RowState, Option<RowState>))> = writers.into_iter().flatten().collect();

    let server = dir.start(&["--schema", &schema], &[]);
    let mut by_group: std::collections::BTreeMap<u64, std::collections::BTreeSet<String>> = Default::default();
    let mut acknowledged_rows = 0;
    for (id, (acked, in_flight)) in &rows {
        let (status, body) = get(server.address, &format!("/tables/items/{id}"));
        let stored: RowState = match status {
            200 => Some(serde_json::from_str(&body).unwrap()),
            404 => None,
            other => panic!("GET {id}: {other} {body}"),
        };
        acknowledged_rows += usize::from(acked.is_some());
        assert!(
            stored == *acked || in_flight.as_ref() == Some(&stored),
            "row {id}: stored {stored:?}, last acknowledged {acked:?}, in flight {in_flight:?}"
        );
        if let Some(row) = stored {
            by_group.entry(row["grp"].as_u64().unwrap()).or_default().insert(id.clone());
        }
    }
    assert!(acknowledged_rows > 5, "only {acknowledged_rows} rows were written before the kill");
    // The rebuilt index answers exactly what the rows say.
    for group in 0..3 {
        let (status, body) = get(server.address, &format!("/tables/items?grp={group}&limit=1000"));
        assert_eq!(status, 200, "{body}");
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        let ids: std::collections::BTreeSet<String> =
            page["rows"].as_array().unwrap().iter().map(|row| row["id"].as_str().unwrap().to_string()).collect();
        assert_eq!(ids, by_group.remove(&group).unwrap_or_default(), "index on grp = {group}");
    }
}

#[test]
fn sql_from_the_command_line_and_a_schema_applied_at_start() {
    let dir = DataDir::new();
    let schema =
        dir.schema_file("CREATE STREAM orders WITH (partitions = 3, retention = '7d');\nCREATE STREAM clicks;\n");
    let args = dir.serve_args(&["--schema", &schema]);
    let mut server = start(dir.path(), &args, &[]);
    let url = format!("http://{}", server.address);
    let output = onehop().args(["sql", "--url", &url, "SHOW STREAMS"]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.contains("orders") && shown.contains("clicks") && shown.contains("(2 rows)"), "{shown}");
    let create = dir.path().join("more.sql");
    std::fs::write(&create, "CREATE STREAM events WITH (durability = 'async')").unwrap();
    let output = onehop().args(["sql", "--url", &url, "-f", create.to_str().unwrap()]).output().unwrap();
    assert!(String::from_utf8_lossy(&output.stdout).contains("CREATE STREAM events: created"), "{output:?}");
    let output = onehop().args(["sql", "--url", &url, "CREATE STREAM orders WITH (partitions = 9)"]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("already exists"), "{output:?}");
    // The same schema at the next start changes nothing.
    server.signal("TERM");
    assert!(server.wait_exit().success());
    let server = start(dir.path(), &args, &[]);
    let (_, body) = get(server.address, "/healthz");
    assert!(body.contains(r#""streams":3"#), "{body}");
    drop(server);
    // A schema that conflicts with what exists stops the start with the reason.
    std::fs::write(&schema, "CREATE STREAM orders WITH (partitions = 4)").unwrap();
    let output = onehop().arg("serve").args(args).current_dir(dir.path()).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("schema.sql") && stderr.contains("already exists"), "{stderr}");
    // A server that is not there is named.
    let output = onehop().args(["sql", "--url", "http://127.0.0.1:9", "SHOW STREAMS"]).output().unwrap();
    assert!(String::from_utf8_lossy(&output.stderr).contains("is `onehop serve` running there?"), "{output:?}");
}

#[test]
fn bench_notify_runs_end_to_end_and_delivers_everything() {
    for protocol in ["sse", "ws"] {
        bench_notify_once(protocol);
    }
}

fn bench_notify_once(protocol: &str) {
    let (report, dir) = bench_report(&[
        "notify",
        "--duration",
        "1",
        "--warmup",
        "0.5",
        "--subscribers",
        "10",
        "--subjects",
        "5",
        "--rate",
        "200",
        "--protocol",
        protocol,
    ]);
    assert_eq!(report["bench"], "notify");
    assert_eq!(report["protocol"], protocol);
    assert_eq!(report["delivered_pct"], 100.0, "{report}");
    assert_eq!(report["write_errors"], 0);
    assert_eq!(report["deliveries_expected"], 200 * 2, "200 writes measured, each matching 10/5 = 2 subscribers");
    for key in ["p50_us", "p99_us", "subscribers", "rate"] {
        assert!(report[key].as_f64().unwrap() > 0.0, "{key} in {report}");
    }
    // The server it started was stopped and its data removed.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Reads SSE events from a raw socket: the response head, then `(id, data)` per record event.
#[test]
fn a_subscription_resumes_from_its_last_id_after_kill_9() {
    let dir = DataDir::new();
    let mut server = dir.start(&[], &[]);
    for i in 0..10 {
        assert_eq!(post(server.address, "/streams/feed?subject=feed/a", &i.to_string()).unwrap().0, 200);
    }
    let mut events = RawSse::open(server.address, "/streams/feed?from=earliest&subject=feed/%2B", None);
    let mut seen = Vec::new();
    let mut last_id = String::new();
    for _ in 0..6 {
        let (id, record) = events.next();
        seen.push(record["value"].as_i64().unwrap());
        last_id = id;
    }
    assert_eq!(last_id, "0:5");
    server.kill_9();
    drop(events);

    let server = dir.start(&[], &[]);
    for i in 10..15 {
        assert_eq!(post(server.address, "/streams/feed?subject=feed/b", &i.to_string()).unwrap().0, 200);
    }
    let mut events = RawSse::open(server.address, "/streams/feed?from=earliest&subject=feed/%2B", Some(&last_id));
    while seen.len() < 15 {
        seen.push(events.next().1["value"].as_i64().unwrap());
    }
    assert_eq!(seen, (0..15).collect::<Vec<_>>(), "nothing missed, nothing repeated across the crash");
}

#[test]
fn connection_and_subscription_limits_are_settings_and_refusals_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--http-addr", "127.0.0.1:0", "--connections-max", "2", "--subscriptions-per-socket-max", "1"];
    let server = start(dir.path(), &args, &[]);
    assert_eq!(post(server.address, "/streams/s", "v").map(|(status, _)| status), Some(200));
    // The POST's connection frees its slot once the server has seen it close: retry briefly.
    let open_when_free = || {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match RawSse::try_open(server.address, "/streams/s", None) {
                Ok(sse) => return sse,
                Err(line) if Instant::now() < deadline => {
                    assert!(line.contains(" 503 "), "{line}");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(line) => panic!("no free connection slot: {line}"),
            }
        }
    };
    let first = open_when_free();
    let second = open_when_free();
    let (status, body) = get(server.address, "/healthz");
    assert_eq!(status, 503, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "too_many_connections");
    assert!(body["error"]["message"].as_str().unwrap().contains("connections_max"));
    drop(first);
    // The permit comes back when the server notices the close.
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(server.address, "/healthz").0 != 200 {
        assert!(Instant::now() < deadline, "the closed connection's slot never came back");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(second);

    // One subscription per socket: the URL's own; a second is refused on the socket.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        // The two closed connections free their slots once the server has seen them close.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut socket = loop {
            match tokio_tungstenite::connect_async(format!("ws://{}/streams/s", server.address)).await {
                Ok((socket, _)) => break socket,
                Err(tokio_tungstenite::tungstenite::Error::Http(response))
                    if response.status() == 503 && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => panic!("no free connection slot for the WebSocket: {error}"),
            }
        };
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next()).await.unwrap().unwrap().unwrap();
        let answer: serde_json::Value = serde_json::from_str(message.to_text().unwrap()).unwrap();
        assert_eq!(answer["type"], "subscribed");
        let command = serde_json::json!({"op": "subscribe", "subscription": "two", "stream": "s"});
        socket.send(Message::Text(command.to_string().into())).await.unwrap();
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next()).await.unwrap().unwrap().unwrap();
        let answer: serde_json::Value = serde_json::from_str(message.to_text().unwrap()).unwrap();
        assert_eq!(answer["code"], "too_many_subscriptions", "{answer}");
        assert!(answer["message"].as_str().unwrap().contains("subscriptions_per_socket_max"));
    });
}

#[test]
fn an_allowed_origin_no_browser_sends_stops_the_start_and_star_is_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let output = onehop()
        .args(["serve", "--allowed-origins", "https://app.example.com/"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("allowed_origins") && stderr.contains("write https://app.example.com"), "{stderr}");
    std::fs::write(dir.path().join("onehop.toml"), "allowed_origins = [\"*\"]\n").unwrap();
    let mut server = start(dir.path(), &["--http-addr", "127.0.0.1:0"], &[]);
    let warning = "any web page a user opens can read and write here";
    if !server.seen.iter().any(|line| line.contains(warning)) {
        server.wait_for_line(warning);
    }
}

/// `--static-dir` through the binary, asked with curl, on a server where every data route
/// needs credentials: the directory's pages to anyone (`/` its index.html, a directory
/// redirected to its slash, revalidation answered 304, HEAD without a body); dotfiles, links
/// out of it and `..` never; other methods and missing files the JSON `unknown_route`; data
/// routes still guarded. A directory that is not there stops the start, naming it.
#[test]
fn a_static_dir_serves_its_pages_and_nothing_outside_it() {
    let dir = DataDir::new();
    let site = dir.path().join("site");
    std::fs::create_dir_all(site.join("shop")).unwrap();
    std::fs::write(site.join("index.html"), "<!doctype html><title>shop</title>").unwrap();
    std::fs::write(site.join("app.js"), "console.log('live');").unwrap();
    std::fs::write(site.join("shop/index.html"), "<p>products</p>").unwrap();
    std::fs::write(site.join(".env"), "SECRET=1").unwrap();
    std::fs::write(dir.path().join("outside.txt"), "not for the web").unwrap();
    std::os::unix::fs::symlink(dir.path().join("outside.txt"), site.join("leak.txt")).unwrap();
    let site_arg = site.to_str().unwrap();
    let server = dir.start(
        &["--static-dir", site_arg, "--admin-user", "root"],
        &[("ONEHOP_ADMIN_PASSWORD", "static-test-password")],
    );
    let address = server.address;

    let (status, body) = curl(address, "/", &["-D", "-"]);
    assert_eq!(status, 200, "{body}");
    let lower = body.to_ascii_lowercase();
    assert!(lower.contains("content-type: text/html; charset=utf-8"), "{body}");
    assert!(lower.contains("x-content-type-options: nosniff") && lower.contains("cache-control: no-cache"), "{body}");
    assert!(body.ends_with("<!doctype html><title>shop</title>"), "{body}");
    let etag = body
        .lines()
        .find_map(|line| line.to_ascii_lowercase().starts_with("etag:").then(|| line[5..].trim().to_string()))
        .expect("an ETag");
    let (status, body) = curl(address, "/", &["-H", &format!("If-None-Match: {etag}")]);
    assert_eq!((status, body.as_str()), (304, ""));
    let (status, body) = curl(address, "/app.js", &["-D", "-"]);
    assert_eq!(status, 200);
    assert!(body.to_ascii_lowercase().contains("content-type: text/javascript"), "{body}");
    let (status, body) = curl(address, "/app.js", &["-I"]);
    assert_eq!(status, 200);
    assert!(body.to_ascii_lowercase().contains("content-length: 20"), "{body}");
    assert!(!body.contains("console.log"), "HEAD has no body: {body}");
    let (status, body) = curl(address, "/shop?page=2", &["-D", "-"]);
    assert_eq!(status, 308, "{body}");
    assert!(body.to_ascii_lowercase().contains("location: /shop/?page=2"), "{body}");
    let (status, body) = curl(address, "/shop/", &[]);
    assert_eq!((status, body.as_str()), (200, "<p>products</p>"));

    for refused in ["/.env", "/leak.txt", "/shop/%2e%2e/.env", "/missing.html"] {
        let (status, body) = curl(address, refused, &["--path-as-is"]);
        assert_eq!(status, 404, "{refused}: {body}");
        assert!(body.contains("\"unknown_route\"") && !body.contains("SECRET"), "{refused}: {body}");
    }
    let (status, body) = curl(address, "/index.html", &["-X", "POST", "-d", "x"]);
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("unknown_route"), "{body}");
    // The data stays behind its credentials.
    let (status, body) = curl(address, "/sql", &["-d", "SHOW STREAMS"]);
    assert_eq!(status, 401, "{body}");
    drop(server);

    let missing = dir.path().join("nowhere");
    let output = onehop()
        .arg("serve")
        .args(dir.serve_args(&["--static-dir", missing.to_str().unwrap()]))
        .arg("--mqtt-addr")
        .arg("127.0.0.1:0")
        .env("ONEHOP_PG_ADDR", "off")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("static_dir") && said.contains("nowhere"), "{said}");
}
