//! `tidemark test` with Kafka's default client behaviours: an idempotent producer under kill
//! and partition faults, and a consumer group whose members are killed with their processes
//! and rejoin, or stall and commit as zombies. Each run is short and must be valid on the
//! correct broker, with the modes recorded in test.json and their ops in the history.

use std::path::Path;

use crate::support::engine::*;
use serde_json::Value;

/// Runs `tidemark test ARGS` and returns its test.json and history ops, asserting it was
/// valid and left nothing behind.
fn valid_run(args: &[&str]) -> (Value, Vec<Value>) {
    broker();
    let store = tempfile::tempdir().unwrap();
    let out = tidemark_test(args, store.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
    let run = std::fs::canonicalize(store.path().join("latest")).unwrap();
    let test: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("test.json")).unwrap()).unwrap();
    assert_nothing_left(&test);
    let ops = read_ops(&run);
    (test, ops)
}

fn read_ops(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("history.jsonl"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn count(ops: &[Value], f: &str, kind: &str) -> usize {
    ops.iter()
        .filter(|o| o["f"] == f && o["type"] == kind)
        .count()
}

#[test]
fn an_idempotent_producer_under_kills_and_partitions_is_valid() {
    require_root("an_idempotent_producer_under_kills_and_partitions_is_valid");
    let (test, ops) = valid_run(&[
        "--producer",
        "idempotent",
        "--nemesis",
        "kill,partition",
        // Turns of about three seconds: six or so in the run, so one of the kill package's
        // (half the turns) is all but certain whatever the draws.
        "--nemesis-interval",
        "2",
        "--time-limit",
        "20",
        "--seed",
        "5",
    ]);
    assert_eq!(test["workload_options"]["producer"], "idempotent");
    assert_eq!(test["workload_options"]["consumer"], "assign");
    assert!(count(&ops, "send", "ok") > 10, "too few acknowledged sends");
    // Every acknowledged send says how many times its batch went out.
    assert!(ops
        .iter()
        .filter(|o| o["f"] == "send" && o["type"] == "ok")
        .all(|o| o["value"]["attempts"].as_u64().is_some_and(|a| a >= 1)));
    // The kill package kills plainly, chases leaders (bounce) or hands leadership to a frozen
    // successor (handoff): each kills a broker.
    assert!(ops.iter().any(|o| o["process"] == "nemesis"
        && ["kill", "bounce", "handoff"].contains(&o["f"].as_str().unwrap_or(""))));
}

#[test]
fn a_consumer_group_whose_members_crash_and_rejoin_is_valid() {
    require_root("a_consumer_group_whose_members_crash_and_rejoin_is_valid");
    let (test, ops) = valid_run(&[
        "--consumer",
        "group",
        "--producer",
        "idempotent",
        "--nemesis",
        "kill,partition",
        "--nemesis-interval",
        "5",
        "--time-limit",
        "30",
        "--seed",
        "7",
        "--concurrency",
        "4",
    ]);
    assert_eq!(test["workload_options"]["consumer"], "group");
    assert_eq!(
        test["broker_config"]["group.initial.rebalance.delay.ms"], "0",
        "{}",
        test["broker_config"]
    );
    assert!(
        count(&ops, "group-poll", "ok") > 0,
        "no group poll read anything"
    );
    assert!(
        count(&ops, "commit", "ok") > 0,
        "no commit was acknowledged"
    );
    let generations: std::collections::BTreeSet<i64> = ops
        .iter()
        .filter(|o| o["f"] == "commit" && o["type"] == "ok")
        .filter_map(|o| o["value"]["generation"].as_i64())
        .collect();
    assert!(!generations.is_empty());
    for o in ops
        .iter()
        .filter(|o| o["f"] == "group-poll" && o["type"] == "ok")
    {
        assert_eq!(o["value"]["group"], "tidemark");
        assert!(o["value"]["member"].is_string() && o["value"]["topic"].is_string());
    }
    // Members stalled past their session timeout and committed on waking, without the
    // heartbeat that would have told them the group moved on; the verdict above says the
    // coordinator took none of those commits in an ended generation.
    assert!(count(&ops, "stall", "ok") > 0, "no member stalled");
    assert!(
        ops.iter().any(|o| o["f"] == "commit"
            && o["type"] == "invoke"
            && o["value"]["after_stall"] == true),
        "no member committed after a stall"
    );
}
