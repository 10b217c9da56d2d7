//! The `hosts` runtime: machines that already exist (VMs, Vagrant boxes, bare hosts), reached
//! over SSH and listed in a nodes file. Nothing is created but one directory per run on each
//! host; everything the run starts there is found again by that directory's path, so teardown
//! removes exactly what this run made. Before it logs in anywhere the run records its hosts and
//! how to log in to them (see [`crate::leftovers`]), so a run killed with -9 is cleaned later
//! by `tidemark teardown` with [`clean`].

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};

use crate::dial::{Dialer, Direct};
use crate::leftovers::{self, Resources, RunState};
use crate::net::{CHAIN, NFT_TABLE};
use crate::prerequisites::{self, Requirement};
use crate::remote::{self, command_line, escape};
use crate::runtime::{Node, NodeRole, Runtime};
use crate::ssh::{KnownHosts, Ssh, SshConfig};

/// The directory on each host under which runs keep their files.
pub const HOSTS_ROOT: &str = "/tmp/tidemark-hosts";

/// How to log in to the hosts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostsLogin {
    /// Remote user (root, or one that may run iptables).
    pub user: String,
    /// Private key file, if any.
    pub key_file: Option<PathBuf>,
    /// Whether to try the SSH agent.
    pub use_agent: bool,
    /// Host key policy.
    pub known_hosts: KnownHosts,
    /// Connect and per-operation timeout.
    pub timeout: Duration,
}

impl HostsLogin {
    /// How to reach the host at `addr`.
    pub fn config(&self, addr: SocketAddr) -> SshConfig {
        SshConfig {
            user: self.user.clone(),
            addr,
            key_file: self.key_file.clone(),
            use_agent: self.use_agent,
            known_hosts: self.known_hosts.clone(),
            timeout: self.timeout,
        }
    }
}

/// The hosts of a nodes file, grouped by cluster in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodesFile {
    /// Each cluster's name and hosts.
    pub clusters: Vec<(String, Vec<SocketAddr>)>,
}

impl NodesFile {
    /// Every host, cluster after cluster.
    pub fn hosts(&self) -> Vec<SocketAddr> {
        self.clusters
            .iter()
            .flat_map(|(_, h)| h.iter().copied())
            .collect()
    }
}

/// Reads a nodes file: one host per line as `address[:port]` (port 22 by default); blank lines
/// and `#` comments are ignored. Host names are resolved here, since brokers need addresses.
/// A line `[name]` starts the hosts of cluster `name` (lowercase letters); a file without such
/// lines is one cluster, `a`. Each host may be listed once.
pub fn read_nodes_file(path: &Path) -> anyhow::Result<NodesFile> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let at = |line: usize| format!("{}:{line}", path.display());
    // Each cluster with the line that started it (0 for the implicit one).
    let mut clusters: Vec<(String, usize, Vec<SocketAddr>)> = Vec::new();
    let mut seen: Vec<(SocketAddr, usize)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            let name = name.trim();
            // `[::1]:22` is a host, `[a]` a section: a section name is letters only.
            if !name.contains(':') {
                crate::test::check_cluster_name(name)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", at(n)))?;
                if let Some((_, first, _)) = clusters.iter().find(|(c, _, _)| c == name) {
                    bail!(
                        "{}: cluster [{name}] already started on line {first}",
                        at(n)
                    );
                }
                if clusters.len() == 1 && clusters[0].1 == 0 {
                    bail!(
                        "{}: [{name}] follows hosts that belong to no cluster; put a [name] line \
                         before the first host",
                        at(n)
                    );
                }
                clusters.push((name.to_string(), n, Vec::new()));
                continue;
            }
        }
        let host = parse_host(line).with_context(|| format!("{}: bad host {line:?}", at(n)))?;
        if let Some((_, first)) = seen.iter().find(|(h, _)| *h == host) {
            bail!("{}: host {host} is already listed on line {first}", at(n));
        }
        seen.push((host, n));
        if clusters.is_empty() {
            clusters.push(("a".to_string(), 0, Vec::new()));
        }
        clusters.last_mut().expect("pushed above").2.push(host);
    }
    if clusters.is_empty() {
        bail!("{} lists no hosts", path.display());
    }
    if let Some((name, line, _)) = clusters.iter().find(|(_, _, h)| h.is_empty()) {
        bail!("{}: cluster [{name}] lists no hosts", at(*line));
    }
    Ok(NodesFile {
        clusters: clusters.into_iter().map(|(c, _, h)| (c, h)).collect(),
    })
}

fn parse_host(s: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let with_port = if s.contains(':') && !s.starts_with('[') && s.matches(':').count() == 1 {
        s.to_string()
    } else {
        format!("{s}:22")
    };
    with_port
        .to_socket_addrs()?
        .next()
        .context("the name resolves to no address")
}

/// Hosts reached over SSH.
pub struct HostsRuntime {
    run: String,
    hosts: NodesFile,
    login: HostsLogin,
    nodes: Vec<Node>,
    state_dir: Option<PathBuf>,
    requirements: Vec<Requirement>,
}

impl HostsRuntime {
    /// A runtime for run `run` on `hosts`: each cluster's nodes on that cluster's hosts.
    pub fn new(run: &str, hosts: NodesFile, login: HostsLogin) -> Self {
        HostsRuntime {
            run: run.to_string(),
            hosts,
            login,
            nodes: Vec::new(),
            state_dir: None,
            requirements: Vec::new(),
        }
    }

    /// Checks that every host has `requirements` (the broker's, the net's and the faults') over
    /// SSH before anything is made on any of them.
    pub fn requiring(mut self, requirements: Vec<Requirement>) -> Self {
        self.requirements = requirements;
        self
    }

    fn run_dir(&self) -> PathBuf {
        run_dir(&self.run)
    }

    /// Records the hosts and the login before anything is made on them.
    fn record(&mut self) -> anyhow::Result<()> {
        if self.state_dir.is_some() {
            return Ok(());
        }
        let dir = leftovers::state_dir()?;
        let made = Resources::Hosts {
            hosts: self
                .hosts
                .hosts()
                .into_iter()
                .map(|a| self.login.config(a))
                .collect(),
            run_dir: self.run_dir(),
        };
        RunState::current(&self.run, made)?.write(&dir)?;
        self.state_dir = Some(dir);
        Ok(())
    }

    /// The script that kills what the run started on a host, unmounts what it mounted below its
    /// directory (power-loss filesystems), removes its iptables chain and its directory. Processes are recognised by the run directory in their command line; the
    /// bracket keeps the pattern from matching the shell that runs it.
    pub fn cleanup_script(run_dir: &Path) -> String {
        let dir = run_dir.display().to_string();
        let pattern = format!("[{}]{}/", &dir[..1], &dir[1..]);
        format!(
            "pkill -KILL -f {pat}; {unmount}; \
             if command -v iptables >/dev/null; then \
             iptables -w -D INPUT -j {CHAIN} 2>/dev/null; iptables -w -F {CHAIN} 2>/dev/null; \
             iptables -w -X {CHAIN} 2>/dev/null; fi; \
             if command -v nft >/dev/null; then nft delete table inet {NFT_TABLE} 2>/dev/null; fi; \
             rm -rf {dir}",
            unmount = crate::leftovers::unmount_script(run_dir),
            pat = escape(&pattern),
            dir = escape(&dir),
        )
    }
}

impl Runtime for HostsRuntime {
    fn name(&self) -> &'static str {
        "hosts"
    }

    fn describe(&self) -> serde_json::Value {
        let clusters: std::collections::BTreeMap<&str, &[SocketAddr]> = self
            .hosts
            .clusters
            .iter()
            .map(|(c, h)| (c.as_str(), h.as_slice()))
            .collect();
        serde_json::json!({
            "name": "hosts",
            "run": self.run,
            "hosts": self.hosts.hosts(),
            "clusters": clusters,
            "user": self.login.user,
            "work_dir": self.run_dir(),
        })
    }

    fn create(&mut self, cluster: &str, names: &[String]) -> anyhow::Result<Vec<Node>> {
        let Some((_, hosts)) = self.hosts.clusters.iter().find(|(c, _)| c == cluster) else {
            bail!(
                "cluster {cluster:?} asked for, but the nodes file lists clusters {}",
                self.hosts
                    .clusters
                    .iter()
                    .map(|(c, _)| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        };
        let hosts = hosts.clone();
        if names.len() != hosts.len() {
            bail!(
                "{} nodes asked for in cluster {cluster}, but the nodes file lists {} hosts for it",
                names.len(),
                hosts.len()
            );
        }
        let mut sessions = Vec::new();
        for addr in &hosts {
            let ssh = Ssh::connect(self.login.config(*addr), Arc::new(Direct))?;
            prerequisites::check_on(&ssh, &self.requirements)?;
            sessions.push(ssh);
        }
        self.record()?;
        let mut made = Vec::new();
        for (i, ((name, addr), ssh)) in names.iter().zip(&hosts).zip(sessions).enumerate() {
            let dir = self.run_dir().join(name);
            remote::run(
                &ssh,
                &command_line(&["mkdir", "-p", &dir.display().to_string()]),
            )?;
            let node = Node {
                role: NodeRole::Combined,
                name: name.clone(),
                cluster: cluster.to_string(),
                id: i as u32 + 1,
                ip: addr.ip(),
                dir,
                remote: Arc::new(ssh),
            };
            self.nodes.push(node.clone());
            made.push(node);
        }
        Ok(made)
    }

    fn dialer(&self) -> Arc<dyn Dialer> {
        Arc::new(Direct)
    }

    fn destroy(&mut self) -> anyhow::Result<()> {
        let script = Self::cleanup_script(&self.run_dir());
        let mut first_err = None;
        for node in self.nodes.drain(..) {
            if let Err(e) = remote::run(node.remote.as_ref(), &script) {
                first_err.get_or_insert(anyhow::Error::from(e).context(node.name));
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        // The record goes last: if a host could not be cleaned, teardown finds the run by it.
        if let Some(dir) = self.state_dir.take() {
            RunState::remove(&dir, &self.run)?;
        }
        Ok(())
    }
}

impl Drop for HostsRuntime {
    fn drop(&mut self) {
        if !self.nodes.is_empty() || self.state_dir.is_some() {
            if let Err(e) = self.destroy() {
                eprintln!("tidemark: hosts teardown: {e:#}");
            }
        }
    }
}

/// The directory of run `run` on every host.
pub fn run_dir(run: &str) -> PathBuf {
    Path::new(HOSTS_ROOT).join(run)
}

/// Logs in to each host and removes what the run with directory `run_dir` made there: its
/// processes, the firewall chain and table, the directory. Tries every host; returns the first
/// error, naming the host.
pub fn clean(hosts: &[SshConfig], run_dir: &Path) -> anyhow::Result<()> {
    let script = HostsRuntime::cleanup_script(run_dir);
    let mut first_err = None;
    for config in hosts {
        let done = Ssh::connect(config.clone(), Arc::new(Direct))
            .and_then(|ssh| remote::run(&ssh, &script).map(drop));
        if let Err(e) = done {
            first_err
                .get_or_insert(anyhow::Error::from(e).context(format!("host {}", config.addr)));
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The run ids with a directory under [`HOSTS_ROOT`] on the host.
pub fn runs_on(config: &SshConfig) -> anyhow::Result<Vec<String>> {
    let ssh = Ssh::connect(config.clone(), Arc::new(Direct))?;
    let listing = remote::run(
        &ssh,
        &format!("ls -1 {} 2>/dev/null || true", escape(HOSTS_ROOT)),
    )?;
    Ok(listing
        .lines()
        .map(str::trim)
        // Run ids are hex; anything else in the directory is not a run's.
        .filter(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_hexdigit()))
        .map(str::to_string)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_files_list_addresses_with_optional_ports() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("nodes");
        std::fs::write(
            &f,
            "# three VMs\n10.0.0.1\n10.0.0.2:2222  # custom port\n\n[::1]:22\n",
        )
        .unwrap();
        let hosts = read_nodes_file(&f).unwrap();
        assert_eq!(hosts.clusters.len(), 1);
        assert_eq!(hosts.clusters[0].0, "a");
        assert_eq!(
            hosts.hosts(),
            vec![
                "10.0.0.1:22".parse().unwrap(),
                "10.0.0.2:2222".parse().unwrap(),
                "[::1]:22".parse().unwrap()
            ]
        );
        std::fs::write(&f, "# nothing\n").unwrap();
        assert!(read_nodes_file(&f).is_err());
        std::fs::write(&f, "10.0.0.1:notaport\n").unwrap();
        let err = format!("{:#}", read_nodes_file(&f).unwrap_err());
        assert!(err.contains(":1: bad host"), "{err}");
    }

    #[test]
    fn nodes_files_group_hosts_by_cluster_in_sections() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("nodes");
        std::fs::write(
            &f,
            "# two clusters\n[a]\n10.0.0.1\n10.0.0.2\n\n[b]  # the mirror\n10.0.1.1\n[::1]:2222\n",
        )
        .unwrap();
        let file = read_nodes_file(&f).unwrap();
        let a: Vec<SocketAddr> = vec![
            "10.0.0.1:22".parse().unwrap(),
            "10.0.0.2:22".parse().unwrap(),
        ];
        let b: Vec<SocketAddr> = vec![
            "10.0.1.1:22".parse().unwrap(),
            "[::1]:2222".parse().unwrap(),
        ];
        assert_eq!(
            file.clusters,
            vec![("a".to_string(), a), ("b".to_string(), b)]
        );
        let bad = |text: &str, want: &str| {
            std::fs::write(&f, text).unwrap();
            let err = format!("{:#}", read_nodes_file(&f).unwrap_err());
            let at = format!("{}:{want}", f.display());
            assert!(err.starts_with(&at), "{err} does not start with {at}");
        };
        bad("[a]\n10.0.0.1\n[B]\n10.0.1.1\n", "3: cluster name \"B\"");
        bad(
            "[a]\n10.0.0.1\n[a]\n10.0.1.1\n",
            "3: cluster [a] already started on line 1",
        );
        bad("10.0.0.1\n[b]\n10.0.1.1\n", "2: [b] follows hosts");
        bad("[a]\n10.0.0.1\n[b]\n", "3: cluster [b] lists no hosts");
        bad(
            "[a]\n10.0.0.1\n[b]\n10.0.0.1:22\n",
            "4: host 10.0.0.1:22 is already listed on line 2",
        );
    }

    #[test]
    fn cleanup_kills_by_run_directory_without_matching_itself() {
        let script = HostsRuntime::cleanup_script(Path::new("/tmp/tidemark-hosts/ab12"));
        assert!(
            script.starts_with("pkill -KILL -f '[/]tmp/tidemark-hosts/ab12/';"),
            "{script}"
        );
        assert!(
            script.ends_with("rm -rf /tmp/tidemark-hosts/ab12"),
            "{script}"
        );
        assert!(script.contains("iptables -w -X TIDEMARK"));
    }

    #[test]
    fn the_cleanup_pattern_matches_the_run_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        std::fs::create_dir_all(&run).unwrap();
        let sleeper = run.join("sleeper");
        std::fs::copy("/bin/sleep", &sleeper).unwrap();
        let mut ours = std::process::Command::new(&sleeper)
            .arg("60")
            .spawn()
            .unwrap();
        let mut other = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let script = HostsRuntime::cleanup_script(&run);
        // In a network namespace of its own, so the script's iptables cleanup cannot touch this
        // machine's firewall.
        let mut cmd = if crate::leftovers::is_root() {
            let mut c = std::process::Command::new("unshare");
            c.args(["-n", "sh", "-c", &script]);
            c
        } else {
            let mut c = std::process::Command::new("sh");
            c.args(["-c", &script]);
            c
        };
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(ours.wait().unwrap().code().is_none(), "killed by a signal");
        assert!(
            other.try_wait().unwrap().is_none(),
            "an unrelated sleep survives"
        );
        other.kill().unwrap();
        other.wait().unwrap();
        assert!(!run.exists());
    }
}
