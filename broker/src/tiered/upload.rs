//! The leader's side of tiered storage (Kafka's `RemoteLogManager` copy and local-retention
//! tasks): which closed segments to upload, the upload itself with the indexes a follower needs
//! to start after the segment, and which uploaded segments local retention may delete. The
//! choices are pure functions of the segment list and offsets; [`UploadJob`] takes what it needs
//! from the log under the partition's lock and copies outside it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use uuid::Uuid;

use super::metadata::{MetadataError, RemoteLogMetadataStore, RemoteSegmentMetadata, SegmentState};
use super::storage::{
    RemoteSegmentId, RemoteStorage, RemoteStorageError, SegmentData, TopicIdPartition,
};
use crate::log::epoch_cache::{render_checkpoint, EpochEntry};
use crate::log::producer_state::encode_snapshot;
use crate::log::{LogError, PartitionLog, SegmentSummary};
use crate::retention::{segments_to_delete, RetentionPolicy};

/// The segments to upload next, oldest first (Kafka's copy rule): closed, not empty, wholly
/// below the last stable offset (so only committed data goes), and ending after the highest
/// offset already uploaded.
pub fn upload_candidates(
    segments: &[SegmentSummary],
    last_stable_offset: i64,
    highest_remote_offset: Option<i64>,
) -> Vec<SegmentSummary> {
    let Some((_, closed)) = segments.split_last() else {
        return Vec::new();
    };
    let copied = highest_remote_offset.unwrap_or(-1);
    closed
        .iter()
        .filter(|s| s.next_offset > s.base_offset)
        .take_while(|s| s.next_offset <= last_stable_offset)
        .filter(|s| s.next_offset - 1 > copied)
        .copied()
        .collect()
}

/// The local retention settings of a topic: `local.retention.*`, where -2 means the total
/// `retention.*`.
pub fn local_policy(
    retention_ms: i64,
    retention_bytes: i64,
    local_retention_ms: i64,
    local_retention_bytes: i64,
) -> RetentionPolicy {
    RetentionPolicy {
        retention_ms: if local_retention_ms == -2 {
            retention_ms
        } else {
            local_retention_ms
        },
        retention_bytes: if local_retention_bytes == -2 {
            retention_bytes
        } else {
            local_retention_bytes
        },
    }
}

/// How many of the oldest local segments local retention deletes: those the retention rule
/// allows ([`segments_to_delete`] under the local policy), but only while each is wholly uploaded.
pub fn local_segments_to_delete(
    segments: &[SegmentSummary],
    high_watermark: i64,
    highest_remote_offset: Option<i64>,
    policy: RetentionPolicy,
    now_ms: i64,
) -> usize {
    let uploaded = segments
        .iter()
        .take_while(|s| highest_remote_offset.is_some_and(|h| s.next_offset - 1 <= h))
        .count();
    segments_to_delete(segments, high_watermark, policy, now_ms).min(uploaded)
}

#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error(transparent)]
    Storage(#[from] RemoteStorageError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
}

/// One segment's upload, prepared from the log.
#[derive(Clone, Debug)]
pub struct UploadJob {
    pub partition: TopicIdPartition,
    pub segment: SegmentSummary,
    pub log_file: PathBuf,
    /// The epoch cache up to the segment's end, in checkpoint format (a follower starting after
    /// the segment adopts it).
    pub leader_epoch_index: Vec<u8>,
    /// The producer state as of the offset after the segment.
    pub producer_snapshot: Vec<u8>,
    pub segment_leader_epochs: BTreeMap<i32, i64>,
}

impl UploadJob {
    /// Takes from `log` what uploading `segment` needs; the caller holds the log's lock, the copy
    /// does not.
    pub fn prepare(
        log: &PartitionLog,
        partition: TopicIdPartition,
        segment: SegmentSummary,
    ) -> Result<Self, LogError> {
        let log_file = log.segment_file(segment.base_offset).ok_or_else(|| {
            LogError::Invalid(format!(
                "segment {} is no longer in the log",
                segment.base_offset
            ))
        })?;
        let epochs: Vec<EpochEntry> = log
            .epochs()
            .entries()
            .iter()
            .filter(|e| e.start_offset < segment.next_offset)
            .copied()
            .collect();
        let producers = log.producer_state_at(segment.next_offset)?;
        Ok(UploadJob {
            partition,
            segment,
            log_file,
            leader_epoch_index: render_checkpoint(&epochs).into_bytes(),
            producer_snapshot: encode_snapshot(segment.next_offset, &producers)?,
            segment_leader_epochs: RemoteSegmentMetadata::epochs_from_cache(
                &epochs,
                segment.base_offset,
                segment.next_offset - 1,
            ),
        })
    }

    /// Uploads the segment: COPY_SEGMENT_STARTED in the metadata, the bytes and indexes to the
    /// store, then COPY_SEGMENT_FINISHED. A failure leaves the segment started (never read) and
    /// the caller retries with a new job, hence a new id.
    pub fn run(
        &self,
        broker_id: i32,
        now_ms: i64,
        storage: &dyn RemoteStorage,
        metadata: &dyn RemoteLogMetadataStore,
    ) -> Result<RemoteSegmentMetadata, UploadError> {
        let mut meta = RemoteSegmentMetadata {
            segment: RemoteSegmentId {
                partition: self.partition.clone(),
                id: Uuid::new_v4(),
            },
            start_offset: self.segment.base_offset,
            end_offset: self.segment.next_offset - 1,
            max_timestamp_ms: self.segment.max_timestamp,
            broker_id,
            event_timestamp_ms: now_ms,
            size_bytes: self.segment.size,
            segment_leader_epochs: self.segment_leader_epochs.clone(),
            state: SegmentState::CopySegmentStarted,
        };
        metadata.put(&meta)?;
        storage.copy_segment(
            &meta.segment,
            SegmentData {
                log_file: &self.log_file,
                leader_epoch_index: &self.leader_epoch_index,
                producer_snapshot: &self.producer_snapshot,
            },
        )?;
        meta.state = SegmentState::CopySegmentFinished;
        metadata.put(&meta)?;
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::epoch_cache::parse_checkpoint;
    use crate::log::producer_state::decode_snapshot;
    use crate::log::testing::{batch, idempotent_batch, values};
    use crate::log::LogSettings;
    use crate::tiered::metadata::{highest_offset, segment_in_lineage, DirMetadataStore};
    use crate::tiered::storage::{IndexKind, LocalDirStorage};

    fn seg(base: i64, next: i64, size: u64, ts: i64) -> SegmentSummary {
        SegmentSummary {
            base_offset: base,
            next_offset: next,
            size,
            max_timestamp: ts,
        }
    }

    #[test]
    fn only_closed_committed_segments_after_the_copied_offset_are_uploaded() {
        let segments = [
            seg(0, 3, 10, 0),
            seg(3, 6, 10, 0),
            seg(6, 6, 0, -1),
            seg(6, 9, 10, 0),
            seg(9, 12, 10, 0),
        ];
        let bases = |v: Vec<SegmentSummary>| v.iter().map(|s| s.base_offset).collect::<Vec<_>>();
        assert_eq!(bases(upload_candidates(&segments, 12, None)), vec![0, 3, 6]);
        assert_eq!(bases(upload_candidates(&segments, 8, None)), vec![0, 3]);
        assert_eq!(bases(upload_candidates(&segments, 12, Some(5))), vec![6]);
        assert_eq!(
            bases(upload_candidates(&segments, 12, Some(8))),
            Vec::<i64>::new()
        );
        assert_eq!(
            bases(upload_candidates(&segments[4..], 12, None)),
            Vec::<i64>::new()
        );
    }

    #[test]
    fn local_retention_deletes_only_uploaded_segments_below_the_high_watermark() {
        let segments = [seg(0, 3, 10, 0), seg(3, 6, 10, 0), seg(6, 9, 10, 0)];
        let keep_nothing = local_policy(-1, -1, 0, -2);
        assert_eq!(keep_nothing.retention_ms, 0);
        assert_eq!(
            local_segments_to_delete(&segments, 9, None, keep_nothing, 100),
            0
        );
        assert_eq!(
            local_segments_to_delete(&segments, 9, Some(2), keep_nothing, 100),
            1
        );
        assert_eq!(
            local_segments_to_delete(&segments, 9, Some(8), keep_nothing, 100),
            2
        );
        assert_eq!(
            local_segments_to_delete(&segments, 4, Some(8), keep_nothing, 100),
            1
        );
        let by_total = local_policy(1000, -1, -2, -2);
        assert_eq!(
            local_segments_to_delete(&segments, 9, Some(8), by_total, 100),
            0
        );
        let by_bytes = local_policy(-1, -1, -2, 15);
        assert_eq!(
            local_segments_to_delete(&segments, 9, Some(8), by_bytes, 100),
            1
        );
    }

    #[test]
    fn an_uploaded_segment_carries_its_bytes_epochs_and_producer_state() {
        let dir = tempfile::tempdir().unwrap();
        let settings = LogSettings {
            segment_bytes: 1,
            flush_interval_messages: u64::MAX,
            max_batch_bytes: u64::MAX,
        };
        let (mut log, _) = PartitionLog::open(&dir.path().join("t-0"), settings).unwrap();
        // One batch per segment: epochs 0, 0, 1, 2 at offsets 0..4.
        for (i, epoch) in [0, 0, 1, 2].into_iter().enumerate() {
            log.assign_epoch_start(epoch).unwrap();
            let b = if i == 1 {
                idempotent_batch(&[b"p"], 42, 0, 0)
            } else {
                batch(&[format!("v{i}").as_bytes()])
            };
            log.append_as_leader(&b, epoch).unwrap();
        }
        let segments = log.segments();
        assert_eq!(segments.len(), 4);
        let tp = TopicIdPartition {
            topic_id: Uuid::from_u128(5),
            topic: "t".into(),
            partition: 0,
        };
        let remote = dir.path().join("remote");
        let storage = LocalDirStorage::new(&remote).unwrap();
        let metadata = DirMetadataStore::new(&remote);
        let mut uploaded = Vec::new();
        for s in upload_candidates(&segments, 4, None) {
            let job = UploadJob::prepare(&log, tp.clone(), s).unwrap();
            uploaded.push(job.run(1, 7, &storage, &metadata).unwrap());
        }
        assert_eq!(uploaded.len(), 3);
        let listed = metadata.list(&tp).unwrap();
        assert_eq!(listed, uploaded);
        let cache = log.epochs().entries().to_vec();
        assert_eq!(highest_offset(&listed, &cache, 4), Some(2));
        let third = segment_in_lineage(&listed, &cache, 4, 2).unwrap();
        assert_eq!(third.segment_leader_epochs, BTreeMap::from([(1, 2)]));
        let bytes = storage.fetch_segment(&third.segment, 0, None).unwrap();
        assert_eq!(values(&bytes), vec![(2, b"v2".to_vec(), 1)]);
        let index = storage
            .fetch_index(&third.segment, IndexKind::LeaderEpoch)
            .unwrap();
        assert_eq!(
            parse_checkpoint(std::str::from_utf8(&index).unwrap()).unwrap(),
            vec![
                EpochEntry {
                    epoch: 0,
                    start_offset: 0
                },
                EpochEntry {
                    epoch: 1,
                    start_offset: 2
                }
            ]
        );
        let snapshot = storage
            .fetch_index(&third.segment, IndexKind::ProducerSnapshot)
            .unwrap();
        let (offset, producers) = decode_snapshot(&snapshot).unwrap();
        assert_eq!(offset, 3);
        assert_eq!(producers.get(42).map(|p| p.batches.len()), Some(1));

        // Local retention then deletes the uploaded segments (their batches carry the wall clock,
        // so "now" is far after them) but keeps their epochs.
        let count = local_segments_to_delete(
            &segments,
            4,
            Some(2),
            local_policy(-1, -1, 0, -2),
            i64::MAX / 2,
        );
        assert_eq!(count, 3);
        assert_eq!(log.delete_uploaded_segments(count).unwrap(), 3);
        assert_eq!(log.epochs().entries(), &cache[..]);
    }
}
