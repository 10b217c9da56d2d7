//! `tidemark test --runtime docker` end to end: three containers from the image `tidemark image
//! build` makes, on a network of the run's own, driven over SSH; partitions and kills inside
//! them; the correct broker valid (also beside three dedicated controllers), an injected bug
//! caught; and nothing labelled with the run left in Docker afterwards, also after a run killed
//! with -9 and `tidemark teardown`. And what VMs look like to `--runtime hosts`: containers with
//! sshd the harness did not make.
//!
//! Cost: the image once per test binary (about 90 s cold: debootstrap and import; a second or
//! two when only the broker changed), then two 12 s runs of about 25 s each (a third if the bug
//! slips through its first seed), a 17 s run of six containers (dedicated controllers) and a
//! killed run.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tidemark_harness::leftovers::{RunState, ROOT_STATE_DIR};

use crate::support::docker::{docker, docker_turn, labelled};
use crate::support::engine::*;

/// Asserts that Docker holds nothing labelled with the run of `test` (test.json) and that its
/// record and work directory are gone.
fn assert_nothing_left_in_docker(test: &Value) {
    let run = test["runtime"]["run"].as_str().unwrap();
    assert_eq!(labelled(run), (vec![], vec![]), "left in docker");
    let work_dir = test["runtime"]["work_dir"].as_str().unwrap();
    assert!(!Path::new(work_dir).exists(), "{work_dir} left");
    assert!(!RunState::path(Path::new(ROOT_STATE_DIR), run).exists());
}

/// The completed fault ops of a history, by name.
fn faults_done(run: &Path) -> Vec<String> {
    nemesis_infos(&json_lines(&run.join("history.jsonl")))
        .into_iter()
        .filter_map(|op| op["f"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn the_correct_broker_in_containers_is_valid_under_partitions_and_kills() {
    require_root("the_correct_broker_in_containers_is_valid_under_partitions_and_kills");
    let _turn = docker_turn();
    let store = tempfile::tempdir().unwrap();
    let (run, results) = run_with_verdict(
        &[
            "--runtime",
            "docker",
            "--nemesis",
            "partition,kill",
            "--nemesis-interval",
            "3",
            "--time-limit",
            "12",
            // Seed 2's deck deals a partition, then a handoff (seed 1's two partitions).
            "--seed",
            "2",
        ],
        store.path(),
    );
    let test = test_json(&run);
    assert_eq!(
        results["valid"],
        true,
        "{results:#}\nkept in {}",
        run.display()
    );
    assert_eq!(test["runtime"]["name"], "docker");
    for node in test["nodes"].as_array().unwrap() {
        let remote = node["remote"].as_str().unwrap();
        assert!(remote.starts_with("ssh root@"), "{remote}");
    }
    let faults = faults_done(&run);
    let partitions = faults
        .iter()
        .filter(|f| ["start-partition", "handoff"].contains(&f.as_str()))
        .count();
    let kills = faults
        .iter()
        .filter(|f| ["kill", "bounce", "handoff"].contains(&f.as_str()))
        .count();
    assert!(partitions > 0 && kills > 0, "faults done: {faults:?}");
    assert_eq!(
        replica_count(&run),
        12,
        "every node's replicas dumped over SSH"
    );
    assert_nothing_left_in_docker(&test);
}

/// KRaft's production layout in containers: three brokers and three dedicated controllers, the
/// active controller killed, a leader cut off from the controllers only, then the new active
/// controller cut off from every node; valid, replicas on the brokers only, nothing left.
#[test]
fn dedicated_controllers_in_containers_survive_faults_aimed_at_the_control_plane() {
    require_root("dedicated_controllers_in_containers_survive_faults_aimed_at_the_control_plane");
    let _turn = docker_turn();
    let store = tempfile::tempdir().unwrap();
    let schedule = store.path().join("faults.json");
    std::fs::write(
        &schedule,
        r#"[
{"time_s": 2, "f": "kill", "value": {"targets": "controller"}},
{"time_s": 5, "f": "start", "value": {"nodes": ["c1", "c2", "c3"]}},
{"time_s": 7, "f": "start-partition", "value": {"kind": "leader-control"}},
{"time_s": 11, "f": "stop-partition", "value": {}},
{"time_s": 12, "f": "start-partition", "value": {"kind": "controller"}},
{"time_s": 15, "f": "stop-partition", "value": {}}
]"#,
    )
    .unwrap();
    let (run, results) = run_with_verdict(
        &[
            "--runtime",
            "docker",
            "--controllers",
            "3",
            "--nemesis-schedule",
            schedule.to_str().unwrap(),
            "--time-limit",
            "17",
            "--seed",
            "1",
        ],
        store.path(),
    );
    let test = test_json(&run);
    assert_eq!(
        results["valid"],
        true,
        "{results:#}\nkept in {}",
        run.display()
    );
    let nodes = node_fields(&test, &["name", "role", "remote"]);
    let names: Vec<(&str, &str)> = nodes
        .iter()
        .map(|n| (n[0].as_str(), n[1].as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("n1", "broker"),
            ("n2", "broker"),
            ("n3", "broker"),
            ("c1", "controller"),
            ("c2", "controller"),
            ("c3", "controller"),
        ]
    );
    for n in &nodes {
        assert!(n[2].starts_with("ssh root@"), "{n:?}");
    }
    let history = json_lines(&run.join("history.jsonl"));
    let faults = nemesis_infos(&history);
    let done =
        |f: &str| -> Vec<&Value> { faults.iter().copied().filter(|o| o["f"] == f).collect() };
    let killed = &done("kill")[0]["value"]["nodes"];
    assert!(
        ["c1", "c2", "c3"].contains(&killed[0].as_str().unwrap_or_default()),
        "the active controller was killed: {killed}"
    );
    let cuts = done("start-partition");
    assert_eq!(cuts.len(), 2, "{cuts:?}");
    assert_eq!(cuts[0]["value"]["kind"], "leader-control", "{}", cuts[0]);
    assert_eq!(
        cuts[0]["value"]["ports"],
        serde_json::json!([9093]),
        "{}",
        cuts[0]
    );
    let cut = &cuts[1]["value"];
    let controller = cut["controller"].as_str().unwrap_or_default();
    assert!(["c1", "c2", "c3"].contains(&controller), "{cut}");
    assert_eq!(
        cut["grudge"][controller].as_array().map(Vec::len),
        Some(5),
        "the active controller is cut off from the five other nodes: {cut}"
    );
    assert_eq!(
        replica_count(&run),
        12,
        "only the brokers' replicas dumped over SSH"
    );
    assert_nothing_left_in_docker(&test);
}

/// Caught as on the netns runtime: partitions cutting leaders off every ~4 s, the combination
/// docs/detection.md and tests/nemesis_detect.rs rely on (with kills in the mix as well, the
/// bug went unnoticed in 12 s runs of seeds 1 and 2 when measured). A second seed gets a second
/// chance, as in nemesis_detect; seed 1 was caught when measured.
#[test]
fn acks_before_replication_in_containers_are_caught() {
    require_root("acks_before_replication_in_containers_are_caught");
    let _turn = docker_turn();
    let store = tempfile::tempdir().unwrap();
    let mut seen = Vec::new();
    for seed in ["1", "2"] {
        let (run, results) = run_with_verdict(
            &[
                "--runtime",
                "docker",
                "--inject-bug",
                "ack-before-replication",
                "--nemesis",
                "partition",
                "--nemesis-targets",
                "leaders",
                "--nemesis-interval",
                "4",
                "--time-limit",
                "12",
                "--seed",
                seed,
            ],
            store.path(),
        );
        assert_nothing_left_in_docker(&test_json(&run));
        if results["valid"] == false {
            let kinds = results["anomaly_types"].to_string();
            assert!(
                kinds.contains("lost-write") || kinds.contains("ack-above-high-watermark"),
                "{kinds}"
            );
            return;
        }
        seen.push(format!("seed {seed}: {}", results["valid"]));
    }
    panic!("ack-before-replication not caught in containers: {seen:?}");
}

#[test]
fn a_docker_run_killed_with_sigkill_is_removed_by_teardown() {
    require_root("a_docker_run_killed_with_sigkill_is_removed_by_teardown");
    let _turn = docker_turn();
    let store = tempfile::tempdir().unwrap();
    let mut child = Command::new(tidemark())
        .args([
            "test",
            "--runtime",
            "docker",
            "--time-limit",
            "60",
            "--quiet",
        ])
        .arg("--store")
        .arg(store.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the brokers serve: the containers, the network and the run's key all exist.
    let run = store.path().join("latest");
    let started = Instant::now();
    while std::fs::read_to_string(run.join("history.jsonl"))
        .map(|h| h.lines().count())
        .unwrap_or(0)
        < 50
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the run never got going"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let test = test_json(&run);
    let run_id = test["runtime"]["run"].as_str().unwrap();
    let (containers, networks) = labelled(run_id);
    assert_eq!(containers.len(), 3, "{containers:?}");
    assert_eq!(networks, vec![format!("tdm-{run_id}")]);

    let dry = Command::new(tidemark())
        .args(["teardown", "--dry-run", "--run", run_id])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&dry.stdout);
    assert!(
        listed.contains(&format!("labelled tidemark.run={run_id}")),
        "{listed}"
    );
    assert_eq!(labelled(run_id).0.len(), 3, "a dry run removed something");
    let done = Command::new(tidemark())
        .args(["teardown", "--run", run_id])
        .output()
        .unwrap();
    assert_eq!(
        done.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    assert_nothing_left_in_docker(&test);
}

/// What Docker holds with a run's label but no record names is found by that label, left alone
/// without `--force` (its owner is unknown) and removed with it, and nothing else is.
#[test]
fn labelled_leftovers_without_a_record_need_force() {
    require_root("labelled_leftovers_without_a_record_need_force");
    let run = tidemark_harness::leftovers::new_run_id();
    let label = format!("tidemark.run={run}");
    let stray = format!("tdm-{run}");
    docker(&["network", "create", "--label", &label, &stray]);
    // Unlabelled, with a name like a run's: never ours to remove.
    let bystander = format!("tdm-{run}-bystander");
    docker(&["network", "create", &bystander]);
    let teardown = |args: &[&str]| {
        Command::new(tidemark())
            .arg("teardown")
            .args(args)
            .args(["--run", &run])
            .output()
            .unwrap()
    };
    let plain = teardown(&[]);
    let stderr = String::from_utf8_lossy(&plain.stderr);
    assert!(
        stderr.contains(&format!("labelled {label}")) && stderr.contains("--force"),
        "{stderr}"
    );
    assert_eq!(
        labelled(&run).1,
        vec![stray.clone()],
        "removed without --force"
    );
    let forced = teardown(&["--force"]);
    assert_eq!(
        forced.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
    assert_eq!(labelled(&run), (vec![], vec![]));
    let left = docker(&[
        "network",
        "ls",
        "--filter",
        &format!("name={bystander}"),
        "-q",
    ]);
    assert!(!left.is_empty(), "an unlabelled network was removed");
    docker(&["network", "rm", &bystander]);
}

/// Containers started outside the harness, removed when dropped.
struct Machines {
    network: String,
    containers: Vec<String>,
}

impl Drop for Machines {
    fn drop(&mut self) {
        for c in &self.containers {
            let _ = Command::new("docker").args(["rm", "-f", c]).output();
        }
        let _ = Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
    }
}

/// What VMs look like to `--runtime hosts`: machines with sshd that the harness did not make.
/// Three containers from the node image, listed in a nodes file by address; the run is valid
/// under partitions and kills and leaves nothing on them (no directory, process or rule).
#[test]
fn a_hosts_run_against_containers_with_sshd_is_valid_and_cleans_them() {
    require_root("a_hosts_run_against_containers_with_sshd_is_valid_and_cleans_them");
    let _turn = docker_turn();
    let work = tempfile::tempdir().unwrap();
    let key = work.path().join("client");
    crate::support::sshd::keygen(&key);
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let prefix = format!("tdm-hosts-test-{}", std::process::id());
    docker(&["network", "create", &prefix]);
    let mut machines = Machines {
        network: prefix.clone(),
        containers: Vec::new(),
    };
    let mut ips = Vec::new();
    for i in 1..=3 {
        let name = format!("{prefix}-n{i}");
        docker(&[
            "run",
            "-d",
            "--name",
            &name,
            "--network",
            &prefix,
            "--cap-add",
            "NET_ADMIN",
            "--cap-add",
            "SYS_ADMIN",
            "-e",
            &format!("TIDEMARK_AUTHORIZED_KEY={}", public.trim()),
            tidemark_harness::docker::DEFAULT_IMAGE,
        ]);
        machines.containers.push(name.clone());
        let ip = docker(&[
            "inspect",
            "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &name,
        ]);
        let addr: std::net::SocketAddr = format!("{ip}:22").parse().unwrap();
        let started = Instant::now();
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "sshd on {name}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        ips.push(ip);
    }
    let nodes_file = work.path().join("nodes.txt");
    std::fs::write(&nodes_file, format!("{}\n", ips.join("\n"))).unwrap();
    let store = work.path().join("store");
    let out = Command::new(tidemark())
        .args(["test", "--runtime", "hosts", "--nodes-file"])
        .arg(&nodes_file)
        .arg("--ssh-key")
        .arg(&key)
        .args(["--host-key-checking", "off", "--quiet", "--store"])
        .arg(&store)
        .args([
            "--time-limit",
            "10",
            "--nemesis",
            "partition,kill",
            "--seed",
            "3",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("VALID"), "{stdout}");
    let run = store.join("latest");
    let test = test_json(&run);
    assert_eq!(test["runtime"]["name"], "hosts");
    let done = faults_done(&run);
    assert!(
        done.iter().any(|f| f == "start-partition") || done.iter().any(|f| f == "kill"),
        "{done:?}"
    );
    assert_eq!(replica_count(&run), 12);
    // Nothing of the run is left on the machines: its directory, a process, a filter rule.
    let dir = test["runtime"]["work_dir"].as_str().unwrap();
    for c in &machines.containers {
        let left = docker(&[
            "exec",
            c,
            "sh",
            "-c",
            &format!(
                "ls -d {dir} 2>/dev/null; pgrep -a tidemark; iptables -S | grep -v '^-P'; \
                 nft list ruleset | grep -i tidemark; true"
            ),
        ]);
        assert_eq!(left, "", "left on {c}");
    }
}
