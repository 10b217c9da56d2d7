//! The SSH remote against a real OpenSSH server running inside a node's network namespace:
//! commands with their exit codes, uploads and downloads, the known-hosts policies, and the
//! broker deployed, started, killed and stopped through it, exactly as on a VM.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::engine::*;
use crate::support::sshd::{keygen, run_sshd, start_sshd};
use tidemark_harness::broker::{BrokerConfig, TidemarkBroker};
use tidemark_harness::client::ClientContext;
use tidemark_harness::db::Db;
use tidemark_harness::leftovers;
use tidemark_harness::netns::NetnsRuntime;
use tidemark_harness::probe::await_ready;
use tidemark_harness::remote::{self, Remote, RemoteError};
use tidemark_harness::runner::CancellationToken;
use tidemark_harness::runtime::{Node, NodeRole, Runtime};
use tidemark_harness::ssh::{KnownHosts, Ssh, SshConfig};

fn config(node: &Node, dir: &Path, known_hosts: KnownHosts) -> SshConfig {
    SshConfig {
        user: "root".into(),
        addr: std::net::SocketAddr::new(node.ip, 22),
        key_file: Some(dir.join("client")),
        use_agent: false,
        known_hosts,
        timeout: Duration::from_secs(20),
    }
}

/// A small file on the node, for a download under the bound.
fn src_small(ssh: &Ssh, node: &Node) -> PathBuf {
    let path = node.dir.join("small");
    remote::run(ssh, &format!("echo small > {}", path.display())).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_driven_over_ssh_including_the_broker() {
    require_root("a_node_is_driven_over_ssh_including_the_broker");
    let work = tempfile::tempdir().unwrap();
    let mut runtime = NetnsRuntime::new(work.path(), &leftovers::new_run_id()).unwrap();
    let record = serde_json::json!({"runtime": runtime.describe()});
    let nodes = runtime.create("a", &["n1".to_string()]).unwrap();
    let local = &nodes[0];
    let keys = local.dir.join("ssh");
    std::fs::create_dir_all(&keys).unwrap();
    keygen(&keys.join("client"));
    start_sshd(local, &keys, &keys.join("client.pub"));
    let known_hosts = keys.join("known_hosts");

    let started = Instant::now();
    let ssh = loop {
        match Ssh::connect(
            config(local, &keys, KnownHosts::AcceptNew(known_hosts.clone())),
            runtime.dialer(),
        ) {
            Ok(s) => break s,
            Err(e) if started.elapsed() > Duration::from_secs(10) => panic!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert_eq!(ssh.describe(), format!("ssh root@{}:22", local.ip));

    // Commands: output, exit codes, and arguments that need quoting.
    assert_eq!(
        remote::run(&ssh, "echo hello; id -un").unwrap(),
        "hello\nroot"
    );
    let out = ssh.exec("echo out; echo err >&2; exit 7").unwrap();
    assert_eq!(
        (out.exit, out.stdout.as_str(), out.stderr.as_str()),
        (7, "out\n", "err\n")
    );
    assert!(matches!(
        remote::run(&ssh, "false"),
        Err(RemoteError::NonZero { exit: 1, .. })
    ));
    let tricky = "it's $HOME; `x`";
    assert_eq!(
        remote::run(&ssh, &remote::command_line(&["printf", "%s", tricky])).unwrap(),
        tricky
    );

    // Upload and download keep bytes and permission bits.
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let src = work.path().join("payload");
    std::fs::write(&src, &payload).unwrap();
    std::fs::set_permissions(&src, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
    let remote_path = local.dir.join("uploaded");
    ssh.upload(&src, &remote_path).unwrap();
    assert_eq!(
        remote::run(&ssh, &format!("wc -c < {}", remote_path.display()))
            .unwrap()
            .trim(),
        "200000"
    );
    let back = work.path().join("downloaded");
    ssh.download(&remote_path, &back).unwrap();
    assert_eq!(std::fs::read(&back).unwrap(), payload);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&back).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o640);

    // The host key was recorded; strict checking now accepts it and refuses an empty file.
    assert!(std::fs::read_to_string(&known_hosts)
        .unwrap()
        .contains(&local.ip.to_string()));
    Ssh::connect(
        config(local, &keys, KnownHosts::Strict(known_hosts.clone())),
        runtime.dialer(),
    )
    .unwrap();
    let empty = keys.join("empty_known_hosts");
    std::fs::write(&empty, "").unwrap();
    let refused = Ssh::connect(
        config(local, &keys, KnownHosts::Strict(empty)),
        runtime.dialer(),
    )
    .err()
    .unwrap()
    .to_string();
    assert!(refused.contains("is not in"), "{refused}");
    // tidemark's own known_hosts: concurrent writers (two runs) each record the host once,
    // what was in the file (comments too) survives, and a missing directory is made.
    let shared = keys.join("shared_known_hosts");
    std::fs::write(&shared, "# keys of the nightly cluster\n").unwrap();
    let racers: Vec<_> = (0..6)
        .map(|_| {
            let (c, d) = (
                config(local, &keys, KnownHosts::AcceptNew(shared.clone())),
                runtime.dialer(),
            );
            std::thread::spawn(move || Ssh::connect(c, d).map(drop))
        })
        .collect();
    for r in racers {
        r.join().unwrap().unwrap();
    }
    let kept = std::fs::read_to_string(&shared).unwrap();
    assert!(
        kept.starts_with("# keys of the nightly cluster\n"),
        "{kept}"
    );
    assert_eq!(
        kept.lines()
            .filter(|l| l.starts_with(&local.ip.to_string()))
            .count(),
        1,
        "{kept}"
    );
    let nested = keys.join("no-such-dir/known_hosts");
    Ssh::connect(
        config(local, &keys, KnownHosts::AcceptNew(nested.clone())),
        runtime.dialer(),
    )
    .unwrap();
    assert!(std::fs::read_to_string(&nested)
        .unwrap()
        .contains(&local.ip.to_string()));

    // A download stops at its bound, names the file and the bound, and leaves no partial file.
    let bounded = Ssh::connect(
        config(local, &keys, KnownHosts::Strict(known_hosts.clone())),
        runtime.dialer(),
    )
    .unwrap()
    .with_download_limit(100_000);
    let cut = work.path().join("cut");
    let err = bounded
        .download(&remote_path, &cut)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&remote_path.display().to_string()) && err.contains("100000 bytes"),
        "{err}"
    );
    assert!(!cut.exists());
    bounded.download(&src_small(&ssh, local), &cut).unwrap();
    assert_eq!(std::fs::read(&cut).unwrap(), b"small\n");

    let wrong_key = SshConfig {
        key_file: Some(keys.join("hostkey")),
        ..config(local, &keys, KnownHosts::Ignore)
    };
    let denied = Ssh::connect(wrong_key, runtime.dialer())
        .err()
        .unwrap()
        .to_string();
    assert!(denied.contains("authentication failed"), "{denied}");

    // A restarted sshd drops the session; the next command opens a new one.
    let mut killed = Vec::new();
    for pid in leftovers::namespace_pids(&runtime.namespace("n1")) {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "sshd" {
            let _ = std::process::Command::new("kill")
                .args(["-9", &pid.to_string()])
                .status();
            killed.push(pid);
        }
    }
    // sshd binds its port after it daemonizes, so a new one started while the old listener
    // still holds the port exits without a word: wait for the old ones to be gone.
    let started = Instant::now();
    while killed.iter().any(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.contains(") Z "))
    }) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "sshd outlived kill -9"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    run_sshd(local, &keys);
    let started = Instant::now();
    loop {
        match remote::run(&ssh, "echo again") {
            Ok(out) => {
                assert_eq!(out, "again");
                break;
            }
            Err(e) if started.elapsed() > Duration::from_secs(10) => panic!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }

    // The broker, deployed and controlled through SSH.
    let node = Node {
        role: NodeRole::Combined,
        remote: Arc::new(ssh),
        dir: local.dir.join("over-ssh"),
        ..local.clone()
    };
    std::fs::create_dir_all(&node.dir).unwrap();
    let db = TidemarkBroker::new(broker(), BrokerConfig::for_replication(1), vec![]);
    db.setup(&node, std::slice::from_ref(&node)).unwrap();
    let cx = ClientContext::new(
        std::slice::from_ref(&node),
        |n| db.endpoint(n),
        runtime.dialer(),
        Duration::from_secs(5),
    );
    await_ready(&cx, Duration::from_secs(30), &CancellationToken::new())
        .await
        .unwrap();
    let kill = db.as_kill().unwrap();
    assert!(kill.is_running(&node).unwrap());
    kill.kill(&node).unwrap();
    assert!(!kill.is_running(&node).unwrap());
    kill.start(&node).unwrap();
    await_ready(&cx, Duration::from_secs(30), &CancellationToken::new())
        .await
        .unwrap();
    db.stop(&node).unwrap();
    assert!(!kill.is_running(&node).unwrap());
    let log: PathBuf = db.as_log_files().unwrap().log_files(&node)[0].clone();
    let snarfed = work.path().join("broker.log");
    node.remote.download(&log, &snarfed).unwrap();
    assert!(std::fs::metadata(&snarfed).unwrap().len() > 0);
    drop(node);

    runtime.destroy().unwrap();
    assert_nothing_left(&record);
}
