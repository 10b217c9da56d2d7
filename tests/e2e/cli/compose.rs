//! docker/compose.yaml as the README tells people to use it: a 3-node cluster from the image
//! `tidemark image build` makes, started with docker-compose (or `docker compose`), written to
//! with kcat and acks=all, read back from another broker, and stopped with nothing of the
//! project left. About 10 s once the image is made.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::docker::{docker, docker_turn};
use crate::support::engine::require_root;

/// The project name, so `down` removes this test's containers and network and nothing else.
const PROJECT: &str = "tidemark-e2e-compose";

fn compose_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("docker/compose.yaml")
}

/// `docker-compose ARGS` where it is installed, else the `docker compose` plugin.
fn compose(args: &[&str]) -> Output {
    let file = compose_file();
    let file = file.to_str().unwrap();
    let standalone = Command::new("docker-compose")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let mut cmd = if standalone {
        Command::new("docker-compose")
    } else {
        let mut c = Command::new("docker");
        c.arg("compose");
        c
    };
    cmd.args(["-p", PROJECT, "-f", file])
        .args(args)
        .output()
        .unwrap()
}

fn kcat(args: &[&str], input: &str) -> Output {
    use std::io::Write as _;
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Takes the cluster down whatever the test's outcome.
struct Down;

impl Drop for Down {
    fn drop(&mut self) {
        let out = compose(&["down", "-v", "--remove-orphans"]);
        if !out.status.success() {
            eprintln!("compose down: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

#[test]
fn the_compose_cluster_takes_acks_all_writes_from_kcat() {
    require_root("the_compose_cluster_takes_acks_all_writes_from_kcat");
    let _turn = docker_turn();
    let up = compose(&["up", "-d"]);
    let down = Down;
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    // The first write waits for the quorum and the topic to exist; kcat retries until then.
    let records = "r1\nr2\nr3\n";
    let started = Instant::now();
    loop {
        let sent = kcat(
            &[
                "-b",
                "10.214.0.11:9092",
                "-P",
                "-t",
                "compose",
                "-X",
                "acks=all",
                "-X",
                "message.timeout.ms=5000",
            ],
            records,
        );
        if sent.status.success() && sent.stderr.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no acks=all write within 60 s: {}",
            String::from_utf8_lossy(&sent.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let read = kcat(
        &[
            "-b",
            "10.214.0.13:9092",
            "-C",
            "-t",
            "compose",
            "-o",
            "beginning",
            "-c",
            "3",
            "-e",
            "-q",
        ],
        "",
    );
    assert_eq!(String::from_utf8_lossy(&read.stdout), records);
    let listing = kcat(&["-b", "10.214.0.12:9092", "-L", "-t", "compose"], "");
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(listing.contains("replicas: 1,2,3"), "{listing}");

    drop(down);
    let filter = format!("label=com.docker.compose.project={PROJECT}");
    assert_eq!(docker(&["ps", "-aq", "--filter", &filter]), "");
    assert_eq!(docker(&["network", "ls", "-q", "--filter", &filter]), "");
}
