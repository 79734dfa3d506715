use onehop_log::{NewRecord, Partition, PartitionConfig};

#[tokio::test]
async fn append_read_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (partition, _) = Partition::open(dir.path(), PartitionConfig::default()).unwrap();
    let ack = partition.append(&[NewRecord::value("a"), NewRecord::keyed("k", "b")]).await.unwrap();
    assert_eq!((ack.base_offset, ack.record_count), (0, 2));
    let records = partition.read(0, 10, 1 << 20).unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(records[1].value.as_deref(), Some(&b"b"[..]));
    partition.close();
    drop(partition);
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!(report.truncated_bytes, 0);
    assert_eq!(partition.end_offset(), 2);
    assert_eq!(partition.read(1, 10, 1 << 20).unwrap()[0].key.as_deref(), Some(&b"k"[..]));
}
