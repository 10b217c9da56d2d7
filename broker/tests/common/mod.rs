//! Starting and stopping a real `tidemark-broker` process for integration tests, and a minimal
//! raw Kafka request helper.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use kafka_protocol::messages::{ApiKey, RequestHeader};
use kafka_protocol::protocol::{Encodable, StrBytes};

/// The Python that `scripts/setup-host` installs the client libraries into
/// (scripts/python-requirements.txt).
pub const PYTHON: &str = "/var/lib/tidemark/python-venv/bin/python";

/// Where the ports tests hand out lie: below the kernel's ephemeral range (32768 and up by
/// default). A port the kernel picked for a listener, freed and handed to a broker, could be
/// taken by any outgoing connection before the broker binds it ("Address already in use");
/// one below that range can only be taken by another listener.
const PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A free port, never the same twice in one test process (each process starts at its own place
/// in [`PORTS`], so test binaries run one after another rarely meet either).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static HANDED_OUT: AtomicU16 = AtomicU16::new(0);
    let span = PORTS.end - PORTS.start;
    let first = (std::process::id() % u32::from(span)) as u16;
    loop {
        let n = HANDED_OUT.fetch_add(1, Ordering::Relaxed);
        let port = PORTS.start + (first + n % span) % span;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// `n` distinct free ports.
pub fn free_ports(n: usize) -> Vec<u16> {
    (0..n).map(|_| free_port()).collect()
}

/// A broker process on loopback with its own data directory.
pub struct BrokerProc {
    child: Option<Child>,
    paused: bool,
    pub dir: tempfile::TempDir,
    pub port: u16,
    args: Vec<String>,
    /// The broker executable: this build's, unless a benchmark compares another.
    binary: PathBuf,
    /// Environment variables the process gets besides the test's (an S3 store's credentials).
    pub env: Vec<(String, String)>,
    /// A dedicated controller: `port` is its controller listener, which speaks no Kafka.
    controller_only: bool,
}

impl BrokerProc {
    /// Starts a standalone broker with `extra` arguments (e.g. `--override k=v`) and waits until
    /// it serves.
    pub fn start(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let props = format!(
            "node.id=1\nprocess.roles=broker,controller\nlisteners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{}\ncontroller.listener.names=CONTROLLER\nlog.dirs={}\nnum.partitions=1\n",
            free_port(),
            dir.path().join("data").display()
        );
        let mut b = BrokerProc::prepare(dir, port, &props, extra);
        b.spawn();
        b
    }

    /// Writes `props` as the server.properties of a broker in `dir` without starting it.
    pub fn prepare(dir: tempfile::TempDir, port: u16, props: &str, extra: &[&str]) -> Self {
        let path = dir.path().join("server.properties");
        std::fs::write(&path, props).unwrap();
        let mut args = vec![path.display().to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        BrokerProc {
            child: None,
            paused: false,
            dir,
            port,
            args,
            binary: PathBuf::from(env!("CARGO_BIN_EXE_tidemark-broker")),
            env: Vec::new(),
            controller_only: false,
        }
    }

    /// Starts the process without waiting for it to serve.
    pub fn launch(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("broker.log"))
            .unwrap();
        let child = Command::new(&self.binary)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start tidemark-broker");
        self.child = Some(child);
    }

    /// Waits up to `within` for the process to exit by itself; its status, or `None` if it
    /// still runs.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            let status = self.child.as_mut()?.try_wait().unwrap();
            if let Some(status) = status {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn spawn(&mut self) {
        self.launch();
        if self.controller_only {
            wait_listening(self.port, self);
        } else {
            wait_ready(self.port, self);
        }
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
    }

    /// SIGKILL, as a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .unwrap();
            let status = c.wait().unwrap();
            assert!(
                status.success(),
                "broker exited with {status} on SIGTERM\n{}",
                self.log()
            );
        }
    }

    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop the broker first");
        self.spawn();
    }

    /// SIGSTOP: the process stays but does nothing (a GC pause, a hung VM). Returns once every
    /// thread has stopped: the signal only starts the stop, and a thread still running (or in a
    /// disk write) could fetch what the test writes next.
    pub fn pause(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
        self.paused = true;
        let tasks = format!("/proc/{}/task", self.pid().expect("broker running"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !all_threads_stopped(&tasks) {
            assert!(Instant::now() < deadline, "{tasks}: not stopped after 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn resume(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
        self.paused = false;
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = self.pid().expect("broker running");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig).unwrap();
    }

    pub fn is_stopped(&self) -> bool {
        self.child.is_none()
    }
}

/// Whether every thread under `/proc/PID/task` is in the stopped state (`T`).
fn all_threads_stopped(tasks: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(tasks) else {
        return false;
    };
    entries.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command name, which is in parentheses and may hold spaces.
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        })
    })
}

impl Drop for BrokerProc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_ready(port: u16, b: &mut BrokerProc) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            if api_versions_roundtrip(&mut s).is_ok() {
                return;
            }
        }
        assert!(b.is_running(), "broker exited during start\n{}", b.log());
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("broker did not serve within 20 s\n{}", b.log());
}

/// Waits until something accepts connections on `port` (a controller listener).
fn wait_listening(port: u16, b: &mut BrokerProc) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        assert!(
            b.is_running(),
            "controller exited during start\n{}",
            b.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("controller did not listen within 20 s\n{}", b.log());
}

/// Encodes a request frame (with its length prefix).
pub fn frame<T: Encodable>(key: ApiKey, version: i16, correlation_id: i32, body: &T) -> Vec<u8> {
    let mut buf = BytesMut::new();
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("tidemark-test")));
    header
        .encode(&mut buf, key.request_header_version(version))
        .unwrap();
    body.encode(&mut buf, version).unwrap();
    let mut out = (buf.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&buf);
    out
}

/// Reads one response frame body (correlation id first).
pub fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body)?;
    Ok(body)
}

/// Sends ApiVersions v0 and checks the answer carries our correlation id and error code 0.
pub fn api_versions_roundtrip(s: &mut TcpStream) -> std::io::Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let req = kafka_protocol::messages::ApiVersionsRequest::default();
    s.write_all(&frame(ApiKey::ApiVersions, 0, 77, &req))?;
    let body = read_frame(s)?;
    let ok = body.len() >= 6 && body[..4] == 77i32.to_be_bytes() && body[4..6] == [0, 0];
    if ok {
        Ok(())
    } else {
        Err(std::io::Error::other("bad ApiVersions answer"))
    }
}

/// Runs kcat with `args`, feeding `stdin`, and returns stdout; fails the test on a non-zero exit.
pub fn kcat(args: &[&str], stdin: &[u8]) -> Vec<u8> {
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat must be installed (apt-get install kcat)");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(
        out.status.success(),
        "kcat {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A cluster on loopback: brokers in combined mode (each a broker and a controller voter), or
/// dedicated controllers (the first `controllers` nodes) beside broker-only nodes.
pub struct Cluster {
    pub nodes: Vec<BrokerProc>,
    controllers: usize,
}

/// Settings that make failure detection quick enough for tests.
pub const FAST_FAILOVER: &str = "broker.heartbeat.interval.ms=200\nbroker.session.timeout.ms=2000\nreplica.lag.time.max.ms=3000\n";

impl Cluster {
    /// Starts `n` brokers with `props` appended to each server.properties and waits until every
    /// one serves and all are registered.
    pub fn start(n: usize, props: &str, extra: &[&str]) -> Cluster {
        Cluster::start_binary(None, n, props, extra)
    }

    /// [`Cluster::start`] with `env` added to every broker's environment.
    pub fn start_env(n: usize, props: &str, extra: &[&str], env: &[(&str, &str)]) -> Cluster {
        Cluster::start_nodes(None, n, props, extra, env)
    }

    /// [`Cluster::start`] with another broker executable (a benchmark's baseline build).
    pub fn start_binary(
        binary: Option<&std::path::Path>,
        n: usize,
        props: &str,
        extra: &[&str],
    ) -> Cluster {
        Cluster::start_nodes(binary, n, props, extra, &[])
    }

    fn start_nodes(
        binary: Option<&std::path::Path>,
        n: usize,
        props: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Cluster {
        // `props` replaces FAST_FAILOVER's keys: a key set twice in one file is refused.
        let keys: Vec<&str> = props.lines().filter_map(|l| l.split('=').next()).collect();
        let defaults: String = FAST_FAILOVER
            .lines()
            .filter(|l| !keys.contains(&l.split('=').next().unwrap_or_default()))
            .map(|l| format!("{l}\n"))
            .collect();
        let mut distinct = free_ports(2 * n).into_iter();
        let ports: Vec<(u16, u16)> = (0..n)
            .map(|_| (distinct.next().unwrap(), distinct.next().unwrap()))
            .collect();
        let voters: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, c))| format!("{}@127.0.0.1:{c}", i + 1))
            .collect();
        let mut nodes: Vec<BrokerProc> = ports
            .iter()
            .enumerate()
            .map(|(i, (p, c))| {
                let dir = tempfile::tempdir().unwrap();
                let text = format!(
                    "node.id={}\nprocess.roles=broker,controller\nlisteners=PLAINTEXT://127.0.0.1:{p},CONTROLLER://127.0.0.1:{c}\ncontroller.listener.names=CONTROLLER\ncontroller.quorum.voters={}\nlog.dirs={}\n{defaults}{props}",
                    i + 1,
                    voters.join(","),
                    dir.path().join("data").display()
                );
                let mut node = BrokerProc::prepare(dir, *p, &text, extra);
                if let Some(b) = binary {
                    node.binary = b.to_path_buf();
                }
                node.env = env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                node
            })
            .collect();
        for n in nodes.iter_mut() {
            n.launch();
        }
        for n in nodes.iter_mut() {
            wait_ready(n.port, n);
        }
        let c = Cluster {
            nodes,
            controllers: 0,
        };
        c.wait_for("all brokers registered", Duration::from_secs(30), |c| {
            c.describe(None)
                .is_some_and(|d| d["brokers"].as_array().is_some_and(|b| b.len() == n))
        });
        c
    }

    /// `controllers` dedicated controller voters (node ids 1 to `controllers`) and `brokers`
    /// broker-only nodes after them, with `props` appended to each server.properties; waits
    /// until every broker serves and is registered.
    pub fn start_dedicated(controllers: usize, brokers: usize, props: &str) -> Cluster {
        let mut ports = free_ports(controllers + brokers).into_iter();
        let voter_ports: Vec<u16> = ports.by_ref().take(controllers).collect();
        let voters: Vec<String> = voter_ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}@127.0.0.1:{p}", i + 1))
            .collect();
        let ports: Vec<u16> = voter_ports.iter().copied().chain(ports).collect();
        let mut nodes: Vec<BrokerProc> = ports
            .iter()
            .enumerate()
            .map(|(i, port)| {
                let dir = tempfile::tempdir().unwrap();
                let controller = i < controllers;
                let (roles, listener) = if controller {
                    ("controller", "CONTROLLER")
                } else {
                    ("broker", "PLAINTEXT")
                };
                let text = format!(
                    "node.id={}\nprocess.roles={roles}\nlisteners={listener}://127.0.0.1:{port}\ncontroller.listener.names=CONTROLLER\ncontroller.quorum.voters={}\nlog.dirs={}\n{FAST_FAILOVER}{props}",
                    i + 1,
                    voters.join(","),
                    dir.path().join("data").display()
                );
                let mut node = BrokerProc::prepare(dir, *port, &text, &[]);
                node.controller_only = controller;
                node
            })
            .collect();
        for n in nodes.iter_mut() {
            n.launch();
        }
        for n in nodes.iter_mut() {
            if n.controller_only {
                wait_listening(n.port, n);
            } else {
                wait_ready(n.port, n);
            }
        }
        let c = Cluster { nodes, controllers };
        c.wait_for("all brokers registered", Duration::from_secs(30), |c| {
            c.describe(None)
                .is_some_and(|d| d["brokers"].as_array().is_some_and(|b| b.len() == brokers))
        });
        c
    }

    /// Node `id` (1-based).
    pub fn node(&mut self, id: i32) -> &mut BrokerProc {
        &mut self.nodes[id as usize - 1]
    }

    /// Bootstrap addresses of the running, unpaused brokers.
    pub fn running(&self) -> Vec<String> {
        self.nodes
            .iter()
            .skip(self.controllers)
            .filter(|n| !n.is_stopped() && !n.paused)
            .map(|n| n.bootstrap())
            .collect()
    }

    pub fn addr(&self, id: i32) -> String {
        self.nodes[id as usize - 1].bootstrap()
    }

    /// Metadata as `admin describe` prints it, from the first running node that answers.
    pub fn describe(&self, topic: Option<&str>) -> Option<serde_json::Value> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for addr in self.running() {
            if let Ok(v) = rt.block_on(tidemark_broker::admin::describe(&addr, topic)) {
                return Some(v);
            }
        }
        None
    }

    /// The metadata quorum as `admin describe-quorum` prints it, from the first running broker
    /// that answers with a leader.
    pub fn describe_quorum(&self) -> Option<serde_json::Value> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        self.running().iter().find_map(|addr| {
            match rt.block_on(tidemark_broker::admin::describe_quorum(addr)) {
                Ok((v, true)) => Some(v),
                _ => None,
            }
        })
    }

    /// (leader, leader epoch, isr) of a partition as some running node sees it.
    pub fn partition_state(&self, topic: &str, partition: i32) -> Option<(i32, i32, Vec<i64>)> {
        Self::partition_of(self.describe(Some(topic))?, partition)
    }

    /// Metadata as node `id` sees it.
    pub fn describe_at(&self, id: i32, topic: Option<&str>) -> Option<serde_json::Value> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(tidemark_broker::admin::describe(&self.addr(id), topic))
            .ok()
    }

    /// (leader, leader epoch, isr) of a partition as node `id` sees it.
    pub fn partition_state_at(
        &self,
        id: i32,
        topic: &str,
        partition: i32,
    ) -> Option<(i32, i32, Vec<i64>)> {
        Self::partition_of(self.describe_at(id, Some(topic))?, partition)
    }

    fn partition_of(d: serde_json::Value, partition: i32) -> Option<(i32, i32, Vec<i64>)> {
        let p = d["partitions"]
            .as_array()?
            .iter()
            .find(|p| p["partition"] == partition)?
            .clone();
        let isr = p["isr"]
            .as_array()?
            .iter()
            .filter_map(|v| v.as_i64())
            .collect();
        Some((
            p["leader"].as_i64()? as i32,
            p["leader_epoch"].as_i64()? as i32,
            isr,
        ))
    }

    /// ElectLeaders UNCLEAN for `topic`-`partition` through `tidemark-broker admin` at node
    /// `via`; fails the test unless the request succeeded.
    pub fn elect_unclean(&self, via: i32, topic: &str, partition: i32) {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tidemark-broker"))
            .args([
                "admin",
                "elect-leaders",
                "--bootstrap-server",
                &self.addr(via),
            ])
            .args([
                "--topic",
                topic,
                "--partition",
                &partition.to_string(),
                "--unclean",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "elect-leaders: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    /// Polls `cond` until it holds or `within` passes (then fails the test with `what`).
    pub fn wait_for(&self, what: &str, within: Duration, cond: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if cond(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Ok(dir) = std::env::var("TIDEMARK_TEST_KEEP_LOGS") {
            for (i, n) in self.nodes.iter().enumerate() {
                let _ = std::fs::write(format!("{dir}/node{}.log", i + 1), n.log());
            }
        }
        let logs: Vec<String> = self.nodes.iter().map(|n| n.log()).collect();
        let tail: Vec<String> = logs
            .iter()
            .map(|l| l.lines().rev().take(15).collect::<Vec<_>>().join("\n"))
            .collect();
        panic!(
            "timed out waiting for {what}\n--- last log lines per node (newest first) ---\n{}",
            tail.join("\n---\n")
        );
    }

    /// The records (offset, value) node `id` holds of partition 0 of `topic`, as `dump-log`
    /// reads them; none when it has no replica.
    pub fn dumped_records(&self, id: i32, topic: &str) -> Vec<(i64, i64)> {
        self.dump(id)
            .into_iter()
            .find(|r| r["topic"] == topic && r["partition"] == 0)
            .map(|r| {
                r["records"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| (x[0].as_i64().unwrap(), x[1].as_i64().unwrap()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every replica of every partition on node `id`, read from its data dir.
    pub fn dump(&self, id: i32) -> Vec<serde_json::Value> {
        let opts = tidemark_broker::dump::DumpOptions {
            data_dir: self.nodes[id as usize - 1].data_dir(),
            ..Default::default()
        };
        let mut out = Vec::new();
        tidemark_broker::dump::dump(&opts, &mut out).unwrap();
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// A test client: produce and read over one connection per call, reporting raw error codes.
pub mod client {
    use std::time::Duration;

    use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{
        CreateTopicsRequest, FetchRequest, InitProducerIdRequest, ProduceRequest, TopicName,
        TransactionalId,
    };
    use kafka_protocol::protocol::StrBytes;
    use tidemark_broker::replica::client::KafkaConnection;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    fn name(t: &str) -> TopicName {
        TopicName(StrBytes::from_string(t.to_string()))
    }

    /// Creates a topic; returns the error code (0 on success).
    pub fn create_topic(
        addr: &str,
        topic: &str,
        partitions: i32,
        rf: i16,
        configs: &[(&str, &str)],
    ) -> i16 {
        create_topic_assigned(addr, topic, partitions, rf, &[], configs)
    }

    /// Creates a topic with the given replicas per partition (leader first).
    pub fn create_topic_assigned(
        addr: &str,
        topic: &str,
        partitions: i32,
        rf: i16,
        assignments: &[&[i32]],
        configs: &[(&str, &str)],
    ) -> i16 {
        use kafka_protocol::messages::create_topics_request::CreatableReplicaAssignment;
        use kafka_protocol::messages::BrokerId;
        let (partitions, rf) = if assignments.is_empty() {
            (partitions, rf)
        } else {
            (-1, -1)
        };
        let assignments: Vec<CreatableReplicaAssignment> = assignments
            .iter()
            .enumerate()
            .map(|(i, set)| {
                CreatableReplicaAssignment::default()
                    .with_partition_index(i as i32)
                    .with_broker_ids(set.iter().map(|b| BrokerId(*b)).collect())
            })
            .collect();
        rt().block_on(async {
            let mut c = KafkaConnection::connect(addr, Duration::from_secs(15), "test")
                .await
                .unwrap();
            let req = CreateTopicsRequest::default()
                .with_timeout_ms(15_000)
                .with_topics(vec![CreatableTopic::default()
                    .with_name(name(topic))
                    .with_num_partitions(partitions)
                    .with_replication_factor(rf)
                    .with_assignments(assignments)
                    .with_configs(
                        configs
                            .iter()
                            .map(|(k, v)| {
                                CreatableTopicConfig::default()
                                    .with_name(StrBytes::from_string(k.to_string()))
                                    .with_value(Some(StrBytes::from_string(v.to_string())))
                            })
                            .collect(),
                    )]);
            let resp = c.call(5, &req).await.unwrap();
            resp.topics[0].error_code
        })
    }

    /// Produces one batch of decimal values; Ok(base offset) or Err(error code, or -100 for a
    /// transport failure or timeout).
    pub fn produce(
        addr: &str,
        topic: &str,
        partition: i32,
        values: &[i64],
        acks: i16,
        timeout: Duration,
    ) -> Result<i64, i16> {
        let vals: Vec<Vec<u8>> = values.iter().map(|v| v.to_string().into_bytes()).collect();
        let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
        let batch = tidemark_broker::log::testing::batch(&refs);
        produce_records(addr, topic, partition, batch, acks, timeout)
    }

    /// InitProducerId at v4 (flexible): `(error code, producer id, epoch)`.
    pub fn init_producer_id(addr: &str, transactional_id: Option<&str>) -> (i16, i64, i16) {
        rt().block_on(async {
            let mut c = KafkaConnection::connect(addr, Duration::from_secs(10), "test")
                .await
                .unwrap();
            let req = InitProducerIdRequest::default()
                .with_transactional_id(
                    transactional_id.map(|t| TransactionalId(StrBytes::from_string(t.into()))),
                )
                .with_transaction_timeout_ms(60_000);
            let resp = c.call(4, &req).await.unwrap();
            (resp.error_code, resp.producer_id.0, resp.producer_epoch)
        })
    }

    /// Produces one idempotent batch of decimal values to partition 0 with acks=all; results
    /// as for [`produce`].
    pub fn produce_idempotent(
        addr: &str,
        topic: &str,
        (pid, epoch, seq): (i64, i16, i32),
        values: &[i64],
        timeout: Duration,
    ) -> Result<i64, i16> {
        let vals: Vec<Vec<u8>> = values.iter().map(|v| v.to_string().into_bytes()).collect();
        let refs: Vec<&[u8]> = vals.iter().map(|v| v.as_slice()).collect();
        let batch = tidemark_broker::log::testing::idempotent_batch(&refs, pid, epoch, seq);
        produce_records(addr, topic, 0, batch, -1, timeout)
    }

    /// Produces raw record batch bytes; results as for [`produce`].
    pub fn produce_records(
        addr: &str,
        topic: &str,
        partition: i32,
        batch: Vec<u8>,
        acks: i16,
        timeout: Duration,
    ) -> Result<i64, i16> {
        rt().block_on(async {
            let mut c = KafkaConnection::connect(addr, timeout, "test")
                .await
                .map_err(|_| -100i16)?;
            let req = ProduceRequest::default()
                .with_acks(acks)
                .with_timeout_ms(timeout.as_millis() as i32)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(name(topic))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(batch.into()))])]);
            let resp = c
                .call_with_timeout(9, &req, timeout + Duration::from_secs(1))
                .await
                .map_err(|_| -100i16)?;
            let p = &resp.responses[0].partition_responses[0];
            if p.error_code == 0 {
                Ok(p.base_offset)
            } else {
                Err(p.error_code)
            }
        })
    }

    /// A producer that keeps one connection to one broker, reconnecting after any failure, for
    /// tests that write as fast as a broker answers (e.g. from the moment it starts).
    pub struct Producer {
        rt: tokio::runtime::Runtime,
        addr: String,
        conn: Option<KafkaConnection>,
    }

    impl Producer {
        pub fn new(addr: &str) -> Self {
            Producer {
                rt: rt(),
                addr: addr.to_string(),
                conn: None,
            }
        }

        /// Sends one single-value batch; Ok(offset), Err(error code), or Err(-100) when the
        /// broker could not be reached or did not answer.
        pub fn send(
            &mut self,
            topic: &str,
            partition: i32,
            value: i64,
            acks: i16,
        ) -> Result<i64, i16> {
            let timeout = Duration::from_secs(2);
            let rt = &self.rt;
            let conn = match self.conn.as_mut() {
                Some(c) => c,
                None => {
                    let c = rt
                        .block_on(KafkaConnection::connect(&self.addr, timeout, "test"))
                        .map_err(|_| -100i16)?;
                    self.conn.insert(c)
                }
            };
            let v = value.to_string();
            let batch = tidemark_broker::log::testing::batch(&[v.as_bytes()]);
            let req = ProduceRequest::default()
                .with_acks(acks)
                .with_timeout_ms(timeout.as_millis() as i32)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(name(topic))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(partition)
                        .with_records(Some(batch.into()))])]);
            match rt.block_on(conn.call(9, &req)) {
                Ok(resp) => {
                    let p = &resp.responses[0].partition_responses[0];
                    if p.error_code == 0 {
                        Ok(p.base_offset)
                    } else {
                        Err(p.error_code)
                    }
                }
                Err(_) => {
                    self.conn = None;
                    Err(-100)
                }
            }
        }
    }

    /// A consumer's fetch of one partition from `offset`, up to `max_bytes`.
    fn consumer_fetch(topic: &str, partition: i32, offset: i64, max_bytes: i32) -> FetchRequest {
        FetchRequest::default()
            .with_replica_id(kafka_protocol::messages::BrokerId(-1))
            .with_max_bytes(max_bytes)
            .with_topics(vec![FetchTopic::default()
                .with_topic(name(topic))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(max_bytes)])])
    }

    /// A consumer's long poll of `partition` at `offset`, waiting up to `max_wait` for a byte:
    /// the partition's error code (-100 when the connection fails).
    pub fn long_poll(
        addr: &str,
        topic: &str,
        partition: i32,
        offset: i64,
        max_wait: Duration,
    ) -> i16 {
        rt().block_on(async {
            let Ok(mut c) =
                KafkaConnection::connect(addr, max_wait + Duration::from_secs(5), "test").await
            else {
                return -100;
            };
            let req = consumer_fetch(topic, partition, offset, 1 << 20)
                .with_max_wait_ms(max_wait.as_millis() as i32)
                .with_min_bytes(1);
            match c.call(11, &req).await {
                Ok(resp) => resp.responses[0].partitions[0].error_code,
                Err(_) => -100,
            }
        })
    }

    /// A record as read back: offset, value, leader epoch.
    pub type Stored = (i64, i64, i32);

    /// Reads everything below the high watermark: `(offset, value, leader epoch)` and the HW.
    pub fn read_all(addr: &str, topic: &str, partition: i32) -> Result<(Vec<Stored>, i64), i16> {
        rt().block_on(async {
            let mut c = KafkaConnection::connect(addr, Duration::from_secs(5), "test")
                .await
                .map_err(|_| -100i16)?;
            let mut out = Vec::new();
            let mut offset = 0;
            loop {
                let req = consumer_fetch(topic, partition, offset, 1 << 24).with_max_wait_ms(0);
                let resp = c.call(11, &req).await.map_err(|_| -100i16)?;
                let pd = &resp.responses[0].partitions[0];
                if pd.error_code != 0 {
                    return Err(pd.error_code);
                }
                let bytes = pd.records.clone().unwrap_or_default();
                if bytes.is_empty() {
                    return Ok((out, pd.high_watermark));
                }
                // Control batches (a failover's barrier) are skipped, as consumers skip them,
                // but move the next fetch past them.
                let next = tidemark_broker::log::testing::next_offset(&bytes);
                for (o, v, e) in tidemark_broker::log::testing::values(&bytes) {
                    if o >= offset {
                        out.push((o, String::from_utf8(v).unwrap().parse().unwrap(), e));
                    }
                }
                offset = offset.max(next);
            }
        })
    }
}
