//! Finding and removing what runs left behind. Before a run creates anything it writes a record
//! into [`state_dir`], a fixed place that does not depend on the environment (so a `tidemark
//! teardown` under another `TMPDIR` sees the same runs): its owner process and what it is about
//! to create, namespaces and a work directory on this machine, containers and a network labelled
//! with the run in Docker, or directories, processes and firewall rules on SSH hosts. Everything a run creates carries the prefix [`PREFIX`] or its run
//! id. A run whose owner is gone (killed with -9, machine rebooted half way) is a leftover:
//! `tidemark test` refuses to start on hosts a leftover still occupies, names the others, and
//! `tidemark teardown` removes them. Runs whose owner
//! is alive are never touched, so concurrent runs do not disturb each other; namespaces nobody
//! recorded are removed only when asked to by force.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::ssh::SshConfig;

/// Prefix of every network namespace the harness creates.
pub const PREFIX: &str = "tdm-";

/// The label every Docker container and network of a run carries, with the run id as its value.
pub const RUN_LABEL: &str = "tidemark.run";

/// Where root's runs are recorded: on disk rather than in `/run`, so a record of runs on SSH
/// hosts outlives a reboot of this machine.
pub const ROOT_STATE_DIR: &str = "/var/lib/tidemark/runs";

/// The directory holding every run's record: [`ROOT_STATE_DIR`] for root, and for other users
/// (who can only use SSH hosts) `~/.local/state/tidemark/runs`.
pub fn state_dir() -> anyhow::Result<PathBuf> {
    if is_root() {
        return Ok(PathBuf::from(ROOT_STATE_DIR));
    }
    let home = nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|u| u.dir)
        .context("this user has no home directory to keep run records in")?;
    Ok(home.join(".local/state/tidemark/runs"))
}

/// What a run creates, recorded before it creates it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "runtime", rename_all = "snake_case")]
pub enum Resources {
    /// Network namespaces `tdm-<run>-*` and a work directory on this machine.
    Netns {
        /// The run's work directory (node directories, binaries, data, logs).
        work_dir: PathBuf,
    },
    /// A directory on each SSH host, the processes started from it and the firewall rules.
    Hosts {
        /// How to log in to each host again.
        hosts: Vec<SshConfig>,
        /// The run's directory on every host.
        run_dir: PathBuf,
    },
    /// Containers and a network labelled with the run (see [`crate::docker`]) and a work
    /// directory on this machine (the run's SSH key).
    Docker {
        /// The run's work directory.
        work_dir: PathBuf,
    },
}

/// Who owns a run and what it made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunState {
    /// The run id (hex, no dashes).
    pub run: String,
    /// The owning harness process.
    pub pid: i32,
    /// The owner's start time in clock ticks since boot, to tell a reused pid apart.
    pub start_ticks: u64,
    /// The boot the owner ran in; ticks since boot say nothing across a reboot.
    pub boot_id: String,
    /// What the run creates.
    pub resources: Resources,
}

impl RunState {
    /// The state of a run owned by this process.
    pub fn current(run: &str, resources: Resources) -> anyhow::Result<Self> {
        let pid = std::process::id() as i32;
        Ok(RunState {
            run: run.to_string(),
            pid,
            start_ticks: start_ticks(pid).context("reading this process's start time")?,
            boot_id: boot_id().context("reading /proc/sys/kernel/random/boot_id")?,
            resources,
        })
    }

    /// Whether the owner is still running.
    pub fn owner_alive(&self) -> bool {
        boot_id().as_deref() == Some(self.boot_id.as_str())
            && start_ticks(self.pid) == Some(self.start_ticks)
    }

    /// Where the record of `run` lives in `dir`.
    pub fn path(dir: &Path, run: &str) -> PathBuf {
        dir.join(format!("{run}.json"))
    }

    /// Writes the record into `dir` (creating it), whole or not at all.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = Self::path(dir, &self.run);
        let tmp = dir.join(format!(".{}.json.tmp", self.run));
        std::fs::write(&tmp, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))
    }

    /// Removes the record of `run` from `dir`; a missing record is not an error.
    pub fn remove(dir: &Path, run: &str) -> anyhow::Result<()> {
        let path = Self::path(dir, run);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("removing {}", path.display()))
            }
            _ => Ok(()),
        }
    }
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 of stat; fields 3.. follow the command name's closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether this process runs as root (namespaces and iptables need it).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A new run id: unique enough among runs on one machine, not part of any test's randomness.
pub fn new_run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mixed = (nanos as u64) ^ ((std::process::id() as u64) << 40);
    format!("{:08x}", (mixed ^ (mixed >> 29)) as u32)
}

/// The run id in a namespace name `tdm-<run>-<what>`.
pub fn run_of_namespace(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(PREFIX)?;
    let (run, what) = rest.split_once('-')?;
    (!run.is_empty() && !what.is_empty()).then_some(run)
}

/// Every network namespace whose name carries [`PREFIX`].
pub fn prefixed_namespaces() -> anyhow::Result<Vec<String>> {
    let out = match Command::new("ip").args(["netns", "list"]).output() {
        Ok(o) => o,
        // Without iproute2 no run made namespaces here (an SSH-hosts-only machine).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).context("running `ip netns list`"),
    };
    if !out.status.success() {
        bail!(
            "`ip netns list` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(PREFIX))
        .map(str::to_string)
        .collect())
}

/// What a run whose owner is gone, or unknown, left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// The run id.
    pub run: String,
    /// Its record, when one could be read; without it the owner is unknown.
    pub state: Option<RunState>,
    /// Its record file, when there is one (readable or not).
    pub record: Option<PathBuf>,
    /// Its network namespaces on this machine (with their bridges, veths and iptables rules).
    pub namespaces: Vec<String>,
    /// Whether Docker holds containers or a network labelled with the run.
    pub containers: bool,
}

impl Leftover {
    /// Whether a record names the run's owner (and so says it is gone).
    pub fn owner_known(&self) -> bool {
        self.state.is_some()
    }

    /// Whether a new run on `hosts` (`None`: namespaces on this machine) would meet what this
    /// run left: its brokers' ports, its directory and its firewall chain on a host they share.
    /// Namespaces carry their run's id, so a new namespace run never meets a dead one's.
    pub fn collides_with(&self, hosts: Option<&[std::net::SocketAddr]>) -> bool {
        match (self.state.as_ref().map(|s| &s.resources), hosts) {
            (Some(Resources::Hosts { hosts: left, .. }), Some(new)) => left
                .iter()
                .any(|l| new.iter().any(|n| n.ip() == l.addr.ip())),
            _ => false,
        }
    }

    /// The run's work directory on this machine, if it has one.
    pub fn work_dir(&self) -> Option<&Path> {
        match &self.state.as_ref()?.resources {
            Resources::Netns { work_dir } | Resources::Docker { work_dir } => Some(work_dir),
            Resources::Hosts { .. } => None,
        }
    }
}

impl std::fmt::Display for Leftover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "run {}", self.run)?;
        let mut sep = ":";
        if !self.namespaces.is_empty() {
            write!(f, ": namespaces {}", self.namespaces.join(", "))?;
            sep = ";";
        }
        if self.containers && self.state.is_none() {
            write!(
                f,
                "{sep} containers or a network labelled {}={}",
                RUN_LABEL, self.run
            )?;
            sep = ";";
        }
        match self.state.as_ref().map(|s| &s.resources) {
            Some(Resources::Netns { work_dir }) => {
                write!(f, "{sep} directory {}", work_dir.display())
            }
            Some(Resources::Docker { work_dir }) => write!(
                f,
                "{sep} containers and network labelled {}={}, directory {}",
                RUN_LABEL,
                self.run,
                work_dir.display()
            ),
            Some(Resources::Hosts { hosts, run_dir }) => {
                let addrs: Vec<String> = hosts.iter().map(|h| h.addr.to_string()).collect();
                write!(
                    f,
                    "{sep} {} on hosts {}",
                    run_dir.display(),
                    addrs.join(", ")
                )
            }
            None => match &self.record {
                Some(r) => write!(f, "{sep} unreadable record {}", r.display()),
                None => write!(f, " (no record of its owner)"),
            },
        }
    }
}

/// The runs recorded in `state_dir`, found in prefixed namespaces or named by Docker resources
/// labelled [`RUN_LABEL`] (`labelled`, as `docker::labelled_runs` lists them) whose owner is
/// gone or unknown. Runs whose owner is alive are left out, namespaces and all.
pub fn find(state_dir: &Path, labelled: Vec<String>) -> anyhow::Result<Vec<Leftover>> {
    let mut runs: BTreeMap<String, Leftover> = BTreeMap::new();
    let entry = |runs: &mut BTreeMap<String, Leftover>, run: &str| -> Leftover {
        runs.remove(run).unwrap_or_else(|| Leftover {
            run: run.to_string(),
            state: None,
            record: None,
            namespaces: Vec::new(),
            containers: false,
        })
    };
    let mut live = Vec::new();
    match std::fs::read_dir(state_dir) {
        Ok(entries) => {
            for e in entries.flatten() {
                let path = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(run) = name.strip_suffix(".json").filter(|r| !r.starts_with('.')) else {
                    continue;
                };
                let state = std::fs::read(&path)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<RunState>(&b).ok())
                    .filter(|s| s.run == run);
                if state.as_ref().is_some_and(RunState::owner_alive) {
                    live.push(run.to_string());
                    continue;
                }
                let mut l = entry(&mut runs, run);
                l.state = state;
                l.record = Some(path);
                runs.insert(run.to_string(), l);
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", state_dir.display())),
    }
    for ns in prefixed_namespaces()? {
        let run = run_of_namespace(&ns).unwrap_or(&ns).to_string();
        if live.contains(&run) {
            continue;
        }
        let mut l = entry(&mut runs, &run);
        l.namespaces.push(ns);
        runs.insert(run, l);
    }
    for run in labelled {
        if live.contains(&run) {
            continue;
        }
        let mut l = entry(&mut runs, &run);
        l.containers = true;
        runs.insert(run, l);
    }
    Ok(runs.into_values().collect())
}

/// The processes running inside a network namespace.
pub fn namespace_pids(ns: &str) -> Vec<i32> {
    Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// A shell line that lazily unmounts every mount at or below `dir` (deepest first): the
/// power-loss filesystems of a run whose owner died. Their processes, started outside any
/// namespace, exit once unmounted, and the directory can then be removed.
pub fn unmount_script(dir: &Path) -> String {
    let dir = dir.display().to_string();
    format!(
        "awk -v d={d} '$5 == d || index($5, d \"/\") == 1 {{ print $5 }}' /proc/self/mountinfo \
         | sort -r | while read -r m; do fusermount3 -u -z \"$m\" 2>/dev/null \
         || umount -l \"$m\"; done",
        d = crate::remote::escape(dir.trim_end_matches('/')),
    )
}

/// The processes whose command line names a path inside `dir`, other than this one.
fn started_from(dir: &Path) -> Vec<i32> {
    let needle = format!("{}/", dir.display().to_string().trim_end_matches('/'));
    let me = std::process::id() as i32;
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        })
        .collect()
}

/// Kills what a run started outside its namespaces from its work directory (the power-loss
/// filesystems, which exit by themselves once unmounted, but not at once) and waits up to 10 s
/// for them to be gone.
fn kill_started_from(dir: &Path) -> anyhow::Result<()> {
    for pid in started_from(dir) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = started_from(dir);
        if left.is_empty() {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!(
                "processes started from {} outlived SIGKILL: {left:?}",
                dir.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Kills every process inside the namespaces, deletes them (which removes their interfaces,
/// bridges and iptables rules), unmounts what is mounted below the work directory and removes
/// it. Tries every step; returns the
/// first error.
pub fn remove(namespaces: &[String], work_dir: Option<&Path>) -> anyhow::Result<()> {
    let mut first_err: Option<anyhow::Error> = None;
    for ns in namespaces {
        for pid in namespace_pids(ns) {
            // Only processes inside our own namespaces are signalled: tidemark started them.
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    for ns in namespaces {
        let out = Command::new("ip").args(["netns", "del", ns]).output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                let msg = String::from_utf8_lossy(&o.stderr);
                if !msg.contains("No such file") {
                    first_err.get_or_insert(anyhow::anyhow!("ip netns del {ns}: {}", msg.trim()));
                }
            }
            Err(e) => {
                first_err.get_or_insert(anyhow::anyhow!("ip netns del {ns}: {e}"));
            }
        }
    }
    if let Some(dir) = work_dir {
        match Command::new("sh")
            .args(["-c", &unmount_script(dir)])
            .output()
        {
            Ok(o) if o.status.success() => {}
            Ok(o) => {
                first_err.get_or_insert(anyhow::anyhow!(
                    "unmounting below {}: {}",
                    dir.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
            }
            Err(e) => {
                first_err.get_or_insert(anyhow::anyhow!("unmounting below {}: {e}", dir.display()));
            }
        }
        if let Err(e) = kill_started_from(dir) {
            first_err.get_or_insert(e);
        }
        if let Err(e) = std::fs::remove_dir_all(dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                first_err.get_or_insert(anyhow::anyhow!("removing {}: {e}", dir.display()));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_read_from_namespace_names() {
        assert_eq!(run_of_namespace("tdm-1a2b3c4d-n1"), Some("1a2b3c4d"));
        assert_eq!(run_of_namespace("tdm-1a2b3c4d-ctl"), Some("1a2b3c4d"));
        assert_eq!(run_of_namespace("tdm-x"), None);
        assert_eq!(run_of_namespace("other-1-n1"), None);
    }

    fn netns(dir: &str) -> Resources {
        Resources::Netns {
            work_dir: PathBuf::from(dir),
        }
    }

    #[test]
    fn this_process_is_alive_and_a_made_up_one_is_not() {
        let me = RunState::current("abc", netns("/w")).unwrap();
        assert!(me.owner_alive());
        let stale = RunState {
            start_ticks: me.start_ticks + 1,
            ..me.clone()
        };
        assert!(!stale.owner_alive());
        let other_boot = RunState {
            boot_id: "another boot".into(),
            ..me.clone()
        };
        assert!(!other_boot.owner_alive());
    }

    #[test]
    fn dead_and_unreadable_records_are_leftovers_and_live_ones_are_not() {
        let dir = tempfile::tempdir().unwrap();
        RunState::current("live", netns("/w/live"))
            .unwrap()
            .write(dir.path())
            .unwrap();
        let dead = RunState {
            run: "dead".into(),
            start_ticks: 1,
            ..RunState::current("dead", netns("/w/dead")).unwrap()
        };
        dead.write(dir.path()).unwrap();
        std::fs::write(dir.path().join("torn.json"), "{\"run\":").unwrap();
        // Docker's labels name the live run, the dead one and one nobody recorded.
        let labelled = vec!["live".into(), "dead".into(), "unrecorded".into()];
        let (found, unrecorded): (Vec<Leftover>, Vec<Leftover>) = find(dir.path(), labelled)
            .unwrap()
            .into_iter()
            .partition(|l| l.record.is_some());
        let labelled_only: Vec<(&str, bool)> = unrecorded
            .iter()
            .filter(|l| l.containers)
            .map(|l| (l.run.as_str(), l.owner_known()))
            .collect();
        assert_eq!(labelled_only, vec![("unrecorded", false)]);
        assert!(found.iter().all(|l| l.run != "dead" || l.containers));
        let runs: Vec<(&str, bool)> = found
            .iter()
            .map(|l| (l.run.as_str(), l.owner_known()))
            .collect();
        assert_eq!(runs, vec![("dead", true), ("torn", false)]);
        assert_eq!(found[0].work_dir(), Some(Path::new("/w/dead")));
        RunState::remove(dir.path(), "dead").unwrap();
        RunState::remove(dir.path(), "dead").unwrap();
        assert!(!RunState::path(dir.path(), "dead").exists());
    }

    fn on_hosts(addrs: &[&str]) -> Resources {
        Resources::Hosts {
            hosts: addrs
                .iter()
                .map(|a| SshConfig {
                    user: "root".into(),
                    addr: a.parse().unwrap(),
                    key_file: Some(PathBuf::from("/k")),
                    use_agent: false,
                    known_hosts: crate::ssh::KnownHosts::Ignore,
                    timeout: std::time::Duration::from_secs(3),
                })
                .collect(),
            run_dir: PathBuf::from("/tmp/tidemark-hosts/r1"),
        }
    }

    #[test]
    fn only_a_dead_run_on_a_shared_host_stands_in_a_new_runs_way() {
        let left = |resources| Leftover {
            run: "dead".into(),
            state: Some(RunState {
                start_ticks: 1,
                ..RunState::current("dead", resources).unwrap()
            }),
            record: None,
            namespaces: Vec::new(),
            containers: false,
        };
        let on_hosts_run = left(on_hosts(&["10.0.0.1:22", "10.0.0.2:22"]));
        let shared: Vec<std::net::SocketAddr> = vec!["10.0.0.2:2222".parse().unwrap()];
        let apart: Vec<std::net::SocketAddr> = vec!["10.0.0.3:22".parse().unwrap()];
        assert!(on_hosts_run.collides_with(Some(&shared)));
        assert!(!on_hosts_run.collides_with(Some(&apart)));
        assert!(!on_hosts_run.collides_with(None));
        let netns_run = left(netns("/w/dead"));
        assert!(!netns_run.collides_with(None));
        assert!(!netns_run.collides_with(Some(&shared)));
    }

    #[test]
    fn records_round_trip_with_what_the_run_made() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = on_hosts(&["10.0.0.1:22"]);
        let state = RunState::current("r1", hosts).unwrap();
        state.write(dir.path()).unwrap();
        let back: RunState =
            serde_json::from_slice(&std::fs::read(RunState::path(dir.path(), "r1")).unwrap())
                .unwrap();
        assert_eq!(back, state);
    }
}
