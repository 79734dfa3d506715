//! The on-disk batch and record encoding (docs/log-format.md is the normative description).
//!
//! All integers are little-endian. A segment file is a sequence of batches; a batch is a
//! 48-byte header followed by its records. The CRC32C in the header covers every byte of the
//! batch after the CRC field itself, so a torn or flipped byte anywhere in the header tail or
//! the payload is detected.

use bytes::{Buf, Bytes};

use crate::error::DecodeError;
use crate::headers::Headers;
use crate::text::Text;

/// The first four bytes of every batch: `O`, `H`, `B`, `1`.
pub const BATCH_MAGIC: u32 = u32::from_le_bytes(*b"OHB1");
/// The batch format version this code writes and reads.
pub const BATCH_VERSION: u16 = 1;
/// Batch attribute: a header value length of `u32::MAX` in this batch means a null value (a
/// Kafka header with no value), not a length. Set only on batches that hold one, so that every
/// other batch stays readable by a reader that knows no attributes.
pub const ATTR_NULL_HEADER_VALUES: u16 = 0x0001;
/// The attributes this code knows; a batch with any other bit set was written by a newer
/// writer, and is refused (never taken for damage).
const ATTRIBUTES_KNOWN: u16 = ATTR_NULL_HEADER_VALUES;
/// The header value length that stands for a null value (see [`ATTR_NULL_HEADER_VALUES`]).
pub(crate) const NULL_VALUE_LEN: u32 = u32::MAX;
/// Size of the fixed batch header.
pub const BATCH_HEADER_BYTES: usize = 48;
/// The CRC covers the batch from this byte on.
const CRC_START: usize = 8;

/// Record flag: a key follows.
const FLAG_KEY: u8 = 1;
/// Record flag: a subject follows.
const FLAG_SUBJECT: u8 = 2;
/// Record flag: a value follows (a record without one is a tombstone).
const FLAG_VALUE: u8 = 4;
const FLAGS_KNOWN: u8 = FLAG_KEY | FLAG_SUBJECT | FLAG_VALUE;

/// Bytes of a record before its variable fields: length, offset delta, timestamp, flags.
pub const RECORD_FIXED_BYTES: usize = 4 + 4 + 8 + 1;
/// Position of the offset delta inside an encoded record (after the length prefix).
const RECORD_OFFSET_DELTA_AT: usize = 4;

/// Subjects and header names carry a u16 length on disk.
pub const SUBJECT_BYTES_MAX: usize = u16::MAX as usize;
/// A record carries at most this many headers (the count is a u16 on disk).
pub const HEADERS_MAX: usize = u16::MAX as usize;

/// A record as stored and read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub offset: u64,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    pub key: Option<Bytes>,
    /// A `/`-separated topic such as `scores/team-42`.
    pub subject: Option<Text>,
    pub headers: Headers,
    /// `None` is a tombstone: on a compacted partition it deletes its key.
    pub value: Option<Bytes>,
}

/// A record to append; the log assigns its offset, and its timestamp when none is given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NewRecord {
    pub timestamp_ms: Option<i64>,
    pub key: Option<Bytes>,
    pub subject: Option<Text>,
    /// In order; names may repeat, and a value may be null (`None`, as Kafka allows).
    pub headers: Vec<(Text, Option<Bytes>)>,
    pub value: Option<Bytes>,
}

impl NewRecord {
    /// A record with just a value.
    pub fn value(value: impl Into<Bytes>) -> Self {
        NewRecord { value: Some(value.into()), ..Default::default() }
    }

    /// A record with a key and a value.
    pub fn keyed(key: impl Into<Bytes>, value: impl Into<Bytes>) -> Self {
        NewRecord { key: Some(key.into()), value: Some(value.into()), ..Default::default() }
    }

    /// A tombstone for `key`: on a compacted partition it deletes the key.
    pub fn tombstone(key: impl Into<Bytes>) -> Self {
        NewRecord { key: Some(key.into()), ..Default::default() }
    }

    /// Whether a header of this record has a null value (its batch then carries
    /// [`ATTR_NULL_HEADER_VALUES`]).
    pub fn has_null_header(&self) -> bool {
        self.headers.iter().any(|(_, value)| value.is_none())
    }

    /// The number of bytes this record takes on disk.
    pub fn encoded_len(&self) -> usize {
        let mut len = RECORD_FIXED_BYTES + 2;
        if let Some(key) = &self.key {
            len += 4 + key.len();
        }
        if let Some(subject) = &self.subject {
            len += 2 + subject.len();
        }
        for (name, value) in &self.headers {
            len += 2 + name.len() + 4 + value.as_ref().map_or(0, Bytes::len);
        }
        if let Some(value) = &self.value {
            len += 4 + value.len();
        }
        len
    }
}

/// The decoded fixed header of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchHeader {
    pub crc: u32,
    /// Header plus payload.
    pub batch_len: u32,
    /// Known bits only ([`ATTR_NULL_HEADER_VALUES`]).
    pub attributes: u16,
    pub base_offset: u64,
    pub last_offset_delta: u32,
    pub record_count: u32,
    pub first_timestamp_ms: i64,
    pub max_timestamp_ms: i64,
}

impl BatchHeader {
    /// Parses the fixed header, checking what can be checked without the payload.
    pub fn parse(bytes: &[u8]) -> Result<BatchHeader, DecodeError> {
        if bytes.len() < BATCH_HEADER_BYTES {
            return Err(DecodeError::Truncated);
        }
        let mut buf = &bytes[..BATCH_HEADER_BYTES];
        let magic = buf.get_u32_le();
        if magic != BATCH_MAGIC {
            return Err(DecodeError::BadMagic(magic));
        }
        let crc = buf.get_u32_le();
        let batch_len = buf.get_u32_le();
        let version = buf.get_u16_le();
        let attributes = buf.get_u16_le();
        let header = BatchHeader {
            crc,
            batch_len,
            attributes,
            base_offset: buf.get_u64_le(),
            last_offset_delta: buf.get_u32_le(),
            record_count: buf.get_u32_le(),
            first_timestamp_ms: buf.get_i64_le(),
            max_timestamp_ms: buf.get_i64_le(),
        };
        if version != BATCH_VERSION {
            return Err(DecodeError::BadVersion(version));
        }
        // A bit this reader does not know means a newer writer's feature.
        if attributes & !ATTRIBUTES_KNOWN != 0 {
            return Err(DecodeError::BadAttributes(attributes));
        }
        if (batch_len as usize) < BATCH_HEADER_BYTES {
            return Err(DecodeError::BadLength(batch_len));
        }
        if header.record_count == 0 || header.last_offset_delta < header.record_count - 1 {
            return Err(DecodeError::BadCount);
        }
        if header.base_offset.checked_add(header.last_offset_delta as u64 + 1).is_none() {
            return Err(DecodeError::BadCount);
        }
        Ok(header)
    }

    /// Whether a header value length of `u32::MAX` in this batch stands for a null value.
    pub fn null_header_values(&self) -> bool {
        self.attributes & ATTR_NULL_HEADER_VALUES != 0
    }

    /// The offset after the last record of the batch.
    pub fn next_offset(&self) -> u64 {
        self.base_offset + self.last_offset_delta as u64 + 1
    }

    /// Whether `bytes` is a whole batch of any version whose CRC holds: the magic, CRC and
    /// length keep their places in every version, so a batch a newer writer wrote can be told
    /// from damage without knowing its layout.
    pub(crate) fn any_version_intact(bytes: &[u8]) -> bool {
        bytes.len() >= BATCH_HEADER_BYTES
            && bytes[0..4] == BATCH_MAGIC.to_le_bytes()
            && u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize == bytes.len()
            && u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes")) == crc32c::crc32c(&bytes[CRC_START..])
    }

    /// Checks the CRC of a whole batch (`bytes.len() == batch_len`).
    pub fn verify(&self, bytes: &[u8]) -> Result<(), DecodeError> {
        debug_assert_eq!(bytes.len(), self.batch_len as usize);
        let actual = crc32c::crc32c(&bytes[CRC_START..]);
        if actual != self.crc {
            return Err(DecodeError::BadCrc { expected: self.crc, actual });
        }
        Ok(())
    }
}

/// Appends one encoded record (offset delta 0, patched later by [`BatchBuilder`]).
pub fn encode_record(out: &mut Vec<u8>, record: &NewRecord, timestamp_ms: i64) {
    let len = record.encoded_len();
    out.reserve(len);
    out.extend_from_slice(&((len - 4) as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&timestamp_ms.to_le_bytes());
    let mut flags = 0;
    if record.key.is_some() {
        flags |= FLAG_KEY;
    }
    if record.subject.is_some() {
        flags |= FLAG_SUBJECT;
    }
    if record.value.is_some() {
        flags |= FLAG_VALUE;
    }
    out.push(flags);
    if let Some(key) = &record.key {
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
    }
    if let Some(subject) = &record.subject {
        out.extend_from_slice(&(subject.len() as u16).to_le_bytes());
        out.extend_from_slice(subject.as_bytes());
    }
    out.extend_from_slice(&(record.headers.len() as u16).to_le_bytes());
    for (name, value) in &record.headers {
        out.extend_from_slice(&(name.len() as u16).to_le_bytes());
        out.extend_from_slice(name.as_bytes());
        match value {
            Some(value) => {
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
            }
            None => out.extend_from_slice(&NULL_VALUE_LEN.to_le_bytes()),
        }
    }
    if let Some(value) = &record.value {
        out.extend_from_slice(&(value.len() as u32).to_le_bytes());
        out.extend_from_slice(value);
    }
}

/// Builds one batch in a reusable buffer: header placeholder, records, then `finish` fills the
/// header and CRC. Offset deltas of pre-encoded records are patched as they are added.
pub struct BatchBuilder<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
    base_offset: u64,
    last_offset_delta: u32,
    record_count: u32,
    first_timestamp_ms: i64,
    max_timestamp_ms: i64,
    attributes: u16,
}

impl<'a> BatchBuilder<'a> {
    pub fn new(out: &'a mut Vec<u8>, base_offset: u64) -> Self {
        let start = out.len();
        out.resize(start + BATCH_HEADER_BYTES, 0);
        BatchBuilder {
            out,
            start,
            base_offset,
            last_offset_delta: 0,
            record_count: 0,
            first_timestamp_ms: 0,
            max_timestamp_ms: i64::MIN,
            attributes: 0,
        }
    }

    /// Marks the batch as holding a null header value: to be called when records given to
    /// [`Self::push_encoded`] have one ([`NewRecord::has_null_header`]).
    pub fn holds_null_header_values(&mut self) {
        self.attributes |= ATTR_NULL_HEADER_VALUES;
    }

    /// Bytes written so far, header included.
    pub fn len(&self) -> usize {
        self.out.len() - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.record_count == 0
    }

    /// Adds already-encoded records (from [`encode_record`]) that take dense offsets starting at
    /// `first_offset`. `encoded` holds `count` records back to back.
    pub fn push_encoded(&mut self, encoded: &[u8], first_offset: u64, count: u32, first_ts: i64, max_ts: i64) {
        let at = self.out.len();
        self.out.extend_from_slice(encoded);
        let mut position = at;
        let first_delta = (first_offset - self.base_offset) as u32;
        for delta in first_delta..first_delta + count {
            let len = u32::from_le_bytes(self.out[position..position + 4].try_into().unwrap()) as usize;
            let delta_at = position + RECORD_OFFSET_DELTA_AT;
            self.out[delta_at..delta_at + 4].copy_from_slice(&delta.to_le_bytes());
            position += 4 + len;
        }
        debug_assert_eq!(position, self.out.len(), "encoded records must fill the slice exactly");
        self.note_records(first_offset + count as u64 - 1, count, first_ts, max_ts);
    }

    /// Adds one record read back from the log, keeping its offset and timestamp (compaction).
    pub fn push_record(&mut self, record: &Record) {
        let new = NewRecord {
            timestamp_ms: Some(record.timestamp_ms),
            key: record.key.clone(),
            subject: record.subject.clone(),
            headers: record.headers.to_vec(),
            value: record.value.clone(),
        };
        if record.headers.has_null() {
            self.holds_null_header_values();
        }
        let at = self.out.len();
        encode_record(self.out, &new, record.timestamp_ms);
        let delta = (record.offset - self.base_offset) as u32;
        let delta_at = at + RECORD_OFFSET_DELTA_AT;
        self.out[delta_at..delta_at + 4].copy_from_slice(&delta.to_le_bytes());
        self.note_records(record.offset, 1, record.timestamp_ms, record.timestamp_ms);
    }

    fn note_records(&mut self, last_offset: u64, count: u32, first_ts: i64, max_ts: i64) {
        if self.record_count == 0 {
            self.first_timestamp_ms = first_ts;
        }
        self.record_count += count;
        self.last_offset_delta = (last_offset - self.base_offset) as u32;
        self.max_timestamp_ms = self.max_timestamp_ms.max(max_ts);
    }

    /// Writes the header and CRC; returns the header.
    pub fn finish(self) -> BatchHeader {
        assert!(self.record_count > 0, "a batch holds at least one record");
        let batch_len = (self.out.len() - self.start) as u32;
        let header = &mut self.out[self.start..self.start + BATCH_HEADER_BYTES];
        header[0..4].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
        header[8..12].copy_from_slice(&batch_len.to_le_bytes());
        header[12..14].copy_from_slice(&BATCH_VERSION.to_le_bytes());
        header[14..16].copy_from_slice(&self.attributes.to_le_bytes());
        header[16..24].copy_from_slice(&self.base_offset.to_le_bytes());
        header[24..28].copy_from_slice(&self.last_offset_delta.to_le_bytes());
        header[28..32].copy_from_slice(&self.record_count.to_le_bytes());
        header[32..40].copy_from_slice(&self.first_timestamp_ms.to_le_bytes());
        header[40..48].copy_from_slice(&self.max_timestamp_ms.to_le_bytes());
        let crc = crc32c::crc32c(&self.out[self.start + CRC_START..]);
        self.out[self.start + 4..self.start + 8].copy_from_slice(&crc.to_le_bytes());
        BatchHeader {
            crc,
            batch_len,
            attributes: self.attributes,
            base_offset: self.base_offset,
            last_offset_delta: self.last_offset_delta,
            record_count: self.record_count,
            first_timestamp_ms: self.first_timestamp_ms,
            max_timestamp_ms: self.max_timestamp_ms,
        }
    }
}

/// Decodes every record of a verified batch. `batch` is the whole batch, header included.
pub fn decode_records(header: &BatchHeader, batch: &Bytes) -> Result<Vec<Record>, DecodeError> {
    let mut records = Vec::with_capacity(header.record_count.min(4096) as usize);
    let mut payload = batch.slice(BATCH_HEADER_BYTES..);
    let mut previous_delta: Option<u32> = None;
    for _ in 0..header.record_count {
        let record = decode_record(header.base_offset, header.null_header_values(), &mut payload)?;
        let delta = (record.offset - header.base_offset) as u32;
        if previous_delta.is_some_and(|previous| delta <= previous) || delta > header.last_offset_delta {
            return Err(DecodeError::BadOffsetDelta(delta));
        }
        previous_delta = Some(delta);
        records.push(record);
    }
    if payload.has_remaining() {
        return Err(DecodeError::TrailingBytes(payload.remaining()));
    }
    if previous_delta != Some(header.last_offset_delta) {
        return Err(DecodeError::BadCount);
    }
    Ok(records)
}

/// The records of a verified batch (`batch` whole, header included) from offset `from` on,
/// decoded one at a time as they are taken. Records before `from` are stepped over by their
/// length prefix, not decoded, so a read wanting a few records of a large batch pays for those
/// few. The checks of [`decode_records`] apply to every record reached; the count and trailing
/// bytes are checked when the iteration reaches the batch's end.
pub fn records_from(header: &BatchHeader, batch: &Bytes, from: u64) -> RecordsFrom {
    RecordsFrom {
        base_offset: header.base_offset,
        null_values: header.null_header_values(),
        last_offset_delta: header.last_offset_delta,
        payload: batch.slice(BATCH_HEADER_BYTES.min(batch.len())..),
        left: header.record_count,
        previous_delta: None,
        from,
        failed: false,
    }
}

pub struct RecordsFrom {
    base_offset: u64,
    null_values: bool,
    last_offset_delta: u32,
    payload: Bytes,
    left: u32,
    previous_delta: Option<u32>,
    from: u64,
    failed: bool,
}

impl RecordsFrom {
    /// Whether every record of the batch has been taken.
    pub(crate) fn is_done(&self) -> bool {
        self.left == 0 || self.failed
    }

    fn step(&mut self) -> Result<Option<Record>, DecodeError> {
        loop {
            if self.left == 0 {
                if self.payload.has_remaining() {
                    return Err(DecodeError::TrailingBytes(self.payload.remaining()));
                }
                if self.previous_delta != Some(self.last_offset_delta) {
                    return Err(DecodeError::BadCount);
                }
                return Ok(None);
            }
            self.left -= 1;
            // A record is its length (u32) and then its body, which starts with its offset delta.
            if self.payload.remaining() < 8 {
                return Err(DecodeError::Truncated);
            }
            let len = u32::from_le_bytes(self.payload[..4].try_into().expect("4 bytes")) as usize;
            let delta = u32::from_le_bytes(self.payload[4..8].try_into().expect("4 bytes"));
            if self.previous_delta.is_some_and(|previous| delta <= previous) || delta > self.last_offset_delta {
                return Err(DecodeError::BadOffsetDelta(delta));
            }
            self.previous_delta = Some(delta);
            if self.base_offset + (delta as u64) < self.from {
                if self.payload.remaining() < 4 + len {
                    return Err(DecodeError::Truncated);
                }
                self.payload.advance(4 + len);
                continue;
            }
            return decode_record(self.base_offset, self.null_values, &mut self.payload).map(Some);
        }
    }
}

impl Iterator for RecordsFrom {
    type Item = Result<Record, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let step = self.step();
        self.failed = step.is_err();
        step.transpose()
    }
}

fn take(buf: &mut Bytes, len: usize) -> Result<Bytes, DecodeError> {
    if buf.remaining() < len {
        return Err(DecodeError::Truncated);
    }
    Ok(buf.split_to(len))
}

fn take_u16(buf: &mut Bytes) -> Result<u16, DecodeError> {
    if buf.remaining() < 2 {
        return Err(DecodeError::Truncated);
    }
    Ok(buf.get_u16_le())
}

fn take_u32(buf: &mut Bytes) -> Result<u32, DecodeError> {
    if buf.remaining() < 4 {
        return Err(DecodeError::Truncated);
    }
    Ok(buf.get_u32_le())
}

/// A string of the batch, shared with it: checked, not copied.
fn take_text(buf: &mut Bytes, len: usize) -> Result<Text, DecodeError> {
    Text::from_utf8(take(buf, len)?).map_err(|_| DecodeError::BadUtf8)
}

/// One record; `null_values`: the batch allows null header values.
fn decode_record(base_offset: u64, null_values: bool, payload: &mut Bytes) -> Result<Record, DecodeError> {
    let len = take_u32(payload)? as usize;
    let mut body = take(payload, len)?;
    if body.remaining() < RECORD_FIXED_BYTES - 4 {
        return Err(DecodeError::Truncated);
    }
    let delta = body.get_u32_le();
    let timestamp_ms = body.get_i64_le();
    let flags = body.get_u8();
    if flags & !FLAGS_KNOWN != 0 {
        return Err(DecodeError::BadFlags(flags));
    }
    let key = if flags & FLAG_KEY != 0 {
        let key_len = take_u32(&mut body)? as usize;
        Some(take(&mut body, key_len)?)
    } else {
        None
    };
    let subject = if flags & FLAG_SUBJECT != 0 {
        let subject_len = take_u16(&mut body)? as usize;
        Some(take_text(&mut body, subject_len)?)
    } else {
        None
    };
    let headers = Headers::take(&mut body, null_values)?;
    let value = if flags & FLAG_VALUE != 0 {
        let value_len = take_u32(&mut body)? as usize;
        Some(take(&mut body, value_len)?)
    } else {
        None
    };
    if body.has_remaining() {
        return Err(DecodeError::TrailingBytes(body.remaining()));
    }
    Ok(Record { offset: base_offset + delta as u64, timestamp_ms, key, subject, headers, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(i: u64) -> NewRecord {
        NewRecord {
            timestamp_ms: None,
            key: i.is_multiple_of(2).then(|| Bytes::from(format!("key-{i}"))),
            subject: i.is_multiple_of(3).then(|| format!("scores/team-{i}").into()),
            headers: vec![("h".into(), Some(Bytes::from_static(b"v")))],
            value: (!i.is_multiple_of(5)).then(|| Bytes::from(vec![i as u8; i as usize])),
        }
    }

    #[test]
    fn a_batch_with_a_null_header_value_says_so_and_keeps_repeats_in_order() {
        let with_null = NewRecord {
            headers: vec![
                ("trace".into(), Some(Bytes::from_static(b"a"))),
                ("trace".into(), None),
                ("trace".into(), Some(Bytes::new())),
            ],
            ..NewRecord::value("v")
        };
        assert!(with_null.has_null_header() && !sample(1).has_null_header());
        for (records, null) in [(vec![sample(1), with_null.clone()], true), (vec![sample(1), sample(2)], false)] {
            let mut encoded = Vec::new();
            for record in &records {
                encode_record(&mut encoded, record, 5);
            }
            let mut out = Vec::new();
            let mut builder = BatchBuilder::new(&mut out, 0);
            builder.push_encoded(&encoded, 0, 2, 5, 5);
            if records.iter().any(NewRecord::has_null_header) {
                builder.holds_null_header_values();
            }
            let header = builder.finish();
            assert_eq!(header.null_header_values(), null);
            // Only a batch that holds a null value carries the attribute: every other batch is
            // as a reader that knows no attributes expects it.
            assert_eq!(u16::from_le_bytes([out[14], out[15]]), if null { ATTR_NULL_HEADER_VALUES } else { 0 });
            let batch = Bytes::from(out);
            let parsed = BatchHeader::parse(&batch).unwrap();
            assert_eq!(parsed, header);
            let decoded = decode_records(&parsed, &batch).unwrap();
            assert_eq!(decoded[1].headers.to_vec(), records[1].headers);
        }
        // The same bytes in a batch without the attribute are refused: the length runs past
        // the record.
        let mut encoded = Vec::new();
        encode_record(&mut encoded, &with_null, 5);
        let mut out = Vec::new();
        let mut builder = BatchBuilder::new(&mut out, 0);
        builder.push_encoded(&encoded, 0, 1, 5, 5);
        let header = builder.finish();
        assert!(decode_records(&header, &Bytes::from(out)).is_err());
    }

    #[test]
    fn an_unknown_attribute_is_refused_but_told_from_damage() {
        let mut encoded = Vec::new();
        encode_record(&mut encoded, &sample(1), 5);
        let mut out = Vec::new();
        let mut builder = BatchBuilder::new(&mut out, 0);
        builder.push_encoded(&encoded, 0, 1, 5, 5);
        builder.finish();
        // A newer writer's bit, with the CRC made right.
        out[14] = 0x02;
        let crc = crc32c::crc32c(&out[CRC_START..]);
        out[4..8].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(BatchHeader::parse(&out), Err(DecodeError::BadAttributes(0x02)));
        assert!(BatchHeader::any_version_intact(&out));
        out[60] ^= 1;
        assert!(!BatchHeader::any_version_intact(&out), "a flipped byte is damage");
    }

    #[test]
    fn batch_round_trip() {
        let mut encoded = Vec::new();
        for i in 0..10 {
            let before = encoded.len();
            encode_record(&mut encoded, &sample(i), 1000 + i as i64);
            assert_eq!(encoded.len() - before, sample(i).encoded_len());
        }
        let mut out = vec![0xAA; 3]; // a batch need not start at position 0 of the buffer
        let mut builder = BatchBuilder::new(&mut out, 100);
        builder.push_encoded(&encoded, 100, 10, 1000, 1009);
        let header = builder.finish();
        let batch = Bytes::copy_from_slice(&out[3..]);
        let parsed = BatchHeader::parse(&batch).unwrap();
        assert_eq!(parsed, header);
        parsed.verify(&batch).unwrap();
        assert_eq!(parsed.next_offset(), 110);
        let records = decode_records(&parsed, &batch).unwrap();
        for (i, record) in records.iter().enumerate() {
            let expected = sample(i as u64);
            assert_eq!(record.offset, 100 + i as u64);
            assert_eq!(record.timestamp_ms, 1000 + i as i64);
            assert_eq!(record.key, expected.key);
            assert_eq!(record.subject, expected.subject);
            assert_eq!(record.headers.to_vec(), expected.headers);
            assert_eq!(record.value, expected.value);
        }
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let mut encoded = Vec::new();
        encode_record(&mut encoded, &sample(7), 5);
        let mut out = Vec::new();
        let mut builder = BatchBuilder::new(&mut out, 0);
        builder.push_encoded(&encoded, 0, 1, 5, 5);
        builder.finish();
        for at in 0..out.len() {
            let mut bad = out.clone();
            bad[at] ^= 0x40;
            let caught = match BatchHeader::parse(&bad) {
                Err(_) => true,
                Ok(header) => header.batch_len as usize != bad.len() || header.verify(&bad).is_err(),
            };
            assert!(caught, "flip at byte {at} went unnoticed");
        }
    }

    #[test]
    fn sparse_offsets_survive_rewrite() {
        let records: Vec<Record> = [3u64, 7, 8]
            .iter()
            .map(|&offset| Record {
                offset,
                timestamp_ms: offset as i64,
                key: Some(Bytes::from(format!("k{offset}"))),
                subject: None,
                headers: Headers::default(),
                value: None,
            })
            .collect();
        let mut out = Vec::new();
        let mut builder = BatchBuilder::new(&mut out, 3);
        for record in &records {
            builder.push_record(record);
        }
        let header = builder.finish();
        assert_eq!(header.next_offset(), 9);
        assert_eq!(header.record_count, 3);
        let batch = Bytes::from(out);
        assert_eq!(decode_records(&header, &batch).unwrap(), records);
        // Reading from any offset gives the records from there, stepping over the others.
        for from in 0..=10 {
            let read: Vec<Record> = records_from(&header, &batch, from).collect::<Result<_, _>>().unwrap();
            let want: Vec<Record> = records.iter().filter(|record| record.offset >= from).cloned().collect();
            assert_eq!(read, want, "from {from}");
        }
        // A batch claiming more records than it holds fails at its end, as a whole decode does.
        let mut short = header;
        short.record_count = 4;
        assert!(decode_records(&short, &batch).is_err());
        assert!(records_from(&short, &batch, 8).any(|record| record.is_err()));
    }

    /// The batch that docs/log-format.md takes apart byte by byte ("A worked example"): one record
    /// at offset 42 with key `k`, subject `a/b`, no headers and value `v`. If the encoding
    /// changes, this fails; update the hex dump here and in the document together.
    #[test]
    fn documented_example_bytes() {
        const TIMESTAMP_MS: i64 = 1_700_000_000_000; // 2023-11-14T22:13:20Z
        const EXPECTED: &str = "
            4f 48 42 31 a9 7c 11 db 52 00 00 00 01 00 00 00
            2a 00 00 00 00 00 00 00 00 00 00 00 01 00 00 00
            00 68 e5 cf 8b 01 00 00 00 68 e5 cf 8b 01 00 00
            1e 00 00 00 00 00 00 00 00 68 e5 cf 8b 01 00 00
            07 01 00 00 00 6b 03 00 61 2f 62 00 00 01 00 00
            00 76
        ";
        let record = NewRecord {
            timestamp_ms: Some(TIMESTAMP_MS),
            key: Some(Bytes::from_static(b"k")),
            subject: Some("a/b".into()),
            headers: vec![],
            value: Some(Bytes::from_static(b"v")),
        };
        let mut encoded = Vec::new();
        encode_record(&mut encoded, &record, TIMESTAMP_MS);
        let mut out = Vec::new();
        let mut builder = BatchBuilder::new(&mut out, 42);
        builder.push_encoded(&encoded, 42, 1, TIMESTAMP_MS, TIMESTAMP_MS);
        let header = builder.finish();

        // The dump as it appears in the document: 16 bytes per line, lowercase, space-separated.
        let dump: String = out
            .chunks(16)
            .map(|line| line.iter().map(|byte| format!("{byte:02x}")).collect::<Vec<_>>().join(" ") + "\n")
            .collect();
        let squeeze = |text: &str| text.split_whitespace().collect::<String>();
        assert_eq!(squeeze(&dump), squeeze(EXPECTED), "the encoding changed; the bytes are now:\n{dump}");
        let document = include_str!("../../../docs/log-format.md");
        assert!(
            squeeze(document).contains(&squeeze(EXPECTED)),
            "docs/log-format.md must show the example batch exactly as:\n{dump}"
        );

        let batch = Bytes::from(out);
        let parsed = BatchHeader::parse(&batch).unwrap();
        parsed.verify(&batch).unwrap();
        assert_eq!(parsed, header);
        assert_eq!((parsed.batch_len, parsed.base_offset, parsed.record_count), (82, 42, 1));
        let expected = Record {
            offset: 42,
            timestamp_ms: TIMESTAMP_MS,
            key: record.key.clone(),
            subject: record.subject.clone(),
            headers: Headers::default(),
            value: record.value.clone(),
        };
        assert_eq!(decode_records(&parsed, &batch).unwrap(), vec![expected]);
    }

    proptest::proptest! {
        /// Whatever the bytes, decoding answers with records or an error, never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            if let Ok(header) = BatchHeader::parse(&bytes) {
                let len = (header.batch_len as usize).min(bytes.len());
                let batch = Bytes::copy_from_slice(&bytes[..len]);
                if len == header.batch_len as usize {
                    let _ = header.verify(&batch);
                    let _ = decode_records(&header, &batch);
                }
            }
        }

        /// A valid batch with bytes overwritten: the CRC or the parser catches it, or (when the
        /// write changed nothing) it decodes to the same records.
        #[test]
        fn mutated_batches_are_caught(
            values in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40), 1..6),
            edits in proptest::collection::vec((proptest::prelude::any::<usize>(), proptest::prelude::any::<u8>()), 1..4),
        ) {
            let mut encoded = Vec::new();
            for value in &values {
                encode_record(&mut encoded, &NewRecord::keyed("k", value.clone()), 7);
            }
            let mut out = Vec::new();
            let mut builder = BatchBuilder::new(&mut out, 10);
            builder.push_encoded(&encoded, 10, values.len() as u32, 7, 7);
            builder.finish();
            let original = out.clone();
            for (at, byte) in edits {
                let at = at % out.len();
                out[at] = byte;
            }
            let outcome = BatchHeader::parse(&out).and_then(|header| {
                if header.batch_len as usize != out.len() {
                    return Err(DecodeError::BadLength(header.batch_len));
                }
                let batch = Bytes::copy_from_slice(&out);
                header.verify(&batch)?;
                decode_records(&header, &batch)
            });
            if let Ok(records) = outcome {
                proptest::prop_assert_eq!(&out, &original, "a changed batch passed every check");
                proptest::prop_assert_eq!(records.len(), values.len());
            }
        }
    }
}
