//! Ctrl-C and SIGTERM stop a run cleanly: the history so far stays in the run directory, the
//! harness tears everything down and exits 255 (the run did not finish).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::engine::*;
use serde_json::Value;

fn history_lines(run: &Path) -> usize {
    std::fs::read_to_string(run.join("history.jsonl"))
        .map(|h| h.lines().count())
        .unwrap_or(0)
}

#[test]
fn sigint_and_sigterm_tear_the_run_down() {
    require_root("sigint_and_sigterm_tear_the_run_down");
    broker();
    for signal in ["-INT", "-TERM"] {
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
        while history_lines(&run) < 100 {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the run never got going"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let sent = Command::new("kill")
            .arg(signal)
            .arg(child.id().to_string())
            .status()
            .unwrap();
        assert!(sent.success());
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(255), "{signal}");
        let test: Value =
            serde_json::from_slice(&std::fs::read(run.join("test.json")).unwrap()).unwrap();
        assert_nothing_left(&test);
        assert!(history_lines(&run) >= 100);
    }
}
