//! Arbitrary bytes as the last segment of a partition: opening must recover (cutting a torn
//! tail), refuse (damage that valid batches follow) without changing a byte, or fail with an
//! error; told to set damage aside it must open, keep the original bytes as a copy, and
//! whatever it keeps must read back in order.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onehop_log::{OpenError, Partition, PartitionConfig, PartitionOptions, RecoveryPolicy};

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().unwrap();
    let segment = dir.path().join("00000000000000000000.log");
    std::fs::write(dir.path().join("partition.conf"), PartitionConfig::default().to_text()).unwrap();
    std::fs::write(&segment, data).unwrap();
    let opened = match Partition::open_existing(dir.path()) {
        Ok(opened) => opened,
        Err(OpenError::Damaged(_)) => {
            assert_eq!(std::fs::read(&segment).unwrap(), data, "a refused open changed the file");
            let options = PartitionOptions {
                recovery: RecoveryPolicy { discard_damaged: true, ..RecoveryPolicy::default() },
                ..PartitionOptions::default()
            };
            let opened = Partition::open_existing_with_options(dir.path(), &options).expect("opens when told to");
            let copy = &opened.1.discarded.first().expect("the damage was set aside").copy;
            assert_eq!(std::fs::read(copy).unwrap(), data, "the copy is the file as it was");
            opened
        }
        Err(_) => return,
    };
    let (partition, report) = opened;
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
