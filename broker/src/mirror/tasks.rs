//! The running mirror tasks of a broker, one per partition it leads, and what describe reports
//! of each. Apart from the tasks themselves (`runner.rs`) so the broker's `MirrorContext` can
//! hold them without the context and the runner importing each other.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

use crate::partition::Partition;

/// What the describe API reports of a partition's mirroring, kept across task restarts.
#[derive(Clone, Debug)]
pub struct MirrorStatus {
    /// The source high watermark at the last fetch, or -1.
    pub source_high_watermark: i64,
    /// The LMLE the last preparation used, or -1.
    pub lmle: i32,
    /// The epoch an EPOCH_FENCING partition must reach.
    pub fencing_target: Option<i32>,
    /// What a PREPARING partition waits for, if anything.
    pub waiting_for: Option<String>,
    /// The leader epoch this leader moved to before a truncation of committed records. The move
    /// restarts the task; the restarted task truncates in that epoch instead of moving again.
    pub truncation_epoch: Option<i32>,
}

impl Default for MirrorStatus {
    fn default() -> Self {
        MirrorStatus {
            source_high_watermark: -1,
            lmle: -1,
            fencing_target: None,
            waiting_for: None,
            truncation_epoch: None,
        }
    }
}

#[derive(Default)]
struct Entry {
    running: Option<(u64, CancellationToken)>,
    /// The leader epoch the running task is moving its partition to itself, if any.
    moving_to: Option<i32>,
    status: MirrorStatus,
}

/// The running mirror tasks of this broker, by partition.
#[derive(Default)]
pub struct MirrorTasks {
    entries: Mutex<BTreeMap<(String, i32), Entry>>,
    next_id: Mutex<u64>,
}

impl MirrorTasks {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, i32), Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a new task for the partition unless one runs: its id and cancellation.
    pub fn claim(&self, p: &Partition) -> Option<(u64, CancellationToken)> {
        let mut entries = self.lock();
        let entry = entries.entry((p.topic.clone(), p.index)).or_default();
        if entry.running.is_some() {
            return None;
        }
        entry.moving_to = None;
        let id = {
            let mut n = self.next_id.lock().unwrap_or_else(|x| x.into_inner());
            *n += 1;
            *n
        };
        let cancel = CancellationToken::new();
        entry.running = Some((id, cancel.clone()));
        Some((id, cancel))
    }

    /// Stops the partition's task, if any.
    pub fn stop(&self, p: &Partition) {
        if let Some(e) = self.lock().get_mut(&(p.topic.clone(), p.index)) {
            if let Some((_, cancel)) = e.running.take() {
                cancel.cancel();
            }
        }
    }

    /// Notes that the partition's running task moves its leader to `epoch` itself.
    pub fn moving_to(&self, p: &Partition, epoch: i32) {
        if let Some(e) = self.lock().get_mut(&(p.topic.clone(), p.index)) {
            e.moving_to = Some(epoch);
        }
    }

    /// Whether a running task moved the partition's leader to `epoch` itself: it goes on in
    /// that epoch, in the middle of what it moved for (a truncation), instead of being replaced
    /// by a task that starts over.
    pub fn moved_itself(&self, p: &Partition, epoch: i32) -> bool {
        self.lock()
            .get(&(p.topic.clone(), p.index))
            .is_some_and(|e| e.running.is_some() && e.moving_to == Some(epoch))
    }

    pub fn finished(&self, p: &Partition, id: u64) {
        if let Some(e) = self.lock().get_mut(&(p.topic.clone(), p.index)) {
            if e.running.as_ref().is_some_and(|(i, _)| *i == id) {
                e.running = None;
            }
        }
    }

    pub fn status(&self, topic: &str, index: i32) -> Option<MirrorStatus> {
        self.lock()
            .get(&(topic.to_string(), index))
            .map(|e| e.status.clone())
    }

    pub fn update(&self, p: &Partition, f: impl FnOnce(&mut MirrorStatus)) {
        f(&mut self
            .lock()
            .entry((p.topic.clone(), p.index))
            .or_default()
            .status);
    }
}
