//! The group coordinator: consumer groups (classic rebalance protocol) and their committed
//! offsets, kept in the internal topic `__consumer_offsets`. A group belongs to partition
//! `abs(java_hash(group)) % partitions` of that topic, and its coordinator is that partition's
//! leader, so coordination moves with leadership. A broker that becomes leader of such a
//! partition loads it from its log before it answers for its groups (until then
//! COORDINATOR_LOAD_IN_PROGRESS); one that stops leading drops it (NOT_COORDINATOR). Every
//! change a client must be able to rely on (a commit, an assignment) is appended with acks=all
//! and acknowledged only once the ISR has it, so it survives the coordinator's failover.

pub mod context;
pub mod records;
pub mod state;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::pause::sleep_or_cancel;
use crate::produce::{self, PendingAck};
use context::GroupContext;
use records::{Entry, Loader};
use state::Group;

/// The internal topic of groups and offsets.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// How long an append to `__consumer_offsets` may wait for the ISR (Kafka's
/// `offsets.commit.timeout.ms`).
pub const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// How often sessions, join deadlines and leadership are checked.
const TICK: Duration = Duration::from_millis(100);

/// Bytes read per step while loading a partition.
const LOAD_CHUNK: usize = 1 << 20;

/// Java's `String.hashCode`, which Kafka uses to place a group, so a group lands on the same
/// partition number as in Kafka.
pub fn java_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(c as i32))
}

/// The partition of `__consumer_offsets` that holds `group`.
pub fn partition_for(group: &str, partitions: usize) -> i32 {
    // Kafka's `Utils.abs` maps i32::MIN to 0 rather than overflowing.
    let h = java_hash(group);
    let abs = if h == i32::MIN { 0 } else { h.abs() };
    abs % partitions.max(1) as i32
}

#[derive(Debug, PartialEq, Eq)]
enum Status {
    Loading,
    Loaded,
}

/// The groups of one partition this broker leads, for the leader epoch they were loaded in.
#[derive(Debug)]
struct Shard {
    epoch: i32,
    status: Status,
    groups: BTreeMap<String, Group>,
}

/// The groups this broker coordinates.
pub struct GroupCoordinator {
    broker: GroupContext,
    shards: Mutex<BTreeMap<i32, Shard>>,
}

/// Where a group lives: its partition and the leader epoch this broker leads it in.
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    pub partition: i32,
    pub epoch: i32,
}

/// Maps the error of an append to `__consumer_offsets` to what Kafka tells the client.
fn append_error(code: i16) -> i16 {
    use ResponseError as E;
    match ResponseError::try_from_code(code) {
        Some(E::UnknownTopicOrPartition)
        | Some(E::NotEnoughReplicas)
        | Some(E::NotEnoughReplicasAfterAppend)
        | Some(E::RequestTimedOut) => E::CoordinatorNotAvailable.code(),
        Some(E::NotLeaderOrFollower) | Some(E::KafkaStorageError) => E::NotCoordinator.code(),
        _ => E::UnknownServerError.code(),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl GroupCoordinator {
    pub fn new(broker: GroupContext) -> Self {
        GroupCoordinator {
            broker,
            shards: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, Shard>> {
        self.shards.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The partition of `group` if this broker leads it and has loaded it; otherwise the
    /// error Kafka answers (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, or
    /// COORDINATOR_NOT_AVAILABLE before the topic exists). Starts loading a partition that
    /// this broker leads but has not loaded.
    pub fn place(self: &Arc<Self>, group: &str) -> Result<Placement, i16> {
        let image = self.broker.metadata();
        let Some(topic) = image.topics.get(OFFSETS_TOPIC) else {
            return Err(ResponseError::CoordinatorNotAvailable.code());
        };
        let partition = partition_for(group, topic.partitions.len());
        let Some(epoch) = self
            .broker
            .partition(OFFSETS_TOPIC, partition)
            .and_then(|p| p.leading_epoch())
        else {
            return Err(ResponseError::NotCoordinator.code());
        };
        let mut shards = self.lock();
        match shards.get(&partition) {
            Some(s) if s.epoch == epoch && s.status == Status::Loaded => {
                Ok(Placement { partition, epoch })
            }
            Some(s) if s.epoch == epoch => Err(ResponseError::CoordinatorLoadInProgress.code()),
            _ => {
                self.start_loading(&mut shards, partition, epoch);
                Err(ResponseError::CoordinatorLoadInProgress.code())
            }
        }
    }

    /// Runs `f` on the group (created when `create` and absent) in a placement that is still
    /// current; `None` when the group does not exist and is not to be created.
    pub fn with_group<R>(
        &self,
        at: Placement,
        group: &str,
        create: bool,
        f: impl FnOnce(&mut Group) -> R,
    ) -> Result<Option<R>, i16> {
        let mut shards = self.lock();
        let shard = shards
            .get_mut(&at.partition)
            .filter(|s| s.epoch == at.epoch && s.status == Status::Loaded)
            .ok_or(ResponseError::NotCoordinator.code())?;
        if !shard.groups.contains_key(group) {
            if !create {
                return Ok(None);
            }
            shard.groups.insert(group.to_string(), Group::new(group));
        }
        let g = shard.groups.get_mut(group).expect("inserted above");
        let r = f(g);
        g.tick(Instant::now());
        Ok(Some(r))
    }

    /// Every loaded group of this broker, through `f`; COORDINATOR_LOAD_IN_PROGRESS while a
    /// partition it leads is loading.
    pub fn for_each_group(&self, mut f: impl FnMut(&Group)) -> Result<(), i16> {
        let shards = self.lock();
        if shards.values().any(|s| s.status == Status::Loading) {
            return Err(ResponseError::CoordinatorLoadInProgress.code());
        }
        for g in shards.values().flat_map(|s| s.groups.values()) {
            f(g);
        }
        Ok(())
    }

    /// Appends `entries` to the placement's partition if it is still led in the same epoch,
    /// while holding the coordinator's lock, so appends keep the order of the changes.
    pub fn append(&self, at: Placement, entries: &[Entry]) -> Result<PendingAck, i16> {
        let shards = self.lock();
        self.append_locked(&shards, at, entries)
    }

    fn append_locked(
        &self,
        shards: &BTreeMap<i32, Shard>,
        at: Placement,
        entries: &[Entry],
    ) -> Result<PendingAck, i16> {
        let current = shards
            .get(&at.partition)
            .is_some_and(|s| s.epoch == at.epoch && s.status == Status::Loaded);
        let Some(p) = self
            .broker
            .partition(OFFSETS_TOPIC, at.partition)
            .filter(|p| p.leading_epoch() == Some(at.epoch))
        else {
            return Err(ResponseError::NotCoordinator.code());
        };
        if !current {
            return Err(ResponseError::NotCoordinator.code());
        }
        let batch = records::encode_batch(entries, now_ms()).map_err(|e| {
            warn!("cannot encode a {OFFSETS_TOPIC} batch: {e:#}");
            ResponseError::UnknownServerError.code()
        })?;
        self.broker
            .append_all(p, &batch)
            .map_err(|result| append_error(result.error))
    }

    /// Waits for an append to reach the ISR; its base offset, or the error Kafka tells the
    /// client.
    pub async fn acknowledged(pending: PendingAck) -> Result<i64, i16> {
        let result = produce::await_ack(pending, COMMIT_TIMEOUT).await;
        if result.error == 0 {
            Ok(result.base_offset)
        } else {
            Err(append_error(result.error))
        }
    }

    /// One pass of the coordinator's duties: drop partitions no longer led here, load those
    /// newly led, run every group's timers and store groups that became Empty.
    fn tick(self: &Arc<Self>) {
        let now = Instant::now();
        let led: BTreeMap<i32, i32> = self
            .broker
            .partitions_of(OFFSETS_TOPIC)
            .into_iter()
            .filter_map(|p| Some((p.index, p.leading_epoch()?)))
            .collect();
        let mut shards = self.lock();
        let gone: Vec<i32> = shards
            .iter()
            .filter(|(p, s)| led.get(p) != Some(&s.epoch))
            .map(|(p, _)| *p)
            .collect();
        for p in gone {
            if let Some(mut shard) = shards.remove(&p) {
                info!(
                    partition = p,
                    epoch = shard.epoch,
                    groups = shard.groups.len(),
                    "no longer coordinator of {OFFSETS_TOPIC}-{p}; groups unloaded"
                );
                for g in shard.groups.values_mut() {
                    g.unload();
                }
            }
        }
        for (p, epoch) in &led {
            if !shards.contains_key(p) {
                self.start_loading(&mut shards, *p, *epoch);
            }
        }
        let mut to_store = Vec::new();
        for (p, shard) in shards.iter_mut() {
            if shard.status != Status::Loaded {
                continue;
            }
            for g in shard.groups.values_mut() {
                g.tick(now);
                if std::mem::take(&mut g.store_needed) {
                    to_store.push((
                        Placement {
                            partition: *p,
                            epoch: shard.epoch,
                        },
                        records::group_entry(g),
                    ));
                }
            }
        }
        for (at, entry) in to_store {
            // An Empty group's record only spares a reload the members that left; if it is
            // lost they expire again after loading.
            match self.append_locked(&shards, at, &[entry]) {
                Ok(pending) => {
                    tokio::spawn(async move {
                        if let Err(code) = Self::acknowledged(pending).await {
                            warn!("storing an empty group failed with error {code}");
                        }
                    });
                }
                Err(code) => warn!("storing an empty group failed with error {code}"),
            }
        }
    }

    /// Marks a partition loading and reads it on a task of its own.
    fn start_loading(
        self: &Arc<Self>,
        shards: &mut BTreeMap<i32, Shard>,
        partition: i32,
        epoch: i32,
    ) {
        if let Some(mut old) = shards.insert(
            partition,
            Shard {
                epoch,
                status: Status::Loading,
                groups: BTreeMap::new(),
            },
        ) {
            for g in old.groups.values_mut() {
                g.unload();
            }
        }
        let coordinator = self.clone();
        tokio::spawn(async move {
            let result = coordinator.load(partition, epoch);
            coordinator.finish_loading(partition, epoch, result);
        });
    }

    /// Reads a partition this broker leads from its start to its log end.
    fn load(&self, partition: i32, epoch: i32) -> anyhow::Result<BTreeMap<String, Group>> {
        let p = self
            .broker
            .partition(OFFSETS_TOPIC, partition)
            .ok_or_else(|| anyhow::anyhow!("the replica is gone"))?;
        let mut loader = Loader::default();
        loop {
            let (bytes, end, read_epoch) = p
                .read_to_log_end(loader.next_offset, LOAD_CHUNK)
                .map_err(|code| anyhow::anyhow!("read failed with error {code}"))?;
            if read_epoch != epoch {
                anyhow::bail!("leadership moved to epoch {read_epoch} while loading");
            }
            if loader.next_offset >= end || bytes.is_empty() {
                break;
            }
            loader.apply(&bytes)?;
        }
        loader.finish(Instant::now())
    }

    fn finish_loading(
        &self,
        partition: i32,
        epoch: i32,
        result: anyhow::Result<BTreeMap<String, Group>>,
    ) {
        let mut shards = self.lock();
        let Some(shard) = shards
            .get_mut(&partition)
            .filter(|s| s.epoch == epoch && s.status == Status::Loading)
        else {
            return;
        };
        match result {
            Ok(groups) => {
                info!(
                    partition,
                    epoch,
                    groups = groups.len(),
                    "loaded {OFFSETS_TOPIC}-{partition}; coordinating its groups"
                );
                shard.groups = groups;
                shard.status = Status::Loaded;
            }
            Err(e) => {
                warn!(
                    partition,
                    epoch, "cannot load {OFFSETS_TOPIC}-{partition}: {e:#}"
                );
                // The next request or tick tries again.
                shards.remove(&partition);
            }
        }
    }
}

/// The coordinator's background duty, until `shutdown`.
pub async fn run(coordinator: Arc<GroupCoordinator>, shutdown: CancellationToken) {
    loop {
        if sleep_or_cancel(&shutdown, TICK).await {
            return;
        }
        if coordinator.broker.caught_up() {
            coordinator.tick();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_land_on_kafkas_partitions() {
        // Java: "my-group".hashCode() is -1906497762, and Utils.abs of it % 50 is 12.
        assert_eq!(java_hash("my-group"), -1_906_497_762);
        assert_eq!(partition_for("my-group", 50), 12);
        assert_eq!(java_hash(""), 0);
        assert!((0..10).contains(&partition_for("any group at all", 10)));
    }
}
