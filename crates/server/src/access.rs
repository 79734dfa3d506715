//! What every front end does about logins: count the failures and log them at a bounded rate.
//! The decisions themselves are the engine's ([`onehop_engine::Access`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// At most one failed-login line per this many seconds, whatever the rate of failures: a
/// password-guessing client must not flood the log (the counter still counts every one).
const FAILURE_LOG_INTERVAL_SECONDS: u64 = 5;

static LAST_LOGGED_SECOND: AtomicU64 = AtomicU64::new(0);
static UNLOGGED: AtomicU64 = AtomicU64::new(0);

/// Counts a failed login over `protocol` (`http`, `mqtt`, `kafka`) and logs it, or counts it
/// into the next line when one was logged within the interval. `user` is what the client
/// claimed, which may not exist.
pub fn login_failed(protocol: &'static str, user: Option<&str>, reason: &str) {
    metrics::counter!("auth_failures_total", "protocol" => protocol).increment(1);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
    let last = LAST_LOGGED_SECOND.load(Ordering::Relaxed);
    if now < last + FAILURE_LOG_INTERVAL_SECONDS
        || LAST_LOGGED_SECOND.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_err()
    {
        UNLOGGED.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let unlogged = UNLOGGED.swap(0, Ordering::Relaxed);
    tracing::warn!(protocol, user = user.unwrap_or(""), reason, unlogged_since_last = unlogged, "login refused");
}

/// Counts a connection, subscription or publish refused because its user is at a limit.
pub fn limit_refused(protocol: &'static str) {
    metrics::counter!("limit_refusals_total", "protocol" => protocol).increment(1);
}

/// Counts a publish that had its connection wait for its user's publish rates.
pub fn publish_throttled(protocol: &'static str) {
    metrics::counter!("publishes_throttled_total", "protocol" => protocol).increment(1);
}

/// Registers the access metrics at 0 for every protocol.
pub(crate) fn describe_metrics() {
    metrics::describe_counter!(
        "auth_failures_total",
        "Logins refused (a wrong user name or password, an unknown, dropped or expired token), by protocol."
    );
    for protocol in ["http", "mqtt", "kafka", "postgres"] {
        let _ = metrics::counter!("auth_failures_total", "protocol" => protocol);
    }
    metrics::describe_counter!(
        onehop_engine::access::LOGINS_THROTTLED,
        "Password logins refused without a check: too many failed logins from their address, or for their user from it."
    );
    metrics::describe_counter!(
        onehop_engine::access::LOGINS_SLOWED,
        "Password logins made to wait before their check: their user had many failed logins from many addresses."
    );
    let _ = metrics::counter!(onehop_engine::access::LOGINS_THROTTLED);
    let _ = metrics::counter!(onehop_engine::access::LOGINS_SLOWED);
    metrics::describe_counter!(
        "tls_handshake_failures_total",
        "TLS handshakes that failed or timed out (a client that does not trust the certificate, or is not TLS), by protocol."
    );
    for protocol in ["http", "mqtt", "kafka", "postgres"] {
        let _ = metrics::counter!("tls_handshake_failures_total", "protocol" => protocol);
    }
    metrics::describe_counter!(
        "limit_refusals_total",
        "Connections, subscriptions and publishes refused because their user was at one of its limits, by protocol."
    );
    metrics::describe_counter!(
        "publishes_throttled_total",
        "Publishes that made their connection wait because their user was over its publish rates, by protocol."
    );
    for protocol in ["http", "mqtt", "kafka", "postgres"] {
        let _ = metrics::counter!("limit_refusals_total", "protocol" => protocol);
        let _ = metrics::counter!("publishes_throttled_total", "protocol" => protocol);
    }
}
