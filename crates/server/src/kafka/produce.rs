//! Produce: each partition's batches appended to its stream partition, acknowledged at the
//! durability `acks` asks for; a transactional batch goes to its transaction instead
//! ([`super::transactions`]).

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::ProducerId;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use kafka_protocol::messages::produce_request::ProduceRequest;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, ProduceResponse, TopicProduceResponse};
use kafka_protocol::protocol::StrBytes;
use onehop_engine::{Durability, EngineError, Principal, Privilege, QueuedAppend, Stream};

use super::producers::{Producers, Ticket, Verdict};
use super::records::{self, Refused};
use super::transactions::api as txns;
use super::{RECORDS_PRODUCED, Shared, errors};

/// What one partition of the request came to before its append is durable.
enum Pending {
    Queued {
        append: QueuedAppend,
        records: u64,
        start_offset: i64,
        ticket: Option<Ticket>,
    },
    /// An idempotent producer's retry of a batch stored before.
    Duplicate {
        base_offset: u64,
        start_offset: i64,
    },
    /// A transactional batch, taken into its transaction: it has no offset until that
    /// commits (answered with -1, as acks=0 answers are).
    InTransaction {
        start_offset: i64,
    },
    Refused {
        code: i16,
        message: String,
    },
}

/// Checks one partition's batch and queues it to the log.
async fn queue(shared: &Shared, stream: &Stream, index: i32, batch: Bytes, durability: Option<Durability>) -> Pending {
    let Ok(partition) = u32::try_from(index) else {
        return Pending::Refused {
            code: ResponseError::UnknownTopicOrPartition.code(),
            message: format!("partition {index}"),
        };
    };
    let raw = batch.clone();
    let produced = match records::decode(batch, shared.config.request_bytes_max) {
        Ok(produced) => produced,
        Err(Refused::Corrupt(why)) => {
            return Pending::Refused { code: ResponseError::CorruptMessage.code(), message: why };
        }
        Err(Refused::Invalid(why)) => {
            return Pending::Refused { code: ResponseError::InvalidRecord.code(), message: why };
        }
    };
    let start_offset = match stream.start_offset(partition) {
        Ok(offset) => offset as i64,
        Err(error) => return refused(&error),
    };
    if produced.transactional {
        if super::not_transaction_coordinator(shared).is_some() {
            return Pending::Refused {
                code: ResponseError::NotLeaderOrFollower.code(),
                message: "transactional batches go to the cluster's leader, once it has taken the transactions up"
                    .into(),
            };
        }
        return match shared.transactions.produce(stream, partition, &raw, &produced).await {
            Ok(_) => Pending::InTransaction { start_offset },
            Err((code, message)) => Pending::Refused { code, message },
        };
    }
    let mut records = produced.records;
    // On a cluster, an idempotent batch is checked against the states its leader read back
    // for its term, and written only in that term.
    let term = match produced.sequenced.is_some().then(|| super::producers_term(shared)) {
        None => None,
        Some(Ok(term)) => term,
        Some(Err((code, message))) => return Pending::Refused { code, message },
    };
    let ticket = match produced.sequenced {
        None => None,
        Some(sequenced) => match shared.producers.check(stream, partition, sequenced) {
            Verdict::Duplicate { base_offset } => return Pending::Duplicate { base_offset, start_offset },
            Verdict::Refused(code, message) => return Pending::Refused { code, message },
            Verdict::Fresh(ticket) => {
                if let Some(last) = records.last_mut() {
                    last.headers.push(Producers::header(&sequenced));
                }
                Some(ticket)
            }
        },
    };
    match stream.enqueue_to_in_term(partition, &records, durability, term).await {
        Ok(append) => Pending::Queued { append, records: records.len() as u64, start_offset, ticket },
        Err(error) => {
            if let Some(ticket) = ticket {
                shared.producers.stored(ticket, None);
            }
            refused(&error)
        }
    }
}

/// InitProducerId: an id for an idempotent producer, or a transactional id's producer id at
/// its next epoch.
pub(super) async fn init_producer_id(
    shared: &Shared,
    who: &Principal,
    request: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    response.producer_id = ProducerId(-1);
    response.producer_epoch = -1;
    if let Some(id) = &request.transactional_id
        && let Some(code) = super::transactional_id_refused(shared, who, id.0.as_str())
    {
        response.error_code = code;
        return response;
    }
    if let Some(id) = &request.transactional_id {
        let current = (request.producer_id.0, request.producer_epoch);
        let timeout = request.transaction_timeout_ms;
        match txns::init_producer(shared, id.0.as_str(), timeout, current, version).await {
            Ok((id, epoch)) => {
                response.producer_id = ProducerId(id);
                response.producer_epoch = epoch;
            }
            Err(code) => response.error_code = code,
        }
        return response;
    }
    match shared.producers.init(request.producer_id.0, request.producer_epoch).await {
        Ok((id, epoch)) => {
            response.producer_id = ProducerId(id);
            response.producer_epoch = epoch;
        }
        Err(error) => response.error_code = errors::code(&error),
    }
    response
}

/// Answers a Produce request, or `None` for `acks = 0` (a Kafka broker answers nothing then),
/// and how long the connection waits before its next request: over its user's publish rates,
/// the time until it is back within them (also in the answer's `throttle_time_ms`). Every
/// partition is queued before any is awaited, so one request's partitions share their group
/// commits.
pub(super) async fn produce(
    shared: &Shared,
    who: &Principal,
    request: ProduceRequest,
) -> (Option<ProduceResponse>, std::time::Duration) {
    let durability = match request.acks {
        -1 => Some(Some(Durability::Fsync)),
        1 => Some(None),
        0 => Some(Some(Durability::Async)),
        _ => None,
    };
    let mut pending = Vec::with_capacity(request.topic_data.len());
    let mut produced_bytes = 0u64;
    let mut produced_records = 0u64;
    for topic in request.topic_data {
        let stream = super::stream_for(shared, who, Privilege::Write, topic.name.0.as_str());
        let mut partitions = Vec::with_capacity(topic.partition_data.len());
        for data in topic.partition_data {
            let records = data.records.unwrap_or_default();
            produced_bytes += records.len() as u64;
            let outcome = match (&stream, durability) {
                (_, None) => Pending::Refused {
                    code: ResponseError::InvalidRequiredAcks.code(),
                    message: format!("acks={}: only -1 (all), 0 and 1 are valid", request.acks),
                },
                (Err(error), _) => refused(error),
                (Ok(stream), Some(durability)) => queue(shared, stream, data.index, records, durability).await,
            };
            partitions.push((data.index, outcome));
        }
        pending.push((topic.name, partitions));
    }
    let mut response = ProduceResponse::default();
    for (name, partitions) in pending {
        let mut topic = TopicProduceResponse::default();
        topic.name = name;
        for (index, outcome) in partitions {
            let mut answer = PartitionProduceResponse::default();
            answer.index = index;
            answer.base_offset = -1;
            answer.log_append_time_ms = -1;
            answer.log_start_offset = -1;
            let failed = match outcome {
                Pending::Queued { append, records, start_offset, ticket } => {
                    produced_records += records;
                    let acked = append.await;
                    if let Some(ticket) = ticket {
                        shared.producers.stored(ticket, acked.as_ref().ok().map(|ack| ack.base_offset));
                    }
                    match acked {
                        Ok(ack) => {
                            metrics::counter!(RECORDS_PRODUCED).increment(records);
                            answer.base_offset = ack.base_offset as i64;
                            answer.log_start_offset = start_offset;
                            None
                        }
                        Err(error) => Some(refusal(&EngineError::from(error))),
                    }
                }
                Pending::Duplicate { base_offset, start_offset } => {
                    answer.base_offset = base_offset as i64;
                    answer.log_start_offset = start_offset;
                    None
                }
                Pending::InTransaction { start_offset } => {
                    answer.log_start_offset = start_offset;
                    None
                }
                Pending::Refused { code, message } => Some((code, message)),
            };
            if let Some((code, message)) = failed {
                answer.error_code = code;
                answer.error_message = Some(StrBytes::from_string(message));
            }
            topic.partition_responses.push(answer);
        }
        response.responses.push(topic);
    }
    let wait = who.throttle_publish(produced_records, produced_bytes);
    response.throttle_time_ms = wait.as_millis().min(i32::MAX as u128) as i32;
    ((request.acks != 0).then_some(response), wait)
}

fn refused(error: &EngineError) -> Pending {
    let (code, message) = refusal(error);
    Pending::Refused { code, message }
}

fn refusal(error: &EngineError) -> (i16, String) {
    (errors::code(error), error.to_string())
}
