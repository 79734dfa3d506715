//! Arbitrary bytes as the last segment of a partition: opening must recover (cutting what is
//! not a valid batch) or fail with an error, and whatever it keeps must read back in order.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onehop_log::{Partition, PartitionConfig};

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("partition.conf"), PartitionConfig::default().to_text()).unwrap();
    std::fs::write(dir.path().join("00000000000000000000.log"), data).unwrap();
    let Ok((partition, report)) = Partition::open_existing(dir.path()) else { return };
    assert!(report.truncated_bytes <= data.len() as u64);
    let end = partition.end_offset();
    let mut next = partition.start_offset();
    while next < end {
        let records = partition.read(next, 1000, 1 << 20).expect("recovered records read back");
        assert!(!records.is_empty());
        for record in records {
            assert!(record.offset >= next && record.offset < end);
            next = record.offset + 1;
        }
    }
    partition.close();
});
