//! Helpers shared by the binary's tests: start `onehop serve` and talk HTTP to it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// A client process, killed and reaped when the test ends, whether it passes or not.
pub struct Spawned(pub Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback port free now, for a listener a test must name before it starts (a cluster's
/// peers, a Kafka listener kept across restarts), and never handed out before in this run.
/// Taken below the system's ephemeral range, from a place set by the process id: a listener on
/// port 0, or a client's connection, elsewhere in the run cannot be given it meanwhile.
pub fn free_port() -> u16 {
    use std::sync::Mutex;
    static NEXT: Mutex<Option<(u16, u16, u16)>> = Mutex::new(None);
    let mut next = NEXT.lock().unwrap();
    let (low, span, at) = next.get_or_insert_with(|| {
        // The system's ephemeral ports start here (Linux: 32768 unless configured).
        let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32768);
        let low = 10_000.min(ephemeral / 2);
        let span = ephemeral - low;
        (low, span, (std::process::id() % u32::from(span)) as u16)
    });
    for _ in 0..*span {
        let port = *low + *at;
        *at = (*at + 1) % *span;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between {low} and {}", *low + *span);
}

/// Runs curl with `args` against `http://{address}{path}`: the status and the body.
pub fn curl(address: SocketAddr, path: &str, args: &[&str]) -> (u16, String) {
    let output = Command::new("curl")
        .args(["-s", "-S", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .arg(format!("http://{address}{path}"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8(output.stdout).unwrap();
    let (body, status) = text.rsplit_once('\n').unwrap();
    (status.parse().unwrap(), body.to_string())
}

pub struct Server {
    pub child: Child,
    pub address: SocketAddr,
    /// The MQTT listener's address (logged before the HTTP one, which means ready).
    pub mqtt_address: SocketAddr,
    /// The Kafka listener's address, unless it is off.
    pub kafka_address: Option<SocketAddr>,
    /// The Postgres listener's address, unless it is off.
    pub pg_address: Option<SocketAddr>,
    /// Every stderr line the server printed so far, collected by a reader thread.
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
}

/// A test's own directory: servers run in it with their data in `data/` inside it, and it is
/// removed when the test ends.
pub struct DataDir {
    pub dir: tempfile::TempDir,
    pub data: PathBuf,
}

impl DataDir {
    pub fn new() -> DataDir {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        DataDir { dir, data }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The data directory as `--data-dir` takes it.
    pub fn data_arg(&self) -> &str {
        self.data.to_str().unwrap()
    }

    /// Writes `statements` to `schema.sql` in this directory; returns its path as `--schema`
    /// takes it.
    pub fn schema_file(&self, statements: &str) -> String {
        let path = self.path().join("schema.sql");
        std::fs::write(&path, statements).unwrap();
        path.to_str().unwrap().to_string()
    }

    /// The arguments of a server on this data and a free HTTP port, then `extra`.
    pub fn serve_args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["--http-addr", "127.0.0.1:0", "--data-dir", self.data_arg()];
        if !extra.contains(&"--kafka-addr") {
            args.extend(["--kafka-addr", "127.0.0.1:0"]);
        }
        args.extend_from_slice(extra);
        args
    }

    /// Starts `onehop serve` with `serve_args(extra)` in this directory and waits until it is
    /// listening; a second start after a stop or `kill_9` finds the same data.
    pub fn start(&self, extra: &[&str], envs: &[(&str, &str)]) -> Server {
        start(self.path(), &self.serve_args(extra), envs)
    }
}

pub fn onehop() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_onehop"));
    // Keep the environment of whoever runs the tests out of the server's settings.
    for (key, _) in std::env::vars() {
        if key.starts_with("ONEHOP_") {
            command.env_remove(key);
        }
    }
    command
}

/// Runs `command` to its end, failing the test unless it succeeds and prints UTF-8; returns
/// its stdout and stderr.
pub fn run_expecting_success(command: &mut Command) -> (String, String) {
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{}\n{stderr}", String::from_utf8_lossy(&output.stdout));
    (String::from_utf8(output.stdout).unwrap(), stderr)
}

/// The JSON document on the last line of `stdout`, where `--json` puts a command's report.
pub fn last_json_line(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

/// Runs `onehop bench {args} --json --no-progress --dir <a fresh directory>`, failing the test
/// unless it succeeds; returns the report it printed last and the directory, in which a bench
/// that started its own server must leave nothing behind.
pub fn bench_report(args: &[&str]) -> (serde_json::Value, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, _) = run_expecting_success(
        onehop().arg("bench").args(args).args(["--json", "--no-progress", "--dir"]).arg(dir.path()),
    );
    (last_json_line(&stdout), dir)
}

/// Runs `onehop bench` with `args`, `--no-progress`, `--out` (a `results` directory) and
/// `--dir` in a new temporary directory; returns the JSON lines it printed, what it said on
/// stderr, and that directory.
pub fn bench_lines(args: &[&str]) -> (Vec<serde_json::Value>, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (stdout, stderr) = run_expecting_success(
        onehop()
            .arg("bench")
            .args(args)
            .args(["--no-progress", "--out"])
            .arg(dir.path().join("results"))
            .arg("--dir")
            .arg(dir.path()),
    );
    let lines =
        stdout.lines().filter(|line| line.starts_with('{')).map(|line| serde_json::from_str(line).unwrap()).collect();
    (lines, stderr, dir)
}

/// Starts `onehop serve` with `args` in `cwd` and waits until it is listening.
pub fn start(cwd: &Path, args: &[&str], envs: &[(&str, &str)]) -> Server {
    let mut command = onehop();
    command.arg("serve").args(args);
    // Tests run in parallel: every server takes a free MQTT port unless a test picks one.
    let mqtt_chosen = args.contains(&"--mqtt-addr") || envs.iter().any(|(key, _)| *key == "ONEHOP_MQTT_ADDR");
    if !mqtt_chosen {
        command.args(["--mqtt-addr", "127.0.0.1:0"]);
    }
    let kafka_chosen = args.contains(&"--kafka-addr") || envs.iter().any(|(key, _)| *key == "ONEHOP_KAFKA_ADDR");
    if !kafka_chosen {
        command.args(["--kafka-addr", "127.0.0.1:0"]);
    }
    let pg_chosen = args.contains(&"--pg-addr") || envs.iter().any(|(key, _)| *key == "ONEHOP_PG_ADDR");
    if !pg_chosen {
        command.args(["--pg-addr", "127.0.0.1:0"]);
    }
    let pg_off = args.windows(2).any(|pair| pair == ["--pg-addr", "off"])
        || envs.iter().any(|(key, value)| *key == "ONEHOP_PG_ADDR" && *value == "off");
    let kafka_off = args.windows(2).any(|pair| pair == ["--kafka-addr", "off"])
        || envs.iter().any(|(key, value)| *key == "ONEHOP_KAFKA_ADDR" && *value == "off");
    let mut child = command
        .envs(envs.iter().copied())
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn onehop serve");
    let lines = line_channel(child.stderr.take().unwrap());
    let mut server = Server {
        child,
        address: "127.0.0.1:1".parse().unwrap(),
        mqtt_address: "127.0.0.1:1".parse().unwrap(),
        kafka_address: None,
        pg_address: None,
        lines,
        seen: Vec::new(),
    };
    let line = server.wait_for_line("listening on mqtt://");
    let address = line.split("listening on mqtt://").nth(1).unwrap();
    let address = address.split(|c: char| c.is_whitespace() || c == '"').next().unwrap();
    server.mqtt_address = address.parse().unwrap_or_else(|_| panic!("bad address in {line:?}"));
    if !kafka_off {
        let line = server.wait_for_line("listening on kafka://");
        let address = line.split("listening on kafka://").nth(1).unwrap();
        let address = address.split(|c: char| c.is_whitespace() || c == '"').next().unwrap();
        server.kafka_address = Some(address.parse().unwrap_or_else(|_| panic!("bad address in {line:?}")));
    }
    if !pg_off {
        let line = server.wait_for_line("listening on postgres://");
        let address = line.split("listening on postgres://").nth(1).unwrap();
        let address = address.split(|c: char| c.is_whitespace() || c == '"').next().unwrap();
        server.pg_address = Some(address.parse().unwrap_or_else(|_| panic!("bad address in {line:?}")));
    }
    let line = server.wait_for_line("listening on http://");
    let address = line.split("listening on http://").nth(1).unwrap();
    let address = address.split(|c: char| c.is_whitespace() || c == '"').next().unwrap();
    server.address = address.parse().unwrap_or_else(|_| panic!("bad address in {line:?}"));
    server
}

/// The lines `source` gives, read on a thread of their own as they come, until it ends or the
/// receiver is dropped.
pub fn line_channel(source: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (sender, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(source).lines().map_while(Result::ok) {
            if sender.send(line).is_err() {
                break;
            }
        }
    });
    lines
}

impl Server {
    pub fn wait_for_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no line containing {needle:?}; server said:\n{}", self.seen.join("\n")),
            }
        }
    }

    /// Every line the server printed so far, including those no wait has looked at yet.
    pub fn said(&mut self) -> &[String] {
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill").arg(format!("-{name}")).arg(self.child.id().to_string()).status().unwrap();
        assert!(status.success());
    }

    /// SIGKILL: no clean shutdown, nothing flushed or closed, and the data directory's lock
    /// dies with the process.
    pub fn kill_9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Kills this server with kill -9 after `delay`, from a thread of its own (by its PID, so
    /// only the server the test started): what a crash at an instant the test does not choose
    /// does. Join the thread, then [`Server::kill_9`] to reap it.
    pub fn kill_9_after(&self, delay: Duration) -> std::thread::JoinHandle<()> {
        let pid = self.child.id();
        std::thread::spawn(move || {
            std::thread::sleep(delay);
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        })
    }

    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + STARTUP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // Collect what is left of stderr: its reader ends (and the channel with it) at
                // the end of the exited process's output.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(10)) {
                    self.seen.push(line);
                }
                return status;
            }
            assert!(Instant::now() < deadline, "server did not exit; it said:\n{}", self.seen.join("\n"));
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 GET over a fresh connection; returns (status, body).
pub fn get(address: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
    (status, body)
}

/// The values stored in `stream`, from the start, read as `user` with curl. A value that is not
/// JSON (an MQTT payload of plain text) comes as its text.
pub fn stored_as(address: SocketAddr, stream: &str, user: (&str, &str)) -> Vec<serde_json::Value> {
    let credentials = format!("{}:{}", user.0, user.1);
    let (status, body) = curl(address, &format!("/streams/{stream}?from=earliest"), &["-u", &credentials]);
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    let value = |record: &serde_json::Value| match &record["value"] {
        serde_json::Value::Null => record["value_text"].clone(),
        value => value.clone(),
    };
    body["records"].as_array().unwrap().iter().map(value).collect()
}

/// One HTTP/1.1 request as `user` (HTTP Basic) over a fresh connection: (status, body).
fn request_as(address: SocketAddr, method: &str, path: &str, body: &str, user: (&str, &str)) -> (u16, String) {
    use base64::Engine as _;
    let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", user.0, user.1));
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nAuthorization: Basic {credentials}\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
}

/// One HTTP/1.1 GET as `user` (HTTP Basic): (status, body).
pub fn get_as_status(address: SocketAddr, path: &str, user: (&str, &str)) -> (u16, String) {
    request_as(address, "GET", path, "", user)
}

/// One HTTP/1.1 GET as `user` (HTTP Basic), failing the test unless it answers 200; returns
/// the body.
pub fn get_as(address: SocketAddr, path: &str, user: (&str, &str)) -> String {
    let (status, body) = get_as_status(address, path, user);
    assert_eq!(status, 200, "GET {path}: {body}");
    body
}

/// One HTTP/1.1 POST of `body` as `user` (HTTP Basic): (status, body).
pub fn post_as(address: SocketAddr, path: &str, body: &str, user: (&str, &str)) -> (u16, String) {
    request_as(address, "POST", path, body, user)
}

/// One HTTP/1.1 POST over a fresh connection; returns (status, body), or None when the
/// connection failed (the server was killed mid-request).
pub fn post(address: SocketAddr, path: &str, body: &str) -> Option<(u16, String)> {
    request(address, "POST", path, body)
}

/// One HTTP/1.1 request over a fresh connection; `None` when the connection failed or broke.
pub fn request(address: SocketAddr, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    request_with(address, None, method, path, body)
}

/// [`request`], as `user` (name, password; HTTP Basic) when given.
pub fn request_with(
    address: SocketAddr,
    user: Option<(&str, &str)>,
    method: &str,
    path: &str,
    body: &str,
) -> Option<(u16, String)> {
    use base64::Engine as _;
    let authorization = user.map_or(String::new(), |(name, password)| {
        let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{name}:{password}"));
        format!("Authorization: Basic {credentials}\r\n")
    });
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n{authorization}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default();
    Some((status, body))
}

/// Runs `statements` over `POST /sql` as `user` (HTTP Basic), failing the test unless they
/// succeed; returns the answer.
pub fn sql_as(address: SocketAddr, user: (&str, &str), statements: &str) -> String {
    use base64::Engine as _;
    let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", user.0, user.1));
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!(
        "POST /sql HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nAuthorization: Basic {credentials}\r\n\
         Content-Length: {}\r\n\r\n{statements}",
        statements.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{statements}: {response}");
    response.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default()
}

/// Runs `statements` over `POST /sql`, failing the test unless they succeed; returns the answer.
pub fn sql(address: SocketAddr, statements: &str) -> String {
    let (status, body) = post(address, "/sql", statements).unwrap();
    assert_eq!(status, 200, "{body}");
    body
}

/// Publishes `values` to `stream` in requests of `batch_len` values each, every request
/// acknowledged (durable) before the next is sent.
pub fn publish_in_batches(address: SocketAddr, stream: &str, values: &[serde_json::Value], batch_len: usize) {
    for batch in values.chunks(batch_len) {
        assert!(publish_batch(address, stream, batch));
    }
}

/// Publishes NDJSON envelopes in one request; true once they are acknowledged (durable).
pub fn publish_batch(address: SocketAddr, stream: &str, values: &[serde_json::Value]) -> bool {
    let body: String = values.iter().map(|value| format!("{}\n", serde_json::json!({ "value": value }))).collect();
    let Ok(mut socket) = TcpStream::connect(address) else { return false };
    socket.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request = format!(
        "POST /streams/{stream} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\
         Content-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if socket.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut response = String::new();
    let _ = socket.read_to_string(&mut response);
    response.starts_with("HTTP/1.1 200")
}

pub struct RawSse {
    reader: BufReader<TcpStream>,
}

impl RawSse {
    pub fn open(address: SocketAddr, path: &str, last_event_id: Option<&str>) -> RawSse {
        Self::try_open(address, path, last_event_id).unwrap_or_else(|line| panic!("{line}"))
    }

    /// As `open`, but a response other than 200 comes back as its status line.
    pub fn try_open(address: SocketAddr, path: &str, last_event_id: Option<&str>) -> Result<RawSse, String> {
        let mut stream = TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let resume = last_event_id.map_or_else(String::new, |id| format!("Last-Event-ID: {id}\r\n"));
        write!(stream, "GET {path} HTTP/1.1\r\nHost: {address}\r\nAccept: text/event-stream\r\n{resume}\r\n").unwrap();
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if !line.contains(" 200 ") {
            return Err(line);
        }
        // Skip the headers.
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
        }
        Ok(RawSse { reader })
    }

    /// The next event's name (`message` when it has none) and data, or `None` when the response
    /// ends first.
    pub fn next_event(&mut self) -> Option<(String, serde_json::Value)> {
        let (mut name, mut line) = (None, String::new());
        loop {
            line.clear();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(value) = line.strip_prefix("event: ") {
                name = Some(value.trim().to_string());
            } else if let Some(data) = line.strip_prefix("data: ") {
                let name = name.take().unwrap_or_else(|| "message".into());
                return Some((name, serde_json::from_str(data.trim()).unwrap()));
            }
        }
    }

    /// The next record event's id and data (chunked transfer framing lines are skipped).
    pub fn next(&mut self) -> (String, serde_json::Value) {
        let (mut id, mut line) = (None, String::new());
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            if let Some(value) = line.strip_prefix("id: ") {
                id = Some(value.trim().to_string());
            } else if let Some(data) = line.strip_prefix("data: ") {
                return (id.take().expect("an id before the data"), serde_json::from_str(data.trim()).unwrap());
            }
        }
    }
}

/// Runs openssl with `args` in `dir`, failing the test unless it succeeds.
pub fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl is installed");
    assert!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}

/// A CA `ca{name}.pem` and a certificate for 127.0.0.1 it signed, `server{name}.pem` with its
/// key `server{name}.key`: P-256, valid for a day, made for this test only.
pub fn certificates(dir: &Path, name: &str) {
    let (ca, ca_key) = (format!("ca{name}.pem"), format!("ca{name}.key"));
    let (cert, key, request) = (format!("server{name}.pem"), format!("server{name}.key"), format!("server{name}.csr"));
    let curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &curve,
            &["-keyout", &ca_key, "-out", &ca, "-days", "1", "-subj", &format!("/CN=onehop test CA {name}")],
        ]
        .concat(),
    );
    openssl(dir, &[&["req"][..], &curve, &["-keyout", &key, "-out", &request, "-subj", "/CN=127.0.0.1"]].concat());
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &request,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "1",
            "-extfile",
            "san.ext",
        ],
    );
}

/// Waits until the server's `mqtt_subscriptions` gauge reaches `count` (read as `user` when
/// given): an MQTT subscriber started as a process is subscribed once its SUBACK was sent,
/// and a message published before that never reaches it.
pub fn wait_for_mqtt_subscriptions(address: SocketAddr, count: u64, user: Option<(&str, &str)>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let metrics = match user {
            Some(user) => get_as(address, "/metrics", user),
            None => get(address, "/metrics").1,
        };
        let held = metrics
            .lines()
            .find_map(|line| line.strip_prefix("mqtt_subscriptions "))
            .and_then(|value| value.trim().parse::<f64>().ok());
        if held.is_some_and(|held| held >= count as f64) {
            return;
        }
        assert!(Instant::now() < deadline, "{count} MQTT subscriptions not there in 20 s: {held:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A view's change stream as confluent-kafka's read_committed consumer reads it
/// (`tests/kafka/confluent/read_committed.py`): `(key, row)` in order, each row with its
/// `final` (and `removed`) flags.
pub fn view_changes_over_kafka(kafka: SocketAddr, view: &str) -> Vec<(String, serde_json::Value)> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/confluent/read_committed.py");
    let output = Command::new("python3")
        .arg(script)
        .args([&kafka.to_string(), &format!("__view.{view}")])
        .output()
        .expect("python3 with confluent-kafka is installed by scripts/test");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let record: serde_json::Value = serde_json::from_str(line).unwrap();
            let row = serde_json::from_str(record["value"].as_str().unwrap()).unwrap();
            (record["key"].as_str().unwrap().to_string(), row)
        })
        .collect()
}

/// Every record of `stream`'s `partitions` as `GET /streams/{stream}` gives them (offset, key,
/// value, headers, …), each partition read from its start.
pub fn stream_records(address: SocketAddr, stream: &str, partitions: u32) -> Vec<serde_json::Value> {
    let mut all = Vec::new();
    for partition in 0..partitions {
        let mut from = 0u64;
        loop {
            let (status, body) =
                get(address, &format!("/streams/{stream}?partition={partition}&from={from}&limit=10000"));
            assert_eq!(status, 200, "{body}");
            let body: serde_json::Value = serde_json::from_str(&body).unwrap();
            let records = body["records"].as_array().unwrap();
            let Some(last) = records.last() else { break };
            from = last["offset"].as_u64().unwrap() + 1;
            all.extend(records.iter().cloned());
        }
    }
    all
}

/// `GET /views/{view}`'s first 10 000 keys, each with its first row, and whether the view is
/// still restoring.
pub fn view_first_rows(
    address: SocketAddr,
    view: &str,
) -> (std::collections::BTreeMap<String, serde_json::Value>, bool) {
    let (status, body) = get(address, &format!("/views/{view}?limit=10000"));
    assert_eq!(status, 200, "{body}");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = body["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| (entry["key"].as_str().unwrap().to_string(), entry["rows"][0].clone()))
        .collect();
    (rows, body["status"]["restoring"] != false)
}
