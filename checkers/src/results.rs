//! The verdict: the `results.json` shape of `docs/history-format.md`, the names of the anomalies, and
//! the few-line human summary `tidemark check` prints. Output is bounded: counts are always
//! exact, but each anomaly type keeps at most [`MAX_ENTRIES`] entries and says how many it cut.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Entries kept per anomaly type in `results.json`; the rest are counted in `truncated`.
pub const MAX_ENTRIES: usize = 10_000;
/// Warnings kept; the rest are counted in the last one.
pub const MAX_WARNINGS: usize = 100;

/// Every anomaly the checkers report, named as in `docs/history-format.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AnomalyKind {
    /// An `ok` send whose value is absent from the final committed log.
    LostWrite,
    /// An `ok` send on a cluster that was then failed over from, at or above the offset the new
    /// writable cluster had mirrored, absent from the final committed log: abandoned by the
    /// failover, as mirroring is asynchronous.
    AbandonedWrite,
    /// Two replicas of one partition in one cluster disagree below both high watermarks.
    Divergence,
    /// Two clusters disagree at one offset of a mirrored partition below both committed logs.
    MirrorDivergence,
    /// After healing and the convergence period, a replica holds, at or above its own high
    /// watermark and below the final log's, records that differ from the final log's: it never
    /// truncated to its leader's lineage.
    DivergentTail,
    /// After healing and the convergence period, a replica's log ends short of its partition's
    /// final high watermark: it never caught up.
    LaggingReplica,
    /// After healing and the convergence period, a replica caught up with its leader was still
    /// outside the partition's ISR: it was never let back in.
    UnderReplicated,
    /// After healing and the convergence period, a partition had no leader.
    OfflinePartition,
    /// After healing and the convergence period, every replica of a partition was in the ISR and
    /// held all its leader held, and the leader's high watermark stayed below that log end.
    StuckHighWatermark,
    /// Two observations of one offset in one cluster disagree on its value.
    InconsistentOffsets,
    /// One value at more than one offset.
    Duplicate,
    /// A value no send ever invoked.
    UnexpectedValue,
    /// A value whose send completed `fail`, seen in a poll or the final log.
    AbortedRead,
    /// A poll jumped over a record that the committed log holds.
    PollSkip,
    /// A poll's offsets do not strictly increase.
    NonmonotonicPoll,
    /// Leader epochs decrease as offsets increase, or an epoch cache does not strictly increase.
    EpochRegression,
    /// One leader epoch holds records first written on two clusters.
    EpochOwnership,
    /// A record written on a cluster before it failed back, under a leader epoch above the LMLE
    /// its failback truncated to, is still in its log (M3).
    LmleTruncation,
    /// A record written on a cluster after a failover to it carries a leader epoch at or below
    /// the LMLE recorded at that failover (M5).
    UnbumpedEpoch,
    /// A poll served under one leader epoch returned a record of a higher epoch: the leader
    /// appended a batch from an epoch above its own (M6, DLE ≥ SLE).
    EpochAboveLeader,
    /// A send acknowledged by a cluster while it mirrored from another (M2: read-only).
    ReadOnlyWrite,
    /// Two polls served under one leader epoch, one after the other, saw the high watermark go
    /// down.
    HwRegression,
    /// A poll returned a record at or above the high watermark its own response reported (I4:
    /// a consumer never reads past what the ISR holds).
    ReadAboveHighWatermark,
    /// A poll served under the leader epoch an acknowledged record was written in, invoked
    /// after the acknowledgement, reported a high watermark at or below the record: the leader
    /// acknowledged what its ISR did not hold.
    AckAboveHighWatermark,
    /// An acks=all send acknowledged by a node that, from the send's invocation to its
    /// acknowledgement, could exchange nothing with enough other brokers to make up
    /// `min.insync.replicas` (cut off, or they were killed or paused, as the nemesis recorded).
    AckBelowMinIsr,
    /// A mirror's epoch cache holds an entry the cluster it mirrors has in none of its replicas:
    /// an epoch of its own leadership rather than of a mirrored batch (M11).
    MirrorEpochCache,
    /// A consumer group's acknowledged commit of a partition went below one acknowledged
    /// earlier in the same generation.
    CommitRegression,
    /// A consumer group committed past a record of the committed log that no poll of the group
    /// returned.
    CommitSkip,
    /// A consumer group's commit acknowledged in a generation older than one an op of the group
    /// had completed in before the commit was invoked: a fenced member's commit taken.
    ZombieCommit,
    /// A group member's first read of a partition in a generation began below the last commit
    /// of it acknowledged before the member joined: the coordinator lost an acknowledged commit.
    CommitLost,
    /// An offset between a tiered partition's log start and its leader's local log start that no
    /// finished remote segment holds (T1: every offset readable from remote plus local).
    TieredGap,
    /// Two finished remote segments, or one and the leader's local log, disagree at one offset.
    RemoteDivergence,
    /// A follower started from the remote store elsewhere than after the tiered segment its
    /// state came from, or with another log start or epoch cache than the leader's (T1).
    TieredBootstrap,
    /// A leader's ListOffsets -6 (earliest pending upload) answer breaks KIP-1023's rule (T3).
    EarliestPendingUpload,
    /// With KIP-1023's flag off, an empty follower started elsewhere than the old protocol
    /// starts it: after the remote segment holding the offset before its leader's local log
    /// start (T2).
    TieredFlagGating,
    /// A replica holding the same log as its partition's final leader disagrees with it on an
    /// idempotent producer's state.
    ProducerStateDivergence,
    /// After a last stand killed its leader, the next leader was none within the wait, or a
    /// replica other than the eligible leader replicas KIP-966 kept (Kafka's eligible leader replicas
    /// test).
    EligiblePassedOver,
}

impl AnomalyKind {
    /// Every kind, in the order of the spec's table.
    pub const ALL: [AnomalyKind; 37] = [
        AnomalyKind::LostWrite,
        AnomalyKind::AbandonedWrite,
        AnomalyKind::Divergence,
        AnomalyKind::MirrorDivergence,
        AnomalyKind::DivergentTail,
        AnomalyKind::LaggingReplica,
        AnomalyKind::UnderReplicated,
        AnomalyKind::OfflinePartition,
        AnomalyKind::StuckHighWatermark,
        AnomalyKind::InconsistentOffsets,
        AnomalyKind::Duplicate,
        AnomalyKind::UnexpectedValue,
        AnomalyKind::AbortedRead,
        AnomalyKind::PollSkip,
        AnomalyKind::NonmonotonicPoll,
        AnomalyKind::EpochRegression,
        AnomalyKind::EpochOwnership,
        AnomalyKind::LmleTruncation,
        AnomalyKind::UnbumpedEpoch,
        AnomalyKind::EpochAboveLeader,
        AnomalyKind::ReadOnlyWrite,
        AnomalyKind::HwRegression,
        AnomalyKind::ReadAboveHighWatermark,
        AnomalyKind::AckAboveHighWatermark,
        AnomalyKind::AckBelowMinIsr,
        AnomalyKind::MirrorEpochCache,
        AnomalyKind::CommitRegression,
        AnomalyKind::CommitSkip,
        AnomalyKind::ZombieCommit,
        AnomalyKind::CommitLost,
        AnomalyKind::TieredGap,
        AnomalyKind::RemoteDivergence,
        AnomalyKind::TieredBootstrap,
        AnomalyKind::EarliestPendingUpload,
        AnomalyKind::TieredFlagGating,
        AnomalyKind::ProducerStateDivergence,
        AnomalyKind::EligiblePassedOver,
    ];

    /// The kind named `name` in `results.json`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the responses an entry names prove it on their own, with no failure needed: what
    /// they say contradicts the protocol (records past the high watermark the same response
    /// reported, a high watermark below what its leader had acknowledged or shown in the same
    /// epoch, a record of an epoch above the one it was served under, offsets out of order, an
    /// acknowledgement while the nemesis kept every other replica from its node). It existed
    /// once the last of them completed. Every other kind is proven against what a
    /// failure did afterwards (a lost write's acknowledgement comes before its loss).
    pub fn shown_by_responses(self) -> bool {
        matches!(
            self,
            AnomalyKind::ReadAboveHighWatermark
                | AnomalyKind::AckAboveHighWatermark
                | AnomalyKind::AckBelowMinIsr
                | AnomalyKind::HwRegression
                | AnomalyKind::EpochAboveLeader
                | AnomalyKind::NonmonotonicPoll
        )
    }

    /// The name used in `results.json`.
    pub fn name(self) -> &'static str {
        match self {
            AnomalyKind::LostWrite => "lost-write",
            AnomalyKind::AbandonedWrite => "abandoned-write",
            AnomalyKind::Divergence => "divergence",
            AnomalyKind::MirrorDivergence => "mirror-divergence",
            AnomalyKind::DivergentTail => "divergent-tail",
            AnomalyKind::LaggingReplica => "lagging-replica",
            AnomalyKind::UnderReplicated => "under-replicated",
            AnomalyKind::OfflinePartition => "offline-partition",
            AnomalyKind::StuckHighWatermark => "stuck-high-watermark",
            AnomalyKind::InconsistentOffsets => "inconsistent-offsets",
            AnomalyKind::Duplicate => "duplicate",
            AnomalyKind::UnexpectedValue => "unexpected-value",
            AnomalyKind::AbortedRead => "aborted-read",
            AnomalyKind::PollSkip => "poll-skip",
            AnomalyKind::NonmonotonicPoll => "nonmonotonic-poll",
            AnomalyKind::EpochRegression => "epoch-regression",
            AnomalyKind::EpochOwnership => "epoch-ownership",
            AnomalyKind::LmleTruncation => "lmle-truncation",
            AnomalyKind::UnbumpedEpoch => "unbumped-epoch",
            AnomalyKind::EpochAboveLeader => "epoch-above-leader",
            AnomalyKind::ReadOnlyWrite => "read-only-write",
            AnomalyKind::HwRegression => "hw-regression",
            AnomalyKind::ReadAboveHighWatermark => "read-above-high-watermark",
            AnomalyKind::AckAboveHighWatermark => "ack-above-high-watermark",
            AnomalyKind::AckBelowMinIsr => "ack-below-min-isr",
            AnomalyKind::MirrorEpochCache => "mirror-epoch-cache",
            AnomalyKind::CommitRegression => "commit-regression",
            AnomalyKind::CommitSkip => "commit-skip",
            AnomalyKind::ZombieCommit => "zombie-commit",
            AnomalyKind::CommitLost => "commit-lost",
            AnomalyKind::TieredGap => "tiered-gap",
            AnomalyKind::RemoteDivergence => "remote-divergence",
            AnomalyKind::TieredBootstrap => "tiered-bootstrap",
            AnomalyKind::EarliestPendingUpload => "earliest-pending-upload",
            AnomalyKind::TieredFlagGating => "tiered-flag-gating",
            AnomalyKind::ProducerStateDivergence => "producer-state-divergence",
            AnomalyKind::EligiblePassedOver => "eligible-passed-over",
        }
    }
}

/// `true`, `false` or `"unknown"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Nothing the test forbids was found.
    Valid,
    /// Something the test forbids was found.
    Invalid,
    /// The evidence cannot support a verdict: nothing forbidden was found, but there was no
    /// evidence at all, or `lost-write` or `divergence` could not be judged (no final replica
    /// states for some partition, e.g. a run killed before its final reads).
    Unknown,
}

impl Validity {
    /// The exit code of `tidemark check`: 0 valid, 1 invalid, 2 unknown.
    pub fn exit_code(self) -> u8 {
        match self {
            Validity::Valid => 0,
            Validity::Invalid => 1,
            Validity::Unknown => 2,
        }
    }
}

impl Serialize for Validity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Validity::Valid => s.serialize_bool(true),
            Validity::Invalid => s.serialize_bool(false),
            Validity::Unknown => s.serialize_str("unknown"),
        }
    }
}

impl<'de> Deserialize<'de> for Validity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Bool(true) => Ok(Validity::Valid),
            Value::Bool(false) => Ok(Validity::Invalid),
            Value::String(s) if s == "unknown" => Ok(Validity::Unknown),
            other => Err(serde::de::Error::custom(format!(
                "valid must be true, false or \"unknown\", not {other}"
            ))),
        }
    }
}

/// Completions of one `f`, by type. Invocations that never completed count as `info`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpStats {
    /// Completed `ok`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ok: u64,
    /// Completed `fail`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fail: u64,
    /// Completed `info`, or never completed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub info: u64,
    /// Polls that saw a lower high watermark than a poll completed before them under an earlier
    /// leader epoch: a new leader's lags until its followers report, so this is no anomaly.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hw_drops_across_epochs: u64,
    /// Polls that saw a lower high watermark than an earlier poll, with no leader epoch recorded
    /// to judge it by.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hw_drops_epoch_unknown: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A check that could not run, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedCheck {
    /// The anomaly it looks for.
    pub check: String,
    /// Why it could not run.
    pub reason: String,
}

/// The content of `results.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// The verdict.
    pub valid: Validity,
    /// Every anomaly type seen.
    pub anomaly_types: Vec<String>,
    /// Those the test's guarantees forbid; any makes the run invalid.
    pub bad_anomaly_types: Vec<String>,
    /// The entries of each type, each naming the ops or replicas that prove it.
    pub anomalies: BTreeMap<String, Vec<Value>>,
    /// How many of each type were found (the entries may be cut, see `truncated`).
    #[serde(default)]
    pub anomaly_counts: BTreeMap<String, u64>,
    /// Entries left out of `anomalies`, per type.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub truncated: BTreeMap<String, u64>,
    /// Client op counts by `f` and completion type.
    pub stats: BTreeMap<String, OpStats>,
    /// Checks that could not run.
    #[serde(default)]
    pub skipped_checks: Vec<SkippedCheck>,
    /// Anomaly types the test allows, with why.
    #[serde(default)]
    pub allowed: BTreeMap<String, String>,
    /// What was tolerated in the input or assumed by the analysis.
    #[serde(default)]
    pub warnings: Vec<String>,
}

impl Results {
    /// Adds a warning, keeping at most [`MAX_WARNINGS`].
    pub fn warn(&mut self, warning: impl Into<String>) {
        push_warning(&mut self.warnings, warning.into());
    }

    /// A few lines for a person: the verdict, op counts, each anomaly type with its count and
    /// its first `examples` entries, skipped checks and warnings.
    pub fn summary(&self, examples: usize) -> String {
        let mut out = String::new();
        let verdict = match self.valid {
            Validity::Valid => "VALID",
            Validity::Invalid => "INVALID",
            Validity::Unknown => "UNKNOWN",
        };
        let _ = writeln!(out, "verdict: {verdict}");
        if !self.stats.is_empty() {
            let ops: Vec<String> = self
                .stats
                .iter()
                .map(|(f, s)| {
                    let mut line = format!("{f} ok {} fail {} info {}", s.ok, s.fail, s.info);
                    if s.hw_drops_across_epochs > 0 {
                        let n = s.hw_drops_across_epochs;
                        let _ = write!(line, " ({n} high watermark drops across leader epochs)");
                    }
                    if s.hw_drops_epoch_unknown > 0 {
                        let n = s.hw_drops_epoch_unknown;
                        let _ = write!(line, " ({n} high watermark drops, leader epoch unknown)");
                    }
                    line
                })
                .collect();
            let _ = writeln!(out, "ops: {}", ops.join("; "));
        }
        if self.anomaly_types.is_empty() {
            let _ = writeln!(out, "anomalies: none");
        }
        for kind in &self.anomaly_types {
            let count = self
                .anomaly_counts
                .get(kind)
                .copied()
                .unwrap_or_else(|| self.anomalies.get(kind).map_or(0, |e| e.len() as u64));
            let judged = if self.bad_anomaly_types.contains(kind) {
                "forbidden".to_owned()
            } else {
                match self.allowed.get(kind) {
                    Some(why) => format!("allowed: {why}"),
                    None => "allowed".to_owned(),
                }
            };
            let _ = writeln!(out, "{kind}: {count} ({judged})");
            let entries = self.anomalies.get(kind).map_or(&[][..], |e| &e[..]);
            for e in entries.iter().take(examples) {
                let _ = writeln!(out, "  {e}");
            }
            if count > examples as u64 && !entries.is_empty() {
                let _ = writeln!(
                    out,
                    "  ... {} more in results.json",
                    count - entries.len().min(examples) as u64
                );
            }
        }
        for s in &self.skipped_checks {
            let _ = writeln!(out, "skipped {}: {}", s.check, s.reason);
        }
        for w in &self.warnings {
            let _ = writeln!(out, "warning: {w}");
        }
        out
    }
}

pub(crate) fn push_warning(warnings: &mut Vec<String>, warning: String) {
    match warnings.len() {
        n if n < MAX_WARNINGS => warnings.push(warning),
        n if n == MAX_WARNINGS => warnings.push("more warnings left out".to_owned()),
        _ => {}
    }
}

/// Collects anomaly entries with exact counts and at most [`MAX_ENTRIES`] entries per type.
#[derive(Debug, Default)]
pub(crate) struct Anomalies {
    entries: BTreeMap<AnomalyKind, Vec<Value>>,
    counts: BTreeMap<AnomalyKind, u64>,
    /// Per type, how many entries the policy allowed one by one, and the first reason.
    excused: BTreeMap<AnomalyKind, (u64, String)>,
}

impl Anomalies {
    pub(crate) fn push(&mut self, kind: AnomalyKind, entry: Value) {
        self.push_with(kind, || entry);
    }

    /// [`Self::push_judged`], building the entry only when it will be kept.
    pub(crate) fn push_judged_with(
        &mut self,
        kind: AnomalyKind,
        excuse: Option<String>,
        entry: impl FnOnce() -> Value,
    ) {
        if excuse.is_none() {
            return self.push_with(kind, entry);
        }
        let kept = self.entries.get(&kind).map_or(0, Vec::len) < MAX_ENTRIES;
        let entry = if kept { entry() } else { Value::Null };
        self.push_judged(kind, entry, excuse);
    }

    /// Counts one anomaly that the policy judged on its own: `excuse` is why it is allowed
    /// (written into the entry as `allowed`), `None` when it is not.
    pub(crate) fn push_judged(
        &mut self,
        kind: AnomalyKind,
        mut entry: Value,
        excuse: Option<String>,
    ) {
        if let Some(why) = excuse {
            let e = self.excused.entry(kind).or_insert_with(|| (0, why.clone()));
            e.0 += 1;
            if let Value::Object(m) = &mut entry {
                m.insert("allowed".into(), Value::String(why));
            }
        }
        self.push(kind, entry);
    }

    /// Counts one anomaly, building its entry only when it will be kept.
    pub(crate) fn push_with(&mut self, kind: AnomalyKind, entry: impl FnOnce() -> Value) {
        *self.counts.entry(kind).or_default() += 1;
        let entries = self.entries.entry(kind).or_default();
        if entries.len() < MAX_ENTRIES {
            entries.push(entry());
        }
    }

    /// Judges the collected anomalies against the allowed set and builds the results. A type
    /// whose every entry was excused one by one is allowed, with the first entry's reason.
    pub(crate) fn into_results(
        self,
        mut allowed: BTreeMap<String, String>,
        no_evidence: bool,
        stats: BTreeMap<String, OpStats>,
        skipped_checks: Vec<SkippedCheck>,
        warnings: Vec<String>,
    ) -> Results {
        let mut anomaly_types = Vec::new();
        let mut bad_anomaly_types = Vec::new();
        let mut anomalies = BTreeMap::new();
        let mut anomaly_counts = BTreeMap::new();
        let mut truncated = BTreeMap::new();
        for (kind, entries) in self.entries {
            let name = kind.name().to_owned();
            let count = self.counts[&kind];
            if count > entries.len() as u64 {
                truncated.insert(name.clone(), count - entries.len() as u64);
            }
            if let Some((n, why)) = self.excused.get(&kind).filter(|e| e.0 == count) {
                let why = format!("each of the {n} allowed on its own; the first: {why}");
                allowed.entry(name.clone()).or_insert(why);
            }
            if !allowed.contains_key(&name) {
                bad_anomaly_types.push(name.clone());
            }
            anomaly_types.push(name.clone());
            anomaly_counts.insert(name.clone(), count);
            anomalies.insert(name, entries);
        }
        // `true` promises that nothing acknowledged was lost and no replicas diverged.
        let unjudged = skipped_checks.iter().any(|s| {
            s.check == AnomalyKind::LostWrite.name() || s.check == AnomalyKind::Divergence.name()
        });
        let valid = if !bad_anomaly_types.is_empty() {
            Validity::Invalid
        } else if no_evidence || unjudged {
            Validity::Unknown
        } else {
            Validity::Valid
        };
        Results {
            valid,
            anomaly_types,
            bad_anomaly_types,
            anomalies,
            anomaly_counts,
            truncated,
            stats,
            skipped_checks,
            allowed,
            warnings,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn validity_serializes_as_the_spec_says() {
        assert_eq!(serde_json::to_value(Validity::Valid).unwrap(), json!(true));
        assert_eq!(
            serde_json::to_value(Validity::Invalid).unwrap(),
            json!(false)
        );
        assert_eq!(
            serde_json::to_value(Validity::Unknown).unwrap(),
            json!("unknown")
        );
        assert_eq!(
            serde_json::from_value::<Validity>(json!("unknown")).unwrap(),
            Validity::Unknown
        );
        assert!(serde_json::from_value::<Validity>(json!("maybe")).is_err());
    }

    #[test]
    fn entries_are_capped_but_counted() {
        let mut a = Anomalies::default();
        for i in 0..MAX_ENTRIES + 5 {
            a.push(AnomalyKind::Duplicate, json!({"value": i}));
        }
        let mut allowed = BTreeMap::new();
        allowed.insert("duplicate".to_owned(), "test".to_owned());
        let r = a.into_results(allowed, false, BTreeMap::new(), vec![], vec![]);
        assert_eq!(r.valid, Validity::Valid);
        assert_eq!(r.anomalies["duplicate"].len(), MAX_ENTRIES);
        assert_eq!(r.anomaly_counts["duplicate"], MAX_ENTRIES as u64 + 5);
        assert_eq!(r.truncated["duplicate"], 5);
        assert!(r.bad_anomaly_types.is_empty());
        let text = r.summary(5);
        assert!(text.contains("duplicate: 10005 (allowed: test)"), "{text}");
        assert!(text.contains("... 10000 more"), "{text}");
    }

    #[test]
    fn stats_omit_zero_counts() {
        let s = OpStats {
            ok: 3,
            info: 1,
            ..OpStats::default()
        };
        assert_eq!(
            serde_json::to_value(s).unwrap(),
            json!({"ok": 3, "info": 1})
        );
    }
}
