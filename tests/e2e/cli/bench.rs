//! `tidemark bench-detection` when a run never begins: it stops there and says what the test said.

use std::process::Command;

#[test]
fn a_run_refused_before_it_began_is_reported_with_the_tests_own_reason() {
    let store = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args([
            "bench-detection",
            "--seeds",
            "1",
            "--correct-seeds",
            "0",
            "--bugs",
            "hw-truncation",
            "--store",
        ])
        .arg(store.path())
        .args(["--", "--nemesis", "meteor-strike"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(255));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("hw-truncation seed 1")
            && stderr.contains("made no run directory")
            && stderr.contains("exit Some(254)")
            && stderr.contains("unknown fault kind(s): meteor-strike"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "a table of nothing was printed");
}
