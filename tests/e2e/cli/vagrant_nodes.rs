//! `tidemark vagrant-nodes` as a user runs it: `vagrant ssh-config` output on stdin becomes a
//! nodes file `--runtime hosts` reads, with the command to run printed; output it cannot use is
//! refused naming the line. (`--runtime docker` usage errors sit here too: neither needs Docker.)

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use crate::support::engine::{tidemark, usage_error};

fn vagrant_nodes(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(tidemark())
        .arg("vagrant-nodes")
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
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn ssh_config_on_stdin_becomes_a_nodes_file() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = dir.path().join("nodes.txt");
    let config = "Host n1\n  HostName 192.168.56.11\n  User vagrant\n  Port 22\n  \
                  IdentityFile /k/n1\nHost n2\n  HostName 192.168.56.12\n  IdentityFile /k/n2\n";
    let out = vagrant_nodes(
        &["--ssh-config", "-", "--output", nodes.to_str().unwrap()],
        config,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("ssh-add /k/n1 /k/n2 && tidemark test --runtime hosts --nodes-file"),
        "{stderr}"
    );
    let file = tidemark_harness::hosts::read_nodes_file(&nodes).unwrap();
    assert_eq!(
        file.hosts(),
        vec![
            "192.168.56.11:22".parse().unwrap(),
            "192.168.56.12:22".parse().unwrap()
        ]
    );

    let forwarded = vagrant_nodes(
        &["--ssh-config", "-"],
        "Host n1\n  HostName 127.0.0.1\n  Port 2222\n",
    );
    let stderr = String::from_utf8_lossy(&forwarded.stderr);
    assert_eq!(forwarded.status.code(), Some(254), "{stderr}");
    assert!(
        stderr.contains("stdin:2: HostName 127.0.0.1 is a port forwarded"),
        "{stderr}"
    );
    assert!(forwarded.stdout.is_empty());
}

#[test]
fn the_docker_runtime_refuses_what_it_cannot_run() {
    let e = usage_error(&["--runtime", "docker", "--nodes-file", "/nonexistent"]);
    assert!(e.contains("--nodes-file goes with --runtime hosts"), "{e}");
    let e = usage_error(&["--runtime", "docker", "--workload", "tiered"]);
    assert!(e.contains("runs on the netns runtime only"), "{e}");
    let e = usage_error(&["--runtime", "podman"]);
    assert!(e.contains("available: netns, hosts, docker"), "{e}");
}
