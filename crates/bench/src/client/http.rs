//! Writes and point queries over HTTP/1.1 keep-alive, sent by the scheduler thread itself.
//!
//! The scheduler writes each request straight to an idle keep-alive connection (opening one
//! more when all are busy, up to [`CONNECTIONS_MAX`], then pipelining on the least busy); a
//! reader thread per connection parses the answers in order and records them. Nothing sits
//! between the intended send time and the socket but the request's encoding (and, over TLS,
//! its sealing into records).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};

use super::Endpoints;
use super::http1;
use super::link::{Dial, LinkReader, LinkWriter};
use crate::plan::{Plan, ViewPlan};
use crate::recorder::{Recorder, Track};
use crate::schedule::Producer;

/// Keep-alive connections one writer opens at most; past it, requests are pipelined.
const CONNECTIONS_MAX: usize = 64;
/// Connections a writer opens before the schedule starts. A request sent while those are all
/// busy opens one more, so its latency includes the connect and, over TLS, the handshake; at
/// the workloads' published rates (answers in about a millisecond, 20–100 requests a second)
/// these are never all busy at once.
const CONNECTIONS_FIRST: usize = 4;

/// A client for setup requests (definitions), which are not measured.
pub fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder().pool_max_idle_per_host(8).tcp_nodelay(true).build()?)
}

/// Runs SQL definitions on the server, as `authorization` says (nobody, when `None`), and
/// returns its answer.
pub async fn sql(
    client: &reqwest::Client,
    url: &str,
    authorization: Option<&str>,
    statements: &str,
) -> anyhow::Result<serde_json::Value> {
    let mut request = client.post(format!("{url}/sql")).body(statements.to_string());
    if let Some(authorization) = authorization {
        request = request.header("authorization", authorization);
    }
    let response = request.send().await.with_context(|| format!("reaching the server at {url}"))?;
    if !response.status().is_success() {
        bail!("{statements}: {}", response.text().await.unwrap_or_default());
    }
    Ok(response.json().await.unwrap_or_default())
}

/// Which schedule a writer's requests belong to.
#[derive(Clone, Copy, Debug)]
enum Answers {
    Events,
    Queries,
}

fn track(recorder: &Recorder, answers: Answers) -> &Track {
    match answers {
        Answers::Events => &recorder.events,
        Answers::Queries => recorder.queries.as_ref().expect("a query track"),
    }
}

/// One keep-alive connection: the socket the scheduler writes, and the requests awaiting
/// their answers, in order, shared with its reader thread.
struct Connection {
    writer: LinkWriter,
    waiting: Arc<Mutex<Waiting>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

struct Waiting {
    requests: VecDeque<Range<u64>>,
    /// False once the reader has stopped: nothing more will be answered here.
    open: bool,
}

/// Builds the request for events `seqs`.
type BuildRequest = Box<dyn FnMut(Range<u64>, &Track) -> Vec<u8> + Send>;

pub struct HttpWriter {
    dial: Dial,
    connections: Vec<Connection>,
    recorder: Arc<Recorder>,
    answers: Answers,
    build: BuildRequest,
    /// Whether an answer's status means the request succeeded.
    accept: fn(u16) -> bool,
    /// A request encoded ahead of its due time ([`Producer::prepare`]).
    prepared: Option<(u64, Vec<u8>)>,
}

/// The `host:port` of an `http://host:port` URL.
pub fn address_of(url: &str) -> String {
    url.trim_start_matches("http://").trim_end_matches('/').to_string()
}

impl HttpWriter {
    fn new(
        endpoints: &Endpoints,
        recorder: Arc<Recorder>,
        answers: Answers,
        build: BuildRequest,
        accept: fn(u16) -> bool,
    ) -> anyhow::Result<HttpWriter> {
        let mut writer = HttpWriter {
            dial: endpoints.http_dial(),
            connections: Vec::new(),
            recorder,
            answers,
            build,
            accept,
            prepared: None,
        };
        // Connections up front, so no event pays for a connect or a handshake.
        for _ in 0..CONNECTIONS_FIRST {
            writer.connect()?;
        }
        Ok(writer)
    }

    /// Publishes events to `stream_path` (`/streams/{s}`): one request per event, or one
    /// NDJSON batch when several are due together (its answer, once they are durable,
    /// acknowledges them all).
    pub fn events(
        endpoints: &Endpoints,
        stream_path: String,
        plan: Arc<Plan>,
        recorder: Arc<Recorder>,
    ) -> anyhow::Result<Self> {
        let (host, authorization) = (endpoints.http_dial().address, endpoints.authorization());
        let build: BuildRequest = Box::new(move |seqs: Range<u64>, track: &Track| {
            if seqs.end - seqs.start == 1 {
                let seq = seqs.start;
                let intended_ns = track.intended_ns(seq);
                let mut target = stream_path.clone();
                let mut separator = '?';
                if let Some(key) = plan.key_of(seq) {
                    target.push_str(&format!("{separator}key={}", http1::encode(&key)));
                    separator = '&';
                }
                if let Some(subject) = plan.subject_of(seq) {
                    target.push_str(&format!("{separator}subject={}", http1::encode(&subject)));
                }
                let value = plan.value_json(seq, intended_ns, track.clock.epoch_ms_at(intended_ns));
                return http1::request("POST", &host, &target, None, authorization.as_deref(), value.as_bytes());
            }
            let mut body = String::with_capacity((seqs.end - seqs.start) as usize * 96);
            for seq in seqs {
                let intended_ns = track.intended_ns(seq);
                body.push('{');
                if let Some(key) = plan.key_of(seq) {
                    body.push_str(&format!("\"key\":{},", serde_json::Value::from(key)));
                }
                if let Some(subject) = plan.subject_of(seq) {
                    body.push_str(&format!("\"subject\":{},", serde_json::Value::from(subject)));
                }
                body.push_str("\"value\":");
                body.push_str(&plan.value_json(seq, intended_ns, track.clock.epoch_ms_at(intended_ns)));
                body.push_str("}\n");
            }
            let ndjson = Some("application/x-ndjson");
            http1::request("POST", &host, &stream_path, ndjson, authorization.as_deref(), body.as_bytes())
        });
        HttpWriter::new(endpoints, recorder, Answers::Events, build, |status| (200..300).contains(&status))
    }

    /// Reads a view's rows for one key (`GET {view_path}/{key}`) per scheduled query. A key
    /// with no rows yet is a valid answer (404 `not_found`), not an error.
    pub fn queries(
        endpoints: &Endpoints,
        view_path: String,
        view: ViewPlan,
        recorder: Arc<Recorder>,
    ) -> anyhow::Result<Self> {
        let (host, authorization) = (endpoints.http_dial().address, endpoints.authorization());
        let build: BuildRequest = Box::new(move |seqs: Range<u64>, _: &Track| {
            let mut bytes = Vec::new();
            for seq in seqs {
                let target = format!("{view_path}/k{}", view.query_key_of(seq));
                bytes.extend_from_slice(&http1::request("GET", &host, &target, None, authorization.as_deref(), b""));
            }
            bytes
        });
        HttpWriter::new(endpoints, recorder, Answers::Queries, build, |status| {
            (200..300).contains(&status) || status == 404
        })
    }

    fn connect(&mut self) -> anyhow::Result<usize> {
        let (writer, reader) =
            self.dial.connect().with_context(|| format!("connecting to HTTP at {}", self.dial.address))?;
        let waiting = Arc::new(Mutex::new(Waiting { requests: VecDeque::new(), open: true }));
        let reader = {
            let (waiting, recorder) = (waiting.clone(), self.recorder.clone());
            let (answers, accept) = (self.answers, self.accept);
            std::thread::Builder::new().name(format!("bench-http-{}", self.connections.len())).spawn(move || {
                crate::priority::raise_this_thread();
                read_answers(reader, waiting, recorder, answers, accept)
            })?
        };
        let mut connection = Connection { writer, waiting, reader: Some(reader) };
        // A first request at once: a connection that has sent none is closed by the server
        // after its header read timeout (10 s), as a slow client's would be; one that has is
        // kept for its idle timeout (60 s). Its answer counts for no event.
        connection.waiting.lock().expect("waiting").requests.push_back(0..0);
        let warm_up = http1::request("GET", &self.dial.address, "/healthz", None, None, b"");
        connection
            .writer
            .write_all(&warm_up)
            .with_context(|| format!("warming up a connection to {}", self.dial.address))?;
        self.connections.push(connection);
        Ok(self.connections.len() - 1)
    }

    /// Forgets connections the server has closed (idle past its timeout), so new ones can be
    /// opened in their place.
    fn forget_closed(&mut self) {
        self.connections.retain_mut(|connection| {
            let open = connection.waiting.lock().expect("waiting").open;
            if !open && let Some(reader) = connection.reader.take() {
                let _ = reader.join();
            }
            open
        });
    }

    /// An idle open connection, else a new one, else the open one with the fewest waiting.
    fn choose(&mut self) -> Option<usize> {
        self.forget_closed();
        let mut best: Option<(usize, usize)> = None;
        for (index, connection) in self.connections.iter().enumerate() {
            let waiting = connection.waiting.lock().expect("waiting");
            if !waiting.open {
                continue;
            }
            if waiting.requests.is_empty() {
                return Some(index);
            }
            if best.is_none_or(|(_, fewest)| waiting.requests.len() < fewest) {
                best = Some((index, waiting.requests.len()));
            }
        }
        if self.connections.len() < CONNECTIONS_MAX {
            match self.connect() {
                Ok(index) => return Some(index),
                Err(error) => self.recorder.problem(format!("{error:#}")),
            }
        }
        best.map(|(index, _)| index)
    }
}

impl Producer for HttpWriter {
    fn prepare(&mut self, seq: u64) {
        self.prepare_request(seq);
    }

    fn send(&mut self, seqs: Range<u64>) {
        let recorder = self.recorder.clone();
        let track = track(&recorder, self.answers);
        let bytes = match self.prepared.take() {
            Some((seq, bytes)) if seqs == (seq..seq + 1) => bytes,
            _ => (self.build)(seqs.clone(), track),
        };
        let fail = |why: String| {
            let now_ns = track.clock.now_ns();
            for seq in seqs.clone() {
                track.sent(seq, now_ns);
                track.answered(seq, now_ns, false);
            }
            recorder.problem(why);
        };
        let Some(index) = self.choose() else {
            fail(format!("no connection to {} could be opened", self.dial.address));
            return;
        };
        let connection = &mut self.connections[index];
        // Queries go one per request; events one request per call.
        let requests: Vec<Range<u64>> = match self.answers {
            Answers::Events => vec![seqs.clone()],
            Answers::Queries => seqs.clone().map(|seq| seq..seq + 1).collect(),
        };
        {
            let mut waiting = connection.waiting.lock().expect("waiting");
            if !waiting.open {
                drop(waiting);
                fail("the connection closed".into());
                return;
            }
            waiting.requests.extend(requests);
        }
        let sent_ns = track.clock.now_ns();
        for seq in seqs {
            track.sent(seq, sent_ns);
        }
        if let Err(error) = connection.writer.write_all(&bytes) {
            // The reader sees the connection end and fails what is waiting on it.
            connection.writer.shutdown();
            self.recorder.problem(format!("writing a request: {error}"));
        }
    }
}

impl HttpWriter {
    fn prepare_request(&mut self, seq: u64) {
        let recorder = self.recorder.clone();
        let bytes = (self.build)(seq..seq + 1, track(&recorder, self.answers));
        self.prepared = Some((seq, bytes));
    }
}

impl Drop for HttpWriter {
    fn drop(&mut self) {
        for connection in &mut self.connections {
            connection.writer.shutdown();
            if let Some(reader) = connection.reader.take() {
                let _ = reader.join();
            }
        }
    }
}

/// Parses answers in order until the connection ends, then fails whatever still waits.
fn read_answers(
    mut stream: LinkReader,
    waiting: Arc<Mutex<Waiting>>,
    recorder: Arc<Recorder>,
    answers: Answers,
    accept: fn(u16) -> bool,
) {
    let track = track(&recorder, answers);
    let mut buffer: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    let ended = 'read: loop {
        let read = match stream.read(&mut chunk) {
            Ok((0, _)) => break 'read "the server closed the connection".to_string(),
            Ok((read, _)) => read,
            Err(error) => break 'read format!("reading an answer: {error}"),
        };
        let now_ns = track.clock.now_ns();
        buffer.extend_from_slice(&chunk[..read]);
        let mut used = 0;
        loop {
            match http1::parse_response(&buffer[used..]) {
                Ok(Some((status, body, length))) => {
                    used += length;
                    let Some(request) = waiting.lock().expect("waiting").requests.pop_front() else {
                        break 'read format!("an answer ({status}) to no request");
                    };
                    let ok = accept(status);
                    for seq in request {
                        track.answered(seq, now_ns, ok);
                    }
                    if !ok {
                        recorder.problem(format!("refused: {status} {}", String::from_utf8_lossy(&body)));
                    }
                }
                Ok(None) => break,
                Err(error) => break 'read error,
            }
        }
        buffer.drain(..used);
    };
    let mut waiting = waiting.lock().expect("waiting");
    waiting.open = false;
    let now_ns = track.clock.now_ns();
    let unanswered: Vec<Range<u64>> = waiting.requests.drain(..).collect();
    drop(waiting);
    // A connection closed with nothing waiting on it is a keep-alive connection the server
    // let go (idle past its timeout), as every HTTP client sees now and then: the writer opens
    // another when it needs one. Requests waiting on it are lost, and said.
    if !unanswered.is_empty() {
        recorder.problem(format!("HTTP connection ended: {ended}"));
    }
    for request in unanswered {
        for seq in request {
            track.answered(seq, now_ns, false);
        }
    }
}
