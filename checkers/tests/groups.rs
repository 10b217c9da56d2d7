//! Consumer groups and idempotent producers: one literal history per anomaly their modes add
//! (`commit-regression`, `commit-skip`, `zombie-commit`, `commit-lost`, and a `duplicate` of an idempotent
//! producer's retried send), and a clean group history that must pass.

mod support;

use serde_json::{json, Value};
use support::{entries, replica, Hist};
use tidemark_checkers::{check, OpType, Process, ReplicaState, Results, Validity};

use OpType::{Invoke, Ok};

const GROUP: &str = "tidemark";

/// A `group-poll` by process `p`, member `member` in `generation`, of t/0 from `from`.
fn group_poll(
    h: &mut Hist,
    p: u64,
    member: &str,
    generation: i64,
    from: i64,
    records: &[(i64, i64, i64)],
) -> u64 {
    h.push(
        Process::Client(p),
        Invoke,
        "group-poll",
        json!({"group": GROUP}),
        None,
    );
    let records: Vec<[i64; 3]> = records.iter().map(|&(o, v, e)| [o, v, e]).collect();
    let hw = records.last().map_or(from, |r| r[0] + 1);
    h.push(
        Process::Client(p),
        Ok,
        "group-poll",
        json!({"group": GROUP, "member": member, "generation": generation, "topic": "t",
               "partition": 0, "from": from, "records": records, "high_watermark": hw}),
        None,
    )
}

/// A `commit` invoked and completed `kind` by process `p`, of t/0 at `offset`; returns the
/// invocation's and completion's indices.
fn commit(
    h: &mut Hist,
    p: u64,
    member: &str,
    generation: i64,
    offset: i64,
    kind: OpType,
) -> (u64, u64) {
    let inv = commit_invoked(h, p);
    (inv, commit_done(h, p, member, generation, offset, kind))
}

/// The invocation of a `commit` by process `p`.
fn commit_invoked(h: &mut Hist, p: u64) -> u64 {
    h.push(
        Process::Client(p),
        Invoke,
        "commit",
        json!({"group": GROUP}),
        None,
    )
}

/// The completion `kind` of process `p`'s `commit` of t/0 at `offset`.
fn commit_done(
    h: &mut Hist,
    p: u64,
    member: &str,
    generation: i64,
    offset: i64,
    kind: OpType,
) -> u64 {
    let value = match kind {
        Ok => json!({"group": GROUP, "member": member, "generation": generation,
                      "offsets": [{"topic": "t", "partition": 0, "offset": offset}]}),
        _ => json!({"group": GROUP}),
    };
    h.push(Process::Client(p), kind, "commit", value, None)
}

fn log(records: &[(i64, i64, i64)]) -> Vec<ReplicaState> {
    let hw = records.len() as i64;
    vec![
        replica("a", "n1", true, hw, records),
        replica("a", "n2", false, hw, records),
    ]
}

fn judge(h: &Hist, replicas: &[ReplicaState]) -> Results {
    check(
        &json!({"workload_options": {"producer": "idempotent", "consumer": "group"}}),
        h.ops.clone(),
        Some(replicas),
    )
}

const RECORDS: [(i64, i64, i64); 4] = [(0, 1, 0), (1, 2, 0), (2, 3, 0), (3, 4, 0)];

/// Four acknowledged values; member m1 reads two and commits, is replaced by m2 in the next
/// generation, which resumes at the commit, reads the rest and commits past them. A commit
/// refused for an old generation and one that timed out change nothing.
fn clean() -> Hist {
    let mut h = Hist::new();
    h.send(0, &[1, 2], Ok, Some(0));
    h.send(0, &[3, 4], Ok, Some(2));
    group_poll(&mut h, 1, "m1", 1, 0, &RECORDS[..2]);
    commit(&mut h, 1, "m1", 1, 2, Ok);
    // m1 read on but crashed before committing; its successor reads those again.
    group_poll(&mut h, 1, "m1", 1, 2, &RECORDS[2..3]);
    commit(&mut h, 1, "m1", 1, 3, OpType::Info);
    group_poll(&mut h, 2, "m2", 2, 2, &RECORDS[2..]);
    commit(&mut h, 1, "m1", 1, 3, OpType::Fail);
    commit(&mut h, 2, "m2", 2, 4, Ok);
    commit(&mut h, 2, "m2", 2, 4, Ok);
    h
}

#[test]
fn a_clean_group_history_is_valid() {
    let r = judge(&clean(), &log(&RECORDS));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    assert!(r.anomaly_types.is_empty(), "{:?}", r.anomaly_types);
    assert_eq!(r.stats["group-poll"].ok, 3);
    assert_eq!(r.stats["commit"].ok, 3);
}

#[test]
fn a_commit_below_an_earlier_one_of_its_generation_is_a_regression() {
    let mut h = clean();
    let (_, later) = commit(&mut h, 2, "m2", 2, 3, Ok);
    // The first commit at the highest offset before it: clean()'s first commit of 4 by m2.
    let earlier = h
        .ops
        .iter()
        .find(|o| o.f == "commit" && o.kind == Ok && o.value["offsets"][0]["offset"] == 4)
        .unwrap()
        .index;
    let r = judge(&h, &log(&RECORDS));
    assert_eq!(
        r.anomaly_types,
        vec!["commit-regression"],
        "{}",
        r.summary(5)
    );
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "commit-regression")[0];
    assert_eq!(e["op_index"], later);
    assert_eq!(e["offset"], 3);
    assert_eq!(e["generation"], 2);
    assert_eq!(e["earlier"]["op_index"], earlier);
    assert_eq!(e["earlier"]["offset"], 4);
}

#[test]
fn a_lower_commit_in_a_new_generation_or_overlapping_in_time_is_not_a_regression() {
    let mut h = clean();
    // A new generation resumes from what OffsetFetch said; commits of two members in flight
    // together may land in either order.
    commit(&mut h, 3, "m3", 3, 2, Ok);
    let mut overlapping = Hist::new();
    overlapping.send(0, &[1, 2], Ok, Some(0));
    group_poll(&mut overlapping, 1, "m1", 1, 0, &RECORDS[..2]);
    commit_invoked(&mut overlapping, 1);
    commit(&mut overlapping, 2, "m1", 1, 2, Ok);
    commit_done(&mut overlapping, 1, "m1", 1, 1, Ok);
    for (h, replicas) in [(h, log(&RECORDS)), (overlapping, log(&RECORDS[..2]))] {
        let r = judge(&h, &replicas);
        assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
    }
}

#[test]
fn a_commit_past_a_record_no_member_polled_is_a_skip() {
    let mut h = Hist::new();
    h.send(0, &[1, 2], Ok, Some(0));
    h.send(0, &[3, 4], Ok, Some(2));
    group_poll(&mut h, 1, "m1", 1, 0, &RECORDS[..2]);
    // Offset 2 was read by a plain poll only: that is not the group's.
    h.poll(5, 2, &RECORDS[2..3], Some(4));
    group_poll(&mut h, 1, "m1", 1, 3, &RECORDS[3..]);
    let (_, done) = commit(&mut h, 1, "m1", 1, 4, Ok);
    let r = judge(&h, &log(&RECORDS));
    // Each read was contiguous from where it started: only the commit vouches for offset 2.
    assert_eq!(r.anomaly_types, vec!["commit-skip"], "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "commit-skip")[0];
    assert_eq!(e["op_index"], done);
    assert_eq!(e["committed"], 4);
    assert_eq!(e["skipped"], json!([2]));
    assert_eq!(e["skipped_count"], 1);
    assert_eq!(e["reference"], "final log");
}

#[test]
fn a_commit_skip_is_allowed_where_unclean_elections_rewrite_offsets() {
    let mut h = Hist::new();
    h.send(0, &[1, 2], Ok, Some(0));
    group_poll(&mut h, 1, "m1", 1, 0, &RECORDS[..1]);
    commit(&mut h, 1, "m1", 1, 2, Ok);
    let r = check(
        &json!({"unclean_leader_election": true}),
        h.ops.clone(),
        Some(&log(&RECORDS[..2])),
    );
    assert!(r.anomaly_types.contains(&"commit-skip".to_string()));
    assert!(!r.bad_anomaly_types.contains(&"commit-skip".to_string()));
}

#[test]
fn a_commit_of_an_ended_generation_after_the_group_moved_on_is_a_zombie() {
    // clean() ends with m2 in generation 2; m1, stalled since generation 1, wakes and commits
    // what it read, and the coordinator takes it.
    let mut h = clean();
    let moved_on = h
        .ops
        .iter()
        .find(|o| o.f == "group-poll" && o.kind == Ok && o.value["generation"] == 2)
        .unwrap()
        .index;
    let (inv, done) = commit(&mut h, 1, "m1", 1, 3, Ok);
    let r = judge(&h, &log(&RECORDS));
    assert_eq!(r.anomaly_types, vec!["zombie-commit"], "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "zombie-commit")[0];
    assert_eq!(
        (e["op_index"].as_u64(), e["invoke_index"].as_u64()),
        (Some(done), Some(inv))
    );
    assert_eq!(
        (e["generation"].as_i64(), e["member"].as_str()),
        (Some(1), Some("m1"))
    );
    assert_eq!(
        e["offsets"],
        json!([{"topic": "t", "partition": 0, "offset": 3}])
    );
    assert_eq!(e["later"]["generation"], 2);
    assert_eq!(e["later"]["op_index"], moved_on);
    assert_eq!(e["later"]["f"], "group-poll");
    assert_eq!(e["later"]["member"], "m2");
}

#[test]
fn a_commit_invoked_before_the_group_moved_on_is_no_zombie() {
    // m1's commit was in flight when m2's first op of generation 2 completed: the coordinator
    // may have taken it while generation 1 still stood.
    let mut h = Hist::new();
    h.send(0, &[1, 2], Ok, Some(0));
    h.send(0, &[3, 4], Ok, Some(2));
    group_poll(&mut h, 1, "m1", 1, 0, &RECORDS[..2]);
    commit_invoked(&mut h, 1);
    group_poll(&mut h, 2, "m2", 2, 0, &RECORDS);
    commit_done(&mut h, 1, "m1", 1, 2, Ok);
    commit(&mut h, 2, "m2", 2, 4, Ok);
    let r = judge(&h, &log(&RECORDS));
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Valid);
}

#[test]
fn a_zombie_commit_is_allowed_only_where_the_groups_own_records_may_be_lost() {
    // A power loss of two nodes at once after the group moved on: with min.insync.replicas 2
    // and the default flush policy, the record of generation 2 may be gone from every replica
    // of the group's partition, and the coordinator back in generation 1.
    let mut h = clean();
    h.nemesis(
        "power-loss",
        json!({"nodes": ["n1", "n2"], "seed": 3, "cluster_wide": false, "dropped": {}}),
    );
    commit(&mut h, 1, "m1", 1, 3, Ok);
    let config = |extra: Value| {
        let mut test = json!({"workload_options": {"producer": "idempotent", "consumer": "group"},
                              "broker_config": {"min.insync.replicas": "2"}});
        if let (Some(b), Some(more)) = (test["broker_config"].as_object_mut(), extra.as_object()) {
            b.extend(more.clone());
        }
        test
    };
    let r = check(&config(json!({})), h.ops.clone(), Some(&log(&RECORDS)));
    assert_eq!(r.anomaly_types, vec!["zombie-commit"], "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    let why = entries(&r, "zombie-commit")[0]["allowed"].to_string();
    assert!(why.contains("the group's partition"), "{why}");
    // With every message flushed nothing acknowledged was lost.
    let flushed = config(json!({"log.flush.interval.messages": "1"}));
    let r = check(&flushed, h.ops.clone(), Some(&log(&RECORDS)));
    assert_eq!(r.valid, Validity::Invalid, "{}", r.summary(5));
}

/// Four acknowledged values; m1 reads two in generation 1 and commits 2.
fn committed_two() -> Hist {
    let mut h = Hist::new();
    h.send(0, &[1, 2], Ok, Some(0));
    h.send(0, &[3, 4], Ok, Some(2));
    group_poll(&mut h, 1, "m1", 1, 0, &RECORDS[..2]);
    h
}

#[test]
fn a_member_resuming_below_an_acknowledged_commit_shows_it_lost() {
    let mut h = committed_two();
    let (inv, done) = commit(&mut h, 1, "m1", 1, 2, Ok);
    // m2 joins generation 2 after the commit was acknowledged, and is told to start at 0.
    let read = group_poll(&mut h, 2, "m2", 2, 0, &RECORDS);
    commit(&mut h, 2, "m2", 2, 4, Ok);
    let r = judge(&h, &log(&RECORDS));
    assert_eq!(r.anomaly_types, vec!["commit-lost"], "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "commit-lost")[0];
    assert_eq!(
        (
            e["op_index"].as_u64(),
            e["from"].as_i64(),
            e["member"].as_str()
        ),
        (Some(read), Some(0), Some("m2"))
    );
    assert_eq!(e["generation"], 2);
    assert_eq!(
        e["commit"],
        json!({"offset": 2, "op_index": done, "invoke_index": inv, "member": "m1"})
    );
    // The same member resuming in a later generation is judged the same way.
    let mut h = committed_two();
    commit(&mut h, 1, "m1", 1, 2, Ok);
    group_poll(&mut h, 1, "m1", 2, 0, &RECORDS);
    let r = judge(&h, &log(&RECORDS));
    assert_eq!(r.anomaly_types, vec!["commit-lost"], "{}", r.summary(5));
}

#[test]
fn a_commit_that_may_have_landed_later_or_was_unanswered_explains_a_lower_resume() {
    // m3's commit of 1 was in flight across m1's commit of 2: the coordinator may have taken it
    // last, and m2 then starts at 1.
    let mut h = committed_two();
    commit_invoked(&mut h, 3);
    commit(&mut h, 1, "m1", 1, 2, Ok);
    commit_done(&mut h, 3, "m3", 1, 1, Ok);
    group_poll(&mut h, 2, "m2", 2, 1, &RECORDS[1..]);
    let r = judge(&h, &log(&RECORDS));
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
    // A commit whose answer was lost after the acknowledged one was invoked may have landed
    // after it, with offsets the history lacks.
    let mut h = committed_two();
    commit_invoked(&mut h, 3);
    commit(&mut h, 1, "m1", 1, 2, Ok);
    commit_done(&mut h, 3, "m3", 1, 0, OpType::Info);
    group_poll(&mut h, 2, "m2", 2, 0, &RECORDS);
    let r = judge(&h, &log(&RECORDS));
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
    // A member that joined before the commit was acknowledged may have fetched the older offset.
    let mut h = committed_two();
    group_poll(&mut h, 2, "m2", 1, 0, &[]);
    commit(&mut h, 1, "m1", 1, 2, Ok);
    group_poll(&mut h, 2, "m2", 2, 0, &RECORDS);
    let r = judge(&h, &log(&RECORDS));
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
}

#[test]
fn a_lost_commit_is_allowed_only_where_the_groups_own_records_may_be_lost() {
    let mut h = committed_two();
    commit(&mut h, 1, "m1", 1, 2, Ok);
    group_poll(&mut h, 2, "m2", 2, 0, &RECORDS);
    let r = check(
        &json!({"workload_options": {"producer": "idempotent", "consumer": "group"},
                "unclean_leader_election": true}),
        h.ops.clone(),
        Some(&log(&RECORDS)),
    );
    assert_eq!(r.anomaly_types, vec!["commit-lost"], "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
}

#[test]
fn a_duplicate_of_an_idempotent_send_is_invalid() {
    let mut h = Hist::new();
    h.push(
        Process::Client(0),
        Invoke,
        "send",
        json!({"topic": "t", "partition": 0, "values": [1]}),
        None,
    );
    // The first attempt's answer was lost; the retry was appended again instead of answered
    // with the first copy's offset.
    h.push(
        Process::Client(0),
        Ok,
        "send",
        json!({"topic": "t", "partition": 0, "values": [1], "offset": 1, "attempts": 2}),
        None,
    );
    let records = [(0, 1, 0), (1, 1, 0)];
    let r = judge(&h, &log(&records));
    assert_eq!(r.valid, Validity::Invalid, "{}", r.summary(5));
    assert!(r.bad_anomaly_types.contains(&"duplicate".to_string()));
    let places: &Value = &entries(&r, "duplicate")[0]["places"];
    assert_eq!(places.as_array().unwrap().len(), 2);
}
