//! `tidemark-broker` as a [`Db`]: upload the binary, render `server.properties`, start it as a
//! daemon with a pid file, and kill, pause, resume, stop, wipe and dump it — all through the
//! node's [`Remote`](crate::remote::Remote), so the same code serves namespaces and SSH hosts.
//!
//! Files on a node, under its directory: `bin/tidemark-broker`, `server.properties`, `data/`,
//! `broker.log` (the broker's stderr), `broker.pid` and, when it runs under libfaketime,
//! `faketime` (its wall-clock offset).
//!
//! With tiered storage on ([`TidemarkBroker::with_remote_store`]), the cluster's remote store is
//! the directory `remote-store-<cluster>` beside the node directories (the nodes must share a
//! filesystem, as the netns runtime's do), and each node reaches it through its own link
//! `remote-store`, which `remote.log.storage.dir` names: a remote-store outage points one node's
//! link at a directory that is not there.
//!
//! With power loss on ([`TidemarkBroker::with_powerfs`]), `data/` is a tidemark-powerfs mount
//! over `data.disk/` (the durable state), served by `bin/tidemark-powerfs` (pid in
//! `powerfs.pid`, log in `powerfs.log`, control socket `powerfs.sock`). It is mounted before the
//! broker starts and unmounted (cleanly, so everything becomes durable) when the broker stops;
//! a crash (`kill`) leaves it mounted, as a process crash leaves the page cache.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::client::{ClientContext, NodeAddr};
use crate::db::{
    DataDir, Db, DiskFault, DumpedReplica, FailingDisk, FakeClock, Kill, LogFiles, Mirror, Pause,
    PowerLoss, Probe, RemoteStore, ReplicaDump, Unconverged,
};
use crate::kafka::{error_name, is_internal_topic, Connection};
use crate::mirror::{self as mirror_api, MirrorRequest, PartitionDescription};
use crate::prerequisites::Requirement;
use crate::probe;
use crate::remote::{self, command_line, escape};
use crate::runtime::{Node, NodeRole};

/// The topic config that extends the LMLE truncation's wait to every replica (KIP-1279).
pub const MIRROR_UNCLEAN_KEY: &str = "mirror.support.unclean.leader.election";

/// The client listener port.
pub const CLIENT_PORT: u16 = 9092;
/// The controller listener port.
pub const CONTROLLER_PORT: u16 = 9093;

/// The broker settings a test chooses (Kafka property names in comments).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerConfig {
    /// `num.partitions`.
    pub num_partitions: u32,
    /// `default.replication.factor`.
    pub default_replication_factor: u32,
    /// `min.insync.replicas`.
    pub min_insync_replicas: u32,
    /// `unclean.leader.election.enable`.
    pub unclean_leader_election: bool,
    /// `auto.create.topics.enable`.
    pub auto_create_topics: bool,
    /// `replica.lag.time.max.ms`.
    pub replica_lag_time_max_ms: u64,
    /// `broker.heartbeat.interval.ms`.
    pub heartbeat_interval_ms: u64,
    /// `broker.session.timeout.ms`: a broker silent this long is fenced.
    pub session_timeout_ms: u64,
    /// `log.segment.bytes`, when set.
    pub log_segment_bytes: Option<u64>,
    /// `log.flush.interval.messages`, when set.
    pub log_flush_interval_messages: Option<u64>,
    /// Any other property; these win over everything above.
    pub overrides: BTreeMap<String, String>,
}

impl BrokerConfig {
    /// Safe defaults for topics of `rf` replicas: min ISR one less (at least 1), no unclean
    /// election, topics created explicitly. Failure detection is quick (fencing after 3 s of
    /// silence, ISR shrink after 3 s of lag) so that faults lead to elections within a short
    /// test.
    pub fn for_replication(rf: u32) -> Self {
        let rf = rf.max(1);
        BrokerConfig {
            num_partitions: 1,
            default_replication_factor: rf,
            min_insync_replicas: rf.saturating_sub(1).max(1),
            unclean_leader_election: false,
            auto_create_topics: false,
            replica_lag_time_max_ms: 3_000,
            heartbeat_interval_ms: 500,
            session_timeout_ms: 3_000,
            log_segment_bytes: None,
            log_flush_interval_messages: None,
            overrides: BTreeMap::new(),
        }
    }
}

impl BrokerConfig {
    /// The properties every node shares, by Kafka name (overrides applied).
    pub fn properties(&self) -> BTreeMap<String, String> {
        let mut props: BTreeMap<String, String> = BTreeMap::new();
        let mut set = |k: &str, v: String| {
            props.insert(k.to_string(), v);
        };
        set("num.partitions", self.num_partitions.to_string());
        set(
            "default.replication.factor",
            self.default_replication_factor.to_string(),
        );
        set("min.insync.replicas", self.min_insync_replicas.to_string());
        set(
            "unclean.leader.election.enable",
            self.unclean_leader_election.to_string(),
        );
        set(
            "auto.create.topics.enable",
            self.auto_create_topics.to_string(),
        );
        set(
            "replica.lag.time.max.ms",
            self.replica_lag_time_max_ms.to_string(),
        );
        set(
            "broker.heartbeat.interval.ms",
            self.heartbeat_interval_ms.to_string(),
        );
        set(
            "broker.session.timeout.ms",
            self.session_timeout_ms.to_string(),
        );
        if let Some(b) = self.log_segment_bytes {
            set("log.segment.bytes", b.to_string());
        }
        if let Some(m) = self.log_flush_interval_messages {
            set("log.flush.interval.messages", m.to_string());
        }
        for (k, v) in &self.overrides {
            set(k, v.clone());
        }
        props
    }
}

/// Renders `server.properties` for `node` in `cluster`, storing data in `data_dir`: the voters
/// are the cluster's nodes with the controller role, and each node listens as its role needs.
pub fn render_properties(
    config: &BrokerConfig,
    node: &Node,
    cluster: &[Node],
    data_dir: &Path,
) -> String {
    let mut props: BTreeMap<String, String> = BTreeMap::new();
    props.insert("node.id".into(), node.id.to_string());
    // Mirroring tells clusters apart by id (a mirror of one's own cluster is a loop).
    props.insert("cluster.id".into(), format!("tidemark-{}", node.cluster));
    let (roles, listeners) = match node.role {
        NodeRole::Combined => (
            "broker,controller",
            format!(
                "PLAINTEXT://{}:{CLIENT_PORT},CONTROLLER://{}:{CONTROLLER_PORT}",
                node.ip, node.ip
            ),
        ),
        NodeRole::Broker => ("broker", format!("PLAINTEXT://{}:{CLIENT_PORT}", node.ip)),
        NodeRole::Controller => (
            "controller",
            format!("CONTROLLER://{}:{CONTROLLER_PORT}", node.ip),
        ),
    };
    props.insert("process.roles".into(), roles.into());
    props.insert("listeners".into(), listeners);
    if node.role.is_broker() {
        props.insert(
            "advertised.listeners".into(),
            format!("PLAINTEXT://{}:{CLIENT_PORT}", node.ip),
        );
    }
    props.insert("controller.listener.names".into(), "CONTROLLER".into());
    props.insert(
        "controller.quorum.voters".into(),
        cluster
            .iter()
            .filter(|n| n.role.is_voter())
            .map(|n| format!("{}@{}:{CONTROLLER_PORT}", n.id, n.ip))
            .collect::<Vec<_>>()
            .join(","),
    );
    props.insert("log.dirs".into(), data_dir.display().to_string());
    // Shared settings (and overrides) come last so an override can replace anything.
    props.extend(config.properties());
    let mut out = format!(
        "# Written by tidemark for node {} of cluster {}.\n",
        node.name, node.cluster
    );
    for (k, v) in props {
        let _ = writeln!(out, "{k}={v}");
    }
    out
}

/// `tidemark-broker` on each node.
#[derive(Debug, Clone)]
pub struct TidemarkBroker {
    binary: PathBuf,
    config: BrokerConfig,
    inject_bugs: Vec<String>,
    faketime: Option<PathBuf>,
    powerfs: Option<PathBuf>,
    remote_store: bool,
}

/// A shell function that tells whether a pid is a live process: some thread of it is not a
/// zombie. A killed multi-threaded process shows its first thread as a zombie while the others
/// still exit, holding its files (the data directory's lock among them), so a restart right
/// after would find the lock taken.
const ALIVE: &str = "alive() { for s in /proc/$1/task/*/status; do \
     grep -q '^State:[[:space:]]*[^Z[:space:]]' \"$s\" 2>/dev/null && return 0; done; return 1; }";

/// A shell function: whether every thread of process `$1` is stopped (state `T`).
const STOPPED: &str = "stopped() { for s in /proc/$1/task/*/status; do \
     grep -q '^State:[[:space:]]*T' \"$s\" 2>/dev/null || return 1; done; return 0; }";

impl TidemarkBroker {
    /// Deploys the broker binary at `binary` (on this machine) with `config`, turning on each
    /// injectable bug in `inject_bugs`.
    pub fn new(binary: PathBuf, config: BrokerConfig, inject_bugs: Vec<String>) -> Self {
        TidemarkBroker {
            binary,
            config,
            inject_bugs,
            faketime: None,
            powerfs: None,
            remote_store: false,
        }
    }

    /// Gives each cluster a tiered-storage remote store in a directory its nodes share, each
    /// node reaching it through a link of its own (`remote.log.storage.dir`), so that
    /// [`RemoteStore`] can take it away from one node.
    pub fn with_remote_store(mut self) -> Self {
        self.remote_store = true;
        self
    }

    /// The cluster's shared remote store.
    fn shared_store(node: &Node) -> PathBuf {
        node.dir
            .parent()
            .unwrap_or(&node.dir)
            .join(format!("remote-store-{}", node.cluster))
    }

    /// The node's own way to the remote store.
    fn store_link(node: &Node) -> PathBuf {
        node.dir.join("remote-store")
    }

    /// Points the node's link at `target`, atomically (a new link renamed over the old), so the
    /// broker never sees the link missing.
    fn relink_command(node: &Node, target: &Path) -> String {
        let link = Self::store_link(node);
        let tmp = node.dir.join("remote-store.new");
        format!(
            "ln -sfn {target} {tmp} && mv -T {tmp} {link}",
            target = Self::path_arg(target),
            tmp = Self::path_arg(&tmp),
            link = Self::path_arg(&link),
        )
    }

    /// Puts every node's data directory on tidemark-powerfs, deploying the binary at `binary`
    /// (on this machine), so the nodes can lose power.
    pub fn with_powerfs(mut self, binary: PathBuf) -> Self {
        self.powerfs = Some(binary);
        self
    }

    /// Starts every broker under the libfaketime library at `library` (on the nodes), with the
    /// wall clock read from a per-node offset file and the monotonic clock left alone (the
    /// broker's timers use it), so clock faults can skew a running broker.
    pub fn with_faketime(mut self, library: PathBuf) -> Self {
        self.faketime = Some(library);
        self
    }

    /// What the nodes need to run the broker: `setsid` and `nohup` start it detached, and the
    /// libfaketime library when clock faults are on.
    pub fn requirements(&self) -> Vec<Requirement> {
        let mut reqs = vec![
            Requirement::program("setsid", "util-linux", "starting brokers"),
            Requirement::program("nohup", "coreutils", "starting brokers"),
        ];
        if let Some(lib) = &self.faketime {
            reqs.push(Requirement::file(lib, "faketime", "clock faults"));
        }
        if self.powerfs.is_some() {
            reqs.push(Requirement::program("fusermount3", "fuse3", "power faults"));
            reqs.push(Requirement::program(
                "mountpoint",
                "util-linux",
                "power faults",
            ));
            reqs.push(Requirement::device(
                Path::new("/dev/fuse"),
                "fuse3",
                "power faults",
            ));
        }
        reqs
    }

    fn powerfs_bin(node: &Node) -> PathBuf {
        node.dir.join("bin").join("tidemark-powerfs")
    }

    fn disk_dir(node: &Node) -> PathBuf {
        node.dir.join("data.disk")
    }

    fn powerfs_pid_file(node: &Node) -> PathBuf {
        node.dir.join("powerfs.pid")
    }

    fn powerfs_socket(node: &Node) -> PathBuf {
        node.dir.join("powerfs.sock")
    }

    /// Mounts the data directory unless it is mounted, and returns once it is (or the
    /// filesystem has exited, with its log's tail as the error).
    fn mount_command(node: &Node) -> String {
        let log = node.dir.join("powerfs.log");
        format!(
            "{ALIVE}; mountpoint -q {mp} && exit 0; mkdir -p {disk} {mp} || exit 1; \
             nohup setsid {bin} mount --backing {disk} --mountpoint {mp} --control {sock} \
             >> {log} 2>&1 < /dev/null & p=$!; echo $p > {pid}; \
             while ! mountpoint -q {mp}; do \
             if ! alive $p; then echo 'tidemark-powerfs exited:' >&2; tail -n 5 {log} >&2; \
             exit 1; fi; sleep 0.05; done",
            mp = Self::path_arg(&Self::data_dir(node)),
            disk = Self::path_arg(&Self::disk_dir(node)),
            bin = Self::path_arg(&Self::powerfs_bin(node)),
            sock = Self::path_arg(&Self::powerfs_socket(node)),
            log = Self::path_arg(&log),
            pid = Self::path_arg(&Self::powerfs_pid_file(node)),
        )
    }

    /// Unmounts the data directory and waits for the filesystem process to exit, killing it
    /// after 10 s. Cleanly, the filesystem is asked on its control socket to write everything
    /// back and unmount; it exits by itself, as it does after a power loss (`lazy`: it has
    /// dropped what it had and is unmounting). A plain `fusermount3 -u` is not enough: the
    /// copies of the mount in the mount namespaces of processes started since (each
    /// `ip netns exec` makes one) keep the filesystem's session open, so it would never hear of
    /// the unmount and would be killed before writing back.
    fn unmount_command(node: &Node, lazy: bool) -> String {
        let clean = if lazy {
            String::new()
        } else {
            format!(
                "if [ -S {sock} ] && ! {bin} unmount --control {sock}; then \
                 echo 'tidemark-powerfs did not write back before unmounting' >&2; fi; ",
                bin = Self::path_arg(&Self::powerfs_bin(node)),
                sock = Self::path_arg(&Self::powerfs_socket(node)),
            )
        };
        format!(
            "{ALIVE}; mp={mp}; {clean}if mountpoint -q $mp; then \
             fusermount3 -u -z $mp; fi; \
             p=$(cat {pid} 2>/dev/null) || exit 0; i=0; \
             while alive $p && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; \
             if alive $p; then kill -KILL $p; fi; rm -f {pid}",
            mp = Self::path_arg(&Self::data_dir(node)),
            pid = Self::path_arg(&Self::powerfs_pid_file(node)),
        )
    }

    fn faketime_file(node: &Node) -> PathBuf {
        node.dir.join("faketime")
    }

    fn bin(node: &Node) -> PathBuf {
        node.dir.join("bin").join("tidemark-broker")
    }

    fn data_dir(node: &Node) -> PathBuf {
        node.dir.join("data")
    }

    fn pid_file(node: &Node) -> PathBuf {
        node.dir.join("broker.pid")
    }

    fn log_file(node: &Node) -> PathBuf {
        node.dir.join("broker.log")
    }

    fn props_file(node: &Node) -> PathBuf {
        node.dir.join("server.properties")
    }

    fn path_arg(p: &Path) -> String {
        escape(&p.display().to_string())
    }

    /// The command line that starts the broker in the background and records its pid. `setsid`
    /// keeps terminal signals meant for the harness away from it.
    pub fn start_command(&self, node: &Node) -> String {
        let mut args = vec![
            Self::bin(node).display().to_string(),
            Self::props_file(node).display().to_string(),
        ];
        for bug in &self.inject_bugs {
            args.push("--inject-bug".into());
            args.push(bug.clone());
        }
        // Under faketime the offset file must exist before the first clock read.
        let (prepare, env) = match &self.faketime {
            Some(lib) => {
                let file = Self::faketime_file(node).display().to_string();
                (
                    format!("[ -f {f} ] || printf +0 > {f}; ", f = escape(&file)),
                    format!(
                        "env {} ",
                        command_line(&[
                            format!("LD_PRELOAD={}", lib.display()),
                            format!("FAKETIME_TIMESTAMP_FILE={file}"),
                            "FAKETIME_NO_CACHE=1".to_string(),
                            "DONT_FAKE_MONOTONIC=1".to_string(),
                        ])
                    ),
                )
            }
            None => (String::new(), String::new()),
        };
        format!(
            "{ALIVE}; if [ -f {pid} ] && alive $(cat {pid}); then exit 0; fi; {prepare}\
             cd {dir} && nohup {env}setsid {cmd} >> {log} 2>&1 < /dev/null & echo $! > {pid}",
            pid = Self::path_arg(&Self::pid_file(node)),
            dir = Self::path_arg(&node.dir),
            cmd = command_line(&args),
            log = Self::path_arg(&Self::log_file(node)),
        )
    }

    /// Sends SIGSTOP or SIGCONT and returns once the kernel shows every thread of the process
    /// stopped, or one running: the signal is delivered asynchronously, thread by thread (the
    /// main thread can stop while a worker still fetches), and a fault that says "paused" must
    /// be in effect.
    fn freeze_command(node: &Node, freeze: bool) -> String {
        let (signal, test) = if freeze { ("STOP", "!") } else { ("CONT", "") };
        format!(
            "{ALIVE}; {STOPPED}; p=$(cat {pid} 2>/dev/null) || exit 0; \
             if alive $p; then kill -{signal} $p; i=0; \
             while alive $p && {test} stopped $p && [ $i -lt 100 ]; \
             do sleep 0.02; i=$((i+1)); done; fi; true",
            pid = Self::path_arg(&Self::pid_file(node)),
        )
    }

    /// Sends SIGTERM and waits up to `grace_ms`, then SIGKILL; returns when the process is gone.
    fn stop_command(node: &Node, grace_ms: u64) -> String {
        format!(
            "{ALIVE}; p=$(cat {pid} 2>/dev/null) || exit 0; \
             if alive $p; then kill -CONT $p; kill -TERM $p; i=0; \
             while alive $p && [ $i -lt {tries} ]; do sleep 0.1; i=$((i+1)); done; \
             if alive $p; then kill -KILL $p; fi; \
             while alive $p; do sleep 0.05; done; fi; rm -f {pid}",
            pid = Self::path_arg(&Self::pid_file(node)),
            tries = grace_ms / 100,
        )
    }

    /// Sends SIGKILL and returns when the process is gone.
    fn kill_command(node: &Node) -> String {
        format!(
            "{ALIVE}; p=$(cat {pid} 2>/dev/null) || exit 0; \
             if alive $p; then kill -KILL $p; while alive $p; do sleep 0.05; done; fi; rm -f {pid}",
            pid = Self::path_arg(&Self::pid_file(node)),
        )
    }
}

impl Db for TidemarkBroker {
    fn setup(&self, node: &Node, cluster: &[Node]) -> anyhow::Result<()> {
        let r = node.remote.as_ref();
        let bin = Self::bin(node);
        remote::run(
            r,
            &command_line(&[
                "mkdir",
                "-p",
                &bin.parent().unwrap_or(&node.dir).display().to_string(),
                &Self::data_dir(node).display().to_string(),
            ]),
        )?;
        r.upload(&self.binary, &bin)
            .with_context(|| format!("uploading {}", self.binary.display()))?;
        remote::run(
            r,
            &command_line(&["chmod", "755", &bin.display().to_string()]),
        )?;
        if let Some(powerfs) = &self.powerfs {
            let target = Self::powerfs_bin(node);
            r.upload(powerfs, &target)
                .with_context(|| format!("uploading {}", powerfs.display()))?;
            remote::run(
                r,
                &command_line(&["chmod", "755", &target.display().to_string()]),
            )?;
        }
        let mut config = self.config.clone();
        if self.remote_store {
            remote::run(
                r,
                &format!(
                    "mkdir -p {} && {}",
                    Self::path_arg(&Self::shared_store(node)),
                    Self::relink_command(node, &Self::shared_store(node))
                ),
            )?;
            config
                .overrides
                .entry("remote.log.storage.dir".into())
                .or_insert_with(|| Self::store_link(node).display().to_string());
        }
        let props = render_properties(&config, node, cluster, &Self::data_dir(node));
        let local = tempfile_with(&props)?;
        r.upload(local.path(), &Self::props_file(node))?;
        self.start(node)
    }

    fn stop(&self, node: &Node) -> anyhow::Result<()> {
        // SIGTERM, then SIGKILL after 10 s.
        remote::run(node.remote.as_ref(), &Self::stop_command(node, 10_000))?;
        if self.powerfs.is_some() {
            remote::run_in_host_mounts(node.remote.as_ref(), &Self::unmount_command(node, false))?;
        }
        Ok(())
    }

    fn wipe(&self, node: &Node) -> anyhow::Result<()> {
        if self.powerfs.is_some() {
            remote::run_in_host_mounts(node.remote.as_ref(), &Self::unmount_command(node, false))?;
        }
        remote::run(
            node.remote.as_ref(),
            &command_line(&[
                "rm",
                "-rf",
                &Self::data_dir(node).display().to_string(),
                &Self::disk_dir(node).display().to_string(),
            ]),
        )?;
        Ok(())
    }

    fn endpoint(&self, node: &Node) -> SocketAddr {
        SocketAddr::new(node.ip, CLIENT_PORT)
    }

    fn control_endpoint(&self, node: &Node) -> Option<SocketAddr> {
        Some(SocketAddr::new(node.ip, CONTROLLER_PORT))
    }

    fn describe(&self) -> Value {
        let version = std::process::Command::new(&self.binary)
            .arg("--version")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        json!({
            "name": "tidemark-broker",
            "binary": self.binary.display().to_string(),
            "sha256": binary_sha256(&self.binary).ok(),
            "version": version,
            "config": self.config,
            "properties": self.config.properties(),
            "inject_bugs": self.inject_bugs,
            "faketime": self.faketime,
            "powerfs": self.powerfs,
            "remote_store": self.remote_store,
        })
    }

    fn as_kill(&self) -> Option<&dyn Kill> {
        Some(self)
    }

    fn as_pause(&self) -> Option<&dyn Pause> {
        Some(self)
    }

    fn as_log_files(&self) -> Option<&dyn LogFiles> {
        Some(self)
    }

    fn as_replica_dump(&self) -> Option<&dyn ReplicaDump> {
        Some(self)
    }

    fn as_probe(&self) -> Option<&dyn Probe> {
        Some(self)
    }

    fn as_fake_clock(&self) -> Option<&dyn FakeClock> {
        self.faketime.is_some().then_some(self as &dyn FakeClock)
    }

    fn as_data_dir(&self) -> Option<&dyn DataDir> {
        Some(self)
    }

    fn as_mirror(&self) -> Option<&dyn Mirror> {
        Some(self)
    }

    fn as_remote_store(&self) -> Option<&dyn RemoteStore> {
        self.remote_store.then_some(self as &dyn RemoteStore)
    }

    fn as_power_loss(&self) -> Option<&dyn PowerLoss> {
        self.powerfs.is_some().then_some(self as &dyn PowerLoss)
    }

    fn as_failing_disk(&self) -> Option<&dyn FailingDisk> {
        self.powerfs.is_some().then_some(self as &dyn FailingDisk)
    }
}

impl TidemarkBroker {
    /// Asks `node`'s filesystem to put `fault` in force (`None`: to work again).
    fn disk_command(node: &Node, fault: Option<DiskFault>) -> anyhow::Result<Value> {
        let mut args = vec![
            Self::powerfs_bin(node).display().to_string(),
            "disk".into(),
            "--control".into(),
            Self::powerfs_socket(node).display().to_string(),
        ];
        if let Some(f) = fault {
            args.extend(["--fault".to_string(), f.name().to_string()]);
        }
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = remote::run_in_host_mounts(node.remote.as_ref(), &command_line(&argv))?;
        serde_json::from_str(&out)
            .with_context(|| format!("{}: bad disk report {out:?}", node.name))
    }
}

impl FailingDisk for TidemarkBroker {
    fn fail(&self, node: &Node, fault: DiskFault) -> anyhow::Result<Value> {
        Self::disk_command(node, Some(fault))
    }

    fn heal(&self, node: &Node) -> anyhow::Result<Value> {
        Self::disk_command(node, None)
    }

    fn reboot(&self, node: &Node) -> anyhow::Result<()> {
        let r = node.remote.as_ref();
        remote::run(r, &Self::kill_command(node))?;
        remote::run_in_host_mounts(r, &Self::unmount_command(node, false))?;
        self.start(node)
    }
}

impl PowerLoss for TidemarkBroker {
    fn power_off(&self, node: &Node, seed: u64) -> anyhow::Result<Value> {
        let r = node.remote.as_ref();
        remote::run(r, &Self::kill_command(node))?;
        let out = remote::run_in_host_mounts(
            r,
            &command_line(&[
                &Self::powerfs_bin(node).display().to_string(),
                "lose-power",
                "--control",
                &Self::powerfs_socket(node).display().to_string(),
                "--seed",
                &seed.to_string(),
            ]),
        )?;
        let report: Value = serde_json::from_str(&out)
            .with_context(|| format!("{}: bad lose-power report {out:?}", node.name))?;
        remote::run_in_host_mounts(r, &Self::unmount_command(node, true))?;
        Ok(report)
    }

    fn power_on(&self, node: &Node) -> anyhow::Result<()> {
        self.start(node)
    }
}

impl RemoteStore for TidemarkBroker {
    fn cut(&self, node: &Node) -> anyhow::Result<()> {
        let nowhere = node.dir.join("remote-store-unreachable");
        remote::run(node.remote.as_ref(), &Self::relink_command(node, &nowhere))?;
        Ok(())
    }

    fn restore(&self, node: &Node) -> anyhow::Result<()> {
        remote::run(
            node.remote.as_ref(),
            &Self::relink_command(node, &Self::shared_store(node)),
        )?;
        Ok(())
    }
}

impl FakeClock for TidemarkBroker {
    fn offset_file(&self, node: &Node) -> PathBuf {
        Self::faketime_file(node)
    }
}

impl DataDir for TidemarkBroker {
    fn data_dir(&self, node: &Node) -> PathBuf {
        Self::data_dir(node)
    }
}

impl Kill for TidemarkBroker {
    fn kill(&self, node: &Node) -> anyhow::Result<()> {
        remote::run(node.remote.as_ref(), &Self::kill_command(node))?;
        Ok(())
    }

    fn start(&self, node: &Node) -> anyhow::Result<()> {
        if self.powerfs.is_some() {
            remote::run_in_host_mounts(node.remote.as_ref(), &Self::mount_command(node))?;
        }
        remote::run(node.remote.as_ref(), &self.start_command(node))?;
        Ok(())
    }

    fn is_running(&self, node: &Node) -> anyhow::Result<bool> {
        let out = remote::run(
            node.remote.as_ref(),
            &format!(
                "{ALIVE}; if [ -f {pid} ] && alive $(cat {pid}); then echo yes; else echo no; fi",
                pid = Self::path_arg(&Self::pid_file(node)),
            ),
        )?;
        Ok(out.trim() == "yes")
    }
}

impl Pause for TidemarkBroker {
    fn pause(&self, node: &Node) -> anyhow::Result<()> {
        remote::run(node.remote.as_ref(), &Self::freeze_command(node, true))?;
        Ok(())
    }

    fn resume(&self, node: &Node) -> anyhow::Result<()> {
        remote::run(node.remote.as_ref(), &Self::freeze_command(node, false))?;
        Ok(())
    }
}

impl LogFiles for TidemarkBroker {
    fn log_files(&self, node: &Node) -> Vec<PathBuf> {
        let mut files = vec![Self::log_file(node), Self::props_file(node)];
        if self.powerfs.is_some() {
            files.push(node.dir.join("powerfs.log"));
        }
        files
    }
}

impl Mirror for TidemarkBroker {
    fn create_mirror<'a>(
        &'a self,
        destination: &'a ClientContext,
        name: &'a str,
        source: &'a ClientContext,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let source_bootstrap = source
                .nodes
                .iter()
                .map(|n| n.addr.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let req = MirrorRequest::Create {
                mirror: name.to_string(),
                source_bootstrap,
                configs: Default::default(),
            };
            mirror_api::call_any(destination, &req)
                .await?
                .check(&format!("create mirror {name} on {}", destination.cluster))
        })
    }

    fn start_mirror<'a>(
        &'a self,
        destination: &'a ClientContext,
        name: &'a str,
        topics: &'a [String],
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let req = MirrorRequest::Start {
                mirror: name.to_string(),
                topics: topics.to_vec(),
            };
            mirror_api::call_any(destination, &req)
                .await?
                .check(&format!("start mirror {name} on {}", destination.cluster))
        })
    }

    fn stop_mirror<'a>(
        &'a self,
        destination: &'a ClientContext,
        name: &'a str,
        topics: &'a [String],
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let req = MirrorRequest::Stop {
                mirror: name.to_string(),
                topics: topics.to_vec(),
            };
            mirror_api::call_any(destination, &req)
                .await?
                .check(&format!("stop mirror {name} on {}", destination.cluster))
        })
    }

    fn describe_mirror<'a>(
        &'a self,
        cluster: &'a ClientContext,
        name: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Vec<(String, PartitionDescription)>>> {
        Box::pin(async move {
            let r = mirror_api::describe(cluster, name).await?;
            r.check(&format!("describe mirror {name} on {}", cluster.cluster))?;
            Ok(r.mirrors
                .iter()
                .filter(|m| m.name == name)
                .flat_map(|m| m.topics.iter())
                .flat_map(|t| t.partitions.iter().map(|p| (t.name.clone(), p.clone())))
                .collect())
        })
    }

    fn kept_lmles<'a>(
        &'a self,
        cluster: &'a ClientContext,
        requester: &'a ClientContext,
        name: &'a str,
        topic: &'a str,
    ) -> BoxFuture<'a, anyhow::Result<Vec<(i32, i32)>>> {
        Box::pin(mirror_api::kept_lmles(cluster, requester, name, topic))
    }

    fn set_unclean_support<'a>(
        &'a self,
        cluster: &'a ClientContext,
        topic: &'a str,
        on: bool,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(async move {
            let mut last = String::from("the cluster has no nodes");
            for node in &cluster.nodes {
                let attempt = async {
                    let mut c =
                        Connection::connect(cluster.dialer.clone(), node.addr, cluster.timeout)
                            .await?;
                    c.set_topic_config(topic, MIRROR_UNCLEAN_KEY, &on.to_string())
                        .await
                };
                match attempt.await {
                    Ok((0, _)) => return Ok(()),
                    Ok((code, message)) => anyhow::bail!(
                        "{MIRROR_UNCLEAN_KEY}={on} on {topic} in cluster {}: {} {}",
                        cluster.cluster,
                        error_name(code),
                        message.unwrap_or_default()
                    ),
                    Err(e) => last = format!("{}: {e}", node.name),
                }
            }
            anyhow::bail!("no node of cluster {} answered: {last}", cluster.cluster)
        })
    }
}

impl Probe for TidemarkBroker {
    fn serves<'a>(
        &'a self,
        cx: &'a ClientContext,
        node: &'a NodeAddr,
    ) -> BoxFuture<'a, anyhow::Result<()>> {
        Box::pin(probe::kafka_serves(cx, node))
    }

    fn converged<'a>(
        &'a self,
        cx: &'a ClientContext,
        nodes: &'a [Node],
    ) -> BoxFuture<'a, Result<(), Unconverged>> {
        Box::pin(probe::kafka_converged(cx, nodes, self))
    }
}

impl ReplicaDump for TidemarkBroker {
    fn dump_replicas(&self, node: &Node) -> anyhow::Result<Vec<DumpedReplica>> {
        let mut args = vec![
            Self::bin(node).display().to_string(),
            "dump-log".into(),
            "--node".into(),
            node.name.clone(),
            "--cluster".into(),
            node.cluster.clone(),
        ];
        // Through the shared store itself: the node's link may be cut when the dump runs.
        if self.remote_store {
            args.push("--remote-dir".into());
            args.push(Self::shared_store(node).display().to_string());
        }
        args.push("--data-dir".into());
        let dump = command_line(&args);
        // A stopped node's power-loss filesystem is unmounted and all its data is on the disk.
        let cmd = if self.powerfs.is_some() {
            format!(
                "d={data}; mountpoint -q $d || d={disk}; {dump} \"$d\"",
                data = Self::path_arg(&Self::data_dir(node)),
                disk = Self::path_arg(&Self::disk_dir(node)),
            )
        } else {
            format!("{dump} {}", Self::path_arg(&Self::data_dir(node)))
        };
        let out = remote::run(node.remote.as_ref(), &cmd)?;
        let mut replicas = Vec::new();
        for line in out.lines().filter(|l| !l.trim().is_empty()) {
            let bad = || format!("{}: bad dump-log line {line:?}", node.name);
            let v: Value = serde_json::from_str(line).with_context(bad)?;
            if v["topic"].as_str().is_some_and(is_internal_topic) {
                continue;
            }
            replicas.push(serde_json::from_value(v).with_context(bad)?);
        }
        Ok(replicas)
    }
}

/// A local file holding `content`, removed when dropped. Its name is the operating system's to
/// choose: nodes are set up in parallel, and a name made of the pid and the time once gave two
/// nodes the same file, so one broker started with another node's configuration (the lock on
/// that node's data directory taken, the start refused).
fn tempfile_with(content: &str) -> anyhow::Result<tempfile::NamedTempFile> {
    let mut file = tempfile::Builder::new()
        .prefix("tidemark-props-")
        .tempfile()
        .context("creating a temporary file for server.properties")?;
    std::io::Write::write_all(&mut file, content.as_bytes())
        .with_context(|| format!("writing {}", file.path().display()))?;
    Ok(file)
}

/// The SHA-256 of the file at `path` in lowercase hex, as `sha256sum` prints it: test.json
/// records the broker binary's, so that a replay can tell whether it deploys the same build.
pub fn binary_sha256(path: &Path) -> std::io::Result<String> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut hasher)?;
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::Local;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    #[test]
    fn configurations_rendered_at_once_each_keep_their_own_file() {
        let files: Vec<(String, tempfile::NamedTempFile)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..32)
                .map(|i| {
                    s.spawn(move || {
                        let content = format!("node.id={i}\n");
                        let file = tempfile_with(&content).unwrap();
                        (content, file)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (content, file) in &files {
            assert_eq!(&std::fs::read_to_string(file.path()).unwrap(), content);
        }
    }

    fn node(i: u8) -> Node {
        Node {
            role: NodeRole::Combined,
            name: format!("n{i}"),
            cluster: "a".into(),
            id: i as u32,
            ip: IpAddr::V4(Ipv4Addr::new(10, 211, 0, 10 + i)),
            dir: format!("/w/n{i}").into(),
            remote: Arc::new(Local::host()),
        }
    }

    #[test]
    fn a_binary_is_named_by_the_sha256_sha256sum_prints() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("abc");
        std::fs::write(&file, "abc").unwrap();
        assert_eq!(
            binary_sha256(&file).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert!(binary_sha256(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn dedicated_controllers_are_the_only_voters_and_listen_for_the_quorum_alone() {
        let role = |mut n: Node, role| {
            n.role = role;
            n
        };
        let cluster = [
            role(node(1), NodeRole::Broker),
            role(node(2), NodeRole::Broker),
            role(node(3), NodeRole::Controller),
        ];
        let props = |n: &Node| {
            render_properties(
                &BrokerConfig::for_replication(2),
                n,
                &cluster,
                Path::new("/d"),
            )
        };
        let (broker, controller) = (props(&cluster[0]), props(&cluster[2]));
        for p in [&broker, &controller] {
            assert!(
                p.contains("\ncontroller.quorum.voters=3@10.211.0.13:9093\n"),
                "{p}"
            );
        }
        assert!(broker.contains("\nprocess.roles=broker\n"), "{broker}");
        assert!(
            broker.contains("\nlisteners=PLAINTEXT://10.211.0.11:9092\n"),
            "{broker}"
        );
        assert!(broker.contains("\nadvertised.listeners=PLAINTEXT://10.211.0.11:9092\n"));
        assert!(
            controller.contains("\nprocess.roles=controller\n"),
            "{controller}"
        );
        assert!(controller.contains("\nlisteners=CONTROLLER://10.211.0.13:9093\n"));
        assert!(!controller.contains("advertised.listeners"), "{controller}");
    }

    #[test]
    fn properties_name_the_node_its_listeners_and_the_quorum() {
        let cluster = [node(1), node(2), node(3)];
        let props = render_properties(
            &BrokerConfig::for_replication(3),
            &cluster[1],
            &cluster,
            Path::new("/w/n2/data"),
        );
        let lines: Vec<&str> = props.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(
            lines,
            vec![
                "advertised.listeners=PLAINTEXT://10.211.0.12:9092",
                "auto.create.topics.enable=false",
                "broker.heartbeat.interval.ms=500",
                "broker.session.timeout.ms=3000",
                "cluster.id=tidemark-a",
                "controller.listener.names=CONTROLLER",
                "controller.quorum.voters=1@10.211.0.11:9093,2@10.211.0.12:9093,3@10.211.0.13:9093",
                "default.replication.factor=3",
                "listeners=PLAINTEXT://10.211.0.12:9092,CONTROLLER://10.211.0.12:9093",
                "log.dirs=/w/n2/data",
                "min.insync.replicas=2",
                "node.id=2",
                "num.partitions=1",
                "process.roles=broker,controller",
                "replica.lag.time.max.ms=3000",
                "unclean.leader.election.enable=false",
            ]
        );
    }

    #[test]
    fn overrides_and_optional_settings_win() {
        let cluster = [node(1)];
        let mut config = BrokerConfig::for_replication(1);
        config.log_segment_bytes = Some(4096);
        config.unclean_leader_election = true;
        config
            .overrides
            .insert("min.insync.replicas".into(), "5".into());
        let props = render_properties(&config, &cluster[0], &cluster, Path::new("/d"));
        assert!(props.contains("\nlog.segment.bytes=4096\n"));
        assert!(props.contains("\nunclean.leader.election.enable=true\n"));
        assert!(props.contains("\nmin.insync.replicas=5\n"));
        assert!(props.contains("\ndefault.replication.factor=1\n"));
        assert!(!props.contains("log.flush.interval.messages"));
    }

    /// `alive` of a pid, asked in a shell as the commands ask it.
    fn alive(pid: u32) -> bool {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("{ALIVE}; alive {pid} && echo yes || echo no"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    }

    #[test]
    fn alive_means_some_thread_runs() {
        assert!(alive(std::process::id()));
        let mut exited = std::process::Command::new("true").spawn().unwrap();
        let pid = exited.id();
        // Exited and not yet reaped: a zombie.
        while std::fs::read_to_string(format!("/proc/{pid}/status"))
            .is_ok_and(|s| !s.contains("State:\tZ"))
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!alive(pid));
        exited.wait().unwrap();
        assert!(!alive(pid));
    }

    #[test]
    fn start_command_passes_injected_bugs_escaped() {
        let broker = TidemarkBroker::new(
            "/x".into(),
            BrokerConfig::for_replication(1),
            vec!["hw-truncation".into(), "a b".into()],
        );
        let cmd = broker.start_command(&node(1));
        assert!(
            cmd.contains("/w/n1/bin/tidemark-broker /w/n1/server.properties --inject-bug hw-truncation --inject-bug 'a b'"),
            "{cmd}"
        );
        assert!(cmd.contains("echo $! > /w/n1/broker.pid"), "{cmd}");
        assert!(!cmd.contains("LD_PRELOAD"), "{cmd}");
    }

    #[test]
    fn under_faketime_the_start_command_preloads_it_with_a_per_node_offset_file() {
        let broker = TidemarkBroker::new("/x".into(), BrokerConfig::for_replication(1), vec![])
            .with_faketime("/lib/libfaketime.so.1".into());
        let cmd = broker.start_command(&node(2));
        assert!(
            cmd.contains("[ -f /w/n2/faketime ] || printf +0 > /w/n2/faketime; "),
            "{cmd}"
        );
        assert!(
            cmd.contains(
                "nohup env LD_PRELOAD=/lib/libfaketime.so.1 FAKETIME_TIMESTAMP_FILE=/w/n2/faketime \
                 FAKETIME_NO_CACHE=1 DONT_FAKE_MONOTONIC=1 setsid /w/n2/bin/tidemark-broker"
            ),
            "{cmd}"
        );
        assert_eq!(
            broker.as_fake_clock().unwrap().offset_file(&node(2)),
            PathBuf::from("/w/n2/faketime")
        );
    }

    #[test]
    fn with_powerfs_the_data_directory_is_a_mount_over_data_disk_and_needs_fuse() {
        use crate::prerequisites::Need;
        let plain = TidemarkBroker::new("/x".into(), BrokerConfig::for_replication(1), vec![]);
        assert!(plain.as_power_loss().is_none());
        assert!(!plain
            .requirements()
            .iter()
            .any(|r| r.need == Need::Program("fusermount3")));
        let broker = plain.with_powerfs("/p".into());
        assert!(broker.as_power_loss().is_some());
        let reqs = broker.requirements();
        assert!(reqs
            .iter()
            .any(|r| r.need == Need::Program("fusermount3") && r.package == "fuse3"));
        assert!(reqs
            .iter()
            .any(|r| r.need == Need::Device("/dev/fuse".into())));
        let mount = TidemarkBroker::mount_command(&node(1));
        assert!(
            mount.contains(
                "/w/n1/bin/tidemark-powerfs mount --backing /w/n1/data.disk \
                 --mountpoint /w/n1/data --control /w/n1/powerfs.sock"
            ),
            "{mount}"
        );
        let lazy = TidemarkBroker::unmount_command(&node(1), true);
        assert!(lazy.contains("fusermount3 -u -z"), "{lazy}");
        assert!(!lazy.contains("unmount --control"), "{lazy}");
        let clean = TidemarkBroker::unmount_command(&node(1), false);
        assert!(
            clean.contains("/w/n1/bin/tidemark-powerfs unmount --control /w/n1/powerfs.sock"),
            "{clean}"
        );
        assert_eq!(
            broker.describe()["powerfs"],
            serde_json::json!("/p"),
            "test.json records the filesystem"
        );
    }
}
