//! A harness killed with -9 in the middle of a run: its streamed history is still checkable,
//! the next `tidemark test` names the leftovers and `tidemark teardown` (its namespaces carry
//! its own run id, so it goes on), and `tidemark teardown` removes every namespace, process and
//! directory the run left.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::engine::*;

fn history_lines(run: &Path) -> usize {
    std::fs::read_to_string(run.join("history.jsonl"))
        .map(|h| h.lines().count())
        .unwrap_or(0)
}

#[test]
fn a_run_killed_with_sigkill_leaves_a_checkable_history_and_teardown_cleans_up() {
    require_root("a_run_killed_with_sigkill_leaves_a_checkable_history_and_teardown_cleans_up");
    broker();
    let store = tempfile::tempdir().unwrap();
    let mut child = Command::new(tidemark())
        .args(["test", "--time-limit", "60", "--quiet"])
        .arg("--store")
        .arg(store.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let run = store.path().join("latest");
    let started = Instant::now();
    while history_lines(&run) < 200 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the run never got going"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let test = test_json(&run);

    let check = Command::new(tidemark())
        .args(["check"])
        .arg(&run)
        .output()
        .unwrap();
    let code = check.status.code();
    assert!(
        matches!(code, Some(0..=2)),
        "check exited {code:?}: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(run.join("results.json").is_file());

    let run_id = test["runtime"]["run"].as_str().unwrap();
    let next = Command::new(tidemark())
        .args(["test", "--time-limit", "1", "--quiet", "--store"])
        .arg(store.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&next.stderr);
    assert!(matches!(next.status.code(), Some(0..=2)), "{stderr}");
    assert!(
        stderr.contains(&format!("run {run_id}")) && stderr.contains("`tidemark teardown`"),
        "{stderr}"
    );

    // Only this run: other tests' killed runs are theirs to tear down.
    let teardown = Command::new(tidemark())
        .args(["teardown", "--run", run_id])
        .output()
        .unwrap();
    assert_eq!(
        teardown.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&teardown.stderr)
    );
    assert!(String::from_utf8_lossy(&teardown.stdout).contains("removed run"));
    assert_nothing_left(&test);

    let again = Command::new(tidemark())
        .args(["teardown", "--run", run_id])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).trim(),
        "nothing to tear down"
    );
}
