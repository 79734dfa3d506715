//! Reads: limits, the tail cache, reading on, errors, waiting, time lookups, rolling segments.

use super::*;

#[tokio::test]
async fn reads_respect_record_and_byte_limits() {
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), PartitionConfig::default());
    // Ten records of 100-byte values in batches of 3, 4 and 3.
    let records: Vec<NewRecord> = (0..10).map(|i| numbered(i, 100)).collect();
    for chunk in [&records[0..3], &records[3..7], &records[7..10]] {
        partition.append(chunk).await.unwrap();
    }
    let offsets = |read: Vec<Record>| read.iter().map(|record| record.offset).collect::<Vec<_>>();
    assert_eq!(offsets(partition.read(0, 3, usize::MAX).unwrap()), vec![0, 1, 2]);
    assert_eq!(offsets(partition.read(0, 0, usize::MAX).unwrap()), Vec::<u64>::new());
    // Reading starts inside a batch and crosses into the next ones.
    assert_eq!(offsets(partition.read(5, 100, usize::MAX).unwrap()), vec![5, 6, 7, 8, 9]);
    assert_eq!(offsets(partition.read(2, 4, usize::MAX).unwrap()), vec![2, 3, 4, 5]);
    // Byte limits stop once the limit is reached, the record reaching it included.
    assert_eq!(offsets(partition.read(0, 100, 250).unwrap()), vec![0, 1, 2]);
    assert_eq!(offsets(partition.read(0, 100, 300).unwrap()), vec![0, 1, 2]);
    assert_eq!(offsets(partition.read(0, 100, 301).unwrap()), vec![0, 1, 2, 3]);
    // At least one record, however small the limit.
    assert_eq!(offsets(partition.read(4, 100, 0).unwrap()), vec![4]);
    assert_eq!(offsets(partition.read(9, 100, 1).unwrap()), vec![9]);
    // Keys count toward the byte limit too.
    partition.append(&vec![NewRecord::keyed(vec![b'k'; 50], vec![b'v'; 100]); 4]).await.unwrap();
    assert_eq!(offsets(partition.read(10, 100, 300).unwrap()), vec![10, 11]);
    // Whatever the limits, the records are the ones appended.
    for (i, record) in partition.read(0, 10, usize::MAX).unwrap().iter().enumerate() {
        assert_eq!(*record, stored(i as u64, &records[i]));
    }
}

/// Reads close behind the writer take the newest batches from memory, and get exactly what the
/// file gives: every read of a grid of starts and limits, and a tailer's read-on pattern, gives
/// the same records again once the partition is reopened (nothing in memory then). The data is
/// larger than the cache and spans segments, so the oldest reads miss it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_from_memory_are_what_the_file_holds() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let counter = |name: &str| -> u64 {
        let text = handle.render();
        text.lines().find_map(|line| line.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0)
    };
    let dir = tempfile::tempdir().unwrap();
    let config = PartitionConfig { segment_bytes_max: 2 << 20, batch_bytes_max: 1 << 20, ..PartitionConfig::default() };
    let partition = Arc::new(metrics::with_local_recorder(&recorder, || open(dir.path(), config)));
    // ~3 MiB in batches of 1 to 40 records, one append at a time and, for some, many at once
    // (one batch of several appends); keys, subjects and headers on some records.
    let record = |i: u64| NewRecord {
        timestamp_ms: Some(1_000 + i as i64),
        key: i.is_multiple_of(3).then(|| Bytes::from(format!("key-{}", i % 17))),
        subject: i.is_multiple_of(5).then(|| format!("subjects/{}", i % 7).into()),
        headers: if i.is_multiple_of(4) {
            vec![(Text::from_static("h"), Some(Bytes::from(i.to_string())))]
        } else {
            Vec::new()
        },
        value: Some(filler(i, 50 + (i as usize * 37) % 700)),
    };
    // What each offset holds, from the acknowledgements (appends made at once land in any order).
    let mut expected: Vec<Option<Record>> = Vec::new();
    let mut acknowledged = |ack: onehop_log::AppendAck, records: &[NewRecord]| {
        for (i, record) in records.iter().enumerate() {
            let offset = ack.base_offset + i as u64;
            if expected.len() <= offset as usize {
                expected.resize(offset as usize + 1, None);
            }
            expected[offset as usize] = Some(stored(offset, record));
        }
    };
    let mut appended = 0u64;
    let mut round = 0u64;
    while partition.size_bytes() < 3 << 20 {
        round += 1;
        if round.is_multiple_of(4) {
            let mut appends = Vec::new();
            for _ in 0..8 {
                let records: Vec<NewRecord> = (appended..appended + 3).map(record).collect();
                appended += 3;
                let partition = partition.clone();
                appends.push(tokio::spawn(async move { (partition.append(&records).await.unwrap(), records) }));
            }
            for append in appends {
                let (ack, records) = append.await.unwrap();
                acknowledged(ack, &records);
            }
        } else {
            let count = 1 + round % 40;
            let records: Vec<NewRecord> = (appended..appended + count).map(record).collect();
            acknowledged(partition.append(&records).await.unwrap(), &records);
            appended += count;
        }
    }
    let last_write = std::time::Instant::now();
    assert!(partition.segment_count() > 1, "the test wants reads across segments");
    let end = partition.end_offset();
    assert_eq!(end, appended);

    let read_everything = |partition: &Partition| {
        let mut reads = Vec::new();
        // Newest first: a partition drops its cached batches a quarter second after its last
        // write, and the newest are the ones cached.
        let mut starts: Vec<u64> = (0..end).step_by(97).chain([end - 1, end]).collect();
        starts.reverse();
        for from in starts {
            for max_records in [1, 3, 25, 1000] {
                for max_bytes in [0, 300, 1 << 20] {
                    reads.push(partition.read(from, max_records, max_bytes).unwrap());
                }
            }
        }
        // A tailer's pattern: on from where each read stopped, from a start near the end.
        let mut ahead = onehop_log::ReadAhead::default();
        let mut next = end - end / 3;
        while next < end {
            let read = partition.read_next(next, 7, usize::MAX, &mut ahead).unwrap();
            next = read.last().unwrap().offset + 1;
            reads.push(read);
        }
        reads
    };
    let (memory_before, file_before) = (counter("log_reads_from_memory_total"), counter("log_reads_from_file_total"));
    let cached = read_everything(&partition);
    let (memory_after, file_after) = (counter("log_reads_from_memory_total"), counter("log_reads_from_file_total"));
    assert!(file_after > file_before, "the oldest records are no longer in memory");
    // Which reads find the cache depends on time (a partition drops it a quarter second after
    // its last write), so this holds only when the machine did not stall the test that long;
    // what the reads return must match the file either way.
    if last_write.elapsed() < Duration::from_millis(250) {
        assert!(memory_after > memory_before, "the newest records come from memory");
    }

    let partition = Arc::try_unwrap(partition).ok().expect("the appends are done");
    let partition = metrics::with_local_recorder(&recorder, || reopen(partition));
    let from_file = read_everything(&partition);
    assert_eq!(counter("log_reads_from_memory_total"), memory_after, "a reopened partition has nothing in memory");
    assert_eq!(cached.len(), from_file.len());
    for (cached, from_file) in cached.iter().zip(&from_file) {
        assert!(
            cached == from_file,
            "a read from memory differs from the file from offset {:?}",
            cached.first().map(|record| record.offset)
        );
    }
    let expected: Vec<Record> = expected.into_iter().map(|record| record.expect("every offset acknowledged")).collect();
    assert!(read_all(&partition) == expected, "the partition does not hold what was acknowledged");
}

/// A partition that stops writing lets its cached batches go: the same read, repeated, comes
/// from memory right after the write and from the file once the partition has been idle for
/// the cache's age (a quarter second), with the same records.
#[tokio::test]
async fn an_idle_partition_lets_its_cached_batches_go() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let counter = |name: &str| -> u64 {
        handle.render().lines().find_map(|line| line.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0)
    };
    let dir = tempfile::tempdir().unwrap();
    let partition = metrics::with_local_recorder(&recorder, || open(dir.path(), PartitionConfig::default()));
    let records: Vec<NewRecord> = (0..10).map(|i| numbered(i, 100)).collect();
    partition.append(&records).await.unwrap();
    let written = std::time::Instant::now();
    let first = partition.read(0, 100, usize::MAX).unwrap();
    if written.elapsed() < Duration::from_millis(250) {
        assert_eq!(counter("log_reads_from_memory_total"), 1, "a read right after the write");
    }
    // Within 10 s (a loaded machine wakes the idle writer late), the read goes to the file.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let files_before = counter("log_reads_from_file_total");
        let again = partition.read(0, 100, usize::MAX).unwrap();
        assert_eq!(again, first);
        if counter("log_reads_from_file_total") > files_before {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the cache was never let go");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A new write is cached again.
    partition.append(&[numbered(10, 100)]).await.unwrap();
    let memory_before = counter("log_reads_from_memory_total");
    let written = std::time::Instant::now();
    assert_eq!(partition.read(10, 1, usize::MAX).unwrap(), vec![stored(10, &numbered(10, 100))]);
    if written.elapsed() < Duration::from_millis(250) {
        assert_eq!(counter("log_reads_from_memory_total"), memory_before + 1);
    }
}

#[tokio::test]
async fn read_next_goes_on_from_the_batch_the_last_read_stopped_in() {
    let dir = tempfile::tempdir().unwrap();
    let config = PartitionConfig {
        segment_bytes_max: 64 * 1024,
        record_bytes_max: 4096,
        batch_bytes_max: 64 * 1024,
        queue_bytes_max: 1 << 20,
        ..PartitionConfig::default()
    };
    let partition = open(dir.path(), config);
    // Batches of 100, 100 and 5 records, then enough to roll over into more segments.
    let mut records: Vec<NewRecord> = (0..205).map(|i| numbered(i, 50)).collect();
    for chunk in [&records[0..100], &records[100..200], &records[200..205]] {
        partition.append(chunk).await.unwrap();
    }
    let offsets = |read: Vec<Record>| read.iter().map(|record| record.offset).collect::<Vec<_>>();
    let range = |from: u64, to: u64| (from..to).collect::<Vec<_>>();
    let mut ahead = onehop_log::ReadAhead::default();
    // The same limits as `read`, whether the records come from the file or from the batch
    // the last read stopped in.
    assert_eq!(offsets(partition.read_next(5, 10, usize::MAX, &mut ahead).unwrap()), range(5, 15));
    assert_eq!(offsets(partition.read_next(15, 10, usize::MAX, &mut ahead).unwrap()), range(15, 25));
    assert_eq!(offsets(partition.read_next(25, 100, usize::MAX, &mut ahead).unwrap()), range(25, 125));
    // A byte limit: 50-byte values, reached at the third record.
    assert_eq!(offsets(partition.read_next(125, 1000, 150, &mut ahead).unwrap()), range(125, 128));
    // Anywhere else, the file again; then on from there.
    assert_eq!(offsets(partition.read_next(3, 2, usize::MAX, &mut ahead).unwrap()), range(3, 5));
    assert_eq!(offsets(partition.read_next(5, 2, usize::MAX, &mut ahead).unwrap()), range(5, 7));
    assert_eq!(offsets(partition.read_next(150, 1000, usize::MAX, &mut ahead).unwrap()), range(150, 205));
    assert_eq!(offsets(partition.read_next(205, 10, usize::MAX, &mut ahead).unwrap()), Vec::<u64>::new());
    // The last record of a batch: the next read goes on into the next batch.
    assert_eq!(offsets(partition.read_next(90, 10, usize::MAX, &mut ahead).unwrap()), range(90, 100));
    assert_eq!(offsets(partition.read_next(100, 3, usize::MAX, &mut ahead).unwrap()), range(100, 103));
    // Records appended after a read stopped at the end are read from the file.
    records.extend((205..1400).map(|i| numbered(i, 50)));
    for chunk in records[205..].chunks(300) {
        partition.append(chunk).await.unwrap();
    }
    assert!(partition.segment_count() > 1, "the test wants reads across segments");
    // A tailer's pattern, a few at a time from where it stopped, across batches and
    // segments: exactly the records appended.
    let mut ahead = onehop_log::ReadAhead::default();
    let mut next = 0;
    while next < 1400 {
        let read = partition.read_next(next, 7, usize::MAX, &mut ahead).unwrap();
        assert!(!read.is_empty() && read.len() <= 7);
        for record in read {
            assert_eq!(record, stored(next, &records[next as usize]));
            next += 1;
        }
    }
    // Retention past where a reader stopped is an error as for `read`, whatever it kept.
    let mut ahead = onehop_log::ReadAhead::default();
    partition.read_next(0, 10, usize::MAX, &mut ahead).unwrap();
    assert!(matches!(partition.read_next(2000, 10, usize::MAX, &mut ahead), Err(ReadError::PastEnd { .. })));
}

#[tokio::test]
async fn reads_of_records_larger_than_the_segment_average_are_whole() {
    // A read takes from the file what the segment's average record size says the records it
    // wants need, and reads on when they are larger: here a thousand tiny records, then large
    // ones in batches of 1, 7 and 30.
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), PartitionConfig::default());
    let mut records: Vec<NewRecord> = (0..1000).map(|i| numbered(i, 8)).collect();
    records.extend((1000..1038).map(|i| numbered(i, 20_000 + i as usize)));
    for chunk in [&records[0..1000], &records[1000..1001], &records[1001..1008], &records[1008..1038]] {
        partition.append(chunk).await.unwrap();
    }
    for (from, limit) in [(1000, 1), (1000, 38), (1001, 3), (995, 20), (1008, 30), (0, 2000)] {
        let read = partition.read(from, limit, usize::MAX).unwrap();
        assert_eq!(read.len(), limit.min(1038 - from as usize), "read({from}, {limit})");
        for record in read {
            assert_eq!(record, stored(record.offset, &records[record.offset as usize]));
        }
    }
}

#[tokio::test]
async fn reads_outside_the_log_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), PartitionConfig::default());
    assert_eq!(partition.read(0, 10, usize::MAX), Ok(vec![]));
    assert_eq!(partition.read(1, 10, usize::MAX), Err(ReadError::PastEnd { offset: 1, end: 0 }));
    partition.append(&[NewRecord::value("a"), NewRecord::value("b")]).await.unwrap();
    assert_eq!(partition.read(2, 10, usize::MAX), Ok(vec![]), "reading at the end offset is empty, not an error");
    assert_eq!(partition.read(3, 10, usize::MAX), Err(ReadError::PastEnd { offset: 3, end: 2 }));
    assert_eq!(partition.read(u64::MAX, 10, usize::MAX), Err(ReadError::PastEnd { offset: u64::MAX, end: 2 }));
    // BeforeStart needs retention to move the start: see the retention tests.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_wakes_on_append_and_reports_close() {
    let dir = tempfile::tempdir().unwrap();
    let partition = Arc::new(open(dir.path(), PartitionConfig::default()));
    let spawn_waiter = |offset: u64| {
        let partition = partition.clone();
        tokio::spawn(async move { partition.wait_for(offset).await })
    };
    let first = spawn_waiter(0);
    let third = spawn_waiter(2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!first.is_finished(), "wait_for(0) returned before anything was appended");

    partition.append(&[NewRecord::value("one")]).await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(5), first).await.expect("the append wakes the waiter");
    assert_eq!(woken.unwrap(), Ok(1));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!third.is_finished(), "wait_for(2) must not wake while the end is 1");
    partition.append(&[NewRecord::value("two"), NewRecord::value("three")]).await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(5), third).await.expect("the append wakes the waiter");
    assert_eq!(woken.unwrap(), Ok(3));

    // Records already readable answer at once.
    assert_eq!(tokio::time::timeout(Duration::from_secs(1), partition.wait_for(0)).await.unwrap(), Ok(3));

    // A waiter past the end is released by close with Closed.
    let beyond = spawn_waiter(3);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!beyond.is_finished());
    partition.close();
    let woken = tokio::time::timeout(Duration::from_secs(5), beyond).await.expect("close wakes the waiter");
    assert_eq!(woken.unwrap(), Err(ReadError::Closed));
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(1), partition.wait_for(3)).await.unwrap(),
        Err(ReadError::Closed)
    );
    assert_eq!(partition.wait_for(2).await, Ok(3), "records written before close stay readable");
    assert!(partition.watch().borrow().closed);
}

#[tokio::test]
async fn offset_for_timestamp_finds_the_first_record_at_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), small_config());
    // Timestamps jump back between runs of records and jitter within them, so neither the
    // segments nor the records are in time order.
    let mut expected = Vec::new();
    for run_base in [5_000i64, 1_000, 3_000, -2_000, 4_000] {
        for i in 0..60u64 {
            let jitter = ((i * 7_919) % 400) as i64;
            expected.push(NewRecord { timestamp_ms: Some(run_base + jitter), ..numbered(expected.len() as u64, 60) });
        }
    }
    let mut at = 0;
    while at < expected.len() {
        let count = 1 + at % 4;
        let end = (at + count).min(expected.len());
        partition.append(&expected[at..end]).await.unwrap();
        at = end;
    }
    assert!(partition.segment_count() > 5, "the test needs several segments, got {}", partition.segment_count());

    let mut targets: Vec<i64> = expected.iter().map(|record| record.timestamp_ms.unwrap()).collect();
    targets.extend((-3_000..6_000).step_by(37));
    targets.extend([i64::MIN, i64::MAX, 5_399, 5_400]);
    let check = |partition: &Partition| {
        for &target in &targets {
            let want = expected.iter().position(|record| record.timestamp_ms.unwrap() >= target).map(|i| i as u64);
            assert_eq!(partition.offset_for_timestamp(target).unwrap(), want, "timestamp {target}");
        }
    };
    check(&partition);
    let partition = reopen(partition);
    check(&partition);
    partition.close();
    drop(partition);
    remove_index_files(dir.path());
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!(report.indexes_rebuilt, report.segments);
    check(&partition);
}

#[tokio::test]
async fn segments_roll_and_reads_cross_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let partition = open(dir.path(), config.clone());
    let mut expected = Vec::new();
    let mut appends = 0;
    while expected.len() < 300 {
        let count = 1 + appends % 4;
        let batch: Vec<NewRecord> =
            (0..count).map(|i| numbered(expected.len() as u64 + i as u64, 20 + (appends * 37) % 300)).collect();
        let ack = partition.append(&batch).await.unwrap();
        assert_eq!(ack.base_offset, expected.len() as u64);
        expected.extend(batch);
        appends += 1;
    }
    let bases = segment_bases(dir.path());
    assert!(bases.len() > 10, "expected many segments, got {bases:?}");
    assert_eq!(partition.segment_count(), bases.len());
    // Every segment starts with the record its name says, holds no more than the limit (a
    // batch never straddles segments), and the segments together hold every batch in order.
    // Closed segments are exactly their batches; the active one may have zeros after them.
    let mut next_offset = 0;
    for (i, &base) in bases.iter().enumerate() {
        let path = segment_path(dir.path(), base);
        let (batches, data_bytes) = batches_and_data_end(&path);
        assert_eq!(batches[0].1.base_offset, base);
        assert!(data_bytes <= config.segment_bytes_max);
        if i + 1 < bases.len() {
            assert_exact(&path);
        }
        for (_, header) in batches {
            assert_eq!(header.base_offset, next_offset);
            next_offset = header.next_offset();
        }
    }
    assert_eq!(next_offset, expected.len() as u64);

    let check = |partition: &Partition| {
        assert_eq!(partition.end_offset(), expected.len() as u64);
        for (from, new) in expected.iter().enumerate() {
            let one = partition.read(from as u64, 1, usize::MAX).unwrap();
            assert_eq!(one, vec![stored(from as u64, new)], "read at {from}");
        }
        // Long reads cross segment boundaries without gaps.
        for from in (0..expected.len()).step_by(23) {
            let many = partition.read(from as u64, 50, usize::MAX).unwrap();
            let want: Vec<Record> =
                expected.iter().enumerate().skip(from).take(50).map(|(i, new)| stored(i as u64, new)).collect();
            assert_eq!(many, want, "read of 50 at {from}");
        }
    };
    check(&partition);

    // A clean close leaves every index in place: nothing is rebuilt.
    partition.close();
    drop(partition);
    for &base in &bases {
        assert_exact(&segment_path(dir.path(), base));
    }
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!((report.segments, report.indexes_rebuilt, report.truncated_bytes), (bases.len(), 0, 0));
    check(&partition);

    // Without index files, open rebuilds them all and reads do not change.
    partition.close();
    drop(partition);
    assert_eq!(remove_index_files(dir.path()), 2 * bases.len());
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!((report.segments, report.indexes_rebuilt, report.truncated_bytes), (bases.len(), bases.len(), 0));
    check(&partition);
    // Closed segments get their index files back at open, the active one at close.
    for &base in &bases[..bases.len() - 1] {
        assert!(dir.path().join(format!("{base:020}.index")).exists());
        assert!(dir.path().join(format!("{base:020}.timeindex")).exists());
    }
    let partition = reopen(partition);
    check(&partition);
    // Appends continue where the log ended, in the last segment.
    let ack = partition.append(&[numbered(1_000, 10)]).await.unwrap();
    assert_eq!(ack.base_offset, expected.len() as u64);
}
