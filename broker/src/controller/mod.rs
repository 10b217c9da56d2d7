//! The controller: the metadata state machine every controller node applies from the quorum's
//! committed log, and the quorum boundary behind which the log lives. Decisions (elections, ISR
//! changes, fencing) are made inside `apply`, a pure function of the image and one command, so
//! every node reaches the same image and a recorded log can be replayed exactly.

pub mod fencing;
pub mod local;
pub mod raft;
pub mod rebalance;
pub mod state;

pub use state::{apply, ControllerCommand, ControllerReply, Election};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::watch;

use crate::errors::{self, ApiError};
use crate::metadata::MetadataImage;

/// Why a quorum operation did not complete.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuorumError {
    /// No active controller is known right now (election in progress, or no majority).
    #[error("no active controller: {0}")]
    NoLeader(String),
    /// The command may or may not have been committed (the leader changed or the call timed out).
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// The quorum is shutting down or failed.
    #[error("quorum failed: {0}")]
    Fatal(String),
}

/// Where the metadata quorum stands, as its leader knows it (Kafka's DescribeQuorum).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuorumStatus {
    /// The active controller.
    pub leader: i32,
    /// Its leadership epoch (the raft term).
    pub epoch: i32,
    /// The last log index committed and applied on the leader.
    pub high_watermark: i64,
    /// Each voter and the log end the leader knows it holds (-1 when unknown).
    pub voters: Vec<(i32, i64)>,
    /// Brokers that are not voters and were heard from this term.
    pub observers: Vec<i32>,
}

/// The metadata quorum as a broker sees it.
///
/// Contract:
/// - `image()` yields the image of every command committed and applied on this node, in log order;
///   it only moves forward.
/// - `submit` appends one command through the active controller (forwarding it when this node is
///   not active), waits until it is committed and applied on the active controller, and returns
///   the reply `apply` produced there. `Err(Unknown)` means it may still take effect.
/// - `heartbeat` tells the active controller that broker `broker_id` (in process `incarnation`)
///   is alive; heartbeats are not logged.
/// - `heartbeats()` on the active controller returns when each broker was last heard from since
///   this node became active; elsewhere it is empty.
/// - `is_active()` says whether this node is the active controller now.
/// - `active_controller()` is the node id of the active controller as this node last heard,
///   `None` while unknown (an election in progress) or for a quorum without voters.
/// - `status` asks the active controller where the quorum stands; `Err(NoLeader)` while none is
///   known or reachable, `Err(Fatal)` for a quorum without voters.
pub trait MetadataQuorum: Send + Sync + 'static {
    fn image(&self) -> watch::Receiver<Arc<MetadataImage>>;
    fn submit(&self, cmd: ControllerCommand)
        -> BoxFuture<'_, Result<ControllerReply, QuorumError>>;
    fn heartbeat(&self, broker_id: i32, incarnation: u64)
        -> BoxFuture<'_, Result<(), QuorumError>>;
    fn heartbeats(&self) -> BTreeMap<i32, (u64, Instant)>;
    fn is_active(&self) -> bool;
    fn active_controller(&self) -> Option<i32>;
    fn status(&self) -> BoxFuture<'_, Result<QuorumStatus, QuorumError>>;
}

/// How long a metadata change may take to reach a broker's applied image before the request
/// that made it fails.
const METADATA_PROPAGATION: Duration = Duration::from_secs(10);

/// Submits `cmd` and waits until `applied` (the image a broker has acted on) satisfies
/// `arrived`, so what the command made (a topic led here, a state moved) is in place when the
/// caller answers its client. A controller error comes back as its code and message.
pub async fn submit_and_wait(
    quorum: &dyn MetadataQuorum,
    mut applied: watch::Receiver<Arc<MetadataImage>>,
    cmd: ControllerCommand,
    arrived: impl Fn(&MetadataImage) -> bool,
) -> Result<ControllerReply, ApiError> {
    let reply = quorum
        .submit(cmd)
        .await
        .map_err(|e| ApiError::new(errors::REQUEST_TIMED_OUT, e.to_string()))?;
    if let ControllerReply::Error { code, message } = &reply {
        return Err(ApiError::new(*code, message.clone()));
    }
    let waited = tokio::time::timeout(METADATA_PROPAGATION, applied.wait_for(|i| arrived(i))).await;
    match waited {
        Ok(Ok(_)) => Ok(reply),
        _ => Err(ApiError::new(
            errors::REQUEST_TIMED_OUT,
            "metadata did not reach this broker in time",
        )),
    }
}
