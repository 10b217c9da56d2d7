//! One partition replica on this broker: its log plus the replication state around it (leader or
//! follower, leader epoch, ISR, high watermark). Produce, fetch and epoch queries go through here
//! so that fencing by leader epoch and the high-watermark rules live in one place.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::error;

use crate::config::LogConfig;
use crate::errors;
use crate::log::{LogError, LogSettings, PartitionLog};
use crate::metadata::{LeaderRecoveryState, PartitionRegistration};

/// Per-partition file recording the last registration this replica acted on, so that
/// `dump-log` can tell roles and epochs without asking a running broker.
pub const STATE_FILE: &str = "partition.state";

/// What a replica last knew of its partition, as persisted in `partition.state`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistedState {
    pub node_id: i32,
    pub leader: i32,
    pub leader_epoch: i32,
    pub isr: Vec<i32>,
    pub replicas: Vec<i32>,
}

/// What the leader knows of one follower.
#[derive(Clone, Copy, Debug)]
pub struct FollowerState {
    pub log_end_offset: i64,
    pub last_caught_up: Instant,
    /// The leader's log end offset when this follower last fetched: reaching it means the
    /// follower was caught up at that fetch (Kafka's `lastFetchLeaderLogEndOffset`).
    pub leader_end_at_last_fetch: i64,
}

/// What a new registration asks of this replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleChange {
    None,
    BecameLeader,
    /// Follow `leader` at `epoch` (a new leader or a new epoch).
    Follow {
        leader: i32,
        epoch: i32,
    },
    /// No leader is available: stop fetching and wait.
    Leaderless,
}

#[derive(Debug)]
pub struct PartitionState {
    pub log: PartitionLog,
    pub config: LogConfig,
    pub node_id: i32,
    pub registration: PartitionRegistration,
    pub high_watermark: i64,
    pub followers: BTreeMap<i32, FollowerState>,
    /// Log end offset when this replica became leader: a follower joins the ISR only once it
    /// has reached it (Kafka's leader epoch start offset).
    pub leader_epoch_start_offset: i64,
    /// Set on becoming a follower: the log must be reconciled with the leader's by leader epoch
    /// before fetching.
    pub needs_truncation: bool,
}

impl PartitionState {
    pub fn is_leader(&self) -> bool {
        self.registration.leader == self.node_id
    }

    pub fn leader_epoch(&self) -> i32 {
        self.registration.leader_epoch
    }

    /// KIP-320: compare a requester's view of the leader epoch with ours.
    pub fn check_leader_epoch(&self, current: i32) -> Result<(), i16> {
        if current < 0 || current == self.leader_epoch() {
            Ok(())
        } else if current < self.leader_epoch() {
            Err(errors::FENCED_LEADER_EPOCH)
        } else {
            Err(errors::UNKNOWN_LEADER_EPOCH)
        }
    }

    /// The minimum ISR size below which the high watermark must not advance (KIP-966).
    pub fn effective_min_isr(&self) -> usize {
        (self.config.min_insync_replicas.max(1) as usize)
            .min(self.registration.replicas.len().max(1))
    }

    /// Moves the leader's high watermark to the smallest log end offset in the ISR, never back,
    /// and not at all while the ISR is under the minimum. Returns whether it moved.
    pub fn maybe_increment_high_watermark(&mut self, strict_min_isr: bool) -> bool {
        if !self.is_leader() {
            return false;
        }
        if strict_min_isr && self.registration.isr.len() < self.effective_min_isr() {
            return false;
        }
        let mut candidate = self.log.log_end_offset();
        for id in &self.registration.isr {
            if *id == self.node_id {
                continue;
            }
            let leo = self
                .followers
                .get(id)
                .map_or(self.high_watermark, |f| f.log_end_offset);
            candidate = candidate.min(leo);
        }
        if candidate > self.high_watermark {
            self.high_watermark = candidate;
            true
        } else {
            false
        }
    }

    /// Records a follower's fetch at `fetch_offset` (its log end offset) on the leader.
    pub fn record_follower_fetch(&mut self, replica: i32, fetch_offset: i64, now: Instant) {
        let leo = self.log.log_end_offset();
        let f = self.followers.entry(replica).or_insert(FollowerState {
            log_end_offset: -1,
            last_caught_up: now,
            leader_end_at_last_fetch: leo,
        });
        if fetch_offset >= leo || fetch_offset >= f.leader_end_at_last_fetch {
            f.last_caught_up = now;
        }
        f.log_end_offset = fetch_offset;
        f.leader_end_at_last_fetch = leo;
    }

    /// Whether `replica` may join the ISR now (caught up to the high watermark and to this
    /// leader's epoch start, and the leader not RECOVERING).
    pub fn may_join_isr(&self, replica: i32) -> bool {
        !self.registration.isr.contains(&replica)
            && self.registration.leader_recovery_state == LeaderRecoveryState::Recovered
            && self.followers.get(&replica).is_some_and(|f| {
                f.log_end_offset >= self.high_watermark
                    && f.log_end_offset >= self.leader_epoch_start_offset
            })
    }

    /// ISR members that have not been caught up for longer than `max_lag`.
    pub fn laggards(&self, now: Instant, max_lag: std::time::Duration) -> Vec<i32> {
        self.registration
            .isr
            .iter()
            .copied()
            .filter(|r| *r != self.node_id)
            .filter(|r| {
                self.followers
                    .get(r)
                    .is_none_or(|f| now.duration_since(f.last_caught_up) > max_lag)
            })
            .collect()
    }

    fn settings(config: &LogConfig) -> LogSettings {
        LogSettings {
            segment_bytes: config.segment_bytes,
            flush_interval_messages: config.flush_interval_messages,
        }
    }
}

/// A partition replica shared by request handlers and background tasks.
#[derive(Debug)]
pub struct Partition {
    pub topic: String,
    pub index: i32,
    dir: PathBuf,
    state: Mutex<PartitionState>,
    high_watermark: watch::Sender<i64>,
    /// At most one AlterPartition in flight per partition, as in Kafka.
    pub alter_in_flight: AtomicBool,
    /// The running follower fetcher, if any: stopping it is cancelling its token.
    pub fetcher: Mutex<Option<CancellationToken>>,
}

/// Directory name of a partition in the log dir: `<topic>-<partition>`, as Kafka names it.
pub fn dir_name(topic: &str, partition: i32) -> String {
    format!("{topic}-{partition}")
}

/// Reports a `partition.state` that cannot be read back or was written by another node. The
/// broker does not act on the file (the controller's metadata is the truth), but a damaged one
/// means something else wrote into this directory, and `dump-log` would misreport the replica.
fn report_bad_state_file(dir: &Path, node_id: i32) {
    let path = dir.join(STATE_FILE);
    let problem = match std::fs::read(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => format!("cannot be read: {e}"),
        Ok(bytes) => match serde_json::from_slice::<PersistedState>(&bytes) {
            Err(e) => format!("is not a valid partition state: {e}"),
            Ok(st) if st.node_id != node_id => format!(
                "was written by node {}, not by this node {node_id}",
                st.node_id
            ),
            Ok(_) => return,
        },
    };
    error!(
        file = %path.display(),
        "{problem}; it is rewritten when this replica adopts its registration"
    );
}

impl Partition {
    /// Opens the replica's log (recovering it) and adopts `registration`.
    pub fn open(
        log_dir: &Path,
        topic: &str,
        index: i32,
        node_id: i32,
        config: LogConfig,
        registration: PartitionRegistration,
        stored_high_watermark: Option<i64>,
    ) -> Result<(Self, Vec<String>), LogError> {
        let dir = log_dir.join(dir_name(topic, index));
        report_bad_state_file(&dir, node_id);
        let (log, notes) = PartitionLog::open(&dir, PartitionState::settings(&config))?;
        let hw = stored_high_watermark
            .unwrap_or(0)
            .clamp(log.log_start_offset(), log.log_end_offset());
        let state = PartitionState {
            log,
            config,
            node_id,
            registration: PartitionRegistration {
                leader: -1,
                leader_epoch: -1,
                ..registration.clone()
            },
            high_watermark: hw,
            followers: BTreeMap::new(),
            leader_epoch_start_offset: 0,
            needs_truncation: false,
        };
        let (tx, _) = watch::channel(hw);
        let p = Partition {
            topic: topic.to_string(),
            index,
            dir,
            state: Mutex::new(state),
            high_watermark: tx,
            alter_in_flight: AtomicBool::new(false),
            fetcher: Mutex::new(None),
        };
        Ok((p, notes))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Runs `f` with the partition state locked.
    pub fn with_state<R>(&self, f: impl FnOnce(&mut PartitionState) -> R) -> R {
        let mut guard = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Subscribes to high-watermark changes (acks=all waits and long-polling fetches).
    pub fn watch_high_watermark(&self) -> watch::Receiver<i64> {
        self.high_watermark.subscribe()
    }

    /// Publishes the current high watermark to waiters.
    pub fn publish_high_watermark(&self, hw: i64) {
        self.high_watermark.send_if_modified(|v| {
            let changed = *v != hw;
            *v = hw;
            changed
        });
    }

    /// Adopts a new registration: a replica that becomes leader at a new epoch records the epoch's
    /// start at its log end, as Kafka's `makeLeader` does; one that follows a new leader or epoch
    /// must truncate by epoch before fetching again.
    pub fn apply_registration(
        &self,
        reg: PartitionRegistration,
        strict_min_isr: bool,
    ) -> Result<RoleChange, LogError> {
        let (hw, change) = self.with_state(|s| -> Result<(i64, RoleChange), LogError> {
            let old = s.registration.clone();
            let me = s.node_id;
            let epoch_changed = reg.leader_epoch != old.leader_epoch || reg.leader != old.leader;
            s.registration = reg;
            let change = if s.registration.leader == me {
                if epoch_changed {
                    s.log.assign_epoch_start(s.registration.leader_epoch)?;
                    s.leader_epoch_start_offset = s.log.log_end_offset();
                    let now = Instant::now();
                    let hw = s.high_watermark;
                    s.followers = s
                        .registration
                        .replicas
                        .iter()
                        .filter(|r| **r != me)
                        .map(|r| {
                            let f = FollowerState {
                                log_end_offset: -1,
                                last_caught_up: now,
                                leader_end_at_last_fetch: hw,
                            };
                            (*r, f)
                        })
                        .collect();
                    RoleChange::BecameLeader
                } else {
                    RoleChange::None
                }
            } else if !epoch_changed {
                RoleChange::None
            } else if s.registration.leader < 0 {
                RoleChange::Leaderless
            } else {
                s.needs_truncation = true;
                s.followers.clear();
                RoleChange::Follow {
                    leader: s.registration.leader,
                    epoch: s.registration.leader_epoch,
                }
            };
            if epoch_changed || old.isr != s.registration.isr {
                let st = PersistedState {
                    node_id: s.node_id,
                    leader: s.registration.leader,
                    leader_epoch: s.registration.leader_epoch,
                    isr: s.registration.isr.clone(),
                    replicas: s.registration.replicas.clone(),
                };
                let path = self.dir.join(STATE_FILE);
                let bytes =
                    serde_json::to_vec(&st).map_err(|e| LogError::Invalid(e.to_string()))?;
                std::fs::write(&path, bytes).map_err(|e| LogError::io(&path, e))?;
            }
            s.maybe_increment_high_watermark(strict_min_isr);
            Ok((s.high_watermark, change))
        })?;
        self.publish_high_watermark(hw);
        Ok(change)
    }

    pub fn set_config(&self, config: LogConfig) {
        self.with_state(|s| {
            s.log.set_settings(PartitionState::settings(&config));
            s.config = config;
        });
    }

    pub fn high_watermark(&self) -> i64 {
        self.with_state(|s| s.high_watermark)
    }

    /// Flushes the log and marks it cleanly closed.
    pub fn close(self) -> Result<(), LogError> {
        let state = self.state.into_inner().unwrap_or_else(|p| p.into_inner());
        state.log.close()
    }
}
