//! The pure rules of cluster mirroring (KIP-1279): which partition mirror state
//! may follow which, where the Last Mirrored Leader Epoch (LMLE) truncation cuts a log, when that
//! truncation counts as done on the replicas, which epoch a mirrored batch or a failover needs,
//! and how LMLE records found in the internal topic answer a lookup. No I/O here, so every rule is
//! tested on literal inputs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use tidemark_mirrorwire::MirrorState;

/// KIP-1279's rules on a partition's mirror state (the state itself is a wire shape: describe
/// reports it).
pub trait MirrorRules: Sized {
    /// KIP-1279's valid transitions; staying in a state is always allowed.
    fn may_become(self, next: MirrorState) -> bool;
    /// Clients may produce only to a stopped partition (M2).
    fn is_read_only(&self) -> bool;
    /// Where a FAILED partition's retry goes.
    fn retry_from(failed_in: Option<MirrorState>) -> MirrorState;
    /// The state a move to this one ends in on its own (STOPPING in STOPPED, PAUSING in PAUSED).
    fn ends_in(self) -> MirrorState;
}

impl MirrorRules for MirrorState {
    /// KIP-1279's valid transitions; staying in a state is always allowed.
    fn may_become(self, next: MirrorState) -> bool {
        use MirrorState::*;
        if self == next {
            return true;
        }
        match next {
            Preparing => matches!(self, Stopped | Failed),
            EpochFencing => self == Mirroring,
            UleRecovery => self == Mirroring,
            Mirroring => matches!(
                self,
                Preparing | EpochFencing | UleRecovery | Paused | Failed
            ),
            Pausing => self == Mirroring,
            Paused => self == Pausing,
            Stopping => matches!(
                self,
                Preparing | EpochFencing | Mirroring | UleRecovery | Pausing | Paused | Failed
            ),
            Stopped => self == Stopping,
            Failed => true,
        }
    }

    /// Clients may produce only to a stopped partition (M2).
    fn is_read_only(&self) -> bool {
        *self != MirrorState::Stopped
    }

    /// Where a FAILED partition's retry goes (KIP-1279: back to the state it failed in):
    /// a partition that had finished its LMLE truncation resumes mirroring without another; one
    /// that failed waiting for its replicas after a source's unclean election starts over.
    fn retry_from(failed_in: Option<MirrorState>) -> MirrorState {
        use MirrorState::*;
        match failed_in {
            Some(Mirroring | EpochFencing | Pausing | Paused) => Mirroring,
            Some(Stopping) => Stopping,
            _ => Preparing,
        }
    }

    /// The state a move to this one ends in on its own: a partition there already needs
    /// nothing more, so an operator's request asked again leaves it as it is.
    fn ends_in(self) -> MirrorState {
        use MirrorState::*;
        match self {
            Stopping => Stopped,
            Pausing => Paused,
            other => other,
        }
    }
}

/// Where the LMLE truncation cuts a log whose epoch cache is `entries` (epoch, start offset,
/// increasing) and whose end is `log_end`: the end offset of epoch `lmle` by Kafka's
/// `endOffsetFor`, or 0 when that is undefined (`lmle` = -1, an empty cache, or an `lmle` above
/// every epoch but not the latest): nothing of this log is then known to the other cluster.
pub fn lmle_truncation_offset(entries: &[(i32, i64)], log_end: i64, lmle: i32) -> i64 {
    if lmle < 0 {
        return 0;
    }
    match entries.last() {
        None => return 0,
        Some((latest, _)) if *latest == lmle => return log_end,
        _ => {}
    }
    match entries.iter().find(|(e, _)| *e > lmle) {
        Some((_, start)) => (*start).min(log_end),
        None => 0,
    }
}

/// Where the LMLE truncation cuts once aligned with the source too: the lower of the LMLE cut
/// and where the source's answer for the LMLE (`source`: the largest epoch it holds at or below
/// it and that epoch's end, as OffsetsForLeaderEpoch gives them) parts from this log, as a
/// follower truncates by a leader's answer (KIP-279). KIP-1279 leaves that second cut to the
/// first mirror fetch after the LMLE truncation; made here, before phase 2 waits for the
/// replicas, no replica kept through the failback holds a record the source lacks, so a leader
/// elected before that first fetch (or a failover before it) cannot bring such records back as
/// mirrored. Without an answer (`None`, or an epoch or end of -1), the LMLE cut alone.
pub fn aligned_truncation_offset(
    entries: &[(i32, i64)],
    log_end: i64,
    lmle: i32,
    source: Option<(i32, i64)>,
) -> i64 {
    let cut = lmle_truncation_offset(entries, log_end, lmle);
    let Some((epoch, end)) = source.filter(|(e, o)| *e >= 0 && *o >= 0) else {
        return cut;
    };
    // This log's end of the largest epoch it holds at or below the source's.
    let at = entries.iter().rposition(|(e, _)| *e <= epoch);
    let ours = match at {
        None => 0,
        Some(i) => {
            let local_end = entries.get(i + 1).map_or(log_end, |(_, start)| *start);
            if entries[i].0 == epoch {
                local_end.min(end)
            } else {
                local_end
            }
        }
    };
    cut.min(ours).min(log_end)
}

/// What the leader of a preparing partition still waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TruncationWait {
    /// The ISR is smaller than min.insync.replicas: truncating now would leave too few in step.
    UnderMinIsr {
        isr: Vec<i32>,
        min_isr: usize,
    },
    /// `mirror.support.unclean.leader.election=true` and these replicas are not in the ISR.
    NotAllInIsr {
        missing: Vec<i32>,
    },
    /// These replicas have not yet shown (by a fetch at or below the leader's end since the
    /// truncation) that they hold nothing beyond the truncation point.
    NotTruncated {
        replicas: Vec<i32>,
    },
    Done,
}

/// Whether the LMLE truncation is complete on the replicas that must take part: every ISR
/// member (with the ISR at least `min_isr`), or every replica when `all_replicas` (the topic's
/// `mirror.support.unclean.leader.election`). `reported` holds, per follower, the offset of its
/// first fetch since the leader truncated; such a fetch passed the leader's divergence check, so
/// the follower's log holds no epoch the leader lacks.
pub fn truncation_wait(
    leader: i32,
    replicas: &[i32],
    isr: &[i32],
    min_isr: usize,
    all_replicas: bool,
    leader_end: i64,
    reported: &BTreeMap<i32, i64>,
) -> TruncationWait {
    let min_isr = min_isr.max(1).min(replicas.len().max(1));
    if isr.len() < min_isr {
        return TruncationWait::UnderMinIsr {
            isr: isr.to_vec(),
            min_isr,
        };
    }
    let relevant: Vec<i32> = if all_replicas {
        let missing: Vec<i32> = replicas
            .iter()
            .copied()
            .filter(|r| !isr.contains(r))
            .collect();
        if !missing.is_empty() {
            return TruncationWait::NotAllInIsr { missing };
        }
        replicas.to_vec()
    } else {
        isr.to_vec()
    };
    let pending: Vec<i32> = relevant
        .into_iter()
        .filter(|r| *r != leader)
        .filter(|r| reported.get(r).is_none_or(|o| *o > leader_end))
        .collect();
    if pending.is_empty() {
        TruncationWait::Done
    } else {
        TruncationWait::NotTruncated { replicas: pending }
    }
}

/// DLE ≥ SLE (M6): the leader epoch the destination needs before appending batches whose
/// highest epoch is `batch_epoch`, or `None` when `local_epoch` already covers it.
pub fn epoch_fencing_target(batch_epoch: i32, local_epoch: i32) -> Option<i32> {
    (batch_epoch > local_epoch).then_some(batch_epoch)
}

/// KIP-1279's proactive bump: when a mirrored batch's epoch comes within `threshold` of the
/// local leader epoch (without passing it), the epoch the local leader should move to
/// (`batch_epoch + increment`), so a later source epoch rarely stops mirroring in
/// EPOCH_FENCING. `None` when no bump is due or `threshold` is 0 (off).
pub fn proactive_bump_target(
    batch_epoch: i32,
    local_epoch: i32,
    threshold: i32,
    increment: i32,
) -> Option<i32> {
    (threshold > 0 && batch_epoch <= local_epoch && batch_epoch > local_epoch - threshold)
        .then_some(batch_epoch + increment)
}

/// The leader epoch a partition moves to: above its current one and at least `min_epoch`.
pub fn bumped_epoch(current: i32, min_epoch: i32) -> i32 {
    (current + 1).max(min_epoch)
}

/// Who holds an LMLE: the mirror, the cluster it mirrored from, and the partition.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LmleKey {
    pub mirror: String,
    pub source_cluster_id: String,
    pub topic_id: Uuid,
    pub partition: i32,
}

/// One record of the LMLE internal topic: `last_mirrored_epoch` is the latest epoch the
/// partition's log held when the mirror stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LmleRecord {
    pub key: LmleKey,
    pub last_mirrored_epoch: i32,
}

/// Answers "which epoch of `requester` (a cluster id) does this cluster recognise for the
/// partition": the latest record per key (records in log order), then the greatest over every
/// mirror whose source was `requester`; -1 when there is none (KIP-1279's LMLE lookup).
pub fn lookup_lmle<'a>(
    records: impl IntoIterator<Item = &'a LmleRecord>,
    requester: &str,
    topic_id: Uuid,
    partition: i32,
) -> i32 {
    let mut latest: BTreeMap<&LmleKey, i32> = BTreeMap::new();
    for r in records {
        latest.insert(&r.key, r.last_mirrored_epoch);
    }
    latest
        .into_iter()
        .filter(|(k, _)| {
            k.source_cluster_id == requester && k.topic_id == topic_id && k.partition == partition
        })
        .map(|(_, e)| e)
        .max()
        .unwrap_or(-1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use MirrorState::*;

    #[test]
    fn transitions_follow_the_table() {
        let allowed = [
            (Stopped, Preparing),
            (Failed, Preparing),
            (Mirroring, EpochFencing),
            (Mirroring, UleRecovery),
            (UleRecovery, Mirroring),
            (UleRecovery, Stopping),
            (Preparing, Mirroring),
            (EpochFencing, Mirroring),
            (Paused, Mirroring),
            (Failed, Mirroring),
            (Mirroring, Pausing),
            (Pausing, Paused),
            (Paused, Stopping),
            (Mirroring, Stopping),
            (Stopping, Stopped),
            (Stopped, Failed),
        ];
        for (a, b) in allowed {
            assert!(a.may_become(b), "{a:?} -> {b:?}");
        }
        let refused = [
            (Mirroring, Preparing),
            (Preparing, EpochFencing),
            (Stopped, Mirroring),
            (Paused, Pausing),
            (Mirroring, Paused),
            (Stopped, Stopping),
            (Mirroring, Stopped),
            (Pausing, Mirroring),
            (Preparing, UleRecovery),
            (Failed, UleRecovery),
        ];
        for (a, b) in refused {
            assert!(!a.may_become(b), "{a:?} -> {b:?}");
        }
        for s in MirrorState::ALL {
            assert!(Failed.may_become(MirrorState::retry_from(Some(s))));
            assert!(s.may_become(s));
            assert_eq!(s.is_read_only(), s != Stopped);
            assert!(s.may_become(s.ends_in()));
        }
        assert_eq!((Stopping.ends_in(), Pausing.ends_in()), (Stopped, Paused));
        assert_eq!(Mirroring.ends_in(), Mirroring);
    }

    #[test]
    fn retries_resume_where_they_failed() {
        assert_eq!(MirrorState::retry_from(Some(Mirroring)), Mirroring);
        assert_eq!(MirrorState::retry_from(Some(EpochFencing)), Mirroring);
        assert_eq!(MirrorState::retry_from(Some(Preparing)), Preparing);
        assert_eq!(MirrorState::retry_from(None), Preparing);
        assert_eq!(MirrorState::retry_from(Some(Stopping)), Stopping);
        assert_eq!(MirrorState::retry_from(Some(UleRecovery)), Preparing);
    }

    #[test]
    fn truncation_offset_by_end_offset_for() {
        // S-LMLE-2 on A: cache {0:0, 1:2}, log end 4, LMLE 1 → nothing cut (end of e1 is the LEO).
        assert_eq!(lmle_truncation_offset(&[(0, 0), (1, 2)], 4, 1), 4);
        // S-ULE-1 on a1: cache {1:0, 2:1}, log end 4, LMLE 1 → cut at 1.
        assert_eq!(lmle_truncation_offset(&[(1, 0), (2, 1)], 4, 1), 1);
        // First mirror: -1 → everything.
        assert_eq!(lmle_truncation_offset(&[(0, 0)], 3, -1), 0);
        assert_eq!(lmle_truncation_offset(&[], 3, 2), 0);
        // An LMLE above every epoch, not the latest: undefined → everything.
        assert_eq!(lmle_truncation_offset(&[(0, 0), (1, 2)], 4, 5), 0);
        // An LMLE between epochs: the start of the next epoch above it.
        assert_eq!(lmle_truncation_offset(&[(0, 0), (3, 2), (6, 5)], 9, 4), 5);
        // Below the earliest epoch: the earliest epoch's start.
        assert_eq!(lmle_truncation_offset(&[(2, 4), (3, 6)], 8, 1), 4);
    }

    #[test]
    fn the_lmle_truncation_aligned_with_the_source_cuts_what_the_source_lacks() {
        // S-LMLE-2 on A: cache {0:0, 1:2}, log end 4, LMLE 1; B's epoch 1 ends at 3 (its barrier
        // at 3 is epoch 2): cut at 3 at once, where the KIP's first fetch would.
        assert_eq!(
            aligned_truncation_offset(&[(0, 0), (1, 2)], 4, 1, Some((1, 3))),
            3
        );
        // S-LMLE-3 on B: cache {.., 3:3}, log end 5, LMLE 3; A's epoch 3 ends at 4.
        assert_eq!(
            aligned_truncation_offset(&[(0, 0), (3, 3)], 5, 3, Some((3, 4))),
            4
        );
        // The old source that wrote on after a failover under the mirrored epoch: epoch 0 to
        // offset 100 here, to 8 on the source, which wrote on under epoch 10.
        assert_eq!(
            aligned_truncation_offset(&[(0, 0)], 100, 0, Some((0, 8))),
            8
        );
        // The source holds more of the epoch: the LMLE cut stands.
        assert_eq!(
            aligned_truncation_offset(&[(0, 0), (1, 2)], 4, 1, Some((1, 9))),
            4
        );
        // The source's largest epoch at or below the LMLE is an older one: the end of ours.
        assert_eq!(
            aligned_truncation_offset(&[(0, 0), (2, 5)], 9, 2, Some((1, 7))),
            5
        );
        // No answer, or none the source can give: the LMLE cut alone.
        assert_eq!(aligned_truncation_offset(&[(0, 0)], 100, 0, None), 100);
        assert_eq!(
            aligned_truncation_offset(&[(0, 0)], 100, 0, Some((-1, -1))),
            100
        );
        // An LMLE of -1 cuts everything whatever the source says.
        assert_eq!(
            aligned_truncation_offset(&[(0, 0)], 100, -1, Some((0, 8))),
            0
        );
    }

    #[test]
    fn truncation_waits_for_isr_or_all_replicas() {
        let none = BTreeMap::new();
        assert_eq!(
            truncation_wait(1, &[1, 2], &[1], 2, false, 5, &none),
            TruncationWait::UnderMinIsr {
                isr: vec![1],
                min_isr: 2
            }
        );
        // Flag off: ISR {1} with min ISR 1 is enough although 2 never truncated (S-ULE-2).
        assert_eq!(
            truncation_wait(1, &[1, 2], &[1], 1, false, 5, &none),
            TruncationWait::Done
        );
        // Flag on: waits for 2 to join the ISR, then for its fetch at or below the leader end.
        assert_eq!(
            truncation_wait(1, &[1, 2], &[1], 1, true, 5, &none),
            TruncationWait::NotAllInIsr { missing: vec![2] }
        );
        let mut reported = BTreeMap::new();
        reported.insert(2, 7);
        assert_eq!(
            truncation_wait(1, &[1, 2], &[1, 2], 1, true, 5, &reported),
            TruncationWait::NotTruncated { replicas: vec![2] }
        );
        reported.insert(2, 5);
        assert_eq!(
            truncation_wait(1, &[1, 2], &[1, 2], 1, true, 5, &reported),
            TruncationWait::Done
        );
        // A single replica completes at once.
        assert_eq!(
            truncation_wait(1, &[1], &[1], 2, true, 0, &none),
            TruncationWait::Done
        );
    }

    #[test]
    fn epochs_for_fencing_and_failover() {
        assert_eq!(epoch_fencing_target(1, 0), Some(1));
        assert_eq!(epoch_fencing_target(1, 1), None);
        assert_eq!(epoch_fencing_target(0, 4), None);
        // Failover with LMLE 1 on a leader at epoch 1: the next local epoch is 2 (S-LMLE-2).
        assert_eq!(bumped_epoch(1, 1 + 1), 2);
        // A leader already far ahead only moves up by one.
        assert_eq!(bumped_epoch(7, 4), 8);
        assert_eq!(bumped_epoch(0, 5), 5);
    }

    #[test]
    fn proactive_bumps_only_close_to_the_local_epoch() {
        // The KIP's defaults: within 3 of the local epoch, move to the batch epoch + 10.
        assert_eq!(proactive_bump_target(0, 0, 3, 10), Some(10));
        assert_eq!(proactive_bump_target(8, 10, 3, 10), Some(18));
        assert_eq!(proactive_bump_target(7, 10, 3, 10), None);
        // Above the local epoch is EPOCH_FENCING's case, not this one.
        assert_eq!(proactive_bump_target(11, 10, 3, 10), None);
        // Threshold 0: off.
        assert_eq!(proactive_bump_target(10, 10, 0, 10), None);
    }

    #[test]
    fn lookup_takes_latest_per_key_and_max_over_mirrors() {
        let id = Uuid::from_u128(7);
        let rec = |mirror: &str, cluster: &str, partition, epoch| LmleRecord {
            key: LmleKey {
                mirror: mirror.into(),
                source_cluster_id: cluster.into(),
                topic_id: id,
                partition,
            },
            last_mirrored_epoch: epoch,
        };
        let log = vec![
            rec("a-to-b", "A", 0, 1),
            rec("a-to-b", "A", 0, 3),
            rec("other", "A", 0, 2),
            rec("c-to-b", "C", 0, 9),
            rec("a-to-b", "A", 1, 8),
        ];
        assert_eq!(lookup_lmle(&log, "A", id, 0), 3);
        assert_eq!(lookup_lmle(&log, "A", id, 1), 8);
        assert_eq!(lookup_lmle(&log, "B", id, 0), -1);
        assert_eq!(lookup_lmle(&log, "A", Uuid::from_u128(8), 0), -1);
        // A later, lower value for the same key replaces the earlier one.
        let log = vec![rec("a-to-b", "A", 0, 3), rec("a-to-b", "A", 0, 1)];
        assert_eq!(lookup_lmle(&log, "A", id, 0), 1);
    }
}
