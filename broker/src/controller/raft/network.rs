//! openraft's view of the network: one `RaftNetwork` per target voter, sending append-entries,
//! vote and install-snapshot RPCs through the shared peer clients. Every RPC is bounded by the
//! RPC timeout, so a partitioned or stopped peer costs a timeout, never a stuck replication task.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Timeout, Unreachable,
};
use openraft::network::{Backoff, RPCOption};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, RPCTypes, RaftNetwork, RaftNetworkFactory};

use super::wire::{CallError, Conn, Peers, Request, Response};
use super::TypeConfig;

type RpcError<E = openraft::error::Infallible> = RPCError<u64, BasicNode, RaftError<u64, E>>;

pub(super) struct NetworkFactory {
    pub me: u64,
    pub peers: Arc<Peers>,
    pub rpc_timeout: Duration,
    /// Pause before retrying an unreachable peer.
    pub backoff: Duration,
}

pub(super) struct PeerNetwork {
    me: u64,
    target: u64,
    peers: Arc<Peers>,
    rpc_timeout: Duration,
    backoff: Duration,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> PeerNetwork {
        PeerNetwork {
            me: self.me,
            target,
            peers: self.peers.clone(),
            rpc_timeout: self.rpc_timeout,
            backoff: self.backoff,
        }
    }
}

impl PeerNetwork {
    async fn call<E: std::error::Error>(
        &self,
        action: RPCTypes,
        request: Request,
        option: &RPCOption,
    ) -> Result<Response, RpcError<E>> {
        let timeout = option.hard_ttl().min(self.rpc_timeout);
        self.peers
            .call(self.target, request, timeout, Conn::Pooled)
            .await
            .map_err(|e| match e {
                CallError::NotSent(e) => RPCError::Unreachable(Unreachable::new(&e)),
                CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
                    action,
                    id: self.me,
                    target: self.target,
                    timeout,
                }),
                CallError::Lost(e) => RPCError::Network(NetworkError::new(&e)),
            })
    }

    fn remote<E: std::error::Error>(&self, e: RaftError<u64, E>) -> RpcError<E> {
        RPCError::RemoteError(RemoteError::new(self.target, e))
    }

    fn unexpected<E: std::error::Error>(&self, response: Response) -> RpcError<E> {
        let e = std::io::Error::other(format!(
            "unexpected answer from node {}: {response:?}",
            self.target
        ));
        RPCError::Network(NetworkError::new(&e))
    }
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RpcError> {
        let request = Request::AppendEntries(rpc);
        match self.call(RPCTypes::AppendEntries, request, &option).await? {
            Response::AppendEntries(r) => r.map_err(|e| self.remote(e)),
            other => Err(self.unexpected(other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RpcError<InstallSnapshotError>> {
        let request = Request::InstallSnapshot(rpc);
        match self
            .call(RPCTypes::InstallSnapshot, request, &option)
            .await?
        {
            Response::InstallSnapshot(r) => r.map_err(|e| self.remote(e)),
            other => Err(self.unexpected(other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RpcError> {
        match self
            .call(RPCTypes::Vote, Request::Vote(rpc), &option)
            .await?
        {
            Response::Vote(r) => r.map_err(|e| self.remote(e)),
            other => Err(self.unexpected(other)),
        }
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(self.backoff))
    }
}
