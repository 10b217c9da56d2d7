//! Idempotent producers' state (Kafka's `ProducerStateManager`) agrees across a partition's
//! replicas. Every replica derives it from the same log: the batches it appended, or, for a
//! follower that started from the remote store, the producer snapshot uploaded with the segment
//! it started after. A replica that lacks a producer its leader knows cannot recognise that
//! producer's retry once it leads and appends it again; one that holds another sequence refuses
//! the producer's next batch as out of order. Neither shows in the records until a retry or a
//! next batch comes, which an idle producer may send long after, so it is judged from the final
//! replica states (`dump-log`'s `producers`: the state each broker rebuilds when it opens the
//! log).
//!
//! `producer-state-divergence`: a replica that holds the same log end as its partition's final
//! leader, and the same records wherever both hold one, disagrees with it on a producer whose
//! last batch ends at or above both replicas' partition log starts (below that, retention or
//! total remote retention deleted the batches, and a replica built from the log start rightly
//! never saw the producer).
//!
//! Pure, like every analysis of this crate.

use std::collections::BTreeMap;

use serde_json::json;

use crate::op::{ProducerState, Record, ReplicaState};
use crate::queue::replicas::FinalLogs;
use crate::results::{Anomalies, AnomalyKind};

/// Compares every readable replica with its partition's final leader.
pub(crate) fn producer_state_divergence(
    replicas: &[ReplicaState],
    finals: &FinalLogs<'_>,
    out: &mut Anomalies,
) {
    for log in &finals.logs {
        let leader = &replicas[log.leader];
        let Some(theirs) = &leader.producers else {
            continue;
        };
        let leader_records: BTreeMap<i64, &Record> =
            leader.records.iter().map(|x| (x.offset, x)).collect();
        let peers = replicas.iter().filter(|r| {
            r.node != leader.node
                && r.cluster == leader.cluster
                && r.topic == leader.topic
                && r.partition == leader.partition
                && r.error.is_none()
        });
        for r in peers {
            let Some(mine) = &r.producers else {
                continue;
            };
            if r.log_end_offset != leader.log_end_offset || !same_records(r, &leader_records) {
                continue;
            }
            let bound = partition_start(r).max(partition_start(leader));
            let by_id = |states: &[ProducerState]| -> BTreeMap<i64, ProducerState> {
                states.iter().map(|p| (p.producer_id, *p)).collect()
            };
            let (mine, theirs) = (by_id(mine), by_id(theirs));
            let ids: std::collections::BTreeSet<i64> =
                mine.keys().chain(theirs.keys()).copied().collect();
            for id in ids {
                let (a, b) = (mine.get(&id), theirs.get(&id));
                let in_range = a.iter().chain(&b).any(|p| p.last_offset >= bound);
                if a == b || !in_range {
                    continue;
                }
                let why = match (a, b) {
                    (None, _) => "the leader knows the producer and this replica does not: it would append the producer's retry again once it leads",
                    (_, None) => "this replica knows a producer the leader does not",
                    _ => "they hold different epochs or sequences for the producer",
                };
                out.push(
                    AnomalyKind::ProducerStateDivergence,
                    json!({"cluster": r.cluster, "topic": r.topic, "partition": r.partition,
                           "producer_id": id, "node": r.node, "state": a,
                           "leader": leader.node, "leader_state": b,
                           "log_end_offset": r.log_end_offset, "why": why}),
                );
            }
        }
    }
}

/// The replica's partition log start: below the local one when older offsets are remote.
fn partition_start(r: &ReplicaState) -> i64 {
    r.tiered
        .as_ref()
        .and_then(|t| t.log_start_offset)
        .or(r.log_start_offset)
        .unwrap_or(0)
}

/// Whether a replica holds the leader's record at every offset both hold; a disagreement is
/// `divergence`'s to report.
fn same_records(a: &ReplicaState, leader: &BTreeMap<i64, &Record>) -> bool {
    a.records
        .iter()
        .all(|x| leader.get(&x.offset).is_none_or(|y| *y == x))
}
