//! Shared by the engine's integration tests: where the binaries are, whether we may create
//! namespaces, and how to tell that a run left nothing behind.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

use serde_json::Value;

static HOSTS: Mutex<()> = Mutex::new(());

/// `test.json` of a run directory.
pub fn test_json(run_dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(run_dir.join("test.json")).expect("test.json"))
        .expect("test.json is JSON")
}

/// Every line of a JSON-lines file (a history, replicas.jsonl), parsed.
pub fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// How many replicas a run dumped (`replicas.jsonl`, one line each).
pub fn replica_count(run_dir: &Path) -> usize {
    std::fs::read_to_string(run_dir.join("replicas.jsonl"))
        .expect("replicas.jsonl")
        .lines()
        .count()
}

/// The nemesis's completed ops (`info`) among `ops`, in order.
pub fn nemesis_infos(ops: &[Value]) -> Vec<&Value> {
    ops.iter()
        .filter(|o| o["process"] == "nemesis" && o["type"] == "info")
        .collect()
}

/// The `fields` of each node test.json records, in its order (a missing field reads as "").
pub fn node_fields(test: &Value, fields: &[&str]) -> Vec<Vec<String>> {
    test["nodes"]
        .as_array()
        .expect("test.json lists nodes")
        .iter()
        .map(|n| {
            fields
                .iter()
                .map(|f| n[*f].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .collect()
}

/// One `--runtime hosts` test at a time: every test's SSH machines are namespaces with the same
/// addresses, and a run killed on them would, rightly, stop another test's run on "its" hosts.
pub fn hosts_turn() -> MutexGuard<'static, ()> {
    HOSTS.lock().unwrap_or_else(|p| p.into_inner())
}

/// `tidemark test ARGS --quiet --store STORE`, run to its end.
pub fn tidemark_test(args: &[&str], store: &Path) -> Output {
    Command::new(tidemark())
        .arg("test")
        .args(args)
        .arg("--quiet")
        .arg("--store")
        .arg(store)
        .output()
        .unwrap()
}

/// Runs `tidemark test ARGS` into `store` and returns the run directory and its results,
/// whatever the exit code; panics with stderr when the run left no verdict.
pub fn run_with_verdict(args: &[&str], store: &Path) -> (PathBuf, Value) {
    let out = tidemark_test(args, store);
    let run = std::fs::canonicalize(store.join("latest")).unwrap_or_default();
    let results = std::fs::read(run.join("results.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| {
            panic!(
                "{args:?}: no verdict (exit {:?}):\n{}",
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            )
        });
    (run, results)
}

/// The stderr of a `tidemark test` that must refuse its arguments as bad input (exit 254).
pub fn usage_error(args: &[&str]) -> String {
    let store = tempfile::tempdir().unwrap();
    let out = tidemark_test(args, store.path());
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(254), "{args:?}: {stderr}");
    stderr
}

/// The `tidemark` binary under test.
pub fn tidemark() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tidemark"))
}

/// The broker binary beside it; `cargo build --workspace` puts it there.
pub fn broker() -> PathBuf {
    let b = tidemark().with_file_name("tidemark-broker");
    assert!(
        b.is_file(),
        "{} is missing: run `cargo build --workspace` before `cargo test`",
        b.display()
    );
    b
}

/// Fails `test` unless it runs as root, which namespaces need. A failure rather than a skip: a
/// skipped test reports `ok` without proving anything, and the README runs the tests as root.
pub fn require_root(test: &str) {
    let uid = Command::new("id").arg("-u").output().expect("id -u");
    assert!(
        String::from_utf8_lossy(&uid.stdout).trim() == "0",
        "{test} needs root to create network namespaces: run the tests as root, as the README \
         says (scripts/setup-host && cargo test)"
    );
}

/// Asserts that nothing of the run described by `test` remains: no namespace with its prefix, no
/// work directory, no live process started from it.
pub fn assert_nothing_left(test: &Value) {
    let prefix = test["runtime"]["namespace_prefix"]
        .as_str()
        .expect("prefix");
    let work_dir = test["runtime"]["work_dir"].as_str().expect("work dir");
    let list = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip");
    let list = String::from_utf8_lossy(&list.stdout);
    assert!(
        !list.lines().any(|l| l.starts_with(prefix)),
        "namespaces left: {list}"
    );
    assert!(!Path::new(work_dir).exists(), "{work_dir} left");
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(
            !cmdline.contains(work_dir),
            "process {} left: {cmdline}",
            entry.file_name().to_string_lossy()
        );
    }
}
