//! The replicated state machine: every committed command goes through the pure `state::apply`, so
//! all controllers hold the same `MetadataImage`, and each new image is published to the broker
//! through a watch channel. The image itself is kept in memory; `snapshot.json` under the metadata
//! directory holds the last snapshot (image, last applied log id and membership), and on restart
//! openraft replays the committed entries after it.

use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend,
    RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Mutex};

use super::log_store::{blocking, read_json, write_atomic};
use super::TypeConfig;
use crate::controller::state::{apply, ControllerReply};
use crate::metadata::MetadataImage;

const SNAPSHOT_FILE: &str = "snapshot.json";

/// The snapshot as stored on disk. Over the network only the image travels; openraft carries the
/// meta separately.
#[derive(Clone, Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta<u64, BasicNode>,
    image: MetadataImage,
}

impl SnapshotFile {
    fn to_snapshot(&self) -> io::Result<Snapshot<TypeConfig>> {
        let data = serde_json::to_vec(&self.image)?;
        Ok(Snapshot {
            meta: self.meta.clone(),
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

/// The snapshot on disk, shared between the state machine and its snapshot builders.
type CurrentSnapshot = Arc<Mutex<Option<SnapshotFile>>>;

pub(super) struct StateMachine {
    dir: PathBuf,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    image: Arc<MetadataImage>,
    publish: watch::Sender<Arc<MetadataImage>>,
    /// The same images with the log index they were applied at, for brokers that observe.
    indexed: watch::Sender<IndexedImage>,
    current: CurrentSnapshot,
}

/// An image and the index of the last log entry applied to it; indexes only grow.
#[derive(Clone, Debug, Default)]
pub(super) struct IndexedImage {
    pub index: u64,
    pub image: Arc<MetadataImage>,
}

/// A copy of the state at one log id, written out as the new snapshot.
pub(super) struct SnapshotBuilder {
    dir: PathBuf,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    image: Arc<MetadataImage>,
    current: CurrentSnapshot,
}

impl StateMachine {
    /// Loads the last snapshot under `dir`; the receivers see every image applied from then on.
    pub(super) fn open(
        dir: &Path,
    ) -> io::Result<(
        StateMachine,
        watch::Receiver<Arc<MetadataImage>>,
        watch::Receiver<IndexedImage>,
    )> {
        let stored = read_json::<SnapshotFile>(dir, SNAPSHOT_FILE)?;
        let (last_applied, membership, image) = match &stored {
            Some(s) => (
                s.meta.last_log_id,
                s.meta.last_membership.clone(),
                Arc::new(s.image.clone()),
            ),
            None => (None, StoredMembership::default(), Arc::default()),
        };
        let (publish, rx) = watch::channel(image.clone());
        let (indexed, indexed_rx) = watch::channel(IndexedImage {
            index: last_applied.map_or(0, |l| l.index),
            image: image.clone(),
        });
        let sm = StateMachine {
            dir: dir.to_path_buf(),
            last_applied,
            membership,
            image,
            publish,
            indexed,
            current: Arc::new(Mutex::new(stored)),
        };
        Ok((sm, rx, indexed_rx))
    }
}

impl StateMachine {
    fn publish_image(&self) {
        self.publish.send_replace(self.image.clone());
        self.indexed.send_replace(IndexedImage {
            index: self.last_applied.map_or(0, |l| l.index),
            image: self.image.clone(),
        });
    }
}

/// Makes `file` the snapshot on disk unless a newer one is already there (a snapshot installed
/// from the leader can overtake one being built locally).
async fn save(
    dir: &Path,
    current: &CurrentSnapshot,
    file: SnapshotFile,
) -> Result<(), StorageError<u64>> {
    let mut cur = current.lock().await;
    if cur
        .as_ref()
        .is_some_and(|c| c.meta.last_log_id > file.meta.last_log_id)
    {
        return Ok(());
    }
    let bytes = serde_json::to_vec(&file).map_err(|e| snapshot_err(ErrorVerb::Write, e))?;
    let dir = dir.to_path_buf();
    let written = blocking(move || write_atomic(&dir, SNAPSHOT_FILE, &bytes)).await;
    crate::durable::written_or_halt(written, "writing the metadata quorum's snapshot");
    *cur = Some(file);
    Ok(())
}

fn snapshot_err(verb: ErrorVerb, e: impl Into<io::Error>) -> StorageError<u64> {
    StorageError::from_io_error(ErrorSubject::Snapshot(None), verb, e.into())
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let snapshot_id = match self.last_applied {
            Some(l) => format!("{}-{}", l.leader_id, l.index),
            None => "empty".to_string(),
        };
        let file = SnapshotFile {
            meta: SnapshotMeta {
                last_log_id: self.last_applied,
                last_membership: self.membership.clone(),
                snapshot_id,
            },
            image: (*self.image).clone(),
        };
        let snapshot = file
            .to_snapshot()
            .map_err(|e| snapshot_err(ErrorVerb::Read, e))?;
        save(&self.dir, &self.current, file).await?;
        tracing::debug!(last_log_id = ?self.last_applied, "built a metadata snapshot");
        Ok(snapshot)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<ControllerReply>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            let reply = match entry.payload {
                EntryPayload::Blank => ControllerReply::Done,
                EntryPayload::Normal(cmd) => {
                    let reply = apply(Arc::make_mut(&mut self.image), &cmd);
                    self.publish_image();
                    reply
                }
                EntryPayload::Membership(m) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), m);
                    ControllerReply::Done
                }
            };
            replies.push(reply);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            dir: self.dir.clone(),
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            image: self.image.clone(),
            current: self.current.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let image: MetadataImage = serde_json::from_slice(snapshot.get_ref())
            .map_err(|e| snapshot_err(ErrorVerb::Read, e))?;
        let file = SnapshotFile {
            meta: meta.clone(),
            image: image.clone(),
        };
        save(&self.dir, &self.current, file).await?;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.image = Arc::new(image);
        self.publish_image();
        tracing::info!(last_log_id = ?meta.last_log_id, "installed a metadata snapshot from the leader");
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        match &*self.current.lock().await {
            Some(file) => Ok(Some(
                file.to_snapshot()
                    .map_err(|e| snapshot_err(ErrorVerb::Read, e))?,
            )),
            None => Ok(None),
        }
    }
}
