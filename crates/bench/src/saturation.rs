//! Whether a run kept up with its offered rate.
//!
//! A target that cannot keep up queues: every event waits behind the backlog, latency grows
//! for as long as the run lasts, and what the run measures is the depth of that queue, not the
//! target's service time. BENCHMARKS.md asks that a run say so. A run is called saturated when
//!
//! - its latency grew through the measured window: the median of the last quarter of its
//!   events (by intended send time) is at least twice the first quarter's and at least 10 ms
//!   above it (a backlog, not sub-millisecond noise); or
//! - at least 1 % of its events were never sent because the in-flight cap was reached (the
//!   harness held the queue at the cap, so latency could not keep growing).
//!
//! A stall that filled the in-flight cap for a moment is counted in the run's errors, not
//! called saturation.

use std::ops::Range;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::histogram::{latency_histogram, ms, record};

/// Growth of the median, last quarter over first, that marks a backlog.
const GROWTH_FACTOR: u64 = 2;
/// And the least growth in absolute terms.
const GROWTH_NS_MIN: u64 = 10_000_000;
/// Share of events skipped at the in-flight cap that marks a run that could not keep up.
const SKIPPED_PCT_MIN: f64 = 1.0;

/// The verdict on one run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Saturation {
    pub saturated: bool,
    /// Median latency of the events due in the first and the last quarter of the measured
    /// window (0 when a quarter had no samples).
    pub first_quarter_p50_ns: u64,
    pub last_quarter_p50_ns: u64,
    /// Events not sent because the in-flight cap was reached, as a share of those due.
    pub skipped_pct: f64,
}

impl Saturation {
    pub fn judge(first_quarter_p50_ns: u64, last_quarter_p50_ns: u64, skipped: u64, emitted: u64) -> Saturation {
        let skipped_pct = if emitted == 0 { 0.0 } else { skipped as f64 * 100.0 / emitted as f64 };
        let grew = first_quarter_p50_ns > 0
            && last_quarter_p50_ns >= first_quarter_p50_ns.saturating_mul(GROWTH_FACTOR)
            && last_quarter_p50_ns - first_quarter_p50_ns >= GROWTH_NS_MIN;
        Saturation {
            saturated: grew || skipped_pct >= SKIPPED_PCT_MIN,
            first_quarter_p50_ns,
            last_quarter_p50_ns,
            skipped_pct,
        }
    }

    /// What a reader is told about a saturated run.
    pub fn describe(&self) -> String {
        format!(
            "p50 {} ms in the first quarter, {} ms in the last, {:.1} % of events skipped at the in-flight cap: \
             these latencies are queue depth, not service time",
            ms(self.first_quarter_p50_ns),
            ms(self.last_quarter_p50_ns),
            self.skipped_pct
        )
    }
}

/// Latency by quarter of the measured window, by each event's place in the schedule.
pub struct Quarters {
    quarters: [Histogram<u64>; 4],
    measured: Range<u64>,
}

impl Quarters {
    pub fn new(measured: Range<u64>) -> Quarters {
        Quarters { quarters: std::array::from_fn(|_| latency_histogram()), measured }
    }

    /// A latency sample of event `seq` (one of the measured ones).
    pub fn record(&mut self, seq: u64, latency_ns: u64) {
        let len = self.measured.end - self.measured.start;
        if len == 0 || !self.measured.contains(&seq) {
            return;
        }
        let quarter = ((seq - self.measured.start) * 4 / len) as usize;
        record(&mut self.quarters[quarter.min(3)], latency_ns);
    }

    pub fn verdict(&self, skipped: u64, emitted: u64) -> Saturation {
        let p50 = |histogram: &Histogram<u64>| if histogram.is_empty() { 0 } else { histogram.value_at_quantile(0.5) };
        Saturation::judge(p50(&self.quarters[0]), p50(&self.quarters[3]), skipped, emitted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_steady_run_kept_up() {
        let verdict = Saturation::judge(MS, MS + MS / 10, 0, 10_000);
        assert!(!verdict.saturated, "{verdict:?}");
    }

    #[test]
    fn a_growing_backlog_is_saturation() {
        assert!(Saturation::judge(MS, 400 * MS, 0, 10_000).saturated);
        // Twice as slow but only by a few milliseconds: noise or a slow patch, not a backlog.
        assert!(!Saturation::judge(MS / 2, 3 * MS, 0, 10_000).saturated);
        // Ten milliseconds slower, but not twice: a slow target, keeping up.
        assert!(!Saturation::judge(40 * MS, 55 * MS, 0, 10_000).saturated);
    }

    #[test]
    fn a_run_held_at_the_in_flight_cap_is_saturated() {
        // The harness skipped a quarter of the events: latency sat at the cap's depth.
        let held = Saturation::judge(MS, 2 * MS, 2_500, 10_000);
        assert!(held.saturated);
        assert_eq!(held.skipped_pct, 25.0);
        // A stall that filled the cap for a moment (527 of a million): an error, not this.
        assert!(!Saturation::judge(MS, MS, 527, 1_000_000).saturated);
    }

    #[test]
    fn quarters_follow_the_schedule_not_the_arrival_order() {
        // 400 events from seq 100; latency grows with the place in the schedule.
        let mut growing = Quarters::new(100..500);
        let mut steady = Quarters::new(100..500);
        for seq in (100..500).rev() {
            growing.record(seq, (seq - 99) * MS);
            steady.record(seq, MS);
        }
        // Outside the measured window: ignored.
        growing.record(99, 1);
        growing.record(500, 1);
        let verdict = growing.verdict(0, 400);
        assert!(verdict.saturated, "{verdict:?}");
        assert!(verdict.first_quarter_p50_ns < 60 * MS && verdict.last_quarter_p50_ns > 340 * MS, "{verdict:?}");
        assert!(!steady.verdict(0, 400).saturated);
        // No samples at all (nothing delivered): no verdict of growth.
        let empty = Quarters::new(0..10).verdict(0, 10);
        assert_eq!((empty.saturated, empty.first_quarter_p50_ns), (false, 0));
    }

    #[test]
    fn the_description_says_what_the_figures_mean() {
        let text = Saturation::judge(MS / 2, 840 * MS, 0, 1000).describe();
        assert!(text.contains("0.500 ms in the first quarter, 840 ms in the last"), "{text}");
        assert!(text.contains("queue depth"), "{text}");
    }
}
