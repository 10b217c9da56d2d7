//! A quorum of one without a network: a standalone broker (no `controller.quorum.voters`)
//! applies commands directly and persists the image to a file. It keeps the same contract as
//! the raft quorum so the broker above cannot tell them apart.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::future::BoxFuture;
use tokio::sync::watch;

use super::{apply, ControllerCommand, ControllerReply, MetadataQuorum, QuorumError, QuorumStatus};
use crate::metadata::{MetadataFile, MetadataImage};

pub struct LocalQuorum {
    file: MetadataFile,
    image: Mutex<MetadataImage>,
    published: watch::Sender<Arc<MetadataImage>>,
    heartbeats: Mutex<BTreeMap<i32, (u64, Instant)>>,
}

impl LocalQuorum {
    /// Loads the image persisted in `log_dir`, if any.
    pub fn open(log_dir: &Path) -> anyhow::Result<Arc<Self>> {
        let file = MetadataFile::new(log_dir);
        let image = file.load()?;
        let (tx, _) = watch::channel(Arc::new(image.clone()));
        Ok(Arc::new(LocalQuorum {
            file,
            image: Mutex::new(image),
            published: tx,
            heartbeats: Mutex::new(BTreeMap::new()),
        }))
    }
}

impl MetadataQuorum for LocalQuorum {
    fn image(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.published.subscribe()
    }

    fn submit(
        &self,
        cmd: ControllerCommand,
    ) -> BoxFuture<'_, Result<ControllerReply, QuorumError>> {
        Box::pin(async move {
            let mut image = self.image.lock().unwrap_or_else(|p| p.into_inner());
            let mut next = image.clone();
            let reply = apply(&mut next, &cmd);
            if next != *image {
                self.file
                    .save(&next)
                    .map_err(|e| QuorumError::Fatal(e.to_string()))?;
                *image = next.clone();
                self.published.send_replace(Arc::new(next));
            }
            Ok(reply)
        })
    }

    fn heartbeat(
        &self,
        broker_id: i32,
        incarnation: u64,
    ) -> BoxFuture<'_, Result<(), QuorumError>> {
        let mut hb = self.heartbeats.lock().unwrap_or_else(|p| p.into_inner());
        hb.insert(broker_id, (incarnation, Instant::now()));
        Box::pin(async { Ok(()) })
    }

    fn status(&self) -> BoxFuture<'_, Result<QuorumStatus, QuorumError>> {
        Box::pin(async {
            Err(QuorumError::Fatal(
                "a standalone node keeps its metadata without a quorum".into(),
            ))
        })
    }

    fn heartbeats(&self) -> BTreeMap<i32, (u64, Instant)> {
        self.heartbeats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn is_active(&self) -> bool {
        true
    }

    fn active_controller(&self) -> Option<i32> {
        None
    }
}
