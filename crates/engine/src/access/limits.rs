//! What each user holds and sends, against its limits (`ALTER USER … SET LIMITS`): open
//! connections and subscriptions, counted while their [`Held`] lives, and publishes through a
//! token bucket per user that holds one second's worth of its rates.
//!
//! Every connection of a user shares one [`Usage`], whatever its protocol, so a limit holds
//! for the user, not per connection. A protocol asks before it opens a connection or a
//! subscription ([`Limited::hold`]), and before it stores a publish: HTTP is refused with a
//! 429 when the bucket lacks room ([`Limited::admit`]); MQTT and Kafka take the records and
//! wait until the bucket is back above empty ([`Limited::throttle`]), as Kafka's quotas and
//! MQTT brokers slow a client down rather than drop what it sent.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::model::UserLimits;
use crate::error::EngineError;

/// One user's usage, shared by all its connections.
#[derive(Debug)]
pub struct Usage {
    connections: AtomicU32,
    subscriptions: AtomicU32,
    bucket: Mutex<Bucket>,
}

impl Default for Usage {
    fn default() -> Self {
        Usage {
            connections: AtomicU32::new(0),
            subscriptions: AtomicU32::new(0),
            bucket: Mutex::new(Bucket { records: None, bytes: None, at: Instant::now() }),
        }
    }
}

/// Room left for records and bytes this second; `None` until first used (then full).
#[derive(Debug)]
struct Bucket {
    records: Option<f64>,
    bytes: Option<f64>,
    at: Instant,
}

/// What may be held at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resource {
    Connection,
    Subscription,
}

/// A connection or subscription counted against its user's limit until dropped.
#[derive(Debug)]
pub struct Held {
    usage: Arc<Usage>,
    resource: Resource,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.usage.counter(self.resource).fetch_sub(1, Ordering::AcqRel);
    }
}

impl Usage {
    fn counter(&self, resource: Resource) -> &AtomicU32 {
        match resource {
            Resource::Connection => &self.connections,
            Resource::Subscription => &self.subscriptions,
        }
    }
}

/// A user's limits with its usage: what a principal of a user with limits carries.
#[derive(Clone, Debug)]
pub struct Limited {
    pub user: Arc<str>,
    pub limits: UserLimits,
    pub usage: Arc<Usage>,
}

/// Refills `room` (at `rate` per second, up to one second's worth) over `elapsed`.
fn refill(room: Option<f64>, rate: f64, elapsed: f64) -> f64 {
    room.map_or(rate, |room| (room + rate * elapsed).min(rate))
}

impl Limited {
    fn exceeded(&self, limit: &'static str, value: u64) -> EngineError {
        EngineError::LimitExceeded { user: self.user.to_string(), limit, value }
    }

    /// Counts one more `resource` of the user, or refuses it at its limit.
    pub fn hold(&self, resource: Resource) -> Result<Option<Held>, EngineError> {
        let (limit, name) = match resource {
            Resource::Connection => (self.limits.connections, "connections"),
            Resource::Subscription => (self.limits.subscriptions, "subscriptions"),
        };
        let counter = self.usage.counter(resource);
        let taken = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| match limit {
            Some(limit) if held >= limit => None,
            _ => Some(held + 1),
        });
        match taken {
            Ok(_) => Ok(Some(Held { usage: self.usage.clone(), resource })),
            Err(_) => Err(self.exceeded(name, u64::from(limit.unwrap_or(0)))),
        }
    }

    /// Takes `records` and `bytes` if the bucket has room for them now; else refuses, taking
    /// nothing. A publish larger than a second's worth is let in when the bucket is full.
    pub fn admit(&self, records: u64, bytes: u64, now: Instant) -> Result<(), EngineError> {
        let mut bucket = self.usage.bucket.lock().expect("bucket lock");
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        let room_records =
            self.limits.publishes_per_second.map(|rate| refill(bucket.records, f64::from(rate), elapsed));
        let room_bytes = self.limits.publish_bytes_per_second.map(|rate| refill(bucket.bytes, rate as f64, elapsed));
        let fits = |room: Option<f64>, rate: Option<f64>, need: u64| match (room, rate) {
            (Some(room), Some(rate)) => room >= (need as f64).min(rate),
            _ => true,
        };
        if !fits(room_records, self.limits.publishes_per_second.map(f64::from), records) {
            return Err(self.exceeded("publishes_per_second", u64::from(self.limits.publishes_per_second.unwrap_or(0))));
        }
        if !fits(room_bytes, self.limits.publish_bytes_per_second.map(|rate| rate as f64), bytes) {
            return Err(self.exceeded("publish_bytes_per_second", self.limits.publish_bytes_per_second.unwrap_or(0)));
        }
        bucket.records = room_records.map(|room| room - records as f64);
        bucket.bytes = room_bytes.map(|room| room - bytes as f64);
        bucket.at = now;
        Ok(())
    }

    /// Takes `records` and `bytes`, the bucket going below empty if need be, and returns how
    /// long the caller waits before going on: until the bucket is back at empty.
    pub fn throttle(&self, records: u64, bytes: u64, now: Instant) -> Duration {
        let mut bucket = self.usage.bucket.lock().expect("bucket lock");
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        let mut wait = 0f64;
        if let Some(rate) = self.limits.publishes_per_second.map(f64::from) {
            let room = refill(bucket.records, rate, elapsed) - records as f64;
            wait = wait.max(-room / rate);
            bucket.records = Some(room);
        }
        if let Some(rate) = self.limits.publish_bytes_per_second.map(|rate| rate as f64) {
            let room = refill(bucket.bytes, rate, elapsed) - bytes as f64;
            wait = wait.max(-room / rate);
            bucket.bytes = Some(room);
        }
        bucket.at = now;
        Duration::from_secs_f64(wait.max(0.0))
    }

    /// Whether publishes are limited at all.
    pub fn limits_publishes(&self) -> bool {
        self.limits.publishes_per_second.is_some() || self.limits.publish_bytes_per_second.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(limits: UserLimits) -> Limited {
        Limited { user: Arc::from("alice"), limits, usage: Arc::new(Usage::default()) }
    }

    #[test]
    fn holds_count_until_dropped_and_stop_at_the_limit() {
        let alice = limited(UserLimits { connections: Some(2), ..UserLimits::default() });
        let first = alice.hold(Resource::Connection).unwrap();
        let _second = alice.hold(Resource::Connection).unwrap();
        let refused = alice.hold(Resource::Connection).unwrap_err();
        assert_eq!(refused.code(), "limit_exceeded");
        assert!(refused.to_string().contains("connections = 2"), "{refused}");
        drop(first);
        alice.hold(Resource::Connection).unwrap();
        // No subscription limit: counted, never refused.
        let many: Vec<_> = (0..100).map(|_| alice.hold(Resource::Subscription).unwrap()).collect();
        assert_eq!(alice.usage.subscriptions.load(Ordering::Acquire), 100);
        drop(many);
        assert_eq!(alice.usage.subscriptions.load(Ordering::Acquire), 0);
    }

    #[test]
    fn the_bucket_refuses_or_delays_past_a_second_worth_and_refills() {
        let alice = limited(UserLimits { publishes_per_second: Some(10), ..UserLimits::default() });
        let start = Instant::now();
        for _ in 0..10 {
            alice.admit(1, 100, start).unwrap();
        }
        assert!(alice.admit(1, 100, start).is_err(), "a second's worth is spent");
        alice.admit(1, 100, start + Duration::from_millis(100)).unwrap();
        assert!(alice.admit(1, 100, start + Duration::from_millis(100)).is_err());
        // Throttled: ten more take the bucket a second below empty.
        let later = start + Duration::from_secs(5);
        assert_eq!(alice.throttle(10, 0, later), Duration::ZERO, "full again after a pause");
        let wait = alice.throttle(10, 0, later);
        assert!((wait.as_secs_f64() - 1.0).abs() < 1e-9, "{wait:?}");
        let bytes = limited(UserLimits { publish_bytes_per_second: Some(1000), ..UserLimits::default() });
        bytes.admit(1, 5000, start).unwrap();
        assert!(bytes.admit(1, 1, start).is_err(), "one large publish is let in when the bucket is full, then none");
    }
}
