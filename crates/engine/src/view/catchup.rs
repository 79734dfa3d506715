//! How far a view or transform is in replaying its source up to where the source ended when
//! the task started, logged as it goes: `{kind} restoring` every 2 s with records/s, and
//! `{kind} restored` with the total and the rate once it has caught up; and the cursor they
//! read their source with.

use std::time::{Duration, Instant};

use std::sync::Arc;

use crate::error::EngineError;
use crate::filter::Filter;
use crate::hub::{Cursor, Hub};
use crate::stream::Stream;

/// Records a view or transform reads from the log per step while replaying.
const READ_AHEAD: usize = 4096;

/// A cursor over every record of `source` from `positions` on, reading ahead in large steps.
pub(crate) fn follow(hub: &Arc<Hub>, source: &Arc<Stream>, positions: Vec<u64>) -> Result<Cursor, EngineError> {
    Ok(Cursor::new(hub.clone(), source.clone(), Arc::new(Filter::default()), positions)?.read_ahead(READ_AHEAD))
}

/// Restoration logs its progress this often.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);

pub(crate) struct Catchup {
    /// `view` or `transform`, for the log.
    kind: &'static str,
    name: String,
    /// Per source: where the task started in it, and its end offsets when the task started.
    starts: Vec<Vec<u64>>,
    targets: Vec<Vec<u64>>,
    backlog: u64,
    started: Instant,
    last_log: Instant,
    done: bool,
}

impl Catchup {
    /// Starts counting from `positions` in `source`; logs the backlog when there is one.
    pub fn new(kind: &'static str, name: &str, source: &Stream, positions: &[u64]) -> Catchup {
        Catchup::of(kind, name, &[(source, positions)])
    }

    /// Starts counting from each of `sources`'s positions (a transform's branches).
    pub fn of(kind: &'static str, name: &str, sources: &[(&Stream, &[u64])]) -> Catchup {
        let targets: Vec<Vec<u64>> = sources.iter().map(|(source, _)| source.end_offsets()).collect();
        let starts: Vec<Vec<u64>> = sources.iter().map(|(_, positions)| positions.to_vec()).collect();
        let backlog = targets
            .iter()
            .zip(&starts)
            .flat_map(|(targets, starts)| targets.iter().zip(starts))
            .map(|(end, at)| end.saturating_sub(*at))
            .sum();
        let mut catchup = Catchup {
            kind,
            name: name.to_string(),
            starts,
            targets,
            backlog,
            started: Instant::now(),
            last_log: Instant::now(),
            done: false,
        };
        if backlog > 0 {
            tracing::info!(kind, name, records = backlog, "{kind} restoring: replaying its source");
        } else {
            catchup.finish(0);
        }
        catchup
    }

    /// Whether everything that was in the source at the start has been read.
    pub fn done(&self) -> bool {
        self.done
    }

    /// Takes where the task has read up to; true the one time that reaches the targets.
    pub fn update(&mut self, positions: &[u64]) -> bool {
        self.update_all(&[positions])
    }

    /// [`Catchup::update`] with where the task is in each of its sources.
    pub fn update_all(&mut self, positions: &[&[u64]]) -> bool {
        if self.done {
            return false;
        }
        let mut read = 0;
        let mut reached = true;
        for ((positions, targets), starts) in positions.iter().zip(&self.targets).zip(&self.starts) {
            for ((at, end), start) in positions.iter().zip(targets).zip(starts) {
                read += (*at).min(*end).saturating_sub(*start);
                reached &= at >= end;
            }
        }
        if reached {
            self.finish(read);
            return true;
        }
        if self.last_log.elapsed() >= PROGRESS_INTERVAL {
            self.last_log = Instant::now();
            let rate = read as f64 / self.started.elapsed().as_secs_f64();
            let (kind, name) = (self.kind, self.name.as_str());
            tracing::info!(
                kind,
                name,
                records = read,
                of = self.backlog,
                records_per_s = rate as u64,
                "{kind} restoring"
            );
        }
        false
    }

    fn finish(&mut self, records: u64) {
        self.done = true;
        restored(self.kind, &self.name, records, self.started);
    }
}

/// Logs that a view or transform has its state back: `records` folded in since `started`.
pub(crate) fn restored(kind: &str, name: &str, records: u64, started: Instant) {
    let seconds = started.elapsed().as_secs_f64();
    let rate = if seconds > 0.0 { records as f64 / seconds } else { 0.0 };
    tracing::info!(
        kind,
        name,
        records,
        seconds = format!("{seconds:.3}"),
        records_per_s = rate as u64,
        "{kind} restored"
    );
}
