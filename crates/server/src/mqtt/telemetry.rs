//! The broker's metrics, described and registered at start-up so each is exported (at 0)
//! before its first event.

use crate::telemetry::{counter, gauge};

/// Describes and registers every MQTT metric.
pub fn describe() {
    gauge("mqtt_connections", "Open MQTT connections (TCP and WebSocket).");
    counter("mqtt_connections_refused_total", "MQTT connections closed at once because connections_max were open.");
    gauge("mqtt_subscriptions", "Subscriptions of connected MQTT clients (a shared one counts for each member).");
    counter("mqtt_packets_received_total", "MQTT packets received from clients.");
    counter("mqtt_publishes_received_total", "PUBLISH packets received from clients.");
    counter("mqtt_messages_sent_total", "Messages sent to MQTT subscribers.");
    counter("mqtt_messages_expired_total", "Messages not sent because their MQTT 5 message expiry had passed.");
    counter(
        "mqtt_messages_too_large_total",
        "Messages not sent to a client because they exceed the maximum packet size it announced.",
    );
    counter("mqtt_protocol_errors_total", "MQTT connections closed for a malformed or forbidden packet.");
    gauge("mqtt_retained_messages", "Topics holding a retained message.");
    gauge("mqtt_sessions_stored", "Persistent MQTT sessions stored, connected or not.");
}
