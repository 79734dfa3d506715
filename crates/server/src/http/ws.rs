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
//! ← {"type":"shutdown","subscription":"s2","id":"0:5"}        (the server is stopping)
//! ```
//!
//! `id` is the subscription's position after the event (as SSE ids); `from` accepts it to
//! resume. The record bytes are the ones SSE sends, encoded once per event. Each subscription is
//! a task feeding one bounded outbox per socket: a socket that does not drain stops its tasks,
//! their hub queues fill, and each reads on from the log once the socket drains again.
//!
//! When the server stops, each subscription sends a last `shutdown` message with the id to
//! resume from (`null` during a snapshot: it starts over), and the socket closes with code
//! 1001 (going away).

use std::collections::HashMap;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, close_code};
use futures_util::{SinkExt, StreamExt};
use onehop_engine::hub::{Change, Delivery};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::AppState;
use super::error::ApiError;
use super::sse::{position_id, write_resume_id};
use super::subscribe::{Opened, Params, Target, encode, open, target_of_path};

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
                let target = target_of_path(path)?;
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
    let mut body =
        json!({ "type": "error", "subscription": subscription, "code": error.code, "message": error.message });
    if let Some(hint) = &error.hint {
        body["hint"] = json!(hint);
    }
    Message::Text(body.to_string().into())
}

/// A subscription's last message when the server stops: where to resume, if anywhere.
fn last_message(name: &str, resume_id: Option<String>) -> Message {
    Message::Text(json!({ "type": "shutdown", "subscription": name, "id": resume_id }).to_string().into())
}

/// Feeds one subscription's snapshot and events into the socket's outbox until the socket goes
/// away, the subscriber is cut off or the server stops.
async fn run_subscription(
    mut opened: Opened,
    name: String,
    outbox: mpsc::Sender<Message>,
    mut shutdown: watch::Receiver<bool>,
) {
    let subscription = json!(name).to_string();
    if let Some(rows) = opened.snapshot.take() {
        for change in rows {
            if *shutdown.borrow() {
                let _ = outbox.send(last_message(&name, None)).await;
                return;
            }
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
        let delivery = tokio::select! {
            delivery = cursor.next() => delivery,
            () = super::stopped(&mut shutdown) => {
                let _ = outbox.send(last_message(&name, Some(position_id(cursor)))).await;
                return;
            }
        };
        let message = match delivery {
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

/// One socket's subscriptions: each a task writing into the socket's outbox.
struct Subscriptions {
    state: AppState,
    /// Who opened the socket: every subscription on it opens as them.
    principal: onehop_engine::Principal,
    outbox: mpsc::Sender<Message>,
    tasks: HashMap<String, JoinHandle<()>>,
    max: usize,
}

impl Subscriptions {
    /// Starts `request`'s subscription; the answer to send is `subscribed` or an error.
    async fn subscribe(&mut self, request: Request) -> Message {
        if self.tasks.get(&request.subscription).is_some_and(|task| !task.is_finished()) {
            let error = ApiError::bad_request(
                "subscription_exists",
                format!("{:?} is already subscribed", request.subscription),
            );
            return error_message(Some(&request.subscription), &error);
        }
        self.tasks.retain(|_, task| !task.is_finished());
        if self.tasks.len() >= self.max {
            let error = ApiError::bad_request(
                "too_many_subscriptions",
                format!("a socket holds at most {} subscriptions (setting subscriptions_per_socket_max)", self.max),
            );
            return error_message(Some(&request.subscription), &error);
        }
        match open(&self.state, &self.principal, &request.target, request.params, None).await {
            Ok(opened) => {
                let task = tokio::spawn(run_subscription(
                    opened,
                    request.subscription.clone(),
                    self.outbox.clone(),
                    self.state.shutdown.receiver(),
                ));
                self.tasks.insert(request.subscription.clone(), task);
                Message::Text(json!({ "type": "subscribed", "subscription": request.subscription }).to_string().into())
            }
            Err(error) => error_message(Some(&request.subscription), &error),
        }
    }

    /// The answer to one client message, or `None` for one that needs none.
    async fn command(&mut self, message: Message) -> Option<Message> {
        Some(match message {
            Message::Text(text) if text.len() <= COMMAND_BYTES_MAX => match serde_json::from_str::<Command>(&text) {
                Ok(Command::Subscribe { subscription, url, stream, subject, from }) => {
                    let ready = match Request::from_command(subscription.clone(), url, stream, subject, from) {
                        Ok(request) => {
                            super::subscribe::ensure_exists(&self.state, &request.target).await.map(|()| request)
                        }
                        Err(error) => Err(error),
                    };
                    match ready {
                        Ok(request) => self.subscribe(request).await,
                        Err(error) => error_message(Some(&subscription), &error),
                    }
                }
                Ok(Command::Unsubscribe { subscription }) => match self.tasks.remove(&subscription) {
                    Some(task) => {
                        task.abort();
                        Message::Text(
                            json!({ "type": "unsubscribed", "subscription": subscription }).to_string().into(),
                        )
                    }
                    None => error_message(
                        Some(&subscription),
                        &ApiError::bad_request(
                            "unknown_subscription",
                            format!("no subscription {subscription:?} on this socket"),
                        ),
                    ),
                },
                Err(error) => error_message(None, &command_refusal(&error)),
            },
            Message::Text(_) => error_message(
                None,
                &ApiError::bad_request("message_too_large", format!("commands are at most {COMMAND_BYTES_MAX} bytes")),
            ),
            Message::Binary(_) => {
                error_message(None, &ApiError::bad_request("bad_json", "commands are JSON text messages"))
            }
            // Pings are answered by the WebSocket layer; pongs need nothing.
            Message::Ping(_) | Message::Pong(_) | Message::Close(_) => return None,
        })
    }
}

/// Serves one socket until the client closes it or the server stops.
/// `connection` counts the socket against its user's limit until it closes.
pub async fn serve(
    state: AppState,
    principal: onehop_engine::Principal,
    socket: WebSocket,
    initial: Option<Request>,
    subscriptions_max: usize,
    connection: Option<onehop_engine::Held>,
) {
    let _connection = connection;
    let (mut sink, mut incoming) = socket.split();
    let (outbox, mut outgoing) = mpsc::channel::<Message>(OUTBOX_MESSAGES);
    let mut shutdown = state.shutdown.receiver();
    let mut subscriptions = Subscriptions { state, principal, outbox, tasks: HashMap::new(), max: subscriptions_max };
    if let Some(request) = initial {
        let answer = subscriptions.subscribe(request).await;
        if sink.send(answer).await.is_err() {
            return;
        }
    }
    let stopping = loop {
        tokio::select! {
            message = outgoing.recv() => {
                let Some(message) = message else { break false };
                if sink.send(message).await.is_err() {
                    break false;
                }
            }
            incoming = incoming.next() => {
                let message = match incoming {
                    Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break false,
                    Some(Ok(message)) => message,
                };
                if let Some(answer) = subscriptions.command(message).await
                    && sink.send(answer).await.is_err()
                {
                    break false;
                }
            }
            () = super::stopped(&mut shutdown) => break true,
        }
    };
    let Subscriptions { outbox, tasks, .. } = subscriptions;
    if stopping {
        // Every subscription sends its last message and ends, dropping its sender: the outbox
        // closes once all have.
        drop(outbox);
        let mut sent = true;
        while let Some(message) = outgoing.recv().await {
            if sink.send(message).await.is_err() {
                sent = false;
                break;
            }
        }
        if sent {
            let close = CloseFrame { code: close_code::AWAY, reason: "the server is shutting down".into() };
            let _ = sink.send(Message::Close(Some(close))).await;
        }
    }
    for (_, task) in tasks {
        task.abort();
    }
}

/// The refusal of a text message that is not a command, said in the API's terms rather than
/// the JSON decoder's: which part is wrong, and the commands there are.
fn command_refusal(error: &serde_json::Error) -> ApiError {
    let detail = error.to_string();
    // serde's message names the field or the variant; the position is the client's to find.
    let detail = detail.split(" at line ").next().unwrap_or(&detail);
    let what = if error.is_syntax() || error.is_eof() {
        "the message is not JSON".to_string()
    } else {
        format!("the message is not a command ({detail})")
    };
    ApiError {
        hint: Some(
            "send {\"op\":\"subscribe\",\"subscription\":\"s1\",\"url\":\"/streams/orders\"} or \
             {\"op\":\"unsubscribe\",\"subscription\":\"s1\"} (docs/http-api.md)"
                .into(),
        ),
        ..ApiError::bad_request("bad_json", what)
    }
}
