//! Fetch: records from each partition's offset, as record batches; a long poll waits on the
//! log's end offsets (woken when a batch becomes readable, never by polling the disk) until
//! `min_bytes` are there or `max_wait_ms` has passed.
//!
//! There are no fetch sessions (KIP-227): every answer is a full one with session id 0, which
//! clients take as "sessionless" and go on sending full requests. A transaction's records reach
//! a stream only when it commits ([`super::transactions`]): `read_committed` and
//! `read_uncommitted` read the same, the last stable offset is the end, and no aborted
//! transaction is ever listed.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::select_all;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::BrokerId;
use kafka_protocol::messages::fetch_request::FetchRequest;
use kafka_protocol::messages::fetch_response::{FetchResponse, FetchableTopicResponse, PartitionData};
use onehop_engine::{Position, Principal, Privilege, Stream};

use super::{RECORDS_FETCHED, Shared, errors, records};

/// Records one partition's read returns at most (its byte bound usually ends it first).
const PARTITION_RECORDS_MAX: usize = 10_000;
/// Largest answer, whatever the request's `max_bytes` (Kafka's broker setting
/// `fetch.max.bytes` has this default, 55 MiB).
const FETCH_BYTES_MAX: usize = 55 << 20;

/// The partitions asked for, by topic.
type Asked = Vec<(kafka_protocol::messages::TopicName, Vec<Wanted>)>;

/// A partition read, with the end offset it was read to: what a long poll waits on.
type ReadTo = (Arc<Stream>, u32, u64);

/// One partition asked for, as the request names it and as found.
struct Wanted {
    partition: i32,
    offset: i64,
    max_bytes: usize,
    /// The stream, or the error code for the topic (unknown, or not the client's to read).
    stream: Result<Arc<Stream>, i16>,
}

pub(super) async fn fetch(shared: &Shared, who: &Principal, request: FetchRequest) -> FetchResponse {
    let mut wanted: Asked = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let stream = super::stream_for(shared, who, Privilege::Read, topic.topic.0.as_str())
            .map_err(|error| errors::code(&error));
        let partitions = topic
            .partitions
            .iter()
            .map(|asked| Wanted {
                partition: asked.partition,
                offset: asked.fetch_offset,
                max_bytes: asked.partition_max_bytes.max(0) as usize,
                stream: stream.clone(),
            })
            .collect();
        wanted.push((topic.topic, partitions));
    }
    let wait = Duration::from_millis(request.max_wait_ms.max(0) as u64).min(shared.config.fetch_wait_max);
    let deadline = tokio::time::Instant::now() + wait;
    let min_bytes = request.min_bytes.max(0) as usize;
    let max_bytes = if request.max_bytes > 0 { request.max_bytes as usize } else { FETCH_BYTES_MAX };
    let max_bytes = max_bytes.min(FETCH_BYTES_MAX);
    let mut stop = shared.stop.clone();
    loop {
        let (response, bytes, ends) = read(&wanted, max_bytes);
        let waited_enough = tokio::time::Instant::now() >= deadline;
        if bytes >= min_bytes.max(1) || waited_enough || ends.is_empty() || *stop.borrow() {
            return response;
        }
        // Wait for any partition read to its end to grow, the deadline, or the server's stop.
        let grown =
            select_all(ends.into_iter().map(|(stream, partition, end)| {
                Box::pin(async move { stream.wait_for(partition, end).await.map(drop) })
            }));
        tokio::select! {
            _ = grown => {}
            () = tokio::time::sleep_until(deadline) => {}
            _ = stop.wait_for(|stop| *stop) => {}
        }
    }
}

/// One pass over the partitions: the answer, the bytes of records in it, and each partition
/// read with its end offset (a long poll waits for one of them to grow).
fn read(wanted: &Asked, max_bytes: usize) -> (FetchResponse, usize, Vec<ReadTo>) {
    let mut response = FetchResponse::default();
    let mut total = 0usize;
    let mut ends = Vec::new();
    for (name, partitions) in wanted {
        let mut topic = FetchableTopicResponse::default();
        topic.topic = name.clone();
        for asked in partitions {
            let mut data = PartitionData::default();
            data.partition_index = asked.partition;
            data.high_watermark = -1;
            data.last_stable_offset = -1;
            data.log_start_offset = -1;
            data.preferred_read_replica = BrokerId(-1);
            match read_partition(asked, max_bytes.saturating_sub(total), total == 0) {
                Err(code) => data.error_code = code,
                Ok(read) => {
                    data.high_watermark = read.end as i64;
                    data.last_stable_offset = read.end as i64;
                    data.log_start_offset = read.start as i64;
                    data.aborted_transactions = Some(Vec::new());
                    total += read.records.len();
                    if let Ok(stream) = &asked.stream {
                        ends.push((stream.clone(), asked.partition as u32, read.end));
                    }
                    data.records = Some(read.records);
                }
            }
            topic.partitions.push(data);
        }
        response.responses.push(topic);
    }
    (response, total, ends)
}

struct Read {
    records: Bytes,
    start: u64,
    end: u64,
}

/// Reads one partition: at most `budget` bytes, but at least one record when `first` (so a
/// record larger than the limits still gets through, as Kafka does).
fn read_partition(asked: &Wanted, budget: usize, first: bool) -> Result<Read, i16> {
    let stream = asked.stream.as_ref().map_err(|code| *code)?;
    let partition = u32::try_from(asked.partition).map_err(|_| ResponseError::UnknownTopicOrPartition.code())?;
    let start = stream.start_offset(partition).map_err(|error| errors::code(&error))?;
    let end = stream.end_offset(partition).map_err(|error| errors::code(&error))?;
    let offset = u64::try_from(asked.offset).map_err(|_| ResponseError::OffsetOutOfRange.code())?;
    if offset < start || offset > end {
        return Err(ResponseError::OffsetOutOfRange.code());
    }
    let budget = budget.min(asked.max_bytes);
    if offset == end || (budget == 0 && !first) {
        return Ok(Read { records: Bytes::new(), start, end });
    }
    let stored = stream
        .read(partition, Position::Offset(offset), PARTITION_RECORDS_MAX, budget.max(1))
        .map_err(|error| errors::code(&error))?;
    metrics::counter!(RECORDS_FETCHED).increment(stored.len() as u64);
    let records = records::encode(&stored);
    Ok(Read { records, start, end })
}
