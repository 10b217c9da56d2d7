//! Power loss end to end: `tidemark test` with every node's data directory on tidemark-powerfs
//! and a schedule that cuts power to the whole cluster at once after a burst of acknowledged
//! writes. With Kafka's default flush policy acknowledged writes are lost and the policy excuses
//! it; with per-message flush nothing is lost and the run is valid, and so is a run where one
//! node alone loses power under the default policy (its peers keep what it lost). The 10-run
//! repetitions the issue asks for are `#[ignore]`d (several minutes); run them with
//! `cargo test --test e2e power -- --ignored --test-threads 1`. Teardown after Ctrl-C and after
//! kill -9 leaves no mount behind. A failing disk (fsyncs that fail and drop what they would have
//! made durable) stops every broker, and a power loss after it loses nothing acknowledged; a full
//! disk refuses appends until freed, and every replica catches up after it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::engine::{assert_nothing_left, broker, require_root, tidemark};
use serde_json::{json, Value};

fn powerfs() -> PathBuf {
    let p = tidemark().with_file_name("tidemark-powerfs");
    assert!(
        p.is_file(),
        "{} is missing: run `cargo build --workspace` before `cargo test`",
        p.display()
    );
    p
}

/// What one run ended with.
struct Run {
    results: Value,
    test: Value,
    ops: Vec<Value>,
    dir: PathBuf,
    _store: tempfile::TempDir,
}

/// Runs 14 s of the queue workload with the whole cluster losing power at 7 s.
fn run(seed: u64, extra: &[&str]) -> Run {
    run_with(seed, "all", extra)
}

/// Runs 14 s of the queue workload with the `targets` nodes losing power at 7 s.
fn run_with(seed: u64, targets: &str, extra: &[&str]) -> Run {
    let faults = json!([{"time_s": 7, "f": "power-loss", "value": {"targets": targets}}]);
    run_schedule(seed, &faults, extra)
}

/// Runs 14 s of the queue workload with the scripted `faults`.
fn run_schedule(seed: u64, faults: &Value, extra: &[&str]) -> Run {
    broker();
    powerfs();
    let dir = tempfile::tempdir().unwrap();
    let schedule = dir.path().join("power.json");
    std::fs::write(&schedule, faults.to_string()).unwrap();
    let store = tempfile::tempdir().unwrap();
    let out = Command::new(tidemark())
        .arg("test")
        .arg("--nemesis-schedule")
        .arg(&schedule)
        .args(["--time-limit", "14", "--seed", &seed.to_string(), "--quiet"])
        .args(extra)
        .arg("--store")
        .arg(store.path())
        .output()
        .unwrap();
    let run = std::fs::canonicalize(store.path().join("latest")).unwrap_or_default();
    let read = |name: &str| -> Option<Value> {
        serde_json::from_slice(&std::fs::read(run.join(name)).ok()?).ok()
    };
    let (Some(results), Some(test)) = (read("results.json"), read("test.json")) else {
        panic!(
            "no verdict (exit {:?}):\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ops = std::fs::read_to_string(run.join("history.jsonl"))
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_nothing_left(&test);
    assert_no_mount_below(Path::new(test["runtime"]["work_dir"].as_str().unwrap()));
    Run {
        results,
        test,
        ops,
        dir: run,
        _store: store,
    }
}

fn assert_no_mount_below(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.display().to_string();
    assert!(
        !mounts.lines().any(|l| l.contains(&dir)),
        "mounts left below {dir}:\n{mounts}"
    );
}

/// The power loss happened to every node, and says what it dropped.
fn assert_cluster_lost_power(r: &Run) {
    let info = r
        .ops
        .iter()
        .find(|o| o["process"] == "nemesis" && o["f"] == "power-loss" && o["type"] == "info")
        .expect("a power-loss info");
    assert_eq!(info["value"]["nodes"], json!(["n1", "n2", "n3"]), "{info}");
    assert_eq!(info["value"]["cluster_wide"], true, "{info}");
    assert!(info["value"]["seed"].is_u64(), "{info}");
    for n in ["n1", "n2", "n3"] {
        assert!(
            info["value"]["dropped"][n]["bytes_dropped"].is_u64(),
            "{info}"
        );
    }
    assert!(r.test["broker"]["powerfs"].is_string(), "{}", r.test);
}

fn default_flush_loses_acknowledged_writes(seed: u64) {
    let r = run(seed, &[]);
    assert_cluster_lost_power(&r);
    let lost = r.results["anomalies"]["lost-write"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0);
    assert!(lost > 0, "no lost write: {}", r.results);
    assert!(
        r.results["allowed"]["lost-write"].is_string(),
        "{}",
        r.results["allowed"]
    );
    assert_ne!(r.results["valid"], false, "{}", r.results);
}

fn per_message_flush_loses_nothing(seed: u64) {
    let r = run(seed, &["--broker-config", "log.flush.interval.messages=1"]);
    assert_cluster_lost_power(&r);
    assert_eq!(r.test["broker_config"]["log.flush.interval.messages"], "1");
    assert!(
        r.results["anomalies"].get("lost-write").is_none(),
        "{}",
        r.results["anomalies"]
    );
    assert_eq!(r.results["valid"], true, "{}", r.results);
}

#[test]
fn a_cluster_wide_power_loss_under_the_default_flush_policy_loses_acknowledged_writes() {
    require_root("default flush power loss");
    default_flush_loses_acknowledged_writes(1);
}

/// Seed 5 also cuts the power while `meta.properties`, written at the brokers' first start, was
/// never fsynced: torn to `cluster.id=tide`, it kept every broker from starting again until the
/// broker wrote it atomically (temporary file, fsync, rename, directory fsync).
#[test]
fn a_cluster_wide_power_loss_under_per_message_flush_loses_nothing_and_every_broker_starts() {
    require_root("per-message flush power loss");
    per_message_flush_loses_nothing(5);
}

#[test]
fn one_node_losing_power_loses_nothing_under_the_default_flush_policy() {
    require_root("one node power loss");
    let r = run_with(2, "one", &[]);
    let info = r
        .ops
        .iter()
        .find(|o| o["process"] == "nemesis" && o["f"] == "power-loss" && o["type"] == "info")
        .expect("a power-loss info");
    assert_eq!(
        info["value"]["nodes"].as_array().unwrap().len(),
        1,
        "{info}"
    );
    assert_eq!(info["value"]["cluster_wide"], false, "{info}");
    assert_eq!(r.results["allowed"], json!({}), "{}", r.results);
    assert_eq!(r.results["valid"], true, "{}", r.results);
}

/// A rolling restart stops nodes cleanly, and what their filesystems had not yet written back
/// survives a clean shutdown, as the page cache does. It did not: every broker started by `ip
/// netns exec` after a mount held a copy of it in its own mount namespace, which kept the
/// filesystem's session open after the unmount, so it never wrote back and was killed 10 s later
/// (a power loss in all but name); each restarted broker found the partition state it had
/// written before the stop empty, as a broker that lost power did (it wrote the file in place).
#[test]
fn a_rolling_restart_under_power_faults_keeps_what_the_nodes_wrote() {
    require_root("rolling restart under power faults");
    let faults = json!([
        {"time_s": 2, "f": "roll",
         "value": {"nodes": ["n1", "n2"], "kbytes_per_s": 0, "down_ms": 1000, "wait_ms": 3000}},
        {"time_s": 10, "f": "power-loss", "value": {"nodes": ["n3"]}}
    ]);
    let r = run_schedule(3, &faults, &[]);
    let roll = r
        .ops
        .iter()
        .find(|o| o["process"] == "nemesis" && o["f"] == "roll" && o["type"] == "info")
        .expect("a roll info");
    let restarted: Vec<&Value> = roll["value"]["restarted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["node"])
        .collect();
    assert_eq!(restarted, [&json!("n1"), &json!("n2")], "{roll}");
    // n3 lost power: the brokers replace their partition state files whole, so it comes back
    // with the old contents or the new, not an empty file.
    for n in ["n1", "n2", "n3"] {
        let log = std::fs::read_to_string(r.dir.join("nodes").join(n).join("broker.log")).unwrap();
        assert!(
            !log.contains("is not a valid partition state"),
            "{n} lost what it wrote before its stop:\n{log}"
        );
    }
    assert_eq!(r.results["valid"], true, "{}", r.results);
}

/// A failing disk on every node under per-message flush, healed, then a power loss of the whole
/// cluster. Before the broker halted on a failed fsync, this schedule lost 384 acknowledged
/// writes (seed 1): each broker went on after its fsyncs failed, and once the disk worked again
/// acknowledged records above what the failed fsyncs had dropped, which the power loss then
/// showed as holes its recovery cut the logs at.
#[test]
fn a_failing_disk_halts_the_brokers_and_a_later_power_loss_loses_nothing_acknowledged() {
    require_root("failing disk");
    let faults = json!([
        {"time_s": 3, "f": "disk-fault", "value": {"targets": "all", "mode": "fail-fsync"}},
        {"time_s": 7, "f": "disk-heal", "value": {"targets": "all"}},
        {"time_s": 11, "f": "power-loss", "value": {"targets": "all"}}
    ]);
    let r = run_schedule(
        1,
        &faults,
        &["--broker-config", "log.flush.interval.messages=1"],
    );
    let info = |f: &str| {
        r.ops
            .iter()
            .find(|o| o["process"] == "nemesis" && o["f"] == f && o["type"] == "info")
            .unwrap_or_else(|| panic!("no {f} info"))
    };
    let failed = info("disk-fault");
    let healed = info("disk-heal");
    for n in ["n1", "n2", "n3"] {
        assert_eq!(
            failed["value"]["disk"][n]["fault"], "fail-fsync",
            "{failed}"
        );
        let log = std::fs::read_to_string(r.dir.join("nodes").join(n).join("broker.log")).unwrap();
        assert!(
            log.lines()
                .any(|l| l.contains("fsync of") && l.contains("failed, halting")),
            "{n} did not halt on its failed fsync:\n{log}"
        );
    }
    assert_eq!(
        healed["value"]["rebooted"],
        json!(["n1", "n2", "n3"]),
        "{healed}"
    );
    // The power loss has something to lose: writes acknowledged between the reboot and it.
    let (from, to) = (
        healed["index"].as_u64(),
        info("power-loss")["index"].as_u64(),
    );
    let acked = r
        .ops
        .iter()
        .filter(|o| o["f"] == "send" && o["type"] == "ok")
        .filter(|o| o["index"].as_u64() > from && o["index"].as_u64() < to)
        .count();
    assert!(
        acked > 0,
        "nothing acknowledged between the heal and the power loss"
    );
    assert_eq!(r.results["valid"], true, "{}", r.results);
}

/// The nodes whose broker log says they halted on a failed write, whose message names `what`.
fn halted_on(r: &Run, nodes: &[&str], what: &str) -> Vec<String> {
    nodes
        .iter()
        .filter(|n| {
            std::fs::read_to_string(r.dir.join("nodes").join(n).join("broker.log"))
                .unwrap()
                .lines()
                .any(|l| l.contains(what) && l.contains("failed, halting"))
        })
        .map(|n| n.to_string())
        .collect()
}

/// The first `disk-heal` the nemesis recorded as done.
fn first_heal(r: &Run) -> &Value {
    r.ops
        .iter()
        .find(|o| o["process"] == "nemesis" && o["f"] == "disk-heal" && o["type"] == "info")
        .expect("a disk-heal info")
}

/// A full disk on every node for 5 s: each broker's first write the disk refuses (ENOSPC: a
/// segment append, a checkpoint) halts it, as Kafka halts a broker whose only log directory
/// failed; the heal starts the halted brokers on what their disks hold, and the cluster takes
/// writes again with nothing acknowledged lost. Before, a refused append was answered
/// `KAFKA_STORAGE_ERROR` and the broker went on, with changes half made (a batch in its segment
/// whose epoch checkpoint was refused, answered as failed and replicated all the same) and
/// refused high watermark checkpoints only logged.
#[test]
fn a_full_disk_halts_every_broker_it_refuses_and_the_heal_starts_them() {
    require_root("full disk");
    let faults = json!([
        {"time_s": 3, "f": "disk-fault", "value": {"targets": "all", "mode": "full"}},
        {"time_s": 8, "f": "disk-heal", "value": {"targets": "all"}}
    ]);
    let r = run_schedule(1, &faults, &[]);
    let brokers = ["n1", "n2", "n3"];
    let healed = first_heal(&r);
    for n in brokers {
        let refused = healed["value"]["disk"][n]["refused"].as_u64().unwrap_or(0);
        assert!(refused > 0, "{n}'s full disk refused nothing: {healed}");
    }
    assert_eq!(halted_on(&r, &brokers, ""), brokers, "{healed}");
    assert_eq!(healed["value"]["started"], json!(brokers), "{healed}");
    let after = r
        .ops
        .iter()
        .filter(|o| o["f"] == "send" && o["type"] == "ok")
        .filter(|o| o["index"].as_u64() > healed["index"].as_u64())
        .count();
    assert!(after > 0, "nothing acknowledged once the disk was freed");
    assert_eq!(r.results["valid"], true, "{}", r.results);
}

/// The dedicated controllers' disks full while a leader is killed: the election has to write
/// the metadata quorum's log and votes, which the full disks refuse. Each controller whose
/// quorum storage failed halts, and the heal starts it again. Before, the quorum stopped for
/// good on the node while its process served on with metadata it no longer received: under
/// `--workload mirror --nemesis all` (seed 32, combined nodes) a mirror leader of an old epoch,
/// behind its followers, that the other cluster then truncated to (230 acknowledged writes
/// lost). The final phase's heal also frees a controller's disk (a spec's `all` is the brokers).
#[test]
fn a_full_disk_under_an_election_halts_the_controllers_whose_quorum_storage_failed() {
    require_root("full disk under an election");
    let controllers = ["c1", "c2", "c3"];
    let faults = json!([
        {"time_s": 3, "f": "disk-fault", "value": {"nodes": controllers, "mode": "full"}},
        {"time_s": 4, "f": "kill", "value": {"targets": "leader"}},
        {"time_s": 7, "f": "start", "value": {"targets": "all"}},
        {"time_s": 9, "f": "disk-heal", "value": {"nodes": controllers}}
    ]);
    let r = run_schedule(1, &faults, &["--controllers", "3"]);
    let halted = halted_on(&r, &controllers, "metadata quorum's");
    assert!(
        !halted.is_empty(),
        "no controller halted on its quorum storage"
    );
    let healed = first_heal(&r);
    let started: Vec<String> = serde_json::from_value(healed["value"]["started"].clone()).unwrap();
    assert!(
        halted.iter().all(|h| started.contains(h)),
        "the heal did not start every halted controller ({halted:?}): {healed}"
    );
    assert_eq!(r.results["valid"], true, "{}", r.results);
}

#[test]
#[ignore = "ten runs of each policy; minutes"]
fn ten_runs_of_each_flush_policy() {
    require_root("ten runs of each flush policy");
    for seed in 1..=10 {
        default_flush_loses_acknowledged_writes(seed);
        per_message_flush_loses_nothing(seed);
    }
}

fn mounted_below(dir: &str) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.contains(dir))
}

/// Starts a 60 s `--nemesis power` run.
fn spawn_power_run(store: &Path) -> std::process::Child {
    Command::new(tidemark())
        .args([
            "test",
            "--nemesis",
            "power",
            "--time-limit",
            "60",
            "--quiet",
        ])
        .arg("--store")
        .arg(store)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Returns the `test.json` of the run in `store` once its data directories are mounted and its
/// clients are busy.
fn wait_until_mounted(store: &Path) -> Value {
    let run = store.join("latest");
    let started = std::time::Instant::now();
    loop {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the run never mounted its data directories"
        );
        let test: Option<Value> = std::fs::read(run.join("test.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(t) = test {
            let work_dir = t["runtime"]["work_dir"].as_str().unwrap().to_string();
            let lines = std::fs::read_to_string(run.join("history.jsonl"))
                .map(|h| h.lines().count())
                .unwrap_or(0);
            if mounted_below(&work_dir) && lines > 50 {
                return t;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn ctrl_c_leaves_no_mount_behind() {
    require_root("ctrl-c with power faults");
    broker();
    powerfs();
    let store = tempfile::tempdir().unwrap();
    let mut child = spawn_power_run(store.path());
    let test = wait_until_mounted(store.path());
    let sent = Command::new("kill")
        .arg("-INT")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(sent.success());
    assert_eq!(child.wait().unwrap().code(), Some(255));
    assert_no_mount_below(Path::new(test["runtime"]["work_dir"].as_str().unwrap()));
    assert_nothing_left(&test);
}

#[test]
fn teardown_after_kill_9_unmounts_the_power_loss_filesystems() {
    require_root("teardown after kill -9 with power faults");
    broker();
    powerfs();
    let store = tempfile::tempdir().unwrap();
    let mut child = spawn_power_run(store.path());
    let test = wait_until_mounted(store.path());
    child.kill().unwrap();
    child.wait().unwrap();
    let work_dir = test["runtime"]["work_dir"].as_str().unwrap();
    assert!(
        mounted_below(work_dir),
        "the killed run left no mount to clean"
    );
    let teardown = Command::new(tidemark())
        .args([
            "teardown",
            "--run",
            test["runtime"]["run"].as_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(
        teardown.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&teardown.stderr)
    );
    assert_no_mount_below(Path::new(work_dir));
    assert_nothing_left(&test);
}
