//! Tiered storage: one tiny literal history per tiered anomaly (and the lost-write the remote
//! store makes visible), and one clean history that must pass.
//!
//! The partition t/0 holds value v at offset v: 0–3 in epoch 0, 4–7 in epoch 1. Its leader n1
//! keeps 4–7 locally; 0–1 and 2–3 are in the remote store. n2 holds everything locally; n3 was
//! wiped and started again from the remote store.

mod support;

use serde_json::{json, Value};
use support::{replica, Hist};
use tidemark_checkers::{check, OpType, ReplicaState, Results, TieredSide, Validity};

const FLAG: &str = "follower.fetch.last.tiered.offset.enable";

fn test(flag: bool) -> Value {
    json!({"workload": "tiered", "broker_config": {FLAG: flag.to_string()}})
}

/// A finished remote segment of t/0 holding `records` (offset, value, epoch).
fn segment(id: &str, start: i64, end: i64, records: &[(i64, i64, i64)]) -> Value {
    let mut epochs: Vec<[i64; 2]> = Vec::new();
    for &(o, _, e) in records {
        if epochs.last().is_none_or(|l| l[0] != e) {
            epochs.push([e, o]);
        }
    }
    json!({"id": id, "start_offset": start, "end_offset": end, "state": "COPY_SEGMENT_FINISHED",
           "segment_leader_epochs": epochs, "broker_id": 1,
           "records": records.iter().map(|&(o, v, e)| [o, v, e]).collect::<Vec<_>>()})
}

fn all() -> Vec<(i64, i64, i64)> {
    (0..8).map(|v| (v, v, i64::from(v >= 4))).collect()
}

/// `r` with its local log starting at `local` and the remote store's `segments`.
fn tiered(mut r: ReplicaState, local: i64, segments: &[Value]) -> ReplicaState {
    r.records.retain(|x| x.offset >= local);
    r.log_start_offset = Some(local);
    r.tiered = Some(
        serde_json::from_value::<TieredSide>(json!({
            "log_start_offset": 0, "local_log_start_offset": local,
            "remote_segments": segments,
        }))
        .unwrap(),
    );
    r
}

fn uploaded() -> Vec<Value> {
    vec![
        segment("a", 0, 1, &[(0, 0, 0), (1, 1, 0)]),
        segment("b", 2, 3, &[(2, 2, 0), (3, 3, 0)]),
    ]
}

fn replicas(segments: &[Value]) -> Vec<ReplicaState> {
    vec![
        tiered(replica("", "n1", true, 8, &all()), 4, segments),
        replica("", "n2", false, 8, &all()),
        tiered(replica("", "n3", false, 8, &all()), 4, segments),
    ]
}

/// Every value sent and acknowledged at its offset, then n3 wiped: the leader answered the
/// earliest pending upload `epuo` and highest tiered offset `highest` before, and n3 came back
/// with its local log at `local` and `epochs`.
fn history(epuo: i64, highest: i64, local: i64, epochs: Value) -> Hist {
    let mut h = Hist::new();
    for v in 0..8 {
        h.send(v as u64, &[v], OpType::Ok, Some(v));
    }
    h.nemesis(
        "wipe",
        json!({"nodes": ["n3"], "kept": ["__cluster_metadata"],
               "deleted": {"n3": {"t-0": 4096}},
               "partitions": [{"node": "n3", "topic": "t", "partition": 0,
                   "leader": {"node": "n1", "earliest_pending_upload": epuo,
                              "earliest_pending_upload_epoch": 1, "highest_tiered_offset": highest,
                              "log_start_offset": 0, "local_log_start_offset": 2},
                   "rejoined": {"log_start_offset": 0, "local_log_start_offset": local,
                                "log_end_offset": 8, "epochs": epochs}}],
               "rejoined_after_s": 1.5}),
    );
    h
}

fn run(flag: bool, h: &Hist, replicas: &[ReplicaState]) -> Results {
    check(&test(flag), h.ops.clone(), Some(replicas))
}

fn clean() -> Hist {
    history(4, 3, 4, json!([[0, 0], [1, 4]]))
}

#[test]
fn a_wiped_follower_started_after_the_last_tiered_segment_is_valid() {
    let r = run(true, &clean(), &replicas(&uploaded()));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    assert!(r.anomaly_types.is_empty(), "{:?}", r.anomaly_types);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
}

#[test]
fn an_uploaded_write_missing_from_the_remote_store_is_lost_and_a_gap() {
    let short = vec![
        segment("a", 0, 1, &[(0, 0, 0), (1, 1, 0)]),
        segment("b", 2, 2, &[(2, 2, 0)]),
    ];
    let r = run(true, &clean(), &replicas(&short));
    assert_eq!(r.valid, Validity::Invalid);
    assert_eq!(r.anomalies["tiered-gap"].len(), 1, "{r:#?}");
    assert_eq!(r.anomalies["tiered-gap"][0]["missing"], json!([3, 3]));
    let lost: Vec<&Value> = r.anomalies["lost-write"]
        .iter()
        .map(|e| &e["value"])
        .collect();
    assert_eq!(lost, vec![&json!(3)], "{r:#?}");
}

#[test]
fn two_finished_segments_disagreeing_at_an_offset_are_remote_divergence() {
    let mut segments = uploaded();
    segments.push(segment("c", 2, 3, &[(2, 2, 0), (3, 33, 0)]));
    let r = run(true, &clean(), &replicas(&segments));
    assert!(
        r.bad_anomaly_types
            .contains(&"remote-divergence".to_string()),
        "{r:#?}"
    );
    assert_eq!(r.anomalies["remote-divergence"][0]["offset"], 3);
}

#[test]
fn a_segment_of_another_lineage_is_not_the_partitions_data() {
    let mut segments = uploaded();
    // Uploaded by a leader of epoch 5, which this lineage never had: not read, not judged.
    segments.push(segment("z", 2, 3, &[(2, 92, 5), (3, 93, 5)]));
    let r = run(true, &clean(), &replicas(&segments));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

#[test]
fn an_older_leaders_segment_running_past_its_epoch_is_not_the_partitions_data() {
    let mut segments = uploaded();
    // The leader of epoch 0 uploaded 2–5 before an unclean election handed offset 4 on to epoch
    // 1: its 4 and 5 were truncated away, so the segment is not this lineage's, though 2 and 3
    // agree.
    segments.push(segment(
        "y",
        2,
        5,
        &[(2, 2, 0), (3, 3, 0), (4, 94, 0), (5, 95, 0)],
    ));
    let r = run(true, &clean(), &replicas(&segments));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    assert!(r.anomaly_types.is_empty(), "{:?}", r.anomaly_types);
}

#[test]
fn a_follower_starting_below_the_earliest_pending_upload_is_a_bad_bootstrap() {
    // KAFKA-13369's off-by-one: n3 started at the leader's local log start 2, not after the
    // segment (2–3) its state came from.
    let h = history(4, 3, 2, json!([[0, 0], [1, 4]]));
    let r = run(true, &h, &replicas(&uploaded()));
    assert_eq!(r.bad_anomaly_types, vec!["tiered-bootstrap"], "{r:#?}");
    let why = r.anomalies["tiered-bootstrap"][0]["why"].as_str().unwrap();
    assert!(why.contains("below the earliest pending upload 4"), "{why}");
    // With the flag off the follower starts the old way, at the leader's local log start.
    let r = run(false, &h, &replicas(&uploaded()));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

/// A history from before `leader_at_restart`: a wiped leader rejoins under a new leader, which
/// answers its own earliest pending upload, so the wiped leader's answer binds nothing.
#[test]
fn a_wiped_leader_is_not_held_to_the_earliest_pending_upload_it_answered_itself() {
    let mut h = history(4, 3, 2, json!([[0, 0], [1, 2]]));
    let wipe = h.ops.last_mut().unwrap();
    wipe.value["partitions"][0]["leader"]["node"] = json!("n3");
    let r = run(true, &h, &replicas(&uploaded()));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    assert!(r.anomaly_types.is_empty(), "{:?}", r.anomaly_types);
}

/// The leader n3 wiped after answering 6 (it had just uploaded up to 5), then started again
/// under n1, which answered `epuo` in epoch 2 while n3 was down (a round behind n3's uploads);
/// n3 came back at `local`, n1 leading in `epoch_then`.
fn wiped_leader(epuo: i64, local: i64, epoch_then: i64) -> Hist {
    let mut h = history(6, 5, local, json!([[0, 0], [1, 4]]));
    let p = &mut h.ops.last_mut().unwrap().value["partitions"][0];
    p["leader"]["node"] = json!("n3");
    p["leader"]["leader_epoch"] = json!(1);
    p["leader_at_restart"] = json!({"node": "n1", "leader_epoch": 2,
        "earliest_pending_upload": epuo, "earliest_pending_upload_epoch": 1,
        "highest_tiered_offset": epuo - 1, "log_start_offset": 0, "local_log_start_offset": 2,
        "high_watermark": 8});
    p["rejoined"]["leader"] = json!("n1");
    p["rejoined"]["leader_epoch"] = json!(epoch_then);
    h
}

#[test]
fn a_wiped_leader_is_held_to_what_the_leader_it_rejoined_under_answered() {
    // Started at n1's answer 4, below n3's own 6: correct.
    let r = run(true, &wiped_leader(4, 4, 2), &replicas(&uploaded()));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    assert!(r.anomaly_types.is_empty(), "{:?}", r.anomaly_types);
    // The off-by-one: started at n1's local log start 2.
    let r = run(true, &wiped_leader(4, 2, 2), &replicas(&uploaded()));
    assert_eq!(r.bad_anomaly_types, vec!["tiered-bootstrap"], "{r:#?}");
    let bad = &r.anomalies["tiered-bootstrap"][0];
    assert_eq!(bad["leader"], "n1");
    let why = bad["why"].as_str().unwrap();
    assert!(
        why.contains("below the earliest pending upload 4 the leader answered before the node was started again"),
        "{why}"
    );
    // Another leader came between the answer and the rejoin: nothing binds the start.
    let r = run(true, &wiped_leader(4, 2, 3), &replicas(&uploaded()));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

#[test]
fn a_follower_with_another_epoch_cache_below_its_local_start_is_a_bad_bootstrap() {
    let h = history(4, 3, 4, json!([[0, 0], [1, 2], [2, 4]]));
    let r = run(true, &h, &replicas(&uploaded()));
    assert_eq!(r.bad_anomaly_types, vec!["tiered-bootstrap"], "{r:#?}");
    let why = r.anomalies["tiered-bootstrap"][0]["why"].as_str().unwrap();
    assert!(why.contains("epoch cache below 4"), "{why}");
}

/// After n3 rejoined (epochs up to 1), a leader in epoch 5 rewrote the partition from offset 0
/// (the last leader back without its log, elected as KIP-966's last known leader): the final
/// leader's epochs below n3's local start are ones n3 could not have known, not a bad bootstrap.
#[test]
fn a_lineage_rewritten_below_the_local_start_after_the_rejoin_is_not_the_bootstraps() {
    let h = history(4, 3, 4, json!([[0, 0], [1, 4]]));
    let rewritten: Vec<(i64, i64, i64)> = (0..8).map(|v| (v, v, 5)).collect();
    let segments = vec![segment(
        "c",
        0,
        3,
        &[(0, 0, 5), (1, 1, 5), (2, 2, 5), (3, 3, 5)],
    )];
    let rs = vec![
        tiered(replica("", "n1", true, 8, &rewritten), 4, &segments),
        replica("", "n2", false, 8, &rewritten),
        tiered(replica("", "n3", false, 8, &rewritten), 4, &segments),
    ];
    let r = run(true, &h, &rs);
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    // The same final leader with an epoch n3 knew differing below its local start still is one.
    let h = history(4, 3, 4, json!([[0, 0], [1, 2], [5, 4]]));
    let r = run(true, &h, &rs);
    assert_eq!(r.bad_anomaly_types, vec!["tiered-bootstrap"], "{r:#?}");
}

#[test]
fn an_earliest_pending_upload_past_the_highest_tiered_offset_breaks_t3() {
    let h = history(6, 3, 6, json!([[0, 0], [1, 4]]));
    let mut rs = replicas(&uploaded());
    rs[2] = tiered(replica("", "n3", false, 8, &all()), 6, &uploaded());
    let r = run(true, &h, &rs);
    assert_eq!(
        r.bad_anomaly_types,
        vec!["earliest-pending-upload"],
        "{r:#?}"
    );
    assert_eq!(
        r.anomalies["earliest-pending-upload"][0]["earliest_pending_upload"],
        6
    );
    // -1: a leader that has not learnt its tiered offsets yet; nothing to judge.
    let h = history(-1, 3, 4, json!([[0, 0], [1, 4]]));
    assert_eq!(run(true, &h, &replicas(&uploaded())).valid, Validity::Valid);
    // Nothing tiered: the answer is the log start.
    let h = history(2, -1, 4, json!([[0, 0], [1, 4]]));
    let r = run(true, &h, &replicas(&uploaded()));
    assert_eq!(
        r.bad_anomaly_types,
        vec!["earliest-pending-upload"],
        "{r:#?}"
    );
}

#[test]
fn uploaded_offsets_below_the_claimed_log_start_are_a_gap() {
    // The final leader's epoch cache was truncated at 2 (it took a leader's wrong log start) and
    // it says the partition starts there, while segment 0–1 is still in the remote store.
    let mut rs = replicas(&uploaded());
    rs[0].epochs = vec![
        tidemark_checkers::EpochEntry {
            epoch: 0,
            start_offset: 2,
        },
        tidemark_checkers::EpochEntry {
            epoch: 1,
            start_offset: 4,
        },
    ];
    rs[0].tiered.as_mut().unwrap().log_start_offset = Some(2);
    let r = run(true, &clean(), &rs);
    assert!(
        r.bad_anomaly_types.contains(&"tiered-gap".to_string()),
        "{r:#?}"
    );
    assert_eq!(r.anomalies["tiered-gap"][0]["missing"], json!([0, 1]));
    // Its truncated cache no longer matches what the wiped follower holds below 4 either.
    assert!(r.anomalies["tiered-bootstrap"][0]["why"]
        .as_str()
        .unwrap()
        .contains("epoch cache below 4"));
}

/// n3 wiped while the cluster described the flag as `flag`: n1 leading in epoch 2 answered its
/// local log start `low` while n3 was down and `high` once n3 was back, and n3 came back with
/// its local log at `local`.
fn described(flag: bool, low: i64, high: i64, local: i64) -> Hist {
    let mut h = history(4, 3, local, json!([[0, 0], [1, 4]]));
    let wipe = &mut h.ops.last_mut().unwrap().value;
    wipe["fetch_last_tiered_offset"] = json!(flag);
    let p = &mut wipe["partitions"][0];
    let leader = |l: i64| {
        json!({"node": "n1", "leader_epoch": 2, "earliest_pending_upload": 4,
               "earliest_pending_upload_epoch": 1, "highest_tiered_offset": 3,
               "log_start_offset": 0, "local_log_start_offset": l, "high_watermark": 8})
    };
    p["leader_at_restart"] = leader(low);
    p["rejoined"]["leader"] = json!("n1");
    p["rejoined"]["leader_epoch"] = json!(2);
    p["rejoined"]["leader_offsets"] = leader(high);
    h
}

#[test]
fn with_the_flag_off_a_follower_starts_at_its_leaders_local_log_start() {
    // The test's brokers started with the flag on; the wipe found it turned off.
    let r = run(true, &described(false, 2, 2, 2), &replicas(&uploaded()));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    assert!(r.anomaly_types.is_empty(), "{:?}", r.anomaly_types);
    // The leader's local log start moved on while the node rejoined: anywhere between is right.
    let r = run(true, &described(false, 2, 4, 4), &replicas(&uploaded()));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    // Another leader's segment 0–3 holds offset 1: the old protocol may start after it, at 4.
    let mut overlapping = uploaded();
    overlapping.push(segment(
        "c",
        0,
        3,
        &[(0, 0, 0), (1, 1, 0), (2, 2, 0), (3, 3, 0)],
    ));
    let r = run(true, &described(false, 2, 2, 4), &replicas(&overlapping));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

#[test]
fn with_the_flag_off_a_follower_skipping_to_the_earliest_pending_upload_breaks_t2() {
    let r = run(true, &described(false, 2, 2, 4), &replicas(&uploaded()));
    assert_eq!(r.bad_anomaly_types, vec!["tiered-flag-gating"], "{r:#?}");
    let bad = &r.anomalies["tiered-flag-gating"][0];
    assert_eq!(bad["leader_local_log_start_offset"], json!([2, 2]));
    let why = bad["why"].as_str().unwrap();
    assert!(why.contains("above the local log start 2"), "{why}");
    // Below the leader's local log start is not the old protocol either.
    let r = run(true, &described(false, 4, 4, 2), &replicas(&uploaded()));
    assert_eq!(r.bad_anomaly_types, vec!["tiered-flag-gating"], "{r:#?}");
    let why = r.anomalies["tiered-flag-gating"][0]["why"]
        .as_str()
        .unwrap();
    assert!(why.contains("below the local log start 4"), "{why}");
    // Another leader came between: nothing binds the start.
    let mut h = described(false, 2, 2, 4);
    h.ops.last_mut().unwrap().value["partitions"][0]["rejoined"]["leader_epoch"] = json!(3);
    let r = run(true, &h, &replicas(&uploaded()));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

#[test]
fn the_flag_the_wipe_recorded_wins_over_the_brokers_configuration() {
    // Configured off, turned on at run time: held to KIP-1023's start (T1), not the old one.
    let r = run(false, &described(true, 2, 2, 2), &replicas(&uploaded()));
    assert_eq!(r.bad_anomaly_types, vec!["tiered-bootstrap"], "{r:#?}");
    let r = run(false, &described(true, 2, 2, 4), &replicas(&uploaded()));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
}

#[test]
fn a_wipe_that_could_not_tell_the_flag_after_it_was_turned_is_not_held_to_either_start() {
    // The off-by-one's start, 2, with the flag unrecorded: the brokers' configuration decides.
    let mut h = described(true, 2, 2, 2);
    h.ops.last_mut().unwrap().value["fetch_last_tiered_offset"] = Value::Null;
    let r = run(true, &h, &replicas(&uploaded()));
    assert_eq!(r.bad_anomaly_types, vec!["tiered-bootstrap"], "{r:#?}");
    // Once a tiered-config turned it, the configuration says nothing: not judged.
    let mut turned = Hist::new();
    turned.nemesis(
        "tiered-config",
        json!({"set": {FLAG: "false"}, "was": true, "described": {"n1": false, "n2": true}}),
    );
    turned.ops.extend(h.ops.clone());
    let r = run(true, &turned, &replicas(&uploaded()));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    assert!(r.anomaly_types.is_empty(), "{:?}", r.anomaly_types);
}

/// `h`'s wiped replica as the broker recorded its start from the remote store, at `began` in
/// epoch 2, while its local log start read later is `local`.
fn began_at(mut h: Hist, began: i64, local: i64) -> Hist {
    let rejoined = &mut h.ops.last_mut().unwrap().value["partitions"][0]["rejoined"];
    rejoined["local_log_start_offset"] = json!(local);
    rejoined["remote_bootstrap"] = json!({"local_log_start_offset": began, "leader_epoch": 2});
    h
}

#[test]
fn a_follower_is_judged_where_it_began_not_where_local_retention_left_its_log() {
    // Flag off, started right at the leader's local log start 2; retention then deleted 2–3 on
    // the follower, past the leader's own local log start.
    let h = began_at(described(false, 2, 2, 2), 2, 4);
    let r = run(true, &h, &replicas(&uploaded()));
    assert_eq!(r.valid, Validity::Valid, "{r:#?}");
    // Flag on, the off-by-one start at 2 that retention later hid: still caught.
    let h = began_at(described(true, 4, 4, 2), 2, 4);
    let r = run(true, &h, &replicas(&uploaded()));
    assert_eq!(r.bad_anomaly_types, vec!["tiered-bootstrap"], "{r:#?}");
    let why = r.anomalies["tiered-bootstrap"][0]["why"].as_str().unwrap();
    assert!(why.contains("began at 2"), "{why}");
}
