//! The controller-to-controller protocol: length-delimited JSON frames over TCP between the
//! voters' CONTROLLER listeners, carrying openraft's RPCs, the broker-side requests (`submit`,
//! `heartbeat`) a follower or a broker-only node forwards to the leader, and the broker-only
//! node's long poll for the image (`observe`). One request is in flight per connection; the
//! client keeps idle connections per peer for reuse and drops any connection whose state is
//! unknown (an error or a timeout), so the next call reconnects.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::LogId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use super::TypeConfig;
use crate::controller::state::{ControllerCommand, ControllerReply};
use crate::controller::QuorumStatus;
use crate::metadata::MetadataImage;

/// Snapshot chunks are bounded by the raft config; this only guards against garbage lengths.
const MAX_FRAME: usize = 64 << 20;
/// Idle connections kept per peer; more only exist while RPCs overlap.
const MAX_IDLE: usize = 4;

pub(super) type Frames = Framed<TcpStream, LengthDelimitedCodec>;

/// A request, addressed to one node so that a misconfigured address is noticed rather than obeyed.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Envelope {
    pub to: u64,
    pub request: Request,
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Request {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<u64>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// A command forwarded to the leader, who waits at most `timeout_ms` for it to apply.
    Submit {
        cmd: ControllerCommand,
        timeout_ms: u64,
    },
    Heartbeat {
        broker_id: i32,
        incarnation: u64,
    },
    /// A broker-only node's long poll of the active controller for the image after log index
    /// `after`, answered once there is one or after `wait_ms`.
    Observe {
        after: u64,
        wait_ms: u64,
    },
    /// Where the quorum stands, answered by the active controller.
    Status,
    /// Would the receiver vote for a candidate whose log ends at `last_log` (Raft's pre-vote)?
    PreVote {
        last_log: Option<LogId<u64>>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Response {
    AppendEntries(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    InstallSnapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
    Submit(Result<ControllerReply, Refused>),
    Heartbeat(Result<(), Refused>),
    Observe(Result<Observed, Refused>),
    Status(Result<QuorumStatus, Refused>),
    PreVote(bool),
    /// The request was addressed to another node and was not acted on.
    WrongNode {
        id: u64,
    },
}

/// The active controller's image at log index `index`; `None` when that is not past the
/// observer's `after`.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Observed {
    pub index: u64,
    pub image: Option<MetadataImage>,
}

/// Why the receiver of a forwarded request did not carry it out.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Refused {
    /// Not the leader; the request had no effect. `leader` is its guess of who is.
    NotLeader { leader: Option<u64> },
    /// The command was appended but its outcome is not known.
    Unknown(String),
}

/// How a call failed, as far as the caller can tell whether the peer acted on it.
#[derive(Debug)]
pub(super) enum CallError {
    /// No connection could be made: the request never left this node.
    NotSent(io::Error),
    /// The request may have been delivered, but no answer came in time.
    Timeout(Duration),
    /// The connection broke after the request was (perhaps) delivered.
    Lost(io::Error),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NotSent(e) => write!(f, "not sent: {e}"),
            CallError::Timeout(t) => write!(f, "no answer within {t:?}"),
            CallError::Lost(e) => write!(f, "connection lost: {e}"),
        }
    }
}

/// Whether a call may go over a pooled connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Conn {
    /// Idempotent requests: a stale pooled connection only costs a retry.
    Pooled,
    /// Requests that must not be in doubt when a pooled connection turns out to be dead.
    Fresh,
}

pub(super) fn framed(stream: TcpStream) -> Frames {
    LengthDelimitedCodec::builder()
        .max_frame_length(MAX_FRAME)
        .new_framed(stream)
}

pub(super) async fn send<T: Serialize>(frames: &mut Frames, msg: &T) -> io::Result<()> {
    let bytes = serde_json::to_vec(msg)?;
    frames.send(bytes::Bytes::from(bytes)).await
}

/// The next message, or `None` at a clean end of stream.
pub(super) async fn recv<T: DeserializeOwned>(frames: &mut Frames) -> io::Result<Option<T>> {
    match frames.next().await {
        Some(frame) => Ok(Some(serde_json::from_slice(&frame?)?)),
        None => Ok(None),
    }
}

/// Clients for the other voters, by node id.
pub(super) struct Peers {
    addrs: BTreeMap<u64, String>,
    idle: Mutex<HashMap<u64, Vec<Frames>>>,
    closed: AtomicBool,
}

impl Peers {
    pub(super) fn new(addrs: BTreeMap<u64, String>) -> Peers {
        Peers {
            addrs,
            idle: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        }
    }

    /// Sends `request` to node `to` and waits at most `timeout` for its answer.
    pub(super) async fn call(
        &self,
        to: u64,
        request: Request,
        timeout: Duration,
        conn: Conn,
    ) -> Result<Response, CallError> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(CallError::NotSent(io::Error::other("quorum is shut down")));
        }
        let Some(addr) = self.addrs.get(&to) else {
            return Err(CallError::NotSent(io::Error::other(format!(
                "node {to} is not a voter"
            ))));
        };
        let sent = AtomicBool::new(false);
        let exchange = async {
            let pooled = match conn {
                Conn::Pooled => self.take_idle(to),
                Conn::Fresh => None,
            };
            let mut frames = match pooled {
                Some(f) => f,
                None => {
                    let stream = TcpStream::connect(addr.as_str())
                        .await
                        .map_err(CallError::NotSent)?;
                    stream.set_nodelay(true).map_err(CallError::NotSent)?;
                    framed(stream)
                }
            };
            sent.store(true, Ordering::Relaxed);
            send(&mut frames, &Envelope { to, request })
                .await
                .map_err(CallError::Lost)?;
            let response = recv::<Response>(&mut frames)
                .await
                .map_err(CallError::Lost)?
                .ok_or_else(|| CallError::Lost(io::Error::from(io::ErrorKind::UnexpectedEof)))?;
            self.put_idle(to, frames);
            Ok(response)
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(result) => result,
            Err(_) if !sent.load(Ordering::Relaxed) => Err(CallError::NotSent(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("connecting to {addr} took over {timeout:?}"),
            ))),
            Err(_) => Err(CallError::Timeout(timeout)),
        }
    }

    /// Every voter's id, this node's included.
    pub(super) fn ids(&self) -> Vec<u64> {
        self.addrs.keys().copied().collect()
    }

    /// Drops idle connections and refuses further calls.
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.lock_idle().clear();
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<Frames>>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle connection the peer has not closed meanwhile (e.g. by restarting).
    fn take_idle(&self, to: u64) -> Option<Frames> {
        let mut idle = self.lock_idle();
        let conns = idle.get_mut(&to)?;
        while let Some(frames) = conns.pop() {
            let alive = frames.read_buffer().is_empty()
                && matches!(
                    frames.get_ref().try_read(&mut [0u8; 1]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock
                );
            if alive {
                return Some(frames);
            }
        }
        None
    }

    fn put_idle(&self, to: u64, frames: Frames) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let mut idle = self.lock_idle();
        let conns = idle.entry(to).or_default();
        if conns.len() < MAX_IDLE {
            conns.push(frames);
        }
    }
}
