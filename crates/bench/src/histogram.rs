//! Latency histograms in nanoseconds.

use hdrhistogram::Histogram;

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

/// The value at `quantile` (0..=1) in microseconds.
pub fn quantile_us(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1000.0
}
