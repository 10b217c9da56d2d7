//! The node image of `--runtime docker`, made once per run of this test binary with `tidemark
//! image build` (which itself reuses an image whose inputs are unchanged), and what the docker
//! tests check Docker for.

use std::process::Command;
use std::sync::{Mutex, MutexGuard, OnceLock};

use super::engine::{broker, tidemark};

static IMAGE: OnceLock<Result<(), String>> = OnceLock::new();
static TURN: Mutex<()> = Mutex::new(());

/// One docker test at a time (three brokers each on two cores), with the image made.
pub fn docker_turn() -> MutexGuard<'static, ()> {
    let turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let made = IMAGE.get_or_init(|| {
        broker();
        let out = Command::new(tidemark())
            .args(["image", "build"])
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    });
    if let Err(e) = made {
        panic!("tidemark image build failed: {e}");
    }
    turn
}

/// `docker ARGS`' stdout, asserting it succeeded.
pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The containers (running or not) and networks that carry the label of run `run`.
pub fn labelled(run: &str) -> (Vec<String>, Vec<String>) {
    let filter = format!("label=tidemark.run={run}");
    let lines = |s: String| s.lines().map(str::to_string).collect::<Vec<_>>();
    (
        lines(docker(&[
            "ps",
            "-a",
            "--filter",
            &filter,
            "--format",
            "{{.Names}}",
        ])),
        lines(docker(&[
            "network",
            "ls",
            "--filter",
            &filter,
            "--format",
            "{{.Name}}",
        ])),
    )
}
