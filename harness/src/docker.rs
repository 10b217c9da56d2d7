//! The `docker` runtime: one container per node from the image `tidemark image build` makes (see
//! [`crate::image`]), on a Docker network of the run's own. Containers run sshd and are driven
//! over SSH exactly like the machines of the `hosts` runtime (the same [`Ssh`] remote), with a
//! key made for the run, so every fault works in them as on VMs. The harness reaches them at
//! their bridge addresses. Every container and the network carry the label [`RUN_LABEL`]`=<run>`;
//! the run is recorded (see [`crate::leftovers`]) before anything is made, so `tidemark teardown`
//! removes a killed run's containers and network by that label and nothing else.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::dial::{Dialer, Direct};
use crate::leftovers::{self, Resources, RunState, PREFIX, RUN_LABEL};
use crate::prerequisites::{self, Requirement};
use crate::remote::{self, command_line};
use crate::runtime::{Node, NodeRole, Runtime};
use crate::ssh::{KnownHosts, Ssh, SshConfig};

/// The image nodes run unless told otherwise.
pub const DEFAULT_IMAGE: &str = "tidemark-node";

/// Where a node's files live inside its container.
const NODE_ROOT: &str = "/srv/tidemark";

/// How long a container's sshd gets to answer after `docker run`.
const SSH_READY: Duration = Duration::from_secs(20);

/// Runs `docker ARGS` and returns its trimmed stdout, or an error naming the command and what
/// docker printed.
pub fn docker<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> anyhow::Result<String> {
    let line = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let out = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running `docker {line}` (is Docker installed?)"))?;
    if !out.status.success() {
        bail!(
            "`docker {line}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The name of the run's network.
pub fn network_name(run: &str) -> String {
    format!("{PREFIX}{run}")
}

/// The name of a node's container.
pub fn container_name(run: &str, node: &str) -> String {
    format!("{PREFIX}{run}-{node}")
}

/// The ids of the containers labelled with run `run`.
pub fn containers_of(run: &str) -> anyhow::Result<Vec<String>> {
    let filter = format!("label={RUN_LABEL}={run}");
    Ok(docker(&["ps", "-aq", "--filter", &filter])?
        .lines()
        .map(str::to_string)
        .collect())
}

/// The names of the networks labelled with run `run`.
pub fn networks_of(run: &str) -> anyhow::Result<Vec<String>> {
    let filter = format!("label={RUN_LABEL}={run}");
    Ok(docker(&[
        "network",
        "ls",
        "-q",
        "--filter",
        &filter,
        "--format",
        "{{.Name}}",
    ])?
    .lines()
    .map(str::to_string)
    .collect())
}

/// The run ids on every container and network that carries [`RUN_LABEL`]; none when Docker is
/// not installed or its daemon does not answer this user (no run can have made containers
/// there, and a machine of namespace or SSH runs only must not need Docker).
pub fn labelled_runs() -> anyhow::Result<Vec<String>> {
    let daemon = Command::new("docker")
        .args(["version", "--format", "{{.Server.Version}}"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !daemon {
        return Ok(Vec::new());
    }
    let filter = format!("label={RUN_LABEL}");
    let format = format!("{{{{.Label \"{RUN_LABEL}\"}}}}");
    let containers = docker(&["ps", "-a", "--filter", &filter, "--format", &format])?;
    let networks = docker(&["network", "ls", "--filter", &filter, "--format", &format])?;
    let mut runs: Vec<String> = containers
        .lines()
        .chain(networks.lines())
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .map(str::to_string)
        .collect();
    runs.sort();
    runs.dedup();
    Ok(runs)
}

/// Removes run `run`'s containers (with their volumes) and then its network, found by label.
/// Tries both; returns the first error.
pub fn clean(run: &str) -> anyhow::Result<()> {
    let mut first_err = None;
    match containers_of(run) {
        Ok(ids) if !ids.is_empty() => {
            let mut args = vec!["rm".to_string(), "-f".into(), "-v".into()];
            args.extend(ids);
            if let Err(e) = docker(&args) {
                first_err.get_or_insert(e);
            }
        }
        Ok(_) => {}
        Err(e) => {
            first_err.get_or_insert(e);
        }
    }
    match networks_of(run) {
        Ok(nets) => {
            for net in nets {
                if let Err(e) = docker(&["network", "rm", &net]) {
                    first_err.get_or_insert(e);
                }
            }
        }
        Err(e) => {
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => Err(e.context(format!("removing the containers and network of run {run}"))),
        None => Ok(()),
    }
}

/// Nodes in containers on a private Docker network.
pub struct DockerRuntime {
    run: String,
    image: String,
    /// This machine's directory of the run: the SSH key and known_hosts file.
    work_dir: PathBuf,
    nodes: Vec<Node>,
    state_dir: Option<PathBuf>,
    network: Option<String>,
    requirements: Vec<Requirement>,
}

impl DockerRuntime {
    /// A runtime for run `run` whose containers run `image`, keeping its key below `base`.
    pub fn new(base: &Path, run: &str, image: &str) -> Self {
        DockerRuntime {
            run: run.to_string(),
            image: image.to_string(),
            work_dir: base.join(format!("{PREFIX}{run}")),
            nodes: Vec::new(),
            state_dir: None,
            network: None,
            requirements: Vec::new(),
        }
    }

    /// Checks that every container has `requirements` over SSH before the run goes on.
    pub fn requiring(mut self, requirements: Vec<Requirement>) -> Self {
        self.requirements = requirements;
        self
    }

    /// What this machine needs: the docker CLI and ssh-keygen for the run's key.
    pub fn requirements() -> Vec<Requirement> {
        vec![
            Requirement::program("docker", "docker.io", "the docker runtime"),
            Requirement::program("ssh-keygen", "openssh-client", "the docker runtime"),
        ]
    }

    fn key(&self) -> PathBuf {
        self.work_dir.join("id_ed25519")
    }

    /// Records the run, makes its key and its network: once, before the first container.
    fn prepare(&mut self) -> anyhow::Result<()> {
        if self.network.is_some() {
            return Ok(());
        }
        docker(&["image", "inspect", "--format", "{{.Id}}", &self.image]).with_context(|| {
            format!(
                "the image {} is missing: make it with `tidemark image build`",
                self.image
            )
        })?;
        let state_dir = leftovers::state_dir()?;
        let made = Resources::Docker {
            work_dir: self.work_dir.clone(),
        };
        RunState::current(&self.run, made)?.write(&state_dir)?;
        self.state_dir = Some(state_dir);
        std::fs::create_dir_all(&self.work_dir)
            .with_context(|| format!("creating {}", self.work_dir.display()))?;
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C"])
            .arg(format!("tidemark-{}", self.run))
            .arg("-f")
            .arg(self.key())
            .stdin(Stdio::null())
            .output()
            .context("running ssh-keygen")?;
        if !out.status.success() {
            bail!(
                "ssh-keygen failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let name = network_name(&self.run);
        docker(&[
            "network",
            "create",
            "--label",
            &format!("{RUN_LABEL}={}", self.run),
            &name,
        ])?;
        self.network = Some(name);
        Ok(())
    }

    /// Starts one node's container and returns its address on the run's network.
    fn start(&self, node: &str, network: &str, public_key: &str) -> anyhow::Result<IpAddr> {
        let name = container_name(&self.run, node);
        let mut args: Vec<String> = [
            "run",
            "-d",
            "--name",
            &name,
            "--hostname",
            node,
            "--label",
            &format!("{RUN_LABEL}={}", self.run),
            "--network",
            network,
            // iptables and nft inside the node; mounts for the power-loss filesystem.
            "--cap-add",
            "NET_ADMIN",
            "--cap-add",
            "SYS_ADMIN",
            "-e",
            &format!("TIDEMARK_AUTHORIZED_KEY={public_key}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if Path::new("/dev/fuse").exists() {
            args.extend(["--device".into(), "/dev/fuse".into()]);
        }
        args.push(self.image.clone());
        docker(&args)?;
        let ip = docker(&[
            "inspect",
            "--format",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            &name,
        ])?;
        ip.parse()
            .with_context(|| format!("container {name} has no address on {network}: {ip:?}"))
    }

    /// Logs in to a container's sshd, which may take a moment to start.
    fn login(&self, ip: IpAddr) -> anyhow::Result<Ssh> {
        let config = SshConfig {
            user: "root".into(),
            addr: SocketAddr::new(ip, 22),
            key_file: Some(self.key()),
            use_agent: false,
            // The containers were made a moment ago by this run; their keys are new.
            known_hosts: KnownHosts::AcceptNew(self.work_dir.join("known_hosts")),
            timeout: Duration::from_secs(30),
        };
        let started = Instant::now();
        loop {
            let quick = SshConfig {
                timeout: Duration::from_secs(2),
                ..config.clone()
            };
            match Ssh::connect(quick, Arc::new(Direct)) {
                Ok(_) => return Ok(Ssh::connect(config, Arc::new(Direct))?),
                Err(e) if started.elapsed() > SSH_READY => {
                    return Err(anyhow::Error::from(e).context(format!(
                        "sshd in the container at {ip} did not answer within {SSH_READY:?}"
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}

impl Runtime for DockerRuntime {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "name": "docker",
            "run": self.run,
            "image": self.image,
            "network": network_name(&self.run),
            "label": format!("{RUN_LABEL}={}", self.run),
            "work_dir": self.work_dir,
        })
    }

    fn create(&mut self, cluster: &str, names: &[String]) -> anyhow::Result<Vec<Node>> {
        self.prepare()?;
        let network = self.network.clone().expect("prepared above");
        let public_key = std::fs::read_to_string(self.key().with_extension("pub"))
            .context("reading the run's public key")?;
        let mut addrs = Vec::new();
        for name in names {
            addrs.push(self.start(name, &network, public_key.trim())?);
        }
        let mut made = Vec::new();
        for (i, (name, ip)) in names.iter().zip(addrs).enumerate() {
            let ssh = self.login(ip)?;
            prerequisites::check_on(&ssh, &self.requirements)?;
            let dir = Path::new(NODE_ROOT).join(name);
            remote::run(
                &ssh,
                &command_line(&["mkdir", "-p", &dir.display().to_string()]),
            )?;
            let node = Node {
                role: NodeRole::Combined,
                name: name.clone(),
                cluster: cluster.to_string(),
                id: i as u32 + 1,
                ip,
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
        // Removing a container kills what runs in it and drops its firewall rules with it.
        self.nodes.clear();
        let mut result = clean(&self.run);
        self.network = None;
        if let Err(e) = std::fs::remove_dir_all(&self.work_dir) {
            if e.kind() != std::io::ErrorKind::NotFound && result.is_ok() {
                result = Err(anyhow::anyhow!("removing {}: {e}", self.work_dir.display()));
            }
        }
        result?;
        // The record goes last: if something could not be removed, teardown finds the run by it.
        if let Some(dir) = self.state_dir.take() {
            RunState::remove(&dir, &self.run)?;
        }
        Ok(())
    }
}

impl Drop for DockerRuntime {
    fn drop(&mut self) {
        if self.state_dir.is_some() {
            if let Err(e) = self.destroy() {
                eprintln!("tidemark: docker teardown: {e:#}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix_and_the_run() {
        assert_eq!(network_name("1a2b"), "tdm-1a2b");
        assert_eq!(container_name("1a2b", "n1"), "tdm-1a2b-n1");
    }
}
