//! The raft metadata quorum over real TCP on loopback: elections, forwarding from followers,
//! failover, restarts from disk, heartbeats, and bounded failure without a majority. Every wait
//! polls against a generous deadline, so a slow machine makes the tests slower, not flaky.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_broker::config::Voter;
use tidemark_broker::controller::raft::{QuorumConfig, RaftQuorum};
use tidemark_broker::controller::{
    apply, ControllerCommand, ControllerReply, MetadataQuorum, QuorumError,
};
use tidemark_broker::errors;
use tidemark_broker::metadata::{BrokerEndpoint, ClusterDefaults, MetadataImage};

/// Long enough for elections and catch-up on a loaded two-core machine.
const PATIENCE: Duration = Duration::from_secs(30);

fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Voters on loopback with their own directories; nodes are started and stopped by index.
struct Cluster {
    _dir: tempfile::TempDir,
    configs: Vec<QuorumConfig>,
    nodes: Vec<Option<Arc<RaftQuorum>>>,
}

impl Cluster {
    fn new(n: usize, tune: impl Fn(&mut QuorumConfig)) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let voters: Vec<Voter> = ports
            .iter()
            .enumerate()
            .map(|(i, port)| Voter {
                id: i as i32 + 1,
                host: "127.0.0.1".to_string(),
                port: *port,
            })
            .collect();
        let configs = voters
            .iter()
            .map(|v| {
                let listen: SocketAddr = format!("127.0.0.1:{}", v.port).parse().unwrap();
                let mut cfg = QuorumConfig::new(
                    v.id,
                    voters.clone(),
                    listen,
                    dir.path().join(format!("node-{}", v.id)),
                );
                tune(&mut cfg);
                cfg
            })
            .collect();
        Cluster {
            _dir: dir,
            configs,
            nodes: vec![None; n],
        }
    }

    async fn start(&mut self, i: usize) {
        let q = RaftQuorum::start(self.configs[i].clone())
            .await
            .unwrap_or_else(|e| panic!("starting node {}: {e:#}", i + 1));
        self.nodes[i] = Some(q);
    }

    async fn start_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.start(i).await;
        }
    }

    async fn stop(&mut self, i: usize) {
        if let Some(q) = self.nodes[i].take() {
            q.shutdown().await;
        }
    }

    async fn stop_all(&mut self) {
        for i in 0..self.nodes.len() {
            self.stop(i).await;
        }
    }

    fn node(&self, i: usize) -> &Arc<RaftQuorum> {
        self.nodes[i].as_ref().expect("node is running")
    }

    fn running(&self) -> impl Iterator<Item = (usize, &Arc<RaftQuorum>)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| n.as_ref().map(|n| (i, n)))
    }

    /// Waits until exactly one running node is active and every running node names it leader.
    async fn leader(&self) -> usize {
        wait_for("a leader all running nodes agree on", || {
            let active: Vec<usize> = self
                .running()
                .filter(|(_, n)| n.is_active())
                .map(|(i, _)| i)
                .collect();
            match active[..] {
                [l] if self
                    .running()
                    .all(|(_, n)| n.leader() == Some(l as i32 + 1)) =>
                {
                    Some(l)
                }
                _ => None,
            }
        })
        .await
    }

    /// Some running node that is not `leader`.
    fn follower(&self, leader: usize) -> usize {
        self.running()
            .map(|(i, _)| i)
            .find(|i| *i != leader)
            .expect("a running follower")
    }

    /// Waits until every running node has applied exactly `image`.
    async fn converged(&self, image: &MetadataImage) {
        wait_for("every running node to apply the expected image", || {
            self.running()
                .all(|(_, n)| *n.image().borrow().as_ref() == *image)
                .then_some(())
        })
        .await
    }
}

async fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn register(id: i32) -> ControllerCommand {
    ControllerCommand::RegisterBroker {
        endpoint: BrokerEndpoint {
            id,
            host: "127.0.0.1".to_string(),
            port: 9000 + id as u16,
            incarnation: 1000 + id as u64,
            fenced: false,
            shutting_down: false,
            directory_id: None,
        },
        defaults: ClusterDefaults {
            unclean_leader_election_enable: false,
            min_insync_replicas: 1,
            eligible_leader_replicas: true,
        },
        unclean_shutdown: false,
    }
}

fn create_topic(name: &str, partitions: i32, rf: i16) -> ControllerCommand {
    ControllerCommand::CreateTopic {
        name: name.to_string(),
        id: uuid::Uuid::new_v4(),
        partitions,
        replication_factor: rf,
        configs: BTreeMap::new(),
        validate_only: false,
        assignments: Vec::new(),
        mirror: None,
    }
}

fn bump(topic: &str, partition: i32) -> ControllerCommand {
    ControllerCommand::BumpLeaderEpoch {
        topic: topic.to_string(),
        partition,
        min_epoch: -1,
    }
}

/// Submits `cmd` through `node`, checks the reply is the one `apply` gives on `expected`, and
/// advances `expected`.
async fn submit_checked(
    node: &RaftQuorum,
    expected: &mut MetadataImage,
    cmd: ControllerCommand,
) -> ControllerReply {
    let reply = node
        .submit(cmd.clone())
        .await
        .unwrap_or_else(|e| panic!("submit {cmd:?}: {e}"));
    assert_eq!(reply, apply(expected, &cmd), "reply to {cmd:?}");
    reply
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_voters_elect_a_leader_and_apply_commands_from_followers() {
    init_tracing();
    let mut cluster = Cluster::new(3, |_| {});
    let started = Instant::now();
    cluster.start_all().await;
    let leader = cluster.leader().await;
    eprintln!(
        "three voters: leader elected {:?} after start",
        started.elapsed()
    );

    let follower = cluster.follower(leader);
    let f = cluster.node(follower);
    assert!(!f.is_active());
    let mut expected = MetadataImage::default();
    submit_checked(f, &mut expected, register(1)).await;
    submit_checked(f, &mut expected, register(2)).await;
    let reply = submit_checked(f, &mut expected, create_topic("orders", 3, 2)).await;
    assert!(matches!(reply, ControllerReply::Topic(ref t) if t.partitions.len() == 3));
    let dup = submit_checked(f, &mut expected, create_topic("orders", 1, 1)).await;
    assert!(
        matches!(dup, ControllerReply::Error { code, .. } if code == errors::TOPIC_ALREADY_EXISTS),
        "{dup:?}"
    );
    // The leader's own submits take the local path.
    submit_checked(cluster.node(leader), &mut expected, bump("orders", 1)).await;

    cluster.converged(&expected).await;
    assert_eq!(
        cluster.node(follower).image().borrow().topics["orders"].partitions[1].leader_epoch,
        1
    );
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_and_a_restarted_node_catches_up() {
    init_tracing();
    // Frequent snapshots, so the restarted node has to be sent one: its log is purged meanwhile.
    let mut cluster = Cluster::new(3, |c| c.snapshot_every = 5);
    cluster.start_all().await;
    let old = cluster.leader().await;
    let mut expected = MetadataImage::default();
    submit_checked(cluster.node(old), &mut expected, register(1)).await;
    submit_checked(cluster.node(old), &mut expected, create_topic("a", 2, 1)).await;

    let stopped = Instant::now();
    cluster.stop(old).await;
    let new = cluster.leader().await;
    eprintln!(
        "failover: node {} leads {:?} after node {} stopped",
        new + 1,
        stopped.elapsed(),
        old + 1
    );
    assert_ne!(new, old);

    let follower = cluster.follower(new);
    for i in 0..8 {
        let via = if i % 2 == 0 { new } else { follower };
        submit_checked(cluster.node(via), &mut expected, bump("a", i % 2)).await;
    }
    submit_checked(
        cluster.node(follower),
        &mut expected,
        create_topic("b", 1, 1),
    )
    .await;
    cluster.converged(&expected).await;

    let restarted = Instant::now();
    cluster.start(old).await;
    cluster.converged(&expected).await;
    eprintln!(
        "restart: node {} caught up in {:?}",
        old + 1,
        restarted.elapsed()
    );

    // The restarted node takes part again: submits through it still work.
    submit_checked(cluster.node(old), &mut expected, bump("b", 0)).await;
    cluster.converged(&expected).await;
    cluster.stop_all().await;
}

/// The index of a log id stored in `file` under a node's directory (the test peeks at the store).
fn stored_index(dir: &std::path::Path, file: &str) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join(file)).ok()?;
    let last = text.lines().last()?;
    let v: serde_json::Value = serde_json::from_str(last).ok()?;
    v.get("log_id").unwrap_or(&v).get("index")?.as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_the_purged_log_is_sent_a_snapshot() {
    init_tracing();
    let mut cluster = Cluster::new(3, |c| c.snapshot_every = 3);
    cluster.start_all().await;
    let leader = cluster.leader().await;
    let behind = cluster.follower(leader);
    let mut expected = MetadataImage::default();
    submit_checked(cluster.node(leader), &mut expected, register(1)).await;
    submit_checked(cluster.node(leader), &mut expected, create_topic("s", 1, 1)).await;
    cluster.converged(&expected).await;
    cluster.stop(behind).await;
    let behind_dir = cluster.configs[behind].dir.clone();
    let last = stored_index(&behind_dir, "log.jsonl").expect("the stopped node has a log");

    let leader_dir = cluster.configs[leader].dir.clone();
    for _ in 0..40 {
        submit_checked(cluster.node(leader), &mut expected, bump("s", 0)).await;
        if stored_index(&leader_dir, "purged.json").is_some_and(|p| p > last) {
            break;
        }
    }
    wait_for("the leader to purge past the stopped node's log", || {
        stored_index(&leader_dir, "purged.json")
            .is_some_and(|p| p > last)
            .then_some(())
    })
    .await;

    let t = Instant::now();
    cluster.start(behind).await;
    cluster.converged(&expected).await;
    // Entries after `last` up to the purge point exist nowhere as log entries any more, so
    // converging proves the snapshot was sent and installed.
    eprintln!(
        "lagging node caught up from a snapshot in {:?}",
        t.elapsed()
    );
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_restart_keeps_the_image() {
    init_tracing();
    let mut cluster = Cluster::new(3, |_| {});
    cluster.start_all().await;
    let leader = cluster.leader().await;
    let f = cluster.node(cluster.follower(leader)).clone();
    let mut expected = MetadataImage::default();
    submit_checked(&f, &mut expected, register(1)).await;
    submit_checked(&f, &mut expected, register(2)).await;
    submit_checked(&f, &mut expected, create_topic("x", 2, 2)).await;
    submit_checked(&f, &mut expected, create_topic("y", 1, 1)).await;
    submit_checked(&f, &mut expected, bump("x", 0)).await;
    submit_checked(&f, &mut expected, bump("x", 0)).await;
    cluster.converged(&expected).await;
    drop(f);

    cluster.stop_all().await;
    let restarted = Instant::now();
    cluster.start_all().await;
    // Each node's image comes back from its own disk.
    cluster.converged(&expected).await;
    let leader = cluster.leader().await;
    eprintln!(
        "full restart: leader elected {:?} after start",
        restarted.elapsed()
    );
    assert_eq!(
        cluster.node(leader).image().borrow().topics["x"].partitions[0].leader_epoch,
        2
    );
    let f = cluster.node(cluster.follower(leader)).clone();
    let dup = submit_checked(&f, &mut expected, create_topic("y", 1, 1)).await;
    assert!(
        matches!(dup, ControllerReply::Error { code, .. } if code == errors::TOPIC_ALREADY_EXISTS)
    );
    submit_checked(&f, &mut expected, bump("y", 0)).await;
    cluster.converged(&expected).await;
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_voter_elects_itself() {
    init_tracing();
    let mut cluster = Cluster::new(1, |_| {});
    let started = Instant::now();
    cluster.start(0).await;
    cluster.leader().await;
    eprintln!("single voter: active {:?} after start", started.elapsed());
    let mut expected = MetadataImage::default();
    submit_checked(cluster.node(0), &mut expected, register(1)).await;
    submit_checked(cluster.node(0), &mut expected, create_topic("solo", 4, 1)).await;
    cluster.node(0).heartbeat(1, 1001).await.unwrap();
    assert_eq!(cluster.node(0).heartbeats()[&1].0, 1001);

    cluster.stop(0).await;
    let restarted = Instant::now();
    cluster.start(0).await;
    cluster.converged(&expected).await;
    cluster.leader().await;
    eprintln!(
        "single voter: active again {:?} after restart",
        restarted.elapsed()
    );
    submit_checked(cluster.node(0), &mut expected, bump("solo", 3)).await;
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_are_kept_by_the_active_controller_only() {
    init_tracing();
    let mut cluster = Cluster::new(3, |_| {});
    cluster.start_all().await;
    let leader = cluster.leader().await;
    let follower = cluster.follower(leader);

    cluster.node(follower).heartbeat(7, 42).await.unwrap();
    cluster.node(leader).heartbeat(8, 43).await.unwrap();
    let seen = cluster.node(leader).heartbeats();
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), vec![7, 8]);
    assert_eq!(seen[&7].0, 42);
    assert_eq!(seen[&8].0, 43);
    assert!(seen[&7].1.elapsed() < PATIENCE);
    for (i, n) in cluster.running() {
        if i != leader {
            assert!(n.heartbeats().is_empty(), "node {} is not active", i + 1);
        }
    }

    // A newer heartbeat replaces the older one.
    let before = seen[&7].1;
    cluster.node(follower).heartbeat(7, 44).await.unwrap();
    let after = cluster.node(leader).heartbeats()[&7];
    assert_eq!(after.0, 44);
    assert!(after.1 >= before);

    // A new active controller starts from nothing.
    cluster.stop(leader).await;
    let new = cluster.leader().await;
    assert!(cluster.node(new).heartbeats().is_empty());
    let other = cluster.follower(new);
    cluster.node(other).heartbeat(9, 45).await.unwrap();
    let seen = cluster.node(new).heartbeats();
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), vec![9]);
    cluster.stop_all().await;
}

/// What a submit without a majority may answer: nothing can be committed, so it must not succeed.
fn assert_unavailable(result: &Result<ControllerReply, QuorumError>, elapsed: Duration) {
    assert!(
        matches!(
            result,
            Err(QuorumError::NoLeader(_)) | Err(QuorumError::Unknown(_))
        ),
        "{result:?}"
    );
    // request_timeout (5 s) to find a leader or to apply, plus one RPC timeout, plus slack.
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_majority_submits_fail_in_bounded_time() {
    init_tracing();
    let mut cluster = Cluster::new(3, |_| {});
    cluster.start_all().await;
    let leader = cluster.leader().await;
    let mut expected = MetadataImage::default();
    submit_checked(cluster.node(leader), &mut expected, register(1)).await;

    // The leader alone: it can append but never commit.
    for i in 0..3 {
        if i != leader {
            cluster.stop(i).await;
        }
    }
    let t = Instant::now();
    let result = cluster
        .node(leader)
        .submit(create_topic("lost", 1, 1))
        .await;
    eprintln!(
        "no majority, alone leader: {result:?} after {:?}",
        t.elapsed()
    );
    assert_unavailable(&result, t.elapsed());
    assert!(matches!(result, Err(QuorumError::Unknown(_))));
    let t = Instant::now();
    let hb = cluster.node(leader).heartbeat(1, 1001).await;
    assert!(
        hb.is_ok() || matches!(hb, Err(QuorumError::NoLeader(_))),
        "{hb:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(15));
    assert!(
        !cluster.node(leader).is_active(),
        "a leader cut off from the majority is not the active controller"
    );
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_follower_reports_no_leader_in_bounded_time() {
    init_tracing();
    let mut cluster = Cluster::new(3, |_| {});
    cluster.start_all().await;
    let leader = cluster.leader().await;
    let lone = cluster.follower(leader);
    let mut expected = MetadataImage::default();
    submit_checked(cluster.node(lone), &mut expected, register(1)).await;
    // A follower learns that an entry committed only with the leader's next message.
    cluster.converged(&expected).await;
    for i in 0..3 {
        if i != lone {
            cluster.stop(i).await;
        }
    }

    let t = Instant::now();
    let result = cluster.node(lone).submit(create_topic("lost", 1, 1)).await;
    eprintln!(
        "no majority, lone follower: {result:?} after {:?}",
        t.elapsed()
    );
    assert_unavailable(&result, t.elapsed());
    let t = Instant::now();
    let hb = cluster.node(lone).heartbeat(1, 1001).await;
    assert!(matches!(hb, Err(QuorumError::NoLeader(_))), "{hb:?}");
    assert!(t.elapsed() < Duration::from_secs(15));
    assert!(!cluster.node(lone).is_active());
    assert!(cluster.node(lone).heartbeats().is_empty());
    // The image holds what was committed, and nothing of the failed submit.
    assert_eq!(*cluster.node(lone).image().borrow().as_ref(), expected);
    cluster.stop_all().await;
}

/// The config of a child-process voter, passed in the environment as JSON-free plain fields.
const CHILD_ID: &str = "TIDEMARK_QUORUM_CHILD_ID";
const CHILD_VOTERS: &str = "TIDEMARK_QUORUM_CHILD_VOTERS";
const CHILD_DIR: &str = "TIDEMARK_QUORUM_CHILD_DIR";
/// `bump`: submit epoch bumps until killed, printing `acked N` after each; otherwise only vote.
const CHILD_MODE: &str = "TIDEMARK_QUORUM_CHILD_MODE";

/// A voter in a separate process (this test binary running `child_voter`), so that it can be
/// killed with SIGKILL or frozen with SIGSTOP. Killed when dropped.
struct ChildVoter {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl ChildVoter {
    fn spawn(cfg: &QuorumConfig, mode: &str) -> ChildVoter {
        use std::io::BufRead;
        use std::process::{Command, Stdio};

        let voters: Vec<String> = cfg
            .voters
            .iter()
            .map(|v| format!("{}@{}:{}", v.id, v.host, v.port))
            .collect();
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_voter",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ID, cfg.node_id.to_string())
            .env(CHILD_VOTERS, voters.join(","))
            .env(CHILD_DIR, &cfg.dir)
            .env(CHILD_MODE, mode)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        ChildVoter { child, lines }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// SIGKILL, and every line the child printed before it died.
    fn kill(mut self) -> Vec<String> {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        let mut lines = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(PATIENCE) {
            lines.push(line);
        }
        lines
    }
}

impl Drop for ChildVoter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn acked(line: &str) -> Option<u64> {
    line.strip_prefix("acked ")?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a voter process started by other tests"]
async fn child_voter() {
    let Ok(id) = std::env::var(CHILD_ID) else {
        return;
    };
    let voters: Vec<Voter> = std::env::var(CHILD_VOTERS)
        .unwrap()
        .split(',')
        .map(|v| {
            let (id, addr) = v.split_once('@').unwrap();
            let (host, port) = addr.rsplit_once(':').unwrap();
            Voter {
                id: id.parse().unwrap(),
                host: host.to_string(),
                port: port.parse().unwrap(),
            }
        })
        .collect();
    let id: i32 = id.parse().unwrap();
    let me = voters.iter().find(|v| v.id == id).unwrap();
    let listen = format!("{}:{}", me.host, me.port).parse().unwrap();
    let dir = std::env::var(CHILD_DIR).unwrap().into();
    let q: Arc<dyn MetadataQuorum> = RaftQuorum::start(QuorumConfig::new(id, voters, listen, dir))
        .await
        .unwrap();
    if std::env::var(CHILD_MODE).as_deref() != Ok("bump") {
        std::future::pending::<()>().await;
    }
    q.submit(register(1)).await.unwrap();
    q.submit(create_topic("k", 1, 1)).await.unwrap();
    for i in 1.. {
        q.submit(bump("k", 0)).await.unwrap();
        println!("acked {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_command() {
    init_tracing();
    let cluster = Cluster::new(1, |_| {});
    let child = ChildVoter::spawn(&cluster.configs[0], "bump");
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = child
            .lines
            .recv_timeout(left)
            .expect("the child acknowledges bumps in time");
        if acked(&line).is_some_and(|n| n >= 50) {
            break;
        }
    }
    // Acknowledgements printed up to the kill count too.
    let acked = child
        .kill()
        .iter()
        .filter_map(|l| acked(l))
        .max()
        .unwrap_or(50);

    let mut cluster = cluster;
    cluster.start(0).await;
    let epoch = wait_for("the restarted voter to apply its log", || {
        let image = cluster.node(0).image().borrow().clone();
        let epoch = image.topics.get("k")?.partitions[0].leader_epoch;
        (epoch as u64 >= acked).then_some(epoch)
    })
    .await;
    eprintln!("kill -9 after {acked} acknowledged bumps; epoch {epoch} after restart");
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigstopped_follower_does_not_block_the_others() {
    use nix::sys::signal::Signal;

    init_tracing();
    let mut cluster = Cluster::new(3, |_| {});
    cluster.start(0).await;
    cluster.start(1).await;
    let child = ChildVoter::spawn(&cluster.configs[2], "idle");
    let leader = cluster.leader().await;
    let mut expected = MetadataImage::default();
    submit_checked(cluster.node(leader), &mut expected, register(1)).await;
    submit_checked(cluster.node(leader), &mut expected, create_topic("z", 1, 1)).await;

    // Frozen, node 3 still accepts connections (the kernel does) but never answers.
    child.signal(Signal::SIGSTOP);
    let frozen = Instant::now();
    let leader = cluster.leader().await;
    eprintln!(
        "SIGSTOP: a leader among the others {:?} later",
        frozen.elapsed()
    );
    let follower = cluster.follower(leader);
    let mut slowest = Duration::ZERO;
    for i in 0..10 {
        let via = if i % 2 == 0 { leader } else { follower };
        let t = Instant::now();
        submit_checked(cluster.node(via), &mut expected, bump("z", 0)).await;
        slowest = slowest.max(t.elapsed());
    }
    eprintln!("SIGSTOP: slowest of 10 submits {slowest:?}");
    cluster.converged(&expected).await;
    cluster.node(follower).heartbeat(1, 1001).await.unwrap();

    child.signal(Signal::SIGCONT);
    submit_checked(cluster.node(follower), &mut expected, bump("z", 0)).await;
    cluster.converged(&expected).await;
    drop(child);
    cluster.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigstopped_leader_is_replaced() {
    use nix::sys::signal::Signal;

    init_tracing();
    let mut cluster = Cluster::new(3, |_| {});
    // Node 1 bootstraps the cluster and the others cannot campaign before they hear from it,
    // so node 1, in its own process, is the first leader.
    let child = ChildVoter::spawn(&cluster.configs[0], "idle");
    cluster.start(1).await;
    cluster.start(2).await;
    wait_for("nodes 2 and 3 to follow node 1", || {
        cluster
            .running()
            .all(|(_, n)| n.leader() == Some(1))
            .then_some(())
    })
    .await;
    let mut expected = MetadataImage::default();
    submit_checked(cluster.node(1), &mut expected, register(1)).await;
    submit_checked(cluster.node(2), &mut expected, create_topic("w", 1, 1)).await;
    cluster.converged(&expected).await;

    child.signal(Signal::SIGSTOP);
    let frozen = Instant::now();
    // Sent to the frozen leader: it must come back, applied or in doubt, not hang. Deleting a
    // missing topic leaves the image alone either way.
    let node = cluster.node(1).clone();
    let in_doubt = tokio::spawn(async move {
        let t = Instant::now();
        let r = node
            .submit(ControllerCommand::DeleteTopic {
                name: "missing".into(),
            })
            .await;
        (r, t.elapsed())
    });
    let leader = cluster.leader().await;
    eprintln!(
        "SIGSTOPped leader: node {} leads {:?} later",
        leader + 1,
        frozen.elapsed()
    );
    let other = cluster.follower(leader);
    submit_checked(cluster.node(other), &mut expected, bump("w", 0)).await;
    submit_checked(cluster.node(leader), &mut expected, bump("w", 0)).await;
    cluster.converged(&expected).await;
    let (result, took) = in_doubt.await.unwrap();
    eprintln!("SIGSTOPped leader: submit sent to it returned {result:?} after {took:?}");
    assert!(
        matches!(
            result,
            Ok(ControllerReply::Error { .. })
                | Err(QuorumError::Unknown(_))
                | Err(QuorumError::NoLeader(_))
        ),
        "{result:?}"
    );
    assert!(took < Duration::from_secs(15), "took {took:?}");

    // Thawed, the old leader learns of the newer term and follows.
    child.signal(Signal::SIGCONT);
    submit_checked(cluster.node(other), &mut expected, bump("w", 0)).await;
    cluster.converged(&expected).await;
    drop(child);
    cluster.stop_all().await;
}
