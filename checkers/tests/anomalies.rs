//! One tiny history per anomaly that must fire, and clean ones that must not (the pattern of
//! Jepsen's `kafka_test.clj`).

mod support;

use serde_json::{json, Value};
use support::{entries, replica, Hist};
use tidemark_checkers::{
    check, check_history, read_history, OpType, Process, Record, ReplicaState, Results,
    UncleanElection, Validity,
};

use OpType::{Fail, Info, Ok};

fn run(h: &Hist, replicas: Option<&[ReplicaState]>) -> Results {
    check(&json!({}), h.ops.clone(), replicas)
}

fn only(r: &Results, kinds: &[&str]) {
    assert_eq!(r.anomaly_types, kinds, "{}", r.summary(5));
}

/// Cluster a's leader n1 and follower n2 of t/0, both holding `records` up to their end.
fn leader_and_follower(records: &[(i64, i64, i64)]) -> Vec<ReplicaState> {
    let hw = records.len() as i64;
    vec![
        replica("a", "n1", true, hw, records),
        replica("a", "n2", false, hw, records),
    ]
}

/// Three acknowledged writes, read back, with three agreeing replicas.
fn clean() -> (Hist, Vec<ReplicaState>) {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.send(1, &[2, 3], Ok, Some(1));
    h.poll(2, 0, &[(0, 1, 0), (1, 2, 0), (2, 3, 0)], Some(3));
    h.poll(2, 1, &[(1, 2, 0), (2, 3, 0)], Some(3));
    let recs = [(0, 1, 0), (1, 2, 0), (2, 3, 0)];
    let replicas = vec![
        replica("a", "n1", true, 3, &recs),
        replica("a", "n2", false, 3, &recs),
        replica("a", "n3", false, 3, &recs),
    ];
    (h, replicas)
}

#[test]
fn clean_history_is_valid() {
    let (h, replicas) = clean();
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    assert!(r.anomaly_types.is_empty());
    assert_eq!(r.stats["send"].ok, 2);
    assert_eq!(r.stats["poll"].ok, 2);
    assert!(
        !r.skipped_checks
            .iter()
            .any(|s| s.check == "lost-write" || s.check == "divergence"),
        "{:?}",
        r.skipped_checks
    );
}

/// `true` promises that nothing acknowledged was lost and no replicas diverged: without the
/// final replica states neither can be judged, so a clean history alone is unknown.
#[test]
fn clean_history_without_replicas_is_unknown() {
    let (h, _) = clean();
    let r = run(&h, None);
    assert_eq!(r.valid, Validity::Unknown, "{}", r.summary(5));
    assert!(r.anomaly_types.is_empty());
    let skipped: Vec<&str> = r.skipped_checks.iter().map(|s| s.check.as_str()).collect();
    assert!(skipped.contains(&"divergence"), "{skipped:?}");
    assert!(skipped.contains(&"lost-write"), "{skipped:?}");
}

/// A forbidden anomaly found in a partial history still decides `false`.
#[test]
fn forbidden_anomaly_without_replicas_is_invalid() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.poll(1, 0, &[(0, 1, 0), (1, 1, 0)], None);
    assert_eq!(run(&h, None).valid, Validity::Invalid);
}

/// A partition whose replicas could not be read cannot be judged for lost writes.
#[test]
fn a_partition_without_readable_replicas_is_unknown() {
    let (h, mut replicas) = clean();
    for r in &mut replicas {
        r.error = Some("connection refused".into());
        r.records.clear();
    }
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Unknown, "{}", r.summary(5));
}

#[test]
fn clean_history_with_fail_and_info_sends_is_valid() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.send(1, &[2], Fail, None);
    h.send(2, &[3], Info, None);
    h.send(3, &[4], Info, None);
    h.poll(4, 0, &[(0, 1, 0), (1, 3, 0)], Some(2));
    let recs = [(0, 1, 0), (1, 3, 0)];
    let replicas = leader_and_follower(&recs);
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    assert_eq!(r.stats["send"].info, 2);
    assert_eq!(r.stats["send"].fail, 1);
}

#[test]
fn lost_write_against_the_final_log() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    let acked = h.send(0, &[2], Ok, Some(1));
    let replicas = vec![replica("a", "n1", true, 1, &[(0, 1, 0), (1, 2, 0)])];
    let r = run(&h, Some(&replicas));
    only(&r, &["lost-write"]);
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "lost-write")[0];
    assert_eq!(e["value"], 2);
    assert_eq!(e["op_index"], acked);
    assert_eq!(e["offset"], 1);
    assert_eq!(e["final_log"]["node"], "n1");
    assert_eq!(e["final_log"]["high_watermark"], 1);
}

#[test]
fn writes_below_the_log_start_were_retained_away_not_lost() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.send(0, &[2], Ok, Some(1));
    let mut leader = replica("a", "n1", true, 2, &[(1, 2, 0)]);
    leader.log_start_offset = Some(1);
    let r = run(&h, Some(&[leader]));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
}

#[test]
fn lost_write_proven_by_a_poll_that_read_past_it() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    let acked = h.send(0, &[2], Ok, Some(1));
    h.send(0, &[3], Ok, Some(2));
    let poll = h.poll(1, 0, &[(0, 1, 0), (2, 3, 0)], None);
    let r = run(&h, None);
    only(&r, &["lost-write"]);
    let e = &entries(&r, "lost-write")[0];
    assert_eq!(
        (e["value"].clone(), e["op_index"].clone()),
        (json!(2), json!(acked))
    );
    assert_eq!(e["read_past_by"]["poll"], poll);
}

#[test]
fn unread_write_is_not_lost_without_replicas() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.send(0, &[2], Ok, Some(1));
    h.poll(1, 0, &[(0, 1, 0)], None);
    h.poll(1, 3, &[], None);
    let r = run(&h, None);
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Unknown, "lost-write could not be judged");
}

#[test]
fn lost_write_is_allowed_under_unclean_election() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    let replicas = vec![replica("a", "n1", true, 0, &[])];
    let r = check(
        &json!({"unclean_leader_election": true}),
        h.ops.clone(),
        Some(&replicas),
    );
    assert_eq!(r.anomaly_types, ["lost-write"]);
    assert!(r.bad_anomaly_types.is_empty());
    assert_eq!(r.valid, Validity::Valid);
    h.nemesis(
        "unclean-election",
        json!({"cluster": "a", "topic": "t", "partition": 0, "leader": "n1"}),
    );
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    assert!(r.allowed.contains_key("lost-write"));
}

/// A forced election excuses what it can have truncated: its partition's writes, not another's.
#[test]
fn a_forced_unclean_election_excuses_only_the_partition_it_struck() {
    let struck = |partition: i64| {
        let mut h = Hist::new();
        h.send(0, &[1], Ok, Some(0));
        h.nemesis(
            "unclean-election",
            json!({"cluster": "a", "topic": "t", "partition": partition, "leader": "n1"}),
        );
        h
    };
    let replicas = vec![replica("a", "n1", true, 0, &[])];
    let r = check(
        &json!({"nemesis": "kill,unclean"}),
        struck(1).ops,
        Some(&replicas),
    );
    assert_eq!(r.bad_anomaly_types, ["lost-write"], "{}", r.summary(5));
    let r = run(&struck(0), Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    let e = &entries(&r, "lost-write")[0];
    assert!(
        e["allowed"]
            .as_str()
            .unwrap()
            .contains("forced unclean election"),
        "{e}"
    );
}

/// An election truncates what was written before it, not what its new leader acknowledged.
#[test]
fn a_forced_unclean_election_excuses_no_write_acknowledged_after_it() {
    let mut h = Hist::new();
    h.nemesis(
        "unclean-election",
        json!({"cluster": "a", "topic": "t", "partition": 0, "leader": "n1"}),
    );
    h.send(0, &[1], Ok, Some(0));
    let replicas = vec![replica("a", "n1", true, 0, &[])];
    let r = run(&h, Some(&replicas));
    assert_eq!(r.bad_anomaly_types, ["lost-write"], "{}", r.summary(5));
}

/// An election invoked and never recorded may have struck anywhere.
#[test]
fn an_unclean_election_never_recorded_excuses_lost_writes_anywhere() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.push(
        Process::Nemesis,
        OpType::Invoke,
        "unclean-election",
        json!({}),
        None,
    );
    let replicas = vec![replica("a", "n1", true, 0, &[])];
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    assert!(r.bad_anomaly_types.is_empty());
}

#[test]
fn divergence_between_replicas() {
    let (h, mut replicas) = clean();
    replicas[2].records[1].value = 9;
    let r = run(&h, Some(&replicas));
    only(&r, &["divergence"]);
    let e = &entries(&r, "divergence");
    assert_eq!(e.len(), 1, "one offset where replicas disagree");
    assert_eq!(e[0]["offset"], 1);
    assert_eq!(
        e[0]["replicas"][0]["node"], "n1",
        "the final log is the reference"
    );
    assert_eq!(e[0]["replicas"][0]["record"], json!([1, 2, 0]));
    assert_eq!(e[0]["replicas"][1]["node"], "n3");
    assert_eq!(e[0]["replicas"][1]["record"], json!([1, 9, 0]));
    assert_eq!(e[0]["differing_replicas"], 1);
    assert_eq!(e[0]["compared_replicas"], 3);
}

/// Each replica is compared with one reference per offset, not with every other replica: many
/// replicas give one entry per offset where they disagree, with exact counts and a bounded
/// list of examples.
#[test]
fn divergence_among_many_replicas_is_counted_per_offset() {
    const N: usize = 3000;
    let mut h = Hist::new();
    h.send(0, &(0..50).collect::<Vec<i64>>(), Ok, Some(0));
    let recs: Vec<(i64, i64, i64)> = (0..50).map(|o| (o, o, 0)).collect();
    let mut replicas: Vec<ReplicaState> = (0..N)
        .map(|n| replica("a", &format!("n{n}"), n == 0, 50, &recs))
        .collect();
    replicas[7].records[10].value = 1000;
    replicas[9].records.remove(20);
    for r in &mut replicas[1..] {
        r.records.last_mut().unwrap().epoch = Some(1);
    }
    let r = run(&h, Some(&replicas));
    assert_eq!(r.bad_anomaly_types, ["divergence"], "{}", r.summary(2));
    assert_eq!(r.anomaly_counts["divergence"], 3);
    let e = entries(&r, "divergence");
    let at = |o: i64| e.iter().find(|x| x["offset"] == o).unwrap();
    assert_eq!(at(10)["differing_replicas"], 1);
    assert_eq!(at(10)["compared_replicas"], N);
    assert_eq!(at(10)["replicas"][1]["node"], "n7");
    assert_eq!(at(20)["replicas"][1]["node"], "n9");
    assert_eq!(at(20)["replicas"][1]["record"], Value::Null);
    assert_eq!(at(49)["replicas"][0]["node"], "n0");
    assert_eq!(at(49)["differing_replicas"], N - 1);
    let listed = at(49)["replicas"].as_array().unwrap().len();
    assert!(listed > 2 && listed < 20, "{listed} replicas listed");
}

/// Records above a replica's own high watermark are not `divergence` (it may not have learnt
/// yet that they are committed), but once the faults are healed and replicas have had time to
/// converge, every replica should hold the final log: one that still keeps records the final log
/// contradicts below its high watermark never truncated to its leader's lineage.
#[test]
fn a_tail_above_a_replicas_high_watermark_is_a_divergent_tail_not_divergence() {
    let (h, mut replicas) = clean();
    replicas[2].high_watermark = Some(1);
    replicas[2].records[1] = Record::new(1, 9, 1);
    replicas[2].records[2] = Record::new(2, 8, 1);
    let r = run(&h, Some(&replicas));
    only(&r, &["divergent-tail"]);
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "divergent-tail");
    assert_eq!(e.len(), 1, "one entry per replica");
    assert_eq!(e[0]["node"], "n3");
    assert_eq!(e[0]["offset"], 1);
    assert_eq!(e[0]["record"], json!([1, 9, 1]));
    assert_eq!(e[0]["final"]["node"], "n1");
    assert_eq!(e[0]["final"]["record"], json!([1, 2, 0]));
    assert_eq!(e[0]["differing_records"], 2);
    assert_eq!(e[0]["last_differing_offset"], 2);
}

/// Judged only where the partition served reads after the last fault: an offline partition has
/// no leader to catch up from.
#[test]
fn a_replica_that_never_caught_up_is_lagging() {
    let (mut h, mut replicas) = clean();
    replicas[1].high_watermark = Some(1);
    replicas[1].records.truncate(1);
    replicas[1].log_end_offset = Some(1);
    let r = run(&h, Some(&replicas));
    only(&r, &["lagging-replica"]);
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "lagging-replica");
    assert_eq!(e.len(), 1);
    assert_eq!(e[0]["node"], "n2");
    assert_eq!(e[0]["log_end_offset"], 1);
    assert_eq!(e[0]["behind"], 2);
    assert_eq!(e[0]["final"], json!({"node": "n1", "high_watermark": 3}));

    h.nemesis("kill", json!({"nodes": ["n1", "n2", "n3"]}));
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
}

/// The runner's `converge` op found n3 at its leader's log end and still outside the ISR once
/// every fault was healed: never let back in.
#[test]
fn a_caught_up_replica_left_out_of_the_isr_is_under_replicated() {
    let converge = |converged: bool| {
        let out = json!([{"topic": "t", "partition": 0, "node": "n3", "leader": "n1",
            "isr": ["n1", "n2"], "log_end_offset": 3}]);
        let mut v = json!({"timeout_s": 10.0, "converged": converged});
        if !converged {
            v["reasons"] = json!([]);
            v["out_of_isr"] = out;
        }
        v
    };
    let (mut h, replicas) = clean();
    h.nemesis("converge", converge(false));
    h.poll(3, 0, &[(0, 1, 0), (1, 2, 0), (2, 3, 0)], Some(3));
    let r = run(&h, Some(&replicas));
    only(&r, &["under-replicated"]);
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "under-replicated");
    assert_eq!(e.len(), 1);
    assert_eq!(e[0]["node"], "n3");
    assert_eq!(e[0]["leader"], "n1");
    assert_eq!(e[0]["isr"], json!(["n1", "n2"]));
    assert_eq!(e[0]["op_index"], 9, "the converge op's completion");

    // Converged: nothing to report.
    let (mut h, replicas) = clean();
    h.nemesis("converge", converge(true));
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
}

/// A partition still without a leader once every fault was healed: offline, unless a wipe lost
/// a log directory its election could have needed.
#[test]
fn a_partition_without_a_leader_after_the_heal_is_offline() {
    let offline = json!({"timeout_s": 10.0, "converged": false, "reasons": [],
        "leaderless": [{"topic": "t", "partition": 0}], "out_of_isr": []});
    let (mut h, replicas) = clean();
    h.nemesis("converge", offline.clone());
    let r = run(&h, Some(&replicas));
    only(&r, &["offline-partition"]);
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "offline-partition");
    assert_eq!(e.len(), 1);
    assert_eq!(
        (e[0]["topic"].clone(), e[0]["partition"].clone()),
        (json!("t"), json!(0))
    );

    let (mut h, replicas) = clean();
    h.nemesis("wipe", json!({"nodes": ["n1"], "deleted": {"n1": ["t-0"]}}));
    h.nemesis("converge", offline);
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    assert_eq!(r.anomaly_types, ["offline-partition"], "seen, and allowed");
}

/// The runner's `converge` op found every replica of t/0 in the ISR at log end 3 and the
/// leader's high watermark still at 1: the last two records were never committed.
#[test]
fn a_high_watermark_below_what_the_whole_isr_holds_is_stuck() {
    let stuck = json!({"timeout_s": 10.0, "converged": false, "reasons": [], "leaderless": [],
        "out_of_isr": [], "stuck_high_watermarks": [{"topic": "t", "partition": 0,
        "leader": "n1", "high_watermark": 1, "log_end_offset": 3}]});
    let (mut h, replicas) = clean();
    h.nemesis("converge", stuck);
    let r = run(&h, Some(&replicas));
    only(&r, &["stuck-high-watermark"]);
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "stuck-high-watermark");
    assert_eq!(e.len(), 1);
    assert_eq!(
        (
            &e[0]["leader"],
            &e[0]["high_watermark"],
            &e[0]["log_end_offset"]
        ),
        (&json!("n1"), &json!(1), &json!(3))
    );

    // A converge op from before the field existed, not converged for other reasons: nothing.
    let (mut h, replicas) = clean();
    h.nemesis(
        "converge",
        json!({"timeout_s": 10.0, "converged": false, "reasons": ["n2 behind"]}),
    );
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
}

/// A follower's high watermark trails the leader's by a fetch: with every record in place it
/// has converged.
#[test]
fn a_replica_holding_the_final_log_under_a_lower_high_watermark_has_converged() {
    let (h, mut replicas) = clean();
    replicas[2].high_watermark = Some(1);
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    assert!(r.anomaly_types.is_empty());
}

/// Replicas that each came back from a cluster-wide power loss with their own durable prefix
/// may keep tails their epochs cannot tell apart (see `divergence`), but no fault excuses a
/// replica that never caught up.
#[test]
fn a_cluster_wide_power_loss_allows_a_divergent_tail_never_a_lagging_replica() {
    let (mut h, mut replicas) = clean();
    h.nemesis(
        "power-loss",
        json!({"nodes": ["n1", "n2", "n3"], "seed": 3, "cluster_wide": true, "dropped": {}}),
    );
    h.poll(3, 0, &[(0, 1, 0), (1, 2, 0), (2, 3, 0)], Some(3));
    replicas[2].high_watermark = Some(1);
    replicas[2].records[2] = Record::new(2, 8, 1);
    let r = run(&h, Some(&replicas));
    assert_eq!(r.anomaly_types, ["divergent-tail"], "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Valid);
    assert!(r.allowed["divergent-tail"].contains("lost power"));

    replicas[1].records.truncate(2);
    replicas[1].log_end_offset = Some(2);
    let r = run(&h, Some(&replicas));
    assert_eq!(r.bad_anomaly_types, ["lagging-replica"], "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Invalid);
}

#[test]
fn divergence_is_never_allowed_by_unclean_elections() {
    let (mut h, mut replicas) = clean();
    h.nemesis(
        "unclean-election",
        json!({"cluster": "a", "topic": "t", "partition": 0}),
    );
    replicas[1].records[0].epoch = Some(5);
    let r = check(
        &json!({"unclean_leader_election": true}),
        h.ops.clone(),
        Some(&replicas),
    );
    assert!(
        r.bad_anomaly_types.contains(&"divergence".to_owned()),
        "{}",
        r.summary(5)
    );
    assert_eq!(r.valid, Validity::Invalid);
}

/// Divergence is judged within each cluster: two clusters that each agree inside but hold
/// different records (node names repeated across them) are not a divergence (comparing clusters
/// is mirror-divergence's business), and a divergence inside one cluster names that cluster.
#[test]
fn divergence_is_judged_per_cluster_never_across_clusters() {
    let mut h = Hist::new();
    h.send_on(Some("a"), 0, &[1], Ok, Some(0));
    h.send_on(Some("b"), 1, &[7], Ok, Some(0));
    let (on_a, on_b) = ([(0, 1, 0)], [(0, 7, 0)]);
    let mut replicas = vec![
        replica("a", "n1", true, 1, &on_a),
        replica("a", "n2", false, 1, &on_a),
        replica("b", "n1", true, 1, &on_b),
        replica("b", "n2", false, 1, &on_b),
    ];
    let r = run(&h, Some(&replicas));
    assert!(
        !r.anomaly_types.iter().any(|t| t == "divergence"),
        "{}",
        r.summary(5)
    );
    replicas[3].records[0].value = 8;
    let r = run(&h, Some(&replicas));
    let e = entries(&r, "divergence");
    assert_eq!(e.len(), 1, "{}", r.summary(5));
    assert_eq!(e[0]["cluster"], "b");
    assert_eq!(e[0]["compared_replicas"], 2);
    assert_eq!(e[0]["replicas"][0]["record"], json!([0, 7, 0]));
    assert_eq!(e[0]["replicas"][1]["record"], json!([0, 8, 0]));
}

/// Two clusters, cluster b mirroring a: values 1 and 2 are written on a.
fn mirrored() -> (Hist, Vec<ReplicaState>) {
    let mut h = Hist::new();
    h.send_on(Some("a"), 0, &[1], Ok, Some(0));
    h.send_on(Some("a"), 0, &[2], Ok, Some(1));
    h.poll_on(Some("b"), 1, 0, &[(0, 1, 0), (1, 2, 0)], Some(2));
    let recs = [(0, 1, 0), (1, 2, 0)];
    let replicas = vec![
        replica("a", "n1", true, 2, &recs),
        replica("b", "n4", true, 2, &recs),
    ];
    (h, replicas)
}

#[test]
fn clean_mirror_is_valid() {
    let (h, replicas) = mirrored();
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    assert!(r
        .skipped_checks
        .iter()
        .all(|s| s.check != "mirror-divergence"));
}

#[test]
fn mirror_divergence_between_clusters() {
    let (mut h, mut replicas) = mirrored();
    h.ops.truncate(4);
    h.send_on(Some("a"), 0, &[3], Info, None);
    replicas[1].records[1] = tidemark_checkers::Record::new(1, 3, 0);
    let r = run(&h, Some(&replicas));
    only(&r, &["mirror-divergence"]);
    let e = &entries(&r, "mirror-divergence")[0];
    assert_eq!(e["offset"], 1);
    assert_eq!(e["clusters"][0]["record"][1], 2);
    assert_eq!(e["clusters"][1]["record"][1], 3);
}

#[test]
fn mirror_divergence_allowed_under_unclean_without_support() {
    let (mut h, mut replicas) = mirrored();
    h.send_on(Some("a"), 0, &[3], Info, None);
    replicas[1].records[1] = tidemark_checkers::Record::new(1, 3, 0);
    h.nemesis(
        "unclean-election",
        json!({"cluster": "b", "topic": "t", "partition": 0}),
    );
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    let supported = json!({"topic_config": {"mirror.support.unclean.leader.election": "true"}});
    let r = check(&supported, h.ops.clone(), Some(&replicas));
    assert_eq!(r.bad_anomaly_types, ["mirror-divergence"]);
}

#[test]
fn mirror_divergence_is_skipped_when_the_run_ends_failed_over() {
    let (mut h, mut replicas) = mirrored();
    h.nemesis("failover", json!({"from": "a", "to": "b", "topics": ["t"]}));
    h.send_on(Some("b"), 2, &[3], Ok, Some(1));
    replicas[1].records[1] = tidemark_checkers::Record::new(1, 3, 1);
    replicas[1].epochs.push(tidemark_checkers::EpochEntry {
        epoch: 1,
        start_offset: 1,
    });
    let r = run(&h, Some(&replicas));
    assert!(
        !r.anomaly_types.contains(&"mirror-divergence".to_owned()),
        "{}",
        r.summary(5)
    );
    assert!(r
        .skipped_checks
        .iter()
        .any(|s| s.check == "mirror-divergence"));
}

#[test]
fn epoch_ownership_across_clusters() {
    let mut h = Hist::new();
    h.send_on(Some("a"), 0, &[1], Ok, Some(0));
    h.send_on(Some("b"), 1, &[2], Ok, Some(1));
    let recs = [(0, 1, 4), (1, 2, 4)];
    let replicas = vec![
        replica("a", "n1", true, 2, &recs),
        replica("b", "n4", true, 2, &recs),
    ];
    let r = run(&h, Some(&replicas));
    only(&r, &["epoch-ownership"]);
    let e = &entries(&r, "epoch-ownership")[0];
    assert_eq!(e["epoch"], 4);
    assert_eq!(e["records"][0]["origin"], "a");
    assert_eq!(e["records"][1]["origin"], "b");
}

/// A poll carrying a leader epoch older than its client's latest (`stale_epoch`): refused, it
/// changes nothing; served with a record of a later epoch, the broker did not fence it (KIP-320).
#[test]
fn a_stale_epoch_served_past_its_epoch_is_epoch_above_leader() {
    let (mut h, replicas) = clean();
    let stale = json!({"topic": "t", "partition": 0, "from": 2, "stale_epoch": true});
    h.push(
        Process::Client(3),
        OpType::Invoke,
        "poll",
        stale.clone(),
        None,
    );
    h.push(Process::Client(3), Fail, "poll", stale.clone(), None);
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));

    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.send(1, &[2], Ok, Some(1));
    h.poll(2, 0, &[(0, 1, 0), (1, 2, 1)], Some(2));
    h.push(
        Process::Client(3),
        OpType::Invoke,
        "poll",
        stale.clone(),
        None,
    );
    let mut done = stale;
    done["from"] = json!(1);
    done["records"] = json!([[1, 2, 1]]);
    done["high_watermark"] = json!(2);
    done["leader_epoch"] = json!(0);
    let bad = h.push(Process::Client(3), Ok, "poll", done, None);
    let recs = [(0, 1, 0), (1, 2, 1)];
    let replicas = leader_and_follower(&recs);
    let r = run(&h, Some(&replicas));
    only(&r, &["epoch-above-leader"]);
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "epoch-above-leader")[0];
    assert_eq!(e["op_index"], bad);
    assert_eq!(
        (e["leader_epoch"].clone(), e["record"].clone()),
        (json!(0), json!([1, 2, 1]))
    );
}

#[test]
fn inconsistent_offsets_between_ack_and_poll() {
    let mut h = Hist::new();
    let acked = h.send(0, &[1], Ok, Some(0));
    h.send(1, &[2], Info, None);
    let poll = h.poll(2, 0, &[(0, 2, 0)], None);
    let r = run(&h, None);
    only(&r, &["inconsistent-offsets"]);
    let e = &entries(&r, "inconsistent-offsets")[0];
    assert_eq!(e["offset"], 0);
    assert_eq!(
        e["values"],
        json!([{"value": 1, "seen_by": {"send": acked}}, {"value": 2, "seen_by": {"poll": poll}}])
    );
}

#[test]
fn duplicate_value_at_two_offsets() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.poll(1, 0, &[(0, 1, 0), (1, 1, 0)], None);
    let r = run(&h, None);
    only(&r, &["duplicate"]);
    let e = &entries(&r, "duplicate")[0];
    assert_eq!(e["value"], 1);
    assert_eq!(e["places"][0]["offset"], 0);
    assert_eq!(e["places"][1]["offset"], 1);
}

#[test]
fn unexpected_value() {
    let mut h = Hist::new();
    let poll = h.poll(1, 0, &[(0, 99, 0)], None);
    let r = run(&h, None);
    only(&r, &["unexpected-value"]);
    let e = &entries(&r, "unexpected-value")[0];
    assert_eq!(
        (e["value"].clone(), e["seen_by"]["poll"].clone()),
        (json!(99), json!(poll))
    );
}

#[test]
fn aborted_read_is_for_fail_only() {
    let mut h = Hist::new();
    let failed = h.send(0, &[5], Fail, None);
    h.send(1, &[6], Info, None);
    let poll = h.poll(2, 0, &[(0, 5, 0), (1, 6, 0)], None);
    let r = run(&h, None);
    only(&r, &["aborted-read"]);
    let e = entries(&r, "aborted-read");
    assert_eq!(e.len(), 1);
    assert_eq!(e[0]["value"], 5);
    assert_eq!(e[0]["op_index"], failed);
    assert_eq!(e[0]["seen_by"]["poll"], poll);
}

#[test]
fn aborted_read_in_the_final_log() {
    let mut h = Hist::new();
    h.send(0, &[5], Fail, None);
    let replicas = vec![replica("a", "n1", true, 1, &[(0, 5, 0)])];
    let r = run(&h, Some(&replicas));
    only(&r, &["aborted-read"]);
    assert_eq!(
        entries(&r, "aborted-read")[0]["seen_by"]["final_log"]["node"],
        "n1"
    );
}

#[test]
fn poll_skip_against_other_polls() {
    let mut h = Hist::new();
    h.send(0, &[1, 2, 3], Ok, Some(0));
    let skipping = h.poll(1, 0, &[(0, 1, 0), (2, 3, 0)], None);
    h.poll(2, 1, &[(1, 2, 0)], None);
    let r = run(&h, None);
    only(&r, &["poll-skip"]);
    let e = &entries(&r, "poll-skip")[0];
    assert_eq!(e["op_index"], skipping);
    assert_eq!(e["after"], 0);
    assert_eq!(e["next"], 2);
    assert_eq!(e["skipped"], json!([1]));
}

#[test]
fn poll_skip_at_the_start_against_the_final_log() {
    let mut h = Hist::new();
    h.send(0, &[1, 2], Ok, Some(0));
    h.poll(1, 0, &[(1, 2, 0)], None);
    let replicas = vec![replica("a", "n1", true, 2, &[(0, 1, 0), (1, 2, 0)])];
    let r = run(&h, Some(&replicas));
    only(&r, &["poll-skip"]);
    let e = &entries(&r, "poll-skip")[0];
    assert_eq!(
        (e["from"].clone(), e["after"].clone()),
        (json!(0), Value::Null)
    );
    assert_eq!(e["reference"], "final log");
}

#[test]
fn a_poll_of_a_history_rewritten_later_is_not_judged_against_the_final_log() {
    let mut h = Hist::new();
    h.send(0, &[1, 2, 3], Ok, Some(0));
    h.send(1, &[7], Info, None);
    // Served where offset 1 held no record (a control batch) and 2 held 7, in a history a
    // failback's truncation later replaced with the final log's.
    h.poll(2, 1, &[(2, 7, 5)], None);
    let replicas = vec![replica(
        "a",
        "n1",
        true,
        3,
        &[(0, 1, 0), (1, 2, 0), (2, 3, 0)],
    )];
    let r = run(&h, Some(&replicas));
    only(&r, &["inconsistent-offsets"]);
}

#[test]
fn gaps_without_records_are_not_skips() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.send(0, &[2], Ok, Some(2));
    h.poll(1, 0, &[(0, 1, 0), (2, 2, 0)], None);
    let replicas = vec![replica("a", "n1", true, 3, &[(0, 1, 0), (2, 2, 0)])];
    assert_eq!(run(&h, Some(&replicas)).valid, Validity::Valid);
}

#[test]
fn nonmonotonic_poll() {
    let mut h = Hist::new();
    h.send(0, &[1, 2], Ok, Some(0));
    let poll = h.poll(1, 0, &[(1, 2, 0), (0, 1, 0)], None);
    let r = run(&h, None);
    only(&r, &["nonmonotonic-poll"]);
    let e = &entries(&r, "nonmonotonic-poll")[0];
    assert_eq!(
        (e["op_index"].clone(), e["offsets"].clone()),
        (json!(poll), json!([1, 0]))
    );
}

#[test]
fn epoch_regression_in_records_and_cache() {
    let mut h = Hist::new();
    h.send(0, &[1, 2], Ok, Some(0));
    let mut replicas = vec![replica("a", "n1", true, 2, &[(0, 1, 3), (1, 2, 2)])];
    let r = run(&h, Some(&replicas));
    only(&r, &["epoch-regression"]);
    let e = entries(&r, "epoch-regression");
    assert!(
        e.iter()
            .any(|e| e["records"] == json!([[0, 1, 3], [1, 2, 2]])),
        "{e:?}"
    );
    assert!(
        e.iter().any(|e| e["epochs"] == json!([[3, 0], [2, 1]])),
        "{e:?}"
    );
    replicas[0] = replica("a", "n1", true, 2, &[(0, 1, 3), (1, 2, 3)]);
    replicas[0].epochs = vec![(3, 0).into(), (4, 0).into()];
    let r = run(&h, Some(&replicas));
    only(&r, &["epoch-regression"]);
    assert_eq!(
        entries(&r, "epoch-regression")[0]["epochs"],
        json!([[3, 0], [4, 0]])
    );
}

#[test]
fn epoch_regression_within_a_poll() {
    let mut h = Hist::new();
    h.send(0, &[1, 2], Ok, Some(0));
    let poll = h.poll(1, 0, &[(0, 1, 3), (1, 2, 2)], None);
    let r = run(&h, None);
    only(&r, &["epoch-regression"]);
    assert_eq!(entries(&r, "epoch-regression")[0]["op_index"], poll);
}

/// I4: a consumer never reads at or above the high watermark. The response that returned the
/// records reported it, so one poll proves it: the leader served what its ISR may not hold.
#[test]
fn read_above_the_high_watermark_its_own_response_reported() {
    let mut h = Hist::new();
    h.send(0, &[1, 2, 3], Ok, Some(0));
    let bad = h.poll(1, 0, &[(0, 1, 0), (1, 2, 0), (2, 3, 0)], Some(1));
    let r = run(&h, None);
    only(&r, &["read-above-high-watermark"]);
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "read-above-high-watermark")[0];
    assert_eq!(e["op_index"], bad);
    assert_eq!(
        (
            e["high_watermark"].clone(),
            e["record"].clone(),
            e["records_above"].clone()
        ),
        (json!(1), json!([1, 2, 0]), json!(2))
    );
}

/// Records just below the high watermark are committed; a poll without one (an older history,
/// or a read that failed) is not judged.
#[test]
fn reads_below_the_high_watermark_or_without_one_are_not_judged() {
    let mut h = Hist::new();
    h.send(0, &[1, 2, 3], Ok, Some(0));
    h.poll(1, 0, &[(0, 1, 0), (1, 2, 0), (2, 3, 0)], Some(3));
    h.poll(2, 1, &[(1, 2, 0), (2, 3, 0)], None);
    let r = run(&h, None);
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
}

/// An acks=all send is acknowledged once the high watermark passes it, and under one leader
/// epoch the high watermark never goes back: a poll the acknowledging node served under the
/// epoch the record was written in, invoked after the acknowledgement, reporting it at or below
/// the record, proves the leader acknowledged what its ISR did not hold.
#[test]
fn ack_above_the_high_watermark_of_its_leader_epoch() {
    let recs = [(0, 1, 3), (1, 2, 3)];
    let replicas = leader_and_follower(&recs);
    let mut h = Hist::new();
    let send = h.send(0, &[1, 2], Ok, Some(0));
    h.ops[send as usize].node = Some("n1".into());
    let bad = h.poll_in_epoch(1, 1, 3);
    h.ops[bad as usize].node = Some("n1".into());
    let r = run(&h, Some(&replicas));
    only(&r, &["ack-above-high-watermark"]);
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "ack-above-high-watermark")[0];
    assert_eq!(
        (e["op_index"].clone(), e["high_watermark"].clone()),
        (json!(bad), json!(1))
    );
    assert_eq!(e["leader_epoch"], 3);
    assert_eq!(
        e["send"],
        json!({"op_index": send, "value": 2, "offset": 1})
    );
}

/// Not judged: a poll under another leader epoch (a new leader's high watermark lags until its
/// followers report), a poll invoked before the acknowledgement, a high watermark above the
/// record, a poll served by another node than the one that acknowledged (an idempotent retry
/// acknowledged by the next leader while the old one, cut off, still serves its epoch), or a
/// history without the final log that tells the record's epoch.
#[test]
fn acks_below_the_high_watermark_or_not_ordered_with_the_poll_are_not_judged() {
    let recs = [(0, 1, 3), (1, 2, 3)];
    let replicas = leader_and_follower(&recs);
    let on = |h: &mut Hist, op: u64, node: &str| h.ops[op as usize].node = Some(node.into());
    let mut h = Hist::new();
    let inv = json!({"topic": "t", "partition": 0, "from": 0});
    h.push(
        Process::Client(2),
        OpType::Invoke,
        "poll",
        inv.clone(),
        None,
    );
    let send = h.send(0, &[1, 2], Ok, Some(0));
    on(&mut h, send, "n1");
    let mut done = inv;
    done["high_watermark"] = json!(0);
    done["leader_epoch"] = json!(3);
    let overlapping = h.push(Process::Client(2), OpType::Ok, "poll", done, None);
    on(&mut h, overlapping, "n1");
    let other_epoch = h.poll_in_epoch(1, 0, 4);
    on(&mut h, other_epoch, "n1");
    let other_node = h.poll_in_epoch(1, 1, 3);
    on(&mut h, other_node, "n2");
    let above = h.poll_in_epoch(1, 2, 3);
    on(&mut h, above, "n1");
    let r = run(&h, Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));

    let mut h = Hist::new();
    let send = h.send(0, &[1, 2], Ok, Some(0));
    on(&mut h, send, "n1");
    let poll = h.poll_in_epoch(1, 1, 3);
    on(&mut h, poll, "n1");
    let r = run(&h, None);
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
}

/// Three brokers of cluster a, each with its client listener on 9092, and
/// `min.insync.replicas` 2: what the ack-below-min-isr check needs from `test.json`.
fn three_brokers_min_isr_2() -> Value {
    let node = |n: &str| json!({"name": n, "cluster": "a", "port": 9092});
    json!({"nodes": [node("n1"), node("n2"), node("n3")],
           "broker_config": {"min.insync.replicas": "2"}})
}

/// Judged with [`three_brokers_min_isr_2`], `h` shows only `ack-below-min-isr`, at the
/// acknowledgements `expected`.
fn assert_unshared(h: &Hist, replicas: &[ReplicaState], expected: &[u64]) {
    let r = check(&three_brokers_min_isr_2(), h.ops.clone(), Some(replicas));
    only(&r, &["ack-below-min-isr"]);
    assert_eq!(r.valid, Validity::Invalid);
    let found: Vec<u64> = entries(&r, "ack-below-min-isr")
        .iter()
        .filter_map(|e| e["op_index"].as_u64())
        .collect();
    assert_eq!(found, expected);
}

/// The grudge of a `leader-replication` cut of n1: its followers cannot fetch from it.
fn n1_cut_off_on_9092() -> Value {
    json!({"kind": "leader-replication", "ports": [9092],
           "grudge": {"n1": ["n2", "n3"], "n2": ["n1"], "n3": ["n1"]}})
}

/// An acks=all send invoked while the nemesis kept both followers from its leader, and
/// acknowledged before the cut was healed: no other replica can hold it, and with
/// `min.insync.replicas` 2 Kafka answers NOT_ENOUGH_REPLICAS.
#[test]
fn ack_below_min_isr_while_the_leader_is_cut_off() {
    let recs = [(0, 1, 3), (1, 2, 3)];
    let replicas = leader_and_follower(&recs);
    let mut h = Hist::new();
    let first = h.send(0, &[1], Ok, Some(0));
    h.ops[first as usize].node = Some("n1".into());
    h.nemesis("start-partition", n1_cut_off_on_9092());
    let cut = h.ops.len() as u64 - 1;
    let bad = h.send(1, &[2], Ok, Some(1));
    h.ops[bad as usize].node = Some("n1".into());
    h.nemesis_invoke("stop-partition", json!({}));
    let r = check(&three_brokers_min_isr_2(), h.ops.clone(), Some(&replicas));
    only(&r, &["ack-below-min-isr"]);
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "ack-below-min-isr")[0];
    assert_eq!(
        (e["op_index"].clone(), e["node"].clone()),
        (json!(bad), json!("n1"))
    );
    assert_eq!(e["reachable"], json!(["n1"]));
    assert_eq!(e["cut_off_since"], json!({"n2": cut, "n3": cut}));
    assert_eq!(e["min_insync_replicas"], 2);
}

/// Not judged: a send invoked before the cut was in force, one acknowledged after its heal
/// was invoked, one acknowledged while a follower was still reachable, a cut on another port,
/// `min.insync.replicas` 1, and a test that does not record the listeners' ports.
#[test]
fn acks_a_follower_could_have_fetched_are_not_judged() {
    let recs = [(0, 1, 3), (1, 2, 3), (2, 3, 3)];
    let replicas = leader_and_follower(&recs);
    let on = |h: &mut Hist, op: u64| h.ops[op as usize].node = Some("n1".into());
    let mut h = Hist::new();
    h.send_invoke(None, 0, &[1]);
    h.nemesis("start-partition", n1_cut_off_on_9092());
    let before = h.send_done(None, 0, &[1], Ok, Some(0));
    on(&mut h, before);
    h.send_invoke(None, 1, &[2]);
    h.nemesis_invoke("stop-partition", json!({}));
    let healed = h.send_done(None, 1, &[2], Ok, Some(1));
    on(&mut h, healed);
    h.nemesis(
        "start-partition",
        json!({"grudge": {"n1": ["n2"], "n2": ["n1"]}}),
    );
    let one_follower_left = h.send(2, &[3], Ok, Some(2));
    on(&mut h, one_follower_left);
    let test = three_brokers_min_isr_2();
    let r = check(&test, h.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));

    let mut h = Hist::new();
    let mut other_port = n1_cut_off_on_9092();
    other_port["ports"] = json!([9093]);
    h.nemesis("start-partition", other_port);
    let send = h.send(0, &[1], Ok, Some(0));
    on(&mut h, send);
    let recs = [(0, 1, 3)];
    let replicas = leader_and_follower(&recs);
    assert!(check(&test, h.ops.clone(), Some(&replicas))
        .anomaly_types
        .is_empty());

    let mut h = Hist::new();
    h.nemesis("start-partition", n1_cut_off_on_9092());
    let send = h.send(0, &[1], Ok, Some(0));
    on(&mut h, send);
    let mut min_1 = test.clone();
    min_1["broker_config"]["min.insync.replicas"] = json!("1");
    assert!(check(&min_1, h.ops.clone(), Some(&replicas))
        .anomaly_types
        .is_empty());
    let mut no_ports = test;
    for n in no_ports["nodes"].as_array_mut().unwrap() {
        n.as_object_mut().unwrap().remove("port");
    }
    assert!(check(&no_ports, h.ops.clone(), Some(&replicas))
        .anomaly_types
        .is_empty());
}

/// A strand cuts its leader off from every other broker and then kills it; its record bounds
/// when the cut surely held (here from 1.701 s to 5.5 s), and what its leader acknowledged
/// within that time no follower could hold.
#[test]
fn ack_below_min_isr_while_a_strand_held_its_leader_cut_off() {
    let recs = [(0, 1, 3), (1, 2, 3)];
    let replicas = leader_and_follower(&recs);
    let ms = 1_000_000;
    let mut h = Hist::new();
    let strand = h.nemesis_invoke("strand", json!({}));
    let bad = h.send(0, &[1], Ok, Some(0));
    let late = h.send(1, &[2], Ok, Some(1));
    let info = json!({"killed": "n1", "nodes": ["n1"], "ports": [9092], "cut_ms": 4000,
                      "cut_from_ms": 500, "elapsed_ms": 4800, "topic": "t", "partition": 0});
    let done = h.push(Process::Nemesis, OpType::Info, "strand", info, None);
    let times = [
        (strand, 1000),
        (bad - 1, 2000),
        (bad, 3000),
        (late - 1, 5000),
        (late, 5600),
        (done, 6000),
    ];
    for (op, at) in times {
        h.ops[op as usize].time = at * ms;
    }
    for op in [bad, late] {
        h.ops[op as usize].node = Some("n1".into());
    }
    assert_unshared(&h, &replicas, &[bad]);
}

/// Followers killed and paused (as the nemesis recorded them) fetch nothing until started
/// and thawed: an acknowledgement meanwhile held the leader alone.
#[test]
fn ack_below_min_isr_with_both_followers_stopped() {
    let recs = [(0, 1, 3), (1, 2, 3)];
    let replicas = leader_and_follower(&recs);
    let mut h = Hist::new();
    h.nemesis("kill", json!({"nodes": ["n2"]}));
    h.nemesis("pause", json!({"nodes": ["n3"]}));
    let bad = h.send(0, &[1], Ok, Some(0));
    h.ops[bad as usize].node = Some("n1".into());
    h.nemesis_invoke("resume", json!({"nodes": ["n3"]}));
    let fine = h.send(1, &[2], Ok, Some(1));
    h.ops[fine as usize].node = Some("n1".into());
    assert_unshared(&h, &replicas, &[bad]);
}

/// Five brokers, replication factor 3: the partition's replicas are the three the final replica
/// states name, so with both followers killed its leader held the records alone though n4 and
/// n5 ran. Replica states naming fewer replicas than the replication factor are a partial list,
/// and then every broker of the cluster counts, as before.
#[test]
fn ack_below_min_isr_with_both_followers_stopped_among_five_brokers() {
    let node = |i: u32| json!({"name": format!("n{i}"), "cluster": "a", "port": 9092});
    let test = json!({"nodes": (1..=5).map(node).collect::<Vec<_>>(),
                      "broker_config": {"min.insync.replicas": "2"},
                      "broker": {"config": {"default_replication_factor": 3}}});
    let recs = [(0, 1, 3)];
    let mut h = Hist::new();
    h.nemesis("kill", json!({"nodes": ["n2", "n3"]}));
    let bad = h.send(0, &[1], Ok, Some(0));
    h.ops[bad as usize].node = Some("n1".into());
    let mut replicas = leader_and_follower(&recs);
    replicas.push(replica("a", "n3", false, 1, &recs));
    let r = check(&test, h.ops.clone(), Some(&replicas));
    only(&r, &["ack-below-min-isr"]);
    let e = &entries(&r, "ack-below-min-isr")[0];
    assert_eq!(e["op_index"], json!(bad));
    assert_eq!(e["reachable"], json!(["n1"]));
    replicas.pop();
    let r = check(&test, h.ops.clone(), Some(&replicas));
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
}

/// Within one leader epoch the leader's high watermark only grows: a poll that started after
/// another had finished, served under the same epoch, must not see a lower one, fault or not.
#[test]
fn hw_regression_within_one_leader_epoch() {
    let mut h = Hist::new();
    let first = h.poll_in_epoch(1, 37, 3);
    h.nemesis("kill", json!({"nodes": ["n1"]}));
    let second = h.poll_in_epoch(2, 31, 3);
    let r = run(&h, None);
    only(&r, &["hw-regression"]);
    assert_eq!(r.valid, Validity::Invalid);
    let e = &entries(&r, "hw-regression")[0];
    assert_eq!(
        (e["op_index"].clone(), e["high_watermark"].clone()),
        (json!(second), json!(31))
    );
    assert_eq!(e["leader_epoch"], 3);
    assert_eq!(
        e["previous"],
        json!({"op_index": first, "high_watermark": 37})
    );
}

/// The measured false alarm: n2 (leader in epoch 3) reported 37, then n3, the new leader in
/// epoch 4, reported 31. A new leader's high watermark lags until its followers report, as in
/// Kafka: counted in the poll stats, not an anomaly.
#[test]
fn hw_drop_across_leader_epochs_is_not_an_anomaly() {
    let mut h = Hist::new();
    h.poll_in_epoch(1, 37, 3);
    h.poll_in_epoch(1, 31, 4);
    let r = run(&h, None);
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
    assert_eq!(r.stats["poll"].hw_drops_across_epochs, 1);
    assert!(r
        .summary(5)
        .contains("1 high watermark drops across leader epochs"));
}

/// Polls that overlap in time are not ordered, and a drop without leader epochs cannot be
/// judged (counted apart).
#[test]
fn hw_drops_of_overlapping_or_unknown_epoch_polls_are_not_anomalies() {
    let mut h = Hist::new();
    let inv = json!({"topic": "t", "partition": 0, "from": 0});
    h.push(
        Process::Client(2),
        OpType::Invoke,
        "poll",
        inv.clone(),
        None,
    );
    h.poll_in_epoch(1, 37, 3);
    let mut done = inv;
    done["high_watermark"] = json!(31);
    done["leader_epoch"] = json!(3);
    h.push(Process::Client(2), OpType::Ok, "poll", done, None);
    let r = run(&h, None);
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
    let mut h = Hist::new();
    h.send(0, &[1, 2, 3], Ok, Some(0));
    h.poll(1, 0, &[(0, 1, 0)], Some(3));
    h.poll(1, 0, &[(0, 1, 0)], Some(2));
    let r = run(&h, None);
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
    assert_eq!(r.stats["poll"].hw_drops_epoch_unknown, 1);
}

#[test]
fn no_evidence_is_unknown() {
    let mut h = Hist::new();
    h.push(
        Process::Client(0),
        OpType::Invoke,
        "send",
        json!({"topic": "t", "partition": 0, "values": [1]}),
        None,
    );
    let r = run(&h, None);
    assert_eq!(r.valid, Validity::Unknown);
    assert_eq!(
        r.stats["send"].info, 1,
        "an invocation without completion counts as info"
    );
}

#[test]
fn explicit_allowed_list_overrides_the_policy() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.poll(1, 0, &[(0, 1, 0), (1, 1, 0)], None);
    let r = check(
        &json!({"allowed_anomalies": ["duplicate"]}),
        h.ops.clone(),
        None,
    );
    assert_eq!(r.valid, Validity::Unknown, "allowed, but without replicas");
    assert_eq!(r.anomaly_types, ["duplicate"]);
    assert!(r.bad_anomaly_types.is_empty());
}

#[test]
fn literal_jsonl_history_through_the_reader() {
    let text = r#"{"tidemark_history": 1, "test": {"name": "queue"}}
{"index": 0, "time": 0, "process": 0, "type": "invoke", "f": "send", "value": {"topic": "t", "partition": 0, "values": [17, 18]}}
{"index": 1, "time": 5, "process": 0, "type": "ok", "f": "send", "value": {"topic": "t", "partition": 0, "values": [17, 18], "offset": 42}}
{"index": 2, "time": 6, "process": 1, "type": "invoke", "f": "poll", "value": {"topic": "t", "partition": 0, "from": 42}}
{"index": 3, "time": 9, "process": 1, "type": "ok", "f": "poll", "value": {"topic": "t", "partition": 0, "from": 42, "records": [[42, 17, 3], [43, 18, 3]], "high_watermark": 44}}
{"index": 4, "time": 9, "process": "nemesis", "type": "invoke", "f": "kill", "value": {}}
{"index": 5, "ti"#;
    let r = check_history(read_history(text.as_bytes()).unwrap(), None).unwrap();
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Unknown, "cut short, without replicas");
    assert!(
        r.warnings.iter().any(|w| w.contains("truncated")),
        "{:?}",
        r.warnings
    );
    let bad = text.replace(
        "\"values\": [17, 18]}}\n{\"index\": 1",
        "\"values\": \"x\"}}\n{\"index\": 1",
    );
    let e = check_history(read_history(bad.as_bytes()).unwrap(), None).unwrap_err();
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.problem.contains("malformed send value"), "{e}");
}

#[test]
fn summary_names_verdict_counts_and_examples() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.poll(1, 0, &[(0, 1, 0), (1, 1, 0)], None);
    let text = run(&h, None).summary(5);
    assert!(text.starts_with("verdict: INVALID"), "{text}");
    assert!(text.contains("send ok 1 fail 0 info 0"), "{text}");
    assert!(text.contains("duplicate: 1 (forbidden)"), "{text}");
    assert!(text.contains("\"value\":1"), "{text}");
    assert!(
        text.contains("skipped divergence: no replicas.jsonl"),
        "{text}"
    );
}

#[test]
fn unreadable_replicas_fall_back_to_polls() {
    let mut h = Hist::new();
    h.send(0, &[1, 2, 3], Ok, Some(0));
    h.poll(1, 0, &[(0, 1, 0), (2, 3, 0)], None);
    let mut broken = replica("a", "n1", true, 3, &[]);
    broken.error = Some("connection refused".into());
    let r = run(&h, Some(&[broken]));
    assert_eq!(r.anomaly_types, ["lost-write"], "{}", r.summary(5));
    assert_eq!(entries(&r, "lost-write")[0]["value"], 2);
    assert!(entries(&r, "lost-write")[0]["read_past_by"]["poll"].is_u64());
    assert!(r
        .skipped_checks
        .iter()
        .any(|s| s.check == "lost-write" && s.reason.contains("no readable replica of a/t/0")));
    assert!(
        r.warnings.iter().any(|w| w.contains("connection refused")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn failover_allows_unmirrored_writes_to_be_lost() {
    let mut h = Hist::new();
    h.send_on(Some("a"), 0, &[1], Ok, Some(0));
    h.send_on(Some("a"), 0, &[2], Ok, Some(1));
    h.nemesis("failover", json!({"from": "a", "to": "b", "topics": ["t"]}));
    h.send_on(Some("b"), 1, &[3], Ok, Some(1));
    h.nemesis("failback", json!({"from": "b", "to": "a", "topics": ["t"]}));
    let recs = [(0, 1, 0), (1, 3, 1)];
    let replicas = vec![
        replica("a", "n1", true, 2, &recs),
        replica("b", "n4", true, 2, &recs),
    ];
    let r = run(&h, Some(&replicas));
    assert_eq!(
        r.anomaly_types,
        ["lost-write", "inconsistent-offsets"],
        "{}",
        r.summary(5)
    );
    assert_eq!(r.valid, Validity::Valid);
    assert!(r.allowed["lost-write"].contains("failover"));
}

#[test]
fn a_config_op_can_force_unclean_elections() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.nemesis(
        "config",
        json!({"cluster": "a", "topic": "t", "set": {"unclean.leader.election.enable": "true"}}),
    );
    let replicas = vec![replica("a", "n1", true, 0, &[])];
    let r = run(&h, Some(&replicas));
    assert_eq!(r.anomaly_types, ["lost-write"]);
    assert_eq!(r.valid, Validity::Valid);
}

#[test]
fn without_a_marked_leader_the_highest_watermark_is_the_final_log() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.send(0, &[2], Ok, Some(1));
    let mut behind = replica("a", "n1", false, 1, &[(0, 1, 0), (1, 2, 0)]);
    let mut ahead = replica("a", "n2", false, 2, &[(0, 1, 0), (1, 2, 0)]);
    behind.role = None;
    ahead.role = None;
    let r = run(&h, Some(&[behind, ahead]));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
}

#[test]
fn records_of_info_and_fail_polls_are_still_safe_data() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.push(
        Process::Client(1),
        OpType::Invoke,
        "poll",
        json!({"topic": "t", "partition": 0, "from": 0}),
        None,
    );
    h.push(
        Process::Client(1),
        Info,
        "poll",
        json!({"topic": "t", "partition": 0, "from": 0, "records": [[0, 1, 0], [1, 1, 0]]}),
        None,
    );
    let r = run(&h, None);
    assert_eq!(r.anomaly_types, ["duplicate"]);
    assert_eq!(r.stats["poll"].info, 1);
}

#[test]
fn the_queue_checker_is_a_checker() {
    let (h, replicas) = clean();
    let checker: &dyn tidemark_checkers::Checker = &tidemark_checkers::QueueChecker;
    let r = checker.check(&json!({}), &mut h.ops.clone().into_iter(), Some(&replicas));
    assert_eq!(r.valid, Validity::Valid);
}

#[test]
fn separate_partitions_and_topics_are_separate_logs() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.push(
        Process::Client(0),
        OpType::Invoke,
        "send",
        json!({"topic": "u", "partition": 3, "values": [2]}),
        None,
    );
    h.push(
        Process::Client(0),
        Ok,
        "send",
        json!({"topic": "u", "partition": 3, "values": [2], "offset": 0}),
        None,
    );
    h.poll(1, 0, &[(0, 1, 0)], None);
    let mut other = replica("a", "n1", true, 1, &[(0, 2, 0)]);
    other.topic = "u".into();
    other.partition = 3;
    let r = run(
        &h,
        Some(&[replica("a", "n1", true, 1, &[(0, 1, 0)]), other]),
    );
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
}

/// Values no broker can have produced are bad input naming their line; Kafka's "no offset" (-1)
/// on an acknowledged send leaves the run judgeable, so it is a warning and the offset unknown.
#[test]
fn impossible_op_values_are_bad_input_naming_the_line() {
    let head = "{\"tidemark_history\": 1, \"test\": {\"workload\": \"queue\"}}\n";
    let inv = r#"{"index": 0, "time": 0, "process": 0, "type": "invoke", "f": "send", "value": {"topic": "t", "partition": 0, "values": [17]}}"#;
    let ok = r#"{"index": 1, "time": 5, "process": 0, "type": "ok", "f": "send", "value": {"topic": "t", "partition": 0, "values": [17], "offset": 4}}"#;
    let poll_inv = r#"{"index": 2, "time": 6, "process": 1, "type": "invoke", "f": "poll", "value": {"topic": "t", "partition": 0, "from": 4}}"#;
    let poll_ok = r#"{"index": 3, "time": 9, "process": 1, "type": "ok", "f": "poll", "value": {"topic": "t", "partition": 0, "from": 4, "records": [[4, 17, 0]]}}"#;
    let text = |lines: [&str; 4]| head.to_owned() + &lines.join("\n") + "\n";
    let check_text = |t: String| check_history(read_history(t.as_bytes()).unwrap(), None);
    assert!(check_text(text([inv, ok, poll_inv, poll_ok])).is_ok());
    let min = ok.replace("\"offset\": 4", &format!("\"offset\": {}", i64::MIN));
    let huge = inv.replace("\"partition\": 0", &format!("\"partition\": {}", i64::MAX));
    let from = poll_inv.replace("\"from\": 4", "\"from\": -3");
    let record = poll_ok.replace("[[4, 17, 0]]", "[[-2, 17, 0]]");
    for (lines, line, what) in [
        (
            [inv, &min, poll_inv, poll_ok],
            3,
            "offset -9223372036854775808",
        ),
        (
            [&huge, ok, poll_inv, poll_ok],
            2,
            "partition 9223372036854775807",
        ),
        ([inv, ok, &from, poll_ok], 4, "from -3"),
        ([inv, ok, poll_inv, &record], 5, "offset -2"),
    ] {
        let e = check_text(text(lines)).unwrap_err();
        assert_eq!(e.line, Some(line), "{what}: {e}");
        assert!(e.problem.contains(what), "{what}: {e}");
    }
    let unknown = ok.replace("\"offset\": 4", "\"offset\": -1");
    let r = check_text(text([inv, &unknown, poll_inv, poll_ok])).unwrap();
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
    assert!(
        r.warnings.iter().any(|w| w.contains("offset -1")),
        "{:?}",
        r.warnings
    );
}

/// A replica whose high watermark could not be read (dump-log leaves it out and says why) is
/// not taken to have committed nothing: the leader's whole log stands in for lost writes, so
/// none is reported falsely, and its records are not compared for divergence, so the run is
/// unknown rather than valid.
#[test]
fn an_unknown_high_watermark_gives_no_false_lost_writes() {
    let (h, mut replicas) = clean();
    replicas[0].high_watermark = None;
    let r = run(&h, Some(&replicas));
    assert!(r.anomaly_types.is_empty(), "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Unknown, "{}", r.summary(5));
    assert!(r
        .skipped_checks
        .iter()
        .any(|s| s.check == "divergence" && s.reason.contains("a/t/0 on n1")));
    assert!(
        r.warnings.iter().any(|w| w.contains("no high_watermark")),
        "{:?}",
        r.warnings
    );
    // A value missing from the leader's whole log is still lost.
    replicas[0].records.truncate(2);
    let r = run(&h, Some(&replicas));
    assert_eq!(r.bad_anomaly_types, ["lost-write"], "{}", r.summary(5));
    assert_eq!(entries(&r, "lost-write")[0]["value"], 3);
}

/// The checker is the one the header's `workload` names; an unknown name is bad input on the
/// header's line, and a header without one is checked as a queue history, with a warning.
#[test]
fn the_header_workload_picks_the_checker() {
    let ops = "{\"index\": 0, \"time\": 0, \"process\": 0, \"type\": \"invoke\", \"f\": \"send\", \"value\": {\"topic\": \"t\", \"partition\": 0, \"values\": [1]}}\n";
    let with = |test: &str| format!("\n{{\"tidemark_history\": 1, \"test\": {test}}}\n{ops}");
    let checked = |text: String| check_history(read_history(text.as_bytes()).unwrap(), None);
    let e = checked(with(r#"{"workload": "bank"}"#)).unwrap_err();
    assert_eq!(e.line, Some(2), "{e}");
    assert!(e.problem.contains("unknown workload \"bank\""), "{e}");
    assert!(e.problem.contains("queue, mirror"), "{e}");
    for known in ["queue", "mirror"] {
        let r = checked(with(&format!("{{\"workload\": \"{known}\"}}"))).unwrap();
        assert!(
            !r.warnings.iter().any(|w| w.contains("workload")),
            "{:?}",
            r.warnings
        );
    }
    let r = checked(with("{}")).unwrap();
    assert!(
        r.warnings.iter().any(|w| w.contains("names no workload")),
        "{:?}",
        r.warnings
    );
}

#[test]
fn a_cluster_wide_power_loss_allows_lost_writes_unless_every_message_is_flushed() {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.send(0, &[2], Ok, Some(1));
    h.nemesis(
        "power-loss",
        json!({"nodes": ["n1", "n2", "n3"], "seed": 3, "cluster_wide": true, "dropped": {}}),
    );
    let replicas = vec![replica("a", "n1", true, 1, &[(0, 1, 0)])];
    let r = check(&json!({}), h.ops.clone(), Some(&replicas));
    assert_eq!(r.anomaly_types, ["lost-write"], "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Valid);
    assert!(r.allowed["lost-write"].contains("lost power"));

    let per_message = json!({"broker_config": {"log.flush.interval.messages": "1"}});
    let r = check(&per_message, h.ops.clone(), Some(&replicas));
    assert_eq!(r.anomaly_types, ["lost-write"], "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Invalid);

    // One node losing power excuses nothing: its peers kept what it lost.
    let mut one = Hist::new();
    one.send(0, &[1], Ok, Some(0));
    one.send(0, &[2], Ok, Some(1));
    one.nemesis(
        "power-loss",
        json!({"nodes": ["n1"], "seed": 3, "cluster_wide": false, "dropped": {}}),
    );
    let r = check(&json!({}), one.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid);
}

/// A failing disk healed by rebooting the nodes that stopped on it: what their failed fsyncs
/// dropped went with the cache, as unflushed writes go at a power loss, so the flush policy says
/// whether acknowledged writes may be lost with it; a heal that rebooted nothing excuses nothing.
#[test]
fn a_reboot_after_failed_fsyncs_is_a_power_loss_of_the_rebooted_nodes() {
    let healed = |rebooted: &[&str], cluster_wide: bool| {
        let mut h = Hist::new();
        h.send(0, &[1], Ok, Some(0));
        h.send(0, &[2], Ok, Some(1));
        h.nemesis(
            "disk-heal",
            json!({"nodes": ["n1", "n2", "n3"], "rebooted": rebooted,
                   "cluster_wide": cluster_wide, "disk": {}}),
        );
        h
    };
    let replicas = vec![replica("a", "n1", true, 1, &[(0, 1, 0)])];
    let all = healed(&["n1", "n2", "n3"], true);
    let r = check(&json!({}), all.ops.clone(), Some(&replicas));
    assert_eq!(r.anomaly_types, ["lost-write"], "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    assert!(r.allowed["lost-write"].contains("rebooted after failed fsyncs"));
    // As many rebooted as min.insync.replicas, short of the whole cluster: the entry's excuse.
    let two = healed(&["n1", "n2"], false);
    let min2 = json!({"broker_config": {"min.insync.replicas": "2"}});
    let three = vec![
        replica("a", "n1", true, 1, &[(0, 1, 0)]),
        replica("a", "n2", false, 1, &[(0, 1, 0)]),
        replica("a", "n3", false, 1, &[(0, 1, 0)]),
    ];
    let r = check(&min2, two.ops.clone(), Some(&three));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    let lost = entries(&r, "lost-write");
    assert!(lost[0]["allowed"]
        .as_str()
        .is_some_and(|w| w.contains("reboot after failed fsyncs (op 5) struck 2 of t/0")));

    let per_message = json!({"broker_config": {"log.flush.interval.messages": "1"}});
    let r = check(&per_message, all.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid, "{}", r.summary(5));

    let none = healed(&[], false);
    let r = check(&json!({}), none.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid, "{}", r.summary(5));
}

/// Two writes acknowledged (at offsets 0 and 1) and `nodes` losing power at once, before both
/// or, with `between`, between them.
fn power_loss_of(nodes: &[&str], between: bool) -> Hist {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    if !between {
        h.send(0, &[2], Ok, Some(1));
    }
    h.nemesis(
        "power-loss",
        json!({"nodes": nodes, "seed": 3, "cluster_wide": false, "dropped": {}}),
    );
    if between {
        h.send(0, &[2], Ok, Some(1));
    }
    h
}

#[test]
fn a_power_loss_of_as_many_replicas_as_min_insync_allows_what_they_had_acknowledged() {
    // Three replicas, min.insync.replicas 2; n1 and n2 lose power at once (n3 may have been out
    // of the ISR): the writes acknowledged before are allowed lost, the one after is not.
    let h = power_loss_of(&["n1", "n2"], false);
    let replicas = vec![
        replica("a", "n1", true, 1, &[(0, 1, 0)]),
        replica("a", "n2", false, 1, &[(0, 1, 0)]),
        replica("a", "n3", false, 1, &[(0, 1, 0)]),
    ];
    let min2 = json!({"broker_config": {"min.insync.replicas": "2"}});
    let r = check(&min2, h.ops.clone(), Some(&replicas));
    assert_eq!(r.anomaly_types, ["lost-write"], "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    let lost = entries(&r, "lost-write");
    assert!(lost[0]["allowed"]
        .as_str()
        .is_some_and(|w| w.contains("power loss (op 5) struck 2 of t/0")));

    // Every message flushed: the ISR had them on disk.
    let flushed = json!({"broker_config": {"min.insync.replicas": 2,
                                           "log.flush.interval.messages": "1"}});
    let r = check(&flushed, h.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid);
    // A topic's own setting wins over the broker's: three replicas must have been struck.
    let topic3 = json!({"broker_config": {"min.insync.replicas": "2"},
                        "topic_config": {"t": {"min.insync.replicas": "3"}}});
    let r = check(&topic3, h.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid);
    // Nothing says how small the ISR may have been: nothing is assumed.
    let r = check(&json!({}), h.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid);

    // One node struck, below min.insync.replicas: its peers kept what it lost.
    let one = power_loss_of(&["n1"], false);
    let r = check(&min2, one.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid);
    // With min.insync.replicas 1 a lone in-sync replica may have been the one.
    let min1 = json!({"broker_config": {"min.insync.replicas": 1}});
    let r = check(&min1, one.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    // A node that holds no replica of the partition counts for nothing.
    let elsewhere = power_loss_of(&["n4"], false);
    let r = check(&min1, elsewhere.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid);

    // A write acknowledged after the power loss was on the ISR that came back: its loss is not
    // excused.
    let after = power_loss_of(&["n1", "n2"], true);
    let r = check(&min2, after.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid);
    assert!(entries(&r, "lost-write")[0].get("allowed").is_none());
}

/// Writes 1 and 2 acknowledged at offsets 0 and 1 (2 after `fault` with `after`), `fault` on n3,
/// and write 3 acknowledged at offset 1 by n3, elected uncleanly with its log ending at 1.
fn lossy_last_leader(fault: (&str, Value), after: bool) -> Hist {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    if !after {
        h.send(0, &[2], Ok, Some(1));
    }
    h.nemesis(fault.0, fault.1);
    if after {
        h.send(0, &[2], Ok, Some(1));
    }
    h.send(1, &[3], Ok, Some(1));
    h
}

/// n3 leads the final log `[1, 3]`, having recorded an unclean election in epoch 2 from
/// `log_end_offset`.
fn elected_uncleanly(log_end_offset: Option<i64>) -> Vec<ReplicaState> {
    let mut n3 = replica("a", "n3", true, 2, &[(0, 1, 0), (1, 3, 2)]);
    n3.unclean_elections = log_end_offset
        .map(|o| UncleanElection {
            leader_epoch: 2,
            log_end_offset: o,
        })
        .into_iter()
        .collect();
    vec![
        replica("a", "n1", false, 2, &[(0, 1, 0), (1, 3, 2)]),
        replica("a", "n2", false, 2, &[(0, 1, 0), (1, 3, 2)]),
        n3,
    ]
}

fn corrupted(node: &str, file: &str) -> (&'static str, Value) {
    (
        "corrupt-file",
        json!({"nodes": [node], "mode": "truncate", "files": [{"node": node, "file": file,
               "mode": "truncate", "size": 300, "offset": 120, "bytes": 180}]}),
    )
}

/// KIP-966's last known leader: with every replica of the ISR and the eligible leader replicas
/// down or back from unclean shutdowns, Kafka elects the replica that led last, uncleanly. When a
/// fault had made it lose records, what it lost is gone: allowed where the elected replica's own
/// record says so, at or above its log end then, for records acknowledged before the fault.
#[test]
fn a_replica_that_lost_records_and_was_then_elected_uncleanly_excuses_what_it_lost() {
    let min2 = json!({"broker_config": {"min.insync.replicas": "2"}});
    let segment = "t-0/00000000000000000000.log";
    let h = lossy_last_leader(corrupted("n3", segment), false);
    let r = check(&min2, h.ops.clone(), Some(&elected_uncleanly(Some(1))));
    assert_eq!(
        r.anomaly_types,
        ["lost-write", "inconsistent-offsets"],
        "{}",
        r.summary(5)
    );
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    let lost = entries(&r, "lost-write");
    assert!(
        lost[0]["allowed"].as_str().is_some_and(|w| w.contains(
            "n3 lost records of t/0 to a corrupt-file (op 5), then its broker elected it uncleanly in leader epoch 2 at offset 1"
        )),
        "{lost:?}"
    );

    // No record of the election from the broker: a corrupted replica elected while another
    // held the records is a loss.
    let r = check(&min2, h.ops.clone(), Some(&elected_uncleanly(None)));
    assert_eq!(r.valid, Validity::Invalid, "{}", r.summary(5));
    // The elected replica's log held offset 1 when elected: the fault did not take it.
    let r = check(&min2, h.ops.clone(), Some(&elected_uncleanly(Some(2))));
    assert_eq!(r.valid, Validity::Invalid, "{}", r.summary(5));
    // The damage was to another replica, or to another partition of n3.
    for (node, file) in [("n2", segment), ("n3", "t-1/00000000000000000000.log")] {
        let other = lossy_last_leader(corrupted(node, file), false);
        let r = check(&min2, other.ops, Some(&elected_uncleanly(Some(1))));
        assert_eq!(
            r.valid,
            Validity::Invalid,
            "{node} {file}: {}",
            r.summary(5)
        );
    }
    // Acknowledged after the damage: the corrupted replica never held it.
    let after = lossy_last_leader(corrupted("n3", segment), true);
    let r = check(&min2, after.ops, Some(&elected_uncleanly(Some(1))));
    assert_eq!(r.valid, Validity::Invalid, "{}", r.summary(5));

    // A power loss of n3 alone, below min.insync.replicas: excused the same way, unless every
    // message is flushed (then it lost nothing acknowledged).
    let power = (
        "power-loss",
        json!({"nodes": ["n3"], "seed": 3, "cluster_wide": false, "dropped": {}}),
    );
    let h = lossy_last_leader(power, false);
    let r = check(&min2, h.ops.clone(), Some(&elected_uncleanly(Some(1))));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    let flushed = json!({"broker_config": {"min.insync.replicas": "2",
                                           "log.flush.interval.messages": "1"}});
    let r = check(&flushed, h.ops, Some(&elected_uncleanly(Some(1))));
    assert_eq!(r.valid, Validity::Invalid, "{}", r.summary(5));

    // A last stand whose follower n3 lost power is that node's power loss; one where n3 only
    // crashed (the page cache kept its records) or was cut off lost it nothing.
    let stand = |how: &str| {
        (
            "last-stand",
            json!({"topic": "t", "partition": 1, "killed": "n1", "nodes": ["n1"],
                   "left": [{"node": "n2", "how": "cut", "held_ms": 900, "isr": ["n1", "n3"]},
                            {"node": "n3", "how": how, "held_ms": 800, "seed": 5,
                             "isr": ["n1"]}]}),
        )
    };
    let h = lossy_last_leader(stand("power-loss"), false);
    let r = check(&min2, h.ops, Some(&elected_uncleanly(Some(1))));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    let lost = entries(&r, "lost-write");
    assert!(
        lost[0]["allowed"]
            .as_str()
            .is_some_and(|w| w.contains("n3 lost records of t/0 to a power loss")),
        "{lost:?}"
    );
    for how in ["crash", "stop", "cut"] {
        let h = lossy_last_leader(stand(how), false);
        let r = check(&min2, h.ops, Some(&elected_uncleanly(Some(1))));
        assert_eq!(r.valid, Validity::Invalid, "{how}: {}", r.summary(5));
    }
}

/// Two writes acknowledged (at offsets 0 and 1) and a wipe that deleted the log directory of
/// each of `deleted`, before both or, with `between`, between them.
fn wipe_of(deleted: &[&str], between: bool) -> Hist {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    if !between {
        h.send(0, &[2], Ok, Some(1));
    }
    let deleted: serde_json::Map<String, Value> = deleted
        .iter()
        .map(|n| ((*n).to_owned(), json!({"t-0": 4096})))
        .collect();
    h.nemesis(
        "wipe",
        json!({"nodes": ["n1"], "targets": "one", "kept": ["__cluster_metadata"],
               "deleted": deleted, "partitions": [], "rejoined_after_s": null}),
    );
    if between {
        h.send(0, &[2], Ok, Some(1));
    }
    h
}

#[test]
fn a_wipe_of_as_many_replicas_as_min_insync_allows_what_they_had_acknowledged() {
    // Two replicas, min.insync.replicas 1: n1 led with an ISR of itself, acknowledged 2 alone,
    // and lost its log directory; n2 never had 2, and the partition stayed offline (n1 may not
    // lead before it has fetched again, n2 was not in the ISR). Found by a run of two replicas
    // under wipes, pauses and kills, whose 31 such writes were reported lost, unexcused.
    let replicas = vec![
        replica("a", "n1", false, 0, &[]),
        replica("a", "n2", false, 1, &[(0, 1, 0)]),
    ];
    let min1 = json!({"broker_config": {"min.insync.replicas": "1"}});
    let h = wipe_of(&["n1"], false);
    let r = check(&min1, h.ops.clone(), Some(&replicas));
    assert_eq!(r.anomaly_types, ["lost-write"], "{}", r.summary(5));
    assert_eq!(r.valid, Validity::Valid, "{}", r.summary(5));
    assert!(entries(&r, "lost-write")[0]["allowed"]
        .as_str()
        .is_some_and(|w| w.contains("wipe (op 5) emptied the log directory of 1 of t/0")));

    // With min.insync.replicas 2, n2 was in the ISR that acknowledged it: a disk loss of one
    // replica excuses nothing, flushed or not.
    let min2 = json!({"broker_config": {"min.insync.replicas": "2"}});
    let r = check(&min2, h.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid);
    // A wipe that deleted nothing (it fell short) struck no replica.
    let nothing = wipe_of(&[], false);
    let r = check(&min1, nothing.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid);
    // A write acknowledged after the wipe was on replicas it did not empty.
    let after = wipe_of(&["n1"], true);
    let r = check(&min1, after.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid);
    assert!(entries(&r, "lost-write")[0].get("allowed").is_none());
}

/// Two writes acknowledged, then a last stand of t/0 on n1: n3 left, then n2, each recorded
/// with the ISR read once it had gone, and the next leader (absent: not waited for).
fn last_stand(first: &str, second: &str, elected: Option<Value>) -> Hist {
    let mut h = Hist::new();
    h.send(0, &[1], Ok, Some(0));
    h.send(0, &[2], Ok, Some(1));
    let mut stand = json!({"topic": "t", "partition": 0, "killed": "n1", "nodes": ["n1"],
        "isr_at_start": ["n1", "n2", "n3"],
        "left": [{"node": "n3", "how": first, "held_ms": 3000, "isr": ["n1", "n2"]},
                 {"node": "n2", "how": second, "held_ms": 900, "isr": ["n1"]}]});
    if let Some(e) = elected {
        stand["elected"] = e;
    }
    h.nemesis("last-stand", stand);
    h
}

/// KIP-966 on (tidemark's broker, or the setting) with `min.insync.replicas` 2.
fn elr_on() -> Value {
    json!({"broker": {"name": "tidemark-broker"},
           "broker_config": {"min.insync.replicas": "2"}})
}

/// Kafka's eligible leader replicas test: after the leader alone in its ISR dies, the replica
/// whose leaving took the ISR below the minimum must lead; not the one that left while the ISR
/// still met it, and not nobody.
#[test]
fn a_last_stand_that_passes_its_eligible_replica_over_is_an_anomaly() {
    let (_, replicas) = clean();
    let ok = last_stand("crash", "cut", Some(json!("n2")));
    let r = check(&elr_on(), ok.ops, Some(&replicas));
    assert!(
        !r.anomaly_types
            .contains(&"eligible-passed-over".to_string()),
        "{}",
        r.summary(5)
    );
    // The first to leave lacks what was acknowledged after it.
    let wrong = last_stand("stop", "cut", Some(json!("n3")));
    let r = check(&elr_on(), wrong.ops.clone(), Some(&replicas));
    assert_eq!(r.valid, Validity::Invalid, "{}", r.summary(5));
    let e = &entries(&r, "eligible-passed-over")[0];
    assert_eq!(e["eligible"], json!(["n2"]), "{e}");
    assert_eq!(e["elected"], "n3", "{e}");
    // None within the wait, with the eligible one back from a clean stop.
    let none = last_stand("crash", "stop", Some(Value::Null));
    let r = check(&elr_on(), none.ops, Some(&replicas));
    assert_eq!(
        entries(&r, "eligible-passed-over")[0]["elected"],
        Value::Null
    );

    // Back from an unclean shutdown the last is not eligible: nothing to pass over.
    for how in ["crash", "power-loss"] {
        let h = last_stand("cut", how, Some(Value::Null));
        let r = check(&elr_on(), h.ops, Some(&replicas));
        assert!(entries(&r, "eligible-passed-over").is_empty(), "{how}");
    }
    // Not waited for, nothing judged.
    let h = last_stand("cut", "cut", None);
    assert!(entries(
        &check(&elr_on(), h.ops, Some(&replicas)),
        "eligible-passed-over"
    )
    .is_empty());
    // With min.insync.replicas 1 the ISR never went below it: none was eligible.
    let min1 = json!({"broker": {"name": "tidemark-broker"},
                      "broker_config": {"min.insync.replicas": "1"}});
    let r = check(&min1, wrong.ops.clone(), Some(&replicas));
    assert!(entries(&r, "eligible-passed-over").is_empty());
    // A broker that keeps no eligible replicas, or one whose setting is unknown, is not judged.
    let off = json!({"broker": {"name": "tidemark-broker"},
                     "broker_config": {"min.insync.replicas": "2",
                                       "eligible.leader.replicas.version": "0"}});
    let other = json!({"broker_config": {"min.insync.replicas": "2"}});
    for test in [off, other] {
        let r = check(&test, wrong.ops.clone(), Some(&replicas));
        assert!(entries(&r, "eligible-passed-over").is_empty(), "{test}");
    }
}
