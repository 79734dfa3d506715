//! Per-partition settings, validated on open and persisted beside the segments
//! (`partition.conf`). `Partition::open` stores the settings it is given (so they can change,
//! e.g. retention); `Partition::open_existing` and `Log::open` reopen with the stored ones.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::error::OpenError;

/// When an append is acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Durability {
    /// After `write(2)`: the record survives a crash of the process (it is in the page cache) but
    /// not a power loss until the background fsync, which runs every `async_fsync_interval_ms`.
    Async,
    /// After `fdatasync(2)` of the batch that holds it: survives power loss.
    #[default]
    Fsync,
}

impl FromStr for Durability {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "async" => Ok(Durability::Async),
            "fsync" => Ok(Durability::Fsync),
            other => Err(format!("unknown durability {other:?}: expected \"fsync\" or \"async\"")),
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Durability::Async => "async",
            Durability::Fsync => "fsync",
        })
    }
}

/// Settings of one partition. The defaults suit a general-purpose stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionConfig {
    /// A segment is closed and a new one started once it holds this many bytes.
    pub segment_bytes_max: u64,
    /// One offset-index and time-index entry per this many bytes of batches.
    pub index_interval_bytes: u64,
    /// Durability of appends that do not ask for one.
    pub durability: Durability,
    /// How often unsynced `async` appends are fsynced in the background.
    pub async_fsync_interval_ms: u64,
    /// Largest single record, encoded.
    pub record_bytes_max: usize,
    /// Largest single append (all its records, encoded).
    pub batch_bytes_max: usize,
    /// Appends waiting for the writer are capped at this many bytes; further appenders wait,
    /// so a burst cannot grow memory without bound.
    pub queue_bytes_max: usize,
    /// Closed segments whose newest record is older than this are deleted. `None` keeps them.
    pub retention_ms: Option<u64>,
    /// Oldest closed segments are deleted while the partition holds more than this. `None`: no cap.
    pub retention_bytes: Option<u64>,
    /// Keep only the newest record per key in closed segments (tables are compacted streams).
    pub compacted: bool,
    /// On a compacted partition, a tombstone older than this is dropped once it is the newest
    /// record of its key.
    pub tombstone_retention_ms: u64,
}

impl Default for PartitionConfig {
    fn default() -> Self {
        PartitionConfig {
            segment_bytes_max: 64 * 1024 * 1024,
            index_interval_bytes: 4096,
            durability: Durability::Fsync,
            async_fsync_interval_ms: 100,
            record_bytes_max: 1024 * 1024,
            batch_bytes_max: 16 * 1024 * 1024,
            queue_bytes_max: 64 * 1024 * 1024,
            retention_ms: None,
            retention_bytes: None,
            compacted: false,
            tombstone_retention_ms: 24 * 60 * 60 * 1000,
        }
    }
}

impl PartitionConfig {
    /// Checks that the settings can work together.
    pub fn validate(&self) -> Result<(), String> {
        if self.segment_bytes_max < 4096 {
            return Err("segment_bytes_max must be at least 4096".into());
        }
        if self.segment_bytes_max > u32::MAX as u64 {
            return Err("segment_bytes_max must fit in 32 bits (index positions are u32)".into());
        }
        if self.index_interval_bytes == 0 {
            return Err("index_interval_bytes must be positive".into());
        }
        if self.async_fsync_interval_ms == 0 {
            return Err("async_fsync_interval_ms must be positive".into());
        }
        if self.record_bytes_max == 0 || self.record_bytes_max > self.batch_bytes_max {
            return Err("record_bytes_max must be positive and at most batch_bytes_max".into());
        }
        if self.batch_bytes_max as u64 > self.segment_bytes_max {
            return Err("batch_bytes_max must be at most segment_bytes_max".into());
        }
        if self.queue_bytes_max < self.batch_bytes_max {
            return Err("queue_bytes_max must be at least batch_bytes_max".into());
        }
        Ok(())
    }

    /// The `key = value` text stored in `partition.conf`.
    pub fn to_text(&self) -> String {
        let optional = |value: Option<u64>| value.map_or_else(|| "none".to_string(), |v| v.to_string());
        format!(
            "# onehop partition settings; written at creation, read on open\n\
             segment_bytes_max = {}\nindex_interval_bytes = {}\ndurability = {}\n\
             async_fsync_interval_ms = {}\nrecord_bytes_max = {}\nbatch_bytes_max = {}\n\
             queue_bytes_max = {}\nretention_ms = {}\nretention_bytes = {}\ncompacted = {}\n\
             tombstone_retention_ms = {}\n",
            self.segment_bytes_max,
            self.index_interval_bytes,
            self.durability,
            self.async_fsync_interval_ms,
            self.record_bytes_max,
            self.batch_bytes_max,
            self.queue_bytes_max,
            optional(self.retention_ms),
            optional(self.retention_bytes),
            self.compacted,
            self.tombstone_retention_ms,
        )
    }

    /// Parses `partition.conf`; unknown keys are an error so a typo is never silently ignored.
    pub fn from_text(text: &str, path: &Path) -> Result<Self, OpenError> {
        let bad = |reason: String| OpenError::BadConfig { path: path.to_path_buf(), reason };
        let mut config = PartitionConfig::default();
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, value) =
                line.split_once('=').ok_or_else(|| bad(format!("line {}: expected key = value", number + 1)))?;
            let (key, value) = (key.trim(), value.trim());
            let number_of = |value: &str| {
                value.parse::<u64>().map_err(|_| bad(format!("line {}: {key} must be a number", number + 1)))
            };
            let optional_of = |value: &str| if value == "none" { Ok(None) } else { number_of(value).map(Some) };
            match key {
                "segment_bytes_max" => config.segment_bytes_max = number_of(value)?,
                "index_interval_bytes" => config.index_interval_bytes = number_of(value)?,
                "durability" => config.durability = value.parse().map_err(bad)?,
                "async_fsync_interval_ms" => config.async_fsync_interval_ms = number_of(value)?,
                "record_bytes_max" => config.record_bytes_max = number_of(value)? as usize,
                "batch_bytes_max" => config.batch_bytes_max = number_of(value)? as usize,
                "queue_bytes_max" => config.queue_bytes_max = number_of(value)? as usize,
                "retention_ms" => config.retention_ms = optional_of(value)?,
                "retention_bytes" => config.retention_bytes = optional_of(value)?,
                "compacted" => {
                    config.compacted = value
                        .parse()
                        .map_err(|_| bad(format!("line {}: compacted must be true or false", number + 1)))?
                }
                "tombstone_retention_ms" => config.tombstone_retention_ms = number_of(value)?,
                other => return Err(bad(format!("line {}: unknown setting {other:?}", number + 1))),
            }
        }
        config.validate().map_err(bad)?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip() {
        let config = PartitionConfig {
            durability: Durability::Async,
            retention_ms: Some(1000),
            compacted: true,
            ..Default::default()
        };
        let parsed = PartitionConfig::from_text(&config.to_text(), Path::new("x")).unwrap();
        assert_eq!(parsed, config);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let path = Path::new("partition.conf");
        let error = PartitionConfig::from_text("segment_bytes = 10\n", path).unwrap_err();
        assert!(error.to_string().contains("unknown setting \"segment_bytes\""), "{error}");
        let error = PartitionConfig::from_text("durability = sometimes\n", path).unwrap_err();
        assert!(error.to_string().contains("expected \"fsync\" or \"async\""), "{error}");
        let error = PartitionConfig::from_text("segment_bytes_max = 12\n", path).unwrap_err();
        assert!(error.to_string().contains("at least 4096"), "{error}");
    }
}
