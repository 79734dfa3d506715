//! Talking to the onehop nodes from the ledger processes and the observer: blocking HTTP/1.1
//! on keep-alive sockets (one thread per connection, nothing in between), the transaction
//! log's publisher with its unknown-outcome recovery, and an SSE subscription reader.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::ledger::RecordValue;
use crate::client::http1::{self, Chunked, Framing};

/// How long a publish may wait for its answer. A write waits up to 10 s for a leader
/// (docs/cluster.md), so past this the node is taken for gone.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(12);
/// How long an unknown outcome may take to resolve (a new Raft leader is elected within about
/// a second; this leaves room for a loaded machine) before the ledger gives up.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Records one read-back asks for (the server's own cap).
const READ_LIMIT: u32 = 10_000;

/// Sends one request on `stream` and reads its answer: status and body.
fn exchange(stream: &mut TcpStream, request: &[u8]) -> io::Result<(u16, Vec<u8>)> {
    stream.write_all(request)?;
    let mut bytes = Vec::with_capacity(4096);
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the node closed the connection"));
        }
        bytes.extend_from_slice(&chunk[..read]);
        match http1::parse_response(&bytes) {
            Ok(Some((status, body, _))) => return Ok((status, body)),
            Ok(None) => {}
            Err(error) => return Err(io::Error::new(io::ErrorKind::InvalidData, error)),
        }
    }
}

fn connect(address: &str) -> io::Result<TcpStream> {
    let stream = TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    Ok(stream)
}

/// One request on a connection of its own (setup: definitions, read-backs).
pub fn request(address: &str, method: &str, target: &str, body: &[u8]) -> io::Result<(u16, Vec<u8>)> {
    let mut stream = connect(address)?;
    let content_type = (!body.is_empty()).then_some("text/plain");
    exchange(&mut stream, &http1::request(method, address, target, content_type, None, body))
}

/// Runs SQL on the node at `address`.
pub fn sql(address: &str, statements: &str) -> anyhow::Result<()> {
    let (status, body) = request(address, "POST", "/sql", statements.as_bytes())
        .with_context(|| format!("reaching the node at {address}"))?;
    if status != 200 {
        bail!("{statements}: {status} {}", String::from_utf8_lossy(&body));
    }
    Ok(())
}

/// How a publisher recognises its batch in the log when it reads it back.
#[derive(Clone, Copy, Debug)]
pub enum Logged {
    /// Transactions up to this sequence.
    Through(u64),
    /// The takeover marker of this epoch.
    Takeover(u64),
}

/// Publishes the ledger's batches to the stream, one NDJSON request per batch, on a
/// keep-alive connection to one node, moving to the next node when that one fails.
pub struct Publisher {
    addresses: Vec<String>,
    current: usize,
    connection: Option<TcpStream>,
    path: String,
    /// The offset after the last record this publisher knows to be in the stream.
    next_offset: u64,
    /// Publishes whose outcome was unknown (the node died or answered `unconfirmed`).
    pub unknown_outcomes: u64,
    /// Batches published again after a read-back did not find them.
    pub republished: u64,
    /// How long each answered publish took, request written to answer read: the round of the
    /// Raft log as the ledger sees it.
    pub round_trips: hdrhistogram::Histogram<u64>,
}

impl Publisher {
    /// A publisher to `stream`, starting with node `first` of `addresses`.
    pub fn new(addresses: Vec<String>, first: usize, stream: &str) -> Publisher {
        assert!(first < addresses.len());
        Publisher {
            addresses,
            current: first,
            connection: None,
            path: format!("/streams/{stream}"),
            next_offset: 0,
            unknown_outcomes: 0,
            republished: 0,
            round_trips: crate::histogram::latency_histogram(),
        }
    }

    /// One attempt: `Ok(true)` committed, `Ok(false)` outcome unknown, `Err` refused.
    fn attempt(&mut self, body: &[u8]) -> anyhow::Result<bool> {
        let address = &self.addresses[self.current];
        if self.connection.is_none() {
            match connect(address) {
                Ok(stream) => self.connection = Some(stream),
                Err(_) => return Ok(false),
            }
        }
        let request = http1::request("POST", address, &self.path, Some("application/x-ndjson"), None, body);
        let stream = self.connection.as_mut().expect("connected above");
        let sent = Instant::now();
        match exchange(stream, &request) {
            Ok((200, answer)) => {
                crate::histogram::record(&mut self.round_trips, sent.elapsed().as_nanos() as u64);
                // The answer lists every record's offset; the last one is all this needs.
                let text = String::from_utf8_lossy(&answer);
                let last = text
                    .rfind("\"offset\":")
                    .and_then(|at| text[at + 9..].split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok())
                    .with_context(|| format!("an answer without offsets: {text}"))?;
                self.next_offset = last + 1;
                Ok(true)
            }
            // `unconfirmed`: the leader changed or no majority answered; it may be committed.
            Ok((503, _)) | Err(_) => {
                self.connection = None;
                Ok(false)
            }
            Ok((status, answer)) => bail!("publishing a batch: {status} {}", String::from_utf8_lossy(&answer)),
        }
    }

    /// Publishes `body`, which `wanted` identifies in the log, until it is committed exactly
    /// once as far as this publisher can tell. After an unknown outcome it moves to the next
    /// node and reads the stream from where it knows it ends: a batch found there is done; one
    /// not found is sent again. A batch that was committed after all but not yet visible to the
    /// read is then in the log twice, with the same sequences: readers skip the second copy.
    pub fn publish(&mut self, body: &[u8], wanted: Logged) -> anyhow::Result<()> {
        if self.attempt(body)? {
            return Ok(());
        }
        let deadline = Instant::now() + RESOLVE_TIMEOUT;
        loop {
            self.unknown_outcomes += 1;
            if Instant::now() > deadline {
                bail!("{wanted:?} could not be published for {RESOLVE_TIMEOUT:?}");
            }
            self.current = (self.current + 1) % self.addresses.len();
            std::thread::sleep(Duration::from_millis(100));
            match self.scan_logged() {
                Ok((highest_seq, _)) if matches!(wanted, Logged::Through(seq) if highest_seq >= seq) => return Ok(()),
                Ok((_, highest_epoch)) if matches!(wanted, Logged::Takeover(epoch) if highest_epoch >= epoch) => {
                    return Ok(());
                }
                Ok(_) => {}
                // This node is not answering either: on to the next one.
                Err(_) => continue,
            }
            self.republished += 1;
            if self.attempt(body)? {
                return Ok(());
            }
        }
    }

    /// The highest sequence and the highest takeover epoch in the stream from the offset this
    /// publisher knows it reached, read on the current node; moves `next_offset` to the
    /// stream's end.
    fn scan_logged(&mut self) -> anyhow::Result<(u64, u64)> {
        let address = self.addresses[self.current].clone();
        let (mut highest_seq, mut highest_epoch) = (0, 0);
        loop {
            let target = format!("{}?from={}&limit={READ_LIMIT}", self.path, self.next_offset);
            let (status, body) = request(&address, "GET", &target, b"")?;
            if status != 200 {
                bail!("reading {target}: {status} {}", String::from_utf8_lossy(&body));
            }
            let page: serde_json::Value = serde_json::from_slice(&body)?;
            let records = page["records"].as_array().context("a read without records")?;
            if records.is_empty() {
                return Ok((highest_seq, highest_epoch));
            }
            for record in records {
                let value: RecordValue = serde_json::from_value(record["value"].clone())?;
                highest_seq = value.tx.iter().map(|tx| tx.0).fold(highest_seq, u64::max);
                if value.takeover.is_some() {
                    highest_epoch = highest_epoch.max(value.e);
                }
                let offset = record["offset"].as_u64().context("a record without an offset")?;
                self.next_offset = self.next_offset.max(offset + 1);
            }
        }
    }
}

/// An SSE subscription read on a blocking socket.
pub struct EventReader {
    stream: TcpStream,
    chunked: Option<Chunked>,
    raw: Vec<u8>,
    buffer: Vec<u8>,
}

/// What one read of a subscription found.
pub enum ReadOutcome {
    /// Zero or more events were handed over.
    Events,
    /// The server ended the response or closed the connection.
    Closed(String),
}

impl EventReader {
    /// Subscribes to `path` on the node at `address`, from `from` (`earliest`, or an event id
    /// to resume after). Reads wake at least every `tick` so the reader can be stopped.
    pub fn open(address: &str, path: &str, from: &str, tick: Duration) -> anyhow::Result<EventReader> {
        let mut stream = TcpStream::connect(address).with_context(|| format!("connecting to {address}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        let target = format!("{path}?from={}", http1::encode(from));
        let mut request = http1::request("GET", address, &target, None, None, b"");
        request.truncate(request.len() - 2);
        request.extend_from_slice(b"Accept: text/event-stream\r\n\r\n");
        stream.write_all(&request)?;
        let mut bytes = Vec::new();
        let mut chunk = [0u8; 4096];
        let head = loop {
            let read = stream.read(&mut chunk)?;
            if read == 0 {
                bail!("the node closed the connection before answering {target}");
            }
            bytes.extend_from_slice(&chunk[..read]);
            if let Some(head) = http1::parse_head(&bytes).map_err(anyhow::Error::msg)? {
                break head;
            }
        };
        let early = bytes.split_off(head.length);
        if head.status != 200 {
            bail!("subscribing to {target}: {} {}", head.status, String::from_utf8_lossy(&early));
        }
        stream.set_read_timeout(Some(tick))?;
        let chunked = (head.framing == Framing::Chunked).then(Chunked::default);
        Ok(EventReader { stream, chunked, raw: early, buffer: Vec::new() })
    }

    /// Reads what arrived (waiting up to the tick) and calls `on_event(name, data)` for each
    /// complete event.
    pub fn read(&mut self, on_event: impl FnMut(&str, &str)) -> ReadOutcome {
        if self.raw.is_empty() {
            let mut chunk = [0u8; 64 * 1024];
            match self.stream.read(&mut chunk) {
                Ok(0) => return ReadOutcome::Closed("the node closed the connection".into()),
                Ok(read) => self.raw.extend_from_slice(&chunk[..read]),
                Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                    return ReadOutcome::Events;
                }
                Err(error) => return ReadOutcome::Closed(format!("reading: {error}")),
            }
        }
        let mut ended = None;
        match self.chunked.as_mut() {
            Some(decoder) => {
                if let Err(error) = decoder.feed(&self.raw, &mut self.buffer) {
                    ended = Some(format!("a malformed response: {error}"));
                } else if decoder.is_done() {
                    ended = Some("the node ended the response".to_string());
                }
            }
            None => self.buffer.extend_from_slice(&self.raw),
        }
        self.raw.clear();
        crate::client::sse::take_events(&mut self.buffer, on_event);
        match ended {
            Some(why) => ReadOutcome::Closed(why),
            None => ReadOutcome::Events,
        }
    }
}
