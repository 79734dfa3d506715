//! Subscriptions over Server-Sent Events: `GET /streams/{s}`, `/tables/{t}` or
//! `/tables/{t}/{id}` with `Accept: text/event-stream` (see [`super::subscribe`] for filters).
//!
//! A stream record is an event `record` whose data is the record as JSON (as in reads); a table
//! change is an event `insert`, `update` or `delete` (what the change is *to this
//! subscription's set*) whose data is `{"id","table","op","key","offset","timestamp","row"}`.
//! With `snapshot=true`, the matching rows come first as `snapshot` events, then one
//! `snapshot_end`. Every event after the snapshot has an `id`: the subscriber's position after
//! it, `partition:offset` of the last delivered record of every partition (`-1` where none yet),
//! so `0:15` on a one-partition stream. A client that reconnects with `Last-Event-ID` (browsers
//! do) resumes right after that event, with nothing missed and nothing repeated. An event's
//! bytes are encoded once and shared by every subscriber; only the `id` line is written per
//! subscriber.
//!
//! The server never waits for a subscriber: one that falls behind the live feed (its hub queue
//! full) reads on from the log where it left off, so it gets every event, later, on the same
//! response. A comment line after every 15 s without an event keeps idle connections open.
//!
//! When the server stops, the response ends with an event `shutdown` whose `id` (and
//! `resume_id`) is the position to resume from, as after any event; during a snapshot it has
//! none, since the snapshot must start over.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::pin::Pin;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use onehop_engine::hub::{Change, Cursor, Delivery};
use onehop_engine::{Position, Stream};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use super::AppState;
use super::error::ApiError;
use super::streams::parse_position;
use super::subscribe::{Opened, Params, Target, encode, open};

/// How long a subscription may go without sending anything before it gets a keep-alive comment.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Whether the request asks for an event stream.
pub fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|accept| accept.split(',').any(|kind| kind.trim().starts_with("text/event-stream")))
}

/// Parses a resume id: `partition:last_offset` for every partition, comma-separated.
pub fn parse_resume_id(text: &str, partitions: u32) -> Result<Vec<u64>, String> {
    let mut positions = vec![None; partitions as usize];
    for part in text.split(',') {
        let (partition, offset) =
            part.trim().split_once(':').ok_or_else(|| format!("{part:?} is not partition:offset"))?;
        let partition: usize = partition.parse().map_err(|_| format!("bad partition in {part:?}"))?;
        let offset: i64 = offset.parse().map_err(|_| format!("bad offset in {part:?}"))?;
        if partition >= positions.len() || offset < -1 {
            return Err(format!("{part:?} does not fit a stream of {partitions} partitions"));
        }
        positions[partition] = Some((offset + 1) as u64);
    }
    positions
        .into_iter()
        .enumerate()
        .map(|(partition, position)| position.ok_or_else(|| format!("partition {partition} is missing")))
        .collect()
}

fn resume_id(positions: &[u64]) -> String {
    let mut id = String::with_capacity(positions.len() * 12);
    write_resume_id(&mut id, positions);
    id
}

/// Appends the resume id of `positions` to `out`, without an allocation of its own: it is
/// written once per delivered event.
pub fn write_resume_id(out: &mut String, positions: &[u64]) {
    for (partition, &next) in positions.iter().enumerate() {
        if partition > 0 {
            out.push(',');
        }
        write!(out, "{partition}:{}", next as i64 - 1).expect("writing to a String cannot fail");
    }
}

/// The starting positions a subscription asks for: a resume id (`Last-Event-ID`, or `from` in
/// id form), or `from` as earliest/latest/time/offset (offset only on one-partition streams).
pub fn start_positions(stream: &Stream, from: Option<&str>, resume: Option<&str>) -> Result<Vec<u64>, ApiError> {
    if let Some(id) = resume {
        return parse_resume_id(id, stream.partition_count())
            .map_err(|reason| ApiError::bad_request("bad_offset", format!("resume id {id:?}: {reason}")));
    }
    let from = from.unwrap_or("latest");
    if from.contains(':') && !from.contains('T') {
        return parse_resume_id(from, stream.partition_count())
            .map_err(|reason| ApiError::bad_request("bad_offset", format!("from={from:?}: {reason}")));
    }
    match parse_position(Some(from))? {
        Position::Offset(_) if stream.partition_count() > 1 => Err(ApiError::bad_request(
            "bad_offset",
            "on a stream of several partitions, resume with an event id (0:12,1:7,…), not one offset",
        )),
        position => Ok((0..stream.partition_count())
            .map(|partition| stream.resolve(partition, position))
            .collect::<Result<Vec<_>, _>>()?),
    }
}

/// The id of the subscriber's current position.
pub fn position_id(cursor: &Cursor) -> String {
    resume_id(cursor.positions())
}

/// A subscription's response in progress: snapshot rows still to send, then the cursor.
struct Feed {
    opened: Opened,
    snapshot: std::vec::IntoIter<Bytes>,
    snapshot_end: bool,
    keep_alive: KeepAlive,
    /// Turns true when the server stops.
    shutdown: watch::Receiver<bool>,
    /// The event stream, counted as a connection of its user's while it lives.
    _connection: Option<onehop_engine::Held>,
}

impl Feed {
    /// The last event, sent when the server stops: where to resume, unless the snapshot is not
    /// all sent (then the subscriber starts over).
    fn last_event(&self) -> Bytes {
        if self.snapshot.len() > 0 || self.snapshot_end {
            return Bytes::from_static(
                b"event: shutdown\ndata: {\"resume_id\":null,\"message\":\"the server is shutting down before the \
                  snapshot was complete; subscribe again\"}\n\n",
            );
        }
        let id = position_id(&self.opened.cursor);
        Bytes::from(format!(
            "id: {id}\nevent: shutdown\ndata: {{\"resume_id\":\"{id}\",\"message\":\"the server is shutting down; \
             resume from {id}\"}}\n\n"
        ))
    }
}

/// When an idle subscription is due a keep-alive comment: `KEEP_ALIVE` after it last sent
/// anything.
///
/// One timer per subscription, moved only when it fires. Arming a fresh timeout around every
/// wait for an event instead registers and cancels a timer in the runtime's wheel once per
/// delivered event, for a comment that is almost never sent while events flow.
struct KeepAlive {
    timer: Pin<Box<Sleep>>,
    last_sent: Instant,
}

impl KeepAlive {
    fn new() -> Self {
        let now = Instant::now();
        KeepAlive { timer: Box::pin(tokio::time::sleep_until(now + KEEP_ALIVE)), last_sent: now }
    }

    /// Something was sent: the silence starts again.
    fn sent(&mut self) {
        self.last_sent = Instant::now();
    }

    /// Resolves once `KEEP_ALIVE` has passed since the last thing sent; the keep-alive is
    /// counted as sent. Cancel-safe: dropped before then, it loses nothing.
    async fn due(&mut self) {
        loop {
            (&mut self.timer).await;
            let due = self.last_sent + KEEP_ALIVE;
            let now = Instant::now();
            if due <= now {
                self.last_sent = now;
                self.timer.as_mut().reset(now + KEEP_ALIVE);
                return;
            }
            self.timer.as_mut().reset(due);
        }
    }
}

/// `target` as an SSE response.
pub async fn subscribe(
    state: AppState,
    principal: onehop_engine::Principal,
    target: Target,
    raw_query: &str,
    headers: &HeaderMap,
) -> Result<Response, ApiError> {
    let params = Params::parse(raw_query, &target)?;
    super::subscribe::ensure_exists(&state, &target).await?;
    let last_event_id = headers.get("last-event-id").and_then(|value| value.to_str().ok());
    // An event stream is a connection of its user's, as an MQTT connection is.
    let connection = principal.hold(onehop_engine::Resource::Connection)?;
    let mut opened = open(&state, &principal, &target, params, last_event_id).await?;
    let snapshot = opened.snapshot.take();
    let feed = Feed {
        snapshot_end: snapshot.is_some(),
        snapshot: snapshot.unwrap_or_default().into_iter(),
        opened,
        keep_alive: KeepAlive::new(),
        shutdown: state.shutdown.receiver(),
        _connection: connection,
    };
    let events = futures_util::stream::unfold(Some(feed), next_chunk);
    let mut response = Body::from_stream(events).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}

/// The last event of a subscription that cannot go on: the error, as the HTTP API words it, and
/// where a resume would start (`resume_id`: at the record that could not be read, for one that
/// tries again once the damage is repaired).
fn error_event(error: &ApiError, positions: &[u64]) -> Bytes {
    let id = resume_id(positions);
    let mut body = serde_json::json!({ "error": { "code": error.code, "message": error.message }, "resume_id": id });
    if let Some(hint) = &error.hint {
        body["error"]["hint"] = serde_json::Value::String(hint.clone());
    }
    Bytes::from(format!("id: {id}\nevent: error\ndata: {body}\n\n"))
}

/// The next piece of the response: a snapshot row, an event or a keep-alive.
async fn next_chunk(feed: Option<Feed>) -> Option<(Result<Bytes, Infallible>, Option<Feed>)> {
    let mut feed = feed?;
    if *feed.shutdown.borrow() {
        return Some((Ok(feed.last_event()), None));
    }
    if let Some(data) = feed.snapshot.next() {
        let mut chunk = Vec::with_capacity(data.len() + 32);
        chunk.extend_from_slice(b"event: snapshot\ndata: ");
        chunk.extend_from_slice(&data);
        chunk.extend_from_slice(b"\n\n");
        feed.keep_alive.sent();
        return Some((Ok(Bytes::from(chunk)), Some(feed)));
    }
    if feed.snapshot_end {
        feed.snapshot_end = false;
        let id = position_id(&feed.opened.cursor);
        let chunk = format!("id: {id}\nevent: snapshot_end\ndata: {{\"resume_id\":\"{id}\"}}\n\n");
        feed.keep_alive.sent();
        return Some((Ok(Bytes::from(chunk)), Some(feed)));
    }
    let cursor = &mut feed.opened.cursor;
    let delivery = tokio::select! {
        // Events first: a keep-alive due at the same moment is not needed.
        biased;
        delivery = cursor.next() => delivery,
        () = feed.keep_alive.due() => return Some((Ok(Bytes::from_static(b": keep-alive\n\n")), Some(feed))),
        () = super::stopped(&mut feed.shutdown) => return Some((Ok(feed.last_event()), None)),
    };
    let delivery = match delivery {
        Err(error) => {
            // Storage failed (a damaged batch), or the stream was dropped: say why in a last
            // event, with where to resume, and end the response.
            let error = ApiError::from(error);
            if error.status.is_server_error() {
                tracing::error!(code = error.code, message = %error.message, "a subscription ended on an error");
            } else {
                tracing::debug!(code = error.code, message = %error.message, "a subscription ended");
            }
            return Some((Ok(error_event(&error, cursor.positions())), None));
        }
        Ok(delivery) => delivery,
    };
    match delivery {
        Delivery::Event(event, change) => {
            let shared = event.encoded(change, encode);
            let name = if change == Change::Record { "record" } else { change.as_str() };
            let mut chunk = String::with_capacity(shared.len() + 48);
            chunk.push_str("id: ");
            write_resume_id(&mut chunk, cursor.positions());
            chunk.push_str("\nevent: ");
            chunk.push_str(name);
            chunk.push_str("\ndata: ");
            chunk.push_str(std::str::from_utf8(&shared).expect("JSON is UTF-8"));
            chunk.push_str("\n\n");
            feed.keep_alive.sent();
            Some((Ok(Bytes::from(chunk)), Some(feed)))
        }
        // The cursor carries on from the log instead (`subscribe::open`); should that ever
        // change, ending the response lets the client resume from its last id.
        Delivery::Overflow { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_ids_round_trip() {
        assert_eq!(resume_id(&[16]), "0:15");
        assert_eq!(resume_id(&[16, 0, 8]), "0:15,1:-1,2:7");
        assert_eq!(parse_resume_id("0:15,1:-1,2:7", 3), Ok(vec![16, 0, 8]));
        assert_eq!(parse_resume_id("2:7, 0:15, 1:-1", 3), Ok(vec![16, 0, 8]));
        assert!(parse_resume_id("0:15", 2).unwrap_err().contains("partition 1 is missing"));
        assert!(parse_resume_id("3:1", 2).is_err());
        assert!(parse_resume_id("0:-2", 1).is_err());
        assert!(parse_resume_id("zero", 1).is_err());
        let mut appended = String::from("id: ");
        write_resume_id(&mut appended, &[0, 3]);
        assert_eq!(appended, "id: 0:-1,1:2");
    }

    /// A keep-alive comes after `KEEP_ALIVE` of silence, counted from the last thing sent, not
    /// on a fixed beat.
    #[tokio::test(start_paused = true)]
    async fn keep_alive_follows_the_last_thing_sent() {
        let started = Instant::now();
        let mut keep_alive = KeepAlive::new();
        keep_alive.due().await;
        assert_eq!(started.elapsed(), KEEP_ALIVE);

        // An event 10 s later: the next keep-alive is 15 s after it, not 15 s after the first.
        tokio::time::sleep(Duration::from_secs(10)).await;
        keep_alive.sent();
        keep_alive.due().await;
        assert_eq!(started.elapsed(), KEEP_ALIVE + Duration::from_secs(10) + KEEP_ALIVE);

        // Waiting and giving up in between (an event won the race) loses nothing.
        let before = Instant::now();
        for _ in 0..3 {
            assert!(tokio::time::timeout(Duration::from_secs(4), keep_alive.due()).await.is_err());
        }
        keep_alive.due().await;
        assert_eq!(before.elapsed(), KEEP_ALIVE);
    }
}
