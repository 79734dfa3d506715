//! What a workload asks of a target: which events to send, who subscribes to what, and who
//! must receive each event. Everything random comes from a seed, so two runs with one seed
//! send the same events to the same subscribers, and a target adapter needs nothing but this
//! plan to set itself up.

use serde::Serialize;
use serde_json::{Value, json};

/// How subscribers connect to an HTTP target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Sse,
    Ws,
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "sse" => Ok(Protocol::Sse),
            "ws" | "websocket" => Ok(Protocol::Ws),
            other => Err(format!("unknown protocol {other:?}: expected sse or ws")),
        }
    }
}

/// A small, fast, seedable generator (SplitMix64): event `seq`'s choices are a pure function of
/// the seed and `seq`, so any part of the harness can recompute them without shared state.
#[derive(Clone, Copy, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64, stream: u64) -> Rng {
        Rng(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (bound > 0).
    pub fn below(&mut self, bound: u32) -> u32 {
        ((self.next_u64() as u128 * bound as u128) >> 64) as u32
    }

    /// `count` distinct values from `0..bound`, in the order drawn.
    pub fn distinct(&mut self, count: u32, bound: u32) -> Vec<u32> {
        let mut chosen = Vec::with_capacity(count as usize);
        while (chosen.len() as u32) < count.min(bound) {
            let value = self.below(bound);
            if !chosen.contains(&value) {
                chosen.push(value);
            }
        }
        chosen
    }
}

/// What a subscription follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Filter {
    /// Records whose subject is exactly this.
    Subject(String),
    /// Records whose JSON value has `field` equal to `value`, or an array holding it.
    Field { field: &'static str, value: String },
}

/// How a fan-out workload routes events to subscribers.
#[derive(Clone, Debug)]
pub enum Routing {
    /// W1: one subscriber per lookup key; each event carries `keys_per_event` distinct keys.
    Lookup { keys: u32, keys_per_event: u32, seed: u64 },
    /// W2: each subscriber follows a few tags; each event has one tag.
    Tags { tags: u32, of_subscriber: Vec<Vec<u32>>, by_tag: Vec<Vec<u32>>, seed: u64 },
    /// `bench notify`: subscriber `i` follows subject `i % subjects`; event `seq` goes to
    /// subject `seq % subjects`.
    Subjects { subscribers: u32, subjects: u32 },
}

impl Routing {
    /// W2's routing: `subscribers` each follow `tags_per_subscriber` distinct tags of `tags`,
    /// drawn from `seed`.
    pub fn tags(subscribers: u32, tags: u32, tags_per_subscriber: u32, seed: u64) -> Routing {
        let of_subscriber: Vec<Vec<u32>> = (0..subscribers)
            .map(|subscriber| Rng::new(seed, u64::MAX - subscriber as u64).distinct(tags_per_subscriber, tags))
            .collect();
        let mut by_tag = vec![Vec::new(); tags as usize];
        for (subscriber, chosen) in of_subscriber.iter().enumerate() {
            for tag in chosen {
                by_tag[*tag as usize].push(subscriber as u32);
            }
        }
        Routing::Tags { tags, of_subscriber, by_tag, seed }
    }

    /// Every subscription: the observer it belongs to and its filter. A subscriber of several
    /// tags holds one subscription per tag, all reporting as that one observer.
    pub fn subscriptions(&self) -> Vec<(u32, Filter)> {
        match self {
            Routing::Lookup { keys, .. } => {
                (0..*keys).map(|key| (key, Filter::Field { field: "keys", value: format!("k{key}") })).collect()
            }
            Routing::Tags { of_subscriber, .. } => of_subscriber
                .iter()
                .enumerate()
                .flat_map(|(subscriber, tags)| {
                    tags.iter().map(move |tag| (subscriber as u32, Filter::Subject(format!("tags/t{tag}"))))
                })
                .collect(),
            Routing::Subjects { subscribers, subjects } => (0..*subscribers)
                .map(|subscriber| (subscriber, Filter::Subject(format!("bench/{}", subscriber % subjects))))
                .collect(),
        }
    }

    /// The lookup keys event `seq` carries (W1), none otherwise.
    pub fn keys_of(&self, seq: u64) -> Vec<u32> {
        match self {
            Routing::Lookup { keys, keys_per_event, seed } => Rng::new(*seed, seq).distinct(*keys_per_event, *keys),
            _ => Vec::new(),
        }
    }

    /// The subject event `seq` is published under, if any.
    pub fn subject_of(&self, seq: u64) -> Option<String> {
        match self {
            Routing::Lookup { .. } => None,
            Routing::Tags { tags, seed, .. } => Some(format!("tags/t{}", Rng::new(*seed, seq).below(*tags))),
            Routing::Subjects { subjects, .. } => Some(format!("bench/{}", seq % *subjects as u64)),
        }
    }

    /// The observers that must receive event `seq`.
    pub fn observers_of(&self, seq: u64) -> Vec<u32> {
        match self {
            Routing::Lookup { .. } => self.keys_of(seq),
            Routing::Tags { tags, by_tag, seed, .. } => by_tag[Rng::new(*seed, seq).below(*tags) as usize].clone(),
            Routing::Subjects { subscribers, subjects } => {
                let subject = (seq % *subjects as u64) as u32;
                (subject..*subscribers).step_by(*subjects as usize).collect()
            }
        }
    }

    /// The key column of event `seq` in raw.csv: its lookup keys or its subject.
    pub fn label_of(&self, seq: u64) -> String {
        match self {
            Routing::Lookup { .. } => {
                self.keys_of(seq).iter().map(|key| format!("k{key}")).collect::<Vec<_>>().join(" ")
            }
            _ => self.subject_of(seq).unwrap_or_default(),
        }
    }
}

/// W1, W2 and `bench notify`: durable writes over HTTP reaching subscribers.
#[derive(Clone, Debug)]
pub struct Fanout {
    pub routing: Routing,
    pub protocol: Protocol,
    /// What a write waits for: `fsync` or `async`.
    pub durability: String,
}

/// W3 and `bench view`: events into a windowed count per key, a subscriber to the view, and
/// point queries.
#[derive(Clone, Debug)]
pub struct ViewPlan {
    pub keys: u32,
    pub window_ms: i64,
    pub grace_ms: i64,
    pub query_rate_hz: f64,
    pub durability: String,
    pub seed: u64,
}

impl ViewPlan {
    /// The key of event `seq`, uniform over the keys.
    pub fn key_of(&self, seq: u64) -> u32 {
        Rng::new(self.seed, seq).below(self.keys)
    }

    /// The key point query `seq` asks for, uniform over the keys.
    pub fn query_key_of(&self, seq: u64) -> u32 {
        Rng::new(self.seed ^ 0x0051_5545_5259, seq).below(self.keys)
    }

    /// The start of the window an event time falls in (windows are aligned to the epoch).
    pub fn window_of(&self, event_ms: i64) -> i64 {
        event_ms.div_euclid(self.window_ms) * self.window_ms
    }

    /// The SQL that defines the view over `source`.
    pub fn view_sql(&self, view: &str, source: &str) -> String {
        format!(
            "CREATE VIEW {view} WITH (grace = '{}ms', emit = 'changes,final') AS \
             SELECT key, COUNT(*) AS n FROM TUMBLE({source}, event_ms, INTERVAL '{}' MILLISECOND) GROUP BY key",
            self.grace_ms, self.window_ms
        )
    }
}

/// W4 and `bench mqtt`: MQTT publishers → broker → subscribers.
#[derive(Clone, Debug)]
pub struct Ingest {
    pub publishers: u32,
    pub subscribers: u32,
    pub qos: u8,
    pub payload_bytes: usize,
    pub durability: String,
}

/// A workload's demands on a target.
#[derive(Clone, Debug)]
pub enum Plan {
    Fanout(Fanout),
    View(ViewPlan),
    Ingest(Ingest),
}

impl Plan {
    /// The JSON value of event `seq` sent at `intended_ns` (HTTP workloads).
    pub fn value_json(&self, seq: u64, intended_ns: u64, event_ms: i64) -> String {
        match self {
            Plan::Fanout(fanout) => {
                let keys: Vec<String> = fanout.routing.keys_of(seq).iter().map(|key| format!("k{key}")).collect();
                if keys.is_empty() {
                    format!("{{\"seq\":{seq},\"intended_ns\":{intended_ns}}}")
                } else {
                    json!({ "seq": seq, "intended_ns": intended_ns, "keys": keys }).to_string()
                }
            }
            Plan::View(_) => format!("{{\"seq\":{seq},\"event_ms\":{event_ms}}}"),
            Plan::Ingest(_) => Value::Null.to_string(),
        }
    }

    /// The record key of event `seq`, if it has one.
    pub fn key_of(&self, seq: u64) -> Option<String> {
        match self {
            Plan::View(view) => Some(format!("k{}", view.key_of(seq))),
            _ => None,
        }
    }

    pub fn subject_of(&self, seq: u64) -> Option<String> {
        match self {
            Plan::Fanout(fanout) => fanout.routing.subject_of(seq),
            _ => None,
        }
    }

    /// What a write waits for, as asked of the target.
    pub fn durability(&self) -> &str {
        match self {
            Plan::Fanout(fanout) => &fanout.durability,
            Plan::View(view) => &view.durability,
            Plan::Ingest(ingest) => &ingest.durability,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_events_carry_distinct_keys_and_reach_their_subscribers() {
        let routing = Routing::Lookup { keys: 1000, keys_per_event: 5, seed: 7 };
        for seq in 0..200 {
            let mut keys = routing.keys_of(seq);
            assert_eq!(routing.observers_of(seq), keys);
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), 5);
            assert!(keys.iter().all(|key| *key < 1000));
        }
        assert_eq!(routing.subscriptions().len(), 1000);
        assert_eq!(routing.keys_of(3), Routing::Lookup { keys: 1000, keys_per_event: 5, seed: 7 }.keys_of(3));
    }

    #[test]
    fn tag_subscribers_follow_three_tags_and_receive_exactly_their_tags() {
        let routing = Routing::tags(100, 10, 3, 42);
        let subscriptions = routing.subscriptions();
        assert_eq!(subscriptions.len(), 300);
        for seq in 0..100 {
            let subject = routing.subject_of(seq).unwrap();
            let mut expected: Vec<u32> = subscriptions
                .iter()
                .filter(|(_, filter)| *filter == Filter::Subject(subject.clone()))
                .map(|(observer, _)| *observer)
                .collect();
            expected.sort_unstable();
            let mut observers = routing.observers_of(seq);
            observers.sort_unstable();
            assert_eq!(observers, expected, "event {seq} on {subject}");
        }
    }

    #[test]
    fn subject_routing_matches_bench_notify() {
        let routing = Routing::Subjects { subscribers: 10, subjects: 5 };
        assert_eq!(routing.observers_of(7), vec![2, 7]);
        assert_eq!(routing.subject_of(7).unwrap(), "bench/2");
    }

    #[test]
    fn the_generator_is_uniform_enough() {
        let mut counts = [0u32; 10];
        let mut rng = Rng::new(1, 2);
        for _ in 0..100_000 {
            counts[rng.below(10) as usize] += 1;
        }
        assert!(counts.iter().all(|count| (9_000..11_000).contains(count)), "{counts:?}");
    }
}
