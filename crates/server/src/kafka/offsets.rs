//! ListOffsets: a partition's earliest (-2) and latest (-1) offsets, or the first offset whose
//! record is at or after a timestamp (the log's time index); OffsetForLeaderEpoch.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::list_offsets_request::ListOffsetsRequest;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_for_leader_epoch_request::OffsetForLeaderEpochRequest;
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderEpochResponse, OffsetForLeaderTopicResult,
};
use onehop_engine::{Position, Principal, Privilege, Stream};

use super::{Shared, errors};

/// The timestamps that name a position rather than a time.
const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
/// The record with the largest timestamp (ListOffsets 7 on, KIP-734).
const MAX_TIMESTAMP: i64 = -3;
/// The first offset on local storage (ListOffsets 8 on, KIP-405): with no tiered storage,
/// the earliest.
const EARLIEST_LOCAL: i64 = -4;

pub(super) fn list_offsets(
    shared: &Shared,
    who: &Principal,
    request: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let mut response = ListOffsetsResponse::default();
    for topic in request.topics {
        let stream = super::stream_for(shared, who, Privilege::Read, topic.name.0.as_str());
        let mut answer = ListOffsetsTopicResponse::default();
        answer.name = topic.name;
        for asked in topic.partitions {
            let mut partition = ListOffsetsPartitionResponse::default();
            partition.partition_index = asked.partition_index;
            partition.timestamp = -1;
            partition.offset = -1;
            let found = match &stream {
                Err(error) => Err(errors::code(error)),
                Ok(stream) => lookup(stream, asked.partition_index, asked.timestamp),
            };
            match found {
                Ok((offset, timestamp)) => {
                    partition.offset = offset;
                    partition.timestamp = timestamp;
                    // Leader epochs exist from version 4 on.
                    if version >= 4 {
                        partition.leader_epoch = 0;
                    }
                }
                Err(code) => partition.error_code = code,
            }
            answer.partitions.push(partition);
        }
        response.topics.push(answer);
    }
    response
}

/// The offset and timestamp ListOffsets answers for `timestamp` in `partition`: (-1, -1) when
/// no record is that recent.
fn lookup(stream: &Stream, partition: i32, timestamp: i64) -> Result<(i64, i64), i16> {
    let partition = u32::try_from(partition).map_err(|_| ResponseError::UnknownTopicOrPartition.code())?;
    let code = |error: onehop_engine::EngineError| errors::code(&error);
    match timestamp {
        LATEST => Ok((stream.end_offset(partition).map_err(code)? as i64, -1)),
        EARLIEST | EARLIEST_LOCAL => Ok((stream.start_offset(partition).map_err(code)? as i64, -1)),
        MAX_TIMESTAMP => Ok(stream
            .max_timestamp(partition)
            .map_err(code)?
            .map_or((-1, -1), |(offset, timestamp)| (offset as i64, timestamp))),
        time if time >= 0 => {
            let offset = stream.resolve(partition, Position::Time(time)).map_err(code)?;
            // The time index answers the end when no record is that recent.
            let records = stream.read(partition, Position::Offset(offset), 1, 1).map_err(code)?;
            Ok(records.first().map_or((-1, -1), |record| (record.offset as i64, record.timestamp_ms)))
        }
        other => Err(if other < EARLIEST_LOCAL {
            ResponseError::UnsupportedVersion.code()
        } else {
            ResponseError::InvalidRequest.code()
        }),
    }
}

/// OffsetForLeaderEpoch: where each leader epoch ends. This server is every partition's only
/// leader, at epoch 0 from the partition's creation on (Metadata says so), so epoch 0 ends at
/// the log's end; a later epoch is one it has not reached (UNKNOWN_LEADER_EPOCH), and a
/// `current_leader_epoch` other than 0 or -1 (not given) is refused as Kafka's leader refuses
/// a stale or future one.
pub(super) fn offset_for_leader_epoch(
    shared: &Shared,
    who: &Principal,
    request: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut response = OffsetForLeaderEpochResponse::default();
    for topic in request.topics {
        let stream = super::stream_for(shared, who, Privilege::Read, topic.topic.0.as_str());
        let mut answer = OffsetForLeaderTopicResult::default();
        answer.topic = topic.topic;
        for asked in topic.partitions {
            let mut partition = EpochEndOffset::default();
            partition.partition = asked.partition;
            partition.leader_epoch = -1;
            partition.end_offset = -1;
            let end = match &stream {
                Err(error) => Err(errors::code(error)),
                Ok(stream) => u32::try_from(asked.partition)
                    .map_err(|_| ResponseError::UnknownTopicOrPartition.code())
                    .and_then(|index| stream.end_offset(index).map_err(|error| errors::code(&error))),
            };
            match end {
                Err(code) => partition.error_code = code,
                Ok(_) if asked.current_leader_epoch > 0 => {
                    partition.error_code = ResponseError::UnknownLeaderEpoch.code();
                }
                Ok(_) if asked.leader_epoch > 0 => partition.error_code = ResponseError::UnknownLeaderEpoch.code(),
                // Before the first epoch: Kafka's undefined epoch and offset, no error.
                Ok(_) if asked.leader_epoch < 0 => {}
                Ok(end) => {
                    partition.leader_epoch = 0;
                    partition.end_offset = end as i64;
                }
            }
            answer.partitions.push(partition);
        }
        response.topics.push(answer);
    }
    response
}
