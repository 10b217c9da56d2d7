//! The mirror task of one partition on its destination leader. It drives the partition through
//! its mirror states as the metadata names them: PREPARING (LMLE lookup on the source, LMLE
//! truncation, waiting for the ISR or all replicas to truncate too), MIRRORING (consumer fetches
//! from the source leader with the source's leader epoch and the last fetched epoch, appending
//! batches as they are, truncating on a diverging epoch), EPOCH_FENCING (raising the local leader
//! epoch to a mirrored batch's before appending it), STOPPING (persisting the LMLE, then STOPPED
//! with the epoch bumped above it in one metadata change) and FAILED (retry with backoff).
//! Each step changes the state through the controller, so a new leader resumes where the old
//! one was.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeConfigsRequest, FetchRequest, ListOffsetsRequest,
    OffsetForLeaderEpochRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

use super::client::{call, connect_any, metadata};
use super::context::MirrorContext;
use super::groups::sync_group_offsets;
use super::rules::{
    epoch_fencing_target, proactive_bump_target, LmleKey, LmleRecord, MirrorRules, MirrorState,
    TruncationWait,
};
use super::store::write_lmle;
use super::wire::{LmleLookup, MirrorRequest};
use crate::controller::ControllerCommand;
use crate::errors;
use crate::log::batch;
use crate::metadata::{MirrorRegistration, TopicRegistration};
use crate::partition::{AckCheck, Partition};
use crate::pause::sleep_or_cancel;
use crate::replica::client::KafkaConnection;

const FETCH_MAX_WAIT_MS: i32 = 500;
const FETCH_MAX_BYTES: i32 = 32 << 20;
const POLL: Duration = Duration::from_millis(100);

/// The source partition no longer exists (its topic was deleted): no retry can mend that.
#[derive(Debug)]
struct SourceTopicGone(String);

impl std::fmt::Display for SourceTopicGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SourceTopicGone {}

/// Starts the partition's mirror task unless one runs.
pub fn ensure(ctx: &Arc<MirrorContext>, p: &Arc<Partition>) {
    if let Some((id, cancel)) = ctx.tasks.claim(p) {
        tokio::spawn(run(ctx.clone(), p.clone(), cancel, id));
    }
}

/// How often a mirroring topic takes its source topic's configs and group offsets.
const CONFIG_SYNC_INTERVAL: Duration = Duration::from_secs(2);

/// Topic configs a mirror topic keeps its own (KIP-1279's `mirror.topic.properties.exclude`):
/// the flag guards this cluster's own truncations.
const CONFIGS_NOT_SYNCED: &[&str] = &["mirror.support.unclean.leader.election"];

/// DescribeConfigs' resource type of a topic.
const RESOURCE_TOPIC: i8 = 2;

/// KIP-1279's topic config sync: a config set on the source topic is set the same on the mirror
/// topic, and one unset there is unset here.
async fn sync_topic_configs(
    ctx: &MirrorContext,
    mirror: &MirrorRegistration,
    topic: &TopicRegistration,
) -> anyhow::Result<()> {
    let mut conn = connect_any(&mirror.source_bootstrap, "tidemark-mirror").await?;
    let req =
        DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(RESOURCE_TOPIC)
            .with_resource_name(StrBytes::from_string(topic.name.clone()))
            // Every key (the default is the empty list: none).
            .with_configuration_keys(None)]);
    let resp = conn.call(1, &req).await?;
    let r = resp
        .results
        .first()
        .ok_or_else(|| anyhow::anyhow!("DescribeConfigs response without the topic"))?;
    if r.error_code != errors::NONE {
        anyhow::bail!("source DescribeConfigs failed with error {}", r.error_code);
    }
    let synced = |k: &str| !CONFIGS_NOT_SYNCED.contains(&k);
    // Config source 1: set on the topic itself (not a default).
    let wanted: BTreeMap<String, String> = r
        .configs
        .iter()
        .filter(|c| c.config_source == 1 && synced(c.name.as_str()))
        .filter_map(|c| Some((c.name.to_string(), c.value.as_ref()?.to_string())))
        .collect();
    let mut changes: Vec<(String, Option<String>)> = wanted
        .iter()
        .filter(|(k, v)| topic.configs.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    changes.extend(
        topic
            .configs
            .keys()
            .filter(|k| synced(k) && !wanted.contains_key(*k))
            .map(|k| (k.clone(), None)),
    );
    if changes.is_empty() {
        return Ok(());
    }
    info!(topic = %topic.name, ?changes, "topic configs from the source");
    let expect: BTreeMap<String, Option<String>> = changes.iter().cloned().collect();
    let name = topic.name.clone();
    ctx.submit_and_wait(
        ControllerCommand::AlterTopicConfigs {
            name: name.clone(),
            changes,
            validate_only: false,
        },
        |i| {
            i.topics
                .get(&name)
                .is_some_and(|t| expect.iter().all(|(k, v)| t.configs.get(k) == v.as_ref()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("altering the mirror topic's configs: {}", e.message))?;
    Ok(())
}

/// The source partition's leader, connected.
struct SourceLeader {
    conn: KafkaConnection,
    leader_epoch: i32,
    /// The fetch sent ahead while the previous answer was appended: its offset, last fetched
    /// epoch and correlation id.
    prefetch: Option<(i64, i32, i32)>,
}

async fn run(ctx: Arc<MirrorContext>, p: Arc<Partition>, cancel: CancellationToken, id: u64) {
    info!(topic = %p.topic, partition = p.index, "mirror task started");
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = drive(&ctx, &p, &cancel) => {}
    }
    ctx.tasks.finished(&p, id);
    info!(topic = %p.topic, partition = p.index, "mirror task ended");
}

/// The group offset sync in flight, aborted when the mirror task ends.
struct GroupSync(Option<tokio::task::JoinHandle<()>>);

impl Drop for GroupSync {
    fn drop(&mut self) {
        if let Some(h) = self.0.take() {
            h.abort();
        }
    }
}

async fn drive(ctx: &Arc<MirrorContext>, p: &Arc<Partition>, cancel: &CancellationToken) {
    let mut source: Option<SourceLeader> = None;
    let mut configs_synced: Option<tokio::time::Instant> = None;
    let mut group_sync = GroupSync(None);
    loop {
        let image = ctx.metadata();
        let Some(topic) = image.topics.get(&p.topic) else {
            return;
        };
        let Some(tm) = topic.mirror.as_ref() else {
            return;
        };
        let Some(mirror) = image.mirrors.get(&tm.mirror) else {
            return;
        };
        let pm = &tm.partitions[p.index as usize];
        if topic.partitions[p.index as usize].leader != ctx.node_id {
            return;
        }
        let state = pm.state;
        // One task per topic (partition 0's) takes the source topic's configs and its groups'
        // offsets now and then.
        let sync_due = configs_synced.is_none_or(|t| t.elapsed() >= CONFIG_SYNC_INTERVAL);
        if state == MirrorState::Mirroring && p.index == 0 && sync_due {
            configs_synced = Some(tokio::time::Instant::now());
            if let Err(e) = sync_topic_configs(ctx, mirror, topic).await {
                warn!(topic = %p.topic, "topic config sync from the source failed: {e:#}");
            }
            // Beside the mirroring, one at a time: a group sync talks to every source broker
            // and coordinator, and the fetches must not wait for that.
            if group_sync.0.as_ref().is_none_or(|h| h.is_finished()) {
                let (ctx, mirror, topic) = (ctx.clone(), mirror.clone(), topic.clone());
                group_sync.0 = Some(tokio::spawn(async move {
                    if let Err(e) = sync_group_offsets(&ctx, &mirror, &topic).await {
                        warn!(topic = %topic.name, "group offset sync from the source failed: {e:#}");
                    }
                }));
            }
        }
        if state != MirrorState::Mirroring {
            // Whatever a fetch sent ahead brings back would be stale by the time mirroring resumes.
            source = None;
        }
        let step = match state {
            MirrorState::Preparing => prepare(ctx, p, topic, mirror, cancel)
                .await
                .map(|()| Some(MirrorState::Mirroring)),
            MirrorState::Mirroring => {
                mirror_round(ctx, p, mirror, topic.id, &mut source, cancel).await
            }
            MirrorState::EpochFencing => fence_epoch(ctx, p)
                .await
                .map(|()| Some(MirrorState::Mirroring)),
            MirrorState::UleRecovery => {
                ule_recovery(ctx, p, cancel).await;
                Ok(Some(MirrorState::Mirroring))
            }
            MirrorState::Pausing => Ok(Some(MirrorState::Paused)),
            MirrorState::Paused => {
                wait_for_change(ctx).await;
                Ok(None)
            }
            MirrorState::Stopping => stop(ctx, p, topic, mirror).await.map(|()| None),
            MirrorState::Stopped => return,
            MirrorState::Failed if pm.retry_attempt < 0 => {
                // Terminal: only an operator's stop moves it on.
                wait_for_change(ctx).await;
                Ok(None)
            }
            MirrorState::Failed => {
                let exp = pm.retry_attempt.clamp(1, 16) as u32 - 1;
                let backoff =
                    (ctx.retry_initial_backoff * 2u32.pow(exp)).min(ctx.retry_max_backoff);
                tokio::time::sleep(backoff).await;
                Ok(Some(MirrorState::retry_from(pm.failed_in)))
            }
        };
        let (to, message, terminal) = match step {
            // The first round that works after a retry ends the count of failed attempts.
            Ok(None) if state == MirrorState::Mirroring && pm.retry_attempt > 0 => {
                (MirrorState::Mirroring, None, false)
            }
            Ok(None) => continue,
            Ok(Some(to)) => (to, None, false),
            Err(e) => {
                warn!(topic = %p.topic, partition = p.index, state = state.name(), "mirror step failed: {e:#}");
                source = None;
                let terminal = e.downcast_ref::<SourceTopicGone>().is_some()
                    || pm.retry_attempt + 1 >= ctx.retry_max_attempts;
                (MirrorState::Failed, Some(format!("{e:#}")), terminal)
            }
        };
        if cancel.is_cancelled() {
            return;
        }
        let cmd = ControllerCommand::SetMirrorStates {
            topic: p.topic.clone(),
            partitions: Some(vec![p.index]),
            from: Some(state),
            to,
            error: message,
            terminal,
        };
        let (topic_name, index) = (p.topic.clone(), p.index);
        let moved = ctx
            .submit_and_wait(cmd, |i| {
                i.mirror_state(&topic_name, index) != Some(state)
                    || (to == state
                        && i.topics
                            .get(&topic_name)
                            .and_then(|t| t.mirror.as_ref())
                            .and_then(|m| m.partitions.get(index as usize))
                            .is_some_and(|p| p.retry_attempt == 0))
            })
            .await;
        match moved {
            Ok(_) => {
                info!(topic = %p.topic, partition = p.index, from = state.name(), to = to.name(), "mirror state")
            }
            Err(e) => {
                warn!(topic = %p.topic, partition = p.index, "mirror state change failed: {}", e.message);
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

async fn wait_for_change(ctx: &MirrorContext) {
    let mut rx = ctx.images();
    rx.borrow_and_update();
    let _ = tokio::time::timeout(Duration::from_secs(1), rx.changed()).await;
}

/// Asks the source cluster which of this cluster's epochs it recognises for the partition.
async fn lookup_lmle(
    ctx: &MirrorContext,
    mirror: &MirrorRegistration,
    topic: &TopicRegistration,
    index: i32,
) -> anyhow::Result<i32> {
    let mut conn = connect_any(&mirror.source_bootstrap, "tidemark-mirror").await?;
    let req = MirrorRequest::Describe {
        mirror: None,
        lookup: Some(LmleLookup {
            cluster_id: ctx.cluster_id.clone(),
            topic_id: topic.id,
            partitions: vec![index],
        }),
    };
    let resp = call(&mut conn, ctx.api_key_base, &req).await?;
    if resp.error_code != errors::NONE {
        anyhow::bail!(
            "LMLE lookup on {}: error {} {}",
            mirror.source_cluster_id,
            resp.error_code,
            resp.error_message.unwrap_or_default()
        );
    }
    if resp.cluster_id != mirror.source_cluster_id {
        anyhow::bail!(
            "{} now answers as cluster {}, not {}",
            mirror.source_bootstrap,
            resp.cluster_id,
            mirror.source_cluster_id
        );
    }
    Ok(resp
        .lmle
        .iter()
        .find(|(p, _)| *p == index)
        .map_or(-1, |(_, e)| *e))
}

/// PREPARING: KIP-1279's LMLE truncation.
async fn prepare(
    ctx: &MirrorContext,
    p: &Partition,
    topic: &TopicRegistration,
    mirror: &MirrorRegistration,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let lmle = lookup_lmle(ctx, mirror, topic, p.index).await?;
    ctx.tasks.update(p, |s| {
        s.lmle = lmle;
        s.waiting_for = None;
    });
    if ctx.deviations.skip_lmle_truncation {
        warn!(topic = %p.topic, partition = p.index, lmle, "injected bug skip-lmle-truncation: mirroring without the LMLE truncation");
        return Ok(());
    }
    let source = source_epoch_end(mirror, p, topic.id, lmle).await?;
    if let Some(to) = p.lmle_truncation_cut(lmle, source) {
        new_epoch_before_truncation(ctx, p, to, cancel).await?;
    }
    let all_replicas = waits_for_all_replicas(ctx, p);
    // Phase 1: truncate once enough replicas are in the ISR to take part.
    let mut logged = None;
    while let Some(w) = p.lmle_truncate(lmle, source, all_replicas)? {
        note_wait(ctx, p, &mut logged, w);
        if sleep_or_cancel(cancel, POLL).await {
            return Ok(());
        }
    }
    ctx.tasks.update(p, |s| s.truncation_epoch = None);
    p.lift_high_watermark_cap();
    ctx.notify_data();
    // Phase 2: wait until every replica that must take part has truncated too.
    loop {
        let w = p.lmle_truncation_progress(all_replicas);
        if w == TruncationWait::Done {
            break;
        }
        note_wait(ctx, p, &mut logged, w);
        if sleep_or_cancel(cancel, POLL).await {
            return Ok(());
        }
    }
    ctx.tasks.update(p, |s| s.waiting_for = None);
    Ok(())
}

/// The source leader's answer for epoch `lmle` (OffsetsForLeaderEpoch, asked as a consumer
/// asks it, KIP-320): the largest epoch it holds at or below `lmle` and that epoch's end. None
/// for an LMLE of -1, which cuts everything anyway. Found by the harness: without it a replica
/// kept through a failback could hold records the source lacks until the first mirror fetch,
/// and lead with them (an election, or a failover, before that fetch).
async fn source_epoch_end(
    mirror: &MirrorRegistration,
    p: &Partition,
    topic_id: Uuid,
    lmle: i32,
) -> anyhow::Result<Option<(i32, i64)>> {
    if lmle < 0 {
        return Ok(None);
    }
    let mut src = resolve_source(mirror, p, topic_id).await?;
    let req = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![OffsetForLeaderTopic::default()
            .with_topic(TopicName(StrBytes::from_string(p.topic.clone())))
            .with_partitions(vec![OffsetForLeaderPartition::default()
                .with_partition(p.index)
                .with_current_leader_epoch(src.leader_epoch)
                .with_leader_epoch(lmle)])]);
    let resp = src.conn.call(4, &req).await?;
    let Some(e) = resp.topics.first().and_then(|t| t.partitions.first()) else {
        anyhow::bail!("OffsetForLeaderEpoch response without the partition");
    };
    if e.error_code != errors::NONE {
        anyhow::bail!(
            "the source answered OffsetForLeaderEpoch with error {}",
            e.error_code
        );
    }
    Ok(Some((e.leader_epoch, e.end_offset)))
}

/// Moves the leader to a new epoch before a truncation cuts committed records (a failback's
/// LMLE truncation, or a diverging epoch from the source): readers fetching under the old epoch
/// are fenced and, as after any leader change, check their position against the new epoch's
/// log (KIP-320). Truncating under the epoch they read in would take back records they saw
/// committed with nothing to tell them.
///
/// The task goes on in the epoch it moved to and truncates there. Should the broker restart it
/// all the same (the epoch it saw was not the one asked for), the epoch moved to is kept in the
/// task status, so the restarted task truncates in it instead of moving again. In the new epoch
/// the high watermark is held at `to`, where the truncation will cut, from the moment this
/// replica leads in it: the truncation may wait (for the ISR to be large enough), and a reader
/// in the new epoch must not see a high watermark it then takes back.
async fn new_epoch_before_truncation(
    ctx: &MirrorContext,
    p: &Partition,
    to: i64,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let Some(epoch) = p.leading_epoch() else {
        return Ok(());
    };
    let moved_for_it = ctx
        .tasks
        .status(&p.topic, p.index)
        .and_then(|s| s.truncation_epoch);
    if moved_for_it == Some(epoch) {
        p.cap_high_watermark_in_epoch(epoch, to);
        return Ok(());
    }
    ctx.tasks
        .update(p, |s| s.truncation_epoch = Some(epoch + 1));
    p.cap_high_watermark_in_epoch(epoch + 1, to);
    bump_epoch(ctx, p, epoch + 1).await?;
    while p.leading_epoch().is_some_and(|e| e <= epoch) {
        if sleep_or_cancel(cancel, POLL).await {
            break;
        }
    }
    Ok(())
}

/// Whether truncations of this partition wait for every replica, not just the ISR
/// (`mirror.support.unclean.leader.election`, unless the `isr-only-lmle-truncation` bug
/// ignores it).
fn waits_for_all_replicas(ctx: &MirrorContext, p: &Partition) -> bool {
    p.mirror_support_unclean_leader_election() && !ctx.deviations.isr_only_lmle_truncation
}

/// ULE_RECOVERY (KIP-1279, `mirror.support.unclean.leader.election`): after a truncation caused by the source's unclean election,
/// mirroring resumes only once every replica is in the ISR and has followed the truncation.
async fn ule_recovery(ctx: &MirrorContext, p: &Partition, cancel: &CancellationToken) {
    p.start_truncation_watch();
    let mut logged = None;
    loop {
        let w = p.lmle_truncation_progress(true);
        if w == TruncationWait::Done {
            ctx.tasks.update(p, |s| s.waiting_for = None);
            return;
        }
        note_wait(ctx, p, &mut logged, w);
        if sleep_or_cancel(cancel, POLL).await {
            return;
        }
    }
}

/// Logs and reports (through describe) what a preparing partition waits for, when it changes.
fn note_wait(
    ctx: &MirrorContext,
    p: &Partition,
    logged: &mut Option<TruncationWait>,
    w: TruncationWait,
) {
    if logged.as_ref() != Some(&w) {
        info!(topic = %p.topic, partition = p.index, "LMLE truncation waits: {w:?}");
        let why = format!("{w:?}");
        ctx.tasks.update(p, |s| s.waiting_for = Some(why));
        *logged = Some(w);
    }
}

/// Finds and connects to the source partition's leader through the mirror's bootstrap, if the
/// source topic still has this mirror topic's id.
async fn resolve_source(
    mirror: &MirrorRegistration,
    p: &Partition,
    topic_id: Uuid,
) -> anyhow::Result<SourceLeader> {
    let mut conn = connect_any(&mirror.source_bootstrap, "tidemark-mirror").await?;
    let md = metadata(&mut conn, Some(&p.topic)).await?;
    let topic = md.topics.first();
    // An image that knows the source's brokers but not the topic: the topic is gone (a broker
    // still loading its metadata knows neither).
    let gone = !md.brokers.is_empty()
        && topic.is_some_and(|t| t.error_code == errors::UNKNOWN_TOPIC_OR_PARTITION);
    let part = topic
        .filter(|t| t.error_code == errors::NONE)
        .and_then(|t| t.partitions.iter().find(|x| x.partition_index == p.index))
        .ok_or_else(|| {
            let what = format!(
                "source {} has no partition {}-{}",
                mirror.source_cluster_id, p.topic, p.index
            );
            if gone {
                anyhow::Error::new(SourceTopicGone(what))
            } else {
                anyhow::anyhow!(what)
            }
        })?;
    same_source_topic(mirror, p, topic_id, topic.map(|t| t.topic_id))?;
    let leader = part.leader_id.0;
    let b = md
        .brokers
        .iter()
        .find(|b| b.node_id.0 == leader)
        .ok_or_else(|| anyhow::anyhow!("source partition {}-{} has no leader", p.topic, p.index))?;
    let addr = format!("{}:{}", b.host.as_str(), b.port);
    let conn = KafkaConnection::connect(&addr, Duration::from_secs(5), "tidemark-mirror").await?;
    Ok(SourceLeader {
        conn,
        leader_epoch: part.leader_epoch,
        prefetch: None,
    })
}

/// One consumer fetch from the source leader and what follows from its answer. Returns the
/// state to move to, if any.
async fn mirror_round(
    ctx: &MirrorContext,
    p: &Partition,
    mirror: &MirrorRegistration,
    topic_id: Uuid,
    source: &mut Option<SourceLeader>,
    cancel: &CancellationToken,
) -> anyhow::Result<Option<MirrorState>> {
    // A truncation by the source's diverging epoch whose wait for every replica has not ended:
    // the task that truncated was restarted before it moved to ULE_RECOVERY.
    if waits_for_all_replicas(ctx, p) && p.truncation_watch_running() {
        return Ok(Some(MirrorState::UleRecovery));
    }
    if source.is_none() {
        *source = Some(resolve_source(mirror, p, topic_id).await?);
    }
    let src = source.as_mut().expect("just set");
    let (fetch_offset, last_epoch, local_epoch) = p.mirror_fetch_position();
    let answer = match src.prefetch.take() {
        Some((o, e, correlation)) if (o, e) == (fetch_offset, last_epoch) => {
            src.conn.receive::<FetchRequest>(12, correlation).await
        }
        Some(_) => {
            // The log moved under the fetch sent ahead (truncated, or the append failed): its
            // answer is of no use, and a new connection drops it.
            *source = None;
            return Ok(None);
        }
        None => {
            let req = mirror_fetch(p, src.leader_epoch, fetch_offset, last_epoch);
            src.conn.call(12, &req).await
        }
    };
    let resp = match answer {
        Ok(r) => r,
        Err(e) => {
            *source = None;
            return Err(e.context("mirror fetch from the source leader"));
        }
    };
    let Some(pd) = resp.responses.first().and_then(|t| t.partitions.first()) else {
        anyhow::bail!("fetch response without the partition");
    };
    // An OFFSET_OUT_OF_RANGE answer carries the source's high watermark too; answers from a
    // broker that no longer leads carry -1 and leave the last one known.
    if pd.high_watermark >= 0 {
        ctx.tasks
            .update(p, |s| s.source_high_watermark = pd.high_watermark);
    }
    match pd.error_code {
        errors::NONE => {}
        errors::OFFSET_OUT_OF_RANGE => {
            // The fetch named the topic, not its id: never cut this log for another topic.
            check_source_topic(mirror, p, topic_id, src).await?;
            out_of_range(p, src, fetch_offset, last_epoch).await?;
            return Ok(None);
        }
        errors::FENCED_LEADER_EPOCH
        | errors::UNKNOWN_LEADER_EPOCH
        | errors::NOT_LEADER_OR_FOLLOWER
        | errors::LEADER_NOT_AVAILABLE => {
            // The source's leadership moved: follow it through its metadata.
            *source = None;
            tokio::time::sleep(POLL).await;
            return Ok(None);
        }
        errors::UNKNOWN_TOPIC_OR_PARTITION | errors::UNKNOWN_TOPIC_ID => {
            // Deleted, or a restarted leader not hosting it yet: the source's metadata decides.
            *source = Some(resolve_source(mirror, p, topic_id).await?);
            return Ok(None);
        }
        code => anyhow::bail!("source answered the mirror fetch with error {code}"),
    }
    if pd.diverging_epoch.epoch >= 0 || pd.diverging_epoch.end_offset >= 0 {
        check_source_topic(mirror, p, topic_id, src).await?;
        let (epoch, end) = (pd.diverging_epoch.epoch, pd.diverging_epoch.end_offset);
        // The second truncation of a failback (the first fetch after the LMLE truncation) takes
        // back what this cluster wrote under the last mirrored epoch itself, committed records
        // included: as for the LMLE truncation, in a new leader epoch. So is a truncation by an
        // unclean election in the source.
        if let Some(to) = p.epoch_truncation_cut(epoch, end) {
            new_epoch_before_truncation(ctx, p, to, cancel).await?;
        }
        let before = p.log_end_offset();
        p.truncate_by_epoch(epoch, end, None)?;
        ctx.tasks.update(p, |s| s.truncation_epoch = None);
        p.lift_high_watermark_cap();
        ctx.notify_data();
        let truncated = p.log_end_offset() < before;
        if truncated && waits_for_all_replicas(ctx, p) {
            info!(topic = %p.topic, partition = p.index, "the source truncated this mirror (an unclean election there): waiting for every replica");
            p.start_truncation_watch();
            return Ok(Some(MirrorState::UleRecovery));
        }
        return Ok(None);
    }
    let records = pd.records.clone().unwrap_or_default();
    if records.is_empty() {
        follow_log_start(p, pd.log_start_offset)?;
        return Ok(None);
    }
    let span = BatchSpan::of(&records)?;
    let highest = span.highest_epoch;
    if let Some(target) = epoch_fencing_target(highest, local_epoch) {
        info!(topic = %p.topic, partition = p.index, batch_epoch = highest, local_epoch, "mirrored batch is ahead of the local leader epoch");
        ctx.tasks.update(p, |s| s.fencing_target = Some(target));
        return Ok(Some(MirrorState::EpochFencing));
    }
    // Ask for what follows before appending, so the source reads while this broker writes.
    let next = mirror_fetch(p, src.leader_epoch, span.next_offset, span.last_epoch);
    match src.conn.send(12, &next).await {
        Ok(correlation) => {
            src.prefetch = Some((span.next_offset, span.last_epoch, correlation));
        }
        Err(e) => {
            *source = None;
            return Err(e.context("mirror fetch from the source leader"));
        }
    }
    p.append_mirrored(&records, local_epoch)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    follow_log_start(p, pd.log_start_offset)?;
    ctx.notify_data();
    let proactive = proactive_bump_target(
        highest,
        local_epoch,
        ctx.epoch_bump_threshold,
        ctx.epoch_bump_increment,
    );
    if let Some(target) = proactive {
        info!(topic = %p.topic, partition = p.index, batch_epoch = highest, local_epoch, target, "proactive leader epoch bump");
        bump_epoch(ctx, p, target).await?;
    }
    Ok(None)
}

/// KIP-1279: the destination's log start follows the source's (retention or DeleteRecords on
/// the source), as far as the local high watermark.
fn follow_log_start(p: &Partition, source_start: i64) -> anyhow::Result<()> {
    if let Some(start) = p.follow_source_log_start(source_start)? {
        info!(topic = %p.topic, partition = p.index, log_start = start, "log start follows the source's");
    }
    Ok(())
}

/// Refuses a source topic of this name with another id than the mirror topic's: the source
/// topic was deleted and re-created, and its records are not this topic's.
fn same_source_topic(
    mirror: &MirrorRegistration,
    p: &Partition,
    topic_id: Uuid,
    source_id: Option<Uuid>,
) -> anyhow::Result<()> {
    match source_id {
        Some(id) if id != topic_id => Err(anyhow::Error::new(SourceTopicGone(format!(
            "source {} topic {} is {id}, this mirror topic is {topic_id}: the source topic was deleted and re-created",
            mirror.source_cluster_id, p.topic
        )))),
        _ => Ok(()),
    }
}

/// Asks the source (over the fetch connection) which id its topic of this name has now, before
/// its answer cuts this log.
async fn check_source_topic(
    mirror: &MirrorRegistration,
    p: &Partition,
    topic_id: Uuid,
    src: &mut SourceLeader,
) -> anyhow::Result<()> {
    let md = metadata(&mut src.conn, Some(&p.topic)).await?;
    let t = md.topics.first().filter(|t| t.error_code == errors::NONE);
    same_source_topic(mirror, p, topic_id, t.map(|t| t.topic_id))
}

/// A consumer fetch (replica id -1) of the partition from the source leader in `leader_epoch`.
fn mirror_fetch(p: &Partition, leader_epoch: i32, offset: i64, last_epoch: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(FETCH_MAX_WAIT_MS)
        .with_min_bytes(1)
        .with_max_bytes(FETCH_MAX_BYTES)
        .with_topics(vec![FetchTopic::default()
            .with_topic(p.topic_name())
            .with_partitions(vec![FetchPartition::default()
                .with_partition(p.index)
                .with_current_leader_epoch(leader_epoch)
                .with_fetch_offset(offset)
                .with_last_fetched_epoch(last_epoch)
                .with_partition_max_bytes(FETCH_MAX_BYTES)])])
}

/// What the batches of one fetch answer span, from their headers alone: the append checks
/// CRCs and record counts (checking them here too doubled the work per byte).
struct BatchSpan {
    highest_epoch: i32,
    /// The offset after the last batch: where the next fetch starts.
    next_offset: i64,
    /// The last batch's epoch: the next fetch's last fetched epoch.
    last_epoch: i32,
}

impl BatchSpan {
    fn of(records: &[u8]) -> anyhow::Result<BatchSpan> {
        let mut span = BatchSpan {
            highest_epoch: -1,
            next_offset: -1,
            last_epoch: -1,
        };
        let mut pos = 0;
        while pos < records.len() {
            let h = batch::parse_header(&records[pos..])?;
            span.highest_epoch = span.highest_epoch.max(h.leader_epoch);
            span.next_offset = h.next_offset();
            span.last_epoch = h.leader_epoch;
            pos += h.size;
        }
        Ok(span)
    }
}

/// Kafka's `fetchOffsetAndTruncate` toward the source: restart at its log start when we are
/// below it, cut back to its end when we are beyond it. An answer for an offset inside its
/// range means the source knows no epoch at or below our last fetched one, so this log holds an
/// epoch the source never wrote (a mirror leader's own epoch in its cache, records kept past
/// an LMLE truncation that did not happen): the same fetch would get the same answer forever,
/// so the partition fails, naming the epoch, and the operator decides.
async fn out_of_range(
    p: &Partition,
    src: &mut SourceLeader,
    fetch_offset: i64,
    last_epoch: i32,
) -> anyhow::Result<()> {
    let mut offsets = Vec::new();
    for ts in [-1i64, -2] {
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(p.topic_name())
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(p.index)
                    .with_current_leader_epoch(src.leader_epoch)
                    .with_timestamp(ts)])]);
        let resp = src.conn.call(4, &req).await?;
        let r = resp
            .topics
            .first()
            .and_then(|t| t.partitions.first())
            .ok_or_else(|| anyhow::anyhow!("ListOffsets response without the partition"))?;
        if r.error_code != errors::NONE {
            anyhow::bail!("source ListOffsets failed with error {}", r.error_code);
        }
        offsets.push(r.offset);
    }
    let (source_end, source_start) = (offsets[0], offsets[1]);
    if (source_start..=source_end).contains(&fetch_offset) && last_epoch >= 0 {
        anyhow::bail!(
            "the source knows no leader epoch at or below {last_epoch}, the latest of this log (ending at {fetch_offset}; the source's spans {source_start}..{source_end}): this log holds an epoch the source never wrote"
        );
    }
    info!(topic = %p.topic, partition = p.index, source_start, source_end, "out of the source's range: realigning");
    p.truncate_out_of_range(source_end, source_start, None)?;
    Ok(())
}

/// EPOCH_FENCING: raise the local leader epoch to the mirrored batch's (DLE ≥ SLE, M6).
async fn fence_epoch(ctx: &MirrorContext, p: &Partition) -> anyhow::Result<()> {
    let Some(target) = ctx
        .tasks
        .status(&p.topic, p.index)
        .and_then(|s| s.fencing_target)
    else {
        return Ok(());
    };
    bump_epoch(ctx, p, target).await?;
    ctx.tasks.update(p, |s| s.fencing_target = None);
    Ok(())
}

/// Raises the partition's leader epoch to at least `target` through the controller, unless the
/// metadata already has it there. The broker keeps this task running in the new epoch.
async fn bump_epoch(ctx: &MirrorContext, p: &Partition, target: i32) -> anyhow::Result<()> {
    let (topic, index) = (p.topic.clone(), p.index);
    let reached = |i: &crate::metadata::MetadataImage| {
        i.topics
            .get(&topic)
            .and_then(|t| t.partitions.get(index as usize))
            .is_some_and(|r| r.leader_epoch >= target)
    };
    if !reached(&ctx.metadata()) {
        ctx.tasks.moving_to(p, target);
        ctx.submit_and_wait(
            ControllerCommand::BumpLeaderEpoch {
                topic: topic.clone(),
                partition: index,
                min_epoch: target,
            },
            reached,
        )
        .await
        .map_err(|e| anyhow::anyhow!("epoch bump to {target}: {}", e.message))?;
    }
    Ok(())
}

/// STOPPING (KIP-1279's failover): persist the LMLE (the latest epoch of the log), bump the
/// leader epoch above it, write the producer-id reset barrier in the new epoch and wait until the
/// ISR has it, then STOPPED. A barrier opening the latest epoch was written by an earlier try of
/// this stop (nothing else opens an epoch while STOPPING), which had persisted the LMLE already.
async fn stop(
    ctx: &MirrorContext,
    p: &Partition,
    topic: &TopicRegistration,
    mirror: &MirrorRegistration,
) -> anyhow::Result<()> {
    let bump = !ctx.deviations.no_epoch_bump_on_failover;
    let source = &mirror.source_cluster_id;
    let latest = p.latest_epoch();
    let written = p
        .failover_barrier(source)?
        .filter(|(_, epoch)| *epoch == latest && bump);
    match written {
        Some((offset, epoch)) => {
            info!(topic = %p.topic, partition = p.index, offset, epoch, "failover barrier already written");
        }
        None => {
            let lmle = latest;
            if lmle >= 0 {
                let record = LmleRecord {
                    key: LmleKey {
                        mirror: mirror.name.clone(),
                        source_cluster_id: source.clone(),
                        topic_id: topic.id,
                        partition: p.index,
                    },
                    last_mirrored_epoch: lmle,
                };
                write_lmle(ctx, &record).await?;
                info!(topic = %p.topic, partition = p.index, lmle, "LMLE persisted");
            }
            if bump {
                bump_epoch(ctx, p, lmle + 1).await?;
            } else {
                warn!(topic = %p.topic, partition = p.index, "injected bug no-epoch-bump-on-failover: writable without an epoch bump");
            }
            write_failover_barrier(p, source, if bump { lmle + 1 } else { lmle }).await?;
        }
    }
    let (name, index) = (p.topic.clone(), p.index);
    ctx.submit_and_wait(
        ControllerCommand::CompleteMirrorStop {
            topic: name.clone(),
            partition: index,
        },
        |i| i.mirror_state(&name, index) == Some(MirrorState::Stopped),
    )
    .await
    .map_err(|e| anyhow::anyhow!("completing the stop: {}", e.message))?;
    Ok(())
}

/// How long a stop waits to lead in the bumped epoch and for the ISR to hold its barrier before
/// the try fails (and is retried from STOPPING).
const BARRIER_WAIT: Duration = Duration::from_secs(10);

/// Appends the failover barrier once this broker leads in `min_epoch` or later, and waits until
/// the high watermark passes it (acks=all).
async fn write_failover_barrier(p: &Partition, source: &str, min_epoch: i32) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + BARRIER_WAIT;
    let epoch = loop {
        match p.leading_epoch() {
            Some(e) if e >= min_epoch => break e,
            None => anyhow::bail!("the failover barrier: this broker no longer leads"),
            Some(_) if tokio::time::Instant::now() >= deadline => {
                anyhow::bail!("the failover barrier: epoch {min_epoch} never reached this leader")
            }
            Some(_) => tokio::time::sleep(POLL).await,
        }
    };
    let offset = p
        .append_failover_barrier(source, epoch)
        .map_err(|e| anyhow::anyhow!("the failover barrier: {e}"))?;
    info!(topic = %p.topic, partition = p.index, offset, epoch, "failover barrier written");
    let mut hw = p.watch_high_watermark();
    loop {
        match p.check_enough_replicas_reach_offset(offset + 1, epoch) {
            AckCheck::Reached => return Ok(()),
            AckCheck::LeadershipChanged => {
                anyhow::bail!("the failover barrier at {offset}: leadership changed before the ISR had it")
            }
            AckCheck::Waiting => match tokio::time::timeout_at(deadline, hw.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => anyhow::bail!("the failover barrier at {offset}: the partition closed"),
                Err(_) => anyhow::bail!(
                    "the failover barrier at {offset}: the ISR did not have it within {BARRIER_WAIT:?}"
                ),
            },
        }
    }
}
