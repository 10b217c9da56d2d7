//! `tidemark test --runtime hosts` end to end: three "machines" that are network namespaces
//! running OpenSSH, listed in a nodes file. The harness runs in the client namespace, reaches
//! the hosts only over SSH (deploying, starting and dumping the broker there) and through the
//! Kafka wire, and leaves nothing behind on them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::engine::*;
use crate::support::sshd::{keygen, start_sshd};
use serde_json::Value;
use tidemark_harness::leftovers;
use tidemark_harness::netns::NetnsRuntime;
use tidemark_harness::runtime::{Node, Runtime};

/// `n` "machines": namespaces running sshd that accept `client`'s key, reachable from the
/// runtime's client namespace.
fn machines(work: &Path, n: usize) -> (NetnsRuntime, Vec<Node>, PathBuf) {
    let mut machines = NetnsRuntime::new(work, &leftovers::new_run_id()).unwrap();
    let names: Vec<String> = (1..=n).map(|i| format!("n{i}")).collect();
    let nodes = machines.create("a", &names).unwrap();
    let client_key = work.join("client");
    keygen(&client_key);
    for n in &nodes {
        let dir = n.dir.join("ssh");
        std::fs::create_dir_all(&dir).unwrap();
        start_sshd(n, &dir, &client_key.with_extension("pub"));
    }
    let dialer = machines.dialer();
    for n in &nodes {
        let started = Instant::now();
        let addr = std::net::SocketAddr::new(n.ip, 22);
        while dialer.connect(addr, Duration::from_secs(1)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "sshd on {}",
                n.name
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    (machines, nodes, client_key)
}

/// `tidemark test --runtime hosts` with `nodes_file`, run from the machines' client namespace.
fn tidemark_on_hosts(
    machines: &NetnsRuntime,
    nodes_file: &Path,
    client_key: &Path,
    store: &Path,
    extra: &[&str],
) -> Output {
    Command::new("ip")
        .args(["netns", "exec", &machines.namespace("ctl")])
        .arg(tidemark())
        .args(["test", "--runtime", "hosts", "--nodes-file"])
        .arg(nodes_file)
        .arg("--ssh-key")
        .arg(client_key)
        .args(["--host-key-checking", "off", "--quiet", "--store"])
        .arg(store)
        .args(extra)
        .output()
        .unwrap()
}

/// The stdout of a run that must have exited 0 (its output in the panic otherwise).
fn succeeded(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    stdout
}

/// Asserts that the run described by `test` left no work directory on the hosts; returns it.
fn work_dir_gone(test: &Value) -> &str {
    let dir = test["runtime"]["work_dir"].as_str().expect("work dir");
    assert!(!std::path::Path::new(dir).exists(), "{dir} left");
    dir
}

#[test]
fn a_run_on_ssh_hosts_is_valid_and_cleans_the_hosts() {
    require_root("a_run_on_ssh_hosts_is_valid_and_cleans_the_hosts");
    broker();
    let _turn = hosts_turn();
    let work = tempfile::tempdir().unwrap();
    let (mut machines, nodes, client_key) = machines(work.path(), 3);
    let record = serde_json::json!({"runtime": machines.describe()});
    let nodes_file = work.path().join("nodes.txt");
    let listing: Vec<String> = nodes.iter().map(|n| n.ip.to_string()).collect();
    std::fs::write(
        &nodes_file,
        format!("# the test's machines\n{}\n", listing.join("\n")),
    )
    .unwrap();

    let store = work.path().join("store");
    let tidemark_on_hosts =
        |extra: &[&str]| tidemark_on_hosts(&machines, &nodes_file, &client_key, &store, extra);
    // The hosts are checked for what the run needs before anything is made on them.
    let refused = tidemark_on_hosts(&[
        "--nemesis",
        "clock",
        "--faketime-library",
        "/nonexistent/libfaketime.so.1",
        "--time-limit",
        "2",
    ]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(255), "{stderr}");
    assert!(
        stderr.contains(
            "lacks what the test needs:\n  /nonexistent/libfaketime.so.1 (Debian package \
             faketime), needed by clock faults"
        ),
        "{stderr}"
    );
    let out = tidemark_on_hosts(&["--time-limit", "8"]);
    let stdout = succeeded(&out);
    assert!(stdout.contains("VALID"), "{stdout}");

    let run = store.join("latest");
    let test = test_json(&run);
    assert_eq!(test["runtime"]["name"], "hosts");
    let remote = test["nodes"][0]["remote"].as_str().unwrap();
    assert!(remote.starts_with("ssh root@"), "{remote}");
    assert_eq!(replica_count(&run), 12);
    for n in ["n1", "n2", "n3"] {
        assert!(run.join("nodes").join(n).join("broker.log").is_file());
    }
    // Everything the run put on the hosts is gone: its directory and its processes.
    let hosts_dir = work_dir_gone(&test);
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(!cmdline.contains(hosts_dir), "process left: {cmdline}");
    }

    machines.destroy().unwrap();
    assert_nothing_left(&record);
}

#[test]
fn a_nodes_file_with_cluster_sections_runs_one_cluster_per_section() {
    require_root("a_nodes_file_with_cluster_sections_runs_one_cluster_per_section");
    broker();
    let _turn = hosts_turn();
    let work = tempfile::tempdir().unwrap();
    let (mut machines, nodes, client_key) = machines(work.path(), 2);
    let record = serde_json::json!({"runtime": machines.describe()});
    let nodes_file = work.path().join("nodes.txt");
    std::fs::write(
        &nodes_file,
        format!(
            "[a]\n{}\n\n[b]  # the other cluster\n{}\n",
            nodes[0].ip, nodes[1].ip
        ),
    )
    .unwrap();
    let store = work.path().join("store");
    let out = tidemark_on_hosts(
        &machines,
        &nodes_file,
        &client_key,
        &store,
        &["--time-limit", "5", "--nemesis", "none"],
    );
    succeeded(&out);

    let run = store.join("latest");
    let test = test_json(&run);
    assert_eq!(test["clusters"], serde_json::json!(["a", "b"]));
    let (ip1, ip2) = (nodes[0].ip.to_string(), nodes[1].ip.to_string());
    let placed = node_fields(&test, &["name", "cluster", "ip"]);
    assert_eq!(placed, [["a1", "a", &ip1], ["b1", "b", &ip2]]);
    // Each host's broker is a quorum of one: itself.
    for node in &placed {
        let (name, ip) = (&node[0], &node[2]);
        let props = std::fs::read_to_string(run.join("nodes").join(name).join("server.properties"))
            .unwrap();
        assert!(
            props
                .lines()
                .any(|l| l.starts_with("controller.quorum.voters=1@")
                    && l.contains(ip)
                    && !l.contains(',')),
            "{name}: {props}"
        );
    }
    work_dir_gone(&test);
    machines.destroy().unwrap();
    assert_nothing_left(&record);
}

/// With `--controllers 1` the last host of the cluster is its dedicated controller: the other
/// runs a broker-only node that reaches it, and the run is valid and cleans both hosts. A nodes
/// file with no host left for a broker is refused, naming why.
#[test]
fn the_last_hosts_of_a_cluster_are_its_dedicated_controllers() {
    require_root("the_last_hosts_of_a_cluster_are_its_dedicated_controllers");
    broker();
    let _turn = hosts_turn();
    let work = tempfile::tempdir().unwrap();
    let (mut machines, nodes, client_key) = machines(work.path(), 2);
    let record = serde_json::json!({"runtime": machines.describe()});
    let nodes_file = work.path().join("nodes.txt");
    std::fs::write(&nodes_file, format!("{}\n{}\n", nodes[0].ip, nodes[1].ip)).unwrap();
    let store = work.path().join("store");
    let refused = tidemark_on_hosts(
        &machines,
        &nodes_file,
        &client_key,
        &store,
        &["--controllers", "2"],
    );
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(254), "{stderr}");
    assert!(
        stderr.contains("--controllers 2 leaves no broker"),
        "{stderr}"
    );

    let out = tidemark_on_hosts(
        &machines,
        &nodes_file,
        &client_key,
        &store,
        &[
            "--controllers",
            "1",
            "--time-limit",
            "5",
            "--nemesis",
            "none",
        ],
    );
    succeeded(&out);
    let run = store.join("latest");
    let test = test_json(&run);
    let (ip1, ip2) = (nodes[0].ip.to_string(), nodes[1].ip.to_string());
    assert_eq!(
        node_fields(&test, &["name", "role", "ip"]),
        [["n1", "broker", &ip1], ["c1", "controller", &ip2]]
    );
    let props = |name: &str| {
        std::fs::read_to_string(run.join("nodes").join(name).join("server.properties")).unwrap()
    };
    let voters = format!("controller.quorum.voters=2@{ip2}:9093");
    assert!(props("n1").lines().any(|l| l == "process.roles=broker"));
    assert!(props("n1").lines().any(|l| l == voters), "{}", props("n1"));
    assert!(props("c1").lines().any(|l| l == "process.roles=controller"));
    work_dir_gone(&test);
    machines.destroy().unwrap();
    assert_nothing_left(&record);
}
