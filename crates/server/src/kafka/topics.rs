//! Metadata, DescribeCluster, CreateTopics and DeleteTopics: topics are streams.

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsRequest;
use kafka_protocol::messages::create_partitions_response::{CreatePartitionsResponse, CreatePartitionsTopicResult};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreateTopicsRequest};
use kafka_protocol::messages::create_topics_response::{CreatableTopicResult, CreateTopicsResponse};
use kafka_protocol::messages::delete_topics_request::DeleteTopicsRequest;
use kafka_protocol::messages::delete_topics_response::{DeletableTopicResult, DeleteTopicsResponse};
use kafka_protocol::messages::describe_cluster_request::DescribeClusterRequest;
use kafka_protocol::messages::describe_cluster_response::{DescribeClusterBroker, DescribeClusterResponse};
use kafka_protocol::messages::metadata_request::MetadataRequest;
use kafka_protocol::messages::metadata_response::{
    MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{BrokerId, TopicName};
use kafka_protocol::protocol::StrBytes;
use onehop_engine::{EngineError, ObjectKind, Principal, Privilege, Stream, StreamDef};

use super::{Shared, errors};

/// The cluster id every answer names: one server is one cluster.
const CLUSTER_ID: &str = "onehop";

/// Metadata: this server as the one broker, and the topics asked for (every stream when none
/// are named). An unknown topic is created when the request allows it and `auto_create` is on.
pub(super) async fn metadata(
    shared: &Shared,
    endpoint: &super::KafkaListener,
    who: &Principal,
    request: MetadataRequest,
    version: i16,
) -> MetadataResponse {
    let engine = &shared.engine;
    let mut response = MetadataResponse::default();
    let (brokers, leader) = super::brokers(shared, endpoint);
    let node = BrokerId(leader);
    let replicas: Vec<BrokerId> = brokers.iter().map(|(id, _, _)| BrokerId(*id)).collect();
    response.brokers = brokers
        .into_iter()
        .map(|(id, host, port)| {
            let mut broker = MetadataResponseBroker::default();
            broker.node_id = BrokerId(id);
            broker.host = StrBytes::from_string(host);
            broker.port = i32::from(port);
            broker
        })
        .collect();
    response.cluster_id = Some(StrBytes::from_static_str(CLUSTER_ID));
    response.controller_id = node;
    // Before version 4 a request could not say; it was always allowed.
    let may_create = version < 4 || request.allow_auto_topic_creation;
    let topics = match request.topics {
        // Version 0 asked for every topic with an empty list; later versions with none.
        Some(topics) if !(version == 0 && topics.is_empty()) => {
            let mut answered = Vec::with_capacity(topics.len());
            for topic in topics {
                let Some(name) = topic.name else {
                    answered.push(topic_error(String::new(), ResponseError::UnknownTopicId.code()));
                    continue;
                };
                let name = name.0.as_str().to_string();
                if name.starts_with(onehop_engine::view::runtime::OUTPUT_PREFIX) {
                    // A view's change stream: described to whoever may read the view.
                    answered.push(match super::stream_for(shared, who, Privilege::Read, &name) {
                        Ok(stream) => describe(&stream, node, &replicas),
                        Err(error) => topic_error(name, errors::code(&error)),
                    });
                    continue;
                }
                if !super::may_describe(shared, who, &name) {
                    answered.push(topic_error(name, ResponseError::TopicAuthorizationFailed.code()));
                    continue;
                }
                // Creating on first use takes what a first publish takes: WRITE.
                let creates = may_create
                    && shared.engine.access().authorize(who, Privilege::Write, ObjectKind::Stream, &name).is_ok();
                let found = if creates { engine.stream_or_create(&name).await } else { engine.stream(&name) };
                answered.push(match found {
                    Ok(stream) => describe(&stream, node, &replicas),
                    Err(error) => topic_error(name, errors::code(&error)),
                });
            }
            answered
        }
        _ => {
            let mut streams = engine.streams();
            streams.retain(|stream| super::may_describe(shared, who, stream.name()));
            streams.sort_by(|a, b| a.name().cmp(b.name()));
            streams.iter().map(|stream| describe(stream, node, &replicas)).collect()
        }
    };
    response.topics = topics;
    response
}

/// A topic's metadata: its partitions, each led by this server, the one replica.
/// A stream as a topic whose partitions `node` leads, each held by every one of `replicas`.
fn describe(stream: &Arc<Stream>, node: BrokerId, replicas: &[BrokerId]) -> MetadataResponseTopic {
    let mut topic = MetadataResponseTopic::default();
    topic.name = Some(TopicName(StrBytes::from_string(stream.name().to_string())));
    topic.partitions = (0..stream.partition_count())
        .map(|index| {
            let mut partition = MetadataResponsePartition::default();
            partition.partition_index = index as i32;
            partition.leader_id = node;
            partition.leader_epoch = 0;
            partition.replica_nodes = replicas.to_vec();
            partition.isr_nodes = replicas.to_vec();
            partition
        })
        .collect();
    topic
}

fn topic_error(name: String, code: i16) -> MetadataResponseTopic {
    let mut topic = MetadataResponseTopic::default();
    topic.name = Some(TopicName(StrBytes::from_string(name)));
    topic.error_code = code;
    topic
}

/// CreateTopics: each topic a stream, with `num_partitions`, `retention.ms` and
/// `retention.bytes` as its settings.
pub(super) async fn create(shared: &Shared, who: &Principal, request: CreateTopicsRequest) -> CreateTopicsResponse {
    let mut response = CreateTopicsResponse::default();
    for topic in request.topics {
        let mut result = CreatableTopicResult::default();
        result.name = topic.name.clone();
        let allowed =
            shared.engine.access().authorize(who, Privilege::Admin, ObjectKind::Stream, topic.name.0.as_str());
        match allowed.map_err(|error| refusal(&error)).and_then(|()| definition(shared, &topic)) {
            Err((code, message)) => {
                result.error_code = code;
                result.error_message = Some(StrBytes::from_string(message));
            }
            Ok(def) => {
                result.num_partitions = def.partitions as i32;
                result.replication_factor = 1;
                let outcome = if shared.engine.stream(&def.name).is_ok() {
                    Err((ResponseError::TopicAlreadyExists.code(), format!("topic {:?} already exists", def.name)))
                } else if request.validate_only {
                    Ok(())
                } else {
                    shared.engine.create_stream(def).await.map(drop).map_err(|error| refusal(&error))
                };
                if let Err((code, message)) = outcome {
                    result.error_code = code;
                    result.error_message = Some(StrBytes::from_string(message));
                }
            }
        }
        response.topics.push(result);
    }
    response
}

/// The stream a CreateTopics entry asks for, or its refusal (code and message).
fn definition(shared: &Shared, topic: &CreatableTopic) -> Result<StreamDef, (i16, String)> {
    let name = topic.name.0.as_str();
    onehop_engine::validate_name(name).map_err(|error| refusal(&error))?;
    let mut def = shared.engine.default_stream_def(name);
    match topic.num_partitions {
        -1 => {}
        count if count >= 1 => def.partitions = count as u32,
        count => return Err((ResponseError::InvalidPartitions.code(), format!("{count} partitions"))),
    }
    if !topic.assignments.is_empty() {
        return Err((
            ResponseError::InvalidReplicaAssignment.code(),
            "replica assignments: this server is the only replica".into(),
        ));
    }
    if !matches!(topic.replication_factor, -1 | 1) {
        return Err((
            ResponseError::InvalidReplicationFactor.code(),
            format!(
                "replication factor {}: this server is one node, so 1 (or -1) is the only one",
                topic.replication_factor
            ),
        ));
    }
    for config in &topic.configs {
        set_config(&mut def, config.name.as_str(), config.value.as_ref().map(|value| value.as_str()))?;
    }
    Ok(def)
}

/// Applies one Kafka topic setting to `def`: `value` `None` puts it back to its default. The
/// mapped settings are `retention.ms`, `retention.bytes` and `cleanup.policy` (`compact` makes
/// a compacted stream; with `delete` too, retention applies as well). `min.insync.replicas=1`
/// and `message.timestamp.type=CreateTime` are what every stream here is, and accepted as such;
/// `segment.bytes` is accepted and the server's segment size applies (Kafka Streams sets it on
/// the topics it creates; a segment's size changes when compaction and retention act, not what
/// a reader sees).
pub(super) fn set_config(def: &mut StreamDef, name: &str, value: Option<&str>) -> Result<(), (i16, String)> {
    let text = value.unwrap_or_default();
    let invalid = |why: &str| (ResponseError::InvalidConfig.code(), format!("{name}={text}: {why}"));
    let limit = |what: &str| match value.map(str::parse::<i64>) {
        None | Some(Ok(-1)) => Ok(None),
        Some(Ok(number)) if number > 0 => Ok(Some(number as u64)),
        _ => Err(invalid(&format!("a number of {what}, or -1 for no limit"))),
    };
    match name {
        "retention.ms" => def.retention_ms = limit("milliseconds")?,
        "retention.bytes" => def.retention_bytes = limit("bytes")?,
        // Every acknowledged write is on this server's disk: one in-sync replica, always.
        "min.insync.replicas" if matches!(value, None | Some("1")) => {}
        "min.insync.replicas" => return Err(invalid("this server is one node, so 1 is the only value")),
        "cleanup.policy" => {
            let mut policies: Vec<&str> = text.split(',').map(str::trim).filter(|part| !part.is_empty()).collect();
            policies.sort_unstable();
            def.compacted = match policies.as_slice() {
                [] | ["delete"] => false,
                ["compact"] | ["compact", "delete"] => true,
                _ => return Err(invalid("expected delete, compact, or compact,delete")),
            };
        }
        "message.timestamp.type" if matches!(value, None | Some("CreateTime")) => {}
        "message.timestamp.type" => {
            return Err(invalid("records keep the timestamp their producer gave (CreateTime), the only type served"));
        }
        "segment.bytes" => match value.map(str::parse::<i64>) {
            None => {}
            Some(Ok(bytes)) if bytes >= 14 => {}
            _ => return Err(invalid("a number of bytes")),
        },
        _ => {
            return Err(invalid(
                "not a setting onehop maps (retention.ms, retention.bytes, cleanup.policy, min.insync.replicas, \
                 message.timestamp.type, segment.bytes)",
            ));
        }
    }
    Ok(())
}

/// CreatePartitions: grows each stream to the count asked for. Replica assignments, when
/// given, may name this server only.
pub(super) async fn create_partitions(
    shared: &Shared,
    who: &Principal,
    request: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut response = CreatePartitionsResponse::default();
    for topic in request.topics {
        let mut result = CreatePartitionsTopicResult::default();
        let name = topic.name.0.as_str();
        let node = BrokerId(shared.config.node_id);
        let refusal = match super::stream_for(shared, who, Privilege::Admin, name) {
            Err(error) => Some(refusal(&error)),
            Ok(stream) if topic.count <= stream.partition_count() as i32 => Some((
                ResponseError::InvalidPartitions.code(),
                format!(
                    "topic {name:?} has {} partitions; partitions can be added, not taken away",
                    stream.partition_count()
                ),
            )),
            Ok(_)
                if topic.assignments.as_ref().is_some_and(|assignments| {
                    assignments.iter().any(|assignment| assignment.broker_ids.iter().any(|id| *id != node))
                }) =>
            {
                Some((
                    ResponseError::InvalidReplicaAssignment.code(),
                    format!("this server (node {}) is the only broker", node.0),
                ))
            }
            Ok(_) if request.validate_only => None,
            Ok(_) => match shared.engine.add_stream_partitions(name, topic.count as u32).await {
                Ok(_) => None,
                Err(error) => {
                    let (mut code, message) = refusal(&error);
                    if matches!(error.kind(), onehop_engine::ErrorKind::Conflict | onehop_engine::ErrorKind::Invalid) {
                        code = ResponseError::InvalidPartitions.code();
                    }
                    Some((code, message))
                }
            },
        };
        if let Some((code, message)) = refusal {
            result.error_code = code;
            result.error_message = Some(StrBytes::from_string(message));
        }
        result.name = topic.name;
        response.results.push(result);
    }
    response
}

/// DeleteTopics: drops each stream (and its records).
pub(super) async fn delete(shared: &Shared, who: &Principal, request: DeleteTopicsRequest) -> DeleteTopicsResponse {
    let mut response = DeleteTopicsResponse::default();
    for name in request.topic_names {
        let mut result = DeletableTopicResult::default();
        let allowed = shared.engine.access().authorize(who, Privilege::Admin, ObjectKind::Stream, name.0.as_str());
        let dropped = match allowed {
            Ok(()) => shared.engine.drop_stream(name.0.as_str()).await,
            Err(error) => Err(error),
        };
        if let Err(error) = dropped {
            let (mut code, message) = refusal(&error);
            // A stream a view or transform still reads stays; the message names which.
            if error.kind() == onehop_engine::ErrorKind::Conflict {
                code = ResponseError::PolicyViolation.code();
            }
            result.error_code = code;
            result.error_message = Some(StrBytes::from_string(message));
        }
        result.name = Some(name);
        response.responses.push(result);
    }
    // Their groups' committed offsets go before the answer, as Kafka's do (and, should this
    // fail, on the coordinator's next look: see KafkaServer::serve).
    if response.responses.iter().any(|result| result.error_code == 0)
        && let Err(error) = shared.groups.offsets.forget_dropped_topics(&mut Default::default()).await
    {
        tracing::warn!(%error, "could not delete the committed offsets of dropped topics yet");
    }
    response
}

fn refusal(error: &EngineError) -> (i16, String) {
    (errors::code(error), error.to_string())
}

/// DescribeCluster: this server as the one broker and the controller.
pub(super) fn describe_cluster(
    shared: &Shared,
    endpoint: &super::KafkaListener,
    request: DescribeClusterRequest,
) -> DescribeClusterResponse {
    let mut response = DescribeClusterResponse::default();
    let (brokers, leader) = super::brokers(shared, endpoint);
    response.cluster_id = StrBytes::from_static_str(CLUSTER_ID);
    response.controller_id = BrokerId(leader);
    response.endpoint_type = request.endpoint_type;
    // Endpoint type 2 asks for the controllers' listeners, which a single server does not have apart.
    if request.endpoint_type != 1 {
        response.error_code = ResponseError::UnsupportedEndpointType.code();
        response.error_message = Some(StrBytes::from_static_str("only the brokers' endpoints (type 1) are served"));
        return response;
    }
    response.brokers = brokers
        .into_iter()
        .map(|(id, host, port)| {
            let mut broker = DescribeClusterBroker::default();
            broker.broker_id = BrokerId(id);
            broker.host = StrBytes::from_string(host);
            broker.port = i32::from(port);
            broker
        })
        .collect();
    response
}
