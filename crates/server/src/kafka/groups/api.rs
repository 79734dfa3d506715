//! The group APIs: requests to the coordinator, its answers to responses.

use onehop_engine::{Principal, Privilege};
use std::time::Duration;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::delete_groups_request::DeleteGroupsRequest;
use kafka_protocol::messages::delete_groups_response::{DeletableGroupResult, DeleteGroupsResponse};
use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::describe_groups_response::{
    DescribeGroupsResponse, DescribedGroup, DescribedGroupMember,
};
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::find_coordinator_response::{Coordinator as Found, FindCoordinatorResponse};
use kafka_protocol::messages::heartbeat_request::HeartbeatRequest;
use kafka_protocol::messages::heartbeat_response::HeartbeatResponse;
use kafka_protocol::messages::join_group_request::JoinGroupRequest;
use kafka_protocol::messages::join_group_response::{JoinGroupResponse, JoinGroupResponseMember};
use kafka_protocol::messages::leave_group_request::LeaveGroupRequest;
use kafka_protocol::messages::leave_group_response::{LeaveGroupResponse, MemberResponse};
use kafka_protocol::messages::list_groups_request::ListGroupsRequest;
use kafka_protocol::messages::list_groups_response::{ListGroupsResponse, ListedGroup};
use kafka_protocol::messages::offset_commit_request::OffsetCommitRequest;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponse, OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequest;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponse, OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequest;
use kafka_protocol::messages::sync_group_response::SyncGroupResponse;
use kafka_protocol::messages::{BrokerId, GroupId, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::committed::Committed;
use super::{GroupState, JoinRequest};
use crate::kafka::{Shared, errors};

/// Largest metadata string a commit may carry (Kafka's offset.metadata.max.bytes).
const COMMIT_METADATA_BYTES_MAX: usize = 4096;

fn text(value: &str) -> StrBytes {
    StrBytes::from_string(value.to_string())
}

/// FindCoordinator: this server, for every group (and transactional id).
pub(in crate::kafka) fn find_coordinator(
    shared: &Shared,
    endpoint: &crate::kafka::KafkaListener,
    request: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let mut response = FindCoordinatorResponse::default();
    // The cluster's leader coordinates every group and transaction; on a single node, this one.
    let (brokers, leader) = crate::kafka::brokers(shared, endpoint);
    let (_, host, port) = brokers.iter().find(|(id, _, _)| *id == leader).expect("the leader is among the brokers");
    let node = BrokerId(leader);
    let host = text(host);
    let port = i32::from(*port);
    let unknown_leader =
        shared.cluster.get().is_some_and(|cluster| cluster.leader().is_none_or(|known| known != leader));
    let refusal = if !matches!(request.key_type, 0 | 1) {
        Some(ResponseError::InvalidRequest.code())
    } else {
        // No leader it can name yet (an election): the client asks again.
        unknown_leader.then_some(ResponseError::CoordinatorNotAvailable.code())
    };
    if version < 4 {
        // One key, answered in the top-level fields (version 4 answers a list instead).
        response.node_id = node;
        response.host = host;
        response.port = port;
        response.error_code = refusal.unwrap_or(0);
        return response;
    }
    response.coordinators = request
        .coordinator_keys
        .into_iter()
        .map(|key| {
            let mut found = Found::default();
            found.key = key;
            found.node_id = node;
            found.host = host.clone();
            found.port = port;
            found.error_code = refusal.unwrap_or(0);
            found
        })
        .collect();
    response
}

pub(in crate::kafka) async fn join_group(
    shared: &Shared,
    who: &Principal,
    request: JoinGroupRequest,
    version: i16,
    client_id: &str,
    host: &str,
) -> JoinGroupResponse {
    let mut response = JoinGroupResponse::default();
    response.generation_id = -1;
    if let Some(code) = crate::kafka::group_refused(shared, who, Privilege::Read, request.group_id.0.as_str()) {
        response.error_code = code;
        response.member_id = request.member_id;
        return response;
    }
    let session_timeout = Duration::from_millis(request.session_timeout_ms.max(0) as u64);
    // Before version 1 the rebalance timeout was the session timeout.
    let rebalance_timeout = match request.rebalance_timeout_ms {
        ms if ms > 0 => Duration::from_millis(ms as u64),
        _ => session_timeout,
    };
    let joining = shared.groups.join(JoinRequest {
        group: request.group_id.0.as_str().to_string(),
        member_id: request.member_id.as_str().to_string(),
        instance_id: request.group_instance_id.map(|id| id.as_str().to_string()),
        client_id: client_id.to_string(),
        host: host.to_string(),
        session_timeout,
        rebalance_timeout,
        protocol_type: request.protocol_type.as_str().to_string(),
        protocols: request
            .protocols
            .into_iter()
            .map(|protocol| (protocol.name.as_str().to_string(), protocol.metadata))
            .collect(),
    });
    let joined = match joining {
        Err(code) => {
            response.error_code = code;
            response.member_id = request.member_id;
            return response;
        }
        Ok(receiver) => {
            let mut stop = shared.stop.clone();
            tokio::select! {
                joined = receiver => joined.unwrap_or_default(),
                _ = stop.wait_for(|stop| *stop) => super::Joined { error: ResponseError::CoordinatorNotAvailable.code(), ..Default::default() },
            }
        }
    };
    response.error_code = joined.error;
    response.generation_id = if joined.error == 0 { joined.generation } else { -1 };
    response.protocol_type = Some(text(&joined.protocol_type));
    response.protocol_name = Some(text(&joined.protocol));
    response.leader = text(&joined.leader);
    response.member_id = text(&joined.member_id);
    // A static leader back under its instance id is told to skip the assignment (KIP-814)
    // from version 9 on; an older client gets the members, assigns again, and its SyncGroup
    // is answered with the assignment the stable group kept, as Kafka does.
    response.skip_assignment = joined.skip_assignment && version >= 9;
    response.members = joined
        .members
        .into_iter()
        .map(|(member_id, instance_id, metadata)| {
            let mut member = JoinGroupResponseMember::default();
            member.member_id = text(&member_id);
            member.group_instance_id = instance_id.map(|id| text(&id));
            member.metadata = metadata;
            member
        })
        .collect();
    response
}

pub(in crate::kafka) async fn sync_group(
    shared: &Shared,
    who: &Principal,
    request: SyncGroupRequest,
) -> SyncGroupResponse {
    let mut response = SyncGroupResponse::default();
    if let Some(code) = crate::kafka::group_refused(shared, who, Privilege::Read, request.group_id.0.as_str()) {
        response.error_code = code;
        return response;
    }
    let assignments = request
        .assignments
        .into_iter()
        .map(|assigned| (assigned.member_id.as_str().to_string(), assigned.assignment))
        .collect();
    let instance = request.group_instance_id.as_ref().map(|id| id.as_str());
    let member = (request.member_id.as_str(), instance);
    let syncing = shared.groups.sync(request.group_id.0.as_str(), member, request.generation_id, assignments);
    let synced = match syncing {
        Err(code) => super::Synced { error: code, ..Default::default() },
        Ok(receiver) => {
            let mut stop = shared.stop.clone();
            tokio::select! {
                synced = receiver => synced.unwrap_or_default(),
                _ = stop.wait_for(|stop| *stop) => super::Synced { error: ResponseError::CoordinatorNotAvailable.code(), ..Default::default() },
            }
        }
    };
    response.error_code = synced.error;
    response.protocol_type = Some(text(&synced.protocol_type));
    response.protocol_name = Some(text(&synced.protocol));
    response.assignment = synced.assignment;
    response
}

pub(in crate::kafka) fn heartbeat(shared: &Shared, who: &Principal, request: HeartbeatRequest) -> HeartbeatResponse {
    let mut response = HeartbeatResponse::default();
    response.error_code = match crate::kafka::group_refused(shared, who, Privilege::Read, request.group_id.0.as_str()) {
        Some(code) => code,
        None => {
            let instance = request.group_instance_id.as_ref().map(|id| id.as_str());
            shared.groups.heartbeat(
                request.group_id.0.as_str(),
                (request.member_id.as_str(), instance),
                request.generation_id,
            )
        }
    };
    response
}

pub(in crate::kafka) fn leave_group(
    shared: &Shared,
    who: &Principal,
    request: LeaveGroupRequest,
) -> LeaveGroupResponse {
    let mut response = LeaveGroupResponse::default();
    let group = request.group_id.0.as_str();
    if let Some(code) = crate::kafka::group_refused(shared, who, Privilege::Read, group) {
        response.error_code = code;
        return response;
    }
    if request.members.is_empty() {
        // Versions 0 to 2: one member.
        response.error_code = shared.groups.leave(group, (request.member_id.as_str(), None));
    } else {
        response.members = request
            .members
            .into_iter()
            .map(|identity| {
                let mut left = MemberResponse::default();
                let instance = identity.group_instance_id.as_ref().map(|id| id.as_str());
                left.error_code = shared.groups.leave(group, (identity.member_id.as_str(), instance));
                left.member_id = identity.member_id;
                left.group_instance_id = identity.group_instance_id;
                left
            })
            .collect();
    }
    response
}

/// One partition of a commit (OffsetCommit, TxnOffsetCommit), checked: the offset to store, or
/// the partition's error code.
pub(in crate::kafka) fn checked_commit(
    stream: &Result<std::sync::Arc<onehop_engine::Stream>, onehop_engine::EngineError>,
    index: i32,
    offset: i64,
    leader_epoch: i32,
    metadata: Option<&StrBytes>,
) -> Result<Committed, i16> {
    let stream = stream.as_ref().map_err(errors::code)?;
    if index < 0 || stream.check_partition(index as u32).is_err() {
        return Err(ResponseError::UnknownTopicOrPartition.code());
    }
    let metadata = metadata.map(|text| text.as_str().to_string()).unwrap_or_default();
    if metadata.len() > COMMIT_METADATA_BYTES_MAX {
        return Err(ResponseError::OffsetMetadataTooLarge.code());
    }
    Ok(Committed { offset, leader_epoch, metadata })
}

pub(in crate::kafka) async fn offset_commit(
    shared: &Shared,
    who: &Principal,
    request: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let group = request.group_id.0.as_str().to_string();
    let allowed = match crate::kafka::group_refused(shared, who, Privilege::Read, &group) {
        Some(code) => code,
        None => {
            let instance = request.group_instance_id.as_ref().map(|id| id.as_str());
            shared.groups.may_commit(
                &group,
                (request.member_id.as_str(), instance),
                request.generation_id_or_member_epoch,
            )
        }
    };
    let mut answers: Vec<(TopicName, Vec<(i32, i16)>)> = Vec::new();
    let mut commits = Vec::new();
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
                    commits.push(((group.clone(), name.clone(), index), committed));
                    0
                }
            };
            partitions.push((index, code));
        }
        answers.push((topic.name, partitions));
    }
    let stored = shared.groups.offsets.commit(commits).await.err().map(|error| errors::code(&error));
    let mut response = OffsetCommitResponse::default();
    response.topics = answers
        .into_iter()
        .map(|(name, partitions)| {
            let mut topic = OffsetCommitResponseTopic::default();
            topic.name = name;
            topic.partitions = partitions
                .into_iter()
                .map(|(index, code)| {
                    let mut partition = OffsetCommitResponsePartition::default();
                    partition.partition_index = index;
                    partition.error_code = if code == 0 { stored.unwrap_or(0) } else { code };
                    partition
                })
                .collect();
            topic
        })
        .collect();
    response
}

pub(in crate::kafka) fn offset_fetch(
    shared: &Shared,
    who: &Principal,
    request: OffsetFetchRequest,
) -> OffsetFetchResponse {
    let group = request.group_id.0.as_str();
    let readable = |topic: &str| {
        shared.engine.access().authorize(who, Privilege::Read, onehop_engine::ObjectKind::Stream, topic).is_ok()
    };
    let offsets = &shared.groups.offsets;
    let require_stable = request.require_stable;
    let answer = |topic: &str, index: i32, committed: Option<Committed>| {
        let mut partition = OffsetFetchResponsePartition::default();
        partition.partition_index = index;
        if !readable(topic) {
            partition.error_code = ResponseError::TopicAuthorizationFailed.code();
            partition.committed_offset = -1;
            partition.committed_leader_epoch = -1;
            return partition;
        }
        // An open transaction will commit this offset: a consumer that asks for stable offsets
        // (a read_committed consumer of an exactly-once app) waits and asks again (KIP-447).
        if require_stable && shared.transactions.unstable(group, topic, index) {
            partition.error_code = ResponseError::UnstableOffsetCommit.code();
            partition.committed_offset = -1;
            partition.committed_leader_epoch = -1;
            partition.metadata = Some(StrBytes::new());
            return partition;
        }
        match committed {
            Some(committed) => {
                partition.committed_offset = committed.offset;
                partition.committed_leader_epoch = committed.leader_epoch;
                partition.metadata = Some(text(&committed.metadata));
            }
            None => {
                partition.committed_offset = -1;
                partition.committed_leader_epoch = -1;
                partition.metadata = Some(StrBytes::new());
            }
        }
        partition
    };
    let mut response = OffsetFetchResponse::default();
    if let Some(code) = crate::kafka::group_refused(shared, who, Privilege::Read, group) {
        response.error_code = code;
        return response;
    }
    response.topics = match request.topics {
        Some(topics) => topics
            .into_iter()
            .map(|asked| {
                let mut topic = OffsetFetchResponseTopic::default();
                topic.partitions = asked
                    .partition_indexes
                    .iter()
                    .map(|index| {
                        answer(asked.name.0.as_str(), *index, offsets.get(group, asked.name.0.as_str(), *index))
                    })
                    .collect();
                topic.name = asked.name;
                topic
            })
            .collect(),
        None => {
            let mut topics: Vec<OffsetFetchResponseTopic> = Vec::new();
            for (name, index, committed) in offsets.of_group(group).into_iter().filter(|(name, ..)| readable(name)) {
                if topics.last().is_none_or(|topic| topic.name.0.as_str() != name) {
                    let mut topic = OffsetFetchResponseTopic::default();
                    topic.name = TopicName(text(&name));
                    topics.push(topic);
                }
                topics.last_mut().expect("a topic").partitions.push(answer(&name, index, Some(committed)));
            }
            topics
        }
    };
    response
}

/// ListGroups: the groups `who` has any grant on (Kafka lists those it may describe).
pub(in crate::kafka) fn list_groups(
    shared: &Shared,
    who: &Principal,
    request: ListGroupsRequest,
) -> ListGroupsResponse {
    let mut response = ListGroupsResponse::default();
    let permissions = shared.engine.access().permissions(who).ok().flatten();
    let visible = |group: &str| {
        permissions.as_ref().is_none_or(|permissions| permissions.sees(onehop_engine::ObjectKind::Group, group))
    };
    response.groups = shared
        .groups
        .list()
        .into_iter()
        .filter(|(id, ..)| visible(id))
        .filter(|(_, state, _)| {
            request.states_filter.is_empty()
                || request.states_filter.iter().any(|wanted| wanted.as_str() == state.name())
        })
        .map(|(id, state, protocol_type)| {
            let mut group = ListedGroup::default();
            group.group_id = GroupId(text(&id));
            group.protocol_type = text(&protocol_type);
            group.group_state = text(state.name());
            group.group_type = StrBytes::from_static_str("classic");
            group
        })
        .collect();
    response
}

/// DescribeGroups: each group `who` has any grant on (Kafka's DESCRIBE).
pub(in crate::kafka) fn describe_groups(
    shared: &Shared,
    who: &Principal,
    request: DescribeGroupsRequest,
) -> DescribeGroupsResponse {
    let mut response = DescribeGroupsResponse::default();
    let permissions = shared.engine.access().permissions(who).ok();
    let visible = |group: &str| match &permissions {
        Some(None) => true,
        Some(Some(permissions)) => permissions.sees(onehop_engine::ObjectKind::Group, group),
        None => false,
    };
    response.groups = request
        .groups
        .into_iter()
        .map(|id| {
            let mut described = DescribedGroup::default();
            if let Some(code) = crate::kafka::not_coordinator(shared) {
                described.error_code = code;
                described.group_id = id;
                return described;
            }
            if !visible(id.0.as_str()) {
                described.error_code = ResponseError::GroupAuthorizationFailed.code();
                described.group_id = id;
                return described;
            }
            match shared.groups.describe(id.0.as_str()) {
                // Kafka describes a group it does not know as Dead, without an error.
                None => described.group_state = StrBytes::from_static_str("Dead"),
                Some(group) => {
                    described.group_state = text(group.state.name());
                    described.protocol_type = text(&group.protocol_type);
                    described.protocol_data = text(&group.protocol);
                    described.members = group
                        .members
                        .into_iter()
                        .map(|member| {
                            let mut out = DescribedGroupMember::default();
                            out.member_id = text(&member.member_id);
                            out.group_instance_id = member.instance_id.map(|id| text(&id));
                            out.client_id = text(&member.client_id);
                            out.client_host = text(&member.host);
                            out.member_metadata = member.metadata;
                            out.member_assignment = member.assignment;
                            out
                        })
                        .collect();
                }
            }
            described.group_id = id;
            described
        })
        .collect();
    response
}

pub(in crate::kafka) async fn delete_groups(
    shared: &Shared,
    who: &Principal,
    request: DeleteGroupsRequest,
) -> DeleteGroupsResponse {
    let mut response = DeleteGroupsResponse::default();
    for id in request.groups_names {
        let mut result = DeletableGroupResult::default();
        let name = id.0.as_str().to_string();
        // Deleting a group (its committed offsets) takes ADMIN on it.
        result.error_code = if let Some(code) = crate::kafka::group_refused(shared, who, Privilege::Admin, &name) {
            code
        } else if shared.groups.has_members(&name) {
            ResponseError::NonEmptyGroup.code()
        } else {
            match shared.groups.offsets.delete_group(&name).await {
                Ok(true) => {
                    shared.groups.forget(&name);
                    0
                }
                Ok(false) if shared.groups.describe(&name).is_some_and(|group| group.state == GroupState::Empty) => {
                    shared.groups.forget(&name);
                    0
                }
                Ok(false) => ResponseError::GroupIdNotFound.code(),
                Err(error) => errors::code(&error),
            }
        };
        result.group_id = id;
        response.results.push(result);
    }
    response
}

/// The topics the group's members subscribe to, from their consumer protocol metadata; `None`
/// when one does not read as a consumer's (then every topic counts as subscribed).
fn subscribed_topics(shared: &Shared, group: &str) -> Option<std::collections::BTreeSet<String>> {
    use kafka_protocol::messages::ConsumerProtocolSubscription;
    use kafka_protocol::protocol::Decodable;
    let described = shared.groups.describe(group)?;
    let mut topics = std::collections::BTreeSet::new();
    for member in described.members {
        let mut metadata = member.metadata.clone();
        if metadata.len() < 2 {
            return None;
        }
        let version = i16::from_be_bytes([metadata[0], metadata[1]]);
        bytes::Buf::advance(&mut metadata, 2);
        let subscription = ConsumerProtocolSubscription::decode(&mut metadata, version.clamp(0, 3)).ok()?;
        topics.extend(subscription.topics.iter().map(|topic| topic.to_string()));
    }
    Some(topics)
}

/// OffsetDelete (`kafka-consumer-groups --delete-offsets`): deletes the group's committed
/// offsets in the partitions named, except in topics its members subscribe to
/// (GROUP_SUBSCRIBED_TO_TOPIC, as Kafka). Takes ADMIN on the group and READ on each topic.
pub(in crate::kafka) async fn offset_delete(
    shared: &Shared,
    who: &Principal,
    request: kafka_protocol::messages::offset_delete_request::OffsetDeleteRequest,
) -> kafka_protocol::messages::offset_delete_response::OffsetDeleteResponse {
    use kafka_protocol::messages::offset_delete_response::{
        OffsetDeleteResponse, OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
    };
    let mut response = OffsetDeleteResponse::default();
    let group = request.group_id.0.as_str().to_string();
    if let Some(code) = crate::kafka::group_refused(shared, who, Privilege::Admin, &group) {
        response.error_code = code;
        return response;
    }
    if shared.groups.offsets.of_group(&group).is_empty() && shared.groups.describe(&group).is_none() {
        response.error_code = ResponseError::GroupIdNotFound.code();
        return response;
    }
    let subscribed =
        if shared.groups.has_members(&group) { subscribed_topics(shared, &group) } else { Some(Default::default()) };
    let mut deleting = Vec::new();
    for topic in request.topics {
        let name = topic.name.0.as_str().to_string();
        let readable = shared.engine.access().authorize(who, Privilege::Read, onehop_engine::ObjectKind::Stream, &name);
        let refusal = if readable.is_err() {
            Some(ResponseError::TopicAuthorizationFailed.code())
        } else if subscribed.as_ref().is_none_or(|topics| topics.contains(&name)) {
            Some(ResponseError::GroupSubscribedToTopic.code())
        } else {
            None
        };
        let mut answer = OffsetDeleteResponseTopic::default();
        answer.name = topic.name;
        for asked in topic.partitions {
            let mut partition = OffsetDeleteResponsePartition::default();
            partition.partition_index = asked.partition_index;
            match refusal {
                Some(code) => partition.error_code = code,
                None => deleting.push((group.clone(), name.clone(), asked.partition_index)),
            }
            answer.partitions.push(partition);
        }
        response.topics.push(answer);
    }
    if let Err(error) = shared.groups.offsets.delete(deleting).await {
        response.error_code = errors::code(&error);
    }
    response
}
