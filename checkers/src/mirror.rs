//! The mirroring topology over time, as the nemesis recorded it: which cluster each failover
//! made writable and what the new writer had mirrored by then, which cluster each failback made
//! mirror again and from which LMLE it truncated, where unclean elections struck, and when
//! `mirror.support.unclean.leader.election` was on. The checks of KIP-1279's invariants and the
//! verdict policy ask it questions about one partition at one point of the history; it holds a
//! few entries per nemesis op and nothing per client op, so asking is cheap and the analysis
//! stays linear in the ops.
//!
//! Points of the history are op indices: a change counts from the index of the `info` that
//! recorded it (what was done), so a send invoked after that index was certainly made after it.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::Value;

/// The topic config that makes LMLE truncation wait for every replica (KIP-1279 §1.10).
pub(crate) const MIRROR_UNCLEAN_KEY: &str = "mirror.support.unclean.leader.election";

/// A failover makes `to` writable (it stops mirroring from `from`); a failback makes `to` mirror
/// from `from` again, truncating to the LMLE first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Failover,
    Failback,
}

/// What a failover or failback recorded for one partition.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct PartMark {
    pub topic: String,
    pub partition: i64,
    /// The last mirrored leader epoch read (failover: the new writer's; failback: the one the
    /// truncating cluster looked up).
    #[serde(default)]
    pub lmle: Option<i64>,
    /// The new writable cluster's log end when mirroring stopped: what the old source held at
    /// or above it was never mirrored.
    #[serde(default)]
    pub mirrored_offset: Option<i64>,
    /// The leader epoch bumped to.
    #[serde(default)]
    pub epoch: Option<i64>,
    /// The partition's mirror state when the op ended (`MIRRORING` once a failback's LMLE
    /// truncation is done).
    #[serde(default)]
    pub state: Option<String>,
}

/// The `info` value of a `failover` or `failback` op.
#[derive(Debug, Deserialize)]
struct ChangeValue {
    from: Option<String>,
    to: Option<String>,
    #[serde(default)]
    topics: Vec<String>,
    #[serde(default)]
    partitions: Option<Vec<PartMark>>,
    #[serde(default)]
    direction: Option<DirectionValue>,
    #[serde(default)]
    lagging_epochs: Vec<LaggingEpochs>,
}

/// A failback's lagging replica of one partition as it was when mirroring started: cut off
/// from fetching, it held what the LMLE truncation left it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct LaggingEpochs {
    pub topic: String,
    pub partition: i64,
    pub node: String,
    /// The partition's leader then.
    #[serde(default)]
    pub leader: Option<String>,
    /// Whether the lagging replica was in the ISR then.
    #[serde(default)]
    pub in_isr: bool,
    /// The partition's mirror state then.
    #[serde(default)]
    pub state: Option<String>,
    /// Its epoch cache, `[epoch, start offset]`; `None` when unread.
    #[serde(default)]
    pub epochs: Option<Vec<(i64, i64)>>,
}

/// The direction a failover or failback left the mirror in.
#[derive(Debug, Deserialize)]
struct DirectionValue {
    #[serde(default)]
    mirroring: bool,
    #[serde(default)]
    destination: Option<String>,
}

/// One failover or failback.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    /// The index of the `info` that recorded it.
    pub index: u64,
    pub kind: ChangeKind,
    /// The cluster mirrored (failback) or no longer mirrored (failover).
    pub from: String,
    pub to: String,
    /// The topics it acted on; empty: every topic.
    topics: Vec<String>,
    /// Per partition marks; `None` when the op recorded none (an older history).
    pub parts: Option<Vec<PartMark>>,
    /// Failback only: per partition mark, whether the flag was on for the truncating cluster.
    flag_on: Vec<bool>,
    /// The op fell short (it recorded an `error`).
    failed: bool,
    /// Failback only: its lagging replica, per partition.
    pub lagging: Vec<LaggingEpochs>,
}

impl Change {
    fn covers(&self, topic: &str) -> bool {
        self.topics.is_empty() || self.topics.iter().any(|t| t == topic)
    }

    /// This change's mark for one partition, when it recorded one.
    pub fn mark(&self, topic: &str, partition: i64) -> Option<(usize, &PartMark)> {
        self.parts
            .as_deref()?
            .iter()
            .enumerate()
            .find(|(_, m)| m.topic == topic && m.partition == partition)
    }

    /// Failback only: whether the truncation ran with the flag on, for mark `i`.
    pub fn flag_on(&self, i: usize) -> bool {
        self.flag_on.get(i).copied().unwrap_or(false)
    }

    /// Failback only: whether the LMLE truncation of `mark` is known done with the LMLE it
    /// records. A failback that fell short records what describe showed when it gave up: a
    /// partition still preparing may not have looked its LMLE up yet (describe then shows -1,
    /// a truncation of the whole log that never happened) or still waits to truncate.
    fn truncated(&self, mark: &PartMark) -> bool {
        !self.failed || mark.state.as_deref() == Some("MIRRORING")
    }
}

/// One forced unclean election.
#[derive(Debug, Clone)]
pub(crate) struct Unclean {
    pub index: u64,
    /// `None` when the op named none.
    pub cluster: Option<String>,
    pub topic: Option<String>,
    pub partition: Option<i64>,
    /// The cluster was not mirroring from another then (it held writes of its own).
    pub in_source: bool,
}

impl Unclean {
    fn hits(&self, topic: &str, partition: i64) -> bool {
        self.topic.as_deref().is_none_or(|t| t == topic)
            && self.partition.is_none_or(|p| p == partition)
    }
}

/// A `config` op that set the flag: on which cluster and topic (`None`: all).
#[derive(Debug, Clone)]
struct FlagSet {
    cluster: Option<String>,
    topic: Option<String>,
    on: bool,
}

/// From where on the flag's guarantee holds for one partition: offsets at or above `from` were
/// rewritten after an LMLE truncation that waited for every replica.
#[derive(Debug, Clone)]
pub(crate) struct Guard {
    pub topic: Option<String>,
    pub partition: Option<i64>,
    pub from: i64,
    /// The failback that ran that truncation; `None` for the flag set before the test.
    pub failback: Option<u64>,
}

/// The changes that concern one cluster, as positions in [`MirrorHistory::changes`] (so in
/// history order): every question about a cluster is a binary search in one of these.
#[derive(Debug, Clone, Default)]
struct Roles {
    failovers_to: Vec<usize>,
    failovers_from: Vec<usize>,
    failbacks_to: Vec<usize>,
}

/// The mirroring topology of one run; see the module docs.
#[derive(Debug, Clone, Default)]
pub(crate) struct MirrorHistory {
    pub changes: Vec<Change>,
    roles: BTreeMap<String, Roles>,
    pub uncleans: Vec<Unclean>,
    flag_initial: bool,
    flag_sets: Vec<FlagSet>,
    /// Clusters mirroring from another right now.
    destinations: BTreeSet<String>,
    /// Clusters mirroring from another when the test started.
    initial_destinations: BTreeSet<String>,
    /// Every failover invocation, by index: from then on its target may take writes.
    failover_invokes: Vec<u64>,
    guards: Vec<Guard>,
    /// Failovers invoked whose `info` has not been seen yet.
    open_failovers: u64,
    /// Failovers recorded without per-partition marks (an older history), by index.
    pub unmarked_failovers: Vec<u64>,
    /// Failbacks that ran with the flag on but recorded no mirrored offset for a partition.
    pub unguarded: Vec<(u64, String)>,
}

impl MirrorHistory {
    /// The starting topology from the test map: the flag's initial value (`mirror_unclean` in
    /// the test or its `workload_options`, or the topic config in `broker_config`/`topic_config`)
    /// and, for the `mirror` workload, which clusters mirror (every cluster of `clusters` but the
    /// `workload_cluster`, the first by default).
    pub fn new(test: &Value, flag_in_config: bool) -> Self {
        let flag_initial = flag_in_config
            || [
                test.get("mirror_unclean"),
                test.pointer("/workload_options/mirror_unclean"),
            ]
            .into_iter()
            .flatten()
            .any(truthy);
        let clusters: Vec<&str> = test
            .get("clusters")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let writable = test
            .get("workload_cluster")
            .and_then(Value::as_str)
            .or(clusters.first().copied());
        // Only the mirror workload mirrors from the start; other runs with several clusters
        // write to the first and leave the others alone.
        let mirror_workload = test.get("workload").and_then(Value::as_str) == Some("mirror");
        let destinations: BTreeSet<String> = clusters
            .iter()
            .filter(|c| mirror_workload && Some(**c) != writable)
            .map(|c| (*c).to_owned())
            .collect();
        let guards = if flag_initial {
            // The first mirror start ran its truncation (to nothing: LMLE -1) with the flag on.
            vec![Guard {
                topic: None,
                partition: None,
                from: 0,
                failback: None,
            }]
        } else {
            Vec::new()
        };
        MirrorHistory {
            flag_initial,
            initial_destinations: destinations.clone(),
            destinations,
            guards,
            ..MirrorHistory::default()
        }
    }

    /// Whether any failover or failback was recorded.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Whether some cluster mirrored from another at some point.
    pub fn mirrors(&self) -> bool {
        !self.changes.is_empty() || !self.initial_destinations.is_empty()
    }

    /// Failovers whose effect on each partition is unknown: recorded without marks, or invoked
    /// and never recorded.
    pub fn failovers_unmarked(&self) -> bool {
        !self.unmarked_failovers.is_empty() || self.open_failovers > 0
    }

    /// Takes in a nemesis op. Only what was done counts (`info`, `failed` when it recorded an
    /// `error`), except that an invoked failover is remembered until its `info` arrives.
    /// Returns a problem with the value.
    pub fn observe(
        &mut self,
        index: u64,
        invoke: bool,
        failed: bool,
        f: &str,
        cluster: Option<&str>,
        value: &Value,
    ) -> Result<(), String> {
        match (f, invoke) {
            ("failover", true) => {
                self.open_failovers += 1;
                self.failover_invokes.push(index);
            }
            ("failover", false) => {
                self.open_failovers = self.open_failovers.saturating_sub(1);
                self.change(index, ChangeKind::Failover, failed, value)?;
            }
            ("failback", false) => self.change(index, ChangeKind::Failback, failed, value)?,
            ("unclean-election", false) => {
                let cluster = value
                    .get("cluster")
                    .and_then(Value::as_str)
                    .or(cluster)
                    .map(str::to_owned);
                let in_source = cluster
                    .as_ref()
                    .is_none_or(|c| !self.destinations.contains(c));
                self.uncleans.push(Unclean {
                    index,
                    cluster,
                    topic: value
                        .get("topic")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    partition: value.get("partition").and_then(Value::as_i64),
                    in_source,
                });
            }
            ("config", false) => {
                if let Some(v) = value.get("set").and_then(|s| s.get(MIRROR_UNCLEAN_KEY)) {
                    self.flag_sets.push(FlagSet {
                        cluster: value
                            .get("cluster")
                            .and_then(Value::as_str)
                            .or(cluster)
                            .map(str::to_owned),
                        topic: value
                            .get("topic")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        on: truthy(v),
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn change(
        &mut self,
        index: u64,
        kind: ChangeKind,
        failed: bool,
        value: &Value,
    ) -> Result<(), String> {
        let v = ChangeValue::deserialize(value)
            .map_err(|e| format!("malformed {kind:?} value: {e}"))?;
        let (Some(from), Some(to)) = (v.from, v.to) else {
            return Err(format!("{kind:?} value names no from and to cluster"));
        };
        // A failback that fell short before mirroring started (its recorded direction, the one
        // it left in force, is not `to` mirroring) left the cluster writable and truncated
        // nothing.
        let started = v
            .direction
            .is_some_and(|d| d.mirroring && d.destination.as_deref() == Some(to.as_str()));
        if kind == ChangeKind::Failback && failed && !started {
            return Ok(());
        }
        let parts = v.partitions.filter(|p| !p.is_empty());
        let mut flag_on = Vec::new();
        match kind {
            ChangeKind::Failover => {
                self.destinations.remove(&to);
                if parts.is_none() {
                    self.unmarked_failovers.push(index);
                }
            }
            ChangeKind::Failback => {
                self.destinations.insert(to.clone());
                for m in parts.iter().flatten() {
                    let on = self.flag(&to, &m.topic);
                    flag_on.push(on);
                    // The guarantee starts once a truncation with the flag on is done.
                    if !on || (failed && m.state.as_deref() != Some("MIRRORING")) {
                        continue;
                    }
                    // The truncation rewrote the log from where the two clusters parted: what
                    // the failback recorded, else what the failover it ends recorded.
                    let from = m.mirrored_offset.or_else(|| {
                        self.last_failover_from(&to, index)?
                            .mark(&m.topic, m.partition)?
                            .1
                            .mirrored_offset
                    });
                    match from {
                        Some(from) => self.guards.push(Guard {
                            topic: Some(m.topic.clone()),
                            partition: Some(m.partition),
                            from,
                            failback: Some(index),
                        }),
                        None => self
                            .unguarded
                            .push((index, format!("{}/{}", m.topic, m.partition))),
                    }
                }
            }
        }
        let at = self.changes.len();
        match kind {
            ChangeKind::Failover => {
                self.roles
                    .entry(to.clone())
                    .or_default()
                    .failovers_to
                    .push(at);
                self.roles
                    .entry(from.clone())
                    .or_default()
                    .failovers_from
                    .push(at);
            }
            ChangeKind::Failback => self
                .roles
                .entry(to.clone())
                .or_default()
                .failbacks_to
                .push(at),
        }
        self.changes.push(Change {
            index,
            kind,
            from,
            to,
            topics: v.topics,
            parts,
            flag_on,
            failed,
            lagging: v.lagging_epochs,
        });
        Ok(())
    }

    /// The changes in `list` recorded before op `index` (`inclusive`: at or before), and those
    /// after.
    fn split<'a>(
        &'a self,
        list: &'a [usize],
        index: u64,
        inclusive: bool,
    ) -> (&'a [usize], &'a [usize]) {
        let n = list.partition_point(|&at| {
            let i = self.changes[at].index;
            i < index || (inclusive && i == index)
        });
        list.split_at(n)
    }

    fn roles(&self, cluster: &str) -> Option<&Roles> {
        self.roles.get(cluster)
    }

    /// The last failover from `cluster` recorded before op `index`.
    fn last_failover_from(&self, cluster: &str, index: u64) -> Option<&Change> {
        let (before, _) = self.split(&self.roles(cluster)?.failovers_from, index, false);
        before.last().map(|&at| &self.changes[at])
    }

    /// The flag on `cluster`'s `topic` now: the last `config` op that set it there, else its
    /// value before the test.
    fn flag(&self, cluster: &str, topic: &str) -> bool {
        self.flag_sets
            .iter()
            .rev()
            .find(|s| {
                s.cluster.as_deref().is_none_or(|c| c == cluster)
                    && s.topic.as_deref().is_none_or(|t| t == topic)
            })
            .map_or(self.flag_initial, |s| s.on)
    }

    /// The failover that ended the stretch in which `cluster` took a write invoked at op
    /// `invoke` (the first failover from `cluster` after the last failback into it before the
    /// write), with the offset up to which the new writer had mirrored the partition: `None`
    /// when that failover recorded none for it. A write it acknowledged at or above that offset
    /// was abandoned. When that failover fell short (an error) without a mark for the partition,
    /// a later failover from `cluster` before the next failback into it that recorded one
    /// stands in: the stop it found done, or finished, is the one the first began.
    pub fn abandoned_by(
        &self,
        cluster: &str,
        topic: &str,
        partition: i64,
        invoke: u64,
    ) -> Option<(&Change, Option<i64>)> {
        let roles = self.roles(cluster)?;
        let (before, _) = self.split(&roles.failbacks_to, invoke, false);
        let since = before
            .iter()
            .rev()
            .map(|&at| &self.changes[at])
            .find(|c| c.covers(topic))
            .map_or(0, |c| c.index);
        let (_, after) = self.split(&roles.failovers_from, since, true);
        let mut failovers = after
            .iter()
            .map(|&at| &self.changes[at])
            .filter(|c| c.covers(topic));
        let failover = failovers.next()?;
        let mirrored_by = |c: &Change| {
            c.mark(topic, partition)
                .and_then(|(_, m)| m.mirrored_offset)
        };
        let mirrored = mirrored_by(failover);
        if mirrored.is_some() || !failover.failed {
            return Some((failover, mirrored));
        }
        let (_, later_backs) = self.split(&roles.failbacks_to, failover.index, false);
        let until = later_backs
            .iter()
            .map(|&at| &self.changes[at])
            .find(|c| c.covers(topic))
            .map_or(u64::MAX, |c| c.index);
        let retried = failovers
            .take_while(|c| c.index < until)
            .find_map(|c| Some((c, Some(mirrored_by(c)?))));
        Some(retried.unwrap_or((failover, None)))
    }

    /// A failover from `cluster` whose mark says offsets from `offset` down to its mirrored
    /// offset were never mirrored (so the old source's records there were rewritten), or that
    /// covered the topic and recorded no mirrored offset for the partition (so they may not
    /// have been).
    pub fn unmirrored_at(
        &self,
        cluster: &str,
        topic: &str,
        partition: i64,
        offset: i64,
    ) -> Option<&Change> {
        self.roles(cluster)?
            .failovers_from
            .iter()
            .map(|&at| &self.changes[at])
            .find(|c| {
                let mirrored = c
                    .mark(topic, partition)
                    .and_then(|(_, m)| m.mirrored_offset);
                match mirrored {
                    Some(m) => m <= offset,
                    None => c.covers(topic),
                }
            })
    }

    /// The last failover to `cluster` recorded before op `invoke`, with its mark for the
    /// partition: a write invoked then must carry an epoch above the mark's LMLE (M5).
    pub fn failover_before(
        &self,
        cluster: &str,
        topic: &str,
        partition: i64,
        invoke: u64,
    ) -> Option<(&Change, &PartMark)> {
        let (before, _) = self.split(&self.roles(cluster)?.failovers_to, invoke, false);
        let c = before
            .iter()
            .rev()
            .map(|&at| &self.changes[at])
            .find(|c| c.covers(topic))?;
        c.mark(topic, partition).map(|(_, m)| (c, m))
    }

    /// The first failback into `cluster` recorded after op `invoke`, with its mark for the
    /// partition and whether it ran with the flag on: its LMLE truncation had to remove what
    /// `cluster` wrote above the LMLE before it (M3). `None` when that failback is not known to
    /// have truncated the partition (it fell short first).
    pub fn failback_after(
        &self,
        cluster: &str,
        topic: &str,
        partition: i64,
        invoke: u64,
    ) -> Option<(&Change, &PartMark, bool)> {
        let (_, after) = self.split(&self.roles(cluster)?.failbacks_to, invoke, true);
        let c = after
            .iter()
            .map(|&at| &self.changes[at])
            .find(|c| c.covers(topic))?;
        let (i, m) = c.mark(topic, partition).filter(|(_, m)| c.truncated(m))?;
        Some((c, m, c.flag_on(i)))
    }

    /// A failback into `cluster` run with the flag off, from where its log was rewritten at or
    /// below `offset`: its LMLE truncation waited for the ISR only, so a replica out of the ISR
    /// then may keep records above the LMLE at `offset` (KIP-1279 §1.10).
    /// With no `cluster`, any cluster's.
    pub fn flagless_failback_at(
        &self,
        cluster: Option<&str>,
        topic: &str,
        partition: i64,
        offset: i64,
    ) -> Option<(&str, &Change)> {
        let clusters = self
            .roles
            .iter()
            .filter(|(c, _)| cluster.is_none_or(|x| x == c.as_str()));
        clusters.into_iter().find_map(|(cluster, roles)| {
            let c = self.flagless_failback_of(cluster, roles, topic, partition, offset)?;
            Some((cluster.as_str(), c))
        })
    }

    fn flagless_failback_of(
        &self,
        cluster: &str,
        roles: &Roles,
        topic: &str,
        partition: i64,
        offset: i64,
    ) -> Option<&Change> {
        roles
            .failbacks_to
            .iter()
            .map(|&at| &self.changes[at])
            .find(|c| {
                let Some((i, m)) = c.mark(topic, partition) else {
                    return false;
                };
                let from = m.mirrored_offset.or_else(|| {
                    self.last_failover_from(cluster, c.index)?
                        .mark(topic, partition)?
                        .1
                        .mirrored_offset
                });
                !c.flag_on(i) && from.is_some_and(|f| f <= offset)
            })
    }

    /// The lagging replicas of failbacks that had finished their LMLE truncation while the
    /// replica was still cut off, each with the failback, the LMLE it truncated to (the higher
    /// of its record and its failover's), and whether it ran with the flag on.
    pub fn lagging_after_truncation(
        &self,
    ) -> impl Iterator<Item = (&Change, &LaggingEpochs, i64, bool)> + '_ {
        self.changes
            .iter()
            .filter(|c| c.kind == ChangeKind::Failback)
            .flat_map(move |c| {
                c.lagging.iter().filter_map(move |l| {
                    if l.state.as_deref() != Some("MIRRORING") {
                        return None;
                    }
                    let (i, m) = c.mark(&l.topic, l.partition)?;
                    let recorded = self.lmle_of_failover_into(c, &l.topic, l.partition);
                    let lmle = m.lmle.max(recorded)?;
                    Some((c, l, lmle, c.flag_on(i)))
                })
            })
    }

    /// The LMLE recorded by the failover a failback ends: the last failover from the cluster
    /// the failback makes mirror again, before it.
    pub fn lmle_of_failover_into(
        &self,
        failback: &Change,
        topic: &str,
        partition: i64,
    ) -> Option<i64> {
        self.last_failover_from(&failback.to, failback.index)?
            .mark(topic, partition)?
            .1
            .lmle
    }

    /// Whether `cluster` was certainly mirroring from another (so read-only) for the whole of a
    /// send invoked at op `invoke` and completed at op `done`: a failback into it was recorded
    /// before the send (or it mirrored from the start), no failover to it was recorded since,
    /// and no failover at all was invoked before the send completed. Returns the failback's
    /// index, or `None` inside for the mirroring set up before the test (M2).
    pub fn read_only_during(&self, cluster: &str, invoke: u64, done: u64) -> Option<Option<u64>> {
        let last = |list: &[usize]| {
            let (before, _) = self.split(list, invoke, false);
            before.last().map(|&at| self.changes[at].index)
        };
        let roles = self.roles(cluster);
        let failback = roles.and_then(|r| last(&r.failbacks_to));
        let failover = roles.and_then(|r| last(&r.failovers_to));
        let since = match (failback, failover) {
            (Some(b), Some(o)) if b > o => Some(b),
            (Some(b), None) => Some(b),
            (None, None) if self.initial_destinations.contains(cluster) => None,
            _ => return None,
        };
        let from = since.unwrap_or(0);
        let n = self.failover_invokes.partition_point(|&i| i <= from);
        let moved = self.failover_invokes.get(n).is_some_and(|&i| i < done);
        (!moved).then_some(since)
    }

    /// The clusters that mirror another as the last recorded change left them.
    pub fn mirroring_at_end(&self) -> &BTreeSet<String> {
        &self.destinations
    }

    /// The run ended failed over: the last change was a failover, or a failover was invoked
    /// and never recorded.
    pub fn ended_failed_over(&self) -> bool {
        self.open_failovers > 0
            || self
                .changes
                .last()
                .is_some_and(|c| c.kind == ChangeKind::Failover)
    }

    /// Where the flag's guarantee starts for a partition: the lowest offset any flag-on
    /// truncation rewrote from. Below it (or with no such truncation) the flag promised nothing.
    pub fn guard(&self, topic: &str, partition: i64) -> Option<&Guard> {
        self.guards
            .iter()
            .filter(|g| {
                g.topic.as_deref().is_none_or(|t| t == topic)
                    && g.partition.is_none_or(|p| p == partition)
            })
            .min_by_key(|g| g.from)
    }

    /// The first forced unclean election that hit a partition, in any cluster (mirroring
    /// carries a truncation from one cluster's copy to the other's), and was recorded after op
    /// `after` when given.
    pub fn unclean_at(&self, topic: &str, partition: i64, after: Option<u64>) -> Option<&Unclean> {
        self.uncleans
            .iter()
            .find(|u| u.hits(topic, partition) && after.is_none_or(|a| u.index > a))
    }

    /// The first forced unclean election that hit a source cluster's copy of a partition.
    pub fn unclean_in_source(&self, topic: &str, partition: i64) -> Option<&Unclean> {
        self.uncleans
            .iter()
            .find(|u| u.in_source && u.hits(topic, partition))
    }
}

pub(crate) fn truthy(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::String(s) => s.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn history() -> MirrorHistory {
        let mut m = MirrorHistory::new(
            &json!({"workload": "mirror", "clusters": ["a", "b"]}),
            false,
        );
        let mark = |off: i64| json!([{"topic": "t", "partition": 0, "lmle": 3, "mirrored_offset": off, "epoch": 4}]);
        m.observe(1, true, false, "failover", None, &json!({}))
            .unwrap();
        m.observe(
            2,
            false,
            false,
            "failover",
            None,
            &json!({"from": "a", "to": "b", "topics": ["t"], "partitions": mark(10)}),
        )
        .unwrap();
        m.observe(
            5,
            false,
            false,
            "unclean-election",
            Some("a"),
            &json!({"topic": "t", "partition": 0}),
        )
        .unwrap();
        m.observe(
            8,
            false,
            false,
            "failback",
            None,
            &json!({"from": "b", "to": "a", "topics": ["t"], "partitions": mark(10)}),
        )
        .unwrap();
        m.observe(
            9,
            false,
            false,
            "unclean-election",
            None,
            &json!({"cluster": "a"}),
        )
        .unwrap();
        m
    }

    #[test]
    fn writes_of_the_old_source_above_the_mirrored_offset_are_abandoned() {
        let m = history();
        let (f, mirrored) = m.abandoned_by("a", "t", 0, 0).unwrap();
        assert_eq!((f.index, mirrored), (2, Some(10)));
        assert_eq!(
            m.abandoned_by("a", "t", 1, 0).unwrap().1,
            None,
            "no mark for t/1"
        );
        // Written on a while it was abandoned (after the failover, before the failback).
        assert_eq!(m.abandoned_by("a", "t", 0, 4).unwrap().0.index, 2);
        // After the failback a mirrors again: no later failover from it abandons anything.
        assert!(m.abandoned_by("a", "t", 0, 9).is_none());
        assert!(m.abandoned_by("b", "t", 0, 0).is_none());
        assert!(!m.failovers_unmarked());
    }

    #[test]
    fn epochs_and_truncations_are_found_by_position() {
        let m = history();
        assert_eq!(m.failover_before("b", "t", 0, 3).unwrap().1.lmle, Some(3));
        assert!(m.failover_before("b", "t", 0, 2).is_none());
        assert_eq!(m.failback_after("a", "t", 0, 3).unwrap().0.index, 8);
        assert!(m.failback_after("a", "t", 0, 8).is_none());
    }

    #[test]
    fn unclean_elections_in_a_mirroring_cluster_are_not_in_the_source() {
        let m = history();
        assert!(m.uncleans[0].in_source, "a is the abandoned old source");
        assert!(
            !m.uncleans[1].in_source,
            "a mirrors from b after the failback"
        );
        assert_eq!(m.unclean_in_source("t", 0).unwrap().index, 5);
        assert!(m.unclean_in_source("u", 0).is_none());
    }

    #[test]
    fn the_flag_guards_from_the_first_truncation_run_with_it_on() {
        let m = history();
        assert!(m.guard("t", 0).is_none(), "the flag was off");
        let mut on = MirrorHistory::new(&json!({"clusters": ["a", "b"]}), false);
        on.observe(
            1,
            false,
            false,
            "config",
            None,
            &json!({"cluster": "a", "topic": "t", "set": {MIRROR_UNCLEAN_KEY: "true"}}),
        )
        .unwrap();
        on.observe(2, false, false, "failover", None, &json!({"from": "a", "to": "b", "partitions": [{"topic": "t", "partition": 0, "mirrored_offset": 7}]}))
            .unwrap();
        on.observe(3, false, false, "failback", None, &json!({"from": "b", "to": "a", "partitions": [{"topic": "t", "partition": 0, "lmle": 2}]}))
            .unwrap();
        let g = on.guard("t", 0).unwrap();
        assert_eq!((g.from, g.failback), (7, Some(3)));
        let from_start = MirrorHistory::new(&json!({"mirror_unclean": true}), false);
        assert_eq!(from_start.guard("t", 0).unwrap().from, 0);
    }

    #[test]
    fn a_cluster_is_read_only_while_it_mirrors() {
        let m = history();
        assert_eq!(
            m.read_only_during("b", 0, 1),
            Some(None),
            "b mirrored from the start"
        );
        assert_eq!(
            m.read_only_during("b", 0, 2),
            None,
            "a failover was invoked at op 1"
        );
        assert_eq!(m.read_only_during("a", 0, 1), None, "a took writes first");
        assert_eq!(
            m.read_only_during("a", 9, 12),
            Some(Some(8)),
            "a mirrors b after op 8"
        );
        assert_eq!(
            m.read_only_during("b", 9, 12),
            None,
            "b took writes since op 2"
        );
    }

    #[test]
    fn failovers_without_marks_are_remembered() {
        let mut m = MirrorHistory::new(&json!({}), false);
        m.observe(1, true, false, "failover", None, &json!({}))
            .unwrap();
        assert!(m.failovers_unmarked(), "invoked, never recorded");
        m.observe(
            2,
            false,
            false,
            "failover",
            None,
            &json!({"from": "a", "to": "b", "topics": ["t"]}),
        )
        .unwrap();
        assert_eq!(m.unmarked_failovers, [2]);
        assert_eq!(m.abandoned_by("a", "t", 0, 0).unwrap().1, None);
        assert!(m
            .observe(3, false, false, "failback", None, &json!({"to": "a"}))
            .unwrap_err()
            .contains("no from and to"));
    }
}
