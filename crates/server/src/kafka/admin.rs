//! DeleteRecords and DescribeLogDirs: what Kafka's `kafka-delete-records` and
//! `kafka-log-dirs` tools ask.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::delete_records_request::DeleteRecordsRequest;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsResponse, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::describe_log_dirs_request::DescribeLogDirsRequest;
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResponse, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::protocol::StrBytes;
use onehop_engine::{Principal, Privilege};

use super::{Shared, errors};

/// DeleteRecords: each partition's records before the offset given (-1: its end) are deleted,
/// and the answer is its new start (Kafka's low watermark). Deleting records takes ADMIN on
/// the topic (Kafka's DELETE).
pub(super) fn delete_records(shared: &Shared, who: &Principal, request: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let mut response = DeleteRecordsResponse::default();
    for topic in request.topics {
        let stream = super::stream_for(shared, who, Privilege::Admin, topic.name.0.as_str());
        let mut answer = DeleteRecordsTopicResult::default();
        answer.name = topic.name;
        for asked in topic.partitions {
            let mut partition = DeleteRecordsPartitionResult::default();
            partition.partition_index = asked.partition_index;
            partition.low_watermark = -1;
            let deleted = match (&stream, u32::try_from(asked.partition_index)) {
                (Err(error), _) => Err(errors::code(error)),
                (Ok(_), Err(_)) => Err(ResponseError::UnknownTopicOrPartition.code()),
                (Ok(stream), Ok(index)) => {
                    stream.end_offset(index).map_err(|error| errors::code(&error)).and_then(|end| {
                        let before = match asked.offset {
                            -1 => end,
                            offset if offset >= 0 && offset as u64 <= end => offset as u64,
                            _ => return Err(ResponseError::OffsetOutOfRange.code()),
                        };
                        stream.delete_before(index, before).map_err(|error| errors::code(&error))
                    })
                }
            };
            match deleted {
                Ok(start) => partition.low_watermark = start as i64,
                Err(code) => partition.error_code = code,
            }
            answer.partitions.push(partition);
        }
        response.topics.push(answer);
    }
    response
}

/// DescribeLogDirs: the one log directory, with the size of each partition asked for (every
/// topic's, when none is named) that `who` may see. Sizes of the disk are not known here
/// (-1, as Kafka answers then).
pub(super) fn describe_log_dirs(
    shared: &Shared,
    who: &Principal,
    request: DescribeLogDirsRequest,
) -> DescribeLogDirsResponse {
    let engine = &shared.engine;
    let asked: Vec<(String, Option<Vec<i32>>)> = match request.topics {
        None => engine.streams().iter().map(|stream| (stream.name().to_string(), None)).collect(),
        Some(topics) => topics.into_iter().map(|topic| (topic.topic.0.to_string(), Some(topic.partitions))).collect(),
    };
    let mut result = DescribeLogDirsResult::default();
    result.log_dir = StrBytes::from_string(engine.log_dir().display().to_string());
    result.total_bytes = -1;
    result.usable_bytes = -1;
    for (name, partitions) in asked {
        if name.starts_with("__") || !super::may_describe(shared, who, &name) {
            continue;
        }
        let Ok(stream) = engine.stream(&name) else { continue };
        let indexes: Vec<i32> = partitions.unwrap_or_else(|| (0..stream.partition_count() as i32).collect());
        let mut topic = DescribeLogDirsTopic::default();
        topic.name = kafka_protocol::messages::TopicName(StrBytes::from_string(name));
        for index in indexes {
            let Ok(size) = u32::try_from(index).map_err(drop).and_then(|index| stream.size_bytes(index).map_err(drop))
            else {
                continue;
            };
            let mut partition = DescribeLogDirsPartition::default();
            partition.partition_index = index;
            partition.partition_size = size as i64;
            topic.partitions.push(partition);
        }
        result.topics.push(topic);
    }
    let mut response = DescribeLogDirsResponse::default();
    response.results.push(result);
    response
}
