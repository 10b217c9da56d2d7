//! Remote log metadata (Kafka's `RemoteLogMetadataManager`): for every uploaded segment its
//! offsets, the leader epochs inside it and its state, plus the pure lookups built on them (the
//! segment serving an offset, the highest tiered offset of a leader's lineage, the earliest
//! offset pending upload).
//!
//! Where it lives: Kafka keeps these records in the internal topic `__remote_log_metadata`. This
//! broker keeps them in the remote store itself, one JSON object per segment under
//! `<remote root>/__remote_log_metadata/<topic>-<partition>-<topic id>/<uuid>.json`, replaced
//! atomically on every state change. The remote store is by definition shared by every broker of
//! the cluster and as durable as the data the records describe, and a broker that lost its disk
//! reads them without first replicating an internal topic (whose replica may be the one it lost).
//! The cost: when the remote store is unreachable, so is the metadata, which only matters for the
//! operations that would need the store anyway.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::storage::{RemoteSegmentId, TopicIdPartition};
use crate::log::epoch_cache::EpochEntry;

/// A segment's upload state, Kafka's `RemoteLogSegmentState`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SegmentState {
    CopySegmentStarted,
    CopySegmentFinished,
    DeleteSegmentStarted,
    DeleteSegmentFinished,
}

impl SegmentState {
    /// Kafka's allowed transitions: a copy finishes or is abandoned (deleted), a finished copy is
    /// deleted, a deletion finishes; repeating a state is allowed (a retried write).
    pub fn may_become(self, next: SegmentState) -> bool {
        use SegmentState::*;
        self == next
            || matches!(
                (self, next),
                (
                    CopySegmentStarted,
                    CopySegmentFinished | DeleteSegmentStarted
                ) | (CopySegmentFinished, DeleteSegmentStarted)
                    | (DeleteSegmentStarted, DeleteSegmentFinished)
            )
    }
}

/// One uploaded segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteSegmentMetadata {
    pub segment: RemoteSegmentId,
    pub start_offset: i64,
    /// The segment's last offset (inclusive, as Kafka counts it).
    pub end_offset: i64,
    pub max_timestamp_ms: i64,
    /// The leader that uploaded it.
    pub broker_id: i32,
    /// When this state was written, in wall-clock milliseconds.
    pub event_timestamp_ms: i64,
    pub size_bytes: u64,
    /// The leader epochs that start inside the segment (or the one in force at its start), each
    /// with its first offset in the segment.
    pub segment_leader_epochs: BTreeMap<i32, i64>,
    pub state: SegmentState,
}

impl RemoteSegmentMetadata {
    /// The epoch in force at `offset` of this segment, if the offset is inside it.
    pub fn epoch_at(&self, offset: i64) -> Option<i32> {
        if offset < self.start_offset || offset > self.end_offset {
            return None;
        }
        self.segment_leader_epochs
            .iter()
            .filter(|(_, start)| **start <= offset)
            .map(|(epoch, _)| *epoch)
            .next_back()
    }

    /// The epochs a segment holds, taken from the leader's epoch cache: the entry in force at
    /// `start_offset` (moved to start there) and every entry starting up to `end_offset`.
    pub fn epochs_from_cache(
        cache: &[EpochEntry],
        start_offset: i64,
        end_offset: i64,
    ) -> BTreeMap<i32, i64> {
        let mut out = BTreeMap::new();
        for e in cache {
            if e.start_offset <= start_offset {
                out.clear();
                out.insert(e.epoch, start_offset);
            } else if e.start_offset <= end_offset {
                out.insert(e.epoch, e.start_offset);
            }
        }
        out
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    #[error("remote log metadata at {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("remote log metadata {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{segment}: state {from:?} cannot become {to:?}")]
    InvalidTransition {
        segment: RemoteSegmentId,
        from: SegmentState,
        to: SegmentState,
    },
}

/// Durable remote log metadata, visible to every broker of the cluster.
///
/// Contract: `put` records a segment's metadata (a new segment, or a new state of a known one)
/// durably before it returns, refusing a state the current one may not become
/// ([`SegmentState::may_become`]); `list` returns the newest state of every segment of the
/// partition ever put, in any order, as every broker sees it once `put` returned. Safe to call
/// from several threads and brokers; only a partition's leader puts its segments.
pub trait RemoteLogMetadataStore: Send + Sync + fmt::Debug {
    fn put(&self, metadata: &RemoteSegmentMetadata) -> Result<(), MetadataError>;
    fn list(
        &self,
        partition: &TopicIdPartition,
    ) -> Result<Vec<RemoteSegmentMetadata>, MetadataError>;
    /// The topic ids under which the store holds metadata of partition `partition` of `topic`
    /// (a topic deleted and created again has two), for readers that know only the name.
    fn topic_ids(&self, topic: &str, partition: i32) -> Result<Vec<Uuid>, MetadataError>;
}

/// The topic id a metadata directory or key prefix named `name` holds for `topic`-`partition`
/// (`<topic>-<partition>-<topic id>`, [`TopicIdPartition::dir_name`]).
pub fn topic_id_of(name: &str, topic: &str, partition: i32) -> Option<Uuid> {
    name.strip_prefix(&format!("{topic}-{partition}-"))
        .and_then(|id| Uuid::parse_str(id).ok())
}

/// Directory under the remote store's root that holds the metadata.
pub const METADATA_DIR: &str = "__remote_log_metadata";

/// The metadata beside the data in a directory store (see the module doc for why).
#[derive(Clone, Debug)]
pub struct DirMetadataStore {
    /// The remote store's root, which must be reachable for an absent partition to mean none.
    remote_root: PathBuf,
    root: PathBuf,
}

impl DirMetadataStore {
    /// The metadata under `<remote root>/__remote_log_metadata`.
    pub fn new(remote_root: &Path) -> Self {
        DirMetadataStore {
            remote_root: remote_root.to_path_buf(),
            root: remote_root.join(METADATA_DIR),
        }
    }

    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> MetadataError + '_ {
        move |source| MetadataError::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    fn read(path: &Path) -> Result<RemoteSegmentMetadata, MetadataError> {
        let bytes = std::fs::read(path).map_err(Self::io(path))?;
        serde_json::from_slice(&bytes).map_err(|e| MetadataError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }
}

impl RemoteLogMetadataStore for DirMetadataStore {
    fn put(&self, metadata: &RemoteSegmentMetadata) -> Result<(), MetadataError> {
        let dir = self.root.join(metadata.segment.partition.dir_name());
        std::fs::create_dir_all(&dir).map_err(Self::io(&dir))?;
        let path = dir.join(format!("{}.json", metadata.segment.id));
        if path.exists() {
            let current = Self::read(&path)?;
            if !current.state.may_become(metadata.state) {
                return Err(MetadataError::InvalidTransition {
                    segment: metadata.segment.clone(),
                    from: current.state,
                    to: metadata.state,
                });
            }
        }
        let bytes = serde_json::to_vec(metadata).map_err(|e| MetadataError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        crate::durable::replace_file(&path, &bytes).map_err(Self::io(&path))
    }

    fn list(
        &self,
        partition: &TopicIdPartition,
    ) -> Result<Vec<RemoteSegmentMetadata>, MetadataError> {
        let dir = self.root.join(partition.dir_name());
        let entries = match std::fs::read_dir(&dir) {
            // No segments yet, unless the store itself cannot be reached (it is down, not empty).
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && super::storage::root_reachable(&self.remote_root) =>
            {
                return Ok(Vec::new())
            }
            other => other.map_err(Self::io(&dir))?,
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry.map_err(Self::io(&dir))?.path();
            if path.extension().is_some_and(|e| e == "json") {
                out.push(Self::read(&path)?);
            }
        }
        out.sort_by_key(|m| (m.start_offset, m.event_timestamp_ms));
        Ok(out)
    }

    fn topic_ids(&self, topic: &str, partition: i32) -> Result<Vec<Uuid>, MetadataError> {
        let entries = match std::fs::read_dir(&self.root) {
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    && super::storage::root_reachable(&self.remote_root) =>
            {
                return Ok(Vec::new())
            }
            other => other.map_err(Self::io(&self.root))?,
        };
        let mut ids = Vec::new();
        for entry in entries {
            let name = entry.map_err(Self::io(&self.root))?.file_name();
            ids.extend(topic_id_of(&name.to_string_lossy(), topic, partition));
        }
        ids.sort();
        Ok(ids)
    }
}

/// Whether a segment's epochs agree with a leader's epoch cache (Kafka's
/// `isRemoteSegmentWithinLeaderEpochs`): each of its epochs is in the cache, starts inside that
/// epoch's range there (where the leader's started, for every epoch but the segment's first) and
/// ends before the leader's next epoch begins. Segments of another lineage (written by a leader
/// whose log was later truncated away) are not this leader's data, even where their first
/// offsets agree: after an unclean election the old leader's last segment can hold, in the old
/// epoch, offsets the new leader wrote in its own.
///
/// Below the cache's first entry the cache says nothing: a cache truncated from its start (a
/// follower that took a leader's log start) keeps only the epoch covering the new start, moved
/// to it, so an earlier epoch that ended below that start, or the first epoch begun below it, is
/// the partition's. Rejecting it made a follower that had followed a leader's log start, once
/// leader, put its log start above every segment it could no longer place: acknowledged offsets
/// still in the remote store became out of range.
pub fn in_lineage(segment: &RemoteSegmentMetadata, cache: &[EpochEntry], log_end: i64) -> bool {
    let Some(first) = cache.first() else {
        return false;
    };
    let epochs: Vec<(i32, i64)> = segment
        .segment_leader_epochs
        .iter()
        .map(|(e, s)| (*e, *s))
        .collect();
    segment.end_offset < log_end
        && epochs.iter().enumerate().all(|(i, &(epoch, start))| {
            let last = epochs.get(i + 1).map_or(segment.end_offset, |n| n.1 - 1);
            let Some(at) = cache.iter().position(|e| e.epoch == epoch) else {
                return epoch < first.epoch && last < first.start_offset;
            };
            let (from, to) = (
                cache[at].start_offset,
                cache.get(at + 1).map_or(log_end, |n| n.start_offset),
            );
            let starts_right = match (at, i) {
                (0, 0) => true,
                (0, _) => start <= from,
                (_, 0) => from <= start,
                _ => start == from,
            };
            starts_right && start < to && last < to
        })
}

/// Kafka's `remoteLogSegmentMetadata(tp, epoch, offset)`: the finished segment holding `offset`
/// in which `offset` belongs to `epoch`.
pub fn segment_for(
    segments: &[RemoteSegmentMetadata],
    epoch: i32,
    offset: i64,
) -> Option<&RemoteSegmentMetadata> {
    segments
        .iter()
        .find(|s| s.state == SegmentState::CopySegmentFinished && s.epoch_at(offset) == Some(epoch))
}

/// The finished segment of this leader's lineage holding `offset` (a consumer's read below the
/// local log start), the earliest uploaded first when copies overlap. Another lineage's copy of
/// the offset holds another record, whichever was uploaded first.
pub fn segment_in_lineage<'a>(
    segments: &'a [RemoteSegmentMetadata],
    cache: &[EpochEntry],
    log_end: i64,
    offset: i64,
) -> Option<&'a RemoteSegmentMetadata> {
    segments
        .iter()
        .filter(|s| s.state == SegmentState::CopySegmentFinished)
        .filter(|s| s.start_offset <= offset && offset <= s.end_offset)
        .filter(|s| in_lineage(s, cache, log_end))
        .min_by_key(|s| s.event_timestamp_ms)
}

/// The highest offset uploaded in this leader's lineage (Kafka's `findHighestRemoteOffset`), if
/// any segment is.
pub fn highest_offset(
    segments: &[RemoteSegmentMetadata],
    cache: &[EpochEntry],
    log_end: i64,
) -> Option<i64> {
    segments
        .iter()
        .filter(|s| s.state == SegmentState::CopySegmentFinished && in_lineage(s, cache, log_end))
        .map(|s| s.end_offset)
        .max()
}

/// What a leader knows of its partition's offsets for ListOffsets -6.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TieredOffsets {
    pub remote_storage_enabled: bool,
    pub log_start_offset: i64,
    pub local_log_start_offset: i64,
    /// The highest uploaded offset, `None` while the leader knows of none.
    pub highest_remote_offset: Option<i64>,
}

/// The leader's answer to ListOffsets EARLIEST_PENDING_UPLOAD (-6), as `(offset, epoch)` with -1
/// for unknown (kips.md §2.2): -1/-1 without tiered storage; the log start when nothing was
/// uploaded and nothing deleted locally; -1/-1 when segments were deleted locally but the leader
/// does not know the uploaded ones yet; else the offset after the highest uploaded one (at least
/// the log start) with the epoch the cache gives it.
pub fn earliest_pending_upload(
    offsets: TieredOffsets,
    epoch_for: impl Fn(i64) -> Option<i32>,
) -> (i64, i32) {
    if !offsets.remote_storage_enabled {
        return (-1, -1);
    }
    let offset = match offsets.highest_remote_offset {
        None if offsets.local_log_start_offset == offsets.log_start_offset => {
            offsets.log_start_offset
        }
        None => return (-1, -1),
        Some(highest) => (highest + 1).max(offsets.log_start_offset),
    };
    (offset, epoch_for(offset).unwrap_or(-1))
}

/// The epoch in force at `offset` by an epoch cache, if the cache covers it.
pub fn epoch_at(cache: &[EpochEntry], offset: i64) -> Option<i32> {
    cache
        .iter()
        .take_while(|e| e.start_offset <= offset)
        .last()
        .map(|e| e.epoch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn tp() -> TopicIdPartition {
        TopicIdPartition {
            topic_id: Uuid::from_u128(1),
            topic: "t".into(),
            partition: 0,
        }
    }

    fn entry(epoch: i32, start_offset: i64) -> EpochEntry {
        EpochEntry {
            epoch,
            start_offset,
        }
    }

    fn seg(n: u128, start: i64, end: i64, epochs: &[(i32, i64)]) -> RemoteSegmentMetadata {
        RemoteSegmentMetadata {
            segment: RemoteSegmentId {
                partition: tp(),
                id: Uuid::from_u128(n),
            },
            start_offset: start,
            end_offset: end,
            max_timestamp_ms: 0,
            broker_id: 1,
            event_timestamp_ms: n as i64,
            size_bytes: 0,
            segment_leader_epochs: epochs.iter().copied().collect(),
            state: SegmentState::CopySegmentFinished,
        }
    }

    /// KIP-1023 Scenario 1's remote side: seg 0-2 {e0:0} and seg 3-5 {e1:3, e2:5}; the leader's
    /// cache (e0,0)(e1,3)(e2,5)(e3,7), log end 8.
    fn scenario_1() -> (Vec<RemoteSegmentMetadata>, Vec<EpochEntry>) {
        (
            vec![seg(1, 0, 2, &[(0, 0)]), seg(2, 3, 5, &[(1, 3), (2, 5)])],
            vec![entry(0, 0), entry(1, 3), entry(2, 5), entry(3, 7)],
        )
    }

    #[test]
    fn scenario_1_lookups_match_the_kip_tables() {
        let (segments, cache) = scenario_1();
        assert_eq!(highest_offset(&segments, &cache, 8), Some(5));
        let offsets = TieredOffsets {
            remote_storage_enabled: true,
            log_start_offset: 0,
            local_log_start_offset: 3,
            highest_remote_offset: Some(5),
        };
        assert_eq!(
            earliest_pending_upload(offsets, |o| epoch_at(&cache, o)),
            (6, 2)
        );
        // The follower's target EPUO - 1 = 5 in epoch 2 is in uuid-2.
        assert_eq!(
            segment_for(&segments, 2, 5).unwrap().segment.id,
            Uuid::from_u128(2)
        );
        assert!(segment_for(&segments, 1, 5).is_none());
        assert_eq!(
            segment_for(&segments, 1, 4).unwrap().segment.id,
            Uuid::from_u128(2)
        );
        assert_eq!(
            segment_in_lineage(&segments, &cache, 8, 1)
                .unwrap()
                .segment
                .id,
            Uuid::from_u128(1)
        );
        assert!(segment_in_lineage(&segments, &cache, 8, 6).is_none());
        assert_eq!(
            RemoteSegmentMetadata::epochs_from_cache(&cache, 3, 5),
            BTreeMap::from([(1, 3), (2, 5)])
        );
        assert_eq!(
            RemoteSegmentMetadata::epochs_from_cache(&cache, 4, 6),
            BTreeMap::from([(1, 4), (2, 5)])
        );
    }

    #[test]
    fn earliest_pending_upload_follows_every_case_of_the_leader_computation() {
        let cache = [entry(0, 0), entry(4, 100)];
        let at = |o| epoch_at(&cache, o);
        let base = TieredOffsets {
            remote_storage_enabled: true,
            log_start_offset: 10,
            local_log_start_offset: 10,
            highest_remote_offset: None,
        };
        let off = TieredOffsets {
            remote_storage_enabled: false,
            ..base
        };
        assert_eq!(earliest_pending_upload(off, at), (-1, -1));
        assert_eq!(earliest_pending_upload(base, at), (10, 0));
        let deleted_unknown = TieredOffsets {
            local_log_start_offset: 50,
            ..base
        };
        assert_eq!(earliest_pending_upload(deleted_unknown, at), (-1, -1));
        let uploaded = TieredOffsets {
            local_log_start_offset: 50,
            highest_remote_offset: Some(149),
            ..base
        };
        assert_eq!(earliest_pending_upload(uploaded, at), (150, 4));
        let below_start = TieredOffsets {
            log_start_offset: 200,
            local_log_start_offset: 200,
            highest_remote_offset: Some(149),
            ..base
        };
        assert_eq!(earliest_pending_upload(below_start, |_| None), (200, -1));
    }

    #[test]
    fn a_segment_of_a_truncated_lineage_is_not_the_leaders() {
        let (mut segments, _) = scenario_1();
        // Another leader uploaded 6-9 in epoch 3 starting at 6; this leader's epoch 3 starts at 7.
        segments.push(seg(3, 6, 9, &[(3, 6)]));
        let cache = [entry(0, 0), entry(1, 3), entry(2, 5), entry(3, 7)];
        assert_eq!(highest_offset(&segments, &cache, 12), Some(5));
        // A segment reaching past the log end is not in the lineage either.
        assert_eq!(highest_offset(&segments[..2], &cache, 5), Some(2));
    }

    #[test]
    fn a_segment_running_past_its_epochs_end_in_the_leaders_lineage_is_not_the_leaders() {
        // The old leader uploaded 123-135 in epoch 0; an unclean election made a replica whose
        // log ended at 133 the leader in epoch 3, which wrote its own 133-135.
        let old = seg(1, 123, 135, &[(0, 123)]);
        let below = seg(2, 111, 122, &[(0, 111)]);
        let cache = [entry(0, 0), entry(3, 133)];
        assert!(!in_lineage(&old, &cache, 150));
        assert!(in_lineage(&below, &cache, 150));
        let segments = [below.clone(), old.clone()];
        assert_eq!(highest_offset(&segments, &cache, 150), Some(122));
        // Its own upload of the same offsets is, and is what a consumer reads there.
        let own = seg(3, 123, 140, &[(0, 123), (3, 133)]);
        let segments = [below, old, own];
        assert_eq!(highest_offset(&segments, &cache, 150), Some(140));
        assert_eq!(
            segment_in_lineage(&segments, &cache, 150, 134)
                .unwrap()
                .segment
                .id,
            Uuid::from_u128(3)
        );
        // An epoch boundary inside a segment must be the leader's.
        let moved = seg(4, 123, 140, &[(0, 123), (3, 131)]);
        assert!(!in_lineage(&moved, &cache, 150));
        // The old leader's view: its epoch 0 runs on, so its own segment is in its lineage.
        assert!(in_lineage(&segments[1], &[entry(0, 0)], 150));
    }

    #[test]
    fn segments_below_a_cache_truncated_from_its_start_stay_in_the_lineage() {
        let (segments, _) = scenario_1();
        // The cache a follower keeps after taking a leader's log start of 4: epoch 1 from 4.
        let truncated = [entry(1, 4), entry(2, 5), entry(3, 7)];
        assert!(segments.iter().all(|s| in_lineage(s, &truncated, 8)));
        assert_eq!(highest_offset(&segments, &truncated, 8), Some(5));
        // An epoch later than the first one cannot be below it.
        let later = seg(7, 0, 1, &[(2, 0)]);
        assert!(!in_lineage(&later, &truncated, 8));
    }

    #[test]
    fn only_kafkas_state_transitions_are_allowed() {
        use SegmentState::*;
        let all = [
            CopySegmentStarted,
            CopySegmentFinished,
            DeleteSegmentStarted,
            DeleteSegmentFinished,
        ];
        let allowed: Vec<_> = all
            .iter()
            .flat_map(|a| all.iter().map(move |b| (*a, *b)))
            .filter(|(a, b)| a != b && a.may_become(*b))
            .collect();
        assert_eq!(
            allowed,
            vec![
                (CopySegmentStarted, CopySegmentFinished),
                (CopySegmentStarted, DeleteSegmentStarted),
                (CopySegmentFinished, DeleteSegmentStarted),
                (DeleteSegmentStarted, DeleteSegmentFinished),
            ]
        );
    }

    #[test]
    fn the_dir_store_keeps_the_newest_state_durably_for_every_broker() {
        let dir = tempfile::tempdir().unwrap();
        let store = DirMetadataStore::new(dir.path());
        let mut s = seg(9, 0, 2, &[(0, 0)]);
        s.state = SegmentState::CopySegmentStarted;
        store.put(&s).unwrap();
        s.state = SegmentState::CopySegmentFinished;
        store.put(&s).unwrap();
        let other_broker = DirMetadataStore::new(dir.path());
        assert_eq!(other_broker.list(&tp()).unwrap(), vec![s.clone()]);
        let mut back = s.clone();
        back.state = SegmentState::CopySegmentStarted;
        let err = store.put(&back).unwrap_err();
        assert!(
            matches!(err, MetadataError::InvalidTransition { .. }),
            "{err}"
        );
        let unknown = TopicIdPartition {
            partition: 3,
            ..tp()
        };
        assert!(store.list(&unknown).unwrap().is_empty());
        std::fs::write(
            dir.path()
                .join(METADATA_DIR)
                .join(tp().dir_name())
                .join("bad.json"),
            b"{",
        )
        .unwrap();
        let err = store.list(&tp()).unwrap_err();
        assert!(err.to_string().contains("bad.json"), "{err}");
    }
}
