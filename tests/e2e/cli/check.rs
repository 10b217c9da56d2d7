//! `tidemark check` end to end: exit codes, results.json, the printed summary.

use std::path::Path;
use std::process::{Command, Output};

const HEADER: &str = r#"{"tidemark_history": 1, "test": {"name": "queue"}}"#;
const SEND_INVOKE: &str = r#"{"index": 0, "time": 0, "process": 0, "type": "invoke", "f": "send", "value": {"topic": "t", "partition": 0, "values": [17, 18]}}"#;
const SEND_OK: &str = r#"{"index": 1, "time": 5, "process": 0, "type": "ok", "f": "send", "value": {"topic": "t", "partition": 0, "values": [17, 18], "offset": 0}}"#;
const POLL_INVOKE: &str = r#"{"index": 2, "time": 6, "process": 1, "type": "invoke", "f": "poll", "value": {"topic": "t", "partition": 0, "from": 0}}"#;
const POLL_OK: &str = r#"{"index": 3, "time": 9, "process": 1, "type": "ok", "f": "poll", "value": {"topic": "t", "partition": 0, "from": 0, "records": [[0, 17, 1], [1, 18, 1]], "high_watermark": 2}}"#;
const LEADER: &str = r#"{"cluster": "a", "node": "n1", "topic": "t", "partition": 0, "role": "leader", "log_start_offset": 0, "high_watermark": 2, "log_end_offset": 2, "epochs": [[1, 0]], "records": [[0, 17, 1], [1, 18, 1]]}"#;
const SHORT_LEADER: &str = r#"{"cluster": "a", "node": "n1", "topic": "t", "partition": 0, "role": "leader", "log_start_offset": 0, "high_watermark": 1, "log_end_offset": 1, "epochs": [[1, 0]], "records": [[0, 17, 1]]}"#;

fn lines(ls: &[&str]) -> String {
    ls.iter().map(|l| format!("{l}\n")).collect()
}

fn tidemark(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .arg("check")
        .args(args)
        .output()
        .expect("run tidemark")
}

fn run_dir(history: &str, replicas: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("history.jsonl"), history).unwrap();
    if let Some(r) = replicas {
        std::fs::write(dir.path().join("replicas.jsonl"), r).unwrap();
    }
    dir
}

fn results(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn valid_run_directory_exits_zero() {
    let dir = run_dir(
        &lines(&[HEADER, SEND_INVOKE, SEND_OK, POLL_INVOKE, POLL_OK]),
        Some(&lines(&[LEADER])),
    );
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stdout(&out).contains("verdict: VALID"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("send ok 1 fail 0 info 0"),
        "{}",
        stdout(&out)
    );
    let r = results(&dir.path().join("results.json"));
    assert_eq!(r["valid"], true);
    assert_eq!(r["stats"]["send"]["ok"], 1);
    assert_eq!(r["anomaly_types"], serde_json::json!([]));
}

#[test]
fn lost_write_exits_one_and_names_the_proof() {
    let dir = run_dir(
        &lines(&[HEADER, SEND_INVOKE, SEND_OK]),
        Some(&lines(&[SHORT_LEADER])),
    );
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let text = stdout(&out);
    assert!(text.contains("verdict: INVALID"), "{text}");
    assert!(text.contains("lost-write: 1 (forbidden)"), "{text}");
    let r = results(&dir.path().join("results.json"));
    assert_eq!(r["valid"], false);
    assert_eq!(r["bad_anomaly_types"], serde_json::json!(["lost-write"]));
    let e = &r["anomalies"]["lost-write"][0];
    assert_eq!(
        (e["value"].clone(), e["op_index"].clone()),
        (18.into(), 1.into())
    );
}

#[test]
fn history_file_with_replicas_and_out_flags() {
    let dir = run_dir(&lines(&[HEADER, SEND_INVOKE, SEND_OK]), None);
    let replicas = dir.path().join("elsewhere.jsonl");
    std::fs::write(&replicas, lines(&[SHORT_LEADER])).unwrap();
    let out_path = dir.path().join("out.json");
    let history = dir.path().join("history.jsonl");
    let out = tidemark(&[
        history.to_str().unwrap(),
        "--replicas",
        replicas.to_str().unwrap(),
        "--out",
        out_path.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(printed, results(&out_path));
    assert!(!dir.path().join("results.json").exists());
}

/// Without replicas.jsonl lost writes and divergence cannot be judged: a clean history alone
/// (what a run killed before its final reads leaves) is unknown, exit 2, never valid.
#[test]
fn history_file_alone_writes_results_beside_it_and_is_unknown() {
    let dir = run_dir(
        &lines(&[HEADER, SEND_INVOKE, SEND_OK, POLL_INVOKE, POLL_OK]),
        None,
    );
    let out = tidemark(&[dir.path().join("history.jsonl").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("verdict: UNKNOWN"),
        "{}",
        stdout(&out)
    );
    let r = results(&dir.path().join("results.json"));
    assert_eq!(r["valid"], "unknown");
    assert!(r["skipped_checks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["check"] == "divergence"));
    assert!(
        stdout(&out).contains("skipped divergence"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn malformed_line_exits_254_naming_file_and_line() {
    let bad = POLL_INVOKE.replace("\"invoke\"", "\"begun\"");
    let dir = run_dir(&lines(&[HEADER, SEND_INVOKE, SEND_OK, &bad, POLL_OK]), None);
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(254));
    let err = stderr(&out);
    assert!(err.contains("history.jsonl:4: malformed op"), "{err}");
    assert!(!dir.path().join("results.json").exists());
}

#[test]
fn truncated_last_line_is_tolerated() {
    let text = lines(&[HEADER, SEND_INVOKE, SEND_OK, POLL_INVOKE, POLL_OK]) + &POLL_OK[..30];
    let dir = run_dir(&text, Some(&lines(&[LEADER])));
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("warning: line 6: ignored a truncated last line"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn missing_header_exits_254() {
    let dir = run_dir(&lines(&[SEND_INVOKE, SEND_OK]), None);
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(254));
    assert!(
        stderr(&out).contains("history.jsonl:1: missing header"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn malformed_replicas_exit_254_naming_their_line() {
    let dir = run_dir(
        &lines(&[HEADER, SEND_INVOKE, SEND_OK]),
        Some(&lines(&[LEADER, "{\"node\": 1}"])),
    );
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(254));
    assert!(
        stderr(&out).contains("replicas.jsonl:2: malformed replica state"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn missing_path_exits_254() {
    let out = tidemark(&["/nonexistent/tidemark/run"]);
    assert_eq!(out.status.code(), Some(254));
    let dir = tempfile::tempdir().unwrap();
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(
        out.status.code(),
        Some(254),
        "a directory without history.jsonl"
    );
    assert!(stderr(&out).contains("history.jsonl"), "{}", stderr(&out));
}

#[test]
fn no_completed_op_is_unknown() {
    let dir = run_dir(&lines(&[HEADER, SEND_INVOKE]), None);
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        results(&dir.path().join("results.json"))["valid"],
        "unknown"
    );
}

/// A history line is bounded: an endless one (here /dev/zero, no newline ever) is bad input
/// naming file and line, not a process that grows until memory runs out.
#[test]
fn an_endless_line_exits_254_naming_file_and_line() {
    let out = tidemark(&["/dev/zero"]);
    assert_eq!(out.status.code(), Some(254), "{}", stderr(&out));
    assert!(stderr(&out).contains("/dev/zero:1:"), "{}", stderr(&out));
    assert!(stderr(&out).contains("16 MiB"), "{}", stderr(&out));
}

/// Values that cannot be real are bad input naming the file and line, not silently judged.
#[test]
fn impossible_values_exit_254_naming_file_and_line() {
    let above = LEADER.replace("\"high_watermark\": 2", "\"high_watermark\": 9");
    let dir = run_dir(
        &lines(&[HEADER, SEND_INVOKE, SEND_OK]),
        Some(&lines(&[&above])),
    );
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(254), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("replicas.jsonl:1:"), "{err}");
    assert!(
        err.contains("high_watermark 9 is above log_end_offset 2"),
        "{err}"
    );
    let dir = run_dir(
        &lines(&[HEADER, SEND_INVOKE, SEND_OK]),
        Some(&lines(&[LEADER, LEADER])),
    );
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(254));
    assert!(
        stderr(&out).contains("replicas.jsonl:2: the same replica"),
        "{}",
        stderr(&out)
    );
    let negative = SEND_OK.replace("\"offset\": 0", &format!("\"offset\": {}", i64::MIN));
    let dir = run_dir(
        &lines(&[HEADER, SEND_INVOKE, &negative]),
        Some(&lines(&[LEADER])),
    );
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(254));
    assert!(
        stderr(&out).contains("history.jsonl:3:"),
        "{}",
        stderr(&out)
    );
    assert!(!dir.path().join("results.json").exists());
}

/// The checker is picked by the header's `workload`: a name tidemark does not know is bad input.
#[test]
fn an_unknown_workload_exits_254_naming_it() {
    let header = r#"{"tidemark_history": 1, "test": {"name": "x", "workload": "bank"}}"#;
    let dir = run_dir(
        &lines(&[header, SEND_INVOKE, SEND_OK]),
        Some(&lines(&[LEADER])),
    );
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(254), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(err.contains("history.jsonl:1:"), "{err}");
    assert!(err.contains("unknown workload \"bank\""), "{err}");
    let queue = header.replace("bank", "queue");
    let dir = run_dir(
        &lines(&[&queue, SEND_INVOKE, SEND_OK, POLL_INVOKE, POLL_OK]),
        Some(&lines(&[LEADER])),
    );
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

/// A replicas.jsonl that is there but cannot be read (a dangling symlink) is bad input, not a
/// run without replicas.
#[test]
fn a_dangling_replicas_symlink_exits_254() {
    let dir = run_dir(
        &lines(&[HEADER, SEND_INVOKE, SEND_OK, POLL_INVOKE, POLL_OK]),
        None,
    );
    std::os::unix::fs::symlink(
        dir.path().join("gone.jsonl"),
        dir.path().join("replicas.jsonl"),
    )
    .unwrap();
    let out = tidemark(&[dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(254), "{}", stdout(&out));
    assert!(stderr(&out).contains("replicas.jsonl"), "{}", stderr(&out));
    assert!(!dir.path().join("results.json").exists());
}

/// `--out` naming an input (directly or through a link) is refused: the history is evidence.
#[test]
fn out_equal_to_an_input_is_refused() {
    let text = lines(&[HEADER, SEND_INVOKE, SEND_OK, POLL_INVOKE, POLL_OK]);
    let dir = run_dir(&text, Some(&lines(&[LEADER])));
    let history = dir.path().join("history.jsonl");
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&history, &link).unwrap();
    let dotted = dir.path().join(".").join("history.jsonl");
    let replicas = dir.path().join("replicas.jsonl");
    for out_path in [&history, &link, &dotted, &replicas] {
        let out = tidemark(&[
            dir.path().to_str().unwrap(),
            "--out",
            out_path.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(254), "{}", out_path.display());
        assert!(stderr(&out).contains("--out"), "{}", stderr(&out));
    }
    assert_eq!(std::fs::read_to_string(&history).unwrap(), text);
    assert_eq!(
        std::fs::read_to_string(&replicas).unwrap(),
        lines(&[LEADER])
    );
}
