//! onehop from a web page on another origin, in headless Chromium (Debian's `chromium`, which
//! `scripts/test` installs). A page server of the test's own serves `browser/page.html` from
//! one origin; onehop listens on another. The page publishes with `fetch` (preflighted),
//! reads, follows a stream with `EventSource`, resumes with `Last-Event-ID`, writes and reads a
//! table row with its `ETag`, talks over a WebSocket subscription and MQTT over WebSocket, and
//! sends a simple `no-cors` POST; then it posts what happened back to the page server.
//!
//! With the page's origin in `--allowed-origins` every step works; with another origin listed
//! instead, the browser gets nothing it can use and onehop acts on nothing.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

use common::{DataDir, get};

const PAGE: &str = include_str!("browser/page.html");
/// The page gives each of its ten steps 10 s; Chromium's own start takes a few more.
const REPORT_TIMEOUT: Duration = Duration::from_secs(150);
/// Largest request the page server reads: the page's report is a few KiB.
const REQUEST_BYTES_MAX: usize = 1 << 20;

/// The page's steps that use onehop in a way the browser lets it read (all but the `no-cors`
/// POST): every one fails from an origin not allowed.
const FETCHING_STEPS: [&str; 9] = [
    "publish_first",
    "publish_second",
    "get_records",
    "event_source",
    "resume",
    "put_row",
    "get_row",
    "web_socket",
    "mqtt",
];

/// Where Debian's package puts Chromium.
const CHROMIUM: &str = "/usr/bin/chromium";

/// The test's own web server: `GET /` is the page, `POST /report` its findings.
struct PageServer {
    address: SocketAddr,
    reports: mpsc::Receiver<String>,
}

impl PageServer {
    /// Serves `page` on `listener`, bound before onehop started so that its origin could be
    /// listed (or not) in onehop's settings.
    fn serve(listener: TcpListener, page: String) -> PageServer {
        let address = listener.local_addr().unwrap();
        let (sender, reports) = mpsc::channel();
        std::thread::spawn(move || {
            for connection in listener.incoming() {
                let Ok(connection) = connection else { break };
                let (page, sender) = (page.clone(), sender.clone());
                // One thread per connection: Chromium opens some it never sends on.
                std::thread::spawn(move || serve_page_connection(connection, &page, &sender));
            }
        });
        PageServer { address, reports }
    }

    fn origin(&self) -> String {
        format!("http://{}", self.address)
    }
}

fn serve_page_connection(connection: TcpStream, page: &str, reports: &mpsc::Sender<String>) {
    connection.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut reader = BufReader::new(connection);
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut content_length = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        if line == "\r\n" {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            content_length = value.trim().parse().unwrap_or(0).min(REQUEST_BYTES_MAX);
        }
    }
    let mut body = vec![0; content_length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let (status, content_type, answer) = match request_line.split_whitespace().take(2).collect::<Vec<_>>()[..] {
        ["GET", "/"] => ("200 OK", "text/html; charset=utf-8", page.to_string()),
        ["POST", "/report"] => {
            let _ = reports.send(String::from_utf8_lossy(&body).into_owned());
            ("200 OK", "text/plain", String::new())
        }
        _ => ("404 Not Found", "text/plain", String::new()),
    };
    let mut connection = reader.into_inner();
    let _ = write!(
        connection,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
        answer.len()
    );
}

/// Headless Chromium on one page, in a process group of its own so that it and every process
/// it starts end together.
struct Chromium {
    child: Child,
}

impl Chromium {
    fn open(url: &str, dir: &Path) -> Chromium {
        assert!(
            Path::new(CHROMIUM).exists(),
            "{CHROMIUM} is missing: these tests need Debian's chromium package; run scripts/test, which installs it \
             (or `apt-get install chromium`)"
        );
        let profile = dir.join("chromium-profile");
        let child = Command::new(CHROMIUM)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                // This machine's network is closed: no connections to Google's services.
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("chromium.stderr")).unwrap())
            .process_group(0)
            .spawn()
            .expect("start chromium");
        Chromium { child }
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        // The group is the one this test made for the browser: its id is the child's.
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// Opens the page in Chromium and returns what it found.
fn run_page(page_server: &PageServer, dir: &Path) -> Value {
    let browser = Chromium::open(&format!("{}/", page_server.origin()), dir);
    let report = page_server.reports.recv_timeout(REPORT_TIMEOUT).unwrap_or_else(|_| {
        let stderr = std::fs::read_to_string(dir.join("chromium.stderr")).unwrap_or_default();
        panic!("the page reported nothing within {REPORT_TIMEOUT:?}; Chromium said:\n{stderr}")
    });
    drop(browser);
    serde_json::from_str(&report).unwrap_or_else(|error| panic!("bad report {report:?}: {error}"))
}

fn step<'a>(findings: &'a Value, name: &str) -> &'a Value {
    let step = &findings[name];
    assert!(step.is_object(), "no step {name:?} in {findings:#}");
    step
}

fn assert_ok<'a>(findings: &'a Value, name: &str) -> &'a Value {
    let step = step(findings, name);
    assert_eq!(step["ok"], true, "step {name:?} failed in the browser: {step:#}\nall findings: {findings:#}");
    step
}

/// How the test gives onehop its allow-list: both ways a deployment would.
enum Setting {
    Flag,
    Environment,
}

/// The superuser of the runs with access on.
const ROOT: (&str, &str) = ("root", "root-pass");

/// Starts onehop listing `listed` as its allowed origins (a function of the page server's
/// address), with one record in the stream `browser`, and runs the page against it. With
/// `access`, the server has users, and the page holds a token of the user `web`, who may read
/// and write `browser` and `notes` and nothing else.
fn run(
    dir: &DataDir,
    setting: Setting,
    listed: impl Fn(SocketAddr) -> String,
    access: bool,
) -> (common::Server, Value) {
    let page_listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let listed = listed(page_listener.local_addr().unwrap());
    // The stream and the table the page uses.
    let schema = dir.schema_file("CREATE STREAM browser; CREATE TABLE notes (id TEXT PRIMARY KEY, text TEXT);");
    let mut args = vec!["--schema", schema.as_str()];
    let mut environment = Vec::new();
    if access {
        args.extend(["--admin-user", ROOT.0]);
        environment.push(("ONEHOP_ADMIN_PASSWORD", ROOT.1));
    }
    match setting {
        Setting::Flag => args.extend(["--allowed-origins", listed.as_str()]),
        Setting::Environment => environment.push(("ONEHOP_ALLOWED_ORIGINS", listed.as_str())),
    }
    let server = dir.start(&args, &environment);
    let token = if access {
        let answer = common::sql_as(
            server.address,
            ROOT,
            "CREATE USER web; CREATE STREAM secrets; GRANT READ, WRITE ON STREAM browser TO web; \
             GRANT READ, WRITE ON TABLE notes TO web; CREATE TOKEN FOR web VALID FOR '10m'",
        );
        let answer: Value = serde_json::from_str(&answer).unwrap();
        answer["results"][4]["rows"][0][2].as_str().unwrap().to_string()
    } else {
        String::new()
    };
    // Written without an Origin, as any non-browser client: there is something to read.
    let (status, body) = if access {
        common::post_as(server.address, "/streams/browser", r#"{"n":0}"#, ROOT)
    } else {
        common::post(server.address, "/streams/browser", r#"{"n":0}"#).unwrap()
    };
    assert_eq!(status, 200, "{body}");
    let page = PAGE.replace("__ONEHOP__", &format!("http://{}", server.address)).replace("__TOKEN__", &token);
    let page_server = PageServer::serve(page_listener, page);
    let findings = run_page(&page_server, dir.path());
    (server, findings)
}

#[test]
fn a_page_from_an_allowed_origin_reads_writes_and_subscribes() {
    let dir = DataDir::new();
    let (server, findings) = run(&dir, Setting::Environment, |page| format!("http://{page}"), false);
    assert_allowed_steps(&findings);
    assert_ok(&findings, "simple_post");
    let (status, body) = get(server.address, "/streams/simple?from=earliest");
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["records"][0]["value_text"], "from the page", "{body}");
}

/// With users defined, a page from an allowed origin holding a token does all the same: a
/// Bearer header on `fetch` (preflighted), `access_token` for EventSource and the WebSocket,
/// the token as MQTT's password. Without the token it reads a 401, and a write its user may
/// not make is a 403 it can read; the simple POST, which cannot carry the token, acts on
/// nothing.
#[test]
fn a_page_with_a_token_reads_writes_and_subscribes_as_its_user() {
    let dir = DataDir::new();
    let (server, findings) = run(&dir, Setting::Flag, |page| format!("http://{page}"), true);
    assert_allowed_steps(&findings);
    let without = assert_ok(&findings, "without_token");
    assert_eq!(
        (without["status"].as_u64(), without["body"]["error"]["code"].as_str()),
        (Some(401), Some("unauthenticated"))
    );
    let forbidden = assert_ok(&findings, "forbidden_write");
    assert_eq!(
        (forbidden["status"].as_u64(), forbidden["body"]["error"]["code"].as_str()),
        (Some(403), Some("forbidden"))
    );
    assert_eq!(step(&findings, "simple_post")["type"], "opaque", "{findings:#}");
    let root = |path: &str| common::get_as_status(server.address, path, ROOT);
    assert_eq!(root("/streams/simple?from=earliest").0, 404, "the simple POST without a token was acted on");
    let (status, body) = root("/streams/secrets?from=earliest");
    assert_eq!(status, 200, "{body}");
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["records"], serde_json::json!([]), "{body}");
}

/// With users defined, a page from an origin not allowed gets nothing even with a valid token,
/// and nothing is written.
#[test]
fn a_page_from_another_origin_gets_nothing_even_with_a_token() {
    let dir = DataDir::new();
    let (server, findings) = run(&dir, Setting::Flag, |page| format!("http://localhost:{}", page.port()), true);
    for name in FETCHING_STEPS.iter().chain(&["without_token", "forbidden_write"]) {
        let step = step(&findings, name);
        assert_eq!(step["ok"], false, "step {name:?} worked from an origin not allowed: {step:#}");
    }
    let (status, body) = common::get_as_status(server.address, "/streams/browser?from=earliest", ROOT);
    let records = serde_json::from_str::<Value>(&body).unwrap()["records"].as_array().map(Vec::len);
    assert_eq!((status, records), (200, Some(1)), "only the test's own record: {body}");
    assert_eq!(common::get_as_status(server.address, "/tables/notes/n1", ROOT).0, 404);
}

/// What a page from an allowed origin finds, with or without access on.
fn assert_allowed_steps(findings: &Value) {
    // Preflighted writes (Content-Type: application/json) and a read of what they wrote.
    let first = assert_ok(findings, "publish_first");
    assert_eq!((first["status"].as_u64(), first["body"]["offset"].as_u64()), (Some(200), Some(1)), "{first:#}");
    let second = assert_ok(findings, "publish_second");
    assert_eq!(second["body"]["offset"], 2, "{second:#}");
    let records = assert_ok(findings, "get_records");
    let values: Vec<&Value> =
        records["body"]["records"].as_array().unwrap().iter().map(|record| &record["value"]["n"]).collect();
    assert_eq!(values, [0, 1, 2], "{records:#}");

    let event_source = assert_ok(findings, "event_source");
    assert_eq!(event_source["id"], "0:0", "{event_source:#}");
    assert_eq!(event_source["record"]["value"]["n"], 0, "{event_source:#}");
    // Resumed right after 0:0: the first event is the page's first record.
    let resume = assert_ok(findings, "resume");
    let first_event = resume["first_event"].as_str().unwrap();
    assert!(first_event.contains("id: 0:1") && first_event.contains(r#""n":1"#), "{resume:#}");

    // The ETag is a header the page may read only when onehop exposes it.
    let put = assert_ok(findings, "put_row");
    assert_eq!(put["status"], 201, "{put:#}");
    let etag = put["etag"].as_str().unwrap_or_else(|| panic!("the page could not read the ETag: {put:#}"));
    let row = assert_ok(findings, "get_row");
    assert_eq!((row["status"].as_u64(), row["etag"].as_str()), (Some(200), Some(etag)), "{row:#}");
    assert_eq!(row["body"]["text"], "from the page", "{row:#}");

    let socket = assert_ok(findings, "web_socket");
    let kinds: Vec<(&str, &str)> = socket["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|message| (message["type"].as_str().unwrap(), message["subscription"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds[..2], [("subscribed", "url"), ("record", "url")], "{socket:#}");
    assert_eq!(kinds.last(), Some(&("subscribed", "second")), "{socket:#}");
    let mqtt = assert_ok(findings, "mqtt");
    assert_eq!(mqtt["connack"], serde_json::json!([0x20, 2, 0, 0]), "{mqtt:#}");
}

#[test]
fn a_page_from_another_origin_gets_nothing_and_changes_nothing() {
    let dir = DataDir::new();
    // The same port under another name is another origin.
    let (server, findings) = run(&dir, Setting::Flag, |page| format!("http://localhost:{}", page.port()), false);

    for name in FETCHING_STEPS {
        let step = step(&findings, name);
        assert_eq!(step["ok"], false, "step {name:?} worked from an origin not allowed: {step:#}");
    }
    // The browser sends a simple request without asking and hides the answer; onehop must not
    // have acted on it.
    assert_eq!(step(&findings, "simple_post")["type"], "opaque", "{findings:#}");
    let (status, body) = get(server.address, "/streams/simple?from=earliest");
    assert_eq!(status, 404, "the page's simple POST was acted on: {body}");
    let (status, body) = get(server.address, "/streams/browser?from=earliest");
    let records = serde_json::from_str::<Value>(&body).unwrap()["records"].as_array().map(Vec::len);
    assert_eq!((status, records), (200, Some(1)), "only the test's own record: {body}");
    let (status, body) = get(server.address, "/tables/notes/n1");
    assert_eq!(status, 404, "{body}");
    // Each of the ten steps was refused by onehop for its origin, not by chance: one request
    // each (a preflight for the writes and the resume), none retried after a refusal.
    let (_, metrics) = get(server.address, "/metrics");
    let refused = metrics
        .lines()
        .find_map(|line| line.strip_prefix(r#"http_errors_total{code="origin_not_allowed"} "#))
        .unwrap_or_else(|| panic!("no origin_not_allowed count in\n{metrics}"));
    assert_eq!(refused, "10", "{metrics}");
}
