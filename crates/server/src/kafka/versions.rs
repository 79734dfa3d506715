//! The APIs served and their versions, and ApiVersions, which tells a client so.
//!
//! The ranges start where Kafka 4 starts (it dropped the older versions, KIP-896) or lower where
//! popular clients still send older ones, and stop before versions whose meaning is not
//! served yet: Fetch 13 and later name topics by id, ListOffsets 9 and later ask for tiered
//! storage's offsets, Produce 12 and later add partitions to transactions
//! implicitly, InitProducerId 6 keeps prepared transactions, OffsetCommit 9 and OffsetFetch 8
//! and later belong to KIP-848's consumer protocol or batch several groups, ListGroups 5
//! filters by group type, DescribeGroups 6 refuses unknown groups, FindCoordinator 5 and later
//! serve share groups, AddPartitionsToTxn 4 and later are sent by brokers, EndTxn 5 and
//! TxnOffsetCommit 5 belong to the second transaction protocol (KIP-890, an epoch per
//! transaction), ListTransactions 2 filters by a pattern.

use std::ops::RangeInclusive;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::messages::api_versions_response::{ApiVersion, ApiVersionsResponse};

/// The APIs served, with their versions.
const SERVED: [(ApiKey, RangeInclusive<i16>); 35] = [
    (ApiKey::Produce, 3..=11),
    (ApiKey::Fetch, 4..=12),
    (ApiKey::ListOffsets, 1..=8),
    (ApiKey::DeleteRecords, 0..=2),
    (ApiKey::DescribeLogDirs, 1..=4),
    (ApiKey::OffsetDelete, 0..=0),
    (ApiKey::OffsetForLeaderEpoch, 2..=4),
    (ApiKey::Metadata, 0..=12),
    (ApiKey::ApiVersions, 0..=3),
    (ApiKey::CreateTopics, 2..=7),
    (ApiKey::DeleteTopics, 1..=5),
    (ApiKey::CreatePartitions, 0..=3),
    (ApiKey::InitProducerId, 0..=5),
    (ApiKey::DescribeConfigs, 1..=4),
    (ApiKey::AlterConfigs, 0..=2),
    (ApiKey::IncrementalAlterConfigs, 0..=1),
    (ApiKey::FindCoordinator, 0..=4),
    (ApiKey::JoinGroup, 0..=9),
    (ApiKey::SyncGroup, 0..=5),
    (ApiKey::Heartbeat, 0..=4),
    (ApiKey::LeaveGroup, 0..=5),
    (ApiKey::OffsetCommit, 2..=8),
    (ApiKey::OffsetFetch, 1..=7),
    (ApiKey::ListGroups, 0..=4),
    (ApiKey::DescribeGroups, 0..=5),
    (ApiKey::DeleteGroups, 0..=2),
    (ApiKey::DescribeCluster, 0..=1),
    (ApiKey::AddPartitionsToTxn, 0..=3),
    (ApiKey::AddOffsetsToTxn, 0..=4),
    (ApiKey::TxnOffsetCommit, 0..=4),
    (ApiKey::EndTxn, 0..=4),
    (ApiKey::DescribeTransactions, 0..=0),
    (ApiKey::ListTransactions, 0..=1),
    // Version 0 of the handshake is listed because librdkafka looks for it before it uses
    // SASL at all; a client that then sends version 0 (whose messages follow unframed) is
    // answered and closed: every client in use sends version 1 when the broker lists it.
    (ApiKey::SaslHandshake, 0..=1),
    (ApiKey::SaslAuthenticate, 0..=2),
];

/// The versions of `api` served, if it is.
pub(super) fn served(api: ApiKey) -> Option<RangeInclusive<i16>> {
    SERVED.iter().find(|(key, _)| *key == api).map(|(_, versions)| versions.clone())
}

/// ApiVersions' answer: every API served, with its versions.
pub(super) fn answer() -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.api_keys = SERVED
        .iter()
        .map(|(key, versions)| {
            let mut version = ApiVersion::default();
            version.api_key = *key as i16;
            version.min_version = *versions.start();
            version.max_version = *versions.end();
            version
        })
        .collect();
    response
}

/// The answer to an ApiVersions request of a version not served: the error, and the list, so
/// the client retries with a version it finds there.
pub(super) fn unsupported() -> ApiVersionsResponse {
    let mut response = answer();
    response.error_code = ResponseError::UnsupportedVersion.code();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_version_served_is_one_the_codec_knows() {
        for (key, versions) in SERVED {
            let known = key.valid_versions();
            assert!(
                known.min <= *versions.start() && *versions.end() <= known.max,
                "{key:?} {versions:?} outside {}..={}",
                known.min,
                known.max
            );
        }
    }
}
