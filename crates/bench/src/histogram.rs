//! Latency histograms in nanoseconds.

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency recorded without saturating: one minute.
const LATENCY_NS_MAX: u64 = 60_000_000_000;

/// A histogram for latencies from 1 ns to one minute at three significant digits.
pub fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_NS_MAX, 3).expect("valid histogram bounds")
}

/// Records `ns`, clamped into the histogram's range so an outlier is counted, not dropped.
pub fn record(histogram: &mut Histogram<u64>, ns: u64) {
    histogram.saturating_record(ns.clamp(1, LATENCY_NS_MAX));
}

/// A latency in milliseconds as the reports print it: three significant digits or so.
pub fn ms(ns: u64) -> String {
    let ms = ns as f64 / 1e6;
    if ms >= 100.0 {
        format!("{ms:.0}")
    } else if ms >= 10.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.3}")
    }
}

/// The value at `quantile` (0..=1) in microseconds.
pub fn quantile_us(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1000.0
}

/// Adds `from` into `into`. Histograms from `latency_histogram` share bounds, so this cannot
/// fail; runs are merged this way, never by averaging their percentiles.
pub fn merge(into: &mut Histogram<u64>, from: &Histogram<u64>) {
    into.add(from).expect("latency histograms share their bounds");
}

/// The percentiles a report prints, in nanoseconds; all zero for an empty histogram.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p95_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

impl Percentiles {
    pub fn of(histogram: &Histogram<u64>) -> Percentiles {
        if histogram.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: histogram.len(),
            p50_ns: histogram.value_at_quantile(0.5),
            p90_ns: histogram.value_at_quantile(0.9),
            p95_ns: histogram.value_at_quantile(0.95),
            p99_ns: histogram.value_at_quantile(0.99),
            p999_ns: histogram.value_at_quantile(0.999),
            max_ns: histogram.max(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_runs_give_the_percentiles_of_all_samples_together() {
        let (mut first, mut second) = (latency_histogram(), latency_histogram());
        for us in 1..=100u64 {
            record(&mut first, us * 1000);
        }
        for _ in 0..900 {
            record(&mut second, 1_000_000);
        }
        merge(&mut first, &second);
        let percentiles = Percentiles::of(&first);
        assert_eq!(percentiles.count, 1000);
        // 1 ms: the median of all samples, not the mean of the runs' medians (~0.5 ms).
        assert!((999_000..=1_001_000).contains(&percentiles.p50_ns), "{percentiles:?}");
        assert!(percentiles.max_ns >= 1_000_000);
        assert_eq!(Percentiles::of(&latency_histogram()).p99_ns, 0);
    }
}
