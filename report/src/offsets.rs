//! The offset view of a partition with anomalies: for each offset in a window around the
//! anomalous ones, the value every acknowledged send, every poll and every final replica holds
//! there, so a divergence or a loss shows at a glance. Jepsen draws this for whole logs and its
//! cost grows with the offsets (maelstrom#51); here only the windows are drawn.

use std::collections::{BTreeMap, BTreeSet};

use tidemark_checkers::{Record, ReplicaState};

use crate::anomalies::PartKey;
use crate::digest::Digest;
use crate::limits::MAX_FOCUS;

/// One partition's view.
pub struct View {
    pub key: PartKey,
    /// The offsets anomalies name.
    pub focus: BTreeSet<i64>,
    /// Anomalous offsets without a window (past [`MAX_FOCUS`]).
    pub left_out: usize,
    pub replicas: Vec<Replica>,
    pub rows: Vec<Row>,
}

/// A replica's column.
pub struct Replica {
    pub node: String,
    pub role: Option<String>,
    pub log_start: Option<i64>,
    pub high_watermark: Option<i64>,
    pub log_end: Option<i64>,
    pub error: Option<String>,
}

/// One offset.
pub struct Row {
    pub offset: i64,
    /// A gap of offsets not shown lies before this one.
    pub gap_before: bool,
    /// `(value, op)` of acknowledged sends.
    pub sends: Vec<(i64, u64)>,
    /// `(value, epoch, how many polls, first poll op)`.
    pub polls: Vec<(i64, Option<i64>, u64, u64)>,
    /// One per replica column.
    pub cells: Vec<Cell>,
    /// More than one value is claimed here, or a replica lacks a committed record others have.
    pub contested: bool,
}

/// What a replica holds at an offset.
pub enum Cell {
    Record(Record),
    /// No record: why (below log start, not yet committed, absent).
    Missing(&'static str),
}

impl Row {
    /// The distinct values claimed here, in order of first appearance.
    pub fn values(&self) -> Vec<i64> {
        let mut out = Vec::new();
        let cells = self.cells.iter().filter_map(|c| match c {
            Cell::Record(r) => Some(r.value),
            Cell::Missing(_) => None,
        });
        let all = self
            .sends
            .iter()
            .map(|s| s.0)
            .chain(self.polls.iter().map(|p| p.0))
            .chain(cells);
        for v in all {
            if !out.contains(&v) {
                out.push(v);
            }
        }
        out
    }
}

/// Builds the views of the partitions anomalies name, over the offsets in `windows`.
pub fn build(
    focus: &BTreeMap<PartKey, BTreeSet<i64>>,
    windows: &BTreeMap<PartKey, Vec<(i64, i64)>>,
    digest: &Digest,
    replicas: Option<&[ReplicaState]>,
) -> Vec<View> {
    let mut out = Vec::new();
    for (key, offsets) in focus {
        let wins = windows.get(key).map_or(&[][..], |w| &w[..]);
        let mine: Vec<&ReplicaState> = replicas
            .unwrap_or_default()
            .iter()
            .filter(|r| r.cluster == key.0 && r.topic == key.1 && r.partition == key.2)
            .collect();
        let in_windows = |o: i64| wins.iter().any(|&(lo, hi)| lo <= o && o <= hi);
        let held: Vec<BTreeMap<i64, Record>> = mine
            .iter()
            .map(|r| {
                r.records
                    .iter()
                    .filter(|rec| in_windows(rec.offset))
                    .map(|rec| (rec.offset, *rec))
                    .collect()
            })
            .collect();
        let seen = digest.seen.get(key);
        let mut rows = Vec::new();
        for (w, &(lo, hi)) in wins.iter().enumerate() {
            for offset in lo..=hi {
                let s = seen.and_then(|s| s.get(&offset));
                let cells: Vec<Cell> = mine
                    .iter()
                    .zip(&held)
                    .map(|(r, h)| match h.get(&offset) {
                        Some(rec) => Cell::Record(*rec),
                        None => Cell::Missing(missing_why(r, offset)),
                    })
                    .collect();
                let mut row = Row {
                    offset,
                    gap_before: w > 0 && offset == lo,
                    sends: s.map(|s| s.sends.clone()).unwrap_or_default(),
                    polls: s
                        .map(|s| {
                            s.polls
                                .iter()
                                .map(|p| (p.value, p.epoch, p.count, p.first_op))
                                .collect()
                        })
                        .unwrap_or_default(),
                    cells,
                    contested: false,
                };
                let lacks_committed = row
                    .cells
                    .iter()
                    .any(|c| matches!(c, Cell::Missing(MISSING_COMMITTED | PAST_END)));
                let values = row.values();
                row.contested = values.len() > 1 || (!values.is_empty() && lacks_committed);
                rows.push(row);
            }
        }
        out.push(View {
            key: key.clone(),
            focus: offsets.iter().take(MAX_FOCUS).copied().collect(),
            left_out: offsets.len().saturating_sub(MAX_FOCUS),
            replicas: mine
                .iter()
                .map(|r| Replica {
                    node: r.node.clone(),
                    role: r.role.clone(),
                    log_start: r.log_start_offset,
                    high_watermark: r.high_watermark,
                    log_end: r.log_end_offset,
                    error: r.error.clone(),
                })
                .collect(),
            rows,
        });
    }
    out
}

/// With several clusters, a partition under scrutiny in one is shown in every cluster that
/// holds it, over the same offsets, so the clusters' views line up side by side.
pub fn side_by_side(
    focus: &mut BTreeMap<PartKey, BTreeSet<i64>>,
    replicas: Option<&[ReplicaState]>,
) {
    let held: BTreeSet<PartKey> = replicas
        .unwrap_or_default()
        .iter()
        .map(|r| (r.cluster.clone(), r.topic.clone(), r.partition))
        .collect();
    let clusters: BTreeSet<&str> = held.iter().map(|k| k.0.as_str()).collect();
    if clusters.len() < 2 {
        return;
    }
    let mut by_part: BTreeMap<(String, i64), BTreeSet<i64>> = BTreeMap::new();
    for ((_, t, p), offsets) in focus.iter() {
        by_part.entry((t.clone(), *p)).or_default().extend(offsets);
    }
    for ((t, p), offsets) in by_part {
        for key in held.iter().filter(|k| k.1 == t && k.2 == p) {
            focus.entry(key.clone()).or_default().extend(&offsets);
        }
    }
    // An entry that named no cluster is now shown in each cluster that holds the partition.
    focus.retain(|(c, t, p), _| !c.is_empty() || !held.iter().any(|k| k.1 == *t && k.2 == *p));
}

const MISSING_COMMITTED: &str = "no record below its high watermark";
const PAST_END: &str = "past log end";

fn missing_why(r: &ReplicaState, offset: i64) -> &'static str {
    if r.error.is_some() {
        "unreadable"
    } else if r.log_start_offset.is_some_and(|s| offset < s) {
        "below log start"
    } else if r.log_end_offset.is_some_and(|e| offset >= e) {
        PAST_END
    } else if r.high_watermark.is_some_and(|hw| offset < hw) {
        MISSING_COMMITTED
    } else {
        "absent"
    }
}
