//! Which anomalies a test's guarantees forbid. Seeing an anomaly and judging it are separate:
//! every anomaly is reported, and this policy decides which of them make the run invalid.
//!
//! The policy, from the header's test map and from the history itself:
//!
//! - **An explicit list wins.** `"allowed_anomalies": ["lost-write", ...]` in the test map is the
//!   whole allowed set; nothing below applies.
//! - **Unclean leader election** is enabled when the test map says `"unclean_leader_election":
//!   true`, when `unclean.leader.election.enable` is true in `broker_config` or `topic_config`
//!   (flat, or one map per topic), or when the history holds a `config` op that turns it on.
//!   Then an out-of-sync replica of any partition may become leader and truncate acknowledged
//!   records, so `lost-write` is allowed, and so is `inconsistent-offsets` (the truncated
//!   offsets are written again with other values, so an old acknowledgement or poll disagrees
//!   with the final log). An `unclean-election` op (a forced election, the `unclean` fault)
//!   excuses the same anomalies entry by entry, on the partition it struck only (in either
//!   cluster of a mirror, which carries truncations across), and a lost write only when it was
//!   acknowledged before the election was recorded (in a run without failovers, which can carry
//!   an earlier truncation into later records): a write lost on another partition, or
//!   acknowledged after the last election on its own, is still a `lost-write`.
//!   An election whose `info` names no partition, or one invoked and never recorded, excuses
//!   them wholesale, as nothing tells where it struck.
//! - **Failover** (a `failover` op): mirroring is asynchronous, so acknowledged writes the new
//!   writable cluster had not mirrored when the old source was abandoned are truncated on
//!   failback. The checker tells them apart by the failover's `mirrored_offset` and reports them
//!   as `abandoned-write`, always allowed; a write it had mirrored and that is missing is still a
//!   `lost-write`, which the entry rules judge (an unclean election in its cluster may have taken
//!   it before the mirror fetched the offset again). The old source's acknowledgements and polls at those offsets disagree with its
//!   final log, so `inconsistent-offsets` at or above a failover's `mirrored_offset` on the
//!   cluster failed over from is allowed entry by entry. A failover that recorded no
//!   `partitions` (an older history), or was invoked and never recorded, leaves abandoned and
//!   lost writes indistinguishable: then `lost-write` and `inconsistent-offsets` are allowed
//!   wholesale, and `skipped_checks` says `abandoned-write` could not be judged. One that
//!   recorded marks but none for a partition does the same for that partition, entry by entry.
//! - **Mirroring with unclean elections** (KIP-1279 §1.10), entry by entry: a non-ISR replica
//!   can keep records above the LMLE and, once uncleanly elected, make the clusters disagree.
//!   `mirror-divergence`, `epoch-ownership` and `lmle-truncation` entries are allowed when an
//!   unclean election struck the partition in a source cluster (one not mirroring from another
//!   at the time), or unclean elections are enabled by configuration, unless
//!   `mirror.support.unclean.leader.election` guards the entry's offset: the flag guarantees
//!   consistency at or above where the first LMLE truncation run with it on started rewriting
//!   (offset 0 when it was on from the start: `mirror_unclean` in the test map or its
//!   `workload_options`, or the topic config; the failback's `mirrored_offset`, else the
//!   failover's, when a `config` op turned it on mid-run). Below that, nothing is promised.
//! - **A failback without the flag**, entry by entry: its LMLE truncation waited for the ISR
//!   only, so a replica out of it may keep records above the LMLE under epoch numbers the other
//!   cluster also wrote, which followers' truncation cannot tell apart: `divergence` in that
//!   cluster (and `divergent-tail`, and `lagging-replica`: such a replica may never find where
//!   its log meets the leader's), and `epoch-ownership` (M4 holds for the ISR only then), at or
//!   above where the failback rewrote its log are allowed.
//! - **Cluster-wide power loss** (a `power-loss` op whose value says `"cluster_wide": true`: every
//!   node of a cluster lost what it had not fsynced, at once) with a flush policy other than
//!   per-message (`log.flush.interval.messages` in `broker_config` anything but 1, or unset, as in
//!   Kafka's default): an acknowledged record may be in no replica's durable log, so `lost-write`
//!   is allowed, and `inconsistent-offsets` (the lost offsets are written again with other values).
//!   So are `divergence` and `divergent-tail`: replicas flush independently, so each comes back
//!   with a different durable prefix plus a torn tail, while the leader-epoch checkpoint is flushed
//!   on its own schedule and can name an epoch whose records were lost; epoch-based truncation then
//!   compares histories that no longer match the logs, which is KIP-101's "replica divergence after
//!   multiple hard failures" and which KIP-279 narrows but cannot close without flushing the log
//!   with every record. With per-message flush every acknowledged record was durable on every
//!   in-sync replica before the acknowledgement, so nothing is excused.
//! - **A power loss of fewer nodes**, entry by entry, with the same flush policy: an acknowledged
//!   record was on every in-sync replica, and the ISR may have been as small as
//!   `min.insync.replicas` (`topic_config`, else `broker_config`). A power loss that struck at once
//!   at least that many of a partition's replicas (the nodes the final replica states list for it,
//!   or the nodes struck when none are listed) may have struck its whole ISR, so that partition's
//!   `lost-write` (of a write acknowledged before the loss was recorded), `inconsistent-offsets`,
//!   `divergence`, `divergent-tail` and `commit-skip` are allowed. When neither config names
//!   `min.insync.replicas` nothing is assumed: a power loss short of a whole cluster excuses
//!   nothing, since the struck nodes' peers may have kept what they lost.
//! - **A wipe** (a node back without its log directory), entry by entry, whatever the flush
//!   policy: one that emptied at once at least `min.insync.replicas` of a partition's replicas
//!   (with the setting 1, any one of them) may have emptied its whole ISR, so that partition's
//!   `lost-write` (of a write acknowledged before the wipe was recorded), `inconsistent-offsets`
//!   and `commit-skip` are allowed. Replicas do not diverge from it: the wiped node may not lead
//!   before it has fetched again (KIP-858's directory id), so `divergence` is not.
//! - **A replica that lost records, elected uncleanly by its broker**, entry by entry, whatever
//!   the configuration: with every replica in the ISR and the eligible leader replicas (KIP-966)
//!   down or back from unclean shutdowns, Kafka elects the partition's last known leader, and
//!   counts it an unclean election. If that replica had lost records meanwhile (a `corrupt-file`
//!   that damaged its segment of the partition, or, unless every message is flushed, a power loss
//!   or a reboot after failed fsyncs of its node), records acknowledged before are gone. The
//!   elected replica says so in the final replica states (`unclean_elections`: the leader epoch,
//!   and its log end then), so a partition's `lost-write` (acknowledged before the fault was
//!   recorded), `inconsistent-offsets` and `commit-skip` at or above that log end are allowed when
//!   such a fault struck the replica its broker elected uncleanly (in either cluster of a mirror,
//!   which carries the truncation across, as for a forced election). Without the broker's record, or
//!   when the replica it elected lost nothing, nothing is excused: a corrupted replica elected
//!   while one that kept the records could lead (Jepsen's minority corruption) is a loss.
//! - **Consumer groups**: wherever acknowledged records may be truncated and their offsets
//!   written again (the unclean, unmarked-failover, power-loss and wipe rules), a group's commit may
//!   stand above records it never read, so `commit-skip` is allowed with `lost-write`. The
//!   same rules allow `zombie-commit` and `commit-lost`, judged for the cluster as a whole: the group's
//!   generation lives in a partition of `__consumer_offsets` the history does not name, and a
//!   truncation of it can take the coordinator back to an older generation (the power-loss and
//!   wipe rules count the nodes struck). `commit-regression` never is allowed.
//! - **Never allowed** unless listed explicitly: `divergence` otherwise (replicas of one cluster
//!   disagree below their high watermarks after convergence), `divergent-tail` and
//!   `lagging-replica` (a replica that, faults healed, never truncated to its leader's lineage or
//!   never caught up: no fault but a flagless failback excuses a replication protocol that stops
//!   converging), and every other anomaly. That includes `duplicate` whatever the producer: the plain producer never sends
//!   a batch twice, and the idempotent one's retries carry their sequence, so the broker must keep
//!   one copy.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::mirror::{truthy, MirrorHistory, MIRROR_UNCLEAN_KEY};
use crate::op::UncleanElection;
use crate::results::AnomalyKind;

const UNCLEAN_KEY: &str = "unclean.leader.election.enable";
const FLUSH_MESSAGES_KEY: &str = "log.flush.interval.messages";
const MIN_INSYNC_KEY: &str = "min.insync.replicas";

/// What must hold for a [`Rule`] to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// A failover was recorded.
    Failover,
    /// Unclean leader election configured, or forced by the history.
    Unclean,
    /// A failover whose per-partition mirrored offsets are unknown (an older history, or one
    /// cut short before the failover's `info`).
    UnmarkedFailover,
    /// Every node of a cluster lost power at once, and not every message is flushed.
    UnflushedPowerLoss,
}

/// A rule that allows whole anomaly types.
#[derive(Debug, Clone, Copy)]
pub struct Rule {
    /// When it applies.
    pub when: Condition,
    /// The types it allows.
    pub allows: &'static [AnomalyKind],
    /// Why, as `results.json`'s `allowed` says.
    pub why: &'static str,
}

/// The type-level rules, in the order their reasons are given.
pub const RULES: &[Rule] = &[
    Rule {
        when: Condition::Failover,
        allows: &[AnomalyKind::AbandonedWrite],
        why: "failover abandons acknowledged writes not yet mirrored (mirroring is asynchronous)",
    },
    Rule {
        when: Condition::Unclean,
        allows: &[
            AnomalyKind::LostWrite,
            AnomalyKind::InconsistentOffsets,
            AnomalyKind::CommitSkip,
            AnomalyKind::ZombieCommit,
            AnomalyKind::CommitLost,
        ],
        why: "unclean leader election may truncate acknowledged records",
    },
    Rule {
        when: Condition::UnmarkedFailover,
        allows: &[
            AnomalyKind::LostWrite,
            AnomalyKind::InconsistentOffsets,
            AnomalyKind::CommitSkip,
        ],
        why: "failover abandons acknowledged writes not yet mirrored, and this history does not record what was mirrored",
    },
    Rule {
        when: Condition::UnflushedPowerLoss,
        allows: &[
            AnomalyKind::LostWrite,
            AnomalyKind::InconsistentOffsets,
            AnomalyKind::Divergence,
            AnomalyKind::DivergentTail,
            AnomalyKind::CommitSkip,
            AnomalyKind::ZombieCommit,
            AnomalyKind::CommitLost,
        ],
        why: "every replica lost power at once (or was rebooted after failed fsyncs, which drop what they would have flushed), and the flush policy is not per-message",
    },
];

/// What excuses one anomaly entry by where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Excuse {
    /// A failover from the entry's cluster had mirrored less than the entry's offset: the old
    /// source's records there were rewritten when it failed back.
    Unmirrored,
    /// A forced unclean election struck the entry's partition (in either cluster: mirroring
    /// carries a truncation across), after the entry's record was acknowledged when it is
    /// about one: an election truncates only what was written before it.
    UncleanElection,
    /// An unclean election struck a source cluster's copy of the partition (or unclean
    /// elections are enabled by configuration), and the entry's offset is below where the
    /// `mirror.support.unclean.leader.election` guarantee starts: the first LMLE truncation run
    /// with the flag on (offset 0 when it was on from the start; nowhere when never on).
    UncleanSourceUnguarded,
    /// The entry's cluster (any, for an entry about both) failed back with the flag off, and the
    /// entry's offset is at or above where that failback rewrote its log: the LMLE truncation
    /// waited for the ISR only, so a replica out of it may keep records above the LMLE under an
    /// epoch the other cluster also wrote, which the replication protocol cannot tell apart (M4
    /// holds for the ISR only then).
    FlaglessFailback,
    /// A power loss struck at once at least `min.insync.replicas` of the entry's partition's
    /// replicas in its cluster, after the entry's record was acknowledged when it is about one,
    /// and the flush policy is not per-message: the whole ISR may have lost what it had not
    /// flushed.
    InSyncPowerLoss,
    /// A wipe (a node back without its log directory) struck at once at least
    /// `min.insync.replicas` of the entry's partition's replicas in its cluster, after the
    /// entry's record was acknowledged when it is about one: an ISR that small may have been all
    /// that held it, and what a disk loses is gone, flushed or not.
    InSyncDiskLoss,
    /// The entry's partition's broker elected uncleanly a replica (its own record in the final
    /// replica states) that a fault had made lose records: a `corrupt-file` of its segment of
    /// the partition, or, unless every message is flushed, a power loss of its node. The entry is
    /// at or above that replica's log end when elected, and acknowledged before the fault when it
    /// is about a record.
    LossyLastLeader,
}

/// A rule that allows the entries of some types one by one.
#[derive(Debug, Clone, Copy)]
pub struct EntryRule {
    /// What excuses an entry.
    pub excuse: Excuse,
    /// The types whose entries it judges.
    pub allows: &'static [AnomalyKind],
}

/// The entry-level rules.
pub const ENTRY_RULES: &[EntryRule] = &[
    EntryRule {
        excuse: Excuse::UncleanElection,
        allows: &[
            AnomalyKind::LostWrite,
            AnomalyKind::InconsistentOffsets,
            AnomalyKind::CommitSkip,
        ],
    },
    EntryRule {
        excuse: Excuse::Unmirrored,
        allows: &[AnomalyKind::InconsistentOffsets],
    },
    EntryRule {
        excuse: Excuse::FlaglessFailback,
        allows: &[
            AnomalyKind::Divergence,
            AnomalyKind::DivergentTail,
            AnomalyKind::LaggingReplica,
            AnomalyKind::EpochOwnership,
        ],
    },
    EntryRule {
        excuse: Excuse::InSyncPowerLoss,
        allows: &[
            AnomalyKind::LostWrite,
            AnomalyKind::InconsistentOffsets,
            AnomalyKind::Divergence,
            AnomalyKind::DivergentTail,
            AnomalyKind::CommitSkip,
            AnomalyKind::ZombieCommit,
            AnomalyKind::CommitLost,
        ],
    },
    EntryRule {
        excuse: Excuse::InSyncDiskLoss,
        allows: &[
            AnomalyKind::LostWrite,
            AnomalyKind::InconsistentOffsets,
            AnomalyKind::CommitSkip,
            AnomalyKind::ZombieCommit,
            AnomalyKind::CommitLost,
        ],
    },
    EntryRule {
        excuse: Excuse::LossyLastLeader,
        allows: &[
            AnomalyKind::LostWrite,
            AnomalyKind::InconsistentOffsets,
            AnomalyKind::CommitSkip,
        ],
    },
    EntryRule {
        excuse: Excuse::UncleanSourceUnguarded,
        allows: &[
            AnomalyKind::MirrorDivergence,
            AnomalyKind::EpochOwnership,
            AnomalyKind::LmleTruncation,
        ],
    },
];

/// Where an anomaly entry is, for the entry-level rules.
#[derive(Debug, Clone, Copy)]
pub struct Place<'a> {
    /// The cluster, when the entry is about one.
    pub cluster: Option<&'a str>,
    /// The topic.
    pub topic: &'a str,
    /// The partition (-1 when the entry's is not known: a group's in `__consumer_offsets`).
    pub partition: i64,
    /// The offset, when the entry names one.
    pub offset: Option<i64>,
    /// The index of the op that acknowledged the entry's record, when it is about one.
    pub acknowledged: Option<u64>,
}

impl Place<'_> {
    /// `topic/partition`, or the topic alone for an entry whose partition is unknown (-1).
    fn partition_name(&self) -> String {
        match self.partition {
            p if p < 0 => format!("{} (the group's partition)", self.topic),
            p => format!("{}/{p}", self.topic),
        }
    }
}

/// The verdict policy read from a test map; see the module docs for the rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    explicit: Option<Vec<String>>,
    /// Unclean elections enabled by the test's configuration (not only forced by a nemesis).
    unclean_enabled: bool,
    mirror_unclean_support: bool,
    flush_per_message: bool,
    min_insync: MinInsync,
}

/// `min.insync.replicas` as the test's configuration sets it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct MinInsync {
    /// From `broker_config`.
    broker: Option<u64>,
    /// From a flat `topic_config` (every topic).
    every_topic: Option<u64>,
    /// From `topic_config`'s per-topic maps.
    topics: BTreeMap<String, u64>,
}

impl MinInsync {
    fn from_test(test: &Value) -> Self {
        let mut m = MinInsync {
            broker: test
                .get("broker_config")
                .and_then(|c| c.get(MIN_INSYNC_KEY))
                .and_then(count),
            ..MinInsync::default()
        };
        if let Some(map) = test.get("topic_config").and_then(Value::as_object) {
            m.every_topic = map.get(MIN_INSYNC_KEY).and_then(count);
            for (topic, per_topic) in map {
                if let Some(n) = per_topic.get(MIN_INSYNC_KEY).and_then(count) {
                    m.topics.insert(topic.clone(), n);
                }
            }
        }
        m
    }

    /// The setting for `topic`, if the configuration names one.
    fn of(&self, topic: &str) -> Option<u64> {
        self.topics
            .get(topic)
            .copied()
            .or(self.every_topic)
            .or(self.broker)
    }
}

/// A whole number given as a JSON number or a string.
fn count(v: &Value) -> Option<u64> {
    match v {
        Value::String(s) => s.trim().parse().ok(),
        v => v.as_u64(),
    }
}

/// A `power-loss` or `wipe` op as its `info` recorded it: nodes that lost, at once, what they
/// had not flushed or everything their log directory held. A `disk-heal` that rebooted nodes is
/// a power loss of theirs: what their failed fsyncs dropped went with the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLoss {
    /// The fault, as an excuse names it (`power loss`, `wipe`, ...).
    pub fault: &'static str,
    /// The index of its `info`.
    pub index: u64,
    /// The cluster it struck.
    pub cluster: String,
    /// The nodes struck at once.
    pub nodes: BTreeSet<String>,
}

/// A segment of one replica that a `corrupt-file` damaged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    /// The index of its `info`.
    pub index: u64,
    /// The cluster of the node.
    pub cluster: String,
    /// The node.
    pub node: String,
    /// The replica's topic.
    pub topic: String,
    /// The replica's partition.
    pub partition: i64,
}

/// A replica its broker elected uncleanly, as the final replica states record it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElectedUncleanly {
    /// The replica's cluster.
    pub cluster: String,
    /// The replica's node.
    pub node: String,
    /// The election.
    pub election: UncleanElection,
}

/// What the history itself says about the policy, gathered while it streams past.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryFacts {
    /// An `unclean-election` op, or a `config` op enabling unclean elections.
    pub forced_unclean: bool,
    /// An `unclean-election` whose `info` named no partition, or one invoked and never recorded
    /// (more invocations than `info`s): where it struck is unknown.
    pub unscoped_unclean: bool,
    /// A `config` op enabling unclean elections.
    pub unclean_config_op: bool,
    /// A `failover` op.
    pub failover: bool,
    /// A failover whose per-partition mirrored offsets are unknown.
    pub unmarked_failover: bool,
    /// How many clusters the ops and replicas name.
    pub clusters: usize,
    /// A `power-loss` op that cut every node of a cluster at once, or a `disk-heal` that
    /// rebooted every node of one.
    pub cluster_power_loss: bool,
    /// Every `power-loss` op recorded, and every `disk-heal` that rebooted nodes, in order.
    pub power_losses: Vec<NodeLoss>,
    /// Every `wipe` op recorded, in order.
    pub disk_losses: Vec<NodeLoss>,
    /// The nodes the final replica states list for each partition, by cluster, topic and
    /// partition.
    pub replica_nodes: BTreeMap<(String, String, i64), BTreeSet<String>>,
    /// Every segment a `corrupt-file` op recorded damaging, in order.
    pub corruptions: Vec<Corruption>,
    /// The unclean elections the final replica states record, by topic and partition (in any
    /// cluster: a mirror carries a truncation across): the cluster and node elected, and the
    /// election.
    pub unclean_elections: BTreeMap<(String, i64), Vec<ElectedUncleanly>>,
}

impl Policy {
    /// Reads the policy from the `test` map of a history header.
    pub fn from_test(test: &Value) -> Self {
        let explicit = test
            .get("allowed_anomalies")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            });
        Policy {
            explicit,
            unclean_enabled: test.get("unclean_leader_election").is_some_and(truthy)
                || config_flag(test, UNCLEAN_KEY),
            mirror_unclean_support: config_flag(test, MIRROR_UNCLEAN_KEY),
            flush_per_message: test
                .get("broker_config")
                .and_then(|c| c.get(FLUSH_MESSAGES_KEY))
                .is_some_and(|v| match v {
                    Value::String(s) => s.trim() == "1",
                    Value::Number(n) => n.as_u64() == Some(1),
                    _ => false,
                }),
            min_insync: MinInsync::from_test(test),
        }
    }

    /// `min.insync.replicas` for `topic` as the test's configuration sets it, if it does.
    pub(crate) fn min_insync(&self, topic: &str) -> Option<u64> {
        self.min_insync.of(topic)
    }

    /// `mirror.support.unclean.leader.election` is true in the test's static configuration.
    pub fn mirror_unclean_support(&self) -> bool {
        self.mirror_unclean_support
    }

    fn holds(&self, when: Condition, facts: &HistoryFacts) -> bool {
        match when {
            Condition::Failover => facts.failover,
            Condition::Unclean => {
                self.unclean_enabled || facts.unclean_config_op || facts.unscoped_unclean
            }
            Condition::UnmarkedFailover => facts.unmarked_failover,
            Condition::UnflushedPowerLoss => facts.cluster_power_loss && !self.flush_per_message,
        }
    }

    /// The allowed anomaly types, each with why it is allowed.
    pub fn allowed(&self, facts: &HistoryFacts) -> BTreeMap<String, String> {
        let mut allowed = BTreeMap::new();
        if let Some(list) = &self.explicit {
            for a in list {
                allowed.insert(a.clone(), "listed in the test's allowed_anomalies".into());
            }
            return allowed;
        }
        for rule in RULES.iter().filter(|r| self.holds(r.when, facts)) {
            for kind in rule.allows {
                allowed
                    .entry(kind.name().to_owned())
                    .or_insert_with(|| rule.why.to_owned());
            }
        }
        allowed
    }

    /// The first of `losses` that struck, in the entry's cluster and after the entry's record
    /// was acknowledged, at least `min.insync.replicas` of its partition's replicas (the nodes
    /// the final replica states list for it, else all the loss's nodes), with how many it struck
    /// and that minimum. Nothing when the minimum is unknown.
    fn in_sync_loss<'f>(
        &self,
        losses: &'f [NodeLoss],
        place: Place<'_>,
        facts: &HistoryFacts,
    ) -> Option<(&'f NodeLoss, u64, u64)> {
        let min = self.min_insync.of(place.topic)?;
        let cluster = place.cluster.unwrap_or_default();
        let replicas =
            facts
                .replica_nodes
                .get(&(cluster.to_owned(), place.topic.to_owned(), place.partition));
        losses.iter().find_map(|loss| {
            let struck = match replicas {
                Some(r) => loss.nodes.intersection(r).count(),
                None => loss.nodes.len(),
            } as u64;
            let after = place.acknowledged.is_none_or(|a| a < loss.index);
            (loss.cluster == cluster && after && struck >= min.max(1))
                .then_some((loss, struck, min))
        })
    }

    /// Why [`Excuse::LossyLastLeader`] allows an entry at `place`, if it does. The election may
    /// be in either cluster of a mirror, which carries a truncation across (mirrored topics keep
    /// their offsets), as a forced one's is.
    fn lossy_last_leader(&self, place: Place<'_>, facts: &HistoryFacts) -> Option<String> {
        let offset = place.offset?;
        let before = |index: u64| place.acknowledged.is_none_or(|a| a < index);
        facts
            .unclean_elections
            .get(&(place.topic.to_owned(), place.partition))?
            .iter()
            .filter(|r| offset >= r.election.log_end_offset)
            .find_map(|ElectedUncleanly { cluster, node, election: e }| {
                let damaged = facts.corruptions.iter().find(|c| {
                    &c.cluster == cluster
                        && &c.node == node
                        && c.topic == place.topic
                        && c.partition == place.partition
                        && before(c.index)
                });
                let lost = match damaged {
                    Some(c) => (c.index, "corrupt-file"),
                    None if self.flush_per_message => return None,
                    None => facts
                        .power_losses
                        .iter()
                        .find(|l| &l.cluster == cluster && l.nodes.contains(node) && before(l.index))
                        .map(|l| (l.index, l.fault))?,
                };
                Some(format!(
                    "{node} lost records of {} to a {} (op {}), then its broker elected it uncleanly in leader epoch {} at offset {}",
                    place.partition_name(),
                    lost.1,
                    lost.0,
                    e.leader_epoch,
                    e.log_end_offset
                ))
            })
    }

    /// Why one entry of `kind` at `place` is allowed by the entry-level rules, if it is. An
    /// explicit `allowed_anomalies` list leaves nothing to them.
    pub(crate) fn excuse(
        &self,
        kind: AnomalyKind,
        place: Place<'_>,
        facts: &HistoryFacts,
        mirror: &MirrorHistory,
    ) -> Option<String> {
        if self.explicit.is_some() {
            return None;
        }
        let rules = ENTRY_RULES.iter().filter(|r| r.allows.contains(&kind));
        rules.into_iter().find_map(|rule| match rule.excuse {
            Excuse::UncleanElection => {
                // Between mirrored clusters a failback can carry an earlier election's
                // truncation into records written after it: there the partition is enough.
                let after = place.acknowledged.filter(|_| !facts.failover);
                let u = mirror.unclean_at(place.topic, place.partition, after)?;
                Some(format!(
                    "a forced unclean election (op {}) struck {}/{}",
                    u.index, place.topic, place.partition
                ))
            }
            Excuse::Unmirrored => {
                let (cluster, offset) = (place.cluster?, place.offset?);
                let c = mirror.unmirrored_at(cluster, place.topic, place.partition, offset)?;
                let what = match c.mark(place.topic, place.partition) {
                    Some((_, m)) if m.mirrored_offset.is_some() => "had not mirrored",
                    _ => "may not have mirrored",
                };
                Some(format!(
                    "{cluster} {what} offset {offset} to {} at the failover (op {})",
                    c.to, c.index
                ))
            }
            Excuse::FlaglessFailback => {
                let offset = place.offset?;
                let (cluster, c) = mirror.flagless_failback_at(
                    place.cluster,
                    place.topic,
                    place.partition,
                    offset,
                )?;
                Some(format!(
                    "{cluster} failed back (op {}) with {MIRROR_UNCLEAN_KEY} off: its LMLE truncation waited for the ISR only",
                    c.index
                ))
            }
            Excuse::InSyncPowerLoss => {
                if self.flush_per_message {
                    return None;
                }
                let (loss, struck, min) = self.in_sync_loss(&facts.power_losses, place, facts)?;
                Some(format!(
                    "a {} (op {}) struck {struck} of {}'s replicas at once, as many as {MIN_INSYNC_KEY} ({min}), and the flush policy is not per-message",
                    loss.fault, loss.index, place.partition_name()
                ))
            }
            Excuse::InSyncDiskLoss => {
                let (loss, struck, min) = self.in_sync_loss(&facts.disk_losses, place, facts)?;
                Some(format!(
                    "a wipe (op {}) emptied the log directory of {struck} of {}'s replicas at once, as many as {MIN_INSYNC_KEY} ({min})",
                    loss.index, place.partition_name()
                ))
            }
            Excuse::LossyLastLeader => self.lossy_last_leader(place, facts),
            Excuse::UncleanSourceUnguarded => {
                let offset = place.offset.unwrap_or(0);
                if let Some(g) = mirror.guard(place.topic, place.partition) {
                    if offset >= g.from {
                        return None;
                    }
                }
                let below = match mirror.guard(place.topic, place.partition) {
                    Some(g) => format!(
                        ", below offset {} where the first truncation with the flag on (failback op {}) started",
                        g.from,
                        g.failback.map_or_else(|| "?".to_owned(), |op| op.to_string())
                    ),
                    None => String::new(),
                };
                if let Some(u) = mirror.unclean_in_source(place.topic, place.partition) {
                    let cluster = u.cluster.as_deref().unwrap_or("?");
                    return Some(format!(
                        "unclean election in source cluster {cluster} (op {}) with {MIRROR_UNCLEAN_KEY} off{below}",
                        u.index
                    ));
                }
                (self.unclean_enabled || facts.unclean_config_op).then(|| {
                    format!("unclean leader election is enabled, with {MIRROR_UNCLEAN_KEY} off{below}")
                })
            }
        })
    }
}

/// Whether a nemesis `config` op's `set` map turns unclean leader election on.
pub(crate) fn config_op_enables_unclean(value: &Value) -> bool {
    value
        .get("set")
        .and_then(|s| s.get(UNCLEAN_KEY))
        .is_some_and(truthy)
}

/// `key` is true in `broker_config` or `topic_config`, directly or in a per-topic map.
fn config_flag(test: &Value, key: &str) -> bool {
    ["broker_config", "topic_config"].iter().any(|section| {
        let Some(map) = test.get(section).and_then(Value::as_object) else {
            return false;
        };
        map.get(key).is_some_and(truthy)
            || map
                .values()
                .any(|per_topic| per_topic.get(key).is_some_and(truthy))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn allowed(test: Value, facts: HistoryFacts) -> Vec<String> {
        Policy::from_test(&test)
            .allowed(&facts)
            .into_keys()
            .collect()
    }

    #[test]
    fn nothing_is_allowed_by_default() {
        assert!(allowed(json!({}), HistoryFacts::default()).is_empty());
        assert!(allowed(
            json!({"nemesis": ["kill", "partition"]}),
            HistoryFacts::default()
        )
        .is_empty());
    }

    #[test]
    fn unclean_elections_allow_lost_writes() {
        let expect = vec![
            "commit-lost",
            "commit-skip",
            "inconsistent-offsets",
            "lost-write",
            "zombie-commit",
        ];
        for test in [
            json!({"unclean_leader_election": true}),
            json!({"broker_config": {"unclean.leader.election.enable": "true"}}),
            json!({"topic_config": {"t": {"unclean.leader.election.enable": true}}}),
        ] {
            assert_eq!(
                allowed(test.clone(), HistoryFacts::default()),
                expect,
                "{test}"
            );
        }
        // A forced election is judged entry by entry, unless nothing says where it struck.
        let forced = HistoryFacts {
            forced_unclean: true,
            ..HistoryFacts::default()
        };
        assert!(allowed(json!({"nemesis": "kill,unclean"}), forced).is_empty());
        let unscoped = HistoryFacts {
            forced_unclean: true,
            unscoped_unclean: true,
            ..HistoryFacts::default()
        };
        assert_eq!(allowed(json!({}), unscoped), expect);
        assert!(allowed(
            json!({"broker_config": {"unclean.leader.election.enable": "false"}}),
            HistoryFacts::default()
        )
        .is_empty());
    }

    #[test]
    fn failovers_allow_abandoned_writes_and_lost_ones_only_when_unmarked() {
        let marked = HistoryFacts {
            failover: true,
            ..HistoryFacts::default()
        };
        assert_eq!(allowed(json!({}), marked.clone()), ["abandoned-write"]);
        let unmarked = HistoryFacts {
            unmarked_failover: true,
            ..marked
        };
        assert_eq!(
            allowed(json!({}), unmarked),
            [
                "abandoned-write",
                "commit-skip",
                "inconsistent-offsets",
                "lost-write"
            ]
        );
    }

    fn mirror(test: &Value, ops: &[(&str, Value)]) -> MirrorHistory {
        let mut m = MirrorHistory::new(test, config_flag(test, MIRROR_UNCLEAN_KEY));
        for (i, (f, v)) in ops.iter().enumerate() {
            m.observe(i as u64, false, false, f, None, v).unwrap();
        }
        m
    }

    fn excuse(test: &Value, m: &MirrorHistory, kind: AnomalyKind, offset: i64) -> Option<String> {
        let place = Place {
            cluster: Some("a"),
            topic: "t",
            partition: 0,
            offset: Some(offset),
            acknowledged: None,
        };
        Policy::from_test(test).excuse(kind, place, &HistoryFacts::default(), m)
    }

    #[test]
    fn an_unclean_election_in_the_source_excuses_mirror_divergence_unless_the_flag_guards_it() {
        let test = json!({"workload": "mirror", "clusters": ["a", "b"]});
        let unclean = (
            "unclean-election",
            json!({"cluster": "a", "topic": "t", "partition": 0}),
        );
        let m = mirror(&test, std::slice::from_ref(&unclean));
        let why = excuse(&test, &m, AnomalyKind::MirrorDivergence, 5).unwrap();
        assert!(why.contains("source cluster a (op 0)"), "{why}");
        assert!(excuse(&test, &m, AnomalyKind::Divergence, 5).is_none());
        // In the mirroring cluster, an unclean election excuses nothing.
        let dest = (
            "unclean-election",
            json!({"cluster": "b", "topic": "t", "partition": 0}),
        );
        assert!(excuse(
            &test,
            &mirror(&test, &[dest]),
            AnomalyKind::MirrorDivergence,
            5
        )
        .is_none());
        // The flag on from the start guards every offset.
        let flagged = json!({"workload": "mirror", "clusters": ["a", "b"], "mirror_unclean": true});
        let m = mirror(&flagged, std::slice::from_ref(&unclean));
        assert!(excuse(&flagged, &m, AnomalyKind::MirrorDivergence, 0).is_none());
        // Turned on mid-run, it guards from the first truncation run with it on.
        let set = json!({"cluster": "a", "topic": "t", "set": {MIRROR_UNCLEAN_KEY: "true"}});
        let over = json!({"from": "a", "to": "b", "partitions": [{"topic": "t", "partition": 0, "mirrored_offset": 40}]});
        let back = json!({"from": "b", "to": "a", "partitions": [{"topic": "t", "partition": 0, "lmle": 3}]});
        let m = mirror(
            &test,
            &[
                unclean,
                ("config", set),
                ("failover", over),
                ("failback", back),
            ],
        );
        let why = excuse(&test, &m, AnomalyKind::EpochOwnership, 39).unwrap();
        assert!(why.contains("below offset 40"), "{why}");
        assert!(excuse(&test, &m, AnomalyKind::MirrorDivergence, 40).is_none());
        // An explicit list leaves nothing to the entry-level rules.
        let listed = json!({"allowed_anomalies": []});
        assert!(excuse(&listed, &m, AnomalyKind::MirrorDivergence, 1).is_none());
    }

    #[test]
    fn a_failback_without_the_flag_excuses_divergence_in_the_cluster_it_truncated() {
        let over = json!({"from": "a", "to": "b", "partitions": [{"topic": "t", "partition": 0, "mirrored_offset": 4}]});
        let back = json!({"from": "b", "to": "a", "partitions": [{"topic": "t", "partition": 0, "lmle": 1}]});
        let test = json!({"clusters": ["a", "b"]});
        let m = mirror(
            &test,
            &[("failover", over.clone()), ("failback", back.clone())],
        );
        let why = excuse(&test, &m, AnomalyKind::Divergence, 4).unwrap();
        assert!(why.contains("failed back (op 1)"), "{why}");
        assert!(excuse(&test, &m, AnomalyKind::Divergence, 3).is_none());
        let flagged = json!({"clusters": ["a", "b"], "mirror_unclean": true});
        let m = mirror(&flagged, &[("failover", over), ("failback", back)]);
        assert!(excuse(&flagged, &m, AnomalyKind::Divergence, 4).is_none());
    }

    #[test]
    fn offsets_a_failover_had_not_mirrored_excuse_inconsistent_offsets_on_the_old_source() {
        let test = json!({"clusters": ["a", "b"]});
        let over = json!({"from": "a", "to": "b", "partitions": [{"topic": "t", "partition": 0, "mirrored_offset": 4}]});
        let m = mirror(&test, &[("failover", over)]);
        assert!(excuse(&test, &m, AnomalyKind::InconsistentOffsets, 4).is_some());
        assert!(excuse(&test, &m, AnomalyKind::InconsistentOffsets, 3).is_none());
        assert!(excuse(&test, &m, AnomalyKind::LostWrite, 4).is_none());
    }

    #[test]
    fn a_cluster_wide_power_loss_excuses_lost_writes_and_divergence_unless_flushing_each_message() {
        let power = HistoryFacts {
            cluster_power_loss: true,
            ..HistoryFacts::default()
        };
        let excused = vec![
            "commit-lost",
            "commit-skip",
            "divergence",
            "divergent-tail",
            "inconsistent-offsets",
            "lost-write",
            "zombie-commit",
        ];
        for config in [
            json!({}),
            json!({"broker_config": {"log.flush.interval.messages": "10000"}}),
            json!({"broker_config": {"log.flush.interval.messages": 2}}),
        ] {
            assert_eq!(allowed(config.clone(), power.clone()), excused, "{config}");
        }
        for config in [
            json!({"broker_config": {"log.flush.interval.messages": "1"}}),
            json!({"broker_config": {"log.flush.interval.messages": 1}}),
        ] {
            assert!(
                allowed(config.clone(), power.clone()).is_empty(),
                "{config}"
            );
        }
        // A power loss of some nodes only excuses nothing, whatever the flush policy.
        assert!(allowed(json!({}), HistoryFacts::default()).is_empty());
    }

    #[test]
    fn explicit_list_overrides() {
        let got = allowed(
            json!({"allowed_anomalies": ["duplicate"], "unclean_leader_election": true}),
            HistoryFacts::default(),
        );
        assert_eq!(got, vec!["duplicate"]);
    }

    #[test]
    fn config_ops_can_enable_unclean() {
        assert!(config_op_enables_unclean(
            &json!({"cluster": "a", "set": {"unclean.leader.election.enable": "true"}})
        ));
        assert!(!config_op_enables_unclean(
            &json!({"set": {"mirror.support.unclean.leader.election": "true"}})
        ));
    }
}
