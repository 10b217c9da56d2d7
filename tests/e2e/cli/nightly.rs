//! `tidemark nightly` end to end on real brokers: a matrix of 2 workloads × 2 seeds × one
//! injected bug that must be caught, run as two shards into two stores and merged; the JUnit
//! files validated against `junit.xsd` by xmllint, the merged index opened in headless
//! Chromium; a second night whose cases crash shows the flips and exits 255, a night out of
//! budget runs nothing and exits 2, and a SIGTERM stops the running child's test (which tears
//! its cluster down) and starts no other; `--list` prints the cases and runs nothing.
//!
//! Cost: four 15 s runs (`ack-before-replication` with partitions of the leaders every ~4 s,
//! caught in each when measured on an idle machine; at 12 s one of four was missed once beside
//! a full test run and a helper's builds), about 19 s each with set-up and teardown, then one
//! run cut short; about two minutes of wall time on two cores.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::engine::*;

const MATRIX: &str = r#"
budget_minutes = 10
args = ["--nemesis-targets", "leaders", "--nemesis-interval", "4"]

[[group]]
workloads = ["queue", "tiered"]
nemeses = ["partition"]
seeds = [1, 2]
correct = false
bugs = ["ack-before-replication"]
time_limit_s = 15
"#;

fn nightly(args: &[&str]) -> Output {
    Command::new(tidemark())
        .arg("nightly")
        .args(args)
        .output()
        .unwrap()
}

fn code(out: &Output) -> (Option<i32>, String) {
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The newest night directory of `store`.
fn latest_night(store: &Path) -> PathBuf {
    let mut nights: Vec<PathBuf> = std::fs::read_dir(store.join("nightly"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    nights.sort();
    nights.pop().expect("a night")
}

/// Validates `file` against the committed JUnit schema with xmllint.
fn assert_valid_junit(file: &Path) {
    let schema = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/e2e/cli/junit.xsd");
    let out = Command::new("xmllint")
        .arg("--noout")
        .arg("--schema")
        .arg(&schema)
        .arg(file)
        .output()
        .expect("xmllint runs: install libxml2-utils (scripts/setup-host)");
    assert!(
        out.status.success(),
        "{} does not validate: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn chromium_dom(page: &Path) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new("chromium")
        .args(["--headless", "--disable-gpu", "--no-sandbox", "--dump-dom"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("file://{}", page.display()))
        .stderr(Stdio::null())
        .output()
        .expect("chromium runs: install Debian's chromium (scripts/setup-host)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn history_lines(run: &Path) -> usize {
    std::fs::read_to_string(run.join("history.jsonl"))
        .map(|h| h.lines().count())
        .unwrap_or(0)
}

#[test]
fn list_prints_the_cases_and_their_minutes_and_runs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path().join("nightly.toml");
    std::fs::write(&matrix, MATRIX).unwrap();
    let m = matrix.to_str().unwrap();
    let store = dir.path().join("store");
    let out = nightly(&[m, "--list", "--store", store.to_str().unwrap()]);
    assert_eq!(code(&out).0, Some(0), "{}", code(&out).1);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    assert!(
        lines[0].starts_with("queue / partition / seed 1 / ack-before-replication / netns: tidemark test --workload queue --nemesis partition --seed 1")
            && lines[0].contains("--inject-bug ack-before-replication --nemesis-targets leaders"),
        "{stdout}"
    );
    assert!(
        lines[4].starts_with("4 of the matrix's 4 cases; main phases 1.0 min")
            && lines[4].ends_with("budget 10 min"),
        "{stdout}"
    );
    assert!(!store.exists(), "--list wrote a store");
    let out = nightly(&[m, "--list", "--shard", "2/2", "--budget-minutes", "3"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("2 of the matrix's 4 cases; main phases 0.5 min")
            && stdout.contains("budget 3 min"),
        "{stdout}"
    );
}

#[test]
fn a_sharded_night_merges_into_one_index_junit_and_trend() {
    require_root("a_sharded_night_merges_into_one_index_junit_and_trend");
    broker();
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path().join("nightly.toml");
    std::fs::write(&matrix, MATRIX).unwrap();
    let m = matrix.to_str().unwrap();
    let stores = [dir.path().join("shard-1"), dir.path().join("shard-2")];
    let began = Instant::now();
    for (i, store) in stores.iter().enumerate() {
        let shard = format!("{}/2", i + 1);
        let out = nightly(&[m, "--shard", &shard, "--store", store.to_str().unwrap()]);
        assert_eq!(code(&out).0, Some(0), "shard {shard}: {}", code(&out).1);
        let night = json(&latest_night(store).join("night.json"));
        let cases = night["cases"].as_array().unwrap();
        assert_eq!(cases.len(), 2, "{night}");
        for c in cases {
            assert_eq!(c["status"], "as-expected", "{c}");
            assert_eq!(c["verdict"], "invalid", "{c}");
            assert!(c["anomaly_counts"]
                .as_object()
                .is_some_and(|a| !a.is_empty()));
            let report = store
                .join(c["run_dir"].as_str().unwrap())
                .join("report.html");
            assert!(report.is_file(), "{}", report.display());
        }
        let gaps: Vec<f64> = night["gaps_s"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_f64().unwrap())
            .collect();
        assert_eq!(gaps.len(), 1);
        assert!(gaps[0] < 5.0, "overhead between runs {gaps:?} s");
        println!("shard {shard}: overhead between runs {gaps:?} s");
        assert_valid_junit(&latest_night(store).join("junit.xml"));
    }
    println!(
        "two shards of 4 runs: {:.0} s",
        began.elapsed().as_secs_f64()
    );

    let merged = dir.path().join("merged");
    let out = nightly(&[
        "merge",
        stores[0].to_str().unwrap(),
        stores[1].to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]);
    assert_eq!(code(&out).0, Some(0), "{}", code(&out).1);
    let junit = merged.join("junit.xml");
    assert_valid_junit(&junit);
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert_eq!(xml.matches("<testcase ").count(), 4, "{xml}");
    assert!(xml.contains("tests=\"4\" failures=\"0\" errors=\"0\" skipped=\"0\""));
    for seed in [1, 2] {
        assert!(xml.contains(&format!(
            "name=\"seed {seed} ack-before-replication netns\""
        )));
    }

    let dom = chromium_dom(&merged.join("index.html"));
    assert_eq!(
        dom.matches("<tr class=\"as-expected\">").count(),
        4,
        "{dom}"
    );
    assert!(dom.contains("<span id=\"exit-code\">0</span>"), "{dom}");
    assert!(dom.contains("Overhead between runs"));
    let links: Vec<&str> = dom
        .split("href=\"")
        .skip(1)
        .map(|s| &s[..s.find('"').unwrap()])
        .collect();
    assert_eq!(links.len(), 4, "{links:?}");
    for link in links {
        assert!(
            merged.join(link).is_file(),
            "{link} does not lead to a report"
        );
    }

    // The next night of shard 1: the same cases crash (a node count the runtime refuses), the
    // night goes on to the second, and both flips show.
    let crashing = MATRIX
        .replace("seeds = [1, 2]", "seeds = [1]")
        .replace("\"4\"]", "\"4\", \"--nodes\", \"0\"]");
    std::fs::write(&matrix, crashing).unwrap();
    let out = nightly(&[m, "--store", stores[0].to_str().unwrap()]);
    assert_eq!(code(&out).0, Some(255), "{}", code(&out).1);
    let night = latest_night(&stores[0]);
    let record = json(&night.join("night.json"));
    let statuses: Vec<&Value> = record["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["status"])
        .collect();
    assert_eq!(statuses, ["crashed", "crashed"], "{record}");
    let junit = night.join("junit.xml");
    assert_valid_junit(&junit);
    assert!(std::fs::read_to_string(&junit)
        .unwrap()
        .contains("tests=\"2\" failures=\"0\" errors=\"2\""));
    let dom = chromium_dom(&night.join("index.html"));
    for workload in ["queue", "tiered"] {
        let flip = format!(
            "<li>{workload} / partition / seed 1 / ack-before-replication / netns: as-expected → crashed</li>"
        );
        assert!(dom.contains(&flip), "{flip} not in {dom}");
    }

    // A budget too small for any case: nothing runs, the night is unknown.
    std::fs::write(&matrix, MATRIX).unwrap();
    let out = nightly(&[
        m,
        "--store",
        stores[1].to_str().unwrap(),
        "--budget-minutes",
        "0.1",
    ]);
    assert_eq!(code(&out).0, Some(2), "{}", code(&out).1);
    let junit = latest_night(&stores[1]).join("junit.xml");
    assert_valid_junit(&junit);
    assert!(std::fs::read_to_string(&junit)
        .unwrap()
        .contains("tests=\"4\" failures=\"0\" errors=\"0\" skipped=\"4\""));
}

#[test]
fn sigterm_stops_the_running_case_and_starts_no_other() {
    require_root("sigterm_stops_the_running_case_and_starts_no_other");
    broker();
    let dir = tempfile::tempdir().unwrap();
    let matrix = dir.path().join("nightly.toml");
    std::fs::write(
        &matrix,
        MATRIX.replace("time_limit_s = 15", "time_limit_s = 60"),
    )
    .unwrap();
    let store = dir.path().join("store");
    let mut child = Command::new(tidemark())
        .arg("nightly")
        .arg(&matrix)
        .arg("--store")
        .arg(&store)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run = store.join("latest");
    let started = Instant::now();
    while history_lines(&run) < 50 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the first case never got going"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let sent = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(255));
    let test = json(&run.join("test.json"));
    assert_nothing_left(&test);
    let night = json(&latest_night(&store).join("night.json"));
    let verdicts: Vec<&Value> = night["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["verdict"])
        .collect();
    assert_eq!(
        verdicts,
        ["crashed", "not-run", "not-run", "not-run"],
        "{night}"
    );
    assert_eq!(night["finished"], false);
    let tests: Vec<_> = std::fs::read_dir(&store)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("nightly-"))
        .collect();
    assert_eq!(tests.len(), 1, "only the first case ever started");
}
