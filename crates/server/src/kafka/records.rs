//! Kafka record batches to and from the engine's records, through our own codec
//! ([`super::batch`]), which keeps headers as Kafka has them: in order, names repeated, values
//! null.
//!
//! A produced batch (any of the four compressions) becomes records with the same key, value,
//! timestamp and headers; the header [`SUBJECT_HEADER`] becomes the record's subject. A
//! fetched run of records becomes one uncompressed batch (magic 2) with the records' own
//! offsets, the subject back as that header first.

use bytes::{Bytes, BytesMut};
use onehop_engine::{NewRecord, Record, Text};

use super::batch::{self, Compression, Outgoing};

/// The header a record's subject travels in over Kafka.
pub const SUBJECT_HEADER: &str = "onehop-subject";

/// The header on the last record of an idempotent producer's batch: `{producer id}:{epoch}:
/// {first sequence}:{last sequence}`, from which a start rebuilds what it needs to recognise a
/// retried batch ([`super::producers`]). Not sent to Kafka consumers.
pub const PRODUCER_HEADER: &str = "onehop-kafka-producer";

/// Why a produced batch was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The bytes are not a record batch (or its checksum or compression is wrong).
    Corrupt(String),
    /// A record the server does not take (a control record, a subject that is not UTF-8).
    Invalid(String),
}

/// An idempotent producer's batch: who wrote it and the sequence numbers it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sequenced {
    pub producer_id: i64,
    pub epoch: i16,
    pub first_sequence: i32,
    pub last_sequence: i32,
}

/// `sequence` plus `increment`, wrapping to 0 past `i32::MAX` as Kafka's sequence numbers do.
pub fn add_sequence(sequence: i32, increment: i32) -> i32 {
    if sequence > i32::MAX - increment { increment - (i32::MAX - sequence) - 1 } else { sequence + increment }
}

/// A produced batch, as the engine writes it.
#[derive(Debug)]
pub struct Produced {
    pub records: Vec<NewRecord>,
    /// Set when the batch came from an idempotent producer.
    pub sequenced: Option<Sequenced>,
    /// A transactional producer's batch: it waits in its transaction until that commits.
    pub transactional: bool,
}

/// The one record batch of a partition's produce data (Kafka allows exactly one since
/// Produce version 3), as the engine writes it. A compressed batch may decompress to at most
/// `limit` bytes: a small batch of zeros must not become gigabytes in memory.
pub fn decode(mut bytes: Bytes, limit: usize) -> Result<Produced, Refused> {
    let open = |compressed: Bytes, compression: Compression| {
        decompress(&compressed, compression, limit).map_err(|error| format!("{error:#}"))
    };
    let batch = batch::decode(&mut bytes, &open).map_err(Refused::Corrupt)?;
    if !bytes.is_empty() {
        return Err(Refused::Invalid(
            "more than one record batch: a partition's produce data holds exactly one".into(),
        ));
    }
    if batch.records.is_empty() {
        return Err(Refused::Corrupt("a record batch with no records".into()));
    }
    if batch.control {
        return Err(Refused::Invalid("control records are written by the server, not produced".into()));
    }
    let transactional = batch.transactional;
    if transactional && batch.producer_id < 0 {
        return Err(Refused::Invalid("a transactional batch without a producer id".into()));
    }
    let sequenced = (batch.producer_id >= 0).then(|| Sequenced {
        producer_id: batch.producer_id,
        epoch: batch.producer_epoch,
        first_sequence: batch.base_sequence,
        last_sequence: add_sequence(batch.base_sequence, batch.records.len() as i32 - 1),
    });
    // Stamped at log append time, a batch's records take the server's time, as Kafka's do.
    let stamped_by_client = !batch.log_append_time;
    let mut records = Vec::with_capacity(batch.records.len());
    for record in batch.records {
        let mut subject = None;
        let mut headers = Vec::with_capacity(record.headers.len());
        for (name, value) in record.headers {
            if name == SUBJECT_HEADER {
                // A null subject is none.
                subject = value
                    .map(Text::from_utf8)
                    .transpose()
                    .map_err(|_| Refused::Invalid(format!("the {SUBJECT_HEADER} header is not UTF-8")))?;
            } else if name == PRODUCER_HEADER || name == onehop_engine::idempotency::IDEMPOTENCY_HEADER {
                return Err(Refused::Invalid(format!("the {name} header is the server's own")));
            } else {
                headers.push((Text::from(name), value));
            }
        }
        records.push(NewRecord {
            timestamp_ms: (stamped_by_client && record.timestamp >= 0).then_some(record.timestamp),
            key: record.key,
            subject,
            headers,
            value: record.value,
        });
    }
    Ok(Produced { records, sequenced, transactional })
}

/// Decompresses a batch's records into at most `limit` bytes, with the codecs Kafka's clients
/// use: gzip, snappy (the xerial framing Kafka's Java client writes, or raw), the LZ4 frame
/// format, zstd.
fn decompress(input: &Bytes, compression: Compression, limit: usize) -> anyhow::Result<Bytes> {
    let out = match compression {
        Compression::None => return Ok(input.clone()),
        Compression::Gzip => read_bounded(flate2::read::MultiGzDecoder::new(&input[..]), limit)?,
        Compression::Lz4 => read_bounded(lz4::Decoder::new(&input[..])?, limit)?,
        Compression::Zstd => read_bounded(zstd::stream::read::Decoder::new(&input[..])?, limit)?,
        Compression::Snappy => snappy(input, limit)?,
    };
    Ok(Bytes::from(out))
}

/// Reads `reader` to its end, refusing output past `limit` bytes.
fn read_bounded(reader: impl std::io::Read, limit: usize) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let mut out = Vec::new();
    reader.take(limit as u64 + 1).read_to_end(&mut out)?;
    if out.len() > limit {
        anyhow::bail!("the batch decompresses to more than {limit} bytes");
    }
    Ok(out)
}

/// The start of snappy's xerial framing (then a version and a compatible version).
const XERIAL_MAGIC: &[u8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER_BYTES: usize = 16;

/// Snappy as Kafka's clients write it: xerial framing (blocks, each a big-endian length and a
/// raw snappy block) or, without its magic, one raw block. Each block's declared length is
/// checked against what is left of `limit` before anything is allocated for it.
fn snappy(input: &[u8], limit: usize) -> anyhow::Result<Vec<u8>> {
    let mut decoder = snap::raw::Decoder::new();
    let mut out = Vec::new();
    let mut block = |compressed: &[u8], out: &mut Vec<u8>| -> anyhow::Result<()> {
        let length = snap::raw::decompress_len(compressed)?;
        if out.len() + length > limit {
            anyhow::bail!("the batch decompresses to more than {limit} bytes");
        }
        let start = out.len();
        out.resize(start + length, 0);
        decoder.decompress(compressed, &mut out[start..])?;
        Ok(())
    };
    if !input.starts_with(XERIAL_MAGIC) {
        block(input, &mut out)?;
        return Ok(out);
    }
    let mut rest = input.get(XERIAL_HEADER_BYTES..).ok_or_else(|| anyhow::anyhow!("a truncated snappy header"))?;
    while !rest.is_empty() {
        let (length, after) =
            rest.split_at_checked(4).ok_or_else(|| anyhow::anyhow!("a truncated snappy block length"))?;
        let length = u32::from_be_bytes(length.try_into().expect("four bytes")) as usize;
        let (compressed, after) =
            after.split_at_checked(length).ok_or_else(|| anyhow::anyhow!("a truncated snappy block"))?;
        block(compressed, &mut out)?;
        rest = after;
    }
    Ok(out)
}

/// `records` (consecutive reads of one partition) as one record batch.
pub fn encode(records: &[Record]) -> Bytes {
    let outgoing: Vec<Outgoing<'_>> = records
        .iter()
        .map(|record| {
            let mut headers = Vec::with_capacity(record.headers.len() + 1);
            if let Some(subject) = &record.subject {
                headers.push((SUBJECT_HEADER, Some(subject.as_bytes())));
            }
            headers.extend(record.headers.iter().filter(|(name, _)| *name != PRODUCER_HEADER));
            Outgoing {
                offset: record.offset as i64,
                timestamp: record.timestamp_ms,
                key: record.key.as_deref(),
                value: record.value.as_deref(),
                headers,
            }
        })
        .collect();
    let mut buffer = BytesMut::new();
    batch::encode(&mut buffer, &outgoing);
    buffer.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression as KafkaCompression, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, Record as KafkaRecord, RecordBatchDecoder,
        RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    const LIMIT: usize = 1 << 20;

    #[test]
    fn a_batch_that_decompresses_past_the_limit_is_refused_in_every_compression() {
        // A megabyte of zeros in one record: a few kilobytes compressed.
        let zeros = String::from_utf8(vec![b'0'; 1 << 20]).unwrap();
        let big = [kafka_record(0, "k", &zeros, &[])];
        for compression in
            [KafkaCompression::Gzip, KafkaCompression::Snappy, KafkaCompression::Lz4, KafkaCompression::Zstd]
        {
            let batch = produced(&big, compression);
            assert!(batch.len() < 64 * 1024, "{compression:?}: {} bytes", batch.len());
            match decode(batch.clone(), 512 * 1024) {
                Err(Refused::Corrupt(why)) => {
                    assert!(why.contains("decompresses to more than"), "{compression:?}: {why}")
                }
                other => panic!("{compression:?}: {other:?}"),
            }
            assert_eq!(decode(batch, 2 << 20).unwrap().records[0].value.as_ref().unwrap().len(), 1 << 20);
        }
    }

    fn produced(records: &[KafkaRecord], compression: KafkaCompression) -> Bytes {
        let mut buffer = BytesMut::new();
        RecordBatchEncoder::encode(&mut buffer, records, &RecordEncodeOptions { version: 2, compression }).unwrap();
        buffer.freeze()
    }

    fn kafka_record(offset: i64, key: &str, value: &str, headers: &[(&str, &str)]) -> KafkaRecord {
        KafkaRecord {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            timestamp_type: TimestampType::Creation,
            offset,
            // Offset minus sequence the same for every record: the codec keeps them in one batch.
            sequence: offset as i32 - 1,
            timestamp: 1_700_000_000_000 + offset,
            key: Some(Bytes::from(key.to_string())),
            value: Some(Bytes::from(value.to_string())),
            headers: headers
                .iter()
                .map(|(name, value)| (StrBytes::from_string(name.to_string()), Some(Bytes::from(value.to_string()))))
                .collect(),
        }
    }

    #[test]
    fn every_compression_decodes_to_the_same_records_and_the_subject_header_is_the_subject() {
        let batch = [
            kafka_record(0, "k0", "v0", &[("trace", "t0"), (SUBJECT_HEADER, "home/kitchen")]),
            kafka_record(1, "k1", "v1", &[]),
        ];
        for compression in [
            KafkaCompression::None,
            KafkaCompression::Gzip,
            KafkaCompression::Snappy,
            KafkaCompression::Lz4,
            KafkaCompression::Zstd,
        ] {
            let records = decode(produced(&batch, compression), LIMIT).unwrap().records;
            assert_eq!(records.len(), 2, "{compression:?}");
            assert_eq!(records[0].key.as_deref(), Some(&b"k0"[..]));
            assert_eq!(records[0].value.as_deref(), Some(&b"v0"[..]));
            assert_eq!(records[0].timestamp_ms, Some(1_700_000_000_000));
            assert_eq!(records[0].subject.as_deref(), Some("home/kitchen"));
            assert_eq!(records[0].headers, vec![(Text::from("trace"), Some(Bytes::from("t0")))]);
            assert_eq!(records[1].subject, None);
        }
    }

    #[test]
    fn damaged_or_control_batches_are_refused() {
        let mut bytes = BytesMut::from(&produced(&[kafka_record(0, "k", "v", &[])], KafkaCompression::None)[..]);
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        assert!(matches!(decode(bytes.clone().freeze(), LIMIT), Err(Refused::Corrupt(_))));
        assert!(matches!(decode(Bytes::from_static(b"\x00\x01"), LIMIT), Err(Refused::Corrupt(_))));
        let one = produced(&[kafka_record(0, "k", "v", &[])], KafkaCompression::None);
        let two = Bytes::from([one.clone(), one].concat());
        assert!(matches!(decode(two, LIMIT), Err(Refused::Invalid(_))), "one batch per partition");
        let mut control = kafka_record(0, "k", "v", &[]);
        control.control = true;
        assert!(matches!(decode(produced(&[control], KafkaCompression::None), LIMIT), Err(Refused::Invalid(_))));
    }

    /// Headers are a list: a name repeated keeps every value in order, a null value stays
    /// null (not empty), from a producer's batch to the stored record and back out to a
    /// consumer's.
    #[test]
    fn repeated_names_and_null_values_survive_produce_and_fetch() {
        let produced_headers: [(&str, Option<&[u8]>); 5] =
            [("trace", Some(b"a")), ("trace", Some(b"b")), ("empty", Some(b"")), ("none", None), ("trace", None)];
        let mut wire = BytesMut::new();
        batch::encode(
            &mut wire,
            &[Outgoing { offset: 0, timestamp: 7, key: None, value: Some(b"v"), headers: produced_headers.to_vec() }],
        );
        let produced = decode(wire.freeze(), LIMIT).unwrap();
        let stored: Vec<(Text, Option<Bytes>)> = produced_headers
            .iter()
            .map(|(name, value)| (Text::from(*name), value.map(Bytes::copy_from_slice)))
            .collect();
        assert_eq!(produced.records[0].headers, stored);
        let record = Record {
            offset: 9,
            timestamp_ms: 7,
            key: None,
            subject: None,
            headers: onehop_engine::Headers::from(&stored[..]),
            value: Some(Bytes::from("v")),
        };
        let fetched = batch::decode(&mut encode(&[record]), &|_, _| Err("none".into())).unwrap();
        let back: Vec<(&str, Option<&[u8]>)> =
            fetched.records[0].headers.iter().map(|(name, value)| (name.as_str(), value.as_deref())).collect();
        assert_eq!(back, produced_headers);
        assert_eq!(fetched.base_offset, 9);
    }

    #[test]
    fn sequences_wrap_to_zero_as_kafkas_do() {
        assert_eq!(add_sequence(5, 3), 8);
        assert_eq!(add_sequence(i32::MAX, 1), 0);
        assert_eq!(add_sequence(i32::MAX - 1, 3), 1);
        assert_eq!(add_sequence(i32::MAX, 0), i32::MAX);
    }

    #[test]
    fn an_idempotent_batch_names_its_producer_and_sequences() {
        let batch: Vec<KafkaRecord> = (0..3)
            .map(|i| KafkaRecord {
                producer_id: 7,
                producer_epoch: 1,
                sequence: 10 + i as i32,
                ..kafka_record(i, "k", "v", &[])
            })
            .collect();
        let produced = decode(produced(&batch, KafkaCompression::Lz4), LIMIT).unwrap();
        let expected = Sequenced { producer_id: 7, epoch: 1, first_sequence: 10, last_sequence: 12 };
        assert_eq!(produced.sequenced, Some(expected));
        assert_eq!(produced.records.len(), 3);
        let plain =
            decode(super::tests::produced(&[kafka_record(0, "k", "v", &[])], KafkaCompression::None), LIMIT).unwrap();
        assert_eq!(plain.sequenced, None);
    }

    #[test]
    fn a_fetched_run_is_one_batch_with_the_records_own_offsets() {
        let stored: Vec<Record> = (0..3)
            .map(|i| Record {
                offset: 40 + i * 2,
                timestamp_ms: 1_700_000_000_000 + i as i64,
                key: Some(Bytes::from(format!("k{i}"))),
                subject: (i == 1).then(|| Text::from("a/b")),
                headers: onehop_engine::Headers::from(&[(Text::from("h"), Some(Bytes::from("x")))][..]),
                value: if i == 2 { None } else { Some(Bytes::from(format!("v{i}"))) },
            })
            .collect();
        let mut encoded = encode(&stored);
        let info = RecordBatchDecoder::decode_batch_info(&mut encoded.clone()).unwrap();
        assert_eq!(info.len(), 1, "one batch");
        assert_eq!((info[0].min_offset, info[0].record_count, info[0].base_sequence), (40, 3, -1));
        let set = RecordBatchDecoder::decode(&mut encoded).unwrap();
        let offsets: Vec<i64> = set.records.iter().map(|record| record.offset).collect();
        assert_eq!(offsets, [40, 42, 44]);
        assert_eq!(set.records[1].headers.get(SUBJECT_HEADER.as_bytes()), Some(&Some(Bytes::from("a/b"))));
        assert_eq!(set.records[0].headers.get(&b"h"[..]), Some(&Some(Bytes::from("x"))));
        assert_eq!(set.records[2].value, None, "a tombstone stays one");
        assert_eq!(set.records[2].timestamp, 1_700_000_000_002);
    }
}
