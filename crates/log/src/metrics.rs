//! Metric names of the log, `<subsystem>_<noun>_<unit>`, without labels (bounded by design).
//! Recorded with the `metrics` crate; the server exports them at `/metrics`.

pub const APPENDS: &str = "log_appends_total";
pub const RECORDS: &str = "log_records_appended_total";
pub const BYTES: &str = "log_bytes_appended_total";
pub const BATCH_RECORDS: &str = "log_commit_batch_records";
pub const FSYNC_SECONDS: &str = "log_fsync_duration_seconds";
pub const INLINE_SYNCS: &str = "log_inline_syncs_total";
pub const SEGMENTS_ROLLED: &str = "log_segments_rolled_total";
pub const RECOVERY_TRUNCATIONS: &str = "log_recovery_truncations_total";
pub const RECOVERY_TRUNCATED_BYTES: &str = "log_recovery_truncated_bytes_total";
/// Ranges of offsets found missing at open (a segment deleted or cut short) and accepted.
pub const RECOVERY_MISSING_RANGES: &str = "log_recovery_missing_ranges_total";
pub const RETENTION_SEGMENTS_DELETED: &str = "log_retention_segments_deleted_total";
pub const COMPACTION_RECORDS_REMOVED: &str = "log_compaction_records_removed_total";
pub const POISONED: &str = "log_partitions_poisoned_total";
pub const READS_FROM_MEMORY: &str = "log_reads_from_memory_total";
pub const READS_FROM_FILE: &str = "log_reads_from_file_total";

/// The write and read paths' metrics, registered once per partition: `counter!` and
/// `histogram!` look their key up in the recorder on every call, and these are recorded on the
/// way from a batch's fdatasync to its acknowledgements. A recorder installed after the
/// partition opened does not see them (the server installs its recorder first).
pub(crate) struct Meters {
    pub(crate) appends: metrics::Counter,
    pub(crate) records: metrics::Counter,
    pub(crate) bytes: metrics::Counter,
    pub(crate) batch_records: metrics::Histogram,
    pub(crate) fsync_seconds: metrics::Histogram,
    pub(crate) inline_syncs: metrics::Counter,
    pub(crate) reads_from_memory: metrics::Counter,
    pub(crate) reads_from_file: metrics::Counter,
}

impl Meters {
    pub(crate) fn register() -> Meters {
        Meters {
            appends: metrics::counter!(APPENDS),
            records: metrics::counter!(RECORDS),
            bytes: metrics::counter!(BYTES),
            batch_records: metrics::histogram!(BATCH_RECORDS),
            fsync_seconds: metrics::histogram!(FSYNC_SECONDS),
            inline_syncs: metrics::counter!(INLINE_SYNCS),
            reads_from_memory: metrics::counter!(READS_FROM_MEMORY),
            reads_from_file: metrics::counter!(READS_FROM_FILE),
        }
    }
}

/// Histogram bucket bounds for the exporter: fsync latency in seconds.
pub const FSYNC_SECONDS_BUCKETS: &[f64] =
    &[0.000_05, 0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0];
/// Histogram bucket bounds for the exporter: records per group commit.
pub const BATCH_RECORDS_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0];

/// Registers every log metric with the installed recorder, so each is exported (at 0) before
/// its first event: a series that appears only with its first increment hides that increment
/// from `rate()` and `increase()`. Most are registered with each partition anyway; recovery,
/// retention, compaction and poisoning count rare events.
fn register() {
    let counters = [
        APPENDS,
        RECORDS,
        BYTES,
        INLINE_SYNCS,
        SEGMENTS_ROLLED,
        RECOVERY_TRUNCATIONS,
        RECOVERY_TRUNCATED_BYTES,
        RECOVERY_MISSING_RANGES,
        RETENTION_SEGMENTS_DELETED,
        COMPACTION_RECORDS_REMOVED,
        POISONED,
        READS_FROM_MEMORY,
        READS_FROM_FILE,
    ];
    for name in counters {
        let _ = metrics::counter!(name);
    }
    for name in [BATCH_RECORDS, FSYNC_SECONDS] {
        let _ = metrics::histogram!(name);
    }
}

/// Registers a description for every log metric with the installed recorder, and the metrics
/// themselves ([`register`]).
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_histogram};
    register();
    describe_counter!(APPENDS, "Append requests acknowledged.");
    describe_counter!(RECORDS, "Records appended and acknowledged.");
    describe_counter!(BYTES, Unit::Bytes, "Bytes of batches written, headers included.");
    describe_histogram!(BATCH_RECORDS, "Records per group-commit batch (one write, at most one fdatasync).");
    describe_histogram!(FSYNC_SECONDS, Unit::Seconds, "Duration of each fdatasync of a log segment.");
    describe_counter!(
        INLINE_SYNCS,
        "Batches the write thread made durable itself, with no other write in flight (no hand-off to the sync thread)."
    );
    describe_counter!(SEGMENTS_ROLLED, "Segments closed because they reached segment_bytes_max.");
    describe_counter!(RECOVERY_TRUNCATIONS, "Partitions whose tail recovery cut a torn or corrupt batch.");
    describe_counter!(RECOVERY_TRUNCATED_BYTES, Unit::Bytes, "Bytes cut from segment tails by recovery.");
    describe_counter!(
        RECOVERY_MISSING_RANGES,
        "Ranges of offsets whose segment files were deleted or cut short, accepted at open by --discard-damaged."
    );
    describe_counter!(RETENTION_SEGMENTS_DELETED, "Segments deleted by age or size retention.");
    describe_counter!(COMPACTION_RECORDS_REMOVED, "Records removed by compaction (superseded keys, old tombstones).");
    describe_counter!(POISONED, "Partitions that stopped accepting writes after an I/O failure.");
    describe_counter!(
        READS_FROM_MEMORY,
        "Reads that began in the newest batches kept in memory (the tail cache), without reading the file."
    );
    describe_counter!(READS_FROM_FILE, "Reads that read batches from a segment file.");
}
