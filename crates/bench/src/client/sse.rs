//! Subscriptions over Server-Sent Events, and the observers that read them.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use anyhow::{Context, bail};
use rustls::ClientConnection;
use serde::Deserialize;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use super::http1::{self, Chunked, Framing, Head};
use super::link::Dial;
use super::{Endpoints, rxstamp, tls};
use crate::plan::Filter;
use crate::recorder::{Delivery, Observation, Receipts, Recorder};
use crate::schedule::Clock;

/// An open SSE response on its own connection, read straight from the socket (no connection
/// task in between: one wake-up per arrival).
pub struct Subscription {
    stream: TcpStream,
    /// The TLS session over `stream`, when there is one: its records are opened as read.
    session: Option<ClientConnection>,
    chunked: Option<Chunked>,
    /// Body bytes read with the head.
    early: Vec<u8>,
}

/// What a subscription follows: the server, and the path and query without a start position.
#[derive(Clone, Debug)]
pub struct Source {
    pub dial: Dial,
    /// The `Authorization` header's value, sent with every subscription.
    pub authorization: Option<String>,
    pub target: String,
}

impl Source {
    /// A subscription to `target` (a path and query) on the server at `endpoints`.
    pub fn new(endpoints: &Endpoints, target: String) -> Source {
        Source { dial: endpoints.http_dial(), authorization: endpoints.authorization(), target }
    }

    /// A subscription to `path` with `filter`.
    pub fn filtered(endpoints: &Endpoints, path: &str, filter: &Filter) -> Source {
        let (name, value) = match filter {
            Filter::Subject(subject) => ("subject", subject.as_str()),
            Filter::Field { field, value } => (*field, value.as_str()),
        };
        Source::new(endpoints, format!("{path}?{name}={}", http1::encode(value)))
    }

    /// The target starting at `from` (`earliest`, or an event id to resume after).
    pub fn from(&self, from: &str) -> String {
        let separator = if self.target.contains('?') { '&' } else { '?' };
        format!("{}{separator}from={}", self.target, http1::encode(from))
    }

    /// Subscribes from the start: the stream or view is new, so this is also everything
    /// written after the subscription exists.
    pub async fn subscribe(&self) -> anyhow::Result<Subscription> {
        self.subscribe_from("earliest").await
    }

    /// Opens an SSE subscription starting at `from`.
    pub async fn subscribe_from(&self, from: &str) -> anyhow::Result<Subscription> {
        let (address, target) = (&self.dial.address, self.from(from));
        let stream = TcpStream::connect(address).await.with_context(|| format!("connecting to {address}"))?;
        stream.set_nodelay(true)?;
        // Without arrival stamps the run still measures latency; only the harness's own time
        // has fewer samples (meta.json's `harness_samples` says how many).
        let _ = rxstamp::enable(stream.as_raw_fd());
        let mut request = http1::request("GET", address, &target, None, self.authorization.as_deref(), b"");
        request.truncate(request.len() - 2);
        request.extend_from_slice(b"Accept: text/event-stream\r\n\r\n");
        let (stream, session, head, mut early) = match &self.dial.tls {
            None => {
                let mut stream = stream;
                let (head, early) = request_head(&mut stream, &request, &target).await?;
                (stream, None, head, early)
            }
            Some(client) => {
                let mut stream = client.connect(stream).await.context("the TLS handshake")?;
                let (head, early) = request_head(&mut stream, &request, &target).await?;
                // From here on the socket is read directly and its records opened as read.
                let (stream, session) = stream.into_inner();
                (stream, Some(session), head, early)
            }
        };
        if head.status != 200 {
            bail!("subscribing to {target}: {} {}", head.status, String::from_utf8_lossy(&early));
        }
        let mut session = session;
        if let Some(session) = session.as_mut() {
            // Opened bytes the TLS stream held beyond those it handed out.
            let mut chunk = [0u8; 4096];
            while let Ok(read @ 1..) = session.reader().read(&mut chunk) {
                early.extend_from_slice(&chunk[..read]);
            }
        }
        let chunked = (head.framing == Framing::Chunked).then(Chunked::default);
        Ok(Subscription { stream, session, chunked, early })
    }
}

/// Sends `request` and reads the response's head: the head, and the body bytes read with it.
async fn request_head(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    request: &[u8],
    target: &str,
) -> anyhow::Result<(Head, Vec<u8>)> {
    stream.write_all(request).await?;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    let head = loop {
        let read = stream.read(&mut chunk).await?;
        if read == 0 {
            bail!("the server closed the connection before answering {target}");
        }
        bytes.extend_from_slice(&chunk[..read]);
        if let Some(head) = http1::parse_head(&bytes).map_err(anyhow::Error::msg)? {
            break head;
        }
    };
    let early = bytes.split_off(head.length);
    Ok((head, early))
}

/// Why a reader stopped.
enum Ended {
    Stopped,
    Closed(String),
}

/// Reads what the socket holds, with the kernel's arrival stamp, waiting until it holds
/// something. A read shorter than `buf` emptied the socket, so its readiness is cleared and the
/// next read waits for new bytes instead of asking the kernel once more for nothing (as tokio's
/// own reads do; the readiness tick keeps an edge that came meanwhile).
async fn read_stamped(socket: &AsyncFd<std::net::TcpStream>, buf: &mut [u8]) -> std::io::Result<(usize, Option<u64>)> {
    loop {
        let mut ready = socket.readable().await?;
        match ready.try_io(|socket| rxstamp::recv(socket.as_raw_fd(), buf, true)) {
            Ok(Ok((read, arrived))) => {
                if read > 0 && read < buf.len() {
                    ready.clear_ready();
                }
                return Ok((read, arrived));
            }
            Ok(Err(error)) => return Err(error),
            Err(_would_block) => continue,
        }
    }
}

/// Reads events until told to stop or the server ends the response, calling `on_event` with
/// each event's name, data, the time the harness read its bytes and the time they arrived.
async fn read_events(
    mut subscription: Subscription,
    clock: Clock,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut on_event: impl FnMut(&str, &str, u64, u64),
) -> Ended {
    let mut raw = std::mem::take(&mut subscription.early);
    let mut session = subscription.session.take();
    let socket = match subscription.stream.into_std().and_then(|socket| {
        // SAFETY: the stream moves into the AsyncFd, which owns its descriptor for as long as
        // the registration lives and deregisters it before closing it.
        unsafe { AsyncFd::register_with_interest(socket, Interest::READABLE) }.map_err(std::io::Error::from)
    }) {
        Ok(socket) => socket,
        Err(error) => return Ended::Closed(format!("watching the socket: {error}")),
    };
    let mut buffer: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        let mut arrived = None;
        if raw.is_empty() {
            // Asleep until data or the stop signal: thousands of subscribers must not poll,
            // or the harness would spend the CPU it is measuring.
            let read = tokio::select! {
                read = read_stamped(&socket, &mut chunk) => match read {
                    Ok((0, _)) => return Ended::Closed("the server closed the connection".into()),
                    Err(error) => return Ended::Closed(format!("reading: {error}")),
                    Ok((read, stamp)) => {
                        arrived = stamp;
                        read
                    }
                },
                _ = stop.changed() => return Ended::Stopped,
            };
            match session.as_mut() {
                Some(session) => match tls::decrypt(session, &chunk[..read], &mut raw) {
                    Ok(true) if raw.is_empty() => return Ended::Closed("the server closed the TLS session".into()),
                    // Records not complete yet, or only the session's own messages.
                    Ok(_) if raw.is_empty() => continue,
                    Ok(_) => {}
                    Err(error) => return Ended::Closed(format!("TLS: {error}")),
                },
                None => raw.extend_from_slice(&chunk[..read]),
            }
        }
        let received_ns = clock.now_ns();
        let arrived_ns = rxstamp::arrival_on_clock(received_ns, arrived);
        let mut ended = None;
        match subscription.chunked.as_mut() {
            Some(decoder) => {
                if let Err(error) = decoder.feed(&raw, &mut buffer) {
                    ended = Some(format!("a malformed response: {error}"));
                } else if decoder.is_done() {
                    ended = Some("the server ended the response".to_string());
                }
            }
            None => buffer.extend_from_slice(&raw),
        }
        raw.clear();
        take_events(&mut buffer, |event, data| on_event(event, data, received_ns, arrived_ns));
        if let Some(why) = ended {
            return Ended::Closed(why);
        }
    }
}

#[derive(Deserialize)]
struct RecordEvent {
    value: SeqValue,
}

#[derive(Deserialize)]
struct SeqValue {
    seq: u64,
}

/// Reads a subscription's `record` events until stopped. When the server cuts it off for
/// falling behind, it resumes from the id the server gave, as a client should: nothing is
/// missed, the time it took counts as latency, and the resume is counted.
async fn follow(
    source: &Source,
    mut subscription: Subscription,
    recorder: &Recorder,
    stop: tokio::sync::watch::Receiver<bool>,
    mut on_record: impl FnMut(&str, u64, u64),
) {
    loop {
        let mut resume_id: Option<Result<String, String>> = None;
        let ended =
            read_events(
                subscription,
                recorder.clock,
                stop.clone(),
                |event, data, received_ns, arrived_ns| match event {
                    "record" => on_record(data, received_ns, arrived_ns),
                    "overflow" => {
                        let id = serde_json::from_str::<serde_json::Value>(data)
                            .ok()
                            .and_then(|overflow| overflow["resume_id"].as_str().map(str::to_string));
                        resume_id = Some(id.ok_or_else(|| data.to_string()));
                    }
                    _ => {}
                },
            )
            .await;
        let why = match (ended, resume_id) {
            (_, Some(Ok(id))) => {
                recorder.count_resume();
                match source.subscribe_from(&id).await {
                    Ok(resumed) => {
                        subscription = resumed;
                        continue;
                    }
                    Err(error) => format!("resuming after being cut off: {error:#}"),
                }
            }
            (_, Some(Err(data))) => format!("cut off with no resume id: {data}"),
            (Ended::Closed(why), None) => why,
            (Ended::Stopped, None) => return,
        };
        recorder.observer_failed(format!("subscription {}: {why}", source.target));
        return;
    }
}

/// Records every event a stream subscription delivers to `observer`.
pub async fn fanout_observer(
    source: Source,
    subscription: Subscription,
    observer: u32,
    recorder: Arc<Recorder>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut deliveries = Receipts::new();
    follow(&source, subscription, &recorder, stop, |data, received_ns, arrived_ns| {
        if let Ok(record) = serde_json::from_str::<RecordEvent>(data) {
            deliveries.push(Delivery { seq: record.value.seq, observer, received_ns, arrived_ns });
            recorder.count_received(1);
        }
    })
    .await;
    recorder.add_deliveries(deliveries);
}

#[derive(Deserialize)]
struct ViewChange {
    key: String,
    #[serde(rename = "final")]
    is_final: bool,
    row: ViewRow,
}

#[derive(Deserialize)]
struct ViewRow {
    n: u64,
    window_start: i64,
}

/// Records every row change of a view: the key, the window, its count and whether it is the
/// window's closing row.
pub async fn view_observer(
    source: Source,
    subscription: Subscription,
    recorder: Arc<Recorder>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut observations = Receipts::new();
    follow(&source, subscription, &recorder, stop, |data, received_ns, arrived_ns| {
        let Ok(change) = serde_json::from_str::<ViewChange>(data) else { return };
        let Some(key) = change.key.strip_prefix('k').and_then(|key| key.parse().ok()) else { return };
        observations.push(Observation {
            key,
            window_start_ms: change.row.window_start,
            count: change.row.n,
            is_final: change.is_final,
            received_ns,
            arrived_ns,
        });
        recorder.count_received(1);
        if change.is_final {
            recorder.count_finals(1);
        }
    })
    .await;
    recorder.add_observations(observations);
}

/// Takes every complete event (a block ending in a blank line) off the front of `buffer` and
/// gives `on_event` its name (`message` when it has none) and its data; an event without data
/// is skipped, and a partial one stays for the next read.
pub(crate) fn take_events(buffer: &mut Vec<u8>, mut on_event: impl FnMut(&str, &str)) {
    let mut start = 0;
    while let Some(end) = buffer[start..].windows(2).position(|pair| pair == b"\n\n") {
        let block = &buffer[start..start + end];
        start += end + 2;
        let Ok(block) = std::str::from_utf8(block) else { continue };
        let (mut event, mut data) = ("message", "");
        for line in block.lines() {
            if let Some(name) = line.strip_prefix("event: ") {
                event = name;
            } else if let Some(text) = line.strip_prefix("data: ") {
                data = text;
            }
        }
        if !data.is_empty() {
            on_event(event, data);
        }
    }
    buffer.drain(..start);
}
