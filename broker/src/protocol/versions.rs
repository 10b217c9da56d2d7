//! The APIs and versions this broker speaks, and the body version each is read and written in.
//! Apart from the connection loop so that the broker's own Kafka client (replication, mirroring)
//! encodes with the same rules without depending on the server side.

use kafka_protocol::messages::ApiKey;

/// The APIs and versions this broker implements, advertised in ApiVersions. Produce ≥ 3 and
/// Fetch ≥ 4 together make librdkafka use record batch v2. Versions that require topic ids on
/// the wire (Produce 13, Fetch 13+) are not advertised.
pub const SUPPORTED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 12),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 11),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    // KRaft's quorum as the active controller knows it (v2 adds directory ids and listeners).
    (ApiKey::DescribeQuorum, 0, 1),
    // The group coordinator (`groups`): the classic protocol, without static membership.
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 8),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DescribeGroups, 0, 5),
];

/// Versions listed in ApiVersions but not served, because clients key features on them:
/// librdkafka compresses gzip and snappy only when the broker lists Produce v0 (lz4 it keys on
/// FindCoordinator v0, which the group coordinator serves). A request in a listed-only version is
/// refused with the reason given here; librdkafka producing record batch v2 (Produce ≥ 3) never
/// sends one.
pub const LISTED_ONLY: &[(ApiKey, i16, i16, &str)] = &[
    (
        ApiKey::Produce,
        0,
        2,
        "Produce v0-v2 (message format v0/v1) is listed only so that librdkafka compresses; send record batch v2 (Produce v3 or later)",
    ),
];

/// The version a request or response body is read and written in. ListOffsets v11 (KIP-1023)
/// changed no field, it only allows the -6 sentinel, and kafka-protocol 0.18 stops at v10: so a
/// v11 body is a v10 body; the handler still sees 11.
pub fn body_version(api_key: ApiKey, version: i16) -> i16 {
    if api_key == ApiKey::ListOffsets && version == 11 {
        10
    } else {
        version
    }
}

/// What ApiVersions lists: every served range, widened down to the listed-only versions, and
/// the listed-only APIs.
pub fn listed_apis() -> Vec<(ApiKey, i16, i16)> {
    let mut out: Vec<(ApiKey, i16, i16)> = SUPPORTED_APIS.to_vec();
    for (key, lo, hi, _) in LISTED_ONLY {
        match out.iter_mut().find(|(k, _, _)| k == key) {
            Some((_, served_lo, _)) => *served_lo = (*served_lo).min(*lo),
            None => out.push((*key, *lo, *hi)),
        }
    }
    out
}

pub(super) fn supported_range(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED_APIS
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, lo, hi)| (*lo, *hi))
}
