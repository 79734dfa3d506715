//! Segments that lose records outside onehop: a segment cut short where a batch ends, or a
//! segment file deleted. Each file on its own looks whole, so only the partition's manifest (and,
//! when it is not compacted, the offsets of the files next to each other) shows the loss. Opening
//! refuses, naming the files and offsets and changing nothing; told to accept the loss, it opens
//! with every other record at its offset and never gives a lost offset out again.

mod common;

use std::fs::{self, OpenOptions};
use std::path::Path;

use common::{batches_in, copy_dir, read_all, segment_bases, segment_path, small_config, stored};
use onehop_log::{
    MissingRecords, NewRecord, OpenError, Partition, PartitionConfig, PartitionOptions, Record, RecoveryPolicy,
};

fn record(i: u64) -> NewRecord {
    NewRecord {
        timestamp_ms: Some(1_000 + i as i64),
        // The first 100 records' keys are all written again later (compaction empties their
        // segments); after that, every other key is written once (compaction keeps it).
        key: Some(if i >= 100 && i.is_multiple_of(2) { format!("once-{i}") } else { format!("key-{}", i % 11) }.into()),
        value: Some(format!("value {i} {}", "x".repeat((i as usize * 7) % 60)).into()),
        ..Default::default()
    }
}

/// Writes 160 batches of 1 to 3 records to a partition that rolls every few kilobytes, and
/// closes it; returns the records as stored and the segments' base offsets.
fn write(dir: &Path, config: PartitionConfig) -> (Vec<Record>, Vec<u64>) {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let (partition, _) = Partition::open(dir, config).unwrap();
    let mut records = Vec::new();
    for batch in 0..160 {
        let new: Vec<NewRecord> = (0..1 + batch % 3).map(|i| record((records.len() + i) as u64)).collect();
        runtime.block_on(partition.append(&new)).unwrap();
        records.extend(new);
    }
    partition.close();
    let records = records.iter().enumerate().map(|(i, new)| stored(i as u64, new)).collect();
    let bases = segment_bases(dir);
    assert!(bases.len() >= 5, "the test needs several segments, got {bases:?}");
    (records, bases)
}

fn accepting() -> PartitionOptions {
    PartitionOptions {
        recovery: RecoveryPolicy {
            discard_damaged: true,
            remedy: "start with --accept-it".into(),
            ..Default::default()
        },
        ..PartitionOptions::default()
    }
}

/// Every file of the partition with its length and a checksum of its bytes, to show a refused
/// open changed nothing.
fn files(dir: &Path) -> Vec<(String, usize, u32)> {
    let mut files: Vec<(String, usize, u32)> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap())
        .map(|entry| {
            let bytes = fs::read(entry.path()).unwrap();
            (entry.file_name().to_string_lossy().into_owned(), bytes.len(), crc32c::crc32c(&bytes))
        })
        .collect();
    files.sort();
    files
}

/// Opens `dir` expecting a refusal for exactly `expected` (from, to) ranges, and checks that
/// nothing changed; returns the error's message.
fn refused(dir: &Path, expected: &[(u64, Option<u64>)]) -> String {
    let before = files(dir);
    let options = PartitionOptions {
        recovery: RecoveryPolicy { remedy: "start with --accept-it".into(), ..Default::default() },
        ..PartitionOptions::default()
    };
    let error = Partition::open_existing_with_options(dir, &options).err().expect("the open must be refused");
    let message = error.to_string();
    match error {
        OpenError::Missing(missing) => {
            let ranges: Vec<(u64, Option<u64>)> = missing.missing.iter().map(|gap| (gap.from, gap.to)).collect();
            assert_eq!(ranges, expected, "{message}");
            assert_eq!(missing.path, dir);
        }
        other => panic!("expected missing records, got {other}"),
    }
    assert!(message.contains("--accept-it"), "the refusal says what to do: {message}");
    assert_eq!(files(dir), before, "a refused open changes nothing");
    message
}

/// Opens `dir` accepting the loss of `lost` offsets: every other record reads back at its
/// offset, the next append takes the offset after the highest one ever given, and the next open
/// (without the flag) is not refused again.
fn accepted(dir: &Path, records: &[Record], lost: impl Fn(u64) -> bool, next_offset: u64) {
    let (partition, report) = Partition::open_existing_with_options(dir, &accepting()).unwrap();
    assert!(!report.missing.is_empty(), "{report:?}");
    let kept: Vec<Record> = records.iter().filter(|record| !lost(record.offset)).cloned().collect();
    assert_eq!(read_all(&partition), kept);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let ack = runtime.block_on(partition.append(&[record(9_999)])).unwrap();
    assert_eq!(ack.base_offset, next_offset, "a lost offset is never given out again");
    partition.close();
    let (partition, report) = Partition::open_existing(dir).unwrap();
    assert_eq!(report.missing, Vec::<MissingRecords>::new(), "the accepted loss is part of the partition now");
    assert_eq!(read_all(&partition).len(), kept.len() + 1);
}

#[test]
fn a_middle_segment_cut_short_at_a_batch_boundary_is_refused_then_accepted_when_told() {
    let source = tempfile::tempdir().unwrap();
    let (records, bases) = write(source.path(), small_config());
    let victim = segment_path(source.path(), bases[2]);
    let batches = batches_in(&victim);
    let (cut_at, first_lost) = batches[batches.len() / 2];

    // With the manifest, and again without it (a partition from before manifests): the offsets
    // of the segments next to each other show the loss too.
    for with_manifest in [true, false] {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("p");
        copy_dir(source.path(), &dir);
        if !with_manifest {
            fs::remove_file(dir.join("segments.manifest")).unwrap();
        }
        OpenOptions::new().write(true).open(segment_path(&dir, bases[2])).unwrap().set_len(cut_at).unwrap();
        let message = refused(&dir, &[(first_lost.base_offset, Some(bases[3]))]);
        assert!(message.contains(&format!("{:020}.log", bases[2])), "the refusal names the file: {message}");
        accepted(&dir, &records, |offset| (first_lost.base_offset..bases[3]).contains(&offset), records.len() as u64);
    }
}

#[test]
fn a_deleted_segment_first_middle_or_newest_is_refused_then_accepted_when_told() {
    let source = tempfile::tempdir().unwrap();
    let (records, bases) = write(source.path(), small_config());
    let end = records.len() as u64;
    let last = bases.len() - 1;
    let cases: [(usize, (u64, Option<u64>), u64); 3] = [
        (0, (bases[0], Some(bases[1])), end),
        (2, (bases[2], Some(bases[3])), end),
        // The newest segment: how far it went is unknown; the next offset starts past its base.
        (last, (bases[last], None), bases[last]),
    ];
    for (victim, range, next_offset) in cases {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("p");
        copy_dir(source.path(), &dir);
        for suffix in ["log", "index", "timeindex"] {
            let _ = fs::remove_file(dir.join(format!("{:020}.{suffix}", bases[victim])));
        }
        let message = refused(&dir, &[range]);
        assert!(message.contains(&format!("{:020}.log", bases[victim])), "{message}");
        let lost = |offset: u64| offset >= range.0 && range.1.is_none_or(|to| offset < to);
        accepted(&dir, &records, lost, next_offset);
    }
}

#[test]
fn a_compacted_partition_keeps_its_compaction_gaps_and_refuses_a_loss_below_them() {
    let source = tempfile::tempdir().unwrap();
    let (_, bases) = write(source.path(), PartitionConfig { compacted: true, ..small_config() });
    // Compaction empties whole segments (every key is written again later) and rewrites others.
    let (partition, _) = Partition::open_existing(source.path()).unwrap();
    let report = partition.compact(i64::MAX).unwrap();
    assert!(report.records_removed > 0, "{report:?}");
    let survivors = read_all(&partition);
    partition.close();
    drop(partition);
    let compacted = segment_bases(source.path());
    assert!(compacted.len() < bases.len(), "compaction removed segments: {bases:?} then {compacted:?}");
    let (partition, report) = Partition::open_existing(source.path()).unwrap();
    assert!(report.missing.is_empty(), "{report:?}");
    assert_eq!(read_all(&partition), survivors);
    partition.close();
    drop(partition);

    // A rewritten segment (compaction writes one batch) cut to nothing: below where compaction
    // left its records.
    let records_end = |base: u64| batches_in(&segment_path(source.path(), base)).last().unwrap().1.next_offset();
    let (victim, records_end) = compacted
        .windows(2)
        .map(|pair| (pair[0], records_end(pair[0]), pair[1]))
        .find(|(_, end, next)| end < next)
        .map(|(victim, end, _)| (victim, end))
        .expect("compaction left a gap at the end of a segment");
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("cut");
    copy_dir(source.path(), &dir);
    OpenOptions::new().write(true).open(segment_path(&dir, victim)).unwrap().set_len(0).unwrap();
    refused(&dir, &[(victim, Some(records_end))]);

    // A segment of a compacted partition deleted.
    let dir = scratch.path().join("deleted");
    copy_dir(source.path(), &dir);
    fs::remove_file(segment_path(&dir, compacted[1])).unwrap();
    refused(&dir, &[(compacted[1], Some(compacted[2]))]);
}

#[test]
fn segments_retention_had_dropped_when_it_stopped_are_deleted_and_a_damaged_manifest_is_rebuilt() {
    let source = tempfile::tempdir().unwrap();
    let (records, bases) = write(source.path(), PartitionConfig { retention_bytes: Some(6_000), ..small_config() });
    let first = fs::read(segment_path(source.path(), bases[0])).unwrap();
    let (partition, _) = Partition::open_existing(source.path()).unwrap();
    let report = partition.enforce_retention(i64::MAX).unwrap();
    assert!(report.segments_deleted >= 1, "{report:?}");
    let start = partition.start_offset();
    partition.close();
    drop(partition);
    // Retention wrote the manifest and stopped before it deleted the file.
    fs::write(segment_path(source.path(), bases[0]), &first).unwrap();
    let (partition, report) = Partition::open_existing(source.path()).unwrap();
    assert!(report.missing.is_empty(), "{report:?}");
    assert!(!segment_path(source.path(), bases[0]).exists(), "the leftover is deleted");
    assert_eq!(partition.start_offset(), start);
    assert_eq!(read_all(&partition), records[start as usize..]);
    partition.close();
    drop(partition);

    // A manifest that does not read is rebuilt from the files (which are whole).
    let manifest = source.path().join("segments.manifest");
    let mut bytes = fs::read(&manifest).unwrap();
    bytes[60] ^= 0x01;
    fs::write(&manifest, &bytes).unwrap();
    let (partition, report) = Partition::open_existing(source.path()).unwrap();
    assert!(report.missing.is_empty(), "{report:?}");
    assert_eq!(read_all(&partition), records[start as usize..]);
    partition.close();
    assert_ne!(fs::read(&manifest).unwrap(), bytes, "the manifest was written again");
}
