//! Subscriptions over WebSocket: a stream's URL with an upgrade, one socket for many
//! subscriptions.
//!
//! The URL's own subscription starts at once, named `url`. The client adds and removes others
//! with JSON messages:
//!
//! ```text
//! → {"op":"subscribe","subscription":"s1","stream":"scores","subject":"scores/+","from":"latest"}
//! ← {"type":"subscribed","subscription":"s1"}
//! ← {"type":"record","subscription":"s1","id":"0:5","record":{…}}
//! → {"op":"unsubscribe","subscription":"s1"}
//! ← {"type":"unsubscribed","subscription":"s1"}
//! ← {"type":"error","subscription":"s1","code":"…","message":"…"}
//! ← {"type":"overflow","subscription":"s1","resume_id":"0:5"}
//! ```
//!
//! `id` is the subscription's position after the record (as SSE ids); `from` accepts it to
//! resume. The record bytes are the ones SSE sends, encoded once per event. Each subscription is
//! a task feeding one bounded outbox per socket: a socket that does not drain stops its tasks,
//! their hub queues fill, and each is cut off with an `overflow` message to resume from.

use std::collections::HashMap;

use axum::extract::ws::{Message, Utf8Bytes, WebSocket};
use futures_util::{SinkExt, StreamExt};
use onehop_engine::hub::{Cursor, Delivery};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::AppState;
use super::error::ApiError;
use super::sse::{encode, parse_filter, position_id, start_positions};

/// Subscriptions one socket may hold.
pub const SUBSCRIPTIONS_PER_SOCKET_MAX: usize = 100;
/// Messages waiting to be written to one socket.
const OUTBOX_MESSAGES: usize = 256;
/// The longest client message accepted (commands are small).
const COMMAND_BYTES_MAX: usize = 64 * 1024;

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Command {
    Subscribe { subscription: String, stream: String, subject: Option<String>, from: Option<String> },
    Unsubscribe { subscription: String },
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

/// A subscription to start: which stream, from where, through which filter.
pub struct Request {
    pub subscription: String,
    pub stream: String,
    pub subject: Option<String>,
    pub from: Option<String>,
}

fn error_message(subscription: Option<&str>, error: &ApiError) -> Message {
    let body = json!({ "type": "error", "subscription": subscription, "code": error.code, "message": error.message });
    Message::Text(body.to_string().into())
}

/// Starts a subscription's cursor; refusals come back as the error to send.
fn open(state: &AppState, request: &Request) -> Result<Cursor, ApiError> {
    let stream = state.engine.stream(&request.stream)?;
    let filter = parse_filter(request.subject.clone())?;
    let positions = start_positions(&stream, request.from.as_deref(), None)?;
    Ok(state.engine.subscribe(&stream, filter, positions)?)
}

/// Feeds one subscription's records into the socket's outbox until the socket goes away or the
/// subscriber is cut off.
async fn run_subscription(mut cursor: Cursor, name: String, outbox: mpsc::Sender<Message>) {
    let prefix = format!("{{\"type\":\"record\",\"subscription\":{},\"id\":", json!(name));
    loop {
        let message = match cursor.next().await {
            Ok(Delivery::Event(event)) => {
                let record = event.encoded(encode);
                let id = json!(position_id(&cursor)).to_string();
                let mut text = String::with_capacity(prefix.len() + id.len() + record.len() + 12);
                text.push_str(&prefix);
                text.push_str(&id);
                text.push_str(",\"record\":");
                text.push_str(std::str::from_utf8(&record).expect("record JSON is UTF-8"));
                text.push('}');
                Message::Text(Utf8Bytes::from(text))
            }
            Ok(Delivery::Overflow { .. }) => {
                let body = json!({ "type": "overflow", "subscription": name, "resume_id": position_id(&cursor) });
                let _ = outbox.send(Message::Text(body.to_string().into())).await;
                return;
            }
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
pub async fn serve(state: AppState, socket: WebSocket, initial: Option<Request>) {
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
        if subscriptions.len() >= SUBSCRIPTIONS_PER_SOCKET_MAX {
            let error = ApiError::bad_request(
                "too_many_subscriptions",
                format!("a socket holds at most {SUBSCRIPTIONS_PER_SOCKET_MAX} subscriptions"),
            );
            return error_message(Some(&request.subscription), &error);
        }
        match open(&state, &request) {
            Ok(cursor) => {
                let task = tokio::spawn(run_subscription(cursor, request.subscription.clone(), outbox.clone()));
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
                            Ok(Command::Subscribe { subscription, stream, subject, from }) => {
                                subscribe(Request { subscription, stream, subject, from }, &mut subscriptions)
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
