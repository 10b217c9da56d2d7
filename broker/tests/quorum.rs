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
        },
        defaults: ClusterDefaults {
            unclean_leader_election_enable: false,
            min_insync_replicas: 1,
        },
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
    }
}

fn bump(topic: &str, partition: i32) -> ControllerCommand {
    ControllerCommand::BumpLeaderEpoch {
        topic: topic.to_string(),
        partition,
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

const CHILD_DIR: &str = "TIDEMARK_QUORUM_CHILD_DIR";
const CHILD_PORT: &str = "TIDEMARK_QUORUM_CHILD_PORT";

/// The child process of `kill_9_loses_no_acknowledged_command`: a single voter that bumps an
/// epoch until it is killed, printing each bump once `submit` has acknowledged it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run as a child process by kill_9_loses_no_acknowledged_command"]
async fn child_voter_submits_until_killed() {
    let (Ok(dir), Ok(port)) = (std::env::var(CHILD_DIR), std::env::var(CHILD_PORT)) else {
        return;
    };
    let port: u16 = port.parse().unwrap();
    let voters = vec![Voter {
        id: 1,
        host: "127.0.0.1".to_string(),
        port,
    }];
    let listen = format!("127.0.0.1:{port}").parse().unwrap();
    let q: Arc<dyn MetadataQuorum> =
        RaftQuorum::start(QuorumConfig::new(1, voters, listen, dir.into()))
            .await
            .unwrap();
    q.submit(register(1)).await.unwrap();
    q.submit(create_topic("k", 1, 1)).await.unwrap();
    println!("ready");
    for i in 1.. {
        q.submit(bump("k", 0)).await.unwrap();
        println!("acked {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_command() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    init_tracing();
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_voter_submits_until_killed",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir.path())
        .env(CHILD_PORT, port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut acked = 0u64;
    let deadline = Instant::now() + PATIENCE;
    while acked < 50 {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .expect("the child acknowledges bumps in time");
        if let Some(n) = line.strip_prefix("acked ") {
            acked = n.parse().unwrap();
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    // Acknowledgements printed before the kill count too.
    for line in rx.try_iter() {
        if let Some(n) = line.strip_prefix("acked ") {
            acked = acked.max(n.parse().unwrap());
        }
    }

    let voters = vec![Voter {
        id: 1,
        host: "127.0.0.1".to_string(),
        port,
    }];
    let listen = format!("127.0.0.1:{port}").parse().unwrap();
    let q = RaftQuorum::start(QuorumConfig::new(1, voters, listen, dir.path().into()))
        .await
        .unwrap();
    let epoch = wait_for("the restarted voter to apply its log", || {
        let image = q.image().borrow().clone();
        let epoch = image.topics.get("k")?.partitions[0].leader_epoch;
        (epoch as u64 >= acked).then_some(epoch)
    })
    .await;
    eprintln!("kill -9 after {acked} acknowledged bumps; epoch {epoch} after restart");
    q.shutdown().await;
}
