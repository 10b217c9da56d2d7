//! Storage tests: openraft's conformance suite over our log store and state machine, and the
//! crash cases the suite does not cover (a torn append, a reload after truncate and purge).

use std::fs::OpenOptions;
use std::io::Write;

use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, RaftLogReader, StorageError};

use super::log_store::LogStore;
use super::state_machine::StateMachine;
use super::TypeConfig;
use crate::controller::state::{ControllerCommand, ControllerReply};

struct TempStore;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for TempStore {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = LogStore::open(dir.path()).expect("open log store");
        let (sm, _image, _indexed) = StateMachine::open(dir.path()).expect("open state machine");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(TempStore).expect("storage suite");
}

fn entry(index: u64, cmd: Option<ControllerCommand>) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: match cmd {
            Some(c) => EntryPayload::Normal(c),
            None => EntryPayload::Blank,
        },
    }
}

fn delete(name: &str) -> ControllerCommand {
    ControllerCommand::DeleteTopic {
        name: name.to_string(),
    }
}

async fn append(store: &mut LogStore, entries: Vec<Entry<TypeConfig>>) {
    store.blocking_append(entries).await.expect("append");
}

async fn indexes(store: &mut LogStore) -> Vec<u64> {
    store
        .try_get_log_entries(0..)
        .await
        .expect("read")
        .iter()
        .map(|e| e.log_id.index)
        .collect()
}

#[tokio::test]
async fn torn_last_line_is_dropped_and_truncate_purge_survive_reload() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut store = LogStore::open(dir.path()).unwrap();
        append(
            &mut store,
            (0..10).map(|i| entry(i, Some(delete("t")))).collect(),
        )
        .await;
        store
            .truncate(LogId::new(CommittedLeaderId::new(1, 1), 8))
            .await
            .unwrap();
        store
            .purge(LogId::new(CommittedLeaderId::new(1, 1), 2))
            .await
            .unwrap();
        append(&mut store, vec![entry(8, None)]).await;
    }
    // A crash in the middle of an append leaves half a line.
    let mut f = OpenOptions::new()
        .append(true)
        .open(dir.path().join("log.jsonl"))
        .unwrap();
    f.write_all(br#"{"log_id":{"leader_id":{"term":1,"#)
        .unwrap();
    drop(f);

    let mut store = LogStore::open(dir.path()).unwrap();
    assert_eq!(indexes(&mut store).await, (3..=8).collect::<Vec<_>>());
    let state = store.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(2));
    assert_eq!(state.last_log_id.map(|l| l.index), Some(8));
    // Appends continue after the cut.
    append(&mut store, vec![entry(9, None)]).await;
    drop(store);
    let mut store = LogStore::open(dir.path()).unwrap();
    assert_eq!(indexes(&mut store).await, (3..=9).collect::<Vec<_>>());
}

#[tokio::test]
async fn snapshot_restores_the_image() {
    use openraft::RaftSnapshotBuilder;

    let dir = tempfile::tempdir().unwrap();
    let create = ControllerCommand::CreateTopic {
        name: "t".into(),
        id: uuid::Uuid::new_v4(),
        partitions: 1,
        replication_factor: 1,
        configs: Default::default(),
        validate_only: false,
        assignments: Vec::new(),
        mirror: None,
    };
    let image = {
        let (mut sm, image, indexed) = StateMachine::open(dir.path()).unwrap();
        assert_eq!(indexed.borrow().index, 0);
        let replies = sm
            .apply(vec![entry(0, None), entry(1, Some(create.clone()))])
            .await
            .unwrap();
        // Observers see the image with the index it was applied at.
        assert_eq!(indexed.borrow().index, 1);
        assert_eq!(*indexed.borrow().image, **image.borrow());
        assert_eq!(replies[0], ControllerReply::Done);
        // No broker is registered, so the topic cannot be placed; the reply says why.
        assert!(matches!(replies[1], ControllerReply::Error { .. }));
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let latest = image.borrow().clone();
        latest
    };
    let (mut sm, image2, indexed) = StateMachine::open(dir.path()).unwrap();
    assert_eq!(*image2.borrow(), image);
    assert_eq!(
        indexed.borrow().index,
        1,
        "a restart resumes at the snapshot's index"
    );
    let (applied, _) = sm.applied_state().await.unwrap();
    assert_eq!(applied.map(|l| l.index), Some(1));
}
