//! From what a run recorded to its figures: every latency from the event's intended send time,
//! only events due inside the measured window, each measurement also handed out as a raw row.

use std::collections::HashMap;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::histogram::{latency_histogram, merge, record};
use crate::plan::{Plan, ViewPlan};
use crate::recorder::{Delivery, Outcome, Recorder, Track};
use crate::saturation::{Quarters, Saturation};

/// One row of raw.csv.
pub struct RawRow {
    /// `delivery` (an observer received an event), `fresh` (a view row first included the
    /// event), `close` (a view window's closing row), `query` (a point query's answer),
    /// `commit` (a peer's consumer committed the batch holding the event).
    pub kind: &'static str,
    /// The event's (or query's) sequence number; for `close`, the window's start (epoch ms).
    pub event_id: i64,
    pub observer_id: Option<u32>,
    /// Lookup keys, subject or view key.
    pub key: String,
    pub intended_ns: u64,
    pub sent_ns: Option<u64>,
    pub ack_ns: Option<u64>,
    pub received_ns: Option<u64>,
    /// When the receipt's bytes reached the observer's socket, by the kernel's stamp, on the
    /// same clock: `received_ns - arrived_ns` is the time the harness took to read it.
    pub arrived_ns: Option<u64>,
}

pub const RAW_HEADER: &str = "kind,event_id,observer_id,key,intended_ns,sent_ns,ack_ns,received_ns,arrived_ns";

impl RawRow {
    pub fn to_csv(&self) -> String {
        let optional = |value: Option<u64>| value.map_or(String::new(), |value| value.to_string());
        format!(
            "{},{},{},{},{},{},{},{},{}",
            self.kind,
            self.event_id,
            self.observer_id.map_or(String::new(), |id| id.to_string()),
            self.key,
            self.intended_ns,
            optional(self.sent_ns),
            optional(self.ack_ns),
            optional(self.received_ns),
            optional(self.arrived_ns)
        )
    }
}

/// Errors of a run, by cause. Every one counts against "no errors".
#[derive(Clone, Debug, Default, Serialize)]
pub struct Errors {
    /// Writes the target refused or that failed on the way.
    pub write_failed: u64,
    /// Writes never answered before the drain gave up.
    pub write_unanswered: u64,
    /// Events not sent because the in-flight cap was reached.
    pub in_flight_cap: u64,
    /// Subscriptions cut off or closed by the target during the run.
    pub observer: u64,
    /// Deliveries to an observer that should not have received the event.
    pub misrouted: u64,
    /// View windows whose closing row never came, or came with the wrong count.
    pub window_not_closed: u64,
    pub window_count_wrong: u64,
    /// Point queries refused, failed, skipped or unanswered.
    pub query: u64,
}

impl Errors {
    pub fn total(&self) -> u64 {
        self.write_failed
            + self.write_unanswered
            + self.in_flight_cap
            + self.observer
            + self.misrouted
            + self.window_not_closed
            + self.window_count_wrong
            + self.query
    }

    fn add(&mut self, other: &Errors) {
        self.write_failed += other.write_failed;
        self.write_unanswered += other.write_unanswered;
        self.in_flight_cap += other.in_flight_cap;
        self.observer += other.observer;
        self.misrouted += other.misrouted;
        self.window_not_closed += other.window_not_closed;
        self.window_count_wrong += other.window_count_wrong;
        self.query += other.query;
    }
}

/// The figures of one run, or of several merged.
#[derive(Clone, Debug)]
pub struct Figures {
    /// Intended send → observer receipt (views: → the first row that includes the event).
    pub latency: Histogram<u64>,
    /// Intended send → the target's acknowledgement of the write.
    pub ack: Histogram<u64>,
    /// Intended send → the event actually written to the socket: the harness's own lateness.
    pub send_lag: Histogram<u64>,
    /// Per latency sample with a kernel arrival stamp, the time the harness itself added: its
    /// send lag plus the time from the receipt's bytes reaching the observer's socket to the
    /// harness recording them (waking, reading, parsing).
    pub harness: Histogram<u64>,
    /// Per event owed to several observers, all of whose deliveries came with a kernel arrival
    /// stamp: intended send → the first of them reaching its observer's socket, and → the last.
    /// Between the two lies the fan-out: how long the target took to reach every subscriber.
    pub first_arrival: Histogram<u64>,
    pub last_arrival: Histogram<u64>,
    /// Views: window end + grace → its closing row received.
    pub close_lag: Histogram<u64>,
    /// Views: intended send of an event → its window's closing (final) row received: when a
    /// reader that waits for final values (Kafka Streams' `suppress`) sees the event.
    pub final_fresh: Histogram<u64>,
    /// Views: intended send of a point query → its answer.
    pub query: Histogram<u64>,
    /// A peer's batching consumer (W4 on Kafka): intended send → the batch holding the event
    /// committed. Empty for targets whose observers have nothing to commit.
    pub commit: Histogram<u64>,
    /// Events due in the measured window.
    pub producer_emitted: u64,
    pub producer_acked: u64,
    /// Events every observer owed them has received (views: seen in the aggregate).
    pub observer_seen: u64,
    /// Latency samples (an event joined with a receipt).
    pub joined_count: u64,
    pub deliveries_expected: u64,
    pub deliveries_seen: u64,
    pub duplicates: u64,
    /// Times an observer was cut off for falling behind and resumed without a gap.
    pub observer_resumes: u64,
    pub windows_expected: u64,
    pub queries_emitted: u64,
    pub errors: Errors,
    /// Events actually sent per second over the run.
    pub sent_rate_hz: f64,
    pub server_rss_mb: Option<f64>,
    /// The target's own fdatasyncs during the run(s), when it exposes them.
    pub target_fsyncs: Option<crate::fsyncs::Fsyncs>,
    /// Failed logins and TLS handshakes the target counted during the run(s), when it counts
    /// them: a client of the harness refused is a run that measured the wrong thing.
    pub target_refusals: Option<u64>,
    /// CPU used and the machine's pressure during the run(s).
    pub host: Option<crate::host::HostUsage>,
    /// Stalls made on purpose during the run (`--pause-ms`), when asked for.
    pub pauses: Option<crate::pause::PauseFigures>,
    /// Whether each run kept up with its offered rate, in run order.
    pub saturation: Vec<Saturation>,
    pub problems: Vec<String>,
}

impl Default for Figures {
    fn default() -> Self {
        Figures {
            latency: latency_histogram(),
            ack: latency_histogram(),
            send_lag: latency_histogram(),
            harness: latency_histogram(),
            first_arrival: latency_histogram(),
            last_arrival: latency_histogram(),
            close_lag: latency_histogram(),
            final_fresh: latency_histogram(),
            query: latency_histogram(),
            commit: latency_histogram(),
            producer_emitted: 0,
            producer_acked: 0,
            observer_seen: 0,
            joined_count: 0,
            deliveries_expected: 0,
            deliveries_seen: 0,
            duplicates: 0,
            observer_resumes: 0,
            windows_expected: 0,
            queries_emitted: 0,
            errors: Errors::default(),
            sent_rate_hz: 0.0,
            server_rss_mb: None,
            target_fsyncs: None,
            target_refusals: None,
            host: None,
            pauses: None,
            saturation: Vec::new(),
            problems: Vec::new(),
        }
    }
}

impl Figures {
    /// How many of the runs were saturated.
    pub fn saturated_runs(&self) -> usize {
        self.saturation.iter().filter(|run| run.saturated).count()
    }

    pub fn delivered_pct(&self) -> f64 {
        if self.producer_emitted == 0 { 0.0 } else { self.observer_seen as f64 * 100.0 / self.producer_emitted as f64 }
    }

    /// Adds another run: histograms merged, counts summed.
    pub fn merge(&mut self, other: &Figures) {
        merge(&mut self.latency, &other.latency);
        merge(&mut self.ack, &other.ack);
        merge(&mut self.send_lag, &other.send_lag);
        merge(&mut self.harness, &other.harness);
        merge(&mut self.first_arrival, &other.first_arrival);
        merge(&mut self.last_arrival, &other.last_arrival);
        merge(&mut self.close_lag, &other.close_lag);
        merge(&mut self.final_fresh, &other.final_fresh);
        merge(&mut self.query, &other.query);
        merge(&mut self.commit, &other.commit);
        self.producer_emitted += other.producer_emitted;
        self.producer_acked += other.producer_acked;
        self.observer_seen += other.observer_seen;
        self.joined_count += other.joined_count;
        self.deliveries_expected += other.deliveries_expected;
        self.deliveries_seen += other.deliveries_seen;
        self.duplicates += other.duplicates;
        self.observer_resumes += other.observer_resumes;
        self.windows_expected += other.windows_expected;
        self.queries_emitted += other.queries_emitted;
        self.errors.add(&other.errors);
        self.sent_rate_hz = self.sent_rate_hz.max(other.sent_rate_hz);
        self.server_rss_mb = match (self.server_rss_mb, other.server_rss_mb) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        match (&mut self.target_fsyncs, &other.target_fsyncs) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (mine @ None, Some(theirs)) => *mine = Some(theirs.clone()),
            _ => {}
        }
        self.target_refusals = match (self.target_refusals, other.target_refusals) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        match (&mut self.host, &other.host) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (mine @ None, Some(theirs)) => *mine = Some(*theirs),
            _ => {}
        }
        match (&mut self.pauses, &other.pauses) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (mine @ None, Some(theirs)) => *mine = Some(*theirs),
            _ => {}
        }
        self.saturation.extend(other.saturation.iter().copied());
        self.problems.extend(other.problems.iter().take(20usize.saturating_sub(self.problems.len())).cloned());
    }
}

/// Counts a track's measured outcomes into `figures` and returns the measured range.
fn count_track(track: &Track, ack: &mut Histogram<u64>, errors: &mut Errors, acked: &mut u64) -> std::ops::Range<u64> {
    let measured = track.schedule.measured();
    for seq in measured.clone() {
        match track.outcome(seq) {
            Outcome::Ok => {
                *acked += 1;
                if let Some(answered) = track.answered_at(seq) {
                    record(ack, answered.saturating_sub(track.intended_ns(seq)));
                }
            }
            Outcome::Failed => errors.write_failed += 1,
            Outcome::Pending => errors.write_unanswered += 1,
            Outcome::Skipped => errors.in_flight_cap += 1,
        }
    }
    measured
}

/// The figures of a run; `rows` receives every measurement of the measured window.
pub fn analyze(plan: &Plan, recorder: &Recorder, rows: &mut dyn FnMut(RawRow)) -> Figures {
    let mut figures = Figures::default();
    let events = &recorder.events;
    let measured = count_track(events, &mut figures.ack, &mut figures.errors, &mut figures.producer_acked);
    figures.producer_emitted = measured.end - measured.start;
    for seq in measured.clone() {
        if let Some(sent_ns) = events.sent_at(seq) {
            record(&mut figures.send_lag, sent_ns.saturating_sub(events.intended_ns(seq)));
        }
    }
    figures.errors.observer = recorder.observer_errors();
    figures.observer_resumes = recorder.resumes();
    let elapsed_s = (events.schedule.warmup + events.schedule.duration).as_secs_f64();
    figures.sent_rate_hz = events.sent_count() as f64 / elapsed_s;
    let mut quarters = Quarters::new(measured.clone());
    match plan {
        Plan::Fanout(fanout) => {
            let observers_of = |seq: u64| fanout.routing.observers_of(seq);
            let label_of = |seq: u64| fanout.routing.label_of(seq);
            deliveries(recorder, measured, &observers_of, &label_of, &mut figures, &mut quarters, rows);
        }
        Plan::Ingest(ingest) => {
            let all: Vec<u32> = (0..ingest.subscribers).collect();
            let observers_of = |_: u64| all.clone();
            deliveries(
                recorder,
                measured.clone(),
                &observers_of,
                &|_| String::new(),
                &mut figures,
                &mut quarters,
                rows,
            );
            commits(recorder, measured, &mut figures, rows);
        }
        Plan::View(view) => freshness(view, recorder, measured, &mut figures, &mut quarters, rows),
    }
    figures.saturation = vec![quarters.verdict(figures.errors.in_flight_cap, figures.producer_emitted)];
    figures.problems = recorder.problems();
    figures
}

/// The harness's own share of one latency sample: how late it sent event `seq`, plus how long
/// its receipt sat in the observer's socket before being recorded. Skipped without a stamp.
fn record_harness(harness: &mut Histogram<u64>, events: &Track, seq: u64, received_ns: u64, arrived_ns: u64) {
    if arrived_ns == 0 {
        return;
    }
    if let Some(sent_ns) = events.sent_at(seq) {
        let send_lag = sent_ns.saturating_sub(events.intended_ns(seq));
        record(harness, send_lag + received_ns.saturating_sub(arrived_ns));
    }
}

/// Fan-out: one measurement per (event, observer owed it).
fn deliveries(
    recorder: &Recorder,
    measured: std::ops::Range<u64>,
    observers_of: &dyn Fn(u64) -> Vec<u32>,
    label_of: &dyn Fn(u64) -> String,
    figures: &mut Figures,
    quarters: &mut Quarters,
    rows: &mut dyn FnMut(RawRow),
) {
    let events = &recorder.events;
    let mut received: Vec<Delivery> = recorder.take_deliveries();
    received.sort_unstable_by_key(|delivery| (delivery.seq, delivery.observer, delivery.received_ns));
    let before = received.len();
    received.dedup_by_key(|delivery| (delivery.seq, delivery.observer));
    figures.duplicates = (before - received.len()) as u64;
    let mut next = received.partition_point(|delivery| delivery.seq < measured.start);
    for seq in measured {
        let intended_ns = events.intended_ns(seq);
        let owed = observers_of(seq);
        let first = next;
        while next < received.len() && received[next].seq == seq {
            next += 1;
        }
        let got = &received[first..next];
        figures.deliveries_expected += owed.len() as u64;
        let mut seen = 0;
        // The first and last kernel arrival among the event's deliveries (0: one had no stamp).
        let (mut first_arrived, mut last_arrived) = (u64::MAX, 0);
        for delivery in got {
            if owed.contains(&delivery.observer) {
                seen += 1;
                first_arrived = first_arrived.min(delivery.arrived_ns);
                last_arrived = last_arrived.max(delivery.arrived_ns);
                let latency_ns = delivery.received_ns.saturating_sub(intended_ns);
                record(&mut figures.latency, latency_ns);
                quarters.record(seq, latency_ns);
                record_harness(&mut figures.harness, events, seq, delivery.received_ns, delivery.arrived_ns);
            } else {
                figures.errors.misrouted += 1;
            }
        }
        figures.deliveries_seen += seen;
        figures.joined_count += seen;
        if seen == owed.len() as u64 {
            figures.observer_seen += 1;
            if owed.len() > 1 && first_arrived > 0 {
                record(&mut figures.first_arrival, first_arrived.saturating_sub(intended_ns));
                record(&mut figures.last_arrival, last_arrived.saturating_sub(intended_ns));
            }
        }
        let label = label_of(seq);
        let row = |observer_id: Option<u32>, receipt: Option<&Delivery>| RawRow {
            kind: "delivery",
            event_id: seq as i64,
            observer_id,
            key: label.clone(),
            intended_ns,
            sent_ns: events.sent_at(seq),
            ack_ns: events.answered_at(seq),
            received_ns: receipt.map(|delivery| delivery.received_ns),
            arrived_ns: receipt.map(|delivery| delivery.arrived_ns).filter(|ns| *ns > 0),
        };
        if owed.is_empty() {
            rows(row(None, None));
        }
        for observer in owed {
            rows(row(Some(observer), got.iter().find(|delivery| delivery.observer == observer)));
        }
    }
}

/// A consumer's commits: one `commit` row and latency sample per measured event committed.
fn commits(recorder: &Recorder, measured: std::ops::Range<u64>, figures: &mut Figures, rows: &mut dyn FnMut(RawRow)) {
    let events = &recorder.events;
    let mut committed = recorder.take_commits();
    committed.sort_unstable_by_key(|commit| (commit.seq, commit.received_ns));
    committed.dedup_by_key(|commit| commit.seq);
    for commit in committed.iter().filter(|commit| measured.contains(&commit.seq)) {
        let intended_ns = events.intended_ns(commit.seq);
        record(&mut figures.commit, commit.received_ns.saturating_sub(intended_ns));
        rows(RawRow {
            kind: "commit",
            event_id: commit.seq as i64,
            observer_id: Some(commit.observer),
            key: String::new(),
            intended_ns,
            sent_ns: events.sent_at(commit.seq),
            ack_ns: events.answered_at(commit.seq),
            received_ns: Some(commit.received_ns),
            arrived_ns: Some(commit.arrived_ns).filter(|ns| *ns > 0),
        });
    }
}

/// A view row as the freshness join uses it: received at, the highest count seen by then (the
/// row's own count until the times are folded), arrived at (kernel stamp, 0 if none).
type Seen = (u64, u64, u64);

/// Views: freshness per event, close lag per window, point-query latency.
fn freshness(
    view: &ViewPlan,
    recorder: &Recorder,
    measured: std::ops::Range<u64>,
    figures: &mut Figures,
    quarters: &mut Quarters,
    rows: &mut dyn FnMut(RawRow),
) {
    let events = &recorder.events;
    let clock = events.clock;
    // Each sent event's window and its place among its window's events, in sending order:
    // the view includes event n of a window once that window's count reaches n. (A key gets a
    // new event every keys/rate seconds on average, far apart enough for them not to overtake
    // each other on the way.)
    let mut counted: HashMap<(u32, i64), u64> = HashMap::new();
    let mut place = vec![(0u32, 0i64, 0u64); events.schedule.total() as usize];
    for seq in 0..events.schedule.total() {
        if events.sent_at(seq).is_none() {
            continue;
        }
        let key = view.key_of(seq);
        let window = view.window_of(clock.epoch_ms_at(events.intended_ns(seq)));
        let count = counted.entry((key, window)).or_default();
        *count += 1;
        place[seq as usize] = (key, window, *count);
    }
    // Per window: the times its count was seen, with the highest count seen by then.
    let mut seen: HashMap<(u32, i64), Vec<Seen>> = HashMap::new();
    let mut finals: HashMap<(u32, i64), (u64, u64, u64)> = HashMap::new();
    for observation in recorder.take_observations() {
        let window = (observation.key, observation.window_start_ms);
        seen.entry(window).or_default().push((observation.received_ns, observation.count, observation.arrived_ns));
        if observation.is_final {
            finals.entry(window).or_insert((observation.received_ns, observation.count, observation.arrived_ns));
        }
    }
    for times in seen.values_mut() {
        times.sort_unstable();
        let mut highest = 0;
        for entry in times.iter_mut() {
            highest = highest.max(entry.1);
            entry.1 = highest;
        }
    }
    let mut measured_windows: HashMap<(u32, i64), ()> = HashMap::new();
    for seq in measured {
        let (key, window, place_in_window) = place[seq as usize];
        let intended_ns = events.intended_ns(seq);
        let mut received = None;
        if place_in_window > 0 {
            measured_windows.insert((key, window), ());
            if let Some(times) = seen.get(&(key, window)) {
                let index = times.partition_point(|(_, highest, _)| *highest < place_in_window);
                received = times.get(index).map(|(at, _, arrived)| (*at, *arrived));
            }
        }
        let received_ns = received.map(|(at, _)| at);
        let arrived_ns = received.map(|(_, arrived)| arrived).filter(|ns| *ns > 0);
        // A closing row that counts fewer events than this one's place has not included it.
        if let Some((final_ns, count, _)) = finals.get(&(key, window))
            && place_in_window > 0
            && *count >= place_in_window
        {
            record(&mut figures.final_fresh, final_ns.saturating_sub(intended_ns));
        }
        if let Some((at, arrived)) = received {
            figures.observer_seen += 1;
            figures.joined_count += 1;
            record(&mut figures.latency, at.saturating_sub(intended_ns));
            quarters.record(seq, at.saturating_sub(intended_ns));
            record_harness(&mut figures.harness, events, seq, at, arrived);
        }
        rows(RawRow {
            kind: "fresh",
            event_id: seq as i64,
            observer_id: Some(0),
            key: format!("k{}", view.key_of(seq)),
            intended_ns,
            sent_ns: events.sent_at(seq),
            ack_ns: events.answered_at(seq),
            received_ns,
            arrived_ns,
        });
    }
    let mut windows: Vec<(u32, i64)> = measured_windows.into_keys().collect();
    windows.sort_unstable();
    figures.windows_expected = windows.len() as u64;
    for (key, window) in windows {
        let close_ns = clock.ns_at_epoch_ms(window + view.window_ms + view.grace_ms);
        let closing = finals.get(&(key, window));
        match closing {
            Some((at, count, _)) => {
                record(&mut figures.close_lag, at.saturating_sub(close_ns));
                if Some(count) != counted.get(&(key, window)) {
                    figures.errors.window_count_wrong += 1;
                    recorder.problem(format!(
                        "window k{key}@{window}: closed at {count} events, {} were sent",
                        counted.get(&(key, window)).copied().unwrap_or(0)
                    ));
                }
            }
            None => figures.errors.window_not_closed += 1,
        }
        rows(RawRow {
            kind: "close",
            event_id: window,
            observer_id: Some(0),
            key: format!("k{key}"),
            intended_ns: close_ns,
            sent_ns: None,
            ack_ns: None,
            received_ns: closing.map(|(at, _, _)| *at),
            arrived_ns: closing.map(|(_, _, arrived)| *arrived).filter(|ns| *ns > 0),
        });
    }
    if let Some(queries) = &recorder.queries {
        let mut query_errors = Errors::default();
        let mut answered = 0;
        let measured = count_track(queries, &mut figures.query, &mut query_errors, &mut answered);
        figures.queries_emitted = measured.end - measured.start;
        figures.errors.query = query_errors.total();
        for seq in measured {
            rows(RawRow {
                kind: "query",
                event_id: seq as i64,
                observer_id: None,
                key: format!("k{}", view.query_key_of(seq)),
                intended_ns: queries.intended_ns(seq),
                sent_ns: queries.sent_at(seq),
                ack_ns: queries.answered_at(seq),
                received_ns: queries.answered_at(seq),
                arrived_ns: None,
            });
        }
    }
}
