//! The broker's remote log manager: the store it was configured with, each replica's tiered
//! offsets, the leader's periodic task (upload closed segments, learn the highest tiered offset,
//! apply local retention) and the consumer reads served from the remote store.

use std::path::Path;
use std::sync::Arc;

use tracing::{info, warn};

use super::metadata::{
    highest_offset, segment_containing, DirMetadataStore, RemoteLogMetadataStore, SegmentState,
};
use super::storage::{LocalDirStorage, RemoteStorage, TopicIdPartition};
use super::upload::{local_policy, local_segments_to_delete, upload_candidates, UploadJob};
use crate::config::LogConfig;
use crate::log::batch::split_batches;
use crate::log::PartitionLog;

/// The remote store (bytes and metadata) shared by the brokers of a cluster.
#[derive(Clone, Debug)]
pub struct TieredStore {
    pub storage: Arc<dyn RemoteStorage>,
    pub metadata: Arc<dyn RemoteLogMetadataStore>,
}

impl TieredStore {
    /// The local-directory store at `remote.log.storage.dir`, data and metadata together.
    pub fn open_dir(dir: &Path) -> Result<Self, String> {
        let storage = LocalDirStorage::new(dir)
            .map_err(|e| format!("remote.log.storage.dir {}: {e}", dir.display()))?;
        Ok(TieredStore {
            storage: Arc::new(storage),
            metadata: Arc::new(DirMetadataStore::new(dir)),
        })
    }

    /// Reads for a consumer from the remote segment holding `offset`: whole batches from the one
    /// containing `offset`, up to `max_offset` (the high watermark) and about `max_bytes` (at
    /// least one batch, as Kafka does). Empty when no finished segment holds the offset.
    pub fn read(
        &self,
        partition: &TopicIdPartition,
        offset: i64,
        max_offset: i64,
        max_bytes: usize,
    ) -> Result<Vec<u8>, String> {
        let segments = self.metadata.list(partition).map_err(|e| e.to_string())?;
        let Some(segment) = segment_containing(&segments, offset) else {
            return Ok(Vec::new());
        };
        let bytes = self
            .storage
            .fetch_segment(&segment.segment, 0, None)
            .map_err(|e| e.to_string())?;
        let batches = split_batches(&bytes).map_err(|e| format!("{}: {e}", segment.segment))?;
        let mut out = Vec::new();
        for (pos, h) in batches {
            if h.last_offset() < offset {
                continue;
            }
            if h.base_offset >= max_offset || (!out.is_empty() && out.len() + h.size > max_bytes) {
                break;
            }
            out.extend_from_slice(&bytes[pos..pos + h.size]);
        }
        Ok(out)
    }
}

/// One replica's tiered offsets beside its local log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TieredState {
    /// The partition's log start when it is below the local log start (the older offsets are in
    /// the remote store); `None`: the local log start is the log start.
    pub log_start_offset: Option<i64>,
    /// The highest offset uploaded in this leader's lineage, as its last task found it.
    pub highest_remote_offset: Option<i64>,
}

impl TieredState {
    /// The partition's log start, given the local one.
    pub fn log_start(&self, local_log_start: i64) -> i64 {
        self.log_start_offset
            .map_or(local_log_start, |s| s.min(local_log_start))
    }
}

/// What a fetch below the local log start gets (Kafka's `handleOffsetOutOfRangeError`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BelowLocalStart {
    OutOfRange,
    /// A follower: OFFSET_MOVED_TO_TIERED_STORAGE, it rebuilds its state from the remote store.
    MovedToTieredStorage,
    /// A consumer: served from the remote store.
    ReadRemote,
}

/// The rule for a fetch at `offset` below the local log start.
pub fn below_local_start(
    remote_storage_enable: bool,
    log_start: i64,
    offset: i64,
    follower: bool,
) -> BelowLocalStart {
    if !remote_storage_enable || offset < log_start {
        BelowLocalStart::OutOfRange
    } else if follower {
        BelowLocalStart::MovedToTieredStorage
    } else {
        BelowLocalStart::ReadRemote
    }
}

/// A replica's log, tiered offsets and what the task decides by, lent by the partition under its
/// lock.
pub struct TieredAccess<'a> {
    pub log: &'a mut PartitionLog,
    pub state: &'a mut TieredState,
    pub config: &'a LogConfig,
    pub high_watermark: i64,
    pub is_leader: bool,
}

/// One round of the leader's task for one partition, in three steps so that the copies run
/// without the partition's lock: [`plan_uploads`] under it, [`UploadJob::run`] outside, then
/// [`after_uploads`] under it again.
pub fn plan_uploads(
    access: TieredAccess<'_>,
    partition: &TopicIdPartition,
    store: &TieredStore,
) -> Vec<UploadJob> {
    if !access.is_leader || !access.config.remote_storage_enable {
        return Vec::new();
    }
    let segments = access.log.segments();
    let known = match store.metadata.list(partition) {
        Ok(known) => known,
        Err(e) => {
            warn!(%partition, "remote log metadata unavailable: {e}");
            return Vec::new();
        }
    };
    let leo = access.log.log_end_offset();
    let highest = highest_offset(&known, access.log.epochs().entries(), leo);
    access.state.highest_remote_offset = highest;
    // Upload only what this broker committed: the high watermark is the last stable offset here
    // (no transactions).
    upload_candidates(&segments, access.high_watermark, highest)
        .into_iter()
        .filter_map(
            |s| match UploadJob::prepare(access.log, partition.clone(), s) {
                Ok(job) => Some(job),
                Err(e) => {
                    warn!(%partition, base = s.base_offset, "cannot prepare upload: {e}");
                    None
                }
            },
        )
        .collect()
}

/// After uploads: learns the highest tiered offset and the log start from the metadata, then
/// deletes the local segments local retention allows. Returns the new local log start when it
/// moved.
pub fn after_uploads(
    access: TieredAccess<'_>,
    partition: &TopicIdPartition,
    store: &TieredStore,
    now_ms: i64,
) -> Option<i64> {
    if !access.config.remote_storage_enable {
        return None;
    }
    let known = match store.metadata.list(partition) {
        Ok(known) => known,
        Err(e) => {
            warn!(%partition, "remote log metadata unavailable: {e}");
            return None;
        }
    };
    let leo = access.log.log_end_offset();
    let cache = access.log.epochs().entries().to_vec();
    access.state.highest_remote_offset = highest_offset(&known, &cache, leo);
    let remote_start = known
        .iter()
        .filter(|s| {
            s.state == SegmentState::CopySegmentFinished
                && super::metadata::in_lineage(s, &cache, leo)
        })
        .map(|s| s.start_offset)
        .min();
    let local_start = access.log.log_start_offset();
    if let Some(start) = remote_start.filter(|s| *s < local_start) {
        access.state.log_start_offset = Some(start);
    }
    if !access.is_leader {
        return None;
    }
    let policy = local_policy(
        access.config.retention_ms,
        access.config.retention_bytes,
        access.config.local_retention_ms,
        access.config.local_retention_bytes,
    );
    let segments = access.log.segments();
    let count = local_segments_to_delete(
        &segments,
        access.high_watermark,
        access.state.highest_remote_offset,
        policy,
        now_ms,
    );
    if count == 0 {
        return None;
    }
    if access.state.log_start_offset.is_none() {
        access.state.log_start_offset = Some(local_start);
    }
    match access.log.delete_uploaded_segments(count) {
        Ok(start) => {
            info!(%partition, segments = count, local_log_start = start, "local retention deleted uploaded segments");
            Some(start)
        }
        Err(e) => {
            warn!(%partition, "local retention failed: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::testing::{batch, values};
    use crate::log::LogSettings;
    use crate::tiered::upload::{upload_candidates, UploadJob};

    #[test]
    fn a_remote_read_starts_at_the_batch_holding_the_offset_and_stops_at_the_high_watermark() {
        let dir = tempfile::tempdir().unwrap();
        let settings = LogSettings {
            segment_bytes: 10_000,
            flush_interval_messages: u64::MAX,
            max_batch_bytes: u64::MAX,
        };
        let (mut log, _) = PartitionLog::open(&dir.path().join("t-0"), settings).unwrap();
        log.assign_epoch_start(0).unwrap();
        for v in 0..4 {
            log.append_as_leader(&batch(&[format!("{v}").as_bytes()]), 0)
                .unwrap();
        }
        // Roll: a batch larger than what is left of the segment.
        log.set_settings(LogSettings {
            segment_bytes: 1,
            ..settings
        });
        log.append_as_leader(&batch(&[b"4"]), 0).unwrap();
        let tp = TopicIdPartition {
            topic_id: uuid::Uuid::from_u128(3),
            topic: "t".into(),
            partition: 0,
        };
        let store = TieredStore::open_dir(&dir.path().join("remote")).unwrap();
        let segments = log.segments();
        for s in upload_candidates(&segments, 5, None) {
            let job = UploadJob::prepare(&log, tp.clone(), s).unwrap();
            job.run(1, 0, &*store.storage, &*store.metadata).unwrap();
        }
        let offsets = |bytes: Vec<u8>| values(&bytes).iter().map(|v| v.0).collect::<Vec<_>>();
        assert_eq!(
            offsets(store.read(&tp, 1, 5, 1 << 20).unwrap()),
            vec![1, 2, 3]
        );
        assert_eq!(offsets(store.read(&tp, 1, 3, 1 << 20).unwrap()), vec![1, 2]);
        // At least one batch, however small the budget.
        assert_eq!(offsets(store.read(&tp, 2, 5, 1).unwrap()), vec![2]);
        // Offset 4 is in the local active segment, not in the remote store.
        assert!(store.read(&tp, 4, 5, 1 << 20).unwrap().is_empty());
    }

    #[test]
    fn below_the_local_start_followers_are_sent_to_tiered_storage_and_consumers_read_it() {
        use BelowLocalStart::*;
        assert_eq!(below_local_start(true, 0, 2, true), MovedToTieredStorage);
        assert_eq!(below_local_start(true, 0, 2, false), ReadRemote);
        assert_eq!(below_local_start(true, 3, 2, false), OutOfRange);
        assert_eq!(below_local_start(false, 0, 2, true), OutOfRange);
        assert_eq!(below_local_start(false, 0, 2, false), OutOfRange);
        let state = TieredState {
            log_start_offset: Some(0),
            highest_remote_offset: Some(5),
        };
        assert_eq!(state.log_start(3), 0);
        assert_eq!(TieredState::default().log_start(3), 3);
    }
}
