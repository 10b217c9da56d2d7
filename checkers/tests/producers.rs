//! Idempotent producers' state across replicas: one clean history, one per way of diverging,
//! and the cases the check must leave alone.
//!
//! t/0 holds value v at offset v, 0–7 in epoch 0. Producer 7 wrote 0–3 (its last batch ends at
//! 3, sequence 3), producer 8 wrote 4–7 (last offset 7, sequence 3).

mod support;

use serde_json::json;
use support::{replica, Hist};
use tidemark_checkers::{check, OpType, ProducerState, ReplicaState, Results, Validity};

fn p(producer_id: i64, epoch: i64, last_sequence: i64, last_offset: i64) -> ProducerState {
    ProducerState {
        producer_id,
        epoch,
        last_sequence,
        last_offset,
    }
}

fn both() -> Vec<ProducerState> {
    vec![p(7, 0, 3, 3), p(8, 0, 3, 7)]
}

fn node(name: &str, leader: bool, producers: Vec<ProducerState>) -> ReplicaState {
    let all: Vec<(i64, i64, i64)> = (0..8).map(|v| (v, v, 0)).collect();
    let mut r = replica("", name, leader, 8, &all);
    r.producers = Some(producers);
    r
}

fn run(replicas: &[ReplicaState]) -> Results {
    let mut h = Hist::new();
    for v in 0..8 {
        h.send(v as u64, &[v], OpType::Ok, Some(v));
    }
    check(&json!({"workload": "queue"}), h.ops, Some(replicas))
}

#[test]
fn replicas_that_agree_on_every_producer_are_valid() {
    let r = run(&[
        node("n1", true, both()),
        node("n2", false, both()),
        node("n3", false, both()),
    ]);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    assert!(r.anomaly_types.is_empty(), "{:?}", r.anomaly_types);
}

#[test]
fn a_replica_missing_a_producer_its_leader_knows_diverges() {
    // n3 started from the remote store and dropped the uploaded producer snapshot.
    let r = run(&[
        node("n1", true, both()),
        node("n2", false, both()),
        node("n3", false, vec![p(8, 0, 3, 7)]),
    ]);
    assert_eq!(
        r.bad_anomaly_types,
        vec!["producer-state-divergence"],
        "{r:#?}"
    );
    let e = &r.anomalies["producer-state-divergence"];
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0]["node"], "n3");
    assert_eq!(e[0]["producer_id"], 7);
    assert_eq!(e[0]["state"], json!(null));
    assert_eq!(e[0]["leader_state"], json!([7, 0, 3, 3]));
}

#[test]
fn a_replica_with_another_sequence_or_an_extra_producer_diverges() {
    let r = run(&[
        node("n1", true, both()),
        node("n2", false, vec![p(7, 0, 2, 3), p(8, 0, 3, 7)]),
        node(
            "n3",
            false,
            vec![p(7, 0, 3, 3), p(8, 0, 3, 7), p(9, 0, 0, 5)],
        ),
    ]);
    let e = &r.anomalies["producer-state-divergence"];
    let found: Vec<(String, i64)> = e
        .iter()
        .map(|x| {
            (
                x["node"].as_str().unwrap().to_owned(),
                x["producer_id"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(found, [("n2".to_owned(), 7), ("n3".to_owned(), 9)], "{e:?}");
}

#[test]
fn producers_whose_batches_retention_deleted_and_unsettled_replicas_are_not_judged() {
    // n2's log starts at 4: producer 7's batches are gone from it, rightly unknown.
    let mut trimmed = node("n2", false, vec![p(8, 0, 3, 7)]);
    trimmed.records.retain(|x| x.offset >= 4);
    trimmed.log_start_offset = Some(4);
    // n3 has not caught up to the leader's log end: its state is of a shorter log.
    let mut behind = node("n3", false, vec![p(7, 0, 3, 3)]);
    behind.records.retain(|x| x.offset < 4);
    behind.log_end_offset = Some(4);
    behind.high_watermark = Some(4);
    let r = run(&[node("n1", true, both()), trimmed, behind]);
    assert!(
        !r.anomaly_types
            .contains(&"producer-state-divergence".to_string()),
        "{r:#?}"
    );
    // A broker that does not report producers is not judged either.
    let mut silent = node("n2", false, Vec::new());
    silent.producers = None;
    let r = run(&[node("n1", true, both()), silent]);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}
