//! `tidemark test --workload mirror` end to end on real namespaces: two clusters, B mirroring
//! A, failovers and failbacks under kills, partitions and unclean elections in either cluster;
//! the correct broker stays valid, every op names its cluster, and each failover and failback
//! records what it did. The flag `mirror.support.unclean.leader.election` decides whether
//! unclean elections in the source across failovers may leave the clusters diverged.

use std::path::{Path, PathBuf};

use crate::support::engine::*;
use serde_json::Value;

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts that the verdict of the run in `run` forbids no anomaly.
fn assert_nothing_forbidden(results: &Value, run: &Path) {
    assert_eq!(
        strings(&results["bad_anomaly_types"]),
        Vec::<String>::new(),
        "{}",
        run.display()
    );
}

/// Runs `tidemark test --workload mirror ARGS` into `store` and returns the run directory and
/// its results.
fn mirror_run(args: &[&str], store: &Path) -> (PathBuf, Value) {
    let mut all = vec!["--workload", "mirror"];
    all.extend_from_slice(args);
    run_with_verdict(&all, store)
}

#[test]
fn mirror_options_are_checked() {
    let e = usage_error(&["--nemesis", "failover"]);
    assert!(
        e.contains("the failover fault kind needs --workload mirror"),
        "{e}"
    );
    let e = usage_error(&["--nemesis", "kill,mirror-config"]);
    assert!(
        e.contains("the mirror-config fault kind needs --workload mirror"),
        "{e}"
    );
    let e = usage_error(&["--workload", "mirror", "--clusters", "3"]);
    assert!(e.contains("--workload mirror runs on two clusters"), "{e}");
    let e = usage_error(&["--mirror-unclean-support"]);
    assert!(e.contains("goes with --workload mirror"), "{e}");
    let e = usage_error(&["--nemesis-targets", "one,source-leaders"]);
    assert!(
        e.contains("--nemesis-targets source-leaders: aiming at a mirror's source or destination needs --workload mirror"),
        "{e}"
    );
}

#[test]
fn failovers_under_kills_partitions_and_unclean_elections_stay_valid() {
    require_root("failovers_under_kills_partitions_and_unclean_elections_stay_valid");
    broker();
    let store = tempfile::tempdir().unwrap();
    let (run, results) = mirror_run(
        &[
            "--nemesis",
            "failover,partition,kill,unclean",
            "--nemesis-interval",
            "3",
            "--time-limit",
            "25",
            "--seed",
            "3",
        ],
        store.path(),
    );
    assert_nothing_forbidden(&results, &run);
    let test = json(&run.join("test.json"));
    assert_eq!(test["workload"], "mirror");
    assert_eq!(test["clusters"], serde_json::json!(["a", "b"]));
    assert_eq!(
        test["broker_config"]["mirror.support.unclean.leader.election"],
        "false"
    );
    let history = json_lines(&run.join("history.jsonl"));
    let ops = &history[1..];
    // Every op names its cluster, and clients wrote to and read from both.
    assert!(
        ops.iter().all(|o| o["cluster"].is_string()),
        "an op without a cluster"
    );
    for (f, cluster) in [("send", "a"), ("poll", "a"), ("poll", "b")] {
        assert!(
            ops.iter()
                .any(|o| o["f"] == f && o["cluster"] == cluster && o["type"] == "ok"),
            "no {f} ok on {cluster}"
        );
    }
    // Each failover and failback records, per partition, what it read and did; the run ends
    // with a failback that settles the mirror.
    let moves: Vec<&Value> = ops
        .iter()
        .filter(|o| o["type"] == "info" && (o["f"] == "failover" || o["f"] == "failback"))
        .collect();
    assert!(moves.iter().any(|o| o["f"] == "failover"), "no failover");
    for m in &moves {
        let v = &m["value"];
        assert!(v["from"].is_string() && v["to"].is_string(), "{m}");
        // A failover records where the clusters parted; a failback only its log end then. A
        // failover whose stop failed has no parting point for a partition it left unstopped.
        let offset = if m["f"] == "failover" {
            "mirrored_offset"
        } else {
            "log_end_offset"
        };
        for p in v["partitions"].as_array().into_iter().flatten() {
            let unstopped = m["f"] == "failover" && p["state"] != "STOPPED";
            assert!(
                !unstopped || m["error"].is_string(),
                "a failover without error left {p} unstopped: {m}"
            );
            for field in ["topic", "partition", "lmle", offset, "state"] {
                if field == offset && unstopped {
                    continue;
                }
                assert!(!p[field].is_null(), "{field} missing in {m}");
            }
        }
    }
    // With the flag off no failback lags a replica: a truncation then waits for the ISR only,
    // so a replica left out of it is the limitation the verdict allows, not a test.
    assert!(
        moves.iter().all(|m| m["value"]["lagging"].is_null()),
        "a failback lagged with the flag off"
    );
    // The final move settles whichever direction the run left: a failback that waited for lag 0.
    let last = moves.last().unwrap();
    assert_eq!(
        (&last["f"], &last["value"]["settle"]),
        (&Value::from("failback"), &Value::from(true))
    );
    assert!(last["error"].is_null(), "{last}");
    // After the final failback both clusters hold the same committed records.
    let replicas = json_lines(&run.join("replicas.jsonl"));
    for cluster in ["a", "b"] {
        assert!(
            replicas.iter().any(|r| r["cluster"] == cluster),
            "no replica of {cluster}"
        );
    }
    assert!(!strings(&results["anomaly_types"]).contains(&"mirror-divergence".to_string()));
    assert_nothing_left(&test);
}

/// Writes a nemesis schedule into `dir`; returns its path for `--nemesis-schedule`.
fn schedule_file(dir: &Path, schedule: &str) -> String {
    let path = dir.join("schedule.json");
    std::fs::write(&path, schedule).unwrap();
    path.display().to_string()
}

/// Two round trips, the second failing back into B, with the flag on (only then does a failback
/// lag a replica): the nemesis performs mirror moves on the first cluster's side, and its
/// lagging replica must still be one of B's nodes.
const ROUND_TRIPS: &str = r#"[
  {"time_s": 1, "f": "failover", "value": {}},
  {"time_s": 4, "f": "failback", "value": {"lagging": true}},
  {"time_s": 14, "f": "failover", "value": {}},
  {"time_s": 17, "f": "failback", "value": {"lagging": true}}
]"#;

#[test]
fn a_failback_into_either_cluster_lags_one_of_its_replicas() {
    require_root("a_failback_into_either_cluster_lags_one_of_its_replicas");
    broker();
    let dir = tempfile::tempdir().unwrap();
    let schedule = schedule_file(dir.path(), ROUND_TRIPS);
    let store = tempfile::tempdir().unwrap();
    let args = [
        "--nemesis-schedule",
        schedule.as_str(),
        "--time-limit",
        "28",
        "--mirror-unclean-support",
    ];
    // The property needs both round trips to happen: a scheduled failover that failed (seen
    // twice in many runs on a loaded machine, the mirror not yet movable) leaves its failback
    // nothing to do, and the run says nothing either way. One more run then, saying why.
    let mut attempt = mirror_run(&args, store.path());
    let failed_over = |run: &Path| -> Vec<Value> {
        json_lines(&run.join("history.jsonl"))[1..]
            .iter()
            .filter(|o| o["f"] == "failover" && o["type"] == "info" && !o["error"].is_null())
            .cloned()
            .collect()
    };
    let refused = failed_over(&attempt.0);
    if !refused.is_empty() {
        eprintln!("a scheduled failover failed, running the schedule again: {refused:?}");
        attempt = mirror_run(&args, store.path());
    }
    let (run, results) = attempt;
    assert_nothing_forbidden(&results, &run);
    let history = json_lines(&run.join("history.jsonl"));
    let moves: Vec<&Value> = history[1..]
        .iter()
        .filter(|o| (o["f"] == "failover" || o["f"] == "failback") && o["type"] == "info")
        .collect();
    let backs: Vec<&Value> = history[1..]
        .iter()
        .filter(|o| o["f"] == "failback" && o["type"] == "info" && o["value"]["settle"].is_null())
        .collect();
    let into: Vec<(&str, &str)> = backs
        .iter()
        .map(|o| {
            let v = &o["value"];
            (
                v["to"].as_str().unwrap_or(""),
                v["lagging"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(into.len(), 2, "{moves:?}");
    assert_eq!(into[0].0, "a", "{backs:?}");
    assert_eq!(into[1].0, "b", "{backs:?}");
    for (to, node) in into {
        assert!(
            node.starts_with(to),
            "the failback into {to} lagged {node:?}: {backs:?}"
        );
    }
}

/// An unclean election in the old source between a failover and its failback moves its epoch
/// above the last mirrored one while clients not yet redirected still write to it; the failback
/// then runs with a1 (a follower of the elected a3) lagging. The final phase then fails over and
/// back again to A -> B. The same schedule with the flag off and on.
const UNCLEAN_ACROSS_FAILOVERS: &str = r#"[
  {"time_s": 2, "f": "failover", "value": {}},
  {"time_s": 3, "f": "unclean-election", "value": {"cluster": "a", "leader": "a3"}},
  {"time_s": 20, "f": "failback", "value": {"lagging": "a1"}}
]"#;

/// The `info` of the schedule's failback.
fn lagging_failback(run: &Path) -> Value {
    let history = json_lines(&run.join("history.jsonl"));
    history[1..]
        .iter()
        .find(|o| o["f"] == "failback" && o["type"] == "info" && o["value"]["lagging"] == "a1")
        .unwrap_or_else(|| {
            // What the nemesis did instead, to tell a late fault from a refused one.
            let faults: Vec<String> = history[1..]
                .iter()
                .filter(|o| o["process"] == "nemesis" && o["type"] == "info")
                .map(|o| format!("{} {} {}", o["time"], o["f"], o["value"]))
                .collect();
            panic!(
                "no lagging failback in {}; the nemesis did:\n{}",
                run.display(),
                faults.join("\n")
            )
        })["value"]
        .clone()
}

#[test]
fn the_flag_decides_whether_unclean_elections_across_failovers_may_diverge() {
    require_root("the_flag_decides_whether_unclean_elections_across_failovers_may_diverge");
    broker();
    let dir = tempfile::tempdir().unwrap();
    let schedule = schedule_file(dir.path(), UNCLEAN_ACROSS_FAILOVERS);
    // An epoch cache holds an epoch only once a batch of it is appended: a1 keeps one above the
    // LMLE only where clients still writing to A wrote in a new epoch (the unclean election's,
    // or one a fenced leader left) and a1 fetched it before the failback cut it off. With seed
    // 4 that usually happens; when it does not (once in a full suite; by hand, in one of three
    // runs at once no send reached t0/0 on A between the election and the failback, and only
    // another partition's epoch showed), another seed follows.
    let mut misses = Vec::new();
    for seed in ["4", "5", "6"] {
        match flag_off_and_on(&schedule, seed) {
            Ok(()) => return,
            Err(miss) => misses.push(miss),
        }
    }
    panic!(
        "with the flag off, a1 never kept an epoch above the LMLE:\n{}",
        misses.join("\n")
    );
}

/// The unclean schedule with `seed`, the flag off and on at once (each run spends most of its
/// time waiting on its brokers). Asserts what must hold in every run; `Err` says why the run
/// with the flag off showed no lagging replica above the LMLE.
fn flag_off_and_on(schedule: &str, seed: &str) -> Result<(), String> {
    // Proactive epoch bumps off, as in the seed scenarios: the clusters' epochs then meet, as
    // the flag's case needs.
    let base = [
        "--nemesis-schedule",
        schedule,
        "--time-limit",
        "30",
        "--seed",
        seed,
        "--broker-config",
        "mirror.epoch.bump.threshold=0",
    ];
    let (store_off, store_on) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut with_flag = base.to_vec();
    with_flag.push("--mirror-unclean-support");
    let ((run, off), (run_on, on)) = std::thread::scope(|s| {
        let off = s.spawn(|| mirror_run(&base, store_off.path()));
        let on = mirror_run(&with_flag, store_on.path());
        (off.join().unwrap(), on)
    });

    // On: the same schedule waits for a1 before mirroring, and must end converged.
    assert_nothing_forbidden(&on, &run_on);
    let back = lagging_failback(&run_on);
    assert_eq!(back["mirroring_while_lagging"], false, "{back}");
    for kind in ["mirror-divergence", "lmle-truncation"] {
        assert!(
            !strings(&on["anomaly_types"]).contains(&kind.to_string()),
            "{}: {on}",
            run_on.display()
        );
    }
    let test = json(&run_on.join("test.json"));
    assert_eq!(
        test["broker_config"]["mirror.support.unclean.leader.election"],
        "true"
    );

    // Off: the truncation waits for the ISR only, so the failback mirrors while a1 is cut off
    // and a1 keeps the epoch of the unclean election above the LMLE: a documented limitation
    // the verdict allows.
    assert_nothing_forbidden(&off, &run);
    let back = lagging_failback(&run);
    assert_eq!(back["mirroring_while_lagging"], true, "{back}");
    let history = json_lines(&run.join("history.jsonl"));
    let uncleans = history[1..]
        .iter()
        .filter(|o| o["f"] == "unclean-election" && o["type"] == "info")
        .count();
    assert_eq!(uncleans, 1, "{}", run.display());
    if strings(&off["anomaly_types"]).contains(&"mirror-divergence".to_string()) {
        assert!(off["allowed"]["mirror-divergence"].is_string(), "{off}");
    }
    if !strings(&off["anomaly_types"]).contains(&"lmle-truncation".to_string()) {
        return Err(format!(
            "seed {seed}: the lagging failback recorded {}",
            back["lagging_epochs"]
        ));
    }
    assert!(
        off["allowed"]["lmle-truncation"]
            .as_str()
            .is_some_and(|why| why.contains("a1 was out of the ISR")),
        "{}: {off}",
        run.display()
    );
    Ok(())
}
