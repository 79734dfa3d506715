//! The observer: a thread of the harness following the log on its own node, timing each
//! transaction against its command's scheduled time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::bail;
use hdrhistogram::Histogram;
use serde::Deserialize;

use super::STREAM;
use super::ledger::RecordValue;
use super::node::{EventReader, ReadOutcome};
use super::process::monotonic_ns;
use crate::histogram;

/// What the observer saw.
pub(super) struct Observed {
    pub(super) publication: Histogram<u64>,
    /// When each sequence arrived (index = sequence; 0: never).
    pub(super) received_ns: Vec<u64>,
    pub(super) seq: u64,
    pub(super) gaps: u64,
    pub(super) duplicates: u64,
    pub(super) fenced: u64,
}

#[derive(Deserialize)]
pub(super) struct RecordEvent {
    pub(super) offset: u64,
    pub(super) value: RecordValue,
}

/// The observer: follows the log on its node and times each transaction's arrival against
/// the time its command was scheduled (not sent: a stalled system does not get to delay the
/// schedule it is measured against).
pub(super) struct Observer {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) seq: Arc<AtomicU64>,
    pub(super) thread: JoinHandle<anyhow::Result<Observed>>,
}

/// The schedule of a run: command `c` (from 1) is due at `start_ns + (c - 1) / rate`.
#[derive(Clone, Copy)]
pub(super) struct Timing {
    pub(super) start_ns: u64,
    pub(super) rate: f64,
    /// The first and last command of the measured window.
    pub(super) measured_first: u64,
    pub(super) measured_last: u64,
}

impl Timing {
    pub(super) fn due_ns(&self, command: u64) -> u64 {
        self.start_ns + ((command - 1) as f64 * 1e9 / self.rate) as u64
    }

    pub(super) fn is_measured(&self, command: u64) -> bool {
        (self.measured_first..=self.measured_last).contains(&command)
    }
}

impl Observer {
    pub(super) fn start(address: String, timing: Timing, total: u64) -> anyhow::Result<Observer> {
        let stop = Arc::new(AtomicBool::new(false));
        let seq = Arc::new(AtomicU64::new(0));
        let path = format!("/streams/{STREAM}");
        let mut reader = EventReader::open(&address, &path, "earliest", Duration::from_millis(100))?;
        let thread = {
            let (stop, seq) = (stop.clone(), seq.clone());
            std::thread::Builder::new().name("bank-observer".into()).spawn(move || {
                crate::priority::raise_this_thread();
                let mut observed = Observed {
                    publication: histogram::latency_histogram(),
                    received_ns: vec![0; total as usize + 1],
                    seq: 0,
                    gaps: 0,
                    duplicates: 0,
                    fenced: 0,
                };
                let (mut epoch_max, mut resume_id, mut reconnects) = (0, None::<String>, 0);
                while !stop.load(Ordering::Relaxed) {
                    let mut problem = None;
                    let outcome = reader.read(|event, data| {
                        if event != "record" {
                            return;
                        }
                        let now_ns = monotonic_ns();
                        let record: RecordEvent = match serde_json::from_str(data) {
                            Ok(record) => record,
                            Err(error) => {
                                problem = Some(format!("a record that is not the ledger's: {error}"));
                                return;
                            }
                        };
                        resume_id = Some(format!("0:{}", record.offset));
                        if record.value.e < epoch_max {
                            observed.fenced += record.value.tx.len() as u64;
                            return;
                        }
                        epoch_max = record.value.e;
                        for transaction in record.value.transactions() {
                            if transaction.seq <= observed.seq {
                                observed.duplicates += 1;
                                continue;
                            }
                            if transaction.seq != observed.seq + 1 {
                                observed.gaps += 1;
                            }
                            observed.seq = transaction.seq;
                            if let Some(at) = observed.received_ns.get_mut(transaction.seq as usize) {
                                *at = now_ns;
                            }
                            let command = transaction.transfer.command;
                            if timing.is_measured(command) {
                                histogram::record(
                                    &mut observed.publication,
                                    now_ns.saturating_sub(timing.due_ns(command)),
                                );
                            }
                        }
                    });
                    if let Some(problem) = problem {
                        bail!("{problem}");
                    }
                    seq.store(observed.seq, Ordering::Relaxed);
                    if let ReadOutcome::Closed(why) = outcome {
                        reconnects += 1;
                        if reconnects > 100 {
                            bail!("the observer's subscription keeps ending: {why}");
                        }
                        std::thread::sleep(Duration::from_millis(100));
                        let from = resume_id.as_deref().unwrap_or("earliest");
                        if let Ok(resumed) = EventReader::open(&address, &path, from, Duration::from_millis(100)) {
                            reader = resumed;
                        }
                    }
                }
                Ok(observed)
            })?
        };
        Ok(Observer { stop, seq, thread })
    }

    pub(super) fn finish(self) -> anyhow::Result<Observed> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| anyhow::anyhow!("the observer panicked"))?
    }
}
