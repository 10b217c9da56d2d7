//! A broker-only node's view of the metadata quorum (KRaft's observer): it holds no vote and no
//! log, long-polls the active controller for each new image, and forwards its commands and
//! heartbeats there. Whoever answers as active controller is the leader it follows; a refusal
//! names the next one to try, and silence moves it on to the next voter.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::wire::{Peers, Refused, Request, Response};
use super::{
    ask_status, forward_heartbeat, forward_submit, lock, pause_until, voter_addrs, Conn, Forwarded,
    REQUEST_TIMEOUT, RETRY_PAUSE, RPC_TIMEOUT,
};
use crate::config::Voter;
use crate::controller::state::{ControllerCommand, ControllerReply};
use crate::controller::{MetadataQuorum, QuorumError, QuorumStatus};
use crate::metadata::MetadataImage;

/// How long the active controller holds a poll open when it has nothing newer.
const OBSERVE_WAIT: Duration = Duration::from_millis(500);

/// A broker-only node's metadata quorum; see the module docs.
pub struct RaftObserver {
    inner: Arc<Observer>,
    task: Mutex<Option<JoinHandle<()>>>,
}

struct Observer {
    voters: Vec<u64>,
    peers: Peers,
    /// The voter believed to be the active controller.
    leader: Mutex<Option<u64>>,
    /// The voter to try next while no leader is known.
    next: Mutex<usize>,
    image: watch::Sender<Arc<MetadataImage>>,
    rpc_timeout: Duration,
    request_timeout: Duration,
    stopped: AtomicBool,
}

impl RaftObserver {
    /// Starts following the quorum of `voters`. The image is empty until the active controller
    /// first answers: a broker acts on nothing before its own registration is in it.
    pub fn start(voters: &[Voter]) -> anyhow::Result<Arc<RaftObserver>> {
        let addrs = voter_addrs(voters)?;
        anyhow::ensure!(
            !addrs.is_empty(),
            "a broker-only node needs controller.quorum.voters"
        );
        let inner = Arc::new(Observer {
            voters: addrs.keys().copied().collect(),
            peers: Peers::new(addrs),
            leader: Mutex::new(None),
            next: Mutex::new(0),
            image: watch::channel(Arc::default()).0,
            rpc_timeout: RPC_TIMEOUT,
            request_timeout: REQUEST_TIMEOUT,
            stopped: AtomicBool::new(false),
        });
        let task = tokio::spawn(follow(inner.clone()));
        tracing::info!(voters = ?inner.voters, "observing the metadata quorum");
        Ok(Arc::new(RaftObserver {
            inner,
            task: Mutex::new(Some(task)),
        }))
    }

    /// Stops following; pending and later calls fail. Idempotent.
    pub async fn shutdown(&self) {
        if self.inner.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        let task = lock(&self.task).take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
        self.inner.peers.close();
    }
}

impl Drop for RaftObserver {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.task).take() {
            task.abort();
        }
    }
}

impl Observer {
    /// The voter to ask now: the known leader, else the next in turn.
    fn target(&self) -> u64 {
        if let Some(l) = *lock(&self.leader) {
            return l;
        }
        let next = *lock(&self.next);
        self.voters[next % self.voters.len()]
    }

    /// `to` answered as the active controller.
    fn heard_leader(&self, to: u64) {
        *lock(&self.leader) = Some(to);
    }

    /// `to` did not act as the active controller: follow its hint if it names another voter,
    /// else try the voter after it.
    fn missed(&self, to: u64, hint: Option<u64>) {
        let mut leader = lock(&self.leader);
        match hint {
            Some(h) if h != to && self.voters.contains(&h) => *leader = Some(h),
            _ => {
                *leader = None;
                let at = self.voters.iter().position(|v| *v == to).unwrap_or(0);
                *lock(&self.next) = at + 1;
            }
        }
    }

    fn check_running(&self) -> Result<(), QuorumError> {
        if self.stopped.load(Ordering::SeqCst) {
            return Err(QuorumError::Fatal(
                "the metadata observer is shut down".into(),
            ));
        }
        Ok(())
    }

    async fn submit(&self, cmd: ControllerCommand) -> Result<ControllerReply, QuorumError> {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            self.check_running()?;
            let to = self.target();
            let forwarded = forward_submit(
                &self.peers,
                to,
                &cmd,
                self.request_timeout,
                self.rpc_timeout,
            )
            .await;
            let why = match forwarded {
                Forwarded::Done(result) => {
                    if result.is_ok() {
                        self.heard_leader(to);
                    }
                    return result;
                }
                Forwarded::Retry { why, leader } => {
                    self.missed(to, leader);
                    why
                }
            };
            pause_until(deadline)
                .await
                .map_err(|()| QuorumError::NoLeader(why))?;
        }
    }

    /// Where the quorum stands, asked of the active controller, following its hints a few times.
    async fn status(&self) -> Result<QuorumStatus, QuorumError> {
        let mut why = String::new();
        for _ in 0..=self.voters.len() {
            self.check_running()?;
            let to = self.target();
            match ask_status(&self.peers, to, self.rpc_timeout).await {
                Ok(status) => {
                    self.heard_leader(to);
                    return Ok(status);
                }
                Err((w, hint)) => {
                    self.missed(to, hint);
                    why = w;
                }
            }
        }
        Err(QuorumError::NoLeader(why))
    }

    async fn heartbeat(&self, broker_id: i32, incarnation: u64) -> Result<(), QuorumError> {
        let deadline = Instant::now() + self.request_timeout;
        loop {
            self.check_running()?;
            let to = self.target();
            let why =
                match forward_heartbeat(&self.peers, to, broker_id, incarnation, self.rpc_timeout)
                    .await
                {
                    Ok(()) => {
                        self.heard_leader(to);
                        return Ok(());
                    }
                    Err((why, hint)) => {
                        self.missed(to, hint);
                        why
                    }
                };
            pause_until(deadline)
                .await
                .map_err(|()| QuorumError::NoLeader(why))?;
        }
    }
}

/// Polls the active controller for each image after the last one received, for as long as the
/// observer runs. Log indexes are the quorum's, so a new leader continues where the old one
/// left off.
async fn follow(inner: Arc<Observer>) {
    let mut after = 0;
    loop {
        let to = inner.target();
        let request = Request::Observe {
            after,
            wait_ms: u64::try_from(OBSERVE_WAIT.as_millis()).unwrap_or(u64::MAX),
        };
        let answer = inner
            .peers
            .call(to, request, OBSERVE_WAIT + inner.rpc_timeout, Conn::Pooled)
            .await;
        match answer {
            Ok(Response::Observe(Ok(observed))) => {
                inner.heard_leader(to);
                if let Some(image) = observed.image.filter(|_| observed.index > after) {
                    after = observed.index;
                    inner.image.send_replace(Arc::new(image));
                }
                continue;
            }
            Ok(Response::Observe(Err(Refused::NotLeader { leader }))) => inner.missed(to, leader),
            Ok(other) => {
                tracing::debug!(node = to, answer = ?other, "unexpected answer to a metadata poll");
                inner.missed(to, None);
            }
            Err(e) => {
                tracing::debug!(node = to, error = %e, "metadata poll failed");
                inner.missed(to, None);
            }
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

impl MetadataQuorum for RaftObserver {
    fn image(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.inner.image.subscribe()
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

    /// Only the active controller hears heartbeats, and an observer never is one.
    fn heartbeats(&self) -> BTreeMap<i32, (u64, Instant)> {
        BTreeMap::new()
    }

    fn is_active(&self) -> bool {
        false
    }

    fn active_controller(&self) -> Option<i32> {
        lock(&self.inner.leader).and_then(|l| i32::try_from(l).ok())
    }

    fn status(&self) -> BoxFuture<'_, Result<QuorumStatus, QuorumError>> {
        Box::pin(self.inner.status())
    }
}
