//! A replica's lineage in the remote store (KIP-405): which finished remote segments are its
//! partition's data, and the records they hold below its local log. The final committed logs
//! (`queue::replicas`) and the tiered checks both read a tiered partition through it.

use std::collections::BTreeMap;

use crate::op::{EpochEntry, Record, RemoteSegment, ReplicaState};

/// Whether `segment` belongs to the lineage of a replica with epoch cache `cache` and log end
/// `log_end`: each of its epochs is in the cache and starts inside that epoch's range there, and
/// it ends before the log does. A segment of another lineage (uploaded by a leader whose later
/// records were truncated away) is not the partition's data.
///
/// Below the cache's first entry the cache says nothing (a cache truncated from its start keeps
/// only the epoch covering the new start): an epoch there no later than the first one counts.
pub fn in_lineage(segment: &RemoteSegment, cache: &[EpochEntry], log_end: Option<i64>) -> bool {
    if log_end.is_some_and(|end| segment.end_offset >= end) {
        return false;
    }
    let first = cache.first();
    segment.segment_leader_epochs.iter().all(|e| {
        if let Some(f) = first.filter(|f| e.start_offset < f.start_offset) {
            return e.epoch <= f.epoch;
        }
        let Some(i) = cache.iter().position(|c| c.epoch == e.epoch) else {
            return false;
        };
        let next = cache.get(i + 1).map_or(i64::MAX, |c| c.start_offset);
        cache[i].start_offset <= e.start_offset && e.start_offset < next
    })
}

/// The finished remote segments of `r`'s lineage.
pub(crate) fn lineage(r: &ReplicaState) -> impl Iterator<Item = &RemoteSegment> {
    r.tiered
        .iter()
        .flat_map(|t| t.remote_segments.iter())
        .filter(move |s| s.finished() && in_lineage(s, &r.epochs, r.log_end_offset))
}

/// The records of a replica below its local log start, from the finished remote segments of its
/// lineage, by offset (the first segment holding an offset wins), and the partition's log start
/// they begin at. `None` without a tiered side reaching below the local log.
pub fn remote_prefix(r: &ReplicaState) -> Option<(i64, Vec<Record>)> {
    let t = r.tiered.as_ref()?;
    let local = r.log_start_offset?;
    let start = t.log_start_offset.filter(|s| *s < local)?;
    let mut by_offset: BTreeMap<i64, Record> = BTreeMap::new();
    for s in lineage(r) {
        for rec in s
            .records
            .iter()
            .filter(|x| x.offset >= start && x.offset < local)
        {
            by_offset.entry(rec.offset).or_insert(*rec);
        }
    }
    Some((start, by_offset.into_values().collect()))
}
