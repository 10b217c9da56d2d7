//! Finding and removing what runs left behind. Every run that creates anything on this machine
//! first writes a state file naming its owner process; everything it creates carries the prefix
//! [`PREFIX`] and its run id. A run whose owner is gone (killed with -9, machine rebooted half way)
//! is a leftover: `tidemark test` refuses to start over one and `tidemark teardown` removes it.
//! Runs whose owner is still alive are never touched, so concurrent runs do not disturb each other.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

/// Prefix of every network namespace the harness creates.
pub const PREFIX: &str = "tdm-";

/// The file in a run's work directory that names its owner.
pub const STATE_FILE: &str = "state.json";

/// Who owns a run's resources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunState {
    /// The run id (hex, no dashes).
    pub run: String,
    /// The owning harness process.
    pub pid: i32,
    /// The owner's start time in clock ticks since boot, to tell a reused pid apart.
    pub start_ticks: u64,
}

impl RunState {
    /// The state of a run owned by this process.
    pub fn current(run: &str) -> anyhow::Result<Self> {
        let pid = std::process::id() as i32;
        Ok(RunState {
            run: run.to_string(),
            pid,
            start_ticks: start_ticks(pid).context("reading this process's start time")?,
        })
    }

    /// Whether the owner is still running.
    pub fn owner_alive(&self) -> bool {
        start_ticks(self.pid) == Some(self.start_ticks)
    }

    /// Writes the state into `dir`, creating it.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(STATE_FILE);
        std::fs::write(&path, serde_json::to_vec_pretty(self)?)
            .with_context(|| format!("writing {}", path.display()))
    }
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
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .context("running `ip netns list` (is iproute2 installed?)")?;
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

/// What one dead run left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// The run id.
    pub run: String,
    /// Its network namespaces (with their bridges, veths and iptables rules).
    pub namespaces: Vec<String>,
    /// Its work directory, when it still exists.
    pub work_dir: Option<PathBuf>,
}

impl std::fmt::Display for Leftover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "run {}", self.run)?;
        if !self.namespaces.is_empty() {
            write!(f, ": namespaces {}", self.namespaces.join(", "))?;
        }
        if let Some(d) = &self.work_dir {
            write!(f, "; directory {}", d.display())?;
        }
        Ok(())
    }
}

/// The runs under `work_root` or in prefixed namespaces whose owner is gone.
pub fn find(work_root: &Path) -> anyhow::Result<Vec<Leftover>> {
    let mut runs: BTreeMap<String, Leftover> = BTreeMap::new();
    for ns in prefixed_namespaces()? {
        let run = run_of_namespace(&ns).unwrap_or(&ns).to_string();
        runs.entry(run.clone())
            .or_insert_with(|| Leftover {
                run,
                namespaces: Vec::new(),
                work_dir: None,
            })
            .namespaces
            .push(ns);
    }
    if let Ok(entries) = std::fs::read_dir(work_root) {
        for e in entries.flatten() {
            if e.path().is_dir() {
                let run = e.file_name().to_string_lossy().into_owned();
                runs.entry(run.clone())
                    .or_insert_with(|| Leftover {
                        run,
                        namespaces: Vec::new(),
                        work_dir: None,
                    })
                    .work_dir = Some(e.path());
            }
        }
    }
    Ok(runs
        .into_values()
        .filter(|l| {
            let state = std::fs::read(work_root.join(&l.run).join(STATE_FILE))
                .ok()
                .and_then(|b| serde_json::from_slice::<RunState>(&b).ok());
            !state.is_some_and(|s| s.owner_alive())
        })
        .collect())
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

/// Kills every process inside the namespaces, deletes them (which removes their interfaces,
/// bridges and iptables rules) and removes the work directory. Tries every step; returns the
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

    #[test]
    fn this_process_is_alive_and_a_made_up_one_is_not() {
        let me = RunState::current("abc").unwrap();
        assert!(me.owner_alive());
        let stale = RunState {
            start_ticks: me.start_ticks + 1,
            ..me.clone()
        };
        assert!(!stale.owner_alive());
    }

    #[test]
    fn dead_runs_in_the_work_root_are_leftovers_and_live_ones_are_not() {
        let root = tempfile::tempdir().unwrap();
        RunState::current("live")
            .unwrap()
            .write(&root.path().join("live"))
            .unwrap();
        let dead = RunState {
            run: "dead".into(),
            pid: std::process::id() as i32,
            start_ticks: 1,
        };
        dead.write(&root.path().join("dead")).unwrap();
        let found: Vec<String> = find(root.path())
            .unwrap()
            .into_iter()
            .filter(|l| l.work_dir.is_some())
            .map(|l| l.run)
            .collect();
        assert_eq!(found, vec!["dead".to_string()]);
    }
}
