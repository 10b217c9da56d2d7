//! The remote store of segment bytes (Kafka's `RemoteStorageManager`) and its local-directory
//! implementation (`remote.log.storage.dir`). It stores what it is given under the id it is given
//! and knows nothing of offsets or states: which copies are complete and current is the metadata
//! store's business ([`super::metadata`]), so a copy cut short leaves files nobody reads.

use std::fmt;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A topic partition as the remote store and its metadata know it: the topic id tells a topic
/// from a deleted and recreated one of the same name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TopicIdPartition {
    pub topic_id: Uuid,
    pub topic: String,
    pub partition: i32,
}

impl TopicIdPartition {
    /// The directory name under a store's root: `<topic>-<partition>-<topic id>`.
    pub fn dir_name(&self) -> String {
        format!("{}-{}-{}", self.topic, self.partition, self.topic_id)
    }
}

impl fmt::Display for TopicIdPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{} ({})", self.topic, self.partition, self.topic_id)
    }
}

/// One uploaded segment's id: its partition and a fresh uuid per upload attempt, so a retried
/// copy never overwrites bytes a reader may be using.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RemoteSegmentId {
    pub partition: TopicIdPartition,
    pub id: Uuid,
}

impl fmt::Display for RemoteSegmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} segment {}", self.partition, self.id)
    }
}

/// The indexes uploaded with a segment that a follower needs to start after it (KIP-405's
/// `IndexType` keeps only those this broker uses: it has no time index and no transactions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum IndexKind {
    /// The leader's epoch cache up to the segment's end, in `leader-epoch-checkpoint` text.
    LeaderEpoch,
    /// The producer state as of the offset after the segment, in the local snapshot format.
    ProducerSnapshot,
}

impl IndexKind {
    pub(super) fn extension(self) -> &'static str {
        match self {
            IndexKind::LeaderEpoch => "leader-epoch-checkpoint",
            IndexKind::ProducerSnapshot => "snapshot",
        }
    }
}

/// What one upload carries.
#[derive(Clone, Copy, Debug)]
pub struct SegmentData<'a> {
    /// The closed local segment file, copied as it is (its batches keep their offsets).
    pub log_file: &'a Path,
    pub leader_epoch_index: &'a [u8],
    pub producer_snapshot: &'a [u8],
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteStorageError {
    /// The store answered, and has no such object.
    #[error("{what} is not in the remote store")]
    NotFound { what: String },
    /// The store could not be reached or failed the operation; retrying later may succeed.
    #[error("remote store failed on {what}: {source}")]
    Unavailable {
        what: String,
        source: std::io::Error,
    },
}

impl RemoteStorageError {
    fn from_io(what: impl fmt::Display, source: std::io::Error) -> Self {
        if source.kind() == std::io::ErrorKind::NotFound {
            RemoteStorageError::NotFound {
                what: what.to_string(),
            }
        } else {
            RemoteStorageError::Unavailable {
                what: what.to_string(),
                source,
            }
        }
    }
}

/// The store of segment bytes shared by every broker of a cluster.
///
/// Contract:
/// - `copy_segment` returns `Ok` only once the segment file and both indexes are durably stored
///   under `segment`; after that every broker's `fetch_segment` and `fetch_index` return exactly
///   those bytes until `delete_segment`. On error, some of them may be stored: callers mark the
///   copy started in the metadata before and finished after, and readers trust only finished ones.
/// - A segment id is written once: callers make a new id for every attempt.
/// - `fetch_segment(segment, start, end)` returns the bytes in `[start, end)` of the segment file
///   (`end` = `None`: to its end; positions past the end are cut to it).
/// - `delete_segment` removes the segment and its indexes and succeeds when they are already gone.
/// - Every method blocks (callers in async code use `spawn_blocking`) and is safe to call from
///   several threads and brokers at once.
/// - Errors tell a missing object (`NotFound`) from a store that failed (`Unavailable`).
pub trait RemoteStorage: Send + Sync + fmt::Debug {
    fn copy_segment(
        &self,
        segment: &RemoteSegmentId,
        data: SegmentData<'_>,
    ) -> Result<(), RemoteStorageError>;

    fn fetch_segment(
        &self,
        segment: &RemoteSegmentId,
        start: u64,
        end: Option<u64>,
    ) -> Result<Vec<u8>, RemoteStorageError>;

    fn fetch_index(
        &self,
        segment: &RemoteSegmentId,
        kind: IndexKind,
    ) -> Result<Vec<u8>, RemoteStorageError>;

    fn delete_segment(&self, segment: &RemoteSegmentId) -> Result<(), RemoteStorageError>;
}

/// A remote store in a local directory (`remote.log.storage.dir`), shared by brokers that see the
/// same file system. Layout: `<root>/<topic>-<partition>-<topic id>/<uuid>.log` beside
/// `<uuid>.leader-epoch-checkpoint` and `<uuid>.snapshot`; each file is written under a `.tmp`
/// name, fsynced and renamed, so a reader sees a whole file or none.
#[derive(Clone, Debug)]
pub struct LocalDirStorage {
    root: PathBuf,
}

impl LocalDirStorage {
    /// A store rooted at `root`, created if missing. A root that is a link to a directory not
    /// there now is a store that cannot be reached now, not a configuration error: the broker
    /// starts, and every access fails as `Unavailable` until the link leads somewhere again.
    pub fn new(root: &Path) -> Result<Self, RemoteStorageError> {
        let dangling_link = std::fs::symlink_metadata(root).is_ok_and(|m| m.is_symlink())
            && std::fs::metadata(root).is_err();
        if !dangling_link {
            std::fs::create_dir_all(root)
                .map_err(|e| RemoteStorageError::from_io(root.display(), e))?;
        }
        Ok(LocalDirStorage {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `e` as this store's error: a missing file is `NotFound` only while the store's root is
    /// there, since a store that cannot be reached is not an empty one.
    fn error(&self, what: impl fmt::Display, e: std::io::Error) -> RemoteStorageError {
        if e.kind() == std::io::ErrorKind::NotFound && !root_reachable(&self.root) {
            return RemoteStorageError::Unavailable {
                what: what.to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "the remote store's root {} cannot be reached",
                        self.root.display()
                    ),
                ),
            };
        }
        RemoteStorageError::from_io(what, e)
    }

    fn file(&self, segment: &RemoteSegmentId, extension: &str) -> PathBuf {
        self.root
            .join(segment.partition.dir_name())
            .join(format!("{}.{extension}", segment.id))
    }

    fn write_file(
        path: &Path,
        fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let tmp = path.with_extension(format!(
            "{}.tmp",
            path.extension()
                .and_then(|e| e.to_str())
                .unwrap_or_default()
        ));
        let mut f = std::fs::File::create(&tmp)?;
        fill(&mut f)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    }
}

impl RemoteStorage for LocalDirStorage {
    fn copy_segment(
        &self,
        segment: &RemoteSegmentId,
        data: SegmentData<'_>,
    ) -> Result<(), RemoteStorageError> {
        let dir = self.root.join(segment.partition.dir_name());
        std::fs::create_dir_all(&dir).map_err(|e| RemoteStorageError::Unavailable {
            what: dir.display().to_string(),
            source: e,
        })?;
        let unavailable = |what: &Path, source| RemoteStorageError::Unavailable {
            what: what.display().to_string(),
            source,
        };
        let log = self.file(segment, "log");
        Self::write_file(&log, |f| {
            let mut src = std::fs::File::open(data.log_file)?;
            std::io::copy(&mut src, f).map(|_| ())
        })
        .map_err(|e| unavailable(&log, e))?;
        for (kind, bytes) in [
            (IndexKind::LeaderEpoch, data.leader_epoch_index),
            (IndexKind::ProducerSnapshot, data.producer_snapshot),
        ] {
            let path = self.file(segment, kind.extension());
            Self::write_file(&path, |f| f.write_all(bytes)).map_err(|e| unavailable(&path, e))?;
        }
        // The remote store is not the log directory: a failure here is an outage, not a halt.
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| unavailable(&dir, e))
    }

    fn fetch_segment(
        &self,
        segment: &RemoteSegmentId,
        start: u64,
        end: Option<u64>,
    ) -> Result<Vec<u8>, RemoteStorageError> {
        let path = self.file(segment, "log");
        let read = || -> std::io::Result<Vec<u8>> {
            let mut f = std::fs::File::open(&path)?;
            let len = f.metadata()?.len();
            let end = end.unwrap_or(len).min(len);
            let start = start.min(end);
            f.seek(SeekFrom::Start(start))?;
            let mut out = vec![0; (end - start) as usize];
            f.read_exact(&mut out)?;
            Ok(out)
        };
        read().map_err(|e| self.error(segment, e))
    }

    fn fetch_index(
        &self,
        segment: &RemoteSegmentId,
        kind: IndexKind,
    ) -> Result<Vec<u8>, RemoteStorageError> {
        let path = self.file(segment, kind.extension());
        std::fs::read(&path)
            .map_err(|e| self.error(format_args!("{} of {segment}", kind.extension()), e))
    }

    fn delete_segment(&self, segment: &RemoteSegmentId) -> Result<(), RemoteStorageError> {
        if !root_reachable(&self.root) {
            return Err(self.error(segment, std::io::Error::from(std::io::ErrorKind::NotFound)));
        }
        for extension in ["log", "leader-epoch-checkpoint", "snapshot"] {
            let path = self.file(segment, extension);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(RemoteStorageError::Unavailable {
                        what: path.display().to_string(),
                        source: e,
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Whether a store's root directory is there to read (through any link to it).
pub fn root_reachable(root: &Path) -> bool {
    std::fs::metadata(root).is_ok_and(|m| m.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segment(partition: i32) -> RemoteSegmentId {
        RemoteSegmentId {
            partition: TopicIdPartition {
                topic_id: Uuid::from_u128(7),
                topic: "t".into(),
                partition,
            },
            id: Uuid::new_v4(),
        }
    }

    #[test]
    fn a_copied_segment_reads_back_whole_and_by_range_until_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStorage::new(&dir.path().join("remote")).unwrap();
        let log_file = dir.path().join("00000000000000000000.log");
        std::fs::write(&log_file, b"0123456789").unwrap();
        let seg = segment(0);
        store
            .copy_segment(
                &seg,
                SegmentData {
                    log_file: &log_file,
                    leader_epoch_index: b"0\n1\n0 0\n",
                    producer_snapshot: b"{}",
                },
            )
            .unwrap();
        assert_eq!(store.fetch_segment(&seg, 0, None).unwrap(), b"0123456789");
        assert_eq!(store.fetch_segment(&seg, 3, Some(6)).unwrap(), b"345");
        assert_eq!(store.fetch_segment(&seg, 8, Some(100)).unwrap(), b"89");
        assert_eq!(
            store.fetch_index(&seg, IndexKind::LeaderEpoch).unwrap(),
            b"0\n1\n0 0\n"
        );
        assert_eq!(
            store
                .fetch_index(&seg, IndexKind::ProducerSnapshot)
                .unwrap(),
            b"{}"
        );
        // A second store on the same directory (another broker) sees the same bytes.
        let other = LocalDirStorage::new(store.root()).unwrap();
        assert_eq!(other.fetch_segment(&seg, 0, Some(2)).unwrap(), b"01");

        store.delete_segment(&seg).unwrap();
        store.delete_segment(&seg).unwrap();
        assert!(matches!(
            store.fetch_segment(&seg, 0, None),
            Err(RemoteStorageError::NotFound { .. })
        ));
        assert!(matches!(
            store.fetch_index(&seg, IndexKind::ProducerSnapshot),
            Err(RemoteStorageError::NotFound { .. })
        ));
    }

    #[test]
    fn a_store_behind_a_link_that_leads_nowhere_is_unavailable_not_empty() {
        let dir = tempfile::tempdir().unwrap();
        let shared = dir.path().join("shared");
        let link = dir.path().join("link");
        let away = dir.path().join("unreachable");
        std::fs::create_dir(&shared).unwrap();
        std::os::unix::fs::symlink(&shared, &link).unwrap();
        let store = LocalDirStorage::new(&link).unwrap();
        let metadata = crate::tiered::metadata::DirMetadataStore::new(&link);
        let log_file = dir.path().join("00000000000000000000.log");
        std::fs::write(&log_file, b"0123").unwrap();
        let seg = segment(0);
        let data = SegmentData {
            log_file: &log_file,
            leader_epoch_index: b"",
            producer_snapshot: b"",
        };
        store.copy_segment(&seg, data).unwrap();
        // The outage: the link now leads to a directory that is not there.
        let cut = dir.path().join("link.new");
        std::os::unix::fs::symlink(&away, &cut).unwrap();
        std::fs::rename(&cut, &link).unwrap();
        let unavailable = |r: Result<Vec<u8>, RemoteStorageError>| {
            matches!(r, Err(RemoteStorageError::Unavailable { .. }))
        };
        assert!(unavailable(store.fetch_segment(&seg, 0, None)));
        assert!(unavailable(store.fetch_index(&seg, IndexKind::LeaderEpoch)));
        assert!(matches!(
            store.copy_segment(&segment(0), data),
            Err(RemoteStorageError::Unavailable { .. })
        ));
        assert!(store.delete_segment(&seg).is_err());
        use crate::tiered::metadata::RemoteLogMetadataStore as _;
        assert!(metadata.list(&seg.partition).is_err(), "down, not empty");
        // A broker starting during the outage starts; the store is reachable once the link is.
        let during = LocalDirStorage::new(&link).unwrap();
        std::os::unix::fs::symlink(&shared, &cut).unwrap();
        std::fs::rename(&cut, &link).unwrap();
        assert_eq!(during.fetch_segment(&seg, 0, None).unwrap(), b"0123");
        assert!(metadata.list(&seg.partition).unwrap().is_empty());
        // A missing file of a reachable store is still NotFound.
        assert!(matches!(
            store.fetch_segment(&segment(0), 0, None),
            Err(RemoteStorageError::NotFound { .. })
        ));
    }

    #[test]
    fn a_missing_local_file_fails_the_copy_as_unavailable_not_as_done() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStorage::new(dir.path()).unwrap();
        let err = store
            .copy_segment(
                &segment(1),
                SegmentData {
                    log_file: &dir.path().join("missing.log"),
                    leader_epoch_index: b"",
                    producer_snapshot: b"",
                },
            )
            .unwrap_err();
        assert!(
            matches!(err, RemoteStorageError::Unavailable { .. }),
            "{err}"
        );
    }
}
