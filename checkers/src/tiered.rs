//! Tiered storage (KIP-405) and the follower fetch from the last tiered offset (KIP-1023), judged
//! from what a run records (kips.md §5.3, T1 and T3):
//!
//! - the final replica states carry the remote store's segments with their records
//!   (`dump-log --remote-dir`), so the final committed log of a tiered partition reaches below
//!   its leader's local log start ([`remote_prefix`](crate::lineage::remote_prefix)): an acknowledged write that was uploaded
//!   and then lost is a `lost-write` like any other;
//! - a `wipe` fault records, per partition of the wiped node, the leader's tiered offsets just
//!   before (ListOffsets -6, -5, -2, -4, in that order), the same asked of the leader the node
//!   was to rejoin under just before it was started again (`leader_at_restart`, absent from older
//!   histories), and the node's replica once it was back in the ISR, with the leader then.
//!
//! Anomalies:
//! - `tiered-gap` (T1, every offset readable): an offset between the partition's log start and
//!   its final leader's local log start that no finished remote segment of the leader's lineage
//!   holds, or offsets that finished segments of the lineage hold below the partition's log
//!   start (uploaded, never deleted, and out of range to every reader).
//! - `remote-divergence`: two finished remote segments of the leader's lineage, or one of them
//!   and the leader's local log, hold different records at one offset.
//! - `tiered-bootstrap` (T1): a wiped follower that started from the remote store, with
//!   `follower.fetch.last.tiered.offset.enable` on, started its local log below the earliest
//!   pending upload the leader it rejoined under answered before it was started again (that
//!   leader's answer only grows while it leads in one epoch, so the segment covering it minus one
//!   ends at or after it; starting lower fetches again what the remote store holds, KAFKA-13369's
//!   review finding), or came back with another log start than the leader's, or with an epoch
//!   cache that differs from the final leader's below where its local log starts. Histories
//!   without `leader_at_restart` are held to the answer before the wipe, when another node than
//!   the wiped one gave it.
//! - `earliest-pending-upload` (T3): a leader's answer to ListOffsets -6 below its log start,
//!   more than one past its highest tiered offset, or other than its log start while it knew
//!   of nothing tiered.
//! - `tiered-flag-gating` (T2): with the flag off (as the wipe recorded the cluster describing
//!   it, else as the test's brokers were configured when no `tiered-config` turned it), a wiped follower must start as before
//!   KIP-1023: right after the remote segment holding the offset before its leader's local log
//!   start. Held to the leader it rejoined under, in one leader epoch from before its start to
//!   after it was read (`rejoined.leader_offsets`), whose local log start only grows meanwhile:
//!   it started below the local log start read before, or above the one read after without a
//!   remote segment that ends just before it and holds an offset between the two.
//!
//! Pure, like every analysis of this crate.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::lineage::{lineage, remote_prefix};
use crate::op::{EpochEntry, Record, RemoteBootstrap, ReplicaState};
use crate::queue::replicas::FinalLogs;
use crate::results::{Anomalies, AnomalyKind};

/// The broker key that turns KIP-1023 on.
pub const FETCH_LAST_TIERED_OFFSET_KEY: &str = "follower.fetch.last.tiered.offset.enable";

/// What a `wipe` info records (see the nemesis's `tiered` module).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WipeInfo {
    /// One entry per partition directory the wipe deleted.
    #[serde(default)]
    pub partitions: Vec<WipedPartition>,
    /// KIP-1023's flag as the wiped nodes described it once back, else as every node described
    /// it before the kill (absent from older histories, and when the nodes did not agree).
    #[serde(default)]
    pub fetch_last_tiered_offset: Option<bool>,
}

/// A partition of a wiped node.
#[derive(Debug, Clone, Deserialize)]
pub struct WipedPartition {
    /// The wiped node.
    pub node: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i64,
    /// The leader's tiered offsets just before the wipe.
    #[serde(default)]
    pub leader: Option<LeaderOffsets>,
    /// The tiered offsets of the leader the node was to rejoin under, asked while it was still
    /// down (absent from histories written before it was recorded).
    #[serde(default)]
    pub leader_at_restart: Option<LeaderOffsets>,
    /// The node's replica once it was back in the ISR (absent when it was not in time).
    #[serde(default)]
    pub rejoined: Option<Rejoined>,
}

/// A leader's answers to ListOffsets -6, -5, -2 and -4.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LeaderOffsets {
    /// The leader.
    #[serde(default)]
    pub node: Option<String>,
    /// Its leader epoch, as the metadata had it when it was asked.
    #[serde(default)]
    pub leader_epoch: Option<i32>,
    /// Why it did not answer; then the offsets are absent.
    #[serde(default)]
    pub error: Option<String>,
    /// -6: the earliest offset not yet uploaded (-1: not known).
    #[serde(default)]
    pub earliest_pending_upload: Option<i64>,
    /// -5: the highest offset in the remote store (-1: none).
    #[serde(default)]
    pub highest_tiered_offset: Option<i64>,
    /// -2: the partition's log start.
    #[serde(default)]
    pub log_start_offset: Option<i64>,
    /// -4: the leader's local log start.
    #[serde(default)]
    pub local_log_start_offset: Option<i64>,
}

/// A wiped node's replica once it was back in the ISR.
#[derive(Debug, Clone, Deserialize)]
pub struct Rejoined {
    /// The partition's log start as the replica knows it.
    #[serde(default)]
    pub log_start_offset: Option<i64>,
    /// Where its local log starts.
    #[serde(default)]
    pub local_log_start_offset: Option<i64>,
    /// Where its local log began when it last started from the remote store, as the broker
    /// recorded it (absent from older histories and brokers that do not record it).
    #[serde(default)]
    pub remote_bootstrap: Option<RemoteBootstrap>,
    /// Its epoch cache.
    #[serde(default)]
    pub epochs: Vec<EpochEntry>,
    /// The partition's leader once the replica was read.
    #[serde(default)]
    pub leader: Option<String>,
    /// That leader's epoch.
    #[serde(default)]
    pub leader_epoch: Option<i32>,
    /// That leader's tiered offsets, asked after the replica was read (absent from older
    /// histories).
    #[serde(default)]
    pub leader_offsets: Option<LeaderOffsets>,
}

/// The wipes of a history, in order, with their op indices, and whether the flag was turned.
#[derive(Debug, Default)]
pub struct TieredHistory {
    wipes: Vec<(u64, WipeInfo)>,
    flag_turned: bool,
}

impl TieredHistory {
    /// Takes in a `wipe` info; a value that does not parse is a warning.
    pub fn observe_wipe(&mut self, index: u64, value: &Value) -> Result<(), String> {
        let info = WipeInfo::deserialize(value)
            .map_err(|e| format!("op {index}: a wipe record that does not parse: {e}"))?;
        self.wipes.push((index, info));
        Ok(())
    }

    /// Takes in a `tiered-config` op: from then on the brokers' configuration does not say the
    /// flag, so a wipe that did not record it is not judged by it.
    pub fn observe_flag_turned(&mut self) {
        self.flag_turned = true;
    }
}

/// Whether the test's brokers fetch from the last tiered offset (the header's `broker_config`).
pub fn flag_on(test: &Value) -> bool {
    match test.pointer(&format!("/broker_config/{FETCH_LAST_TIERED_OFFSET_KEY}")) {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => s == "true",
        _ => false,
    }
}

/// Runs the tiered checks. `finals` are the final committed logs of `replicas`.
pub(crate) fn check(
    test: &Value,
    history: &TieredHistory,
    replicas: Option<&[ReplicaState]>,
    finals: &FinalLogs<'_>,
    anomalies: &mut Anomalies,
) {
    if let Some(replicas) = replicas {
        for log in &finals.logs {
            final_log(&replicas[log.leader], anomalies);
        }
    }
    for (index, wipe) in &history.wipes {
        // Which protocol the node started by; unknown when the flag was turned at run time and
        // the wipe could not tell (the nodes did not agree).
        let flag = match wipe.fetch_last_tiered_offset {
            Some(f) => Some(f),
            None if history.flag_turned => None,
            None => Some(flag_on(test)),
        };
        for p in &wipe.partitions {
            let before = p.leader.as_ref().filter(|l| l.error.is_none());
            let at_restart = p.leader_at_restart.as_ref().filter(|l| l.error.is_none());
            let after = p
                .rejoined
                .as_ref()
                .and_then(|r| r.leader_offsets.as_ref())
                .filter(|l| l.error.is_none());
            for l in before.iter().chain(&at_restart).chain(&after) {
                earliest_pending_upload(*index, p, l, anomalies);
            }
            let Some(leader) = before.or(at_restart) else {
                continue;
            };
            if let Some(r) = &p.rejoined {
                let final_leader = replicas.and_then(|rs| {
                    finals
                        .logs
                        .iter()
                        .map(|l| &rs[l.leader])
                        .find(|x| x.topic == p.topic && x.partition == p.partition)
                });
                bootstrap(
                    *index,
                    p,
                    leader,
                    r,
                    flag == Some(true),
                    final_leader,
                    anomalies,
                );
                if flag == Some(false) {
                    old_protocol_start(*index, p, r, final_leader, anomalies);
                }
            }
        }
    }
}

/// `tiered-gap` and `remote-divergence` on a final leader's replica.
fn final_log(r: &ReplicaState, anomalies: &mut Anomalies) {
    let place = || json!({"cluster": r.cluster, "topic": r.topic, "partition": r.partition, "node": r.node});
    let Some(local) = r.log_start_offset else {
        return;
    };
    // Uploaded and never deleted, yet below where the partition is said to start: unreadable.
    let claimed = r.tiered.as_ref().and_then(|t| t.log_start_offset);
    let below = lineage(r)
        .map(|s| s.start_offset)
        .min()
        .filter(|oldest| claimed.is_some_and(|c| *oldest < c.min(local)));
    if let (Some(oldest), Some(claimed)) = (below, claimed) {
        let mut entry = place();
        entry["missing"] = json!([oldest, claimed.min(local) - 1]);
        entry["log_start_offset"] = json!(claimed);
        entry["why"] = json!("finished remote segments hold these offsets, yet the partition's log start is above them: out of range to every reader");
        anomalies.push(AnomalyKind::TieredGap, entry);
    }
    if let Some((start, _)) = remote_prefix(r) {
        // Every offset of [start, local) in some finished segment of the lineage.
        let mut spans: Vec<(i64, i64)> =
            lineage(r).map(|s| (s.start_offset, s.end_offset)).collect();
        spans.sort_unstable();
        let mut next = start;
        let mut gaps = Vec::new();
        for (lo, hi) in spans {
            if lo > next && next < local {
                gaps.push([next, lo.min(local) - 1]);
            }
            next = next.max(hi + 1);
        }
        if next < local {
            gaps.push([next, local - 1]);
        }
        for [lo, hi] in gaps {
            let mut entry = place();
            entry["missing"] = json!([lo, hi]);
            entry["log_start_offset"] = json!(start);
            entry["local_log_start_offset"] = json!(local);
            anomalies.push(AnomalyKind::TieredGap, entry);
        }
    }
    let mut seen: BTreeMap<i64, (Record, String)> = r
        .records
        .iter()
        .map(|x| (x.offset, (*x, "local".to_string())))
        .collect();
    for s in lineage(r) {
        for rec in &s.records {
            match seen.get(&rec.offset) {
                Some((other, from)) if other.value != rec.value => {
                    let mut entry = place();
                    entry["offset"] = json!(rec.offset);
                    entry["records"] =
                        json!({ from.clone(): other, format!("segment {}", s.id): rec });
                    anomalies.push(AnomalyKind::RemoteDivergence, entry);
                }
                Some(_) => {}
                None => {
                    seen.insert(rec.offset, (*rec, format!("segment {}", s.id)));
                }
            }
        }
    }
}

/// T3 on one answer of a leader.
fn earliest_pending_upload(
    index: u64,
    p: &WipedPartition,
    l: &LeaderOffsets,
    anomalies: &mut Anomalies,
) {
    let (Some(epuo), Some(highest), Some(start)) = (
        l.earliest_pending_upload,
        l.highest_tiered_offset,
        l.log_start_offset,
    ) else {
        return;
    };
    // -1 is the answer of a leader that has not yet learnt its tiered offsets.
    if epuo == -1 {
        return;
    }
    let why = if epuo < start {
        Some(format!("below the log start {start}"))
    } else if highest >= 0 && epuo - 1 > highest {
        Some(format!(
            "more than one past the highest tiered offset {highest}, read after it"
        ))
    } else if highest < 0 && epuo != start {
        Some(format!(
            "not the log start {start}, with nothing tiered (the leader answers the log start then)"
        ))
    } else {
        None
    };
    if let Some(why) = why {
        anomalies.push(
            AnomalyKind::EarliestPendingUpload,
            json!({"op_index": index, "topic": p.topic, "partition": p.partition,
                   "leader": l.node, "earliest_pending_upload": epuo,
                   "highest_tiered_offset": highest, "log_start_offset": start, "why": why}),
        );
    }
}

/// T1 on one wiped replica once it was back in the ISR.
fn bootstrap(
    index: u64,
    p: &WipedPartition,
    l: &LeaderOffsets,
    r: &Rejoined,
    flag: bool,
    final_leader: Option<&ReplicaState>,
    anomalies: &mut Anomalies,
) {
    let Some((start, local)) = remote_start(r) else {
        return;
    };
    let mut whys = Vec::new();
    let owed = owed_upload(p, l, r);
    if let (true, Some((o, when))) = (flag, owed) {
        if let (Some(epuo), Some(leader_start)) = (o.earliest_pending_upload, o.log_start_offset) {
            if epuo > leader_start && local < epuo {
                whys.push(format!(
                    "its local log began at {local}, below the earliest pending upload {epuo} the leader answered {when}: it fetched again what the remote store holds"
                ));
            }
        }
    }
    let cited = owed.map_or(l, |(o, _)| o);
    let final_start = final_leader
        .and_then(|f| f.tiered.as_ref())
        .and_then(|t| t.log_start_offset);
    // The partition's log start, when it stayed where it was at the wipe.
    if let (Some(before), Some(after)) = (l.log_start_offset, final_start) {
        if before == after && start != before {
            whys.push(format!(
                "its log start is {start}, the partition's is {before}"
            ));
        }
    }
    if let Some(f) = final_leader {
        let below = |cache: &[EpochEntry]| -> Vec<EpochEntry> {
            cache
                .iter()
                .copied()
                .filter(|e| e.start_offset < local)
                .collect()
        };
        let (mine, theirs) = (below(&r.epochs), below(&f.epochs));
        // An epoch below the replica's local start that it could not have known when it
        // rejoined means a later leader rewrote that range (an unclean election, or the last
        // leader back without its log): what the rewrite lost is judged as lost writes, not as
        // the bootstrap's doing.
        let known = r
            .leader_epoch
            .map(i64::from)
            .or_else(|| r.epochs.iter().map(|e| e.epoch).max());
        let rewritten = known.is_some_and(|k| theirs.iter().any(|e| e.epoch > k));
        if mine != theirs && !rewritten {
            whys.push(format!(
                "its epoch cache below {local} is {} where the final leader {} has {}",
                json!(mine),
                f.node,
                json!(theirs)
            ));
        }
    }
    for why in whys {
        anomalies.push(
            AnomalyKind::TieredBootstrap,
            json!({"op_index": index, "node": p.node, "topic": p.topic,
                   "partition": p.partition, "local_log_start_offset": local,
                   "log_start_offset": start, "leader": cited.node,
                   "earliest_pending_upload": cited.earliest_pending_upload, "why": why}),
        );
    }
}

/// T2 on one wiped replica, the flag off: it started where the protocol before KIP-1023 starts
/// an empty follower, after the remote segment holding the offset before its leader's local
/// log start L. The follower asks L once its fetch is refused, so between the leader's answer
/// read before the node was started and the one read after the replica was, if that leader and
/// epoch held throughout; L only grows in one leader epoch (local retention deletes, a leader
/// never truncates). Where remote segments of other leaders overlap L it may start past L: the
/// final listing of the remote store says whether such a segment exists. A listing that no
/// longer reaches down to the first bound (total retention) judges nothing above it.
fn old_protocol_start(
    index: u64,
    p: &WipedPartition,
    r: &Rejoined,
    final_leader: Option<&ReplicaState>,
    anomalies: &mut Anomalies,
) {
    let Some((start, local)) = remote_start(r) else {
        return;
    };
    let same_leader = |l: &LeaderOffsets| answered_by_rejoined_leader(p, l, r);
    let Some(low) = p
        .leader_at_restart
        .as_ref()
        .filter(|l| same_leader(l))
        .and_then(|l| l.local_log_start_offset)
    else {
        return;
    };
    let mut why = None;
    if local < low {
        why = Some(format!(
            "its local log began at {local}, below the local log start {low} its leader had before the node was started again: the flag is off, so it starts after the remote segment holding {}",
            low - 1
        ));
    }
    let high = r
        .leader_offsets
        .as_ref()
        .filter(|l| same_leader(l))
        .and_then(|l| l.local_log_start_offset);
    let tiered = final_leader.and_then(|f| f.tiered.as_ref());
    if let (None, Some(high), Some(t)) = (&why, high, tiered) {
        let listed_from = t.remote_segments.iter().map(|s| s.start_offset).min();
        let listing_reaches = listed_from.is_some_and(|from| from < low);
        let used = |s: &&crate::op::RemoteSegment| {
            s.end_offset + 1 == local && s.start_offset < high && s.end_offset + 1 >= low
        };
        if local > high && listing_reaches && !t.remote_segments.iter().any(|s| used(&s)) {
            why = Some(format!(
                "its local log began at {local}, above the local log start {high} its leader had once the node was back, and no remote segment ending at {} holds an offset between {} and {}: the flag is off, yet it skipped ahead as KIP-1023 does",
                local - 1,
                low - 1,
                high - 1
            ));
        }
    }
    if let Some(why) = why {
        anomalies.push(
            AnomalyKind::TieredFlagGating,
            json!({"op_index": index, "node": p.node, "topic": p.topic,
                   "partition": p.partition, "local_log_start_offset": local,
                   "log_start_offset": start, "leader": r.leader,
                   "leader_local_log_start_offset": [low, high], "why": why}),
        );
    }
}

/// Whether `l` was answered, without error, by the leader the wiped node rejoined under, in the
/// epoch it rejoined in, and that leader is not the wiped node itself.
fn answered_by_rejoined_leader(p: &WipedPartition, l: &LeaderOffsets, r: &Rejoined) -> bool {
    l.error.is_none()
        && l.node.is_some()
        && l.node.as_deref() != Some(p.node.as_str())
        && l.node == r.leader
        && l.leader_epoch.is_some()
        && l.leader_epoch == r.leader_epoch
}

/// A rejoined replica's log start and where its local log began, when it started from the
/// remote store (its local log starts after the log start); otherwise it replicated everything
/// and there is nothing to judge. The broker's record of the start wins over the local log
/// start read later, which local retention on a follower may have moved on.
fn remote_start(r: &Rejoined) -> Option<(i64, i64)> {
    let began = r.remote_bootstrap.map(|b| b.local_log_start_offset);
    let (start, local) = (r.log_start_offset?, began.or(r.local_log_start_offset)?);
    (local > start).then_some((start, local))
}

/// The leader's answers a wiped node's start from the remote store is held to, and when they
/// were given. The follower starts at the earliest pending upload its leader answers once its
/// first fetch is refused (kips.md §2.3), and that answer only grows while the leader leads in
/// one epoch; so the same leader's answer in the same epoch, read before the node was started
/// again, is a lower bound of it, if that leader and epoch are still the partition's once the
/// node is back (no other leader came between). A wiped leader rejoins under a new one, whose
/// view of the remote store may lag what the node itself had uploaded (found in a run of the
/// correct broker): the answer from before the wipe binds only when another node gave it, and
/// is used only by histories that do not have the later one.
fn owed_upload<'a>(
    p: &'a WipedPartition,
    before: &'a LeaderOffsets,
    r: &Rejoined,
) -> Option<(&'a LeaderOffsets, &'static str)> {
    match &p.leader_at_restart {
        Some(at) => answered_by_rejoined_leader(p, at, r)
            .then_some((at, "before the node was started again")),
        None => {
            (before.node.as_deref() != Some(p.node.as_str())).then_some((before, "before the wipe"))
        }
    }
}
