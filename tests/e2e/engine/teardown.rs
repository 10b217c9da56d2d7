//! `tidemark teardown` against what it must and must not remove: a live run is never touched,
//! whatever `TMPDIR` says; a namespace nobody recorded is removed only with `--force`; and a
//! `--runtime hosts` run killed with -9 is cleaned on its hosts over SSH from the local record.
//! Each test first asks for a `--dry-run`, so a teardown that would remove the wrong thing fails
//! before it removes anything.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::engine::*;
use crate::support::sshd::{keygen, start_sshd};
use serde_json::Value;
use tidemark_harness::leftovers;
use tidemark_harness::netns::NetnsRuntime;
use tidemark_harness::remote;
use tidemark_harness::runtime::{Node, Runtime};

fn teardown(args: &[&str], tmpdir: &Path) -> Output {
    Command::new(tidemark())
        .arg("teardown")
        .args(args)
        .env("TMPDIR", tmpdir)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn namespaces() -> String {
    text(
        &Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
}

/// Processes whose command line contains `needle`.
fn processes_with(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(needle).then_some(cmdline)
        })
        .collect()
}

#[test]
fn a_live_run_survives_teardown_under_another_tmpdir() {
    require_root("a_live_run_survives_teardown_under_another_tmpdir");
    let work = tempfile::tempdir().unwrap();
    let other_tmp = tempfile::tempdir().unwrap();
    let run = leftovers::new_run_id();
    let mut runtime = NetnsRuntime::new(work.path(), &run).unwrap();
    let record = serde_json::json!({"runtime": runtime.describe()});
    let nodes = runtime.create("a", &["n1".to_string()]).unwrap();
    let sleeper = nodes[0].dir.join("sleeper");
    crate::support::copy_executable(std::path::Path::new("/bin/sleep"), &sleeper);
    remote::run(
        nodes[0].remote.as_ref(),
        &format!(
            "nohup setsid {} 600 > /dev/null 2>&1 < /dev/null &",
            sleeper.display()
        ),
    )
    .unwrap();

    let dry = teardown(&["--dry-run"], other_tmp.path());
    assert!(
        !text(&dry.stdout).contains(&run),
        "a live run is listed for removal: {}",
        text(&dry.stdout)
    );
    // Named or not, a live run is not torn down (a teardown of every run would also take
    // other tests' killed runs from under them).
    let real = teardown(&["--run", &run], other_tmp.path());
    assert!(!text(&real.stdout).contains(&run), "{}", text(&real.stdout));
    assert!(namespaces().contains(&runtime.namespace("n1")));
    assert_eq!(
        processes_with(&sleeper.display().to_string()).len(),
        1,
        "the live run's process was killed"
    );

    runtime.destroy().unwrap();
    assert_nothing_left(&record);
}

#[test]
fn a_namespace_without_an_owner_needs_force() {
    require_root("a_namespace_without_an_owner_needs_force");
    let tmp = tempfile::tempdir().unwrap();
    let run = leftovers::new_run_id();
    let ns = format!("{}{run}-stray", leftovers::PREFIX);
    let added = Command::new("ip")
        .args(["netns", "add", &ns])
        .status()
        .unwrap();
    assert!(added.success());

    let dry = teardown(&["--dry-run"], tmp.path());
    assert!(!text(&dry.stdout).contains(&ns), "{}", text(&dry.stdout));
    // Scoped to this run as every teardown here that removes: one of every run would also take
    // other tests' killed runs (their containers, their namespaces) from under them.
    let plain = teardown(&["--run", &run], tmp.path());
    assert!(namespaces().contains(&ns), "removed without --force");
    let stderr = text(&plain.stderr);
    assert!(
        stderr.contains(&ns) && stderr.contains("--force"),
        "{stderr}"
    );

    // Other helpers' namespaces on the machine are not ours to force either.
    let forced = teardown(&["--force", "--run", &run], tmp.path());
    assert_eq!(forced.status.code(), Some(0), "{}", text(&forced.stderr));
    assert!(
        text(&forced.stdout).contains(&ns),
        "{}",
        text(&forced.stdout)
    );
    assert!(!namespaces().contains(&ns), "--force left {ns}");
}

/// Three SSH "machines" (namespaces running sshd) and a nodes file listing them.
struct Machines {
    work: tempfile::TempDir,
    runtime: NetnsRuntime,
    record: Value,
    nodes: Vec<Node>,
    client_key: PathBuf,
    nodes_file: PathBuf,
}

impl Machines {
    fn new() -> Machines {
        let work = tempfile::tempdir().unwrap();
        let mut runtime = NetnsRuntime::new(work.path(), &leftovers::new_run_id()).unwrap();
        let record = serde_json::json!({"runtime": runtime.describe()});
        let names: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let nodes = runtime.create("a", &names).unwrap();
        let client_key = work.path().join("client");
        keygen(&client_key);
        for n in &nodes {
            let dir = n.dir.join("ssh");
            std::fs::create_dir_all(&dir).unwrap();
            start_sshd(n, &dir, &client_key.with_extension("pub"));
        }
        let dialer = runtime.dialer();
        for n in &nodes {
            let started = Instant::now();
            while dialer
                .connect(std::net::SocketAddr::new(n.ip, 22), Duration::from_secs(1))
                .is_err()
            {
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "sshd on {}",
                    n.name
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let nodes_file = work.path().join("nodes.txt");
        let listing: Vec<String> = nodes.iter().map(|n| n.ip.to_string()).collect();
        std::fs::write(&nodes_file, listing.join("\n")).unwrap();
        Machines {
            work,
            runtime,
            record,
            nodes,
            client_key,
            nodes_file,
        }
    }

    /// `tidemark ARGS` from the harness's namespace, where the hosts are reachable.
    fn tidemark(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.runtime.namespace("ctl")])
            .arg(tidemark())
            .args(args);
        c
    }

    /// Starts a hosts run, kills it with -9 once a partition is in force (so brokers and the
    /// firewall chain are on the hosts) and returns its id and its directory on the hosts.
    fn killed_run(&self) -> (String, String) {
        // A HOME without ~/.ssh: host keys go to tidemark's own file beside the nodes file.
        let home = self.work.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let store = self.work.path().join("store");
        let mut child = self
            .tidemark(&["test", "--runtime", "hosts", "--nodes-file"])
            .arg(&self.nodes_file)
            .arg("--ssh-key")
            .arg(&self.client_key)
            .args(["--nemesis", "partition", "--nemesis-interval", "1"])
            .args(["--time-limit", "120", "--quiet", "--store"])
            .arg(&store)
            .env("HOME", &home)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let run_dir = store.join("latest");
        let started = Instant::now();
        loop {
            let history =
                std::fs::read_to_string(run_dir.join("history.jsonl")).unwrap_or_default();
            let partitioned = history.lines().any(|l| {
                l.contains("\"nemesis\"") && l.contains("\"info\"") && l.contains("partition")
            });
            if partitioned && history.lines().count() > 50 {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "the hosts run never got going"
            );
            assert!(child.try_wait().unwrap().is_none(), "the run ended early");
            std::thread::sleep(Duration::from_millis(200));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let test: Value =
            serde_json::from_slice(&std::fs::read(run_dir.join("test.json")).unwrap()).unwrap();
        let run = test["runtime"]["run"].as_str().unwrap().to_string();
        let hosts_dir = test["runtime"]["work_dir"].as_str().unwrap().to_string();
        assert!(Path::new(&hosts_dir).is_dir());
        assert!(!processes_with(&hosts_dir).is_empty(), "no broker to clean");
        let mut known = self.nodes_file.as_os_str().to_owned();
        known.push(".known_hosts");
        assert!(
            Path::new(&known).is_file(),
            "host keys were not kept beside the nodes file"
        );
        assert!(!home.join(".ssh").exists(), "~/.ssh was written");
        (run, hosts_dir)
    }

    /// Nothing of the run with directory `hosts_dir` is left on the hosts: no directory, no
    /// process, no firewall chain or table.
    fn assert_hosts_clean(&self, hosts_dir: &str) {
        assert!(!Path::new(hosts_dir).exists(), "{hosts_dir} left");
        assert_eq!(processes_with(hosts_dir), Vec::<String>::new());
        for n in &self.nodes {
            let chain = remote::run(n.remote.as_ref(), "iptables -w -S TIDEMARK");
            assert!(chain.is_err(), "{}: chain left: {chain:?}", n.name);
            let table = remote::run(n.remote.as_ref(), "nft list table inet tidemark");
            assert!(table.is_err(), "{}: nft table left", n.name);
        }
    }

    fn destroy(mut self) {
        self.runtime.destroy().unwrap();
        assert_nothing_left(&self.record);
    }
}

#[test]
fn a_hosts_run_killed_with_sigkill_is_cleaned_from_its_record() {
    require_root("a_hosts_run_killed_with_sigkill_is_cleaned_from_its_record");
    broker();
    let _turn = hosts_turn();
    let m = Machines::new();
    let (run, hosts_dir) = m.killed_run();

    let dry = m.tidemark(&["teardown", "--dry-run"]).output().unwrap();
    let listed = text(&dry.stdout);
    assert!(
        listed.contains(&format!("run {run}")) && listed.contains(&hosts_dir),
        "the dead hosts run is not listed: {listed}{}",
        text(&dry.stderr)
    );
    // Another run on these hosts would meet the dead run's brokers and firewall chain.
    let refused = m
        .tidemark(&["test", "--runtime", "hosts", "--nodes-file"])
        .arg(&m.nodes_file)
        .arg("--ssh-key")
        .arg(&m.client_key)
        .args(["--time-limit", "5", "--quiet", "--store"])
        .arg(m.work.path().join("refused"))
        .output()
        .unwrap();
    let stderr = text(&refused.stderr);
    assert_eq!(refused.status.code(), Some(255), "{stderr}");
    assert!(
        stderr.contains(&format!("run {run}")) && stderr.contains("tidemark teardown"),
        "{stderr}"
    );
    let done = m.tidemark(&["teardown", "--run", &run]).output().unwrap();
    assert!(
        text(&done.stdout).contains(&format!("removed run {run}")),
        "{}{}",
        text(&done.stdout),
        text(&done.stderr)
    );
    m.assert_hosts_clean(&hosts_dir);
    // Nor locally: the record is gone, so a second teardown finds nothing of it.
    let again = m.tidemark(&["teardown", "--dry-run"]).output().unwrap();
    assert!(
        !text(&again.stdout).contains(&run),
        "{}",
        text(&again.stdout)
    );
    assert!(!Path::new(leftovers::ROOT_STATE_DIR)
        .join(format!("{run}.json"))
        .exists());
    m.destroy();
}

#[test]
fn a_hosts_run_without_a_record_is_found_on_its_hosts_and_needs_force() {
    require_root("a_hosts_run_without_a_record_is_found_on_its_hosts_and_needs_force");
    broker();
    let _turn = hosts_turn();
    let m = Machines::new();
    let (run, hosts_dir) = m.killed_run();
    // As if the run had been started from another machine.
    std::fs::remove_file(Path::new(leftovers::ROOT_STATE_DIR).join(format!("{run}.json"))).unwrap();
    let with_hosts = |extra: &[&str]| {
        m.tidemark(&["teardown", "--nodes-file"])
            .arg(&m.nodes_file)
            .arg("--ssh-key")
            .arg(&m.client_key)
            .args(extra)
            .output()
            .unwrap()
    };
    let plain = with_hosts(&["--run", &run]);
    let stderr = text(&plain.stderr);
    assert!(
        stderr.contains(&run) && stderr.contains("--force"),
        "{stderr}"
    );
    assert!(Path::new(&hosts_dir).is_dir(), "removed without --force");
    let forced = with_hosts(&["--force", "--run", &run]);
    assert_eq!(forced.status.code(), Some(0), "{}", text(&forced.stderr));
    assert!(
        text(&forced.stdout).contains(&format!("removed run {run}")),
        "{}",
        text(&forced.stdout)
    );
    m.assert_hosts_clean(&hosts_dir);
    m.destroy();
}
