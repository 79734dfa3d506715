//! The process-wide metrics recorder, exported in Prometheus text format at `/metrics`.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Installs the Prometheus recorder with explicit histogram buckets (the exporter's default is
/// a summary, which cannot be aggregated across scrapes) and describes every metric.
pub fn install_metrics() -> Result<PrometheusHandle, String> {
    use onehop_log::metrics as log_metrics;
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(log_metrics::FSYNC_SECONDS.into()), log_metrics::FSYNC_SECONDS_BUCKETS)
        .and_then(|builder| {
            builder.set_buckets_for_metric(
                Matcher::Full(log_metrics::BATCH_RECORDS.into()),
                log_metrics::BATCH_RECORDS_BUCKETS,
            )
        })
        .map_err(|error| error.to_string())?
        .install_recorder()
        .map_err(|error| format!("cannot install the metrics recorder: {error}"))?;
    log_metrics::describe();
    Ok(handle)
}
