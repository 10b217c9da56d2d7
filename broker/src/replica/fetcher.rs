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
    BrokerId, FetchRequest, ListOffsetsRequest, OffsetForLeaderEpochRequest,
};
use kafka_protocol::ResponseError;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::client::KafkaConnection;
use crate::partition::Partition;
use crate::pause::sleep_or_cancel;
use crate::tiered::follower::{start_from_remote, RemoteStart, TieredFollower};

/// What a follower fetcher needs of its broker, and nothing more.
#[derive(Clone, Debug)]
pub struct FollowerContext {
    /// This broker's id, sent as the fetching replica.
    pub node_id: i32,
    /// The injected `hw-truncation` bug: truncate to the high watermark, not by leader epoch.
    pub hw_truncation: bool,
    /// `replica.fetch.max.bytes`.
    pub fetch_max_bytes: i32,
    /// Bumped when the follower's log or high watermark moved, waking long-polling fetches.
    pub data_changed: Arc<watch::Sender<u64>>,
    /// Tiered storage, when the broker has a remote store.
    pub tiered: Option<TieredFollower>,
}

/// Whom to fetch from.
#[derive(Clone, Debug)]
pub struct FetchTarget {
    pub leader: i32,
    pub leader_epoch: i32,
    pub address: String,
}

const RPC_TIMEOUT: Duration = Duration::from_secs(2);
const BACKOFF: Duration = Duration::from_millis(100);
/// How soon to ask again a leader that does not know our epoch yet: the controller elected it,
/// and it adopts the new metadata within moments of us (a failover waits on this). After
/// `NEW_EPOCH_RETRIES` such answers in a row the usual backoff applies.
const NEW_EPOCH_RETRY: Duration = Duration::from_millis(5);
const NEW_EPOCH_RETRIES: u32 = 20;
const FETCH_MAX_WAIT_MS: i32 = 250;

enum Step {
    Continue,
    /// The leader fenced us or the epoch moved on: wait for new metadata.
    Stop,
    /// The leader has not adopted our epoch yet: ask again shortly on the same connection.
    Retry,
    Reconnect,
}

/// Runs until `cancel` fires or the leader fences this fetcher.
pub async fn run(
    ctx: FollowerContext,
    partition: Arc<Partition>,
    target: FetchTarget,
    cancel: CancellationToken,
) {
    info!(topic = ?partition.topic, partition = partition.index, leader = target.leader, epoch = target.leader_epoch, "following");
    let client_id = format!("replica-{}", ctx.node_id);
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
        let mut retries = 0;
        loop {
            let step = tokio::select! {
                _ = cancel.cancelled() => return,
                s = one_round(&ctx, &partition, &target, &mut conn) => s,
            };
            match step {
                Ok(Step::Continue) => retries = 0,
                Ok(Step::Stop) => return,
                Ok(Step::Retry) => {
                    retries += 1;
                    let wait = if retries > NEW_EPOCH_RETRIES {
                        BACKOFF
                    } else {
                        NEW_EPOCH_RETRY
                    };
                    if sleep_or_cancel(&cancel, wait).await {
                        return;
                    }
                }
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

async fn one_round(
    ctx: &FollowerContext,
    p: &Partition,
    target: &FetchTarget,
    conn: &mut KafkaConnection,
) -> anyhow::Result<Step> {
    if p.needs_truncation() {
        return reconcile(ctx, p, target, conn).await;
    }
    let (fetch_offset, last_epoch, log_start) = p.follower_fetch_position();
    let req = FetchRequest::default()
        .with_replica_id(BrokerId(ctx.node_id))
        .with_max_wait_ms(FETCH_MAX_WAIT_MS)
        .with_min_bytes(1)
        .with_max_bytes(ctx.fetch_max_bytes)
        .with_topics(vec![FetchTopic::default()
            .with_topic(p.topic_name())
            .with_partitions(vec![FetchPartition::default()
                .with_partition(p.index)
                .with_current_leader_epoch(target.leader_epoch)
                .with_fetch_offset(fetch_offset)
                .with_last_fetched_epoch(last_epoch)
                .with_log_start_offset(log_start)
                .with_partition_max_bytes(ctx.fetch_max_bytes)])]);
    let resp = conn.call(12, &req).await?;
    let Some(pd) = resp.responses.first().and_then(|t| t.partitions.first()) else {
        anyhow::bail!("fetch response without the partition");
    };
    match ResponseError::try_from_code(pd.error_code) {
        None => {}
        Some(ResponseError::FencedLeaderEpoch) => {
            info!(topic = ?p.topic, partition = p.index, "fenced by the leader; waiting for new metadata");
            return Ok(Step::Stop);
        }
        Some(
            code @ (ResponseError::OffsetOutOfRange | ResponseError::OffsetMovedToTieredStorage),
        ) => {
            let moved = code == ResponseError::OffsetMovedToTieredStorage;
            if let Some(tiered) = &ctx.tiered {
                let start =
                    start_from_remote(tiered, ctx.node_id, p, target.leader_epoch, conn, moved);
                match start.await? {
                    RemoteStart::Started => return Ok(Step::Continue),
                    RemoteStart::Retry => return Ok(Step::Reconnect),
                    RemoteStart::Left => return Ok(Step::Stop),
                    RemoteStart::NotApplicable => {}
                }
            }
            if moved {
                return Ok(Step::Reconnect);
            }
            return out_of_range(ctx, p, target, conn).await;
        }
        Some(ResponseError::UnknownLeaderEpoch | ResponseError::NotLeaderOrFollower) => {
            return Ok(Step::Retry)
        }
        Some(code) => {
            debug!(topic = ?p.topic, partition = p.index, "fetch error {code}");
            return Ok(Step::Reconnect);
        }
    }
    if pd.diverging_epoch.epoch >= 0 || pd.diverging_epoch.end_offset >= 0 {
        let Some(complete) = p.truncate_by_epoch(
            pd.diverging_epoch.epoch,
            pd.diverging_epoch.end_offset,
            Some(target.leader_epoch),
        )?
        else {
            return Ok(Step::Stop);
        };
        p.set_needs_truncation(!complete);
        return Ok(Step::Continue);
    }
    let records = pd.records.clone().unwrap_or_default();
    if !p.append_as_follower(
        &records,
        pd.high_watermark,
        pd.log_start_offset,
        target.leader_epoch,
    )? {
        return Ok(Step::Stop);
    }
    ctx.data_changed.send_modify(|g| *g = g.wrapping_add(1));
    Ok(Step::Continue)
}

/// Reconciles the log with a new leader before fetching: OffsetsForLeaderEpoch for our latest
/// epoch, then truncation, repeated while incomplete.
async fn reconcile(
    ctx: &FollowerContext,
    p: &Partition,
    target: &FetchTarget,
    conn: &mut KafkaConnection,
) -> anyhow::Result<Step> {
    if ctx.hw_truncation {
        p.truncate_to_high_watermark()?;
        return Ok(Step::Continue);
    }
    let latest = p.latest_epoch();
    if latest < 0 {
        p.set_needs_truncation(false);
        return Ok(Step::Continue);
    }
    let req = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(ctx.node_id))
        .with_topics(vec![OffsetForLeaderTopic::default()
            .with_topic(p.topic_name())
            .with_partitions(vec![OffsetForLeaderPartition::default()
                .with_partition(p.index)
                .with_current_leader_epoch(target.leader_epoch)
                .with_leader_epoch(latest)])]);
    let resp = conn.call(4, &req).await?;
    let Some(e) = resp.topics.first().and_then(|t| t.partitions.first()) else {
        anyhow::bail!("OffsetForLeaderEpoch response without the partition");
    };
    match ResponseError::try_from_code(e.error_code) {
        None => {}
        Some(ResponseError::FencedLeaderEpoch) => return Ok(Step::Stop),
        Some(ResponseError::UnknownLeaderEpoch | ResponseError::NotLeaderOrFollower) => {
            return Ok(Step::Retry)
        }
        Some(_) => return Ok(Step::Reconnect),
    }
    let Some(complete) =
        p.truncate_by_epoch(e.leader_epoch, e.end_offset, Some(target.leader_epoch))?
    else {
        return Ok(Step::Stop);
    };
    p.set_needs_truncation(!complete);
    Ok(Step::Continue)
}

/// Kafka's `fetchOffsetAndTruncate`: a follower ahead of the leader (after an unclean election)
/// truncates to the leader's end; one behind the leader's start starts over there.
async fn out_of_range(
    ctx: &FollowerContext,
    p: &Partition,
    target: &FetchTarget,
    conn: &mut KafkaConnection,
) -> anyhow::Result<Step> {
    let mut offsets = Vec::new();
    for ts in [-1i64, -2] {
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(ctx.node_id))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(p.topic_name())
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(p.index)
                    .with_current_leader_epoch(target.leader_epoch)
                    .with_timestamp(ts)])]);
        let resp = conn.call(4, &req).await?;
        let Some(r) = resp.topics.first().and_then(|t| t.partitions.first()) else {
            anyhow::bail!("ListOffsets response without the partition");
        };
        if r.error_code != 0 {
            return Ok(Step::Reconnect);
        }
        offsets.push(r.offset);
    }
    let (leader_end, leader_start) = (offsets[0], offsets[1]);
    if !p.truncate_out_of_range(leader_end, leader_start, Some(target.leader_epoch))? {
        return Ok(Step::Stop);
    }
    Ok(Step::Continue)
}
