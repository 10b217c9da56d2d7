//! The controller: the metadata state machine every controller node applies from the quorum's
//! committed log, and the quorum boundary behind which the log lives. Decisions (elections, ISR
//! changes, fencing) are made inside `apply`, a pure function of the image and one command, so
//! every node reaches the same image and a recorded log can be replayed exactly.

pub mod fencing;
pub mod local;
pub mod raft;
pub mod state;

pub use state::{apply, ControllerCommand, ControllerReply, Election};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use futures::future::BoxFuture;
use tokio::sync::watch;

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
pub trait MetadataQuorum: Send + Sync + 'static {
    fn image(&self) -> watch::Receiver<Arc<MetadataImage>>;
    fn submit(&self, cmd: ControllerCommand)
        -> BoxFuture<'_, Result<ControllerReply, QuorumError>>;
    fn heartbeat(&self, broker_id: i32, incarnation: u64)
        -> BoxFuture<'_, Result<(), QuorumError>>;
    fn heartbeats(&self) -> BTreeMap<i32, (u64, Instant)>;
    fn is_active(&self) -> bool;
}
