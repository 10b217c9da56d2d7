//! The KRaft-style metadata quorum: the controller voters of `controller.quorum.voters` run raft
//! (openraft 0.9) over their CONTROLLER listeners, and every voter applies the committed
//! `ControllerCommand`s to its `MetadataImage` with `state::apply`. `RaftQuorum` puts this behind
//! the `MetadataQuorum` trait, so the broker never sees openraft: it submits commands (forwarded
//! to the leader when needed), sends heartbeats to the active controller and watches the image.
//!
//! Layout: `log_store` (durable vote and log), `state_machine` (image and snapshots), `wire`
//! (frames and the peer clients), `network` (openraft's RPCs over `wire`), `server` (the
//! listener answering peers).

mod log_store;
mod network;
mod observer;
mod server;
mod state_machine;
#[cfg(test)]
mod tests;
mod wire;

use std::collections::BTreeMap;
use std::io::Cursor;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::future::BoxFuture;
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::raft::AppendEntriesResponse;
use openraft::{BasicNode, LogId, Raft, RaftMetrics, ServerState, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::state::{ControllerCommand, ControllerReply};
use super::{MetadataQuorum, QuorumError, QuorumStatus};
use crate::config::{BrokerConfig, Voter};
use crate::metadata::MetadataImage;
use log_store::LogStore;
use network::NetworkFactory;
use state_machine::{IndexedImage, StateMachine};
use wire::{CallError, Conn, Observed, Peers, Refused, Request, Response};

pub use observer::RaftObserver;

openraft::declare_raft_types!(
    /// openraft's types for the metadata quorum: controller commands in, `apply` replies out.
    pub(crate) TypeConfig:
        D = ControllerCommand,
        R = ControllerReply,
        NodeId = u64,
        Node = BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// Pause between attempts while no leader is known or the leader is unreachable.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Default bound on one RPC to a peer.
const RPC_TIMEOUT: Duration = Duration::from_secs(1);
/// Default time a command or heartbeat may look for a leader and wait to apply.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Snapshot transfer chunks; the image is small, and JSON frames inflate bytes about 3x.
const SNAPSHOT_CHUNK: u64 = 256 << 10;

/// How to run one controller voter.
#[derive(Clone, Debug)]
pub struct QuorumConfig {
    pub node_id: i32,
    /// Every voter, this node included; all are members from the start.
    pub voters: Vec<Voter>,
    /// This node's CONTROLLER listener.
    pub listen: SocketAddr,
    /// Where the vote, log and snapshot live, e.g. `<log.dir>/__cluster_metadata`.
    pub dir: PathBuf,
    pub heartbeat_interval: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// Bound on one raft RPC to a peer.
    pub rpc_timeout: Duration,
    /// How long `submit`/`heartbeat` look for a leader, and how long an appended command may take
    /// to apply before its outcome is reported unknown.
    pub request_timeout: Duration,
    /// Take a snapshot every this many entries; as many entries before the latest snapshot are
    /// kept in the log, so a follower that lags a little catches up without a snapshot.
    pub snapshot_every: u64,
}

impl QuorumConfig {
    /// The metadata directory's name inside `log.dir`, as in Kafka.
    pub const DIR_NAME: &'static str = "__cluster_metadata";

    /// A config with the default timings: heartbeats every 100 ms, elections after 400–800 ms.
    pub fn new(node_id: i32, voters: Vec<Voter>, listen: SocketAddr, dir: PathBuf) -> Self {
        QuorumConfig {
            node_id,
            voters,
            listen,
            dir,
            heartbeat_interval: Duration::from_millis(100),
            election_timeout_min: Duration::from_millis(400),
            election_timeout_max: Duration::from_millis(800),
            rpc_timeout: RPC_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
            snapshot_every: 1000,
        }
    }

    /// The quorum config of a broker configured as a controller: its first controller listener
    /// and `<log.dir>/__cluster_metadata`.
    pub fn from_broker_config(cfg: &BrokerConfig) -> anyhow::Result<Self> {
        let listener = cfg
            .listeners
            .iter()
            .find(|l| cfg.controller_listener_names.contains(&l.name))
            .context("no listener is named in controller.listener.names")?;
        let listen = listener
            .socket_addr()
            .map_err(|e| anyhow::anyhow!("controller listener {}: {e}", listener.name))?;
        Ok(QuorumConfig::new(
            cfg.node_id,
            cfg.controller_quorum_voters.clone(),
            listen,
            cfg.log_dir.join(Self::DIR_NAME),
        ))
    }
}

/// A controller voter running the metadata quorum; see the module docs.
pub struct RaftQuorum {
    inner: Arc<Inner>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

/// Heartbeats heard while leading in `term`; a new term starts an empty map.
#[derive(Default)]
struct Heartbeats {
    term: u64,
    seen: BTreeMap<i32, (u64, Instant)>,
}

/// What the quorum's tasks share.
struct Inner {
    id: u64,
    raft: Raft<TypeConfig>,
    metrics: watch::Receiver<RaftMetrics<u64, BasicNode>>,
    peers: Arc<Peers>,
    image: watch::Receiver<Arc<MetadataImage>>,
    indexed: watch::Receiver<IndexedImage>,
    heartbeats: Mutex<Heartbeats>,
    /// When this node last accepted entries or a heartbeat from a leader.
    leader_heard: Mutex<Option<Instant>>,
    single_voter: bool,
    /// A leader acknowledged by a majority within this long cannot have been replaced yet.
    lease: Duration,
    rpc_timeout: Duration,
    request_timeout: Duration,
    stopped: AtomicBool,
}

/// The result of one try at writing a command on this node.
enum Attempt {
    Applied(ControllerReply),
    /// Not leader: the command was not appended, or was removed again, so it will not apply.
    NotLeader,
    Failed(QuorumError),
}

impl RaftQuorum {
    /// Opens the store under `cfg.dir`, binds `cfg.listen` and joins the quorum. On a fresh
    /// cluster the voter with the lowest id initializes the membership with all voters.
    pub async fn start(cfg: QuorumConfig) -> anyhow::Result<Arc<RaftQuorum>> {
        let id = raft_id(cfg.node_id)?;
        let addrs = voter_addrs(&cfg.voters)?;
        if !addrs.contains_key(&id) {
            anyhow::bail!("node {} is not in controller.quorum.voters", cfg.node_id);
        }
        let raft_config = openraft::Config {
            cluster_name: "tidemark-metadata".to_string(),
            heartbeat_interval: millis(cfg.heartbeat_interval),
            election_timeout_min: millis(cfg.election_timeout_min),
            election_timeout_max: millis(cfg.election_timeout_max),
            install_snapshot_timeout: millis(cfg.rpc_timeout),
            snapshot_policy: SnapshotPolicy::LogsSinceLast(cfg.snapshot_every),
            max_in_snapshot_log_to_keep: cfg.snapshot_every,
            snapshot_max_chunk_size: SNAPSHOT_CHUNK,
            ..Default::default()
        }
        .validate()
        .context("metadata quorum timings")?;

        let dir = cfg.dir.clone();
        let (log_store, (state_machine, image, indexed)) =
            log_store::blocking(move || Ok((LogStore::open(&dir)?, StateMachine::open(&dir)?)))
                .await
                .with_context(|| {
                    format!("opening the metadata quorum store in {}", cfg.dir.display())
                })?;
        let listener = TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("binding the controller listener {}", cfg.listen))?;

        let peers = Arc::new(Peers::new(addrs.clone()));
        let network = NetworkFactory {
            me: id,
            peers: peers.clone(),
            rpc_timeout: cfg.rpc_timeout,
            backoff: cfg.heartbeat_interval * 2,
        };
        let raft = Raft::new(id, Arc::new(raft_config), network, log_store, state_machine)
            .await
            .context("starting the metadata quorum")?;
        let inner = Arc::new(Inner {
            id,
            metrics: raft.metrics(),
            raft,
            peers,
            image,
            indexed,
            heartbeats: Mutex::new(Heartbeats::default()),
            leader_heard: Mutex::new(None),
            single_voter: addrs.len() == 1,
            lease: cfg.election_timeout_min,
            rpc_timeout: cfg.rpc_timeout,
            request_timeout: cfg.request_timeout,
            stopped: AtomicBool::new(false),
        });
        let quorum = Arc::new(RaftQuorum {
            tasks: Mutex::new(vec![
                tokio::spawn(server::serve(listener, inner.clone())),
                tokio::spawn(log_leader_changes(inner.clone())),
                tokio::spawn(pre_vote(inner.clone(), cfg.heartbeat_interval)),
            ]),
            inner,
        });
        tracing::info!(
            node = cfg.node_id,
            listen = %cfg.listen,
            dir = %cfg.dir.display(),
            voters = ?addrs,
            "metadata quorum started"
        );
        if let Err(e) = quorum.bootstrap(&addrs).await {
            quorum.shutdown().await;
            return Err(e);
        }
        Ok(quorum)
    }

    /// Initializes the membership if this is the lowest voter and the store is empty. Raft
    /// refuses a second initialization, so this is safe on every start.
    async fn bootstrap(&self, addrs: &BTreeMap<u64, String>) -> anyhow::Result<()> {
        let raft = &self.inner.raft;
        if addrs.keys().next() != Some(&self.inner.id) || raft.is_initialized().await? {
            return Ok(());
        }
        let members: BTreeMap<u64, BasicNode> = addrs
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr)))
            .collect();
        match raft.initialize(members).await {
            Ok(()) => {
                tracing::info!(node = self.inner.id, "initialized the metadata quorum");
                Ok(())
            }
            Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
                tracing::debug!(error = %e, "metadata quorum already initialized");
                Ok(())
            }
            Err(e) => Err(e).context("initializing the metadata quorum"),
        }
    }

    /// Stops raft and the listener; pending and later calls fail. Idempotent.
    pub async fn shutdown(&self) {
        if self.inner.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let tasks = std::mem::take(&mut *lock(&self.tasks));
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
        self.inner.peers.close();
        if let Err(e) = self.inner.raft.shutdown().await {
            tracing::warn!(error = %e, "the metadata quorum's raft task failed");
        }
        tracing::info!(node = self.inner.id, "metadata quorum stopped");
    }

    /// The leader this node knows of, if any.
    pub fn leader(&self) -> Option<i32> {
        self.inner.leader().and_then(|l| i32::try_from(l).ok())
    }
}

impl MetadataQuorum for RaftQuorum {
    fn image(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.inner.image.clone()
    }

    fn submit(
        &self,
        cmd: ControllerCommand,
    ) -> BoxFuture<'_, Result<ControllerReply, QuorumError>> {
        Box::pin(self.inner.submit(cmd))
    }

    fn heartbeat(
        &self,
        broker_id: i32,
        incarnation: u64,
    ) -> BoxFuture<'_, Result<(), QuorumError>> {
        Box::pin(self.inner.heartbeat(broker_id, incarnation))
    }

    fn heartbeats(&self) -> BTreeMap<i32, (u64, Instant)> {
        self.inner.heartbeats()
    }

    fn is_active(&self) -> bool {
        self.inner.is_active()
    }

    fn active_controller(&self) -> Option<i32> {
        self.inner.leader().and_then(|id| i32::try_from(id).ok())
    }

    fn status(&self) -> BoxFuture<'_, Result<QuorumStatus, QuorumError>> {
        Box::pin(self.inner.status())
    }
}

impl Inner {
    fn leader(&self) -> Option<u64> {
        self.metrics.borrow().current_leader
    }

    /// The term this node leads in, if it is the leader.
    fn leading_term(&self) -> Option<u64> {
        let m = self.metrics.borrow();
        (m.state == ServerState::Leader).then_some(m.current_term)
    }

    /// The term this node is the active controller in: leader, and heard from a majority
    /// recently enough that no other leader can exist. A leader cut off from the others keeps its
    /// raft state until it hears of a newer term, and one restored from its own vote after a
    /// restart is leader before any peer confirms it; neither is active.
    fn active_term(&self) -> Option<u64> {
        let m = self.metrics.borrow();
        let confirmed = self.single_voter
            || m.millis_since_quorum_ack
                .is_some_and(|ms| u128::from(ms) < self.lease.as_millis());
        (m.state == ServerState::Leader && confirmed).then_some(m.current_term)
    }

    fn is_active(&self) -> bool {
        self.active_term().is_some()
    }

    fn record_heartbeat(&self, broker_id: i32, incarnation: u64) -> bool {
        let Some(term) = self.leading_term().filter(|_| self.is_active()) else {
            return false;
        };
        let mut hb = lock(&self.heartbeats);
        if hb.term != term {
            *hb = Heartbeats {
                term,
                seen: BTreeMap::new(),
            };
        }
        hb.seen.insert(broker_id, (incarnation, Instant::now()));
        true
    }

    /// The heartbeats of this leadership term. They stay visible while the lease lapses for a
    /// moment, so a caller never mistakes a slow majority for silent brokers.
    fn heartbeats(&self) -> BTreeMap<i32, (u64, Instant)> {
        let hb = lock(&self.heartbeats);
        match self.leading_term() {
            Some(term) if term == hb.term => hb.seen.clone(),
            _ => BTreeMap::new(),
        }
    }

    /// Appends `cmd` on this node and waits for the reply `apply` gives when it is applied.
    async fn write(&self, cmd: ControllerCommand, timeout: Duration) -> Attempt {
        let rx = match self.raft.client_write_ff(cmd).await {
            Ok(rx) => rx,
            Err(e) => return Attempt::Failed(QuorumError::Fatal(e.to_string())),
        };
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(resp))) => Attempt::Applied(resp.data),
            Ok(Ok(Err(ClientWriteError::ForwardToLeader(_)))) => Attempt::NotLeader,
            Ok(Ok(Err(e))) => Attempt::Failed(QuorumError::Fatal(e.to_string())),
            Ok(Err(_)) => Attempt::Failed(QuorumError::Unknown(
                "the metadata quorum stopped before the command applied".to_string(),
            )),
            Err(_) => Attempt::Failed(QuorumError::Unknown(format!(
                "the command did not apply within {timeout:?}"
            ))),
        }
    }

    async fn submit(&self, cmd: ControllerCommand) -> Result<ControllerReply, QuorumError> {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            if self.stopped.load(Ordering::SeqCst) {
                return Err(QuorumError::Fatal(
                    "the metadata quorum is shut down".into(),
                ));
            }
            let why = match self.leader() {
                Some(l) if l == self.id => {
                    match self.write(cmd.clone(), self.request_timeout).await {
                        Attempt::Applied(reply) => return Ok(reply),
                        Attempt::NotLeader => "this node lost the leadership".to_string(),
                        Attempt::Failed(e) => return Err(e),
                    }
                }
                Some(l) => {
                    let forwarded = tokio::select! {
                        f = forward_submit(&self.peers, l, &cmd, self.request_timeout, self.rpc_timeout) => f,
                        // A frozen leader would hold the caller for the whole timeout.
                        next = self.leader_moved(l) => {
                            return Err(QuorumError::Unknown(format!(
                                "leadership moved from node {l} to node {next} while the \
                                 command was with node {l}"
                            )))
                        }
                    };
                    match forwarded {
                        Forwarded::Done(result) => return result,
                        Forwarded::Retry { why, .. } => why,
                    }
                }
                None => "no leader is elected".to_string(),
            };
            pause_until(deadline)
                .await
                .map_err(|()| QuorumError::NoLeader(why))?;
        }
    }

    /// Resolves with the new leader once this node learns of a leader other than `from`.
    async fn leader_moved(&self, from: u64) -> u64 {
        let mut metrics = self.metrics.clone();
        let baseline = metrics.borrow_and_update().current_leader;
        loop {
            if metrics.changed().await.is_err() {
                return std::future::pending().await;
            }
            let now = metrics.borrow_and_update().current_leader;
            match now {
                Some(n) if n != from && now != baseline => return n,
                _ => {}
            }
        }
    }

    async fn heartbeat(&self, broker_id: i32, incarnation: u64) -> Result<(), QuorumError> {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            if self.stopped.load(Ordering::SeqCst) {
                return Err(QuorumError::Fatal(
                    "the metadata quorum is shut down".into(),
                ));
            }
            let why = match self.leader() {
                Some(l) if l == self.id => {
                    if self.record_heartbeat(broker_id, incarnation) {
                        return Ok(());
                    }
                    "this node lost the leadership".to_string()
                }
                Some(l) => match forward_heartbeat(
                    &self.peers,
                    l,
                    broker_id,
                    incarnation,
                    self.rpc_timeout,
                )
                .await
                {
                    Ok(()) => return Ok(()),
                    Err((why, _)) => why,
                },
                None => "no leader is elected".to_string(),
            };
            pause_until(deadline)
                .await
                .map_err(|()| QuorumError::NoLeader(why))?;
        }
    }

    /// Answers one request from a peer.
    async fn serve(&self, request: Request) -> Response {
        match request {
            Request::AppendEntries(rpc) => {
                let answer = self.raft.append_entries(rpc).await;
                if matches!(&answer, Ok(a) if !matches!(a, AppendEntriesResponse::HigherVote(_))) {
                    *lock(&self.leader_heard) = Some(Instant::now());
                }
                Response::AppendEntries(answer)
            }
            Request::Vote(rpc) => Response::Vote(self.raft.vote(rpc).await),
            Request::InstallSnapshot(rpc) => {
                Response::InstallSnapshot(self.raft.install_snapshot(rpc).await)
            }
            Request::Submit { cmd, timeout_ms } => {
                let timeout = Duration::from_millis(timeout_ms).min(self.request_timeout);
                Response::Submit(match self.write(cmd, timeout).await {
                    Attempt::Applied(reply) => Ok(reply),
                    Attempt::NotLeader | Attempt::Failed(QuorumError::Fatal(_)) => {
                        Err(Refused::NotLeader {
                            leader: self.leader(),
                        })
                    }
                    Attempt::Failed(e) => Err(Refused::Unknown(e.to_string())),
                })
            }
            Request::Heartbeat {
                broker_id,
                incarnation,
            } => Response::Heartbeat(if self.record_heartbeat(broker_id, incarnation) {
                Ok(())
            } else {
                Err(Refused::NotLeader {
                    leader: self.leader(),
                })
            }),
            Request::Observe { after, wait_ms } => {
                Response::Observe(self.observe(after, wait_ms).await)
            }
            Request::Status => Response::Status(self.local_status().ok_or(Refused::NotLeader {
                leader: self.leader(),
            })),
            Request::PreVote { last_log } => Response::PreVote(self.grants_pre_vote(last_log)),
        }
    }

    /// Whether this node would vote for a candidate whose log ends at `last_log` (the pre-vote of
    /// Raft's §9.6, KIP-996 in Kafka): only once it has not heard from a leader for the shortest
    /// election timeout, and only for a log at least as up to date as its own (last term, then
    /// length: Raft's vote rule).
    fn grants_pre_vote(&self, last_log: Option<LogId<u64>>) -> bool {
        if self.is_active() {
            return false;
        }
        let heard = lock(&self.leader_heard).is_some_and(|at| at.elapsed() < self.lease);
        !heard && last_log >= self.raft.data_metrics().borrow().last_log
    }

    /// Where the quorum stands, if this node is the active controller.
    fn local_status(&self) -> Option<QuorumStatus> {
        let term = self.active_term()?;
        let m = self.metrics.borrow().clone();
        let matched = m.replication.clone().unwrap_or_default();
        let log_end = |id: u64| -> i64 {
            let index = if id == self.id {
                m.last_log_index
            } else {
                matched.get(&id).copied().flatten().map(|l| l.index)
            };
            index.map_or(-1, |i| i64::try_from(i + 1).unwrap_or(i64::MAX))
        };
        let voters: Vec<(i32, i64)> = m
            .membership_config
            .membership()
            .voter_ids()
            .filter_map(|id| Some((i32::try_from(id).ok()?, log_end(id))))
            .collect();
        let observers = self
            .heartbeats()
            .into_keys()
            .filter(|b| !voters.iter().any(|(v, _)| v == b))
            .collect();
        Some(QuorumStatus {
            leader: i32::try_from(self.id).ok()?,
            epoch: i32::try_from(term).unwrap_or(i32::MAX),
            high_watermark: m
                .last_applied
                .map_or(0, |l| i64::try_from(l.index + 1).unwrap_or(i64::MAX)),
            voters,
            observers,
        })
    }

    /// Where the quorum stands: from this node when it is the active controller, else from the
    /// leader.
    async fn status(&self) -> Result<QuorumStatus, QuorumError> {
        if let Some(status) = self.local_status() {
            return Ok(status);
        }
        match self.leader() {
            Some(l) if l != self.id => ask_status(&self.peers, l, self.rpc_timeout)
                .await
                .map_err(|(why, _)| QuorumError::NoLeader(why)),
            _ => Err(QuorumError::NoLeader(
                "this node knows of no active controller".into(),
            )),
        }
    }

    /// The image after log index `after` once this node has applied one, or where it stands
    /// after `wait_ms`. Only the active controller answers: a leader cut off from the others
    /// would hand out an image the cluster has moved past.
    async fn observe(&self, after: u64, wait_ms: u64) -> Result<Observed, Refused> {
        if !self.is_active() {
            return Err(Refused::NotLeader {
                leader: self.leader(),
            });
        }
        let mut indexed = self.indexed.clone();
        let wait = Duration::from_millis(wait_ms).min(self.request_timeout);
        let _ = tokio::time::timeout(wait, indexed.wait_for(|i| i.index > after)).await;
        let now = indexed.borrow().clone();
        Ok(Observed {
            index: now.index,
            image: (now.index > after).then(|| (*now.image).clone()),
        })
    }
}

/// What became of a command forwarded to node `to`.
enum Forwarded {
    Done(Result<ControllerReply, QuorumError>),
    /// Not carried out, so it may be tried again; `leader` is the peer's guess of who leads.
    Retry {
        why: String,
        leader: Option<u64>,
    },
}

/// Forwards `cmd` to node `to`, which is believed to lead.
async fn forward_submit(
    peers: &Peers,
    to: u64,
    cmd: &ControllerCommand,
    request_timeout: Duration,
    rpc_timeout: Duration,
) -> Forwarded {
    let request = Request::Submit {
        cmd: cmd.clone(),
        timeout_ms: millis(request_timeout),
    };
    // A fresh connection: a dead pooled one would leave the outcome in doubt.
    let answer = peers
        .call(to, request, request_timeout + rpc_timeout, Conn::Fresh)
        .await;
    let retry = |why: String, leader: Option<u64>| Forwarded::Retry { why, leader };
    match answer {
        Ok(Response::Submit(Ok(reply))) => Forwarded::Done(Ok(reply)),
        Ok(Response::Submit(Err(Refused::Unknown(m)))) => {
            Forwarded::Done(Err(QuorumError::Unknown(m)))
        }
        Ok(Response::Submit(Err(Refused::NotLeader { leader }))) => {
            retry(format!("node {to} is no longer the leader"), leader)
        }
        Ok(Response::WrongNode { id }) => {
            retry(format!("node {to}'s address is served by node {id}"), None)
        }
        Ok(other) => Forwarded::Done(Err(QuorumError::Unknown(format!(
            "unexpected answer from node {to}: {other:?}"
        )))),
        Err(CallError::NotSent(e)) => retry(format!("leader {to} is unreachable: {e}"), None),
        Err(e) => Forwarded::Done(Err(QuorumError::Unknown(format!(
            "forwarding to leader {to}: {e}"
        )))),
    }
}

/// Tells node `to`, believed to lead, that a broker is alive; on failure, why and the peer's
/// guess of who leads.
async fn forward_heartbeat(
    peers: &Peers,
    to: u64,
    broker_id: i32,
    incarnation: u64,
    rpc_timeout: Duration,
) -> Result<(), (String, Option<u64>)> {
    let request = Request::Heartbeat {
        broker_id,
        incarnation,
    };
    match peers.call(to, request, rpc_timeout, Conn::Pooled).await {
        Ok(Response::Heartbeat(Ok(()))) => Ok(()),
        Ok(Response::Heartbeat(Err(Refused::NotLeader { leader }))) => {
            Err((format!("node {to} is not the leader"), leader))
        }
        Ok(other) => Err((format!("node {to} refused the heartbeat: {other:?}"), None)),
        Err(e) => Err((format!("leader {to}: {e}"), None)),
    }
}

/// Asks node `to`, believed to lead, where the quorum stands; on failure, why and the peer's
/// guess of who leads.
async fn ask_status(
    peers: &Peers,
    to: u64,
    rpc_timeout: Duration,
) -> Result<QuorumStatus, (String, Option<u64>)> {
    match peers
        .call(to, Request::Status, rpc_timeout, Conn::Pooled)
        .await
    {
        Ok(Response::Status(Ok(status))) => Ok(status),
        Ok(Response::Status(Err(Refused::NotLeader { leader }))) => {
            Err((format!("node {to} is not the active controller"), leader))
        }
        Ok(other) => Err((format!("unexpected answer from node {to}: {other:?}"), None)),
        Err(e) => Err((format!("node {to}: {e}"), None)),
    }
}

/// Sleeps a little before the next attempt; `Err` once `deadline` has passed.
async fn pause_until(deadline: Instant) -> Result<(), ()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(());
    }
    tokio::time::sleep(left.min(RETRY_PAUSE)).await;
    Ok(())
}

/// Lets this node start elections only while a majority of the voters would vote for it: a
/// voter cut off from the others would otherwise raise its term with every election it starts
/// and, once healed, depose the working leader with it.
async fn pre_vote(inner: Arc<Inner>, every: Duration) {
    if inner.single_voter {
        return;
    }
    let voters = inner.peers.ids();
    let majority = voters.len() / 2 + 1;
    // Off until a majority says yes: a node cut off while still allowed would start one
    // election before its first ask timed out.
    let mut allowed = false;
    inner.raft.runtime_config().elect(false);
    loop {
        tokio::time::sleep(every).await;
        if inner.leading_term().is_some() {
            continue;
        }
        let last_log = inner.raft.data_metrics().borrow().last_log;
        let asks = voters.iter().filter(|v| **v != inner.id).map(|v| {
            let inner = inner.clone();
            let v = *v;
            async move {
                let ask = Request::PreVote { last_log };
                matches!(
                    inner
                        .peers
                        .call(v, ask, inner.rpc_timeout, Conn::Pooled)
                        .await,
                    Ok(Response::PreVote(true))
                )
            }
        });
        let granted = 1 + futures::future::join_all(asks)
            .await
            .into_iter()
            .filter(|g| *g)
            .count();
        let allow = granted >= majority;
        if allow != allowed {
            allowed = allow;
            tracing::debug!(node = inner.id, allow, "elections by this node");
            inner.raft.runtime_config().elect(allow);
        }
    }
}

/// Logs each change of leader (and term) as this node sees it.
async fn log_leader_changes(inner: Arc<Inner>) {
    let mut metrics = inner.raft.metrics();
    let mut seen = None;
    loop {
        let now = {
            let m = metrics.borrow_and_update();
            (m.current_term, m.current_leader)
        };
        if seen != Some(now) {
            seen = Some(now);
            match now.1 {
                Some(l) if l == inner.id => {
                    tracing::info!(
                        node = inner.id,
                        term = now.0,
                        "elected metadata quorum leader"
                    )
                }
                Some(l) => tracing::info!(
                    node = inner.id,
                    leader = l,
                    term = now.0,
                    "metadata quorum leader changed"
                ),
                None => tracing::debug!(node = inner.id, term = now.0, "no metadata quorum leader"),
            }
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Each voter's address by raft id.
fn voter_addrs(voters: &[Voter]) -> anyhow::Result<BTreeMap<u64, String>> {
    let mut addrs = BTreeMap::new();
    for v in voters {
        if addrs.insert(raft_id(v.id)?, voter_addr(v)).is_some() {
            anyhow::bail!("controller.quorum.voters names node {} twice", v.id);
        }
    }
    Ok(addrs)
}

/// `host:port` to connect to, bracketing an IPv6 literal.
fn voter_addr(v: &Voter) -> String {
    if v.host.contains(':') && !v.host.starts_with('[') {
        format!("[{}]:{}", v.host, v.port)
    } else {
        format!("{}:{}", v.host, v.port)
    }
}

fn raft_id(id: i32) -> anyhow::Result<u64> {
    u64::try_from(id).map_err(|_| anyhow::anyhow!("node id {id} is negative"))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
