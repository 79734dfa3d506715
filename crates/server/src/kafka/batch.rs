//! Kafka's record batch (magic 2) on the wire, decoded and encoded here rather than by a
//! general codec, so that a record's headers stay what Kafka says they are: an ordered list in
//! which a name may repeat and a value may be null.
//!
//! A batch: `baseOffset i64`, `batchLength i32` (the bytes after it), `partitionLeaderEpoch
//! i32`, `magic i8` (2), `crc u32` (CRC-32C of everything after it), `attributes i16` (bits 0–2
//! compression, 3 timestamp type, 4 transactional, 5 control), `lastOffsetDelta i32`,
//! `baseTimestamp i64`, `maxTimestamp i64`, `producerId i64`, `producerEpoch i16`,
//! `baseSequence i32`, `recordCount i32`, then the records, compressed as a whole when the
//! attributes say so. All big-endian. A record: `length varint`, `attributes i8`,
//! `timestampDelta varlong`, `offsetDelta varint`, the key and the value (each a `varint`
//! length, -1 for null, and the bytes), and `varint` headers, each a name (a `varint` length and
//! UTF-8) and a value (a `varint` length, -1 for null). Varints are zigzag LEB128.
//!
//! Decoding checks every length against the bytes there are before it takes them, so a count
//! or a length on the wire never makes memory grow past what the request holds (or, for a
//! compressed batch, past the decompression limit).

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The length of a batch's fields up to `batchLength` (`baseOffset`, `batchLength`).
const LOG_OVERHEAD: usize = 12;
/// Bytes from the start of a batch to its first record.
pub const BATCH_HEADER_BYTES: usize = 61;
/// Where the CRC-covered bytes start (`attributes`).
const CRC_FROM: usize = 21;
const MAGIC: i8 = 2;

const COMPRESSION_MASK: i16 = 0x07;
const TIMESTAMP_TYPE_LOG_APPEND: i16 = 0x08;
const TRANSACTIONAL: i16 = 0x10;
const CONTROL: i16 = 0x20;

/// How the records of a batch are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

/// One record of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireRecord {
    /// The batch's base timestamp plus the record's delta (the batch's max timestamp when the
    /// batch is stamped at log append time).
    pub timestamp: i64,
    pub offset_delta: i32,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    /// In order: a name may repeat, a value may be null.
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// A decoded batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireBatch {
    pub base_offset: i64,
    pub partition_leader_epoch: i32,
    pub compression: Compression,
    pub log_append_time: bool,
    pub transactional: bool,
    pub control: bool,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records: Vec<WireRecord>,
}

/// Decompresses a batch's records into at most a limit of bytes, or says why not.
pub type Decompress<'a> = &'a dyn Fn(Bytes, Compression) -> Result<Bytes, String>;

/// Takes the batch at the front of `bytes`. `decompress` opens compressed records.
pub fn decode(bytes: &mut Bytes, decompress: Decompress<'_>) -> Result<WireBatch, String> {
    if bytes.len() < LOG_OVERHEAD {
        return Err(format!("{} bytes, shorter than a record batch's first fields", bytes.len()));
    }
    let batch_length = i32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if batch_length < (BATCH_HEADER_BYTES - LOG_OVERHEAD) as i32 {
        return Err(format!("a record batch length of {batch_length}"));
    }
    let total = LOG_OVERHEAD + batch_length as usize;
    if bytes.len() < total {
        return Err(format!("a record batch of {total} bytes in {} bytes", bytes.len()));
    }
    let mut batch = bytes.split_to(total);
    let magic = batch[16] as i8;
    if magic != MAGIC {
        return Err(format!(
            "a message set of magic {magic}: Produce 3 and later carry record batches (magic 2); upgrade the client"
        ));
    }
    let crc = u32::from_be_bytes(batch[17..21].try_into().expect("4 bytes"));
    let actual = crc32c::crc32c(&batch[CRC_FROM..]);
    if crc != actual {
        return Err(format!("the record batch's CRC is {crc:#010x}, its bytes give {actual:#010x}"));
    }
    let base_offset = batch.get_i64();
    batch.advance(4);
    let partition_leader_epoch = batch.get_i32();
    batch.advance(1 + 4);
    let attributes = batch.get_i16();
    let compression = match attributes & COMPRESSION_MASK {
        0 => Compression::None,
        1 => Compression::Gzip,
        2 => Compression::Snappy,
        3 => Compression::Lz4,
        4 => Compression::Zstd,
        other => return Err(format!("compression type {other}, which Kafka does not define")),
    };
    let last_offset_delta = batch.get_i32();
    let base_timestamp = batch.get_i64();
    let max_timestamp = batch.get_i64();
    let producer_id = batch.get_i64();
    let producer_epoch = batch.get_i16();
    let base_sequence = batch.get_i32();
    let count = batch.get_i32();
    if count < 0 {
        return Err(format!("a record count of {count}"));
    }
    let log_append_time = attributes & TIMESTAMP_TYPE_LOG_APPEND != 0;
    let mut body = match compression {
        Compression::None => batch,
        compression => decompress(batch, compression)?,
    };
    // The smallest record is 7 bytes: no count can make the list larger than the bytes allow.
    let mut records = Vec::with_capacity((count as usize).min(body.len() / 7 + 1));
    for i in 0..count {
        let record = decode_record(&mut body, base_timestamp, log_append_time.then_some(max_timestamp))
            .map_err(|why| format!("record {i} of the batch: {why}"))?;
        records.push(record);
    }
    if !body.is_empty() {
        return Err(format!("{} bytes after the batch's {count} records", body.len()));
    }
    Ok(WireBatch {
        base_offset,
        partition_leader_epoch,
        compression,
        log_append_time,
        transactional: attributes & TRANSACTIONAL != 0,
        control: attributes & CONTROL != 0,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        records,
    })
}

fn decode_record(body: &mut Bytes, base_timestamp: i64, log_append_time: Option<i64>) -> Result<WireRecord, String> {
    let length = read_varint(body)?;
    if length < 0 || length as usize > body.len() {
        return Err(format!("a length of {length} with {} bytes left", body.len()));
    }
    let mut record = body.split_to(length as usize);
    if record.is_empty() {
        return Err("no attributes".into());
    }
    record.advance(1);
    let timestamp_delta = read_varlong(&mut record)?;
    let offset_delta = read_varint(&mut record)?;
    let key = read_nullable(&mut record, "key")?;
    let value = read_nullable(&mut record, "value")?;
    let header_count = read_varint(&mut record)?;
    if header_count < 0 {
        return Err(format!("a header count of {header_count}"));
    }
    // A header is at least 2 bytes.
    let mut headers = Vec::with_capacity((header_count as usize).min(record.len() / 2 + 1));
    for _ in 0..header_count {
        let name = read_nullable(&mut record, "header name")?.ok_or("a header with a null name")?;
        let name = String::from_utf8(name.to_vec()).map_err(|_| "a header name that is not UTF-8")?;
        let value = read_nullable(&mut record, "header value")?;
        headers.push((name, value));
    }
    if !record.is_empty() {
        return Err(format!("{} bytes after the record's fields", record.len()));
    }
    let timestamp = log_append_time.unwrap_or_else(|| base_timestamp.wrapping_add(timestamp_delta));
    Ok(WireRecord { timestamp, offset_delta, key, value, headers })
}

fn read_nullable(bytes: &mut Bytes, what: &str) -> Result<Option<Bytes>, String> {
    let length = read_varint(bytes)?;
    match length {
        -1 => Ok(None),
        length if length >= 0 && length as usize <= bytes.len() => Ok(Some(bytes.split_to(length as usize))),
        length => Err(format!("a {what} length of {length} with {} bytes left", bytes.len())),
    }
}

/// A zigzag varint of at most 5 bytes (an `i32`).
fn read_varint(bytes: &mut Bytes) -> Result<i32, String> {
    let raw = read_unsigned(bytes, 5)?;
    let raw = u32::try_from(raw).map_err(|_| "a varint past 32 bits".to_string())?;
    Ok(((raw >> 1) as i32) ^ -((raw & 1) as i32))
}

/// A zigzag varlong of at most 10 bytes (an `i64`).
fn read_varlong(bytes: &mut Bytes) -> Result<i64, String> {
    let raw = read_unsigned(bytes, 10)?;
    Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
}

fn read_unsigned(bytes: &mut Bytes, max_bytes: usize) -> Result<u64, String> {
    let mut value = 0u64;
    for i in 0..max_bytes {
        let Some(&byte) = bytes.first() else { return Err("a varint cut short".into()) };
        bytes.advance(1);
        value |= ((byte & 0x7f) as u64) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(format!("a varint longer than {max_bytes} bytes"))
}

fn put_varint(out: &mut BytesMut, value: i32) {
    put_unsigned(out, ((value << 1) ^ (value >> 31)) as u32 as u64);
}

fn put_varlong(out: &mut BytesMut, value: i64) {
    put_unsigned(out, ((value << 1) ^ (value >> 63)) as u64);
}

fn put_unsigned(out: &mut BytesMut, mut value: u64) {
    while value >= 0x80 {
        out.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

fn put_nullable(out: &mut BytesMut, bytes: Option<&[u8]>) {
    match bytes {
        Some(bytes) => {
            put_varint(out, bytes.len() as i32);
            out.put_slice(bytes);
        }
        None => put_varint(out, -1),
    }
}

/// One record to encode: its offset and timestamp are absolute, the batch makes them deltas.
pub struct Outgoing<'a> {
    pub offset: i64,
    pub timestamp: i64,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

/// Appends to `out` one uncompressed batch of `records` (at least one, in offset order), as a
/// broker serves them: no producer (-1), no sequence, stamped at creation time.
pub fn encode(out: &mut BytesMut, records: &[Outgoing<'_>]) {
    let (Some(first), Some(last)) = (records.first(), records.last()) else { return };
    let start = out.len();
    let max_timestamp = records.iter().map(|record| record.timestamp).max().unwrap_or(first.timestamp);
    out.put_i64(first.offset);
    out.put_i32(0); // batchLength, below
    out.put_i32(0); // partitionLeaderEpoch
    out.put_i8(MAGIC);
    out.put_u32(0); // crc, below
    out.put_i16(0); // attributes: no compression, create time, not transactional
    out.put_i32((last.offset - first.offset) as i32);
    out.put_i64(first.timestamp);
    out.put_i64(max_timestamp);
    out.put_i64(-1); // producerId
    out.put_i16(-1); // producerEpoch
    out.put_i32(-1); // baseSequence
    out.put_i32(records.len() as i32);
    let mut record_bytes = BytesMut::new();
    for record in records {
        record_bytes.clear();
        record_bytes.put_i8(0);
        put_varlong(&mut record_bytes, record.timestamp.wrapping_sub(first.timestamp));
        put_varint(&mut record_bytes, (record.offset - first.offset) as i32);
        put_nullable(&mut record_bytes, record.key);
        put_nullable(&mut record_bytes, record.value);
        put_varint(&mut record_bytes, record.headers.len() as i32);
        for (name, value) in &record.headers {
            put_nullable(&mut record_bytes, Some(name.as_bytes()));
            put_nullable(&mut record_bytes, *value);
        }
        put_varint(out, record_bytes.len() as i32);
        out.put_slice(&record_bytes);
    }
    let batch_length = (out.len() - start - LOG_OVERHEAD) as i32;
    out[start + 8..start + 12].copy_from_slice(&batch_length.to_be_bytes());
    let crc = crc32c::crc32c(&out[start + CRC_FROM..]);
    out[start + 17..start + 21].copy_from_slice(&crc.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression as TheirCompression, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, Record, RecordBatchDecoder,
        RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn no_decompression(_: Bytes, compression: Compression) -> Result<Bytes, String> {
        Err(format!("{compression:?}"))
    }

    #[test]
    fn varints_round_trip_at_their_edges_and_refuse_overlong_ones() {
        for value in [0, 1, -1, 63, -64, 64, 300, -300, i32::MAX, i32::MIN] {
            let mut out = BytesMut::new();
            put_varint(&mut out, value);
            assert_eq!(read_varint(&mut out.freeze()), Ok(value));
        }
        for value in [0, -1, i64::MAX, i64::MIN, 1 << 40] {
            let mut out = BytesMut::new();
            put_varlong(&mut out, value);
            assert_eq!(read_varlong(&mut out.freeze()), Ok(value));
        }
        assert!(read_varint(&mut Bytes::from_static(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x01])).is_err());
        assert!(read_varint(&mut Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x7f])).is_err(), "past 32 bits");
        assert!(read_varint(&mut Bytes::from_static(&[0x80])).is_err(), "cut short");
    }

    /// What we encode, another codec (kafka-protocol's) decodes to the same records, and what
    /// it encodes we decode: the two agree on the format.
    #[test]
    fn another_codec_reads_what_we_write_and_we_read_what_it_writes() {
        let headers = [("a", Some(&b"1"[..])), ("b", None)];
        let outgoing: Vec<Outgoing<'_>> = (0..3)
            .map(|i| Outgoing {
                offset: 100 + i * 2,
                timestamp: 1_700_000_000_000 + i,
                key: (i != 1).then_some(&b"key"[..]),
                value: (i != 2).then_some(&b"value"[..]),
                headers: headers.to_vec(),
            })
            .collect();
        let mut out = BytesMut::new();
        encode(&mut out, &outgoing);
        let set = RecordBatchDecoder::decode(&mut out.clone().freeze()).unwrap();
        let offsets: Vec<i64> = set.records.iter().map(|record| record.offset).collect();
        assert_eq!(offsets, [100, 102, 104]);
        assert_eq!(set.records[1].key, None);
        assert_eq!(set.records[2].value, None);
        assert_eq!(set.records[0].headers.get(&b"b"[..]), Some(&None));
        assert_eq!(set.records[2].timestamp, 1_700_000_000_002);
        let ours = decode(&mut out.freeze(), &no_decompression).unwrap();
        assert_eq!(ours.records.len(), 3);
        assert_eq!(ours.records[2].offset_delta, 4);
        assert_eq!(ours.records[0].headers, vec![("a".to_string(), Some(Bytes::from("1"))), ("b".into(), None)]);

        let theirs: Vec<Record> = (0..2)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: NO_PRODUCER_ID,
                producer_epoch: NO_PRODUCER_EPOCH,
                timestamp_type: TimestampType::Creation,
                offset: i,
                sequence: i as i32 - 1,
                timestamp: 5 + i,
                key: None,
                value: Some(Bytes::from_static(b"v")),
                headers: [(StrBytes::from_static_str("h"), None)].into_iter().collect(),
            })
            .collect();
        let mut out = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: TheirCompression::None };
        RecordBatchEncoder::encode(&mut out, &theirs, &options).unwrap();
        let ours = decode(&mut out.freeze(), &no_decompression).unwrap();
        assert_eq!((ours.base_offset, ours.last_offset_delta, ours.producer_id), (0, 1, -1));
        assert_eq!(ours.records[1].timestamp, 6);
        assert_eq!(ours.records[1].headers, vec![("h".to_string(), None)]);
    }

    #[test]
    fn every_cut_and_every_flipped_byte_is_refused_never_a_panic() {
        let outgoing = [Outgoing {
            offset: 0,
            timestamp: 1,
            key: Some(b"k"),
            value: Some(b"v"),
            headers: vec![("trace", Some(b"a")), ("trace", None)],
        }];
        let mut out = BytesMut::new();
        encode(&mut out, &outgoing);
        let whole = out.freeze();
        for len in 0..whole.len() {
            assert!(decode(&mut whole.slice(..len), &no_decompression).is_err(), "cut at {len}");
        }
        for at in 0..whole.len() {
            let mut flipped = whole.to_vec();
            flipped[at] ^= 0x40;
            // The CRC covers all but the first 21 bytes; a flip there changes what the batch
            // says it is, and is refused or decoded as such, never a panic.
            let _ = decode(&mut Bytes::from(flipped), &no_decompression);
        }
        // Counts and lengths on the wire larger than the bytes are refused before anything is
        // reserved for them.
        let mut huge = whole.to_vec();
        huge[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        let crc = crc32c::crc32c(&huge[CRC_FROM..]);
        huge[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(decode(&mut Bytes::from(huge), &no_decompression).unwrap_err().contains("record 1"));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // xorshift: reproducible mutations without a dependency.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut out = BytesMut::new();
        encode(
            &mut out,
            &[Outgoing { offset: 3, timestamp: 9, key: None, value: Some(b"v"), headers: vec![("n", None)] }],
        );
        let seed = out.freeze();
        for round in 0..20_000 {
            let mut bytes = seed.to_vec();
            for _ in 0..1 + next() % 3 {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] = next() as u8;
            }
            if round % 2 == 0 {
                // Make the CRC right, so the mutation reaches the record decoding.
                let crc = crc32c::crc32c(&bytes[CRC_FROM..]);
                bytes[17..21].copy_from_slice(&crc.to_be_bytes());
            }
            let _ = decode(&mut Bytes::from(bytes), &no_decompression);
        }
    }
}
