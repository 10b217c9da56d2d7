//! The follower fetcher of one partition replica. Before fetching from a new leader or epoch it
//! reconciles its log by leader epoch (OffsetsForLeaderEpoch, KIP-101/279), then fetches with its
//! last fetched epoch so the leader can answer with a diverging epoch (KIP-595) instead of
//! records, and truncates again when told to. It never truncates below what the leader's
//! epochs justify — unless the `hw-truncation` bug is injected.

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, ListOffsetsRequest, OffsetForLeaderEpochRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::client::KafkaConnection;
use crate::broker::Broker;
use crate::errors;
use crate::faults::Bug;
use crate::partition::Partition;

/// Whom to fetch from.
#[derive(Clone, Debug)]
pub struct FetchTarget {
    pub leader: i32,
    pub leader_epoch: i32,
    pub address: String,
}

const RPC_TIMEOUT: Duration = Duration::from_secs(2);
const BACKOFF: Duration = Duration::from_millis(100);
const FETCH_MAX_WAIT_MS: i32 = 250;
const FETCH_MAX_BYTES: i32 = 8 << 20;

enum Step {
    Continue,
    /// The leader fenced us or the epoch moved on: wait for new metadata.
    Stop,
    Reconnect,
}

/// Runs until `cancel` fires or the leader fences this fetcher.
pub async fn run(
    broker: Arc<Broker>,
    partition: Arc<Partition>,
    target: FetchTarget,
    cancel: CancellationToken,
) {
    info!(topic = ?partition.topic, partition = partition.index, leader = target.leader, epoch = target.leader_epoch, "following");
    let client_id = format!("replica-{}", broker.config.node_id);
    loop {
        let conn = tokio::select! {
            _ = cancel.cancelled() => return,
            c = KafkaConnection::connect(&target.address, RPC_TIMEOUT, &client_id) => c,
        };
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                debug!(topic = ?partition.topic, partition = partition.index, "cannot reach leader {}: {e}", target.leader);
                if sleep_or_cancel(&cancel, BACKOFF).await {
                    return;
                }
                continue;
            }
        };
        loop {
            let step = tokio::select! {
                _ = cancel.cancelled() => return,
                s = one_round(&broker, &partition, &target, &mut conn) => s,
            };
            match step {
                Ok(Step::Continue) => {}
                Ok(Step::Stop) => return,
                Ok(Step::Reconnect) | Err(_) => {
                    if let Err(e) = step {
                        debug!(topic = ?partition.topic, partition = partition.index, "fetch from {} failed: {e}", target.leader);
                    }
                    if sleep_or_cancel(&cancel, BACKOFF).await {
                        return;
                    }
                    break;
                }
            }
        }
    }
}

async fn sleep_or_cancel(cancel: &CancellationToken, d: Duration) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => true,
        _ = tokio::time::sleep(d) => false,
    }
}

fn topic_name(p: &Partition) -> TopicName {
    TopicName(StrBytes::from_string(p.topic.clone()))
}

async fn one_round(
    broker: &Broker,
    p: &Partition,
    target: &FetchTarget,
    conn: &mut KafkaConnection,
) -> anyhow::Result<Step> {
    if p.with_state(|s| s.needs_truncation) {
        return reconcile(broker, p, target, conn).await;
    }
    let (fetch_offset, last_epoch, log_start) = p.with_state(|s| {
        (
            s.log.log_end_offset(),
            s.log.latest_epoch(),
            s.log.log_start_offset(),
        )
    });
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(broker.config.node_id))
        .with_max_wait_ms(FETCH_MAX_WAIT_MS)
        .with_min_bytes(1)
        .with_max_bytes(FETCH_MAX_BYTES)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic_name(p))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(p.index)
                .with_current_leader_epoch(target.leader_epoch)
                .with_fetch_offset(fetch_offset)
                .with_last_fetched_epoch(last_epoch)
                .with_log_start_offset(log_start)
                .with_partition_max_bytes(FETCH_MAX_BYTES)])]);
    let resp = conn.call(12, &req).await?;
    let Some(pd) = resp.responses.first().and_then(|t| t.partitions.first()) else {
        anyhow::bail!("fetch response without the partition");
    };
    match pd.error_code {
        errors::NONE => {}
        errors::FENCED_LEADER_EPOCH => {
            info!(topic = ?p.topic, partition = p.index, "fenced by the leader; waiting for new metadata");
            return Ok(Step::Stop);
        }
        errors::OFFSET_OUT_OF_RANGE => return out_of_range(broker, p, target, conn).await,
        code => {
            debug!(topic = ?p.topic, partition = p.index, "fetch error {code}");
            return Ok(Step::Reconnect);
        }
    }
    if pd.diverging_epoch.epoch >= 0 || pd.diverging_epoch.end_offset >= 0 {
        let complete =
            truncate_by_epoch(p, pd.diverging_epoch.epoch, pd.diverging_epoch.end_offset)?;
        p.with_state(|s| s.needs_truncation = !complete);
        return Ok(Step::Continue);
    }
    let records = pd.records.clone().unwrap_or_default();
    let leader_hw = pd.high_watermark;
    let hw = p.with_state(|s| -> anyhow::Result<i64> {
        if !records.is_empty() {
            s.log.append_as_follower(&records)?;
        }
        let hw = leader_hw
            .min(s.log.log_end_offset())
            .max(s.high_watermark.min(s.log.log_end_offset()));
        s.high_watermark = hw;
        Ok(hw)
    })?;
    p.publish_high_watermark(hw);
    broker.notify_data();
    Ok(Step::Continue)
}

/// Truncates the follower per Kafka's `getOffsetTruncationState`, given the leader's answer
/// `(leader_epoch, leader_end)` for our latest epoch. Returns whether truncation is complete.
pub fn truncate_by_epoch(
    p: &Partition,
    leader_epoch: i32,
    leader_end: i64,
) -> anyhow::Result<bool> {
    p.with_state(|s| -> anyhow::Result<bool> {
        let leo = s.log.log_end_offset();
        let (target, complete) = if leader_end < 0 {
            (s.high_watermark, true)
        } else if leader_epoch < 0 {
            (leader_end.min(leo), true)
        } else {
            let (fe, fo) = s.log.end_offset_for_epoch(leader_epoch);
            if fe < 0 {
                (leader_end.min(leo), true)
            } else if fe != leader_epoch {
                (fo.min(leo), false)
            } else {
                (fo.min(leader_end).min(leo), true)
            }
        };
        if target <= leo {
            if target < leo {
                info!(topic = ?p.topic, partition = p.index, from = leo, to = target, "truncating by leader epoch");
            }
            s.log.truncate_to(target)?;
            s.high_watermark = s.high_watermark.min(s.log.log_end_offset());
        }
        Ok(complete)
    })
}

/// Reconciles the log with a new leader before fetching: OffsetsForLeaderEpoch for our latest
/// epoch, then truncation, repeated while incomplete.
async fn reconcile(
    broker: &Broker,
    p: &Partition,
    target: &FetchTarget,
    conn: &mut KafkaConnection,
) -> anyhow::Result<Step> {
    if broker.faults.has(Bug::HwTruncation) {
        // KAFKA-1211: trusting the high watermark throws away records the leader may have
        // acknowledged (they were above our stale HW).
        p.with_state(|s| -> anyhow::Result<()> {
            let hw = s.high_watermark;
            if hw < s.log.log_end_offset() {
                warn!(topic = ?p.topic, partition = p.index, hw, "injected bug hw-truncation: truncating to the high watermark");
                s.log.truncate_to(hw)?;
            }
            s.needs_truncation = false;
            Ok(())
        })?;
        return Ok(Step::Continue);
    }
    let latest = p.with_state(|s| s.log.latest_epoch());
    if latest < 0 {
        p.with_state(|s| s.needs_truncation = false);
        return Ok(Step::Continue);
    }
    let req = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(broker.config.node_id))
        .with_topics(vec![OffsetForLeaderTopic::default()
            .with_topic(topic_name(p))
            .with_partitions(vec![OffsetForLeaderPartition::default()
                .with_partition(p.index)
                .with_current_leader_epoch(target.leader_epoch)
                .with_leader_epoch(latest)])]);
    let resp = conn.call(4, &req).await?;
    let Some(e) = resp.topics.first().and_then(|t| t.partitions.first()) else {
        anyhow::bail!("OffsetForLeaderEpoch response without the partition");
    };
    match e.error_code {
        errors::NONE => {}
        errors::FENCED_LEADER_EPOCH => return Ok(Step::Stop),
        _ => return Ok(Step::Reconnect),
    }
    let complete = truncate_by_epoch(p, e.leader_epoch, e.end_offset)?;
    p.with_state(|s| s.needs_truncation = !complete);
    Ok(Step::Continue)
}

/// Kafka's `fetchOffsetAndTruncate`: a follower ahead of the leader (after an unclean election)
/// truncates to the leader's end; one behind the leader's start starts over there.
async fn out_of_range(
    broker: &Broker,
    p: &Partition,
    target: &FetchTarget,
    conn: &mut KafkaConnection,
) -> anyhow::Result<Step> {
    let mut offsets = Vec::new();
    for ts in [-1i64, -2] {
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(broker.config.node_id))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(topic_name(p))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(p.index)
                    .with_current_leader_epoch(target.leader_epoch)
                    .with_timestamp(ts)])]);
        let resp = conn.call(4, &req).await?;
        let Some(r) = resp.topics.first().and_then(|t| t.partitions.first()) else {
            anyhow::bail!("ListOffsets response without the partition");
        };
        if r.error_code != errors::NONE {
            return Ok(Step::Reconnect);
        }
        offsets.push(r.offset);
    }
    let (leader_end, leader_start) = (offsets[0], offsets[1]);
    p.with_state(|s| -> anyhow::Result<()> {
        let leo = s.log.log_end_offset();
        if leader_end < leo {
            warn!(topic = ?p.topic, partition = p.index, leader_end, leo, "follower ahead of the leader: truncating");
            s.log.truncate_to(leader_end)?;
        } else if leader_start > leo {
            s.log.truncate_fully_and_start_at(leader_start)?;
        }
        s.high_watermark = s.high_watermark.min(s.log.log_end_offset());
        Ok(())
    })?;
    Ok(Step::Continue)
}
