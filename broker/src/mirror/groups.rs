//! KIP-1279's consumer group offset sync: the offsets the source cluster's consumer groups
//! committed for a mirrored topic are committed, untranslated (offsets are identical on both
//! clusters), to the same groups on the destination, so consumers that move over at failover
//! resume where they were. Only groups not active on the destination take them: the sync
//! commits as an operator does (generation -1, no member), which the group coordinator accepts
//! only while the group is Empty, so local progress is never overwritten. A stopped topic's task
//! has ended, so nothing is synced after a failover. The mirror's `mirror.groups.include` and
//! `mirror.groups.exclude` pick which groups take part ([`GroupFilter`](super::group_filter::GroupFilter)).

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::{
    FindCoordinatorRequest, GroupId, ListGroupsRequest, OffsetCommitRequest, OffsetFetchRequest,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tracing::{info, warn};

use super::client::{connect_any, metadata, RPC_TIMEOUT};
use super::context::MirrorContext;
use crate::errors;
use crate::metadata::{MirrorRegistration, TopicRegistration};
use crate::replica::client::KafkaConnection;

/// Committed offsets of one group for one topic, by partition.
type GroupOffsets = BTreeMap<i32, i64>;

/// Copies the committed offsets of the source's groups for `topic` to this cluster. Returns how
/// many groups took new offsets.
pub async fn sync_group_offsets(
    ctx: &MirrorContext,
    mirror: &MirrorRegistration,
    topic: &TopicRegistration,
) -> anyhow::Result<usize> {
    let partitions: Vec<i32> = (0..topic.partitions.len() as i32).collect();
    let source = &mirror.source_bootstrap;
    let filter = mirror.groups.matcher().map_err(anyhow::Error::msg)?;
    let mut synced = 0;
    for group in source_groups(source).await? {
        if !filter.syncs(&group) {
            continue;
        }
        let wanted = fetch_offsets(source, &group, &topic.name, &partitions).await?;
        if wanted.is_empty() {
            continue;
        }
        let local = own_bootstrap(ctx);
        let have = fetch_offsets(&local, &group, &topic.name, &partitions).await?;
        let changed: GroupOffsets = wanted
            .into_iter()
            .filter(|(p, o)| have.get(p) != Some(o))
            .collect();
        if changed.is_empty() {
            continue;
        }
        match commit_offsets(&local, &group, &topic.name, &changed).await? {
            errors::NONE => {
                info!(group, topic = %topic.name, offsets = ?changed, "group offsets from the source");
                synced += 1;
            }
            // Active here: its own members' progress wins (KIP-1279).
            code if code == ResponseError::IllegalGeneration.code() => {}
            code => {
                warn!(group, topic = %topic.name, "group offset sync refused with error {code}")
            }
        }
    }
    Ok(synced)
}

/// This cluster's brokers as a bootstrap list.
fn own_bootstrap(ctx: &MirrorContext) -> String {
    ctx.metadata()
        .brokers
        .values()
        .filter(|b| !b.fenced)
        .map(|b| format!("{}:{}", b.host, b.port))
        .collect::<Vec<_>>()
        .join(",")
}

/// Every group any broker of the cluster coordinates (ListGroups answers per broker).
async fn source_groups(bootstrap: &str) -> anyhow::Result<BTreeSet<String>> {
    let mut conn = connect_any(bootstrap, "tidemark-mirror").await?;
    let md = metadata(&mut conn, None).await?;
    let mut groups = BTreeSet::new();
    for b in &md.brokers {
        let addr = format!("{}:{}", b.host.as_str(), b.port);
        let mut c = KafkaConnection::connect(&addr, RPC_TIMEOUT, "tidemark-mirror").await?;
        let resp = c.call(4, &ListGroupsRequest::default()).await?;
        if resp.error_code != errors::NONE {
            anyhow::bail!("ListGroups on {addr} failed with error {}", resp.error_code);
        }
        groups.extend(resp.groups.iter().map(|g| g.group_id.to_string()));
    }
    Ok(groups)
}

/// The coordinator of `group` in the cluster of `bootstrap`, connected.
async fn coordinator(bootstrap: &str, group: &str) -> anyhow::Result<KafkaConnection> {
    let mut conn = connect_any(bootstrap, "tidemark-mirror").await?;
    let req = FindCoordinatorRequest::default()
        .with_key(StrBytes::from_string(group.to_string()))
        .with_key_type(0);
    let resp = conn.call(3, &req).await?;
    if resp.error_code != errors::NONE {
        anyhow::bail!(
            "FindCoordinator for group {group} on {bootstrap} failed with error {}",
            resp.error_code
        );
    }
    let addr = format!("{}:{}", resp.host.as_str(), resp.port);
    KafkaConnection::connect(&addr, RPC_TIMEOUT, "tidemark-mirror").await
}

/// The offsets `group` committed for `topic` in the cluster of `bootstrap` (none: absent).
async fn fetch_offsets(
    bootstrap: &str,
    group: &str,
    topic: &str,
    partitions: &[i32],
) -> anyhow::Result<GroupOffsets> {
    let mut conn = coordinator(bootstrap, group).await?;
    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_indexes(partitions.to_vec())]));
    let resp = conn.call(7, &req).await?;
    if resp.error_code != errors::NONE {
        anyhow::bail!(
            "OffsetFetch of group {group} on {bootstrap} failed with error {}",
            resp.error_code
        );
    }
    Ok(resp
        .topics
        .iter()
        .filter(|t| t.name.as_str() == topic)
        .flat_map(|t| t.partitions.iter())
        .filter(|p| p.error_code == errors::NONE && p.committed_offset >= 0)
        .map(|p| (p.partition_index, p.committed_offset))
        .collect())
}

/// Commits `offsets` for `group` as an operator does; returns the first partition error, or
/// NONE.
async fn commit_offsets(
    bootstrap: &str,
    group: &str,
    topic: &str,
    offsets: &GroupOffsets,
) -> anyhow::Result<i16> {
    let mut conn = coordinator(bootstrap, group).await?;
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(
                offsets
                    .iter()
                    .map(|(p, o)| {
                        OffsetCommitRequestPartition::default()
                            .with_partition_index(*p)
                            .with_committed_offset(*o)
                            .with_committed_leader_epoch(-1)
                    })
                    .collect(),
            )]);
    let resp = conn.call(8, &req).await?;
    Ok(resp
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| p.error_code)
        .find(|c| *c != errors::NONE)
        .unwrap_or(errors::NONE))
}
