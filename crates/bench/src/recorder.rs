//! What a run saw, recorded without locks on the hot path.
//!
//! A [`Track`] holds one slot per scheduled event (or query): when it was sent and answered and
//! whether the answer was good, in arrays sized up front, so recording is a few atomic stores
//! and the schedule never allocates. Observers keep their receipts in a local vector and hand
//! it over when they stop; live counters feed the progress bar and the drain. Latencies are
//! computed after the run from these raw times (see `analysis`), which is also what `raw.csv`
//! is written from.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use crate::schedule::{Clock, Schedule};

const PENDING: u8 = 0;
const OK: u8 = 1;
const FAILED: u8 = 2;
const SKIPPED: u8 = 3;

/// How one scheduled event ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Sent, never answered (the drain timed out).
    Pending,
    Ok,
    /// Sent and refused, or the connection failed.
    Failed,
    /// Not sent: the in-flight cap was reached.
    Skipped,
}

/// The sending side of one schedule.
pub struct Track {
    pub clock: Clock,
    pub schedule: Schedule,
    /// Clock time of event 0, set once by [`Track::start_at`] when the run begins.
    start_ns: AtomicU64,
    sent_ns: Box<[AtomicU64]>,
    answered_ns: Box<[AtomicU64]>,
    outcome: Box<[AtomicU8]>,
    in_flight: AtomicU64,
    sent: AtomicU64,
    answered: AtomicU64,
    failed: AtomicU64,
}

fn zeroes(count: u64) -> Box<[AtomicU64]> {
    (0..count).map(|_| AtomicU64::new(0)).collect()
}

impl Track {
    pub fn new(clock: Clock, schedule: Schedule) -> Track {
        let total = schedule.total();
        Track {
            clock,
            schedule,
            start_ns: AtomicU64::new(0),
            sent_ns: zeroes(total),
            answered_ns: zeroes(total),
            outcome: (0..total).map(|_| AtomicU8::new(PENDING)).collect(),
            in_flight: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    pub fn start_at(&self, ns: u64) {
        self.start_ns.store(ns, Ordering::Relaxed);
    }

    pub fn start_ns(&self) -> u64 {
        self.start_ns.load(Ordering::Relaxed)
    }

    /// When event `seq` is due, on the run's clock.
    pub fn intended_ns(&self, seq: u64) -> u64 {
        self.start_ns() + self.schedule.offset_ns(seq)
    }

    /// End of the measured window on the run's clock.
    pub fn end_ns(&self) -> u64 {
        self.start_ns() + (self.schedule.warmup + self.schedule.duration).as_nanos() as u64
    }

    /// The scheduler hands `count` events to the producer.
    pub fn begin(&self, count: u64) {
        self.in_flight.fetch_add(count, Ordering::Relaxed);
    }

    /// Event `seq` went out at `ns`.
    pub fn sent(&self, seq: u64, ns: u64) {
        self.sent_ns[seq as usize].store(ns.max(1), Ordering::Relaxed);
        self.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// Event `seq` was answered at `ns`: acknowledged (`ok`) or refused. Once per sent event.
    pub fn answered(&self, seq: u64, ns: u64, ok: bool) {
        self.answered_ns[seq as usize].store(ns.max(1), Ordering::Relaxed);
        self.outcome[seq as usize].store(if ok { OK } else { FAILED }, Ordering::Relaxed);
        self.answered.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// Event `seq` was due but not sent: too many were in flight.
    pub fn skipped(&self, seq: u64) {
        self.outcome[seq as usize].store(SKIPPED, Ordering::Relaxed);
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn sent_count(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    pub fn answered_count(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    pub fn failed_count(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    pub fn outcome(&self, seq: u64) -> Outcome {
        match self.outcome[seq as usize].load(Ordering::Relaxed) {
            OK => Outcome::Ok,
            FAILED => Outcome::Failed,
            SKIPPED => Outcome::Skipped,
            _ => Outcome::Pending,
        }
    }

    /// When event `seq` went out, if it did.
    pub fn sent_at(&self, seq: u64) -> Option<u64> {
        Some(self.sent_ns[seq as usize].load(Ordering::Relaxed)).filter(|ns| *ns > 0)
    }

    /// When event `seq` was answered, if it was.
    pub fn answered_at(&self, seq: u64) -> Option<u64> {
        Some(self.answered_ns[seq as usize].load(Ordering::Relaxed)).filter(|ns| *ns > 0)
    }
}

/// An observer received event `seq` at `received_ns`.
#[derive(Clone, Copy, Debug)]
pub struct Delivery {
    pub seq: u64,
    pub observer: u32,
    pub received_ns: u64,
    /// When its bytes reached the observer's socket, by the kernel's stamp (0: no stamp).
    pub arrived_ns: u64,
}

/// A view subscriber saw the aggregate of `key` in the window starting at `window_start_ms`
/// reach `count` events (`is_final`: the window's closing row).
#[derive(Clone, Copy, Debug)]
pub struct Observation {
    pub key: u32,
    pub window_start_ms: i64,
    pub count: u64,
    pub is_final: bool,
    pub received_ns: u64,
    /// When its bytes reached the subscriber's socket, by the kernel's stamp (0: no stamp).
    pub arrived_ns: u64,
}

/// Receipts in the first chunk of [`Receipts`]; each next chunk is twice the last, up to
/// [`RECEIPTS_PER_CHUNK`]. W1 has 1 000 observers that see a few hundred receipts each: a
/// full-size first chunk for each (512 KiB) put a fresh large allocation on the path of every
/// observer's first receipt, and the echo target's W1 p95 went from 0.6 to 3.5 ms.
const RECEIPTS_FIRST_CHUNK: usize = 64;
/// Receipts per chunk at most: 16 384 deliveries are 512 KiB.
const RECEIPTS_PER_CHUNK: usize = 16 * 1024;

/// What one observer received, in arrival order, kept in chunks (growing to a fixed size) so
/// that recording never moves what was already recorded.
///
/// A plain `Vec` doubles when full: at 100 000 receipts/s (W4's top rate) it doubled at 2^20
/// and 2^21 receipts, about 10.5 s and 21 s into a run, copying 24 and 48 MB into fresh pages.
/// The observer's thread stopped reading for 100–135 ms each time, the target's send buffer to
/// it filled, and the run recorded those stalls as the target's latency. A new chunk costs one
/// allocation and touches its pages as they are written.
pub struct Receipts<T> {
    chunks: Vec<Vec<T>>,
    len: usize,
}

impl<T> Default for Receipts<T> {
    fn default() -> Self {
        Receipts { chunks: Vec::new(), len: 0 }
    }
}

impl<T> Receipts<T> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, receipt: T) {
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < chunk.capacity() => chunk.push(receipt),
            last => {
                let size = last.map_or(RECEIPTS_FIRST_CHUNK, |chunk| (chunk.capacity() * 2).min(RECEIPTS_PER_CHUNK));
                let mut chunk = Vec::with_capacity(size);
                chunk.push(receipt);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T> IntoIterator for Receipts<T> {
    type Item = T;
    type IntoIter = std::iter::Flatten<std::vec::IntoIter<Vec<T>>>;

    fn into_iter(self) -> Self::IntoIter {
        self.chunks.into_iter().flatten()
    }
}

/// Error messages kept for the report, at most this many (the count is kept regardless).
const PROBLEMS_KEPT: usize = 20;

/// Everything one run records.
pub struct Recorder {
    pub clock: Clock,
    pub events: Track,
    /// Point queries (W3), on their own schedule.
    pub queries: Option<Track>,
    deliveries: Mutex<Vec<Delivery>>,
    /// When a consumer had committed each event (a peer's batching consumer, W4 on Kafka).
    commits: Mutex<Vec<Delivery>>,
    observations: Mutex<Vec<Observation>>,
    /// Receipts so far (deliveries or view rows), for progress and the drain.
    delivered: AtomicU64,
    /// Closing rows seen so far (views).
    finals: AtomicU64,
    observer_errors: AtomicU64,
    /// Subscriptions the target cut off for falling behind, resumed from the id it gave.
    resumes: AtomicU64,
    problems: Mutex<Vec<String>>,
}

impl Recorder {
    pub fn new(clock: Clock, events: Schedule, queries: Option<Schedule>) -> Recorder {
        Recorder {
            clock,
            events: Track::new(clock, events),
            queries: queries.map(|schedule| Track::new(clock, schedule)),
            deliveries: Mutex::new(Vec::new()),
            commits: Mutex::new(Vec::new()),
            observations: Mutex::new(Vec::new()),
            delivered: AtomicU64::new(0),
            finals: AtomicU64::new(0),
            observer_errors: AtomicU64::new(0),
            resumes: AtomicU64::new(0),
            problems: Mutex::new(Vec::new()),
        }
    }

    /// Starts both schedules at clock time `ns`.
    pub fn start_at(&self, ns: u64) {
        self.events.start_at(ns);
        if let Some(queries) = &self.queries {
            queries.start_at(ns);
        }
    }

    /// Counts receipts as they arrive (the receipts themselves come with [`Recorder::add_deliveries`]).
    pub fn count_received(&self, count: u64) {
        self.delivered.fetch_add(count, Ordering::Relaxed);
    }

    pub fn count_finals(&self, count: u64) {
        self.finals.fetch_add(count, Ordering::Relaxed);
    }

    pub fn received_count(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    pub fn finals_count(&self) -> u64 {
        self.finals.load(Ordering::Relaxed)
    }

    /// An observer's receipts, handed over when it stops.
    pub fn add_deliveries(&self, deliveries: Receipts<Delivery>) {
        let mut all = self.deliveries.lock().expect("deliveries");
        all.reserve(deliveries.len());
        all.extend(deliveries);
    }

    /// A consumer's commits, handed over when it stops.
    pub fn add_commits(&self, commits: Receipts<Delivery>) {
        let mut all = self.commits.lock().expect("commits");
        all.reserve(commits.len());
        all.extend(commits);
    }

    pub fn add_observations(&self, observations: Receipts<Observation>) {
        let mut all = self.observations.lock().expect("observations");
        all.reserve(observations.len());
        all.extend(observations);
    }

    /// An observer lost its subscription (cut off, disconnected) before the run ended.
    pub fn observer_failed(&self, why: String) {
        self.observer_errors.fetch_add(1, Ordering::Relaxed);
        self.problem(why);
    }

    /// Keeps an error message for the report.
    pub fn problem(&self, why: String) {
        let mut problems = self.problems.lock().expect("problems");
        if problems.len() < PROBLEMS_KEPT {
            problems.push(why);
        }
    }

    pub fn count_resume(&self) {
        self.resumes.fetch_add(1, Ordering::Relaxed);
    }

    pub fn resumes(&self) -> u64 {
        self.resumes.load(Ordering::Relaxed)
    }

    pub fn observer_errors(&self) -> u64 {
        self.observer_errors.load(Ordering::Relaxed)
    }

    pub fn take_deliveries(&self) -> Vec<Delivery> {
        std::mem::take(&mut self.deliveries.lock().expect("deliveries"))
    }

    pub fn take_commits(&self) -> Vec<Delivery> {
        std::mem::take(&mut self.commits.lock().expect("commits"))
    }

    pub fn take_observations(&self) -> Vec<Observation> {
        std::mem::take(&mut self.observations.lock().expect("observations"))
    }

    pub fn problems(&self) -> Vec<String> {
        self.problems.lock().expect("problems").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipts_keep_arrival_order_and_never_move_what_was_recorded() {
        let mut receipts = Receipts::new();
        assert!(receipts.is_empty());
        receipts.push(0u64);
        let first = &receipts.chunks[0][0] as *const u64;
        let total = 3 * RECEIPTS_PER_CHUNK as u64 + 17;
        for value in 1..total {
            receipts.push(value);
        }
        // The first receipt is where it was written: no push reallocated its chunk.
        assert_eq!(&receipts.chunks[0][0] as *const u64, first);
        // Chunks start small and double up to the full size.
        let sizes: Vec<usize> = receipts.chunks.iter().map(Vec::capacity).collect();
        assert_eq!(sizes[0], RECEIPTS_FIRST_CHUNK);
        assert!(sizes.windows(2).all(|pair| pair[1] == (pair[0] * 2).min(RECEIPTS_PER_CHUNK)), "{sizes:?}");
        assert_eq!(*sizes.last().unwrap(), RECEIPTS_PER_CHUNK);
        assert_eq!(receipts.len(), total as usize);
        assert!(receipts.into_iter().eq(0..total));
    }
}
