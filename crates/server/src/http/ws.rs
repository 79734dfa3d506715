//! Subscriptions over WebSocket: a stream's or table's URL with an upgrade, one socket for many
//! subscriptions.
//!
//! The URL's own subscription starts at once, named `url`. The client adds and removes others
//! with JSON messages, naming what to follow by URL (as SSE would) or, for a stream, by fields:
//!
//! ```text
//! → {"op":"subscribe","subscription":"s1","url":"/tables/orders?customer=42&snapshot=true"}
//! → {"op":"subscribe","subscription":"s2","stream":"scores","subject":"scores/+","from":"latest"}
//! ← {"type":"subscribed","subscription":"s1"}
//! ← {"type":"snapshot","subscription":"s1","change":{"op":"snapshot",…}}   (snapshot rows)
//! ← {"type":"snapshot_end","subscription":"s1","id":"0:41"}
//! ← {"type":"change","subscription":"s1","id":"0:42","change":{"op":"update",…}}
//! ← {"type":"record","subscription":"s2","id":"0:5","record":{…}}
//! → {"op":"unsubscribe","subscription":"s1"}
//! ← {"type":"unsubscribed","subscription":"s1"}
//! ← {"type":"error","subscription":"s1","code":"…","message":"…"}
//! ```
//!
//! `id` is the subscription's position after the event (as SSE ids); `from` accepts it to
//! resume. The record bytes are the ones SSE sends, encoded once per event. Each subscription is
//! a task feeding one bounded outbox per socket: a socket that does not drain stops its tasks,
//! their hub queues fill, and each reads on from the log once the socket drains again.

use std::collections::HashMap;

use axum::extract::ws::{Message, Utf8Bytes, WebSocket};
use futures_util::{SinkExt, StreamExt};
use onehop_engine::hub::{Change, Delivery};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::AppState;
use super::error::ApiError;
use super::sse::{position_id, write_resume_id};
use super::subscribe::{Opened, Params, Target, encode, open};

/// Subscriptions one socket may hold unless configured otherwise.
pub const SUBSCRIPTIONS_PER_SOCKET_DEFAULT: usize = 100;
/// Messages waiting to be written to one socket.
const OUTBOX_MESSAGES: usize = 256;
/// The longest client message accepted (commands are small).
const COMMAND_BYTES_MAX: usize = 64 * 1024;

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Command {
    Subscribe {
        subscription: String,
        url: Option<String>,
        stream: Option<String>,
        subject: Option<String>,
        from: Option<String>,
    },
    Unsubscribe {
        subscription: String,
    },
}

/// Socket buffers: the library's defaults (128 KiB each way) would make 10 000 idle
/// subscribers cost gigabytes. Commands are small and records are written as they come.
const READ_BUFFER_BYTES: usize = 4 * 1024;
const WRITE_BUFFER_BYTES: usize = 0;

/// Applies this module's limits to an upgrade: small buffers, and incoming messages and frames
/// no larger than a command can be.
pub fn configure(upgrade: axum::extract::ws::WebSocketUpgrade) -> axum::extract::ws::WebSocketUpgrade {
    upgrade
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(WRITE_BUFFER_BYTES)
        .max_message_size(COMMAND_BYTES_MAX)
        .max_frame_size(COMMAND_BYTES_MAX)
}

/// A subscription to start: what to follow, through which filter, from where.
pub struct Request {
    pub subscription: String,
    pub target: Target,
    pub params: Params,
}

impl Request {
    /// A request from a subscribe command: a `url`, or a `stream` with `subject` and `from`.
    fn from_command(
        subscription: String,
        url: Option<String>,
        stream: Option<String>,
        subject: Option<String>,
        from: Option<String>,
    ) -> Result<Request, ApiError> {
        match (url, stream) {
            (Some(url), None) if subject.is_none() && from.is_none() => {
                let (path, query) = url.split_once('?').unwrap_or((&url, ""));
                let target = Target::from_path(path)?;
                let params = Params::parse(query, &target)?;
                Ok(Request { subscription, target, params })
            }
            (None, Some(stream)) => {
                let target = Target::Stream(stream);
                let mut query = Vec::new();
                if let Some(subject) = subject {
                    query.push(("subject", subject));
                }
                if let Some(from) = from {
                    query.push(("from", from));
                }
                let raw = query
                    .iter()
                    .map(|(name, value)| format!("{name}={}", encode_component(value)))
                    .collect::<Vec<_>>()
                    .join("&");
                let params = Params::parse(&raw, &target)?;
                Ok(Request { subscription, target, params })
            }
            _ => Err(ApiError::bad_request(
                "bad_command",
                "a subscribe command names a url (with its filter and from in the query), or a stream",
            )),
        }
    }
}

/// Percent-encodes a query value.
fn encode_component(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn error_message(subscription: Option<&str>, error: &ApiError) -> Message {
    let body = json!({ "type": "error", "subscription": subscription, "code": error.code, "message": error.message });
    Message::Text(body.to_string().into())
}

/// Feeds one subscription's snapshot and events into the socket's outbox until the socket goes
/// away or the subscriber is cut off.
async fn run_subscription(mut opened: Opened, name: String, outbox: mpsc::Sender<Message>) {
    let subscription = json!(name).to_string();
    if let Some(rows) = opened.snapshot.take() {
        for change in rows {
            let text = format!(
                "{{\"type\":\"snapshot\",\"subscription\":{subscription},\"change\":{}}}",
                std::str::from_utf8(&change).expect("JSON is UTF-8")
            );
            if outbox.send(Message::Text(Utf8Bytes::from(text))).await.is_err() {
                return;
            }
        }
        let end = json!({ "type": "snapshot_end", "subscription": name, "id": position_id(&opened.cursor) });
        if outbox.send(Message::Text(end.to_string().into())).await.is_err() {
            return;
        }
    }
    let cursor = &mut opened.cursor;
    loop {
        let message = match cursor.next().await {
            Ok(Delivery::Event(event, change)) => {
                let shared = event.encoded(change, encode);
                let kind = if change == Change::Record { "record" } else { "change" };
                let mut text = String::with_capacity(subscription.len() + shared.len() + 64);
                text.push_str("{\"type\":\"");
                text.push_str(kind);
                text.push_str("\",\"subscription\":");
                text.push_str(&subscription);
                // A resume id is digits, colons and commas: nothing to escape.
                text.push_str(",\"id\":\"");
                write_resume_id(&mut text, cursor.positions());
                text.push_str("\",\"");
                text.push_str(kind);
                text.push_str("\":");
                text.push_str(std::str::from_utf8(&shared).expect("JSON is UTF-8"));
                text.push('}');
                Message::Text(Utf8Bytes::from(text))
            }
            // The cursor carries on from the log instead (`subscribe::open`); should that ever
            // change, the client resumes from the last id it was sent.
            Ok(Delivery::Overflow { .. }) => return,
            Err(error) => {
                let error: ApiError = error.into();
                let _ = outbox.send(error_message(Some(&name), &error)).await;
                return;
            }
        };
        if outbox.send(message).await.is_err() {
            return;
        }
    }
}

/// Serves one socket until the client closes it.
pub async fn serve(state: AppState, socket: WebSocket, initial: Option<Request>, subscriptions_max: usize) {
    let (mut sink, mut incoming) = socket.split();
    let (outbox, mut outgoing) = mpsc::channel::<Message>(OUTBOX_MESSAGES);
    let mut subscriptions: HashMap<String, JoinHandle<()>> = HashMap::new();
    let subscribe = |request: Request, subscriptions: &mut HashMap<String, JoinHandle<()>>| -> Message {
        if subscriptions.get(&request.subscription).is_some_and(|task| !task.is_finished()) {
            let error = ApiError::bad_request(
                "subscription_exists",
                format!("{:?} is already subscribed", request.subscription),
            );
            return error_message(Some(&request.subscription), &error);
        }
        subscriptions.retain(|_, task| !task.is_finished());
        if subscriptions.len() >= subscriptions_max {
            let error = ApiError::bad_request(
                "too_many_subscriptions",
                format!(
                    "a socket holds at most {subscriptions_max} subscriptions (setting subscriptions_per_socket_max)"
                ),
            );
            return error_message(Some(&request.subscription), &error);
        }
        match open(&state, &request.target, request.params, None) {
            Ok(opened) => {
                let task = tokio::spawn(run_subscription(opened, request.subscription.clone(), outbox.clone()));
                subscriptions.insert(request.subscription.clone(), task);
                Message::Text(json!({ "type": "subscribed", "subscription": request.subscription }).to_string().into())
            }
            Err(error) => error_message(Some(&request.subscription), &error),
        }
    };
    if let Some(request) = initial {
        let answer = subscribe(request, &mut subscriptions);
        if sink.send(answer).await.is_err() {
            return;
        }
    }
    loop {
        tokio::select! {
            message = outgoing.recv() => {
                let Some(message) = message else { break };
                if sink.send(message).await.is_err() {
                    break;
                }
            }
            incoming = incoming.next() => {
                let answer = match incoming {
                    Some(Ok(Message::Text(text))) if text.len() <= COMMAND_BYTES_MAX => {
                        match serde_json::from_str::<Command>(&text) {
                            Ok(Command::Subscribe { subscription, url, stream, subject, from }) => {
                                let request = Request::from_command(subscription.clone(), url, stream, subject, from);
                                let ready = match request {
                                    Ok(request) => super::subscribe::ensure_exists(&state, &request.target).await.map(|()| request),
                                    Err(error) => Err(error),
                                };
                                match ready {
                                    Ok(request) => subscribe(request, &mut subscriptions),
                                    Err(error) => error_message(Some(&subscription), &error),
                                }
                            }
                            Ok(Command::Unsubscribe { subscription }) => match subscriptions.remove(&subscription) {
                                Some(task) => {
                                    task.abort();
                                    Message::Text(json!({ "type": "unsubscribed", "subscription": subscription }).to_string().into())
                                }
                                None => error_message(
                                    Some(&subscription),
                                    &ApiError::bad_request("unknown_subscription", format!("no subscription {subscription:?} on this socket")),
                                ),
                            },
                            Err(error) => error_message(None, &ApiError::bad_request("bad_json", error.to_string())),
                        }
                    }
                    Some(Ok(Message::Text(_))) => error_message(
                        None,
                        &ApiError::bad_request("message_too_large", format!("commands are at most {COMMAND_BYTES_MAX} bytes")),
                    ),
                    Some(Ok(Message::Binary(_))) => {
                        error_message(None, &ApiError::bad_request("bad_json", "commands are JSON text messages"))
                    }
                    // Pings are answered by the WebSocket layer; pongs need nothing.
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                };
                if sink.send(answer).await.is_err() {
                    break;
                }
            }
        }
    }
    for (_, task) in subscriptions {
        task.abort();
    }
}
