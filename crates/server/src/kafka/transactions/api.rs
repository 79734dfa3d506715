//! The transaction APIs: requests to the coordinator ([`super::Transactions`]), its answers to
//! responses.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::add_offsets_to_txn_request::AddOffsetsToTxnRequest;
use kafka_protocol::messages::add_offsets_to_txn_response::AddOffsetsToTxnResponse;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnRequest;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResponse, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_request::DescribeTransactionsRequest;
use kafka_protocol::messages::describe_transactions_response::{
    DescribeTransactionsResponse, TopicData, TransactionState,
};
use kafka_protocol::messages::end_txn_request::EndTxnRequest;
use kafka_protocol::messages::end_txn_response::EndTxnResponse;
use kafka_protocol::messages::list_transactions_request::ListTransactionsRequest;
use kafka_protocol::messages::list_transactions_response::{
    ListTransactionsResponse, TransactionState as ListedTransaction,
};
use kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequest;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponse, TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{ProducerId, TopicName, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use onehop_engine::{Principal, Privilege};

use super::{Partition, Phase, Stored};
use crate::kafka::Shared;
use crate::kafka::groups::api::checked_commit;

/// The error that tells a producer it was fenced: PRODUCER_FENCED from `since` on, and
/// INVALID_PRODUCER_EPOCH in older versions, which clients from before it know.
fn fenced(version: i16, since: i16) -> ResponseError {
    if version >= since { ResponseError::ProducerFenced } else { ResponseError::InvalidProducerEpoch }
}

fn text(value: &str) -> StrBytes {
    StrBytes::from_string(value.to_string())
}

/// InitProducerId with a transactional id.
pub(in crate::kafka) async fn init_producer(
    shared: &Shared,
    id: &str,
    timeout_ms: i32,
    current: (i64, i16),
    version: i16,
) -> Result<(i64, i16), i16> {
    shared.transactions.init_producer(id, timeout_ms, current).await.map_err(|(code, why)| {
        tracing::debug!(transactional_id = id, code, %why, "InitProducerId refused");
        if code == ResponseError::ProducerFenced.code() { fenced(version, 4).code() } else { code }
    })
}

/// AddPartitionsToTxn, versions 0 to 3 (one transaction; later versions are sent by brokers).
pub(in crate::kafka) async fn add_partitions_to_txn(
    shared: &Shared,
    who: &Principal,
    request: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    let id = request.v3_and_below_transactional_id.0.as_str().to_string();
    let producer = (request.v3_and_below_producer_id.0, request.v3_and_below_producer_epoch);
    let id_refused = crate::kafka::transactional_id_refused(shared, who, &id);
    // Every partition must exist; the others are then not attempted.
    let mut unknown = Vec::new();
    let mut partitions: Vec<Partition> = Vec::new();
    for topic in &request.v3_and_below_topics {
        // A topic the client may not write is as good as unknown: its produce would be refused.
        let stream = crate::kafka::stream_for(shared, who, Privilege::Write, topic.name.0.as_str()).ok();
        for &index in &topic.partitions {
            let exists =
                stream.as_ref().is_some_and(|stream| index >= 0 && stream.check_partition(index as u32).is_ok());
            if exists {
                partitions.push((topic.name.0.as_str().to_string(), index as u32));
            } else {
                unknown.push((topic.name.0.as_str().to_string(), index));
            }
        }
    }
    let outcome = if unknown.is_empty() && id_refused.is_none() {
        shared.transactions.add_partitions(&id, producer, &partitions, fenced(version, 2)).await.err()
    } else {
        None
    };
    let code_of = |topic: &str, index: i32| -> i16 {
        if let Some(code) = id_refused {
            code
        } else if !unknown.is_empty() {
            if unknown.iter().any(|(name, at)| name == topic && *at == index) {
                ResponseError::UnknownTopicOrPartition.code()
            } else {
                ResponseError::OperationNotAttempted.code()
            }
        } else {
            outcome.as_ref().map_or(0, |(code, _)| *code)
        }
    };
    if let Some((code, why)) = &outcome {
        tracing::debug!(transactional_id = %id, code, %why, "AddPartitionsToTxn refused");
    }
    let mut response = AddPartitionsToTxnResponse::default();
    response.results_by_topic_v3_and_below = request
        .v3_and_below_topics
        .into_iter()
        .map(|topic| {
            let mut result = AddPartitionsToTxnTopicResult::default();
            result.results_by_partition = topic
                .partitions
                .iter()
                .map(|&index| {
                    let mut partition = AddPartitionsToTxnPartitionResult::default();
                    partition.partition_index = index;
                    partition.partition_error_code = code_of(topic.name.0.as_str(), index);
                    partition
                })
                .collect();
            result.name = topic.name;
            result
        })
        .collect();
    response
}

pub(in crate::kafka) async fn add_offsets_to_txn(
    shared: &Shared,
    who: &Principal,
    request: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let mut response = AddOffsetsToTxnResponse::default();
    let group = request.group_id.0.as_str();
    if group.is_empty() {
        response.error_code = ResponseError::InvalidGroupId.code();
        return response;
    }
    let refused = crate::kafka::transactional_id_refused(shared, who, request.transactional_id.0.as_str())
        .or_else(|| crate::kafka::group_refused(shared, who, Privilege::Read, group));
    if let Some(code) = refused {
        response.error_code = code;
        return response;
    }
    let producer = (request.producer_id.0, request.producer_epoch);
    if let Err((code, why)) =
        shared.transactions.add_group(request.transactional_id.0.as_str(), producer, group, fenced(version, 2)).await
    {
        tracing::debug!(code, %why, "AddOffsetsToTxn refused");
        response.error_code = code;
    }
    response
}

pub(in crate::kafka) async fn txn_offset_commit(
    shared: &Shared,
    who: &Principal,
    request: TxnOffsetCommitRequest,
    version: i16,
) -> TxnOffsetCommitResponse {
    let group = request.group_id.0.as_str().to_string();
    let refused = crate::kafka::transactional_id_refused(shared, who, request.transactional_id.0.as_str())
        .or_else(|| crate::kafka::group_refused(shared, who, Privilege::Read, &group));
    // A consumer's generation is checked as an OffsetCommit's is (KIP-447); a commit without
    // one (generation -1) is taken as Kafka takes it.
    let allowed = if let Some(code) = refused {
        code
    } else if request.generation_id >= 0 {
        shared.groups.may_commit(
            &group,
            (request.member_id.as_str(), request.group_instance_id.as_ref().map(|id| id.as_str())),
            request.generation_id,
        )
    } else if group.is_empty() {
        ResponseError::InvalidGroupId.code()
    } else {
        0
    };
    let mut codes: Vec<(TopicName, Vec<(i32, i16)>)> = Vec::new();
    let mut offsets = Vec::new();
    for topic in request.topics {
        let name = topic.name.0.as_str().to_string();
        let stream = crate::kafka::stream_for(shared, who, Privilege::Read, &name);
        let mut partitions = Vec::new();
        for partition in topic.partitions {
            let index = partition.partition_index;
            let checked = checked_commit(
                &stream,
                index,
                partition.committed_offset,
                partition.committed_leader_epoch,
                partition.committed_metadata.as_ref(),
            );
            let code = match checked {
                _ if allowed != 0 => allowed,
                Err(code) => code,
                Ok(committed) => {
                    offsets.push(((group.clone(), name.clone(), index), committed));
                    0
                }
            };
            partitions.push((index, code));
        }
        codes.push((topic.name, partitions));
    }
    let producer = (request.producer_id.0, request.producer_epoch);
    let stored = if offsets.is_empty() {
        None
    } else {
        let id = request.transactional_id.0.as_str();
        shared.transactions.commit_offsets(id, producer, &group, offsets, fenced(version, 3)).await.err()
    };
    if let Some((code, why)) = &stored {
        tracing::debug!(code, %why, "TxnOffsetCommit refused");
    }
    let mut response = TxnOffsetCommitResponse::default();
    response.topics = codes
        .into_iter()
        .map(|(name, partitions)| {
            let mut topic = TxnOffsetCommitResponseTopic::default();
            topic.name = name;
            topic.partitions = partitions
                .into_iter()
                .map(|(index, code)| {
                    let mut partition = TxnOffsetCommitResponsePartition::default();
                    partition.partition_index = index;
                    partition.error_code = if code == 0 { stored.as_ref().map_or(0, |(code, _)| *code) } else { code };
                    partition
                })
                .collect();
            topic
        })
        .collect();
    response
}

pub(in crate::kafka) async fn end_txn(
    shared: &Shared,
    who: &Principal,
    request: EndTxnRequest,
    version: i16,
) -> EndTxnResponse {
    let mut response = EndTxnResponse::default();
    response.producer_id = ProducerId(-1);
    response.producer_epoch = -1;
    let producer = (request.producer_id.0, request.producer_epoch);
    let id = request.transactional_id.0.as_str();
    if let Some(code) = crate::kafka::transactional_id_refused(shared, who, id) {
        response.error_code = code;
        return response;
    }
    if let Err((code, why)) = shared.transactions.end(id, producer, request.committed, fenced(version, 2)).await {
        tracing::debug!(transactional_id = id, code, %why, "EndTxn refused");
        response.error_code = code;
    }
    response
}

fn described(id: &str, stored: &Stored) -> TransactionState {
    let mut state = TransactionState::default();
    state.transactional_id = TransactionalId(text(id));
    state.transaction_state = StrBytes::from_static_str(stored.phase.name());
    state.transaction_timeout_ms = stored.timeout_ms.min(i32::MAX as u64) as i32;
    state.transaction_start_time_ms = if stored.phase == Phase::Empty { -1 } else { stored.started_ms };
    state.producer_id = ProducerId(stored.producer_id);
    state.producer_epoch = stored.epoch;
    let mut topics: Vec<TopicData> = Vec::new();
    if stored.phase == Phase::Ongoing {
        for (stream, partition) in &stored.partitions {
            if topics.last().is_none_or(|topic| topic.topic.0.as_str() != stream) {
                let mut topic = TopicData::default();
                topic.topic = TopicName(text(stream));
                topics.push(topic);
            }
            topics.last_mut().expect("a topic").partitions.push(*partition as i32);
        }
    }
    state.topics = topics;
    state
}

pub(in crate::kafka) fn describe_transactions(
    shared: &Shared,
    request: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut response = DescribeTransactionsResponse::default();
    // On a cluster node, only the coordinator (the leader) answers for the transactions.
    let refused = crate::kafka::not_transaction_coordinator(shared);
    response.transaction_states = request
        .transactional_ids
        .into_iter()
        .map(|id| {
            let found = if refused.is_none() { shared.transactions.describe(id.0.as_str()) } else { None };
            match found {
                Some(stored) => described(id.0.as_str(), &stored),
                None => {
                    let mut state = TransactionState::default();
                    state.error_code = refused.unwrap_or(ResponseError::TransactionalIdNotFound.code());
                    state.transactional_id = id;
                    state.producer_id = ProducerId(-1);
                    state.producer_epoch = -1;
                    state
                }
            }
        })
        .collect();
    response
}

pub(in crate::kafka) fn list_transactions(
    shared: &Shared,
    request: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let known = [
        Phase::Empty,
        Phase::Ongoing,
        Phase::PrepareCommit,
        Phase::PrepareAbort,
        Phase::CompleteCommit,
        Phase::CompleteAbort,
    ];
    let mut response = ListTransactionsResponse::default();
    response.unknown_state_filters = request
        .state_filters
        .iter()
        .filter(|wanted| !known.iter().any(|phase| phase.name() == wanted.as_str()))
        .cloned()
        .collect();
    let now = super::now_ms();
    // A cluster node that does not coordinate the transactions lists none (an admin client
    // asks every broker and joins the answers); the leader loading them says so.
    if let Some(code) = crate::kafka::not_transaction_coordinator(shared) {
        if code != ResponseError::NotCoordinator.code() {
            response.error_code = code;
        }
        return response;
    }
    response.transaction_states = shared
        .transactions
        .describe_all()
        .into_iter()
        .filter(|found| {
            request.state_filters.is_empty()
                || request.state_filters.iter().any(|wanted| wanted.as_str() == found.stored.phase.name())
        })
        .filter(|found| {
            request.producer_id_filters.is_empty()
                || request.producer_id_filters.iter().any(|wanted| wanted.0 == found.stored.producer_id)
        })
        .filter(|found| {
            // Open for longer than the filter's milliseconds (Kafka's `--duration-filter`).
            request.duration_filter < 0
                || (found.stored.phase == Phase::Ongoing && now - found.stored.started_ms >= request.duration_filter)
        })
        .map(|found| {
            let mut listed = ListedTransaction::default();
            listed.transactional_id = TransactionalId(text(&found.id));
            listed.producer_id = ProducerId(found.stored.producer_id);
            listed.transaction_state = StrBytes::from_static_str(found.stored.phase.name());
            listed
        })
        .collect();
    response
}
