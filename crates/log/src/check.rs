//! A full, read-only check of a log directory: every batch of every segment (header, CRC,
//! records), every index file against the segment it describes, and every segment boundary
//! against the partition's manifest — what opening trusts an intact index for, read anyway.
//!
//! Nothing is written, so it can run beside a server (whose newest batches may then be in the
//! middle of being written: the end of an active segment is never called damage) or on a copy.
//! `onehop check` prints its report; damage gives a failing exit status.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::config::PartitionConfig;
use crate::file::SegmentFile;
use crate::manifest::{self, Found, Manifest, MissingRecords, Unusable};
use crate::partition::CONFIG_FILE;
use crate::recovery::{Damage, assess};
use crate::segment::{LOG_SUFFIX, ScanStop, SegmentMeta, load_index, scan, segment_file};
use crate::store::partition_dirs;

/// What the check of one partition found.
#[derive(Clone, Debug, Default)]
pub struct PartitionCheck {
    pub topic: String,
    pub partition: u32,
    pub dir: PathBuf,
    pub segments: usize,
    pub batches: u64,
    pub bytes: u64,
    /// Bytes that are not batches, records missing, an index that disagrees with its segment:
    /// each would make an open refuse or a read fail.
    pub damage: Vec<String>,
    /// Things recovery deals with on its own (a torn last write, a stale index, a manifest to
    /// rebuild), said so an operator knows what the next open will do.
    pub notes: Vec<String>,
}

/// What the check of a whole log directory found.
#[derive(Clone, Debug, Default)]
pub struct LogCheck {
    pub partitions: Vec<PartitionCheck>,
}

impl LogCheck {
    pub fn damaged(&self) -> usize {
        self.partitions.iter().filter(|partition| !partition.damage.is_empty()).count()
    }
}

/// Checks every partition under the log directory `dir`, calling `progress` after each with
/// how many are done and how many there are.
pub fn check_log(dir: &Path, mut progress: impl FnMut(&PartitionCheck, usize, usize)) -> std::io::Result<LogCheck> {
    let dirs = partition_dirs(dir)?;
    let mut report = LogCheck::default();
    for (done, (topic, partition, path)) in dirs.iter().enumerate() {
        let checked = check_partition(topic, *partition, path);
        progress(&checked, done + 1, dirs.len());
        report.partitions.push(checked);
    }
    Ok(report)
}

/// Checks one partition directory without changing anything in it.
pub fn check_partition(topic: &str, partition: u32, dir: &Path) -> PartitionCheck {
    let mut check =
        PartitionCheck { topic: topic.to_string(), partition, dir: dir.to_path_buf(), ..PartitionCheck::default() };
    let config_path = dir.join(CONFIG_FILE);
    let config = match fs::read_to_string(&config_path)
        .map_err(|error| error.to_string())
        .and_then(|text| PartitionConfig::from_text(&text, &config_path).map_err(|error| error.to_string()))
    {
        Ok(config) => config,
        Err(reason) => {
            check.damage.push(format!("{}: {reason}", config_path.display()));
            return check;
        }
    };
    let mut bases = match segment_bases(dir) {
        Ok(bases) => bases,
        Err(error) => {
            check.damage.push(format!("{}: {error}", dir.display()));
            return check;
        }
    };
    let manifest = match Manifest::read(dir) {
        Ok(manifest) => Some(manifest),
        Err(Unusable::Missing) => {
            check.notes.push("no segment manifest: the next open writes one".into());
            None
        }
        Err(Unusable::Damaged(reason)) => {
            check.notes.push(format!("the segment manifest is unusable ({reason}): the next open rebuilds it"));
            None
        }
    };
    let mut closed_listed = Vec::new();
    if let Some(manifest) = &manifest {
        let plan = manifest::plan(manifest, &bases, config.compacted);
        for base in &plan.leftovers {
            check.notes.push(format!(
                "{base:020}.log was already removed by retention or compaction: the next open deletes it"
            ));
        }
        bases.retain(|base| !plan.leftovers.contains(base));
        closed_listed = plan.closed;
    }
    let mut found = Vec::new();
    for (at, &base) in bases.iter().enumerate() {
        let is_tail = at + 1 == bases.len() && !closed_listed.contains(&base);
        match check_segment(dir, base, is_tail, config.index_interval_bytes, &mut check) {
            Ok(records_end) => found.push(Found { base_offset: base, records_end }),
            Err(error) => check.damage.push(format!("{}: {error}", segment_file(dir, base, LOG_SUFFIX).display())),
        }
    }
    check.segments = found.len();
    for pair in found.windows(2) {
        if pair[0].records_end > pair[1].base_offset {
            check.damage.push(format!(
                "{:020}.log ends at offset {}, past the start of the next segment ({})",
                pair[0].base_offset, pair[0].records_end, pair[1].base_offset
            ));
        }
    }
    for missing in manifest::check(manifest.as_ref(), &found, config.compacted) {
        check.damage.push(describe_missing(&missing));
    }
    check
}

fn describe_missing(missing: &MissingRecords) -> String {
    match missing.to {
        Some(to) => format!("missing records at offsets {} up to {to}: {}", missing.from, missing.cause),
        None => format!("missing records from offset {} on: {}", missing.from, missing.cause),
    }
}

pub(crate) fn segment_bases(dir: &Path) -> std::io::Result<Vec<u64>> {
    let mut bases = Vec::new();
    for entry in fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(&format!(".{LOG_SUFFIX}"))
            && stem.len() == 20
            && let Ok(base) = stem.parse::<u64>()
        {
            bases.push(base);
        }
    }
    bases.sort_unstable();
    Ok(bases)
}

/// Reads every batch of one segment, notes what is wrong in `check`, and returns where its
/// records end.
fn check_segment(
    dir: &Path,
    base_offset: u64,
    is_tail: bool,
    index_interval_bytes: u64,
    check: &mut PartitionCheck,
) -> std::io::Result<u64> {
    let path = segment_file(dir, base_offset, LOG_SUFFIX);
    let file = fs::File::open(&path)?;
    let file_bytes = SegmentFile::size(&file)?;
    let name = format!("{base_offset:020}.log");
    let mut meta = SegmentMeta::empty(base_offset);
    let mut position = 0;
    let mut clean = true;
    let mut starts = HashMap::new();
    loop {
        let scanned = scan(&file, position, file_bytes, meta.next_offset, |at, header, _| {
            starts.insert(at, header.base_offset);
            meta.note_batch(base_offset, at, header, index_interval_bytes);
            check.batches += 1;
            check.bytes += header.batch_len as u64;
            position = at + header.batch_len as u64;
        });
        let (bad_at, reason) = match scanned {
            Ok(()) => break,
            Err(ScanStop::Io(error)) => return Err(error),
            Err(ScanStop::Newer { position, reason }) => {
                check.damage.push(format!(
                    "{name}: byte {position} holds a batch a newer onehop wrote ({reason}); this release cannot \
                     check past it"
                ));
                clean = false;
                break;
            }
            Err(ScanStop::Bad { position, reason }) => (position, reason),
        };
        match assess(&file, bad_at, file_bytes, meta.next_offset)? {
            Damage::Zeros if is_tail => break,
            Damage::Zeros => {
                check.damage.push(format!("{name}: zeros from byte {bad_at} in a closed segment"));
                clean = false;
                break;
            }
            Damage::Tail { damaged_end } if is_tail => {
                check.notes.push(format!(
                    "{name}: ends in {} bytes that are not a whole batch, from byte {bad_at} ({reason}): a write \
                     in progress, or torn by a crash; the next open cuts it",
                    damaged_end - bad_at
                ));
                break;
            }
            Damage::Tail { damaged_end } => {
                check.damage.push(format!(
                    "{name}: bytes {bad_at} to {damaged_end} are not a valid batch ({reason}), in a closed segment \
                     (records from offset {} on)",
                    meta.next_offset
                ));
                clean = false;
                break;
            }
            Damage::Middle { resume_at, resume_offset, .. } => {
                check.damage.push(format!(
                    "{name}: bytes {bad_at} to {resume_at} are not a valid batch ({reason}), and valid batches \
                     follow (offsets {} up to {resume_offset} are unreadable)",
                    meta.next_offset
                ));
                clean = false;
                // Go on from the next valid batch, so every damaged range is reported.
                meta.next_offset = resume_offset;
                position = resume_at;
            }
        }
    }
    let scanned = Scanned { meta, starts, clean };
    check_index(dir, base_offset, file_bytes, &scanned, check);
    Ok(scanned.meta.next_offset)
}

/// What reading a segment found.
struct Scanned {
    /// What its index should say.
    meta: SegmentMeta,
    /// Where each batch starts, and the offset its records start at.
    starts: HashMap<u64, u64>,
    /// No damage.
    clean: bool,
}

/// Compares the segment's index files, when they are current (they describe exactly this many
/// bytes, so opening would trust them), with what reading the segment found.
fn check_index(dir: &Path, base_offset: u64, file_bytes: u64, scanned: &Scanned, check: &mut PartitionCheck) {
    let name = format!("{base_offset:020}.log");
    let index_path = segment_file(dir, base_offset, crate::segment::INDEX_SUFFIX);
    if !index_path.exists() {
        return;
    }
    let Some(index) = load_index(dir, base_offset, file_bytes) else {
        check
            .notes
            .push(format!("{name}: its index does not describe it (stale or damaged): the next open rebuilds it"));
        return;
    };
    if !scanned.clean {
        check.damage.push(format!(
            "{name}: its index is intact, so opening will not read the segment and the damage above stays until \
             a start with --discard-damaged (--recover-catalog for the catalog) reads it"
        ));
    }
    // An entry must point at the start of a batch holding its offset.
    let batch_at = |entry: &crate::segment::IndexEntry| {
        scanned.starts.get(&(entry.position as u64)) == Some(&(base_offset + entry.relative_offset as u64))
    };
    if index.next_offset != scanned.meta.next_offset || !index.entries.iter().all(batch_at) {
        check.damage.push(format!(
            "{name}: its index disagrees with it (the index says its records end at offset {}, the segment at {}): \
             reads would go wrong; delete {base_offset:020}.index and .timeindex to have them rebuilt",
            index.next_offset, scanned.meta.next_offset
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_range_reads_as_a_sentence() {
        let gap = MissingRecords { from: 10, to: Some(20), cause: "segment x is gone".into() };
        assert_eq!(describe_missing(&gap), "missing records at offsets 10 up to 20: segment x is gone");
    }
}
