//! Damaged files on disk: torn and corrupt tails are cut back to the last good batch; damage
//! that valid batches follow, or in a segment that is not the last, is refused, never silently
//! cut, and set aside (with a copy kept) only when asked; leftovers of interrupted writes are
//! cleaned up.

mod common;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use common::{
    batches_and_data_end, batches_in, copy_dir, filler, nonzero_end, read_all, remove_segment_index, segment_bases,
    segment_path, small_config,
};
use onehop_log::{
    NewRecord, OpenError, Partition, PartitionConfig, PartitionOptions, ReadError, Record, RecoveryPolicy,
};

/// A record whose bytes depend on `i`.
fn record(i: u64) -> NewRecord {
    NewRecord {
        timestamp_ms: Some(1_000 + i as i64),
        key: i.is_multiple_of(2).then(|| format!("key-{i}").into()),
        subject: i.is_multiple_of(3).then(|| format!("orders/{i}").into()),
        headers: vec![("n".into(), Some(i.to_string().into()))],
        value: (i % 7 != 6).then(|| filler(i, 20 + (i as usize * 13) % 90)),
    }
}

fn as_stored(records: &[NewRecord]) -> Vec<Record> {
    records.iter().enumerate().map(|(i, new)| common::stored(i as u64, new)).collect()
}

/// Writes batches of 1 to 3 records (`batches` of them) and closes the partition; returns the
/// records in offset order.
fn write_partition(dir: &Path, config: PartitionConfig, batches: usize) -> Vec<NewRecord> {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let (partition, _) = Partition::open(dir, config).unwrap();
    let mut records = Vec::new();
    for batch in 0..batches {
        let count = 1 + batch % 3;
        let new: Vec<NewRecord> = (0..count).map(|i| record((records.len() + i) as u64)).collect();
        let ack = runtime.block_on(partition.append(&new)).unwrap();
        assert_eq!(ack.base_offset, records.len() as u64);
        records.extend(new);
    }
    partition.close();
    records
}

/// A partition of `batches` batches written and closed in a directory of its own: the
/// directory, the records as stored, and the partition's first segment.
fn written(batches: usize) -> (tempfile::TempDir, Vec<Record>, PathBuf) {
    let source = tempfile::tempdir().unwrap();
    let records = as_stored(&write_partition(source.path(), PartitionConfig::default(), batches));
    let segment = segment_path(source.path(), 0);
    (source, records, segment)
}

/// A copy of the partition in `source`, made as `name` under `scratch`, for a test to damage.
fn copied(source: &tempfile::TempDir, scratch: &tempfile::TempDir, name: &str) -> PathBuf {
    let dir = scratch.path().join(name);
    copy_dir(source.path(), &dir);
    dir
}

/// Adds `bytes` at the end of the file at `path`.
fn append_to(path: &Path, bytes: &[u8]) {
    let mut file = OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(bytes).unwrap();
}

/// Opens a damaged copy and checks that recovery cut exactly `[cut_at, ..)` of the last
/// segment, that everything before it reads back identical, and that the log goes on from there.
///
/// The report counts the damaged bytes: from `cut_at` to the last non-zero byte. Zeros after
/// the data are space the active segment keeps ahead of it, not damage.
fn assert_cut_at(dir: &Path, segment: &Path, cut_at: u64, expected: &[Record], append_after: bool) {
    let damaged = fs::read(segment).unwrap();
    let cut_bytes = (nonzero_end(&damaged, cut_at as usize) - cut_at as usize) as u64;
    let (partition, report) = Partition::open_existing(dir).unwrap();
    assert_eq!(report.truncated_bytes, cut_bytes, "{report:?}");
    if cut_bytes > 0 {
        assert_eq!(report.truncated_at.as_ref().map(|(position, _)| *position), Some(cut_at), "{report:?}");
    } else {
        assert_eq!(report.truncated_at, None);
    }
    // The data ends where the bad batch started (zeros may follow: the active segment keeps
    // space ahead of its data), and recovery left the good bytes before it alone.
    assert_eq!(batches_and_data_end(segment).1, cut_at, "the file is cut at the start of the bad batch");
    assert_eq!(fs::read(segment).unwrap()[..cut_at as usize], damaged[..cut_at as usize]);
    assert_eq!(partition.end_offset(), expected.len() as u64);
    assert_eq!(read_all(&partition), expected);
    if append_after {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let new = record(10_000);
        let ack = runtime.block_on(partition.append(std::slice::from_ref(&new))).unwrap();
        assert_eq!(ack.base_offset, expected.len() as u64, "offsets of the cut batch are given out again");
        partition.close();
        drop(partition);
        let (partition, report) = Partition::open_existing(dir).unwrap();
        assert_eq!(report.truncated_bytes, 0, "the cut was durable and the new batch is whole");
        let mut want = expected.to_vec();
        want.push(common::stored(expected.len() as u64, &new));
        assert_eq!(read_all(&partition), want);
    }
}

#[test]
fn torn_last_batch_is_cut_at_every_byte() {
    let (source, records, segment) = written(8);
    let bases = segment_bases(source.path());
    assert_eq!(bases, vec![0]);
    let batches = batches_in(&segment);
    let (last_at, last) = *batches.last().unwrap();
    assert!(last.record_count > 1);
    let file_bytes = fs::metadata(&segment).unwrap().len();
    assert_eq!(last_at + last.batch_len as u64, file_bytes);
    let kept = &records[..last.base_offset as usize];
    let original = fs::read(&segment).unwrap();

    let scratch = tempfile::tempdir().unwrap();
    for cut in last_at..file_bytes {
        let dir = copied(&source, &scratch, &format!("cut-{cut}"));
        let damaged = segment_path(&dir, 0);
        OpenOptions::new().write(true).open(&damaged).unwrap().set_len(cut).unwrap();
        // Checking that the log goes on after the cut costs fsyncs: do it for some cuts only.
        let append_after = cut == last_at || cut == file_bytes - 1 || cut.is_multiple_of(29);
        // Every cut keeps the first byte of the batch's magic, so there is always damage to report.
        assert!(cut == last_at || nonzero_end(&original[..cut as usize], last_at as usize) > last_at as usize);
        assert_cut_at(&dir, &damaged, last_at, kept, append_after);
        fs::remove_dir_all(&dir).unwrap();
    }

    // The undamaged copy loses nothing.
    let (partition, report) = Partition::open_existing(source.path()).unwrap();
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(read_all(&partition), records);
}

#[test]
fn corrupt_last_batch_is_cut_whichever_byte_flips() {
    let (source, records, segment) = written(8);
    let (last_at, last) = *batches_in(&segment).last().unwrap();
    let file_bytes = fs::metadata(&segment).unwrap().len();
    let kept = &records[..last.base_offset as usize];
    let original = fs::read(&segment).unwrap();

    let scratch = tempfile::tempdir().unwrap();
    for at in last_at..file_bytes {
        let dir = copied(&source, &scratch, &format!("flip-{at}"));
        let mut bytes = original.clone();
        bytes[at as usize] ^= 0xFF;
        let damaged = segment_path(&dir, 0);
        fs::write(&damaged, &bytes).unwrap();
        // A crash leaves no index for the last segment (it is written on clean close only),
        // so recovery has to look at every batch.
        remove_segment_index(&dir, 0);
        let append_after = at == last_at || at.is_multiple_of(31);
        assert_cut_at(&dir, &damaged, last_at, kept, append_after);
        fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn damage_inside_the_last_segment_that_valid_batches_follow_is_refused_not_cut() {
    let (source, records, segment) = written(12);
    let batches = batches_in(&segment);
    let file_bytes = fs::metadata(&segment).unwrap().len();
    let (bad_at, bad) = batches[5];
    let (next_at, next) = batches[6];
    let scratch = tempfile::tempdir().unwrap();

    // A flipped payload byte in the sixth of twelve batches, with no index (as after a crash):
    // the six batches after it are whole and checksummed, so this is damage, not a torn write.
    // Cutting there would lose them and hand their offsets out again: opening refuses.
    let dir = copied(&source, &scratch, "middle");
    let mut bytes = fs::read(&segment).unwrap();
    bytes[bad_at as usize + 60] ^= 0x01;
    fs::write(segment_path(&dir, 0), &bytes).unwrap();
    remove_segment_index(&dir, 0);
    match Partition::open_existing(&dir).err().expect("damage before valid batches is refused") {
        OpenError::Damaged(damage) => {
            assert_eq!(damage.path, segment_path(&dir, 0));
            assert_eq!((damage.position, damage.resume_at), (bad_at, next_at));
            assert_eq!((damage.first_offset, damage.resume_offset), (bad.base_offset, next.base_offset));
        }
        other => panic!("expected Damaged, got {other}"),
    }
    assert_eq!(fs::read(segment_path(&dir, 0)).unwrap(), bytes, "a refused open changes nothing");
    // Told to, it sets the damaged batch aside and keeps every other record at its offset.
    let options = PartitionOptions {
        recovery: RecoveryPolicy { discard_damaged: true, ..RecoveryPolicy::default() },
        ..PartitionOptions::default()
    };
    let (partition, report) = Partition::open_existing_with_options(&dir, &options).unwrap();
    assert_eq!(report.discarded.len(), 1, "{report:?}");
    assert_eq!(fs::read(&report.discarded[0].copy).unwrap(), bytes, "the damaged file is kept");
    let survivors: Vec<Record> = records
        .iter()
        .filter(|record| record.offset < bad.base_offset || record.offset >= next.base_offset)
        .cloned()
        .collect();
    assert_eq!(read_all(&partition), survivors);
    assert_eq!(partition.end_offset(), records.len() as u64, "no offset is given out again");
    drop(partition);

    // Zeros after the last batch (space kept ahead of the data, or a file that grew but whose
    // data never reached the disk) are cut without counting as damage.
    let dir = copied(&source, &scratch, "zeros");
    append_to(&segment_path(&dir, 0), &[0; 4096]);
    assert_cut_at(&dir, &segment_path(&dir, 0), file_bytes, &records, true);

    // A lone partial header.
    let dir = copied(&source, &scratch, "partial-header");
    append_to(&segment_path(&dir, 0), &bytes[..20]);
    assert_cut_at(&dir, &segment_path(&dir, 0), file_bytes, &records, false);

    // What a crash leaves in a segment with space kept ahead: a torn batch, then zeros.
    let dir = copied(&source, &scratch, "torn-then-zeros");
    let (last_at, last) = *batches.last().unwrap();
    let mut torn = fs::read(&segment).unwrap();
    torn.truncate(last_at as usize + last.batch_len as usize / 2);
    torn.resize(64 * 1024, 0);
    fs::write(segment_path(&dir, 0), &torn).unwrap();
    remove_segment_index(&dir, 0);
    assert_cut_at(&dir, &segment_path(&dir, 0), last_at, &records[..last.base_offset as usize], true);
}

#[test]
fn a_flipped_byte_under_a_current_index_is_never_served() {
    // After a clean close the last segment's index describes it exactly; bit rot under it is not
    // a crash, so recovery may trust the index. Whatever it does, it must not serve the bad batch.
    let (source, records, segment) = written(8);
    let (last_at, last) = *batches_in(&segment).last().unwrap();
    let file_bytes = fs::metadata(&segment).unwrap().len();
    let mut bytes = fs::read(&segment).unwrap();
    bytes[last_at as usize + 50] ^= 0x10;
    fs::write(&segment, &bytes).unwrap();

    let (partition, report) = Partition::open_existing(source.path()).unwrap();
    let base = last.base_offset;
    if report.truncated_bytes > 0 {
        assert_eq!(report.truncated_bytes, file_bytes - last_at);
        assert_eq!(read_all(&partition), records[..base as usize]);
    } else {
        assert_eq!(partition.end_offset(), records.len() as u64);
        assert_eq!(partition.read(0, base as usize, usize::MAX).unwrap(), records[..base as usize]);
        match partition.read(base, 10, usize::MAX) {
            Err(ReadError::Corrupt { position, .. }) => assert_eq!(position, last_at),
            other => panic!("a corrupt batch was served: {other:?}"),
        }
    }
}

/// Writes a partition of several segments and returns it with its records and segment bases.
fn write_segmented(dir: &Path) -> (Vec<Record>, Vec<u64>) {
    let records = as_stored(&write_partition(dir, small_config(), 80));
    let bases = segment_bases(dir);
    assert!(bases.len() >= 4, "the test needs several segments, got {bases:?}");
    (records, bases)
}

#[test]
fn damage_in_a_closed_segment_is_reported_not_cut() {
    let source = tempfile::tempdir().unwrap();
    let (records, bases) = write_segmented(source.path());
    let victim = bases[1];
    let (bad_at, bad) = batches_in(&segment_path(source.path(), victim))[2];
    let scratch = tempfile::tempdir().unwrap();
    let flipped = |dir: &Path| {
        let path = segment_path(dir, victim);
        let mut bytes = fs::read(&path).unwrap();
        bytes[bad_at as usize + 52] ^= 0x04;
        fs::write(&path, &bytes).unwrap();
        bytes
    };
    let assert_corrupt_at = |error: OpenError, dir: &Path, position: u64| match error {
        OpenError::Corrupt { path, position: at, .. } => {
            assert_eq!(path, segment_path(dir, victim));
            assert_eq!(at, position);
        }
        OpenError::Damaged(damage) => {
            assert_eq!(damage.path, segment_path(dir, victim));
            assert_eq!(damage.position, position);
        }
        other => panic!("expected Corrupt or Damaged, got {other}"),
    };

    // Without its index the segment is scanned at open: open fails and the file is untouched.
    let dir = copied(&source, &scratch, "flip-no-index");
    let bytes = flipped(&dir);
    remove_segment_index(&dir, victim);
    let error = Partition::open_existing(&dir).err().expect("open must refuse a corrupt closed segment");
    assert!(matches!(error, OpenError::Damaged(_)), "valid batches follow the damage: {error}");
    assert_corrupt_at(error, &dir, bad_at);
    assert_eq!(fs::read(segment_path(&dir, victim)).unwrap(), bytes, "a closed segment is never cut");

    // With its index in place the damage may go unnoticed at open, but it is never served.
    let dir = copied(&source, &scratch, "flip-with-index");
    let bytes = flipped(&dir);
    match Partition::open_existing(&dir) {
        Err(error) => assert_corrupt_at(error, &dir, bad_at),
        Ok((partition, report)) => {
            assert_eq!(report.truncated_bytes, 0);
            assert_eq!(partition.end_offset(), records.len() as u64);
            let before = bad.base_offset as usize;
            assert_eq!(partition.read(0, before, usize::MAX).unwrap(), records[..before]);
            match partition.read(bad.base_offset, 1, usize::MAX) {
                Err(ReadError::Corrupt { segment, position, .. }) => {
                    assert_eq!(segment, segment_path(&dir, victim).display().to_string());
                    assert_eq!(position, bad_at);
                }
                other => panic!("a corrupt batch was served: {other:?}"),
            }
            // Other segments still read.
            let later = bases[2] as usize;
            assert_eq!(partition.read(bases[2], usize::MAX, usize::MAX).unwrap(), records[later..]);
        }
    }
    assert_eq!(fs::read(segment_path(&dir, victim)).unwrap(), bytes, "a closed segment is never cut");

    // A closed segment that lost its tail no longer matches its index: open refuses it.
    let dir = copied(&source, &scratch, "torn-closed");
    let path = segment_path(&dir, victim);
    let length = fs::metadata(&path).unwrap().len();
    let (last_at, _) = *batches_in(&path).last().unwrap();
    OpenOptions::new().write(true).open(&path).unwrap().set_len(length - 10).unwrap();
    let error = Partition::open_existing(&dir).err().expect("open must refuse a torn closed segment");
    assert!(error.to_string().contains("not the last segment"), "{error}");
    assert_corrupt_at(error, &dir, last_at);
    assert_eq!(fs::metadata(&path).unwrap().len(), length - 10, "a closed segment is never cut");
    // Told to set damage aside, it drops that last batch only (a copy of the file is kept), and
    // the next segment's offsets follow a gap, never an offset given out twice.
    let options = PartitionOptions {
        recovery: RecoveryPolicy { discard_damaged: true, ..RecoveryPolicy::default() },
        ..PartitionOptions::default()
    };
    let (partition, report) = Partition::open_existing_with_options(&dir, &options).unwrap();
    assert_eq!(report.discarded.len(), 1, "{report:?}");
    assert_eq!(fs::metadata(&report.discarded[0].copy).unwrap().len(), length - 10);
    let lost = batches_in(&segment_path(source.path(), victim)).last().unwrap().1;
    let survivors: Vec<Record> = records
        .iter()
        .filter(|record| record.offset < lost.base_offset || record.offset >= lost.next_offset())
        .cloned()
        .collect();
    assert_eq!(read_all(&partition), survivors);
    assert_eq!(partition.end_offset(), records.len() as u64);
}

#[test]
fn told_to_set_damage_aside_recovery_reads_past_an_intact_index() {
    // Bit rot after a clean close: every index is intact, so an ordinary open reads no batch.
    let dir = tempfile::tempdir().unwrap();
    let (records, bases) = write_segmented(dir.path());
    let victim = bases[1];
    let (bad_at, bad) = batches_in(&segment_path(dir.path(), victim))[2];
    let path = segment_path(dir.path(), victim);
    let mut bytes = fs::read(&path).unwrap();
    bytes[bad_at as usize + 52] ^= 0x04;
    fs::write(&path, &bytes).unwrap();
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert!(report.discarded.is_empty());
    match partition.read(bad.base_offset, 1, usize::MAX) {
        Err(error @ ReadError::Corrupt { .. }) => {
            assert!(error.to_string().contains("What to do"), "the reader is told what to do: {error}");
        }
        other => panic!("a corrupt batch was served: {other:?}"),
    }
    partition.close();
    drop(partition);

    let options = PartitionOptions {
        recovery: RecoveryPolicy { discard_damaged: true, ..RecoveryPolicy::default() },
        ..PartitionOptions::default()
    };
    let (partition, report) = Partition::open_existing_with_options(dir.path(), &options).unwrap();
    assert_eq!(report.discarded.len(), 1, "{report:?}");
    assert_eq!(report.discarded[0].segment, path);
    assert_eq!(fs::read(&report.discarded[0].copy).unwrap(), bytes, "the file as it was is kept");
    let survivors: Vec<Record> = records
        .iter()
        .filter(|record| record.offset < bad.base_offset || record.offset >= bad.next_offset())
        .cloned()
        .collect();
    assert_eq!(read_all(&partition), survivors);
    assert_eq!(partition.end_offset(), records.len() as u64);
}

#[test]
fn leftovers_of_interrupted_writes_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (records, bases) = write_segmented(dir.path());
    let leftovers = [
        format!("{:020}.compacting", bases[1]),
        format!("{:020}.compacting", 999_999),
        format!("{:020}.tmp", bases[2]),
        "partition.tmp".to_string(),
    ];
    for name in &leftovers {
        fs::write(dir.path().join(name), b"half-written garbage").unwrap();
    }
    fs::write(dir.path().join("notes.txt"), b"not ours").unwrap();
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!(report.truncated_bytes, 0);
    for name in &leftovers {
        assert!(!dir.path().join(name).exists(), "{name} was left behind");
    }
    assert!(dir.path().join("notes.txt").exists(), "files that are not the log's are left alone");
    assert_eq!(segment_bases(dir.path()), bases);
    assert_eq!(read_all(&partition), records);
}

#[test]
fn an_empty_last_segment_from_a_crash_during_a_roll_is_fine() {
    let dir = tempfile::tempdir().unwrap();
    let (records, bases) = write_segmented(dir.path());
    let end = records.len() as u64;
    fs::write(segment_path(dir.path(), end), b"").unwrap();
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(report.segments, bases.len() + 1);
    assert_eq!(partition.end_offset(), end);
    assert_eq!(read_all(&partition), records);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let ack = runtime.block_on(partition.append(&[record(end)])).unwrap();
    assert_eq!(ack.base_offset, end);
    assert_eq!(batches_in(&segment_path(dir.path(), end)).len(), 1, "the append went into the empty segment");
}

#[test]
fn a_partition_that_never_cuts_its_tail_refuses_a_torn_one_but_not_its_runway() {
    let (source, records, segment) = written(6);
    let (last_at, last) = *batches_in(&segment).last().unwrap();
    let strict = |discard_damaged| PartitionOptions {
        recovery: RecoveryPolicy {
            cut_torn_tail: false,
            discard_damaged,
            remedy: "start with --recover-the-thing".into(),
        },
        ..PartitionOptions::default()
    };
    let scratch = tempfile::tempdir().unwrap();

    // Zeros after the data are the runway, never damage: opened as usual.
    let dir = copied(&source, &scratch, "runway");
    append_to(&segment_path(&dir, 0), &[0; 4096]);
    remove_segment_index(&dir, 0);
    let (partition, report) = Partition::open_existing_with_options(&dir, &strict(false)).unwrap();
    assert_eq!((report.truncated_bytes, read_all(&partition)), (0, records.clone()));
    drop(partition);

    // A bad last batch: refused, naming the file, the byte, the offsets and the way out.
    let dir = copied(&source, &scratch, "torn");
    let mut bytes = fs::read(&segment).unwrap();
    bytes[last_at as usize + 50] ^= 0x20;
    fs::write(segment_path(&dir, 0), &bytes).unwrap();
    remove_segment_index(&dir, 0);
    let error = Partition::open_existing_with_options(&dir, &strict(false)).err().expect("refused");
    let message = error.to_string();
    match error {
        OpenError::DamagedTail(torn) => {
            assert_eq!(
                (torn.path, torn.position, torn.first_offset),
                (segment_path(&dir, 0), last_at, last.base_offset)
            );
        }
        other => panic!("expected DamagedTail, got {other}"),
    }
    assert!(message.contains("--recover-the-thing") && message.contains(&format!("byte {last_at}")), "{message}");
    assert_eq!(fs::read(segment_path(&dir, 0)).unwrap(), bytes, "a refused open changes nothing");
    // Told to, it cuts the bad batch, keeping a copy of the file as it was.
    let (partition, report) = Partition::open_existing_with_options(&dir, &strict(true)).unwrap();
    assert_eq!(fs::read(&report.discarded[0].copy).unwrap(), bytes);
    assert_eq!(read_all(&partition), records[..last.base_offset as usize]);
}

#[test]
fn a_batch_a_newer_onehop_wrote_is_refused_never_cut_nor_set_aside() {
    let (source, records, segment) = written(8);
    let (last_at, _) = *batches_in(&segment).last().unwrap();
    let original = fs::read(&segment).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    // A later version, and an attribute this release does not know, each with a checksum that
    // holds: what a newer release writes, not damage.
    for (name, at, value) in [("version", 12, 2u8), ("attribute", 14, 0x80)] {
        let mut bytes = original.clone();
        let start = last_at as usize;
        bytes[start + at] = value;
        let len = u32::from_le_bytes(bytes[start + 8..start + 12].try_into().unwrap()) as usize;
        let crc = crc32c::crc32c(&bytes[start + 8..start + len]);
        bytes[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
        for discard_damaged in [false, true] {
            let dir = copied(&source, &scratch, &format!("{name}-{discard_damaged}"));
            fs::write(segment_path(&dir, 0), &bytes).unwrap();
            remove_segment_index(&dir, 0);
            let options = PartitionOptions {
                recovery: RecoveryPolicy { discard_damaged, ..Default::default() },
                ..PartitionOptions::default()
            };
            match Partition::open_existing_with_options(&dir, &options) {
                Err(OpenError::NewerFormat { position, reason, .. }) if !discard_damaged => {
                    assert_eq!(position, last_at);
                    assert!(reason.contains("checksum holds"), "{reason}");
                }
                // Setting damage aside stops at the newer batch too, with an error that says so.
                Err(OpenError::NewerFormat { .. } | OpenError::Io { .. }) if discard_damaged => {}
                other => panic!("{name}, discard_damaged {discard_damaged}: {:?}", other.map(|_| ())),
            }
            assert_eq!(fs::read(segment_path(&dir, 0)).unwrap(), bytes, "nothing was changed");
            let leftovers: Vec<_> = fs::read_dir(&dir)
                .unwrap()
                .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|name| name.contains("damaged"))
                .collect();
            assert!(leftovers.is_empty(), "nothing set aside: {leftovers:?}");
        }
    }
    // The same change without the checksum made right is damage, and the tail is cut as ever.
    let mut bytes = original.clone();
    bytes[last_at as usize + 14] = 0x80;
    let dir = copied(&source, &scratch, "attribute-damaged");
    fs::write(segment_path(&dir, 0), &bytes).unwrap();
    remove_segment_index(&dir, 0);
    let last = batches_in(&segment).last().unwrap().1;
    assert_cut_at(&dir, &segment_path(&dir, 0), last_at, &records[..last.base_offset as usize], false);
}
