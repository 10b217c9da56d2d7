//! The controller's state machine: one command in, the next metadata image and a reply out.
//! Elections follow Kafka's KRaft controller: a clean leader comes from the ISR among unfenced
//! brokers; an unclean one (when allowed or asked for) from any unfenced replica, with the ISR
//! reset to that leader alone and the leader RECOVERING (KIP-704). The leader epoch moves only
//! when the leader changes or is bumped explicitly; every change moves the partition epoch.
//!
//! With KIP-966's eligible leader replicas on (`eligible.leader.replicas.version=1`), replicas
//! that leave an ISR below `min.insync.replicas` stay eligible (the high watermark cannot pass
//! them then), the ISR may become empty, and an empty ISR's leader comes from them; a broker
//! back from an unclean shutdown leaves them, and with none left the last known leader is
//! elected once it is back. Without it the last ISR member stays in the ISR while fenced.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::config::LogConfig;
use crate::errors;
use crate::metadata::{
    validate_topic_name, BrokerEndpoint, ClusterDefaults, LeaderRecoveryState, MetadataImage,
    MirrorRegistration, PartitionMirror, PartitionRegistration, TopicMirror, TopicRegistration,
};
use crate::mirror::rules::{bumped_epoch, MirrorRules, MirrorState};

/// Kafka's ElectLeaders election types (KIP-460).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Election {
    Preferred,
    Unclean,
}

/// A change to the metadata, as written to the quorum's log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControllerCommand {
    /// A broker process started (or restarted: a new incarnation replaces the old one).
    RegisterBroker {
        endpoint: BrokerEndpoint,
        defaults: ClusterDefaults,
        /// The previous process did not close the log directory cleanly (KIP-966).
        #[serde(default)]
        unclean_shutdown: bool,
    },
    /// The active controller stopped hearing from a broker.
    FenceBroker {
        id: i32,
        incarnation: u64,
    },
    /// A fenced broker's current incarnation is heartbeating again.
    UnfenceBroker {
        id: i32,
        incarnation: u64,
    },
    /// A broker is shutting down cleanly (Kafka's BrokerHeartbeat with `wantShutDown`): its
    /// leaderships move to other ISR members and it leaves the ISRs, as fencing would do, before
    /// it stops.
    ControlledShutdown {
        id: i32,
        incarnation: u64,
    },
    CreateTopic {
        name: String,
        id: Uuid,
        partitions: i32,
        replication_factor: i16,
        configs: BTreeMap<String, String>,
        validate_only: bool,
        /// Replicas per partition chosen by the client; empty for round-robin over live brokers.
        #[serde(default)]
        assignments: Vec<Vec<i32>>,
        /// Created as a mirror topic of this mirror (its id is the source topic's).
        #[serde(default)]
        mirror: Option<String>,
    },
    DeleteTopic {
        name: String,
    },
    AlterTopicConfigs {
        name: String,
        changes: Vec<(String, Option<String>)>,
        validate_only: bool,
    },
    /// Sets or removes (`None`) cluster-default dynamic broker configs.
    AlterClusterConfigs {
        changes: Vec<(String, Option<String>)>,
        validate_only: bool,
    },
    /// A partition leader asks to change its ISR (Kafka's AlterPartition).
    AlterPartition {
        broker_id: i32,
        topic: String,
        partition: i32,
        leader_epoch: i32,
        partition_epoch: i32,
        new_isr: Vec<i32>,
        recovery_state: LeaderRecoveryState,
    },
    /// `partitions: None` means every partition.
    ElectLeaders {
        election: Election,
        partitions: Option<Vec<(String, i32)>>,
    },
    /// Raise the leader epoch of a partition without changing its leader, to at least
    /// `min_epoch` (KIP-1279 needs explicit jumps: epochs are not contiguous).
    BumpLeaderEpoch {
        topic: String,
        partition: i32,
        #[serde(default)]
        min_epoch: i32,
    },
    CreateMirror {
        mirror: MirrorRegistration,
    },
    /// Removes a mirror whose topics are all STOPPED; they become ordinary topics.
    DeleteMirror {
        name: String,
    },
    /// Makes an existing topic of the same id a mirror topic again (failback): PREPARING.
    StartMirrorTopic {
        mirror: String,
        topic: String,
        id: Uuid,
        partitions: i32,
    },
    /// Moves partitions (`None`: all) of a mirror topic to `to`. With `from`, only partitions in
    /// that state move (a leader's step); without it every named partition must be allowed to,
    /// except one already where the move ends (STOPPED for STOPPING, PAUSED for PAUSING), which
    /// is left as it is.
    SetMirrorStates {
        topic: String,
        partitions: Option<Vec<i32>>,
        from: Option<MirrorState>,
        to: MirrorState,
        error: Option<String>,
        /// A FAILED that no retry can mend (the source topic is gone, retries exhausted):
        /// RetryAttempt -1.
        #[serde(default)]
        terminal: bool,
    },
    /// RecoverMirrorTopics: every FAILED partition of the topic that no longer retries
    /// (RetryAttempt -1) goes back to where its retries would go, with its attempts reset.
    RecoverMirrorPartitions {
        topic: String,
    },
    /// The last failover step of a STOPPING partition: STOPPED. Its leader bumped the epoch
    /// and wrote the producer-id reset barrier before asking, so client writes land after both.
    CompleteMirrorStop {
        topic: String,
        partition: i32,
    },
    /// A broker takes the next block of producer ids (Kafka's AllocateProducerIds): blocks
    /// never overlap, so producer ids are unique across the cluster.
    AllocateProducerIds {
        broker_id: i32,
    },
}

const MIN_ISR_KEY: &str = "min.insync.replicas";

/// Producer ids a broker takes at once, as Kafka's controller hands them out.
pub const PRODUCER_ID_BLOCK: i64 = 1000;

/// What `apply` answers for a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ControllerReply {
    Done,
    Error {
        code: i16,
        message: String,
    },
    Topic(TopicRegistration),
    Partition(PartitionRegistration),
    /// One result per partition of an ElectLeaders: topic, partition, error code, message.
    Elections(Vec<(String, i32, i16, Option<String>)>),
    /// A block of producer ids: `first..first + count`.
    ProducerIds {
        first: i64,
        count: i64,
    },
}

fn error(code: i16, message: impl Into<String>) -> ControllerReply {
    ControllerReply::Error {
        code,
        message: message.into(),
    }
}

fn log_config(defaults: &ClusterDefaults, topic: &TopicRegistration) -> LogConfig {
    let mut lc = LogConfig {
        min_insync_replicas: defaults.min_insync_replicas.max(1),
        unclean_leader_election_enable: defaults.unclean_leader_election_enable,
        ..LogConfig::default()
    };
    for (k, v) in &topic.configs {
        let _ = lc.set_topic_key(k, v);
    }
    lc
}

/// Whether a broker may lead or join an ISR: registered, not fenced, not shutting down.
fn usable(image: &MetadataImage, id: i32) -> bool {
    image
        .brokers
        .get(&id)
        .is_some_and(|b| !b.fenced && !b.shutting_down)
}

/// Changes the leader (bumping epochs) and ISR of one partition.
fn set_leader(
    p: &mut PartitionRegistration,
    leader: i32,
    isr: Vec<i32>,
    recovery: LeaderRecoveryState,
) {
    if p.leader != leader {
        p.leader_epoch += 1;
    }
    p.leader = leader;
    p.isr = isr;
    p.leader_recovery_state = recovery;
    p.partition_epoch += 1;
}

/// Elects a leader for a leaderless partition: clean from the ISR, else (the ISR empty) from
/// the eligible leader replicas, else the last known leader once nothing is eligible, else
/// unclean if allowed.
fn elect_if_leaderless(
    image_brokers: &MetadataImage,
    p: &mut PartitionRegistration,
    unclean: bool,
) {
    if p.leader >= 0 {
        return;
    }
    let ready = |r: &i32| usable(image_brokers, *r);
    if let Some(l) = p
        .replicas
        .iter()
        .copied()
        .find(|r| p.isr.contains(r) && ready(r))
    {
        let isr = p.isr.clone();
        set_leader(p, l, isr, LeaderRecoveryState::Recovered);
    } else if let Some(l) = p
        .replicas
        .iter()
        .copied()
        .find(|r| p.isr.is_empty() && p.elr.contains(r) && ready(r))
    {
        p.elr.retain(|r| *r != l);
        p.last_known_leader = None;
        set_leader(p, l, vec![l], LeaderRecoveryState::Recovered);
    } else if let Some(l) = p
        .last_known_leader
        .filter(|l| p.isr.is_empty() && p.elr.is_empty() && ready(l))
    {
        // Nothing else was eligible: the replica that led last has the most a clean election
        // could have kept (KIP-966's last known leader), though it may have lost some.
        p.last_known_leader = None;
        set_leader(p, l, vec![l], LeaderRecoveryState::Recovering);
    } else if unclean {
        if let Some(l) = p.replicas.iter().copied().find(ready) {
            p.elr.clear();
            p.last_known_leader = None;
            set_leader(p, l, vec![l], LeaderRecoveryState::Recovering);
        }
    }
}

/// The eligible leader replicas after the ISR went from `old_isr` to `p.isr` (KIP-966): none
/// while the ISR holds at least `min_isr`; below it, every replica of the old ISR or the ELR
/// not in the new ISR, since the high watermark cannot have passed their log ends.
fn update_elr(p: &mut PartitionRegistration, old_isr: &[i32], min_isr: i32) {
    if p.isr.len() as i32 >= min_isr {
        p.elr.clear();
        p.last_known_leader = None;
        return;
    }
    let mut elr: Vec<i32> = p
        .elr
        .iter()
        .chain(old_isr)
        .copied()
        .filter(|r| !p.isr.contains(r))
        .collect();
    elr.sort_unstable();
    elr.dedup();
    p.elr = elr;
}

/// Fences broker `id` and takes it out of every partition.
fn fence(image: &mut MetadataImage, id: i32) {
    if let Some(b) = image.brokers.get_mut(&id) {
        b.fenced = true;
    }
    remove_from_partitions(image, id);
}

/// Takes broker `id` (no longer usable) out of every partition: off the ISR (unless it is the
/// last member and the eligible leader replicas are off), and away from leadership, electing
/// replacements.
fn remove_from_partitions(image: &mut MetadataImage, id: i32) {
    let snapshot = image.clone();
    let elr_on = snapshot.defaults.eligible_leader_replicas;
    for topic in image.topics.values_mut() {
        let config = log_config(&snapshot.defaults, topic);
        let (unclean, min_isr) = (
            config.unclean_leader_election_enable,
            config.min_insync_replicas,
        );
        for p in topic
            .partitions
            .iter_mut()
            .filter(|p| p.replicas.contains(&id))
        {
            let old_isr = p.isr.clone();
            let shrunk: Vec<i32> = p.isr.iter().copied().filter(|r| *r != id).collect();
            if p.leader == id {
                let next = p
                    .replicas
                    .iter()
                    .copied()
                    .find(|r| shrunk.contains(r) && usable(&snapshot, *r));
                match next {
                    Some(l) => set_leader(p, l, shrunk, LeaderRecoveryState::Recovered),
                    None if elr_on => {
                        set_leader(p, -1, shrunk, p.leader_recovery_state);
                        if p.isr.is_empty() {
                            p.last_known_leader.get_or_insert(id);
                        }
                    }
                    None => {
                        // Last replica standing: it stays in the ISR, the partition goes offline.
                        let isr = if shrunk.is_empty() {
                            p.isr.clone()
                        } else {
                            shrunk
                        };
                        set_leader(p, -1, isr, p.leader_recovery_state);
                    }
                }
            } else if p.isr.contains(&id) && (elr_on || !shrunk.is_empty()) {
                p.isr = shrunk;
                p.partition_epoch += 1;
            } else {
                continue;
            }
            if elr_on {
                update_elr(p, &old_isr, min_isr);
            }
            elect_if_leaderless(&snapshot, p, unclean);
        }
    }
}

/// A broker back with another log directory (KIP-858: the old one is gone, and everything in
/// it) holds none of its partitions' records: it leaves their ISRs and eligible leader replicas
/// and is no longer their last known leader, so it is elected only once it has caught up again
/// (or by an unclean election). Electing it would turn one node's loss into the partition's.
fn forget_lost_log(image: &mut MetadataImage, id: i32) {
    for p in image
        .topics
        .values_mut()
        .flat_map(|t| t.partitions.iter_mut())
        .filter(|p| p.replicas.contains(&id))
    {
        p.isr.retain(|r| *r != id);
        p.elr.retain(|r| *r != id);
        if p.last_known_leader == Some(id) {
            p.last_known_leader = None;
        }
        p.partition_epoch += 1;
    }
}

/// Takes broker `id`, back from an unclean shutdown, out of every partition's eligible leader
/// replicas (KIP-966): its log may have lost what the high watermark had passed.
fn forget_unclean(image: &mut MetadataImage, id: i32) {
    for p in image
        .topics
        .values_mut()
        .flat_map(|t| t.partitions.iter_mut())
        .filter(|p| p.elr.contains(&id))
    {
        p.elr.retain(|r| *r != id);
        p.partition_epoch += 1;
    }
}

fn unfence(image: &mut MetadataImage, id: i32) {
    if let Some(b) = image.brokers.get_mut(&id) {
        b.fenced = false;
    }
    let snapshot = image.clone();
    for topic in image.topics.values_mut() {
        let unclean = log_config(&snapshot.defaults, topic).unclean_leader_election_enable;
        for p in topic.partitions.iter_mut().filter(|p| p.leader < 0) {
            elect_if_leaderless(&snapshot, p, unclean);
        }
    }
}

/// The registration of one partition, or the error reply naming it.
fn partition_mut<'a>(
    image: &'a mut MetadataImage,
    topic: &str,
    partition: i32,
) -> Result<&'a mut PartitionRegistration, ControllerReply> {
    image
        .topics
        .get_mut(topic)
        .and_then(|t| t.partitions.get_mut(partition as usize))
        .ok_or_else(|| {
            error(
                errors::UNKNOWN_TOPIC_OR_PARTITION,
                format!("no partition {topic}-{partition}"),
            )
        })
}

/// Applies one command. Pure: the same image and command always give the same result.
pub fn apply(image: &mut MetadataImage, cmd: &ControllerCommand) -> ControllerReply {
    match cmd {
        ControllerCommand::RegisterBroker {
            endpoint,
            defaults,
            unclean_shutdown,
        } => {
            let replaced = image
                .brokers
                .get(&endpoint.id)
                .is_some_and(|b| b.incarnation != endpoint.incarnation);
            if replaced {
                // The old process is gone: whatever it led must be re-elected.
                fence(image, endpoint.id);
            }
            let lost_log = image
                .brokers
                .get(&endpoint.id)
                .and_then(|b| b.directory_id)
                .zip(endpoint.directory_id)
                .is_some_and(|(old, new)| old != new);
            if lost_log {
                forget_lost_log(image, endpoint.id);
            }
            if *unclean_shutdown {
                forget_unclean(image, endpoint.id);
            }
            image.brokers.insert(
                endpoint.id,
                BrokerEndpoint {
                    fenced: false,
                    shutting_down: false,
                    ..endpoint.clone()
                },
            );
            image.defaults = defaults.clone();
            unfence(image, endpoint.id);
            ControllerReply::Done
        }
        ControllerCommand::FenceBroker { id, incarnation } => {
            match image.brokers.get(id) {
                Some(b) if b.incarnation == *incarnation && !b.fenced => fence(image, *id),
                _ => {
                    return error(
                        errors::INVALID_REQUEST,
                        format!("broker {id}/{incarnation} is not registered and unfenced"),
                    )
                }
            }
            ControllerReply::Done
        }
        ControllerCommand::UnfenceBroker { id, incarnation } => {
            match image.brokers.get(id) {
                Some(b) if b.incarnation == *incarnation && b.fenced => unfence(image, *id),
                _ => {
                    return error(
                        errors::INVALID_REQUEST,
                        format!("broker {id}/{incarnation} is not registered and fenced"),
                    )
                }
            }
            ControllerReply::Done
        }
        ControllerCommand::ControlledShutdown { id, incarnation } => {
            match image.brokers.get_mut(id) {
                Some(b) if b.incarnation == *incarnation => {
                    b.shutting_down = true;
                    remove_from_partitions(image, *id);
                }
                _ => {
                    return error(
                        errors::INVALID_REQUEST,
                        format!("broker {id}/{incarnation} is not registered"),
                    )
                }
            }
            ControllerReply::Done
        }
        ControllerCommand::CreateTopic {
            name,
            id,
            partitions,
            replication_factor,
            configs,
            validate_only,
            assignments,
            mirror,
        } => {
            if let Err(m) = validate_topic_name(name) {
                return error(errors::INVALID_TOPIC_EXCEPTION, m);
            }
            if let Some(other) = image.topic_by_id(*id) {
                return error(
                    errors::TOPIC_ALREADY_EXISTS,
                    format!("topic id {id} is already used by topic {}", other.name),
                );
            }
            if let Some(m) = mirror {
                if !image.mirrors.contains_key(m) {
                    return error(errors::UNKNOWN_CLUSTER_MIRROR, format!("no mirror {m}"));
                }
            }
            if image.topics.contains_key(name) {
                return error(
                    errors::TOPIC_ALREADY_EXISTS,
                    format!("topic {name} already exists"),
                );
            }
            if !(1..=100_000).contains(partitions) {
                return error(
                    errors::INVALID_PARTITIONS,
                    format!("{partitions} partitions"),
                );
            }
            let mut lc = LogConfig::default();
            for (k, v) in configs {
                if let Err(e) = lc.set_topic_key(k, v) {
                    return error(errors::INVALID_CONFIG, e.to_string());
                }
            }
            let live: Vec<i32> = image
                .brokers
                .values()
                .filter(|b| usable(image, b.id))
                .map(|b| b.id)
                .collect();
            let replica_sets: Vec<Vec<i32>> = if assignments.is_empty() {
                let rf = *replication_factor;
                if rf < 1 || rf as usize > live.len() {
                    return error(
                        errors::INVALID_REPLICATION_FACTOR,
                        format!("replication factor {rf} with {} live broker(s)", live.len()),
                    );
                }
                (0..*partitions)
                    .map(|p| {
                        (0..rf as usize)
                            .map(|r| live[(p as usize + r) % live.len()])
                            .collect()
                    })
                    .collect()
            } else {
                for (i, set) in assignments.iter().enumerate() {
                    let mut unique = set.clone();
                    unique.sort_unstable();
                    unique.dedup();
                    if set.is_empty()
                        || unique.len() != set.len()
                        || set.len() != assignments[0].len()
                    {
                        let m = format!(
                            "partition {i}: replicas {set:?} must be distinct, of one size"
                        );
                        return error(errors::INVALID_REQUEST, m);
                    }
                    if let Some(b) = set.iter().find(|b| !image.brokers.contains_key(b)) {
                        let m = format!("partition {i}: broker {b} is not registered");
                        return error(errors::INVALID_REQUEST, m);
                    }
                }
                assignments.clone()
            };
            let parts: Vec<PartitionRegistration> = replica_sets
                .into_iter()
                .map(|replicas| PartitionRegistration {
                    leader: replicas[0],
                    isr: replicas.clone(),
                    replicas,
                    leader_epoch: 0,
                    partition_epoch: 0,
                    leader_recovery_state: LeaderRecoveryState::Recovered,
                    elr: Vec::new(),
                    last_known_leader: None,
                })
                .collect();
            let count = parts.len();
            let topic = TopicRegistration {
                name: name.clone(),
                id: *id,
                partitions: parts,
                configs: configs.clone(),
                mirror: mirror.as_ref().map(|m| Box::new(preparing(m, count))),
            };
            if !validate_only {
                image.topics.insert(name.clone(), topic.clone());
            }
            ControllerReply::Topic(topic)
        }
        ControllerCommand::DeleteTopic { name } => match image.topics.remove(name) {
            Some(_) => ControllerReply::Done,
            None => error(
                errors::UNKNOWN_TOPIC_OR_PARTITION,
                format!("no topic {name}"),
            ),
        },
        ControllerCommand::AlterTopicConfigs {
            name,
            changes,
            validate_only,
        } => {
            let Some(topic) = image.topics.get_mut(name) else {
                return error(
                    errors::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("no topic {name}"),
                );
            };
            let mut configs = topic.configs.clone();
            for (k, v) in changes {
                match v {
                    Some(v) => configs.insert(k.clone(), v.clone()),
                    None => configs.remove(k),
                };
            }
            let mut lc = LogConfig::default();
            for (k, v) in &configs {
                if let Err(e) = lc.set_topic_key(k, v) {
                    return error(errors::INVALID_CONFIG, e.to_string());
                }
            }
            if !validate_only {
                let min_isr_changed = topic.configs.get(MIN_ISR_KEY) != configs.get(MIN_ISR_KEY);
                topic.configs = configs;
                if min_isr_changed {
                    // KIP-966: what made a replica eligible was the old minimum.
                    for p in topic.partitions.iter_mut().filter(|p| !p.elr.is_empty()) {
                        p.elr.clear();
                        p.partition_epoch += 1;
                    }
                }
            }
            ControllerReply::Done
        }
        ControllerCommand::AlterPartition {
            broker_id,
            topic,
            partition,
            leader_epoch,
            partition_epoch,
            new_isr,
            recovery_state,
        } => {
            let snapshot = image.clone();
            let p = match partition_mut(image, topic, *partition) {
                Ok(p) => p,
                Err(reply) => return reply,
            };
            if *leader_epoch > p.leader_epoch || *partition_epoch > p.partition_epoch {
                return error(
                    errors::NOT_CONTROLLER,
                    "request is ahead of this controller",
                );
            }
            if *leader_epoch < p.leader_epoch {
                return error(
                    errors::FENCED_LEADER_EPOCH,
                    format!("leader epoch {leader_epoch} < {}", p.leader_epoch),
                );
            }
            if p.leader != *broker_id {
                return error(
                    errors::INVALID_REQUEST,
                    format!("broker {broker_id} is not the leader"),
                );
            }
            if *partition_epoch < p.partition_epoch {
                return error(
                    errors::INVALID_UPDATE_VERSION,
                    format!("partition epoch {partition_epoch} < {}", p.partition_epoch),
                );
            }
            if !new_isr.contains(broker_id) || new_isr.iter().any(|r| !p.replicas.contains(r)) {
                return error(
                    errors::INVALID_REQUEST,
                    format!("ISR {new_isr:?} must hold the leader and only replicas"),
                );
            }
            if *recovery_state == LeaderRecoveryState::Recovering && new_isr.len() > 1 {
                return error(
                    errors::INVALID_REQUEST,
                    "a RECOVERING leader cannot grow its ISR",
                );
            }
            if p.leader_recovery_state == LeaderRecoveryState::Recovered
                && *recovery_state == LeaderRecoveryState::Recovering
            {
                return error(
                    errors::INVALID_REQUEST,
                    "RECOVERED cannot go back to RECOVERING",
                );
            }
            if let Some(bad) = new_isr
                .iter()
                .find(|r| !p.isr.contains(r) && !usable(&snapshot, **r))
            {
                return error(
                    errors::INELIGIBLE_REPLICA,
                    format!("replica {bad} is fenced or unknown"),
                );
            }
            let old_isr = std::mem::replace(&mut p.isr, new_isr.clone());
            if snapshot.defaults.eligible_leader_replicas {
                let min_isr = snapshot
                    .topics
                    .get(topic)
                    .map_or(1, |t| log_config(&snapshot.defaults, t).min_insync_replicas);
                update_elr(p, &old_isr, min_isr);
            }
            p.leader_recovery_state = *recovery_state;
            p.partition_epoch += 1;
            ControllerReply::Partition(p.clone())
        }
        ControllerCommand::AlterClusterConfigs {
            changes,
            validate_only,
        } => {
            for (k, v) in changes {
                let checked = match v {
                    Some(v) => crate::config::validate_dynamic_cluster_config(k, v),
                    None => crate::config::validate_dynamic_cluster_config(k, "false"),
                };
                if let Err(e) = checked {
                    return error(errors::INVALID_CONFIG, e.to_string());
                }
            }
            if !validate_only {
                for (k, v) in changes {
                    match v {
                        Some(v) => image.cluster_configs.insert(k.clone(), v.clone()),
                        None => image.cluster_configs.remove(k),
                    };
                }
            }
            ControllerReply::Done
        }
        ControllerCommand::ElectLeaders {
            election,
            partitions,
        } => {
            let snapshot = image.clone();
            let targets: Vec<(String, i32)> = match partitions {
                Some(list) => list.clone(),
                None => snapshot
                    .topics
                    .values()
                    .flat_map(|t| (0..t.partitions.len() as i32).map(move |i| (t.name.clone(), i)))
                    .collect(),
            };
            let mut results = Vec::new();
            for (topic, index) in targets {
                let Some(p) = image
                    .topics
                    .get_mut(&topic)
                    .and_then(|t| t.partitions.get_mut(index as usize))
                else {
                    results.push((
                        topic,
                        index,
                        errors::UNKNOWN_TOPIC_OR_PARTITION,
                        Some("no such partition".into()),
                    ));
                    continue;
                };
                let outcome = match election {
                    Election::Preferred => {
                        let preferred = p.replicas[0];
                        if p.leader == preferred {
                            Err((
                                errors::ELECTION_NOT_NEEDED,
                                "the preferred replica already leads",
                            ))
                        } else if p.isr.contains(&preferred) && usable(&snapshot, preferred) {
                            let isr = p.isr.clone();
                            set_leader(p, preferred, isr, p.leader_recovery_state);
                            Ok(())
                        } else {
                            Err((
                                PREFERRED_LEADER_NOT_AVAILABLE,
                                "the preferred replica is not in the ISR or fenced",
                            ))
                        }
                    }
                    Election::Unclean => {
                        if p.leader >= 0 {
                            Err((errors::ELECTION_NOT_NEEDED, "the partition has a leader"))
                        } else {
                            elect_if_leaderless(&snapshot, p, true);
                            if p.leader >= 0 {
                                Ok(())
                            } else {
                                Err((
                                    errors::ELIGIBLE_LEADERS_NOT_AVAILABLE,
                                    "no unfenced replica",
                                ))
                            }
                        }
                    }
                };
                match outcome {
                    Ok(()) => results.push((topic, index, errors::NONE, None)),
                    Err((code, m)) => results.push((topic, index, code, Some(m.to_string()))),
                }
            }
            ControllerReply::Elections(results)
        }
        ControllerCommand::BumpLeaderEpoch {
            topic,
            partition,
            min_epoch,
        } => {
            let p = match partition_mut(image, topic, *partition) {
                Ok(p) => p,
                Err(reply) => return reply,
            };
            p.leader_epoch = bumped_epoch(p.leader_epoch, *min_epoch);
            p.partition_epoch += 1;
            ControllerReply::Partition(p.clone())
        }
        ControllerCommand::AllocateProducerIds { broker_id } => {
            if !image.brokers.contains_key(broker_id) {
                return error(
                    errors::INVALID_REQUEST,
                    format!("broker {broker_id} is not registered"),
                );
            }
            let first = image.next_producer_id;
            image.next_producer_id = first + PRODUCER_ID_BLOCK;
            ControllerReply::ProducerIds {
                first,
                count: PRODUCER_ID_BLOCK,
            }
        }
        ControllerCommand::CreateMirror { mirror } => {
            if image.mirrors.contains_key(&mirror.name) {
                return error(
                    errors::CLUSTER_MIRROR_ALREADY_EXISTS,
                    format!("mirror {} already exists", mirror.name),
                );
            }
            if let Err(m) = validate_topic_name(&mirror.name) {
                return error(errors::INVALID_REQUEST, format!("mirror name: {m}"));
            }
            image.mirrors.insert(mirror.name.clone(), mirror.clone());
            ControllerReply::Done
        }
        ControllerCommand::DeleteMirror { name } => {
            if !image.mirrors.contains_key(name) {
                return error(errors::UNKNOWN_CLUSTER_MIRROR, format!("no mirror {name}"));
            }
            let busy: Vec<&str> = image
                .topics
                .values()
                .filter(|t| {
                    t.mirror.as_ref().is_some_and(|m| {
                        &m.mirror == name
                            && m.partitions.iter().any(|p| p.state != MirrorState::Stopped)
                    })
                })
                .map(|t| t.name.as_str())
                .collect();
            if !busy.is_empty() {
                return error(
                    errors::CLUSTER_MIRROR_NOT_EMPTY,
                    format!("mirror {name} still has topics not STOPPED: {busy:?}"),
                );
            }
            image.mirrors.remove(name);
            for t in image.topics.values_mut() {
                if t.mirror.as_ref().is_some_and(|m| &m.mirror == name) {
                    t.mirror = None;
                }
            }
            ControllerReply::Done
        }
        ControllerCommand::StartMirrorTopic {
            mirror,
            topic,
            id,
            partitions,
        } => {
            if !image.mirrors.contains_key(mirror) {
                return error(
                    errors::UNKNOWN_CLUSTER_MIRROR,
                    format!("no mirror {mirror}"),
                );
            }
            let Some(t) = image.topics.get_mut(topic) else {
                return error(
                    errors::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("no topic {topic}"),
                );
            };
            if t.id != *id || t.partitions.len() as i32 != *partitions {
                return error(
                    errors::INVALID_REQUEST,
                    format!(
                        "topic {topic} is {} with {} partition(s); the source is {id} with {partitions}",
                        t.id,
                        t.partitions.len()
                    ),
                );
            }
            if let Some(m) = &t.mirror {
                if m.partitions.iter().any(|p| p.state != MirrorState::Stopped) {
                    return error(
                        errors::TOPIC_ALREADY_IN_CLUSTER_MIRROR,
                        format!("topic {topic} is mirroring in mirror {}", m.mirror),
                    );
                }
            }
            t.mirror = Some(Box::new(preparing(mirror, t.partitions.len())));
            ControllerReply::Done
        }
        ControllerCommand::SetMirrorStates {
            topic,
            partitions,
            from,
            to,
            error: message,
            terminal,
        } => {
            let Some(m) = image.topics.get_mut(topic).and_then(|t| t.mirror.as_mut()) else {
                return error(
                    errors::TOPIC_NOT_IN_CLUSTER_MIRROR,
                    format!("topic {topic} is not a mirror topic"),
                );
            };
            let targets: Vec<i32> = match partitions {
                Some(list) => list.clone(),
                None => (0..m.partitions.len() as i32).collect(),
            };
            let mut next = m.partitions.clone();
            for i in targets {
                let Some(p) = next.get_mut(i as usize) else {
                    return error(
                        errors::UNKNOWN_TOPIC_OR_PARTITION,
                        format!("no partition {topic}-{i}"),
                    );
                };
                if from.is_some_and(|f| f != p.state) {
                    continue;
                }
                // A stop or pause asked again after some partitions finished it (the first ask
                // timed out, or went to another broker) leaves those as they are.
                if *to != p.state && to.ends_in() == p.state {
                    continue;
                }
                if !p.state.may_become(*to) {
                    return error(
                        errors::INVALID_CLUSTER_MIRROR_STATES,
                        format!(
                            "{topic}-{i}: {} cannot become {}",
                            p.state.name(),
                            to.name()
                        ),
                    );
                }
                match to {
                    MirrorState::Failed => {
                        p.retry_attempt = if *terminal { -1 } else { p.retry_attempt + 1 };
                        if p.state != MirrorState::Failed {
                            p.failed_in = Some(p.state);
                        }
                    }
                    // A retry keeps counting its attempts until a round works (the mirror task
                    // then moves MIRRORING to itself); any other way in starts afresh.
                    MirrorState::Mirroring if p.state != MirrorState::Failed => {
                        p.retry_attempt = 0;
                        p.failed_in = None;
                    }
                    _ => {}
                }
                if message.is_some() || *to == MirrorState::Mirroring {
                    p.last_error = message.clone();
                }
                p.state = *to;
            }
            m.partitions = next;
            ControllerReply::Done
        }
        ControllerCommand::RecoverMirrorPartitions { topic } => {
            let Some(m) = image.topics.get_mut(topic).and_then(|t| t.mirror.as_mut()) else {
                return error(
                    errors::TOPIC_NOT_IN_CLUSTER_MIRROR,
                    format!("topic {topic} is not a mirror topic"),
                );
            };
            for p in &mut m.partitions {
                if p.state == MirrorState::Failed && p.retry_attempt < 0 {
                    p.state = MirrorState::retry_from(p.failed_in);
                    p.retry_attempt = 0;
                }
            }
            ControllerReply::Done
        }
        ControllerCommand::CompleteMirrorStop { topic, partition } => {
            let state = image.mirror_state(topic, *partition);
            if state != Some(MirrorState::Stopping) {
                return error(
                    errors::INVALID_CLUSTER_MIRROR_STATES,
                    format!("{topic}-{partition} is {state:?}, not STOPPING"),
                );
            }
            let t = image.topics.get_mut(topic).expect("checked above");
            if let Some(m) = t.mirror.as_mut() {
                m.partitions[*partition as usize].state = MirrorState::Stopped;
            }
            let p = &mut t.partitions[*partition as usize];
            p.partition_epoch += 1;
            ControllerReply::Partition(p.clone())
        }
    }
}

fn preparing(mirror: &str, partitions: usize) -> TopicMirror {
    TopicMirror {
        mirror: mirror.to_string(),
        partitions: vec![
            PartitionMirror {
                state: MirrorState::Preparing,
                retry_attempt: 0,
                last_error: None,
                failed_in: None,
            };
            partitions
        ],
    }
}

/// Kafka's PREFERRED_LEADER_NOT_AVAILABLE.
const PREFERRED_LEADER_NOT_AVAILABLE: i16 = 80;

#[cfg(test)]
mod tests {
    use super::*;

    fn register(image: &mut MetadataImage, id: i32, incarnation: u64) {
        register_with(image, id, incarnation, false, false);
    }

    /// Registers broker `id`, with KIP-966's eligible leader replicas on or off, back from an
    /// unclean shutdown or not.
    fn register_with(
        image: &mut MetadataImage,
        id: i32,
        incarnation: u64,
        elr: bool,
        unclean: bool,
    ) {
        register_in(image, id, incarnation, elr, unclean, None);
    }

    /// As [`register_with`], with the broker's log directory id.
    fn register_in(
        image: &mut MetadataImage,
        id: i32,
        incarnation: u64,
        elr: bool,
        unclean: bool,
        directory_id: Option<Uuid>,
    ) {
        let endpoint = BrokerEndpoint {
            id,
            host: "h".into(),
            port: 9000 + id as u16,
            incarnation,
            fenced: false,
            shutting_down: false,
            directory_id,
        };
        let defaults = ClusterDefaults {
            unclean_leader_election_enable: false,
            min_insync_replicas: 1,
            eligible_leader_replicas: elr,
        };
        assert_eq!(
            apply(
                image,
                &ControllerCommand::RegisterBroker {
                    endpoint,
                    defaults,
                    unclean_shutdown: unclean,
                }
            ),
            ControllerReply::Done
        );
    }

    /// Three brokers with eligible leader replicas on, and topic `t` (one partition, RF 3,
    /// `min.insync.replicas=2`) led by 1.
    fn elr_cluster() -> MetadataImage {
        let mut image = MetadataImage::default();
        for id in 1..=3 {
            register_with(&mut image, id, 10, true, false);
        }
        let cmd = ControllerCommand::CreateTopic {
            name: "t".into(),
            id: Uuid::nil(),
            partitions: 1,
            replication_factor: 3,
            configs: [(MIN_ISR_KEY.to_string(), "2".to_string())].into(),
            validate_only: false,
            assignments: Vec::new(),
            mirror: None,
        };
        assert!(matches!(apply(&mut image, &cmd), ControllerReply::Topic(_)));
        image
    }

    fn state(image: &MetadataImage) -> (i32, Vec<i32>, Vec<i32>, Option<i32>) {
        let p = part(image);
        (p.leader, p.isr.clone(), p.elr.clone(), p.last_known_leader)
    }

    fn unfence_cmd(id: i32) -> ControllerCommand {
        ControllerCommand::UnfenceBroker {
            id,
            incarnation: 10,
        }
    }

    #[test]
    fn replicas_leaving_an_isr_below_the_minimum_stay_eligible_and_lead_once_it_is_empty() {
        let mut image = elr_cluster();
        apply(&mut image, &fence_cmd(3));
        // At the minimum: nothing is kept.
        assert_eq!(state(&image), (1, vec![1, 2], vec![], None));
        apply(&mut image, &fence_cmd(2));
        assert_eq!(state(&image), (1, vec![1], vec![2], None));
        apply(&mut image, &unfence_cmd(2));
        // The last ISR member goes too: the ISR empties, and 2, unfenced, leads from the ELR.
        let epoch = part(&image).leader_epoch;
        apply(&mut image, &fence_cmd(1));
        assert_eq!(state(&image), (2, vec![2], vec![1], None));
        assert_eq!(
            part(&image).leader_epoch,
            epoch + 2,
            "through no leader to 2"
        );
        assert_eq!(
            part(&image).leader_recovery_state,
            LeaderRecoveryState::Recovered
        );
        // 3, out of the ISR while it was at the minimum, was never eligible.
        apply(&mut image, &unfence_cmd(3));
        apply(&mut image, &unfence_cmd(1));
        let alter = |isr: Vec<i32>, image: &MetadataImage| ControllerCommand::AlterPartition {
            broker_id: 2,
            topic: "t".into(),
            partition: 0,
            leader_epoch: part(image).leader_epoch,
            partition_epoch: part(image).partition_epoch,
            new_isr: isr,
            recovery_state: LeaderRecoveryState::Recovered,
        };
        // Back at the minimum through AlterPartition: the ELR is cleared.
        let cmd = alter(vec![2, 3], &image);
        assert!(matches!(
            apply(&mut image, &cmd),
            ControllerReply::Partition(_)
        ));
        assert_eq!(state(&image), (2, vec![2, 3], vec![], None));
        // Below it again: the replica the leader dropped is eligible.
        let cmd = alter(vec![2], &image);
        assert!(matches!(
            apply(&mut image, &cmd),
            ControllerReply::Partition(_)
        ));
        assert_eq!(state(&image), (2, vec![2], vec![3], None));
        // A new minimum clears it (KIP-966).
        let cmd = ControllerCommand::AlterTopicConfigs {
            name: "t".into(),
            changes: vec![(MIN_ISR_KEY.into(), Some("1".into()))],
            validate_only: false,
        };
        assert_eq!(apply(&mut image, &cmd), ControllerReply::Done);
        assert_eq!(state(&image), (2, vec![2], vec![], None));
    }

    #[test]
    fn a_broker_back_from_an_unclean_shutdown_is_no_longer_eligible() {
        let mut image = elr_cluster();
        apply(&mut image, &fence_cmd(3));
        apply(&mut image, &fence_cmd(2));
        apply(&mut image, &fence_cmd(1));
        // Nobody eligible is unfenced: no leader; 1 led last.
        assert_eq!(state(&image), (-1, vec![], vec![1, 2], Some(1)));
        // 2 comes back from a crash: its log may have lost what it had.
        register_with(&mut image, 2, 11, true, true);
        assert_eq!(state(&image), (-1, vec![], vec![1], Some(1)));
        // 1 comes back from a clean shutdown and leads.
        register_with(&mut image, 1, 11, true, false);
        assert_eq!(state(&image), (1, vec![1], vec![], None));
        assert_eq!(
            part(&image).leader_recovery_state,
            LeaderRecoveryState::Recovered
        );
    }

    #[test]
    fn with_nothing_eligible_left_the_last_known_leader_leads_once_back() {
        let mut image = elr_cluster();
        apply(&mut image, &fence_cmd(3));
        apply(&mut image, &fence_cmd(2));
        apply(&mut image, &fence_cmd(1));
        register_with(&mut image, 2, 11, true, true);
        register_with(&mut image, 3, 11, true, true);
        assert_eq!(state(&image), (-1, vec![], vec![1], Some(1)));
        register_with(&mut image, 1, 11, true, true);
        assert_eq!(state(&image), (1, vec![1], vec![], None));
        assert_eq!(
            part(&image).leader_recovery_state,
            LeaderRecoveryState::Recovering
        );
    }

    #[test]
    fn a_last_known_leader_back_with_another_log_directory_is_not_elected() {
        let dir = |n: u128| Some(Uuid::from_u128(n));
        let crashed = || {
            let mut image = elr_cluster();
            for id in 1..=3 {
                register_in(&mut image, id, 10, true, false, dir(id as u128));
            }
            apply(&mut image, &fence_cmd(3));
            apply(&mut image, &fence_cmd(2));
            apply(&mut image, &fence_cmd(1));
            register_in(&mut image, 2, 11, true, true, dir(2));
            register_in(&mut image, 3, 11, true, true, dir(3));
            assert_eq!(state(&image), (-1, vec![], vec![1], Some(1)));
            image
        };
        // 1 comes back with a new, empty log directory: it must catch up before it leads.
        let mut image = crashed();
        register_in(&mut image, 1, 11, true, true, dir(11));
        assert_eq!(state(&image), (-1, vec![], vec![], None));
        // Its old directory back from a crash: it leads as the last eligible replica.
        let mut image = crashed();
        register_in(&mut image, 1, 11, true, true, dir(1));
        assert_eq!(state(&image), (1, vec![1], vec![], None));
    }

    #[test]
    fn without_eligible_leader_replicas_the_last_isr_member_stays_through_a_crash() {
        let mut image = cluster(false);
        apply(&mut image, &fence_cmd(2));
        apply(&mut image, &fence_cmd(3));
        apply(&mut image, &fence_cmd(1));
        register_with(&mut image, 1, 11, false, true);
        assert_eq!(state(&image), (1, vec![1], vec![], None));
    }

    #[test]
    fn producer_id_blocks_never_overlap() {
        let mut image = MetadataImage::default();
        register(&mut image, 1, 10);
        register(&mut image, 2, 10);
        let mut seen = Vec::new();
        for broker_id in [1, 2, 1] {
            match apply(
                &mut image,
                &ControllerCommand::AllocateProducerIds { broker_id },
            ) {
                ControllerReply::ProducerIds { first, count } => seen.push((first, count)),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(seen, vec![(0, 1000), (1000, 1000), (2000, 1000)]);
        assert!(matches!(
            apply(
                &mut image,
                &ControllerCommand::AllocateProducerIds { broker_id: 9 }
            ),
            ControllerReply::Error { .. }
        ));
    }

    #[test]
    fn cluster_configs_take_only_dynamic_keys_with_valid_values() {
        let key = "follower.fetch.last.tiered.offset.enable".to_string();
        let alter = |changes: Vec<(String, Option<String>)>, validate_only| {
            ControllerCommand::AlterClusterConfigs {
                changes,
                validate_only,
            }
        };
        let mut image = MetadataImage::default();
        let on = vec![(key.clone(), Some("true".to_string()))];
        assert_eq!(
            apply(&mut image, &alter(on.clone(), true)),
            ControllerReply::Done
        );
        assert!(image.cluster_configs.is_empty(), "validate only");
        assert_eq!(apply(&mut image, &alter(on, false)), ControllerReply::Done);
        assert_eq!(
            image.cluster_configs.get(&key).map(String::as_str),
            Some("true")
        );
        for bad in [
            (key.clone(), Some("yes".to_string())),
            ("log.retention.ms".to_string(), Some("1".to_string())),
        ] {
            match apply(&mut image, &alter(vec![bad.clone()], false)) {
                ControllerReply::Error { code, message } => {
                    assert_eq!(code, errors::INVALID_CONFIG);
                    assert!(message.contains(&bad.0), "{message}");
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert_eq!(
            image.cluster_configs.get(&key).map(String::as_str),
            Some("true")
        );
        assert_eq!(
            apply(&mut image, &alter(vec![(key, None)], false)),
            ControllerReply::Done
        );
        assert!(image.cluster_configs.is_empty());
    }

    fn cluster(unclean: bool) -> MetadataImage {
        let mut image = MetadataImage::default();
        for id in 1..=3 {
            register(&mut image, id, 10);
        }
        let mut configs = BTreeMap::new();
        configs.insert(
            "unclean.leader.election.enable".to_string(),
            unclean.to_string(),
        );
        let cmd = ControllerCommand::CreateTopic {
            name: "t".into(),
            id: Uuid::nil(),
            partitions: 1,
            replication_factor: 3,
            configs,
            validate_only: false,
            assignments: Vec::new(),
            mirror: None,
        };
        assert!(matches!(apply(&mut image, &cmd), ControllerReply::Topic(_)));
        image
    }

    fn part(image: &MetadataImage) -> &PartitionRegistration {
        &image.topics["t"].partitions[0]
    }

    fn fence_cmd(id: i32) -> ControllerCommand {
        ControllerCommand::FenceBroker {
            id,
            incarnation: 10,
        }
    }

    #[test]
    fn clean_failover_bumps_epoch_and_shrinks_isr() {
        let mut image = cluster(false);
        assert_eq!((part(&image).leader, part(&image).leader_epoch), (1, 0));
        apply(&mut image, &fence_cmd(1));
        assert_eq!((part(&image).leader, part(&image).leader_epoch), (2, 1));
        assert_eq!(part(&image).isr, vec![2, 3]);
        // A follower fenced: ISR shrinks, epoch stays.
        apply(&mut image, &fence_cmd(3));
        assert_eq!(
            (
                part(&image).leader,
                part(&image).leader_epoch,
                part(&image).isr.clone()
            ),
            (2, 1, vec![2])
        );
    }

    #[test]
    fn last_replica_standing_stays_in_isr_and_returns_as_leader() {
        let mut image = cluster(false);
        apply(&mut image, &fence_cmd(2));
        apply(&mut image, &fence_cmd(3));
        apply(&mut image, &fence_cmd(1));
        assert_eq!(part(&image).leader, -1);
        assert_eq!(part(&image).isr, vec![1]);
        // A stale replica coming back does not lead without unclean election.
        apply(
            &mut image,
            &ControllerCommand::UnfenceBroker {
                id: 2,
                incarnation: 10,
            },
        );
        assert_eq!(part(&image).leader, -1);
        apply(
            &mut image,
            &ControllerCommand::UnfenceBroker {
                id: 1,
                incarnation: 10,
            },
        );
        assert_eq!(part(&image).leader, 1);
    }

    #[test]
    fn unclean_election_when_enabled_or_forced() {
        let mut image = cluster(true);
        apply(&mut image, &fence_cmd(2));
        apply(&mut image, &fence_cmd(3));
        apply(&mut image, &fence_cmd(1));
        apply(
            &mut image,
            &ControllerCommand::UnfenceBroker {
                id: 3,
                incarnation: 10,
            },
        );
        let p = part(&image);
        assert_eq!(
            (p.leader, p.isr.clone(), p.leader_recovery_state),
            (3, vec![3], LeaderRecoveryState::Recovering)
        );

        let mut image = cluster(false);
        let elect = ControllerCommand::ElectLeaders {
            election: Election::Unclean,
            partitions: Some(vec![("t".into(), 0)]),
        };
        match apply(&mut image, &elect) {
            ControllerReply::Elections(r) => assert_eq!(r[0].2, errors::ELECTION_NOT_NEEDED),
            other => panic!("{other:?}"),
        }
        apply(&mut image, &fence_cmd(2));
        apply(&mut image, &fence_cmd(3));
        apply(&mut image, &fence_cmd(1));
        apply(
            &mut image,
            &ControllerCommand::UnfenceBroker {
                id: 2,
                incarnation: 10,
            },
        );
        match apply(&mut image, &elect) {
            ControllerReply::Elections(r) => assert_eq!(r[0].2, errors::NONE),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            (part(&image).leader, part(&image).isr.clone()),
            (2, vec![2])
        );
    }

    #[test]
    fn alter_partition_validation_order() {
        let mut image = cluster(false);
        let alter = |le, pe, isr: Vec<i32>, by| ControllerCommand::AlterPartition {
            broker_id: by,
            topic: "t".into(),
            partition: 0,
            leader_epoch: le,
            partition_epoch: pe,
            new_isr: isr,
            recovery_state: LeaderRecoveryState::Recovered,
        };
        assert!(matches!(
            apply(&mut image, &alter(0, 0, vec![1, 2], 1)),
            ControllerReply::Partition(_)
        ));
        let code = |r: ControllerReply| match r {
            ControllerReply::Error { code, .. } => code,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            code(apply(&mut image, &alter(0, 0, vec![1], 1))),
            errors::INVALID_UPDATE_VERSION
        );
        assert_eq!(
            code(apply(&mut image, &alter(5, 1, vec![1], 1))),
            errors::NOT_CONTROLLER
        );
        assert_eq!(
            code(apply(&mut image, &alter(0, 1, vec![2], 2))),
            errors::INVALID_REQUEST
        );
        assert_eq!(
            code(apply(&mut image, &alter(0, 1, vec![2], 1))),
            errors::INVALID_REQUEST
        );
        apply(&mut image, &fence_cmd(3));
        let pe = part(&image).partition_epoch;
        assert_eq!(
            code(apply(&mut image, &alter(0, pe, vec![1, 2, 3], 1))),
            errors::INELIGIBLE_REPLICA
        );
        apply(&mut image, &fence_cmd(1));
        assert_eq!(
            code(apply(&mut image, &alter(0, pe + 1, vec![1, 2], 1))),
            errors::FENCED_LEADER_EPOCH
        );
    }

    #[test]
    fn controlled_shutdown_moves_leadership_and_leaves_isrs_until_a_new_incarnation() {
        let mut image = cluster(false);
        assert_eq!(part(&image).leader, 1);
        let shutdown = |id| ControllerCommand::ControlledShutdown {
            id,
            incarnation: 10,
        };
        assert_eq!(apply(&mut image, &shutdown(1)), ControllerReply::Done);
        let p = part(&image).clone();
        assert_eq!(
            (p.leader, p.leader_epoch, p.isr.clone()),
            (2, 1, vec![2, 3])
        );
        assert!(image.brokers[&1].shutting_down && !image.brokers[&1].fenced);
        // Not let back into the ISR nor elected while shutting down.
        let rejoin = ControllerCommand::AlterPartition {
            broker_id: 2,
            topic: "t".into(),
            partition: 0,
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            new_isr: vec![2, 3, 1],
            recovery_state: LeaderRecoveryState::Recovered,
        };
        assert!(matches!(
            apply(&mut image.clone(), &rejoin),
            ControllerReply::Error {
                code: errors::INELIGIBLE_REPLICA,
                ..
            }
        ));
        let preferred = ControllerCommand::ElectLeaders {
            election: Election::Preferred,
            partitions: None,
        };
        assert!(matches!(
            apply(&mut image, &preferred),
            ControllerReply::Elections(r) if r[0].2 == PREFERRED_LEADER_NOT_AVAILABLE
        ));
        // The last ISR member shutting down leaves the partition leaderless, ISR kept.
        apply(&mut image, &shutdown(2));
        apply(&mut image, &shutdown(3));
        let p = part(&image);
        assert_eq!((p.leader, p.isr.clone()), (-1, vec![3]));
        // A stale incarnation is refused.
        assert!(matches!(
            apply(
                &mut image,
                &ControllerCommand::ControlledShutdown {
                    id: 1,
                    incarnation: 7
                }
            ),
            ControllerReply::Error { .. }
        ));
        // Broker 3 restarts: a new incarnation is usable again and leads.
        register(&mut image, 3, 999);
        assert!(!image.brokers[&3].shutting_down);
        assert_eq!(part(&image).leader, 3);
    }

    #[test]
    fn restart_with_new_incarnation_moves_leadership() {
        let mut image = cluster(false);
        register(&mut image, 1, 11);
        // Leadership moved to 2 (epoch 1); broker 1 is back, unfenced, out of the ISR.
        assert_eq!((part(&image).leader, part(&image).leader_epoch), (2, 1));
        assert!(!image.brokers[&1].fenced);
    }

    #[test]
    fn restarted_sole_isr_leader_leads_again_only_in_a_new_epoch() {
        let mut image = cluster(false);
        apply(&mut image, &fence_cmd(2));
        apply(&mut image, &fence_cmd(3));
        let before = part(&image).leader_epoch;
        assert_eq!(
            (part(&image).leader, part(&image).isr.clone()),
            (1, vec![1])
        );
        // Back within the session timeout, never fenced: the new incarnation still ends the old
        // one's epoch, so what it appends after a recovery cut cannot reuse it.
        register(&mut image, 1, 11);
        assert_eq!(part(&image).leader, 1);
        assert!(
            part(&image).leader_epoch > before,
            "epoch {} after {before}",
            part(&image).leader_epoch
        );
    }

    #[test]
    fn topic_errors_and_bump() {
        let mut image = cluster(false);
        let create = |name: &str, rf| ControllerCommand::CreateTopic {
            name: name.into(),
            id: Uuid::new_v4(),
            partitions: 1,
            replication_factor: rf,
            configs: BTreeMap::new(),
            validate_only: false,
            assignments: Vec::new(),
            mirror: None,
        };
        assert!(matches!(
            apply(&mut image, &create("t", 1)),
            ControllerReply::Error {
                code: errors::TOPIC_ALREADY_EXISTS,
                ..
            }
        ));
        assert!(matches!(
            apply(&mut image, &create("u", 4)),
            ControllerReply::Error {
                code: errors::INVALID_REPLICATION_FACTOR,
                ..
            }
        ));
        assert!(matches!(
            apply(&mut image, &create("bad/name", 1)),
            ControllerReply::Error {
                code: errors::INVALID_TOPIC_EXCEPTION,
                ..
            }
        ));
        apply(
            &mut image,
            &ControllerCommand::BumpLeaderEpoch {
                topic: "t".into(),
                partition: 0,
                min_epoch: -1,
            },
        );
        assert_eq!((part(&image).leader, part(&image).leader_epoch), (1, 1));
        apply(
            &mut image,
            &ControllerCommand::BumpLeaderEpoch {
                topic: "t".into(),
                partition: 0,
                min_epoch: 5,
            },
        );
        assert_eq!(part(&image).leader_epoch, 5);
    }

    #[test]
    fn mirror_topic_lifecycle() {
        let mut image = cluster(false);
        let code = |r: ControllerReply| match r {
            ControllerReply::Error { code, .. } => code,
            _ => errors::NONE,
        };
        let mirror = MirrorRegistration {
            name: "a-to-b".into(),
            source_bootstrap: "h:1".into(),
            source_cluster_id: "A".into(),
            groups: Default::default(),
        };
        let create = ControllerCommand::CreateMirror {
            mirror: mirror.clone(),
        };
        assert_eq!(code(apply(&mut image, &create)), errors::NONE);
        assert_eq!(
            code(apply(&mut image, &create)),
            errors::CLUSTER_MIRROR_ALREADY_EXISTS
        );
        let topic = |name: &str, id: u128| ControllerCommand::CreateTopic {
            name: name.into(),
            id: Uuid::from_u128(id),
            partitions: 1,
            replication_factor: 1,
            configs: BTreeMap::new(),
            validate_only: false,
            assignments: Vec::new(),
            mirror: Some("a-to-b".into()),
        };
        assert_eq!(code(apply(&mut image, &topic("m", 9))), errors::NONE);
        // The source's topic id may not name two topics.
        assert_eq!(
            code(apply(&mut image, &topic("n", 9))),
            errors::TOPIC_ALREADY_EXISTS
        );
        assert_eq!(image.mirror_state("m", 0), Some(MirrorState::Preparing));
        let set = |from, to| ControllerCommand::SetMirrorStates {
            topic: "m".into(),
            partitions: None,
            from,
            to,
            error: None,
            terminal: false,
        };
        assert_eq!(
            code(apply(&mut image, &set(None, MirrorState::Stopped))),
            errors::INVALID_CLUSTER_MIRROR_STATES
        );
        // A leader's step from a state the partition is not in changes nothing.
        apply(
            &mut image,
            &set(Some(MirrorState::Paused), MirrorState::Mirroring),
        );
        assert_eq!(image.mirror_state("m", 0), Some(MirrorState::Preparing));
        apply(&mut image, &set(None, MirrorState::Mirroring));
        assert_eq!(
            code(apply(
                &mut image,
                &ControllerCommand::DeleteMirror {
                    name: "a-to-b".into()
                }
            )),
            errors::CLUSTER_MIRROR_NOT_EMPTY
        );
        apply(&mut image, &set(None, MirrorState::Stopping));
        let epoch = image.topics["m"].partitions[0].leader_epoch;
        apply(
            &mut image,
            &ControllerCommand::CompleteMirrorStop {
                topic: "m".into(),
                partition: 0,
            },
        );
        assert_eq!(image.mirror_state("m", 0), Some(MirrorState::Stopped));
        assert_eq!(image.topics["m"].partitions[0].leader_epoch, epoch);
        // Failback onto the same topic needs the same id and partition count.
        let start = |id: u128, partitions| ControllerCommand::StartMirrorTopic {
            mirror: "a-to-b".into(),
            topic: "m".into(),
            id: Uuid::from_u128(id),
            partitions,
        };
        assert_eq!(
            code(apply(&mut image, &start(8, 1))),
            errors::INVALID_REQUEST
        );
        assert_eq!(code(apply(&mut image, &start(9, 1))), errors::NONE);
        assert_eq!(image.mirror_state("m", 0), Some(MirrorState::Preparing));
        assert_eq!(
            code(apply(&mut image, &start(9, 1))),
            errors::TOPIC_ALREADY_IN_CLUSTER_MIRROR
        );
        // A partition that stopped retrying goes back where its retries went, attempts reset;
        // one still retrying on its own is left alone.
        apply(&mut image, &set(None, MirrorState::Mirroring));
        let fail = |terminal| ControllerCommand::SetMirrorStates {
            topic: "m".into(),
            partitions: None,
            from: None,
            to: MirrorState::Failed,
            error: Some("source unreachable".into()),
            terminal,
        };
        let recover = ControllerCommand::RecoverMirrorPartitions { topic: "m".into() };
        apply(&mut image, &fail(false));
        apply(&mut image, &recover);
        assert_eq!(image.mirror_state("m", 0), Some(MirrorState::Failed));
        apply(&mut image, &fail(true));
        assert_eq!(code(apply(&mut image, &recover)), errors::NONE);
        let p = &image.topics["m"].mirror.as_ref().unwrap().partitions[0];
        assert_eq!((p.state, p.retry_attempt), (MirrorState::Mirroring, 0));
    }

    #[test]
    fn a_stop_or_pause_asked_again_after_one_partition_finished_moves_only_the_others() {
        let mut image = cluster(false);
        let mirror = MirrorRegistration {
            name: "a-to-b".into(),
            source_bootstrap: "h:1".into(),
            source_cluster_id: "A".into(),
            groups: Default::default(),
        };
        apply(&mut image, &ControllerCommand::CreateMirror { mirror });
        apply(
            &mut image,
            &ControllerCommand::CreateTopic {
                name: "m".into(),
                id: Uuid::from_u128(9),
                partitions: 2,
                replication_factor: 1,
                configs: BTreeMap::new(),
                validate_only: false,
                assignments: Vec::new(),
                mirror: Some("a-to-b".into()),
            },
        );
        let set = |to| ControllerCommand::SetMirrorStates {
            topic: "m".into(),
            partitions: None,
            from: None,
            to,
            error: None,
            terminal: false,
        };
        apply(&mut image, &set(MirrorState::Mirroring));
        // The leader of partition 0 finished pausing; the operator's pause, asked again, leaves
        // it paused.
        apply(&mut image, &set(MirrorState::Pausing));
        let paused = |partition| ControllerCommand::SetMirrorStates {
            topic: "m".into(),
            partitions: Some(vec![partition]),
            from: Some(MirrorState::Pausing),
            to: MirrorState::Paused,
            error: None,
            terminal: false,
        };
        apply(&mut image, &paused(0));
        assert!(matches!(
            apply(&mut image, &set(MirrorState::Pausing)),
            ControllerReply::Done
        ));
        assert_eq!(image.mirror_state("m", 0), Some(MirrorState::Paused));
        assert_eq!(image.mirror_state("m", 1), Some(MirrorState::Pausing));
        apply(&mut image, &paused(1));
        apply(&mut image, &set(MirrorState::Mirroring));
        assert_eq!(image.mirror_state("m", 1), Some(MirrorState::Mirroring));
        apply(&mut image, &set(MirrorState::Stopping));
        let complete = ControllerCommand::CompleteMirrorStop {
            topic: "m".into(),
            partition: 0,
        };
        assert!(matches!(
            apply(&mut image, &complete),
            ControllerReply::Partition(_)
        ));
        let epoch = image.topics["m"].partitions[0].partition_epoch;
        // The operator's stop, asked again, must not fail on the partition already stopped.
        assert!(matches!(
            apply(&mut image, &set(MirrorState::Stopping)),
            ControllerReply::Done
        ));
        assert_eq!(image.mirror_state("m", 0), Some(MirrorState::Stopped));
        assert_eq!(image.mirror_state("m", 1), Some(MirrorState::Stopping));
        assert_eq!(image.topics["m"].partitions[0].partition_epoch, epoch);
        // Other moves out of STOPPED are still refused.
        assert!(matches!(
            apply(&mut image, &set(MirrorState::Mirroring)),
            ControllerReply::Error { .. }
        ));
    }
}
