//! A follower's start from the remote store (KIP-405's follower protocol and KIP-1023's fetch
//! from the last tiered offset): told OFFSET_MOVED_TO_TIERED_STORAGE (or, when empty, out of
//! range), it takes the epoch cache and producer state of the remote segment ending just before
//! where it will fetch, empties its log, and starts there instead of replicating what the remote
//! store already holds.

use std::sync::Arc;

use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, OffsetForLeaderEpochRequest};
use tokio::sync::watch;
use tracing::{info, warn};

use super::manager::TieredStore;
use super::metadata::segment_for;
use super::storage::{IndexKind, TopicIdPartition};
use crate::config::FETCH_LAST_TIERED_OFFSET_KEY;
use crate::log::epoch_cache::parse_checkpoint;
use crate::log::producer_state::decode_snapshot;
use crate::metadata::MetadataImage;
use crate::partition::Partition;
use crate::replica::client::KafkaConnection;

/// What a follower fetcher needs for tiered storage.
#[derive(Clone, Debug)]
pub struct TieredFollower {
    pub store: TieredStore,
    /// The newest metadata image (at least the one whose reconcile started the fetcher), for the
    /// cluster-wide flag and the topic ids the remote store names partitions by.
    pub image: watch::Receiver<Arc<MetadataImage>>,
    /// `follower.fetch.last.tiered.offset.enable` (KIP-1023) as this broker was started with;
    /// the cluster-wide dynamic value, when set, wins.
    pub fetch_last_tiered_offset: bool,
    /// The injected `tiered-bootstrap-off-by-one` bug.
    pub bootstrap_off_by_one: bool,
    /// The injected `tiered-bootstrap-drops-producer-state`.
    pub bootstrap_drops_producer_state: bool,
    /// The injected `tiered-flag-not-dynamic`.
    pub flag_not_dynamic: bool,
}

impl TieredFollower {
    /// The flag now: the dynamic cluster config when set, else the static one.
    pub fn fetch_last_tiered_offset_enabled(&self) -> bool {
        if self.flag_not_dynamic {
            return self.fetch_last_tiered_offset;
        }
        self.image
            .borrow()
            .cluster_configs
            .get(FETCH_LAST_TIERED_OFFSET_KEY)
            .and_then(|v| v.parse().ok())
            .unwrap_or(self.fetch_last_tiered_offset)
    }
}

/// The outcome of a start from the remote store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteStart {
    /// The log now starts where the follower fetches next.
    Started,
    /// Not a case for the remote store: handle the error the old way.
    NotApplicable,
    /// Something is not there yet (the leader's tiered offsets, the segment's metadata): retry.
    Retry,
    /// The replica no longer follows in the epoch the leader was asked in: nothing changed.
    Left,
}

/// KIP-1023's `shouldFetchFromLastTieredOffset`. `cleanup.policy=compact` does not exist in this
/// broker, so the compacted-topic condition always holds.
pub fn should_fetch_from_last_tiered_offset(
    flag: bool,
    remote_storage_enable: bool,
    replica_end_offset: i64,
    leader_end_offset: i64,
) -> bool {
    flag && remote_storage_enable && replica_end_offset == 0 && leader_end_offset != 0
}

/// The epoch of the offset before the fetch offset (step 5a of kips.md §2.3): the fetch offset's
/// own epoch unless the leader says the previous epoch ended after that offset.
pub fn target_epoch(fetch_epoch: i32, previous_epoch_end: Option<(i32, i64)>, target: i64) -> i32 {
    match previous_epoch_end {
        Some((epoch, end)) if fetch_epoch > 0 && end > target => epoch,
        _ => fetch_epoch,
    }
}

struct Leader<'a> {
    conn: &'a mut KafkaConnection,
    node_id: i32,
    leader_epoch: i32,
    p: &'a Partition,
}

impl Leader<'_> {
    /// ListOffsets for a sentinel; `None` when the leader answers an error.
    async fn list(&mut self, timestamp: i64, version: i16) -> anyhow::Result<Option<(i64, i32)>> {
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(self.node_id))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(self.p.topic_name())
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(self.p.index)
                    .with_current_leader_epoch(self.leader_epoch)
                    .with_timestamp(timestamp)])]);
        let resp = self.conn.call(version, &req).await?;
        let Some(r) = resp.topics.first().and_then(|t| t.partitions.first()) else {
            anyhow::bail!("ListOffsets response without the partition");
        };
        Ok((r.error_code == 0).then_some((r.offset, r.leader_epoch)))
    }

    /// OffsetsForLeaderEpoch: the largest epoch ≤ `epoch` and where it ended.
    async fn epoch_end(&mut self, epoch: i32) -> anyhow::Result<Option<(i32, i64)>> {
        let req = OffsetForLeaderEpochRequest::default()
            .with_replica_id(BrokerId(self.node_id))
            .with_topics(vec![OffsetForLeaderTopic::default()
                .with_topic(self.p.topic_name())
                .with_partitions(vec![OffsetForLeaderPartition::default()
                    .with_partition(self.p.index)
                    .with_current_leader_epoch(self.leader_epoch)
                    .with_leader_epoch(epoch)])]);
        let resp = self.conn.call(4, &req).await?;
        let Some(e) = resp.topics.first().and_then(|t| t.partitions.first()) else {
            anyhow::bail!("OffsetForLeaderEpoch response without the partition");
        };
        Ok((e.error_code == 0).then_some((e.leader_epoch, e.end_offset)))
    }
}

/// Handles OFFSET_MOVED_TO_TIERED_STORAGE (`moved`) or OFFSET_OUT_OF_RANGE from the leader
/// (kips.md §2.3): an empty follower of a tiered topic with the flag on starts at the leader's
/// earliest offset pending upload; any follower told its offset moved to tiered storage starts
/// after the remote segment ending before the leader's local log start.
pub async fn start_from_remote(
    tiered: &TieredFollower,
    node_id: i32,
    p: &Partition,
    leader_epoch: i32,
    conn: &mut KafkaConnection,
    moved: bool,
) -> anyhow::Result<RemoteStart> {
    let remote = p.remote_storage_enable();
    if !remote {
        return Ok(RemoteStart::NotApplicable);
    }
    let mut leader = Leader {
        conn,
        node_id,
        leader_epoch,
        p,
    };
    let (Some((leader_start, _)), Some((leader_end, _))) =
        (leader.list(-2, 4).await?, leader.list(-1, 4).await?)
    else {
        return Ok(RemoteStart::Retry);
    };
    let replica_end = p.log_end_offset();
    let (fetch_offset, fetch_epoch) = if should_fetch_from_last_tiered_offset(
        tiered.fetch_last_tiered_offset_enabled(),
        remote,
        replica_end,
        leader_end,
    ) {
        let Some((mut epuo, mut epoch)) = leader.list(-6, 11).await? else {
            return Ok(RemoteStart::Retry);
        };
        if epuo == -1 {
            let Some((local, local_epoch)) = leader.list(-4, 8).await? else {
                return Ok(RemoteStart::Retry);
            };
            if local != leader_start {
                // The leader has deleted uploaded segments but not learnt its tiered offsets.
                return Ok(RemoteStart::Retry);
            }
            (epuo, epoch) = (local, local_epoch);
        }
        if epuo <= leader_start {
            // Nothing valid is uploaded: replicate what the leader has, the old way.
            return Ok(RemoteStart::NotApplicable);
        }
        (epuo, epoch)
    } else if moved {
        let Some(local) = leader.list(-4, 8).await? else {
            return Ok(RemoteStart::Retry);
        };
        local
    } else {
        return Ok(RemoteStart::NotApplicable);
    };
    let target = fetch_offset - 1;
    let previous = if fetch_epoch > 0 {
        leader.epoch_end(fetch_epoch - 1).await?
    } else {
        None
    };
    let epoch = target_epoch(fetch_epoch, previous, target);
    let image = tiered.image.borrow().clone();
    let Some(topic) = image.topics.get(&p.topic) else {
        return Ok(RemoteStart::Retry);
    };
    let tp = TopicIdPartition {
        topic_id: topic.id,
        topic: p.topic.clone(),
        partition: p.index,
    };
    let store = tiered.store.clone();
    let fetched = tokio::task::spawn_blocking(move || -> Result<_, String> {
        let segments = store.metadata.list(&tp).map_err(|e| e.to_string())?;
        let Some(segment) = segment_for(&segments, epoch, target).cloned() else {
            return Err(format!(
                "previous remote log segment metadata was not found (epoch {epoch}, offset {target})"
            ));
        };
        let index = |kind| {
            store
                .storage
                .fetch_index(&segment.segment, kind)
                .map_err(|e| e.to_string())
        };
        let epochs = String::from_utf8(index(IndexKind::LeaderEpoch)?)
            .map_err(|_| "leader epoch index is not text".to_string())
            .and_then(|t| parse_checkpoint(&t))?;
        let (_, producers) = decode_snapshot(&index(IndexKind::ProducerSnapshot)?)?;
        Ok((segment, epochs, producers))
    })
    .await?;
    let (segment, epochs, producers) = match fetched {
        Ok(f) => f,
        Err(e) => {
            warn!(topic = ?p.topic, partition = p.index, "cannot start from the remote store: {e}");
            return Ok(RemoteStart::Retry);
        }
    };
    let next = if tiered.bootstrap_off_by_one {
        // KAFKA-13369's review finding: resume at the leader's local log start, not after the
        // segment the state was taken from.
        match leader.list(-4, 8).await? {
            Some((local, _)) => local,
            None => return Ok(RemoteStart::Retry),
        }
    } else {
        segment.end_offset + 1
    };
    let producers = if tiered.bootstrap_drops_producer_state {
        // KAFKA-14467: the downloaded producer snapshot is gone before it is loaded.
        Default::default()
    } else {
        producers
    };
    if !p.start_after_remote(next, leader_start, &epochs, producers, leader_epoch)? {
        return Ok(RemoteStart::Left);
    }
    info!(topic = ?p.topic, partition = p.index, log_start = leader_start, fetch_offset = next, segment = %segment.segment, epochs = ?epochs.iter().map(|e| (e.epoch, e.start_offset)).collect::<Vec<_>>(), "started from the remote store");
    Ok(RemoteStart::Started)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_empty_follower_of_a_tiered_topic_with_the_flag_uses_the_last_tiered_offset() {
        assert!(should_fetch_from_last_tiered_offset(true, true, 0, 200));
        assert!(!should_fetch_from_last_tiered_offset(false, true, 0, 200));
        assert!(!should_fetch_from_last_tiered_offset(true, false, 0, 200));
        assert!(!should_fetch_from_last_tiered_offset(true, true, 5, 200));
        assert!(!should_fetch_from_last_tiered_offset(true, true, 0, 0));
    }

    #[test]
    fn the_target_epoch_handles_gaps_in_the_epoch_sequence() {
        // Scenario 1: EPUO 6 in epoch 2; epoch 1 ended at 5, not after 5: epoch 2.
        assert_eq!(target_epoch(2, Some((1, 5)), 5), 2);
        // The previous epoch ran past the target: the target is in it.
        assert_eq!(target_epoch(2, Some((1, 7)), 5), 1);
        assert_eq!(target_epoch(0, None, 5), 0);
        assert_eq!(target_epoch(3, None, 5), 3);
    }
}
