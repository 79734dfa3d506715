//! The target's own fdatasync times over a run, read from its Prometheus histogram
//! (`log_fsync_duration_seconds` on `/metrics`) before and after: a run with a long tail can
//! be checked against the disk it ran on. The harness does not time the disk itself, which
//! would load it during the run.

use serde::Serialize;

/// The histogram's name on `/metrics`.
const BUCKET_PREFIX: &str = "log_fsync_duration_seconds_bucket{";

/// A fdatasync histogram: cumulative counts by upper bound in seconds, ascending, `+Inf` last.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fsyncs {
    buckets: Vec<(f64, u64)>,
}

/// What meta.json and the run line say about a run's fdatasyncs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct FsyncSummary {
    pub count: u64,
    /// fdatasyncs that took longer than 10 ms.
    pub over_10ms: u64,
    /// The slowest took at most this long (the upper bound of its bucket); `None` when there
    /// was none, or when it was beyond the largest finite bound.
    pub slowest_at_most_s: Option<f64>,
}

impl Fsyncs {
    /// The histogram in a `/metrics` text, if it is there: summed over its series, should it
    /// ever carry labels besides `le`. Lines of other metrics, and a bucket line that does not
    /// parse, are passed over.
    pub fn parse(text: &str) -> Option<Fsyncs> {
        let mut buckets: Vec<(f64, u64)> = text
            .lines()
            .filter_map(|line| {
                let labels = line.strip_prefix(BUCKET_PREFIX)?;
                let bound = labels.split("le=\"").nth(1)?.split('"').next()?;
                let bound = if bound == "+Inf" { f64::INFINITY } else { bound.parse().ok()? };
                let count = line.rsplit(' ').next()?.parse::<f64>().ok()?;
                Some((bound, count as u64))
            })
            .collect();
        if buckets.is_empty() {
            return None;
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        buckets.dedup_by(|later, earlier| {
            let same = later.0 == earlier.0;
            if same {
                earlier.1 += later.1;
            }
            same
        });
        Some(Fsyncs { buckets })
    }

    /// What happened between `before` and `self` (bucket by bucket, same bounds).
    pub fn since(&self, before: &Fsyncs) -> Fsyncs {
        let at = |bound: f64| before.buckets.iter().find(|(b, _)| *b == bound).map_or(0, |(_, count)| *count);
        Fsyncs {
            buckets: self.buckets.iter().map(|&(bound, count)| (bound, count.saturating_sub(at(bound)))).collect(),
        }
    }

    /// Adds another run's (bucket by bucket).
    pub fn merge(&mut self, other: &Fsyncs) {
        if self.buckets.is_empty() {
            self.buckets.clone_from(&other.buckets);
            return;
        }
        for (bound, count) in &mut self.buckets {
            *count += other.buckets.iter().find(|(b, _)| b == bound).map_or(0, |(_, count)| *count);
        }
    }

    pub fn count(&self) -> u64 {
        self.buckets.last().map_or(0, |(_, count)| *count)
    }

    /// fdatasyncs slower than `seconds`, which must be one of the bounds (else those above the
    /// largest bound below it).
    pub fn over(&self, seconds: f64) -> u64 {
        let within = self.buckets.iter().rev().find(|(bound, _)| *bound <= seconds).map_or(0, |(_, count)| *count);
        self.count() - within.min(self.count())
    }

    pub fn summary(&self) -> FsyncSummary {
        let count = self.count();
        let slowest = self.buckets.iter().find(|(_, cumulative)| *cumulative == count).map(|(bound, _)| *bound);
        FsyncSummary {
            count,
            over_10ms: self.over(0.01),
            slowest_at_most_s: slowest.filter(|bound| count > 0 && bound.is_finite()),
        }
    }
}

impl FsyncSummary {
    /// For the run line and summary.md: `52614 (3 over 10 ms, slowest ≤ 50 ms)`.
    pub fn describe(&self) -> String {
        let slowest = match self.slowest_at_most_s {
            Some(bound) => format!("slowest ≤ {} ms", (bound * 1e6).round() / 1e3),
            None if self.count > 0 => "slowest beyond the largest bucket".to_string(),
            None => "none".to_string(),
        };
        format!("{} ({} over 10 ms, {slowest})", self.count, self.over_10ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics(counts: [u64; 5]) -> String {
        let bounds = ["0.0001", "0.001", "0.01", "0.1", "+Inf"];
        let mut text = String::from(
            "# TYPE log_fsync_duration_seconds histogram\nlog_appends_total 7\n\
             http_request_duration_seconds_bucket{route=\"/sql\",le=\"0.1\"} 3\n",
        );
        for (bound, count) in bounds.iter().zip(counts) {
            text.push_str(&format!("log_fsync_duration_seconds_bucket{{le=\"{bound}\"}} {count}\n"));
        }
        text.push_str("log_fsync_duration_seconds_sum 0.25\nlog_fsync_duration_seconds_count 9\n");
        text
    }

    #[test]
    fn a_run_is_the_difference_of_two_scrapes() {
        let before = Fsyncs::parse(&metrics([1, 3, 4, 4, 4])).unwrap();
        let after = Fsyncs::parse(&metrics([2, 8, 11, 13, 14])).unwrap();
        let run = after.since(&before);
        assert_eq!(run.summary(), FsyncSummary { count: 10, over_10ms: 3, slowest_at_most_s: None });
        assert_eq!(run.summary().describe(), "10 (3 over 10 ms, slowest beyond the largest bucket)");
        let quiet = Fsyncs::parse(&metrics([2, 8, 11, 13, 13])).unwrap().since(&before);
        assert_eq!(quiet.summary(), FsyncSummary { count: 9, over_10ms: 2, slowest_at_most_s: Some(0.1) });
        assert_eq!(quiet.summary().describe(), "9 (2 over 10 ms, slowest ≤ 100 ms)");
        let mut merged = run.clone();
        merged.merge(&quiet);
        assert_eq!(merged.summary(), FsyncSummary { count: 19, over_10ms: 5, slowest_at_most_s: None });
        let none = before.since(&before).summary();
        assert_eq!(none, FsyncSummary { count: 0, over_10ms: 0, slowest_at_most_s: None });
        assert_eq!(none.describe(), "0 (0 over 10 ms, none)");
    }

    #[test]
    fn other_text_is_no_histogram() {
        assert_eq!(Fsyncs::parse("log_appends_total 7\n"), None);
        assert_eq!(Fsyncs::parse(""), None);
        // A bucket line that does not parse is passed over, not taken as zero.
        let text = "log_fsync_duration_seconds_bucket{le=\"x\"} 3\nlog_fsync_duration_seconds_bucket{le=\"+Inf\"} 4\n";
        assert_eq!(Fsyncs::parse(text).unwrap().count(), 4);
        // Two series (by a label besides `le`) are one histogram for the whole server.
        let text = "log_fsync_duration_seconds_bucket{partition=\"0\",le=\"0.01\"} 3\n\
                    log_fsync_duration_seconds_bucket{partition=\"1\",le=\"0.01\"} 2\n\
                    log_fsync_duration_seconds_bucket{partition=\"0\",le=\"+Inf\"} 4\n\
                    log_fsync_duration_seconds_bucket{partition=\"1\",le=\"+Inf\"} 2\n";
        let both = Fsyncs::parse(text).unwrap().summary();
        assert_eq!(both, FsyncSummary { count: 6, over_10ms: 1, slowest_at_most_s: None });
    }
}
