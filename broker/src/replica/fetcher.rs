//! The follower fetchers, one per leader broker, as Kafka's replica fetcher threads: each fetches
//! every partition this broker follows on that leader in one request, within an incremental fetch
//! session (KIP-227, [`super::session`]), so that idle partitions cost nothing. Before fetching a
//! partition from a new leader or epoch it reconciles its log by leader epoch
//! (OffsetsForLeaderEpoch, KIP-101/279), then fetches with its last fetched epoch so the leader
//! can answer with a diverging epoch (KIP-595) instead of records, and truncates again when told
//! to. It never truncates below what the leader's epochs justify — unless the `hw-truncation`
//! bug is injected. One partition's error holds back that partition only.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, ListOffsetsRequest, OffsetForLeaderEpochRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info};

use super::client::KafkaConnection;
use super::session::{FollowerSession, NextFetch, PartitionKey, Wanted};
use crate::partition::Partition;
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
    /// The leader has not adopted our epoch yet: ask again shortly.
    Retry,
    /// Something went wrong with this partition: ask again after the backoff.
    Backoff,
}

/// This broker's follower fetchers, by leader broker.
#[derive(Default)]
pub struct ReplicaFetchers {
    leaders: Mutex<HashMap<i32, RunningFetcher>>,
}

/// A leader's fetcher and the task running its loop.
type RunningFetcher = (Arc<LeaderFetcher>, JoinHandle<()>);

/// The partitions one fetcher fetches from its leader.
struct LeaderFetcher {
    members: Mutex<Members>,
    /// Notified when a partition joins, so a fetch in progress does not hold it up.
    joined: Notify,
}

struct Members {
    address: String,
    partitions: BTreeMap<PartitionKey, Member>,
    next_id: u64,
}

#[derive(Clone)]
struct Member {
    partition: Arc<Partition>,
    target: FetchTarget,
    /// Cancelled when the replica stops following in this epoch (see `Partition::fetcher`).
    cancel: CancellationToken,
    /// Tells this membership from a later one of the same partition.
    id: u64,
}

impl ReplicaFetchers {
    /// Makes `partition` follow `target` until `cancel` fires or the leader fences it, on the
    /// fetcher of `target.leader` (started on first use).
    pub fn follow(
        &self,
        ctx: FollowerContext,
        partition: Arc<Partition>,
        target: FetchTarget,
        cancel: CancellationToken,
    ) {
        info!(topic = ?partition.topic, partition = partition.index, leader = target.leader, epoch = target.leader_epoch, "following");
        let fetcher = {
            let mut leaders = self.leaders.lock().unwrap_or_else(|p| p.into_inner());
            let (fetcher, task) = leaders.entry(target.leader).or_insert_with(|| {
                let fetcher = Arc::new(LeaderFetcher {
                    members: Mutex::new(Members {
                        address: target.address.clone(),
                        partitions: BTreeMap::new(),
                        next_id: 0,
                    }),
                    joined: Notify::new(),
                });
                let task = tokio::spawn(run(ctx.clone(), fetcher.clone()));
                (fetcher, task)
            });
            if task.is_finished() {
                // Only a panic ends the loop: its partitions would follow no one.
                error!(
                    leader = target.leader,
                    "a follower fetcher stopped; starting another"
                );
                *task = tokio::spawn(run(ctx, fetcher.clone()));
            }
            fetcher.clone()
        };
        {
            let mut members = fetcher.lock();
            members.address = target.address.clone();
            members.next_id += 1;
            let member = Member {
                partition: partition.clone(),
                target,
                cancel,
                id: members.next_id,
            };
            members
                .partitions
                .insert((partition.topic.clone(), partition.index), member);
        }
        fetcher.joined.notify_one();
    }
}

impl LeaderFetcher {
    fn lock(&self) -> std::sync::MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The leader's address and the partitions still following it, in order; cancelled ones
    /// leave.
    fn current(&self) -> (String, Vec<(PartitionKey, Member)>) {
        let mut members = self.lock();
        members.partitions.retain(|_, m| !m.cancel.is_cancelled());
        let list = members
            .partitions
            .iter()
            .map(|(k, m)| (k.clone(), m.clone()))
            .collect();
        (members.address.clone(), list)
    }

    /// Takes `key` out, unless it joined again since `id`.
    fn leave(&self, key: &PartitionKey, id: u64) {
        let mut members = self.lock();
        if members.partitions.get(key).is_some_and(|m| m.id == id) {
            members.partitions.remove(key);
        }
    }
}

/// When a partition held back is fetched again, and how many quick retries it has had.
#[derive(Clone, Copy)]
struct HeldBack {
    until: Instant,
    retries: u32,
}

/// One fetcher's loop: connect to the leader, reconcile the partitions that need it, fetch the
/// others in one request, apply each answer. Idle (no connection) while no partition follows
/// the leader.
async fn run(ctx: FollowerContext, fetcher: Arc<LeaderFetcher>) {
    let client_id = format!("replica-{}", ctx.node_id);
    let mut conn: Option<(String, KafkaConnection)> = None;
    let mut session = FollowerSession::default();
    let mut held: HashMap<PartitionKey, HeldBack> = HashMap::new();
    loop {
        // A join before this look at the members needs no new fetch: its notice is spent here.
        let _ = fetcher.joined.notified().now_or_never();
        let (address, members) = fetcher.current();
        held.retain(|k, _| members.binary_search_by(|(m, _)| m.cmp(k)).is_ok());
        if members.is_empty() {
            conn = None;
            fetcher.joined.notified().await;
            continue;
        }
        if conn.as_ref().is_none_or(|(a, _)| *a != address) {
            session.failed(None);
            match KafkaConnection::connect(&address, RPC_TIMEOUT, &client_id).await {
                Ok(c) => conn = Some((address.clone(), c)),
                Err(e) => {
                    debug!(%address, "cannot reach the leader: {e}");
                    conn = None;
                    wait_or_join(&fetcher, BACKOFF).await;
                    continue;
                }
            }
        }
        let Some((_, c)) = conn.as_mut() else {
            continue;
        };
        match round(&ctx, &fetcher, &members, &mut held, &mut session, c).await {
            Ok(Round::Done) => {}
            Ok(Round::Idle(until)) => {
                wait_or_join(&fetcher, until.saturating_duration_since(Instant::now())).await
            }
            Ok(Round::Joined) => {
                // The fetch in progress would hold the newcomer up to its wait: ask again at
                // once on a new connection (the next full fetch closes this session).
                conn = None;
                session.failed(None);
            }
            Err(e) => {
                debug!(%address, "fetching from the leader failed: {e}");
                conn = None;
                session.failed(None);
                wait_or_join(&fetcher, BACKOFF).await;
            }
        }
    }
}

async fn wait_or_join(fetcher: &LeaderFetcher, d: Duration) {
    tokio::select! {
        _ = fetcher.joined.notified() => {}
        _ = tokio::time::sleep(d) => {}
    }
}

enum Round {
    Done,
    /// Nothing to fetch before this instant.
    Idle(Instant),
    /// A partition joined while the fetch waited.
    Joined,
}

async fn round(
    ctx: &FollowerContext,
    fetcher: &LeaderFetcher,
    members: &[(PartitionKey, Member)],
    held: &mut HashMap<PartitionKey, HeldBack>,
    session: &mut FollowerSession,
    conn: &mut KafkaConnection,
) -> anyhow::Result<Round> {
    let now = Instant::now();
    let mut wanted = BTreeMap::new();
    let mut reconciled = false;
    for (key, m) in members {
        if held.get(key).is_some_and(|h| h.until > now) || m.cancel.is_cancelled() {
            continue;
        }
        let p = &m.partition;
        if p.needs_truncation() {
            let step = reconcile(ctx, p, &m.target, conn).await?;
            settle(fetcher, held, key, m, step);
            reconciled = true;
            continue;
        }
        let (fetch_offset, last_fetched_epoch, log_start_offset) = p.follower_fetch_position();
        let w = Wanted {
            fetch_offset,
            current_leader_epoch: m.target.leader_epoch,
            last_fetched_epoch,
            log_start_offset,
            partition_max_bytes: ctx.fetch_max_bytes,
        };
        wanted.insert(key.clone(), w);
    }
    // Only holds still running: a partition asked again after its hold keeps its retry count,
    // and an answer without news for it (left out of an incremental response) does not clear it.
    let next_held = held.values().map(|h| h.until).filter(|t| *t > now).min();
    if wanted.is_empty() && reconciled {
        return Ok(Round::Done);
    }
    if wanted.is_empty() {
        return Ok(Round::Idle(
            next_held.unwrap_or(now + Duration::from_millis(FETCH_MAX_WAIT_MS as u64)),
        ));
    }
    // A partition held back for a quick retry is not kept waiting by the others' long poll.
    let max_wait = next_held.map_or(FETCH_MAX_WAIT_MS, |t| {
        (t.saturating_duration_since(now).as_millis() as i32).clamp(0, FETCH_MAX_WAIT_MS)
    });
    let next = session.next_fetch(&wanted);
    let req = fetch_request(ctx, &next, wanted.len(), max_wait);
    let resp = tokio::select! {
        r = conn.call(12, &req) => r?,
        _ = fetcher.joined.notified() => return Ok(Round::Joined),
    };
    if let Some(code) = ResponseError::try_from_code(resp.error_code) {
        session.failed(Some(resp.error_code));
        anyhow::bail!("fetch refused: {code}");
    }
    session.answered(resp.session_id, wanted);
    let mut appended = false;
    for topic in &resp.responses {
        for pd in &topic.partitions {
            let key = (topic.topic.0.to_string(), pd.partition_index);
            let Ok(at) = members.binary_search_by(|(k, _)| k.cmp(&key)) else {
                continue;
            };
            let m = &members[at].1;
            if m.cancel.is_cancelled() {
                continue;
            }
            let step = apply(ctx, &m.partition, &m.target, conn, pd, &mut appended).await?;
            settle(fetcher, held, &key, m, step);
            // A partition's append is synchronous disk work: let the broker's other tasks
            // (heartbeats, the controller, client requests) in between, as separate fetchers
            // per partition would.
            tokio::task::yield_now().await;
        }
    }
    if appended {
        ctx.data_changed.send_modify(|g| *g = g.wrapping_add(1));
    }
    Ok(Round::Done)
}

/// Acts on a partition's step: it leaves the fetcher, is held back, or goes on.
fn settle(
    fetcher: &LeaderFetcher,
    held: &mut HashMap<PartitionKey, HeldBack>,
    key: &PartitionKey,
    m: &Member,
    step: Step,
) {
    let now = Instant::now();
    match step {
        Step::Continue => {
            held.remove(key);
        }
        Step::Stop => {
            held.remove(key);
            fetcher.leave(key, m.id);
        }
        Step::Retry => {
            let retries = held.get(key).map_or(0, |h| h.retries) + 1;
            let wait = if retries > NEW_EPOCH_RETRIES {
                BACKOFF
            } else {
                NEW_EPOCH_RETRY
            };
            held.insert(
                key.clone(),
                HeldBack {
                    until: now + wait,
                    retries,
                },
            );
        }
        Step::Backoff => {
            held.insert(
                key.clone(),
                HeldBack {
                    until: now + BACKOFF,
                    retries: 0,
                },
            );
        }
    }
}

fn fetch_request(
    ctx: &FollowerContext,
    next: &NextFetch,
    partitions: usize,
    max_wait_ms: i32,
) -> FetchRequest {
    let mut topics: Vec<FetchTopic> = Vec::new();
    for ((topic, index), w) in &next.send {
        let fp = FetchPartition::default()
            .with_partition(*index)
            .with_current_leader_epoch(w.current_leader_epoch)
            .with_fetch_offset(w.fetch_offset)
            .with_last_fetched_epoch(w.last_fetched_epoch)
            .with_log_start_offset(w.log_start_offset)
            .with_partition_max_bytes(w.partition_max_bytes);
        match topics.last_mut() {
            Some(t) if t.topic.0.as_str() == topic => t.partitions.push(fp),
            _ => topics.push(
                FetchTopic::default()
                    .with_topic(topic_name(topic))
                    .with_partitions(vec![fp]),
            ),
        }
    }
    let mut forgotten: Vec<ForgottenTopic> = Vec::new();
    for (topic, index) in &next.forget {
        match forgotten.last_mut() {
            Some(t) if t.topic.0.as_str() == topic => t.partitions.push(*index),
            _ => forgotten.push(
                ForgottenTopic::default()
                    .with_topic(topic_name(topic))
                    .with_partitions(vec![*index]),
            ),
        }
    }
    let total = (ctx.fetch_max_bytes as i64 * partitions.max(1) as i64).min(i32::MAX as i64);
    FetchRequest::default()
        .with_replica_id(BrokerId(ctx.node_id))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(total as i32)
        .with_session_id(next.session_id)
        .with_session_epoch(next.session_epoch)
        .with_topics(topics)
        .with_forgotten_topics_data(forgotten)
}

fn topic_name(topic: &str) -> TopicName {
    TopicName(StrBytes::from_string(topic.to_string()))
}

/// Applies a partition's answer: records appended, a truncation after a diverging epoch, a
/// start from the leader's log start or the remote store, or an error.
async fn apply(
    ctx: &FollowerContext,
    p: &Partition,
    target: &FetchTarget,
    conn: &mut KafkaConnection,
    pd: &PartitionData,
    appended: &mut bool,
) -> anyhow::Result<Step> {
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
                    RemoteStart::Retry => return Ok(Step::Backoff),
                    RemoteStart::Left => return Ok(Step::Stop),
                    RemoteStart::NotApplicable => {}
                }
            }
            if moved {
                return Ok(Step::Backoff);
            }
            return out_of_range(ctx, p, target, conn).await;
        }
        Some(ResponseError::UnknownLeaderEpoch | ResponseError::NotLeaderOrFollower) => {
            return Ok(Step::Retry)
        }
        Some(code) => {
            debug!(topic = ?p.topic, partition = p.index, "fetch error {code}");
            return Ok(Step::Backoff);
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
    *appended = true;
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
        Some(_) => return Ok(Step::Backoff),
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
            return Ok(Step::Backoff);
        }
        offsets.push(r.offset);
    }
    let (leader_end, leader_start) = (offsets[0], offsets[1]);
    if !p.truncate_out_of_range(leader_end, leader_start, Some(target.leader_epoch))? {
        return Ok(Step::Stop);
    }
    Ok(Step::Continue)
}
