//! `tidemark replay` and `tidemark shrink` end to end, on real brokers in namespaces: a run of a
//! broker with an injected bug shrinks to a few short faults that still fail, and that run
//! reproduces when replayed; a valid run replays valid; bad input is refused saying what and
//! where.
//!
//! The original replays a recorded schedule (`ack-before-replication-faults.json`: the faults a
//! 30 s run of the default kinds at `--nemesis-interval 3` drew with seed 1, as its history
//! recorded them), so that a change to what the generator draws cannot take the bug's exposing
//! fault (a leader cut off from its followers at 12.6 s, which loses acknowledged writes) away
//! from the test. The shrink keeps the anomaly evidenced first: now `ack-above-high-watermark`,
//! which polls show in the first seconds (a shrunk run of about 3 s keeps one short fault).
//!
//! Cost: the original is 30 s with faults of 2–4 s, so the exposing one comes early and the
//! shrink's first step cuts every later run to a few seconds; the replays are of the shrunk run.
//! About two and a half minutes of wall time in all on two cores.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use tidemark_nemesis::shrink::{faults, ScheduledOp};

use crate::support::engine::*;

fn tidemark_cmd(args: &[&str]) -> Output {
    Command::new(tidemark()).args(args).output().unwrap()
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every run directory of the store, `<test>/<stamp>`.
fn runs(store: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for test in std::fs::read_dir(store).unwrap().flatten() {
        if !test.file_type().unwrap().is_dir() {
            continue;
        }
        for run in std::fs::read_dir(test.path()).unwrap().flatten() {
            if run.file_type().unwrap().is_dir() {
                out.push(run.path());
            }
        }
    }
    out
}

/// `reproduced N of M tries` from replay's output.
fn reproduced(stdout: &str) -> (usize, usize) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with("reproduced "))
        .unwrap_or_else(|| panic!("no rate in:\n{stdout}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    (words[1].parse().unwrap(), words[3].parse().unwrap())
}

#[test]
fn an_injected_bug_shrinks_to_a_few_short_faults_that_replay() {
    require_root("an_injected_bug_shrinks_to_a_few_short_faults_that_replay");
    broker();
    let started = std::time::Instant::now();
    let store = tempfile::tempdir().unwrap();
    let recorded = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/e2e/cli/ack-before-replication-faults.json")
        .display()
        .to_string();
    let (original, results) = run_with_verdict(
        &[
            "--time-limit",
            "30",
            "--nemesis-schedule",
            &recorded,
            "--seed",
            "1",
            "--inject-bug",
            "ack-before-replication",
        ],
        store.path(),
    );
    assert_eq!(results["valid"], false, "{results}");

    let out = tidemark_cmd(&["shrink", original.to_str().unwrap(), "--budget-runs", "15"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The steps, for the test's log.
    eprintln!("{stdout}");
    let kept = stdout
        .lines()
        .next()
        .and_then(|l| l.split(" keeping ").nth(1))
        .and_then(|l| l.split(':').next())
        .unwrap_or_else(|| panic!("no anomaly named:\n{stdout}"))
        .to_string();
    assert!(
        results["bad_anomaly_types"]
            .as_array()
            .unwrap()
            .contains(&Value::String(kept.clone())),
        "{kept}: {results}"
    );
    let shrunk: Vec<PathBuf> = runs(store.path())
        .into_iter()
        .filter(|r| json(&r.join("test.json"))["shrunk_from"] == original.to_str().unwrap())
        .collect();
    assert_eq!(shrunk.len(), 1, "{stdout}");
    let shrunk = &shrunk[0];
    let test = json(&shrunk.join("test.json"));
    assert_eq!(test["shrunk_keeping"], kept.as_str(), "{test}");
    // Just past the exposing fault, or at most halfway back from there to the original's 30 s.
    assert!(test["time_limit_s"].as_f64().unwrap() <= 21.0, "{stdout}");
    let schedule: Vec<ScheduledOp> = serde_json::from_value(json(&shrunk.join("schedule.json")))
        .expect("schedule.json is a schedule");
    assert!(faults(&schedule).len() <= 3, "{stdout}");
    let shrunk_results = json(&shrunk.join("results.json"));
    assert_eq!(shrunk_results["valid"], false);
    assert!(shrunk_results["bad_anomaly_types"]
        .as_array()
        .unwrap()
        .contains(&Value::String(kept.clone())));
    // Every run made a step of its own, numbered within the budget, and the scratch store is gone.
    let steps = stdout.lines().filter(|l| l.starts_with("[run ")).count();
    assert!((1..=15).contains(&steps), "{stdout}");
    assert!(
        std::fs::read_dir(store.path())
            .unwrap()
            .flatten()
            .all(|e| !e.file_name().to_string_lossy().starts_with(".shrink-")),
        "scratch store left"
    );
    // Its report shows how to replay and shrink it, where it now is.
    let report = std::fs::read_to_string(shrunk.join("report.html")).unwrap();
    assert!(
        report.contains(&format!(
            "tidemark replay {} --anomaly {kept} --times 5",
            shrunk.display()
        )),
        "no replay command for {kept} in the report"
    );
    assert!(
        report.contains(&format!(", keeping {kept}")),
        "{kept} not named"
    );

    // The shrunk run, replayed, shows the anomaly it kept again: what a replay of it asks by
    // default, and the command shrink printed.
    let replay = format!(
        "tidemark replay {} --anomaly {kept} --times 5",
        shrunk.display()
    );
    assert!(stdout.contains(&replay), "{stdout}");
    let out = tidemark_cmd(&["replay", shrunk.to_str().unwrap(), "--times", "3"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    let (same, tries) = reproduced(&stdout);
    assert_eq!(tries, 3);
    assert!(same >= 2, "{stdout}");
    assert!(
        stdout.contains(&format!("reproduced: {kept} came back")),
        "{stdout}"
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("try ")).count(),
        3,
        "{stdout}"
    );
    for run in runs(store.path()) {
        assert_nothing_left(&json(&run.join("test.json")));
    }
    eprintln!(
        "shrink and replay: {:.0} s wall",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn a_valid_run_replays_valid_and_bad_input_is_refused() {
    require_root("a_valid_run_replays_valid_and_bad_input_is_refused");
    broker();
    let store = tempfile::tempdir().unwrap();
    let (run, results) = run_with_verdict(
        &[
            "--time-limit",
            "8",
            "--nemesis-interval",
            "2",
            "--seed",
            "2",
        ],
        store.path(),
    );
    assert_eq!(results["valid"], true, "{results}");
    let test = json(&run.join("test.json"));
    let sha = test["broker"]["sha256"].as_str().unwrap();
    assert_eq!(sha.len(), 64, "{sha}");

    let out = tidemark_cmd(&["replay", run.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(reproduced(&stdout), (1, 1), "{stdout}");
    assert!(stdout.contains("try 1/1: valid"), "{stdout}");

    // Nor can one ask whether an anomaly it never showed comes back.
    let out = tidemark_cmd(&["replay", run.to_str().unwrap(), "--anomaly", "lost-write"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(254), "{stderr}");
    assert!(
        stderr.contains("--anomaly lost-write") && stderr.contains("did not forbid it (valid)"),
        "{stderr}"
    );

    // A valid run has nothing to shrink.
    let out = tidemark_cmd(&["shrink", run.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(254), "{stderr}");
    assert!(stderr.contains("nothing to shrink"), "{stderr}");

    // Another broker build is refused, naming the field, unless --any-broker.
    let copy = store.path().join("queue").join("copy");
    let status = Command::new("cp")
        .arg("-r")
        .arg(&run)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let mut other = test.clone();
    other["broker"]["sha256"] = Value::String("0".repeat(64));
    std::fs::write(copy.join("test.json"), other.to_string()).unwrap();
    let out = tidemark_cmd(&["replay", copy.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(254), "{stderr}");
    assert!(
        stderr.contains("is not the build the run used") && stderr.contains("broker.sha256"),
        "{stderr}"
    );
    let mut broken = test.clone();
    broken["seed"] = Value::String("seven".into());
    std::fs::write(copy.join("test.json"), broken.to_string()).unwrap();
    let out = tidemark_cmd(&["replay", copy.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(254), "{stderr}");
    assert!(stderr.contains("test.json: field `seed`"), "{stderr}");
    let out = tidemark_cmd(&["replay", store.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(254));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a run directory"));
    assert_nothing_left(&test);
}
