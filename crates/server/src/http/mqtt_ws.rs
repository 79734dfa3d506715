//! MQTT over WebSocket: `GET /mqtt` with an upgrade (subprotocol `mqtt`), as browsers and
//! MQTT.js connect. Each binary WebSocket message carries MQTT bytes; the connection is then
//! served by the same broker code as TCP, through an in-memory byte pipe.
//!
//! When the server stops, the broker ends the connection (a 5.0 client gets DISCONNECT 0x8B,
//! "server shutting down") and the socket closes with code 1001 (going away).

use std::sync::Arc;

use axum::extract::State;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade, close_code};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::AppState;
use super::error::ApiError;
use crate::mqtt::Broker;

/// Bytes buffered between the WebSocket and the broker, each way: a few packets in flight
/// without letting one connection buffer much.
const PIPE_BYTES: usize = 64 * 1024;
/// The WebSocket's read buffer: MQTT packets are mostly small.
const READ_BUFFER_BYTES: usize = 4 * 1024;
/// What one WebSocket message to the client carries at most of the broker's bytes.
const MESSAGE_BYTES_MAX: usize = 16 * 1024;

pub async fn upgrade(
    State(state): State<AppState>,
    verified: Option<axum::Extension<crate::tls::VerifiedClient>>,
    client: Option<axum::Extension<super::connection::ClientAddress>>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let upgrade = upgrade.map_err(|rejection| {
        ApiError::bad_request(
            "not_websocket",
            format!("/mqtt is MQTT over WebSocket (subprotocol mqtt): {}", rejection.body_text()),
        )
    })?;
    let Some(broker) = state.mqtt.clone() else {
        return Err(ApiError {
            retry_after_s: None,
            hint: None,
            status: StatusCode::NOT_FOUND,
            code: "mqtt_disabled",
            message: "this server runs no MQTT broker".into(),
        });
    };
    let max_message = usize::try_from(broker.max_packet_bytes()).unwrap_or(usize::MAX);
    Ok(upgrade
        .protocols(["mqtt"])
        .read_buffer_size(READ_BUFFER_BYTES)
        .write_buffer_size(0)
        .max_message_size(max_message)
        .max_frame_size(max_message)
        .on_upgrade(move |socket| {
            bridge(broker, socket, verified.map(|verified| verified.0.0), client.map(|client| client.0.0))
        })
        .into_response())
}

/// Pipes the WebSocket's binary messages to the broker and the broker's bytes back.
/// `certificate_user`: the user the connection's verified client certificate names, if any;
/// `peer`: the client's address.
async fn bridge(
    broker: Arc<Broker>,
    socket: WebSocket,
    certificate_user: crate::tls::CertificateUser,
    peer: Option<std::net::SocketAddr>,
) {
    let (ours, theirs) = tokio::io::duplex(PIPE_BYTES);
    let stopping = broker.clone();
    let (mut from_broker, mut to_broker) = tokio::io::split(theirs);
    let (mut sink, mut messages) = socket.split();
    let inbound = async move {
        while let Some(Ok(message)) = messages.next().await {
            match message {
                Message::Binary(bytes) => {
                    if to_broker.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                // MQTT over WebSocket is binary only; anything else ends the connection.
                Message::Text(_) | Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => {}
            }
        }
        let _ = to_broker.shutdown().await;
    };
    let outbound = async move {
        let mut chunk = vec![0u8; MESSAGE_BYTES_MAX];
        loop {
            match from_broker.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(read) => {
                    if sink.send(Message::Binary(Bytes::copy_from_slice(&chunk[..read]))).await.is_err() {
                        break;
                    }
                }
            }
        }
        // The broker has ended the connection: because the server stops, or for a reason it
        // has told the client in MQTT.
        if stopping.is_shutting_down() {
            let close = CloseFrame { code: close_code::AWAY, reason: "the server is shutting down".into() };
            let _ = sink.send(Message::Close(Some(close))).await;
        } else {
            let _ = sink.close().await;
        }
    };
    let pumps = async move {
        tokio::select! {
            () = inbound => {}
            () = outbound => {}
        }
    };
    tokio::join!(broker.serve_stream(ours, certificate_user, peer), pumps);
}
