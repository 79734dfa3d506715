//! The broker's metrics, described and registered at start-up so each is exported (at 0)
//! before its first event.

use super::machine::Counts;
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

/// One connection's counters, looked up in the metrics registry once per connection instead of
/// on every packet (a lookup hashes the name and takes a lock: at 100 000 messages a second,
/// three per message showed in profiles). The connection's [`Counts`] reach them once per turn
/// of its loop, before its socket write, and when it ends: a shared counter's add is atomic,
/// and several a message, from every connection at once, showed too.
pub(super) struct Counters {
    packets_received: metrics::Counter,
    publishes_received: metrics::Counter,
    messages_sent: metrics::Counter,
    messages_expired: metrics::Counter,
    messages_too_large: metrics::Counter,
    protocol_errors: metrics::Counter,
}

impl Counters {
    pub(super) fn new() -> Counters {
        Counters {
            packets_received: metrics::counter!("mqtt_packets_received_total"),
            publishes_received: metrics::counter!("mqtt_publishes_received_total"),
            messages_sent: metrics::counter!("mqtt_messages_sent_total"),
            messages_expired: metrics::counter!("mqtt_messages_expired_total"),
            messages_too_large: metrics::counter!("mqtt_messages_too_large_total"),
            protocol_errors: metrics::counter!("mqtt_protocol_errors_total"),
        }
    }

    /// Adds what a connection counted since it last did.
    pub(super) fn add(&self, counts: Counts) {
        let Counts {
            packets_received,
            publishes_received,
            messages_sent,
            messages_expired,
            messages_too_large,
            protocol_errors,
        } = counts;
        for (counter, count) in [
            (&self.packets_received, packets_received),
            (&self.publishes_received, publishes_received),
            (&self.messages_sent, messages_sent),
            (&self.messages_expired, messages_expired),
            (&self.messages_too_large, messages_too_large),
            (&self.protocol_errors, protocol_errors),
        ] {
            if count > 0 {
                counter.increment(count);
            }
        }
    }
}
