//! `tidemark report` and `tidemark serve` end to end, through the binary.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};

const HEADER: &str = r#"{"tidemark_history": 1, "test": {"name": "queue"}}"#;
const OPS: [&str; 4] = [
    r#"{"index": 0, "time": 0, "process": 0, "type": "invoke", "f": "send", "value": {"topic": "t", "partition": 0, "values": [17]}}"#,
    r#"{"index": 1, "time": 5000000, "process": 0, "type": "ok", "f": "send", "value": {"topic": "t", "partition": 0, "values": [17], "offset": 0}}"#,
    r#"{"index": 2, "time": 6000000, "process": "nemesis", "type": "invoke", "f": "kill", "value": {}}"#,
    r#"{"index": 3, "time": 7000000, "process": "nemesis", "type": "info", "f": "kill", "value": {"nodes": ["n2"]}}"#,
];

/// A store holding one run, `queue/20240229T235959.123Z`.
fn store() -> (tempfile::TempDir, std::path::PathBuf) {
    let store = tempfile::tempdir().unwrap();
    let run = store.path().join("queue").join("20240229T235959.123Z");
    std::fs::create_dir_all(&run).unwrap();
    let mut history = format!("{HEADER}\n");
    for op in OPS {
        history.push_str(op);
        history.push('\n');
    }
    std::fs::write(run.join("history.jsonl"), history).unwrap();
    (store, run)
}

fn tidemark(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args(args)
        .output()
        .expect("run tidemark")
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn report_renders_a_run_directory() {
    let (_store, run) = store();
    let out = tidemark(&["report", path(&run)]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        printed.trim(),
        run.join("report.html").display().to_string()
    );
    let html = std::fs::read_to_string(run.join("report.html")).unwrap();
    assert!(html.contains("no results.json: checked by the report"));
    assert!(html.contains("kill n2"));

    let out = tidemark(&["report", path(run.parent().unwrap())]);
    assert_eq!(out.status.code(), Some(254), "not a run directory");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a run directory"));
}

#[test]
fn serve_binds_loopback_and_answers() {
    let help = String::from_utf8_lossy(&tidemark(&["serve", "--help"]).stdout).into_owned();
    assert!(help.contains("[default: 127.0.0.1:8080]"), "{help}");
    assert_eq!(
        tidemark(&["serve", "--store", "/nonexistent/store"])
            .status
            .code(),
        Some(254)
    );

    let (store, _run) = store();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidemark"))
        .args([
            "serve",
            "--store",
            path(store.path()),
            "--bind",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .rsplit("http://")
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_owned();
    assert!(addr.starts_with("127.0.0.1:"), "{line}");
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "GET /?test=queue HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("20240229T235959.123Z"));
}
