//! `tidemark test --workload tiered` end to end on real namespaces: topics with tiered storage on,
//! a remote store the brokers share, and the faults that test it. The correct broker stays valid
//! through a remote-store outage, kills and wiped log directories, with data really in the remote
//! store and wiped followers really starting from it, with KIP-1023's flag on and then turned off
//! at run time; the injected `tiered-bootstrap-off-by-one` is caught by the tiered-bootstrap check
//! and `tiered-flag-not-dynamic` by the flag-gating check.

use std::path::{Path, PathBuf};

use crate::support::engine::*;
use serde_json::{json, Value};

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

const S: u64 = 1_000_000_000;

/// When a schedule turns KIP-1023's flag off at run time.
#[derive(Clone, Copy, PartialEq)]
enum FlagOff {
    Never,
    /// Between the wipes: the first starts from the last tiered offset, the second the old way.
    BeforeSecondWipe,
    BeforeFirstWipe,
}

/// Two wipes (any node, then a leader) between other faults, so each lands on a partition whose
/// leader has already uploaded segments and kept some of them locally.
fn schedule(dir: &Path, outage: bool, flag_off: FlagOff) -> PathBuf {
    let mut ops = Vec::new();
    if outage {
        ops.push(json!({"time": 5 * S, "f": "remote-outage", "value": {"targets": "all"}}));
        ops.push(json!({"time": 8 * S, "f": "remote-restore", "value": {}}));
    }
    let off = json!({"set": {"follower.fetch.last.tiered.offset.enable": "false"}});
    if flag_off == FlagOff::BeforeFirstWipe {
        ops.push(json!({"time": 9 * S, "f": "tiered-config", "value": off}));
    }
    ops.extend([
        json!({"time": 10 * S, "f": "wipe", "value": {"targets": "one"}}),
        json!({"time": 16 * S, "f": "kill", "value": {"targets": "leader"}}),
        json!({"time": 18 * S, "f": "start", "value": {"targets": "all"}}),
    ]);
    if flag_off == FlagOff::BeforeSecondWipe {
        ops.push(json!({"time": 19 * S, "f": "tiered-config", "value": off}));
    }
    ops.push(json!({"time": 20 * S, "f": "wipe", "value": {"targets": "leader"}}));
    let path = dir.join("tiered-faults.json");
    std::fs::write(&path, Value::Array(ops).to_string()).unwrap();
    path
}

/// Runs the tiered workload for 25 s under `schedule` with client seed `seed` and `extra`
/// arguments; returns the run directory and its results.
fn tiered_run(schedule: &Path, seed: &str, extra: &[&str], store: &Path) -> (PathBuf, Value) {
    let schedule = schedule.display().to_string();
    let mut args = vec![
        "--workload",
        "tiered",
        "--nemesis-schedule",
        &schedule,
        "--time-limit",
        "25",
        "--seed",
        seed,
    ];
    args.extend_from_slice(extra);
    run_with_verdict(&args, store)
}

/// The recorded wipes' partitions, each with the flag its wipe recorded as `flag`.
fn wiped(history: &[Value]) -> Vec<Value> {
    history
        .iter()
        .filter(|o| o["f"] == "wipe" && o["type"] == "info")
        .flat_map(|o| {
            let flag = o["value"]["fetch_last_tiered_offset"].clone();
            let mut parts = o["value"]["partitions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            for p in &mut parts {
                p["flag"] = flag.clone();
            }
            parts
        })
        .collect()
}

#[test]
fn tiered_options_are_checked() {
    let e = usage_error(&["--nemesis", "kill,remote-outage"]);
    assert!(
        e.contains("the remote-outage fault kind needs --workload tiered"),
        "{e}"
    );
}

#[test]
fn wipes_kills_and_a_remote_outage_leave_the_correct_broker_valid() {
    require_root("wipes_kills_and_a_remote_outage_leave_the_correct_broker_valid");
    broker();
    let dir = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let (run, results) = tiered_run(
        &schedule(dir.path(), true, FlagOff::BeforeSecondWipe),
        "5",
        &[],
        store.path(),
    );
    assert_eq!(
        strings(&results["bad_anomaly_types"]),
        Vec::<String>::new(),
        "{}",
        run.display()
    );
    assert_eq!(results["valid"], true, "{}", run.display());
    let test: Value =
        serde_json::from_slice(&std::fs::read(run.join("test.json")).unwrap()).unwrap();
    assert_eq!(test["workload"], "tiered");
    assert_eq!(
        test["broker_config"]["follower.fetch.last.tiered.offset.enable"],
        "true"
    );
    let history = json_lines(&run.join("history.jsonl"));
    let ops = &history[1..];
    for f in ["remote-outage", "remote-restore", "wipe", "tiered-config"] {
        let done: Vec<&Value> = ops
            .iter()
            .filter(|o| o["f"] == f && o["type"] == "info")
            .collect();
        assert!(!done.is_empty(), "no {f}");
        assert!(done.iter().all(|o| o["error"].is_null()), "{done:?}");
    }
    // Polls record the leader's local log start, and some read below it: from the remote store.
    let remote_reads = ops
        .iter()
        .filter(|o| o["f"] == "poll" && o["type"] == "ok")
        .filter(|o| {
            let local = o["value"]["local_log_start"].as_i64();
            local.is_some_and(|l| {
                o["value"]["records"]
                    .as_array()
                    .is_some_and(|rs| rs.iter().any(|r| r[0].as_i64().is_some_and(|x| x < l)))
            })
        })
        .count();
    assert!(remote_reads > 0, "no poll read from the remote store");
    // The flag was turned off between the wipes, and every node described it so.
    let turned: Vec<&Value> = ops
        .iter()
        .filter(|o| o["f"] == "tiered-config" && o["type"] == "info")
        .collect();
    assert_eq!(turned.len(), 1, "{turned:?}");
    assert_eq!(turned[0]["value"]["was"], true, "{}", turned[0]);
    let described = turned[0]["value"]["described"].as_object().unwrap();
    assert_eq!(described.len(), 3, "{}", turned[0]);
    assert!(described.values().all(|v| v == false), "{}", turned[0]);
    // Each wipe deleted partition directories, kept the quorum's log, and the node came back
    // into every ISR; at least one of its replicas started from the remote store (its local log
    // after the partition's start): with the flag on at or after the earliest pending upload of
    // the leader it rejoined under, asked while it was down; with the flag off at or after that
    // leader's local log start then, and at or before it once the node was back (when that
    // leader still led in the same epoch throughout).
    let parts = wiped(ops);
    let flags: Vec<&Value> = ops
        .iter()
        .filter(|o| o["f"] == "wipe" && o["type"] == "info")
        .map(|o| &o["value"]["fetch_last_tiered_offset"])
        .collect();
    assert_eq!(flags, [true, false]);
    assert!(!parts.is_empty());
    let from_remote: Vec<&Value> = parts
        .iter()
        .filter(|p| {
            let r = &p["rejoined"];
            r["local_log_start_offset"].as_i64() > r["log_start_offset"].as_i64()
        })
        .collect();
    assert!(
        !from_remote.is_empty(),
        "no wiped replica started from the remote store: {parts:?}"
    );
    let followed = |p: &Value| {
        let (at, r) = (&p["leader_at_restart"], &p["rejoined"]);
        at["error"].is_null()
            && at["node"] != p["node"]
            && at["node"] == r["leader"]
            && at["leader_epoch"] == r["leader_epoch"]
    };
    let held: Vec<&&Value> = from_remote.iter().filter(|p| followed(p)).collect();
    assert!(!held.is_empty(), "no leader at restart binds: {parts:?}");
    for p in held {
        let at = &p["leader_at_restart"];
        let local = p["rejoined"]["local_log_start_offset"].as_i64().unwrap();
        if p["flag"] == true {
            let epuo = at["earliest_pending_upload"].as_i64().unwrap();
            assert!(local >= epuo, "{p}");
        } else {
            let after = &p["rejoined"]["leader_offsets"];
            assert!(
                local >= at["local_log_start_offset"].as_i64().unwrap(),
                "{p}"
            );
            // At most past the remote segment holding the offset before the leader's local log
            // start, which may be another leader's and end beyond it: within what was tiered.
            if after["leader_epoch"] == at["leader_epoch"] {
                assert!(
                    local <= after["earliest_pending_upload"].as_i64().unwrap(),
                    "{p}"
                );
            }
        }
    }
    // The wiped leader's partitions were asked of their next leader before it came back.
    assert!(
        parts.iter().any(|p| p["leader"]["node"] == p["node"]
            && p["leader_at_restart"]["node"]
                .as_str()
                .is_some_and(|n| p["node"] != n)),
        "no wiped leader's successor asked: {parts:?}"
    );
    // The data really moved: each partition has a replica whose local log starts above the
    // partition's, the offsets between held by finished remote segments with their records.
    let replicas = json_lines(&run.join("replicas.jsonl"));
    for (topic, partition) in [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)] {
        let moved = replicas.iter().any(|r| {
            let t = &r["tiered"];
            r["topic"] == topic
                && r["partition"] == partition
                && t["log_start_offset"].as_i64() < t["local_log_start_offset"].as_i64()
                && t["remote_segments"].as_array().unwrap().iter().any(|s| {
                    s["state"] == "COPY_SEGMENT_FINISHED"
                        && !s["records"].as_array().unwrap().is_empty()
                })
        });
        assert!(
            moved,
            "{topic}/{partition}: nothing below a local log start"
        );
    }
    // Idempotent producers by default, and every replica lists their state: the replicas were
    // compared on it.
    assert_eq!(test["workload_options"]["producer"], "idempotent", "{test}");
    assert!(
        replicas
            .iter()
            .filter(|r| r["topic"] == "t0" || r["topic"] == "t1")
            .all(|r| r["producers"].as_array().is_some_and(|p| !p.is_empty())),
        "{}",
        run.display()
    );
    assert_nothing_left(&test);
}

/// Runs `schedule`'s wipes with `bug` injected and asserts the run invalid with `anomaly`. A
/// run can show nothing on a loaded machine (every test's brokers on two cores: a wipe's rejoin
/// may come after a leader change, which leaves it unjudged), so a second client seed runs then.
fn assert_caught(test: &str, bug: &str, flag_off: FlagOff, anomaly: &str) {
    require_root(test);
    broker();
    let dir = tempfile::tempdir().unwrap();
    let store = tempfile::tempdir().unwrap();
    let schedule = schedule(dir.path(), false, flag_off);
    let mut missed = Vec::new();
    for seed in ["5", "6"] {
        let (run, results) = tiered_run(&schedule, seed, &["--inject-bug", bug], store.path());
        if strings(&results["bad_anomaly_types"]).contains(&anomaly.to_string()) {
            assert_eq!(results["valid"], false);
            return;
        }
        missed.push(format!("{}: {}", run.display(), results["anomaly_types"]));
    }
    panic!("{bug} went uncaught: {missed:?}");
}

#[test]
fn the_tiered_bootstrap_off_by_one_is_caught() {
    assert_caught(
        "the_tiered_bootstrap_off_by_one_is_caught",
        "tiered-bootstrap-off-by-one",
        FlagOff::Never,
        "tiered-bootstrap",
    );
}

#[test]
fn a_flag_turned_off_that_followers_never_see_is_caught() {
    assert_caught(
        "a_flag_turned_off_that_followers_never_see_is_caught",
        "tiered-flag-not-dynamic",
        FlagOff::BeforeFirstWipe,
        "tiered-flag-gating",
    );
}

#[test]
fn a_follower_that_drops_the_producers_state_is_caught() {
    assert_caught(
        "a_follower_that_drops_the_producers_state_is_caught",
        "tiered-bootstrap-drops-producer-state",
        FlagOff::Never,
        "producer-state-divergence",
    );
}
