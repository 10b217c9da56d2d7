//! The checks that read the final replica states: which log is the final committed one, whether
//! the replicas of a cluster agree (divergence) and each ended up holding the final log
//! (divergent-tail, lagging-replica), whether mirrored clusters agree
//! (mirror-divergence), whether epochs only grow (epoch-regression), and whether each epoch was
//! written by one cluster only (epoch-ownership).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Value};

use crate::op::{Record, ReplicaState};
use crate::policy::Place;
use crate::results::{Anomalies, AnomalyKind};

/// Why the policy allows one entry of a kind at a place, if it does.
pub(crate) type Judge<'j> = dyn Fn(AnomalyKind, Place<'_>) -> Option<String> + 'j;

/// The final committed log of one partition of one cluster: the leader replica's records below
/// its high watermark, and below its local log start those of the remote store (tiered storage).
/// Without a replica marked leader, the one with the highest high watermark, and of equals the
/// one the most other replicas agree with.
/// When the leader's high watermark is unknown (its checkpoint was unreadable), every record it
/// holds stands in: a value absent from the leader's whole log is certainly not committed.
#[derive(Debug)]
pub(crate) struct FinalLog<'r> {
    /// Index of the leader in the replica states.
    pub leader: usize,
    /// The leader's high watermark, when known.
    pub hw: Option<i64>,
    /// The leader's log start offset: records below it were removed by retention, not lost.
    pub start: i64,
    /// Committed records, by offset (borrowed from the replica state when it is in order).
    pub records: Cow<'r, [Record]>,
}

/// Every partition's final committed log, and its readable replicas.
#[derive(Debug, Default)]
pub(crate) struct FinalLogs<'r> {
    pub logs: Vec<FinalLog<'r>>,
    /// The readable replicas of each partition of each cluster, the final log's first.
    groups: Vec<Vec<usize>>,
}

impl<'r> FinalLogs<'r> {
    /// Groups the replicas by cluster, topic and partition and picks each group's final log.
    /// Returns warnings for replicas that could not be used, or only in part.
    pub fn build(replicas: &'r [ReplicaState]) -> (Self, Vec<String>) {
        let mut warnings = Vec::new();
        let mut by_part: BTreeMap<(&str, &str, i64), Vec<usize>> = BTreeMap::new();
        for (i, r) in replicas.iter().enumerate() {
            let place = format!("{}/{}/{} on {}", r.cluster, r.topic, r.partition, r.node);
            let entry = by_part
                .entry((&r.cluster, &r.topic, r.partition))
                .or_default();
            if let Some(e) = &r.error {
                warnings.push(format!("replica {place} could not be read: {e}"));
            } else {
                if r.high_watermark.is_none() {
                    warnings.push(format!(
                        "replica {place} has no high_watermark: its committed records are unknown"
                    ));
                }
                entry.push(i);
            }
        }
        let mut finals = FinalLogs::default();
        for ((cluster, topic, partition), mut readable) in by_part {
            let leaders: Vec<usize> = readable
                .iter()
                .copied()
                .filter(|&i| replicas[i].role.as_deref() == Some("leader"))
                .collect();
            if leaders.len() > 1 {
                warnings.push(format!(
                    "{cluster}/{topic}/{partition} has {} replicas marked leader: the one with the highest high watermark is the final log",
                    leaders.len()
                ));
            }
            let pool = if leaders.is_empty() {
                &readable
            } else {
                &leaders
            };
            // The first of equals wins, so the choice does not depend on iteration order; an
            // unknown high watermark ranks below every known one. Without a replica marked
            // leader (dumped after every broker stopped), of those with the highest high
            // watermark the one the most others agree with wins: a lagging replica that kept a
            // tail its cluster cut (a failback's truncation it missed) must not stand for a log
            // the others agree on otherwise.
            let hw = |i: usize| replicas[i].high_watermark;
            // Counted only between equals, and only without a leader: it compares whole logs.
            let keeps = |b: usize, i: usize| {
                hw(b) > hw(i)
                    || (hw(b) == hw(i)
                        && (!leaders.is_empty()
                            || agreeing(replicas, b, &readable)
                                >= agreeing(replicas, i, &readable)))
            };
            let leader = pool
                .iter()
                .copied()
                .fold(None, |best: Option<usize>, i| match best {
                    Some(b) if keeps(b, i) => Some(b),
                    _ => Some(i),
                });
            if let Some(leader) = leader {
                let mut start = replicas[leader].log_start_offset.unwrap_or(i64::MIN);
                let mut records = committed(&replicas[leader]);
                // With tiered storage the offsets below the local log are the remote store's.
                if let Some((remote_start, mut below)) =
                    crate::lineage::remote_prefix(&replicas[leader])
                {
                    start = remote_start;
                    below.extend_from_slice(&records);
                    records = Cow::Owned(below);
                }
                finals.logs.push(FinalLog {
                    leader,
                    hw: hw(leader),
                    start,
                    records,
                });
                readable.retain(|&i| i != leader);
                readable.insert(0, leader);
            }
            finals.groups.push(readable);
        }
        (finals, warnings)
    }

    /// The record at `offset` of the final committed log of `cluster`'s partition, whose
    /// replicas are `replicas` (those [`FinalLogs::build`] was given).
    pub fn record_at(
        &self,
        replicas: &[ReplicaState],
        (cluster, topic, partition): (&str, &str, i64),
        offset: i64,
    ) -> Option<&Record> {
        let log = self.logs.iter().find(|l| {
            let r = &replicas[l.leader];
            r.cluster == cluster && r.topic == topic && r.partition == partition
        })?;
        let at = log
            .records
            .binary_search_by_key(&offset, |x| x.offset)
            .ok()?;
        log.records.get(at)
    }
}

/// How many of `others` (replicas of one partition) hold the same committed records as replica
/// `i` wherever both hold some, below both high watermarks.
fn agreeing(replicas: &[ReplicaState], i: usize, others: &[usize]) -> usize {
    let mine = committed(&replicas[i]);
    others
        .iter()
        .filter(|&&j| j != i)
        .filter(|&&j| {
            differences(
                &mine,
                &committed(&replicas[j]),
                i64::MIN,
                i64::MAX,
                |x, y| x == y,
            )
            .iter()
            .all(|(_, a, b)| a.is_none() || b.is_none())
        })
        .count()
}

/// A replica's records by offset, from its log start offset up to its high watermark (its log
/// end when the high watermark is unknown).
pub(crate) fn committed(r: &ReplicaState) -> Cow<'_, [Record]> {
    let records = sorted(r);
    let low = r.log_start_offset.unwrap_or(i64::MIN);
    let high = r.high_watermark.unwrap_or(i64::MAX);
    let start = records.partition_point(|x| x.offset < low);
    let end = records.partition_point(|x| x.offset < high);
    match records {
        Cow::Borrowed(all) => Cow::Borrowed(&all[start..end.max(start)]),
        Cow::Owned(mut all) => {
            all.truncate(end.max(start));
            all.drain(..start);
            Cow::Owned(all)
        }
    }
}

fn sorted(r: &ReplicaState) -> Cow<'_, [Record]> {
    if r.records.is_sorted_by_key(|x| x.offset) {
        Cow::Borrowed(&r.records)
    } else {
        let mut owned = r.records.clone();
        owned.sort_by_key(|x| x.offset);
        Cow::Owned(owned)
    }
}

fn record_json(r: Option<&Record>) -> Value {
    r.map_or(Value::Null, |r| json!(r))
}

/// Records of two sorted logs at each offset in `[low, high)` where they differ, as
/// `(offset, left, right)`; a side without a data record there is `None`. `same` says whether
/// two records agree.
fn differences<'a>(
    a: &'a [Record],
    b: &'a [Record],
    low: i64,
    high: i64,
    same: impl Fn(&Record, &Record) -> bool,
) -> Vec<(i64, Option<&'a Record>, Option<&'a Record>)> {
    let clip = |x: &'a [Record]| {
        let s = x.partition_point(|r| r.offset < low);
        let e = x.partition_point(|r| r.offset < high).max(s);
        &x[s..e]
    };
    let (a, b) = (clip(a), clip(b));
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x.offset == y.offset => {
                if !same(x, y) {
                    out.push((x.offset, Some(x), Some(y)));
                }
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if x.offset < y.offset => {
                out.push((x.offset, Some(x), None));
                i += 1;
            }
            (Some(_), Some(y)) => {
                out.push((y.offset, None, Some(y)));
                j += 1;
            }
            (Some(x), None) => {
                out.push((x.offset, Some(x), None));
                i += 1;
            }
            (None, Some(y)) => {
                out.push((y.offset, None, Some(y)));
                j += 1;
            }
            (None, None) => break,
        }
    }
    out
}

/// Most replicas listed in one divergence entry besides the reference; the entry counts them all.
const MAX_DIFFERING_LISTED: usize = 8;

/// The replicas of one partition in one cluster hold different records (value or epoch, or a
/// data record against none) at an offset below their high watermarks and above their log
/// starts. Each replica is compared with one reference per offset, so the work is in proportion
/// to the records, not to the pairs of replicas: the final log's replica where it covers the
/// offset, else the record most of the covering replicas hold. One entry per offset names the
/// reference and a few of the replicas that differ from it, and counts them all. Replicas
/// whose high watermark is unknown cannot be compared; they are returned, to be reported as
/// a check that could not run.
pub(crate) fn divergence(
    replicas: &[ReplicaState],
    finals: &FinalLogs<'_>,
    judge: &Judge<'_>,
    out: &mut Anomalies,
) -> Vec<usize> {
    let mut unknown = Vec::new();
    for group in &finals.groups {
        let (members, unknown_hw): (Vec<usize>, Vec<usize>) = group
            .iter()
            .partition(|&&i| replicas[i].high_watermark.is_some());
        unknown.extend(unknown_hw);
        if members.len() > 1 {
            diverging_offsets(replicas, &members, judge, out);
        }
    }
    unknown
}

/// The committed range `[low, high)` of a replica with a known high watermark.
fn range(r: &ReplicaState) -> (i64, i64) {
    (
        r.log_start_offset.unwrap_or(i64::MIN),
        r.high_watermark.unwrap_or(i64::MIN),
    )
}

/// [`divergence`] within one group; `members[0]` is the final log's replica when it has one.
fn diverging_offsets(
    replicas: &[ReplicaState],
    members: &[usize],
    judge: &Judge<'_>,
    out: &mut Anomalies,
) {
    let ranges: Vec<(i64, i64)> = members.iter().map(|&i| range(&replicas[i])).collect();
    let mut lows: Vec<i64> = ranges.iter().map(|r| r.0).collect();
    let mut highs: Vec<i64> = ranges.iter().map(|r| r.1.max(r.0)).collect();
    lows.sort_unstable();
    highs.sort_unstable();
    let covers = |m: usize, o: i64| ranges[m].0 <= o && o < ranges[m].1;
    // Each member's committed records, walked together in offset order: one (offset, member,
    // record) per member holding the offset, without gathering every record of the partition.
    let logs: Vec<(Cow<'_, [Record]>, usize)> = members
        .iter()
        .enumerate()
        .map(|(m, &i)| {
            let high = ranges[m].1;
            let records = sorted(&replicas[i]);
            let e = records.partition_point(|r| r.offset < high);
            (records, e)
        })
        .collect();
    let mut cursor: Vec<usize> = logs
        .iter()
        .zip(&ranges)
        .map(|((records, e), &(low, _))| records.partition_point(|r| r.offset < low).min(*e))
        .collect();
    let first = &replicas[members[0]];
    let mut here: Vec<(i64, usize, Record)> = Vec::with_capacity(members.len());
    loop {
        let next = |m: usize| (cursor[m] < logs[m].1).then(|| logs[m].0[cursor[m]]);
        let Some(offset) = (0..logs.len()).filter_map(next).map(|r| r.offset).min() else {
            break;
        };
        here.clear();
        for (m, (records, e)) in logs.iter().enumerate() {
            if cursor[m] < *e && records[cursor[m]].offset == offset {
                here.push((offset, m, records[cursor[m]]));
                while cursor[m] < *e && records[cursor[m]].offset == offset {
                    cursor[m] += 1;
                }
            }
        }
        let here = &here[..];
        let covering =
            lows.partition_point(|&l| l <= offset) - highs.partition_point(|&h| h <= offset);
        let reference = if covers(0, offset) {
            here.first().filter(|h| h.1 == 0).map(|h| h.2)
        } else {
            majority(here, covering)
        };
        let agreeing = match reference {
            Some(x) => here.iter().filter(|h| h.2 == x).count(),
            None => covering - here.len(),
        };
        let differing = covering.saturating_sub(agreeing);
        if differing == 0 {
            continue;
        }
        let place = Place {
            cluster: Some(&first.cluster),
            topic: &first.topic,
            partition: first.partition,
            offset: Some(offset),
            acknowledged: None,
        };
        let excuse = judge(AnomalyKind::Divergence, place);
        out.push_judged_with(AnomalyKind::Divergence, excuse, || {
            let side = |m: usize, rec: Option<&Record>| {
                let r = &replicas[members[m]];
                json!({"node": r.node, "high_watermark": r.high_watermark, "record": record_json(rec)})
            };
            // `here` is sorted by member.
            let record_of = |m: usize| {
                let found = here.binary_search_by_key(&m, |h| h.1).ok();
                found.map(|at| &here[at].2)
            };
            let ref_member = (0..members.len())
                .find(|&m| covers(m, offset) && record_of(m).copied() == reference)
                .unwrap_or(0);
            let mut listed = vec![side(ref_member, reference.as_ref())];
            for m in (0..members.len()).filter(|&m| covers(m, offset)) {
                if listed.len() > MAX_DIFFERING_LISTED {
                    break;
                }
                let rec = record_of(m);
                if rec.copied() != reference {
                    listed.push(side(m, rec));
                }
            }
            json!({
                "cluster": first.cluster, "topic": first.topic, "partition": first.partition,
                "offset": offset, "replicas": listed, "differing_replicas": differing,
                "compared_replicas": covering,
            })
        });
    }
}

/// What healing promises: once every fault is undone and replicas have had time to converge, each
/// replica of a partition holds the final log. Two ways a replica can fail that, each reported
/// once per replica, and only where [`divergence`] does not look (below the replica's own high
/// watermark):
///
/// - `divergent-tail`: at offsets from its high watermark (its log start when unknown) up to the
///   final log's high watermark, it holds records that differ from the final log's there (value
///   or epoch): a tail its truncation to the leader's lineage should have removed, which it
///   would serve as the partition's if it were elected.
/// - `lagging-replica`: its log ends short of the final high watermark: it never caught up, and
///   the partition runs with fewer copies than its replication factor promises.
///
/// Judged only for a partition that `served` reads once the last fault was over (`served(cluster,
/// topic, partition)`): one left offline, as when its only in-sync replica lost its disk, has no
/// leader to converge to. Nor for one whose final high watermark is unknown.
pub(crate) fn convergence(
    replicas: &[ReplicaState],
    finals: &FinalLogs<'_>,
    served: &dyn Fn(&str, &str, i64) -> bool,
    judge: &Judge<'_>,
    out: &mut Anomalies,
) {
    for group in &finals.groups {
        let Some((&leader, followers)) = group.split_first() else {
            continue;
        };
        let Some(log) = finals.logs.iter().find(|l| l.leader == leader) else {
            continue;
        };
        let lead = &replicas[leader];
        let Some(final_hw) = log
            .hw
            .filter(|_| served(&lead.cluster, &lead.topic, lead.partition))
        else {
            continue;
        };
        let final_side = json!({"node": lead.node, "high_watermark": final_hw});
        for &i in followers {
            let r = &replicas[i];
            let place = |offset: Option<i64>| Place {
                cluster: Some(&r.cluster),
                topic: &r.topic,
                partition: r.partition,
                offset,
                acknowledged: None,
            };
            let from = r
                .high_watermark
                .or(r.log_start_offset)
                .unwrap_or(i64::MIN)
                .max(log.start);
            let tail = sorted(r);
            let tail = &tail[tail.partition_point(|x| x.offset < from)..];
            let tail = &tail[..tail.partition_point(|x| x.offset < final_hw)];
            let differing: Vec<(&Record, &Record)> = tail
                .iter()
                .filter_map(|x| {
                    let at = log.records.binary_search_by_key(&x.offset, |y| y.offset);
                    let y = &log.records[at.ok()?];
                    (y != x).then_some((x, y))
                })
                .collect();
            if let Some((first, theirs)) = differing.first() {
                let excuse = judge(AnomalyKind::DivergentTail, place(Some(first.offset)));
                out.push_judged_with(AnomalyKind::DivergentTail, excuse, || {
                    json!({
                        "cluster": r.cluster, "topic": r.topic, "partition": r.partition,
                        "node": r.node, "high_watermark": r.high_watermark,
                        "log_end_offset": r.log_end_offset, "offset": first.offset,
                        "record": first, "final": {"node": lead.node,
                        "high_watermark": final_hw, "record": theirs},
                        "differing_records": differing.len(),
                        "last_differing_offset": differing.last().map(|d| d.0.offset),
                    })
                });
            }
            let end = r
                .log_end_offset
                .or_else(|| r.records.iter().map(|x| x.offset + 1).max());
            if let Some(end) = end.filter(|&e| e < final_hw) {
                let excuse = judge(AnomalyKind::LaggingReplica, place(Some(end)));
                out.push_judged_with(AnomalyKind::LaggingReplica, excuse, || {
                    json!({
                        "cluster": r.cluster, "topic": r.topic, "partition": r.partition,
                        "node": r.node, "high_watermark": r.high_watermark,
                        "log_end_offset": r.log_end_offset, "behind": final_hw - end,
                        "final": final_side,
                    })
                });
            }
        }
    }
}

/// The record most of the covering replicas hold at one offset (`None`, no data record, when
/// more of them hold none); the first of equals wins.
fn majority(here: &[(i64, usize, Record)], covering: usize) -> Option<Record> {
    let mut counts: Vec<(Record, usize)> = Vec::new();
    for h in here {
        match counts.iter_mut().find(|c| c.0 == h.2) {
            Some(c) => c.1 += 1,
            None => counts.push((h.2, 1)),
        }
    }
    let best = counts
        .iter()
        .fold(None, |b: Option<&(Record, usize)>, c| match b {
            Some(b) if b.1 >= c.1 => Some(b),
            _ => Some(c),
        });
    best.filter(|b| b.1 >= covering - here.len()).map(|b| b.0)
}

/// The final committed logs of one topic partition on two clusters hold different values (or a
/// value against none) at an offset below both high watermarks. Each entry is judged on its own.
pub(crate) fn mirror_divergence(
    replicas: &[ReplicaState],
    finals: &FinalLogs<'_>,
    judge: &Judge<'_>,
    out: &mut Anomalies,
) {
    let mut by_tp: BTreeMap<(&str, i64), Vec<&FinalLog<'_>>> = BTreeMap::new();
    for log in &finals.logs {
        let r = &replicas[log.leader];
        by_tp.entry((&r.topic, r.partition)).or_default().push(log);
    }
    for ((topic, partition), logs) in by_tp {
        for (n, a) in logs.iter().enumerate() {
            for b in &logs[n + 1..] {
                let (ra, rb) = (&replicas[a.leader], &replicas[b.leader]);
                // Unknown high watermarks were reported when the logs were built.
                let (Some(ha), Some(hb)) = (a.hw, b.hw) else {
                    continue;
                };
                let high = ha.min(hb);
                let low = ra
                    .log_start_offset
                    .max(rb.log_start_offset)
                    .unwrap_or(i64::MIN);
                let diffs =
                    differences(&a.records, &b.records, low, high, |x, y| x.value == y.value);
                for (offset, x, y) in diffs {
                    let place = Place {
                        cluster: None,
                        topic,
                        partition,
                        offset: Some(offset),
                        acknowledged: None,
                    };
                    out.push_judged(
                        AnomalyKind::MirrorDivergence,
                        json!({
                            "topic": topic, "partition": partition, "offset": offset,
                            "clusters": [
                                {"cluster": ra.cluster, "node": ra.node, "high_watermark": a.hw, "record": record_json(x)},
                                {"cluster": rb.cluster, "node": rb.node, "high_watermark": b.hw, "record": record_json(y)},
                            ],
                        }),
                        judge(AnomalyKind::MirrorDivergence, place),
                    );
                }
            }
        }
    }
}

/// M11: a cluster that mirrors another at the end (`mirroring`) keeps in its epoch cache only
/// the epochs of mirrored batches, so where the two agree every entry of its replicas' caches is,
/// at the same start offset, an entry of some replica of the other clusters (whose leaders wrote
/// those batches, or mirrored them in turn). An entry found nowhere else is an epoch of the
/// mirror's own leadership. Entries whose first record the other clusters do not hold are left
/// to the divergence checks (the logs differ there, which may be excused); an epoch's first
/// batch may be a control batch (a failover's barrier), so its first record is the first at or
/// above its start offset, below the next entry's.
pub(crate) fn mirror_epoch_cache(
    replicas: &[ReplicaState],
    mirroring: &BTreeSet<String>,
    out: &mut Anomalies,
) {
    type Seen = (BTreeSet<(i64, i64)>, BTreeSet<Record>);
    let readable = |r: &&ReplicaState| r.error.is_none();
    let mut elsewhere: BTreeMap<(&str, i64), Seen> = BTreeMap::new();
    for r in replicas
        .iter()
        .filter(readable)
        .filter(|r| !mirroring.contains(&r.cluster))
    {
        let seen = elsewhere.entry((&r.topic, r.partition)).or_default();
        seen.0
            .extend(r.epochs.iter().map(|e| (e.epoch, e.start_offset)));
        seen.1.extend(r.records.iter().copied());
    }
    for r in replicas
        .iter()
        .filter(readable)
        .filter(|r| mirroring.contains(&r.cluster))
    {
        // Without a replica of the source to compare with, there is nothing to judge.
        let Some((entries, records)) = elsewhere.get(&(r.topic.as_str(), r.partition)) else {
            continue;
        };
        let agrees_within = |from: i64, below: i64| {
            r.records
                .iter()
                .filter(|rec| rec.offset >= from && rec.offset < below)
                .min_by_key(|rec| rec.offset)
                .is_none_or(|rec| records.contains(rec))
        };
        let ends = r
            .epochs
            .iter()
            .skip(1)
            .map(|next| next.start_offset)
            .chain([i64::MAX]);
        for (e, _) in r.epochs.iter().zip(ends).filter(|(e, below)| {
            !entries.contains(&(e.epoch, e.start_offset)) && agrees_within(e.start_offset, *below)
        }) {
            out.push(
                AnomalyKind::MirrorEpochCache,
                json!({"cluster": r.cluster, "node": r.node, "topic": r.topic,
                       "partition": r.partition, "entry": e}),
            );
        }
    }
}

/// In every readable replica, record epochs never decrease as offsets increase, and the epoch
/// cache strictly increases in both epoch and start offset (KIP-101; invariant I1 of docs/ARCHITECTURE.md).
pub(crate) fn epoch_regression(replicas: &[ReplicaState], out: &mut Anomalies) {
    for r in replicas.iter().filter(|r| r.error.is_none()) {
        let place = || json!({"cluster": r.cluster, "node": r.node, "topic": r.topic, "partition": r.partition});
        let records = sorted(r);
        let mut last: Option<&Record> = None;
        for rec in records.iter() {
            let Some(epoch) = rec.epoch else { continue };
            if let Some(prev) = last.filter(|p| p.epoch.is_some_and(|e| epoch < e)) {
                let mut entry = place();
                entry["records"] = json!([prev, rec]);
                entry["why"] = json!("a lower leader epoch at a higher offset");
                out.push(AnomalyKind::EpochRegression, entry);
            }
            last = Some(rec);
        }
        for pair in r.epochs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.epoch <= a.epoch || b.start_offset <= a.start_offset {
                let mut entry = place();
                entry["epochs"] = json!([a, b]);
                entry["why"] = json!("the epoch cache does not strictly increase");
                out.push(AnomalyKind::EpochRegression, entry);
            }
        }
    }
}

/// One leader epoch of one topic partition holds committed records, in any replica of any
/// cluster, whose values were first written on different clusters (KIP-1279 epoch ownership). `origin` names
/// the cluster of the send that wrote a value.
pub(crate) fn epoch_ownership<'a>(
    replicas: &[ReplicaState],
    origin: &dyn Fn(i64) -> Option<&'a str>,
    judge: &Judge<'_>,
    out: &mut Anomalies,
) {
    type Witness<'r> = (&'r ReplicaState, Record);
    let mut epochs: BTreeMap<(&str, i64, i64), BTreeMap<&'a str, Witness<'_>>> = BTreeMap::new();
    let known = |r: &&ReplicaState| r.error.is_none() && r.high_watermark.is_some();
    for r in replicas.iter().filter(known) {
        for rec in committed(r).iter() {
            let (Some(epoch), Some(cluster)) = (rec.epoch, origin(rec.value)) else {
                continue;
            };
            epochs
                .entry((&r.topic, r.partition, epoch))
                .or_default()
                .entry(cluster)
                .or_insert((r, *rec));
        }
    }
    for ((topic, partition, epoch), origins) in epochs {
        if origins.len() < 2 {
            continue;
        }
        let records: Vec<Value> = origins
            .iter()
            .map(|(origin, (r, rec))| {
                json!({"origin": origin, "cluster": r.cluster, "node": r.node, "record": rec})
            })
            .collect();
        let place = Place {
            cluster: None,
            topic,
            partition,
            offset: origins.values().map(|(_, rec)| rec.offset).min(),
            acknowledged: None,
        };
        out.push_judged(
            AnomalyKind::EpochOwnership,
            json!({"topic": topic, "partition": partition, "epoch": epoch, "records": records}),
            judge(AnomalyKind::EpochOwnership, place),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(o: i64, v: i64) -> Record {
        Record::new(o, v, 0)
    }

    #[test]
    fn differences_walks_both_logs() {
        let a = [rec(0, 1), rec(1, 2), rec(3, 4)];
        let b = [rec(0, 1), rec(1, 9), rec(2, 3)];
        let d = differences(&a, &b, 0, 10, |x, y| x == y);
        let offsets: Vec<i64> = d.iter().map(|x| x.0).collect();
        assert_eq!(offsets, vec![1, 2, 3]);
        assert!(differences(&a, &b, 0, 1, |x, y| x == y).is_empty());
    }

    fn follower(node: &str, hw: i64, records: &[Record]) -> ReplicaState {
        serde_json::from_value(
            json!({"cluster": "a", "node": node, "topic": "t", "partition": 0,
            "role": "follower", "log_start_offset": 0, "high_watermark": hw,
            "log_end_offset": hw, "epochs": [[0, 0]],
            "records": records.iter().map(|r| [r.offset, r.value, 0]).collect::<Vec<_>>()}),
        )
        .unwrap()
    }

    #[test]
    fn without_a_leader_the_final_log_is_the_one_the_others_agree_with() {
        let lagging = follower("a1", 2, &[rec(0, 1), rec(1, 7)]);
        let caught_up = |n: &str| follower(n, 2, &[rec(0, 1), rec(1, 2)]);
        let replicas = [lagging, caught_up("a2"), caught_up("a3")];
        let (finals, _) = FinalLogs::build(&replicas);
        assert_eq!(replicas[finals.logs[0].leader].node, "a2");
        // A higher high watermark still wins: agreement only parts equals.
        let ahead = follower("a1", 3, &[rec(0, 1), rec(1, 7), rec(2, 3)]);
        let replicas = [ahead, caught_up("a2"), caught_up("a3")];
        let (finals, _) = FinalLogs::build(&replicas);
        assert_eq!(replicas[finals.logs[0].leader].node, "a1");
        // All agreeing, the first of equals, as before.
        let replicas = [caught_up("a1"), caught_up("a2")];
        let (finals, _) = FinalLogs::build(&replicas);
        assert_eq!(replicas[finals.logs[0].leader].node, "a1");
    }
}
