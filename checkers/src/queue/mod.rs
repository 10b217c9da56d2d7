//! The queue analysis: every anomaly of `docs/history-format.md` for the queue and mirror workloads.
//!
//! It follows Jepsen's kafka checker (`jepsen.tests.kafka`): each partition of each cluster is a
//! log of unique values at offsets, and every observation of an offset (an acknowledged send, a
//! poll, the final committed log read from the replicas) must agree with every other. Polls are
//! always safe data, whatever their completion type; a send's effect is certain only when it
//! completed `ok`, certainly absent when it completed `fail`, and unknown otherwise.
//!
//! The ops stream past once. State is kept per distinct value and per distinct offset, never
//! per op: the first observation of each offset and of each value, the gaps polls jumped over,
//! and how far polls read from each starting offset. Everything that needs the whole history
//! (lost writes, aborted reads, skips, epoch ownership) is decided in [`QueueAnalysis::finish`].

mod acks;
mod converge;
mod event;
mod groups;
mod hws;
mod reach;
pub(crate) mod replicas;
mod stands;

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;
use serde_json::{json, Value};

use crate::dense::DenseMap;
use crate::mirror::{MirrorHistory, MIRROR_UNCLEAN_KEY};
use crate::op::{Op, OpType, Process, Record, ReplicaState};
use crate::policy::{
    config_op_enables_unclean, Corruption, ElectedUncleanly, HistoryFacts, NodeLoss, Place, Policy,
};
use crate::results::{push_warning, Anomalies, AnomalyKind, OpStats, Results, SkippedCheck};
use crate::tiered::TieredHistory;
use crate::Checker;

use acks::AckedOffsets;
use converge::{ConvergeBody, Convergence};
pub(crate) use event::LineOp;
use event::{
    check_poll_offsets, topic_partition, CorruptBody, Event, PollBody, PowerLossBody, RebootBody,
    SendBody, StandBody, WipeBody,
};
use groups::{CommitBody, GroupPollBody, Groups, Zombie};
use hws::SeenHws;
use reach::Reach;
use replicas::FinalLogs;

/// Sentinel for "no op" in packed fields.
const NONE: u64 = u64::MAX;
/// Sentinel for "no partition" in packed fields.
const NO_PK: u32 = u32::MAX;
/// Most distinct values (or locations) kept in one inconsistent-offsets or duplicate entry.
const MAX_WITNESSES: usize = 8;
/// Most skipped offsets listed in one poll-skip entry.
const MAX_SKIPPED_LISTED: usize = 10;
/// The internal topic that holds consumer groups' generations and offsets.
const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// The checker for the queue and mirror workloads. See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueChecker;

impl Checker for QueueChecker {
    fn check(
        &self,
        test: &Value,
        history: &mut dyn Iterator<Item = Op>,
        replicas: Option<&[ReplicaState]>,
    ) -> Results {
        let mut analysis = QueueAnalysis::new(test, replicas);
        for op in history {
            if let Err(problem) = analysis.observe(&op) {
                analysis.warn(format!("op {}: ignored: {problem}", op.index));
            }
        }
        analysis.finish()
    }
}

/// What proves an observation: an acknowledgement, a poll, or a replica's final log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Proof {
    Ack(u64),
    Poll(u64),
    Final(u32),
}

/// Where a send stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Observed, but no send of it was ever invoked.
    NeverInvoked,
    /// Invoked, not yet completed.
    Pending,
    Ok,
    Fail,
    Info,
}

/// Everything known about one value. It is the analysis's biggest table (one entry per
/// distinct value), so optional fields are kept as flags beside plain integers to fit it in
/// 64 bytes.
#[derive(Debug, Clone, Copy)]
struct ValueInfo {
    outcome: Outcome,
    /// The partition the send wrote to (its cluster is the value's origin).
    send_pk: u32,
    invoke: u64,
    completion: u64,
    /// The offset the `ok` completion reported, when `has_acked`.
    acked: i64,
    has_acked: bool,
    /// The first place the value was observed, and what proves it.
    loc_pk: u32,
    loc_offset: i64,
    loc_kind: ProofKind,
    loc_id: u64,
    /// The first poll that returned it.
    first_poll: u64,
    /// Bit `c` set: the final committed log of cluster `c` holds it.
    final_clusters: u32,
}

/// The kind of a [`Proof`], stored apart from its op or replica index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProofKind {
    Ack,
    Poll,
    Final,
}

impl Proof {
    fn split(self) -> (ProofKind, u64) {
        match self {
            Proof::Ack(op) => (ProofKind::Ack, op),
            Proof::Poll(op) => (ProofKind::Poll, op),
            Proof::Final(r) => (ProofKind::Final, u64::from(r)),
        }
    }
}

impl ValueInfo {
    fn new() -> Self {
        ValueInfo {
            outcome: Outcome::NeverInvoked,
            send_pk: NO_PK,
            invoke: NONE,
            completion: NONE,
            acked: 0,
            has_acked: false,
            loc_pk: NO_PK,
            loc_offset: 0,
            loc_kind: ProofKind::Ack,
            loc_id: NONE,
            first_poll: NONE,
            final_clusters: 0,
        }
    }

    fn acked(&self) -> Option<i64> {
        self.has_acked.then_some(self.acked)
    }

    fn loc_proof(&self) -> Proof {
        match self.loc_kind {
            ProofKind::Ack => Proof::Ack(self.loc_id),
            ProofKind::Poll => Proof::Poll(self.loc_id),
            // Replica indices are stored from a u32, so this never truncates.
            ProofKind::Final => Proof::Final(self.loc_id as u32),
        }
    }
}

/// The first value observed at an offset.
#[derive(Debug, Clone, Copy)]
struct Slot {
    value: i64,
    proof: Proof,
    /// Some poll returned a record at this offset.
    polled: bool,
}

/// A range of offsets `[lo, hi)` a poll jumped over.
#[derive(Debug, Clone, Copy)]
struct Gap {
    /// The offset returned just before the gap, or `None` when the gap starts at `from`.
    after: Option<i64>,
    /// The value the poll returned at the gap's end.
    next_value: i64,
    op: u64,
    process: u64,
    polls: u64,
}

#[derive(Debug, Default)]
struct Partition {
    cluster: u32,
    topic: u32,
    partition: i64,
    slots: DenseMap<Slot>,
    gaps: FxHashMap<(i64, i64), Gap>,
    /// Poll start offset -> the furthest offset a poll from there returned, and that poll.
    reach: DenseMap<(i64, u64)>,
    /// Index of this partition's final committed log in [`FinalLogs::logs`].
    final_log: Option<u32>,
    /// The op index of the last poll of it that completed `ok`.
    last_read: Option<u64>,
}

/// An invocation waiting for its completion.
#[derive(Debug)]
struct Pending {
    f: String,
    invoke: u64,
    /// The invocation's time.
    invoked_at: u64,
    send: Option<(u32, Vec<i64>)>,
}

/// The streaming queue analysis behind [`QueueChecker`]: feed it every op in history order with
/// [`observe`](Self::observe), then [`finish`](Self::finish).
pub struct QueueAnalysis<'r> {
    policy: Policy,
    facts: HistoryFacts,
    /// Forced unclean elections invoked and not yet recorded.
    unclean_invokes: u64,
    replicas: Option<&'r [ReplicaState]>,
    finals: FinalLogs<'r>,
    default_cluster: String,
    clusters: Vec<String>,
    cluster_ids: FxHashMap<String, u32>,
    topics: Vec<String>,
    topic_ids: FxHashMap<String, u32>,
    pk_ids: FxHashMap<(u32, u32, i64), u32>,
    parts: Vec<Partition>,
    values: DenseMap<ValueInfo>,
    conflicts: FxHashMap<(u32, i64), Vec<(i64, Proof)>>,
    duplicates: FxHashMap<i64, Vec<(u32, i64, Proof)>>,
    pending: FxHashMap<u64, Pending>,
    /// The high watermarks polls saw.
    hws: SeenHws,
    /// Acknowledged offsets, and polls that reported a high watermark at or below one.
    acks: AckedOffsets,
    /// Which brokers the faults left able to exchange records.
    reach: Reach,
    /// Consumer groups' polls and commits.
    groups: Groups,
    mirror: MirrorHistory,
    /// The wipes, for the tiered-storage checks.
    tiered: TieredHistory,
    /// What the runner found when it last waited for each cluster's replicas to converge.
    convergence: Convergence,
    stands: stands::Stands,
    /// The test map, which those read their broker settings from.
    test: Value,
    /// The op index of the last nemesis op: the final phase's healing, once the history is read.
    last_fault: Option<u64>,
    /// The last failover or failback recorded an error and no direction it left mirroring in
    /// (a failback that started mirroring and timed out waiting for it records one).
    last_move_failed: bool,
    stats: BTreeMap<String, OpStats>,
    anomalies: Anomalies,
    warnings: Vec<String>,
    skipped: Vec<SkippedCheck>,
}

impl<'r> QueueAnalysis<'r> {
    /// Starts an analysis of a history whose header carried `test`, with the final replica
    /// states when there are any. Ops without a `cluster` belong to the replicas' cluster when
    /// they name exactly one, else to the cluster named `""`.
    pub fn new(test: &Value, replicas: Option<&'r [ReplicaState]>) -> Self {
        let replica_clusters: BTreeSet<&str> = replicas
            .unwrap_or_default()
            .iter()
            .map(|r| r.cluster.as_str())
            .collect();
        let default_cluster = match replica_clusters.iter().next() {
            Some(c) if replica_clusters.len() == 1 => (*c).to_owned(),
            _ => String::new(),
        };
        let policy = Policy::from_test(test);
        let mut a = QueueAnalysis {
            policy: policy.clone(),
            facts: HistoryFacts::default(),
            unclean_invokes: 0,
            replicas,
            finals: FinalLogs::default(),
            default_cluster,
            clusters: Vec::new(),
            cluster_ids: FxHashMap::default(),
            topics: Vec::new(),
            topic_ids: FxHashMap::default(),
            pk_ids: FxHashMap::default(),
            parts: Vec::new(),
            values: DenseMap::default(),
            conflicts: FxHashMap::default(),
            duplicates: FxHashMap::default(),
            pending: FxHashMap::default(),
            hws: SeenHws::default(),
            acks: AckedOffsets::default(),
            reach: Reach::from_test(test),
            groups: Groups::default(),
            mirror: MirrorHistory::new(test, policy.mirror_unclean_support()),
            tiered: TieredHistory::default(),
            convergence: Convergence::default(),
            stands: stands::Stands::default(),
            test: test.clone(),
            last_fault: None,
            last_move_failed: false,
            stats: BTreeMap::new(),
            anomalies: Anomalies::default(),
            warnings: Vec::new(),
            skipped: Vec::new(),
        };
        if let Some(replicas) = replicas {
            a.load_final_logs(replicas);
            a.reach.learn_replicas(replicas);
        }
        a
    }

    fn warn(&mut self, warning: String) {
        push_warning(&mut self.warnings, warning);
    }

    fn cluster_id(&mut self, name: Option<&str>) -> u32 {
        let name = name.unwrap_or(&self.default_cluster);
        if let Some(&id) = self.cluster_ids.get(name) {
            return id;
        }
        let id = self.clusters.len() as u32;
        self.clusters.push(name.to_owned());
        self.cluster_ids.insert(name.to_owned(), id);
        id
    }

    fn pk(&mut self, cluster: u32, topic: &str, partition: i64) -> u32 {
        let topic = match self.topic_ids.get(topic) {
            Some(&t) => t,
            None => {
                let t = self.topics.len() as u32;
                self.topics.push(topic.to_owned());
                self.topic_ids.insert(topic.to_owned(), t);
                t
            }
        };
        let next = self.parts.len() as u32;
        let id = *self
            .pk_ids
            .entry((cluster, topic, partition))
            .or_insert(next);
        if id == next {
            self.parts.push(Partition {
                cluster,
                topic,
                partition,
                ..Partition::default()
            });
        }
        id
    }

    /// The final committed logs seed the observations: every later acknowledgement and poll is
    /// compared with them.
    fn load_final_logs(&mut self, replicas: &'r [ReplicaState]) {
        for r in replicas {
            self.cluster_id(Some(&r.cluster));
            if !r.unclean_elections.is_empty() {
                let key = (r.topic.clone(), r.partition);
                let elected = self.facts.unclean_elections.entry(key).or_default();
                elected.extend(r.unclean_elections.iter().map(|e| ElectedUncleanly {
                    cluster: r.cluster.clone(),
                    node: r.node.clone(),
                    election: *e,
                }));
            }
            self.facts
                .replica_nodes
                .entry((r.cluster.clone(), r.topic.clone(), r.partition))
                .or_default()
                .insert(r.node.clone());
        }
        let (finals, warnings) = FinalLogs::build(replicas);
        for w in warnings {
            self.warn(w);
        }
        let records = finals.logs.iter().flat_map(|log| log.records.iter());
        let (count, max) = records.fold((0, i64::MIN), |(n, m), r| (n + 1, m.max(r.value)));
        self.values.reserve_for(max, count);
        for (i, log) in finals.logs.iter().enumerate() {
            let leader = &replicas[log.leader];
            let cluster = self.cluster_ids[leader.cluster.as_str()];
            let pk = self.pk(cluster, &leader.topic, leader.partition);
            self.parts[pk as usize].final_log = Some(i as u32);
            for rec in log.records.iter() {
                self.observe_record(pk, rec.offset, rec.value, Proof::Final(log.leader as u32));
                if cluster < 32 {
                    self.values
                        .get_or_insert_with(rec.value, ValueInfo::new)
                        .final_clusters |= 1 << cluster;
                }
            }
        }
        self.finals = finals;
    }

    /// Takes in the next op of the history. An error means the op is malformed (for example a
    /// send without values); the caller decides whether that is fatal.
    pub fn observe(&mut self, op: &Op) -> Result<(), String> {
        self.observe_event(Event::from(op))
    }

    /// Takes in the next line of a history as parsed by the streaming reader.
    pub(crate) fn observe_line(&mut self, op: &LineOp<'_>) -> Result<(), String> {
        self.observe_event(Event::from(op))
    }

    fn observe_event(&mut self, ev: Event<'_>) -> Result<(), String> {
        if ev.f == "unclean-election" {
            // Forced, whoever recorded it; where, its `info` says.
            self.facts.forced_unclean = true;
            if ev.kind == OpType::Invoke {
                self.unclean_invokes += 1;
            } else {
                self.unclean_invokes = self.unclean_invokes.saturating_sub(1);
                let value = ev.value.json();
                if value.get("topic").is_none() || value.get("partition").is_none() {
                    self.facts.unscoped_unclean = true;
                }
            }
        }
        match ev.process {
            Process::Nemesis => {
                self.last_fault = Some(ev.index);
                self.nemesis(ev);
                Ok(())
            }
            Process::Client(p) => {
                if ev.cluster.is_some() {
                    self.cluster_id(ev.cluster);
                }
                match ev.kind {
                    OpType::Invoke => self.invoke(p, ev),
                    _ => self.complete(p, ev),
                }
            }
        }
    }

    fn nemesis(&mut self, ev: Event<'_>) {
        let invoke = ev.kind == OpType::Invoke;
        if matches!(
            ev.f,
            "failover" | "failback" | "unclean-election" | "config"
        ) {
            let value = ev.value.json();
            if !invoke && matches!(ev.f, "failover" | "failback") {
                let mirroring = value.pointer("/direction/mirroring") == Some(&Value::Bool(true));
                self.last_move_failed = ev.failed && !mirroring;
            }
            if let Err(problem) = self
                .mirror
                .observe(ev.index, invoke, ev.failed, ev.f, ev.cluster, &value)
            {
                self.warn(format!("op {}: {problem}", ev.index));
            }
        }
        if reach::READ.contains(&ev.f) {
            let value = ev.value.json();
            match self
                .reach
                .nemesis((ev.index, ev.time), ev.f, invoke, ev.failed, &value)
            {
                Ok(found) => {
                    for (entry, unshared) in found {
                        self.push_unshared(entry, unshared);
                    }
                }
                Err(problem) => self.warn(format!("op {}: {problem}", ev.index)),
            }
        } else if invoke {
            self.reach.other_fault(ev.index, ev.f);
        }
        match ev.f {
            "wipe" if ev.kind != OpType::Invoke => {
                if let Err(problem) = self.tiered.observe_wipe(ev.index, &ev.value.json()) {
                    self.warn(problem);
                }
                match ev.value.parse::<WipeBody>("wipe") {
                    Ok(Some(body)) => self.facts.disk_losses.push(NodeLoss {
                        fault: "wipe",
                        index: ev.index,
                        cluster: ev.cluster.unwrap_or(&self.default_cluster).to_owned(),
                        nodes: body.deleted.into_keys().collect(),
                    }),
                    Ok(None) => {}
                    Err(problem) => self.warn(format!("op {}: {problem}", ev.index)),
                }
            }
            "corrupt-file" if ev.kind != OpType::Invoke => {
                match ev.value.parse::<CorruptBody>("corrupt-file") {
                    Ok(Some(body)) => {
                        let cluster = ev.cluster.unwrap_or(&self.default_cluster).to_owned();
                        for f in body.files {
                            let Some((topic, partition)) = f.replica() else {
                                self.warn(format!(
                                    "op {}: corrupt-file: field `files[].file`: expected <topic>-<partition>/<segment>.log, got {:?}",
                                    ev.index, f.file
                                ));
                                continue;
                            };
                            self.facts.corruptions.push(Corruption {
                                index: ev.index,
                                cluster: cluster.clone(),
                                node: f.node,
                                topic,
                                partition,
                            });
                        }
                    }
                    Ok(None) => {}
                    Err(problem) => self.warn(format!("op {}: {problem}", ev.index)),
                }
            }
            "tiered-config" => self.tiered.observe_flag_turned(),
            "converge" if ev.kind != OpType::Invoke => {
                match ev.value.parse::<ConvergeBody>("converge") {
                    Ok(Some(body)) => {
                        let cluster = ev.cluster.unwrap_or(&self.default_cluster).to_owned();
                        self.convergence.observe(ev.index, &cluster, body);
                    }
                    Ok(None) => {}
                    Err(problem) => self.warn(format!("op {}: {problem}", ev.index)),
                }
            }
            "config" if config_op_enables_unclean(&ev.value.json()) => {
                self.facts.forced_unclean = true;
                self.facts.unclean_config_op = true;
            }
            "failover" => self.facts.failover = true,
            "power-loss" if ev.kind != OpType::Invoke => {
                match ev.value.parse::<PowerLossBody>("power-loss") {
                    Ok(Some(body)) => {
                        self.facts.cluster_power_loss |= body.cluster_wide;
                        self.facts.power_losses.push(NodeLoss {
                            fault: "power loss",
                            index: ev.index,
                            cluster: ev.cluster.unwrap_or(&self.default_cluster).to_owned(),
                            nodes: body.nodes.into_iter().collect(),
                        });
                    }
                    Ok(None) => {}
                    Err(problem) => self.warn(format!("op {}: {problem}", ev.index)),
                }
            }
            // A follower's power loss within a last stand is one node's power loss.
            "last-stand" if ev.kind != OpType::Invoke => {
                let cluster = ev.cluster.unwrap_or(&self.default_cluster).to_owned();
                match ev.value.parse::<StandBody>("last-stand") {
                    Ok(Some(body)) => {
                        let nodes = body.powered_off();
                        if !nodes.is_empty() {
                            self.facts.power_losses.push(NodeLoss {
                                fault: "power loss",
                                index: ev.index,
                                cluster: cluster.clone(),
                                nodes: nodes.into_iter().collect(),
                            });
                        }
                        // A stand that recorded an error is not judged for whom it elected.
                        if !ev.failed {
                            self.stands.observe(ev.index, &cluster, body);
                        }
                    }
                    Ok(None) => {}
                    Err(problem) => self.warn(format!("op {}: {problem}", ev.index)),
                }
            }
            "disk-heal" if ev.kind != OpType::Invoke => {
                match ev.value.parse::<RebootBody>("disk-heal") {
                    Ok(Some(body)) if !body.rebooted.is_empty() => {
                        self.facts.cluster_power_loss |= body.cluster_wide;
                        self.facts.power_losses.push(NodeLoss {
                            fault: "reboot after failed fsyncs",
                            index: ev.index,
                            cluster: ev.cluster.unwrap_or(&self.default_cluster).to_owned(),
                            nodes: body.rebooted.into_iter().collect(),
                        });
                    }
                    Ok(_) => {}
                    Err(problem) => self.warn(format!("op {}: {problem}", ev.index)),
                }
            }
            _ => {}
        }
    }

    /// The partition a send's value names, and its values; all three are required.
    fn send_target(
        &mut self,
        ev: Event<'_>,
        body: SendBody<'_>,
    ) -> Result<(u32, Vec<i64>), String> {
        let (topic, partition) = topic_partition(body.topic, body.partition)?;
        let values = body.values.ok_or("send has no values")?;
        let cluster = self.cluster_id(ev.cluster);
        Ok((self.pk(cluster, &topic, partition), values))
    }

    fn invoke(&mut self, p: u64, ev: Event<'_>) -> Result<(), String> {
        if let Some(prev) = self.pending.get(&p) {
            let warning = format!(
                "op {}: process {p} invoked again while op {} was open",
                ev.index, prev.invoke
            );
            self.warn(warning);
        }
        let send = match ev.f {
            "send" => {
                let body = ev
                    .value
                    .parse::<SendBody>("send")?
                    .ok_or("send has no value")?;
                let (pk, values) = self.send_target(ev, body)?;
                for &v in &values {
                    let info = self.values.get_or_insert_with(v, ValueInfo::new);
                    if info.invoke != NONE {
                        let warning = format!(
                            "op {}: value {v} was already sent by op {} (values must be unique)",
                            ev.index, info.invoke
                        );
                        self.warn(warning);
                        continue;
                    }
                    info.invoke = ev.index;
                    info.outcome = Outcome::Pending;
                    info.send_pk = pk;
                }
                Some((pk, values))
            }
            "poll" => {
                let body = ev
                    .value
                    .parse::<PollBody>("poll")?
                    .ok_or("poll has no value")?;
                check_poll_offsets(&body)?;
                topic_partition(body.topic, body.partition)?;
                None
            }
            _ => None,
        };
        self.pending.insert(
            p,
            Pending {
                f: ev.f.to_owned(),
                invoke: ev.index,
                invoked_at: ev.time,
                send,
            },
        );
        Ok(())
    }

    fn complete(&mut self, p: u64, ev: Event<'_>) -> Result<(), String> {
        let pending = self.pending.remove(&p);
        match &pending {
            None => {
                let warning = format!(
                    "op {}: process {p} completed {} without an invocation",
                    ev.index, ev.f
                );
                self.warn(warning);
            }
            Some(pend) if pend.f != ev.f => {
                let warning = format!(
                    "op {}: process {p} completed {} but invoked {} (op {})",
                    ev.index, ev.f, pend.f, pend.invoke
                );
                self.warn(warning);
            }
            Some(_) => {}
        }
        if let (OpType::Ok, Some(node)) = (ev.kind, ev.node) {
            self.reach.answered(node, ev.index);
        }
        let stats = match self.stats.get_mut(ev.f) {
            Some(s) => s,
            None => self.stats.entry(ev.f.to_owned()).or_default(),
        };
        match ev.kind {
            OpType::Ok => stats.ok += 1,
            OpType::Fail => stats.fail += 1,
            _ => stats.info += 1,
        }
        if let (Some(pend), "group-poll" | "commit" | "stall") = (&pending, ev.f) {
            self.groups.group_op(p, pend.invoke);
        }
        match ev.f {
            "send" => self.complete_send(ev, pending),
            "poll" => self.complete_poll(p, ev, pending),
            // A group poll that did not complete `ok` carries its invocation's value: no
            // partition, nothing read.
            "group-poll" if ev.kind == OpType::Ok => self.complete_group_poll(p, ev, pending),
            "commit" if ev.kind == OpType::Ok => self.complete_commit(p, ev, pending),
            "commit" if ev.kind == OpType::Info => self.commit_unknown(ev, pending),
            _ => Ok(()),
        }
    }

    /// A group member's poll is a poll, and what it returned counts as consumed by its group.
    fn complete_group_poll(
        &mut self,
        p: u64,
        ev: Event<'_>,
        pending: Option<Pending>,
    ) -> Result<(), String> {
        self.complete_poll(p, ev, pending)?;
        let group_body = ev
            .value
            .parse::<GroupPollBody>("group-poll")?
            .ok_or("group-poll has no value")?;
        let group = group_body.group.ok_or("group-poll has no group")?;
        let body = ev
            .value
            .parse::<PollBody>("group-poll")?
            .ok_or("group-poll has no value")?;
        let (topic, partition) = topic_partition(body.topic, body.partition)?;
        let cluster = self.cluster_id(ev.cluster);
        let pk = self.pk(cluster, &topic, partition);
        let group = self.groups.id(&group);
        if let Some(generation) = group_body.generation {
            let member = group_body.member;
            if let Some(from) = body.from {
                let m = member.clone();
                self.groups
                    .read_from(group, pk, p, generation, m, from, ev.index);
            }
            self.groups.in_generation(p, generation, ev.index);
            self.groups
                .shown(group, cluster, generation, member, "group-poll", ev.index);
        }
        let offsets = body
            .records
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.offset);
        self.groups.polled(group, pk, offsets);
        Ok(())
    }

    /// A commit whose answer was lost: it may land at any time, with offsets the history lacks.
    fn commit_unknown(&mut self, ev: Event<'_>, pending: Option<Pending>) -> Result<(), String> {
        let body = ev.value.parse::<GroupPollBody>("commit")?;
        if let Some(group) = body.and_then(|b| b.group) {
            let group = self.groups.id(&group);
            let invoked = pending.map_or(0, |p| p.invoke);
            self.groups.commit_unknown(group, invoked, ev.index);
        }
        Ok(())
    }

    /// An acknowledged commit: each partition's offset, for the group's checks.
    fn complete_commit(
        &mut self,
        p: u64,
        ev: Event<'_>,
        pending: Option<Pending>,
    ) -> Result<(), String> {
        let body = ev
            .value
            .parse::<CommitBody>("commit")?
            .ok_or("commit has no value")?;
        let cluster = self.cluster_id(ev.cluster);
        let group = self.groups.id(&body.group);
        // Without its invocation a commit is compared with none before it.
        let invoked = pending.map_or(0, |p| p.invoke);
        if let Some(later) = self
            .groups
            .newer_before(group, cluster, body.generation, invoked)
            .filter(|_| body.generation >= 0)
        {
            let zombie = Zombie {
                group,
                cluster,
                generation: body.generation,
                member: body.member.clone(),
                op: ev.index,
                invoked,
                offsets: (body.offsets.iter())
                    .map(|o| (o.topic.clone(), o.partition, o.offset))
                    .collect(),
                later: later.clone(),
            };
            self.groups.zombies.push(zombie);
        }
        let member = body.member.clone();
        self.groups.in_generation(p, body.generation, ev.index);
        self.groups
            .shown(group, cluster, body.generation, member, "commit", ev.index);
        for o in body.offsets {
            if o.offset < 0 {
                return Err(format!("commit offset {} is negative", o.offset));
            }
            let (topic, partition) = topic_partition(Some(o.topic.into()), Some(o.partition))?;
            let pk = self.pk(cluster, &topic, partition);
            self.groups.committed(
                group,
                body.generation,
                pk,
                o.offset,
                body.member.clone(),
                invoked,
                ev.index,
            );
        }
        Ok(())
    }

    fn complete_send(&mut self, ev: Event<'_>, pending: Option<Pending>) -> Result<(), String> {
        let outcome = match ev.kind {
            OpType::Ok => Outcome::Ok,
            OpType::Fail => Outcome::Fail,
            _ => Outcome::Info,
        };
        // Only an ok completion adds to what the invocation said: the offset.
        let body = match (outcome, pending.as_ref().and_then(|p| p.send.as_ref())) {
            (Outcome::Ok, _) | (_, None) => ev.value.parse::<SendBody>("send")?,
            _ => None,
        };
        let acked = body
            .as_ref()
            .and_then(|b| b.offset)
            .filter(|_| outcome == Outcome::Ok);
        let offset = match acked {
            // Kafka's "no offset": the write is judged, its place is unknown.
            Some(-1) => {
                self.warn(format!(
                    "op {}: send acknowledged with offset -1 (Kafka's \"no offset\"): its offset is unknown",
                    ev.index
                ));
                None
            }
            Some(o) if o < 0 => return Err(format!("ok send offset {o} is negative")),
            o => o,
        };
        let invoked = pending.as_ref().map(|p| (p.invoke, p.invoked_at));
        let (pk, values) = match pending.and_then(|p| p.send) {
            Some(sent) => sent,
            None => self.send_target(ev, body.ok_or("send has no value")?)?,
        };
        for (i, &v) in values.iter().enumerate() {
            let info = self.values.get_or_insert_with(v, ValueInfo::new);
            if info.invoke == NONE {
                info.invoke = ev.index;
                info.send_pk = pk;
            }
            info.outcome = outcome;
            info.completion = ev.index;
            if let Some(first) = offset {
                let at = first
                    .checked_add(i as i64)
                    .ok_or("send offset overflows a 64-bit offset")?;
                info.acked = at;
                info.has_acked = true;
                self.observe_record(pk, at, v, Proof::Ack(ev.index));
            }
        }
        if let (Some(first), Some(n), Some(node)) =
            (offset, (values.len() as i64).checked_sub(1), ev.node)
        {
            let pending = &self.pending;
            self.acks.acknowledged(pk, node, ev.index, first + n, || {
                pending.values().map(|p| p.invoke).min()
            });
        }
        if let (Some(first), Some(node), Some(invoked)) = (offset, ev.node, invoked) {
            self.check_shared(ev, pk, node, invoked, first);
        }
        Ok(())
    }

    /// An acks=all send acknowledged by `node` at op `ev`, invoked at op `invoked` (index and
    /// time), its first record at `first`: whether enough replicas could have held it, now or
    /// once a strand under way tells when its cut held.
    fn check_shared(
        &mut self,
        ev: Event<'_>,
        pk: u32,
        node: &str,
        (invoked, invoked_at): (u64, u64),
        first: i64,
    ) {
        if !self.reach.judges() {
            return;
        }
        let part = &self.parts[pk as usize];
        let topic = &self.topics[part.topic as usize];
        let Some(min) = self.policy.min_insync(topic).filter(|m| *m > 1) else {
            return;
        };
        let Process::Client(process) = ev.process else {
            return;
        };
        // Built only for an acknowledgement reported or held: most are neither.
        let entry = || {
            json!({
                "cluster": self.clusters[part.cluster as usize], "topic": topic,
                "partition": part.partition, "op_index": ev.index, "process": process,
                "invoke_index": invoked, "node": node, "offset": first, "min_insync_replicas": min,
            })
        };
        match self
            .reach
            .unshared(node, (topic, part.partition), invoked, min)
        {
            Some(unshared) => {
                let entry = entry();
                self.push_unshared(entry, unshared);
            }
            None => self.reach.hold(node, (invoked_at, ev.time), min, entry),
        }
    }

    /// Reports an acknowledgement (`entry`) that `unshared` shows no enough replicas held.
    fn push_unshared(&mut self, mut entry: Value, unshared: reach::Unshared) {
        let cut_off: serde_json::Map<String, Value> = unshared
            .cut_off
            .into_iter()
            .map(|(n, since)| (n, json!(since)))
            .collect();
        entry["reachable"] = json!(unshared.reachable);
        entry["cut_off_since"] = Value::Object(cut_off);
        self.anomalies.push(AnomalyKind::AckBelowMinIsr, entry);
    }

    fn complete_poll(
        &mut self,
        p: u64,
        ev: Event<'_>,
        pending: Option<Pending>,
    ) -> Result<(), String> {
        let body = ev
            .value
            .parse::<PollBody>("poll")?
            .ok_or("poll has no value")?;
        check_poll_offsets(&body)?;
        let (topic, partition) = topic_partition(body.topic, body.partition)?;
        let cluster = self.cluster_id(ev.cluster);
        let pk = self.pk(cluster, &topic, partition);
        if ev.kind == OpType::Ok {
            self.parts[pk as usize].last_read = Some(ev.index);
        }
        let from = body.from;
        let leader_epoch = body.leader_epoch.filter(|_| ev.kind == OpType::Ok);
        let high_watermark = body.high_watermark.filter(|_| ev.kind == OpType::Ok);
        let mut above_leader: Option<(Record, u64)> = None;
        let mut above_hw: Option<(Record, u64)> = None;
        let mut prev: Option<(i64, Option<i64>)> = None;
        let mut furthest = None;
        // Gaps count only in a poll whose offsets increase: one that went backwards is reported
        // as nonmonotonic, and may well have returned the "skipped" offsets out of order.
        let mut gaps: Vec<(i64, i64, Option<i64>, i64)> = Vec::new();
        let mut monotonic = true;
        for r in body.records.unwrap_or_default() {
            let (offset, value, epoch) = (r.offset, r.value, r.epoch);
            match prev {
                Some((po, _)) if offset <= po => {
                    let entry = json!({
                        "cluster": self.clusters[cluster as usize], "topic": topic,
                        "partition": partition, "op_index": ev.index, "process": p,
                        "offsets": [po, offset],
                    });
                    self.anomalies.push(AnomalyKind::NonmonotonicPoll, entry);
                    monotonic = false;
                }
                Some((po, _)) if offset - 1 > po => gaps.push((po + 1, offset, Some(po), value)),
                None => {
                    if let Some(f) = from.filter(|&f| offset > f) {
                        gaps.push((f, offset, None, value));
                    }
                }
                _ => {}
            }
            if let (Some((po, Some(pe))), Some(e)) = (prev, epoch) {
                if offset > po && e < pe {
                    let entry = json!({
                        "cluster": self.clusters[cluster as usize], "topic": topic,
                        "partition": partition, "op_index": ev.index,
                        "records": [[po, pe], [offset, e]],
                        "why": "a poll returned a lower leader epoch at a higher offset",
                    });
                    self.anomalies.push(AnomalyKind::EpochRegression, entry);
                }
            }
            if let (Some(le), Some(e)) = (leader_epoch, epoch) {
                if e > le {
                    let first = above_leader.get_or_insert((r, 0));
                    first.1 += 1;
                }
            }
            if high_watermark.is_some_and(|hw| offset >= hw) {
                let first = above_hw.get_or_insert((r, 0));
                first.1 += 1;
            }
            prev = Some((offset, epoch.or(prev.and_then(|(_, e)| e))));
            furthest = Some(furthest.map_or(offset, |f: i64| f.max(offset)));
            self.observe_record(pk, offset, value, Proof::Poll(ev.index));
        }
        if let (Some(le), Some((first, n))) = (leader_epoch, above_leader) {
            let entry = json!({
                "cluster": self.clusters[cluster as usize], "topic": topic,
                "partition": partition, "op_index": ev.index, "leader_epoch": le,
                "record": first, "records_above": n,
            });
            self.anomalies.push(AnomalyKind::EpochAboveLeader, entry);
        }
        if let (Some(hw), Some((first, n))) = (high_watermark, above_hw) {
            let entry = json!({
                "cluster": self.clusters[cluster as usize], "topic": topic,
                "partition": partition, "op_index": ev.index, "process": p,
                "high_watermark": hw, "record": first, "records_above": n,
            });
            self.anomalies
                .push(AnomalyKind::ReadAboveHighWatermark, entry);
        }
        if monotonic {
            for (lo, hi, after, next_value) in gaps {
                self.note_gap(pk, lo, hi, (after, next_value), ev.index, p);
            }
        }
        if let (Some(from), Some(furthest)) = (from, furthest) {
            let reach = self.parts[pk as usize]
                .reach
                .get_or_insert_with(from, || (furthest, ev.index));
            if furthest > reach.0 {
                *reach = (furthest, ev.index);
            }
        }
        if let Some(hw) = high_watermark {
            // Without its invocation a poll's start is unknown: it is compared with nothing.
            let invoked = pending.map_or(0, |p| p.invoke);
            if let (Some(e), Some(node)) = (body.leader_epoch, ev.node) {
                self.acks.polled((pk, node, e), (ev.index, p, invoked), hw);
            }
            self.observe_hw(p, pk, hw, body.leader_epoch, invoked, ev.index);
        }
        Ok(())
    }

    /// A gap from `lo` to `hi`, the offset returned before it (if any) and the value at `hi`.
    fn note_gap(
        &mut self,
        pk: u32,
        lo: i64,
        hi: i64,
        (after, next_value): (Option<i64>, i64),
        op: u64,
        p: u64,
    ) {
        self.parts[pk as usize]
            .gaps
            .entry((lo, hi))
            .and_modify(|g| g.polls += 1)
            .or_insert(Gap {
                after,
                next_value,
                op,
                process: p,
                polls: 1,
            });
    }

    /// A partition's high watermark only grows under one leader: a poll served under leader
    /// epoch `e` must not see a lower one than a poll under `e` that completed before it was
    /// invoked. Across a leader change the new leader's may lag until its followers report (as
    /// in Kafka), so a drop against an earlier epoch is counted in the poll stats, and so is a
    /// drop seen by a poll whose epoch is unknown.
    fn observe_hw(&mut self, p: u64, pk: u32, hw: i64, epoch: Option<i64>, invoked: u64, op: u64) {
        let (before_any, before_same) = self.hws.before(pk, epoch, invoked);
        let dropped = |seen: Option<(u64, i64)>| seen.filter(|&(_, seen)| seen > hw);
        let (any_epoch, same_epoch) = (dropped(before_any), dropped(before_same));
        if let (Some(e), Some((prev_op, prev_hw))) = (epoch, same_epoch) {
            let part = &self.parts[pk as usize];
            let entry = json!({
                "cluster": self.clusters[part.cluster as usize],
                "topic": self.topics[part.topic as usize], "partition": part.partition,
                "process": p, "op_index": op, "high_watermark": hw, "leader_epoch": e,
                "previous": {"op_index": prev_op, "high_watermark": prev_hw},
            });
            self.anomalies.push(AnomalyKind::HwRegression, entry);
        } else if any_epoch.is_some() {
            let stats = self.stats.entry("poll".to_owned()).or_default();
            match epoch {
                Some(_) => stats.hw_drops_across_epochs += 1,
                None => stats.hw_drops_epoch_unknown += 1,
            }
        }
        let pending = &self.pending;
        self.hws.record(pk, epoch, op, hw, || {
            pending.values().map(|p| p.invoke).min()
        });
    }

    /// Records that `value` was observed at `offset` of partition `pk`: the offset must hold
    /// one value, and the value one place (a topic, partition and offset, on any cluster).
    fn observe_record(&mut self, pk: u32, offset: i64, value: i64, proof: Proof) {
        let polled = matches!(proof, Proof::Poll(_));
        let slots = &mut self.parts[pk as usize].slots;
        match slots.get_mut(offset) {
            None => {
                slots.get_or_insert_with(offset, || Slot {
                    value,
                    proof,
                    polled,
                });
            }
            Some(slot) if slot.value != value => {
                slot.polled |= polled;
                let first = (slot.value, slot.proof);
                let witnesses = self
                    .conflicts
                    .entry((pk, offset))
                    .or_insert_with(|| vec![first]);
                if witnesses.len() < MAX_WITNESSES && witnesses.iter().all(|w| w.0 != value) {
                    witnesses.push((value, proof));
                }
            }
            Some(slot) => slot.polled |= polled,
        }
        let info = self.values.get_or_insert_with(value, ValueInfo::new);
        if let Proof::Poll(op) = proof {
            if info.first_poll == NONE {
                info.first_poll = op;
            }
        }
        if info.loc_pk == NO_PK {
            info.loc_pk = pk;
            info.loc_offset = offset;
            (info.loc_kind, info.loc_id) = proof.split();
            return;
        }
        let (a, b) = (&self.parts[info.loc_pk as usize], &self.parts[pk as usize]);
        if info.loc_offset == offset && a.topic == b.topic && a.partition == b.partition {
            return;
        }
        let first = (info.loc_pk, info.loc_offset, info.loc_proof());
        let places = self.duplicates.entry(value).or_insert_with(|| vec![first]);
        let known = places.iter().any(|&(p, o, _)| {
            let c = &self.parts[p as usize];
            o == offset && c.topic == b.topic && c.partition == b.partition
        });
        if !known && places.len() < MAX_WITNESSES {
            places.push((pk, offset, proof));
        }
    }

    fn proof_json(&self, proof: Proof) -> Value {
        match proof {
            Proof::Ack(op) => json!({"send": op}),
            Proof::Poll(op) => json!({"poll": op}),
            Proof::Final(r) => {
                let r = &self.replicas.unwrap_or_default()[r as usize];
                json!({"final_log": {"cluster": r.cluster, "node": r.node}})
            }
        }
    }

    fn place(&self, pk: u32) -> (String, String, i64) {
        let part = &self.parts[pk as usize];
        (
            self.clusters[part.cluster as usize].clone(),
            self.topics[part.topic as usize].clone(),
            part.partition,
        )
    }

    /// Runs the whole-history checks and judges the anomalies against the test's policy.
    pub fn finish(mut self) -> Results {
        for (_, pend) in std::mem::take(&mut self.pending) {
            self.stats.entry(pend.f).or_default().info += 1;
            for v in pend.send.map(|s| s.1).unwrap_or_default() {
                if let Some(info) = self.values.get_mut(v) {
                    if info.outcome == Outcome::Pending {
                        info.outcome = Outcome::Info;
                    }
                }
            }
        }
        self.facts.clusters = self.clusters.len();
        self.facts.unmarked_failover = self.mirror.failovers_unmarked();
        self.facts.unscoped_unclean |= self.unclean_invokes > 0;
        self.note_unjudged_mirroring();
        self.check_values();
        self.check_conflicts();
        self.check_duplicates();
        self.check_skips();
        self.check_groups();
        self.check_replicas();
        self.check_acks();
        self.convergence
            .check(&self.facts.disk_losses, &mut self.anomalies);
        let policy = &self.policy;
        self.stands
            .check(&self.test, |t| policy.min_insync(t), &mut self.anomalies);
        crate::tiered::check(
            &self.test,
            &self.tiered,
            self.replicas,
            &self.finals,
            &mut self.anomalies,
        );
        let allowed = self.policy.allowed(&self.facts);
        let evidence = self.stats.values().any(|s| s.ok > 0) || !self.finals.logs.is_empty();
        self.anomalies
            .into_results(allowed, !evidence, self.stats, self.skipped, self.warnings)
    }

    /// What the mirroring ops did not record well enough to judge: failovers without
    /// per-partition mirrored offsets (abandoned writes cannot be told from lost ones), and
    /// failbacks run with the flag on but without an offset to guard from.
    fn note_unjudged_mirroring(&mut self) {
        if self.mirror.failovers_unmarked() {
            let ops: Vec<String> = self
                .mirror
                .unmarked_failovers
                .iter()
                .map(u64::to_string)
                .collect();
            let which = match ops.len() {
                0 => "a failover was invoked and never recorded".to_owned(),
                _ => format!("failover ops {} recorded no partitions", ops.join(", ")),
            };
            self.skipped.push(SkippedCheck {
                check: AnomalyKind::AbandonedWrite.name().into(),
                reason: format!("{which} (mirrored_offset): writes abandoned there cannot be told from lost ones, so lost-write is allowed"),
            });
        }
        for (op, part) in &self.mirror.unguarded {
            self.skipped.push(SkippedCheck {
                check: AnomalyKind::MirrorDivergence.name().into(),
                reason: format!("failback op {op} ran with mirror.support.unclean.leader.election on but recorded no mirrored_offset for {part}: the flag's guarantee is not checked there"),
            });
        }
    }

    /// Lost writes, aborted reads and unexpected values: judged per value once every send has
    /// completed and every poll has been seen. An `ok` value is lost when the final committed
    /// log of its cluster lacks it, unless it was acknowledged below the final leader's log
    /// start offset (retention removed it); without a final log, see [`Self::lost_by_polls`].
    fn check_values(&mut self) {
        // Only the few anomalous values are collected, then put in history order.
        let (mut lost, mut aborted, mut unexpected) = (Vec::new(), Vec::new(), Vec::new());
        let mut by_polls: FxHashMap<u32, Vec<(i64, i64, ValueInfo)>> = FxHashMap::default();
        let mut no_final: BTreeSet<u32> = BTreeSet::new();
        for (v, &info) in self.values.iter() {
            match info.outcome {
                Outcome::Ok => {
                    let part = &self.parts[info.send_pk as usize];
                    match part.final_log {
                        Some(log) if part.cluster < 32 => {
                            let start = self.finals.logs[log as usize].start;
                            let retained = info.acked().is_none_or(|o| o >= start);
                            if info.final_clusters & (1 << part.cluster) == 0 && retained {
                                lost.push((info.completion, v, info));
                            }
                        }
                        _ => {
                            no_final.insert(info.send_pk);
                            if let Some(acked) = info.acked().filter(|_| info.first_poll == NONE) {
                                by_polls
                                    .entry(info.send_pk)
                                    .or_default()
                                    .push((acked, v, info));
                            }
                        }
                    }
                }
                Outcome::Fail if info.first_poll != NONE || info.final_clusters != 0 => {
                    aborted.push((info.completion, v, info));
                }
                Outcome::NeverInvoked => unexpected.push((0, v, info)),
                _ => {}
            }
        }
        for list in [&mut lost, &mut aborted, &mut unexpected] {
            list.sort_unstable_by_key(|&(key, v, _)| (key, v));
        }
        for (_, v, info) in lost {
            let log = self.final_log_of(info.send_pk);
            self.lost_write(v, &info, json!({"final_log": log}));
        }
        for (_, v, info) in aborted {
            let (cluster, topic, partition) = self.place(info.loc_pk);
            let seen_by = if info.first_poll != NONE {
                json!({"poll": info.first_poll})
            } else {
                self.proof_json(info.loc_proof())
            };
            let entry = json!({
                "value": v, "cluster": cluster, "topic": topic, "partition": partition,
                "offset": info.loc_offset, "op_index": info.completion,
                "invoke_index": info.invoke, "seen_by": seen_by,
            });
            self.anomalies.push(AnomalyKind::AbortedRead, entry);
        }
        for (_, v, info) in unexpected {
            let (cluster, topic, partition) = self.place(info.loc_pk);
            let entry = json!({
                "value": v, "cluster": cluster, "topic": topic, "partition": partition,
                "offset": info.loc_offset, "seen_by": self.proof_json(info.loc_proof()),
            });
            self.anomalies.push(AnomalyKind::UnexpectedValue, entry);
        }
        self.lost_by_polls(by_polls);
        self.read_only_writes();
        if self.replicas.is_none() {
            self.skipped.push(SkippedCheck {
                check: AnomalyKind::LostWrite.name().into(),
                reason: "no replicas.jsonl: a write is proven lost only where a later poll read past its acknowledged offset".into(),
            });
            return;
        }
        for pk in no_final {
            let (cluster, topic, partition) = self.place(pk);
            self.skipped.push(SkippedCheck {
                check: AnomalyKind::LostWrite.name().into(),
                reason: format!("no readable replica of {cluster}/{topic}/{partition}: a write there is proven lost only where a later poll read past its acknowledged offset"),
            });
        }
    }

    /// M2: a send acknowledged by a cluster that mirrored from another all the while it was
    /// open (a failback into it recorded before the send, no failover invoked before it
    /// completed): a mirror topic is read-only. One entry per send, in history order.
    fn read_only_writes(&mut self) {
        if !self.mirror.mirrors() {
            return;
        }
        let mut sends: BTreeMap<u64, (i64, ValueInfo)> = BTreeMap::new();
        for (v, &info) in self.values.iter() {
            if info.outcome != Outcome::Ok || info.send_pk == NO_PK {
                continue;
            }
            let cluster = &self.clusters[self.parts[info.send_pk as usize].cluster as usize];
            if sends.contains_key(&info.completion) {
                continue;
            }
            if self
                .mirror
                .read_only_during(cluster, info.invoke, info.completion)
                .is_some()
            {
                sends.insert(info.completion, (v, info));
            }
        }
        for (completion, (v, info)) in sends {
            let (cluster, topic, partition) = self.place(info.send_pk);
            let since = self
                .mirror
                .read_only_during(&cluster, info.invoke, completion)
                .flatten();
            let entry = json!({
                "value": v, "cluster": cluster, "topic": topic, "partition": partition,
                "offset": info.acked(), "op_index": completion, "invoke_index": info.invoke,
                "mirroring_since": since.map(|op| json!({"op_index": op})),
            });
            self.anomalies.push(AnomalyKind::ReadOnlyWrite, entry);
        }
    }

    /// `ack-above-high-watermark`: each suspect poll (see [`acks`]) whose send's last record
    /// the final log holds, acknowledged there and written in the epoch the poll was served
    /// under. Without a final log the epoch a record was written in is unknown, and nothing is
    /// judged.
    fn check_acks(&mut self) {
        for s in self.acks.suspects() {
            let Some(log) = self.parts[s.pk as usize].final_log else {
                continue;
            };
            let records = &self.finals.logs[log as usize].records;
            let at = records.partition_point(|r| r.offset < s.acked);
            let Some(record) = records.get(at).filter(|r| {
                r.offset == s.acked
                    && r.epoch == Some(s.epoch)
                    && self.values.get(r.value).is_some_and(|info| {
                        info.outcome == Outcome::Ok
                            && info.completion == s.send
                            && info.acked() == Some(s.acked)
                    })
            }) else {
                continue;
            };
            let part = &self.parts[s.pk as usize];
            let entry = json!({
                "cluster": self.clusters[part.cluster as usize],
                "topic": self.topics[part.topic as usize], "partition": part.partition,
                "op_index": s.poll, "process": s.process, "high_watermark": s.high_watermark,
                "leader_epoch": s.epoch,
                "send": {"op_index": s.send, "value": record.value, "offset": record.offset},
            });
            self.anomalies
                .push(AnomalyKind::AckAboveHighWatermark, entry);
        }
    }

    /// The leader and high watermark of the final committed log of `pk`, if it has one.
    fn final_log_of(&self, pk: u32) -> Option<Value> {
        let log = &self.finals.logs[self.parts[pk as usize].final_log? as usize];
        let leader = &self.replicas.unwrap_or_default()[log.leader];
        Some(json!({"node": leader.node, "high_watermark": log.hw}))
    }

    /// A missing acknowledged write: `abandoned-write` when a failover from its cluster had not
    /// mirrored its offset, else `lost-write`, judged by the entry rules (a write the failover
    /// had mirrored may still have been lost before it, to an unclean election in its cluster
    /// that the mirror then followed). Without an acknowledged offset it cannot be shown
    /// unmirrored, so it is lost; when that failover recorded nothing for its partition, it is
    /// a `lost-write` allowed on its own.
    fn lost_write(&mut self, v: i64, info: &ValueInfo, proof: Value) {
        let (cluster, topic, partition) = self.place(info.send_pk);
        let seen_by = (info.first_poll != NONE).then_some(info.first_poll);
        let mut entry = json!({
            "value": v, "cluster": cluster, "topic": topic, "partition": partition,
            "offset": info.acked(), "op_index": info.completion, "invoke_index": info.invoke,
            "seen_by_poll": seen_by,
        });
        if let (Value::Object(e), Value::Object(p)) = (&mut entry, proof) {
            e.extend(p);
        }
        let kind = AnomalyKind::LostWrite;
        let place = Place {
            cluster: Some(&cluster),
            topic: &topic,
            partition,
            offset: info.acked(),
            acknowledged: Some(info.completion),
        };
        let failover = self
            .mirror
            .abandoned_by(&cluster, &topic, partition, info.invoke);
        let Some((failover, mirrored)) = failover else {
            let excuse = self.policy.excuse(kind, place, &self.facts, &self.mirror);
            return self.anomalies.push_judged(kind, entry, excuse);
        };
        entry["failover"] = json!({
            "op_index": failover.index, "to": failover.to, "mirrored_offset": mirrored,
        });
        match (mirrored, info.acked()) {
            (Some(m), Some(offset)) if offset >= m => {
                self.anomalies.push(AnomalyKind::AbandonedWrite, entry)
            }
            // What that failover mirrored of this partition is unknown: the write cannot be
            // told from an abandoned one.
            (None, _) => {
                let why = format!(
                    "failover op {} recorded no mirrored_offset for {topic}/{partition}: an abandoned write cannot be told from a lost one",
                    failover.index
                );
                self.anomalies.push_judged(kind, entry, Some(why));
            }
            _ => {
                let excuse = self.policy.excuse(kind, place, &self.facts, &self.mirror);
                self.anomalies.push_judged(kind, entry, excuse);
            }
        }
    }

    /// Without a final log, an acknowledged value is proven lost when no poll ever returned it
    /// although some poll read past its acknowledged offset, starting at or before it (Jepsen's
    /// reasoning: that poll saw the committed log beyond the offset, and the value was not there).
    fn lost_by_polls(&mut self, by_polls: FxHashMap<u32, Vec<(i64, i64, ValueInfo)>>) {
        let mut pks: Vec<_> = by_polls.into_iter().collect();
        pks.sort_unstable_by_key(|(pk, _)| *pk);
        for (pk, mut candidates) in pks {
            candidates.sort_unstable_by_key(|c| (c.0, c.1));
            let mut reach: Vec<(i64, (i64, u64))> = self.parts[pk as usize]
                .reach
                .iter()
                .map(|(f, &r)| (f, r))
                .collect();
            reach.sort_unstable_by_key(|&(from, _)| from);
            let mut next = 0;
            let mut best: Option<(i64, u64)> = None;
            for (acked, v, info) in candidates {
                while next < reach.len() && reach[next].0 <= acked {
                    let r = reach[next].1;
                    if best.is_none_or(|b| r.0 > b.0) {
                        best = Some(r);
                    }
                    next += 1;
                }
                if let Some((furthest, poll)) = best.filter(|b| b.0 > acked) {
                    let proof = json!({"read_past_by": {"poll": poll, "offset": furthest}});
                    self.lost_write(v, &info, proof);
                }
            }
        }
    }

    fn check_conflicts(&mut self) {
        let mut conflicts: Vec<_> = std::mem::take(&mut self.conflicts).into_iter().collect();
        conflicts.sort_unstable_by_key(|(k, _)| *k);
        for ((pk, offset), witnesses) in conflicts {
            let (cluster, topic, partition) = self.place(pk);
            let values: Vec<Value> = witnesses
                .iter()
                .map(|&(v, p)| json!({"value": v, "seen_by": self.proof_json(p)}))
                .collect();
            let kind = AnomalyKind::InconsistentOffsets;
            let place = Place {
                cluster: Some(&cluster),
                topic: &topic,
                partition,
                offset: Some(offset),
                acknowledged: None,
            };
            let excuse = self.policy.excuse(kind, place, &self.facts, &self.mirror);
            let entry = json!({
                "cluster": cluster, "topic": topic, "partition": partition, "offset": offset,
                "values": values,
            });
            self.anomalies.push_judged(kind, entry, excuse);
        }
    }

    fn check_duplicates(&mut self) {
        let mut dups: Vec<_> = std::mem::take(&mut self.duplicates).into_iter().collect();
        dups.sort_unstable_by_key(|(v, _)| *v);
        for (value, places) in dups {
            let places: Vec<Value> = places
                .iter()
                .map(|&(pk, offset, proof)| {
                    let (cluster, topic, partition) = self.place(pk);
                    json!({"cluster": cluster, "topic": topic, "partition": partition,
                           "offset": offset, "seen_by": self.proof_json(proof)})
                })
                .collect();
            let entry = json!({"value": value, "places": places});
            self.anomalies.push(AnomalyKind::Duplicate, entry);
        }
    }

    /// The offsets a partition's committed log holds, and where they come from: the final log
    /// when there is one (records of failed sends aside: a read-committed consumer rightly skips
    /// them, and they are reported as aborted reads), else what some poll read.
    fn committed_offsets(&self, pk: u32) -> (&'static str, Vec<i64>) {
        let part = &self.parts[pk as usize];
        match part.final_log {
            Some(i) => (
                "final log",
                self.finals.logs[i as usize]
                    .records
                    .iter()
                    .filter(|r| {
                        self.values
                            .get(r.value)
                            .is_none_or(|i| i.outcome != Outcome::Fail)
                    })
                    .map(|r| r.offset)
                    .collect(),
            ),
            None => {
                let mut polled: Vec<i64> = part
                    .slots
                    .iter()
                    .filter(|(_, s)| s.polled)
                    .map(|(o, _)| o)
                    .collect();
                polled.sort_unstable();
                ("polls", polled)
            }
        }
    }

    /// Records an anomaly of a group's own records, judged as acknowledged at op `acknowledged`:
    /// they are in `__consumer_offsets`, whose partition the history does not name, so what may
    /// lose them is judged for the cluster as a whole.
    fn push_group_record_anomaly(
        &mut self,
        kind: AnomalyKind,
        cluster: &str,
        acknowledged: u64,
        entry: Value,
    ) {
        let place = Place {
            cluster: Some(cluster),
            topic: OFFSETS_TOPIC,
            partition: -1,
            offset: None,
            acknowledged: Some(acknowledged),
        };
        let excuse = self.policy.excuse(kind, place, &self.facts, &self.mirror);
        self.anomalies.push_judged(kind, entry, excuse);
    }

    /// A group's commits: a regression within a generation, and records below the highest
    /// acknowledged commit that no poll of the group returned.
    fn check_groups(&mut self) {
        let groups = std::mem::take(&mut self.groups);
        for r in &groups.regressions {
            let (cluster, topic, partition) = self.place(r.pk);
            let entry = json!({
                "group": groups.names[r.group as usize], "generation": r.generation,
                "cluster": cluster, "topic": topic, "partition": partition,
                "offset": r.commit.offset, "op_index": r.commit.op, "member": r.commit.member,
                "earlier": {"offset": r.earlier.offset, "op_index": r.earlier.op,
                            "member": r.earlier.member},
            });
            self.anomalies.push(AnomalyKind::CommitRegression, entry);
        }
        for z in &groups.zombies {
            let cluster = self.clusters[z.cluster as usize].clone();
            let offsets: Vec<Value> = (z.offsets.iter())
                .map(|(t, p, o)| json!({"topic": t, "partition": p, "offset": o}))
                .collect();
            let entry = json!({
                "group": groups.names[z.group as usize], "cluster": cluster,
                "generation": z.generation, "member": z.member, "op_index": z.op,
                "invoke_index": z.invoked, "offsets": offsets,
                "later": {"generation": z.later.generation, "op_index": z.later.op,
                          "f": z.later.f, "member": z.later.member},
            });
            self.push_group_record_anomaly(AnomalyKind::ZombieCommit, &cluster, z.later.op, entry);
        }
        for lost in groups.lost_commits() {
            let (r, last) = (&lost.resume, &lost.last);
            let (cluster, topic, partition) = self.place(r.pk);
            let entry = json!({
                "group": groups.names[r.group as usize], "cluster": cluster, "topic": topic,
                "partition": partition, "generation": r.generation, "member": r.member,
                "op_index": r.op, "from": r.from, "joined_after": r.joined_after,
                "commit": {"offset": last.commit.offset, "op_index": last.commit.op,
                           "invoke_index": last.invoked, "member": last.commit.member},
            });
            let kind = AnomalyKind::CommitLost;
            self.push_group_record_anomaly(kind, &cluster, last.commit.op, entry);
        }
        let mut highest: Vec<_> = groups.highest.iter().collect();
        highest.sort_unstable_by_key(|(&(g, pk), _)| (g, pk));
        let none = BTreeSet::new();
        for (&(group, pk), commit) in highest {
            let (reference, known) = self.committed_offsets(pk);
            let polled = groups.polled.get(&(group, pk)).unwrap_or(&none);
            let below = &known[..known.partition_point(|&o| o < commit.offset)];
            let skipped: Vec<i64> = below
                .iter()
                .copied()
                .filter(|o| !polled.contains(o))
                .collect();
            if skipped.is_empty() {
                continue;
            }
            let (cluster, topic, partition) = self.place(pk);
            let entry = json!({
                "group": groups.names[group as usize], "cluster": cluster, "topic": topic,
                "partition": partition, "committed": commit.offset, "op_index": commit.op,
                "member": commit.member,
                "skipped": skipped.iter().take(MAX_SKIPPED_LISTED).collect::<Vec<_>>(),
                "skipped_count": skipped.len(), "reference": reference,
            });
            let place = Place {
                cluster: Some(&cluster),
                topic: &topic,
                partition,
                offset: Some(commit.offset),
                acknowledged: None,
            };
            let kind = AnomalyKind::CommitSkip;
            let excuse = self.policy.excuse(kind, place, &self.facts, &self.mirror);
            self.anomalies.push_judged(kind, entry, excuse);
        }
    }

    /// A gap a poll jumped over is a skip when the committed log holds a record in it: the
    /// final log when there is one (records of failed sends aside: a read-committed consumer
    /// rightly skips them, and they are reported as aborted reads), else what some poll read.
    /// A poll that read another history than the final log's there (the record after its gap is
    /// not the final log's: a failback or an unclean election later rewrote those offsets) is
    /// not judged against it; what it read is judged as any rewritten record is.
    fn check_skips(&mut self) {
        for pk in 0..self.parts.len() as u32 {
            if self.parts[pk as usize].gaps.is_empty() {
                continue;
            }
            let (cluster, topic, partition) = self.place(pk);
            let (reference, known) = self.committed_offsets(pk);
            let part = &self.parts[pk as usize];
            let mut gaps: Vec<_> = part.gaps.iter().map(|(&k, &g)| (k, g)).collect();
            gaps.sort_unstable_by_key(|&(k, g)| (g.op, k));
            let rewritten = |hi: i64, value: i64| {
                part.final_log.is_some_and(|i| {
                    let records = &self.finals.logs[i as usize].records;
                    let at = records.partition_point(|r| r.offset < hi);
                    records
                        .get(at)
                        .is_none_or(|r| r.offset != hi || r.value != value)
                })
            };
            for ((lo, hi), gap) in gaps {
                if rewritten(hi, gap.next_value) {
                    continue;
                }
                let start = known.partition_point(|&o| o < lo);
                let end = known.partition_point(|&o| o < hi);
                if start == end {
                    continue;
                }
                let listed: Vec<i64> = known[start..end]
                    .iter()
                    .take(MAX_SKIPPED_LISTED)
                    .copied()
                    .collect();
                let entry = json!({
                    "cluster": cluster, "topic": topic, "partition": partition,
                    "op_index": gap.op, "process": gap.process, "after": gap.after, "from": lo,
                    "next": hi, "skipped": listed, "skipped_count": end - start,
                    "polls": gap.polls, "reference": reference,
                });
                self.anomalies.push(AnomalyKind::PollSkip, entry);
            }
        }
    }

    fn check_replicas(&mut self) {
        let Some(replicas) = self.replicas else {
            for kind in [
                AnomalyKind::Divergence,
                AnomalyKind::MirrorDivergence,
                AnomalyKind::EpochOwnership,
            ] {
                self.skipped.push(SkippedCheck {
                    check: kind.name().into(),
                    reason: "no replicas.jsonl".into(),
                });
            }
            self.warn(
                "no replicas.jsonl: epoch-regression is checked within polls only".to_owned(),
            );
            return;
        };
        replicas::epoch_regression(replicas, &mut self.anomalies);
        crate::producers::producer_state_divergence(replicas, &self.finals, &mut self.anomalies);
        self.check_mirror_epochs(replicas);
        let judge = |kind: AnomalyKind, place: Place<'_>| {
            self.policy.excuse(kind, place, &self.facts, &self.mirror)
        };
        // A partition read after the last fault (the final reads) had a leader to converge to.
        let served = |cluster: &str, topic: &str, partition: i64| {
            let (Some(&c), Some(&t)) = (self.cluster_ids.get(cluster), self.topic_ids.get(topic))
            else {
                return false;
            };
            let pk = self.pk_ids.get(&(c, t, partition));
            let read = pk.and_then(|&pk| self.parts[pk as usize].last_read);
            read > self.last_fault
        };
        replicas::convergence(replicas, &self.finals, &served, &judge, &mut self.anomalies);
        for i in replicas::divergence(replicas, &self.finals, &judge, &mut self.anomalies) {
            let r = &replicas[i];
            self.skipped.push(SkippedCheck {
                check: AnomalyKind::Divergence.name().into(),
                reason: format!(
                    "replica {}/{}/{} on {} has no high watermark: its records are not compared",
                    r.cluster, r.topic, r.partition, r.node
                ),
            });
        }
        let mirrored = replicas
            .iter()
            .map(|r| r.cluster.as_str())
            .collect::<BTreeSet<_>>()
            .len()
            > 1;
        if !mirrored {
            for kind in [AnomalyKind::MirrorDivergence, AnomalyKind::EpochOwnership] {
                self.skipped.push(SkippedCheck {
                    check: kind.name().into(),
                    reason: "the replicas are of one cluster: nothing is mirrored".into(),
                });
            }
            return;
        }
        let judge = |kind: AnomalyKind, place: Place<'_>| {
            self.policy.excuse(kind, place, &self.facts, &self.mirror)
        };
        if self.mirror.ended_failed_over() {
            self.skipped.push(SkippedCheck {
                check: AnomalyKind::MirrorDivergence.name().into(),
                reason: "the run ended failed over (no failback after the last failover), so the clusters need not converge".into(),
            });
        } else {
            replicas::mirror_divergence(replicas, &self.finals, &judge, &mut self.anomalies);
        }
        let origin = |v: i64| -> Option<&str> {
            let info = self.values.get(v)?;
            (info.send_pk != NO_PK).then(|| {
                let part = &self.parts[info.send_pk as usize];
                self.clusters[part.cluster as usize].as_str()
            })
        };
        replicas::epoch_ownership(replicas, &origin, &judge, &mut self.anomalies);
        if self.last_move_failed {
            self.skipped.push(SkippedCheck {
                check: AnomalyKind::MirrorEpochCache.name().into(),
                reason: "the last failover or failback fell short and recorded no direction left mirroring, so which cluster mirrors is not known".into(),
            });
        } else {
            replicas::mirror_epoch_cache(
                replicas,
                self.mirror.mirroring_at_end(),
                &mut self.anomalies,
            );
        }
    }

    /// What the failovers and failbacks promise about epochs, checked on each committed record
    /// against the send that wrote its value (one binary search among the changes per record,
    /// and nothing at all without a change):
    ///
    /// - M5: a value written on a cluster after a failover to it carries an epoch above the LMLE
    ///   that failover recorded (checked on the final log of the cluster it was written on).
    /// - M3: a value written on a cluster before a failback into it, under an epoch above the
    ///   LMLE that failback truncated to (the higher of the failback's and its failover's
    ///   record, so a wrong record cannot make a false alarm), is in none of its replicas that
    ///   took part in the truncation: every replica when it ran with the flag on, else the ISR,
    ///   of which only the final log's leader is certain. A record the cluster it failed back
    ///   from holds the same at the same offset in its final log was mirrored there before,
    ///   and may have been fetched back: the LMLE was lower than what that cluster had mirrored
    ///   (one it kept lost, as a power loss under the default flush policy may lose it).
    fn check_mirror_epochs(&mut self, replicas: &[ReplicaState]) {
        if self.mirror.is_empty() {
            return;
        }
        self.check_lagging_truncations();
        let leaders: rustc_hash::FxHashSet<usize> =
            self.finals.logs.iter().map(|l| l.leader).collect();
        for (i, r) in replicas.iter().enumerate() {
            if r.error.is_some() || r.high_watermark.is_none() {
                continue;
            }
            let Some(&cluster) = self.cluster_ids.get(r.cluster.as_str()) else {
                continue;
            };
            let leader = leaders.contains(&i);
            for rec in replicas::committed(r).iter() {
                let Some(epoch) = rec.epoch else { continue };
                let Some(info) = self.values.get(rec.value).copied() else {
                    continue;
                };
                if info.send_pk == NO_PK {
                    continue;
                }
                let part = &self.parts[info.send_pk as usize];
                let topic = &self.topics[part.topic as usize];
                if part.cluster != cluster || *topic != r.topic || part.partition != r.partition {
                    continue;
                }
                let failover = self
                    .mirror
                    .failover_before(&r.cluster, topic, r.partition, info.invoke)
                    .filter(|_| leader)
                    .and_then(|(c, m)| Some((c.index, m.lmle?, m.epoch)))
                    .filter(|&(_, lmle, _)| epoch <= lmle);
                if let Some((op, lmle, bumped)) = failover {
                    let entry = json!({
                        "value": rec.value, "cluster": r.cluster, "node": r.node,
                        "topic": r.topic, "partition": r.partition, "offset": rec.offset,
                        "epoch": epoch, "invoke_index": info.invoke, "op_index": info.completion,
                        "failover": {"op_index": op, "lmle": lmle, "epoch": bumped},
                    });
                    self.anomalies.push(AnomalyKind::UnbumpedEpoch, entry);
                }
                let failback = self
                    .mirror
                    .failback_after(&r.cluster, topic, r.partition, info.invoke)
                    .filter(|&(_, _, all)| all || leader)
                    .and_then(|(c, m, all)| {
                        // The LMLE the truncating cluster looked up is the one its failover
                        // recorded; of the two records, the higher truncates less.
                        let recorded = self.mirror.lmle_of_failover_into(c, topic, r.partition);
                        let lmle = m.lmle.max(recorded)?;
                        Some((c.index, lmle, all, c.from.as_str()))
                    })
                    .filter(|&(_, lmle, _, _)| epoch > lmle)
                    .filter(|&(_, _, _, from)| {
                        let place = (from, r.topic.as_str(), r.partition);
                        self.finals.record_at(replicas, place, rec.offset) != Some(rec)
                    });
                if let Some((op, lmle, all, _)) = failback {
                    let place = Place {
                        cluster: Some(&r.cluster),
                        topic: &r.topic,
                        partition: r.partition,
                        offset: Some(rec.offset),
                        acknowledged: None,
                    };
                    let kind = AnomalyKind::LmleTruncation;
                    let excuse = self.policy.excuse(kind, place, &self.facts, &self.mirror);
                    let entry = json!({
                        "value": rec.value, "cluster": r.cluster, "node": r.node,
                        "topic": r.topic, "partition": r.partition, "record": rec,
                        "invoke_index": info.invoke,
                        "failback": {"op_index": op, "lmle": lmle, "all_replicas": all},
                    });
                    self.anomalies.push_judged(kind, entry, excuse);
                }
            }
        }
    }
}

impl QueueAnalysis<'_> {
    /// M3 as the lagging replica of a failback saw it: once the partition mirrored, a replica
    /// that had to take part in the LMLE truncation (every replica with the flag on, else the
    /// ISR) and held no leadership holds no epoch above the LMLE. Cut off from fetching, it
    /// cannot have received one since, so any such epoch is one the truncation left.
    fn check_lagging_truncations(&mut self) {
        let mut found = Vec::new();
        for (c, l, lmle, all) in self.mirror.lagging_after_truncation() {
            if l.leader.as_deref() == Some(l.node.as_str()) {
                continue;
            }
            let Some(&(epoch, start)) = l.epochs.iter().flatten().find(|(e, _)| *e > lmle) else {
                continue;
            };
            found.push((c.index, c.to.clone(), l.clone(), lmle, all, epoch, start));
        }
        for (op, cluster, l, lmle, all, epoch, start) in found {
            let place = Place {
                cluster: Some(&cluster),
                topic: &l.topic,
                partition: l.partition,
                offset: Some(start),
                acknowledged: None,
            };
            let kind = AnomalyKind::LmleTruncation;
            // What the flag exists to prevent, allowed without it (KIP-1279 §1.10).
            let excuse = if all || l.in_isr {
                self.policy.excuse(kind, place, &self.facts, &self.mirror)
            } else {
                Some(format!(
                    "the failback ran with {MIRROR_UNCLEAN_KEY} off and {} was out of the ISR: \
                     the LMLE truncation waited for the ISR only",
                    l.node
                ))
            };
            let entry = json!({
                "cluster": cluster, "node": l.node, "topic": l.topic, "partition": l.partition,
                "epoch_entry": [epoch, start], "lagging": true,
                "failback": {"op_index": op, "lmle": lmle, "all_replicas": all},
            });
            self.anomalies.push_judged(kind, entry, excuse);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_info_fits_in_a_cache_line() {
        assert!(std::mem::size_of::<Option<ValueInfo>>() <= 64);
    }
}
