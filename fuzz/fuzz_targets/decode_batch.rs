//! Arbitrary bytes as a batch: parsing, CRC checking and record decoding must return an error
//! or records, never panic or allocate without bound, and a decoded record's headers read back
//! in full. The CRC check is not a gate here, so the fuzzer reaches the record decoder with
//! bytes a CRC would have rejected.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use onehop_log::{BATCH_HEADER_BYTES, BatchHeader, decode_records};

fuzz_target!(|data: &[u8]| {
    let Ok(header) = BatchHeader::parse(data) else { return };
    let len = header.batch_len as usize;
    if len > data.len() {
        return;
    }
    let batch = Bytes::copy_from_slice(&data[..len]);
    let _ = header.verify(&batch);
    if let Ok(records) = decode_records(&header, &batch) {
        assert_eq!(records.len(), header.record_count as usize);
        assert!(len >= BATCH_HEADER_BYTES);
        let mut previous = None;
        for record in &records {
            assert!(record.offset >= header.base_offset && record.offset < header.next_offset());
            assert!(previous.is_none_or(|previous| record.offset > previous));
            previous = Some(record.offset);
            // Headers are checked when decoded and read in place after: every pair is there.
            assert_eq!(record.headers.iter().count(), record.headers.len());
            assert_eq!(record.headers.to_vec().len(), record.headers.len());
        }
    }
});
