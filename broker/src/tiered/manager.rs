//! The broker's remote log manager: the store it was configured with, each replica's tiered
//! offsets, the leader's periodic task (upload closed segments, learn the highest tiered offset,
//! apply local retention) and the consumer reads served from the remote store.

use std::path::Path;
use std::sync::Arc;

use tracing::{info, warn};

use super::metadata::{
    highest_offset, segment_in_lineage, DirMetadataStore, RemoteLogMetadataStore,
    RemoteSegmentMetadata, SegmentState,
};
#[cfg(feature = "s3")]
use super::s3::{S3Credentials, S3Storage};
use super::storage::{LocalDirStorage, RemoteStorage, TopicIdPartition};
use super::upload::{local_policy, local_segments_to_delete, upload_candidates, UploadJob};
use crate::config::{LogConfig, RemoteStoreConfig};
use crate::log::batch::split_batches;
use crate::log::epoch_cache::EpochEntry;
use crate::log::PartitionLog;

/// The remote store (bytes and metadata) shared by the brokers of a cluster.
#[derive(Clone, Debug)]
pub struct TieredStore {
    pub storage: Arc<dyn RemoteStorage>,
    pub metadata: Arc<dyn RemoteLogMetadataStore>,
}

impl TieredStore {
    /// The store the configuration names, data and metadata together.
    pub fn open(config: &RemoteStoreConfig) -> Result<Self, String> {
        match config {
            RemoteStoreConfig::Dir(dir) => Self::open_dir(dir),
            #[cfg(feature = "s3")]
            RemoteStoreConfig::S3(s3) => {
                let store = Arc::new(S3Storage::new(s3, S3Credentials::from_env()?)?);
                Ok(TieredStore {
                    storage: store.clone(),
                    metadata: store,
                })
            }
            #[cfg(not(feature = "s3"))]
            RemoteStoreConfig::S3(s3) => Err(format!(
                "remote.log.storage.s3.bucket={}: this broker was built without the S3 store \
                 (cargo feature `s3` of tidemark-broker)",
                s3.bucket
            )),
        }
    }

    /// The local-directory store at `remote.log.storage.dir`, data and metadata together.
    pub fn open_dir(dir: &Path) -> Result<Self, String> {
        let storage = LocalDirStorage::new(dir)
            .map_err(|e| format!("remote.log.storage.dir {}: {e}", dir.display()))?;
        Ok(TieredStore {
            storage: Arc::new(storage),
            metadata: Arc::new(DirMetadataStore::new(dir)),
        })
    }

    /// The partition's remote segments, or `None` (logged) while the metadata cannot be read.
    pub fn list(&self, partition: &TopicIdPartition) -> Option<Vec<RemoteSegmentMetadata>> {
        self.metadata
            .list(partition)
            .inspect_err(|e| warn!(%partition, "remote log metadata unavailable: {e}"))
            .ok()
    }

    /// Reads for a consumer from the remote segment of the leader's `lineage` holding `offset`:
    /// whole batches from the one containing `offset`, up to `max_offset` (the high watermark)
    /// and about `max_bytes` (at least one batch, as Kafka does). Empty when no finished segment
    /// of the lineage holds the offset.
    pub fn read(
        &self,
        partition: &TopicIdPartition,
        lineage: &Lineage,
        offset: i64,
        max_offset: i64,
        max_bytes: usize,
    ) -> Result<Vec<u8>, String> {
        let segments = self.metadata.list(partition).map_err(|e| e.to_string())?;
        let found = segment_in_lineage(&segments, &lineage.epochs, lineage.log_end, offset);
        let Some(segment) = found else {
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

/// What a leader judges remote segments by when it reads them for a consumer: its epoch cache
/// and log end, taken under the partition's lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Lineage {
    pub epochs: Vec<EpochEntry>,
    pub log_end: i64,
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

/// One round of the leader's task for one partition, in steps so that nothing waits for the
/// remote store under the partition's lock (a slow store would stall every request on the
/// partition, and the broker's heartbeats with them): the metadata is listed outside it
/// ([`TieredStore::list`]), [`plan_uploads`] runs under it, [`UploadJob::run`] outside, then
/// [`after_uploads`] under it again with the metadata listed anew.
pub fn plan_uploads(
    access: TieredAccess<'_>,
    partition: &TopicIdPartition,
    known: &[RemoteSegmentMetadata],
) -> Vec<UploadJob> {
    if !access.is_leader || !access.config.remote_storage_enable {
        return Vec::new();
    }
    let segments = access.log.segments();
    let leo = access.log.log_end_offset();
    let highest = highest_offset(known, access.log.epochs().entries(), leo);
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

/// After uploads, on a leader or a follower: learns the highest tiered offset and the log start
/// from the metadata, then deletes the local segments local retention allows. Returns the new
/// local log start when it moved.
pub fn after_uploads(
    access: TieredAccess<'_>,
    partition: &TopicIdPartition,
    known: &[RemoteSegmentMetadata],
    now_ms: i64,
) -> Option<i64> {
    if !access.config.remote_storage_enable {
        return None;
    }
    let leo = access.log.log_end_offset();
    let cache = access.log.epochs().entries().to_vec();
    access.state.highest_remote_offset = highest_offset(known, &cache, leo);
    let remote_start = known
        .iter()
        .filter(|s| {
            s.state == SegmentState::CopySegmentFinished
                && super::metadata::in_lineage(s, &cache, leo)
        })
        .map(|s| s.start_offset)
        .min();
    // Segments total retention deleted no longer count: the log starts after the last of them.
    let deleted_up_to = known
        .iter()
        .filter(|s| {
            matches!(
                s.state,
                SegmentState::DeleteSegmentStarted | SegmentState::DeleteSegmentFinished
            ) && super::metadata::in_lineage(s, &cache, leo)
        })
        .map(|s| s.end_offset + 1)
        .max();
    let local_start = access.log.log_start_offset();
    let start = match (remote_start, deleted_up_to) {
        (Some(r), Some(d)) => Some(r.max(d)),
        (r, d) => r.or(d),
    };
    if let Some(start) = start {
        access.state.log_start_offset = (start < local_start).then_some(start);
    }
    // Followers too (Kafka's since KIP-405): a segment goes once the leader of this replica's
    // lineage uploaded all of it and this replica's high watermark is past it.
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

/// Total retention of a tiered topic (Kafka's `RemoteLogManager` retention task): the oldest
/// finished remote segments of this leader's lineage that `retention.ms` (every record older)
/// or `retention.bytes` (the remote bytes plus the local ones not uploaded yet, above the limit
/// even without the segment) let go, oldest first, stopping at the first that neither does.
/// Only a leader plans; its metadata is listed outside the partition's lock.
pub fn plan_remote_retention(
    access: TieredAccess<'_>,
    known: &[RemoteSegmentMetadata],
    now_ms: i64,
) -> Vec<RemoteSegmentMetadata> {
    let config = access.config;
    if !access.is_leader
        || !config.remote_storage_enable
        || (config.retention_ms < 0 && config.retention_bytes < 0)
    {
        return Vec::new();
    }
    let leo = access.log.log_end_offset();
    let cache = access.log.epochs().entries().to_vec();
    let mut remote: Vec<&RemoteSegmentMetadata> = known
        .iter()
        .filter(|s| {
            s.state == SegmentState::CopySegmentFinished
                && super::metadata::in_lineage(s, &cache, leo)
        })
        .collect();
    remote.sort_by_key(|s| (s.start_offset, s.event_timestamp_ms));
    // Overlapping copies (another leader's of the same offsets) count once towards the size,
    // by their first one, and go together.
    let mut next = i64::MIN;
    let distinct: Vec<&RemoteSegmentMetadata> = remote
        .iter()
        .filter(|s| {
            let fresh = s.end_offset >= next;
            next = next.max(s.end_offset + 1);
            fresh
        })
        .copied()
        .collect();
    let highest = distinct.last().map(|s| s.end_offset);
    let local_only: u64 = access
        .log
        .segments()
        .iter()
        .filter(|s| highest.is_none_or(|h| s.base_offset > h))
        .map(|s| s.size)
        .sum();
    let mut breach = (config.retention_bytes >= 0).then(|| {
        distinct.iter().map(|s| s.size_bytes).sum::<u64>() as i64 + local_only as i64
            - config.retention_bytes
    });
    // The last offset retention lets go: the end of the last segment, oldest first, that either
    // limit deletes.
    let mut cut = None;
    for s in distinct {
        let by_time = config.retention_ms >= 0 && s.max_timestamp_ms < now_ms - config.retention_ms;
        let by_size = breach.is_some_and(|b| b - s.size_bytes as i64 >= 0);
        if !by_time && !by_size {
            break;
        }
        if let Some(b) = breach.as_mut() {
            *b -= s.size_bytes as i64;
        }
        cut = Some(s.end_offset);
    }
    // A deletion cut short by a failure is finished first.
    known
        .iter()
        .filter(|s| {
            s.state == SegmentState::DeleteSegmentStarted
                && super::metadata::in_lineage(s, &cache, leo)
        })
        .chain(
            remote
                .into_iter()
                .filter(|s| cut.is_some_and(|c| s.end_offset <= c)),
        )
        .cloned()
        .collect()
}

/// Deletes remote segments total retention let go, each DELETE_SEGMENT_STARTED in the metadata,
/// then its data, then DELETE_SEGMENT_FINISHED; stops at the first failure (the next round
/// retries, from the started state). Returns how many were deleted.
pub fn delete_remote_segments(
    store: &TieredStore,
    segments: &[RemoteSegmentMetadata],
    now_ms: i64,
) -> Result<usize, String> {
    for (done, segment) in segments.iter().enumerate() {
        let mut meta = segment.clone();
        meta.event_timestamp_ms = now_ms;
        let mut delete = || -> Result<(), String> {
            meta.state = SegmentState::DeleteSegmentStarted;
            store.metadata.put(&meta).map_err(|e| e.to_string())?;
            store
                .storage
                .delete_segment(&meta.segment)
                .map_err(|e| e.to_string())?;
            meta.state = SegmentState::DeleteSegmentFinished;
            store.metadata.put(&meta).map_err(|e| e.to_string())
        };
        if let Err(e) = delete() {
            return Err(format!(
                "deleting {} after {done} deleted: {e}",
                segment.segment
            ));
        }
    }
    Ok(segments.len())
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
        let lineage = Lineage {
            epochs: log.epochs().entries().to_vec(),
            log_end: log.log_end_offset(),
        };
        let offsets = |bytes: Vec<u8>| values(&bytes).iter().map(|v| v.0).collect::<Vec<_>>();
        assert_eq!(
            offsets(store.read(&tp, &lineage, 1, 5, 1 << 20).unwrap()),
            vec![1, 2, 3]
        );
        assert_eq!(
            offsets(store.read(&tp, &lineage, 1, 3, 1 << 20).unwrap()),
            vec![1, 2]
        );
        // At least one batch, however small the budget.
        assert_eq!(
            offsets(store.read(&tp, &lineage, 2, 5, 1).unwrap()),
            vec![2]
        );
        // Offset 4 is in the local active segment, not in the remote store.
        assert!(store.read(&tp, &lineage, 4, 5, 1 << 20).unwrap().is_empty());
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
