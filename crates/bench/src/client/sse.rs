//! Subscriptions over Server-Sent Events, and the observers that read them.

use std::sync::Arc;

use anyhow::{Context, bail};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::http1::{self, Chunked, Framing};
use crate::plan::Filter;
use crate::recorder::{Delivery, Observation, Recorder};
use crate::schedule::Clock;

/// An open SSE response on its own connection, read straight from the socket (no connection
/// task in between: one wake-up per arrival).
pub struct Subscription {
    stream: TcpStream,
    chunked: Option<Chunked>,
    /// Body bytes read with the head.
    early: Vec<u8>,
}

/// The path and query of a subscription to `path` with `filter`, from the stream's start (the
/// stream is new, so this is everything written after the subscription exists too).
pub fn target(path: &str, filter: &Filter) -> String {
    let (name, value) = match filter {
        Filter::Subject(subject) => ("subject", subject.as_str()),
        Filter::Field { field, value } => (*field, value.as_str()),
    };
    format!("{path}?{name}={}&from=earliest", http1::encode(value))
}

/// Opens an SSE subscription to `target` (path and query) on the server at `address`.
pub async fn subscribe(address: &str, target: &str) -> anyhow::Result<Subscription> {
    let mut stream = TcpStream::connect(address).await.with_context(|| format!("connecting to {address}"))?;
    stream.set_nodelay(true)?;
    let mut request = http1::request("GET", address, target, None, b"");
    request.truncate(request.len() - 2);
    request.extend_from_slice(b"Accept: text/event-stream\r\n\r\n");
    stream.write_all(&request).await?;
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
    if head.status != 200 {
        bail!("subscribing to {target}: {} {}", head.status, String::from_utf8_lossy(&early));
    }
    let chunked = (head.framing == Framing::Chunked).then(Chunked::default);
    Ok(Subscription { stream, chunked, early })
}

/// Why a reader stopped.
enum Ended {
    Stopped,
    Closed,
}

/// Reads events until told to stop or the server ends the response, calling `on_event` with
/// each event's name, data and the time its bytes arrived.
async fn read_events(
    mut subscription: Subscription,
    clock: Clock,
    mut stop: tokio::sync::watch::Receiver<bool>,
    mut on_event: impl FnMut(&str, &str, u64),
) -> Ended {
    let mut raw = std::mem::take(&mut subscription.early);
    let mut buffer: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        if raw.is_empty() {
            // Asleep until data or the stop signal: thousands of subscribers must not poll,
            // or the harness would spend the CPU it is measuring.
            let read = tokio::select! {
                read = subscription.stream.read(&mut chunk) => match read {
                    Ok(0) | Err(_) => return Ended::Closed,
                    Ok(read) => read,
                },
                _ = stop.changed() => return Ended::Stopped,
            };
            raw.extend_from_slice(&chunk[..read]);
        }
        let received_ns = clock.now_ns();
        match subscription.chunked.as_mut() {
            Some(decoder) => {
                if decoder.feed(&raw, &mut buffer).is_err() || decoder.is_done() {
                    return Ended::Closed;
                }
            }
            None => buffer.extend_from_slice(&raw),
        }
        raw.clear();
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
                on_event(event, data, received_ns);
            }
        }
        buffer.drain(..start);
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

/// Records every event a stream subscription delivers to `observer`.
pub async fn fanout_observer(
    subscription: Subscription,
    observer: u32,
    recorder: Arc<Recorder>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut deliveries = Vec::new();
    let mut cut_off = None;
    let ended = read_events(subscription, recorder.clock, stop, |event, data, received_ns| match event {
        "record" => {
            if let Ok(record) = serde_json::from_str::<RecordEvent>(data) {
                deliveries.push(Delivery { seq: record.value.seq, observer, received_ns });
                recorder.count_received(1);
            }
        }
        "overflow" => cut_off = Some(data.to_string()),
        _ => {}
    })
    .await;
    match (ended, cut_off) {
        (_, Some(data)) => recorder.observer_failed(format!("subscriber {observer} was cut off: {data}")),
        (Ended::Closed, None) => recorder.observer_failed(format!("subscriber {observer}: the server ended it")),
        (Ended::Stopped, None) => {}
    }
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
    subscription: Subscription,
    recorder: Arc<Recorder>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut observations = Vec::new();
    let mut cut_off = None;
    let ended = read_events(subscription, recorder.clock, stop, |event, data, received_ns| match event {
        "record" => {
            let Ok(change) = serde_json::from_str::<ViewChange>(data) else { return };
            let Some(key) = change.key.strip_prefix('k').and_then(|key| key.parse().ok()) else { return };
            observations.push(Observation {
                key,
                window_start_ms: change.row.window_start,
                count: change.row.n,
                is_final: change.is_final,
                received_ns,
            });
            recorder.count_received(1);
            if change.is_final {
                recorder.count_finals(1);
            }
        }
        "overflow" => cut_off = Some(data.to_string()),
        _ => {}
    })
    .await;
    match (ended, cut_off) {
        (_, Some(data)) => recorder.observer_failed(format!("the view subscriber was cut off: {data}")),
        (Ended::Closed, None) => recorder.observer_failed("the view subscription was ended by the server".into()),
        (Ended::Stopped, None) => {}
    }
    recorder.add_observations(observations);
}
