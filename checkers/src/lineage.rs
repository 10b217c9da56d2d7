//! A replica's lineage in the remote store (KIP-405): which finished remote segments are its
//! partition's data, and the records they hold below its local log. The final committed logs
//! (`queue::replicas`) and the tiered checks both read a tiered partition through it.

use std::collections::BTreeMap;

use crate::op::{EpochEntry, Record, RemoteSegment, ReplicaState};

/// Whether `segment` belongs to the lineage of a replica with epoch cache `cache` and log end
/// `log_end`: each of its epochs is in the cache, starts inside that epoch's range there (where
/// the cache's starts, for every epoch but the segment's first) and ends before the cache's next
/// epoch begins, and the segment ends before the log does. A segment of another lineage (uploaded
/// by a leader whose later records were truncated away) is not the partition's data, even where
/// its first offsets agree: after an unclean election the old leader's last segment holds, in
/// the old epoch, offsets the new leader wrote in its own.
///
/// Below the cache's first entry the cache says nothing (a cache truncated from its start keeps
/// only the epoch covering the new start, moved to it): an earlier epoch that ended below that
/// start, or the first epoch begun below it, counts.
pub fn in_lineage(segment: &RemoteSegment, cache: &[EpochEntry], log_end: Option<i64>) -> bool {
    if log_end.is_some_and(|end| segment.end_offset >= end) {
        return false;
    }
    let Some(first) = cache.first() else {
        return false;
    };
    let epochs = &segment.segment_leader_epochs;
    epochs.iter().enumerate().all(|(i, e)| {
        let last = epochs
            .get(i + 1)
            .map_or(segment.end_offset, |n| n.start_offset - 1);
        let Some(at) = cache.iter().position(|c| c.epoch == e.epoch) else {
            return e.epoch < first.epoch && last < first.start_offset;
        };
        let from = cache[at].start_offset;
        let to = cache
            .get(at + 1)
            .map_or(log_end.unwrap_or(i64::MAX), |c| c.start_offset);
        let starts_right = match (at, i) {
            (0, 0) => true,
            (0, _) => e.start_offset <= from,
            (_, 0) => from <= e.start_offset,
            _ => e.start_offset == from,
        };
        starts_right && e.start_offset < to && last < to
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
