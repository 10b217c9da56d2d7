//! `tidemark test` end to end on real network namespaces with real brokers: a short run without
//! faults is valid, writes every file of the run directory, and leaves nothing behind; so does a
//! run with dedicated controllers under broker kills and a leader cut off from them.

use std::process::Command;

use crate::support::engine::*;
use serde_json::Value;

#[test]
fn a_short_run_without_faults_is_valid_and_leaves_nothing_behind() {
    require_root("a_short_run_without_faults_is_valid_and_leaves_nothing_behind");
    broker();
    let store = tempfile::tempdir().unwrap();
    let out = Command::new(tidemark())
        .args(["test", "--time-limit", "15", "--nemesis", "none"])
        .args(["--seed", "1", "--quiet", "--store"])
        .arg(store.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("VALID"), "{stdout}");
    assert!(stdout.contains("\nfaults: none\n"), "{stdout}");

    let run = store.path().join("latest");
    let test = test_json(&run);
    assert_eq!(test["seed"], 1);
    assert_eq!(test["workload"], "queue");
    assert_eq!(test["nodes"].as_array().unwrap().len(), 3);

    let history = std::fs::read_to_string(run.join("history.jsonl")).unwrap();
    let mut lines = history.lines();
    let header: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(header["tidemark_history"], 1);
    assert_eq!(header["test"], test);
    let ops: Vec<Value> = lines.map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(ops.len() > 500, "only {} ops", ops.len());
    for (i, op) in ops.iter().enumerate() {
        assert_eq!(op["index"], i as u64);
    }
    let oks = |f: &str| {
        ops.iter()
            .filter(|o| o["f"] == f && o["type"] == "ok")
            .count()
    };
    assert!(oks("send") > 100 && oks("poll") > 100);
    // Every ok poll says the leader epoch it was served under.
    let ok_polls = ops.iter().filter(|o| o["f"] == "poll" && o["type"] == "ok");
    assert!(ok_polls
        .clone()
        .all(|o| o["value"]["leader_epoch"].is_i64()));
    // The wait for the replicas to agree is recorded: every replica caught up and in the ISR.
    let converged: Vec<&Value> = ops
        .iter()
        .filter(|o| o["f"] == "converge" && o["type"] == "info")
        .collect();
    assert_eq!(converged.len(), 1, "{converged:?}");
    assert_eq!(
        converged[0]["value"]["converged"], true,
        "{:?}",
        converged[0]
    );
    assert_eq!(converged[0]["cluster"], "a");

    let replicas = json_lines(&run.join("replicas.jsonl"));
    // Two topics of two partitions, three replicas each, named with their cluster and node.
    assert_eq!(replicas.len(), 12);
    assert!(replicas
        .iter()
        .all(|r| r["cluster"] == "a" && r["node"].is_string() && r["records"].is_array()));
    assert!(
        replicas.iter().all(|r| r["high_watermark"].is_i64()),
        "every high watermark was read"
    );

    let results: Value =
        serde_json::from_slice(&std::fs::read(run.join("results.json")).unwrap()).unwrap();
    assert_eq!(results["valid"], true, "{results}");
    // `tidemark check` judges the run the same way `tidemark test` did.
    let checked = store.path().join("checked.json");
    let out = Command::new(tidemark())
        .arg("check")
        .arg(&run)
        .arg("--out")
        .arg(&checked)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let rechecked: Value = serde_json::from_slice(&std::fs::read(&checked).unwrap()).unwrap();
    assert_eq!(rechecked, results);
    for n in ["n1", "n2", "n3"] {
        let log = run.join("nodes").join(n).join("broker.log");
        assert!(log.is_file(), "{} missing", log.display());
    }
    assert_nothing_left(&test);
}

#[test]
fn bad_usage_exits_254_with_a_reason() {
    let out = Command::new(tidemark())
        .args(["test", "--nemesis", "meteor-strike"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(254));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown fault kind(s): meteor-strike"),
        "{stderr}"
    );

    let out = Command::new(tidemark())
        .args(["test", "--workload", "bank"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(254));
    assert!(String::from_utf8_lossy(&out.stderr).contains("available: queue"));
}

/// KRaft's production layout: with dedicated controllers two brokers can die at once without
/// losing the quorum (the controllers fence them), the active controller can be aimed at and
/// killed, a leader cut off from the controllers is cut from all three, and the run is judged
/// and cleaned up like any other.
#[test]
fn dedicated_controllers_survive_two_dead_brokers_and_a_leader_cut_from_them() {
    require_root("dedicated_controllers_survive_two_dead_brokers_and_a_leader_cut_from_them");
    broker();
    let store = tempfile::tempdir().unwrap();
    let schedule = store.path().join("faults.json");
    // The active controller dies once the two brokers are fenced: a new one waits a whole
    // session before it fences anyone (as Kafka's does), so earlier it would leave them to their
    // restart.
    std::fs::write(
        &schedule,
        r#"[
{"time_s": 2, "f": "kill", "value": {"nodes": ["n1", "n2"]}},
{"time_s": 6.5, "f": "kill", "value": {"targets": "controller"}},
{"time_s": 10, "f": "start", "value": {"nodes": ["n1", "n2"]}},
{"time_s": 13, "f": "start-partition", "value": {"kind": "leader-control"}},
{"time_s": 19, "f": "stop-partition", "value": {}}
]"#,
    )
    .unwrap();
    let out = Command::new(tidemark())
        .args(["test", "--controllers", "3", "--time-limit", "21"])
        .arg("--nemesis-schedule")
        .arg(&schedule)
        .args(["--seed", "1", "--quiet", "--store"])
        .arg(store.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");

    let run = store.path().join("latest");
    let test = test_json(&run);
    let roles = node_fields(&test, &["name", "role"]);
    let role = |names: [&str; 3], r: &str| names.map(|n| vec![n.to_string(), r.to_string()]);
    let want: Vec<Vec<String>> = role(["n1", "n2", "n3"], "broker")
        .into_iter()
        .chain(role(["c1", "c2", "c3"], "controller"))
        .collect();
    assert_eq!(roles, want);

    // The controllers fenced both dead brokers: their quorum never depended on them.
    let logs: String = ["c1", "c2", "c3"]
        .iter()
        .map(|c| std::fs::read_to_string(run.join("nodes").join(c).join("broker.log")).unwrap())
        .collect();
    for b in [1, 2] {
        assert!(
            logs.contains(&format!("no heartbeat within 3s broker={b}")),
            "broker {b} was not fenced:\n{logs}"
        );
    }
    let history = json_lines(&run.join("history.jsonl"));
    let faults = nemesis_infos(&history);
    let info =
        |f: &str| -> Vec<&Value> { faults.iter().copied().filter(|o| o["f"] == f).collect() };
    // The active controller, found by DescribeQuorum, was killed; another took over, and the
    // final healing started it again.
    let killed = info("kill")[1]["value"]["nodes"].clone();
    let active = killed[0].as_str().unwrap_or_else(|| panic!("{killed}"));
    assert!(["c1", "c2", "c3"].contains(&active), "{killed}");
    assert!(
        logs.matches("elected metadata quorum leader").count() >= 2,
        "no second election:\n{logs}"
    );
    let healed = info("start").last().unwrap()["value"]["nodes"].clone();
    assert!(
        healed.as_array().unwrap().iter().any(|n| n == active),
        "{healed}"
    );
    let cut = *info("start-partition")
        .first()
        .expect("the cut is recorded");
    assert_eq!(cut["value"]["ports"], serde_json::json!([9093]), "{cut}");
    let grudge = cut["value"]["grudge"].as_object().unwrap();
    for c in ["c1", "c2", "c3"] {
        assert_eq!(grudge[c].as_array().unwrap().len(), 1, "{cut}");
    }
    // Replicas live on the brokers only: two topics of two partitions, three replicas each.
    assert_eq!(replica_count(&run), 12);
    assert_nothing_left(&test);
}
